//! Quantization ops (u8/i8, per-tensor, per-axis or blocked), lowered onto casts and arithmetic that
//! reproduce ONNX's integer semantics exactly: integer products are formed in i32 (or in f64 for
//! convolutions, exact at these magnitudes), rounding is half-to-even, results saturate to the type's range.

use super::nn::axis;
use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Binary, ConvAttrs, DType, Op, ReduceKind, Tensor, Unary, Value};

pub(crate) const OPS: &[&str] = &[
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "QLinearMatMul",
    "MatMulInteger",
    "ConvInteger",
    "QLinearConv",
];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        Ok(Some(match op {
            "QuantizeLinear" => vec![quantize(cx)?],
            "DequantizeLinear" => vec![dequantize(cx)?],
            "DynamicQuantizeLinear" => dynamic_quantize(cx)?,
            "QLinearMatMul" => vec![qlinear_matmul(cx)?],
            "MatMulInteger" => vec![matmul_integer(cx)?],
            "ConvInteger" => vec![conv_integer(cx, false)?],
            "QLinearConv" => vec![conv_integer(cx, true)?],
            _ => return Ok(None),
        }))
    })();
    r.transpose()
}

/// A scale or zero point shaped to broadcast against `shape`: scalars stay, a 1-D per-axis vector is laid
/// along `axis`, and a blocked one (`block > 0`) is repeated `block` times along `axis`.
fn align(
    cx: &mut NodeCx<'_, '_>,
    p: Value,
    shape: &[usize],
    axis_: usize,
    block: usize,
) -> Result<Value> {
    let ps = cx.ty(p).shape.clone();
    if ps.iter().product::<usize>() == 1 && ps.len() <= 1 {
        return cx.add1(Op::Reshape { shape: vec![] }, &[p]);
    }
    if axis_ >= shape.len() {
        return Err(cx.err(format!(
            "axis {axis_} is out of range for a per-axis parameter of {shape:?}"
        )));
    }
    if block > 0 {
        let idx: Vec<i64> = (0..shape[axis_]).map(|i| (i / block) as i64).collect();
        let idx = cx
            .konst_value(Tensor::from_vec(&[idx.len()], idx).ok_or_else(|| cx.err("block index"))?);
        return cx.add1(Op::Gather { axis: axis_ }, &[p, idx]);
    }
    if ps.len() != 1 || ps[0] != shape[axis_] {
        return Err(cx.err(format!(
            "per-axis parameter of shape {ps:?} does not fit axis {axis_} of {shape:?}"
        )));
    }
    let mut s = vec![1; shape.len()];
    s[axis_] = ps[0];
    cx.add1(Op::Reshape { shape: s }, &[p])
}

/// (axis, block_size) attributes. The axis is resolved against `rank` only where a parameter is per-axis,
/// since per-tensor parameters ignore it (and its default, 1, may not exist).
fn axis_block(cx: &mut NodeCx<'_, '_>, rank: usize, per_axis: bool) -> Result<(usize, usize)> {
    let a = cx.int("axis", 1)?;
    let a = if per_axis { axis(cx, a, rank)? } else { 0 };
    let b = cx.int("block_size", 0)?;
    Ok((
        a,
        usize::try_from(b).map_err(|_| cx.err("block_size must not be negative"))?,
    ))
}

/// round(v) + zp, saturated to `to`'s range and cast; `v` is floating point, `zp` optional (integers).
fn saturate_int(cx: &mut NodeCx<'_, '_>, v: Value, zp: Option<Value>, to: DType) -> Result<Value> {
    let (lo, hi) = to
        .int_range()
        .ok_or_else(|| cx.err(format!("quantizing to {to} is not supported")))?;
    let wide = cx.ty(v).dtype;
    let mut r = cx.un(Unary::Round, v)?;
    if let Some(zp) = zp {
        let z = cx.cast_to(zp, wide)?;
        r = cx.bin(Binary::Add, r, z)?;
    }
    let (l, h) = (cx.scalar(lo, wide), cx.scalar(hi, wide));
    let c = cx.add1(Op::Clip, &[r, l, h])?;
    cx.cast_to(c, to)
}

