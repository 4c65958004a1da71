//! mlopt's driver: the pipeline from an imported graph to native code (`pipeline`), and what users get
//! from it (`emit`: the C header and the Rust binding).
//!
//! Architecture invariant: the only crate (besides the CLI) that sees every stage; it adds no IR of its own.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod emit;
pub mod gpu;
pub mod library;
pub mod output;
pub mod pipeline;
pub mod profile;
pub mod svg;
pub mod tune;

pub use gpu::GpuCompiled;
pub use library::Library;
pub use mlopt_runtime::Loaded;
pub use pipeline::{build, compile, compile_gpu, inspect, Compiled, DriverError, Options, Stage};
