//! `--precision int8`: mlopt quantizes a float model itself, as ONNX Runtime's `quantize_static` would
//! (per-channel symmetric i8 weights, asymmetric u8 activations whose ranges are calibrated by min and
//! max on real inputs), but only where the result runs in integers: the activation and the constant
//! weight of each contraction the integer form takes (`rules/quant.rs`, `integer_shape`). It writes the
//! QDQ form an exporter writes,
//!
//! ```text
//! conv(x, w)  =>  conv(dq(q(x, sx, zx)), dq(w8, sw))     q(x) = u8(clip(round(x / sx) + zx, 0, 255))
//! ```
//!
//! so everything after is the QDQ path: the `integer-contraction` rule, extraction by cost, the integer
//! blocks. Calibration runs the float graph on the given input sets with the reference interpreter and
//! records each such activation's smallest and largest value (0 included, so that zero is exact).

use crate::error::{Result, RewriteError};
use crate::rules::quant::integer_shape;
use mlopt_ir::{Binary, DType, Graph, NodeId, Op, Tensor, Unary, Value};
use std::collections::HashMap;

/// A quantized copy of a graph, how many contractions it quantized, and the float graph's outputs on
/// each calibration set (which the calibration computes anyway: the reference the error is measured
/// against).
#[derive(Debug, Clone)]
pub struct Quantized {
    pub graph: Graph,
    pub contractions: usize,
    pub fp32: Vec<Vec<(String, Tensor)>>,
}

/// A contraction to quantize: its node, float activation, constant weight and the weight's axis of
/// output channels.
struct Site {
    node: NodeId,
    x: Value,
    w: Value,
    axis: usize,
}

/// `g` with each contraction the integer form takes quantized, its activations' ranges calibrated on
/// `sets` (inputs by name).
pub fn quantize(g: &Graph, sets: &[HashMap<String, Tensor>]) -> Result<Quantized> {
    let sites = sites(g);
    let mut acts: Vec<Value> = sites.iter().map(|s| s.x).collect();
    acts.sort_by_key(|v| (v.node.index(), v.output));
    acts.dedup();
    let (ranges, fp32) = calibrate(g, &acts, sets)?;
    let mut q = g.clone();
    for (&x, &(lo, hi)) in acts.iter().zip(&ranges) {
        let readers: Vec<NodeId> = sites.iter().filter(|s| s.x == x).map(|s| s.node).collect();
        let name = format!("{}_int8", g.node(x.node).name);
        let dq = activation(&mut q, x, lo, hi, &name)?;
        q.replace_reads(x, dq, |n| readers.contains(&n));
    }
    for s in &sites {
        let name = format!("{}_int8", g.node(s.w.node).name);
        let dw = weight(&mut q, s.w, s.axis, &name)?;
        q.replace_reads(s.w, dw, |n| n == s.node);
    }
    q.remove_dead();
    Ok(Quantized {
        graph: q,
        contractions: sites.len(),
        fp32,
    })
}

/// The contractions of `g` over a float activation and a constant float weight that the integer form
/// takes.
fn sites(g: &Graph) -> Vec<Site> {
    g.node_ids()
        .filter_map(|n| {
            let ins = g.inputs(n);
            let (x, w) = ((*ins.first()?)?, (*ins.get(1)?)?);
            let wv = g.const_value(w)?;
            let float = |v: Value| g.value_type(v).dtype == DType::F32;
            if g.const_value(x).is_some() || !float(x) || !float(w) {
                return None;
            }
            let (axis, _, _) = integer_shape(&g.node(n).op, wv.shape())?;
            Some(Site {
                node: n,
                x,
                w,
                axis,
            })
        })
        .collect()
}

