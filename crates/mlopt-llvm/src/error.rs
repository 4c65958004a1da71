//! The code generator's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LlvmError {
    #[error("code generation: {0}")]
    Codegen(String),
    #[error("LLVM: {0}")]
    Llvm(String),
}

impl From<inkwell::builder::BuilderError> for LlvmError {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        LlvmError::Llvm(e.to_string())
    }
}

pub type Result<T, E = LlvmError> = std::result::Result<T, E>;
