//! Extraction: one e-node per needed class, minimising the DAG cost (a class shared by several users counts
//! once) on the target's roofline.
//!
//! The algorithm is greedy-DAG (as in extraction-gym's `greedy-dag`): each candidate node's cost is the sum
//! over the set of classes its choice reaches, iterated to a fixpoint by a worklist (a class is revisited
//! when a child's choice changes). Sets are bitsets over the dense class index, so a visit costs
//! O(nodes x classes / 64); cyclic choices are rejected because a class may not reach itself. A second pass
//! switches all the projections of a multi-output node together (see `improve_multi_output`). We chose greedy-DAG over ILP (egg's `lp` feature, CBC) because it needs no solver library, runs
//! in well under a second on BERT-sized e-graphs, and the choices in mlopt's e-graphs are local (a node and
//! its rewritten forms), where greedy-DAG finds the optimum; kernel boundaries are decided afterwards by the
//! fusion pass (see `fuse`), whose costs would make an ILP non-linear anyway.

use crate::lang::{EGraph, Head, MNode};
use egg::Id;
use mlopt_cost::{standalone, Cost};
use mlopt_ir::TensorType;
use mlopt_target::Target;
use std::collections::HashMap;

/// The standalone cost of `n` (as its own kernel): leaves, projections and absent inputs are free.
pub fn node_cost(eg: &EGraph, n: &MNode, outs: &[TensorType], t: &Target, o: &Options) -> Cost {
    let Head::Op(k) = &n.head else {
        return Cost::ZERO;
    };
    if outs.is_empty() {
        return Cost::INFINITY;
    }
    if crate::fuse::is_view(&k.op) {
        return Cost::ZERO;
    }
    let ins: Vec<Option<&TensorType>> = n.children.iter().map(|c| eg[*c].data.ty()).collect();
    let fp32_matrix = crate::rules::precision::lowerable_op(&k.op)
        && ins
            .first()
            .copied()
            .flatten()
            .is_some_and(|t| t.dtype == mlopt_ir::DType::F32);
    let penalty = if o.force_low && fp32_matrix {
        Cost::secs(FORCED_PENALTY_S)
    } else {
        Cost::ZERO
    };
    // A widening product's f32 result is priced at its operands' width: it feeds an epilogue in its
    // own kernel, usually, and where fusion stores it the optimiser extracts again with it rounded
    // first (`narrow_stores`). Priced at f32, the rounded form won in memory-bound kernels, and
    // EfficientNet's depthwise convolutions ran the two roundings' arithmetic in every epilogue.
    let narrowed: Vec<TensorType>;
    let outs = match ins.first().copied().flatten() {
        Some(a) if crate::rules::precision::widening_product(eg, n, outs) => {
            narrowed = outs
                .iter()
                .map(|t| TensorType::new(a.dtype, t.shape.clone()))
                .collect();
            &narrowed[..]
        }
        _ => outs,
    };
    let e = standalone(&k.op, &ins, outs, t, o.allow_tf32);
    // A cast is elementwise and fuses into the kernel producing or consuming it (`fuse.rs`): charged as
    // a pass over memory of its own, the casts around a bf16 operation made `--precision auto` keep
    // RegNetY's 1x1 convolutions after a squeeze-excitation in fp32, 1.10x slower than bf16. Its
    // arithmetic and a kernel's fixed cost still count, so a plan with fewer casts wins a tie.
    if matches!(k.op, mlopt_ir::Op::Cast { .. }) || integer_epilogue(eg, n, 0) {
        return Cost::secs(e.compute_s + t.roof().launch_s) + penalty;
    }
    // Ties between memory-bound forms (`x / c` and `x * (1 / c)` move the same bytes) go to the one with
    // less arithmetic: it is what they cost once fused into a kernel whose memory is paid elsewhere (the
    // quantize step in every epilogue of a QDQ model divided, at a fifth of a multiply's rate).
    e.time + Cost::secs(e.compute_s * ARITHMETIC_TIE_BREAK) + penalty
}

