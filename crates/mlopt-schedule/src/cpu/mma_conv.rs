//! bf16 convolutions as kernel IR `mma` blocks (AMX tiles, or `vdpbf16ps` where there are none), one
//! block product per window tap, scheduled from the algorithm lowering writes (`class.rs`: a 2-D or 1-D
//! convolution whose weight is a constant bf16 [M, C, KH, KW] or [M, C, KW] and whose input is an f32
//! cast of bf16; a 1-D one is a 2-D one of a single row):
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
//! the copy with its channels contiguous: no im2col, the copy holds the input once: the rows and phases
//! the taps read, so a single-row window (a 1x1 or 1xK kernel) copies only the rows its stride lands
//! on, and a single-column one only phase 0 (a strided 1x1 convolution copies the quarter of its input
//! it reads). Each tap's weights
//! [C, M] are packed in the pair-interleaved layout the blocks read (`mma.rs`). Before this, bf16
//! convolutions other than 1x1 ran as f32 register tiles from bf16 loads, no faster than fp32.

use super::mma::{bf16_at, pack, round_up, Pairs};
use super::tiler::{self, Builder};
use crate::contraction::{store_at, Contraction};
use crate::error::Result;
use crate::gpu::gemm::narrow;
use crate::window::Window;
use mlopt_kir::index::{clamp, lit};
use mlopt_kir::{BinOp, Block, BufId, Expr, LoopKind, Place, Program, Space, Stmt, Var};
use mlopt_kir::{ScheduleStep, Weight};
use mlopt_target::CpuTarget;
use std::collections::HashMap;
use std::sync::Arc;

