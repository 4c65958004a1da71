//! `mma` on dot-product instructions that multiply pairs along k and add them into 32-bit lanes:
//! `vdpbf16ps` for bf16 (AVX512-BF16: AMD Zen 4, Intel Cooper Lake, where there are no AMX tiles), and
//! for i16 (i32 sums: the integer contractions of quantized models) `vpdpwssd` (AVX512-VNNI) or
//! `vpmaddwd` + `vpaddd` (AVX-512BW on zmm, AVX2 on ymm: exact, two instructions). The kernel IR's B
//! layout is the one these instructions want: a B row holds the k-pairs of `lanes` columns in each
//! vector, so
//!
//! ```text
//! for each group of R rows:                       (R x n/lanes accumulators, loaded or zeroed)
//!   for kk in 0..k/2:
//!     b[v]     = B[kk, 2 lanes v .. 2 lanes (v + 1)] (one vector load per `lanes` columns)
//!     a        = broadcast of A[i, 2 kk .. 2 kk + 2] as one 32-bit pair, per row i of the group
//!     acc[i,v] = dot(acc[i,v], a, b[v])            (`lanes` columns x one k-pair, accumulated)
//!   store the accumulators to C
//! ```
//!
//! R is chosen so R x n/lanes accumulators plus the B vectors, the broadcast (and `vpmaddwd`'s product)
//! fit the vector registers (32 zmm, 16 ymm). The accumulators are entry-block allocas indexed by
//! constants, which SROA promotes to registers across the loop.
//!
//! With `ahead`, the k loops also prefetch (`prefetcht1`) the block that follows B in memory (a packed
//! weight's next panel), its bytes spread evenly over the steps of all row groups: a weight too large
//! for the caches then streams in behind the products instead of stalling the first row group of
//! every panel (ResNet-50's 7x7-map convolutions, whose 2-4.5 MB weights each serve 49 positions, ran
//! at 57-68% of the bf16 peak). All lines in the first group's steps asked for them faster than memory
//! delivers.

#![allow(unsafe_code)] // GEPs inside the block; in bounds by verification of the `mma`.

use crate::codegen::{err, Gen, Ret};
use inkwell::intrinsics::Intrinsic;
use inkwell::types::BasicType;
use inkwell::values::{BasicValue, BasicValueEnum, PointerValue};
use mlopt_kir::Block;

/// The instruction an `mma`'s pairs run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pairs {
    /// `vdpbf16ps` on zmm: bf16 pairs into f32.
    Bf16,
    /// i16 pairs into i32 lanes (`lanes` of them: 16 on zmm, 8 on ymm): `vpdpwssd` where `fused`,
    /// else `vpmaddwd` then `vpaddd`.
    I16(mlopt_target::I16Dot),
}

impl Pairs {
    /// Accumulator lanes (columns of C per instruction).
    pub(crate) fn lanes(self) -> u64 {
        match self {
            Pairs::Bf16 => 16,
            Pairs::I16(d) => u64::from(d.lanes),
        }
    }

    /// Accumulator registers per row group of `nv` vectors of columns: `vdpbf16ps` keeps 24 of the 32
    /// zmm; the integer forms what is left of the registers after the B vectors, the broadcast pair
    /// and (`vpmaddwd`) the product.
    fn accumulators(self, nv: u64) -> u64 {
        match self {
            Pairs::Bf16 => 24,
            Pairs::I16(d) => {
                let regs = if d.lanes == 16 { 32 } else { 16 };
                let temps = if d.fused { 1 } else { 2 };
                regs - (nv + temps).min(regs - 1)
            }
        }
    }
}

/// The shapes this code generator takes: n a multiple of the lanes, k even.
pub fn supported(pairs: Pairs, m: u64, n: u64, k: u64) -> bool {
    m > 0 && n > 0 && n.is_multiple_of(pairs.lanes()) && k > 0 && k.is_multiple_of(2)
}

