//! A whole program as LLVM modules: the exported entry point
//!
//! ```c
//! int mlopt_<name>_run(void *ctx, const void *const *inputs, void *const *outputs);
//! ```
//!
//! which checks its arguments and calls the kernels in order, stopping with a status at the first failure
//! (a kernel out of scratch memory, a failed data check), with `mlopt_<name>_create`, `_error` and
//! `_destroy` around it; one internal function per distinct kernel, compiled in groups on threads; the
//! weights in an object of their own (`elf.rs`). Then `default<O3>` and an object file per module.

#![allow(unsafe_code)] // GEPs into the arena and the pointer arrays; see codegen.rs.

use crate::codegen::{declare_kernel, define_kernel, libc};
use crate::error::{LlvmError, Result};
pub(crate) use crate::unrolling::Unrolling;
use inkwell::context::Context;
use inkwell::module::Linkage;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::values::{AnyValue, BasicValue};
use inkwell::{AddressSpace, OptimizationLevel};
use mlopt_kir::{Place, Program};
use mlopt_target::{CpuModel, CpuTarget, MatrixUnit};
use std::collections::HashMap;

/// What code generation produces.
#[derive(Debug, Clone)]
pub struct Output {
    /// The module before optimisation, weights elided (stable text, snapshot-tested).
    pub llvm_ir: String,
    /// The module after `default<O3>`.
    pub optimized_ir: String,
    /// The ELF objects: the entry point's, then each group of kernels'.
    pub objects: Vec<Vec<u8>>,
    /// The weights' object (`elf.rs`), in pieces that share the program's weight buffers.
    pub data: crate::elf::DataObject,
}

/// The stack of each code generation thread (address space, committed only as used).
const CODEGEN_STACK: usize = 64 << 20;

/// The program's name as a C identifier.
pub fn c_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'm');
    }
    s
}

/// An empty module named `name` for the target machine `tm` (its triple and data layout).
pub(crate) fn module_for<'c>(
    c: &'c Context,
    name: &str,
    tm: &TargetMachine,
) -> inkwell::module::Module<'c> {
    let m = c.create_module(name);
    m.set_triple(&tm.get_triple());
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    m
}

/// Runs `default<O3>` on `m` for `tm`, with LLVM's loop unrolling or without it (`Unrolling`).
pub(crate) fn optimise(
    m: &inkwell::module::Module,
    tm: &TargetMachine,
    unroll: Unrolling,
) -> Result<()> {
    let options = PassBuilderOptions::create();
    options.set_loop_unrolling(unroll == Unrolling::Llvm);
    m.run_passes("default<O3>", tm, options)
        .map_err(|e| LlvmError::Llvm(e.to_string()))
}

/// `m` written by `tm` as `kind` (an object, or PTX assembly).
pub(crate) fn write(
    m: &inkwell::module::Module,
    tm: &TargetMachine,
    kind: FileType,
) -> Result<Vec<u8>> {
    Ok(tm
        .write_to_memory_buffer(m, kind)
        .map_err(|e| LlvmError::Llvm(e.to_string()))?
        .as_slice()
        .to_vec())
}

/// The x86-64 machine LLVM compiles for `t`: this machine as LLVM detects it (every feature it has,
/// whatever LLVM calls the CPU), or a CPU LLVM knows by name with its default features.
pub(crate) fn machine(t: &CpuTarget) -> Result<TargetMachine> {
    match &t.model {
        CpuModel::Host => x86_machine(
            "x86-64",
            TargetMachine::get_host_cpu_features()
                .to_str()
                .unwrap_or(""),
        ),
        CpuModel::Named(cpu) => x86_machine(cpu, ""),
    }
}

