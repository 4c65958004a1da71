//! Data-parallel launches: the outer loops whose every store depends on them, collapsed into one index
//! space cut into blocks of threads (one element per thread, or a vector of them where every store is
//! contiguous from an aligned start).

use super::*;

/// One element per thread: `for b in grid { for t in block { if b*T+t < n { body(b*T+t) } } }`; or, when
/// the body allows it ([`vectorised`]), `w` neighbouring elements per thread as one `vector<w>` loop.
pub(super) fn elementwise(
    k: &mut Kernel,
    prefix: &[(Var, u64)],
    body: Vec<Stmt>,
    n: u64,
) -> Vec<Stmt> {
    if let Some(stmts) = vectorised(k, prefix, &body, n) {
        return stmts;
    }
    let threads = if prefix.is_empty() {
        1
    } else {
        ELEMENTWISE_THREADS.min(n.div_ceil(32) * 32)
    };
    let grid = n.div_ceil(threads).max(1);
    let (b, t) = (
        k.var(format!("gb{}", k.vars.len())),
        k.var(format!("gt{}", k.vars.len())),
    );
    let g = Expr::add(
        Expr::mul(Expr::var(b), Expr::int(threads as i64)),
        Expr::var(t),
    );
    let mut inner = subst_all(&body, &delinear(prefix, &g));
    if grid * threads != n {
        inner = vec![Stmt::If {
            cond: lt(g, n),
            then: inner,
        }];
    }
    k.schedule.push(mlopt_kir::ScheduleStep::GpuElementwise {
        n,
        grid,
        threads,
        vector: None,
    });
    vec![Stmt::for_(
        b,
        grid,
        LoopKind::GpuBlock(0),
        vec![Stmt::for_(t, threads, LoopKind::GpuThread(0), inner)],
    )]
}

/// `w` elements per thread: the innermost collapsed loop `x` becomes `xv * w + l`, with `l` a `vector<w>`
/// loop, so every store (and every load that moves with `x`) touches `w` neighbouring elements starting at
/// a multiple of `w`: one 16-byte access (`ld/st.global.v4.b32`) instead of `w` narrow ones. Taken when
/// `w` (16 bytes of the widest element the body touches) divides the innermost extent, every global store
/// runs through memory with `l` from an aligned start, and no guard depends on `l` (lanes cannot branch
/// apart). Device buffers are 16-byte aligned (arena slots 64, weights 256, and the launcher checks the
/// caller's pointers), so an aligned start in elements is an aligned address.
fn vectorised(k: &mut Kernel, prefix: &[(Var, u64)], body: &[Stmt], n: u64) -> Option<Vec<Stmt>> {
    let &(x, extent) = prefix.last()?;
    let uses = buffer_uses(body);
    let widest = uses
        .keys()
        .filter(|b| k.buffer(**b).space == Space::Global)
        .map(|b| k.buffer(*b).elem.size())
        .max()?;
    let w = (16 / widest).min(8);
    if w < 2 || extent % w != 0 {
        return None;
    }
    let vars = k.vars.len();
    let (xv, l) = (k.var(format!("gx{vars}")), k.var(format!("gl{vars}")));
    let hi = Expr::mul(Expr::var(xv), Expr::int(w as i64));
    let split = |e: &Expr| split_lanes(e, x, &hi, l, w as i64);
    let inner: Vec<Stmt> = body.iter().map(|s| s.map_exprs(&split)).collect();
    if !lanes_fit(k, &inner, l, w as i64) {
        k.vars.truncate(vars);
        return None;
    }
    let mut outer = prefix.to_vec();
    outer.pop();
    outer.push((xv, extent / w));
    let m = n / w;
    let threads = ELEMENTWISE_THREADS.min(m.div_ceil(32) * 32);
    let grid = m.div_ceil(threads).max(1);
    let (b, t) = (
        k.var(format!("gb{}", k.vars.len())),
        k.var(format!("gt{}", k.vars.len())),
    );
    let g = Expr::add(
        Expr::mul(Expr::var(b), Expr::int(threads as i64)),
        Expr::var(t),
    );
    let mut body = vec![Stmt::for_(
        l,
        w,
        LoopKind::Vector(w as u32),
        subst_all(&inner, &delinear(&outer, &g)),
    )];
    if grid * threads != m {
        body = vec![Stmt::If {
            cond: lt(g, m),
            then: body,
        }];
    }
    k.schedule.push(mlopt_kir::ScheduleStep::GpuElementwise {
        n,
        grid,
        threads,
        vector: Some(w as u32),
    });
    Some(vec![Stmt::for_(
        b,
        grid,
        LoopKind::GpuBlock(0),
        vec![Stmt::for_(t, threads, LoopKind::GpuThread(0), body)],
    )])
}

