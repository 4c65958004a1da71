//! Layout: transpose and reshape cancellation and composition, transposes sunk below elementwise ops (so
//! that they meet and cancel, or fold into constants), gathers hoisted above them (so that the function
//! runs on the rows gathered), and transposed MatMul operands absorbed by Gemm.

use super::{add, has, ops, scan, splat, ty};
use crate::lang::{EGraph, Rewrite};
use egg::Id;
use mlopt_ir::{Op, Unary};

pub fn rules() -> Vec<Rewrite> {
    vec![
        scan(
            "transpose-identity",
            |eg, id| has(eg, id, |o, _| is_identity_transpose(o)),
            |eg, id| {
                ops(eg, id)
                    .into_iter()
                    .filter(|(o, _)| is_identity_transpose(o))
                    .map(|(_, c)| c[0])
                    .collect()
            },
        ),
        scan(
            "transpose-transpose",
            |eg, id| !transpose_pairs(eg, id).is_empty(),
            |eg, id| {
                let pairs = transpose_pairs(eg, id);
                pairs
                    .into_iter()
                    .filter_map(|(x, p1, p2)| {
                        let perm: Vec<usize> = p2.iter().map(|&i| p1[i]).collect();
                        if perm.iter().enumerate().all(|(i, p)| i == *p) {
                            Some(x)
                        } else {
                            add(eg, Op::Transpose { perm }, vec![x])
                        }
                    })
                    .collect()
            },
        ),
        scan(
            "reshape-identity",
            |eg, id| !reshape_identities(eg, id).is_empty(),
            reshape_identities_mut,
        ),
        scan(
            "reshape-reshape",
            |eg, id| !reshape_pairs(eg, id).is_empty(),
            |eg, id| {
                reshape_pairs(eg, id)
                    .into_iter()
                    .filter_map(|(x, shape)| add(eg, Op::Reshape { shape }, vec![x]))
                    .collect()
            },
        ),
        scan(
            "expand-identity",
            |eg, id| !expand_identities(eg, id).is_empty(),
            |eg, id| expand_identities(eg, id),
        ),
        // gather (u x) i = u (gather x i), and so for a binary op with a scalar: a gather of a few
        // rows from an elementwise function of a large constant (an embedding table stored int8 and
        // dequantized) computes the function on the rows alone.
        scan(
            "gather-elementwise-hoist",
            |eg, id| !gathers_of_elementwise(eg, id).is_empty(),
            |eg, id| {
                gathers_of_elementwise(eg, id)
                    .into_iter()
                    .filter_map(|(f, x, other, axis, idx)| {
                        let g = add(eg, Op::Gather { axis }, vec![x, idx])?;
                        match other {
                            None => add(eg, f, vec![g]),
                            Some((s, true)) => add(eg, f, vec![s, g]),
                            Some((s, false)) => add(eg, f, vec![g, s]),
                        }
                    })
                    .collect()
            },
        ),
        scan(
            "unary-transpose-sink",
            |eg, id| !unary_over_transpose(eg, id).is_empty(),
            |eg, id| {
                unary_over_transpose(eg, id)
                    .into_iter()
                    .filter_map(|(u, x, perm)| {
                        let y = add(eg, u, vec![x])?;
                        add(eg, Op::Transpose { perm }, vec![y])
                    })
                    .collect()
            },
        ),
        scan(
            "binary-transpose-sink",
            |eg, id| !binary_over_transposes(eg, id).is_empty(),
            |eg, id| {
                binary_over_transposes(eg, id)
                    .into_iter()
                    .filter_map(|(b, x, y, perm)| {
                        let z = add(eg, b, vec![x, y])?;
                        add(eg, Op::Transpose { perm }, vec![z])
                    })
                    .collect()
            },
        ),
        scan(
            "matmul-transpose-to-gemm",
            |eg, id| !matmul_transposed(eg, id).is_empty(),
            |eg, id| {
                matmul_transposed(eg, id)
                    .into_iter()
                    .filter_map(|(a, b, trans_a, trans_b)| {
                        let c = super::absent(eg);
                        add(
                            eg,
                            Op::Gemm {
                                alpha: 1.0,
                                beta: 1.0,
                                trans_a,
                                trans_b,
                            },
                            vec![a, b, c],
                        )
                    })
                    .collect()
            },
        ),
    ]
}

fn is_identity_transpose(o: &Op) -> bool {
    matches!(o, Op::Transpose { perm } if perm.iter().enumerate().all(|(i, p)| i == *p))
}

/// The perm of each transpose node in class `id`, with its input.
fn transposes(eg: &EGraph, id: Id) -> Vec<(Id, Vec<usize>)> {
    ops(eg, id)
        .into_iter()
        .filter_map(|(o, c)| match o {
            Op::Transpose { perm } => Some((c[0], perm)),
            _ => None,
        })
        .collect()
}

/// `transpose[p2] (transpose[p1] x)`: (x, p1, p2).
fn transpose_pairs(eg: &EGraph, id: Id) -> Vec<(Id, Vec<usize>, Vec<usize>)> {
    transposes(eg, id)
        .into_iter()
        .flat_map(|(y, p2)| {
            transposes(eg, y)
                .into_iter()
                .map(move |(x, p1)| (x, p1, p2.clone()))
        })
        .collect()
}

