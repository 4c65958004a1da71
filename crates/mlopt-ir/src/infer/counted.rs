//! The ops whose output size depends on the data (`Op::counts`): each output at its bound, then the
//! count, an i64 scalar.

use super::{err, get, R};
use crate::dtype::{DType, TensorType};

fn count() -> TensorType {
    TensorType::new(DType::I64, vec![])
}

/// NonZero: [rank, numel] indices.
pub(super) fn non_zero(x: &TensorType) -> R<Vec<TensorType>> {
    Ok(vec![
        TensorType::new(DType::I64, vec![x.rank(), x.numel()]),
        count(),
    ])
}

/// Compress along `axis`: as many slices as `cond` has, at most `x`'s extent.
pub(super) fn compress(x: &TensorType, cond: &TensorType, axis: usize) -> R<Vec<TensorType>> {
    if axis >= x.rank() {
        return err(Some(0), format!("axis {axis} is out of range for {x}"));
    }
    if cond.dtype != DType::Bool || cond.rank() != 1 {
        return err(Some(1), format!("the condition is {cond}, not a 1-D bool"));
    }
    let mut shape = x.shape.clone();
    shape[axis] = shape[axis].min(cond.shape[0]);
    Ok(vec![TensorType::new(x.dtype, shape), count()])
}

/// NonMaxSuppression: boxes [B, N, 4], scores [B, C, N]; the optional scalars; `bound` rows of 3.
pub(super) fn non_max_suppression(
    inputs: &[Option<&TensorType>],
    bound: usize,
) -> R<Vec<TensorType>> {
    let (boxes, scores) = (get(inputs, 0)?, get(inputs, 1)?);
    if boxes.dtype != DType::F32 || boxes.rank() != 3 || boxes.shape[2] != 4 {
        return err(
            Some(0),
            format!("boxes are {boxes}, not f32 [batch, boxes, 4]"),
        );
    }
    let s = &scores.shape;
    if scores.dtype != DType::F32
        || scores.rank() != 3
        || s[0] != boxes.shape[0]
        || s[2] != boxes.shape[1]
    {
        return err(
            Some(1),
            format!("scores are {scores}, not f32 [batch, classes, boxes] for boxes {boxes}"),
        );
    }
    for (i, dtype) in [(2, DType::I64), (3, DType::F32), (4, DType::F32)] {
        if let Some(t) = inputs.get(i).copied().flatten() {
            if t.dtype != dtype || t.numel() != 1 {
                return err(Some(i), format!("is {t}, not one {dtype}"));
            }
        }
    }
    let most = s[0].saturating_mul(s[1]).saturating_mul(s[2]);
    if bound > most {
        return err(
            None,
            format!("bound {bound} is more than the {most} boxes of all batches and classes"),
        );
    }
    Ok(vec![TensorType::new(DType::I64, vec![bound, 3]), count()])
}

/// Unique along `axis`: the distinct slices, their first indices, the inverse and the counts, at the
/// bound of every slice distinct.
pub(super) fn unique(x: &TensorType, axis: usize) -> R<Vec<TensorType>> {
    if axis >= x.rank() {
        return err(Some(0), format!("axis {axis} is out of range for {x}"));
    }
    let n = x.shape[axis];
    let index = || TensorType::new(DType::I64, vec![n]);
    Ok(vec![x.clone(), index(), index(), index(), count()])
}
