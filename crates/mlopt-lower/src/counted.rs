//! The ops whose output size depends on the data (NonZero, Compress, NonMaxSuppression), as the
//! interpreter computes them: one pass in order with a running count (a local scalar, so the loops
//! stay serial), each result stored at the count (under a guard that it is within the bound), the
//! count stored to the last output, then zeros after it.

use crate::elementwise::elem;
use crate::error::Result;
use crate::kernel::Lowerer;
use crate::nests::get;
use mlopt_ir::NodeId;
use mlopt_kir::index::lit;
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt};

fn and(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::And, a, b)
}

fn store(buf: BufId, index: Vec<Expr>, value: Expr) -> Stmt {
    Stmt::Store { buf, index, value }
}

/// A local i64 scalar set to `init`.
fn scalar(l: &mut Lowerer, name: &str, t: Elem, init: Expr) -> (BufId, Stmt) {
    let b =
        l.k.buf(format!("{name}{}", l.k.bufs.len()), t, vec![], Space::Local);
    (b, store(b, vec![], init))
}

/// `e` within 0..n: the guard under which an index computed from data may be used.
fn within(e: &Expr, n: u64) -> Expr {
    and(
        Expr::bin(BinOp::Le, Expr::int(0), e.clone()),
        Expr::bin(BinOp::Lt, e.clone(), Expr::int(n as i64)),
    )
}

/// The count stored, then zeros in `dst` at every index whose `axis` entry is at the count or past it.
fn finish(
    l: &mut Lowerer,
    dst: BufId,
    dims: &[u64],
    axis: usize,
    count: BufId,
    count_dst: BufId,
) -> Result<Vec<Stmt>> {
    let t = l.k.bufs[dst.0 as usize].elem;
    let mut s = vec![store(count_dst, vec![], Expr::load(count, vec![]))];
    s.extend(l.nest("z", dims, |_, ix| {
        Ok(vec![Stmt::If {
            cond: Expr::bin(BinOp::Le, Expr::load(count, vec![]), ix[axis].clone()),
            then: vec![store(dst, ix.to_vec(), lit(0.0, t))],
        }])
    })?);
    Ok(s)
}

/// NonZero: column `count` of the output gets each nonzero element's index.
pub(crate) fn non_zero(l: &mut Lowerer, n: NodeId, dsts: &[BufId]) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let shape: Vec<u64> = l.ty(x).shape.iter().map(|&d| d as u64).collect();
    let numel: u64 = shape.iter().product();
    let (dst, count_dst) = (dsts[0], dsts[1]);
    let (count, init) = scalar(l, "count", Elem::I64, Expr::int(0));
    let mut s = vec![init];
    s.extend(l.nest("i", &shape, |l, ix| {
        let v = get(l, x, ix, Elem::F64)?;
        let at = Expr::load(count, vec![]);
        let mut then: Vec<Stmt> = ix
            .iter()
            .enumerate()
            .map(|(d, i)| store(dst, vec![Expr::int(d as i64), at.clone()], i.clone()))
            .collect();
        then.push(store(
            count,
            vec![],
            Expr::bin(BinOp::Add, at.clone(), Expr::int(1)),
        ));
        Ok(vec![Stmt::If {
            cond: and(
                Expr::bin(BinOp::Ne, v, lit(0.0, Elem::F64)),
                within(&at, numel),
            ),
            then,
        }])
    })?);
    s.extend(finish(
        l,
        dst,
        &[shape.len() as u64, numel],
        1,
        count,
        count_dst,
    )?);
    Ok(s)
}