/// Whether `n` is a step of an integer contraction's epilogue as `rules/quant.rs` writes it, `f32(sum) *
/// scale + bias`: a multiply or add whose first operand's class holds the cast of an i32 product (or,
/// for the add, such a multiply). Fusion puts it in the product's kernel, where it costs its arithmetic
/// only: charged as passes over memory of their own, the scale and bias made ResNet-50's 1x1
/// convolutions of 64 to 256 channels (little arithmetic per output) stay in float.
fn integer_epilogue(eg: &EGraph, n: &MNode, depth: u32) -> bool {
    use mlopt_ir::{Binary, Op};
    let (Some(Op::Binary(Binary::Mul | Binary::Add)), Some(&x)) = (n.as_op(), n.children.first())
    else {
        return false;
    };
    let product = |c: Id| {
        eg[c].nodes.iter().any(|m| {
            matches!(m.as_op(), Some(Op::Conv(_) | Op::MatMul | Op::Gemm { .. }))
                && eg[c]
                    .data
                    .ty()
                    .is_some_and(|t| t.dtype == mlopt_ir::DType::I32)
        })
    };
    eg[x].nodes.iter().any(|m| match m.as_op() {
        Some(Op::Cast {
            to: mlopt_ir::DType::F32,
        }) => m.children.first().is_some_and(|&c| product(c)),
        Some(Op::Binary(Binary::Mul)) if depth == 0 => integer_epilogue(eg, m, 1),
        _ => false,
    })
}

/// The share of an op's arithmetic time added to its roofline time, which breaks ties between forms
/// bound by the same memory traffic without reordering any whose times differ.
const ARITHMETIC_TIE_BREAK: f64 = 1e-3;

/// `--precision bf16|fp16` forces lowering: an fp32 matrix op costs this much more than its estimate, so the
/// lowered form wins wherever the e-graph has one (ops held in fp32 have no alternative and keep it).
const FORCED_PENALTY_S: f64 = 1.0;

/// Extraction options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// fp32 matrix ops may use tf32 tensor cores.
    pub allow_tf32: bool,
    /// Prefer low-precision matrix ops regardless of cost.
    pub force_low: bool,
    /// Classes (canonical ids) whose narrow product must round before it is stored: their widening
    /// form (`conv(cast<bf16> x, cast<bf16> w, f32 bias)`, see `rules::precision`) is not taken, so
    /// the value leaves its kernel in half the bytes. Set by the optimiser after fusion shows which
    /// such values go to memory.
    pub narrow_stores: std::collections::HashSet<Id>,
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

/// The most classes whose greedy-DAG choice is computed exactly: each class keeps the set of classes
/// below it, `n` bits, so time and memory grow as `n^2` (the zoo's e-graphs have under 1,000 classes; an
/// 80,000-node chain needed 800 MB and 8 s). Above it each class adds its children's costs as a tree
/// (linear, blind to sharing).
pub const DAG_CLASSES: usize = 16_384;

/// A tree cost's ceiling: sums over a DAG's paths grow exponentially, and an infinite cost means "no
/// choice".
const TREE_CAP: f64 = 1e300;

/// A choice of one node per needed class, and its DAG cost.
pub type Choice = (HashMap<Id, MNode>, Cost);

