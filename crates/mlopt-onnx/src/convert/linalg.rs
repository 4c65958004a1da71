//! Linear algebra ONNX defines on batches of small matrices, imported as IR graphs: Det.

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Binary, DType, Op, Tensor, Unary, Value};

/// The largest M for which `Det` of an M x M matrix is imported: its elimination is unrolled, M steps of
/// about twenty ops.
pub(super) const DET_MAX: usize = 64;

/// `Det` of `[..., M, M]`: Gaussian elimination with partial pivoting, unrolled over the M columns with
/// every step on whole matrices (masks, not slices), in the input's type. Step k takes the row at or below
/// k whose entry in column k is largest in magnitude (the first of equals), swaps it into row k
/// (`gather_elements`; the determinant changes sign), multiplies the determinant by the pivot and
/// subtracts multiples of row k from the rows below. A zero pivot gives 0 (its column is zero at and below
/// k; the step divides by 1 instead), as numpy's `linalg.det` does.
pub(super) fn det(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let t = cx.ty(x).clone();
    let r = t.rank();
    if r < 2 || t.shape[r - 1] != t.shape[r - 2] || !t.dtype.is_float() {
        return Err(cx.err_in(
            0,
            format!("the input is {t}, not a batch of square float matrices"),
        ));
    }
    let m = t.shape[r - 1];
    if m > DET_MAX {
        return Err(cx.err_in(
            0,
            format!("{m} x {m} matrices: Det is imported up to {DET_MAX} x {DET_MAX}"),
        ));
    }
    let batch = t.shape[..r - 2].to_vec();
    let dtype = t.dtype;
    let (row_axis, col_axis) = (r - 2, r - 1);
    // Constant i64 tensors: an index (a scalar, or [1] to keep its axis) and the row numbers along the
    // last axis and down a column ([M, 1]).
    let ints = |cx: &mut NodeCx<'_, '_>, shape: &[usize], v: Vec<i64>| {
        let t = Tensor::from_vec(shape, v)
            .ok_or_else(|| cx.err("a constant of the wrong size (a bug in mlopt's Det)"))?;
        Ok::<Value, crate::error::OnnxError>(cx.konst_value(t))
    };
    let index = |cx: &mut NodeCx<'_, '_>, v: usize, keep: bool| {
        ints(cx, if keep { &[1] } else { &[] }, vec![v as i64])
    };
    let ids: Vec<i64> = (0..m as i64).collect();
    let rows = ints(cx, &[m], ids.clone())?;
    let rows_down = ints(cx, &[m, 1], ids)?;
    let one = cx.scalar(1.0, dtype);
    let mut det = cx.add1(
        Op::Expand {
            shape: batch.clone(),
        },
        &[one],
    )?;
    let mut a = x;
    for k in 0..m {
        let kk = cx.scalar(k as f64, DType::I64);
        // The pivot row: the largest magnitude at or below row k in column k.
        let at_k = index(cx, k, false)?;
        let column = cx.add1(Op::Gather { axis: col_axis }, &[a, at_k])?;
        let size = cx.un(Unary::Abs, column)?;
        let below = cx.bin(Binary::GreaterOrEqual, rows, kk)?;
        let none = cx.scalar(-1.0, dtype);
        let candidates = cx.add1(Op::Where, &[below, size, none])?;
        let arg = Op::Arg {
            max: true,
            axis: row_axis,
            keepdims: true,
            select_last_index: false,
        };
        let p = cx.add1(arg, &[candidates])?;
        // Rows k and p trade places.
        let is_k = cx.bin(Binary::Equal, rows, kk)?;
        let is_p = cx.bin(Binary::Equal, rows, p)?;
        let others = cx.add1(Op::Where, &[is_p, kk, rows])?;
        let order = cx.add1(Op::Where, &[is_k, p, others])?;
        let mut down = batch.clone();
        down.extend([m, 1]);
        let order = cx.add1(Op::Reshape { shape: down }, &[order])?;
        let mut full = batch.clone();
        full.extend([m, m]);
        let order = cx.add1(Op::Expand { shape: full }, &[order])?;
        a = cx.add1(Op::GatherElements { axis: row_axis }, &[a, order])?;
        let p = cx.add1(
            Op::Reshape {
                shape: batch.clone(),
            },
            &[p],
        )?;
        let stays = cx.bin(Binary::Equal, p, kk)?;
        let minus = cx.scalar(-1.0, dtype);
        let sign = cx.add1(Op::Where, &[stays, one, minus])?;
        det = cx.bin(Binary::Mul, det, sign)?;
        // The pivot, then the rows below lose their multiples of row k.
        let row_k = cx.add1(Op::Gather { axis: row_axis }, &[a, at_k])?;
        let pivot = cx.add1(Op::Gather { axis: row_axis }, &[row_k, at_k])?;
        det = cx.bin(Binary::Mul, det, pivot)?;
        if k + 1 == m {
            break;
        }
        let mut corner = batch.clone();
        corner.extend([1, 1]);
        let pivot = cx.add1(Op::Reshape { shape: corner }, &[pivot])?;
        let zero = cx.scalar(0.0, dtype);
        let is_zero = cx.bin(Binary::Equal, pivot, zero)?;
        let divisor = cx.add1(Op::Where, &[is_zero, one, pivot])?;
        let keep_k = index(cx, k, true)?;
        let column = cx.add1(Op::Gather { axis: col_axis }, &[a, keep_k])?;
        let factor = cx.bin(Binary::Div, column, divisor)?;
        let lower = cx.bin(Binary::Greater, rows_down, kk)?;
        let factor = cx.add1(Op::Where, &[lower, factor, zero])?;
        let row = cx.add1(Op::Gather { axis: row_axis }, &[a, keep_k])?;
        let step = cx.bin(Binary::Mul, factor, row)?;
        a = cx.bin(Binary::Sub, a, step)?;
    }
    Ok(det)
}
