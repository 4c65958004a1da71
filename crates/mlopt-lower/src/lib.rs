//! mlopt's lowering stage: from the optimised graph (ops grouped into kernels) to the kernel IR's
//! algorithms. Each fusion group becomes one kernel: `kernel.rs` pulls elementwise and layout members
//! into expressions and fuses an anchor's epilogue (and its layout tail) into its stores, `nests.rs`
//! writes the loop nests of every other op (contractions, reductions, normalisations, attention, ...),
//! `conv_pool.rs` those of convolutions and pooling, `grid_sample.rs` GridSample's, and
//! `data_checks.rs` the run-time checks of input data the interpreter would reject. `program.rs` binds
//! kernels to the caller's inputs and outputs, the weights and one activation arena laid out by the
//! memory planner (`memory.rs`).
//!
//! Lowering writes what a kernel computes, never how it runs: it takes no target, and its kernels have
//! no schedule step, vector loop or copy. `mlopt-schedule` makes those choices per target.
//!
//! Architecture invariant: sees the graph IR and the kernel IR only; knows nothing of egg, ONNX, LLVM,
//! the targets or the cost model.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod conv_pool;
mod counted;
mod cumulative;
mod data_checks;
pub mod elementwise;
pub mod error;
mod grid_sample;
pub mod kernel;
pub mod memory;
mod nests;
pub mod order;
pub mod program;
mod rows;
mod views;

pub use error::{LowerError, Result};
pub use memory::{plan_memory, MemoryPlan, Slot};
pub use program::{interpret, lower, tensor};
