//! Spectral ops with static sizes, imported as products with constant matrices: DFT (forward, inverse,
//! one-sided, real-to-complex and complex-to-real), STFT (frames gathered, windowed, each a DFT) and
//! MelWeightMatrix (a constant). A DFT of length L is one `matmul` of the signal's samples (real and
//! imaginary interleaved, as ONNX lays them out) with an [N*C, K*2] matrix of cosines and sines computed
//! in f64 and rounded to the signal's type: O(N*K) work per signal where an FFT is O(N log N), which the contraction kernels make fast at
//! the lengths models use (speech frames of 256-1024); the matrix is checked against the constant limit.

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{normalize_axis, DType, Op, Tensor, TensorType, Value};
use std::f64::consts::PI;

pub(crate) const OPS: &[&str] = &["DFT", "STFT", "MelWeightMatrix"];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        Ok(Some(match op {
            "DFT" => vec![dft(cx)?],
            "STFT" => vec![stft(cx)?],
            "MelWeightMatrix" => vec![mel_weight_matrix(cx)?],
            _ => return Ok(None),
        }))
    })();
    r.transpose()
}

/// What one transform computes along its axis.
#[derive(Debug, Clone, Copy)]
struct Transform {
    /// Samples in (along the axis) and whether they are complex (last dimension 2) or real (1).
    n: usize,
    complex: bool,
    /// The transform's length.
    len: usize,
    inverse: bool,
    onesided: bool,
}

impl Transform {
    /// Outputs along the axis: the length, its first half and one for a one-sided forward transform,
    /// and the length for a one-sided inverse (its output is real).
    fn outputs(&self) -> usize {
        if self.onesided && !self.inverse {
            self.len / 2 + 1
        } else {
            self.len
        }
    }

    /// Whether the outputs are complex (all but the one-sided inverse's).
    fn complex_out(&self) -> bool {
        !(self.inverse && self.onesided)
    }

    /// The [n * c, outputs * c'] matrix: row `m * c + p` (input sample m, part p: real, imaginary) and
    /// column `k * c' + q` (output k, part q) hold what that input part adds to that output part.
    fn matrix(&self) -> Vec<f64> {
        let c_in = if self.complex { 2 } else { 1 };
        let c_out = if self.complex_out() { 2 } else { 1 };
        let (rows, cols) = (self.n * c_in, self.outputs() * c_out);
        let l = self.len;
        let mut w = vec![0.0; rows * cols];
        for m in 0..self.n {
            for k in 0..self.outputs() {
                let (re_in, im_in) = if self.inverse && self.onesided {
                    // Complex-to-real (numpy's irfft): input m is frequency m, used up to L/2, counted
                    // twice but for 0 and (even L) L/2, whose imaginary parts do not count; output k
                    // is sample k.
                    if m > l / 2 {
                        continue;
                    }
                    let twice = if m == 0 || 2 * m == l { 1.0 } else { 2.0 };
                    let t = 2.0 * PI * ((m * k) % l) as f64 / l as f64;
                    let s = if m == 0 || 2 * m == l { 0.0 } else { t.sin() };
                    (
                        [twice * t.cos() / l as f64, 0.0],
                        [-twice * s / l as f64, 0.0],
                    )
                } else {
                    if m >= l {
                        continue;
                    }
                    // exp(-+ i t): (a + i b)(cos t -+ i sin t), and 1 / L for the inverse.
                    let t = 2.0 * PI * ((m * k) % l) as f64 / l as f64;
                    let (c, s) = (t.cos(), if self.inverse { t.sin() } else { -t.sin() });
                    let scale = if self.inverse { 1.0 / l as f64 } else { 1.0 };
                    ([c * scale, s * scale], [-s * scale, c * scale])
                };
                for q in 0..c_out {
                    w[(m * c_in) * cols + k * c_out + q] = re_in[q];
                    if self.complex {
                        w[(m * c_in + 1) * cols + k * c_out + q] = im_in[q];
                    }
                }
            }
        }
        w
    }
}

