//! The library's C API around the kernels: the context (`mlopt_<name>_create`, `_destroy`, `_error`:
//! the activation arena, then the last run's status and its messages) and the entry point
//! `mlopt_<name>_run`, which checks the CPU and its arguments, starts the runtime and calls each step's
//! kernel, stopping with a status at the first failure.

#![allow(unsafe_code)] // GEPs into the arena and the pointer arrays; see codegen.rs.

use crate::codegen::libc;
use crate::error::{LlvmError, Result};
use crate::program::c_name;
use inkwell::context::Context;
use inkwell::module::Linkage;
use inkwell::values::BasicValue;
use inkwell::AddressSpace;
use mlopt_kir::{Place, Program};
use mlopt_target::CpuTarget;

/// A private constant global `symbol` holding `value` (a message, a feature list); its address.
fn private_constant<'c>(
    m: &inkwell::module::Module<'c>,
    symbol: &str,
    value: &dyn BasicValue<'c>,
) -> inkwell::values::PointerValue<'c> {
    let g = m.add_global(value.as_basic_value_enum().get_type(), None, symbol);
    g.set_initializer(value);
    g.set_constant(true);
    g.set_linkage(Linkage::Private);
    g.as_pointer_value()
}

/// Status codes of `mlopt_<name>_run` (0 is success), which the header defines as `MLOPT_ERR_*`: a NULL
/// argument, out of memory, input data the model rejects, a refusal by the OS.
pub const STATUS_ARGUMENT: u64 = 1;
pub const STATUS_MEMORY: u64 = 2;
pub const STATUS_DATA: u64 = 3;
pub const STATUS_PLATFORM: u64 = 4;

