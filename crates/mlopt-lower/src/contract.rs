//! The register-tiled contraction schedule (MatMul, Gemm, 2-D Conv by implicit GEMM):
//!
//! ```text
//! for batch..                                   (parallel by the CPU schedule when it pays)
//!   for jo in 0..N/nr, io in 0..M/mr       (the last M % mr rows: a second, shorter tile)
//!     acc[mr, nr] = 0                           (mr x nr/lanes vector registers)
//!     for k..                                   (the reduction: K, or Cin x KH x KW)
//!       unrolled ii in 0..mr, unrolled jv in 0..nr/lanes, vector jl in 0..lanes:
//!         acc[ii, jv*lanes+jl] = fma(a(io*mr+ii, k), b(k, jo*nr+jv*lanes+jl), acc[..])
//!     store acc (with the kernel's epilogue applied in registers)
//! ```
//!
//! `a` is broadcast (one scalar per row), `b` is one vector load per `jv` reused by all `mr` rows: the
//! 6 x 64 AVX-512 micro-kernel keeps 24 accumulators, 4 B vectors and a broadcast in 29 of the 32 zmm
//! registers (6 x 16 with AVX2's 16 ymm). The tile is chosen here, at lowering, because it shapes the
//! accumulator buffer; the CPU schedule then only picks the parallel loop.

use crate::error::Result;
use crate::kernel::Lowerer;
use mlopt_kir::{Elem, Expr, LoopKind, Space, Stmt, Var};

/// Register tile: `mr` rows by `nr` columns, `nr` a multiple of `lanes`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tile {
    pub mr: u64,
    pub nr: u64,
    pub lanes: u32,
}

/// The largest tile whose columns divide N and whose accumulators fit the registers, or None (then the
/// plain loop nest runs).
pub fn pick(m: u64, n: u64, lanes: u32) -> Option<Tile> {
    let regs = if lanes >= 16 { 32 } else { 16 };
    let lanes = [lanes, 8].into_iter().find(|w| *w <= lanes && n.is_multiple_of(*w as u64))? as u64;
    let max_vecs = if regs == 32 { 4 } else { 2 };
    let nv = (1..=max_vecs).rev().find(|v| n.is_multiple_of(v * lanes))?;
    // mr rows x nv vectors of accumulators + nv B vectors + 1 broadcast must fit.
    // Rows need not divide M: the last M % mr rows get a tile of their own.
    let mr = (1..=6u64.min(m.max(1))).rev().find(|r| r * nv + nv < regs)?;
    Some(Tile { mr, nr: nv * lanes, lanes: lanes as u32 })
}

fn for_(var: Var, extent: u64, kind: LoopKind, body: Vec<Stmt>) -> Stmt {
    Stmt::For { var, extent, kind, body }
}

pub type RowOp<'a> = &'a mut dyn FnMut(&mut Lowerer, &[Expr], &Expr, &[Expr]) -> Result<Expr>;
/// b(batch, k, jo, jj): column `jo * nr + jj`, given as the tile and the column in it (so a packed B can
/// be indexed by panel).
pub type ColOp<'a> = &'a mut dyn FnMut(&mut Lowerer, &[Expr], &[Expr], &Expr, &Expr) -> Result<Expr>;
pub type StoreOp<'a> = &'a mut dyn FnMut(&mut Lowerer, &[Expr], &Expr, &Expr, Expr) -> Result<Stmt>;

/// out(batch, i, j) = sum over k of a(batch, i, k) * b(batch, k, j), tiled by `t`.
/// Column `jo * nr + jj` of a tile.
pub fn column(t: Tile, jo: &Expr, jj: &Expr) -> Expr {
    Expr::add(Expr::mul(jo.clone(), Expr::int(t.nr as i64)), jj.clone())
}

