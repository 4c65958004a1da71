//! The interpreter's values: one scalar of any element type (`V`), its rounding to a type, its bytes, and
//! the unary and binary arithmetic the kernel IR defines on it, as the generated code computes it.

use super::*;
use half::{bf16, f16};

/// A scalar: floats as f64, integers and bools as i64 (u64 as its bits; every narrower unsigned type
/// zero-extended, so i64's signed arithmetic is theirs too).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum V {
    F(f64),
    I(i64),
}

impl V {
    pub(super) fn f(self) -> f64 {
        match self {
            V::F(x) => x,
            V::I(x) => x as f64,
        }
    }
    pub(super) fn i(self) -> i64 {
        match self {
            V::F(x) => x as i64,
            V::I(x) => x,
        }
    }
}

/// f64 -> f32 rounded to odd (towards zero, with the last bit set when inexact). f32 keeps more than two
/// bits beyond f16 and bf16, so rounding this result again gives the correctly rounded 16-bit value;
/// `half`'s own f64 conversions drop the low 32 bits of the mantissa first and round 1 + 2^-8 + 2^-23
/// down to bf16 1.0.
pub fn f32_odd(x: f64) -> f32 {
    let r = x as f32;
    if x.is_nan() || r as f64 == x {
        return r;
    }
    let toward_zero = if (r as f64).abs() > x.abs() {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// f32 -> bf16 as mlopt defines it everywhere (this interpreter, the graph IR's, and generated code):
/// rounded to nearest even, NaNs kept quiet with their sign, and f32 subnormals (below 2^-126 in
/// magnitude) flushed to a zero of their sign, as AVX512-BF16's `vcvtneps2bf16` does. Keeping
/// subnormals would cost generated code about eight integer instructions per vector instead of that
/// one instruction, for a difference below 1.2e-38. (The graph IR has the same function.)
pub fn bf16_from_f32(x: f32) -> bf16 {
    if x.is_subnormal() {
        bf16::from_bits((x.to_bits() >> 16) as u16 & 0x8000)
    } else {
        bf16::from_f32(x)
    }
}

/// f32 -> tf32 as `cvt.rna.tf32.f32` rounds: to 10 mantissa bits, nearest, ties away from zero.
pub fn tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits((x.to_bits() + 0x1000) & !0x1fff)
}

pub(super) fn round(t: Elem, x: f64) -> V {
    match t {
        Elem::F32 => V::F(x as f32 as f64),
        Elem::F16 => V::F(f16::from_f32(f32_odd(x)).to_f64()),
        Elem::BF16 => V::F(bf16_from_f32(f32_odd(x)).to_f64()),
        Elem::F64 => V::F(x),
        Elem::Bool => V::I((x != 0.0) as i64),
        t if t.minifloat().is_some() => V::F(minifloat(t, x)),
        Elem::I4 | Elem::U4 | Elem::I2 | Elem::U2 => int_to(t, x as i64),
        _ => V::I(x as i64),
    }
}

pub(super) fn int_to(t: Elem, x: i64) -> V {
    match t {
        Elem::I8 => V::I(x as i8 as i64),
        Elem::U8 => V::I(x as u8 as i64),
        Elem::I16 => V::I(x as i16 as i64),
        Elem::U16 => V::I(x as u16 as i64),
        Elem::I32 => V::I(x as i32 as i64),
        Elem::U32 => V::I(x as u32 as i64),
        Elem::I64 | Elem::U64 => V::I(x),
        Elem::Bool => V::I((x != 0) as i64),
        Elem::I4 => V::I((((x as u8) << 4) as i8 >> 4) as i64),
        Elem::U4 => V::I(x & 15),
        Elem::I2 => V::I((((x as u8) << 6) as i8 >> 6) as i64),
        Elem::U2 => V::I(x & 3),
        _ => round(t, x as f64),
    }
}

pub(super) fn decode(t: Elem, b: &[u8]) -> V {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&b[..n]);
        x
    };
    match t {
        Elem::F32 => V::F(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
        Elem::F64 => V::F(f64::from_le_bytes(a(8))),
        Elem::F16 => V::F(f16::from_le_bytes([b[0], b[1]]).to_f64()),
        Elem::BF16 => V::F(bf16::from_le_bytes([b[0], b[1]]).to_f64()),
        Elem::I8 => V::I(b[0] as i8 as i64),
        Elem::U8 | Elem::Bool => V::I(b[0] as i64),
        Elem::I16 => V::I(i16::from_le_bytes([b[0], b[1]]) as i64),
        Elem::U16 => V::I(u16::from_le_bytes([b[0], b[1]]) as i64),
        Elem::I32 => V::I(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
        Elem::U32 => V::I(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
        Elem::I64 | Elem::U64 => V::I(i64::from_le_bytes(a(8))),
        Elem::I4 | Elem::U4 | Elem::I2 | Elem::U2 => int_to(t, b[0] as i64),
        _ => V::F(
            t.minifloat()
                .map_or(f64::NAN, |f| f64::from(f.decode(b[0]))),
        ),
    }
}

/// `x` rounded to the float8 / float4 type `t` and read back (NaN for a code that is NaN).
fn minifloat(t: Elem, x: f64) -> f64 {
    t.minifloat()
        .map_or(f64::NAN, |f| f64::from(f.decode(f.encode(x))))
}

pub(super) fn encode(t: Elem, v: V, b: &mut [u8]) {
    match t {
        Elem::F32 => b[..4].copy_from_slice(&(v.f() as f32).to_le_bytes()),
        Elem::F64 => b[..8].copy_from_slice(&v.f().to_le_bytes()),
        Elem::F16 => b[..2].copy_from_slice(&f16::from_f32(f32_odd(v.f())).to_le_bytes()),
        Elem::BF16 => {
            // A stored value is already bf16 (a verified kernel stores its buffer's type): kept as it is,
            // subnormals included (a copy keeps its bits); anything else is converted.
            let exact = bf16::from_f32(v.f() as f32);
            let h = if exact.to_f64() == v.f() {
                exact
            } else {
                bf16_from_f32(f32_odd(v.f()))
            };
            b[..2].copy_from_slice(&h.to_le_bytes())
        }
        Elem::I8 | Elem::U8 | Elem::Bool => b[0] = v.i() as u8,
        Elem::I16 | Elem::U16 => b[..2].copy_from_slice(&(v.i() as u16).to_le_bytes()),
        Elem::I32 | Elem::U32 => b[..4].copy_from_slice(&(v.i() as u32).to_le_bytes()),
        Elem::I64 | Elem::U64 => b[..8].copy_from_slice(&v.i().to_le_bytes()),
        Elem::I4 | Elem::U4 | Elem::I2 | Elem::U2 => b[0] = v.i() as u8,
        _ => b[0] = t.minifloat().map_or(0, |f| f.encode(v.f())),
    }
}

pub(super) fn unary(o: UnOp, x: V, t: Elem) -> V {
    if !t.is_float() {
        let i = x.i();
        return int_to(
            t,
            match o {
                UnOp::Neg => i.wrapping_neg(),
                UnOp::Abs if t.is_unsigned() => i,
                UnOp::Abs => i.wrapping_abs(),
                UnOp::Not if t == Elem::Bool => (i == 0) as i64,
                UnOp::Not => !i,
                _ => i,
            },
        );
    }
    let f = x.f();
    round(
        t,
        match o {
            UnOp::Neg => -f,
            UnOp::Abs => f.abs(),
            UnOp::Exp => f.exp(),
            UnOp::Log => f.ln(),
            UnOp::Sqrt => f.sqrt(),
            UnOp::Tanh => f.tanh(),
            UnOp::Erf => libm::erf(f),
            UnOp::Floor => f.floor(),
            UnOp::Ceil => f.ceil(),
            UnOp::Round => f.round_ties_even(),
            UnOp::Sin => f.sin(),
            UnOp::Cos => f.cos(),
            UnOp::Asin => f.asin(),
            UnOp::Acos => f.acos(),
            UnOp::Atan => f.atan(),
            UnOp::Not => (f == 0.0) as i64 as f64,
        },
    )
}

pub(super) fn binary(o: BinOp, x: V, y: V, t: Elem) -> V {
    if o.is_compare() {
        fn compare<T: PartialOrd>(o: BinOp, a: T, b: T) -> bool {
            match o {
                BinOp::Lt => a < b,
                BinOp::Le => a <= b,
                BinOp::Eq => a == b,
                _ => a != b,
            }
        }
        let r = if t.is_float() {
            compare(o, x.f(), y.f())
        } else if t == Elem::U64 {
            compare(o, x.i() as u64, y.i() as u64)
        } else {
            compare(o, x.i(), y.i())
        };
        return V::I(r as i64);
    }
    if t == Elem::U64 {
        // The operations whose result depends on the sign bit, on the bits as u64.
        let (a, b) = (x.i() as u64, y.i() as u64);
        let r = match o {
            BinOp::Div => a.checked_div(b),
            BinOp::Rem => a.checked_rem(b),
            BinOp::Min | BinOp::AtMost => Some(a.min(b)),
            BinOp::Max | BinOp::AtLeast => Some(a.max(b)),
            BinOp::Shr => Some(if b >= 64 { 0 } else { a >> b }),
            _ => None,
        };
        if let Some(r) = r {
            return V::I(r as i64);
        }
        if matches!(o, BinOp::Div | BinOp::Rem) {
            return V::I(0);
        }
    }
    if !t.is_float() {
        let (a, b) = (x.i(), y.i());
        return int_to(
            t,
            match o {
                BinOp::Add => a.wrapping_add(b),
                BinOp::Sub => a.wrapping_sub(b),
                BinOp::Mul => a.wrapping_mul(b),
                BinOp::Div => a.checked_div(b).unwrap_or(0),
                BinOp::Rem => a.checked_rem(b).unwrap_or(0),
                BinOp::Min | BinOp::AtMost => a.min(b),
                BinOp::Max | BinOp::AtLeast => a.max(b),
                BinOp::Pow => a
                    .checked_pow(b.clamp(0, u32::MAX as i64) as u32)
                    .unwrap_or(0),
                BinOp::And => a & b,
                BinOp::Or => a | b,
                BinOp::Xor => a ^ b,
                // Out of range: the sign fill alone (-1 for a negative value shifted right), as ONNX.
                BinOp::Shr if b < 0 || b >= 8 * t.size() as i64 => -i64::from(a < 0),
                BinOp::Shl if b < 0 || b >= 8 * t.size() as i64 => 0,
                BinOp::Shl => a << b,
                // Values of unsigned types are held zero-extended, so this is a logical shift for them.
                BinOp::Shr => a >> b,
                _ => 0,
            },
        );
    }
    let (a, b) = (x.f(), y.f());
    round(
        t,
        match o {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::Rem => a % b,
            // NaN-propagating min/max, as the code generators emit (llvm.minimum / llvm.maximum).
            BinOp::Min => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.min(b)
                }
            }
            BinOp::Max => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            }
            BinOp::AtMost => {
                if a < b {
                    a
                } else {
                    b
                }
            }
            BinOp::AtLeast => {
                if a > b {
                    a
                } else {
                    b
                }
            }
            BinOp::Pow => a.powf(b),
            _ => f64::NAN,
        },
    )
}