/// Each of `acts`' (smallest, largest) value over the calibration sets, 0 included; and the graph's
/// outputs on each set.
fn calibrate(g: &Graph, acts: &[Value], sets: &[HashMap<String, Tensor>]) -> Result<Ranges> {
    if sets.is_empty() {
        return Err(RewriteError::Precision(
            "--precision int8 calibrates its activations' ranges on real inputs: pass --calibration DIR"
                .into(),
        ));
    }
    // The activations as extra outputs of a copy, after the graph's own.
    let mut probe = g.clone();
    let first = g.graph_outputs().len();
    for (i, &v) in acts.iter().enumerate() {
        probe.add_output(format!("calibrated {i}"), v);
    }
    let mut ranges = vec![(0f64, 0f64); acts.len()];
    let mut outputs = Vec::with_capacity(sets.len());
    for inputs in sets {
        let mut outs = mlopt_ir::interp::run(&probe, inputs)?;
        for (r, (_, t)) in ranges.iter_mut().zip(outs.iter().skip(first)) {
            for v in t.to_f64_vec().into_iter().filter(|v| v.is_finite()) {
                *r = (r.0.min(v), r.1.max(v));
            }
        }
        outs.truncate(first);
        outputs.push(outs);
    }
    Ok((ranges, outputs))
}

/// Activation ranges and the float graph's outputs per set (`calibrate`).
type Ranges = (Vec<(f64, f64)>, Vec<Vec<(String, Tensor)>>);

/// `x` quantized to u8 over [lo, hi] and dequantized: `(f32(q(x)) - zx) * sx`.
fn activation(g: &mut Graph, x: Value, lo: f64, hi: f64, name: &str) -> Result<Value> {
    let scale = ((hi - lo) / 255.0) as f32;
    let scale = if scale.is_normal() { scale } else { 1.0 };
    let zero = (-lo / f64::from(scale)).round_ties_even().clamp(0.0, 255.0) as f32;
    let [s, z, lo, hi] = [scale, zero, 0.0, 255.0].map(|v| g.add_const("", Tensor::scalar(v)));
    let mut add = |op: Op, ins: &[Value]| g.add(op, name, ins);
    let v = add(Op::Binary(Binary::Div), &[x, s])?;
    let v = add(Op::Unary(Unary::Round), &[v])?;
    let v = add(Op::Binary(Binary::Add), &[v, z])?;
    let v = add(Op::Clip, &[v, lo, hi])?;
    let v = add(Op::Cast { to: DType::U8 }, &[v])?;
    let v = add(Op::Cast { to: DType::F32 }, &[v])?;
    let v = add(Op::Binary(Binary::Sub), &[v, z])?;
    Ok(add(Op::Binary(Binary::Mul), &[v, s])?)
}

/// Constant weight `w` quantized symmetrically to i8 per channel along `axis` and dequantized:
/// `f32(w8) * sw`, `sw` shaped to broadcast along `axis`.
fn weight(g: &mut Graph, w: Value, axis: usize, name: &str) -> Result<Value> {
    let t = g
        .const_value(w)
        .ok_or_else(|| RewriteError::Internal(format!("{name}: the weight is not a constant")))?
        .clone();
    let shape = t.shape().to_vec();
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let channel = |i: usize| (i / inner) % n;
    let values = t.to_f64_vec();
    let mut amax = vec![0f64; n];
    for (i, v) in values.iter().enumerate() {
        amax[channel(i)] = amax[channel(i)].max(v.abs());
    }
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| {
            let s = (a / 127.0) as f32;
            if s.is_normal() {
                s
            } else {
                1.0
            }
        })
        .collect();
    let q: Vec<i8> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (v / f64::from(scales[channel(i)]))
                .round_ties_even()
                .clamp(-127.0, 127.0) as i8
        })
        .collect();
    let bad = || RewriteError::Internal(format!("{name}: quantized weight of shape {shape:?}"));
    let wq = g.add_const(name, Tensor::from_vec(&shape, q).ok_or_else(bad)?);
    let mut s_shape = vec![1; shape.len()];
    s_shape[axis] = n;
    let sw = g.add_const("", Tensor::from_vec(&s_shape, scales).ok_or_else(bad)?);
    let v = g.add(Op::Cast { to: DType::F32 }, name, &[wq])?;
    Ok(g.add(Op::Binary(Binary::Mul), name, &[v, sw])?)
}
