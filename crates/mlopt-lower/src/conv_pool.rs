//! The algorithms of the sliding-window ops: convolutions (one output element per iteration, folding the
//! input channels and the window's taps over a guarded, clamped window of the input, which a schedule
//! tiles as an implicit GEMM, Winograd or `mma` blocks; transposed) and pooling (max, average, Lp, with
//! max-pool indices).

use crate::elementwise::{compute, elem};
use crate::error::Result;
use crate::kernel::Lowerer;
use crate::nests::*;
use mlopt_ir::{NodeId, Value};
use mlopt_kir::index::window_pos;
use mlopt_kir::index::{all, clamp, in_range};
use mlopt_kir::index::{convert, lit};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt, UnOp};

pub(crate) fn conv(
    l: &mut Lowerer,
    n: NodeId,
    a: &mlopt_ir::ConvAttrs,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (x, w) = (l.input(n, 0)?, l.input(n, 1)?);
    let bias = if l.has_input(n, 2) {
        Some(l.input(n, 2)?)
    } else {
        None
    };
    let xs = l.ty(x).shape.clone();
    let ws = l.ty(w).shape.clone();
    let sp = xs.len() - 2;
    let (m, cg) = (ws[0] as i64, ws[1] as i64);
    let mg = m / a.group as i64;
    let mut red = vec![cg as u64];
    red.extend(ws[2..].iter().map(|d| *d as u64));
    // The loops: image, (group, output channel in the group,) output position. With groups, the
    // channel loop is split, so a group's contraction has its own rows: the output channels, which only
    // the weight reads (a CPU schedule tiles it as an implicit GEMM, `mlopt-schedule/src/cpu/conv.rs`).
    let grouped = a.group > 1;
    let mut loops = vec![out[0]];
    loops.extend(if grouped {
        vec![a.group as u64, mg as u64]
    } else {
        vec![m as u64]
    });
    loops.extend(&out[2..]);
    let a = a.clone();
    l.nest("i", &loops, |l, ix| {
        let (g, mo, at) = match grouped {
            true => (
                ix[1].clone(),
                Expr::add(Expr::mul(ix[1].clone(), Expr::int(mg)), ix[2].clone()),
                &ix[3..],
            ),
            false => (Expr::int(0), ix[1].clone(), &ix[2..]),
        };
        let idx: Vec<Expr> = [vec![ix[0].clone(), mo.clone()], at.to_vec()].concat();
        let nb = ix[0].clone();
        let t = sum_type(out_t);
        let f = dot_in(l, t, &red, |l, r| {
            let c = Expr::add(Expr::mul(g.clone(), Expr::int(cg)), r[0].clone());
            let pos: Vec<Expr> = (0..sp)
                .map(|s| window_pos(&at[s], &r[1 + s], a.strides[s], a.dilations[s], a.pads[s]))
                .collect();
            // Only axes whose windows can leave the input are tested and clamped.
            let leaves: Vec<bool> = (0..sp)
                .map(|s| {
                    window_leaves(
                        out[2 + s],
                        ws[2 + s] as u64,
                        a.strides[s],
                        a.dilations[s],
                        a.pads[s],
                        xs[2 + s] as u64,
                    )
                })
                .collect();
            let inside = all((0..sp)
                .filter(|s| leaves[*s])
                .map(|s| in_range(pos[s].clone(), xs[2 + s] as i64)));
            let mut xi = vec![nb.clone(), c];
            xi.extend(pos.into_iter().enumerate().map(|(s, p)| {
                if leaves[s] {
                    clamp(p, xs[2 + s] as i64)
                } else {
                    p
                }
            }));
            let mut wi = vec![mo.clone(), r[0].clone()];
            wi.extend(r[1..].iter().cloned());
            let xv = get(l, x, &xi, t)?;
            let xv = match inside {
                Some(c) => Expr::select(c, xv, lit(0.0, t)),
                None => xv,
            };
            Ok((xv, get(l, w, &wi, t)?))
        })?;
        store_with_bias(l, (&f, t), bias, &mo, &idx, (dst, out_t))
    })
}

