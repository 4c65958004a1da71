//! What compiled models need around their object code: the C runtime (a thread pool, `runtime/`),
//! packaging kernels + runtime into one static library, and loading a compiled model into this process
//! (for `mlopt run`, `check --compiled` and `bench`): the objects are linked into a shared library with the
//! system C compiler and opened with libloading.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod load;

pub use load::{Loaded, RuntimeError};

/// The runtime compiled for x86-64 Linux, position independent.
pub const RUNTIME_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mlopt_runtime.o"));

/// The CUDA launcher (`runtime/mlopt_cuda.c`) for x86-64 Linux, position independent: opens libcuda at
/// run time, so GPU libraries need no CUDA toolkit to build or link.
pub const CUDA_LAUNCHER_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mlopt_cuda.o"));

/// Writes a static library holding `objects` (name, ELF bytes) and the CPU runtime to `w`, with the
/// symbol index linkers need (written by ar_archive_writer, the archive writer rustc itself uses).
pub fn write_archive<W: std::io::Write + std::io::Seek>(w: &mut W, objects: &[(&str, &[u8])]) -> std::io::Result<()> {
    write_archive_with(w, objects, ("mlopt_runtime.o", RUNTIME_OBJECT))
}

/// A GPU library: `objects` and the CUDA launcher.
pub fn write_gpu_archive<W: std::io::Write + std::io::Seek>(w: &mut W, objects: &[(&str, &[u8])]) -> std::io::Result<()> {
    write_archive_with(w, objects, ("mlopt_cuda.o", CUDA_LAUNCHER_OBJECT))
}

fn write_archive_with<W: std::io::Write + std::io::Seek>(w: &mut W, objects: &[(&str, &[u8])], runtime: (&str, &[u8])) -> std::io::Result<()> {
    use ar_archive_writer::{write_archive_to_stream, ArchiveKind, NewArchiveMember, DEFAULT_OBJECT_READER};
    let members: Vec<NewArchiveMember> =
        objects.iter().copied().chain([runtime]).map(|(name, data)| NewArchiveMember::new(data, &DEFAULT_OBJECT_READER, name.to_string())).collect();
    write_archive_to_stream(w, &members, ArchiveKind::Gnu, false, None)
}
