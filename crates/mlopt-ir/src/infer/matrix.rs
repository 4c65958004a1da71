//! Matrix products: MatMul's, Gemm's and Attention's output types, and the mixed-type rules: a
//! bf16/f16 product with an f32 bias has an f32 result, and an i16 product is an i32 one (the integer
//! contractions of quantized models: 8-bit values less their zero points, summed exactly).

use super::{err, get, need_float, same_dtype, R};
use crate::dtype::{broadcast_shapes, DType, TensorType};

/// The output type of a matrix op (Gemm, Conv, ConvTranspose) whose operands have type `a` and whose
/// bias has type `bias`: the operands' type, or f32 where a bf16 or f16 product adds an f32 bias (the
/// product accumulated in f32, the bias added and the sum rounded once, to f32: the form precision
/// lowering writes, so that an epilogue after the op sees one rounding, not two).
pub(super) fn biased_dtype(a: &TensorType, bias: &TensorType, i: usize) -> R<DType> {
    if bias.dtype == DType::F32 && a.dtype.is_half() {
        return Ok(DType::F32);
    }
    let sum = product_dtype(a.dtype);
    if bias.dtype != sum {
        return err(
            Some(i),
            format!("bias is {}, the product {sum}", bias.dtype),
        );
    }
    Ok(sum)
}

/// The type a matrix product of operands of type `t` sums in: i32 for i16 (products and their sums
/// exact while they fit: a quantized model's 8-bit values less their zero points), else `t`.
pub fn product_dtype(t: DType) -> DType {
    match t {
        DType::I16 => DType::I32,
        t => t,
    }
}

pub(super) fn infer_attention(inputs: &[Option<&TensorType>]) -> R<Vec<TensorType>> {
    let (q, kt, v) = (get(inputs, 0)?, get(inputs, 1)?, get(inputs, 2)?);
    need_float(q, 0)?;
    if q.rank() < 2 || kt.rank() < 2 || v.rank() < 2 {
        return err(None, "q, kt and v must have rank 2 or more");
    }
    same_dtype(q, kt, 1)?;
    same_dtype(q, v, 2)?;
    let scores = infer_matmul(q, kt)?.remove(0);
    if let Some(m) = inputs.get(3).copied().flatten() {
        same_dtype(q, m, 3)?;
        if broadcast_shapes(&scores.shape, &m.shape).as_deref() != Some(&scores.shape[..]) {
            return err(
                Some(3),
                format!("mask {m} does not broadcast to the scores {scores}"),
            );
        }
    }
    infer_matmul(&scores, v)
}

pub(super) fn infer_gemm(
    (trans_a, trans_b): (bool, bool),
    inputs: &[Option<&TensorType>],
) -> R<Vec<TensorType>> {
    let (a, b) = (get(inputs, 0)?, get(inputs, 1)?);
    same_dtype(a, b, 1)?;
    if a.rank() != 2 || b.rank() != 2 {
        return err(
            Some(if a.rank() != 2 { 0 } else { 1 }),
            "gemm takes 2-D matrices",
        );
    }
    let (m, k) = if trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return err(Some(1), format!("inner dimensions differ: {k} vs {k2}"));
    }
    let mut dtype = product_dtype(a.dtype);
    if let Some(Some(c)) = inputs.get(2) {
        dtype = biased_dtype(a, c, 2)?;
        if broadcast_shapes(&c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
            return err(
                Some(2),
                format!("C of shape {:?} does not broadcast to [{m},{n}]", c.shape),
            );
        }
    }
    Ok(vec![TensorType::new(dtype, vec![m, n])])
}

pub(super) fn infer_matmul(a: &TensorType, b: &TensorType) -> R<Vec<TensorType>> {
    same_dtype(a, b, 1)?;
    if a.rank() == 0 || b.rank() == 0 {
        return err(
            Some(if a.rank() == 0 { 0 } else { 1 }),
            "matmul does not take scalars",
        );
    }
    if a.dtype == DType::Bool {
        return err(Some(0), "matmul does not take bool");
    }
    let ka = a.shape[a.rank() - 1];
    let kb = if b.rank() == 1 {
        b.shape[0]
    } else {
        b.shape[b.rank() - 2]
    };
    if ka != kb {
        return err(Some(1), format!("inner dimensions differ: {} @ {}", a, b));
    }
    let ba = if a.rank() > 2 {
        &a.shape[..a.rank() - 2]
    } else {
        &[][..]
    };
    let bb = if b.rank() > 2 {
        &b.shape[..b.rank() - 2]
    } else {
        &[][..]
    };
    let Some(mut shape) = broadcast_shapes(ba, bb) else {
        return err(
            Some(1),
            format!("batch dimensions of {a} and {b} do not broadcast"),
        );
    };
    if a.rank() >= 2 {
        shape.push(a.shape[a.rank() - 2]);
    }
    if b.rank() >= 2 {
        shape.push(b.shape[b.rank() - 1]);
    }
    Ok(vec![TensorType::new(product_dtype(a.dtype), shape)])
}
