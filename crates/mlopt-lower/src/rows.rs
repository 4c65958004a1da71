//! Row computations: Softmax and LogSoftmax, the normalisations (LayerNorm, InstanceNorm, with their
//! moments) and Attention, each a loop nest over the other axes whose body folds one row (attention one
//! query row of scores, so the S x T matrix is never stored).

use crate::elementwise::{compute, elem};
use crate::error::Result;
use crate::kernel::Lowerer;
use crate::nests::*;
use mlopt_ir::{NodeId, Value};
use mlopt_kir::index::{convert, lit};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt, UnOp};

/// The shape with `axis` removed (the rows a row-wise op runs over), and the index with `r` put back.
pub(crate) fn row_index(idx: &[Expr], axis: usize, r: Expr) -> Vec<Expr> {
    let mut v = idx.to_vec();
    v.insert(axis, r);
    v
}

pub(crate) fn softmax(
    l: &mut Lowerer,
    n: NodeId,
    axis: usize,
    log: bool,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let t = compute(elem(l.ty(x).dtype));
    let len = out[axis];
    let mut outer = out.to_vec();
    outer.remove(axis);
    l.nest("i", &outer, |l, idx| {
        let m = fold_op(l, t, lowest(t), &[len], BinOp::Max, |l, r| {
            get(l, x, &row_index(idx, axis, r[0].clone()), t)
        })?;
        let mx = m.get();
        let s = fold_op(l, t, lit(0.0, t), &[len], BinOp::Add, |l, r| {
            Ok(Expr::un(
                UnOp::Exp,
                Expr::bin(
                    BinOp::Sub,
                    get(l, x, &row_index(idx, axis, r[0].clone()), t)?,
                    mx.clone(),
                ),
            ))
        })?;
        let sum = s.get();
        let mut stmts = m.stmts;
        stmts.extend(s.stmts);
        // 1/sum once per row; each element is then a multiply.
        let inv =
            l.k.buf(format!("inv{}", l.k.bufs.len()), t, vec![], Space::Local);
        stmts.push(Stmt::Store {
            buf: inv,
            index: vec![],
            value: if log {
                Expr::un(UnOp::Log, sum)
            } else {
                Expr::bin(BinOp::Div, lit(1.0, t), sum)
            },
        });
        stmts.extend(l.nest("j", &[len], |l, r| {
            let oi = row_index(idx, axis, r[0].clone());
            let d = Expr::bin(BinOp::Sub, get(l, x, &oi, t)?, mx.clone());
            let y = if log {
                Expr::bin(BinOp::Sub, d, Expr::load(inv, vec![]))
            } else {
                Expr::bin(BinOp::Mul, Expr::un(UnOp::Exp, d), Expr::load(inv, vec![]))
            };
            Ok(vec![Stmt::Store {
                buf: dst,
                index: oi,
                value: convert(y, t, out_t),
            }])
        })?);
        Ok(stmts)
    })
}

pub(crate) fn layer_norm(
    l: &mut Lowerer,
    n: NodeId,
    axis: usize,
    eps: f32,
    out: &[u64],
    out_t: Elem,
    dsts: &[BufId],
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let scale = l.input(n, 1)?;
    let bias = if l.has_input(n, 2) {
        Some(l.input(n, 2)?)
    } else {
        None
    };
    let t = compute(elem(l.ty(x).dtype));
    let (outer, inner) = (out[..axis].to_vec(), out[axis..].to_vec());
    let (ss, bs) = (
        l.ty(scale).shape.clone(),
        bias.map(|v| l.ty(v).shape.clone()),
    );
    let dsts = dsts.to_vec();
    l.nest("i", &outer, |l, idx| {
        let at = |r: &[Expr]| [idx, r].concat();
        let (mut stmts, mean, inv) = moments(l, x, t, &inner, eps, &at)?;
        stmts.extend(l.nest("j", &inner, |l, r| {
            let xi = at(r);
            let mut y = Expr::bin(
                BinOp::Mul,
                Expr::bin(BinOp::Sub, get(l, x, &xi, t)?, mean.clone()),
                Expr::load(inv, vec![]),
            );
            y = Expr::bin(BinOp::Mul, y, get(l, scale, &broadcast(&ss, r), t)?);
            if let (Some(bv), Some(bs)) = (bias, &bs) {
                y = Expr::bin(BinOp::Add, y, get(l, bv, &broadcast(bs, r), t)?);
            }
            Ok(vec![Stmt::Store {
                buf: dsts[0],
                index: xi,
                value: convert(y, t, out_t),
            }])
        })?);
        // Optional outputs: mean and 1/std, shaped [outer..., 1, ...].
        let stat_idx: Vec<Expr> = idx
            .iter()
            .cloned()
            .chain(inner.iter().map(|_| Expr::int(0)))
            .collect();
        let st = |l: &Lowerer, o: usize| elem(l.g.node(n).outputs[o].dtype);
        if let Some(d) = dsts.get(1) {
            stmts.push(Stmt::Store {
                buf: *d,
                index: stat_idx.clone(),
                value: convert(mean.clone(), t, st(l, 1)),
            });
        }
        if let Some(d) = dsts.get(2) {
            stmts.push(Stmt::Store {
                buf: *d,
                index: stat_idx,
                value: convert(Expr::load(inv, vec![]), t, st(l, 2)),
            });
        }
        Ok(stmts)
    })
}

