//! The CPU register-tile micro-model: which `mr` x `nr` tile a register-tiled contraction (MatMul, Gemm,
//! implicit-GEMM convolution) uses, by its estimated time on the target (cycles of a core at its clock,
//! with the target's lanes and vector registers); where its reduction runs in blocks so a panel of B
//! stays in the target's L2 (`k_block`); and whether bf16 contractions pay on the matrix unit. The
//! schedule asks it (`mlopt-schedule/src/cpu/`) and `--tune` measures its best candidates; it is the one
//! kernel-level model of CPU contractions.

use mlopt_target::CpuTarget;

/// Register tile: `mr` rows by `nr` columns, `nr` a multiple of `lanes`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tile {
    pub mr: u64,
    pub nr: u64,
    pub lanes: u32,
}

/// Every tile for an M x N output that fits the register file: `nr` is 1 to 4 vectors (2 with AVX2) of
/// the widest lanes that fit in N, `mr` rows such that mr x nv accumulators + nv B vectors + 1 broadcast
/// fit in the vector registers. N need not be a multiple of anything: the columns past the last full tile
/// run as tail tiles (`blocks`), and an N below 8 is one vector of N lanes.
fn fitting(target: &CpuTarget, m: u64, n: u64) -> Vec<Tile> {
    if n == 0 {
        return vec![];
    }
    let (lanes, regs) = (target.lanes(), u64::from(target.vector_registers()));
    let mut v = Vec::new();
    if n < 8 {
        for mr in 1..=8u64.min(m.max(1)) {
            v.push(Tile {
                mr,
                nr: n,
                lanes: n as u32,
            });
        }
        return v;
    }
    let lanes = if n >= lanes as u64 && lanes >= 8 {
        lanes as u64
    } else {
        8
    };
    let max_vecs = if regs == 32 { 4 } else { 2 };
    for nv in 1..=(n / lanes).clamp(1, max_vecs) {
        for mr in 1..=8u64.min(m.max(1)) {
            if mr * nv + nv < regs {
                v.push(Tile {
                    mr,
                    nr: nv * lanes,
                    lanes: lanes as u32,
                });
            }
        }
    }
    v
}

/// Whether `t` is a tile this model could pick for an M x N output on `target`: one of the tiles that
/// fit its register file (`fitting`). A tile from anywhere else (`--tune`'s cache is a file anyone can
/// write) is used only if it is: a zero, odd or oversized tile would divide by zero, leave columns
/// unwritten or spill the accumulators.
pub fn valid(target: &CpuTarget, t: Tile, m: u64, n: u64) -> bool {
    fitting(target, m, n).contains(&t)
}

/// The micro-kernel cost model: the estimated seconds of an M x N x K contraction tiled by `t` on one
/// core of `target`, tails included (`cycles` at the target's clock).
pub fn seconds(target: &CpuTarget, t: Tile, m: u64, n: u64, k: u64) -> f64 {
    target.cycles(cycles(t, m, n, k))
}

/// The estimated cycles of an M x N x K contraction tiled by `t`, tails included.
/// Per step of k, a tile of mr rows and nv vectors issues mr x nv FMAs (two ports), nv B loads and mr A
/// broadcasts (two load ports), and every accumulator is a dependency chain of the FMA latency (4
/// cycles), so a step takes max(mr nv / 2, (mr + nv) / 2, 4) cycles; storing a tile costs mr x nv.
/// Tiles that do not divide M or N leave tail tiles (`blocks`, `tiled`), costed the same way.
fn cycles(t: Tile, m: u64, n: u64, k: u64) -> f64 {
    let tile = |mr: u64, nv: u64| -> f64 {
        let (mr, nv) = (mr as f64, nv as f64);
        k as f64 * (mr * nv / 2.0).max((mr + nv) / 2.0).max(4.0) + mr * nv
    };
    let mut cycles = 0.0;
    for (_, cols, bt) in blocks(n, t) {
        let nv = bt.nr / bt.lanes as u64;
        let tiles_n = (cols / bt.nr) as f64;
        cycles += tiles_n * (m / bt.mr) as f64 * tile(bt.mr, nv);
        if !m.is_multiple_of(bt.mr) {
            cycles += tiles_n * tile(m % bt.mr, nv);
        }
    }
    cycles
}