/// The `mma` form of convolution `c` with window `w` (its epilogue the one store `store`: buffer,
/// index, value), when it is a 2-D or 1-D convolution by a constant bf16 weight read only here, over a bf16
/// input, whose output channels and output rows fill whole blocks within a half, and whose blocks,
/// K's padding to whole steps priced in, the cost model rates faster than f32 tiles (AMX tiles are
/// 16 or 32 rows by 32 channels; `vdpbf16ps` takes any rows and channel pairs). The weight is packed
/// into a weight of its own that replaces it.
pub(crate) fn blocks(
    p: &mut Program,
    target: &CpuTarget,
    ki: usize,
    c: &Contraction,
    w: &Window,
    loads: &HashMap<BufId, usize>,
    store: (BufId, &[Expr], &Expr),
) -> Result<Option<Vec<Stmt>>> {
    let (&[(mv, m)], &[(ci, cin), ref taps_at @ ..]) = (&c.rows[..], &c.red[..]) else {
        return Ok(None);
    };
    // The rows' axis (none for a 1-D convolution: one row of one tap) and the columns'.
    let (ah, aw, kh_n, kw_n) = match (taps_at, &w.axes[..]) {
        (&[(t0, kh), (t1, kw)], [ah, aw]) if ah.tap == t0 && aw.tap == t1 => (Some(ah), aw, kh, kw),
        (&[(t1, kw)], [aw]) if aw.tap == t1 => (None, aw, 1, kw),
        _ => return Ok(None),
    };
    let oh_n = ah.map_or(1, |a| a.outs);
    // The weight: f32(W[m, c, kh, kw]) of a bf16 constant read only here (i32 of an i16 one).
    let Some(pairs) = Pairs::of(c.sum) else {
        return Ok(None);
    };
    let Expr::Cast(sum, wl) = &c.a else {
        return Ok(None);
    };
    if *sum != pairs.sum() {
        return Ok(None);
    }
    let taps = kh_n * kw_n;
    let vars: Vec<Var> = [mv, ci]
        .into_iter()
        .chain(taps_at.iter().map(|(v, _)| *v))
        .collect();
    let Some((wb, (si, pi, wi))) = super::layout::weight_read_at(p, ki, wl, &vars, loads) else {
        return Ok(None);
    };
    let weight = &p.weights[wi];
    let dims: Vec<u64> = [m, cin]
        .into_iter()
        .chain(taps_at.iter().map(|(_, e)| *e))
        .collect();
    if !super::layout::holds(weight, pairs.operand(), &dims) {
        return Ok(None);
    }
    let Some(input) = narrow(&p.kernels[ki], &w.input, pairs.operand()) else {
        return Ok(None);
    };
    // Blocks: output channels in 32 (within 15% of M) or 16 (`vdpbf16ps` covers 16 columns); on AMX
    // tiles, channels (K) in whole steps of 32 and a row's positions in blocks of 32 or 16; with
    // `vdpbf16ps`, K in pairs and a row in equal blocks of at most 32 positions. Too much padding and
    // the f32 tiles win.
    // (i16 blocks: two accumulators of the dot product's lanes, `mma::blocks`.)
    let ow = aw.outs;
    let nb = match pairs.columns(target, m) {
        Some(nb) => nb,
        None if 20 * round_up(m, 32) <= 23 * m => 32,
        None => 16,
    };
    let (s, d) = (aw.stride as u64, aw.dilation as u64);
    // The copy's rows: one per output row where the window is one row (the rows its stride lands
    // on), else every row the windows reach.
    let (ah_stride, ah_dil, ah_pad, ah_len) =
        ah.map_or((1, 1, 0, 1), |a| (a.stride, a.dilation, a.pad, a.len));
    let hp = match ah {
        Some(a) if kh_n > 1 => a.span as u64,
        _ => oh_n,
    };
    let (kstep, row_mb) = match pairs.unit(target) {
        Some(mlopt_target::MatrixUnit::Amx) => (32, if ow >= 32 { 32 } else { 16 }),
        Some(mlopt_target::MatrixUnit::Dot) => (2, ow.div_ceil(ow.div_ceil(32))),
        None => return Ok(None),
    };
    let flat = Flat::pays(
        pairs.unit(target),
        (oh_n, ow, row_mb),
        (kh_n, kw_n),
        (ah_stride, s, d),
    );
    let (mb, owp) = match &flat {
        Some(f) => (f.mb, ow),
        None => (row_mb, round_up(ow, row_mb)),
    };
    let mp = round_up(m, nb);
    if input.uses(mv) || (flat.is_none() && 2 * owp > 3 * ow) || 2 * mp > 3 * m {
        return Ok(None);
    }
    let outer = w.outer_loops(c);
    let images: u64 = outer.iter().map(|(_, e)| *e).product();
    let shape = (images * oh_n * ow, m, cin * taps);
    // The copy's layout, plain or folded, whichever the cost model prices lower, K's padding to whole
    // block steps included (a 3-channel 7x7 stem: 3 of 32 channels plain, 21 of 32 folded).
    let plain = Copy::plain(cin, kw_n, s, d, owp, kstep, images * hp);
    let folded = Copy::folded(cin, kw_n, owp, kstep, images * hp);
    let cost = |x: &Copy| {
        let depth = (x.kp, x.kp * x.products(taps, kw_n));
        match pairs {
            Pairs::Bf16 => {
                mlopt_cost::tile::bf16_block_faster_s(target, shape, depth, x.gathered())
            }
            // (Nothing else sums i16 products fast: the copies' costs only choose a layout.)
            Pairs::I16 => {
                let (m, n, k) = shape;
                let padded = (m, n, depth.1.max(k));
                mlopt_cost::tile::i16_block_s(target, padded, depth.0, x.gathered())
            }
        }
    };
    // (Folded rows of 3 columns copy element by element, too short to vectorise: SqueezeNet's 3x3
    // stem ran 1.3x slower folded than in f32 tiles.)
    let (plain_s, folded_s) = (cost(&plain), cost(&folded));
    let fold = kw_n >= 4
        && flat.is_none()
        && match (plain_s, folded_s) {
            (Some(a), Some(b)) => b < a,
            (None, b) => b.is_some(),
            _ => false,
        };
    let (lay, pays) = match fold {
        true => (folded, folded_s),
        false => (plain, plain_s),
    };
    if pays.is_none() {
        return Ok(None);
    }
    let (cp, phases, wq, kw_e) = (lay.kp, lay.phases, lay.wq, lay.kw);
    let products = lay.products(taps, kw_n);
    // Rows of the copy 512 bytes apart would put a block's 16 rows in few L1 sets.
    let stride = if (cp * 2).is_multiple_of(512) {
        cp + 32
    } else {
        cp
    };
    let packed = Weight {
        name: format!("{}.taps{nb}", weight.name),
        elem: pairs.operand(),
        dims: vec![products, mp / nb, cp / 2, 2 * nb],
        // Per product, a B of [K, M]: element (kc, j) is W[j, ch, tap] for K's channel ch and tap:
        // kc itself and the product's tap, or, folded, channel kc / KW and column kc % KW of the
        // product's row of taps.
        data: Arc::new(
            (0..products)
                .flat_map(|t| {
                    let at = |kc: u64, j: u64| {
                        let (ch, tap) = if fold {
                            (kc / kw_n, t * kw_n + kc % kw_n)
                        } else {
                            (kc, t)
                        };
                        bf16_at(
                            &weight.data,
                            (j * cin + ch) * taps + tap,
                            j < m && kc < lay.k,
                        )
                    };
                    pack(&at, cp, mp, nb)
                })
                .collect(),
        ),
    };
    p.kernels[ki].bufs[wb.0 as usize].dims = packed.dims.clone();
    p.weights.push(packed);
    p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);

    // The packed weight's bytes: every tap's [C, M] panels.
    let streams = mlopt_cost::tile::weight_streams(target, taps * mp * cp * 2);
    let mut l = Builder {
        k: &mut p.kernels[ki],
        target,
    };
    let k = l.kernel();
    k.schedule.push(ScheduleStep::Matrix {
        mb,
        nb,
        kb: cp,
        m: oh_n * ow,
        n: m,
        k: cin * taps,
    });
    // Flat, each row phase of the copy is one run of positions (its row h's position q at h * wq +
    // q), with the rows the last blocks' taps read past the image.
    let (row_phases, hq) = flat.map_or((1, hp), |f| (f.row_phases, hp.div_ceil(f.row_phases)));
    let xp_rows = flat.map_or(hp * wq, |f| {
        let taps = f.copy_rows(wq, kh_n, ah_dil as u64, wq - owp);
        taps.max(hq * wq)
    });
    let xp_dims = match flat {
        Some(_) => vec![phases, row_phases, xp_rows, stride],
        None => vec![phases, hp, wq, stride],
    };
    let flat_row =
        |h: &Expr, q: &Expr| Expr::add(Expr::mul(h.clone(), Expr::int(wq as i64)), q.clone());
    let xp = k.buf(
        format!("xpc{}", k.bufs.len()),
        pairs.operand(),
        xp_dims,
        Space::Local,
    );
    let name = k.buffer(xp).name.clone();
    k.schedule.push(ScheduleStep::Pad {
        buf: name,
        phases: s,
    });
    // C: one block, or, flat, the sums of all the image's positions for a block of channels (each
    // block's tiles stored at its rows), which the epilogue then reads row by row.
    let cblk = k.buf(
        format!("c_blk{}", k.bufs.len()),
        pairs.sum(),
        vec![flat.map_or(mb, |f| f.rows), nb],
        Space::Local,
    );
    let outer_ext: Vec<u64> = outer.iter().map(|(_, e)| *e).collect();
    let acc = c.acc;
    let stmts = tiler::nest(&mut l, "g", &outer_ext, |l, ng| {
        let images: Vec<(Var, Expr)> = outer.iter().map(|(v, _)| *v).zip(ng.to_vec()).collect();
        // The copy, plain or folded (below).
        let mut fill = Vec::new();
        let lt = |a: &Expr, n: i64| Expr::bin(BinOp::Lt, a.clone(), Expr::int(n));
        let le0 = |a: &Expr| Expr::bin(BinOp::Le, Expr::int(0), a.clone());
        // Whether a row of the copy can lie outside the input (its padding, or rows past the end).
        let last_row = (hq * row_phases - 1) * if kh_n == 1 { ah_stride as u64 } else { 1 };
        let rows_test = ah_pad > 0 || last_row as i64 - ah_pad >= ah_len;
        // Position (h, q) at column `col` of the window in the input: whether it is inside (`first`
        // and the bounds, none where nothing can be outside; the row's only where `cols` is false,
        // the column known inside) and the input there.
        let at = |h: &Expr, q: &Expr, col: Expr, first: Option<Expr>, cols: bool| {
            let row = if kh_n == 1 {
                Expr::mul(h.clone(), Expr::int(ah_stride))
            } else {
                h.clone()
            };
            let hi = Expr::sub(row, Expr::int(ah_pad));
            let wi = Expr::sub(
                Expr::add(Expr::mul(q.clone(), Expr::int(s as i64)), col),
                Expr::int(aw.pad),
            );
            let and = |a: Expr, b: Expr| Expr::bin(BinOp::And, a, b);
            let mut tests = match rows_test {
                true => vec![le0(&hi), lt(&hi, ah_len)],
                false => vec![],
            };
            if cols {
                tests.extend([le0(&wi), lt(&wi, aw.len)]);
            }
            let inside = match first {
                Some(f) => Some(tests.into_iter().fold(f, and)),
                None => tests.into_iter().reduce(and),
            };
            let wi = if cols { clamp(wi, aw.len) } else { wi };
            let hi = if rows_test { clamp(hi, ah_len) } else { hi };
            let pos = match ah {
                Some(_) => vec![hi, wi],
                None => vec![wi],
            };
            (inside, w.input_at(&input, &pos).subst_all(&images))
        };
        // The input where inside, else the padding.
        let guarded = |inside: Option<Expr>, x: Expr| match inside {
            Some(t) => Expr::select(t, x, lit(w.fill, pairs.operand())),
            None => x,
        };
        if fold {
            // xp[0, h, q, ch * KW + kw] = x at (h - pad_h, q*s + kw*d - pad_w), channel ch: along
            // kw, a run of the input row; K's padding zero. One nest for the positions whose every
            // column is inside the row (no test, so the runs load whole) and one for each edge.
            let span = (kw_n - 1) * d;
            let first = (aw.pad as u64).div_ceil(s).min(wq);
            let end = ((aw.len as u64 + aw.pad as u64).saturating_sub(span))
                .div_ceil(s)
                .clamp(first, wq);
            for (from, to) in [(0, first), (first, end), (end, wq)] {
                if from == to {
                    continue;
                }
                let interior = from == first && to == end;
                // Each copy row whole before the next: its K padding zeroed in the same nest (a
                // pass of its own over the copy, after it, missed the caches on every row: a tenth
                // of ResNet-50's stem).
                fill.extend(tiler::nest(l, "x", &[hp, to - from], |l, hq| {
                    let h = &hq[0];
                    let q = &Expr::add(hq[1].clone(), Expr::int(from as i64));
                    let mut row = tiler::nest(l, "x", &[cin, kw_n], |_, ix| {
                        let (ch, kw) = (&ix[0], &ix[1]);
                        let col = Expr::mul(kw.clone(), Expr::int(d as i64));
                        let (inside, x) = at(h, q, col, None, !interior);
                        let x = x.subst(ci, ch);
                        let kc =
                            Expr::add(Expr::mul(ch.clone(), Expr::int(kw_n as i64)), kw.clone());
                        Ok(vec![Stmt::Store {
                            buf: xp,
                            index: vec![Expr::int(0), h.clone(), q.clone(), kc],
                            value: guarded(inside, x),
                        }])
                    })?;
                    if cp > lay.k {
                        row.extend(tiler::nest(l, "x", &[cp - lay.k], |_, ix| {
                            let kc = Expr::add(ix[0].clone(), Expr::int(lay.k as i64));
                            Ok(vec![Stmt::Store {
                                buf: xp,
                                index: vec![Expr::int(0), h.clone(), q.clone(), kc],
                                value: lit(0.0, pairs.operand()),
                            }])
                        })?);
                    }
                    Ok(row)
                })?);
            }
        }
        // Plain: xp[ph, h, q, ch] = x at (h - pad_h, q*s + ph - pad_w), channel ch (at h * stride_h
        // - pad_h where each of its rows is an output row's).
        // One nest per phase, so the guards on a position are tests on the loops alone, which the loop
        // passes partition into the padding and the interior (whose copy transposes rows of
        // positions into channels, `mlopt-llvm/src/transpose.rs`).
        // Flat with row phases, row phase rph's row h is the copy's row h * phases + rph.
        let phase_pairs = (0..phases).flat_map(|c| (0..row_phases).map(move |r| (c, r)));
        for (phase, rph) in phase_pairs.filter(|_| !fold) {
            fill.extend(tiler::nest(l, "x", &[hq, wq, cp], |_, ix| {
                let ph = &Expr::int(phase as i64);
                let (h, q, ch) = (&ix[0], &ix[1], &ix[2]);
                let row = match row_phases {
                    1 => h.clone(),
                    n => Expr::add(
                        Expr::mul(h.clone(), Expr::int(n as i64)),
                        Expr::int(rph as i64),
                    ),
                };
                let (inside, x) = at(&row, q, ph.clone(), Some(lt(ch, cin as i64)), true);
                let x = x.subst(ci, &clamp(ch.clone(), cin as i64));
                let index = match flat {
                    Some(_) => vec![
                        ph.clone(),
                        Expr::int(rph as i64),
                        flat_row(h, q),
                        ch.clone(),
                    ],
                    None => [vec![ph.clone()], ix.to_vec()].concat(),
                };
                Ok(vec![Stmt::Store {
                    buf: xp,
                    index,
                    value: guarded(inside, x),
                }])
            })?);
        }
        // Flat, the rows past the image's that the last blocks read: zeros (their sums are never
        // stored, but stale bits could be NaNs or denormals, which slow the tiles).
        let past = xp_rows - hq * wq;
        if flat.is_some() && past > 0 {
            fill.extend(tiler::nest(
                l,
                "x",
                &[phases, row_phases, past, cp],
                |_, ix| {
                    let row = Expr::add(ix[2].clone(), Expr::int((hq * wq) as i64));
                    Ok(vec![Stmt::Store {
                        buf: xp,
                        index: vec![ix[0].clone(), ix[1].clone(), row, ix[3].clone()],
                        value: lit(0.0, pairs.operand()),
                    }])
                },
            )?);
        }
        let (jb, oh, ob) = (l.fresh("jb"), l.fresh("oh"), l.fresh("ob"));
        let (tv, ii, jj) = (l.fresh("tap"), l.fresh("ii"), l.fresh("jj"));
        // One tap's block product (`t` the tap's number).
        let mma = |t: Expr, acc: bool| {
            let (kh, kw) = (
                Expr::div(t.clone(), Expr::int(kw_e as i64)),
                Expr::rem(t.clone(), Expr::int(kw_e as i64)),
            );
            let kwd = Expr::mul(kw, Expr::int(d as i64));
            Stmt::Mma {
                m: mb,
                n: nb,
                k: cp,
                c: Block {
                    buf: cblk,
                    at: match flat {
                        Some(_) => {
                            vec![Expr::mul(Expr::var(ob), Expr::int(mb as i64)), Expr::int(0)]
                        }
                        None => vec![Expr::int(0), Expr::int(0)],
                    },
                },
                a: Block {
                    buf: xp,
                    at: match flat {
                        // Flat: the block's first position, moved by the tap's rows and columns.
                        // (Row phases: tap kh's rows are phase kh * d % s_h, kh * d / s_h rows on.)
                        Some(_) => {
                            let khd = Expr::mul(kh, Expr::int(ah_dil));
                            let rp = Expr::int(row_phases as i64);
                            vec![
                                Expr::rem(kwd.clone(), Expr::int(s as i64)),
                                Expr::rem(khd.clone(), rp.clone()),
                                Expr::add(
                                    Expr::mul(Expr::var(ob), Expr::int(mb as i64)),
                                    Expr::add(
                                        Expr::mul(Expr::div(khd, rp), Expr::int(wq as i64)),
                                        Expr::div(kwd, Expr::int(s as i64)),
                                    ),
                                ),
                                Expr::int(0),
                            ]
                        }
                        None => vec![
                            Expr::rem(kwd.clone(), Expr::int(s as i64)),
                            if kh_n == 1 {
                                Expr::var(oh)
                            } else {
                                Expr::add(
                                    Expr::mul(Expr::var(oh), Expr::int(ah_stride)),
                                    Expr::mul(kh, Expr::int(ah_dil)),
                                )
                            },
                            Expr::add(
                                Expr::mul(Expr::var(ob), Expr::int(mb as i64)),
                                Expr::div(kwd, Expr::int(s as i64)),
                            ),
                            Expr::int(0),
                        ],
                    },
                },
                b: Block {
                    buf: wb,
                    at: vec![t, Expr::var(jb), Expr::int(0), Expr::int(0)],
                },
                acc,
                // Where the weight streams from memory, each tap's block fetches the next column
                // block's, which follows it (`w_packed[tap, jb + 1]`).
                ahead: streams,
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
        // Flat, the epilogue runs once all of a channel block's positions are summed, along each
        // output row (`ii` its position, the sums at row oh * wq + ii), in vector lanes as a row's is.
        let (pos, c_row) = match flat {
            Some(_) => (
                Expr::var(ii),
                Expr::add(
                    Expr::mul(Expr::var(oh), Expr::int(wq as i64)),
                    Expr::var(ii),
                ),
            ),
            None => (pos, Expr::var(ii)),
        };
        let by: Vec<(Var, Expr)> = images
            .iter()
            .cloned()
            .chain([(mv, ch.clone()), (aw.out, pos.clone())])
            .chain(ah.map(|a| (a.out, Expr::var(oh))))
            .collect();
        let st = store_at(
            store,
            acc,
            &by,
            &Expr::load(cblk, vec![c_row, Expr::var(jj)]),
        );
        // The rows an epilogue walks: a whole output row (flat), or a block's.
        let (rows_ext, row_block) = match flat {
            Some(_) => (ow, Expr::int(0)),
            None => (mb, Expr::var(ob)),
        };
        let epilogue = super::mma_epilogue::epilogue(
            st,
            super::mma_epilogue::Epilogue::RowsInner,
            (ii, &pos, rows_ext, ow, &row_block),
            (jj, &ch, nb, m, &Expr::var(jb)),
            l.fresh("ii"),
        );
        let mut block = vec![mma(Expr::int(0), false)];
        if products > 1 {
            let t = Expr::add(Expr::var(tv), Expr::int(1));
            block.push(Stmt::for_(
                tv,
                products - 1,
                LoopKind::Serial,
                vec![mma(t, true)],
            ));
        }
        let positions = match flat {
            Some(f) => vec![
                Stmt::for_(ob, f.rows / mb, LoopKind::Serial, block),
                Stmt::for_(oh, oh_n, LoopKind::Serial, vec![epilogue]),
            ],
            None => vec![Stmt::for_(
                oh,
                oh_n,
                LoopKind::Serial,
                vec![Stmt::for_(
                    ob,
                    owp / mb,
                    LoopKind::Serial,
                    [block, vec![epilogue]].concat(),
                )],
            )],
        };
        let nest = Stmt::for_(jb, mp / nb, LoopKind::Serial, positions);
        Ok([fill, vec![nest]].concat())
    })?;
    Ok(Some(stmts))
}

/// Blocks over a flat run of an image's output positions instead of one output row at a time: row
/// oh's position q is block row oh * wq + q, where `wq` is the copy's row (the output row and the
/// columns the taps reach past it), so a tap's A block is still a run of consecutive copy rows
/// (moved by kh * dilation * wq + kw * dilation); the positions past a row's `ow` are computed and not
/// stored. For AMX tiles, whose blocks take 16 or 32 rows: a 7x7 map padded its rows of 7 to 16 (and
/// was refused, running in f32 tiles); flat, 7 x 9 = 63 positions fill two blocks of 32. A window
/// more than a row high with a vertical stride copies its rows in phases, as the columns are, so each
/// output row is one row of a phase on from the last.
#[derive(Debug, Clone, Copy)]
struct Flat {
    /// Block rows.
    mb: u64,
    /// The copy's phases along its rows: the vertical stride of a window more than a row high (its
    /// output rows then step one row of a phase), else 1.
    row_phases: u64,
    /// The block rows computed: the image's oh * wq positions rounded up to whole blocks.
    rows: u64,
}

impl Flat {
    /// The flat blocks, where they compute at most 7/8 of the positions that rows padded to whole
    /// blocks of `row_mb` compute and under half again the outputs; `None` for `vdpbf16ps`, whose
    /// blocks take any rows and pad none. (The 7/8 margin was set while the flat epilogue stored
    /// element by element; it now runs in vector lanes, and the margin was not measured again.)
    fn pays(
        unit: Option<mlopt_target::MatrixUnit>,
        (oh, ow, row_mb): (u64, u64, u64),
        (kh, kw): (u64, u64),
        (stride_h, s, d): (i64, u64, u64),
    ) -> Option<Flat> {
        if unit != Some(mlopt_target::MatrixUnit::Amx) || kw >= 4 {
            return None;
        }
        let row_phases = if kh > 1 { stride_h as u64 } else { 1 };
        let wq = copy_row(ow, kw, s, d);
        // Blocks of 32 unless they pad an eighth more than 16s (7 x 11 = 77 positions: 96 or 80).
        let mb = if 8 * round_up(oh * wq, 32) <= 9 * round_up(oh * wq, 16) {
            32
        } else {
            16
        };
        let rows = round_up(oh * wq, mb);
        (8 * rows <= 7 * oh * round_up(ow, row_mb) && 2 * rows <= 3 * oh * ow).then_some(Flat {
            mb,
            row_phases,
            rows,
        })
    }

    /// A row phase's rows the blocks read: every block's rows at the last tap (its rows of `wq` on
    /// in its phase, and `cols` positions of its column phase).
    fn copy_rows(&self, wq: u64, kh: u64, dil_h: u64, cols: u64) -> u64 {
        self.rows + (kh - 1) * dil_h / self.row_phases * wq + cols
    }
}

/// A copy row's positions in one phase: `positions` outputs and the columns a `kw`-wide window (stride
/// `s`, dilation `d`) reaches past them.
fn copy_row(positions: u64, kw: u64, s: u64, d: u64) -> u64 {
    positions + (kw - 1) * d / s
}

/// The layout of a convolution's activations copied for its blocks: K (a block product's depth, `k`
/// channels padded to `kp`), the row's phases and positions per phase (`wq`), and the window columns
/// a block product still steps through (`kw`: all of them, or 1 where they are folded into K).
struct Copy {
    k: u64,
    kp: u64,
    phases: u64,
    wq: u64,
    kw: u64,
    /// The copy's rows: the images' rows it holds.
    rows: u64,
}

impl Copy {
    /// Channels innermost (K = C per tap) in `s` phases of the row where the window has columns.
    fn plain(c: u64, kw: u64, s: u64, d: u64, owp: u64, kstep: u64, rows: u64) -> Copy {
        Copy {
            k: c,
            kp: round_up(c, kstep),
            phases: if kw == 1 { 1 } else { s },
            wq: copy_row(owp, kw, s, d),
            kw,
            rows,
        }
    }

    /// A row of taps folded into K (K = C x KW, channel-major: along K, each channel's run of its
    /// input row), one phase of the output row's positions: what a shallow input such as a
    /// 3-channel stem needs, whose products one tap at a time (depth 4) would spend more on the
    /// accumulators than on the products.
    fn folded(c: u64, kw: u64, owp: u64, kstep: u64, rows: u64) -> Copy {
        Copy {
            k: c * kw,
            kp: round_up(c * kw, kstep),
            phases: 1,
            wq: owp,
            kw: 1,
            rows,
        }
    }

    /// The block products of a window of `taps` taps, `kw` of them a row: one per tap, or one per
    /// row of taps where the columns are folded into K.
    fn products(&self, taps: u64, kw: u64) -> u64 {
        taps / (kw / self.kw)
    }

    /// The copy for the cost model: its elements, read from channel planes (a gather).
    fn gathered(&self) -> mlopt_cost::tile::BlockCopy {
        mlopt_cost::tile::BlockCopy::Gathered(self.rows * self.phases * self.wq * self.kp)
    }
}
