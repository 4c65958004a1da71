//! One fusion group of the optimised graph -> one kernel IR kernel (its algorithm; schedules come after).
//!
//! Elementwise, view and injective members are *pulled*: the value of a member at an index is an
//! expression over its inputs at mapped indices (broadcast, reshape, transpose, slice, concat, gather, pad,
//! tile), so a chain of them costs one load per kernel input and one store. Every other member (MatMul,
//! Gemm, Conv, pooling, reductions, Softmax, LayerNorm, Attention, ...) is an *anchor*: it gets its own loop
//! nest, written into the kernel's output when it is the root and into a local buffer otherwise, and the
//! members after it pull from there. Values from outside the kernel (graph inputs, weights, other kernels'
//! outputs) are the kernel's parameters; single-element constants become literals.

use crate::elementwise::{self as ew, compute, elem};
use crate::error::{LowerError, Result};
use crate::nests;
use mlopt_ir::{Graph, NodeId, Op, TensorType, Value};
use mlopt_kir::index::{clamp, convert, delinear, in_range, linear, lit, wrap_index};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Kernel, Space, Stmt, Var};
use std::collections::{HashMap, HashSet};

/// What a kernel parameter is bound to: a graph value, or a weight lowering made (a constant re-laid
/// out for its kernel, such as a GEMM's B packed into column panels).
#[derive(Debug, Clone)]
pub enum Param {
    Value(Value),
    Weight(mlopt_kir::Weight),
}

pub type Params = Vec<Param>;

pub struct Lowerer<'g> {
    pub g: &'g Graph,
    members: HashSet<NodeId>,
    pub k: Kernel,
    /// Parameters in order, and the buffer each graph value has in this kernel (params or locals).
    pub params: Params,
    pub bufs: HashMap<Value, BufId>,
    next_var: usize,
}

impl std::fmt::Debug for Lowerer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lowerer")
            .field("kernel", &self.k.name)
            .finish()
    }
}

pub fn dims(t: &TensorType) -> Vec<u64> {
    t.shape.iter().map(|d| *d as u64).collect()
}

/// Whether an op is lowered by pulling (an expression per output element).
pub fn pulled(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Nary(_)
            | Op::Where
            | Op::Choose
            | Op::Clip
            | Op::Cast { .. }
            | Op::BitCast { .. }
            | Op::BatchNorm { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Expand { .. }
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::Lrn { .. }
            | Op::Pad { .. }
            | Op::Tile { .. }
            | Op::Trilu { .. }
            | Op::Resize(_)
            | Op::DepthToSpace { .. }
            | Op::SpaceToDepth { .. }
    )
}

impl<'g> Lowerer<'g> {
    pub fn new(g: &'g Graph, name: String, members: &[NodeId]) -> Lowerer<'g> {
        Lowerer {
            g,
            members: members.iter().copied().collect(),
            k: Kernel::new(name),
            params: Vec::new(),
            bufs: HashMap::new(),
            next_var: 0,
        }
    }

    pub fn fresh(&mut self, prefix: &str) -> Var {
        self.next_var += 1;
        self.k.var(format!("{prefix}{}", self.next_var))
    }

    pub fn ty(&self, v: Value) -> &'g TensorType {
        self.g.value_type(v)
    }

    pub fn unsupported(&self, n: NodeId, why: impl Into<String>) -> LowerError {
        let node = self.g.node(n);
        LowerError::Unsupported {
            node: node.name.clone(),
            op: node.op.name(),
            why: why.into(),
        }
    }

    /// The buffer of a value that lives outside this kernel (a parameter), created on first use.
    pub fn param(&mut self, v: Value) -> BufId {
        if let Some(b) = self.bufs.get(&v) {
            return *b;
        }
        let t = self.ty(v);
        let name = format!("in{}", self.params.len());
        let b = self.k.buf(name, elem(t.dtype), dims(t), Space::Global);
        self.params.push(Param::Value(v));
        self.bufs.insert(v, b);
        b
    }

    /// A new weight parameter holding `w` (made by lowering, not in the graph).
    pub fn weight(&mut self, w: mlopt_kir::Weight) -> BufId {
        let name = format!("in{}", self.params.len());
        let b = self.k.buf(name, w.elem, w.dims.clone(), Space::Global);
        self.params.push(Param::Weight(w));
        b
    }

