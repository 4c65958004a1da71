//! Algebra: identities, strength reductions, constant chains and redundant broadcasts, MatMul+Add to Gemm,
//! and Conv+BatchNormalization folding.
//! Constant folding itself is the analysis (`lang.rs`); these rules produce constant arithmetic that it
//! folds. Identity rules need no shape guard beyond the merge's type check: `x + 0` where the zero broadcasts
//! `x` to a larger shape has another type and is left alone.

use super::{add, is_const, konst, ops, rw, rw_if, scan, splat, ty, v};
use crate::lang::{EGraph, Rewrite};
use egg::Id;
use mlopt_ir::{Binary, Op, Tensor, TensorType, Unary};

pub fn rules() -> Vec<Rewrite> {
    vec![
        rw_if("add-zero", "(add ?x ?c)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(0.0)
        }),
        rw_if("add-zero-left", "(add ?c ?x)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(0.0)
        }),
        rw_if("sub-zero", "(sub ?x ?c)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(0.0)
        }),
        rw_if("mul-one", "(mul ?x ?c)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(1.0)
        }),
        rw_if("mul-one-left", "(mul ?c ?x)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(1.0)
        }),
        rw_if("div-one", "(div ?x ?c)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(1.0)
        }),
        rw_if("pow-one", "(pow ?x ?c)", "?x", |eg, s| {
            splat(eg, s[v("?c")]) == Some(1.0)
        }),
        rw_if("pow-two", "(pow ?x ?c)", "(mul ?x ?x)", |eg, s| {
            splat(eg, s[v("?c")]) == Some(2.0)
        }),
        rw_if("pow-half", "(pow ?x ?c)", "(sqrt ?x)", |eg, s| {
            splat(eg, s[v("?c")]) == Some(0.5)
        }),
        rw_if(
            "div-const-to-mul",
            "(div ?x ?c)",
            "(mul ?x (reciprocal ?c))",
            |eg, s| {
                let c = s[v("?c")];
                let float = ty(eg, c).is_some_and(|t| t.dtype.is_float());
                float
                    && is_const(eg, c)
                    && eg[c]
                        .data
                        .value
                        .as_ref()
                        .is_some_and(|t| t.to_f64_vec().iter().all(|&x| exact_reciprocal(x)))
            },
        ),
        rw_if(
            "mul-const-chain",
            "(mul (mul ?x ?a) ?b)",
            "(mul ?x (mul ?a ?b))",
            |eg, s| {
                is_const(eg, s[v("?a")]) && is_const(eg, s[v("?b")]) && !is_const(eg, s[v("?x")])
            },
        ),
        rw_if(
            "add-const-chain",
            "(add (add ?x ?a) ?b)",
            "(add ?x (add ?a ?b))",
            |eg, s| {
                is_const(eg, s[v("?a")]) && is_const(eg, s[v("?b")]) && !is_const(eg, s[v("?x")])
            },
        ),
        scan(
            "expand-into-broadcast",
            |eg, id| !expanded_operands(eg, id).is_empty(),
            |eg, id| {
                expanded_operands(eg, id)
                    .into_iter()
                    .filter_map(|(op, ins)| add(eg, op, ins))
                    .collect()
            },
        ),
        rw("neg-neg", "(neg (neg ?x))", "?x"),
        rw("relu-relu", "(relu (relu ?x))", "(relu ?x)"),
        scan(
            "cast-identity",
            |eg, id| cast_identity(eg, id).is_some(),
            |eg, id| cast_identity(eg, id).into_iter().collect(),
        ),
        scan(
            "matmul-add-to-gemm",
            |eg, id| !matmul_add(eg, id).is_empty(),
            build_gemm,
        ),
        scan(
            "conv-batchnorm-fold",
            |eg, id| conv_bn(eg, id).is_some(),
            fold_conv_bn,
        ),
    ]
}

/// An elementwise binary op with an Expand operand: the same op on the unexpanded operand (the op
/// broadcasts by itself; the merge's type check keeps only forms whose output shape is unchanged).
fn expanded_operands(eg: &EGraph, id: Id) -> Vec<(Op, Vec<Id>)> {
    let mut out = vec![];
    for (op, ch) in ops(eg, id) {
        if !matches!(op, Op::Binary(_)) {
            continue;
        }
        for i in 0..2 {
            for (eo, ec) in ops(eg, ch[i]) {
                if matches!(eo, Op::Expand { .. }) {
                    let mut ins = ch.clone();
                    ins[i] = ec[0];
                    out.push((op.clone(), ins));
                }
            }
        }
    }
    out
}

/// `cast[to=T] x` where x is already T.
fn cast_identity(eg: &EGraph, id: Id) -> Option<Id> {
    ops(eg, id).into_iter().find_map(|(op, ch)| match op {
        Op::Cast { to } if ty(eg, ch[0]).is_some_and(|t| t.dtype == to) => Some(ch[0]),
        _ => None,
    })
}

