//! Writing the fused graph: each kernel of the fusion plan in execution order, recomputed nodes copied
//! into each kernel that computes them, and at a batch above 1 the first kernels a group of images at a
//! time (`crate::images`), each group's value types inferred again.

use super::{Fuser, KernelInfo, Plan};
use crate::error::Result;
use mlopt_cost::{estimate, Cost, Estimate, Work};
use mlopt_ir::{Graph, NodeId, Op, Value};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Builds the fused graph: kernels in execution order, recomputed nodes copied into each kernel that
/// computes them; at a batch above 1 the first kernels a group of images at a time (`images`).
pub(super) fn emit(f: &Fuser<'_>) -> Result<Plan> {
    let g = f.g;
    let mut e = Emitter {
        f,
        out: Graph::new(g.name.clone()),
        consts: HashMap::new(),
        infos: vec![],
        total: Cost::ZERO,
    };
    let mut global: HashMap<NodeId, Vec<Value>> = HashMap::new();
    for &n in g.graph_inputs() {
        global.insert(
            n,
            vec![e
                .out
                .add_input(g.node(n).name.clone(), g.node(n).outputs[0].clone())],
        );
    }
    let sched = f.schedule();
    let listed: Vec<(&BTreeSet<NodeId>, NodeId)> = sched
        .iter()
        .map(|&k| (&f.kernels[k].members, f.kernels[k].root))
        .collect();
    let (split, images, groups) = match crate::images::prefix(g, &listed, f.t) {
        Some(s) => (s.len, s.images, s.groups),
        None => (0, 1, 1),
    };
    if split > 0 {
        let prefix = &sched[..split];
        // The graph inputs the prefix reads (batch-major, as `images::prefix` checked).
        let sliced: Vec<NodeId> = g
            .graph_inputs()
            .iter()
            .copied()
            .filter(|n| {
                prefix.iter().any(|&k| {
                    f.kernels[k]
                        .members
                        .iter()
                        .any(|&m| g.inputs(m).into_iter().flatten().any(|v| v.node == *n))
                })
            })
            .collect();
        let mut parts: Vec<HashMap<NodeId, Vec<Value>>> = vec![];
        for b in 0..groups {
            // The group's slice of each graph input, a kernel of its own.
            let mut local: HashMap<NodeId, Vec<Value>> = HashMap::new();
            for &n in &sliced {
                let t = &g.node(n).outputs[0];
                let mut lens = t.shape.clone();
                lens[0] = images;
                let slice = Op::Slice {
                    starts: [vec![b * images], vec![0; lens.len() - 1]].concat(),
                    steps: vec![1; lens.len()],
                    lens,
                };
                let v = e.out.add_node(slice, "", &[Some(global[&n][0])], None)?;
                e.kernel(v[0].node, "slice");
                local.insert(n, v);
            }
            for &k in prefix {
                e.kernel_nodes(k, &mut local, true, groups as f64)?;
            }
            parts.push(local);
        }
        // What later kernels (and the outputs) read of the prefix: the groups joined.
        let inside: HashSet<NodeId> = prefix.iter().map(|&k| f.kernels[k].root).collect();
        let mut read: Vec<NodeId> = sched[split..]
            .iter()
            .flat_map(|&k| f.kernels[k].members.iter())
            .flat_map(|&m| g.inputs(m).into_iter().flatten().map(|v| v.node))
            .chain(g.graph_outputs().iter().map(|(_, v)| v.node))
            .filter(|n| inside.contains(n))
            .collect();
        read.sort_by_key(|n| f.pos[n]);
        read.dedup();
        for r in read {
            let joined: Vec<Option<Value>> = parts.iter().map(|i| Some(i[&r][0])).collect();
            let v = e.out.add_node(Op::Concat { axis: 0 }, "", &joined, None)?;
            e.kernel(v[0].node, "concat");
            global.insert(r, v);
        }
    }
    for &k in &sched[split..] {
        e.kernel_nodes(k, &mut global, false, 1.0)?;
    }
    let mut out = e.out;
    for (name, v) in g.graph_outputs() {
        let src = match global.get(&v.node) {
            Some(s) => s[v.output as usize],
            None => {
                let node = g.node(v.node);
                match &node.op {
                    Op::Const(t) => out.add_shared_const(node.name.clone(), Arc::clone(t)),
                    _ => {
                        return Err(crate::error::RewriteError::Internal(format!(
                            "output '{name}' was not computed"
                        )))
                    }
                }
            }
        };
        out.add_output(name.clone(), src);
    }
    mlopt_ir::verify::verify(&out)?;
    let mut infos = e.infos;
    for (k, guard) in mlopt_ir::demand::kernel_guards(&out)? {
        if let Some(info) = infos.get_mut(k as usize) {
            info.guard = mlopt_ir::demand::describe(&out, &guard);
        }
    }
    Ok(Plan {
        graph: out,
        kernels: infos,
        total: e.total,
        peak_bytes: f.peak(),
    })
}

