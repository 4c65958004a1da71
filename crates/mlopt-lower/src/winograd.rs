//! Winograd F(2x2, 3x3) for 3x3, stride-1, pad-1 convolutions (Lavin & Gray, 2015): each 2x2 block of
//! output comes from a 4x4 block of input with 16 multiplies per (input, output) channel pair instead of
//! 36, so the contraction does 2.25x fewer multiply-adds, at the price of three transforms:
//!
//! - weights, at compile time: U[xi, m, c] = (G g G^T)[xi] for each 3x3 filter g (a new constant);
//! - input: V[n, xi, c, t] = (B^T d B)[xi] for each 4x4 tile d of the zero-padded input;
//! - 16 independent GEMMs M[n, xi] = U[xi] @ V[n, xi] ([M x C] @ [C x tiles]), written as their
//!   algorithm and register-tiled by the CPU schedule (`schedule/cpu_gemm.rs`);
//! - output: y = A^T M A for each tile, plus the bias, and the kernel's epilogue.
//!
//! Applies to convolutions with at least 16 input and output channels, an even output size and a tile
//! count the vector lanes divide (so the GEMMs tile). Whether it is used is `Winograd`: by default where
//! the cost model (`mlopt_cost::winograd::pays`) rates it faster than the direct implicit GEMM. The saving grows with the
//! channel counts (the GEMMs shrink by c x m, the transforms cost c + m per tile): on this machine it
//! pays from 64 channels (256 channels at 16x16: 2.05 ms against 3.4 ms), and not at 32. The
//! results are checked against the interpreter with the rest of lowering (within 1e-5 of the output's
//! scale; the rounding differs from a direct convolution by a few ulps of the largest partial sum).

use crate::anchor::{dot, get};
use crate::contract;
use crate::elementwise::convert;
use crate::error::Result;
use crate::kernel::Lowerer;
use crate::window::padded_input;
use mlopt_cost::winograd::pays;
use mlopt_ir::{ConvAttrs, Value};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt};

const BT: [[f64; 4]; 4] = [
    [1.0, 0.0, -1.0, 0.0],
    [0.0, 1.0, 1.0, 0.0],
    [0.0, -1.0, 1.0, 0.0],
    [0.0, 1.0, 0.0, -1.0],
];
const G: [[f64; 3]; 4] = [
    [1.0, 0.0, 0.0],
    [0.5, 0.5, 0.5],
    [0.5, -0.5, 0.5],
    [0.0, 0.0, 1.0],
];
const AT: [[f64; 4]; 2] = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];

/// Σ coef * term over the non-zero coefficients (±1 becomes an add or a subtract).
fn combine(terms: Vec<(f64, Expr)>) -> Expr {
    let mut acc: Option<Expr> = None;
    for (c, e) in terms.into_iter().filter(|(c, _)| *c != 0.0) {
        let (neg, mag) = (c < 0.0, c.abs());
        let e = if mag == 1.0 {
            e
        } else {
            Expr::bin(BinOp::Mul, Expr::f32(mag), e)
        };
        acc = Some(match (acc, neg) {
            (None, false) => e,
            (None, true) => Expr::un(mlopt_kir::UnOp::Neg, e),
            (Some(a), false) => Expr::bin(BinOp::Add, a, e),
            (Some(a), true) => Expr::bin(BinOp::Sub, a, e),
        });
    }
    acc.unwrap_or_else(|| Expr::f32(0.0))
}

/// The weight transform: [M, C, 3, 3] f32 -> U [16, M, C] as little-endian bytes.
fn transform_weights(w: &[f32], m: usize, c: usize) -> Vec<u8> {
    let mut u = vec![0f32; 16 * m * c];
    for mo in 0..m {
        for ci in 0..c {
            let g = |i: usize, j: usize| w[((mo * c + ci) * 3 + i) * 3 + j] as f64;
            for a in 0..4 {
                for b in 0..4 {
                    let mut s = 0.0;
                    for i in 0..3 {
                        for j in 0..3 {
                            s += G[a][i] * g(i, j) * G[b][j];
                        }
                    }
                    u[((a * 4 + b) * m + mo) * c + ci] = s as f32;
                }
            }
        }
    }
    u.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// When 3x3 convolutions are lowered by Winograd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Winograd {
    /// Where the cost model (`mlopt_cost::winograd::pays`) rates it faster than the direct kernel.
    #[default]
    Auto,
    /// Every eligible convolution.
    Always,
    Never,
}

impl std::str::FromStr for Winograd {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Winograd::Auto),
            "always" => Ok(Winograd::Always),
            "never" => Ok(Winograd::Never),
            _ => Err(format!("`{s}`: expected auto, always or never")),
        }
    }
}

