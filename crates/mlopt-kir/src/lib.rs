//! mlopt's kernel IR: loop nests over buffers. A kernel's algorithm is a loop nest of stores; a schedule
//! (split, reorder, tile, vectorise, unroll, parallelise, bind to GPU blocks/threads) rearranges it without
//! changing what it computes. The crate owns a printer and a parser (the text round-trips), a verifier
//! (types and provable bounds) and an interpreter that runs any kernel, GPU schedules included, on the CPU.
//!
//! Architecture invariant: knows nothing of ONNX, the graph IR or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod analysis;
pub mod gpu;
pub mod index;
pub mod interp;
pub mod ir;
pub mod parse;
pub mod partition;
pub mod print;
pub mod program;
pub mod rfactor;
pub mod sched;
pub mod simplify;
pub mod step;
pub mod verify;

#[cfg(test)]
mod tests;

pub use interp::{run_kernel, run_program, InterpError};
pub use ir::*;
pub use parse::{parse_kernel, ParseError};
pub use program::*;
pub use step::{GpuEngine, ScheduleStep};
pub use verify::{verify, verify_program};
