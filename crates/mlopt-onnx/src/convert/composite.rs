//! Composite ONNX ops that import as a small graph of IR ops rather than as IR ops of their own, the way
//! ONNX defines them as functions: Hardmax, the losses (NegativeLogLikelihoodLoss,
//! SoftmaxCrossEntropyLoss), GroupNormalization, MeanVarianceNormalization, LpNormalization, Swish, Det
//! (`linalg.rs`), MaxUnpool and Col2Im (`unpool.rs`), and
//! the transformer ops
//! (`transformer.rs`: Attention, RotaryEmbedding, RMSNormalization).
//! Keeping the IR's op set small keeps the optimiser's rules few; it fuses these patterns back.

use super::nn::{axis, pool_attrs};
use super::transformer::{attention, rms_norm, rotary};
use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{
    Accumulate, Binary, CumulativeAttrs, DType, Op, PadMode, ReduceKind, Tensor, TensorType, Unary,
    Value,
};

pub(crate) const OPS: &[&str] = &[
    "RMSNormalization",
    "Attention",
    "NegativeLogLikelihoodLoss",
    "SoftmaxCrossEntropyLoss",
    "Hardmax",
    "MeanVarianceNormalization",
    "GroupNormalization",
    "LpPool",
    "CumSum",
    "CumProd",
    "OneHot",
    "EyeLike",
    "RotaryEmbedding",
    "CenterCropPad",
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
    "Einsum",
    "AffineGrid",
    "Swish",
    "SwiGLU",
    "ReverseSequence",
    "LpNormalization",
    "Det",
    "MaxUnpool",
    "Col2Im",
    "TensorScatter",
];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        let out = match op {
            "RMSNormalization" => vec![rms_norm(cx)?],
            "Attention" => attention(cx)?,
            "Hardmax" => vec![hardmax(cx)?],
            "MeanVarianceNormalization" => vec![mvn(cx)?],
            "GroupNormalization" => vec![group_norm(cx)?],
            "LpPool" => vec![lp_pool(cx)?],
            "CumSum" => vec![cumulative(cx, Accumulate::Sum)?],
            "CumProd" => vec![cumulative(cx, Accumulate::Prod)?],
            "OneHot" => vec![one_hot(cx)?],
            "EyeLike" => vec![eye_like(cx)?],
            "RotaryEmbedding" => vec![rotary(cx)?],
            "TensorScatter" => vec![super::transformer::tensor_scatter(cx)?],
            "CenterCropPad" => vec![center_crop_pad(cx)?],
            "Einsum" => vec![super::einsum::einsum(cx)?],
            "AffineGrid" => vec![affine_grid(cx)?],
            "Swish" => vec![swish(cx)?],
            "SwiGLU" => vec![swiglu(cx)?],
            "ReverseSequence" => vec![reverse_sequence(cx)?],
            "LpNormalization" => vec![lp_normalization(cx)?],
            "Det" => vec![super::linalg::det(cx)?],
            "MaxUnpool" => vec![super::unpool::max_unpool(cx)?],
            "Col2Im" => vec![super::unpool::col2im(cx)?],
            "HannWindow" | "HammingWindow" | "BlackmanWindow" => vec![window(cx, op)?],
            "NegativeLogLikelihoodLoss" => {
                let (x, t, w) = (cx.req(0)?, cx.req(1)?, cx.input(2)?);
                vec![nll_loss(cx, x, t, w, true)?]
            }
            "SoftmaxCrossEntropyLoss" => {
                let (x, t, w) = (cx.req(0)?, cx.req(1)?, cx.input(2)?);
                let log_prob = cx.add1(Op::LogSoftmax { axis: 1 }, &[x])?;
                vec![nll_loss(cx, log_prob, t, w, false)?, log_prob]
            }
            _ => return Ok(None),
        };
        Ok(Some(out))
    })();
    r.transpose()
}

