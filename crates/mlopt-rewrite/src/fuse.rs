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

mod emit;
use emit::emit;

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
    /// At least the longest chain of members, root to leaf: the depth of the expressions lowering
    /// builds for the kernel, which its passes walk recursively.
    depth: usize,
}

/// The deepest chain of ops one kernel computes. A model's 4,000-op elementwise chain fused into one
/// kernel overflowed the stack of the lowering that walks it; bounded here, such a chain becomes
/// kernels of this many ops, each storing its value (at this depth a store is a small part of the work).
pub const MAX_FUSED_DEPTH: usize = 256;

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
    /// What its call is made under (`when flag`, `unless c`: an `If` decided at run time; empty:
    /// always), as `mlopt_ir::demand::kernel_guards` finds it in the fused graph.
    pub guard: Vec<String>,
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
            if k.depth + p.depth > MAX_FUSED_DEPTH {
                return false;
            }
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
            // (An over-estimate where `p` joins beside an operand rather than below the deepest.)
            k.depth += p.depth;
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
                depth: 1,
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

    /// A chain longer than `MAX_FUSED_DEPTH` becomes several kernels, none deeper than that.
    #[test]
    fn long_chains_split_at_the_depth_bound() {
        let mut g = Graph::new("t");
        let mut v = g.add_input("x", ty(&[4]));
        let n = 3 * MAX_FUSED_DEPTH + 7;
        for i in 0..n {
            let op = if i % 2 == 0 { Unary::Neg } else { Unary::Abs };
            v = g.add(Op::Unary(op), format!("u{i}"), &[v]).unwrap();
        }
        g.add_output("y", v);
        let p = fuse(&g, &target(), false, None).unwrap();
        let sizes: Vec<usize> = kernels(&p).iter().map(|k| k.len()).collect();
        assert!(sizes.iter().all(|s| *s <= MAX_FUSED_DEPTH), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), n);
        assert_eq!(sizes.len(), n.div_ceil(MAX_FUSED_DEPTH));
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
