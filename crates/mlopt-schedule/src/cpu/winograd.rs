//! Winograd F(2x2, 3x3) for 3x3, stride-1, pad-1 convolutions (Lavin & Gray, 2015): each 2x2 block of
//! output comes from a 4x4 block of input with 16 multiplies per (input, output) channel pair instead of
//! 36, so the contraction does 2.25x fewer multiply-adds, at the price of three transforms:
//!
//! - weights, at compile time: U[xi, m, c] = (G g G^T)[xi] for each 3x3 filter g (a new constant);
//! - input: V[n, xi, c, t] = (B^T d B)[xi] for each 4x4 tile d of the zero-padded input;
//! - 16 independent GEMMs M[n, xi] = U[xi] @ V[n, xi] ([M x C] @ [C x tiles]), written as their
//!   algorithm, which `gemm.rs` then register-tiles like any other;
//! - output: y = A^T M A for each tile, and the convolution's epilogue (bias, activation, casts) on it.
//!
//! It rewrites a convolution nest lowering wrote (`contraction.rs` and `window.rs` recognise it) before
//! the nests are tiled. Applies to ungrouped convolutions by a constant f32 weight with at least 16
//! input and output channels, an even output size and a tile count the vector lanes divide (so the GEMMs
//! tile). Whether it is used is `Winograd`: by default where the cost model (`mlopt_cost::winograd::pays`)
//! rates it faster than the direct implicit GEMM. The saving grows with the
//! channel counts (the GEMMs shrink by c x m, the transforms cost c + m per tile): on this machine it
//! pays from 64 channels (256 channels at 16x16: 2.05 ms against 3.4 ms), and not at 32. The
//! results are checked against the interpreter (within 1e-5 of the output's scale; the rounding differs
//! from a direct convolution by a few ulps of the largest partial sum).

use super::layout::{bound_weight, drop_unbound_weights};
use super::padded::{padded_phases, Plane};
use super::tiler::{nest, tile_for, Builder};
use crate::class::Class;
use crate::contraction::{store_at, Contraction};
use crate::error::Result;
use crate::window::Window;
use crate::Options;
use mlopt_cost::winograd::pays;
use mlopt_kir::analysis::buffer_loads;
use mlopt_kir::index::{delinear, linear};
use mlopt_kir::{BinOp, BufId, Elem, Expr, LoopKind, Place, Program, Space, Stmt, Var, Weight};
use mlopt_target::CpuTarget;
use std::collections::HashMap;
use std::sync::Arc;

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

/// When 3x3 convolutions run by Winograd.
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

/// Rewrites every convolution nest of `p` that Winograd applies to, and pays for under `o.winograd`,
/// into its transforms and GEMMs (`classes[kernel][statement]` say which nests are convolutions, and
/// get the new nests' classes); the 3x3 weights are replaced by their transforms.
pub fn rewrite(
    p: &mut Program,
    classes: &mut [Vec<Class>],
    t: &CpuTarget,
    o: &Options,
) -> Result<()> {
    if o.winograd == Winograd::Never {
        return Ok(());
    }
    for (ki, classes) in classes.iter_mut().enumerate() {
        let loads = buffer_loads(&p.kernels[ki].body);
        let body = std::mem::take(&mut p.kernels[ki].body);
        let mut out = Vec::with_capacity(body.len());
        let mut out_classes = Vec::with_capacity(body.len());
        for (st, class) in body.into_iter().zip(std::mem::take(classes)) {
            match conv3x3(p, ki, &class, t, o, &loads)? {
                Some(stmts) => {
                    for s in stmts {
                        out_classes.push(Class::of(&mut p.kernels[ki], &s));
                        out.push(s);
                    }
                }
                None => {
                    out.push(st);
                    out_classes.push(class);
                }
            }
        }
        p.kernels[ki].body = out;
        *classes = out_classes;
    }
    drop_unbound_weights(p);
    Ok(())
}

/// A 3x3, stride-1, pad-1 convolution: its contraction, window, weight buffer, the loops over images
/// and the sizes.
struct Conv3x3<'c> {
    c: &'c Contraction,
    w: &'c Window,
    weight: BufId,
    images: Vec<(Var, u64)>,
    /// Images, input channels, output height and width, output channels.
    sizes: (u64, u64, u64, u64, u64),
}

