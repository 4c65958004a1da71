//! Quantized contractions. A QDQ model (ONNX Runtime's `quantize_static`, PyTorch's PT2E export)
//! writes each quantized Conv or MatMul as the float op over dequantized operands,
//! `conv((f32(x) - zx) * sx, (f32(w) - zw) * sw)` with `x` and `w` 8-bit; the sum it stands for is
//! `sx * sw[m] * sum((x - zx) (w - zw))`, an integer contraction. This rule adds that form:
//!
//! ```text
//! conv(A, W, b)  =>  f32(conv(i16(x) - zx, i16(w) - zw)) * (sx * sw[m]) + b     (the sum in i32)
//! ```
//!
//! where A's scale is per tensor and W's per output channel (or per tensor), so they factor out of the
//! sum; the 8-bit values less their zero points are exact in i16 and their products' sums in i32 (the
//! integer dot product's `mma` blocks, `mlopt-schedule/src/cpu/mma.rs`). Only where the target has
//! an integer dot product (`RuleSet::integer`), for convolutions of one group and products whose
//! depth and columns fill the blocks; extraction then picks whichever form the cost model prices
//! lower. The integer form computes the sum the model specifies exactly, where the float one rounds.

use super::{add, ops, scan, ty};
use crate::lang::{EGraph, Rewrite};
use egg::Id;
use mlopt_ir::{Binary, DType, Op, TensorType};

pub fn rules() -> Vec<Rewrite> {
    vec![scan(
        "integer-contraction",
        |eg, id| candidates(eg, id).next().is_some(),
        |eg, id| {
            let found: Vec<(Op, Vec<Id>)> = candidates(eg, id).collect();
            found
                .into_iter()
                .filter_map(|(op, ch)| integer(eg, op, &ch))
                .collect()
        },
    )]
}

/// A dequantized value `(f32(q) - z) * s` (or `f32(q) * s`): q 8-bit, z and s constants.
struct Dequantized {
    q: Id,
    zero: Option<Id>,
    scale: Id,
}

/// Conv (one group) and MatMul nodes of class `id` over f32 operands.
fn candidates(eg: &EGraph, id: Id) -> impl Iterator<Item = (Op, Vec<Id>)> + '_ {
    ops(eg, id).into_iter().filter(|(op, ch)| {
        let f32_in = ty(eg, ch[0]).is_some_and(|t| t.dtype == DType::F32);
        f32_in
            && match op {
                Op::Conv(a) => a.group == 1,
                Op::MatMul => true,
                _ => false,
            }
    })
}

/// Class `id` as a dequantized value, when it has that form.
fn dequantized(eg: &EGraph, id: Id) -> Option<Dequantized> {
    let eight_bit = |c: Id| ty(eg, c).is_some_and(|t| matches!(t.dtype, DType::U8 | DType::I8));
    let widened = |c: Id| -> Option<Id> {
        ops(eg, c).into_iter().find_map(|(op, ch)| match op {
            Op::Cast { to: DType::F32 } if eight_bit(ch[0]) => Some(ch[0]),
            _ => None,
        })
    };
    let constant = |c: Id| eg[c].data.value.is_some();
    ops(eg, id).into_iter().find_map(|(op, ch)| {
        let Op::Binary(Binary::Mul) = op else {
            return None;
        };
        let [x, s] = ch[..] else { return None };
        if !constant(s) {
            return None;
        }
        if let Some(q) = widened(x) {
            return Some(Dequantized {
                q,
                zero: None,
                scale: s,
            });
        }
        ops(eg, x)
            .into_iter()
            .find_map(|(op, ch)| match (op, &ch[..]) {
                (Op::Binary(Binary::Sub), &[c, z]) if constant(z) => Some(Dequantized {
                    q: widened(c)?,
                    zero: Some(z),
                    scale: s,
                }),
                _ => None,
            })
    })
}

/// Whether constant class `id` is a scalar (or one element).
fn scalar(eg: &EGraph, id: Id) -> bool {
    ty(eg, id).is_some_and(|t| t.numel() == 1)
}

/// The shape a per-output-channel parameter of class `id` has when it varies only along `axis` of a
/// rank-`rank` operand with `n` elements there (or is one value): the scale then factors out of the
/// contraction's sum.
fn along(eg: &EGraph, id: Id, axis: usize, n: usize, rank: usize) -> bool {
    let Some(t) = ty(eg, id) else { return false };
    if t.numel() == 1 {
        return true;
    }
    let s = &t.shape;
    // Right-aligned against the operand: size n at `axis`, 1 elsewhere.
    s.len() <= rank
        && s.iter().enumerate().all(|(i, &d)| {
            let at = rank - s.len() + i;
            if at == axis {
                d == n
            } else {
                d == 1
            }
        })
}

