//! The memory planner: every activation the kernels store gets an offset in one arena, so a compiled model
//! allocates once. Values whose lifetimes do not overlap share bytes; an elementwise kernel may write its
//! output over the value it reads when that read is the value's last and both have one layout (in place).
//!
//! Values that only opposite branches of one `If` decided at run time compute (exclusive guards,
//! `mlopt_ir::demand`) never both exist in a run, so they share bytes even while both are "alive":
//! the arena holds the larger branch, not both.
//!
//! Lifetimes are kernel steps in execution order (`order.rs`: kernels by their root's place in the
//! topological order, as the fusion pass schedules them; a guarded call after its conditions, which it
//! reads). Graph inputs, constants and graph outputs live in the
//! caller's buffers and the weights, not in the arena. A kernel made only of reshapes is a view: its value
//! aliases its input's bytes, which then live until the view's last reader. Offsets are assigned largest
//! first, each at the lowest 64-byte-aligned offset that no value alive at the same time occupies (the
//! greedy-by-size heuristic of TFLite's and ONNX Runtime's planners).

use crate::error::{LowerError, Result};
use mlopt_ir::demand::{exclusive, Guard};
use mlopt_ir::{Graph, NodeId, Op, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Offsets are multiples of this, so every buffer starts on a cache line (and a zmm load).
pub const ALIGN: u64 = 64;

/// One stored value's place in the arena and its lifetime in kernel steps (inclusive).
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub value: Value,
    pub offset: u64,
    pub bytes: u64,
    pub first: usize,
    pub last: usize,
    /// What the kernel computing it runs under (empty: always; `mlopt_ir::demand`).
    pub guard: Guard,
}

/// The arena layout of a fused graph.
#[derive(Debug, Clone, Default)]
pub struct MemoryPlan {
    pub arena_bytes: u64,
    /// Every stored value in the arena, in execution order.
    pub slots: Vec<Slot>,
    /// (output, input) pairs where a kernel writes its output over its input.
    pub in_place: Vec<(Value, Value)>,
    /// (view, value it aliases) for reshape-only kernels.
    pub aliases: Vec<(Value, Value)>,
    /// The sum of all stored values' sizes: what the arena would be without reuse.
    pub unshared_bytes: u64,
}

impl MemoryPlan {
    /// Checks the plan's invariant: offsets aligned, every slot inside the arena, and no two values alive
    /// at the same step sharing a byte unless one was written in place over the other.
    pub fn verify(&self) -> std::result::Result<(), String> {
        let paired = |a: &Slot, b: &Slot| {
            self.in_place
                .iter()
                .any(|(o, i)| (*o == a.value && *i == b.value) || (*o == b.value && *i == a.value))
        };
        for (i, a) in self.slots.iter().enumerate() {
            if a.offset % ALIGN != 0 || a.offset + a.bytes > self.arena_bytes {
                return Err(format!(
                    "{a:?} is misaligned or outside the {}-byte arena",
                    self.arena_bytes
                ));
            }
            for b in &self.slots[i + 1..] {
                let live = a.first <= b.last && b.first <= a.last && !exclusive(&a.guard, &b.guard);
                let overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
                if live && overlap && !paired(a, b) {
                    return Err(format!("{a:?} and {b:?} overlap while both alive"));
                }
            }
        }
        Ok(())
    }
}

