//! The GPU block-tile model: which block tile a GPU contraction (MatMul, Gemm, implicit-GEMM convolution)
//! uses, by a small roofline (waves of blocks over the SMs at the engine's peak, against the operands'
//! traffic) within the limits on threads, shared memory and registers. The GPU schedule
//! (`mlopt-schedule/src/gpu/gemm.rs`) asks it; with `tile.rs` (CPU register tiles) it is the one
//! kernel-level model of contractions.

use mlopt_target::GpuTarget;

/// Threads per block at most, and static shared memory per block: the target's.
pub const MAX_THREADS: u64 = GpuTarget::MAX_THREADS;
pub const SHARED_BYTES: u64 = GpuTarget::SHARED_BYTES;

/// What multiplies: tensor cores (`mma.sync` on operands of `bytes` bytes, `k` of K per instruction), or
/// SIMT FMAs on f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Engine {
    Mma { bytes: u64, k: u64 },
    Simt,
}

impl Engine {
    /// The K slice staged at a time: two `mma.sync` steps, or 16 FMAs.
    pub fn bk(self) -> u64 {
        match self {
            Engine::Mma { k, .. } => 2 * k,
            Engine::Simt => 16,
        }
    }

    /// Row padding of the shared tiles in elements: keeps `ldmatrix` rows 16-byte aligned and moves
    /// successive rows to other banks.
    pub fn pad(self) -> u64 {
        match self {
            Engine::Mma { bytes: 4, .. } => 4,
            Engine::Mma { .. } => 8,
            Engine::Simt => 1,
        }
    }
}

/// A block tile: `wm x wn` warps (tensor cores) or `wm x wn` threads (SIMT), each with an `mt x nt`
/// register tile of 16 x 8 fragments (tensor cores) or single elements (SIMT).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tile {
    pub wm: u64,
    pub wn: u64,
    pub mt: u64,
    pub nt: u64,
}

/// The tensor-core tile shapes tried, smallest first (a cost tie keeps the first).
pub const MMA_TILES: &[Tile] = &[
    Tile {
        wm: 1,
        wn: 2,
        mt: 1,
        nt: 2,
    },
    Tile {
        wm: 1,
        wn: 2,
        mt: 1,
        nt: 4,
    },
    Tile {
        wm: 2,
        wn: 2,
        mt: 1,
        nt: 2,
    },
    Tile {
        wm: 2,
        wn: 2,
        mt: 2,
        nt: 2,
    },
    Tile {
        wm: 2,
        wn: 2,
        mt: 2,
        nt: 4,
    },
    Tile {
        wm: 2,
        wn: 2,
        mt: 4,
        nt: 4,
    },
    Tile {
        wm: 2,
        wn: 4,
        mt: 2,
        nt: 4,
    },
    Tile {
        wm: 4,
        wn: 2,
        mt: 2,
        nt: 4,
    },
];
/// The SIMT tile shapes tried, smallest first.
pub const SIMT_TILES: &[Tile] = &[
    Tile {
        wm: 8,
        wn: 16,
        mt: 1,
        nt: 2,
    },
    Tile {
        wm: 8,
        wn: 32,
        mt: 2,
        nt: 2,
    },
    Tile {
        wm: 16,
        wn: 16,
        mt: 2,
        nt: 2,
    },
    Tile {
        wm: 16,
        wn: 16,
        mt: 4,
        nt: 4,
    },
    Tile {
        wm: 16,
        wn: 16,
        mt: 8,
        nt: 4,
    },
];

impl Tile {
    /// The shapes tried for engine `e`.
    pub fn candidates(e: Engine) -> &'static [Tile] {
        match e {
            Engine::Mma { .. } => MMA_TILES,
            Engine::Simt => SIMT_TILES,
        }
    }
    pub fn threads(&self, e: Engine) -> u64 {
        self.wm
            * self.wn
            * if matches!(e, Engine::Mma { .. }) {
                32
            } else {
                1
            }
    }
    pub fn bm(&self, e: Engine) -> u64 {
        self.wm
            * self.mt
            * if matches!(e, Engine::Mma { .. }) {
                16
            } else {
                1
            }
    }
    pub fn bn(&self, e: Engine) -> u64 {
        self.wn
            * self.nt
            * if matches!(e, Engine::Mma { .. }) {
                8
            } else {
                1
            }
    }
}