/// A convolution's fold (summed in `t`), then its output element: the sum plus the channel's bias, in
/// the output type.
pub(crate) fn store_with_bias(
    l: &mut Lowerer,
    (f, t): (&Fold, Elem),
    bias: Option<Value>,
    channel: &Expr,
    idx: &[Expr],
    (dst, out_t): (BufId, Elem),
) -> Result<Vec<Stmt>> {
    let mut s = f.stmts.clone();
    let mut y = f.get();
    if let Some(bv) = bias {
        y = Expr::bin(BinOp::Add, y, get(l, bv, std::slice::from_ref(channel), t)?);
    }
    s.push(Stmt::Store {
        buf: dst,
        index: idx.to_vec(),
        value: convert(y, t, out_t),
    });
    Ok(s)
}

/// ConvTranspose as a gather: output position `o` takes input position `i` through tap `k` when
/// `o = i * stride + k * dilation - pad`, so each output element sums, over its group's input channels
/// and every tap, the input at `(o + pad - k * dilation) / stride` where that divides exactly and lands
/// inside the input. W is [C_in, C_out / group, k...].
pub(crate) fn conv_transpose(
    l: &mut Lowerer,
    n: NodeId,
    a: &mlopt_ir::ConvAttrs,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (x, w) = (l.input(n, 0)?, l.input(n, 1)?);
    let bias = if l.has_input(n, 2) {
        Some(l.input(n, 2)?)
    } else {
        None
    };
    let xs: Vec<i64> = l.ty(x).shape.iter().map(|d| *d as i64).collect();
    let ws = l.ty(w).shape.clone();
    let sp = xs.len() - 2;
    let (cin_g, cout_g) = (xs[1] / a.group as i64, ws[1] as i64);
    let mut red = vec![cin_g as u64];
    red.extend(ws[2..].iter().map(|d| *d as u64));
    let a = a.clone();
    l.nest("i", out, |l, idx| {
        let (nb, mo) = (idx[0].clone(), idx[1].clone());
        let g = Expr::div(mo.clone(), Expr::int(cout_g));
        let f = dot(l, &red, |l, r| {
            let c = Expr::add(Expr::mul(g.clone(), Expr::int(cin_g)), r[0].clone());
            let num: Vec<Expr> = (0..sp)
                .map(|s| {
                    Expr::sub(
                        Expr::add(idx[2 + s].clone(), Expr::int(a.pads[s] as i64)),
                        Expr::mul(r[1 + s].clone(), Expr::int(a.dilations[s] as i64)),
                    )
                })
                .collect();
            let pos: Vec<Expr> = (0..sp)
                .map(|s| Expr::div(num[s].clone(), Expr::int(a.strides[s] as i64)))
                .collect();
            let exact = (0..sp).filter(|s| a.strides[*s] > 1).map(|s| {
                Expr::bin(
                    BinOp::Eq,
                    Expr::rem(num[s].clone(), Expr::int(a.strides[s] as i64)),
                    Expr::int(0),
                )
            });
            let inside = (0..sp).map(|s| {
                Expr::bin(
                    BinOp::And,
                    Expr::bin(BinOp::Le, Expr::int(0), num[s].clone()),
                    Expr::bin(BinOp::Lt, pos[s].clone(), Expr::int(xs[2 + s])),
                )
            });
            let valid = all(inside.chain(exact)).unwrap_or_else(|| lit(1.0, Elem::Bool));
            let mut xi = vec![nb.clone(), c.clone()];
            xi.extend(pos.into_iter().zip(&xs[2..]).map(|(p, len)| clamp(p, *len)));
            let mut wi = vec![c, Expr::rem(mo.clone(), Expr::int(cout_g))];
            wi.extend(r[1..].iter().cloned());
            let xv = get(l, x, &xi, Elem::F32)?;
            Ok((
                Expr::select(valid, xv, lit(0.0, Elem::F32)),
                get(l, w, &wi, Elem::F32)?,
            ))
        })?;
        store_with_bias(l, (&f, Elem::F32), bias, &mo, idx, (dst, out_t))
    })
}

