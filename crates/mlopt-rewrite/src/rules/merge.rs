//! Multi-pattern rewrites (as in TASO and Tensat): sibling MatMul/Gemm/Conv ops that read the same input
//! with constant weights become one wider op followed by a Split, e.g. the Q, K and V projections of
//! attention or the 1x1 convolutions of an Inception block.
//! The extraction keeps the merged form only when its DAG cost is lower (one launch and one read of the
//! input against the Split's copy).

use super::{absent, add, is_const, ops, proj, scan_pairs, ty};
use crate::lang::{EGraph, Head, Rewrite};
use egg::Id;
use mlopt_ir::Op;

pub fn rules() -> Vec<Rewrite> {
    vec![
        scan_pairs(
            "merge-sibling-matmuls",
            |eg, id| siblings(eg, id).len() >= 2,
            merge,
        ),
        scan_pairs(
            "bias-through-split",
            |eg, id| split_biases(eg, id).is_some(),
            bias_through_split,
        ),
    ]
}

/// (split input, split op, per output (add class, bias)).
type SplitBiases = (Id, Op, Vec<(Id, Id)>);

/// A Split along the last axis whose every output has a constant bias of its width added (the Q, K and V
/// biases after a merged projection): the split's input, the split, and per output (add class, bias).
fn split_biases(eg: &EGraph, t: Id) -> Option<SplitBiases> {
    let t = eg.find(t);
    let (op, ch) = ops(eg, t).into_iter().find(|(o, c)| matches!(o, Op::Split { axis, .. } if ty(eg, c[0]).is_some_and(|x| x.rank() == axis + 1)))?;
    let Op::Split { sizes, .. } = &op else {
        return None;
    };
    let mut adds = vec![None; sizes.len()];
    for p in eg[t].parents() {
        let p = eg.find(p);
        let Some(i) = eg[p].nodes.iter().find_map(|n| match n.head {
            Head::Proj(i) if eg.find(n.children[0]) == t => Some(i as usize),
            _ => None,
        }) else {
            continue;
        };
        for q in eg[p].parents() {
            let q = eg.find(q);
            for (o, c) in ops(eg, q) {
                let bias = if eg.find(c.first().copied()?) == p {
                    c.get(1).copied()
                } else {
                    None
                };
                if let (Op::Binary(mlopt_ir::Binary::Add), Some(b)) = (o, bias) {
                    if is_const(eg, b)
                        && ty(eg, b).is_some_and(|bt| bt.shape == [sizes[i]])
                        && adds[i].is_none()
                    {
                        adds[i] = Some((q, b));
                    }
                }
            }
        }
    }
    let adds: Vec<(Id, Id)> = adds.into_iter().collect::<Option<_>>()?;
    // Once rewritten, the add classes hold projections of the new split: do not fire again.
    if adds
        .iter()
        .any(|(q, _)| eg[*q].nodes.iter().any(|n| matches!(n.head, Head::Proj(_))))
    {
        return None;
    }
    Some((ch[0], op.clone(), adds))
}

/// add(proj_i(split x), b_i) for all i == proj_i(split(add(x, concat(b_1..b_n)))).
fn bias_through_split(eg: &mut EGraph, t: Id) -> Vec<(Id, Id)> {
    let Some((x, split, adds)) = split_biases(eg, t) else {
        return vec![];
    };
    let build = |eg: &mut EGraph| -> Option<Vec<(Id, Id)>> {
        let bcat = add(
            eg,
            Op::Concat { axis: 0 },
            adds.iter().map(|a| a.1).collect(),
        )?;
        let y = add(eg, Op::Binary(mlopt_ir::Binary::Add), vec![x, bcat])?;
        let s = add(eg, split.clone(), vec![y])?;
        Some(
            adds.iter()
                .enumerate()
                .map(|(i, (q, _))| (*q, proj(eg, s, i)))
                .collect(),
        )
    };
    build(eg).unwrap_or_default()
}

/// A sibling: the class of `matmul x w`, `gemm x w b` (alpha = beta = 1, a not transposed) or `conv x w b`
/// (one group) reading the shared input x.
#[derive(Debug, Clone)]
struct Sibling {
    class: Id,
    op: Op,
    w: Id,
    b: Option<Id>,
}

