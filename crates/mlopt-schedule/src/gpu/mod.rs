//! GPU schedules: every kernel of a program, lowered as its plain algorithm, becomes one or more GPU
//! kernels in the form `mlopt_kir::gpu` describes (a grid of blocks, thread loops, shared memory,
//! barriers).
//!
//! 1. **Launches.** A kernel's top-level loop nests run one after another and may pass values through a
//!    `local` buffer (an anchor's result that layout members then read); blocks of one launch cannot wait
//!    for each other, so each nest becomes its own kernel, and a local read by a later nest becomes a
//!    global scratch buffer at the end of the activation arena. Statements between nests go with the next
//!    nest.
//! 2. **Data-parallel loops.** The outer loops of a nest whose every store depends on them (each output
//!    element is written by one iteration) are collapsed into one index space, cut into blocks of threads:
//!    thread `t` of block `b` runs the body for element `b * T + t`, innermost loop fastest, so
//!    neighbouring threads write neighbouring elements (coalesced stores).
//! 3. **Cooperative rows.** When that body is a row computation with reductions (softmax, layer norm,
//!    a reduction over a long axis), one block computes one row: each reduction is folded by all threads
//!    (thread `t` takes elements `t, t + T, ...`) into a per-thread partial, the partials are combined by
//!    warp shuffles (each warp's, then the warps' sums in the first warp; a tree in shared memory for
//!    other types and combines), and loops over the row's elements are shared out the same way. Row buffers
//!    and the row's scalars live in shared memory; barriers separate the steps.
//!
//! Anything else runs on one thread, which is always correct (ScatterND's updates must be serial).

mod attention;
pub(crate) mod gemm;

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

/// Turns a program of plain kernels into GPU kernels, splitting kernels into launches where needed.
fn schedule_program(p: Program, s: &GpuSchedule) -> Result<Program> {
    let mut out = Program {
        kernels: Vec::new(),
        steps: Vec::new(),
        ..p.clone()
    };
    let scratch0 = p.arena_bytes.div_ceil(256) * 256;
    let mut arena = p.arena_bytes;
    for step in &p.steps {
        let k = p
            .kernels
            .get(step.kernel)
            .ok_or_else(|| ScheduleError::Internal(format!("step calls kernel {}", step.kernel)))?;
        let launches = split(k);
        // Locals read by more than one launch: global scratch, laid out from the arena's end.
        let mut scratch: HashMap<BufId, u64> = HashMap::new();
        let mut at = scratch0;
        if launches.len() > 1 {
            for (b, buf) in k.bufs.iter().enumerate() {
                let users = launches
                    .iter()
                    .filter(|l| buffer_uses(l).contains_key(&BufId(b as u32)))
                    .count();
                if buf.space == Space::Local && users > 1 {
                    scratch.insert(BufId(b as u32), at);
                    at += (buf.numel() * buf.elem.size()).div_ceil(256) * 256;
                }
            }
        }
        arena = arena.max(at);
        let n = launches.len();
        for (i, body) in launches.into_iter().enumerate() {
            let mut kernel = k.clone();
            if n > 1 {
                kernel.name = format!("{}_{i}", k.name);
            }
            kernel.body = body;
            // Parameters in order: the original ones, then the scratch buffers.
            let mut order: Vec<BufId> = scratch.keys().copied().collect();
            order.sort();
            for b in &order {
                kernel.bufs[b.0 as usize].space = Space::Global;
            }
            let (mut kernel, args) = drop_unused(kernel, &step.args, &order, &scratch)?;
            let class = launch_class(&mut kernel);
            schedule_kernel(&mut kernel, class, s)?;
            // A check reads its flag once the last launch has written it.
            out.steps.push(Step {
                kernel: out.kernels.len(),
                args,
                check: step.check.clone().filter(|_| i + 1 == n),
            });
            out.kernels.push(kernel);
        }
    }
    out.arena_bytes = arena;
    mlopt_kir::verify_program(&out).map_err(ScheduleError::Verify)?;
    Ok(out)
}

/// The launches of a kernel: each top-level loop nest, with the statements before it.
fn split(k: &Kernel) -> Vec<Vec<Stmt>> {
    let mut out: Vec<Vec<Stmt>> = Vec::new();
    let mut pending = Vec::new();
    for s in &k.body {
        pending.push(s.clone());
        if matches!(s, Stmt::For { .. }) {
            out.push(std::mem::take(&mut pending));
        }
    }
    match out.last_mut() {
        Some(last) => last.extend(pending),
        None if !pending.is_empty() => out.push(pending),
        None => {}
    }
    out
}