/// B [K, N] (row-major f32 bytes; [N, K] when `trans`) packed into column panels [N / nr, K, nr]: a
/// tile's k-th row of B is then `nr` contiguous floats, and a whole panel is one sequential stream.
pub fn pack_panels(b: &[u8], k: u64, n: u64, nr: u64, trans: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    for jo in 0..n / nr {
        for kk in 0..k {
            for jj in 0..nr {
                let j = jo * nr + jj;
                let at = (if trans { j * k + kk } else { kk * n + j } * 4) as usize;
                out.extend_from_slice(&b[at..at + 4]);
            }
        }
    }
    out
}

pub fn tiled(l: &mut Lowerer, batch: &[u64], m: u64, n: u64, k: &[u64], t: Tile, a: RowOp, b: ColOp, store: StoreOp) -> Result<Vec<Stmt>> {
    l.k.schedule.push(format!("tile({}x{})", t.mr, t.nr));
    let acc = l.k.buf(format!("acc{}", l.k.bufs.len()), Elem::F32, vec![t.mr, t.nr], Space::Local);
    l.nest("b", batch, |l, bi| {
        let main = m - m % t.mr;
        let mut out = Vec::new();
        if main > 0 {
            out.push(row_block(l, bi, 0, main, n, t, acc, k, a, b, store)?);
        }
        if main < m {
            let tail = Tile { mr: m - main, ..t };
            out.push(row_block(l, bi, main, m - main, n, tail, acc, k, a, b, store)?);
        }
        Ok(out)
    })
}

/// Rows `row0..row0 + rows` (a multiple of `t.mr`) of the contraction, every column.
fn row_block(l: &mut Lowerer, bi: &[Expr], row0: u64, rows: u64, n: u64, t: Tile, acc: mlopt_kir::BufId, k: &[u64], a: RowOp, b: ColOp, store: StoreOp) -> Result<Stmt> {
    let (io, jo) = (l.fresh("io"), l.fresh("jo"));
    let row = |ii: &Expr| Expr::add(Expr::int(row0 as i64), Expr::add(Expr::mul(Expr::var(io), Expr::int(t.mr as i64)), ii.clone()));
    let col_in_tile = |jv: Var, jl: Var| Expr::add(Expr::mul(Expr::var(jv), Expr::int(t.lanes as i64)), Expr::var(jl));
    // One sweep over the tile: unrolled rows, unrolled vectors, one vector of lanes.
    let sweep = |l: &mut Lowerer, f: &mut dyn FnMut(&mut Lowerer, Expr, Expr) -> Result<Stmt>| -> Result<Stmt> {
        let (ii, jv, jl) = (l.fresh("ii"), l.fresh("jv"), l.fresh("jl"));
        let s = f(l, Expr::var(ii), col_in_tile(jv, jl))?;
        let inner = for_(jl, t.lanes as u64, LoopKind::Vector(t.lanes), vec![s]);
        Ok(for_(ii, t.mr, LoopKind::Unrolled, vec![for_(jv, t.nr / t.lanes as u64, LoopKind::Unrolled, vec![inner])]))
    };
    let zero = sweep(l, &mut |_, ii, jj| Ok(Stmt::Store { buf: acc, index: vec![ii, jj], value: Expr::f32(0.0) }))?;
    let update = l.nest("k", k, |l, kk| {
        Ok(vec![sweep(l, &mut |l, ii, jj| {
            let av = a(l, bi, &row(&ii), kk)?;
            let bv = b(l, bi, kk, &Expr::var(jo), &jj)?;
            Ok(Stmt::Store { buf: acc, index: vec![ii.clone(), jj.clone()], value: Expr::fma(av, bv, Expr::load(acc, vec![ii, jj])) })
        })?])
    })?;
    let out = sweep(l, &mut |l, ii, jj| {
        let v = Expr::load(acc, vec![ii.clone(), jj.clone()]);
        store(l, bi, &row(&ii), &column(t, &Expr::var(jo), &jj), v)
    })?;
    let mut body = vec![zero];
    body.extend(update);
    body.push(out);
    // Column panels outside, rows inside: one nr-wide panel of B stays in cache while every row of A
    // passes over it (B is usually the larger operand: the weights).
    Ok(for_(jo, n / t.nr, LoopKind::Serial, vec![for_(io, rows / t.mr, LoopKind::Serial, body)]))
}
