//! Halide's `rfactor` on the kernel IR: a serial f32 fold into a scalar local,
//!
//! ```text
//! %acc[] = init
//! serial %r in 0..e { %acc[] = op(%acc[], v(%r)) }        ; op: add, max, min; or fma(x, y, %acc[])
//! ```
//!
//! runs with one partial result per vector lane, which are then combined:
//!
//! ```text
//! vector<w> %r.z in 0..w { %acc.part[%r.z] = init }
//! serial %r.o in 0..e/w { vector<w> %r.l in 0..w { %acc.part[%r.l] = op(%acc.part[%r.l], v(%r.o * w + %r.l)) } }
//! vector<w/2> %r.h in 0..w/2 { %acc.part[%r.h] = op(%acc.part[%r.h], %acc.part[%r.h + w/2]) }   ; halves, down to 4
//! %acc[] = init
//! serial %r.q in 0..4 { %acc[] = op(%acc[], %acc.part[%r.q]) }
//! serial %r.t in 0..e % w { %acc[] = op(%acc[], v(e/w * w + %r.t)) }                      ; the rest, in order
//! ```
//!
//! The terms are the same; their order changes (a sum is rounded differently, as any vectorised sum is).
//! Each partial starts at `init`, so the fold must not count it twice: `init` is 0 for a sum, and any
//! constant for max and min, which ignore repeats.

use crate::ir::*;
use crate::step::ScheduleStep;

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
        let part = k.buf(format!("{acc_name}.part"), Elem::F32, vec![w], Space::Local);
        let [z, o, l, q, t] = ["z", "o", "l", "q", "t"].map(|s| k.var(format!("{name}.{s}")));
        let lane = |v: Var| vec![Expr::var(v)];
        let vector = |n: u64| LoopKind::Vector(n as u32);
        // The update with `acc` read from (and so folded into) lane `l`'s partial.
        let r = Expr::add(Expr::mul(Expr::var(o), Expr::int(w as i64)), Expr::var(l));
        let per_lane = self.update.subst(self.r, &r).map_loads(&|b, ix| {
            if b == self.acc {
                Expr::load(part, lane(l))
            } else {
                Expr::load(b, ix)
            }
        });
        let rest = self.update.subst(
            self.r,
            &Expr::add(Expr::int((self.extent / w * w) as i64), Expr::var(t)),
        );
        let mut out = vec![
            Stmt::For {
                var: z,
                extent: w,
                kind: vector(w),
                body: vec![Stmt::Store {
                    buf: part,
                    index: lane(z),
                    value: self.init.clone(),
                }],
            },
            Stmt::For {
                var: o,
                extent: self.extent / w,
                kind: LoopKind::Serial,
                body: vec![Stmt::For {
                    var: l,
                    extent: w,
                    kind: vector(w),
                    body: vec![Stmt::Store {
                        buf: part,
                        index: lane(l),
                        value: per_lane,
                    }],
                }],
            },
        ];
        // The partials are folded by halves in vector lanes down to 4, then those one at a time: a
        // log-depth tree instead of w dependent scalar steps.
        let mut width = w;
        while width >= 8 && width.is_multiple_of(2) {
            let (h, half) = (k.var(format!("{name}.h{width}")), width / 2);
            let upper = Expr::load(part, vec![Expr::add(Expr::var(h), Expr::int(half as i64))]);
            let value = Expr::bin(self.op, Expr::load(part, lane(h)), upper);
            out.push(Stmt::For {
                var: h,
                extent: half,
                kind: vector(half),
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
