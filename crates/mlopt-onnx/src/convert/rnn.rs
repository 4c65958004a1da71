//! RNN, GRU and LSTM, unrolled over the (static) sequence at import. The input projection of every step
//! is one matmul over the whole sequence; each step then adds its recurrent product and applies the gates.
//! Supports both directions, `layout`, initial states, LSTM peepholes and `input_forget`, GRU's
//! `linear_before_reset`, custom activations and `clip`. `sequence_lens` must be constant and equal to the
//! sequence length (shorter sequences would make the outputs depend on data).

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Binary, Op, Unary, Value};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

impl Kind {
    fn gates(self) -> usize {
        match self {
            Kind::Rnn => 1,
            Kind::Gru => 3,
            Kind::Lstm => 4,
        }
    }
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Kind::Rnn => &["Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation with its alpha/beta.
#[derive(Clone)]
struct Act {
    name: String,
    alpha: Option<f32>,
    beta: Option<f32>,
}

pub(crate) const OPS: &[&str] = &["RNN", "GRU", "LSTM"];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let kind = match op {
        "RNN" => Kind::Rnn,
        "GRU" => Kind::Gru,
        "LSTM" => Kind::Lstm,
        _ => return None,
    };
    Some(recurrent(cx, kind))
}

fn activations(cx: &mut NodeCx<'_, '_>, kind: Kind, dirs: usize) -> Result<Vec<Act>> {
    let names: Vec<String> = match cx.strings("activations")? {
        Some(v) => v,
        None => kind
            .default_activations()
            .iter()
            .cycle()
            .take(kind.default_activations().len() * dirs)
            .map(|s| s.to_string())
            .collect(),
    };
    if names.len() != kind.default_activations().len() * dirs {
        return Err(cx.err(format!(
            "expected {} activations, got {}",
            kind.default_activations().len() * dirs,
            names.len()
        )));
    }
    let alphas = cx.floats("activation_alpha")?.unwrap_or_default();
    let betas = cx.floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0, 0);
    let mut out = vec![];
    for n in names {
        let (takes_a, takes_b) = match n.to_ascii_lowercase().as_str() {
            "affine" | "scaledtanh" | "hardsigmoid" => (true, true),
            "leakyrelu" | "thresholdedrelu" | "elu" => (true, false),
            _ => (false, false),
        };
        let alpha = if takes_a {
            ai += 1;
            alphas.get(ai - 1).copied()
        } else {
            None
        };
        let beta = if takes_b {
            bi += 1;
            betas.get(bi - 1).copied()
        } else {
            None
        };
        out.push(Act {
            name: n,
            alpha,
            beta,
        });
    }
    Ok(out)
}

fn apply(cx: &mut NodeCx<'_, '_>, a: &Act, x: Value) -> Result<Value> {
    let dtype = cx.ty(x).dtype;
    let u = |u| Op::Unary(u);
    match a.name.to_ascii_lowercase().as_str() {
        "sigmoid" => cx.add1(u(Unary::Sigmoid), &[x]),
        "tanh" => cx.add1(u(Unary::Tanh), &[x]),
        "relu" => cx.add1(u(Unary::Relu), &[x]),
        "softsign" => cx.add1(u(Unary::Softsign), &[x]),
        "softplus" => cx.add1(u(Unary::Softplus), &[x]),
        "leakyrelu" => cx.add1(
            u(Unary::LeakyRelu {
                alpha: a.alpha.unwrap_or(0.01),
            }),
            &[x],
        ),
        "thresholdedrelu" => cx.add1(
            u(Unary::ThresholdedRelu {
                alpha: a.alpha.unwrap_or(1.0),
            }),
            &[x],
        ),
        "elu" => cx.add1(
            u(Unary::Elu {
                alpha: a.alpha.unwrap_or(1.0),
            }),
            &[x],
        ),
        "hardsigmoid" => cx.add1(
            u(Unary::HardSigmoid {
                alpha: a.alpha.unwrap_or(0.2),
                beta: a.beta.unwrap_or(0.5),
            }),
            &[x],
        ),
        "affine" => {
            let (al, be) = (
                cx.scalar(a.alpha.unwrap_or(1.0) as f64, dtype),
                cx.scalar(a.beta.unwrap_or(0.0) as f64, dtype),
            );
            let m = cx.bin(Binary::Mul, x, al)?;
            cx.bin(Binary::Add, m, be)
        }
        "scaledtanh" => {
            let (al, be) = (
                cx.scalar(a.alpha.unwrap_or(1.0) as f64, dtype),
                cx.scalar(a.beta.unwrap_or(1.0) as f64, dtype),
            );
            let m = cx.bin(Binary::Mul, x, be)?;
            let t = cx.un(Unary::Tanh, m)?;
            cx.bin(Binary::Mul, t, al)
        }
        other => Err(cx.err(format!("activation '{other}' is not supported"))),
    }
}

