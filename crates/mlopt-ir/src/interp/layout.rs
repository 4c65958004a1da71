//! Data movement: Transpose, Concat, Split, Slice, Gather, GatherElements, Expand, Tile, Pad (constant,
//! reflect, edge, wrap; negative pads crop), DepthToSpace, SpaceToDepth, Trilu. Written once for every
//! element type through `dispatch!`.

use super::{typed, EvalResult};
use crate::dispatch;
use crate::op::PadMode;
use crate::tensor::{Elem, Tensor};
use ndarray::{ArrayD, Axis, Dimension, IxDyn, Slice};

pub(crate) fn transpose(x: &Tensor, perm: &[usize]) -> Tensor {
    dispatch!(x, a => Tensor::from_array(a.view().permuted_axes(IxDyn(perm)).to_owned()))
}

pub(crate) fn concat(xs: &[&Tensor], axis: usize) -> EvalResult<Tensor> {
    dispatch!(xs[0], first => {
        let mut views = vec![first.view()];
        for t in &xs[1..] {
            views.push(typed(t)?.view());
        }
        let out = ndarray::concatenate(Axis(axis), &views).map_err(|e| e.to_string())?;
        Ok(Tensor::from_array(out))
    })
}

pub(crate) fn split(x: &Tensor, axis: usize, sizes: &[usize]) -> Vec<Tensor> {
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let s = Slice::from(start..start + n);
            start += n;
            dispatch!(x, a => Tensor::from_array(a.slice_axis(Axis(axis), s).to_owned()))
        })
        .collect()
}

/// Takes, along each axis `d`, the positions `idx[d]`.
fn take_axes<T: Elem>(a: &ArrayD<T>, idx: &[Vec<usize>]) -> ArrayD<T> {
    let mut cur = a.clone();
    for (d, ix) in idx.iter().enumerate() {
        let identity = ix.len() == cur.shape()[d] && ix.iter().enumerate().all(|(i, &j)| i == j);
        if !identity {
            cur = cur.select(Axis(d), ix);
        }
    }
    cur
}

pub(crate) fn slice(x: &Tensor, starts: &[usize], steps: &[i64], lens: &[usize]) -> Tensor {
    let idx: Vec<Vec<usize>> = (0..starts.len())
        .map(|d| {
            (0..lens[d])
                .map(|i| (starts[d] as i64 + i as i64 * steps[d]) as usize)
                .collect()
        })
        .collect();
    dispatch!(x, a => Tensor::from_array(take_axes(a, &idx)))
}

/// Index values with negatives wrapped, checked against `dim`.
fn indices(t: &Tensor, dim: usize) -> EvalResult<Vec<usize>> {
    t.to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim as i64 } else { i };
            if j < 0 || j >= dim as i64 {
                Err(format!("index {i} out of range for axis of size {dim}"))
            } else {
                Ok(j as usize)
            }
        })
        .collect()
}

pub(crate) fn gather(x: &Tensor, idx: &Tensor, axis: usize) -> EvalResult<Tensor> {
    let ix = indices(idx, x.shape()[axis])?;
    let mut shape = x.shape()[..axis].to_vec();
    shape.extend_from_slice(idx.shape());
    shape.extend_from_slice(&x.shape()[axis + 1..]);
    dispatch!(x, a => {
        let taken = a.select(Axis(axis), &ix);
        Tensor::from_array(taken).reshape(&shape).ok_or_else(|| "gather shape".to_string())
    })
}

pub(crate) fn gather_elements(x: &Tensor, idx: &Tensor, axis: usize) -> EvalResult<Tensor> {
    let ix = indices(idx, x.shape()[axis])?;
    let ishape = idx.shape().to_vec();
    dispatch!(x, a => {
        let mut pos = 0;
        let mut bad = false;
        let out = ArrayD::from_shape_fn(IxDyn(&ishape), |i| {
            let mut j: Vec<usize> = i.slice().to_vec();
            j[axis] = ix[pos];
            pos += 1;
            match a.get(IxDyn(&j)) {
                Some(v) => *v,
                None => {
                    bad = true;
                    Default::default()
                }
            }
        });
        if bad {
            return Err("indices shape exceeds the data's off the gather axis".into());
        }
        Ok(Tensor::from_array(out))
    })
}

