//! Fusion: partitions the extracted graph into kernels (fusion groups), deciding for every value whether it
//! is stored to memory or computed inside the kernels that read it, by the roofline cost of both.
//!
//! A kernel is a tree of ops under one root whose leaves are stored values (kernel outputs, inputs,
//! constants). What a kernel may hold:
//! - any number of elementwise ops, reshapes (views) and injective layout ops (Transpose, Slice, Expand,
//!   Tile, Pad, Concat, Depth/SpaceToDepth, Trilu: each output element reads one input element at an index
//!   computed from its own, TVM's "injective" class);
//! - at most one "heavy" op (MatMul, Gemm, Conv, pooling, layout ops ...) whose operands are all stored and
//!   which may be followed by elementwise ops only: its epilogue (bias, activation, residual);
//! - or reductions over one common row (same input shape and axes: Softmax, LayerNormalization, a mean and a
//!   variance) with elementwise prologue and epilogue.
//!
//! Values are visited from the outputs back. First each value read by a single kernel is offered to it
//! (fusion), so kernels grow down to the values that several kernels read. Then each such kernel is offered
//! whole to all its readers (recomputation: each reader gets its own copy), which only elementwise trees
//! may do. Either is taken when the summed estimate of the kernels involved goes down: recomputing trades
//! extra FLOPs for the stored value's write and reads. `memory_budget` then forces further
//! recomputation of the largest stored elementwise values while the plan's peak activation memory exceeds it.

use crate::error::Result;
use mlopt_cost::{estimate, op_work_on, standalone, Cost, Estimate, Work};
use mlopt_ir::{Graph, NodeId, Op, Value};
use mlopt_target::Target;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Reshapes are views: free to compute inside any kernel, and free to "store".
pub fn is_view(op: &Op) -> bool {
    matches!(op, Op::Reshape { .. })
}

/// The row a reduction works on: its input shape and the axes it reduces.
type Row = (Vec<usize>, Vec<usize>);

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Elementwise,
    View,
    /// Layout ops that move elements without arithmetic (TVM's "injective"): each output element reads
    /// one input element at an index computed from its own, so they fuse like elementwise ops.
    Injective,
    Heavy,
    Reduction(Row),
    /// Leaves and multi-output ops: never inside another kernel.
    Opaque,
}

fn kind(g: &Graph, n: NodeId) -> Kind {
    let node = g.node(n);
    let shape = || {
        g.inputs(n)
            .first()
            .copied()
            .flatten()
            .map(|v| g.value_type(v).shape.clone())
            .unwrap_or_default()
    };
    if node.outputs.len() != 1 {
        return Kind::Opaque;
    }
    match &node.op {
        Op::Input | Op::Const(_) => Kind::Opaque,
        op if is_view(op) => Kind::View,
        op if op.is_elementwise() => Kind::Elementwise,
        Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Expand { .. }
        | Op::Tile { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::DepthToSpace { .. }
        | Op::SpaceToDepth { .. }
        | Op::Trilu { .. } => Kind::Injective,
        Op::Reduce { axes, .. } => Kind::Reduction((shape(), axes.clone())),
        Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Arg { axis, .. } => {
            Kind::Reduction((shape(), vec![*axis]))
        }
        Op::LayerNorm { axis, .. } => {
            let s = shape();
            let r = s.len();
            Kind::Reduction((s, (*axis..r).collect()))
        }
        Op::InstanceNorm { .. } | Op::GlobalAveragePool | Op::GlobalMaxPool => {
            let s = shape();
            let r = s.len();
            Kind::Reduction((s, (2..r).collect()))
        }
        _ => Kind::Heavy,
    }
}

/// Whether node `n` can compute an operand inside its own kernel (rather than read it from memory).
pub fn inlines_operands(g: &Graph, n: NodeId) -> bool {
    accepts_inlined(&kind(g, n))
}

/// Whether `consumer` can compute an operand inside its own kernel (rather than read it from memory).
fn accepts_inlined(k: &Kind) -> bool {
    matches!(
        k,
        Kind::Elementwise | Kind::View | Kind::Injective | Kind::Reduction(_)
    )
}

#[derive(Debug, Clone)]
struct Kernel {
    root: NodeId,
    members: BTreeSet<NodeId>,
    heavy: bool,
    row: Option<Row>,
    alive: bool,
}

/// One kernel of the plan, for the report and the printed header.
#[derive(Debug, Clone)]
pub struct KernelInfo {
    pub ops: Vec<&'static str>,
    pub work: Work,
    pub estimate: Estimate,
    /// A kernel made only of views: no code, its output aliases its input.
    pub view: bool,
    /// The name of the root node.
    pub root: String,
}

/// The fused graph (every op node carries its kernel id) and the plan's figures.
#[derive(Debug, Clone)]
pub struct Plan {
    pub graph: Graph,
    pub kernels: Vec<KernelInfo>,
    pub total: Cost,
    /// The most activation memory alive at once (inputs and weights excluded), in bytes.
    pub peak_bytes: u64,
}

struct Fuser<'a> {
    g: &'a Graph,
    t: &'a Target,
    kinds: HashMap<NodeId, Kind>,
    work: HashMap<NodeId, Work>,
    kernels: Vec<Kernel>,
    /// The kernels a node is computed in (several when recomputed).
    homes: HashMap<NodeId, Vec<usize>>,
    outputs: HashSet<NodeId>,
    /// Each node's place in the topological order.
    pos: HashMap<NodeId, usize>,
}

