//! The transformer ops ONNX defines as functions, imported as the sub-graphs of IR ops that define them
//! (the optimiser fuses attention back): Attention (opset 23), RotaryEmbedding and RMSNormalization.

use super::composite::*;
use super::nn::axis;
use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Binary, DType, Op, ReduceKind, Tensor, Unary, Value};

/// y = x / sqrt(mean(x^2 over axes axis..) + epsilon) * scale.
pub(super) fn rms_norm(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, scale) = (cx.req(0)?, cx.req(1)?);
    let ty = cx.ty(x).clone();
    let a = cx.int("axis", -1)?;
    let a = axis(cx, a, ty.rank())?;
    let eps = cx.float("epsilon", 1e-5)?;
    let wide = stash_dtype(cx, ty.dtype)?;
    let xf = cx.cast_to(x, wide)?;
    let sq = cx.bin(Binary::Mul, xf, xf)?;
    let ms = cx.reduce(ReduceKind::Mean, sq, (a..ty.rank()).collect(), true)?;
    let e = cx.scalar(eps as f64, wide);
    let var = cx.bin(Binary::Add, ms, e)?;
    let rms = cx.un(Unary::Sqrt, var)?;
    let n = cx.bin(Binary::Div, xf, rms)?;
    let n = cx.cast_to(n, ty.dtype)?;
    cx.bin(Binary::Mul, n, scale)
}

