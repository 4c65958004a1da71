//! Windows in the algorithm lowering writes: a convolution's or a pooling's input read at
//! `out * stride + tap * dilation - pad` per spatial axis, clamped into the input and guarded where the
//! window can leave it. They are recognised here (`class.rs` asks about a contraction's operand,
//! `cpu/padded.rs` about a pooling's fold), and the CPU schedule reads a padded copy of the input
//! instead (`cpu/padded.rs`), whose loads need no guard and, in phases along a strided row, are
//! contiguous.

use mlopt_kir::analysis::{coefficient, for_each_load, offset};
use mlopt_kir::index::{all, in_range};
use mlopt_kir::{BinOp, Elem, Expr, Kernel, Var};

/// One spatial axis of a window: input position `out * stride + tap * dilation - pad`.
pub(crate) struct Axis {
    pub(crate) out: Var,
    pub(crate) outs: u64,
    pub(crate) tap: Var,
    pub(crate) stride: i64,
    pub(crate) dilation: i64,
    pub(crate) pad: i64,
    /// The input's length along the axis (for an unguarded axis: as far as the window reaches).
    pub(crate) len: i64,
    /// How far the windows reach, from the first position of the first (padding included).
    pub(crate) span: i64,
    pub(crate) guarded: bool,
}

/// A window recognised in an operand.
pub(crate) struct Window {
    pub(crate) axes: Vec<Axis>,
    /// The input at a window position: the operand with each axis's (clamped) position replaced by a
    /// variable of `at`.
    pub(crate) input: Expr,
    pub(crate) at: Vec<Var>,
    /// What the operand is outside the input (0 where it is not guarded).
    pub(crate) fill: f64,
}

impl Window {
    /// The loops of convolution `c` outside its window: the batch and any column that is not an
    /// output position (the image, a group).
    pub(crate) fn outer_loops(&self, c: &crate::contraction::Contraction) -> Vec<(Var, u64)> {
        c.batch
            .iter()
            .chain(
                c.cols
                    .iter()
                    .filter(|(v, _)| !self.axes.iter().any(|a| a.out == *v)),
            )
            .copied()
            .collect()
    }

    /// `input` (the window's input, its other loops perhaps replaced) at input position `pos`.
    pub(crate) fn input_at(&self, input: &Expr, pos: &[Expr]) -> Expr {
        input.subst_all(
            &self
                .at
                .iter()
                .copied()
                .zip(pos.iter().cloned())
                .collect::<Vec<_>>(),
        )
    }
}

/// The window `operand` reads: one tap loop of `taps` per spatial axis, each axis reading the input at
/// an affine position of one loop of `outs` (its output position) and its tap, with no other loop of
/// `loops`, clamped into the input (with the operand `fill` outside it, `select(guard, x, fill)`)
/// exactly where it can leave, and the guard exactly the window's own test. The input is the operand
/// with each position replaced by a fresh variable (`at`), and must read no tap or output position.
/// `keep` may refuse the axes before anything is added to the kernel.
pub(crate) fn recognise(
    k: &mut Kernel,
    operand: &Expr,
    taps: &[(Var, u64)],
    outs: &[(Var, u64)],
    loops: &[Var],
    keep: &dyn Fn(&[Axis]) -> bool,
) -> Option<Window> {
    let sp = taps.len();
    let (guard, body, fill) = match operand {
        Expr::Select(cond, e, z) => match &**z {
            Expr::Float(f, Elem::F32) => (Some(&**cond), &**e, *f),
            // An integer contraction's zero (`lit(0, i32)`).
            Expr::Cast(Elem::I32, v) if **v == Expr::Int(0) => (Some(&**cond), &**e, 0.0),
            _ => return None,
        },
        e => (None, e, 0.0),
    };
    let mut axes = Vec::with_capacity(sp);
    let mut places = Vec::with_capacity(sp);
    for &(tap, taps) in taps {
        // The first index that reads the tap is the axis's position; the operand must read it there only.
        let mut first = None;
        for_each_load(body, &mut |_, ix| {
            first = first
                .take()
                .or_else(|| ix.iter().find(|e| e.uses(tap)).cloned())
        });
        let place = first?;
        let (pos, len) = match &place {
            Expr::Binary(BinOp::Max, lo, z) if **z == Expr::int(0) => match &**lo {
                Expr::Binary(BinOp::Min, p, hi) => match **hi {
                    Expr::Int(hi) => ((**p).clone(), Some(hi + 1)),
                    _ => return None,
                },
                _ => return None,
            },
            p => (p.clone(), None),
        };
        let &(out, outs) = outs.iter().find(|(v, _)| pos.uses(*v))?;
        let (stride, dilation, pad) = (
            coefficient(&pos, out)?,
            coefficient(&pos, tap)?,
            -offset(&pos)?,
        );
        if stride < 1
            || dilation < 1
            || pad < 0
            || loops.iter().any(|v| *v != out && *v != tap && pos.uses(*v))
        {
            return None;
        }
        let span = (outs as i64 - 1)
            .checked_mul(stride)?
            .checked_add((taps as i64 - 1).checked_mul(dilation)?)?
            .checked_add(1)?;
        // An unguarded axis is as long as the shortest buffer the position indexes directly, or as far
        // as the windows reach where it is also part of a computed index.
        let (mut shortest, mut computed) = (i64::MAX, false);
        for_each_load(body, &mut |b, ix| {
            for (d, e) in ix.iter().enumerate() {
                if *e == place {
                    shortest = shortest.min(k.buffer(b).dims[d] as i64);
                } else if e.uses(tap) {
                    computed = true;
                }
            }
        });
        let len = match len {
            Some(len) if len > 0 => len,
            None if pad == 0 && computed => span,
            None if pad == 0 && shortest >= span && shortest < i64::MAX => shortest,
            _ => return None,
        };
        axes.push(Axis {
            out,
            outs,
            tap,
            stride,
            dilation,
            pad,
            len,
            span,
            guarded: place != pos,
        });
        places.push(place);
    }
    // The guard must be the window's own: inside the input along every clamped axis.
    let expected = all(axes
        .iter()
        .zip(&places)
        .filter(|(a, _)| a.guarded)
        .map(|(a, p)| match p {
            Expr::Binary(_, lo, _) => match &**lo {
                Expr::Binary(_, pos, _) => in_range((**pos).clone(), a.len),
                _ => unreachable!("a guarded place is max(min(pos, hi), 0)"),
            },
            _ => unreachable!("a guarded place is max(min(pos, hi), 0)"),
        }));
    if expected.as_ref() != guard {
        return None;
    }
    // Distinct output positions.
    let outs: Vec<Var> = axes.iter().map(|a| a.out).collect();
    if !keep(&axes) || (1..sp).any(|s| outs[..s].contains(&outs[s])) {
        return None;
    }
    let at: Vec<Var> = (0..sp)
        .map(|s| k.var(format!("x{}_{s}", k.vars.len())))
        .collect();
    let input = places
        .iter()
        .zip(&at)
        .fold(body.clone(), |e, (p, v)| e.replace(p, &Expr::var(*v)));
    if axes.iter().any(|a| input.uses(a.out) || input.uses(a.tap)) {
        return None;
    }
    Some(Window {
        axes,
        input,
        at,
        fill,
    })
}
