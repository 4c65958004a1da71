//! bf16 contractions as kernel IR `mma` blocks, for the CPU's bf16 matrix unit (AMX tiles, or AVX512-BF16
//! dot products where there are no tiles; code generation picks the instructions), scheduled from the
//! algorithm form (`contraction.rs` recognises it) when the CPU schedule asks for them:
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
//! B is a constant bf16 weight (a MatMul's or Gemm's [K, N] or [N, K]), packed into the
//! pair-interleaved layout the tiles read (`b_packed[k / 2, 2 j + k % 2]`, zero-padded), a weight that
//! replaces it; A is an f32 cast of bf16 values. A pointwise convolution is the other way round
//! (`weight_rows`): its weight [M, C, 1, 1] is A and its activations are packed into B per call. Blocks are 32x32 (16 where M or N is smaller), so
//! C is four 16x16 f32 tiles held across all of K. The epilogue reads the block's C from a 4 KiB local
//! while it is in L1.

use super::mma_epilogue::Epilogue;
use super::mma_epilogue::{epilogue, oriented_store};
use super::tiler::{self, Builder};
use crate::contraction::{store_at, Contraction};
use crate::error::Result;
use crate::gpu::gemm::narrow;
use mlopt_cost::tile::BlockCopy;
use mlopt_kir::index::delinear;
use mlopt_kir::index::{clamp, lit};
use mlopt_kir::{
    BinOp, Block, BufId, Elem, Expr, LoopKind, Place, Program, Space, Stmt, Var, Weight,
};
use mlopt_target::CpuTarget;
use std::collections::HashMap;
use std::sync::Arc;

/// k per AMX step (one tile row of bf16).
const KB: u64 = 32;

/// The types of a contraction's `mma` blocks: bf16 pairs summed in f32 (the bf16 matrix unit), or i16
/// pairs in i32 (the integer dot product: quantized models' 8-bit values less their zero points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pairs {
    Bf16,
    I16,
}

impl Pairs {
    /// The blocks of a contraction summed in `sum`.
    pub(crate) fn of(sum: Elem) -> Option<Pairs> {
        match sum {
            Elem::F32 => Some(Pairs::Bf16),
            Elem::I32 => Some(Pairs::I16),
            _ => None,
        }
    }

    pub(crate) fn operand(self) -> Elem {
        match self {
            Pairs::Bf16 => Elem::BF16,
            Pairs::I16 => Elem::I16,
        }
    }

    pub(crate) fn sum(self) -> Elem {
        match self {
            Pairs::Bf16 => Elem::F32,
            Pairs::I16 => Elem::I32,
        }
    }

    /// What runs the blocks on `t`: the bf16 matrix unit; for i16 the integer dot product, which
    /// takes blocks as `vdpbf16ps` does (any rows, pairs of k).
    pub(crate) fn unit(self, t: &CpuTarget) -> Option<mlopt_target::MatrixUnit> {
        match self {
            Pairs::Bf16 => t.matrix(),
            Pairs::I16 => t.i16_dot().map(|_| mlopt_target::MatrixUnit::Dot),
        }
    }

    /// An integer block's columns over `n`: two vectors of the dot product's lanes (16 on ymm, where
    /// four would leave room for two rows a group), one where `n` fits; None for bf16 (callers size it).
    pub(crate) fn columns(self, t: &CpuTarget, n: u64) -> Option<u64> {
        let lanes = u64::from(t.i16_dot().filter(|_| self == Pairs::I16)?.lanes);
        Some(if n > lanes { 2 * lanes } else { lanes })
    }

    /// Whether blocks of `shape` (`depth`, `copy`: `mlopt_cost::tile::bf16_block_pays`) beat f32 tiles:
    /// the cost model's call for bf16; always for i16 (f32 tiles cannot sum them exactly).
    fn pay(
        self,
        t: &CpuTarget,
        shape: (u64, u64, u64),
        depth: (u64, u64),
        copy: BlockCopy,
    ) -> bool {
        match self {
            Pairs::Bf16 => mlopt_cost::tile::bf16_block_pays(t, shape, depth, copy),
            Pairs::I16 => self.unit(t).is_some(),
        }
    }
}

