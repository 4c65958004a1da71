//! Elementwise ONNX ops: activations and math functions, binary arithmetic, comparisons and logic,
//! Sum/Mean/Max/Min, Where, Clip, Cast/CastLike.

use super::NodeCx;
use crate::error::Result;
use crate::proto::data_type;
use crate::tensor_io::dtype_from_onnx;
use mlopt_ir::{Binary, DType, Nary, Op, Tensor, Unary, Value};

pub(crate) const OPS: &[&str] = &[
    "Relu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Neg",
    "Abs",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Not",
    "HardSwish",
    "Mish",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "IsNaN",
    "IsInf",
    "LeakyRelu",
    "Elu",
    "Celu",
    "Selu",
    "HardSigmoid",
    "ThresholdedRelu",
    "Shrink",
    "Gelu",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "PRelu",
    "Equal",
    "Greater",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
    "And",
    "Or",
    "Xor",
    "Sum",
    "Mean",
    "Max",
    "Min",
    "Where",
    "Clip",
    "Cast",
    "CastLike",
    "BitCast",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "BitwiseNot",
    "BitShift",
];

fn plain_unary(op: &str) -> Option<Unary> {
    Some(match op {
        "Relu" => Unary::Relu,
        "Sigmoid" => Unary::Sigmoid,
        "Tanh" => Unary::Tanh,
        "Erf" => Unary::Erf,
        "Softplus" => Unary::Softplus,
        "Softsign" => Unary::Softsign,
        "Sqrt" => Unary::Sqrt,
        "Reciprocal" => Unary::Reciprocal,
        "Exp" => Unary::Exp,
        "Log" => Unary::Log,
        "Neg" => Unary::Neg,
        "Abs" => Unary::Abs,
        "Floor" => Unary::Floor,
        "Ceil" => Unary::Ceil,
        "Round" => Unary::Round,
        "Sign" => Unary::Sign,
        "Not" => Unary::Not,
        "HardSwish" => Unary::HardSwish,
        "Mish" => Unary::Mish,
        "Sin" => Unary::Sin,
        "Cos" => Unary::Cos,
        "Tan" => Unary::Tan,
        "Asin" => Unary::Asin,
        "Acos" => Unary::Acos,
        "Atan" => Unary::Atan,
        "Sinh" => Unary::Sinh,
        "Cosh" => Unary::Cosh,
        "Asinh" => Unary::Asinh,
        "Acosh" => Unary::Acosh,
        "Atanh" => Unary::Atanh,
        "IsNaN" => Unary::IsNaN,
        "BitwiseNot" => Unary::BitNot,
        _ => return None,
    })
}

fn binary(op: &str) -> Option<Binary> {
    Some(match op {
        "Add" => Binary::Add,
        "Sub" => Binary::Sub,
        "Mul" => Binary::Mul,
        "Div" => Binary::Div,
        "Pow" => Binary::Pow,
        "PRelu" => Binary::PRelu,
        "Equal" => Binary::Equal,
        "Greater" => Binary::Greater,
        "Less" => Binary::Less,
        "GreaterOrEqual" => Binary::GreaterOrEqual,
        "LessOrEqual" => Binary::LessOrEqual,
        "And" => Binary::And,
        "Or" => Binary::Or,
        "Xor" => Binary::Xor,
        "BitwiseAnd" => Binary::BitAnd,
        "BitwiseOr" => Binary::BitOr,
        "BitwiseXor" => Binary::BitXor,
        _ => return None,
    })
}

fn unary_with_attrs(cx: &mut NodeCx<'_, '_>, op: &str) -> Result<Option<Unary>> {
    Ok(Some(match op {
        "IsInf" => Unary::IsInf {
            detect_negative: cx.int("detect_negative", 1)? != 0,
            detect_positive: cx.int("detect_positive", 1)? != 0,
        },
        "LeakyRelu" => Unary::LeakyRelu {
            alpha: cx.float("alpha", 0.01)?,
        },
        "Elu" => Unary::Elu {
            alpha: cx.float("alpha", 1.0)?,
        },
        "Celu" => Unary::Celu {
            alpha: cx.float("alpha", 1.0)?,
        },
        "Selu" => Unary::Selu {
            alpha: cx.float("alpha", 1.673_263_2)?,
            gamma: cx.float("gamma", 1.050_701)?,
        },
        "HardSigmoid" => Unary::HardSigmoid {
            alpha: cx.float("alpha", 0.2)?,
            beta: cx.float("beta", 0.5)?,
        },
        "ThresholdedRelu" => Unary::ThresholdedRelu {
            alpha: cx.float("alpha", 1.0)?,
        },
        "Shrink" => Unary::Shrink {
            bias: cx.float("bias", 0.0)?,
            lambd: cx.float("lambd", 0.5)?,
        },
        "Gelu" => match cx.string("approximate", "none")?.as_str() {
            "none" => Unary::Gelu { tanh: false },
            "tanh" => Unary::Gelu { tanh: true },
            other => return Err(cx.err(format!("approximate='{other}' is not supported"))),
        },
        _ => return Ok(None),
    }))
}

