//! GPU schedules: every kernel of a program, lowered as its plain algorithm, becomes one or more GPU
//! kernels in the form `mlopt_kir::gpu` describes (a grid of blocks, thread loops, shared memory,
//! barriers).
//!
//! 1. **Launches** (`launches.rs`). A kernel's top-level loop nests run one after another and may pass values through a
//!    `local` buffer (an anchor's result that layout members then read); blocks of one launch cannot wait
//!    for each other, so each nest becomes its own kernel, and a local read by a later nest becomes a
//!    global scratch buffer at the end of the activation arena. Statements between nests go with the next
//!    nest. Each launch is classed once (`crate::class`): a contraction or convolution runs as a tiled
//!    GEMM (`gemm.rs`), attention on tensor cores (`attention.rs`). A contraction with too few tiles
//!    for the GPU and a long K runs as two launches, partial sums over slices of K and their sum
//!    (`split_k.rs`), where the cost model says that pays.
//! 2. **Data-parallel loops** (`elementwise.rs`). The outer loops of a nest whose every store depends on them (each output
//!    element is written by one iteration) are collapsed into one index space, cut into blocks of threads:
//!    thread `t` of block `b` runs the body for element `b * T + t`, innermost loop fastest, so
//!    neighbouring threads write neighbouring elements (coalesced stores).
//! 3. **Cooperative rows** (`rows.rs`). When that body is a row computation with reductions (softmax, layer norm,
//!    a reduction over a long axis), one block computes one row: each reduction is folded by all threads
//!    (thread `t` takes elements `t, t + T, ...`) into a per-thread partial, the partials are combined by
//!    warp shuffles (each warp's, then the warps' sums in the first warp; a tree in shared memory for
//!    other types and combines), and loops over the row's elements are shared out the same way. Row buffers
//!    and the row's scalars live in shared memory; barriers separate the steps.
//!
//! Anything else runs on one thread, which is always correct (ScatterND's updates must be serial).

mod attention;
mod elementwise;
pub(crate) mod gemm;
mod gemm_build;
mod launches;
mod rows;
mod split_k;

use elementwise::elementwise;
use launches::schedule_program;
use rows::cooperative;

use crate::class::Class;
use crate::error::{Result, ScheduleError};
use mlopt_kir::analysis::{
    buffer_uses, coefficient, flat_index, moves_with, multiple_of, non_negative, private_in,
};
use mlopt_kir::{
    rebuild_bin, BinOp, BufId, Elem, Expr, Kernel, LoopKind, Place, Program, Space, Step, Stmt, Var,
};
use mlopt_target::GpuTarget;
use std::collections::{HashMap, HashSet};

/// What GPU schedules are chosen for: the target (SMs, shared memory, registers and peaks, for choosing
/// GEMM tiles), whether f32 operands may be rounded to tf32, and a margin of registers the driver adds
/// to every GEMM tile's estimate when ptxas needed more than a tile planned for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuSchedule<'t> {
    pub(crate) target: &'t GpuTarget,
    /// tf32 tensor cores round f32 operands to 10 mantissa bits: only where the precision allows it.
    pub(crate) tf32: bool,
    pub(crate) register_margin: u64,
}

impl GpuSchedule<'_> {
    /// Threads per block at most, and static shared memory per block.
    pub(crate) const MAX_THREADS: u64 = GpuTarget::MAX_THREADS;
    pub(crate) const SHARED_BYTES: u64 = GpuTarget::SHARED_BYTES;

    /// Streaming multiprocessors, to judge when a grid fills the device.
    pub(crate) fn sms(&self) -> u64 {
        u64::from(self.target.sms)
    }

    /// Device FLOP/s on tensor cores for operands of type `e` (tf32 for f32, where allowed), if any.
    pub(crate) fn matrix(&self, e: Elem) -> Option<f64> {
        match e {
            Elem::BF16 => Some(self.target.bf16),
            Elem::F16 => Some(self.target.f16),
            _ => Some(self.target.tf32).filter(|_| self.tf32),
        }
    }
}

/// The GPU schedule of every kernel of `p` for `t`.
pub fn schedule(p: Program, t: &GpuTarget, o: &crate::Options) -> Result<Program> {
    let s = GpuSchedule {
        target: t,
        tf32: o.tf32,
        register_margin: o.register_margin,
    };
    schedule_program(p, &s)
}

use mlopt_cost::kernel::{
    GPU_ELEMENTWISE_THREADS as ELEMENTWISE_THREADS, GPU_ROW_THREADS as ROW_THREADS,
};

