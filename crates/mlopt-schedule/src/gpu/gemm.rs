//! GPU schedules for contractions (MatMul, Gemm, and Conv as an implicit GEMM): block tiles staged through
//! shared memory, and register tiles per thread, on tensor cores (`mma.sync`) or SIMT FMAs.
//!
//! `contraction.rs` recognises the algorithm form lowering writes (rows, columns, batch and K by which
//! operand reads each loop; the columns are those of the operand that reads the innermost loop, so the
//! output's contiguous axis is spread over neighbouring threads). An implicit-GEMM convolution is the
//! same shape: its rows are output channels (the weights), its columns the output positions, and its K
//! the input channels and window, with the padding test inside the operand.
//!
//! A block computes a BM x BN tile of one batch element. For each BK-slice of K, its threads copy the
//! A (BM x BK) and B (BK x BN) tiles into shared memory: by `cp.async` (16 bytes where every copy is
//! aligned, zero-filled where a test fails) when the operand is a plain global load of the tile's type,
//! else by loads and stores, neighbouring threads on neighbouring global elements, with the operand
//! expression (casts, padding) evaluated there. Two buffers alternate: each slice waits for its copies,
//! passes one barrier (which also ends the products of the slice before, whose buffer is refilled
//! next), starts the copies of the next slice and then multiplies. Then
//! - **tensor cores** (bf16/f16 operands, or f32 read as tf32 when the precision allows it): each warp
//!   owns MT x NT tiles of 16 x 8 and runs `mma.sync` on them (`ldmatrix` reads the fragments); its
//!   accumulators are the fragments' f32 registers.
//! - **SIMT**: each thread owns an RM x RN register tile (rows `ty + TY i`, columns `tx + TX j`) and
//!   updates it with FMAs in the original order of K, so fp32 results are bit-identical to the plain
//!   loop.
//!
//! The epilogue then runs once per output element on the thread that holds it. Tile sizes come from the
//! cost model (`mlopt_cost::gpu_tile`): waves of blocks over the SMs at the engine's peak against the
//! operands' traffic, within the limits on threads, shared memory and registers.

use super::gemm_build::{async_load, build, AsyncLoad};
use super::GpuSchedule;
use crate::contraction::Contraction;
use crate::error::Result;
use mlopt_cost::gpu_tile::{self, Tile};
use mlopt_kir::analysis::{coefficient, flat_index, for_each_load};
use mlopt_kir::{BinOp, Elem, Expr, Kernel, Space, Stmt, Var};

/// What multiplies: tensor cores on operands of one type, or SIMT FMAs on f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Engine {
    Mma(Elem),
    Simt,
}

impl Engine {
    /// The engine as the cost model sees it (`mlopt_cost::gpu_tile`: operand size and K per step).
    pub(crate) fn model(self) -> gpu_tile::Engine {
        match self {
            Engine::Mma(t) => gpu_tile::Engine::Mma {
                bytes: t.size(),
                k: mlopt_kir::warp_mma_k(t),
            },
            Engine::Simt => gpu_tile::Engine::Simt,
        }
    }
}

/// The K slice: two `mma.sync` steps, or 16 FMAs.
pub(crate) fn bk(e: Engine) -> u64 {
    e.model().bk()
}

/// Row padding of the shared tiles in elements (`gpu_tile::Engine::pad`).
pub(crate) fn pad(e: Engine) -> u64 {
    e.model().pad()
}

/// The registers tile `t` plans for with `copies` (the operands not copied by `cp.async` are staged by
/// plain loads).
pub(crate) fn registers(t: &Tile, e: Engine, copies: &[Option<AsyncLoad>; 2]) -> u64 {
    gpu_tile::registers(t, e.model(), [copies[0].is_none(), copies[1].is_none()])
}

/// The cost model's estimate of tile `t` for contraction `c` (`mlopt_cost::gpu_tile::estimate`), at the
/// engine's peak on the schedule's target.
pub(crate) fn estimate(
    c: &Contraction,
    t: &Tile,
    e: Engine,
    elem: Elem,
    copies: &[Option<AsyncLoad>; 2],
    s: &GpuSchedule,
) -> Option<gpu_tile::TileTime> {
    let x = gpu_tile::Extents {
        m: Contraction::extent(&c.rows),
        n: Contraction::extent(&c.cols),
        k: Contraction::extent(&c.red),
        batch: Contraction::extent(&c.batch),
    };
    let peak = match e {
        Engine::Mma(e) => s.matrix(e)?,
        Engine::Simt => s.target.roof.fp32,
    };
    let plain = [copies[0].is_none(), copies[1].is_none()];
    gpu_tile::estimate(
        s.target,
        x,
        t,
        e.model(),
        elem.size(),
        plain,
        s.register_margin,
        peak,
    )
}

