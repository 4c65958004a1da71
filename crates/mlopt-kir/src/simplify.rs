//! Index simplification with loop ranges. A reshape re-linearises and re-splits an index, so a chain
//! of reshapes leaves `((i * 3 + j) * 49 + k) / 147`-style expressions that hide an affine access from
//! the vectoriser (every vector load becomes a gather). Knowing each loop variable's range, a division
//! `x / c` whose `x` splits into a multiple of `c` plus a remainder provably in `0..c` is that
//! multiple over `c`, and `x % c` is the remainder; applied bottom-up, the chains collapse back to
//! the loop variables.

use crate::ir::*;
use std::collections::HashMap;

/// The extent of each loop variable of `k` (a variable reused by sequential loops keeps the larger, so
/// the range is a bound on every use).
pub fn loop_extents(k: &Kernel) -> HashMap<Var, u64> {
    let mut out = HashMap::new();
    add_loop_extents(&k.body, &mut out);
    out
}

/// Adds the extent of each loop in `body` to `out`, keeping the larger for a variable seen before.
pub fn add_loop_extents(body: &[Stmt], out: &mut HashMap<Var, u64>) {
    for s in body {
        match s {
            Stmt::For {
                var, extent, body, ..
            } => {
                let e = out.entry(*var).or_insert(*extent);
                *e = (*e).max(*extent);
                add_loop_extents(body, out);
            }
            Stmt::If { then, .. } => add_loop_extents(then, out),
            _ => {}
        }
    }
}

/// Simplifies every index expression of `k` with its loop ranges, rounds each clamped narrow value once
/// (see `round_once`) and drops the integer round trip of a fake-quantized value (`quantized_once`).
pub fn simplify_kernel(k: &mut Kernel) {
    let ranges = loop_extents(k);
    let body: Vec<Stmt> = k
        .body
        .iter()
        .map(|s| s.map_exprs(&|e| quantized_once(&round_once(&simplify(e, &ranges), k), k)))
        .collect();
    k.body = body;
}

/// `cast<T>(g(cast<f32>(cast<T>(x))))` with `x` in f32, `T` bf16 or f16 and `g` a chain of min/max with
/// constants exact in `T` (a ReLU, a ReLU6, a clip): `cast<T>(g(x))`. A bf16 convolution followed by a bf16
/// clip writes the first form (the convolution rounds its output, the clip widens, clamps and narrows
/// again), and each rounding is about eight vector instructions in the epilogue. The two are equal:
/// rounding R to nearest is monotone and keeps values of T, so R(max(a, c)) = max(R(a), c) for c in T,
/// and by induction R(g(R(x))) = g(R(x)) = R(g(x)); NaNs pass through both unchanged. (Only a zero's
/// sign may differ, where max(-0, 0) picks -0: a value that rounds to -0 in T.)
pub fn round_once(e: &Expr, k: &Kernel) -> Expr {
    bottom_up(e, &|e| {
        let Expr::Cast(t @ (Elem::BF16 | Elem::F16), inner) = &e else {
            return e;
        };
        match unclamp(inner, *t, k) {
            Some(g) => Expr::cast(*t, g),
            None => e,
        }
    })
}

/// `e` rebuilt bottom-up with `f` applied to each node after its operands.
fn bottom_up(e: &Expr, f: &dyn Fn(Expr) -> Expr) -> Expr {
    let r = |x: &Expr| bottom_up(x, f);
    f(match e {
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => e.clone(),
        Expr::Load(b, ix) => Expr::Load(*b, ix.iter().map(r).collect()),
        Expr::Unary(o, a) => Expr::un(*o, r(a)),
        Expr::Binary(o, a, b) => Expr::bin(*o, r(a), r(b)),
        Expr::Fma(a, b, c) => Expr::fma(r(a), r(b), r(c)),
        Expr::Select(c, a, b) => Expr::select(r(c), r(a), r(b)),
        Expr::Cast(t, a) => Expr::cast(*t, r(a)),
    })
}

