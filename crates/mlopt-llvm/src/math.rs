//! Arithmetic, comparisons, math functions and casts on scalars or vectors of any element type.
//! Float min/max propagate NaN, as the interpreters do (`nan_min_max` on AVX-512 vectors, else
//! `llvm.minimum`/`llvm.maximum`); integer division by zero yields 0 instead of trapping.
//! Transcendental functions are straight-line code in registers (`transcendental.rs`) where written
//! there, else LLVM intrinsics or libm calls (one per lane) on the CPU; on the GPU `ptx.rs` supplies
//! approximate instructions or reports the function as unsupported.

use crate::codegen::{const_like, float_cmp, int_cmp, ty, Gen, Ret};
use crate::error::LlvmError;
use inkwell::types::BasicType;
use inkwell::values::{BasicValueEnum, InstructionOpcode as Op};
use inkwell::{FloatPredicate as F, IntPredicate as I};
use mlopt_kir::{BinOp, Elem, UnOp};

/// The lanes of a vector, 1 for a scalar.
fn lanes(x: BasicValueEnum<'_>) -> u32 {
    match x {
        BasicValueEnum::VectorValue(v) => v.get_type().get_size(),
        _ => 1,
    }
}

fn unsigned(t: Elem) -> bool {
    t.is_unsigned()
}

pub fn unary<'c>(
    g: &mut Gen<'_, 'c>,
    o: UnOp,
    x: BasicValueEnum<'c>,
    t: Elem,
) -> Ret<BasicValueEnum<'c>> {
    if !t.is_float() {
        return Ok(match o {
            UnOp::Neg => {
                let z = const_like(g.ctx, x, 0.0, t);
                g.builder.build_binop(Op::Sub, z, x, "neg")?
            }
            UnOp::Abs if unsigned(t) => x,
            UnOp::Abs => {
                let f = g.ctx.bool_type().const_zero();
                let i = inkwell::intrinsics::Intrinsic::find("llvm.abs")
                    .ok_or_else(|| LlvmError::Codegen("no llvm.abs".into()))?;
                let d = i
                    .get_declaration(g.module, &[x.get_type()])
                    .ok_or_else(|| LlvmError::Codegen("llvm.abs".into()))?;
                g.builder
                    .build_call(d, &[x.into(), f.into()], "abs")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| LlvmError::Codegen("abs".into()))?
            }
            UnOp::Not => {
                // Bool: flip the bit; integers: all bits.
                let ones = if t == Elem::Bool {
                    const_like(g.ctx, x, 1.0, Elem::Bool)
                } else {
                    const_like(g.ctx, x, -1.0, t)
                };
                g.builder.build_binop(Op::Xor, x, ones, "not")?
            }
            _ => return Err(LlvmError::Codegen(format!("{o:?} of {t}"))),
        });
    }
    if g.gpu {
        if let Some(r) = crate::ptx::unary(g, o, x, t)? {
            return Ok(r);
        }
    }
    use crate::transcendental as tr;
    match (o, t) {
        (UnOp::Exp, Elem::F32) => return tr::exp_f32(g, x),
        (UnOp::Tanh, Elem::F32) => return tr::tanh_f32(g, x),
        (UnOp::Erf, Elem::F32) => return tr::erf_f32(g, x),
        (UnOp::Asin, Elem::F32) => return tr::asin_f32(g, x),
        (UnOp::Acos, Elem::F32) => return tr::acos_f32(g, x),
        (UnOp::Atan, Elem::F32) => return tr::atan_f32(g, x),
        (UnOp::Exp, Elem::F64) => return tr::exp_f64(g, x),
        (UnOp::Log, Elem::F64) => return tr::log_f64(g, x),
        _ => {}
    }
    let name = match o {
        UnOp::Neg => return Ok(g.builder.build_unary_op_neg(x)?),
        UnOp::Abs => "llvm.fabs",
        UnOp::Exp => "llvm.exp",
        UnOp::Log => "llvm.log",
        UnOp::Sqrt => "llvm.sqrt",
        UnOp::Floor => "llvm.floor",
        UnOp::Ceil => "llvm.ceil",
        UnOp::Round => "llvm.roundeven",
        UnOp::Sin => "llvm.sin",
        UnOp::Cos => "llvm.cos",
        UnOp::Asin => "llvm.asin",
        UnOp::Acos => "llvm.acos",
        UnOp::Atan => "llvm.atan",
        UnOp::Tanh => return libm(g, if t == Elem::F64 { "tanh" } else { "tanhf" }, x, t),
        UnOp::Erf => return libm(g, if t == Elem::F64 { "erf" } else { "erff" }, x, t),
        UnOp::Not => return Err(LlvmError::Codegen(format!("not of {t}"))),
    };
    g.intrinsic(name, &[x])
}

