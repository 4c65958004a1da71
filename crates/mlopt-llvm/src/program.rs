//! A whole program as LLVM modules: the exported entry point
//!
//! ```c
//! int mlopt_<name>_run(void *ctx, const void *const *inputs, void *const *outputs);
//! ```
//!
//! which checks its arguments and calls the kernels in order, stopping with a status at the first failure
//! (a kernel out of scratch memory, a failed data check), with `mlopt_<name>_create`, `_error` and
//! `_destroy` around it (`entry.rs`); one internal function per distinct kernel, compiled in groups on
//! threads; the weights in an object of their own (`elf.rs`). Then `default<O3>` and an object file per
//! module.

use crate::entry::define_entry;
use crate::error::{LlvmError, Result};
use crate::kernel_fn::{declare_kernel, define_kernel};
use crate::threads::{on_threads, Sharing};
pub(crate) use crate::unrolling::Unrolling;
use inkwell::context::Context;
use inkwell::module::Linkage;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::values::AnyValue;
use inkwell::OptimizationLevel;
use mlopt_kir::Program;
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
    /// The weights by symbol (what `data` holds), for a library of several programs to store once
    /// (`elf::data_object` of all of them shares equal bytes).
    pub weights: Vec<(String, std::sync::Arc<Vec<u8>>)>,
}

/// The longest library name, in bytes: its files (`lib<name>.a`, `<name>.optimized.gir`) stay within
/// the 255 bytes file systems take, and its symbols and macros within what any linker keeps apart.
pub const NAME_MAX: usize = 128;

/// `name` as a library's name, a C identifier: each character that is not an ASCII letter, digit or `_`
/// becomes `_`, a leading digit gets an `m` before it, nothing becomes `model`, and at most `NAME_MAX`
/// bytes are kept. The same name is used for the files, the symbols, the header guard and the macros.
/// Idempotent: a name that is already one is returned as it is.
pub fn c_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(NAME_MAX)
        .collect();
    if s.is_empty() {
        s.push_str("model");
    } else if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'm');
        s.truncate(NAME_MAX);
    }
    s
}

/// Whether `name` may be given as a library's name as it is (`--name`): what `c_name` keeps unchanged.
pub fn is_c_name(name: &str) -> bool {
    c_name(name) == name
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
    // `mma` blocks no unit of this CPU runs become the loops they stand for.
    let keep: Vec<mlopt_kir::Elem> = [
        (t.matrix().is_some(), mlopt_kir::Elem::BF16),
        (t.i16_dot().is_some(), mlopt_kir::Elem::I16),
    ]
    .into_iter()
    .filter_map(|(runs, e)| runs.then_some(e))
    .collect();
    let kernels: Vec<mlopt_kir::Kernel> = p
        .kernels
        .iter()
        .map(|k| {
            let mut k = k.clone();
            mlopt_kir::sched::mma_to_loops(&mut k, &keep);
            k
        })
        .collect();
    let amx = t.matrix() == Some(MatrixUnit::Amx)
        && kernels
            .iter()
            .any(|k| mlopt_kir::analysis::has_mma(&k.body));
    // Kernels that differ only in name share one function, and the distinct ones are compiled in
    // groups on threads (`threads.rs`); the entry point's module declares them.
    let symbol = |i: usize| format!("mlopt_{}_{}", c_name(&p.name), kernels[i].name);
    let sharing = Sharing::of(&kernels);
    let distinct = sharing.distinct();
    let compiled = on_threads(&sharing.groups(), |group| {
        kernel_module(p, &kernels, group, &symbol, t)
    })?;
    let declared: HashMap<usize, _> = distinct
        .iter()
        .map(|&i| (i, declare_kernel(&c, &m, &kernels[i], &symbol(i))))
        .collect();
    let fns: Vec<_> = sharing.same.iter().map(|i| declared[i]).collect();
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
    let weights = named;
    // The kernel modules' functions by name, so the dumps do not depend on how kernels were grouped (a
    // helper defined in several groups appears once).
    let (mut before, mut after) = (
        std::collections::BTreeMap::new(),
        std::collections::BTreeMap::new(),
    );
    for r in compiled {
        for km in r {
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
        weights,
    })
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
