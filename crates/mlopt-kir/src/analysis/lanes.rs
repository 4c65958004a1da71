//! How a vector loop's accesses run: contiguous, broadcast or strided (a vector load), interleaving
//! rows or walking a plane's rows (loads and shuffles), or anything else (a gather, lane by lane). The
//! cost model prices kernels by it and code generation emits by it.

use super::{coefficient, flat_index, for_each_access, for_each_load};
use crate::ir::*;
use std::collections::HashMap;

/// The elements a kernel loads and stores, by how they move (see [`accesses`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Accesses {
    /// In a vector loop, contiguous along it, broadcast, or at a constant stride of 2 to 4 (one load of
    /// the span and a shuffle).
    pub vector: f64,
    /// In a vector loop, at any other stride (a gather or scatter, one element per lane).
    pub gather: f64,
    /// Outside any vector loop.
    pub scalar: f64,
}

impl Accesses {
    pub fn total(&self) -> f64 {
        self.vector + self.gather + self.scalar
    }
}

/// The loads and stores of kernel `k` by how they run: what prices a kernel that moves data rather than
/// computing (a concat, a pad, a transpose), which [`super::arithmetic`] does not see. Accesses whose lanes
/// interleave rows ([`interleaved`]) are vector ones: code generation loads each row and shuffles; so
/// are those whose lanes walk a plane's rows ([`row_runs`]): a masked load per row.
pub fn accesses(k: &Kernel) -> Accesses {
    let mut out = Accesses::default();
    let extents = crate::simplify::loop_extents(k);
    for_each_access(&k.body, &mut |b, index, vector, trips| match vector {
        None => out.scalar += trips,
        Some(v) => {
            let flat = flat_index(k, b, index);
            match coefficient(&flat, v) {
                Some(0..=4) => out.vector += trips,
                _ if interleaved(k, &extents, &flat, v).is_some() => out.vector += trips,
                _ if row_runs(k, &flat, v).is_some() => out.vector += trips,
                _ => out.gather += trips,
            }
        }
    });
    out
}

/// Whether the lanes of vector loop `q` at flat index `flat` of kernel `k` interleave r (2 or 4)
/// contiguous rows: with q written r u + v (v < r), the index moves by one element with u and by a
/// constant with v (`x[2 k + q % 2, j + q / 2]`, a bf16 block's k-pairs packed from two channel rows).
/// Then Some(r). A vector loop steps by its width; for a width that r divides, lane l of a step is row
/// l % r, element l / r, and code generation loads each row once and interleaves them. `extents` are
/// `k`'s loop extents (`simplify::loop_extents`).
pub fn interleaved(k: &Kernel, extents: &HashMap<Var, u64>, flat: &Expr, q: Var) -> Option<u32> {
    let mut ranges = extents.clone();
    let extent = *ranges.get(&q)?;
    let (u, v) = (Var(k.vars.len() as u32), Var(k.vars.len() as u32 + 1));
    [2u32, 4].into_iter().find(|&r| {
        if !extent.is_multiple_of(u64::from(r)) {
            return false;
        }
        ranges.insert(u, extent / u64::from(r));
        ranges.insert(v, u64::from(r));
        let split = Expr::add(
            Expr::mul(Expr::var(u), Expr::int(i64::from(r))),
            Expr::var(v),
        );
        let e = crate::simplify::simplify(&flat.subst(q, &split), &ranges);
        coefficient(&e, u) == Some(1) && coefficient(&e, v).is_some_and(|s| s != 0)
    })
}

/// How the lanes of a vector access walk a plane's rows ([`row_runs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RowRuns {
    /// The position the lanes step through (by one per lane), split into row `pos / width` and
    /// column `pos % width`.
    pub pos: Expr,
    pub width: i64,
    /// Elements from one column to the next (1, or 2 for a stride-2 window).
    pub step: i64,
    /// How much further than `step` the next row's first column lies past a row's last.
    pub jump: i64,
}

/// Whether the lanes of vector loop `q` walk a plane's rows: `flat` reads `e / W` and `e % W` of one
/// position `e` that moves by one with `q` (an output position split into its row and column, read
/// at a padded input's width), depends on `q` only through them, and moves by 1 or 2 elements with
/// the column. Lanes in one row are then evenly spaced, and a step of w lanes spans at most
/// (W + w - 2) / W + 1 rows. `k` names the fresh variables.
pub fn row_runs(k: &Kernel, flat: &Expr, q: Var) -> Option<RowRuns> {
    fn division(x: &Expr, q: Var) -> Option<(Expr, i64)> {
        match x {
            Expr::Binary(BinOp::Div, e, w) => match &**w {
                Expr::Int(w) if *w > 1 && coefficient(e, q) == Some(1) => Some(((**e).clone(), *w)),
                _ => division(e, q),
            },
            Expr::Binary(_, a, b) => division(a, q).or_else(|| division(b, q)),
            _ => None,
        }
    }
    let (pos, width) = division(flat, q)?;
    let (row, col) = (Var(k.vars.len() as u32), Var(k.vars.len() as u32 + 1));
    let split = flat
        .replace(
            &Expr::bin(BinOp::Div, pos.clone(), Expr::int(width)),
            &Expr::var(row),
        )
        .replace(
            &Expr::bin(BinOp::Rem, pos.clone(), Expr::int(width)),
            &Expr::var(col),
        );
    if split.uses(q) {
        return None;
    }
    let step = coefficient(&split, col).filter(|s| (1..=2).contains(s))?;
    let pitch = coefficient(&split, row).filter(|&p| p != step * width)?;
    Some(RowRuns {
        pos,
        width,
        step,
        jump: pitch - step * width,
    })
}

/// The operand that a copy's value `value`, stored in vector loop `lane` inside serial loop `q`, reads
/// transposed: the one load (buffer and index) whose elements lie more than 4 apart along the lanes (a
/// channel plane) and 1 to 4 apart along `q`, with that step; None where there is none or more than
/// one. Code generation runs such a copy as blocks of steps of `q` transposed in registers
/// (`mlopt-llvm/src/transpose.rs`), and the CPU schedule keeps `q` on one thread for it.
pub fn transposed_operand(
    k: &Kernel,
    value: &Expr,
    lane: Var,
    q: Var,
) -> Option<(BufId, Vec<Expr>, i64)> {
    let mut found: Vec<(BufId, Vec<Expr>, i64)> = Vec::new();
    for_each_load(value, &mut |b, ix| {
        let flat = flat_index(k, b, ix);
        if let (Some(cl), Some(st @ 1..=4)) = (coefficient(&flat, lane), coefficient(&flat, q)) {
            if cl.abs() > 4 && !found.iter().any(|(g, gx, _)| *g == b && gx[..] == *ix) {
                found.push((b, ix.to_vec(), st));
            }
        }
    });
    match found.len() {
        1 => found.pop(),
        _ => None,
    }
}
