//! The ops whose output size depends on the data (`Op::counts`), as the compiled kernels compute them:
//! each output at its bound with zeros after the values, then the count.

use super::EvalResult;
use crate::dtype::{DType, TensorType};
use crate::tensor::Tensor;

fn count(n: usize) -> Tensor {
    Tensor::scalar(n as i64)
}

/// [rank, numel]: column j holds the index of the j-th nonzero element (NaN counts as nonzero).
pub(super) fn non_zero(x: &Tensor) -> EvalResult<Vec<Tensor>> {
    let (shape, n) = (x.shape().to_vec(), x.numel());
    let mut out = vec![0i64; shape.len() * n];
    let mut found = 0;
    for (flat, v) in x.to_f64_vec().into_iter().enumerate() {
        if v == 0.0 {
            continue;
        }
        let mut rest = flat;
        for d in (0..shape.len()).rev() {
            out[d * n + found] = (rest % shape[d]) as i64;
            rest /= shape[d];
        }
        found += 1;
    }
    let t = Tensor::from_vec(&[shape.len(), n], out).ok_or("internal: non_zero's shape")?;
    Ok(vec![t, count(found)])
}

/// The slices of `x` along `axis` whose condition is true, packed to the front, then zeros.
pub(super) fn compress(x: &Tensor, cond: &Tensor, axis: usize) -> EvalResult<Vec<Tensor>> {
    let shape = x.shape();
    let bound = shape[axis].min(cond.numel());
    let outer: usize = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product::<usize>() * x.dtype().size();
    let bytes = x.to_le_bytes();
    let keep: Vec<usize> = cond.to_f64_vec()[..bound]
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != 0.0)
        .map(|(i, _)| i)
        .collect();
    let mut out = vec![0u8; outer * bound * inner];
    for o in 0..outer {
        for (j, &i) in keep.iter().enumerate() {
            let src = (o * shape[axis] + i) * inner;
            let dst = (o * bound + j) * inner;
            out[dst..dst + inner].copy_from_slice(&bytes[src..src + inner]);
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[axis] = bound;
    let ty = TensorType::new(x.dtype(), out_shape);
    let t = Tensor::from_le_bytes(&ty, &out).ok_or("internal: compress's bytes")?;
    Ok(vec![t, count(keep.len())])
}

/// Whether two boxes' IoU exceeds `threshold` (f32 arithmetic, the ONNX reference's steps).
pub fn suppresses(a: [f32; 4], b: [f32; 4], center_point_box: bool, threshold: f32) -> bool {
    // (x min, x max, y min, y max) of each box.
    let span = |b: [f32; 4]| {
        if center_point_box {
            let (w, h) = (b[2] / 2.0, b[3] / 2.0);
            [b[0] - w, b[0] + w, b[1] - h, b[1] + h]
        } else {
            [
                b[1].min(b[3]),
                b[1].max(b[3]),
                b[0].min(b[2]),
                b[0].max(b[2]),
            ]
        }
    };
    let (p, q) = (span(a), span(b));
    let (x0, x1) = (p[0].max(q[0]), p[1].min(q[1]));
    let (y0, y1) = (p[2].max(q[2]), p[3].min(q[3]));
    if x1 <= x0 || y1 <= y0 {
        return false;
    }
    let inter = (x1 - x0) * (y1 - y0);
    let area = |s: [f32; 4]| (s[1] - s[0]) * (s[3] - s[2]);
    let (a1, a2) = (area(p), area(q));
    let union = a1 + a2 - inter;
    if inter <= 0.0 || a1 <= 0.0 || a2 <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > threshold
}

/// Rows (batch, class, box) of the boxes chosen per batch and class, at most `bound` of them.
pub(super) fn non_max_suppression(
    args: &[Option<&Tensor>],
    center_point_box: bool,
    bound: usize,
) -> EvalResult<Vec<Tensor>> {
    let (Some(boxes), Some(scores)) = (args[0], args[1]) else {
        return Err("boxes or scores are missing".into());
    };
    let scalar = |i: usize| args.get(i).copied().flatten().map(|t| t.to_f64_vec()[0]);
    let most = scalar(2).map_or(0, |m| m.max(0.0) as usize);
    let iou = scalar(3).map_or(0.0, |v| v as f32);
    let floor = scalar(4).map(|v| v as f32);
    let (b, c, n) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
    let (bx, sc) = (boxes.cast(DType::F32).to_f64_vec(), scores.to_f64_vec());
    let corner = |batch: usize, i: usize| {
        let at = (batch * n + i) * 4;
        [0, 1, 2, 3].map(|k| bx[at + k] as f32)
    };
    let mut rows: Vec<i64> = vec![];
    for batch in 0..b {
        for class in 0..c {
            let s = |i: usize| sc[(batch * c + class) * n + i] as f32;
            let mut order: Vec<usize> =
                (0..n).filter(|&i| floor.is_none_or(|f| s(i) > f)).collect();
            // Descending score, ties by lower index (a stable sort keeps index order).
            order.sort_by(|&i, &j| s(j).partial_cmp(&s(i)).unwrap_or(std::cmp::Ordering::Equal));
            let mut chosen: Vec<usize> = vec![];
            for i in order {
                if chosen.len() >= most {
                    break;
                }
                if chosen.iter().all(|&k| {
                    !suppresses(corner(batch, i), corner(batch, k), center_point_box, iou)
                }) {
                    chosen.push(i);
                    rows.extend([batch as i64, class as i64, i as i64]);
                }
            }
        }
    }
    let found = rows.len() / 3;
    if found > bound {
        return Err(format!(
            "{found} boxes were chosen, more than the bound of {bound} (max_output_boxes_per_class \
             differs from the value the model was compiled with)"
        ));
    }
    rows.resize(bound * 3, 0);
    let t = Tensor::from_vec(&[bound, 3], rows).ok_or("internal: non_max_suppression's shape")?;
    Ok(vec![t, count(found)])
}

/// Unique along `axis` (see `Op::Unique`), in the compiled kernel's steps so that both give the same
/// answer where the order is not total (NaN): slices compared element by element in their own type
/// (integers as integers); a slice's rank, when sorted, is the number of distinct slices before it in
/// lexicographic order (at the first element that differs), else the number of distinct slices that
/// occur first before it.
pub(super) fn unique(x: &Tensor, axis: usize, sorted: bool) -> EvalResult<Vec<Tensor>> {
    let shape = x.shape();
    let n = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let (ints, floats) = if x.dtype().is_float() {
        (vec![], x.to_f64_vec())
    } else {
        (x.to_i64_vec(), vec![])
    };
    // Slice i's element e: for each outer index, its inner run.
    let at = |i: usize, e: usize| (e / inner.max(1) * n + i) * inner + e % inner.max(1);
    let elems = outer * inner;
    // (differs, less) at element e of slices i and j.
    let differ = |i: usize, j: usize, e: usize| {
        let (a, b) = (at(i, e), at(j, e));
        if ints.is_empty() {
            (floats[a] != floats[b], floats[a] < floats[b])
        } else {
            (ints[a] != ints[b], ints[a] < ints[b])
        }
    };
    let same = |i: usize, j: usize| (0..elems).all(|e| !differ(i, j, e).0);
    let less = |j: usize, i: usize| {
        (0..elems)
            .map(|e| differ(j, i, e))
            .find(|d| d.0)
            .is_some_and(|d| d.1)
    };
    let first: Vec<usize> = (0..n)
        .map(|i| (0..i).find(|&j| same(i, j)).unwrap_or(i))
        .collect();
    let mut indices = vec![0i64; n];
    let mut counts = vec![0i64; n];
    let mut u = 0;
    let mut placed = vec![None; n];
    for i in (0..n).filter(|&i| first[i] == i) {
        let k = if sorted {
            (0..n).filter(|&j| first[j] == j && less(j, i)).count()
        } else {
            u
        };
        indices[k] = i as i64;
        counts[k] = 0;
        placed[k] = Some(i);
        u += 1;
    }
    let mut inverse: Vec<i64> = first.iter().map(|&f| f as i64).collect();
    for (i, inv) in inverse.iter_mut().enumerate() {
        if let Some(k) = (0..u).find(|&k| indices[k] == first[i] as i64) {
            *inv = k as i64;
            counts[k] += 1;
        }
    }
    let size = x.dtype().size();
    let bytes = x.to_le_bytes();
    let mut out = vec![0u8; bytes.len()];
    for o in 0..outer {
        for (k, d) in placed.iter().enumerate().take(u) {
            let Some(d) = d else { continue };
            let (src, dst) = ((o * n + d) * inner * size, (o * n + k) * inner * size);
            out[dst..dst + inner * size].copy_from_slice(&bytes[src..src + inner * size]);
        }
    }
    for k in u..n {
        indices[k] = 0;
        counts[k] = 0;
    }
    let y = Tensor::from_le_bytes(&x.ty(), &out).ok_or("internal: unique's bytes")?;
    let index = |v: Vec<i64>| Tensor::from_vec(&[n], v).ok_or("internal: unique's shape");
    Ok(vec![
        y,
        index(indices)?,
        index(inverse)?,
        index(counts)?,
        count(u),
    ])
}