/// Picks one node per class reachable from `roots`: the greedy-DAG choice, and when it differs, the choice
/// with multi-output nodes switched in (see `improve_multi_output`). The caller keeps whichever fuses into
/// the cheaper plan, since kernel boundaries can change which is better.
pub fn extract(eg: &EGraph, roots: &[Id], t: &Target, o: &Options) -> Vec<Choice> {
    let classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    let index: HashMap<Id, usize> = classes.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let n = classes.len();
    let own: Vec<Vec<Cost>> = classes
        .iter()
        .map(|c| {
            eg[*c]
                .nodes
                .iter()
                .map(|nd| {
                    if o.narrow_stores.contains(c)
                        && crate::rules::precision::widening_product(eg, nd, &eg[*c].data.types)
                    {
                        return Cost::INFINITY;
                    }
                    node_cost(eg, nd, &eg[*c].data.types, t, o)
                })
                .collect()
        })
        .collect();
    let exact = n <= DAG_CLASSES;
    let mut best: Vec<Option<(usize, Cost, Option<Bits>)>> = vec![None; n];
    let mut cur_cost = vec![Cost::INFINITY; n];
    // A worklist: a class is revisited when one of its children's choices changed.
    let mut queue: std::collections::VecDeque<usize> = (0..n).collect();
    let mut queued = vec![true; n];
    let mut budget = 64 * n.max(1);
    while let Some(ci) = queue.pop_front() {
        queued[ci] = false;
        budget -= 1;
        if budget == 0 {
            break;
        }
        let c = classes[ci];
        let mut changed = false;
        for (ni, node) in eg[c].nodes.iter().enumerate() {
            let mut set = exact.then(|| Bits::new(n));
            let mut tree = Cost::ZERO;
            let mut ok = true;
            for ch in &node.children {
                let i = index[&eg.find(*ch)];
                match &best[i] {
                    Some((_, t, s)) if i != ci && s.as_ref().is_none_or(|s| !s.get(ci)) => {
                        if let (Some(set), Some(s)) = (&mut set, s) {
                            set.or(s);
                            set.set(i);
                        }
                        tree = tree + *t;
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
            let total = match &set {
                Some(set) => own[ci][ni] + set.ones().map(|i| cur_cost[i]).sum::<Cost>(),
                None if own[ci][ni].is_infinite() => Cost::INFINITY,
                None => (own[ci][ni] + tree).min(Cost::secs(TREE_CAP)),
            };
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
        if changed {
            for p in eg[c].parents() {
                let pi = index[&eg.find(p)];
                if !queued[pi] {
                    queued[pi] = true;
                    queue.push_back(pi);
                }
            }
        }
    }
    let greedy: Vec<Option<usize>> = best.iter().map(|b| b.as_ref().map(|b| b.0)).collect();
    let roots: Vec<usize> = roots.iter().map(|r| index[&eg.find(*r)]).collect();
    let mut improved = greedy.clone();
    // (A DAG cost per multi-output node: quadratic too.)
    if exact {
        improve_multi_output(eg, &classes, &index, &own, &roots, &mut improved);
    }
    let mut out = vec![materialise(eg, &classes, &index, &own, &roots, &greedy)];
    if improved != greedy {
        out.push(materialise(eg, &classes, &index, &own, &roots, &improved));
    }
    out
}

/// The chosen node of every class reachable from `roots`, and the DAG cost.
fn materialise(
    eg: &EGraph,
    classes: &[Id],
    index: &HashMap<Id, usize>,
    own: &[Vec<Cost>],
    roots: &[usize],
    pick: &[Option<usize>],
) -> Choice {
    let mut choice = HashMap::new();
    let cost = dag_cost(eg, classes, index, own, roots, pick).unwrap_or(Cost::INFINITY);
    let mut stack: Vec<usize> = roots.to_vec();
    while let Some(i) = stack.pop() {
        let c = classes[i];
        if choice.contains_key(&c) {
            continue;
        }
        let Some(ni) = pick[i] else { continue };
        let node = eg[c].nodes[ni].clone();
        stack.extend(node.children.iter().map(|x| index[&eg.find(*x)]));
        choice.insert(c, node);
    }
    (choice, cost)
}

/// The DAG cost of the choice `pick` from `roots`: each reachable class's chosen node once; `None` on a
/// cycle or a class without a choice.
fn dag_cost(
    eg: &EGraph,
    classes: &[Id],
    index: &HashMap<Id, usize>,
    own: &[Vec<Cost>],
    roots: &[usize],
    pick: &[Option<usize>],
) -> Option<Cost> {
    // 0 = unseen, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; classes.len()];
    let mut total = Cost::ZERO;
    let mut stack: Vec<(usize, bool)> = roots.iter().map(|r| (*r, false)).collect();
    while let Some((i, leaving)) = stack.pop() {
        if leaving {
            state[i] = 2;
            continue;
        }
        match state[i] {
            2 => continue,
            1 => return None,
            _ => {}
        }
        state[i] = 1;
        let ni = pick[i]?;
        total = total + own[i][ni];
        stack.push((i, true));
        for ch in &eg[classes[i]].nodes[ni].children {
            let j = index[&eg.find(*ch)];
            match state[j] {
                1 => return None,
                0 => stack.push((j, false)),
                _ => {}
            }
        }
    }
    Some(total)
}

/// Greedy choice is per class, so it never takes a multi-output node (a merged MatMul and its Split) whose
/// cost pays off only when all its projections are taken together. For each such node, try switching all
/// the classes that hold one of its projections at once, and keep the switch when the DAG cost drops.
fn improve_multi_output(
    eg: &EGraph,
    classes: &[Id],
    index: &HashMap<Id, usize>,
    own: &[Vec<Cost>],
    roots: &[usize],
    pick: &mut [Option<usize>],
) {
    let mut groups: std::collections::BTreeMap<Id, Vec<(usize, usize)>> = Default::default();
    for (i, c) in classes.iter().enumerate() {
        for (ni, n) in eg[*c].nodes.iter().enumerate() {
            if matches!(n.head, Head::Proj(_)) {
                groups
                    .entry(eg.find(n.children[0]))
                    .or_default()
                    .push((i, ni));
            }
        }
    }
    let Some(mut current) = dag_cost(eg, classes, index, own, roots, pick) else {
        return;
    };
    for members in groups.values() {
        let mut trial = pick.to_vec();
        for &(i, ni) in members {
            trial[i] = Some(ni);
        }
        if let Some(c) = dag_cost(eg, classes, index, own, roots, &trial) {
            if c < current {
                current = c;
                pick.copy_from_slice(&trial);
            }
        }
    }
}
