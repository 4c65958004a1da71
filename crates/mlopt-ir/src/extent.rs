//! Values whose size depends on the data. mlopt compiles static shapes, so an op whose output size
//! depends on its input's values (`Op::counts`: NonZero, Compress, NonMaxSuppression) computes its
//! output at a static bound, along one axis: the first `count` entries along it are the values, the
//! rest zeros, and the count is the op's last output (an i64 scalar).
//!
//! That is exact for every value computed from it whose entry `i` along the axis depends only on the
//! input's entry `i` (an elementwise op, a transpose, a gather of those rows, a matrix product with
//! them as rows): its first `count` entries are what ONNX computes, whatever the padding holds.
//! `extents` follows such values through the graph and refuses every other use (a reduction over the
//! axis, a reshape that mixes it, a size read from it), naming the node, the op and the input. A graph
//! output of such a value comes with its count as an output of its own (`expose_counts`), named after
//! it: `<name>.count`.
//!
//! The padding is zeros, and stays harmless where a consumer checks its data: indices read by a
//! gather are in range whenever the gathered axis is not empty (checked), and an integer division by
//! such a value is refused (its zeros would raise an error the real run does not).

use crate::{Binary, Graph, IrError, NodeId, Op, Result, TensorType, Value};
use std::collections::HashMap;

/// A value's axis whose size is `count` at run time (an i64 scalar value), its static size the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub axis: usize,
    pub count: Value,
}

/// The outputs of an op of `Op::counts` that are data-sized, each with its axis (the count is the
/// op's last output).
pub fn counted_axes(op: &Op) -> Vec<(u32, usize)> {
    match op {
        Op::NonZero => vec![(0, 1)],
        Op::Compress { axis } => vec![(0, *axis)],
        Op::NonMaxSuppression { .. } => vec![(0, 0)],
        // The inverse indices (output 2) have the input's size.
        Op::Unique { axis, .. } => vec![(0, *axis), (1, 0), (3, 0)],
        _ => vec![],
    }
}

/// Every value whose size along an axis depends on the data, or an error naming the first node that
/// uses such a value in a way the bound cannot stand in for.
pub fn extents(g: &Graph) -> Result<HashMap<Value, Extent>> {
    let mut ext: HashMap<Value, Extent> = HashMap::new();
    for n in g.topo_order()? {
        visit(g, n, &mut ext)?;
    }
    Ok(ext)
}

/// `extents` of a graph that only grows, each node added after its inputs (the importer's, which asks
/// after every node that reads a size): each `update` looks at the nodes added since the last one
/// only, so asking after each of n nodes costs O(n), not O(n^2).
#[derive(Debug, Default)]
pub struct Growing {
    ext: HashMap<Value, Extent>,
    /// Nodes with a lower index have been looked at.
    next: usize,
}

impl Growing {
    pub fn update(&mut self, g: &Graph) -> Result<&HashMap<Value, Extent>> {
        let added: Vec<NodeId> = g.node_ids().filter(|n| n.index() >= self.next).collect();
        for &n in &added {
            visit(g, n, &mut self.ext)?;
            self.next = self.next.max(n.index() + 1);
        }
        Ok(&self.ext)
    }
}

