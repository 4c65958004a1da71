//! Neural-network kernels: Softmax/LogSoftmax, BatchNormalization, InstanceNormalization,
//! LayerNormalization, LRN, and N-d max/average pooling (pads, dilations, ceil_mode, count_include_pad).

use super::linalg::for_each_index;
use super::{float_dispatch, typed, EvalResult, Real};
use crate::op::PoolAttrs;
use crate::tensor::Tensor;
use ndarray::{ArrayD, Axis};

fn softmax_t<T: Real>(a: &ArrayD<T>, axis: usize, log: bool) -> Tensor {
    let mut out = a.clone();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let max = lane.iter().fold(
            T::neg_infinity(),
            |m, &v| if v > m || v.is_nan() { v } else { m },
        );
        lane.mapv_inplace(|v| v - max);
        let sum: T = lane.iter().map(|v| v.exp()).sum();
        if log {
            let ls = sum.ln();
            lane.mapv_inplace(|v| v - ls);
        } else {
            lane.mapv_inplace(|v| v.exp() / sum);
        }
    }
    Tensor::from_array(out)
}

pub(crate) fn softmax(x: &Tensor, axis: usize, log: bool) -> EvalResult<Tensor> {
    float_dispatch!(x, a => Ok(softmax_t(a, axis, log)))
}

/// Channel value `i` of a per-channel vector, for element `flat` of an [N, C, spatial...] tensor.
fn channel(flat: usize, plane: usize, c: usize) -> usize {
    (flat / plane) % c
}

fn batch_norm_t<T: Real>(x: &ArrayD<T>, p: [&ArrayD<T>; 4], eps: f32) -> Tensor {
    let [scale, bias, mean, var] = p.map(|a| a.iter().copied().collect::<Vec<T>>());
    let c = x.shape()[1];
    let plane: usize = x.shape()[2..].iter().product();
    let eps = T::lit(eps as f64);
    let mut out = x.clone();
    for (i, v) in out.iter_mut().enumerate() {
        let ch = channel(i, plane, c);
        *v = (*v - mean[ch]) / (var[ch] + eps).sqrt() * scale[ch] + bias[ch];
    }
    Tensor::from_array(out)
}

pub(crate) fn batch_norm(x: &Tensor, p: [&Tensor; 4], eps: f32) -> EvalResult<Tensor> {
    float_dispatch!(x, a => Ok(batch_norm_t(a, [typed(p[0])?, typed(p[1])?, typed(p[2])?, typed(p[3])?], eps)))
}

/// Mean and population variance of a slice.
fn moments<T: Real>(v: &[T]) -> (T, T) {
    let n = T::lit(v.len() as f64);
    let mean = v.iter().copied().sum::<T>() / n;
    let var = v.iter().map(|&x| (x - mean) * (x - mean)).sum::<T>() / n;
    (mean, var)
}

fn instance_norm_t<T: Real>(
    x: &ArrayD<T>,
    scale: &ArrayD<T>,
    bias: &ArrayD<T>,
    eps: f32,
) -> Tensor {
    let c = x.shape()[1];
    let plane: usize = x.shape()[2..].iter().product();
    let (s, b): (Vec<T>, Vec<T>) = (
        scale.iter().copied().collect(),
        bias.iter().copied().collect(),
    );
    let mut v: Vec<T> = x.iter().copied().collect();
    for (i, chunk) in v.chunks_mut(plane.max(1)).enumerate() {
        let ch = i % c;
        let (mean, var) = moments(chunk);
        let inv = T::one() / (var + T::lit(eps as f64)).sqrt();
        for e in chunk.iter_mut() {
            *e = (*e - mean) * inv * s[ch] + b[ch];
        }
    }
    Tensor::from_array(ArrayD::from_shape_vec(x.raw_dim(), v).unwrap_or_else(|_| x.clone()))
}

