//! Cooperative rows: a launch whose body is a row computation with reductions (softmax, layer norm, a
//! reduction over a long axis) computes one row per block, each reduction folded by all the block's
//! threads and combined by warp shuffles, the row's buffers in shared memory.

use super::*;

/// One statement of a cooperative row.
enum RowStep {
    /// `%s[..] = e` on a row scalar: thread 0 computes it.
    Scalar(Stmt),
    /// A fold of one accumulator element.
    Fold(Fold),
    /// Loops (outermost first) whose every iteration writes its own elements: shared among the threads.
    Map {
        loops: Vec<(Var, u64)>,
        body: Vec<Stmt>,
    },
}

/// Loops (outermost first) folding one accumulator element.
struct Fold {
    loops: Vec<(Var, u64)>,
    /// The update statement, the accumulator, how partials combine, and the combine's identity.
    update: Stmt,
    acc: (BufId, Vec<Expr>),
    combine: BinOp,
    identity: Expr,
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
                        steps.push(RowStep::Fold(Fold {
                            loops,
                            update: update.clone(),
                            acc,
                            combine,
                            identity,
                        }));
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
        .any(|s| matches!(s, RowStep::Fold(_)))
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
        | Stmt::Prefetch { .. }
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
pub(super) fn cooperative(
    k: &mut Kernel,
    prefix: &[(Var, u64)],
    body: &[Stmt],
) -> Result<Option<Vec<Stmt>>> {
    let uses = buffer_uses(body);
    let Some(steps) = row_steps(k, body, &uses) else {
        return Ok(None);
    };
    let longest = steps
        .iter()
        .map(|st| match st {
            RowStep::Fold(Fold { loops, .. }) | RowStep::Map { loops, .. } => {
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
    let shared = shared_buffers(k, &steps, &uses);
    let folds = steps
        .iter()
        .filter(|s| matches!(s, RowStep::Fold(_)))
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
    let mut w = RowWriter {
        threads,
        at_row: delinear(prefix, &Expr::var(gb)),
        out: Vec::new(),
    };
    for (i, st) in steps.iter().enumerate() {
        match st {
            RowStep::Scalar(x) => {
                let x = subst_all(std::slice::from_ref(x), &w.at_row);
                let s = w.thread_loop(k, &mut |_, t| vec![first(t, x.clone())]);
                w.out.push(s);
            }
            RowStep::Map { loops, body } => {
                let body = subst_all(body, &w.at_row);
                let s = w.thread_loop(k, &mut |k, t| vec![strided(k, t, threads, loops, &body)]);
                w.out.push(s);
            }
            RowStep::Fold(f) => w.fold(k, i, f),
        }
        w.out.push(Stmt::Barrier);
    }
    w.out.pop();
    k.schedule
        .push(mlopt_kir::ScheduleStep::GpuRows { rows, threads });
    Ok(Some(vec![Stmt::for_(
        gb,
        rows.max(1),
        LoopKind::GpuBlock(0),
        w.out,
    )]))
}

/// The row's locals that live in shared memory: those touched by more than one step, accumulators
/// and row scalars.
fn shared_buffers(k: &Kernel, steps: &[RowStep], uses: &HashMap<BufId, usize>) -> HashSet<BufId> {
    let mut shared: HashSet<BufId> = HashSet::new();
    for st in steps {
        let here = match st {
            RowStep::Scalar(x) | RowStep::Fold(Fold { update: x, .. }) => {
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
            RowStep::Fold(Fold { acc, .. }) => {
                shared.insert(acc.0);
            }
            RowStep::Scalar(Stmt::Store { buf, .. }) if k.buffer(*buf).space == Space::Local => {
                shared.insert(*buf);
            }
            _ => {}
        }
    }
    shared
}

/// `if t == 0 { s }`.
fn first(t: Var, s: Vec<Stmt>) -> Stmt {
    Stmt::If {
        cond: Expr::bin(BinOp::Eq, Expr::var(t), Expr::int(0)),
        then: s,
    }
}

/// A block's statements for one row, as they are written.
struct RowWriter {
    threads: u64,
    /// The row's loops at the block's index.
    at_row: Vec<(Var, Expr)>,
    out: Vec<Stmt>,
}

impl RowWriter {
    fn thread_loop(
        &self,
        k: &mut Kernel,
        f: &mut dyn FnMut(&mut Kernel, Var) -> Vec<Stmt>,
    ) -> Stmt {
        let t = k.var(format!("t{}", k.vars.len()));
        let body = f(k, t);
        Stmt::for_(t, self.threads, LoopKind::GpuThread(0), body)
    }

    /// The `i`-th step, a fold: each thread folds its share into its partial, the partials are
    /// combined, and thread 0 folds the total into the accumulator.
    fn fold(&mut self, k: &mut Kernel, i: usize, f: &Fold) {
        let threads = self.threads;
        let elem = k.buffer(f.acc.0).elem;
        let part = k.buf(format!("part{i}"), elem, vec![], Space::Local);
        let mine = Expr::load(part, vec![]);
        let Stmt::Store { value, .. } = &f.update else {
            return;
        };
        let value = value.map_loads(&|b, ix| {
            if b == f.acc.0 && ix == f.acc.1 {
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
        let step = subst_all(std::slice::from_ref(&step), &self.at_row);
        let partials = |k: &mut Kernel, t: Var, then: Vec<Stmt>| {
            let mut body = vec![
                Stmt::Store {
                    buf: part,
                    index: vec![],
                    value: f.identity.clone(),
                },
                strided(k, t, threads, &f.loops, &step),
            ];
            body.extend(then);
            body
        };
        // Warp shuffles where they apply (whole warps, a 32-bit type, an associative combine): each
        // warp reduces its partials, the warps' sums meet in shared memory, and the first warp
        // reduces those. Otherwise a tree in shared memory, one barrier a level.
        let shuffles = threads.is_multiple_of(32)
            && matches!(elem, Elem::F32 | Elem::I32)
            && matches!(f.combine, BinOp::Add | BinOp::Mul | BinOp::Min | BinOp::Max);
        let total = if shuffles {
            let s = self.thread_loop(k, &mut |k, t| partials(k, t, vec![]));
            self.out.push(s);
            self.shuffle(k, i, f, part);
            mine.clone()
        } else {
            let tree = k.buf(format!("tree{i}"), elem, vec![threads], Space::Shared);
            let s = self.thread_loop(k, &mut |k, t| {
                let index = vec![Expr::var(t)];
                partials(
                    k,
                    t,
                    vec![Stmt::Store {
                        buf: tree,
                        index,
                        value: mine.clone(),
                    }],
                )
            });
            self.out.push(s);
            self.tree(k, tree, f.combine);
            Expr::load(tree, vec![Expr::int(0)])
        };
        let total = Expr::bin(f.combine, Expr::Load(f.acc.0, f.acc.1.clone()), total);
        let fin = Stmt::Store {
            buf: f.acc.0,
            index: f.acc.1.clone(),
            value: total,
        };
        let s = self.thread_loop(k, &mut |_, t| vec![first(t, vec![fin.clone()])]);
        self.out.push(s);
    }

    /// Every thread's partial in `part` combined into every thread's `part`: within warps by
    /// shuffles, then the warps' sums through shared memory and a shuffle of the first warp.
    fn shuffle(&mut self, k: &mut Kernel, i: usize, f: &Fold, part: BufId) {
        self.out.push(Stmt::WarpReduce {
            buf: part,
            op: f.combine,
        });
        let warps = self.threads / 32;
        if warps == 1 {
            return;
        }
        let elem = k.buffer(part).elem;
        let sums = k.buf(format!("warps{i}"), elem, vec![warps], Space::Shared);
        let s = self.thread_loop(k, &mut |_, t| {
            let lane0 = Expr::bin(
                BinOp::Eq,
                Expr::rem(Expr::var(t), Expr::int(32)),
                Expr::int(0),
            );
            let index = vec![Expr::div(Expr::var(t), Expr::int(32))];
            let then = vec![Stmt::Store {
                buf: sums,
                index,
                value: Expr::load(part, vec![]),
            }];
            vec![Stmt::If { cond: lane0, then }]
        });
        self.out.push(s);
        self.out.push(Stmt::Barrier);
        let s = self.thread_loop(k, &mut |_, t| {
            let value = Expr::load(sums, vec![Expr::var(t)]);
            let theirs = Stmt::Store {
                buf: part,
                index: vec![],
                value,
            };
            vec![
                Stmt::Store {
                    buf: part,
                    index: vec![],
                    value: f.identity.clone(),
                },
                Stmt::If {
                    cond: lt(Expr::var(t), warps),
                    then: vec![theirs],
                },
            ]
        });
        self.out.push(s);
        self.out.push(Stmt::WarpReduce {
            buf: part,
            op: f.combine,
        });
    }

    /// The `threads` values of `tree` combined into its first, halving each level.
    fn tree(&mut self, k: &mut Kernel, tree: BufId, combine: BinOp) {
        let mut half = self.threads / 2;
        while half >= 1 {
            self.out.push(Stmt::Barrier);
            let s = self.thread_loop(k, &mut |_, t| {
                let a = Expr::load(tree, vec![Expr::var(t)]);
                let b = Expr::load(tree, vec![Expr::add(Expr::var(t), Expr::int(half as i64))]);
                let value = Expr::bin(combine, a, b);
                let then = vec![Stmt::Store {
                    buf: tree,
                    index: vec![Expr::var(t)],
                    value,
                }];
                vec![Stmt::If {
                    cond: lt(Expr::var(t), half),
                    then,
                }]
            });
            self.out.push(s);
            half /= 2;
        }
        self.out.push(Stmt::Barrier);
    }
}
