//! Which kernels' modules LLVM may unroll loops in (`program.rs` compiles one module of each kind per
//! code generation thread and runs `default<O3>` with or without LLVM's unrolling).

use mlopt_kir::{LoopKind, Space, Stmt};

/// Whether LLVM may unroll a module's loops. A kernel's schedule already unrolled what pays (its
/// register tiles are `unrolled` loops), and LLVM's unroller still pays on what it left serial in
/// contractions (a convolution's taps around a tile), reductions (a pool's window, a layer norm's or a
/// global pool's sums: 1.2-3x slower without it on GoogLeNet, ConvNeXt and MobileNetV3). In a kernel
/// that only maps elements (copies, concatenations, elementwise and batch-norm nests: no local buffer,
/// no store reading what it writes, no loop inside a vector loop), which is memory-bound, it only
/// multiplies the code: DenseNet-121's concatenations were half of its LLVM time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unrolling {
    Llvm,
    Schedule,
}

impl Unrolling {
    /// `Schedule` for a kernel that only maps elements, `Llvm` for the rest.
    pub(crate) fn of(k: &mlopt_kir::Kernel) -> Unrolling {
        let a = mlopt_kir::analysis::arithmetic(k);
        let maps = a.tiled + a.tiled_gather == 0.0
            && k.bufs.iter().all(|b| b.space != Space::Local)
            && maps_elements(&k.body, false);
        if maps {
            Unrolling::Schedule
        } else {
            Unrolling::Llvm
        }
    }
}

/// Whether `body` only maps elements: no loop inside a vector loop (`lanes`: `body` is inside one),
/// no store that reads the buffer it writes, nothing but loops, guards and stores.
fn maps_elements(body: &[Stmt], lanes: bool) -> bool {
    body.iter().all(|s| match s {
        Stmt::For { kind, body, .. } => {
            !(lanes && *kind == LoopKind::Serial)
                && maps_elements(body, lanes || matches!(kind, LoopKind::Vector(_)))
        }
        Stmt::If { then, .. } => maps_elements(then, lanes),
        Stmt::Store { buf, value, .. } => !mlopt_kir::analysis::expr_loads(value).contains_key(buf),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which kernels LLVM may unroll, as kernel IR text and the verdict.
    #[test]
    fn llvm_unrolls_all_but_element_maps() {
        for (text, want) in [
            // A concatenation with a batch norm: rows of vector copies.
            (
                "kernel @cat(%y: f32[2,4,16], %a: f32[1,4,16], %b: f32[1,4,16], %s: f32[2]) {
  serial %i in 0..4 {
    vector<16> %j in 0..16 {
      %y[0, %i, %j] = max((%a[0, %i, %j] * %s[0]), 0.0f32)
    }
  }
  serial %k in 0..4 {
    vector<16> %l in 0..16 {
      %y[1, %k, %l] = max((%b[0, %k, %l] * %s[1]), 0.0f32)
    }
  }
}",
                Unrolling::Schedule,
            ),
            // A max pool: the window loop runs inside the vector loop.
            (
                "kernel @pool(%y: f32[16], %x: f32[18]) {
  vector<16> %j in 0..16 {
    %y[%j] = -inff32
    serial %w in 0..3 {
      %y[%j] = max(%y[%j], %x[(%j + %w)])
    }
  }
}",
                Unrolling::Llvm,
            ),
            // A sum over rows into the output: a store that reads what it writes.
            (
                "kernel @sum(%y: f32[16], %x: f32[8,16]) {
  serial %i in 0..8 {
    vector<16> %j in 0..16 {
      %y[%j] = (%y[%j] + %x[%i, %j])
    }
  }
}",
                Unrolling::Llvm,
            ),
            // A local accumulator (a layer norm's mean).
            (
                "kernel @mean(%y: f32[1], %x: f32[16]) {
  local %acc: f32[]
  %acc[] = 0.0f32
  serial %i in 0..16 {
    %acc[] = (%acc[] + %x[%i])
  }
  %y[0] = (%acc[] * 0.0625f32)
}",
                Unrolling::Llvm,
            ),
        ] {
            let k = mlopt_kir::parse_kernel(text).unwrap();
            assert_eq!(Unrolling::of(&k), want, "{text}");
        }
    }
}
