//! Sequences and optionals, where they are static. mlopt's graphs hold tensors only, so a sequence is
//! known at import as its list of tensors (`Item::Seq`): every op that builds or reads one takes its
//! positions and lengths at compile time (constants, or values folded from static shapes), and what
//! reaches the graph is the tensors and the ops on them (a `Split`, a `Concat`, a `SequenceMap`'s body once
//! per element). An optional is its content, or `Item::Absent`. A sequence whose length depends on the
//! data is refused where that length is needed, naming the node.

use super::control::{call, stack};
use super::{Item, NodeCx};
use crate::error::Result;
use crate::proto::attribute_type as at;
use crate::tensor_io::dtype_from_onnx;
use mlopt_ir::{Op, Tensor, Value};

pub(super) const OPS: &[&str] = &[
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceAt",
    "SequenceInsert",
    "SequenceErase",
    "SequenceLength",
    "SplitToSequence",
    "ConcatFromSequence",
    "SequenceMap",
    "Optional",
    "OptionalHasElement",
    "OptionalGetElement",
];

/// The most elements a sequence may hold: each is a value of the graph.
pub(crate) const MAX_SEQUENCE: usize = 4096;

pub(super) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Item>>> {
    let r = match op {
        // Identity of a sequence or an optional; a tensor's is the shape family's.
        "Identity" => match cx.item(0) {
            Ok(Some(Item::Tensor(_))) | Ok(None) => return None,
            r => r.and_then(|i| i.ok_or_else(|| cx.err_in(0, "required input is missing"))),
        }
        .map(|i| vec![i]),
        "SequenceConstruct" => construct(cx),
        "SequenceEmpty" => empty(cx),
        "SequenceAt" => at(cx),
        "SequenceInsert" => insert(cx),
        "SequenceErase" => erase(cx),
        "SequenceLength" => seq(cx, 0).map(|s| {
            let n = cx.konst_value(Tensor::scalar(s.len() as i64));
            vec![Item::Tensor(n)]
        }),
        "SplitToSequence" => split(cx),
        "ConcatFromSequence" => concat(cx),
        "SequenceMap" => map(cx),
        "Optional" => optional(cx),
        "OptionalHasElement" => has_element(cx),
        "OptionalGetElement" => match cx.item(0) {
            Ok(Some(Item::Absent)) => Err(cx.err_in(0, "the optional is empty")),
            Ok(Some(i)) => Ok(vec![i]),
            Ok(None) => Err(cx.err_in(0, "required input is missing")),
            Err(e) => Err(e),
        },
        _ => return None,
    };
    Some(r)
}

/// Input `i`, which must be a sequence.
fn seq(cx: &NodeCx<'_, '_>, i: usize) -> Result<Vec<Value>> {
    match cx.item(i)? {
        Some(Item::Seq(v)) => Ok(v),
        Some(other) => Err(cx.err_in(i, format!("is {}, not a sequence", other.kind()))),
        None => Err(cx.err_in(i, "required input is missing")),
    }
}

/// An error unless a sequence of `n` elements fits `MAX_SEQUENCE`.
fn fits(cx: &NodeCx<'_, '_>, n: usize) -> Result<()> {
    if n <= MAX_SEQUENCE {
        return Ok(());
    }
    Err(cx.err(format!(
        "a sequence of {n} elements is more than mlopt keeps ({MAX_SEQUENCE}: each element is a \
         value of the compiled graph)"
    )))
}

/// An error unless every element of `s` has the element type of the first (a sequence holds one type).
fn same_dtype(cx: &NodeCx<'_, '_>, s: &[Value]) -> Result<()> {
    let Some(&first) = s.first() else {
        return Ok(());
    };
    let d = cx.ty(first).dtype;
    match s.iter().find(|&&v| cx.ty(v).dtype != d) {
        Some(&v) => Err(cx.err(format!(
            "a sequence holds one element type; here {d} and {}",
            cx.ty(v).dtype
        ))),
        None => Ok(()),
    }
}