/// `x` [..., N (at `axis`), ..., C] transformed along `axis`: the axis moved next to the last, both
/// flattened into rows of N * C, multiplied by the transform's matrix, and moved back.
fn transform(cx: &mut NodeCx<'_, '_>, x: Value, axis: usize, t: Transform) -> Result<Value> {
    let ty = cx.ty(x).clone();
    let rank = ty.rank();
    let c_in = if t.complex { 2 } else { 1 };
    let c_out = if t.complex_out() { 2 } else { 1 };
    let (rows, cols) = (t.n * c_in, t.outputs() * c_out);
    cx.constant_fits(rows.saturating_mul(cols), 8, 0)?;
    let mut perm: Vec<usize> = (0..rank - 1).filter(|&d| d != axis).collect();
    perm.extend([axis, rank - 1]);
    let moved = cx.add1(Op::Transpose { perm: perm.clone() }, &[x])?;
    let mut shape: Vec<usize> = perm[..rank - 2].iter().map(|&d| ty.shape[d]).collect();
    shape.push(rows);
    let flat = cx.add1(
        Op::Reshape {
            shape: shape.clone(),
        },
        &[moved],
    )?;
    let w = Tensor::from_vec(&[rows, cols], t.matrix())
        .ok_or_else(|| cx.err("DFT matrix"))?
        .cast(ty.dtype);
    let w = cx.konst_value(w);
    let y = cx.add1(Op::MatMul, &[flat, w])?;
    shape.pop();
    shape.extend([t.outputs(), c_out]);
    let y = cx.add1(Op::Reshape { shape }, &[y])?;
    // Back: the output dimension where the axis was, the parts last.
    let mut back = vec![0; rank];
    for (i, &d) in perm.iter().enumerate() {
        back[d] = i;
    }
    cx.add1(Op::Transpose { perm: back }, &[y])
}

/// The signal input's checks: a float tensor [..., C] with C of 1 or 2 and rank at least 3 (DFT) or
/// exactly 3 (STFT).
fn signal(cx: &NodeCx<'_, '_>, x: Value) -> Result<(TensorType, bool)> {
    let ty = cx.ty(x).clone();
    if !ty.dtype.is_float() || ty.rank() < 2 || !matches!(ty.shape.last(), Some(1 | 2)) {
        return Err(cx.err_in(
            0,
            format!("the signal is {ty}, not a float tensor [..., 1 or 2]"),
        ));
    }
    let complex = ty.shape[ty.rank() - 1] == 2;
    Ok((ty, complex))
}

/// A scalar integer input that must be a constant, or `None` where absent.
fn konst_scalar(cx: &NodeCx<'_, '_>, i: usize) -> Result<Option<i64>> {
    match cx.konst_ints(i)? {
        None => Ok(None),
        Some(v) if v.len() == 1 => Ok(Some(v[0])),
        Some(v) => Err(cx.err_in(i, format!("must be one integer, not {} values", v.len()))),
    }
}

fn dft(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let (ty, complex) = signal(cx, x)?;
    let inverse = cx.int("inverse", 0)? != 0;
    let onesided = cx.int("onesided", 0)? != 0;
    let axis = if cx.opset() >= 20 {
        konst_scalar(cx, 2)?.unwrap_or(-2)
    } else {
        cx.int("axis", 1)?
    };
    let rank = ty.rank();
    let axis = normalize_axis(axis, rank)
        .filter(|&a| a < rank - 1)
        .ok_or_else(|| cx.err(format!("axis {axis} is not a signal axis of {ty}")))?;
    if onesided && !inverse && complex {
        return Err(cx.err("onesided=1 takes a real signal (last dimension 1)"));
    }
    let n = ty.shape[axis];
    let len = match konst_scalar(cx, 1)? {
        Some(l) => usize::try_from(l)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| cx.err_in(1, format!("dft_length {l} must be positive")))?,
        None if inverse && onesided => 2 * n.saturating_sub(1),
        None => n,
    };
    if len == 0 {
        return Err(cx.err_in(0, "the signal axis is empty"));
    }
    transform(
        cx,
        x,
        axis,
        Transform {
            n,
            complex,
            len,
            inverse,
            onesided,
        },
    )
}

