//! Kernel IR -> LLVM IR for `nvptx64-nvidia-cuda` -> PTX text. Each GPU kernel (`mlopt_kir::gpu`) becomes
//! an entry (`.entry`, the `ptx_kernel` calling convention and an `nvvm.annotations` "kernel" mark) over
//! `.global` pointers, with `.maxntid` set to its block size so the register allocator knows how many
//! threads share a multiprocessor. The code generator is the CPU's (`codegen.rs`) with `Gen::gpu` set: the
//! block loop reads `%ctaid.x`, thread loops `%tid.x`, barriers are `bar.sync 0`, shared buffers are
//! `.shared` arrays (address space 3) and locals are per-thread allocas that SROA turns into registers.
//! Math with no PTX instruction is written out in registers as on the CPU (`transcendental.rs`) or uses
//! PTX's approximate instructions after exact range reduction (log via `lg2.approx`, sin/cos via
//! `sin/cos.approx`).

use crate::codegen::{err, ty, Gen, Ret};
use crate::error::{LlvmError, Result};
use crate::threads::{on_threads, Sharing};
use inkwell::context::Context;
use inkwell::module::Linkage;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::types::{BasicType, FunctionType};
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue};
use inkwell::{AddressSpace, OptimizationLevel};
use mlopt_kir::{Block, Elem, Kernel, Program, Space, UnOp};
use mlopt_target::GpuTarget;
use std::collections::HashMap;

/// What `compile_ptx` makes: the PTX module, the LLVM IR it came from (before optimisation), and what
/// ptxas needs to assemble it on threads.
#[derive(Debug, Clone)]
pub struct PtxOutput {
    pub ptx: String,
    pub llvm_ir: String,
    /// The distinct kernels' code as a few PTX modules (the groups compiled on threads), which together
    /// hold every entry of `ptx` that is not a copy: what ptxas checks, one module per thread.
    pub parts: Vec<String>,
    /// Each kernel's name and the name of the kernel whose code it copies (its own where distinct).
    pub sharing: Vec<(String, String)>,
}

