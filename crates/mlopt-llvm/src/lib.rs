//! mlopt's code generator: kernel IR programs -> LLVM IR -> optimised (`default<O3>`) position-independent
//! x86-64 objects for the host's features or a named level (x86-64-v3 = AVX2, x86-64-v4 = AVX-512).
//!
//! Architecture invariant: the only crate that links LLVM (through inkwell); it sees the kernel IR only.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod amx;
mod batch;
mod codegen;
mod dot;
mod elf;
mod entry;
mod kernel_fn;
mod locals;
mod memory;
pub use batch::{batch_entry, BatchPlan};
pub use elf::{data_object, DataObject};
pub use locals::stack_bytes;
pub mod error;
mod math;
mod minifloat;
mod parallel;
mod program;
mod ptx;
mod threads;
mod transcendental;
mod transpose;
mod unrolling;

pub use entry::{profile_symbol, STATUS_ARGUMENT, STATUS_DATA, STATUS_MEMORY, STATUS_PLATFORM};
pub use error::{LlvmError, Result};
pub use program::{c_name, compile, compile_with, is_c_name, Output, NAME_MAX};
pub use ptx::{compile_ptx, host_object, launch_table, PtxOutput};