fn construct(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let s: Vec<Value> = (0..cx.num_inputs())
        .map(|i| cx.req(i))
        .collect::<Result<_>>()?;
    fits(cx, s.len())?;
    same_dtype(cx, &s)?;
    Ok(vec![Item::Seq(s)])
}

fn empty(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    if let Some(d) = cx.int_opt("dtype")? {
        if i32::try_from(d).ok().and_then(dtype_from_onnx).is_none() {
            return Err(cx.err(format!("dtype {d} is not an element type mlopt supports")));
        }
    }
    Ok(vec![Item::Seq(vec![])])
}

/// The constant position input `i` of a sequence of `n` elements: within `-n..n` (`-n..=n` where
/// `end` allows one past the last, for an insertion), negative counting from the end; `None` when
/// absent.
fn position(cx: &NodeCx<'_, '_>, i: usize, n: usize, end: bool) -> Result<Option<usize>> {
    let Some(p) = cx.konst_ints(i)? else {
        return Ok(None);
    };
    let p = match p[..] {
        [p] => p,
        _ => return Err(cx.err_in(i, "the position must be one integer")),
    };
    let n = n as i64;
    let hi = if end { n } else { n - 1 };
    if p < -n || p > hi {
        return Err(cx.err_in(
            i,
            format!("position {p} is out of range for a sequence of {n} elements"),
        ));
    }
    Ok(Some((if p < 0 { p + n } else { p }) as usize))
}

fn at(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let s = seq(cx, 0)?;
    let p = position(cx, 1, s.len(), false)?
        .ok_or_else(|| cx.err_in(1, "required input is missing"))?;
    Ok(vec![Item::Tensor(s[p])])
}

fn insert(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let mut s = seq(cx, 0)?;
    let x = cx.req(1)?;
    let p = position(cx, 2, s.len(), true)?.unwrap_or(s.len());
    s.insert(p, x);
    fits(cx, s.len())?;
    same_dtype(cx, &s)?;
    Ok(vec![Item::Seq(s)])
}

fn erase(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let mut s = seq(cx, 0)?;
    if s.is_empty() {
        return Err(cx.err_in(0, "the sequence is empty: there is nothing to erase"));
    }
    let p = position(cx, 1, s.len(), false)?.unwrap_or(s.len() - 1);
    s.remove(p);
    Ok(vec![Item::Seq(s)])
}

/// SplitToSequence: `split` absent cuts pieces of one along `axis` (dropped unless `keepdims`); a
/// scalar cuts pieces of that size (the last one smaller); a list gives each piece's size.
fn split(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let x = cx.req(0)?;
    let shape = cx.ty(x).shape.clone();
    let a = cx.int("axis", 0)?;
    let axis = mlopt_ir::normalize_axis(a, shape.len())
        .ok_or_else(|| cx.err(format!("axis {a} is out of range for rank {}", shape.len())))?;
    let keepdims = cx.int("keepdims", 1)? != 0;
    cx.static_size(0, axis..axis + 1)?;
    let dim = shape[axis];
    let split = cx.konst(1)?;
    let sizes: Vec<usize> = match &split {
        None => {
            fits(cx, dim)?;
            vec![1; dim]
        }
        Some(t) => {
            let v = t.to_i64_vec();
            if v.iter().any(|&d| d < 0) {
                return Err(cx.err_in(1, format!("a split size is negative: {v:?}")));
            }
            if t.shape().is_empty() {
                let chunk = v[0] as usize;
                if chunk == 0 {
                    return Err(cx.err_in(1, "the split size is 0"));
                }
                fits(cx, dim.div_ceil(chunk))?;
                (0..dim.div_ceil(chunk))
                    .map(|k| chunk.min(dim - k * chunk))
                    .collect()
            } else {
                fits(cx, v.len())?;
                let sizes: Vec<usize> = v.iter().map(|&d| d as usize).collect();
                if sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(dim) {
                    return Err(cx.err_in(
                        1,
                        format!("split sizes {v:?} do not add up to the axis's {dim}"),
                    ));
                }
                sizes
            }
        }
    };
    if sizes.is_empty() {
        return Ok(vec![Item::Seq(vec![])]);
    }
    let n = sizes.len();
    let parts = cx.add(Op::Split { axis, sizes }, &[Some(x)], Some(n))?;
    if keepdims || split.is_some() {
        return Ok(vec![Item::Seq(parts)]);
    }
    let mut dropped = shape;
    dropped.remove(axis);
    let parts = parts
        .into_iter()
        .map(|p| {
            cx.add1(
                Op::Reshape {
                    shape: dropped.clone(),
                },
                &[p],
            )
        })
        .collect::<Result<_>>()?;
    Ok(vec![Item::Seq(parts)])
}