/// Adds the data-sized outputs of node `n` to `ext` (its inputs' already there), or an error naming
/// it where it uses a data-sized input in a way the bound cannot stand in for.
fn visit(g: &Graph, n: NodeId, ext: &mut HashMap<Value, Extent>) -> Result<()> {
    let node = g.node(n);
    let ins = g.inputs(n);
    let sized: Vec<(usize, Extent)> = ins
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.and_then(|v| ext.get(&v)).map(|e| (i, *e)))
        .collect();
    let refuse = |input: Option<usize>, msg: String| IrError::Infer {
        node: node.name.clone(),
        op: node.op.name(),
        input,
        msg,
    };
    if node.op.counts() {
        if let Some(&(i, _)) = sized.first() {
            return Err(refuse(
                Some(i),
                "its size already depends on the data (mlopt computes one data-sized op's \
                 output at a bound, not one such op of another's)"
                    .into(),
            ));
        }
        let count = Value {
            node: n,
            output: node.outputs.len() as u32 - 1,
        };
        for (output, axis) in counted_axes(&node.op) {
            ext.insert(Value { node: n, output }, Extent { axis, count });
        }
        return Ok(());
    }
    let Some(&(first, e)) = sized.first() else {
        return Ok(());
    };
    if let Some(&(i, _)) = sized.iter().find(|(_, o)| o.count != e.count) {
        return Err(refuse(
            Some(i),
            format!(
                "its size depends on other data than input {first}'s (mlopt cannot tell \
                 that the two agree)"
            ),
        ));
    }
    let types: Vec<Option<&TensorType>> = ins.iter().map(|v| v.map(|v| g.value_type(v))).collect();
    let axis = through(&node.op, &types, &node.outputs, &sized).map_err(|(i, m)| refuse(i, m))?;
    for k in 0..node.outputs.len() {
        let v = Value {
            node: n,
            output: k as u32,
        };
        ext.insert(
            v,
            Extent {
                axis,
                count: e.count,
            },
        );
    }
    Ok(())
}

type Why = (Option<usize>, String);

