//! bf16 contractions as kernel IR `mma` blocks, for the CPU's bf16 matrix unit (AMX tiles, or AVX512-BF16
//! dot products where there are no tiles; code generation picks the instructions):
//!
//! ```text
//! a_pad[Mp, Kp] = A, zero-padded to whole blocks          (bf16, per call; fuses A's producer)
//! for jb in 0..Np/nb:                                      (parallel by the CPU schedule when it pays)
//!   for ib in 0..Mp/mb:
//!     mma<mb x nb x Kp> c[0, 0] = a_pad[ib*mb, 0] * b_packed[0, 2*nb*jb]
//!     for ii < mb, jj < nb that exist (the output's contiguous axis innermost, `Epilogue`):
//!       out[ib*mb+ii, jb*nb+jj] = epilogue(c[ii, jj])
//! ```
//!
//! B is a constant, packed at compile time into the pair-interleaved layout the tiles read
//! (`b_packed[k / 2, 2 j + k % 2]`, zero-padded); blocks are 32x32 (16 where M or N is smaller), so C is
//! four 16x16 f32 tiles held across all of K. The epilogue reads the block's C from a 4 KiB local
//! while it is in L1.

use crate::elementwise::lit;
use crate::error::Result;
use crate::kernel::Lowerer;
use mlopt_ir::{DType, Tensor, Value};
use mlopt_kir::{BinOp, Block, Elem, Expr, LoopKind, Space, Stmt};
use std::sync::Arc;

/// k per AMX step (one tile row of bf16).
const KB: u64 = 32;

/// B's constant bf16 tensor when a contraction of `a` by `b` (reduction length `k`, `n` columns) can
/// run as `mma` blocks: the target has a bf16 matrix unit that pays, both operands are bf16, B is a
/// 2-D constant (or a 1x1 convolution's [M, C, 1, 1], laid out as [M, C]), and K and N fill tiles.
pub fn eligible(l: &Lowerer, a: Value, b: Value, k: u64, n: u64) -> Option<Arc<Tensor>> {
    if !l.mma || l.ty(a).dtype != DType::BF16 || k < KB || n < 16 {
        return None;
    }
    let w = l.g.const_value(b)?;
    let matrix = w.shape().len() >= 2 && w.shape()[2..].iter().all(|d| *d == 1);
    (w.dtype() == DType::BF16 && matrix).then(|| w.clone())
}

/// B ([K, N], or [N, K] when `trans`) as bf16 bytes [np / nb, kp / 2, 2 nb]: one contiguous panel per
/// column block (tile rows 128 bytes apart, not a whole row of B, which would put all 16 rows of a tile
/// in one L1 set), pairs of k interleaved per column.
fn pack(w: &Tensor, k: u64, n: u64, kp: u64, np: u64, nb: u64, trans: bool) -> Vec<u8> {
    let values = w.view::<mlopt_ir::half::bf16>().map(|a| a.as_standard_layout());
    let src = values.as_ref().and_then(|a| a.as_slice()).unwrap_or_default();
    let at = |kk: u64, j: u64| -> [u8; 2] {
        let i = if trans { j * k + kk } else { kk * n + j } as usize;
        match src.get(i) {
            Some(v) if kk < k && j < n => v.to_bits().to_le_bytes(),
            _ => [0, 0],
        }
    };
    let mut out = Vec::with_capacity((kp * np * 2) as usize);
    for jb in 0..np / nb {
        for k2 in 0..kp / 2 {
            for j in jb * nb..(jb + 1) * nb {
                for p in 0..2 {
                    out.extend_from_slice(&at(2 * k2 + p, j));
                }
            }
        }
    }
    out
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// Reads A's element (row, k) as bf16.
pub type AOp<'a> = &'a mut dyn FnMut(&mut Lowerer, &Expr, &Expr) -> Result<Expr>;
/// Stores the f32 result for (row, column).
pub type StoreOp<'a> = &'a mut dyn FnMut(&mut Lowerer, &Expr, &Expr, Expr) -> Result<Stmt>;

/// Which of the output's axes is contiguous in memory: columns (MatMul, Gemm) or rows (a pointwise
/// convolution, whose rows are pixel positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    ColumnsInner,
    RowsInner,
}

