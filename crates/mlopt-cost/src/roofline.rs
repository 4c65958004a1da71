//! The roofline: the work of each op (FLOPs by kind) from its shapes and dtypes, and the estimated time of a
//! kernel (a fusion group) on a target: max(compute, memory) plus the target's launch overhead.

use mlopt_ir::{DType, Op, ReduceKind, TensorType, Unary};
use mlopt_target::{MatrixPrecision, Target};
use std::fmt;
use std::ops::Add;

/// Estimated time in seconds on a target's roofline. Adding saturates at `Cost::INFINITY` (also the value of
/// anything that cannot run), and costs are totally ordered, so extraction can compare them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cost(f64);

impl Cost {
    pub const ZERO: Cost = Cost(0.0);
    pub const INFINITY: Cost = Cost(f64::INFINITY);

    /// A cost of `s` seconds; NaN and negative values become infinity and zero.
    pub fn secs(s: f64) -> Cost {
        if s.is_nan() {
            Cost::INFINITY
        } else {
            Cost(s.max(0.0))
        }
    }

    pub fn as_secs(self) -> f64 {
        self.0
    }

    pub fn is_infinite(self) -> bool {
        self.0.is_infinite()
    }
}

impl Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost::secs(self.0 + o.0)
    }
}

impl std::iter::Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(it: I) -> Cost {
        it.fold(Cost::ZERO, Add::add)
    }
}

impl Eq for Cost {}
impl PartialOrd for Cost {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cost {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.is_infinite() {
            write!(f, "inf")
        } else if s >= 1e-3 {
            write!(f, "{:.3} ms", s * 1e3)
        } else {
            write!(f, "{:.2} us", s * 1e6)
        }
    }
}

/// The work of an op or a kernel: FLOPs on the vector units, FLOPs on matrix units by precision, and bytes
/// moved to and from memory (only a kernel's inputs and outputs count; values inside it stay in registers).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Work {
    pub vector_flops: f64,
    /// Indexed by `MatrixPrecision as usize`.
    pub matrix_flops: [f64; 5],
    pub bytes: f64,
}

impl Work {
    pub fn flops(&self) -> f64 {
        self.vector_flops + self.matrix_flops.iter().sum::<f64>()
    }

    pub fn add(&mut self, o: &Work) {
        self.vector_flops += o.vector_flops;
        for (a, b) in self.matrix_flops.iter_mut().zip(o.matrix_flops) {
            *a += b;
        }
        self.bytes += o.bytes;
    }
}

/// Whether a kernel is limited by arithmetic or by memory traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Compute,
    Memory,
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Bound::Compute => "compute",
            Bound::Memory => "memory",
        })
    }
}

/// A kernel's roofline estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub compute_s: f64,
    pub memory_s: f64,
    /// max(compute, memory) + launch.
    pub time: Cost,
    pub bound: Bound,
}

/// The matrix precisions in `Work::matrix_flops`' order.
pub const MATRIX_PRECISIONS: [MatrixPrecision; 5] = [
    MatrixPrecision::F32,
    MatrixPrecision::Tf32,
    MatrixPrecision::F16,
    MatrixPrecision::Bf16,
    MatrixPrecision::I16,
];

impl Work {
    /// The precision most of the matrix FLOPs run in, when there are any.
    pub fn matrix_precision(&self) -> Option<MatrixPrecision> {
        MATRIX_PRECISIONS
            .iter()
            .zip(self.matrix_flops)
            .filter(|(_, f)| *f > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| *p)
    }
}

/// The roofline estimate of a kernel doing `w` on `t`.
pub fn estimate(w: &Work, t: &Target) -> Estimate {
    let mut compute_s = w.vector_flops / t.roof().fp32;
    for (p, f) in MATRIX_PRECISIONS.iter().zip(w.matrix_flops) {
        compute_s += f / t.matrix_peak(*p);
    }
    let memory_s = w.bytes / t.roof().dram_bw;
    let bound = if compute_s >= memory_s {
        Bound::Compute
    } else {
        Bound::Memory
    };
    Estimate {
        compute_s,
        memory_s,
        time: Cost::secs(compute_s.max(memory_s) + t.roof().launch_s),
        bound,
    }
}

