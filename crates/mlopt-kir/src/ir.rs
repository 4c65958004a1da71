//! The kernel IR's data: buffers with a memory space, loop nests with a loop kind, stores, and expressions
//! (loads, arithmetic, fma, min/max, select, casts). A kernel is a function over its parameter buffers; a
//! `Program` is a model: kernels, weights and the steps that call them on the caller's inputs, outputs and
//! one activation arena.
//!
//! Shapes are static: every extent is a number. Index expressions are `i64`; a value's element type is its
//! buffer's (`Elem`). Reductions are written as loops that update a `local` accumulator buffer, which code
//! generation keeps in registers when its size allows.

use std::fmt;

/// A buffer of one kernel: printed `%name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// A loop variable of one kernel: printed `i3`-style by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(pub u32);

/// Element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F16,
    BF16,
    F64,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
    /// The narrow types, one per byte: float8 and float4 (`mlopt_minifloat` formats; loaded, stored and
    /// cast, computed in f32 like f16) and the 4- and 2-bit integers (held sign- or zero-extended).
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F4E2M1,
    I4,
    U4,
    I2,
    U2,
}

impl Elem {
    pub const ALL: [Elem; 22] = [
        Elem::F32,
        Elem::F16,
        Elem::BF16,
        Elem::F64,
        Elem::I8,
        Elem::U8,
        Elem::I16,
        Elem::U16,
        Elem::I32,
        Elem::U32,
        Elem::I64,
        Elem::U64,
        Elem::Bool,
        Elem::F8E4M3FN,
        Elem::F8E4M3FNUZ,
        Elem::F8E5M2,
        Elem::F8E5M2FNUZ,
        Elem::F4E2M1,
        Elem::I4,
        Elem::U4,
        Elem::I2,
        Elem::U2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F16 => "f16",
            Elem::BF16 => "bf16",
            Elem::F64 => "f64",
            Elem::I8 => "i8",
            Elem::U8 => "u8",
            Elem::I16 => "i16",
            Elem::U16 => "u16",
            Elem::I32 => "i32",
            Elem::U32 => "u32",
            Elem::I64 => "i64",
            Elem::U64 => "u64",
            Elem::Bool => "bool",
            Elem::F8E4M3FN => "f8e4m3fn",
            Elem::F8E4M3FNUZ => "f8e4m3fnuz",
            Elem::F8E5M2 => "f8e5m2",
            Elem::F8E5M2FNUZ => "f8e5m2fnuz",
            Elem::F4E2M1 => "f4e2m1",
            Elem::I4 => "i4",
            Elem::U4 => "u4",
            Elem::I2 => "i2",
            Elem::U2 => "u2",
        }
    }

    pub fn from_name(s: &str) -> Option<Elem> {
        Elem::ALL.into_iter().find(|e| e.name() == s)
    }

    pub fn size(self) -> u64 {
        match self {
            Elem::F64 | Elem::I64 | Elem::U64 => 8,
            Elem::F32 | Elem::I32 | Elem::U32 => 4,
            Elem::F16 | Elem::BF16 | Elem::I16 | Elem::U16 => 2,
            Elem::I8 | Elem::U8 | Elem::Bool => 1,
            Elem::F8E4M3FN
            | Elem::F8E4M3FNUZ
            | Elem::F8E5M2
            | Elem::F8E5M2FNUZ
            | Elem::F4E2M1
            | Elem::I4
            | Elem::U4
            | Elem::I2
            | Elem::U2 => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16 | Elem::BF16 | Elem::F64) || self.minifloat().is_some()
    }

    /// The format of a float8 or float4 type.
    pub fn minifloat(self) -> Option<mlopt_minifloat::Format> {
        use mlopt_minifloat::Format;
        Some(match self {
            Elem::F8E4M3FN => Format::E4M3FN,
            Elem::F8E4M3FNUZ => Format::E4M3FNUZ,
            Elem::F8E5M2 => Format::E5M2,
            Elem::F8E5M2FNUZ => Format::E5M2FNUZ,
            Elem::F4E2M1 => Format::E2M1,
            _ => return None,
        })
    }

    /// The unsigned integers (and bool): zero-extended, divided, compared and shifted as unsigned.
    pub fn is_unsigned(self) -> bool {
        matches!(
            self,
            Elem::U8 | Elem::U16 | Elem::U32 | Elem::U64 | Elem::Bool | Elem::U4 | Elem::U2
        )
    }
}