/// `add (matmul a b) c` (either order) with rank-2 float a, b and a bias c that broadcasts to [M, N]: the
/// (a, b, c) triples.
fn matmul_add(eg: &EGraph, id: Id) -> Vec<[Id; 3]> {
    let mut out = vec![];
    for (op, ch) in ops(eg, id) {
        if op != Op::Binary(Binary::Add) {
            continue;
        }
        for (m, c) in [(ch[0], ch[1]), (ch[1], ch[0])] {
            for (mop, mch) in ops(eg, m) {
                if mop != Op::MatMul {
                    continue;
                }
                let (Some(a), Some(b), Some(ct)) = (ty(eg, mch[0]), ty(eg, mch[1]), ty(eg, c))
                else {
                    continue;
                };
                if a.rank() != 2 || b.rank() != 2 || !a.dtype.is_float() || ct.dtype != a.dtype {
                    continue;
                }
                let (m_, n) = (a.shape[0], b.shape[1]);
                let bias_ok = match ct.shape.as_slice() {
                    [] => true,
                    [x] => *x == n || *x == 1,
                    [r, x] => (*r == m_ || *r == 1) && (*x == n || *x == 1),
                    _ => false,
                };
                if bias_ok {
                    out.push([mch[0], mch[1], c]);
                }
            }
        }
    }
    out
}

fn build_gemm(eg: &mut EGraph, id: Id) -> Vec<Id> {
    let gemm = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: false,
    };
    matmul_add(eg, id)
        .into_iter()
        .filter_map(|[a, b, c]| add(eg, gemm.clone(), vec![a, b, c]))
        .collect()
}

/// A BatchNormalization over a Conv, with constant weights and statistics.
struct ConvBn {
    conv: Op,
    x: Id,
    w: Id,
    b: Option<Id>,
    /// scale, bias, mean, var.
    stats: [Id; 4],
    eps: f32,
}

/// `batch_norm (conv x w b?) scale bias mean var` with constant weights and statistics.
fn conv_bn(eg: &EGraph, id: Id) -> Option<ConvBn> {
    ops(eg, id).into_iter().find_map(|(op, ch)| {
        let Op::BatchNorm { epsilon } = op else {
            return None;
        };
        if !ch[1..].iter().all(|c| is_const(eg, *c)) {
            return None;
        }
        ops(eg, ch[0]).into_iter().find_map(|(conv, cch)| {
            let ok = matches!(conv, Op::Conv(_))
                && is_const(eg, cch[1])
                && ty(eg, cch[1]).is_some_and(|t| t.dtype.is_float());
            let b = cch
                .get(2)
                .copied()
                .filter(|b| !eg[*b].data.types.is_empty());
            ok.then(|| ConvBn {
                conv,
                x: cch[0],
                w: cch[1],
                b,
                stats: [ch[1], ch[2], ch[3], ch[4]],
                eps: epsilon,
            })
        })
    })
}

/// conv(x, w * k, (b - mean) * k + bias) with k = scale / sqrt(var + eps), k reshaped to [M, 1, 1, ...] for
/// the weights; the constant arithmetic folds.
fn fold_conv_bn(eg: &mut EGraph, id: Id) -> Vec<Id> {
    let Some(ConvBn {
        conv,
        x,
        w,
        b,
        stats: [scale, bias, mean, var],
        eps,
    }) = conv_bn(eg, id)
    else {
        return vec![];
    };
    let build = |eg: &mut EGraph| -> Option<Id> {
        let wt = ty(eg, w)?;
        let st = ty(eg, scale)?;
        let e = konst(
            eg,
            Tensor::full(&TensorType::new(st.dtype, vec![]), eps as f64),
        );
        let ve = add(eg, Op::Binary(Binary::Add), vec![var, e])?;
        let sd = add(eg, Op::Unary(Unary::Sqrt), vec![ve])?;
        let k = add(eg, Op::Binary(Binary::Div), vec![scale, sd])?;
        let mut shape = vec![1; wt.rank()];
        shape[0] = wt.shape[0];
        let kr = add(eg, Op::Reshape { shape }, vec![k])?;
        let w2 = add(eg, Op::Binary(Binary::Mul), vec![w, kr])?;
        let centred = match b {
            Some(b) => add(eg, Op::Binary(Binary::Sub), vec![b, mean])?,
            None => add(eg, Op::Unary(Unary::Neg), vec![mean])?,
        };
        let scaled = add(eg, Op::Binary(Binary::Mul), vec![centred, k])?;
        let b2 = add(eg, Op::Binary(Binary::Add), vec![scaled, bias])?;
        // Weights near the largest float overflow when scaled: the fold would turn finite products into
        // infinities (and their sums into NaN) that the unfolded graph never makes.
        let finite = |eg: &EGraph, id: Id| {
            eg[id]
                .data
                .value
                .as_ref()
                .is_none_or(|t| t.to_f64_vec().iter().all(|v| v.is_finite()))
        };
        if [w, scale, bias, mean, var].iter().all(|c| finite(eg, *c))
            && !(finite(eg, w2) && finite(eg, b2))
        {
            return None;
        }
        add(eg, conv.clone(), vec![x, w2, b2])
    };
    build(eg).into_iter().collect()
}

/// Whether `x * (1/c)` is `x / c` for every x: c a power of two (both are the correctly rounded value
/// of the same real number), where its reciprocal is a normal f32 too. For other c the two differ in the
/// last bit now and then, which a QuantizeLinear's rounding turns into a different integer (ResNet-50's
/// QOperator copy: 8 elements of a layer off by one, the error growing to 3% of the logits by the end).
fn exact_reciprocal(c: f64) -> bool {
    let (m, r) = (c.abs(), 1.0 / c.abs());
    c.is_finite()
        && m > 0.0
        && (m.log2().fract() == 0.0)
        && (r as f32).is_normal()
        && (m as f32).is_normal()
}
