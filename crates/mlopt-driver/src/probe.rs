//! `mlopt check --per-node`: where the optimised or compiled model first leaves the interpreter.
//!
//! With `Options::probe`, the optimize stage makes every value a kernel writes to memory (each kernel
//! root's outputs) an extra output of the model, after fusion, so the kernels are the ones the plain
//! build has. `per_node` then evaluates the imported graph with the interpreter, keeping every node's
//! value, and walks the probes in kernel order: a probe whose node has a node of the same name (the
//! ONNX node it computes; rewrites name what they make after the node whose value it replaces) and
//! type in the imported graph is compared with it by the `check` rule (a value a precision rewrite
//! cast is its source's, converted back), and the first one out of tolerance is reported with both
//! values. Values a rewrite made that no ONNX node has (a folded
//! constant's product, a layout copy) are counted, not compared.

use crate::compare::{compare, Comparison, Rule};
use crate::error::Result;
use mlopt_ir::{interp, Graph, NodeId, Op, Tensor, Value};
use std::collections::{HashMap, HashSet};

/// Adds each kernel root's outputs that are not outputs already to `g`'s outputs, in kernel order
/// (named `<node>` or `<node>:<k>` for its output k).
pub fn add_kernel_outputs(g: &mut Graph) {
    let mut seen: HashSet<Value> = g.graph_outputs().iter().map(|(_, v)| *v).collect();
    let mut added = Vec::new();
    for (_, k) in g.kernels() {
        for root in k.roots {
            for o in 0..g.node(root).outputs.len() {
                let v = Value {
                    node: root,
                    output: o as u32,
                };
                if seen.insert(v) {
                    added.push(v);
                }
            }
        }
    }
    for v in added {
        let name = value_name(g, v);
        g.add_output(name, v);
    }
}

fn value_name(g: &Graph, v: Value) -> String {
    let n = &g.node(v.node).name;
    match v.output {
        0 => n.clone(),
        k => format!("{n}:{k}"),
    }
}

/// What `per_node` found.
#[derive(Debug)]
pub struct PerNode {
    /// Kernel outputs compared with their ONNX node's value.
    pub compared: usize,
    /// Kernel outputs with no node of that name and type in the imported graph (made by a rewrite).
    pub unmatched: usize,
    /// The first compared value out of tolerance: its node's name, op and kernel, and the comparison
    /// (which shows the first differing element's two values).
    pub first_bad: Option<Mismatch>,
}

#[derive(Debug)]
pub struct Mismatch {
    pub node: String,
    pub op: &'static str,
    pub kernel: u32,
    pub comparison: Comparison,
}

/// Compares the probe values `outs[first_probe..]` of `fused` (the optimised graph with
/// `add_kernel_outputs`'s outputs, as the optimised or compiled model returned them in its output
/// order) with the interpreter's values of the same nodes of `imported` on `inputs`.
pub fn per_node(
    imported: &Graph,
    fused: &Graph,
    first_probe: usize,
    outs: &[(String, Tensor)],
    inputs: &HashMap<String, Tensor>,
    rule: Rule,
) -> Result<PerNode> {
    // Every op node's values, as outputs of a copy of the imported graph.
    // An ONNX node the importer wrote as several IR nodes names them all; its value is the last one's
    // (`at`), and a kernel that ends inside the decomposition matches the node of its own op (`at_op`).
    let mut traced = imported.clone();
    let mut at: HashMap<(&str, u32), (usize, NodeId)> = HashMap::new();
    let mut at_op: HashMap<(&str, u32, &str), (usize, NodeId)> = HashMap::new();
    let base = traced.graph_outputs().len();
    let mut count = 0;
    for n in imported.topo_order()? {
        let node = imported.node(n);
        if matches!(node.op, Op::Input | Op::Const(_)) {
            continue;
        }
        for o in 0..node.outputs.len() as u32 {
            at.insert((node.name.as_str(), o), (base + count, n));
            at_op.insert((node.name.as_str(), o, node.op.name()), (base + count, n));
            traced.add_output(format!("trace{count}"), Value { node: n, output: o });
            count += 1;
        }
    }
    let want = interp::run(&traced, inputs)?;
    let mut report = PerNode {
        compared: 0,
        unmatched: 0,
        first_bad: None,
    };
    for ((_, v), (_, got)) in fused.graph_outputs().iter().zip(outs).skip(first_probe) {
        let node = fused.node(v.node);
        // A value a precision rewrite cast (to bf16, say) is its source node's value, rounded.
        let mut source = *v;
        while !at.contains_key(&(fused.node(source.node).name.as_str(), source.output)) {
            match (
                &fused.node(source.node).op,
                fused.inputs(source.node).first(),
            ) {
                (Op::Cast { .. }, Some(Some(x))) => source = *x,
                _ => break,
            }
        }
        let (name, op) = (
            fused.node(source.node).name.as_str(),
            fused.node(source.node).op.name(),
        );
        let found = at_op
            .get(&(name, source.output, op))
            .or_else(|| at.get(&(name, source.output)));
        let Some(&(i, n)) = found else {
            report.unmatched += 1;
            continue;
        };
        let expected = &want[i].1;
        let floats = got.dtype().is_float() && expected.dtype().is_float();
        let got = match got.dtype() != expected.dtype() && floats {
            true => got.cast(expected.dtype()),
            false => got.clone(),
        };
        if expected.ty() != got.ty() {
            report.unmatched += 1;
            continue;
        }
        report.compared += 1;
        let c = compare(&got, expected, rule);
        if !c.pass && report.first_bad.is_none() {
            report.first_bad = Some(Mismatch {
                node: value_name(fused, source),
                op: imported.node(n).op.name(),
                kernel: node.kernel.unwrap_or_default(),
                comparison: c,
            });
        }
    }
    Ok(report)
}
