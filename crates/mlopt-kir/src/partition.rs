//! Loop partitioning (Halide's `partition`, also "index-set splitting"): a serial loop whose body tests
//! its variable against constants, as a concatenation does (`select(lt(%c, 256), %in0[..], select(lt(%c,
//! 288), %in1[..], ..))`), runs as one loop per range in which every such test has one answer, and in
//! each the tests fold away. Vector code evaluates both sides of a select, so a concat of 25 inputs
//! loaded 25 values per element; partitioned, each piece loads one, contiguously, and its clamps go too.
//!
//! A test `lt(e, C)` splits loop `v` at P when `e` is `a * v + rest` and, over the ranges of the loops
//! around and inside it, the test is true for every iteration below P and false for every one from P
//! (`lt(%ro * 16 + %rl, 96)` with `%rl` in 0..16 splits `%ro` at 6). Tests that are not uniform on
//! either side of a point leave the loop whole.

use crate::ir::*;
use crate::simplify::{build, interval, simplify_binary, terms};
use crate::step::ScheduleStep;
use std::collections::HashMap;

/// At most this many pieces per loop (a concat's inputs); more would grow the code past what it saves.
const MAX_PIECES: usize = 64;

/// Partitions every serial loop of `k` at the points where the tests in its body change answer (outer
/// loops first, then the loops inside each piece), records a `partition` step for each, and folds the
/// decided tests, selects and clamps in every piece.
pub fn partition(k: &mut Kernel) {
    let body = std::mem::take(&mut k.body);
    k.body = walk(k, body, &HashMap::new());
}

fn walk(k: &mut Kernel, body: Vec<Stmt>, ranges: &HashMap<Var, u64>) -> Vec<Stmt> {
    let mut out = Vec::new();
    for s in body {
        match s {
            Stmt::For {
                var,
                extent,
                kind: LoopKind::Serial,
                body,
            } => {
                let mut inner = ranges.clone();
                inner.insert(var, extent);
                let all = with_inner(&body, &inner);
                // (Not around register tiles or matrix blocks: their bodies are large, and their
                // tests, a padded window's, are few per tile.)
                let points = if holds_tiles(&body) {
                    vec![]
                } else {
                    split_points(&body, var, extent, &all)
                };
                if points.is_empty() {
                    let body = walk(k, body, &inner);
                    out.push(Stmt::For {
                        var,
                        extent,
                        kind: LoopKind::Serial,
                        body,
                    });
                    continue;
                }
                let name = k.var_name(var).to_string();
                k.schedule.push(ScheduleStep::Partition {
                    var: name.clone(),
                    at: points.clone(),
                });
                let mut bounds = vec![0];
                bounds.extend(&points);
                bounds.push(extent);
                for w in bounds.windows(2) {
                    let (from, len) = (w[0], w[1] - w[0]);
                    let nv = k.var(format!("{name}.{from}"));
                    let at = Expr::add(Expr::var(nv), Expr::int(from as i64));
                    let piece: Vec<Stmt> = body.iter().map(|s| s.subst(var, &at)).collect();
                    let piece = fresh(k, piece, &format!(".{from}"));
                    let mut scope = ranges.clone();
                    scope.insert(nv, len);
                    let folded = fold_stmts(&piece, &with_inner(&piece, &scope));
                    let piece = walk(k, folded, &scope);
                    out.push(Stmt::For {
                        var: nv,
                        extent: len,
                        kind: LoopKind::Serial,
                        body: piece,
                    });
                }
            }
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let mut inner = ranges.clone();
                inner.insert(var, extent);
                let body = walk(k, body, &inner);
                out.push(Stmt::For {
                    var,
                    extent,
                    kind,
                    body,
                });
            }
            Stmt::If { cond, then } => {
                let then = walk(k, then, ranges);
                out.push(Stmt::If { cond, then });
            }
            s => out.push(s),
        }
    }
    out
}

/// Whether `body` holds unrolled loops (a register tile's sweeps) or matrix-engine blocks.
fn holds_tiles(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::For {
            kind: LoopKind::Unrolled,
            ..
        }
        | Stmt::Mma { .. } => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => holds_tiles(body),
        _ => false,
    })
}

/// `ranges` with the extents of the loops inside `body` added.
fn with_inner(body: &[Stmt], ranges: &HashMap<Var, u64>) -> HashMap<Var, u64> {
    let mut out = ranges.clone();
    crate::simplify::add_loop_extents(body, &mut out);
    out
}

