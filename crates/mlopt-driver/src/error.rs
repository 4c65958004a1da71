//! The driver's one error type: each stage's error, and what the driver itself refuses.

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Import(#[from] mlopt_onnx::OnnxError),
    #[error(transparent)]
    Graph(#[from] mlopt_ir::IrError),
    #[error("optimising: {0}")]
    Optimize(#[from] mlopt_rewrite::RewriteError),
    #[error("lowering to the kernel IR: {0}")]
    Lower(#[from] mlopt_lower::LowerError),
    #[error("scheduling: {0}")]
    Schedule(#[from] mlopt_schedule::ScheduleError),
    #[error("generating code: {0}")]
    Codegen(#[from] mlopt_llvm::LlvmError),
    #[error(transparent)]
    Runtime(#[from] mlopt_runtime::RuntimeError),
    #[error("ptxas rejected the generated PTX (a bug in mlopt's code generation):\n{0}")]
    Ptxas(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Input(String),
}

pub type Result<T, E = DriverError> = std::result::Result<T, E>;