/// Where a buffer lives: a kernel parameter in global memory, a per-kernel temporary on the stack or in
/// registers, or GPU shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    Global,
    Local,
    Shared,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub elem: Elem,
    pub dims: Vec<u64>,
    pub space: Space,
}

impl Buffer {
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<u64> {
        let mut s = vec![1; self.dims.len()];
        for i in (0..self.dims.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.dims[i + 1];
        }
        s
    }
}

/// How a loop runs. `Vector(w)` loops are emitted as `w`-lane SIMD (their extent is a multiple of `w`);
/// `Unrolled` loops are fully unrolled; `Parallel` loops are split across the runtime's threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoopKind {
    Serial,
    Parallel,
    Vector(u32),
    Unrolled,
    GpuBlock(u8),
    GpuThread(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Tanh,
    Erf,
    Floor,
    Ceil,
    Round,
    Sin,
    Cos,
    Asin,
    Acos,
    Atan,
    /// Logical not of a bool; bitwise complement of an integer.
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Min,
    Max,
    /// `atmost(a, b)` is `a < b ? a : b` and `atleast(a, b)` is `a > b ? a : b`: `b` wherever either is
    /// NaN, and wherever they compare equal (+0 for `atleast(-0, +0)`), as x86's `minps`/`maxps` are.
    /// A clamp whose NaN must become its bound (`Min` and `Max` propagate NaN, as ONNX's Min, Max and
    /// Clip do): one instruction each.
    AtMost,
    AtLeast,
    Pow,
    Lt,
    Le,
    Eq,
    Ne,
    /// Logical on bools, bitwise on integers (as are `Or` and `Xor`).
    And,
    Or,
    Xor,
    /// Integer shifts (logical right shift for unsigned types); a shift by the width or more gives 0.
    Shl,
    Shr,
}

impl BinOp {
    pub fn is_compare(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Eq | BinOp::Ne)
    }
}

