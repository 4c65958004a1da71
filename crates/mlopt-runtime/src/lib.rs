//! What compiled models need around their object code: the C runtime (a thread pool, `runtime/`),
//! packaging kernels + runtime into one static library (`archive.rs`), and loading a compiled model
//! into this process (for `mlopt run`, `check --compiled` and `bench`): the objects are linked into a
//! shared library with the system C compiler and opened with libloading.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod archive;
mod load;

pub use archive::{defined_symbols, Member};
pub use load::{Loaded, RuntimeError};

/// The runtime compiled for x86-64 Linux, position independent.
pub const RUNTIME_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mlopt_runtime.o"));

/// The CUDA launcher (`runtime/mlopt_cuda.c`) for x86-64 Linux, position independent: opens libcuda at
/// run time, so GPU libraries need no CUDA toolkit to build or link.
pub const CUDA_LAUNCHER_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mlopt_cuda.o"));

/// Writes a static library holding `members` and the CPU runtime to `w`, with the symbol index linkers
/// need (`archive.rs`).
pub fn write_archive<W: std::io::Write>(w: &mut W, members: &[Member]) -> std::io::Result<()> {
    write_archive_with(w, members, ("mlopt_runtime.o", RUNTIME_OBJECT))
}

/// A GPU library: `members` and the CUDA launcher.
pub fn write_gpu_archive<W: std::io::Write>(w: &mut W, members: &[Member]) -> std::io::Result<()> {
    write_archive_with(w, members, ("mlopt_cuda.o", CUDA_LAUNCHER_OBJECT))
}

fn write_archive_with<W: std::io::Write>(
    w: &mut W,
    members: &[Member],
    (name, runtime): (&str, &[u8]),
) -> std::io::Result<()> {
    let mut all = members.to_vec();
    all.push(Member::object(name, runtime)?);
    archive::write(w, &all)
}
