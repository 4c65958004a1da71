//! Attention for a CPU target, scheduled from the algorithm lowering writes (`attention.rs` recognises
//! it): two register-tiled contractions per block of query rows, the block's scores in a local buffer
//! that stays in L2:
//!
//! ```text
//! for each head (parallel):  K^T and V as contiguous panels (copied only when they are not)
//!   for each block of R query rows:
//!     S[R, T] = Q[R, D] K^T[D, T] * scale (+ mask)      tiled, B = K^T
//!     S[r, :] = exp(S[r, :] - max), sum[r] = sum of S[r, :]
//!     O[R, E] = S[R, T] V[T, E] / sum                   tiled, A = S
//! ```
//!
//! Blocks hold about 128 KiB of scores, all of one size but the last.
//!
//! bf16 attention (q, k and v bf16) runs both products as `mma` blocks (`mma.rs`) where the CPU's bf16
//! matrix unit pays: K^T and V packed per head into the blocks' pair layout, each block of 32 query
//! rows copied as A, the scores and the softmax in f32, its numerators rounded to bf16 as the second
//! product's A (zeros past the keys), the sums taken over the rounded numerators.

use super::mma;
use super::tiler::{self, Builder, Tile};
use crate::attention::Attention;
use crate::error::Result;
use crate::gpu::gemm::narrow;
use mlopt_cost::tile::BlockCopy;
use mlopt_kir::analysis::{coefficient, flat_index};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt, UnOp, Var};

/// The blocked form of attention `a`, its tiles from `t_for(m, n, k)`, on `mma` blocks where `mma`
/// allows them and they pay; None when either product has no tile.
pub(crate) fn tiled(
    b: &mut Builder,
    a: &Attention,
    t_for: &dyn Fn(u64, u64, u64) -> Option<Tile>,
    mma: bool,
) -> Result<Option<Vec<Stmt>>> {
    let (slen, tlen, d, elen) = (a.row.1, a.keys, a.d, a.dv);
    if slen == 0 || tlen == 0 || d == 0 || elen == 0 {
        return Ok(None);
    }
    if mma {
        if let Some(stmts) = in_blocks(b, a)? {
            return Ok(Some(stmts));
        }
    }
    // Blocks of about 128 KiB of scores, of equal size: ceil(S / blocks) rows, the last block shorter.
    let blocks = (slen * tlen * 4).div_ceil(128 << 10).clamp(1, slen);
    let rows = slen.div_ceil(blocks);
    let (Some(ts), Some(to)) = (t_for(rows, tlen, d), t_for(rows, elen, tlen)) else {
        return Ok(None);
    };
    let stmts = per_head(b, a, (&a.q, &a.kt, &a.v), |b, h| {
        let Head { q, kt, v, mask, .. } = h;
        let mut stmts = Vec::new();
        let kp = head_operand(b, kt, (a.r, d), (a.j, tlen), &mut stmts)?;
        let vp = head_operand(b, v, (a.jv, tlen), (a.e, elen), &mut stmts)?;
        let k = b.kernel();
        let scores = k.buf(
            format!("scores{}", k.bufs.len()),
            Elem::F32,
            vec![rows, tlen],
            Space::Local,
        );
        let sums = k.buf(
            format!("sums{}", k.bufs.len()),
            Elem::F32,
            vec![rows],
            Space::Local,
        );
        let block = |b: &mut Builder, row0: Expr, rows: u64| -> Result<Vec<Stmt>> {
            let qrow = |i: &Expr| Expr::add(row0.clone(), i.clone());
            let mut s = tiler::tiled(
                b,
                &[],
                rows,
                tlen,
                &[d],
                ts,
                (tiler::AForm::InPlace, tiler::BForm::InPlace),
                &mut |_, _, i, k| Ok(q.subst(a.row.0, &qrow(i)).subst(a.r, &k[0])),
                &mut |_, _, _, k, c| {
                    Ok(match kp {
                        Some(p) => Expr::load(p, vec![k[0].clone(), c.j.clone()]),
                        None => kt.subst(a.r, &k[0]).subst(a.j, &c.j),
                    })
                },
                &mut |_, _, i, j, acc| {
                    let mut y = Expr::bin(BinOp::Mul, acc, a.scale.clone());
                    if let Some(m) = &mask {
                        y = Expr::bin(BinOp::Add, y, m.subst(a.row.0, &qrow(i)).subst(a.j, j));
                    }
                    Ok(Stmt::Store {
                        buf: scores,
                        index: vec![i.clone(), j.clone()],
                        value: y,
                    })
                },
            )?;
            s.extend(tiler::nest(b, "r", &[rows], |b, r| {
                Ok(softmax_row(b, (scores, scores), sums, &r[0], tlen))
            })?);
            s.extend(tiler::tiled(
                b,
                &[],
                rows,
                elen,
                &[tlen],
                to,
                (tiler::AForm::InPlace, tiler::BForm::InPlace),
                &mut |_, _, i, k| Ok(Expr::load(scores, vec![i.clone(), k[0].clone()])),
                &mut |_, _, _, k, c| {
                    Ok(match vp {
                        Some(p) => Expr::load(p, vec![k[0].clone(), c.j.clone()]),
                        None => v.subst(a.jv, &k[0]).subst(a.e, &c.j),
                    })
                },
                &mut |_, _, i, j, acc| {
                    let sum = Expr::load(sums, vec![i.clone()]);
                    Ok(h.output(a, &qrow(i), j, acc, sum))
                },
            )?);
            Ok(s)
        };
        stmts.extend(row_blocks(b, rows, slen, &block)?);
        Ok(stmts)
    })?;
    Ok(Some(stmts))
}

