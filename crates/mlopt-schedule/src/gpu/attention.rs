//! The GPU schedule for attention, `softmax(q @ kt * scale + mask) @ v`, on tensor cores: both products
//! run as `mma.sync` with the scores of a block of queries against a block of keys in shared memory,
//! and the softmax is taken online (as FlashAttention does), so the [S, T] score matrix never reaches
//! global memory.
//!
//! Lowering writes attention one query row at a time (`mlopt-lower/src/nests.rs`): the row of scores in a local
//! buffer, its max and sum, then the weighted sum of v. That nest is recognised (`attention.rs`, which
//! the CPU's blocked attention shares), and a block of `16 W` query rows (W warps, 16 rows each)
//! becomes:
//!
//! ```text
//! Q tile [BM, d] -> shared; m = -inf, l = 0, O = 0 (O: each warp's fragments of its 16 x dv rows)
//! for each block of BN keys:
//!     K^T tile [d, BN] and V tile [BN, dv] -> shared                   | barrier before and after
//!     S = Q K^T (mma)  -> shared, * scale + mask, -inf past the keys     | barrier
//!     per row (a thread each): m' = max(m, max S), a = e^(m - m'), m = m' | barrier
//!     P = e^(S - m) (every thread, element-wise; 0 in rows past the queries) | barrier
//!     per row: l = a l + sum P;  O = a O + P V (mma)
//! out = O / l, through the nest's own epilogue (casts, the store)
//! ```
//!
//! Where the running max is still -inf (every key so far masked with -inf), 0 is subtracted instead, so
//! the terms are e^-inf = 0 and never NaN. Operands are bf16 or f16 when q, k and v are (P is rounded to
//! that type for its product, as FlashAttention does); f32 operands are read as tf32, only when the
//! precision allows it. Otherwise (fp32 precision) attention keeps the SIMT row schedules.

use super::gemm::{guarded, int, narrow, tile_position, walk_first};
use super::{delinear, lt, GpuSchedule};
use crate::attention::Attention;
use crate::error::Result;
use mlopt_kir::{BinOp, Block, BufId, Elem, Expr, Kernel, LoopKind, Space, Stmt, UnOp, Var};

/// An element of a staged tile at (row, column): the operand's loops there, and where it is valid (zero
/// elsewhere).
type Element<'a> = dyn Fn(&Expr, &Expr) -> (Vec<(Var, Expr)>, Expr) + 'a;

/// Row padding of the shared tiles in elements (16-byte aligned rows for `ldmatrix`, spread over banks).
fn pad(t: Elem) -> u64 {
    16 / t.size()
}

/// A block's shared memory in bytes: the Q, K^T and V tiles, the scores in f32 (and P in `t` unless
/// it is f32), and three f32 per row.
fn shared_bytes(t: Elem, bm: u64, bn: u64, d: u64, dv: u64) -> u64 {
    let p = pad(t);
    let tiles = (bm * (d + p) + d * (bn + p) + bn * (dv + p)) * t.size();
    let probs = if t == Elem::F32 {
        0
    } else {
        bm * (bn + p) * t.size()
    };
    tiles + bm * (bn + 4) * 4 + probs + 3 * bm * 4
}