/// Plans the arena for `g`, whose op nodes must all be in kernels (the optimiser's output).
pub fn plan_memory(g: &Graph) -> Result<MemoryPlan> {
    let order = g.topo_order()?;
    if let Some(n) = order.iter().find(|n| {
        g.node(**n).kernel.is_none() && !matches!(g.node(**n).op, Op::Input | Op::Const(_))
    }) {
        return Err(LowerError::Unfused {
            node: g.node(*n).name.clone(),
            op: g.node(*n).op.name(),
        });
    }
    // Each kernel by its root (the verifier guarantees exactly one), in execution order.
    let kernels: Vec<Kernel> = crate::order::execution_order(g)?
        .into_iter()
        .map(|k| (k.nodes.roots[0], k.nodes.members, k.guard))
        .collect();
    let mut plan = MemoryPlan::default();
    let alias = views(g, &kernels, &mut plan);
    let storage = |mut v: Value| {
        while let Some(s) = alias.get(&v) {
            v = *s;
        }
        v
    };
    let (first, last) = lifetimes(g, &kernels, &alias, &storage);
    let group = in_place(g, &kernels, (&first, &last), &storage, &mut plan);
    let owner = |mut v: Value| {
        while let Some(u) = group.get(&v) {
            v = *u;
        }
        v
    };
    // One interval per owner: the union of its members' lifetimes, the largest of their sizes, the
    // literals all their kernels' guards share.
    let mut spans: BTreeMap<Value, Span> = BTreeMap::new();
    for (v, &f) in &first {
        let bytes = g.value_type(*v).bytes() as u64;
        plan.unshared_bytes += bytes;
        let guard = &kernels[f].2;
        let e = spans
            .entry(owner(*v))
            .or_insert_with(|| (f, last[v], bytes, guard.clone()));
        e.0 = e.0.min(f);
        e.1 = e.1.max(last[v]);
        e.2 = e.2.max(bytes);
        e.3.retain(|l| guard.contains(l));
    }
    let offsets = place(spans, &mut plan);
    let mut slots: Vec<Slot> = first
        .iter()
        .map(|(v, &f)| Slot {
            value: *v,
            offset: offsets[&owner(*v)],
            bytes: g.value_type(*v).bytes() as u64,
            first: f,
            last: last[v],
            guard: kernels[f].2.clone(),
        })
        .collect();
    slots.sort_by_key(|s| (s.first, s.value));
    plan.slots = slots;
    Ok(plan)
}

/// A kernel: its root, its members and its guard (whose conditions its call reads first).
type Kernel = (NodeId, Vec<NodeId>, Guard);

/// Views alias their input: each kernel made only of reshapes, its value to the value it reads
/// (recorded in the plan too).
fn views(g: &Graph, kernels: &[Kernel], plan: &mut MemoryPlan) -> HashMap<Value, Value> {
    let mut alias: HashMap<Value, Value> = HashMap::new();
    for (root, ms, _) in kernels {
        if ms
            .iter()
            .all(|m| matches!(g.node(*m).op, Op::Reshape { .. }))
        {
            // The chain's first reshape reads a value outside the kernel.
            let src = ms.iter().find_map(|m| {
                g.inputs(*m)
                    .into_iter()
                    .flatten()
                    .find(|v| !ms.contains(&v.node))
            });
            if let Some(src) = src {
                let view = Value {
                    node: *root,
                    output: 0,
                };
                alias.insert(view, src);
                plan.aliases.push((view, src));
            }
        }
    }
    alias
}

/// Lifetimes of the values the arena holds (not views, inputs, constants or outputs): produced at
/// their kernel's step, last read by the latest kernel that reads them (through views, which
/// `storage` follows to the bytes a value lives in).
#[allow(clippy::type_complexity)]
fn lifetimes(
    g: &Graph,
    kernels: &[Kernel],
    alias: &HashMap<Value, Value>,
    storage: &dyn Fn(Value) -> Value,
) -> (HashMap<Value, usize>, HashMap<Value, usize>) {
    // A graph output lives in the caller's buffer; another output of its node (a count's data, a
    // TopK's values) still needs the arena.
    let outputs: HashSet<Value> = g.graph_outputs().iter().map(|(_, v)| *v).collect();
    let external =
        |v: Value| matches!(g.node(v.node).op, Op::Input | Op::Const(_)) || outputs.contains(&v);
    let mut first: HashMap<Value, usize> = HashMap::new();
    let mut last: HashMap<Value, usize> = HashMap::new();
    for (step, (root, ms, guard)) in kernels.iter().enumerate() {
        for i in 0..g.node(*root).outputs.len() {
            let v = Value {
                node: *root,
                output: i as u32,
            };
            if !alias.contains_key(&v) && !external(v) {
                first.insert(v, step);
                last.entry(v).or_insert(step);
            }
        }
        for m in ms {
            for v in g
                .inputs(*m)
                .into_iter()
                .flatten()
                .filter(|v| !ms.contains(&v.node))
                .chain(guard.iter().map(|l| l.cond))
            {
                let s = storage(v);
                if first.contains_key(&s) {
                    let l = last.entry(s).or_insert(step);
                    *l = (*l).max(step);
                }
            }
        }
    }
    (first, last)
}

