//! Elementwise ops as kernel IR expressions: each graph op of one or more scalars becomes an expression
//! over its inputs' expressions. f16/bf16 values are computed in f32 and rounded back once per op, as the
//! reference interpreter does.

use mlopt_ir::{Binary, DType, Nary, Unary};
use mlopt_kir::index::lit;
use mlopt_kir::{BinOp, Elem, Expr, UnOp};

pub fn elem(d: DType) -> Elem {
    match d {
        DType::F32 => Elem::F32,
        DType::F16 => Elem::F16,
        DType::BF16 => Elem::BF16,
        DType::F64 => Elem::F64,
        DType::I8 => Elem::I8,
        DType::U8 => Elem::U8,
        DType::I16 => Elem::I16,
        DType::U16 => Elem::U16,
        DType::I32 => Elem::I32,
        DType::U32 => Elem::U32,
        DType::I64 => Elem::I64,
        DType::U64 => Elem::U64,
        DType::Bool => Elem::Bool,
        DType::F8E4M3FN => Elem::F8E4M3FN,
        DType::F8E4M3FNUZ => Elem::F8E4M3FNUZ,
        DType::F8E5M2 => Elem::F8E5M2,
        DType::F8E5M2FNUZ => Elem::F8E5M2FNUZ,
        DType::F4E2M1 => Elem::F4E2M1,
        DType::I4 => Elem::I4,
        DType::U4 => Elem::U4,
        DType::I2 => Elem::I2,
        DType::U2 => Elem::U2,
    }
}

/// The type arithmetic on `t` is done in.
pub fn compute(t: Elem) -> Elem {
    match t {
        Elem::F16 | Elem::BF16 => Elem::F32,
        t if t.minifloat().is_some() => Elem::F32,
        Elem::I4 | Elem::I2 => Elem::I8,
        Elem::U4 | Elem::U2 => Elem::U8,
        t => t,
    }
}

fn u(o: UnOp, x: Expr) -> Expr {
    Expr::un(o, x)
}

/// `1 / (1 + exp(-x))`.
fn sigmoid(x: Expr, t: Elem) -> Expr {
    Expr::bin(
        BinOp::Div,
        lit(1.0, t),
        Expr::bin(BinOp::Add, lit(1.0, t), u(UnOp::Exp, u(UnOp::Neg, x))),
    )
}

/// Stable softplus: max(x, 0) + log(1 + exp(-|x|)).
fn softplus(x: Expr, t: Elem) -> Expr {
    let tail = u(
        UnOp::Log,
        Expr::bin(
            BinOp::Add,
            lit(1.0, t),
            u(UnOp::Exp, u(UnOp::Neg, u(UnOp::Abs, x.clone()))),
        ),
    );
    Expr::bin(BinOp::Add, Expr::bin(BinOp::Max, x, lit(0.0, t)), tail)
}

fn clamp01(x: Expr, t: Elem) -> Expr {
    Expr::bin(
        BinOp::Min,
        Expr::bin(BinOp::Max, x, lit(0.0, t)),
        lit(1.0, t),
    )
}

