//! The form of a GPU kernel, which the verifier checks, the interpreter emulates and NVPTX code generation
//! relies on:
//!
//! ```text
//! kernel @k(...) {
//!   shared %tile: f32[32, 33]          ; one per block
//!   local %acc: f32[4, 4]              ; one per thread (registers)
//!   gpu.block.x %b in 0..G {           ; the whole body: G blocks (the grid)
//!     serial %ko in 0..K { ... }       ; uniform code: loops and guards every thread of the block runs alike
//!     gpu.thread.x %t in 0..T { ... }  ; per-thread code: T is the block size, the same in every thread loop
//!     barrier                          ; bar.sync between thread loops that share memory
//!   }
//! }
//! ```
//!
//! Uniform code holds loops, guards, barriers and thread loops, and stores nothing: every store is made by
//! one thread. A thread loop is not nested in another and holds no barrier and no GPU loop, so a barrier is
//! always reached by every thread of the block. `local` buffers belong to one thread and are used only
//! inside thread loops; they keep their values from one thread loop to the next (a register tile that
//! lives across the K loop). The interpreter runs each thread loop to completion before the next statement,
//! which is exactly what a barrier between them guarantees, and reports the races a missing barrier would
//! leave (`interp.rs`).

use crate::ir::*;

/// How a GPU kernel is launched: `grid` blocks of `block` threads, with `shared_bytes` of shared memory
/// per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: u64,
    pub block: u64,
    pub shared_bytes: u64,
}

/// The launch of a GPU kernel; None for a CPU kernel.
pub fn launch(k: &Kernel) -> Option<Launch> {
    let [Stmt::For {
        kind: LoopKind::GpuBlock(_),
        extent,
        body,
        ..
    }] = k.body.as_slice()
    else {
        return None;
    };
    let shared_bytes = k
        .bufs
        .iter()
        .filter(|b| b.space == Space::Shared)
        .map(|b| b.numel() * b.elem.size())
        .sum();
    Some(Launch {
        grid: *extent,
        block: threads(body).unwrap_or(1),
        shared_bytes,
    })
}

/// The extent of the first thread loop in uniform code `body`.
fn threads(body: &[Stmt]) -> Option<u64> {
    body.iter().find_map(|s| match s {
        Stmt::For {
            kind: LoopKind::GpuThread(_),
            extent,
            ..
        } => Some(*extent),
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => threads(body),
        _ => None,
    })
}

/// Every way the kernel breaks the GPU form above (empty for a CPU kernel without GPU loops or shared
/// buffers).
pub fn check(k: &Kernel) -> Vec<String> {
    let mut errors = Vec::new();
    let gpu_loops = count(&k.body, &|kind| {
        matches!(kind, LoopKind::GpuBlock(_) | LoopKind::GpuThread(_))
    });
    let shared = k.bufs.iter().any(|b| b.space == Space::Shared);
    if gpu_loops == 0 && !shared && !has_barrier(&k.body) {
        return errors;
    }
    let Some(l) = launch(k) else {
        errors.push(format!(
            "kernel @{}: a GPU kernel's body must be one gpu.block.x loop",
            k.name
        ));
        return errors;
    };
    let [Stmt::For {
        kind: LoopKind::GpuBlock(axis),
        body,
        ..
    }] = k.body.as_slice()
    else {
        return errors;
    };
    if *axis != 0 {
        errors.push(format!(
            "kernel @{}: the grid is one-dimensional (gpu.block.x)",
            k.name
        ));
    }
    let mut c = Checker {
        k,
        block: l.block,
        errors: &mut errors,
    };
    c.uniform(body);
    errors
}

fn count(body: &[Stmt], pred: &dyn Fn(LoopKind) -> bool) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::For { kind, body, .. } => pred(*kind) as usize + count(body, pred),
            Stmt::If { then, .. } => count(then, pred),
            _ => 0,
        })
        .sum()
}

fn has_barrier(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Barrier => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => has_barrier(body),
        _ => false,
    })
}

struct Checker<'a> {
    k: &'a Kernel,
    block: u64,
    errors: &'a mut Vec<String>,
}

