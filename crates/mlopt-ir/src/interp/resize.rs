//! Resize, as one 1-D resample per axis (all ONNX modes are separable). For each output position along an
//! axis, `taps` lists the input positions it reads and their weights; out-of-range taps clamp to the edge,
//! as in ONNX's reference, except where `exclude_outside` drops them.

use super::EvalResult;
use crate::op::{CoordMode, NearestMode, ResizeAttrs, ResizeMode};
use crate::tensor::Tensor;

/// Maps output coordinate `x` of one axis to the input coordinate, or `None` when it falls outside the
/// crop box of `tf_crop_and_resize` (the output then takes the extrapolation value).
fn source_coord(r: &ResizeAttrs, axis: usize, x: usize, n_in: usize, n_out: usize) -> Option<f64> {
    let (x, fin, fout, scale) = (x as f64, n_in as f64, n_out as f64, r.scales[axis] as f64);
    let v = match r.coord {
        CoordMode::HalfPixel => (x + 0.5) / scale - 0.5,
        CoordMode::HalfPixelSymmetric => {
            let adjustment = fout / (scale * fin);
            let center = fin / 2.0;
            center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5
        }
        CoordMode::PytorchHalfPixel => {
            if n_out > 1 {
                (x + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        CoordMode::AlignCorners => {
            // ONNX takes length_resized as the unrounded input length times scale.
            let resized = fin * scale;
            if n_out == 1 || resized == 1.0 {
                0.0
            } else {
                x * (fin - 1.0) / (resized - 1.0)
            }
        }
        CoordMode::Asymmetric => x / scale,
        CoordMode::TfCropAndResize => {
            let rank = r.scales.len();
            let (start, end) = (r.roi[axis] as f64, r.roi[axis + rank] as f64);
            let v = if n_out > 1 {
                start * (fin - 1.0) + x * (end - start) * (fin - 1.0) / (fout - 1.0)
            } else {
                0.5 * (start + end) * (fin - 1.0)
            };
            if v < 0.0 || v > fin - 1.0 {
                return None;
            }
            v
        }
    };
    Some(v)
}

fn nearest(x: f64, mode: NearestMode) -> f64 {
    let half = x - x.floor() == 0.5;
    match mode {
        NearestMode::RoundPreferFloor if half => x.floor(),
        NearestMode::RoundPreferCeil if half => x.ceil(),
        NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => x.round(),
        NearestMode::Floor => x.floor(),
        NearestMode::Ceil => x.ceil(),
    }
}

/// Keys' cubic convolution kernel with coefficient `a` (ONNX uses -0.75 by default).
pub(crate) fn cubic(x: f64, a: f64) -> f64 {
    let x = x.abs();
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

/// The input positions and weights one output position of an axis reads; None: the extrapolation value.
pub type Taps = Option<Vec<(usize, f64)>>;

/// Resize's taps along `axis` (n_in -> n_out positions): what the interpreter sums, and what compiled
/// code tabulates at compile time.
pub fn axis_taps(r: &ResizeAttrs, axis: usize, n_in: usize, n_out: usize) -> Vec<Taps> {
    let last = n_in as i64 - 1;
    let clamp = |i: i64| i.clamp(0, last) as usize;
    (0..n_out)
        .map(|o| {
            let x = source_coord(r, axis, o, n_in, n_out)?;
            if r.mode == ResizeMode::Nearest {
                return Some(vec![(clamp(nearest(x, r.nearest) as i64), 1.0)]);
            }
            let (radius, f): (f64, Box<dyn Fn(f64) -> f64>) = match r.mode {
                ResizeMode::Linear => (1.0, Box::new(|t: f64| (1.0 - t.abs()).max(0.0))),
                _ => {
                    let a = r.cubic_coeff_a as f64;
                    (2.0, Box::new(move |t| cubic(t, a)))
                }
            };
            let s = if r.antialias {
                (r.scales[axis] as f64).min(1.0)
            } else {
                1.0
            };
            let x0 = x.floor();
            let ratio = x - x0;
            let start = (-radius / s).floor() as i64 + 1;
            let mut taps: Vec<(i64, f64)> = (start..=1 - start)
                .map(|i| (x0 as i64 + i, f(s * (i as f64 - ratio))))
                .collect();
            if r.exclude_outside {
                for (i, w) in &mut taps {
                    if *i < 0 || *i > last {
                        *w = 0.0;
                    }
                }
            }
            if r.antialias || r.exclude_outside {
                let sum: f64 = taps.iter().map(|(_, w)| w).sum();
                if sum != 0.0 {
                    for (_, w) in &mut taps {
                        *w /= sum;
                    }
                }
            }
            Some(taps.into_iter().map(|(i, w)| (clamp(i), w)).collect())
        })
        .collect()
}

fn resample_axis(
    data: &[f64],
    shape: &[usize],
    d: usize,
    taps: &[Taps],
    extrapolation: f64,
) -> Vec<f64> {
    let outer: usize = shape[..d].iter().product();
    let inner: usize = shape[d + 1..].iter().product();
    let n_in = shape[d];
    let mut out = vec![0.0; outer * taps.len() * inner];
    for po in 0..outer {
        for (o, t) in taps.iter().enumerate() {
            let dst = (po * taps.len() + o) * inner;
            for i in 0..inner {
                out[dst + i] = match t {
                    None => extrapolation,
                    Some(t) => t
                        .iter()
                        .map(|&(s, w)| w * data[(po * n_in + s) * inner + i])
                        .sum(),
                };
            }
        }
    }
    out
}

pub(crate) fn resize(x: &Tensor, r: &ResizeAttrs) -> EvalResult<Tensor> {
    let mut shape = x.shape().to_vec();
    if shape.contains(&0) {
        return Err("cannot resize an empty tensor".into());
    }
    let mut data = x.to_f64_vec();
    for d in 0..shape.len() {
        let identity =
            shape[d] == r.sizes[d] && r.scales[d] == 1.0 && r.coord != CoordMode::TfCropAndResize;
        if identity {
            continue;
        }
        let taps = axis_taps(r, d, shape[d], r.sizes[d]);
        data = resample_axis(&data, &shape, d, &taps, r.extrapolation_value as f64);
        shape[d] = r.sizes[d];
    }
    let dtype = x.dtype();
    if dtype.is_int() {
        data.iter_mut().for_each(|v| *v = v.round());
    }
    Ok(Tensor::from_vec(&shape, data)
        .ok_or("resize shape")?
        .cast(dtype))
}