/// An expression. Integer literals and loop variables are `i64`.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Int(i64),
    Float(f64, Elem),
    Var(Var),
    Load(BufId, Vec<Expr>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Fma(Box<Expr>, Box<Expr>, Box<Expr>),
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    Cast(Elem, Box<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    For {
        var: Var,
        extent: u64,
        kind: LoopKind,
        body: Vec<Stmt>,
    },
    Store {
        buf: BufId,
        index: Vec<Expr>,
        value: Expr,
    },
    /// Runs `then` only where `cond` holds; accesses under a guard `e < n` / `e >= 0` are bounded by it.
    If { cond: Expr, then: Vec<Stmt> },
    /// GPU block barrier (`bar.sync`): all threads of the block reach it before any goes on.
    Barrier,
    /// A matrix multiply-accumulate on blocks, the unit of work of a matrix engine (AMX tiles,
    /// tensor-core `mma`, a dot-product instruction's pairs): for i < m, j < n,
    /// `c[i, j] = (acc ? c[i, j] : 0) + sum over p < k of a[i, p] * b[p / 2, 2 j + p % 2]`,
    /// with `a` [m, k] and `b` [k / 2, 2 n] of one operand type (B's rows interleave pairs of k, the
    /// layout the hardware reads) and `c` [m, n] of its accumulator type (`mma_acc`): bf16 operands
    /// sum in f32 (products exact, sums f32); i16 operands in i32 (products exact, each pair's sum and
    /// every addition wrapping, as `vpmaddwd` and `vpaddd` compute them). With `ahead` (text:
    /// a trailing `ahead`), the code also fetches into L2 the bytes that follow B's block in memory
    /// (as many as it has: a packed weight's next panel, the one the next block of columns reads) while
    /// the product runs; a hint, with no effect on the values.
    Mma {
        m: u64,
        n: u64,
        k: u64,
        c: Block,
        a: Block,
        b: Block,
        acc: bool,
        ahead: bool,
    },
    /// A warp's tensor-core multiply-accumulate (PTX `mma.sync.aligned.m16n8k16.row.col` on bf16 or f16,
    /// `m16n8k8` on tf32 for f32 operands), written from one thread's side. The 32 threads of a warp run
    /// it together with the same blocks: `a` is a 16 x K block and `b` a K x 8 block of shared memory
    /// (K = 16 for bf16 and f16, 8 for f32, whose operands are rounded to tf32); `c` is this thread's
    /// four f32 accumulators (four elements along its last axis). The thread of lane l = t % 32 holds,
    /// for q < 4, element (l / 4 + 8 (q / 2), 2 (l % 4) + q % 2) of the 16 x 8 result:
    /// `c[q] += sum over p < K of a[row, p] * b[p, col]`.
    WarpMma { c: Block, a: Block, b: Block },
    /// A GPU thread's asynchronous copy (PTX `cp.async`, sm_80 and up) of `lanes` elements consecutive in
    /// memory, from global `src` starting at its row-major element `from` into shared `dst` starting at
    /// the block's index: 4, 8 or 16 bytes in all and aligned to that size at both ends. (The source is
    /// a flat position because a copy may run across several of its axes.) Where `valid` is false, zeros are written and nothing is read (the
    /// zero-fill form: out-of-range rows, a convolution's padding). The copy lands by the thread's next
    /// `AsyncWait`; until then no thread may touch the destination.
    CopyAsync {
        dst: Block,
        src: BufId,
        from: Expr,
        lanes: u64,
        valid: Option<Expr>,
    },
    /// `cp.async.wait_all`: this thread's asynchronous copies have landed (other threads see them after
    /// a barrier).
    AsyncWait,
    /// A warp's reduction of a per-thread scalar (PTX `shfl.sync.bfly`), in uniform code: every thread's
    /// `local` f32 or i32 scalar `buf` becomes `op` over the 32 threads of its warp, combined in butterfly
    /// order (for d = 16, 8, 4, 2, 1 lane l takes op(x[l], x[l ^ d])), so that every lane holds the same
    /// value.
    WarpReduce { buf: BufId, op: BinOp },
    /// A hint that element `at` (row-major, flat) of global `buf` will be read soon: its cache line is
    /// fetched into the CPU's L2 (`prefetcht1`) while other work runs. Nothing is read or changed, and
    /// `at` may lie past the buffer's end (a prefetch cannot fault), so the next panel of a weight can
    /// be named without a guard.
    Prefetch { buf: BufId, at: Expr },
}

/// The accumulator type of an `Mma` on operands of type `e`: f32 for bf16, i32 for i16; None for
/// operand types no `mma` takes.
pub fn mma_acc(e: Elem) -> Option<Elem> {
    match e {
        Elem::BF16 => Some(Elem::F32),
        Elem::I16 => Some(Elem::I32),
        _ => None,
    }
}

/// The depth K of a `WarpMma` on operands of type `e` (16 for bf16 and f16, 8 for tf32).
pub fn warp_mma_k(e: Elem) -> u64 {
    if e == Elem::F32 {
        8
    } else {
        16
    }
}

/// One operand block of an `Mma`: the index of its first element in `buf` (of rank 2 or more); element
/// (r, col) of the block is at that index plus r on the second-to-last axis and col on the last.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub buf: BufId,
    pub at: Vec<Expr>,
}

