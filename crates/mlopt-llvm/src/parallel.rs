//! Parallel loops: the loop's body is outlined into `void <kernel>.par<N>(ptr ctx, i64 begin, i64 end)`,
//! which runs iterations begin..end; the kernel packs every buffer pointer and every enclosing loop
//! variable into `ctx` and calls the runtime's `mlopt_parallel_for(fn, ctx, extent, threads)`, which splits
//! 0..extent into one contiguous range per thread. Local buffers the loop's iterations own are allocated
//! inside the outlined function, so each thread has its own accumulators: on its stack up to the stack
//! budget, larger ones (a packed panel, a padded image when the loop runs over images) in its scratch
//! (`locals.rs`). A thread that cannot get its scratch sets a flag in `ctx`, and the code after the loop
//! reports the failure as its own.

#![allow(unsafe_code)] // GEPs into the context array; see codegen.rs.

use crate::codegen::{Gen, OutOfMemory, Ret, VarVal};
use crate::error::LlvmError;
use inkwell::module::Linkage;
use inkwell::AddressSpace;
use mlopt_kir::{BufId, LoopKind, Stmt, Var};

pub fn parallel_loop<'c>(g: &mut Gen<'_, 'c>, var: Var, extent: u64, body: &[Stmt]) -> Ret<()> {
    let (c, m) = (g.ctx, g.module);
    let ptr = c.ptr_type(AddressSpace::default());
    let i64t = c.i64_type();
    // What the body sees: buffer pointers (locals used only inside are re-made per thread) and variables.
    let private: Vec<BufId> = mlopt_kir::analysis::private_locals(g.kernel, body);
    // (In id order: the maps' own order differs per process, and so did the code built.)
    let mut bufs: Vec<(BufId, inkwell::values::PointerValue<'c>)> = g
        .ptrs
        .iter()
        .filter(|(b, _)| !private.contains(b))
        .map(|(b, p)| (*b, *p))
        .collect();
    bufs.sort_by_key(|(b, _)| b.0);
    let mut vars: Vec<(Var, inkwell::values::IntValue<'c>)> = g
        .vars
        .iter()
        .filter_map(|(v, x)| match x {
            VarVal::Scalar(i) => Some((*v, *i)),
            VarVal::Lanes(_) => None,
        })
        .collect();
    vars.sort_by_key(|(v, _)| v.0);
    // A flag slot after them where a thread may fail to get its scratch: a local off the stack, or a
    // loop inside.
    let private_bufs: Vec<&mlopt_kir::Buffer> =
        private.iter().map(|b| g.kernel.buffer(*b)).collect();
    let scratch = crate::locals::on_stack(&private_bufs).contains(&false);
    let flag_slot = (scratch || has_parallel(body)).then_some(bufs.len() + vars.len());
    let slots = (bufs.len() + vars.len() + usize::from(flag_slot.is_some())).max(1) as u64;
    let ctx = g
        .builder
        .build_array_alloca(i64t, i64t.const_int(slots, false), "ctx")?;
    // Slot `s` of a context array: the buffers, then the variables, then the flag.
    let slot_at = |b: &inkwell::builder::Builder<'c>, base, s: usize| {
        // SAFETY: every slot asked for is < slots.
        unsafe { b.build_in_bounds_gep(i64t, base, &[i64t.const_int(s as u64, false)], "slot") }
    };
    if let Some(s) = flag_slot {
        g.builder
            .build_store(slot_at(&g.builder, ctx, s)?, i64t.const_zero())?;
    }
    for (s, (_, p)) in bufs.iter().enumerate() {
        g.builder.build_store(slot_at(&g.builder, ctx, s)?, *p)?;
    }
    for (s, (_, v)) in vars.iter().enumerate() {
        g.builder
            .build_store(slot_at(&g.builder, ctx, bufs.len() + s)?, *v)?;
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
        h.i16_dot = g.i16_dot;
        h.bf16_convert = g.bf16_convert;
        h.avx512 = g.avx512;
        h.avx = g.avx;
        h.depth = g.depth + 1;
        let entry = c.append_basic_block(f, "entry");
        h.builder.position_at_end(entry);
        let p = f
            .get_nth_param(0)
            .ok_or_else(|| LlvmError::Codegen("ctx".into()))?
            .into_pointer_value();
        for (s, (b, _)) in bufs.iter().enumerate() {
            let at = slot_at(&h.builder, p, s)?;
            let v = h
                .builder
                .build_load(ptr, at, &g.kernel.buffer(*b).name)?
                .into_pointer_value();
            h.ptrs.insert(*b, v);
        }
        for (s, (v, _)) in vars.iter().enumerate() {
            let at = slot_at(&h.builder, p, bufs.len() + s)?;
            let x = h
                .builder
                .build_load(i64t, at, g.kernel.var_name(*v))?
                .into_int_value();
            h.vars.insert(*v, VarVal::Scalar(x));
        }
        if let Some(s) = flag_slot {
            h.on_out_of_memory = OutOfMemory::Flag(slot_at(&h.builder, p, s)?);
        }
        h.allocate(&private)?;
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
    if let Some(s) = flag_slot {
        let flag = g
            .builder
            .build_load(i64t, slot_at(&g.builder, ctx, s)?, "oom")?;
        let failed = g.builder.build_int_compare(
            inkwell::IntPredicate::NE,
            flag.into_int_value(),
            i64t.const_zero(),
            "failed",
        )?;
        let (oom, after) = (g.out_of_memory()?, c.append_basic_block(g.func, "after"));
        g.builder.build_conditional_branch(failed, oom, after)?;
        g.builder.position_at_end(after);
    }
    Ok(())
}

/// Whether `body` holds a parallel loop.
fn has_parallel(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::For {
            kind: LoopKind::Parallel,
            ..
        } => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => has_parallel(body),
        _ => false,
    })
}
