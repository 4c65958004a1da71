//! mlopt's lowering stage: from the optimised graph (ops grouped into kernels) to the kernel IR. Each fusion
//! group becomes one kernel (`kernel.rs` pulls elementwise and layout members into expressions,
//! `anchor.rs` writes loop nests for contractions, windows and reductions), the schedule stage
//! (`schedule/`: `cpu.rs`, `gpu.rs`, `gpu_gemm.rs`, `gpu_attention.rs`) chooses how the loops run on the
//! target, and `program.rs` binds kernels to the caller's inputs and outputs, the weights
//! and one activation arena laid out by the memory planner (`memory.rs`).
//!
//! Architecture invariant: sees the graph IR and the kernel IR only; knows nothing of egg, ONNX or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod anchor;
mod check;
pub mod contract;
pub mod elementwise;
pub mod error;
mod grid;
pub mod kernel;
pub mod memory;
pub mod program;
pub mod schedule;
mod window;
mod winograd;

pub use error::{LowerError, Result};
pub use memory::{plan_memory, MemoryPlan, Slot};
pub use program::{interpret, lower_algorithm, lower_program, Options};
pub use schedule::CpuSchedule;
pub use schedule::GpuSchedule;
pub use winograd::Winograd;
