//! Kernel IR -> LLVM IR. Each kernel is a function over its parameter pointers; a program adds its
//! weights as constant globals and one entry point, `mlopt_<name>_run(arena, inputs, outputs)`, that calls
//! the kernels in order on pointers into the arena, the caller's buffers and the weights.
//!
//! Loops become counted loops over an `i64` induction variable. A `vector<W>` loop steps by W and evaluates
//! its body on W lanes at once: a load whose flat index moves by one element per lane is one vector load,
//! a load that does not depend on the lane is a scalar load broadcast to all lanes, anything else a gather;
//! stores likewise. A `local` buffer used only inside one vector loop is private to each lane (the
//! accumulators lowering writes), so it is held as vectors. `unrolled` loops are emitted once per
//! iteration with the variable a constant. Parallel loops are outlined into a function the runtime's
//! thread pool calls over index ranges (`parallel.rs`).

// GEP construction is `unsafe` in inkwell because a wrong index makes IR that reads out of bounds when
// *run*; every index emitted here comes from a kernel the verifier proved in bounds.
#![allow(unsafe_code)]

use crate::error::{LlvmError, Result};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

use mlopt_kir::{BufId, Buffer, Elem, Expr, Kernel, LoopKind, Space, Stmt, Var};
use mlopt_target::MatrixUnit;
use std::collections::HashMap;

pub type Ret<T> = Result<T>;

pub fn ty<'c>(c: &'c Context, e: Elem) -> BasicTypeEnum<'c> {
    match e {
        Elem::F32 => c.f32_type().into(),
        Elem::F16 => c.f16_type().into(),
        Elem::BF16 => c.bf16_type().into(),
        Elem::F64 => c.f64_type().into(),
        Elem::I8 | Elem::U8 | Elem::Bool => c.i8_type().into(),
        Elem::I16 | Elem::U16 => c.i16_type().into(),
        Elem::I32 | Elem::U32 => c.i32_type().into(),
        Elem::I64 | Elem::U64 => c.i64_type().into(),
        // One byte each: float8 / float4 codes, int4 / uint4 held extended.
        Elem::F8E4M3FN
        | Elem::F8E4M3FNUZ
        | Elem::F8E5M2
        | Elem::F8E5M2FNUZ
        | Elem::F4E2M1
        | Elem::I4
        | Elem::U4
        | Elem::I2
        | Elem::U2 => c.i8_type().into(),
    }
}

/// The constant `x` of element type `e`: a float8 / float4 as its code.
pub(crate) fn scalar_const<'c>(c: &'c Context, x: f64, e: Elem) -> BasicValueEnum<'c> {
    if let Some(f) = e.minifloat() {
        c.i8_type().const_int(u64::from(f.encode(x)), false).into()
    } else if e.is_float() {
        reg_ty(c, e).into_float_type().const_float(x).into()
    } else {
        reg_ty(c, e)
            .into_int_type()
            .const_int(x as i64 as u64, true)
            .into()
    }
}

/// The register type of an element: bools are `i1` in registers and `i8` in memory.
pub(crate) fn reg_ty<'c>(c: &'c Context, e: Elem) -> BasicTypeEnum<'c> {
    if e == Elem::Bool {
        c.bool_type().into()
    } else {
        ty(c, e)
    }
}