/// Small helpers for building IR chains on behalf of one node.
impl NodeCx<'_, '_> {
    pub(crate) fn bin(&mut self, b: Binary, x: Value, y: Value) -> Result<Value> {
        self.add1(Op::Binary(b), &[x, y])
    }
    pub(crate) fn un(&mut self, u: Unary, x: Value) -> Result<Value> {
        self.add1(Op::Unary(u), &[x])
    }
    pub(crate) fn cast_to(&mut self, x: Value, to: DType) -> Result<Value> {
        if self.ty(x).dtype == to {
            Ok(x)
        } else {
            self.add1(Op::Cast { to }, &[x])
        }
    }
    /// A scalar constant of `dtype`.
    pub(crate) fn scalar(&mut self, v: f64, dtype: DType) -> Value {
        self.konst_value(Tensor::scalar(v).cast(dtype))
    }
    /// Elements `start, start+step, ...` (`len` of them) along the last axis.
    pub(crate) fn slice_last(
        &mut self,
        x: Value,
        start: usize,
        step: i64,
        len: usize,
    ) -> Result<Value> {
        let shape = self.ty(x).shape.clone();
        let r = shape.len();
        if r == 0 {
            return Err(self.err(format!(
                "expected a tensor with at least one axis, got {}",
                self.ty(x)
            )));
        }
        let (mut starts, mut steps, mut lens) = (vec![0; r], vec![1; r], shape);
        starts[r - 1] = start;
        steps[r - 1] = step;
        lens[r - 1] = len;
        self.add1(
            Op::Slice {
                starts,
                steps,
                lens,
            },
            &[x],
        )
    }
    pub(crate) fn reduce(
        &mut self,
        kind: ReduceKind,
        x: Value,
        axes: Vec<usize>,
        keepdims: bool,
    ) -> Result<Value> {
        self.add1(
            Op::Reduce {
                kind,
                axes,
                keepdims,
            },
            &[x],
        )
    }
}

/// The dtype statistics are computed in: `stash_type` 1 means f32, which mlopt also uses for f64 inputs'
/// own precision (f64 stays f64).
pub(super) fn stash_dtype(cx: &mut NodeCx<'_, '_>, x: DType) -> Result<DType> {
    let stash = cx.int("stash_type", 1)?;
    if stash != 1 {
        return Err(cx.err(format!(
            "stash_type={stash} is not supported (statistics are computed in f32)"
        )));
    }
    Ok(if x == DType::F64 {
        DType::F64
    } else {
        DType::F32
    })
}

