//! GPU targets: NVIDIA GPUs from sm_80 up, one table row each, with the vendor's published peaks (dense,
//! no sparsity) at boost clock; the source of each is given where the row is.

use crate::Roof;

/// One NVIDIA GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTarget {
    /// The compute capability's name (`sm_80`), which ptxas and LLVM take as the architecture.
    pub name: String,
    pub sms: u32,
    /// Boost clock in MHz.
    pub clock_mhz: u32,
    /// fp32 SIMT throughput, the dram bandwidth and the launch cost of the whole device.
    pub roof: Roof,
    /// Tensor-core throughputs (fp32 accumulation), FLOP/s.
    pub tf32: f64,
    pub f16: f64,
    pub bf16: f64,
    /// Per streaming multiprocessor: shared memory in bytes, 32-bit registers, resident threads.
    pub smem_per_sm: u32,
    pub regs_per_sm: u32,
    pub threads_per_sm: u32,
    /// The least time one K slice of a tiled GEMM takes on a block, however little it computes: the
    /// slice's global loads (issued one slice ahead) must arrive, and two barriers pass. Blocks resident
    /// on one SM overlap theirs, so a grid of few blocks walking a long K is bound by this, not by the
    /// peak. Measured on an H100 (Nsight Compute, ResNet-50's last 3x3 convolution: 32 blocks of 288
    /// slices in 0.37 ms, 1.3 us a slice); no other GPU's figure is known here, so every row uses it.
    pub slice_latency_s: f64,
    /// The PTX ISA version (times ten) the code is written in, the first that has this GPU, so the PTX
    /// loads on the oldest driver that knows it (CUDA 11.0: sm_80 with PTX 7.0; 11.1: sm_86 with 7.1;
    /// 11.8: sm_89 and sm_90 with 7.8).
    pub ptx: u32,
}

impl GpuTarget {
    /// Threads per block at most, and static shared memory per block (48 KiB without opting in to
    /// more): the same on every architecture mlopt targets (sm_80 and up).
    pub const MAX_THREADS: u64 = 1024;
    pub const SHARED_BYTES: u64 = 48 * 1024;
    /// Threads of a warp.
    pub const WARP: u64 = 32;

    /// The PTX version as PTX writes it (`7.0`).
    pub fn ptx_version(&self) -> String {
        format!("{}.{}", self.ptx / 10, self.ptx % 10)
    }
}

/// A shared shape for the NVIDIA rows; throughput arguments in TFLOP/s, bandwidth in GB/s.
#[allow(clippy::too_many_arguments)]
fn row(
    name: &str,
    ptx: u32,
    sms: u32,
    mhz: u32,
    [fp32, tf32, f16, bf16]: [f64; 4],
    dram: f64,
    l2_mib: u64,
    smem_kib: u32,
    threads: u32,
    source: &str,
) -> GpuTarget {
    GpuTarget {
        name: name.into(),
        sms,
        clock_mhz: mhz,
        roof: Roof {
            fp32: fp32 * 1e12,
            dram_bw: dram * 1e9,
            // L2 bandwidth is not published; ~2.5x DRAM is what microbenchmarks report on Ampere/Hopper.
            llc_bw: dram * 2.5e9,
            llc_bytes: l2_mib << 20,
            // A stream launch costs ~3 us of host + device time when kernels are queued back to back.
            launch_s: 3e-6,
            source: source.into(),
        },
        tf32: tf32 * 1e12,
        f16: f16 * 1e12,
        bf16: bf16 * 1e12,
        smem_per_sm: smem_kib * 1024,
        regs_per_sm: 65536,
        threads_per_sm: threads,
        slice_latency_s: 1.3e-6,
        ptx,
    }
}

/// A100 SXM4 80 GB: NVIDIA A100 datasheet (fp32 19.5, tf32 156, fp16/bf16 312 TFLOP/s dense, 2039 GB/s
/// HBM2e) and the Ampere tuning guide (108 SMs at 1410 MHz, 164 KiB shared memory per SM, 40 MiB L2,
/// 2048 threads per SM).
pub fn sm_80() -> GpuTarget {
    let peaks = [19.5, 156.0, 312.0, 312.0];
    row(
        "sm_80",
        70,
        108,
        1410,
        peaks,
        2039.0,
        40,
        164,
        2048,
        "A100 SXM4 80GB datasheet",
    )
}

/// RTX 3090 (GA102): Ampere GA102 whitepaper (82 SMs at 1695 MHz, fp32 35.6 TFLOP/s, tensor fp16/bf16
/// with fp32 accumulation 71 and tf32 35.6 TFLOP/s dense, 936 GB/s GDDR6X, 6 MiB L2, 100 KiB shared
/// memory and 1536 threads per SM).
pub fn sm_86() -> GpuTarget {
    let peaks = [35.6, 35.6, 71.0, 71.0];
    row(
        "sm_86",
        71,
        82,
        1695,
        peaks,
        936.0,
        6,
        100,
        1536,
        "RTX 3090 / GA102 whitepaper",
    )
}

/// RTX 4090 (AD102): Ada whitepaper (128 SMs at 2520 MHz, fp32 82.6 TFLOP/s, tensor fp16/bf16 with fp32
/// accumulation 165.2 and tf32 82.6 TFLOP/s dense, 1008 GB/s, 72 MiB L2, 100 KiB shared memory and 1536
/// threads per SM).
pub fn sm_89() -> GpuTarget {
    let peaks = [82.6, 82.6, 165.2, 165.2];
    row(
        "sm_89",
        78,
        128,
        2520,
        peaks,
        1008.0,
        72,
        100,
        1536,
        "RTX 4090 / Ada whitepaper",
    )
}

/// H100 SXM5: H100 datasheet (132 SMs at 1830 MHz, fp32 67, tf32 494.7, fp16/bf16 989.4 TFLOP/s dense,
/// 3350 GB/s HBM3, 50 MiB L2, 228 KiB shared memory and 2048 threads per SM).
pub fn sm_90() -> GpuTarget {
    let peaks = [67.0, 494.7, 989.4, 989.4];
    row(
        "sm_90",
        78,
        132,
        1830,
        peaks,
        3350.0,
        50,
        228,
        2048,
        "H100 SXM5 datasheet",
    )
}