/// The row groups of an m x n block: (first row, rows), as few as keep each group's accumulators in
/// registers, their sizes as even as can be (13 rows of 32 columns are groups of 7 and 6: groups that
/// had to divide m were single rows, two accumulator chains each, waiting on the instruction's latency).
fn row_groups(pairs: Pairs, m: u64, n: u64) -> Vec<(u64, u64)> {
    let nv = n / pairs.lanes();
    let most = (pairs.accumulators(nv) / nv).max(1);
    let groups = m.div_ceil(most);
    (0..groups)
        .map(|g| {
            let (first, next) = (g * m / groups, (g + 1) * m / groups);
            (first, next - first)
        })
        .collect()
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

    /// The dot product an `mma` whose A block is `a` runs on here: i16 pairs on the CPU's integer dot
    /// product, bf16 pairs on `vdpbf16ps` where that is the matrix unit; None where neither is (bf16
    /// on AMX tiles, or on a CPU without a bf16 unit).
    pub(crate) fn pairs(&self, a: &Block) -> Option<Pairs> {
        match self.kernel.buffer(a.buf).elem {
            mlopt_kir::Elem::I16 => self.i16_dot.map(Pairs::I16),
            mlopt_kir::Elem::BF16 if self.matrix == Some(mlopt_target::MatrixUnit::Dot) => {
                Some(Pairs::Bf16)
            }
            _ => None,
        }
    }

    pub fn mma_dot(
        &mut self,
        pairs: Pairs,
        (m, n, k): (u64, u64, u64),
        blocks: (&Block, &Block, &Block),
        acc: bool,
        ahead: bool,
    ) -> Ret<()> {
        self.mma_dot_over(pairs, (m, n, k), blocks, (acc, ahead), None)
    }

    /// Emits serial loop `var` (extent `extent`, `body`) when it is one `mma` accumulating into a block
    /// the loop does not move (a convolution's taps after the first), as one sum with C in registers:
    /// on AMX tiles always (`mma_over`), on `vdpbf16ps` where k is at most 64 (`mma_dot_over`); false,
    /// emitting nothing, otherwise.
    /// (With longer products, C's reload per step is a few percent of each, and separate products
    /// measured 3% faster on ResNet-50's 128-channel 3x3 convolutions. With an odd number of k-pairs,
    /// LLVM's unrolled k loop and its remainder left the accumulators copied between registers and
    /// spilled at every step: a 3-channel stem's folded rows of taps, 11 pairs, ran 1.5x slower summed.)
    pub(crate) fn summed_mmas(
        &mut self,
        var: mlopt_kir::Var,
        extent: u64,
        body: &[mlopt_kir::Stmt],
    ) -> Ret<bool> {
        let [mlopt_kir::Stmt::Mma {
            m,
            n,
            k,
            c,
            a,
            b,
            acc: true,
            ahead,
        }] = body
        else {
            return Ok(false);
        };
        if self.width.is_some() || c.at.iter().any(|e| e.uses(var)) {
            return Ok(false);
        }
        match (self.pairs(a), self.matrix) {
            (Some(p), _) if *k <= 64 && (*k / 2) % 2 == 0 => self.mma_dot_over(
                p,
                (*m, *n, *k),
                (c, a, b),
                (true, *ahead),
                Some((var, extent)),
            )?,
            (Some(_), _) => return Ok(false),
            // On AMX tiles every product configured the tiles, loaded C, stored it and released
            // them: a 3x3 convolution of 64 channels did that per two k steps.
            (None, Some(mlopt_target::MatrixUnit::Amx)) => {
                self.mma_over(*m, *n, *k, (c, a, b), true, Some((var, extent)), None)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Emits `first; for var in 0..extent { mma c += .. }` as one sum on AMX tiles when `first` is an
    /// `mma` into the block the loop's `mma` sums into, the same shape (a convolution's first tap,
    /// which sets C, and the rest): one configuration of the tiles for all of them (`mma_over`'s
    /// `lead`). False, emitting nothing, otherwise.
    pub(crate) fn led_mmas(
        &mut self,
        first: &mlopt_kir::Stmt,
        next: &mlopt_kir::Stmt,
    ) -> Ret<bool> {
        use mlopt_kir::Stmt;
        let (
            Stmt::Mma {
                m,
                n,
                k,
                c,
                a: a0,
                b: b0,
                acc,
                ..
            },
            Stmt::For {
                var,
                extent,
                kind: mlopt_kir::LoopKind::Serial,
                body,
            },
        ) = (first, next)
        else {
            return Ok(false);
        };
        let [Stmt::Mma {
            m: m1,
            n: n1,
            k: k1,
            c: c1,
            a,
            b,
            acc: true,
            ..
        }] = &body[..]
        else {
            return Ok(false);
        };
        if self.width.is_some()
            || self.matrix != Some(mlopt_target::MatrixUnit::Amx)
            || self.pairs(a).is_some()
            || (m, n, k, c) != (m1, n1, k1, c1)
            || c.at.iter().any(|e| e.uses(*var))
        {
            return Ok(false);
        }
        self.mma_over(
            *m,
            *n,
            *k,
            (c, a, b),
            *acc,
            Some((*var, *extent)),
            Some((a0, b0)),
        )?;
        Ok(true)
    }

    /// `mma_dot` (`acc`, `ahead`: the `mma`'s flags), or with `over` (a serial loop's variable and extent, which C's block does not read)
    /// the sum of the loop's products into C: `for t { mma c += a(t) * b(t) }`, a convolution's taps.
    /// The accumulators then stay in registers across the loop, each row group running every step of
    /// it, where one `mma` per step stored and reloaded all of C (a 3x3 convolution of 16 channels
    /// moved C once per 8 `vdpbf16ps` of each accumulator).
    pub(crate) fn mma_dot_over(
        &mut self,
        pairs: Pairs,
        (m, n, k): (u64, u64, u64),
        (c, a, b): (&Block, &Block, &Block),
        (acc, ahead): (bool, bool),
        over: Option<(mlopt_kir::Var, u64)>,
    ) -> Ret<()> {
        if !supported(pairs, m, n, k) {
            return Err(err(format!(
                "@{}: mma<{m}x{n}x{k}> has no {pairs:?} form (n a multiple of {}, k even)",
                self.kernel.name,
                pairs.lanes()
            )));
        }
        let lanes = pairs.lanes();
        let (c0, ldc) = self.block_base(c)?;
        let accv = self.acc_type(pairs);
        let i64 = |g: &Self, v: u64| g.ctx.i64_type().const_int(v, false);
        let nv = n / lanes;
        let groups = row_groups(pairs, m, n);
        let most = groups.iter().map(|g| g.1).max().unwrap_or(1);
        let slots = self.entry_alloca(accv.as_basic_type_enum(), Some(most * nv), "dot.acc")?;
        let n_groups = groups.len() as u64;
        for (g, (first, rows)) in groups.into_iter().enumerate() {
            let ahead = ahead.then_some((g as u64, n_groups));
            // C's accumulators for this row group: loaded, or zero.
            let mut c_at = Vec::new();
            for r in 0..rows {
                for v in 0..nv {
                    let p = self.byte_offset(c0, i64(self, (first + r) * ldc + v * lanes * 4))?;
                    let init = if acc {
                        self.load_unaligned(accv.into(), p, 4)?
                    } else {
                        accv.const_zero().into()
                    };
                    let s = self.acc_slot(pairs, slots, r * nv + v)?;
                    self.builder.build_store(s, init)?;
                    c_at.push((s, p));
                }
            }
            match over {
                None => self.dot_k(pairs, k, (a, b), (first, rows, nv), slots, ahead)?,
                Some((var, extent)) => {
                    let (zero, end) = (i64(self, 0), i64(self, extent));
                    self.counted("dot_over", zero, end, 1, &mut |g, t| {
                        g.vars.insert(var, crate::codegen::VarVal::Scalar(t));
                        g.dot_k(pairs, k, (a, b), (first, rows, nv), slots, ahead)
                    })?;
                    self.vars.remove(&var);
                }
            }
            for (s, p) in c_at {
                let v = self.builder.build_load(accv, s, "c")?;
                let st = self.builder.build_store(p, v)?;
                st.set_alignment(4).map_err(|e| err(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// One accumulator: `lanes` f32 for bf16 pairs, i32 for i16 pairs.
    fn acc_type(&self, pairs: Pairs) -> inkwell::types::VectorType<'c> {
        let lanes = pairs.lanes() as u32;
        match pairs {
            Pairs::Bf16 => self.ctx.f32_type().vec_type(lanes),
            Pairs::I16(_) => self.ctx.i32_type().vec_type(lanes),
        }
    }

    /// Accumulator `s` of a row group (an element of the entry-block array `slots`).
    fn acc_slot(&mut self, pairs: Pairs, slots: PointerValue<'c>, s: u64) -> Ret<PointerValue<'c>> {
        let accv = self.acc_type(pairs);
        let at = self.ctx.i64_type().const_int(s, false);
        // SAFETY: s < rows * nv, the alloca's length.
        Ok(unsafe {
            self.builder
                .build_in_bounds_gep(accv, slots, &[at], "acc")?
        })
    }

    /// `acc + dot(a, b)` on `pairs`' instruction: `a` and `b` vectors of 2 x lanes operands.
    fn dot_add(
        &mut self,
        pairs: Pairs,
        acc: BasicValueEnum<'c>,
        a: BasicValueEnum<'c>,
        b: BasicValueEnum<'c>,
    ) -> Ret<BasicValueEnum<'c>> {
        let lanes = pairs.lanes() as u32;
        let call =
            |g: &mut Self, name: &str, args: &[BasicValueEnum<'c>]| -> Ret<BasicValueEnum<'c>> {
                let f = Intrinsic::find(name)
                    .and_then(|f| f.get_declaration(g.module, &[]))
                    .ok_or_else(|| err(format!("no intrinsic {name}")))?;
                let args: Vec<_> = args.iter().map(|&v| v.into()).collect();
                g.builder
                    .build_call(f, &args, "dp")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| err(format!("{name} returned nothing")))
            };
        match pairs {
            Pairs::Bf16 => call(self, "llvm.x86.avx512bf16.dpbf16ps.512", &[acc, a, b]),
            Pairs::I16(d) if d.fused => {
                // vpdpwssd takes its pairs as i32 lanes.
                let i32v = self.ctx.i32_type().vec_type(lanes);
                let a = self.builder.build_bit_cast(a, i32v, "ai")?;
                let b = self.builder.build_bit_cast(b, i32v, "bi")?;
                call(self, "llvm.x86.avx512.vpdpwssd.512", &[acc, a, b])
            }
            Pairs::I16(_) => {
                let name = if lanes == 16 {
                    "llvm.x86.avx512.pmaddw.d.512"
                } else {
                    "llvm.x86.avx2.pmadd.wd"
                };
                let dot = call(self, name, &[a, b])?;
                Ok(self
                    .builder
                    .build_int_add(acc.into_vector_value(), dot.into_vector_value(), "acc")?
                    .into())
            }
        }
    }

    /// The k loop of the row group of `rows` rows from `first` (`nv` vectors of C each, in `slots`): every
    /// k-pair of A's rows broadcast against B's row of pairs, accumulated by `pairs`' instruction. With
    /// `ahead` (this group's number and the groups there are), the steps prefetch their share of the
    /// block after B's (k / 2 rows of `ldb` bytes): step s of all groups' steps, S of them, the bytes
    /// from s x ldb / S on, so that all steps cover the block evenly (neighbouring steps may ask for
    /// one line: a hit).
    fn dot_k(
        &mut self,
        pairs: Pairs,
        k: u64,
        (a, b): (&Block, &Block),
        (first, rows, nv): (u64, u64, u64),
        slots: PointerValue<'c>,
        ahead: Option<(u64, u64)>,
    ) -> Ret<()> {
        let lanes = pairs.lanes();
        let (a0, lda) = self.block_base(a)?;
        let (b0, ldb) = self.block_base(b)?;
        let accv = self.acc_type(pairs);
        let opv = match pairs {
            Pairs::Bf16 => self.ctx.bf16_type().vec_type(2 * lanes as u32),
            Pairs::I16(_) => self.ctx.i16_type().vec_type(2 * lanes as u32),
        };
        let i32t = self.ctx.i32_type();
        let i64 = |g: &Self, v: u64| g.ctx.i64_type().const_int(v, false);
        let a_row = self.byte_offset(a0, i64(self, first * lda))?;
        let (zero, steps) = (i64(self, 0), i64(self, k / 2));
        self.counted("dot_k", zero, steps, 1, &mut |g, kk| {
            let b_off = g.builder.build_int_mul(kk, i64(g, ldb), "bo")?;
            let b_row = g.byte_offset(b0, b_off)?;
            let mut bs = Vec::new();
            for v in 0..nv {
                let p = g.byte_offset(b_row, i64(g, v * lanes * 4))?;
                bs.push(g.load_unaligned(opv.into(), p, 2)?);
            }
            if let Some((group, groups)) = ahead {
                // The next block (k / 2 rows of `ldb` bytes after B's) spread evenly over all
                // groups' steps: step s of the groups x k/2 fetches the `stride` bytes from s x
                // stride on, its lines' addresses one multiply-add from the step (dividing by the
                // groups and the row's lines per step cost 8 instructions a step, a quarter of an
                // i16 step on ymm).
                let stride = ldb.div_ceil(groups);
                let s = g
                    .builder
                    .build_int_add(kk, i64(g, group * (k / 2)), "pfs")?;
                let off = g.builder.build_int_mul(s, i64(g, stride), "pfo")?;
                let off = g.builder.build_int_add(off, i64(g, (k / 2) * ldb), "pfo")?;
                for line in 0..stride.div_ceil(64) {
                    let at = g.builder.build_int_add(off, i64(g, 64 * line), "pfl")?;
                    g.prefetch_past(b0, at)?;
                }
            }
            let a_off = g.builder.build_int_mul(kk, i64(g, 4), "ao")?;
            for r in 0..rows {
                let off = g.builder.build_int_add(a_off, i64(g, r * lda), "ar")?;
                let p = g.byte_offset(a_row, off)?;
                let pair = g.load_unaligned(i32t.into(), p, 2)?.into_int_value();
                let splat = g.splat(pair.into(), lanes as u32)?;
                let splat = g.builder.build_bit_cast(splat, opv, "apair")?;
                for (v, bv) in bs.iter().enumerate() {
                    let s = g.acc_slot(pairs, slots, r * nv + v as u64)?;
                    let cur = g.builder.build_load(accv, s, "c")?;
                    let next = g.dot_add(pairs, cur, splat, *bv)?;
                    g.builder.build_store(s, next)?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_groups_keep_accumulators_in_registers_and_cover_m() {
        let (ymm, zmm_vnni) = (
            Pairs::I16(mlopt_target::I16Dot {
                fused: false,
                lanes: 8,
            }),
            Pairs::I16(mlopt_target::I16Dot {
                fused: true,
                lanes: 16,
            }),
        );
        // (instruction, m, n) -> rows of each group
        for (pairs, m, n, want) in [
            (Pairs::Bf16, 32, 32, vec![10, 11, 11]),
            (Pairs::Bf16, 32, 16, vec![16, 16]),
            (Pairs::Bf16, 16, 32, vec![8, 8]),
            (Pairs::Bf16, 16, 16, vec![16]),
            (Pairs::Bf16, 12, 32, vec![12]),
            (Pairs::Bf16, 13, 32, vec![6, 7]),
            (Pairs::Bf16, 28, 32, vec![9, 9, 10]),
            (Pairs::Bf16, 7, 64, vec![3, 4]),
            // vpmaddwd on ymm: 16 registers, 2 B vectors, the pair and the product: 6 rows of 16.
            (ymm, 12, 16, vec![6, 6]),
            (ymm, 32, 32, vec![2; 16]),
            (ymm, 7, 8, vec![7]),
            // vpdpwssd on zmm: 32 registers less 2 B vectors and the pair.
            (zmm_vnni, 32, 32, vec![10, 11, 11]),
        ] {
            let groups = row_groups(pairs, m, n);
            let rows: Vec<u64> = groups.iter().map(|g| g.1).collect();
            assert_eq!(rows, want, "{pairs:?} m={m} n={n}");
            // Consecutive, covering 0..m, each within the accumulator budget.
            let (mut next, nv) = (0, n / pairs.lanes());
            for (first, rows) in groups {
                assert_eq!(first, next);
                assert!(rows * nv <= pairs.accumulators(nv).max(nv));
                next += rows;
            }
            assert_eq!(next, m);
        }
    }
}
