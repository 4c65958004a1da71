//! mlopt's optimiser: the graph is loaded into an egg e-graph, saturated with the rule tables of `rules/`
//! (algebra, layout, fusion patterns, sibling merges, precision lowering) under explicit limits, the cheapest
//! equivalent graph is extracted on the target's roofline, and the fusion pass partitions it into kernels.
//!
//! Architecture invariant: the only crate that knows egg; it sees the graph IR and the cost model, nothing
//! of ONNX, the kernel IR or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod convert;
pub mod error;
pub mod extract;
pub mod fuse;
pub mod images;
pub mod lang;
pub mod optimize;
pub mod quantize;
pub mod report;
pub mod rules;

pub use error::{Result, RewriteError};
pub use fuse::{KernelInfo, Plan};
pub use optimize::{optimize, Config, Limits, Optimized, Precision, Stats};

#[cfg(test)]
mod soundness_tests;