impl Checker<'_> {
    fn err(&mut self, what: String) {
        self.errors.push(format!("kernel @{}: {what}", self.k.name));
    }

    /// Code every thread of a block runs alike.
    fn uniform(&mut self, body: &[Stmt]) {
        for s in body {
            match s {
                Stmt::For {
                    kind: LoopKind::GpuThread(axis),
                    extent,
                    body,
                    var,
                } => {
                    if *axis != 0 || *extent != self.block {
                        self.err(format!(
                            "thread loop %{} must be gpu.thread.x over the block's {} threads",
                            self.k.var_name(*var),
                            self.block
                        ));
                    }
                    self.thread(body, false);
                }
                Stmt::For {
                    kind: LoopKind::Serial | LoopKind::Unrolled,
                    body,
                    ..
                }
                | Stmt::If { then: body, .. } => {
                    if let Stmt::If { cond, .. } = s {
                        self.no_locals(cond, "a uniform guard");
                    }
                    self.uniform(body)
                }
                Stmt::For { kind, var, .. } => self.err(format!(
                    "loop %{} is {} in uniform GPU code",
                    self.k.var_name(*var),
                    crate::print::loop_kind(*kind)
                )),
                Stmt::Barrier | Stmt::Prefetch { .. } => {}
                Stmt::Store { buf, .. } => self.err(format!(
                    "store to %{} outside a thread loop",
                    self.k.buffer(*buf).name
                )),
                Stmt::Mma { .. } | Stmt::WarpMma { .. } => {
                    self.err("mma outside a thread loop".into())
                }
                Stmt::CopyAsync { .. } | Stmt::AsyncWait => {
                    self.err("cp.async outside a thread loop".into())
                }
                Stmt::WarpReduce { .. } if !self.block.is_multiple_of(32) => self.err(format!(
                    "warp.reduce in a block of {} threads, not whole warps",
                    self.block
                )),
                Stmt::WarpReduce { .. } => {}
            }
        }
    }

    /// One thread's code; `guarded` under a guard, which threads of one warp may take differently.
    fn thread(&mut self, body: &[Stmt], guarded: bool) {
        for s in body {
            match s {
                Stmt::For {
                    kind: LoopKind::Serial | LoopKind::Unrolled | LoopKind::Vector(_),
                    body,
                    ..
                } => self.thread(body, guarded),
                Stmt::If { then, .. } => self.thread(then, true),
                Stmt::WarpMma { .. } if guarded => {
                    self.err("mma.sync under a guard (every thread of the warp must run it)".into())
                }
                Stmt::WarpMma { .. } if !self.block.is_multiple_of(32) => self.err(format!(
                    "mma.sync in a block of {} threads, not whole warps",
                    self.block
                )),
                Stmt::WarpMma { .. } => {}
                Stmt::For { kind, var, .. } => self.err(format!(
                    "loop %{} is {} inside a thread loop",
                    self.k.var_name(*var),
                    crate::print::loop_kind(*kind)
                )),
                Stmt::Barrier => {
                    self.err("barrier inside a thread loop (not every thread may reach it)".into())
                }
                Stmt::Store { .. }
                | Stmt::CopyAsync { .. }
                | Stmt::AsyncWait
                | Stmt::Prefetch { .. } => {}
                Stmt::WarpReduce { .. } => self.err(
                    "warp.reduce inside a thread loop (the whole warp runs it, in uniform code)"
                        .into(),
                ),
                Stmt::Mma { .. } => self.err("mma blocks are not a GPU operation".into()),
            }
        }
    }

    fn no_locals(&mut self, e: &Expr, what: &str) {
        for b in crate::analysis::expr_loads(e).keys() {
            if self.k.buffer(*b).space == Space::Local {
                let name = self.k.buffer(*b).name.clone();
                self.err(format!("{what} reads %{name}, which is per thread"));
            }
        }
    }
}

/// The operand type of the kernel's tensor-core products (`mma.sync`), if it has any.
pub fn matrix_input(k: &Kernel) -> Option<Elem> {
    fn find(body: &[Stmt], k: &Kernel) -> Option<Elem> {
        body.iter().find_map(|s| match s {
            Stmt::WarpMma { a, .. } => Some(k.buffer(a.buf).elem),
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => find(body, k),
            _ => None,
        })
    }
    find(&k.body, k)
}

/// What a kernel does, for the roofline: float operations executed (an fma counts two; guarded code is
/// counted as if it always ran) and the compulsory global traffic (every global buffer it touches, once).
pub fn work(k: &Kernel) -> (u64, u64) {
    fn ops(e: &Expr, k: &Kernel) -> u64 {
        let float = e.elem(k).is_float() as u64;
        match e {
            Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => 0,
            Expr::Load(_, ix) => ix.iter().map(|x| ops(x, k)).sum(),
            Expr::Unary(_, a) | Expr::Cast(_, a) => float + ops(a, k),
            Expr::Binary(_, a, b) => float + ops(a, k) + ops(b, k),
            Expr::Fma(a, b, c) => 2 * float + ops(a, k) + ops(b, k) + ops(c, k),
            Expr::Select(a, b, c) => ops(a, k) + ops(b, k) + ops(c, k),
        }
    }
    fn flops(body: &[Stmt], k: &Kernel) -> u64 {
        body.iter()
            .map(|s| match s {
                Stmt::For { extent, body, .. } => extent.saturating_mul(flops(body, k)),
                Stmt::If { cond, then } => ops(cond, k) + flops(then, k),
                Stmt::Store { value, .. } => ops(value, k),
                Stmt::Barrier
                | Stmt::CopyAsync { .. }
                | Stmt::AsyncWait
                | Stmt::Prefetch { .. } => 0,
                // Five shuffles and combines a thread, not counted (they are not in any thread loop).
                Stmt::WarpReduce { .. } => 0,
                Stmt::Mma { m, n, k: depth, .. } => 2 * m * n * depth,
                // One thread's share of the warp's 16 x 8 x K product: its four outputs.
                Stmt::WarpMma { a, .. } => 2 * 4 * crate::ir::warp_mma_k(k.buffer(a.buf).elem),
            })
            .sum()
    }
    let used = crate::analysis::buffer_uses(&k.body);
    let bytes = k
        .bufs
        .iter()
        .enumerate()
        .filter(|(i, b)| b.space == Space::Global && used.contains_key(&BufId(*i as u32)))
        .map(|(_, b)| b.numel() * b.elem.size())
        .sum();
    (flops(&k.body, k), bytes)
}