/// `void *mlopt_<name>_create(void)`: the context is the model's activation arena, 64-byte aligned, then
/// the last run's status (`Program::context_bytes`); NULL when out of memory.
/// `void mlopt_<name>_destroy(void *)` frees it, and `const char *mlopt_<name>_error(const void *ctx)` is
/// the message of the last run's status (`messages[status word]`; "" after a successful run).
fn define_context<'c>(
    c: &'c Context,
    m: &inkwell::module::Module<'c>,
    p: &Program,
    messages: &[String],
) -> Result<()> {
    let ptr = c.ptr_type(AddressSpace::default());
    let (i32t, i64t) = (c.i32_type(), c.i64_type());
    let name = c_name(&p.name);
    let (alloc, free) = (libc(c, m, "aligned_alloc")?, libc(c, m, "free")?);
    let b = c.create_builder();
    let create = m.add_function(
        &format!("mlopt_{name}_create"),
        ptr.fn_type(&[], false),
        None,
    );
    b.position_at_end(c.append_basic_block(create, "entry"));
    let ctx = b.build_call(
        alloc,
        &[
            i64t.const_int(64, false).into(),
            i64t.const_int(p.context_bytes(), false).into(),
        ],
        "ctx",
    )?;
    let ctx = ctx
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| LlvmError::Codegen("aligned_alloc".into()))?
        .into_pointer_value();
    return_if(c, &b, b.build_is_null(ctx, "null")?, Some(&ctx))?;
    b.build_store(trailer(c, &b, (ctx, STATUS_AT), p)?, i32t.const_zero())?;
    let magic = i64t.const_int(context_magic(&p.name), false);
    b.build_store(trailer(c, &b, (ctx, MARK_AT), p)?, magic)?;
    b.build_return(Some(&ctx))?;

    let destroy = m.add_function(
        &format!("mlopt_{name}_destroy"),
        c.void_type().fn_type(&[ptr.into()], false),
        None,
    );
    b.position_at_end(c.append_basic_block(destroy, "entry"));
    let arg = destroy
        .get_nth_param(0)
        .ok_or_else(|| LlvmError::Codegen("destroy".into()))?
        .into_pointer_value();
    // NULL, or a context that is not live (destroyed already, another model's): nothing to free.
    return_if(c, &b, b.build_is_null(arg, "null")?, None)?;
    return_if(c, &b, b.build_not(is_live(c, &b, arg, p)?, "dead")?, None)?;
    b.build_store(trailer(c, &b, (arg, MARK_AT), p)?, i64t.const_zero())?;
    b.build_call(free, &[arg.into()], "")?;
    b.build_return(None)?;

    // The messages as one table of C strings.
    let constant = |symbol: String, value: &dyn BasicValue<'c>| private_constant(m, &symbol, value);
    let text = |symbol: String, s: &str| constant(symbol, &c.const_string(s.as_bytes(), true));
    let strings: Vec<_> = messages
        .iter()
        .enumerate()
        .map(|(i, s)| text(format!("mlopt_{name}_message{i}"), s))
        .collect();
    let table_ty = ptr.array_type(strings.len() as u32);
    let table = constant(format!("mlopt_{name}_messages"), &ptr.const_array(&strings));
    let null_ctx = text(format!("mlopt_{name}_null_context"), "the context is NULL");
    let dead_ctx = text(
        format!("mlopt_{name}_dead_context"),
        &format!(
            "not a live context of model {name} (destroyed, or not made by mlopt_{name}_create)"
        ),
    );
    let error = m.add_function(
        &format!("mlopt_{name}_error"),
        ptr.fn_type(&[ptr.into()], false),
        None,
    );
    b.position_at_end(c.append_basic_block(error, "entry"));
    let ctx = error
        .get_nth_param(0)
        .ok_or_else(|| LlvmError::Codegen("error".into()))?
        .into_pointer_value();
    return_if(c, &b, b.build_is_null(ctx, "null")?, Some(&null_ctx))?;
    let dead = b.build_not(is_live(c, &b, ctx, p)?, "dead")?;
    return_if(c, &b, dead, Some(&dead_ctx))?;
    let id = b
        .build_load(i32t, trailer(c, &b, (ctx, STATUS_AT), p)?, "id")?
        .into_int_value();
    // A word the caller overwrote is clamped into the table rather than trusted.
    let id = b.build_int_z_extend(id, i64t, "id")?;
    let last = i64t.const_int(messages.len() as u64 - 1, false);
    let id = b
        .build_select(
            b.build_int_compare(inkwell::IntPredicate::ULE, id, last, "in")?,
            id,
            i64t.const_zero(),
            "id",
        )?
        .into_int_value();
    // SAFETY: id <= the table's last index.
    let at = unsafe { b.build_in_bounds_gep(table_ty, table, &[i64t.const_zero(), id], "at")? };
    let msg = b.build_load(ptr, at, "msg")?;
    b.build_return(Some(&msg))?;
    Ok(())
}

/// Returns `value` (nothing for `None`) from the function being written where `cond` holds, and goes
/// on in a new block where it does not.
fn return_if<'c>(
    c: &'c Context,
    b: &inkwell::builder::Builder<'c>,
    cond: inkwell::values::IntValue<'c>,
    value: Option<&dyn BasicValue<'c>>,
) -> Result<()> {
    let f = b
        .get_insert_block()
        .and_then(|bb| bb.get_parent())
        .ok_or_else(|| LlvmError::Codegen("no function to return from".into()))?;
    let (out, on) = (
        c.append_basic_block(f, "out"),
        c.append_basic_block(f, "on"),
    );
    b.build_conditional_branch(cond, out, on)?;
    b.position_at_end(out);
    b.build_return(value)?;
    b.position_at_end(on);
    Ok(())
}

/// Where the status word (an `i32`) and the mark (`context_magic`, a `u64`) lie in the 64 bytes of
/// status past a context's arena.
const STATUS_AT: u64 = 0;
const MARK_AT: u64 = 8;