pub(crate) fn instance_norm(
    x: &Tensor,
    scale: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> EvalResult<Tensor> {
    float_dispatch!(x, a => Ok(instance_norm_t(a, typed(scale)?, typed(bias)?, eps)))
}

fn layer_norm_t<T: Real>(
    x: &ArrayD<T>,
    scale: &ArrayD<T>,
    bias: Option<&ArrayD<T>>,
    axis: usize,
    eps: f32,
) -> EvalResult<Vec<Tensor>> {
    let norm_shape = &x.shape()[axis..];
    let inner: usize = norm_shape.iter().product();
    let bshape = ndarray::IxDyn(norm_shape);
    let s: Vec<T> = scale
        .broadcast(bshape.clone())
        .ok_or("scale does not broadcast")?
        .iter()
        .copied()
        .collect();
    let b: Vec<T> = match bias {
        Some(b) => b
            .broadcast(bshape)
            .ok_or("bias does not broadcast")?
            .iter()
            .copied()
            .collect(),
        None => vec![T::zero(); inner],
    };
    let mut v: Vec<T> = x.iter().copied().collect();
    let (mut means, mut invs) = (vec![], vec![]);
    for chunk in v.chunks_mut(inner.max(1)) {
        let (mean, var) = moments(chunk);
        let inv = T::one() / (var + T::lit(eps as f64)).sqrt();
        for (j, e) in chunk.iter_mut().enumerate() {
            *e = (*e - mean) * inv * s[j] + b[j];
        }
        means.push(mean.to_f32().unwrap_or(f32::NAN));
        invs.push(inv.to_f32().unwrap_or(f32::NAN));
    }
    let mut stat_shape = x.shape().to_vec();
    for d in &mut stat_shape[axis..] {
        *d = 1;
    }
    let y = Tensor::from_vec(x.shape(), v).ok_or("layer_norm shape")?;
    let m = Tensor::from_vec(&stat_shape, means).ok_or("layer_norm shape")?;
    let i = Tensor::from_vec(&stat_shape, invs).ok_or("layer_norm shape")?;
    Ok(vec![y, m, i])
}

pub(crate) fn layer_norm(
    x: &Tensor,
    scale: &Tensor,
    bias: Option<&Tensor>,
    axis: usize,
    eps: f32,
) -> EvalResult<Vec<Tensor>> {
    float_dispatch!(x, a => layer_norm_t(a, typed(scale)?, bias.map(typed).transpose()?, axis, eps))
}

fn lrn_t<T: Real>(x: &ArrayD<T>, size: usize, alpha: f32, beta: f32, bias: f32) -> Tensor {
    let c = x.shape()[1];
    let plane: usize = x.shape()[2..].iter().product();
    let v: Vec<T> = x.iter().copied().collect();
    let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
    let mut out = v.clone();
    for (i, o) in out.iter_mut().enumerate() {
        let (n, ch, p) = (i / (c * plane), (i / plane) % c, i % plane);
        let from = ch.saturating_sub(lo);
        let to = (ch + hi).min(c - 1);
        let sq: T = (from..=to)
            .map(|k| v[(n * c + k) * plane + p])
            .map(|e| e * e)
            .sum();
        let denom = (T::lit(bias as f64) + T::lit(alpha as f64) / T::lit(size as f64) * sq)
            .powf(T::lit(beta as f64));
        *o = v[i] / denom;
    }
    Tensor::from_array(ArrayD::from_shape_vec(x.raw_dim(), out).unwrap_or_else(|_| x.clone()))
}

pub(crate) fn lrn(x: &Tensor, size: usize, alpha: f32, beta: f32, bias: f32) -> EvalResult<Tensor> {
    if size == 0 {
        return Err("size must be positive".into());
    }
    float_dispatch!(x, a => Ok(lrn_t(a, size, alpha, beta, bias)))
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum PoolKind {
    Max,
    Average { count_include_pad: bool },
}

/// Pools `x`; also returns, for max pooling, each maximum's flat input index (see `Op::MaxPool`).
fn pool_t<T: Real>(
    x: &ArrayD<T>,
    p: &PoolAttrs,
    kind: PoolKind,
    col_major: bool,
) -> EvalResult<(Tensor, Tensor)> {
    let xs = x.shape();
    let sp = xs.len() - 2;
    let ins = &xs[2..];
    let mut outs = vec![];
    for d in 0..sp {
        let o = crate::infer::window_out(
            ins[d],
            p.kernel[d],
            p.strides[d],
            p.dilations[d],
            p.pads[d],
            p.pads[d + sp],
            p.ceil_mode,
        )
        .ok_or("window larger than the padded input")?;
        outs.push(o);
    }
    let plane: usize = ins.iter().product();
    let oplane: usize = outs.iter().product();
    let v: Vec<T> = x.iter().copied().collect();
    let mut out = Vec::with_capacity(xs[0] * xs[1] * oplane);
    let mut arg = Vec::with_capacity(xs[0] * xs[1] * oplane);
    let mut pos = vec![0i64; sp];
    for nc in 0..xs[0] * xs[1] {
        let base = nc * plane;
        for_each_index(&outs, |o| {
            let (mut acc, mut count, mut max, mut at) =
                (T::zero(), 0usize, T::neg_infinity(), None);
            let mut padded_count = 0usize;
            for_each_index(&p.kernel, |k| {
                let mut inside = true;
                let mut in_padded = true;
                for d in 0..sp {
                    pos[d] =
                        (o[d] * p.strides[d] + k[d] * p.dilations[d]) as i64 - p.pads[d] as i64;
                    inside &= pos[d] >= 0 && (pos[d] as usize) < ins[d];
                    in_padded &= pos[d] < (ins[d] + p.pads[d + sp]) as i64;
                }
                if in_padded {
                    padded_count += 1;
                }
                if inside {
                    let off = pos
                        .iter()
                        .zip(ins)
                        .fold(0usize, |acc, (&q, &n)| acc * n + q as usize);
                    let e = v[base + off];
                    acc = acc + e;
                    count += 1;
                    if e > max || (e.is_nan() && !max.is_nan()) || at.is_none() {
                        max = e;
                        let spatial = if col_major {
                            pos.iter()
                                .zip(ins)
                                .rev()
                                .fold(0usize, |acc, (&q, &n)| acc * n + q as usize)
                        } else {
                            off
                        };
                        at = Some((nc * plane + spatial) as i64);
                    }
                }
            });
            arg.push(at.unwrap_or(-1));
            out.push(match kind {
                PoolKind::Max => max,
                PoolKind::Average {
                    count_include_pad: true,
                } => acc / T::lit(padded_count as f64),
                PoolKind::Average {
                    count_include_pad: false,
                } => acc / T::lit(count as f64),
            });
        });
    }
    let mut shape = xs[..2].to_vec();
    shape.extend(outs);
    let values = Tensor::from_vec(&shape, out).ok_or("pool shape")?;
    Ok((values, Tensor::from_vec(&shape, arg).ok_or("pool shape")?))
}

pub(crate) fn pool(x: &Tensor, p: &PoolAttrs, kind: PoolKind) -> EvalResult<Tensor> {
    float_dispatch!(x, a => Ok(pool_t(a, p, kind, false)?.0))
}

/// Max pooling: values and indices. Defined for integer types too; those compare in f64, which is exact
/// for i8/u8/i32.
pub(crate) fn max_pool(x: &Tensor, p: &PoolAttrs, col_major: bool) -> EvalResult<Vec<Tensor>> {
    let (v, i) = match x {
        Tensor::I8(_) | Tensor::U8(_) | Tensor::I32(_) => {
            let (v, i) = float_dispatch!(&x.cast(crate::DType::F64), a => pool_t(a, p, PoolKind::Max, col_major)?);
            (v.cast(x.dtype()), i)
        }
        _ => float_dispatch!(x, a => pool_t(a, p, PoolKind::Max, col_major)?),
    };
    Ok(vec![v, i])
}

fn global_pool_t<T: Real>(a: &ArrayD<T>, max: bool) -> EvalResult<Tensor> {
    let plane: usize = a.shape()[2..].iter().product();
    let v: Vec<T> = a.iter().copied().collect();
    let out: Vec<T> = v
        .chunks(plane.max(1))
        .map(|c| {
            if max {
                c.iter().copied().fold(
                    T::neg_infinity(),
                    |m, e| if e > m || e.is_nan() { e } else { m },
                )
            } else {
                c.iter().copied().sum::<T>() / T::lit(plane as f64)
            }
        })
        .collect();
    let mut shape = a.shape().to_vec();
    for d in &mut shape[2..] {
        *d = 1;
    }
    Tensor::from_vec(&shape, out).ok_or_else(|| "global pool shape".to_string())
}

pub(crate) fn global_pool(x: &Tensor, max: bool) -> EvalResult<Tensor> {
    float_dispatch!(x, a => global_pool_t(a, max))
}
