//! Schedules for CPU kernels, chosen per loop nest from what each loop writes:
//!
//! - **rfactor**, first: an f32 sum, max or min (or dot product) into a scalar, over one loop at least
//!   the lanes long, keeps one partial result per vector lane and combines them at the end
//!   (`mlopt_kir::rfactor`).
//! - **partition**, first: a loop whose selects or guards test its variable against constants (a
//!   concat) runs as one loop per range in which the tests have one answer (`mlopt_kir::partition`).
//! - **vector**: the deepest loop whose every store is contiguous in it (the flat index moves by one
//!   element per iteration) or goes to a local buffer used only inside it runs as `vector<lanes>` when
//!   the lanes divide its extent, else as the widest vector from 4 lanes up that does (`width`). For a
//!   contraction that is the output's column loop: each lane keeps its own accumulator, A is broadcast,
//!   B is one vector load per k.
//! - **parallel**: with more than one thread, the outermost loop of a nest whose every store depends on it
//!   (so threads write disjoint elements: affinely, or, where a store goes through a layout tail's
//!   divisions, as evaluating its index over the loops shows), with at least `threads` iterations and enough work to pay for
//!   waking the pool, runs as `parallel`; one whose iterations do not share out evenly (a multiple of
//!   the threads, at least 8 per thread, or the busiest thread at most a seventh over an even share) passes the choice to the nests inside it when they have a
//!   loop that can run in parallel. In a kernel with weights, a loop inside an evenly split one that
//!   would split too is taken instead where the cost model says the threads move fewer bytes
//!   (`mlopt_cost::kernel::split_s`): a contraction's rows (positions) rather than its columns when
//!   the columns run over a weight's output channels and the activations outweigh the weight.
//!
//! Loops holding a guard are never vectorised (a guard would differ between lanes); loops under one are.

use mlopt_kir::analysis::{buffer_uses as count_uses, coefficient, flat_index as flat, private_in};
use mlopt_kir::sched::set_kind;
use mlopt_kir::{BufId, Expr, Kernel, LoopKind, Stmt, Var};
use mlopt_target::CpuTarget;
use std::collections::HashMap;

/// Schedules `k`'s loops for `t`; `weights` are its parameters its call binds to a weight.
pub fn schedule(k: &mut Kernel, t: &CpuTarget, weights: &[BufId]) -> crate::Result<()> {
    let (lanes, threads) = (t.lanes(), t.threads);
    mlopt_kir::rfactor::rfactor(k, lanes);
    // Loops whose tests on their variable change answer at known points (a concat's inputs) run as one
    // loop per range, the tests folded away, before the vector and parallel loops are chosen.
    mlopt_kir::partition::partition(k);
    // Loops that would vectorise but for a remainder (56 = 3 x 16 + 8): peel the remainder off, so the
    // main part runs in full vector lanes (and the remainder in narrower ones).
    let uses = count_uses(&k.body);
    let mut peel = Vec::new();
    for st in &k.body {
        pick_peel(k, st, lanes, &uses, &mut peel);
    }
    for v in peel {
        mlopt_kir::sched::peel(k, v, u64::from(lanes))?;
    }
    let uses = count_uses(&k.body);
    let mut vector = Vec::new();
    let mut parallel = Vec::new();
    for st in &k.body {
        pick_vector(k, st, lanes, &uses, &mut vector);
        if threads > 1 {
            let nest = Nest {
                k,
                target: t,
                weights,
                uses: &uses,
                budget: DISTINCT_BUDGET,
            };
            pick_parallel(&nest, st, &mut Vec::new(), &mut parallel);
        }
    }
    for v in parallel {
        set_kind(k, v, LoopKind::Parallel)?;
    }
    for (v, w) in vector {
        set_kind(k, v, LoopKind::Vector(w))?;
    }
    Ok(())
}

/// Whether every store under `body` is fine for loop `v` by `ok(coefficient)`; local buffers used only
/// under `body` are private and always fine. False if `body` holds a guard.
fn stores_ok(
    k: &Kernel,
    v: Var,
    body: &[Stmt],
    uses: &HashMap<BufId, usize>,
    ok: &dyn Fn(Option<i64>) -> bool,
) -> bool {
    let by_coefficient = |flat: &Expr, _: &[(Var, u64)]| ok(coefficient(flat, v));
    stores_ok_in(k, body, uses, &by_coefficient, false)
}