/// The estimate of `op` run as a kernel of its own: its FLOPs, each input read once and each output written
/// once. The cost of a graph with one kernel per op, and of an e-node before fusion decides its kernel.
pub fn standalone(
    op: &Op,
    ins: &[Option<&TensorType>],
    outs: &[TensorType],
    t: &Target,
    allow_tf32: bool,
) -> Estimate {
    let mut w = op_work_on(op, ins, outs, t, allow_tf32);
    w.bytes = ins
        .iter()
        .flatten()
        .copied()
        .chain(outs)
        .map(|t| t.bytes() as f64)
        .sum();
    estimate(&w, t)
}

/// The FLOPs of `op` as `t`'s schedules run them: on a GPU the tiled GEMMs (MatMul, Gemm, an ungrouped
/// Conv) and attention reach the tensor cores (f32 operands only as tf32, as `op_work` counts them);
/// grouped and transposed convolutions run on the SIMT lanes, so their contractions count at the fp32
/// rate there.
pub fn op_work_on(
    op: &Op,
    ins: &[Option<&TensorType>],
    outs: &[TensorType],
    t: &Target,
    allow_tf32: bool,
) -> Work {
    let mut w = op_work(op, ins, outs, allow_tf32);
    let tiled = matches!(op, Op::MatMul | Op::Gemm { .. } | Op::Attention { .. })
        || matches!(op, Op::Conv(c) if c.group == 1);
    if t.is_gpu() && !tiled {
        w.vector_flops += w.matrix_flops.iter().sum::<f64>();
        w.matrix_flops = [0.0; 5];
    }
    w
}

/// What one element of a floating-point division costs, in multiplies.
const DIVISION_FLOPS: f64 = 4.0;

/// FLOPs per element of an elementwise unary op: 1 for arithmetic, more for the transcendental functions
/// (what a vectorised polynomial costs), so fusion can weigh recomputation honestly.
fn unary_flops(u: &Unary) -> f64 {
    use Unary::*;
    match u {
        Relu
        | Neg
        | Abs
        | Floor
        | Ceil
        | Round
        | Sign
        | Not
        | BitNot
        | IsNaN
        | IsInf { .. }
        | LeakyRelu { .. } => 1.0,
        ThresholdedRelu { .. }
        | Shrink { .. }
        | HardSigmoid { .. }
        | HardSwish
        | Softsign
        | Reciprocal
        | Sqrt => 3.0,
        Exp | Log | Sigmoid | Tanh | Erf | Elu { .. } | Celu { .. } | Selu { .. } | Softplus => {
            15.0
        }
        Gelu { .. } | Mish => 20.0,
        _ => 20.0, // trigonometric and hyperbolic
    }
}

/// The precision a matrix op with these operand types computes in, given whether tf32 is allowed.
pub fn matrix_precision(dtype: DType, allow_tf32: bool) -> MatrixPrecision {
    match dtype {
        DType::BF16 => MatrixPrecision::Bf16,
        DType::F16 => MatrixPrecision::F16,
        DType::I16 => MatrixPrecision::I16,
        DType::F32 if allow_tf32 => MatrixPrecision::Tf32,
        _ => MatrixPrecision::F32,
    }
}

