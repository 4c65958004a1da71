//! Neural-network ONNX ops: Softmax/LogSoftmax, MatMul, Gemm, Conv, ConvTranspose, the normalisations,
//! LRN, pooling, reductions and ArgMax/ArgMin. `auto_pad`, `output_shape` and opset differences (Softmax's
//! 2-D coercion before opset 13, reduction axes moving from attribute to input) are resolved here.

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{normalize_axis, Binary, ConvAttrs, Op, PoolAttrs, ReduceKind, Value};

pub(crate) const OPS: &[&str] = &[
    "Softmax",
    "LogSoftmax",
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "BatchNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "LRN",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ArgMax",
    "ArgMin",
];

pub(crate) fn axis(cx: &NodeCx<'_, '_>, a: i64, rank: usize) -> Result<usize> {
    normalize_axis(a, rank)
        .ok_or_else(|| cx.err(format!("axis {a} is out of range for rank {rank}")))
}

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        let out = match op {
            "Softmax" | "LogSoftmax" => vec![softmax(cx, op == "LogSoftmax")?],
            "MatMul" => vec![cx.add1(Op::MatMul, &[cx.req(0)?, cx.req(1)?])?],
            "Gemm" => {
                let op = Op::Gemm {
                    alpha: cx.float("alpha", 1.0)?,
                    beta: cx.float("beta", 1.0)?,
                    trans_a: cx.int("transA", 0)? != 0,
                    trans_b: cx.int("transB", 0)? != 0,
                };
                let ins = [Some(cx.req(0)?), Some(cx.req(1)?), cx.input(2)?];
                let n = if ins[2].is_some() { 3 } else { 2 };
                cx.add(op, &ins[..n], Some(1))?
            }
            "Conv" | "ConvTranspose" => vec![conv(cx, op == "ConvTranspose")?],
            "BatchNormalization" => {
                if cx.int("spatial", 1)? != 1 {
                    return Err(cx.err("spatial=0 is not supported"));
                }
                cx.int("is_test", 1)?;
                let momentum = cx.float("momentum", 0.9)?;
                let op = Op::BatchNorm {
                    epsilon: cx.float("epsilon", 1e-5)?,
                };
                let ins: Vec<Value> = (0..5).map(|i| cx.req(i)).collect::<Result<_>>()?;
                match cx.int("training_mode", 0)? != 0 {
                    true => batch_norm_training(cx, op, &ins, momentum)?,
                    false => vec![cx.add1(op, &ins)?],
                }
            }
            "InstanceNormalization" => {
                let op = Op::InstanceNorm {
                    epsilon: cx.float("epsilon", 1e-5)?,
                };
                vec![cx.add1(op, &[cx.req(0)?, cx.req(1)?, cx.req(2)?])?]
            }
            "LayerNormalization" => {
                let x = cx.req(0)?;
                let rank = cx.ty(x).rank();
                let a = cx.int("axis", -1)?;
                let stash = cx.int("stash_type", 1)?;
                if stash != 1 {
                    return Err(cx.err(format!(
                        "stash_type={stash} is not supported (statistics are computed in f32)"
                    )));
                }
                let op = Op::LayerNorm {
                    axis: axis(cx, a, rank)?,
                    epsilon: cx.float("epsilon", 1e-5)?,
                };
                let ins = [Some(x), Some(cx.req(1)?), cx.input(2)?];
                let n = if ins[2].is_some() { 3 } else { 2 };
                let k = cx.num_outputs().max(1);
                cx.add(op, &ins[..n], Some(k))?
            }
            "LRN" => {
                let size = cx
                    .int_opt("size")?
                    .ok_or_else(|| cx.err("attribute 'size' is required"))?;
                let op = Op::Lrn {
                    size: usize::try_from(size).map_err(|_| cx.err("size must be positive"))?,
                    alpha: cx.float("alpha", 1e-4)?,
                    beta: cx.float("beta", 0.75)?,
                    bias: cx.float("bias", 1.0)?,
                };
                vec![cx.add1(op, &[cx.req(0)?])?]
            }
            "MaxPool" | "AveragePool" => pool(cx, op == "MaxPool")?,
            "GlobalAveragePool" => vec![cx.add1(Op::GlobalAveragePool, &[cx.req(0)?])?],
            "GlobalMaxPool" => vec![cx.add1(Op::GlobalMaxPool, &[cx.req(0)?])?],
            "ArgMax" | "ArgMin" => {
                let x = cx.req(0)?;
                let rank = cx.ty(x).rank();
                let a = cx.int("axis", 0)?;
                let op = Op::Arg {
                    max: op == "ArgMax",
                    axis: axis(cx, a, rank)?,
                    keepdims: cx.int("keepdims", 1)? != 0,
                    select_last_index: cx.int("select_last_index", 0)? != 0,
                };
                vec![cx.add1(op, &[x])?]
            }
            _ => match reduce_kind(op) {
                Some(kind) => vec![reduce(cx, op, kind)?],
                None => return Ok(None),
            },
        };
        Ok(Some(out))
    })();
    r.transpose()
}

