//! Writing a tiled GEMM (`gemm.rs` chooses the engine and the tile): the operands staged slice by slice
//! into double-buffered shared memory (by `cp.async` where a slice is a plain affine run of the tile's
//! type), the tile's product on tensor cores or SIMT FMAs, and the contraction's epilogue on each result.

use super::gemm::*;
use super::{delinear, lt, subst_all};
use crate::contraction::Contraction;
use mlopt_cost::gpu_tile::Tile;
use mlopt_kir::analysis::{coefficient, flat_index, offset};
use mlopt_kir::{Block, BufId, Elem, Expr, Kernel, LoopKind, Space, Stmt, Var};

/// An operand staged with `cp.async`: the global load it is, where it is valid (zeros elsewhere: a
/// convolution's padding), and how many consecutive elements one copy moves along the tile's last axis.
#[derive(Debug, Clone)]
pub(crate) struct AsyncLoad {
    pub(crate) buf: BufId,
    pub(crate) index: Vec<Expr>,
    pub(crate) valid: Option<Expr>,
    pub(crate) lanes: u64,
    /// For copies of several elements, the source's flat position as an affine function.
    pub(crate) affine: Option<Affine>,
}

/// A flat position `offset + sum of c v over outer + (position along the tile's axis) % run`: the loops
/// outside the contiguous run with their coefficients, and the run's joint extent.
#[derive(Debug, Clone)]
pub(crate) struct Affine {
    pub(crate) offset: i64,
    pub(crate) outer: Vec<(Var, i64)>,
    pub(crate) run: u64,
}

/// `operand` as an asynchronous copy into a `rows x cols` tile of `elem` by `threads` threads, when it
/// is a plain global load of `elem` (or such a load where a test holds and 0 elsewhere). The widest copy
/// (16 bytes, then 8, then 4) whose addresses are all aligned is chosen. Wider than one element needs
/// the innermost loops of the tile's last axis (`along`, innermost last; loops of extent 1 are 0)
/// contiguous in memory over a joint extent the width divides, as does the tile's width (so a copy
/// never straddles the outer loops, and the bounds and the test hold for all of it or none), and every
/// other loop of `all` moving the address by whole copies.
pub(crate) fn async_load(
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

/// What every part of one tiled GEMM is written with: the contraction, the engine and the tile, and the
/// shared buffers, accumulators and block coordinates `build` made.
struct Writer<'a> {
    c: &'a Contraction,
    e: Engine,
    elem: Elem,
    t: &'a Tile,
    copies: &'a [Option<AsyncLoad>; 2],
    m: u64,
    n: u64,
    kdim: u64,
    bm: u64,
    bn: u64,
    bk: u64,
    threads: u64,
    sa: BufId,
    sb: BufId,
    acc: BufId,
    /// The batch loops at this block's batch element, and its first row and column.
    at_batch: Vec<(Var, Expr)>,
    row0: Expr,
    col0: Expr,
}

/// An operand's slice as the threads stage it: the shared buffer, the slice's `rows x cols`, the
/// elements one copy moves, whether neighbouring elements run along a row, and how many elements
/// (`slots`) each of the `threads` threads moves.
#[derive(Clone, Copy)]
struct Layout {
    buf: BufId,
    rows: u64,
    cols: u64,
    lanes: u64,
    fast_cols: bool,
    threads: u64,
    slots: u64,
}

impl Layout {
    /// Where slot `sv` of thread `tv` lands in the slice: (row, column).
    fn position(&self, tv: &Expr, sv: &Expr) -> (Expr, Expr) {
        let el = Expr::add(Expr::mul(sv.clone(), int(self.threads)), tv.clone());
        tile_position(el, (self.rows, self.cols), self.lanes, self.fast_cols)
    }
}

/// A loop of `threads` GPU threads around what `f` writes for thread `tv`.
fn thread_loop(
    k: &mut Kernel,
    threads: u64,
    f: &mut dyn FnMut(&mut Kernel, Expr) -> Vec<Stmt>,
) -> Stmt {
    let tv = k.var(format!("t{}", k.vars.len()));
    let body = f(k, Expr::var(tv));
    Stmt::for_(tv, threads, LoopKind::GpuThread(0), body)
}

