//! Convolutions for a CPU target, scheduled from the algorithm lowering writes: one output element per
//! iteration of the loops over images, (groups,) output channels and output positions, folding the
//! input channels and the window taps, the input read through a guarded window:
//!
//! ```text
//! %acc[] = fma(select(in_range(oh*s+kh*d-p) and .., x[n, c, clamp(oh*s+kh*d-p), ..], 0), w[m, c, kh, kw], %acc[])
//! ```
//!
//! (`x` may be a producer computed in place: any expression of the window position.) The schedule is an
//! implicit GEMM (`tiler::tiled`): rows are a group's output channels, K its input channels by the
//! window, and columns one output row, batched over images, groups and the outer output rows. Per image
//! and group, the group's input channels are first copied into a zero-padded local buffer, so the
//! window's loads need no guard; along a strided row the copy is split into phases, so the loads along
//! the row are contiguous. Short output rows (narrow tiles, each weight reused by few columns) take every
//! output position as the columns and pack each panel of B (im2col), or run end to end as wide columns
//! over the input's phase planes (`Wide`, `padded::phase_planes`: a strided window read as stride-1
//! windows of its phases). A pointwise convolution (1x1, stride 1, no padding) is a plain contraction:
//! `gemm.rs` tiles it.

use super::padded::{padded_index, padded_phases, phase_dims, phase_planes, Plane, Read};
use super::tiler::{self, AForm, BForm, Builder, Tile};
use crate::contraction::{store_at, Contraction};
use crate::error::Result;
use crate::window::Window;
use mlopt_kir::index::delinear;
use mlopt_kir::{Expr, Stmt, Var};

/// Whether convolution `c` with window `w` runs as one implicit GEMM per image whose columns are all
/// its output positions, on a target of `lanes` f32 lanes: short output rows (each weight reused by
/// few columns of one row), with channels enough for more than a tile of rows. Its panels of B are
/// packed (im2col), or with the contraction swapped (`swapped`) its positions are the rows.
/// A strided window over long rows reads the input in phases instead, so its loads along the row are
/// contiguous: packing its panels gathers one element per lane, which cost a 3-channel stem as much as
/// its multiplies (SqueezeNet's 3x3 stride-2 stem: 40 -> 75 GFLOP/s, GoogLeNet's 7x7: 64 -> 103). Not
/// for narrow groups: with one tile of rows per panel (RegNet's 8 channels per group, depthwise) the
/// copy costs as much as the tiles.
pub(crate) fn all_positions(c: &Contraction, w: &Window, lanes: u64) -> bool {
    let sp = w.axes.len();
    Contraction::extent(&c.rows) >= 16 && sp > 1 && w.axes[sp - 1].outs < 2 * lanes
}

/// Whether a convolution with window `w` read in `phases` along its rows first copies its input into a
/// padded buffer (`padded_phases`): when split into phases, or where the window can leave the input.
fn copies(w: &Window, phases: usize) -> bool {
    phases > 1 || w.axes.iter().any(|a| a.guarded)
}

/// The bytes a swapped convolution's rows read per panel of its weight: the padded copy of one
/// image's input where it makes one (in one phase: all its positions are the rows), else the
/// positions by K.
pub(crate) fn swapped_a_bytes(c: &Contraction, w: &Window) -> u64 {
    let k: u64 = c.red.iter().map(|(_, e)| *e).product();
    let n: u64 = w.axes.iter().map(|a| a.outs).product();
    match (strided(w), copies(w, 1)) {
        (true, _) => {
            let (phases, dims) = plane_dims(w, &c.red, &copy_pads(w));
            c.red[0].1 * phases.iter().chain(&dims).product::<u64>() * 4
        }
        (false, true) => c.red[0].1 * w.axes.iter().map(|a| a.span as u64).product::<u64>() * 4,
        (false, false) => n * k * 4,
    }
}

/// Whether `w` is a strided 2-D window, whose input the schedule reads as phase planes.
fn strided(w: &Window) -> bool {
    w.axes.len() == 2 && w.axes.iter().any(|a| a.stride > 1)
}