/// The axis of `op`'s outputs that is data-sized, given its inputs' (`sized`: input slot and extent).
fn through(
    op: &Op,
    ins: &[Option<&TensorType>],
    outs: &[TensorType],
    sized: &[(usize, Extent)],
) -> std::result::Result<usize, Why> {
    let (i, a) = (sized[0].0, sized[0].1.axis);
    let rank = |k: usize| ins.get(k).copied().flatten().map_or(0, |t| t.rank());
    let dim = |k: usize, d: usize| ins.get(k).copied().flatten().map_or(0, |t| t.shape[d]);
    let r = outs.first().map_or(0, |t| t.rank());
    let why = |m: &str| {
        (
            Some(i),
            format!("its axis {a} has a size that depends on the data; {m}"),
        )
    };
    let only = |k: usize| {
        if sized.iter().all(|s| s.0 == k) {
            Ok(())
        } else {
            Err(why(
                "so must be the op's other inputs' sizes, which mlopt does not follow here",
            ))
        }
    };
    let keep = |taken: bool| {
        if taken {
            Err(why("the op works across that axis"))
        } else {
            Ok(a)
        }
    };
    match op {
        Op::Binary(Binary::Div | Binary::Mod { .. })
            if sized.iter().any(|s| s.0 == 1) && outs[0].dtype.is_int() =>
        {
            Err(why(
                "an integer division by it would divide by its padding (zeros)",
            ))
        }
        Op::BatchNorm { .. } => {
            only(0)?;
            keep(a == 1)
        }
        _ if op.is_elementwise() || matches!(op, Op::BitCast { .. } | Op::Choose) => {
            // Broadcast alignment: trailing axes line up.
            let ax = a + r - rank(i);
            for (k, t) in ins.iter().enumerate() {
                let Some(t) = t else { continue };
                let Some(p) = (ax + t.rank()).checked_sub(r) else {
                    continue;
                };
                match sized.iter().find(|s| s.0 == k) {
                    Some(s) if s.1.axis != p => {
                        return Err(why(&format!(
                            "input {k}'s data-sized axis does not line up with it"
                        )))
                    }
                    Some(_) => {}
                    None if t.shape[p] != 1 => {
                        return Err(why(&format!(
                            "input {k} has a fixed size {} along the same axis",
                            t.shape[p]
                        )))
                    }
                    None => {}
                }
            }
            Ok(ax)
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::TopK { axis, .. } => keep(*axis == a),
        Op::Cumulative(c) => keep(c.axis == a),
        Op::Split { axis, .. } => keep(*axis == a),
        Op::Reduce { axes, keepdims, .. } => {
            keep(axes.contains(&a))?;
            Ok(if *keepdims {
                a
            } else {
                a - axes.iter().filter(|&&x| x < a).count()
            })
        }
        Op::Arg { axis, keepdims, .. } => {
            keep(*axis == a)?;
            Ok(if *keepdims || *axis > a { a } else { a - 1 })
        }
        Op::Transpose { perm } => perm
            .iter()
            .position(|&p| p == a)
            .ok_or_else(|| why("the permutation leaves it out")),
        Op::Slice {
            starts,
            steps,
            lens,
        } => keep(starts[a] != 0 || steps[a] != 1 || lens[a] != dim(0, a)),
        Op::Tile { repeats } => keep(repeats[a] != 1),
        Op::Pad { pads, .. } => keep(pads[a] != 0 || pads[a + rank(0)] != 0),
        Op::Expand { shape } => {
            let ax = a + r - rank(0);
            keep(shape[ax] != dim(0, a))?;
            Ok(ax)
        }
        Op::Reshape { shape } => {
            // The axis survives when the elements before it and after it stay in blocks of their own.
            let src = ins[0].map_or(&[][..], |t| &t.shape[..]);
            let (before, after): (usize, usize) =
                (src[..a].iter().product(), src[a + 1..].iter().product());
            (0..shape.len())
                .find(|&b| {
                    shape[b] == src[a]
                        && shape[..b].iter().product::<usize>() == before
                        && shape[b + 1..].iter().product::<usize>() == after
                })
                .ok_or_else(|| why("the reshape mixes it with other axes"))
        }
        Op::Concat { axis } => {
            if sized.len() != ins.iter().flatten().count() {
                return Err(why(
                    "every operand of a concatenation must be sized by the same data",
                ));
            }
            keep(*axis == a)
        }
        Op::Gather { axis } => {
            only(i)?;
            if i == 0 {
                keep(*axis == a)?;
                Ok(if a < *axis { a } else { a + rank(1) - 1 })
            } else if dim(0, *axis) == 0 {
                Err(why("its padding would index an empty axis"))
            } else {
                Ok(axis + a)
            }
        }
        Op::MatMul => {
            only(i)?;
            match (i, rank(i)) {
                (0, ra) if ra >= 2 && a == ra - 2 => Ok(r - 2),
                (1, rb) if rb >= 2 && a == rb - 1 => Ok(r - 1),
                _ => Err(why(
                    "it is not a row of the left operand or a column of the right",
                )),
            }
        }
        Op::Gemm {
            trans_a, trans_b, ..
        } => {
            only(i)?;
            match (i, a) {
                (0, _) if a == usize::from(*trans_a) => Ok(0),
                (1, _) if a == usize::from(!*trans_b) => Ok(1),
                _ => Err(why(
                    "it is not a row of the left operand or a column of the right",
                )),
            }
        }
        _ => Err(why(&format!(
            "mlopt follows such values through elementwise, layout, gather and matrix ops, not {}",
            op.name()
        ))),
    }
}

/// The name of a data-sized output's count output.
pub fn count_name(output: &str) -> String {
    format!("{output}.count")
}

/// Adds, for each graph output whose size depends on the data, its count as an output named
/// `<name>.count` (outputs sized by one count share the first one's). An error when the name is taken.
pub fn expose_counts(g: &mut Graph) -> Result<()> {
    let ext = extents(g)?;
    let mut added: HashMap<Value, String> = HashMap::new();
    for (name, v) in g.graph_outputs().to_vec() {
        let Some(e) = ext.get(&v) else { continue };
        if added.contains_key(&e.count) {
            continue;
        }
        let count = count_name(&name);
        let taken = g.graph_outputs().iter().any(|(o, _)| *o == count)
            || g.graph_inputs().iter().any(|&i| g.node(i).name == count);
        if taken {
            return Err(IrError::Input {
                name,
                msg: format!(
                    "its size depends on the data, and the name of its count output, '{count}', \
                     is taken"
                ),
            });
        }
        g.add_output(count.clone(), e.count);
        added.insert(e.count, count);
    }
    Ok(())
}

/// A graph output sized by the data: its axis and the index of its count among the graph's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub axis: usize,
    pub count: usize,
}

