//! The host target: ISA features detected at run time, peaks measured by a short calibration (the clock,
//! an FMA throughput loop, a `vdpbf16ps` loop and a streaming read), checked against what the instruction
//! mix can physically do, and cached per CPU model and feature set so that compiling stays fast.
//!
//! The first use of `host` on a CPU measures it (three rounds, each figure the best of them, about two
//! seconds) and writes the cache; `mlopt calibrate` measures again and overwrites it. A machine that was
//! busy while it measured gives figures too low, which no physical bound catches (a read bandwidth of
//! 5.8 GB/s cached where the core reaches 26): so the next uses of a fresh cache each run a quick spot
//! check (about 0.1 s), and a spot figure a quarter above the cached one has the whole calibration
//! measured again, which the target's source line says. After `CONFIRMATIONS` spot checks that agree,
//! the cache is trusted as it is. `MLOPT_CACHE_DIR` overrides where the cache lives (default
//! `$XDG_CACHE_HOME/mlopt` or `~/.cache/mlopt`); each CPU gets its own file, so a home folder shared by
//! machines of different kinds keeps one calibration each.

use crate::cpu::{x86_64_v3, x86_64_v4, CpuModel, CpuTarget};
use crate::error::{Result, TargetError};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Held while this process measures: two measurements at once (two threads of one program, or two
/// tests of one test binary, asking for the host target) would each take cores from the other and
/// read as a busy machine.
static MEASURING: Mutex<()> = Mutex::new(());

fn measuring() -> MutexGuard<'static, ()> {
    // A measurement that panicked left nothing half-written behind the lock.
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Peaks measured on this machine, per core unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The core clock while the FMA loop runs, GHz (timed by a chain of dependent integer adds).
    pub ghz: f64,
    /// fp32 FMA throughput of one core, FLOP/s.
    pub fp32: f64,
    /// bf16 dot-product throughput of one core (`vdpbf16ps`), FLOP/s; 0 when the ISA lacks it.
    pub bf16: f64,
    /// Streaming read bandwidth of one core and of all cores together, bytes/s.
    pub bw_one: f64,
    pub bw_all: f64,
}

/// The most any x86-64 core is clocked at, GHz: a measured clock above it means the timing is broken.
const MAX_GHZ: f64 = 6.5;

/// What the instruction mix can do per cycle on a core with these features: (fp32 FLOP/cycle of two
/// FMA ports at the widest vector, bf16 FLOP/cycle of two `vdpbf16ps` ports). No x86 core issues more
/// than two vector FMAs per cycle; one `vdpbf16ps` does two multiply-adds per f32 lane.
pub fn per_cycle_limits(features: &[String]) -> (f64, f64) {
    let has = |f: &str| features.iter().any(|x| x == f);
    let lanes = if has("avx512f") { 16.0 } else { 8.0 };
    let fp32 = 2.0 * lanes * 2.0;
    let bf16 = if has("avx512bf16") {
        2.0 * lanes * 4.0
    } else {
        0.0
    };
    (fp32, bf16)
}