/// Where a loop variable's value is: a scalar counter, or the counter of a vector loop (lane i = base + i).
#[derive(Clone, Copy)]
pub(crate) enum VarVal<'c> {
    Scalar(IntValue<'c>),
    Lanes(IntValue<'c>),
}

pub struct Gen<'a, 'c> {
    pub ctx: &'c Context,
    pub module: &'a Module<'c>,
    pub builder: Builder<'c>,
    pub kernel: &'a Kernel,
    pub func: FunctionValue<'c>,
    /// Base pointer of every buffer.
    pub ptrs: HashMap<BufId, PointerValue<'c>>,
    pub(crate) vars: HashMap<Var, VarVal<'c>>,
    /// Lanes of the vector loop being emitted, and the lane-private local buffers.
    pub(crate) width: Option<u32>,
    pub(crate) private: HashMap<BufId, PointerValue<'c>>,
    /// What runs `mma` blocks of bf16.
    pub matrix: Option<MatrixUnit>,
    /// What runs `mma` blocks of i16 (`dot.rs`).
    pub i16_dot: Option<mlopt_target::I16Dot>,
    /// AMX tiles configured around the loop being emitted (`amx.rs`): its products neither configure
    /// nor release them.
    pub(crate) tiles_ready: bool,
    /// f32 -> bf16 by `vcvtneps2bf16` (the CPU has AVX512-BF16), not in integer code.
    pub bf16_convert: bool,
    /// A load whose value is already in registers (`transpose.rs`: a gathered operand read as rows and
    /// transposed): the buffer, its index, and the value `load` returns for it.
    pub(crate) forced: Option<(BufId, Vec<Expr>, BasicValueEnum<'c>)>,
    /// AVX-512F: 16-lane f32 intrinsics (`avx512_ps`): `vscalefps` in `exp_f32`, `maxps`/`minps` in
    /// NaN-propagating min/max (`math.rs`).
    pub avx512: bool,
    /// AVX: 8-lane f32 intrinsics (`x86_ps`): `maxps`/`minps` in NaN-propagating min/max.
    pub avx: bool,
    /// The kernel's loop extents, computed on first use (`memory.rs` asks them of non-affine loads).
    pub(crate) extents: std::cell::OnceCell<HashMap<Var, u64>>,
    /// Code for an NVPTX kernel (`ptx.rs`): GPU loops read the block and thread ids, barriers are
    /// `bar.sync`, and math has no libm to call.
    pub gpu: bool,
    /// How deep in parallel loops this function runs (0: the kernel; 1: a parallel loop's body...):
    /// the level of its scratch (`allocate`).
    pub(crate) depth: usize,
    /// How this function reports a failed allocation (its own, or a parallel loop's inside it).
    pub(crate) on_out_of_memory: OutOfMemory<'c>,
    oom_block: Option<inkwell::basic_block::BasicBlock<'c>>,
}

/// How a function reports that its scratch could not be had: a kernel returns 1; a parallel loop's outlined
/// body sets its context's flag, which the code around the loop reads after it, and returns.
#[derive(Clone, Copy)]
pub(crate) enum OutOfMemory<'c> {
    Return,
    Flag(PointerValue<'c>),
}

/// The most bytes a GPU thread's local buffer may have (it lives in the thread's local memory).
const GPU_LOCAL_BYTES: u64 = 256 * 1024;

pub(crate) fn err(what: impl Into<String>) -> LlvmError {
    LlvmError::Codegen(what.into())
}

impl<'a, 'c> Gen<'a, 'c> {
    pub fn new(c: &'c Context, m: &'a Module<'c>, k: &'a Kernel, f: FunctionValue<'c>) -> Self {
        Gen {
            ctx: c,
            module: m,
            builder: c.create_builder(),
            kernel: k,
            func: f,
            ptrs: HashMap::new(),
            vars: HashMap::new(),
            width: None,
            private: HashMap::new(),
            matrix: None,
            i16_dot: None,
            tiles_ready: false,
            bf16_convert: false,
            avx512: false,
            avx: false,
            forced: None,
            extents: std::cell::OnceCell::new(),
            gpu: false,
            depth: 0,
            on_out_of_memory: OutOfMemory::Return,
            oom_block: None,
        }
    }

    /// Binds the kernel's parameters, in order, to the function's arguments, each named after its
    /// buffer.
    pub(crate) fn bind_params(&mut self) -> Ret<()> {
        for (i, b) in self.kernel.params().iter().enumerate() {
            let p = self
                .func
                .get_nth_param(i as u32)
                .ok_or_else(|| err("missing parameter"))?
                .into_pointer_value();
            p.set_name(&self.kernel.buffer(*b).name);
            self.ptrs.insert(*b, p);
        }
        Ok(())
    }

    pub(crate) fn i64(&self, v: i64) -> IntValue<'c> {
        self.ctx.i64_type().const_int(v as u64, true)
    }

    /// Allocates the kernel's local buffers at the top of the function (`allocate`). Locals one
    /// iteration of a parallel loop owns are made by each thread (`parallel.rs`), not here.
    pub fn alloc_locals(&mut self) -> Ret<()> {
        let threads_own = match self.gpu {
            true => vec![],
            false => mlopt_kir::analysis::locals_owned_by_loops(self.kernel, &|kind| {
                kind == LoopKind::Parallel
            }),
        };
        let bufs: Vec<BufId> = (0..self.kernel.bufs.len() as u32)
            .map(BufId)
            .filter(|b| self.kernel.buffer(*b).space == Space::Local && !threads_own.contains(b))
            .collect();
        self.allocate(&bufs)
    }

    /// Allocates local buffers `bufs`: on the stack the small ones (`locals::on_stack`; a GPU thread's
    /// are all there, up to `GPU_LOCAL_BYTES`), the rest at offsets in this thread's scratch for this
    /// function's parallel nesting level (the runtime's `mlopt_scratch`); then goes on only if the
    /// scratch could be had, else to `out_of_memory`.
    pub(crate) fn allocate(&mut self, bufs: &[BufId]) -> Ret<()> {
        let buffers: Vec<&Buffer> = bufs.iter().map(|b| self.kernel.buffer(*b)).collect();
        let stack = match self.gpu {
            true => vec![true; bufs.len()],
            false => crate::locals::on_stack(&buffers),
        };
        let mut scratch: Vec<(BufId, u64)> = Vec::new();
        let mut scratch_bytes = 0;
        for ((b, buf), on_stack) in bufs.iter().zip(&buffers).zip(stack) {
            let bytes = crate::locals::padded_bytes(buf);
            if self.gpu && bytes > GPU_LOCAL_BYTES {
                return Err(err(format!(
                    "@{}: local %{} of {bytes} bytes per GPU thread",
                    self.kernel.name, buf.name
                )));
            }
            if !on_stack {
                scratch.push((*b, scratch_bytes));
                scratch_bytes += bytes;
                continue;
            }
            let t = ty(self.ctx, buf.elem);
            let n = buf.numel().max(1);
            let p = self
                .builder
                .build_array_alloca(t, self.i64(n as i64), &buf.name)?;
            p.as_instruction().map(|ins| ins.set_alignment(64));
            self.ptrs.insert(*b, p);
        }
        if scratch.is_empty() {
            return Ok(());
        }
        if self.depth >= crate::locals::SCRATCH_LEVELS {
            return Err(err(format!(
                "@{}: scratch inside parallel loops nested {} deep (at most {})",
                self.kernel.name,
                self.depth + 1,
                crate::locals::SCRATCH_LEVELS
            )));
        }
        let call = self.builder.build_call(
            libc(self.ctx, self.module, "mlopt_scratch")?,
            &[
                self.i64(self.depth as i64).into(),
                self.i64(scratch_bytes as i64).into(),
            ],
            "scratch",
        )?;
        let base = call
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| err("mlopt_scratch returned nothing"))?
            .into_pointer_value();
        for (b, offset) in scratch {
            // SAFETY: the scratch holds `scratch_bytes`, the sum of the padded locals.
            let p = unsafe {
                self.builder.build_in_bounds_gep(
                    self.ctx.i8_type(),
                    base,
                    &[self.i64(offset as i64)],
                    &self.kernel.buffer(b).name,
                )?
            };
            self.ptrs.insert(b, p);
        }
        let failed = self.builder.build_is_null(base, "failed")?;
        let (oom, run) = (
            self.out_of_memory()?,
            self.ctx.append_basic_block(self.func, "run"),
        );
        self.builder.build_conditional_branch(failed, oom, run)?;
        self.builder.position_at_end(run);
        Ok(())
    }

    /// The block that reports a failed allocation as `on_out_of_memory` says; made once.
    pub(crate) fn out_of_memory(&mut self) -> Ret<inkwell::basic_block::BasicBlock<'c>> {
        if let Some(b) = self.oom_block {
            return Ok(b);
        }
        let here = self
            .builder
            .get_insert_block()
            .ok_or_else(|| err("no insertion point"))?;
        let oom = self.ctx.append_basic_block(self.func, "oom");
        self.builder.position_at_end(oom);
        match self.on_out_of_memory {
            OutOfMemory::Return => {
                self.builder
                    .build_return(Some(&self.ctx.i32_type().const_int(1, false)))?;
            }
            OutOfMemory::Flag(flag) => {
                // Several threads may fail at once: an atomic store, read after they have all joined.
                let st = self.builder.build_store(flag, self.i64(1))?;
                st.set_alignment(8).map_err(|e| err(e.to_string()))?;
                st.set_atomic_ordering(inkwell::AtomicOrdering::Monotonic)
                    .map_err(|e| err(e.to_string()))?;
                self.builder.build_return(None)?;
            }
        }
        self.builder.position_at_end(here);
        self.oom_block = Some(oom);
        Ok(oom)
    }

    pub fn block(&mut self, body: &[Stmt]) -> Ret<()> {
        let mut i = 0;
        while i < body.len() {
            // A product and a loop summing more into its block run as one on AMX (`dot.rs`).
            if i + 1 < body.len() && !self.gpu && self.led_mmas(&body[i], &body[i + 1])? {
                i += 2;
                continue;
            }
            self.stmt(&body[i])?;
            i += 1;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Ret<()> {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => self.for_loop(*var, *extent, *kind, body),
            Stmt::Store { buf, index, value } => self.store(*buf, index, value),
            Stmt::If { cond, then } => self.guarded(cond, &mut |g| g.block(then)),
            Stmt::Barrier if self.gpu => {
                let f = crate::ptx::nvvm(
                    self,
                    "llvm.nvvm.barrier0",
                    self.ctx.void_type().fn_type(&[], false),
                );
                self.builder.build_call(f, &[], "")?;
                Ok(())
            }
            Stmt::Barrier => Err(err("barrier in a CPU kernel")),
            // A GPU kernel's operands stream through its shared-memory copies instead.
            Stmt::Prefetch { .. } if self.gpu => Ok(()),
            Stmt::Prefetch { buf, at } => self.prefetch(*buf, at),
            Stmt::WarpMma { c, a, b } if self.gpu => crate::ptx::warp_mma(self, c, a, b),
            Stmt::WarpMma { .. } => Err(err("mma.sync in a CPU kernel")),
            Stmt::CopyAsync {
                dst,
                src,
                from,
                lanes,
                valid,
            } if self.gpu => crate::ptx::copy_async(self, dst, *src, from, *lanes, valid.as_ref()),
            Stmt::AsyncWait if self.gpu => {
                let f = crate::ptx::nvvm(
                    self,
                    "llvm.nvvm.cp.async.wait.all",
                    self.ctx.void_type().fn_type(&[], false),
                );
                self.builder.build_call(f, &[], "")?;
                Ok(())
            }
            Stmt::CopyAsync { .. } | Stmt::AsyncWait => Err(err("cp.async in a CPU kernel")),
            Stmt::WarpReduce { buf, op } if self.gpu => crate::ptx::warp_reduce(self, *buf, *op),
            Stmt::WarpReduce { .. } => Err(err("warp.reduce in a CPU kernel")),
            Stmt::Mma { .. } if self.width.is_some() => Err(err(format!(
                "@{}: an mma in a vector loop",
                self.kernel.name
            ))),
            Stmt::Mma {
                m,
                n,
                k,
                c,
                a,
                b,
                acc,
                ahead,
            } => match (self.pairs(a), self.matrix) {
                (Some(p), _) => self.mma_dot(p, (*m, *n, *k), (c, a, b), *acc, *ahead),
                (None, Some(MatrixUnit::Amx)) => self.mma(*m, *n, *k, c, a, b, *acc),
                _ => Err(err(format!(
                    "@{}: an mma block of {} on a target without a unit for it (expand it first)",
                    self.kernel.name,
                    self.kernel.buffer(a.buf).elem
                ))),
            },
        }
    }

    /// A value of type `t` (or an array of `n`) on the stack, allocated at the top of the entry block
    /// (where mem2reg and SROA promote allocas to registers), wherever the builder currently is.
    pub(crate) fn entry_alloca(
        &mut self,
        t: BasicTypeEnum<'c>,
        n: Option<u64>,
        name: &str,
    ) -> Ret<PointerValue<'c>> {
        let entry = self
            .func
            .get_first_basic_block()
            .ok_or_else(|| err("function without entry"))?;
        let here = self
            .builder
            .get_insert_block()
            .ok_or_else(|| err("builder not positioned"))?;
        match entry.get_first_instruction() {
            Some(first) => self.builder.position_before(&first),
            None => self.builder.position_at_end(entry),
        }
        let p = match n {
            Some(n) => self
                .builder
                .build_array_alloca(t, self.i64(n as i64), name)?,
            None => self.builder.build_alloca(t, name)?,
        };
        self.builder.position_at_end(here);
        Ok(p)
    }

    /// A counted loop `for v in (0..extent).step_by(step)`; `body` gets the counter.
    /// Code emitted by `then` that runs only where `cond` (the same for every lane) holds.
    pub(crate) fn guarded(
        &mut self,
        cond: &Expr,
        then: &mut dyn FnMut(&mut Self) -> Ret<()>,
    ) -> Ret<()> {
        let c = self.eval(cond)?;
        if c.is_vector_value() {
            return Err(err(format!(
                "@{}: a guard that differs between lanes in a vector loop",
                self.kernel.name
            )));
        }
        let (yes, done) = (
            self.ctx.append_basic_block(self.func, "then"),
            self.ctx.append_basic_block(self.func, "endif"),
        );
        self.builder
            .build_conditional_branch(c.into_int_value(), yes, done)?;
        self.builder.position_at_end(yes);
        then(self)?;
        self.builder.build_unconditional_branch(done)?;
        self.builder.position_at_end(done);
        Ok(())
    }

    pub(crate) fn counted(
        &mut self,
        name: &str,
        begin: IntValue<'c>,
        end: IntValue<'c>,
        step: u64,
        body: &mut dyn FnMut(&mut Self, IntValue<'c>) -> Ret<()>,
    ) -> Ret<()> {
        // A loop of one step (a vector loop as wide as its extent, a serial loop of extent 1) is its
        // body at `begin`: no counter, no blocks for LLVM to analyse and unroll again.
        if let (Some(b), Some(e)) = (
            begin.get_sign_extended_constant(),
            end.get_sign_extended_constant(),
        ) {
            if e <= b {
                return Ok(());
            }
            if (e - b) as u64 <= step {
                return body(self, begin);
            }
        }
        let i64t = self.ctx.i64_type();
        // The counter lives in an entry-block alloca; mem2reg makes it a phi.
        let slot = self.entry_alloca(i64t.into(), None, name)?;
        self.builder.build_store(slot, begin)?;
        let (head, bodyb, done) = (
            self.ctx
                .append_basic_block(self.func, &format!("{name}.head")),
            self.ctx
                .append_basic_block(self.func, &format!("{name}.body")),
            self.ctx
                .append_basic_block(self.func, &format!("{name}.end")),
        );
        self.builder.build_unconditional_branch(head)?;
        self.builder.position_at_end(head);
        let i = self.builder.build_load(i64t, slot, name)?.into_int_value();
        let more = self
            .builder
            .build_int_compare(IntPredicate::SLT, i, end, "more")?;
        self.builder.build_conditional_branch(more, bodyb, done)?;
        self.builder.position_at_end(bodyb);
        body(self, i)?;
        let next = self
            .builder
            .build_int_add(i, i64t.const_int(step, false), "next")?;
        self.builder.build_store(slot, next)?;
        self.builder.build_unconditional_branch(head)?;
        self.builder.position_at_end(done);
        Ok(())
    }

    fn for_loop(&mut self, var: Var, extent: u64, kind: LoopKind, body: &[Stmt]) -> Ret<()> {
        // AMX tiles are configured once around the outermost serial loop of this function that
        // runs products on them (`amx.rs`).
        let tiles = kind == LoopKind::Serial && !self.tiles_ready && self.tiles_for(body);
        if tiles {
            self.configure_tiles()?;
        }
        let r = self.emit_loop(var, extent, kind, body);
        if tiles {
            self.release_tiles()?;
        }
        // The variable is out of scope after its loop (a stale vector variable would confuse lane analysis).
        self.vars.remove(&var);
        r
    }

    fn emit_loop(&mut self, var: Var, extent: u64, kind: LoopKind, body: &[Stmt]) -> Ret<()> {
        let name = self.kernel.var_name(var).replace('.', "_");
        match kind {
            LoopKind::Unrolled => {
                for i in 0..extent {
                    self.vars.insert(var, VarVal::Scalar(self.i64(i as i64)));
                    self.block(body)?;
                }
                Ok(())
            }
            LoopKind::Vector(w) if self.width.is_none() => {
                let private = self.private_locals(body, w)?;
                self.width = Some(w);
                let saved = std::mem::replace(&mut self.private, private);
                let (zero, end) = (self.i64(0), self.i64(extent as i64));
                let r = self.counted(&name, zero, end, w as u64, &mut |g, i| {
                    g.vars.insert(var, VarVal::Lanes(i));
                    g.block(body)
                });
                self.width = None;
                self.private = saved;
                r
            }
            LoopKind::Parallel if self.width.is_none() => {
                crate::parallel::parallel_loop(self, var, extent, body)
            }
            // The grid has exactly as many blocks, and every thread loop as many threads, as the extent.
            LoopKind::GpuBlock(_) | LoopKind::GpuThread(_) if self.gpu => {
                let id = crate::ptx::special(
                    self,
                    if matches!(kind, LoopKind::GpuBlock(_)) {
                        "ctaid.x"
                    } else {
                        "tid.x"
                    },
                )?;
                self.vars.insert(var, VarVal::Scalar(id));
                self.block(body)
            }
            _ => {
                // Serial loops of two forms have code of their own: a sum of short `mma` products
                // into one block runs whole (`dot.rs`), and a loop around a vector loop that
                // gathers runs as many of its steps as the vector has lanes at a time, the gathered
                // operand read as rows and transposed (`transpose.rs`); the rest is counted.
                let serial = kind == LoopKind::Serial && !self.gpu;
                if serial && self.summed_mmas(var, extent, body)? {
                    return Ok(());
                }
                let done = match serial {
                    true => self.transposed_steps(var, extent, body)?,
                    false => 0,
                };
                let (begin, end) = (self.i64(done as i64), self.i64(extent as i64));
                self.counted(&name, begin, end, 1, &mut |g, i| {
                    g.vars.insert(var, VarVal::Scalar(i));
                    g.block(body)
                })
            }
        }
    }

    /// Local buffers accessed only inside `body`: each lane of a vector loop gets its own copy.
    fn private_locals(&mut self, body: &[Stmt], w: u32) -> Ret<HashMap<BufId, PointerValue<'c>>> {
        let private = mlopt_kir::analysis::private_locals(self.kernel, body);
        let mut out = HashMap::new();
        for b in private {
            let buf = self.kernel.buffer(b);
            let vt = reg_ty(self.ctx, buf.elem);
            let p = self.entry_alloca(
                vector_type(vt, w),
                Some(buf.numel().max(1)),
                &format!("{}.lanes", buf.name),
            )?;
            out.insert(b, p);
        }
        Ok(out)
    }

    pub fn eval(&mut self, e: &Expr) -> Ret<BasicValueEnum<'c>> {
        let v: BasicValueEnum<'c> = match e {
            Expr::Int(x) => self.i64(*x).into(),
            Expr::Float(x, t) => scalar_const(self.ctx, *x, *t),
            Expr::Var(v) => match self.vars.get(v).copied() {
                Some(VarVal::Scalar(i)) => i.into(),
                Some(VarVal::Lanes(i)) => {
                    let w = self.width.unwrap_or(1);
                    let base = self.widen(i.into())?;
                    let iota: Vec<IntValue> = (0..w).map(|l| self.i64(l as i64)).collect();
                    let iota = inkwell::types::VectorType::const_vector(&iota);
                    self.builder
                        .build_int_add(base.into_vector_value(), iota, "lane")?
                        .into()
                }
                None => {
                    return Err(err(format!(
                        "@{}: variable {} has no value",
                        self.kernel.name, v.0
                    )))
                }
            },
            Expr::Load(b, ix) => return self.load(*b, ix),
            Expr::Unary(o, a) => {
                let t = a.elem(self.kernel);
                let x = self.eval(a)?;
                crate::math::unary(self, *o, x, t)?
            }
            Expr::Binary(o, a, b) => {
                let t = a.elem(self.kernel);
                let (x, y) = (self.eval(a)?, self.eval(b)?);
                let (x, y) = self.same_shape(x, y)?;
                crate::math::binary(self, *o, x, y, t)?
            }
            Expr::Fma(a, b, c) => {
                let (x, y, z) = (self.eval(a)?, self.eval(b)?, self.eval(c)?);
                let (x, y) = self.same_shape(x, y)?;
                let (x, z) = self.same_shape(x, z)?;
                let (y, _) = self.same_shape(y, x)?;
                self.intrinsic("llvm.fma", &[x, y, z])?
            }
            Expr::Select(c, a, b) => {
                let (cv, x, y) = (self.eval(c)?, self.eval(a)?, self.eval(b)?);
                let (x, y) = self.same_shape(x, y)?;
                let (cv, x) = self.same_shape(cv, x)?;
                let (y, _) = self.same_shape(y, x)?;
                match cv {
                    BasicValueEnum::VectorValue(c) => self.builder.build_select(c, x, y, "sel")?,
                    c => self.builder.build_select(c.into_int_value(), x, y, "sel")?,
                }
            }
            Expr::Cast(t, a) => {
                let from = a.elem(self.kernel);
                let x = self.eval(a)?;
                crate::math::cast(self, x, from, *t)?
            }
        };
        Ok(v)
    }

    /// Broadcasts whichever operand is scalar when the other is a vector.
    fn same_shape(
        &mut self,
        x: BasicValueEnum<'c>,
        y: BasicValueEnum<'c>,
    ) -> Ret<(BasicValueEnum<'c>, BasicValueEnum<'c>)> {
        match (x.is_vector_value(), y.is_vector_value()) {
            (true, false) => Ok((x, self.widen(y)?)),
            (false, true) => Ok((self.widen(x)?, y)),
            _ => Ok((x, y)),
        }
    }

    /// Calls an overloaded LLVM intrinsic on the arguments' type.
    pub fn intrinsic(
        &mut self,
        name: &str,
        args: &[BasicValueEnum<'c>],
    ) -> Ret<BasicValueEnum<'c>> {
        let i = Intrinsic::find(name).ok_or_else(|| err(format!("no intrinsic {name}")))?;
        let f = i
            .get_declaration(self.module, &[args[0].get_type()])
            .ok_or_else(|| err(format!("no declaration of {name}")))?;
        let a: Vec<inkwell::values::BasicMetadataValueEnum> =
            args.iter().map(|x| (*x).into()).collect();
        self.builder
            .build_call(f, &a, name)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| err(format!("{name} returned nothing")))
    }
}

