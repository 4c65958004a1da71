//! Index arithmetic every producer of kernel IR writes: row-major linear positions and back, range
//! tests, clamps, a window tap's input position, and typed literals and conversions.

use crate::ir::{BinOp, Elem, Expr, LoopKind, Stmt, Var};

/// Row-major linear index of `idx` in `shape`.
pub fn linear(idx: &[Expr], shape: &[i64]) -> Expr {
    let mut e = Expr::int(0);
    for (i, s) in idx.iter().zip(shape) {
        e = Expr::add(Expr::mul(e, Expr::int(*s)), i.clone());
    }
    e
}

/// The index of linear position `flat` in `shape`.
pub fn delinear(flat: Expr, shape: &[i64]) -> Vec<Expr> {
    let mut out = vec![Expr::int(0); shape.len()];
    // Axes of size 1 are 0; the outermost other axis needs no remainder (flat is in bounds).
    let outer = shape.iter().position(|d| *d != 1).unwrap_or(0);
    let mut stride = 1i64;
    for a in (outer..shape.len()).rev() {
        out[a] = match (a == outer, shape[a]) {
            (_, 1) => Expr::int(0),
            (true, _) => Expr::div(flat.clone(), Expr::int(stride)),
            (false, d) => Expr::rem(Expr::div(flat.clone(), Expr::int(stride)), Expr::int(d)),
        };
        stride *= shape[a];
    }
    out
}

/// `0 <= e < len`.
pub fn in_range(e: Expr, len: i64) -> Expr {
    Expr::bin(
        BinOp::And,
        Expr::bin(BinOp::Le, Expr::int(0), e.clone()),
        Expr::bin(BinOp::Lt, e, Expr::int(len)),
    )
}

/// The conjunction of `conds`, or None when there are none.
pub fn all(conds: impl IntoIterator<Item = Expr>) -> Option<Expr> {
    conds.into_iter().reduce(|p, q| Expr::bin(BinOp::And, p, q))
}

/// An index that may count from the end (negative), wrapped and then clamped into 0..len.
pub fn wrap_index(i: Expr, len: i64) -> Expr {
    clamp(
        Expr::select(
            Expr::bin(BinOp::Lt, i.clone(), Expr::int(0)),
            Expr::add(i.clone(), Expr::int(len)),
            i,
        ),
        len,
    )
}

/// `e` modulo `m`, in 0..m for negative `e` too.
pub fn modulo(e: Expr, m: i64) -> Expr {
    Expr::rem(
        Expr::add(Expr::rem(e, Expr::int(m)), Expr::int(m)),
        Expr::int(m),
    )
}

/// `e` clamped into 0..len, so a load in an unselected branch of a select stays in bounds.
pub fn clamp(e: Expr, len: i64) -> Expr {
    Expr::bin(
        BinOp::Max,
        Expr::bin(BinOp::Min, e, Expr::int(len - 1)),
        Expr::int(0),
    )
}

/// The input position a window tap reads: `out * stride + tap * dilation - pad` (may fall in the padding).
pub fn window_pos(out: &Expr, tap: &Expr, stride: usize, dilation: usize, pad: usize) -> Expr {
    Expr::sub(
        Expr::add(
            Expr::mul(out.clone(), Expr::int(stride as i64)),
            Expr::mul(tap.clone(), Expr::int(dilation as i64)),
        ),
        Expr::int(pad as i64),
    )
}

/// A literal of type `t`.
pub fn lit(v: f64, t: Elem) -> Expr {
    if t.is_float() {
        Expr::Float(v, t)
    } else if t == Elem::Bool {
        Expr::cast(Elem::Bool, Expr::Int((v != 0.0) as i64))
    } else if t == Elem::I64 {
        Expr::Int(v as i64)
    } else {
        Expr::cast(t, Expr::Int(v as i64))
    }
}

/// Casts `e` from `from` to `to`, or returns it when they agree.
pub fn convert(e: Expr, from: Elem, to: Elem) -> Expr {
    if from == to {
        e
    } else {
        Expr::cast(to, e)
    }
}

/// `body` inside serial loops of `vars` (outermost first) over `extents`.
pub fn serial_loops(vars: &[Var], extents: &[u64], body: Vec<Stmt>) -> Vec<Stmt> {
    let mut stmts = body;
    for (v, e) in vars.iter().zip(extents).rev() {
        stmts = vec![Stmt::for_(*v, *e, LoopKind::Serial, stmts)];
    }
    stmts
}
