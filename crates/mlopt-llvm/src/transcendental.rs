//! Transcendental functions as straight-line code in registers: no libm call and no branch, so the
//! same code serves x86 and NVPTX, scalars and vectors (a vector loop stays vector), and it is checked
//! on the host against the interpreter and against f64 references (`tests/compiled.rs`).
//!
//! | function | types | method | error |
//! |---|---|---|---|
//! | exp | f32 | Cephes expf: x = n ln2 + r, degree-6 polynomial, 2^n in the exponent bits | ~1 ulp |
//! | tanh | f32 | from e^(-2\|x\|), Taylor series below 0.1 | ~1e-7 relative |
//! | erf | f32 | Abramowitz & Stegun 7.1.26 | 4e-7 absolute (the formula's 1.5e-7, and f32 rounding) |
//! | atan, asin, acos | f32 | Cephes' reductions and polynomials | < 3 ulp |
//! | exp | f64 | n ln2 + r (ln2 split in two), Taylor series to r^13, 2^n as two exponent-bit factors | ~1 ulp |
//! | log | f64 | x = m 2^e, m in [sqrt(1/2), sqrt(2)], 2 atanh((m-1)/(m+1)) to s^19 | < 3 ulp |
//! | pow | f32, f64 | integer \|y\| < 64: repeated squaring (exact when the result is); else exp(y log\|x\|) in f64, with C99's special cases | f32 0.5 ulp; f64 up to 2 + 2\|y ln x\| ulp (ln x's error, scaled) |

use crate::codegen::{const_like, float_cmp, int_cmp, Gen, Ret};
use crate::math::{select, shaped};
use inkwell::values::{BasicValueEnum, InstructionOpcode as Op};
use inkwell::{FloatPredicate as F, IntPredicate as I};
use mlopt_kir::Elem;

type V<'c> = BasicValueEnum<'c>;

/// ln 2 in two parts (fdlibm's): the high part has 32 significant bits, so n * LN2_HI is exact for the
/// exponents of f64.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// A float constant shaped like `x`.
fn k<'c>(g: &Gen<'_, 'c>, x: BasicValueEnum<'c>, v: f64) -> BasicValueEnum<'c> {
    const_like(g.ctx, x, v, Elem::F32)
}

fn fma<'c>(
    g: &mut Gen<'_, 'c>,
    a: BasicValueEnum<'c>,
    b: BasicValueEnum<'c>,
    c: BasicValueEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    g.intrinsic("llvm.fma", &[a, b, c])
}

fn op<'c>(
    g: &Gen<'_, 'c>,
    o: Op,
    a: BasicValueEnum<'c>,
    b: BasicValueEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    Ok(g.builder.build_binop(o, a, b, "m")?)
}

/// e^x for f32 scalars or vectors in registers (no libm call, so vector loops stay vector): Cephes'
/// expf. x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n built in the exponent
/// bits (on AVX-512, applied by `vscalefps`: `exp_scalef`). About 1 ulp; NaN stays NaN, overflow
/// gives inf, deep underflow gives 0.
pub(crate) fn exp_f32<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let lanes = match x {
        BasicValueEnum::VectorValue(v) => v.get_type().get_size(),
        _ => 1,
    };
    if g.avx512 && lanes <= 16 {
        return exp_scalef(g, x);
    }
    let lo = k(g, x, -87.33654);
    let hi = k(g, x, 88.72284);
    let cx = g.intrinsic("llvm.maxnum", &[x, lo])?;
    let cx = g.intrinsic("llvm.minnum", &[cx, hi])?;
    let (n, y) = exp_reduced(g, cx)?;
    // 2^n: (n + 127) << 23 as the bits of a float.
    let it = shaped(g, x, Elem::I32);
    let ni = g.builder.build_cast(Op::FPToSI, n, it, "n")?;
    let ni = op(g, Op::Add, ni, const_like(g.ctx, ni, 127.0, Elem::I32))?;
    let ni = op(g, Op::Shl, ni, const_like(g.ctx, ni, 23.0, Elem::I32))?;
    let two_n = g
        .builder
        .build_cast(Op::BitCast, ni, x.get_type(), "pow2")?;
    let e = op(g, Op::FMul, y, two_n)?;
    // Beyond the clamps: inf above, 0 below; NaN passes through.
    let over = float_cmp(&g.builder, F::OGT, x, hi)?;
    let under = float_cmp(&g.builder, F::OLT, x, lo)?;
    let nan = float_cmp(&g.builder, F::UNO, x, x)?;
    let e = select(g, over, k(g, x, f64::INFINITY), e)?;
    let e = select(g, under, k(g, x, 0.0), e)?;
    select(g, nan, x, e)
}