trait NegExt<'c> {
    fn build_unary_op_neg(
        &self,
        x: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>, inkwell::builder::BuilderError>;
}

impl<'c> NegExt<'c> for inkwell::builder::Builder<'c> {
    fn build_unary_op_neg(
        &self,
        x: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>, inkwell::builder::BuilderError> {
        Ok(match x {
            BasicValueEnum::VectorValue(v) => self.build_float_neg(v, "fneg")?.into(),
            v => self.build_float_neg(v.into_float_value(), "fneg")?.into(),
        })
    }
}

/// A libm function of one float, applied lane by lane to a vector.
fn libm<'c>(
    g: &mut Gen<'_, 'c>,
    name: &str,
    x: BasicValueEnum<'c>,
    t: Elem,
) -> Ret<BasicValueEnum<'c>> {
    let ft = ty(g.ctx, t);
    let f = g.module.get_function(name).unwrap_or_else(|| {
        g.module
            .add_function(name, ft.fn_type(&[ft.into()], false), None)
    });
    let call = |g: &mut Gen<'_, 'c>, v: BasicValueEnum<'c>| -> Ret<BasicValueEnum<'c>> {
        g.builder
            .build_call(f, &[v.into()], name)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LlvmError::Codegen(format!("{name} returned nothing")))
    };
    per_lane(g, x, &mut |g, v| call(g, v))
}

/// `f` on a scalar, or on each lane of a vector (for functions that exist only on scalars: libm calls,
/// PTX's approximate instructions).
pub(crate) fn per_lane<'c>(
    g: &mut Gen<'_, 'c>,
    x: BasicValueEnum<'c>,
    f: &mut dyn FnMut(&mut Gen<'_, 'c>, BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>>,
) -> Ret<BasicValueEnum<'c>> {
    let BasicValueEnum::VectorValue(v) = x else {
        return f(g, x);
    };
    let mut acc = v;
    for lane in 0..v.get_type().get_size() {
        let l = g.ctx.i32_type().const_int(lane as u64, false);
        let e = g.builder.build_extract_element(v, l, "e")?;
        let r = f(g, e)?;
        acc = g.builder.build_insert_element(acc, r, l, "r")?;
    }
    Ok(acc.into())
}

