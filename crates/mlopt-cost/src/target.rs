//! Target descriptions: the peaks the roofline needs, one table row per named target.
//!
//! CPU figures are per core and multiplied by the thread count; the host's come from `calibrate` when it
//! has been run (cached in a file) and from the documented x86-64-v4 defaults otherwise. GPU figures are the
//! vendor's published peaks (dense, no sparsity) at boost clock; the source of each is given where the row is.

use crate::error::{CostError, Result};
use std::fmt;

/// What kind of machine the code runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cpu,
    Gpu,
}

/// The precision a matrix op (MatMul, Gemm, Conv, Attention) computes in; each has its own peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MatrixPrecision {
    F32,
    /// fp32 storage on tf32 tensor cores (GPU only, and only when the user's `--precision` allows it).
    Tf32,
    F16,
    Bf16,
}

/// One target's limits. Throughputs in FLOP/s, bandwidths in bytes/s, overheads in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub kind: Kind,
    /// CPU: cores used; GPU: streaming multiprocessors.
    pub units: u32,
    /// Clock in MHz (GPU boost clock; informative for CPUs).
    pub clock_mhz: u32,
    /// Vector (SIMT / SIMD) fp32 throughput, used by every op that is not a matrix op.
    pub fp32: f64,
    /// Matrix throughput by precision; `None` when the target has no fast path for it.
    pub tf32_matrix: Option<f64>,
    pub f16_matrix: Option<f64>,
    pub bf16_matrix: Option<f64>,
    /// Main-memory (DRAM / HBM) bandwidth.
    pub dram_bw: f64,
    /// Last-level cache bandwidth and capacity: values that fit are read at this rate by a later kernel.
    pub llc_bw: f64,
    pub llc_bytes: u64,
    /// Fixed cost of launching one kernel (CPU: a parallel-for dispatch; GPU: a stream launch).
    pub launch_s: f64,
    /// GPU only: shared memory and 32-bit registers per SM, and the most threads per SM.
    pub smem_per_unit: u32,
    pub regs_per_unit: u32,
    pub threads_per_unit: u32,
    /// CPU only: the widest vector in bits (512 for AVX-512, 256 for AVX2).
    pub vector_bits: u32,
    /// CPU only: one core's L2 in bytes (a contraction's panels of B should fit in half of it).
    pub l2_bytes: u64,
    /// CPU only: the ISA features code generation may use (LLVM spelling, without `+`).
    pub features: Vec<String>,
    /// CPU only: the CPU LLVM generates code for (`host`: this machine, as LLVM detects it).
    pub llvm_cpu: String,
    /// GPU only: the PTX ISA version (times ten) the code is written in, the first that has this GPU,
    /// so the PTX loads on the oldest driver that knows it (CUDA 11.0: sm_80 with PTX 7.0; 11.1: sm_86
    /// with 7.1; 11.8: sm_89 and sm_90 with 7.8).
    pub ptx: u32,
    /// Where the peaks came from, for the report.
    pub source: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({:.1} GFLOP/s fp32, {:.1} GB/s",
            self.name,
            self.fp32 / 1e9,
            self.dram_bw / 1e9
        )?;
        if let Some(p) = self.bf16_matrix {
            write!(f, ", {:.1} GFLOP/s bf16", p / 1e9)?;
        }
        write!(f, "; {})", self.source)
    }
}

/// The L2 a CPU target is assumed to have per core when it is not the host: 1 MiB (Zen 4; Sapphire
/// Rapids has 2).
pub const DEFAULT_L2_BYTES: u64 = 1 << 20;

/// The names `--target` accepts.
pub const TARGET_NAMES: &[&str] = &[
    "host",
    "x86-64-v3",
    "x86-64-v4",
    "znver4",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
];