pub(crate) fn pool_window(
    l: &mut Lowerer,
    n: NodeId,
    p: &mlopt_ir::PoolAttrs,
    max: bool,
    include_pad: bool,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let xs = l.ty(x).shape.clone();
    let sp = xs.len() - 2;
    let t = compute(elem(l.ty(x).dtype));
    let win: Vec<u64> = p.kernel.iter().map(|k| *k as u64).collect();
    let p = p.clone();
    // (On a CPU target the schedule reads an f32 window from a padded copy of each plane:
    // `mlopt-schedule/src/window.rs`.)
    l.nest("i", &out[..2], |l, nc| {
        let mut stmts = Vec::new();
        stmts.extend(l.nest("i", &out[2..], |l, at| {
            let idx = [nc.to_vec(), at.to_vec()].concat();
            let cnt =
                l.k.buf(format!("cnt{}", l.k.bufs.len()), t, vec![], Space::Local);
            let mut cnt_stmts = vec![Stmt::Store {
                buf: cnt,
                index: vec![],
                value: lit(0.0, t),
            }];
            let mut count_in = None;
            // Scalar: the window count is accumulated in the same innermost loop (add_to_innermost).
            let f = fold_op(
                l,
                t,
                if max { lowest(t) } else { lit(0.0, t) },
                &win,
                if max { BinOp::Max } else { BinOp::Add },
                |l, r| {
                    let pos: Vec<Expr> = (0..sp)
                        .map(|s| {
                            window_pos(&idx[2 + s], &r[s], p.strides[s], p.dilations[s], p.pads[s])
                        })
                        .collect();
                    let inside = all((0..sp).map(|s| in_range(pos[s].clone(), xs[2 + s] as i64)));
                    // Positions in the padding count for count_include_pad (the ceil-mode overhang does not).
                    let padded = all((0..sp).map(|s| {
                        Expr::bin(
                            BinOp::Lt,
                            pos[s].clone(),
                            Expr::int((xs[2 + s] + p.pads[sp + s]) as i64),
                        )
                    }));
                    let ok = inside.unwrap_or_else(|| lit(1.0, Elem::Bool));
                    count_in = Some(if include_pad {
                        padded.unwrap_or_else(|| lit(1.0, Elem::Bool))
                    } else {
                        ok.clone()
                    });
                    let mut xi = vec![idx[0].clone(), idx[1].clone()];
                    xi.extend((0..sp).map(|s| clamp(pos[s].clone(), xs[2 + s] as i64)));
                    let v = get(l, x, &xi, t)?;
                    Ok(Expr::select(
                        ok,
                        v,
                        if max { lowest(t) } else { lit(0.0, t) },
                    ))
                },
            )?;
            let mut s = f.stmts.clone();
            let y = if max {
                f.get()
            } else {
                // The count of window positions taken, accumulated in the same loops.
                let c = count_in.unwrap_or_else(|| lit(1.0, Elem::Bool));
                let inc = Stmt::Store {
                    buf: cnt,
                    index: vec![],
                    value: Expr::bin(
                        BinOp::Add,
                        Expr::load(cnt, vec![]),
                        Expr::select(c, lit(1.0, t), lit(0.0, t)),
                    ),
                };
                add_to_innermost(&mut s, inc);
                cnt_stmts.append(&mut s);
                s = cnt_stmts;
                Expr::bin(BinOp::Div, f.get(), Expr::load(cnt, vec![]))
            };
            s.push(Stmt::Store {
                buf: dst,
                index: idx.to_vec(),
                value: convert(y, t, out_t),
            });
            Ok(s)
        })?);
        Ok(stmts)
    })
}

