//! The host target: ISA features detected at run time, peaks measured by a short calibration (an FMA
//! throughput loop and a streaming read), cached in a small text file so that compiling stays fast.
//!
//! Without a cache the host takes the x86-64-v4 (AVX-512) or x86-64-v3 defaults of `target.rs`, scaled by
//! the thread count. `mlopt calibrate` runs the measurement and writes the cache; `MLOPT_CACHE_DIR`
//! overrides where it lives (default `$XDG_CACHE_HOME/mlopt` or `~/.cache/mlopt`).

use crate::target::{cpu_v3, cpu_v4, Target};
use std::path::PathBuf;
use std::time::Instant;

/// Peaks measured on this machine, per core unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// fp32 FMA throughput of one core, FLOP/s.
    pub fp32: f64,
    /// bf16 dot-product throughput of one core (`vdpbf16ps`), FLOP/s; 0 when the ISA lacks it.
    pub bf16: f64,
    /// Streaming read bandwidth of one core and of all cores together, bytes/s.
    pub bw_one: f64,
    pub bw_all: f64,
}

const CACHE_VERSION: &str = "mlopt-calibration 1";

/// The cache file's path.
pub fn cache_path() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MLOPT_CACHE_DIR") {
        return Some(PathBuf::from(d).join("host-calibration.txt"));
    }
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("mlopt").join("host-calibration.txt"))
}

/// Reads the cache; `None` when missing, unreadable, of another version or written for other features.
pub fn load() -> Option<Calibration> {
    let text = std::fs::read_to_string(cache_path()?).ok()?;
    let mut lines = text.lines();
    if lines.next()? != CACHE_VERSION {
        return None;
    }
    let mut get = |key: &str| -> Option<String> { lines.next()?.strip_prefix(key)?.strip_prefix(" = ").map(str::to_string) };
    let features = get("features")?;
    if features != host_features().join(",") {
        return None;
    }
    let num = |s: Option<String>| s.and_then(|s| s.parse::<f64>().ok()).filter(|v| v.is_finite() && *v >= 0.0);
    Some(Calibration { fp32: num(get("fp32"))?, bf16: num(get("bf16"))?, bw_one: num(get("bw_one"))?, bw_all: num(get("bw_all"))? })
}

/// Writes the cache, creating its directory.
pub fn store(c: &Calibration) -> std::io::Result<PathBuf> {
    let path = cache_path().ok_or_else(|| std::io::Error::other("no cache directory: set MLOPT_CACHE_DIR or HOME"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = format!(
        "{CACHE_VERSION}\nfeatures = {}\nfp32 = {}\nbf16 = {}\nbw_one = {}\nbw_all = {}\n",
        host_features().join(","),
        c.fp32,
        c.bf16,
        c.bw_one,
        c.bw_all
    );
    std::fs::write(&path, text)?;
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
        );
        // AMX is not in `is_x86_feature_detected!` on stable Rust: CPUID leaf 7 says it (EDX bit 24
        // tile, bit 22 bf16); the OS grants the tile state per process (see the runtime).
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        if edx & (1 << 24) != 0 && edx & (1 << 22) != 0 {
            f.push("amx-tile".to_string());
            f.push("amx-bf16".to_string());
        }
    }
    f
}

/// bf16 matrix throughput of one core on AMX tiles, FLOP/s: a loop of independent `tdpbf16ps` on
/// 16x16x32 tiles measured 1.50 TFLOP/s on this machine's Sapphire Rapids core (2026-11-21; `calibrate`
/// does not measure it: that needs the tile state, which mlopt-cost does not request).
const AMX_BF16_PER_CORE: f64 = 1.5e12;