/// In place: a purely elementwise kernel whose output has the layout of a value it reads for the
/// last time takes over that value's bytes. Returns each such value and the value whose bytes it
/// takes (recorded in the plan too).
fn in_place(
    g: &Graph,
    kernels: &[Kernel],
    (first, last): (&HashMap<Value, usize>, &HashMap<Value, usize>),
    storage: &dyn Fn(Value) -> Value,
    plan: &mut MemoryPlan,
) -> HashMap<Value, Value> {
    let mut group: HashMap<Value, Value> = HashMap::new();
    for (step, (root, ms, _)) in kernels.iter().enumerate() {
        let out = Value {
            node: *root,
            output: 0,
        };
        if !first.contains_key(&out)
            || g.node(*root).outputs.len() != 1
            || !ms.iter().all(|m| g.node(*m).op.is_elementwise())
        {
            continue;
        }
        let out_ty = g.value_type(out);
        let reused = ms
            .iter()
            .flat_map(|m| g.inputs(*m).into_iter().flatten())
            .filter(|v| !ms.contains(&v.node))
            .map(storage)
            .find(|u| {
                let t = g.value_type(*u);
                first.contains_key(u)
                    && last[u] == step
                    && t.shape == out_ty.shape
                    && t.dtype.size() == out_ty.dtype.size()
                    && !group.values().any(|x| x == u)
            });
        if let Some(u) = reused {
            group.insert(out, u);
            plan.in_place.push((out, u));
        }
    }
    group
}

/// An owner's interval: first step, last step, bytes, and the guard all its values are under.
type Span = (usize, usize, u64, Guard);