/// The body with its loop variables (and the local buffers used only inside it) renamed apart, so
/// each piece's loops can be scheduled on their own.
fn fresh(k: &mut Kernel, body: Vec<Stmt>, suffix: &str) -> Vec<Stmt> {
    fn loops(k: &mut Kernel, body: Vec<Stmt>, suffix: &str) -> Vec<Stmt> {
        body.into_iter()
            .map(|s| match s {
                Stmt::For {
                    var,
                    extent,
                    kind,
                    body,
                } => {
                    let nv = k.var(format!("{}{suffix}", k.var_name(var)));
                    let body: Vec<Stmt> =
                        body.iter().map(|s| s.subst(var, &Expr::var(nv))).collect();
                    Stmt::For {
                        var: nv,
                        extent,
                        kind,
                        body: loops(k, body, suffix),
                    }
                }
                Stmt::If { cond, then } => Stmt::If {
                    cond,
                    then: loops(k, then, suffix),
                },
                s => s,
            })
            .collect()
    }
    let mut body = loops(k, body, suffix);
    for b in crate::analysis::private_locals(k, &body) {
        let old = k.buffer(b).clone();
        let copy = k.buf(
            format!("{}{suffix}", old.name),
            old.elem,
            old.dims.clone(),
            old.space,
        );
        body = body
            .iter()
            .map(|s| crate::sched::rename(s, b, copy))
            .collect();
    }
    body
}

/// The points in 1..extent where a test in `body` changes answer for loop `v`, sorted; none when there
/// are more than `MAX_PIECES` pieces.
fn split_points(body: &[Stmt], v: Var, extent: u64, ranges: &HashMap<Var, u64>) -> Vec<u64> {
    let mut tests = Vec::new();
    visit(body, &mut |e| {
        collect_tests(e, &mut |t| tests.push(t.clone()))
    });
    let mut points: Vec<u64> = tests
        .iter()
        .filter_map(|t| flip(t, v, ranges))
        .filter(|p| *p > 0 && *p < extent)
        .collect();
    points.sort_unstable();
    points.dedup();
    if points.len() + 1 > MAX_PIECES {
        return vec![];
    }
    points
}

/// Calls `f` on every expression of `body` (store values and indices, guards).
fn visit(body: &[Stmt], f: &mut dyn FnMut(&Expr)) {
    for s in body {
        match s {
            Stmt::For { body, .. } => visit(body, f),
            Stmt::If { cond, then } => {
                f(cond);
                visit(then, f);
            }
            Stmt::Store { index, value, .. } => {
                index.iter().for_each(&mut *f);
                f(value);
            }
            _ => {}
        }
    }
}

/// The comparisons a select or guard decides on, within `e`.
fn collect_tests(e: &Expr, f: &mut dyn FnMut(&Expr)) {
    match e {
        Expr::Select(c, a, b) => {
            conditions(c, f);
            collect_tests(c, f);
            collect_tests(a, f);
            collect_tests(b, f);
        }
        Expr::Binary(_, a, b) => {
            collect_tests(a, f);
            collect_tests(b, f);
        }
        Expr::Unary(_, a) | Expr::Cast(_, a) => collect_tests(a, f),
        Expr::Fma(a, b, c) => {
            collect_tests(a, f);
            collect_tests(b, f);
            collect_tests(c, f);
        }
        Expr::Load(_, ix) => ix.iter().for_each(|x| collect_tests(x, f)),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => {}
    }
}

/// The comparisons of a condition (through `and` and `or`).
fn conditions(c: &Expr, f: &mut dyn FnMut(&Expr)) {
    match c {
        Expr::Binary(BinOp::And | BinOp::Or, a, b) => {
            conditions(a, f);
            conditions(b, f);
        }
        Expr::Binary(BinOp::Lt | BinOp::Le, ..) => f(c),
        _ => {}
    }
}

/// The point P where test `t` (`lt` or `le`) flips for loop `v`: the same answer for every iteration
/// below P and the other for every one from P, over `ranges` (the other variables' full ranges).
fn flip(t: &Expr, v: Var, ranges: &HashMap<Var, u64>) -> Option<u64> {
    let Expr::Binary(op, a, b) = t else {
        return None;
    };
    // a < b  <=>  a - b < 0;  a <= b  <=>  a - b - 1 < 0.
    let (mut ts, mut constant) = (Vec::new(), 0i64);
    terms(a, 1, &mut ts, &mut constant)?;
    terms(b, -1, &mut ts, &mut constant)?;
    if *op == BinOp::Le {
        constant = constant.checked_sub(1)?;
    }
    let at = ts.iter().position(|(x, _)| *x == Expr::Var(v))?;
    let (_, c) = ts.remove(at);
    if c == 0 || ts.iter().any(|(x, _)| x.uses(v)) {
        return None;
    }
    let (lo, hi) = interval(&build(&ts, constant), ranges)?;
    // c * v + rest < 0 for rest in lo..=hi.
    let p = if c > 0 {
        // True for every rest when c v < -hi, false for every rest when c v >= -lo.
        let (t, f) = (
            ceil_div(hi.checked_neg()?, c),
            ceil_div(lo.checked_neg()?, c),
        );
        (t == f).then_some(t)?
    } else {
        // With c = -d: true for every rest when d v > hi, false for every rest when d v <= lo.
        let d = c.checked_neg()?;
        let (f, t) = (lo.div_euclid(d) + 1, hi.div_euclid(d) + 1);
        (t == f).then_some(t)?
    };
    u64::try_from(p).ok()
}