/// Cephes' expf reduction of a clamped `cx`: n = round(cx / ln 2) and e^r for r = cx - n ln 2 (ln 2 in
/// two parts, |r| <= ln2/2) by a degree-6 polynomial, so e^cx = e^r x 2^n: (n, e^r).
fn exp_reduced<'c>(g: &mut Gen<'_, 'c>, cx: V<'c>) -> Ret<(V<'c>, V<'c>)> {
    let x = cx;
    let n = op(g, Op::FMul, cx, k(g, x, std::f64::consts::LOG2_E))?;
    let n = g.intrinsic("llvm.roundeven", &[n])?;
    let r = fma(g, n, k(g, x, -0.693359375), cx)?;
    let r = fma(g, n, k(g, x, 2.12194440e-4), r)?;
    let mut p = k(g, x, 1.9875691500e-4);
    for c in [
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    ] {
        p = fma(g, p, r, k(g, x, c))?;
    }
    let rr = op(g, Op::FMul, r, r)?;
    let y = fma(g, p, rr, r)?;
    let y = op(g, Op::FAdd, y, k(g, x, 1.0))?;
    Ok((n, y))
}

/// e^x for f32 scalars and vectors of up to 16 lanes on AVX-512: `exp_f32`'s reduction and polynomial, and 2^n
/// applied by `vscalefps`, which overflows to inf and keeps NaN: x is clamped to [-87.34, 89] by
/// compares that let a NaN through, and below e^-87.34 (the smallest normal f32) the result is 0, as
/// in the exponent-bit form. (Through the subnormals, each result and every sum and product it then
/// entered took a microcode assist on Intel cores: GPT-2's masked softmax, half of whose scores are
/// -3.4e38, ran at 2 GFLOP/s on Sapphire Rapids, 1.4-3 ms per layer; now 0.2 ms.) 15 vector
/// instructions where the exponent-bit form takes 25: every SiLU, sigmoid, softmax and GELU runs it
/// (SiLU over a vector 1.4x faster on Zen 5).
fn exp_scalef<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let (lo, hi) = (k(g, x, -87.33654), k(g, x, 89.0));
    let below = float_cmp(&g.builder, F::OLT, x, lo)?;
    let cx = select(g, below, lo, x)?;
    let above = float_cmp(&g.builder, F::OGT, cx, hi)?;
    let cx = select(g, above, hi, cx)?;
    let (n, y) = exp_reduced(g, cx)?;
    let i32t = g.ctx.i32_type();
    let all = g.ctx.i16_type().const_all_ones();
    // Rounding 4: the current direction (MXCSR's, nearest).
    let current = i32t.const_int(4, false);
    let e = g.avx512_ps(
        "llvm.x86.avx512.mask.scalef.ps.512",
        &[y, n, y],
        &[all.into(), current.into()],
    )?;
    select(g, below, k(g, x, 0.0), e)
}