/// Attention (opset 23) as ONNX defines it: optional KV cache concatenation, grouped-query heads by tiling,
/// Attention (opsets 23-24), as onnx 1.23's reference computes it: 3-D inputs (B, S, H*d) split into
/// heads as (B, S, H, d) transposed to (B, H, S, d) (and the output back); K and V with past_key/value
/// concatenated; with fewer key/value heads (GQA) each is repeated in place (h0 h0 h1 h1); Q and K each
/// scaled by sqrt(scale); softcap on the product before the mask; the mask (boolean or additive, padded
/// with -inf to the key length) plus a causal bias aligned bottom-right to the past (key j is seen by
/// query i when j <= i + past length); softmax, with a row whose bias is -inf everywhere set to 0 (not
/// NaN); the product with V. Outputs: Y, present_key, present_value, and the QK product at the stage
/// `qk_matmul_output_mode` picks (0 and 1: after softcap, 2: with the bias, 3: after softmax).
pub(super) fn attention(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let (q, k, v) = (cx.req(0)?, cx.req(1)?, cx.req(2)?);
    let (mask, past_k, past_v) = (cx.input(3)?, cx.input(4)?, cx.input(5)?);
    let dtype = cx.ty(q).dtype;
    let is_causal = cx.int("is_causal", 0)? != 0;
    let q_heads = cx.int_opt("q_num_heads")?;
    let kv_heads = cx.int_opt("kv_num_heads")?;
    let scale = cx.float_opt("scale")?;
    let softcap = cx.float("softcap", 0.0)?;
    let mode = cx.int("qk_matmul_output_mode", 0)?;
    let precision = cx.int_opt("softmax_precision")?;
    // Opset 24: the valid keys per batch of an external cache; windows around each query's position.
    let nonpad = cx.input(6)?;
    let (left, right) = (
        cx.int("left_window_size", -1)?,
        cx.int("right_window_size", -1)?,
    );
    if left < -1 || right < -1 {
        return Err(cx.err("left_window_size and right_window_size must be -1 or at least 0"));
    }
    if nonpad.is_some() && past_k.is_some() {
        return Err(cx.err_in(
            6,
            "nonpad_kv_seqlen cannot be combined with past_key and past_value",
        ));
    }
    let rank = cx.ty(q).rank();
    if rank != cx.ty(k).rank() || rank != cx.ty(v).rank() || !(rank == 3 || rank == 4) {
        return Err(cx.err("Q, K and V must all be 3-D or all 4-D"));
    }
    let (q4, k4, v4) = if rank == 3 {
        let (Some(qh), Some(kvh)) = (q_heads, kv_heads) else {
            return Err(cx.err("3-D inputs need the q_num_heads and kv_num_heads attributes"));
        };
        // (B, S, H*d) -> (B, S, H, d) -> (B, H, S, d).
        let heads = |cx: &mut NodeCx<'_, '_>, x: Value, h: i64, i: usize| -> Result<Value> {
            let s = cx.ty(x).shape.clone();
            let h = usize::try_from(h)
                .ok()
                .filter(|&h| h > 0 && s[2].is_multiple_of(h))
                .ok_or_else(|| {
                    cx.err_in(
                        i,
                        format!("hidden size {} does not split into {h} heads", s[2]),
                    )
                })?;
            let r = cx.add1(
                Op::Reshape {
                    shape: vec![s[0], s[1], h, s[2] / h],
                },
                &[x],
            )?;
            cx.add1(
                Op::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                &[r],
            )
        };
        (
            heads(cx, q, qh, 0)?,
            heads(cx, k, kvh, 1)?,
            heads(cx, v, kvh, 2)?,
        )
    } else {
        (q, k, v)
    };
    let (qh, kvh, head) = (cx.ty(q4).shape[1], cx.ty(k4).shape[1], cx.ty(q4).shape[3]);
    let past_len = past_k.map_or(0, |p| cx.ty(p).shape.get(2).copied().unwrap_or(0));
    let present_k = match past_k {
        Some(p) => cx.add1(Op::Concat { axis: 2 }, &[p, k4])?,
        None => k4,
    };
    let present_v = match past_v {
        Some(p) => cx.add1(Op::Concat { axis: 2 }, &[p, v4])?,
        None => v4,
    };
    let (mut kk, mut vv) = (present_k, present_v);
    if qh != kvh {
        if kvh == 0 || qh % kvh != 0 {
            return Err(cx.err(format!(
                "{qh} query heads cannot share {kvh} key/value heads"
            )));
        }
        // Each key/value head repeated in place: (B, kvh, S, d) -> (B, kvh, r, S, d) -> (B, qh, S, d).
        let repeat = |cx: &mut NodeCx<'_, '_>, x: Value| -> Result<Value> {
            let s = cx.ty(x).shape.clone();
            let r = cx.add1(
                Op::Reshape {
                    shape: vec![s[0], s[1], 1, s[2], s[3]],
                },
                &[x],
            )?;
            let t = cx.add1(
                Op::Tile {
                    repeats: vec![1, 1, qh / kvh, 1, 1],
                },
                &[r],
            )?;
            cx.add1(
                Op::Reshape {
                    shape: vec![s[0], qh, s[2], s[3]],
                },
                &[t],
            )
        };
        kk = repeat(cx, kk)?;
        vv = repeat(cx, vv)?;
    }
    let root = (scale.map_or(1.0 / (head as f64).sqrt(), |s| s as f64)).sqrt();
    let root = cx.scalar(root, dtype);
    let qs = cx.bin(Binary::Mul, q4, root)?;
    let kt = cx.add1(
        Op::Transpose {
            perm: vec![0, 1, 3, 2],
        },
        &[kk],
    )?;
    let ks = cx.bin(Binary::Mul, kt, root)?;
    let qk = cx.add1(Op::MatMul, &[qs, ks])?;
    let (sq, skv) = (cx.ty(q4).shape[2], cx.ty(kk).shape[2]);
    let capped = if softcap > 0.0 {
        let c = cx.scalar(softcap as f64, dtype);
        let d = cx.bin(Binary::Div, qk, c)?;
        let t = cx.un(Unary::Tanh, d)?;
        cx.bin(Binary::Mul, t, c)?
    } else {
        qk
    };
    // The mask as an additive bias, padded with -inf to the key length.
    let ninf = cx.scalar(f64::NEG_INFINITY, dtype);
    let mask = match mask {
        Some(m) => {
            let m = if cx.ty(m).dtype == DType::Bool {
                let zero = cx.scalar(0.0, dtype);
                cx.add1(Op::Where, &[m, zero, ninf])?
            } else {
                m
            };
            let ms = cx.ty(m).shape.clone();
            let last = ms.last().copied().unwrap_or(0);
            if ms.is_empty() || last > skv {
                return Err(cx.err_in(3, format!("attn_mask {ms:?} does not fit {skv} keys")));
            }
            Some(if last < skv {
                let mut pads = vec![0i64; 2 * ms.len()];
                pads[2 * ms.len() - 1] = (skv - last) as i64;
                cx.add1(
                    Op::Pad {
                        pads,
                        mode: mlopt_ir::PadMode::Constant,
                        value: f64::NEG_INFINITY,
                    },
                    &[m],
                )?
            } else {
                m
            })
        }
        None => None,
    };
    let causal = positions(
        cx,
        (sq, skv, past_len, past_k.is_some()),
        nonpad,
        (is_causal, left, right),
        dtype,
    )?;
    let bias = match (mask, causal) {
        (Some(m), Some(c)) => Some(cx.bin(Binary::Add, m, c)?),
        (m, c) => m.or(c),
    };
    let biased = match bias {
        Some(b) => cx.bin(Binary::Add, capped, b)?,
        None => capped,
    };
    let wide = match precision {
        None => dtype,
        Some(p) => crate::tensor_io::dtype_from_onnx(p as i32)
            .filter(|d| d.is_float())
            .ok_or_else(|| {
                cx.err(format!(
                    "softmax_precision {p} is not a supported float type"
                ))
            })?,
    };
    let sm_in = cx.cast_to(biased, wide)?;
    let mut probs = cx.add1(Op::Softmax { axis: 3 }, &[sm_in])?;
    if let Some(b) = bias {
        // A query that may see no key gets zeros, not softmax's NaNs.
        let last = cx.ty(b).rank() - 1;
        let most = cx.reduce(ReduceKind::Max, b, vec![last], true)?;
        let none = cx.bin(Binary::Equal, most, ninf)?;
        let zero = cx.scalar(0.0, wide);
        probs = cx.add1(Op::Where, &[none, zero, probs])?;
    }
    let vw = cx.cast_to(vv, wide)?;
    let out = cx.add1(Op::MatMul, &[probs, vw])?;
    let mut out = cx.cast_to(out, dtype)?;
    if rank == 3 {
        let t = cx.add1(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[out],
        )?;
        let s = cx.ty(t).shape.clone();
        out = cx.add1(
            Op::Reshape {
                shape: vec![s[0], s[1], s[2] * s[3]],
            },
            &[t],
        )?;
    }
    let qk_out = match mode {
        0 | 1 => capped,
        2 => biased,
        3 => probs,
        m => return Err(cx.err(format!("qk_matmul_output_mode={m} is not supported"))),
    };
    let qk_out = cx.cast_to(qk_out, dtype)?;
    Ok(vec![out, present_k, present_v, qk_out])
}

