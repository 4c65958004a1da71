//! Control flow. An `If` whose condition is known at compile time (an initializer, a value folded from
//! static shapes, or an input pinned to a value) becomes the branch it takes: the branch's initializers
//! are constants, its nodes are converted in the enclosing graph's scope (they read outer values by
//! name) and its outputs are the `If`'s. A condition known only at run time converts both branches and
//! picks each output with `choose`, which runs only the branch taken (see `if_at_run_time`).
//!
//! `Scan` and `Loop` whose trip counts are known at compile time are unrolled: the body is converted
//! once per iteration in a scope of its own (its inputs bound to that iteration's values; outer values
//! read by name), the state carried from one iteration's outputs to the next one's inputs, and the scan
//! outputs stacked. A `Loop`'s trip count is its constant `M` and its condition, which must fold to a
//! constant after every iteration. Unrolling is bounded by `MAX_UNROLLED_NODES` over the whole model.

use super::{convert_scoped, Item, NodeCx};
use crate::error::Result;
use crate::proto::{attribute_type as at, GraphProto};
use crate::tensor_io::tensor_from_proto;
use mlopt_ir::{Op, Tensor, Value};
use std::collections::HashMap;

pub(super) const OPS: &[&str] = &["If", "Loop", "Scan"];

/// The most body nodes the unrolled `Scan`s and `Loop`s of one model may convert, nested ones included
/// (iterations times each body's nodes).
pub(super) const MAX_UNROLLED_NODES: usize = 200_000;

pub(super) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Item>>> {
    match op {
        "If" => Some(if_(cx)),
        "Scan" => Some(scan(cx).map(|v| v.into_iter().map(Item::Tensor).collect())),
        "Loop" => Some(loop_(cx)),
        _ => None,
    }
}

fn if_(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let (then_branch, else_branch) = (branch(cx, "then_branch")?, branch(cx, "else_branch")?);
    let cond = match cx.konst(0) {
        Ok(c) => c.ok_or_else(|| cx.err_in(0, "required input is missing"))?,
        Err(_) => return if_at_run_time(cx, then_branch, else_branch),
    };
    let taken = match cond.to_f64_vec()[..] {
        [c] => c != 0.0,
        _ => {
            return Err(cx.err_in(
                0,
                format!("the condition holds {} values, not one", cond.numel()),
            ))
        }
    };
    inline(cx, if taken { then_branch } else { else_branch })
}

/// An `If` whose condition is known only at run time: both branches are converted (each in a scope of
/// its own) and each output is `choose(cond, then, else)`. What only one branch needs runs only when
/// that branch is taken (`mlopt_ir::demand`: the interpreter skips it, compiled code guards its
/// kernels' calls), so an error the other branch would raise is not raised; the outputs must agree in
/// type and shape (sequences in length too, each element chosen).
fn if_at_run_time(
    cx: &mut NodeCx<'_, '_>,
    then_branch: &GraphProto,
    else_branch: &GraphProto,
) -> Result<Vec<Item>> {
    let c = cx.req(0)?;
    let ct = cx.ty(c).clone();
    if ct.dtype != mlopt_ir::DType::Bool || ct.numel() != 1 {
        return Err(cx.err_in(0, format!("the condition is {ct}, not one bool")));
    }
    let c = cx.add1(Op::Reshape { shape: vec![] }, &[c])?;
    let (t, e) = (call(cx, then_branch, &[])?, call(cx, else_branch, &[])?);
    if t.len() != cx.node.output.len() || e.len() != t.len() {
        return Err(cx.err(format!(
            "the branches have {} and {} outputs, the node {}",
            t.len(),
            e.len(),
            cx.node.output.len()
        )));
    }
    let mut outs = Vec::with_capacity(t.len());
    for (k, (a, b)) in t.iter().zip(&e).enumerate() {
        let disagree = |cx: &NodeCx<'_, '_>, a: String, b: String| {
            cx.err(format!(
                "output {k} is {a} in the then branch and {b} in the else branch: mlopt compiles both \
                 branches of an If whose condition is known only at run time, and they must agree"
            ))
        };
        let (xs, ys) = match (a, b) {
            (Item::Tensor(x), Item::Tensor(y)) => (vec![*x], vec![*y]),
            (Item::Seq(xs), Item::Seq(ys)) if xs.len() == ys.len() => (xs.clone(), ys.clone()),
            (Item::Absent, Item::Absent) => (vec![], vec![]),
            (a, b) => {
                let len = |i: &Item| match i {
                    Item::Seq(v) => format!("a sequence of {}", v.len()),
                    i => i.kind().to_string(),
                };
                return Err(disagree(cx, len(a), len(b)));
            }
        };
        let mut chosen = Vec::with_capacity(xs.len());
        for (x, y) in xs.into_iter().zip(ys) {
            if cx.ty(x) != cx.ty(y) {
                return Err(disagree(cx, cx.ty(x).to_string(), cx.ty(y).to_string()));
            }
            chosen.push(cx.add1(Op::Choose, &[c, x, y])?);
        }
        outs.push(match a {
            Item::Tensor(_) => Item::Tensor(chosen[0]),
            Item::Seq(_) => Item::Seq(chosen),
            Item::Absent => Item::Absent,
        });
    }
    Ok(outs)
}