/// Schedules the launch as tensor-core attention when `inner` is lowering's attention nest and the
/// operands allow it; None leaves it to the other schedules.
pub(crate) fn attention(
    k: &mut Kernel,
    a: &Attention,
    s: &GpuSchedule,
) -> Result<Option<Vec<Stmt>>> {
    // bf16/f16 operands as they are, or f32 read as tf32 where the precision allows.
    let sixteen = [Elem::BF16, Elem::F16].into_iter().find_map(|t| {
        Some((
            t,
            narrow(k, &a.q, t)?,
            narrow(k, &a.kt, t)?,
            narrow(k, &a.v, t)?,
        ))
    });
    let (t, q, kt, v) = match sixteen {
        Some(x) => x,
        None if s.matrix(Elem::F32).is_some() => {
            (Elem::F32, a.q.clone(), a.kt.clone(), a.v.clone())
        }
        None => return Ok(None),
    };
    let ks = mlopt_kir::warp_mma_k(t);
    let (rows, d, dv, keys) = (a.row.1, a.d, a.dv, a.keys);
    if !d.is_multiple_of(ks) || !dv.is_multiple_of(8) || dv > 128 || d > 256 || keys < 8 {
        return Ok(None);
    }
    // Up to four warps of 16 query rows; the widest key block that fits in shared memory.
    let warps = rows.div_ceil(16).min(4);
    let (bm, threads) = (16 * warps, 32 * warps);
    let Some(bn) = [64, 32, 16].into_iter().find(|bn| {
        *bn <= keys.next_multiple_of(16)
            && shared_bytes(t, bm, *bn, d, dv) <= GpuSchedule::SHARED_BYTES
    }) else {
        return Ok(None);
    };
    let batch: u64 = a.batch.iter().map(|(_, n)| n).product();
    let tiles = rows.div_ceil(bm);
    let f = Flash::new(k, a, t, (bm, bn, threads), tiles);

    let mut body = vec![f.start(k, &q)];
    let mut step = vec![Stmt::Barrier, f.stage_keys(k, &kt, &v), Stmt::Barrier];
    step.push(f.scores(k));
    step.push(Stmt::Barrier);
    step.push(f.row_max(k));
    step.push(Stmt::Barrier);
    step.push(f.probabilities(k));
    step.push(Stmt::Barrier);
    step.push(f.accumulate(k));
    body.push(Stmt::for_(f.kv, keys.div_ceil(bn), LoopKind::Serial, step));
    body.push(Stmt::Barrier);
    body.push(f.finish(k));
    let engine = if t == Elem::F32 {
        mlopt_kir::GpuEngine::Tf32
    } else {
        mlopt_kir::GpuEngine::Mma(t)
    };
    k.schedule.push(mlopt_kir::ScheduleStep::GpuAttention {
        batch,
        rows,
        keys,
        d,
        dv,
        engine,
        queries: bm,
        keys_per_block: bn,
        threads,
        blocks: batch * tiles,
    });
    Ok(Some(vec![Stmt::for_(
        f.gb,
        batch * tiles,
        LoopKind::GpuBlock(0),
        body,
    )]))
}

/// What writing one block of query rows needs: the attention nest, the operand type, the block's
/// shape and its buffers, and where the block and the current key block start.
struct Flash<'a> {
    a: &'a Attention,
    t: Elem,
    /// The mma's depth for `t`.
    ks: u64,
    bm: u64,
    bn: u64,
    threads: u64,
    /// Shared: the Q, K^T and V tiles, the f32 scores, P in `t` (the scores where `t` is f32), and
    /// per row the running max, the running sum and the rescale factor.
    sq: BufId,
    sk: BufId,
    sv: BufId,
    ss: BufId,
    sp: BufId,
    sm: BufId,
    sl: BufId,
    sa: BufId,
    /// Per thread: the fragments of S and of O, and a running scalar.
    cs: BufId,
    co: BufId,
    run: BufId,
    /// The block loop and the key-block loop.
    gb: Var,
    kv: Var,
    at_batch: Vec<(Var, Expr)>,
    row0: Expr,
    key0: Expr,
}

