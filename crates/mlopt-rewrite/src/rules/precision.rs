//! Precision lowering: MatMul, Gemm, Conv and Attention in bf16 or f16 with fp32 accumulation (their
//! inputs cast down, their output cast back up; attention's scores and softmax stay f32 inside it, as
//! FlashAttention computes them), and the casts pushed through layout ops and ReLU and cancelled where a
//! value is narrowed right after being widened. Softmax, normalisations, reductions and exp/log/pow have
//! no rule: they stay fp32 (PyTorch autocast's fp32 list).

use super::{add, ops, scan, ty};
use crate::lang::{EGraph, Rewrite};
use egg::Id;
use mlopt_ir::{DType, Op, Unary};

pub fn rules(lo: DType) -> Vec<Rewrite> {
    let n = lo.name();
    vec![
        scan(
            &format!("lower-matrix-{n}"),
            move |eg, id| !lowerable(eg, id).is_empty(),
            move |eg, id| {
                lowerable(eg, id)
                    .into_iter()
                    .filter_map(|(op, ch)| lower(eg, op, ch, lo))
                    .collect()
            },
        ),
        scan(
            "cast-roundtrip",
            |eg, id| !roundtrips(eg, id).is_empty(),
            |eg, id| roundtrips(eg, id),
        ),
        scan(
            "cast-through-layout",
            |eg, id| !cast_over_layout(eg, id).is_empty(),
            |eg, id| {
                cast_over_layout(eg, id)
                    .into_iter()
                    .filter_map(|(cast, layout, x)| {
                        let c = add(eg, cast, vec![x])?;
                        add(eg, layout, vec![c])
                    })
                    .collect()
            },
        ),
        scan(
            "cast-through-concat",
            |eg, id| !cast_over_concat(eg, id).is_empty(),
            |eg, id| {
                cast_over_concat(eg, id)
                    .into_iter()
                    .filter_map(|(cast, concat, xs)| {
                        let cs = xs
                            .into_iter()
                            .map(|x| add(eg, cast.clone(), vec![x]))
                            .collect::<Option<Vec<Id>>>()?;
                        add(eg, concat, cs)
                    })
                    .collect()
            },
        ),
        scan(
            "cast-through-maxpool",
            |eg, id| !cast_over_max(eg, id).is_empty(),
            |eg, id| {
                cast_over_max(eg, id)
                    .into_iter()
                    .filter_map(|(cast, pool, x, tuple)| {
                        let c = add(eg, cast, vec![x])?;
                        let p = add(eg, pool, vec![c])?;
                        Some(if tuple { super::proj(eg, p, 0) } else { p })
                    })
                    .collect()
            },
        ),
        scan(
            "relu-through-widening",
            |eg, id| !relu_over_widen(eg, id).is_empty(),
            |eg, id| {
                relu_over_widen(eg, id)
                    .into_iter()
                    .filter_map(|(y, to)| {
                        let r = add(eg, Op::Unary(Unary::Relu), vec![y])?;
                        add(eg, Op::Cast { to }, vec![r])
                    })
                    .collect()
            },
        ),
    ]
}

/// The ops precision lowering applies to: the matrix ops and attention.
pub fn lowerable_op(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul | Op::Gemm { .. } | Op::Conv(_) | Op::Attention { .. }
    )
}

/// Whether `n` is a narrow (bf16, f16) product with an f32 result: the widening form `lower` writes
/// for a Gemm or Conv with a bias.
pub fn widening_product(
    eg: &EGraph,
    n: &crate::lang::MNode,
    outs: &[mlopt_ir::TensorType],
) -> bool {
    let crate::lang::Head::Op(k) = &n.head else {
        return false;
    };
    lowerable_op(&k.op)
        && outs.first().is_some_and(|t| t.dtype == DType::F32)
        && n.children
            .first()
            .and_then(|c| ty(eg, *c))
            .is_some_and(|t| t.dtype.is_half())
}

/// fp32 matrix ops of class `id`.
fn lowerable(eg: &EGraph, id: Id) -> Vec<(Op, Vec<Id>)> {
    if eg
        .analysis
        .keep_fp32
        .iter()
        .any(|k| eg.find(*k) == eg.find(id))
    {
        return vec![];
    }
    ops(eg, id)
        .into_iter()
        .filter(|(o, c)| lowerable_op(o) && ty(eg, c[0]).is_some_and(|t| t.dtype == DType::F32))
        .collect()
}

