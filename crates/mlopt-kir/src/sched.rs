//! Schedules: transformations of a kernel's loop nest that keep its algorithm (what each store computes)
//! and change only the order, grouping and kind of its loops, in Halide's vocabulary: split, reorder, tile,
//! vectorise, unroll, parallelise, bind to GPU blocks/threads. Each step is recorded in `Kernel::schedule`
//! and printed as the dump's header, so a kernel dump shows the algorithm's loops and how they were
//! rearranged. Staging into shared memory and packing are done by lowering, which writes the copy loops.

use crate::ir::*;
use crate::step::ScheduleStep;

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("kernel @{kernel}: no loop %{var}")]
    NoLoop { kernel: String, var: String },
    #[error("kernel @{kernel}: {what}")]
    Invalid { kernel: String, what: String },
}

type Result<T> = std::result::Result<T, SchedError>;

fn find(body: &mut [Stmt], v: Var) -> Option<&mut Stmt> {
    for s in body {
        match s {
            Stmt::For { var, .. } if *var == v => return Some(s),
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => {
                if let Some(f) = find(body, v) {
                    return Some(f);
                }
            }
            _ => {}
        }
    }
    None
}

fn no_loop(k: &Kernel, v: Var) -> SchedError {
    SchedError::NoLoop {
        kernel: k.name.clone(),
        var: k.vars.get(v.0 as usize).cloned().unwrap_or_default(),
    }
}

/// Splits loop `v` into `v.o` (extent / factor, rounded up) and `v.i` (factor); a guard keeps the
/// original range when the factor does not divide it.
pub fn split(k: &mut Kernel, v: Var, factor: u64) -> Result<(Var, Var)> {
    let name = k.var_name(v).to_string();
    let (outer, inner) = (k.var(format!("{name}.o")), k.var(format!("{name}.i")));
    let Some(Stmt::For {
        var,
        extent,
        kind,
        body,
    }) = find(&mut k.body, v)
    else {
        return Err(no_loop(k, v));
    };
    if factor == 0 {
        return Err(SchedError::Invalid {
            kernel: k.name.clone(),
            what: format!("split %{name} by 0"),
        });
    }
    let ext = *extent;
    let index = Expr::add(
        Expr::mul(Expr::var(outer), Expr::int(factor as i64)),
        Expr::var(inner),
    );
    let mut inner_body: Vec<Stmt> = body.iter().map(|s| s.subst(v, &index)).collect();
    if ext % factor != 0 {
        inner_body = vec![Stmt::If {
            cond: Expr::bin(BinOp::Lt, index, Expr::int(ext as i64)),
            then: inner_body,
        }];
    }
    let inner_loop = Stmt::For {
        var: inner,
        extent: factor,
        kind: LoopKind::Serial,
        body: inner_body,
    };
    *var = outer;
    *extent = ext.div_ceil(factor);
    *kind = LoopKind::Serial;
    *body = vec![inner_loop];
    k.schedule.push(ScheduleStep::Split { var: name, factor });
    Ok((outer, inner))
}

