//! The reference interpreter: plain Rust, ONNX semantics, no shortcuts. It is the ground truth every
//! rewrite and every kernel is checked against, so it favours being obviously right over being fast.
//!
//! f16 and bf16 inputs are widened to f32 once at `eval_op`, and results rounded back to the declared
//! output dtype; the kernels in the submodules therefore only see f32, f64, integers and bool.

mod counted;
mod elementwise;
mod grid_sample;
mod index;
mod layout;
mod linalg;
mod nn;
mod reduce;
mod resize;

pub use resize::{axis_taps as resize_taps, Taps as ResizeTaps};
#[cfg(test)]
mod property_tests;
#[cfg(test)]
mod tests;

use crate::dtype::{DType, TensorType};
use crate::error::{IrError, Result};
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::tensor::{Elem, Tensor};
use ndarray::ArrayD;
use std::collections::HashMap;

/// A kernel error: the message only; `eval_op`'s caller adds the node and op.
pub type EvalResult<T> = std::result::Result<T, String>;

/// Floating-point element types the float kernels are written for (f32 and f64).
pub trait Real: Elem + num_traits::Float + num_traits::FloatConst + std::iter::Sum {
    fn erf(self) -> Self;
    fn lit(v: f64) -> Self;
}
impl Real for f32 {
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn lit(v: f64) -> Self {
        v as f32
    }
}
impl Real for f64 {
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn lit(v: f64) -> Self {
        v
    }
}

/// Runs `$body` with `$a` bound to an f32 or f64 array; other dtypes are an error.
macro_rules! float_dispatch {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $body,
            $crate::Tensor::F64($a) => $body,
            t => {
                return Err(format!(
                    "expects a floating-point tensor, got {}",
                    t.dtype()
                ))
            }
        }
    };
}

/// Runs `$body` with `$a` bound to a numeric (non-bool) array.
macro_rules! num_dispatch {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $body,
            $crate::Tensor::F64($a) => $body,
            $crate::Tensor::I8($a) => $body,
            $crate::Tensor::U8($a) => $body,
            $crate::Tensor::I16($a) => $body,
            $crate::Tensor::U16($a) => $body,
            $crate::Tensor::I32($a) => $body,
            $crate::Tensor::U32($a) => $body,
            $crate::Tensor::I64($a) => $body,
            $crate::Tensor::U64($a) => $body,
            t => return Err(format!("expects a numeric tensor, got {}", t.dtype())),
        }
    };
}
pub(crate) use {float_dispatch, num_dispatch};

/// The array of type `T` inside `t`, or an error naming the dtypes.
pub(crate) fn typed<T: Elem>(t: &Tensor) -> EvalResult<&ArrayD<T>> {
    t.view::<T>()
        .ok_or_else(|| format!("expected {} tensor, got {}", T::DTYPE, t.dtype()))
}

/// Evaluates one op. `out_types` are the node's declared output types (only their dtypes are used, to
/// round f32 results back to f16/bf16). Missing optional inputs are `None`.
pub fn eval_op(
    op: &Op,
    inputs: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> EvalResult<Vec<Tensor>> {
    // An output the process cannot allocate is an error naming the node (the caller adds it), not an
    // abort inside the op: asked for first, and given back, before the op builds it.
    for ty in out_types {
        let bytes = ty
            .checked_bytes()
            .ok_or_else(|| format!("output {ty} has too many elements to allocate"))?;
        let mut probe: Vec<u8> = Vec::new();
        probe
            .try_reserve_exact(bytes)
            .map_err(|_| format!("cannot allocate {bytes} bytes for output {ty}"))?;
    }
    let widened: Vec<Option<Tensor>> = inputs
        .iter()
        .map(|t| {
            t.filter(|t| t.dtype().computes_in_f32())
                .map(|t| t.cast(DType::F32))
        })
        .collect();
    let args: Vec<Option<&Tensor>> = inputs
        .iter()
        .zip(&widened)
        .map(|(orig, w)| w.as_ref().or(*orig))
        .collect();
    let mut outs = eval_wide(op, &args)?;
    outs.truncate(out_types.len().max(1));
    for (t, ty) in outs.iter_mut().zip(out_types) {
        if t.dtype() != ty.dtype {
            *t = t.cast(ty.dtype);
        }
        if t.shape() != ty.shape.as_slice() {
            return Err(format!(
                "internal: computed shape {:?}, declared {}",
                t.shape(),
                ty
            ));
        }
    }
    Ok(outs)
}

fn req<'a>(args: &[Option<&'a Tensor>], i: usize) -> EvalResult<&'a Tensor> {
    args.get(i)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {i} is missing"))
}

