//! The closed set of graph operations, with typed, fully resolved attributes.
//!
//! Attributes are static: the importer resolves everything ONNX passes as "shape-like" inputs (Reshape's
//! shape, Slice's starts/ends, Pad's pads, Resize's scales/sizes, reduction axes), negative axes, `auto_pad`
//! and `noop_with_empty_axes`. ONNX ops that are only another op with different spelling become that op
//! (Flatten/Squeeze/Unsqueeze -> `Reshape`, Upsample -> `Resize`, Sum/Mean/Max/Min -> `Nary`); the table in
//! docs/onnx-ops.md lists every mapping.

use crate::dtype::DType;
use crate::tensor::Tensor;
use std::sync::Arc;

/// Elementwise functions of one input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    Relu,
    Sigmoid,
    Tanh,
    Erf,
    Softplus,
    Softsign,
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Neg,
    Abs,
    Floor,
    Ceil,
    Round,
    Sign,
    Not,
    HardSwish,
    Mish,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    IsNaN,
    /// Bitwise complement of an integer.
    BitNot,
    IsInf {
        detect_negative: bool,
        detect_positive: bool,
    },
    LeakyRelu {
        alpha: f32,
    },
    Elu {
        alpha: f32,
    },
    Celu {
        alpha: f32,
    },
    Selu {
        alpha: f32,
        gamma: f32,
    },
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    ThresholdedRelu {
        alpha: f32,
    },
    Shrink {
        bias: f32,
        lambd: f32,
    },
    /// `tanh: true` is the tanh approximation (ONNX `approximate="tanh"`).
    Gelu {
        tanh: bool,
    },
}

/// Elementwise functions of two broadcast inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    /// `fmod: false` takes the divisor's sign (Python `%`), `true` the dividend's (C `fmod`).
    Mod {
        fmod: bool,
    },
    PRelu,
    Equal,
    Greater,
    Less,
    GreaterOrEqual,
    LessOrEqual,
    And,
    Or,
    Xor,
    BitAnd,
    BitOr,
    BitXor,
    /// Shifts the first input by the second (unsigned types; bits shifted out are lost).
    BitShift {
        left: bool,
    },
}

impl Binary {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            Binary::Equal
                | Binary::Greater
                | Binary::Less
                | Binary::GreaterOrEqual
                | Binary::LessOrEqual
        )
    }
    pub fn is_logical(self) -> bool {
        matches!(self, Binary::And | Binary::Or | Binary::Xor)
    }
    pub fn is_bitwise(self) -> bool {
        matches!(
            self,
            Binary::BitAnd | Binary::BitOr | Binary::BitXor | Binary::BitShift { .. }
        )
    }
}

/// Variadic elementwise ops over any number of broadcast inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nary {
    Sum,
    Mean,
    Max,
    Min,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

/// Convolution geometry; `pads` holds all begins then all ends (ONNX order), `auto_pad` already resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvAttrs {
    pub strides: Vec<usize>,
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub group: usize,
    /// ConvTranspose only: extra size added to one side of each output dimension.
    pub output_padding: Vec<usize>,
}

/// Pooling window geometry; `pads` holds all begins then all ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolAttrs {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub ceil_mode: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordMode {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Resize with everything resolved: per-axis `scales` (used by the coordinate transform) and output `sizes`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResizeAttrs {
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub nearest: NearestMode,
    pub cubic_coeff_a: f32,
    pub exclude_outside: bool,
    pub extrapolation_value: f32,
    pub antialias: bool,
    pub scales: Vec<f32>,
    pub sizes: Vec<usize>,
    /// tf_crop_and_resize only: starts then ends, normalised coordinates, one pair per axis.
    pub roi: Vec<f32>,
}

/// Where GridSample reads outside the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

/// How a scatter combines an update with the value already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

