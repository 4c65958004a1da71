//! The rewrite crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RewriteError {
    #[error(transparent)]
    Ir(#[from] mlopt_ir::IrError),
    #[error("internal optimiser error: {0}")]
    Internal(String),
    #[error("precision check: {0}")]
    Precision(String),
}

pub type Result<T, E = RewriteError> = std::result::Result<T, E>;
