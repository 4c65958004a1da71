//! The range the indices of a gathering or scattering op must lie in.

use crate::dtype::TensorType;
use crate::op::Op;

/// Where the indices (input 1) of a gathering or scattering op must lie, given its data's type (input 0):
/// each element in `-d..d` for the data axis `d` it indexes. `bounds[j]` is that axis's size for
/// component j of an index tuple (the last axis of GatherND's and ScatterND's indices), or the one
/// bound of the single-axis ops.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexBounds {
    pub bounds: Vec<i64>,
    pub tuple: bool,
}

impl IndexBounds {
    pub fn of(op: &Op, data: &TensorType) -> Option<IndexBounds> {
        let dims = |skip: usize| data.shape.iter().skip(skip).map(|d| *d as i64).collect();
        match op {
            Op::Gather { axis }
            | Op::GatherElements { axis }
            | Op::ScatterElements { axis, .. } => Some(IndexBounds {
                bounds: vec![*data.shape.get(*axis)? as i64],
                tuple: false,
            }),
            Op::GatherNd { batch_dims } => Some(IndexBounds {
                bounds: dims(*batch_dims),
                tuple: true,
            }),
            Op::ScatterNd { .. } => Some(IndexBounds {
                bounds: dims(0),
                tuple: true,
            }),
            _ => None,
        }
    }

    /// The axis size bounding element `i` of a flat index tensor whose last axis has `last` elements.
    pub fn bound(&self, i: usize, last: usize) -> i64 {
        let j = if self.tuple { i % last.max(1) } else { 0 };
        self.bounds.get(j).copied().unwrap_or(0)
    }

    /// The first out-of-range index among `values` (flat, last axis `last` long), with its bound.
    pub fn first_bad(&self, values: &[i64], last: usize) -> Option<(i64, i64)> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (*v, self.bound(i, last)))
            .find(|(v, d)| *v < -d || *v >= *d)
    }
}
