//! Running sums and products (CumSum, CumProd): per row across the axis, one accumulator carried from
//! element to element in index order (from the end when reversed), as the interpreter computes them.

use crate::elementwise::{compute, elem};
use crate::error::Result;
use crate::kernel::Lowerer;
use crate::nests::get;
use mlopt_ir::{Accumulate, CumulativeAttrs, NodeId};
use mlopt_kir::index::{convert, lit};
use mlopt_kir::{BinOp, BufId, Expr, Space, Stmt};

pub(crate) fn cumulative(
    l: &mut Lowerer,
    n: NodeId,
    s: &CumulativeAttrs,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let x = l.input(n, 0)?;
    let xs = l.ty(x).shape.clone();
    let out_t = elem(l.ty(x).dtype);
    let t = compute(out_t);
    let len = xs[s.axis] as u64;
    let rows: Vec<u64> = xs
        .iter()
        .enumerate()
        .filter(|(d, _)| *d != s.axis)
        .map(|(_, &e)| e as u64)
        .collect();
    let (op, identity) = match s.kind {
        Accumulate::Sum => (BinOp::Add, 0.0),
        Accumulate::Prod => (BinOp::Mul, 1.0),
    };
    l.nest("i", &rows, |l, row| {
        let acc =
            l.k.buf(format!("acc{}", l.k.bufs.len()), t, vec![], Space::Local);
        let mut stmts = vec![Stmt::Store {
            buf: acc,
            index: vec![],
            value: lit(identity, t),
        }];
        stmts.extend(l.nest("r", &[len], |l, r| {
            let at = if s.reverse {
                Expr::bin(BinOp::Sub, Expr::int(len as i64 - 1), r[0].clone())
            } else {
                r[0].clone()
            };
            let mut ix = row.to_vec();
            ix.insert(s.axis, at);
            let v = get(l, x, &ix, t)?;
            let add = Stmt::Store {
                buf: acc,
                index: vec![],
                value: Expr::bin(op, Expr::load(acc, vec![]), v),
            };
            let store = Stmt::Store {
                buf: dst,
                index: ix,
                value: convert(Expr::load(acc, vec![]), t, out_t),
            };
            Ok(if s.exclusive {
                vec![store, add]
            } else {
                vec![add, store]
            })
        })?);
        Ok(stmts)
    })
}
