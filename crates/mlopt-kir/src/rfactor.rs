//! Halide's `rfactor` on the kernel IR: a serial f32 fold into a scalar local,
//!
//! ```text
//! %acc[] = init
//! serial %r in 0..e { %acc[] = op(%acc[], v(%r)) }        ; op: add, max, min; or fma(x, y, %acc[])
//! ```
//!
//! runs with one partial result per vector lane, in u vectors of w lanes (u = 4 where the loop has eight
//! vectors or more, so four independent chains hide the operation's latency; else 1), which are then
//! combined:
//!
//! ```text
//! vector<w> %r.z in 0..uw { %acc.part[%r.z] = init }
//! serial %r.o in 0..e/uw { vector<w> %r.l in 0..uw { %acc.part[%r.l] = op(%acc.part[%r.l], v(%r.o * uw + %r.l)) } }
//! serial %r.v in 0..(e % uw)/w { vector<w> %r.m in 0..w { %acc.part[%r.m] = op(.., v(e/uw * uw + %r.v * w + %r.m)) } }
//! vector<uw/2> %r.h in 0..uw/2 { %acc.part[%r.h] = op(%acc.part[%r.h], %acc.part[%r.h + uw/2]) }   ; halves, down to 4
//! %acc[] = init
//! serial %r.q in 0..4 { %acc[] = op(%acc[], %acc.part[%r.q]) }
//! serial %r.t in 0..e % w { %acc[] = op(%acc[], v(e/w * w + %r.t)) }                      ; the rest, in order
//! ```
//!
//! (The `%r.v` loop, the whole vectors past the last group of u, is there only when there are some.)
//!
//! The terms are the same; their order changes (a sum is rounded differently, as any vectorised sum is).
//! Each partial starts at `init`, so the fold must not count it twice: `init` is 0 for a sum, and any
//! constant for max and min, which ignore repeats.

use crate::ir::*;
use crate::step::ScheduleStep;

/// Independent vectors of partial results where the loop is long enough for them: the latency of an
/// add or max (2-4 cycles) times the 2 a cycle a core can start.
const CHAINS: u64 = 4;

/// Rewrites every such fold of `k` whose loop runs at least `lanes` times, records an `rfactor` step for
/// each, and returns how many it rewrote.
pub fn rfactor(k: &mut Kernel, lanes: u32) -> usize {
    let body = std::mem::take(&mut k.body);
    let mut count = 0;
    k.body = walk(k, body, u64::from(lanes), &mut count);
    count
}

fn walk(k: &mut Kernel, body: Vec<Stmt>, w: u64, count: &mut usize) -> Vec<Stmt> {
    let mut out: Vec<Stmt> = Vec::with_capacity(body.len());
    for s in body {
        let s = match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => Stmt::For {
                var,
                extent,
                kind,
                body: walk(k, body, w, count),
            },
            Stmt::If { cond, then } => Stmt::If {
                cond,
                then: walk(k, then, w, count),
            },
            other => other,
        };
        if let Some(fold) = out.last().and_then(|init| Fold::of(k, init, &s, w)) {
            out.pop();
            out.extend(fold.rewrite(k, w));
            *count += 1;
        } else {
            out.push(s);
        }
    }
    out
}

/// A fold the rewrite applies to.
struct Fold {
    acc: BufId,
    init: Expr,
    r: Var,
    extent: u64,
    /// How partial results combine.
    op: BinOp,
    /// The loop body's value, reading `acc` once as the running result.
    update: Expr,
}

impl Fold {
    fn of(k: &Kernel, init: &Stmt, the_loop: &Stmt, w: u64) -> Option<Fold> {
        let Stmt::Store {
            buf: acc,
            index,
            value: init,
        } = init
        else {
            return None;
        };
        let Stmt::For {
            var: r,
            extent,
            kind: LoopKind::Serial,
            body,
        } = the_loop
        else {
            return None;
        };
        let buf = k.buffer(*acc);
        if !index.is_empty()
            || !buf.dims.is_empty()
            || buf.space != Space::Local
            || buf.elem != Elem::F32
            || *extent < w
            || w < 2
        {
            return None;
        }
        let [Stmt::Store {
            buf: b,
            index,
            value: update,
        }] = body.as_slice()
        else {
            return None;
        };
        let running = Expr::load(*acc, vec![]);
        let reads_acc = |e: &Expr| crate::analysis::expr_loads(e).contains_key(acc);
        let op = match update {
            Expr::Binary(op @ (BinOp::Add | BinOp::Max | BinOp::Min), x, v)
                if (**x == running && !reads_acc(v)) || (**v == running && !reads_acc(x)) =>
            {
                *op
            }
            Expr::Fma(x, y, c) if **c == running && !reads_acc(x) && !reads_acc(y) => BinOp::Add,
            _ => return None,
        };
        let Expr::Float(at, _) = init else {
            return None;
        };
        if b != acc || !index.is_empty() || (op == BinOp::Add && *at != 0.0) {
            return None;
        }
        Some(Fold {
            acc: *acc,
            init: init.clone(),
            r: *r,
            extent: *extent,
            op,
            update: update.clone(),
        })
    }