/// An x86-64 machine for LLVM's `cpu` with `features` (LLVM's `+f,-g` spelling).
pub(crate) fn x86_machine(cpu: &str, features: &str) -> Result<TargetMachine> {
    // Once per process: kernel modules are compiled on several threads, and LLVM's target registry is
    // global.
    static X86: std::sync::Once = std::sync::Once::new();
    X86.call_once(|| Target::initialize_x86(&InitializationConfig::default()));
    let triple = TargetTriple::create("x86_64-unknown-linux-gnu");
    let target = Target::from_triple(&triple).map_err(|e| LlvmError::Llvm(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            cpu,
            features,
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| LlvmError::Llvm(format!("no target machine for the x86-64 CPU {cpu}")))
}

/// The module's text with each weight's bytes left out (a ResNet's would be 100 MB of text).
fn print_without_weights(m: &inkwell::module::Module, p: &Program) -> String {
    let mut s = format!("; ModuleID = '{}' (weights elided)\n", p.name);
    for (i, w) in p.weights.iter().enumerate() {
        s.push_str(&format!(
            "; weight {i} ({} bytes, in the weights object): \"{}\": {}{:?}\n",
            w.data.len(),
            w.name.escape_default(),
            w.elem,
            w.dims
        ));
    }
    for f in m.get_functions() {
        s.push('\n');
        s.push_str(&f.print_to_string().to_string());
    }
    s
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
    let (ok, done) = (
        c.append_basic_block(create, "ok"),
        c.append_basic_block(create, "done"),
    );
    b.build_conditional_branch(b.build_is_null(ctx, "null")?, done, ok)?;
    b.position_at_end(ok);
    b.build_store(status_word(c, &b, ctx, p)?, i32t.const_zero())?;
    b.build_unconditional_branch(done)?;
    b.position_at_end(done);
    b.build_return(Some(&ctx))?;

    let destroy = m.add_function(
        &format!("mlopt_{name}_destroy"),
        c.void_type().fn_type(&[ptr.into()], false),
        None,
    );
    b.position_at_end(c.append_basic_block(destroy, "entry"));
    let arg = destroy
        .get_nth_param(0)
        .ok_or_else(|| LlvmError::Codegen("destroy".into()))?;
    b.build_call(free, &[arg.into()], "")?;
    b.build_return(None)?;

    // The messages as one table of C strings.
    let constant = |symbol: String, value: &dyn BasicValue<'c>| {
        let g = m.add_global(value.as_basic_value_enum().get_type(), None, &symbol);
        g.set_initializer(value);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.as_pointer_value()
    };
    let text = |symbol: String, s: &str| constant(symbol, &c.const_string(s.as_bytes(), true));
    let strings: Vec<_> = messages
        .iter()
        .enumerate()
        .map(|(i, s)| text(format!("mlopt_{name}_message{i}"), s))
        .collect();
    let table_ty = ptr.array_type(strings.len() as u32);
    let table = constant(format!("mlopt_{name}_messages"), &ptr.const_array(&strings));
    let null_ctx = text(format!("mlopt_{name}_null_context"), "the context is NULL");
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
    let (some, none) = (
        c.append_basic_block(error, "some"),
        c.append_basic_block(error, "none"),
    );
    b.build_conditional_branch(b.build_is_null(ctx, "null")?, none, some)?;
    b.position_at_end(none);
    b.build_return(Some(&null_ctx))?;
    b.position_at_end(some);
    let id = b
        .build_load(i32t, status_word(c, &b, ctx, p)?, "id")?
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

/// The status word of the context `ctx`: the `i32` just past the arena.
fn status_word<'c>(
    c: &'c Context,
    b: &inkwell::builder::Builder<'c>,
    ctx: inkwell::values::PointerValue<'c>,
    p: &Program,
) -> Result<inkwell::values::PointerValue<'c>> {
    let at = c.i64_type().const_int(p.context_bytes() - 64, false);
    // SAFETY: the context has 64 bytes of status past the arena (`Program::context_bytes`).
    Ok(unsafe { b.build_in_bounds_gep(c.i8_type(), ctx, &[at], "status")? })
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

/// Compiles a program for `t`, whose thread count is the default of its parallel loops.
pub fn compile(p: &Program, t: &CpuTarget) -> Result<Output> {
    compile_with(p, t, false)
}

