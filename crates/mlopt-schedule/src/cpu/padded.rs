//! Padded copies of a window's input for a CPU target: the zero- (or -inf-) padded plane a window
//! reads instead of its input, so its loads need no guard, split into phases along a strided row, so
//! they are contiguous (`padded_phases`, `padded_index`). Convolutions make them as part of their
//! implicit GEMM (`conv.rs`); `padded_windows` gives one to every fold over a guarded window left in
//! a kernel (a pooling's).

use super::tiler::{self, Builder};
use crate::error::Result;
use crate::window::recognise;
use mlopt_kir::index::{all, clamp, in_range, lit, window_pos};
use mlopt_kir::{BufId, Elem, Expr, LoopKind, Program, Space, Stmt, Var};
use mlopt_target::CpuTarget;

/// How a padded copy lays out its last axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plane {
    /// Split into this many phases (1: the plain padded copy).
    Phases(usize),
    /// One phase, the last two axes flattened into one row-major axis: a window over short rows reads
    /// the plane as one long row (`conv.rs`'s flat depthwise schedule).
    Flat,
}

/// What a padded copy holds at copy index [lead.., spatial..] (the spatial position inside the input).
pub(crate) type Read<'a> = &'a mut dyn FnMut(&mut Builder<'_>, &[Expr], &[Expr]) -> Result<Expr>;

/// The padded copy of an input with spatial dims `spatial`, its last axis split into `s` phases
/// (`Plane::Phases(s)`), [lead0, lead1, outer.., s, ceil(W' / s)]: element w of a padded row lands at
/// [w % s, w / s], so a stride-s window's taps read contiguous runs (tap kw of output column j is phase
/// kw % s, position j + kw / s). One phase is the plain padded copy; `Plane::Flat` is that copy with
/// its last two axes as one, [lead0, lead1, outer.., H' x W']. Each phase is written straight from
/// the input, read at stride s. The padding holds `fill` (0, or -inf for a max pool); `read` gives the input.
///
/// The leading dims are the caller's: the whole input's [N, C], or one image's few channels [1, c]:
/// made inside the loop over images and channel groups, such a copy stays in cache for the window that
/// reads it next (a depthwise convolution's or a pooling's plane), where a copy of the whole input
/// would go to memory and back.
#[allow(clippy::too_many_arguments)]
pub(crate) fn padded_phases(
    l: &mut Builder,
    lead: [u64; 2],
    spatial: &[i64],
    pads: &[usize],
    plane: Plane,
    fill: f64,
    read: Read,
    stmts: &mut Vec<Stmt>,
) -> Result<BufId> {
    let s = match plane {
        Plane::Phases(s) => s,
        Plane::Flat => 1,
    };
    let sp = spatial.len();
    let xs: Vec<i64> = [lead.map(|d| d as i64).to_vec(), spatial.to_vec()].concat();
    let (begin, end) = (&pads[..sp], &pads[sp..]);
    let last = xs.len() - 1;
    let (w, pl) = (xs[last], begin[sp - 1] as i64);
    // The right padding of the plain copy, widened so its rows are a whole number of phases.
    let row = (w + pl) as u64 + end[sp - 1] as u64;
    let pr = end[sp - 1] as i64 + (row.next_multiple_of(s as u64) - row) as i64;
    let padded: Vec<u64> = (0..xs.len())
        .map(|a| match a {
            0 | 1 => lead[a],
            a if a == last => (w + pl + pr) as u64,
            a => (xs[a] + (begin[a - 2] + end[a - 2]) as i64) as u64,
        })
        .collect();
    // One phase is the padded copy itself, [.., W']; s phases are [.., s, W' / s].
    let q = padded[last] / s as u64;
    let mut dims = padded[..last].to_vec();
    let name = match plane {
        Plane::Flat => "xflat",
        Plane::Phases(1) => "xpad",
        Plane::Phases(_) => "xphase",
    };
    match plane {
        Plane::Flat => {
            if let Some(rows) = dims.last_mut() {
                *rows *= q;
            }
        }
        Plane::Phases(1) => dims.push(q),
        Plane::Phases(_) => dims.extend([s as u64, q]),
    }
    let k = l.kernel();
    let xp = k.buf(
        format!("{name}{}", k.bufs.len()),
        Elem::F32,
        dims,
        Space::Local,
    );
    stmts.extend(tiler::nest(l, "p", &padded[..last], |l, idx| {
        // The input row this copy row holds: valid when every outer spatial position is inside.
        let pos: Vec<Expr> = (2..last)
            .map(|a| Expr::sub(idx[a].clone(), Expr::int(begin[a - 2] as i64)))
            .collect();
        let inside = all((2..last).map(|a| in_range(pos[a - 2].clone(), xs[a])));
        let mut st = Vec::new();
        // Phase p, position j holds padded column j * s + p, which is input column j * s + p - pl:
        // padding before column 0 (j < j0) and from column w on (j >= j1), the input row between, read
        // at stride s (one contiguous run for one phase).
        for p in 0..s as i64 {
            let at = |j: Expr| match plane {
                Plane::Flat => {
                    let row = Expr::mul(idx[last - 1].clone(), Expr::int(q as i64));
                    [idx[..last - 1].to_vec(), vec![Expr::add(row, j)]].concat()
                }
                Plane::Phases(1) => [idx.to_vec(), vec![j]].concat(),
                Plane::Phases(_) => [idx.to_vec(), vec![Expr::int(p), j]].concat(),
            };
            let first = |col: i64| {
                if col > p {
                    (col - p + s as i64 - 1) / s as i64
                } else {
                    0
                }
            };
            let (j0, j1) = (first(pl), first(pl + w));
            for (from, len) in [(0, j0), (j1, q as i64 - j1)] {
                if len > 0 {
                    st.extend(tiler::nest(l, "z", &[len as u64], |_, z| {
                        Ok(vec![Stmt::Store {
                            buf: xp,
                            index: at(Expr::add(Expr::int(from), z[0].clone())),
                            value: lit(fill, Elem::F32),
                        }])
                    })?);
                }
            }
            if j1 <= j0 {
                continue;
            }
            st.extend(tiler::nest(l, "c", &[(j1 - j0) as u64], |l, c| {
                let mut from: Vec<Expr> = (2..last)
                    .map(|a| clamp(pos[a - 2].clone(), xs[a]))
                    .collect();
                from.push(Expr::add(
                    Expr::mul(c[0].clone(), Expr::int(s as i64)),
                    Expr::int(j0 * s as i64 + p - pl),
                ));
                let v = read(l, &idx[..2], &from)?;
                let v = match &inside {
                    Some(ok) => Expr::select(ok.clone(), v, lit(fill, Elem::F32)),
                    None => v,
                };
                Ok(vec![Stmt::Store {
                    buf: xp,
                    index: at(Expr::add(Expr::int(j0), c[0].clone())),
                    value: v,
                }])
            })?);
        }
        Ok(st)
    })?);
    Ok(xp)
}

/// A 2-D window's input padded and split into phases along both axes (`phase_planes`), each phase
/// a plane of `dims` = [Hq, Wq] whose rows lie end to end, the planes one after another per channel:
/// [lead0, lead1, phases[0] x phases[1] x Hq x Wq]. Padded element (h, w) is in phase (h % s, w % s)
/// at (h / s, w / s), so a stride-s window reads each tap as a stride-1 window of one phase: output
/// (oh, ow) at flat column oh x Wq + ow reads `at(tap, column)`. An axis whose window has one tap
/// keeps only phase 0 (a strided 1x1 convolution's copy is the subsampled input); stride 1 is the
/// padded plane itself.
pub(crate) struct PhasePlanes {
    pub(crate) buf: BufId,
    pub(crate) phases: [u64; 2],
    pub(crate) strides: [u64; 2],
    pub(crate) dims: [u64; 2],
}

impl PhasePlanes {
    /// Phases in all.
    pub(crate) fn count(&self) -> u64 {
        self.phases[0] * self.phases[1]
    }

    /// The flat index tap offsets `taps` (tap x dilation per axis) of flat column `col` read.
    pub(crate) fn at(&self, taps: [Expr; 2], col: Expr) -> Expr {
        let [wq, plane] = [self.dims[1], self.dims[0] * self.dims[1]].map(|d| Expr::int(d as i64));
        let split = |a: usize, t: &Expr| match self.strides[a] {
            1 => (Expr::int(0), t.clone()),
            s => {
                let s = Expr::int(s as i64);
                (Expr::rem(t.clone(), s.clone()), Expr::div(t.clone(), s))
            }
        };
        let ((ph, dh), (pw, dw)) = (split(0, &taps[0]), split(1, &taps[1]));
        let mut at = Expr::add(Expr::add(Expr::mul(dh, wq), dw), col);
        let slot = match self.phases {
            [1, 1] => None,
            [1, _] => Some(pw),
            [_, 1] => Some(ph),
            [_, n] => Some(Expr::add(Expr::mul(ph, Expr::int(n as i64)), pw)),
        };
        if let Some(slot) = slot {
            at = Expr::add(Expr::mul(slot, plane), at);
        }
        at
    }
}

/// The phases kept per axis and each plane's [Hq, Wq] for the phase planes (`PhasePlanes`) of a 2-D
/// input `spatial` padded by `pads` ([top, left, bottom, right]) for a window of `strides` with `taps`
/// taps per axis: what `phase_planes` copies, and what the schedules that read or price it count.
pub(crate) fn phase_dims(
    spatial: [i64; 2],
    pads: &[usize],
    strides: [u64; 2],
    taps: [u64; 2],
) -> ([u64; 2], [u64; 2]) {
    let phases = [0, 1].map(|a| if taps[a] == 1 { 1 } else { strides[a] });
    let padded = [0, 1].map(|a| spatial[a] as u64 + (pads[a] + pads[a + 2]) as u64);
    (phases, [0, 1].map(|a| padded[a].div_ceil(strides[a])))
}

/// The phase planes (`PhasePlanes`) of a 2-D input `spatial` padded by `pads` ([top, left, bottom,
/// right]) for a window of `strides` with `taps` taps per axis, `fill` in the padding, `read` giving
/// the input. Each phase row is a run of padding, the input row read at stride s, and padding; the
/// padding rows above and below are filled whole.
#[allow(clippy::too_many_arguments)]
pub(crate) fn phase_planes(
    l: &mut Builder,
    lead: [u64; 2],
    spatial: [i64; 2],
    pads: &[usize],
    strides: [u64; 2],
    taps: [u64; 2],
    fill: f64,
    read: Read,
    stmts: &mut Vec<Stmt>,
) -> Result<PhasePlanes> {
    let (phases, dims) = phase_dims(spatial, pads, strides, taps);
    let k = l.kernel();
    let count = phases[0] * phases[1];
    let buf = k.buf(
        format!("xflat{}", k.bufs.len()),
        Elem::F32,
        vec![lead[0], lead[1], count * dims[0] * dims[1]],
        Space::Local,
    );
    let planes = PhasePlanes {
        buf,
        phases,
        strides,
        dims,
    };
    // Along axis a, phase p's positions from the first holding input to the first past it.
    let inside = |a: usize, p: u64| {
        let first = |at: i64| ((at - p as i64).max(0) as u64).div_ceil(strides[a]);
        let (begin, end) = (first(pads[a] as i64), first(pads[a] as i64 + spatial[a]));
        (begin.min(dims[a]), end.min(dims[a]).max(begin.min(dims[a])))
    };
    stmts.extend(tiler::nest(l, "p", &lead, |l, lead_ix| {
        let mut st = Vec::new();
        for ph in 0..phases[0] {
            for pw in 0..phases[1] {
                let base = (ph * phases[1] + pw) * dims[0] * dims[1];
                let at = |i: Expr, j: Expr| {
                    let flat = Expr::add(Expr::mul(i, Expr::int(dims[1] as i64)), j);
                    let ix = Expr::add(Expr::int(base as i64), flat);
                    vec![lead_ix[0].clone(), lead_ix[1].clone(), ix]
                };
                let (rows, cols) = (inside(0, ph), inside(1, pw));
                let zero = |l: &mut Builder, i0: u64, n: u64, j0: u64, m: u64| {
                    tiler::nest(l, "z", &[n, m], |_, z| {
                        let i = Expr::add(Expr::int(i0 as i64), z[0].clone());
                        let j = Expr::add(Expr::int(j0 as i64), z[1].clone());
                        Ok(vec![Stmt::Store {
                            buf,
                            index: at(i, j),
                            value: lit(fill, Elem::F32),
                        }])
                    })
                };
                let body_rows = rows.1 - rows.0;
                for (i0, n) in [(0, rows.0), (rows.1, dims[0] - rows.1)] {
                    if n > 0 {
                        st.extend(zero(l, i0, n, 0, dims[1])?);
                    }
                }
                if body_rows == 0 {
                    continue;
                }
                for (j0, m) in [(0, cols.0), (cols.1, dims[1] - cols.1)] {
                    if m > 0 {
                        st.extend(zero(l, rows.0, body_rows, j0, m)?);
                    }
                }
                let run = cols.1 - cols.0;
                if run == 0 {
                    continue;
                }
                st.extend(tiler::nest(l, "c", &[body_rows, run], |l, c| {
                    let i = Expr::add(Expr::int(rows.0 as i64), c[0].clone());
                    let j = Expr::add(Expr::int(cols.0 as i64), c[1].clone());
                    let from = [(0, &i, ph), (1, &j, pw)].map(|(a, x, p)| {
                        let at = Expr::mul(x.clone(), Expr::int(strides[a] as i64));
                        Expr::add(at, Expr::int(p as i64 - pads[a] as i64))
                    });
                    let v = read(l, lead_ix, &from)?;
                    Ok(vec![Stmt::Store {
                        buf,
                        index: at(i, j),
                        value: v,
                    }])
                })?);
            }
        }
        Ok(st)
    })?);
    Ok(planes)
}

/// Where window tap `taps` of output position `pos` lies in a padded copy (`padded_phases`, its last axis
/// split into `phases`): `pos * stride + tap * dilation` per axis (the padding is already in the copy),
/// the last axis as [phase, position], i.e. [(tap * d) % s, pos + (tap * d) / s] for s phases.
pub(crate) fn padded_index(
    pos: &[Expr],
    taps: &[Expr],
    strides: &[usize],
    dilations: &[usize],
    phases: usize,
) -> Vec<Expr> {
    let sp = pos.len();
    let mut xi: Vec<Expr> = (0..sp)
        .map(|a| window_pos(&pos[a], &taps[a], strides[a], dilations[a], 0))
        .collect();
    if phases > 1 {
        xi.pop();
        let tap = Expr::mul(taps[sp - 1].clone(), Expr::int(dilations[sp - 1] as i64));
        xi.push(Expr::rem(tap.clone(), Expr::int(phases as i64)));
        xi.push(Expr::add(
            pos[sp - 1].clone(),
            Expr::div(tap, Expr::int(phases as i64)),
        ));
    }
    xi
}

/// Every fold over a guarded window left in a kernel's loop nests (a pooling's: `acc = op(acc,
/// select(guard, x[.., clamp(..)], fill))` over the taps) reads a padded copy of its input instead,
/// holding `fill` (-inf or 0) in the padding and the ceil-mode overhang, in phases along a strided row.
/// The copy is made inside the loops the input depends on (one plane per image and channel), so the
/// window reads it from cache.
pub(crate) fn padded_windows(p: &mut Program, target: &CpuTarget) -> Result<()> {
    for k in &mut p.kernels {
        let mut body = std::mem::take(&mut k.body);
        for st in &mut body {
            pad_nest(&mut Builder { k, target }, st)?;
        }
        k.body = body;
    }
    Ok(())
}

/// `st` as a perfect nest of serial loops around a body: the loops, and the body.
fn perfect(st: &mut Stmt) -> (Vec<(Var, u64)>, &mut Vec<Stmt>) {
    let Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    } = st
    else {
        unreachable!("perfect() takes a serial loop")
    };
    let mut loops = vec![(*var, *extent)];
    let mut cur = body;
    while matches!(
        &cur[..],
        [Stmt::For {
            kind: LoopKind::Serial,
            ..
        }]
    ) {
        let Some(Stmt::For {
            var, extent, body, ..
        }) = cur.first_mut()
        else {
            unreachable!()
        };
        loops.push((*var, *extent));
        cur = body;
    }
    (loops, cur)
}