fn softmax(cx: &mut NodeCx<'_, '_>, log: bool) -> Result<Value> {
    let x = cx.req(0)?;
    let shape = cx.ty(x).shape.clone();
    let rank = shape.len();
    let make = |axis| {
        if log {
            Op::LogSoftmax { axis }
        } else {
            Op::Softmax { axis }
        }
    };
    if cx.opset() >= 13 {
        let a = cx.int("axis", -1)?;
        let a = axis(cx, a, rank)?;
        return cx.add1(make(a), &[x]);
    }
    // Before opset 13 the input is coerced to 2-D at `axis` and normalised over the second dimension.
    let a = cx.int("axis", 1)?;
    let a = if a == rank as i64 {
        rank
    } else {
        axis(cx, a, rank)?
    };
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a..].iter().product();
    let flat = cx.add1(
        Op::Reshape {
            shape: vec![outer, inner],
        },
        &[x],
    )?;
    let s = cx.add1(make(1), &[flat])?;
    cx.add1(Op::Reshape { shape }, &[s])
}

/// Begin and end pads for one spatial axis under `auto_pad` SAME_UPPER / SAME_LOWER.
fn same_pads(
    input: usize,
    kernel: usize,
    stride: usize,
    dil: usize,
    upper: bool,
) -> (usize, usize) {
    let out = input.div_ceil(stride.max(1));
    let need = ((out.max(1) - 1) * stride + (kernel.max(1) - 1) * dil + 1).saturating_sub(input);
    let small = need / 2;
    if upper {
        (small, need - small)
    } else {
        (need - small, small)
    }
}

/// Explicit pads (begins then ends) from `auto_pad` and `pads`. Kernel, strides and dilations must give
/// one value per spatial axis of `ins`.
pub(crate) fn resolve_pads(
    cx: &mut NodeCx<'_, '_>,
    ins: &[usize],
    ks: &[usize],
    strides: &[usize],
    dils: &[usize],
) -> Result<Vec<usize>> {
    let sp = ins.len();
    for (name, v) in [
        ("kernel_shape", ks),
        ("strides", strides),
        ("dilations", dils),
    ] {
        if v.len() != sp {
            return Err(cx.err(format!(
                "{name} has {} values, expected {sp} (one per spatial axis)",
                v.len()
            )));
        }
    }
    let auto = cx.string("auto_pad", "NOTSET")?;
    match auto.as_str() {
        "NOTSET" => {
            let pads = cx.usizes("pads", vec![0; 2 * sp])?;
            if pads.len() != 2 * sp {
                return Err(cx.err(format!(
                    "pads has {} values, expected {}",
                    pads.len(),
                    2 * sp
                )));
            }
            Ok(pads)
        }
        "VALID" => {
            cx.ints("pads")?;
            Ok(vec![0; 2 * sp])
        }
        "SAME_UPPER" | "SAME_LOWER" => {
            cx.ints("pads")?;
            let mut pads = vec![0; 2 * sp];
            for d in 0..sp {
                let (b, e) = same_pads(ins[d], ks[d], strides[d], dils[d], auto == "SAME_UPPER");
                pads[d] = b;
                pads[d + sp] = e;
            }
            Ok(pads)
        }
        other => Err(cx.err(format!("auto_pad='{other}' is not supported"))),
    }
}