/// For each graph output: how it is data-sized (`None`: static), and whether it is a count itself.
pub fn counted_outputs(g: &Graph) -> Result<Vec<(Option<Counted>, bool)>> {
    let ext = extents(g)?;
    let outs = g.graph_outputs();
    let position = |v: Value| outs.iter().position(|(_, o)| *o == v);
    let counts: Vec<Value> = outs
        .iter()
        .filter_map(|(_, v)| ext.get(v))
        .map(|e| e.count)
        .collect();
    Ok(outs
        .iter()
        .map(|(_, v)| {
            let c = ext.get(v).and_then(|e| {
                Some(Counted {
                    axis: e.axis,
                    count: position(e.count)?,
                })
            });
            (c, counts.contains(v))
        })
        .collect())
}

/// The first `count` entries of `t` along `axis`: a data-sized output as ONNX defines it. An error
/// when `count` is not one integer within the bound.
pub fn trim(
    t: &crate::Tensor,
    axis: usize,
    count: &crate::Tensor,
) -> std::result::Result<crate::Tensor, String> {
    let n = match count.to_i64_vec()[..] {
        [n] => n,
        _ => return Err(format!("the count holds {} values, not one", count.numel())),
    };
    let bound = t.shape().get(axis).copied().unwrap_or(0);
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= bound)
        .ok_or_else(|| format!("the count {n} is not within the bound {bound}"))?;
    let mut lens = t.shape().to_vec();
    lens[axis] = n;
    let ty = TensorType::new(t.dtype(), lens.clone());
    let op = Op::Slice {
        starts: vec![0; lens.len()],
        steps: vec![1; lens.len()],
        lens,
    };
    let mut out = crate::interp::eval_op(&op, &[Some(t)], &[ty])?;
    out.pop()
        .ok_or_else(|| "internal: the slice has no output".into())
}