/// Whether a store at a flat index is fine, given the loops between the nest's body and the store.
type StoreOk<'a> = &'a dyn Fn(&Expr, &[(Var, u64)]) -> bool;

/// Whether every store under `body` to a buffer not private to it is fine by `ok(flat index, the loops
/// between body and the store)`, where with `guards` a store under a guard counts as the store
/// (threads of a parallel loop may each skip some of theirs; vector lanes may not).
fn stores_ok_in(
    k: &Kernel,
    body: &[Stmt],
    uses: &HashMap<BufId, usize>,
    ok: StoreOk,
    guards: bool,
) -> bool {
    let locals = private_in(k, body, uses);
    let private = |b: &BufId| locals.contains(b);
    fn walk(
        k: &Kernel,
        body: &[Stmt],
        loops: &mut Vec<(Var, u64)>,
        private: &dyn Fn(&BufId) -> bool,
        ok: StoreOk,
        guards: bool,
    ) -> bool {
        body.iter().all(|s| match s {
            Stmt::For {
                var, extent, body, ..
            } => {
                loops.push((*var, *extent));
                let fine = walk(k, body, loops, private, ok, guards);
                loops.pop();
                fine
            }
            Stmt::If { then, .. } if guards => walk(k, then, loops, private, ok, guards),
            Stmt::If { .. }
            | Stmt::Barrier
            | Stmt::WarpMma { .. }
            | Stmt::CopyAsync { .. }
            | Stmt::AsyncWait
            | Stmt::WarpReduce { .. } => false,
            Stmt::Store { buf, index, .. } => private(buf) || ok(&flat(k, *buf, index), loops),
            Stmt::Prefetch { .. } => true,
            Stmt::Mma { c, .. } => private(&c.buf) || ok(&flat(k, c.buf, &c.at), loops),
        })
    }
    walk(k, body, &mut Vec::new(), &private, ok, guards)
}

/// Store executions a parallel verdict may evaluate to prove that threads write disjoint elements when
/// the affine test cannot (`mlopt_kir::analysis::distinct_for`).
const DISTINCT_BUDGET: u64 = 1 << 22;
/// The same for the loops inside an evenly split one, considered as alternatives to it.
const EXPLORE_BUDGET: u64 = 1 << 14;

/// Picks the loops to peel: the deepest loop that could run in vector lanes but for a remainder (56 =
/// 3 x 16 + 8), innermost or not (a pooling row whose window loops are inside it). Returns whether
/// `st` holds a loop the vector pass will take, so its enclosing loops are left alone.
fn pick_peel(
    k: &Kernel,
    st: &Stmt,
    lanes: u32,
    uses: &HashMap<BufId, usize>,
    out: &mut Vec<Var>,
) -> bool {
    if let Some(inner) = under_guard(st, &mut |s| pick_peel(k, s, lanes, uses, out)) {
        return inner;
    }
    let Stmt::For {
        var,
        extent,
        body,
        kind: LoopKind::Serial,
    } = st
    else {
        return holds_vector(st);
    };
    let mut inner = false;
    for s in body {
        inner |= pick_peel(k, s, lanes, uses, out);
    }
    if inner
        || mlopt_kir::analysis::has_mma(body)
        || !stores_ok(k, *var, body, uses, &|c| c == Some(1))
    {
        return inner;
    }
    let wide = u64::from(lanes);
    if *extent > wide && !extent.is_multiple_of(wide) {
        out.push(*var);
        return true;
    }
    width(*extent, lanes).is_some()
}

/// The vector width for a loop of `extent`: the target's lanes when they divide it, else the widest
/// width from 4 to the lanes that divides it (a 56-wide pooling row runs as vector<8>, a 7-wide one as
/// vector<7>), else None.
fn width(extent: u64, lanes: u32) -> Option<u32> {
    let lanes = u64::from(lanes);
    (4..=lanes.min(extent))
        .rev()
        .find(|w| extent.is_multiple_of(*w))
        .map(|w| w as u32)
}

/// For a guard: `pick` run on each statement under it, and whether any holds a loop the vector pass
/// takes (the loops under a guard, such as a block's whole-tile branch, are candidates: the guard is
/// the same for every lane of a loop inside it). None for anything else.
fn under_guard(st: &Stmt, pick: &mut dyn FnMut(&Stmt) -> bool) -> Option<bool> {
    let Stmt::If { then, .. } = st else {
        return None;
    };
    let mut inner = false;
    for s in then {
        inner |= pick(s);
    }
    Some(inner || holds_vector(st))
}

