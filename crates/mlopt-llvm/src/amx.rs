//! `mma` on Intel AMX: C is held in up to four 16x16 f32 tiles (tmm0-3) for the whole reduction; each
//! step of 32 along k loads up to two 16x32 bf16 A tiles (tmm4-5) and two 16x(2x16) pair-interleaved B
//! tiles (tmm6-7) and issues one `tdpbf16ps` per C tile. All eight tiles are configured 16 rows x 64
//! bytes (`ldtilecfg` of a constant palette-1 configuration). The configuration is loaded once around
//! the outermost serial loop of a function that runs products (each thread of the pool configures its
//! own tiles in the loop's outlined body), and released after it: `ldtilecfg` takes hundreds of
//! cycles, and configured per block it was 7% of ResNet-50's stem.
//!
//! The instructions are emitted as inline assembly: three blocks (configure, unless configured around
//! the loop, + load or zero C; one k step; store C + `tilerelease`, likewise) around a counted loop in
//! IR. LLVM allocates no tile registers in these
//! functions (there are no AMX intrinsics), so the tiles stay live between the blocks.

#![allow(unsafe_code)] // GEPs to the tiles' first elements; in bounds by verification of the `mma`.

use crate::codegen::{err, Gen, Ret};
use inkwell::module::Linkage;
use inkwell::values::{BasicMetadataValueEnum, IntValue, PointerValue};
use mlopt_kir::Block;

const TILE_ROWS: u64 = 16;
const TILE_BYTES: u64 = 64;
/// The first tile register of A's row blocks and of B's column blocks (C's are 0-3).
const A_TILE: u64 = 4;
const B_TILE: u64 = 6;
/// k consumed per step: one A tile row holds 32 bf16 values.
pub const K_STEP: u64 = 32;

/// The shapes this code generator takes: m and n of 16 or 32, k a multiple of 32.
pub fn supported(m: u64, n: u64, k: u64) -> bool {
    matches!(m, 16 | 32) && matches!(n, 16 | 32) && k > 0 && k.is_multiple_of(K_STEP)
}

/// The 64-byte tile configuration: palette 1, tiles 0-7 of 16 rows x 64 bytes.
fn config() -> [u8; 64] {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(TILE_BYTES as u16).to_le_bytes());
        c[48 + t] = TILE_ROWS as u8;
    }
    c
}

