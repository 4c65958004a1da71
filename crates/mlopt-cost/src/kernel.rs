//! The one cost interface of a scheduled kernel, in seconds on a `Target`: what its schedule reaches
//! of the roofline (`priced`, from the shares of its work by how it runs, and its class for the
//! profile), whether a CPU nest pays for a trip through the thread pool (`parallel_pays`), and a GPU
//! launch's roofline and occupancy (`launch`, `occupancy`). The register-tile, block-tile and Winograd
//! models (`tile.rs`, `gpu_tile.rs`, `winograd.rs`) answer in seconds on the same target.

use crate::roofline::{estimate, Bound, Cost, Estimate, Work};
use mlopt_target::{CpuTarget, GpuTarget, MatrixPrecision, Target};
use std::fmt;

/// How a CPU kernel's loops were scheduled, as the profiler and the priced estimate see it: `Tiled` (a
/// register-tiled contraction, a matrix unit's blocks or Winograd), `Vector` (some loop runs on vector
/// lanes) or `Scalar` (no loop is vectorised: every element goes through the scalar unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleClass {
    Tiled,
    Vector,
    Scalar,
}

impl fmt::Display for ScheduleClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            ScheduleClass::Tiled => "tiled",
            ScheduleClass::Vector => "vector",
            ScheduleClass::Scalar => "scalar",
        })
    }
}

/// Of a CPU's vector FMA peak, what arithmetic reaches by how it runs: in a register tile (or a matrix
/// unit's blocks) the peak; in a vector loop without register tiling, which reloads its accumulators and
/// operands each step, about half; in a vector loop that gathers (a load strides along the vector: one
/// element per lane per instruction), one lane's worth, 1/lanes; in a scalar nest, one lane whose single
/// accumulator waits out the FMA latency (4 cycles) between steps, 1/(4 lanes). Measured on Zen 4:
/// SqueezeNet's scalar convolutions run at 2.0 GFLOP/s of a 116 GFLOP/s peak (1/58), ViT's attention,
/// whose products gather the transposed keys, at 6 (1/19).
pub fn class_rate(t: &Target, class: ScheduleClass) -> f64 {
    let lanes = lanes(t);
    match class {
        ScheduleClass::Tiled => 1.0,
        ScheduleClass::Vector => 0.5,
        ScheduleClass::Scalar => 1.0 / (lanes * 4.0),
    }
}

/// The rate of gathering vector loops, as a fraction of the fp32 peak (see `class_rate`).
pub fn gather_rate(t: &Target) -> f64 {
    1.0 / lanes(t)
}

/// A CPU's f32 vector lanes (a GPU's kernels are priced by the plain roofline: 1).
fn lanes(t: &Target) -> f64 {
    t.cpu().map_or(1.0, |c| f64::from(c.lanes()))
}

/// The rate of a register tile whose vector loads stride (a stride-2 convolution reads every other
/// input column): the tile still reuses each load across its rows, so it reaches about 1/6 of the peak
/// (measured on Zen 4: YOLO's and GoogLeNet's stride-2 convolutions at 18-26 GFLOP/s of 116).
pub const TILED_GATHER_RATE: f64 = 1.0 / 6.0;

/// How a kernel's work runs, as shares of it (they add up to 1; see `mlopt_kir::analysis::arithmetic`:
/// its arithmetic, or its stores when it has none, a copy's).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Mix {
    pub tiled: f64,
    pub tiled_gather: f64,
    pub vector: f64,
    pub gather: f64,
    pub scalar: f64,
}

impl Mix {
    /// The mix of these amounts of work (any unit), or all vector when there is none.
    pub fn of(tiled: f64, tiled_gather: f64, vector: f64, gather: f64, scalar: f64) -> Mix {
        let n = tiled + tiled_gather + vector + gather + scalar;
        if n <= 0.0 {
            return Mix {
                vector: 1.0,
                ..Mix::default()
            };
        }
        Mix {
            tiled: tiled / n,
            tiled_gather: tiled_gather / n,
            vector: vector / n,
            gather: gather / n,
            scalar: scalar / n,
        }
    }

    /// The kernel's class, for the profile: `Tiled` when any of its work runs in register tiles or a
    /// matrix unit's blocks, else `Vector` when any runs in vector lanes, else `Scalar`.
    pub fn class(&self) -> ScheduleClass {
        if self.tiled + self.tiled_gather > 0.0 {
            ScheduleClass::Tiled
        } else if self.vector + self.gather > 0.0 {
            ScheduleClass::Vector
        } else {
            ScheduleClass::Scalar
        }
    }
}