/// tanh x = sign(x) (1 - e^(-2|x|)) / (1 + e^(-2|x|)), and its Taylor series x - x^3/3 + 2x^5/15 -
/// 17x^7/315 below |x| = 0.1, where the subtraction would cancel (relative error ~1e-7 everywhere).
pub(crate) fn tanh_f32<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let x2 = op(g, Op::FMul, x, x)?;
    let mut p = k(g, x, -17.0 / 315.0);
    for c in [2.0 / 15.0, -1.0 / 3.0] {
        p = fma(g, p, x2, k(g, x, c))?;
    }
    let px = op(g, Op::FMul, p, x2)?;
    let small = fma(g, px, x, x)?;
    let ax = g.intrinsic("llvm.fabs", &[x])?;
    let m2 = op(g, Op::FMul, ax, k(g, x, -2.0))?;
    let t = exp_f32(g, m2)?;
    let num = op(g, Op::FSub, k(g, x, 1.0), t)?;
    let den = op(g, Op::FAdd, k(g, x, 1.0), t)?;
    let y = op(g, Op::FDiv, num, den)?;
    let y = g.intrinsic("llvm.copysign", &[y, x])?;
    let is_small = float_cmp(&g.builder, F::OLT, ax, k(g, x, 0.1))?;
    select(g, is_small, small, y)
}

/// erf x by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7; 4e-7 evaluated in f32):
/// 1 - (a1 t + ... + a5 t^5) e^(-x^2), t = 1 / (1 + p|x|), with the sign of x.
pub(crate) fn erf_f32<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let ax = g.intrinsic("llvm.fabs", &[x])?;
    let d = fma(g, ax, k(g, x, 0.3275911), k(g, x, 1.0))?;
    let t = op(g, Op::FDiv, k(g, x, 1.0), d)?;
    let mut p = k(g, x, 1.061405429);
    for c in [-1.453152027, 1.421413741, -0.284496736, 0.254829592] {
        p = fma(g, p, t, k(g, x, c))?;
    }
    let p = op(g, Op::FMul, p, t)?;
    let x2 = op(g, Op::FMul, ax, ax)?;
    let nx2 = op(g, Op::FMul, x2, k(g, x, -1.0))?;
    let e = exp_f32(g, nx2)?;
    let y = op(g, Op::FSub, k(g, x, 1.0), op(g, Op::FMul, p, e)?)?;
    g.intrinsic("llvm.copysign", &[y, x])
}

/// An f64 constant shaped like `x`.
fn d<'c>(g: &Gen<'_, 'c>, x: V<'c>, v: f64) -> V<'c> {
    const_like(g.ctx, x, v, Elem::F64)
}

fn and<'c>(g: &Gen<'_, 'c>, a: V<'c>, b: V<'c>) -> Ret<V<'c>> {
    op(g, Op::And, a, b)
}

/// a*b + c as separate operations (no fused rounding), for the polynomials Cephes wrote that way.
fn mul_add<'c>(g: &Gen<'_, 'c>, a: V<'c>, b: V<'c>, c: V<'c>) -> Ret<V<'c>> {
    let p = op(g, Op::FMul, a, b)?;
    op(g, Op::FAdd, p, c)
}

/// The odd polynomial `s + s z p(z)` (z = s^2) that Cephes' asinf uses for |s| <= 0.5.
fn asin_core<'c>(g: &mut Gen<'_, 'c>, s: V<'c>, z: V<'c>) -> Ret<V<'c>> {
    let mut p = k(g, s, 4.2163199048e-2);
    for c in [
        2.4181311049e-2,
        4.5470025998e-2,
        7.4953002686e-2,
        1.6666752422e-1,
    ] {
        p = mul_add(g, p, z, k(g, s, c))?;
    }
    let pz = op(g, Op::FMul, p, z)?;
    mul_add(g, pz, s, s)
}