fn quantize(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, scale, zp) = (cx.req(0)?, cx.req(1)?, cx.input(2)?);
    let shape = cx.ty(x).shape.clone();
    let per_axis = cx.ty(scale).numel() > 1 || zp.is_some_and(|z| cx.ty(z).numel() > 1);
    let (a, block) = axis_block(cx, shape.len(), per_axis)?;
    let saturate = cx.int("saturate", 1)? != 0;
    let out_attr = cx.int_opt("output_dtype")?;
    let precision = cx.int_opt("precision")?;
    let to = match (zp, out_attr) {
        (Some(z), _) => cx.ty(z).dtype,
        (None, Some(d)) => crate::tensor_io::dtype_from_onnx(d as i32)
            .ok_or_else(|| cx.err(format!("output_dtype {d} is not supported")))?,
        (None, None) => DType::U8,
    };
    let wide = match precision {
        Some(p) => crate::tensor_io::dtype_from_onnx(p as i32)
            .ok_or_else(|| cx.err(format!("precision {p} is not supported")))?,
        None => cx.ty(x).dtype,
    };
    let s = align(cx, scale, &shape, a, block)?;
    let (xw, sw) = (cx.cast_to(x, wide)?, cx.cast_to(s, wide)?);
    let q = cx.bin(Binary::Div, xw, sw)?;
    let z = match zp {
        Some(z) => Some(align(cx, z, &shape, a, block)?),
        None => None,
    };
    match to.minifloat() {
        Some(f) => quantize_float(cx, q, z, to, f.max(), saturate),
        None => saturate_int(cx, q, z, to),
    }
}

/// Quantizing to float8 / float4 is a cast that rounds to nearest even: float8 ignores the zero point
/// and clamps to the largest value with `saturate`; float4 adds the zero point, and saturates anyway
/// (as ONNX's reference computes them).
fn quantize_float(
    cx: &mut NodeCx<'_, '_>,
    q: Value,
    zp: Option<Value>,
    to: DType,
    max: f64,
    saturate: bool,
) -> Result<Value> {
    let wide = cx.ty(q).dtype;
    let q = match zp {
        Some(z) if to == DType::F4E2M1 => {
            let z = cx.cast_to(z, wide)?;
            cx.bin(Binary::Add, q, z)?
        }
        _ => q,
    };
    let q = if saturate && to != DType::F4E2M1 {
        super::elementwise::clamp_to_largest(cx, q, max)?
    } else {
        q
    };
    cx.cast_to(q, to)
}

fn dequantize(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, scale, zp) = (cx.req(0)?, cx.req(1)?, cx.input(2)?);
    let shape = cx.ty(x).shape.clone();
    let xt = cx.ty(x).dtype;
    if !(matches!(
        xt,
        DType::U8
            | DType::I8
            | DType::U16
            | DType::I16
            | DType::I32
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2
    ) || xt.minifloat().is_some())
    {
        return Err(cx.err_in(
            0,
            format!("dequantizing {} is not supported", cx.ty(x).dtype),
        ));
    }
    // An 8-bit constant (a quantized weight) stays dequantized by ops, which the optimiser folds and
    // reads its integers from (mlopt-rewrite's `rules/quant.rs`).
    cx.keep_ops = matches!(xt, DType::U8 | DType::I8) && cx.imp.g.const_value(x).is_some();
    let per_axis = cx.ty(scale).numel() > 1 || zp.is_some_and(|z| cx.ty(z).numel() > 1);
    let (a, block) = axis_block(cx, shape.len(), per_axis)?;
    let out = match cx.int_opt("output_dtype")? {
        Some(d) => crate::tensor_io::dtype_from_onnx(d as i32)
            .ok_or_else(|| cx.err(format!("output_dtype {d} is not supported")))?,
        None => cx.ty(scale).dtype,
    };
    let mut dx = cx.cast_to(x, DType::F32)?;
    if let Some(z) = zp {
        let z = align(cx, z, &shape, a, block)?;
        let zf = cx.cast_to(z, DType::F32)?;
        dx = cx.bin(Binary::Sub, dx, zf)?;
    }
    let s = align(cx, scale, &shape, a, block)?;
    let sf = cx.cast_to(s, DType::F32)?;
    let y = cx.bin(Binary::Mul, dx, sf)?;
    cx.cast_to(y, out)
}

