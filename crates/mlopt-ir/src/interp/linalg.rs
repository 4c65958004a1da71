//! MatMul, Gemm, Conv and ConvTranspose. Convolutions go through im2col / col2im and one plain matrix
//! product per (batch, group), for any number of spatial axes.

use super::elementwise::{zip2, Arith};
use super::{float_dispatch, num_dispatch, typed, EvalResult};
use crate::dtype::{broadcast_shapes, DType};
use crate::op::ConvAttrs;
use crate::tensor::Tensor;
use ndarray::ArrayD;

/// c[m,n] = sum_k a[m,k] * b[k,n], row-major slices.
fn mm<T: Arith>(a: &[T], b: &[T], m: usize, k: usize, n: usize) -> Vec<T> {
    let mut c = vec![T::zero(); m * n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let av = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (cv, &bv) in row.iter_mut().zip(brow) {
                *cv = cv.add(av.mul(bv));
            }
        }
    }
    c
}

fn standard_vec<T: Copy>(a: ndarray::ArrayViewD<'_, T>) -> Vec<T> {
    match a.as_slice() {
        Some(s) => s.to_vec(),
        None => a.iter().copied().collect(),
    }
}

/// For each index of the broadcast batch shape `batch` (row-major), the index of the matrix an operand
/// with batch dimensions `own` (right-aligned to `batch`, size 1 broadcast) holds there.
fn batch_offsets(own: &[usize], batch: &[usize]) -> Vec<usize> {
    let pad = batch.len() - own.len();
    let dims: Vec<usize> = std::iter::repeat_n(1, pad)
        .chain(own.iter().copied())
        .collect();
    let mut strides = vec![0usize; dims.len()];
    let mut s = 1;
    for d in (0..dims.len()).rev() {
        strides[d] = if dims[d] == 1 { 0 } else { s };
        s *= dims[d];
    }
    let total: usize = batch.iter().product();
    (0..total)
        .map(|mut flat| {
            let mut at = 0;
            for d in (0..batch.len()).rev() {
                at += (flat % batch[d]) * strides[d];
                flat /= batch[d];
            }
            at
        })
        .collect()
}

fn matmul_t<T: Arith>(a: &ArrayD<T>, b: &ArrayD<T>) -> EvalResult<Tensor> {
    let a2 = if a.ndim() == 1 {
        a.clone().insert_axis(ndarray::Axis(0))
    } else {
        a.clone()
    };
    let b2 = if b.ndim() == 1 {
        b.clone().insert_axis(ndarray::Axis(1))
    } else {
        b.clone()
    };
    let (ra, rb) = (a2.ndim(), b2.ndim());
    let (m, k, n) = (a2.shape()[ra - 2], a2.shape()[ra - 1], b2.shape()[rb - 1]);
    if b2.shape()[rb - 2] != k {
        return Err(format!(
            "inner dimensions differ: {:?} @ {:?}",
            a.shape(),
            b.shape()
        ));
    }
    let batch = broadcast_shapes(&a2.shape()[..ra - 2], &b2.shape()[..rb - 2])
        .ok_or("batch dims do not broadcast")?;
    // Each operand's matrices once, in its own batch layout; a batch index picks one of them (a broadcast
    // batch dimension of size 1 always the first). Materialising the broadcast copied a [K, N] weight
    // once per position of an [1, 56, 56, K] activation (460 MB for one ConvNeXt layer).
    let av = standard_vec(a2.view());
    let bv = standard_vec(b2.view());
    let nb: usize = batch.iter().product();
    let (ia, ib) = (
        batch_offsets(&a2.shape()[..ra - 2], &batch),
        batch_offsets(&b2.shape()[..rb - 2], &batch),
    );
    let mut out = Vec::with_capacity(nb * m * n);
    for (i, j) in ia.into_iter().zip(ib) {
        out.extend(mm(
            &av[i * m * k..(i + 1) * m * k],
            &bv[j * k * n..(j + 1) * k * n],
            m,
            k,
            n,
        ));
    }
    let mut shape = batch;
    if a.ndim() > 1 {
        shape.push(m);
    }
    if b.ndim() > 1 {
        shape.push(n);
    }
    Tensor::from_vec(&shape, out).ok_or_else(|| "matmul shape".into())
}

/// i16 operands are summed in i32 (`infer::product_dtype`): `f` of both cast to i32, else None.
fn widened(
    a: &Tensor,
    b: &Tensor,
    f: impl FnOnce(&Tensor, &Tensor) -> EvalResult<Tensor>,
) -> Option<EvalResult<Tensor>> {
    (a.dtype() == DType::I16 && b.dtype() == DType::I16)
        .then(|| f(&a.cast(DType::I32), &b.cast(DType::I32)))
}

pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> EvalResult<Tensor> {
    if let Some(r) = widened(a, b, matmul) {
        return r;
    }
    num_dispatch!(a, x => matmul_t(x, typed(b)?))
}

