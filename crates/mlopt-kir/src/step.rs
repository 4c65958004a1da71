//! A kernel's schedule as data: the closed set of steps that rearrange an algorithm (loop transforms)
//! and the strategies lowering and scheduling chose for it (register tiles, packing, matrix blocks,
//! GPU mappings). `Display` writes a step as the kernel dump's `; schedule:` header shows it and
//! `FromStr` reads it back, so a dump round-trips; callers match on the variants, never on the text.

use crate::ir::{Elem, LoopKind};
use std::fmt;

/// What a GPU contraction runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEngine {
    /// Plain FMAs, one thread per output element of the tile.
    Simt,
    /// `mma.sync` tensor-core instructions on f32 data rounded to tf32.
    Tf32,
    /// `mma.sync` on this element type (bf16, f16).
    Mma(Elem),
}

/// One step of a kernel's schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleStep {
    /// `split(i,4)`: loop `var` became `var.o` x `var.i` with `factor` inner iterations.
    Split { var: String, factor: u64 },
    /// `peel(j,16)`: loop `var` runs a multiple of `factor`, the rest in a loop after it.
    Peel { var: String, factor: u64 },
    /// `partition(c,256+288)`: loop `var` runs as one loop per range between the points `at`, in each of
    /// which the tests on it have one answer (`partition.rs`).
    Partition { var: String, at: Vec<u64> },
    /// `rfactor(r,16)`: the fold over loop `var` keeps `lanes` partial results, one per vector lane,
    /// combined at the end (`rfactor.rs`).
    Rfactor { var: String, lanes: u32 },
    /// `reorder(a,b)`: loops `outer` and `inner` swapped.
    Reorder { outer: String, inner: String },
    /// `vector<16>(j)`, `parallel(i)`, `gpu.block.x(b)`...: how loop `var` runs.
    Kind { var: String, kind: LoopKind },
    /// `tile(6x64 for 128x3072x768@16)`: an M x N x K contraction in `mr` x `nr` register tiles, for a
    /// target of `lanes` f32 lanes.
    Tile {
        mr: u64,
        nr: u64,
        m: u64,
        n: u64,
        k: u64,
        lanes: u32,
    },
    /// `pack(b)`: each column panel of the tiled contraction's B is copied once before its tiles read it.
    PackB,
    /// `pack(a)`: the tiled contraction's A is copied once, before any tile, into row tiles [M / mr, K,
    /// mr], so a tile's broadcasts at each step of K are `mr` consecutive floats.
    PackA,
    /// `swap(a,b)`: the tiled contraction runs transposed (C^T = B^T A^T): its operands exchanged, the
    /// original rows its columns, stored lane by lane.
    Swap,
    /// `kblock(2048)`: the tiled contraction's reduction runs in blocks of `k` (a panel of B over all of
    /// K would not fit in L2), its sums kept between blocks.
    KBlock { k: u64 },
    /// `pad(xphase5,2)`: a window reads local `buf`, a padded copy of its input split into `phases`
    /// along its rows (1: the plain padded copy), instead of guarded, clamped loads.
    Pad { buf: String, phases: u64 },
    /// `flat(xpad5,18)`: a window reads its padded plane `buf` as one row, rows of `row` elements end
    /// to end, so short output rows run in full vectors: each vector covers consecutive positions of
    /// the flattened plane, and the positions past an output row's end are computed and dropped. After
    /// `pad(buf,P)` the plane is a strided window's input in P phase planes, each read so.
    Flat { buf: String, row: u64 },
    /// `transpose(in2)`: the 2-D weight parameter `buf` is stored transposed, so the vector loops that
    /// read it down its columns read it contiguously.
    Transpose { buf: String },
    /// `matrix(mma<16x16x32> blocks for 64x96x128)`: a bf16 contraction in matrix-unit blocks.
    Matrix {
        mb: u64,
        nb: u64,
        kb: u64,
        m: u64,
        n: u64,
        k: u64,
    },
    /// `winograd(2x2,3x3)`: a 3x3 convolution by Winograd F(2x2, 3x3).
    Winograd,
    /// `gpu.empty`: a kernel with nothing to compute.
    GpuEmpty,
    /// `gpu.elementwise(N in GxT)` or `gpu.elementwise(N in GxT, vector<W>)`.
    GpuElementwise {
        n: u64,
        grid: u64,
        threads: u64,
        vector: Option<u32>,
    },
    /// `gpu.rows(R x T threads)`: one block per row (softmax, normalisations).
    GpuRows { rows: u64, threads: u64 },
    /// `gpu.gemm(B x MxNxK, ENGINE, tile BMxBNxBK, T threads, N blocks, R registers planned)`.
    GpuGemm {
        batch: u64,
        m: u64,
        n: u64,
        k: u64,
        engine: GpuEngine,
        tile: [u64; 3],
        threads: u64,
        blocks: u64,
        registers: u32,
    },
    /// `gpu.splitk(8 parts of 4608)`: the contraction's K runs as `parts` slices in parallel blocks,
    /// each writing a partial sum to scratch, and a second launch adds them and applies the epilogue.
    GpuSplitK { parts: u64, k: u64 },
    /// `gpu.attention(B x RxK, d D, dv DV, ENGINE, BM queries x BN keys, T threads, N blocks)`.
    GpuAttention {
        batch: u64,
        rows: u64,
        keys: u64,
        d: u64,
        dv: u64,
        engine: GpuEngine,
        queries: u64,
        keys_per_block: u64,
        threads: u64,
        blocks: u64,
    },
}