/// `compile`, and with `profile` the entry point reads a monotonic clock (the runtime's `mlopt_now_ns`)
/// around each step and adds the difference to that step's counter in `profile_symbol(name)`. The plain
/// build has no instrumentation at all.
pub fn compile_with(p: &Program, t: &CpuTarget, profile: bool) -> Result<Output> {
    let c = Context::create();
    let tm = machine(t)?;
    let m = module_for(&c, &p.name, &tm);

    // The weights live in an object of their own, written directly (`elf.rs`); this module declares them.
    let weight_symbol = |i: usize| format!("mlopt_{}_w{i}", c_name(&p.name));
    let weights: Vec<_> = (0..p.weights.len())
        .map(|i| {
            let g = m.add_global(c.i8_type().array_type(0), None, &weight_symbol(i));
            g.set_linkage(Linkage::External);
            g.set_visibility(inkwell::GlobalVisibility::Hidden);
            g.set_constant(true);
            g.set_alignment(64);
            g
        })
        .collect();
    // Without a matrix unit, `mma` blocks become the loops they stand for.
    let kernels: Vec<mlopt_kir::Kernel> = p
        .kernels
        .iter()
        .map(|k| {
            let mut k = k.clone();
            if t.matrix().is_none() {
                mlopt_kir::sched::mma_to_loops(&mut k);
            }
            k
        })
        .collect();
    let amx = t.matrix() == Some(MatrixUnit::Amx)
        && kernels
            .iter()
            .any(|k| mlopt_kir::analysis::has_mma(&k.body));
    // Kernels that differ only in name (a repeated layer: its weights are arguments) share one
    // function, so LLVM compiles each distinct kernel once.
    let mut first: HashMap<String, usize> = HashMap::new();
    let mut sizes = Vec::with_capacity(kernels.len());
    let same: Vec<usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut key = k.clone();
            key.name.clear();
            let text = mlopt_kir::print::kernel(&key);
            sizes.push(text.len());
            *first.entry(text).or_insert(i)
        })
        .collect();
    // Each distinct kernel is compiled in a module of its own group, groups on threads (own LLVM
    // contexts), balanced by kernel size; the entry point's module declares them.
    let symbol = |i: usize| format!("mlopt_{}_{}", c_name(&p.name), kernels[i].name);
    let distinct: Vec<usize> = (0..kernels.len()).filter(|i| same[*i] == *i).collect();
    let jobs = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, distinct.len().max(1));
    let mut groups: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); jobs];
    let mut by_size: Vec<(usize, usize)> = distinct.iter().map(|&i| (sizes[i], i)).collect();
    by_size.sort_by(|a, b| b.cmp(a));
    for (size, i) in by_size {
        if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
            g.0 += size;
            g.1.push(i);
        }
    }
    let compiled: Vec<Result<Vec<KernelModule>>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .filter(|g| !g.1.is_empty())
            .map(|(_, group)| {
                let (kernels, symbol) = (&kernels, &symbol);
                // A stack for the model's work, not the 2 MiB default: LLVM and the code generator
                // recurse over the kernels' expressions (only what is touched is committed).
                std::thread::Builder::new()
                    .stack_size(CODEGEN_STACK)
                    .spawn_scoped(s, move || kernel_module(p, kernels, group, symbol, t))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.map_err(|e| {
                    LlvmError::Codegen(format!("starting a code generation thread: {e}"))
                })?
                .join()
                .unwrap_or_else(|_| {
                    Err(LlvmError::Codegen(
                        "a code generation thread panicked".into(),
                    ))
                })
            })
            .collect()
    });
    let declared: HashMap<usize, _> = distinct
        .iter()
        .map(|&i| (i, declare_kernel(&c, &m, &kernels[i], &symbol(i))))
        .collect();
    let fns: Vec<_> = same.iter().map(|i| declared[i]).collect();
    define_entry(&c, &m, p, &weights, &fns, t, (amx, profile))?;
    m.verify()
        .map_err(|e| LlvmError::Llvm(format!("invalid module: {e}")))?;
    let mut llvm_ir = print_without_weights(&m, p);
    // Every function gets the target's CPU and features, so any later JIT or LTO keeps them.
    optimise(&m, &tm, Unrolling::Llvm)?;
    // (Printed without the weights: a transformer's would make this string gigabytes of hex.)
    let mut optimized_ir = print_without_weights(&m, p);
    let mut objects = vec![write(&m, &tm, FileType::Object)?];
    let named: Vec<(String, std::sync::Arc<Vec<u8>>)> = p
        .weights
        .iter()
        .enumerate()
        .map(|(i, w)| (weight_symbol(i), w.data.clone()))
        .collect();
    let data = crate::elf::data_object(&named);
    // The kernel modules' functions by name, so the dumps do not depend on how kernels were grouped (a
    // helper defined in several groups appears once).
    let (mut before, mut after) = (
        std::collections::BTreeMap::new(),
        std::collections::BTreeMap::new(),
    );
    for r in compiled {
        for km in r? {
            before.extend(km.before);
            after.extend(km.after);
            objects.push(km.object);
        }
    }
    for (text, functions) in [(&mut llvm_ir, before), (&mut optimized_ir, after)] {
        for f in functions.into_values() {
            text.push('\n');
            text.push_str(&f);
        }
    }
    Ok(Output {
        llvm_ir,
        optimized_ir,
        objects,
        data,
    })
}