fn eval_wide(op: &Op, args: &[Option<&Tensor>]) -> EvalResult<Vec<Tensor>> {
    let x = || req(args, 0);
    let one = |t: Tensor| Ok(vec![t]);
    match op {
        Op::Input | Op::Const(_) => Err("inputs and constants are not evaluated".into()),
        Op::Unary(u) => one(elementwise::unary(*u, x()?)?),
        Op::Binary(b) => one(elementwise::binary(*b, x()?, req(args, 1)?)?),
        Op::Nary(n) => {
            let all: Vec<&Tensor> = (0..args.len())
                .map(|i| req(args, i))
                .collect::<EvalResult<_>>()?;
            one(elementwise::nary(*n, &all)?)
        }
        Op::Where => one(elementwise::where_(x()?, req(args, 1)?, req(args, 2)?)?),
        // The untaken operand may be absent: `run` skips what only it needs.
        Op::Choose => match x()?.to_f64_vec()[..] {
            [c] => one(req(args, if c != 0.0 { 1 } else { 2 })?.clone()),
            _ => Err("the condition is not one value".into()),
        },
        Op::Clip => one(elementwise::clip(
            x()?,
            args.get(1).copied().flatten(),
            args.get(2).copied().flatten(),
        )?),
        Op::Cast { to } => one(x()?.cast(*to)),
        Op::BitCast { to } => {
            let x = x()?;
            let ty = crate::TensorType::new(*to, x.shape().to_vec());
            one(Tensor::from_le_bytes(&ty, &x.to_le_bytes()).ok_or("the sizes differ")?)
        }
        Op::Softmax { axis } => one(nn::softmax(x()?, *axis, false)?),
        Op::LogSoftmax { axis } => one(nn::softmax(x()?, *axis, true)?),
        Op::MatMul => one(linalg::matmul(x()?, req(args, 1)?)?),
        Op::Attention { scale } => {
            // Narrow (bf16, f16) operands: the scores, the softmax and both products in f32, the output
            // rounded once, as the compiled kernels compute it.
            let dt = x()?.dtype();
            let narrow = dt.is_half();
            let wide = |t: &Tensor| {
                if narrow {
                    t.cast(DType::F32)
                } else {
                    t.clone()
                }
            };
            let s = linalg::matmul(&wide(x()?), &wide(req(args, 1)?))?;
            let mut s = elementwise::binary(
                crate::Binary::Mul,
                &s,
                &Tensor::full(&TensorType::new(s.dtype(), vec![]), *scale as f64),
            )?;
            if let Some(m) = args.get(3).copied().flatten() {
                s = elementwise::binary(crate::Binary::Add, &s, &wide(m))?;
            }
            let axis = s.shape().len() - 1;
            let p = nn::softmax(&s, axis, false)?;
            let y = linalg::matmul(&p, &wide(req(args, 2)?))?;
            one(if narrow { y.cast(dt) } else { y })
        }
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => one(linalg::gemm(
            x()?,
            req(args, 1)?,
            args.get(2).copied().flatten(),
            *alpha,
            *beta,
            *trans_a,
            *trans_b,
        )?),
        Op::Conv(c) => one(linalg::conv(
            x()?,
            req(args, 1)?,
            args.get(2).copied().flatten(),
            c,
        )?),
        Op::ConvTranspose(c) => one(linalg::conv_transpose(
            x()?,
            req(args, 1)?,
            args.get(2).copied().flatten(),
            c,
        )?),
        Op::BatchNorm { epsilon } => one(nn::batch_norm(
            x()?,
            [req(args, 1)?, req(args, 2)?, req(args, 3)?, req(args, 4)?],
            *epsilon,
        )?),
        Op::InstanceNorm { epsilon } => one(nn::instance_norm(
            x()?,
            req(args, 1)?,
            req(args, 2)?,
            *epsilon,
        )?),
        Op::LayerNorm { axis, epsilon } => nn::layer_norm(
            x()?,
            req(args, 1)?,
            args.get(2).copied().flatten(),
            *axis,
            *epsilon,
        ),
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => one(nn::lrn(x()?, *size, *alpha, *beta, *bias)?),
        Op::MaxPool { pool, col_major } => nn::max_pool(x()?, pool, *col_major),
        Op::AveragePool {
            pool,
            count_include_pad,
        } => one(nn::pool(
            x()?,
            pool,
            nn::PoolKind::Average {
                count_include_pad: *count_include_pad,
            },
        )?),
        Op::GlobalAveragePool => one(nn::global_pool(x()?, false)?),
        Op::GlobalMaxPool => one(nn::global_pool(x()?, true)?),
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => one(reduce::reduce(x()?, *kind, axes, *keepdims)?),
        Op::Arg {
            max,
            axis,
            keepdims,
            select_last_index,
        } => one(reduce::arg(
            x()?,
            *max,
            *axis,
            *keepdims,
            *select_last_index,
        )?),
        Op::Reshape { shape } => one(x()?.reshape(shape).ok_or("element count mismatch")?),
        Op::Transpose { perm } => one(layout::transpose(x()?, perm)),
        Op::Concat { axis } => {
            let all: Vec<&Tensor> = (0..args.len())
                .map(|i| req(args, i))
                .collect::<EvalResult<_>>()?;
            one(layout::concat(&all, *axis)?)
        }
        Op::Split { axis, sizes } => Ok(layout::split(x()?, *axis, sizes)),
        Op::Slice {
            starts,
            steps,
            lens,
        } => one(layout::slice(x()?, starts, steps, lens)),
        Op::Gather { axis } => one(layout::gather(x()?, req(args, 1)?, *axis)?),
        Op::GatherElements { axis } => one(layout::gather_elements(x()?, req(args, 1)?, *axis)?),
        Op::Expand { shape } => one(layout::expand(x()?, shape)?),
        Op::Tile { repeats } => one(layout::tile(x()?, repeats)),
        Op::Pad { pads, mode, value } => one(layout::pad(x()?, pads, *mode, *value)),
        Op::Resize(r) => one(resize::resize(x()?, r)?),
        Op::DepthToSpace { blocksize, crd } => one(layout::depth_to_space(x()?, *blocksize, *crd)?),
        Op::SpaceToDepth { blocksize } => one(layout::space_to_depth(x()?, *blocksize)?),
        Op::Trilu { upper, k } => one(layout::trilu(x()?, *upper, *k)),
        Op::Cumulative(c) => one(reduce::cumulative(x()?, c)?),
        Op::TopK {
            axis, k, largest, ..
        } => index::top_k(x()?, *axis, *k, *largest),
        Op::NonZero => counted::non_zero(x()?),
        Op::Compress { axis } => counted::compress(x()?, req(args, 1)?, *axis),
        Op::NonMaxSuppression {
            center_point_box,
            bound,
        } => counted::non_max_suppression(args, *center_point_box, *bound),
        Op::Unique { axis, sorted } => counted::unique(x()?, *axis, *sorted),
        Op::GridSample {
            mode,
            padding,
            align_corners,
        } => one(grid_sample::grid_sample(
            x()?,
            req(args, 1)?,
            *mode,
            *padding,
            *align_corners,
        )?),
        Op::GatherNd { batch_dims } => one(index::gather_nd(x()?, req(args, 1)?, *batch_dims)?),
        Op::ScatterNd { reduction } => one(index::scatter_nd(
            x()?,
            req(args, 1)?,
            req(args, 2)?,
            *reduction,
        )?),
        Op::ScatterElements { axis, reduction } => one(index::scatter_elements(
            x()?,
            req(args, 1)?,
            req(args, 2)?,
            *axis,
            *reduction,
        )?),
    }
}