/// The step K is padded to: a tile row for AMX, a pair for a dot product (a 16-channel pointwise
/// convolution would otherwise multiply as many zeros as values).
fn k_step(t: &CpuTarget, pairs: Pairs) -> u64 {
    match pairs.unit(t) {
        Some(mlopt_target::MatrixUnit::Amx) | None => KB,
        Some(mlopt_target::MatrixUnit::Dot) => 2,
    }
}

/// A bf16 matrix B (`at(k, j)`: element (k, j) as little-endian bytes, zero outside it) as bf16 bytes
/// [np / nb, kp / 2, 2 nb]: one contiguous panel per column block (tile rows 128 bytes apart, not a
/// whole row of B, which would put all 16 rows of a tile in one L1 set), pairs of k interleaved per
/// column.
pub(super) fn pack(at: &dyn Fn(u64, u64) -> [u8; 2], kp: u64, np: u64, nb: u64) -> Vec<u8> {
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

/// Element `i` of little-endian bf16 bytes `w`, or zero when `inside` is false or it is past the end.
pub(super) fn bf16_at(w: &[u8], i: u64, inside: bool) -> [u8; 2] {
    let i = i as usize * 2;
    match w.get(i..i + 2) {
        Some(v) if inside => [v[0], v[1]],
        _ => [0, 0],
    }
}

pub(super) fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// Reads A's element (row, k) as bf16.
pub(super) type AOp<'a> = &'a mut dyn FnMut(&mut Builder<'_>, &Expr, &Expr) -> Result<Expr>;
/// Stores the f32 result for (row, column).
pub(super) type StoreOp<'a> =
    &'a mut dyn FnMut(&mut Builder<'_>, &Expr, &Expr, Expr) -> Result<Stmt>;

/// The blocks for `rows` x `n` outputs (K = `k`): (mb, nb, padded rows, columns and K). AMX tiles take
/// 16 or 32 rows; `vdpbf16ps` any, so the rows split into equal blocks of at most 32 (ViT's 197 tokens:
/// 7 blocks of 29, where blocks of 32 padded them to 224; a 7x7 window's 49 positions: 2 of 25).
pub(super) fn blocks(
    t: &CpuTarget,
    pairs: Pairs,
    rows: u64,
    n: u64,
    k: u64,
) -> (u64, u64, u64, u64, u64) {
    let mb = match pairs.unit(t) {
        Some(mlopt_target::MatrixUnit::Dot) => rows.div_ceil(rows.div_ceil(32)).max(1),
        _ if rows >= 32 => 32,
        _ => 16,
    };
    let nb = match pairs.columns(t, n) {
        Some(nb) => nb,
        None if n >= 32 => 32,
        None => 16,
    };
    (
        mb,
        nb,
        round_up(rows, mb),
        round_up(n, nb),
        round_up(k, k_step(t, pairs)),
    )
}

/// out(row, j) = sum over k of a(row, k) * B[k, j] for `rows` x `n` outputs, in `mma` blocks; `bp` is
/// B packed for `blocks(rows, n, k)`.
#[allow(clippy::too_many_arguments)]
fn contract(
    l: &mut Builder,
    pairs: Pairs,
    bp: BufId,
    rows: u64,
    n: u64,
    k: u64,
    order: Epilogue,
    a: AOp,
    store: StoreOp,
) -> Result<Vec<Stmt>> {
    let (_, _, mp, _, kp) = blocks(l.target, pairs, rows, n, k);
    let (apad, mut stmts) = a_operand(l, pairs, (rows, mp), (k, kp), a)?;
    stmts.extend(block_loops(
        l,
        apad,
        bp,
        (rows, n, k),
        Out::Epilogue(order, store),
    )?);
    Ok(stmts)
}

/// Where the blocks' products go.
pub(super) enum Out<'a> {
    /// Each block's product into a local, then `store`d element by element (row, column, value),
    /// walked with `Epilogue`'s axis innermost.
    Epilogue(Epilogue, StoreOp<'a>),
    /// Straight into this f32 buffer of at least [padded rows, padded columns]: block (ib, jb) at
    /// [ib mb, jb nb], padding included.
    Into(BufId),
}

/// The loops over blocks: out(row, j) = sum over k of A[row, k] * B[k, j], A in `apad` (bf16, [mp, >= kp],
/// padded) and B in `bp` (packed for `blocks(rows, n, k)`); the products go to `out`.
pub(super) fn block_loops(
    l: &mut Builder,
    apad: BufId,
    bp: BufId,
    (rows, n, k): (u64, u64, u64),
    out: Out,
) -> Result<Vec<Stmt>> {
    // The blocks' types are A's.
    let pairs = match l.kernel().buffer(apad).elem {
        Elem::I16 => Pairs::I16,
        _ => Pairs::Bf16,
    };
    let (mb, nb, mp, np, kp) = blocks(l.target, pairs, rows, n, k);
    l.kernel().schedule.push(mlopt_kir::ScheduleStep::Matrix {
        mb,
        nb,
        kb: kp,
        m: rows,
        n,
        k,
    });
    // Row blocks in chunks of up to 8 (256 rows), so a chunk of A stays in L2 while every column block
    // of B streams past it.
    let blocks = mp / mb;
    let per = (1..=8).rev().find(|d| blocks % d == 0).unwrap_or(1);
    let (ic, jb, ibi) = (l.fresh("ic"), l.fresh("jb"), l.fresh("ib"));
    let ib = Expr::add(
        Expr::mul(Expr::var(ic), Expr::int(per as i64)),
        Expr::var(ibi),
    );
    let at = |e: &Expr, by: u64| Expr::mul(e.clone(), Expr::int(by as i64));
    let (c, c_at, epilogue) = match out {
        Out::Into(c) => (c, vec![at(&ib, mb), at(&Expr::var(jb), nb)], None),
        Out::Epilogue(order, store) => {
            let k_ = l.kernel();
            let c = k_.buf(
                format!("c_blk{}", k_.bufs.len()),
                pairs.sum(),
                vec![mb, nb],
                Space::Local,
            );
            let (ii, jj) = (l.fresh("ii"), l.fresh("jj"));
            let row = Expr::add(at(&ib, mb), Expr::var(ii));
            let col = Expr::add(at(&Expr::var(jb), nb), Expr::var(jj));
            let st = store(
                l,
                &row,
                &col,
                Expr::load(c, vec![Expr::var(ii), Expr::var(jj)]),
            )?;
            let ranges = HashMap::from([
                (ii, mb),
                (jj, nb),
                (jb, np / nb),
                (ic, blocks / per),
                (ibi, per),
            ]);
            let (st, order) = oriented_store(l.kernel(), st, order, (ii, jj), &ranges);
            let tail = l.fresh("ii");
            let e = epilogue(
                st,
                order,
                (ii, &row, mb, rows, &ib),
                (jj, &col, nb, n, &Expr::var(jb)),
                tail,
            );
            (c, vec![Expr::int(0), Expr::int(0)], Some(e))
        }
    };
    // A packed weight that streams from memory: each block fetches the next column block's panel,
    // which follows its own. A B packed per call, a pointwise convolution's activations, is in cache
    // already.
    let target = l.target;
    let b_buf = l.kernel().buffer(bp);
    let ahead =
        b_buf.space != Space::Local && mlopt_cost::tile::weight_streams(target, b_buf.numel() * 2);
    let mma = Stmt::Mma {
        m: mb,
        n: nb,
        k: kp,
        c: Block { buf: c, at: c_at },
        a: Block {
            buf: apad,
            at: vec![at(&ib, mb), Expr::int(0)],
        },
        b: Block {
            buf: bp,
            at: vec![Expr::var(jb), Expr::int(0), Expr::int(0)],
        },
        acc: false,
        ahead,
    };
    let block = std::iter::once(mma).chain(epilogue).collect();
    let for_ = |var, extent, body| Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    };
    Ok(vec![for_(
        ic,
        blocks / per,
        vec![for_(jb, np / nb, vec![for_(ibi, per, block)])],
    )])
}

