//! Layout ONNX ops. Their shape-like operands (Reshape's shape, Slice's starts/ends, Pad's pads, Resize's
//! scales/sizes, ...) must be constants after folding and become static IR attributes. Flatten, Squeeze and
//! Unsqueeze become `Reshape`; Upsample becomes `Resize`.

use super::nn::axis;
use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{
    broadcast_shapes, CoordMode, GridPadding, NearestMode, Op, PadMode, ResizeAttrs, ResizeMode,
    ScatterReduction, Value,
};

pub(crate) const OPS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "GatherElements",
    "Expand",
    "Tile",
    "Pad",
    "Resize",
    "Upsample",
    "DepthToSpace",
    "SpaceToDepth",
    "Trilu",
    "TopK",
    "GatherND",
    "ScatterND",
    "ScatterElements",
    "Scatter",
    "GridSample",
];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        let out = match op {
            "Reshape" => vec![reshape(cx)?],
            "Flatten" => {
                let x = cx.req(0)?;
                let s = cx.ty(x).shape.clone();
                let a = cx.int("axis", 1)?;
                let a = if a == s.len() as i64 {
                    s.len()
                } else {
                    axis(cx, a, s.len())?
                };
                let shape = vec![s[..a].iter().product(), s[a..].iter().product()];
                vec![cx.add1(Op::Reshape { shape }, &[x])?]
            }
            "Squeeze" => vec![squeeze(cx)?],
            "Unsqueeze" => vec![unsqueeze(cx)?],
            "Transpose" => {
                let x = cx.req(0)?;
                let rank = cx.ty(x).rank();
                let perm = cx.usizes("perm", (0..rank).rev().collect())?;
                vec![cx.add1(Op::Transpose { perm }, &[x])?]
            }
            "Concat" => {
                let ins: Vec<Value> = (0..cx.num_inputs())
                    .map(|i| cx.req(i))
                    .collect::<Result<_>>()?;
                let first = *ins
                    .first()
                    .ok_or_else(|| cx.err("needs at least one input"))?;
                let rank = cx.ty(first).rank();
                let a = cx
                    .int_opt("axis")?
                    .ok_or_else(|| cx.err("attribute 'axis' is required"))?;
                let op = Op::Concat {
                    axis: axis(cx, a, rank)?,
                };
                vec![cx.add1(op, &ins)?]
            }
            "Split" => split(cx)?,
            "Slice" => vec![slice(cx)?],
            "Gather" | "GatherElements" => {
                let x = cx.req(0)?;
                let rank = cx.ty(x).rank();
                let a = cx.int("axis", 0)?;
                let a = axis(cx, a, rank)?;
                let op = if op == "Gather" {
                    Op::Gather { axis: a }
                } else {
                    Op::GatherElements { axis: a }
                };
                vec![cx.add1(op, &[x, cx.req(1)?])?]
            }
            "Expand" => {
                let x = cx.req(0)?;
                let want = shape_operand(cx, 1)?;
                let shape = broadcast_shapes(&cx.ty(x).shape, &want).ok_or_else(|| {
                    cx.err_in(
                        1,
                        format!(
                            "{:?} does not broadcast with the input's {:?}",
                            want,
                            cx.ty(x).shape
                        ),
                    )
                })?;
                vec![cx.add1(Op::Expand { shape }, &[x])?]
            }
            "Tile" => {
                let x = cx.req(0)?;
                let repeats = shape_operand(cx, 1)?;
                vec![cx.add1(Op::Tile { repeats }, &[x])?]
            }
            "Pad" => vec![pad(cx)?],
            "Resize" => vec![resize(cx)?],
            "Upsample" => vec![upsample(cx)?],
            "DepthToSpace" => {
                let blocksize = cx
                    .int_opt("blocksize")?
                    .ok_or_else(|| cx.err("attribute 'blocksize' is required"))?;
                let crd = match cx.string("mode", "DCR")?.as_str() {
                    "DCR" => false,
                    "CRD" => true,
                    m => return Err(cx.err(format!("mode='{m}' is not supported"))),
                };
                vec![cx.add1(
                    Op::DepthToSpace {
                        blocksize: blocksize.max(0) as usize,
                        crd,
                    },
                    &[cx.req(0)?],
                )?]
            }
            "SpaceToDepth" => {
                let blocksize = cx
                    .int_opt("blocksize")?
                    .ok_or_else(|| cx.err("attribute 'blocksize' is required"))?
                    .max(0) as usize;
                let x = cx.req(0)?;
                match cx.string("mode", "DCR")?.as_str() {
                    "DCR" => vec![cx.add1(Op::SpaceToDepth { blocksize }, &[x])?],
                    "CRD" => vec![space_to_depth_crd(cx, x, blocksize)?],
                    m => return Err(cx.err(format!("mode='{m}' must be DCR or CRD"))),
                }
            }
            "Trilu" => {
                let upper = cx.int("upper", 1)? != 0;
                let k = match cx.konst_ints(1)? {
                    Some(v) => *v
                        .first()
                        .ok_or_else(|| cx.err_in(1, "k must hold one value"))?,
                    None => 0,
                };
                vec![cx.add1(Op::Trilu { upper, k }, &[cx.req(0)?])?]
            }
            "TopK" => {
                let x = cx.req(0)?;
                let rank = cx.ty(x).rank();
                let a = cx.int("axis", -1)?;
                let a = axis(cx, a, rank)?;
                let k = if cx.opset() < 10 {
                    cx.int_opt("k")?
                        .ok_or_else(|| cx.err("attribute 'k' is required"))?
                } else {
                    cx.konst_ints(1)?
                        .and_then(|v| v.first().copied())
                        .ok_or_else(|| cx.err_in(1, "k must hold one value"))?
                };
                let k = usize::try_from(k)
                    .map_err(|_| cx.err(format!("k={k} must not be negative")))?;
                let op = Op::TopK {
                    axis: a,
                    k,
                    largest: cx.int("largest", 1)? != 0,
                    sorted: cx.int("sorted", 1)? != 0,
                };
                cx.add(op, &[Some(x)], Some(2))?
            }
            "GridSample" => {
                let mode = match cx
                    .string(
                        "mode",
                        if cx.opset() >= 20 {
                            "linear"
                        } else {
                            "bilinear"
                        },
                    )?
                    .as_str()
                {
                    "linear" | "bilinear" => ResizeMode::Linear,
                    "nearest" => ResizeMode::Nearest,
                    "cubic" | "bicubic" => ResizeMode::Cubic,
                    m => return Err(cx.err(format!("mode='{m}' is not supported"))),
                };
                let padding = match cx.string("padding_mode", "zeros")?.as_str() {
                    "zeros" => GridPadding::Zeros,
                    "border" => GridPadding::Border,
                    "reflection" => GridPadding::Reflection,
                    m => return Err(cx.err(format!("padding_mode='{m}' is not supported"))),
                };
                let align_corners = cx.int("align_corners", 0)? != 0;
                vec![cx.add1(
                    Op::GridSample {
                        mode,
                        padding,
                        align_corners,
                    },
                    &[cx.req(0)?, cx.req(1)?],
                )?]
            }
            "GatherND" => {
                let b = cx.int("batch_dims", 0)?;
                let b =
                    usize::try_from(b).map_err(|_| cx.err("batch_dims must not be negative"))?;
                vec![cx.add1(Op::GatherNd { batch_dims: b }, &[cx.req(0)?, cx.req(1)?])?]
            }
            "ScatterND" => {
                let reduction = scatter_reduction(cx)?;
                vec![cx.add1(
                    Op::ScatterNd { reduction },
                    &[cx.req(0)?, cx.req(1)?, cx.req(2)?],
                )?]
            }
            "ScatterElements" | "Scatter" => {
                let x = cx.req(0)?;
                let rank = cx.ty(x).rank();
                let a = cx.int("axis", 0)?;
                let a = axis(cx, a, rank)?;
                let reduction = scatter_reduction(cx)?;
                vec![cx.add1(
                    Op::ScatterElements { axis: a, reduction },
                    &[x, cx.req(1)?, cx.req(2)?],
                )?]
            }
            _ => return Ok(None),
        };
        Ok(Some(out))
    })();
    r.transpose()
}

