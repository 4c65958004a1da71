//! What each node's value is needed under. A `choose c, a, b` (an `If` decided at run time) needs `a`
//! only when `c` holds and `b` only when it does not, so the nodes that only one operand needs run
//! under that condition: the reference interpreter skips them, and lowering guards their kernels'
//! calls (`mlopt_kir::Step::guard`). An error such a node would raise (an index out of range) is then
//! raised only when its branch is taken, as ONNX defines `If`.
//!
//! A node's guard is a conjunction of literals. It is computed from the graph's outputs back: a node
//! read by several consumers is needed when any of them is, which the conjunction of the literals all
//! their guards share over-approximates (sound: a guard may let a node run that is not needed, never
//! the reverse). A node nothing reads is needed always.
//!
//! A guard is evaluated after its conditions' nodes (`evaluation_order`; the kernels' order in
//! lowering likewise). A literal's condition is always computed when the rest of its guard holds: `c`
//! is read by the `choose` itself, so its node's guard is part of the `choose`'s, which every guard
//! holding the literal contains. So a guard may be evaluated all at once: when some literal's
//! condition was not computed, another literal is false.

use crate::{Graph, NodeId, Op, Result, Value};
use std::collections::{BTreeSet, HashMap};

/// A condition: the one-element bool `cond` holds (`when`) or does not (`!when`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Literal {
    pub cond: Value,
    pub when: bool,
}

/// What a node is needed under: every literal holds (sorted; empty means always).
pub type Guard = Vec<Literal>;

/// The literal under which `choose` node `n` reads its input `i` (none for its condition and for
/// every other op's inputs).
pub fn edge_literal(g: &Graph, n: NodeId, i: usize) -> Option<Literal> {
    if !matches!(g.node(n).op, Op::Choose) || i == 0 {
        return None;
    }
    let cond = g.inputs(n).first().copied().flatten()?;
    Some(Literal { cond, when: i == 1 })
}

/// The guard of every node that is not always needed.
pub fn guards(g: &Graph) -> Result<HashMap<NodeId, Guard>> {
    let order = g.topo_order()?;
    let mut need: HashMap<NodeId, BTreeSet<Literal>> = HashMap::new();
    for (_, v) in g.graph_outputs() {
        need.insert(v.node, BTreeSet::new());
    }
    let mut out = HashMap::new();
    for &n in order.iter().rev() {
        let own = need.remove(&n).unwrap_or_default();
        for (i, v) in g.inputs(n).into_iter().enumerate() {
            let Some(v) = v else { continue };
            let mut edge = own.clone();
            edge.extend(edge_literal(g, n, i));
            match need.get_mut(&v.node) {
                Some(d) => d.retain(|l| edge.contains(l)),
                None => {
                    need.insert(v.node, edge);
                }
            }
        }
        if !own.is_empty() {
            out.insert(n, own.into_iter().collect());
        }
    }
    Ok(out)
}

