//! bf16 convolutions as kernel IR `mma` blocks (AMX tiles, or `vdpbf16ps` where there are none), one
//! block product per window tap, scheduled from the algorithm lowering writes (`class.rs`: a 2-D
//! convolution whose weight is a constant bf16 [M, C, KH, KW] and whose input is an f32 cast of bf16):
//!
//! ```text
//! for images..:                                          (parallel by the CPU schedule when it pays)
//!   xp[ph, h, q, c] = x[c, h - pad, q*s + ph - pad]      (bf16, zero outside the input; channels
//!                                                         innermost, padded to what the blocks
//!                                                         read; `s` phases along a strided row)
//!   for jb in 0..Mp/nb, oh in 0..OH, ob in 0..OWp/mb:
//!     for each tap (kh, kw):                             (the first sets the block, the rest add)
//!       mma<mb x nb x Cp> c += xp[(kw*d) % s, oh*s + kh*d, ob*mb + (kw*d) / s, 0..] * w_packed[kh, kw, jb]
//!     out[n, jb*nb + jj, oh, ob*mb + ii] = epilogue(c[ii, jj])   (ii innermost: along the output row)
//! ```
//!
//! A block's rows are `mb` consecutive output positions of one output row; at a tap their windows
//! start at `mb` consecutive positions of one phase of the copy, so the block's A is an [mb, C] slice of
//! the copy with its channels contiguous: no im2col, the copy holds the input once. Each tap's weights
//! [C, M] are packed in the pair-interleaved layout the blocks read (`mma.rs`). Before this, bf16
//! convolutions other than 1x1 ran as f32 register tiles from bf16 loads, no faster than fp32.

use super::mma::{bf16_at, pack, round_up};
use super::tiler::{self, Builder};
use crate::contraction::{store_at, Contraction};
use crate::error::Result;
use crate::gpu::gemm::narrow;
use crate::window::Window;
use mlopt_kir::index::{clamp, lit};
use mlopt_kir::{BinOp, Block, BufId, Elem, Expr, LoopKind, Place, Program, Space, Stmt, Var};
use mlopt_kir::{ScheduleStep, Weight};
use mlopt_target::CpuTarget;
use std::collections::HashMap;
use std::sync::Arc;