fn scatter_reduction(cx: &mut NodeCx<'_, '_>) -> Result<ScatterReduction> {
    Ok(match cx.string("reduction", "none")?.as_str() {
        "none" => ScatterReduction::None,
        "add" => ScatterReduction::Add,
        "mul" => ScatterReduction::Mul,
        "max" => ScatterReduction::Max,
        "min" => ScatterReduction::Min,
        r => return Err(cx.err(format!("reduction='{r}' is not supported"))),
    })
}

/// A constant input of non-negative sizes.
fn shape_operand(cx: &NodeCx<'_, '_>, i: usize) -> Result<Vec<usize>> {
    let v = cx
        .konst_ints(i)?
        .ok_or_else(|| cx.err_in(i, "required input is missing"))?;
    v.iter()
        .map(|&d| usize::try_from(d).map_err(|_| cx.err_in(i, format!("negative size {d}"))))
        .collect()
}

fn reshape(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let ins = cx.ty(x).shape.clone();
    let spec = if cx.opset() < 5 {
        cx.ints("shape")?.unwrap_or_default()
    } else {
        cx.konst_ints(1)?
            .ok_or_else(|| cx.err_in(1, "required input is missing"))?
    };
    let allowzero = cx.int("allowzero", 0)? != 0;
    let mut shape = vec![];
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            0 if !allowzero => shape.push(*ins.get(i).ok_or_else(|| {
                cx.err_in(
                    1,
                    format!("0 at position {i} copies a dimension the input does not have"),
                )
            })?),
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                shape.push(1);
            }
            d if d >= 0 => shape.push(d as usize),
            d => return Err(cx.err_in(1, format!("invalid dimension {d} in {spec:?}"))),
        }
    }
    let total: usize = ins.iter().product();
    let Some(known) = mlopt_ir::checked_numel(&shape) else {
        return Err(cx.err_in(1, format!("shape {spec:?} overflows")));
    };
    if let Some(i) = infer_at {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(cx.err_in(1, format!("cannot infer -1 reshaping {ins:?} to {spec:?}")));
        }
        shape[i] = total / known;
    }
    if shape.iter().product::<usize>() != total {
        return Err(cx.err_in(
            1,
            format!("cannot reshape {ins:?} ({total} values) to {shape:?}"),
        ));
    }
    cx.add1(Op::Reshape { shape }, &[x])
}

