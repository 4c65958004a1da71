//! Facts about kernels that schedules and code generators share: how an index moves with a loop
//! variable, and how often each buffer is accessed in a statement list.

use crate::ir::*;
use std::collections::{HashMap, HashSet};

mod lanes;
pub use lanes::{accesses, interleaved, row_runs, transposed_operand, Accesses, RowRuns};

/// How `e` changes when `v` grows by one, if `e` is affine in `v` (Some(0) when it does not use `v`).
pub fn coefficient(e: &Expr, v: Var) -> Option<i64> {
    if !e.uses(v) {
        return Some(0);
    }
    match e {
        Expr::Var(w) if *w == v => Some(1),
        Expr::Binary(BinOp::Add, a, b) => Some(coefficient(a, v)? + coefficient(b, v)?),
        Expr::Binary(BinOp::Sub, a, b) => Some(coefficient(a, v)? - coefficient(b, v)?),
        Expr::Binary(BinOp::Mul, a, b) => match (&**a, &**b) {
            (Expr::Int(c), x) | (x, Expr::Int(c)) => Some(c * coefficient(x, v)?),
            _ => None,
        },
        _ => None,
    }
}

/// The constant term of an affine expression (its value with every variable 0), if it is affine.
pub fn offset(e: &Expr) -> Option<i64> {
    match e {
        Expr::Int(c) => Some(*c),
        Expr::Var(_) => Some(0),
        Expr::Binary(BinOp::Add, a, b) => Some(offset(a)? + offset(b)?),
        Expr::Binary(BinOp::Sub, a, b) => Some(offset(a)? - offset(b)?),
        Expr::Binary(BinOp::Mul, a, b) => match (&**a, &**b) {
            (Expr::Int(c), x) | (x, Expr::Int(c)) => Some(c * offset(x)?),
            _ => None,
        },
        _ => None,
    }
}

/// Whether `e` is a multiple of `n` for every value of its variables (see [`factor`]).
pub fn multiple_of(e: &Expr, n: i64) -> bool {
    n != 0 && factor(e) % n == 0
}

/// The greatest common divisor (non-negative; gcd(0, b) = |b|).
pub fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// A constant that divides `e` for every value of its variables (0 when `e` is always 0): constants,
/// products multiply their factors, sums, differences and remainders keep the common one.
pub fn factor(e: &Expr) -> i64 {
    match e {
        Expr::Int(c) => c.abs(),
        Expr::Binary(BinOp::Mul, a, b) => {
            let (a, b) = (factor(a), factor(b));
            a.checked_mul(b).unwrap_or(a.max(b))
        }
        Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Rem, a, b) => gcd(factor(a), factor(b)),
        _ => 1,
    }
}

/// The largest value of an index expression built from non-negative constants and loop variables by
/// +, * and division or remainder by positive constants, given each variable's extent; None for
/// anything else (which might be negative).
pub fn max_value(e: &Expr, extent: &dyn Fn(Var) -> Option<u64>) -> Option<i64> {
    let positive = |d: &Expr| match d {
        Expr::Int(d) if *d > 0 => Some(*d),
        _ => None,
    };
    match e {
        Expr::Int(c) if *c >= 0 => Some(*c),
        Expr::Var(v) => Some(extent(*v)? as i64 - 1),
        Expr::Binary(BinOp::Add, a, b) => Some(max_value(a, extent)? + max_value(b, extent)?),
        Expr::Binary(BinOp::Mul, a, b) => Some(max_value(a, extent)? * max_value(b, extent)?),
        Expr::Binary(BinOp::Div, a, d) => Some(max_value(a, extent)? / positive(d)?),
        Expr::Binary(BinOp::Rem, a, d) => Some(max_value(a, extent)?.min(positive(d)? - 1)),
        _ => None,
    }
}

/// Whether an index expression is non-negative for all values of its (loop, hence non-negative)
/// variables: exactly where [`max_value`] is defined, whatever the extents.
pub fn non_negative(e: &Expr) -> bool {
    max_value(e, &|_| Some(1)).is_some()
}