/// The additive bias of a query's position against a key's, `[B or 1, 1, sq, skv]`, or `None` when
/// nothing depends on position: -inf where key j is hidden from query i, by the causal rule
/// (j > i + offset), the windows (j < i + offset - left, j > i + offset + right) and the keys past
/// `nonpad[b]`. The offset aligns queries bottom-right: the past length, or `nonpad[b] - sq` for an
/// external cache, else 0.
fn positions(
    cx: &mut NodeCx<'_, '_>,
    (sq, skv, past_len, has_past): (usize, usize, usize, bool),
    nonpad: Option<Value>,
    (is_causal, left, right): (bool, i64, i64),
    dtype: DType,
) -> Result<Option<Value>> {
    if !is_causal && left < 0 && right < 0 && nonpad.is_none() {
        return Ok(None);
    }
    let iota = |cx: &mut NodeCx<'_, '_>, n: usize, shape: &[usize]| -> Result<Value> {
        let t = Tensor::from_vec(shape, (0..n as i64).collect::<Vec<i64>>())
            .ok_or_else(|| cx.err("positions"))?;
        Ok(cx.konst_value(t))
    };
    let j = iota(cx, skv, &[1, 1, 1, skv])?;
    let i = iota(cx, sq, &[1, 1, sq, 1])?;
    let valid = match nonpad {
        Some(n) => {
            let b = cx.ty(n).numel();
            let n = cx.cast_to(n, DType::I64)?;
            Some(cx.add1(
                Op::Reshape {
                    shape: vec![b, 1, 1, 1],
                },
                &[n],
            )?)
        }
        None => None,
    };
    let offset = match (valid, has_past) {
        (Some(v), false) => {
            let q = cx.scalar(sq as f64, DType::I64);
            cx.bin(Binary::Sub, v, q)?
        }
        _ => cx.scalar(past_len as f64, DType::I64),
    };
    let at = cx.bin(Binary::Add, i, offset)?;
    let mut hidden: Option<Value> = None;
    let mut hide = |cx: &mut NodeCx<'_, '_>, h: Value| -> Result<()> {
        hidden = Some(match hidden {
            Some(x) => cx.bin(Binary::Or, x, h)?,
            None => h,
        });
        Ok(())
    };
    if is_causal {
        let h = cx.bin(Binary::Greater, j, at)?;
        hide(cx, h)?;
    }
    if left >= 0 {
        let l = cx.scalar(left as f64, DType::I64);
        let from = cx.bin(Binary::Sub, at, l)?;
        let h = cx.bin(Binary::Less, j, from)?;
        hide(cx, h)?;
    }
    if right >= 0 {
        let r = cx.scalar(right as f64, DType::I64);
        let to = cx.bin(Binary::Add, at, r)?;
        let h = cx.bin(Binary::Greater, j, to)?;
        hide(cx, h)?;
    }
    if let Some(v) = valid {
        let h = cx.bin(Binary::GreaterOrEqual, j, v)?;
        hide(cx, h)?;
    }
    let Some(h) = hidden else { return Ok(None) };
    let (ninf, zero) = (cx.scalar(f64::NEG_INFINITY, dtype), cx.scalar(0.0, dtype));
    Ok(Some(cx.add1(Op::Where, &[h, ninf, zero])?))
}

