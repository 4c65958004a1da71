//! The kernel verifier: types agree, every loop variable is used only inside its loop, vector loops divide
//! evenly, and every access is in bounds, provably: the interval of each index expression, from its loop
//! ranges and any enclosing guard (`if lt(e, n)`, `if le(0, e)` and their `and`), must lie inside the
//! buffer's dimension (a loop of extent 0 never runs, so nothing under it is checked against
//! anything). All errors are collected, each naming the kernel and the statement.

use crate::ir::*;
use crate::print;
use crate::program::*;
use std::collections::HashMap;

/// An inclusive integer interval.
pub type Range = (i64, i64);

struct Verifier<'k> {
    k: &'k Kernel,
    env: HashMap<Var, Range>,
    facts: Vec<(Expr, Range)>,
    errors: Vec<String>,
}

/// Verifies a kernel; on failure returns every problem found, one per line.
pub fn verify(k: &Kernel) -> Result<(), Vec<String>> {
    let mut v = Verifier {
        k,
        env: HashMap::new(),
        facts: Vec::new(),
        errors: Vec::new(),
    };
    for (i, b) in k.bufs.iter().enumerate() {
        if k.bufs[..i].iter().any(|o| o.name == b.name) {
            v.errors.push(format!(
                "kernel @{}: buffer %{} declared twice",
                k.name, b.name
            ));
        }
    }
    v.block(&k.body);
    v.errors.extend(crate::gpu::check(k));
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(v.errors)
    }
}