/// The terms of a sum, each with its constant coefficient: `c * x` is (c, x), a constant c is (c, 1).
fn terms(e: &Expr, out: &mut Vec<(i64, Expr)>) {
    match e {
        Expr::Binary(BinOp::Add, a, b) => {
            terms(a, out);
            terms(b, out);
        }
        Expr::Int(c) => out.push((*c, Expr::int(1))),
        Expr::Binary(BinOp::Mul, a, b) => match (&**a, &**b) {
            (Expr::Int(c), x) | (x, Expr::Int(c)) => out.push((*c, x.clone())),
            _ => out.push((1, e.clone())),
        },
        e => out.push((1, e.clone())),
    }
}

fn sum(terms: &[(i64, Expr)]) -> Expr {
    terms.iter().fold(Expr::int(0), |e, (c, x)| {
        Expr::add(e, Expr::mul(Expr::int(*c), x.clone()))
    })
}

/// `e` with quotients and remainders of non-negative sums by constants taken apart where the ranges
/// allow: with d dividing every coefficient of H and 0 <= L, (H + L) / d = H/d + L/d and (H + L) % d =
/// L % d, and L / d = 0, L % d = L when L < d. So a row-major position split again by a reshape,
/// `((i * 64 + j) / 16) % 4` with j < 64, becomes `j / 16`.
pub fn simplify_index(e: &Expr, extent: &dyn Fn(Var) -> Option<u64>) -> Expr {
    let Expr::Binary(op, a, b) = e else {
        return e.clone();
    };
    let (a, b) = (simplify_index(a, extent), simplify_index(b, extent));
    let d = match (op, &b) {
        (BinOp::Div | BinOp::Rem, Expr::Int(d)) if *d > 0 && max_value(&a, extent).is_some() => *d,
        (BinOp::Add, _) => return Expr::add(a, b),
        (BinOp::Mul, _) => return Expr::mul(a, b),
        _ => return Expr::bin(*op, a, b),
    };
    let mut all = Vec::new();
    terms(&a, &mut all);
    let (high, low): (Vec<_>, Vec<_>) = all.into_iter().partition(|(c, _)| c % d == 0);
    let low = sum(&low);
    let small = max_value(&low, extent).is_some_and(|m| m < d);
    if *op == BinOp::Rem {
        return if small {
            low
        } else {
            Expr::rem(low, Expr::int(d))
        };
    }
    let high: Vec<(i64, Expr)> = high.into_iter().map(|(c, x)| (c / d, x)).collect();
    Expr::add(
        sum(&high),
        if small {
            Expr::int(0)
        } else {
            Expr::div(low, Expr::int(d))
        },
    )
}

/// Whether the non-negative index `flat` differs for every value of `v` below `extent` (the other
/// variables fixed): affine in `v`, or written through `v / d` and `v % d` as digits that cannot meet
/// (one's coefficient at least the other's times its span), as a transpose of a split axis stores.
pub fn moves_with(flat: &Expr, v: Var, extent: u64) -> bool {
    if coefficient(flat, v).is_some_and(|c| c != 0) {
        return true;
    }
    fn divisor(e: &Expr, v: Var) -> Option<i64> {
        match e {
            Expr::Binary(BinOp::Div | BinOp::Rem, x, d) if **x == Expr::Var(v) => match **d {
                Expr::Int(d) if d > 1 => Some(d),
                _ => None,
            },
            Expr::Binary(_, a, b) => divisor(a, v).or_else(|| divisor(b, v)),
            _ => None,
        }
    }
    fn digits(e: &Expr, v: Var, d: i64, hi: Var, lo: Var) -> Expr {
        match e {
            Expr::Binary(op @ (BinOp::Div | BinOp::Rem), x, y)
                if **x == Expr::Var(v) && **y == Expr::Int(d) =>
            {
                Expr::Var(if *op == BinOp::Div { hi } else { lo })
            }
            Expr::Binary(op, a, b) => {
                Expr::bin(*op, digits(a, v, d, hi, lo), digits(b, v, d, hi, lo))
            }
            e => e.clone(),
        }
    }
    let Some(d) = divisor(flat, v) else {
        return false;
    };
    let (hi, lo) = (Var(u32::MAX), Var(u32::MAX - 1));
    let split = digits(flat, v, d, hi, lo);
    let (Some(ch), Some(cl)) = (coefficient(&split, hi), coefficient(&split, lo)) else {
        return false;
    };
    let (ch, cl) = (ch.abs(), cl.abs());
    !split.uses(v) && ch != 0 && cl != 0 && (ch >= cl * d || cl >= ch * (extent as i64 + d - 1) / d)
}