/// The negative log-likelihood of `target` classes under log-probabilities `x` ([N, C, d...]), weighted per
/// class, with `ignore_index` and `reduction` as ONNX's losses define them. `nll_quirk`: the standalone
/// NegativeLogLikelihoodLoss leaves the mean over all elements when ignore_index is -1 and no weights are
/// given (as its reference does); SoftmaxCrossEntropyLoss then divides by the count of kept elements.
pub(super) fn nll_loss(
    cx: &mut NodeCx<'_, '_>,
    x: Value,
    target: Value,
    weight: Option<Value>,
    nll_quirk: bool,
) -> Result<Value> {
    let reduction = cx.string("reduction", "mean")?;
    let ignore = cx.int_opt("ignore_index")?;
    let (xs, ts) = (cx.ty(x).shape.clone(), cx.ty(target).shape.clone());
    let (dtype, tdtype) = (cx.ty(x).dtype, cx.ty(target).dtype);
    if xs.len() < 2 || ts.len() + 1 != xs.len() || ts[0] != xs[0] || ts[1..] != xs[2..] {
        return Err(cx.err_in(
            1,
            format!("target shape {ts:?} does not fit input shape {xs:?}"),
        ));
    }
    let keep = match ignore {
        Some(i) => {
            let iv = cx.scalar(i as f64, tdtype);
            let eq = cx.bin(Binary::Equal, target, iv)?;
            Some(cx.un(Unary::Not, eq)?)
        }
        None => None,
    };
    let safe = match keep {
        Some(k) => {
            let zero = cx.scalar(0.0, tdtype);
            cx.add1(Op::Where, &[k, target, zero])?
        }
        None => target,
    };
    let mut with_class = ts.clone();
    with_class.insert(1, 1);
    let idx = cx.add1(Op::Reshape { shape: with_class }, &[safe])?;
    let picked = cx.add1(Op::GatherElements { axis: 1 }, &[x, idx])?;
    let picked = cx.add1(Op::Reshape { shape: ts.clone() }, &[picked])?;
    let mut loss = cx.un(Unary::Neg, picked)?;
    let zero = cx.scalar(0.0, dtype);
    let w = match (weight, keep) {
        (Some(w), k) => {
            let g = cx.add1(Op::Gather { axis: 0 }, &[w, safe])?;
            Some(match k {
                Some(k) => cx.add1(Op::Where, &[k, g, zero])?,
                None => g,
            })
        }
        (None, Some(_)) if nll_quirk && ignore == Some(-1) => None,
        (None, Some(k)) => Some(cx.cast_to(k, dtype)?),
        (None, None) => None,
    };
    if let (None, Some(k)) = (w, keep) {
        loss = cx.add1(Op::Where, &[k, loss, zero])?;
    }
    if let Some(w) = w {
        loss = cx.bin(Binary::Mul, loss, w)?;
    }
    let all: Vec<usize> = (0..ts.len()).collect();
    match reduction.as_str() {
        "none" => Ok(loss),
        "sum" => cx.reduce(ReduceKind::Sum, loss, all, false),
        "mean" => match w {
            Some(w) => {
                let num = cx.reduce(ReduceKind::Sum, loss, all.clone(), false)?;
                let den = cx.reduce(ReduceKind::Sum, w, all, false)?;
                cx.bin(Binary::Div, num, den)
            }
            None => cx.reduce(ReduceKind::Mean, loss, all, false),
        },
        r => Err(cx.err(format!("reduction='{r}' is not supported"))),
    }
}

/// `0, 1, ..., n-1` laid along `axis` of a rank-`rank` tensor (size 1 elsewhere), as i64; `n` comes
/// from the node's input `input`.
pub(super) fn iota(
    cx: &mut NodeCx<'_, '_>,
    n: usize,
    (axis, rank): (usize, usize),
    input: usize,
) -> Result<Value> {
    cx.constant_fits(n, 8, input)?;
    let mut shape = vec![1; rank];
    shape[axis] = n;
    let t = Tensor::from_vec(&shape, (0..n as i64).collect()).ok_or_else(|| cx.err("iota"))?;
    Ok(cx.konst_value(t))
}

/// 1 at the first maximum along `axis`, 0 elsewhere (before opset 13: over the 2-D coercion at `axis`).
pub(super) fn hardmax(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let ty = cx.ty(x).clone();
    let (a, shape) = if cx.opset() >= 13 {
        let a = cx.int("axis", -1)?;
        (axis(cx, a, ty.rank())?, ty.shape.clone())
    } else {
        let a = cx.int("axis", 1)?;
        let a = axis(cx, a, ty.rank())?;
        (
            1,
            vec![
                ty.shape[..a].iter().product(),
                ty.shape[a..].iter().product(),
            ],
        )
    };
    let flat = cx.add1(
        Op::Reshape {
            shape: shape.clone(),
        },
        &[x],
    )?;
    let arg = cx.add1(
        Op::Arg {
            max: true,
            axis: a,
            keepdims: true,
            select_last_index: false,
        },
        &[flat],
    )?;
    let ids = iota(cx, shape[a], (a, shape.len()), 0)?;
    let hit = cx.bin(Binary::Equal, arg, ids)?;
    let y = cx.cast_to(hit, ty.dtype)?;
    cx.add1(Op::Reshape { shape: ty.shape }, &[y])
}