/// Compress: slice `i` along the axis goes to slice `count` where the condition holds.
pub(crate) fn compress(
    l: &mut Lowerer,
    n: NodeId,
    axis: usize,
    dsts: &[BufId],
) -> Result<Vec<Stmt>> {
    let (x, cond) = (l.input(n, 0)?, l.input(n, 1)?);
    let t = elem(l.ty(x).dtype);
    let out: Vec<u64> = l.g.node(n).outputs[0]
        .shape
        .iter()
        .map(|&d| d as u64)
        .collect();
    let bound = out[axis];
    let (before, after) = (out[..axis].to_vec(), out[axis + 1..].to_vec());
    let (dst, count_dst) = (dsts[0], dsts[1]);
    let (count, init) = scalar(l, "count", Elem::I64, Expr::int(0));
    let mut s = vec![init];
    s.extend(l.nest("i", &[bound], |l, i| {
        let c = get(l, cond, &[i[0].clone()], Elem::I64)?;
        let at = Expr::load(count, vec![]);
        let mut then = l.nest("o", &before, |l, o| {
            let (o, i, at) = (o.to_vec(), i[0].clone(), at.clone());
            l.nest("r", &after, |l, r| {
                let from: Vec<Expr> = o
                    .iter()
                    .cloned()
                    .chain([i])
                    .chain(r.iter().cloned())
                    .collect();
                let to: Vec<Expr> = o
                    .iter()
                    .cloned()
                    .chain([at])
                    .chain(r.iter().cloned())
                    .collect();
                Ok(vec![store(dst, to, get(l, x, &from, t)?)])
            })
        })?;
        then.push(store(
            count,
            vec![],
            Expr::bin(BinOp::Add, at.clone(), Expr::int(1)),
        ));
        Ok(vec![Stmt::If {
            cond: and(Expr::bin(BinOp::Ne, c, Expr::int(0)), within(&at, bound)),
            then,
        }])
    })?);
    s.extend(finish(l, dst, &out, axis, count, count_dst)?);
    Ok(s)
}

/// (x min, x max, y min, y max) of a box's four coordinates, as the ONNX reference computes them.
fn span(b: [Expr; 4], center: bool) -> [Expr; 4] {
    let f = |op, a: &Expr, c: &Expr| Expr::bin(op, a.clone(), c.clone());
    if center {
        let half = |e: &Expr| f(BinOp::Div, e, &lit(2.0, Elem::F32));
        let (w, h) = (half(&b[2]), half(&b[3]));
        [
            f(BinOp::Sub, &b[0], &w),
            f(BinOp::Add, &b[0], &w),
            f(BinOp::Sub, &b[1], &h),
            f(BinOp::Add, &b[1], &h),
        ]
    } else {
        [
            f(BinOp::Min, &b[1], &b[3]),
            f(BinOp::Max, &b[1], &b[3]),
            f(BinOp::Min, &b[0], &b[2]),
            f(BinOp::Max, &b[0], &b[2]),
        ]
    }
}

/// A box's span and its area, (x max - x min) (y max - y min): what the IoU test reads of a box.
fn with_area(s: [Expr; 4]) -> [Expr; 5] {
    let f = |op, a: &Expr, c: &Expr| Expr::bin(op, a.clone(), c.clone());
    let area = f(
        BinOp::Mul,
        &f(BinOp::Sub, &s[1], &s[0]),
        &f(BinOp::Sub, &s[3], &s[2]),
    );
    let [x0, x1, y0, y1] = s;
    [x0, x1, y0, y1, area]
}

/// Whether the IoU of two boxes (`with_area`) exceeds `threshold`, as `mlopt_ir`'s interpreter
/// decides it.
fn suppresses(p: &[Expr; 5], q: &[Expr; 5], threshold: Expr) -> Expr {
    let f = |op, a: Expr, c: Expr| Expr::bin(op, a, c);
    let (x0, x1) = (
        f(BinOp::Max, p[0].clone(), q[0].clone()),
        f(BinOp::Min, p[1].clone(), q[1].clone()),
    );
    let (y0, y1) = (
        f(BinOp::Max, p[2].clone(), q[2].clone()),
        f(BinOp::Min, p[3].clone(), q[3].clone()),
    );
    let zero = || lit(0.0, Elem::F32);
    let inter = f(
        BinOp::Mul,
        f(BinOp::Sub, x1.clone(), x0.clone()),
        f(BinOp::Sub, y1.clone(), y0.clone()),
    );
    let (a1, a2) = (p[4].clone(), q[4].clone());
    let union = f(
        BinOp::Sub,
        f(BinOp::Add, a1.clone(), a2.clone()),
        inter.clone(),
    );
    [
        f(BinOp::Lt, x0, x1),
        f(BinOp::Lt, y0, y1),
        f(BinOp::Lt, zero(), inter.clone()),
        f(BinOp::Lt, zero(), a1),
        f(BinOp::Lt, zero(), a2),
        f(BinOp::Lt, zero(), union.clone()),
        f(BinOp::Lt, threshold, f(BinOp::Div, inter, union)),
    ]
    .into_iter()
    .reduce(and)
    .unwrap_or_else(|| lit(0.0, Elem::Bool))
}