/// A unary op on `x` of element type `t` (already the compute type). None if code generation lacks it.
pub fn unary(op: Unary, x: Expr, t: Elem) -> Option<Expr> {
    let l = |v: f64| lit(v, t);
    let lt = |a: Expr, c: Expr| Expr::bin(BinOp::Lt, a, c);
    if !t.is_float() {
        return Some(match op {
            Unary::Neg => u(UnOp::Neg, x),
            Unary::Abs => u(UnOp::Abs, x),
            Unary::Relu => Expr::bin(BinOp::Max, x, l(0.0)),
            Unary::Not if t == Elem::Bool => u(UnOp::Not, x),
            Unary::BitNot if t != Elem::Bool => u(UnOp::Not, x),
            Unary::Sign => Expr::select(
                lt(l(0.0), x.clone()),
                l(1.0),
                Expr::select(lt(x, l(0.0)), l(-1.0), l(0.0)),
            ),
            _ => return None,
        });
    }
    Some(match op {
        Unary::Relu => Expr::bin(BinOp::Max, x, l(0.0)),
        Unary::Sigmoid => sigmoid(x, t),
        Unary::Tanh => u(UnOp::Tanh, x),
        Unary::Erf => u(UnOp::Erf, x),
        Unary::Softplus => softplus(x, t),
        Unary::Softsign => Expr::bin(
            BinOp::Div,
            x.clone(),
            Expr::bin(BinOp::Add, l(1.0), u(UnOp::Abs, x)),
        ),
        Unary::Sqrt => u(UnOp::Sqrt, x),
        Unary::Reciprocal => Expr::bin(BinOp::Div, l(1.0), x),
        Unary::Exp => u(UnOp::Exp, x),
        Unary::Log => u(UnOp::Log, x),
        Unary::Neg => u(UnOp::Neg, x),
        Unary::Abs => u(UnOp::Abs, x),
        Unary::Floor => u(UnOp::Floor, x),
        Unary::Ceil => u(UnOp::Ceil, x),
        Unary::Round => u(UnOp::Round, x),
        Unary::Sin => u(UnOp::Sin, x),
        Unary::Cos => u(UnOp::Cos, x),
        Unary::Tan => Expr::bin(BinOp::Div, u(UnOp::Sin, x.clone()), u(UnOp::Cos, x)),
        Unary::Asin => u(UnOp::Asin, x),
        Unary::Acos => u(UnOp::Acos, x),
        Unary::Atan => u(UnOp::Atan, x),
        Unary::Sign => Expr::select(
            lt(l(0.0), x.clone()),
            l(1.0),
            Expr::select(lt(x.clone(), l(0.0)), l(-1.0), x),
        ),
        Unary::HardSwish => Expr::bin(
            BinOp::Mul,
            x.clone(),
            clamp01(
                Expr::bin(BinOp::Add, Expr::bin(BinOp::Div, x, l(6.0)), l(0.5)),
                t,
            ),
        ),
        Unary::Mish => Expr::bin(BinOp::Mul, x.clone(), u(UnOp::Tanh, softplus(x, t))),
        Unary::LeakyRelu { alpha } => Expr::select(
            lt(x.clone(), l(0.0)),
            Expr::bin(BinOp::Mul, l(alpha as f64), x.clone()),
            x,
        ),
        Unary::Elu { alpha } => Expr::select(
            lt(x.clone(), l(0.0)),
            Expr::bin(
                BinOp::Mul,
                l(alpha as f64),
                Expr::bin(BinOp::Sub, u(UnOp::Exp, x.clone()), l(1.0)),
            ),
            x,
        ),
        Unary::Celu { alpha } => {
            let a = l(alpha as f64);
            let neg = Expr::bin(
                BinOp::Min,
                Expr::bin(
                    BinOp::Mul,
                    a.clone(),
                    Expr::bin(
                        BinOp::Sub,
                        u(UnOp::Exp, Expr::bin(BinOp::Div, x.clone(), a)),
                        l(1.0),
                    ),
                ),
                l(0.0),
            );
            Expr::bin(BinOp::Add, Expr::bin(BinOp::Max, x, l(0.0)), neg)
        }
        Unary::Selu { alpha, gamma } => {
            let neg = Expr::bin(
                BinOp::Sub,
                Expr::bin(BinOp::Mul, l(alpha as f64), u(UnOp::Exp, x.clone())),
                l(alpha as f64),
            );
            Expr::bin(
                BinOp::Mul,
                l(gamma as f64),
                Expr::select(lt(l(0.0), x.clone()), x, neg),
            )
        }
        Unary::HardSigmoid { alpha, beta } => clamp01(
            Expr::bin(
                BinOp::Add,
                Expr::bin(BinOp::Mul, l(alpha as f64), x),
                l(beta as f64),
            ),
            t,
        ),
        Unary::ThresholdedRelu { alpha } => Expr::select(lt(l(alpha as f64), x.clone()), x, l(0.0)),
        Unary::Shrink { bias, lambd } => {
            let (bi, la) = (l(bias as f64), l(lambd as f64));
            let hi = Expr::select(
                lt(la.clone(), x.clone()),
                Expr::bin(BinOp::Sub, x.clone(), bi.clone()),
                l(0.0),
            );
            Expr::select(
                lt(x.clone(), u(UnOp::Neg, la)),
                Expr::bin(BinOp::Add, x, bi),
                hi,
            )
        }
        Unary::Gelu { tanh: false } => {
            let inner = Expr::bin(
                BinOp::Add,
                l(1.0),
                u(
                    UnOp::Erf,
                    Expr::bin(BinOp::Mul, x.clone(), l(std::f64::consts::FRAC_1_SQRT_2)),
                ),
            );
            Expr::bin(BinOp::Mul, Expr::bin(BinOp::Mul, l(0.5), x), inner)
        }
        Unary::Gelu { tanh: true } => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let cube = Expr::bin(
                BinOp::Mul,
                Expr::bin(
                    BinOp::Mul,
                    Expr::bin(BinOp::Mul, l(0.044715), x.clone()),
                    x.clone(),
                ),
                x.clone(),
            );
            let th = u(
                UnOp::Tanh,
                Expr::bin(BinOp::Mul, l(c), Expr::bin(BinOp::Add, x.clone(), cube)),
            );
            Expr::bin(
                BinOp::Mul,
                Expr::bin(BinOp::Mul, l(0.5), x),
                Expr::bin(BinOp::Add, l(1.0), th),
            )
        }
        Unary::Sinh => Expr::bin(
            BinOp::Mul,
            l(0.5),
            Expr::bin(
                BinOp::Sub,
                u(UnOp::Exp, x.clone()),
                u(UnOp::Exp, u(UnOp::Neg, x)),
            ),
        ),
        Unary::Cosh => Expr::bin(
            BinOp::Mul,
            l(0.5),
            Expr::bin(
                BinOp::Add,
                u(UnOp::Exp, x.clone()),
                u(UnOp::Exp, u(UnOp::Neg, x)),
            ),
        ),
        Unary::Asinh => u(
            UnOp::Log,
            Expr::bin(
                BinOp::Add,
                x.clone(),
                u(
                    UnOp::Sqrt,
                    Expr::bin(BinOp::Add, Expr::bin(BinOp::Mul, x.clone(), x), l(1.0)),
                ),
            ),
        ),
        Unary::Acosh => u(
            UnOp::Log,
            Expr::bin(
                BinOp::Add,
                x.clone(),
                u(
                    UnOp::Sqrt,
                    Expr::bin(BinOp::Sub, Expr::bin(BinOp::Mul, x.clone(), x), l(1.0)),
                ),
            ),
        ),
        Unary::Atanh => Expr::bin(
            BinOp::Mul,
            l(0.5),
            u(
                UnOp::Log,
                Expr::bin(
                    BinOp::Div,
                    Expr::bin(BinOp::Add, l(1.0), x.clone()),
                    Expr::bin(BinOp::Sub, l(1.0), x),
                ),
            ),
        ),
        Unary::IsNaN => Expr::bin(BinOp::Ne, x.clone(), x),
        Unary::IsInf {
            detect_negative,
            detect_positive,
        } => {
            let pos = Expr::bin(BinOp::Eq, x.clone(), l(f64::INFINITY));
            let neg = Expr::bin(BinOp::Eq, x, l(f64::NEG_INFINITY));
            match (detect_negative, detect_positive) {
                (true, true) => Expr::bin(BinOp::Or, pos, neg),
                (false, true) => pos,
                (true, false) => neg,
                (false, false) => lit(0.0, Elem::Bool),
            }
        }
        _ => return None,
    })
}