/// (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` (default [0, 2, 3]).
/// Swish (opset 24): x * sigmoid(alpha * x).
fn swish(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let alpha = cx.float("alpha", 1.0)?;
    swish_of(cx, x, alpha)
}

/// x * sigmoid(alpha * x), for Swish and SwiGLU.
fn swish_of(cx: &mut NodeCx<'_, '_>, x: Value, alpha: f32) -> Result<Value> {
    let a = cx.scalar(f64::from(alpha), cx.ty(x).dtype);
    let ax = cx.bin(Binary::Mul, x, a)?;
    let s = cx.un(Unary::Sigmoid, ax)?;
    cx.bin(Binary::Mul, x, s)
}

/// SwiGLU: swish(a, alpha) * b, for a and b of one type and shape (no broadcasting).
fn swiglu(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (a, b) = (cx.req(0)?, cx.req(1)?);
    if cx.ty(a) != cx.ty(b) {
        return Err(cx.err_in(
            1,
            format!(
                "is {}, A is {}: SwiGLU does not broadcast",
                cx.ty(b),
                cx.ty(a)
            ),
        ));
    }
    let alpha = cx.float("alpha", 1.0)?;
    let swish = swish_of(cx, a, alpha)?;
    cx.bin(Binary::Mul, swish, b)
}

/// ReverseSequence: along the time axis, the first sequence_lens[b] elements of batch row b reversed,
/// the rest kept; one GatherElements by a constant index tensor (the lengths must be known).
fn reverse_sequence(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let lens = cx
        .konst_ints(1)?
        .ok_or_else(|| cx.err_in(1, "required input is missing"))?;
    let shape = cx.ty(x).shape.clone();
    if shape.len() < 2 {
        return Err(cx.err_in(0, format!("has rank {}, not at least 2", shape.len())));
    }
    let (batch, time) = (cx.int("batch_axis", 1)?, cx.int("time_axis", 0)?);
    let (batch, time) = match (batch, time) {
        (0, 1) => (0, 1),
        (1, 0) => (1, 0),
        _ => {
            return Err(cx.err(format!(
                "batch_axis {batch} and time_axis {time} must be 0 and 1 or 1 and 0"
            )))
        }
    };
    if lens.len() != shape[batch] {
        return Err(cx.err_in(
            1,
            format!(
                "holds {} lengths for a batch of {}",
                lens.len(),
                shape[batch]
            ),
        ));
    }
    let steps = shape[time];
    if let Some(l) = lens.iter().find(|&&l| l < 0 || l as usize > steps) {
        return Err(cx.err_in(1, format!("length {l} is outside 0..={steps}")));
    }
    let n: usize = shape.iter().product();
    cx.constant_fits(n, 8, 0)?;
    // Row-major walk of x's shape: the index along time is reversed below the row's length.
    let inner: usize = shape[2..].iter().product();
    let idx: Vec<i64> = (0..n)
        .map(|k| {
            let (i0, i1) = (k / inner / shape[1], k / inner % shape[1]);
            let (b, t) = if batch == 0 { (i0, i1) } else { (i1, i0) };
            let l = lens[b] as usize;
            (if t < l { l - 1 - t } else { t }) as i64
        })
        .collect();
    let idx = Tensor::from_vec(&shape, idx).ok_or_else(|| cx.err("reverse_sequence"))?;
    let idx = cx.konst_value(idx);
    cx.add1(Op::GatherElements { axis: time }, &[x, idx])
}

