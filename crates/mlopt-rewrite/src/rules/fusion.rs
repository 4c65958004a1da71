//! Fusion patterns that become one op: GELU written out with Erf (as PyTorch and HF exporters emit it) is
//! recognised as `gelu` (and its tanh approximation as `gelu[tanh=1]`), a written-out max-subtracted Softmax as
//! `softmax`, LayerNormalization written out with two means (as exporters before opset 17 emit it)
//! as `layer_norm` (with constant scale and bias absorbed), and MatMul -> scale -> mask -> Softmax -> MatMul
//! as `attention`. Which ops share a kernel is not a rule but the fusion pass's cost decision
//! (`fuse.rs`): elementwise chains, epilogues of MatMul/Gemm/Conv, and row reductions with their prologue
//! and epilogue all come from there.

use super::{add, ops, scan, splat};
use crate::lang::{EGraph, Head, Rewrite};
use egg::Id;
use mlopt_ir::{Binary, Op, Unary};

pub fn rules() -> Vec<Rewrite> {
    vec![
        scan(
            "gelu-erf",
            |eg, id| !gelu_inputs(eg, id, erf_core).is_empty(),
            |eg, id| {
                gelu_inputs(eg, id, erf_core)
                    .into_iter()
                    .filter_map(|x| add(eg, Op::Unary(Unary::Gelu { tanh: false }), vec![x]))
                    .collect()
            },
        ),
        scan(
            "gelu-tanh",
            |eg, id| !gelu_inputs(eg, id, tanh_core).is_empty(),
            |eg, id| {
                gelu_inputs(eg, id, tanh_core)
                    .into_iter()
                    .filter_map(|x| add(eg, Op::Unary(Unary::Gelu { tanh: true }), vec![x]))
                    .collect()
            },
        ),
        scan(
            "softmax-decomposed",
            |eg, id| !softmax_parts(eg, id).is_empty(),
            |eg, id| {
                softmax_parts(eg, id)
                    .into_iter()
                    .filter_map(|(x, axis)| add(eg, Op::Softmax { axis }, vec![x]))
                    .collect()
            },
        ),
        scan(
            "layernorm-decomposed",
            |eg, id| !layernorm_parts(eg, id).is_empty(),
            |eg, id| {
                layernorm_parts(eg, id)
                    .into_iter()
                    .filter_map(|(x, axis, epsilon)| {
                        let t = super::ty(eg, x)?;
                        let ones = super::konst(
                            eg,
                            mlopt_ir::Tensor::full(
                                &mlopt_ir::TensorType::new(t.dtype, t.shape[axis..].to_vec()),
                                1.0,
                            ),
                        );
                        let none = super::absent(eg);
                        let ln = add(eg, Op::LayerNorm { axis, epsilon }, vec![x, ones, none])?;
                        Some(super::proj(eg, ln, 0))
                    })
                    .collect()
            },
        ),
        scan(
            "layernorm-scale",
            |eg, id| !layernorm_affine(eg, id, Binary::Mul).is_empty(),
            |eg, id| {
                layernorm_affine(eg, id, Binary::Mul)
                    .into_iter()
                    .filter_map(|(ln, args, gamma)| {
                        let scale = add(eg, Op::Binary(Binary::Mul), vec![args[1], gamma])?;
                        let bias = super::or_absent(eg, args.get(2).copied());
                        let new = add(eg, ln, vec![args[0], scale, bias])?;
                        Some(super::proj(eg, new, 0))
                    })
                    .collect()
            },
        ),
        scan(
            "layernorm-bias",
            |eg, id| !layernorm_affine(eg, id, Binary::Add).is_empty(),
            |eg, id| {
                layernorm_affine(eg, id, Binary::Add)
                    .into_iter()
                    .filter_map(|(ln, args, beta)| {
                        if args.get(2).is_some_and(|b| !eg[*b].data.types.is_empty()) {
                            return None;
                        }
                        let new = add(eg, ln, vec![args[0], args[1], beta])?;
                        Some(super::proj(eg, new, 0))
                    })
                    .collect()
            },
        ),
        scan(
            "attention",
            |eg, id| !attention_parts(eg, id).is_empty(),
            |eg, id| {
                attention_parts(eg, id)
                    .into_iter()
                    .filter_map(|a| {
                        let mask = super::or_absent(eg, a.mask);
                        add(
                            eg,
                            Op::Attention { scale: a.scale },
                            vec![a.q, a.kt, a.v, mask],
                        )
                    })
                    .collect()
            },
        ),
    ]
}

