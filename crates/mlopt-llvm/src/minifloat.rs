//! float8 and float4 (`mlopt_minifloat` formats) to and from f32 in integer code, on scalars or vectors:
//! the same codes as `Format::encode` and `Format::decode`, which the interpreters call. Neither x86 nor
//! PTX before sm_89 has an instruction for these; the rounding is the bf16 conversion's trick widened to
//! subnormal results by one f32 addition.

use crate::codegen::{const_like, float_cmp, int_cmp, Gen, Ret};
use crate::math::{select, shaped};
use inkwell::values::{BasicValueEnum, InstructionOpcode as Op};
use inkwell::{FloatPredicate as F, IntPredicate as I};
use mlopt_kir::Elem;
use mlopt_minifloat::{Format, Special};

/// The bits of 2^e as an f32.
fn pow2_bits(e: i32) -> u32 {
    ((e + 127) as u32) << 23
}

/// f32 `x` rounded to `f`'s nearest code, ties to even, as i8 codes of `x`'s shape.
pub(crate) fn encode<'c>(
    g: &mut Gen<'_, 'c>,
    x: BasicValueEnum<'c>,
    f: Format,
) -> Ret<BasicValueEnum<'c>> {
    let i32s = shaped(g, x, Elem::I32);
    let bits = g.builder.build_bit_cast(x, i32s, "f8bits")?;
    let k = |g: &Gen<'_, 'c>, v: u32| const_like(g.ctx, bits, f64::from(v), Elem::I32);
    let bin = |g: &mut Gen<'_, 'c>, op: Op, a, b| g.builder.build_binop(op, a, b, "f8");
    let sign = bin(g, Op::LShr, bits, k(g, 31))?;
    let abs = bin(g, Op::And, bits, k(g, 0x7fff_ffff))?;
    // A normal result: the mantissa rounded to mbits (nearest, ties to even; a carry moves into the
    // exponent), the exponent rebiased.
    let sh = 23 - f.mbits;
    let lsb = bin(g, Op::LShr, abs, k(g, sh))?;
    let lsb = bin(g, Op::And, lsb, k(g, 1))?;
    let half = bin(g, Op::Add, abs, k(g, (1 << (sh - 1)) - 1))?;
    let up = bin(g, Op::Add, half, lsb)?;
    let rounded = bin(g, Op::LShr, up, k(g, sh))?;
    let normal = bin(
        g,
        Op::Sub,
        rounded,
        k(g, ((127 - f.bias) as u32) << f.mbits),
    )?;
    // A subnormal result: adding 2^(emin - mbits + 23) rounds |x| to a multiple of the subnormal step
    // in the f32 unit, and the bits above the addend's count the steps (2^mbits: the smallest normal).
    let magic = pow2_bits(f.emin() - f.mbits as i32 + 23);
    let absf = g.builder.build_bit_cast(abs, x.get_type(), "f8abs")?;
    let magicf = g
        .builder
        .build_bit_cast(k(g, magic), x.get_type(), "f8magic")?;
    let sum = bin(g, Op::FAdd, absf, magicf)?;
    let sum = g.builder.build_bit_cast(sum, i32s, "f8sum")?;
    let sub = bin(g, Op::Sub, sum, k(g, magic))?;
    let tiny = int_cmp(&g.builder, I::ULT, abs, k(g, pow2_bits(f.emin())))?;
    let code = select(g, tiny, sub, normal)?;
    let over = int_cmp(&g.builder, I::UGT, code, k(g, u32::from(f.max_code())))?;
    let code = select(g, over, k(g, u32::from(f.overflow_code())), code)?;
    let sign_bit = bin(g, Op::Shl, sign, k(g, f.sign_shift()))?;
    let signed = bin(g, Op::Or, code, sign_bit)?;
    let code = if f.special == Special::Unsigned0 {
        // No negative zero: a value that rounds to zero is +0.
        let zero = int_cmp(&g.builder, I::EQ, code, k(g, 0))?;
        select(g, zero, code, signed)?
    } else {
        signed
    };
    let nan_code = match f.special {
        Special::Ieee | Special::Finite => {
            bin(g, Op::Or, k(g, u32::from(f.nan_code(false))), sign_bit)?
        }
        Special::Unsigned0 => k(g, u32::from(f.nan_code(false))),
        // No NaN: a zero of the other sign (the reference's value).
        Special::None => bin(g, Op::Xor, sign_bit, k(g, 1 << f.sign_shift()))?,
    };
    let nan = float_cmp(&g.builder, F::UNO, x, x)?;
    let code = select(g, nan, nan_code, code)?;
    Ok(g.builder
        .build_cast(Op::Trunc, code, shaped(g, x, Elem::I8), "f8")?)
}