/// Evaluates a whole graph on named inputs and returns the named outputs in order.
pub fn run(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>> {
    // What only an untaken `choose` operand needs is skipped; a guard's conditions count as reads.
    let guards = crate::demand::guards(graph)?;
    let order = crate::demand::evaluation_order(graph, &guards)?;
    let reads = |n: NodeId| {
        let guard = guards.get(&n).map_or(&[][..], |g| &g[..]);
        graph
            .inputs(n)
            .into_iter()
            .flatten()
            .chain(guard.iter().map(|l| l.cond))
            .collect::<Vec<_>>()
    };
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &n in &order {
        for v in reads(n) {
            *uses.entry(v.node).or_default() += 1;
        }
    }
    for (_, v) in graph.graph_outputs() {
        *uses.entry(v.node).or_default() += 1;
    }
    for name in inputs.keys() {
        if !graph
            .graph_inputs()
            .iter()
            .any(|&n| graph.node(n).name == *name)
        {
            return Err(IrError::Input {
                name: name.clone(),
                msg: "the graph has no such input".into(),
            });
        }
    }
    let mut values: HashMap<NodeId, Vec<Tensor>> = HashMap::new();
    for &n in &order {
        let node = graph.node(n);
        let taken = guards.get(&n).is_none_or(|guard| {
            crate::demand::holds(guard, |c| {
                let t = values.get(&c.node)?.get(c.output as usize)?;
                Some(t.to_f64_vec().first().is_some_and(|x| *x != 0.0))
            })
        });
        let done = |values: &mut HashMap<NodeId, Vec<Tensor>>,
                    uses: &mut HashMap<NodeId, usize>| {
            for v in reads(n) {
                if let Some(c) = uses.get_mut(&v.node) {
                    *c -= 1;
                    if *c == 0 {
                        values.remove(&v.node);
                    }
                }
            }
        };
        if !taken {
            done(&mut values, &mut uses);
            continue;
        }
        let outs = match &node.op {
            Op::Input => {
                let t = inputs.get(&node.name).ok_or_else(|| IrError::Input {
                    name: node.name.clone(),
                    msg: "no value given".into(),
                })?;
                if t.ty() != node.outputs[0] {
                    return Err(IrError::Input {
                        name: node.name.clone(),
                        msg: format!("expected {}, got {}", node.outputs[0], t.ty()),
                    });
                }
                vec![t.clone()]
            }
            Op::Const(t) => vec![(**t).clone()],
            op => {
                let ins = graph.inputs(n);
                let args: Vec<Option<&Tensor>> = ins
                    .iter()
                    .map(|v| v.and_then(|v| values.get(&v.node).map(|o| &o[v.output as usize])))
                    .collect();
                let outs = eval_op(op, &args, &node.outputs).map_err(|msg| IrError::Eval {
                    node: node.name.clone(),
                    op: op.name(),
                    msg,
                })?;
                done(&mut values, &mut uses);
                outs
            }
        };
        values.insert(n, outs);
    }
    graph
        .graph_outputs()
        .iter()
        .map(|(name, v)| {
            let t = values.get(&v.node).map(|o| o[v.output as usize].clone());
            t.map(|t| (name.clone(), t)).ok_or(IrError::Cycle)
        })
        .collect()
}