/// The host target for `threads` threads: features detected now, peaks from the cache or the defaults.
pub fn host(threads: u32) -> Target {
    let features = host_features();
    let has = |f: &str| features.iter().any(|x| x == f);
    let mut t = if has("avx512f") { cpu_v4(threads) } else { cpu_v3(threads) };
    t.name = "host".into();
    let n = threads as f64;
    if has("avx512bf16") {
        // `vdpbf16ps` does twice the FLOPs of an fp32 FMA per instruction, but issues on fewer ports on
        // some cores: on this machine's Sapphire Rapids it measured 0.5x the fp32 rate. Uncalibrated, assume
        // parity; `mlopt calibrate` measures it.
        t.bf16_matrix = Some(t.fp32);
    }
    match load() {
        Some(c) => {
            t.fp32 = c.fp32 * n;
            t.bf16_matrix = (c.bf16 > 0.0).then_some(c.bf16 * n);
            t.dram_bw = (c.bw_one * n).min(c.bw_all.max(c.bw_one));
            t.source = "host calibration cache".into();
        }
        None => t.source = format!("{} defaults (host not calibrated: run `mlopt calibrate`)", if has("avx512f") { "x86-64-v4" } else { "x86-64-v3" }),
    }
    if has("amx-bf16") {
        // bf16 contractions run on the tiles (mlopt-lower's amx.rs), not on `vdpbf16ps`.
        t.bf16_matrix = Some(AMX_BF16_PER_CORE * n);
    }
    t.features = features;
    t
}

/// Measures the host: about a second in all.
pub fn measure() -> Calibration {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    Calibration { fp32: fma::fp32_peak(), bf16: fma::bf16_peak(), bw_one: read_bandwidth(1), bw_all: read_bandwidth(threads) }
}

/// Bytes per second that `threads` threads reach reading disjoint parts of a 256 MiB buffer (best of 5).
fn read_bandwidth(threads: usize) -> f64 {
    const LEN: usize = 64 << 20; // f32s
    let data: Vec<f32> = (0..LEN).map(|i| (i % 7) as f32).collect();
    let chunk = LEN.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = data.chunks(chunk).map(|c| s.spawn(move || sum16(c))).collect();
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
mod fma {
    //! Throughput loops over independent FMA chains (enough of them to cover the FMA latency on two ports).
    use std::time::Instant;

    const ITERS: u64 = 20_000_000;

    pub fn fp32_peak() -> f64 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature the function is compiled for was detected just above.
                return time(|| unsafe { x86::fma512(ITERS) }, ITERS as f64 * 12.0 * 16.0 * 2.0);
            }
            if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: as above.
                return time(|| unsafe { x86::fma256(ITERS) }, ITERS as f64 * 12.0 * 8.0 * 2.0);
            }
        }
        crate::target::cpu_v3(1).fp32 / 4.0
    }

    pub fn bf16_peak() -> f64 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512bf16") {
            // SAFETY: as above. One vdpbf16ps does 32 multiply-adds = 64 FLOP.
            return time(|| unsafe { x86::dpbf16(ITERS) }, ITERS as f64 * 12.0 * 64.0);
        }
        0.0
    }

    /// FLOP/s of the best of three runs of `f`.
    fn time(f: impl Fn() -> f32, flops: f64) -> f64 {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            std::hint::black_box(f());
            best = best.min(t.elapsed().as_secs_f64());
        }
        flops / best
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx512f")]
        pub fn fma512(iters: u64) -> f32 {
            let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut acc = [_mm512_set1_ps(1.0); 12];
            for _ in 0..iters {
                for x in acc.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, a, b);
                }
            }
            acc.iter().map(|x| _mm512_reduce_add_ps(*x)).sum()
        }

        #[target_feature(enable = "avx,fma")]
        pub fn fma256(iters: u64) -> f32 {
            let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(1.0); 12];
            for _ in 0..iters {
                for x in acc.iter_mut() {
                    *x = _mm256_fmadd_ps(*x, a, b);
                }
            }
            let mut out = [0f32; 8];
            let mut s = 0.0;
            for x in acc {
                // SAFETY: `out` holds 8 f32s, the unaligned store writes exactly 8.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), x) };
                s += out.iter().sum::<f32>();
            }
            s
        }

        #[target_feature(enable = "avx512f,avx512bf16")]
        pub fn dpbf16(iters: u64) -> f32 {
            let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5), _mm512_set1_ps(0.25));
            let mut acc = [_mm512_set1_ps(0.0); 12];
            for _ in 0..iters {
                for x in acc.iter_mut() {
                    *x = _mm512_dpbf16_ps(*x, a, a);
                }
            }
            acc.iter().map(|x| _mm512_reduce_add_ps(*x)).sum()
        }
    }
}