/// The row length of an A operand of depth `kp` (bf16 elements): rows a multiple of 512 bytes apart
/// would put a block's 16 rows in few L1 sets, so those get 64 bytes more.
pub(super) fn row_stride(kp: u64) -> u64 {
    if (kp * 2).is_multiple_of(512) {
        kp + 32
    } else {
        kp
    }
}

/// A as the blocks read it (`rows` x `k`, padded to `mp` x `kp`): the buffer A already is when it is
/// a plain [rows, k] bf16 buffer of whole blocks whose rows are not a multiple of 512 bytes apart (16
/// such rows share few L1 sets), else a zero-padded copy with 64 bytes more per row (which also
/// computes A's fused producer once); with the statements that fill the copy.
pub(super) fn a_operand(
    l: &mut Builder,
    pairs: Pairs,
    (rows, mp): (u64, u64),
    (k, kp): (u64, u64),
    a: AOp,
) -> Result<(BufId, Vec<Stmt>)> {
    let stride = row_stride(kp);
    let (pr, pk) = (l.fresh("p"), l.fresh("p"));
    let (rv, kv) = (Expr::var(pr), Expr::var(pk));
    match a(l, &rv, &kv)? {
        Expr::Load(buf, ix)
            if ix == [rv.clone(), kv.clone()]
                && l.kernel().buffer(buf).elem == pairs.operand()
                && mp == rows
                && stride == k =>
        {
            return Ok((buf, Vec::new()));
        }
        _ => {}
    }
    let k_ = l.kernel();
    let apad = k_.buf(
        format!("a_pad{}", k_.bufs.len()),
        pairs.operand(),
        vec![mp, stride],
        Space::Local,
    );
    let fill = tiler::nest(l, "p", &[mp, kp], |l, ix| {
        let (r, kk) = (&ix[0], &ix[1]);
        let value = if (mp, kp) == (rows, k) {
            a(l, r, kk)?
        } else {
            let inside = Expr::bin(
                BinOp::And,
                Expr::bin(BinOp::Lt, r.clone(), Expr::int(rows as i64)),
                Expr::bin(BinOp::Lt, kk.clone(), Expr::int(k as i64)),
            );
            let (r, kk) = (clamp(r.clone(), rows as i64), clamp(kk.clone(), k as i64));
            Expr::select(inside, a(l, &r, &kk)?, lit(0.0, pairs.operand()))
        };
        Ok(vec![Stmt::Store {
            buf: apad,
            index: ix.to_vec(),
            value,
        }])
    })?;
    Ok((apad, fill))
}

