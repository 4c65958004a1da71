//! Arithmetic, comparisons, math functions and casts on scalars or vectors of any element type.
//! Float min/max propagate NaN (`llvm.minimum`/`llvm.maximum`), as the interpreters do; integer division
//! by zero yields 0 instead of trapping. Functions LLVM has no instruction for (tanh, erf) are libm calls,
//! one per lane.

use crate::codegen::{const_like, float_cmp, int_cmp, ty, Gen, Ret};
use crate::error::LlvmError;
use inkwell::types::BasicType;
use inkwell::values::{BasicValueEnum, InstructionOpcode as Op};
use inkwell::{FloatPredicate as F, IntPredicate as I};
use mlopt_kir::{BinOp, Elem, UnOp};

fn unsigned(t: Elem) -> bool {
    matches!(t, Elem::U8 | Elem::Bool)
}

pub fn unary<'c>(g: &mut Gen<'_, 'c>, o: UnOp, x: BasicValueEnum<'c>, t: Elem) -> Ret<BasicValueEnum<'c>> {
    if !t.is_float() {
        return Ok(match o {
            UnOp::Neg => {
                let z = const_like(g.c, x, 0.0, t);
                g.b.build_binop(Op::Sub, z, x, "neg")?
            }
            UnOp::Abs => {
                let f = g.c.bool_type().const_zero();
                let i = inkwell::intrinsics::Intrinsic::find("llvm.abs").ok_or_else(|| LlvmError::Codegen("no llvm.abs".into()))?;
                let d = i.get_declaration(g.m, &[x.get_type()]).ok_or_else(|| LlvmError::Codegen("llvm.abs".into()))?;
                g.b.build_call(d, &[x.into(), f.into()], "abs")?.try_as_basic_value().basic().ok_or_else(|| LlvmError::Codegen("abs".into()))?
            }
            UnOp::Not => {
                let one = const_like(g.c, x, 1.0, Elem::Bool);
                g.b.build_binop(Op::Xor, x, one, "not")?
            }
            _ => return Err(LlvmError::Codegen(format!("{o:?} of {t}"))),
        });
    }
    let name = match o {
        UnOp::Neg => return Ok(g.b.build_unary_op_neg(x)?),
        UnOp::Abs => "llvm.fabs",
        UnOp::Exp => "llvm.exp",
        UnOp::Log => "llvm.log",
        UnOp::Sqrt => "llvm.sqrt",
        UnOp::Floor => "llvm.floor",
        UnOp::Ceil => "llvm.ceil",
        UnOp::Round => "llvm.roundeven",
        UnOp::Sin => "llvm.sin",
        UnOp::Cos => "llvm.cos",
        UnOp::Tanh => return libm(g, if t == Elem::F64 { "tanh" } else { "tanhf" }, x, t),
        UnOp::Erf => return libm(g, if t == Elem::F64 { "erf" } else { "erff" }, x, t),
        UnOp::Not => return Err(LlvmError::Codegen(format!("not of {t}"))),
    };
    g.intrinsic(name, &[x])
}

trait NegExt<'c> {
    fn build_unary_op_neg(&self, x: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>, inkwell::builder::BuilderError>;
}

impl<'c> NegExt<'c> for inkwell::builder::Builder<'c> {
    fn build_unary_op_neg(&self, x: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>, inkwell::builder::BuilderError> {
        Ok(match x {
            BasicValueEnum::VectorValue(v) => self.build_float_neg(v, "fneg")?.into(),
            v => self.build_float_neg(v.into_float_value(), "fneg")?.into(),
        })
    }
}

/// A libm function of one float, applied lane by lane to a vector.
fn libm<'c>(g: &mut Gen<'_, 'c>, name: &str, x: BasicValueEnum<'c>, t: Elem) -> Ret<BasicValueEnum<'c>> {
    let ft = ty(g.c, t);
    let f = g.m.get_function(name).unwrap_or_else(|| g.m.add_function(name, ft.fn_type(&[ft.into()], false), None));
    let call = |g: &mut Gen<'_, 'c>, v: BasicValueEnum<'c>| -> Ret<BasicValueEnum<'c>> {
        g.b.build_call(f, &[v.into()], name)?.try_as_basic_value().basic().ok_or_else(|| LlvmError::Codegen(format!("{name} returned nothing")))
    };
    match x {
        BasicValueEnum::VectorValue(v) => {
            let mut acc = v;
            for lane in 0..v.get_type().get_size() {
                let l = g.c.i32_type().const_int(lane as u64, false);
                let e = g.b.build_extract_element(v, l, "e")?;
                let r = call(g, e)?;
                acc = g.b.build_insert_element(acc, r, l, "r")?;
            }
            Ok(acc.into())
        }
        v => call(g, v),
    }
}