/// Whether a unary op yields bool rather than its input type.
pub fn unary_to_bool(op: Unary) -> bool {
    matches!(op, Unary::IsNaN | Unary::IsInf { .. })
}

/// A binary op on `x`, `y` of compute type `t`. None if code generation lacks it.
pub fn binary(op: Binary, x: Expr, y: Expr, t: Elem) -> Option<Expr> {
    Some(match op {
        Binary::Add => Expr::bin(BinOp::Add, x, y),
        Binary::Sub => Expr::bin(BinOp::Sub, x, y),
        Binary::Mul => Expr::bin(BinOp::Mul, x, y),
        Binary::Div => Expr::bin(BinOp::Div, x, y),
        Binary::Pow if t.is_float() => Expr::bin(BinOp::Pow, x, y),
        Binary::Mod { fmod: true } => Expr::bin(BinOp::Rem, x, y),
        Binary::Mod { fmod: false } => {
            // The result takes the divisor's sign (Python's %), a float's zero too (opset 28).
            let r = Expr::bin(BinOp::Rem, x, y.clone());
            let zero = lit(0.0, t);
            let is_zero = Expr::bin(BinOp::Eq, r.clone(), zero.clone());
            let negative = Expr::bin(BinOp::Lt, y.clone(), zero.clone());
            let fix = Expr::bin(
                BinOp::And,
                Expr::bin(BinOp::Ne, r.clone(), zero.clone()),
                Expr::bin(
                    BinOp::Ne,
                    Expr::bin(BinOp::Lt, r.clone(), zero),
                    negative.clone(),
                ),
            );
            let fixed = Expr::select(fix, Expr::bin(BinOp::Add, r.clone(), y), r);
            match t.is_float() {
                true => Expr::select(
                    is_zero,
                    Expr::select(negative, lit(-0.0, t), lit(0.0, t)),
                    fixed,
                ),
                false => fixed,
            }
        }
        Binary::PRelu => Expr::select(
            Expr::bin(BinOp::Lt, x.clone(), lit(0.0, t)),
            Expr::bin(BinOp::Mul, y, x.clone()),
            x,
        ),
        Binary::Equal => Expr::bin(BinOp::Eq, x, y),
        Binary::Greater => Expr::bin(BinOp::Lt, y, x),
        Binary::Less => Expr::bin(BinOp::Lt, x, y),
        Binary::GreaterOrEqual => Expr::bin(BinOp::Le, y, x),
        Binary::LessOrEqual => Expr::bin(BinOp::Le, x, y),
        Binary::And => Expr::bin(BinOp::And, x, y),
        Binary::Or => Expr::bin(BinOp::Or, x, y),
        Binary::Xor => Expr::bin(BinOp::Ne, x, y),
        Binary::BitAnd if !t.is_float() => Expr::bin(BinOp::And, x, y),
        Binary::BitOr if !t.is_float() => Expr::bin(BinOp::Or, x, y),
        Binary::BitXor if !t.is_float() => Expr::bin(BinOp::Xor, x, y),
        Binary::BitShift { left } if !t.is_float() => {
            Expr::bin(if left { BinOp::Shl } else { BinOp::Shr }, x, y)
        }
        _ => return None,
    })
}