/// out(row, j) = sum over k of a(row, k) * B[k, j] for `rows` x `n` outputs, in `mma` blocks.
#[allow(clippy::too_many_arguments)]
pub fn contract(l: &mut Lowerer, name: &str, rows: u64, n: u64, k: u64, w: &Tensor, trans: bool, order: Epilogue, a: AOp, store: StoreOp) -> Result<Vec<Stmt>> {
    let mb = if rows >= 32 { 32 } else { 16 };
    let nb = if n >= 32 { 32 } else { 16 };
    let (mp, np, kp) = (round_up(rows, mb), round_up(n, nb), round_up(k, KB));
    let bp = l.weight(mlopt_kir::Weight {
        name: format!("{name}.amx{nb}"),
        elem: Elem::BF16,
        dims: vec![np / nb, kp / 2, 2 * nb],
        data: Arc::new(pack(w, k, n, kp, np, nb, trans)),
    });
    l.k.schedule.push(mlopt_kir::ScheduleStep::Matrix { mb, nb, kb: kp, m: rows, n, k });

    // A as tiles read it: the buffer A already is when it is a plain [rows, k] bf16 buffer of whole
    // blocks whose rows are not a multiple of 512 bytes apart (16 such rows share few L1 sets), else a
    // zero-padded copy with 64 bytes more per row (which also computes A's fused producer once).
    let stride = if (kp * 2).is_multiple_of(512) { kp + 32 } else { kp };
    let (pr, pk) = (l.fresh("p"), l.fresh("p"));
    let (rv, kv) = (Expr::var(pr), Expr::var(pk));
    let direct = match a(l, &rv, &kv)? {
        Expr::Load(buf, ix) if ix == [rv.clone(), kv.clone()] && l.k.buffer(buf).elem == Elem::BF16 && mp == rows && stride == k => Some(buf),
        _ => None,
    };
    let mut stmts = Vec::new();
    let apad = match direct {
        Some(buf) => buf,
        None => {
            let apad = l.k.buf(format!("a_pad{}", l.k.bufs.len()), Elem::BF16, vec![mp, stride], Space::Local);
            stmts = l.nest("p", &[mp, kp], |l, ix| {
                let (r, kk) = (&ix[0], &ix[1]);
                let value = if (mp, kp) == (rows, k) {
                    a(l, r, kk)?
                } else {
                    let inside =
                        Expr::bin(BinOp::And, Expr::bin(BinOp::Lt, r.clone(), Expr::int(rows as i64)), Expr::bin(BinOp::Lt, kk.clone(), Expr::int(k as i64)));
                    let v = a(l, &crate::kernel::clamp(r.clone(), rows as i64), &crate::kernel::clamp(kk.clone(), k as i64))?;
                    Expr::select(inside, v, lit(0.0, Elem::BF16))
                };
                Ok(vec![Stmt::Store { buf: apad, index: ix.to_vec(), value }])
            })?;
            apad
        }
    };

    let c = l.k.buf(format!("c_blk{}", l.k.bufs.len()), Elem::F32, vec![mb, nb], Space::Local);
    // Row blocks in chunks of up to 8 (256 rows), so a chunk of A stays in L2 while every column block
    // of B streams past it.
    let blocks = mp / mb;
    let per = (1..=8).rev().find(|d| blocks % d == 0).unwrap_or(1);
    let (ic, jb, ibi, ii, jj) = (l.fresh("ic"), l.fresh("jb"), l.fresh("ib"), l.fresh("ii"), l.fresh("jj"));
    let ib = Expr::add(Expr::mul(Expr::var(ic), Expr::int(per as i64)), Expr::var(ibi));
    let row = Expr::add(Expr::mul(ib.clone(), Expr::int(mb as i64)), Expr::var(ii));
    let col = Expr::add(Expr::mul(Expr::var(jb), Expr::int(nb as i64)), Expr::var(jj));
    // The epilogue walks the block with the loop whose outputs are contiguous innermost (`order`), so
    // the CPU schedule can store it as vectors.
    let st = store(l, &row, &col, Expr::load(c, vec![Expr::var(ii), Expr::var(jj)]))?;
    let guard = |st: Vec<Stmt>, i: &Expr, len: u64, whole: bool| {
        if whole {
            st
        } else {
            vec![Stmt::If { cond: Expr::bin(BinOp::Lt, i.clone(), Expr::int(len as i64)), then: st }]
        }
    };
    let epilogue = match order {
        Epilogue::ColumnsInner => {
            let cols = vec![Stmt::For { var: jj, extent: nb, kind: LoopKind::Serial, body: guard(vec![st], &col, n, n.is_multiple_of(nb)) }];
            Stmt::For { var: ii, extent: mb, kind: LoopKind::Serial, body: guard(cols, &row, rows, rows.is_multiple_of(mb)) }
        }
        Epilogue::RowsInner => {
            let rows_ = vec![Stmt::For { var: ii, extent: mb, kind: LoopKind::Serial, body: guard(vec![st], &row, rows, rows.is_multiple_of(mb)) }];
            Stmt::For { var: jj, extent: nb, kind: LoopKind::Serial, body: guard(rows_, &col, n, n.is_multiple_of(nb)) }
        }
    };
    let mma = Stmt::Mma {
        m: mb,
        n: nb,
        k: kp,
        c: Block { buf: c, at: vec![Expr::int(0), Expr::int(0)] },
        a: Block { buf: apad, at: vec![Expr::mul(ib, Expr::int(mb as i64)), Expr::int(0)] },
        b: Block { buf: bp, at: vec![Expr::var(jb), Expr::int(0), Expr::int(0)] },
        acc: false,
    };
    let block = vec![mma, epilogue];
    let for_ = |var, extent, body| Stmt::For { var, extent, kind: LoopKind::Serial, body };
    stmts.push(for_(ic, blocks / per, vec![for_(jb, np / nb, vec![for_(ibi, per, block)])]));
    Ok(stmts)
}
