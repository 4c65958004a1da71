//! Where a kernel's local buffers live: the small ones on the stack of the thread that runs the
//! function, smallest first while they fit `STACK_LOCALS_BYTES`; the rest in the runtime's per-thread
//! scratch (`mlopt_scratch(level, bytes)`: one buffer per parallel nesting level, grown once and kept),
//! so that a run's stack is small and bounded whatever the model, and a run allocates nothing once it
//! has run. The library's header states the stack a run needs (`stack_bytes`).

use mlopt_kir::{Buffer, Kernel, LoopKind, Space, Stmt};

use mlopt_kir::STACK_LOCALS_BYTES;

/// Parallel loops nested deeper than this cannot have scratch (the runtime's `MLOPT_SCRATCH_LEVELS`).
pub const SCRATCH_LEVELS: usize = 8;

/// A local's bytes as laid out: a multiple of 64, so every local starts on a cache line.
pub(crate) fn padded_bytes(b: &Buffer) -> u64 {
    (b.numel().max(1) * b.elem.size()).div_ceil(64) * 64
}

/// For the locals `bufs` one function allocates, whether each lives on the stack (`true`) or in
/// scratch: the smallest first (ties in order) while their total stays within `STACK_LOCALS_BYTES`.
pub(crate) fn on_stack(bufs: &[&Buffer]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..bufs.len()).collect();
    order.sort_by_key(|&i| (padded_bytes(bufs[i]), i));
    let (mut used, mut out) = (0, vec![false; bufs.len()]);
    for i in order {
        let bytes = padded_bytes(bufs[i]);
        if used + bytes > STACK_LOCALS_BYTES {
            break;
        }
        used += bytes;
        out[i] = true;
    }
    out
}

/// What a run of `p` needs of a thread's stack: for the kernel that needs most, the stack locals of each
/// function a thread can be inside at once (the kernel and one body per parallel nesting level, each at
/// most `STACK_LOCALS_BYTES`), plus `FRAME_BYTES` for the frames of the entry point, the kernels and the
/// runtime. The calling thread runs a share of every parallel loop, so each pool thread needs no more.
pub fn stack_bytes(p: &mlopt_kir::Program) -> u64 {
    let kernel = |k: &Kernel| -> u64 {
        let locals: Vec<&Buffer> = k.bufs.iter().filter(|b| b.space == Space::Local).collect();
        let total: u64 = locals.iter().map(|b| padded_bytes(b)).sum();
        total.min((1 + parallel_depth(&k.body)) as u64 * STACK_LOCALS_BYTES)
    };
    p.kernels.iter().map(kernel).max().unwrap_or(0) + FRAME_BYTES
}

/// Stack for the frames around a kernel's locals (entry point, kernel, runtime, libc), with room.
const FRAME_BYTES: u64 = 16 * 1024;

/// How deep parallel loops nest in `body`.
pub(crate) fn parallel_depth(body: &[Stmt]) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::For { kind, body, .. } => {
                usize::from(*kind == LoopKind::Parallel) + parallel_depth(body)
            }
            Stmt::If { then, .. } => parallel_depth(then),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}