pub fn binary<'c>(
    g: &mut Gen<'_, 'c>,
    o: BinOp,
    x: BasicValueEnum<'c>,
    y: BasicValueEnum<'c>,
    t: Elem,
) -> Ret<BasicValueEnum<'c>> {
    let b = &g.builder;
    if t.is_float() {
        return Ok(match o {
            BinOp::Add => b.build_binop(Op::FAdd, x, y, "add")?,
            BinOp::Sub => b.build_binop(Op::FSub, x, y, "sub")?,
            BinOp::Mul => b.build_binop(Op::FMul, x, y, "mul")?,
            BinOp::Div => b.build_binop(Op::FDiv, x, y, "div")?,
            BinOp::Rem => b.build_binop(Op::FRem, x, y, "rem")?,
            BinOp::Min | BinOp::Max
                if t == Elem::F32
                    && ((g.avx512 && (2..=16).contains(&lanes(x)))
                        || (g.avx && (2..=8).contains(&lanes(x)))) =>
            {
                return nan_min_max(g, o, x, y)
            }
            BinOp::Min => return g.intrinsic("llvm.minimum", &[x, y]),
            BinOp::Max => return g.intrinsic("llvm.maximum", &[x, y]),
            // The selects x86's `minps`/`maxps` compute, which LLVM emits as one of them.
            BinOp::AtMost => {
                let c = float_cmp(b, F::OLT, x, y)?;
                return select(g, c, x, y);
            }
            BinOp::AtLeast => {
                let c = float_cmp(b, F::OGT, x, y)?;
                return select(g, c, x, y);
            }
            BinOp::Pow if matches!(t, Elem::F32 | Elem::F64) => {
                return crate::transcendental::pow(g, x, y, t)
            }
            BinOp::Pow => return Err(LlvmError::Codegen(format!("pow of {t}"))),
            BinOp::Lt => float_cmp(b, F::OLT, x, y)?,
            BinOp::Le => float_cmp(b, F::OLE, x, y)?,
            BinOp::Eq => float_cmp(b, F::OEQ, x, y)?,
            BinOp::Ne => float_cmp(b, F::UNE, x, y)?,
            BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl | BinOp::Shr => {
                return Err(LlvmError::Codegen(format!("{o:?} of {t}")))
            }
        });
    }
    let u = unsigned(t);
    Ok(match o {
        BinOp::Add => b.build_binop(Op::Add, x, y, "add")?,
        BinOp::Sub => b.build_binop(Op::Sub, x, y, "sub")?,
        BinOp::Mul => b.build_binop(Op::Mul, x, y, "mul")?,
        BinOp::Div | BinOp::Rem => {
            // x / 0 = 0 (the interpreter's answer) instead of a trap; a signed x / -1 is -x (wrapping)
            // and x % -1 is 0, so MIN / -1 does not trap either. Constant divisors fold all of this away.
            let zero = const_like(g.ctx, y, 0.0, t);
            let one = const_like(g.ctx, y, 1.0, t);
            let is0 = int_cmp(b, I::EQ, y, zero)?;
            let mut safe = select(g, is0, one, y)?;
            let mut by_minus_one = None;
            if !u {
                let m1 = const_like(g.ctx, y, -1.0, t);
                let is_m1 = int_cmp(&g.builder, I::EQ, y, m1)?;
                safe = select(g, is_m1, one, safe)?;
                let special = if o == BinOp::Div {
                    g.builder.build_binop(Op::Sub, zero, x, "neg")?
                } else {
                    zero
                };
                by_minus_one = Some((is_m1, special));
            }
            let op = match (o, u) {
                (BinOp::Div, false) => Op::SDiv,
                (BinOp::Div, true) => Op::UDiv,
                (_, false) => Op::SRem,
                (_, true) => Op::URem,
            };
            let mut q = g.builder.build_binop(op, x, safe, "idiv")?;
            if let Some((is_m1, special)) = by_minus_one {
                q = select(g, is_m1, special, q)?;
            }
            return select(g, is0, zero, q);
        }
        BinOp::Min | BinOp::AtMost => {
            return g.intrinsic(if u { "llvm.umin" } else { "llvm.smin" }, &[x, y])
        }
        BinOp::Max | BinOp::AtLeast => {
            return g.intrinsic(if u { "llvm.umax" } else { "llvm.smax" }, &[x, y])
        }
        BinOp::Lt => int_cmp(b, if u { I::ULT } else { I::SLT }, x, y)?,
        BinOp::Le => int_cmp(b, if u { I::ULE } else { I::SLE }, x, y)?,
        BinOp::Eq => int_cmp(b, I::EQ, x, y)?,
        BinOp::Ne => int_cmp(b, I::NE, x, y)?,
        BinOp::And => b.build_binop(Op::And, x, y, "and")?,
        BinOp::Or => b.build_binop(Op::Or, x, y, "or")?,
        BinOp::Xor => b.build_binop(Op::Xor, x, y, "xor")?,
        BinOp::Shl | BinOp::Shr => {
            // A shift by the width or more (or by a negative amount) gives what the sign fill alone
            // gives instead of poison (ONNX opset 28): 0, or for a signed right shift, the shift by
            // width - 1 (-1 for a negative value).
            let bits = (8 * t.size()) as f64;
            let width = const_like(g.ctx, y, bits, t);
            let out = int_cmp(b, I::UGE, y, width)?;
            let op = match (o, u) {
                (BinOp::Shl, _) => Op::Shl,
                (_, true) => Op::LShr,
                (_, false) => Op::AShr,
            };
            let v = g.builder.build_binop(op, x, y, "shift")?;
            let fill = match op {
                Op::AShr => {
                    let last = const_like(g.ctx, y, bits - 1.0, t);
                    g.builder.build_binop(Op::AShr, x, last, "fill")?
                }
                _ => const_like(g.ctx, y, 0.0, t),
            };
            return select(g, out, fill, v);
        }
        BinOp::Pow => return Err(LlvmError::Codegen(format!("pow of {t}"))),
    })
}

