//! Extraction: one e-node per needed class, minimising the DAG cost (a class shared by several users counts
//! once) on the target's roofline.
//!
//! The algorithm is greedy-DAG (as in extraction-gym's `greedy-dag`): each candidate node's cost is the sum
//! over the set of classes its choice reaches, iterated to a fixpoint. Sets are bitsets over the dense class
//! index, so a pass costs O(nodes x classes / 64); cyclic choices are rejected because a class may not reach
//! itself. We chose greedy-DAG over ILP (egg's `lp` feature, CBC) because it needs no solver library, runs
//! in well under a second on BERT-sized e-graphs, and the choices in mlopt's e-graphs are local (a node and
//! its rewritten forms), where greedy-DAG finds the optimum; kernel boundaries are decided afterwards by the
//! fusion pass (see `fuse`), whose costs would make an ILP non-linear anyway.

use crate::lang::{EGraph, Head, MNode};
use egg::Id;
use mlopt_cost::{estimate, op_work, Cost, Target};
use mlopt_ir::TensorType;
use std::collections::HashMap;

/// The standalone cost of `n` (as its own kernel): leaves, projections and absent inputs are free.
pub fn node_cost(eg: &EGraph, n: &MNode, outs: &[TensorType], t: &Target, o: &Options) -> Cost {
    let Head::Op(k) = &n.head else { return Cost::ZERO };
    let allow_tf32 = o.allow_tf32;
    let ins: Vec<Option<&TensorType>> = n.children.iter().map(|c| eg[*c].data.ty()).collect();
    if outs.is_empty() {
        return Cost::INFINITY;
    }
    let mut w = op_work(&k.op, &ins, outs, allow_tf32);
    if crate::fuse::is_view(&k.op) {
        return Cost::ZERO;
    }
    w.bytes = ins.iter().flatten().map(|t| t.bytes() as f64).sum::<f64>() + outs.iter().map(|t| t.bytes() as f64).sum::<f64>();
    let fp32_matrix = matches!(k.op, mlopt_ir::Op::MatMul | mlopt_ir::Op::Gemm { .. } | mlopt_ir::Op::Conv(_)) && ins.first().copied().flatten().is_some_and(|t| t.dtype == mlopt_ir::DType::F32);
    let penalty = if o.force_low && fp32_matrix { Cost::secs(FORCED_PENALTY_S) } else { Cost::ZERO };
    estimate(&w, t).time + penalty
}

/// `--precision bf16|fp16` forces lowering: an fp32 matrix op costs this much more than its estimate, so the
/// lowered form wins wherever the e-graph has one (ops held in fp32 have no alternative and keep it).
const FORCED_PENALTY_S: f64 = 1.0;

/// Extraction options.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// fp32 matrix ops may use tf32 tensor cores.
    pub allow_tf32: bool,
    /// Prefer low-precision matrix ops regardless of cost.
    pub force_low: bool,
}

#[derive(Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 == 1
    }
    fn or(&mut self, o: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a |= b;
        }
    }
    fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            let mut b = bits;
            std::iter::from_fn(move || {
                if b == 0 {
                    return None;
                }
                let i = b.trailing_zeros() as usize;
                b &= b - 1;
                Some(w * 64 + i)
            })
        })
    }
}

/// Picks one node per class reachable from `roots`; returns the choice and its DAG cost.
pub fn extract(eg: &EGraph, roots: &[Id], t: &Target, o: &Options) -> (HashMap<Id, MNode>, Cost) {
    let classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    let index: HashMap<Id, usize> = classes.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let n = classes.len();
    let own: Vec<Vec<Cost>> = classes.iter().map(|c| eg[*c].nodes.iter().map(|nd| node_cost(eg, nd, &eg[*c].data.types, t, o)).collect()).collect();
    let mut best: Vec<Option<(usize, Cost, Bits)>> = vec![None; n];
    let mut cur_cost = vec![Cost::INFINITY; n];
    for _pass in 0..50 {
        let mut changed = false;
        for (ci, c) in classes.iter().enumerate() {
            for (ni, node) in eg[*c].nodes.iter().enumerate() {
                let mut set = Bits::new(n);
                let mut ok = true;
                for ch in &node.children {
                    let i = index[&eg.find(*ch)];
                    match &best[i] {
                        Some((_, _, s)) if !s.get(ci) && i != ci => {
                            set.or(s);
                            set.set(i);
                        }
                        _ => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    continue;
                }
                let total = own[ci][ni] + set.ones().map(|i| cur_cost[i]).sum::<Cost>();
                let better = match &best[ci] {
                    None => true,
                    Some((bi, bc, _)) => total < *bc || (*bi == ni && total != *bc),
                };
                if better && !total.is_infinite() {
                    best[ci] = Some((ni, total, set));
                    cur_cost[ci] = own[ci][ni];
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut choice = HashMap::new();
    let mut total_set = Bits::new(n);
    let mut stack: Vec<Id> = roots.iter().map(|r| eg.find(*r)).collect();
    while let Some(c) = stack.pop() {
        if choice.contains_key(&c) {
            continue;
        }
        let i = index[&c];
        let Some((ni, _, _)) = &best[i] else { continue };
        total_set.set(i);
        let node = eg[c].nodes[*ni].clone();
        stack.extend(node.children.iter().map(|x| eg.find(*x)));
        choice.insert(c, node);
    }
    let cost = total_set.ones().map(|i| cur_cost[i]).sum();
    (choice, cost)
}