/// How many operands a fold combines left to right; more are combined as a balanced tree, so the
/// expression's depth grows with the logarithm of the count: a Sum or Concat of 10,000 inputs (a small
/// file) nested 10,000 deep overflowed the recursive passes over it.
pub const LINEAR_FOLD: usize = 64;

/// `xs` combined by `f`: left to right up to `LINEAR_FOLD` of them (((a b) c) d), as a balanced tree
/// beyond.
pub fn fold(mut xs: Vec<Expr>, f: &dyn Fn(Expr, Expr) -> Expr) -> Option<Expr> {
    if xs.len() <= LINEAR_FOLD {
        return xs.into_iter().reduce(f);
    }
    let right = xs.split_off(xs.len() / 2);
    Some(f(fold(xs, f)?, fold(right, f)?))
}

/// Folds a variadic op over its inputs' expressions (`Mean` divides by the count).
pub fn nary(op: Nary, xs: Vec<Expr>, t: Elem) -> Option<Expr> {
    let n = xs.len();
    let o = match op {
        Nary::Sum | Nary::Mean => BinOp::Add,
        Nary::Max => BinOp::Max,
        Nary::Min => BinOp::Min,
    };
    let folded = fold(xs, &|a, c| Expr::bin(o, a, c))?;
    Some(if op == Nary::Mean {
        Expr::bin(BinOp::Div, folded, lit(n as f64, t))
    } else {
        folded
    })
}