/// Offsets for the intervals `spans` (by owner), largest first, each at the lowest aligned offset no
/// interval alive at the same time (and not exclusive with it) occupies; the arena's size goes into
/// the plan.
fn place(spans: BTreeMap<Value, Span>, plan: &mut MemoryPlan) -> HashMap<Value, u64> {
    let mut order: Vec<(Value, Span)> = spans.into_iter().collect();
    order.sort_by_key(|(v, (f, _, b, _))| (std::cmp::Reverse(*b), *f, *v));
    let mut placed: Vec<(Span, u64)> = vec![]; // (interval, offset)
    let mut offsets: HashMap<Value, u64> = HashMap::new();
    for (v, span) in order {
        let (f, l, bytes, _) = span;
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(p, _)| p.0 <= l && f <= p.1 && !exclusive(&p.3, &span.3))
            .map(|(p, o)| (*o, *o + p.2))
            .collect();
        busy.sort_unstable();
        let mut offset = 0u64;
        for (lo, hi) in busy {
            if offset + bytes <= lo {
                break;
            }
            offset = offset.max(hi.div_ceil(ALIGN) * ALIGN);
        }
        placed.push((span, offset));
        offsets.insert(v, offset);
        plan.arena_bytes = plan.arena_bytes.max(offset + bytes);
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_ir::{Binary, DType, Tensor, TensorType, Unary};

    fn ty(s: &[usize]) -> TensorType {
        TensorType::new(DType::F32, s.to_vec())
    }

    /// Adds a one-node kernel.
    fn k(g: &mut Graph, id: u32, op: Op, ins: &[Value]) -> Value {
        let v = g.add(op, format!("k{id}"), ins).unwrap();
        g.node_mut(v.node).kernel = Some(id);
        v
    }

    /// The two branches of an `If` decided at run time share bytes while both are alive: only one of
    /// them is computed in a run.
    #[test]
    fn exclusive_branches_share_bytes() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[64, 64]));
        let c = g.add_input("c", TensorType::new(DType::Bool, vec![]));
        let w = g.add_const("w", Tensor::full(&ty(&[64, 64]), 0.5));
        let a = k(&mut g, 0, Op::MatMul, &[x, w]);
        let b = k(&mut g, 1, Op::Unary(Unary::Tanh), &[x]);
        let shared = k(&mut g, 2, Op::Unary(Unary::Exp), &[x]);
        let y = k(&mut g, 3, Op::Choose, &[c, a, b]);
        let z = k(&mut g, 4, Op::Binary(Binary::Add), &[y, shared]);
        g.add_output("z", z);
        mlopt_ir::verify::verify(&g).unwrap();
        let p = plan_memory(&g).unwrap();
        p.verify().unwrap();
        let slot = |v: Value| p.slots.iter().find(|s| s.value == v).unwrap().clone();
        assert!(slot(a).guard[0].when && !slot(b).guard[0].when);
        assert_eq!(slot(a).offset, slot(b).offset);
        assert_ne!(slot(shared).offset, slot(a).offset);
        // a, b and the value both branches read: two 16 KiB buffers, and y.
        assert_eq!(p.arena_bytes, 3 * 16384, "{p:?}");
    }

    #[test]
    fn lifetimes_share_bytes_and_elementwise_kernels_work_in_place() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[64, 64]));
        let w = g.add_const("w", Tensor::full(&ty(&[64, 64]), 0.5));
        let a = k(&mut g, 0, Op::MatMul, &[x, w]);
        let b = k(&mut g, 1, Op::Unary(Unary::Tanh), &[a]);
        let c = k(&mut g, 2, Op::MatMul, &[b, w]);
        let d = k(&mut g, 3, Op::MatMul, &[c, w]);
        let e = k(&mut g, 4, Op::Binary(Binary::Add), &[d, c]);
        let f = k(&mut g, 5, Op::Reshape { shape: vec![4096] }, &[e]);
        let y = k(&mut g, 6, Op::Unary(Unary::Relu), &[f]);
        g.add_output("y", y);
        mlopt_ir::verify::verify(&g).unwrap();
        let p = plan_memory(&g).unwrap();
        p.verify().unwrap();
        let slot = |v: Value| p.slots.iter().find(|s| s.value == v).unwrap().clone();
        // tanh writes over the matmul it reads last, and the add over d (c and d are both read last by it;
        // the first operand is taken).
        assert_eq!(p.in_place, vec![(b, a), (e, d)]);
        assert_eq!(slot(a).offset, slot(b).offset);
        // The reshape aliases e, so e lives until relu (step 6) reads it through the view.
        assert_eq!(p.aliases, vec![(f, e)]);
        assert_eq!(slot(e).last, 6);
        // y is a graph output: the caller's buffer, not the arena.
        assert!(p.slots.iter().all(|s| s.value != y));
        // Lifetimes in steps: a+b 0-2, c 2-4, d+e 3-6: never more than two 16 KiB buffers at once, against
        // five values without reuse.
        assert_eq!(p.arena_bytes, 2 * 16384);
        assert_eq!(p.unshared_bytes, 5 * 16384);
    }

    #[test]
    fn broadcasting_or_narrowing_reads_are_not_in_place() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[8, 16]));
        let w = g.add_const("w", Tensor::full(&ty(&[16, 16]), 0.5));
        let a = k(&mut g, 0, Op::MatMul, &[x, w]); // [8, 16]
        let s = k(
            &mut g,
            1,
            Op::Reduce {
                kind: mlopt_ir::ReduceKind::Sum,
                axes: vec![0],
                keepdims: true,
            },
            &[a],
        ); // [1, 16]
        let b = k(&mut g, 2, Op::Binary(Binary::Add), &[s, a]); // reads s broadcast: [8, 16]; a is read last here
        let h = k(&mut g, 3, Op::Cast { to: DType::F16 }, &[b]); // narrowing: different element size
        let y = k(&mut g, 4, Op::Cast { to: DType::F32 }, &[h]);
        g.add_output("y", y);
        let p = plan_memory(&g).unwrap();
        p.verify().unwrap();
        // b may take a's bytes (same shape, last read), never s's (broadcast); h may not take b's (f16 < f32).
        assert!(
            p.in_place
                .iter()
                .all(|(o, i)| !(*o == b && *i == s) && *o != h),
            "{:?}",
            p.in_place
        );
    }

    #[test]
    fn unfused_graphs_are_an_error() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", ty(&[4]));
        let y = g.add(Op::Unary(Unary::Relu), "relu", &[x]).unwrap();
        g.add_output("y", y);
        let e = plan_memory(&g).unwrap_err().to_string();
        assert!(e.contains("'relu'") && e.contains("no kernel"), "{e}");
    }
}