impl fmt::Display for GpuEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuEngine::Simt => f.write_str("simt"),
            GpuEngine::Tf32 => f.write_str("mma.sync tf32"),
            GpuEngine::Mma(t) => write!(f, "mma.sync {t}"),
        }
    }
}

impl std::str::FromStr for GpuEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "simt" => Ok(GpuEngine::Simt),
            "mma.sync tf32" => Ok(GpuEngine::Tf32),
            other => match other.strip_prefix("mma.sync ").and_then(Elem::from_name) {
                Some(t) => Ok(GpuEngine::Mma(t)),
                None => Err(format!("unknown GPU engine `{other}`")),
            },
        }
    }
}

impl fmt::Display for ScheduleStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleStep::Split { var, factor } => write!(f, "split({var},{factor})"),
            ScheduleStep::Peel { var, factor } => write!(f, "peel({var},{factor})"),
            ScheduleStep::Rfactor { var, lanes } => write!(f, "rfactor({var},{lanes})"),
            ScheduleStep::Partition { var, at } => {
                let at: Vec<String> = at.iter().map(u64::to_string).collect();
                write!(f, "partition({var},{})", at.join("+"))
            }
            ScheduleStep::Reorder { outer, inner } => write!(f, "reorder({outer},{inner})"),
            ScheduleStep::Kind { var, kind } => write!(f, "{}({var})", crate::print::loop_kind(*kind)),
            ScheduleStep::Tile { mr, nr, m, n, k, lanes } => write!(f, "tile({mr}x{nr} for {m}x{n}x{k}@{lanes})"),
            ScheduleStep::PackB => f.write_str("pack(b)"),
            ScheduleStep::PackA => f.write_str("pack(a)"),
            ScheduleStep::Swap => f.write_str("swap(a,b)"),
            ScheduleStep::KBlock { k } => write!(f, "kblock({k})"),
            ScheduleStep::Pad { buf, phases } => write!(f, "pad({buf},{phases})"),
            ScheduleStep::Flat { buf, row } => write!(f, "flat({buf},{row})"),
            ScheduleStep::Transpose { buf } => write!(f, "transpose({buf})"),
            ScheduleStep::Matrix { mb, nb, kb, m, n, k } => write!(f, "matrix(mma<{mb}x{nb}x{kb}> blocks for {m}x{n}x{k})"),
            ScheduleStep::Winograd => f.write_str("winograd(2x2,3x3)"),
            ScheduleStep::GpuEmpty => f.write_str("gpu.empty"),
            ScheduleStep::GpuElementwise { n, grid, threads, vector: None } => write!(f, "gpu.elementwise({n} in {grid}x{threads})"),
            ScheduleStep::GpuElementwise { n, grid, threads, vector: Some(w) } => write!(f, "gpu.elementwise({n} in {grid}x{threads}, vector<{w}>)"),
            ScheduleStep::GpuRows { rows, threads } => write!(f, "gpu.rows({rows} x {threads} threads)"),
            ScheduleStep::GpuGemm { batch, m, n, k, engine, tile: [bm, bn, bk], threads, blocks, registers } => {
                write!(f, "gpu.gemm({batch} x {m}x{n}x{k}, {engine}, tile {bm}x{bn}x{bk}, {threads} threads, {blocks} blocks, {registers} registers planned)")
            }
            ScheduleStep::GpuSplitK { parts, k } => write!(f, "gpu.splitk({parts} parts of {k})"),
            ScheduleStep::GpuAttention { batch, rows, keys, d, dv, engine, queries, keys_per_block, threads, blocks } => write!(
                f,
                "gpu.attention({batch} x {rows}x{keys}, d {d}, dv {dv}, {engine}, {queries} queries x {keys_per_block} keys, {threads} threads, {blocks} blocks)"
            ),
        }
    }
}

