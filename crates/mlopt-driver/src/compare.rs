//! Output comparison for `check`. At full precision numpy's `assert_allclose` rule: every element
//! within `atol + rtol * |want|`. At low precision (`--precision bf16|fp16|auto`) the measure
//! `--tolerance` means everywhere: the largest difference over the output's largest magnitude (at
//! least 1), the one `--precision auto` accepts a plan by (`mlopt_rewrite::optimize::scaled_error`).
//! Either way NaN matches NaN, infinities match exactly, and integers and booleans must be equal;
//! every line shows both measures.

use mlopt_ir::Tensor;
use std::fmt;

#[derive(Debug)]
pub struct Comparison {
    pub pass: bool,
    pub detail: String,
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            if self.pass { "ok" } else { "MISMATCH" },
            self.detail
        )
    }
}

/// What an output must meet.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Every element within atol + rtol * |want|.
    AllClose { rtol: f64, atol: f64 },
    /// The scaled error (largest difference over the output's largest magnitude, at least 1) within.
    Scaled(f64),
}

pub fn compare(got: &Tensor, want: &Tensor, rule: Rule) -> Comparison {
    let (rtol, atol, tolerance) = match rule {
        Rule::AllClose { rtol, atol } => (rtol, atol, None),
        Rule::Scaled(t) => (0.0, f64::INFINITY, Some(t)),
    };
    if got.ty() != want.ty() {
        return Comparison {
            pass: false,
            detail: format!("type {} but expected {}", got.ty(), want.ty()),
        };
    }
    let exact = !got.dtype().is_float();
    if exact {
        return compare_exact(got, want);
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let (mut worst_abs, mut worst_rel, mut bad, mut first_bad) = (0f64, 0f64, 0usize, None);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a == b;
        let diff = (a - b).abs();
        let ok = same || (!exact && diff.is_finite() && diff <= atol + rtol * b.abs());
        if !same && diff.is_finite() {
            worst_abs = worst_abs.max(diff);
            if b != 0.0 {
                worst_rel = worst_rel.max(diff / b.abs());
            }
        }
        if !ok {
            bad += 1;
            first_bad.get_or_insert((i, a, b));
        }
    }
    let scaled = mlopt_rewrite::optimize::scaled_error(want, got);
    let mut detail = format!(
        "{} max abs err {worst_abs:.3e}, max rel err {worst_rel:.3e}, scaled err {scaled:.3e}",
        got.ty()
    );
    if let Some(t) = tolerance.filter(|_| !exact) {
        detail += &format!(" (tolerance {t:.1e})");
        if scaled > t {
            bad = bad.max(1);
            first_bad = None;
        }
    }
    verdict(detail, bad, g.len(), first_bad)
}

/// The comparison of `n` values of which `bad` are off, `first_bad` the first (index, got, expected)
/// where it is to be shown, `detail` the measures.
fn verdict(
    mut detail: String,
    bad: usize,
    n: usize,
    first_bad: Option<(usize, impl fmt::Display, impl fmt::Display)>,
) -> Comparison {
    if let Some((i, a, b)) = first_bad {
        detail += &format!("; {bad} of {n} values off, first at {i}: got {a} expected {b}");
    }
    Comparison {
        pass: bad == 0,
        detail,
    }
}

/// Integers and booleans: every value equal, compared as integers (through f64, int64 values past 2^53
/// that differ by one compared equal).
fn compare_exact(got: &Tensor, want: &Tensor) -> Comparison {
    let (g, w) = (got.to_i64_vec(), want.to_i64_vec());
    let (mut worst, mut bad, mut first_bad) = (0u128, 0usize, None);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        if a != b {
            worst = worst.max((i128::from(a) - i128::from(b)).unsigned_abs());
            bad += 1;
            first_bad.get_or_insert((i, a, b));
        }
    }
    let detail = format!("{} max abs err {worst}, compared exactly", got.ty());
    verdict(detail, bad, g.len(), first_bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// int64 values past 2^53 that differ by one are the same f64; compared exactly they mismatch.
    #[test]
    fn integers_compare_exactly() {
        let big = (1i64 << 53) + 1;
        let t = |v: i64| Tensor::from_vec(&[2], vec![7i64, v]).unwrap();
        let rule = Rule::AllClose {
            rtol: 1e-3,
            atol: 1e-3,
        };
        assert!(compare(&t(big), &t(big), rule).pass);
        let off = compare(&t(big), &t(big - 1), rule);
        assert!(!off.pass, "{off}");
        assert!(
            off.detail
                .contains("got 9007199254740993 expected 9007199254740992"),
            "{off}"
        );
        assert!(!compare(&t(big), &t(big - 1), Rule::Scaled(1.0)).pass);
        assert!(!compare(&t(i64::MIN), &t(i64::MAX), rule).pass);
    }
}