impl Calibration {
    /// Checks every figure against physics: a clock between 0.5 and 6.5 GHz, FLOP per cycle within what
    /// two vector ports can issue, bandwidths positive and finite. A figure outside means the measurement
    /// loop was optimised away or mistimed; it is an error, never a peak the cost model trusts.
    pub fn check(&self, features: &[String]) -> Result<()> {
        let bad = |what: String| Err(TargetError::Calibration(what));
        let finite = [self.ghz, self.fp32, self.bf16, self.bw_one, self.bw_all]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0);
        if !finite {
            return bad(format!(
                "a figure is not a finite non-negative number: {self:?}"
            ));
        }
        if !(0.5..=MAX_GHZ).contains(&self.ghz) {
            return bad(format!(
                "the clock measured {:.2} GHz, outside 0.5..{MAX_GHZ} GHz",
                self.ghz
            ));
        }
        let (fp32_max, bf16_max) = per_cycle_limits(features);
        // 25% of slack for the clock moving between the loops (a shared machine can take the core away
        // while one of them runs); a loop that was optimised away is off by orders of magnitude.
        let per_cycle = |flops: f64| flops / (self.ghz * 1e9);
        if per_cycle(self.fp32) > fp32_max * 1.25 || self.fp32 < 1e9 {
            return bad(format!(
                "fp32 FMA measured {:.1} GFLOP/s = {:.1} FLOP/cycle at {:.2} GHz; two FMA ports do at most {fp32_max}",
                self.fp32 / 1e9,
                per_cycle(self.fp32),
                self.ghz
            ));
        }
        if per_cycle(self.bf16) > bf16_max * 1.25 || (bf16_max > 0.0 && self.bf16 < 1e9) {
            return bad(format!(
                "bf16 dot measured {:.1} GFLOP/s = {:.1} FLOP/cycle at {:.2} GHz; two vdpbf16ps ports do at most {bf16_max}",
                self.bf16 / 1e9,
                per_cycle(self.bf16),
                self.ghz
            ));
        }
        if self.bw_one < 1e8 || self.bw_all < 1e8 || self.bw_one > 1e12 || self.bw_all > 1e13 {
            return bad(format!(
                "read bandwidth measured {:.1} GB/s (one core), {:.1} GB/s (all)",
                self.bw_one / 1e9,
                self.bw_all / 1e9
            ));
        }
        // Floors for the CPU's class: a core issues at least a quarter of the FMAs its ports can (Zen 4
        // runs 512-bit FMAs at half rate) and an eighth of the dot products (Sapphire Rapids issues one
        // `vdpbf16ps` every other cycle: 32 of 128 FLOP per cycle, 30 measured), streams at least a
        // byte per cycle, and all cores together read at least three quarters of what one does. Below,
        // the machine was busy while it measured.
        if per_cycle(self.fp32) < fp32_max / 4.0 || per_cycle(self.bf16) < bf16_max / 8.0 {
            return bad(format!(
                "fp32 FMA {:.1} and bf16 dot {:.1} FLOP/cycle at {:.2} GHz: below a quarter of the ports' {fp32_max} or an eighth of {bf16_max} (a busy machine)",
                per_cycle(self.fp32),
                per_cycle(self.bf16),
                self.ghz
            ));
        }
        if self.bw_one < self.ghz * 1e9 || self.bw_all < 0.75 * self.bw_one {
            return bad(format!(
                "read bandwidth {:.1} GB/s (one core), {:.1} GB/s (all): below a byte per cycle at {:.2} GHz, or all cores below one (a busy machine)",
                self.bw_one / 1e9,
                self.bw_all / 1e9,
                self.ghz
            ));
        }
        Ok(())
    }
}

const CACHE_VERSION: &str = "mlopt-calibration 3";

/// Spot checks a cache passes before it is trusted without one.
pub const CONFIRMATIONS: u32 = 3;

/// This CPU's model name (CPUID's brand string), e.g. "AMD EPYC 9R45" or "Intel(R) Xeon(R) Platinum 8488C".
pub fn cpu_model() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        if __cpuid(0x8000_0000).eax >= 0x8000_0004 {
            let mut bytes = Vec::with_capacity(48);
            for leaf in 0x8000_0002u32..=0x8000_0004 {
                let r = __cpuid(leaf);
                for w in [r.eax, r.ebx, r.ecx, r.edx] {
                    bytes.extend_from_slice(&w.to_le_bytes());
                }
            }
            let s: String = String::from_utf8_lossy(&bytes)
                .chars()
                .filter(|c| !c.is_control())
                .collect();
            return s.split_whitespace().collect::<Vec<_>>().join(" ");
        }
    }
    "unknown CPU".into()
}

/// FNV-1a, for a short stable file name per CPU.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The folder of mlopt's caches (calibration, tuned tiles).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MLOPT_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("mlopt"))
}