/// `i16(q) - i16(z)` (`q` alone without a zero point, or with one that is zero: a symmetric weight's,
/// whose subtraction would fold over every element for nothing).
fn centred(eg: &mut EGraph, d: &Dequantized) -> Option<Id> {
    let q = add(eg, Op::Cast { to: DType::I16 }, vec![d.q])?;
    let zero = d.zero.filter(|&z| super::splat(eg, z) != Some(0.0));
    match zero {
        Some(z) => {
            let z = add(eg, Op::Cast { to: DType::I16 }, vec![z])?;
            add(eg, Op::Binary(Binary::Sub), vec![q, z])
        }
        None => Some(q),
    }
}

/// The range of `q - z`: `q`'s values where it is a constant, else its type's, less `z`'s values.
fn span(eg: &EGraph, q: Id, z: Option<Id>) -> Option<(f64, f64)> {
    let values = |c: Id| -> Option<(f64, f64)> {
        let v = eg[c].data.value.as_ref()?.to_f64_vec();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo <= hi).then_some((lo, hi))
    };
    let (qlo, qhi) = match values(q) {
        Some(r) => r,
        None => match ty(eg, q)?.dtype {
            DType::U8 => (0.0, 255.0),
            DType::I8 => (-128.0, 127.0),
            _ => return None,
        },
    };
    let (zlo, zhi) = match z {
        Some(z) => values(z)?,
        None => (0.0, 0.0),
    };
    Some((qlo - zhi, qhi - zlo))
}

/// The integer form of `op` over children `ch`, when its operands are dequantized as the rule needs.
fn integer(eg: &mut EGraph, op: Op, ch: &[Id]) -> Option<Id> {
    let (a, w) = (dequantized(eg, ch[0])?, dequantized(eg, ch[1])?);
    let wt: TensorType = ty(eg, ch[1])?;
    // A per tensor (its zero point an integer that i16 holds), W a constant.
    let zero_ok = |eg: &EGraph, z: Option<Id>| {
        z.is_none_or(|z| {
            eg[z].data.value.as_ref().is_some_and(|v| {
                v.to_f64_vec()
                    .iter()
                    .all(|x| x.fract() == 0.0 && x.abs() <= 255.0)
            })
        })
    };
    if !scalar(eg, a.scale)
        || a.zero.is_some_and(|z| !scalar(eg, z))
        || !zero_ok(eg, a.zero)
        || !zero_ok(eg, w.zero)
        || eg[w.q].data.value.is_none()
    {
        return None;
    }
    // W's scale and zero point per output channel: axis 0 of a convolution's [M, C, ...], the last of
    // a MatMul's [K, N]; the depth and columns fill the blocks.
    let (axis, n, depth) = match &op {
        Op::Conv(_) => (0, wt.shape[0], wt.shape[1..].iter().product::<usize>()),
        _ if wt.rank() == 2 => (1, wt.shape[1], wt.shape[0]),
        _ => return None,
    };
    let per_channel =
        |eg: &EGraph, p: Option<Id>| p.is_none_or(|p| along(eg, p, axis, n, wt.rank()));
    if !per_channel(eg, Some(w.scale)) || !per_channel(eg, w.zero) || depth < 16 || n < 16 {
        return None;
    }
    // Every partial sum must fit i32 (the blocks' sums wrap): depth x the largest |x - zx| x the
    // largest |w - zw|, from A's type and W's values.
    let (lo, hi) = span(eg, a.q, a.zero)?;
    let (wlo, whi) = span(eg, w.q, w.zero)?;
    let bound = depth as f64 * lo.abs().max(hi.abs()) * wlo.abs().max(whi.abs());
    if bound >= 2f64.powi(31) {
        return None;
    }
    let (x16, w16) = (centred(eg, &a)?, centred(eg, &w)?);
    let sum = add(eg, op.clone(), vec![x16, w16])?;
    let sum = add(eg, Op::Cast { to: DType::F32 }, vec![sum])?;
    // The scales' product, laid along the output's channels: axis 1 of a convolution's output, the last
    // of a MatMul's.
    let scale = add(eg, Op::Binary(Binary::Mul), vec![a.scale, w.scale])?;
    let out_rank = ty(eg, sum)?.rank();
    let scale = if scalar(eg, scale) {
        scale
    } else {
        let mut shape = vec![
            1;
            if matches!(op, Op::Conv(_)) {
                out_rank
            } else {
                1
            }
        ];
        shape[if matches!(op, Op::Conv(_)) { 1 } else { 0 }] = n;
        add(eg, Op::Reshape { shape }, vec![scale])?
    };
    let mut y = add(eg, Op::Binary(Binary::Mul), vec![sum, scale])?;
    if let Some(&b) = ch.get(2).filter(|&&b| !eg[b].data.types.is_empty()) {
        let mut shape = vec![1; out_rank];
        shape[1] = n;
        let b = add(eg, Op::Reshape { shape }, vec![b])?;
        y = add(eg, Op::Binary(Binary::Add), vec![y, b])?;
    }
    Some(y)
}