/// asin x (f32): |x| <= 0.5 by the polynomial; above, asin x = pi/2 - 2 asin(sqrt((1 - |x|) / 2)).
/// |x| > 1 gives NaN (the square root of a negative number).
pub(crate) fn asin_f32<'c>(g: &mut Gen<'_, 'c>, x: V<'c>) -> Ret<V<'c>> {
    let a = g.intrinsic("llvm.fabs", &[x])?;
    let hi = float_cmp(&g.builder, F::OGT, a, k(g, x, 0.5))?;
    let half_rest = op(g, Op::FMul, op(g, Op::FSub, k(g, x, 1.0), a)?, k(g, x, 0.5))?;
    let aa = op(g, Op::FMul, a, a)?;
    let z = select(g, hi, half_rest, aa)?;
    let root = g.intrinsic("llvm.sqrt", &[z])?;
    let s = select(g, hi, root, a)?;
    let r = asin_core(g, s, z)?;
    let twice = op(g, Op::FAdd, r, r)?;
    let far = op(g, Op::FSub, k(g, x, std::f64::consts::FRAC_PI_2), twice)?;
    let r = select(g, hi, far, r)?;
    g.intrinsic("llvm.copysign", &[r, x])
}

/// acos x (f32): pi - 2 asin(sqrt((1 + x) / 2)) below -0.5, 2 asin(sqrt((1 - x) / 2)) above 0.5 (no
/// cancellation near +-1), pi/2 - asin x between.
pub(crate) fn acos_f32<'c>(g: &mut Gen<'_, 'c>, x: V<'c>) -> Ret<V<'c>> {
    let lo = float_cmp(&g.builder, F::OLT, x, k(g, x, -0.5))?;
    let hi = float_cmp(&g.builder, F::OGT, x, k(g, x, 0.5))?;
    let one_plus = op(g, Op::FAdd, k(g, x, 1.0), x)?;
    let one_minus = op(g, Op::FSub, k(g, x, 1.0), x)?;
    let side = select(g, lo, one_plus, one_minus)?;
    let root = g.intrinsic("llvm.sqrt", &[op(g, Op::FMul, side, k(g, x, 0.5))?])?;
    let outer = or(g, lo, hi)?;
    let s = select(g, outer, root, x)?;
    let z = op(g, Op::FMul, s, s)?;
    let c = asin_core(g, s, z)?;
    let twice = op(g, Op::FAdd, c, c)?;
    let below = op(g, Op::FSub, k(g, x, std::f64::consts::PI), twice)?;
    let middle = op(g, Op::FSub, k(g, x, std::f64::consts::FRAC_PI_2), c)?;
    let r = select(g, hi, twice, middle)?;
    select(g, lo, below, r)
}

fn or<'c>(g: &Gen<'_, 'c>, a: V<'c>, b: V<'c>) -> Ret<V<'c>> {
    op(g, Op::Or, a, b)
}

fn not<'c>(g: &Gen<'_, 'c>, a: V<'c>) -> Ret<V<'c>> {
    op(g, Op::Xor, a, const_like(g.ctx, a, 1.0, Elem::Bool))
}

/// atan x (f32), Cephes' atanf: |x| is reduced to |t| <= tan(pi/8) by atan x = pi/2 + atan(-1/x) above
/// tan(3pi/8) and pi/4 + atan((x - 1) / (x + 1)) above tan(pi/8); then an odd polynomial.
pub(crate) fn atan_f32<'c>(g: &mut Gen<'_, 'c>, x: V<'c>) -> Ret<V<'c>> {
    let a = g.intrinsic("llvm.fabs", &[x])?;
    let big = float_cmp(
        &g.builder,
        F::OGT,
        a,
        k(g, x, std::f64::consts::SQRT_2 + 1.0),
    )?;
    let mid = float_cmp(
        &g.builder,
        F::OGT,
        a,
        k(g, x, std::f64::consts::SQRT_2 - 1.0),
    )?;
    let inv = op(g, Op::FDiv, k(g, x, -1.0), a)?;
    let ratio = op(
        g,
        Op::FDiv,
        op(g, Op::FSub, a, k(g, x, 1.0))?,
        op(g, Op::FAdd, a, k(g, x, 1.0))?,
    )?;
    let t = select(g, mid, ratio, a)?;
    let t = select(g, big, inv, t)?;
    let base = select(g, mid, k(g, x, std::f64::consts::FRAC_PI_4), k(g, x, 0.0))?;
    let base = select(g, big, k(g, x, std::f64::consts::FRAC_PI_2), base)?;
    let z = op(g, Op::FMul, t, t)?;
    let mut p = k(g, x, 8.05374449538e-2);
    for c in [-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1] {
        p = mul_add(g, p, z, k(g, x, c))?;
    }
    let pz = op(g, Op::FMul, p, z)?;
    let r = mul_add(g, pz, t, t)?;
    let r = op(g, Op::FAdd, base, r)?;
    g.intrinsic("llvm.copysign", &[r, x])
}