/// The shared tiles' bytes for operands of `bytes` bytes, at the widest padding (rows of a tile filled
/// by 16-byte copies are padded to 16 bytes).
pub fn shared_bytes(t: &Tile, e: Engine, bytes: u64) -> u64 {
    let (bm, bn, bk) = (t.bm(e), t.bn(e), e.bk());
    let pad = e.pad().max(16 / bytes);
    2 * (bm * (bk + pad) + bk * (bn + pad)) * bytes
}

/// Registers per thread, roughly: accumulators, fragments or operands, addressing, and two for each
/// element a thread stages with plain loads (`plain[0]` for A, `plain[1]` for B: the operands not copied
/// by `cp.async`; the value and its address, all in flight at once). Fitted to ptxas (12, sm_80): 125
/// for the 128 x 64 tensor-core tile staged by cp.async (estimate 128), 64 for a padded 3x3
/// convolution's 64 x 128 tile staging 16 elements with loads (120), 92 for a 1x1 convolution's with a
/// bias (88). The driver checks every plan against ptxas and, where one is short, plans again with the
/// shortfall added (the `margin` of `estimate`).
pub fn registers(t: &Tile, e: Engine, plain: [bool; 2]) -> u64 {
    let (bm, bn, bk, threads) = (t.bm(e), t.bn(e), e.bk(), t.threads(e));
    let staged: u64 = [bm * bk, bk * bn]
        .iter()
        .zip(plain)
        .filter(|(_, p)| *p)
        .map(|(n, _)| n / threads)
        .sum();
    let base = match e {
        Engine::Mma { .. } => t.mt * t.nt * 4 + t.mt * 4 + t.nt * 2 + 40,
        Engine::Simt => t.mt * t.nt + t.mt + t.nt + 40,
    };
    base + 2 * staged
}

/// The registers a tile may plan for: 255 a thread, but ptxas (12, sm_80) often holds blocks of 224
/// threads or more to about 128 and spills past that (a 64 x 128 tile needing 140 spilled at 128 with
/// 256 threads, not with 192), so those are planned within 128.
pub fn register_limit(threads: u64) -> u64 {
    if threads >= 224 {
        128
    } else {
        255
    }
}

/// A contraction's extents: `batch` independent M x N x K products.
#[derive(Debug, Clone, Copy)]
pub struct Extents {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
}

/// A tile's estimate in seconds, and the same without the slice latency (`at_peak`): plans the
/// latency bounds alike are told apart by it (the derived order compares `seconds` first).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct TileTime {
    pub seconds: f64,
    pub at_peak: f64,
}