/// NaN-propagating `min`/`max` of f32 vectors on AVX-512 (or AVX, up to 8 lanes) in the form of x86's
/// `maxps`/`minps`: `maxps y, x`
/// is `y > x ? y : x`, which is `x` when either is NaN, and a NaN `y` is put back by a select on its
/// own test. In an `acc = max(acc, v)` reduction `y` is the new value, so its test is off the chain
/// through `acc`: two dependent instructions a step where `llvm.maximum` (which also orders -0 below
/// +0, an order neither interpreter keeps) takes five, two of them on mask registers, and ReLU's
/// `max(x, 0)` is one `maxps`. Through the intrinsic, as LLVM would merge the two selects of the same
/// form back into mask arithmetic.
fn nan_min_max<'c>(
    g: &mut Gen<'_, 'c>,
    o: BinOp,
    x: BasicValueEnum<'c>,
    y: BasicValueEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    // Up to 8 lanes in one ymm register where the target has AVX (every x86 level mlopt targets).
    let m = if lanes(x) > 8 || !g.avx {
        let name = match o {
            BinOp::Max => "llvm.x86.avx512.max.ps.512",
            _ => "llvm.x86.avx512.min.ps.512",
        };
        // 4: the current rounding (no exception suppression).
        let current = g.ctx.i32_type().const_int(4, false);
        g.avx512_ps(name, &[y, x], &[current.into()])?
    } else {
        let name = match o {
            BinOp::Max => "llvm.x86.avx.max.ps.256",
            _ => "llvm.x86.avx.min.ps.256",
        };
        g.x86_ps(name, 8, &[y, x], &[])?
    };
    let nan = float_cmp(&g.builder, F::UNO, y, y)?;
    select(g, nan, y, m)
}

pub(crate) fn select<'c>(
    g: &mut Gen<'_, 'c>,
    c: BasicValueEnum<'c>,
    x: BasicValueEnum<'c>,
    y: BasicValueEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    Ok(match c {
        BasicValueEnum::VectorValue(c) => g.builder.build_select(c, x, y, "sel")?,
        c => g.builder.build_select(c.into_int_value(), x, y, "sel")?,
    })
}

/// The register type of `to` with `x`'s shape.
pub(crate) fn shaped<'c>(
    g: &Gen<'_, 'c>,
    x: BasicValueEnum<'c>,
    to: Elem,
) -> inkwell::types::BasicTypeEnum<'c> {
    let t = if to == Elem::Bool {
        g.ctx.bool_type().as_basic_type_enum()
    } else {
        ty(g.ctx, to)
    };
    match x {
        BasicValueEnum::VectorValue(v) => crate::codegen::vector_type(t, v.get_type().get_size()),
        _ => t,
    }
}

/// f64 -> f32 rounded to odd: truncated towards zero, with the last bit set when inexact. f32 keeps 16
/// bits more than bf16, so rounding this to bf16 (to nearest even) gives the correctly rounded bf16.
fn f64_to_f32_odd<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let r = g
        .builder
        .build_cast(Op::FPTrunc, x, shaped(g, x, Elem::F32), "r")?;
    let back = g.builder.build_cast(Op::FPExt, r, x.get_type(), "back")?;
    let abs = |g: &mut Gen<'_, 'c>, v| g.intrinsic("llvm.fabs", &[v]);
    let (ab, ax) = (abs(g, back)?, abs(g, x)?);
    let away = float_cmp(&g.builder, F::OGT, ab, ax)?;
    let inexact = float_cmp(&g.builder, F::ONE, back, x)?;
    let bits = g
        .builder
        .build_bit_cast(r, shaped(g, x, Elem::I32), "bits")?;
    let one = const_like(g.ctx, bits, 1.0, Elem::I32);
    let less = g.builder.build_binop(Op::Sub, bits, one, "tz")?;
    let tz = select(g, away, less, bits)?;
    let odd = g.builder.build_binop(Op::Or, tz, one, "odd")?;
    let out = select(g, inexact, odd, tz)?;
    Ok(g.builder
        .build_bit_cast(out, shaped(g, x, Elem::F32), "f")?)
}