/// An unrolled loop of `extent` around what `f` writes for each value.
fn unrolled(
    k: &mut Kernel,
    extent: u64,
    f: &mut dyn FnMut(&mut Kernel, Expr) -> Vec<Stmt>,
) -> Stmt {
    let v = k.var(format!("u{}", k.vars.len()));
    let body = f(k, Expr::var(v));
    Stmt::for_(v, extent, LoopKind::Unrolled, body)
}

impl Writer<'_> {
    /// Staging: slice `kslice` of an operand into buffer `buf` (of the pair), `rows x cols` of it with
    /// the operand's own axis (`side` loops, from `start`) as rows (A) or columns (B). An operand staged
    /// by plain loads goes to the thread's registers `regs` instead where given (slot `i` of a thread
    /// holding its `i`-th element), for `unstage` to store into shared memory later.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &self,
        k: &mut Kernel,
        kslice: Expr,
        which: Expr,
        operand: &Expr,
        side: &[(Var, u64)],
        start: &Expr,
        is_a: bool,
        regs: Option<BufId>,
    ) -> Stmt {
        let Writer {
            c,
            elem,
            copies,
            m,
            n,
            kdim,
            bm,
            bn,
            bk,
            threads,
            ..
        } = *self;
        let at_batch = &self.at_batch;

        let extent = if is_a { m } else { n };
        let copy = copies[!is_a as usize].clone();
        let lay = self.layout(k, operand, side, is_a);
        let Layout {
            buf, lanes, slots, ..
        } = lay;
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
        thread_loop(k, threads, &mut |k, tv| {
            vec![unrolled(k, slots, &mut |k, sv| {
                let (r, col) = lay.position(&tv, &sv);
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
                let (buf, idx) = match regs {
                    Some(r) => (r, vec![sv.clone()]),
                    None => (buf, idx),
                };
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
    }

    /// How an operand's slice is spread over the threads (`stage` and `unstage` both place it so).
    fn layout(&self, k: &Kernel, operand: &Expr, side: &[(Var, u64)], is_a: bool) -> Layout {
        let (buf, rows, cols) = if is_a {
            (self.sa, self.bm, self.bk)
        } else {
            (self.sb, self.bk, self.bn)
        };
        let lanes = self.copies[!is_a as usize].as_ref().map_or(1, |x| x.lanes);
        // Neighbouring threads on neighbouring global elements: K fastest when the operand is contiguous
        // in K and not in its own axis, or in both (a convolution's window and output position) with the
        // longer run in K; a copy of several elements runs along the tile's rows, which are contiguous.
        let k_fast = walk_first(k, operand, self.c.red.last(), side.last());
        Layout {
            buf,
            rows,
            cols,
            lanes,
            fast_cols: lanes > 1 || k_fast == is_a,
            threads: self.threads,
            slots: rows * cols / lanes / self.threads,
        }
    }

    /// The registers `regs` that `stage` filled for an operand staged by plain loads, stored into
    /// buffer `which` of its shared pair, each element where `stage` would have put it.
    fn unstage(
        &self,
        k: &mut Kernel,
        which: Expr,
        operand: &Expr,
        side: &[(Var, u64)],
        is_a: bool,
        regs: BufId,
    ) -> Stmt {
        let lay = self.layout(k, operand, side, is_a);
        thread_loop(k, lay.threads, &mut |k, tv| {
            let which = which.clone();
            vec![unrolled(k, lay.slots, &mut |_, sv| {
                let (r, col) = lay.position(&tv, &sv);
                vec![Stmt::Store {
                    buf: lay.buf,
                    index: vec![which.clone(), r, col],
                    value: Expr::load(regs, vec![sv]),
                }]
            })]
        })
    }

    /// Zeroes the accumulators.
    fn zero(&self, k: &mut Kernel) -> Stmt {
        let Writer {
            e, t, threads, acc, ..
        } = *self;
        thread_loop(k, threads, &mut |k, _| {
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
        })
    }

    /// One slice's products: each warp's `mma.sync` on its part of the tile, or each thread's FMAs.
    fn products(&self, k: &mut Kernel, this_buf: &Expr) -> Stmt {
        let Writer {
            e,
            t,
            bk,
            threads,
            sa,
            sb,
            acc,
            ..
        } = *self;
        thread_loop(k, threads, &mut |k, tv| match e {
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
                    let (ty, tx, pv, this_buf) =
                        (ty.clone(), tx.clone(), pv.clone(), this_buf.clone());
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
        })
    }

    /// The epilogue, once per output element, on the thread that holds it.
    fn epilogue(&self, k: &mut Kernel) -> Stmt {
        let Writer {
            c,
            e,
            t,
            m,
            n,
            bm,
            bn,
            threads,
            acc,
            ..
        } = *self;
        let (row0, col0, at_batch) = (&self.row0, &self.col0, &self.at_batch);
        let rows = c.rows.clone();
        let cols = c.cols.clone();
        thread_loop(k, threads, &mut |k, tv| {
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
                                    Expr::mul(
                                        Expr::add(Expr::mul(wm, int(t.mt)), i.clone()),
                                        int(16),
                                    ),
                                    Expr::add(
                                        Expr::div(lane.clone(), int(4)),
                                        Expr::mul(Expr::div(q.clone(), int(2)), int(8)),
                                    ),
                                );
                                let col = Expr::add(
                                    Expr::mul(
                                        Expr::add(Expr::mul(wn, int(t.nt)), j.clone()),
                                        int(8),
                                    ),
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
        })
    }
}

/// Writes the tiled GEMM (see the module comment).
#[allow(clippy::too_many_arguments)]
pub(crate) fn build(
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
    let w = Writer {
        c,
        e,
        elem,
        t,
        copies,
        m,
        n,
        kdim,
        bm,
        bn,
        bk,
        threads,
        sa,
        sb,
        acc,
        at_batch,
        row0,
        col0,
    };
    let mut body = vec![w.zero(k)];
    // Slice 0 into buffer 0.
    body.push(w.stage(k, int(0), int(0), a, &c.rows, &w.row0, true, None));
    body.push(w.stage(k, int(0), int(0), b, &c.cols, &w.col0, false, None));
    // Each slice: wait for its copies, one barrier (which also ends the products of the slice before,
    // whose buffer is refilled next), start copying the next slice, multiply this one. An operand
    // staged by plain loads is loaded into registers before the products and stored into shared memory
    // after them, so the loads' latency passes while the products run.
    let kv = Expr::var(ko);
    let next = Expr::add(kv.clone(), int(1));
    let this_buf = Expr::rem(kv.clone(), int(2));
    let next_buf = Expr::rem(next.clone(), int(2));
    let regs: Vec<Option<BufId>> = [(bm * bk, &copies[0], "ra"), (bk * bn, &copies[1], "rb")]
        .into_iter()
        .map(|(n, copy, name)| {
            (copy.is_none() && kt > 1)
                .then(|| k.buf(format!("{name}{id}"), elem, vec![n / threads], Space::Local))
        })
        .collect();
    let mut slice = Vec::new();
    if copies.iter().any(|x| x.is_some()) {
        slice.push(thread_loop(k, threads, &mut |_, _| vec![Stmt::AsyncWait]));
    }
    slice.push(Stmt::Barrier);
    if kt > 1 {
        slice.push(Stmt::If {
            cond: lt(next.clone(), kt),
            then: vec![
                w.stage(
                    k,
                    next.clone(),
                    next_buf.clone(),
                    a,
                    &c.rows,
                    &w.row0,
                    true,
                    regs[0],
                ),
                w.stage(
                    k,
                    next.clone(),
                    next_buf.clone(),
                    b,
                    &c.cols,
                    &w.col0,
                    false,
                    regs[1],
                ),
            ],
        });
    }
    slice.push(w.products(k, &this_buf));
    let unstage: Vec<Stmt> = [(a, &c.rows, true, regs[0]), (b, &c.cols, false, regs[1])]
        .into_iter()
        .filter_map(|(x, side, is_a, r)| Some(w.unstage(k, next_buf.clone(), x, side, is_a, r?)))
        .collect();
    if !unstage.is_empty() {
        slice.push(Stmt::If {
            cond: lt(next, kt),
            then: unstage,
        });
    }
    body.push(Stmt::for_(ko, kt, LoopKind::Serial, slice));
    body.push(w.epilogue(k));
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