fn machine(t: &GpuTarget) -> Result<TargetMachine> {
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = Target::from_triple(&triple).map_err(|e| LlvmError::Llvm(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            &t.name,
            &format!("+ptx{}", t.ptx),
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| LlvmError::Llvm(format!("no NVPTX target machine for {}", t.name)))
}

/// The name each kernel is compiled under, in a module of its own; its PTX text then takes the
/// kernel's name in its place, so kernels identical but for their names (a repeated layer) compile
/// once. No PTX name has this form (registers are `%r..`, labels `$L..`).
const ENTRY: &str = "mlopt_kernel_entry";

/// Compiles every kernel of a GPU program (each in the form `mlopt_kir::gpu` checks) into one PTX module:
/// each distinct kernel in an LLVM module of its own, on threads (`threads.rs`), and the texts joined
/// under one header in program order.
pub fn compile_ptx(p: &Program, t: &GpuTarget) -> Result<PtxOutput> {
    // Initialises the NVPTX target once, before the threads each make their machine.
    machine(t)?;
    let sharing = Sharing::of(&p.kernels);
    let groups = sharing.groups();
    let compiled = on_threads(&groups, |group| {
        let c = Context::create();
        let tm = machine(t)?;
        group
            .iter()
            .map(|&i| kernel_ptx(&c, &tm, &p.kernels[i]).map(|code| (i, code)))
            .collect::<Result<Vec<_>>>()
    })?;
    let code: HashMap<usize, (String, String)> = compiled.into_iter().flatten().collect();
    let part = |i: usize| -> Result<(&str, &str, &str)> {
        let (ir, ptx) = code
            .get(&sharing.same[i])
            .ok_or_else(|| err(format!("kernel {i} was not compiled")))?;
        let (header, body) = split_header(ptx);
        Ok((header, body, ir))
    };
    let name = |i: usize| p.kernels[i].name.as_str();
    // The header (.version, .target, .address_size) from the first kernel's text, or from an empty
    // module when there is none.
    let header = match p.kernels.is_empty() {
        true => {
            let c = Context::create();
            let tm = machine(t)?;
            let m = crate::program::module_for(&c, &p.name, &tm);
            let buf = crate::program::write(&m, &tm, FileType::Assembly)?;
            String::from_utf8_lossy(&buf)
                .trim_end_matches('\0')
                .to_string()
        }
        false => part(0)?.0.to_string(),
    };
    let (mut ptx, mut llvm_ir) = (header.clone(), String::new());
    for i in 0..p.kernels.len() {
        let (_, body, ir) = part(i)?;
        ptx.push_str(&body.replace(ENTRY, name(i)));
        if sharing.same[i] == i {
            let copies: Vec<&str> = (i + 1..p.kernels.len())
                .filter(|&j| sharing.same[j] == i)
                .map(name)
                .collect();
            if !copies.is_empty() {
                llvm_ir.push_str(&format!(
                    "; the same code as @{}: @{}\n",
                    name(i),
                    copies.join(", @")
                ));
            }
            llvm_ir.push_str(&ir.replace(ENTRY, name(i)));
        }
    }
    let mut parts = Vec::new();
    for group in &groups {
        let mut text = header.clone();
        for &i in group {
            text.push_str(&part(i)?.1.replace(ENTRY, name(i)));
        }
        parts.push(text);
    }
    let sharing = (0..p.kernels.len())
        .map(|i| (name(i).to_string(), name(sharing.same[i]).to_string()))
        .collect();
    Ok(PtxOutput {
        ptx,
        llvm_ir,
        parts,
        sharing,
    })
}

/// One kernel in a module of its own under the name `ENTRY`: its LLVM IR before optimisation, and its
/// PTX text.
fn kernel_ptx(c: &Context, tm: &TargetMachine, k: &Kernel) -> Result<(String, String)> {
    let launch = mlopt_kir::gpu::launch(k).ok_or_else(|| {
        LlvmError::Codegen(format!(
            "kernel @{} is not a GPU kernel (no gpu.block loop)",
            k.name
        ))
    })?;
    let m = crate::program::module_for(c, ENTRY, tm);
    define(c, &m, k, ENTRY, launch.block)
        .map_err(|e| LlvmError::Codegen(format!("kernel @{}: {e}", k.name)))?;
    m.verify()
        .map_err(|e| LlvmError::Llvm(format!("kernel @{}: invalid module: {e}", k.name)))?;
    let llvm_ir = m.print_to_string().to_string();
    crate::program::optimise(&m, tm, crate::program::Unrolling::Llvm)?;
    let buf = crate::program::write(&m, tm, FileType::Assembly)?;
    let ptx = String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string();
    Ok((llvm_ir, ptx))
}

/// A PTX module's header (through its `.address_size` line) and the rest.
fn split_header(ptx: &str) -> (&str, &str) {
    let end = ptx.find(".address_size").map_or(0, |at| {
        ptx[at..].find('\n').map_or(ptx.len(), |e| at + e + 1)
    });
    ptx.split_at(end)
}

/// One kernel entry: parameters are `.global` pointers in the kernel's parameter order.
fn define<'c>(
    c: &'c Context,
    m: &inkwell::module::Module<'c>,
    k: &Kernel,
    name: &str,
    threads: u64,
) -> Ret<FunctionValue<'c>> {
    let global = c.ptr_type(AddressSpace::from(1));
    let params: Vec<inkwell::types::BasicMetadataTypeEnum> =
        k.params().iter().map(|_| global.into()).collect();
    let f = m.add_function(
        name,
        c.void_type().fn_type(&params, false),
        Some(Linkage::External),
    );
    // LLVM's PTX_Kernel calling convention: an `.entry`, not a `.func`.
    f.set_call_conventions(71);
    let i32t = c.i32_type();
    let fp = f.as_global_value().as_pointer_value();
    for (key, value) in [("kernel", 1), ("maxntidx", threads)] {
        let node = c.metadata_node(&[
            fp.into(),
            c.metadata_string(key).into(),
            i32t.const_int(value, false).into(),
        ]);
        m.add_global_metadata("nvvm.annotations", &node)
            .map_err(|e| err(e.to_string()))?;
    }
    let mut g = Gen::new(c, m, k, f);
    g.gpu = true;
    g.builder.position_at_end(c.append_basic_block(f, "entry"));
    g.bind_params()?;
    for (i, buf) in k.bufs.iter().enumerate() {
        if buf.space == Space::Shared {
            let arr = ty(c, buf.elem).array_type(buf.numel().max(1) as u32);
            let gv = m.add_global(
                arr,
                Some(AddressSpace::from(3)),
                &format!("{name}_{}", buf.name),
            );
            gv.set_initializer(&arr.get_undef());
            gv.set_linkage(Linkage::Internal);
            gv.set_alignment(16);
            g.ptrs
                .insert(mlopt_kir::BufId(i as u32), gv.as_pointer_value());
        }
    }
    g.alloc_locals()?;
    g.block(&k.body)?;
    g.builder.build_return(None)?;
    Ok(f)
}

