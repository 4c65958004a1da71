//! How the kernel IR's loads and stores become LLVM's: a buffer's flat index, its element pointer, and in a
//! vector loop one vector load or store where the index moves by one element per lane, a broadcast where
//! it does not move, a gather or scatter otherwise (with the alignment a contiguous access has); values
//! converted between their memory and register types.

// GEP construction is `unsafe` in inkwell because a wrong index makes IR that reads out of bounds when
// *run*; every index emitted here comes from a kernel the verifier proved in bounds.
#![allow(unsafe_code)]

use crate::codegen::*;
use inkwell::intrinsics::Intrinsic;
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{
    AsValueRef, BasicValue, BasicValueEnum, IntValue, PointerValue, VectorValue,
};
use inkwell::IntPredicate;
use mlopt_kir::analysis::{coefficient, RowRuns};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Var};

impl<'c> Gen<'_, 'c> {
    pub(crate) fn flat(&self, b: BufId, index: &[Expr]) -> Expr {
        mlopt_kir::analysis::flat_index(self.kernel, b, index)
    }

    /// The vector loop's variable, when emitting a vector loop.
    pub(crate) fn lane_var(&self) -> Option<Var> {
        self.vars
            .iter()
            .find_map(|(v, x)| matches!(x, VarVal::Lanes(_)).then_some(*v))
    }

    pub(crate) fn uniform(&self, e: &Expr) -> bool {
        match self.lane_var() {
            None => true,
            Some(v) => !e.uses(v) && !self.reads_private(e),
        }
    }

    pub(crate) fn reads_private(&self, e: &Expr) -> bool {
        match e {
            Expr::Load(b, ix) => {
                self.private.contains_key(b) || ix.iter().any(|x| self.reads_private(x))
            }
            Expr::Int(_) | Expr::Float(..) | Expr::Var(_) => false,
            Expr::Unary(_, a) | Expr::Cast(_, a) => self.reads_private(a),
            Expr::Binary(_, a, b) => self.reads_private(a) || self.reads_private(b),
            Expr::Fma(a, b, c) | Expr::Select(a, b, c) => {
                self.reads_private(a) || self.reads_private(b) || self.reads_private(c)
            }
        }
    }

    /// Evaluates an index expression as one scalar (the lane variable taken at lane 0).
    pub(crate) fn scalar_index(&mut self, e: &Expr) -> Ret<IntValue<'c>> {
        let saved = self.width.take();
        let lanes: Vec<(Var, VarVal<'c>)> = self
            .vars
            .iter()
            .filter(|(_, x)| matches!(x, VarVal::Lanes(_)))
            .map(|(v, x)| (*v, *x))
            .collect();
        for (v, x) in &lanes {
            if let VarVal::Lanes(i) = x {
                self.vars.insert(*v, VarVal::Scalar(*i));
            }
        }
        let r = self.eval(e);
        for (v, x) in lanes {
            self.vars.insert(v, x);
        }
        self.width = saved;
        Ok(r?.into_int_value())
    }

    /// Buffer `b`'s base pointer and its element type in memory.
    fn base(&self, b: BufId) -> Ret<(PointerValue<'c>, BasicTypeEnum<'c>)> {
        let base = *self
            .ptrs
            .get(&b)
            .ok_or_else(|| err(format!("no pointer for %{}", self.kernel.buffer(b).name)))?;
        Ok((base, ty(self.ctx, self.kernel.buffer(b).elem)))
    }

    pub(crate) fn elem_ptr(&mut self, b: BufId, flat: IntValue<'c>) -> Ret<PointerValue<'c>> {
        let (base, t) = self.base(b)?;
        // SAFETY: see the module comment; the index is in bounds by verification.
        Ok(unsafe { self.builder.build_in_bounds_gep(t, base, &[flat], "p")? })
    }

    /// `llvm.prefetch` of element `at` of `b` into L2 (`prefetcht1`): read, data, locality 2. In a vector
    /// loop, the first lane's element.
    pub(crate) fn prefetch(&mut self, b: BufId, at: &Expr) -> Ret<()> {
        let i = self.scalar_index(at)?;
        let (base, t) = self.base(b)?;
        // SAFETY: a plain GEP, not `inbounds`: the address may lie past the buffer, which a prefetch
        // (which cannot fault) may name; nothing is read through it.
        let p = unsafe { self.builder.build_gep(t, base, &[i], "pf")? };
        self.prefetch_line(p)
    }

    /// A prefetch of the line `bytes` past `p`, which may lie past `p`'s buffer.
    pub(crate) fn prefetch_past(&mut self, p: PointerValue<'c>, bytes: IntValue<'c>) -> Ret<()> {
        // SAFETY: a plain GEP (see `prefetch`).
        let p = unsafe {
            self.builder
                .build_gep(self.ctx.i8_type(), p, &[bytes], "pf")?
        };
        self.prefetch_line(p)
    }

    /// `prefetcht1` of the line at `p`: into L2, for reads soon.
    fn prefetch_line(&mut self, p: PointerValue<'c>) -> Ret<()> {
        let f = inkwell::intrinsics::Intrinsic::find("llvm.prefetch")
            .and_then(|f| f.get_declaration(self.module, &[p.get_type().into()]))
            .ok_or_else(|| err("no llvm.prefetch"))?;
        let i32t = self.ctx.i32_type();
        let args = [0, 2, 1].map(|x| i32t.const_int(x, false).into());
        self.builder
            .build_call(f, &[p.into(), args[0], args[1], args[2]], "")?;
        Ok(())
    }

    /// How the flat index moves with the lane: Some(0) uniform, Some(1) contiguous, None otherwise.
    pub(crate) fn lane_stride(&self, flat: &Expr) -> Option<i64> {
        let v = self.lane_var()?;
        if self.uniform(flat) {
            return Some(0);
        }
        coefficient(flat, v).filter(|_| !self.reads_private(flat))
    }

    /// The rows (2 or 4) the lanes of a `w`-lane access at `flat` interleave
    /// (`mlopt_kir::analysis::interleaved`), and the lane variable.
    pub(crate) fn interleaved(&self, flat: &Expr, w: u32) -> Option<(u32, Var)> {
        let q = self.lane_var()?;
        if self.reads_private(flat) {
            return None;
        }
        let extents = self
            .extents
            .get_or_init(|| mlopt_kir::simplify::loop_extents(self.kernel));
        let r = mlopt_kir::analysis::interleaved(self.kernel, extents, flat, q)?;
        w.is_multiple_of(r).then_some((r, q))
    }

    /// The two-source shuffle of `a` and `b` picking lanes `mask` (lanes of `b` numbered after `a`'s).
    pub(crate) fn shuffle(
        &self,
        (a, b): (VectorValue<'c>, VectorValue<'c>),
        mask: impl IntoIterator<Item = u32>,
        name: &str,
    ) -> Ret<VectorValue<'c>> {
        let i32t = self.ctx.i32_type();
        let mask: Vec<_> = mask
            .into_iter()
            .map(|l| i32t.const_int(u64::from(l), false))
            .collect();
        let mask = inkwell::types::VectorType::const_vector(&mask);
        Ok(self.builder.build_shuffle_vector(a, b, mask, name)?)
    }

    /// Vector `v` widened to `wide` lanes, the added ones poison (LLVM fills them however is cheapest).
    pub(crate) fn padded(&self, v: VectorValue<'c>, wide: u32) -> Ret<VectorValue<'c>> {
        let w = v.get_type().get_size();
        let poison = v.get_type().get_poison();
        self.shuffle((v, poison), (0..wide).map(|l| l.min(w)), "padded")
    }

    /// The type a 16-bit float vector is loaded and shuffled as: i16 (LLVM 19 scalarises shuffles of
    /// `bfloat` vectors); other elements as themselves.
    pub(crate) fn shuffle_elem(&self, elem: Elem) -> inkwell::types::BasicTypeEnum<'c> {
        match elem {
            Elem::BF16 | Elem::F16 => self.ctx.i16_type().as_basic_type_enum(),
            _ => ty(self.ctx, elem),
        }
    }

    /// A shuffled vector of `w` lanes (as `shuffle_elem` typed it) as `elem`'s register value.
    pub(crate) fn unshuffled(
        &mut self,
        v: VectorValue<'c>,
        elem: Elem,
        w: u32,
    ) -> Ret<BasicValueEnum<'c>> {
        let v = self
            .builder
            .build_bit_cast(v, vector_type(ty(self.ctx, elem), w), "lanes")?;
        self.mem_to_reg(v, elem)
    }

    /// `w` elements of `elem` from `p` on at a stride of `st` (1 to 4), in the memory type `shuffle_elem`
    /// gives. A stride above 1 (a stride-2 window's row): the span the lanes cover, read as two
    /// overlapping power-of-two loads (its first and its last `half` elements, both inside it), and
    /// every st-th element picked from the pair by one two-source shuffle. LLVM lowers an odd-length
    /// load and shuffle (the span itself) element by element (a bf16 stride-2 depthwise convolution
    /// spent most of its time there).
    pub(crate) fn strided_row(
        &mut self,
        p: PointerValue<'c>,
        elem: Elem,
        w: u32,
        st: u32,
    ) -> Ret<VectorValue<'c>> {
        let lt = self.shuffle_elem(elem);
        if st == 1 {
            let v = self.load_unaligned(vector_type(lt, w), p, elem.size() as u32)?;
            return Ok(v.into_vector_value());
        }
        let span = (w - 1) * st + 1;
        let part = span.div_ceil(2).next_power_of_two().min(span);
        let i64t = self.ctx.i64_type();
        let load = |g: &mut Self, at: u32| -> Ret<VectorValue<'c>> {
            // SAFETY: inside the span, which verification bounds.
            let q = unsafe {
                g.builder.build_in_bounds_gep(
                    lt,
                    p,
                    &[i64t.const_int(u64::from(at), false)],
                    "sp",
                )?
            };
            let v = g.load_unaligned(vector_type(lt, part), q, elem.size() as u32)?;
            Ok(v.into_vector_value())
        };
        let pair = (load(self, 0)?, load(self, span - part)?);
        let mask = (0..w).map(|l| {
            let e = l * st;
            if e < part {
                e
            } else {
                part + e - (span - part)
            }
        });
        self.shuffle(pair, mask, "strided")
    }

    /// The alignment in bytes of a contiguous vector access from flat element `flat` (at lane 0). On the
    /// GPU every global buffer starts 16-byte aligned, so a start that is a multiple of `p` elements gives
    /// `p * size` bytes, up to 16 (NVPTX splits a vector access into its widest aligned pieces, so this
    /// is what makes `ld.global.v4`). On the CPU the caller's buffers may be aligned to an element only.
    pub(crate) fn vector_align(&self, b: BufId, flat: &Expr, w: u32) -> u32 {
        let size = self.kernel.buffer(b).elem.size() as u32;
        let Some(l) = self
            .lane_var()
            .filter(|_| self.gpu && self.kernel.buffer(b).space == Space::Global)
        else {
            return size;
        };
        // A constant the start (in elements) is always a multiple of.
        let start = mlopt_kir::analysis::factor(&flat.subst(l, &Expr::int(0)));
        let mut align = size;
        while align * 2 <= (size * w).min(16) && start % i64::from(align * 2 / size) == 0 {
            align *= 2;
        }
        align
    }

    pub(crate) fn load(&mut self, b: BufId, index: &[Expr]) -> Ret<BasicValueEnum<'c>> {
        if let Some((fb, fix, v)) = &self.forced {
            if *fb == b && fix[..] == *index {
                return Ok(*v);
            }
        }
        let elem = self.kernel.buffer(b).elem;
        let t = ty(self.ctx, elem);
        let flat = self.flat(b, index);
        if let Some(p) = self.private.get(&b).copied() {
            let w = self.width.unwrap_or(1);
            let i = self.scalar_index(&flat)?;
            // SAFETY: in bounds by verification.
            let ptr = unsafe {
                self.builder.build_in_bounds_gep(
                    vector_type(reg_ty(self.ctx, elem), w),
                    p,
                    &[i],
                    "lp",
                )?
            };
            return Ok(self.builder.build_load(
                vector_type(reg_ty(self.ctx, elem), w),
                ptr,
                "priv",
            )?);
        }
        let stride = self.lane_stride(&flat);
        // Lanes neither uniform nor at a constant stride may interleave rows.
        let interleave = match (self.width, stride) {
            (Some(w), None) if !self.gpu => self.interleaved(&flat, w),
            _ => None,
        };
        if let (Some(w), Some(1)) = (self.width, stride) {
            if let Some(wide) = self.masked(b, w) {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                return self.masked_load(p, elem, (w, wide));
            }
        }
        if let (Some(w), None, None) = (self.width, stride, interleave) {
            if let Some(runs) = self.row_runs(b, &flat, w) {
                return self.rows_load(b, &flat, elem, w, runs);
            }
        }
        match (self.width, stride) {
            (None, _) | (Some(_), Some(0)) => {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                let v = self.builder.build_load(t, p, "ld")?;
                let v = self.mem_to_reg(v, elem)?;
                self.widen(v)
            }
            (Some(w), Some(1)) => {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                let v = self.builder.build_load(vector_type(t, w), p, "vld")?;
                let align = self.vector_align(b, &flat, w);
                v.as_instruction_value().map(|ins| ins.set_alignment(align));
                self.mem_to_reg(v, elem)
            }
            (Some(w), Some(st @ 2..=4)) if !self.gpu => {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                let picked = self.strided_row(p, elem, w, st as u32)?;
                self.unshuffled(picked, elem, w)
            }
            (Some(w), None) if interleave.is_some() => {
                // Lanes that alternate between r contiguous rows (`x[2 k + q % 2, j + q / 2]`: a bf16
                // block's k-pairs packed from two channel rows): one load of w / r elements per row,
                // and one shuffle that interleaves them.
                let (r, q) = interleave.ok_or_else(|| err("interleave"))?;
                let part = w / r;
                let lt = self.shuffle_elem(elem);
                let mut rows = vec![];
                for v in 0..r {
                    let at = flat.subst(q, &Expr::add(Expr::var(q), Expr::int(i64::from(v))));
                    let i = self.scalar_index(&at)?;
                    let ptr = self.elem_ptr(b, i)?;
                    let x = self.load_unaligned(vector_type(lt, part), ptr, elem.size() as u32)?;
                    rows.push(x.into_vector_value());
                }
                let concat = |g: &mut Self, a: VectorValue<'c>, b| {
                    g.shuffle((a, b), 0..a.get_type().get_size() * 2, "cat")
                };
                // Rows concatenated in order (pairs for r = 4), then lane l is row l % r, element l / r.
                let (left, right) = if r == 2 {
                    (rows[0], rows[1])
                } else {
                    (
                        concat(self, rows[0], rows[1])?,
                        concat(self, rows[2], rows[3])?,
                    )
                };
                let mask = (0..w).map(|l| (l % r) * part + l / r);
                let mixed = self.shuffle((left, right), mask, "interleaved")?;
                self.unshuffled(mixed, elem, w)
            }
            (Some(w), _) => {
                let idx = self.eval(&flat)?.into_vector_value();
                let mut acc = vector_type(t, w).const_zero().as_basic_value_enum();
                for lane in 0..w {
                    let i = self
                        .builder
                        .build_extract_element(
                            idx,
                            self.ctx.i32_type().const_int(lane as u64, false),
                            "ix",
                        )?
                        .into_int_value();
                    let p = self.elem_ptr(b, i)?;
                    let x = self.builder.build_load(t, p, "gld")?;
                    acc = self
                        .builder
                        .build_insert_element(
                            acc.into_vector_value(),
                            x,
                            self.ctx.i32_type().const_int(lane as u64, false),
                            "g",
                        )?
                        .into();
                }
                self.mem_to_reg(acc, elem)
            }
        }
    }

    pub(crate) fn store(&mut self, b: BufId, index: &[Expr], value: &Expr) -> Ret<()> {
        let elem = self.kernel.buffer(b).elem;
        let t = ty(self.ctx, elem);
        let v = self.eval(value)?;
        let flat = self.flat(b, index);
        if let Some(p) = self.private.get(&b).copied() {
            let w = self.width.unwrap_or(1);
            let i = self.scalar_index(&flat)?;
            let v = self.widen(v)?;
            // SAFETY: in bounds by verification.
            let ptr = unsafe {
                self.builder.build_in_bounds_gep(
                    vector_type(reg_ty(self.ctx, elem), w),
                    p,
                    &[i],
                    "sp",
                )?
            };
            self.builder.build_store(ptr, v)?;
            return Ok(());
        }
        let stride = self.lane_stride(&flat);
        if let (Some(w), Some(1)) = (self.width, stride) {
            if let Some(wide) = self.masked(b, w) {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                let v = self.widen(v)?;
                return self.masked_store(p, elem, (w, wide), v);
            }
        }
        match (self.width, stride) {
            (None, _) => {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                let v = self.reg_to_mem(v, elem)?;
                self.builder.build_store(p, v)?;
            }
            (Some(w), Some(1)) => {
                let i = self.scalar_index(&flat)?;
                let p = self.elem_ptr(b, i)?;
                let v = self.widen(v)?;
                let v = self.reg_to_mem(v, elem)?;
                let st = self.builder.build_store(p, v)?;
                st.set_alignment(self.vector_align(b, &flat, w))
                    .map_err(|e| err(e.to_string()))?;
            }
            (Some(w), _) => {
                let idx = self.eval(&flat)?;
                let v = self.widen(v)?;
                let v = self.reg_to_mem(v, elem)?.into_vector_value();
                if let (true, BasicValueEnum::VectorValue(ix)) = (self.scatters(elem), idx) {
                    return self.scatter(b, elem, ix, v);
                }
                for lane in 0..w {
                    let l = self.ctx.i32_type().const_int(lane as u64, false);
                    let i = if idx.is_vector_value() {
                        self.builder
                            .build_extract_element(idx.into_vector_value(), l, "ix")?
                            .into_int_value()
                    } else {
                        idx.into_int_value()
                    };
                    let p = self.elem_ptr(b, i)?;
                    let x = self.builder.build_extract_element(v, l, "sx")?;
                    self.builder.build_store(p, x)?;
                }
                let _ = t;
            }
        }
        Ok(())
    }

    /// Whether a strided store of `elem` lanes is one `llvm.masked.scatter` (AVX-512's `vscatter` for
    /// 32-bit elements on a CPU): a register tile whose lanes are channels stores each vector into NCHW
    /// with a stride of the map's size. Written lane by lane it was four IR instructions a lane (13,408
    /// stores in DenseNet-121's IR) and about half of LLVM's time on convolution-heavy models; the
    /// scatter ran as fast (ResNet-50, GoogLeNet, DenseNet-121, YOLO on Sapphire Rapids; Zen 4, whose
    /// scatters are slower, not measured). Without AVX-512, LLVM writes the lanes itself.
    fn scatters(&self, elem: Elem) -> bool {
        !self.gpu && elem.size() == 4
    }

    /// Stores lane l of `v` at element `ix[l]` of `b`.
    fn scatter(
        &mut self,
        b: BufId,
        elem: Elem,
        ix: VectorValue<'c>,
        v: VectorValue<'c>,
    ) -> Ret<()> {
        let (base, t) = self.base(b)?;
        let w = v.get_type().get_size();
        // SAFETY: every lane's index is in bounds by verification. LLVM's GEP takes a vector of
        // indices (and then gives a vector of pointers), which inkwell's signature does not spell: the
        // vector goes in as the value it is.
        let ptrs = unsafe {
            let ix = IntValue::new(ix.as_value_ref());
            self.builder.build_in_bounds_gep(t, base, &[ix], "ps")?
        };
        let pt = self
            .ctx
            .ptr_type(inkwell::AddressSpace::default())
            .vec_type(w);
        let all = self.lanes_mask(w, w);
        self.masked_write("llvm.masked.scatter", v, (ptrs, pt.into()), elem, all)
    }

    /// `llvm.masked.store` or `llvm.masked.scatter` (`name`) of `v` at `to` (a pointer, or a vector of
    /// pointers, of the type given): the lanes `mask` picks, each aligned as an `elem`.
    fn masked_write(
        &mut self,
        name: &str,
        v: VectorValue<'c>,
        (to, to_ty): (PointerValue<'c>, BasicTypeEnum<'c>),
        elem: Elem,
        mask: VectorValue<'c>,
    ) -> Ret<()> {
        let f = Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, &[v.get_type().into(), to_ty]))
            .ok_or_else(|| err(format!("no {name}")))?;
        let align = self.elem_align(elem);
        self.builder
            .build_call(f, &[v.into(), to.into(), align.into(), mask.into()], "")?;
        Ok(())
    }

    /// The register width a contiguous `w`-lane access of buffer `b` runs at as one masked AVX-512
    /// access (`masked_load`, `masked_store`), where it does: the next power of two, where `w` is not
    /// one and that fits a 64-byte register (16- and 32-bit elements), for a buffer in memory. LLVM
    /// splits an odd-width access into power-of-two pieces and, where the value then feeds a 16-lane
    /// instruction, rebuilds it lane by lane: a 12-lane row tail of a max pool (3 x 3 over 28 columns)
    /// took twice its 16-lane part. Not a local's: SROA keeps a register tile's accumulators in
    /// registers only through plain loads and stores (a 3x3 convolution's 7-lane tile ran 8x slower
    /// masked).
    fn masked(&self, b: BufId, w: u32) -> Option<u32> {
        let buf = self.kernel.buffer(b);
        let (wide, size) = (w.next_power_of_two(), buf.elem.size() as u32);
        (self.avx512
            && !self.gpu
            && buf.space == Space::Global
            && w > 1
            && wide != w
            && matches!(size, 2 | 4)
            && wide * size <= 64)
            .then_some(wide)
    }

    /// `w` contiguous elements of `elem` from `p` by one masked load of `wide` lanes (`masked`; the
    /// lanes past `w` neither read nor kept), as `elem`'s register value.
    fn masked_load(
        &mut self,
        p: PointerValue<'c>,
        elem: Elem,
        (w, wide): (u32, u32),
    ) -> Ret<BasicValueEnum<'c>> {
        let vt = vector_type(self.shuffle_elem(elem), wide).into_vector_type();
        let mask = self.lanes_mask(w, wide);
        let v = self.masked_load_lanes(p, elem, mask, vt.get_poison())?;
        let v = self.shuffle((v, v), 0..w, "mlanes")?;
        self.unshuffled(v, elem, w)
    }

    /// `w` lanes of register value `v` (of `elem`) stored contiguously at `p` by one masked store of
    /// `wide` lanes (`masked`).
    fn masked_store(
        &mut self,
        p: PointerValue<'c>,
        elem: Elem,
        (w, wide): (u32, u32),
        v: BasicValueEnum<'c>,
    ) -> Ret<()> {
        let v = self.reg_to_mem(v, elem)?;
        let lt = self.shuffle_elem(elem);
        let v = self
            .builder
            .build_bit_cast(v, vector_type(lt, w), "mst")?
            .into_vector_value();
        let v = self.padded(v, wide)?;
        let mask = self.lanes_mask(w, wide);
        self.masked_write("llvm.masked.store", v, (p, p.get_type().into()), elem, mask)
    }

    /// One `llvm.masked.load` from `p` of `keep`'s type (`elem`s in the type `shuffle_elem` gives):
    /// the lanes `mask` picks read, the others `keep`'s (never read, so never a fault).
    fn masked_load_lanes(
        &mut self,
        p: PointerValue<'c>,
        elem: Elem,
        mask: VectorValue<'c>,
        keep: VectorValue<'c>,
    ) -> Ret<VectorValue<'c>> {
        let f = Intrinsic::find("llvm.masked.load")
            .and_then(|i| {
                i.get_declaration(self.module, &[keep.get_type().into(), p.get_type().into()])
            })
            .ok_or_else(|| err("no llvm.masked.load"))?;
        let args = [
            p.into(),
            self.elem_align(elem).into(),
            mask.into(),
            keep.into(),
        ];
        Ok(self
            .builder
            .build_call(f, &args, "mld")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| err("masked load returned nothing"))?
            .into_vector_value())
    }

    /// A masked access's alignment operand: one element (the caller's buffers promise no more).
    fn elem_align(&self, elem: Elem) -> IntValue<'c> {
        self.ctx
            .i32_type()
            .const_int(u64::from(elem.size() as u32), false)
    }

    /// Where the lanes of a `w`-lane load of `b` at `flat` walk a plane's rows
    /// (`mlopt_kir::analysis::row_runs`: an im2col copy's 16 positions across a 28-wide output row
    /// read at the padded input's 30). AVX-512 only (masked loads), 16- and 32-bit elements, lanes
    /// in at most four rows.
    fn row_runs(&self, b: BufId, flat: &Expr, w: u32) -> Option<RowRuns> {
        let q = self.lane_var()?;
        let size = self.kernel.buffer(b).elem.size();
        if !self.avx512 || self.gpu || !matches!(size, 2 | 4) || self.reads_private(flat) {
            return None;
        }
        mlopt_kir::analysis::row_runs(self.kernel, flat, q)
            .filter(|r| Self::rows_spanned(r.width, w) <= 4)
    }

    /// How many rows of `width` columns `w` consecutive lanes can span.
    fn rows_spanned(width: i64, w: u32) -> i64 {
        (width - 1 + i64::from(w) - 1) / width + 1
    }

    /// A `w`-lane load whose lanes run across row ends (`row_runs`): for each row the lanes can
    /// reach, the lanes whose column lands in it, read from lane 0's element moved on by that many
    /// rows' jumps: one masked load, or at a step of 2 two (the span's halves, only the picked
    /// elements read) and a shuffle of their even elements. LLVM gathered such a load element by
    /// element (`vgatherqps`): ResNet-50's fp32 3x3 convolutions on 28x28 maps spent a fifth of their
    /// time copying windows.
    fn rows_load(
        &mut self,
        b: BufId,
        flat: &Expr,
        elem: Elem,
        w: u32,
        runs: RowRuns,
    ) -> Ret<BasicValueEnum<'c>> {
        let i = self.scalar_index(flat)?;
        let col = self.scalar_index(&Expr::bin(BinOp::Rem, runs.pos, Expr::int(runs.width)))?;
        let i64t = self.ctx.i64_type();
        // Lane l's column counted from lane 0's row start: col + l.
        let lanes: Vec<_> = (0..w)
            .map(|l| i64t.const_int(u64::from(l), false))
            .collect();
        let lanes = inkwell::types::VectorType::const_vector(&lanes);
        let col = self.splat(col.into(), w)?.into_vector_value();
        let at = self.builder.build_int_add(lanes, col, "at")?;
        let vt = vector_type(self.shuffle_elem(elem), w).into_vector_type();
        let p0 = self.elem_ptr(b, i)?;
        let bound = |r: i64| {
            let c = i64t.const_int((r * runs.width) as u64, false);
            inkwell::types::VectorType::const_vector(&vec![c; w as usize])
        };
        let step = runs.step as u32;
        let mut v = vt.get_poison();
        for r in 0..Self::rows_spanned(runs.width, w) {
            let below =
                self.builder
                    .build_int_compare(IntPredicate::ULT, at, bound(r + 1), "end")?;
            let m = if r == 0 {
                below
            } else {
                let from =
                    self.builder
                        .build_int_compare(IntPredicate::UGE, at, bound(r), "start")?;
                self.builder.build_and(below, from, "row")?
            };
            // SAFETY: a plain GEP (not `inbounds`: where no lane is in row r, it may point past
            // `b`); only the picked elements of row r's lanes are read through it, inside `b`.
            let at_part = |g: &mut Self, part: u32| -> Ret<PointerValue<'c>> {
                let off = r * runs.jump + i64::from(part * w);
                Ok(unsafe {
                    g.builder.build_gep(
                        vt.get_element_type(),
                        p0,
                        &[i64t.const_int(off as u64, false)],
                        "pr",
                    )?
                })
            };
            if step == 1 {
                let p = at_part(self, 0)?;
                v = self.masked_load_lanes(p, elem, m, v)?;
                continue;
            }
            // Element e of the 2w-element span is lane e / 2's where e is even: each half's mask
            // picks those of m's lanes (a false lane elsewhere).
            let none = self.ctx.bool_type().vec_type(w).const_zero();
            let mut halves = Vec::with_capacity(2);
            for part in 0..2 {
                let picks = (0..w).map(|j| {
                    let e = part * w + j;
                    if e.is_multiple_of(step) {
                        e / step
                    } else {
                        w
                    }
                });
                let mask = self.shuffle((m, none), picks, "pick")?;
                let p = at_part(self, part)?;
                halves.push(self.masked_load_lanes(p, elem, mask, vt.get_poison())?);
            }
            let picked = self.shuffle((halves[0], halves[1]), (0..w).map(|l| l * step), "even")?;
            v = self
                .builder
                .build_select(m, picked, v, "rows")?
                .into_vector_value();
        }
        self.unshuffled(v, elem, w)
    }

    /// The mask of the first `w` of `wide` lanes.
    fn lanes_mask(&self, w: u32, wide: u32) -> VectorValue<'c> {
        let b = self.ctx.bool_type();
        let lanes: Vec<_> = (0..wide)
            .map(|l| b.const_int(u64::from(l < w), false))
            .collect();
        inkwell::types::VectorType::const_vector(&lanes)
    }

    /// Memory -> register form (i8 bools become i1).
    pub(crate) fn mem_to_reg(&mut self, v: BasicValueEnum<'c>, e: Elem) -> Ret<BasicValueEnum<'c>> {
        if e != Elem::Bool {
            return Ok(v);
        }
        let zero = const_like(self.ctx, v, 0.0, Elem::U8);
        int_cmp(&self.builder, IntPredicate::NE, v, zero)
    }

    pub(crate) fn reg_to_mem(&mut self, v: BasicValueEnum<'c>, e: Elem) -> Ret<BasicValueEnum<'c>> {
        if e != Elem::Bool {
            return Ok(v);
        }
        let t = match v {
            BasicValueEnum::VectorValue(x) => self
                .ctx
                .i8_type()
                .vec_type(x.get_type().get_size())
                .as_basic_type_enum(),
            _ => self.ctx.i8_type().into(),
        };
        Ok(self
            .builder
            .build_cast(inkwell::values::InstructionOpcode::ZExt, v, t, "b8")?)
    }

    /// A scalar broadcast to the vector width when emitting a vector loop.
    pub(crate) fn widen(&mut self, v: BasicValueEnum<'c>) -> Ret<BasicValueEnum<'c>> {
        match self.width {
            Some(w) if !v.is_vector_value() => self.splat(v, w),
            _ => Ok(v),
        }
    }

    /// The scalar `v` in all `w` lanes of a vector.
    pub(crate) fn splat(&mut self, v: BasicValueEnum<'c>, w: u32) -> Ret<BasicValueEnum<'c>> {
        let undef = vector_type(v.get_type(), w).into_vector_type().get_undef();
        let one =
            self.builder
                .build_insert_element(undef, v, self.ctx.i32_type().const_zero(), "s")?;
        let mask = self.ctx.i32_type().vec_type(w).const_zero();
        Ok(self
            .builder
            .build_shuffle_vector(one, undef, mask, "splat")?
            .into())
    }
}