impl<'a> Flash<'a> {
    fn new(
        k: &mut Kernel,
        a: &'a Attention,
        t: Elem,
        (bm, bn, threads): (u64, u64, u64),
        tiles: u64,
    ) -> Self {
        let (d, dv, p) = (a.d, a.dv, pad(t));
        let id = k.vars.len();
        let sq = k.buf(format!("sq{id}"), t, vec![bm, d + p], Space::Shared);
        let sk = k.buf(format!("sk{id}"), t, vec![d, bn + p], Space::Shared);
        let sv = k.buf(format!("sv{id}"), t, vec![bn, dv + p], Space::Shared);
        let ss = k.buf(
            format!("ss{id}"),
            Elem::F32,
            vec![bm, bn + 4],
            Space::Shared,
        );
        let sp = if t == Elem::F32 {
            ss
        } else {
            k.buf(format!("sp{id}"), t, vec![bm, bn + p], Space::Shared)
        };
        let [sm, sl, sa] = ["sm", "sl", "sa"]
            .map(|n| k.buf(format!("{n}{id}"), Elem::F32, vec![bm], Space::Shared));
        let cs = k.buf(
            format!("cs{id}"),
            Elem::F32,
            vec![1, bn / 8, 4],
            Space::Local,
        );
        let co = k.buf(
            format!("co{id}"),
            Elem::F32,
            vec![1, dv / 8, 4],
            Space::Local,
        );
        let run = k.buf(format!("run{id}"), Elem::F32, vec![], Space::Local);
        let (gb, kv) = (k.var(format!("gb{id}")), k.var(format!("kv{id}")));
        Flash {
            a,
            t,
            ks: mlopt_kir::warp_mma_k(t),
            bm,
            bn,
            threads,
            sq,
            sk,
            sv,
            ss,
            sp,
            sm,
            sl,
            sa,
            cs,
            co,
            run,
            gb,
            kv,
            at_batch: delinear(&a.batch, &Expr::div(Expr::var(gb), int(tiles))),
            row0: Expr::mul(Expr::rem(Expr::var(gb), int(tiles)), int(bm)),
            key0: Expr::mul(Expr::var(kv), int(bn)),
        }
    }

    /// A loop over the block's threads.
    fn threads_loop(
        &self,
        k: &mut Kernel,
        f: &mut dyn FnMut(&mut Kernel, Expr) -> Vec<Stmt>,
    ) -> Stmt {
        let tv = k.var(format!("t{}", k.vars.len()));
        let body = f(k, Expr::var(tv));
        Stmt::for_(tv, self.threads, LoopKind::GpuThread(0), body)
    }

    /// The block's query row `r` is a query.
    fn row_ok(&self, r: &Expr) -> Expr {
        lt(Expr::add(self.row0.clone(), r.clone()), self.a.row.1)
    }

    /// The nest's loops at the block's query row `r`.
    fn by_row(&self, r: &Expr) -> Vec<(Var, Expr)> {
        let mut by = self.at_batch.clone();
        by.push((self.a.row.0, Expr::add(self.row0.clone(), r.clone())));
        by
    }

    /// The tile of `operand` over its loops `rows` x `cols` filled by the block, neighbouring threads
    /// on neighbouring global elements: `at(r, c)` gives the loops' values at tile element (r, c) and
    /// where it is valid; zero elsewhere.
    fn tile(
        &self,
        k: &mut Kernel,
        tv: &Expr,
        buf: BufId,
        operand: &Expr,
        (rows, cols): ((Var, u64), (Var, u64)),
        at: &Element,
    ) -> Stmt {
        let along_cols = walk_first(k, operand, Some(&cols), Some(&rows));
        let (threads, t) = (self.threads, self.t);
        loop_(
            k,
            rows.1 * cols.1 / threads,
            LoopKind::Serial,
            &mut |_, slot| {
                let el = Expr::add(Expr::mul(slot, int(threads)), tv.clone());
                let (r, c) = tile_position(el, (rows.1, cols.1), 1, along_cols);
                let (by, valid) = at(&r, &c);
                let mut out = vec![Stmt::Store {
                    buf,
                    index: vec![r.clone(), c.clone()],
                    value: Expr::Float(0.0, t),
                }];
                let value = operand.subst_all(&by);
                out.extend(guarded(
                    vec![valid],
                    vec![Stmt::Store {
                        buf,
                        index: vec![r, c],
                        value,
                    }],
                ));
                out
            },
        )
    }

    /// acc += x y on the warp's 16 rows of x (shared, `depth` wide) by the `depth x width` y.
    fn products(
        &self,
        k: &mut Kernel,
        tv: &Expr,
        acc: BufId,
        (x, y): (BufId, BufId),
        (depth, width): (u64, u64),
    ) -> Stmt {
        let (wr, ks) = (warp_row(tv), self.ks);
        loop_(k, depth / ks, LoopKind::Unrolled, &mut |k, kk| {
            let wr = wr.clone();
            vec![loop_(k, width / 8, LoopKind::Unrolled, &mut |_, n| {
                let kp = Expr::mul(kk.clone(), int(ks));
                vec![Stmt::WarpMma {
                    c: Block {
                        buf: acc,
                        at: vec![int(0), n.clone(), int(0)],
                    },
                    a: Block {
                        buf: x,
                        at: vec![wr.clone(), kp.clone()],
                    },
                    b: Block {
                        buf: y,
                        at: vec![kp, Expr::mul(n, int(8))],
                    },
                }]
            })]
        })
    }

