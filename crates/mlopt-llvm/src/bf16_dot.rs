//! `mma` on AVX512-BF16 (`vdpbf16ps`), for CPUs that have the bf16 dot product but no AMX tiles (AMD
//! Zen 4, Intel Cooper Lake). The kernel IR's B layout is the one this instruction wants: a B row holds the
//! k-pairs of 16 columns in each 64 bytes, so
//!
//! ```text
//! for each group of R rows:                       (R x n/16 zmm accumulators, loaded or zeroed)
//!   for kk in 0..k/2:
//!     b[v]     = B[kk, 32 v .. 32 v + 32]          (one 64-byte load per 16 columns)
//!     a        = broadcast of A[i, 2 kk .. 2 kk + 2] as one 32-bit pair, per row i of the group
//!     acc[i,v] = vdpbf16ps(acc[i,v], a, b[v])      (16 columns x one k-pair, accumulated in f32)
//!   store the accumulators to C
//! ```
//!
//! R is chosen so R x n/16 accumulators plus the B vectors fit the 32 zmm registers. The accumulators are
//! entry-block allocas indexed by constants, which SROA promotes to registers across the loop.

#![allow(unsafe_code)] // GEPs inside the block; in bounds by verification of the `mma`.

use crate::codegen::{err, Gen, Ret};
use inkwell::intrinsics::Intrinsic;
use inkwell::types::BasicType;
use inkwell::values::{BasicValue, BasicValueEnum, PointerValue};
use mlopt_kir::Block;

/// f32 lanes of one zmm accumulator, i.e. C columns per `vdpbf16ps`.
const LANES: u64 = 16;
/// Accumulator registers per row group (of 32 zmm: the rest hold B and the broadcast A pair).
const ACCUMULATORS: u64 = 24;

/// The shapes this code generator takes: n a multiple of 16, k even.
pub fn supported(m: u64, n: u64, k: u64) -> bool {
    m > 0 && n > 0 && n.is_multiple_of(LANES) && k > 0 && k.is_multiple_of(2)
}

/// Rows per group: as many as keep the accumulators in registers, dividing m.
fn rows_per_group(m: u64, n: u64) -> u64 {
    let most = (ACCUMULATORS / (n / LANES)).max(1);
    (1..=most.min(m))
        .rev()
        .find(|r| m.is_multiple_of(*r))
        .unwrap_or(1)
}

impl<'c> Gen<'_, 'c> {
    /// Loads `t` from `p` with the element's alignment (blocks start anywhere in their buffer; a strided
    /// or interleaved access's rows anywhere in theirs).
    pub(crate) fn load_unaligned(
        &mut self,
        t: inkwell::types::BasicTypeEnum<'c>,
        p: PointerValue<'c>,
        align: u32,
    ) -> Ret<BasicValueEnum<'c>> {
        let v = self.builder.build_load(t, p, "dv")?;
        v.as_instruction_value()
            .ok_or_else(|| err("load"))?
            .set_alignment(align)
            .map_err(|e| err(e.to_string()))?;
        Ok(v)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mma_dot(
        &mut self,
        m: u64,
        n: u64,
        k: u64,
        c: &Block,
        a: &Block,
        b: &Block,
        acc: bool,
    ) -> Ret<()> {
        if !supported(m, n, k) {
            return Err(err(format!(
                "@{}: mma<{m}x{n}x{k}> has no vdpbf16ps form (n a multiple of 16, k even)",
                self.kernel.name
            )));
        }
        let (c0, ldc) = self.block_base(c)?;
        let (a0, lda) = self.block_base(a)?;
        let (b0, ldb) = self.block_base(b)?;
        let (f32v, bf16v, i32t) = (
            self.ctx.f32_type().vec_type(LANES as u32),
            self.ctx.bf16_type().vec_type(2 * LANES as u32),
            self.ctx.i32_type(),
        );
        let dot = Intrinsic::find("llvm.x86.avx512bf16.dpbf16ps.512")
            .ok_or_else(|| err("no vdpbf16ps intrinsic"))?;
        let dot = dot
            .get_declaration(self.module, &[])
            .ok_or_else(|| err("no declaration of vdpbf16ps"))?;
        let i64 = |g: &Self, v: u64| g.ctx.i64_type().const_int(v, false);
        let (nv, rows) = (n / LANES, rows_per_group(m, n));
        let slots = self.entry_alloca(f32v.as_basic_type_enum(), Some(rows * nv), "dot.acc")?;
        let slot = |g: &mut Self, s: u64| -> Ret<PointerValue<'c>> {
            // SAFETY: s < rows * nv, the alloca's length.
            Ok(unsafe {
                g.builder
                    .build_in_bounds_gep(f32v, slots, &[i64(g, s)], "acc")?
            })
        };
        for group in 0..m / rows {
            // C's accumulators for this row group: loaded, or zero.
            let mut c_at = Vec::new();
            for r in 0..rows {
                for v in 0..nv {
                    let p =
                        self.byte_offset(c0, i64(self, (group * rows + r) * ldc + v * LANES * 4))?;
                    let init = if acc {
                        self.load_unaligned(f32v.into(), p, 4)?
                    } else {
                        f32v.const_zero().into()
                    };
                    let s = slot(self, r * nv + v)?;
                    self.builder.build_store(s, init)?;
                    c_at.push((s, p));
                }
            }
            let a_row = self.byte_offset(a0, i64(self, group * rows * lda))?;
            let (zero, pairs) = (i64(self, 0), i64(self, k / 2));
            self.counted("dot_k", zero, pairs, 1, &mut |g, kk| {
                let b_off = g.builder.build_int_mul(kk, i64(g, ldb), "bo")?;
                let b_row = g.byte_offset(b0, b_off)?;
                let mut bs = Vec::new();
                for v in 0..nv {
                    let p = g.byte_offset(b_row, i64(g, v * LANES * 4))?;
                    bs.push(g.load_unaligned(bf16v.into(), p, 2)?);
                }
                let a_off = g.builder.build_int_mul(kk, i64(g, 4), "ao")?;
                for r in 0..rows {
                    let off = g.builder.build_int_add(a_off, i64(g, r * lda), "ar")?;
                    let p = g.byte_offset(a_row, off)?;
                    let pair = g.load_unaligned(i32t.into(), p, 2)?.into_int_value();
                    let splat = g.splat(pair.into(), LANES as u32)?;
                    let splat = g.builder.build_bit_cast(splat, bf16v, "abf")?;
                    for (v, bv) in bs.iter().enumerate() {
                        let s = slot(g, r * nv + v as u64)?;
                        let cur = g.builder.build_load(f32v, s, "c")?;
                        let next = g.builder.build_call(
                            dot,
                            &[cur.into(), splat.into(), (*bv).into()],
                            "dp",
                        )?;
                        let next = next
                            .try_as_basic_value()
                            .basic()
                            .ok_or_else(|| err("vdpbf16ps returned nothing"))?;
                        g.builder.build_store(s, next)?;
                    }
                }
                Ok(())
            })?;
            for (s, p) in c_at {
                let v = self.builder.build_load(f32v, s, "c")?;
                let st = self.builder.build_store(p, v)?;
                st.set_alignment(4).map_err(|e| err(e.to_string()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_groups_keep_accumulators_in_registers_and_divide_m() {
        // (m, n) -> rows per group
        for (m, n, want) in [
            (32, 32, 8),
            (32, 16, 16),
            (16, 32, 8),
            (16, 16, 16),
            (12, 32, 12),
            (7, 64, 1),
        ] {
            assert_eq!(rows_per_group(m, n), want, "m={m} n={n}");
        }
    }
}
