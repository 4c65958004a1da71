//! The ops that put windows back into an image, imported as a scatter into zeros: MaxUnpool (each value
//! at the flat position MaxPool's indices give) and Col2Im (each column element added at its window's
//! position, overlaps summed).

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{DType, Op, PadMode, ScatterReduction, Tensor, TensorType, Value};

/// A flat scatter into zeros of `shape`: `updates` at `indices` (both flattened), with `reduction` where
/// they repeat. Data checks refuse an index outside the zeros, as `scatter_elements` does.
fn scatter_into_zeros(
    cx: &mut NodeCx<'_, '_>,
    shape: &[usize],
    indices: Value,
    updates: Value,
    reduction: ScatterReduction,
) -> Result<Value> {
    let dtype = cx.ty(updates).dtype;
    let total: usize = shape.iter().product();
    cx.fits(&TensorType::new(dtype, shape.to_vec()))?;
    let n = cx.ty(updates).numel();
    let zero = cx.scalar(0.0, dtype);
    let zeros = cx.add1(Op::Expand { shape: vec![total] }, &[zero])?;
    let flat = |cx: &mut NodeCx<'_, '_>, v: Value| cx.add1(Op::Reshape { shape: vec![n] }, &[v]);
    let (indices, updates) = (flat(cx, indices)?, flat(cx, updates)?);
    let y = cx.add1(
        Op::ScatterElements { axis: 0, reduction },
        &[zeros, indices, updates],
    )?;
    cx.add1(
        Op::Reshape {
            shape: shape.to_vec(),
        },
        &[y],
    )
}

/// Per spatial axis: an attribute of `n` values, or `default` for each.
fn per_axis(
    cx: &mut NodeCx<'_, '_>,
    name: &'static str,
    n: usize,
    default: i64,
) -> Result<Vec<usize>> {
    let v = cx.ints(name)?.unwrap_or_else(|| vec![default; n]);
    if v.len() != n || v.iter().any(|&x| x < 0) {
        return Err(cx.err(format!("{name} {v:?} must be {n} values of at least 0")));
    }
    Ok(v.iter().map(|&x| x as usize).collect())
}

/// MaxUnpool: `x` [N, C, spatial...] placed at the flat positions `indices` (MaxPool's, over the whole
/// output) of zeros shaped as the pooling's inverse, `(d - 1) * stride - pads + kernel` per spatial axis;
/// an `output_shape` (input 2) at least as large pads that with zeros after each axis.
pub(super) fn max_unpool(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, indices) = (cx.req(0)?, cx.req(1)?);
    let (xt, it) = (cx.ty(x).clone(), cx.ty(indices).clone());
    if xt.rank() < 3 {
        return Err(cx.err_in(0, format!("the input is {xt}, not [N, C, spatial...]")));
    }
    if it.shape != xt.shape || it.dtype != DType::I64 {
        return Err(cx.err_in(
            1,
            format!("the indices are {it}, not i64 of the input's shape"),
        ));
    }
    let sp = xt.rank() - 2;
    if cx.ints("kernel_shape")?.is_none() {
        return Err(cx.err("attribute 'kernel_shape' is required"));
    }
    let kernel = per_axis(cx, "kernel_shape", sp, 0)?;
    let strides = per_axis(cx, "strides", sp, 1)?;
    let pads = per_axis(cx, "pads", 2 * sp, 0)?;
    let mut inferred = xt.shape[..2].to_vec();
    for a in 0..sp {
        let d = xt.shape[2 + a]
            .saturating_sub(1)
            .checked_mul(strides[a])
            .and_then(|v| v.checked_add(kernel[a]))
            .and_then(|v| v.checked_sub(pads[a] + pads[sp + a]))
            .filter(|&v| v > 0)
            .ok_or_else(|| cx.err(format!("spatial axis {a}: no output size for these pads")))?;
        inferred.push(d);
    }
    let y = scatter_into_zeros(cx, &inferred, indices, x, ScatterReduction::None)?;
    if cx.input(2)?.is_none() {
        return Ok(y);
    }
    // An output_shape places the unpooled image at its origin, zeros after it (ONNX's reference).
    let given = cx
        .konst_ints(2)?
        .ok_or_else(|| cx.err_in(2, "output_shape must be a constant"))?;
    let fits =
        given.len() == inferred.len() && given.iter().zip(&inferred).all(|(&g, &d)| g >= d as i64);
    if !fits {
        return Err(cx.err_in(
            2,
            format!("output_shape {given:?} does not hold the unpooled {inferred:?}"),
        ));
    }
    let mut widths = vec![0i64; inferred.len()];
    widths.extend(given.iter().zip(&inferred).map(|(&g, &d)| g - d as i64));
    if widths.iter().all(|&w| w == 0) {
        return Ok(y);
    }
    cx.add1(
        Op::Pad {
            pads: widths,
            mode: PadMode::Constant,
            value: 0.0,
        },
        &[y],
    )
}

