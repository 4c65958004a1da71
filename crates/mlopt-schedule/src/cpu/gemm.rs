//! Register-tiled contractions for a CPU target, scheduled from the algorithm form lowering writes
//! (`contraction.rs` recognises it): the tile comes from the cost model (`mlopt_cost::tile`, or a
//! `--tune` override), the tiles are built by `tiler::tiled`, and a constant 2-D B read only by the
//! contraction is packed into column panels, weights of their own that replace it; any other B (the
//! activations of a pointwise convolution) is packed at run time where the cost model says the copy
//! pays (`mlopt_cost::tile::pack_b_pays`).

use super::tiler::{self, Builder, Tile, TileKey};
use crate::class::Class;
use crate::contraction::{store_at, Contraction};
use crate::error::Result;
use mlopt_kir::{BufId, Elem, Expr, Place, Program, Space, Stmt, Var, Weight};
use mlopt_target::CpuTarget;
use std::collections::HashMap;
use std::sync::Arc;

/// Tiles every contraction, convolution and attention nest at the top of each kernel's body, by the
/// classes of its nests (`classes[kernel][statement]`).
pub(crate) fn tile(
    p: &mut Program,
    classes: Vec<Vec<Class>>,
    target: &CpuTarget,
    mma: bool,
    tiles: &HashMap<TileKey, Tile>,
) -> Result<()> {
    for (ki, classes) in classes.into_iter().enumerate() {
        let loads = mlopt_kir::analysis::buffer_loads(&p.kernels[ki].body);
        let body = std::mem::take(&mut p.kernels[ki].body);
        let mut out = Vec::with_capacity(body.len());
        for (st, class) in body.into_iter().zip(classes) {
            match tile_nest(p, ki, class, target, mma, tiles, &loads)? {
                Some(tiled) => out.extend(tiled),
                None => out.push(st),
            }
        }
        p.kernels[ki].body = out;
    }
    super::layout::drop_unbound_weights(p);
    Ok(())
}

