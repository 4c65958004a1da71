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

use super::{delinear, lt, subst_all, GpuSchedule};
use crate::contraction::Contraction;
use crate::error::Result;
use mlopt_cost::gpu_tile::{self, Tile};
use mlopt_kir::analysis::{coefficient, flat_index, for_each_load, offset};
use mlopt_kir::{BinOp, Block, BufId, Elem, Expr, Kernel, LoopKind, Space, Stmt, Var};

/// What multiplies: tensor cores on operands of one type, or SIMT FMAs on f32.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Engine {
    Mma(Elem),
    Simt,
}

impl Engine {
    /// The engine as the cost model sees it (`mlopt_cost::gpu_tile`: operand size and K per step).
    fn model(self) -> gpu_tile::Engine {
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
fn bk(e: Engine) -> u64 {
    e.model().bk()
}

/// Row padding of the shared tiles in elements (`gpu_tile::Engine::pad`).
fn pad(e: Engine) -> u64 {
    e.model().pad()
}

/// The registers tile `t` plans for with `copies` (the operands not copied by `cp.async` are staged by
/// plain loads).
fn registers(t: &Tile, e: Engine, copies: &[Option<AsyncLoad>; 2]) -> u64 {
    gpu_tile::registers(t, e.model(), [copies[0].is_none(), copies[1].is_none()])
}

/// The cost model's estimate of tile `t` for contraction `c` (`mlopt_cost::gpu_tile::estimate`), at the
/// engine's peak on the schedule's target.
fn estimate(
    c: &Contraction,
    t: &Tile,
    e: Engine,
    elem: Elem,
    copies: &[Option<AsyncLoad>; 2],
    s: &GpuSchedule,
) -> Option<f64> {
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

/// The operand computed in a 16-bit type `t` when it is an f32 cast of `t` values (through selects and
/// constants that `t` holds exactly): what tensor cores can read without rounding anything.
pub(crate) fn narrow(k: &Kernel, e: &Expr, t: Elem) -> Option<Expr> {
    match e {
        Expr::Cast(Elem::F32, x) if x.elem(k) == t => Some((**x).clone()),
        Expr::Select(c, x, y) => Some(Expr::select(
            (**c).clone(),
            narrow(k, x, t)?,
            narrow(k, y, t)?,
        )),
        Expr::Float(v, Elem::F32) if *v == 0.0 => Some(Expr::Float(0.0, t)),
        _ => None,
    }
}

/// Whether `e`'s global loads move one element with `v` (so neighbouring threads should take
/// neighbouring values of `v`). An index clamped into the buffer (a padded convolution's window,
/// `max(min(x, hi), lo)`) counts as `x`: inside the clamp it moves as `x` does.
fn contiguous_in(k: &Kernel, e: &Expr, v: Var) -> bool {
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

/// An operand staged with `cp.async`: the global load it is, where it is valid (zeros elsewhere: a
/// convolution's padding), and how many consecutive elements one copy moves along the tile's last axis.
#[derive(Debug, Clone)]
struct AsyncLoad {
    buf: BufId,
    index: Vec<Expr>,
    valid: Option<Expr>,
    lanes: u64,
    /// For copies of several elements, the source's flat position as an affine function.
    affine: Option<Affine>,
}

/// A flat position `offset + sum of c v over outer + (position along the tile's axis) % run`: the loops
/// outside the contiguous run with their coefficients, and the run's joint extent.
#[derive(Debug, Clone)]
struct Affine {
    offset: i64,
    outer: Vec<(Var, i64)>,
    run: u64,
}

/// `operand` as an asynchronous copy into a `rows x cols` tile of `elem` by `threads` threads, when it
/// is a plain global load of `elem` (or such a load where a test holds and 0 elsewhere). The widest copy
/// (16 bytes, then 8, then 4) whose addresses are all aligned is chosen. Wider than one element needs
/// the innermost loops of the tile's last axis (`along`, innermost last; loops of extent 1 are 0)
/// contiguous in memory over a joint extent the width divides, as does the tile's width (so a copy
/// never straddles the outer loops, and the bounds and the test hold for all of it or none), and every
/// other loop of `all` moving the address by whole copies.
fn async_load(
    k: &Kernel,
    operand: &Expr,
    elem: Elem,
    along: &[(Var, u64)],
    all: &[(Var, u64)],
    rows: u64,
    cols: u64,
    threads: u64,
) -> Option<AsyncLoad> {
    let (load, valid) = match operand {
        Expr::Select(c, x, z) if matches!(**z, Expr::Float(v, _) if v == 0.0) => {
            (&**x, Some((**c).clone()))
        }
        x => (x, None),
    };
    let Expr::Load(buf, index) = load else {
        return None;
    };
    if k.buffer(*buf).space != Space::Global || k.buffer(*buf).elem != elem {
        return None;
    }
    let flat = flat_index(k, *buf, index);
    let size = elem.size();
    [16 / size, 8 / size, 4 / size]
        .into_iter()
        .filter(|l| *l >= 1)
        .find_map(|lanes| {
            if !cols.is_multiple_of(lanes) || !(rows * cols / lanes).is_multiple_of(threads) {
                return None;
            }
            if lanes == 1 {
                return Some(AsyncLoad {
                    buf: *buf,
                    index: index.clone(),
                    valid: valid.clone(),
                    lanes,
                    affine: None,
                });
            }
            // The innermost loops of `along` that run through memory together, and their joint extent.
            let moving: Vec<(Var, u64)> = along.iter().filter(|(_, e)| *e > 1).copied().collect();
            let (mut stride, mut run) = (1i64, 0);
            for &(v, e) in moving.iter().rev() {
                if coefficient(&flat, v) != Some(stride) {
                    break;
                }
                stride *= e as i64;
                run += 1;
            }
            let contiguous = &moving[moving.len() - run..];
            let outer: Vec<(Var, i64)> = all
                .iter()
                .filter(|(w, e)| *e > 1 && !contiguous.iter().any(|(v, _)| v == w))
                .map(|(w, _)| Some((*w, coefficient(&flat, *w)?)))
                .collect::<Option<_>>()?;
            let off = offset(&flat)?;
            let whole = |c: i64| c % lanes as i64 == 0;
            let ok = run > 0
                && whole(stride)
                && whole(off)
                && outer.iter().all(|(_, c)| whole(*c))
                && valid
                    .as_ref()
                    .is_none_or(|c| contiguous.iter().all(|(v, _)| !c.uses(*v)));
            ok.then(|| AsyncLoad {
                buf: *buf,
                index: index.clone(),
                valid: valid.clone(),
                lanes,
                affine: Some(Affine {
                    offset: off,
                    outer,
                    run: stride as u64,
                }),
            })
        })
}

pub(crate) fn int(v: u64) -> Expr {
    Expr::int(v as i64)
}

/// The conjunction of `conds`; None when there are none.
fn all(conds: Vec<Expr>) -> Option<Expr> {
    conds.into_iter().reduce(|a, b| Expr::bin(BinOp::And, a, b))
}

pub(crate) fn guarded(conds: Vec<Expr>, then: Vec<Stmt>) -> Vec<Stmt> {
    match all(conds) {
        Some(cond) => vec![Stmt::If { cond, then }],
        None => then,
    }
}

/// Schedules the launch as a tiled GEMM when `inner` is a contraction big enough to tile; returns the
/// new body, or None to leave it to the other schedules.
pub(crate) fn gemm(k: &mut Kernel, c: &Contraction, s: &GpuSchedule) -> Result<Option<Vec<Stmt>>> {
    let (m, n, kk) = (
        Contraction::extent(&c.rows),
        Contraction::extent(&c.cols),
        Contraction::extent(&c.red),
    );
    if m < 8 || n < 8 || kk < 8 {
        return Ok(None);
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
    type Plan = (Engine, Elem, Expr, Expr, Tile, [Option<AsyncLoad>; 2]);
    let mut best: Option<(f64, Plan)> = None;
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
    let Some((_, (e, elem, a, b, t, copies))) = best else {
        return Ok(None);
    };
    let planned = registers(&t, e, &copies) + s.register_margin;
    Ok(Some(build(k, c, e, elem, &a, &b, &t, &copies, planned)))
}

/// Writes the tiled GEMM (see the module comment).
#[allow(clippy::too_many_arguments)]
fn build(
    k: &mut Kernel,
    c: &Contraction,
    e: Engine,
    elem: Elem,
    a: &Expr,
    b: &Expr,
    t: &Tile,
    copies: &[Option<AsyncLoad>; 2],
    planned: u64,
) -> Vec<Stmt> {
    let (m, n, kdim, batch) = (
        Contraction::extent(&c.rows),
        Contraction::extent(&c.cols),
        Contraction::extent(&c.red),
        Contraction::extent(&c.batch),
    );
    let (bm, bn, bk, threads) = (
        t.bm(e.model()),
        t.bn(e.model()),
        bk(e),
        t.threads(e.model()),
    );
    let (tm, tn, kt) = (m.div_ceil(bm), n.div_ceil(bn), kdim.div_ceil(bk));
    let id = k.vars.len();
    // Rows filled by copies of several elements are padded to a whole number of copies.
    let pad_for = |x: &Option<AsyncLoad>| pad(e).max(x.as_ref().map_or(1, |x| x.lanes));
    let sa = k.buf(
        format!("sa{id}"),
        elem,
        vec![2, bm, bk + pad_for(&copies[0])],
        Space::Shared,
    );
    let sb = k.buf(
        format!("sb{id}"),
        elem,
        vec![2, bk, bn + pad_for(&copies[1])],
        Space::Shared,
    );
    let acc = match e {
        Engine::Mma(_) => k.buf(
            format!("c{id}"),
            Elem::F32,
            vec![t.mt, t.nt, 4],
            Space::Local,
        ),
        Engine::Simt => k.buf(format!("c{id}"), Elem::F32, vec![t.mt, t.nt], Space::Local),
    };
    let gb = k.var(format!("gb{id}"));
    let ko = k.var(format!("ko{id}"));
    // Block gb: batch element, row tile and column tile.
    let g = Expr::var(gb);
    let at_batch = delinear(&c.batch, &Expr::div(g.clone(), int(tm * tn)));
    let row0 = Expr::mul(Expr::rem(Expr::div(g.clone(), int(tn)), int(tm)), int(bm));
    let col0 = Expr::mul(Expr::rem(g, int(tn)), int(bn));
    let thread_loop = |k: &mut Kernel, f: &mut dyn FnMut(&mut Kernel, Expr) -> Vec<Stmt>| -> Stmt {
        let tv = k.var(format!("t{}", k.vars.len()));
        let body = f(k, Expr::var(tv));
        Stmt::for_(tv, threads, LoopKind::GpuThread(0), body)
    };
    let unrolled =
        |k: &mut Kernel, extent: u64, f: &mut dyn FnMut(&mut Kernel, Expr) -> Vec<Stmt>| -> Stmt {
            let v = k.var(format!("u{}", k.vars.len()));
            let body = f(k, Expr::var(v));
            Stmt::for_(v, extent, LoopKind::Unrolled, body)
        };
    // Staging: slice `kslice` of an operand into buffer `buf` (of the pair), `rows x cols` of it with
    // the operand's own axis (`side` loops, from `start`) as rows (A) or columns (B).
    let stage = |k: &mut Kernel,
                 kslice: Expr,
                 which: Expr,
                 operand: &Expr,
                 side: &[(Var, u64)],
                 start: &Expr,
                 is_a: bool|
     -> Stmt {
        let (buf, extent) = if is_a { (sa, m) } else { (sb, n) };
        let (rows, cols) = if is_a { (bm, bk) } else { (bk, bn) };
        let copy = copies[!is_a as usize].clone();
        let lanes = copy.as_ref().map_or(1, |x| x.lanes);
        // Neighbouring threads on neighbouring global elements: K fastest when the operand is contiguous
        // in K and not in its own axis, or in both (a convolution's window and output position) with the
        // longer run in K; a copy of several elements runs along the tile's rows, which are contiguous.
        let k_fast = walk_first(k, operand, c.red.last(), side.last());
        let fast_cols = lanes > 1 || k_fast == is_a;
        let slots = rows * cols / lanes / threads;
        let (operand, side, start, kslice, which) = (
            operand.clone(),
            side.to_vec(),
            start.clone(),
            kslice.clone(),
            which.clone(),
        );
        let red = c.red.clone();
        let at_batch = at_batch.clone();
        let (dm, dk) = (extent, kdim);
        thread_loop(k, &mut |k, tv| {
            vec![unrolled(k, slots, &mut |k, sv| {
                let el = Expr::add(Expr::mul(sv.clone(), int(threads)), tv.clone());
                let (r, col) = tile_position(el, (rows, cols), lanes, fast_cols);
                let (own, kk) = if is_a {
                    (r.clone(), col.clone())
                } else {
                    (col.clone(), r.clone())
                };
                let gown = Expr::add(start.clone(), own);
                let gk = Expr::add(Expr::mul(kslice.clone(), int(bk)), kk);
                let mut by = delinear(&side, &gown);
                by.extend(delinear(&red, &gk));
                by.extend(at_batch.clone());
                let idx = vec![which.clone(), r, col];
                let mut conds = Vec::new();
                if !dm.is_multiple_of(if is_a { bm } else { bn }) {
                    conds.push(lt(gown.clone(), dm));
                }
                if !dk.is_multiple_of(bk) {
                    conds.push(lt(gk.clone(), dk));
                }
                if let Some(cp) = &copy {
                    let from = match &cp.affine {
                        // The run of the tile's axis through memory, plus the loops outside it.
                        Some(Affine { offset, outer, run }) => {
                            let along = if is_a { &gk } else { &gown };
                            let total = if is_a { dk } else { dm };
                            let inner = if *run == total {
                                along.clone()
                            } else {
                                Expr::rem(along.clone(), int(*run))
                            };
                            outer
                                .iter()
                                .fold(Expr::add(Expr::int(*offset), inner), |e, (v, c)| {
                                    let x = by
                                        .iter()
                                        .find(|(w, _)| w == v)
                                        .map_or(Expr::int(0), |(_, x)| x.clone());
                                    Expr::add(e, Expr::mul(x, Expr::int(*c)))
                                })
                        }
                        None => flat_index(
                            k,
                            cp.buf,
                            &cp.index
                                .iter()
                                .map(|x| x.subst_all(&by))
                                .collect::<Vec<_>>(),
                        ),
                    };
                    conds.extend(cp.valid.as_ref().map(|v| v.subst_all(&by)));
                    return vec![Stmt::CopyAsync {
                        dst: Block { buf, at: idx },
                        src: cp.buf,
                        from,
                        lanes,
                        valid: all(conds),
                    }];
                }
                let store = Stmt::Store {
                    buf,
                    index: idx.clone(),
                    value: operand.subst_all(&by),
                };
                if conds.is_empty() {
                    vec![store]
                } else {
                    let mut out = vec![Stmt::Store {
                        buf,
                        index: idx,
                        value: Expr::Float(0.0, elem),
                    }];
                    out.extend(guarded(conds, vec![store]));
                    out
                }
            })]
        })
    };
    let mut body = Vec::new();
    // Zero the accumulators.
    body.push(thread_loop(k, &mut |k, _| {
        vec![unrolled(k, t.mt, &mut |k, i| {
            vec![unrolled(k, t.nt, &mut |k, j| match e {
                Engine::Mma(_) => vec![unrolled(k, 4, &mut |_, q| {
                    vec![Stmt::Store {
                        buf: acc,
                        index: vec![i.clone(), j.clone(), q],
                        value: Expr::f32(0.0),
                    }]
                })],
                Engine::Simt => vec![Stmt::Store {
                    buf: acc,
                    index: vec![i.clone(), j],
                    value: Expr::f32(0.0),
                }],
            })]
        })]
    }));
    // Slice 0 into buffer 0.
    body.push(stage(k, int(0), int(0), a, &c.rows, &row0, true));
    body.push(stage(k, int(0), int(0), b, &c.cols, &col0, false));
    // Each slice: wait for its copies, one barrier (which also ends the products of the slice before,
    // whose buffer is refilled next), start copying the next slice, multiply this one.
    let kv = Expr::var(ko);
    let next = Expr::add(kv.clone(), int(1));
    let this_buf = Expr::rem(kv.clone(), int(2));
    let next_buf = Expr::rem(next.clone(), int(2));
    let mut slice = Vec::new();
    if copies.iter().any(|x| x.is_some()) {
        slice.push(thread_loop(k, &mut |_, _| vec![Stmt::AsyncWait]));
    }
    slice.push(Stmt::Barrier);
    if kt > 1 {
        slice.push(Stmt::If {
            cond: lt(next.clone(), kt),
            then: vec![
                stage(k, next.clone(), next_buf.clone(), a, &c.rows, &row0, true),
                stage(k, next, next_buf, b, &c.cols, &col0, false),
            ],
        });
    }
    slice.push(thread_loop(k, &mut |k, tv| match e {
        Engine::Mma(t_in) => {
            let ks = mlopt_kir::warp_mma_k(t_in);
            let warp = Expr::div(tv.clone(), int(32));
            let (wm, wn) = (
                Expr::div(warp.clone(), int(t.wn)),
                Expr::rem(warp, int(t.wn)),
            );
            vec![unrolled(k, bk / ks, &mut |k, p| {
                let (wm, wn, this_buf) = (wm.clone(), wn.clone(), this_buf.clone());
                vec![unrolled(k, t.mt, &mut |k, i| {
                    let (wm, wn, this_buf, p) =
                        (wm.clone(), wn.clone(), this_buf.clone(), p.clone());
                    vec![unrolled(k, t.nt, &mut |_, j| {
                        let ar = Expr::mul(
                            Expr::add(Expr::mul(wm.clone(), int(t.mt)), i.clone()),
                            int(16),
                        );
                        let bc = Expr::mul(
                            Expr::add(Expr::mul(wn.clone(), int(t.nt)), j.clone()),
                            int(8),
                        );
                        let kp = Expr::mul(p.clone(), int(ks));
                        vec![Stmt::WarpMma {
                            c: Block {
                                buf: acc,
                                at: vec![i.clone(), j, int(0)],
                            },
                            a: Block {
                                buf: sa,
                                at: vec![this_buf.clone(), ar, kp.clone()],
                            },
                            b: Block {
                                buf: sb,
                                at: vec![this_buf.clone(), kp, bc],
                            },
                        }]
                    })]
                })]
            })]
        }
        Engine::Simt => {
            let (ty, tx) = (Expr::div(tv.clone(), int(t.wn)), Expr::rem(tv, int(t.wn)));
            let p = k.var(format!("kk{}", k.vars.len()));
            let pv = Expr::var(p);
            let inner = unrolled(k, t.mt, &mut |k, i| {
                let (ty, tx, pv, this_buf) = (ty.clone(), tx.clone(), pv.clone(), this_buf.clone());
                vec![unrolled(k, t.nt, &mut |_, j| {
                    let x = Expr::load(
                        sa,
                        vec![
                            this_buf.clone(),
                            Expr::add(ty.clone(), Expr::mul(i.clone(), int(t.wm))),
                            pv.clone(),
                        ],
                    );
                    let y = Expr::load(
                        sb,
                        vec![
                            this_buf.clone(),
                            pv.clone(),
                            Expr::add(tx.clone(), Expr::mul(j.clone(), int(t.wn))),
                        ],
                    );
                    let me = Expr::load(acc, vec![i.clone(), j.clone()]);
                    vec![Stmt::Store {
                        buf: acc,
                        index: vec![i.clone(), j],
                        value: Expr::fma(x, y, me),
                    }]
                })]
            });
            vec![Stmt::for_(p, bk, LoopKind::Serial, vec![inner])]
        }
    }));
    body.push(Stmt::for_(ko, kt, LoopKind::Serial, slice));
    // The epilogue, once per output element, on the thread that holds it.
    let rows = c.rows.clone();
    let cols = c.cols.clone();
    body.push(thread_loop(k, &mut |k, tv| {
        let (row0, col0, at_batch) = (row0.clone(), col0.clone(), at_batch.clone());
        vec![unrolled(k, t.mt, &mut |k, i| {
            let (tv, row0, col0, at_batch) =
                (tv.clone(), row0.clone(), col0.clone(), at_batch.clone());
            vec![unrolled(k, t.nt, &mut |k, j| {
                let element = |q: Option<Expr>| -> (Expr, Expr, Vec<Expr>) {
                    match (e, q) {
                        (Engine::Mma(_), Some(q)) => {
                            let (warp, lane) = (
                                Expr::div(tv.clone(), int(32)),
                                Expr::rem(tv.clone(), int(32)),
                            );
                            let (wm, wn) = (
                                Expr::div(warp.clone(), int(t.wn)),
                                Expr::rem(warp, int(t.wn)),
                            );
                            let r = Expr::add(
                                Expr::mul(Expr::add(Expr::mul(wm, int(t.mt)), i.clone()), int(16)),
                                Expr::add(
                                    Expr::div(lane.clone(), int(4)),
                                    Expr::mul(Expr::div(q.clone(), int(2)), int(8)),
                                ),
                            );
                            let col = Expr::add(
                                Expr::mul(Expr::add(Expr::mul(wn, int(t.nt)), j.clone()), int(8)),
                                Expr::add(
                                    Expr::mul(Expr::rem(lane, int(4)), int(2)),
                                    Expr::rem(q.clone(), int(2)),
                                ),
                            );
                            (r, col, vec![i.clone(), j.clone(), q])
                        }
                        _ => {
                            let (ty, tx) = (
                                Expr::div(tv.clone(), int(t.wn)),
                                Expr::rem(tv.clone(), int(t.wn)),
                            );
                            (
                                Expr::add(ty, Expr::mul(i.clone(), int(t.wm))),
                                Expr::add(tx, Expr::mul(j.clone(), int(t.wn))),
                                vec![i.clone(), j.clone()],
                            )
                        }
                    }
                };
                let one = |q: Option<Expr>| -> Vec<Stmt> {
                    let (r, col, slot) = element(q);
                    let (gr, gc) = (Expr::add(row0.clone(), r), Expr::add(col0.clone(), col));
                    let mut by = delinear(&rows, &gr);
                    by.extend(delinear(&cols, &gc));
                    by.extend(at_batch.clone());
                    let mine = Expr::load(acc, slot);
                    let from = c.acc;
                    let epi: Vec<Stmt> = subst_all(&c.epilogue, &by)
                        .iter()
                        .map(|s| {
                            s.map_loads(&|b, ix| {
                                if b == from {
                                    mine.clone()
                                } else {
                                    Expr::Load(b, ix)
                                }
                            })
                        })
                        .collect();
                    let mut conds = Vec::new();
                    if !m.is_multiple_of(bm) {
                        conds.push(lt(gr, m));
                    }
                    if !n.is_multiple_of(bn) {
                        conds.push(lt(gc, n));
                    }
                    guarded(conds, epi)
                };
                match e {
                    Engine::Mma(_) => vec![unrolled(k, 4, &mut |_, q| one(Some(q)))],
                    Engine::Simt => one(None),
                }
            })]
        })]
    }));
    let engine = match e {
        Engine::Mma(Elem::F32) => mlopt_kir::GpuEngine::Tf32,
        Engine::Mma(t) => mlopt_kir::GpuEngine::Mma(t),
        Engine::Simt => mlopt_kir::GpuEngine::Simt,
    };
    k.schedule.push(mlopt_kir::ScheduleStep::GpuGemm {
        batch,
        m,
        n,
        k: kdim,
        engine,
        tile: [bm, bn, bk],
        threads,
        blocks: batch * tm * tn,
        registers: planned as u32,
    });
    vec![Stmt::for_(gb, batch * tm * tn, LoopKind::GpuBlock(0), body)]
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
            Elem::BF16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
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