/// A constant weight of `pairs`' operand type as one operand of a contraction over K loop `r` and the
/// columns `cols`: `f32(W[r, j, 0..])`, or `f32(W[j, r, 0..])` (transposed; i32 for i16), read only
/// here; the weight's buffer, whether it is transposed, and (step, parameter, weight) binding it.
fn weight(
    p: &Program,
    pairs: Pairs,
    ki: usize,
    e: &Expr,
    r: Var,
    cols: &[(Var, u64)],
    loads: &HashMap<BufId, usize>,
) -> Option<(BufId, bool, (usize, usize, usize))> {
    let Expr::Cast(sum, x) = e else {
        return None;
    };
    let [(j, _)] = cols[..] else { return None };
    if *sum != pairs.sum() {
        return None;
    }
    let super::layout::WeightOperand {
        buf: w,
        trans,
        bound,
        ..
    } = super::layout::weight_operand(p, ki, x, (r, j), loads)?;
    let wt = &p.weights[bound.2];
    (wt.elem == pairs.operand() && p.kernels[ki].buffer(w).elem == pairs.operand())
        .then_some((w, trans, bound))
}

/// The `mma` blocks of contraction `c` (its epilogue the one store `store`: buffer, index, value) when
/// one operand is a constant bf16 weight, the other an f32 cast of bf16 values (or both i16, the
/// contraction summed in i32), with one K loop of at least 16 and at least 16 columns. The weight is
/// packed into a weight of its own that replaces it.
pub(crate) fn in_blocks(
    p: &mut Program,
    target: &CpuTarget,
    ki: usize,
    c: &Contraction,
    loads: &HashMap<BufId, usize>,
    store: (BufId, &[Expr], &Expr),
) -> Result<Option<Vec<Stmt>>> {
    let mut c = c.clone();
    c.drop_unit_reductions();
    // Column loops that do not continue the inner columns' addresses (a batched pointwise
    // convolution's images) run outside the blocks, as for the fp32 tiles: the blocks of one image.
    c.split_strided_cols(&p.kernels[ki], store);
    let batch = std::mem::take(&mut c.batch);
    let Some(pairs) = Pairs::of(c.sum) else {
        return Ok(None);
    };
    let order = Epilogue::ColumnsInner;
    let Some(mut stmts) = unbatched(p, (target, pairs), ki, &c, loads, store, order)? else {
        return Ok(None);
    };
    for &(v, e) in batch.iter().rev() {
        stmts = if e == 1 {
            stmts.iter().map(|s| s.subst(v, &Expr::int(0))).collect()
        } else {
            vec![Stmt::For {
                var: v,
                extent: e,
                kind: LoopKind::Serial,
                body: stmts,
            }]
        };
    }
    Ok(Some(stmts))
}