/// The tiled form of a nest of class `class`, when it is a contraction with rows and columns, a
/// convolution or attention.
#[allow(clippy::too_many_arguments)]
fn tile_nest(
    p: &mut Program,
    ki: usize,
    class: Class,
    target: &CpuTarget,
    mma: bool,
    tiles: &HashMap<TileKey, Tile>,
    loads: &HashMap<BufId, usize>,
) -> Result<Option<Vec<Stmt>>> {
    let t_for = |m, n, k| tiler::tile_for(tiles, target, m, n, k);
    let (mut c, mut window) = match class {
        Class::Attention(a) => {
            let mut b = Builder {
                k: &mut p.kernels[ki],
                target,
            };
            return super::attention::tiled(&mut b, &a, &t_for, mma);
        }
        Class::Contraction(c) => (c, None),
        Class::Convolution(c, w) => (c, Some(w)),
        Class::Other => return Ok(None),
    };
    // Loops of one iteration are index 0. One that only A reads is a row of one (a batch-1 model's
    // single token), so the contraction has rows; a vector times a matrix has none and is left to
    // rfactor.
    let ones: Vec<Var> = c
        .batch
        .iter()
        .filter(|(_, e)| *e == 1)
        .map(|(v, _)| *v)
        .collect();
    let has_rows = !c.rows.is_empty() || ones.iter().any(|v| c.a.uses(*v) && !c.b.uses(*v));
    if !has_rows || c.cols.is_empty() {
        return Ok(None);
    }
    c.batch.retain(|(_, e)| *e != 1);
    for v in ones {
        if let Some(w) = window.as_mut() {
            w.input = w.input.subst(v, &Expr::int(0));
        }
        c.a = c.a.subst(v, &Expr::int(0));
        c.b = c.b.subst(v, &Expr::int(0));
        c.epilogue = c
            .epilogue
            .iter()
            .map(|s| s.subst(v, &Expr::int(0)))
            .collect();
    }
    let Some((out, out_ix, out_v)) = c.store() else {
        return Ok(None);
    };
    // Integer contractions (summed in i32) run only as blocks on the integer dot product.
    let integer = c.sum != Elem::F32;
    if mma || integer {
        let store = (out, &out_ix[..], &out_v);
        let blocks = match &window {
            Some(w) => super::mma_conv::blocks(p, target, ki, &c, w, loads, store)?,
            None => super::mma::in_blocks(p, target, ki, &c, loads, store)?,
        };
        if blocks.is_some() || integer {
            return Ok(blocks);
        }
    }
    // fp32 tiles read a constant bf16 weight as f32, widened once here instead of at every load.
    c.a = super::layout::widen_bf16_weight(p, ki, &c.a, loads);
    c.b = super::layout::widen_bf16_weight(p, ki, &c.b, loads);
    if let Some(w) = window {
        let swapped = swap_conv(p, ki, &c, &w, target, &t_for, loads);
        let mut b = Builder {
            k: &mut p.kernels[ki],
            target,
        };
        let store = (out, &out_ix[..], &out_v);
        return super::conv::tiled(&mut b, &c, &w, &t_for, store, swapped.as_deref());
    }
    c.drop_unit_reductions();
    let swapped = swapped_if_faster(p, ki, &c, target, &t_for, loads, (out, &out_ix, &out_v));
    let swap = swapped.is_some();
    if let Some(s) = swapped {
        c = s;
    }
    c.split_strided_cols(&p.kernels[ki], (out, &out_ix, &out_v));
    let ext = |l: &[(Var, u64)]| l.iter().map(|(_, e)| *e).collect::<Vec<u64>>();
    let (m, n, kk) = (
        Contraction::extent(&c.rows),
        Contraction::extent(&c.cols),
        Contraction::extent(&c.red),
    );
    let Some(t) = t_for(m, n, kk) else {
        return Ok(None);
    };
    let packed = pack_b(p, ki, &c, t, loads);
    let as_i64 = |v: Vec<u64>| v.into_iter().map(|e| e as i64).collect::<Vec<i64>>();
    let (rows, cols) = (as_i64(ext(&c.rows)), as_i64(ext(&c.cols)));
    // The algorithm's loop variables and what replaces them.
    let by = |batch: &[Expr],
              row: Option<&Expr>,
              col: Option<&Expr>,
              red: &[Expr]|
     -> Vec<(Var, Expr)> {
        let mut by: Vec<(Var, Expr)> = c
            .batch
            .iter()
            .map(|(v, _)| *v)
            .zip(batch.iter().cloned())
            .collect();
        if let Some(r) = row {
            by.extend(
                c.rows
                    .iter()
                    .map(|(v, _)| *v)
                    .zip(mlopt_kir::index::delinear(r.clone(), &rows)),
            );
        }
        if let Some(j) = col {
            by.extend(
                c.cols
                    .iter()
                    .map(|(v, _)| *v)
                    .zip(mlopt_kir::index::delinear(j.clone(), &cols)),
            );
        }
        by.extend(c.red.iter().map(|(v, _)| *v).zip(red.iter().cloned()));
        by
    };
    let acc = c.acc;
    let mut b = Builder {
        k: &mut p.kernels[ki],
        target,
    };
    if swap {
        b.kernel().schedule.push(mlopt_kir::ScheduleStep::Swap);
    }
    let stmts = tiler::tiled(
        &mut b,
        &ext(&c.batch),
        m,
        n,
        &ext(&c.red),
        t,
        (
            // Swapped, A is the activations, strided along K.
            match swap {
                true => tiler::AForm::StridedK,
                false => tiler::AForm::InPlace,
            },
            match &packed {
                Some(w) => tiler::BForm::Weights(w),
                None if mlopt_cost::tile::pack_b_pays(t, m, n) => tiler::BForm::Packed,
                None => tiler::BForm::InPlace,
            },
        ),
        &mut |_, bi, row, k| Ok(c.a.subst_all(&by(bi, Some(row), None, k))),
        &mut |_, bi, _, k, col| {
            Ok(match packed.as_ref().and_then(|p| p.get(col.block)) {
                Some(p) => Expr::load(*p, vec![col.jo.clone(), k[0].clone(), col.jj.clone()]),
                None => c.b.subst_all(&by(bi, None, Some(&col.j), k)),
            })
        },
        &mut |_, bi, row, col, v| {
            Ok(store_at(
                (out, &out_ix, &out_v),
                acc,
                &by(bi, Some(row), Some(col), &[]),
                &v,
            ))
        },
    )?;
    Ok(Some(stmts))
}

