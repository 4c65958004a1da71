//! GridSample over any number of spatial axes, as ONNX's reference defines it: normalised coordinates are
//! denormalised per axis, out-of-range coordinates are clamped or reflected by the padding mode, and the
//! output is the tensor product of per-axis taps (1 for nearest, 2 for linear, 4 for cubic), each tap's
//! index mapped by the padding mode (zeros: no contribution).

use super::linalg::for_each_index;
use super::EvalResult;
use crate::op::{GridPadding, ResizeMode};
use crate::tensor::Tensor;

/// Reflects `x` into [lo, hi].
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let span = hi - lo;
    if span <= 0.0 {
        return lo;
    }
    let (d, from_lo) = if x < lo {
        (lo - x, true)
    } else if x > hi {
        (x - hi, false)
    } else {
        return x;
    };
    let n = (d / span).floor();
    let r = d - n * span;
    let even = (n as i64) % 2 == 0;
    match (from_lo, even) {
        (true, true) | (false, false) => lo + r,
        _ => hi - r,
    }
}

/// Weights of the taps at floor - 1 .. floor + 2 for fractional offset `t`.
fn cubic_coeffs(t: f64) -> [f64; 4] {
    let c = |x: f64| super::resize::cubic(x, -0.75);
    [c(t + 1.0), c(t), c(1.0 - t), c(2.0 - t)]
}

pub(crate) fn grid_sample(
    x: &Tensor,
    grid: &Tensor,
    mode: ResizeMode,
    padding: GridPadding,
    align: bool,
) -> EvalResult<Tensor> {
    let xs = x.shape().to_vec();
    let gs = grid.shape().to_vec();
    let sp = xs.len() - 2;
    let dims = &xs[2..];
    let outs = &gs[1..gs.len() - 1];
    let oplane: usize = outs.iter().product();
    let plane: usize = dims.iter().product();
    let data = x.to_f64_vec();
    let g = grid.to_f64_vec();
    let borders: Vec<(f64, f64)> = dims
        .iter()
        .map(|&d| {
            if align {
                (0.0, d as f64 - 1.0)
            } else {
                (-0.5, d as f64 - 0.5)
            }
        })
        .collect();
    let mut out = vec![0.0; xs[0] * xs[1] * oplane];
    let mut taps: Vec<Vec<(Option<usize>, f64)>> = vec![vec![]; sp];
    for n in 0..xs[0] {
        for o in 0..oplane {
            let at = (n * oplane + o) * sp;
            for i in 0..sp {
                // The grid's last axis lists coordinates innermost axis first.
                let v = g[at + sp - 1 - i];
                let d = dims[i] as f64;
                let mut c = if align {
                    (v + 1.0) / 2.0 * (d - 1.0)
                } else {
                    ((v + 1.0) * d - 1.0) / 2.0
                };
                if mode == ResizeMode::Nearest {
                    c = c.round_ties_even();
                }
                let (lo, hi) = borders[i];
                if c < lo || c > hi {
                    c = match padding {
                        GridPadding::Border => c.clamp(0.0, d - 1.0),
                        GridPadding::Reflection => reflect(c, lo, hi),
                        GridPadding::Zeros => c,
                    };
                }
                let index = |k: i64| -> Option<usize> {
                    let n = dims[i] as i64;
                    match padding {
                        GridPadding::Zeros => (0..n).contains(&k).then_some(k as usize),
                        GridPadding::Border => Some(k.clamp(0, n - 1) as usize),
                        GridPadding::Reflection => {
                            Some((reflect(k as f64, lo, hi) as i64).clamp(0, n - 1) as usize)
                        }
                    }
                };
                let base = c.floor();
                let t = c - base;
                let b = base as i64;
                taps[i] = match mode {
                    ResizeMode::Nearest => vec![(index(c as i64), 1.0)],
                    ResizeMode::Linear => vec![(index(b), 1.0 - t), (index(b + 1), t)],
                    ResizeMode::Cubic => {
                        let w = cubic_coeffs(t);
                        (0..4).map(|k| (index(b - 1 + k as i64), w[k])).collect()
                    }
                };
            }
            let counts: Vec<usize> = taps.iter().map(Vec::len).collect();
            for ch in 0..xs[1] {
                let base = (n * xs[1] + ch) * plane;
                let mut acc = 0.0;
                for_each_index(&counts, |k| {
                    let (mut off, mut w) = (0usize, 1.0);
                    for i in 0..sp {
                        match taps[i][k[i]] {
                            (Some(p), wt) => {
                                off = off * dims[i] + p;
                                w *= wt;
                            }
                            (None, _) => return,
                        }
                    }
                    acc += w * data[base + off];
                });
                out[(n * xs[1] + ch) * oplane + o] = acc;
            }
        }
    }
    let mut shape = xs[..2].to_vec();
    shape.extend_from_slice(outs);
    Ok(Tensor::from_vec(&shape, out)
        .ok_or("grid_sample shape")?
        .cast(x.dtype()))
}