/// The iterations of `for i in 0..n` below `limit` (a run-time value): in blocks of `BLOCK`, a block
/// entered only where it starts below the limit, so a loop whose limit is small costs about n / BLOCK
/// tests rather than n.
fn below(
    l: &mut Lowerer,
    n: u64,
    limit: &Expr,
    mut body: impl FnMut(&mut Lowerer, Expr) -> Result<Vec<Stmt>>,
) -> Result<Vec<Stmt>> {
    const BLOCK: u64 = 64;
    let block = BLOCK.min(n.max(1));
    l.nest("blk", &[n.div_ceil(block)], |l, blk| {
        let start = Expr::bin(BinOp::Mul, blk[0].clone(), Expr::int(block as i64));
        let inner = l.nest("in", &[block], |l, j| {
            let i = Expr::bin(BinOp::Add, start.clone(), j[0].clone());
            let fits = and(
                Expr::bin(BinOp::Lt, i.clone(), limit.clone()),
                Expr::bin(BinOp::Lt, i.clone(), Expr::int(n as i64)),
            );
            Ok(vec![Stmt::If {
                cond: fits,
                then: body(l, i)?,
            }])
        })?;
        Ok(vec![Stmt::If {
            cond: Expr::bin(BinOp::Lt, start, limit.clone()),
            then: inner,
        }])
    })
}

