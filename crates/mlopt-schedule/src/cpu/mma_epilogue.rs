//! The epilogue of a bf16 block (`mma.rs`): each element of the block's f32 sums stored to the output
//! through the contraction's epilogue, in loops along whichever of the block's axes the output is
//! contiguous in, guarded where blocks pass the output's end.

use mlopt_kir::{BinOp, Expr, Kernel, LoopKind, Stmt, Var};
use std::collections::HashMap;

/// Which of the output's axes is contiguous in memory: columns (MatMul, Gemm) or rows (a pointwise
/// convolution, whose rows are pixel positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Epilogue {
    ColumnsInner,
    RowsInner,
}

/// Block store `st` of element (`ii`, `jj`) as the epilogue runs it, and the axis it runs along
/// (`order`, or turned): its index simplified under the block loops' `ranges` where that makes it
/// contiguous along the inner axis (`contiguous_store`); the other axis innermost where the inner one
/// would scatter and the other would not (Whisper's keys, written transposed as [head, channel,
/// position]). A known stride other than 1 scatters; an index that is not affine (a position split
/// into images and rows) may still run in rows.
pub(super) fn oriented_store(
    k: &Kernel,
    st: Stmt,
    order: Epilogue,
    (ii, jj): (Var, Var),
    ranges: &HashMap<Var, u64>,
) -> (Stmt, Epilogue) {
    let (inner, other) = match order {
        Epilogue::ColumnsInner => (jj, ii),
        Epilogue::RowsInner => (ii, jj),
    };
    let st = contiguous_store(k, st, inner, ranges);
    let scatters = |v: Var| matches!(store_step(k, &st, v), Some(s) if s != 1);
    let order = match order {
        _ if !scatters(inner) || scatters(other) => order,
        Epilogue::ColumnsInner => Epilogue::RowsInner,
        Epilogue::RowsInner => Epilogue::ColumnsInner,
    };
    (st, order)
}

/// How far store `st`'s element moves per step of `v` (None where its index is not affine in `v`, or
/// `st` is not a store).
fn store_step(k: &mlopt_kir::Kernel, st: &Stmt, v: Var) -> Option<i64> {
    let Stmt::Store { buf, index, .. } = st else {
        return None;
    };
    mlopt_kir::analysis::coefficient(&mlopt_kir::analysis::flat_index(k, *buf, index), v)
}

/// Store `st` with its index simplified under the block loops' `ranges` where that makes it contiguous
/// along `inner` and it was not: an output whose axes split the block's columns (Swin's attention
/// projections write [q/k/v, window, head, position, channel], the column `jb * 32 + jj` divided by 384
/// and 32 and taken modulo 12 and 32) is then stored as vectors, where it was stored element by element
/// (and ran slower on 2 threads than on 1). Other stores keep the form the vector code reads as rows.
fn contiguous_store(
    k: &mlopt_kir::Kernel,
    st: Stmt,
    inner: Var,
    ranges: &HashMap<Var, u64>,
) -> Stmt {
    let along = |s: &Stmt| store_step(k, s, inner).is_some();
    if along(&st) {
        return st;
    }
    let simpler = st.map_exprs(&|e| mlopt_kir::simplify::simplify(e, ranges));
    if along(&simpler) {
        simpler
    } else {
        st
    }
}

/// The store `st` of a block's element (ii, jj) over the block, walked with the loop whose outputs
/// are contiguous innermost (`order`), so the CPU schedule can store it as vectors; each loop (its
/// variable, the output index `block * extent + variable`, the block's extent, the output's and the
/// block) guarded where blocks pass the output's end: the outer loop's body as a whole, the inner loop
/// unguarded in every whole block (`block < len / extent`, which bounds the index for the verifier) and,
/// in the last, a loop (variable `tail`) over the len % extent elements it has. A per-element test in
/// every block kept the inner loop from vectorising: MobileNetV2's bf16 1x1 convolutions (784
/// positions, blocks of 32) stored their outputs one at a time, at 28-32 GFLOP/s.
pub(super) fn epilogue(
    st: Stmt,
    order: Epilogue,
    (ii, row, mb, rows, ib): (Var, &Expr, u64, u64, &Expr),
    (jj, col, nb, n, jb): (Var, &Expr, u64, u64, &Expr),
    tail: Var,
) -> Stmt {
    let for_ = |var, extent, body| Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    };
    let lt = |a: Expr, b: i64| Expr::bin(BinOp::Lt, a, Expr::int(b));
    let ((iv, _, ext, len, block), (ov, o, oext, olen)) = match order {
        Epilogue::ColumnsInner => ((jj, col, nb, n, jb), (ii, row, mb, rows)),
        Epilogue::RowsInner => ((ii, row, mb, rows, ib), (jj, col, nb, n)),
    };
    let inner = if len.is_multiple_of(ext) {
        vec![for_(iv, ext, vec![st])]
    } else {
        // The last block (the only one past the whole ones) stores its first len % ext elements: a
        // loop of that extent, unguarded (the block's loop bounds it), which can run in vector lanes.
        // Where there is no whole block (an AMX block of 16 rows over a 13-position row), only the
        // tail: a whole-block branch that cannot run bounds nothing, and the verifier rejected it.
        let whole = (len / ext) as i64;
        let t = Expr::var(tail);
        let last = Stmt::If {
            cond: Expr::bin(BinOp::Le, Expr::int(whole), block.clone()),
            then: vec![for_(tail, len % ext, vec![st.subst(iv, &t)])],
        };
        if whole == 0 {
            vec![last]
        } else {
            vec![
                Stmt::If {
                    cond: lt(block.clone(), whole),
                    then: vec![for_(iv, ext, vec![st.clone()])],
                },
                last,
            ]
        }
    };
    let body = if olen.is_multiple_of(oext) {
        inner
    } else {
        vec![Stmt::If {
            cond: lt(o.clone(), olen as i64),
            then: inner,
        }]
    };
    for_(ov, oext, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block epilogue's store into an output whose axes split the columns (q/k/v, head, channel of
    /// 36 column blocks of 32) becomes contiguous along the block's column; a store that was already
    /// contiguous is left as it was.
    #[test]
    fn block_stores_are_simplified_where_that_makes_them_contiguous() {
        let k = mlopt_kir::parse_kernel(
            "kernel @t(%out: f32[3,12,32], %c: f32[32]) {
  serial %jb in 0..36 {
    serial %jj in 0..32 {
      %out[(((%jb * 32) + %jj) / 384), ((((%jb * 32) + %jj) / 32) % 12), (((%jb * 32) + %jj) % 32)] = %c[%jj]
      %out[0, 0, %jj] = %c[%jj]
    }
  }
}
",
        )
        .unwrap();
        let Stmt::For { var: jb, body, .. } = &k.body[0] else {
            panic!("no jb loop")
        };
        let Stmt::For { var: jj, body, .. } = &body[0] else {
            panic!("no jj loop")
        };
        let ranges = HashMap::from([(*jb, 36), (*jj, 32)]);
        let along = |s: &Stmt| store_step(&k, s, *jj);
        assert_eq!(along(&body[0]), None);
        let st = contiguous_store(&k, body[0].clone(), *jj, &ranges);
        assert_eq!(along(&st), Some(1));
        assert_eq!(contiguous_store(&k, body[1].clone(), *jj, &ranges), body[1]);
    }
}
