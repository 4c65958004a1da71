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
//! an integer dot product (`RuleSet::integer`), for convolutions of one group, MatMuls and Gemms (A
//! not transposed, alpha and beta 1) whose depth and columns fill the blocks (`integer_shape`);
//! extraction then picks whichever form the cost model prices lower. The integer form computes the
//! sum the model specifies exactly, where the float one rounds.

use super::{add, konst, ops, scan, ty};
use crate::lang::{EGraph, Rewrite};
use egg::Id;
use mlopt_ir::{Binary, DType, Nary, Op, TensorType};

/// The integer contraction, where the target has an integer dot product (`RuleSet::integer`).
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

/// Exact simplifications of quantized values, on every target (with the algebra rules).
pub fn requantize_rules() -> Vec<Rewrite> {
    vec![scan(
        "requantize-same-scale",
        |eg, id| !requantized(eg, id).is_empty(),
        |eg, id| {
            requantized(eg, id)
                .into_iter()
                .filter_map(|(q, relu)| match relu {
                    None => Some(q),
                    Some(z) => {
                        let z = konst(eg, z);
                        add(eg, Op::Nary(Nary::Max), vec![q, z])
                    }
                })
                .collect()
        },
    )]
}

/// A value quantized again with the scale and zero point it was dequantized with (QOperator models
/// write `QLinearConv -> DequantizeLinear -> Relu -> QuantizeLinear -> QLinearConv`):
///
/// ```text
/// t8(clip(round(((f32(q) - z) * s) / s) + z, lo, hi))         =>  q
/// t8(clip(round(relu((f32(q) - z) * s) / s) + z, lo, hi))     =>  max(q, t8(z))
/// ```
///
/// exactly: `q - z` is an integer of at most 255 in magnitude, so the products' rounding (a relative
/// 2^-23, the division written as a multiply by the reciprocal included) moves it by far less than the
/// half that `round` forgives; the clip, to `t8`'s range, then changes nothing. Returns `q` with the
/// zero point as a `t8` scalar where a ReLU came between.
fn requantized(eg: &EGraph, id: Id) -> Vec<(Id, Option<mlopt_ir::Tensor>)> {
    let constant = |c: Id| super::splat(eg, c);
    let mut out = vec![];
    for (op, ch) in ops(eg, id) {
        let Op::Cast {
            to: to @ (DType::U8 | DType::I8),
        } = op
        else {
            continue;
        };
        let Some((lo, hi)) = to.int_range() else {
            continue;
        };
        for (op, ch) in ops(eg, ch[0]) {
            let (Op::Clip, [r, l, h]) = (op, &ch[..]) else {
                continue;
            };
            if constant(*l) != Some(lo) || constant(*h) != Some(hi) {
                continue;
            }
            // round(..) + z, or round(..) alone for a zero point of 0.
            let mut rounded: Vec<(Id, f64)> = vec![(*r, 0.0)];
            for (op, ch) in ops(eg, *r) {
                if let (Op::Binary(Binary::Add), [a, z]) = (op, &ch[..]) {
                    if let Some(z) = constant(*z) {
                        rounded.push((*a, z));
                    }
                }
            }
            for (r, z2) in rounded {
                for (op, ch) in ops(eg, r) {
                    let Op::Unary(mlopt_ir::Unary::Round) = op else {
                        continue;
                    };
                    for (x, s2) in divided(eg, ch[0]) {
                        let (value, relu) = match relu_of(eg, x) {
                            Some(inner) => (inner, true),
                            None => (x, false),
                        };
                        let Some(d) = dequantized(eg, value) else {
                            continue;
                        };
                        let z1 = d.zero.map_or(Some(0.0), constant);
                        let same_scale =
                            constant(d.scale).is_some_and(|s1| (s1 * s2 - 1.0).abs() < 1e-6);
                        let q_type = ty(eg, d.q).map(|t| t.dtype);
                        if same_scale
                            && z1 == Some(z2)
                            && q_type == Some(to)
                            && (lo..=hi).contains(&z2)
                        {
                            let zero = relu.then(|| mlopt_ir::Tensor::scalar(z2).cast(to));
                            out.push((d.q, zero));
                        }
                    }
                }
            }
        }
    }
    out
}

/// `x / s` or `x * (1/s)` in class `id`, with a scalar constant s: (x, 1/s).
fn divided(eg: &EGraph, id: Id) -> Vec<(Id, f64)> {
    ops(eg, id)
        .into_iter()
        .filter_map(|(op, ch)| {
            let c = super::splat(eg, *ch.get(1)?)?;
            match op {
                Op::Binary(Binary::Div) if c != 0.0 => Some((ch[0], 1.0 / c)),
                Op::Binary(Binary::Mul) => Some((ch[0], c)),
                _ => None,
            }
        })
        .collect()
}

