//! CPU targets: x86-64 machines, one table row per named level (`x86-64-v3`, `x86-64-v4`, `znver4`,
//! `sapphirerapids`) and
//! the host (`calibrate.rs`). Peaks are per core times the threads the code runs on; the host's come
//! from its calibration, the named rows' from the documented figures below.

use crate::Roof;

/// One x86-64 target.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTarget {
    pub name: String,
    /// The CPU LLVM generates code for.
    pub model: CpuModel,
    /// The ISA features code generation may use (LLVM spelling, without `+`); lanes and the matrix
    /// unit follow from them.
    pub features: Vec<String>,
    /// Threads the code runs on (the peaks are for all of them).
    pub threads: u32,
    /// Core clock in MHz (calibrated for the host, nominal for the named rows).
    pub clock_mhz: u32,
    pub roof: Roof,
    /// bf16 contraction throughput on the matrix unit (AMX tiles or `vdpbf16ps`), when there is one.
    pub bf16: Option<f64>,
    /// One core's L2 in bytes (read from the OS for the host; 1 MiB assumed for the named rows).
    pub l2_bytes: u64,
}

/// The CPU LLVM is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuModel {
    /// This machine, whatever LLVM calls it, with every feature LLVM detects on it.
    Host,
    /// A CPU LLVM knows by this name (`x86-64-v4`, `znver4`), with its default features.
    Named(String),
}

/// A CPU's bf16 matrix unit, which `mma` blocks run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixUnit {
    /// AMX tiles (`tdpbf16ps`, Sapphire Rapids).
    Amx,
    /// AVX512-BF16 dot products (`vdpbf16ps`, Zen 4, Cooper Lake).
    Dot,
}

/// The CPU's i16 dot product (`CpuTarget::i16_dot`): i32 lanes of one accumulator, and whether one
/// instruction multiplies and adds (`vpdpwssd`) or two do (`vpmaddwd`, `vpaddd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct I16Dot {
    pub fused: bool,
    pub lanes: u32,
}

impl CpuTarget {
    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    /// Whether this machine has every ISA feature the target's code may use: code for a
    /// `sapphirerapids` target on a CPU without AMX would fault on its first tile instruction.
    pub fn runs_here(&self) -> bool {
        let host = crate::calibrate::host_features();
        self.features.iter().all(|f| host.contains(f))
    }

    /// f32 lanes of the widest vector register: 16 with AVX-512, else 8.
    pub fn lanes(&self) -> u32 {
        if self.has("avx512f") {
            16
        } else {
            8
        }
    }

    /// Vector registers of that width: 32 zmm with AVX-512, 16 ymm with AVX2.
    pub fn vector_registers(&self) -> u32 {
        if self.has("avx512f") {
            32
        } else {
            16
        }
    }

    /// The bf16 matrix unit: AMX tiles, else AVX512-BF16 dot products, else none.
    pub fn matrix(&self) -> Option<MatrixUnit> {
        if self.has("amx-tile") && self.has("amx-bf16") {
            Some(MatrixUnit::Amx)
        } else if self.has("avx512bf16") {
            Some(MatrixUnit::Dot)
        } else {
            None
        }
    }

    /// What runs `mma` blocks on i16 pairs (i32 sums): AVX512-VNNI's `vpdpwssd` on zmm, else
    /// `vpmaddwd` and `vpaddd` on zmm (AVX-512BW) or ymm (AVX2); None without AVX2.
    pub fn i16_dot(&self) -> Option<I16Dot> {
        let zmm = self.has("avx512bw");
        if zmm {
            Some(I16Dot {
                fused: self.has("avx512vnni"),
                lanes: 16,
            })
        } else if self.has("avx2") {
            Some(I16Dot {
                fused: false,
                lanes: 8,
            })
        } else {
            None
        }
    }

    /// The integer dot product's peak (`i16_dot`) in multiply-adds x 2 a second, all threads: two
    /// multiply-adds a 32-bit lane per instruction, at the FMAs' rate where one instruction adds them
    /// in (`vpdpwssd`); with `vpmaddwd` and `vpaddd`, 1.5x the FMAs' (1.57x measured on Zen 3, whose
    /// FMAs and integer multiplies share no port). Derived from the calibrated fp32 peak, not
    /// calibrated itself.
    pub fn i16_peak(&self) -> Option<f64> {
        let d = self.i16_dot()?;
        Some(self.roof.fp32 * if d.fused { 2.0 } else { 1.5 })
    }

    /// Seconds of `cycles` of one core at its clock.
    pub fn cycles(&self, cycles: f64) -> f64 {
        cycles / (f64::from(self.clock_mhz.max(1)) * 1e6)
    }
}

/// The L2 a CPU target is assumed to have per core when it is not the host: 1 MiB (Zen 4; Sapphire
/// Rapids has 2).
pub const DEFAULT_L2_BYTES: u64 = 1 << 20;

