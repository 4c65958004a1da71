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
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !got.dtype().is_float();
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
    if let Some((i, a, b)) = first_bad {
        detail += &format!(
            "; {bad} of {} values off, first at {i}: got {a} expected {b}",
            g.len()
        );
    }
    Comparison {
        pass: bad == 0,
        detail,
    }
}