/// The value of an index expression at the loop variables' values `at` (indexed by `Var`), or None when
/// it reads memory or computes with floats.
pub fn index_value(e: &Expr, at: &[i64]) -> Option<i64> {
    let v = |x: &Expr| index_value(x, at);
    Some(match e {
        Expr::Int(c) => *c,
        Expr::Var(x) => *at.get(x.0 as usize)?,
        Expr::Unary(UnOp::Neg, a) => v(a)?.checked_neg()?,
        Expr::Select(c, a, b) => {
            if v(c)? != 0 {
                v(a)?
            } else {
                v(b)?
            }
        }
        Expr::Binary(o, a, b) => {
            let (a, b) = (v(a)?, v(b)?);
            match o {
                BinOp::Add => a.checked_add(b)?,
                BinOp::Sub => a.checked_sub(b)?,
                BinOp::Mul => a.checked_mul(b)?,
                BinOp::Div => a.checked_div(b)?,
                BinOp::Rem => a.checked_rem(b)?,
                BinOp::Min | BinOp::AtMost => a.min(b),
                BinOp::Max | BinOp::AtLeast => a.max(b),
                BinOp::Lt => (a < b) as i64,
                BinOp::Le => (a <= b) as i64,
                BinOp::Eq => (a == b) as i64,
                BinOp::Ne => (a != b) as i64,
                BinOp::And => a & b,
                BinOp::Or => a | b,
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// Whether `flat` writes distinct elements for distinct values of `v` (of extent `extent`) whatever the
/// loops inside it (`inner`) do, for every value of the loops around it (`outer`): decided by evaluating
/// it at every point of those loops, when they number at most `budget` (false otherwise, and when it
/// reads memory). The proof for stores an affine test cannot read, such as a tile's stores through a
/// layout tail (`(jo * 64 + c) / 384`, `((jo * 64 + c) / 32) % 12`, ...), which still never meet.
pub fn distinct_for(
    flat: &Expr,
    (v, extent): (Var, u64),
    outer: &[(Var, u64)],
    inner: &[(Var, u64)],
    budget: u64,
) -> bool {
    // An outer loop `flat` is affine in only shifts every value by the same amount at each of its
    // points: whether two values of `v` meet is the same at all of them, so it is evaluated at 0. (A
    // batch-8 Swin-T spent 9 s of scheduling enumerating its images.)
    let size = outer
        .iter()
        .chain(inner)
        .map(|(x, _)| x.0 as usize + 1)
        .chain([v.0 as usize + 1])
        .max()
        .unwrap_or(0);
    let outer: Vec<(Var, u64)> = outer
        .iter()
        .filter(|(o, _)| coefficient(flat, *o).is_none())
        .copied()
        .collect();
    let loops: Vec<(Var, u64)> = outer
        .iter()
        .chain(std::iter::once(&(v, extent)))
        .chain(inner)
        .copied()
        .collect();
    let points = loops
        .iter()
        .try_fold(1u64, |n, (_, e)| n.checked_mul(*e))
        .unwrap_or(u64::MAX);
    if points > budget || points == 0 {
        return points == 0;
    }
    // A large proof is remembered for the rest of the process: a model's repeated blocks ask the same
    // question of each of their kernels (Swin-T at batch 8 asked 27 times for 0.8-1.6M points each,
    // 9 s of scheduling).
    if points < 1 << 16 {
        return distinct_at_points(flat, v, &loops, points, extent, inner, size);
    }
    static PROVED: std::sync::Mutex<Option<HashMap<String, bool>>> = std::sync::Mutex::new(None);
    let key = format!("{v:?} {extent} {outer:?} {inner:?} {flat:?}");
    if let Some(known) = PROVED
        .lock()
        .ok()
        .and_then(|m| m.as_ref().and_then(|m| m.get(&key).copied()))
    {
        return known;
    }
    let verdict = distinct_at_points(flat, v, &loops, points, extent, inner, size);
    if let Ok(mut m) = PROVED.lock() {
        m.get_or_insert_with(HashMap::new).insert(key, verdict);
    }
    verdict
}

/// [`distinct_for`]'s evaluation at every point of `loops` (outer, `v`, inner; `points` of them).
fn distinct_at_points(
    flat: &Expr,
    v: Var,
    loops: &[(Var, u64)],
    points: u64,
    extent: u64,
    inner: &[(Var, u64)],
    size: usize,
) -> bool {
    let mut at = vec![0i64; size];
    let per_outer: u64 = extent * inner.iter().map(|(_, e)| *e).product::<u64>();
    // Per point of the outer loops: every (value, v) written, sorted; a value written by two values of
    // `v` is two neighbours that differ in `v`. (Sorting beat a hash map of values 2x here.)
    let mut seen: Vec<(i64, i64)> = Vec::with_capacity(per_outer.min(points) as usize);
    let clash = |seen: &mut Vec<(i64, i64)>| {
        seen.sort_unstable();
        seen.windows(2)
            .any(|w| w[0].0 == w[1].0 && w[0].1 != w[1].1)
    };
    for point in 0..points {
        // The point's digits, innermost loop fastest.
        let mut rest = point;
        for (x, e) in loops.iter().rev() {
            at[x.0 as usize] = (rest % e) as i64;
            rest /= e;
        }
        if point % per_outer == 0 && point > 0 {
            if clash(&mut seen) {
                return false;
            }
            seen.clear();
        }
        let Some(f) = index_value(flat, &at) else {
            return false;
        };
        seen.push((f, at[v.0 as usize]));
    }
    !clash(&mut seen)
}

/// The row-major flat element index of an access to `b`.
pub fn flat_index(k: &Kernel, b: BufId, index: &[Expr]) -> Expr {
    let strides = k.buffer(b).strides();
    index.iter().zip(strides).fold(Expr::int(0), |e, (i, s)| {
        Expr::add(e, Expr::mul(i.clone(), Expr::int(s as i64)))
    })
}

/// How many loads and stores of each buffer `body` holds.
pub fn buffer_uses(body: &[Stmt]) -> HashMap<BufId, usize> {
    let mut out = HashMap::new();
    stmts(body, &mut out, true);
    out
}

/// Whether `body` holds an `mma` anywhere.
/// How a kernel's arithmetic runs, in operations (an FMA counts two) from its stores' values times the trip
/// counts of the loops around them, guards taken as always true; index arithmetic does not count.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Arithmetic {
    /// In a register tile (a vector loop inside an unrolled one) or a matrix unit's block, with every
    /// vector load contiguous.
    pub tiled: f64,
    /// In a register tile whose vector loads stride (a stride-2 convolution's input rows).
    pub tiled_gather: f64,
    /// In a vector loop whose loads are contiguous along it (or broadcast).
    pub vector: f64,
    /// In a vector loop that gathers: some load strides along the vector (a transposed operand).
    pub gather: f64,
    /// Outside any vector loop.
    pub scalar: f64,
}

impl Arithmetic {
    pub fn total(&self) -> f64 {
        self.tiled + self.tiled_gather + self.vector + self.gather + self.scalar
    }
}

/// The arithmetic of kernel `k` by how it runs (see [`Arithmetic`]): what prices its schedule. A kernel
/// with no arithmetic (a copy, a gather) counts its stores instead, one each, so how its loops run
/// still shows.
pub fn arithmetic(k: &Kernel) -> Arithmetic {
    fn ops(e: &Expr) -> f64 {
        match e {
            Expr::Int(_) | Expr::Float(..) | Expr::Var(_) | Expr::Load(..) => 0.0,
            Expr::Unary(_, a) | Expr::Cast(_, a) => 1.0 + ops(a),
            Expr::Binary(_, a, b) => 1.0 + ops(a) + ops(b),
            Expr::Fma(a, b, c) => 2.0 + ops(a) + ops(b) + ops(c),
            Expr::Select(c, a, b) => 1.0 + ops(c) + ops(a) + ops(b),
        }
    }
    /// The count a store in a loop of this kind adds to.
    fn slot(a: &mut Arithmetic, vector: bool, contiguous: bool, unrolled: bool) -> &mut f64 {
        match (vector, contiguous, unrolled) {
            (false, _, _) => &mut a.scalar,
            (true, false, true) => &mut a.tiled_gather,
            (true, false, false) => &mut a.gather,
            (true, true, true) => &mut a.tiled,
            (true, true, false) => &mut a.vector,
        }
    }
    struct Walk<'k> {
        k: &'k Kernel,
        acc: Arithmetic,
        stores: Arithmetic,
    }
    impl Walk<'_> {
        /// Whether every load of `e` is contiguous along `v` or does not move with it.
        fn contiguous(&self, e: &Expr, v: Var) -> bool {
            let mut ok = true;
            for_each_load(e, &mut |b, index| {
                ok &= matches!(coefficient(&flat_index(self.k, b, index), v), Some(0 | 1))
            });
            ok
        }
        fn walk(&mut self, body: &[Stmt], trips: f64, vector: Option<Var>, unrolled: bool) {
            for s in body {
                match s {
                    Stmt::For {
                        var,
                        extent,
                        kind,
                        body,
                    } => {
                        let v = if matches!(kind, LoopKind::Vector(_)) {
                            Some(*var)
                        } else {
                            vector
                        };
                        self.walk(
                            body,
                            trips * *extent as f64,
                            v,
                            unrolled || matches!(kind, LoopKind::Unrolled),
                        );
                    }
                    Stmt::If { then, .. } => self.walk(then, trips, vector, unrolled),
                    Stmt::Store { value, .. } => {
                        let contiguous = vector.is_none_or(|v| self.contiguous(value, v));
                        *slot(&mut self.acc, vector.is_some(), contiguous, unrolled) +=
                            ops(value) * trips;
                        *slot(&mut self.stores, vector.is_some(), contiguous, unrolled) += trips;
                    }
                    Stmt::Mma { m, n, k, .. } => {
                        self.acc.tiled += 2.0 * (*m * *n * *k) as f64 * trips
                    }
                    _ => {}
                }
            }
        }
    }
    let mut w = Walk {
        k,
        acc: Arithmetic::default(),
        stores: Arithmetic::default(),
    };
    w.walk(&k.body, 1.0, None, false);
    if w.acc.total() > 0.0 {
        w.acc
    } else {
        w.stores
    }
}

/// What [`for_each_access`] calls: buffer, index, innermost vector loop, executions.
pub type Access<'f> = dyn FnMut(BufId, &[Expr], Option<Var>, f64) + 'f;

/// Calls `f` on every store of `body` and every load in it (the store's target, then the loads of its
/// index and value): the buffer, its index, the innermost vector loop around it, and how many times it
/// runs.
pub fn for_each_access(body: &[Stmt], f: &mut Access) {
    fn walk(body: &[Stmt], vector: Option<Var>, trips: f64, f: &mut Access) {
        for s in body {
            match s {
                Stmt::For {
                    var,
                    extent,
                    kind,
                    body,
                } => {
                    let v = if matches!(kind, LoopKind::Vector(_)) {
                        Some(*var)
                    } else {
                        vector
                    };
                    walk(body, v, trips * *extent as f64, f);
                }
                Stmt::If { then, .. } => walk(then, vector, trips, f),
                Stmt::Store { buf, index, value } => {
                    f(*buf, index, vector, trips);
                    for e in index.iter().chain([value]) {
                        for_each_load(e, &mut |b, ix| f(b, ix, vector, trips));
                    }
                }
                _ => {}
            }
        }
    }
    walk(body, None, 1.0, f);
}

/// The buffers `body` stores to (elements or a matrix engine's blocks), once per store.
pub fn stored(body: &[Stmt]) -> Vec<BufId> {
    let mut out = Vec::new();
    for s in body {
        match s {
            Stmt::Store { buf, .. } => out.push(*buf),
            Stmt::Mma { c, .. } => out.push(c.buf),
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => out.extend(stored(body)),
            _ => {}
        }
    }
    out
}

pub fn has_mma(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Mma { .. } => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => has_mma(body),
        _ => false,
    })
}