/// The operand computed in a 16-bit type `t` when it is an f32 cast of `t` values (i32 for i16), through
/// selects and constants that `t` holds exactly: what tensor cores or a dot product can read without
/// rounding anything.
pub(crate) fn narrow(k: &Kernel, e: &Expr, t: Elem) -> Option<Expr> {
    // The type products of `t` are summed in: i32 for i16, f32 for the floats.
    let wide = if t == Elem::I16 { Elem::I32 } else { Elem::F32 };
    match e {
        Expr::Cast(w, x) if *w == wide && x.elem(k) == t => Some((**x).clone()),
        Expr::Select(c, x, y) => Some(Expr::select(
            (**c).clone(),
            narrow(k, x, t)?,
            narrow(k, y, t)?,
        )),
        Expr::Float(v, Elem::F32) if *v == 0.0 && wide == Elem::F32 => Some(Expr::Float(0.0, t)),
        Expr::Cast(Elem::I32, z) if wide == Elem::I32 && **z == Expr::Int(0) => {
            Some(Expr::cast(t, Expr::Int(0)))
        }
        _ => None,
    }
}

/// Whether `e`'s global loads move one element with `v` (so neighbouring threads should take
/// neighbouring values of `v`). An index clamped into the buffer (a padded convolution's window,
/// `max(min(x, hi), lo)`) counts as `x`: inside the clamp it moves as `x` does.
pub(crate) fn contiguous_in(k: &Kernel, e: &Expr, v: Var) -> bool {
    fn unclamped(e: &Expr) -> &Expr {
        match e {
            Expr::Binary(BinOp::Max | BinOp::Min, x, c) if matches!(**c, Expr::Int(_)) => {
                unclamped(x)
            }
            e => e,
        }
    }
    let mut yes = false;
    for_each_load(e, &mut |b, ix| {
        let ix: Vec<Expr> = ix.iter().map(|x| unclamped(x).clone()).collect();
        yes |=
            k.buffer(b).space == Space::Global && coefficient(&flat_index(k, b, &ix), v) == Some(1)
    });
    yes
}

/// Whether neighbouring threads staging `operand` should take neighbouring values of the loop `first`
/// rather than `second`: its global loads run through memory along `first` (the longer run where both
/// do), or along neither.
pub(crate) fn walk_first(
    k: &Kernel,
    operand: &Expr,
    first: Option<&(Var, u64)>,
    second: Option<&(Var, u64)>,
) -> bool {
    let run = |v: Option<&(Var, u64)>| {
        v.filter(|(v, _)| contiguous_in(k, operand, *v))
            .map_or(0, |(_, e)| *e)
    };
    run(first) >= run(second).max(1) || run(second) == 0
}

/// Where element `el` of a `rows x cols` tile filled `lanes` elements at a time lands, (row, column):
/// neighbouring elements along a row (`along_cols`), or down a column.
pub(crate) fn tile_position(
    el: Expr,
    (rows, cols): (u64, u64),
    lanes: u64,
    along_cols: bool,
) -> (Expr, Expr) {
    if along_cols {
        let per_row = cols / lanes;
        (
            Expr::div(el.clone(), int(per_row)),
            Expr::mul(Expr::rem(el, int(per_row)), int(lanes)),
        )
    } else {
        (Expr::rem(el.clone(), int(rows)), Expr::div(el, int(rows)))
    }
}

pub(crate) fn int(v: u64) -> Expr {
    Expr::int(v as i64)
}

/// The conjunction of `conds`; None when there are none.
pub(crate) fn all(conds: Vec<Expr>) -> Option<Expr> {
    conds.into_iter().reduce(|a, b| Expr::bin(BinOp::And, a, b))
}

pub(crate) fn guarded(conds: Vec<Expr>, then: Vec<Stmt>) -> Vec<Stmt> {
    match all(conds) {
        Some(cond) => vec![Stmt::If { cond, then }],
        None => then,
    }
}