/// The launch table the CUDA launcher (`mlopt-runtime/runtime/mlopt_cuda.c`) reads, the weights as one
/// blob (each weight 256-byte aligned) and the kernel names then the checks' messages, '\0'-terminated.
pub fn launch_table(p: &Program) -> Result<(Vec<u64>, Vec<u8>, Vec<u8>)> {
    let mut blob = Vec::new();
    let mut offsets = Vec::new();
    for w in &p.weights {
        blob.resize(blob.len().div_ceil(256) * 256, 0);
        offsets.push(blob.len() as u64);
        blob.extend_from_slice(&w.data);
    }
    let mut t = vec![
        3,
        p.inputs.len() as u64,
        p.outputs.len() as u64,
        p.arena_bytes,
        blob.len() as u64,
        p.kernels.len() as u64,
        p.steps.len() as u64,
    ];
    t.extend(p.inputs.iter().map(|io| io.bytes() as u64));
    t.extend(p.outputs.iter().map(|io| io.bytes() as u64));
    // Checks so far: a check step's message is the next one.
    let mut checks = 0;
    for s in &p.steps {
        let k = p
            .kernels
            .get(s.kernel)
            .ok_or_else(|| err(format!("step calls kernel {}", s.kernel)))?;
        let l = mlopt_kir::gpu::launch(k)
            .ok_or_else(|| err(format!("kernel @{} is not a GPU kernel", k.name)))?;
        t.extend([
            s.kernel as u64,
            l.grid,
            l.block,
            l.shared_bytes,
            s.args.len() as u64,
        ]);
        let place = |a: &mlopt_kir::Place| match a {
            mlopt_kir::Place::Input(i) => [0, *i as u64],
            mlopt_kir::Place::Output(i) => [1, *i as u64],
            mlopt_kir::Place::Weight(i) => [2, offsets[*i]],
            mlopt_kir::Place::Arena(o) => [3, *o],
        };
        for a in &s.args {
            t.extend(place(a));
        }
        // A check step: 1 + its message's number among the checks (0: none), and the flag's offset.
        t.extend(s.check.as_ref().map_or([0, 0], |c| {
            checks += 1;
            [checks, c.flag]
        }));
        // The guard: its conditions' count, then each condition's place and polarity.
        t.push(s.guard.len() as u64);
        for g in &s.guard {
            t.extend(place(&g.place));
            t.push(g.when as u64);
        }
    }
    // The kernels' names, then the checks' messages, each ending in NUL.
    let mut names = Vec::new();
    for text in p.kernels.iter().map(|k| k.name.as_str()).chain(
        p.steps
            .iter()
            .filter_map(|s| s.check.as_ref().map(|c| c.message.as_str())),
    ) {
        names.extend_from_slice(text.as_bytes());
        names.push(0);
    }
    Ok((t, blob, names))
}

