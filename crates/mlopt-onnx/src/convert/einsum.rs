//! Einsum as transposes, reshapes, reduce-sums and batched matmuls. Operands are combined left to right;
//! for each pair, labels are classed as batch (both operands, kept), contracted (both, summed), left-only
//! or right-only (kept) and summed early when no one needs them. An ellipsis stands for the same leading
//! dimensions in every operand. A label repeated within one operand takes that operand's diagonal first
//! (a transpose, a reshape and a gather of every (n+1)-th element), so `ii->i`, `ii` (a trace) and
//! `...ii->...i` work.

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{Op, ReduceKind, Tensor, Value};

/// An operand: its value and one label per axis.
struct Term {
    v: Value,
    labels: Vec<char>,
}

pub(crate) fn einsum(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let eq: String = cx
        .string("equation", "")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != cx.num_inputs() {
        return Err(cx.err(format!(
            "equation '{eq}' names {} operands, the node has {}",
            specs.len(),
            cx.num_inputs()
        )));
    }
    let mut terms = vec![];
    let mut ellipsis_rank = None;
    for (i, spec) in specs.iter().enumerate() {
        let v = cx.req(i)?;
        let rank = cx.ty(v).rank();
        let named = spec.replace("...", "").chars().count();
        let ell = if spec.contains("...") {
            rank.checked_sub(named)
                .ok_or_else(|| cx.err_in(i, format!("'{spec}' has more labels than rank {rank}")))?
        } else {
            0
        };
        if spec.contains("...") {
            if ellipsis_rank.is_some_and(|r| r != ell) {
                return Err(cx.err("ellipses of different ranks are not supported"));
            }
            ellipsis_rank = Some(ell);
        }
        let labels = expand(spec, ell);
        if labels.len() != rank
            || labels
                .iter()
                .any(|c| !c.is_ascii_alphabetic() && !is_ellipsis(*c))
        {
            return Err(cx.err_in(i, format!("'{spec}' does not label the {rank} axes")));
        }
        terms.push(Term { v, labels });
    }
    let ell = ellipsis_rank.unwrap_or(0);
    let out: Vec<char> = match rhs {
        Some(r) => expand(&r, ell),
        None => {
            // Implicit output: the ellipsis, then labels used once, alphabetically.
            let all: Vec<char> = terms.iter().flat_map(|t| t.labels.clone()).collect();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| c.is_ascii_alphabetic() && all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            (0..ell).map(ellipsis_label).chain(once).collect()
        }
    };
    // Repeated labels within an operand select its diagonal (after the implicit output, which counts
    // them as repeated: `ii` alone is a trace).
    let mut terms = terms
        .into_iter()
        .map(|t| diagonal(cx, t))
        .collect::<Result<Vec<_>>>()?;
    let mut acc = terms.remove(0);
    for (k, next) in terms.into_iter().enumerate() {
        let later: Vec<char> = specs[k + 2..]
            .iter()
            .flat_map(|s| expand(s, ell))
            .chain(out.iter().copied())
            .collect();
        acc = pair(cx, acc, next, &later)?;
    }
    let acc = sum_unneeded(cx, acc, &out)?;
    permute(cx, acc, &out)
}

const ELLIPSIS_BASE: u32 = 0x2460;

fn ellipsis_label(i: usize) -> char {
    char::from_u32(ELLIPSIS_BASE + i as u32).unwrap_or('?')
}

fn is_ellipsis(c: char) -> bool {
    (ELLIPSIS_BASE..ELLIPSIS_BASE + 32).contains(&(c as u32))
}

fn expand(spec: &str, ell: usize) -> Vec<char> {
    match spec.split_once("...") {
        Some((a, b)) => a
            .chars()
            .chain((0..ell).map(ellipsis_label))
            .chain(b.chars())
            .collect(),
        None => spec.chars().collect(),
    }
}

/// Sums the axes whose labels `keep` does not mention.
fn sum_unneeded(cx: &mut NodeCx<'_, '_>, t: Term, keep: &[char]) -> Result<Term> {
    let axes: Vec<usize> = (0..t.labels.len())
        .filter(|&i| !keep.contains(&t.labels[i]))
        .collect();
    if axes.is_empty() {
        return Ok(t);
    }
    let labels = t
        .labels
        .iter()
        .copied()
        .filter(|c| keep.contains(c))
        .collect();
    Ok(Term {
        v: cx.reduce(ReduceKind::Sum, t.v, axes, false)?,
        labels,
    })
}

/// Reorders a term's axes to `order` (which holds exactly its labels).
fn permute(cx: &mut NodeCx<'_, '_>, t: Term, order: &[char]) -> Result<Value> {
    let perm: Vec<usize> = order
        .iter()
        .map(|c| {
            t.labels
                .iter()
                .position(|l| l == c)
                .ok_or_else(|| cx.err(format!("output label '{c}' is not in any operand")))
        })
        .collect::<Result<_>>()?;
    if perm.len() != t.labels.len() {
        return Err(cx.err("the output does not use every remaining label"));
    }
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(t.v);
    }
    cx.add1(Op::Transpose { perm }, &[t.v])
}