/// Contraction `c` swapped, when that runs faster (`mlopt_cost::tile::swap_pays`): only when its A is a
/// constant weight that packs as the swapped contraction's B (a convolution's weight, A because the
/// positions are the innermost loop). Swapped, the images of a batch join the rows (the activations are
/// broadcast from any address), so each panel of the weight serves all of them, as far as their
/// activations stay in half of L2; images past that run one at a time, outside (as unswapped, where
/// `split_strided_cols` moves them out).
#[allow(clippy::too_many_arguments)]
fn swapped_if_faster(
    p: &Program,
    ki: usize,
    c: &Contraction,
    target: &CpuTarget,
    t_for: &dyn Fn(u64, u64, u64) -> Option<Tile>,
    loads: &HashMap<BufId, usize>,
    store: (BufId, &[Expr], &Expr),
) -> Option<Contraction> {
    let mut s = c.swapped();
    packable(p, ki, &s, loads)?;
    let mut plain = c.clone();
    plain.split_strided_cols(&p.kernels[ki], store);
    let ext = Contraction::extent;
    let (m, n, k) = (ext(&plain.rows), ext(&plain.cols), ext(&plain.red));
    // Only the loops the unswapped form runs outside (the images) may leave the rows.
    let images = plain.batch.len() - c.batch.len();
    for _ in 0..images {
        if ext(&s.rows) * k * 4 <= target.l2_bytes / 2 || s.rows.len() < 2 {
            break;
        }
        s.batch.push(s.rows.remove(0));
    }
    let batches = ext(&plain.batch) / ext(&c.batch).max(1);
    let (swapped_batches, rows) = (ext(&s.batch) / ext(&c.batch).max(1), ext(&s.rows));
    let (pt, st) = (t_for(m, n, k)?, t_for(rows, m, k)?);
    let a_bytes = rows * k * 4;
    let plain = (pt, batches, m, n);
    mlopt_cost::tile::swap_pays(target, plain, (st, swapped_batches, rows, a_bytes), k).then_some(s)
}

/// The weight B of contraction `c` when it can be packed into column panels (`pack_b`): the operand,
/// K and N.
fn packable(
    p: &Program,
    ki: usize,
    c: &Contraction,
    loads: &HashMap<BufId, usize>,
) -> Option<(super::layout::WeightOperand, u64, u64)> {
    let ([(r, kdim)], [(j, ndim)]) = (&c.red[..], &c.cols[..]) else {
        return None;
    };
    // (Trailing axes of one element, a 1x1 convolution's window, are index 0.)
    let op = super::layout::weight_operand(p, ki, &c.b, (*r, *j), loads)?;
    let weight = &p.weights[op.bound.2];
    let dims = [
        if op.trans {
            vec![*ndim, *kdim]
        } else {
            vec![*kdim, *ndim]
        },
        vec![1; op.ones],
    ]
    .concat();
    super::layout::holds(weight, Elem::F32, &dims).then_some((op, *kdim, *ndim))
}

/// A constant 2-D f32 B (`W[k, j]`, or `W[j, k]`; more axes of one element) that only this contraction reads, packed into column
/// panels for tile `t`: the first block takes W's parameter, later ones are new parameters; their weights
/// replace W's. None when B is not such a weight.
fn pack_b(
    p: &mut Program,
    ki: usize,
    c: &Contraction,
    t: Tile,
    loads: &HashMap<BufId, usize>,
) -> Option<Vec<BufId>> {
    let (
        super::layout::WeightOperand {
            buf: w,
            trans,
            bound: (si, pi, wi),
            ..
        },
        kdim,
        ndim,
    ) = packable(p, ki, c, loads)?;
    Some(pack_weight(
        p,
        ki,
        (w, (si, pi, wi)),
        (kdim, ndim),
        t,
        trans,
    ))
}