/// The x86-64 object of a GPU library: the PTX, the launch table and the weights as constants, and the
/// model's C API, each function a call into the CUDA launcher:
/// `void *mlopt_<n>_create(int device)`, `int mlopt_<n>_run(ctx, inputs, outputs)` (host buffers; NULLs are an error),
/// `int mlopt_<n>_run_device(ctx, inputs, outputs, stream)` (device buffers, asynchronous),
/// `void mlopt_<n>_destroy(ctx)`, `const char *mlopt_<n>_last_error(void)`.
pub fn host_object(p: &Program, ptx: &str) -> Result<Vec<u8>> {
    let (table, blob, names) = launch_table(p)?;
    let c = Context::create();
    let tm = crate::program::x86_machine("x86-64", "")?;
    let m = crate::program::module_for(&c, &format!("{}_host", p.name), &tm);
    fn constant<'c>(
        m: &inkwell::module::Module<'c>,
        name: &str,
        v: BasicValueEnum<'c>,
    ) -> inkwell::values::PointerValue<'c> {
        let g = m.add_global(v.get_type(), None, name);
        g.set_initializer(&v);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_alignment(64);
        g.as_pointer_value()
    }
    let mut text = ptx.as_bytes().to_vec();
    text.push(0);
    let i64t = c.i64_type();
    let words: Vec<_> = table.iter().map(|w| i64t.const_int(*w, false)).collect();
    let fields = [
        constant(&m, "ptx", c.const_string(&text, false).into()),
        constant(&m, "table", i64t.const_array(&words).into()),
        constant(&m, "weights", c.const_string(&blob, false).into()),
        constant(&m, "names", c.const_string(&names, false).into()),
    ];
    let model = constant(
        &m,
        "model",
        c.const_struct(&fields.map(|f| f.into()), false).into(),
    );
    let ptr = c.ptr_type(AddressSpace::default());
    let i32t = c.i32_type();
    let n = crate::c_name(&p.name);
    let b = c.create_builder();
    // (exported name, launcher function, its type, whether the model is its first argument)
    let api: [(String, &str, FunctionType, bool); 5] = [
        (
            format!("mlopt_{n}_create"),
            "mlopt_gpu_create",
            ptr.fn_type(&[i32t.into()], false),
            true,
        ),
        (
            format!("mlopt_{n}_run"),
            "mlopt_gpu_run",
            i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false),
            false,
        ),
        (
            format!("mlopt_{n}_run_device"),
            "mlopt_gpu_run_device",
            i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into(), ptr.into()], false),
            false,
        ),
        (
            format!("mlopt_{n}_destroy"),
            "mlopt_gpu_destroy",
            c.void_type().fn_type(&[ptr.into()], false),
            false,
        ),
        (
            format!("mlopt_{n}_last_error"),
            "mlopt_gpu_last_error",
            ptr.fn_type(&[], false),
            false,
        ),
    ];
    for (name, target, ft, with_model) in api {
        let f = m.add_function(&name, ft, None);
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> =
            ft.get_param_types().into_iter().collect();
        if with_model {
            params.insert(0, ptr.into());
        }
        let callee_ty = match ft.get_return_type() {
            Some(r) => r.fn_type(&params, false),
            None => c.void_type().fn_type(&params, false),
        };
        let callee = m.add_function(target, callee_ty, None);
        b.position_at_end(c.append_basic_block(f, "entry"));
        let mut args: Vec<inkwell::values::BasicMetadataValueEnum> =
            f.get_param_iter().map(|v| v.into()).collect();
        if with_model {
            args.insert(0, model.into());
        }
        let r = b.build_call(callee, &args, "r")?;
        match r.try_as_basic_value().basic() {
            Some(v) => b.build_return(Some(&v))?,
            None => b.build_return(None)?,
        };
    }
    m.verify()
        .map_err(|e| LlvmError::Llvm(format!("invalid host module: {e}")))?;
    crate::program::write(&m, &tm, FileType::Object)
}

/// A declared NVVM intrinsic or function by name.
pub(crate) fn nvvm<'c>(g: &Gen<'_, 'c>, name: &str, t: FunctionType<'c>) -> FunctionValue<'c> {
    g.module
        .get_function(name)
        .unwrap_or_else(|| g.module.add_function(name, t, None))
}