/// How many loads of each buffer `body` holds (stores not counted).
pub fn buffer_loads(body: &[Stmt]) -> HashMap<BufId, usize> {
    let mut out = HashMap::new();
    stmts(body, &mut out, false);
    out
}

/// How many loads of each buffer the expression `e` holds.
pub fn expr_loads(e: &Expr) -> HashMap<BufId, usize> {
    let mut out = HashMap::new();
    expr(e, &mut out);
    out
}

fn expr(e: &Expr, out: &mut HashMap<BufId, usize>) {
    for_each_load(e, &mut |b, _| *out.entry(b).or_default() += 1);
}

/// Calls `f(buffer, index)` on every load in `e`, a load before the loads in its index.
pub fn for_each_load(e: &Expr, f: &mut dyn FnMut(BufId, &[Expr])) {
    match e {
        Expr::Load(b, ix) => {
            f(*b, ix);
            ix.iter().for_each(|x| for_each_load(x, f));
        }
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => {}
        Expr::Unary(_, a) | Expr::Cast(_, a) => for_each_load(a, f),
        Expr::Binary(_, a, b) => {
            for_each_load(a, f);
            for_each_load(b, f);
        }
        Expr::Fma(a, b, c) | Expr::Select(a, b, c) => {
            [a, b, c].into_iter().for_each(|x| for_each_load(x, f))
        }
    }
}