/// The graph attribute `name`, which the node requires.
fn branch<'a>(cx: &mut NodeCx<'a, '_>, name: &'a str) -> Result<&'a GraphProto> {
    cx.attr(name, &[at::GRAPH])?
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| cx.err(format!("attribute '{name}' (a graph) is required")))
}

/// The outputs of the branch `g` an `If` takes, converted in a scope of its own (see `call`).
fn inline(cx: &mut NodeCx<'_, '_>, g: &GraphProto) -> Result<Vec<Item>> {
    if g.output.len() != cx.node.output.len() {
        return Err(cx.err(format!(
            "the branch '{}' has {} outputs, the node {}",
            g.name,
            g.output.len(),
            cx.node.output.len()
        )));
    }
    call(cx, g, &[])
}

/// The outputs of `body` (a loop's body, a branch) run once on `args` (bound to its inputs in order),
/// converted in a scope of its own: the names it defines are forgotten afterwards, so the next iteration
/// defines them again and a branch's names stay inside it.
pub(super) fn call(cx: &mut NodeCx<'_, '_>, body: &GraphProto, args: &[Item]) -> Result<Vec<Item>> {
    if body.input.len() != args.len() {
        return Err(cx.err(format!(
            "the body has {} inputs, the node gives it {}",
            body.input.len(),
            args.len()
        )));
    }
    cx.imp.unrolled = cx.imp.unrolled.saturating_add(body.node.len().max(1));
    if cx.imp.unrolled > MAX_UNROLLED_NODES {
        return Err(cx.err(format!(
            "unrolling needs more than {MAX_UNROLLED_NODES} body nodes (loops and scans together)"
        )));
    }
    // The names the body may bind, and what they meant outside, restored afterwards.
    let mut names = Vec::new();
    defined_names(body, &mut names);
    let outer: Vec<(String, Option<Item>)> = names
        .into_iter()
        .map(|n| {
            let v = cx.imp.vals.get(&n).cloned();
            (n, v)
        })
        .collect();
    for (i, a) in body.input.iter().zip(args) {
        cx.imp.vals.insert(i.name.clone(), a.clone());
    }
    let result = (|| {
        if let Some(s) = body.sparse_initializer.first() {
            let n = s.values.as_ref().map_or("", |v| v.name.as_str());
            return Err(cx.err(format!(
                "sparse initializer '{n}' in a subgraph is not supported"
            )));
        }
        for t in &body.initializer {
            if cx.imp.vals.contains_key(&t.name) {
                return Err(cx.err(format!(
                    "the subgraph's initializer '{}' shadows a value of an enclosing graph",
                    t.name
                )));
            }
            let tensor = tensor_from_proto(t, cx.imp.base)?;
            let v = cx.imp.g.add_const(t.name.clone(), tensor);
            cx.imp.vals.insert(t.name.clone(), Item::Tensor(v));
        }
        for node in &body.node {
            convert_scoped(cx.imp, node)?;
        }
        body.output
            .iter()
            .map(|o| {
                cx.imp.vals.get(&o.name).cloned().ok_or_else(|| {
                    cx.err(format!(
                        "the subgraph's output '{}' is not produced by any node",
                        o.name
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
    })();
    for (n, v) in outer {
        match v {
            Some(v) => cx.imp.vals.insert(n, v),
            None => cx.imp.vals.remove(&n),
        };
    }
    result
}

/// `call` on tensors, for bodies whose outputs must be tensors (a Scan's).
fn call_tensors(cx: &mut NodeCx<'_, '_>, body: &GraphProto, args: &[Value]) -> Result<Vec<Value>> {
    let args: Vec<Item> = args.iter().copied().map(Item::Tensor).collect();
    let outs = call(cx, body, &args)?;
    outs.into_iter()
        .zip(&body.output)
        .map(|(o, v)| tensor(cx, o, &v.name))
        .collect()
}

/// The tensor a body's output `name` must be.
fn tensor(cx: &NodeCx<'_, '_>, item: Item, name: &str) -> Result<Value> {
    match item {
        Item::Tensor(v) => Ok(v),
        other => Err(cx.err(format!(
            "the body's output '{name}' is {}; {} takes a tensor there",
            other.kind(),
            cx.node.op_type
        ))),
    }
}

/// Every name `g` binds: its inputs, initializers and node outputs, and those of the graphs in its
/// nodes' attributes (an If's branches, a nested Loop's body).
fn defined_names(g: &GraphProto, out: &mut Vec<String>) {
    out.extend(g.input.iter().map(|i| i.name.clone()));
    out.extend(g.initializer.iter().map(|t| t.name.clone()));
    for node in &g.node {
        out.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
        for a in &node.attribute {
            a.g.iter()
                .chain(&a.graphs)
                .for_each(|sub| defined_names(sub, out));
        }
    }
}

/// An error unless `iterations` of `body` fit `MAX_UNROLLED_NODES`.
fn unroll_fits(cx: &NodeCx<'_, '_>, body: &GraphProto, iterations: usize) -> Result<()> {
    if iterations.saturating_mul(body.node.len().max(1)) <= MAX_UNROLLED_NODES {
        return Ok(());
    }
    Err(cx.err(format!(
        "unrolling {iterations} iterations of a body of {} nodes is more than mlopt unrolls \
         ({MAX_UNROLLED_NODES} nodes)",
        body.node.len()
    )))
}

/// Element `at` of `x` along `axis`, that axis dropped.
fn take(cx: &mut NodeCx<'_, '_>, x: Value, axis: usize, at: usize) -> Result<Value> {
    let shape = cx.ty(x).shape.clone();
    let mut lens = shape.clone();
    lens[axis] = 1;
    let mut starts = vec![0; shape.len()];
    starts[axis] = at;
    let steps = vec![1; shape.len()];
    let s = cx.add1(
        Op::Slice {
            starts,
            steps,
            lens,
        },
        &[x],
    )?;
    let mut dropped = shape;
    dropped.remove(axis);
    cx.add1(Op::Reshape { shape: dropped }, &[s])
}

/// `parts` stacked along a new `axis`.
pub(super) fn stack(cx: &mut NodeCx<'_, '_>, parts: &[Value], axis: usize) -> Result<Value> {
    let mut grown = Vec::with_capacity(parts.len());
    for &p in parts {
        let mut shape = cx.ty(p).shape.clone();
        if axis > shape.len() {
            return Err(cx.err(format!(
                "a scan output axis of {axis} is out of range for rank {}",
                shape.len()
            )));
        }
        shape.insert(axis, 1);
        grown.push(cx.add1(Op::Reshape { shape }, &[p])?);
    }
    cx.add1(Op::Concat { axis }, &grown)
}

/// A scan input: the value, its scan axis, and whether it is scanned from the end.
type Scanned = (Value, usize, bool);

/// `steps` iterations of `body` from `state`, each given the state and element t of every scan input:
/// the final state and, per scan output (`k` of them), its value at each step in order.
fn scan_steps(
    cx: &mut NodeCx<'_, '_>,
    body: &GraphProto,
    mut state: Vec<Value>,
    xs: &[Scanned],
    steps: usize,
    k: usize,
) -> Result<(Vec<Value>, Vec<Vec<Value>>)> {
    let n = state.len();
    let mut scanned: Vec<Vec<Value>> = (0..k).map(|_| Vec::with_capacity(steps)).collect();
    for t in 0..steps {
        let mut args = state.clone();
        for &(x, axis, reverse) in xs {
            let at = if reverse { steps - 1 - t } else { t };
            args.push(take(cx, x, axis, at)?);
        }
        let outs = call_tensors(cx, body, &args)?;
        state = outs[..n].to_vec();
        for (s, o) in scanned.iter_mut().zip(&outs[n..]) {
            s.push(*o);
        }
    }
    Ok((state, scanned))
}

/// An axis attribute entry, negative counting from the end of `rank`.
fn scan_axis(cx: &NodeCx<'_, '_>, a: i64, rank: usize) -> Result<usize> {
    mlopt_ir::normalize_axis(a, rank)
        .ok_or_else(|| cx.err(format!("axis {a} is out of range for rank {rank}")))
}

/// Scan (opset 9 and later): N state values, then M scan inputs sliced along their scan axes.
fn scan(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    if cx.imp.opset < 9 {
        return scan8(cx);
    }
    let body = branch(cx, "body")?;
    let m = usize::try_from(cx.int("num_scan_inputs", -1)?)
        .ok()
        .filter(|&m| m >= 1 && m <= cx.node.input.len())
        .ok_or_else(|| cx.err("num_scan_inputs must be between 1 and the number of inputs"))?;
    let inputs: Vec<Value> = (0..cx.node.input.len())
        .map(|i| cx.req(i))
        .collect::<Result<_>>()?;
    let n = inputs.len() - m;
    let k = body.output.len().checked_sub(n).ok_or_else(|| {
        cx.err(format!(
            "the body has {} outputs, fewer than the {n} states",
            body.output.len()
        ))
    })?;
    let list = |cx: &mut NodeCx<'_, '_>, name, len| -> Result<Vec<i64>> {
        let v = cx.ints(name)?.unwrap_or_else(|| vec![0; len]);
        if v.len() != len {
            return Err(cx.err(format!("{name} has {} entries, not {len}", v.len())));
        }
        Ok(v)
    };
    let in_axes = list(cx, "scan_input_axes", m)?;
    let in_dirs = list(cx, "scan_input_directions", m)?;
    let out_axes = list(cx, "scan_output_axes", k)?;
    let out_dirs = list(cx, "scan_output_directions", k)?;
    let mut axes = Vec::with_capacity(m);
    for (j, &a) in in_axes.iter().enumerate() {
        axes.push(scan_axis(cx, a, cx.ty(inputs[n + j]).rank())?);
    }
    let steps = cx.ty(inputs[n]).shape[axes[0]];
    for (j, &a) in axes.iter().enumerate() {
        if cx.ty(inputs[n + j]).shape[a] != steps {
            return Err(cx.err_in(
                n + j,
                format!(
                    "scans {} elements, the first scan input {steps}",
                    cx.ty(inputs[n + j]).shape[a]
                ),
            ));
        }
    }
    if steps == 0 {
        return Err(cx.err("a Scan of zero iterations is not supported"));
    }
    unroll_fits(cx, body, steps)?;
    let xs: Vec<Scanned> = (0..m)
        .map(|j| (inputs[n + j], axes[j], in_dirs[j] == 1))
        .collect();
    let (state, scanned) = scan_steps(cx, body, inputs[..n].to_vec(), &xs, steps, k)?;
    let mut results = state;
    for ((mut parts, &a), &dir) in scanned.into_iter().zip(&out_axes).zip(&out_dirs) {
        if dir == 1 {
            parts.reverse();
        }
        let rank = cx.ty(parts[0]).rank() + 1;
        let a = scan_axis(cx, a, rank)?;
        results.push(stack(cx, &parts, a)?);
    }
    Ok(results)
}

/// Scan-8: input 0 is the optional sequence_lens (all of them the full length here), every other input
/// has a batch axis first, and each batch element is scanned along its axis 1 (the batch dropped) by the
/// opset-9 rules; the results are stacked along the batch.
fn scan8(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let body = branch(cx, "body")?;
    let m = usize::try_from(cx.int("num_scan_inputs", -1)?)
        .ok()
        .filter(|&m| m >= 1 && m < cx.node.input.len())
        .ok_or_else(|| cx.err("num_scan_inputs must be between 1 and the number of inputs"))?;
    let inputs: Vec<Value> = (1..cx.node.input.len())
        .map(|i| cx.req(i))
        .collect::<Result<_>>()?;
    let n = inputs.len() - m;
    let dirs = cx.ints("directions")?.unwrap_or_else(|| vec![0; m]);
    if dirs.len() != m {
        return Err(cx.err(format!("directions has {} entries, not {m}", dirs.len())));
    }
    let batch = cx.ty(inputs[0]).shape.first().copied().unwrap_or(0);
    let steps = cx.ty(inputs[n]).shape.get(1).copied().unwrap_or(0);
    if let Some(lens) = cx.konst(0)? {
        if lens.to_i64_vec().iter().any(|&l| l != steps as i64) {
            return Err(cx.err_in(
                0,
                "sequence lengths shorter than the scan are not supported",
            ));
        }
    }
    for (i, &v) in inputs.iter().enumerate() {
        let shape = &cx.ty(v).shape;
        if shape.first() != Some(&batch) || (i >= n && shape.get(1) != Some(&steps)) {
            return Err(cx.err_in(
                i + 1,
                format!("{shape:?} does not have the batch {batch} (and the {steps} steps)"),
            ));
        }
    }
    if steps == 0 || batch == 0 {
        return Err(cx.err("a Scan of zero iterations is not supported"));
    }
    unroll_fits(cx, body, steps.saturating_mul(batch))?;
    let k = body.output.len().checked_sub(n).ok_or_else(|| {
        cx.err(format!(
            "the body has {} outputs, fewer than the {n} states",
            body.output.len()
        ))
    })?;
    let mut per_batch: Vec<Vec<Value>> = vec![Vec::with_capacity(batch); n + k];
    for b in 0..batch {
        let mut state = Vec::with_capacity(n);
        for &v in &inputs[..n] {
            state.push(take(cx, v, 0, b)?);
        }
        // Batch element b of each scan input, taken once; its time axis is then axis 0.
        let mut xs: Vec<Scanned> = Vec::with_capacity(m);
        for j in 0..m {
            xs.push((take(cx, inputs[n + j], 0, b)?, 0, dirs[j] == 1));
        }
        let (state, scanned) = scan_steps(cx, body, state, &xs, steps, k)?;
        for (slot, v) in per_batch.iter_mut().zip(state) {
            slot.push(v);
        }
        for (slot, parts) in per_batch[n..].iter_mut().zip(scanned) {
            slot.push(stack(cx, &parts, 0)?);
        }
    }
    per_batch.iter().map(|parts| stack(cx, parts, 0)).collect()
}

/// Loop: runs while the trip count `M` (if given) is not reached and the condition holds; both must be
/// known at compile time.
fn loop_(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let body = branch(cx, "body")?;
    let max = match cx.konst(0)? {
        Some(t) => Some(
            t.to_i64_vec()
                .first()
                .copied()
                .ok_or_else(|| cx.err_in(0, "the trip count must be a scalar"))?,
        ),
        None => None,
    };
    let mut cond = match cx.konst(1)? {
        Some(t) => t.to_f64_vec().first().is_some_and(|c| *c != 0.0),
        None => true,
    };
    let mut carried: Vec<Item> = (2..cx.node.input.len())
        .map(|i| {
            cx.item(i)?
                .ok_or_else(|| cx.err_in(i, "required input is missing"))
        })
        .collect::<Result<_>>()?;
    let n = carried.len();
    let k = body.output.len().checked_sub(n + 1).ok_or_else(|| {
        cx.err(format!(
            "the body has {} outputs, fewer than the condition and {n} loop-carried values",
            body.output.len()
        ))
    })?;
    let mut scanned: Vec<Vec<Value>> = vec![Vec::new(); k];
    let mut t = 0i64;
    while cond && max.is_none_or(|m| t < m) {
        let it = cx.konst_value(Tensor::scalar(t));
        let c = cx.konst_value(Tensor::scalar(true));
        let mut args = vec![Item::Tensor(it), Item::Tensor(c)];
        args.extend(carried.iter().cloned());
        let outs = call(cx, body, &args)?;
        let outs: Vec<(Item, &str)> = outs
            .into_iter()
            .zip(body.output.iter().map(|o| o.name.as_str()))
            .collect();
        let c = tensor(cx, outs[0].0.clone(), outs[0].1)?;
        cond = match cx.evaluate(c, &mut HashMap::new()) {
            Some(c) => c.to_f64_vec().first().is_some_and(|c| *c != 0.0),
            None => {
                return Err(cx.err(
                    "the body's condition depends on data: mlopt unrolls a Loop whose trip \
                     count is known at compile time",
                ))
            }
        };
        carried = outs[1..=n].iter().map(|o| o.0.clone()).collect();
        for (s, (o, name)) in scanned.iter_mut().zip(&outs[n + 1..]) {
            s.push(tensor(cx, o.clone(), name)?);
        }
        t += 1;
    }
    let mut results = carried;
    for parts in scanned {
        if parts.is_empty() {
            return Err(cx.err("a Loop of zero iterations with scan outputs is not supported"));
        }
        results.push(Item::Tensor(stack(cx, &parts, 0)?));
    }
    Ok(results)
}