fn dynamic_quantize(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let x = cx.req(0)?;
    let ty = cx.ty(x).clone();
    let all: Vec<usize> = (0..ty.rank()).collect();
    let zero = cx.scalar(0.0, ty.dtype);
    let mx = cx.reduce(ReduceKind::Max, x, all.clone(), false)?;
    let mn = cx.reduce(ReduceKind::Min, x, all, false)?;
    let mx = cx.add1(Op::Nary(mlopt_ir::Nary::Max), &[mx, zero])?;
    let mn = cx.add1(Op::Nary(mlopt_ir::Nary::Min), &[mn, zero])?;
    let span = cx.bin(Binary::Sub, mx, mn)?;
    let flat = cx.bin(Binary::Equal, mx, mn)?;
    let one = cx.scalar(1.0, ty.dtype);
    let span = cx.add1(Op::Where, &[flat, one, span])?;
    let q = cx.scalar(255.0, ty.dtype);
    let scale = cx.bin(Binary::Div, span, q)?;
    let shifted = cx.bin(Binary::Div, mn, scale)?;
    let izp = cx.bin(Binary::Sub, zero, shifted)?;
    let (lo, hi) = (cx.scalar(0.0, ty.dtype), cx.scalar(255.0, ty.dtype));
    let zp = cx.add1(Op::Clip, &[izp, lo, hi])?;
    let zpi = cx.un(Unary::Round, zp)?;
    let xs = cx.bin(Binary::Div, x, scale)?;
    let y = saturate_int(cx, xs, Some(zpi), DType::U8)?;
    let zpu = cx.cast_to(zpi, DType::U8)?;
    Ok(vec![y, scale, zpu])
}

/// `cast(v, t) - cast(zp, t)` (no subtraction without a zero point). A zero point of more than one
/// element on a matrix's rows (`rows`: MatMulInteger's `a_zero_point` of shape [M]) is laid along them.
fn centred(
    cx: &mut NodeCx<'_, '_>,
    v: Value,
    zp: Option<Value>,
    t: DType,
    rows: bool,
) -> Result<Value> {
    let vi = cx.cast_to(v, t)?;
    let Some(z) = zp else { return Ok(vi) };
    let z = match (rows, cx.ty(z).shape.clone()) {
        (true, zs) if zs.len() == 1 && zs[0] > 1 => cx.add1(
            Op::Reshape {
                shape: vec![zs[0], 1],
            },
            &[z],
        )?,
        _ => z,
    };
    let zi = cx.cast_to(z, t)?;
    cx.bin(Binary::Sub, vi, zi)
}

/// Whether the values are 8-bit integers, whose differences i16 holds and whose products' sums the
/// integer dot product's blocks compute in i32.
fn eight_bit(cx: &NodeCx<'_, '_>, vs: &[Option<Value>]) -> bool {
    vs.iter()
        .flatten()
        .all(|&v| matches!(cx.ty(v).dtype, DType::U8 | DType::I8))
}

/// `(a - az) x (b - bz)` summed in i32: over i16 operands where they are 8-bit (the integer
/// contraction `rules/quant.rs` writes for QDQ models, which the schedules run on the integer dot
/// product's blocks), over i32 ones otherwise.
fn integer_matmul(
    cx: &mut NodeCx<'_, '_>,
    (a, az): (Value, Option<Value>),
    (b, bz): (Value, Option<Value>),
) -> Result<Value> {
    let t = if eight_bit(cx, &[Some(a), az, Some(b), bz]) {
        DType::I16
    } else {
        DType::I32
    };
    let ai = centred(cx, a, az, t, true)?;
    let bi = centred(cx, b, bz, t, false)?;
    cx.add1(Op::MatMul, &[ai, bi])
}

fn matmul_integer(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (a, b, az, bz) = (cx.req(0)?, cx.req(1)?, cx.input(2)?, cx.input(3)?);
    integer_matmul(cx, (a, az), (b, bz))
}

fn qlinear_matmul(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (a, a_s, a_z) = (cx.req(0)?, cx.req(1)?, cx.input(2)?);
    let (b, b_s, b_z) = (cx.req(3)?, cx.req(4)?, cx.input(5)?);
    let (y_s, y_z) = (cx.req(6)?, cx.input(7)?);
    let to = match y_z {
        Some(z) => cx.ty(z).dtype,
        None => cx.ty(a).dtype,
    };
    let c = integer_matmul(cx, (a, a_z), (b, b_z))?;
    // As ONNX's reference: the scale ratio in the scales' type, the product in f64.
    let ab = cx.bin(Binary::Mul, a_s, b_s)?;
    let ratio = cx.bin(Binary::Div, ab, y_s)?;
    let ratio = cx.cast_to(ratio, DType::F64)?;
    let cf = cx.cast_to(c, DType::F64)?;
    let d = cx.bin(Binary::Mul, cf, ratio)?;
    // Rounded, the zero point added and saturated to the output type, as the specification and onnx
    // 1.23's reference have it (onnx 1.18's reference wrapped out-of-range results).
    saturate_int(cx, d, y_z, to)
}