fn conv(cx: &mut NodeCx<'_, '_>, transpose: bool) -> Result<Value> {
    let (x, w) = (cx.req(0)?, cx.req(1)?);
    let (xs, ws) = (cx.ty(x).shape.clone(), cx.ty(w).shape.clone());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(cx.err_in(
            1,
            format!("weight shape {ws:?} does not match input shape {xs:?}"),
        ));
    }
    let sp = xs.len() - 2;
    let ks = ws[2..].to_vec();
    let k = cx.usizes("kernel_shape", ks.clone())?;
    if k != ks {
        return Err(cx.err(format!(
            "kernel_shape {k:?} does not match the weight's {ks:?}"
        )));
    }
    let strides = cx.usizes("strides", vec![1; sp])?;
    let dilations = cx.usizes("dilations", vec![1; sp])?;
    let group = cx.int("group", 1)?;
    let group = usize::try_from(group)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| cx.err("group must be positive"))?;
    if strides.len() != sp || dilations.len() != sp {
        return Err(cx.err(format!("strides and dilations need {sp} values")));
    }
    let mut attrs = ConvAttrs {
        strides,
        pads: vec![],
        dilations,
        group,
        output_padding: vec![],
    };
    if !transpose {
        attrs.pads = resolve_pads(cx, &xs[2..], &ks, &attrs.strides, &attrs.dilations)?;
    } else {
        attrs.output_padding = cx.usizes("output_padding", vec![0; sp])?;
        if attrs.output_padding.len() != sp {
            return Err(cx.err(format!(
                "output_padding has {} values, expected {sp}",
                attrs.output_padding.len()
            )));
        }
        let output_shape = cx.usizes("output_shape", vec![])?;
        let auto = cx.string("auto_pad", "NOTSET")?;
        let explicit = cx.usizes("pads", vec![0; 2 * sp])?;
        // The output size with no padding; padding (or a requested output shape) trims it.
        let full: Vec<usize> = (0..sp)
            .map(|d| {
                attrs.strides[d] * xs[d + 2].saturating_sub(1)
                    + attrs.output_padding[d]
                    + ks[d].saturating_sub(1) * attrs.dilations[d]
                    + 1
            })
            .collect();
        if !output_shape.is_empty() && output_shape.len() < sp {
            return Err(cx.err(format!(
                "output_shape has {} values, expected {sp}",
                output_shape.len()
            )));
        }
        let target: Option<Vec<usize>> = if !output_shape.is_empty() {
            Some(output_shape[output_shape.len().saturating_sub(sp)..].to_vec())
        } else if auto == "SAME_UPPER" || auto == "SAME_LOWER" {
            Some((0..sp).map(|d| xs[d + 2] * attrs.strides[d]).collect())
        } else {
            None
        };
        attrs.pads = match target {
            None if auto == "NOTSET" || auto == "VALID" => {
                if auto == "VALID" {
                    vec![0; 2 * sp]
                } else {
                    explicit
                }
            }
            None => return Err(cx.err(format!("auto_pad='{auto}' is not supported"))),
            Some(t) => {
                let mut pads = vec![0; 2 * sp];
                for d in 0..sp {
                    if t[d] > full[d] {
                        attrs.output_padding[d] += t[d] - full[d];
                        continue;
                    }
                    let total = full[d] - t[d];
                    let (b, e) = if auto == "SAME_UPPER" {
                        (total / 2, total - total / 2)
                    } else {
                        (total - total / 2, total / 2)
                    };
                    pads[d] = b;
                    pads[d + sp] = e;
                }
                pads
            }
        };
        if attrs.pads.len() != 2 * sp {
            return Err(cx.err(format!(
                "pads has {} values, expected {}",
                attrs.pads.len(),
                2 * sp
            )));
        }
    }
    let b = cx.input(2)?;
    let ins = [Some(x), Some(w), b];
    let n = if b.is_some() { 3 } else { 2 };
    let op = if transpose {
        Op::ConvTranspose(attrs)
    } else {
        Op::Conv(attrs)
    };
    Ok(cx.add(op, &ins[..n], Some(1))?[0])
}

fn pool(cx: &mut NodeCx<'_, '_>, max: bool) -> Result<Vec<Value>> {
    let x = cx.req(0)?;
    let p = pool_attrs(cx, x)?;
    if max {
        let col_major = cx.int("storage_order", 0)? != 0;
        let n = cx.num_outputs().max(1);
        return cx.add(Op::MaxPool { pool: p, col_major }, &[Some(x)], Some(n));
    }
    let op = Op::AveragePool {
        pool: p,
        count_include_pad: cx.int("count_include_pad", 0)? != 0,
    };
    Ok(vec![cx.add1(op, &[x])?])
}

/// Pooling geometry from kernel_shape, strides, dilations, ceil_mode, auto_pad and pads.
pub(crate) fn pool_attrs(cx: &mut NodeCx<'_, '_>, x: Value) -> Result<PoolAttrs> {
    let xs = cx.ty(x).shape.clone();
    if xs.len() < 3 {
        return Err(cx.err_in(0, "pooling expects [N, C, spatial...]"));
    }
    let sp = xs.len() - 2;
    let kernel = cx.usizes("kernel_shape", vec![])?;
    if kernel.len() != sp {
        return Err(cx.err(format!("kernel_shape needs {sp} values")));
    }
    let strides = cx.usizes("strides", vec![1; sp])?;
    let dilations = cx.usizes("dilations", vec![1; sp])?;
    let ceil_mode = cx.int("ceil_mode", 0)? != 0;
    let pads = resolve_pads(cx, &xs[2..], &kernel, &strides, &dilations)?;
    Ok(PoolAttrs {
        kernel,
        strides,
        pads,
        dilations,
        ceil_mode,
    })
}

