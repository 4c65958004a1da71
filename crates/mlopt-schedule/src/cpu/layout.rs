//! Weight layouts chosen by the CPU schedule. A constant 2-D weight that vector loops read down its
//! columns (lane after lane one row apart: a gather) is stored transposed, so they read it contiguously:
//! an untiled contraction's dot products along K, which rfactor runs in vector lanes, read B[k, j] so.
//! The program gets the transposed copy as a weight of its own, and a weight no step binds any more is
//! dropped, so the library does not carry both.

use mlopt_kir::analysis::{coefficient, for_each_access};
use mlopt_kir::{BufId, Elem, Expr, Kernel, Place, Program, ScheduleStep, Var, Weight};
use std::collections::HashMap;
use std::sync::Arc;

/// Transposes every 2-D weight parameter that the vector loops of its kernel read only down its columns
/// (a kernel run by one step), and records a `transpose` step for each.
pub fn transpose_weights(p: &mut Program) {
    for ki in 0..p.kernels.len() {
        for b in p.kernels[ki].params() {
            let Some((si, pi, wi)) = bound_weight(p, ki, b) else {
                continue;
            };
            let (k, w) = (&p.kernels[ki], &p.weights[wi]);
            let [rows, cols] = k.buffer(b).dims[..] else {
                continue;
            };
            if !holds(w, w.elem, &[rows, cols]) || !read_down_columns(k, b) {
                continue;
            }
            let t = transposed(w);
            p.weights.push(t);
            p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);
            let k = &mut p.kernels[ki];
            k.bufs[b.0 as usize].dims = vec![cols, rows];
            k.body = k
                .body
                .iter()
                .map(|s| {
                    s.map_loads(&|x, ix| {
                        if x == b && ix.len() == 2 {
                            Expr::load(x, vec![ix[1].clone(), ix[0].clone()])
                        } else {
                            Expr::load(x, ix)
                        }
                    })
                })
                .collect();
            let name = k.buffer(b).name.clone();
            k.schedule.push(ScheduleStep::Transpose { buf: name });
        }
    }
    drop_unbound_weights(p);
}

/// Whether `b` is read in vector loops, and there always a row apart per lane and in the same column.
fn read_down_columns(k: &Kernel, b: BufId) -> bool {
    let (mut seen, mut ok) = (false, true);
    for_each_access(&k.body, &mut |x, ix, vector, _| {
        if let (true, Some(v)) = (x == b, vector) {
            seen = true;
            ok &= ix.len() == 2
                && coefficient(&ix[0], v) == Some(1)
                && coefficient(&ix[1], v) == Some(0);
        }
    });
    seen && ok
}

/// Operand `e` of a contraction in kernel `ki` reading `f32(W[..])` of a constant bf16 weight that
/// nothing else in the kernel reads (`loads`), as a load of an f32 copy of W, a weight of its own bound
/// in W's place (exact: a bf16 is an f32's high half). fp32 register tiles then read it as it is: a
/// bf16 1x1 convolution too narrow for the matrix unit broadcast each weight through a conversion, and
/// a bf16 MatMul's B could not be packed. Any other operand is returned as it is.
pub(super) fn widen_bf16_weight(
    p: &mut Program,
    ki: usize,
    e: &Expr,
    loads: &HashMap<BufId, usize>,
) -> Expr {
    let Expr::Cast(Elem::F32, x) = e else {
        return e.clone();
    };
    let Expr::Load(w, ix) = &**x else {
        return e.clone();
    };
    let Some((si, pi, wi)) = bound_weight(p, ki, *w) else {
        return e.clone();
    };
    let weight = &p.weights[wi];
    if loads.get(w) != Some(&1)
        || weight.elem != Elem::BF16
        || p.kernels[ki].buffer(*w).elem != Elem::BF16
    {
        return e.clone();
    }
    let data: Vec<u8> = weight
        .data
        .chunks_exact(2)
        .flat_map(|b| (u32::from(u16::from_le_bytes([b[0], b[1]])) << 16).to_le_bytes())
        .collect();
    let wide = Weight {
        name: format!("{}.f32", weight.name),
        elem: Elem::F32,
        dims: weight.dims.clone(),
        data: Arc::new(data),
    };
    p.weights.push(wide);
    p.steps[si].args[pi] = Place::Weight(p.weights.len() - 1);
    p.kernels[ki].bufs[w.0 as usize].elem = Elem::F32;
    Expr::load(*w, ix.clone())
}