/// Axes from the attribute (before opset 13) or the optional input.
fn axes_operand(cx: &mut NodeCx<'_, '_>) -> Result<Option<Vec<i64>>> {
    if cx.opset() >= 13 {
        cx.konst_ints(1)
    } else {
        cx.ints("axes")
    }
}

fn squeeze(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let s = cx.ty(x).shape.clone();
    let axes: Vec<usize> = match axes_operand(cx)? {
        None => (0..s.len()).filter(|&d| s[d] == 1).collect(),
        Some(a) => a
            .iter()
            .map(|&a| axis(cx, a, s.len()))
            .collect::<Result<_>>()?,
    };
    if let Some(&d) = axes.iter().find(|&&d| s[d] != 1) {
        return Err(cx.err(format!("cannot squeeze axis {d} of size {}", s[d])));
    }
    let shape = s
        .iter()
        .enumerate()
        .filter(|(d, _)| !axes.contains(d))
        .map(|(_, &n)| n)
        .collect();
    cx.add1(Op::Reshape { shape }, &[x])
}

fn unsqueeze(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let s = cx.ty(x).shape.clone();
    let a = axes_operand(cx)?.ok_or_else(|| cx.err("axes are required"))?;
    let out_rank = s.len() + a.len();
    let mut axes: Vec<usize> = a
        .iter()
        .map(|&a| axis(cx, a, out_rank))
        .collect::<Result<_>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err(cx.err(format!("repeated axis in {a:?}")));
    }
    let mut rest = s.iter();
    let shape = (0..out_rank)
        .map(|d| {
            if axes.contains(&d) {
                1
            } else {
                rest.next().copied().unwrap_or(1)
            }
        })
        .collect();
    cx.add1(Op::Reshape { shape }, &[x])
}