/// The FLOPs of `op` on inputs `ins` producing `outs` (no bytes: those depend on the kernel it is in).
pub fn op_work(
    op: &Op,
    ins: &[Option<&TensorType>],
    outs: &[TensorType],
    allow_tf32: bool,
) -> Work {
    let mut w = Work::default();
    let out_n = outs.first().map_or(0.0, |t| t.numel() as f64);
    let in_n = |i: usize| {
        ins.get(i)
            .copied()
            .flatten()
            .map_or(0.0, |t| t.numel() as f64)
    };
    let mut matrix = |flops: f64| {
        let dtype = ins
            .first()
            .copied()
            .flatten()
            .map_or(DType::F32, |t| t.dtype);
        w.matrix_flops[matrix_precision(dtype, allow_tf32) as usize] += flops;
    };
    match op {
        Op::MatMul | Op::Gemm { .. } => {
            // 2*M*N*K: the output's elements times twice the contracted length.
            let k = ins
                .first()
                .copied()
                .flatten()
                .and_then(|t| t.shape.last().copied())
                .unwrap_or(1) as f64;
            let k = match op {
                Op::Gemm { trans_a: true, .. } => ins
                    .first()
                    .copied()
                    .flatten()
                    .and_then(|t| t.shape.first().copied())
                    .unwrap_or(1) as f64,
                _ => k,
            };
            matrix(2.0 * out_n * k);
        }
        Op::Attention { .. } => {
            // scores = q @ kt: [.., S, T] = out / dv * T; two contractions and a softmax over the scores.
            let dim = |i: usize, from_end: usize| {
                ins.get(i)
                    .copied()
                    .flatten()
                    .and_then(|t| t.shape.len().checked_sub(from_end).map(|k| t.shape[k]))
                    .unwrap_or(1) as f64
            };
            let (d, t, dv) = (dim(0, 1), dim(1, 1), dim(2, 1));
            let scores = out_n / dv.max(1.0) * t;
            matrix(2.0 * scores * d + 2.0 * scores * dv);
            w.vector_flops = scores * 20.0;
        }
        Op::Conv(_) => {
            // Each output element reads C/group * kernel-volume weights: the weight's numel / M.
            let per_out = ins.get(1).copied().flatten().map_or(1.0, |t| {
                t.numel() as f64 / t.shape.first().copied().unwrap_or(1).max(1) as f64
            });
            matrix(2.0 * out_n * per_out);
        }
        Op::ConvTranspose(_) => {
            let per_in = ins.get(1).copied().flatten().map_or(1.0, |t| {
                t.numel() as f64 / t.shape.first().copied().unwrap_or(1).max(1) as f64
            });
            matrix(2.0 * in_n(0) * per_in);
        }
        Op::Unary(u) => w.vector_flops = out_n * unary_flops(u),
        Op::Binary(mlopt_ir::Binary::Pow) => w.vector_flops = out_n * 30.0,
        // A vector division issues at a fraction of a multiply's rate on every CPU and GPU (Zen 1: one
        // 8-lane `vdivps` per 5 cycles, against two multiplies a cycle), so `x / c` prices above
        // `x * (1 / c)` and extraction takes the product where a rule offers it.
        Op::Binary(mlopt_ir::Binary::Div) if outs.first().is_some_and(|t| t.dtype.is_float()) => {
            w.vector_flops = out_n * DIVISION_FLOPS
        }
        Op::Binary(_) | Op::Where | Op::Choose | Op::Clip | Op::Cast { .. } => {
            w.vector_flops = out_n
        }
        Op::Nary(_) => w.vector_flops = out_n * ins.len().saturating_sub(1).max(1) as f64,
        Op::Softmax { .. } | Op::LogSoftmax { .. } => w.vector_flops = out_n * 20.0,
        Op::LayerNorm { .. } | Op::InstanceNorm { .. } => w.vector_flops = out_n * 8.0,
        Op::BatchNorm { .. } => w.vector_flops = out_n * 2.0,
        Op::Lrn { size, .. } => w.vector_flops = out_n * (*size as f64 + 20.0),
        Op::Reduce { kind, .. } => {
            let per = match kind {
                ReduceKind::LogSumExp => 16.0,
                ReduceKind::L2 | ReduceKind::SumSquare | ReduceKind::LogSum => 2.0,
                _ => 1.0,
            };
            w.vector_flops = in_n(0) * per;
        }
        Op::Arg { .. } | Op::GlobalAveragePool | Op::GlobalMaxPool | Op::TopK { .. } => {
            w.vector_flops = in_n(0)
        }
        Op::MaxPool { pool, .. } | Op::AveragePool { pool, .. } => {
            w.vector_flops = out_n * pool.kernel.iter().product::<usize>() as f64
        }
        Op::Resize(_) | Op::GridSample { .. } => w.vector_flops = out_n * 8.0,
        Op::ScatterNd { reduction, .. } | Op::ScatterElements { reduction, .. } => {
            w.vector_flops = if *reduction == mlopt_ir::ScatterReduction::None {
                0.0
            } else {
                in_n(2)
            }
        }
        // Layout, indexing and leaves move data; they do no arithmetic.
        _ => {}
    }
    w
}