/// The weight that the one step running kernel `ki` binds to its parameter `b`: (step, parameter
/// position, weight). None when several steps run the kernel or `b` is not bound to a weight.
pub(super) fn bound_weight(p: &Program, ki: usize, b: BufId) -> Option<(usize, usize, usize)> {
    let steps: Vec<usize> = (0..p.steps.len())
        .filter(|s| p.steps[*s].kernel == ki)
        .collect();
    let [si] = steps[..] else { return None };
    let pi = p.kernels[ki].params().iter().position(|x| *x == b)?;
    match p.steps[si].args.get(pi) {
        Some(Place::Weight(wi)) if *wi < p.weights.len() => Some((si, pi, *wi)),
        _ => None,
    }
}

/// Whether weight `w` is all of an array of `elem` of dimensions `dims`.
pub(super) fn holds(w: &Weight, elem: Elem, dims: &[u64]) -> bool {
    w.elem == elem
        && w.dims == dims
        && w.data.len() as u64 == dims.iter().product::<u64>() * elem.size()
}

/// The weight that `e` reads as `W[vars..]` (exactly these loop variables, in order) when nothing else
/// in kernel `ki` reads it (`loads`): its buffer and the (step, parameter, weight) binding it.
pub(super) fn weight_read_at(
    p: &Program,
    ki: usize,
    e: &Expr,
    vars: &[Var],
    loads: &HashMap<BufId, usize>,
) -> Option<(BufId, (usize, usize, usize))> {
    let Expr::Load(w, ix) = e else { return None };
    let at_vars = ix.len() == vars.len() && ix.iter().zip(vars).all(|(x, v)| *x == Expr::var(*v));
    if !at_vars || loads.get(w) != Some(&1) {
        return None;
    }
    Some((*w, bound_weight(p, ki, *w)?))
}

/// A weight a contraction reads as one of its operands.
pub(super) struct WeightOperand {
    pub(super) buf: BufId,
    /// Read `W[j, r, ..]`, not `W[r, j, ..]`.
    pub(super) trans: bool,
    /// Axes of one element after the two.
    pub(super) ones: usize,
    /// (step, parameter, weight) binding it.
    pub(super) bound: (usize, usize, usize),
}

/// The weight that `e` reads as `W[r, j, 0..]` by reduction loop `r` and column loop `j` (or
/// `W[j, r, 0..]`, transposed), when nothing else in kernel `ki` reads it (`loads`).
pub(super) fn weight_operand(
    p: &Program,
    ki: usize,
    e: &Expr,
    (r, j): (Var, Var),
    loads: &HashMap<BufId, usize>,
) -> Option<WeightOperand> {
    let Expr::Load(w, ix) = e else { return None };
    let [Expr::Var(a), Expr::Var(b), ones @ ..] = &ix[..] else {
        return None;
    };
    let trans = match (*a, *b) {
        x if x == (r, j) => false,
        x if x == (j, r) => true,
        _ => return None,
    };
    if !ones.iter().all(|e| *e == Expr::int(0)) || loads.get(w) != Some(&1) {
        return None;
    }
    Some(WeightOperand {
        buf: *w,
        trans,
        ones: ones.len(),
        bound: bound_weight(p, ki, *w)?,
    })
}

/// `w` [rows, cols] as [cols, rows].
fn transposed(w: &Weight) -> Weight {
    let ([rows, cols], size) = (
        [w.dims[0] as usize, w.dims[1] as usize],
        w.elem.size() as usize,
    );
    let mut data = Vec::with_capacity(w.data.len());
    for c in 0..cols {
        for r in 0..rows {
            let at = (r * cols + c) * size;
            data.extend_from_slice(&w.data[at..at + size]);
        }
    }
    Weight {
        name: format!("{}.t", w.name),
        elem: w.elem,
        dims: vec![w.dims[1], w.dims[0]],
        data: Arc::new(data),
    }
}

/// Removes the weights no step binds, renumbering the others.
pub(super) fn drop_unbound_weights(p: &mut Program) {
    let mut bound = vec![false; p.weights.len()];
    for a in p.steps.iter().flat_map(|s| &s.args) {
        if let Some(b) = match a {
            Place::Weight(i) => bound.get_mut(*i),
            _ => None,
        } {
            *b = true;
        }
    }
    let mut at = vec![0; p.weights.len()];
    let mut kept = Vec::new();
    for (i, w) in std::mem::take(&mut p.weights).into_iter().enumerate() {
        if bound[i] {
            at[i] = kept.len();
            kept.push(w);
        }
    }
    p.weights = kept;
    for a in p.steps.iter_mut().flat_map(|s| &mut s.args) {
        if let Place::Weight(i) = a {
            *i = at.get(*i).copied().unwrap_or(*i);
        }
    }
}

// The transpose is held by tests/filetests/schedule/cpu_weight_transposed.kir.