/// Merge key: siblings with equal keys can merge. The op with its attributes (Gemm's transposition, Conv's
/// geometry), the weight's dtype and every weight dimension but the one that grows, and whether a bias is
/// present.
fn key(eg: &EGraph, s: &Sibling) -> Option<String> {
    let w = ty(eg, s.w)?;
    let mut dims = w.shape.clone();
    let grow = grow_axis(&s.op);
    if grow >= dims.len() {
        return None;
    }
    dims.remove(grow);
    Some(format!("{:?}|{}|{dims:?}|{}", s.op, w.dtype, s.b.is_some()))
}

/// The weight axis that concatenation grows: MatMul/Gemm's N (axis 1, or 0 when transposed), Conv's M.
fn grow_axis(op: &Op) -> usize {
    match op {
        Op::Gemm { trans_b: false, .. } | Op::MatMul => 1,
        _ => 0,
    }
}

/// The siblings reading class `x`, in the largest group that can merge; none once a merge happened
/// (merged classes hold a projection).
fn siblings(eg: &EGraph, x: Id) -> Vec<Sibling> {
    let x = eg.find(x);
    let mut all: Vec<Sibling> = vec![];
    for p in eg[x].parents() {
        let p = eg.find(p);
        if all.iter().any(|s| s.class == p) {
            continue;
        }
        for (op, c) in ops(eg, p) {
            let plain = match &op {
                Op::MatMul => ty(eg, c[1]).is_some_and(|t| t.rank() == 2),
                Op::Gemm {
                    alpha,
                    beta,
                    trans_a,
                    ..
                } => *alpha == 1.0 && *beta == 1.0 && !trans_a,
                Op::Conv(a) => a.group == 1,
                _ => false,
            };
            if plain && eg.find(c[0]) == x && eg.find(c[1]) != x && is_const(eg, c[1]) {
                let b = c.get(2).copied().filter(|b| !eg[*b].data.types.is_empty());
                if b.is_some_and(|b| !is_const(eg, b) || ty(eg, b).is_none_or(|t| t.rank() != 1)) {
                    continue;
                }
                all.push(Sibling {
                    class: p,
                    op: op.clone(),
                    w: c[1],
                    b,
                });
                break;
            }
        }
    }
    if all.iter().any(|s| {
        eg[s.class]
            .nodes
            .iter()
            .any(|n| matches!(n.head, Head::Proj(_)))
    }) {
        return vec![];
    }
    // The largest group with one key.
    let mut best: Vec<Sibling> = vec![];
    for s in &all {
        let k = key(eg, s);
        let group: Vec<Sibling> = all
            .iter()
            .filter(|t| key(eg, t) == k && k.is_some())
            .cloned()
            .collect();
        if group.len() > best.len() {
            best = group;
        }
    }
    best
}

fn merge(eg: &mut EGraph, x: Id) -> Vec<(Id, Id)> {
    let sib = siblings(eg, x);
    let build = |eg: &mut EGraph| -> Option<Vec<(Id, Id)>> {
        let first = sib.first()?;
        let grow = grow_axis(&first.op);
        let ns: Vec<usize> = sib
            .iter()
            .map(|s| ty(eg, s.w).map(|t| t.shape[grow]))
            .collect::<Option<_>>()?;
        let wcat = add(
            eg,
            Op::Concat { axis: grow },
            sib.iter().map(|s| s.w).collect(),
        )?;
        let (wide, axis) = match &first.op {
            Op::MatMul => {
                let wide = add(eg, Op::MatMul, vec![x, wcat])?;
                (wide, ty(eg, wide)?.rank() - 1)
            }
            op => {
                let b = match first.b {
                    Some(_) => add(
                        eg,
                        Op::Concat { axis: 0 },
                        sib.iter().filter_map(|s| s.b).collect(),
                    )?,
                    None => absent(eg),
                };
                // Gemm's output grows along its columns, Conv's along its channels: axis 1 for both.
                (add(eg, op.clone(), vec![x, wcat, b])?, 1)
            }
        };
        let split = add(eg, Op::Split { axis, sizes: ns }, vec![wide])?;
        Some(
            sib.iter()
                .enumerate()
                .map(|(i, s)| (s.class, proj(eg, split, i)))
                .collect(),
        )
    };
    build(eg).unwrap_or_default()
}