/// `x[index]` along axis 0, with that axis dropped.
fn pick(cx: &mut NodeCx<'_, '_>, x: Value, index: usize) -> Result<Value> {
    let s = cx.ty(x).shape.clone();
    if s.is_empty() {
        return Err(cx.err(format!(
            "expected a tensor with a leading direction or time axis, got {}",
            cx.ty(x)
        )));
    }
    let mut starts = vec![0; s.len()];
    starts[0] = index;
    let mut lens = s.clone();
    lens[0] = 1;
    let one = cx.add1(
        Op::Slice {
            starts,
            steps: vec![1; s.len()],
            lens,
        },
        &[x],
    )?;
    cx.add1(
        Op::Reshape {
            shape: s[1..].to_vec(),
        },
        &[one],
    )
}

/// Columns `[k*h, (k+1)*h)` of the last axis.
fn gate(cx: &mut NodeCx<'_, '_>, x: Value, k: usize, h: usize) -> Result<Value> {
    cx.slice_last(x, k * h, 1, h)
}

fn recurrent(cx: &mut NodeCx<'_, '_>, kind: Kind) -> Result<Vec<Value>> {
    let (x, w, r) = (cx.req(0)?, cx.req(1)?, cx.req(2)?);
    let (b, seq_lens, h0) = (cx.input(3)?, cx.konst_ints(4)?, cx.input(5)?);
    let (c0, peep) = if kind == Kind::Lstm {
        (cx.input(6)?, cx.input(7)?)
    } else {
        (None, None)
    };
    let dtype = cx.ty(x).dtype;
    for (i, v) in [(0, x), (1, w), (2, r)] {
        if cx.ty(v).rank() != 3 {
            return Err(cx.err_in(i, format!("expects a 3-D tensor, got {}", cx.ty(v))));
        }
    }
    let layout = cx.int("layout", 0)?;
    let direction = cx.string("direction", "forward")?;
    let hidden = cx.int_opt("hidden_size")?;
    let clip = cx.float_opt("clip")?;
    let input_forget = kind == Kind::Lstm && cx.int("input_forget", 0)? != 0;
    let lbr = kind == Kind::Gru && cx.int("linear_before_reset", 0)? != 0;
    let dirs = if direction == "bidirectional" { 2 } else { 1 };
    if !matches!(direction.as_str(), "forward" | "reverse" | "bidirectional") {
        return Err(cx.err(format!("direction='{direction}' is not supported")));
    }
    let acts = activations(cx, kind, dirs)?;
    // To [seq, batch, input].
    let batch_first = |cx: &mut NodeCx<'_, '_>, v: Value| -> Result<Value> {
        if layout == 1 {
            cx.add1(
                Op::Transpose {
                    perm: vec![1, 0, 2],
                },
                &[v],
            )
        } else {
            Ok(v)
        }
    };
    let x = batch_first(cx, x)?;
    let xs = cx.ty(x).shape.clone();
    let (seq, batch) = (xs[0], xs[1]);
    let ws = cx.ty(w).shape.clone();
    let g = kind.gates();
    let h = ws[1] / g;
    if h == 0 || hidden == Some(0) {
        return Err(cx.err("hidden_size 0 (it must be positive)"));
    }
    if ws[0] != dirs || ws[1] != g * h || hidden.is_some_and(|hs| hs as usize != h) {
        return Err(cx.err_in(
            1,
            format!("W of shape {ws:?} does not fit {dirs} direction(s) of {g} gates"),
        ));
    }
    if let Some(l) = &seq_lens {
        if l.iter().any(|&n| n as usize != seq) {
            return Err(cx.err_in(4, "sequence_lens shorter than the sequence are not supported (outputs would depend on data)"));
        }
    }
    let h0 = h0.map(|v| batch_first(cx, v)).transpose()?;
    let c0 = c0.map(|v| batch_first(cx, v)).transpose()?;
    let zeros = cx.konst_value(mlopt_ir::Tensor::zeros(&mlopt_ir::TensorType::new(
        dtype,
        vec![batch, h],
    )));
    let (mut ys, mut hs, mut cs) = (vec![], vec![], vec![]);
    let per_dir = kind.default_activations().len();
    for d in 0..dirs {
        let reverse = direction == "reverse" || d == 1;
        let wd = pick(cx, w, d)?;
        let wt = cx.add1(Op::Transpose { perm: vec![1, 0] }, &[wd])?;
        let rd = pick(cx, r, d)?;
        let rt = cx.add1(Op::Transpose { perm: vec![1, 0] }, &[rd])?;
        let (wb, rb) = match b {
            Some(b) => {
                let bd = pick(cx, b, d)?;
                (Some(gate(cx, bd, 0, g * h)?), Some(gate(cx, bd, 1, g * h)?))
            }
            None => (None, None),
        };
        // All input projections at once: [seq, batch, g*h].
        let mut xw = cx.add1(Op::MatMul, &[x, wt])?;
        if let Some(wb) = wb {
            xw = cx.bin(Binary::Add, xw, wb)?;
        }
        let ht = match h0 {
            Some(v) => pick(cx, v, d)?,
            None => zeros,
        };
        let ct = match c0 {
            Some(v) => pick(cx, v, d)?,
            None => zeros,
        };
        let cell = Cell {
            kind,
            h,
            dtype,
            clip,
            lbr,
            input_forget,
            acts: &acts[d * per_dir..(d + 1) * per_dir],
            rt,
            rb,
            peep: peep.map(|p| pick(cx, p, d)).transpose()?,
        };
        let (y, hn, cn) = cell.run(cx, xw, (ht, ct), reverse, zeros)?;
        ys.push(y);
        hs.push(hn);
        cs.push(cn);
    }
    let join = |cx: &mut NodeCx<'_, '_>, v: Vec<Value>, axis: usize| -> Result<Value> {
        if v.len() == 1 {
            Ok(v[0])
        } else {
            cx.add1(Op::Concat { axis }, &v)
        }
    };
    let mut y = join(cx, ys, 1)?;
    let mut yh = join(cx, hs, 0)?;
    let mut yc = join(cx, cs, 0)?;
    if layout == 1 {
        y = cx.add1(
            Op::Transpose {
                perm: vec![2, 0, 1, 3],
            },
            &[y],
        )?;
        yh = cx.add1(
            Op::Transpose {
                perm: vec![1, 0, 2],
            },
            &[yh],
        )?;
        yc = cx.add1(
            Op::Transpose {
                perm: vec![1, 0, 2],
            },
            &[yc],
        )?;
    }
    let mut outs = vec![y, yh];
    if kind == Kind::Lstm {
        outs.push(yc);
    }
    Ok(outs)
}