fn split(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let x = cx.req(0)?;
    let s = cx.ty(x).shape.clone();
    let a = cx.int("axis", 0)?;
    let ax = axis(cx, a, s.len())?;
    let dim = s[ax];
    let given = if cx.opset() >= 13 {
        cx.konst_ints(1)?
    } else {
        cx.ints("split")?
    };
    let num_outputs = cx.int_opt("num_outputs")?;
    let sizes: Vec<usize> = match given.filter(|v| !v.is_empty()) {
        Some(v) => v
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| cx.err(format!("negative split size {d}"))))
            .collect::<Result<_>>()?,
        None => {
            // num_outputs must name the node's outputs: it sizes a list, so a huge one is refused here.
            if num_outputs.is_some_and(|n| n < 1 || n as usize != cx.node.output.len()) {
                return Err(cx.err(format!(
                    "num_outputs {} does not match the node's {} outputs",
                    num_outputs.unwrap_or(0),
                    cx.node.output.len()
                )));
            }
            let n = num_outputs
                .map(|n| n as usize)
                .unwrap_or(cx.node.output.len().max(1));
            if num_outputs.is_some() {
                // Opset 18: chunks of ceil(dim / n), the last one smaller.
                let chunk = dim.div_ceil(n);
                (0..n)
                    .map(|i| chunk.min(dim.saturating_sub(i * chunk)))
                    .collect()
            } else if !dim.is_multiple_of(n) {
                return Err(cx.err(format!(
                    "axis of size {dim} does not split evenly into {n} outputs"
                )));
            } else {
                vec![dim / n; n]
            }
        }
    };
    if sizes.iter().sum::<usize>() != dim {
        return Err(cx.err(format!("split sizes {sizes:?} do not add up to {dim}")));
    }
    let n = sizes.len();
    cx.add(Op::Split { axis: ax, sizes }, &[Some(x)], Some(n))
}