    /// O = 0, m = -inf, l = 0, a = 1; the Q tile.
    fn start(&self, k: &mut Kernel, q: &Expr) -> Stmt {
        let a = self.a;
        self.threads_loop(k, &mut |k, tv| {
            let mut out = vec![fragments(k, self.co, a.dv, &|_, _| Expr::f32(0.0))];
            out.push(Stmt::If {
                cond: lt(tv.clone(), self.bm),
                then: [
                    (self.sm, Expr::f32(f64::NEG_INFINITY)),
                    (self.sl, Expr::f32(0.0)),
                    (self.sa, Expr::f32(1.0)),
                ]
                .into_iter()
                .map(|(b, x)| Stmt::Store {
                    buf: b,
                    index: vec![tv.clone()],
                    value: x,
                })
                .collect(),
            });
            let dims = ((a.row.0, self.bm), (a.r, a.d));
            out.push(self.tile(k, &tv, self.sq, q, dims, &|r, c| {
                let mut by = self.by_row(r);
                by.push((a.r, c.clone()));
                (by, self.row_ok(r))
            }));
            out
        })
    }

    /// The K^T and V tiles of this block of keys.
    fn stage_keys(&self, k: &mut Kernel, kt: &Expr, v: &Expr) -> Stmt {
        let a = self.a;
        // Key `key0 + x` of this block, with the operand's other loop at `y`.
        let key = |j: Var, x: &Expr, other: Var, y: &Expr| {
            let gj = Expr::add(self.key0.clone(), x.clone());
            let mut by = self.at_batch.clone();
            by.extend([(j, gj.clone()), (other, y.clone())]);
            (by, lt(gj, a.keys))
        };
        self.threads_loop(k, &mut |k, tv| {
            let kt_dims = ((a.r, a.d), (a.j, self.bn));
            let kt_tile = self.tile(k, &tv, self.sk, kt, kt_dims, &|r, c| key(a.j, c, a.r, r));
            let v_dims = ((a.jv, self.bn), (a.e, a.dv));
            let v_tile = self.tile(k, &tv, self.sv, v, v_dims, &|r, c| key(a.jv, r, a.e, c));
            vec![kt_tile, v_tile]
        })
    }

    /// S = Q K^T * scale + mask, -inf for keys past the end.
    fn scores(&self, k: &mut Kernel) -> Stmt {
        let (a, cs, ss) = (self.a, self.cs, self.ss);
        self.threads_loop(k, &mut |k, tv| {
            let zero = fragments(k, cs, self.bn, &|_, _| Expr::f32(0.0));
            let mma = self.products(k, &tv, cs, (self.sq, self.sk), (a.d, self.bn));
            let write = loop_(k, self.bn / 8, LoopKind::Unrolled, &mut |k, n| {
                let tv = tv.clone();
                vec![loop_(k, 4, LoopKind::Unrolled, &mut |_, q| {
                    let (r, c) = frag(&tv, &q);
                    let c = Expr::add(Expr::mul(n.clone(), int(8)), c);
                    let gj = Expr::add(self.key0.clone(), c.clone());
                    let mut by = self.by_row(&r);
                    by.push((a.j, gj.clone()));
                    let acc = Expr::load(cs, vec![int(0), n.clone(), q]);
                    let mut x = Expr::bin(BinOp::Mul, acc, a.scale.clone());
                    if let Some(m) = &a.mask {
                        x = Expr::bin(BinOp::Add, x, m.subst_all(&by));
                    }
                    let index = vec![r.clone(), c.clone()];
                    let value = Expr::f32(f64::NEG_INFINITY);
                    let mut out = vec![Stmt::Store {
                        buf: ss,
                        index,
                        value,
                    }];
                    out.extend(guarded(
                        vec![self.row_ok(&r), lt(gj, a.keys)],
                        vec![Stmt::Store {
                            buf: ss,
                            index: vec![r, c],
                            value: x,
                        }],
                    ));
                    out
                })]
            });
            vec![zero, mma, write]
        })
    }

