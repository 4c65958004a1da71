//! Attention in the algorithm form lowering writes (`mlopt-lower/src/nests.rs`), one query row per iteration of the
//! data-parallel loops:
//!
//! ```text
//! for j in 0..T { acc = q(i, :) . kt(:, j); scores[j] = acc * scale (+ mask(i, j)) }
//! m = max over j of scores[j]; l = sum over j of e^(scores[j] - m); scores[j] = e^(scores[j] - m)
//! for e in 0..E { acc = scores . v(:, e); out(i, e) = store(acc / l) }
//! ```
//!
//! Both targets schedule what this recognises: the GPU on tensor cores with an online softmax
//! (`gpu/attention.rs`), a CPU in blocks of query rows whose two products are register-tiled
//! (`cpu/attention.rs`).

use mlopt_kir::{BinOp, BufId, Elem, Expr, Kernel, LoopKind, Space, Stmt, UnOp, Var};

/// The attention nest, as lowering writes it, inside its data-parallel loops.
pub(crate) struct Attention {
    /// The query row loop and the batch loops (all other parallel loops).
    pub(crate) row: (Var, u64),
    pub(crate) batch: Vec<(Var, u64)>,
    /// Keys: the loop over them in the scores (`j`) and in the weighted sum (`jv`), and their number.
    pub(crate) j: Var,
    pub(crate) jv: Var,
    pub(crate) keys: u64,
    /// The contraction of q and k (`r`, depth `d`) and the value loop (`e`, width `dv`).
    pub(crate) r: Var,
    pub(crate) d: u64,
    pub(crate) e: Var,
    pub(crate) dv: u64,
    pub(crate) q: Expr,
    pub(crate) kt: Expr,
    pub(crate) v: Expr,
    pub(crate) scale: Expr,
    pub(crate) mask: Option<Expr>,
    /// The final store, reading the weighted sum `acc_o` and the sum of the exponentials `acc_l`.
    pub(crate) store: Stmt,
    pub(crate) acc_o: BufId,
    pub(crate) acc_l: BufId,
}

fn single_loop(s: &Stmt) -> Option<(Var, u64, &[Stmt])> {
    match s {
        Stmt::For {
            var,
            extent,
            kind: LoopKind::Serial,
            body,
        } => Some((*var, *extent, body)),
        _ => None,
    }
}

/// `acc = 0; for r in 0..n { acc = fma(x, y, acc) }`: (acc, r, n, x, y).
fn dot(init: &Stmt, nest: &Stmt) -> Option<(BufId, Var, u64, Expr, Expr)> {
    let Stmt::Store {
        buf: acc,
        index,
        value: Expr::Float(z, Elem::F32),
    } = init
    else {
        return None;
    };
    let (r, n, body) = single_loop(nest)?;
    let me = Expr::load(*acc, vec![]);
    let [Stmt::Store {
        buf,
        index: ix,
        value: Expr::Fma(x, y, z2),
    }] = body
    else {
        return None;
    };
    (*z == 0.0 && index.is_empty() && buf == acc && ix.is_empty() && **z2 == me)
        .then(|| (*acc, r, n, (**x).clone(), (**y).clone()))
}