/// The class of a launch's nest, recognised once: a launch of one nest has that nest's class; one
/// that also holds statements before or after it is scheduled as it is.
fn launch_class(k: &mut Kernel) -> Class {
    match Class::of_kernel(k).pop() {
        Some(c) if k.body.len() == 1 => c,
        _ => Class::Other,
    }
}

/// The kernel without the buffers its body does not use, and the arguments of its parameters: the
/// original parameters (`args`, in order) and the promoted scratch buffers (`scratch`, in `order`).
fn drop_unused(
    k: Kernel,
    args: &[Place],
    order: &[BufId],
    scratch: &HashMap<BufId, u64>,
) -> Result<(Kernel, Vec<Place>)> {
    let used = buffer_uses(&k.body);
    // The original parameters are the Global buffers that are not scratch, in order.
    let mut param_args = args.iter();
    let mut keep: Vec<(BufId, Option<Place>)> = Vec::new();
    for (i, b) in k.bufs.iter().enumerate() {
        let id = BufId(i as u32);
        let place = if b.space == Space::Global && !scratch.contains_key(&id) {
            Some(*param_args.next().ok_or_else(|| {
                ScheduleError::Internal(format!("@{}: fewer arguments than parameters", k.name))
            })?)
        } else {
            None
        };
        if used.contains_key(&id) {
            keep.push((id, place));
        }
    }
    // Scratch parameters go last, so the step's arguments read: original parameters, then scratch.
    keep.sort_by_key(|(id, _)| order.iter().position(|o| o == id).map_or(0, |p| p + 1));
    let remap: HashMap<BufId, BufId> = keep
        .iter()
        .enumerate()
        .map(|(new, (old, _))| (*old, BufId(new as u32)))
        .collect();
    let mut out = Kernel {
        bufs: keep
            .iter()
            .map(|(id, _)| k.bufs[id.0 as usize].clone())
            .collect(),
        body: Vec::new(),
        ..k.clone()
    };
    out.body = k.body.iter().map(|s| rename_stmt(s, &remap)).collect();
    let args = keep
        .iter()
        .filter(|(id, _)| k.bufs[id.0 as usize].space == Space::Global)
        .map(|(id, place)| {
            place.unwrap_or_else(|| Place::Arena(scratch.get(id).copied().unwrap_or(0)))
        })
        .collect();
    Ok((out, args))
}

fn rename_expr(e: &Expr, m: &HashMap<BufId, BufId>) -> Expr {
    e.map_loads(&|b, ix| Expr::Load(m.get(&b).copied().unwrap_or(b), ix))
}

fn rename_stmt(s: &Stmt, m: &HashMap<BufId, BufId>) -> Stmt {
    let ix = |v: &[Expr]| v.iter().map(|x| rename_expr(x, m)).collect::<Vec<_>>();
    let blk = |b: &mlopt_kir::Block| mlopt_kir::Block {
        buf: m.get(&b.buf).copied().unwrap_or(b.buf),
        at: ix(&b.at),
    };
    match s {
        Stmt::For {
            var,
            extent,
            kind,
            body,
        } => Stmt::For {
            var: *var,
            extent: *extent,
            kind: *kind,
            body: body.iter().map(|s| rename_stmt(s, m)).collect(),
        },
        Stmt::Store { buf, index, value } => Stmt::Store {
            buf: m.get(buf).copied().unwrap_or(*buf),
            index: ix(index),
            value: rename_expr(value, m),
        },
        Stmt::If { cond, then } => Stmt::If {
            cond: rename_expr(cond, m),
            then: then.iter().map(|s| rename_stmt(s, m)).collect(),
        },
        Stmt::Barrier => Stmt::Barrier,
        Stmt::Mma {
            m: rows,
            n,
            k,
            c,
            a,
            b,
            acc,
        } => Stmt::Mma {
            m: *rows,
            n: *n,
            k: *k,
            c: blk(c),
            a: blk(a),
            b: blk(b),
            acc: *acc,
        },
        Stmt::WarpMma { c, a, b } => Stmt::WarpMma {
            c: blk(c),
            a: blk(a),
            b: blk(b),
        },
        Stmt::CopyAsync {
            dst,
            src,
            from,
            lanes,
            valid,
        } => Stmt::CopyAsync {
            dst: blk(dst),
            src: m.get(src).copied().unwrap_or(*src),
            from: rename_expr(from, m),
            lanes: *lanes,
            valid: valid.as_ref().map(|c| rename_expr(c, m)),
        },
        Stmt::AsyncWait => Stmt::AsyncWait,
        Stmt::WarpReduce { buf, op } => Stmt::WarpReduce {
            buf: m.get(buf).copied().unwrap_or(*buf),
            op: *op,
        },
    }
}

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
        Class::Contraction(c) | Class::Convolution(c, _) => gemm::gemm(k, c, s)?,
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

