//! mlopt's targets: what the machine that will run the code is. `--target` is read once, at the driver's
//! boundary, into one `Target` (`Target::named`, the only table of target names; `host` is detected and
//! calibrated, `calibrate.rs`), and every stage takes that value as it is: the cost model reads its peaks,
//! ports and caches, the schedules its lanes, threads and matrix unit, code generation its CPU model and
//! features or its PTX version. Its shape says what it is, so no field is zero "because it is the other
//! kind" and no stage keeps a default of its own.
//!
//! Architecture invariant: depends on nothing of mlopt's; no other crate parses a target name.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod calibrate;
pub mod cpu;
pub mod error;
pub mod gpu;

pub use cpu::{CpuModel, CpuTarget, I16Dot, MatrixUnit};
pub use error::{Result, TargetError};
pub use gpu::GpuTarget;
use std::fmt;

/// The machine code is compiled for.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Cpu(CpuTarget),
    Gpu(GpuTarget),
}

/// The precision a matrix op (MatMul, Gemm, Conv, Attention) computes in; each has its own peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MatrixPrecision {
    F32,
    /// fp32 storage on tf32 tensor cores (GPU only, and only when the user's `--precision` allows it).
    Tf32,
    F16,
    Bf16,
    /// i16 pairs summed in i32: a quantized model's integer contractions (CPU integer dot products).
    I16,
}

impl std::fmt::Display for MatrixPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            MatrixPrecision::F32 => "f32",
            MatrixPrecision::Tf32 => "tf32",
            MatrixPrecision::F16 => "f16",
            MatrixPrecision::Bf16 => "bf16",
            MatrixPrecision::I16 => "i16",
        })
    }
}

/// The names `--target` accepts.
pub const TARGET_NAMES: &[&str] = &[
    "host",
    "x86-64-v3",
    "x86-64-v4",
    "znver4",
    "sapphirerapids",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
];

/// The widest fixed x86 level this machine runs code for: `x86-64-v4` (AVX-512) where it has those
/// features, else `x86-64-v3` (AVX2). Tests and examples that run what they compile name this level rather
/// than `host`, whose schedules follow the machine's calibration and matrix unit, so that the kernels they
/// check are the same on every machine of one level; code for a level the machine lacks would only be
/// refused at run time ("this CPU lacks an instruction set").
pub fn runnable_level() -> &'static str {
    if cpu::x86_64_v4(1).runs_here() {
        "x86-64-v4"
    } else {
        "x86-64-v3"
    }
}

impl Target {
    /// Looks a target up by name, for code that runs `threads` threads (CPU peaks are per core and
    /// scale with them; a GPU's do not). `host` is this machine: its features detected now, its peaks
    /// calibrated on first use and cached (`calibrate`).
    pub fn named(name: &str, threads: u32) -> Result<Target> {
        let threads = threads.max(1);
        Ok(match name {
            "host" => Target::Cpu(calibrate::host(threads)),
            "x86-64-v3" => Target::Cpu(cpu::x86_64_v3(threads)),
            "x86-64-v4" => Target::Cpu(cpu::x86_64_v4(threads)),
            "znver4" => Target::Cpu(cpu::znver4(threads)),
            "sapphirerapids" => Target::Cpu(cpu::sapphirerapids(threads)),
            "sm_80" => Target::Gpu(gpu::sm_80()),
            "sm_86" => Target::Gpu(gpu::sm_86()),
            "sm_89" => Target::Gpu(gpu::sm_89()),
            "sm_90" => Target::Gpu(gpu::sm_90()),
            _ => {
                return Err(TargetError::Unknown {
                    name: name.into(),
                    known: TARGET_NAMES.join(", "),
                })
            }
        })
    }

    pub fn name(&self) -> &str {
        match self {
            Target::Cpu(c) => &c.name,
            Target::Gpu(g) => &g.name,
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Target::Gpu(_))
    }

    pub fn cpu(&self) -> Option<&CpuTarget> {
        match self {
            Target::Cpu(c) => Some(c),
            Target::Gpu(_) => None,
        }
    }

    pub fn gpu(&self) -> Option<&GpuTarget> {
        match self {
            Target::Gpu(g) => Some(g),
            Target::Cpu(_) => None,
        }
    }

    /// The roofline's figures of this target.
    pub fn roof(&self) -> &Roof {
        match self {
            Target::Cpu(c) => &c.roof,
            Target::Gpu(g) => &g.roof,
        }
    }

    /// The throughput of a matrix op in `p`: the target's matrix unit for `p`, else its fp32 vector peak.
    pub fn matrix_peak(&self, p: MatrixPrecision) -> f64 {
        self.fast_matrix(p).unwrap_or(self.roof().fp32)
    }