/// `in_blocks` for a contraction without batch loops (`c.batch` empty; a batch loop's variable may occur
/// free, bound by the loop the caller puts around the statements), its epilogue along `order` where the
/// weight is B (a MatMul's columns; the rows for a pointwise convolution turned around).
fn unbatched(
    p: &mut Program,
    (target, pairs): (&CpuTarget, Pairs),
    ki: usize,
    c: &Contraction,
    loads: &HashMap<BufId, usize>,
    store: (BufId, &[Expr], &Expr),
    order_b: Epilogue,
) -> Result<Option<Vec<Stmt>>> {
    let [(r, k)] = &c.red[..] else {
        return Ok(None);
    };
    let (r, k) = (*r, *k);
    // B is the weight: the columns' operand (MatMul, Gemm), or the rows' (a pointwise convolution's
    // output channels), which turns the contraction around.
    let (x, (w, trans, (si, pi, wi)), rows, cols, weight_a) = match (
        weight(p, pairs, ki, &c.b, r, &c.cols, loads),
        weight(p, pairs, ki, &c.a, r, &c.rows, loads),
    ) {
        (Some(wb), _) => (&c.a, wb, &c.rows, &c.cols, false),
        (None, Some(wa)) => (&c.b, wa, &c.cols, &c.rows, true),
        _ => return Ok(None),
    };
    let (m, n) = (Contraction::extent(rows), Contraction::extent(cols));
    let x = narrow(&p.kernels[ki], x, pairs.operand());
    let Some(x) = x.filter(|_| k >= 16 && n >= 16) else {
        return Ok(None);
    };
    if weight_a {
        if positions_as_rows(target, pairs, n, m, k) {
            return unbatched(
                p,
                (target, pairs),
                ki,
                &c.swapped(),
                loads,
                store,
                Epilogue::RowsInner,
            );
        }
        return weight_rows(
            p,
            (target, pairs),
            ki,
            (&x, rows, cols[0].0, r),
            (m, n, k),
            (w, trans, (si, pi, wi)),
            (c.acc, store),
        );
    }
    let weight = &p.weights[wi];
    if weight.data.len() as u64 != k * n * 2 {
        return Ok(None);
    }
    let (_, nb, _, np, kp) = blocks(target, pairs, m, n, k);
    // A is read in place when it is a [rows, K] bf16 buffer (`a_operand`), else copied: streamed where
    // every load of it is contiguous along K, else gathered.
    let in_place = matches!(&x, Expr::Load(_, ix)
        if rows.len() == 1 && *ix == [Expr::var(rows[0].0), Expr::var(r)]);
    let mut along_k = true;
    mlopt_kir::analysis::for_each_load(&x, &mut |b, ix| {
        let flat = mlopt_kir::analysis::flat_index(&p.kernels[ki], b, ix);
        along_k &= mlopt_kir::analysis::coefficient(&flat, r) == Some(1);
    });
    let copy = match (in_place, along_k) {
        (true, _) => BlockCopy::None,
        (false, true) => BlockCopy::Streamed(m * k),
        (false, false) => BlockCopy::Gathered(m * k),
    };
    if !pairs.pay(target, (m, n, k), (kp, kp), copy) {
        return Ok(None);
    }
    let packed = Weight {
        name: format!("{}.amx{nb}", weight.name),
        elem: pairs.operand(),
        dims: vec![np / nb, kp / 2, 2 * nb],
        data: Arc::new(pack(
            &|kk, j| {
                let i = if trans { j * k + kk } else { kk * n + j };
                bf16_at(&weight.data, i, kk < k && j < n)
            },
            kp,
            np,
            nb,
        )),
    };
    p.kernels[ki].bufs[w.0 as usize].dims = packed.dims.clone();
    p.weights.push(packed);
    p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);
    let (row_ext, col_var) = (
        rows.iter().map(|(_, e)| *e as i64).collect::<Vec<i64>>(),
        cols[0].0,
    );
    let by = |row: &Expr, col: Option<&Expr>| -> Vec<(Var, Expr)> {
        rows.iter()
            .map(|(v, _)| *v)
            .zip(delinear(row.clone(), &row_ext))
            .chain(col.map(|j| (col_var, j.clone())))
            .collect()
    };
    let acc = c.acc;
    let mut b = Builder {
        k: &mut p.kernels[ki],
        target,
    };
    let stmts = contract(
        &mut b,
        pairs,
        w,
        m,
        n,
        k,
        order_b,
        &mut |_, row, kk| Ok(x.subst_all(&by(row, None)).subst(r, kk)),
        &mut |_, row, j, v| Ok(store_at(store, acc, &by(row, Some(j)), &v)),
    )?;
    Ok(Some(stmts))
}
/// Whether a pointwise convolution of `channels` outputs at `positions` positions (depth `k`) runs with
/// its positions as the blocks' rows: with `vdpbf16ps`, whose blocks take any rows but columns in 16s,
/// where positions as columns pad at least an eighth more work (a 7x7 map's 49 positions to 64, a
/// 14x14 map's 196 to 224 in blocks of 32; not where the channels would pad more: MobileNetV3's 40 to
/// 64). The weight is then B, the activations copied into rows (transposed,
/// `mlopt-llvm/src/transpose.rs`), the epilogue along the positions reading the blocks down their
/// columns (transposed too). (At exactly an eighth, ResNet-50's 14x14 expansions of 256 to 1024
/// channels ran at 70% of the bf16 peak as columns, at 90% as rows.)
fn positions_as_rows(
    target: &CpuTarget,
    pairs: Pairs,
    channels: u64,
    positions: u64,
    k: u64,
) -> bool {
    let (_, _, mp, np, _) = blocks(target, pairs, channels, positions, k);
    let (_, _, mp_swap, np_swap, _) = blocks(target, pairs, positions, channels, k);
    pairs.unit(target) == Some(mlopt_target::MatrixUnit::Dot)
        && 8 * mp_swap * np_swap <= 7 * mp * np
}