pub(crate) fn expand(x: &Tensor, shape: &[usize]) -> EvalResult<Tensor> {
    dispatch!(x, a => Ok(Tensor::from_array(a.broadcast(IxDyn(shape)).ok_or("does not broadcast")?.to_owned())))
}

pub(crate) fn tile(x: &Tensor, repeats: &[usize]) -> Tensor {
    let shape: Vec<usize> = x.shape().iter().zip(repeats).map(|(d, r)| d * r).collect();
    dispatch!(x, a => {
        let idx: Vec<Vec<usize>> = shape.iter().zip(a.shape()).map(|(&n, &d)| (0..n).map(|i| i % d).collect()).collect();
        Tensor::from_array(take_axes(a, &idx))
    })
}

/// Where output position `o` of a padded axis reads from, or `None` for the constant.
fn pad_source(o: usize, begin: i64, n: usize, mode: PadMode) -> Option<usize> {
    let p = o as i64 - begin;
    let n = n as i64;
    if (0..n).contains(&p) {
        return Some(p as usize);
    }
    match mode {
        PadMode::Constant => None,
        PadMode::Edge => Some(p.clamp(0, n - 1) as usize),
        PadMode::Wrap => Some(p.rem_euclid(n) as usize),
        PadMode::Reflect => {
            if n == 1 {
                return Some(0);
            }
            let period = 2 * (n - 1);
            let q = p.rem_euclid(period);
            Some(if q < n { q } else { period - q } as usize)
        }
    }
}

pub(crate) fn pad(x: &Tensor, pads: &[i64], mode: PadMode, value: f64) -> Tensor {
    let r = x.shape().len();
    let shape: Vec<usize> = (0..r)
        .map(|d| (x.shape()[d] as i64 + pads[d] + pads[d + r]) as usize)
        .collect();
    let maps: Vec<Vec<Option<usize>>> = (0..r)
        .map(|d| {
            (0..shape[d])
                .map(|o| pad_source(o, pads[d], x.shape()[d], mode))
                .collect()
        })
        .collect();
    dispatch!(x, a => {
        let fill = Elem::from_f64(value);
        let mut src = vec![0; r];
        Tensor::from_array(ArrayD::from_shape_fn(IxDyn(&shape), |i| {
            for d in 0..r {
                match maps[d][i[d]] {
                    Some(s) => src[d] = s,
                    None => return fill,
                }
            }
            a[IxDyn(&src)]
        }))
    })
}

/// Reshape to `pre`, permute by `perm`, reshape to `post`.
fn shuffle(x: &Tensor, pre: &[usize], perm: &[usize], post: &[usize]) -> EvalResult<Tensor> {
    let t = x.reshape(pre).ok_or("shuffle reshape")?;
    transpose(&t, perm)
        .reshape(post)
        .ok_or_else(|| "shuffle reshape".into())
}

pub(crate) fn depth_to_space(x: &Tensor, b: usize, crd: bool) -> EvalResult<Tensor> {
    let s = x.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let post = [n, c / (b * b), h * b, w * b];
    if crd {
        shuffle(x, &[n, c / (b * b), b, b, h, w], &[0, 1, 4, 2, 5, 3], &post)
    } else {
        shuffle(x, &[n, b, b, c / (b * b), h, w], &[0, 3, 4, 1, 5, 2], &post)
    }
}

pub(crate) fn space_to_depth(x: &Tensor, b: usize) -> EvalResult<Tensor> {
    let s = x.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    shuffle(
        x,
        &[n, c, h / b, b, w / b, b],
        &[0, 3, 5, 1, 2, 4],
        &[n, c * b * b, h / b, w / b],
    )
}

pub(crate) fn trilu(x: &Tensor, upper: bool, k: i64) -> Tensor {
    let r = x.shape().len();
    dispatch!(x, a => {
        let mut out = a.clone();
        for (idx, v) in out.indexed_iter_mut() {
            let (i, j) = (idx[r - 2] as i64, idx[r - 1] as i64);
            let keep = if upper { j - i >= k } else { j - i <= k };
            if !keep {
                *v = Default::default();
            }
        }
        Tensor::from_array(out)
    })
}