/// The tile the cost model rates fastest for an M x N x K contraction on `target`, or None. Among
/// tiles it rates equal (all FMA-bound), the one with more vectors per row, then more rows: fewer loads
/// per FMA, and the 6 x 64 AVX-512 tile measured fastest here (119 GFLOP/s on GEMM 1024^3).
pub fn pick(target: &CpuTarget, m: u64, n: u64, k: u64) -> Option<Tile> {
    candidates(target, m, n, k).into_iter().next()
}

/// Cycles a swapped contraction spends per output element on top of its tiles: its output's columns
/// (the original rows) are not adjacent in memory, so each lane is extracted and stored on its own.
const SCATTER_CYCLES: f64 = 2.0;

/// Whether an M x N x K contraction runs faster swapped on `target`: computed as `swapped_batches` x
/// (N' x M) (C^T = B^T A^T, rows and columns exchanged; N' = `swapped_n` its rows then, more than N
/// where images the unswapped tiling runs one at a time join them) by the tile `swapped`, its output
/// stored lane by lane, than `batches` x (M x N) by `plain`. A 1x1 convolution at a 7x7 output is where it pays:
/// unswapped, its 49 positions are the columns, a 48-wide tile and a one-lane tail at a sixteenth of
/// the rate; swapped, its output channels are (512 = 10 x 48 + 32) and the positions 7 rows of 7.
/// Swapped, every panel of the weight passes over all of the activations (`a_bytes`, read a scalar
/// at a time down their channels): only while they stay in half of L2 (a 14x14 x 1024-channel input,
/// 800 KB, ran 25% slower swapped on Zen 5's 1 MB).
pub fn swap_pays(
    target: &CpuTarget,
    (plain, batches, m, n): (Tile, u64, u64, u64),
    (swapped, swapped_batches, swapped_n, a_bytes): (Tile, u64, u64, u64),
    k: u64,
) -> bool {
    if a_bytes > target.l2_bytes / 2 {
        return false;
    }
    let plain = batches as f64 * cycles(plain, m, n, k);
    let swapped = swapped_batches as f64
        * (cycles(swapped, swapped_n, m, k) + SCATTER_CYCLES * (swapped_n * m) as f64);
    swapped < plain
}

/// Cycles per element a packed panel of B gathers (one lane at a time: a strided convolution's im2col):
/// a lane's index computed in a vector, moved out to a register and its element loaded and inserted
/// back, about three instructions, and the indices of a panel's lanes (which depend on the panel, not on
/// K) are what the compiler hoists and keeps live across the tiles that follow, taking vector registers
/// from their accumulators. At one cycle ResNet-50's 3x3 stride-2 convolution at 14 x 14 (256 x 196 x
/// 2304 on AVX2) was rated cheaper gathered than as 209 wide columns, and ran at 31% of the FMA peak
/// (7.1 ms on a Zen 3 core; an accumulator spilled to the stack in the FMA loop) against 74% wide (3.3 ms).
const GATHER_CYCLES: f64 = 3.0;

/// Whether a convolution runs faster with its output rows end to end as one long row of columns
/// (`cols`, over its input's phase planes: the W' - W columns after each row computed and dropped),
/// tiled by `wide`, with `scratch` its sums stored to a scratch and moved to the output after (a vector
/// store and load per `lanes` outputs; none where W' is W, a strided 1x1 convolution's), than as
/// `batches` x (M x N) by `plain`, of which `gathered` elements of B are packed by gathering: output
/// rows of N positions, or all positions at once, packed from a strided window. Short rows are where it
/// pays: a 28-wide row on AVX2 is a 16-wide tile and a 12-wide tail, or 8 x 8 tiles (ResNet-50's 3x3
/// convolutions at 28 x 28 ran at 65% of the FMA peak of a Zen 1 core; its stride-2 ones at 56 x 56,
/// 35%, at 60% wide).
pub fn flat_columns_pay(
    (plain, batches, m, n, gathered): (Tile, u64, u64, u64, u64),
    (wide, cols, scratch): (Tile, u64, bool),
    k: u64,
) -> bool {
    let rows = batches as f64 * cycles(plain, m, n, k) + GATHER_CYCLES * gathered as f64;
    let moved = match scratch {
        true => 2.0 * (batches * m * n) as f64 / f64::from(wide.lanes.max(1)),
        false => 0.0,
    };
    cycles(wide, m, cols, k) + moved < rows
}