/// The Winograd form of a nest of class `class` in kernel `ki`, when it is a convolution Winograd
/// applies to and pays for; None otherwise (the nest is left as it is).
fn conv3x3(
    p: &mut Program,
    ki: usize,
    class: &Class,
    t: &CpuTarget,
    o: &Options,
    loads: &HashMap<BufId, usize>,
) -> Result<Option<Vec<Stmt>>> {
    let Some(conv) = shape(class, loads) else {
        return Ok(None);
    };
    let (_, ch, h, wd, m) = conv.sizes;
    let lanes = t.lanes();
    let tiles = (h / 2) * (wd / 2);
    let applies = ch >= 16
        && m >= 16
        && h % 2 == 0
        && wd % 2 == 0
        && tiles % u64::from(lanes) == 0
        && tile_for(&o.tiles, t, m, tiles, ch).is_some();
    if !applies || (o.winograd == Winograd::Auto && !pays(t, ch, m, h, wd)) {
        return Ok(None);
    }
    let Some((si, pi, wi)) = bound_weight(p, ki, conv.weight) else {
        return Ok(None);
    };
    let weight = &p.weights[wi];
    if weight.elem != Elem::F32 || weight.dims != [m, ch, 3, 3] {
        return Ok(None);
    }
    let f32s: Vec<f32> = weight
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let u = Weight {
        name: format!("{}.winograd", weight.name),
        elem: Elem::F32,
        dims: vec![16, m, ch],
        data: Arc::new(transform_weights(&f32s, m as usize, ch as usize)),
    };
    p.kernels[ki].bufs[conv.weight.0 as usize].dims = u.dims.clone();
    p.weights.push(u);
    p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);
    let k = &mut p.kernels[ki];
    k.schedule.push(mlopt_kir::ScheduleStep::Winograd);
    let mut b = Builder { k, target: t };
    winograd(&mut b, &conv).map(Some)
}

/// The convolution of class `class` when it has Winograd's shape: one row loop (the output channels),
/// K the input channels by a 3x3 window of stride 1, dilation 1 and padding 1 on both axes, the output
/// as large as the input, and the operand the rows read a constant `W[m, c, kh, kw]` read nowhere else.
fn shape<'c>(class: &'c Class, loads: &HashMap<BufId, usize>) -> Option<Conv3x3<'c>> {
    let Class::Convolution(c, w) = class else {
        return None;
    };
    if c.sum != mlopt_kir::Elem::F32 {
        return None;
    }
    let [(row, m)] = c.rows[..] else { return None };
    let [(ci, ch), (kh, 3), (kw, 3)] = c.red[..] else {
        return None;
    };
    c.store()?;
    let same = |a: &crate::window::Axis| {
        a.stride == 1 && a.dilation == 1 && a.pad == 1 && a.guarded && a.len == a.outs as i64
    };
    if w.axes.len() != 2 || !w.axes.iter().all(same) || w.fill != 0.0 {
        return None;
    }
    let Expr::Load(weight, ix) = &c.a else {
        return None;
    };
    let by_var = [row, ci, kh, kw].map(Expr::var);
    if ix[..] != by_var[..] || loads.get(weight) != Some(&1) {
        return None;
    }
    let images: Vec<(Var, u64)> = c
        .batch
        .iter()
        .chain(
            c.cols
                .iter()
                .filter(|(v, _)| !w.axes.iter().any(|a| a.out == *v)),
        )
        .copied()
        .collect();
    let n = images.iter().map(|(_, e)| *e).product();
    let sizes = (n, ch, w.axes[0].outs, w.axes[1].outs, m);
    Some(Conv3x3 {
        weight: *weight,
        c,
        w,
        images,
        sizes,
    })
}

