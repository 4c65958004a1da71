//! The ops that sample an image at run-time positions, bilinearly: RoiAlign and DeformConv.
//!
//! RoiAlign: each region of interest (a run-time box) pooled to a fixed grid of bilinear samples. The
//! sample positions are computed from the boxes (elementwise ops on [rois, samples]), their four
//! neighbours' flat positions and weights as ONNX's reference computes them (a sample outside
//! [-1, size] counts 0; one past the last row or column reads it), and the values gathered from each
//! box's image (`gather` by batch index, `gather_elements` at the positions); `avg` mode averages the
//! weighted sums over a bin's samples, `max` takes the largest weighted neighbour (the reference's
//! definition). `sampling_ratio` must be given: its adaptive default (0) sizes each box's grid from the
//! box, a run-time value.

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Binary, DType, Nary, Op, ReduceKind, Tensor, Unary, Value};

pub(crate) const OPS: &[&str] = &["RoiAlign", "DeformConv"];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    match op {
        "RoiAlign" => Some(roi_align(cx).map(|v| vec![v])),
        "DeformConv" => Some(deform_conv(cx).map(|v| vec![v])),
        _ => None,
    }
}

fn roi_align(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, rois, batch) = (cx.req(0)?, cx.req(1)?, cx.req(2)?);
    let (xt, rt, bt) = (cx.ty(x).clone(), cx.ty(rois).clone(), cx.ty(batch).clone());
    if xt.rank() != 4 || !xt.dtype.is_float() {
        return Err(cx.err_in(0, format!("the input is {xt}, not a float [N, C, H, W]")));
    }
    let r = rt.shape.first().copied().unwrap_or(0);
    if rt.shape != [r, 4] || rt.dtype != xt.dtype || bt.shape != [r] || !bt.dtype.is_int() {
        return Err(cx.err_in(
            1,
            format!("the boxes {rt} and batch indices {bt} are not [R, 4] and [R] of one count"),
        ));
    }
    let avg = match cx.string("mode", "avg")?.as_str() {
        "avg" => true,
        "max" => false,
        m => return Err(cx.err(format!("mode '{m}' must be avg or max"))),
    };
    let default_ctm = if cx.opset() >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel = match cx
        .string("coordinate_transformation_mode", default_ctm)?
        .as_str()
    {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => {
            return Err(cx.err(format!(
                "coordinate_transformation_mode '{m}' is not one ONNX defines"
            )))
        }
    };
    let (oh, ow) = (cx.int("output_height", 1)?, cx.int("output_width", 1)?);
    let g = cx.int("sampling_ratio", 0)?;
    let scale = f64::from(cx.float("spatial_scale", 1.0)?);
    let (oh, ow, g) = match (usize::try_from(oh), usize::try_from(ow), usize::try_from(g)) {
        (Ok(h), Ok(w), Ok(g)) if h > 0 && w > 0 && g > 0 => (h, w, g),
        _ => {
            return Err(cx.err(format!(
                "output {oh}x{ow} and sampling_ratio {g} must be positive (an adaptive grid, sampling_ratio 0, depends on the boxes, run-time values)"
            )))
        }
    };
    let (c, h, w) = (xt.shape[1], xt.shape[2], xt.shape[3]);
    let s = oh * ow * g * g;
    cx.constant_fits(s, 8, 0)?;
    cx.fits(&mlopt_ir::TensorType::new(xt.dtype, vec![r, c, s]))?;
    let t = xt.dtype;
    // Each sample's position inside its box, in bins: sample (ph, pw, iy, ix) at ph + (iy + 0.5) / g.
    let (mut py, mut px) = (Vec::with_capacity(s), Vec::with_capacity(s));
    for ph in 0..oh {
        for pw in 0..ow {
            for iy in 0..g {
                for ix in 0..g {
                    py.push(ph as f64 + (iy as f64 + 0.5) / g as f64);
                    px.push(pw as f64 + (ix as f64 + 0.5) / g as f64);
                }
            }
        }
    }
    let konst = |cx: &mut NodeCx<'_, '_>, v: Vec<f64>| -> Result<Value> {
        let k = Tensor::from_vec(&[1, s], v).ok_or_else(|| cx.err("sample grid"))?;
        Ok(cx.konst_value(k.cast(t)))
    };
    let (py, px) = (konst(cx, py)?, konst(cx, px)?);
    // A box's corner and size along one axis ([R, 1]); its samples' coordinates ([R, S]).
    let offset = if half_pixel { 0.5 } else { 0.0 };
    let coord = |cx: &mut NodeCx<'_, '_>, lo: usize, bins: usize, at: Value| -> Result<Value> {
        let col = |cx: &mut NodeCx<'_, '_>, i: usize| -> Result<Value> {
            let v = cx.add1(
                Op::Slice {
                    starts: vec![0, i],
                    steps: vec![1, 1],
                    lens: vec![r, 1],
                },
                &[rois],
            )?;
            let k = cx.scalar(scale, t);
            let v = cx.bin(Binary::Mul, v, k)?;
            let o = cx.scalar(offset, t);
            cx.bin(Binary::Sub, v, o)
        };
        let (start, end) = (col(cx, lo)?, col(cx, lo + 2)?);
        let mut size = cx.bin(Binary::Sub, end, start)?;
        if !half_pixel {
            // Malformed boxes are 1 x 1.
            let one = cx.scalar(1.0, t);
            size = cx.add1(Op::Nary(Nary::Max), &[size, one])?;
        }
        let nb = cx.scalar(bins as f64, t);
        let bin = cx.bin(Binary::Div, size, nb)?;
        let off = cx.bin(Binary::Mul, bin, at)?;
        cx.bin(Binary::Add, start, off)
    };
    let y = coord(cx, 1, oh, py)?;
    let xs = coord(cx, 0, ow, px)?;
    // Inside [-1, size] on both axes, else the sample counts 0.
    let inside = |cx: &mut NodeCx<'_, '_>, v: Value, size: usize| -> Result<Value> {
        let (lo, hi) = (cx.scalar(-1.0, t), cx.scalar(size as f64, t));
        let a = cx.bin(Binary::GreaterOrEqual, v, lo)?;
        let b = cx.bin(Binary::LessOrEqual, v, hi)?;
        cx.bin(Binary::And, a, b)
    };
    let (iy, ix) = (inside(cx, y, h)?, inside(cx, xs, w)?);
    let valid = cx.bin(Binary::And, iy, ix)?;
    let valid = cx.cast_to(valid, t)?;
    // The low neighbour (clamped at 0 and at the last row), the high one, and the fraction past the low.
    let axis = |cx: &mut NodeCx<'_, '_>, v: Value, size: usize| -> Result<[Value; 3]> {
        let zero = cx.scalar(0.0, t);
        let v = cx.add1(Op::Nary(Nary::Max), &[v, zero])?;
        let low = cx.un(Unary::Floor, v)?;
        let last = cx.scalar(size as f64 - 1.0, t);
        let past = cx.bin(Binary::GreaterOrEqual, low, last)?;
        let one = cx.scalar(1.0, t);
        let next = cx.bin(Binary::Add, low, one)?;
        let low = cx.add1(Op::Where, &[past, last, low])?;
        let high = cx.add1(Op::Where, &[past, last, next])?;
        let v = cx.add1(Op::Where, &[past, last, v])?;
        let frac = cx.bin(Binary::Sub, v, low)?;
        Ok([low, high, frac])
    };
    let [yl, yh, ly] = axis(cx, y, h)?;
    let [xl, xh, lx] = axis(cx, xs, w)?;
    let one = cx.scalar(1.0, t);
    let hy = cx.bin(Binary::Sub, one, ly)?;
    let hx = cx.bin(Binary::Sub, one, lx)?;
    // The image of each box, flattened: [R, C, H * W].
    let b64 = cx.cast_to(batch, DType::I64)?;
    let img = cx.add1(Op::Gather { axis: 0 }, &[x, b64])?;
    let img = cx.add1(
        Op::Reshape {
            shape: vec![r, c, h * w],
        },
        &[img],
    )?;
    let wsz = cx.scalar(w as f64, t);
    let mut terms = vec![];
    for (row, col, wr, wc) in [
        (yl, xl, hy, hx),
        (yl, xh, hy, lx),
        (yh, xl, ly, hx),
        (yh, xh, ly, lx),
    ] {
        let rw = cx.bin(Binary::Mul, row, wsz)?;
        let pos = cx.bin(Binary::Add, rw, col)?;
        let pos = cx.cast_to(pos, DType::I64)?;
        let pos = cx.add1(
            Op::Reshape {
                shape: vec![r, 1, s],
            },
            &[pos],
        )?;
        let pos = cx.add1(
            Op::Expand {
                shape: vec![r, c, s],
            },
            &[pos],
        )?;
        let v = cx.add1(Op::GatherElements { axis: 2 }, &[img, pos])?;
        let wt = cx.bin(Binary::Mul, wr, wc)?;
        let wt = cx.bin(Binary::Mul, wt, valid)?;
        let wt = cx.add1(
            Op::Reshape {
                shape: vec![r, 1, s],
            },
            &[wt],
        )?;
        terms.push(cx.bin(Binary::Mul, v, wt)?);
    }
    let (v, kind) = if avg {
        (cx.add1(Op::Nary(Nary::Sum), &terms)?, ReduceKind::Mean)
    } else {
        (cx.add1(Op::Nary(Nary::Max), &terms)?, ReduceKind::Max)
    };
    let v = cx.add1(
        Op::Reshape {
            shape: vec![r, c, oh, ow, g * g],
        },
        &[v],
    )?;
    cx.reduce(kind, v, vec![4], false)
}