/// Whether the tiles of an M x N output by `t` read an operand B that lies in memory as [K, N] rows
/// (activations: a pointwise convolution's input, a convolution's phase planes read as wide columns)
/// through packed panels (`pack(b)`): copied, a group of column panels at a time, into one contiguous
/// buffer before their tiles run. Unpacked, each step of K reads one line N x 4 bytes past the last (a
/// page apart at N >= 1024) and a panel's lines share a few L1 sets when that stride is a multiple of
/// a large power of two; the copy costs K x nr moves per panel, against M x K x nr multiply-adds. It
/// pays once several row tiles reuse each panel and there is more than one panel (ResNet-50's
/// pointwise convolutions on a Zen 3 core: 20-30% faster; unpacked they ran at 43-65% of the FMA peak).
pub fn pack_b_pays(t: Tile, m: u64, n: u64) -> bool {
    m / t.mr >= 4 && n > t.nr
}

/// Whether the tiles of an M x N x K contraction by `t` whose A is strided along K (a swapped
/// convolution's activations, [K, positions]: each row's step of K a line further) should read it
/// packed once into row tiles (`pack(a)`, [M / mr, K, mr]: a tile's mr broadcasts of a step are
/// consecutive): where four or more column panels read A again (the copy costs about what one panel's
/// tiles spend reading A in place; DenseNet-121's 3x3 convolutions at 7 x 7 have two panels of 16
/// output channels) and the packed copy stays in half of L2. In place, a tile's steps each load a
/// line per row tile for mr floats of it, and with a 32 KB panel of B no step's lines stay in L1:
/// ResNet-50's 1x1 convolutions at 7 x 7 (49 x 2048 x 512 swapped, 5 x 16 tiles) ran at 57% of a
/// Zen 3 core's FMA peak, the same product with A row-major (a MatMul) at 77-81%.
pub fn pack_a_pays(target: &CpuTarget, t: Tile, m: u64, n: u64, k: u64) -> bool {
    n >= 4 * t.nr && m.saturating_mul(k).saturating_mul(4) <= target.l2_bytes / 2
}

/// Whether a weight of `bytes` streams from memory on every call, so that the tiles or blocks reading
/// it should prefetch its next block while they compute: a quarter of L2 or more (a model's weights
/// do not stay in cache from call to call; a small one is read from cache after its first lines, and
/// prefetches only cost: YOLO's 7 KB stem weight ran 1.55x slower with them on `vdpbf16ps`).
pub fn weight_streams(target: &CpuTarget, bytes: u64) -> bool {
    bytes >= target.l2_bytes / 4
}

/// What a tile choice depends on: output rows, output columns, reduction length, vector lanes.
pub type TileKey = (u64, u64, u64, u32);

/// The tiles `--tune` measures for a contraction: the six the cost model rates best, best first.
pub fn candidates(target: &CpuTarget, m: u64, n: u64, k: u64) -> Vec<Tile> {
    let mut v: Vec<(f64, Tile)> = fitting(target, m, n)
        .into_iter()
        .map(|t| (seconds(target, t, m, n, k), t))
        .collect();
    v.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then(b.1.nr.cmp(&a.1.nr))
            .then(b.1.mr.cmp(&a.1.mr))
    });
    v.into_iter().take(6).map(|(_, t)| t).collect()
}

/// The column blocks of a tiling: (first column, columns, tile): the full tiles, then the last N % nr
/// columns as tail tiles: one of the tile's lanes where they divide it, else a multiple of 8 wide and
/// finally the last N % 8 columns as one vector of that many lanes.
pub fn blocks(n: u64, t: Tile) -> Vec<(u64, u64, Tile)> {
    let main = n - n % t.nr;
    let mut v = Vec::new();
    if main > 0 {
        v.push((0, main, t));
    }
    let rest = n - main;
    if rest == 0 {
        return v;
    }
    if rest.is_multiple_of(t.lanes as u64) {
        v.push((main, rest, Tile { nr: rest, ..t }));
        return v;
    }
    let eights = rest - rest % 8;
    if eights > 0 {
        v.push((
            main,
            eights,
            Tile {
                nr: eights,
                lanes: 8,
                ..t
            },
        ));
    }
    let last = rest % 8;
    if last > 0 {
        v.push((
            main + eights,
            last,
            Tile {
                nr: last,
                lanes: last as u32,
                ..t
            },
        ));
    }
    v
}

