//! Split-K: a contraction whose tiles are too few to fill the GPU and whose K is long (ResNet-50's last
//! 3x3 convolutions: 512 x 49 outputs, K = 4608, 32 blocks walking 288 slices each, every slice at
//! least a load's latency) runs as two launches,
//!
//! ```text
//! serial %s in 0..S {                         ; a contraction with S times the blocks (s is a batch loop)
//!   <the nest, its outermost K loop %r cut to 0..E/S, read at %s * E/S + %r'>
//!   %part[%s, i..] = %acc[]
//! }
//! <the nest's data-parallel loops> {          ; elementwise: each output adds its S partial sums
//!   %sum[] = 0.0f32
//!   serial %s' in 0..S { %sum[] = %sum[] + %part[%s', i..] }
//!   <the epilogue, reading %sum[]>
//! }
//! ```
//!
//! and `%part`, a local both launches use, becomes a scratch buffer as any such local does. S divides the
//! outermost reduction loop's extent (no guards), and is at most 16 (the sum's loop stays a short serial
//! one). The cost model chooses: the tiled GEMM's best estimate for each S, plus the sum's launch and
//! traffic, against the best estimate unsplit. The terms of each output's sum are the same; their order
//! changes, as it does between tiles on tensor cores.

use super::gemm;
use super::GpuSchedule;
use crate::class::{serial_prefix, Class};
use crate::contraction::Contraction;
use mlopt_kir::{BufId, Elem, Expr, Kernel, LoopKind, ScheduleStep, Space, Stmt, Var};

/// The most partial sums per output.
const MAX_PARTS: u64 = 16;
/// K a part walks at least: two slices of the largest staging step.
const MIN_PART_K: u64 = 64;
/// A split must beat the unsplit estimate by this factor, so a near tie keeps one launch.
const GAIN: f64 = 0.8;
/// The partial sums' scratch at most.
const MAX_PART_BYTES: u64 = 64 << 20;

/// A launch's body and the step that records how it came to be (split-K's, for both of its launches).
pub(super) type Launch = (Vec<Stmt>, Option<ScheduleStep>);

/// The launches of `launches` with each contraction that split-K pays for replaced by its two
/// launches; the partial sums' buffers are added to `k`.
pub(super) fn expand(k: &mut Kernel, launches: Vec<Vec<Stmt>>, s: &GpuSchedule) -> Vec<Launch> {
    let mut out = Vec::new();
    for body in launches {
        match split(k, &body, s) {
            Some((parts, kdim, partial, sum)) => {
                let step = ScheduleStep::GpuSplitK { parts, k: kdim };
                out.push((partial, Some(step.clone())));
                out.push((sum, Some(step)));
            }
            None => out.push((body, None)),
        }
    }
    out
}

/// The two launches of `body` (one nest) when split-K pays: (S, K, the partial launch, the sum's).
fn split(
    k: &mut Kernel,
    body: &[Stmt],
    s: &GpuSchedule,
) -> Option<(u64, u64, Vec<Stmt>, Vec<Stmt>)> {
    let [nest] = body else {
        return None;
    };
    // Classes and candidates are worked out on a copy: the variables they make stay out of `k` unless
    // the split is chosen.
    let mut probe = k.clone();
    let c = match Class::of(&mut probe, nest) {
        Class::Contraction(c) | Class::Convolution(c, _) if c.sum == mlopt_kir::Elem::F32 => c,
        _ => return None,
    };
    let (whole, _) = gemm::plan(&probe, &c, s)?;
    let (m, n, kdim, batch) = (
        Contraction::extent(&c.rows),
        Contraction::extent(&c.cols),
        Contraction::extent(&c.red),
        Contraction::extent(&c.batch),
    );
    let &(r0, e0) = c.red.first()?;
    let sv = probe.var(format!("ks{}", probe.vars.len()));
    let rv = probe.var(format!("kr{}", probe.vars.len()));
    // Each S's contraction as the tiled GEMM will see it: S a batch loop, the outer K loop cut.
    let mut best: Option<(f64, u64)> = None;
    for parts in (2..=MAX_PARTS).filter(|p| e0.is_multiple_of(*p)) {
        let out_bytes = parts * batch * m * n * 4;
        if kdim / parts < MIN_PART_K || out_bytes > MAX_PART_BYTES {
            continue;
        }
        let at = cut_at(sv, rv, e0 / parts);
        let mut cut = c.clone();
        cut.batch.insert(0, (sv, parts));
        cut.red[0] = (rv, e0 / parts);
        cut.a = cut.a.subst(r0, &at);
        cut.b = cut.b.subst(r0, &at);
        let Some((time, _)) = gemm::plan(&probe, &cut, s) else {
            continue;
        };
        // The sum's launch reads the partials and writes each output once.
        let sum = s.target.roof.launch_s
            + ((parts + 1) * batch * m * n * 4) as f64 / s.target.roof.dram_bw;
        if best.is_none_or(|(t, _)| time + sum < t) {
            best = Some((time + sum, parts));
        }
    }
    let (time, parts) = best?;
    if time >= GAIN * whole {
        return None;
    }
    let (partial, sum) = rewrite(k, nest, c.acc, parts)?;
    Some((parts, kdim, partial, sum))
}