/// `cast<f32>(op(cast<lo> inputs...))`; absent optional inputs stay absent. A Gemm or Conv with a bias
/// also gets the form whose bias stays f32 and whose output is f32 itself (`op(cast<lo> a, cast<lo> b,
/// bias)`): the product accumulates in f32 and the sum is rounded once, by whatever narrows it later,
/// not once more between the op and its epilogue. Extraction picks: the first form stores a result
/// that goes to memory in half the bytes, the second is the more accurate where both cost the same.
fn lower(eg: &mut EGraph, op: Op, ch: Vec<Id>, lo: DType) -> Option<Id> {
    let biased = matches!(op, Op::Gemm { .. } | Op::Conv(_))
        && ch.get(2).is_some_and(|&b| !eg[b].data.types.is_empty());
    let mut low = vec![];
    for c in &ch {
        low.push(if eg[*c].data.types.is_empty() {
            *c
        } else {
            add(eg, Op::Cast { to: lo }, vec![*c])?
        });
    }
    let y = add(eg, op.clone(), low.clone())?;
    let rounded = add(eg, Op::Cast { to: DType::F32 }, vec![y])?;
    if biased {
        low[2] = ch[2];
        let wide = add(eg, op, low)?;
        eg.union(wide, rounded);
    }
    Some(rounded)
}

/// An f32 value that is narrowed to `lo` for some readers (a bf16 convolution's input) and read in f32
/// by others (the residual add of the next block) is stored once, narrow: the f32 readers read the narrow
/// copy widened. Without this, its kernel stores it in f32 and a kernel of its own narrows it (a kernel
/// has one output), three passes over memory of 4, 4 + 2 and 4 bytes an element where one of 2 does:
/// ResNet-50's residual stream at batch 8 spent 2 ms an image there. The f32 readers see it rounded to
/// `lo`, as a bf16 convolution's result is everywhere (oneDNN's, OpenVINO's). Only such results: values
/// computed by elementwise ops from a narrow product, which leave their kernel narrow or are rounded
/// where they are stored. A transformer's LayerNorm output (read by the next MatMul, narrowed, and by
/// the residual add) stays f32, as OpenVINO keeps it: rounded, BERT-base's error grew 2.5x. A rewrite
/// of the extracted graph, not an e-graph rule: the value and its rounding are not equal, so no e-class
/// may hold both. Graph outputs, inputs and constants keep their f32.
pub fn narrow_shared(g: &mut mlopt_ir::Graph, lo: DType) -> mlopt_ir::Result<()> {
    let returned: std::collections::HashSet<mlopt_ir::NodeId> =
        g.graph_outputs().iter().map(|(_, v)| v.node).collect();
    let ids: Vec<mlopt_ir::NodeId> = g.node_ids().collect();
    for n in ids {
        let node = g.node(n);
        if node.outputs.len() != 1
            || node.outputs[0].dtype != DType::F32
            || matches!(node.op, Op::Input | Op::Const(_))
            || crate::fuse::is_view(&node.op)
            || returned.contains(&n)
            || !from_narrow_product(g, n)
        {
            continue;
        }
        let users = g.users(n);
        let narrowing = |u: mlopt_ir::NodeId| matches!(g.node(u).op, Op::Cast { to } if to == lo);
        let Some(cast) = users.iter().map(|u| u.0).find(|&u| narrowing(u)) else {
            continue;
        };
        if users.iter().all(|u| narrowing(u.0)) {
            continue;
        }
        let narrow = mlopt_ir::Value {
            node: cast,
            output: 0,
        };
        let wide = g.add(Op::Cast { to: DType::F32 }, "", &[narrow])?;
        let v = mlopt_ir::Value { node: n, output: 0 };
        g.replace_reads(v, wide, |u| u != cast);
    }
    Ok(())
}

/// A widening cast of a narrow value read by several ops that can compute it inside their own kernels
/// is computed by each of them: the narrow value is then what goes to memory, half the bytes. Shared,
/// the cast joined its producer's kernel (its one reader) and the value was stored in f32: each of
/// DenseNet-121's growth convolutions, read by the concatenations of every later layer of its block.
pub fn widen_per_reader(g: &mut mlopt_ir::Graph) -> mlopt_ir::Result<()> {
    let returned: std::collections::HashSet<mlopt_ir::NodeId> =
        g.graph_outputs().iter().map(|(_, v)| v.node).collect();
    let ids: Vec<mlopt_ir::NodeId> = g.node_ids().collect();
    for n in ids {
        let Op::Cast { to: DType::F32 } = g.node(n).op else {
            continue;
        };
        let Some(x) = g.inputs(n)[0] else { continue };
        if !g.value_type(x).dtype.is_half() || returned.contains(&n) {
            continue;
        }
        let mut readers: Vec<mlopt_ir::NodeId> = g.users(n).into_iter().map(|u| u.0).collect();
        readers.sort();
        readers.dedup();
        if readers.len() < 2 || !readers.iter().all(|&u| crate::fuse::inlines_operands(g, u)) {
            continue;
        }
        let wide = mlopt_ir::Value { node: n, output: 0 };
        for &u in &readers[1..] {
            let own = g.add(Op::Cast { to: DType::F32 }, "", &[x])?;
            g.replace_reads(wide, own, |r| r == u);
        }
    }
    Ok(())
}