/// `cast<F>(cast<T>(min(max(r, 0), hi)))` with `r` integer-valued in float type F, integer T and a whole
/// `hi` that T and F both hold exactly: `atmost(atleast(r, 0), hi)`. It is a QuantizeLinear followed by
/// a DequantizeLinear (u8, or i8 from a ReLU), in every epilogue of a QDQ model. The two are equal: on
/// numbers the casts return what the clamp gives (+0 for -0 too), and a NaN, which the clamp passes and
/// the cast turns into 0, fails `r > 0` and is 0 (infinities clamp to the bounds in both). These are one
/// `maxps` and one `minps` on x86, where the clamp's NaN-propagating bounds and the two conversions took
/// nine instructions a vector.
pub fn quantized_once(e: &Expr, k: &Kernel) -> Expr {
    bottom_up(e, &|e| unquantize(e, k))
}

/// `quantized_once` on one node whose operands are done.
fn unquantize(e: Expr, k: &Kernel) -> Expr {
    let Expr::Cast(f @ (Elem::F32 | Elem::F64), narrow) = &e else {
        return e;
    };
    let Expr::Cast(t, clamped) = &**narrow else {
        return e;
    };
    if t.is_float() || *t == Elem::Bool || clamped.elem(k) != *f {
        return e;
    }
    let Expr::Binary(BinOp::Min, low, top) = &**clamped else {
        return e;
    };
    let (Expr::Binary(BinOp::Max, x, zero), Expr::Float(hi, _)) = (&**low, &**top) else {
        return e;
    };
    let most = match t {
        Elem::U8 => u8::MAX as f64,
        Elem::I8 => i8::MAX as f64,
        Elem::U16 => u16::MAX as f64,
        Elem::I16 => i16::MAX as f64,
        _ => (1u64 << 24) as f64,
    };
    let whole = **zero == Expr::Float(0.0, *f) && hi.fract() == 0.0 && (0.0..=most).contains(hi);
    if !whole || !integral(x, k) {
        return e;
    }
    Expr::bin(
        BinOp::AtMost,
        Expr::bin(BinOp::AtLeast, (**x).clone(), Expr::Float(0.0, *f)),
        Expr::Float(*hi, *f),
    )
}

/// Whether every value of `e` is a whole number, an infinity or NaN: rounded, converted from an integer,
/// a whole constant, or a sum or difference of such.
fn integral(e: &Expr, k: &Kernel) -> bool {
    match e {
        Expr::Unary(UnOp::Round | UnOp::Floor | UnOp::Ceil, _) => true,
        Expr::Float(v, _) => v.fract() == 0.0,
        Expr::Cast(_, a) => !a.elem(k).is_float(),
        Expr::Binary(BinOp::Add | BinOp::Sub, a, b) => integral(a, k) && integral(b, k),
        _ => false,
    }
}

/// `g(x)` for `g(cast<f32>(cast<t>(x)))` as `round_once` describes, else None.
fn unclamp(e: &Expr, t: Elem, k: &Kernel) -> Option<Expr> {
    let exact = |c: f64| {
        let c = c as f32;
        match t {
            Elem::BF16 => crate::interp::bf16_from_f32(c).to_f32() == c,
            _ => half::f16::from_f32(c).to_f32() == c,
        }
    };
    match e {
        Expr::Cast(Elem::F32, a) => match &**a {
            Expr::Cast(t2, x) if *t2 == t && x.elem(k) == Elem::F32 => Some((**x).clone()),
            _ => None,
        },
        Expr::Binary(op @ (BinOp::Min | BinOp::Max), a, b) => match (&**a, &**b) {
            (x, c @ Expr::Float(v, Elem::F32)) if exact(*v) => {
                Some(Expr::bin(*op, unclamp(x, t, k)?, c.clone()))
            }
            (c @ Expr::Float(v, Elem::F32), x) if exact(*v) => {
                Some(Expr::bin(*op, c.clone(), unclamp(x, t, k)?))
            }
            _ => None,
        },
        _ => None,
    }
}