/// LpNormalization: x over its L1 (p = 1) or L2 (p = 2) norm along `axis`; a zero vector stays zero.
fn lp_normalization(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let rank = cx.ty(x).rank();
    let a = cx.int("axis", -1)?;
    let a = axis(cx, a, rank)?;
    let norm = match cx.int("p", 2)? {
        1 => {
            let m = cx.un(Unary::Abs, x)?;
            cx.reduce(ReduceKind::Sum, m, vec![a], true)?
        }
        2 => {
            let sq = cx.bin(Binary::Mul, x, x)?;
            let s = cx.reduce(ReduceKind::Sum, sq, vec![a], true)?;
            cx.un(Unary::Sqrt, s)?
        }
        p => return Err(cx.err(format!("p = {p}: LpNormalization takes p = 1 or 2"))),
    };
    // A zero vector stays zero (the reference divides it by 1).
    let dtype = cx.ty(x).dtype;
    let (zero, one) = (cx.scalar(0.0, dtype), cx.scalar(1.0, dtype));
    let is_zero = cx.bin(Binary::Equal, norm, zero)?;
    let norm = cx.add1(Op::Where, &[is_zero, one, norm])?;
    cx.bin(Binary::Div, x, norm)
}

pub(super) fn mvn(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let ty = cx.ty(x).clone();
    let given = cx.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let mut axes: Vec<usize> = given
        .iter()
        .map(|&a| axis(cx, a, ty.rank()))
        .collect::<Result<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    let mean = cx.reduce(ReduceKind::Mean, x, axes.clone(), true)?;
    let sq = cx.bin(Binary::Mul, x, x)?;
    let mean_sq = cx.reduce(ReduceKind::Mean, sq, axes, true)?;
    let sq_mean = cx.bin(Binary::Mul, mean, mean)?;
    let var = cx.bin(Binary::Sub, mean_sq, sq_mean)?;
    let std = cx.un(Unary::Sqrt, var)?;
    let eps = cx.scalar(1e-9, ty.dtype);
    let den = cx.bin(Binary::Add, std, eps)?;
    let centred = cx.bin(Binary::Sub, x, mean)?;
    cx.bin(Binary::Div, centred, den)
}

/// Normalises each group of channels over the group's channels and spatial positions, then applies a
/// per-channel scale and bias (opset 21; before that, per group).
pub(super) fn group_norm(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, scale, bias) = (cx.req(0)?, cx.req(1)?, cx.req(2)?);
    let ty = cx.ty(x).clone();
    let groups = cx
        .int_opt("num_groups")?
        .ok_or_else(|| cx.err("attribute 'num_groups' is required"))?;
    let eps = cx.float("epsilon", 1e-5)?;
    let wide = stash_dtype(cx, ty.dtype)?;
    let c = *ty
        .shape
        .get(1)
        .ok_or_else(|| cx.err_in(0, "expects [N, C, ...]"))?;
    let g = usize::try_from(groups)
        .ok()
        .filter(|&g| g > 0 && c % g == 0)
        .ok_or_else(|| cx.err(format!("{c} channels do not split into {groups} groups")))?;
    let rest: usize = ty.shape[2..].iter().product();
    let xf = cx.cast_to(x, wide)?;
    let grouped = cx.add1(
        Op::Reshape {
            shape: vec![ty.shape[0], g, c / g * rest],
        },
        &[xf],
    )?;
    let mean = cx.reduce(ReduceKind::Mean, grouped, vec![2], true)?;
    let centred = cx.bin(Binary::Sub, grouped, mean)?;
    let sq = cx.bin(Binary::Mul, centred, centred)?;
    let var = cx.reduce(ReduceKind::Mean, sq, vec![2], true)?;
    let e = cx.scalar(eps as f64, wide);
    let var = cx.bin(Binary::Add, var, e)?;
    let std = cx.un(Unary::Sqrt, var)?;
    let n = cx.bin(Binary::Div, centred, std)?;
    let n = cx.add1(
        Op::Reshape {
            shape: ty.shape.clone(),
        },
        &[n],
    )?;
    let n = cx.cast_to(n, ty.dtype)?;
    let mut per_channel = vec![1; ty.rank() - 1];
    per_channel[0] = c;
    let (mut s, mut b) = (scale, bias);
    if cx.opset() < 21 {
        // Per-group parameters: channel i takes group i / (C / G)'s.
        let idx = Tensor::from_vec(&[c], (0..c as i64).map(|i| i / (c / g) as i64).collect())
            .ok_or_else(|| cx.err("group index"))?;
        let idx = cx.konst_value(idx);
        s = cx.add1(Op::Gather { axis: 0 }, &[s, idx])?;
        b = cx.add1(Op::Gather { axis: 0 }, &[b, idx])?;
    }
    let s = cx.add1(
        Op::Reshape {
            shape: per_channel.clone(),
        },
        &[s],
    )?;
    let b = cx.add1(Op::Reshape { shape: per_channel }, &[b])?;
    let y = cx.bin(Binary::Mul, n, s)?;
    cx.bin(Binary::Add, y, b)
}

