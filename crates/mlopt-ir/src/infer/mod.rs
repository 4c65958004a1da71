//! Shape and dtype inference for every op: given input types, the output types or an error naming the
//! offending input. The graph builder and the verifier both call `infer`, so a node's recorded types are
//! always what its op computes.

use crate::dtype::{broadcast_shapes, DType, TensorType};
use crate::op::*;

/// Why inference failed, and which input (by slot) it is about, if one.
#[derive(Debug, Clone, PartialEq)]
pub struct InferError {
    pub input: Option<usize>,
    pub msg: String,
}

type R<T> = Result<T, InferError>;

mod counted;
mod index_bounds;
mod matrix;
pub use matrix::product_dtype;
#[cfg(test)]
mod tests;
mod window;

pub use index_bounds::IndexBounds;
use matrix::{infer_attention, infer_gemm, infer_matmul};
pub use window::window_out;
use window::{infer_conv, zero_geometry};

fn err<T>(input: Option<usize>, msg: impl Into<String>) -> R<T> {
    Err(InferError {
        input,
        msg: msg.into(),
    })
}

fn get<'a>(inputs: &[Option<&'a TensorType>], i: usize) -> R<&'a TensorType> {
    match inputs.get(i).copied().flatten() {
        Some(t) => Ok(t),
        None => err(Some(i), "required input is missing"),
    }
}

fn need_float(t: &TensorType, i: usize) -> R<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        err(Some(i), format!("expects a floating-point tensor, got {t}"))
    }
}

fn same_dtype(a: &TensorType, b: &TensorType, i: usize) -> R<()> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        err(
            Some(i),
            format!("dtype {} differs from input 0's {}", b.dtype, a.dtype),
        )
    }
}

fn broadcast_all(tys: &[&TensorType]) -> R<Vec<usize>> {
    let mut shape: Vec<usize> = vec![];
    for (i, t) in tys.iter().enumerate() {
        shape = match broadcast_shapes(&shape, &t.shape) {
            Some(s) => s,
            None => {
                return err(
                    Some(i),
                    format!("shape {:?} does not broadcast with {:?}", t.shape, shape),
                )
            }
        };
    }
    Ok(shape)
}