/// NonMaxSuppression, per batch and class, as ONNX's reference: the boxes scoring above the threshold
/// are listed in index order; then, while some are left and the class has fewer than its most, a step
/// takes the best one left (highest score, then lowest index) and chooses it unless its IoU with a box
/// chosen before exceeds the threshold. O(boxes + open x (open + chosen)) per class: the loops over
/// the open and the chosen boxes stop at their counts (`below`); each box's span and area are
/// computed once, when it is tested, and kept with the chosen ones.
pub(crate) fn non_max_suppression(
    l: &mut Lowerer,
    n: NodeId,
    center: bool,
    dsts: &[BufId],
) -> Result<Vec<Stmt>> {
    let (boxes, scores) = (l.input(n, 0)?, l.input(n, 1)?);
    let s = &l.ty(scores).shape;
    let (batches, classes, m) = (s[0] as u64, s[1] as u64, s[2] as u64);
    let bound = l.g.node(n).outputs[0].shape[0] as u64;
    let (dst, count_dst) = (dsts[0], dsts[1]);
    let optional = |l: &mut Lowerer, i: usize, t: Elem, absent: Expr| -> Result<Expr> {
        if l.has_input(n, i) {
            let v = l.input(n, i)?;
            let rank = l.ty(v).rank();
            get(l, v, &vec![Expr::int(0); rank], t)
        } else {
            Ok(absent)
        }
    };
    let most = optional(l, 2, Elem::I64, Expr::int(0))?;
    let iou = optional(l, 3, Elem::F32, lit(0.0, Elem::F32))?;
    let floor = if l.has_input(n, 4) {
        Some(optional(l, 4, Elem::F32, lit(0.0, Elem::F32))?)
    } else {
        None
    };
    let (count, init) = scalar(l, "count", Elem::I64, Expr::int(0));
    let mut out = vec![init];
    out.extend(l.nest("c", &[batches, classes], |l, bc| {
        let (b, c) = (bc[0].clone(), bc[1].clone());
        // The open boxes (index order) and whether each was taken; the boxes chosen.
        let open = l.k.buf(
            format!("open{}", l.k.bufs.len()),
            Elem::I64,
            vec![m],
            Space::Local,
        );
        let taken = l.k.buf(
            format!("taken{}", l.k.bufs.len()),
            Elem::U8,
            vec![m],
            Space::Local,
        );
        // The chosen boxes' spans and areas, and the tested box's.
        let chosen = l.k.buf(
            format!("chosen{}", l.k.bufs.len()),
            Elem::F32,
            vec![m, 5],
            Space::Local,
        );
        let tested = l.k.buf(
            format!("tested{}", l.k.bufs.len()),
            Elem::F32,
            vec![5],
            Space::Local,
        );
        let (opened, init_opened) = scalar(l, "opened", Elem::I64, Expr::int(0));
        let (here, init_here) = scalar(l, "here", Elem::I64, Expr::int(0));
        let score =
            |l: &mut Lowerer, i: Expr| get(l, scores, &[b.clone(), c.clone(), i], Elem::F32);
        let corners = |l: &mut Lowerer, i: &Expr| -> Result<[Expr; 4]> {
            let k = [0, 1, 2, 3]
                .map(|k| get(l, boxes, &[b.clone(), i.clone(), Expr::int(k)], Elem::F32));
            let [k0, k1, k2, k3] = k;
            Ok(span([k0?, k1?, k2?, k3?], center))
        };
        let mut s = vec![init_opened, init_here];
        s.extend(l.nest("i", &[m], |l, i| {
            let i = &i[0];
            let above = match &floor {
                Some(f) => Expr::bin(BinOp::Lt, f.clone(), score(l, i.clone())?),
                None => lit(1.0, Elem::Bool),
            };
            let at = Expr::load(opened, vec![]);
            Ok(vec![Stmt::If {
                cond: and(above, within(&at, m)),
                then: vec![
                    store(open, vec![at.clone()], i.clone()),
                    store(taken, vec![at.clone()], lit(0.0, Elem::U8)),
                    store(opened, vec![], Expr::bin(BinOp::Add, at, Expr::int(1))),
                ],
            }])
        })?);
        let limit = Expr::load(opened, vec![]);
        s.extend(below(l, m, &limit, |l, _| {
            // The best open box not taken: its position among the open ones.
            let (best, init_best) = scalar(l, "best", Elem::F32, lit(0.0, Elem::F32));
            let (at, init_at) = scalar(l, "at", Elem::I64, Expr::int(-1));
            let mut st = vec![init_best, init_at];
            st.extend(below(l, m, &limit, |l, p| {
                let i = Expr::load(open, vec![p.clone()]);
                let v = score(l, i.clone())?;
                let free = Expr::bin(
                    BinOp::Eq,
                    Expr::load(taken, vec![p.clone()]),
                    lit(0.0, Elem::U8),
                );
                let better = Expr::bin(
                    BinOp::Or,
                    Expr::bin(BinOp::Lt, Expr::load(at, vec![]), Expr::int(0)),
                    Expr::bin(BinOp::Lt, Expr::load(best, vec![]), v.clone()),
                );
                Ok(vec![Stmt::If {
                    cond: within(&i, m),
                    then: vec![Stmt::If {
                        cond: and(free, better),
                        then: vec![store(best, vec![], v), store(at, vec![], p)],
                    }],
                }])
            })?);
            let p = Expr::load(at, vec![]);
            let a = Expr::load(open, vec![p.clone()]);
            let (kept, init_kept) = scalar(l, "kept", Elem::I64, Expr::int(1));
            let mut check = vec![store(taken, vec![p.clone()], lit(1.0, Elem::U8)), init_kept];
            for (k, e) in with_area(corners(l, &a)?).into_iter().enumerate() {
                check.push(store(tested, vec![Expr::int(k as i64)], e));
            }
            let part = |b: BufId, at: &[Expr], k: i64| {
                Expr::load(b, at.iter().cloned().chain([Expr::int(k)]).collect())
            };
            let pa = [0, 1, 2, 3, 4].map(|k| part(tested, &[], k));
            let chosen_so_far = Expr::load(here, vec![]);
            check.extend(below(l, m, &chosen_so_far, |_, q| {
                let qk = [0, 1, 2, 3, 4].map(|k| part(chosen, std::slice::from_ref(&q), k));
                Ok(vec![Stmt::If {
                    cond: suppresses(&pa, &qk, iou.clone()),
                    then: vec![store(kept, vec![], Expr::int(0))],
                }])
            })?);
            let total = Expr::load(count, vec![]);
            let mut choose: Vec<Stmt> = [b.clone(), c.clone(), a.clone()]
                .into_iter()
                .enumerate()
                .map(|(col, v)| store(dst, vec![total.clone(), Expr::int(col as i64)], v))
                .collect();
            // Kept at the chosen box's position, before the count of chosen boxes moves on.
            choose.extend((0..5).map(|k| {
                let at = vec![chosen_so_far.clone(), Expr::int(k)];
                store(chosen, at, part(tested, &[], k))
            }));
            choose.extend([
                store(
                    count,
                    vec![],
                    Expr::bin(BinOp::Add, total.clone(), Expr::int(1)),
                ),
                store(
                    here,
                    vec![],
                    Expr::bin(BinOp::Add, chosen_so_far.clone(), Expr::int(1)),
                ),
            ]);
            check.push(Stmt::If {
                cond: and(
                    Expr::bin(BinOp::Ne, Expr::load(kept, vec![]), Expr::int(0)),
                    and(within(&total, bound), within(&chosen_so_far, m)),
                ),
                then: choose,
            });
            let room = Expr::bin(BinOp::Lt, Expr::load(here, vec![]), most.clone());
            st.push(Stmt::If {
                cond: and(within(&p, m), room),
                then: vec![Stmt::If {
                    cond: within(&a, m),
                    then: check,
                }],
            });
            Ok(st)
        })?);
        Ok(s)
    })?);
    out.extend(finish(l, dst, &[bound, 3], 0, count, count_dst)?);
    Ok(out)
}