/// One head's operands (the batch loops replaced by the head's indices) and the nest's output store.
struct Head {
    q: Expr,
    kt: Expr,
    v: Expr,
    mask: Option<Expr>,
    store: Stmt,
}

impl Head {
    /// The output's store at query row `row` and value column `j`: the nest's own store of the
    /// weighted sum `acc` over the sum of the exponentials `sum`.
    fn output(&self, a: &Attention, row: &Expr, j: &Expr, acc: Expr, sum: Expr) -> Stmt {
        let at = |e: &Expr| e.subst(a.row.0, row).subst(a.e, j);
        let Stmt::Store { buf, index, value } = &self.store else {
            unreachable!("the recogniser's store is a store")
        };
        Stmt::Store {
            buf: *buf,
            index: index.iter().map(at).collect(),
            value: at(value).map_loads(&|x, ix| match x {
                x if x == a.acc_o => acc.clone(),
                x if x == a.acc_l => sum.clone(),
                x => Expr::load(x, ix),
            }),
        }
    }
}

/// `body` for each head of attention `a` (inside its batch loops), given q, kt and v as it reads them.
fn per_head(
    b: &mut Builder,
    a: &Attention,
    (q, kt, v): (&Expr, &Expr, &Expr),
    body: impl FnOnce(&mut Builder, &Head) -> Result<Vec<Stmt>>,
) -> Result<Vec<Stmt>> {
    let batch: Vec<u64> = a.batch.iter().map(|(_, e)| *e).collect();
    tiler::nest(b, "h", &batch, |b, bi| {
        let by: Vec<(Var, Expr)> = a
            .batch
            .iter()
            .map(|(v, _)| *v)
            .zip(bi.iter().cloned())
            .collect();
        let at = |e: &Expr| e.subst_all(&by);
        let head = Head {
            q: at(q),
            kt: at(kt),
            v: at(v),
            mask: a.mask.as_ref().map(at),
            store: a.store.subst_all(&by),
        };
        body(b, &head)
    })
}

/// A block of query rows' statements, from its first row and its number of rows.
type Block<'a> = dyn Fn(&mut Builder, Expr, u64) -> Result<Vec<Stmt>> + 'a;

/// `block(b, first row, rows)` over `slen` query rows in blocks of `rows`: a loop over the whole
/// blocks, then the shorter last one.
fn row_blocks(b: &mut Builder, rows: u64, slen: u64, block: &Block) -> Result<Vec<Stmt>> {
    let (full, tail) = (slen / rows, slen % rows);
    let mut stmts = tiler::nest(b, "blk", &[full], |b, blk| {
        block(b, Expr::mul(blk[0].clone(), Expr::int(rows as i64)), rows)
    })?;
    if tail > 0 {
        stmts.extend(block(b, Expr::int((full * rows) as i64), tail)?);
    }
    Ok(stmts)
}