/// The block of the first reduction axis when a panel of B (K x nr floats) would not fit in a quarter
/// of the target's L2: the largest divisor of `k[0]` whose block does, with at least 64 rows of B per
/// block. None when the panel fits, or no divisor gives such a block. A quarter: the tiles prefetch
/// the next panel into L2 while they read this one, and A's rows are there too. With half, ResNet-50's
/// 7x7 convolutions of K = 2048 (512 KiB panels in a 1 MiB L2) ran at 63% of the FMA peak, their
/// panels evicted between row blocks; in blocks, 13% faster (its 1x1 convolutions on 28x28 maps 10%).
pub fn k_block(target: &CpuTarget, k: &[u64], nr: u64) -> Option<u64> {
    let l2 = target.l2_bytes;
    let (&k0, rest) = k.split_first()?;
    let rest: u64 = rest.iter().product::<u64>().max(1);
    let row = rest * nr * 4;
    if k0.saturating_mul(row) <= l2 / 4 {
        return None;
    }
    let fit = (l2 / 4) / row.max(1);
    (1..=fit.min(k0))
        .rev()
        .find(|d| k0 % d == 0)
        .filter(|d| d * rest >= 64)
}

/// Whether bf16 contractions by constant weights run faster as `mma` blocks on `t`'s matrix unit (AMX
/// tiles or `vdpbf16ps`) than as fp32 register tiles: only where its bf16 peak beats the fp32 FMAs
/// (`vdpbf16ps` does not on every CPU that has it: calibration measured half the FMA rate on some).
pub fn bf16_blocks_pay(t: &mlopt_target::CpuTarget) -> bool {
    t.matrix().is_some() && t.bf16.is_some_and(|p| p > t.roof.fp32)
}

/// Seconds a core spends per element copied into a block operand from a layout whose K is not
/// contiguous (NCHW activations into the blocks' channels-innermost rows) and storing it as bf16: rows
/// of positions loaded per channel and transposed in registers (`mlopt-llvm/src/transpose.rs`). Fitted
/// on Zen 5 over whole models in bf16 at 1 thread: 0.15 ns put YOLO's stride-2 3x3 convolutions of 32
/// and 64 channels on the blocks (YOLO 0.96x, DenseNet-121 0.98x against 0.7 ns, the fit when the copy
/// gathered element by element; the other models' choices the same).
const GATHER_COPY_S: f64 = 0.15e-9;
/// The same for an element copied as part of a contiguous vector (K contiguous in the source: a
/// transformer's activations): a load, a conversion and a store per vector.
const STREAM_COPY_S: f64 = 0.05e-9;

/// How a block operand is copied into the blocks' layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BlockCopy {
    /// Read in place.
    None,
    /// This many elements, K contiguous in the source.
    Streamed(u64),
    /// This many elements, gathered.
    Gathered(u64),
}

/// Whether one bf16 contraction of `m` x `n` x `k` multiply-adds runs faster as `mma` blocks
/// ([`bf16_block_s`]: products of depth `depth`, `padded_k` deep in all, K's padding to whole block
/// steps included) than as fp32 register tiles on `t`, which run at the fp32 peak over `k`. A gathered copy
/// costs as much as many multiply-adds, so narrow contractions whose copy gathers and shallow ones (a
/// 3-channel stem's taps one by one: depth 4) stay in fp32 tiles; a 1x1 convolution's activations
/// stream into the blocks (two channel rows interleaved), so those of 16 channels or more pay.
pub fn bf16_block_pays(
    t: &mlopt_target::CpuTarget,
    shape: (u64, u64, u64),
    depth: (u64, u64),
    copy: BlockCopy,
) -> bool {
    bf16_block_faster_s(t, shape, depth, copy).is_some()
}