impl Target {
    /// Looks a target up by name; `host` uses the calibration cache when present (see `calibrate`).
    pub fn named(name: &str, threads: u32) -> Result<Target> {
        let threads = threads.max(1);
        match name {
            "host" => Ok(crate::calibrate::host(threads)),
            "x86-64-v3" => Ok(cpu_v3(threads)),
            "x86-64-v4" => Ok(cpu_v4(threads)),
            "znver4" => Ok(cpu_znver4(threads)),
            "sm_80" => Ok(sm_80()),
            "sm_86" => Ok(sm_86()),
            "sm_89" => Ok(sm_89()),
            "sm_90" => Ok(sm_90()),
            _ => Err(CostError::UnknownTarget {
                name: name.into(),
                known: TARGET_NAMES.join(", "),
            }),
        }
    }

    pub fn is_gpu(&self) -> bool {
        self.kind == Kind::Gpu
    }

    /// The throughput of a matrix op in `p`, falling back to the fp32 vector peak when the target has no
    /// matrix unit for `p`.
    pub fn matrix_peak(&self, p: MatrixPrecision) -> f64 {
        let fast = match p {
            MatrixPrecision::F32 => None,
            MatrixPrecision::Tf32 => self.tf32_matrix,
            MatrixPrecision::F16 => self.f16_matrix,
            MatrixPrecision::Bf16 => self.bf16_matrix,
        };
        fast.unwrap_or(self.fp32)
    }
}

/// x86-64-v3 (AVX2 + FMA + F16C) per core: 2 FMA ports x 8 lanes x 2 FLOP at a nominal 3.0 GHz = 96
/// GFLOP/s; no bf16 dot product (bf16 is converted and runs at the fp32 rate). 12 GB/s of DRAM bandwidth
/// per core is typical of one core's reach on a server; a shared L3 of 32 MiB at ~60 GB/s per core.
pub fn cpu_v3(threads: u32) -> Target {
    let t = threads as f64;
    Target {
        name: "x86-64-v3".into(),
        kind: Kind::Cpu,
        units: threads,
        clock_mhz: 3000,
        fp32: 96e9 * t,
        tf32_matrix: None,
        f16_matrix: None,
        bf16_matrix: None,
        dram_bw: 12e9 * t,
        llc_bw: 60e9 * t,
        llc_bytes: 32 << 20,
        launch_s: 1e-6,
        smem_per_unit: 0,
        regs_per_unit: 0,
        threads_per_unit: 0,
        vector_bits: 256,
        l2_bytes: DEFAULT_L2_BYTES,
        features: [
            "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe",
        ]
        .map(String::from)
        .to_vec(),
        llvm_cpu: "x86-64-v3".into(),
        ptx: 0,
        source: "x86-64-v3 defaults (nominal 3.0 GHz, 2 FMA ports)".into(),
    }
}

/// x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) per core. The fp32 figure is what was measured on a Sapphire Rapids
/// core (135-145 GFLOP/s sustained with 512-bit FMAs, below the 2 x 16 x 2 x 3.0 GHz = 192 nominal because
/// of the AVX-512 clock offset); bf16 is twice that where AVX512-BF16 `vdpbf16ps` exists (a v4 target
/// does not promise it, so plain v4 leaves it out). DRAM 12 GB/s and L3 as for v3.
pub fn cpu_v4(threads: u32) -> Target {
    let mut t = cpu_v3(threads);
    let n = threads as f64;
    t.name = "x86-64-v4".into();
    t.llvm_cpu = "x86-64-v4".into();
    t.fp32 = 140e9 * n;
    t.vector_bits = 512;
    t.features
        .extend(["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"].map(String::from));
    t.source = "x86-64-v4 defaults (measured Sapphire Rapids FMA rate, 12 GB/s per core)".into();
    t
}