/// Max pooling with the flat input index of each maximum (`Op::MaxPool`): the first position in the window
/// wins ties, a NaN wins over numbers, and a window entirely in the padding gives -inf at index -1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn max_pool_indices(
    l: &mut Lowerer,
    n: NodeId,
    p: &mlopt_ir::PoolAttrs,
    col_major: bool,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
    dst_at: BufId,
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let xs = l.ty(x).shape.clone();
    let sp = xs.len() - 2;
    let t = compute(elem(l.ty(x).dtype));
    let win: Vec<u64> = p.kernel.iter().map(|k| *k as u64).collect();
    let ins: Vec<i64> = xs[2..].iter().map(|d| *d as i64).collect();
    let plane: i64 = ins.iter().product();
    let channels = xs[1] as i64;
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
                value: lowest(t),
            },
            Stmt::Store {
                buf: at,
                index: vec![],
                value: Expr::int(-1),
            },
        ];
        stmts.extend(l.nest("r", &win, |l, r| {
            let pos: Vec<Expr> = (0..sp)
                .map(|s| window_pos(&idx[2 + s], &r[s], p.strides[s], p.dilations[s], p.pads[s]))
                .collect();
            let inside = all((0..sp).map(|s| in_range(pos[s].clone(), ins[s])))
                .unwrap_or_else(|| lit(1.0, Elem::Bool));
            let mut xi = vec![idx[0].clone(), idx[1].clone()];
            xi.extend((0..sp).map(|s| clamp(pos[s].clone(), ins[s])));
            let v = get(l, x, &xi, t)?;
            let (cur, cur_at) = (Expr::load(best, vec![]), Expr::load(at, vec![]));
            let nan = |e: Expr| Expr::bin(BinOp::Ne, e.clone(), e);
            let first = Expr::bin(BinOp::Lt, cur_at.clone(), Expr::int(0));
            let better = Expr::bin(
                BinOp::Or,
                Expr::bin(BinOp::Lt, cur.clone(), v.clone()),
                Expr::bin(
                    BinOp::And,
                    nan(v.clone()),
                    Expr::un(UnOp::Not, nan(cur.clone())),
                ),
            );
            let take = Expr::bin(BinOp::And, inside, Expr::bin(BinOp::Or, first, better));
            let spatial = if col_major {
                let (p, s): (Vec<Expr>, Vec<i64>) = (
                    pos.iter().rev().cloned().collect(),
                    ins.iter().rev().copied().collect(),
                );
                mlopt_kir::index::linear(&p, &s)
            } else {
                mlopt_kir::index::linear(&pos, &ins)
            };
            let flat = Expr::add(
                Expr::mul(
                    Expr::add(
                        Expr::mul(idx[0].clone(), Expr::int(channels)),
                        idx[1].clone(),
                    ),
                    Expr::int(plane),
                ),
                spatial,
            );
            Ok(take_if(l, take, &[(at, flat), (best, v)]))
        })?);
        stmts.push(Stmt::Store {
            buf: dst,
            index: idx.to_vec(),
            value: convert(Expr::load(best, vec![]), t, out_t),
        });
        stmts.push(Stmt::Store {
            buf: dst_at,
            index: idx.to_vec(),
            value: Expr::load(at, vec![]),
        });
        Ok(stmts)
    })
}

/// Whether the window positions `o * stride + k * dilation - pad` (o < outs, k < taps) can leave 0..len.
pub(crate) fn window_leaves(
    outs: u64,
    taps: u64,
    stride: usize,
    dilation: usize,
    pad: usize,
    len: u64,
) -> bool {
    let reach = (outs.max(1) - 1) * stride as u64 + (taps.max(1) - 1) * dilation as u64;
    pad > 0 || reach >= len
}