/// Unique along `axis`, in the interpreter's steps (`mlopt_ir`'s `Op::Unique`): the inverse output
/// first holds each slice's first occurrence, the distinct slices are placed at their rank, then each
/// slice's entry becomes its distinct slice's position (found among the indices placed) and counts.
/// O(n^2) slice comparisons.
pub(crate) fn unique(
    l: &mut Lowerer,
    n: NodeId,
    axis: usize,
    sorted: bool,
    dsts: &[BufId],
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let shape: Vec<u64> = l.ty(x).shape.iter().map(|&d| d as u64).collect();
    let stored = elem(l.ty(x).dtype);
    let t = crate::elementwise::compute(stored);
    let len = shape[axis];
    let mut rest = shape.clone();
    rest.remove(axis);
    let [y, indices, inverse, counts, count_dst] = dsts[..] else {
        return Err(l.unsupported(n, "unique has five outputs"));
    };
    let slot = move |i: &Expr, e: &[Expr]| -> Vec<Expr> {
        let mut ix = e.to_vec();
        ix.insert(axis, i.clone());
        ix
    };
    // `flag` = 1 unless slices i and j differ somewhere.
    let same = |l: &mut Lowerer, i: &Expr, j: &Expr| -> Result<(BufId, Vec<Stmt>)> {
        let (flag, init) = scalar(l, "same", Elem::I64, Expr::int(1));
        let mut s = vec![init];
        s.extend(l.nest("e", &rest, |l, e| {
            let (a, b) = (get(l, x, &slot(i, e), t)?, get(l, x, &slot(j, e), t)?);
            Ok(vec![Stmt::If {
                cond: Expr::bin(BinOp::Ne, a, b),
                then: vec![store(flag, vec![], Expr::int(0))],
            }])
        })?);
        Ok((flag, s))
    };
    let zero = |l: &mut Lowerer, buf: BufId, dims: &[u64]| {
        let t = l.k.bufs[buf.0 as usize].elem;
        l.nest("z", dims, |_, ix| {
            Ok(vec![store(buf, ix.to_vec(), lit(0.0, t))])
        })
    };
    let mut s = zero(l, y, &shape)?;
    s.extend(zero(l, indices, &[len])?);
    s.extend(zero(l, counts, &[len])?);
    // Each slice's first occurrence.
    s.extend(l.nest("i", &[len], |l, i| {
        let i = &i[0];
        let (found, init) = scalar(l, "found", Elem::I64, Expr::int(0));
        let mut st = vec![store(inverse, vec![i.clone()], i.clone()), init];
        st.extend(l.nest("j", &[len], |l, j| {
            let j = &j[0];
            let (flag, mut body) = same(l, i, j)?;
            let open = and(
                Expr::bin(BinOp::Lt, j.clone(), i.clone()),
                Expr::bin(BinOp::Eq, Expr::load(found, vec![]), Expr::int(0)),
            );
            body.push(Stmt::If {
                cond: and(
                    open,
                    Expr::bin(BinOp::Ne, Expr::load(flag, vec![]), Expr::int(0)),
                ),
                then: vec![
                    store(inverse, vec![i.clone()], j.clone()),
                    store(found, vec![], Expr::int(1)),
                ],
            });
            Ok(body)
        })?);
        Ok(st)
    })?);
    let first = |i: &Expr| Expr::bin(BinOp::Eq, Expr::load(inverse, vec![i.clone()]), i.clone());
    // The distinct slices, each at its rank.
    let (count, init) = scalar(l, "count", Elem::I64, Expr::int(0));
    s.push(init);
    s.extend(l.nest("i", &[len], |l, i| {
        let i = &i[0];
        let (rank, init) = scalar(l, "rank", Elem::I64, Expr::int(0));
        let mut place = vec![init];
        if sorted {
            // The distinct slices j less than slice i: at the first element that differs.
            place.extend(l.nest("j", &[len], |l, j| {
                let j = &j[0];
                let (decided, init_d) = scalar(l, "decided", Elem::I64, Expr::int(0));
                let (lower, init_l) = scalar(l, "lower", Elem::I64, Expr::int(0));
                let mut body = vec![init_d, init_l];
                body.extend(l.nest("e", &rest, |l, e| {
                    let (a, b) = (get(l, x, &slot(j, e), t)?, get(l, x, &slot(i, e), t)?);
                    let open = Expr::bin(BinOp::Eq, Expr::load(decided, vec![]), Expr::int(0));
                    Ok(vec![Stmt::If {
                        cond: and(open, Expr::bin(BinOp::Ne, a.clone(), b.clone())),
                        then: vec![
                            store(
                                lower,
                                vec![],
                                Expr::cast(Elem::I64, Expr::bin(BinOp::Lt, a, b)),
                            ),
                            store(decided, vec![], Expr::int(1)),
                        ],
                    }])
                })?);
                let before = Expr::bin(BinOp::Ne, Expr::load(lower, vec![]), Expr::int(0));
                body.push(Stmt::If {
                    cond: and(first(j), before),
                    then: vec![store(
                        rank,
                        vec![],
                        Expr::bin(BinOp::Add, Expr::load(rank, vec![]), Expr::int(1)),
                    )],
                });
                Ok(body)
            })?);
        } else {
            place.push(store(rank, vec![], Expr::load(count, vec![])));
        }
        let k = Expr::load(rank, vec![]);
        let mut copy = l.nest("e", &rest, |l, e| {
            Ok(vec![store(y, slot(&k, e), get(l, x, &slot(i, e), stored)?)])
        })?;
        copy.push(store(indices, vec![k.clone()], i.clone()));
        place.push(Stmt::If {
            cond: within(&k, len),
            then: copy,
        });
        place.push(store(
            count,
            vec![],
            Expr::bin(BinOp::Add, Expr::load(count, vec![]), Expr::int(1)),
        ));
        Ok(vec![Stmt::If {
            cond: first(i),
            then: place,
        }])
    })?);
    // Each slice's distinct slice, found by its first occurrence among those placed, and counted.
    s.extend(l.nest("i", &[len], |l, i| {
        let i = &i[0];
        let (at, init) = scalar(l, "at", Elem::I64, Expr::int(-1));
        let mut st = vec![init];
        let f = Expr::load(inverse, vec![i.clone()]);
        st.extend(l.nest("k", &[len], |_, k| {
            let k = &k[0];
            let open = and(
                Expr::bin(BinOp::Lt, k.clone(), Expr::load(count, vec![])),
                Expr::bin(BinOp::Lt, Expr::load(at, vec![]), Expr::int(0)),
            );
            Ok(vec![Stmt::If {
                cond: and(
                    open,
                    Expr::bin(BinOp::Eq, Expr::load(indices, vec![k.clone()]), f.clone()),
                ),
                then: vec![store(at, vec![], k.clone())],
            }])
        })?);
        let a = Expr::load(at, vec![]);
        st.push(Stmt::If {
            cond: within(&a, len),
            then: vec![
                store(inverse, vec![i.clone()], a.clone()),
                store(
                    counts,
                    vec![a.clone()],
                    Expr::bin(
                        BinOp::Add,
                        Expr::load(counts, vec![a.clone()]),
                        Expr::int(1),
                    ),
                ),
            ],
        });
        Ok(st)
    })?);
    s.push(store(count_dst, vec![], Expr::load(count, vec![])));
    Ok(s)
}