/// f32 -> bf16 as mlopt defines it (the interpreters' `bf16_from_f32`): rounded to nearest even, NaNs kept
/// quiet with their sign, f32 subnormals flushed to a zero of their sign. `vcvtneps2bf16` where the CPU
/// has AVX512-BF16 (one instruction: exactly this); elsewhere in integer code, the high half of
/// `bits + 0x7fff + (bit 16 of bits)` (LLVM would call `__truncsfbf2`, which Debian bookworm's libgcc
/// lacks, and which keeps subnormals).
fn to_bf16<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    if g.bf16_convert {
        return Ok(g
            .builder
            .build_cast(Op::FPTrunc, x, shaped(g, x, Elem::BF16), "cvt")?);
    }
    let bits = g
        .builder
        .build_bit_cast(x, shaped(g, x, Elem::I32), "bits")?;
    let k = |v: f64| const_like(g.ctx, bits, v, Elem::I32);
    let high = g.builder.build_binop(Op::LShr, bits, k(16.0), "hi")?;
    let lsb = g.builder.build_binop(Op::And, high, k(1.0), "lsb")?;
    let bias = g.builder.build_binop(Op::Add, lsb, k(32767.0), "bias")?;
    let sum = g.builder.build_binop(Op::Add, bits, bias, "rnd")?;
    let rounded = g.builder.build_binop(Op::LShr, sum, k(16.0), "r")?;
    let quiet = g.builder.build_binop(Op::Or, high, k(64.0), "qnan")?;
    let nan = float_cmp(&g.builder, F::UNO, x, x)?;
    let r = select(g, nan, quiet, rounded)?;
    let exponent = g
        .builder
        .build_binop(Op::And, bits, k(f64::from(0x7f80_0000u32)), "exp")?;
    let tiny = int_cmp(&g.builder, I::EQ, exponent, k(0.0))?;
    let sign = g.builder.build_binop(Op::And, high, k(32768.0), "sign")?;
    let r = select(g, tiny, sign, r)?;
    let i16s = match x {
        BasicValueEnum::VectorValue(v) => g
            .ctx
            .i16_type()
            .vec_type(v.get_type().get_size())
            .as_basic_type_enum(),
        _ => g.ctx.i16_type().as_basic_type_enum(),
    };
    let r = g.builder.build_cast(Op::Trunc, r, i16s, "t")?;
    Ok(g.builder
        .build_bit_cast(r, shaped(g, x, Elem::BF16), "bf16")?)
}

