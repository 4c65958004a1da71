//! Anchors: the members of a kernel that are not one expression per output element (contractions,
//! windows, reductions, normalisations, attention). Each becomes a loop nest over its output whose body
//! folds its inputs into `local` accumulators, then stores the result. These are the algorithms;
//! `schedule.rs` picks how their loops run.

use crate::conv_pool::{conv, conv_transpose, max_pool_indices, pool_window};
use crate::cumulative::cumulative;
use crate::elementwise::{compute, elem};
use crate::error::Result;
use crate::kernel::{dims, Lowerer};
use crate::rows::{attention, instance_norm, layer_norm, softmax};
use mlopt_ir::{NodeId, Op, ReduceKind, Value};
use mlopt_kir::index::clamp;
use mlopt_kir::index::{convert, lit};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt, UnOp};

/// A fold: `acc = init; for r in extents { acc = step(acc, value(r)) }`.
pub(crate) struct Fold {
    pub(crate) stmts: Vec<Stmt>,
    pub(crate) acc: BufId,
}

impl Fold {
    pub(crate) fn get(&self) -> Expr {
        Expr::load(self.acc, vec![])
    }
}

pub(crate) fn fold(
    l: &mut Lowerer,
    t: Elem,
    init: Expr,
    extents: &[u64],
    update: impl FnOnce(&mut Lowerer, &[Expr], Expr) -> Result<Expr>,
) -> Result<Fold> {
    let acc =
        l.k.buf(format!("acc{}", l.k.bufs.len()), t, vec![], Space::Local);
    let mut stmts = vec![Stmt::Store {
        buf: acc,
        index: vec![],
        value: init,
    }];
    stmts.extend(l.nest("r", extents, |l, r| {
        let value = update(l, r, Expr::load(acc, vec![]))?;
        Ok(vec![Stmt::Store {
            buf: acc,
            index: vec![],
            value,
        }])
    })?);
    Ok(Fold { stmts, acc })
}

/// A fold whose update is `op(acc, value(r))`. (On a CPU the schedule runs an f32 sum, max or min over
/// one axis with one partial result per vector lane: `mlopt_kir::rfactor`.)
pub(crate) fn fold_op(
    l: &mut Lowerer,
    t: Elem,
    init: Expr,
    extents: &[u64],
    op: BinOp,
    value: impl FnOnce(&mut Lowerer, &[Expr]) -> Result<Expr>,
) -> Result<Fold> {
    fold(l, t, init, extents, |l, r, acc| {
        Ok(Expr::bin(op, acc, value(l, r)?))
    })
}

pub(crate) fn lowest(t: Elem) -> Expr {
    match t {
        Elem::I64 => Expr::int(i64::MIN),
        Elem::I32 => lit(i32::MIN as f64, t),
        Elem::I16 => lit(i16::MIN as f64, t),
        Elem::I8 => lit(i8::MIN as f64, t),
        Elem::U8 | Elem::U16 | Elem::U32 | Elem::U64 | Elem::Bool => lit(0.0, t),
        _ => lit(f64::NEG_INFINITY, t),
    }
}

pub(crate) fn highest(t: Elem) -> Expr {
    match t {
        Elem::I64 => Expr::int(i64::MAX),
        Elem::I32 => lit(i32::MAX as f64, t),
        Elem::I16 => lit(i16::MAX as f64, t),
        Elem::I8 => lit(i8::MAX as f64, t),
        Elem::U8 => lit(255.0, t),
        Elem::U16 => lit(u16::MAX as f64, t),
        Elem::U32 => lit(u32::MAX as f64, t),
        // All ones: u64::MAX is past what an f64 literal converts exactly.
        Elem::U64 => Expr::cast(t, Expr::int(-1)),
        Elem::Bool => lit(1.0, t),
        _ => lit(f64::INFINITY, t),
    }
}

/// Pulls `v` at `idx` converted to `t`.
pub fn get(l: &mut Lowerer, v: Value, idx: &[Expr], t: Elem) -> Result<Expr> {
    let from = elem(l.ty(v).dtype);
    let e = l.pull(v, idx)?;
    Ok(convert(e, from, t))
}