    /// Loops over `extents` (fresh variables named `prefix`) around the statements `body` builds.
    pub fn nest(
        &mut self,
        prefix: &str,
        extents: &[u64],
        body: impl FnOnce(&mut Self, &[Expr]) -> Result<Vec<Stmt>>,
    ) -> Result<Vec<Stmt>> {
        let vars: Vec<Var> = extents.iter().map(|_| self.fresh(prefix)).collect();
        let idx: Vec<Expr> = vars.iter().map(|v| Expr::var(*v)).collect();
        let stmts = body(self, &idx)?;
        Ok(mlopt_kir::index::serial_loops(&vars, extents, stmts))
    }

    /// The expression for value `v` at `idx`, in `v`'s element type.
    pub fn pull(&mut self, v: Value, idx: &[Expr]) -> Result<Expr> {
        let n = v.node;
        let node = self.g.node(n);
        if let Op::Const(t) = &node.op {
            if t.numel() == 1 && !matches!(t.dtype(), mlopt_ir::DType::F16 | mlopt_ir::DType::BF16)
            {
                let e = elem(t.dtype());
                return Ok(if e.is_float() {
                    lit(t.to_f64_vec()[0], e)
                } else {
                    lit(t.to_i64_vec()[0] as f64, e)
                });
            }
        }
        if let Some(b) = self.bufs.get(&v) {
            return Ok(Expr::load(*b, idx.to_vec()));
        }
        if !self.members.contains(&n) {
            let b = self.param(v);
            return Ok(Expr::load(b, idx.to_vec()));
        }
        if !pulled(&node.op) {
            return Err(self.unsupported(n, "an anchor's value is read before it was computed"));
        }
        self.pull_op(n, v.output as usize, idx)
    }

    /// Pulls input `i` of `n` at the output index `idx` broadcast to the input's rank (numpy rules).
    pub(crate) fn pull_broadcast(&mut self, n: NodeId, i: usize, idx: &[Expr]) -> Result<Expr> {
        let v = self.input(n, i)?;
        let shape = &self.ty(v).shape;
        let skip = idx.len() - shape.len();
        let ix: Vec<Expr> = shape
            .iter()
            .enumerate()
            .map(|(d, s)| {
                if *s == 1 {
                    Expr::int(0)
                } else {
                    idx[skip + d].clone()
                }
            })
            .collect();
        self.pull(v, &ix)
    }

