//! Graph IR -> e-graph and back. The graph is a DAG with shared subexpressions and several outputs; in the
//! e-graph shared values are simply shared classes, and the outputs are a list of root classes.

use crate::error::{Result, RewriteError};
use crate::lang::{Analysis, EGraph, Head, MNode};
use egg::Id;
use mlopt_ir::{Graph, NodeId, Op, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// A graph in an e-graph: the e-graph, its output classes, and the original node names by class.
#[derive(Debug)]
pub struct Loaded {
    pub eg: EGraph,
    pub roots: Vec<(String, Id)>,
    pub names: HashMap<Id, String>,
    pub graph_name: String,
}

/// Loads `g` into a fresh e-graph. `fold` turns constant folding on.
pub fn load(g: &Graph, fold: bool) -> Result<Loaded> {
    let mut eg = EGraph::new(Analysis {
        no_fold: !fold,
        ..Default::default()
    });
    let mut ids: HashMap<Value, Id> = HashMap::new();
    let mut names = HashMap::new();
    let order = g.topo_order()?;
    for n in order {
        let node = g.node(n);
        let id = match &node.op {
            Op::Input => {
                let i = eg.analysis.inputs.len() as u32;
                eg.analysis
                    .inputs
                    .push((node.name.clone(), node.outputs[0].clone()));
                eg.add(MNode {
                    head: Head::Input(i),
                    children: vec![],
                })
            }
            Op::Const(t) => Analysis::add_const(&mut eg, node.name.clone(), Arc::clone(t)),
            op => {
                let children: Vec<Id> = g
                    .inputs(n)
                    .into_iter()
                    .map(|v| match v {
                        Some(v) => ids.get(&v).copied().ok_or_else(|| {
                            RewriteError::Internal(format!("input of {} not loaded", node.name))
                        }),
                        None => Ok(eg.add(MNode::absent())),
                    })
                    .collect::<Result<_>>()?;
                let id = eg.add(MNode::op(op.clone(), children));
                if eg[id].data.types.len() < node.outputs.len() {
                    return Err(RewriteError::Internal(format!(
                        "node '{}' ({}): the e-graph could not type it",
                        node.name,
                        op.name()
                    )));
                }
                id
            }
        };
        // Every op class gets a name: `auto` precision backs ops off by name.
        names.entry(id).or_insert_with(|| {
            if node.name.is_empty() && !matches!(node.op, Op::Input | Op::Const(_)) {
                format!("node{}", n.index())
            } else {
                node.name.clone()
            }
        });
        // Ops whose trailing outputs the importer dropped (MaxPool's indices) still infer them here.
        if eg[id].data.types.len() > 1 {
            for i in 0..node.outputs.len() {
                let p = eg.add(MNode::proj(i, id));
                ids.insert(
                    Value {
                        node: n,
                        output: i as u32,
                    },
                    p,
                );
            }
        } else {
            ids.insert(Value { node: n, output: 0 }, id);
        }
    }
    eg.rebuild();
    let roots = g
        .graph_outputs()
        .iter()
        .map(|(name, v)| (name.clone(), eg.find(ids[v])))
        .collect();
    Ok(Loaded {
        eg,
        roots,
        names,
        graph_name: g.name.clone(),
    })
}

/// Builds the graph that `choice` (one e-node per needed class) picks out of `l`.
pub fn build(l: &Loaded, choice: &HashMap<Id, MNode>) -> Result<Graph> {
    let eg = &l.eg;
    let mut g = Graph::new(l.graph_name.clone());
    // Classes that merged keep the name of the one loaded first (a HashMap's order differs per run,
    // and the dumps, the report and `auto`'s back-offs name nodes by it).
    let mut loaded: Vec<(&Id, &String)> = l.names.iter().collect();
    loaded.sort_unstable_by_key(|(id, _)| **id);
    let mut names: HashMap<Id, &String> = HashMap::new();
    for (id, n) in loaded {
        names.entry(eg.find(*id)).or_insert(n);
    }
    // Graph inputs keep their order, used or not.
    let mut made: HashMap<Id, Vec<Value>> = HashMap::new();
    let mut inputs = vec![];
    for (name, ty) in &eg.analysis.inputs {
        inputs.push(g.add_input(name.clone(), ty.clone()));
    }
    // How many outputs of each multi-output class are read: trailing unread ones are not computed.
    let mut width: HashMap<Id, usize> = HashMap::new();
    for n in choice.values() {
        if let Head::Proj(i) = n.head {
            let w = width.entry(eg.find(n.children[0])).or_insert(1);
            *w = (*w).max(i as usize + 1);
        }
    }
    let mut unnamed = vec![];
    // Iterative post-order over the chosen DAG.
    let mut stack: Vec<(Id, bool)> = l
        .roots
        .iter()
        .rev()
        .map(|(_, r)| (eg.find(*r), false))
        .collect();
    while let Some((id, expanded)) = stack.pop() {
        if made.contains_key(&id) {
            continue;
        }
        let node = choice
            .get(&id)
            .ok_or_else(|| RewriteError::Internal(format!("class {id} has no chosen node")))?;
        if !expanded {
            stack.push((id, true));
            for c in node.children.iter().rev() {
                let c = eg.find(*c);
                if !made.contains_key(&c) {
                    stack.push((c, false));
                }
            }
            continue;
        }
        let child =
            |c: &Id| -> Option<Value> { made.get(&eg.find(*c)).and_then(|v| v.first().copied()) };
        let vals = match &node.head {
            Head::Input(i) => vec![inputs[*i as usize]],
            Head::Const(i) => {
                let (name, t) = &eg.analysis.consts[*i as usize];
                let name = if name.is_empty() {
                    names.get(&id).map(|s| s.to_string()).unwrap_or_default()
                } else {
                    name.clone()
                };
                let v = g.add_shared_const(name.clone(), Arc::clone(t));
                if name.is_empty() {
                    unnamed.push(v.node);
                }
                vec![v]
            }
            Head::Absent => vec![],
            Head::Proj(i) => {
                let c = eg.find(node.children[0]);
                let v = made.get(&c).and_then(|v| v.get(*i as usize)).copied();
                vec![v.ok_or_else(|| {
                    RewriteError::Internal(format!("projection {i} of class {c} missing"))
                })?]
            }
            Head::Op(k) => {
                let ins: Vec<Option<Value>> = node
                    .children
                    .iter()
                    .map(|c| {
                        if eg[*c].data.types.is_empty() {
                            None
                        } else {
                            child(c)
                        }
                    })
                    .collect();
                let name = names.get(&id).map(|s| s.to_string()).unwrap_or_default();
                let mut types = eg[id].data.types.clone();
                types.truncate(width.get(&id).copied().unwrap_or(1));
                g.add_typed(k.op.clone(), name, &ins, types)
            }
        };
        made.insert(id, vals);
    }
    for (name, r) in &l.roots {
        let v = made
            .get(&eg.find(*r))
            .and_then(|v| v.first().copied())
            .ok_or_else(|| RewriteError::Internal(format!("output {name} not built")))?;
        g.add_output(name.clone(), v);
    }
    // Constants made by folding are named after where they are used (`conv1.in1`: input 1 of conv1).
    for n in unnamed {
        if let Some((user, e)) = g
            .users(n)
            .into_iter()
            .find(|(u, _)| !g.node(*u).name.is_empty())
        {
            g.node_mut(n).name = format!("{}.in{}", g.node(user).name, e.input);
        }
    }
    // Constants keep their original names; two classes folded to the same constant may repeat one.
    dedup_const_names(&mut g);
    mlopt_ir::verify::verify(&g)?;
    Ok(g)
}

/// Renames constants whose names repeat (`w`, `w.1`, ...) so that every constant is addressable by name.
fn dedup_const_names(g: &mut Graph) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let ids: Vec<NodeId> = g.node_ids().collect();
    for n in ids {
        if !matches!(g.node(n).op, Op::Const(_)) {
            continue;
        }
        let name = g.node(n).name.clone();
        let k = seen.entry(name.clone()).or_insert(0);
        if *k > 0 {
            g.node_mut(n).name = format!("{name}.{k}");
        }
        *k += 1;
    }
}