fn stmts(body: &[Stmt], out: &mut HashMap<BufId, usize>, count_stores: bool) {
    for s in body {
        match s {
            Stmt::For { body, .. } => stmts(body, out, count_stores),
            Stmt::If { cond, then } => {
                expr(cond, out);
                stmts(then, out, count_stores);
            }
            Stmt::Store { buf, index, value } => {
                if count_stores {
                    *out.entry(*buf).or_default() += 1;
                }
                index.iter().for_each(|x| expr(x, out));
                expr(value, out);
            }
            Stmt::Barrier | Stmt::AsyncWait | Stmt::Prefetch { .. } => {}
            Stmt::WarpReduce { buf, .. } => *out.entry(*buf).or_default() += 1,
            Stmt::CopyAsync {
                dst,
                src,
                from,
                valid,
                ..
            } => {
                if count_stores {
                    *out.entry(dst.buf).or_default() += 1;
                }
                *out.entry(*src).or_default() += 1;
                dst.at
                    .iter()
                    .chain([from])
                    .chain(valid)
                    .for_each(|e| expr(e, out));
            }
            Stmt::Mma { c, a, b, .. } | Stmt::WarpMma { c, a, b } => {
                for x in [a, b] {
                    *out.entry(x.buf).or_default() += 1;
                    x.at.iter().for_each(|e| expr(e, out));
                }
                // C is read (when accumulating) and written: one use either way.
                *out.entry(c.buf).or_default() += 1;
                c.at.iter().for_each(|e| expr(e, out));
            }
        }
    }
}