/// `exp(x - max(x)) / sum(exp(x - max(x)))` over one axis (keepdims): (x, axis). Only the max-subtracted form:
/// without it, large inputs overflow to inf/inf where Softmax does not, and the rewrite would change results.
fn softmax_parts(eg: &EGraph, id: Id) -> Vec<(Id, usize)> {
    let same = |a: Id, b: Id| eg.find(a) == eg.find(b);
    let reduce = |c: Id, kind: mlopt_ir::ReduceKind| -> Vec<(Id, Vec<usize>)> {
        ops(eg, c)
            .into_iter()
            .filter_map(|(o, ch)| match o {
                Op::Reduce {
                    kind: k,
                    axes,
                    keepdims: true,
                } if k == kind && axes.len() == 1 => Some((ch[0], axes)),
                _ => None,
            })
            .collect()
    };
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        if o != Op::Binary(Binary::Div) {
            continue;
        }
        let (e, s) = (c[0], c[1]);
        for (se, axes) in reduce(s, mlopt_ir::ReduceKind::Sum) {
            if !same(se, e) {
                continue;
            }
            for (_, ex) in ops(eg, e)
                .into_iter()
                .filter(|(o, _)| *o == Op::Unary(Unary::Exp))
            {
                for (_, sub) in ops(eg, ex[0])
                    .into_iter()
                    .filter(|(o, _)| *o == Op::Binary(Binary::Sub))
                {
                    if reduce(sub[1], mlopt_ir::ReduceKind::Max)
                        .into_iter()
                        .any(|(mx, maxes)| same(mx, sub[0]) && maxes == axes)
                    {
                        out.push((sub[0], axes[0]));
                    }
                }
            }
        }
    }
    out
}

