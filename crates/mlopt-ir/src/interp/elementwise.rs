//! Elementwise kernels with numpy broadcasting: unary functions, binary arithmetic, comparisons and logic,
//! variadic Sum/Mean/Max/Min, Where, Clip.

use super::{float_dispatch, num_dispatch, typed, EvalResult, Real};
use crate::dtype::broadcast_shapes;
use crate::op::{Binary, Nary, Unary};
use crate::tensor::{Elem, Tensor};
use ndarray::{ArrayD, IxDyn, Zip};

/// Broadcasts two arrays against each other and maps pairs.
pub(crate) fn zip2<A: Copy, B: Copy, C>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    f: impl Fn(A, B) -> C,
) -> EvalResult<ArrayD<C>> {
    let shape = broadcast_shapes(a.shape(), b.shape()).ok_or_else(|| {
        format!(
            "shapes {:?} and {:?} do not broadcast",
            a.shape(),
            b.shape()
        )
    })?;
    let av = a.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
    let bv = b.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
    Ok(Zip::from(&av).and(&bv).map_collect(|x, y| f(*x, *y)))
}

/// Arithmetic with ONNX semantics per element type: integers wrap, integer division truncates, floating
/// max/min propagate NaN.
pub(crate) trait Arith: Elem {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// `None` for integer division by zero.
    fn div(self, o: Self) -> Option<Self>;
    fn rem(self, o: Self, fmod: bool) -> Option<Self>;
    fn max_(self, o: Self) -> Self;
    fn min_(self, o: Self) -> Self;
    fn abs_(self) -> Self;
    fn neg_(self) -> Self;
    fn zero() -> Self;
    fn is_nan_(self) -> bool;
    /// Bitwise ops; `None` for floats.
    fn bits(self, o: Self, op: Binary) -> Option<Self>;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn div(self, o: Self) -> Option<Self> { (o != 0).then(|| self.wrapping_div(o)) }
            fn rem(self, o: Self, fmod: bool) -> Option<Self> {
                if o == 0 { return None; }
                let r = self.wrapping_rem(o);
                #[allow(unused_comparisons)]
                let fix = !fmod && r != 0 && ((r < 0) != (o < 0));
                Some(if fix { r.wrapping_add(o) } else { r })
            }
            fn max_(self, o: Self) -> Self { if self >= o { self } else { o } }
            fn min_(self, o: Self) -> Self { if self <= o { self } else { o } }
            #[allow(unused_comparisons)]
            fn abs_(self) -> Self { if self < 0 { (0 as $t).wrapping_sub(self) } else { self } }
            fn neg_(self) -> Self { (0 as $t).wrapping_sub(self) }
            fn zero() -> Self { 0 }
            fn is_nan_(self) -> bool { false }
            fn bits(self, o: Self, op: Binary) -> Option<Self> {
                let width = (std::mem::size_of::<$t>() * 8) as u32;
                // A shift by the width or more (or by a negative amount) leaves what the sign fill
                // alone gives (ONNX opset 28): -1 for a right shift of a negative value, else 0.
                #[allow(unused_comparisons)]
                let shift = |v: $t, by: $t, left: bool| {
                    let by = by as u64;
                    if by >= width as u64 {
                        if !left && v < 0 { !0 } else { 0 }
                    } else if left { v << by } else { v >> by }
                };
                Some(match op {
                    Binary::BitAnd => self & o,
                    Binary::BitOr => self | o,
                    Binary::BitXor => self ^ o,
                    Binary::BitShift { left } => shift(self, o, left),
                    _ => return None,
                })
            }
        }
    )*};
}
arith_int!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn sub(self, o: Self) -> Self { self - o }
            fn mul(self, o: Self) -> Self { self * o }
            fn div(self, o: Self) -> Option<Self> { Some(self / o) }
            fn rem(self, o: Self, fmod: bool) -> Option<Self> {
                let r = self % o;
                // Python's % (fmod=0, opset 28): the divisor's sign, a zero result included.
                Some(if fmod {
                    r
                } else if r == 0.0 {
                    if o < 0.0 { -0.0 } else { 0.0 }
                } else if (r < 0.0) != (o < 0.0) {
                    r + o
                } else {
                    r
                })
            }
            fn max_(self, o: Self) -> Self { if self.is_nan() || o.is_nan() { <$t>::NAN } else { self.max(o) } }
            fn min_(self, o: Self) -> Self { if self.is_nan() || o.is_nan() { <$t>::NAN } else { self.min(o) } }
            fn abs_(self) -> Self { self.abs() }
            fn neg_(self) -> Self { -self }
            fn zero() -> Self { 0.0 }
            fn is_nan_(self) -> bool { self.is_nan() }
            fn bits(self, _: Self, _: Binary) -> Option<Self> { None }
        }
    )*};
}
arith_float!(f32, f64);