/// One element per thread: `for b in grid { for t in block { if b*T+t < n { body(b*T+t) } } }`; or, when
/// the body allows it ([`vectorised`]), `w` neighbouring elements per thread as one `vector<w>` loop.
fn elementwise(k: &mut Kernel, prefix: &[(Var, u64)], body: Vec<Stmt>, n: u64) -> Vec<Stmt> {
    if let Some(stmts) = vectorised(k, prefix, &body, n) {
        return stmts;
    }
    let threads = if prefix.is_empty() {
        1
    } else {
        ELEMENTWISE_THREADS.min(n.div_ceil(32) * 32)
    };
    let grid = n.div_ceil(threads).max(1);
    let (b, t) = (
        k.var(format!("gb{}", k.vars.len())),
        k.var(format!("gt{}", k.vars.len())),
    );
    let g = Expr::add(
        Expr::mul(Expr::var(b), Expr::int(threads as i64)),
        Expr::var(t),
    );
    let mut inner = subst_all(&body, &delinear(prefix, &g));
    if grid * threads != n {
        inner = vec![Stmt::If {
            cond: lt(g, n),
            then: inner,
        }];
    }
    k.schedule.push(mlopt_kir::ScheduleStep::GpuElementwise {
        n,
        grid,
        threads,
        vector: None,
    });
    vec![Stmt::for_(
        b,
        grid,
        LoopKind::GpuBlock(0),
        vec![Stmt::for_(t, threads, LoopKind::GpuThread(0), inner)],
    )]
}

/// `w` elements per thread: the innermost collapsed loop `x` becomes `xv * w + l`, with `l` a `vector<w>`
/// loop, so every store (and every load that moves with `x`) touches `w` neighbouring elements starting at
/// a multiple of `w`: one 16-byte access (`ld/st.global.v4.b32`) instead of `w` narrow ones. Taken when
/// `w` (16 bytes of the widest element the body touches) divides the innermost extent, every global store
/// runs through memory with `l` from an aligned start, and no guard depends on `l` (lanes cannot branch
/// apart). Device buffers are 16-byte aligned (arena slots 64, weights 256, and the launcher checks the
/// caller's pointers), so an aligned start in elements is an aligned address.
fn vectorised(k: &mut Kernel, prefix: &[(Var, u64)], body: &[Stmt], n: u64) -> Option<Vec<Stmt>> {
    let &(x, extent) = prefix.last()?;
    let uses = buffer_uses(body);
    let widest = uses
        .keys()
        .filter(|b| k.buffer(**b).space == Space::Global)
        .map(|b| k.buffer(*b).elem.size())
        .max()?;
    let w = (16 / widest).min(8);
    if w < 2 || extent % w != 0 {
        return None;
    }
    let vars = k.vars.len();
    let (xv, l) = (k.var(format!("gx{vars}")), k.var(format!("gl{vars}")));
    let hi = Expr::mul(Expr::var(xv), Expr::int(w as i64));
    let split = |e: &Expr| split_lanes(e, x, &hi, l, w as i64);
    let inner: Vec<Stmt> = body.iter().map(|s| s.map_exprs(&split)).collect();
    if !lanes_fit(k, &inner, l, w as i64) {
        k.vars.truncate(vars);
        return None;
    }
    let mut outer = prefix.to_vec();
    outer.pop();
    outer.push((xv, extent / w));
    let m = n / w;
    let threads = ELEMENTWISE_THREADS.min(m.div_ceil(32) * 32);
    let grid = m.div_ceil(threads).max(1);
    let (b, t) = (
        k.var(format!("gb{}", k.vars.len())),
        k.var(format!("gt{}", k.vars.len())),
    );
    let g = Expr::add(
        Expr::mul(Expr::var(b), Expr::int(threads as i64)),
        Expr::var(t),
    );
    let mut body = vec![Stmt::for_(
        l,
        w,
        LoopKind::Vector(w as u32),
        subst_all(&inner, &delinear(&outer, &g)),
    )];
    if grid * threads != m {
        body = vec![Stmt::If {
            cond: lt(g, m),
            then: body,
        }];
    }
    k.schedule.push(mlopt_kir::ScheduleStep::GpuElementwise {
        n,
        grid,
        threads,
        vector: Some(w as u32),
    });
    Some(vec![Stmt::for_(
        b,
        grid,
        LoopKind::GpuBlock(0),
        vec![Stmt::for_(t, threads, LoopKind::GpuThread(0), body)],
    )])
}