/// Whether `st` is or holds a loop lowering already made a vector loop (a fold's lanes, a tile's
/// columns): the loops around it then stay scalar, since vector loops do not nest.
fn holds_vector(st: &Stmt) -> bool {
    match st {
        Stmt::For {
            kind: LoopKind::Vector(_),
            ..
        } => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => body.iter().any(holds_vector),
        _ => false,
    }
}

fn pick_vector(
    k: &Kernel,
    st: &Stmt,
    lanes: u32,
    uses: &HashMap<BufId, usize>,
    out: &mut Vec<(Var, u32)>,
) -> bool {
    if let Some(inner) = under_guard(st, &mut |s| pick_vector(k, s, lanes, uses, out)) {
        return inner;
    }
    let Stmt::For {
        var,
        extent,
        body,
        kind: LoopKind::Serial,
    } = st
    else {
        return holds_vector(st);
    };
    // Prefer the deepest candidate: try the children first.
    let mut inner = false;
    for s in body {
        inner |= pick_vector(k, s, lanes, uses, out);
    }
    if inner {
        return true;
    }
    // A matrix-engine block runs as a whole, never in vector lanes.
    let Some(w) = width(*extent, lanes) else {
        return false;
    };
    if !mlopt_kir::analysis::has_mma(body) && stores_ok(k, *var, body, uses, &|c| c == Some(1)) {
        out.push((*var, w));
        return true;
    }
    false
}

/// What `pick_parallel` reads: the kernel, its target, its weight parameters and its buffers' uses.
#[derive(Clone, Copy)]
struct Nest<'a> {
    k: &'a Kernel,
    target: &'a CpuTarget,
    weights: &'a [BufId],
    uses: &'a HashMap<BufId, usize>,
    /// Store executions `distinct_for` may evaluate per verdict.
    budget: u64,
}

fn pick_parallel(n: &Nest, st: &Stmt, outer: &mut Vec<(Var, u64)>, out: &mut Vec<Var>) {
    let Stmt::For {
        var, extent, body, ..
    } = st
    else {
        return;
    };
    let (k, target) = (n.k, n.target);
    if !mlopt_cost::kernel::parallel_pays(target, work(st)) {
        return;
    }
    let threads = target.threads;
    // Threads write disjoint elements: every store moves with the loop, affinely or, through a layout
    // tail, as evaluation shows.
    let disjoint = |flat: &Expr, inner: &[(Var, u64)]| {
        coefficient(flat, *var).is_some_and(|c| c != 0)
            || mlopt_kir::analysis::moves_with(flat, *var, *extent)
            || mlopt_kir::analysis::distinct_for(flat, (*var, *extent), outer, inner, n.budget)
    };
    let splits = *extent >= threads as u64
        && stores_ok_in(k, body, n.uses, &disjoint, true)
        && !transposes(k, *var, body);
    // Threads get equal shares, or nearly (the busiest at most a seventh more than an even share: 7
    // column blocks on 2 threads, where splitting the loop inside instead forks and joins the threads
    // once per block).
    let (t, e) = (threads as u64, *extent);
    outer.push((*var, *extent));
    if splits && (e % t == 0 || e >= 8 * t || 7 * e.div_ceil(t) * t <= 8 * e) {
        // Split across a weight's output channels, a loop inside that splits too may cost the threads
        // less: the rows of a contraction whose column loop is outside them (`split_s`).
        let mut inner = Vec::new();
        let here = operands(n, st, *var);
        if here.iter().any(|o| o.weight && o.split) {
            // Alternatives get a smaller budget for proofs: one not proved cheaply stays unsplit.
            let n = Nest {
                budget: EXPLORE_BUDGET,
                ..*n
            };
            for s in body {
                pick_parallel(&n, s, outer, &mut inner);
            }
        }
        let cost = |ops: &[_], v: Var| mlopt_cost::kernel::split_s(target, ops, trips_to(st, v));
        // Only where the loops inside split nearly all of the work (not a depthwise convolution's
        // loop over groups, whose padded copies inside would then run on one thread).
        let covered: u64 = inner.iter().map(|&v| work_under(st, v)).sum();
        match inner.first() {
            Some(&v)
                if 10 * covered >= 9 * work(st)
                    && cost(&operands(n, st, v), v) < SPLIT_MARGIN * cost(&here, *var) =>
            {
                out.extend(inner)
            }
            _ => out.push(*var),
        }
        outer.pop();
        return;
    }
    // A short, uneven or unsplittable outer loop (batch 1; 5 column panels on 2 threads): look one
    // level in, at each nest it holds; an uneven loop with nothing inside to split is still split.
    let before = out.len();
    for inner in body {
        pick_parallel(n, inner, outer, out);
    }
    outer.pop();
    if splits && out.len() == before {
        out.push(*var);
    }
}