impl<'c> Gen<'_, 'c> {
    /// The address of a block's first element and its row stride in bytes.
    pub(crate) fn block_base(&mut self, x: &Block) -> Ret<(PointerValue<'c>, u64)> {
        let flat = mlopt_kir::analysis::flat_index(self.kernel, x.buf, &x.at);
        let i = self.eval(&flat)?.into_int_value();
        let p = self.elem_ptr(x.buf, i)?;
        let buf = self.kernel.buffer(x.buf);
        Ok((p, buf.dims.last().copied().unwrap_or(1) * buf.elem.size()))
    }

    /// `p` advanced by `bytes`.
    pub(crate) fn byte_offset(
        &mut self,
        p: PointerValue<'c>,
        bytes: IntValue<'c>,
    ) -> Ret<PointerValue<'c>> {
        // SAFETY: offsets inside the block, which the verifier proved in bounds.
        Ok(unsafe {
            self.builder
                .build_in_bounds_gep(self.ctx.i8_type(), p, &[bytes], "tile")?
        })
    }

    fn asm(&mut self, text: &str, args: &[BasicMetadataValueEnum<'c>]) -> Ret<()> {
        let ptr = self.ctx.ptr_type(inkwell::AddressSpace::default());
        let params: Vec<_> = args
            .iter()
            .map(|a| {
                if a.is_pointer_value() {
                    ptr.into()
                } else {
                    self.ctx.i64_type().into()
                }
            })
            .collect();
        let fty = self.ctx.void_type().fn_type(&params, false);
        let constraints = [vec!["r"; args.len()], vec!["~{memory}"]]
            .concat()
            .join(",");
        let f = self.ctx.create_inline_asm(
            fty,
            text.to_string(),
            constraints,
            true,
            false,
            None,
            false,
        );
        self.builder.build_indirect_call(fty, f, args, "")?;
        Ok(())
    }

    fn config_ptr(&mut self) -> PointerValue<'c> {
        let name = "mlopt.amx.config";
        if let Some(g) = self.module.get_global(name) {
            return g.as_pointer_value();
        }
        let init = self.ctx.const_string(&config(), false);
        let g = self.module.add_global(init.get_type(), None, name);
        g.set_initializer(&init);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_alignment(64);
        g.as_pointer_value()
    }

    /// Whether the tiles should be configured around a serial loop over `body`: it runs `mma`s on AMX
    /// in this function (no parallel loop, whose body is a function of its own, on the way).
    pub(crate) fn tiles_for(&self, body: &[mlopt_kir::Stmt]) -> bool {
        // (Only bf16 products run on the tiles; i16 ones on the integer dot product, `dot.rs`.)
        fn walk(k: &mlopt_kir::Kernel, s: &[mlopt_kir::Stmt], mma: &mut bool) -> bool {
            s.iter().all(|s| match s {
                mlopt_kir::Stmt::Mma { a, .. } => {
                    *mma |= k.buffer(a.buf).elem == mlopt_kir::Elem::BF16;
                    true
                }
                mlopt_kir::Stmt::For { kind, body, .. } => {
                    *kind != mlopt_kir::LoopKind::Parallel && walk(k, body, mma)
                }
                mlopt_kir::Stmt::If { then, .. } => walk(k, then, mma),
                _ => true,
            })
        }
        let mut mma = false;
        self.matrix == Some(mlopt_target::MatrixUnit::Amx)
            && !self.gpu
            && self.width.is_none()
            && walk(self.kernel, body, &mut mma)
            && mma
    }

    pub(crate) fn configure_tiles(&mut self) -> Ret<()> {
        let cfg = self.config_ptr();
        self.asm("ldtilecfg ($0)", &[cfg.into()])?;
        self.tiles_ready = true;
        Ok(())
    }

    pub(crate) fn release_tiles(&mut self) -> Ret<()> {
        self.tiles_ready = false;
        self.asm("tilerelease", &[])
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mma(
        &mut self,
        m: u64,
        n: u64,
        k: u64,
        c: &Block,
        a: &Block,
        b: &Block,
        acc: bool,
    ) -> Ret<()> {
        self.mma_over(m, n, k, (c, a, b), acc, None, None)
    }

    /// `mma`, or with `over` (a serial loop's variable and extent, which C's block does not read) the
    /// sum of the loop's products into C, `for t { mma c += a(t) * b(t) }` (a convolution's taps): the
    /// C tiles configured and loaded once, every step of every product, then stored once. `lead` is a
    /// product into the same C before the loop's (a convolution's first tap, which sets C: `acc`
    /// false), run in the same configuration: as two, each block configured, stored and released its
    /// tiles twice, and ResNet-50's 3-channel stem spent an eighth of its time in `ldtilecfg`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mma_over(
        &mut self,
        m: u64,
        n: u64,
        k: u64,
        (c, a, b): (&Block, &Block, &Block),
        acc: bool,
        over: Option<(mlopt_kir::Var, u64)>,
        lead: Option<(&Block, &Block)>,
    ) -> Ret<()> {
        if !supported(m, n, k) {
            return Err(err(format!(
                "@{}: mma<{m}x{n}x{k}> has no AMX form (m, n of 16 or 32, k a multiple of 32)",
                self.kernel.name
            )));
        }
        let (mt, nt) = (m / TILE_ROWS, n / TILE_ROWS);
        let (c0, ldc) = self.block_base(c)?;
        let i64 = |g: &Self, v: u64| g.ctx.i64_type().const_int(v, false);
        let ctile = |i: u64, j: u64| (i * nt + j) as usize;
        // C tile (i, j) is register ctile(i, j); its first element's address, for loading and storing.
        let mut c_tiles = Vec::new();
        for i in 0..mt {
            for j in 0..nt {
                c_tiles.push((
                    ctile(i, j),
                    self.byte_offset(c0, i64(self, i * TILE_ROWS * ldc + j * TILE_BYTES))?,
                ));
            }
        }

        // Configure (unless configured around the loop), then load or zero the C tiles.
        let ready = self.tiles_ready;
        let mut text = Vec::new();
        if !ready {
            text.push("ldtilecfg ($0)".to_string());
        }
        let mut args: Vec<BasicMetadataValueEnum> =
            vec![self.config_ptr().into(), i64(self, ldc).into()];
        for (t, p) in &c_tiles {
            if acc {
                text.push(format!("tileloadd (${},$1,1), %tmm{t}", args.len()));
                args.push((*p).into());
            } else {
                text.push(format!("tilezero %tmm{t}"));
            }
        }
        self.asm(&text.join("\n\t"), &args)?;

        if let Some((a, b)) = lead {
            self.amx_k(k, (mt, nt), a, b)?;
        }
        match over {
            None => self.amx_k(k, (mt, nt), a, b)?,
            Some((var, extent)) => {
                let (zero, end) = (i64(self, 0), i64(self, extent));
                self.counted("amx_over", zero, end, 1, &mut |g, t| {
                    g.vars.insert(var, crate::codegen::VarVal::Scalar(t));
                    g.amx_k(k, (mt, nt), a, b)
                })?;
                self.vars.remove(&var);
            }
        }

        // Store C and release the tiles.
        let mut text = Vec::new();
        let mut args: Vec<BasicMetadataValueEnum> = vec![i64(self, ldc).into()];
        for (t, p) in &c_tiles {
            text.push(format!("tilestored %tmm{t}, (${},$0,1)", args.len()));
            args.push((*p).into());
        }
        if !ready {
            text.push("tilerelease".into());
        }
        self.asm(&text.join("\n\t"), &args)
    }

    /// The reduction of one product: A tiles from row blocks, B tiles from column blocks, one
    /// tdpbf16ps per C tile (tile registers ctile(i, j) = i * nt + j).
    fn amx_k(&mut self, k: u64, (mt, nt): (u64, u64), a: &Block, b: &Block) -> Ret<()> {
        let (a0, lda) = self.block_base(a)?;
        let (b0, ldb) = self.block_base(b)?;
        let i64 = |g: &Self, v: u64| g.ctx.i64_type().const_int(v, false);
        let ctile = |i: u64, j: u64| (i * nt + j) as usize;
        let (zero, steps) = (i64(self, 0), i64(self, k / K_STEP));
        self.counted("amx_k", zero, steps, 1, &mut |g, s| {
            let mut text = Vec::new();
            let mut args: Vec<BasicMetadataValueEnum> =
                vec![i64(g, lda).into(), i64(g, ldb).into()];
            let a_step = g.builder.build_int_mul(s, i64(g, K_STEP * 2), "ak")?;
            let b_step = g
                .builder
                .build_int_mul(s, i64(g, (K_STEP / 2) * ldb), "bk")?;
            for i in 0..mt {
                let off = g
                    .builder
                    .build_int_add(a_step, i64(g, i * TILE_ROWS * lda), "ao")?;
                let p = g.byte_offset(a0, off)?;
                text.push(format!(
                    "tileloadd (${},$0,1), %tmm{}",
                    args.len(),
                    A_TILE + i
                ));
                args.push(p.into());
            }
            for j in 0..nt {
                let off = g
                    .builder
                    .build_int_add(b_step, i64(g, j * TILE_BYTES), "bo")?;
                let p = g.byte_offset(b0, off)?;
                text.push(format!(
                    "tileloadd (${},$1,1), %tmm{}",
                    args.len(),
                    B_TILE + j
                ));
                args.push(p.into());
            }
            for i in 0..mt {
                for j in 0..nt {
                    text.push(format!(
                        "tdpbf16ps %tmm{}, %tmm{}, %tmm{}",
                        B_TILE + j,
                        A_TILE + i,
                        ctile(i, j)
                    ));
                }
            }
            g.asm(&text.join("\n\t"), &args)
        })
    }
}