/// (sum over the window of |x|^p)^(1/p), computed as kernel size times the pad-including average.
pub(super) fn lp_pool(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let dtype = cx.ty(x).dtype;
    let p = cx.int("p", 2)?;
    let pool = pool_attrs(cx, x)?;
    let count = mlopt_ir::checked_numel(&pool.kernel)
        .ok_or_else(|| cx.err(format!("kernel_shape {:?} overflows", pool.kernel)))?;
    let a = cx.un(Unary::Abs, x)?;
    let pv = cx.scalar(p as f64, dtype);
    let powed = cx.bin(Binary::Pow, a, pv)?;
    let avg = cx.add1(
        Op::AveragePool {
            pool,
            count_include_pad: true,
        },
        &[powed],
    )?;
    let k = cx.scalar(count as f64, dtype);
    let sum = cx.bin(Binary::Mul, avg, k)?;
    let inv = cx.scalar(1.0 / p as f64, dtype);
    cx.bin(Binary::Pow, sum, inv)
}

/// Running sums along an axis, as a product with a triangular 0/1 matrix: the sum runs in index order,
/// so the result is the sequential one.
/// CumSum and CumProd: one `cum_sum` / `cum_prod` along the (constant) axis.
pub(super) fn cumulative(cx: &mut NodeCx<'_, '_>, kind: Accumulate) -> Result<Value> {
    let x = cx.req(0)?;
    let rank = cx.ty(x).rank();
    let a = cx
        .konst_ints(1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| cx.err_in(1, "axis must be a constant scalar"))?;
    let axis = axis(cx, a, rank)?;
    let (exclusive, reverse) = (cx.int("exclusive", 0)? != 0, cx.int("reverse", 0)? != 0);
    cx.add1(
        Op::Cumulative(CumulativeAttrs {
            kind,
            axis,
            exclusive,
            reverse,
        }),
        &[x],
    )
}

