//! Schedules for x86-64 CPUs, in order: Winograd where it pays (`winograd.rs`), register tiles for
//! every contraction, convolution and attention nest, or bf16 `mma` blocks (`gemm.rs`), padded copies
//! for the pooling windows left (`padded.rs`), then each kernel's loops (`loops.rs`), the weights'
//! layouts (`layout.rs`) and large scratch in the arena.

mod attention;
mod conv;
mod gemm;
mod layout;
mod loops;
mod mma;
mod mma_conv;
mod mma_epilogue;
mod pack;
mod padded;
mod tiler;
mod winograd;

pub use tiler::tile_key;
pub use winograd::Winograd;

use crate::class::Class;
use crate::error::Result;
use crate::Options;
use mlopt_kir::Program;
use mlopt_target::CpuTarget;

/// The CPU schedule of every kernel of `p` for `t`.
pub fn schedule(mut p: Program, t: &CpuTarget, o: &Options) -> Result<Program> {
    let mut classes: Vec<Vec<Class>> = p.kernels.iter_mut().map(Class::of_kernel).collect();
    winograd::rewrite(&mut p, &mut classes, t, o)?;
    gemm::tile(
        &mut p,
        classes,
        t,
        mlopt_cost::tile::bf16_blocks_pay(t),
        &o.tiles,
    )?;
    padded::padded_windows(&mut p, t)?;
    p.kernels.iter_mut().for_each(|k| k.drop_unused_locals());
    let weights = weight_params(&p);
    for (k, weights) in p.kernels.iter_mut().zip(&weights) {
        loops::schedule(k, t, weights)?;
    }
    layout::transpose_weights(&mut p);
    scratch_in_arena(&mut p);
    Ok(p)
}

/// Each kernel's parameters that its call binds to a weight (`layout::bound_weight`).
fn weight_params(p: &Program) -> Vec<Vec<mlopt_kir::BufId>> {
    (0..p.kernels.len())
        .map(|ki| {
            let params = p.kernels[ki].params();
            params
                .into_iter()
                .filter(|b| layout::bound_weight(p, ki, *b).is_some())
                .collect()
        })
        .collect()
}

/// Local buffers above this size do not go on a CPU thread's stack.
pub const ARENA_LOCAL_BYTES: u64 = mlopt_kir::STACK_LOCALS_BYTES;

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