/// Row `i` of a block's scores through the softmax's numerator into `p` (the scores themselves, or a
/// bf16 copy), its sum into `sums[i]`: `m = max S[i, :]; P[i, :] = e^(S[i, :] - m); sums[i] = sum
/// P[i, :]` (folds rfactor vectorises; a bf16 P's sum is of the rounded values its product reads).
fn softmax_row(
    b: &mut Builder,
    (scores, p): (BufId, BufId),
    sums: BufId,
    i: &Expr,
    keys: u64,
) -> Vec<Stmt> {
    let at = |j: Var| Expr::load(scores, vec![i.clone(), Expr::var(j)]);
    let pe = b.kernel().buffer(p).elem;
    let at_p = |j: Var| {
        mlopt_kir::index::convert(Expr::load(p, vec![i.clone(), Expr::var(j)]), pe, Elem::F32)
    };
    let k = b.kernel();
    let m = k.buf(
        format!("max{}", k.bufs.len()),
        Elem::F32,
        vec![],
        Space::Local,
    );
    let sum = k.buf(
        format!("sum{}", k.bufs.len()),
        Elem::F32,
        vec![],
        Space::Local,
    );
    let (rm, j, rs) = (b.fresh("r"), b.fresh("j"), b.fresh("r"));
    let (mv, sv) = (Expr::load(m, vec![]), Expr::load(sum, vec![]));
    vec![
        Stmt::Store {
            buf: m,
            index: vec![],
            value: Expr::f32(f64::NEG_INFINITY),
        },
        Stmt::for_(
            rm,
            keys,
            mlopt_kir::LoopKind::Serial,
            vec![Stmt::Store {
                buf: m,
                index: vec![],
                value: Expr::bin(BinOp::Max, mv.clone(), at(rm)),
            }],
        ),
        Stmt::for_(
            j,
            keys,
            mlopt_kir::LoopKind::Serial,
            vec![Stmt::Store {
                buf: p,
                index: vec![i.clone(), Expr::var(j)],
                value: mlopt_kir::index::convert(
                    Expr::un(UnOp::Exp, Expr::bin(BinOp::Sub, at(j), mv)),
                    Elem::F32,
                    pe,
                ),
            }],
        ),
        Stmt::Store {
            buf: sum,
            index: vec![],
            value: Expr::f32(0.0),
        },
        Stmt::for_(
            rs,
            keys,
            mlopt_kir::LoopKind::Serial,
            vec![Stmt::Store {
                buf: sum,
                index: vec![],
                value: Expr::bin(BinOp::Add, sv.clone(), at_p(rs)),
            }],
        ),
        Stmt::Store {
            buf: sums,
            index: vec![i.clone()],
            value: sv,
        },
    ]
}