/// Infers the output types of `op` applied to inputs of the given types (`None` for an omitted optional).
pub fn infer(op: &Op, inputs: &[Option<&TensorType>]) -> R<Vec<TensorType>> {
    let (lo, hi) = op.arity();
    if inputs.len() < lo || inputs.len() > hi {
        return err(
            None,
            format!(
                "takes {lo}..{} inputs, got {}",
                if hi == usize::MAX {
                    "".into()
                } else {
                    hi.to_string()
                },
                inputs.len()
            ),
        );
    }
    for (i, t) in inputs.iter().enumerate() {
        if t.is_none() && !op.input_optional(i) {
            return err(Some(i), "required input is missing");
        }
    }
    let x = || get(inputs, 0);
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Input | Op::Const(_) => err(None, "inputs and constants carry their own type"),
        Op::Unary(u) => {
            let x = x()?;
            match u {
                Unary::Not => {
                    if x.dtype != DType::Bool {
                        return err(Some(0), "not expects bool");
                    }
                }
                Unary::BitNot => {
                    if !x.dtype.is_int() {
                        return err(Some(0), "bit_not expects an integer");
                    }
                }
                Unary::Abs | Unary::Neg | Unary::Sign | Unary::Relu => {
                    if x.dtype == DType::Bool {
                        return err(Some(0), format!("{} does not take bool", op.name()));
                    }
                }
                _ => need_float(x, 0)?,
            }
            let dtype = if matches!(u, Unary::IsNaN | Unary::IsInf { .. }) {
                DType::Bool
            } else {
                x.dtype
            };
            one(TensorType::new(dtype, x.shape.clone()))
        }
        Op::Binary(b) => {
            let (a, c) = (get(inputs, 0)?, get(inputs, 1)?);
            if *b != Binary::Pow {
                same_dtype(a, c, 1)?;
            }
            if b.is_bitwise() && !a.dtype.is_int() {
                return err(Some(0), format!("{} expects integers", op.name()));
            }
            if b.is_logical() && a.dtype != DType::Bool {
                return err(Some(0), format!("{} expects bool", op.name()));
            }
            if !b.is_logical() && !b.is_comparison() && a.dtype == DType::Bool {
                return err(Some(0), format!("{} does not take bool", op.name()));
            }
            let shape = broadcast_all(&[a, c])?;
            if *b == Binary::PRelu && shape != a.shape {
                return err(Some(1), "slope must broadcast to the input's shape");
            }
            let dtype = if b.is_comparison() || b.is_logical() {
                DType::Bool
            } else {
                a.dtype
            };
            one(TensorType::new(dtype, shape))
        }
        Op::Nary(_) => {
            let tys: Vec<&TensorType> = (0..inputs.len())
                .map(|i| get(inputs, i))
                .collect::<R<_>>()?;
            for (i, t) in tys.iter().enumerate() {
                same_dtype(tys[0], t, i)?;
            }
            if tys[0].dtype == DType::Bool {
                return err(Some(0), "does not take bool");
            }
            one(TensorType::new(tys[0].dtype, broadcast_all(&tys)?))
        }
        Op::Where => {
            let (c, a, b) = (get(inputs, 0)?, get(inputs, 1)?, get(inputs, 2)?);
            if c.dtype != DType::Bool {
                return err(Some(0), "condition must be bool");
            }
            same_dtype(a, b, 2)?;
            one(TensorType::new(a.dtype, broadcast_all(&[c, a, b])?))
        }
        Op::Choose => {
            let (c, a, b) = (get(inputs, 0)?, get(inputs, 1)?, get(inputs, 2)?);
            if c.dtype != DType::Bool || c.numel() != 1 {
                return err(Some(0), format!("the condition is {c}, not one bool"));
            }
            if a != b {
                return err(
                    Some(2),
                    format!("the operands are {a} and {b}, not one type"),
                );
            }
            one(a.clone())
        }
        Op::Clip => {
            let x = x()?;
            for i in 1..inputs.len() {
                if let Some(t) = inputs[i] {
                    same_dtype(x, t, i)?;
                    if t.numel() != 1 {
                        return err(Some(i), "min and max must be scalars");
                    }
                }
            }
            one(x.clone())
        }
        Op::Cast { to } => one(TensorType::new(*to, x()?.shape.clone())),
        Op::BitCast { to } => {
            let x = x()?;
            let narrow = |d: DType| d.sub_byte_bits().is_some();
            if narrow(x.dtype) || narrow(*to) {
                return err(
                    Some(0),
                    format!(
                        "bit cast of {} to {to}: sub-byte types are held one per byte, so their bits are not the file's",
                        x.dtype
                    ),
                );
            }
            if x.dtype.size() != to.size() {
                return err(
                    Some(0),
                    format!("bit cast of {} to {to}: the sizes differ", x.dtype),
                );
            }
            one(TensorType::new(*to, x.shape.clone()))
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let x = x()?;
            need_float(x, 0)?;
            if *axis >= x.rank() {
                return err(
                    Some(0),
                    format!("axis {axis} out of range for rank {}", x.rank()),
                );
            }
            one(x.clone())
        }
        Op::MatMul => infer_matmul(get(inputs, 0)?, get(inputs, 1)?),
        Op::Attention { .. } => infer_attention(inputs),
        Op::Gemm {
            trans_a, trans_b, ..
        } => infer_gemm((*trans_a, *trans_b), inputs),
        Op::Conv(c) => infer_conv(c, inputs, false),
        Op::ConvTranspose(c) => infer_conv(c, inputs, true),
        Op::BatchNorm { .. } | Op::InstanceNorm { .. } => {
            let x = x()?;
            need_float(x, 0)?;
            if x.rank() < 2 {
                return err(Some(0), "expects at least [N, C]");
            }
            for i in 1..inputs.len() {
                let t = get(inputs, i)?;
                // (ONNX lets the parameters' float type differ from the input's; an integer is invalid.)
                need_float(t, i)?;
                if t.shape != [x.shape[1]] {
                    return err(
                        Some(i),
                        format!("expected shape [{}], got {:?}", x.shape[1], t.shape),
                    );
                }
            }
            one(x.clone())
        }
        Op::LayerNorm { axis, .. } => {
            let x = x()?;
            need_float(x, 0)?;
            if *axis >= x.rank() {
                return err(
                    Some(0),
                    format!("axis {axis} out of range for rank {}", x.rank()),
                );
            }
            let norm = &x.shape[*axis..];
            for i in 1..inputs.len() {
                if let Some(t) = inputs[i] {
                    same_dtype(x, t, i)?;
                    if broadcast_shapes(&t.shape, norm).as_deref() != Some(norm) {
                        return err(
                            Some(i),
                            format!("shape {:?} does not broadcast to {:?}", t.shape, norm),
                        );
                    }
                }
            }
            let mut stat = x.shape.clone();
            for d in &mut stat[*axis..] {
                *d = 1;
            }
            let stat = TensorType::new(DType::F32, stat);
            Ok(vec![x.clone(), stat.clone(), stat])
        }
        Op::Lrn { size, .. } => {
            let x = x()?;
            need_float(x, 0)?;
            if *size == 0 {
                return err(None, "size 0 (it must be positive)");
            }
            if x.rank() < 3 {
                return err(Some(0), "expects [N, C, ...]");
            }
            one(x.clone())
        }
        Op::MaxPool { pool: p, .. } | Op::AveragePool { pool: p, .. } => {
            let x = x()?;
            let sp = x.rank().saturating_sub(2);
            if x.rank() < 3
                || p.kernel.len() != sp
                || p.strides.len() != sp
                || p.dilations.len() != sp
                || p.pads.len() != 2 * sp
            {
                return err(
                    Some(0),
                    format!("pooling geometry does not match input {x}"),
                );
            }
            if let Some(why) = zero_geometry(&p.kernel, &p.strides, &p.dilations) {
                return err(None, why);
            }
            let mut shape = x.shape[..2].to_vec();
            for i in 0..sp {
                let o = window_out(
                    x.shape[i + 2],
                    p.kernel[i],
                    p.strides[i],
                    p.dilations[i],
                    p.pads[i],
                    p.pads[i + sp],
                    p.ceil_mode,
                );
                match o {
                    Some(o) => shape.push(o),
                    None => {
                        return err(
                            Some(0),
                            format!("window larger than padded input on axis {}", i + 2),
                        )
                    }
                }
            }
            let mut outs = vec![TensorType::new(x.dtype, shape.clone())];
            if matches!(op, Op::MaxPool { .. }) {
                outs.push(TensorType::new(DType::I64, shape));
            }
            Ok(outs)
        }
        Op::GlobalAveragePool | Op::GlobalMaxPool => {
            let x = x()?;
            if x.rank() < 3 {
                return err(Some(0), "expects [N, C, ...]");
            }
            let mut shape = x.shape.clone();
            for d in &mut shape[2..] {
                *d = 1;
            }
            one(TensorType::new(x.dtype, shape))
        }
        Op::Reduce {
            axes,
            keepdims,
            kind,
        } => {
            let x = x()?;
            if x.dtype == DType::Bool && !matches!(kind, ReduceKind::Max | ReduceKind::Min) {
                return err(Some(0), "does not take bool");
            }
            if !matches!(
                kind,
                ReduceKind::Sum
                    | ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::Prod
                    | ReduceKind::SumSquare
                    | ReduceKind::L1
            ) {
                need_float(x, 0)?;
            }
            if axes.iter().any(|a| *a >= x.rank()) || axes.windows(2).any(|w| w[0] >= w[1]) {
                return err(
                    None,
                    format!(
                        "axes {axes:?} must be sorted, unique and below rank {}",
                        x.rank()
                    ),
                );
            }
            one(TensorType::new(
                x.dtype,
                reduced_shape(&x.shape, axes, *keepdims),
            ))
        }
        Op::Arg { axis, keepdims, .. } => {
            let x = x()?;
            if *axis >= x.rank() {
                return err(
                    Some(0),
                    format!("axis {axis} out of range for rank {}", x.rank()),
                );
            }
            one(TensorType::new(
                DType::I64,
                reduced_shape(&x.shape, &[*axis], *keepdims),
            ))
        }
        Op::Reshape { shape } => {
            let x = x()?;
            if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(x.numel()) {
                return err(Some(0), format!("cannot reshape {x} to {shape:?}"));
            }
            one(TensorType::new(x.dtype, shape.clone()))
        }
        Op::Transpose { perm } => {
            let x = x()?;
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank()
                || perm
                    .iter()
                    .any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true))
            {
                return err(
                    None,
                    format!("perm {perm:?} is not a permutation of rank {}", x.rank()),
                );
            }
            one(TensorType::new(
                x.dtype,
                perm.iter().map(|&p| x.shape[p]).collect::<Vec<_>>(),
            ))
        }
        Op::Concat { axis } => {
            let x = x()?;
            if *axis >= x.rank() {
                return err(
                    Some(0),
                    format!("axis {axis} out of range for rank {}", x.rank()),
                );
            }
            let mut shape = x.shape.clone();
            shape[*axis] = 0;
            for i in 0..inputs.len() {
                let t = get(inputs, i)?;
                same_dtype(x, t, i)?;
                let ok = t.rank() == x.rank()
                    && (0..x.rank()).all(|d| d == *axis || t.shape[d] == x.shape[d]);
                if !ok {
                    return err(
                        Some(i),
                        format!(
                            "shape {:?} does not match {:?} off axis {axis}",
                            t.shape, x.shape
                        ),
                    );
                }
                shape[*axis] += t.shape[*axis];
            }
            one(TensorType::new(x.dtype, shape))
        }
        Op::Split { axis, sizes } => {
            let x = x()?;
            if sizes.is_empty() {
                return err(None, "no outputs");
            }
            if *axis >= x.rank() || sizes.iter().sum::<usize>() != x.shape[*axis] {
                return err(
                    Some(0),
                    format!("sizes {sizes:?} do not split axis {axis} of {x}"),
                );
            }
            Ok(sizes
                .iter()
                .map(|&s| {
                    let mut shape = x.shape.clone();
                    shape[*axis] = s;
                    TensorType::new(x.dtype, shape)
                })
                .collect())
        }
        Op::Slice {
            starts,
            steps,
            lens,
        } => {
            let x = x()?;
            let r = x.rank();
            if starts.len() != r || steps.len() != r || lens.len() != r {
                return err(
                    None,
                    format!("slice attributes must have one entry per axis of {x}"),
                );
            }
            for d in 0..r {
                // (Checked: a step or length from a model file may be anything, i64::MIN included.)
                let last = i64::try_from(lens[d])
                    .ok()
                    .and_then(|n| steps[d].checked_mul(n - 1))
                    .and_then(|o| o.checked_add(i64::try_from(starts[d]).ok()?));
                let inside = |l: i64| starts[d] < x.shape[d] && l >= 0 && (l as usize) < x.shape[d];
                let ok = steps[d] != 0 && (lens[d] == 0 || last.is_some_and(inside));
                if !ok {
                    return err(
                        None,
                        format!(
                            "axis {d}: start {} step {} len {} leaves 0..{}",
                            starts[d], steps[d], lens[d], x.shape[d]
                        ),
                    );
                }
            }
            one(TensorType::new(x.dtype, lens.clone()))
        }
        Op::Gather { axis } => {
            let (x, idx) = (x()?, get(inputs, 1)?);
            if *axis >= x.rank() {
                return err(
                    Some(0),
                    format!("axis {axis} out of range for rank {}", x.rank()),
                );
            }
            if !matches!(idx.dtype, DType::I32 | DType::I64) {
                return err(Some(1), "indices must be i32 or i64");
            }
            let mut shape = x.shape[..*axis].to_vec();
            shape.extend_from_slice(&idx.shape);
            shape.extend_from_slice(&x.shape[axis + 1..]);
            one(TensorType::new(x.dtype, shape))
        }
        Op::GatherElements { axis } => {
            let (x, idx) = (x()?, get(inputs, 1)?);
            if *axis >= x.rank() || idx.rank() != x.rank() {
                return err(Some(1), "indices must have the data's rank");
            }
            if !matches!(idx.dtype, DType::I32 | DType::I64) {
                return err(Some(1), "indices must be i32 or i64");
            }
            one(TensorType::new(x.dtype, idx.shape.clone()))
        }
        Op::Expand { shape } => {
            let x = x()?;
            if broadcast_shapes(&x.shape, shape).as_deref() != Some(&shape[..]) {
                return err(Some(0), format!("{x} does not broadcast to {shape:?}"));
            }
            one(TensorType::new(x.dtype, shape.clone()))
        }
        Op::Tile { repeats } => {
            let x = x()?;
            if repeats.len() != x.rank() {
                return err(None, "repeats must have one entry per axis");
            }
            one(TensorType::new(
                x.dtype,
                x.shape
                    .iter()
                    .zip(repeats)
                    .map(|(d, r)| d.saturating_mul(*r))
                    .collect::<Vec<_>>(),
            ))
        }
        Op::Pad { pads, mode, .. } => {
            let x = x()?;
            let r = x.rank();
            if pads.len() != 2 * r {
                return err(None, "pads must have two entries per axis");
            }
            let mut shape = vec![];
            for d in 0..r {
                let n = i64::try_from(x.shape[d])
                    .ok()
                    .and_then(|s| s.checked_add(pads[d])?.checked_add(pads[d + r]));
                let Some(n) = n.filter(|n| *n >= 0) else {
                    return err(
                        None,
                        format!("pads crop axis {d} below zero or overflow it"),
                    );
                };
                if *mode != PadMode::Constant && x.shape[d] == 0 && n > 0 {
                    return err(Some(0), format!("cannot {} pad an empty axis", op.name()));
                }
                shape.push(n as usize);
            }
            one(TensorType::new(x.dtype, shape))
        }
        Op::Resize(r) => {
            let x = x()?;
            if r.sizes.len() != x.rank() || r.scales.len() != x.rank() {
                return err(None, "resize scales and sizes must have one entry per axis");
            }
            one(TensorType::new(x.dtype, r.sizes.clone()))
        }
        Op::DepthToSpace { blocksize: b, .. } => {
            let x = x()?;
            if x.rank() != 4 || *b == 0 {
                return err(
                    Some(0),
                    "expects [N, C, H, W] and a blocksize of at least 1".to_string(),
                );
            }
            let (bb, h, w) = (
                b.checked_mul(*b),
                x.shape[2].checked_mul(*b),
                x.shape[3].checked_mul(*b),
            );
            let (Some(bb), Some(h), Some(w)) = (bb, h, w) else {
                return err(Some(0), format!("blocksize {b} is too large for {x}"));
            };
            if x.shape[1] % bb != 0 {
                return err(
                    Some(0),
                    format!("expects [N, C, H, W] with C divisible by {bb}"),
                );
            }
            one(TensorType::new(
                x.dtype,
                vec![x.shape[0], x.shape[1] / bb, h, w],
            ))
        }
        Op::SpaceToDepth { blocksize: b } => {
            let x = x()?;
            if x.rank() != 4 || *b == 0 || x.shape[2] % b != 0 || x.shape[3] % b != 0 {
                return err(
                    Some(0),
                    format!("expects [N, C, H, W] with H and W divisible by {b}"),
                );
            }
            let Some(c) = b.checked_mul(*b).and_then(|bb| x.shape[1].checked_mul(bb)) else {
                return err(Some(0), format!("blocksize {b} is too large for {x}"));
            };
            one(TensorType::new(
                x.dtype,
                vec![x.shape[0], c, x.shape[2] / b, x.shape[3] / b],
            ))
        }
        Op::NonZero => counted::non_zero(x()?),
        Op::Compress { axis } => counted::compress(x()?, get(inputs, 1)?, *axis),
        Op::NonMaxSuppression { bound, .. } => counted::non_max_suppression(inputs, *bound),
        Op::Unique { axis, .. } => counted::unique(x()?, *axis),
        Op::TopK { axis, k, .. } => {
            let x = x()?;
            if *axis >= x.rank() || *k > x.shape[*axis] {
                return err(
                    Some(0),
                    format!("cannot take the top {k} along axis {axis} of {x}"),
                );
            }
            let mut shape = x.shape.clone();
            shape[*axis] = *k;
            Ok(vec![
                TensorType::new(x.dtype, shape.clone()),
                TensorType::new(DType::I64, shape),
            ])
        }
        Op::GridSample { .. } => {
            let (x, grid) = (x()?, get(inputs, 1)?);
            need_float(x, 0)?;
            let sp = x.rank().saturating_sub(2);
            let g = &grid.shape;
            if x.rank() < 3
                || grid.rank() != x.rank()
                || g[0] != x.shape[0]
                || g[grid.rank() - 1] != sp
                || !grid.dtype.is_float()
            {
                return err(Some(1), format!("grid {grid} does not fit input {x}"));
            }
            let mut shape = vec![x.shape[0], x.shape[1]];
            shape.extend_from_slice(&g[1..grid.rank() - 1]);
            one(TensorType::new(x.dtype, shape))
        }
        Op::GatherNd { batch_dims: b } => {
            let (x, idx) = (x()?, get(inputs, 1)?);
            if idx.dtype != DType::I64 {
                return err(Some(1), "indices must be i64");
            }
            let q = idx.rank();
            let last = if q == 0 { 0 } else { idx.shape[q - 1] };
            if q == 0 || *b >= q || b + last > x.rank() || x.shape[..*b] != idx.shape[..*b] {
                return err(
                    Some(1),
                    format!("indices {idx} do not index {x} with {b} batch dims"),
                );
            }
            let mut shape = idx.shape[..q - 1].to_vec();
            shape.extend_from_slice(&x.shape[b + last..]);
            one(TensorType::new(x.dtype, shape))
        }
        Op::ScatterNd { .. } => {
            let (x, idx, upd) = (x()?, get(inputs, 1)?, get(inputs, 2)?);
            same_dtype(x, upd, 2)?;
            let q = idx.rank();
            if idx.dtype != DType::I64 || q == 0 || idx.shape[q - 1] > x.rank() {
                return err(Some(1), format!("indices {idx} do not index {x}"));
            }
            let mut want = idx.shape[..q - 1].to_vec();
            want.extend_from_slice(&x.shape[idx.shape[q - 1]..]);
            if upd.shape != want {
                return err(
                    Some(2),
                    format!("updates must be {want:?}, got {:?}", upd.shape),
                );
            }
            one(x.clone())
        }
        Op::ScatterElements { axis, .. } => {
            let (x, idx, upd) = (x()?, get(inputs, 1)?, get(inputs, 2)?);
            same_dtype(x, upd, 2)?;
            if *axis >= x.rank()
                || idx.rank() != x.rank()
                || idx.shape != upd.shape
                || !matches!(idx.dtype, DType::I32 | DType::I64)
            {
                return err(
                    Some(1),
                    format!("indices {idx} and updates {upd} do not fit {x} along axis {axis}"),
                );
            }
            one(x.clone())
        }
        Op::Trilu { .. } => {
            let x = x()?;
            if x.rank() < 2 {
                return err(Some(0), "expects rank >= 2");
            }
            one(x.clone())
        }
        Op::Cumulative(CumulativeAttrs { axis, .. }) => {
            let x = x()?;
            if *axis >= x.rank() {
                return err(
                    Some(0),
                    format!("axis {axis} out of range for rank {}", x.rank()),
                );
            }
            if !x.dtype.is_float() && !x.dtype.is_int() {
                return err(Some(0), format!("expects numbers, got {}", x.dtype));
            }
            one(x.clone())
        }
    }
}

/// The shape after reducing `axes`, keeping them as 1s or dropping them.
pub fn reduced_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    let mut out = vec![];
    for (d, &n) in shape.iter().enumerate() {
        if axes.contains(&d) {
            if keepdims {
                out.push(1);
            }
        } else {
            out.push(n);
        }
    }
    out
}