/// Rounds half to even (ONNX `Round`).
fn round_even<T: Real>(x: T) -> T {
    let r = x.round();
    if (r - x).abs() == T::lit(0.5) {
        T::lit(2.0) * (x * T::lit(0.5)).round()
    } else {
        r
    }
}

fn softplus<T: Real>(x: T) -> T {
    if x > T::zero() {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn unary_float<T: Real>(u: Unary, x: T) -> T {
    let (zero, one) = (T::zero(), T::one());
    match u {
        Unary::Relu => {
            if x < zero {
                zero
            } else {
                x
            }
        }
        Unary::Sigmoid => one / (one + (-x).exp()),
        Unary::Tanh => x.tanh(),
        Unary::Erf => x.erf(),
        Unary::Softplus => softplus(x),
        Unary::Softsign => x / (one + x.abs()),
        Unary::Sqrt => x.sqrt(),
        Unary::Reciprocal => one / x,
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Neg => -x,
        Unary::Abs => x.abs(),
        Unary::Floor => x.floor(),
        Unary::Ceil => x.ceil(),
        Unary::Round => round_even(x),
        Unary::Sign => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                x
            }
        }
        Unary::HardSwish => x * (x / T::lit(6.0) + T::lit(0.5)).max(zero).min(one),
        Unary::Mish => x * softplus(x).tanh(),
        Unary::Sin => x.sin(),
        Unary::Cos => x.cos(),
        Unary::Tan => x.tan(),
        Unary::Asin => x.asin(),
        Unary::Acos => x.acos(),
        Unary::Atan => x.atan(),
        Unary::Sinh => x.sinh(),
        Unary::Cosh => x.cosh(),
        Unary::Asinh => x.asinh(),
        Unary::Acosh => x.acosh(),
        Unary::Atanh => x.atanh(),
        Unary::LeakyRelu { alpha } => {
            if x < zero {
                T::lit(alpha as f64) * x
            } else {
                x
            }
        }
        Unary::Elu { alpha } => {
            if x < zero {
                T::lit(alpha as f64) * (x.exp() - one)
            } else {
                x
            }
        }
        Unary::Celu { alpha } => {
            let a = T::lit(alpha as f64);
            x.max(zero) + (a * ((x / a).exp() - one)).min(zero)
        }
        Unary::Selu { alpha, gamma } => {
            let (a, g) = (T::lit(alpha as f64), T::lit(gamma as f64));
            if x > zero {
                g * x
            } else {
                g * (a * x.exp() - a)
            }
        }
        Unary::HardSigmoid { alpha, beta } => (T::lit(alpha as f64) * x + T::lit(beta as f64))
            .max(zero)
            .min(one),
        Unary::ThresholdedRelu { alpha } => {
            if x > T::lit(alpha as f64) {
                x
            } else {
                zero
            }
        }
        Unary::Shrink { bias, lambd } => {
            let (b, l) = (T::lit(bias as f64), T::lit(lambd as f64));
            if x < -l {
                x + b
            } else if x > l {
                x - b
            } else {
                zero
            }
        }
        Unary::Gelu { tanh: false } => T::lit(0.5) * x * (one + (x / T::SQRT_2()).erf()),
        Unary::Gelu { tanh: true } => {
            let c = (T::lit(2.0) / T::PI()).sqrt();
            T::lit(0.5) * x * (one + (c * (x + T::lit(0.044715) * x * x * x)).tanh())
        }
        Unary::Not | Unary::BitNot | Unary::IsNaN | Unary::IsInf { .. } => x,
    }
}