fn reshape_identities(eg: &EGraph, id: Id) -> Vec<Id> {
    let out = ty(eg, id);
    ops(eg, id)
        .into_iter()
        .filter(|(o, c)| matches!(o, Op::Reshape { .. }) && ty(eg, c[0]) == out)
        .map(|(_, c)| c[0])
        .collect()
}

fn reshape_identities_mut(eg: &mut EGraph, id: Id) -> Vec<Id> {
    reshape_identities(eg, id)
}

/// `reshape[s2] (reshape[s1] x)`: (x, s2).
fn reshape_pairs(eg: &EGraph, id: Id) -> Vec<(Id, Vec<usize>)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        let Op::Reshape { shape } = o else { continue };
        for (o2, c2) in ops(eg, c[0]) {
            if matches!(o2, Op::Reshape { .. }) {
                out.push((c2[0], shape.clone()));
            }
        }
    }
    out
}

fn expand_identities(eg: &EGraph, id: Id) -> Vec<Id> {
    let out = ty(eg, id);
    ops(eg, id)
        .into_iter()
        .filter(|(o, c)| matches!(o, Op::Expand { .. }) && ty(eg, c[0]) == out)
        .map(|(_, c)| c[0])
        .collect()
}

/// Elementwise unary ops that commute with any permutation of their input.
fn elementwise_unary(o: &Op) -> bool {
    matches!(o, Op::Unary(u) if !matches!(u, Unary::IsInf { .. })) || matches!(o, Op::Cast { .. })
}

/// A binary op with one operand a scalar constant and one another operand's role.
type ScalarSide = Option<(Id, bool)>;

/// `gather[axis] (f x [s]) i` with f elementwise unary, or binary with a scalar constant s on either
/// side: (f, x, (s, s first), axis, i).
fn gathers_of_elementwise(eg: &EGraph, id: Id) -> Vec<(Op, Id, ScalarSide, usize, Id)> {
    let scalar = |i: Id| {
        splat(eg, i).is_some() && ty(eg, i).is_some_and(|t| t.numel() == 1 && t.rank() == 0)
    };
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        let Op::Gather { axis } = o else { continue };
        for (f, fc) in ops(eg, c[0]) {
            if elementwise_unary(&f) {
                out.push((f, fc[0], None, axis, c[1]));
            } else if matches!(f, Op::Binary(_)) {
                if scalar(fc[1]) {
                    out.push((f, fc[0], Some((fc[1], false)), axis, c[1]));
                } else if scalar(fc[0]) {
                    out.push((f, fc[1], Some((fc[0], true)), axis, c[1]));
                }
            }
        }
    }
    out
}

/// `u (transpose[p] x)`: (u, x, p).
fn unary_over_transpose(eg: &EGraph, id: Id) -> Vec<(Op, Id, Vec<usize>)> {
    ops(eg, id)
        .into_iter()
        .filter(|(o, _)| elementwise_unary(o))
        .flat_map(|(u, c)| {
            transposes(eg, c[0])
                .into_iter()
                .map(move |(x, p)| (u.clone(), x, p))
        })
        .collect()
}

/// `b (transpose[p] x) (transpose[p] y)` with x and y of one shape, or `b (transpose[p] x) s` with a scalar
/// constant s (either side): (b, x, y-or-s, p) in operand order.
fn binary_over_transposes(eg: &EGraph, id: Id) -> Vec<(Op, Id, Id, Vec<usize>)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        if !matches!(o, Op::Binary(_)) {
            continue;
        }
        let scalar = |i: Id| {
            splat(eg, i).is_some() && ty(eg, i).is_some_and(|t| t.numel() == 1 && t.rank() <= 1)
        };
        for (x, p) in transposes(eg, c[0]) {
            for (y, q) in transposes(eg, c[1]) {
                if p == q && ty(eg, x).map(|t| t.shape) == ty(eg, y).map(|t| t.shape) {
                    out.push((o.clone(), x, y, p.clone()));
                }
            }
            if scalar(c[1]) {
                out.push((o.clone(), x, c[1], p.clone()));
            }
        }
        if scalar(c[0]) {
            for (y, q) in transposes(eg, c[1]) {
                out.push((o.clone(), c[0], y, q));
            }
        }
    }
    out
}

/// `matmul a b` on rank-2 operands where a or b is `transpose[1,0]`: (a', b', trans_a, trans_b).
fn matmul_transposed(eg: &EGraph, id: Id) -> Vec<(Id, Id, bool, bool)> {
    let mut out = vec![];
    for (o, c) in ops(eg, id) {
        let rank2 = |i: Id| ty(eg, i).is_some_and(|t| t.rank() == 2 && t.dtype.is_float());
        if o != Op::MatMul || !rank2(c[0]) || !rank2(c[1]) {
            continue;
        }
        let swapped = |i: Id| {
            transposes(eg, i)
                .into_iter()
                .filter(|(_, p)| p == &[1, 0])
                .map(|(x, _)| x)
                .collect::<Vec<_>>()
        };
        for b in swapped(c[1]) {
            out.push((c[0], b, false, true));
        }
        for a in swapped(c[0]) {
            out.push((a, c[1], true, false));
        }
    }
    out
}