/// Attention `a` on `mma` blocks, when q, k and v are bf16 and blocks pay for both products on this
/// CPU (see the module comment); None otherwise.
fn in_blocks(b: &mut Builder, a: &Attention) -> Result<Option<Vec<Stmt>>> {
    let (slen, tlen, d, elen) = (a.row.1, a.keys, a.d, a.dv);
    let k = b.kernel();
    let (Some(q), Some(kt), Some(v)) = (
        narrow(k, &a.q, Elem::BF16),
        narrow(k, &a.kt, Elem::BF16),
        narrow(k, &a.v, Elem::BF16),
    ) else {
        return Ok(None);
    };
    let t = b.target;
    let rows = slen.min(32);
    // Both products, the first with its A (a block of q) copied from contiguous rows.
    let (_, nbs, mps, nps, kps) = mma::blocks(t, mma::Pairs::Bf16, rows, tlen, d);
    let (_, nbo, mpo, npo, kpo) = mma::blocks(t, mma::Pairs::Bf16, rows, elen, tlen);
    if d < 16
        || elen < 16
        || !mlopt_cost::tile::bf16_block_pays(
            t,
            (slen, tlen, d),
            (kps, kps),
            BlockCopy::Streamed(slen * d),
        )
        || !mlopt_cost::tile::bf16_block_pays(t, (slen, elen, tlen), (kpo, kpo), BlockCopy::None)
    {
        return Ok(None);
    }
    let stmts = per_head(b, a, (&q, &kt, &v), |b, h| {
        let Head { q, kt, v, mask, .. } = h;
        let k = b.kernel();
        let mut local = |name: &str, elem, dims| {
            k.buf(format!("{name}{}", k.bufs.len()), elem, dims, Space::Local)
        };
        let kb = local("k_pack", Elem::BF16, vec![nps / nbs, kps / 2, 2 * nbs]);
        let vb = local("v_pack", Elem::BF16, vec![npo / nbo, kpo / 2, 2 * nbo]);
        // The scores take the first product's blocks whole (their padding included).
        let scores = local("scores", Elem::F32, vec![mps, nps]);
        let p = local("p", Elem::BF16, vec![mpo, mma::row_stride(kpo)]);
        let sums = local("sums", Elem::F32, vec![rows]);
        // K^T as B of the scores (d deep, a column per key), V as B of the output (a column per value).
        let mut stmts = mma::pack_columns(b, kb, (tlen, d), &|j, r| kt.subst(a.r, r).subst(a.j, j));
        stmts.extend(mma::pack_columns(b, vb, (elen, tlen), &|e, r| {
            v.subst(a.jv, r).subst(a.e, e)
        }));
        // P's columns past the keys are the second product's K padding: zero once per head.
        if kpo > tlen {
            stmts.extend(tiler::nest(b, "z", &[mpo, kpo - tlen], |_, ix| {
                Ok(vec![Stmt::Store {
                    buf: p,
                    index: vec![
                        ix[0].clone(),
                        Expr::add(ix[1].clone(), Expr::int(tlen as i64)),
                    ],
                    value: mlopt_kir::index::lit(0.0, Elem::BF16),
                }])
            })?);
        }
        let block = |b: &mut Builder, row0: Expr, n: u64| -> Result<Vec<Stmt>> {
            let qrow = |i: &Expr| Expr::add(row0.clone(), i.clone());
            let mp = mma::blocks(b.target, mma::Pairs::Bf16, n, tlen, d).2;
            let (qa, mut s) =
                mma::a_operand(b, mma::Pairs::Bf16, (n, mp), (d, kps), &mut |_, i, r| {
                    Ok(q.subst(a.row.0, &qrow(i)).subst(a.r, r))
                })?;
            s.extend(mma::block_loops(
                b,
                qa,
                kb,
                (n, tlen, d),
                mma::Out::Into(scores),
            )?);
            let unscaled = matches!(a.scale, Expr::Float(x, _) if x == 1.0);
            s.extend(tiler::nest(b, "r", &[n], |b, r| {
                let i = &r[0];
                let mut row = vec![];
                // The scale and the mask, where there are any, in place before the softmax reads them.
                if !unscaled || mask.is_some() {
                    row.extend(tiler::nest(b, "j", &[tlen], |_, j| {
                        let j = &j[0];
                        let at = Expr::load(scores, vec![i.clone(), j.clone()]);
                        let mut y = Expr::bin(BinOp::Mul, at, a.scale.clone());
                        if let Some(m) = &mask {
                            y = Expr::bin(BinOp::Add, y, m.subst(a.row.0, &qrow(i)).subst(a.j, j));
                        }
                        Ok(vec![Stmt::Store {
                            buf: scores,
                            index: vec![i.clone(), j.clone()],
                            value: y,
                        }])
                    })?);
                }
                row.extend(softmax_row(b, (scores, p), sums, i, tlen));
                Ok(row)
            })?);
            // A short block's rows past its queries: zeros, so its padded product reads no stale rows.
            let mpo = mma::blocks(b.target, mma::Pairs::Bf16, n, elen, tlen).2;
            if mpo > n {
                s.extend(tiler::nest(b, "z", &[mpo - n, tlen], |_, ix| {
                    Ok(vec![Stmt::Store {
                        buf: p,
                        index: vec![Expr::add(ix[0].clone(), Expr::int(n as i64)), ix[1].clone()],
                        value: mlopt_kir::index::lit(0.0, Elem::BF16),
                    }])
                })?);
            }
            s.extend(mma::block_loops(
                b,
                p,
                vb,
                (n, elen, tlen),
                mma::Out::Epilogue(
                    super::mma_epilogue::Epilogue::ColumnsInner,
                    &mut |_, i, j, acc| {
                        let sum = Expr::load(sums, vec![i.clone()]);
                        Ok(h.output(a, &qrow(i), j, acc, sum))
                    },
                ),
            )?);
            Ok(s)
        };
        stmts.extend(row_blocks(b, rows, slen, &block)?);
        Ok(stmts)
    })?;
    Ok(Some(stmts))
}

/// Operand `x` of one head as a [rows, cols] matrix over loops `r` and `c`: None when its loads are
/// contiguous along the columns (the tiles read it in place), else a local copy made once per head (a
/// transposed K read directly would make every vector load of the tiles a gather).
fn head_operand(
    b: &mut Builder,
    x: &Expr,
    (r, rows): (Var, u64),
    (c, cols): (Var, u64),
    stmts: &mut Vec<Stmt>,
) -> Result<Option<BufId>> {
    let k = b.kernel();
    if matches!(x, Expr::Load(buf, ix) if coefficient(&flat_index(k, *buf, ix), c) == Some(1)) {
        return Ok(None);
    }
    let copy = k.buf(
        format!("panel{}", k.bufs.len()),
        Elem::F32,
        vec![rows, cols],
        Space::Local,
    );
    stmts.extend(tiler::nest(b, "p", &[rows, cols], |_, ix| {
        Ok(vec![Stmt::Store {
            buf: copy,
            index: ix.to_vec(),
            value: x.subst(r, &ix[0]).subst(c, &ix[1]),
        }])
    })?);
    Ok(Some(copy))
}