impl Fuser<'_> {
    fn kernel_work(&self, members: &BTreeSet<NodeId>, root: NodeId) -> Work {
        let mut w = Work::default();
        let mut ext: BTreeSet<Value> = BTreeSet::new();
        for m in members {
            w.add(&self.work[m]);
            ext.extend(
                self.g
                    .inputs(*m)
                    .into_iter()
                    .flatten()
                    .filter(|v| !members.contains(&v.node)),
            );
        }
        w.bytes = ext
            .iter()
            .map(|v| self.g.value_type(*v).bytes() as f64)
            .sum::<f64>()
            + self
                .g
                .node(root)
                .outputs
                .iter()
                .map(|t| t.bytes() as f64)
                .sum::<f64>();
        w
    }

    fn is_view_kernel(&self, members: &BTreeSet<NodeId>) -> bool {
        members.iter().all(|m| self.kinds[m] == Kind::View)
    }

    fn cost(&self, members: &BTreeSet<NodeId>, root: NodeId) -> Cost {
        if self.is_view_kernel(members) {
            return Cost::ZERO;
        }
        estimate(&self.kernel_work(members, root), self.t).time
    }

    /// The kernels that read `p`'s value, or `None` if some reader cannot take it inlined.
    fn readers(&self, p: NodeId) -> Option<Vec<usize>> {
        if self.outputs.contains(&p) {
            return None;
        }
        let mut ks = BTreeSet::new();
        for (u, _) in self.g.users(p) {
            if !accepts_inlined(&self.kinds[&u]) {
                return None;
            }
            ks.extend(self.homes.get(&u)?.iter().copied());
        }
        (!ks.is_empty()).then(|| ks.into_iter().collect())
    }

    /// Whether kernel `pk` (rooted at `p`) may be computed inside each of `into`.
    fn legal(&self, pk: usize, into: &[usize]) -> bool {
        let p = &self.kernels[pk];
        let pure = !p.heavy && p.row.is_none();
        if into.len() > 1 && !pure {
            return false;
        }
        into.iter().all(|&k| {
            let k = &self.kernels[k];
            if p.heavy && (k.heavy || k.row.is_some()) || k.heavy && p.row.is_some() {
                return false;
            }
            match (&p.row, &k.row) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
        })
    }

    /// The change in total cost if kernel `pk` is computed inside `into`.
    fn delta(&self, pk: usize, into: &[usize]) -> f64 {
        let p = &self.kernels[pk];
        let mut d = -self.cost(&p.members, p.root).as_secs();
        for &k in into {
            let k = &self.kernels[k];
            let merged: BTreeSet<NodeId> = k.members.union(&p.members).copied().collect();
            d += self.cost(&merged, k.root).as_secs() - self.cost(&k.members, k.root).as_secs();
        }
        d
    }

    fn inline(&mut self, pk: usize, into: &[usize]) {
        let p = self.kernels[pk].clone();
        for &k in into {
            let k = &mut self.kernels[k];
            k.members.extend(p.members.iter().copied());
            k.heavy |= p.heavy;
            if k.row.is_none() {
                k.row = p.row.clone();
            }
        }
        for m in &p.members {
            let homes = self.homes.entry(*m).or_default();
            homes.retain(|h| *h != pk);
            homes.extend(into.iter().copied());
            homes.sort_unstable();
            homes.dedup();
        }
        self.kernels[pk].alive = false;
    }

    /// The kernel rooted at `n`, if `n` is a root.
    fn own_kernel(&self, n: NodeId) -> Option<usize> {
        if self.kinds[&n] == Kind::Opaque {
            return None;
        }
        let pk = *self.homes.get(&n)?.first()?;
        (self.kernels[pk].root == n && self.kernels[pk].alive).then_some(pk)
    }

    /// Tries to compute kernel `pk` inside its readers when that lowers the estimate (or, with one reader,
    /// keeps it equal: one kernel fewer for nothing); `force` takes it even when it costs more.
    fn try_inline(&mut self, pk: usize, force: bool) -> bool {
        let Some(into) = self.readers(self.kernels[pk].root) else {
            return false;
        };
        if !self.legal(pk, &into) {
            return false;
        }
        let slack = if into.len() == 1 { 1e-15 } else { -1e-15 };
        if !force && self.delta(pk, &into) >= slack {
            return false;
        }
        self.inline(pk, &into);
        true
    }

    /// Live kernels in execution order (by their root's place in the topological order).
    fn schedule(&self) -> Vec<usize> {
        let mut ks: Vec<usize> = (0..self.kernels.len())
            .filter(|k| self.kernels[*k].alive)
            .collect();
        ks.sort_by_key(|k| self.pos[&self.kernels[*k].root]);
        ks
    }

    /// Peak bytes of stored values alive at once, running the kernels in `schedule` order.
    fn peak(&self) -> u64 {
        let sched = self.schedule();
        let step: HashMap<usize, usize> = sched.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let mut last_use: HashMap<NodeId, usize> = HashMap::new();
        for (i, &k) in sched.iter().enumerate() {
            for m in &self.kernels[k].members {
                for v in self.g.inputs(*m).into_iter().flatten() {
                    if !self.kernels[k].members.contains(&v.node) {
                        // Reading a view reads the buffer it aliases, which must stay alive as long.
                        let mut n = v.node;
                        loop {
                            let e = last_use.entry(n).or_insert(i);
                            *e = (*e).max(i);
                            match self.own_kernel(n) {
                                Some(vk) if self.is_view_kernel(&self.kernels[vk].members) => {
                                    match self.g.inputs(n).first().copied().flatten() {
                                        Some(src) => n = src.node,
                                        None => break,
                                    }
                                }
                                _ => break,
                            }
                        }
                    }
                }
            }
        }
        let mut peak = 0u64;
        for i in 0..sched.len() {
            let alive: u64 = sched
                .iter()
                .filter(|k| {
                    let kr = &self.kernels[**k];
                    let s = step[*k];
                    !self.is_view_kernel(&kr.members)
                        && s <= i
                        && (last_use.get(&kr.root).is_some_and(|l| *l >= i)
                            || self.outputs.contains(&kr.root)
                            || s == i)
                })
                .map(|k| {
                    self.g
                        .node(self.kernels[*k].root)
                        .outputs
                        .iter()
                        .map(|t| t.bytes() as u64)
                        .sum::<u64>()
                })
                .sum();
            peak = peak.max(alive);
        }
        peak
    }
}