/// A special register (`tid.x`, `ctaid.x`) as an i64.
pub(crate) fn special<'c>(g: &mut Gen<'_, 'c>, reg: &str) -> Ret<IntValue<'c>> {
    let f = nvvm(
        g,
        &format!("llvm.nvvm.read.ptx.sreg.{reg}"),
        g.ctx.i32_type().fn_type(&[], false),
    );
    let v = g
        .builder
        .build_call(f, &[], reg)?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| err(format!("%{reg}")))?;
    Ok(g.builder
        .build_int_z_extend(v.into_int_value(), g.ctx.i64_type(), reg)?)
}

/// A warp's `mma.sync` (`mlopt_kir::Stmt::WarpMma`) from this thread's side. bf16 and f16 operands are
/// read with `ldmatrix` (A as four 8 x 8 matrices, B as two, transposed) and multiplied by
/// `mma.sync.m16n8k16.row.col`; f32 operands are loaded per element, rounded by `cvt.rna.tf32.f32` and
/// multiplied by `mma.sync.m16n8k8` on tf32. The four accumulators are loaded from and stored back to
/// the local buffer, which SROA keeps in registers.
pub(crate) fn warp_mma<'c>(g: &mut Gen<'_, 'c>, c: &Block, a: &Block, b: &Block) -> Ret<()> {
    let (i32t, i64t, f32t) = (g.ctx.i32_type(), g.ctx.i64_type(), g.ctx.f32_type());
    let t = g.kernel.buffer(a.buf).elem;
    let lane = special(g, "laneid")?;
    let k64 = |v: u64| i64t.const_int(v, false);
    // The flat element index of (r, col) of a block, from its start and the row stride.
    let at =
        |g: &mut Gen<'_, 'c>, x: &Block, r: IntValue<'c>, col: IntValue<'c>| -> Ret<IntValue<'c>> {
            let start = g
                .eval(&mlopt_kir::analysis::flat_index(g.kernel, x.buf, &x.at))?
                .into_int_value();
            let strides = g.kernel.buffer(x.buf).strides();
            let row = g
                .builder
                .build_int_mul(r, k64(strides[strides.len() - 2]), "row")?;
            let off = g.builder.build_int_add(row, col, "off")?;
            Ok(g.builder.build_int_add(start, off, "ix")?)
        };
    let (l16, l4, g8) = (
        g.builder.build_int_unsigned_rem(lane, k64(16), "l16")?,
        g.builder.build_int_unsigned_rem(lane, k64(4), "l4")?,
        g.builder.build_int_unsigned_div(lane, k64(4), "g")?,
    );
    let struct_of =
        |n: usize, e: inkwell::types::BasicTypeEnum<'c>| g.ctx.struct_type(&vec![e; n], false);
    let fields =
        |g: &mut Gen<'_, 'c>, v: BasicValueEnum<'c>, n: u32| -> Ret<Vec<BasicValueEnum<'c>>> {
            (0..n)
                .map(|i| {
                    Ok(g.builder
                        .build_extract_value(v.into_struct_value(), i, "f")?)
                })
                .collect()
        };
    let call = |g: &mut Gen<'_, 'c>,
                name: &str,
                ret: inkwell::types::StructType<'c>,
                args: &[BasicValueEnum<'c>]|
     -> Ret<BasicValueEnum<'c>> {
        let params: Vec<inkwell::types::BasicMetadataTypeEnum> =
            args.iter().map(|x| x.get_type().into()).collect();
        let f = nvvm(g, name, ret.fn_type(&params, false));
        let args: Vec<inkwell::values::BasicMetadataValueEnum> =
            args.iter().map(|x| (*x).into()).collect();
        g.builder
            .build_call(f, &args, name)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| err(name.to_string()))
    };
    let (frag_a, frag_b) = if t == Elem::F32 {
        // tf32: a0 = A[g][l4], a1 = A[g+8][l4], a2 = A[g][l4+4], a3 = A[g+8][l4+4]; b0 = B[l4][g], b1 = B[l4+4][g].
        let g8p = g.builder.build_int_add(g8, k64(8), "g8")?;
        let l4p = g.builder.build_int_add(l4, k64(4), "l4p")?;
        let tf = |g: &mut Gen<'_, 'c>,
                  x: &Block,
                  r: IntValue<'c>,
                  col: IntValue<'c>|
         -> Ret<BasicValueEnum<'c>> {
            let i = at(g, x, r, col)?;
            let p = g.elem_ptr(x.buf, i)?;
            let v = g.builder.build_load(f32t, p, "x")?;
            let f = nvvm(
                g,
                "llvm.nvvm.f2tf32.rna",
                i32t.fn_type(&[f32t.into()], false),
            );
            g.builder
                .build_call(f, &[v.into()], "tf32")?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| err("cvt.rna.tf32"))
        };
        let fa = vec![
            tf(g, a, g8, l4)?,
            tf(g, a, g8p, l4)?,
            tf(g, a, g8, l4p)?,
            tf(g, a, g8p, l4p)?,
        ];
        let fb = vec![tf(g, b, l4, g8)?, tf(g, b, l4p, g8)?];
        (fa, fb)
    } else {
        // ldmatrix: lane l gives the address of row l % 16 (A: at column 8 (l / 16)) of the matrices.
        let col = g.builder.build_int_mul(
            g.builder.build_int_unsigned_div(lane, k64(16), "hi")?,
            k64(8),
            "col",
        )?;
        let ia = at(g, a, l16, col)?;
        let pa = g.elem_ptr(a.buf, ia)?;
        let fa = call(
            g,
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3",
            struct_of(4, i32t.into()),
            &[pa.into()],
        )?;
        let ib = at(g, b, l16, k64(0))?;
        let pb = g.elem_ptr(b.buf, ib)?;
        let fb = call(
            g,
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x2.trans.b16.p3",
            struct_of(2, i32t.into()),
            &[pb.into()],
        )?;
        let (mut fa, mut fb) = (fields(g, fa, 4)?, fields(g, fb, 2)?);
        if t == Elem::F16 {
            // The f16 mma takes pairs as <2 x half>.
            let h2 = g.ctx.f16_type().vec_type(2);
            for x in fa.iter_mut().chain(fb.iter_mut()) {
                *x = g.builder.build_bit_cast(*x, h2, "h2")?;
            }
        }
        (fa, fb)
    };
    let mut acc = Vec::new();
    let mut acc_ptrs = Vec::new();
    for q in 0..4u64 {
        let i = at(g, c, k64(0), k64(q))?;
        let p = g.elem_ptr(c.buf, i)?;
        acc.push(g.builder.build_load(f32t, p, "c")?);
        acc_ptrs.push(p);
    }
    let name = match t {
        Elem::F32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
        Elem::BF16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
        Elem::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
        _ => return Err(err(format!("@{}: mma.sync on {t}", g.kernel.name))),
    };
    let args: Vec<BasicValueEnum<'c>> = frag_a.into_iter().chain(frag_b).chain(acc).collect();
    let d = call(g, name, struct_of(4, f32t.into()), &args)?;
    for (q, p) in fields(g, d, 4)?.into_iter().zip(acc_ptrs) {
        g.builder.build_store(p, q)?;
    }
    Ok(())
}

