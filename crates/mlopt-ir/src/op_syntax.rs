//! How each op is spelled in the text IR (a snake_case name and `[key=value, ...]` attributes sorted by
//! key) and the parser's inverse, side by side so they stay in step; `text_tests` round-trips every op.

use crate::dtype::DType;
use crate::op::*;
use std::collections::BTreeMap;

/// Attributes as printed: key and rendered value.
pub type Spelled = Vec<(&'static str, String)>;

fn flt(v: f32) -> String {
    format!("{v:?}")
}
fn ints<T: ToString>(v: &[T]) -> String {
    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}
fn flts(v: &[f32]) -> String {
    let parts: Vec<String> = v.iter().map(|x| flt(*x)).collect();
    format!("[{}]", parts.join(","))
}
fn flag(v: bool) -> String {
    (v as u8).to_string()
}

const UNARY_NAMES: &[(&str, Unary)] = &[
    ("relu", Unary::Relu),
    ("sigmoid", Unary::Sigmoid),
    ("tanh", Unary::Tanh),
    ("erf", Unary::Erf),
    ("softplus", Unary::Softplus),
    ("softsign", Unary::Softsign),
    ("sqrt", Unary::Sqrt),
    ("reciprocal", Unary::Reciprocal),
    ("exp", Unary::Exp),
    ("log", Unary::Log),
    ("neg", Unary::Neg),
    ("abs", Unary::Abs),
    ("floor", Unary::Floor),
    ("ceil", Unary::Ceil),
    ("round", Unary::Round),
    ("sign", Unary::Sign),
    ("not", Unary::Not),
    ("hard_swish", Unary::HardSwish),
    ("mish", Unary::Mish),
    ("sin", Unary::Sin),
    ("cos", Unary::Cos),
    ("tan", Unary::Tan),
    ("asin", Unary::Asin),
    ("acos", Unary::Acos),
    ("atan", Unary::Atan),
    ("sinh", Unary::Sinh),
    ("cosh", Unary::Cosh),
    ("asinh", Unary::Asinh),
    ("acosh", Unary::Acosh),
    ("atanh", Unary::Atanh),
    ("is_nan", Unary::IsNaN),
    ("bit_not", Unary::BitNot),
];

const BINARY_NAMES: &[(&str, Binary)] = &[
    ("add", Binary::Add),
    ("sub", Binary::Sub),
    ("mul", Binary::Mul),
    ("div", Binary::Div),
    ("pow", Binary::Pow),
    ("prelu", Binary::PRelu),
    ("equal", Binary::Equal),
    ("greater", Binary::Greater),
    ("less", Binary::Less),
    ("greater_or_equal", Binary::GreaterOrEqual),
    ("less_or_equal", Binary::LessOrEqual),
    ("and", Binary::And),
    ("or", Binary::Or),
    ("xor", Binary::Xor),
    ("bit_and", Binary::BitAnd),
    ("bit_or", Binary::BitOr),
    ("bit_xor", Binary::BitXor),
];

const NARY_NAMES: &[(&str, Nary)] = &[
    ("sum", Nary::Sum),
    ("mean", Nary::Mean),
    ("max", Nary::Max),
    ("min", Nary::Min),
];

const REDUCE_NAMES: &[(&str, ReduceKind)] = &[
    ("reduce_sum", ReduceKind::Sum),
    ("reduce_mean", ReduceKind::Mean),
    ("reduce_max", ReduceKind::Max),
    ("reduce_min", ReduceKind::Min),
    ("reduce_prod", ReduceKind::Prod),
    ("reduce_l1", ReduceKind::L1),
    ("reduce_l2", ReduceKind::L2),
    ("reduce_sum_square", ReduceKind::SumSquare),
    ("reduce_log_sum", ReduceKind::LogSum),
    ("reduce_log_sum_exp", ReduceKind::LogSumExp),
];

const PAD_MODES: &[(&str, PadMode)] = &[
    ("constant", PadMode::Constant),
    ("reflect", PadMode::Reflect),
    ("edge", PadMode::Edge),
    ("wrap", PadMode::Wrap),
];
const RESIZE_MODES: &[(&str, ResizeMode)] = &[
    ("nearest", ResizeMode::Nearest),
    ("linear", ResizeMode::Linear),
    ("cubic", ResizeMode::Cubic),
];
const COORD_MODES: &[(&str, CoordMode)] = &[
    ("half_pixel", CoordMode::HalfPixel),
    ("half_pixel_symmetric", CoordMode::HalfPixelSymmetric),
    ("pytorch_half_pixel", CoordMode::PytorchHalfPixel),
    ("align_corners", CoordMode::AlignCorners),
    ("asymmetric", CoordMode::Asymmetric),
    ("tf_crop_and_resize", CoordMode::TfCropAndResize),
];
const NEAREST_MODES: &[(&str, NearestMode)] = &[
    ("round_prefer_floor", NearestMode::RoundPreferFloor),
    ("round_prefer_ceil", NearestMode::RoundPreferCeil),
    ("floor", NearestMode::Floor),
    ("ceil", NearestMode::Ceil),
];

const GRID_PADDINGS: &[(&str, GridPadding)] = &[
    ("zeros", GridPadding::Zeros),
    ("border", GridPadding::Border),
    ("reflection", GridPadding::Reflection),
];

const SCATTER_REDUCTIONS: &[(&str, ScatterReduction)] = &[
    ("none", ScatterReduction::None),
    ("add", ScatterReduction::Add),
    ("mul", ScatterReduction::Mul),
    ("max", ScatterReduction::Max),
    ("min", ScatterReduction::Min),
];

fn name_of<T: PartialEq + Copy>(table: &[(&'static str, T)], v: T) -> &'static str {
    table
        .iter()
        .find(|(_, x)| *x == v)
        .map(|(n, _)| *n)
        .unwrap_or("?")
}
fn lookup<T: Copy>(table: &[(&'static str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

impl Op {
    /// The op's name in the text IR.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Const(_) => "const",
            Op::Unary(u) => match u {
                Unary::IsInf { .. } => "is_inf",
                Unary::LeakyRelu { .. } => "leaky_relu",
                Unary::Elu { .. } => "elu",
                Unary::Celu { .. } => "celu",
                Unary::Selu { .. } => "selu",
                Unary::HardSigmoid { .. } => "hard_sigmoid",
                Unary::ThresholdedRelu { .. } => "thresholded_relu",
                Unary::Shrink { .. } => "shrink",
                Unary::Gelu { .. } => "gelu",
                u => name_of(UNARY_NAMES, *u),
            },
            Op::Binary(Binary::Mod { .. }) => "mod",
            Op::Binary(Binary::BitShift { .. }) => "bit_shift",
            Op::Binary(op) => name_of(BINARY_NAMES, *op),
            Op::Nary(op) => name_of(NARY_NAMES, *op),
            Op::Where => "where",
            Op::Choose => "choose",
            Op::Clip => "clip",
            Op::Cast { .. } => "cast",
            Op::BitCast { .. } => "bit_cast",
            Op::Softmax { .. } => "softmax",
            Op::Attention { .. } => "attention",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::MatMul => "matmul",
            Op::Gemm { .. } => "gemm",
            Op::Conv(_) => "conv",
            Op::ConvTranspose(_) => "conv_transpose",
            Op::BatchNorm { .. } => "batch_norm",
            Op::InstanceNorm { .. } => "instance_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Lrn { .. } => "lrn",
            Op::MaxPool { .. } => "max_pool",
            Op::AveragePool { .. } => "average_pool",
            Op::GlobalAveragePool => "global_average_pool",
            Op::GlobalMaxPool => "global_max_pool",
            Op::Reduce { kind, .. } => name_of(REDUCE_NAMES, *kind),
            Op::Arg { max: true, .. } => "arg_max",
            Op::Arg { max: false, .. } => "arg_min",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Concat { .. } => "concat",
            Op::Split { .. } => "split",
            Op::Slice { .. } => "slice",
            Op::Gather { .. } => "gather",
            Op::GatherElements { .. } => "gather_elements",
            Op::Expand { .. } => "expand",
            Op::Tile { .. } => "tile",
            Op::Pad { .. } => "pad",
            Op::Resize(_) => "resize",
            Op::DepthToSpace { .. } => "depth_to_space",
            Op::SpaceToDepth { .. } => "space_to_depth",
            Op::Trilu { .. } => "trilu",
            Op::Cumulative(c) => match c.kind {
                Accumulate::Sum => "cum_sum",
                Accumulate::Prod => "cum_prod",
            },
            Op::TopK { .. } => "top_k",
            Op::GatherNd { .. } => "gather_nd",
            Op::ScatterNd { .. } => "scatter_nd",
            Op::ScatterElements { .. } => "scatter_elements",
            Op::GridSample { .. } => "grid_sample",
            Op::NonZero => "non_zero",
            Op::Compress { .. } => "compress",
            Op::NonMaxSuppression { .. } => "non_max_suppression",
            Op::Unique { .. } => "unique",
        }
    }

    /// The op's attributes as printed, sorted by key. Constants print their data elsewhere.
    pub fn spell_attrs(&self) -> Spelled {
        let mut a: Spelled = match self {
            Op::Unary(u) => match *u {
                Unary::IsInf {
                    detect_negative,
                    detect_positive,
                } => {
                    vec![
                        ("detect_negative", flag(detect_negative)),
                        ("detect_positive", flag(detect_positive)),
                    ]
                }
                Unary::LeakyRelu { alpha }
                | Unary::Elu { alpha }
                | Unary::Celu { alpha }
                | Unary::ThresholdedRelu { alpha } => vec![("alpha", flt(alpha))],
                Unary::Selu { alpha, gamma } => vec![("alpha", flt(alpha)), ("gamma", flt(gamma))],
                Unary::HardSigmoid { alpha, beta } => {
                    vec![("alpha", flt(alpha)), ("beta", flt(beta))]
                }
                Unary::Shrink { bias, lambd } => vec![("bias", flt(bias)), ("lambd", flt(lambd))],
                Unary::Gelu { tanh } => vec![("tanh", flag(tanh))],
                _ => vec![],
            },
            Op::Binary(Binary::Mod { fmod }) => vec![("fmod", flag(*fmod))],
            Op::Binary(Binary::BitShift { left }) => vec![("left", flag(*left))],
            Op::Cast { to } | Op::BitCast { to } => vec![("to", to.name().to_string())],
            Op::Attention { scale } => vec![("scale", flt(*scale))],
            Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Concat { axis } => {
                vec![("axis", axis.to_string())]
            }
            Op::Gather { axis } | Op::GatherElements { axis } | Op::Compress { axis } => {
                vec![("axis", axis.to_string())]
            }
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => {
                vec![
                    ("alpha", flt(*alpha)),
                    ("beta", flt(*beta)),
                    ("trans_a", flag(*trans_a)),
                    ("trans_b", flag(*trans_b)),
                ]
            }
            Op::Conv(c) => vec![
                ("dilations", ints(&c.dilations)),
                ("group", c.group.to_string()),
                ("pads", ints(&c.pads)),
                ("strides", ints(&c.strides)),
            ],
            Op::ConvTranspose(c) => vec![
                ("dilations", ints(&c.dilations)),
                ("group", c.group.to_string()),
                ("output_padding", ints(&c.output_padding)),
                ("pads", ints(&c.pads)),
                ("strides", ints(&c.strides)),
            ],
            Op::BatchNorm { epsilon } | Op::InstanceNorm { epsilon } => {
                vec![("epsilon", flt(*epsilon))]
            }
            Op::LayerNorm { axis, epsilon } => {
                vec![("axis", axis.to_string()), ("epsilon", flt(*epsilon))]
            }
            Op::Lrn {
                size,
                alpha,
                beta,
                bias,
            } => vec![
                ("alpha", flt(*alpha)),
                ("beta", flt(*beta)),
                ("bias", flt(*bias)),
                ("size", size.to_string()),
            ],
            Op::MaxPool { pool, col_major } => {
                let mut v = spell_pool(pool);
                v.push(("col_major", flag(*col_major)));
                v
            }
            Op::AveragePool {
                pool,
                count_include_pad,
            } => {
                let mut v = spell_pool(pool);
                v.push(("count_include_pad", flag(*count_include_pad)));
                v
            }
            Op::Reduce { axes, keepdims, .. } => {
                vec![("axes", ints(axes)), ("keepdims", flag(*keepdims))]
            }
            Op::Arg {
                axis,
                keepdims,
                select_last_index,
                ..
            } => {
                vec![
                    ("axis", axis.to_string()),
                    ("keepdims", flag(*keepdims)),
                    ("select_last_index", flag(*select_last_index)),
                ]
            }
            Op::Reshape { shape } => vec![("shape", ints(shape))],
            Op::Transpose { perm } => vec![("perm", ints(perm))],
            Op::Split { axis, sizes } => vec![("axis", axis.to_string()), ("sizes", ints(sizes))],
            Op::Slice {
                starts,
                steps,
                lens,
            } => {
                vec![
                    ("lens", ints(lens)),
                    ("starts", ints(starts)),
                    ("steps", ints(steps)),
                ]
            }
            Op::Expand { shape } => vec![("shape", ints(shape))],
            Op::Tile { repeats } => vec![("repeats", ints(repeats))],
            Op::Pad { pads, mode, value } => vec![
                ("mode", name_of(PAD_MODES, *mode).to_string()),
                ("pads", ints(pads)),
                ("value", format!("{value:?}")),
            ],
            Op::Resize(r) => vec![
                ("antialias", flag(r.antialias)),
                ("coord", name_of(COORD_MODES, r.coord).to_string()),
                ("cubic_coeff_a", flt(r.cubic_coeff_a)),
                ("exclude_outside", flag(r.exclude_outside)),
                ("extrapolation_value", flt(r.extrapolation_value)),
                ("mode", name_of(RESIZE_MODES, r.mode).to_string()),
                ("nearest", name_of(NEAREST_MODES, r.nearest).to_string()),
                ("roi", flts(&r.roi)),
                ("scales", flts(&r.scales)),
                ("sizes", ints(&r.sizes)),
            ],
            Op::DepthToSpace { blocksize, crd } => {
                vec![("blocksize", blocksize.to_string()), ("crd", flag(*crd))]
            }
            Op::SpaceToDepth { blocksize } => vec![("blocksize", blocksize.to_string())],
            Op::Trilu { upper, k } => vec![("k", k.to_string()), ("upper", flag(*upper))],
            Op::Cumulative(c) => vec![
                ("axis", c.axis.to_string()),
                ("exclusive", flag(c.exclusive)),
                ("reverse", flag(c.reverse)),
            ],
            Op::Unique { axis, sorted } => {
                vec![("axis", axis.to_string()), ("sorted", flag(*sorted))]
            }
            Op::NonMaxSuppression {
                center_point_box: c,
                bound,
            } => vec![("bound", bound.to_string()), ("center_point_box", flag(*c))],
            Op::TopK {
                axis,
                k,
                largest,
                sorted,
            } => vec![
                ("axis", axis.to_string()),
                ("k", k.to_string()),
                ("largest", flag(*largest)),
                ("sorted", flag(*sorted)),
            ],
            Op::GridSample {
                mode,
                padding,
                align_corners,
            } => vec![
                ("align_corners", flag(*align_corners)),
                ("mode", name_of(RESIZE_MODES, *mode).to_string()),
                ("padding", name_of(GRID_PADDINGS, *padding).to_string()),
            ],
            Op::GatherNd { batch_dims } => vec![("batch_dims", batch_dims.to_string())],
            Op::ScatterNd { reduction } => vec![(
                "reduction",
                name_of(SCATTER_REDUCTIONS, *reduction).to_string(),
            )],
            Op::ScatterElements { axis, reduction } => vec![
                ("axis", axis.to_string()),
                (
                    "reduction",
                    name_of(SCATTER_REDUCTIONS, *reduction).to_string(),
                ),
            ],
            _ => vec![],
        };
        a.sort_by_key(|(k, _)| *k);
        a
    }

    /// Builds an op from its text name and attributes (the inverse of `name` + `spell_attrs`). Constants and
    /// inputs are built by the parser itself.
    pub fn from_spelling(name: &str, a: &mut AttrReader) -> Result<Op, String> {
        if let Some(u) = lookup(UNARY_NAMES, name) {
            return Ok(Op::Unary(u));
        }
        if let Some(op) = lookup(BINARY_NAMES, name) {
            return Ok(Op::Binary(op));
        }
        if let Some(op) = lookup(NARY_NAMES, name) {
            return Ok(Op::Nary(op));
        }
        if let Some(kind) = lookup(REDUCE_NAMES, name) {
            return Ok(Op::Reduce {
                kind,
                axes: a.usizes("axes")?,
                keepdims: a.bool("keepdims")?,
            });
        }
        let op = match name {
            "is_inf" => Op::Unary(Unary::IsInf {
                detect_negative: a.bool("detect_negative")?,
                detect_positive: a.bool("detect_positive")?,
            }),
            "leaky_relu" => Op::Unary(Unary::LeakyRelu {
                alpha: a.f32("alpha")?,
            }),
            "elu" => Op::Unary(Unary::Elu {
                alpha: a.f32("alpha")?,
            }),
            "celu" => Op::Unary(Unary::Celu {
                alpha: a.f32("alpha")?,
            }),
            "thresholded_relu" => Op::Unary(Unary::ThresholdedRelu {
                alpha: a.f32("alpha")?,
            }),
            "selu" => Op::Unary(Unary::Selu {
                alpha: a.f32("alpha")?,
                gamma: a.f32("gamma")?,
            }),
            "hard_sigmoid" => Op::Unary(Unary::HardSigmoid {
                alpha: a.f32("alpha")?,
                beta: a.f32("beta")?,
            }),
            "shrink" => Op::Unary(Unary::Shrink {
                bias: a.f32("bias")?,
                lambd: a.f32("lambd")?,
            }),
            "gelu" => Op::Unary(Unary::Gelu {
                tanh: a.bool("tanh")?,
            }),
            "mod" => Op::Binary(Binary::Mod {
                fmod: a.bool("fmod")?,
            }),
            "bit_shift" => Op::Binary(Binary::BitShift {
                left: a.bool("left")?,
            }),
            "where" => Op::Where,
            "choose" => Op::Choose,
            "clip" => Op::Clip,
            "cast" => {
                let to = a.ident("to")?;
                Op::Cast {
                    to: DType::from_name(&to).ok_or(format!("unknown dtype '{to}'"))?,
                }
            }
            "bit_cast" => {
                let to = a.ident("to")?;
                Op::BitCast {
                    to: DType::from_name(&to).ok_or(format!("unknown dtype '{to}'"))?,
                }
            }
            "softmax" => Op::Softmax {
                axis: a.usize("axis")?,
            },
            "attention" => Op::Attention {
                scale: a.f32("scale")?,
            },
            "log_softmax" => Op::LogSoftmax {
                axis: a.usize("axis")?,
            },
            "matmul" => Op::MatMul,
            "gemm" => Op::Gemm {
                alpha: a.f32("alpha")?,
                beta: a.f32("beta")?,
                trans_a: a.bool("trans_a")?,
                trans_b: a.bool("trans_b")?,
            },
            "conv" | "conv_transpose" => {
                let c = ConvAttrs {
                    strides: a.usizes("strides")?,
                    pads: a.usizes("pads")?,
                    dilations: a.usizes("dilations")?,
                    group: a.usize("group")?,
                    output_padding: if name == "conv" {
                        vec![]
                    } else {
                        a.usizes("output_padding")?
                    },
                };
                if name == "conv" {
                    Op::Conv(c)
                } else {
                    Op::ConvTranspose(c)
                }
            }
            "batch_norm" => Op::BatchNorm {
                epsilon: a.f32("epsilon")?,
            },
            "instance_norm" => Op::InstanceNorm {
                epsilon: a.f32("epsilon")?,
            },
            "layer_norm" => Op::LayerNorm {
                axis: a.usize("axis")?,
                epsilon: a.f32("epsilon")?,
            },
            "lrn" => Op::Lrn {
                size: a.usize("size")?,
                alpha: a.f32("alpha")?,
                beta: a.f32("beta")?,
                bias: a.f32("bias")?,
            },
            "max_pool" => Op::MaxPool {
                pool: read_pool(a)?,
                col_major: a.bool("col_major")?,
            },
            "average_pool" => Op::AveragePool {
                pool: read_pool(a)?,
                count_include_pad: a.bool("count_include_pad")?,
            },
            "global_average_pool" => Op::GlobalAveragePool,
            "global_max_pool" => Op::GlobalMaxPool,
            "arg_max" | "arg_min" => Op::Arg {
                max: name == "arg_max",
                axis: a.usize("axis")?,
                keepdims: a.bool("keepdims")?,
                select_last_index: a.bool("select_last_index")?,
            },
            "reshape" => Op::Reshape {
                shape: a.usizes("shape")?,
            },
            "transpose" => Op::Transpose {
                perm: a.usizes("perm")?,
            },
            "concat" => Op::Concat {
                axis: a.usize("axis")?,
            },
            "split" => Op::Split {
                axis: a.usize("axis")?,
                sizes: a.usizes("sizes")?,
            },
            "slice" => Op::Slice {
                starts: a.usizes("starts")?,
                steps: a.ints("steps")?,
                lens: a.usizes("lens")?,
            },
            "gather" => Op::Gather {
                axis: a.usize("axis")?,
            },
            "gather_elements" => Op::GatherElements {
                axis: a.usize("axis")?,
            },
            "expand" => Op::Expand {
                shape: a.usizes("shape")?,
            },
            "tile" => Op::Tile {
                repeats: a.usizes("repeats")?,
            },
            "pad" => {
                let mode = a.ident("mode")?;
                Op::Pad {
                    pads: a.ints("pads")?,
                    mode: lookup(PAD_MODES, &mode).ok_or(format!("unknown pad mode '{mode}'"))?,
                    value: a.f64("value")?,
                }
            }
            "resize" => {
                let (mode, coord, nearest) =
                    (a.ident("mode")?, a.ident("coord")?, a.ident("nearest")?);
                Op::Resize(ResizeAttrs {
                    mode: lookup(RESIZE_MODES, &mode)
                        .ok_or(format!("unknown resize mode '{mode}'"))?,
                    coord: lookup(COORD_MODES, &coord)
                        .ok_or(format!("unknown coord mode '{coord}'"))?,
                    nearest: lookup(NEAREST_MODES, &nearest)
                        .ok_or(format!("unknown nearest mode '{nearest}'"))?,
                    cubic_coeff_a: a.f32("cubic_coeff_a")?,
                    exclude_outside: a.bool("exclude_outside")?,
                    extrapolation_value: a.f32("extrapolation_value")?,
                    antialias: a.bool("antialias")?,
                    scales: a.f32s("scales")?,
                    sizes: a.usizes("sizes")?,
                    roi: a.f32s("roi")?,
                })
            }
            "depth_to_space" => Op::DepthToSpace {
                blocksize: a.usize("blocksize")?,
                crd: a.bool("crd")?,
            },
            "space_to_depth" => Op::SpaceToDepth {
                blocksize: a.usize("blocksize")?,
            },
            "cum_sum" | "cum_prod" => Op::Cumulative(CumulativeAttrs {
                kind: if name == "cum_sum" {
                    Accumulate::Sum
                } else {
                    Accumulate::Prod
                },
                axis: a.usize("axis")?,
                exclusive: a.bool("exclusive")?,
                reverse: a.bool("reverse")?,
            }),
            "trilu" => Op::Trilu {
                upper: a.bool("upper")?,
                k: a.int("k")?,
            },
            "non_zero" => Op::NonZero,
            "unique" => Op::Unique {
                axis: a.usize("axis")?,
                sorted: a.bool("sorted")?,
            },
            "compress" => Op::Compress {
                axis: a.usize("axis")?,
            },
            "non_max_suppression" => Op::NonMaxSuppression {
                center_point_box: a.bool("center_point_box")?,
                bound: a.usize("bound")?,
            },
            "top_k" => Op::TopK {
                axis: a.usize("axis")?,
                k: a.usize("k")?,
                largest: a.bool("largest")?,
                sorted: a.bool("sorted")?,
            },
            "grid_sample" => {
                let (mode, padding) = (a.ident("mode")?, a.ident("padding")?);
                Op::GridSample {
                    mode: lookup(RESIZE_MODES, &mode).ok_or(format!("unknown mode '{mode}'"))?,
                    padding: lookup(GRID_PADDINGS, &padding)
                        .ok_or(format!("unknown padding '{padding}'"))?,
                    align_corners: a.bool("align_corners")?,
                }
            }
            "gather_nd" => Op::GatherNd {
                batch_dims: a.usize("batch_dims")?,
            },
            "scatter_nd" => Op::ScatterNd {
                reduction: scatter_reduction(a)?,
            },
            "scatter_elements" => Op::ScatterElements {
                axis: a.usize("axis")?,
                reduction: scatter_reduction(a)?,
            },
            _ => return Err(format!("unknown op '{name}'")),
        };
        Ok(op)
    }
}

fn scatter_reduction(a: &mut AttrReader) -> Result<ScatterReduction, String> {
    let r = a.ident("reduction")?;
    lookup(SCATTER_REDUCTIONS, &r).ok_or(format!("unknown scatter reduction '{r}'"))
}

fn spell_pool(p: &PoolAttrs) -> Spelled {
    vec![
        ("ceil_mode", flag(p.ceil_mode)),
        ("dilations", ints(&p.dilations)),
        ("kernel", ints(&p.kernel)),
        ("pads", ints(&p.pads)),
        ("strides", ints(&p.strides)),
    ]
}

fn read_pool(a: &mut AttrReader) -> Result<PoolAttrs, String> {
    Ok(PoolAttrs {
        kernel: a.usizes("kernel")?,
        strides: a.usizes("strides")?,
        pads: a.usizes("pads")?,
        dilations: a.usizes("dilations")?,
        ceil_mode: a.bool("ceil_mode")?,
    })
}

/// A raw attribute value from the text: one token or a bracketed list of tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum RawAttr {
    One(String),
    List(Vec<String>),
}

/// Typed access to parsed attributes; each key may be taken once, and `finish` rejects leftovers.
#[derive(Debug, Default)]
pub struct AttrReader {
    map: BTreeMap<String, RawAttr>,
}

impl AttrReader {
    pub fn new(map: BTreeMap<String, RawAttr>) -> Self {
        AttrReader { map }
    }

    fn take(&mut self, key: &str) -> Result<RawAttr, String> {
        self.map
            .remove(key)
            .ok_or_else(|| format!("missing attribute '{key}'"))
    }

    fn one(&mut self, key: &str) -> Result<String, String> {
        match self.take(key)? {
            RawAttr::One(s) => Ok(s),
            RawAttr::List(_) => Err(format!("attribute '{key}' must be a single value")),
        }
    }

    fn list(&mut self, key: &str) -> Result<Vec<String>, String> {
        match self.take(key)? {
            RawAttr::List(v) => Ok(v),
            RawAttr::One(_) => Err(format!("attribute '{key}' must be a list")),
        }
    }

    fn parse<T: std::str::FromStr>(key: &str, s: &str) -> Result<T, String> {
        s.parse()
            .map_err(|_| format!("bad value '{s}' for attribute '{key}'"))
    }

    pub fn ident(&mut self, key: &str) -> Result<String, String> {
        self.one(key)
    }
    pub fn int(&mut self, key: &str) -> Result<i64, String> {
        let s = self.one(key)?;
        Self::parse(key, &s)
    }
    pub fn usize(&mut self, key: &str) -> Result<usize, String> {
        let s = self.one(key)?;
        Self::parse(key, &s)
    }
    pub fn bool(&mut self, key: &str) -> Result<bool, String> {
        match self.one(key)?.as_str() {
            "0" => Ok(false),
            "1" => Ok(true),
            s => Err(format!("bad value '{s}' for boolean attribute '{key}'")),
        }
    }
    pub fn f32(&mut self, key: &str) -> Result<f32, String> {
        let s = self.one(key)?;
        Self::parse(key, &s)
    }
    pub fn f64(&mut self, key: &str) -> Result<f64, String> {
        let s = self.one(key)?;
        Self::parse(key, &s)
    }
    pub fn ints(&mut self, key: &str) -> Result<Vec<i64>, String> {
        self.list(key)?
            .iter()
            .map(|s| Self::parse(key, s))
            .collect()
    }
    pub fn usizes(&mut self, key: &str) -> Result<Vec<usize>, String> {
        self.list(key)?
            .iter()
            .map(|s| Self::parse(key, s))
            .collect()
    }
    pub fn f32s(&mut self, key: &str) -> Result<Vec<f32>, String> {
        self.list(key)?
            .iter()
            .map(|s| Self::parse(key, s))
            .collect()
    }

    /// Fails if any attribute was not used by the op.
    pub fn finish(self) -> Result<(), String> {
        match self.map.keys().next() {
            Some(k) => Err(format!("unexpected attribute '{k}'")),
            None => Ok(()),
        }
    }
}