/// `e` with `x` replaced by `hi + l`, where `hi` is a non-negative multiple of `w` and `0 <= l < w`. A
/// quotient or remainder of `m + l` (`m` a non-negative multiple of `w`) by a multiple `d` of `w` stays
/// in one run of `d`: it becomes `m / d`, or `m % d + l`, so the lane keeps a visible coefficient.
fn split_lanes(e: &Expr, x: Var, hi: &Expr, l: Var, w: i64) -> Expr {
    let r = |a: &Expr| split_lanes(a, x, hi, l, w);
    match e {
        Expr::Var(v) if *v == x => Expr::add(hi.clone(), Expr::var(l)),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => e.clone(),
        Expr::Binary(op @ (BinOp::Div | BinOp::Rem), a, b) => {
            let (a, b) = (r(a), r(b));
            if let Expr::Int(d) = b {
                let m = a.subst(l, &Expr::int(0));
                if d > 0
                    && d % w == 0
                    && coefficient(&a, l) == Some(1)
                    && multiple_of(&m, w)
                    && non_negative(&m)
                {
                    return if *op == BinOp::Div {
                        Expr::div(m, Expr::int(d))
                    } else {
                        Expr::add(Expr::rem(m, Expr::int(d)), Expr::var(l))
                    };
                }
            }
            rebuild_bin(*op, a, b)
        }
        Expr::Binary(op, a, b) => rebuild_bin(*op, r(a), r(b)),
        Expr::Load(buf, ix) => Expr::Load(*buf, ix.iter().map(r).collect()),
        Expr::Unary(o, a) => Expr::un(*o, r(a)),
        Expr::Fma(a, b, c) => Expr::fma(r(a), r(b), r(c)),
        Expr::Select(c, a, b) => Expr::select(r(c), r(a), r(b)),
        Expr::Cast(t, a) => Expr::cast(*t, r(a)),
    }
}

/// Whether lanes `l` (0..w) of a split body can run as one vector: it holds only loops, guards and
/// stores, no guard depends on a lane, and every global store moves with `l` element by element from a
/// multiple of `w`.
fn lanes_fit(k: &Kernel, body: &[Stmt], l: Var, w: i64) -> bool {
    body.iter().all(|s| match s {
        Stmt::For {
            kind: LoopKind::Serial | LoopKind::Unrolled,
            body,
            ..
        } => lanes_fit(k, body, l, w),
        Stmt::If { cond, then } => {
            !cond.uses(l)
                && mlopt_kir::analysis::expr_loads(cond)
                    .keys()
                    .all(|b| k.buffer(*b).space == Space::Global)
                && lanes_fit(k, then, l, w)
        }
        Stmt::Store { buf, index, .. } if k.buffer(*buf).space == Space::Global => {
            let flat = flat_index(k, *buf, index);
            coefficient(&flat, l) == Some(1) && multiple_of(&flat.subst(l, &Expr::int(0)), w)
        }
        Stmt::Store { .. } => true,
        _ => false,
    })
}

/// One statement of a cooperative row.
enum RowStep {
    /// `%s[..] = e` on a row scalar: thread 0 computes it.
    Scalar(Stmt),
    /// Loops (outermost first) folding one accumulator element: the update statement, the accumulator,
    /// how partials combine, and the combine's identity.
    Fold {
        loops: Vec<(Var, u64)>,
        update: Stmt,
        acc: (BufId, Vec<Expr>),
        combine: BinOp,
        identity: Expr,
    },
    /// Loops (outermost first) whose every iteration writes its own elements: shared among the threads.
    Map {
        loops: Vec<(Var, u64)>,
        body: Vec<Stmt>,
    },
}

/// Perfectly nested serial loops at the head of `s`: (var, extent) outermost first, and the body.
fn nest(s: &Stmt) -> (Vec<(Var, u64)>, Vec<Stmt>) {
    let mut loops = Vec::new();
    let mut cur = vec![s.clone()];
    while let [Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    }] = cur.as_slice()
    {
        loops.push((*var, *extent));
        let b = body.clone();
        cur = b;
    }
    (loops, cur)
}