/// Byte `offset` of the 64 bytes of status past the arena of the context `ctx`.
fn trailer<'c>(
    c: &'c Context,
    b: &inkwell::builder::Builder<'c>,
    (ctx, offset): (inkwell::values::PointerValue<'c>, u64),
    p: &Program,
) -> Result<inkwell::values::PointerValue<'c>> {
    let at = c
        .i64_type()
        .const_int(p.context_bytes() - 64 + offset, false);
    // SAFETY: the context has 64 bytes of status past the arena (`Program::context_bytes`).
    Ok(unsafe { b.build_in_bounds_gep(c.i8_type(), ctx, &[at], "status")? })
}

/// The word that marks a live context of this model, 8 bytes past the status word: `create` writes it,
/// `destroy` clears it, and `run`, `error` and `destroy` refuse a context without it (a destroyed one,
/// another model's, or a pointer that was never a context), which is cheap to detect where using it
/// would corrupt memory. Per model: FNV-1a of its name, so two models' contexts are not interchangeable.
pub fn context_magic(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"mlopt context ".iter().chain(name.as_bytes()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h | 1
}

/// Whether the context `ctx` holds this model's magic word.
fn is_live<'c>(
    c: &'c Context,
    b: &inkwell::builder::Builder<'c>,
    ctx: inkwell::values::PointerValue<'c>,
    p: &Program,
) -> Result<inkwell::values::IntValue<'c>> {
    let i64t = c.i64_type();
    let word = b.build_load(i64t, trailer(c, b, (ctx, MARK_AT), p)?, "magic")?;
    Ok(b.build_int_compare(
        inkwell::IntPredicate::EQ,
        word.into_int_value(),
        i64t.const_int(context_magic(&p.name), false),
        "live",
    )?)
}

/// The messages of a program's statuses, indexed by the status word: none, the arguments' NULLs (the
/// arrays, then each input and output), out of memory, the AMX refusal, then each check step's.
fn messages(p: &Program, cpu: &CpuTarget) -> Vec<String> {
    let mut m = vec![
        String::new(),
        "the inputs or outputs array is NULL".to_string(),
    ];
    m.extend(
        p.inputs
            .iter()
            .enumerate()
            .map(|(i, io)| format!("input {i} ('{}') is NULL", io.name.escape_default())),
    );
    m.extend(
        p.outputs
            .iter()
            .enumerate()
            .map(|(i, io)| format!("output {i} ('{}') is NULL", io.name.escape_default())),
    );
    m.push("out of memory for a kernel's scratch buffer".into());
    m.push(
        "this model was compiled for AMX, but the kernel refuses the tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed); recompile for another target".into(),
    );
    m.push(format!(
        "this CPU lacks an instruction set the library was compiled for (target {}: {}); recompile for this CPU (--target host) or an older target",
        cpu.name,
        cpu.features.join(",")
    ));
    m.extend(
        p.steps
            .iter()
            .filter_map(|s| s.check.as_ref().map(|c| c.message.clone())),
    );
    m
}

/// The exported counters of a profiled build: `uint64_t mlopt_<name>_profile[steps]`, the nanoseconds
/// each step (kernel call) of the entry point has taken, summed over runs.
pub fn profile_symbol(name: &str) -> String {
    format!("mlopt_{}_profile", c_name(name))
}

/// A profiled build's clock reading (`mlopt_now_ns()`), or nothing in a plain build.
fn clock<'c>(
    b: &inkwell::builder::Builder<'c>,
    now: Option<inkwell::values::FunctionValue<'c>>,
) -> Result<Option<inkwell::values::IntValue<'c>>> {
    let Some(now) = now else { return Ok(None) };
    let v = b
        .build_call(now, &[], "now")?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| LlvmError::Codegen("mlopt_now_ns".into()))?;
    Ok(Some(v.into_int_value()))
}