    /// Per row: the new max and the factor that rescales what came before.
    fn row_max(&self, k: &mut Kernel) -> Stmt {
        let (run, sm) = (self.run, self.sm);
        let m_of = |r: &Expr| Expr::load(sm, vec![r.clone()]);
        self.threads_loop(k, &mut |k, tv| {
            let me = Expr::load(run, vec![]);
            let scan = loop_(k, self.bn, LoopKind::Serial, &mut |_, c| {
                let value = Expr::bin(
                    BinOp::Max,
                    me.clone(),
                    Expr::load(self.ss, vec![tv.clone(), c]),
                );
                vec![Stmt::Store {
                    buf: run,
                    index: vec![],
                    value,
                }]
            });
            let factor = Expr::un(
                UnOp::Exp,
                Expr::bin(BinOp::Sub, m_of(&tv), safe(me.clone())),
            );
            let then = vec![
                Stmt::Store {
                    buf: run,
                    index: vec![],
                    value: m_of(&tv),
                },
                scan,
                Stmt::Store {
                    buf: self.sa,
                    index: vec![tv.clone()],
                    value: factor,
                },
                Stmt::Store {
                    buf: sm,
                    index: vec![tv.clone()],
                    value: me.clone(),
                },
            ];
            let cond = Expr::bin(BinOp::And, lt(tv.clone(), self.bm), self.row_ok(&tv));
            vec![Stmt::If { cond, then }]
        })
    }

    /// P = e^(S - m), 0 in rows past the queries.
    fn probabilities(&self, k: &mut Kernel) -> Stmt {
        let (bn, ss, sp, threads) = (self.bn, self.ss, self.sp, self.threads);
        self.threads_loop(k, &mut |k, tv| {
            vec![loop_(
                k,
                self.bm * bn / threads,
                LoopKind::Serial,
                &mut |_, slot| {
                    let el = Expr::add(Expr::mul(slot, int(threads)), tv.clone());
                    let (r, c) = (Expr::div(el.clone(), int(bn)), Expr::rem(el, int(bn)));
                    let m = Expr::load(self.sm, vec![r.clone()]);
                    let s = Expr::load(ss, vec![r.clone(), c.clone()]);
                    let x = Expr::un(UnOp::Exp, Expr::bin(BinOp::Sub, s, safe(m)));
                    let x = Expr::select(self.row_ok(&r), x, Expr::f32(0.0));
                    // P in `t` first: the store to S replaces what both read.
                    let mut out = Vec::new();
                    if sp != ss {
                        let (index, value) =
                            (vec![r.clone(), c.clone()], Expr::cast(self.t, x.clone()));
                        out.push(Stmt::Store {
                            buf: sp,
                            index,
                            value,
                        });
                    }
                    out.push(Stmt::Store {
                        buf: ss,
                        index: vec![r, c],
                        value: x,
                    });
                    out
                },
            )]
        })
    }

    /// l = a l + sum P; O = a O + P V.
    fn accumulate(&self, k: &mut Kernel) -> Stmt {
        let (run, sa, co) = (self.run, self.sa, self.co);
        self.threads_loop(k, &mut |k, tv| {
            let me = Expr::load(run, vec![]);
            let sum = loop_(k, self.bn, LoopKind::Serial, &mut |_, c| {
                let value = Expr::bin(
                    BinOp::Add,
                    me.clone(),
                    Expr::load(self.ss, vec![tv.clone(), c]),
                );
                vec![Stmt::Store {
                    buf: run,
                    index: vec![],
                    value,
                }]
            });
            let l = Expr::load(self.sl, vec![tv.clone()]);
            let scaled = Expr::bin(BinOp::Mul, l, Expr::load(sa, vec![tv.clone()]));
            let rows_part = Stmt::If {
                cond: lt(tv.clone(), self.bm),
                then: vec![
                    Stmt::Store {
                        buf: run,
                        index: vec![],
                        value: scaled,
                    },
                    sum,
                    Stmt::Store {
                        buf: self.sl,
                        index: vec![tv.clone()],
                        value: me,
                    },
                ],
            };
            let rescale = fragments(k, co, self.a.dv, &|n, q| {
                let o = Expr::load(co, vec![int(0), n.clone(), q.clone()]);
                Expr::bin(BinOp::Mul, o, Expr::load(sa, vec![frag(&tv, q).0]))
            });
            let mma = self.products(k, &tv, co, (self.sp, self.sv), (self.bn, self.a.dv));
            vec![rows_part, rescale, mma]
        })
    }