/// The reduction an update statement performs on its accumulator: `acc = op(acc, f)`, `op(f, acc)` or
/// `fma(a, b, acc)`, with `f` not reading the accumulator.
fn fold_of(k: &Kernel, s: &Stmt) -> Option<((BufId, Vec<Expr>), BinOp, Expr)> {
    let Stmt::Store { buf, index, value } = s else {
        return None;
    };
    if k.buffer(*buf).space != Space::Local || index.iter().any(|e| !matches!(e, Expr::Int(_))) {
        return None;
    }
    let me = Expr::Load(*buf, index.clone());
    let reads_acc = |e: &Expr| mlopt_kir::analysis::expr_loads(e).contains_key(buf);
    let t = k.buffer(*buf).elem;
    let (op, rest) = match value {
        Expr::Fma(a, b, c) if **c == me => (BinOp::Add, vec![&**a, &**b]),
        Expr::Binary(
            op @ (BinOp::Add | BinOp::Mul | BinOp::Max | BinOp::Min | BinOp::And | BinOp::Or),
            a,
            b,
        ) if **a == me => (*op, vec![&**b]),
        Expr::Binary(
            op @ (BinOp::Add | BinOp::Mul | BinOp::Max | BinOp::Min | BinOp::And | BinOp::Or),
            a,
            b,
        ) if **b == me => (*op, vec![&**a]),
        _ => return None,
    };
    if rest.into_iter().any(reads_acc) {
        return None;
    }
    let id = identity(op, t)?;
    Some(((*buf, index.clone()), op, id))
}

fn identity(op: BinOp, t: Elem) -> Option<Expr> {
    let f = |x: f64| Expr::Float(x, t);
    Some(match (op, t.is_float()) {
        (BinOp::Add, true) => f(0.0),
        (BinOp::Mul, true) => f(1.0),
        (BinOp::Max, true) => f(f64::NEG_INFINITY),
        (BinOp::Min, true) => f(f64::INFINITY),
        _ => return None,
    })
}

/// The steps of a cooperative row, or None when `body` is not one.
fn row_steps(k: &Kernel, body: &[Stmt], uses: &HashMap<BufId, usize>) -> Option<Vec<RowStep>> {
    let mut steps = Vec::new();
    for s in body {
        match s {
            Stmt::Store { buf, index, .. }
                if k.buffer(*buf).space == Space::Local
                    && index.iter().all(|e| matches!(e, Expr::Int(_))) =>
            {
                steps.push(RowStep::Scalar(s.clone()))
            }
            // The row's result (a reduction's `out[row] = acc`): the row's loops are all that are bound
            // here, so one thread stores it.
            Stmt::Store { buf, .. } if k.buffer(*buf).space == Space::Global => {
                steps.push(RowStep::Scalar(s.clone()))
            }
            Stmt::For { .. } => {
                let (loops, inner) = nest(s);
                if let [update] = inner.as_slice() {
                    if let Some((acc, combine, identity)) = fold_of(k, update) {
                        steps.push(RowStep::Fold {
                            loops,
                            update: update.clone(),
                            acc,
                            combine,
                            identity,
                        });
                        continue;
                    }
                }
                // A map: every store outside the iteration's own locals moves with each of the loops.
                let private = private_in(k, &inner, uses);
                let moving: Vec<Var> = loops
                    .iter()
                    .filter(|(_, e)| *e > 1)
                    .map(|(v, _)| *v)
                    .collect();
                let ok = all_stores(&inner, &mut |b, ix| {
                    private.contains(&b)
                        || moving
                            .iter()
                            .all(|v| coefficient(&flat_index(k, b, ix), *v).is_some_and(|c| c != 0))
                });
                if !ok {
                    return None;
                }
                steps.push(RowStep::Map { loops, body: inner });
            }
            _ => return None,
        }
    }
    steps
        .iter()
        .any(|s| matches!(s, RowStep::Fold { .. }))
        .then_some(steps)
}

/// Whether `ok(buffer, index)` holds for every store in `body` (false if it holds a barrier or an mma).
fn all_stores(body: &[Stmt], ok: &mut dyn FnMut(BufId, &[Expr]) -> bool) -> bool {
    body.iter().all(|s| match s {
        Stmt::Store { buf, index, .. } => ok(*buf, index),
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => all_stores(body, ok),
        Stmt::Barrier
        | Stmt::Mma { .. }
        | Stmt::WarpMma { .. }
        | Stmt::CopyAsync { .. }
        | Stmt::AsyncWait
        | Stmt::WarpReduce { .. } => false,
    })
}