/// A pointwise convolution (its output channels the weight's, its positions contiguous in the output) as
/// out[oc, pos] = W[oc, k] x X[k, pos]: the weight is A, packed once as [output channels, K] rows; the
/// activations are B, packed per call into the blocks' k-pair layout from two channel rows at a time
/// (`x[2 k2 + q % 2, pos + q / 2]`, which code generation reads as two row loads and a shuffle); each
/// block's columns are positions, so its epilogue runs along the output's contiguous axis with contiguous
/// reads of the block. (The other way round, positions as A's rows, copied A by gathering channels and
/// read each block's column in the epilogue: EfficientNet's SiLU epilogues ran at half the fp32 speed.)
/// `x` is the bf16 activation over the position loops `rows` and K loop `r`; `oc` the output-channel loop.
#[allow(clippy::type_complexity)]
fn weight_rows(
    p: &mut Program,
    (target, pairs): (&CpuTarget, Pairs),
    ki: usize,
    (x, rows, oc, r): (&Expr, &[(Var, u64)], Var, Var),
    (m, n, k): (u64, u64, u64),
    (w, trans, (si, pi, wi)): (BufId, bool, (usize, usize, usize)),
    (acc, store): (BufId, (BufId, &[Expr], &Expr)),
) -> Result<Option<Vec<Stmt>>> {
    // m positions, n output channels, k input channels: blocks of n rows by m columns.
    if m < 16 {
        return Ok(None);
    }
    let (mb, nb, mp, np, kp) = blocks(target, pairs, n, m, k);
    let copy = BlockCopy::Streamed(m * k);
    if !pairs.pay(target, (n, m, k), (kp, kp), copy) {
        return Ok(None);
    }
    let weight = &p.weights[wi];
    let stride = row_stride(kp);
    let mut data = Vec::with_capacity((mp * stride * 2) as usize);
    for i in 0..mp {
        for kk in 0..stride {
            let at = if trans { i * k + kk } else { kk * n + i };
            data.extend_from_slice(&bf16_at(&weight.data, at, i < n && kk < k));
        }
    }
    let rows_w = Weight {
        name: format!("{}.rows{mb}", weight.name),
        elem: pairs.operand(),
        dims: vec![mp, stride],
        data: Arc::new(data),
    };
    p.kernels[ki].bufs[w.0 as usize].dims = rows_w.dims.clone();
    p.weights.push(rows_w);
    p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);
    let pos_ext: Vec<i64> = rows.iter().map(|(_, e)| *e as i64).collect();
    let by = |pos: &Expr, o: Option<&Expr>| -> Vec<(Var, Expr)> {
        rows.iter()
            .map(|(v, _)| *v)
            .zip(delinear(pos.clone(), &pos_ext))
            .chain(o.map(|o| (oc, o.clone())))
            .collect()
    };
    let mut l = Builder {
        k: &mut p.kernels[ki],
        target,
    };
    let k_ = l.kernel();
    let bp = k_.buf(
        format!("b_pack{}", k_.bufs.len()),
        pairs.operand(),
        vec![np / nb, kp / 2, 2 * nb],
        Space::Local,
    );
    let read = |pos: &Expr, ch: &Expr| x.subst_all(&by(pos, None)).subst(r, ch);
    let mut fill = pack_columns(&mut l, bp, (m, k), &read);
    let loops = block_loops(
        &mut l,
        w,
        bp,
        (n, m, k),
        Out::Epilogue(Epilogue::ColumnsInner, &mut |_, o, pos, v| {
            Ok(store_at(store, acc, &by(pos, Some(o)), &v))
        }),
    )?;
    fill.extend(loops);
    Ok(Some(fill))
}