/// e^x (f64): n = round(x / ln2), r = x - n ln2 with ln2 in two parts (n ln2_hi is exact), e^r by its
/// Taylor series to r^13 (|r| <= 0.35: the rest is below 1e-17 relative), times 2^n built as two
/// exponent-bit factors so that subnormal results round once. inf above 709.79, 0 below -745.14.
pub(crate) fn exp_f64<'c>(g: &mut Gen<'_, 'c>, x: V<'c>) -> Ret<V<'c>> {
    let (lo, hi) = (d(g, x, -746.0), d(g, x, 710.0));
    let cx = g.intrinsic("llvm.maxnum", &[x, lo])?;
    let cx = g.intrinsic("llvm.minnum", &[cx, hi])?;
    let n = g.intrinsic(
        "llvm.roundeven",
        &[op(g, Op::FMul, cx, d(g, x, std::f64::consts::LOG2_E))?],
    )?;
    let r = fma(g, n, d(g, x, -LN2_HI), cx)?;
    let r = fma(g, n, d(g, x, -LN2_LO), r)?;
    let mut p = d(g, x, 1.0 / 6_227_020_800.0);
    let mut fact = 6_227_020_800.0_f64;
    for i in (0..13).rev() {
        fact /= f64::from(i + 1);
        p = fma(g, p, r, d(g, x, 1.0 / fact))?;
    }
    // 2^n = 2^n1 2^n2 with n1 = n >> 1: each factor's biased exponent stays in 1..2046.
    let it = shaped(g, x, Elem::I64);
    let ni = g.builder.build_cast(Op::FPToSI, n, it, "n")?;
    let n1 = op(g, Op::AShr, ni, const_like(g.ctx, ni, 1.0, Elem::I64))?;
    let n2 = op(g, Op::Sub, ni, n1)?;
    let mut e = p;
    for m in [n1, n2] {
        let biased = op(g, Op::Add, m, const_like(g.ctx, ni, 1023.0, Elem::I64))?;
        let bits = op(g, Op::Shl, biased, const_like(g.ctx, ni, 52.0, Elem::I64))?;
        let scale = g
            .builder
            .build_cast(Op::BitCast, bits, x.get_type(), "pow2")?;
        e = op(g, Op::FMul, e, scale)?;
    }
    let over = float_cmp(&g.builder, F::OGT, x, d(g, x, 709.782_712_893_384))?;
    let under = float_cmp(&g.builder, F::OLT, x, d(g, x, -745.133_219_101_941_2))?;
    let nan = float_cmp(&g.builder, F::UNO, x, x)?;
    let e = select(g, over, d(g, x, f64::INFINITY), e)?;
    let e = select(g, under, d(g, x, 0.0), e)?;
    select(g, nan, x, e)
}