/// The roofline estimate of a kernel doing `w` on `t` as it was actually scheduled: each share of its
/// arithmetic (`mix`) at its rate (`class_rate`, `gather_rate`); matrix units count only for the tiled
/// share. GPU kernels are priced by `estimate`.
pub fn priced(w: &Work, t: &Target, mix: Mix) -> Estimate {
    if t.is_gpu() {
        return estimate(w, t);
    }
    let peak = estimate(w, t).compute_s;
    let untiled = w.flops() / t.roof().fp32;
    let compute_s = mix.tiled * peak
        + mix.tiled_gather * untiled / TILED_GATHER_RATE
        + mix.vector * untiled / class_rate(t, ScheduleClass::Vector)
        + mix.gather * untiled / gather_rate(t)
        + mix.scalar * untiled / class_rate(t, ScheduleClass::Scalar);
    let memory_s = w.bytes / t.roof().dram_bw;
    let bound = if compute_s >= memory_s {
        Bound::Compute
    } else {
        Bound::Memory
    };
    Estimate {
        compute_s,
        memory_s,
        time: Cost::secs(compute_s.max(memory_s) + t.roof().launch_s),
        bound,
    }
}

/// Whether a CPU nest of `executions` loop-body executions (about a cycle each) pays for a trip through
/// the thread pool: its work must take at least `PARALLEL_DISPATCHES` times a dispatch, which wakes the
/// pool's threads and waits for them, about `DISPATCH_CYCLES` of a core (1 us at a nominal 3 GHz, the
/// named targets' `Roof::launch_s`). Both are times on the target's clock, so the verdict is 16,384
/// executions on any core: measured, not derived.
pub fn parallel_pays(t: &CpuTarget, executions: u64) -> bool {
    t.cycles(executions as f64) >= PARALLEL_DISPATCHES * t.cycles(DISPATCH_CYCLES)
}

/// One buffer a parallel nest reads or writes, as `split_s` sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitOperand {
    pub bytes: u64,
    /// The split loop indexes it: each thread touches a share.
    pub split: bool,
    /// A weight (constant data): no kernel writes it, so every core's cache may hold it.
    pub weight: bool,
    /// The nest writes it (an output, read next by another kernel).
    pub written: bool,
}

/// The seconds one of `t`'s threads spends moving a nest's `operands` when a loop splits it, plus
/// `dispatches` trips through the thread pool (a split loop inside others forks once per iteration of
/// those). Bytes are priced as streamed from memory, except activations under a split across a weight
/// (its output channels) that every thread reads whole or that the nest writes: kernels split their
/// rows (positions) wherever that is cheaper, so a thread finds the rows it reads in its own cache,
/// written there by the kernel before; split by channels, each thread reads every row, most of them
/// from the other cores' caches, and leaves its channels of every row where the next kernel's threads
/// read them from its cache. Such a byte costs `1 + REMOTE_BYTE` streamed ones.
pub fn split_s(t: &CpuTarget, operands: &[SplitOperand], dispatches: u64) -> f64 {
    let threads = t.threads.max(1) as f64;
    let by_channels = operands.iter().any(|o| o.weight && o.split);
    let bytes: f64 = operands
        .iter()
        .map(|o| {
            let share = if o.split { 1.0 / threads } else { 1.0 };
            let scale = if by_channels && !o.weight && (!o.split || o.written) {
                1.0 + REMOTE_BYTE
            } else {
                1.0
            };
            o.bytes as f64 * share * scale
        })
        .sum();
    bytes * threads / t.roof.dram_bw + dispatches as f64 * t.cycles(DISPATCH_CYCLES)
}

/// What an activation byte read across cores costs beyond a streamed one (see `split_s`). At 2 threads
/// on Sapphire Rapids, Whisper-tiny's 1500-row products (activations 2.3 MB, weights 0.6-2.4 MB) run in
/// 0.93 of the time split by rows; ResNet-50's 14x14 pointwise convolutions, split by channels, took
/// longer than on one thread while the host was busy (0.95-1.06 ms against 0.84) and 0.50-0.78 ms
/// split by positions, the same in quiet runs.
const REMOTE_BYTE: f64 = 2.0;

/// A thread-pool dispatch, in cycles of a core (see `parallel_pays`).
const DISPATCH_CYCLES: f64 = 3000.0;
/// How many dispatches a parallel nest's work must take (see `parallel_pays`).
const PARALLEL_DISPATCHES: f64 = 16384.0 / DISPATCH_CYCLES;