/// The index of a broadcast operand of rank `rank` for the (right-aligned) index `idx`.
pub(crate) fn broadcast(shape: &[usize], idx: &[Expr]) -> Vec<Expr> {
    let skip = idx.len() - shape.len();
    shape
        .iter()
        .enumerate()
        .map(|(d, s)| {
            if *s == 1 {
                Expr::int(0)
            } else {
                idx[skip + d].clone()
            }
        })
        .collect()
}

/// Lowers anchor `n`, writing output `o` into `dsts[o]`.
pub fn lower(l: &mut Lowerer, n: NodeId, dsts: &[BufId]) -> Result<Vec<Stmt>> {
    let node = l.g.node(n);
    let out = dims(&node.outputs[0]);
    let out_t = elem(node.outputs[0].dtype);
    let dst = dsts[0];
    match node.op.clone() {
        Op::MatMul => matmul(l, n, &out, out_t, dst),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => {
            let (a, bm) = (l.input(n, 0)?, l.input(n, 1)?);
            let kdim = l.ty(a).shape[if trans_a { 0 } else { 1 }] as u64;
            let c = if l.has_input(n, 2) {
                Some(l.input(n, 2)?)
            } else {
                None
            };
            let cs = c.map(|c| l.ty(c).shape.clone());
            // alpha * (A B)[i, j] + beta * C[i, j], in the output type: the last step of every path.
            let out_ij = |l: &mut Lowerer, i: &Expr, j: &Expr, v: Expr| -> Result<Stmt> {
                let mut y = Expr::bin(BinOp::Mul, lit(alpha as f64, Elem::F32), v);
                if let (Some(c), Some(cs)) = (c, &cs) {
                    y = Expr::bin(
                        BinOp::Add,
                        y,
                        Expr::bin(
                            BinOp::Mul,
                            lit(beta as f64, Elem::F32),
                            get(l, c, &broadcast(cs, &[i.clone(), j.clone()]), Elem::F32)?,
                        ),
                    );
                }
                Ok(Stmt::Store {
                    buf: dst,
                    index: vec![i.clone(), j.clone()],
                    value: convert(y, Elem::F32, out_t),
                })
            };
            l.nest("i", &out, |l, idx| {
                let (i, j) = (idx[0].clone(), idx[1].clone());
                let f = dot(l, &[kdim], |l, r| {
                    let ai = if trans_a {
                        vec![r[0].clone(), i.clone()]
                    } else {
                        vec![i.clone(), r[0].clone()]
                    };
                    let bv = get(
                        l,
                        bm,
                        &if trans_b {
                            vec![j.clone(), r[0].clone()]
                        } else {
                            vec![r[0].clone(), j.clone()]
                        },
                        Elem::F32,
                    )?;
                    Ok((get(l, a, &ai, Elem::F32)?, bv))
                })?;
                let mut stmts = f.stmts.clone();
                stmts.push(out_ij(l, &i, &j, f.get())?);
                Ok(stmts)
            })
        }
        Op::Conv(a) => conv(l, n, &a, &out, out_t, dst),
        Op::Cumulative(c) => cumulative(l, n, &c, dst),
        Op::ConvTranspose(a) => conv_transpose(l, n, &a, &out, out_t, dst),
        Op::GridSample {
            mode,
            padding,
            align_corners,
        } => crate::grid_sample::grid_sample(l, n, mode, padding, align_corners, out_t, dst),
        Op::MaxPool { pool, .. } | Op::AveragePool { pool, .. } => {
            let indices_used = l.g.users(n).iter().any(|(_, e)| e.output == 1)
                || l.g
                    .graph_outputs()
                    .iter()
                    .any(|(_, v)| v.node == n && v.output == 1);
            if let (Op::MaxPool { col_major, .. }, true, Some(at)) =
                (&node.op, indices_used, dsts.get(1))
            {
                return max_pool_indices(l, n, &pool, *col_major, &out, out_t, dst, *at);
            }
            let (max, include_pad) = match node.op {
                Op::AveragePool {
                    count_include_pad, ..
                } => (false, count_include_pad),
                _ => (true, false),
            };
            pool_window(l, n, &pool, max, include_pad, &out, out_t, dst)
        }
        Op::GlobalAveragePool | Op::GlobalMaxPool => {
            let axes: Vec<usize> = (2..out.len()).collect();
            let kind = if matches!(node.op, Op::GlobalMaxPool) {
                ReduceKind::Max
            } else {
                ReduceKind::Mean
            };
            reduce(l, n, kind, &axes, true, &out, out_t, dst)
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => reduce(l, n, kind, &axes, keepdims, &out, out_t, dst),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => softmax(
            l,
            n,
            axis,
            matches!(node.op, Op::LogSoftmax { .. }),
            &out,
            out_t,
            dst,
        ),
        Op::LayerNorm { axis, epsilon } => layer_norm(l, n, axis, epsilon, &out, out_t, dsts),
        Op::InstanceNorm { epsilon } => instance_norm(l, n, epsilon, &out, out_t, dst),
        Op::Attention { scale } => attention(l, n, scale, &out, out_t, dst),
        Op::Arg {
            max,
            axis,
            keepdims,
            select_last_index,
        } => arg(l, n, max, axis, keepdims, select_last_index, &out, dst),
        Op::TopK {
            axis, k, largest, ..
        } => top_k(l, n, axis, k as u64, largest, dsts),
        Op::ScatterElements { axis, reduction } => {
            scatter(l, n, Scatter::Elements(axis), reduction, &out, out_t, dst)
        }
        Op::ScatterNd { reduction } => scatter(l, n, Scatter::Nd, reduction, &out, out_t, dst),
        Op::NonZero => crate::counted::non_zero(l, n, dsts),
        Op::Compress { axis } => crate::counted::compress(l, n, axis, dsts),
        Op::NonMaxSuppression {
            center_point_box, ..
        } => crate::counted::non_max_suppression(l, n, center_point_box, dsts),
        Op::Unique { axis, sorted } => crate::counted::unique(l, n, axis, sorted, dsts),
        _ => Err(l.unsupported(n, "no code generation for this op yet")),
    }
}

/// `acc = fma(x, y, acc)` over `extents`, in f32.
pub(crate) fn dot(
    l: &mut Lowerer,
    extents: &[u64],
    xy: impl FnOnce(&mut Lowerer, &[Expr]) -> Result<(Expr, Expr)>,
) -> Result<Fold> {
    dot_in(l, Elem::F32, extents, xy)
}

/// The type a product with result type `out` sums in: an integer result's own type (exact, wrapping;
/// an i32 convolution of i16 values is a quantized model's), else f32.
pub(crate) fn sum_type(out: Elem) -> Elem {
    if out.is_float() || out == Elem::Bool {
        Elem::F32
    } else {
        out
    }
}

/// `dot` summing in `t`: `acc = fma(x, y, acc)` in f32, `acc = acc + x * y` in an integer type (the
/// operands `xy` gives already of type `t`).
pub(crate) fn dot_in(
    l: &mut Lowerer,
    t: Elem,
    extents: &[u64],
    xy: impl FnOnce(&mut Lowerer, &[Expr]) -> Result<(Expr, Expr)>,
) -> Result<Fold> {
    fold(l, t, lit(0.0, t), extents, |l, r, acc| {
        let (x, y) = xy(l, r)?;
        Ok(if t == Elem::F32 {
            Expr::fma(x, y, acc)
        } else {
            Expr::bin(BinOp::Add, acc, Expr::bin(BinOp::Mul, x, y))
        })
    })
}

pub(crate) fn matmul(
    l: &mut Lowerer,
    n: NodeId,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (a, bm) = (l.input(n, 0)?, l.input(n, 1)?);
    let (sa, sb) = (l.ty(a).shape.clone(), l.ty(bm).shape.clone());
    let kdim = *sa.last().unwrap_or(&1) as u64;
    let (has_m, has_n) = (sa.len() >= 2, sb.len() >= 2);
    // (On a CPU the schedule tiles this nest in registers, `mlopt-schedule/src/cpu/gemm.rs`, or in bf16 `mma`
    // blocks, `cpu/mma.rs`.)
    l.nest("i", out, |l, idx| {
        let r = idx.len();
        let j = has_n.then(|| idx[r - 1].clone());
        let i = has_m.then(|| idx[r - 1 - has_n as usize].clone());
        let batch = &idx[..r - has_m as usize - has_n as usize];
        let t = sum_type(out_t);
        let f = dot_in(l, t, &[kdim], |l, k| {
            let mut ai = broadcast(&sa[..sa.len().saturating_sub(2)], batch);
            ai.extend(i.clone());
            ai.push(k[0].clone());
            let mut bi = broadcast(&sb[..sb.len().saturating_sub(2)], batch);
            bi.push(k[0].clone());
            bi.extend(j.clone());
            let bv = get(l, bm, &bi, t)?;
            Ok((get(l, a, &ai, t)?, bv))
        })?;
        let mut s = f.stmts.clone();
        s.push(Stmt::Store {
            buf: dst,
            index: idx.to_vec(),
            value: convert(f.get(), t, out_t),
        });
        Ok(s)
    })
}

/// Appends `st` to the body of the innermost loop of the last loop nest in `stmts`.
pub(crate) fn add_to_innermost(stmts: &mut [Stmt], st: Stmt) {
    if let Some(Stmt::For { body, .. }) = stmts.last_mut() {
        if matches!(body.last(), Some(Stmt::For { .. })) {
            add_to_innermost(body, st);
        } else {
            body.push(st);
        }
    }
}

/// Output index + reduced loop index -> input index.
pub(crate) fn reduce_index(
    rank: usize,
    axes: &[usize],
    keepdims: bool,
    idx: &[Expr],
    r: &[Expr],
) -> Vec<Expr> {
    let mut xi = Vec::with_capacity(rank);
    let (mut o, mut k) = (0, 0);
    for a in 0..rank {
        if axes.contains(&a) {
            xi.push(r[k].clone());
            k += 1;
            if keepdims {
                o += 1;
            }
        } else {
            xi.push(idx[o].clone());
            o += 1;
        }
    }
    xi
}

fn reduce(
    l: &mut Lowerer,
    n: NodeId,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let xs = l.ty(x).shape.clone();
    let t = compute(elem(l.ty(x).dtype));
    let red: Vec<u64> = axes.iter().map(|a| xs[*a] as u64).collect();
    let count: u64 = red.iter().product();
    let axes = axes.to_vec();
    let rank = xs.len();
    // Reduced axes next to each other in memory (a global pool's H and W) are folded as one: their
    // elements are one contiguous run, which a vector fold reads in lanes, where folding H then W
    // vectorised across the outputs instead (a load per lane, each a plane apart).
    let adjacent = axes.windows(2).all(|w| w[1] == w[0] + 1);
    let dims: Vec<i64> = red.iter().map(|d| *d as i64).collect();
    let red = if adjacent && red.len() > 1 {
        vec![count]
    } else {
        red
    };
    l.nest("i", out, |l, idx| {
        let at = |idx: &[Expr], r: &[Expr]| {
            let r = if r.len() < dims.len() {
                mlopt_kir::index::delinear(r[0].clone(), &dims)
            } else {
                r.to_vec()
            };
            reduce_index(rank, &axes, keepdims, idx, &r)
        };
        let mut pre = Vec::new();
        let mut shift = None;
        if kind == ReduceKind::LogSumExp && count > 0 {
            let m = fold_op(l, t, lowest(t), &red, BinOp::Max, |l, r| {
                get(l, x, &at(idx, r), t)
            })?;
            pre = m.stmts.clone();
            shift = Some(m.get());
        }
        let (init, op): (Expr, BinOp) = match kind {
            ReduceKind::Max => (lowest(t), BinOp::Max),
            ReduceKind::Min => (highest(t), BinOp::Min),
            ReduceKind::Prod => (lit(1.0, t), BinOp::Mul),
            _ => (lit(0.0, t), BinOp::Add),
        };
        let sh = shift.clone();
        let f = fold_op(l, t, init, &red, op, |l, r| {
            let v = get(l, x, &at(idx, r), t)?;
            Ok(match kind {
                ReduceKind::L1 => Expr::un(UnOp::Abs, v),
                ReduceKind::L2 | ReduceKind::SumSquare => Expr::bin(BinOp::Mul, v.clone(), v),
                ReduceKind::LogSumExp => Expr::un(
                    UnOp::Exp,
                    Expr::bin(BinOp::Sub, v, sh.clone().unwrap_or_else(|| lit(0.0, t))),
                ),
                _ => v,
            })
        })?;
        let acc = f.get();
        let y = match kind {
            ReduceKind::Mean => Expr::bin(BinOp::Div, acc, lit(count as f64, t)),
            ReduceKind::L2 => Expr::un(UnOp::Sqrt, acc),
            ReduceKind::LogSum => Expr::un(UnOp::Log, acc),
            ReduceKind::LogSumExp => match shift {
                // An infinite largest element is the result (x - m would be inf - inf = NaN): +inf,
                // or -inf where every element is, as the interpreter and ONNX Runtime give.
                Some(m) => Expr::select(
                    Expr::bin(
                        BinOp::Eq,
                        Expr::un(UnOp::Abs, m.clone()),
                        lit(f64::INFINITY, t),
                    ),
                    m.clone(),
                    Expr::bin(BinOp::Add, Expr::un(UnOp::Log, acc), m),
                ),
                None => Expr::un(UnOp::Log, acc),
            },
            _ => acc,
        };
        pre.extend(f.stmts);
        pre.push(Stmt::Store {
            buf: dst,
            index: idx.to_vec(),
            value: convert(y, t, out_t),
        });
        Ok(pre)
    })
}

fn arg(
    l: &mut Lowerer,
    n: NodeId,
    max: bool,
    axis: usize,
    keepdims: bool,
    last: bool,
    out: &[u64],
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let xs = l.ty(x).shape.clone();
    let t = compute(elem(l.ty(x).dtype));
    let len = xs[axis] as u64;
    let rank = xs.len();
    l.nest("i", out, |l, idx| {
        let best =
            l.k.buf(format!("best{}", l.k.bufs.len()), t, vec![], Space::Local);
        let at = l.k.buf(
            format!("at{}", l.k.bufs.len()),
            Elem::I64,
            vec![],
            Space::Local,
        );
        let mut stmts = vec![
            Stmt::Store {
                buf: best,
                index: vec![],
                value: if max { lowest(t) } else { highest(t) },
            },
            Stmt::Store {
                buf: at,
                index: vec![],
                value: Expr::int(0),
            },
        ];
        stmts.extend(l.nest("r", &[len], |l, r| {
            let xi = reduce_index(rank, &[axis], keepdims, idx, r);
            let v = get(l, x, &xi, t)?;
            let cur = Expr::load(best, vec![]);
            let mut better = match (max, last) {
                (true, false) => Expr::bin(BinOp::Lt, cur.clone(), v.clone()),
                (true, true) => Expr::bin(BinOp::Le, cur.clone(), v.clone()),
                (false, false) => Expr::bin(BinOp::Lt, v.clone(), cur.clone()),
                (false, true) => Expr::bin(BinOp::Le, v.clone(), cur.clone()),
            };
            if t.is_float() {
                // NaN wins, the first one (numpy's argmax and argmin, the ONNX reference's, and the
                // interpreter's): a NaN replaces a number, nothing replaces a NaN.
                let nan = |e: Expr| Expr::bin(BinOp::Ne, e.clone(), e);
                better = Expr::bin(
                    BinOp::And,
                    Expr::un(UnOp::Not, nan(cur)),
                    Expr::bin(BinOp::Or, nan(v.clone()), better),
                );
            }
            Ok(vec![
                Stmt::Store {
                    buf: at,
                    index: vec![],
                    value: Expr::select(better.clone(), r[0].clone(), Expr::load(at, vec![])),
                },
                Stmt::Store {
                    buf: best,
                    index: vec![],
                    value: Expr::select(better, v, Expr::load(best, vec![])),
                },
            ])
        })?);
        stmts.push(Stmt::Store {
            buf: dst,
            index: idx.to_vec(),
            value: Expr::load(at, vec![]),
        });
        Ok(stmts)
    })
}

/// TopK by selection, O(k n) per row: pick j is the best element that comes after pick j - 1 in the
/// order (value, then index; NaN counts as the largest value, as in the reference), so ties keep the
/// lower index and the result is sorted.
fn top_k(
    l: &mut Lowerer,
    n: NodeId,
    axis: usize,
    k: u64,
    largest: bool,
    dsts: &[BufId],
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let xs = l.ty(x).shape.clone();
    let t = compute(elem(l.ty(x).dtype));
    let out_t = elem(l.ty(x).dtype);
    let len = xs[axis] as i64;
    let (dst, dst_at) = (dsts[0], dsts.get(1).copied());
    let rows: Vec<u64> = xs
        .iter()
        .enumerate()
        .filter(|(d, _)| *d != axis)
        .map(|(_, s)| *s as u64)
        .collect();
    let at_axis = |row: &[Expr], i: Expr| -> Vec<Expr> {
        let mut ix = row.to_vec();
        ix.insert(axis, i);
        ix
    };
    // `a` comes before `b` in the order; the key maps NaN to +inf.
    let key = |v: Expr| {
        if t.is_float() {
            Expr::select(
                Expr::bin(BinOp::Ne, v.clone(), v.clone()),
                lit(f64::INFINITY, t),
                v,
            )
        } else {
            v
        }
    };
    let ahead = |a: Expr, c: Expr| {
        if largest {
            Expr::bin(BinOp::Lt, c, a)
        } else {
            Expr::bin(BinOp::Lt, a, c)
        }
    };
    l.nest("i", &rows, |l, row| {
        let (prev, prev_at) = (
            l.k.buf(format!("prev{}", l.k.bufs.len()), t, vec![], Space::Local),
            l.k.buf(
                format!("prev_at{}", l.k.bufs.len()),
                Elem::I64,
                vec![],
                Space::Local,
            ),
        );
        let mut stmts = vec![
            Stmt::Store {
                buf: prev,
                index: vec![],
                value: if largest { highest(t) } else { lowest(t) },
            },
            Stmt::Store {
                buf: prev_at,
                index: vec![],
                value: Expr::int(-1),
            },
        ];
        stmts.extend(l.nest("j", &[k], |l, j| {
            let (best, at) = (
                l.k.buf(format!("best{}", l.k.bufs.len()), t, vec![], Space::Local),
                l.k.buf(
                    format!("at{}", l.k.bufs.len()),
                    Elem::I64,
                    vec![],
                    Space::Local,
                ),
            );
            let mut s = vec![
                Stmt::Store {
                    buf: best,
                    index: vec![],
                    value: lit(0.0, t),
                },
                Stmt::Store {
                    buf: at,
                    index: vec![],
                    value: Expr::int(-1),
                },
            ];
            s.extend(l.nest("r", &[len as u64], |l, r| {
                let v = key(get(l, x, &at_axis(row, r[0].clone()), t)?);
                let (p, pa) = (Expr::load(prev, vec![]), Expr::load(prev_at, vec![]));
                let after = Expr::bin(
                    BinOp::Or,
                    ahead(p.clone(), v.clone()),
                    Expr::bin(
                        BinOp::And,
                        Expr::bin(BinOp::Eq, v.clone(), p),
                        Expr::bin(BinOp::Lt, pa, r[0].clone()),
                    ),
                );
                let (cur, cur_at) = (Expr::load(best, vec![]), Expr::load(at, vec![]));
                let better = Expr::bin(
                    BinOp::Or,
                    Expr::bin(BinOp::Lt, cur_at.clone(), Expr::int(0)),
                    ahead(v.clone(), cur.clone()),
                );
                let take = Expr::bin(BinOp::And, after, better);
                Ok(take_if(l, take, &[(best, v), (at, r[0].clone())]))
            })?);
            let chosen = clamp(Expr::load(at, vec![]), len);
            let value = get(l, x, &at_axis(row, chosen), out_t)?;
            s.push(Stmt::Store {
                buf: dst,
                index: at_axis(row, j[0].clone()),
                value,
            });
            if let Some(d) = dst_at {
                s.push(Stmt::Store {
                    buf: d,
                    index: at_axis(row, j[0].clone()),
                    value: Expr::load(at, vec![]),
                });
            }
            s.push(Stmt::Store {
                buf: prev,
                index: vec![],
                value: Expr::load(best, vec![]),
            });
            s.push(Stmt::Store {
                buf: prev_at,
                index: vec![],
                value: Expr::load(at, vec![]),
            });
            Ok(s)
        })?);
        Ok(stmts)
    })
}

/// `acc = take ? new : acc` for each (scalar local, new value), with `take` evaluated once before any of
/// them changes (it usually reads them).
pub(crate) fn take_if(l: &mut Lowerer, take: Expr, updates: &[(BufId, Expr)]) -> Vec<Stmt> {
    let flag = l.k.buf(
        format!("take{}", l.k.bufs.len()),
        Elem::Bool,
        vec![],
        Space::Local,
    );
    let mut s = vec![Stmt::Store {
        buf: flag,
        index: vec![],
        value: take,
    }];
    for (acc, new) in updates {
        s.push(Stmt::Store {
            buf: *acc,
            index: vec![],
            value: Expr::select(
                Expr::load(flag, vec![]),
                new.clone(),
                Expr::load(*acc, vec![]),
            ),
        });
    }
    s
}

/// Which scatter: along one axis (ScatterElements) or by index tuples (ScatterND).
enum Scatter {
    Elements(usize),
    Nd,
}

/// Scatter: the output is a copy of the data, then each update, in order, is combined into the element
/// its indices name (negative indices count from the end). Updates run serially, so duplicate indices
/// combine in the reference's order.
fn scatter(
    l: &mut Lowerer,
    n: NodeId,
    kind: Scatter,
    red: mlopt_ir::ScatterReduction,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (x, ind, upd) = (l.input(n, 0)?, l.input(n, 1)?, l.input(n, 2)?);
    let ds: Vec<i64> = l.ty(x).shape.iter().map(|d| *d as i64).collect();
    let us = dims(l.ty(upd));
    let ind_t = elem(l.ty(ind).dtype);
    let t = compute(out_t);
    let mut stmts = l.nest("i", out, |l, idx| {
        let v = get(l, x, idx, out_t)?;
        Ok(vec![Stmt::Store {
            buf: dst,
            index: idx.to_vec(),
            value: v,
        }])
    })?;
    let updates = l.nest("u", &us, |l, u| {
        let target: Vec<Expr> = match kind {
            Scatter::Elements(axis) => {
                let mut target = u.to_vec();
                let raw = convert(l.pull(ind, u)?, ind_t, Elem::I64);
                target[axis] = mlopt_kir::index::wrap_index(raw, ds[axis]);
                target
                    .into_iter()
                    .zip(&ds)
                    .map(|(e, d)| clamp(e, *d))
                    .collect()
            }
            Scatter::Nd => {
                // updates[r.., s..] goes to data[indices[r.., 0..last], s..].
                let q = l.ty(ind).shape.len();
                let mut target = l.index_tuple(ind, &u[..q - 1], &ds)?;
                target.extend_from_slice(&u[q - 1..]);
                target
            }
        };
        let new = get(l, upd, u, t)?;
        let old = convert(Expr::load(dst, target.clone()), out_t, t);
        let v = match red {
            mlopt_ir::ScatterReduction::None => new,
            mlopt_ir::ScatterReduction::Add => Expr::bin(BinOp::Add, old, new),
            mlopt_ir::ScatterReduction::Mul => Expr::bin(BinOp::Mul, old, new),
            mlopt_ir::ScatterReduction::Max => Expr::bin(BinOp::Max, old, new),
            mlopt_ir::ScatterReduction::Min => Expr::bin(BinOp::Min, old, new),
        };
        Ok(vec![Stmt::Store {
            buf: dst,
            index: target,
            value: convert(v, t, out_t),
        }])
    })?;
    stmts.extend(updates);
    Ok(stmts)
}