/// The fastest way to run contraction `c` as a tiled GEMM: (engine, the tile's element type, the
/// operands in that type, the tile, the staging copies).
pub(crate) type Plan = (Engine, Elem, Expr, Expr, Tile, [Option<AsyncLoad>; 2]);

/// The fastest plan for `c` by the cost model's estimate, with its estimate in seconds; None when `c` is
/// too small to tile or no tile fits.
pub(crate) fn plan(k: &Kernel, c: &Contraction, s: &GpuSchedule) -> Option<(f64, Plan)> {
    let (m, n, kk) = (
        Contraction::extent(&c.rows),
        Contraction::extent(&c.cols),
        Contraction::extent(&c.red),
    );
    if m < 8 || n < 8 || kk < 8 {
        return None;
    }
    // Tensor cores when both operands are 16-bit values of one type (or tf32 is allowed), else SIMT.
    let sixteen = [Elem::BF16, Elem::F16]
        .into_iter()
        .find_map(|t| Some((t, narrow(k, &c.a, t)?, narrow(k, &c.b, t)?)));
    let mut options: Vec<(Engine, Elem, Expr, Expr)> = Vec::new();
    if let Some((t, a, b)) = sixteen {
        options.push((Engine::Mma(t), t, a, b));
    }
    if s.matrix(Elem::F32).is_some() {
        options.push((Engine::Mma(Elem::F32), Elem::F32, c.a.clone(), c.b.clone()));
    }
    options.push((Engine::Simt, Elem::F32, c.a.clone(), c.b.clone()));
    // The fastest (engine, operands, tile, staging) by the estimate.
    let mut best: Option<(gpu_tile::TileTime, Plan)> = None;
    // Operands are staged by cp.async where they are plain loads of the tile's type.
    let all: Vec<(Var, u64)> = [&c.rows, &c.cols, &c.batch, &c.red]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    for (e, elem, a, b) in options {
        let tiles = Tile::candidates(e.model());
        for t in tiles {
            let (bm, bn, bk, threads) = (
                t.bm(e.model()),
                t.bn(e.model()),
                bk(e),
                t.threads(e.model()),
            );
            let copies = [
                async_load(k, &a, elem, &c.red, &all, bm, bk, threads),
                async_load(k, &b, elem, &c.cols, &all, bk, bn, threads),
            ];
            if let Some(time) = estimate(c, t, e, elem, &copies, s) {
                if best.as_ref().is_none_or(|x| time < x.0) {
                    best = Some((time, (e, elem, a.clone(), b.clone(), *t, copies)));
                }
            }
        }
    }
    best.map(|(t, p)| (t.seconds, p))
}

/// Schedules the launch as a tiled GEMM when `c` is a contraction big enough to tile; returns the new
/// body, or None to leave it to the other schedules.
pub(crate) fn gemm(k: &mut Kernel, c: &Contraction, s: &GpuSchedule) -> Result<Option<Vec<Stmt>>> {
    let Some((_, (e, elem, a, b, t, copies))) = plan(k, c, s) else {
        return Ok(None);
    };
    let planned = registers(&t, e, &copies) + s.register_margin;
    Ok(Some(build(k, c, e, elem, &a, &b, &t, &copies, planned)))
}

#[cfg(test)]
mod tests {
    use crate::gpu::{schedule_nest, GpuSchedule};
    use mlopt_kir::{parse_kernel, run_kernel, Elem, GpuEngine, Kernel, ScheduleStep};