/// One graph operation. Inputs and outputs are positional, as in ONNX.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A graph input; its name is the node's name.
    Input,
    /// A constant; its name (initializer name) is the node's name.
    Const(Arc<Tensor>),
    Unary(Unary),
    Binary(Binary),
    Nary(Nary),
    /// `where cond, x, y`.
    Where,
    /// `choose cond, then, else`: `then` when the one-element bool `cond` holds, else `else` (an `If`
    /// whose condition is known only at run time). Only the operand taken is computed: the nodes that
    /// only an untaken operand needs do not run (`crate::demand`), in the interpreter and in compiled
    /// code alike.
    Choose,
    /// `clip x, min?, max?`.
    Clip,
    Cast {
        to: DType,
    },
    /// The same bytes as another element type of the same size (ONNX's BitCast).
    BitCast {
        to: DType,
    },
    Softmax {
        axis: usize,
    },
    LogSoftmax {
        axis: usize,
    },
    MatMul,
    /// `gemm a, b, c?` = alpha * op(a) op(b) + beta * c.
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    },
    /// `conv x, w, b?`.
    Conv(ConvAttrs),
    /// `conv_transpose x, w, b?`.
    ConvTranspose(ConvAttrs),
    /// `batch_norm x, scale, bias, mean, var` (inference form).
    BatchNorm {
        epsilon: f32,
    },
    /// `instance_norm x, scale, bias`.
    InstanceNorm {
        epsilon: f32,
    },
    /// `layer_norm x, scale, bias?` -> y, mean?, inv_std_dev?; normalises over axes `axis..`.
    LayerNorm {
        axis: usize,
        epsilon: f32,
    },
    Lrn {
        size: usize,
        alpha: f32,
        beta: f32,
        bias: f32,
    },
    /// -> values and (optionally) i64 indices of each maximum, flattened over (N*C, spatial) in row-major
    /// order, or column-major over the spatial axes when `col_major` (ONNX `storage_order=1`).
    MaxPool {
        pool: PoolAttrs,
        col_major: bool,
    },
    AveragePool {
        pool: PoolAttrs,
        count_include_pad: bool,
    },
    GlobalAveragePool,
    GlobalMaxPool,
    /// Reduces `axes` (sorted, unique; may be empty = copy).
    Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
        keepdims: bool,
    },
    /// ArgMax (`max: true`) or ArgMin; outputs i64.
    Arg {
        max: bool,
        axis: usize,
        keepdims: bool,
        select_last_index: bool,
    },
    Reshape {
        shape: Vec<usize>,
    },
    Transpose {
        perm: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    Split {
        axis: usize,
        sizes: Vec<usize>,
    },
    /// Per axis of the input: first index, step (non-zero, may be negative) and number of elements taken.
    Slice {
        starts: Vec<usize>,
        steps: Vec<i64>,
        lens: Vec<usize>,
    },
    /// `gather data, indices`.
    Gather {
        axis: usize,
    },
    /// `gather_elements data, indices`.
    GatherElements {
        axis: usize,
    },
    /// Broadcasts to `shape` (the resolved output shape).
    Expand {
        shape: Vec<usize>,
    },
    Tile {
        repeats: Vec<usize>,
    },
    /// `pads` holds all begins then all ends; negative values crop.
    Pad {
        pads: Vec<i64>,
        mode: PadMode,
        value: f64,
    },
    Resize(ResizeAttrs),
    DepthToSpace {
        blocksize: usize,
        crd: bool,
    },
    SpaceToDepth {
        blocksize: usize,
    },
    /// The `k` largest (or smallest) elements along `axis` and their i64 indices; ties keep the lower index.
    TopK {
        axis: usize,
        k: usize,
        largest: bool,
        sorted: bool,
    },
    /// `gather_nd data, indices`: index tuples in the last axis of `indices` select slices of `data`.
    GatherNd {
        batch_dims: usize,
    },
    /// `scatter_nd data, indices, updates`.
    ScatterNd {
        reduction: ScatterReduction,
    },
    /// `scatter_elements data, indices, updates` along `axis`.
    ScatterElements {
        axis: usize,
        reduction: ScatterReduction,
    },
    /// `grid_sample x, grid`: samples `x` [N, C, spatial...] at the normalised coordinates in `grid`
    /// [N, out..., rank] (last axis innermost-first, i.e. x then y).
    GridSample {
        mode: ResizeMode,
        padding: GridPadding,
        align_corners: bool,
    },
    /// `attention q, kt, v, mask?` = softmax(q @ kt * scale + mask, last axis) @ v: scaled dot-product
    /// attention with the key already transposed to [..., d, T]; the optimiser's fused form of the
    /// MatMul -> scale -> mask -> Softmax -> MatMul chain. Narrow (bf16, f16) operands compute the
    /// scores, the softmax and both products in f32 and round the output once.
    Attention {
        scale: f32,
    },
    /// Upper (`upper: true`) or lower triangle of the last two axes, offset by diagonal `k`.
    Trilu {
        upper: bool,
        k: i64,
    },
    /// Running sums or products along `axis` (ONNX CumSum, CumProd), in index order (from the end when
    /// `reverse`); `exclusive` leaves each position's own element out (the first result is 0 or 1).
    /// bf16 and f16 accumulate in f32 and round each result.
    Cumulative(CumulativeAttrs),
    /// The indices of the nonzero elements (ONNX NonZero): [rank, n] i64 in row-major order, n their
    /// number. Its size depends on the data, so it is computed at its bound, n = the input's element
    /// count: output 0 holds the indices in its first `count` columns and zeros after them, output 1
    /// is `count` (i64 scalar). `crate::extent` follows such values to the graph's outputs.
    NonZero,
    /// `compress x, cond` (ONNX Compress along `axis`): the slices of `x` along `axis` whose `cond`
    /// (bool, 1-D, possibly shorter) is true, in order. Computed at its bound (as many slices as `cond`
    /// has, at most `x`'s extent) with the rest zero; output 1 is the count (see `NonZero`).
    Compress {
        axis: usize,
    },
    /// `non_max_suppression boxes, scores, max_per_class?, iou_threshold?, score_threshold?` (ONNX
    /// NonMaxSuppression): per batch and class, boxes greedily chosen by descending score (ties: lower
    /// index first) among those scoring above `score_threshold`, skipping each whose IoU with a chosen
    /// one exceeds `iou_threshold`, at most `max_per_class` (absent or 0: none). Output 0 is [bound, 3]
    /// i64 rows (batch, class, box) with zeros after the count, output 1 the count (see `NonZero`);
    /// `bound` is what `max_per_class` allows when the importer knows it, else every box of every
    /// class. `center_point_box`: boxes are (x, y, w, h) rather than two corners (y1, x1, y2, x2).
    NonMaxSuppression {
        center_point_box: bool,
        bound: usize,
    },
    /// `unique x` (ONNX Unique along `axis`): the distinct slices of `x` along `axis`, in ascending
    /// (lexicographic) order when `sorted`, else in order of first occurrence; the index of each one's
    /// first occurrence; for each slice of `x`, the index of its distinct slice (inverse, of static
    /// size); and how many times each occurs. Outputs 0, 1 and 3 are computed at the bound (every
    /// slice distinct) with zeros after the count, output 4 (see `NonZero`).
    Unique {
        axis: usize,
        sorted: bool,
    },
}