pub fn cast<'c>(
    g: &mut Gen<'_, 'c>,
    x: BasicValueEnum<'c>,
    from: Elem,
    to: Elem,
) -> Ret<BasicValueEnum<'c>> {
    if from == to {
        return Ok(x);
    }
    // float8 / float4: through f32 (from an f64 rounded to odd, from an integer through f64), as
    // `Format::encode` rounds the exact value once.
    if let Some(f) = from.minifloat() {
        let wide = crate::minifloat::decode(g, x, f)?;
        return cast(g, wide, Elem::F32, to);
    }
    if let Some(f) = to.minifloat() {
        let x = match from {
            Elem::F32 => x,
            Elem::F16 | Elem::BF16 => cast(g, x, from, Elem::F32)?,
            _ => {
                let wide = cast(g, x, from, Elem::F64)?;
                f64_to_f32_odd(g, wide)?
            }
        };
        return crate::minifloat::encode(g, x, f);
    }
    // int4 / uint4 / int2 / uint2 are held sign- / zero-extended in a byte: read as i8 / u8, and made
    // by wrapping a value's low four or two bits (a float truncated to i64 first, as the interpreters
    // do).
    if let Some(byte) = nibble_byte(from) {
        return cast(g, x, byte, to);
    }
    if let Some(byte) = nibble_byte(to) {
        let (x, from) = if from.is_float() {
            (cast(g, x, from, Elem::I64)?, Elem::I64)
        } else {
            (x, from)
        };
        let b = cast(g, x, from, byte)?;
        let bits = if matches!(to, Elem::I4 | Elem::U4) {
            4
        } else {
            2
        };
        return Ok(if byte == Elem::I8 {
            let unused = const_like(g.ctx, b, f64::from(8 - bits), byte);
            let up = g.builder.build_binop(Op::Shl, b, unused, "sub_byte")?;
            g.builder.build_binop(Op::AShr, up, unused, "sub_byte")?
        } else {
            let low = const_like(g.ctx, b, f64::from((1 << bits) - 1), byte);
            g.builder.build_binop(Op::And, b, low, "sub_byte")?
        });
    }
    let t = shaped(g, x, to);
    if to == Elem::Bool {
        return if from.is_float() {
            let z = const_like(g.ctx, x, 0.0, from);
            float_cmp(&g.builder, F::UNE, x, z)
        } else {
            let z = const_like(g.ctx, x, 0.0, from);
            int_cmp(&g.builder, I::NE, x, z)
        };
    }
    let op = match (from.is_float(), to.is_float()) {
        (true, true) => {
            if from.size() < to.size() || (from == Elem::BF16 && to == Elem::F16) {
                Op::FPExt
            } else {
                Op::FPTrunc
            }
        }
        (true, false)
            if matches!(to, Elem::I8 | Elem::U8) && matches!(from, Elem::F32 | Elem::F64) =>
        {
            // LLVM converts to bytes with saturation element by element on x86, so the saturation is
            // done here on whole vectors: NaN is 0, values are clamped to the byte's range in the
            // float type (exact), converted to i32 (vcvttps2dq: in range, no poison) and truncated.
            let (lo, hi) = if to == Elem::U8 {
                (0.0, 255.0)
            } else {
                (-128.0, 127.0)
            };
            let zero = const_like(g.ctx, x, 0.0, from);
            let nan = float_cmp(&g.builder, F::UNO, x, x)?;
            let v = select(g, nan, zero, x)?;
            let lo = const_like(g.ctx, x, lo, from);
            let hi = const_like(g.ctx, x, hi, from);
            let v = g.intrinsic("llvm.maxnum", &[v, lo])?;
            let v = g.intrinsic("llvm.minnum", &[v, hi])?;
            let wide = g
                .builder
                .build_cast(Op::FPToSI, v, shaped(g, x, Elem::I32), "i32")?;
            return Ok(g.builder.build_cast(Op::Trunc, wide, t, "byte")?);
        }
        (true, false) => {
            // NaN and out-of-range values saturate instead of being poison.
            let name = if unsigned(to) {
                "llvm.fptoui.sat"
            } else {
                "llvm.fptosi.sat"
            };
            let i = inkwell::intrinsics::Intrinsic::find(name)
                .ok_or_else(|| LlvmError::Codegen(format!("no {name}")))?;
            let d = i
                .get_declaration(g.module, &[t, x.get_type()])
                .ok_or_else(|| LlvmError::Codegen(name.into()))?;
            return g
                .builder
                .build_call(d, &[x.into()], "fptoi")?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| LlvmError::Codegen(name.into()));
        }
        (false, true) => {
            if unsigned(from) {
                Op::UIToFP
            } else {
                Op::SIToFP
            }
        }
        (false, false) => {
            let (fs, ts) = (if from == Elem::Bool { 0 } else { from.size() }, to.size());
            if ts < fs {
                Op::Trunc
            } else if unsigned(from) {
                Op::ZExt
            } else {
                Op::SExt
            }
        }
    };
    // bf16 -> f32 is exact: its bits are f32's high half. In integer code, because LLVM 19 expands
    // `fpext <16 x bfloat>` lane by lane (extract, shift, insert, a compare per lane): a bf16 1x1
    // convolution with a SiLU epilogue ran 6x slower than in f32 on it.
    if from == Elem::BF16 && matches!(to, Elem::F32 | Elem::F64) {
        let (i16s, i32s) = match x {
            BasicValueEnum::VectorValue(v) => {
                let n = v.get_type().get_size();
                (
                    g.ctx.i16_type().vec_type(n).as_basic_type_enum(),
                    g.ctx.i32_type().vec_type(n).as_basic_type_enum(),
                )
            }
            _ => (
                g.ctx.i16_type().as_basic_type_enum(),
                g.ctx.i32_type().as_basic_type_enum(),
            ),
        };
        let bits = g.builder.build_bit_cast(x, i16s, "bfbits")?;
        let wide = g.builder.build_cast(Op::ZExt, bits, i32s, "bfwide")?;
        let sixteen = const_like(g.ctx, wide, 16.0, Elem::I32);
        let high = g.builder.build_binop(Op::Shl, wide, sixteen, "bfhigh")?;
        let f = g
            .builder
            .build_bit_cast(high, shaped(g, x, Elem::F32), "bff32")?;
        return cast(g, f, Elem::F32, to);
    }
    // bf16 -> f16 has no single instruction: go through f32.
    if (from, to) == (Elem::BF16, Elem::F16) {
        let mid = cast(g, x, from, Elem::F32)?;
        return cast(g, mid, Elem::F32, to);
    }
    if to == Elem::BF16 && from.is_float() {
        // From f64 via f32 rounded to odd, so that the second rounding is the correct one.
        let x = if from == Elem::F64 {
            f64_to_f32_odd(g, x)?
        } else {
            cast(g, x, from, Elem::F32)?
        };
        return to_bf16(g, x);
    }
    Ok(g.builder.build_cast(op, x, t, "cast")?)
}