    /// out = O / l through the nest's own store, on the thread holding each element.
    fn finish(&self, k: &mut Kernel) -> Stmt {
        let a = self.a;
        self.threads_loop(k, &mut |k, tv| {
            vec![loop_(k, a.dv / 8, LoopKind::Unrolled, &mut |k, n| {
                let tv = tv.clone();
                vec![loop_(k, 4, LoopKind::Unrolled, &mut |_, q| {
                    let (r, c) = frag(&tv, &q);
                    let mut by = self.by_row(&r);
                    by.push((a.e, Expr::add(Expr::mul(n.clone(), int(8)), c)));
                    let o = Expr::load(self.co, vec![int(0), n.clone(), q]);
                    let l = Expr::load(self.sl, vec![r.clone()]);
                    let store = a.store.subst_all(&by).map_loads(&|b, ix| {
                        if b == a.acc_o {
                            o.clone()
                        } else if b == a.acc_l {
                            l.clone()
                        } else {
                            Expr::Load(b, ix)
                        }
                    });
                    guarded(vec![self.row_ok(&r)], vec![store])
                })]
            })]
        })
    }
}

/// A loop of `n` iterations of `kind`.
fn loop_(
    k: &mut Kernel,
    n: u64,
    kind: LoopKind,
    f: &mut dyn FnMut(&mut Kernel, Expr) -> Vec<Stmt>,
) -> Stmt {
    let v = k.var(format!("u{}", k.vars.len()));
    let body = f(k, Expr::var(v));
    Stmt::for_(v, n, kind, body)
}

/// The element of a 16 x 8 mma result that lane `tv % 32` holds as its `q`-th: (row, column).
fn frag(tv: &Expr, q: &Expr) -> (Expr, Expr) {
    let lane = Expr::rem(tv.clone(), int(32));
    let r = Expr::add(
        warp_row(tv),
        Expr::add(
            Expr::div(lane.clone(), int(4)),
            Expr::mul(Expr::div(q.clone(), int(2)), int(8)),
        ),
    );
    let c = Expr::add(
        Expr::mul(Expr::rem(lane, int(4)), int(2)),
        Expr::rem(q.clone(), int(2)),
    );
    (r, c)
}

/// The first of the 16 query rows of the warp thread `tv` is in.
fn warp_row(tv: &Expr) -> Expr {
    Expr::mul(Expr::div(tv.clone(), int(32)), int(16))
}

/// A warp's 16 rows of `acc` (`width` columns, as 16 x 8 fragments) set to `f(n, q)` for its q-th
/// element of fragment n.
fn fragments(k: &mut Kernel, acc: BufId, width: u64, f: &dyn Fn(&Expr, &Expr) -> Expr) -> Stmt {
    loop_(k, width / 8, LoopKind::Unrolled, &mut |k, n| {
        vec![loop_(k, 4, LoopKind::Unrolled, &mut |_, q| {
            let index = vec![int(0), n.clone(), q.clone()];
            vec![Stmt::Store {
                buf: acc,
                index,
                value: f(&n, &q),
            }]
        })]
    })
}

/// The max to subtract: 0 while it is -inf, so that e^(-inf - m) is 0, not NaN.
fn safe(m: Expr) -> Expr {
    let unset = Expr::bin(BinOp::Eq, m.clone(), Expr::f32(f64::NEG_INFINITY));
    Expr::select(unset, Expr::f32(0.0), m)
}