/// A thread's `cp.async` (`mlopt_kir::Stmt::CopyAsync`): 16-byte copies bypass L1 (`.cg`), smaller
/// ones go through it (`.ca`, the only form for 4 and 8 bytes). A copy with a validity test uses the
/// zero-fill form: a source size of 0 where the test fails, with the source address moved to the
/// buffer's start so that it stays a valid pointer.
pub(crate) fn copy_async<'c>(
    g: &mut Gen<'_, 'c>,
    dst: &Block,
    src: mlopt_kir::BufId,
    from: &mlopt_kir::Expr,
    lanes: u64,
    valid: Option<&mlopt_kir::Expr>,
) -> Ret<()> {
    let bytes = lanes * g.kernel.buffer(dst.buf).elem.size();
    let (i32t, i64t, void) = (g.ctx.i32_type(), g.ctx.i64_type(), g.ctx.void_type());
    let d = g
        .eval(&mlopt_kir::analysis::flat_index(g.kernel, dst.buf, &dst.at))?
        .into_int_value();
    let pd = g.elem_ptr(dst.buf, d)?;
    let mut s = g.eval(from)?.into_int_value();
    let kind = if bytes == 16 { "cg" } else { "ca" };
    let mut name = format!("llvm.nvvm.cp.async.{kind}.shared.global.{bytes}");
    let mut size = None;
    if let Some(c) = valid {
        let ok = g.eval(c)?.into_int_value();
        s = g
            .builder
            .build_select(ok, s, i64t.const_zero(), "src")?
            .into_int_value();
        size = Some(
            g.builder
                .build_select(ok, i32t.const_int(bytes, false), i32t.const_zero(), "size")?
                .into_int_value(),
        );
        name.push_str(".s");
    }
    let ps = g.elem_ptr(src, s)?;
    let mut args: Vec<BasicValueEnum<'c>> = vec![pd.into(), ps.into()];
    args.extend(size.map(BasicValueEnum::from));
    let params: Vec<inkwell::types::BasicMetadataTypeEnum> =
        args.iter().map(|x| x.get_type().into()).collect();
    let args: Vec<inkwell::values::BasicMetadataValueEnum> =
        args.iter().map(|x| (*x).into()).collect();
    let f = nvvm(g, &name, void.fn_type(&params, false));
    g.builder.build_call(f, &args, "")?;
    Ok(())
}