/// The byte type an int4 / uint4 / int2 / uint2 is held in.
fn nibble_byte(e: Elem) -> Option<Elem> {
    match e {
        Elem::I4 | Elem::I2 => Some(Elem::I8),
        Elem::U4 | Elem::U2 => Some(Elem::U8),
        _ => None,
    }
}

impl<'c> Gen<'_, 'c> {
    /// A call to a 16-lane f32 AVX-512 intrinsic (`llvm.x86.avx512.*.ps.512`) on f32 scalars or vectors
    /// of up to 16 lanes, all of one shape: `floats` widened to 16 lanes (the added lanes poison, which
    /// leaves LLVM free to fill them however is cheapest) and followed by `rest` (masks, rounding), the
    /// result narrowed back to their shape.
    pub(crate) fn avx512_ps(
        &mut self,
        name: &str,
        floats: &[BasicValueEnum<'c>],
        rest: &[inkwell::values::BasicMetadataValueEnum<'c>],
    ) -> Ret<BasicValueEnum<'c>> {
        self.x86_ps(name, 16, floats, rest)
    }

    /// `avx512_ps` for an intrinsic on `width` f32 lanes (8: AVX's `llvm.x86.avx.*.ps.256`).
    pub(crate) fn x86_ps(
        &mut self,
        name: &str,
        width: u32,
        floats: &[BasicValueEnum<'c>],
        rest: &[inkwell::values::BasicMetadataValueEnum<'c>],
    ) -> Ret<BasicValueEnum<'c>> {
        let lane0 = self.ctx.i32_type().const_zero();
        let vt = self.ctx.f32_type().vec_type(width);
        let lanes = match floats[0] {
            BasicValueEnum::VectorValue(v) => Some(v.get_type().get_size()),
            _ => None,
        };
        let mut args = Vec::with_capacity(floats.len() + rest.len());
        for &v in floats {
            let wide: BasicValueEnum<'c> = match (v, lanes) {
                (BasicValueEnum::VectorValue(v), Some(w)) if w == width => v.into(),
                (BasicValueEnum::VectorValue(v), Some(_)) => self.padded(v, width)?.into(),
                (v, _) => self
                    .builder
                    .build_insert_element(vt.get_poison(), v, lane0, "wide")?
                    .into(),
            };
            args.push(wide.into());
        }
        args.extend_from_slice(rest);
        let f = inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, &[]))
            .ok_or_else(|| crate::codegen::err(format!("no intrinsic {name}")))?;
        let e = self
            .builder
            .build_call(f, &args, name)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| crate::codegen::err(format!("{name} returned nothing")))?
            .into_vector_value();
        Ok(match lanes {
            Some(w) if w == width => e.into(),
            Some(w) => self.shuffle((e, e), 0..w, "narrow")?.into(),
            None => self.builder.build_extract_element(e, lane0, "e")?,
        })
    }
}