/// Mean and 1/sqrt(variance + eps) of `x` over `inner` (two passes: the mean, then squared
/// deviations), at the index `at(r)`; returns the statements, the mean and the local holding 1/std.
pub(crate) fn moments(
    l: &mut Lowerer,
    x: Value,
    t: Elem,
    inner: &[u64],
    eps: f32,
    at: &dyn Fn(&[Expr]) -> Vec<Expr>,
) -> Result<(Vec<Stmt>, Expr, BufId)> {
    let count: u64 = inner.iter().product();
    let s1 = fold_op(l, t, lit(0.0, t), inner, BinOp::Add, |l, r| {
        get(l, x, &at(r), t)
    })?;
    let mean = Expr::bin(BinOp::Div, s1.get(), lit(count as f64, t));
    let m = mean.clone();
    let s2 = fold_op(l, t, lit(0.0, t), inner, BinOp::Add, |l, r| {
        let d = Expr::bin(BinOp::Sub, get(l, x, &at(r), t)?, m.clone());
        Ok(Expr::bin(BinOp::Mul, d.clone(), d))
    })?;
    let mut stmts = s1.stmts;
    let var = Expr::bin(BinOp::Div, s2.get(), lit(count as f64, t));
    stmts.extend(s2.stmts);
    let inv =
        l.k.buf(format!("inv{}", l.k.bufs.len()), t, vec![], Space::Local);
    stmts.push(Stmt::Store {
        buf: inv,
        index: vec![],
        value: Expr::bin(
            BinOp::Div,
            lit(1.0, t),
            Expr::un(UnOp::Sqrt, Expr::bin(BinOp::Add, var, lit(eps as f64, t))),
        ),
    });
    Ok((stmts, mean, inv))
}

pub(crate) fn instance_norm(
    l: &mut Lowerer,
    n: NodeId,
    eps: f32,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (x, scale, bias) = (l.input(n, 0)?, l.input(n, 1)?, l.input(n, 2)?);
    let t = compute(elem(l.ty(x).dtype));
    let inner = out[2..].to_vec();
    l.nest("i", &out[..2], |l, idx| {
        let at = |r: &[Expr]| [idx, r].concat();
        let (mut stmts, mean, inv) = moments(l, x, t, &inner, eps, &at)?;
        let c = [idx[1].clone()];
        let (sc, bi) = (get(l, scale, &c, t)?, get(l, bias, &c, t)?);
        stmts.extend(l.nest("j", &inner, |l, r| {
            let xi = at(r);
            let y = Expr::bin(
                BinOp::Add,
                Expr::bin(
                    BinOp::Mul,
                    Expr::bin(
                        BinOp::Mul,
                        Expr::bin(BinOp::Sub, get(l, x, &xi, t)?, mean.clone()),
                        Expr::load(inv, vec![]),
                    ),
                    sc.clone(),
                ),
                bi.clone(),
            );
            Ok(vec![Stmt::Store {
                buf: dst,
                index: xi,
                value: convert(y, t, out_t),
            }])
        })?);
        Ok(stmts)
    })
}