pub fn vector_type<'c>(t: BasicTypeEnum<'c>, w: u32) -> BasicTypeEnum<'c> {
    match t {
        BasicTypeEnum::FloatType(f) => f.vec_type(w).into(),
        BasicTypeEnum::IntType(i) => i.vec_type(w).into(),
        BasicTypeEnum::PointerType(p) => p.vec_type(w).into(),
        t => t,
    }
}

/// A constant with `v`'s shape (scalar or vector) holding `x` of element type `e`.
pub fn const_like<'c>(
    c: &'c Context,
    v: BasicValueEnum<'c>,
    x: f64,
    e: Elem,
) -> BasicValueEnum<'c> {
    let scalar = scalar_const(c, x, e);
    match v {
        BasicValueEnum::VectorValue(vv) => {
            let n = vv.get_type().get_size();
            match scalar {
                BasicValueEnum::FloatValue(f) => {
                    inkwell::types::VectorType::const_vector(&vec![f; n as usize]).into()
                }
                BasicValueEnum::IntValue(i) => {
                    inkwell::types::VectorType::const_vector(&vec![i; n as usize]).into()
                }
                s => s,
            }
        }
        _ => scalar,
    }
}

pub fn int_cmp<'c>(
    b: &Builder<'c>,
    p: IntPredicate,
    x: BasicValueEnum<'c>,
    y: BasicValueEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    Ok(match (x, y) {
        (BasicValueEnum::VectorValue(x), BasicValueEnum::VectorValue(y)) => {
            b.build_int_compare(p, x, y, "icmp")?.into()
        }
        (x, y) => b
            .build_int_compare(p, x.into_int_value(), y.into_int_value(), "icmp")?
            .into(),
    })
}