fn dims(cx: &NodeCx<'_, '_>, t: &Term, ls: &[char]) -> Vec<usize> {
    ls.iter()
        .filter_map(|c| t.labels.iter().position(|l| l == c))
        .map(|i| cx.ty(t.v).shape[i])
        .collect()
}

/// Contracts two terms into one whose labels are batch, then left-kept, then right-kept.
fn pair(cx: &mut NodeCx<'_, '_>, a: Term, b: Term, later: &[char]) -> Result<Term> {
    let needs = |c: &char, other: &Term| later.contains(c) || other.labels.contains(c);
    let a = {
        let keep: Vec<char> = a.labels.iter().copied().filter(|c| needs(c, &b)).collect();
        sum_unneeded(cx, a, &keep)?
    };
    let b = {
        let keep: Vec<char> = b.labels.iter().copied().filter(|c| needs(c, &a)).collect();
        sum_unneeded(cx, b, &keep)?
    };
    let batch: Vec<char> = a
        .labels
        .iter()
        .copied()
        .filter(|c| b.labels.contains(c) && later.contains(c))
        .collect();
    let contract: Vec<char> = a
        .labels
        .iter()
        .copied()
        .filter(|c| b.labels.contains(c) && !later.contains(c))
        .collect();
    let left: Vec<char> = a
        .labels
        .iter()
        .copied()
        .filter(|c| !b.labels.contains(c))
        .collect();
    let right: Vec<char> = b
        .labels
        .iter()
        .copied()
        .filter(|c| !a.labels.contains(c))
        .collect();
    for c in batch.iter().chain(&contract) {
        let (da, db) = (dims(cx, &a, &[*c]), dims(cx, &b, &[*c]));
        if da != db {
            return Err(cx.err(format!(
                "label '{c}' has size {da:?} in one operand and {db:?} in another"
            )));
        }
    }
    let (bd, md, kd, nd) = (
        dims(cx, &a, &batch),
        dims(cx, &a, &left),
        dims(cx, &a, &contract),
        dims(cx, &b, &right),
    );
    let prod = |v: &[usize]| v.iter().product::<usize>();
    let a_order: Vec<char> = batch
        .iter()
        .chain(&left)
        .chain(&contract)
        .copied()
        .collect();
    let b_order: Vec<char> = batch
        .iter()
        .chain(&contract)
        .chain(&right)
        .copied()
        .collect();
    let av = permute(cx, a, &a_order)?;
    let bv = permute(cx, b, &b_order)?;
    let av = cx.add1(
        Op::Reshape {
            shape: vec![prod(&bd), prod(&md), prod(&kd)],
        },
        &[av],
    )?;
    let bv = cx.add1(
        Op::Reshape {
            shape: vec![prod(&bd), prod(&kd), prod(&nd)],
        },
        &[bv],
    )?;
    let mm = cx.add1(Op::MatMul, &[av, bv])?;
    let shape: Vec<usize> = bd.iter().chain(&md).chain(&nd).copied().collect();
    let v = cx.add1(Op::Reshape { shape }, &[mm])?;
    Ok(Term {
        v,
        labels: batch.into_iter().chain(left).chain(right).collect(),
    })
}

/// `t` with each label it repeats reduced to one axis holding the diagonal: the two axes moved last
/// (sizes equal, else an error), flattened, and every (n+1)-th element gathered.
fn diagonal(cx: &mut NodeCx<'_, '_>, mut t: Term) -> Result<Term> {
    while let Some((i, j)) = (0..t.labels.len()).find_map(|i| {
        (i + 1..t.labels.len())
            .find(|&j| t.labels[j] == t.labels[i])
            .map(|j| (i, j))
    }) {
        let shape = cx.ty(t.v).shape.clone();
        let n = shape[i];
        if shape[j] != n {
            return Err(cx.err(format!(
                "label '{}' names axes of sizes {n} and {}",
                t.labels[i], shape[j]
            )));
        }
        let rest: Vec<usize> = (0..shape.len()).filter(|&a| a != i && a != j).collect();
        let perm: Vec<usize> = rest.iter().copied().chain([i, j]).collect();
        let moved = cx.add1(Op::Transpose { perm }, &[t.v])?;
        let mut flat: Vec<usize> = rest.iter().map(|&a| shape[a]).collect();
        flat.push(n * n);
        let axis = flat.len() - 1;
        let flat = cx.add1(Op::Reshape { shape: flat }, &[moved])?;
        let picks: Vec<i64> = (0..n as i64).map(|k| k * (n as i64 + 1)).collect();
        let picks = Tensor::from_vec(&[n], picks)
            .ok_or_else(|| cx.err("a constant of the wrong size (a bug in mlopt's Einsum)"))?;
        let picks = cx.konst_value(picks);
        t.v = cx.add1(Op::Gather { axis }, &[flat, picks])?;
        let label = t.labels[i];
        t.labels = rest.iter().map(|&a| t.labels[a]).chain([label]).collect();
    }
    Ok(t)
}
