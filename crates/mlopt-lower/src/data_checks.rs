//! Checks of input data that the interpreter reports as errors: an index out of range (Gather,
//! GatherElements, GatherND, ScatterND, ScatterElements) and an integer division by zero (Div, Mod).
//!
//! A kernel that gathers clamps its indices, so it never reads out of bounds whatever the data; whether
//! the data was valid is a separate check kernel that runs before it: a fold over the index (or divisor)
//! tensor writing one flag, 0.0 when every element is valid and 1.0 otherwise. Its step carries the flag's
//! place and the error message (`Step::check`): the kernel IR interpreter, the compiled entry point and
//! the GPU launcher stop there with it. The index tensor is pulled like any other value, so it may be
//! computed inside the checked kernel's fusion group (a Cast, an Add), though not by an anchor there (a
//! local the check cannot read: lowering then fails with an error); constant indices and divisors are
//! checked here, at compile time.

use crate::elementwise::elem;
use crate::error::{LowerError, Result};
use crate::kernel::{dims, Lowerer, Params};
use crate::nests::fold_op;
use mlopt_ir::infer::IndexBounds;
use mlopt_ir::{Binary, Graph, NodeId, Op};
use mlopt_kir::index::convert;
use mlopt_kir::index::delinear;
use mlopt_kir::{BinOp, Elem, Expr, Kernel, Space, Stmt};

/// What a node needs checked (its input 1): indices in range, or a nonzero integer divisor.
enum Rule {
    Index(IndexBounds),
    Divisor,
}

fn rule(g: &Graph, n: NodeId) -> Option<Rule> {
    let types = g.input_types(n);
    let op = &g.node(n).op;
    match op {
        Op::Binary(Binary::Div | Binary::Mod { .. })
            if !elem(types.get(1).copied().flatten()?.dtype).is_float() =>
        {
            Some(Rule::Divisor)
        }
        _ => IndexBounds::of(op, types.first().copied().flatten()?).map(Rule::Index),
    }
}

/// Whether element `x` (an i64 expression) breaks the rule for tuple component `j`.
fn bad(rule: &Rule, x: Expr, j: usize) -> Expr {
    match rule {
        Rule::Index(b) => {
            let d = b.bounds.get(j).copied().unwrap_or(0);
            Expr::bin(
                BinOp::Or,
                Expr::bin(BinOp::Lt, x.clone(), Expr::int(-d)),
                Expr::bin(BinOp::Le, Expr::int(d), x),
            )
        }
        Rule::Divisor => Expr::bin(BinOp::Eq, x, Expr::int(0)),
    }
}

/// The message of a failed check, worded as the interpreter's error for the same data.
fn message(g: &Graph, n: NodeId, rule: &Rule) -> String {
    let node = g.node(n);
    let what = match rule {
        Rule::Index(b) if b.tuple => format!(
            "input 1 holds an index tuple out of range for data axes of sizes {:?}",
            b.bounds
        ),
        Rule::Index(b) => format!(
            "input 1 holds an index out of range for an axis of size {}",
            b.bound(0, 1)
        ),
        Rule::Divisor => "integer division by zero".into(),
    };
    format!(
        "evaluating node '{}' ({}): {what}",
        node.name,
        node.op.name()
    )
}

/// A check kernel for member `n` of a fusion group (its other members pulled as needed), or None when
/// `n` needs none. Its parameters: the flag (`f32[1]`), then `Params`. A constant input is checked now.
/// (Its fold is the algorithm; a CPU schedule runs it on vectors.)
pub fn check_kernel(
    g: &Graph,
    members: &[NodeId],
    n: NodeId,
    name: String,
) -> Result<Option<(Kernel, Params, String)>> {
    let Some(rule) = rule(g, n) else {
        return Ok(None);
    };
    let Some(v) = g.inputs(n).get(1).copied().flatten() else {
        return Ok(None);
    };
    let msg = message(g, n, &rule);
    let shape: Vec<u64> = dims(g.value_type(v));
    // The tuple ops check each index tuple (the last axis) at once.
    let (outer, last) = match &rule {
        Rule::Index(b) if b.tuple => (
            shape[..shape.len().saturating_sub(1)].to_vec(),
            shape.last().copied().unwrap_or(0),
        ),
        _ => (shape.clone(), 1),
    };
    if let Op::Const(t) = &g.node(v.node).op {
        let values = t.to_i64_vec();
        let broken = match &rule {
            Rule::Index(b) => b.first_bad(&values, last as usize).is_some(),
            Rule::Divisor => values.contains(&0),
        };
        return if broken {
            Err(LowerError::InvalidData(msg))
        } else {
            Ok(None)
        };
    }
    if shape.contains(&0) {
        return Ok(None);
    }
    let mut l = Lowerer::new(g, name, members);
    let flag = l.k.buf("out0", Elem::F32, vec![1], Space::Global);
    let from = elem(g.value_type(v).dtype);
    let count: u64 = outer.iter().product();
    // One row of one fold (the shape of a keepdims reduction), so a GPU schedule folds it with a block
    // of threads rather than one thread.
    let body = l.nest("c", &[1], |l, c| {
        let fold = fold_op(
            l,
            Elem::F32,
            Expr::f32(0.0),
            &[count],
            BinOp::Max,
            |l, r| {
                // The flat position r over the outer axes, as an index into them.
                let idx = delinear(
                    r[0].clone(),
                    &outer.iter().map(|d| *d as i64).collect::<Vec<_>>(),
                );
                let mut any: Option<Expr> = None;
                for j in 0..last {
                    let mut ix = idx.clone();
                    if matches!(&rule, Rule::Index(b) if b.tuple) {
                        ix.push(Expr::int(j as i64));
                    }
                    let x = convert(l.pull(v, &ix)?, from, Elem::I64);
                    let b = bad(&rule, x, j as usize);
                    any = Some(match any {
                        Some(a) => Expr::bin(BinOp::Or, a, b),
                        None => b,
                    });
                }
                Ok(Expr::select(
                    any.unwrap_or_else(|| Expr::bin(BinOp::Lt, Expr::int(0), Expr::int(0))),
                    Expr::f32(1.0),
                    Expr::f32(0.0),
                ))
            },
        )?;
        let value = fold.get();
        let mut body = fold.stmts;
        body.push(Stmt::Store {
            buf: flag,
            index: vec![c[0].clone()],
            value,
        });
        Ok(body)
    })?;
    l.k.body = body;
    Ok(Some((l.k, l.params, msg)))
}