/// The position in the original outer K loop of part `sv`'s iteration `rv`, `per` iterations a part.
fn cut_at(sv: Var, rv: Var, per: u64) -> Expr {
    Expr::add(
        Expr::mul(Expr::var(sv), Expr::int(per as i64)),
        Expr::var(rv),
    )
}

/// The partial and the sum nests of `nest` (a contraction into the accumulator `acc`) in `parts` parts
/// (see the module comment).
fn rewrite(k: &mut Kernel, nest: &Stmt, acc: BufId, parts: u64) -> Option<(Vec<Stmt>, Vec<Stmt>)> {
    let (prefix, inner) = serial_prefix(nest);
    let [zero, Stmt::For {
        var: r0,
        extent: e0,
        kind: LoopKind::Serial,
        body: red,
    }, epilogue @ ..] = inner
    else {
        return None;
    };
    let id = k.vars.len();
    let sv = k.var(format!("ks{id}"));
    let rv = k.var(format!("kr{id}"));
    let mut dims = vec![parts];
    dims.extend(prefix.iter().map(|(_, e)| *e));
    let part = k.buf(format!("part{id}"), Elem::F32, dims, Space::Local);
    let sum = k.buf(format!("sum{id}"), Elem::F32, vec![], Space::Local);
    let s2 = k.var(format!("ks{}", k.vars.len()));
    let at_part = |p: Var| -> Vec<Expr> {
        std::iter::once(Expr::var(p))
            .chain(prefix.iter().map(|(v, _)| Expr::var(*v)))
            .collect()
    };
    let at = cut_at(sv, rv, e0 / parts);
    let cut: Vec<Stmt> = red
        .iter()
        .map(|st| st.subst_all(&[(*r0, at.clone())]))
        .collect();
    let partial_inner = vec![
        zero.clone(),
        Stmt::for_(rv, e0 / parts, LoopKind::Serial, cut),
        Stmt::Store {
            buf: part,
            index: at_part(sv),
            value: Expr::load(acc, vec![]),
        },
    ];
    let mut sum_inner = vec![
        Stmt::Store {
            buf: sum,
            index: vec![],
            value: Expr::f32(0.0),
        },
        Stmt::for_(
            s2,
            parts,
            LoopKind::Serial,
            vec![Stmt::Store {
                buf: sum,
                index: vec![],
                value: Expr::add(Expr::load(sum, vec![]), Expr::load(part, at_part(s2))),
            }],
        ),
    ];
    sum_inner.extend(epilogue.iter().map(|st| {
        st.map_loads(&|b: BufId, ix| {
            if b == acc {
                Expr::load(sum, vec![])
            } else {
                Expr::Load(b, ix)
            }
        })
    }));
    let wrap = |body: Vec<Stmt>| {
        prefix.iter().rev().fold(body, |body, (v, e)| {
            vec![Stmt::for_(*v, *e, LoopKind::Serial, body)]
        })
    };
    let partial = vec![Stmt::for_(sv, parts, LoopKind::Serial, wrap(partial_inner))];
    Some((partial, wrap(sum_inner)))
}

#[cfg(test)]
mod tests {
    use super::split;
    use mlopt_kir::parse_kernel;

    /// The parts split-K chooses for an M x N x K f32 matmul on an A100, None for no split.
    fn parts(m: u64, n: u64, k: u64) -> Option<u64> {
        let text = format!(
            "kernel @mm(%out: f32[{m},{n}], %a: f32[{m},{k}], %b: f32[{k},{n}]) {{
  local %acc: f32[]
  serial %i in 0..{m} {{
    serial %j in 0..{n} {{
      %acc[] = 0.0f32
      serial %r in 0..{k} {{
        %acc[] = fma(%a[%i, %r], %b[%r, %j], %acc[])
      }}
      %out[%i, %j] = %acc[]
    }}
  }}
}}
"
        );
        let mut kernel = parse_kernel(&text).unwrap();
        let body = kernel.body.clone();
        let vars = kernel.vars.len();
        let got = split(&mut kernel, &body, &crate::gpu::sm80()).map(|(p, ..)| p);
        if got.is_none() {
            assert_eq!(
                kernel.vars.len(),
                vars,
                "a split not taken adds no variables"
            );
        }
        got
    }

    /// Few tiles and a long K split; a grid that fills the GPU, or a short K, does not.
    #[test]
    fn split_k_where_the_grid_is_small_and_k_long() {
        assert_eq!(parts(16, 24, 2048), Some(16));
        assert_eq!(parts(512, 49, 4608), Some(16));
        assert_eq!(parts(2048, 2048, 2048), None);
        assert_eq!(parts(16, 24, 64), None);
    }
}