    /// The throughput of a matrix unit for `p`, when the target has one that beats its fp32 vectors'
    /// FMAs for it.
    pub fn fast_matrix(&self, p: MatrixPrecision) -> Option<f64> {
        match (self, p) {
            (_, MatrixPrecision::F32) => None,
            (Target::Cpu(c), MatrixPrecision::Bf16) => c.bf16,
            (Target::Cpu(c), MatrixPrecision::I16) => c.i16_peak(),
            (Target::Cpu(_), _) => None,
            (Target::Gpu(g), MatrixPrecision::Tf32) => Some(g.tf32),
            (Target::Gpu(g), MatrixPrecision::F16) => Some(g.f16),
            (Target::Gpu(g), MatrixPrecision::Bf16) => Some(g.bf16),
            (Target::Gpu(_), MatrixPrecision::I16) => None,
        }
    }
}

/// What the roofline needs of any target: throughputs in FLOP/s, bandwidths in bytes/s, the fixed cost
/// of a kernel in seconds. CPU figures are for all the threads the code runs (per core times threads).
#[derive(Debug, Clone, PartialEq)]
pub struct Roof {
    /// Vector (SIMD / SIMT) fp32 throughput, used by every op that is not a matrix op.
    pub fp32: f64,
    /// Main-memory (DRAM / HBM) bandwidth.
    pub dram_bw: f64,
    /// Last-level cache bandwidth and capacity: values that fit are read at this rate by a later kernel.
    pub llc_bw: f64,
    pub llc_bytes: u64,
    /// Fixed cost of launching one kernel (CPU: a parallel-for dispatch; GPU: a stream launch).
    pub launch_s: f64,
    /// Where the figures came from, for the report.
    pub source: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.roof();
        write!(
            f,
            "{} ({:.1} GFLOP/s fp32, {:.1} GB/s",
            self.name(),
            r.fp32 / 1e9,
            r.dram_bw / 1e9
        )?;
        if let Some(p) = self.fast_matrix(MatrixPrecision::Bf16) {
            write!(f, ", {:.1} GFLOP/s bf16", p / 1e9)?;
        }
        write!(f, "; {})", r.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::Calibration;

    #[test]
    fn every_named_target_resolves_to_its_kind() {
        for name in TARGET_NAMES {
            let t = Target::named(name, 1).unwrap();
            assert_eq!(t.name(), *name);
            assert!(t.roof().fp32 > 0.0 && t.roof().dram_bw > 0.0, "{t}");
            assert_eq!(t.is_gpu(), name.starts_with("sm_"), "{t}");
            match &t {
                Target::Cpu(c) => assert!(c.lanes() == 8 || c.lanes() == 16, "{c:?}"),
                Target::Gpu(g) => assert!(g.ptx >= 70, "{g:?}"),
            }
        }
        assert!(Target::named("sm_75", 1).is_err());
        let zen4 = Target::named("znver4", 1).unwrap();
        let zen4 = zen4.cpu().unwrap();
        assert_eq!(
            (&zen4.model, zen4.lanes(), zen4.matrix()),
            (&CpuModel::Named("znver4".into()), 16, Some(MatrixUnit::Dot))
        );
        let spr = Target::named("sapphirerapids", 1).unwrap();
        assert_eq!(spr.cpu().unwrap().matrix(), Some(MatrixUnit::Amx));
        let v3 = Target::named("x86-64-v3", 1).unwrap();
        assert_eq!(
            (v3.cpu().unwrap().lanes(), v3.cpu().unwrap().matrix()),
            (8, None)
        );
        // The i16 dot product: vpdpwssd on Zen 4, vpmaddwd on zmm without VNNI, on ymm with AVX2.
        for (name, want) in [
            ("znver4", Some((true, 16))),
            ("x86-64-v4", Some((false, 16))),
            ("x86-64-v3", Some((false, 8))),
        ] {
            let t = Target::named(name, 1).unwrap();
            let d = t.cpu().unwrap().i16_dot().map(|d| (d.fused, d.lanes));
            assert_eq!(d, want, "{name}");
        }
    }

    #[test]
    fn cpu_peaks_scale_with_threads_and_gpus_do_not() {
        let one = Target::named("x86-64-v4", 1).unwrap();
        let four = Target::named("x86-64-v4", 4).unwrap();
        assert_eq!(four.roof().fp32, 4.0 * one.roof().fp32);
        assert_eq!(four.roof().dram_bw, 4.0 * one.roof().dram_bw);
        assert_eq!(four.cpu().unwrap().threads, 4);
        assert_eq!(
            Target::named("sm_80", 1).unwrap(),
            Target::named("sm_80", 8).unwrap()
        );
        // tf32 only counts when asked for; fp32 runs at the SIMT rate.
        let t = Target::named("sm_80", 1).unwrap();
        assert_eq!(t.matrix_peak(MatrixPrecision::F32), t.roof().fp32);
        assert_eq!(t.matrix_peak(MatrixPrecision::Tf32), 156e12);
    }

    #[test]
    fn a_corrupt_or_foreign_calibration_cache_is_ignored() {
        let dir = std::env::temp_dir().join(format!("mlopt-cal-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Only this test sets MLOPT_CACHE_DIR in this test binary.
        std::env::set_var("MLOPT_CACHE_DIR", &dir);
        let path = crate::calibrate::cache_path().unwrap();
        let features = crate::calibrate::host_features();
        let (fp32_max, bf16_max) = crate::calibrate::per_cycle_limits(&features);
        // Figures that pass the physical check on this CPU: half the peaks at 3 GHz.
        let good = crate::calibrate::Calibration {
            ghz: 3.0,
            fp32: fp32_max * 1.5e9,
            bf16: bf16_max * 1.5e9,
            bw_one: 1e10,
            bw_all: 2e10,
        };
        let confirmed = crate::calibrate::CONFIRMATIONS;
        crate::calibrate::store(&good, confirmed).unwrap();
        assert_eq!(crate::calibrate::load(), Some((good, confirmed)));
        assert_eq!(
            Target::named("host", 2).unwrap().roof().fp32,
            2.0 * good.fp32
        );
        assert!(Target::named("host", 1)
            .unwrap()
            .roof()
            .source
            .contains("host calibration cache"));
        // The host's L2 per core is read from the OS (on Linux), a named target's assumed.
        let l2 = Target::named("host", 1).unwrap().cpu().unwrap().l2_bytes;
        assert!((64 << 10..=1 << 30).contains(&l2), "host L2 {l2} bytes");
        assert_eq!(
            Target::named("x86-64-v4", 1)
                .unwrap()
                .cpu()
                .unwrap()
                .l2_bytes,
            crate::cpu::DEFAULT_L2_BYTES
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let replace = |key: &str, value: &str| -> String {
            text.lines()
                .map(|l| {
                    if l.starts_with(key) {
                        format!("{key} = {value}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect()
        };
        // Another CPU's file, another feature set, a truncated file, garbage, a figure that is not a number,
        // and a figure no core can reach are all ignored.
        for bad in [
            replace("cpu", "Some Other CPU"),
            replace("features", "not-this-cpu"),
            "mlopt-calibration 3\n".into(),
            replace("mlopt-calibration", "mlopt-calibration 2"),
            replace("confirmed", "-1"),
            "garbage".into(),
            replace("fp32", "NaN"),
            replace("fp32", "1e30"),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(crate::calibrate::load(), None, "{bad}");
        }
        // Figures a busy machine measures: within physics, but a third of a byte per cycle or a
        // twentieth of the FMA ports.
        for busy in [
            Calibration {
                bw_one: 1e9,
                bw_all: 1e9,
                ..good
            },
            Calibration {
                fp32: fp32_max * 0.15e9,
                ..good
            },
        ] {
            assert!(busy.check(&features).is_err(), "{busy:?}");
        }
        // A cache measured low but within the floors (this CPU reads more than 3.2 GB/s and runs
        // more FMAs than half its ports at 3 GHz) is spot-checked, found low, measured again, and the
        // target says so.
        let low = Calibration {
            bw_one: 3.2e9,
            bw_all: 3.2e9,
            ..good
        };
        crate::calibrate::store(&low, 0).unwrap();
        let t = Target::named("host", 1).unwrap();
        assert!(
            t.roof().source.contains("re-measured (the cached"),
            "{}",
            t.roof().source
        );
        let (again, n) = crate::calibrate::load().unwrap();
        assert!(again.bw_one > 1.25 * low.bw_one && n == 0, "{again:?}");
        // A cache the spot checks agree with (here: figures at the ports' limit, which no spot check
        // exceeds) is confirmed once per use until it is trusted without one.
        let high = Calibration {
            ghz: 6.0,
            fp32: fp32_max * 6e9,
            bf16: bf16_max * 6e9,
            bw_one: 1e11,
            bw_all: 2e11,
        };
        crate::calibrate::store(&high, 0).unwrap();
        for n in 1..=confirmed + 1 {
            assert!(Target::named("host", 1)
                .unwrap()
                .roof()
                .source
                .contains("host calibration cache"));
            assert_eq!(crate::calibrate::load(), Some((high, n.min(confirmed))));
        }
        // Back to the default before the folder goes, so the binary's other tests stop writing their
        // host caches into it (they left ~80 such folders in the temp directory).
        std::env::remove_var("MLOPT_CACHE_DIR");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
