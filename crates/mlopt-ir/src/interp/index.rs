//! Index-driven data movement: TopK, GatherND, ScatterND, ScatterElements. Indices may be negative
//! (counted from the end); out-of-range indices are errors.

use super::elementwise::Arith;
use super::{num_dispatch, typed, EvalResult};
use crate::op::ScatterReduction;
use crate::tensor::{Elem, Tensor};
use ndarray::{ArrayD, IxDyn};

fn wrap(i: i64, dim: usize) -> EvalResult<usize> {
    let j = if i < 0 { i + dim as i64 } else { i };
    if j < 0 || j >= dim as i64 {
        Err(format!("index {i} out of range for axis of size {dim}"))
    } else {
        Ok(j as usize)
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn top_k_t<T: Elem>(
    a: &ArrayD<T>,
    axis: usize,
    k: usize,
    largest: bool,
) -> EvalResult<Vec<Tensor>> {
    let r = a.ndim();
    let mut perm: Vec<usize> = (0..r).filter(|&d| d != axis).collect();
    perm.push(axis);
    let n = a.shape()[axis];
    let moved: Vec<T> = a
        .view()
        .permuted_axes(IxDyn(&perm))
        .iter()
        .copied()
        .collect();
    // NaN counts as the largest value, as in a numpy sort.
    let key = |v: T| {
        let f = v.to_f64();
        if f.is_nan() {
            f64::INFINITY
        } else {
            f
        }
    };
    let (mut vals, mut idxs) = (vec![], vec![]);
    for lane in moved
        .chunks(n.max(1))
        .take(if n == 0 { 0 } else { usize::MAX })
    {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&i, &j| {
            let (x, y) = (key(lane[i]), key(lane[j]));
            let c = if largest {
                y.total_cmp(&x)
            } else {
                x.total_cmp(&y)
            };
            c.then(i.cmp(&j))
        });
        for &i in &order[..k] {
            vals.push(lane[i]);
            idxs.push(i as i64);
        }
    }
    let mut moved_shape: Vec<usize> = perm.iter().map(|&d| a.shape()[d]).collect();
    moved_shape[r - 1] = k;
    let mut inverse = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let back = |t: Tensor| super::layout::transpose(&t, &inverse);
    let v = Tensor::from_vec(&moved_shape, vals).ok_or("top_k shape")?;
    let i = Tensor::from_vec(&moved_shape, idxs).ok_or("top_k shape")?;
    Ok(vec![back(v), back(i)])
}

pub(crate) fn top_k(x: &Tensor, axis: usize, k: usize, largest: bool) -> EvalResult<Vec<Tensor>> {
    crate::dispatch!(x, a => top_k_t(a, axis, k, largest))
}

pub(crate) fn gather_nd(x: &Tensor, idx: &Tensor, b: usize) -> EvalResult<Tensor> {
    let (ds, is) = (x.shape().to_vec(), idx.shape().to_vec());
    let q = is.len();
    let last = is[q - 1];
    let iv = idx.to_i64_vec();
    let slice: usize = ds[b + last..].iter().product();
    let batch_block: usize = ds[b..].iter().product();
    let rows_per_batch: usize = is[b..q - 1].iter().product();
    let st = strides(&ds[b..]);
    let mut offsets = vec![];
    for (r, tuple) in iv
        .chunks(last.max(1))
        .enumerate()
        .take(is[..q - 1].iter().product())
    {
        let mut off = (r / rows_per_batch.max(1)) * batch_block;
        for j in 0..last {
            off += wrap(tuple[j], ds[b + j])? * st[j];
        }
        offsets.push(off);
    }
    let mut shape = is[..q - 1].to_vec();
    shape.extend_from_slice(&ds[b + last..]);
    crate::dispatch!(x, a => {
        let v: Vec<_> = a.iter().copied().collect();
        let out: Vec<_> = offsets.iter().flat_map(|&o| v[o..o + slice].iter().copied()).collect();
        Tensor::from_vec(&shape, out).ok_or_else(|| "gather_nd shape".to_string())
    })
}

fn combine<T: Arith>(r: ScatterReduction, old: T, new: T) -> T {
    match r {
        ScatterReduction::None => new,
        ScatterReduction::Add => old.add(new),
        ScatterReduction::Mul => old.mul(new),
        ScatterReduction::Max => old.max_(new),
        ScatterReduction::Min => old.min_(new),
    }
}

/// Applies `updates[u]` at data offset `targets[u]` (flat), in order.
fn scatter_t<T: Arith>(
    a: &ArrayD<T>,
    upd: &ArrayD<T>,
    targets: &[usize],
    per: usize,
    r: ScatterReduction,
) -> EvalResult<Tensor> {
    let mut v: Vec<T> = a.iter().copied().collect();
    let u: Vec<T> = upd.iter().copied().collect();
    for (k, &t) in targets.iter().enumerate() {
        for e in 0..per {
            v[t + e] = combine(r, v[t + e], u[k * per + e]);
        }
    }
    Tensor::from_vec(a.shape(), v).ok_or_else(|| "scatter shape".into())
}

pub(crate) fn scatter_nd(
    x: &Tensor,
    idx: &Tensor,
    upd: &Tensor,
    r: ScatterReduction,
) -> EvalResult<Tensor> {
    let (ds, is) = (x.shape().to_vec(), idx.shape().to_vec());
    let last = is[is.len() - 1];
    let st = strides(&ds);
    let per: usize = ds[last..].iter().product();
    let rows: usize = is[..is.len() - 1].iter().product();
    let iv = idx.to_i64_vec();
    let mut targets = Vec::with_capacity(rows);
    for row in 0..rows {
        let mut off = 0;
        for j in 0..last {
            off += wrap(iv[row * last + j], ds[j])? * st[j];
        }
        targets.push(off);
    }
    num_dispatch!(x, a => scatter_t(a, typed(upd)?, &targets, per, r))
}

pub(crate) fn scatter_elements(
    x: &Tensor,
    idx: &Tensor,
    upd: &Tensor,
    axis: usize,
    r: ScatterReduction,
) -> EvalResult<Tensor> {
    let (ds, is) = (x.shape().to_vec(), idx.shape().to_vec());
    let (dst, ist) = (strides(&ds), strides(&is));
    let iv = idx.to_i64_vec();
    let mut targets = Vec::with_capacity(iv.len());
    for (p, &i) in iv.iter().enumerate() {
        let mut off = 0;
        for d in 0..ds.len() {
            let coord = (p / ist[d]) % is[d];
            let c = if d == axis { wrap(i, ds[d])? } else { coord };
            if c >= ds[d] {
                return Err(format!("indices shape {is:?} exceeds the data's {ds:?}"));
            }
            off += c * dst[d];
        }
        targets.push(off);
    }
    num_dispatch!(x, a => scatter_t(a, typed(upd)?, &targets, 1, r))
}