/// The interval of an integer expression, when the ranges bound it.
pub(crate) fn interval(e: &Expr, r: &HashMap<Var, u64>) -> Option<(i64, i64)> {
    Some(match e {
        Expr::Int(v) => (*v, *v),
        Expr::Var(v) => (0, i64::try_from(*r.get(v)?).ok()?.checked_sub(1)?),
        Expr::Binary(op, a, b) => {
            let ((al, ah), (bl, bh)) = (interval(a, r)?, interval(b, r)?);
            match op {
                BinOp::Add => (al.checked_add(bl)?, ah.checked_add(bh)?),
                BinOp::Sub => (al.checked_sub(bh)?, ah.checked_sub(bl)?),
                BinOp::Mul => {
                    let p = [
                        al.checked_mul(bl)?,
                        al.checked_mul(bh)?,
                        ah.checked_mul(bl)?,
                        ah.checked_mul(bh)?,
                    ];
                    (*p.iter().min()?, *p.iter().max()?)
                }
                BinOp::Div if bl == bh && bl > 0 && al >= 0 => (al / bl, ah / bl),
                BinOp::Rem if bl == bh && bl > 0 && al >= 0 => (0, ah.min(bl - 1)),
                BinOp::Min => (al.min(bl), ah.min(bh)),
                BinOp::Max => (al.max(bl), ah.max(bh)),
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// `e` as a constant plus coefficient x atom terms (an atom: anything but +, - and a product with a
/// constant). None on overflow.
pub(crate) fn terms(
    e: &Expr,
    scale: i64,
    out: &mut Vec<(Expr, i64)>,
    constant: &mut i64,
) -> Option<()> {
    match e {
        Expr::Int(v) => *constant = constant.checked_add(scale.checked_mul(*v)?)?,
        Expr::Binary(BinOp::Add, a, b) => {
            terms(a, scale, out, constant)?;
            terms(b, scale, out, constant)?;
        }
        Expr::Binary(BinOp::Sub, a, b) => {
            terms(a, scale, out, constant)?;
            terms(b, scale.checked_neg()?, out, constant)?;
        }
        Expr::Binary(BinOp::Mul, a, b)
            if matches!(**b, Expr::Int(_)) || matches!(**a, Expr::Int(_)) =>
        {
            let (k, x) = match (&**a, &**b) {
                (Expr::Int(k), x) => (*k, x),
                (x, Expr::Int(k)) => (*k, x),
                _ => return None,
            };
            terms(x, scale.checked_mul(k)?, out, constant)?;
        }
        atom => match out.iter_mut().find(|(x, _)| x == atom) {
            Some((_, c)) => *c = c.checked_add(scale)?,
            None => out.push((atom.clone(), scale)),
        },
    }
    Some(())
}

/// The sum of `terms` and `constant`, built with the folding constructors.
pub(crate) fn build(terms: &[(Expr, i64)], constant: i64) -> Expr {
    let sum = terms
        .iter()
        .filter(|(_, c)| *c != 0)
        .fold(Expr::int(0), |acc, (x, c)| {
            Expr::add(acc, Expr::mul(x.clone(), Expr::int(*c)))
        });
    Expr::add(sum, Expr::int(constant))
}

/// `x / c` (`div`) or `x % c` with `x` >= 0 split as H + L, H a multiple of c and L in 0..c: H / c, or L;
/// with L >= 0 not below c, H / c + L / c, or L % c. Else, with c = f k, f dividing H's coefficients and L in 0..f: (H / f) / k, or f ((H / f) % k) + L (a
/// position flattened with its innermost axis and divided by a multiple of that axis's length,
/// `((w * 49 + r) * 96 + ch) / 37632` with ch < 96, is `w / 8`: the axis leaves the quotient).
fn divide(x: &Expr, c: i64, div: bool, r: &HashMap<Var, u64>) -> Option<Expr> {
    if interval(x, r)?.0 < 0 {
        return None;
    }
    let (mut ts, mut constant) = (Vec::new(), 0i64);
    terms(x, 1, &mut ts, &mut constant)?;
    if let Some((h, l)) = split(&ts, constant, c, r) {
        return Some(if div { h } else { l });
    }
    // H a multiple of c and L >= 0 however large: (H + L) / c = H / c + L / c, (H + L) % c = L % c.
    let (high, low): (Vec<_>, Vec<_>) = ts.iter().cloned().partition(|(_, k)| k % c == 0);
    if !high.is_empty() && constant == 0 && interval(&build(&low, 0), r)?.0 >= 0 {
        let l = simplify_binary(
            if div { BinOp::Div } else { BinOp::Rem },
            build(&low, 0),
            Expr::int(c),
            r,
        );
        return Some(if div {
            let h: Vec<(Expr, i64)> = high.into_iter().map(|(x, k)| (x, k / c)).collect();
            Expr::add(build(&h, 0), l)
        } else {
            l
        });
    }
    // The largest factor of c below it that splits x.
    let mut factors: Vec<i64> = ts
        .iter()
        .map(|(_, k)| crate::analysis::gcd(k.abs(), c))
        .filter(|f| *f > 1 && *f < c)
        .collect();
    factors.sort_unstable();
    factors.dedup();
    let (f, h, l) = factors
        .into_iter()
        .rev()
        .find_map(|f| split(&ts, constant, f, r).map(|(h, l)| (f, h, l)))?;
    Some(if div {
        simplify_binary(BinOp::Div, h, Expr::int(c / f), r)
    } else {
        let rem = simplify_binary(BinOp::Rem, h, Expr::int(c / f), r);
        Expr::add(Expr::mul(rem, Expr::int(f)), l)
    })
}

/// The sum of `ts` and `constant` as H + L, H a multiple of c and L in 0..c: (H / c, L).
fn split(ts: &[(Expr, i64)], constant: i64, c: i64, r: &HashMap<Var, u64>) -> Option<(Expr, Expr)> {
    let (high, low): (Vec<_>, Vec<_>) = ts.iter().cloned().partition(|(_, k)| k % c == 0);
    let (low_const, high_const) = (constant.rem_euclid(c), constant - constant.rem_euclid(c));
    let low_e = build(&low, low_const);
    let (lo, hi) = interval(&low_e, r)?;
    if lo < 0 || hi >= c {
        return None;
    }
    let h: Vec<(Expr, i64)> = high.into_iter().map(|(x, k)| (x, k / c)).collect();
    Some((build(&h, high_const / c), low_e))
}

/// `op(a, b)` for operands already simplified under the ranges `r`: a division or remainder by a
/// constant resolved where the ranges allow it (`divide`), else the node rebuilt with constant folding.
pub(crate) fn simplify_binary(op: BinOp, a: Expr, b: Expr, r: &HashMap<Var, u64>) -> Expr {
    if let (BinOp::Div | BinOp::Rem, Expr::Int(c)) = (op, &b) {
        if *c > 0 {
            if let Some(s) = divide(&a, *c, op == BinOp::Div, r) {
                return s;
            }
        }
    }
    rebuild_bin(op, a, b)
}

/// `e` with its index arithmetic simplified bottom-up under the loop ranges `r`.
pub fn simplify(e: &Expr, r: &HashMap<Var, u64>) -> Expr {
    match e {
        Expr::Binary(op, a, b) => simplify_binary(*op, simplify(a, r), simplify(b, r), r),
        Expr::Load(buf, ix) => Expr::Load(*buf, ix.iter().map(|x| simplify(x, r)).collect()),
        Expr::Unary(o, a) => Expr::un(*o, simplify(a, r)),
        Expr::Cast(t, a) => Expr::cast(*t, simplify(a, r)),
        Expr::Fma(a, b, c) => Expr::fma(simplify(a, r), simplify(b, r), simplify(c, r)),
        Expr::Select(c, a, b) => Expr::select(simplify(c, r), simplify(a, r), simplify(b, r)),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => e.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_chains_collapse_to_the_loop_variables() {
        let mut k = Kernel::new("t");
        let (i, j, m) = (k.var("i"), k.var("j"), k.var("m"));
        let r: HashMap<Var, u64> = [(i, 64), (j, 3), (m, 49)].into_iter().collect();
        let flat = Expr::add(
            Expr::mul(
                Expr::add(Expr::mul(Expr::var(i), Expr::int(3)), Expr::var(j)),
                Expr::int(49),
            ),
            Expr::var(m),
        );
        assert_eq!(
            simplify(&Expr::div(flat.clone(), Expr::int(147)), &r),
            Expr::var(i)
        );
        assert_eq!(
            simplify(
                &Expr::rem(Expr::div(flat.clone(), Expr::int(49)), Expr::int(3)),
                &r
            ),
            Expr::var(j)
        );
        assert_eq!(
            simplify(&Expr::rem(flat.clone(), Expr::int(49)), &r),
            Expr::var(m)
        );
        // m + 1 may reach 49: not provably below the divisor, so it stays.
        let shifted = Expr::add(Expr::var(m), Expr::int(1));
        let e = Expr::div(shifted.clone(), Expr::int(49));
        assert_eq!(simplify(&e, &r), e);
        // A variable without a known range stays too.
        let free = k.var("free");
        let e = Expr::div(Expr::var(free), Expr::int(7));
        assert_eq!(simplify(&e, &r), e);
    }
}

#[cfg(test)]
mod round_once_tests {
    use super::*;

    /// A bf16 convolution's ReLU6 epilogue: the clamp moves inside the one rounding, and the result is the
    /// same as rounding twice for every f32 the test draws (edges, both bounds' neighbours, NaN, infinities,
    /// overflow to infinity, subnormals).
    #[test]
    fn a_clamped_narrow_value_is_rounded_once_with_the_same_result() {
        let mut k = Kernel::new("t");
        let acc = k.buf("acc", Elem::F32, vec![4], Space::Global);
        let x = Expr::load(acc, vec![Expr::int(0)]);
        let clip = |v: Expr, lo: f64, hi: f64| {
            Expr::bin(
                BinOp::Min,
                Expr::bin(BinOp::Max, v, Expr::f32(lo)),
                Expr::f32(hi),
            )
        };
        let twice = |t| {
            Expr::cast(
                t,
                clip(Expr::cast(Elem::F32, Expr::cast(t, x.clone())), 0.0, 6.0),
            )
        };
        for t in [Elem::BF16, Elem::F16] {
            assert_eq!(
                round_once(&twice(t), &k),
                Expr::cast(t, clip(x.clone(), 0.0, 6.0))
            );
        }
        // A bound that bf16 cannot hold exactly (0.1) keeps both roundings: they can differ.
        let inexact = Expr::cast(
            Elem::BF16,
            clip(
                Expr::cast(Elem::F32, Expr::cast(Elem::BF16, x.clone())),
                0.0,
                0.1,
            ),
        );
        assert_eq!(round_once(&inexact, &k), inexact);
        // A widening of some other value (an f32 load, not a narrowed one) is not touched.
        let plain = Expr::cast(Elem::BF16, clip(x.clone(), 0.0, 6.0));
        assert_eq!(round_once(&plain, &k), plain);

        // The identity, value by value, under mlopt's rounding (the interpreters' and the code's).
        let r = |v: f32| crate::interp::bf16_from_f32(v).to_f32();
        let g = |v: f32| v.clamp(0.0, 6.0);
        let mut draws: Vec<f32> = vec![
            0.0,
            -0.0,
            6.0,
            5.99,
            6.01,
            1e-40,
            -1e-40,
            3.4e38,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0 + f32::EPSILON,
            5.984375,
            6.03125,
        ];
        draws.extend([6.0f32, 0.0, 1.0].iter().flat_map(|c| {
            (-300i32..300).map(move |d| f32::from_bits((c.to_bits() as i32 + d * 97) as u32))
        }));
        let mut seed = 0x9e37_79b9_u32;
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            draws.push(f32::from_bits(seed));
        }
        for v in draws {
            let to = crate::interp::bf16_from_f32;
            let (a, b) = (to(g(r(v))), to(g(v)));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || a == b,
                "{v:e}: twice {a} once {b}"
            );
        }
    }
}
