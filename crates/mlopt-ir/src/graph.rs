//! The dataflow graph: nodes are operations, edges carry one value from an output slot to an input slot.
//!
//! petgraph's `StableDiGraph` stores it (indices survive removals, which rewrites need); `NodeId` and `Value`
//! keep its indices out of every other crate's sight. A node's outputs are its `Value`s; graph inputs and
//! constants are nodes too (`Op::Input`, `Op::Const`), so every value has exactly one producer.

use crate::dtype::TensorType;
use crate::error::{IrError, Result};
use crate::infer::infer;
use crate::op::Op;
use crate::tensor::Tensor;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::fmt;
use std::sync::Arc;

/// The largest value a graph may hold: 64 GiB, or this machine's memory if it has less. Shapes beyond
/// it come from bad input, not real models, and checking them before any allocation keeps a hostile
/// file from exhausting memory.
pub fn max_value_bytes() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        // MemTotal in /proc/meminfo, in kB; without it (not Linux), the fixed cap.
        let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace()
                .nth(1)?
                .parse::<usize>()
                .ok()?
                .checked_mul(1024)
        });
        total.map_or(64 << 30, |t| t.min(64 << 30))
    })
}

/// A size for messages: GiB with one decimal.
pub fn gib(bytes: usize) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The highest rank a value may have.
pub const MAX_RANK: usize = 64;

/// A node of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(NodeIndex<u32>);

impl NodeId {
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0.index())
    }
}

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: NodeId,
    pub output: u32,
}

/// A node: its op, the name it came with (ONNX node, initializer or input name; may be empty), the types
/// of its outputs, how many input slots it has, and the kernel (fusion group) the optimiser put it in.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: Op,
    pub name: String,
    pub outputs: Vec<TensorType>,
    pub num_inputs: usize,
    /// The fusion group this node is computed in; `None` before optimisation and for inputs and constants.
    /// A group's nodes form one kernel: only its root's outputs are written to memory.
    pub kernel: Option<u32>,
}

/// One kernel's nodes, from `Graph::kernels`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelNodes {
    pub members: Vec<NodeId>,
    pub roots: Vec<NodeId>,
}

/// The edge payload: which output of the source feeds which input of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub output: u32,
    pub input: u32,
}