/// `values[1]` where the (wrapped) index equals the position along the new axis, `values[0]` elsewhere.
pub(super) fn one_hot(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (idx, values) = (cx.req(0)?, cx.req(2)?);
    let depth = cx
        .konst(1)?
        .ok_or_else(|| cx.err_in(1, "required input is missing"))?;
    let depth = depth
        .to_f64_vec()
        .first()
        .copied()
        .ok_or_else(|| cx.err_in(1, "depth must be a scalar"))?;
    let depth = usize::try_from(depth as i64)
        .ok()
        .filter(|&d| d > 0)
        .ok_or_else(|| cx.err_in(1, format!("depth {depth} must be positive")))?;
    if cx.ty(values).numel() != 2 {
        return Err(cx.err_in(2, "values must hold [off, on]"));
    }
    let ishape = cx.ty(idx).shape.clone();
    let a = cx.int("axis", -1)?;
    let a = axis(cx, a, ishape.len() + 1)?;
    // The depth sizes a constant (the ids 0..depth) and the output: both checked before either exists.
    let mut out_shape = ishape.clone();
    out_shape.insert(a, depth);
    cx.fits(&TensorType::new(cx.ty(values).dtype, out_shape))?;
    cx.fits(&TensorType::new(DType::I64, vec![depth]))?;
    let i = cx.cast_to(idx, DType::I64)?;
    let zero = cx.scalar(0.0, DType::I64);
    let d = cx.scalar(depth as f64, DType::I64);
    let neg = cx.bin(Binary::Less, i, zero)?;
    let wrapped = cx.bin(Binary::Add, i, d)?;
    let i = cx.add1(Op::Where, &[neg, wrapped, i])?;
    let mut shape = ishape.clone();
    shape.insert(a, 1);
    let i = cx.add1(Op::Reshape { shape }, &[i])?;
    let ids = iota(cx, depth, (a, ishape.len() + 1), 1)?;
    let hit = cx.bin(Binary::Equal, i, ids)?;
    let flat = cx.add1(Op::Reshape { shape: vec![2] }, &[values])?;
    let pick = |cx: &mut NodeCx<'_, '_>, k: i64| -> Result<Value> {
        let at = cx.konst_value(Tensor::scalar(k));
        cx.add1(Op::Gather { axis: 0 }, &[flat, at])
    };
    let (off, on) = (pick(cx, 0)?, pick(cx, 1)?);
    cx.add1(Op::Where, &[hit, on, off])
}

/// An identity-like constant of the input's (2-D) shape, ones on diagonal `k`.
pub(super) fn eye_like(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let ty = cx.ty(x).clone();
    if ty.rank() != 2 {
        return Err(cx.err_in(0, "EyeLike takes a 2-D input"));
    }
    let dtype = match cx.int_opt("dtype")? {
        Some(d) => crate::tensor_io::dtype_from_onnx(d as i32)
            .ok_or_else(|| cx.err(format!("dtype {d} is not supported")))?,
        None => ty.dtype,
    };
    let k = cx.int("k", 0)?;
    let (r, c) = (ty.shape[0], ty.shape[1]);
    let v: Vec<f64> = (0..r * c)
        .map(|i| ((i % c) as i64 - (i / c) as i64 == k) as u8 as f64)
        .collect();
    let t = Tensor::from_vec(&[r, c], v)
        .ok_or_else(|| cx.err("eye"))?
        .cast(dtype);
    Ok(cx.konst_value(t))
}

/// Crops or zero-pads each listed axis to the target size, centred (the odd element goes to the end).
pub(super) fn center_crop_pad(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let s = cx.ty(x).shape.clone();
    let r = s.len();
    let target = cx
        .konst_ints(1)?
        .ok_or_else(|| cx.err_in(1, "required input is missing"))?;
    let axes: Vec<usize> = match cx.ints("axes")? {
        None => (0..r).collect(),
        Some(a) => a.iter().map(|&a| axis(cx, a, r)).collect::<Result<_>>()?,
    };
    if target.len() != axes.len() {
        return Err(cx.err_in(1, format!("{} sizes for {} axes", target.len(), axes.len())));
    }
    let (mut starts, mut lens, mut pads) = (vec![0; r], s.clone(), vec![0i64; 2 * r]);
    for (&a, &t) in axes.iter().zip(&target) {
        let t = usize::try_from(t).map_err(|_| cx.err_in(1, format!("negative size {t}")))?;
        if t < s[a] {
            starts[a] = (s[a] - t) / 2;
            lens[a] = t;
        } else {
            let d = (t - s[a]) as i64;
            pads[a] = d / 2;
            pads[a + r] = d - d / 2;
        }
    }
    let cropped = cx.add1(
        Op::Slice {
            starts,
            steps: vec![1; r],
            lens,
        },
        &[x],
    )?;
    cx.add1(
        Op::Pad {
            pads,
            mode: PadMode::Constant,
            value: 0.0,
        },
        &[cropped],
    )
}

