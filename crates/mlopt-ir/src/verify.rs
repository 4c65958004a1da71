//! The verifier: checks every node and reports all problems, each with its node, instead of stopping at
//! the first. Every stage runs it on its output.

use crate::error::{IrError, Result};
use crate::graph::Graph;
use crate::infer::{infer, IndexBounds};
use crate::op::Op;

/// Checks arity, input presence, recorded types against inference, constants against their data, graph
/// outputs, and acyclicity.
pub fn verify(g: &Graph) -> Result<()> {
    let mut errs = vec![];
    if g.topo_order().is_err() {
        errs.push("the graph has a cycle".to_string());
    }
    for n in g.node_ids() {
        let node = g.node(n);
        let at = format!("node {n} '{}' ({})", node.name, node.op.name());
        match &node.op {
            Op::Input => {
                if !g.graph_inputs().contains(&n) {
                    errs.push(format!("{at}: input node is not a graph input"));
                }
                if node.outputs.len() != 1 {
                    errs.push(format!("{at}: inputs have exactly one output"));
                }
            }
            Op::Const(t) => {
                if node.outputs.len() != 1 || node.outputs[0] != t.ty() {
                    errs.push(format!(
                        "{at}: declared {:?} but the data is {}",
                        node.outputs,
                        t.ty()
                    ));
                }
            }
            op => {
                let ins = g.inputs(n);
                let mut ok = true;
                for (i, v) in ins.iter().enumerate() {
                    if let Some(v) = v {
                        if !g.contains(v.node) || v.output as usize >= g.node(v.node).outputs.len()
                        {
                            errs.push(format!("{at}: input {i} refers to a missing value"));
                            ok = false;
                        }
                    }
                }
                if !ok {
                    continue;
                }
                // Constant indices out of range make an invalid model, rejected here rather than at run time.
                if let (Some(bounds), [Some(_), Some(ind), ..]) = (
                    g.input_types(n)
                        .first()
                        .copied()
                        .flatten()
                        .and_then(|d| IndexBounds::of(op, d)),
                    ins.as_slice(),
                ) {
                    if let Op::Const(t) = &g.node(ind.node).op {
                        let last = t.shape().last().copied().unwrap_or(1);
                        if let Some((v, d)) = bounds.first_bad(&t.to_i64_vec(), last) {
                            errs.push(format!(
                                "{at}, input 1: index {v} out of range for axis of size {d}"
                            ));
                        }
                    }
                }
                match infer(op, &g.input_types(n)) {
                    Err(e) => errs.push(format!(
                        "{at}{}: {}",
                        e.input.map(|i| format!(", input {i}")).unwrap_or_default(),
                        e.msg
                    )),
                    Ok(inferred) => {
                        let k = node.outputs.len();
                        if k == 0 || k > inferred.len() || node.outputs[..] != inferred[..k] {
                            let want: Vec<String> =
                                inferred.iter().map(|t| t.to_string()).collect();
                            let got: Vec<String> =
                                node.outputs.iter().map(|t| t.to_string()).collect();
                            errs.push(format!(
                                "{at}: declared ({}) but inferred ({})",
                                got.join(", "),
                                want.join(", ")
                            ));
                        }
                    }
                }
            }
        }
    }
    for (name, v) in g.graph_outputs() {
        if !g.contains(v.node) || v.output as usize >= g.node(v.node).outputs.len() {
            errs.push(format!("output '{name}' refers to a missing value"));
        }
    }
    verify_kernels(g, &mut errs);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(IrError::Verify(errs))
    }
}

/// Kernels (fusion groups): inputs and constants belong to none, and each kernel has exactly one root, the
/// only member whose values are read outside the kernel or returned.
fn verify_kernels(g: &Graph, errs: &mut Vec<String>) {
    for (k, kn) in g.kernels() {
        for &n in &kn.members {
            let node = g.node(n);
            if matches!(node.op, Op::Input | Op::Const(_)) {
                errs.push(format!(
                    "node {n} '{}': inputs and constants belong to no kernel",
                    node.name
                ));
            }
        }
        if kn.roots.len() != 1 {
            let r: Vec<String> = kn.roots.iter().map(|n| n.to_string()).collect();
            errs.push(format!(
                "kernel k{k} has {} roots ({}); a kernel writes exactly one node's values",
                r.len(),
                r.join(", ")
            ));
        }
    }
}