/// `e` with `x` replaced by `hi + l`, where `hi` is a non-negative multiple of `w` and `0 <= l < w`. A
/// quotient or remainder of `m + l` (`m` a non-negative multiple of `w`) by a multiple `d` of `w` stays
/// in one run of `d`: it becomes `m / d`, or `m % d + l`, so the lane keeps a visible coefficient.
fn split_lanes(e: &Expr, x: Var, hi: &Expr, l: Var, w: i64) -> Expr {
    let r = |a: &Expr| split_lanes(a, x, hi, l, w);
    match e {
        Expr::Var(v) if *v == x => Expr::add(hi.clone(), Expr::var(l)),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => e.clone(),
        Expr::Binary(op @ (BinOp::Div | BinOp::Rem), a, b) => {
            let (a, b) = (r(a), r(b));
            if let Expr::Int(d) = b {
                let m = a.subst(l, &Expr::int(0));
                if d > 0
                    && d % w == 0
                    && coefficient(&a, l) == Some(1)
                    && multiple_of(&m, w)
                    && non_negative(&m)
                {
                    return if *op == BinOp::Div {
                        Expr::div(m, Expr::int(d))
                    } else {
                        Expr::add(Expr::rem(m, Expr::int(d)), Expr::var(l))
                    };
                }
            }
            rebuild_bin(*op, a, b)
        }
        Expr::Binary(op, a, b) => rebuild_bin(*op, r(a), r(b)),
        Expr::Load(buf, ix) => Expr::Load(*buf, ix.iter().map(r).collect()),
        Expr::Unary(o, a) => Expr::un(*o, r(a)),
        Expr::Fma(a, b, c) => Expr::fma(r(a), r(b), r(c)),
        Expr::Select(c, a, b) => Expr::select(r(c), r(a), r(b)),
        Expr::Cast(t, a) => Expr::cast(*t, r(a)),
    }
}

/// Whether lanes `l` (0..w) of a split body can run as one vector: it holds only loops, guards and
/// stores, no guard depends on a lane, and every global store moves with `l` element by element from a
/// multiple of `w`.
fn lanes_fit(k: &Kernel, body: &[Stmt], l: Var, w: i64) -> bool {
    body.iter().all(|s| match s {
        Stmt::For {
            kind: LoopKind::Serial | LoopKind::Unrolled,
            body,
            ..
        } => lanes_fit(k, body, l, w),
        Stmt::If { cond, then } => {
            !cond.uses(l)
                && mlopt_kir::analysis::expr_loads(cond)
                    .keys()
                    .all(|b| k.buffer(*b).space == Space::Global)
                && lanes_fit(k, then, l, w)
        }
        Stmt::Store { buf, index, .. } if k.buffer(*buf).space == Space::Global => {
            let flat = flat_index(k, *buf, index);
            coefficient(&flat, l) == Some(1) && multiple_of(&flat.subst(l, &Expr::int(0)), w)
        }
        Stmt::Store { .. } => true,
        _ => false,
    })
}