/// The roofline estimate of tile `t` in seconds on GPU `target`, for operands of `bytes` bytes running
/// at `peak` FLOP/s (the engine's, for the whole device), with `margin` registers added to the estimate:
/// waves of blocks over the SMs, each at least a slice latency per K slice (`GpuTarget::slice_latency_s`),
/// against the traffic of the operands (A is read once per column of tiles, B once per row of tiles).
/// None when the shape breaks a limit or does not divide the staging copies evenly.
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    target: &GpuTarget,
    x: Extents,
    t: &Tile,
    e: Engine,
    bytes: u64,
    plain: [bool; 2],
    margin: u64,
    peak: f64,
) -> Option<TileTime> {
    let Extents { m, n, k, batch } = x;
    let (bm, bn, bk, threads) = (t.bm(e), t.bn(e), e.bk(), t.threads(e));
    let smem = shared_bytes(t, e, bytes);
    if threads > MAX_THREADS
        || smem > SHARED_BYTES
        || (bm * bk) % threads != 0
        || (bk * bn) % threads != 0
    {
        return None;
    }
    let regs = registers(t, e, plain) + margin;
    if regs > register_limit(threads) {
        return None;
    }
    let sms = u64::from(target.sms).max(1);
    let (tm, tn, kt) = (m.div_ceil(bm), n.div_ceil(bn), k.div_ceil(bk));
    let blocks = batch * tm * tn;
    let per_sm = (u64::from(target.threads_per_sm) / threads)
        .min(u64::from(target.smem_per_sm) / smem.max(1))
        .min(u64::from(target.regs_per_sm) / (threads * regs))
        .clamp(1, 32);
    let waves = blocks.div_ceil(sms * per_sm);
    // Blocks at once on the busiest SM; an SM reaches its peak with enough warps to hide latency (eight
    // here), and fewer run proportionally slower.
    let together = blocks.div_ceil(sms).min(per_sm);
    let resident = together * threads.div_ceil(32);
    let peak = peak / sms as f64 * (resident as f64 / 8.0).min(1.0);
    let tile_flops = (2 * bm * bn * kt * bk) as f64;
    // A wave takes the SM's share of the products at its peak, and at least one slice latency per K
    // slice (the blocks on an SM wait for their loads together).
    let products = together as f64 * tile_flops / peak;
    let wave = products.max(kt as f64 * target.slice_latency_s);
    let traffic = (batch * (m * k * tn + k * n * tm) * bytes + batch * m * n * 4) as f64;
    let memory = traffic / target.roof.dram_bw;
    Some(TileTime {
        seconds: (waves as f64 * wave).max(memory),
        at_peak: (waves as f64 * products).max(memory),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best(m: u64, n: u64, k: u64) -> Tile {
        let t = mlopt_target::gpu::sm_80();
        let e = Engine::Mma { bytes: 2, k: 16 };
        let x = Extents { m, n, k, batch: 1 };
        let peak = t.bf16;
        let cost = |tile: &Tile| estimate(&t, x, tile, e, 2, [false, false], 0, peak);
        *Tile::candidates(e)
            .iter()
            .filter(|tile| cost(tile).is_some())
            .min_by(|a, b| cost(a).partial_cmp(&cost(b)).unwrap())
            .unwrap()
    }

    /// A 1024-cube bf16 GEMM takes 128 x 64 tiles on four warps; a small one a 16 x 32 tile on two, so
    /// its few blocks spread over more SMs.
    #[test]
    fn tiles_grow_with_the_problem() {
        let big = best(1024, 1024, 1024);
        assert_eq!(
            (
                big.bm(Engine::Mma { bytes: 2, k: 16 }),
                big.bn(Engine::Mma { bytes: 2, k: 16 }),
                big.wm * big.wn
            ),
            (128, 64, 4),
            "{big:?}"
        );
        let small = best(16, 32, 64);
        assert_eq!(
            small,
            Tile {
                wm: 1,
                wn: 2,
                mt: 1,
                nt: 2
            }
        );
    }

    /// Shapes past the block limits, or whose plan needs more registers than a thread may have, are not
    /// candidates.
    #[test]
    fn limits_rule_out_tiles() {
        let t = mlopt_target::gpu::sm_80();
        let x = Extents {
            m: 512,
            n: 512,
            k: 512,
            batch: 1,
        };
        let big = Tile {
            wm: 32,
            wn: 64,
            mt: 1,
            nt: 1,
        };
        assert!(estimate(&t, x, &big, Engine::Simt, 4, [true, true], 0, t.roof.fp32).is_none());
        let fine = Tile {
            wm: 2,
            wn: 2,
            mt: 2,
            nt: 2,
        };
        let e = Engine::Mma { bytes: 2, k: 16 };
        assert!(estimate(&t, x, &fine, e, 2, [false, false], 0, 1e14).is_some());
        assert!(
            estimate(&t, x, &fine, e, 2, [false, false], 300, 1e14).is_none(),
            "a margin past 255 registers"
        );
    }
}