/// The cache file of this CPU (model and feature set) for this cache format: two mlopt builds of
/// different formats on one machine (an A/B benchmark) would otherwise each measure again on every
/// compile, overwriting the other's file.
pub fn cache_path() -> Option<PathBuf> {
    let key = format!(
        "{}|{}|{CACHE_VERSION}",
        cpu_model(),
        host_features().join(",")
    );
    Some(cache_dir()?.join(format!("host-calibration-{:016x}.txt", fnv(&key))))
}

/// Reads the cache: its figures and how many spot checks have confirmed them. `None` when missing,
/// unreadable, of another version, written for another CPU, or holding figures that fail the physical
/// check.
pub fn load() -> Option<(Calibration, u32)> {
    let text = std::fs::read_to_string(cache_path()?).ok()?;
    let mut lines = text.lines();
    if lines.next()? != CACHE_VERSION {
        return None;
    }
    let mut get = |key: &str| -> Option<String> {
        lines
            .next()?
            .strip_prefix(key)?
            .strip_prefix(" = ")
            .map(str::to_string)
    };
    if get("cpu")? != cpu_model() || get("features")? != host_features().join(",") {
        return None;
    }
    let mut num = |key: &str| get(key).and_then(|s| s.parse::<f64>().ok());
    let c = Calibration {
        ghz: num("ghz")?,
        fp32: num("fp32")?,
        bf16: num("bf16")?,
        bw_one: num("bw_one")?,
        bw_all: num("bw_all")?,
    };
    let confirmed = get("confirmed")?.parse::<u32>().ok()?;
    c.check(&host_features()).ok().map(|_| (c, confirmed))
}

