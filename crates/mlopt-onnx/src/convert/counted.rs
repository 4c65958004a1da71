//! Ops whose output size depends on the data: NonZero, Compress, NonMaxSuppression, Unique. Each becomes its
//! IR op, computed at a static bound with a count (`mlopt_ir::extent`); where its inputs are constants
//! it folds to a constant of the exact size.

use super::nn::axis;
use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Op, Value};

pub(super) const OPS: &[&str] = &["NonZero", "Compress", "NonMaxSuppression", "Unique"];

pub(super) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = match op {
        "NonZero" => cx.req(0).and_then(|x| counted(cx, Op::NonZero, &[Some(x)])),
        "Compress" => compress(cx),
        "NonMaxSuppression" => non_max_suppression(cx),
        "Unique" => unique(cx),
        _ => return None,
    };
    Some(r)
}

/// Adds a data-sized op and returns its outputs but the count: folded, each cut to the count (the
/// exact result); else at the bound, with the count that `mlopt_ir::extent` follows.
fn counted(cx: &mut NodeCx<'_, '_>, op: Op, inputs: &[Option<Value>]) -> Result<Vec<Value>> {
    let sized = mlopt_ir::extent::counted_axes(&op);
    let mut outs = cx.add(op, inputs, None)?;
    let count = outs
        .pop()
        .ok_or_else(|| cx.err("internal: no count output"))?;
    cx.imp.counted = true;
    let Some(n) = cx.imp.g.const_value(count).cloned() else {
        return Ok(outs);
    };
    let n = n.to_i64_vec().first().map_or(0, |&c| c.max(0) as usize);
    for (k, along) in sized {
        let v = outs[k as usize];
        let shape = cx.ty(v).shape.clone();
        let mut lens = shape.clone();
        lens[along] = n;
        let exact = Op::Slice {
            starts: vec![0; shape.len()],
            steps: vec![1; shape.len()],
            lens,
        };
        outs[k as usize] = cx.add1(exact, &[v])?;
    }
    Ok(outs)
}

/// Input 0 and the axis its `axis` attribute names; without one, input 0 flattened and axis 0.
fn along(cx: &mut NodeCx<'_, '_>) -> Result<(Value, usize)> {
    let x = cx.req(0)?;
    let rank = cx.ty(x).rank();
    Ok(match cx.int_opt("axis")? {
        Some(a) => (x, axis(cx, a, rank)?),
        None => {
            let n = cx.ty(x).numel();
            (cx.add1(Op::Reshape { shape: vec![n] }, &[x])?, 0)
        }
    })
}

fn unique(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let sorted = cx.int("sorted", 1)? != 0;
    let (x, a) = along(cx)?;
    counted(cx, Op::Unique { axis: a, sorted }, &[Some(x)])
}

fn compress(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let cond = cx.req(1)?;
    let (x, a) = along(cx)?;
    counted(cx, Op::Compress { axis: a }, &[Some(x), Some(cond)])
}

fn non_max_suppression(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let center_point_box = match cx.int("center_point_box", 0)? {
        0 => false,
        1 => true,
        c => return Err(cx.err(format!("center_point_box is {c}, not 0 or 1"))),
    };
    let (boxes, scores) = (cx.req(0)?, cx.req(1)?);
    let inputs: Vec<Option<Value>> = vec![
        Some(boxes),
        Some(scores),
        cx.input(2)?,
        cx.input(3)?,
        cx.input(4)?,
    ];
    let s = cx.ty(scores).shape.clone();
    if s.len() != 3 {
        return Err(cx.err_in(
            1,
            format!("scores are {}, not [batch, classes, boxes]", cx.ty(scores)),
        ));
    }
    // At most every box of every class, or what a known max_output_boxes_per_class allows.
    let per_class = match inputs[2].and_then(|v| cx.imp.g.const_value(v).cloned()) {
        Some(m) => match m.to_i64_vec()[..] {
            [m] => s[2].min(m.max(0) as usize),
            _ => return Err(cx.err_in(2, "max_output_boxes_per_class must hold one value")),
        },
        None => s[2],
    };
    let bound = s[0].saturating_mul(s[1]).saturating_mul(per_class);
    let op = Op::NonMaxSuppression {
        center_point_box,
        bound,
    };
    let last = inputs
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    counted(cx, op, &inputs[..last])
}