/// Verifies every kernel of a program and that each step passes arguments of the right count.
pub fn verify_program(p: &Program) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    for k in &p.kernels {
        if let Err(e) = verify(k) {
            errors.extend(e);
        }
    }
    for (i, s) in p.steps.iter().enumerate() {
        match p.kernels.get(s.kernel) {
            None => errors.push(format!("step {i}: no kernel {}", s.kernel)),
            Some(k) if k.params().len() != s.args.len() => errors.push(format!(
                "step {i}: @{} takes {} buffers, given {}",
                k.name,
                k.params().len(),
                s.args.len()
            )),
            Some(_) => {}
        }
        for g in &s.guard {
            let inside = match g.place {
                Place::Input(j) => j < p.inputs.len(),
                Place::Output(j) => j < p.outputs.len(),
                Place::Weight(j) => j < p.weights.len(),
                Place::Arena(o) => o < p.arena_bytes,
            };
            if !inside {
                errors.push(format!(
                    "step {i}: guard {:?} is outside the program",
                    g.place
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

impl Verifier<'_> {
    fn err(&mut self, what: String) {
        self.errors.push(format!("kernel @{}: {what}", self.k.name));
    }

    fn block(&mut self, body: &[Stmt]) {
        for s in body {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                if self.env.contains_key(var) {
                    self.err(format!(
                        "loop variable %{} bound twice",
                        self.k.var_name(*var)
                    ));
                }
                if let LoopKind::Vector(w) = kind {
                    if *w == 0 || extent % *w as u64 != 0 {
                        self.err(format!(
                            "vector<{w}> loop %{} has extent {extent}, not a multiple",
                            self.k.var_name(*var)
                        ));
                    }
                }
                // What the loop stores may change from one iteration to the next: a guard's bound on
                // an expression that reads it holds for the first iteration only.
                let mut stored = vec![];
                stores(body, &mut stored);
                for b in stored {
                    self.forget(b);
                }
                // A loop of extent 0 never runs: nothing under it can go out of bounds.
                if *extent > 0 {
                    self.env.insert(*var, (0, *extent as i64 - 1));
                    self.block(body);
                    self.env.remove(var);
                }
            }
            Stmt::Store { buf, index, value } => {
                let what = format!("store to %{}", self.k.buffer(*buf).name);
                self.access(*buf, index, &what);
                // A guard's bound on an expression that reads the buffer no longer holds after it.
                self.forget(*buf);
                let vt = self.ty(value, &what);
                let bt = self.k.buffer(*buf).elem;
                if let Some(vt) = vt {
                    if vt != bt {
                        self.err(format!("{what}: value is {vt}, buffer is {bt}"));
                    }
                }
            }
            Stmt::If { cond, then } => {
                if let Some(t) = self.ty(cond, "if condition") {
                    if t != Elem::Bool {
                        self.err(format!(
                            "if condition {} is {t}, not bool",
                            print::expr(self.k, cond)
                        ));
                    }
                }
                let before = self.facts.len();
                self.learn(cond);
                self.block(then);
                self.facts.truncate(before);
            }
            Stmt::Barrier => {}
            Stmt::Mma {
                m,
                n,
                k,
                c,
                a,
                b,
                acc: _,
                ahead: _,
            } => {
                // Each block's first and last element must be in bounds (the indices are affine, so
                // every element between them is too), and the types are the matrix engine's: A's
                // (bf16 or i16) for B, its accumulator's for C.
                let op = self.k.buffer(a.buf).elem;
                let Some(sum) = crate::ir::mma_acc(op) else {
                    self.err(format!(
                        "mma a block %{}: is {op}, must be bf16 or i16",
                        self.k.buffer(a.buf).name
                    ));
                    return;
                };
                for (x, rows, cols, elem, what) in [
                    (c, *m, *n, sum, "c"),
                    (a, *m, *k, op, "a"),
                    (b, k / 2, 2 * n, op, "b"),
                ] {
                    let what = format!("mma {what} block %{}", self.k.buffer(x.buf).name);
                    if x.at.len() < 2 || rows == 0 || cols == 0 {
                        self.err(format!(
                            "{what}: needs a buffer of rank 2 or more and a non-empty block"
                        ));
                        continue;
                    }
                    if self.k.buffer(x.buf).elem != elem {
                        self.err(format!(
                            "{what}: is {}, must be {elem}",
                            self.k.buffer(x.buf).elem
                        ));
                    }
                    self.access(x.buf, &x.at, &what);
                    let last = x.index(Expr::int(rows as i64 - 1), Expr::int(cols as i64 - 1));
                    self.access(x.buf, &last, &what);
                }
                if k % 2 != 0 {
                    self.err(format!("mma: k = {k} is not even"));
                }
            }
            Stmt::WarpMma { c, a, b } => {
                // c: four f32 accumulators of this thread; a: 16 x K and b: K x 8 of one element type.
                let t = self.k.buffer(a.buf).elem;
                let depth = crate::ir::warp_mma_k(t);
                if !matches!(t, Elem::BF16 | Elem::F16 | Elem::F32) {
                    self.err(format!(
                        "mma.sync: a is {t}; it takes bf16, f16 or f32 (as tf32)"
                    ));
                }
                for (x, rows, cols, space, want, what) in [
                    (c, 1, 4, Space::Local, Elem::F32, "c"),
                    (a, 16, depth, Space::Shared, t, "a"),
                    (b, depth, 8, Space::Shared, t, "b"),
                ] {
                    let buf = self.k.buffer(x.buf);
                    let what = format!("mma.sync {what} block %{}", buf.name);
                    if x.at.len() < 2 {
                        self.err(format!("{what}: needs a buffer of rank 2 or more"));
                        continue;
                    }
                    if buf.space != space {
                        self.err(format!(
                            "{what}: must be a {} buffer",
                            if space == Space::Local {
                                "local"
                            } else {
                                "shared"
                            }
                        ));
                    }
                    if buf.elem != want {
                        self.err(format!("{what}: is {}, must be {want}", buf.elem));
                    }
                    self.access(x.buf, &x.at, &what);
                    let last = x.index(Expr::int(rows as i64 - 1), Expr::int(cols as i64 - 1));
                    self.access(x.buf, &last, &what);
                }
            }
            Stmt::CopyAsync {
                dst,
                src,
                from,
                lanes,
                valid,
            } => {
                let (d, sb) = (self.k.buffer(dst.buf), self.k.buffer(*src));
                let what = format!("cp.async %{} <- %{}", d.name, sb.name);
                if d.space != Space::Shared || sb.space != Space::Global {
                    self.err(format!(
                        "{what}: copies from a global buffer into a shared one"
                    ));
                }
                if d.elem != sb.elem {
                    self.err(format!(
                        "{what}: %{} is {}, %{} is {}",
                        d.name, d.elem, sb.name, sb.elem
                    ));
                }
                if ![4, 8, 16].contains(&(lanes * d.elem.size())) {
                    self.err(format!(
                        "{what}: {lanes} x {} moves {} bytes, not 4, 8 or 16",
                        d.elem,
                        lanes * d.elem.size()
                    ));
                }
                // The first element in bounds, and copies whole and aligned: each starts on a multiple of its
                // width, which divides the buffer's size, so its last element is in bounds too.
                let starts = [
                    (
                        dst.buf,
                        crate::analysis::flat_index(self.k, dst.buf, &dst.at),
                    ),
                    (*src, from.clone()),
                ];
                for (b, flat) in &starts {
                    let whole = self.k.buffer(*b).numel().is_multiple_of(*lanes);
                    if *lanes > 1 && (!whole || !crate::analysis::multiple_of(flat, *lanes as i64))
                    {
                        self.err(format!(
                            "{what}: %{} element {} is not shown to start on a multiple of {lanes} elements, in a buffer they divide",
                            self.k.buffer(*b).name,
                            print::expr(self.k, flat)
                        ));
                    }
                }
                self.access(dst.buf, &dst.at, &what);
                if let Some(c) = valid {
                    if let Some(t) = self.ty(c, &what) {
                        if t != Elem::Bool {
                            self.err(format!(
                                "{what}: validity {} is {t}, not bool",
                                print::expr(self.k, c)
                            ));
                        }
                    }
                }
                // The source is read only where the copy is valid.
                let before = self.facts.len();
                if let Some(c) = valid {
                    self.learn(c);
                }
                self.ty(from, &what);
                let (lo, hi) = self.range(from);
                let n = self.k.buffer(*src).numel() as i64;
                if lo < 0 || hi >= n {
                    self.err(format!(
                        "{what}: element {} may leave 0..{n} (range {lo}..={hi})",
                        print::expr(self.k, from)
                    ));
                }
                self.facts.truncate(before);
            }
            Stmt::AsyncWait => {}
            // Any element, even past the end: a prefetch reads nothing.
            Stmt::Prefetch { buf, at } => {
                let what = format!("prefetch of %{}", self.k.buffer(*buf).name);
                if self.k.buffer(*buf).space != Space::Global {
                    self.err(format!("{what}: not a global buffer"));
                }
                if !matches!(self.ty(at, &what), Some(Elem::I64) | None) {
                    self.err(format!("{what}: the element is not an integer"));
                }
            }
            Stmt::WarpReduce { buf, op } => {
                let b = self.k.buffer(*buf);
                if b.space != Space::Local
                    || !b.dims.is_empty()
                    || !matches!(b.elem, Elem::F32 | Elem::I32)
                {
                    self.err(format!(
                        "warp.reduce %{}: needs a local f32 or i32 scalar",
                        b.name
                    ));
                }
                if !matches!(op, BinOp::Add | BinOp::Mul | BinOp::Min | BinOp::Max) {
                    self.err(format!(
                        "warp.reduce %{}: {} is not a reduction",
                        b.name,
                        print::binop_name(*op)
                    ));
                }
            }
        }
    }

    /// Drops what the guards said of expressions that read `b` (their bounds stay in place, unbounded,
    /// so each guard's facts are still removed at the end of its block).
    fn forget(&mut self, b: BufId) {
        for (e, r) in &mut self.facts {
            if e.reads(b) {
                *r = (i64::MIN, i64::MAX);
            }
        }
    }

    /// Records the bounds a guard establishes.
    fn learn(&mut self, c: &Expr) {
        match c {
            Expr::Binary(BinOp::And, a, b) => {
                self.learn(a);
                self.learn(b);
            }
            Expr::Binary(BinOp::Lt, e, n) => {
                let (_, hi) = self.range(n);
                self.facts
                    .push(((**e).clone(), (i64::MIN, hi.saturating_sub(1))));
            }
            Expr::Binary(BinOp::Le, n, e) if matches!(**n, Expr::Int(_)) => {
                let (lo, _) = self.range(n);
                self.facts.push(((**e).clone(), (lo, i64::MAX)));
            }
            Expr::Binary(BinOp::Le, e, n) => {
                let (_, hi) = self.range(n);
                self.facts.push(((**e).clone(), (i64::MIN, hi)));
            }
            _ => {}
        }
    }

    fn access(&mut self, b: BufId, index: &[Expr], what: &str) {
        let Some(buf) = self.k.bufs.get(b.0 as usize) else {
            self.err(format!("{what}: no buffer {}", b.0));
            return;
        };
        if index.len() != buf.dims.len() {
            self.err(format!(
                "{what}: {} indices for a {}-d buffer",
                index.len(),
                buf.dims.len()
            ));
            return;
        }
        for (d, e) in index.iter().enumerate() {
            if let Some(t) = self.ty(e, what) {
                if t != Elem::I64 {
                    self.err(format!(
                        "{what}: index {} is {t}, not i64",
                        print::expr(self.k, e)
                    ));
                }
            }
            let (lo, hi) = self.range(e);
            if lo < 0 || hi >= buf.dims[d] as i64 {
                let show = |x: i64| {
                    if x == i64::MIN || x == i64::MAX {
                        "unbounded".to_string()
                    } else {
                        x.to_string()
                    }
                };
                self.err(format!(
                    "{what}: index {d} = {} may leave 0..{} (range {}..={})",
                    print::expr(self.k, e),
                    buf.dims[d],
                    show(lo),
                    show(hi)
                ));
            }
        }
    }

    /// The interval of an integer expression; `i64::MIN`/`i64::MAX` stand for unbounded ends.
    fn range(&self, e: &Expr) -> Range {
        let mut r = self.range_raw(e);
        for (f, (lo, hi)) in &self.facts {
            if f == e {
                r = (r.0.max(*lo), r.1.min(*hi));
            }
        }
        r
    }

    fn range_raw(&self, e: &Expr) -> Range {
        const ANY: Range = (i64::MIN, i64::MAX);
        match e {
            Expr::Int(v) => (*v, *v),
            Expr::Var(v) => self.env.get(v).copied().unwrap_or(ANY),
            Expr::Binary(o, ea, eb) => {
                let (a, b) = (self.range(ea), self.range(eb));
                match o {
                    BinOp::Add => (a.0.saturating_add(b.0), a.1.saturating_add(b.1)),
                    BinOp::Sub => (a.0.saturating_sub(b.1), a.1.saturating_sub(b.0)),
                    BinOp::Mul => {
                        let c = [
                            a.0.saturating_mul(b.0),
                            a.0.saturating_mul(b.1),
                            a.1.saturating_mul(b.0),
                            a.1.saturating_mul(b.1),
                        ];
                        (
                            c.into_iter().min().unwrap_or(i64::MIN),
                            c.into_iter().max().unwrap_or(i64::MAX),
                        )
                    }
                    BinOp::Div if b.0 == b.1 && b.0 > 0 && a.0 >= 0 => (a.0 / b.0, a.1 / b.0),
                    // A multiple of g modulo a multiple of g stays a multiple of g: at most d - g.
                    BinOp::Rem if b.0 == b.1 && b.0 > 0 && a.0 >= 0 => {
                        let g = crate::analysis::gcd(crate::analysis::factor(ea), b.0);
                        (0, (b.0 - g).min(a.1))
                    }
                    BinOp::Min => (a.0.min(b.0), a.1.min(b.1)),
                    BinOp::Max => (a.0.max(b.0), a.1.max(b.1)),
                    _ => ANY,
                }
            }
            Expr::Select(_, a, b) => {
                let (a, b) = (self.range(a), self.range(b));
                (a.0.min(b.0), a.1.max(b.1))
            }
            _ => ANY,
        }
    }

    /// The type of an expression; reports mismatches and returns None for an ill-typed one.
    fn ty(&mut self, e: &Expr, what: &str) -> Option<Elem> {
        match e {
            Expr::Int(_) => Some(Elem::I64),
            Expr::Float(_, t) => Some(*t),
            Expr::Var(v) => {
                if !self.env.contains_key(v) {
                    self.err(format!(
                        "{what}: %{} used outside its loop",
                        self.k.vars.get(v.0 as usize).map_or("?", |s| s.as_str())
                    ));
                }
                Some(Elem::I64)
            }
            Expr::Load(b, ix) => {
                self.access(*b, ix, &format!("{what}: load"));
                self.k.bufs.get(b.0 as usize).map(|b| b.elem)
            }
            Expr::Unary(o, a) => {
                let t = self.ty(a, what)?;
                let ok = match o {
                    UnOp::Not => !t.is_float(),
                    UnOp::Neg | UnOp::Abs => t != Elem::Bool,
                    _ => t.is_float(),
                };
                if !ok {
                    self.err(format!("{what}: {} of {t}", print::unop_name(*o)));
                }
                Some(t)
            }
            Expr::Binary(o, a, b) => {
                let (ta, tb) = (self.ty(a, what)?, self.ty(b, what)?);
                if ta != tb {
                    self.err(format!(
                        "{what}: {} of {ta} and {tb} in {}",
                        print::binop_name(*o),
                        print::expr(self.k, e)
                    ));
                    return None;
                }
                match o {
                    _ if o.is_compare() => Some(Elem::Bool),
                    BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl | BinOp::Shr
                        if ta.is_float()
                            || (ta == Elem::Bool && matches!(o, BinOp::Shl | BinOp::Shr)) =>
                    {
                        self.err(format!("{what}: {} of {ta}", print::binop_name(*o)));
                        None
                    }
                    _ => Some(ta),
                }
            }
            Expr::Fma(a, b, c) => {
                let ts = [self.ty(a, what)?, self.ty(b, what)?, self.ty(c, what)?];
                if ts[0] != ts[1] || ts[1] != ts[2] || !ts[0].is_float() {
                    self.err(format!("{what}: fma of {}, {}, {}", ts[0], ts[1], ts[2]));
                }
                Some(ts[0])
            }
            Expr::Select(c, a, b) => {
                let tc = self.ty(c, what)?;
                let (ta, tb) = (self.ty(a, what)?, self.ty(b, what)?);
                if tc != Elem::Bool || ta != tb {
                    self.err(format!("{what}: select({tc}, {ta}, {tb})"));
                }
                Some(ta)
            }
            Expr::Cast(t, a) => {
                self.ty(a, what)?;
                Some(*t)
            }
        }
    }
}

/// The buffers stored to anywhere in `body`.
fn stores(body: &[Stmt], out: &mut Vec<BufId>) {
    for s in body {
        match s {
            Stmt::Store { buf, .. } | Stmt::WarpReduce { buf, .. } => out.push(*buf),
            Stmt::Mma { c, .. } | Stmt::WarpMma { c, .. } => out.push(c.buf),
            Stmt::CopyAsync { dst, .. } => out.push(dst.buf),
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => stores(body, out),
            Stmt::Barrier | Stmt::AsyncWait | Stmt::Prefetch { .. } => {}
        }
    }
}