pub fn float_cmp<'c>(
    b: &Builder<'c>,
    p: FloatPredicate,
    x: BasicValueEnum<'c>,
    y: BasicValueEnum<'c>,
) -> Ret<BasicValueEnum<'c>> {
    Ok(match (x, y) {
        (BasicValueEnum::VectorValue(x), BasicValueEnum::VectorValue(y)) => {
            b.build_float_compare(p, x, y, "fcmp")?.into()
        }
        (x, y) => b
            .build_float_compare(p, x.into_float_value(), y.into_float_value(), "fcmp")?
            .into(),
    })
}

/// The declaration of an external function the generated code calls (the C library's allocator, the
/// runtime's thread pool), added to the module on first use.
pub fn libc<'c>(c: &'c Context, m: &Module<'c>, name: &str) -> Ret<FunctionValue<'c>> {
    if let Some(f) = m.get_function(name) {
        return Ok(f);
    }
    let (ptr, i64t, void) = (
        c.ptr_type(AddressSpace::default()),
        c.i64_type(),
        c.void_type(),
    );
    let ty = match name {
        "aligned_alloc" => ptr.fn_type(&[i64t.into(), i64t.into()], false),
        "free" => void.fn_type(&[ptr.into()], false),
        "mlopt_parallel_for" => void.fn_type(&[ptr.into(), ptr.into(), i64t.into()], false),
        "mlopt_init_threads" => void.fn_type(&[c.i32_type().into()], false),
        "mlopt_init_amx" => c.i32_type().fn_type(&[], false),
        "mlopt_scratch" => ptr.fn_type(&[i64t.into(), i64t.into()], false),
        "mlopt_cpu_supports" => c
            .i32_type()
            .fn_type(&[ptr.into(), ptr.into(), i64t.into()], false),
        "mlopt_now_ns" => i64t.fn_type(&[], false),
        _ => return Err(err(format!("no declaration for external function {name}"))),
    };
    Ok(m.add_function(name, ty, None))
}