fn slice(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let s = cx.ty(x).shape.clone();
    let r = s.len();
    let (starts, ends, axes, steps) = if cx.opset() < 10 {
        (
            cx.ints("starts")?.unwrap_or_default(),
            cx.ints("ends")?.unwrap_or_default(),
            cx.ints("axes")?,
            None,
        )
    } else {
        let need = |cx: &NodeCx<'_, '_>, i| {
            cx.konst_ints(i)?
                .ok_or_else(|| cx.err_in(i, "required input is missing"))
        };
        (
            need(cx, 1)?,
            need(cx, 2)?,
            cx.konst_ints(3)?,
            cx.konst_ints(4)?,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(cx.err("starts, ends, axes and steps must have the same length"));
    }
    let (mut st, mut sp, mut ln) = (vec![0usize; r], vec![1i64; r], s.clone());
    for k in 0..starts.len() {
        let d = axis(cx, axes[k], r)?;
        let (dim, step) = (s[d] as i64, steps[k]);
        if step == 0 {
            return Err(cx.err("slice step cannot be 0"));
        }
        let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        // (Counted in u64: a step of i64::MAX or i64::MIN must not overflow.)
        let (b, len) = if step > 0 {
            let b = fix(starts[k]).clamp(0, dim);
            let e = fix(ends[k]).clamp(0, dim);
            (
                b,
                if e > b {
                    (e - b - 1) as u64 / step.unsigned_abs() + 1
                } else {
                    0
                },
            )
        } else {
            let b = fix(starts[k]).clamp(0, dim - 1);
            let e = fix(ends[k]).clamp(-1, dim - 1);
            (
                b,
                if b > e {
                    (b - e - 1) as u64 / step.unsigned_abs() + 1
                } else {
                    0
                },
            )
        };
        st[d] = if len > 0 { b as usize } else { 0 };
        sp[d] = step;
        ln[d] = len as usize;
    }
    cx.add1(
        Op::Slice {
            starts: st,
            steps: sp,
            lens: ln,
        },
        &[x],
    )
}

fn pad(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let r = cx.ty(x).rank();
    let mode = match cx.string("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => return Err(cx.err(format!("mode='{m}' is not supported"))),
    };
    let (pads, value, axes) = if cx.opset() < 11 {
        (
            cx.ints("pads")?.unwrap_or_default(),
            cx.float("value", 0.0)? as f64,
            None,
        )
    } else {
        let pads = cx
            .konst_ints(1)?
            .ok_or_else(|| cx.err_in(1, "required input is missing"))?;
        let value = match cx.konst(2)? {
            Some(t) => t.to_f64_vec().first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        (pads, value, cx.konst_ints(3)?)
    };
    let axes: Vec<usize> = match axes {
        None => (0..r).collect(),
        Some(a) => a.iter().map(|&a| axis(cx, a, r)).collect::<Result<_>>()?,
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.err(format!(
            "pads has {} values, expected {}",
            pads.len(),
            2 * axes.len()
        )));
    }
    let mut full = vec![0i64; 2 * r];
    for (k, &d) in axes.iter().enumerate() {
        full[d] = pads[k];
        full[d + r] = pads[k + axes.len()];
    }
    cx.add1(
        Op::Pad {
            pads: full,
            mode,
            value,
        },
        &[x],
    )
}

fn resize(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let ins = cx.ty(x).shape.clone();
    let r = ins.len();
    let nonempty = |t: Option<std::sync::Arc<mlopt_ir::Tensor>>| t.filter(|t| t.numel() > 0);
    let (roi, scales, sizes) = if cx.opset() < 11 {
        (None, nonempty(cx.konst(1)?), None)
    } else {
        (
            nonempty(cx.konst(1)?),
            nonempty(cx.konst(2)?),
            nonempty(cx.konst(3)?),
        )
    };
    let mode = match cx.string("mode", "nearest")?.as_str() {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
        "cubic" | "bicubic" => ResizeMode::Cubic,
        m => return Err(cx.err(format!("mode='{m}' is not supported"))),
    };
    let (coord, nearest) = if cx.opset() < 11 {
        (CoordMode::Asymmetric, NearestMode::Floor)
    } else {
        let coord = match cx
            .string("coordinate_transformation_mode", "half_pixel")?
            .as_str()
        {
            "half_pixel" => CoordMode::HalfPixel,
            "half_pixel_symmetric" => CoordMode::HalfPixelSymmetric,
            "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
            "align_corners" => CoordMode::AlignCorners,
            "asymmetric" => CoordMode::Asymmetric,
            "tf_crop_and_resize" => CoordMode::TfCropAndResize,
            m => {
                return Err(cx.err(format!(
                    "coordinate_transformation_mode='{m}' is not supported"
                )))
            }
        };
        let nearest = match cx.string("nearest_mode", "round_prefer_floor")?.as_str() {
            "round_prefer_floor" => NearestMode::RoundPreferFloor,
            "round_prefer_ceil" => NearestMode::RoundPreferCeil,
            "floor" => NearestMode::Floor,
            "ceil" => NearestMode::Ceil,
            m => return Err(cx.err(format!("nearest_mode='{m}' is not supported"))),
        };
        (coord, nearest)
    };
    let axes: Vec<usize> = match cx.ints("axes")? {
        None => (0..r).collect(),
        Some(a) => a.iter().map(|&a| axis(cx, a, r)).collect::<Result<_>>()?,
    };
    let mut roi_full: Vec<f32> = [vec![0.0; r], vec![1.0; r]].concat();
    if coord == CoordMode::TfCropAndResize {
        let roi = roi
            .ok_or_else(|| cx.err_in(1, "tf_crop_and_resize needs roi"))?
            .to_f64_vec();
        if roi.len() != 2 * axes.len() {
            return Err(cx.err_in(
                1,
                format!("roi has {} values, expected {}", roi.len(), 2 * axes.len()),
            ));
        }
        for (k, &d) in axes.iter().enumerate() {
            roi_full[d] = roi[k] as f32;
            roi_full[d + r] = roi[k + axes.len()] as f32;
        }
    }
    let policy = cx.string("keep_aspect_ratio_policy", "stretch")?;
    let mut attrs = ResizeAttrs {
        mode,
        coord,
        nearest,
        cubic_coeff_a: cx.float("cubic_coeff_a", -0.75)?,
        exclude_outside: cx.int("exclude_outside", 0)? != 0,
        extrapolation_value: cx.float("extrapolation_value", 0.0)?,
        antialias: cx.int("antialias", 0)? != 0,
        scales: vec![1.0; r],
        sizes: ins.clone(),
        roi: if coord == CoordMode::TfCropAndResize {
            roi_full.clone()
        } else {
            vec![]
        },
    };
    match (scales, sizes) {
        (Some(sc), None) => {
            let sc = sc.to_f64_vec();
            if sc.len() != axes.len() {
                return Err(cx.err_in(
                    2,
                    format!("scales has {} values, expected {}", sc.len(), axes.len()),
                ));
            }
            for (k, &d) in axes.iter().enumerate() {
                // (`!(x > 0)` also refuses NaN, which would otherwise size the axis 0.)
                if !(sc[k] > 0.0 && sc[k].is_finite()) {
                    return Err(
                        cx.err_in(2, format!("scale {} must be positive and finite", sc[k]))
                    );
                }
                let span = if coord == CoordMode::TfCropAndResize {
                    (roi_full[d + r] - roi_full[d]) as f64
                } else {
                    1.0
                };
                attrs.scales[d] = sc[k] as f32;
                attrs.sizes[d] = (ins[d] as f64 * span * (sc[k] as f32) as f64).floor() as usize;
            }
        }
        (None, Some(sz)) => {
            let sz = sz.to_i64_vec();
            if sz.len() != axes.len() {
                return Err(cx.err_in(
                    3,
                    format!("sizes has {} values, expected {}", sz.len(), axes.len()),
                ));
            }
            let ratio = |k: usize, d: usize| sz[k] as f64 / ins[d] as f64;
            let pick = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(
                    axes.iter()
                        .enumerate()
                        .map(|(k, &d)| ratio(k, d))
                        .fold(f64::INFINITY, f64::min),
                ),
                "not_smaller" => Some(
                    axes.iter()
                        .enumerate()
                        .map(|(k, &d)| ratio(k, d))
                        .fold(0.0, f64::max),
                ),
                p => return Err(cx.err(format!("keep_aspect_ratio_policy='{p}' is not supported"))),
            };
            for (k, &d) in axes.iter().enumerate() {
                let s = pick.unwrap_or_else(|| ratio(k, d));
                attrs.scales[d] = s as f32;
                attrs.sizes[d] = if pick.is_some() {
                    (s * ins[d] as f64 + 0.5).floor() as usize
                } else {
                    sz[k].max(0) as usize
                };
            }
        }
        (Some(_), Some(_)) => return Err(cx.err("only one of scales and sizes may be given")),
        (None, None) => return Err(cx.err("one of scales and sizes is required")),
    }
    cx.add1(Op::Resize(attrs), &[x])
}