fn pad_nest(b: &mut Builder, st: &mut Stmt) -> Result<()> {
    if !matches!(
        st,
        Stmt::For {
            kind: LoopKind::Serial,
            ..
        }
    ) {
        return Ok(());
    }
    let (outs, inner) = perfect(st);
    // The fold: a serial nest of taps whose body combines a guarded window operand.
    let Some(fold) = inner.iter_mut().find(|s| {
        matches!(
            s,
            Stmt::For {
                kind: LoopKind::Serial,
                ..
            }
        )
    }) else {
        return Ok(());
    };
    let (taps, update) = perfect(fold);
    let mut candidates = Vec::new();
    for s in update.iter() {
        if let Stmt::Store { value, .. } = s {
            selects(value, &mut candidates);
        }
    }
    let loops: Vec<Var> = outs.iter().chain(&taps).map(|(v, _)| *v).collect();
    let Some((operand, w)) = candidates.into_iter().find_map(|e| {
        Some((
            e.clone(),
            recognise(b.k, &e, &taps, &outs, &loops, &|_| true)?,
        ))
    }) else {
        return Ok(());
    };
    // The copy goes inside the loops the input reads, which must all enclose the output positions.
    let used: Vec<usize> = (0..outs.len())
        .filter(|i| w.input.uses(outs[*i].0))
        .collect();
    let first_out = w
        .axes
        .iter()
        .filter_map(|a| outs.iter().position(|(v, _)| *v == a.out))
        .min()
        .unwrap_or(0);
    let Some(&depth) = used.last().filter(|d| **d < first_out) else {
        return Ok(());
    };
    let strides: Vec<usize> = w.axes.iter().map(|a| a.stride as usize).collect();
    let dilations: Vec<usize> = w.axes.iter().map(|a| a.dilation as usize).collect();
    let lens: Vec<i64> = w.axes.iter().map(|a| a.len).collect();
    let mut pads: Vec<usize> = w.axes.iter().map(|a| a.pad as usize).collect();
    pads.extend(
        w.axes
            .iter()
            .map(|a| (a.span - a.pad - a.len).max(0) as usize),
    );
    let phases = strides[strides.len() - 1];
    let mut copy = Vec::new();
    let read: Read = &mut |_, _, pos| Ok(w.input_at(&w.input, pos));
    let plane = Plane::Phases(phases);
    let xp = padded_phases(b, [1, 1], &lens, &pads, plane, w.fill, read, &mut copy)?;
    let pos: Vec<Expr> = w.axes.iter().map(|a| Expr::var(a.out)).collect();
    let tap: Vec<Expr> = w.axes.iter().map(|a| Expr::var(a.tap)).collect();
    let load = Expr::load(
        xp,
        [
            vec![Expr::int(0), Expr::int(0)],
            padded_index(&pos, &tap, &strides, &dilations, phases),
        ]
        .concat(),
    );
    for s in update.iter_mut() {
        *s = s.map_exprs(&|e| e.replace(&operand, &load));
    }
    // Into the loop at `depth`, before everything it holds.
    let mut cur = st;
    for _ in 0..depth {
        let Stmt::For { body, .. } = cur else {
            unreachable!("the nest is perfect to the output positions")
        };
        cur = &mut body[0];
    }
    let Stmt::For { body, .. } = cur else {
        unreachable!("the nest is perfect to the output positions")
    };
    copy.append(body);
    *body = copy;
    let name = b.k.buffer(xp).name.clone();
    b.k.schedule.push(mlopt_kir::ScheduleStep::Pad {
        buf: name,
        phases: phases as u64,
    });
    Ok(())
}

/// The selects in `e` with a float constant where they are false (guarded operands).
fn selects(e: &Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::Select(c, a, z) => {
            if matches!(**z, Expr::Float(..)) {
                out.push(e.clone());
            }
            [c, a, z].into_iter().for_each(|x| selects(x, out));
        }
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => {}
        Expr::Load(_, ix) => ix.iter().for_each(|x| selects(x, out)),
        Expr::Unary(_, a) | Expr::Cast(_, a) => selects(a, out),
        Expr::Binary(_, a, b) => {
            selects(a, out);
            selects(b, out);
        }
        Expr::Fma(a, b, c) => [a, b, c].into_iter().for_each(|x| selects(x, out)),
    }
}
