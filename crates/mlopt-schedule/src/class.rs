//! What each top-level loop nest of a kernel computes, recognised once from the algorithm lowering
//! writes, as typed data the CPU and GPU schedulers read instead of matching the nest again:
//!
//! - a **contraction** (`contraction.rs`: rows, columns, batch and reduction loops, its two operands
//!   and its epilogue) — MatMul, Gemm, a pointwise convolution, Winograd's GEMMs;
//! - a **convolution**: a contraction whose column operand reads a window of its input (`window.rs`:
//!   per spatial axis its stride, dilation, padding and guard);
//! - **attention** over one query row at a time (`attention.rs`);
//! - anything else (elementwise, reductions, normalisations, pooling folds), which the loop schedules
//!   take as it is.
//!
//! A rewrite that writes new algorithm nests (Winograd) gives their classes with them.

use crate::attention::Attention;
use crate::contraction::Contraction;
use crate::window::{Axis, Window};
use mlopt_kir::{Kernel, LoopKind, Stmt, Var};

/// A top-level nest's class.
pub(crate) enum Class {
    Contraction(Contraction),
    Convolution(Contraction, Window),
    Attention(Attention),
    Other,
}

impl Class {
    /// The class of each of `k`'s top-level statements, in order.
    pub(crate) fn of_kernel(k: &mut Kernel) -> Vec<Class> {
        let body = std::mem::take(&mut k.body);
        let classes = body.iter().map(|st| Class::of(k, st)).collect();
        k.body = body;
        classes
    }

    /// The class of statement `st` of kernel `k` (a window's positions become variables of `k`).
    pub(crate) fn of(k: &mut Kernel, st: &Stmt) -> Class {
        let (prefix, inner) = serial_prefix(st);
        if let Some(a) = crate::attention::recognise(k, &prefix, inner) {
            return Class::Attention(a);
        }
        let Some(c) = crate::contraction::recognise(k, &prefix, inner) else {
            return Class::Other;
        };
        match window(k, &c) {
            Some(w) => Class::Convolution(c, w),
            None => Class::Contraction(c),
        }
    }
}

/// The perfect nest of serial loops `st` starts (none when it is no loop), and the body inside it.
pub(crate) fn serial_prefix(st: &Stmt) -> (Vec<(Var, u64)>, &[Stmt]) {
    let mut prefix = Vec::new();
    let mut cur = std::slice::from_ref(st);
    while let [Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    }] = cur
    {
        prefix.push((*var, *extent));
        cur = body;
    }
    (prefix, cur)
}

/// The window of contraction `c`'s column operand when it is a convolution's: K is the input channels
/// then one tap per spatial axis (`window::recognise` checks the rest). None for a pointwise
/// convolution, which is a plain contraction over the output positions.
fn window(k: &mut Kernel, c: &Contraction) -> Option<Window> {
    let loops: Vec<Var> = [&c.batch, &c.rows, &c.cols, &c.red]
        .iter()
        .flat_map(|l| l.iter().map(|(v, _)| *v))
        .collect();
    let taps = c.red.get(1..).filter(|t| !t.is_empty())?;
    let pointwise = |axes: &[Axis]| {
        taps.iter().all(|(_, e)| *e == 1) && axes.iter().all(|a| a.stride == 1 && a.pad == 0)
    };
    let w = crate::window::recognise(k, &c.b, taps, &c.cols, &loops, &|axes| !pointwise(axes))?;
    (!c.rows.iter().any(|(v, _)| w.input.uses(*v))).then_some(w)
}