    pub fn input(&self, n: NodeId, i: usize) -> Result<Value> {
        self.g
            .inputs(n)
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| self.unsupported(n, format!("input {i} is missing")))
    }

    /// GatherND's and ScatterND's index tuple: `indices[at.., 0..last]` (the last axis of `ind`), each
    /// component wrapped (negative counts from the end) into the data axis `axes[j]` it indexes.
    pub fn index_tuple(&mut self, ind: Value, at: &[Expr], axes: &[i64]) -> Result<Vec<Expr>> {
        let ind_t = elem(self.ty(ind).dtype);
        let last = self.ty(ind).shape.last().copied().unwrap_or(0);
        (0..last)
            .map(|j| {
                let mut ix = at.to_vec();
                ix.push(Expr::int(j as i64));
                let raw = self.pull(ind, &ix)?;
                Ok(wrap_index(convert(raw, ind_t, Elem::I64), axes[j]))
            })
            .collect()
    }

    pub fn has_input(&self, n: NodeId, i: usize) -> bool {
        self.g.inputs(n).get(i).copied().flatten().is_some()
    }

    /// Pulls input `i` converted to the compute type of `t`.
    pub(crate) fn pull_as(&mut self, n: NodeId, i: usize, idx: &[Expr], t: Elem) -> Result<Expr> {
        let from = elem(self.ty(self.input(n, i)?).dtype);
        let e = self.pull_broadcast(n, i, idx)?;
        Ok(convert(e, from, t))
    }

    fn pull_op(&mut self, n: NodeId, out: usize, idx: &[Expr]) -> Result<Expr> {
        let node = self.g.node(n);
        let out_t = elem(node.outputs[out].dtype);
        let in0 = elem(self.ty(self.input(n, 0)?).dtype);
        let ct = compute(in0);
        let arity = self.g.inputs(n).len();
        let e = match &node.op {
            Op::Unary(u) => {
                let x = self.pull_as(n, 0, idx, ct)?;
                let r = ew::unary(*u, x, ct).ok_or_else(|| {
                    self.unsupported(n, format!("no code generation for {u:?} on {in0}"))
                })?;
                return Ok(if ew::unary_to_bool(*u) {
                    r
                } else {
                    convert(r, ct, out_t)
                });
            }
            Op::Binary(mlopt_ir::Binary::Pow) if !ct.is_float() => {
                // Integer powers (of an integer or float exponent) in f64, which is exact for the
                // results an integer type can hold, then converted back (saturating).
                let x = self.pull_as(n, 0, idx, Elem::F64)?;
                let y = self.pull_as(n, 1, idx, Elem::F64)?;
                return Ok(convert(Expr::bin(BinOp::Pow, x, y), Elem::F64, out_t));
            }
            Op::Binary(b) => {
                let x = self.pull_as(n, 0, idx, ct)?;
                let y = self.pull_as(n, 1, idx, ct)?;
                let r = ew::binary(*b, x, y, ct).ok_or_else(|| {
                    self.unsupported(n, format!("no code generation for {b:?} on {in0}"))
                })?;
                return Ok(if out_t == Elem::Bool {
                    r
                } else {
                    convert(r, ct, out_t)
                });
            }
            Op::Nary(o) => {
                let xs = (0..arity)
                    .map(|i| self.pull_as(n, i, idx, ct))
                    .collect::<Result<Vec<_>>>()?;
                ew::nary(*o, xs, ct).ok_or_else(|| self.unsupported(n, "no inputs"))?
            }
            // The untaken operand's bytes were not computed (its kernels' calls were guarded off):
            // a select reads them and drops them.
            Op::Where | Op::Choose => {
                let t = compute(elem(node.outputs[0].dtype));
                let c = self.pull_broadcast(n, 0, idx)?;
                let (x, y) = (self.pull_as(n, 1, idx, t)?, self.pull_as(n, 2, idx, t)?);
                return Ok(convert(Expr::select(c, x, y), t, out_t));
            }
            Op::Clip => {
                let mut x = self.pull_as(n, 0, idx, ct)?;
                if self.has_input(n, 1) {
                    x = Expr::bin(BinOp::Max, x, self.pull_as(n, 1, idx, ct)?);
                }
                if self.has_input(n, 2) {
                    x = Expr::bin(BinOp::Min, x, self.pull_as(n, 2, idx, ct)?);
                }
                x
            }
            Op::Cast { .. } => {
                let x = self.pull_broadcast(n, 0, idx)?;
                return Ok(convert(x, in0, out_t));
            }
            // The operand's bytes read as the output's type: a parameter of its own declared so (its
            // operand is stored: the op is its own kernel). A bool is any nonzero byte.
            Op::BitCast { .. } => {
                let v = self.input(n, 0)?;
                let read = if out_t == Elem::Bool { Elem::U8 } else { out_t };
                let name = format!("in{}", self.params.len());
                let b = self.k.buf(name, read, dims(self.ty(v)), Space::Global);
                self.params.push(Param::Value(v));
                return Ok(convert(Expr::load(b, idx.to_vec()), read, out_t));
            }
            Op::BatchNorm { epsilon } => {
                // (x - mean) / sqrt(var + eps) * scale + bias, per channel (axis 1).
                let ch = if idx.len() > 1 {
                    vec![idx[1].clone()]
                } else {
                    vec![Expr::int(0)]
                };
                let x = self.pull_as(n, 0, idx, ct)?;
                let mut p = Vec::new();
                for i in 1..5 {
                    let v = self.input(n, i)?;
                    let from = elem(self.ty(v).dtype);
                    let e = self.pull(v, &ch)?;
                    p.push(convert(e, from, ct));
                }
                let inv = Expr::bin(
                    BinOp::Div,
                    lit(1.0, ct),
                    Expr::un(
                        mlopt_kir::UnOp::Sqrt,
                        Expr::bin(BinOp::Add, p[3].clone(), lit(*epsilon as f64, ct)),
                    ),
                );
                let norm = Expr::bin(BinOp::Mul, Expr::bin(BinOp::Sub, x, p[2].clone()), inv);
                Expr::bin(
                    BinOp::Add,
                    Expr::bin(BinOp::Mul, norm, p[0].clone()),
                    p[1].clone(),
                )
            }
            Op::Lrn {
                size,
                alpha,
                beta,
                bias,
            } => {
                // x / (bias + alpha / size * sum of x^2 over the channels c - lo ..= c + hi)^beta.
                let (size, c) = (*size as i64, self.ty(self.input(n, 0)?).shape[1] as i64);
                // (Channels past the tensor's count nothing, so a window wider than it is cut to it.)
                let (lo, hi) = (((size - 1) / 2).min(c), (size / 2).min(c));
                let mut sq: Option<Expr> = None;
                for d in -lo..=hi {
                    let ch = Expr::add(idx[1].clone(), Expr::int(d));
                    let mut at = idx.to_vec();
                    at[1] = clamp(ch.clone(), c);
                    let v = self.pull_as(n, 0, &at, ct)?;
                    let term = Expr::select(
                        in_range(ch, c),
                        Expr::bin(BinOp::Mul, v.clone(), v),
                        lit(0.0, ct),
                    );
                    sq = Some(match sq {
                        None => term,
                        Some(s) => Expr::bin(BinOp::Add, s, term),
                    });
                }
                let sq = sq.unwrap_or_else(|| lit(0.0, ct));
                let base = Expr::bin(
                    BinOp::Add,
                    lit(*bias as f64, ct),
                    Expr::bin(BinOp::Mul, lit(*alpha as f64 / size as f64, ct), sq),
                );
                let x = self.pull_as(n, 0, idx, ct)?;
                Expr::bin(
                    BinOp::Div,
                    x,
                    Expr::bin(BinOp::Pow, base, lit(*beta as f64, ct)),
                )
            }
            _ => return self.pull_view(n, out, idx),
        };
        Ok(convert(e, ct, out_t))
    }

    /// Lowers the kernel: anchors in order, then the root's outputs.
    pub fn lower(
        mut self,
        order: &[NodeId],
        root: NodeId,
        outputs: &[(Value, BufId)],
    ) -> Result<(Kernel, Params)> {
        let anchors: Vec<NodeId> = order
            .iter()
            .copied()
            .filter(|n| self.members.contains(n) && !pulled(&self.g.node(*n).op))
            .collect();
        if let Some(fused) = self.fuse_epilogue(order, root, &anchors, outputs)? {
            self.k.body.extend(fused);
            return Ok((self.k, self.params));
        }
        for &n in &anchors {
            let node = self.g.node(n);
            let dsts: Vec<BufId> = (0..node.outputs.len())
                .map(|o| {
                    let v = Value {
                        node: n,
                        output: o as u32,
                    };
                    match outputs.iter().find(|(ov, _)| *ov == v) {
                        Some((_, b)) => *b,
                        None => {
                            let t = &node.outputs[o];
                            self.k.buf(
                                format!("t{}", self.k.bufs.len()),
                                elem(t.dtype),
                                dims(t),
                                Space::Local,
                            )
                        }
                    }
                })
                .collect();
            let stmts = nests::lower(&mut self, n, &dsts)?;
            self.k.body.extend(stmts);
            for (o, b) in dsts.iter().enumerate() {
                self.bufs.insert(
                    Value {
                        node: n,
                        output: o as u32,
                    },
                    *b,
                );
            }
        }
        if pulled(&self.g.node(root).op) {
            for (v, b) in outputs {
                let shape = dims(self.ty(*v));
                let (v, b) = (*v, *b);
                let stmts = self.nest("i", &shape, |l, idx| {
                    let e = l.pull_op(v.node, v.output as usize, idx)?;
                    Ok(vec![Stmt::Store {
                        buf: b,
                        index: idx.to_vec(),
                        value: e,
                    }])
                })?;
                self.k.body.extend(stmts);
            }
        }
        Ok((self.k, self.params))
    }

    /// One anchor followed by an elementwise epilogue of the same shape and type (MatMul + bias + ReLU,
    /// say): the epilogue is applied to each value the anchor computes, in registers, and stored straight
    /// into the kernel's output. The epilogue may end in a chain of Reshapes and Transposes (a projection
    /// split into heads), and each value is then stored where they move it: one pass instead of a
    /// contraction into a scratch buffer and a copy. Casts within that chain (which commute with it: a
    /// bf16 split into heads cast between its reshape and transpose) apply to the value, after the rest
    /// of the epilogue. None when the kernel does not have that form.
    fn fuse_epilogue(
        &mut self,
        order: &[NodeId],
        root: NodeId,
        anchors: &[NodeId],
        outputs: &[(Value, BufId)],
    ) -> Result<Option<Vec<Stmt>>> {
        let [a] = anchors else { return Ok(None) };
        let [(out_v, out_b)] = outputs else {
            return Ok(None);
        };
        // The layout tail, root first, its casts, and the value it starts from.
        let (mut tail, mut casts) = (Vec::new(), Vec::new());
        let mut end = root;
        while end != *a
            && matches!(
                self.g.node(end).op,
                Op::Reshape { .. } | Op::Transpose { .. } | Op::Cast { .. }
            )
        {
            let input = self.input(end, 0)?;
            if input.output != 0
                || (input.node != *a && !self.members.contains(&input.node))
                || (end != root && self.g.users(end).len() != 1)
            {
                break;
            }
            match self.g.node(end).op {
                Op::Cast { to } => casts.push((self.ty(input).dtype, to)),
                _ => tail.push(end),
            }
            end = input.node;
        }
        // Without a layout op there is no tail: the casts are the epilogue's own.
        if tail.is_empty() {
            (end, casts) = (root, vec![]);
        }
        let (an, rn) = (self.g.node(*a), self.g.node(end));
        let after: Vec<NodeId> = order
            .iter()
            .copied()
            .skip_while(|n| n != a)
            .skip(1)
            .filter(|n| self.members.contains(n) && !tail.contains(n))
            .collect();
        let av = Value {
            node: *a,
            output: 0,
        };
        let fusable = *a != root
            && out_v.node == root
            && self.g.node(root).outputs.len() == 1
            && rn.outputs.len() == 1
            // Same shape; the type may change (a bf16 GEMM whose result is cast back to f32): the anchor's
            // rounding to its own type stays in the stored expression.
            && an.outputs[0].shape == rn.outputs[0].shape
            && (1..an.outputs.len()).all(|o| self.g.users(*a).iter().all(|(_, e)| e.output as usize != o))
            && after.iter().all(|n| self.g.node(*n).op.is_elementwise())
            && (tail.is_empty() || self.g.users(end).len() == 1)
            // Scatters read back what they stored; the epilogue must see only final values.
            && !matches!(an.op, Op::ScatterElements { .. } | Op::ScatterNd { .. });
        if !fusable {
            return Ok(None);
        }
        // The epilogue at symbolic indices, reading the anchor's value as a load of its buffer: the
        // output itself, or (with a layout tail) a buffer no statement keeps.
        let out = *out_b;
        let shape = dims(&an.outputs[0]);
        let b = if tail.is_empty() {
            out
        } else {
            self.k.buf(
                format!("t{}", self.k.bufs.len()),
                elem(an.outputs[0].dtype),
                shape.clone(),
                Space::Local,
            )
        };
        let vars: Vec<Var> = shape.iter().map(|_| self.fresh("e")).collect();
        // Axes of size 1 are index 0, as pulls through a broadcast write them, so the loads match.
        let idx: Vec<Expr> = vars
            .iter()
            .zip(&shape)
            .map(|(v, s)| if *s == 1 { Expr::int(0) } else { Expr::var(*v) })
            .collect();
        self.bufs.insert(av, b);
        let epi = if end == *a {
            Expr::load(b, idx.clone())
        } else {
            self.pull_op(end, 0, &idx)?
        };
        // The tail's casts, innermost first.
        let epi = casts.iter().rev().fold(epi, |e, (from, to)| {
            mlopt_kir::index::convert(e, elem(*from), elem(*to))
        });
        if !loads_only_at(&epi, b, &idx) {
            self.bufs.remove(&av);
            return Ok(None);
        }
        let to = if tail.is_empty() {
            None
        } else {
            Some(self.moved_by(&tail, &idx, &vars, &shape)?)
        };
        let mut dsts = vec![b];
        for o in 1..an.outputs.len() {
            let t = &an.outputs[o];
            dsts.push(self.k.buf(
                format!("t{}", self.k.bufs.len()),
                elem(t.dtype),
                dims(t),
                Space::Local,
            ));
        }
        let stmts = nests::lower(self, *a, &dsts)?;
        if mlopt_kir::analysis::buffer_loads(&stmts).contains_key(&b) {
            return Err(self.unsupported(
                *a,
                "an anchor that reads its own output cannot take a fused epilogue",
            ));
        }
        Ok(Some(
            stmts
                .iter()
                .map(|s| apply_epilogue(s, b, &vars, &epi, out, to.as_deref()))
                .collect(),
        ))
    }

    /// Where a layout `tail` (root first) moves element `idx` (in `vars`, of extents `shape`): a Reshape
    /// keeps its row-major position, a Transpose permutes; the result taken apart where the extents allow.
    fn moved_by(
        &self,
        tail: &[NodeId],
        idx: &[Expr],
        vars: &[Var],
        shape: &[u64],
    ) -> Result<Vec<Expr>> {
        let mut to = idx.to_vec();
        for n in tail.iter().rev() {
            let node = self.g.node(*n);
            to = match &node.op {
                Op::Transpose { perm } => perm.iter().map(|p| to[*p].clone()).collect(),
                _ => {
                    let from: Vec<i64> = self
                        .ty(self.input(*n, 0)?)
                        .shape
                        .iter()
                        .map(|d| *d as i64)
                        .collect();
                    let into: Vec<i64> = node.outputs[0].shape.iter().map(|d| *d as i64).collect();
                    delinear(linear(&to, &from), &into)
                }
            };
        }
        let extent = |v: Var| vars.iter().position(|w| *w == v).map(|i| shape[i]);
        Ok(to
            .iter()
            .map(|e| mlopt_kir::analysis::simplify_index(e, &extent))
            .collect())
    }
}