/// The `mma` form of convolution `c` with window `w` (its epilogue the one store `store`: buffer,
/// index, value), when it is a 2-D convolution by a constant bf16 weight read only here, over a bf16
/// input, whose input channels, output channels and output rows fill whole blocks within a third, a
/// half and a half (AMX tiles are 16 or 32 rows by 32 channels; `vdpbf16ps` takes any rows and channel
/// pairs). The weight is packed into a weight of its own that replaces it.
pub(crate) fn blocks(
    p: &mut Program,
    target: &CpuTarget,
    ki: usize,
    c: &Contraction,
    w: &Window,
    loads: &HashMap<BufId, usize>,
    store: (BufId, &[Expr], &Expr),
) -> Result<Option<Vec<Stmt>>> {
    let (&[(mv, m)], &[(ci, cin), (t0, kh_n), (t1, kw_n)], [ah, aw]) =
        (&c.rows[..], &c.red[..], &w.axes[..])
    else {
        return Ok(None);
    };
    if ah.tap != t0 || aw.tap != t1 {
        return Ok(None);
    }
    // The weight: f32(W[m, c, kh, kw]) of a bf16 constant read only here.
    let Expr::Cast(Elem::F32, wl) = &c.a else {
        return Ok(None);
    };
    let taps = kh_n * kw_n;
    let Some((wb, (si, pi, wi))) =
        super::layout::weight_read_at(p, ki, wl, &[mv, ci, t0, t1], loads)
    else {
        return Ok(None);
    };
    let weight = &p.weights[wi];
    if !super::layout::holds(weight, Elem::BF16, &[m, cin, kh_n, kw_n]) {
        return Ok(None);
    }
    let Some(input) = narrow(&p.kernels[ki], &w.input, Elem::BF16) else {
        return Ok(None);
    };
    // Blocks: output channels in 32 (within 15% of M) or 16 (`vdpbf16ps` covers 16 columns); on AMX
    // tiles, channels (K) in whole steps of 32 and a row's positions in blocks of 32 or 16; with
    // `vdpbf16ps`, K in pairs and a row in equal blocks of at most 32 positions. Too much padding and
    // the f32 tiles win.
    let ow = aw.outs;
    let nb = if 20 * round_up(m, 32) <= 23 * m {
        32
    } else {
        16
    };
    let (cp, mb) = match target.matrix() {
        Some(mlopt_target::MatrixUnit::Amx) => (round_up(cin, 32), if ow >= 32 { 32 } else { 16 }),
        Some(mlopt_target::MatrixUnit::Dot) => (round_up(cin, 2), ow.div_ceil(ow.div_ceil(32))),
        None => return Ok(None),
    };
    let (mp, owp) = (round_up(m, nb), round_up(ow, mb));
    if input.uses(mv) || 3 * cp > 4 * cin || 2 * owp > 3 * ow || 2 * mp > 3 * m {
        return Ok(None);
    }
    let (s, d) = (aw.stride as u64, aw.dilation as u64);
    let (hp, wq) = (ah.span as u64, owp + (kw_n - 1) * d / s);
    let outer = w.outer_loops(c);
    let images: u64 = outer.iter().map(|(_, e)| *e).product();
    let shape = (images * ah.outs * ow, m, cin * taps);
    // The copy reads the input's channels one plane apart: a gather.
    let copy = mlopt_cost::tile::BlockCopy::Gathered(images * s * hp * wq * cp);
    if !mlopt_cost::tile::bf16_block_pays(target, shape, cp, copy) {
        return Ok(None);
    }
    // Rows of the copy 512 bytes apart would put a block's 16 rows in few L1 sets.
    let stride = if (cp * 2).is_multiple_of(512) {
        cp + 32
    } else {
        cp
    };
    let packed = Weight {
        name: format!("{}.taps{nb}", weight.name),
        elem: Elem::BF16,
        dims: vec![taps, mp / nb, cp / 2, 2 * nb],
        // Per tap, a B of [C, M]: element (ch, j) is W[j, ch, tap].
        data: Arc::new(
            (0..taps)
                .flat_map(|t| {
                    let at = |ch: u64, j: u64| {
                        bf16_at(&weight.data, (j * cin + ch) * taps + t, j < m && ch < cin)
                    };
                    pack(&at, cp, mp, nb)
                })
                .collect(),
        ),
    };
    p.kernels[ki].bufs[wb.0 as usize].dims = packed.dims.clone();
    p.weights.push(packed);
    p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);

    let mut l = Builder {
        k: &mut p.kernels[ki],
        target,
    };
    let k = l.kernel();
    k.schedule.push(ScheduleStep::Matrix {
        mb,
        nb,
        kb: cp,
        m: ah.outs * ow,
        n: m,
        k: cin * taps,
    });
    let xp = k.buf(
        format!("xpc{}", k.bufs.len()),
        Elem::BF16,
        vec![s, hp, wq, stride],
        Space::Local,
    );
    let name = k.buffer(xp).name.clone();
    k.schedule.push(ScheduleStep::Pad {
        buf: name,
        phases: s,
    });
    let cblk = k.buf(
        format!("c_blk{}", k.bufs.len()),
        Elem::F32,
        vec![mb, nb],
        Space::Local,
    );
    let outer_ext: Vec<u64> = outer.iter().map(|(_, e)| *e).collect();
    let acc = c.acc;
    let stmts = tiler::nest(&mut l, "g", &outer_ext, |l, ng| {
        let images: Vec<(Var, Expr)> = outer.iter().map(|(v, _)| *v).zip(ng.to_vec()).collect();
        // The copy: xp[ph, h, q, ch] = x at (h - pad_h, q*s + ph - pad_w), channel ch.
        let fill = tiler::nest(l, "x", &[s, hp, wq, cp], |_, ix| {
            let (ph, h, q, ch) = (&ix[0], &ix[1], &ix[2], &ix[3]);
            let hi = Expr::sub(h.clone(), Expr::int(ah.pad));
            let wi = Expr::sub(
                Expr::add(Expr::mul(q.clone(), Expr::int(s as i64)), ph.clone()),
                Expr::int(aw.pad),
            );
            let lt = |a: &Expr, n: i64| Expr::bin(BinOp::Lt, a.clone(), Expr::int(n));
            let le0 = |a: &Expr| Expr::bin(BinOp::Le, Expr::int(0), a.clone());
            let inside = [le0(&hi), lt(&hi, ah.len), le0(&wi), lt(&wi, aw.len)]
                .into_iter()
                .fold(lt(ch, cin as i64), |a, b| Expr::bin(BinOp::And, a, b));
            let pos = [clamp(hi, ah.len), clamp(wi, aw.len)];
            let x = w
                .input_at(&input, &pos)
                .subst_all(&images)
                .subst(ci, &clamp(ch.clone(), cin as i64));
            Ok(vec![Stmt::Store {
                buf: xp,
                index: ix.to_vec(),
                value: Expr::select(inside, x, lit(w.fill, Elem::BF16)),
            }])
        })?;
        let (jb, oh, ob) = (l.fresh("jb"), l.fresh("oh"), l.fresh("ob"));
        let (tv, ii, jj) = (l.fresh("tap"), l.fresh("ii"), l.fresh("jj"));
        // One tap's block product (`t` the tap's number).
        let mma = |t: Expr, acc: bool| {
            let (kh, kw) = (
                Expr::div(t.clone(), Expr::int(kw_n as i64)),
                Expr::rem(t.clone(), Expr::int(kw_n as i64)),
            );
            let kwd = Expr::mul(kw, Expr::int(d as i64));
            Stmt::Mma {
                m: mb,
                n: nb,
                k: cp,
                c: Block {
                    buf: cblk,
                    at: vec![Expr::int(0), Expr::int(0)],
                },
                a: Block {
                    buf: xp,
                    at: vec![
                        Expr::rem(kwd.clone(), Expr::int(s as i64)),
                        Expr::add(
                            Expr::mul(Expr::var(oh), Expr::int(ah.stride)),
                            Expr::mul(kh, Expr::int(ah.dilation)),
                        ),
                        Expr::add(
                            Expr::mul(Expr::var(ob), Expr::int(mb as i64)),
                            Expr::div(kwd, Expr::int(s as i64)),
                        ),
                        Expr::int(0),
                    ],
                },
                b: Block {
                    buf: wb,
                    at: vec![t, Expr::var(jb), Expr::int(0), Expr::int(0)],
                },
                acc,
            }
        };
        let (pos, ch) = (
            Expr::add(
                Expr::mul(Expr::var(ob), Expr::int(mb as i64)),
                Expr::var(ii),
            ),
            Expr::add(
                Expr::mul(Expr::var(jb), Expr::int(nb as i64)),
                Expr::var(jj),
            ),
        );
        let by: Vec<(Var, Expr)> = images
            .iter()
            .cloned()
            .chain([
                (mv, ch.clone()),
                (ah.out, Expr::var(oh)),
                (aw.out, pos.clone()),
            ])
            .collect();
        let st = store_at(
            store,
            acc,
            &by,
            &Expr::load(cblk, vec![Expr::var(ii), Expr::var(jj)]),
        );
        let tail = l.fresh("ii");
        let epilogue = super::mma::epilogue(
            st,
            super::mma::Epilogue::RowsInner,
            (ii, &pos, mb, ow, &Expr::var(ob)),
            (jj, &ch, nb, m, &Expr::var(jb)),
            tail,
        );
        let mut block = vec![mma(Expr::int(0), false)];
        if taps > 1 {
            let t = Expr::add(Expr::var(tv), Expr::int(1));
            block.push(Stmt::for_(
                tv,
                taps - 1,
                LoopKind::Serial,
                vec![mma(t, true)],
            ));
        }
        block.push(epilogue);
        let nest = Stmt::for_(
            jb,
            mp / nb,
            LoopKind::Serial,
            vec![Stmt::for_(
                oh,
                ah.outs,
                LoopKind::Serial,
                vec![Stmt::for_(ob, owp / mb, LoopKind::Serial, block)],
            )],
        );
        Ok([fill, vec![nest]].concat())
    })?;
    Ok(Some(stmts))
}