/// Partitions `g` into kernels for target `t`; see the module comment.
pub fn fuse(g: &Graph, t: &Target, allow_tf32: bool, memory_budget: Option<u64>) -> Result<Plan> {
    let order = g.topo_order()?;
    let mut f = Fuser {
        g,
        t,
        kinds: HashMap::new(),
        work: HashMap::new(),
        kernels: vec![],
        homes: HashMap::new(),
        outputs: g.graph_outputs().iter().map(|(_, v)| v.node).collect(),
        pos: order.iter().enumerate().map(|(i, n)| (*n, i)).collect(),
    };
    for &n in &order {
        let k = kind(g, n);
        let node = g.node(n);
        f.work.insert(
            n,
            op_work_on(&node.op, &g.input_types(n), &node.outputs, t, allow_tf32),
        );
        if !matches!(node.op, Op::Input | Op::Const(_)) {
            let heavy = k == Kind::Heavy || k == Kind::Opaque;
            let row = match &k {
                Kind::Reduction(r) => Some(r.clone()),
                _ => None,
            };
            f.homes.insert(n, vec![f.kernels.len()]);
            f.kernels.push(Kernel {
                root: n,
                members: BTreeSet::from([n]),
                heavy,
                row,
                alive: true,
            });
        }
        f.kinds.insert(n, k);
    }
    // Fusion first, consumers before producers: a value read by one kernel joins it when that is cheaper,
    // so each kernel grows down to the values several kernels read.
    for &n in order.iter().rev() {
        if let Some(pk) = f.own_kernel(n) {
            if f.readers(n).is_some_and(|r| r.len() == 1) {
                f.try_inline(pk, false);
            }
        }
    }
    // Then recomputation, whole producer kernels at a time, until nothing improves.
    loop {
        let before = f.kernels.iter().filter(|k| k.alive).count();
        for k in f.schedule().into_iter().rev() {
            f.try_inline(k, false);
        }
        if f.kernels.iter().filter(|k| k.alive).count() == before {
            break;
        }
    }
    if let Some(budget) = memory_budget {
        while f.peak() > budget {
            // The largest stored elementwise value that its readers can recompute.
            let mut cands: Vec<usize> = f
                .schedule()
                .into_iter()
                .filter(|&k| {
                    !f.kernels[k].heavy
                        && f.kernels[k].row.is_none()
                        && !f.is_view_kernel(&f.kernels[k].members)
                })
                .collect();
            cands.sort_by_key(|&k| std::cmp::Reverse(g.node(f.kernels[k].root).outputs[0].bytes()));
            if !cands.into_iter().any(|k| f.try_inline(k, true)) {
                break;
            }
        }
    }
    emit(&f)
}