/// How much cheaper a split inside must be priced to be taken over the outer loop's: the estimate
/// ignores what the outer split keeps together (a grouped convolution's padded copies, a classifier's
/// column panels), and splits priced within a quarter measured both ways (RegNet's grouped 3x3
/// convolutions 24% slower split inside, SqueezeNet's 13x13 ones 5%).
const SPLIT_MARGIN: f64 = 0.75;

/// How many times nest `st` runs loop `v`: the product of the extents of the loops around it.
fn trips_to(st: &Stmt, v: Var) -> u64 {
    match st {
        Stmt::For { var, .. } if *var == v => 1,
        Stmt::For { extent, body, .. } => body
            .iter()
            .map(|s| extent.saturating_mul(trips_to(s, v)))
            .find(|&n| n > 0)
            .unwrap_or(0),
        Stmt::If { then, .. } => then
            .iter()
            .map(|s| trips_to(s, v))
            .find(|&n| n > 0)
            .unwrap_or(0),
        _ => 0,
    }
}

/// The loop-body executions nest `st` runs under its loop `v` (0 if it holds none).
fn work_under(st: &Stmt, v: Var) -> u64 {
    match st {
        Stmt::For { var, .. } if *var == v => work(st),
        Stmt::For { extent, body, .. } => body
            .iter()
            .map(|s| extent.saturating_mul(work_under(s, v)))
            .sum(),
        Stmt::If { then, .. } => then.iter().map(|s| work_under(s, v)).sum(),
        _ => 0,
    }
}

/// The buffers nest `st` reads or writes (not those private to it), as `split_s` prices them when
/// loop `v` is split: whole buffers, split where an index names `v`.
fn operands(n: &Nest, st: &Stmt, v: Var) -> Vec<mlopt_cost::kernel::SplitOperand> {
    let body = std::slice::from_ref(st);
    let private = private_in(n.k, body, n.uses);
    let mut split: HashMap<BufId, bool> = HashMap::new();
    mlopt_kir::analysis::for_each_index(body, &mut |b, index| {
        *split.entry(b).or_default() |= index.iter().any(|x| x.uses(v));
    });
    let written = mlopt_kir::analysis::stored(body);
    split
        .into_iter()
        .filter(|(b, _)| !private.contains(b))
        .map(|(b, split)| {
            let buf = &n.k.bufs[b.0 as usize];
            mlopt_cost::kernel::SplitOperand {
                bytes: buf.dims.iter().product::<u64>() * buf.elem.size(),
                split,
                weight: n.weights.contains(&b),
                written: written.contains(&b),
            }
        })
        .collect()
}

/// Whether loop `q`'s `body` is a copy that code generation runs as transposed blocks of steps
/// (`mlopt-llvm/src/transpose.rs`): one loop whose one store reads an operand whose elements lie far
/// apart along that loop (a channel plane: the vector lanes) and close together along `q`. Split
/// between threads, each step of `q` is a gather per lane instead: the channels-innermost copies of
/// bf16 blocks ran 20-30% slower on 2 threads than on 1 (DenseNet-121's 14x14 pointwise
/// convolutions), so the loop stays whole.
fn transposes(k: &Kernel, q: Var, body: &[Stmt]) -> bool {
    let [Stmt::For {
        var: lane,
        body: inner,
        ..
    }] = body
    else {
        return false;
    };
    let [Stmt::Store { value, .. }] = &inner[..] else {
        return false;
    };
    mlopt_kir::analysis::transposed_operand(k, value, *lane, q).is_some()
}

/// Loop-body executions in a nest (a matrix-engine block counts its multiply-adds / 16, about what a
/// vector loop would execute for it).
fn work(st: &Stmt) -> u64 {
    match st {
        Stmt::For { extent, body, .. } => {
            extent.saturating_mul(body.iter().map(work).sum::<u64>().max(1))
        }
        Stmt::If { then, .. } => then.iter().map(work).sum(),
        Stmt::Mma { m, n, k, .. } => (m * n * k / 16).max(1),
        _ => 1,
    }
}

// The parallel loop each thread count picks is held by tests/filetests/schedule/parallel_*.kir.