/// Writes the cache with `confirmed` spot checks behind it (through a temporary file and a rename, so
/// concurrent first uses never read half a file), creating its directory.
pub fn store(c: &Calibration, confirmed: u32) -> std::io::Result<PathBuf> {
    let path = cache_path()
        .ok_or_else(|| std::io::Error::other("no cache directory: set MLOPT_CACHE_DIR or HOME"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = format!(
        "{CACHE_VERSION}\ncpu = {}\nfeatures = {}\nghz = {}\nfp32 = {}\nbf16 = {}\nbw_one = {}\nbw_all = {}\nconfirmed = {confirmed}\n",
        cpu_model(),
        host_features().join(","),
        c.ghz,
        c.fp32,
        c.bf16,
        c.bw_one,
        c.bw_all
    );
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The ISA features of this CPU that code generation cares about, in LLVM's spelling.
pub fn host_features() -> Vec<String> {
    let mut f = vec![];
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! detect {
            ($($name:tt => $llvm:literal),* $(,)?) => { $( if std::arch::is_x86_feature_detected!($name) { f.push($llvm.to_string()); } )* };
        }
        detect!(
            "avx" => "avx", "avx2" => "avx2", "fma" => "fma", "f16c" => "f16c", "bmi1" => "bmi1", "bmi2" => "bmi2",
            "lzcnt" => "lzcnt", "movbe" => "movbe", "avx512f" => "avx512f", "avx512bw" => "avx512bw",
            "avx512cd" => "avx512cd", "avx512dq" => "avx512dq", "avx512vl" => "avx512vl",
            "avx512bf16" => "avx512bf16", "avx512fp16" => "avx512fp16", "avx512vnni" => "avx512vnni",
            "avx512bitalg" => "avx512bitalg", "avx512vbmi" => "avx512vbmi", "avx512vbmi2" => "avx512vbmi2",
            "avx512vpopcntdq" => "avx512vpopcntdq",
        );
        // AMX is not in `is_x86_feature_detected!` on stable Rust: CPUID leaf 7 says it (EDX bit 24
        // tile, bit 22 bf16, bit 25 int8); the OS grants the tile state per process (see the runtime).
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        if edx & (1 << 24) != 0 && edx & (1 << 22) != 0 {
            f.push("amx-tile".to_string());
            f.push("amx-bf16".to_string());
            if edx & (1 << 25) != 0 {
                f.push("amx-int8".to_string());
            }
        }
    }
    f
}

/// A core's L2 in bytes as Linux reports it for this machine (`1024K` on this Zen 4); None when it
/// cannot be read.
pub fn host_l2_bytes() -> Option<u64> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index2");
    if std::fs::read_to_string(dir.join("level")).ok()?.trim() != "2" {
        return None;
    }
    let size = std::fs::read_to_string(dir.join("size")).ok()?;
    let size = size.trim();
    let (digits, unit) = match (size.strip_suffix('K'), size.strip_suffix('M')) {
        (Some(d), _) => (d, 1 << 10),
        (_, Some(d)) => (d, 1 << 20),
        _ => (size, 1),
    };
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(unit)
        .filter(|b| (64 << 10..=1 << 30).contains(b))
}

/// This CPU's calibration and where it came from: the cache (spot-checked until confirmed), or a
/// measurement now (stored for next time). `Err` says why no trustworthy figure could be had.
pub fn calibration() -> std::result::Result<(Calibration, String), String> {
    let why = match load() {
        Some((c, confirmed)) if confirmed >= CONFIRMATIONS => {
            return Ok((c, "host calibration cache".into()))
        }
        Some((c, confirmed)) => match spot_check(&c) {
            None => {
                // (A cache that cannot be written only costs a spot check per compile.)
                let _ = store(&c, confirmed + 1);
                return Ok((c, "host calibration cache".into()));
            }
            Some(low) => format!("host calibration re-measured ({low})"),
        },
        None => "host calibration, measured on first use".into(),
    };
    let c = measure().map_err(|e| e.to_string())?;
    // A cache that cannot be written only costs a measurement per compile.
    let _ = store(&c, 0);
    Ok((c, why))
}

/// A quick measurement of one core's fp32 peak and read bandwidth against the cached `c`: what was
/// cached too low (by more than a quarter), if anything. Only a higher spot figure counts: a busy
/// machine now measures low, which says nothing about the cache.
pub fn spot_check(c: &Calibration) -> Option<String> {
    let _alone = measuring();
    let fp32 = loops::fp32_peak_over(loops::ITERS / 10);
    let bw = read_bandwidth(1, 2);
    let low = |what: &str, cached: f64, now: f64, unit: &str| {
        (now > 1.25 * cached).then(|| {
            format!(
                "the cached {what} {:.1} {unit} was below a spot check's {:.1}",
                cached / 1e9,
                now / 1e9
            )
        })
    };
    low("fp32 peak", c.fp32, fp32, "GFLOP/s")
        .or_else(|| low("read bandwidth", c.bw_one, bw, "GB/s"))
}

/// The host target for `threads` threads: features detected now, peaks from this CPU's calibration
/// (measured on first use), or the x86-64-v4/v3 defaults when no trustworthy measurement could be made.
pub fn host(threads: u32) -> CpuTarget {
    let features = host_features();
    let has = |f: &str| features.iter().any(|x| x == f);
    let mut t = if has("avx512f") {
        x86_64_v4(threads)
    } else {
        x86_64_v3(threads)
    };
    let defaults = t.name.clone();
    t.name = "host".into();
    t.model = CpuModel::Host;
    t.l2_bytes = host_l2_bytes().unwrap_or(t.l2_bytes);
    let n = threads as f64;
    match calibration() {
        Ok((c, source)) => {
            t.clock_mhz = (c.ghz * 1e3).round() as u32;
            t.roof.fp32 = c.fp32 * n;
            t.bf16 = (c.bf16 > 0.0).then_some(c.bf16 * n);
            t.roof.dram_bw = (c.bw_one * n).min(c.bw_all.max(c.bw_one));
            t.roof.source = format!("{source}: {}", cpu_model());
        }
        Err(why) => {
            if has("avx512bf16") {
                // Uncalibrated, assume `vdpbf16ps` at parity with the FMAs.
                t.bf16 = Some(t.roof.fp32);
            }
            t.roof.source = format!(
                "{defaults} defaults ({}: calibration failed: {why})",
                cpu_model()
            );
        }
    }
    if has("amx-bf16") {
        // bf16 contractions run on the tiles (mlopt-llvm's amx.rs), not on `vdpbf16ps`.
        t.bf16 = Some(crate::cpu::AMX_BF16_PER_CORE * n);
    }
    t.features = features;
    t
}

/// Measures the host (about two seconds) and checks the figures against physics: three rounds, each
/// figure the best any round reached (a shared machine can take the core away in the middle of a loop,
/// which only ever lowers a figure), then the check.
pub fn measure() -> Result<Calibration> {
    let _alone = measuring();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut best: Option<Calibration> = None;
    for _ in 0..3 {
        let ghz = loops::clock_ghz();
        let (fp32, bf16) = (loops::fp32_peak_over(loops::ITERS), loops::bf16_peak());
        // The clock again: the larger of the two is the one the FMA loops ran at.
        let ghz = ghz.max(loops::clock_ghz());
        let c = Calibration {
            ghz,
            fp32,
            bf16,
            bw_one: read_bandwidth(1, 5),
            bw_all: read_bandwidth(threads, 5),
        };
        best = Some(match best {
            None => c,
            Some(b) => Calibration {
                ghz: b.ghz.max(c.ghz),
                fp32: b.fp32.max(c.fp32),
                bf16: b.bf16.max(c.bf16),
                bw_one: b.bw_one.max(c.bw_one),
                bw_all: b.bw_all.max(c.bw_all),
            },
        });
    }
    let c = best.ok_or_else(|| TargetError::Calibration("no measurement".into()))?;
    c.check(&host_features())?;
    Ok(c)
}

/// Bytes per second that `threads` threads reach reading disjoint parts of a 256 MiB buffer (larger
/// than any L3; best of `reps`).
fn read_bandwidth(threads: usize, reps: usize) -> f64 {
    const LEN: usize = 64 << 20; // f32s
    let data: Vec<f32> = (0..LEN).map(|i| (i % 7) as f32).collect();
    let chunk = LEN.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = data
                .chunks(chunk)
                .map(|c| s.spawn(move || sum16(c)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(total);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (LEN * 4) as f64 / best
}

/// A sum with 16 independent lanes, which the compiler vectorises without reassociating.
fn sum16(c: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for block in c.chunks_exact(16) {
        for (a, x) in acc.iter_mut().zip(block) {
            *a += x;
        }
    }
    acc.iter().sum()
}

#[allow(unsafe_code)]
mod loops {
    //! The measurement loops, in inline assembly so that no optimiser can fold, hoist or drop them (the
    //! intrinsics version of the bf16 loop was folded away on Zen 5 and timed at 768,000,000 GFLOP/s).
    //! Twelve independent accumulators cover a 4-6 cycle FMA latency on two ports.
    use std::time::Instant;

    pub const ITERS: u64 = 10_000_000;

    /// Seconds of the best of five runs of `f`.
    fn best(f: impl Fn()) -> f64 {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// The clock: eight dependent one-cycle adds per iteration. Register operands, not immediates:
    /// Sapphire Rapids' renamer folds chains of `add reg, imm`, which timed its clock at 12 GHz.
    pub fn clock_ghz() -> f64 {
        #[cfg(target_arch = "x86_64")]
        {
            // Warm up so the clock has ramped before it is timed.
            x86::adds(ITERS);
            return (ITERS * 8) as f64 / best(|| x86::adds(ITERS)) / 1e9;
        }
        #[allow(unreachable_code)]
        0.0
    }

    /// One core's fp32 FMA throughput over loops of `iters` rounds.
    pub fn fp32_peak_over(iters: u64) -> f64 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature the function is compiled for was detected just above.
                return iters as f64 * 12.0 * 16.0 * 2.0 / best(|| unsafe { x86::fma512(iters) });
            }
            if std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("avx")
            {
                // SAFETY: as above.
                return iters as f64 * 12.0 * 8.0 * 2.0 / best(|| unsafe { x86::fma256(iters) });
            }
        }
        0.0
    }

    pub fn bf16_peak() -> f64 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512bf16") {
            // SAFETY: as above. One vdpbf16ps does 16 lanes x 2 multiply-adds = 64 FLOP.
            return ITERS as f64 * 12.0 * 64.0 / best(|| unsafe { x86::dpbf16(ITERS) });
        }
        0.0
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::asm;

        pub fn adds(iters: u64) {
            // SAFETY: register arithmetic only; no memory, no stack.
            unsafe {
                asm!(
                    "2:",
                    "add {x}, {one}", "add {x}, {one}", "add {x}, {one}", "add {x}, {one}",
                    "add {x}, {one}", "add {x}, {one}", "add {x}, {one}", "add {x}, {one}",
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) iters => _,
                    x = inout(reg) 0u64 => _,
                    one = in(reg) 1u64,
                    options(nomem, nostack),
                );
            }
        }

        macro_rules! twelve {
            ($op:literal, $a:literal, $b:literal) => {
                concat!(
                    $op, " zmm0, ", $a, ", ", $b, "\n", $op, " zmm1, ", $a, ", ", $b, "\n", $op,
                    " zmm2, ", $a, ", ", $b, "\n", $op, " zmm3, ", $a, ", ", $b, "\n", $op,
                    " zmm4, ", $a, ", ", $b, "\n", $op, " zmm5, ", $a, ", ", $b, "\n", $op,
                    " zmm6, ", $a, ", ", $b, "\n", $op, " zmm7, ", $a, ", ", $b, "\n", $op,
                    " zmm8, ", $a, ", ", $b, "\n", $op, " zmm9, ", $a, ", ", $b, "\n", $op,
                    " zmm10, ", $a, ", ", $b, "\n", $op, " zmm11, ", $a, ", ", $b, "\n",
                )
            };
        }

        /// Zeroes zmm0-13 first: zero operands keep every lane out of denormals.
        macro_rules! zero512 {
            () => {
                "vpxord zmm0, zmm0, zmm0\nvmovaps zmm1, zmm0\nvmovaps zmm2, zmm0\nvmovaps zmm3, zmm0\nvmovaps zmm4, zmm0\nvmovaps zmm5, zmm0\nvmovaps zmm6, zmm0\nvmovaps zmm7, zmm0\nvmovaps zmm8, zmm0\nvmovaps zmm9, zmm0\nvmovaps zmm10, zmm0\nvmovaps zmm11, zmm0\nvmovaps zmm12, zmm0\nvmovaps zmm13, zmm0"
            };
        }

        /// `iters` rounds of `op` on twelve independent zmm accumulators (zmm0-11), from zmm12 and zmm13,
        /// every register zeroed first.
        macro_rules! zmm_loop {
            ($iters:expr, $op:literal) => {
                asm!(
                    zero512!(),
                    "2:",
                    twelve!($op, "zmm12", "zmm13"),
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) $iters => _,
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _,
                    out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _,
                    options(nomem, nostack),
                )
            };
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn fma512(iters: u64) {
            zmm_loop!(iters, "vfmadd231ps");
        }

        #[target_feature(enable = "avx,fma")]
        pub unsafe fn fma256(iters: u64) {
            asm!(
                "vxorps ymm0, ymm0, ymm0", "vmovaps ymm1, ymm0", "vmovaps ymm2, ymm0", "vmovaps ymm3, ymm0",
                "vmovaps ymm4, ymm0", "vmovaps ymm5, ymm0", "vmovaps ymm6, ymm0", "vmovaps ymm7, ymm0",
                "vmovaps ymm8, ymm0", "vmovaps ymm9, ymm0", "vmovaps ymm10, ymm0", "vmovaps ymm11, ymm0",
                "vmovaps ymm12, ymm0", "vmovaps ymm13, ymm0",
                "2:",
                "vfmadd231ps ymm0, ymm12, ymm13", "vfmadd231ps ymm1, ymm12, ymm13", "vfmadd231ps ymm2, ymm12, ymm13",
                "vfmadd231ps ymm3, ymm12, ymm13", "vfmadd231ps ymm4, ymm12, ymm13", "vfmadd231ps ymm5, ymm12, ymm13",
                "vfmadd231ps ymm6, ymm12, ymm13", "vfmadd231ps ymm7, ymm12, ymm13", "vfmadd231ps ymm8, ymm12, ymm13",
                "vfmadd231ps ymm9, ymm12, ymm13", "vfmadd231ps ymm10, ymm12, ymm13", "vfmadd231ps ymm11, ymm12, ymm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) iters => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _,
                out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _,
                options(nomem, nostack),
            );
        }

        #[target_feature(enable = "avx512f,avx512bf16")]
        pub unsafe fn dpbf16(iters: u64) {
            zmm_loop!(iters, "vdpbf16ps");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| s.to_string()).collect()
    }

    /// The figures the intrinsics loop once produced on Zen 5 (bf16 768,000,000 GFLOP/s) fail the check, and
    /// so do a clock off the scale and FMAs faster than two ports; a real Zen 5 measurement passes.
    #[test]
    fn physically_impossible_figures_are_rejected() {
        let f = features(&["avx2", "fma", "avx512f", "avx512bf16"]);
        let zen5 = Calibration {
            ghz: 4.4,
            fp32: 281e9,
            bf16: 540e9,
            bw_one: 30e9,
            bw_all: 50e9,
        };
        zen5.check(&f).unwrap();
        for bad in [
            Calibration {
                bf16: 7.68e17,
                ..zen5
            },
            Calibration { ghz: 40.0, ..zen5 },
            Calibration {
                fp32: 400e9,
                ..zen5
            },
            Calibration {
                fp32: f64::NAN,
                ..zen5
            },
            Calibration { bf16: 0.0, ..zen5 },
            Calibration {
                bw_all: 0.0,
                ..zen5
            },
        ] {
            assert!(bad.check(&f).is_err(), "{bad:?}");
        }
        // Sapphire Rapids as measured here: `vdpbf16ps` at half the FMA rate (one port, every other
        // cycle) is a real figure, not a busy machine.
        let spr = features(&["avx2", "fma", "avx512f", "avx512bf16", "amx-bf16"]);
        Calibration {
            ghz: 3.04,
            fp32: 180e9,
            bf16: 90e9,
            bw_one: 12e9,
            bw_all: 20e9,
        }
        .check(&spr)
        .unwrap();
        // Without AVX512-BF16, a bf16 figure of 0 is right, and 256-bit FMAs allow half the FLOP per cycle.
        let v3 = features(&["avx2", "fma"]);
        Calibration {
            ghz: 3.0,
            fp32: 90e9,
            bf16: 0.0,
            bw_one: 10e9,
            bw_all: 20e9,
        }
        .check(&v3)
        .unwrap();
        assert!(Calibration {
            ghz: 3.0,
            fp32: 190e9,
            bf16: 0.0,
            bw_one: 10e9,
            bw_all: 20e9
        }
        .check(&v3)
        .is_err());
    }

    /// The loops of this machine give figures that pass the check (the clock, FMAs and dot products are
    /// really executed: the check above rejects a loop that was folded away).
    #[test]
    fn this_machine_measures_physical_figures() {
        let c = measure().unwrap();
        let (fp32_max, _) = per_cycle_limits(&host_features());
        assert!(c.fp32 / (c.ghz * 1e9) > fp32_max / 8.0, "{c:?}");
    }
}