fn ceil_div(x: i64, d: i64) -> i64 {
    -((-x).div_euclid(d))
}

/// The value of a test when the ranges decide it.
fn decide(c: &Expr, r: &HashMap<Var, u64>) -> Option<bool> {
    match c {
        Expr::Binary(op @ (BinOp::Lt | BinOp::Le), a, b) => {
            let ((al, ah), (bl, bh)) = (interval(a, r)?, interval(b, r)?);
            let strict = *op == BinOp::Lt;
            if (strict && ah < bl) || (!strict && ah <= bl) {
                Some(true)
            } else if (strict && al >= bh) || (!strict && al > bh) {
                Some(false)
            } else {
                None
            }
        }
        Expr::Binary(BinOp::And, a, b) => match (decide(a, r), decide(b, r)) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        },
        Expr::Binary(BinOp::Or, a, b) => match (decide(a, r), decide(b, r)) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), Some(false)) => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// `e` with the selects whose test the ranges decide replaced by their branch, and clamps (`min`,
/// `max` against a bound the range already keeps) dropped; then the index arithmetic simplified.
fn fold(e: &Expr, r: &HashMap<Var, u64>) -> Expr {
    match e {
        Expr::Select(c, a, b) => match decide(c, r) {
            Some(true) => fold(a, r),
            Some(false) => fold(b, r),
            None => Expr::select(fold(c, r), fold(a, r), fold(b, r)),
        },
        Expr::Binary(op @ (BinOp::Min | BinOp::Max), a, b) => {
            let (a, b) = (fold(a, r), fold(b, r));
            if let (Some((al, ah)), Some((bl, bh))) = (interval(&a, r), interval(&b, r)) {
                match op {
                    BinOp::Min if ah <= bl => return a,
                    BinOp::Min if bh <= al => return b,
                    BinOp::Max if al >= bh => return a,
                    BinOp::Max if bl >= ah => return b,
                    _ => {}
                }
            }
            simplify_binary(*op, a, b, r)
        }
        // (Each node is simplified once, its operands already folded and simplified.)
        Expr::Binary(op, a, b) => simplify_binary(*op, fold(a, r), fold(b, r), r),
        Expr::Load(buf, ix) => Expr::Load(*buf, ix.iter().map(|x| index(x, r)).collect()),
        Expr::Unary(o, a) => Expr::un(*o, fold(a, r)),
        Expr::Cast(t, a) => Expr::cast(*t, fold(a, r)),
        Expr::Fma(a, b, c) => Expr::fma(fold(a, r), fold(b, r), fold(c, r)),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => e.clone(),
    }
}

/// An index folded, then summed term by term (a piece's `(%c.256 + 256) - 256` is `%c.256`).
fn index(e: &Expr, r: &HashMap<Var, u64>) -> Expr {
    let e = fold(e, r);
    let (mut ts, mut constant) = (Vec::new(), 0i64);
    match terms(&e, 1, &mut ts, &mut constant) {
        Some(()) => build(&ts, constant),
        None => e,
    }
}

/// Every expression of `body` folded under `r` (the ranges of all loops in and around it); guards the
/// ranges decide are dropped or inlined.
fn fold_stmts(body: &[Stmt], r: &HashMap<Var, u64>) -> Vec<Stmt> {
    let mut out = Vec::new();
    for s in body {
        match s {
            Stmt::If { cond, then } => match decide(cond, r) {
                Some(true) => out.extend(fold_stmts(then, r)),
                Some(false) => {}
                None => out.push(Stmt::If {
                    cond: fold(cond, r),
                    then: fold_stmts(then, r),
                }),
            },
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => out.push(Stmt::For {
                var: *var,
                extent: *extent,
                kind: *kind,
                body: fold_stmts(body, r),
            }),
            Stmt::Store {
                buf,
                index: ix,
                value,
            } => out.push(Stmt::Store {
                buf: *buf,
                index: ix.iter().map(|x| index(x, r)).collect(),
                value: fold(value, r),
            }),
            s => out.push(s.map_exprs(&|e| fold(e, r))),
        }
    }
    out
}