/// A cumulative op's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CumulativeAttrs {
    pub kind: Accumulate,
    pub axis: usize,
    pub exclusive: bool,
    pub reverse: bool,
}

/// What a cumulative op accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulate {
    Sum,
    Prod,
}

impl Op {
    /// Whether the op's size depends on its data: computed at a bound, with the count as its last
    /// output (see `crate::extent`).
    pub fn counts(&self) -> bool {
        matches!(
            self,
            Op::NonZero | Op::Compress { .. } | Op::NonMaxSuppression { .. } | Op::Unique { .. }
        )
    }

    /// (fewest, most) inputs; `usize::MAX` for variadic ops.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input | Op::Const(_) => (0, 0),
            Op::Unary(_)
            | Op::Cast { .. }
            | Op::BitCast { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::Lrn { .. }
            | Op::MaxPool { .. }
            | Op::AveragePool { .. }
            | Op::GlobalAveragePool
            | Op::GlobalMaxPool
            | Op::Reduce { .. }
            | Op::Arg { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Split { .. }
            | Op::Slice { .. }
            | Op::Expand { .. }
            | Op::Tile { .. }
            | Op::Pad { .. }
            | Op::Resize(_)
            | Op::DepthToSpace { .. }
            | Op::SpaceToDepth { .. }
            | Op::Trilu { .. }
            | Op::Cumulative(_)
            | Op::TopK { .. }
            | Op::NonZero
            | Op::Unique { .. } => (1, 1),
            Op::Binary(_)
            | Op::MatMul
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::GridSample { .. }
            | Op::Compress { .. } => (2, 2),
            Op::NonMaxSuppression { .. } => (2, 5),
            Op::ScatterNd { .. } | Op::ScatterElements { .. } => (3, 3),
            Op::Nary(_) | Op::Concat { .. } => (1, usize::MAX),
            Op::Where | Op::Choose => (3, 3),
            Op::Attention { .. } => (3, 4),
            Op::Clip => (1, 3),
            Op::Gemm { .. } | Op::Conv(_) | Op::ConvTranspose(_) => (2, 3),
            Op::BatchNorm { .. } => (5, 5),
            Op::InstanceNorm { .. } => (3, 3),
            Op::LayerNorm { .. } => (2, 3),
        }
    }

    /// Whether each output element depends only on the input elements at the same (broadcast) index: the
    /// ops a kernel can apply in registers, and an output that may overwrite such an input in place.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Nary(_)
                | Op::Where
                | Op::Clip
                | Op::Cast { .. }
                | Op::BatchNorm { .. }
        )
    }

    /// Whether input `i` may be left out (`_` in the text format).
    pub fn input_optional(&self, i: usize) -> bool {
        match self {
            Op::Clip => i >= 1,
            Op::NonMaxSuppression { .. } => i >= 2,
            Op::Attention { .. } => i == 3,
            Op::Gemm { .. } | Op::Conv(_) | Op::ConvTranspose(_) | Op::LayerNorm { .. } => i == 2,
            _ => false,
        }
    }
}