/// ln x (f64): x = m 2^e with m in [sqrt(1/2), sqrt(2)] (subnormals scaled by 2^54 first), ln m =
/// 2 atanh(s) = 2 (s + s^3/3 + ... + s^19/19) with s = (m - 1) / (m + 1), |s| <= 0.1716; then
/// e ln2_hi + (ln m + e ln2_lo). 0 gives -inf, negatives NaN, inf inf.
pub(crate) fn log_f64<'c>(g: &mut Gen<'_, 'c>, x: V<'c>) -> Ret<V<'c>> {
    let it = shaped(g, x, Elem::I64);
    let tiny = float_cmp(&g.builder, F::OLT, x, d(g, x, f64::MIN_POSITIVE))?;
    let scaled = op(g, Op::FMul, x, d(g, x, 2f64.powi(54)))?;
    let xs = select(g, tiny, scaled, x)?;
    let bits = g.builder.build_cast(Op::BitCast, xs, it, "bits")?;
    let i = |v: i64| const_like(g.ctx, bits, v as f64, Elem::I64);
    let exp_bits = op(g, Op::And, op(g, Op::LShr, bits, i(52))?, i(0x7ff))?;
    let e = op(g, Op::Sub, exp_bits, i(1023))?;
    let shift = select(g, tiny, i(54), i(0))?;
    let e = op(g, Op::Sub, e, shift)?;
    let m_bits = op(
        g,
        Op::Or,
        op(g, Op::And, bits, mask(g, bits, 0x000f_ffff_ffff_ffff))?,
        mask(g, bits, 0x3ff0_0000_0000_0000),
    )?;
    let m = g
        .builder
        .build_cast(Op::BitCast, m_bits, x.get_type(), "m")?;
    let big = float_cmp(&g.builder, F::OGT, m, d(g, x, std::f64::consts::SQRT_2))?;
    let m = select(g, big, op(g, Op::FMul, m, d(g, x, 0.5))?, m)?;
    let big_i = g.builder.build_cast(Op::ZExt, big, it, "big")?;
    let e = op(g, Op::Add, e, big_i)?;
    let f = op(g, Op::FSub, m, d(g, x, 1.0))?;
    let s = op(g, Op::FDiv, f, op(g, Op::FAdd, f, d(g, x, 2.0))?)?;
    let z = op(g, Op::FMul, s, s)?;
    let mut p = d(g, x, 1.0 / 19.0);
    for den in [17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0] {
        p = fma(g, p, z, d(g, x, 1.0 / den))?;
    }
    let two_s = op(g, Op::FAdd, s, s)?;
    let ln_m = op(g, Op::FMul, two_s, p)?;
    let ef = g.builder.build_cast(Op::SIToFP, e, x.get_type(), "e")?;
    let low = fma(g, ef, d(g, x, LN2_LO), ln_m)?;
    let r = fma(g, ef, d(g, x, LN2_HI), low)?;
    let zero = float_cmp(&g.builder, F::OEQ, x, d(g, x, 0.0))?;
    let neg = float_cmp(&g.builder, F::OLT, x, d(g, x, 0.0))?;
    let inf = float_cmp(&g.builder, F::OEQ, x, d(g, x, f64::INFINITY))?;
    let nan = float_cmp(&g.builder, F::UNO, x, x)?;
    let r = select(g, zero, d(g, x, f64::NEG_INFINITY), r)?;
    let r = select(g, neg, d(g, x, f64::NAN), r)?;
    let r = select(g, inf, x, r)?;
    select(g, nan, x, r)
}

/// An i64 bit pattern shaped like `like`.
fn mask<'c>(g: &Gen<'_, 'c>, like: V<'c>, bits: u64) -> V<'c> {
    let c = g.ctx.i64_type().const_int(bits, false);
    match like {
        BasicValueEnum::VectorValue(v) => {
            inkwell::types::VectorType::const_vector(&vec![c; v.get_type().get_size() as usize])
                .into()
        }
        _ => c.into(),
    }
}