fn unary_int<T: Arith>(u: Unary, x: T) -> EvalResult<T> {
    Ok(match u {
        Unary::Abs => x.abs_(),
        Unary::Neg => x.neg_(),
        Unary::Relu => x.max_(T::zero()),
        Unary::BitNot => x
            .bits(x, Binary::BitXor)
            .map(|_| T::from_i64(!x.to_i64()))
            .ok_or("bit_not expects integers")?,
        Unary::Sign => {
            if x > T::zero() {
                T::from_i64(1)
            } else if x < T::zero() {
                T::from_i64(-1)
            } else {
                T::zero()
            }
        }
        _ => return Err(format!("{u:?} is not defined for integers")),
    })
}

pub(crate) fn unary(u: Unary, x: &Tensor) -> EvalResult<Tensor> {
    match u {
        Unary::Not => Ok(Tensor::from_array(typed::<bool>(x)?.mapv(|v| !v))),
        Unary::IsNaN => float_dispatch!(x, a => Ok(Tensor::from_array(a.mapv(|v| v.is_nan())))),
        Unary::IsInf {
            detect_negative,
            detect_positive,
        } => float_dispatch!(x, a => Ok(Tensor::from_array(
            a.mapv(|v| v.is_infinite() && ((v > 0.0 && detect_positive) || (v < 0.0 && detect_negative)))
        ))),
        _ => match x {
            Tensor::F32(a) => Ok(Tensor::from_array(a.mapv(|v| unary_float(u, v)))),
            Tensor::F64(a) => Ok(Tensor::from_array(a.mapv(|v| unary_float(u, v)))),
            t => num_dispatch!(t, a => {
                let v: Vec<_> = a.iter().map(|&v| unary_int(u, v)).collect::<EvalResult<_>>()?;
                Ok(Tensor::from_vec(a.shape(), v).ok_or("shape")?)
            }),
        },
    }
}

fn arith<T: Arith>(b: Binary, x: &ArrayD<T>, y: &ArrayD<T>) -> EvalResult<Tensor> {
    let out = match b {
        Binary::Add => zip2(x, y, T::add)?,
        Binary::Sub => zip2(x, y, T::sub)?,
        Binary::Mul => zip2(x, y, T::mul)?,
        Binary::PRelu => zip2(x, y, |a, s| if a < T::zero() { a.mul(s) } else { a })?,
        Binary::Div | Binary::Mod { .. } => {
            let r = zip2(x, y, |a, c| match b {
                Binary::Mod { fmod } => a.rem(c, fmod),
                _ => a.div(c),
            })?;
            if r.iter().any(Option::is_none) {
                return Err("integer division by zero".into());
            }
            r.mapv(|v| v.unwrap_or_default())
        }
        b if b.is_bitwise() => {
            let r = zip2(x, y, |a, c| a.bits(c, b))?;
            if r.iter().any(Option::is_none) {
                return Err(format!("{b:?} expects integers"));
            }
            r.mapv(|v| v.unwrap_or_default())
        }
        _ => return Err(format!("{b:?} is not arithmetic")),
    };
    Ok(Tensor::from_array(out))
}

fn compare<T: Elem>(b: Binary, x: &ArrayD<T>, y: &ArrayD<T>) -> EvalResult<Tensor> {
    let out = match b {
        Binary::Equal => zip2(x, y, |a, c| a == c)?,
        Binary::Greater => zip2(x, y, |a, c| a > c)?,
        Binary::Less => zip2(x, y, |a, c| a < c)?,
        Binary::GreaterOrEqual => zip2(x, y, |a, c| a >= c)?,
        Binary::LessOrEqual => zip2(x, y, |a, c| a <= c)?,
        _ => return Err(format!("{b:?} is not a comparison")),
    };
    Ok(Tensor::from_array(out))
}