/// `emit`'s state: the graph it writes, the constants it has added, and each kernel's figures.
struct Emitter<'f, 'g> {
    f: &'f Fuser<'g>,
    out: Graph,
    consts: HashMap<NodeId, Value>,
    infos: Vec<KernelInfo>,
    total: Cost,
}

impl Emitter<'_, '_> {
    /// Adds the fuser's kernel `k`, its operands found in `values` (where its nodes' values go too);
    /// with `infer`, its value types inferred again (an image's kernel at batch 1), its figures those
    /// of the whole kernel divided by `share`.
    fn kernel_nodes(
        &mut self,
        k: usize,
        values: &mut HashMap<NodeId, Vec<Value>>,
        infer: bool,
        share: f64,
    ) -> Result<()> {
        let (f, g) = (self.f, self.f.g);
        let kr = &f.kernels[k];
        let mut members: Vec<NodeId> = kr.members.iter().copied().collect();
        members.sort_by_key(|m| f.pos[m]);
        let kid = self.infos.len() as u32;
        let mut local: HashMap<NodeId, Vec<Value>> = HashMap::new();
        for &m in &members {
            let mut ins = vec![];
            for v in g.inputs(m) {
                let Some(v) = v else {
                    ins.push(None);
                    continue;
                };
                let src = if kr.members.contains(&v.node) {
                    local.get(&v.node).map(|s| s[v.output as usize])
                } else {
                    values.get(&v.node).map(|s| s[v.output as usize])
                };
                let src = match src {
                    Some(s) => s,
                    None => self.constant(v.node)?,
                };
                ins.push(Some(src));
            }
            let node = g.node(m);
            let vals = if infer {
                self.out.add_node(
                    node.op.clone(),
                    node.name.clone(),
                    &ins,
                    Some(node.outputs.len()),
                )?
            } else {
                self.out.add_typed(
                    node.op.clone(),
                    node.name.clone(),
                    &ins,
                    node.outputs.clone(),
                )
            };
            self.out.node_mut(vals[0].node).kernel = Some(kid);
            local.insert(m, vals);
        }
        values.insert(kr.root, local[&kr.root].clone());
        let view = f.is_view_kernel(&kr.members);
        let mut work = f.kernel_work(&kr.members, kr.root);
        work.vector_flops /= share;
        work.matrix_flops.iter_mut().for_each(|x| *x /= share);
        work.bytes /= share;
        let est = estimate(&work, f.t);
        let est = if view {
            Estimate {
                time: Cost::ZERO,
                ..est
            }
        } else {
            est
        };
        self.total = self.total + est.time;
        self.infos.push(KernelInfo {
            ops: members.iter().map(|m| g.node(*m).op.name()).collect(),
            work,
            estimate: est,
            view,
            root: g.node(kr.root).name.clone(),
            guard: Vec::new(),
        });
        Ok(())
    }

    /// The constant node `n` of the input graph in the output graph, added where first read.
    fn constant(&mut self, n: NodeId) -> Result<Value> {
        if let Some(v) = self.consts.get(&n) {
            return Ok(*v);
        }
        let node = self.f.g.node(n);
        let Op::Const(t) = &node.op else {
            return Err(crate::error::RewriteError::Internal(format!(
                "value of '{}' read before it is computed",
                node.name
            )));
        };
        let c = self.out.add_shared_const(node.name.clone(), Arc::clone(t));
        self.consts.insert(n, c);
        Ok(c)
    }

    /// A kernel of one node that only moves data (an image's slice of an input, the images joined).
    fn kernel(&mut self, n: NodeId, op: &'static str) {
        self.out.node_mut(n).kernel = Some(self.infos.len() as u32);
        let work = Work {
            bytes: 2.0 * self.out.node(n).outputs[0].bytes() as f64,
            ..Work::default()
        };
        let est = estimate(&work, self.f.t);
        self.total = self.total + est.time;
        self.infos.push(KernelInfo {
            ops: vec![op],
            work,
            estimate: est,
            view: false,
            root: String::new(),
            guard: Vec::new(),
        });
    }
}