/// x86-64-v3 (AVX2 + FMA + F16C) per core: 2 FMA ports x 8 lanes x 2 FLOP at a nominal 3.0 GHz = 96
/// GFLOP/s; no bf16 dot product (bf16 is converted and runs at the fp32 rate). 12 GB/s of DRAM bandwidth
/// per core is typical of one core's reach on a server; a shared L3 of 32 MiB at ~60 GB/s per core.
pub fn x86_64_v3(threads: u32) -> CpuTarget {
    let t = threads as f64;
    CpuTarget {
        name: "x86-64-v3".into(),
        model: CpuModel::Named("x86-64-v3".into()),
        features: [
            "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe",
        ]
        .map(String::from)
        .to_vec(),
        threads,
        clock_mhz: 3000,
        roof: Roof {
            fp32: 96e9 * t,
            dram_bw: 12e9 * t,
            llc_bw: 60e9 * t,
            llc_bytes: 32 << 20,
            launch_s: 1e-6,
            source: "x86-64-v3 defaults (nominal 3.0 GHz, 2 FMA ports)".into(),
        },
        bf16: None,
        l2_bytes: DEFAULT_L2_BYTES,
    }
}

/// x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) per core. The fp32 figure is what was measured on a Sapphire Rapids
/// core (135-145 GFLOP/s sustained with 512-bit FMAs, below the 2 x 16 x 2 x 3.0 GHz = 192 nominal because
/// of the AVX-512 clock offset); bf16 is twice that where AVX512-BF16 `vdpbf16ps` exists (a v4 target
/// does not promise it, so plain v4 leaves it out). DRAM 12 GB/s and L3 as for v3.
pub fn x86_64_v4(threads: u32) -> CpuTarget {
    let mut t = x86_64_v3(threads);
    t.name = "x86-64-v4".into();
    t.model = CpuModel::Named("x86-64-v4".into());
    t.roof.fp32 = 140e9 * threads as f64;
    t.features
        .extend(["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"].map(String::from));
    t.roof.source =
        "x86-64-v4 defaults (measured Sapphire Rapids FMA rate, 12 GB/s per core)".into();
    t
}

/// bf16 matrix throughput of one core on AMX tiles, FLOP/s: a loop of independent `tdpbf16ps` on
/// 16x16x32 tiles measured 1.50 TFLOP/s on a Sapphire Rapids core (2026-11-21; `calibrate` does not
/// measure it: that needs the tile state, which the calibration does not request).
pub const AMX_BF16_PER_CORE: f64 = 1.5e12;

/// Intel Sapphire Rapids (4th-generation Xeon) per core: AVX-512 with two 512-bit FMA ports (the v4
/// figure, measured here), AVX512-BF16 (`vdpbf16ps` on one port, half the FMA rate: unused, bf16
/// blocks go on the tiles) and AMX (`tdpbf16ps` at `AMX_BF16_PER_CORE`). Named so that the AMX blocks
/// are scheduled, verified and run in the kernel IR's interpreter on machines without tiles.
pub fn sapphirerapids(threads: u32) -> CpuTarget {
    let mut t = x86_64_v4(threads);
    t.name = "sapphirerapids".into();
    t.model = CpuModel::Named("sapphirerapids".into());
    t.bf16 = Some(AMX_BF16_PER_CORE * threads as f64);
    t.features.extend(
        [
            "avx512bf16",
            "avx512vnni",
            "avx512fp16",
            "amx-tile",
            "amx-bf16",
            "amx-int8",
        ]
        .map(String::from),
    );
    t.roof.source = "Sapphire Rapids (v4's measured FMA rate, AMX bf16 at 1.5 TFLOP/s per core; not calibrated)".into();
    t
}

/// AMD Zen 4 (EPYC 9004) per core: AVX-512 on two 256-bit FMA pipes (a zmm FMA per cycle: 32 FLOP per
/// cycle at ~3.5 GHz all-core = 112 GFLOP/s) and AVX512-BF16, whose `vdpbf16ps` is taken at one zmm per
/// cycle, twice the FMA's FLOPs. These are nominal figures; memory as for v3/v4. No AMX: bf16 `mma`
/// blocks run on `vdpbf16ps`.
pub fn znver4(threads: u32) -> CpuTarget {
    let mut t = x86_64_v4(threads);
    let n = threads as f64;
    t.name = "znver4".into();
    t.model = CpuModel::Named("znver4".into());
    t.clock_mhz = 3500;
    t.roof.fp32 = 112e9 * n;
    t.bf16 = Some(224e9 * n);
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
    t.roof.source = "Zen 4 nominal (2 x 256-bit FMA pipes at 3.5 GHz, vdpbf16ps at one zmm per cycle; not measured)".into();
    t
}
