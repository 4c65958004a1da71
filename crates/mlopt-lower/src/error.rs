//! The lowering crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LowerError {
    #[error(transparent)]
    Ir(#[from] mlopt_ir::IrError),
    #[error("node '{node}' ({op}) is in no kernel: lower the optimised graph, not the imported one")]
    Unfused { node: String, op: &'static str },
}

pub type Result<T, E = LowerError> = std::result::Result<T, E>;