/// x^y for f32 or f64 (f32 is computed in f64 and rounded once). An integer exponent below 64 in
/// magnitude is done by repeated squaring (exact whenever the result is representable, as integer
/// powers cast through f64 need); any other by e^(y ln|x|) in f64, with the sign of x for odd integer
/// y. C99's special cases: x^0 = 1 and 1^y = 1 even for NaN, (-1)^(+-inf) = 1, a negative finite x to a
/// non-integer y is NaN.
pub(crate) fn pow<'c>(g: &mut Gen<'_, 'c>, x: V<'c>, y: V<'c>, t: Elem) -> Ret<V<'c>> {
    let (x, y) = if t == Elem::F32 {
        let wide = shaped(g, x, Elem::F64);
        (
            g.builder.build_cast(Op::FPExt, x, wide, "x")?,
            g.builder.build_cast(Op::FPExt, y, wide, "y")?,
        )
    } else {
        (x, y)
    };
    let a = g.intrinsic("llvm.fabs", &[x])?;
    let ay = g.intrinsic("llvm.fabs", &[y])?;
    let ty = g.intrinsic("llvm.trunc", &[y])?;
    let integral = float_cmp(&g.builder, F::OEQ, ty, y)?;
    let half = op(g, Op::FMul, y, d(g, x, 0.5))?;
    let th = g.intrinsic("llvm.trunc", &[half])?;
    let even = float_cmp(&g.builder, F::OEQ, th, half)?;
    let odd = and(g, integral, not(g, even)?)?;
    // Repeated squaring over the six bits of |y| < 64.
    let small = and(
        g,
        integral,
        float_cmp(&g.builder, F::OLT, ay, d(g, x, 64.0))?,
    )?;
    let count = select(g, small, ay, d(g, x, 0.0))?;
    let n = g
        .builder
        .build_cast(Op::FPToSI, count, shaped(g, x, Elem::I64), "n")?;
    let (mut r, mut b) = (d(g, x, 1.0), x);
    for bit in 0..6 {
        let set = op(
            g,
            Op::And,
            op(
                g,
                Op::LShr,
                n,
                const_like(g.ctx, n, f64::from(bit), Elem::I64),
            )?,
            const_like(g.ctx, n, 1.0, Elem::I64),
        )?;
        let set = int_cmp(&g.builder, I::NE, set, const_like(g.ctx, n, 0.0, Elem::I64))?;
        let rb = op(g, Op::FMul, r, b)?;
        r = select(g, set, rb, r)?;
        b = op(g, Op::FMul, b, b)?;
    }
    let negative_y = float_cmp(&g.builder, F::OLT, y, d(g, x, 0.0))?;
    let recip = op(g, Op::FDiv, d(g, x, 1.0), r)?;
    let squared = select(g, negative_y, recip, r)?;
    // The general case.
    let l = log_f64(g, a)?;
    let e = exp_f64(g, op(g, Op::FMul, y, l)?)?;
    let sign = select(g, odd, x, d(g, x, 1.0))?;
    let e = g.intrinsic("llvm.copysign", &[e, sign])?;
    let neg_finite = and(
        g,
        float_cmp(&g.builder, F::OLT, x, d(g, x, 0.0))?,
        float_cmp(&g.builder, F::OGT, x, d(g, x, f64::NEG_INFINITY))?,
    )?;
    let not_integral = not(g, integral)?;
    let e = select(g, and(g, neg_finite, not_integral)?, d(g, x, f64::NAN), e)?;
    let unit_inf = and(
        g,
        float_cmp(&g.builder, F::OEQ, a, d(g, x, 1.0))?,
        float_cmp(&g.builder, F::OEQ, ay, d(g, x, f64::INFINITY))?,
    )?;
    let e = select(g, unit_inf, d(g, x, 1.0), e)?;
    let r = select(g, small, squared, e)?;
    let one = or(
        g,
        float_cmp(&g.builder, F::OEQ, x, d(g, x, 1.0))?,
        float_cmp(&g.builder, F::OEQ, y, d(g, x, 0.0))?,
    )?;
    let r = select(g, one, d(g, x, 1.0), r)?;
    if t == Elem::F32 {
        let narrow = shaped(g, r, Elem::F32);
        return Ok(g.builder.build_cast(Op::FPTrunc, r, narrow, "pow")?);
    }
    Ok(r)
}