/// One direction's cell: its kind and attributes, its activations, the recurrence weight R^T, its
/// bias and (LSTM) peepholes.
struct Cell<'a> {
    kind: Kind,
    h: usize,
    dtype: mlopt_ir::DType,
    clip: Option<f32>,
    /// GRU's linear_before_reset, LSTM's input_forget.
    lbr: bool,
    input_forget: bool,
    acts: &'a [Act],
    rt: Value,
    rb: Option<Value>,
    peep: Option<Value>,
}

impl Cell<'_> {
    /// The direction over the sequence of input projections `xw` ([seq, batch, g*h]) from the states
    /// `(ht, ct)`, backwards where `reverse`: Y [seq, 1, batch, h] and the last states [1, batch, h].
    fn run(
        &self,
        cx: &mut NodeCx<'_, '_>,
        xw: Value,
        (mut ht, mut ct): (Value, Value),
        reverse: bool,
        zeros: Value,
    ) -> Result<(Value, Value, Value)> {
        let (seq, batch, h) = (cx.ty(xw).shape[0], cx.ty(xw).shape[1], self.h);
        let mut outs = vec![zeros; seq];
        for step in 0..seq {
            let t = if reverse { seq - 1 - step } else { step };
            let xt = pick(cx, xw, t)?;
            (ht, ct) = self.step(cx, xt, ht, ct)?;
            outs[t] = cx.add1(
                Op::Reshape {
                    shape: vec![1, 1, batch, h],
                },
                &[ht],
            )?;
        }
        let y = if seq == 1 {
            outs[0]
        } else {
            cx.add1(Op::Concat { axis: 0 }, &outs)?
        };
        let hn = cx.add1(
            Op::Reshape {
                shape: vec![1, batch, h],
            },
            &[ht],
        )?;
        let cn = cx.add1(
            Op::Reshape {
                shape: vec![1, batch, h],
            },
            &[ct],
        )?;
        Ok((y, hn, cn))
    }

    /// One time step from the input projection `xt` and the states: the new hidden and cell states
    /// (the cell state passes through unchanged but for an LSTM).
    fn step(
        &self,
        cx: &mut NodeCx<'_, '_>,
        xt: Value,
        ht: Value,
        ct: Value,
    ) -> Result<(Value, Value)> {
        match self.kind {
            Kind::Rnn => {
                let s = self.recur(cx, xt, ht)?;
                let s = self.clipped(cx, s)?;
                Ok((apply(cx, &self.acts[0], s)?, ct))
            }
            Kind::Gru => Ok((self.gru(cx, xt, ht)?, ct)),
            Kind::Lstm => self.lstm(cx, xt, ht, ct),
        }
    }

    /// `clip` applied to `v`, where the node sets one.
    fn clipped(&self, cx: &mut NodeCx<'_, '_>, v: Value) -> Result<Value> {
        match self.clip {
            Some(c) => {
                let (lo, hi) = (
                    cx.scalar(-c as f64, self.dtype),
                    cx.scalar(c as f64, self.dtype),
                );
                cx.add1(Op::Clip, &[v, lo, hi])
            }
            None => Ok(v),
        }
    }

    /// x_t + H R^T (+ the recurrence bias).
    fn recur(&self, cx: &mut NodeCx<'_, '_>, xt: Value, ht: Value) -> Result<Value> {
        let hr = cx.add1(Op::MatMul, &[ht, self.rt])?;
        let s = cx.bin(Binary::Add, xt, hr)?;
        match self.rb {
            Some(rb) => cx.bin(Binary::Add, s, rb),
            None => Ok(s),
        }
    }

    fn gru(&self, cx: &mut NodeCx<'_, '_>, xt: Value, ht: Value) -> Result<Value> {
        let (h, a, rt, rb) = (self.h, self.acts, self.rt, self.rb);
        let rt_zr = gate(cx, rt, 0, 2 * h)?;
        let hzr = cx.add1(Op::MatMul, &[ht, rt_zr])?;
        let xzr = gate(cx, xt, 0, 2 * h)?;
        let mut zr = cx.bin(Binary::Add, xzr, hzr)?;
        if let Some(rb) = rb {
            let rbzr = gate(cx, rb, 0, 2 * h)?;
            zr = cx.bin(Binary::Add, zr, rbzr)?;
        }
        let zr = self.clipped(cx, zr)?;
        let zr = apply(cx, &a[0], zr)?;
        let (z, rg) = (gate(cx, zr, 0, h)?, gate(cx, zr, 1, h)?);
        let rh = gate(cx, rt, 2, h)?;
        let rbh = rb.map(|rb| gate(cx, rb, 2, h)).transpose()?;
        let pre = if self.lbr {
            let mut hh = cx.add1(Op::MatMul, &[ht, rh])?;
            if let Some(rbh) = rbh {
                hh = cx.bin(Binary::Add, hh, rbh)?;
            }
            cx.bin(Binary::Mul, rg, hh)?
        } else {
            let rht = cx.bin(Binary::Mul, rg, ht)?;
            let mut hh = cx.add1(Op::MatMul, &[rht, rh])?;
            if let Some(rbh) = rbh {
                hh = cx.bin(Binary::Add, hh, rbh)?;
            }
            hh
        };
        let xh = gate(cx, xt, 2, h)?;
        let s = cx.bin(Binary::Add, xh, pre)?;
        let s = self.clipped(cx, s)?;
        let cand = apply(cx, &a[1], s)?;
        // H = (1 - z) * cand + z * H = cand + z * (H - cand)
        let diff = cx.bin(Binary::Sub, ht, cand)?;
        let zd = cx.bin(Binary::Mul, z, diff)?;
        cx.bin(Binary::Add, cand, zd)
    }

    fn lstm(
        &self,
        cx: &mut NodeCx<'_, '_>,
        xt: Value,
        ht: Value,
        ct: Value,
    ) -> Result<(Value, Value)> {
        let (h, a) = (self.h, self.acts);
        let s = self.recur(cx, xt, ht)?;
        // Gate order i, o, f, c; peepholes P = [Pi, Po, Pf].
        let (mut i, mut o, mut f, c) = (
            gate(cx, s, 0, h)?,
            gate(cx, s, 1, h)?,
            gate(cx, s, 2, h)?,
            gate(cx, s, 3, h)?,
        );
        if let Some(p) = self.peep {
            let (pi, pf) = (gate(cx, p, 0, h)?, gate(cx, p, 2, h)?);
            let (a1, a2) = (cx.bin(Binary::Mul, pi, ct)?, cx.bin(Binary::Mul, pf, ct)?);
            i = cx.bin(Binary::Add, i, a1)?;
            f = cx.bin(Binary::Add, f, a2)?;
        }
        let i = self.clipped(cx, i)?;
        let i = apply(cx, &a[0], i)?;
        let f = if self.input_forget {
            let one = cx.scalar(1.0, self.dtype);
            cx.bin(Binary::Sub, one, i)?
        } else {
            let f = self.clipped(cx, f)?;
            apply(cx, &a[0], f)?
        };
        let c = self.clipped(cx, c)?;
        let c = apply(cx, &a[1], c)?;
        let (fc, ic) = (cx.bin(Binary::Mul, f, ct)?, cx.bin(Binary::Mul, i, c)?);
        let ct = cx.bin(Binary::Add, fc, ic)?;
        if let Some(p) = self.peep {
            let po = gate(cx, p, 1, h)?;
            let a3 = cx.bin(Binary::Mul, po, ct)?;
            o = cx.bin(Binary::Add, o, a3)?;
        }
        let o = self.clipped(cx, o)?;
        let o = apply(cx, &a[0], o)?;
        let hc = apply(cx, &a[2], ct)?;
        Ok((cx.bin(Binary::Mul, o, hc)?, ct))
    }
}