/// Local buffers private to one iteration of a loop whose body is `body` (within the whole kernel
/// `k`): every access is in `body`, indexed by `body`'s own loops only. A local indexed by the loop's
/// variable or one outside it (a K-blocked tile's partial sums, `sums[jo, io * mr + ii, jj]`, which one
/// run of a parallel `io` loop leaves for the next) holds state across iterations: it is shared.
pub fn private_locals(k: &Kernel, body: &[Stmt]) -> Vec<BufId> {
    private_in(k, body, &buffer_uses(&k.body))
}

/// `private_locals` with the kernel's `buffer_uses` computed once by the caller.
pub fn private_in(k: &Kernel, body: &[Stmt], all: &HashMap<BufId, usize>) -> Vec<BufId> {
    let outside = indexed_from_outside(body);
    let mut v: Vec<BufId> = buffer_uses(body)
        .into_iter()
        .filter(|(b, n)| {
            k.buffer(*b).space == Space::Local && all.get(b) == Some(n) && !outside.contains(b)
        })
        .map(|(b, _)| b)
        .collect();
    v.sort();
    v
}

/// The buffers some access in `body` indexes with a variable no loop of `body` binds.
fn indexed_from_outside(body: &[Stmt]) -> HashSet<BufId> {
    fn bound(body: &[Stmt], out: &mut HashSet<Var>) {
        for s in body {
            match s {
                Stmt::For { var, body, .. } => {
                    out.insert(*var);
                    bound(body, out);
                }
                Stmt::If { then, .. } => bound(then, out),
                _ => {}
            }
        }
    }
    fn free(e: &Expr, inside: &HashSet<Var>) -> bool {
        match e {
            Expr::Var(v) => !inside.contains(v),
            Expr::Int(_) | Expr::Float(..) => false,
            Expr::Load(_, ix) => ix.iter().any(|x| free(x, inside)),
            Expr::Unary(_, a) | Expr::Cast(_, a) => free(a, inside),
            Expr::Binary(_, a, b) => free(a, inside) || free(b, inside),
            Expr::Fma(a, b, c) | Expr::Select(a, b, c) => [a, b, c].iter().any(|x| free(x, inside)),
        }
    }
    let mut inside = HashSet::new();
    bound(body, &mut inside);
    let mut out = HashSet::new();
    for_each_index(body, &mut |b, ix| {
        if ix.iter().any(|x| free(x, &inside)) {
            out.insert(b);
        }
    });
    out
}