    /// out[h, i, j] = max(sum_r a[h, i, r] b[h, r, j] + 1, 0), as lowering writes it.
    fn matmul(batch: u64, m: u64, n: u64, k: u64, t: Elem) -> Kernel {
        let text = format!(
            "kernel @mm(%out: f32[{batch},{m},{n}], %a: {t}[{batch},{m},{k}], %b: {t}[{batch},{k},{n}]) {{
  local %acc: f32[]
  serial %h in 0..{batch} {{
    serial %i in 0..{m} {{
      serial %j in 0..{n} {{
        %acc[] = 0.0f32
        serial %r in 0..{k} {{
          %acc[] = fma(cast<f32>(%a[%h, %i, %r]), cast<f32>(%b[%h, %r, %j]), %acc[])
        }}
        %out[%h, %i, %j] = max((%acc[] + 1.0f32), 0.0f32)
      }}
    }}
  }}
}}
"
        );
        parse_kernel(&text).unwrap()
    }

    fn encode(t: Elem, x: f32) -> Vec<u8> {
        match t {
            Elem::BF16 => mlopt_kir::interp::bf16_from_f32(x).to_le_bytes().to_vec(),
            Elem::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
            _ => x.to_le_bytes().to_vec(),
        }
    }

    fn run(k: &Kernel, regions: &[Vec<u8>]) -> Vec<f32> {
        let mut r = regions.to_vec();
        run_kernel(k, &mut r, &[(0, 0), (1, 0), (2, 0)])
            .unwrap_or_else(|e| panic!("{e}\n{}", mlopt_kir::print::kernel(k)));
        r[0].chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The engine and tile of a kernel's `gpu.gemm` step.
    fn gemm(k: &Kernel) -> Option<(GpuEngine, [u64; 3])> {
        k.schedule.iter().find_map(|s| match s {
            ScheduleStep::GpuGemm { engine, tile, .. } => Some((*engine, *tile)),
            _ => None,
        })
    }

    /// Shapes that divide no tile (guards on every side), batches, and each engine: the tiled GEMM in
    /// the emulator against the plain loops in the interpreter. SIMT keeps the order of K, so fp32 is
    /// bit-exact; tensor cores sum in another order (and tf32 rounds the operands).
    #[test]
    fn tiled_gemms_match_the_plain_loops() {
        // (batch, m, n, k, operand type, tf32 allowed, the engine chosen, tolerance relative to the largest output)
        type Case = (u64, u64, u64, u64, Elem, bool, GpuEngine, f32);
        let cases: &[Case] = &[
            (1, 37, 45, 29, Elem::F32, false, GpuEngine::Simt, 0.0),
            (2, 9, 70, 40, Elem::F32, false, GpuEngine::Simt, 0.0),
            (
                1,
                37,
                45,
                29,
                Elem::BF16,
                false,
                GpuEngine::Mma(Elem::BF16),
                1e-5,
            ),
            (
                2,
                33,
                40,
                48,
                Elem::F16,
                false,
                GpuEngine::Mma(Elem::F16),
                1e-5,
            ),
            (1, 20, 24, 20, Elem::F32, true, GpuEngine::Tf32, 2e-3),
        ];
        for &(batch, m, n, k, t, tf32, engine, tol) in cases {
            let plain = matmul(batch, m, n, k, t);
            let s = GpuSchedule {
                tf32,
                ..crate::gpu::sm80()
            };
            let mut tiled = plain.clone();
            schedule_nest(&mut tiled, &s).unwrap();
            mlopt_kir::verify(&tiled)
                .unwrap_or_else(|e| panic!("{e:?}\n{}", mlopt_kir::print::kernel(&tiled)));
            let what = mlopt_kir::step::schedule_text(&tiled.schedule);
            assert_eq!(
                gemm(&tiled).map(|(e, _)| e),
                Some(engine),
                "{batch}x{m}x{n}x{k} {t}: {what}"
            );
            let value = |i: u64| ((i * 37 % 101) as f32 - 50.0) / 32.0;
            let a: Vec<u8> = (0..batch * m * k)
                .flat_map(|i| encode(t, value(i)))
                .collect();
            let b: Vec<u8> = (0..batch * k * n)
                .flat_map(|i| encode(t, value(i + 7)))
                .collect();
            let regions = vec![vec![0u8; (batch * m * n * 4) as usize], a, b];
            let (want, got) = (run(&plain, &regions), run(&tiled, &regions));
            let scale = want.iter().fold(1.0f32, |x, y| x.max(y.abs()));
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (w - g).abs() <= tol * scale,
                    "{batch}x{m}x{n}x{k} {t} ({what}): element {i}: {g} != {w}"
                );
            }
        }
    }

    /// The roofline picks small tiles when the grid is too small to fill the GPU, and big ones (more
    /// reuse per byte) when there are blocks enough.
    #[test]
    fn tile_sizes_follow_the_problem() {
        for (m, n, k, tile) in [(8, 64, 64, [16, 32, 32]), (4096, 4096, 4096, [128, 64, 32])] {
            let mut tiled = matmul(1, m, n, k, Elem::BF16);
            schedule_nest(&mut tiled, &crate::gpu::sm80()).unwrap();
            let what = mlopt_kir::step::schedule_text(&tiled.schedule);
            assert_eq!(
                gemm(&tiled).map(|(_, t)| t),
                Some(tile),
                "{m}x{n}x{k}: {what}"
            );
        }
    }
}