/// ConvInteger (i32 result) and QLinearConv (requantised). The sum is computed exactly, in the narrowest
/// form that holds it: 8-bit operands of a convolution of one group as i16 summed in i32 (the integer
/// contraction of `rules/quant.rs`, run on the integer dot product's blocks); a grouped one in f32 where
/// every partial sum is an integer below 2^24 (depth x 255 x 255: the depthwise schedules then take
/// it); else in f64.
fn conv_integer(cx: &mut NodeCx<'_, '_>, qlinear: bool) -> Result<Value> {
    let slots: [usize; 4] = if qlinear { [0, 2, 3, 5] } else { [0, 2, 1, 3] };
    let (x, x_z, w, w_z) = (
        cx.req(slots[0])?,
        cx.input(slots[1])?,
        cx.req(slots[2])?,
        cx.input(slots[3])?,
    );
    let wshape = cx.ty(w).shape.clone();
    if wshape.len() < 3 || wshape.len() != cx.ty(x).rank() {
        return Err(cx.err_in(
            slots[2],
            format!(
                "weight {wshape:?} does not match input {:?}",
                cx.ty(x).shape
            ),
        ));
    }
    let sp = wshape.len().saturating_sub(2);
    let group = cx.int("group", 1)?.max(1) as usize;
    let depth = wshape[1..].iter().product::<usize>();
    let sum_type = match (eight_bit(cx, &[Some(x), x_z, Some(w), w_z]), group) {
        (true, 1) => DType::I16,
        (true, _) if depth.saturating_mul(255 * 255) < 1 << 24 => DType::F32,
        _ => DType::F64,
    };
    let xz = match x_z {
        Some(z) => Some(cx.add1(Op::Reshape { shape: vec![] }, &[z])?),
        None => None,
    };
    let wz = match w_z {
        Some(z) if cx.ty(z).numel() > 1 => Some(align(cx, z, &wshape, 0, 0)?),
        Some(z) => Some(cx.add1(Op::Reshape { shape: vec![] }, &[z])?),
        None => None,
    };
    let xf = centred(cx, x, xz, sum_type, false)?;
    let wf = centred(cx, w, wz, sum_type, false)?;
    let strides = cx.usizes("strides", vec![1; sp])?;
    let dilations = cx.usizes("dilations", vec![1; sp])?;
    if let Some(k) = cx.ints("kernel_shape")? {
        if k.iter()
            .map(|&d| d as usize)
            .ne(wshape[2..].iter().copied())
        {
            return Err(cx.err(format!(
                "kernel_shape {k:?} does not match the weight's {:?}",
                &wshape[2..]
            )));
        }
    }
    let xs = cx.ty(x).shape.clone();
    let pads = super::nn::resolve_pads(cx, &xs[2..], &wshape[2..], &strides, &dilations)?;
    let conv = Op::Conv(ConvAttrs {
        strides,
        pads,
        dilations,
        group,
        output_padding: vec![],
    });
    let y = cx.add1(conv, &[xf, wf])?;
    if !qlinear {
        return cx.cast_to(y, DType::I32);
    }
    let mut y = cx.cast_to(y, DType::F64)?;
    let (x_s, w_s, y_s, y_z, bias) = (
        cx.req(1)?,
        cx.req(4)?,
        cx.req(6)?,
        cx.input(7)?,
        cx.input(8)?,
    );
    if let Some(b) = bias {
        let bf = cx.cast_to(b, DType::F64)?;
        let m = wshape[0];
        let mut s = vec![1; xs.len()];
        s[1] = m;
        let bf = cx.add1(Op::Reshape { shape: s }, &[bf])?;
        y = cx.bin(Binary::Add, y, bf)?;
    }
    let yshape = cx.ty(y).shape.clone();
    let ws = if cx.ty(w_s).numel() > 1 {
        align(cx, w_s, &yshape, 1, 0)?
    } else {
        w_s
    };
    let xw = cx.bin(Binary::Mul, x_s, ws)?;
    let ratio = cx.bin(Binary::Div, xw, y_s)?;
    let ratio = cx.cast_to(ratio, DType::F64)?;
    let d = cx.bin(Binary::Mul, y, ratio)?;
    let to = match y_z {
        Some(z) => cx.ty(z).dtype,
        None => cx.ty(x).dtype,
    };
    saturate_int(cx, d, y_z, to)
}