/// Rotary position embedding (opset 23): rotates the first `rotary_embedding_dim` features of each head
/// by the cached angles, pairing halves (or neighbours when `interleaved`).
pub(super) fn rotary(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (x, cos_cache, sin_cache, pos) = (cx.req(0)?, cx.req(1)?, cx.req(2)?, cx.input(3)?);
    let ty = cx.ty(x).clone();
    let interleaved = cx.int("interleaved", 0)? != 0;
    let rot_dim = cx.int("rotary_embedding_dim", 0)?;
    let num_heads = cx.int("num_heads", 0)?;
    // To [B, S, H, D].
    let x4 = match ty.rank() {
        4 => cx.add1(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[x],
        )?,
        3 => {
            let h = usize::try_from(num_heads)
                .ok()
                .filter(|&h| h > 0 && ty.shape[2].is_multiple_of(h))
                .ok_or_else(|| {
                    cx.err(format!(
                        "3-D input needs num_heads dividing {}",
                        ty.shape[2]
                    ))
                })?;
            cx.add1(
                Op::Reshape {
                    shape: vec![ty.shape[0], ty.shape[1], h, ty.shape[2] / h],
                },
                &[x],
            )?
        }
        r => return Err(cx.err_in(0, format!("expects a 3-D or 4-D input, got rank {r}"))),
    };
    let s4 = cx.ty(x4).shape.clone();
    let head = s4[3];
    let rd = if rot_dim == 0 {
        head
    } else {
        usize::try_from(rot_dim)
            .ok()
            .filter(|&d| d <= head && d % 2 == 0)
            .ok_or_else(|| {
                cx.err(format!(
                    "rotary_embedding_dim {rot_dim} must be even and at most {head}"
                ))
            })?
    };
    let half = rd / 2;
    let angles = |cx: &mut NodeCx<'_, '_>, cache: Value| -> Result<Value> {
        let c = match pos {
            Some(p) => cx.add1(Op::Gather { axis: 0 }, &[cache, p])?,
            None => cache,
        };
        let c = cx.slice_last(c, 0, 1, half)?;
        let cs = cx.ty(c).shape.clone();
        if cs.len() != 3 {
            return Err(cx.err("cos/sin caches must give [batch, sequence, rotary_dim/2] angles"));
        }
        cx.add1(
            Op::Reshape {
                shape: vec![cs[0], cs[1], 1, cs[2]],
            },
            &[c],
        )
    };
    let (cos, sin) = (angles(cx, cos_cache)?, angles(cx, sin_cache)?);
    let (x1, x2) = if interleaved {
        (
            cx.slice_last(x4, 0, 2, half)?,
            cx.slice_last(x4, 1, 2, half)?,
        )
    } else {
        (
            cx.slice_last(x4, 0, 1, half)?,
            cx.slice_last(x4, half, 1, half)?,
        )
    };
    let (c1, s2) = (cx.bin(Binary::Mul, cos, x1)?, cx.bin(Binary::Mul, sin, x2)?);
    let real = cx.bin(Binary::Sub, c1, s2)?;
    let (s1, c2) = (cx.bin(Binary::Mul, sin, x1)?, cx.bin(Binary::Mul, cos, x2)?);
    let imag = cx.bin(Binary::Add, s1, c2)?;
    let rotated = if interleaved {
        let mut pair = s4.clone();
        pair[3] = half;
        pair.push(1);
        let r = cx.add1(
            Op::Reshape {
                shape: pair.clone(),
            },
            &[real],
        )?;
        let i = cx.add1(Op::Reshape { shape: pair }, &[imag])?;
        let both = cx.add1(Op::Concat { axis: 4 }, &[r, i])?;
        let mut flat = s4.clone();
        flat[3] = rd;
        cx.add1(Op::Reshape { shape: flat }, &[both])?
    } else {
        cx.add1(Op::Concat { axis: 3 }, &[real, imag])?
    };
    let out = if rd < head {
        let rest = cx.slice_last(x4, rd, 1, head - rd)?;
        cx.add1(Op::Concat { axis: 3 }, &[rotated, rest])?
    } else {
        rotated
    };
    match ty.rank() {
        4 => cx.add1(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[out],
        ),
        _ => cx.add1(Op::Reshape { shape: ty.shape }, &[out]),
    }
}