/// `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)` over the trailing axes `axis..` (the square as
/// `d * d` or `d ^ 2`, eps on either side): (x, axis, eps).
fn layernorm_parts(eg: &EGraph, id: Id) -> Vec<(Id, usize, f32)> {
    let mean_of = |c: Id| -> Vec<(Id, Vec<usize>)> {
        ops(eg, c)
            .into_iter()
            .filter_map(|(o, ch)| match o {
                Op::Reduce {
                    kind: mlopt_ir::ReduceKind::Mean,
                    axes,
                    keepdims: true,
                } => Some((ch[0], axes)),
                _ => None,
            })
            .collect()
    };
    let same = |a: Id, b: Id| eg.find(a) == eg.find(b);
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        if o != Op::Binary(Binary::Div) {
            continue;
        }
        let (d, den) = (c[0], c[1]);
        for (_, sc) in ops(eg, d)
            .into_iter()
            .filter(|(o, _)| *o == Op::Binary(Binary::Sub))
        {
            let x = sc[0];
            let Some(rank) = super::ty(eg, x).map(|t| t.rank()) else {
                continue;
            };
            for (mx, axes) in mean_of(sc[1]) {
                let trailing = !axes.is_empty()
                    && axes
                        .iter()
                        .enumerate()
                        .all(|(i, a)| *a == rank - axes.len() + i);
                if !same(mx, x) || !trailing {
                    continue;
                }
                for (_, sq) in ops(eg, den)
                    .into_iter()
                    .filter(|(o, _)| *o == Op::Unary(Unary::Sqrt))
                {
                    for (v, e) in pairs(eg, sq[0], Binary::Add) {
                        let Some(eps) = splat(eg, e)
                            .filter(|_| super::ty(eg, e).is_some_and(|t| t.numel() == 1))
                        else {
                            continue;
                        };
                        for (p, vaxes) in mean_of(v) {
                            let squares = ops(eg, p).into_iter().any(|(po, pc)| match po {
                                Op::Binary(Binary::Mul) => same(pc[0], d) && same(pc[1], d),
                                Op::Binary(Binary::Pow) => {
                                    same(pc[0], d) && splat(eg, pc[1]) == Some(2.0)
                                }
                                _ => false,
                            });
                            if squares && vaxes == axes {
                                out.push((x, axes[0], eps as f32));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// `op(layer_norm(x, s, b).0, c)` (either order) with a constant c: (the LayerNorm op, [x, s, b], c).
fn layernorm_affine(eg: &EGraph, id: Id, op: Binary) -> Vec<(Op, Vec<Id>, Id)> {
    let mut out = vec![];
    for (n, c) in pairs(eg, id, op) {
        if !super::is_const(eg, c) {
            continue;
        }
        for p in eg[n].nodes.iter().filter(|p| p.head == Head::Proj(0)) {
            for (ln, args) in ops(eg, p.children[0]) {
                if matches!(ln, Op::LayerNorm { .. }) && super::is_const(eg, args[1]) {
                    out.push((ln, args.clone(), c));
                }
            }
        }
    }
    out
}

/// The operands of `matmul(softmax(q @ kt * scale + mask), v)`.
struct AttentionParts {
    q: Id,
    kt: Id,
    v: Id,
    mask: Option<Id>,
    scale: f32,
}

/// Every way class `id` is `matmul(softmax(matmul(q, kt) [* s | / s] [+ mask]), v)` with the softmax over
/// the last axis and s a scalar constant.
fn attention_parts(eg: &EGraph, id: Id) -> Vec<AttentionParts> {
    let mut out = vec![];
    let scalar = |c: Id| {
        super::ty(eg, c)
            .is_some_and(|t| t.numel() == 1)
            .then(|| splat(eg, c))
            .flatten()
    };
    for (o, c) in ops(eg, id) {
        if o != Op::MatMul {
            continue;
        }
        let v = c[1];
        for (so, sc) in ops(eg, c[0]) {
            let Op::Softmax { axis } = so else { continue };
            if super::ty(eg, sc[0]).is_none_or(|t| t.rank() != axis + 1) {
                continue;
            }
            // Z = Y + mask (either order) or Y.
            let mut ys: Vec<(Id, Option<Id>)> = vec![(sc[0], None)];
            ys.extend(
                pairs(eg, sc[0], Binary::Add)
                    .into_iter()
                    .map(|(y, m)| (y, Some(m))),
            );
            for (y, mask) in ys {
                // Y = S * s, s * S, S / s, or S.
                let mut ss: Vec<(Id, f64)> = vec![(y, 1.0)];
                ss.extend(
                    pairs(eg, y, Binary::Mul)
                        .into_iter()
                        .filter_map(|(s, k)| Some((s, scalar(k)?))),
                );
                ss.extend(
                    ops(eg, y)
                        .into_iter()
                        .filter(|(o, _)| *o == Op::Binary(Binary::Div))
                        .filter_map(|(_, d)| Some((d[0], 1.0 / scalar(d[1])?))),
                );
                for (s, scale) in ss {
                    for (mo, mc) in ops(eg, s) {
                        if mo == Op::MatMul {
                            out.push(AttentionParts {
                                q: mc[0],
                                kt: mc[1],
                                v,
                                mask,
                                scale: scale as f32,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

fn near(v: Option<f64>, want: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() < 1e-5 * want.abs().max(1.0))
}

/// The binary `b` nodes of class `id` as operand pairs, in both orders.
fn pairs(eg: &EGraph, id: Id, b: Binary) -> Vec<(Id, Id)> {
    ops(eg, id)
        .into_iter()
        .filter(|(o, _)| *o == Op::Binary(b))
        .flat_map(|(_, c)| [(c[0], c[1]), (c[1], c[0])])
        .collect()
}

/// Whether class `e` is `1 + erf(x / sqrt 2)` (or `x * (1/sqrt 2)`, either operand order).
fn erf_core(eg: &EGraph, e: Id, x: Id) -> bool {
    pairs(eg, e, Binary::Add).into_iter().any(|(erf, one)| {
        near(splat(eg, one), 1.0)
            && ops(eg, erf).into_iter().any(|(o, c)| {
                o == Op::Unary(Unary::Erf)
                    && (pairs(eg, c[0], Binary::Div).into_iter().any(|(a, s)| {
                        eg.find(a) == eg.find(x) && near(splat(eg, s), std::f64::consts::SQRT_2)
                    }) || pairs(eg, c[0], Binary::Mul).into_iter().any(|(a, s)| {
                        eg.find(a) == eg.find(x)
                            && near(splat(eg, s), std::f64::consts::FRAC_1_SQRT_2)
                    }))
            })
    })
}

/// Whether class `e` is `1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))` (operands in either order, the cube as
/// `x ^ 3`, `x * (x * x)` or `(x * x) * x`), GELU's tanh approximation as GPT-2 style models write it.
fn tanh_core(eg: &EGraph, e: Id, x: Id) -> bool {
    let is_x = |c: Id| eg.find(c) == eg.find(x);
    let square = |c: Id| {
        pairs(eg, c, Binary::Mul)
            .into_iter()
            .any(|(a, b)| is_x(a) && is_x(b))
    };
    let cube = |c: Id| {
        ops(eg, c).into_iter().any(|(o, ch)| {
            o == Op::Binary(Binary::Pow) && is_x(ch[0]) && splat(eg, ch[1]) == Some(3.0)
        }) || pairs(eg, c, Binary::Mul)
            .into_iter()
            .any(|(a, b)| is_x(a) && square(b))
    };
    let inner = |u: Id| {
        pairs(eg, u, Binary::Add).into_iter().any(|(a, t)| {
            is_x(a)
                && pairs(eg, t, Binary::Mul)
                    .into_iter()
                    .any(|(k, c3)| near(splat(eg, k), 0.044715) && cube(c3))
        })
    };
    pairs(eg, e, Binary::Add).into_iter().any(|(t, one)| {
        near(splat(eg, one), 1.0)
            && ops(eg, t).into_iter().any(|(o, c)| {
                o == Op::Unary(Unary::Tanh)
                    && pairs(eg, c[0], Binary::Mul).into_iter().any(|(k, u)| {
                        near(splat(eg, k), (2.0 / std::f64::consts::PI).sqrt()) && inner(u)
                    })
            })
    })
}

/// The x of `0.5 * x * core(x)` in either grouping: `(x * E) * 0.5` or `(x * 0.5) * E`, where `core` is
/// `1 + erf(x / sqrt 2)` (exact GELU) or the tanh form.
fn gelu_inputs(eg: &EGraph, id: Id, core: fn(&EGraph, Id, Id) -> bool) -> Vec<Id> {
    let mut out = vec![];
    for (p, q) in pairs(eg, id, Binary::Mul) {
        if near(splat(eg, q), 0.5) {
            out.extend(
                pairs(eg, p, Binary::Mul)
                    .into_iter()
                    .filter(|(x, e)| core(eg, *e, *x))
                    .map(|(x, _)| x),
            );
        }
        for (x, h) in pairs(eg, p, Binary::Mul) {
            if near(splat(eg, h), 0.5) && core(eg, q, x) {
                out.push(x);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