/// Peels the last `extent % factor` iterations of loop `v` into a loop `v.t` right after it, so `v`'s
/// extent becomes a multiple of `factor` (a vector width) without a guard. Returns the tail's variable,
/// or None when `factor` already divides the extent.
pub fn peel(k: &mut Kernel, v: Var, factor: u64) -> Result<Option<Var>> {
    let name = k.var_name(v).to_string();
    if factor == 0 {
        return Err(SchedError::Invalid {
            kernel: k.name.clone(),
            what: format!("peel %{name} by 0"),
        });
    }
    let Some(Stmt::For {
        extent,
        body: inner,
        ..
    }) = find(&mut k.body, v)
    else {
        return Err(no_loop(k, v));
    };
    let (main, rest) = (*extent - *extent % factor, *extent % factor);
    if rest == 0 {
        return Ok(None);
    }
    let inner = inner.clone();
    let tail = k.var(format!("{name}.t"));
    // The tail gets its own copy of each local buffer used only inside the loop (an accumulator of a
    // fold nested in it), so either loop may later run in vector lanes with lane-private copies.
    let at = Expr::add(Expr::var(tail), Expr::int(main as i64));
    let mut tail_body: Vec<Stmt> = inner.iter().map(|s| s.subst(v, &at)).collect();
    for b in crate::analysis::private_locals(k, &inner) {
        let old = k.buffer(b).clone();
        let copy = k.buf(
            format!("{}.t", old.name),
            old.elem,
            old.dims.clone(),
            old.space,
        );
        tail_body = tail_body.iter().map(|s| rename(s, b, copy)).collect();
    }
    /// Shortens loop `v` to `main` and inserts the tail loop right after it.
    fn walk(
        body: &mut Vec<Stmt>,
        v: Var,
        tail: Var,
        main: u64,
        rest: u64,
        tail_body: &[Stmt],
    ) -> bool {
        for i in 0..body.len() {
            let inner = match &mut body[i] {
                Stmt::For { var, extent, .. } if *var == v => {
                    *extent = main;
                    body.insert(
                        i + 1,
                        Stmt::For {
                            var: tail,
                            extent: rest,
                            kind: LoopKind::Serial,
                            body: tail_body.to_vec(),
                        },
                    );
                    return true;
                }
                Stmt::For { body: inner, .. } | Stmt::If { then: inner, .. } => inner,
                _ => continue,
            };
            if walk(inner, v, tail, main, rest, tail_body) {
                return true;
            }
        }
        false
    }
    walk(&mut k.body, v, tail, main, rest, &tail_body);
    k.schedule.push(ScheduleStep::Peel { var: name, factor });
    Ok(Some(tail))
}

/// `s` with every load and store of buffer `from` going to `to` instead (loads rewritten once, by
/// `map_loads` over the whole statement; stores by a walk).
pub(crate) fn rename(s: &Stmt, from: BufId, to: BufId) -> Stmt {
    fn stores(s: Stmt, from: BufId, to: BufId) -> Stmt {
        match s {
            Stmt::Store { buf, index, value } => Stmt::Store {
                buf: if buf == from { to } else { buf },
                index,
                value,
            },
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => Stmt::For {
                var,
                extent,
                kind,
                body: body.into_iter().map(|x| stores(x, from, to)).collect(),
            },
            Stmt::If { cond, then } => Stmt::If {
                cond,
                then: then.into_iter().map(|x| stores(x, from, to)).collect(),
            },
            other => other,
        }
    }
    stores(
        s.map_loads(&|b, ix| Expr::load(if b == from { to } else { b }, ix)),
        from,
        to,
    )
}

/// Interchanges loop `a` with loop `b`, which must be the only statement of `a`'s body.
pub fn reorder(k: &mut Kernel, a: Var, b: Var) -> Result<()> {
    let (na, nb) = (k.var_name(a).to_string(), k.var_name(b).to_string());
    let kernel = k.name.clone();
    let Some(Stmt::For {
        var,
        extent,
        kind,
        body,
    }) = find(&mut k.body, a)
    else {
        return Err(no_loop(k, a));
    };
    match body.as_mut_slice() {
        [Stmt::For {
            var: vb,
            extent: eb,
            kind: kb,
            ..
        }] if *vb == b => {
            std::mem::swap(var, vb);
            std::mem::swap(extent, eb);
            std::mem::swap(kind, kb);
        }
        _ => {
            return Err(SchedError::Invalid {
                kernel,
                what: format!("%{nb} is not the only statement in %{na}"),
            })
        }
    }
    k.schedule.push(ScheduleStep::Reorder {
        outer: na,
        inner: nb,
    });
    Ok(())
}

/// Sets the kind of loop `v`: vector (its extent must be a multiple of the width), unrolled, parallel,
/// GPU block or thread.
pub fn set_kind(k: &mut Kernel, v: Var, to: LoopKind) -> Result<()> {
    let name = k.var_name(v).to_string();
    let kernel = k.name.clone();
    let Some(Stmt::For { extent, kind, .. }) = find(&mut k.body, v) else {
        return Err(no_loop(k, v));
    };
    if let LoopKind::Vector(w) = to {
        if w == 0 || *extent % w as u64 != 0 {
            return Err(SchedError::Invalid {
                kernel,
                what: format!("vector<{w}> on %{name} of extent {extent}"),
            });
        }
    }
    *kind = to;
    k.schedule.push(ScheduleStep::Kind {
        var: name,
        kind: to,
    });
    Ok(())
}

