//! The entry points of a dynamic-batch library: the model compiled at several batch sizes (variants,
//! each a program with its own `mlopt_<name>_b<k>_*` functions) behind one C API,
//! `mlopt_<name>_create/run/error/destroy`, whose `run` takes the batch size. The work is the runtime's
//! (`mlopt_batched_*` in mlopt_runtime.c: a run of n items is the largest variant that fits what is
//! left, repeated); this object holds the table it reads and four functions that pass it along.

use crate::error::{LlvmError, Result};
use crate::program::{c_name, machine, module_for, write};
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::targets::FileType;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FunctionValue, PointerValue};
use inkwell::AddressSpace;
use mlopt_target::CpuTarget;

/// What the table says of a dynamic-batch library.
#[derive(Debug, Clone)]
pub struct BatchPlan {
    /// The library's name (a C identifier).
    pub name: String,
    /// Each variant's program name and batch size, largest first; the last is 1.
    pub variants: Vec<(String, u64)>,
    /// The most items one run takes.
    pub max_batch: u64,
    /// The bytes of one item of each input (0: the input has no batch dimension and every chunk reads
    /// all of it) and of each output.
    pub input_item_bytes: Vec<u64>,
    pub output_item_bytes: Vec<u64>,
}

/// The entry object of `plan` for target `t`.
pub fn batch_entry(plan: &BatchPlan, t: &CpuTarget) -> Result<Vec<u8>> {
    if plan.variants.last().map(|v| v.1) != Some(1) {
        return Err(LlvmError::Codegen(
            "a dynamic-batch library needs a batch-1 variant last".into(),
        ));
    }
    let tm = machine(t)?;
    let c = Context::create();
    let name = c_name(&plan.name);
    let m = module_for(&c, &format!("{name}_batch"), &tm);
    let (ptr, i64t, i32t) = (
        c.ptr_type(AddressSpace::default()),
        c.i64_type(),
        c.i32_type(),
    );
    let extern_fn = |sym: &str, f| extern_fn(&m, sym, f);
    // The variants' functions, in the runtime's `mlopt_variant` order.
    let variant_ty = c.struct_type(
        &[ptr.into(), ptr.into(), ptr.into(), ptr.into(), i64t.into()],
        false,
    );
    let mut rows = Vec::with_capacity(plan.variants.len());
    for (v, batch) in &plan.variants {
        let v = c_name(v);
        let fns = [
            extern_fn(&format!("mlopt_{v}_create"), ptr.fn_type(&[], false)),
            extern_fn(
                &format!("mlopt_{v}_run"),
                i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false),
            ),
            extern_fn(
                &format!("mlopt_{v}_error"),
                ptr.fn_type(&[ptr.into()], false),
            ),
            extern_fn(
                &format!("mlopt_{v}_destroy"),
                c.void_type().fn_type(&[ptr.into()], false),
            ),
        ];
        let mut fields: Vec<BasicValueEnum> = fns
            .iter()
            .map(|f| f.as_global_value().as_pointer_value().into())
            .collect();
        fields.push(i64t.const_int(*batch, false).into());
        rows.push(variant_ty.const_named_struct(&fields));
    }
    let constant = |label: &str, v| constant(&m, &format!("mlopt_{name}_{label}"), v);
    let variants = constant("variants", variant_ty.const_array(&rows).into());
    let sizes = |v: &[u64]| {
        let items: Vec<_> = v.iter().map(|b| i64t.const_int(*b, false)).collect();
        // (A zero-length array still needs a distinct address: one unused element.)
        let items = if items.is_empty() {
            vec![i64t.const_zero()]
        } else {
            items
        };
        i64t.const_array(&items).into()
    };
    let in_bytes = constant("input_item_bytes", sizes(&plan.input_item_bytes));
    let out_bytes = constant("output_item_bytes", sizes(&plan.output_item_bytes));
    let label = constant(
        "label",
        c.const_string(plan.name.escape_default().to_string().as_bytes(), true)
            .into(),
    );
    let table_ty = c.struct_type(
        &[
            ptr.into(),
            i64t.into(),
            i64t.into(),
            i64t.into(),
            i64t.into(),
            ptr.into(),
            ptr.into(),
            i64t.into(),
            ptr.into(),
        ],
        false,
    );
    let count = |n: usize| i64t.const_int(n as u64, false).into();
    let table = constant(
        "batched",
        table_ty
            .const_named_struct(&[
                variants.into(),
                count(plan.variants.len()),
                i64t.const_int(plan.max_batch, false).into(),
                count(plan.input_item_bytes.len()),
                count(plan.output_item_bytes.len()),
                in_bytes.into(),
                out_bytes.into(),
                i64t.const_int(crate::entry::context_magic(&name), false)
                    .into(),
                label.into(),
            ])
            .into(),
    );
    // mlopt_<name>_X(args..) { return mlopt_batched_X(&table, args..); }
    forward(&c, &m, (&name, "create"), table, Some(ptr.into()), &[])?;
    forward(
        &c,
        &m,
        (&name, "run"),
        table,
        Some(i32t.into()),
        &[ptr.into(), i64t.into(), ptr.into(), ptr.into()],
    )?;
    forward(
        &c,
        &m,
        (&name, "error"),
        table,
        Some(ptr.into()),
        &[ptr.into()],
    )?;
    forward(&c, &m, (&name, "destroy"), table, None, &[ptr.into()])?;
    m.verify()
        .map_err(|e| LlvmError::Codegen(format!("invalid batch entry module: {e}")))?;
    write(&m, &tm, FileType::Object)
}