impl Block {
    /// The index of element (r, col) of the block.
    pub fn index(&self, r: Expr, col: Expr) -> Vec<Expr> {
        let mut ix = self.at.clone();
        let n = ix.len();
        if n >= 2 {
            ix[n - 2] = Expr::add(ix[n - 2].clone(), r);
            ix[n - 1] = Expr::add(ix[n - 1].clone(), col);
        }
        ix
    }
}

/// A kernel: parameters are its `Global` buffers in order; `Local`/`Shared` buffers are its temporaries.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub bufs: Vec<Buffer>,
    pub vars: Vec<String>,
    pub body: Vec<Stmt>,
    /// The schedule steps applied to the algorithm, in order (printed as a header comment).
    pub schedule: Vec<crate::step::ScheduleStep>,
}

impl Kernel {
    pub fn new(name: impl Into<String>) -> Kernel {
        Kernel {
            name: name.into(),
            bufs: Vec::new(),
            vars: Vec::new(),
            body: Vec::new(),
            schedule: Vec::new(),
        }
    }

    pub fn buf(
        &mut self,
        name: impl Into<String>,
        elem: Elem,
        dims: Vec<u64>,
        space: Space,
    ) -> BufId {
        self.bufs.push(Buffer {
            name: name.into(),
            elem,
            dims,
            space,
        });
        BufId(self.bufs.len() as u32 - 1)
    }

    pub fn var(&mut self, name: impl Into<String>) -> Var {
        self.vars.push(name.into());
        Var(self.vars.len() as u32 - 1)
    }

    pub fn params(&self) -> Vec<BufId> {
        (0..self.bufs.len() as u32)
            .map(BufId)
            .filter(|b| self.bufs[b.0 as usize].space == Space::Global)
            .collect()
    }

    /// Drops the local buffers no statement names (a schedule's rewrite may leave the algorithm's
    /// accumulator unused), renumbering the others; parameters keep their order.
    pub fn drop_unused_locals(&mut self) {
        let used = crate::analysis::buffer_uses(&self.body);
        let keep: Vec<bool> = self
            .bufs
            .iter()
            .enumerate()
            .map(|(i, b)| b.space != Space::Local || used.contains_key(&BufId(i as u32)))
            .collect();
        if keep.iter().all(|k| *k) {
            return;
        }
        let mut to = Vec::with_capacity(keep.len());
        let mut next = 0;
        for k in &keep {
            to.push(BufId(next));
            next += u32::from(*k);
        }
        self.body = self
            .body
            .iter()
            .map(|s| s.map_bufs(&|b| to[b.0 as usize]))
            .collect();
        let mut i = 0;
        self.bufs.retain(|_| {
            i += 1;
            keep[i - 1]
        });
    }

    pub fn buffer(&self, b: BufId) -> &Buffer {
        &self.bufs[b.0 as usize]
    }

    pub fn var_name(&self, v: Var) -> &str {
        &self.vars[v.0 as usize]
    }
}