fn upsample(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let ins = cx.ty(x).shape.clone();
    let scales: Vec<f64> = if cx.opset() < 9 {
        cx.floats("scales")?
            .ok_or_else(|| cx.err("attribute 'scales' is required"))?
            .iter()
            .map(|&v| v as f64)
            .collect()
    } else {
        cx.konst(1)?
            .ok_or_else(|| cx.err_in(1, "required input is missing"))?
            .to_f64_vec()
    };
    if scales.len() != ins.len() {
        return Err(cx.err(format!(
            "scales has {} values for rank {}",
            scales.len(),
            ins.len()
        )));
    }
    let mode = match cx.string("mode", "nearest")?.as_str() {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" => ResizeMode::Linear,
        m => return Err(cx.err(format!("mode='{m}' is not supported"))),
    };
    let attrs = ResizeAttrs {
        mode,
        coord: CoordMode::Asymmetric,
        nearest: NearestMode::Floor,
        cubic_coeff_a: -0.75,
        exclude_outside: false,
        extrapolation_value: 0.0,
        antialias: false,
        scales: scales.iter().map(|&s| s as f32).collect(),
        sizes: ins
            .iter()
            .zip(&scales)
            .map(|(&d, &s)| (d as f64 * s).floor() as usize)
            .collect(),
        roi: vec![],
    };
    cx.add1(Op::Resize(attrs), &[x])
}

/// SpaceToDepth in column-row-depth order (`mode="CRD"`, opset 26): output channel `c b^2 + i b + j`
/// for the block's row `i` and column `j`, where the default (DCR, the IR's op) gives `(i b + j) C + c`.
/// Written as the reshape, transpose and reshape the specification defines it by.
fn space_to_depth_crd(cx: &mut NodeCx<'_, '_>, x: Value, b: usize) -> Result<Value> {
    let t = cx.ty(x).clone();
    let &[n, c, h, w] = t.shape.as_slice() else {
        return Err(cx.err_in(0, format!("the input is {t}, not 4-D")));
    };
    if b == 0 || h % b != 0 || w % b != 0 {
        return Err(cx.err(format!(
            "blocksize {b} does not divide the input's height {h} and width {w}"
        )));
    }
    let blocks = cx.add1(
        Op::Reshape {
            shape: vec![n, c, h / b, b, w / b, b],
        },
        &[x],
    )?;
    let moved = cx.add1(
        Op::Transpose {
            perm: vec![0, 1, 3, 5, 2, 4],
        },
        &[blocks],
    )?;
    cx.add1(
        Op::Reshape {
            shape: vec![n, c * b * b, h / b, w / b],
        },
        &[moved],
    )
}
