//! The schedule stage: kernel IR -> kernel IR. Lowering writes each kernel's algorithm (its loop nests
//! over buffers); a schedule chooses how those loops run on the target, without changing what they
//! compute, and records each choice as a typed `mlopt_kir::ScheduleStep`.
//!
//! - `cpu.rs`: folds in vector lanes (`mlopt_kir::rfactor`), partitioned loops
//!   (`mlopt_kir::partition`), vector loops (full width, peeled, or narrower widths that divide the
//!   extent) and parallel loops for x86-64 targets; then `layout.rs` stores transposed the 2-D weights
//!   that vector loops read down their columns, and `scratch_in_arena` moves large locals into the
//!   activation arena.
//! - `gpu.rs`: every kernel as a GPU launch (elementwise grids, cooperative rows in shared memory), with
//!   `gpu_gemm.rs` (tiled GEMMs and implicit-GEMM convolutions on tensor cores or SIMT FMAs, staged by
//!   `cp.async`) and `gpu_attention.rs` (attention on tensor cores with an online softmax).
//!
//! `cpu_gemm.rs` runs first for a CPU: every contraction nest (`contraction.rs` recognises the
//! algorithm form, which the GPU's `gpu_gemm.rs` shares) becomes register tiles of the cost model's
//! shape. A MatMul's or Gemm's constant B is packed into column panels that replace its weight; a
//! convolution (`cpu_conv.rs` recognises its window) becomes an implicit GEMM over a zero-padded copy
//! of its input, split into phases along strided rows, or over packed im2col panels where rows are
//! short. Then the kernel's unused locals (the algorithm's scalar accumulator) are dropped.
//!
//! Attention (`attention.rs` recognises lowering's one-query-row nest, which the GPU shares) becomes
//! blocks of query rows with both products tiled (`cpu_attention.rs`).
//!
//! With `CpuSchedule::mma`, a bf16 contraction by a constant bf16 weight becomes `mma` blocks instead
//! (`cpu_mma.rs`), its weight packed into the layout the matrix unit reads.
//!
//! Folds over a guarded window that are left (a pooling's) read a padded copy of their input plane
//! (`window.rs`, whose recogniser `cpu_conv.rs` shares).
//!
//! What lowering still decides for a CPU target: Winograd, an algorithm of its own, which it picks
//! where the cost model rates it faster and its GEMMs would tile (the schedule tiles them).

mod attention;
mod contraction;
pub mod cpu;
mod cpu_attention;
mod cpu_conv;
mod cpu_gemm;
mod cpu_mma;
pub mod gpu;
mod gpu_attention;
mod gpu_gemm;
mod layout;
mod window;

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
        cpu_gemm::tile(
            &mut p,
            s.lanes,
            s.mma,
            opts.l2_bytes.unwrap_or(crate::contract::DEFAULT_L2_BYTES),
            &opts.tiles,
        )?;
        window::padded_windows(&mut p, s.lanes)?;
        for k in &mut p.kernels {
            k.drop_unused_locals();
            schedule_cpu(k, s)?;
        }
        layout::transpose_weights(&mut p);
        scratch_in_arena(&mut p);
        mlopt_kir::verify_program(&p).map_err(LowerError::Verify)?;
    }
    Ok(p)
}

/// Local buffers above this size do not go on a CPU thread's stack.
pub const ARENA_LOCAL_BYTES: u64 = 256 * 1024;

/// Moves every large local buffer that one iteration of a parallel or vector loop does not own (a
/// convolution's padded input, a pooling's phases, Winograd's transforms) into the activation arena, past
/// the planned values: kernels run one at a time, so they share one scratch region. Code generation would
/// otherwise `aligned_alloc` them on every call, and on every call the kernel faulted fresh pages in (a
/// SqueezeNet max pool's 6.4 MB of phases cost more than its arithmetic).
pub fn scratch_in_arena(p: &mut mlopt_kir::Program) {
    use mlopt_kir::{LoopKind, Place, Space};
    let base = p.arena_bytes.div_ceil(64) * 64;
    let mut end = p.arena_bytes;
    for (ki, k) in p.kernels.iter_mut().enumerate() {
        let per_iteration = mlopt_kir::analysis::locals_owned_by_loops(k, &|kind| {
            !matches!(kind, LoopKind::Serial | LoopKind::Unrolled)
        });
        let before = k.params();
        let mut at = base;
        let mut moved = std::collections::HashMap::new();
        for (i, buf) in k.bufs.iter_mut().enumerate() {
            let bytes = buf.numel() * buf.elem.size();
            if buf.space == Space::Local
                && bytes > ARENA_LOCAL_BYTES
                && !per_iteration.contains(&mlopt_kir::BufId(i as u32))
            {
                buf.space = Space::Global;
                moved.insert(mlopt_kir::BufId(i as u32), at);
                at += bytes.div_ceil(64) * 64;
            }
        }
        if moved.is_empty() {
            continue;
        }
        end = end.max(at);
        let after = k.params();
        // (A parameter missing from both leaves the step an argument short, which the verifier rejects.)
        for step in p.steps.iter_mut().filter(|s| s.kernel == ki) {
            let args: std::collections::HashMap<_, Place> = before
                .iter()
                .copied()
                .zip(step.args.iter().copied())
                .collect();
            step.args = after
                .iter()
                .filter_map(|b| {
                    moved
                        .get(b)
                        .map(|off| Place::Arena(*off))
                        .or_else(|| args.get(b).copied())
                })
                .collect();
        }
    }
    p.arena_bytes = end;
}