fn gemm_t<T: Arith>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    c: Option<&ArrayD<T>>,
    alpha: f32,
    beta: f32,
    ta: bool,
    tb: bool,
) -> EvalResult<Tensor> {
    let a = if ta { a.t().to_owned() } else { a.clone() };
    let b = if tb { b.t().to_owned() } else { b.clone() };
    let prod = matmul_t(&a, &b)?;
    let scaled = typed::<T>(&prod)?.mapv(|v| T::from_f64(v.to_f64() * alpha as f64));
    let out = match c {
        Some(c) => zip2(&scaled, c, |s, cv| {
            s.add(T::from_f64(cv.to_f64() * beta as f64))
        })?,
        None => scaled,
    };
    Ok(Tensor::from_array(out))
}

pub(crate) fn gemm(
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> EvalResult<Tensor> {
    if let Some(r) = widened(a, b, |a, b| gemm(a, b, c, alpha, beta, trans_a, trans_b)) {
        return r;
    }
    num_dispatch!(a, x => gemm_t(x, typed(b)?, c.map(typed).transpose()?, alpha, beta, trans_a, trans_b))
}

/// Calls `f` with every multi-index of `shape` in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// For one spatial axis: `table[k][o]` is the input position kernel tap `k` reads for output `o`.
fn tap_table(
    input: usize,
    kernel: usize,
    out: usize,
    stride: usize,
    dil: usize,
    pad: usize,
) -> Vec<Vec<Option<usize>>> {
    (0..kernel)
        .map(|k| {
            (0..out)
                .map(|o| {
                    let pos = (o * stride + k * dil) as i64 - pad as i64;
                    (pos >= 0 && (pos as usize) < input).then_some(pos as usize)
                })
                .collect()
        })
        .collect()
}

struct Geometry {
    sp: usize,
    ins: Vec<usize>,
    ks: Vec<usize>,
    outs: Vec<usize>,
    tables: Vec<Vec<Vec<Option<usize>>>>,
}

impl Geometry {
    /// `ins` are the spatial sizes the taps read from, `outs` the positions they are indexed by.
    fn new(ins: &[usize], ks: &[usize], outs: &[usize], c: &ConvAttrs) -> Geometry {
        let sp = ins.len();
        let tables = (0..sp)
            .map(|d| {
                tap_table(
                    ins[d],
                    ks[d],
                    outs[d],
                    c.strides[d],
                    c.dilations[d],
                    c.pads[d],
                )
            })
            .collect();
        Geometry {
            sp,
            ins: ins.to_vec(),
            ks: ks.to_vec(),
            outs: outs.to_vec(),
            tables,
        }
    }

    /// Flat offset inside one channel plane of the input for kernel tap `k` at output `o`, if in bounds.
    fn offset(&self, k: &[usize], o: &[usize]) -> Option<usize> {
        let mut off = 0;
        for d in 0..self.sp {
            off = off * self.ins[d] + self.tables[d][k[d]][o[d]]?;
        }
        Some(off)
    }
}

fn conv_t<T: Arith>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    bias: Option<&ArrayD<T>>,
    c: &ConvAttrs,
) -> EvalResult<Tensor> {
    let (xs, ws) = (x.shape(), w.shape());
    let (n, ch, m, g) = (xs[0], xs[1], ws[0], c.group);
    let (cg, mg) = (ch / g, m / g);
    let sp = xs.len() - 2;
    let outs: Vec<usize> = (0..sp)
        .map(|d| {
            crate::infer::window_out(
                xs[d + 2],
                ws[d + 2],
                c.strides[d],
                c.dilations[d],
                c.pads[d],
                c.pads[d + sp],
                false,
            )
            .unwrap_or(0)
        })
        .collect();
    let geo = Geometry::new(&xs[2..], &ws[2..], &outs, c);
    let (plane, kk, oo): (usize, usize, usize) = (
        xs[2..].iter().product(),
        ws[2..].iter().product(),
        outs.iter().product(),
    );
    let xv: Vec<T> = x.iter().copied().collect();
    let wv: Vec<T> = w.iter().copied().collect();
    let mut out = vec![T::zero(); n * m * oo];
    for b in 0..n {
        for gi in 0..g {
            let mut col = vec![T::zero(); cg * kk * oo];
            let mut row = 0;
            for ci in 0..cg {
                let base = (b * ch + gi * cg + ci) * plane;
                for_each_index(&geo.ks.clone(), |k| {
                    let mut col_i = 0;
                    for_each_index(&geo.outs, |o| {
                        if let Some(off) = geo.offset(k, o) {
                            col[row * oo + col_i] = xv[base + off];
                        }
                        col_i += 1;
                    });
                    row += 1;
                });
            }
            let wg = &wv[gi * mg * cg * kk..(gi + 1) * mg * cg * kk];
            let res = mm(wg, &col, mg, cg * kk, oo);
            let dst = (b * m + gi * mg) * oo;
            out[dst..dst + mg * oo].copy_from_slice(&res);
        }
    }
    finish_conv(out, bias, n, m, outs)
}