/// Whether every load of `b` in `e` is at exactly `idx`.
fn loads_only_at(e: &Expr, b: BufId, idx: &[Expr]) -> bool {
    match e {
        Expr::Load(x, ix) => (*x != b || ix == idx) && ix.iter().all(|i| loads_only_at(i, b, idx)),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => true,
        Expr::Unary(_, a) | Expr::Cast(_, a) => loads_only_at(a, b, idx),
        Expr::Binary(_, x, y) => loads_only_at(x, b, idx) && loads_only_at(y, b, idx),
        Expr::Fma(x, y, z) | Expr::Select(x, y, z) => {
            [x, y, z].iter().all(|a| loads_only_at(a, b, idx))
        }
    }
}

/// Rewrites every store `b[I] = v` into `out[to(I)] = epilogue(I, v)` (`to` and `epilogue` are written
/// in `vars`; without `to`, at I).
fn apply_epilogue(
    s: &Stmt,
    b: BufId,
    vars: &[Var],
    epi: &Expr,
    out: BufId,
    to: Option<&[Expr]>,
) -> Stmt {
    let rec = |body: &[Stmt]| {
        body.iter()
            .map(|s| apply_epilogue(s, b, vars, epi, out, to))
            .collect()
    };
    match s {
        Stmt::Store { buf, index, value } if *buf == b => {
            let at = |e: &Expr| {
                vars.iter()
                    .zip(index)
                    .fold(e.clone(), |e, (v, i)| e.subst(*v, i))
            };
            let index = to.map_or_else(|| index.clone(), |to| to.iter().map(at).collect());
            Stmt::Store {
                buf: out,
                index,
                value: replace_load(&at(epi), b, value),
            }
        }
        Stmt::For {
            var,
            extent,
            kind,
            body,
        } => Stmt::For {
            var: *var,
            extent: *extent,
            kind: *kind,
            body: rec(body),
        },
        Stmt::If { cond, then } => Stmt::If {
            cond: cond.clone(),
            then: rec(then),
        },
        s => s.clone(),
    }
}

/// `e` with every load of `b` replaced by `v`.
fn replace_load(e: &Expr, b: BufId, v: &Expr) -> Expr {
    let r = |x: &Expr| replace_load(x, b, v);
    match e {
        Expr::Load(x, _) if *x == b => v.clone(),
        Expr::Load(x, ix) => Expr::Load(*x, ix.iter().map(r).collect()),
        Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => e.clone(),
        Expr::Unary(o, a) => Expr::un(*o, r(a)),
        Expr::Cast(t, a) => Expr::cast(*t, r(a)),
        Expr::Binary(o, x, y) => Expr::bin(*o, r(x), r(y)),
        Expr::Fma(x, y, z) => Expr::fma(r(x), r(y), r(z)),
        Expr::Select(x, y, z) => Expr::select(r(x), r(y), r(z)),
    }
}