/// The padding of a window's copy: before each axis, and after it as far as the window reaches.
fn copy_pads(w: &Window) -> Vec<usize> {
    let before = w.axes.iter().map(|a| a.pad as usize);
    let after = w
        .axes
        .iter()
        .map(|a| (a.span - a.pad - a.len).max(0) as usize);
    before.chain(after).collect()
}

/// The phases and plane dims of a 2-D window `w`'s phase planes (`padded::phase_dims`), its taps the
/// reduction `red`'s [channels, kh, kw], its copy padded by `pads`.
fn plane_dims(w: &Window, red: &[(Var, u64)], pads: &[usize]) -> ([u64; 2], [u64; 2]) {
    let [h, wd] = [&w.axes[0], &w.axes[1]];
    let strides = [h.stride as u64, wd.stride as u64];
    phase_dims([h.len, wd.len], pads, strides, [red[1].1, red[2].1])
}

/// A depthwise convolution's plane read flat (`Plane::Flat`): the padded plane's rows of `row`
/// elements end to end, so output position (r, c) is element r x row + c and tap (kh, kw) reads
/// `row` x kh + kw past it. The positions up to the last output's run in `rows` segments of one
/// vector of the target's lanes (each segment a row of the tiling), the `row` - W columns past each output row
/// computed and dropped; the sums go through a scratch plane, from which the epilogue stores the
/// output rows. `extra` rows of padding below the plane keep the last segment's taps inside it.
struct Flat {
    row: u64,
    rows: u64,
    extra: u64,
}

/// The vector instructions a row of `w` lanes takes on a target of `lanes` (a short vector is split
/// into its power-of-two parts: 14 lanes are 8 + 4 + 2).
fn vector_ops(w: u64, lanes: u64) -> u64 {
    w / lanes + u64::from((w % lanes).count_ones())
}

/// Whether a depthwise convolution (one output channel per group, its output rows the tiling's rows)
/// with window `w`, reduction `red` ([channels, taps..]) and copy padding `pads` runs flat, and how:
/// a 2-D window of stride 1, where its output rows are short. By rows, each row of W outputs takes
/// `vector_ops(W)` instructions per tap (a 7-wide row three, as wide as 48 lanes: EfficientNet's 7x7 and
/// 14x14 planes ran at 9-14% of the memory roof); flat, each segment takes one, and the scratch adds a
/// store per segment and a load per output row's vectors.
fn flat(w: &Window, red: &[u64], pads: &[usize], lanes: u64) -> Option<Flat> {
    if w.axes.len() != 2 || w.axes.iter().any(|a| a.stride != 1) {
        return None;
    }
    let (h, wd) = (&w.axes[0], &w.axes[1]);
    let row = (wd.len + (pads[1] + pads[3]) as i64) as u64;
    let n = (h.outs - 1) * row + wd.outs;
    let rows = n.div_ceil(lanes);
    let taps: u64 = red.iter().product();
    let by_rows = h.outs * vector_ops(wd.outs, lanes);
    if (taps + 1) * rows + by_rows >= taps * by_rows {
        return None;
    }
    // The last element the last segment's last tap reads, against the padded plane's end.
    let reach =
        rows * lanes + (red[1] - 1) * h.dilation as u64 * row + (red[2] - 1) * wd.dilation as u64;
    let plane = (h.len + (pads[0] + pads[2]) as i64) as u64 * row;
    Some(Flat {
        row,
        rows,
        extra: reach.saturating_sub(plane).div_ceil(row),
    })
}

/// A 2-D convolution's output rows read as one long row of columns (`wide_columns`): its input copied
/// into phase planes (`PhasePlanes`: the padded plane itself at stride 1), output (oh, ow) at column
/// oh x `row` + ow of a plane's rows laid end to end, tap (kh, kw) reading its phase `row` x (kh d /
/// s) + kw d / s past it. The `row` - W columns after each output row are computed and dropped
/// unless `row` is W (`direct`: the columns are the output positions, stored in place; a strided
/// 1x1 convolution's subsampled input), else the sums go through a scratch row per output channel.
#[derive(Debug, Clone, Copy)]
struct Wide {
    row: u64,
    cols: u64,
    direct: bool,
}

