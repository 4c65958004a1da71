//! Reductions over a set of axes (ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp) and
//! ArgMax/ArgMin. Reduced axes are moved last and each contiguous chunk folded, which keeps the code
//! independent of rank.

use super::elementwise::Arith;
use super::{num_dispatch, EvalResult};
use crate::infer::reduced_shape;
use crate::op::{Accumulate, CumulativeAttrs, ReduceKind};
use crate::tensor::{Elem, Tensor};
use ndarray::{ArrayD, IxDyn};

/// The values with `axes` permuted to the end, row-major, and the size of one reduced chunk.
fn moved_last<T: Copy>(a: &ArrayD<T>, axes: &[usize]) -> (Vec<T>, usize) {
    let mut perm: Vec<usize> = (0..a.ndim()).filter(|d| !axes.contains(d)).collect();
    perm.extend_from_slice(axes);
    let chunk = axes.iter().map(|&d| a.shape()[d]).product();
    let v = a
        .view()
        .permuted_axes(IxDyn(&perm))
        .iter()
        .copied()
        .collect();
    (v, chunk)
}

fn reduce_chunk<T: Arith>(kind: ReduceKind, c: &[T]) -> T {
    let f = || c.iter().map(|v| v.to_f64());
    match kind {
        ReduceKind::Sum => c.iter().fold(T::zero(), |a, &v| a.add(v)),
        ReduceKind::Prod => c.iter().fold(T::from_i64(1), |a, &v| a.mul(v)),
        ReduceKind::Max => c
            .iter()
            .copied()
            .reduce(T::max_)
            .unwrap_or_else(|| T::from_f64(f64::NEG_INFINITY)),
        ReduceKind::Min => c
            .iter()
            .copied()
            .reduce(T::min_)
            .unwrap_or_else(|| T::from_f64(f64::INFINITY)),
        ReduceKind::L1 => c.iter().fold(T::zero(), |a, &v| a.add(v.abs_())),
        ReduceKind::SumSquare => c.iter().fold(T::zero(), |a, &v| a.add(v.mul(v))),
        ReduceKind::Mean => T::from_f64(f().sum::<f64>() / c.len() as f64),
        ReduceKind::L2 => T::from_f64(f().map(|v| v * v).sum::<f64>().sqrt()),
        ReduceKind::LogSum => T::from_f64(f().sum::<f64>().ln()),
        ReduceKind::LogSumExp => {
            let m = f().fold(f64::NEG_INFINITY, f64::max);
            if m.is_infinite() {
                return T::from_f64(m);
            }
            T::from_f64(m + f().map(|v| (v - m).exp()).sum::<f64>().ln())
        }
    }
}

fn reduce_t<T: Arith>(
    a: &ArrayD<T>,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
) -> EvalResult<Tensor> {
    let (v, chunk) = moved_last(a, axes);
    let out: Vec<T> = if chunk == 0 {
        let n = v.len().max(
            a.shape()
                .iter()
                .enumerate()
                .filter(|(d, _)| !axes.contains(d))
                .map(|(_, &n)| n)
                .product(),
        );
        vec![reduce_chunk(kind, &[]); n]
    } else {
        v.chunks(chunk).map(|c| reduce_chunk(kind, c)).collect()
    };
    Tensor::from_vec(&reduced_shape(a.shape(), axes, keepdims), out)
        .ok_or_else(|| "reduce shape".into())
}

pub(crate) fn reduce(
    x: &Tensor,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
) -> EvalResult<Tensor> {
    if x.dtype() == crate::DType::Bool {
        // Max is "any" and Min is "all" over {0, 1}.
        return Ok(
            reduce(&x.cast(crate::DType::U8), kind, axes, keepdims)?.cast(crate::DType::Bool)
        );
    }
    num_dispatch!(x, a => reduce_t(a, kind, axes, keepdims))
}

fn arg_t<T: Elem>(
    a: &ArrayD<T>,
    max: bool,
    axis: usize,
    keepdims: bool,
    last: bool,
) -> EvalResult<Tensor> {
    let (v, chunk) = moved_last(a, &[axis]);
    if chunk == 0 {
        return Err("cannot take arg max/min over an empty axis".into());
    }
    let is_nan = |x: T| x.to_f64().is_nan();
    let out: Vec<i64> = v
        .chunks(chunk)
        .map(|c| {
            let mut best = 0;
            for (i, &e) in c.iter().enumerate().skip(1) {
                let b = c[best];
                let better = if is_nan(b) {
                    false
                } else if is_nan(e) {
                    true
                } else if max {
                    e > b || (last && e == b)
                } else {
                    e < b || (last && e == b)
                };
                if better {
                    best = i;
                }
            }
            best as i64
        })
        .collect();
    Tensor::from_vec(&reduced_shape(a.shape(), &[axis], keepdims), out)
        .ok_or_else(|| "arg shape".into())
}

pub(crate) fn arg(
    x: &Tensor,
    max: bool,
    axis: usize,
    keepdims: bool,
    last: bool,
) -> EvalResult<Tensor> {
    crate::dispatch!(x, a => arg_t(a, max, axis, keepdims, last))
}

fn cumulative_t<T: Arith>(a: &ArrayD<T>, c: &CumulativeAttrs) -> Tensor {
    let mut out = a.clone();
    for mut lane in out.lanes_mut(ndarray::Axis(c.axis)) {
        let n = lane.len();
        let mut acc = match c.kind {
            Accumulate::Sum => T::zero(),
            Accumulate::Prod => T::from_i64(1),
        };
        for k in 0..n {
            let i = if c.reverse { n - 1 - k } else { k };
            let next = match c.kind {
                Accumulate::Sum => acc.add(lane[i]),
                Accumulate::Prod => acc.mul(lane[i]),
            };
            lane[i] = if c.exclusive { acc } else { next };
            acc = next;
        }
    }
    Tensor::from_array(out)
}

/// CumSum / CumProd along `axis`, one element after another; bf16 and f16 accumulate in f32.
pub(crate) fn cumulative(x: &Tensor, c: &CumulativeAttrs) -> EvalResult<Tensor> {
    if x.dtype().is_half() {
        let wide = cumulative(&x.cast(crate::DType::F32), c)?;
        return Ok(wide.cast(x.dtype()));
    }
    num_dispatch!(x, a => Ok(cumulative_t(a, c)))
}