/// Recognises the nest `anchor::attention` writes (see there), checking every statement of the softmax.
pub(crate) fn recognise(k: &Kernel, prefix: &[(Var, u64)], inner: &[Stmt]) -> Option<Attention> {
    let [scores_nest, m_init, m_nest, l_init, l_nest, p_nest, out_nest] = inner else {
        return None;
    };
    // for j { acc = q . kt; scores[j] = acc * scale (+ mask) }
    let (j, keys, body) = single_loop(scores_nest)?;
    let [s_init, s_dot, Stmt::Store {
        buf: scores,
        index: sj,
        value: scaled,
    }] = body
    else {
        return None;
    };
    let (acc_s, r, d, q, kt) = dot(s_init, s_dot)?;
    let sb = k.buffer(*scores);
    if sb.space != Space::Local
        || sb.elem != Elem::F32
        || sb.dims != [keys]
        || *sj != [Expr::var(j)]
    {
        return None;
    }
    let product = |e: &Expr| match e {
        Expr::Binary(BinOp::Mul, a, s)
            if **a == Expr::load(acc_s, vec![]) && matches!(**s, Expr::Float(_, Elem::F32)) =>
        {
            Some((**s).clone())
        }
        _ => None,
    };
    let (scale, mask) = match scaled {
        Expr::Binary(BinOp::Add, x, m) if product(x).is_some() => {
            (product(x)?, Some((**m).clone()))
        }
        x => (product(x)?, None),
    };
    // The softmax: m = max scores; l = sum e^(scores - m); scores = e^(scores - m).
    let (
        Stmt::Store {
            buf: acc_m,
            value: Expr::Float(lo, Elem::F32),
            ..
        },
        Stmt::Store {
            buf: acc_l,
            value: Expr::Float(zero, Elem::F32),
            ..
        },
    ) = (m_init, l_init)
    else {
        return None;
    };
    let at = |v: Var| Expr::load(*scores, vec![Expr::var(v)]);
    let (m, l) = (Expr::load(*acc_m, vec![]), Expr::load(*acc_l, vec![]));
    let shifted = |v: Var| Expr::un(UnOp::Exp, Expr::bin(BinOp::Sub, at(v), m.clone()));
    let (rm, _, _) = single_loop(m_nest)?;
    let (rl, _, _) = single_loop(l_nest)?;
    let (rp, _, _) = single_loop(p_nest)?;
    let softmax = [
        (
            m_nest,
            Stmt::for_(
                rm,
                keys,
                LoopKind::Serial,
                vec![Stmt::Store {
                    buf: *acc_m,
                    index: vec![],
                    value: Expr::bin(BinOp::Max, m.clone(), at(rm)),
                }],
            ),
        ),
        (
            l_nest,
            Stmt::for_(
                rl,
                keys,
                LoopKind::Serial,
                vec![Stmt::Store {
                    buf: *acc_l,
                    index: vec![],
                    value: Expr::bin(BinOp::Add, l.clone(), shifted(rl)),
                }],
            ),
        ),
        (
            p_nest,
            Stmt::for_(
                rp,
                keys,
                LoopKind::Serial,
                vec![Stmt::Store {
                    buf: *scores,
                    index: vec![Expr::var(rp)],
                    value: shifted(rp),
                }],
            ),
        ),
    ];
    if *lo != f64::NEG_INFINITY || *zero != 0.0 || softmax.iter().any(|(got, want)| *got != want) {
        return None;
    }
    // for e { acc = scores . v; store(acc / l) }
    let (e, dv, body) = single_loop(out_nest)?;
    let [o_init, o_dot, store @ Stmt::Store { .. }] = body else {
        return None;
    };
    let (acc_o, jv, n, p, v) = dot(o_init, o_dot)?;
    if n != keys || p != at(jv) {
        return None;
    }
    // The rows: the innermost loop q reads and kt and v do not (the queries; any such loop shares its
    // keys and values, so it may serve); the rest are the batch.
    let row = *prefix
        .iter()
        .rev()
        .find(|(x, _)| q.uses(*x) && !kt.uses(*x) && !v.uses(*x))?;
    let batch = prefix
        .iter()
        .filter(|(x, _)| *x != row.0)
        .copied()
        .collect();
    let reads = |x: &Expr, vars: &[Var]| vars.iter().all(|v| x.uses(*v));
    if !reads(&q, &[r]) || !reads(&kt, &[r, j]) || !reads(&v, &[jv, e]) {
        return None;
    }
    Some(Attention {
        row,
        batch,
        j,
        jv,
        keys,
        r,
        d,
        e,
        dv,
        q,
        kt,
        v,
        scale,
        mask,
        store: store.clone(),
        acc_o,
        acc_l: *acc_l,
    })
}