pub fn binary<'c>(g: &mut Gen<'_, 'c>, o: BinOp, x: BasicValueEnum<'c>, y: BasicValueEnum<'c>, t: Elem) -> Ret<BasicValueEnum<'c>> {
    let b = &g.b;
    if t.is_float() {
        return Ok(match o {
            BinOp::Add => b.build_binop(Op::FAdd, x, y, "add")?,
            BinOp::Sub => b.build_binop(Op::FSub, x, y, "sub")?,
            BinOp::Mul => b.build_binop(Op::FMul, x, y, "mul")?,
            BinOp::Div => b.build_binop(Op::FDiv, x, y, "div")?,
            BinOp::Rem => b.build_binop(Op::FRem, x, y, "rem")?,
            BinOp::Min => return g.intrinsic("llvm.minimum", &[x, y]),
            BinOp::Max => return g.intrinsic("llvm.maximum", &[x, y]),
            BinOp::Pow => return g.intrinsic("llvm.pow", &[x, y]),
            BinOp::Lt => float_cmp(b, F::OLT, x, y)?,
            BinOp::Le => float_cmp(b, F::OLE, x, y)?,
            BinOp::Eq => float_cmp(b, F::OEQ, x, y)?,
            BinOp::Ne => float_cmp(b, F::UNE, x, y)?,
            BinOp::And | BinOp::Or => return Err(LlvmError::Codegen(format!("{o:?} of {t}"))),
        });
    }
    let u = unsigned(t);
    Ok(match o {
        BinOp::Add => b.build_binop(Op::Add, x, y, "add")?,
        BinOp::Sub => b.build_binop(Op::Sub, x, y, "sub")?,
        BinOp::Mul => b.build_binop(Op::Mul, x, y, "mul")?,
        BinOp::Div | BinOp::Rem => {
            // x / 0 = 0 (the interpreter's answer) instead of a trap.
            let zero = const_like(g.c, y, 0.0, t);
            let one = const_like(g.c, y, 1.0, t);
            let is0 = int_cmp(b, I::EQ, y, zero)?;
            let safe = select(g, is0, one, y)?;
            let op = match (o, u) {
                (BinOp::Div, false) => Op::SDiv,
                (BinOp::Div, true) => Op::UDiv,
                (_, false) => Op::SRem,
                (_, true) => Op::URem,
            };
            let q = g.b.build_binop(op, x, safe, "idiv")?;
            return select(g, is0, zero, q);
        }
        BinOp::Min => return g.intrinsic(if u { "llvm.umin" } else { "llvm.smin" }, &[x, y]),
        BinOp::Max => return g.intrinsic(if u { "llvm.umax" } else { "llvm.smax" }, &[x, y]),
        BinOp::Lt => int_cmp(b, if u { I::ULT } else { I::SLT }, x, y)?,
        BinOp::Le => int_cmp(b, if u { I::ULE } else { I::SLE }, x, y)?,
        BinOp::Eq => int_cmp(b, I::EQ, x, y)?,
        BinOp::Ne => int_cmp(b, I::NE, x, y)?,
        BinOp::And => b.build_binop(Op::And, x, y, "and")?,
        BinOp::Or => b.build_binop(Op::Or, x, y, "or")?,
        BinOp::Pow => return Err(LlvmError::Codegen(format!("pow of {t}"))),
    })
}

fn select<'c>(g: &mut Gen<'_, 'c>, c: BasicValueEnum<'c>, x: BasicValueEnum<'c>, y: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
    Ok(match c {
        BasicValueEnum::VectorValue(c) => g.b.build_select(c, x, y, "sel")?,
        c => g.b.build_select(c.into_int_value(), x, y, "sel")?,
    })
}

/// The register type of `to` with `x`'s shape.
fn shaped<'c>(g: &Gen<'_, 'c>, x: BasicValueEnum<'c>, to: Elem) -> inkwell::types::BasicTypeEnum<'c> {
    let t = if to == Elem::Bool { g.c.bool_type().as_basic_type_enum() } else { ty(g.c, to) };
    match x {
        BasicValueEnum::VectorValue(v) => crate::codegen::vector_type(t, v.get_type().get_size()),
        _ => t,
    }
}

pub fn cast<'c>(g: &mut Gen<'_, 'c>, x: BasicValueEnum<'c>, from: Elem, to: Elem) -> Ret<BasicValueEnum<'c>> {
    if from == to {
        return Ok(x);
    }
    let t = shaped(g, x, to);
    if to == Elem::Bool {
        return if from.is_float() {
            let z = const_like(g.c, x, 0.0, from);
            float_cmp(&g.b, F::UNE, x, z)
        } else {
            let z = const_like(g.c, x, 0.0, from);
            int_cmp(&g.b, I::NE, x, z)
        };
    }
    let op = match (from.is_float(), to.is_float()) {
        (true, true) => {
            if from.size() < to.size() || (from == Elem::BF16 && to == Elem::F16) {
                Op::FPExt
            } else {
                Op::FPTrunc
            }
        }
        (true, false) => {
            // NaN and out-of-range values saturate instead of being poison.
            let name = if unsigned(to) { "llvm.fptoui.sat" } else { "llvm.fptosi.sat" };
            let i = inkwell::intrinsics::Intrinsic::find(name).ok_or_else(|| LlvmError::Codegen(format!("no {name}")))?;
            let d = i.get_declaration(g.m, &[t, x.get_type()]).ok_or_else(|| LlvmError::Codegen(name.into()))?;
            return g.b.build_call(d, &[x.into()], "fptoi")?.try_as_basic_value().basic().ok_or_else(|| LlvmError::Codegen(name.into()));
        }
        (false, true) => {
            if unsigned(from) {
                Op::UIToFP
            } else {
                Op::SIToFP
            }
        }
        (false, false) => {
            let (fs, ts) = (if from == Elem::Bool { 0 } else { from.size() }, to.size());
            if ts < fs {
                Op::Trunc
            } else if unsigned(from) {
                Op::ZExt
            } else {
                Op::SExt
            }
        }
    };
    // bf16 <-> f16 has no single instruction: go through f32.
    if from.is_float() && to.is_float() && matches!((from, to), (Elem::BF16, Elem::F16) | (Elem::F16, Elem::BF16)) {
        let mid = cast(g, x, from, Elem::F32)?;
        return cast(g, mid, Elem::F32, to);
    }
    Ok(g.b.build_cast(op, x, t, "cast")?)
}