/// A run's named outputs, in `g`'s output order, as ONNX defines them: each data-sized output cut to
/// its count, the counts left out.
pub fn exact_outputs(
    g: &Graph,
    outs: &[(String, crate::Tensor)],
) -> std::result::Result<Vec<(String, crate::Tensor)>, String> {
    let counted = counted_outputs(g).map_err(|e| e.to_string())?;
    let mut exact = vec![];
    for (k, (c, is_count)) in counted.into_iter().enumerate() {
        let (name, t) = outs.get(k).ok_or_else(|| {
            format!(
                "the run made {} outputs, not {}",
                outs.len(),
                g.graph_outputs().len()
            )
        })?;
        match (c, is_count) {
            (_, true) => {}
            (Some(c), _) => {
                let n = &outs.get(c.count).ok_or("the count output is missing")?.1;
                let t = trim(t, c.axis, n).map_err(|e| format!("output '{name}': {e}"))?;
                exact.push((name.clone(), t));
            }
            (None, _) => exact.push((name.clone(), t.clone())),
        }
    }
    Ok(exact)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, ReduceKind, Tensor};

    /// x f32[2, 3] -> non_zero -> transpose: pairs [6, 2] sized along axis 0 by the count.
    fn pairs() -> (Graph, Value, Value) {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3]));
        let nz = g.add_node(Op::NonZero, "nz", &[Some(x)], None).unwrap();
        let t = g
            .add(Op::Transpose { perm: vec![1, 0] }, "t", &[nz[0]])
            .unwrap();
        (g, t, nz[1])
    }

    #[test]
    fn a_transpose_moves_the_sized_axis_and_keeps_the_count() {
        let (g, t, count) = pairs();
        assert_eq!(extents(&g).unwrap()[&t], Extent { axis: 0, count });
    }

    #[test]
    fn growing_extents_agree_with_the_whole_graphs_as_it_grows() {
        let mut g = Graph::new("t");
        let mut grown = Growing::default();
        assert!(grown.update(&g).unwrap().is_empty());
        let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3]));
        let nz = g.add_node(Op::NonZero, "nz", &[Some(x)], None).unwrap();
        assert_eq!(grown.update(&g).unwrap(), &extents(&g).unwrap());
        let t = g
            .add(Op::Transpose { perm: vec![1, 0] }, "t", &[nz[0]])
            .unwrap();
        let r = g.add(Op::Unary(crate::Unary::Neg), "neg", &[x]).unwrap();
        assert_eq!(grown.update(&g).unwrap(), &extents(&g).unwrap());
        assert_eq!(grown.update(&g).unwrap()[&t].axis, 0);
        assert!(!grown.update(&g).unwrap().contains_key(&r));
        let s = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
            keepdims: false,
        };
        g.add(s, "total", &[t]).unwrap();
        let e = grown.update(&g).unwrap_err().to_string();
        assert!(e.contains("'total'"), "{e}");
    }

    #[test]
    fn a_sum_over_the_sized_axis_is_refused_naming_the_node() {
        let (mut g, t, _) = pairs();
        let s = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
            keepdims: false,
        };
        g.add(s, "total", &[t]).unwrap();
        let e = extents(&g).unwrap_err().to_string();
        assert!(
            e.contains("'total'") && e.contains("works across that axis"),
            "{e}"
        );
        // Over the other axis it stays sized.
        let (mut g, t, count) = pairs();
        let s = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keepdims: false,
        };
        let y = g.add(s, "rows", &[t]).unwrap();
        assert_eq!(extents(&g).unwrap()[&y], Extent { axis: 0, count });
    }

    #[test]
    fn a_fixed_size_operand_along_the_sized_axis_is_refused() {
        let (mut g, t, _) = pairs();
        let c = g.add_const("c", Tensor::zeros(&TensorType::new(DType::I64, vec![6, 2])));
        g.add(Op::Binary(Binary::Add), "bad", &[t, c]).unwrap();
        let e = extents(&g).unwrap_err().to_string();
        assert!(e.contains("'bad'") && e.contains("fixed size 6"), "{e}");
        // A broadcast one is fine.
        let (mut g, t, _) = pairs();
        let c = g.add_const("c", Tensor::zeros(&TensorType::new(DType::I64, vec![1, 2])));
        let y = g.add(Op::Binary(Binary::Add), "ok", &[t, c]).unwrap();
        assert_eq!(extents(&g).unwrap()[&y].axis, 0);
    }

    #[test]
    fn outputs_get_their_counts_and_come_back_cut_to_them() {
        let (mut g, t, _) = pairs();
        g.add_output("pairs", t);
        expose_counts(&mut g).unwrap();
        let names: Vec<&str> = g.graph_outputs().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["pairs", "pairs.count"]);
        let counted = counted_outputs(&g).unwrap();
        assert_eq!(
            counted,
            [(Some(Counted { axis: 0, count: 1 }), false), (None, true)]
        );
        let x = Tensor::from_vec(&[2, 3], vec![0f32, 1., 0., 2., 0., 3.]).unwrap();
        let inputs = [("x".to_string(), x)].into_iter().collect();
        let outs = crate::interp::run(&g, &inputs).unwrap();
        let exact = exact_outputs(&g, &outs).unwrap();
        assert_eq!(exact.len(), 1);
        assert_eq!(exact[0].1.shape(), [3, 2]);
        assert_eq!(exact[0].1.to_i64_vec(), [0, 1, 1, 0, 1, 2]);
        // A name taken already is an error, not a second output of that name.
        let (mut g, t, _) = pairs();
        g.add_output("pairs", t);
        g.add_output("pairs.count", t);
        assert!(expose_counts(&mut g).is_err());
    }

    #[test]
    fn a_count_outside_the_bound_is_an_error() {
        let t = Tensor::from_vec(&[2], vec![1i64, 2]).unwrap();
        assert!(trim(&t, 0, &Tensor::scalar(3i64)).is_err());
        assert!(trim(&t, 0, &Tensor::scalar(-1i64)).is_err());
        assert_eq!(
            trim(&t, 0, &Tensor::scalar(1i64)).unwrap().to_i64_vec(),
            [1]
        );
    }
}