/// Weight `w` (bound by step, parameter and weight `bound`), a K x N B (N x K when `trans`), packed into
/// the column panels of tile `t`: the first block takes W's parameter, later ones are new
/// parameters; their weights replace W's.
fn pack_weight(
    p: &mut Program,
    ki: usize,
    (w, (si, pi, wi)): (BufId, (usize, usize, usize)),
    (kdim, ndim): (u64, u64),
    t: Tile,
    trans: bool,
) -> Vec<BufId> {
    let weight = &p.weights[wi];
    let (blocks, name) = (
        tiler::pack_blocks(&weight.data, kdim, ndim, t, trans),
        weight.name.clone(),
    );
    // The unpacked bytes are let go now, not when the pass ends, when no other step reads them: the
    // next weight's panels then reuse their memory instead of faulting in fresh pages.
    if p.steps
        .iter()
        .enumerate()
        .all(|(s, st)| s == si || !st.args.contains(&Place::Weight(wi)))
    {
        p.weights[wi].data = Arc::new(Vec::new());
    }
    let mut ids = Vec::new();
    for (block, (dims, data)) in blocks.into_iter().enumerate() {
        p.weights.push(Weight {
            name: format!("{name}.packed{}.{block}", t.nr),
            elem: Elem::F32,
            dims: dims.clone(),
            data: Arc::new(data),
        });
        let place = Place::Weight(p.weights.len() - 1);
        let k = &mut p.kernels[ki];
        if block == 0 {
            k.bufs[w.0 as usize].dims = dims;
            p.steps[si].args[pi] = place;
            ids.push(w);
        } else {
            let name = format!("{}.{block}", k.buffer(w).name);
            ids.push(k.buf(name, Elem::F32, dims, Space::Global));
            p.steps[si].args.push(place);
        }
    }
    ids
}

/// The panels of convolution `c`'s weight when the convolution runs faster swapped
/// (`mlopt_cost::tile::swap_pays`; `conv::tiled`): one that takes all output positions as columns
/// (`conv::all_positions`), whose A is a constant f32 weight [M, C, KH, ..] read `W[row, c, kh, ..]`
/// by this nest alone (so not a grouped convolution's, whose rows start at the group's). Packed for the swapped tile, as a transposed B.
#[allow(clippy::too_many_arguments)]
fn swap_conv(
    p: &mut Program,
    ki: usize,
    c: &Contraction,
    w: &crate::window::Window,
    target: &CpuTarget,
    t_for: &dyn Fn(u64, u64, u64) -> Option<Tile>,
    loads: &HashMap<BufId, usize>,
) -> Option<Vec<BufId>> {
    if !super::conv::all_positions(c, w, u64::from(target.lanes())) {
        return None;
    }
    let [(row, m)] = c.rows[..] else { return None };
    let vars: Vec<Var> = std::iter::once(row)
        .chain(c.red.iter().map(|(v, _)| *v))
        .collect();
    let (wb, bound) = super::layout::weight_read_at(p, ki, &c.a, &vars, loads)?;
    let red: Vec<u64> = c.red.iter().map(|(_, e)| *e).collect();
    let k: u64 = red.iter().product();
    if !super::layout::holds(&p.weights[bound.2], Elem::F32, &[vec![m], red].concat()) {
        return None;
    }
    let n: u64 = w.axes.iter().map(|a| a.outs).product();
    let (pt, st) = (t_for(m, n, k)?, t_for(n, m, k)?);
    let a_bytes = super::conv::swapped_a_bytes(c, w);
    if !mlopt_cost::tile::swap_pays(target, (pt, 1, m, n), (st, 1, n, a_bytes), k) {
        return None;
    }
    Some(pack_weight(p, ki, (wb, bound), (k, m), st, true))
}