/// A warp reduction (`mlopt_kir::Stmt::WarpReduce`) of this thread's local scalar: five
/// `shfl.sync.bfly` steps over the full warp, each combining the value with the one `d` lanes across.
pub(crate) fn warp_reduce<'c>(
    g: &mut Gen<'_, 'c>,
    buf: mlopt_kir::BufId,
    op: mlopt_kir::BinOp,
) -> Ret<()> {
    let t = g.kernel.buffer(buf).elem;
    let i32t = g.ctx.i32_type();
    let vt = ty(g.ctx, t);
    let p = g.elem_ptr(buf, g.ctx.i64_type().const_zero())?;
    let mut x = g.builder.build_load(vt, p, "x")?;
    let name = if t == Elem::F32 {
        "llvm.nvvm.shfl.sync.bfly.f32"
    } else {
        "llvm.nvvm.shfl.sync.bfly.i32"
    };
    let f = nvvm(
        g,
        name,
        vt.fn_type(&[i32t.into(), vt.into(), i32t.into(), i32t.into()], false),
    );
    for d in [16u64, 8, 4, 2, 1] {
        let args = [
            i32t.const_all_ones().into(),
            x.into(),
            i32t.const_int(d, false).into(),
            i32t.const_int(31, false).into(),
        ];
        let y = g
            .builder
            .build_call(f, &args, "shfl")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| err("shfl.sync"))?;
        x = crate::math::binary(g, op, x, y, t)?;
    }
    g.builder.build_store(p, x)?;
    Ok(())
}

fn call1<'c>(g: &mut Gen<'_, 'c>, name: &str, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let f32t = g.ctx.f32_type();
    let f = nvvm(g, name, f32t.fn_type(&[f32t.into()], false));
    g.builder
        .build_call(f, &[x.into()], name)?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| err(name.to_string()))
}

/// Math that differs on the GPU: Some(value) when done here, None for the common code (`math.rs`), an
/// error for functions with no NVPTX implementation yet.
pub(crate) fn unary<'c>(
    g: &mut Gen<'_, 'c>,
    o: UnOp,
    x: BasicValueEnum<'c>,
    t: Elem,
) -> Ret<Option<BasicValueEnum<'c>>> {
    match (o, t) {
        (UnOp::Exp | UnOp::Tanh | UnOp::Erf | UnOp::Asin | UnOp::Acos | UnOp::Atan, Elem::F32)
        | (UnOp::Exp | UnOp::Log, Elem::F64) => Ok(None),
        (
            UnOp::Neg | UnOp::Abs | UnOp::Sqrt | UnOp::Floor | UnOp::Ceil | UnOp::Round | UnOp::Not,
            _,
        ) => Ok(None),
        // The approximate instructions are scalar: a vector loop's value goes lane by lane.
        (UnOp::Log | UnOp::Sin | UnOp::Cos, Elem::F32) => {
            Ok(Some(crate::math::per_lane(g, x, &mut |g, x| {
                approx(g, o, x)
            })?))
        }
        _ => Err(err(format!(
            "@{}: {} of {t} has no NVPTX implementation yet",
            g.kernel.name,
            mlopt_kir::print::unop_name(o)
        ))),
    }
}