/// A slice of `x` along `axis`: `len` from `start`.
fn part(cx: &mut NodeCx<'_, '_>, x: Value, axis: usize, start: usize, len: usize) -> Result<Value> {
    let shape = cx.ty(x).shape.clone();
    let mut starts = vec![0; shape.len()];
    let mut lens = shape;
    starts[axis] = start;
    lens[axis] = len;
    cx.add1(
        Op::Slice {
            starts,
            steps: vec![1; lens.len()],
            lens,
        },
        &[x],
    )
}

fn reshape(cx: &mut NodeCx<'_, '_>, x: Value, shape: Vec<usize>) -> Result<Value> {
    cx.add1(Op::Reshape { shape }, &[x])
}

/// DeformConv (2-D): a convolution whose every tap reads the input at its position plus a learned
/// offset (bilinear, zeros outside), scaled by the mask. Per offset group, one `grid_sample` (bilinear,
/// zero padding, corners aligned, as ONNX's reference samples) at all taps' positions gives the
/// convolution's columns [N, C x taps, pixels]; per group a `matmul` with the weights, plus the bias.
pub(super) fn deform_conv(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, wt, off) = (cx.req(0)?, cx.req(1)?, cx.req(2)?);
    let (bias, mask) = (cx.input(3)?, cx.input(4)?);
    let (xt, wtt, ot) = (cx.ty(x).clone(), cx.ty(wt).clone(), cx.ty(off).clone());
    if xt.rank() != 4 || wtt.rank() != 4 || ot.rank() != 4 || !xt.dtype.is_float() {
        return Err(cx.err(format!(
            "input {xt}, weights {wtt} and offsets {ot} are not 2-D [N, C, H, W] convolution operands (only 2-D DeformConv is supported)"
        )));
    }
    let (n, c, h, w) = (xt.shape[0], xt.shape[1], xt.shape[2], xt.shape[3]);
    let (oc, kh, kw) = (wtt.shape[0], wtt.shape[2], wtt.shape[3]);
    let group = usize::try_from(cx.int("group", 1)?).unwrap_or(0);
    let og = usize::try_from(cx.int("offset_group", 1)?).unwrap_or(0);
    let usz = |v: Option<Vec<i64>>, d: Vec<i64>| -> Option<Vec<usize>> {
        v.unwrap_or(d)
            .iter()
            .map(|&x| usize::try_from(x).ok())
            .collect()
    };
    let strides = usz(cx.ints("strides")?, vec![1, 1]);
    let dil = usz(cx.ints("dilations")?, vec![1, 1]);
    let pads = usz(cx.ints("pads")?, vec![0; 4]);
    let kernel = usz(cx.ints("kernel_shape")?, vec![kh as i64, kw as i64]);
    let (k, oh, ow) = (kh * kw, ot.shape[2], ot.shape[3]);
    let (Some(strides), Some(dil), Some(pads)) = (strides, dil, pads) else {
        return Err(cx.err("strides, dilations and pads must not be negative"));
    };
    let fits = group > 0
        && og > 0
        && c % group == 0
        && c % og == 0
        && oc % group == 0
        && wtt.shape[1] * group == c
        && ot.shape[0] == n
        && ot.shape[1] == og * 2 * k
        && strides.len() == 2
        && dil.len() == 2
        && pads.len() == 4
        && kernel == Some(vec![kh, kw])
        && h > 1
        && w > 1;
    if !fits {
        return Err(cx.err(format!(
            "input {xt}, weights {wtt}, offsets {ot}, group {group} and offset_group {og} do not fit (the image at least 2 x 2)"
        )));
    }
    let p = oh * ow;
    let t = xt.dtype;
    // Each tap's position without its offset, [1, 1, K, oH, oW]: rows and columns.
    let (mut by, mut bx) = (Vec::with_capacity(k * p), Vec::with_capacity(k * p));
    for ki in 0..kh {
        for kj in 0..kw {
            for i in 0..oh {
                for j in 0..ow {
                    by.push((i * strides[0] + ki * dil[0]) as f64 - pads[0] as f64);
                    bx.push((j * strides[1] + kj * dil[1]) as f64 - pads[1] as f64);
                }
            }
        }
    }
    cx.constant_fits(k * p, 8, 2)?;
    let off = reshape(cx, off, vec![n, og, k, 2, oh, ow])?;
    let mask = match mask {
        Some(m) => Some(reshape(cx, m, vec![n, og, k, p])?),
        None => None,
    };
    // Normalised (corners aligned) coordinate along one axis, [N, OG, K, oH, oW, 1].
    let coord =
        |cx: &mut NodeCx<'_, '_>, base: Vec<f64>, which: usize, size: usize| -> Result<Value> {
            let b = Tensor::from_vec(&[1, 1, k, 1, oh, ow], base)
                .ok_or_else(|| cx.err("tap positions"))?;
            let b = cx.konst_value(b.cast(t));
            let o = part(cx, off, 3, which, 1)?;
            let v = cx.bin(Binary::Add, o, b)?;
            let s = cx.scalar(2.0 / (size - 1) as f64, t);
            let v = cx.bin(Binary::Mul, v, s)?;
            let one = cx.scalar(1.0, t);
            let v = cx.bin(Binary::Sub, v, one)?;
            reshape(cx, v, vec![n, og, k, oh, ow, 1])
        };
    let gy = coord(cx, by, 0, h)?;
    let gx = coord(cx, bx, 1, w)?;
    let grid = cx.add1(Op::Concat { axis: 5 }, &[gx, gy])?;
    let cg = c / og;
    let mut cols = vec![];
    for g in 0..og {
        let grid_g = part(cx, grid, 1, g, 1)?;
        let grid_g = reshape(cx, grid_g, vec![n, k * oh, ow, 2])?;
        let x_g = part(cx, x, 1, g * cg, cg)?;
        let v = cx.add1(
            Op::GridSample {
                mode: mlopt_ir::ResizeMode::Linear,
                padding: mlopt_ir::GridPadding::Zeros,
                align_corners: true,
            },
            &[x_g, grid_g],
        )?;
        let mut v = reshape(cx, v, vec![n, cg, k, p])?;
        if let Some(m) = mask {
            let m = part(cx, m, 1, g, 1)?;
            v = cx.bin(Binary::Mul, v, m)?;
        }
        cols.push(reshape(cx, v, vec![n, cg * k, p])?);
    }
    let cols = if cols.len() == 1 {
        cols[0]
    } else {
        cx.add1(Op::Concat { axis: 1 }, &cols)?
    };
    let (cin, ocg) = (c / group, oc / group);
    let wt = reshape(cx, wt, vec![oc, cin * k])?;
    let mut outs = vec![];
    for g in 0..group {
        let w_g = part(cx, wt, 0, g * ocg, ocg)?;
        let c_g = part(cx, cols, 1, g * cin * k, cin * k)?;
        outs.push(cx.add1(Op::MatMul, &[w_g, c_g])?);
    }
    let mut y = if outs.len() == 1 {
        outs[0]
    } else {
        cx.add1(Op::Concat { axis: 1 }, &outs)?
    };
    if let Some(b) = bias {
        let b = reshape(cx, b, vec![1, oc, 1])?;
        y = cx.bin(Binary::Add, y, b)?;
    }
    reshape(cx, y, vec![n, oc, oh, ow])
}