/// The wide columns of a 2-D window `w` (taps from the reduction `red`) whose copy is padded by
/// `pads`: `cols` runs to the last output position, so the last tap reads its phase's last element
/// and no further. None for another window.
fn wide_columns(w: &Window, red: &[(Var, u64)], pads: &[usize]) -> Option<Wide> {
    if w.axes.len() != 2 || red.len() != 3 {
        return None;
    }
    let (_, [_, row]) = plane_dims(w, red, pads);
    let (h, wd) = (&w.axes[0], &w.axes[1]);
    Some(Wide {
        row,
        cols: (h.outs - 1) * row + wd.outs,
        direct: row == wd.outs,
    })
}

/// The tiled form of convolution `c` with window `w`, its tile from `t_for(m, n, k)` and its epilogue
/// the one store `store` (buffer, index, value). With `swapped`, the convolution runs transposed (only
/// where `all_positions`): its output positions are the rows (A, read from the window), its output
/// channels the columns (B, the weight packed into these column blocks' panels by the caller).
pub(crate) fn tiled(
    b: &mut Builder,
    c: &Contraction,
    w: &Window,
    t_for: &dyn Fn(u64, u64, u64) -> Option<Tile>,
    store: (mlopt_kir::BufId, &[Expr], &Expr),
    swapped: Option<&[mlopt_kir::BufId]>,
) -> Result<Option<Vec<Stmt>>> {
    let lanes = u64::from(b.lanes());
    let sp = w.axes.len();
    let (m, cg) = (Contraction::extent(&c.rows), c.red[0].1);
    let last = &w.axes[sp - 1];
    // Short rows with channels enough take every output position as the columns (`all_positions`).
    let all = all_positions(c, w, lanes);
    // A depthwise convolution (one output channel per group) has no rows to tile: its output rows are
    // the tile's rows instead, each reading its own window (B loaded per row of the tile), so a tile
    // still holds mr x nv independent accumulators where one row of them waited on FMA latency.
    let by_rows = m == 1 && !all && sp > 1;
    let outs: Vec<u64> = w.axes.iter().map(|a| a.outs).collect();
    let positions: u64 = outs.iter().product();
    let red: Vec<u64> = c.red.iter().map(|(_, e)| *e).collect();
    let mut pads = copy_pads(w);
    let flat = match by_rows {
        true => flat(w, &red, &pads, lanes),
        false => None,
    };
    if let Some(f) = &flat {
        pads[sp] += f.extra as usize;
    }
    let kk: u64 = red.iter().product();
    // Output rows too short for whole tiles (28 positions: a 16-wide tile and a 12-wide tail, or
    // 8 x 8 tiles that broadcast once per FMA) run as one long row of columns over the phase planes,
    // where the cost model rates that faster with the scratch's extra pass (`wide_columns`) than one
    // tiling per output row, or, for a strided window over short rows, than all its positions packed
    // by gathering (im2col panels of a strided window gather one element per lane).
    let strided = strided(w);
    let wide = match (by_rows, swapped) {
        (false, None) if !all || strided => wide_columns(w, &c.red, &pads).filter(|wide| {
            let (batches, n, gathered) = match all {
                true => (1, positions, kk * positions),
                false => (outs[..sp - 1].iter().product(), last.outs, 0),
            };
            match (t_for(m, n, kk), t_for(m, wide.cols, kk)) {
                (Some(plain), Some(flat)) => mlopt_cost::tile::flat_columns_pay(
                    (plain, batches, m, n, gathered),
                    (flat, wide.cols, !wide.direct),
                    kk,
                ),
                _ => false,
            }
        }),
        _ => None,
    };
    let pack = all && wide.is_none();
    let n = if pack { positions } else { last.outs };
    let (tm, inner): (u64, Vec<u64>) = match (pack, by_rows, wide) {
        (true, _, _) | (false, false, Some(_)) => (m, Vec::new()),
        (false, true, _) => (outs[sp - 2], outs[..sp - 2].to_vec()),
        (false, false, None) => (m, outs[..sp - 1].to_vec()),
    };
    // A strided 2-D window read other than by rows reads its input's phase planes (`PhasePlanes`),
    // contiguous along each phase's rows: as wide columns, as a swapped contraction's rows, or packed.
    let planes_read = wide.is_some() || (pack && strided);
    // The tiling's rows and columns: output channels (or rows) by positions, or swapped, positions by
    // output channels.
    let (rows_n, cols_n) = match (swapped, &flat, wide) {
        (Some(_), _, _) => (n, tm),
        (None, Some(f), _) => (f.rows, lanes),
        (None, None, Some(wide)) => (tm, wide.cols),
        (None, None, None) => (tm, n),
    };
    let Some(t) = t_for(rows_n, cols_n, kk) else {
        return Ok(None);
    };
    let phases = if pack { 1 } else { last.stride as usize };
    let copy = copies(w, phases) || flat.is_some() || planes_read;
    // Outer loops: the batch and any column that is not an output position (the image).
    let outer = w.outer_loops(c);
    let outs_i: Vec<i64> = outs.iter().map(|e| *e as i64).collect();
    let rows: Vec<i64> = c.rows.iter().map(|(_, e)| *e as i64).collect();
    // The output position of column `j` of the tile's row `row` in inner batch `bi`, per axis.
    let position = |bi: &[Expr], row: Option<&Expr>, j: &Expr| -> Vec<Expr> {
        match (pack, by_rows, row) {
            (true, _, _) => delinear(j.clone(), &outs_i),
            _ if wide.is_some_and(|w| w.direct) => delinear(j.clone(), &outs_i),
            (false, true, Some(r)) => [bi.to_vec(), vec![r.clone(), j.clone()]].concat(),
            _ => [bi.to_vec(), vec![j.clone()]].concat(),
        }
    };
    // An expression of the algorithm with its loops replaced (the tile's row is an output channel, or
    // with `by_rows` an output row).
    let by = |ng: &[Expr],
              bi: &[Expr],
              row: Option<&Expr>,
              col: Option<&Expr>,
              k: &[Expr]|
     -> Vec<(Var, Expr)> {
        let mut by: Vec<(Var, Expr)> = outer
            .iter()
            .map(|(v, _)| *v)
            .zip(ng.iter().cloned())
            .collect();
        if let (Some(r), false) = (row, by_rows) {
            by.extend(
                c.rows
                    .iter()
                    .map(|(v, _)| *v)
                    .zip(delinear(r.clone(), &rows)),
            );
        }
        if let Some(j) = col {
            by.extend(w.axes.iter().map(|a| a.out).zip(position(bi, row, j)));
        }
        by.extend(c.red.iter().map(|(v, _)| *v).zip(k.iter().cloned()));
        by
    };
    let strides: Vec<usize> = w.axes.iter().map(|a| a.stride as usize).collect();
    let dilations: Vec<usize> = w.axes.iter().map(|a| a.dilation as usize).collect();
    let lens: Vec<i64> = w.axes.iter().map(|a| a.len).collect();
    let acc = c.acc;
    // A flat schedule's sums, one segment a row (a wide one's, one row of columns per output channel).
    let scratch_len = match (&flat, wide) {
        (Some(f), _) => Some(f.rows * lanes),
        (None, Some(wide)) if !wide.direct => Some(tm * wide.cols),
        (None, Some(_)) => None,
        (None, None) => None,
    };
    let scratch = scratch_len.map(|len| {
        let k = b.kernel();
        k.buf(
            format!("yflat{}", k.bufs.len()),
            mlopt_kir::Elem::F32,
            vec![len],
            mlopt_kir::Space::Local,
        )
    });
    let outer_ext: Vec<u64> = outer.iter().map(|(_, e)| *e).collect();
    let stmts = tiler::nest(b, "g", &outer_ext, |b, ng| {
        let mut st = Vec::new();
        let (src, planes) = match copy {
            true => {
                let read: Read = &mut |_, lead, pos| {
                    Ok(w.input_at(
                        &w.input
                            .subst_all(&by(ng, &[], None, None, &[]))
                            .subst(c.red[0].0, &lead[1]),
                        pos,
                    ))
                };
                let planes = match planes_read {
                    true => {
                        let [sh, sw] = [0, 1].map(|a| w.axes[a].stride as u64);
                        let spatial = [lens[0], lens[1]];
                        let taps = [red[1], red[2]];
                        let fill = w.fill;
                        let (lead, stride) = ([1, cg], [sh, sw]);
                        let pl = phase_planes(
                            b, lead, spatial, &pads, stride, taps, fill, read, &mut st,
                        )?;
                        Some(pl)
                    }
                    false => None,
                };
                let xp = match (&planes, &flat) {
                    (Some(pl), _) => pl.buf,
                    (None, Some(_)) => {
                        padded_phases(b, [1, cg], &lens, &pads, Plane::Flat, w.fill, read, &mut st)?
                    }
                    (None, None) => padded_phases(
                        b,
                        [1, cg],
                        &lens,
                        &pads,
                        Plane::Phases(phases),
                        w.fill,
                        read,
                        &mut st,
                    )?,
                };
                let k = b.kernel();
                let buf = k.buffer(xp).name.clone();
                if let Some(pl) = &planes {
                    if pl.strides != [1, 1] {
                        k.schedule.push(mlopt_kir::ScheduleStep::Pad {
                            buf: buf.clone(),
                            phases: pl.count(),
                        });
                    }
                    let row = pl.dims[1];
                    k.schedule.push(mlopt_kir::ScheduleStep::Flat { buf, row });
                } else {
                    k.schedule.push(match &flat {
                        Some(f) => mlopt_kir::ScheduleStep::Flat { buf, row: f.row },
                        None => mlopt_kir::ScheduleStep::Pad {
                            buf,
                            phases: phases as u64,
                        },
                    });
                }
                (Some(xp), planes)
            }
            false => (None, None),
        };
        // A window value at output position `col` (B's column, or swapped, A's row).
        let window = |bi: &[Expr], row: Option<&Expr>, k: &[Expr], col: &Expr| {
            // A depthwise segment reads its flat plane from the segment's start, `lanes` per row of
            // the tiling.
            let flat_at = flat.as_ref().map(|f| {
                let first = row.map_or(Expr::int(0), |r| {
                    Expr::mul(r.clone(), Expr::int(lanes as i64))
                });
                (f.row, first)
            });
            let tap = |a: usize| Expr::mul(k[1 + a].clone(), Expr::int(w.axes[a].dilation));
            match (src, &planes, flat_at) {
                (Some(xp), Some(pl), _) => {
                    // A wide column is its own flat position in each phase (the tiles read B in
                    // place); an output position (a swapped row) is at row x W' + column.
                    let flat_col = match wide.is_some() || pl.dims[1] == outs[1] {
                        true => col.clone(),
                        false => {
                            let p = delinear(col.clone(), &outs_i);
                            let down = Expr::mul(p[0].clone(), Expr::int(pl.dims[1] as i64));
                            Expr::add(down, p[1].clone())
                        }
                    };
                    let at = pl.at([tap(0), tap(1)], flat_col);
                    Expr::load(xp, vec![Expr::int(0), k[0].clone(), at])
                }
                (Some(xp), None, Some((plane_row, first))) => {
                    // Element `col` of the flat plane past `first`, moved by the tap.
                    let down = Expr::mul(tap(0), Expr::int(plane_row as i64));
                    let at = Expr::add(Expr::add(first, col.clone()), Expr::add(down, tap(1)));
                    Expr::load(xp, vec![Expr::int(0), k[0].clone(), at])
                }
                (Some(xp), None, None) => {
                    let window = padded_index(
                        &position(bi, row, col),
                        &k[1..],
                        &strides,
                        &dilations,
                        phases,
                    );
                    Expr::load(xp, [vec![Expr::int(0), k[0].clone()], window].concat())
                }
                (None, _, _) => c.b.subst_all(&by(ng, bi, row, Some(col), k)),
            }
        };
        let kdims: Vec<i64> = red.iter().map(|e| *e as i64).collect();
        // Swapped, A is the window's input, strided along K (channels, taps), and B the weight.
        let forms = match swapped {
            Some(weights) => {
                b.kernel().schedule.push(mlopt_kir::ScheduleStep::Swap);
                (AForm::StridedK, BForm::Weights(weights))
            }
            None if pack => (AForm::InPlace, BForm::Packed),
            None if wide.is_some() && mlopt_cost::tile::pack_b_pays(t, rows_n, cols_n) => {
                (AForm::InPlace, BForm::Packed)
            }
            None => (AForm::InPlace, BForm::InPlace),
        };
        st.extend(tiler::tiled(
            b,
            &inner,
            rows_n,
            cols_n,
            &red,
            t,
            forms,
            &mut |_, bi, row, k| {
                Ok(match swapped {
                    Some(_) => window(bi, None, k, row),
                    None => c.a.subst_all(&by(ng, bi, Some(row), None, k)),
                })
            },
            &mut |_, bi, row, k, col| {
                Ok(match swapped {
                    Some(weights) => {
                        let at = mlopt_kir::index::linear(k, &kdims);
                        let ix = vec![col.jo.clone(), at, col.jj.clone()];
                        Expr::load(weights[col.block], ix)
                    }
                    None => window(bi, row, k, &col.j),
                })
            },
            &mut |_, bi, row, j, v| {
                if let Some(y) = scratch {
                    let width = wide.map_or(lanes, |w| w.cols);
                    let at = Expr::add(Expr::mul(row.clone(), Expr::int(width as i64)), j.clone());
                    return Ok(Stmt::Store {
                        buf: y,
                        index: vec![at],
                        value: v,
                    });
                }
                // The output channel and the position.
                let (ch, pos) = match swapped {
                    Some(_) => (j, row),
                    None => (row, j),
                };
                Ok(store_at(
                    store,
                    acc,
                    &by(ng, bi, Some(ch), Some(pos), &[]),
                    &v,
                ))
            },
        )?);
        // A wide schedule stores each output channel's rows from its row of the scratch.
        if let (Some(y), Some(Wide { row, cols, .. })) = (scratch, wide) {
            let dims = [tm, outs[0], outs[1]];
            st.extend(tiler::nest(b, "e", &dims, |_, e| {
                let at = Expr::add(
                    Expr::mul(e[0].clone(), Expr::int(cols as i64)),
                    Expr::add(Expr::mul(e[1].clone(), Expr::int(row as i64)), e[2].clone()),
                );
                let v = Expr::load(y, vec![at]);
                Ok(vec![store_at(
                    store,
                    acc,
                    &by(
                        ng,
                        std::slice::from_ref(&e[1]),
                        Some(&e[0]),
                        Some(&e[2]),
                        &[],
                    ),
                    &v,
                )])
            })?);
        }
        // A flat schedule stores each output row from its run of the scratch plane.
        if let (Some(y), Some(f)) = (scratch, &flat) {
            st.extend(tiler::nest(b, "e", &outs, |_, e| {
                let at = Expr::add(
                    Expr::mul(e[0].clone(), Expr::int(f.row as i64)),
                    e[1].clone(),
                );
                let v = Expr::load(y, vec![at]);
                Ok(vec![store_at(
                    store,
                    acc,
                    &by(ng, &[], Some(&e[0]), Some(&e[1]), &[]),
                    &v,
                )])
            })?);
        }
        Ok(st)
    })?;
    Ok(Some(stmts))
}