fn pow_t<T: Elem>(a: &ArrayD<T>, e: &ArrayD<f64>) -> EvalResult<Tensor> {
    Ok(Tensor::from_array(zip2(a, e, |v, p| {
        T::from_f64(v.to_f64().powf(p))
    })?))
}

pub(crate) fn binary(b: Binary, x: &Tensor, y: &Tensor) -> EvalResult<Tensor> {
    if b == Binary::Pow {
        // The exponent may have another type; compute in f64 and round to the base's type.
        let e = y.cast(crate::DType::F64);
        let e = typed::<f64>(&e)?;
        return num_dispatch!(x, a => pow_t(a, e));
    }
    if b.is_logical() {
        let (p, q) = (typed::<bool>(x)?, typed::<bool>(y)?);
        let f = match b {
            Binary::And => |a: bool, c: bool| a && c,
            Binary::Or => |a: bool, c: bool| a || c,
            _ => |a: bool, c: bool| a ^ c,
        };
        return Ok(Tensor::from_array(zip2(p, q, f)?));
    }
    if x.dtype() != y.dtype() {
        return Err(format!("dtypes differ: {} and {}", x.dtype(), y.dtype()));
    }
    if b.is_comparison() {
        return crate::dispatch!(x, a => compare(b, a, typed(y)?));
    }
    num_dispatch!(x, a => arith(b, a, typed(y)?))
}

pub(crate) fn nary(n: Nary, xs: &[&Tensor]) -> EvalResult<Tensor> {
    num_dispatch!(xs[0], first => {
        let mut acc = first.clone();
        for t in &xs[1..] {
            let b = typed(t)?;
            acc = match n {
                Nary::Sum | Nary::Mean => zip2(&acc, b, Arith::add)?,
                Nary::Max => zip2(&acc, b, Arith::max_)?,
                Nary::Min => zip2(&acc, b, Arith::min_)?,
            };
        }
        if n == Nary::Mean {
            let k = xs.len() as f64;
            acc = acc.mapv(|v| Elem::from_f64(v.to_f64() / k));
        }
        Ok(Tensor::from_array(acc))
    })
}

pub(crate) fn where_(c: &Tensor, x: &Tensor, y: &Tensor) -> EvalResult<Tensor> {
    let c = typed::<bool>(c)?;
    crate::dispatch!(x, a => {
        let b = typed(y)?;
        let shape = broadcast_shapes(c.shape(), a.shape())
            .and_then(|s| broadcast_shapes(&s, b.shape()))
            .ok_or("shapes do not broadcast")?;
        let (cv, av, bv) = (
            c.broadcast(IxDyn(&shape)).ok_or("broadcast")?,
            a.broadcast(IxDyn(&shape)).ok_or("broadcast")?,
            b.broadcast(IxDyn(&shape)).ok_or("broadcast")?,
        );
        Ok(Tensor::from_array(Zip::from(&cv).and(&av).and(&bv).map_collect(|&k, &p, &q| if k { p } else { q })))
    })
}

pub(crate) fn clip(x: &Tensor, lo: Option<&Tensor>, hi: Option<&Tensor>) -> EvalResult<Tensor> {
    num_dispatch!(x, a => {
        let bound = |t: Option<&Tensor>| -> EvalResult<Option<_>> {
            Ok(match t { Some(t) => typed(t)?.iter().next().copied(), None => None })
        };
        let (lo, hi) = (bound(lo)?, bound(hi)?);
        Ok(Tensor::from_array(a.mapv(|v| {
            if v.is_nan_() { return v; }
            let v = match lo { Some(l) if v < l => l, _ => v };
            match hi { Some(h) if v > h => h, _ => v }
        })))
    })
}
