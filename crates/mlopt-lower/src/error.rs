//! The lowering crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LowerError {
    #[error(transparent)]
    Ir(#[from] mlopt_ir::IrError),
    #[error(
        "node '{node}' ({op}) is in no kernel: lower the optimised graph, not the imported one"
    )]
    Unfused { node: String, op: &'static str },
    #[error("node '{node}' ({op}): {why}")]
    Unsupported {
        node: String,
        op: &'static str,
        why: String,
    },
    #[error("the lowered kernels do not verify (a bug in mlopt's lowering):\n{}", .0.join("\n"))]
    Verify(Vec<String>),
    /// Constant data the model would reject when run (an index out of range, a division by zero).
    #[error("{0}")]
    InvalidData(String),
    #[error("internal error (a bug in mlopt's lowering): {0}")]
    Internal(String),
    #[error(transparent)]
    Schedule(#[from] mlopt_kir::sched::SchedError),
}

pub type Result<T, E = LowerError> = std::result::Result<T, E>;