/// The entry point `mlopt_<name>_run(arena, inputs, outputs)`: the status word cleared, the pointer
/// arrays checked, the thread pool (and AMX's tile state) set up, then each step's kernel called on its
/// arguments (a check step's flag read after it, a profiled build's clock around it), and the context's
/// helpers; `fns` are the kernels' functions by step, `weights` the weights' globals.
fn define_entry<'c>(
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
    let status = status_word(c, &b, arena, p)?;
    let e = Entry {
        c,
        m,
        run,
        b,
        status,
        arena,
    };
    e.context_not_null()?;
    e.cpu_supports(&cpu.features.join(","), cpu_id)?;
    let io = e.io_pointers(p, inputs, outputs)?;
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
    for (step, s) in p.steps.iter().enumerate() {
        let mut args = Vec::with_capacity(s.args.len());
        for a in &s.args {
            let v = match a {
                Place::Arena(o) => e.in_arena(*o, "a")?,
                Place::Input(i) => io[0][*i],
                Place::Output(i) => io[1][*i],
                Place::Weight(i) => weights[*i].as_pointer_value(),
            };
            args.push(v.into());
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
        let (pass, fail) = (
            c.append_basic_block(self.run, &format!("{what}.ok")),
            c.append_basic_block(self.run, what),
        );
        b.build_conditional_branch(ok, pass, fail)?;
        b.position_at_end(fail);
        b.build_store(self.status, i32t.const_int(id as u64, false))?;
        b.build_return(Some(&i32t.const_int(code, false)))?;
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
    fn context_not_null(&self) -> Result<()> {
        let (c, b) = (self.c, &self.b);
        let (pass, fail) = (
            c.append_basic_block(self.run, "ctx.ok"),
            c.append_basic_block(self.run, "ctx.null"),
        );
        b.build_conditional_branch(b.build_is_null(self.arena, "null")?, fail, pass)?;
        b.position_at_end(fail);
        b.build_return(Some(&c.i32_type().const_int(STATUS_ARGUMENT, false)))?;
        b.position_at_end(pass);
        Ok(())
    }

    /// The inputs' and the outputs' pointers, each array and each pointer checked for NULL.
    #[allow(clippy::type_complexity)]
    fn io_pointers(
        &self,
        p: &Program,
        inputs: inkwell::values::PointerValue<'c>,
        outputs: inkwell::values::PointerValue<'c>,
    ) -> Result<Vec<Vec<inkwell::values::PointerValue<'c>>>> {
        let (b, ptr, i64t) = (
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
        let mut io = Vec::new();
        for (base, n, first) in [
            (inputs, p.inputs.len(), 2),
            (outputs, p.outputs.len(), 2 + p.inputs.len()),
        ] {
            let mut ptrs = Vec::with_capacity(n);
            for i in 0..n {
                // SAFETY: the caller passes one pointer per input and output.
                let at = unsafe {
                    b.build_in_bounds_gep(ptr, base, &[i64t.const_int(i as u64, false)], "io")?
                };
                let v = b.build_load(ptr, at, "p")?.into_pointer_value();
                self.fail_unless(
                    b.build_is_not_null(v, "ok")?,
                    first + i,
                    STATUS_ARGUMENT,
                    "io",
                )?;
                ptrs.push(v);
            }
            io.push(ptrs);
        }
        Ok(io)
    }

    /// Fails with message `id` (`STATUS_PLATFORM`) unless this CPU has every feature of `features`
    /// (comma-separated, LLVM's spelling), as the runtime's `mlopt_cpu_supports` reads CPUID and XCR0.
    fn cpu_supports(&self, features: &str, id: usize) -> Result<()> {
        let (c, m, b) = (self.c, self.m, &self.b);
        let text = c.const_string(features.as_bytes(), true);
        let g = m.add_global(text.get_type(), None, "mlopt_cpu_features");
        g.set_initializer(&text);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        let null = c.ptr_type(AddressSpace::default()).const_null();
        let r = b.build_call(
            libc(c, m, "mlopt_cpu_supports")?,
            &[
                g.as_pointer_value().into(),
                null.into(),
                c.i64_type().const_zero().into(),
            ],
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

/// A group of kernels compiled by `kernel_module`: each defined function's text (by name) before and
/// after optimisation, and the object.
struct KernelModule {
    before: Vec<(String, String)>,
    after: Vec<(String, String)>,
    object: Vec<u8>,
}

/// One group of kernels, compiled on one thread in an LLVM context of its own: a module for the
/// kernels LLVM may unroll and one for the rest (`Unrolling`), each defined, optimised by
/// `default<O3>` and written as an object.
fn kernel_module(
    p: &Program,
    kernels: &[mlopt_kir::Kernel],
    group: &[usize],
    symbol: &dyn Fn(usize) -> String,
    t: &CpuTarget,
) -> Result<Vec<KernelModule>> {
    let c = Context::create();
    let tm = machine(t)?;
    let (unrolled, mapped): (Vec<usize>, Vec<usize>) = group
        .iter()
        .copied()
        .partition(|&i| Unrolling::of(&kernels[i]) == Unrolling::Llvm);
    let mut out = Vec::new();
    for (unroll, members) in [(Unrolling::Llvm, unrolled), (Unrolling::Schedule, mapped)] {
        if members.is_empty() {
            continue;
        }
        let m = module_for(&c, &format!("{}.kernels", p.name), &tm);
        for &i in &members {
            let k = &kernels[i];
            let f = declare_kernel(&c, &m, k, &symbol(i));
            define_kernel(&c, &m, k, f, t)
                .map_err(|e| LlvmError::Codegen(format!("kernel @{}: {e}", k.name)))?;
        }
        m.verify()
            .map_err(|e| LlvmError::Llvm(format!("invalid module: {e}")))?;
        let before = defined_functions(&m);
        optimise(&m, &tm, unroll)?;
        out.push(KernelModule {
            before,
            after: defined_functions(&m),
            object: write(&m, &tm, FileType::Object)?,
        });
    }
    Ok(out)
}

/// Each defined function's text, by name: the module printed once and cut at its `define`s. (Printing
/// the functions one at a time set up the module's slot numbering again for each, a fifth of
/// DenseNet-121's compile.)
fn defined_functions(m: &inkwell::module::Module) -> Vec<(String, String)> {
    let text = m.print_to_string().to_string();
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("\ndefine ") {
        let f = &rest[at + 1..];
        let end = f.find("\n}\n").map_or(f.len(), |e| e + 3);
        let name = f
            .split_once('@')
            .and_then(|(_, r)| r.split_once('('))
            .map_or("", |(n, _)| n.trim_matches('"'));
        out.push((name.to_string(), f[..end].to_string()));
        rest = &f[end..];
    }
    out
}