/// ConcatFromSequence: the elements joined along `axis`, or stacked along a new one (`new_axis`).
fn concat(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let s = seq(cx, 0)?;
    let a = cx.int("axis", 0)?;
    let new_axis = cx.int("new_axis", 0)? != 0;
    let Some(&first) = s.first() else {
        return Err(cx.err_in(0, "the sequence is empty: there is nothing to concatenate"));
    };
    let rank = cx.ty(first).rank() + usize::from(new_axis);
    let axis = mlopt_ir::normalize_axis(a, rank)
        .ok_or_else(|| cx.err(format!("axis {a} is out of range for rank {rank}")))?;
    let v = if new_axis {
        stack(cx, &s, axis)?
    } else {
        cx.add1(Op::Concat { axis }, &s)?
    };
    Ok(vec![Item::Tensor(v)])
}

/// SequenceMap: the body once per element, given element i of each sequence input and each tensor
/// input whole; each output is the sequence of the body's outputs.
fn map(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let body = cx
        .attr("body", &[at::GRAPH])?
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| cx.err("attribute 'body' (a graph) is required"))?;
    let ins: Vec<Item> = (0..cx.num_inputs())
        .map(|i| {
            cx.item(i)?
                .ok_or_else(|| cx.err_in(i, "required input is missing"))
        })
        .collect::<Result<_>>()?;
    let n = match ins.first() {
        Some(Item::Seq(s)) => s.len(),
        _ => return Err(cx.err_in(0, "must be a sequence")),
    };
    for (i, item) in ins.iter().enumerate() {
        match item {
            Item::Seq(s) if s.len() != n => {
                return Err(cx.err_in(
                    i,
                    format!("has {} elements, the first sequence {n}", s.len()),
                ))
            }
            Item::Absent => return Err(cx.err_in(i, "is an empty optional")),
            _ => {}
        }
    }
    let mut outs: Vec<Vec<Value>> = vec![Vec::with_capacity(n); body.output.len()];
    for k in 0..n {
        let args: Vec<Item> = ins
            .iter()
            .map(|item| match item {
                Item::Seq(s) => Item::Tensor(s[k]),
                other => other.clone(),
            })
            .collect();
        for ((slot, o), v) in outs
            .iter_mut()
            .zip(call(cx, body, &args)?)
            .zip(&body.output)
        {
            match o {
                Item::Tensor(t) => slot.push(t),
                other => {
                    return Err(cx.err(format!(
                        "the body's output '{}' is {}; SequenceMap's body gives tensors",
                        v.name,
                        other.kind()
                    )))
                }
            }
        }
    }
    Ok(outs.into_iter().map(Item::Seq).collect())
}

/// Optional: its input, or an empty optional of the type the attribute names.
fn optional(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let ty = cx.attr("type", &[at::TYPE_PROTO])?;
    match cx.item(0)? {
        Some(i) => Ok(vec![i]),
        None if ty.is_some() => Ok(vec![Item::Absent]),
        None => Err(cx.err("an Optional without an input needs its 'type' attribute")),
    }
}

fn has_element(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let has = !matches!(cx.item(0)?, None | Some(Item::Absent));
    Ok(vec![Item::Tensor(cx.konst_value(Tensor::scalar(has)))])
}