/// [`bf16_block_s`] for the blocks' padded K, where [`bf16_block_pays`]: the seconds to compare one
/// block layout with another.
pub fn bf16_block_faster_s(
    t: &mlopt_target::CpuTarget,
    (m, n, k): (u64, u64, u64),
    (depth, padded_k): (u64, u64),
    copy: BlockCopy,
) -> Option<f64> {
    bf16_block_s(t, (m, n, padded_k.max(k)), depth, copy)
        .filter(|s| *s < 2.0 * (m * n * k) as f64 / t.roof.fp32)
}

/// Seconds one bf16 contraction of `m` x `n` x `k` multiply-adds (K's padding included) takes as
/// `mma` blocks on `t` (None
/// where [`bf16_blocks_pay`] says blocks never do): the bf16 peak, slowed by reading and writing the
/// f32 accumulators once per block product of depth `depth` (a convolution tap's channels: about
/// 4 / depth of the products), plus copying the activations into the blocks' layout (`copy`), split
/// over the threads.
pub fn bf16_block_s(
    t: &mlopt_target::CpuTarget,
    (m, n, k): (u64, u64, u64),
    depth: u64,
    copy: BlockCopy,
) -> Option<f64> {
    let bf16 = t.bf16.filter(|_| bf16_blocks_pay(t))?;
    Some(block_s(t, bf16, (m, n, k), depth, copy))
}

/// [`bf16_block_s`] for `mma` blocks of i16 pairs summed in i32 (a quantized model's contractions) on
/// `t`'s integer dot product, at its peak (`CpuTarget::i16_peak`); None where it has none.
pub fn i16_block_s(
    t: &mlopt_target::CpuTarget,
    shape: (u64, u64, u64),
    depth: u64,
    copy: BlockCopy,
) -> Option<f64> {
    Some(block_s(t, t.i16_peak()?, shape, depth, copy))
}