/// f32 log, sin or cos of a scalar by PTX's approximate instructions.
fn approx<'c>(g: &mut Gen<'_, 'c>, o: UnOp, x: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    let f32t = g.ctx.f32_type();
    let k = |v: f64| f32t.const_float(v);
    if o == UnOp::Log {
        // ln x = log2 x * ln 2; lg2.approx has a relative error of 2^-22.
        let l = call1(g, "llvm.nvvm.lg2.approx.f", x)?;
        return Ok(g
            .builder
            .build_float_mul(l.into_float_value(), k(std::f64::consts::LN_2), "ln")?
            .into());
    }
    // sin/cos.approx are accurate to 2^-20.9 on [-pi, pi]: reduce x by 2 pi first (Cody-Waite, the
    // constant split in two so k * 2pi_hi is exact).
    let x = x.into_float_value();
    let q = g
        .builder
        .build_float_mul(x, k(1.0 / std::f64::consts::TAU), "q")?;
    let q = g
        .intrinsic("llvm.roundeven", &[q.into()])?
        .into_float_value();
    let nq = g.builder.build_float_neg(q, "nq")?;
    let hi = f64::from(std::f64::consts::TAU as f32);
    let lo = std::f64::consts::TAU - hi;
    let r = g.intrinsic("llvm.fma", &[nq.into(), k(hi).into(), x.into()])?;
    let r = g.intrinsic("llvm.fma", &[nq.into(), k(lo).into(), r])?;
    call1(
        g,
        if o == UnOp::Sin {
            "llvm.nvvm.sin.approx.f"
        } else {
            "llvm.nvvm.cos.approx.f"
        },
        r,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_versions_print_as_ptxas_reads_them() {
        assert_eq!(mlopt_target::gpu::sm_80().ptx_version(), "7.0");
        assert_eq!(mlopt_target::gpu::sm_90().ptx_version(), "7.8");
    }

    /// A program of no kernels is still a module the driver loads: the header alone.
    #[test]
    fn an_empty_program_is_a_header() {
        let p = Program {
            name: "empty".into(),
            ..Program::default()
        };
        let out = compile_ptx(&p, &mlopt_target::gpu::sm_90()).unwrap();
        assert!(out.ptx.contains(".version 7.8") && out.ptx.contains(".target sm_90"));
        assert!(!out.ptx.contains(".entry") && out.parts.is_empty() && out.sharing.is_empty());
    }

    #[test]
    fn a_shared_memory_kernel_becomes_an_entry() {
        let k = mlopt_kir::parse_kernel(
            "kernel @rotate(%x: f32[64], %y: f32[64]) {
  shared %s: f32[64]
  gpu.block.x %b in 0..1 {
    gpu.thread.x %t in 0..64 {
      %s[%t] = exp(%x[%t])
    }
    barrier
    gpu.thread.x %u in 0..64 {
      %y[%u] = %s[((%u + 1) % 64)]
    }
  }
}
",
        )
        .unwrap();
        let p = Program {
            name: "m".into(),
            kernels: vec![k],
            ..Program::default()
        };
        let out = compile_ptx(&p, &mlopt_target::gpu::sm_80()).unwrap();
        for want in [
            ".version 7.0",
            ".target sm_80",
            ".entry rotate",
            ".maxntid 64, 1, 1",
            "bar.sync",
            ".shared",
            "ld.global",
            "st.shared",
        ] {
            assert!(out.ptx.contains(want), "{want} missing:\n{}", out.ptx);
        }
    }
}