    fn rewrite(self, k: &mut Kernel, w: u64) -> Vec<Stmt> {
        let name = k.var_name(self.r).to_string();
        let acc_name = k.buffer(self.acc).name.clone();
        let uw = if self.extent >= 2 * CHAINS * w {
            CHAINS * w
        } else {
            w
        };
        let part = k.buf(
            format!("{acc_name}.part"),
            Elem::F32,
            vec![uw],
            Space::Local,
        );
        let [z, o, l, v, m, q, t] =
            ["z", "o", "l", "v", "m", "q", "t"].map(|s| k.var(format!("{name}.{s}")));
        let lane = |v: Var| vec![Expr::var(v)];
        let vector = |n: u64| LoopKind::Vector(n as u32);
        // The update of element `r` with `acc` read from (and so folded into) lane `l`'s partial.
        let per_lane = |r: Expr, l: Var| {
            self.update.subst(self.r, &r).map_loads(&|b, ix| {
                if b == self.acc {
                    Expr::load(part, lane(l))
                } else {
                    Expr::load(b, ix)
                }
            })
        };
        let at = |base: u64, o: Var, step: u64, l: Var| {
            Expr::add(
                Expr::add(
                    Expr::int(base as i64),
                    Expr::mul(Expr::var(o), Expr::int(step as i64)),
                ),
                Expr::var(l),
            )
        };
        let rest = self.update.subst(
            self.r,
            &Expr::add(Expr::int((self.extent / w * w) as i64), Expr::var(t)),
        );
        let fold = |o: Var, groups: u64, l: Var, width: u64, base: u64| Stmt::For {
            var: o,
            extent: groups,
            kind: LoopKind::Serial,
            body: vec![Stmt::For {
                var: l,
                extent: width,
                kind: vector(w),
                body: vec![Stmt::Store {
                    buf: part,
                    index: lane(l),
                    value: per_lane(at(base, o, width, l), l),
                }],
            }],
        };
        let mut out = vec![
            Stmt::For {
                var: z,
                extent: uw,
                kind: vector(w),
                body: vec![Stmt::Store {
                    buf: part,
                    index: lane(z),
                    value: self.init.clone(),
                }],
            },
            fold(o, self.extent / uw, l, uw, 0),
        ];
        let vectors_left = self.extent % uw / w;
        if vectors_left > 0 {
            out.push(fold(v, vectors_left, m, w, self.extent / uw * uw));
        }
        // The partials are folded by halves in vector lanes down to 4, then those one at a time: a
        // log-depth tree instead of uw dependent scalar steps.
        let mut width = uw;
        while width >= 8 && width.is_multiple_of(2) {
            let (h, half) = (k.var(format!("{name}.h{width}")), width / 2);
            let upper = Expr::load(part, vec![Expr::add(Expr::var(h), Expr::int(half as i64))]);
            let value = Expr::bin(self.op, Expr::load(part, lane(h)), upper);
            out.push(Stmt::For {
                var: h,
                extent: half,
                kind: vector(half.min(w)),
                body: vec![Stmt::Store {
                    buf: part,
                    index: lane(h),
                    value,
                }],
            });
            width = half;
        }
        let running = Expr::load(self.acc, vec![]);
        out.push(Stmt::Store {
            buf: self.acc,
            index: vec![],
            value: self.init,
        });
        out.push(Stmt::For {
            var: q,
            extent: width,
            kind: LoopKind::Serial,
            body: vec![Stmt::Store {
                buf: self.acc,
                index: vec![],
                value: Expr::bin(self.op, running, Expr::load(part, lane(q))),
            }],
        });
        if !self.extent.is_multiple_of(w) {
            out.push(Stmt::For {
                var: t,
                extent: self.extent % w,
                kind: LoopKind::Serial,
                body: vec![Stmt::Store {
                    buf: self.acc,
                    index: vec![],
                    value: rest,
                }],
            });
        }
        k.schedule.push(ScheduleStep::Rfactor {
            var: name,
            lanes: w as u32,
        });
        out
    }
}