/// Seconds a contraction of `m` x `n` x `k` multiply-adds takes as `mma` blocks at `peak` FLOP/s,
/// slowed by reading and writing the accumulators once per block product of depth `depth`, plus
/// copying the activations into the blocks' layout (`copy`), split over the threads.
fn block_s(
    t: &mlopt_target::CpuTarget,
    peak: f64,
    (m, n, k): (u64, u64, u64),
    depth: u64,
    copy: BlockCopy,
) -> f64 {
    let copy_s = match copy {
        BlockCopy::None => 0.0,
        BlockCopy::Streamed(e) => e as f64 * STREAM_COPY_S,
        BlockCopy::Gathered(e) => e as f64 * GATHER_COPY_S,
    };
    let flops = 2.0 * (m * n * k) as f64;
    flops / peak * (1.0 + 4.0 / depth.max(1) as f64) + copy_s / f64::from(t.threads.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Shape = (u64, u64, u64, u32);

    /// (M, N, K, lanes) -> the tile the cost model picks (mr, nr), or None.
    const PICKS: &[(Shape, Option<(u64, u64)>)] = &[
        ((1024, 1024, 1024, 16), Some((6, 64))), // FMA-bound everywhere: the widest, then tallest tile
        ((128, 3072, 768, 16), Some((6, 64))),
        ((3136, 64, 576, 16), Some((6, 64))), // ResNet 3x3 conv as implicit GEMM
        ((7, 48, 100, 16), Some((7, 48))),    // one 7-row tile beats 6 rows + a 1-row tail
        ((1, 1000, 2048, 16), Some((1, 64))), // GEMV: latency-bound, the widest tile
        ((1024, 1024, 1024, 8), Some((6, 16))), // AVX2: 16 registers
        ((8, 10, 128, 16), Some((8, 8))),     // N = 8 + a 2-lane tail tile
        ((256, 28, 1152, 16), Some((8, 16))), // GoogLeNet's 3x3 conv rows (width 28): 16 + 8 + 4 lanes
        ((512, 7, 4608, 16), Some((8, 7))),   // ResNet's 7x7 stage: one 7-lane vector per row
        ((1000, 13, 512, 16), Some((8, 8))),  // SqueezeNet's classifier conv: 8 + 5 lanes
    ];

    #[test]
    fn the_cost_model_picks_tiles() {
        for ((m, n, k, lanes), want) in PICKS {
            let got = pick(&cpu(*lanes), *m, *n, *k).map(|t| (t.mr, t.nr));
            assert_eq!(got, *want, "{m}x{n}x{k} with {lanes} lanes");
        }
    }

    /// An AVX-512 (16 lanes) or AVX2 (8 lanes) core.
    fn cpu(lanes: u32) -> CpuTarget {
        match lanes {
            16 => mlopt_target::cpu::x86_64_v4(1),
            _ => mlopt_target::cpu::x86_64_v3(1),
        }
    }

    /// (M, N, K), the batches the unswapped tiling runs, the swapped batches and rows, the activations'
    /// KiB -> whether swapping pays on a 1 MiB L2.
    type Swap = ((u64, u64, u64), u64, (u64, u64), u64, bool);
    const SWAPS: &[Swap] = &[
        ((512, 49, 4608), 1, (1, 49), 162, true), // ResNet's 7x7 3x3 conv (its padded input): 48 + 1 lane
        ((2048, 49, 512), 1, (1, 49), 98, true),  // its 1x1 convolutions
        ((2048, 49, 512), 4, (1, 196), 392, true), // at batch 4, the images joining the rows
        ((2048, 49, 512), 8, (1, 392), 784, false), // at batch 8 they would not stay in L2
        ((2048, 49, 512), 8, (2, 196), 392, true), // four at a time do
        ((1024, 196, 256), 1, (1, 196), 196, false), // 14x14: a 4-lane tail, too little K for the stores
        ((256, 196, 1024), 1, (1, 196), 784, false), // K to pay, but more than half of L2
        ((64, 3136, 256), 1, (1, 3136), 3136, false), // 56x56: 65 x 48 + 16
        ((256, 784, 128), 1, (1, 784), 392, false), // 28x28 = 16 x 48 + 16, the stores would cost more
    ];

    #[test]
    fn swapping_pays_where_the_columns_leave_a_narrow_tail() {
        let t = cpu(16);
        for &((m, n, k), batches, (sb, sn), kib, want) in SWAPS {
            let (plain, swapped) = (pick(&t, m, n, k).unwrap(), pick(&t, sn, m, k).unwrap());
            let got = swap_pays(&t, (plain, batches, m, n), (swapped, sb, sn, kib * 1024), k);
            assert_eq!(
                got, want,
                "{m}x{n}x{k}, {batches} batches, {sb} x {sn} rows swapped"
            );
        }
    }

    /// (M, N positions, K), rows, output rows' width W and the planes' row W' (the phase planes of a
    /// stride-2 window) -> whether wide columns beat all positions packed by gathering, on AVX2.
    type Wide = ((u64, u64, u64), (u64, u64, u64), bool);
    const WIDE: &[Wide] = &[
        ((256, 196, 2304), (14, 14, 15), true), // ResNet-50's 3x3 stride 2 at 14 x 14: 209 columns
        ((128, 784, 1152), (28, 28, 29), true), // at 28 x 28: 811 columns
        ((512, 49, 4608), (7, 7, 8), true),     // at 7 x 7: 55 columns
        ((64, 4, 576), (2, 2, 9), false), // a 2 x 2 output over planes 9 wide: 11 columns for 4
    ];

    #[test]
    fn strided_windows_read_wide_columns_where_gathering_costs_more() {
        let t = cpu(8);
        for &((m, n, k), (rows, w, row), want) in WIDE {
            let cols = (rows - 1) * row + w;
            let (plain, wide) = (pick(&t, m, n, k).unwrap(), pick(&t, m, cols, k).unwrap());
            let got = flat_columns_pay((plain, 1, m, n, k * n), (wide, cols, row != w), k);
            assert_eq!(got, want, "{m}x{n}x{k} as {cols} wide columns");
        }
    }

    /// (M, N, K) of a swapped convolution -> whether its A is packed into row tiles (5 x 16, AVX2).
    const PACK_A: &[((u64, u64, u64), bool)] = &[
        ((49, 2048, 512), true), // ResNet-50's 1x1 convolutions at 7 x 7: 128 panels
        ((49, 128, 992), true),  // DenseNet-121's at 7 x 7: 8 panels
        ((49, 32, 1152), false), // its 3x3 ones: two panels, the copy would cost what it saves
        ((196, 256, 2304), false), // ResNet-50's 3x3 at 14 x 14: 1.8 MB packed, past half of L2
    ];

    #[test]
    fn swapped_activations_are_packed_where_panels_reuse_them() {
        let t = cpu(8);
        let tile = Tile {
            mr: 5,
            nr: 16,
            lanes: 8,
        };
        for &((m, n, k), want) in PACK_A {
            assert_eq!(pack_a_pays(&t, tile, m, n, k), want, "{m}x{n}x{k}");
        }
    }

    #[test]
    fn only_tiles_that_fit_are_valid() {
        let t = |mr, nr, lanes| Tile { mr, nr, lanes };
        let v4 = cpu(16);
        for c in candidates(&v4, 196, 256, 1024) {
            assert!(valid(&v4, c, 196, 256), "{c:?}");
        }
        // Zero, odd and oversized tiles, and lanes the target does not have.
        for bad in [
            t(0, 0, 0),
            t(0, 64, 16),
            t(6, 0, 16),
            t(5, 48, 7),
            t(9, 64, 16),
            t(6, 80, 16),
        ] {
            assert!(!valid(&v4, bad, 196, 256), "{bad:?}");
        }
        assert!(!valid(&cpu(8), t(6, 64, 16), 196, 256), "16 lanes on AVX2");
        // Wider than the columns.
        assert!(!valid(&v4, t(6, 64, 16), 196, 32));
    }

    #[test]
    fn tails_and_latency_cost_cycles() {
        let t = |mr, nr| Tile { mr, nr, lanes: 16 };
        let estimate = |t, m, n, k| seconds(&cpu(16), t, m, n, k);
        // A 1-row tail tile is latency-bound: 7 rows as 6 + 1 cost more than one 7-row tile.
        assert!(estimate(t(6, 48), 7, 48, 100) > estimate(t(7, 48), 7, 48, 100));
        // Too few accumulators to hide the FMA latency: 1x16 is 4 cycles per k step for 1 FMA.
        assert!(estimate(t(1, 16), 64, 64, 64) > 3.0 * estimate(t(4, 64), 64, 64, 64));
        // Every candidate fits the 32 zmm registers.
        for c in candidates(&cpu(16), 1024, 1024, 1024) {
            assert!(c.mr * (c.nr / 16) + c.nr / 16 < 32, "{c:?}");
        }
    }

    /// bf16 contractions, (M, N, K), block depth, the operand's copy -> whether `mma` blocks beat
    /// fp32 tiles on Zen 4 (`vdpbf16ps` at twice the FMA rate).
    type Block = ((u64, u64, u64), u64, BlockCopy, bool);
    const BLOCKS: &[Block] = &[
        ((3136, 64, 576), 64, BlockCopy::Gathered(58 * 58 * 64), true), // ResNet's 3x3: deep taps
        ((128, 768, 768), 768, BlockCopy::None, true), // BERT's projection, A read in place
        ((3136, 96, 384), 384, BlockCopy::Streamed(3136 * 384), true), // ConvNeXt's MLP out
        ((3025, 64, 144), 16, BlockCopy::Gathered(57 * 58 * 16), true), // SqueezeNet's fire 3x3
        (
            (12544, 32, 27),
            4,
            BlockCopy::Gathered(2 * 225 * 113 * 4),
            false,
        ), // a 3-channel stem
    ];

    #[test]
    fn bf16_blocks_pay_where_the_copy_and_the_accumulators_are_worth_it() {
        let t = mlopt_target::Target::named("znver4", 1).unwrap();
        let t = t.cpu().unwrap();
        for &(shape, depth, copy, want) in BLOCKS {
            assert_eq!(
                bf16_block_pays(t, shape, (depth, shape.2), copy),
                want,
                "{shape:?} depth {depth}, {copy:?}"
            );
        }
        let v4 = mlopt_target::Target::named("x86-64-v4", 1).unwrap();
        assert!(!bf16_block_pays(
            v4.cpu().unwrap(),
            (3136, 64, 576),
            (64, 576),
            BlockCopy::None
        ));
    }
}
