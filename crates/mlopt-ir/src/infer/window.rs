//! Convolution and pooling windows: an axis's output size, the geometry's checks, and Conv's and
//! ConvTranspose's output types.

use super::matrix::biased_dtype;
use super::{err, get, need_float, same_dtype, R};
use crate::dtype::{DType, TensorType};
use crate::op::ConvAttrs;

/// Output size of one spatial axis of a convolution or pooling window (ONNX rule: with `ceil`, a last
/// window that would start in the end padding is dropped).
/// None also when the arithmetic would overflow (sizes from a model file may be anything).
pub fn window_out(
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
    pad_end: usize,
    ceil: bool,
) -> Option<usize> {
    let span = dilation.checked_mul(kernel.max(1) - 1)?.checked_add(1)?;
    let padded = input.checked_add(pad_begin)?.checked_add(pad_end)?;
    if padded < span || stride == 0 {
        return None;
    }
    let num = padded - span;
    let mut out = if ceil {
        num.div_ceil(stride) + 1
    } else {
        num / stride + 1
    };
    if ceil && out > 1 && (out - 1).checked_mul(stride)? >= input + pad_begin {
        out -= 1;
    }
    Some(out)
}

/// A window's kernel, stride or dilation of 0 on some axis, named for the error (ONNX requires each to be
/// positive; a zero stride would divide by zero and a zero kernel window reads nothing).
pub(super) fn zero_geometry(
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
) -> Option<String> {
    for (what, v) in [
        ("kernel", kernel),
        ("stride", strides),
        ("dilation", dilations),
    ] {
        if let Some(i) = v.iter().position(|x| *x == 0) {
            return Some(format!(
                "{what} 0 on spatial axis {i} (it must be positive)"
            ));
        }
    }
    None
}

pub(super) fn infer_conv(
    c: &ConvAttrs,
    inputs: &[Option<&TensorType>],
    transpose: bool,
) -> R<Vec<TensorType>> {
    let (x, w) = (get(inputs, 0)?, get(inputs, 1)?);
    // Floats, or (a convolution, not a transposed one) i16 summed in i32: `product_dtype`.
    if transpose || x.dtype != DType::I16 {
        need_float(x, 0)?;
    }
    same_dtype(x, w, 1)?;
    let sp = x.rank().saturating_sub(2);
    if x.rank() < 3 || w.rank() != x.rank() {
        return err(Some(1), format!("weight {w} does not match input {x}"));
    }
    if c.strides.len() != sp || c.dilations.len() != sp || c.pads.len() != 2 * sp || c.group == 0 {
        return err(
            None,
            format!("strides/dilations/pads do not match {sp} spatial axes"),
        );
    }
    if let Some(why) = zero_geometry(&w.shape[2..], &c.strides, &c.dilations) {
        return err(Some(1), why);
    }
    let g = c.group;
    let out_ch = if transpose {
        if w.shape[0] != x.shape[1] {
            return err(
                Some(1),
                format!(
                    "weight has {} input channels, input has {}",
                    w.shape[0], x.shape[1]
                ),
            );
        }
        w.shape[1] * g
    } else {
        if w.shape[1] * g != x.shape[1] || w.shape[0] % g != 0 {
            return err(
                Some(1),
                format!(
                    "weight {w} does not fit {} input channels in {g} groups",
                    x.shape[1]
                ),
            );
        }
        w.shape[0]
    };
    let mut dtype = super::matrix::product_dtype(x.dtype);
    if let Some(Some(b)) = inputs.get(2) {
        dtype = biased_dtype(x, b, 2)?;
        if b.shape != [out_ch] {
            return err(
                Some(2),
                format!("bias must be [{out_ch}], got {:?}", b.shape),
            );
        }
    }
    let mut shape = vec![x.shape[0], out_ch];
    for i in 0..sp {
        let (k, s, d) = (w.shape[i + 2], c.strides[i], c.dilations[i]);
        let (pb, pe) = (c.pads[i], c.pads[i + sp]);
        if transpose {
            let op = c.output_padding.get(i).copied().unwrap_or(0);
            let full = s.checked_mul(x.shape[i + 2].max(1) - 1).and_then(|a| {
                a.checked_add(op)?
                    .checked_add(d.checked_mul(k.max(1) - 1)?)?
                    .checked_add(1)
            });
            let (Some(full), Some(pad)) = (full, pb.checked_add(pe)) else {
                return err(None, format!("sizes overflow on axis {}", i + 2));
            };
            if full < pad {
                return err(None, format!("pads exceed the output on axis {}", i + 2));
            }
            shape.push(full - pad);
        } else {
            match window_out(x.shape[i + 2], k, s, d, pb, pe, false) {
                Some(o) => shape.push(o),
                None => {
                    return err(
                        Some(1),
                        format!("kernel larger than padded input on axis {}", i + 2),
                    )
                }
            }
        }
    }
    Ok(vec![TensorType::new(dtype, shape)])
}