/// The transforms and GEMMs of `conv`: a padded copy of the input, V, the 16 GEMMs into M, and the
/// output transform with the convolution's epilogue.
fn winograd(b: &mut Builder, conv: &Conv3x3) -> Result<Vec<Stmt>> {
    let Conv3x3 { c, w, images, .. } = conv;
    let (n, ch, h, wd, m) = conv.sizes;
    let (th, tw) = (h / 2, wd / 2);
    let tiles = th * tw;
    let image_ext: Vec<i64> = images.iter().map(|(_, e)| *e as i64).collect();
    // The algorithm's image loops at image `i`.
    let image_at = |i: &Expr| -> Vec<(Var, Expr)> {
        images
            .iter()
            .map(|(v, _)| *v)
            .zip(delinear(i.clone(), &image_ext))
            .collect()
    };
    let ci = c.red[0].0;
    let mut stmts = Vec::new();
    let xp = padded_phases(
        b,
        [n, ch],
        &[h as i64, wd as i64],
        &[1, 1, 1, 1],
        Plane::Phases(1),
        0.0,
        &mut |_, lead, pos| {
            let mut by = image_at(&lead[0]);
            by.push((ci, lead[1].clone()));
            Ok(w.input_at(&w.input.subst_all(&by), pos))
        },
        &mut stmts,
    )?;
    let k = b.kernel();
    let v = k.buf(
        format!("wv{}", k.bufs.len()),
        Elem::F32,
        vec![n, 16, ch, tiles],
        Space::Local,
    );
    // Input transform: one 4x4 tile of the padded input -> 16 values.
    stmts.extend(nest(b, "v", &[n, ch, th, tw], |_, ix| {
        let t = linear(&ix[2..], &[th as i64, tw as i64]);
        let mut d = Vec::with_capacity(16);
        for i in 0..4 {
            for j in 0..4 {
                let r = Expr::add(Expr::mul(ix[2].clone(), Expr::int(2)), Expr::int(i));
                let q = Expr::add(Expr::mul(ix[3].clone(), Expr::int(2)), Expr::int(j));
                d.push(Expr::load(xp, vec![ix[0].clone(), ix[1].clone(), r, q]));
            }
        }
        Ok((0..4)
            .flat_map(|ai| (0..4).map(move |bi| (ai, bi)))
            .map(|(ai, bi)| {
                let terms = (0..16)
                    .map(|k| (BT[ai][k / 4] * BT[bi][k % 4], d[k].clone()))
                    .collect();
                let xi = Expr::int((ai * 4 + bi) as i64);
                Stmt::Store {
                    buf: v,
                    index: vec![ix[0].clone(), xi, ix[1].clone(), t.clone()],
                    value: combine(terms),
                }
            })
            .collect())
    })?);
    // 16 GEMMs per image, written as their algorithm: `gemm.rs` tiles them.
    let k = b.kernel();
    let mm = k.buf(
        format!("wm{}", k.bufs.len()),
        Elem::F32,
        vec![n, 16, m, tiles],
        Space::Local,
    );
    let acc = k.buf(
        format!("wacc{}", k.bufs.len()),
        Elem::F32,
        vec![],
        Space::Local,
    );
    let u = conv.weight;
    stmts.extend(nest(b, "g", &[n, 16, m, tiles], |b, ix| {
        let kc = b.fresh("c");
        let product = Expr::fma(
            Expr::load(u, vec![ix[1].clone(), ix[2].clone(), Expr::var(kc)]),
            Expr::load(
                v,
                vec![ix[0].clone(), ix[1].clone(), Expr::var(kc), ix[3].clone()],
            ),
            Expr::load(acc, vec![]),
        );
        let update = Stmt::Store {
            buf: acc,
            index: vec![],
            value: product,
        };
        Ok(vec![
            Stmt::Store {
                buf: acc,
                index: vec![],
                value: Expr::f32(0.0),
            },
            Stmt::for_(kc, ch, LoopKind::Serial, vec![update]),
            Stmt::Store {
                buf: mm,
                index: ix.to_vec(),
                value: Expr::load(acc, vec![]),
            },
        ])
    })?);
    // Output transform: 16 values -> one 2x2 block of output, through the convolution's epilogue.
    let store = c.store().ok_or_else(|| {
        crate::ScheduleError::Internal("a recognised convolution lost its store".into())
    })?;
    let (oh, ow) = (w.axes[0].out, w.axes[1].out);
    let row = c.rows[0].0;
    stmts.extend(nest(b, "o", &[n, m, th, tw], |_, ix| {
        let t = linear(&ix[2..], &[th as i64, tw as i64]);
        let mv: Vec<Expr> = (0..16)
            .map(|k| {
                Expr::load(
                    mm,
                    vec![ix[0].clone(), Expr::int(k), ix[1].clone(), t.clone()],
                )
            })
            .collect();
        let mut out = Vec::with_capacity(4);
        for p in 0..2 {
            for q in 0..2 {
                let terms = (0..16)
                    .map(|k| (AT[p][k / 4] * AT[q][k % 4], mv[k].clone()))
                    .collect();
                let at =
                    |i: &Expr, d: i64| Expr::add(Expr::mul(i.clone(), Expr::int(2)), Expr::int(d));
                let mut by = image_at(&ix[0]);
                by.extend([
                    (row, ix[1].clone()),
                    (oh, at(&ix[2], p as i64)),
                    (ow, at(&ix[3], q as i64)),
                ]);
                out.push(store_at(
                    (store.0, &store.1, &store.2),
                    c.acc,
                    &by,
                    &combine(terms),
                ));
            }
        }
        Ok(out)
    })?);
    Ok(stmts)
}