/// `for rr in 0..ceil(n / threads) { if rr * threads + t < n { body(loops at rr * threads + t) } }`: the
/// iterations of `loops` shared out among the block's threads, neighbouring threads on neighbouring
/// iterations.
fn strided(k: &mut Kernel, t: Var, threads: u64, loops: &[(Var, u64)], body: &[Stmt]) -> Stmt {
    let n: u64 = loops.iter().map(|(_, e)| *e).product();
    let rr = k.var(format!("rr{}", k.vars.len()));
    let idx = Expr::add(
        Expr::mul(Expr::var(rr), Expr::int(threads as i64)),
        Expr::var(t),
    );
    let mut inner = subst_all(body, &delinear(loops, &idx));
    if !n.is_multiple_of(threads) {
        inner = vec![Stmt::If {
            cond: lt(idx, n),
            then: inner,
        }];
    }
    Stmt::for_(rr, n.div_ceil(threads), LoopKind::Serial, inner)
}

/// One block per row: reductions by all threads, then warp shuffles (or a tree in shared memory); maps
/// shared out.
fn cooperative(k: &mut Kernel, prefix: &[(Var, u64)], body: &[Stmt]) -> Result<Option<Vec<Stmt>>> {
    let uses = buffer_uses(body);
    let Some(steps) = row_steps(k, body, &uses) else {
        return Ok(None);
    };
    let longest = steps
        .iter()
        .map(|st| match st {
            RowStep::Fold { loops, .. } | RowStep::Map { loops, .. } => {
                loops.iter().map(|(_, e)| *e).product::<u64>()
            }
            RowStep::Scalar(_) => 1,
        })
        .max()
        .unwrap_or(1);
    if longest < 32 {
        return Ok(None);
    }
    let threads = longest
        .next_power_of_two()
        .clamp(32, ROW_THREADS.min(GpuSchedule::MAX_THREADS));
    // Row buffers and scalars: locals touched by more than one step live in shared memory.
    let mut shared: HashSet<BufId> = HashSet::new();
    for st in &steps {
        let here = match st {
            RowStep::Scalar(x) | RowStep::Fold { update: x, .. } => {
                buffer_uses(std::slice::from_ref(x))
            }
            RowStep::Map { body, .. } => buffer_uses(body),
        };
        for (b, n) in here {
            if k.buffer(b).space == Space::Local && uses.get(&b) != Some(&n) {
                shared.insert(b);
            }
        }
        match st {
            RowStep::Fold { acc, .. } => {
                shared.insert(acc.0);
            }
            RowStep::Scalar(Stmt::Store { buf, .. }) if k.buffer(*buf).space == Space::Local => {
                shared.insert(*buf);
            }
            _ => {}
        }
    }
    let folds = steps
        .iter()
        .filter(|s| matches!(s, RowStep::Fold { .. }))
        .count() as u64;
    let bytes: u64 = shared
        .iter()
        .map(|b| k.buffer(*b).numel() * k.buffer(*b).elem.size())
        .sum::<u64>()
        + folds * threads * 8;
    if bytes > GpuSchedule::SHARED_BYTES {
        return Ok(None);
    }
    for b in &shared {
        k.bufs[b.0 as usize].space = Space::Shared;
    }
    let rows: u64 = prefix.iter().map(|(_, e)| *e).product();
    let gb = k.var(format!("gb{}", k.vars.len()));
    let at_row = delinear(prefix, &Expr::var(gb));
    let mut out = Vec::new();
    let thread_loop = |k: &mut Kernel, f: &mut dyn FnMut(&mut Kernel, Var) -> Vec<Stmt>| -> Stmt {
        let t = k.var(format!("t{}", k.vars.len()));
        let body = f(k, t);
        Stmt::for_(t, threads, LoopKind::GpuThread(0), body)
    };
    let first = |t: Var, s: Vec<Stmt>| Stmt::If {
        cond: Expr::bin(BinOp::Eq, Expr::var(t), Expr::int(0)),
        then: s,
    };
    for (i, st) in steps.iter().enumerate() {
        match st {
            RowStep::Scalar(x) => {
                let x = subst_all(std::slice::from_ref(x), &at_row);
                out.push(thread_loop(k, &mut |_, t| vec![first(t, x.clone())]));
            }
            RowStep::Map { loops, body } => {
                let body = subst_all(body, &at_row);
                out.push(thread_loop(k, &mut |k, t| {
                    vec![strided(k, t, threads, loops, &body)]
                }));
            }
            RowStep::Fold {
                loops,
                update,
                acc,
                combine,
                identity,
            } => {
                let elem = k.buffer(acc.0).elem;
                let part = k.buf(format!("part{i}"), elem, vec![], Space::Local);
                let mine = Expr::load(part, vec![]);
                let Stmt::Store { value, .. } = update else {
                    continue;
                };
                let value = value.map_loads(&|b, ix| {
                    if b == acc.0 && ix == acc.1 {
                        mine.clone()
                    } else {
                        Expr::Load(b, ix)
                    }
                });
                let step = Stmt::Store {
                    buf: part,
                    index: vec![],
                    value,
                };
                let step = subst_all(std::slice::from_ref(&step), &at_row);
                let partials = |k: &mut Kernel, t: Var, then: Vec<Stmt>| {
                    let mut body = vec![
                        Stmt::Store {
                            buf: part,
                            index: vec![],
                            value: identity.clone(),
                        },
                        strided(k, t, threads, loops, &step),
                    ];
                    body.extend(then);
                    body
                };
                // Warp shuffles where they apply (whole warps, a 32-bit type, an associative combine):
                // each warp reduces its partials, the warps' sums meet in shared memory, and the first
                // warp reduces those. Otherwise a tree in shared memory, one barrier a level.
                let shuffles = threads.is_multiple_of(32)
                    && matches!(elem, Elem::F32 | Elem::I32)
                    && matches!(combine, BinOp::Add | BinOp::Mul | BinOp::Min | BinOp::Max);
                let total = if shuffles {
                    let warps = threads / 32;
                    out.push(thread_loop(k, &mut |k, t| partials(k, t, vec![])));
                    out.push(Stmt::WarpReduce {
                        buf: part,
                        op: *combine,
                    });
                    if warps > 1 {
                        let sums = k.buf(format!("warps{i}"), elem, vec![warps], Space::Shared);
                        out.push(thread_loop(k, &mut |_, t| {
                            let lane0 = Expr::bin(
                                BinOp::Eq,
                                Expr::rem(Expr::var(t), Expr::int(32)),
                                Expr::int(0),
                            );
                            vec![Stmt::If {
                                cond: lane0,
                                then: vec![Stmt::Store {
                                    buf: sums,
                                    index: vec![Expr::div(Expr::var(t), Expr::int(32))],
                                    value: mine.clone(),
                                }],
                            }]
                        }));
                        out.push(Stmt::Barrier);
                        out.push(thread_loop(k, &mut |_, t| {
                            let theirs = Stmt::Store {
                                buf: part,
                                index: vec![],
                                value: Expr::load(sums, vec![Expr::var(t)]),
                            };
                            vec![
                                Stmt::Store {
                                    buf: part,
                                    index: vec![],
                                    value: identity.clone(),
                                },
                                Stmt::If {
                                    cond: lt(Expr::var(t), warps),
                                    then: vec![theirs],
                                },
                            ]
                        }));
                        out.push(Stmt::WarpReduce {
                            buf: part,
                            op: *combine,
                        });
                    }
                    mine.clone()
                } else {
                    let tree = k.buf(format!("tree{i}"), elem, vec![threads], Space::Shared);
                    out.push(thread_loop(k, &mut |k, t| {
                        partials(
                            k,
                            t,
                            vec![Stmt::Store {
                                buf: tree,
                                index: vec![Expr::var(t)],
                                value: mine.clone(),
                            }],
                        )
                    }));
                    let mut half = threads / 2;
                    while half >= 1 {
                        out.push(Stmt::Barrier);
                        out.push(thread_loop(k, &mut |_, t| {
                            let (a, b) = (
                                Expr::load(tree, vec![Expr::var(t)]),
                                Expr::load(
                                    tree,
                                    vec![Expr::add(Expr::var(t), Expr::int(half as i64))],
                                ),
                            );
                            vec![Stmt::If {
                                cond: lt(Expr::var(t), half),
                                then: vec![Stmt::Store {
                                    buf: tree,
                                    index: vec![Expr::var(t)],
                                    value: Expr::bin(*combine, a, b),
                                }],
                            }]
                        }));
                        half /= 2;
                    }
                    out.push(Stmt::Barrier);
                    Expr::load(tree, vec![Expr::int(0)])
                };
                let total = Expr::bin(*combine, Expr::Load(acc.0, acc.1.clone()), total);
                let fin = Stmt::Store {
                    buf: acc.0,
                    index: acc.1.clone(),
                    value: total,
                };
                out.push(thread_loop(k, &mut |_, t| {
                    vec![first(t, vec![fin.clone()])]
                }));
            }
        }
        out.push(Stmt::Barrier);
    }
    out.pop();
    k.schedule
        .push(mlopt_kir::ScheduleStep::GpuRows { rows, threads });
    Ok(Some(vec![Stmt::for_(
        gb,
        rows.max(1),
        LoopKind::GpuBlock(0),
        out,
    )]))
}