/// The entry point `mlopt_<name>_run(arena, inputs, outputs)`: the status word cleared, the pointer
/// arrays checked, the thread pool (and AMX's tile state) set up, then each step's kernel called on its
/// arguments (a check step's flag read after it, a profiled build's clock around it), and the context's
/// helpers; `fns` are the kernels' functions by step, `weights` the weights' globals.
pub(crate) fn define_entry<'c>(
    c: &'c Context,
    m: &inkwell::module::Module<'c>,
    p: &Program,
    weights: &[inkwell::values::GlobalValue<'c>],
    fns: &[inkwell::values::FunctionValue<'c>],
    cpu: &CpuTarget,
    (amx, profile): (bool, bool),
) -> Result<()> {
    let threads = cpu.threads;
    let ptr = c.ptr_type(AddressSpace::default());
    let (i64t, i32t) = (c.i64_type(), c.i32_type());
    let run_ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
    let run = m.add_function(&format!("mlopt_{}_run", c_name(&p.name)), run_ty, None);
    // The entry point itself is baseline x86-64: it runs before the check that this CPU has the
    // features the kernels use (a library moved to an older CPU returns a status, not SIGILL).
    for (k, v) in [("target-cpu", "x86-64"), ("target-features", "")] {
        run.add_attribute(
            inkwell::attributes::AttributeLoc::Function,
            c.create_string_attribute(k, v),
        );
    }
    let b = c.create_builder();
    b.position_at_end(c.append_basic_block(run, "entry"));
    let param = |i: u32| {
        run.get_nth_param(i)
            .map(|v| v.into_pointer_value())
            .ok_or_else(|| LlvmError::Codegen("run parameters".into()))
    };
    let (arena, inputs, outputs) = (param(0)?, param(1)?, param(2)?);
    // Every failure stores its message's number in the status word and returns its status.
    let table = messages(p, cpu);
    let (oom_id, amx_id, cpu_id) = (
        2 + p.inputs.len() + p.outputs.len(),
        3 + p.inputs.len() + p.outputs.len(),
        4 + p.inputs.len() + p.outputs.len(),
    );
    let status = trailer(c, &b, (arena, STATUS_AT), p)?;
    let e = Entry {
        c,
        m,
        run,
        b,
        status,
        arena,
        fails: Default::default(),
    };
    e.context_live(p)?;
    e.cpu_supports(&cpu.features.join(","), cpu_id)?;
    e.check_io(p, inputs, outputs)?;
    e.start_runtime(threads, amx.then_some(amx_id))?;
    let counters = profile.then(|| {
        let ty = i64t.array_type(p.steps.len() as u32);
        let g = m.add_global(ty, None, &profile_symbol(&p.name));
        g.set_initializer(&ty.const_zero());
        g.set_alignment(64);
        (ty, g)
    });
    let now = if profile {
        Some(libc(c, m, "mlopt_now_ns")?)
    } else {
        None
    };
    let mut last = clock(&e.b, now)?;
    let mut check_id = cpu_id;
    let pointer = |a: &Place| -> Result<inkwell::values::PointerValue<'c>> {
        Ok(match a {
            Place::Arena(o) => e.in_arena(*o, "a")?,
            Place::Input(i) => e.io_pointer(inputs, *i)?,
            Place::Output(i) => e.io_pointer(outputs, *i)?,
            Place::Weight(i) => weights[*i].as_pointer_value(),
        })
    };
    for (step, s) in p.steps.iter().enumerate() {
        // A guarded call: made when every condition's byte says so, else skipped to `after`.
        let mut after = None;
        if !s.guard.is_empty() {
            let mut holds = c.bool_type().const_all_ones();
            for g in &s.guard {
                let byte = e.b.build_load(c.i8_type(), pointer(&g.place)?, "cond")?;
                let pred = if g.when {
                    inkwell::IntPredicate::NE
                } else {
                    inkwell::IntPredicate::EQ
                };
                let zero = c.i8_type().const_zero();
                let lit =
                    e.b.build_int_compare(pred, byte.into_int_value(), zero, "lit")?;
                holds = e.b.build_and(holds, lit, "guard")?;
            }
            let (call, skip) = (
                c.append_basic_block(run, "guarded"),
                c.append_basic_block(run, "after"),
            );
            e.b.build_conditional_branch(holds, call, skip)?;
            e.b.position_at_end(call);
            after = Some(skip);
        }
        let mut args = Vec::with_capacity(s.args.len());
        for a in &s.args {
            args.push(pointer(a)?.into());
        }
        let r = e.b.build_call(fns[s.kernel], &args, "")?;
        let r = r
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LlvmError::Codegen("kernel status".into()))?
            .into_int_value();
        e.fail_unless(e.is_zero(r)?, oom_id, STATUS_MEMORY, "oom")?;
        if let Some(check) = &s.check {
            check_id += 1;
            let at = e.in_arena(check.flag, "flag")?;
            let flag = e.b.build_load(i32t, at, "flag")?.into_int_value();
            e.fail_unless(e.is_zero(flag)?, check_id, STATUS_DATA, "check")?;
        }
        if let Some(skip) = after {
            e.b.build_unconditional_branch(skip)?;
            e.b.position_at_end(skip);
        }
        if let (Some((ty, g)), Some(before), Some(after)) = (counters, last, clock(&e.b, now)?) {
            e.count(ty, g, step, (before, after))?;
            last = Some(after);
        }
    }
    e.b.build_store(status, i32t.const_zero())?;
    e.b.build_return(Some(&i32t.const_zero()))?;
    define_context(c, m, p, &table)?;
    Ok(())
}