/// The operand of a ReLU in class `id`.
fn relu_of(eg: &EGraph, id: Id) -> Option<Id> {
    ops(eg, id).into_iter().find_map(|(op, ch)| match op {
        Op::Unary(mlopt_ir::Unary::Relu) => Some(ch[0]),
        _ => None,
    })
}

/// A dequantized value `(f32(q) - z) * s` (or `f32(q) * s`): q 8-bit, z and s constants.
struct Dequantized {
    q: Id,
    zero: Option<Id>,
    scale: Id,
}

/// The contractions of class `id` over an f32 operand that the integer form takes (`integer_shape`).
fn candidates(eg: &EGraph, id: Id) -> impl Iterator<Item = (Op, Vec<Id>)> + '_ {
    ops(eg, id).into_iter().filter(|(op, ch)| {
        let f32_in = ty(eg, ch[0]).is_some_and(|t| t.dtype == DType::F32);
        let fits = || {
            ch.get(1)
                .and_then(|&w| ty(eg, w))
                .is_some_and(|w| integer_shape(op, &w.shape).is_some())
        };
        f32_in && fits()
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

/// For a contraction the integer form takes (a Conv of one group, a MatMul, a Gemm) over a weight of shape
/// `w`: the weight's axis of output channels (0 of a convolution's [M, C, ...] and a transposed Gemm
/// weight's [N, K], 1 of a MatMul's or Gemm's [K, N]), their
/// number and the depth summed, when both fill the integer blocks (16 or more). `--precision int8`
/// (`quantize.rs`) quantizes exactly these.
pub(crate) fn integer_shape(op: &Op, w: &[usize]) -> Option<(usize, usize, usize)> {
    let (axis, n, depth) = match op {
        Op::Conv(a) if a.group == 1 && w.len() >= 3 => (0, w[0], w[1..].iter().product()),
        Op::MatMul if w.len() == 2 => (1, w[1], w[0]),
        Op::Gemm {
            alpha,
            beta,
            trans_a: false,
            trans_b,
        } if w.len() == 2 && *alpha == 1.0 && *beta == 1.0 => match trans_b {
            true => (0, w[0], w[1]),
            false => (1, w[1], w[0]),
        },
        _ => return None,
    };
    (depth >= 16 && n >= 16).then_some((axis, n, depth))
}

/// The largest |q - z|: from `q`'s type, or (`exact`) from its values where it is a constant, less
/// `z`'s values. (A weight's values are read only when its type's range could overflow: they are
/// millions of elements, and the rule runs on every iteration.)
fn span(eg: &EGraph, q: Id, z: Option<Id>, exact: bool) -> Option<f64> {
    let values = |c: Id| -> Option<(f64, f64)> {
        let v = eg[c].data.value.as_ref()?.to_f64_vec();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo <= hi).then_some((lo, hi))
    };
    let (qlo, qhi) = match exact.then(|| values(q)).flatten() {
        Some(r) => r,
        None => ty(eg, q)?.dtype.int_range()?,
    };
    let (zlo, zhi) = match z {
        Some(z) => values(z)?,
        None => (0.0, 0.0),
    };
    Some((qlo - zhi).abs().max((qhi - zlo).abs()))
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
    let (axis, n, depth) = integer_shape(&op, &wt.shape)?;
    let per_channel =
        |eg: &EGraph, p: Option<Id>| p.is_none_or(|p| along(eg, p, axis, n, wt.rank()));
    if !per_channel(eg, Some(w.scale)) || !per_channel(eg, w.zero) {
        return None;
    }
    // Every partial sum must fit i32 (the blocks' sums wrap): depth x the largest |x - zx| x the
    // largest |w - zw|, from A's type and W's type or, where that could overflow, W's values.
    let fits = |eg: &EGraph, exact: bool| -> Option<bool> {
        let bound = depth as f64 * span(eg, a.q, a.zero, false)? * span(eg, w.q, w.zero, exact)?;
        Some(bound < 2f64.powi(31))
    };
    if !(fits(eg, false)? || fits(eg, true)?) {
        return None;
    }
    let (x16, w16) = (centred(eg, &a)?, centred(eg, &w)?);
    let operands = match op {
        Op::Gemm { .. } => vec![x16, w16, super::absent(eg)],
        _ => vec![x16, w16],
    };
    let sum = add(eg, op.clone(), operands)?;
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
        // A convolution's bias runs along its channels; a Gemm's C broadcasts as it is.
        let b = match op {
            Op::Conv(_) => {
                let mut shape = vec![1; out_rank];
                shape[1] = n;
                add(eg, Op::Reshape { shape }, vec![b])?
            }
            _ => b,
        };
        y = add(eg, Op::Binary(Binary::Add), vec![y, b])?;
    }
    Some(y)
}