/// softmax(q @ kt * scale + mask) @ v, one query row at a time: the row of scores lives in a local
/// buffer, so the [S, T] score matrix is never stored. This is the algorithm both targets' schedules
/// recognise (`mlopt-schedule/src/attention.rs`): in blocks of query rows with tiled products on a CPU, on tensor
/// cores with an online softmax on a GPU.
pub(crate) fn attention(
    l: &mut Lowerer,
    n: NodeId,
    scale: f32,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (q, kt, v) = (l.input(n, 0)?, l.input(n, 1)?, l.input(n, 2)?);
    let mask = if l.has_input(n, 3) {
        Some(l.input(n, 3)?)
    } else {
        None
    };
    let (qs, ks, vs) = (
        l.ty(q).shape.clone(),
        l.ty(kt).shape.clone(),
        l.ty(v).shape.clone(),
    );
    let ms = mask.map(|m| l.ty(m).shape.clone());
    let (d, tlen) = (ks[ks.len() - 2] as u64, ks[ks.len() - 1] as u64);
    let rank = out.len();
    let t = Elem::F32;
    let row = l.k.buf(
        format!("scores{}", l.k.bufs.len()),
        t,
        vec![tlen],
        Space::Local,
    );
    let mut outer = out.to_vec();
    outer.pop();
    l.nest("i", &outer, |l, idx| {
        let batch = &idx[..rank - 2];
        let i = idx[rank - 2].clone();
        let mut stmts = l.nest("j", &[tlen], |l, j| {
            let f = dot(l, &[d], |l, r| {
                let mut qi = broadcast(&qs[..qs.len() - 2], batch);
                qi.extend([i.clone(), r[0].clone()]);
                let mut ki = broadcast(&ks[..ks.len() - 2], batch);
                ki.extend([r[0].clone(), j[0].clone()]);
                Ok((get(l, q, &qi, t)?, get(l, kt, &ki, t)?))
            })?;
            let mut s = f.stmts.clone();
            let mut y = Expr::bin(BinOp::Mul, f.get(), lit(scale as f64, t));
            if let (Some(m), Some(ms)) = (mask, &ms) {
                let full: Vec<Expr> = batch
                    .iter()
                    .cloned()
                    .chain([i.clone(), j[0].clone()])
                    .collect();
                y = Expr::bin(BinOp::Add, y, get(l, m, &broadcast(ms, &full), t)?);
            }
            s.push(Stmt::Store {
                buf: row,
                index: vec![j[0].clone()],
                value: y,
            });
            Ok(s)
        })?;
        let m = fold_op(l, t, lowest(t), &[tlen], BinOp::Max, |_, r| {
            Ok(Expr::load(row, vec![r[0].clone()]))
        })?;
        let mx = m.get();
        stmts.extend(m.stmts);
        let s = fold_op(l, t, lit(0.0, t), &[tlen], BinOp::Add, |_, r| {
            Ok(Expr::un(
                UnOp::Exp,
                Expr::bin(BinOp::Sub, Expr::load(row, vec![r[0].clone()]), mx.clone()),
            ))
        })?;
        let sum = s.get();
        stmts.extend(s.stmts);
        stmts.extend(l.nest("j", &[tlen], |_, r| {
            Ok(vec![Stmt::Store {
                buf: row,
                index: vec![r[0].clone()],
                value: Expr::un(
                    UnOp::Exp,
                    Expr::bin(BinOp::Sub, Expr::load(row, vec![r[0].clone()]), mx.clone()),
                ),
            }])
        })?);
        stmts.extend(l.nest("e", &[out[rank - 1]], |l, e| {
            let f = dot(l, &[tlen], |l, r| {
                let mut vi = broadcast(&vs[..vs.len() - 2], batch);
                vi.extend([r[0].clone(), e[0].clone()]);
                Ok((Expr::load(row, vec![r[0].clone()]), get(l, v, &vi, t)?))
            })?;
            let mut s = f.stmts.clone();
            let oi: Vec<Expr> = idx.iter().cloned().chain([e[0].clone()]).collect();
            s.push(Stmt::Store {
                buf: dst,
                index: oi,
                value: convert(Expr::bin(BinOp::Div, f.get(), sum.clone()), t, out_t),
            });
            Ok(s)
        })?);
        Ok(stmts)
    })
}