/// A static-shaped dataflow graph with named inputs and outputs.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub name: String,
    g: StableDiGraph<Node, Edge>,
    inputs: Vec<NodeId>,
    outputs: Vec<(String, Value)>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Adds a graph input.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> Value {
        let id = self.add_raw(Op::Input, name.into(), &[], vec![ty]);
        self.inputs.push(id);
        Value {
            node: id,
            output: 0,
        }
    }

    /// Adds a constant. An empty name becomes `const.N`, so that every constant can be referred to by
    /// name in the text format.
    pub fn add_const(&mut self, name: impl Into<String>, t: Tensor) -> Value {
        self.add_shared_const(name, Arc::new(t))
    }

    /// Adds a constant whose data is shared with another graph (no copy of the weights).
    pub fn add_shared_const(&mut self, name: impl Into<String>, t: Arc<Tensor>) -> Value {
        let ty = t.ty();
        let id = self.add_raw(Op::Const(t), name.into(), &[], vec![ty]);
        if self.g[id.0].name.is_empty() {
            self.g[id.0].name = format!("const.{}", id.index());
        }
        Value {
            node: id,
            output: 0,
        }
    }

    /// Adds a node with the given output types, without checking them (the verifier does).
    pub fn add_raw(
        &mut self,
        op: Op,
        name: String,
        inputs: &[Option<Value>],
        outputs: Vec<TensorType>,
    ) -> NodeId {
        let id = NodeId(self.g.add_node(Node {
            op,
            name,
            outputs,
            num_inputs: inputs.len(),
            kernel: None,
        }));
        for (slot, v) in inputs.iter().enumerate() {
            if let Some(v) = v {
                self.g.add_edge(
                    v.node.0,
                    id.0,
                    Edge {
                        output: v.output,
                        input: slot as u32,
                    },
                );
            }
        }
        id
    }

    /// The output types `op` would have on these inputs, keeping the first `num_outputs` (trailing optional
    /// outputs such as LayerNormalization's statistics may be dropped). Errors name `name` and the op.
    pub fn infer_outputs(
        &self,
        op: &Op,
        name: &str,
        inputs: &[Option<Value>],
        num_outputs: Option<usize>,
    ) -> Result<Vec<TensorType>> {
        let tys: Vec<Option<&TensorType>> = inputs
            .iter()
            .map(|v| v.map(|v| self.value_type(v)))
            .collect();
        let mut outs = infer(op, &tys).map_err(|e| IrError::Infer {
            node: name.to_string(),
            op: op.name(),
            input: e.input,
            msg: e.msg,
        })?;
        if let Some(n) = num_outputs {
            outs.truncate(n.max(1));
        }
        if let Some(t) = outs.iter().find(|t| t.rank() > MAX_RANK) {
            return Err(IrError::Infer {
                node: name.to_string(),
                op: op.name(),
                input: None,
                msg: format!(
                    "output of rank {} exceeds mlopt's limit of {MAX_RANK}",
                    t.rank()
                ),
            });
        }
        if let Some(t) = outs
            .iter()
            .find(|t| t.checked_bytes().is_none_or(|b| b > max_value_bytes()))
        {
            return Err(IrError::Infer {
                node: name.to_string(),
                op: op.name(),
                input: None,
                msg: format!("output {t} is larger than mlopt's limit of {} per value (this machine's memory, at most 64 GiB)", gib(max_value_bytes())),
            });
        }
        Ok(outs)
    }

    /// Adds a node, inferring its output types (see `infer_outputs`).
    pub fn add_node(
        &mut self,
        op: Op,
        name: impl Into<String>,
        inputs: &[Option<Value>],
        num_outputs: Option<usize>,
    ) -> Result<Vec<Value>> {
        let name = name.into();
        let outs = self.infer_outputs(&op, &name, inputs, num_outputs)?;
        Ok(self.add_typed(op, name, inputs, outs))
    }

    /// Adds a node whose output types were already inferred (by `infer_outputs`) and returns its values.
    pub fn add_typed(
        &mut self,
        op: Op,
        name: String,
        inputs: &[Option<Value>],
        outs: Vec<TensorType>,
    ) -> Vec<Value> {
        let n = outs.len();
        let id = self.add_raw(op, name, inputs, outs);
        (0..n as u32)
            .map(|output| Value { node: id, output })
            .collect()
    }

    /// Adds a single-output node and returns its value.
    pub fn add(&mut self, op: Op, name: impl Into<String>, inputs: &[Value]) -> Result<Value> {
        let inputs: Vec<Option<Value>> = inputs.iter().copied().map(Some).collect();
        Ok(self.add_node(op, name, &inputs, Some(1))?[0])
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id.0]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.g[id.0]
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.0)
    }

    pub fn value_type(&self, v: Value) -> &TensorType {
        &self.g[v.node.0].outputs[v.output as usize]
    }

    /// The constant behind a value, if it is produced by a `Const` node.
    pub fn const_value(&self, v: Value) -> Option<&Arc<Tensor>> {
        match &self.g[v.node.0].op {
            Op::Const(t) => Some(t),
            _ => None,
        }
    }

    /// The node's inputs by slot; `None` for an optional input left out.
    pub fn inputs(&self, id: NodeId) -> Vec<Option<Value>> {
        let mut v = vec![None; self.g[id.0].num_inputs];
        for e in self.g.edges_directed(id.0, Direction::Incoming) {
            let w = e.weight();
            if let Some(slot) = v.get_mut(w.input as usize) {
                *slot = Some(Value {
                    node: NodeId(e.source()),
                    output: w.output,
                });
            }
        }
        v
    }

    /// The types of the node's inputs by slot; `None` for an optional input left out.
    pub fn input_types(&self, id: NodeId) -> Vec<Option<&TensorType>> {
        self.inputs(id)
            .into_iter()
            .map(|v| v.map(|v| self.value_type(v)))
            .collect()
    }

    /// The kernels (fusion groups) by id: their members in node order, and their roots (the members whose
    /// values are read outside the kernel or returned; a verified graph has exactly one per kernel).
    pub fn kernels(&self) -> std::collections::BTreeMap<u32, KernelNodes> {
        let outputs: std::collections::HashSet<NodeId> =
            self.outputs.iter().map(|(_, v)| v.node).collect();
        let mut ks: std::collections::BTreeMap<u32, KernelNodes> = Default::default();
        for n in self.node_ids() {
            let Some(k) = self.node(n).kernel else {
                continue;
            };
            let entry = ks.entry(k).or_default();
            entry.members.push(n);
            if outputs.contains(&n)
                || self
                    .users(n)
                    .iter()
                    .any(|(u, _)| self.node(*u).kernel != Some(k))
            {
                entry.roots.push(n);
            }
        }
        ks
    }

    /// Nodes that read any output of `id`, with the slot they read it into.
    pub fn users(&self, id: NodeId) -> Vec<(NodeId, Edge)> {
        self.g
            .edges_directed(id.0, Direction::Outgoing)
            .map(|e| (NodeId(e.target()), *e.weight()))
            .collect()
    }

    pub fn graph_inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    pub fn graph_outputs(&self) -> &[(String, Value)] {
        &self.outputs
    }

    pub fn add_output(&mut self, name: impl Into<String>, v: Value) {
        self.outputs.push((name.into(), v));
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices().map(NodeId)
    }

    pub fn num_nodes(&self) -> usize {
        self.g.node_count()
    }

    /// Nodes in a topological order that is stable: among ready nodes, the one created first goes first,
    /// so printing a graph never depends on hash order. Fails on a cycle.
    pub fn topo_order(&self) -> Result<Vec<NodeId>> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut indeg: std::collections::HashMap<NodeIndex<u32>, usize> = Default::default();
        let mut ready = BinaryHeap::new();
        for n in self.g.node_indices() {
            let d = self.g.edges_directed(n, Direction::Incoming).count();
            if d == 0 {
                ready.push(Reverse(n));
            }
            indeg.insert(n, d);
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(n)) = ready.pop() {
            order.push(NodeId(n));
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                if let Some(d) = indeg.get_mut(&e.target()) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Reverse(e.target()));
                    }
                }
            }
        }
        if order.len() != self.g.node_count() {
            return Err(IrError::Cycle);
        }
        Ok(order)
    }

    /// Points every use of `old` (node inputs and graph outputs) at `new`.
    pub fn replace_uses(&mut self, old: Value, new: Value) {
        self.replace_reads(old, new, |_| true);
        for (_, v) in &mut self.outputs {
            if *v == old {
                *v = new;
            }
        }
    }

    /// Points the inputs that read `old` in the nodes `reader` accepts at `new` (graph outputs keep `old`).
    pub fn replace_reads(&mut self, old: Value, new: Value, reader: impl Fn(NodeId) -> bool) {
        let edges: Vec<_> = self
            .g
            .edges_directed(old.node.0, Direction::Outgoing)
            .filter(|e| e.weight().output == old.output && reader(NodeId(e.target())))
            .map(|e| (e.id(), e.target(), e.weight().input))
            .collect();
        for (eid, target, input) in edges {
            self.g.remove_edge(eid);
            self.g.add_edge(
                new.node.0,
                target,
                Edge {
                    output: new.output,
                    input,
                },
            );
        }
    }

    /// The data of the constant named `name`, for resolving `const @"name"` when parsing.
    pub fn const_by_name(&self, name: &str) -> Option<Arc<Tensor>> {
        self.g.node_weights().find_map(|n| match &n.op {
            Op::Const(t) if n.name == name => Some(t.clone()),
            _ => None,
        })
    }

    /// Removes nodes that no graph output depends on (graph inputs always stay).
    pub fn remove_dead(&mut self) {
        let mut live = std::collections::HashSet::new();
        let mut stack: Vec<NodeIndex<u32>> = self.outputs.iter().map(|(_, v)| v.node.0).collect();
        stack.extend(self.inputs.iter().map(|n| n.0));
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(self.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        self.g.retain_nodes(|_, n| live.contains(&n));
    }
}