/// Col2Im: `x` [N, C * prod(block), L], the columns of the L sliding blocks of an image of
/// `image_shape` (input 1) with `block_shape` (input 2), added back at their positions (overlaps
/// summed) into the padded image, whose pads are then cut off.
pub(super) fn col2im(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let xt = cx.ty(x).clone();
    let consts = |cx: &mut NodeCx<'_, '_>, i: usize, what: &str| -> Result<Vec<usize>> {
        let v = cx
            .konst_ints(i)?
            .ok_or_else(|| cx.err_in(i, format!("{what} must be a constant")))?;
        if v.is_empty() || v.iter().any(|&d| d <= 0) {
            return Err(cx.err_in(i, format!("{what} {v:?} must be sizes above 0")));
        }
        Ok(v.iter().map(|&d| d as usize).collect())
    };
    let image = consts(cx, 1, "image_shape")?;
    let block = consts(cx, 2, "block_shape")?;
    let sp = image.len();
    if block.len() != sp || xt.rank() != 3 {
        return Err(cx.err(format!(
            "a {xt} input with image_shape {image:?} and block_shape {block:?}: expected [N, C * prod(block), L] and one block size per image axis"
        )));
    }
    let dilations = per_axis(cx, "dilations", sp, 1)?;
    let strides = per_axis(cx, "strides", sp, 1)?;
    let pads = per_axis(cx, "pads", 2 * sp, 0)?;
    if dilations.contains(&0) || strides.contains(&0) {
        return Err(cx.err("dilations and strides must be at least 1"));
    }
    // Blocks along each axis, and the padded image.
    let padded: Vec<usize> = (0..sp).map(|a| image[a] + pads[a] + pads[sp + a]).collect();
    let mut counts = Vec::with_capacity(sp);
    for a in 0..sp {
        let span = dilations[a] * (block[a] - 1) + 1;
        let n = padded[a]
            .checked_sub(span)
            .map(|v| v / strides[a] + 1)
            .ok_or_else(|| {
                cx.err(format!(
                    "axis {a}: the block spans {span}, the padded image {}",
                    padded[a]
                ))
            })?;
        counts.push(n);
    }
    let (b, l): (usize, usize) = (block.iter().product(), counts.iter().product());
    let (n, cb) = (xt.shape[0], xt.shape[1]);
    if b == 0 || cb % b != 0 || xt.shape[2] != l {
        return Err(cx.err_in(0, format!("the input is {xt}: expected [N, C * {b}, {l}]")));
    }
    let c = cb / b;
    cx.constant_fits(xt.numel(), 8, 0)?;
    // Each input element's flat position in the padded image [N, C, padded...].
    let plane: usize = padded.iter().product();
    let mut indices = Vec::with_capacity(xt.numel());
    let unflat = |mut i: usize, dims: &[usize]| {
        let mut at = vec![0; dims.len()];
        for a in (0..dims.len()).rev() {
            at[a] = i % dims[a];
            i /= dims[a];
        }
        at
    };
    for image_at in 0..n * c {
        for o in 0..b {
            let offset = unflat(o, &block);
            for k in 0..l {
                let window = unflat(k, &counts);
                let mut flat = 0;
                for a in 0..sp {
                    flat = flat * padded[a] + window[a] * strides[a] + offset[a] * dilations[a];
                }
                indices.push((image_at * plane + flat) as i64);
            }
        }
    }
    let indices = Tensor::from_vec(&xt.shape, indices)
        .ok_or_else(|| cx.err("a constant of the wrong size (a bug in mlopt's Col2Im)"))?;
    let indices = cx.konst_value(indices);
    let mut shape = vec![n, c];
    shape.extend(&padded);
    let y = scatter_into_zeros(cx, &shape, indices, x, ScatterReduction::Add)?;
    if pads.iter().all(|&p| p == 0) {
        return Ok(y);
    }
    let mut starts = vec![0, 0];
    starts.extend(&pads[..sp]);
    let mut lens = vec![n, c];
    lens.extend(&image);
    cx.add1(
        Op::Slice {
            starts,
            steps: vec![1; sp + 2],
            lens,
        },
        &[y],
    )
}