/// The unsigned integers in `s`, in order (`6x64 for 128x3072x768@16` -> 6, 64, 128, 3072, 768, 16).
fn ints(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// Exactly `N` integers from `s`.
fn exactly<const N: usize>(s: &str) -> Result<[u64; N], String> {
    let v = ints(s);
    v.clone()
        .try_into()
        .map_err(|_| format!("expected {N} numbers in `{s}`, found {}", v.len()))
}

fn narrow(v: u64) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{v} is out of range"))
}

/// A loop kind as the kernel text writes it (`vector<16>`, `gpu.thread.x`).
fn loop_kind(s: &str) -> Option<LoopKind> {
    let axis = |c: &str| {
        ["x", "y", "z"]
            .iter()
            .position(|a| *a == c)
            .map(|a| a as u8)
    };
    Some(match s {
        "serial" => LoopKind::Serial,
        "parallel" => LoopKind::Parallel,
        "unrolled" => LoopKind::Unrolled,
        _ => {
            if let Some(w) = s.strip_prefix("vector<").and_then(|r| r.strip_suffix('>')) {
                LoopKind::Vector(w.parse().ok()?)
            } else if let Some(a) = s.strip_prefix("gpu.block.") {
                LoopKind::GpuBlock(axis(a)?)
            } else {
                LoopKind::GpuThread(axis(s.strip_prefix("gpu.thread.")?)?)
            }
        }
    })
}

impl std::str::FromStr for ScheduleStep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "gpu.empty" {
            return Ok(ScheduleStep::GpuEmpty);
        }
        let (name, args) = s
            .split_once('(')
            .and_then(|(n, r)| Some((n, r.strip_suffix(')')?)))
            .ok_or_else(|| format!("schedule step `{s}`: expected name(...)"))?;
        let parts: Vec<&str> = args.split(", ").collect();
        let pair = || {
            args.split_once(',')
                .ok_or_else(|| format!("schedule step `{s}`: expected two arguments"))
        };
        let factor = |f: &str| {
            f.parse::<u64>()
                .map_err(|_| format!("schedule step `{s}`: bad factor"))
        };
        Ok(match name {
            "split" => {
                let (var, f) = pair()?;
                ScheduleStep::Split {
                    var: var.into(),
                    factor: factor(f)?,
                }
            }
            "peel" => {
                let (var, f) = pair()?;
                ScheduleStep::Peel {
                    var: var.into(),
                    factor: factor(f)?,
                }
            }
            "partition" => {
                let (var, at) = pair()?;
                ScheduleStep::Partition {
                    var: var.into(),
                    at: at.split('+').map(factor).collect::<Result<_, _>>()?,
                }
            }
            "rfactor" => {
                let (var, lanes) = pair()?;
                ScheduleStep::Rfactor {
                    var: var.into(),
                    lanes: narrow(factor(lanes)?)?,
                }
            }
            "reorder" => {
                let (outer, inner) = pair()?;
                ScheduleStep::Reorder {
                    outer: outer.into(),
                    inner: inner.into(),
                }
            }
            "tile" => {
                let [mr, nr, m, n, k, lanes] = exactly(args)?;
                ScheduleStep::Tile {
                    mr,
                    nr,
                    m,
                    n,
                    k,
                    lanes: narrow(lanes)?,
                }
            }
            "pack" if args == "b" => ScheduleStep::PackB,
            "pack" if args == "a" => ScheduleStep::PackA,
            "swap" if args == "a,b" => ScheduleStep::Swap,
            "kblock" => ScheduleStep::KBlock { k: factor(args)? },
            "pad" => {
                let (buf, phases) = pair()?;
                ScheduleStep::Pad {
                    buf: buf.into(),
                    phases: factor(phases)?,
                }
            }
            "flat" => {
                let (buf, row) = pair()?;
                ScheduleStep::Flat {
                    buf: buf.into(),
                    row: factor(row)?,
                }
            }
            "transpose" if !args.is_empty() && !args.contains(',') => {
                ScheduleStep::Transpose { buf: args.into() }
            }
            "matrix" => {
                let [mb, nb, kb, m, n, k] = exactly(args)?;
                ScheduleStep::Matrix {
                    mb,
                    nb,
                    kb,
                    m,
                    n,
                    k,
                }
            }
            "winograd" if args == "2x2,3x3" => ScheduleStep::Winograd,
            "gpu.elementwise" => match parts[..] {
                [a] => {
                    let [n, grid, threads] = exactly(a)?;
                    ScheduleStep::GpuElementwise {
                        n,
                        grid,
                        threads,
                        vector: None,
                    }
                }
                [a, w] => {
                    let [n, grid, threads] = exactly(a)?;
                    let [w] = exactly(w)?;
                    ScheduleStep::GpuElementwise {
                        n,
                        grid,
                        threads,
                        vector: Some(narrow(w)?),
                    }
                }
                _ => return Err(format!("schedule step `{s}`: bad arguments")),
            },
            "gpu.rows" => {
                let [rows, threads] = exactly(args)?;
                ScheduleStep::GpuRows { rows, threads }
            }
            "gpu.gemm" => match parts[..] {
                [shape, engine, tile, threads, blocks, registers] => {
                    let [batch, m, n, k] = exactly(shape)?;
                    let [threads] = exactly(threads)?;
                    let [blocks] = exactly(blocks)?;
                    let [registers] = exactly(registers)?;
                    ScheduleStep::GpuGemm {
                        batch,
                        m,
                        n,
                        k,
                        engine: engine.parse()?,
                        tile: exactly(tile)?,
                        threads,
                        blocks,
                        registers: narrow(registers)?,
                    }
                }
                _ => return Err(format!("schedule step `{s}`: bad arguments")),
            },
            "gpu.splitk" => {
                let [parts, k] = exactly(args)?;
                ScheduleStep::GpuSplitK { parts, k }
            }
            "gpu.attention" => match parts[..] {
                [shape, d, dv, engine, block, threads, blocks] => {
                    let [batch, rows, keys] = exactly(shape)?;
                    let ([d], [dv], [queries, keys_per_block]) =
                        (exactly(d)?, exactly(dv)?, exactly(block)?);
                    let ([threads], [blocks]) = (exactly(threads)?, exactly(blocks)?);
                    ScheduleStep::GpuAttention {
                        batch,
                        rows,
                        keys,
                        d,
                        dv,
                        engine: engine.parse()?,
                        queries,
                        keys_per_block,
                        threads,
                        blocks,
                    }
                }
                _ => return Err(format!("schedule step `{s}`: bad arguments")),
            },
            kind => match loop_kind(kind) {
                Some(kind) if !args.is_empty() => ScheduleStep::Kind {
                    var: args.into(),
                    kind,
                },
                _ => return Err(format!("unknown schedule step `{s}`")),
            },
        })
    }
}