fn reduce_kind(op: &str) -> Option<ReduceKind> {
    Some(match op {
        "ReduceSum" => ReduceKind::Sum,
        "ReduceMean" => ReduceKind::Mean,
        "ReduceMax" => ReduceKind::Max,
        "ReduceMin" => ReduceKind::Min,
        "ReduceProd" => ReduceKind::Prod,
        "ReduceL1" => ReduceKind::L1,
        "ReduceL2" => ReduceKind::L2,
        "ReduceSumSquare" => ReduceKind::SumSquare,
        "ReduceLogSum" => ReduceKind::LogSum,
        "ReduceLogSumExp" => ReduceKind::LogSumExp,
        _ => return None,
    })
}

fn reduce(cx: &mut NodeCx<'_, '_>, op: &str, kind: ReduceKind) -> Result<Value> {
    let x = cx.req(0)?;
    let rank = cx.ty(x).rank();
    // ReduceSum took axes as an input from opset 13, the others from opset 18.
    let axes_as_input = cx.opset() >= if op == "ReduceSum" { 13 } else { 18 };
    let axes = if axes_as_input {
        cx.konst_ints(1)?
    } else {
        cx.ints("axes")?
    };
    let keepdims = cx.int("keepdims", 1)? != 0;
    let noop = cx.int("noop_with_empty_axes", 0)? != 0;
    let axes: Vec<usize> = match axes.filter(|a| !a.is_empty()) {
        None if noop => return Ok(x),
        None => (0..rank).collect(),
        Some(a) => {
            let mut v: Vec<usize> = a
                .iter()
                .map(|&a| axis(cx, a, rank))
                .collect::<Result<_>>()?;
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    cx.add1(
        Op::Reduce {
            kind,
            axes,
            keepdims,
        },
        &[x],
    )
}

/// BatchNormalization with `training_mode=1` (opset 14): normalised by the batch's own statistics (the
/// mean and population variance over every axis but the channels), and the running statistics updated,
/// `mean * momentum + batch_mean * (1 - momentum)` and the same for the variance: the outputs `y`,
/// `running_mean`, `running_var` as ONNX's reference computes them.
fn batch_norm_training(
    cx: &mut NodeCx<'_, '_>,
    op: Op,
    ins: &[Value],
    momentum: f32,
) -> Result<Vec<Value>> {
    let x = ins[0];
    let t = cx.ty(x).clone();
    if t.rank() < 2 {
        return Err(cx.err_in(0, format!("the input is {t}, with no channel axis")));
    }
    let axes: Vec<usize> = (0..t.rank()).filter(|&a| a != 1).collect();
    let reduce = |cx: &mut NodeCx<'_, '_>, v: Value| {
        cx.add1(
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes: axes.clone(),
                keepdims: false,
            },
            &[v],
        )
    };
    let kept = |cx: &mut NodeCx<'_, '_>, v: Value| {
        cx.add1(
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes: axes.clone(),
                keepdims: true,
            },
            &[v],
        )
    };
    let mean = reduce(cx, x)?;
    let centred = {
        let m = kept(cx, x)?;
        cx.bin(Binary::Sub, x, m)?
    };
    let squares = cx.bin(Binary::Mul, centred, centred)?;
    let var = reduce(cx, squares)?;
    // The statistics in the running ones' type (T2, which may differ from the input's).
    let stats = cx.ty(ins[3]).dtype;
    let (mean, var) = (cx.cast_to(mean, stats)?, cx.cast_to(var, stats)?);
    let y = cx.add1(op, &[x, ins[1], ins[2], mean, var])?;
    let mut outs = vec![y];
    let updated = cx.num_outputs().saturating_sub(1);
    for (running, batch) in [(ins[3], mean), (ins[4], var)].into_iter().take(updated) {
        let keep = cx.scalar(f64::from(momentum), stats);
        let take = cx.scalar(1.0 - f64::from(momentum), stats);
        let old = cx.bin(Binary::Mul, running, keep)?;
        let new = cx.bin(Binary::Mul, batch, take)?;
        outs.push(cx.bin(Binary::Add, old, new)?);
    }
    Ok(outs)
}