/// The statements filling `bp` (bf16 [np / nb, kp / 2, 2 nb], the blocks' B layout for `m` columns and
/// depth `k`, as `blocks` gives them) per call from `read(column, k)`, the element as bf16:
/// `bp[jb, k2, q] = read(jb nb + q / 2, 2 k2 + q % 2)`, which code generation reads as two row loads and
/// a shuffle where the source's columns are contiguous. K's padding and the columns past `m` are zeros.
pub(super) fn pack_columns(
    l: &mut Builder,
    bp: BufId,
    (m, k): (u64, u64),
    read: &dyn Fn(&Expr, &Expr) -> Expr,
) -> Vec<Stmt> {
    let dims = &l.kernel().buffer(bp).dims;
    let (nb, np, kp) = (dims[2] / 2, dims[0] * dims[2] / 2, dims[1] * 2);
    let for_ = |var, extent, body| Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    };
    // b_pack[jb, k2, q] = X[2 k2 + q % 2, jb nb + q / 2]: whole column blocks straight from X, K's
    // padding zeros, and the last partial block (positions past m) guarded by a select.
    let mut fill = vec![];
    // b_pack[jb, k2, q0 + q] over column blocks `blocks`, channel pairs `k2s` and pair lanes `qs`.
    let pack = |l: &mut Builder,
                blocks: (i64, u64),
                k2s: (i64, u64),
                qs: (i64, u64),
                value: &dyn Fn(&Expr, &Expr) -> Expr| {
        let (jb, k2, q) = (l.fresh("jb"), l.fresh("k"), l.fresh("q"));
        let j = Expr::add(Expr::var(jb), Expr::int(blocks.0));
        let kk = Expr::add(Expr::var(k2), Expr::int(k2s.0));
        let qq = Expr::add(Expr::var(q), Expr::int(qs.0));
        let pos = Expr::add(
            Expr::mul(j.clone(), Expr::int(nb as i64)),
            Expr::div(qq.clone(), Expr::int(2)),
        );
        let ch = Expr::add(
            Expr::mul(kk.clone(), Expr::int(2)),
            Expr::rem(qq.clone(), Expr::int(2)),
        );
        let st = Stmt::Store {
            buf: bp,
            index: vec![j, kk, qq],
            value: value(&pos, &ch),
        };
        for_(
            jb,
            blocks.1,
            vec![for_(k2, k2s.1, vec![for_(q, qs.1, vec![st])])],
        )
    };
    let whole = m / nb;
    let zero = lit(0.0, l.kernel().buffer(bp).elem);
    let zeros = |_: &Expr, _: &Expr| zero.clone();
    let guarded = |pos: &Expr, ch: &Expr| {
        let inside = Expr::bin(
            BinOp::And,
            Expr::bin(BinOp::Lt, pos.clone(), Expr::int(m as i64)),
            Expr::bin(BinOp::Lt, ch.clone(), Expr::int(k as i64)),
        );
        let v = read(&clamp(pos.clone(), m as i64), &clamp(ch.clone(), k as i64));
        Expr::select(inside, v, zero.clone())
    };
    // The whole column blocks (2 nb pair lanes each) and the last, partial one (the 2 (m % nb) lanes
    // of its positions, zeros past them): whole pairs of channels, an odd K's last channel with a zero,
    // then K's padding.
    let (pairs, odd) = (k / 2, k % 2);
    let mut ranges = vec![];
    if whole > 0 {
        ranges.push(((0, whole), 2 * nb));
    }
    if np / nb > whole {
        ranges.push(((whole as i64, 1), 2 * (m % nb)));
    }
    for (blocks, lanes) in ranges {
        let qs = (0, lanes);
        fill.push(pack(l, blocks, (0, pairs), qs, &read));
        if odd == 1 {
            fill.push(pack(l, blocks, (pairs as i64, 1), qs, &guarded));
        }
        if kp / 2 > pairs + odd {
            let rest = ((pairs + odd) as i64, kp / 2 - pairs - odd);
            fill.push(pack(l, blocks, rest, qs, &zeros));
        }
        if lanes < 2 * nb {
            let past = (lanes as i64, 2 * nb - lanes);
            fill.push(pack(l, blocks, (0, kp / 2), past, &zeros));
        }
    }
    fill
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (output channels, positions, depth) -> positions as the blocks' rows, on `vdpbf16ps`.
    const ORIENTATIONS: &[((u64, u64, u64), bool)] = &[
        ((2048, 49, 512), true), // ResNet-50's 7x7 expansion: 49 positions pad to 64 as columns
        ((1024, 196, 256), true), // its 14x14 expansion: 196 to 224, an eighth
        ((256, 196, 1024), true), // and reduction
        ((40, 196, 120), false), // MobileNetV3: 40 channels would pad to 64 as columns
        ((256, 3136, 64), false), // a 56x56 map fills its blocks of 32
        ((128, 784, 512), false), // and a 28x28 one
    ];

    #[test]
    fn pointwise_convolutions_pick_the_orientation_that_pads_less() {
        let zen4 = mlopt_target::cpu::znver4(1);
        assert_eq!(zen4.matrix(), Some(mlopt_target::MatrixUnit::Dot));
        for &((channels, positions, k), want) in ORIENTATIONS {
            let got = positions_as_rows(&zen4, Pairs::Bf16, channels, positions, k);
            assert_eq!(
                got, want,
                "{channels} channels x {positions} positions x {k}"
            );
        }
        // AMX tiles take rows in 16s or 32s: the columns stay the positions.
        let mut amx = zen4.clone();
        amx.features
            .extend(["amx-tile", "amx-bf16"].map(String::from));
        assert!(!positions_as_rows(&amx, Pairs::Bf16, 2048, 49, 512));
    }
}
