//! mlopt's lowering stage: from the optimised graph (ops grouped into kernels) to what code generation needs.
//! So far it holds the memory planner (`memory`): one arena for all activations, offsets from liveness, and
//! in-place reuse where an elementwise kernel may overwrite the value it reads. The kernel IR lowering and
//! schedules (issue 4) come next.
//!
//! Architecture invariant: sees the graph IR only; knows nothing of egg, ONNX or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod error;
pub mod memory;

pub use error::{LowerError, Result};
pub use memory::{plan_memory, MemoryPlan, Slot};