fn extern_fn<'c>(
    m: &Module<'c>,
    sym: &str,
    f: inkwell::types::FunctionType<'c>,
) -> FunctionValue<'c> {
    m.get_function(sym)
        .unwrap_or_else(|| m.add_function(sym, f, Some(Linkage::External)))
}

/// A private constant global named `sym` holding `v`; its address.
fn constant<'c>(m: &Module<'c>, sym: &str, v: BasicValueEnum<'c>) -> PointerValue<'c> {
    let g = m.add_global(v.get_type(), None, sym);
    g.set_initializer(&v);
    g.set_constant(true);
    g.set_linkage(Linkage::Private);
    g.as_pointer_value()
}

/// `mlopt_<name>_<label>(args..)`, which returns `mlopt_batched_<label>(table, args..)`.
fn forward<'c>(
    c: &'c Context,
    m: &Module<'c>,
    (name, label): (&str, &str),
    table: PointerValue<'c>,
    ret: Option<BasicTypeEnum<'c>>,
    args: &[BasicMetadataTypeEnum<'c>],
) -> Result<()> {
    let ptr = c.ptr_type(AddressSpace::default());
    let mut with_table = vec![ptr.into()];
    with_table.extend_from_slice(args);
    let (outer, inner) = match ret {
        Some(r) => (r.fn_type(args, false), r.fn_type(&with_table, false)),
        None => (
            c.void_type().fn_type(args, false),
            c.void_type().fn_type(&with_table, false),
        ),
    };
    let callee = extern_fn(m, &format!("mlopt_batched_{label}"), inner);
    let f = m.add_function(&format!("mlopt_{name}_{label}"), outer, None);
    let b = c.create_builder();
    b.position_at_end(c.append_basic_block(f, "entry"));
    let mut call_args: Vec<BasicMetadataValueEnum> = vec![table.into()];
    call_args.extend(f.get_param_iter().map(BasicMetadataValueEnum::from));
    let r = b.build_call(callee, &call_args, label)?;
    match r.try_as_basic_value().basic() {
        Some(v) if ret.is_some() => b.build_return(Some(&v))?,
        _ => b.build_return(None)?,
    };
    Ok(())
}