/// A buffer's id out of its kernel (a diagnostic's): `b3`, the fourth buffer. In a kernel's text a buffer
/// is printed by its name (`Kernel::buffer`).
impl fmt::Display for BufId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// A loop variable's id out of its kernel: `v3`, the fourth variable. In a kernel's text it is printed
/// by its name (`Kernel::var_name`).
impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Expression building helpers, so lowering code reads like the math it writes. `add`..`rem` fold integer
// constants, which the operator traits could not name as plainly.
#[allow(clippy::should_implement_trait)]
impl Expr {
    pub fn int(v: i64) -> Expr {
        Expr::Int(v)
    }
    pub fn f32(v: f64) -> Expr {
        Expr::Float(v, Elem::F32)
    }
    pub fn var(v: Var) -> Expr {
        Expr::Var(v)
    }
    pub fn load(b: BufId, index: Vec<Expr>) -> Expr {
        Expr::Load(b, index)
    }
    pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }
    pub fn un(op: UnOp, a: Expr) -> Expr {
        Expr::Unary(op, Box::new(a))
    }
    pub fn fma(a: Expr, b: Expr, c: Expr) -> Expr {
        Expr::Fma(Box::new(a), Box::new(b), Box::new(c))
    }
    pub fn select(c: Expr, a: Expr, b: Expr) -> Expr {
        Expr::Select(Box::new(c), Box::new(a), Box::new(b))
    }
    pub fn cast(e: Elem, a: Expr) -> Expr {
        Expr::Cast(e, Box::new(a))
    }
    /// `a + b` with integer constant folding (index arithmetic stays readable in dumps).
    pub fn add(a: Expr, b: Expr) -> Expr {
        // (p / c) * c + p % c = p (truncating division), so a delinearised index flattens back to p.
        fn whole(a: &Expr, p: &Expr, c: &Expr) -> bool {
            matches!(a, Expr::Binary(BinOp::Mul, q, c2) if **c2 == *c && matches!(&**q, Expr::Binary(BinOp::Div, p2, c3) if **p2 == *p && **c3 == *c))
        }
        if let Expr::Binary(BinOp::Rem, p, c) = &b {
            if whole(&a, p, c) {
                return (**p).clone();
            }
            if let Expr::Binary(BinOp::Add, rest, last) = &a {
                if whole(last, p, c) {
                    return Expr::add((**rest).clone(), (**p).clone());
                }
            }
        }
        match (a, b) {
            (Expr::Int(0), x) | (x, Expr::Int(0)) => x,
            (Expr::Int(x), Expr::Int(y)) => Expr::Int(x + y),
            (x, y) => Expr::bin(BinOp::Add, x, y),
        }
    }
    pub fn sub(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (x, Expr::Int(0)) => x,
            (Expr::Int(x), Expr::Int(y)) => Expr::Int(x - y),
            (x, y) => Expr::bin(BinOp::Sub, x, y),
        }
    }
    pub fn mul(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Int(0), _) | (_, Expr::Int(0)) => Expr::Int(0),
            (Expr::Int(1), x) | (x, Expr::Int(1)) => x,
            (Expr::Int(x), Expr::Int(y)) => Expr::Int(x * y),
            (x, y) => Expr::bin(BinOp::Mul, x, y),
        }
    }
    pub fn div(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (x, Expr::Int(1)) => x,
            (Expr::Int(x), Expr::Int(y)) if y > 0 && x >= 0 => Expr::Int(x / y),
            (x, y) => Expr::bin(BinOp::Div, x, y),
        }
    }
    pub fn rem(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (_, Expr::Int(1)) => Expr::Int(0),
            (Expr::Int(x), Expr::Int(y)) if y > 0 && x >= 0 => Expr::Int(x % y),
            (x, y) => Expr::bin(BinOp::Rem, x, y),
        }
    }

    /// Replaces every use of `v` by `by`.
    pub fn subst(&self, v: Var, by: &Expr) -> Expr {
        match self {
            Expr::Var(w) if *w == v => by.clone(),
            Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => self.clone(),
            Expr::Load(b, ix) => Expr::Load(*b, ix.iter().map(|e| e.subst(v, by)).collect()),
            Expr::Unary(o, a) => Expr::un(*o, a.subst(v, by)),
            Expr::Binary(o, a, b) => rebuild_bin(*o, a.subst(v, by), b.subst(v, by)),
            Expr::Fma(a, b, c) => Expr::fma(a.subst(v, by), b.subst(v, by), c.subst(v, by)),
            Expr::Select(c, a, b) => Expr::select(c.subst(v, by), a.subst(v, by), b.subst(v, by)),
            Expr::Cast(e, a) => Expr::cast(*e, a.subst(v, by)),
        }
    }

    /// Replaces each variable of `by` by its expression, in `by`'s order.
    pub fn subst_all(&self, by: &[(Var, Expr)]) -> Expr {
        by.iter().fold(self.clone(), |e, (v, x)| e.subst(*v, x))
    }

    /// Replaces every occurrence of the subexpression `from` by `to` (outermost first: a replaced
    /// occurrence is not searched again).
    pub fn replace(&self, from: &Expr, to: &Expr) -> Expr {
        if self == from {
            return to.clone();
        }
        let r = |x: &Expr| x.replace(from, to);
        match self {
            Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => self.clone(),
            Expr::Load(b, ix) => Expr::Load(*b, ix.iter().map(r).collect()),
            Expr::Unary(o, a) => Expr::un(*o, r(a)),
            Expr::Binary(o, a, b) => rebuild_bin(*o, r(a), r(b)),
            Expr::Fma(a, b, c) => Expr::fma(r(a), r(b), r(c)),
            Expr::Select(c, a, b) => Expr::select(r(c), r(a), r(b)),
            Expr::Cast(e, a) => Expr::cast(*e, r(a)),
        }
    }

    /// The expression with each load rebuilt by `f(buffer, index)`, innermost loads first (an index's own
    /// loads are mapped before the load that holds them).
    pub fn map_loads(&self, f: &dyn Fn(BufId, Vec<Expr>) -> Expr) -> Expr {
        let r = |x: &Expr| Box::new(x.map_loads(f));
        match self {
            Expr::Load(b, ix) => f(*b, ix.iter().map(|x| x.map_loads(f)).collect()),
            Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => self.clone(),
            Expr::Unary(o, a) => Expr::Unary(*o, r(a)),
            Expr::Binary(o, a, b) => Expr::Binary(*o, r(a), r(b)),
            Expr::Fma(a, b, c) => Expr::Fma(r(a), r(b), r(c)),
            Expr::Select(a, b, c) => Expr::Select(r(a), r(b), r(c)),
            Expr::Cast(t, a) => Expr::Cast(*t, r(a)),
        }
    }

    /// The element type of the expression in (verified) kernel `k`.
    pub fn elem(&self, k: &Kernel) -> Elem {
        match self {
            Expr::Int(_) | Expr::Var(_) => Elem::I64,
            Expr::Float(_, t) | Expr::Cast(t, _) => *t,
            Expr::Load(b, _) => k.buffer(*b).elem,
            Expr::Binary(o, _, _) if o.is_compare() => Elem::Bool,
            Expr::Unary(_, a)
            | Expr::Fma(a, _, _)
            | Expr::Select(_, a, _)
            | Expr::Binary(_, a, _) => a.elem(k),
        }
    }

    /// Whether the expression loads from buffer `b`.
    pub fn reads(&self, b: BufId) -> bool {
        match self {
            Expr::Var(_) | Expr::Int(_) | Expr::Float(..) => false,
            Expr::Load(c, ix) => *c == b || ix.iter().any(|e| e.reads(b)),
            Expr::Unary(_, a) | Expr::Cast(_, a) => a.reads(b),
            Expr::Binary(_, a, c) => a.reads(b) || c.reads(b),
            Expr::Fma(a, c, d) | Expr::Select(a, c, d) => a.reads(b) || c.reads(b) || d.reads(b),
        }
    }

    /// Whether `v` occurs in the expression.
    pub fn uses(&self, v: Var) -> bool {
        match self {
            Expr::Var(w) => *w == v,
            Expr::Int(_) | Expr::Float(..) => false,
            Expr::Load(_, ix) => ix.iter().any(|e| e.uses(v)),
            Expr::Unary(_, a) | Expr::Cast(_, a) => a.uses(v),
            Expr::Binary(_, a, b) => a.uses(v) || b.uses(v),
            Expr::Fma(a, b, c) | Expr::Select(a, b, c) => a.uses(v) || b.uses(v) || c.uses(v),
        }
    }
}