/// AMD Zen 4 (EPYC 9004) per core: AVX-512 on two 256-bit FMA pipes (a zmm FMA per cycle: 32 FLOP per
/// cycle at ~3.5 GHz all-core = 112 GFLOP/s) and AVX512-BF16, whose `vdpbf16ps` is taken at one zmm per
/// cycle, twice the FMA's FLOPs. These are nominal figures, not measured here (no Zen 4 machine); memory
/// as for v3/v4. No AMX: bf16 `mma` blocks run on `vdpbf16ps` (mlopt-llvm's dot.rs).
pub fn cpu_znver4(threads: u32) -> Target {
    let mut t = cpu_v4(threads);
    let n = threads as f64;
    t.name = "znver4".into();
    t.llvm_cpu = "znver4".into();
    t.clock_mhz = 3500;
    t.fp32 = 112e9 * n;
    t.bf16_matrix = Some(224e9 * n);
    t.features.extend(
        [
            "avx512bf16",
            "avx512vnni",
            "avx512bitalg",
            "avx512vbmi",
            "avx512vbmi2",
            "avx512vpopcntdq",
        ]
        .map(String::from),
    );
    t.source = "Zen 4 nominal (2 x 256-bit FMA pipes at 3.5 GHz, vdpbf16ps at one zmm per cycle; not measured)".into();
    t
}

/// A shared shape for the NVIDIA rows; throughput arguments in TFLOP/s, bandwidth in GB/s.
#[allow(clippy::too_many_arguments)]
fn gpu(
    name: &str,
    ptx: u32,
    sms: u32,
    mhz: u32,
    fp32: f64,
    tf32: f64,
    f16: f64,
    bf16: f64,
    dram: f64,
    l2_mib: u64,
    smem_kib: u32,
    threads: u32,
    source: &str,
) -> Target {
    Target {
        name: name.into(),
        kind: Kind::Gpu,
        units: sms,
        clock_mhz: mhz,
        fp32: fp32 * 1e12,
        tf32_matrix: Some(tf32 * 1e12),
        f16_matrix: Some(f16 * 1e12),
        bf16_matrix: Some(bf16 * 1e12),
        dram_bw: dram * 1e9,
        // L2 bandwidth is not published; ~2.5x DRAM is what microbenchmarks report on Ampere/Hopper.
        llc_bw: dram * 2.5e9,
        llc_bytes: l2_mib << 20,
        // A stream launch costs ~3 us of host + device time when kernels are queued back to back.
        launch_s: 3e-6,
        smem_per_unit: smem_kib * 1024,
        regs_per_unit: 65536,
        threads_per_unit: threads,
        vector_bits: 0,
        l2_bytes: 0,
        features: vec![],
        llvm_cpu: String::new(),
        ptx,
        source: source.into(),
    }
}

/// A100 SXM4 80 GB: NVIDIA A100 datasheet (fp32 19.5, tf32 156, fp16/bf16 312 TFLOP/s dense, 2039 GB/s
/// HBM2e) and the Ampere tuning guide (108 SMs at 1410 MHz, 164 KiB shared memory per SM, 40 MiB L2,
/// 2048 threads per SM).
pub fn sm_80() -> Target {
    gpu(
        "sm_80",
        70,
        108,
        1410,
        19.5,
        156.0,
        312.0,
        312.0,
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
pub fn sm_86() -> Target {
    gpu(
        "sm_86",
        71,
        82,
        1695,
        35.6,
        35.6,
        71.0,
        71.0,
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
pub fn sm_89() -> Target {
    gpu(
        "sm_89",
        78,
        128,
        2520,
        82.6,
        82.6,
        165.2,
        165.2,
        1008.0,
        72,
        100,
        1536,
        "RTX 4090 / Ada whitepaper",
    )
}

/// H100 SXM5: H100 datasheet (132 SMs at 1830 MHz, fp32 67, tf32 494.7, fp16/bf16 989.4 TFLOP/s dense,
/// 3350 GB/s HBM3, 50 MiB L2, 228 KiB shared memory and 2048 threads per SM).
pub fn sm_90() -> Target {
    gpu(
        "sm_90",
        78,
        132,
        1830,
        67.0,
        494.7,
        989.4,
        989.4,
        3350.0,
        50,
        228,
        2048,
        "H100 SXM5 datasheet",
    )
}