/// Whether node `n` of `g` is a lowered matrix op: a bf16 or f16 product, rounded (a narrow result,
/// the next fp32 cast carrying the original op's name) or widening (an f32 result with the name).
pub fn narrow_product(g: &mlopt_ir::Graph, n: mlopt_ir::NodeId) -> bool {
    lowerable_op(&g.node(n).op)
        && g.input_types(n)
            .first()
            .copied()
            .flatten()
            .is_some_and(|t| t.dtype.is_half())
}

/// Whether `n` is computed by elementwise ops (an epilogue) from a narrow product: a matrix op whose
/// operands are bf16 or f16. Looks through at most 32 elementwise ops.
fn from_narrow_product(g: &mlopt_ir::Graph, n: mlopt_ir::NodeId) -> bool {
    let mut stack = vec![n];
    let mut seen = std::collections::HashSet::new();
    while let Some(m) = stack.pop() {
        if !seen.insert(m) || seen.len() > 32 {
            continue;
        }
        if narrow_product(g, m) {
            return true;
        }
        if g.node(m).op.is_elementwise() {
            stack.extend(g.inputs(m).into_iter().flatten().map(|v| v.node));
        }
    }
    false
}

/// `cast<lo>(cast<wide>(y))` where y is lo and wide holds every lo value exactly: y.
fn roundtrips(eg: &EGraph, id: Id) -> Vec<Id> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        let Op::Cast { to: lo } = o else { continue };
        for (o2, c2) in ops(eg, c[0]) {
            let Op::Cast { to: wide } = o2 else { continue };
            let exact = matches!(
                (lo, wide),
                (DType::BF16 | DType::F16, DType::F32 | DType::F64) | (DType::F32, DType::F64)
            );
            if exact && ty(eg, c2[0]).is_some_and(|t| t.dtype == lo) {
                out.push(c2[0]);
            }
        }
    }
    out
}

/// `cast(layout(x))` for transposes and reshapes: (cast, layout, x).
fn cast_over_layout(eg: &EGraph, id: Id) -> Vec<(Op, Op, Id)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        if !matches!(o, Op::Cast { .. }) {
            continue;
        }
        for (l, lc) in ops(eg, c[0]) {
            if matches!(l, Op::Transpose { .. } | Op::Reshape { .. }) {
                out.push((o.clone(), l, lc[0]));
            }
        }
    }
    out
}

/// `cast(concat(xs..))`: (cast, concat, xs). A cast is elementwise, so it commutes with joining its
/// inputs; pushed into them, a concat of bf16 values (ReLUs of widened bf16, say) stays bf16.
fn cast_over_concat(eg: &EGraph, id: Id) -> Vec<(Op, Op, Vec<Id>)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        if !matches!(o, Op::Cast { .. }) {
            continue;
        }
        for (cat, xs) in ops(eg, c[0]) {
            if matches!(cat, Op::Concat { .. }) {
                out.push((o.clone(), cat, xs));
            }
        }
    }
    out
}

/// `cast(maxpool(x))` between float types, of a max pool's values (a MaxPool class is a tuple of values
/// and indices: its output 0): (cast, pool, x, whether the pool is a tuple). Rounding is monotone, so
/// the maximum of the rounded values is the rounded maximum, and -inf padding stays -inf: a narrowing
/// cast moves before the pool, which then reads half the bytes.
fn cast_over_max(eg: &EGraph, id: Id) -> Vec<(Op, Op, Id, bool)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        let Op::Cast { to } = o else { continue };
        // The pool's class: the cast's input, or the tuple its output 0 projects.
        let mut pools: Vec<(Id, bool)> = vec![(c[0], false)];
        pools.extend(
            eg[c[0]]
                .nodes
                .iter()
                .filter(|n| n.head == crate::lang::Head::Proj(0))
                .map(|n| (n.children[0], true)),
        );
        for (class, tuple) in pools {
            for (pool, pc) in ops(eg, class) {
                let from = ty(eg, pc[0]).map(|t| t.dtype);
                if matches!(pool, Op::MaxPool { .. } | Op::GlobalMaxPool)
                    && pc.len() == 1
                    && to.is_float()
                    && from.is_some_and(DType::is_float)
                {
                    out.push((o.clone(), pool, pc[0], tuple));
                }
            }
        }
    }
    out
}

/// `relu(cast<f32>(y))` with y in a narrower float type: (y, f32). ReLU commutes with exact widening.
fn relu_over_widen(eg: &EGraph, id: Id) -> Vec<(Id, DType)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        if o != Op::Unary(Unary::Relu) {
            continue;
        }
        for (o2, c2) in ops(eg, c[0]) {
            if let Op::Cast {
                to: to @ DType::F32,
            } = o2
            {
                if ty(eg, c2[0]).is_some_and(|t| t.dtype.is_half()) {
                    out.push((c2[0], to));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