/// Schedules a kernel of one nest, classified first (for tests).
#[cfg(test)]
pub(crate) fn schedule_nest(k: &mut Kernel, s: &GpuSchedule) -> Result<()> {
    let class = launch_class(k);
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

#[cfg(test)]
mod tests {
    use super::{schedule_nest, sm80};
    use mlopt_kir::{parse_kernel, run_kernel, ScheduleStep};

    /// Elementwise kernels as lowering writes them: the schedule each gets (vector<w> where every global
    /// store is contiguous from an aligned start and no guard depends on the lane, one element per
    /// thread otherwise), and the scheduled kernel, run by the emulator, writes exactly what the plain
    /// loops do.
    #[test]
    fn elementwise_kernels_vectorise_where_aligned() {
        let cases: &[(&str, &str, &str)] = &[
            // Attention's merge of heads: the load's innermost index is (h*16 + d) % 16 under the split.
            (
                "merge heads",
                "%out: f32[16,64], %x: f32[4,16,16]",
                "serial %s in 0..16 { serial %c in 0..64 { %out[%s, %c] = (%x[(%c / 16), %s, (%c % 16)] * 2.0f32) } }",
            ),
            (
                "bf16 add",
                "%out: bf16[8,32], %x: bf16[8,32], %y: bf16[32]",
                "serial %i in 0..8 { serial %j in 0..32 { %out[%i, %j] = cast<bf16>((cast<f32>(%x[%i, %j]) + cast<f32>(%y[%j]))) } }",
            ),
            // The store is contiguous, the load strided (gathered lane by lane).
            ("transpose", "%out: f32[12,8], %x: f32[8,12]", "serial %i in 0..12 { serial %j in 0..8 { %out[%i, %j] = exp(%x[%j, %i]) } }"),
            ("odd extent", "%out: f32[5,6], %x: f32[5,6]", "serial %i in 0..5 { serial %j in 0..6 { %out[%i, %j] = abs(%x[%i, %j]) } }"),
            // A store at offset 1 in each row (a pad): its vectors would start misaligned.
            ("offset store", "%out: f32[4,9], %x: f32[4,8]", "serial %i in 0..4 { serial %j in 0..8 { %out[%i, (%j + 1)] = %x[%i, %j] } }"),
            ("lane guard", "%out: f32[4,8], %x: f32[4,8]", "serial %i in 0..4 { serial %j in 0..8 { if lt(%j, 3) { %out[%i, %j] = %x[%i, %j] } } }"),
        ];
        let want: &[(&str, Option<u32>)] = &[
            ("merge heads", Some(4)),
            ("bf16 add", Some(8)),
            ("transpose", Some(4)),
            ("odd extent", None),
            ("offset store", None),
            ("lane guard", None),
        ];
        for ((name, params, body), (_, vector)) in cases.iter().zip(want) {
            let plain = parse_kernel(&format!("kernel @k({params}) {{\n{body}\n}}\n"))
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            let mut gpu = plain.clone();
            schedule_nest(&mut gpu, &sm80()).unwrap();
            mlopt_kir::verify(&gpu)
                .unwrap_or_else(|e| panic!("{name}: {e:?}\n{}", mlopt_kir::print::kernel(&gpu)));
            let what = mlopt_kir::step::schedule_text(&gpu.schedule);
            let got = gpu.schedule.iter().find_map(|s| match s {
                ScheduleStep::GpuElementwise { vector, .. } => Some(*vector),
                _ => None,
            });
            assert_eq!(got, Some(*vector), "{name}: {what}");
            let sizes: Vec<usize> = plain
                .params()
                .iter()
                .map(|b| (plain.buffer(*b).numel() * plain.buffer(*b).elem.size()) as usize)
                .collect();
            let regions: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    if i == 0 {
                        vec![0u8; *n]
                    } else {
                        (0..*n).map(|j| (j * 7 % 61) as u8 + 60).collect()
                    }
                })
                .collect();
            let args: Vec<(usize, usize)> = (0..sizes.len()).map(|i| (i, 0)).collect();
            let (mut a, mut b) = (regions.clone(), regions);
            run_kernel(&plain, &mut a, &args).unwrap();
            run_kernel(&gpu, &mut b, &args)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{}", mlopt_kir::print::kernel(&gpu)));
            assert_eq!(
                a[0],
                b[0],
                "{name}: the GPU schedule writes other values\n{}",
                mlopt_kir::print::kernel(&gpu)
            );
        }
    }
}