/// TensorScatter (opset 24), a KV cache's update: `update` written into `past_cache` along `axis` from
/// each batch item's `write_indices` position (zeros without them), wrapping around the cache in
/// `circular` mode. A `scatter_elements` along the axis whose indices are the positions plus a ramp
/// over the update's length, so the positions may be a run-time input; in `linear` mode one past the
/// cache is the scatter's data error, naming the node.
pub(super) fn tensor_scatter(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let (cache, update, positions) = (cx.req(0)?, cx.req(1)?, cx.input(2)?);
    let (ct, ut) = (cx.ty(cache).clone(), cx.ty(update).clone());
    let circular = match cx.string("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        m => return Err(cx.err(format!("mode '{m}' must be linear or circular"))),
    };
    let a = cx.int("axis", -2)?;
    let a = axis(cx, a, ct.rank())?;
    let fits = ct.rank() == ut.rank()
        && ct.dtype == ut.dtype
        && a > 0
        && (0..ct.rank()).all(|d| {
            if d == a {
                ut.shape[d] <= ct.shape[d]
            } else {
                ut.shape[d] == ct.shape[d]
            }
        });
    if !fits {
        return Err(cx.err_in(
            1,
            format!(
                "the update {ut} does not fit the cache {ct} along axis {a} (after the batch axis)"
            ),
        ));
    }
    let batch = ct.shape[0];
    let mut along = vec![1; ct.rank()];
    along[a] = ut.shape[a];
    let ramp = Tensor::from_vec(&along, (0..ut.shape[a] as i64).collect())
        .ok_or_else(|| cx.err("ramp"))?;
    let mut idx = cx.konst_value(ramp);
    if let Some(p) = positions {
        let pt = cx.ty(p).clone();
        if pt.shape != [batch] || !pt.dtype.is_int() {
            return Err(cx.err_in(2, format!("write_indices {pt} is not [{batch}] integers")));
        }
        let mut per_item = vec![1; ct.rank()];
        per_item[0] = batch;
        let p = cx.cast_to(p, DType::I64)?;
        let p = cx.add1(Op::Reshape { shape: per_item }, &[p])?;
        idx = cx.bin(Binary::Add, idx, p)?;
    }
    if circular {
        let len = cx.scalar(ct.shape[a] as f64, DType::I64);
        idx = cx.bin(Binary::Mod { fmod: false }, idx, len)?;
    }
    let idx = cx.add1(
        Op::Expand {
            shape: ut.shape.clone(),
        },
        &[idx],
    )?;
    cx.add1(
        Op::ScatterElements {
            axis: a,
            reduction: mlopt_ir::ScatterReduction::None,
        },
        &[cache, idx, update],
    )
}
