//! A kernel's LLVM function: its declaration (one pointer per parameter, a status returned) and its body,
//! emitted by `Gen` for a CPU target.

use crate::codegen::{Gen, Ret};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FunctionValue;
use inkwell::AddressSpace;
use mlopt_kir::Kernel;

/// Declares `int symbol(ptr, ptr, ...)` with one pointer per kernel parameter, which returns 0, or 1 when
/// its scratch could not be had: a hidden symbol, so the module that calls it may be
/// another (kernels are compiled in modules of their own, on threads) while no kernel is exported from a
/// shared library.
pub fn declare_kernel<'c>(
    c: &'c Context,
    m: &Module<'c>,
    k: &Kernel,
    symbol: &str,
) -> FunctionValue<'c> {
    let p = c.ptr_type(AddressSpace::default());
    let params: Vec<inkwell::types::BasicMetadataTypeEnum> =
        k.params().iter().map(|_| p.into()).collect();
    let f = m.add_function(
        symbol,
        c.i32_type().fn_type(&params, false),
        Some(inkwell::module::Linkage::External),
    );
    f.as_global_value()
        .set_visibility(inkwell::GlobalVisibility::Hidden);
    f
}

/// Emits a kernel's body into its declared function.
pub fn define_kernel<'c>(
    c: &'c Context,
    m: &Module<'c>,
    k: &Kernel,
    f: FunctionValue<'c>,
    t: &mlopt_target::CpuTarget,
) -> Ret<()> {
    let mut g = Gen::new(c, m, k, f);
    g.matrix = t.matrix();
    g.i16_dot = t.i16_dot();
    g.bf16_convert = t.has("avx512bf16");
    g.avx512 = t.has("avx512f");
    g.avx = t.has("avx");
    let entry = c.append_basic_block(f, "entry");
    g.builder.position_at_end(entry);
    g.bind_params()?;
    // Out of memory (here or in a parallel loop's thread): free what was allocated and return 1.
    g.alloc_locals()?;
    g.block(&k.body)?;
    g.builder.build_return(Some(&c.i32_type().const_zero()))?;
    Ok(())
}
