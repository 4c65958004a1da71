//! Where a kernel's local buffers live: on the stack of the thread that runs it up to
//! `STACK_LOCAL_BYTES`, on the heap above (`Gen::allocate`), and so how much stack a run needs, which the
//! library's header states.

/// Local buffers up to this size live on the stack; larger ones on the heap.
const STACK_LOCAL_BYTES: u64 = 256 * 1024;

/// The most bytes of locals one kernel of `p` keeps on a thread's stack (its buffers of at most
/// `STACK_LOCAL_BYTES`: the tiles' accumulators, small packed panels), plus `FRAME_BYTES` for the
/// frames of the entry point, the kernel and the runtime: what a run needs of the calling thread's stack
/// (which runs a share of every parallel loop) and of each pool thread's.
pub fn stack_bytes(p: &mlopt_kir::Program) -> u64 {
    let locals = |k: &mlopt_kir::Kernel| -> u64 {
        k.bufs
            .iter()
            .filter(|b| b.space == mlopt_kir::Space::Local && !on_heap(b))
            .map(|b| (b.numel().max(1) * b.elem.size()).div_ceil(64) * 64)
            .sum()
    };
    p.kernels.iter().map(locals).max().unwrap_or(0) + FRAME_BYTES
}

/// Stack for the frames around a kernel's locals (entry point, kernel, runtime, libc), with room.
const FRAME_BYTES: u64 = 16 * 1024;

/// Whether local `buf` is allocated on the heap (above `STACK_LOCAL_BYTES`).
pub(crate) fn on_heap(buf: &mlopt_kir::Buffer) -> bool {
    buf.numel().max(1) * buf.elem.size() > STACK_LOCAL_BYTES
}