/// A binary node built through the folding constructors for index arithmetic (`Expr::add` ..
/// `Expr::rem`), `Expr::bin` for the other operators.
pub fn rebuild_bin(o: BinOp, a: Expr, b: Expr) -> Expr {
    match o {
        BinOp::Add => Expr::add(a, b),
        BinOp::Sub => Expr::sub(a, b),
        BinOp::Mul => Expr::mul(a, b),
        BinOp::Div => Expr::div(a, b),
        BinOp::Rem => Expr::rem(a, b),
        _ => Expr::bin(o, a, b),
    }
}

impl Stmt {
    /// `for var in 0..extent (kind) { body }`.
    pub fn for_(var: Var, extent: u64, kind: LoopKind, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            var,
            extent,
            kind,
            body,
        }
    }

    /// The statement with `f` applied to every expression in it (indices, values, guards, block
    /// positions, copy sources and tests); loops, buffers and everything else stay.
    pub fn map_exprs(&self, f: &dyn Fn(&Expr) -> Expr) -> Stmt {
        self.rebuild(f, &|b| b)
    }

    /// The statement with every buffer it names (stored, loaded, in a block, copied or reduced) renamed
    /// by `f`.
    pub fn map_bufs(&self, f: &dyn Fn(BufId) -> BufId) -> Stmt {
        self.rebuild(&|x| x.map_loads(&|b, ix| Expr::Load(f(b), ix)), f)
    }

    /// The statement with `e` applied to every expression in it and `b` to the buffers its stores,
    /// blocks, copies and reductions name (loads are `e`'s).
    fn rebuild(&self, e: &dyn Fn(&Expr) -> Expr, b: &dyn Fn(BufId) -> BufId) -> Stmt {
        let ix = |v: &[Expr]| v.iter().map(e).collect::<Vec<_>>();
        let blk = |x: &Block| Block {
            buf: b(x.buf),
            at: ix(&x.at),
        };
        match self {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => Stmt::For {
                var: *var,
                extent: *extent,
                kind: *kind,
                body: body.iter().map(|s| s.rebuild(e, b)).collect(),
            },
            Stmt::Store { buf, index, value } => Stmt::Store {
                buf: b(*buf),
                index: ix(index),
                value: e(value),
            },
            Stmt::If { cond, then } => Stmt::If {
                cond: e(cond),
                then: then.iter().map(|s| s.rebuild(e, b)).collect(),
            },
            Stmt::Barrier => Stmt::Barrier,
            Stmt::AsyncWait => Stmt::AsyncWait,
            Stmt::Prefetch { buf, at } => Stmt::Prefetch {
                buf: b(*buf),
                at: e(at),
            },
            Stmt::WarpReduce { buf, op } => Stmt::WarpReduce {
                buf: b(*buf),
                op: *op,
            },
            Stmt::Mma {
                m,
                n,
                k,
                c,
                a,
                b: bb,
                acc,
                ahead,
            } => Stmt::Mma {
                m: *m,
                n: *n,
                k: *k,
                c: blk(c),
                a: blk(a),
                b: blk(bb),
                acc: *acc,
                ahead: *ahead,
            },
            Stmt::WarpMma { c, a, b: bb } => Stmt::WarpMma {
                c: blk(c),
                a: blk(a),
                b: blk(bb),
            },
            Stmt::CopyAsync {
                dst,
                src,
                from,
                lanes,
                valid,
            } => Stmt::CopyAsync {
                dst: blk(dst),
                src: b(*src),
                from: e(from),
                lanes: *lanes,
                valid: valid.as_ref().map(e),
            },
        }
    }

    /// The statement with every load in it rebuilt by `f`, as `Expr::map_loads` does for one expression.
    pub fn map_loads(&self, f: &dyn Fn(BufId, Vec<Expr>) -> Expr) -> Stmt {
        self.map_exprs(&|e| e.map_loads(f))
    }

    /// Replaces every use of `v` by `by`.
    pub fn subst(&self, v: Var, by: &Expr) -> Stmt {
        self.map_exprs(&|e| e.subst(v, by))
    }

    /// Replaces each variable of `by` by its expression, in `by`'s order.
    pub fn subst_all(&self, by: &[(Var, Expr)]) -> Stmt {
        self.map_exprs(&|e| e.subst_all(by))
    }
}
