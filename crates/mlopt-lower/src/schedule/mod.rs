//! The schedule stage: kernel IR -> kernel IR. Lowering writes each kernel's algorithm (its loop nests
//! over buffers); a schedule chooses how those loops run on the target, without changing what they
//! compute, and records each choice as a typed `mlopt_kir::ScheduleStep`.
//!
//! - `cpu.rs`: vector loops (full width, peeled, or narrower widths that divide the extent) and parallel
//!   loops for x86-64 targets.
//! - `gpu.rs`: every kernel as a GPU launch (elementwise grids, cooperative rows in shared memory), with
//!   `gpu_gemm.rs` (tiled GEMMs and implicit-GEMM convolutions on tensor cores or SIMT FMAs, staged by
//!   `cp.async`) and `gpu_attention.rs` (attention on tensor cores with an online softmax).
//!
//! What lowering still decides for a CPU target, because it shapes the algorithm's buffers: a
//! contraction's register tile (`contract.rs`, by the cost model's tile estimate) and whether its B
//! panels are packed.

pub mod cpu;
pub mod gpu;
mod gpu_attention;
mod gpu_gemm;

pub use cpu::{schedule_cpu, CpuSchedule};
pub use gpu::{schedule_program, GpuSchedule};

use crate::error::{LowerError, Result};

/// The schedule stage for the target `opts` names: each kernel's CPU schedule (`opts.cpu`), or the GPU
/// launches (`opts.gpu`); without either, the program as it is. The result is verified.
pub fn schedule(mut p: mlopt_kir::Program, opts: &crate::Options) -> Result<mlopt_kir::Program> {
    if let Some(s) = &opts.gpu {
        return schedule_program(p, s);
    }
    if let Some(s) = opts.cpu {
        for k in &mut p.kernels {
            schedule_cpu(k, s)?;
        }
        mlopt_kir::verify_program(&p).map_err(LowerError::Verify)?;
    }
    Ok(p)
}