/// STFT: frames of `frame_length` every `frame_step` samples of [batch, length, C], each multiplied by
/// the window (ones without one) and transformed (one-sided by default): [batch, frames, bins, 2].
fn stft(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let x = cx.req(0)?;
    let (ty, complex) = signal(cx, x)?;
    if ty.rank() != 3 {
        return Err(cx.err_in(0, format!("the signal is {ty}, not [batch, length, C]")));
    }
    let onesided = cx.int("onesided", 1)? != 0;
    if onesided && complex {
        return Err(cx.err("onesided=1 takes a real signal (last dimension 1)"));
    }
    let step = konst_scalar(cx, 1)?.ok_or_else(|| cx.err_in(1, "frame_step is required"))?;
    let window = cx.input(2)?;
    let window_len = window.map(|w| cx.ty(w).numel());
    let frame = match (konst_scalar(cx, 3)?, window_len) {
        (Some(f), _) => f,
        (None, Some(w)) => w as i64,
        (None, None) => ty.shape[1] as i64,
    };
    let length = ty.shape[1];
    let (step, frame) = match (usize::try_from(step), usize::try_from(frame)) {
        (Ok(s), Ok(f)) if s > 0 && f > 0 && f <= length => (s, f),
        _ => {
            return Err(cx.err(format!(
                "frame_step {step} and frame_length {frame} must be positive, the frame at most the signal's {length} samples"
            )))
        }
    };
    if window_len.is_some_and(|w| w != frame) {
        return Err(cx.err_in(
            2,
            format!("the window's length is not frame_length {frame}"),
        ));
    }
    let frames = (length - frame) / step + 1;
    cx.constant_fits(frames.saturating_mul(frame), 8, 1)?;
    let idx: Vec<i64> = (0..frames)
        .flat_map(|f| (0..frame).map(move |j| (f * step + j) as i64))
        .collect();
    let idx = cx.konst_value(
        Tensor::from_vec(&[frames, frame], idx).ok_or_else(|| cx.err("frame indices"))?,
    );
    // [batch, frames, frame, C]
    let mut y = cx.add1(Op::Gather { axis: 1 }, &[x, idx])?;
    if let Some(w) = window {
        let w = cx.cast_to(w, ty.dtype)?;
        let w = cx.add1(
            Op::Reshape {
                shape: vec![1, 1, frame, 1],
            },
            &[w],
        )?;
        y = cx.bin(mlopt_ir::Binary::Mul, y, w)?;
    }
    transform(
        cx,
        y,
        2,
        Transform {
            n: frame,
            complex,
            len: frame,
            inverse: false,
            onesided,
        },
    )
}

/// MelWeightMatrix: a constant [dft_length / 2 + 1, num_mel_bins] of triangular filters, computed as
/// ONNX's reference does (mel = 2595 log10(1 + f / 700), bin edges floored).
fn mel_weight_matrix(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let req = |cx: &NodeCx<'_, '_>, i: usize| -> Result<f64> {
        let t = cx
            .konst(i)?
            .ok_or_else(|| cx.err_in(i, "required input is missing"))?;
        match t.to_f64_vec().as_slice() {
            [v] => Ok(*v),
            _ => Err(cx.err_in(i, "must be a scalar")),
        }
    };
    let (bins, dft_len, rate, lo, hi) = (
        req(cx, 0)?,
        req(cx, 1)?,
        req(cx, 2)?,
        req(cx, 3)?,
        req(cx, 4)?,
    );
    let out = match cx.int_opt("output_datatype")? {
        Some(d) => crate::tensor_io::dtype_from_onnx(d as i32)
            .ok_or_else(|| cx.err(format!("output_datatype {d} is not supported")))?,
        None => DType::F32,
    };
    if !(bins >= 1.0 && dft_len >= 1.0 && rate > 0.0 && lo >= 0.0 && hi > lo) {
        return Err(cx.err(format!(
            "num_mel_bins {bins}, dft_length {dft_len}, sample_rate {rate}, edges {lo}..{hi} are out of range"
        )));
    }
    let (bins, dft_len) = (bins as usize, dft_len as usize);
    let spectrum = dft_len / 2 + 1;
    cx.constant_fits(spectrum.saturating_mul(bins), 8, 0)?;
    let mel = |f: f64| 2595.0 * (f / 700.0).ln_1p() / 10f64.ln();
    let (mlo, mhi) = (mel(lo), mel(hi));
    let step = (mhi - mlo) / (bins + 2) as f64;
    let edges: Vec<i64> = (0..bins + 2)
        .map(|i| {
            let m = i as f64 * step + mlo;
            let f = 700.0 * (m / 2595.0 * 10f64.ln()).exp_m1();
            (((dft_len + 1) as f64 * f) / rate).floor() as i64
        })
        .collect();
    let mut w = vec![0.0; spectrum * bins];
    let mut set = |j: i64, i: usize, v: f64| -> Result<()> {
        let j = usize::try_from(j)
            .ok()
            .filter(|&j| j < spectrum)
            .ok_or_else(|| {
                cx.err(format!(
                    "mel bin {i} reaches frequency bin {j}, past the spectrum"
                ))
            })?;
        w[j * bins + i] = v;
        Ok(())
    };
    for i in 0..bins {
        let (l, c, h) = (edges[i], edges[i + 1], edges[i + 2]);
        if c == l {
            set(c, i, 1.0)?;
        } else {
            for j in l..=c {
                set(j, i, (j - l) as f64 / (c - l) as f64)?;
            }
        }
        if h > c {
            for j in c..h {
                set(j, i, (h - j) as f64 / (h - c) as f64)?;
            }
        }
    }
    let t = Tensor::from_vec(&[spectrum, bins], w)
        .ok_or_else(|| cx.err("mel matrix"))?
        .cast(out);
    Ok(cx.konst_value(t))
}