/// Threads per block of an elementwise GPU launch (one element per thread): eight warps, which keep
/// an SM's schedulers busy at any occupancy and make few enough blocks for small grids.
pub const GPU_ELEMENTWISE_THREADS: u64 = 256;
/// Threads per block of a cooperative row (a softmax or a norm by one block) at most.
pub const GPU_ROW_THREADS: u64 = 256;

/// One GPU launch on the roofline: its FLOPs at the peak of what it runs on (the tensor cores of its
/// operands' type, `matrix`, else the SIMT fp32 lanes) against its bytes at the DRAM bandwidth.
pub fn launch(t: &GpuTarget, flops: f64, bytes: f64, matrix: Option<MatrixPrecision>) -> Estimate {
    let peak = match matrix {
        Some(MatrixPrecision::Bf16) => t.bf16,
        Some(MatrixPrecision::F16) => t.f16,
        Some(MatrixPrecision::Tf32 | MatrixPrecision::F32) => t.tf32,
        // (No integer contraction runs on a GPU's tensor cores yet: its SIMT lanes.)
        Some(MatrixPrecision::I16) => t.roof.fp32,
        None => t.roof.fp32,
    };
    let (compute_s, memory_s) = (flops / peak, bytes / t.roof.dram_bw);
    let bound = if compute_s >= memory_s {
        Bound::Compute
    } else {
        Bound::Memory
    };
    Estimate {
        compute_s,
        memory_s,
        time: Cost::secs(compute_s.max(memory_s)),
        bound,
    }
}

/// Resident warps per SM over the most warps an SM holds, for blocks of `block` threads using `regs`
/// registers a thread and `smem` bytes of shared memory: limited by threads, registers (allocated per
/// warp in units of 256) and shared memory, and at most 32 blocks.
pub fn occupancy(t: &GpuTarget, block: u64, regs: u32, smem: u64) -> f64 {
    let max_warps = (u64::from(t.threads_per_sm) / GpuTarget::WARP).max(1);
    let warps = block.div_ceil(GpuTarget::WARP).max(1);
    let regs_per_warp = (u64::from(regs.max(1)) * GpuTarget::WARP).div_ceil(256) * 256;
    let by_threads = max_warps / warps;
    let by_regs = (u64::from(t.regs_per_sm) / regs_per_warp) / warps;
    let by_smem = u64::from(t.smem_per_sm)
        .checked_div(smem)
        .unwrap_or(u64::MAX);
    let blocks = by_threads.min(by_regs).min(by_smem).min(32);
    (blocks * warps) as f64 / max_warps as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Occupancy is limited by whichever runs out first: threads, registers or shared memory (the
    /// target's shared memory per SM is in bytes).
    #[test]
    fn occupancy_counts_each_limit() {
        let t = mlopt_target::gpu::sm_80();
        let warps = (t.threads_per_sm / 32) as f64;
        assert_eq!(occupancy(&t, 128, 32, 0), 1.0);
        // 128 registers a thread: 65536 / (128 x 32 x 4 warps) = 4 blocks of 4 warps.
        assert_eq!(occupancy(&t, 128, 128, 0), 16.0 / warps);
        // 48 KiB of shared memory a block: as many blocks as fit in the SM's shared memory.
        let blocks = (u64::from(t.smem_per_sm) / (48 * 1024)) as f64;
        assert_eq!(occupancy(&t, 128, 32, 48 * 1024), blocks * 4.0 / warps);
    }

    /// The dispatch verdict is the measured threshold, whatever the clock.
    #[test]
    fn parallel_nests_pay_above_the_dispatch_cost() {
        let mut t = mlopt_target::cpu::x86_64_v4(2);
        for mhz in [3000, 4235] {
            t.clock_mhz = mhz;
            assert!(
                parallel_pays(&t, 1 << 14) && !parallel_pays(&t, (1 << 14) - 1),
                "{mhz}"
            );
        }
    }

    /// The profile's class is the fastest way any of a kernel's work runs.
    #[test]
    fn a_kernel_class_follows_its_mix() {
        assert_eq!(
            Mix::of(1.0, 0.0, 9.0, 0.0, 0.0).class(),
            ScheduleClass::Tiled
        );
        assert_eq!(
            Mix::of(0.0, 0.0, 1.0, 1.0, 5.0).class(),
            ScheduleClass::Vector
        );
        assert_eq!(
            Mix::of(0.0, 0.0, 0.0, 0.0, 3.0).class(),
            ScheduleClass::Scalar
        );
        assert_eq!(
            Mix::of(0.0, 0.0, 0.0, 0.0, 0.0).class(),
            ScheduleClass::Vector
        );
    }
}