/// Converts `op` if it is elementwise; `None` otherwise.
pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        if let Some(u) = plain_unary(op) {
            return Ok(Some(vec![cx.add1(Op::Unary(u), &[cx.req(0)?])?]));
        }
        if let Some(u) = unary_with_attrs(cx, op)? {
            return Ok(Some(vec![cx.add1(Op::Unary(u), &[cx.req(0)?])?]));
        }
        if let Some(b) = binary(op) {
            return Ok(Some(vec![
                cx.add1(Op::Binary(b), &[cx.req(0)?, cx.req(1)?])?
            ]));
        }
        let out = match op {
            "Mod" => {
                // fmod=0 on floats (defined from opset 28, refused by the checker before) is
                // Python's %: the divisor's sign.
                let fmod = cx.int("fmod", 0)? != 0;
                cx.add1(Op::Binary(Binary::Mod { fmod }), &[cx.req(0)?, cx.req(1)?])?
            }
            "Sum" | "Mean" | "Max" | "Min" => {
                let n = match op {
                    "Sum" => Nary::Sum,
                    "Mean" => Nary::Mean,
                    "Max" => Nary::Max,
                    _ => Nary::Min,
                };
                let ins: Vec<Value> = (0..cx.num_inputs())
                    .map(|i| cx.req(i))
                    .collect::<Result<_>>()?;
                cx.add1(Op::Nary(n), &ins)?
            }
            "Where" => cx.add1(Op::Where, &[cx.req(0)?, cx.req(1)?, cx.req(2)?])?,
            "BitShift" => {
                let left = match cx.string("direction", "")?.as_str() {
                    "LEFT" => true,
                    "RIGHT" => false,
                    d => return Err(cx.err(format!("direction='{d}' must be LEFT or RIGHT"))),
                };
                cx.add1(
                    Op::Binary(Binary::BitShift { left }),
                    &[cx.req(0)?, cx.req(1)?],
                )?
            }
            "Clip" => clip(cx)?,
            "Cast" => {
                let to = cx.int("to", 0)? as i32;
                let dtype = dtype_from_onnx(to).ok_or_else(|| {
                    cx.err(format!("cast to {} is not supported", data_type::name(to)))
                })?;
                cast(cx, dtype)?
            }
            "CastLike" => {
                let like = cx.req(1)?;
                let to = cx.ty(like).dtype;
                cast(cx, to)?
            }
            "BitCast" => {
                let to = cx.int("to", 0)? as i32;
                let to = dtype_from_onnx(to).ok_or_else(|| {
                    cx.err(format!(
                        "bit cast to {} is not supported",
                        data_type::name(to)
                    ))
                })?;
                cx.add1(Op::BitCast { to }, &[cx.req(0)?])?
            }
            _ => return Ok(None),
        };
        Ok(Some(vec![out]))
    })();
    r.transpose()
}

/// Cast (and CastLike) of input 0 to `to`. Into a float8 type with `saturate` (the default) values past
/// the type's largest clamp to it first, as ONNX's reference defines it; `Op::Cast` itself rounds as
/// `astype` does (`mlopt_ir::narrow`). `saturate` means nothing for other types.
fn cast(cx: &mut NodeCx<'_, '_>, to: DType) -> Result<Value> {
    let x = cx.req(0)?;
    let saturate = cx.int("saturate", 1)? != 0;
    if cx.string("round_mode", "up")? != "up" {
        // (It applies to float8 E8M0 only, which mlopt does not have.)
        return Err(cx.err("round_mode applies to float8 E8M0 only, which mlopt does not have"));
    }
    let from = cx.ty(x).dtype;
    let x = match to.minifloat() {
        Some(f) if saturate && to != DType::F4E2M1 && from.is_float() => {
            clamp_to_largest(cx, x, f.max())?
        }
        Some(f) if saturate && to != DType::F4E2M1 && from.is_int() => {
            // An integer type that holds the largest value (so its range passes it): clamped in its
            // own type.
            let t = Tensor::full(&mlopt_ir::TensorType::new(from, vec![]), f.max());
            if t.to_f64_vec()[0] == f.max() {
                let lo = if from.is_signed() { -f.max() } else { 0.0 };
                let (lo, hi) = (cx.scalar(lo, from), cx.scalar(f.max(), from));
                cx.add1(Op::Clip, &[x, lo, hi])?
            } else {
                x
            }
        }
        _ => x,
    };
    cx.add1(Op::Cast { to }, &[x])
}

/// Float `x` clamped to [-max, max] in its own type: `saturate` into float8, for Cast and
/// QuantizeLinear alike.
pub(super) fn clamp_to_largest(cx: &mut NodeCx<'_, '_>, x: Value, max: f64) -> Result<Value> {
    let t = cx.ty(x).dtype;
    let (lo, hi) = (cx.scalar(-max, t), cx.scalar(max, t));
    cx.add1(Op::Clip, &[x, lo, hi])
}

fn clip(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    if cx.opset() < 11 {
        let dtype = cx.ty(x).dtype;
        let lo = cx.float("min", f32::NEG_INFINITY)?;
        let hi = cx.float("max", f32::INFINITY)?;
        let lo = cx.konst_value(Tensor::scalar(lo).cast(dtype));
        let hi = cx.konst_value(Tensor::scalar(hi).cast(dtype));
        return Ok(cx.add(Op::Clip, &[Some(x), Some(lo), Some(hi)], Some(1))?[0]);
    }
    let (lo, hi) = (cx.input(1)?, cx.input(2)?);
    let mut ins = vec![Some(x), lo, hi];
    while ins.len() > 1 && ins.last() == Some(&None) {
        ins.pop();
    }
    Ok(cx.add(Op::Clip, &ins, Some(1))?[0])
}