/// The f32 values of `f`'s codes `x` (i8, scalar or vector).
pub(crate) fn decode<'c>(
    g: &mut Gen<'_, 'c>,
    x: BasicValueEnum<'c>,
    f: Format,
) -> Ret<BasicValueEnum<'c>> {
    let i32s = shaped(g, x, Elem::I32);
    let f32s = shaped(g, x, Elem::F32);
    let b = g.builder.build_cast(Op::ZExt, x, i32s, "f8code")?;
    let k = |g: &Gen<'_, 'c>, v: u32| const_like(g.ctx, b, f64::from(v), Elem::I32);
    let bin = |g: &mut Gen<'_, 'c>, op: Op, a, c| g.builder.build_binop(op, a, c, "f8");
    let s = f.sign_shift();
    let sign = bin(g, Op::LShr, b, k(g, s))?;
    let sign = bin(g, Op::And, sign, k(g, 1))?;
    let mag = bin(g, Op::And, b, k(g, (1 << s) - 1))?;
    // A normal code: its exponent and mantissa moved into f32's fields, the bias changed.
    let moved = bin(g, Op::Shl, mag, k(g, 23 - f.mbits))?;
    let normal = bin(g, Op::Add, moved, k(g, ((127 - f.bias) as u32) << 23))?;
    // A subnormal (exponent 0): its mantissa times the subnormal step, exact in f32.
    let man = g.builder.build_cast(Op::UIToFP, mag, f32s, "f8man")?;
    let step =
        g.builder
            .build_bit_cast(k(g, pow2_bits(f.emin() - f.mbits as i32)), f32s, "f8step")?;
    let sub = bin(g, Op::FMul, man, step)?;
    let sub = g.builder.build_bit_cast(sub, i32s, "f8subbits")?;
    let small = int_cmp(&g.builder, I::ULT, mag, k(g, 1 << f.mbits))?;
    let v = select(g, small, sub, normal)?;
    let top = (1 << s) - (1 << f.mbits);
    let v = match f.special {
        Special::Ieee => {
            // The top exponent: infinity for mantissa 0, NaN otherwise.
            let at_top = int_cmp(&g.builder, I::UGE, mag, k(g, top))?;
            let is_inf = int_cmp(&g.builder, I::EQ, mag, k(g, top))?;
            let special = select(g, is_inf, k(g, 0x7f80_0000), k(g, 0x7fc0_0000))?;
            select(g, at_top, special, v)?
        }
        Special::Finite => {
            let nan = int_cmp(&g.builder, I::EQ, mag, k(g, (1 << s) - 1))?;
            select(g, nan, k(g, 0x7fc0_0000), v)?
        }
        Special::Unsigned0 => {
            let nan = int_cmp(&g.builder, I::EQ, b, k(g, 1 << s))?;
            // The NaN's sign bit is the code's; cleared so that it is a positive quiet NaN.
            let v = select(g, nan, k(g, 0x7fc0_0000), v)?;
            let sign_clear = select(g, nan, k(g, 0), sign)?;
            return finish(g, v, sign_clear, f32s);
        }
        Special::None => v,
    };
    finish(g, v, sign, f32s)
}

/// Bits `v` with `sign` (0 or 1) in f32's sign bit, as f32.
fn finish<'c>(
    g: &mut Gen<'_, 'c>,
    v: BasicValueEnum<'c>,
    sign: BasicValueEnum<'c>,
    f32s: inkwell::types::BasicTypeEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    let k31 = const_like(g.ctx, sign, 31.0, Elem::I32);
    let s = g.builder.build_binop(Op::Shl, sign, k31, "f8sign")?;
    let v = g.builder.build_binop(Op::Or, v, s, "f8signed")?;
    Ok(g.builder.build_bit_cast(v, f32s, "f8f32")?)
}
