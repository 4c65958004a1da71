//! mlopt's driver: the pipeline from an ONNX model or a graph to native code (`pipeline`: one table of
//! named stages), what it makes for a CPU (`cpu`) or a GPU (`gpu`) as a `Library`, and what users get
//! from it (`emit`: the C header and the Rust binding; `output`: the files, all or none; `profile` and
//! `svg`: the per-kernel profile and the plots; `compare` and `probe`: `check`'s comparison rule and
//! `check --per-node`).
//!
//! Architecture invariant: the only crate (besides the CLI) that sees every stage; it adds no IR of its own.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod batch;
pub mod compare;
pub mod cpu;
pub mod emit;
pub mod error;
pub mod gpu;
pub mod library;
pub mod output;
pub mod pipeline;
pub mod probe;
pub mod profile;
pub mod svg;
pub mod tune;

pub use cpu::Compiled;
pub use error::{DriverError, Result};
pub use gpu::GpuCompiled;
pub use library::Library;
pub use mlopt_llvm::{c_name, is_c_name, stack_bytes, NAME_MAX};
pub use mlopt_runtime::Loaded;
pub use pipeline::{build, compile, compile_gpu, inspect, Options, Source, Stage};