/// Hann, Hamming and Blackman windows of a constant length: constants.
pub(super) fn window(cx: &mut NodeCx<'_, '_>, op: &str) -> Result<Value> {
    let size = cx
        .konst_ints(0)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| cx.err_in(0, "size must be a scalar"))?;
    let n = usize::try_from(size).map_err(|_| cx.err_in(0, format!("negative size {size}")))?;
    cx.constant_fits(n, 8, 0)?;
    let periodic = cx.int("periodic", 1)? != 0;
    let to = cx.int("output_datatype", 1)?;
    let dtype = crate::tensor_io::dtype_from_onnx(to as i32)
        .ok_or_else(|| cx.err(format!("output_datatype {to} is not supported")))?;
    let span = if periodic { n as f64 } else { n as f64 - 1.0 };
    let tau = 2.0 * std::f64::consts::PI;
    let w: Vec<f64> = (0..n)
        .map(|i| {
            let x = i as f64 / span;
            match op {
                "HannWindow" => (std::f64::consts::PI * x).sin().powi(2),
                "HammingWindow" => 25.0 / 46.0 - (1.0 - 25.0 / 46.0) * (tau * x).cos(),
                _ => 0.42 - 0.5 * (tau * x).cos() + 0.08 * (2.0 * tau * x).cos(),
            }
        })
        .collect();
    let t = Tensor::from_vec(&[n], w)
        .ok_or_else(|| cx.err("window"))?
        .cast(dtype);
    Ok(cx.konst_value(t))
}

/// The sampling grid of an affine transform: a constant grid of normalised output coordinates (x, y[, z], 1)
/// times each batch's theta, transposed: [N, spatial..., rank].
pub(super) fn affine_grid(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let theta = cx.req(0)?;
    let size = cx
        .konst_ints(1)?
        .ok_or_else(|| cx.err_in(1, "required input is missing"))?;
    let align = cx.int("align_corners", 0)? != 0;
    let ts = cx.ty(theta).shape.clone();
    let sp = size.len().saturating_sub(2);
    if !(sp == 2 || sp == 3) || ts != [size[0] as usize, sp, sp + 1] {
        return Err(cx.err_in(0, format!("theta {ts:?} does not fit size {size:?}")));
    }
    let dims: Vec<usize> = size[2..].iter().map(|&d| d.max(0) as usize).collect();
    let coord = |i: usize, n: usize| -> f64 {
        if align {
            if n <= 1 {
                -1.0
            } else {
                -1.0 + 2.0 * i as f64 / (n - 1) as f64
            }
        } else {
            (2 * i + 1) as f64 / n as f64 - 1.0
        }
    };
    // Rows (x, y[, z], 1) in row-major order over the spatial axes; x runs along the last axis.
    let count = mlopt_ir::checked_numel(&dims)
        .filter(|n| n.saturating_mul(sp + 1).saturating_mul(8) <= super::FOLD_LIMIT_BYTES)
        .ok_or_else(|| {
            cx.err_in(
                1,
                format!("size {size:?} is larger than mlopt folds into a constant"),
            )
        })?;
    let mut base = Vec::with_capacity(count * (sp + 1));
    for flat in 0..count {
        let mut rem = flat;
        let mut idx = vec![0; sp];
        for d in (0..sp).rev() {
            idx[d] = rem % dims[d];
            rem /= dims[d];
        }
        for d in (0..sp).rev() {
            base.push(coord(idx[d], dims[d]));
        }
        base.push(1.0);
    }
    let dtype = cx.ty(theta).dtype;
    let base = Tensor::from_vec(&[count, sp + 1], base)
        .ok_or_else(|| cx.err("affine grid"))?
        .cast(dtype);
    let base = cx.konst_value(base);
    let tt = cx.add1(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[theta],
    )?;
    let g = cx.add1(Op::MatMul, &[base, tt])?;
    let mut shape = vec![ts[0]];
    shape.extend(&dims);
    shape.push(sp);
    cx.add1(Op::Reshape { shape }, &[g])
}
