//! Parallel loops: the loop's body is outlined into `void <kernel>.par<N>(ptr ctx, i64 begin, i64 end)`,
//! which runs iterations begin..end; the kernel packs every buffer pointer and every enclosing loop
//! variable into `ctx` and calls the runtime's `mlopt_parallel_for(fn, ctx, extent, threads)`, which splits
//! 0..extent into one contiguous range per thread. Local buffers used only inside the loop are allocated
//! inside the outlined function, so each thread has its own accumulators.

#![allow(unsafe_code)] // GEPs into the context array; see codegen.rs.

use crate::codegen::{Gen, Ret, VarVal};
use crate::error::LlvmError;
use inkwell::module::Linkage;
use inkwell::AddressSpace;
use mlopt_kir::{BufId, Stmt, Var};

pub fn parallel_loop<'c>(g: &mut Gen<'_, 'c>, var: Var, extent: u64, body: &[Stmt]) -> Ret<()> {
    let (c, m) = (g.ctx, g.module);
    let ptr = c.ptr_type(AddressSpace::default());
    let i64t = c.i64_type();
    // What the body sees: buffer pointers (locals used only inside are re-made per thread) and variables.
    let private: Vec<BufId> = mlopt_kir::analysis::private_locals(g.kernel, body);
    let bufs: Vec<(BufId, inkwell::values::PointerValue<'c>)> = g
        .ptrs
        .iter()
        .filter(|(b, _)| !private.contains(b))
        .map(|(b, p)| (*b, *p))
        .collect();
    let vars: Vec<(Var, inkwell::values::IntValue<'c>)> = g
        .vars
        .iter()
        .filter_map(|(v, x)| match x {
            VarVal::Scalar(i) => Some((*v, *i)),
            VarVal::Lanes(_) => None,
        })
        .collect();
    let slots = (bufs.len() + vars.len()).max(1) as u64;
    let ctx = g
        .builder
        .build_array_alloca(i64t, i64t.const_int(slots, false), "ctx")?;
    for (s, (_, p)) in bufs.iter().enumerate() {
        // SAFETY: s < slots.
        let at = unsafe {
            g.builder
                .build_in_bounds_gep(i64t, ctx, &[i64t.const_int(s as u64, false)], "slot")?
        };
        g.builder.build_store(at, *p)?;
    }
    for (s, (_, v)) in vars.iter().enumerate() {
        // SAFETY: bufs.len() + s < slots.
        let at = unsafe {
            g.builder.build_in_bounds_gep(
                i64t,
                ctx,
                &[i64t.const_int((bufs.len() + s) as u64, false)],
                "slot",
            )?
        };
        g.builder.build_store(at, *v)?;
    }

    let n = m
        .get_functions()
        .filter(|f| {
            f.get_name()
                .to_bytes()
                .starts_with(format!("{}.par", g.kernel.name).as_bytes())
        })
        .count();
    let fty = c
        .void_type()
        .fn_type(&[ptr.into(), i64t.into(), i64t.into()], false);
    let f = m.add_function(
        &format!("{}.par{n}", g.kernel.name),
        fty,
        Some(Linkage::Internal),
    );
    {
        let mut h = Gen::new(c, m, g.kernel, f);
        h.matrix = g.matrix;
        let entry = c.append_basic_block(f, "entry");
        h.builder.position_at_end(entry);
        let p = f
            .get_nth_param(0)
            .ok_or_else(|| LlvmError::Codegen("ctx".into()))?
            .into_pointer_value();
        for (s, (b, _)) in bufs.iter().enumerate() {
            // SAFETY: s < slots.
            let at = unsafe {
                h.builder.build_in_bounds_gep(
                    i64t,
                    p,
                    &[i64t.const_int(s as u64, false)],
                    "slot",
                )?
            };
            let v = h
                .builder
                .build_load(ptr, at, &g.kernel.buffer(*b).name)?
                .into_pointer_value();
            h.ptrs.insert(*b, v);
        }
        for (s, (v, _)) in vars.iter().enumerate() {
            // SAFETY: bufs.len() + s < slots.
            let at = unsafe {
                h.builder.build_in_bounds_gep(
                    i64t,
                    p,
                    &[i64t.const_int((bufs.len() + s) as u64, false)],
                    "slot",
                )?
            };
            let x = h
                .builder
                .build_load(i64t, at, g.kernel.var_name(*v))?
                .into_int_value();
            h.vars.insert(*v, VarVal::Scalar(x));
        }
        for b in &private {
            let buf = g.kernel.buffer(*b);
            let t = crate::codegen::ty(c, buf.elem);
            let a = h.builder.build_array_alloca(
                t,
                i64t.const_int(buf.numel().max(1), false),
                &buf.name,
            )?;
            h.ptrs.insert(*b, a);
        }
        let begin = f
            .get_nth_param(1)
            .ok_or_else(|| LlvmError::Codegen("begin".into()))?
            .into_int_value();
        let end = f
            .get_nth_param(2)
            .ok_or_else(|| LlvmError::Codegen("end".into()))?
            .into_int_value();
        let name = g.kernel.var_name(var).replace('.', "_");
        h.counted(&name, begin, end, 1, &mut |h, i| {
            h.vars.insert(var, VarVal::Scalar(i));
            h.block(body)
        })?;
        h.builder.build_return(None)?;
    }
    let rt = crate::codegen::libc(c, m, "mlopt_parallel_for")?;
    let fp = f.as_global_value().as_pointer_value();
    g.builder.build_call(
        rt,
        &[fp.into(), ctx.into(), i64t.const_int(extent, false).into()],
        "",
    )?;
    Ok(())
}