/// Lowers the convolution by Winograd when it applies; None otherwise.
pub fn conv3x3(
    l: &mut Lowerer,
    x: Value,
    w: Value,
    bias: Option<Value>,
    a: &ConvAttrs,
    out: &[u64],
    out_t: Elem,
    dst: BufId,
) -> Result<Option<Vec<Stmt>>> {
    let Some(lanes) = l.lanes.filter(|_| l.winograd != Winograd::Never) else {
        return Ok(None);
    };
    let (xs, ws) = (l.ty(x).shape.clone(), l.ty(w).shape.clone());
    let Some(wt) = l.g.const_value(w).cloned() else {
        return Ok(None);
    };
    let shape_ok = xs.len() == 4
        && ws[2..] == [3, 3]
        && a.group == 1
        && a.strides == [1, 1]
        && a.dilations == [1, 1]
        && a.pads == [1, 1, 1, 1];
    if !shape_ok || wt.dtype() != mlopt_ir::DType::F32 || l.ty(x).dtype != mlopt_ir::DType::F32 {
        return Ok(None);
    }
    let (n, c, h, wd, m) = (xs[0] as u64, xs[1] as u64, out[2], out[3], ws[0] as u64);
    let (th, tw) = (h / 2, wd / 2);
    let tiles = th * tw;
    let applies = c >= 16 && m >= 16 && h % 2 == 0 && wd % 2 == 0 && tiles % lanes as u64 == 0;
    let wanted = l.winograd == Winograd::Always || pays(c, m, h, wd, lanes);
    // (The schedule tiles the GEMMs; Winograd is chosen only where they have a tile.)
    if !applies || !wanted || contract::choose(l, m, tiles, c).is_none() {
        return Ok(None);
    }
    l.k.schedule.push(mlopt_kir::ScheduleStep::Winograd);

    let mut stmts = Vec::new();
    let xp = padded_input(l, x, &a.pads, &mut stmts)?;
    let u = l.weight(mlopt_kir::Weight {
        name: format!("{}.winograd", l.g.node(w.node).name),
        elem: Elem::F32,
        dims: vec![16, m, c],
        data: std::sync::Arc::new(transform_weights(
            &wt.to_f64_vec()
                .iter()
                .map(|v| *v as f32)
                .collect::<Vec<_>>(),
            m as usize,
            c as usize,
        )),
    });
    // Input transform: one 4x4 tile of the padded input -> 16 values.
    let v = l.k.buf(
        format!("wv{}", l.k.bufs.len()),
        Elem::F32,
        vec![n, 16, c, tiles],
        Space::Local,
    );
    stmts.extend(l.nest("v", &[n, c, th, tw], |l, ix| {
        let t = Expr::add(
            Expr::mul(ix[2].clone(), Expr::int(tw as i64)),
            ix[3].clone(),
        );
        let mut d = Vec::with_capacity(16);
        for i in 0..4 {
            for j in 0..4 {
                let (r, q) = (
                    Expr::add(Expr::mul(ix[2].clone(), Expr::int(2)), Expr::int(i)),
                    Expr::add(Expr::mul(ix[3].clone(), Expr::int(2)), Expr::int(j)),
                );
                let at = vec![ix[0].clone(), ix[1].clone(), r, q];
                d.push(match xp {
                    Some(p) => Expr::load(p, at),
                    None => get(l, x, &at, Elem::F32)?,
                });
            }
        }
        let mut out = Vec::with_capacity(16);
        for ai in 0..4 {
            for bi in 0..4 {
                let terms = (0..16)
                    .map(|k| (BT[ai][k / 4] * BT[bi][k % 4], d[k].clone()))
                    .collect();
                out.push(Stmt::Store {
                    buf: v,
                    index: vec![
                        ix[0].clone(),
                        Expr::int((ai * 4 + bi) as i64),
                        ix[1].clone(),
                        t.clone(),
                    ],
                    value: combine(terms),
                });
            }
        }
        Ok(out)
    })?);
    // 16 GEMMs per image, written as their algorithm: the CPU schedule tiles them (`schedule/cpu_gemm.rs`).
    let mm = l.k.buf(
        format!("wm{}", l.k.bufs.len()),
        Elem::F32,
        vec![n, 16, m, tiles],
        Space::Local,
    );
    stmts.extend(l.nest("g", &[n, 16, m, tiles], |l, ix| {
        let f = dot(l, &[c], |_, k| {
            Ok((
                Expr::load(u, vec![ix[1].clone(), ix[2].clone(), k[0].clone()]),
                Expr::load(
                    v,
                    vec![ix[0].clone(), ix[1].clone(), k[0].clone(), ix[3].clone()],
                ),
            ))
        })?;
        let mut s = f.stmts.clone();
        s.push(Stmt::Store {
            buf: mm,
            index: ix.to_vec(),
            value: f.get(),
        });
        Ok(s)
    })?);
    // Output transform: 16 values -> one 2x2 block of output, plus the bias.
    stmts.extend(l.nest("o", &[n, m, th, tw], |l, ix| {
        let t = Expr::add(
            Expr::mul(ix[2].clone(), Expr::int(tw as i64)),
            ix[3].clone(),
        );
        let mv: Vec<Expr> = (0..16)
            .map(|k| {
                Expr::load(
                    mm,
                    vec![ix[0].clone(), Expr::int(k), ix[1].clone(), t.clone()],
                )
            })
            .collect();
        let b = match bias {
            Some(bv) => Some(get(l, bv, std::slice::from_ref(&ix[1]), Elem::F32)?),
            None => None,
        };
        let mut out = Vec::with_capacity(4);
        for p in 0..2 {
            for q in 0..2 {
                let terms = (0..16)
                    .map(|k| (AT[p][k / 4] * AT[q][k % 4], mv[k].clone()))
                    .collect();
                let mut y = combine(terms);
                if let Some(b) = &b {
                    y = Expr::bin(BinOp::Add, y, b.clone());
                }
                let (r, s) = (
                    Expr::add(Expr::mul(ix[2].clone(), Expr::int(2)), Expr::int(p as i64)),
                    Expr::add(Expr::mul(ix[3].clone(), Expr::int(2)), Expr::int(q as i64)),
                );
                out.push(Stmt::Store {
                    buf: dst,
                    index: vec![ix[0].clone(), ix[1].clone(), r, s],
                    value: convert(y, Elem::F32, out_t),
                });
            }
        }
        Ok(out)
    })?);
    Ok(Some(stmts))
}