/// Schedules one launch's body (a kernel of plain loops) for the GPU.
pub(crate) fn schedule_kernel(k: &mut Kernel, class: Class, s: &GpuSchedule) -> Result<()> {
    if k.body.is_empty() {
        return Ok(());
    }
    let body = std::mem::take(&mut k.body);
    let (prefix, inner) = parallel_prefix(k, body);
    let n: u64 = prefix.iter().map(|(_, e)| *e).product();
    if n == 0 {
        // Nothing to compute (a zero-sized output): one empty block keeps the launch well formed.
        let b = k.var(format!("gb{}", k.vars.len()));
        k.body = vec![Stmt::for_(b, 1, LoopKind::GpuBlock(0), vec![])];
        k.schedule.push(mlopt_kir::ScheduleStep::GpuEmpty);
        return Ok(());
    }
    let planned = match &class {
        // (Integer contractions, f32 tiles cannot sum, run as written.)
        Class::Contraction(c) | Class::Convolution(c, _) if c.sum == mlopt_kir::Elem::F32 => {
            gemm::gemm(k, c, s)?
        }
        Class::Contraction(_) | Class::Convolution(..) => None,
        Class::Attention(a) => attention::attention(k, a, s)?,
        Class::Other => None,
    };
    if let Some(stmts) = planned {
        k.body = stmts;
        return Ok(());
    }
    let wide = prefix.is_empty() || n < s.sms() * ELEMENTWISE_THREADS;
    if wide {
        if let Some(stmts) = cooperative(k, &prefix, &inner)? {
            k.body = stmts;
            return Ok(());
        }
    }
    k.body = elementwise(k, &prefix, inner, n);
    Ok(())
}

/// Peels the outer loops whose every store depends on them (or that run once): (var, extent) outermost
/// first, and the body inside the last of them.
fn parallel_prefix(k: &Kernel, body: Vec<Stmt>) -> (Vec<(Var, u64)>, Vec<Stmt>) {
    let uses = buffer_uses(&body);
    let mut prefix = Vec::new();
    let mut cur = body;
    while let [Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    }] = cur.as_slice()
    {
        if *extent > 1 && !stores_depend(k, *var, *extent, body, &uses) {
            break;
        }
        prefix.push((*var, *extent));
        let inner = body.clone();
        cur = inner;
    }
    (prefix, cur)
}

/// Whether every store in `body` to a buffer that is not private to it moves with `v`.
fn stores_depend(
    k: &Kernel,
    v: Var,
    extent: u64,
    body: &[Stmt],
    uses: &HashMap<BufId, usize>,
) -> bool {
    let private = private_in(k, body, uses);
    fn walk(k: &Kernel, v: Var, extent: u64, body: &[Stmt], private: &[BufId]) -> bool {
        body.iter().all(|s| match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => {
                walk(k, v, extent, body, private)
            }
            Stmt::Store { buf, index, .. } => {
                private.contains(buf) || moves_with(&flat_index(k, *buf, index), v, extent)
            }
            Stmt::Barrier
            | Stmt::Mma { .. }
            | Stmt::WarpMma { .. }
            | Stmt::CopyAsync { .. }
            | Stmt::AsyncWait
            | Stmt::Prefetch { .. }
            | Stmt::WarpReduce { .. } => false,
        })
    }
    walk(k, v, extent, body, &private)
}

/// The expressions of collapsed loops `(var, extent)` (outermost first) at flat index `g`.
pub(crate) fn delinear(prefix: &[(Var, u64)], g: &Expr) -> Vec<(Var, Expr)> {
    let mut out = Vec::new();
    let mut stride = 1u64;
    // The outermost loop that moves needs no remainder: the index never reaches its extent.
    let outer = prefix.iter().position(|(_, e)| *e > 1).unwrap_or(0);
    for (i, (v, e)) in prefix.iter().enumerate().rev() {
        let q = Expr::div(g.clone(), Expr::int(stride as i64));
        let x = if *e == 1 {
            Expr::int(0)
        } else if i == outer {
            q
        } else {
            Expr::rem(q, Expr::int(*e as i64))
        };
        out.push((*v, x));
        stride *= e;
    }
    out
}

pub(crate) fn subst_all(body: &[Stmt], by: &[(Var, Expr)]) -> Vec<Stmt> {
    body.iter().map(|s| s.subst_all(by)).collect()
}

pub(crate) fn lt(a: Expr, n: u64) -> Expr {
    Expr::bin(BinOp::Lt, a, Expr::int(n as i64))
}

/// Schedules a kernel of one nest, classified first (for tests).
#[cfg(test)]
pub(crate) fn schedule_nest(k: &mut Kernel, s: &GpuSchedule) -> Result<()> {
    let class = launches::launch_class(k);
    schedule_kernel(k, class, s)
}

/// The A100 (sm_80) in fp32, for tests.
#[cfg(test)]
pub(crate) fn sm80() -> GpuSchedule<'static> {
    static SM80: std::sync::OnceLock<GpuTarget> = std::sync::OnceLock::new();
    GpuSchedule {
        target: SM80.get_or_init(mlopt_target::gpu::sm_80),
        tf32: false,
        register_margin: 0,
    }
}

// The elementwise launches' vectors are held by tests/filetests/schedule/gpu_elementwise_*.kir.