/// Splits a `; schedule:` header into its steps' texts: spaces inside parentheses belong to the step.
pub fn split_steps(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, None);
    for (i, c) in line.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if c.is_whitespace() && depth == 0 => {
                if let Some(s) = start.take() {
                    out.push(&line[s..i]);
                }
                continue;
            }
            _ => {}
        }
        start.get_or_insert(i);
    }
    if let Some(s) = start {
        out.push(&line[s..]);
    }
    out
}

/// A schedule as one line: the steps' texts separated by spaces.
pub fn schedule_text(steps: &[ScheduleStep]) -> String {
    steps
        .iter()
        .map(ScheduleStep::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of step, as text: each parses to a step that prints the same text.
    const STEPS: &[&str] = &[
        "split(i,4)",
        "peel(j.i,16)",
        "partition(c,256+288)",
        "rfactor(r,16)",
        "reorder(i.o,i.i)",
        "vector<16>(j)",
        "parallel(b5)",
        "unrolled(ii)",
        "gpu.block.x(gb)",
        "gpu.thread.y(t)",
        "tile(6x64 for 128x3072x768@16)",
        "pack(b)",
        "pack(a)",
        "swap(a,b)",
        "transpose(in2)",
        "matrix(mma<16x16x32> blocks for 64x96x128)",
        "winograd(2x2,3x3)",
        "gpu.empty",
        "gpu.elementwise(1024 in 4x256)",
        "gpu.elementwise(1024 in 1x256, vector<4>)",
        "kblock(2048)",
        "pad(xphase5,2)",
        "flat(xpad5,18)",
        "gpu.rows(128 x 256 threads)",
        "gpu.gemm(1 x 128x128x64, mma.sync bf16, tile 64x64x32, 128 threads, 4 blocks, 96 registers planned)",
        "gpu.gemm(2 x 7x9x5, simt, tile 16x16x8, 64 threads, 2 blocks, 40 registers planned)",
        "gpu.splitk(8 parts of 4608)",
        "gpu.attention(4 x 128x128, d 64, dv 64, mma.sync tf32, 64 queries x 64 keys, 128 threads, 8 blocks)",
    ];

    #[test]
    fn steps_round_trip() {
        for text in STEPS {
            let step: ScheduleStep = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(step.to_string(), *text);
        }
        let line = STEPS.join(" ");
        assert_eq!(split_steps(&line), STEPS);
    }

    #[test]
    fn bad_steps_are_errors() {
        for text in [
            "",
            "tile(6x64)",
            "frobnicate(i)",
            "split(i)",
            "vector<x>(j)",
            "gpu.gemm(1 x 2x3x4, warp, tile 1x1x1, 1 threads, 1 blocks, 9 registers planned)",
            "pack(c)",
            "swap(b,a)",
        ] {
            assert!(text.parse::<ScheduleStep>().is_err(), "{text}");
        }
    }
}