/// The nodes in an order to evaluate them: the topological order, except that a guarded node waits
/// for the nodes computing its conditions (which it does not read, so the topological order may put
/// them later). Among the nodes whose inputs are ready, the earliest in the topological order is next.
pub fn evaluation_order(g: &Graph, guards: &HashMap<NodeId, Guard>) -> Result<Vec<NodeId>> {
    let topo = g.topo_order()?;
    let pos: HashMap<NodeId, usize> = topo.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut waits: HashMap<NodeId, usize> = HashMap::new();
    let mut readers: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &n in &topo {
        let conds = guards.get(&n).into_iter().flatten().map(|l| l.cond);
        let deps: BTreeSet<NodeId> = g
            .inputs(n)
            .into_iter()
            .flatten()
            .chain(conds)
            .map(|v| v.node)
            .filter(|d| *d != n)
            .collect();
        waits.insert(n, deps.len());
        for d in deps {
            readers.entry(d).or_default().push(n);
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<(usize, NodeId)>> = topo
        .iter()
        .filter(|n| waits[n] == 0)
        .map(|n| std::cmp::Reverse((pos[n], *n)))
        .collect();
    let mut out = Vec::with_capacity(topo.len());
    while let Some(std::cmp::Reverse((_, n))) = ready.pop() {
        out.push(n);
        for r in readers.get(&n).into_iter().flatten() {
            if let Some(w) = waits.get_mut(r) {
                *w -= 1;
                if *w == 0 {
                    ready.push(std::cmp::Reverse((pos[r], *r)));
                }
            }
        }
    }
    if out.len() != topo.len() {
        return Err(crate::IrError::Cycle);
    }
    Ok(out)
}

/// Whether two guards can never hold in the same run: one needs a condition the other needs false
/// (the two branches of one `If`), so values under them may share memory.
pub fn exclusive(a: &[Literal], b: &[Literal]) -> bool {
    a.iter()
        .any(|l| b.iter().any(|m| m.cond == l.cond && m.when != l.when))
}

/// Whether `guard` holds, given each condition's value (`None`: not computed, so the guard does not
/// hold, see the module's comment).
pub fn holds(guard: &[Literal], value: impl Fn(Value) -> Option<bool>) -> bool {
    guard.iter().all(|l| value(l.cond) == Some(l.when))
}

/// The guard of each kernel (fusion group) of a fused graph that is not always needed: what all its
/// members are needed under (the literals every member's guard holds).
pub fn kernel_guards(g: &Graph) -> Result<HashMap<u32, Guard>> {
    let need = guards(g)?;
    let mut out: HashMap<u32, BTreeSet<Literal>> = HashMap::new();
    let mut always = BTreeSet::new();
    for n in g.node_ids() {
        let Some(k) = g.node(n).kernel else { continue };
        if always.contains(&k) {
            continue;
        }
        let own: BTreeSet<Literal> = need.get(&n).into_iter().flatten().copied().collect();
        let shared: BTreeSet<Literal> = match out.get(&k) {
            None => own,
            Some(s) => s.intersection(&own).copied().collect(),
        };
        if shared.is_empty() {
            out.remove(&k);
            always.insert(k);
        } else {
            out.insert(k, shared);
        }
    }
    Ok(out
        .into_iter()
        .map(|(k, s)| (k, s.into_iter().collect()))
        .collect())
}

/// A guard as words, each condition by its node's name: `when flag`, `unless is_short`.
pub fn describe(g: &Graph, guard: &[Literal]) -> Vec<String> {
    guard
        .iter()
        .map(|l| {
            let word = if l.when { "when" } else { "unless" };
            let node = g.node(l.cond.node);
            if node.name.is_empty() {
                format!("{word} %{}", l.cond.node.index())
            } else {
                format!("{word} {}", node.name)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor, TensorType, Unary};

    /// `choose(c, gather(x, i) * 2, neg(x)[0..2])` with `x` read by both arms and `outer(c2, ..)`
    /// around it: each node's guard, and the interpreter running only the arm taken.
    #[test]
    fn only_the_operand_taken_is_needed() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![4]));
        let i = g.add_input("i", TensorType::new(DType::I64, vec![2]));
        let c = g.add_input("c", TensorType::new(DType::Bool, vec![]));
        let c2 = g.add_input("c2", TensorType::new(DType::Bool, vec![]));
        let picked = g.add(Op::Gather { axis: 0 }, "picked", &[x, i]).unwrap();
        let neg = g.add(Op::Unary(Unary::Neg), "neg", &[x]).unwrap();
        let head = g
            .add(
                Op::Slice {
                    starts: vec![0],
                    lens: vec![2],
                    steps: vec![1],
                },
                "head",
                &[neg],
            )
            .unwrap();
        let inner = g.add(Op::Choose, "inner", &[c, picked, head]).unwrap();
        let other = g.add(Op::Unary(Unary::Abs), "other", &[head]).unwrap();
        let y = g.add(Op::Choose, "y", &[c2, inner, other]).unwrap();
        g.add_output("y", y);
        let guards = guards(&g).unwrap();
        let lit = |cond, when| Literal { cond, when };
        assert_eq!(guards[&picked.node], vec![lit(c, true), lit(c2, true)]);
        // `head` is read by the inner choose's else arm and by `other`: needed under (c2 and not c)
        // or (not c2), which share no literal.
        assert!(!guards.contains_key(&head.node) && !guards.contains_key(&neg.node));
        assert_eq!(guards[&other.node], vec![lit(c2, false)]);
        assert_eq!(guards[&inner.node], vec![lit(c2, true)]);
        // The inner condition is read only under the outer one.
        assert_eq!(guards[&c.node], vec![lit(c2, true)]);
        assert!(!guards.contains_key(&c2.node) && !guards.contains_key(&y.node));
        // Out of range indices fail only when the gather's arm is taken.
        let run = |cv: bool, c2v: bool| {
            let inputs = std::collections::HashMap::from([
                (
                    "x".to_string(),
                    Tensor::from_vec(&[4], vec![1f32, 2., 3., 4.]).unwrap(),
                ),
                (
                    "i".to_string(),
                    Tensor::from_vec(&[2], vec![9i64, 1]).unwrap(),
                ),
                ("c".to_string(), Tensor::scalar(cv)),
                ("c2".to_string(), Tensor::scalar(c2v)),
            ]);
            crate::interp::run(&g, &inputs).map(|o| o[0].1.to_f64_vec())
        };
        assert_eq!(run(false, true).unwrap(), vec![-1.0, -2.0]);
        assert_eq!(run(true, false).unwrap(), vec![1.0, 2.0]);
        assert!(run(true, true).is_err());
    }
}
