//! Control flow. An `If` whose condition is known at compile time (an initializer, a value folded from
//! static shapes, or an input pinned to a value) becomes the branch it takes: the branch's initializers
//! are constants, its nodes are converted in the enclosing graph's scope (they read outer values by
//! name) and its outputs are the `If`'s. A condition known only at run time is an error naming it.

use super::{convert_scoped, NodeCx};
use crate::error::Result;
use crate::proto::{attribute_type as at, GraphProto};
use crate::tensor_io::tensor_from_proto;
use mlopt_ir::Value;

pub(super) const OPS: &[&str] = &["If"];

pub(super) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    match op {
        "If" => Some(if_(cx)),
        _ => None,
    }
}

fn if_(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let cond = cx.konst(0).map_err(|_| {
        cx.err_in(
            0,
            "the condition is known only at run time: mlopt compiles an If whose condition is a \
             constant (an initializer, a value of static shapes, or an input given a value)",
        )
    })?;
    let cond = cond.ok_or_else(|| cx.err_in(0, "required input is missing"))?;
    let taken = match cond.to_f64_vec()[..] {
        [c] => c != 0.0,
        _ => {
            return Err(cx.err_in(
                0,
                format!("the condition holds {} values, not one", cond.numel()),
            ))
        }
    };
    let (then_branch, else_branch) = (branch(cx, "then_branch")?, branch(cx, "else_branch")?);
    inline(cx, if taken { then_branch } else { else_branch })
}

/// The graph attribute `name`, which an `If` requires.
fn branch<'a>(cx: &mut NodeCx<'a, '_>, name: &'a str) -> Result<&'a GraphProto> {
    cx.attr(name, &[at::GRAPH])?
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| cx.err(format!("attribute '{name}' (a graph) is required")))
}

/// The outputs of `g` converted in the node's scope (see the module's comment).
fn inline(cx: &mut NodeCx<'_, '_>, g: &GraphProto) -> Result<Vec<Value>> {
    if g.output.len() != cx.node.output.len() {
        return Err(cx.err(format!(
            "the branch '{}' has {} outputs, the node {}",
            g.name,
            g.output.len(),
            cx.node.output.len()
        )));
    }
    if let Some(s) = g.sparse_initializer.first() {
        let n = s.values.as_ref().map_or("", |v| v.name.as_str());
        return Err(cx.err(format!(
            "sparse initializer '{n}' in a branch is not supported"
        )));
    }
    for t in &g.initializer {
        if cx.imp.vals.contains_key(&t.name) {
            return Err(cx.err(format!(
                "the branch's initializer '{}' shadows a value of an enclosing graph",
                t.name
            )));
        }
        let tensor = tensor_from_proto(t, cx.imp.base)?;
        let v = cx.imp.g.add_const(t.name.clone(), tensor);
        cx.imp.vals.insert(t.name.clone(), v);
    }
    for node in &g.node {
        convert_scoped(cx.imp, node)?;
    }
    g.output
        .iter()
        .map(|o| {
            cx.imp.vals.get(&o.name).copied().ok_or_else(|| {
                cx.err(format!(
                    "the branch's output '{}' is not produced by any node",
                    o.name
                ))
            })
        })
        .collect()
}
