//! What compiled models need around their object code: the C runtime (a thread pool, `runtime/`),
//! packaging kernels + runtime into one static library, and loading a compiled model into this process
//! (for `mlopt run`, `check --compiled` and `bench`): the objects are linked into a shared library with the
//! system C compiler and opened with libloading.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod load;

pub use load::{Loaded, RuntimeError};

/// The runtime compiled for x86-64 Linux, position independent.
pub const RUNTIME_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mlopt_runtime.o"));

/// Writes a static library holding `objects` (name, ELF bytes) and the runtime.
pub fn write_archive(path: &std::path::Path, objects: &[(&str, &[u8])]) -> std::io::Result<()> {
    let mut a = ar::Builder::new(std::fs::File::create(path)?);
    for (name, data) in objects.iter().copied().chain([("mlopt_runtime.o", RUNTIME_OBJECT)]) {
        let header = ar::Header::new(name.as_bytes().to_vec(), data.len() as u64);
        a.append(&header, data)?;
    }
    Ok(())
}