/// Builds the fused graph: kernels in execution order, recomputed nodes copied into each kernel that
/// computes them; at a batch above 1 the first kernels a group of images at a time (`images`).
fn emit(f: &Fuser<'_>) -> Result<Plan> {
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
    Ok(Plan {
        graph: out,
        kernels: e.infos,
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
        });
    }
}

/// The cost of `g` with every op its own kernel: the "before" figure of the report.
pub fn unfused_cost(g: &Graph, t: &Target, allow_tf32: bool) -> Cost {
    g.node_ids()
        .filter(|n| !matches!(g.node(*n).op, Op::Input | Op::Const(_)))
        .map(|n| {
            let node = g.node(n);
            if is_view(&node.op) {
                return Cost::ZERO;
            }
            standalone(&node.op, &g.input_types(n), &node.outputs, t, allow_tf32).time
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_ir::{Binary, DType, ReduceKind, Tensor, TensorType, Unary};

    fn target() -> Target {
        Target::named("x86-64-v4", 1).unwrap()
    }

    /// The ops of each kernel, by kernel, skipping views.
    fn kernels(p: &Plan) -> Vec<Vec<&'static str>> {
        p.kernels
            .iter()
            .filter(|k| !k.view)
            .map(|k| k.ops.clone())
            .collect()
    }

    fn check_same(g: &Graph, p: &Plan) {
        let inputs = crate::optimize::random_inputs(g, 7);
        let a = mlopt_ir::interp::run(g, &inputs).unwrap();
        let b = mlopt_ir::interp::run(&p.graph, &inputs).unwrap();
        for ((_, x), (_, y)) in a.iter().zip(&b) {
            assert_eq!(x.to_f64_vec(), y.to_f64_vec());
        }
    }

    fn ty(s: &[usize]) -> TensorType {
        TensorType::new(DType::F32, s.to_vec())
    }

    #[test]
    fn elementwise_chains_and_epilogues_fuse() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[64, 32]));
        let w = g.add_const("w", Tensor::full(&ty(&[32, 16]), 0.5));
        let b = g.add_const("b", Tensor::full(&ty(&[16]), 0.1));
        let m = g.add(Op::MatMul, "mm", &[x, w]).unwrap();
        let a = g.add(Op::Binary(Binary::Add), "bias", &[m, b]).unwrap();
        let r = g.add(Op::Unary(Unary::Relu), "relu", &[a]).unwrap();
        let w2 = g.add_const("w2", Tensor::full(&ty(&[16, 8]), 0.5));
        let m2 = g.add(Op::MatMul, "mm2", &[r, w2]).unwrap();
        let s = g.add(Op::Unary(Unary::Sigmoid), "sig", &[m2]).unwrap();
        g.add_output("y", s);
        let p = fuse(&g, &target(), false, None).unwrap();
        assert_eq!(
            kernels(&p),
            vec![vec!["matmul", "add", "relu"], vec!["matmul", "sigmoid"]]
        );
        check_same(&g, &p);
    }

    /// A buffer read through a view stays alive until the view's last reader.
    #[test]
    fn views_keep_their_buffer_alive() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[64, 64]));
        let w = g.add_const("w", Tensor::full(&ty(&[64, 64]), 0.5));
        let w2 = g.add_const("w2", Tensor::full(&ty(&[64, 64]), 0.25));
        let y = g.add(Op::MatMul, "y", &[x, w]).unwrap();
        let v = g
            .add(
                Op::Reshape {
                    shape: vec![64, 64],
                },
                "v",
                &[y],
            )
            .unwrap();
        let m = g.add(Op::MatMul, "m", &[x, w2]).unwrap();
        let out = g.add(Op::MatMul, "out", &[v, m]).unwrap();
        g.add_output("out", out);
        let p = fuse(&g, &target(), false, None).unwrap();
        // While `out` runs: y (read as v), m and out itself, 16 KiB each.
        assert_eq!(p.peak_bytes, 3 * 64 * 64 * 4);
        check_same(&g, &p);
    }

    #[test]
    fn decomposed_layer_norm_is_one_row_kernel() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[8, 64]));
        let mean = |g: &mut Graph, v| {
            g.add(
                Op::Reduce {
                    kind: ReduceKind::Mean,
                    axes: vec![1],
                    keepdims: true,
                },
                "",
                &[v],
            )
            .unwrap()
        };
        let mu = mean(&mut g, x);
        let d = g.add(Op::Binary(Binary::Sub), "", &[x, mu]).unwrap();
        let d2 = g.add(Op::Binary(Binary::Mul), "", &[d, d]).unwrap();
        let var = mean(&mut g, d2);
        let eps = g.add_const("eps", Tensor::scalar(1e-5f32));
        let ve = g.add(Op::Binary(Binary::Add), "", &[var, eps]).unwrap();
        let sd = g.add(Op::Unary(Unary::Sqrt), "", &[ve]).unwrap();
        let y = g.add(Op::Binary(Binary::Div), "", &[d, sd]).unwrap();
        g.add_output("y", y);
        let p = fuse(&g, &target(), false, None).unwrap();
        assert_eq!(kernels(&p).len(), 1, "{}", mlopt_ir::print::print(&p.graph));
        check_same(&g, &p);
    }

    /// y = chain(x) read by two reductions: cheap chains are recomputed in both readers, expensive ones are
    /// stored, unless a memory budget forces recomputation.
    fn shared(chain: &[Unary]) -> Graph {
        let mut g = Graph::new("t");
        let mut v = g.add_input("x", ty(&[256, 256]));
        for u in chain {
            v = g.add(Op::Unary(*u), "", &[v]).unwrap();
        }
        let s = g
            .add(
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    axes: vec![1],
                    keepdims: false,
                },
                "sum",
                &[v],
            )
            .unwrap();
        let m = g
            .add(
                Op::Reduce {
                    kind: ReduceKind::Max,
                    axes: vec![0],
                    keepdims: false,
                },
                "max",
                &[v],
            )
            .unwrap();
        g.add_output("s", s);
        g.add_output("m", m);
        g
    }

    #[test]
    fn cheap_values_are_recomputed_expensive_ones_stored() {
        let cheap = shared(&[Unary::Relu]);
        let p = fuse(&cheap, &target(), false, None).unwrap();
        assert_eq!(
            kernels(&p),
            vec![vec!["relu", "reduce_sum"], vec!["relu", "reduce_max"]]
        );
        check_same(&cheap, &p);

        // 24 transcendental ops: 360 FLOP per element, far past the ridge point; recomputing all of it in
        // both readers would double that, so part of the chain is stored.
        let costly = shared(&[Unary::Erf, Unary::Tanh, Unary::Exp, Unary::Sigmoid].repeat(6));
        let stored = fuse(&costly, &target(), false, None).unwrap();
        assert_eq!(kernels(&stored).len(), 3, "{:?}", kernels(&stored));
        let tight = fuse(&costly, &target(), false, Some(0)).unwrap();
        assert_eq!(kernels(&tight).len(), 2, "{:?}", kernels(&tight));
        assert!(tight.peak_bytes < stored.peak_bytes);
        assert!(tight.total > stored.total, "recomputation costs time");
        check_same(&costly, &tight);
    }
}