/// Calls `f(buffer, index)` on every indexed access in `body`: stores, loads (in any expression), the
/// blocks of matrix operations and asynchronous copies (the source by its flat offset).
pub fn for_each_index(body: &[Stmt], f: &mut dyn FnMut(BufId, &[Expr])) {
    for s in body {
        match s {
            Stmt::For { body, .. } => for_each_index(body, f),
            Stmt::If { cond, then } => {
                for_each_load(cond, f);
                for_each_index(then, f);
            }
            Stmt::Store { buf, index, value } => {
                f(*buf, index);
                index
                    .iter()
                    .chain([value])
                    .for_each(|x| for_each_load(x, f));
            }
            Stmt::Barrier | Stmt::AsyncWait | Stmt::WarpReduce { .. } | Stmt::Prefetch { .. } => {}
            Stmt::CopyAsync {
                dst,
                src,
                from,
                valid,
                ..
            } => {
                f(dst.buf, &dst.at);
                f(*src, std::slice::from_ref(from));
                dst.at
                    .iter()
                    .chain([from])
                    .chain(valid)
                    .for_each(|x| for_each_load(x, f));
            }
            Stmt::Mma { c, a, b, .. } | Stmt::WarpMma { c, a, b } => {
                for x in [c, a, b] {
                    f(x.buf, &x.at);
                    x.at.iter().for_each(|e| for_each_load(e, f));
                }
            }
        }
    }
}

/// The local buffers that one iteration of some loop of `k` whose kind `kinds` accepts owns (every access
/// inside that loop's body): each thread of a parallel loop, or each lane of a vector loop, has its own.
pub fn locals_owned_by_loops(k: &Kernel, kinds: &dyn Fn(LoopKind) -> bool) -> Vec<BufId> {
    fn walk(
        k: &Kernel,
        body: &[Stmt],
        all: &HashMap<BufId, usize>,
        kinds: &dyn Fn(LoopKind) -> bool,
        out: &mut Vec<BufId>,
    ) {
        for s in body {
            match s {
                Stmt::For { kind, body, .. } => {
                    if kinds(*kind) {
                        out.extend(private_in(k, body, all));
                    }
                    walk(k, body, all, kinds, out);
                }
                Stmt::If { then, .. } => walk(k, then, all, kinds, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(k, &k.body, &buffer_uses(&k.body), kinds, &mut out);
    out
}
