//! The order kernels run in and the conditions their calls are made under: one answer for the memory
//! planner and the program.
//!
//! A kernel's guard is what all its members are needed under (`mlopt_ir::demand::kernel_guards`: the
//! conditions of the `If`s decided at run time that it lies inside; empty for almost every kernel). Kernels run in
//! their first root's topological order, except that a guarded kernel waits for the kernels that
//! compute its conditions (the topological order does not, since a branch does not read its
//! condition): among the kernels whose inputs are ready, the earliest in that order runs first.

use crate::error::{LowerError, Result};
use mlopt_ir::demand::{kernel_guards, Guard};
use mlopt_ir::{Graph, KernelNodes, NodeId};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// One kernel of the plan, in execution order.
#[derive(Debug, Clone)]
pub struct Ordered {
    pub id: u32,
    pub nodes: KernelNodes,
    /// The call is made only when every literal holds.
    pub guard: Guard,
}

/// The kernels of a fused graph in execution order, each with its guard.
pub fn execution_order(g: &Graph) -> Result<Vec<Ordered>> {
    let order = g.topo_order()?;
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut guards = kernel_guards(g)?;
    let kernels: Vec<Ordered> = g
        .kernels()
        .into_iter()
        .filter(|(_, k)| !k.roots.is_empty())
        .map(|(id, nodes)| Ordered {
            id,
            nodes,
            guard: guards.remove(&id).unwrap_or_default(),
        })
        .collect();
    let index: HashMap<u32, usize> = kernels.iter().enumerate().map(|(i, k)| (k.id, i)).collect();
    let producer = |n: NodeId| g.node(n).kernel.and_then(|k| index.get(&k).copied());
    // What each kernel waits for: the kernels of the values it reads and of its conditions.
    let mut waits = vec![0usize; kernels.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); kernels.len()];
    for (i, k) in kernels.iter().enumerate() {
        let reads = k
            .nodes
            .members
            .iter()
            .flat_map(|m| g.inputs(*m).into_iter().flatten());
        let deps: BTreeSet<usize> = reads
            .chain(k.guard.iter().map(|l| l.cond))
            .filter_map(|v| producer(v.node))
            .filter(|&d| d != i)
            .collect();
        waits[i] = deps.len();
        for d in deps {
            readers[d].push(i);
        }
    }
    let first_root = |i: usize| pos[&kernels[i].nodes.roots[0]];
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = (0..kernels.len())
        .filter(|&i| waits[i] == 0)
        .map(|i| Reverse((first_root(i), i)))
        .collect();
    let mut out = Vec::with_capacity(kernels.len());
    while let Some(Reverse((_, i))) = ready.pop() {
        out.push(i);
        for &r in &readers[i] {
            waits[r] -= 1;
            if waits[r] == 0 {
                ready.push(Reverse((first_root(r), r)));
            }
        }
    }
    if out.len() != kernels.len() {
        return Err(LowerError::Internal(
            "the kernels and their conditions form a cycle".into(),
        ));
    }
    let mut slots: Vec<Option<Ordered>> = kernels.into_iter().map(Some).collect();
    Ok(out.into_iter().filter_map(|i| slots[i].take()).collect())
}