/// The entry point as it is written: its function and builder, and the arena's status word.
struct Entry<'c, 'm> {
    c: &'c Context,
    m: &'m inkwell::module::Module<'c>,
    run: inkwell::values::FunctionValue<'c>,
    b: inkwell::builder::Builder<'c>,
    status: inkwell::values::PointerValue<'c>,
    arena: inkwell::values::PointerValue<'c>,
    /// The block that fails with each (message, status), written once and shared by every check
    /// that ends there (one per kernel call's out-of-memory status).
    fails: std::cell::RefCell<
        std::collections::HashMap<(usize, u64), inkwell::basic_block::BasicBlock<'c>>,
    >,
}

impl<'c> Entry<'c, '_> {
    /// Goes on where `ok` holds; elsewhere stores message `id` in the status word and returns `code`.
    fn fail_unless(
        &self,
        ok: inkwell::values::IntValue<'c>,
        id: usize,
        code: u64,
        what: &str,
    ) -> Result<()> {
        let (c, b, i32t) = (self.c, &self.b, self.c.i32_type());
        let pass = c.append_basic_block(self.run, &format!("{what}.ok"));
        let known = self.fails.borrow().get(&(id, code)).copied();
        let fail = match known {
            Some(fail) => fail,
            None => {
                let fail = c.append_basic_block(self.run, what);
                let b = c.create_builder();
                b.position_at_end(fail);
                b.build_store(self.status, i32t.const_int(id as u64, false))?;
                b.build_return(Some(&i32t.const_int(code, false)))?;
                self.fails.borrow_mut().insert((id, code), fail);
                fail
            }
        };
        b.build_conditional_branch(ok, pass, fail)?;
        b.position_at_end(pass);
        Ok(())
    }

    fn is_zero(&self, v: inkwell::values::IntValue<'c>) -> Result<inkwell::values::IntValue<'c>> {
        let zero = self.c.i32_type().const_zero();
        Ok(self
            .b
            .build_int_compare(inkwell::IntPredicate::EQ, v, zero, "ok")?)
    }

    /// The arena's byte `offset`.
    fn in_arena(&self, offset: u64, name: &str) -> Result<inkwell::values::PointerValue<'c>> {
        let at = [self.c.i64_type().const_int(offset, false)];
        // SAFETY: offsets come from the memory plan, inside the arena the caller allocates.
        Ok(unsafe {
            self.b
                .build_in_bounds_gep(self.c.i8_type(), self.arena, &at, name)?
        })
    }

    /// A NULL context has no status word to write: it returns at once.
    /// Nor has one that is not live (`context_magic`): its status word is not this model's to write.
    fn context_live(&self, p: &Program) -> Result<()> {
        let (c, b) = (self.c, &self.b);
        let argument = c.i32_type().const_int(STATUS_ARGUMENT, false);
        return_if(c, b, b.build_is_null(self.arena, "null")?, Some(&argument))?;
        let dead = b.build_not(is_live(c, b, self.arena, p)?, "dead")?;
        return_if(c, b, dead, Some(&argument))
    }

    /// Each pointer array checked for NULL, then each pointer in it, by a loop: the entry point's size
    /// and the registers it keeps live do not grow with the number of inputs and outputs (a model with
    /// 5,000 outputs made one block and one live value per pointer, and LLVM's register allocator
    /// superlinear in them).
    fn check_io(
        &self,
        p: &Program,
        inputs: inkwell::values::PointerValue<'c>,
        outputs: inkwell::values::PointerValue<'c>,
    ) -> Result<()> {
        let (c, b, ptr, i64t) = (
            self.c,
            &self.b,
            self.c.ptr_type(AddressSpace::default()),
            self.c.i64_type(),
        );
        let arrays = b.build_or(
            b.build_is_null(inputs, "null")?,
            b.build_is_null(outputs, "null")?,
            "null",
        )?;
        self.fail_unless(b.build_not(arrays, "ok")?, 1, STATUS_ARGUMENT, "arrays")?;
        for (base, n, first) in [
            (inputs, p.inputs.len(), 2),
            (outputs, p.outputs.len(), 2 + p.inputs.len()),
        ] {
            if n == 0 {
                continue;
            }
            let pre = b
                .get_insert_block()
                .ok_or_else(|| LlvmError::Codegen("entry block".into()))?;
            let (body, next, fail, done) = (
                c.append_basic_block(self.run, "io"),
                c.append_basic_block(self.run, "io.next"),
                c.append_basic_block(self.run, "io.null"),
                c.append_basic_block(self.run, "io.ok"),
            );
            b.build_unconditional_branch(body)?;
            b.position_at_end(body);
            let i = b.build_phi(i64t, "i")?;
            let v = b.build_load(
                ptr,
                self.element(base, i.as_basic_value().into_int_value())?,
                "p",
            )?;
            b.build_conditional_branch(
                b.build_is_null(v.into_pointer_value(), "null")?,
                fail,
                next,
            )?;
            b.position_at_end(next);
            let i = i.as_basic_value().into_int_value();
            let i1 = b.build_int_add(i, i64t.const_int(1, false), "i")?;
            let more = b.build_int_compare(
                inkwell::IntPredicate::ULT,
                i1,
                i64t.const_int(n as u64, false),
                "more",
            )?;
            b.build_conditional_branch(more, body, done)?;
            let phi = body
                .get_first_instruction()
                .and_then(|v| inkwell::values::PhiValue::try_from(v).ok())
                .ok_or_else(|| LlvmError::Codegen("io loop".into()))?;
            phi.add_incoming(&[(&i64t.const_zero(), pre), (&i1, next)]);
            // The message of pointer i is `first + i`.
            b.position_at_end(fail);
            let id = b.build_int_add(i, i64t.const_int(first as u64, false), "id")?;
            let i32t = c.i32_type();
            b.build_store(self.status, b.build_int_truncate(id, i32t, "id")?)?;
            b.build_return(Some(&i32t.const_int(STATUS_ARGUMENT, false)))?;
            b.position_at_end(done);
        }
        Ok(())
    }

    /// The address of pointer `i` of the array `base`.
    fn element(
        &self,
        base: inkwell::values::PointerValue<'c>,
        i: inkwell::values::IntValue<'c>,
    ) -> Result<inkwell::values::PointerValue<'c>> {
        let ptr = self.c.ptr_type(AddressSpace::default());
        // SAFETY: the caller passes one pointer per input and output (`i` is below their count).
        Ok(unsafe { self.b.build_in_bounds_gep(ptr, base, &[i], "io")? })
    }

    /// Pointer `i` of the array `base`, loaded where a step uses it (checked by `check_io`), so that
    /// it is live only there.
    fn io_pointer(
        &self,
        base: inkwell::values::PointerValue<'c>,
        i: usize,
    ) -> Result<inkwell::values::PointerValue<'c>> {
        let at = self.element(base, self.c.i64_type().const_int(i as u64, false))?;
        let ptr = self.c.ptr_type(AddressSpace::default());
        Ok(self.b.build_load(ptr, at, "p")?.into_pointer_value())
    }

    /// Fails with message `id` (`STATUS_PLATFORM`) unless this CPU has every feature of `features`
    /// (comma-separated, LLVM's spelling), as the runtime's `mlopt_cpu_supports` reads CPUID and XCR0.
    fn cpu_supports(&self, features: &str, id: usize) -> Result<()> {
        let (c, m, b) = (self.c, self.m, &self.b);
        let text = c.const_string(features.as_bytes(), true);
        let g = private_constant(m, "mlopt_cpu_features", &text);
        let null = c.ptr_type(AddressSpace::default()).const_null();
        let r = b.build_call(
            libc(c, m, "mlopt_cpu_supports")?,
            &[g.into(), null.into(), c.i64_type().const_zero().into()],
            "cpu",
        )?;
        let r = r
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LlvmError::Codegen("mlopt_cpu_supports".into()))?
            .into_int_value();
        let ok = b.build_int_compare(
            inkwell::IntPredicate::NE,
            r,
            c.i32_type().const_zero(),
            "has",
        )?;
        self.fail_unless(ok, id, STATUS_PLATFORM, "cpu")
    }

    /// The thread pool of `threads`, and with `amx` (its message) AMX's tile state.
    fn start_runtime(&self, threads: u32, amx: Option<usize>) -> Result<()> {
        let (c, m, b, i32t) = (self.c, self.m, &self.b, self.c.i32_type());
        let init = libc(c, m, "mlopt_init_threads")?;
        b.build_call(init, &[i32t.const_int(threads as u64, false).into()], "")?;
        if let Some(amx_id) = amx {
            // Linux hands out the AMX tile state only on request (once per process).
            let r = b.build_call(libc(c, m, "mlopt_init_amx")?, &[], "amx")?;
            let r = r
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| LlvmError::Codegen("mlopt_init_amx".into()))?
                .into_int_value();
            self.fail_unless(self.is_zero(r)?, amx_id, STATUS_PLATFORM, "amx")?;
        }
        Ok(())
    }

    /// Adds the clock's `after - before` to step `step`'s counter in the profile's array `g`.
    fn count(
        &self,
        ty: inkwell::types::ArrayType<'c>,
        g: inkwell::values::GlobalValue<'c>,
        step: usize,
        (before, after): (inkwell::values::IntValue<'c>, inkwell::values::IntValue<'c>),
    ) -> Result<()> {
        let (b, i64t) = (&self.b, self.c.i64_type());
        let index = [i64t.const_zero(), i64t.const_int(step as u64, false)];
        // SAFETY: `step` < steps, the array's length.
        let at = unsafe { b.build_in_bounds_gep(ty, g.as_pointer_value(), &index, "ctr")? };
        let sum = b.build_load(i64t, at, "sum")?.into_int_value();
        let spent = b.build_int_sub(after, before, "spent")?;
        b.build_store(at, b.build_int_add(sum, spent, "sum")?)?;
        Ok(())
    }
}