/// Adds the per-channel bias to an [N, M, spatial...] result and wraps it.
fn finish_conv<T: Arith>(
    mut out: Vec<T>,
    bias: Option<&ArrayD<T>>,
    n: usize,
    m: usize,
    spatial: Vec<usize>,
) -> EvalResult<Tensor> {
    let plane: usize = spatial.iter().product();
    if let Some(bias) = bias {
        let bv: Vec<T> = bias.iter().copied().collect();
        for (i, v) in out.iter_mut().enumerate() {
            *v = v.add(bv[(i / plane.max(1)) % m]);
        }
    }
    let mut shape = vec![n, m];
    shape.extend(spatial);
    Tensor::from_vec(&shape, out).ok_or_else(|| "conv shape".into())
}

pub(crate) fn conv(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &ConvAttrs,
) -> EvalResult<Tensor> {
    if let Some(r) = widened(x, w, |x, w| {
        conv_t::<i32>(typed(x)?, typed(w)?, b.map(typed).transpose()?, c)
    }) {
        return r;
    }
    float_dispatch!(x, a => conv_t(a, typed(w)?, b.map(typed).transpose()?, c))
}

fn conv_transpose_t<T: Arith>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    bias: Option<&ArrayD<T>>,
    c: &ConvAttrs,
) -> EvalResult<Tensor> {
    let (xs, ws) = (x.shape(), w.shape());
    let (n, ch, g) = (xs[0], xs[1], c.group);
    let (cg, mg) = (ch / g, ws[1]);
    let m = mg * g;
    let sp = xs.len() - 2;
    let outs: Vec<usize> = (0..sp)
        .map(|d| {
            let full = c.strides[d] * xs[d + 2].saturating_sub(1)
                + c.output_padding.get(d).copied().unwrap_or(0)
                + c.dilations[d] * (ws[d + 2] - 1)
                + 1;
            full.saturating_sub(c.pads[d] + c.pads[d + sp])
        })
        .collect();
    // Taps scatter from input position i to output position i*s + k*d - pad: the same table, with the
    // roles of input and output swapped.
    let geo = Geometry::new(&outs, &ws[2..], &xs[2..], c);
    let (iplane, kk, oplane): (usize, usize, usize) = (
        xs[2..].iter().product(),
        ws[2..].iter().product(),
        outs.iter().product(),
    );
    let xv: Vec<T> = x.iter().copied().collect();
    let wv: Vec<T> = w.iter().copied().collect();
    let mut out = vec![T::zero(); n * m * oplane];
    for b in 0..n {
        for gi in 0..g {
            // col[mk, i] = sum_c w[c, mk] * x[c, i]
            let xg = &xv[(b * ch + gi * cg) * iplane..(b * ch + (gi + 1) * cg) * iplane];
            let wg = &wv[gi * cg * mg * kk..(gi + 1) * cg * mg * kk];
            let mut wt = vec![T::zero(); mg * kk * cg];
            for ci in 0..cg {
                for r in 0..mg * kk {
                    wt[r * cg + ci] = wg[ci * mg * kk + r];
                }
            }
            let col = mm(&wt, xg, mg * kk, cg, iplane);
            for mi in 0..mg {
                let dst = (b * m + gi * mg + mi) * oplane;
                let mut k_i = 0;
                for_each_index(&geo.ks.clone(), |k| {
                    let mut i_i = 0;
                    for_each_index(&geo.outs, |i| {
                        if let Some(off) = geo.offset(k, i) {
                            let v = &mut out[dst + off];
                            *v = v.add(col[(mi * kk + k_i) * iplane + i_i]);
                        }
                        i_i += 1;
                    });
                    k_i += 1;
                });
            }
        }
    }
    finish_conv(out, bias, n, m, outs)
}

pub(crate) fn conv_transpose(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &ConvAttrs,
) -> EvalResult<Tensor> {
    float_dispatch!(x, a => conv_transpose_t(a, typed(w)?, b.map(typed).transpose()?, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batch dimensions broadcast from either side (size 1 or missing) pick the right matrices: against
    /// the product written out element by element.
    #[test]
    fn matmul_broadcasts_batch_dimensions_without_copying_them() {
        let (sa, sb) = ([2usize, 1, 3, 4], [5usize, 4, 2]);
        let a: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..40).map(|i| (i % 7) as f32 - 2.0).collect();
        let got = matmul(
            &Tensor::from_vec(&sa, a.clone()).unwrap(),
            &Tensor::from_vec(&sb, b.clone()).unwrap(),
        )
        .unwrap();
        let mut want = vec![];
        for x in 0..2 {
            for y in 0..5 {
                for i in 0..3 {
                    for j in 0..2 {
                        let s: f32 = (0..4)
                            .map(|p| a[x * 12 + i * 4 + p] * b[y * 8 + p * 2 + j])
                            .sum();
                        want.push(s);
                    }
                }
            }
        }
        assert_eq!(got, Tensor::from_vec(&[2, 5, 3, 2], want).unwrap());
        assert_eq!(
            batch_offsets(&[2, 1], &[2, 5]),
            [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
        );
        assert_eq!(batch_offsets(&[5], &[2, 5]), [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
        assert_eq!(batch_offsets(&[], &[3]), [0, 0, 0]);
    }
}