/// Tiles the perfectly nested loops `a` (outer) and `b` into `a.o, b.o, a.i, b.i`.
pub fn tile(k: &mut Kernel, a: Var, b: Var, fa: u64, fb: u64) -> Result<[Var; 4]> {
    let (ao, ai) = split(k, a, fa)?;
    let (bo, bi) = split(k, b, fb)?;
    reorder(k, ai, bo)?;
    Ok([ao, bo, ai, bi])
}

/// Rewrites every `mma` into the loops it stands for (i, j, then the k reduction into a local of the
/// accumulator type), for targets without a matrix engine for it: all but those on operands of a type
/// in `keep`.
pub fn mma_to_loops(k: &mut Kernel, keep: &[Elem]) {
    let body = std::mem::take(&mut k.body);
    k.body = expand(k, body, keep);
}

fn expand(k: &mut Kernel, body: Vec<Stmt>, keep: &[Elem]) -> Vec<Stmt> {
    body.into_iter()
        .map(|s| match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => Stmt::For {
                var,
                extent,
                kind,
                body: expand(k, body, keep),
            },
            Stmt::If { cond, then } => Stmt::If {
                cond,
                then: expand(k, then, keep),
            },
            Stmt::Mma { ref a, .. } if keep.contains(&k.buffer(a.buf).elem) => s,
            Stmt::Mma {
                m,
                n,
                k: depth,
                c,
                a,
                b,
                acc,
                ahead: _,
            } => {
                let id = k.vars.len();
                let (i, j, p) = (
                    k.var(format!("mi{id}")),
                    k.var(format!("mj{id}")),
                    k.var(format!("mp{id}")),
                );
                // Sums in the accumulator type: f32 for bf16, i32 (wrapping) for i16.
                let t = crate::ir::mma_acc(k.buffer(a.buf).elem).unwrap_or(Elem::F32);
                let sum = k.buf(format!("mma{id}"), t, vec![], crate::Space::Local);
                let (iv, jv, pv) = (Expr::var(i), Expr::var(j), Expr::var(p));
                let wide = |e: Expr| Expr::cast(t, e);
                let start = if acc {
                    Expr::load(c.buf, c.index(iv.clone(), jv.clone()))
                } else if t == Elem::F32 {
                    Expr::f32(0.0)
                } else {
                    Expr::cast(t, Expr::int(0))
                };
                let bcol = Expr::add(
                    Expr::mul(Expr::int(2), jv.clone()),
                    Expr::rem(pv.clone(), Expr::int(2)),
                );
                let (x, y) = (
                    wide(Expr::load(a.buf, a.index(iv.clone(), pv.clone()))),
                    wide(Expr::load(
                        b.buf,
                        b.index(Expr::div(pv, Expr::int(2)), bcol),
                    )),
                );
                let step = if t == Elem::F32 {
                    Expr::fma(x, y, Expr::load(sum, vec![]))
                } else {
                    Expr::add(Expr::load(sum, vec![]), Expr::mul(x, y))
                };
                let inner = vec![
                    Stmt::Store {
                        buf: sum,
                        index: vec![],
                        value: start,
                    },
                    Stmt::For {
                        var: p,
                        extent: depth,
                        kind: LoopKind::Serial,
                        body: vec![Stmt::Store {
                            buf: sum,
                            index: vec![],
                            value: step,
                        }],
                    },
                    Stmt::Store {
                        buf: c.buf,
                        index: c.index(iv, jv),
                        value: Expr::load(sum, vec![]),
                    },
                ];
                Stmt::For {
                    var: i,
                    extent: m,
                    kind: LoopKind::Serial,
                    body: vec![Stmt::For {
                        var: j,
                        extent: n,
                        kind: LoopKind::Serial,
                        body: inner,
                    }],
                }
            }
            s => s,
        })
        .collect()
}
