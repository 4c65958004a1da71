//! The kernel IR interpreter: runs any kernel, and whole programs, on the CPU. Memory is bytes, exactly as
//! compiled code sees it: the activation arena is one byte region, so aliasing and in-place reuse from the
//! memory plan are exercised, not assumed. Float arithmetic is done in f64 and rounded to the expression's
//! element type after every operation (exact for f32 +, -, *, /, sqrt and fma-free chains).
//!
//! Every loop kind runs as a serial loop, including GPU blocks and threads (`gpu.rs` gives the form of a
//! GPU kernel). Each thread loop runs to completion before the next statement, as a barrier between them
//! guarantees on the device; `local` buffers of a GPU kernel have one copy per thread. What the device
//! would *not* guarantee is reported as a race: within one block, a thread reading or writing a shared
//! element another thread wrote (or read) since the last barrier; across the grid, any thread reading or
//! writing a global element another thread wrote during the kernel (blocks cannot wait for each other).

mod scalar;

use crate::ir::*;
use crate::program::*;
use scalar::*;
pub use scalar::{bf16_from_f32, f32_odd, tf32};

#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("kernel @{kernel}: access to %{buf} at {index:?} outside {dims:?}")]
    OutOfBounds {
        kernel: String,
        buf: String,
        index: Vec<i64>,
        dims: Vec<u64>,
    },
    #[error("program: {0}")]
    Program(String),
    /// A check step found invalid input data; the step's message.
    #[error("{0}")]
    Data(String),
    #[error("kernel @{kernel}: race on %{buf} at element {element}: {what}")]
    Race {
        kernel: String,
        buf: String,
        element: u64,
        what: String,
    },
}

type Result<T> = std::result::Result<T, InterpError>;

/// Where each buffer of a running kernel lives: (memory region, byte offset).
struct Frame<'k> {
    k: &'k Kernel,
    at: Vec<(usize, usize)>,
    strides: Vec<Vec<u64>>,
    vars: Vec<i64>,
    gpu: Option<Gpu>,
}

/// The state of an emulated GPU kernel: which block and thread runs, and who touched what.
#[derive(Default)]
struct Gpu {
    block: i64,
    /// The running thread, inside a thread loop, and that loop's variable.
    thread: Option<i64>,
    thread_var: Option<Var>,
    /// Bytes of one thread's copy of each buffer (0 for buffers that are not per thread).
    per_thread: Vec<usize>,
    /// Shared elements touched since the last barrier: (buffer, element) -> (writer, a reader).
    shared: std::collections::HashMap<(u32, u64), (Option<i64>, Option<i64>)>,
    /// Global bytes written during the kernel (region, byte) -> (block, thread).
    global: std::collections::HashMap<(usize, usize), (i64, i64)>,
    /// Shared elements an asynchronous copy has yet to write: (buffer, element) -> the copying thread.
    pending: std::collections::HashMap<(u32, u64), i64>,
    /// Each thread's copies in flight, written at its next wait.
    inflight: std::collections::HashMap<i64, Vec<Landing>>,
}

/// One element of a `cp.async` in flight: where it lands (region, byte), its bytes, and which shared
/// element it is.
struct Landing {
    region: usize,
    byte: usize,
    data: Vec<u8>,
    buf: BufId,
    element: u64,
}

/// Runs one kernel. `regions` are byte regions; `args[i]` = (region, byte offset) of the i-th parameter.
/// Local and shared buffers get fresh zeroed regions for the call.
pub fn run_kernel(k: &Kernel, regions: &mut Vec<Vec<u8>>, args: &[(usize, usize)]) -> Result<()> {
    let base = regions.len();
    let mut at = Vec::with_capacity(k.bufs.len());
    let mut params = args.iter();
    let launch = crate::gpu::launch(k);
    let copies = launch.map_or(1, |l| l.block.max(1)) as usize;
    let mut per_thread = Vec::with_capacity(k.bufs.len());
    for b in &k.bufs {
        let bytes = (b.numel() * b.elem.size()) as usize;
        per_thread.push(if b.space == Space::Local { bytes } else { 0 });
        if b.space == Space::Global {
            let a = params
                .next()
                .ok_or_else(|| InterpError::Program(format!("@{}: too few arguments", k.name)))?;
            at.push(*a);
        } else {
            let n = if b.space == Space::Local {
                bytes * copies
            } else {
                bytes
            };
            regions.push(vec![0u8; n]);
            at.push((regions.len() - 1, 0));
        }
    }
    let strides = k.bufs.iter().map(|b| b.strides()).collect();
    let gpu = launch.map(|_| Gpu {
        per_thread,
        ..Gpu::default()
    });
    let mut f = Frame {
        k,
        at,
        strides,
        vars: vec![0; k.vars.len()],
        gpu,
    };
    let r = f.block(&k.body, regions);
    regions.truncate(base);
    r
}

impl Frame<'_> {
    fn block(&mut self, body: &[Stmt], m: &mut Vec<Vec<u8>>) -> Result<()> {
        for s in body {
            self.stmt(s, m)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt, m: &mut Vec<Vec<u8>>) -> Result<()> {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                for i in 0..*extent as i64 {
                    self.vars[var.0 as usize] = i;
                    if let Some(g) = &mut self.gpu {
                        match kind {
                            LoopKind::GpuBlock(_) => {
                                g.block = i;
                                g.shared.clear();
                            }
                            LoopKind::GpuThread(_) => {
                                g.thread = Some(i);
                                g.thread_var = Some(*var);
                            }
                            _ => {}
                        }
                    }
                    self.block(body, m)?;
                    if matches!(kind, LoopKind::GpuBlock(_)) {
                        self.all_landed()?;
                    }
                }
                if let (Some(g), LoopKind::GpuThread(_)) = (&mut self.gpu, kind) {
                    g.thread = None;
                }
            }
            Stmt::Store { buf, index, value } => {
                let v = self.eval(value, m)?;
                let (r, off, t, element) = self.locate(*buf, index, m)?;
                self.touch(*buf, element, r, off, true)?;
                let n = t.size() as usize;
                encode(t, v, &mut m[r][off..off + n]);
            }
            Stmt::If { cond, then } => {
                if self.eval(cond, m)?.i() != 0 {
                    self.block(then, m)?;
                }
            }
            Stmt::Barrier => {
                if let Some(g) = &mut self.gpu {
                    g.shared.clear();
                }
            }
            Stmt::WarpMma { c, a, b } => self.warp_mma(c, a, b, m)?,
            Stmt::CopyAsync {
                dst,
                src,
                from,
                lanes,
                valid,
            } => self.copy_async(dst, *src, from, *lanes, valid.as_ref(), m)?,
            Stmt::WarpReduce { buf, op } => self.warp_reduce(*buf, *op, m)?,
            // A hint: nothing to read or change.
            Stmt::Prefetch { .. } => {}
            Stmt::AsyncWait => {
                let Some(thread) = self.gpu.as_ref().and_then(|g| g.thread) else {
                    return Err(InterpError::Program(format!(
                        "@{}: cp.async.wait_all outside a thread loop",
                        self.k.name
                    )));
                };
                let done = self
                    .gpu
                    .as_mut()
                    .and_then(|g| g.inflight.remove(&thread))
                    .unwrap_or_default();
                for c in done {
                    if let Some(g) = &mut self.gpu {
                        g.pending.remove(&(c.buf.0, c.element));
                    }
                    // The copy writes now, as far as other threads can tell.
                    self.touch(c.buf, c.element, c.region, c.byte, true)?;
                    m[c.region][c.byte..c.byte + c.data.len()].copy_from_slice(&c.data);
                }
            }
            Stmt::Mma {
                m: rows,
                n,
                k,
                c,
                a,
                b,
                acc,
                ahead: _,
            } => {
                let at = |x: &crate::Block, r: u64, col: u64| {
                    x.index(Expr::int(r as i64), Expr::int(col as i64))
                };
                let integer = self.k.buffer(a.buf).elem == Elem::I16;
                for i in 0..*rows {
                    for j in 0..*n {
                        let c_at = at(c, i, j);
                        let old = if *acc {
                            Some(self.eval(&Expr::load(c.buf, c_at.clone()), m)?)
                        } else {
                            None
                        };
                        // i16 products are exact in i32 and their sums wrap: added in any grouping
                        // (the instruction's pairs first) they give the same bits, so one by one.
                        let (mut si, mut sf) = match old {
                            Some(v) => (v.i() as i32, v.f() as f32),
                            None => (0i32, 0.0f32),
                        };
                        for p in 0..*k {
                            let x = self.eval(&Expr::load(a.buf, at(a, i, p)), m)?;
                            let y =
                                self.eval(&Expr::load(b.buf, at(b, p / 2, 2 * j + p % 2)), m)?;
                            if integer {
                                si = si.wrapping_add((x.i() as i32).wrapping_mul(y.i() as i32));
                            } else {
                                sf += x.f() as f32 * y.f() as f32;
                            }
                        }
                        let sum = if integer {
                            V::I(si as i64)
                        } else {
                            V::F(sf as f64)
                        };
                        let (r, off, t, _) = self.locate(c.buf, &c_at, m)?;
                        encode(t, sum, &mut m[r][off..off + 4]);
                    }
                }
            }
        }
        Ok(())
    }

    /// One thread's side of a warp's `mma.sync` (`ir.rs` gives the fragment layout), after checking what
    /// the hardware needs: the whole warp on the same blocks, and (for `ldmatrix`) 16-byte aligned rows.
    fn warp_mma(&mut self, c: &Block, a: &Block, b: &Block, m: &mut Vec<Vec<u8>>) -> Result<()> {
        let k = self.k;
        let fail = |what: String| InterpError::Program(format!("@{}: mma.sync {what}", k.name));
        let (Some(thread), Some(tv)) = (
            self.gpu.as_ref().and_then(|g| g.thread),
            self.gpu.as_ref().and_then(|g| g.thread_var),
        ) else {
            return Err(fail("outside a thread loop".into()));
        };
        let lane = thread % 32;
        let mut starts = |f: &mut Self, t: i64| -> Result<Vec<i64>> {
            f.vars[tv.0 as usize] = t;
            let mut out = Vec::new();
            for x in [c, a, b] {
                for e in &x.at {
                    out.push(f.eval(e, m)?.i());
                }
            }
            Ok(out)
        };
        let first = starts(self, thread - lane)?;
        let mine = starts(self, thread)?;
        if first != mine {
            return Err(fail(format!(
                "blocks differ within a warp: thread {thread} has {mine:?}, thread {} {first:?}",
                thread - lane
            )));
        }
        let t = k.buffer(a.buf).elem;
        let depth = warp_mma_k(t);
        if t != Elem::F32 {
            for x in [a, b] {
                let (_, _, _, lin) = self.locate(x.buf, &x.at, m)?;
                let strides = &self.strides[x.buf.0 as usize];
                if !lin.is_multiple_of(8) || !strides[strides.len() - 2].is_multiple_of(8) {
                    return Err(fail(format!(
                        "block %{}{:?}: ldmatrix rows must start on 16 bytes",
                        k.buffer(x.buf).name,
                        x.at
                    )));
                }
            }
        }
        let input = |x: f64| {
            if t == Elem::F32 {
                tf32(x as f32) as f64
            } else {
                x
            }
        };
        let int = |v: i64| Expr::int(v);
        for q in 0..4 {
            let (row, col) = (lane / 4 + 8 * (q / 2), 2 * (lane % 4) + q % 2);
            // Products of the inputs are exact; the sum is kept wide and rounded once.
            let mut sum = 0.0f64;
            for p in 0..depth as i64 {
                let x = self
                    .eval(&Expr::load(a.buf, a.index(int(row), int(p))), m)?
                    .f();
                let y = self
                    .eval(&Expr::load(b.buf, b.index(int(p), int(col))), m)?
                    .f();
                sum += input(x) * input(y);
            }
            let at = c.index(int(0), int(q));
            let old = self.eval(&Expr::load(c.buf, at.clone()), m)?.f();
            let (r, off, _, _) = self.locate(c.buf, &at, m)?;
            encode(Elem::F32, V::F(old + sum), &mut m[r][off..off + 4]);
        }
        Ok(())
    }

    /// One thread's `cp.async`: reads the source now (it does not change during the kernel, or the race
    /// check says so) and writes the destination at the thread's next wait. The hardware needs both ends
    /// aligned to the copy's size.
    fn copy_async(
        &mut self,
        dst: &Block,
        src: BufId,
        from: &Expr,
        lanes: u64,
        valid: Option<&Expr>,
        m: &mut Vec<Vec<u8>>,
    ) -> Result<()> {
        let k = self.k;
        let fail = |what: String| {
            InterpError::Program(format!(
                "@{}: cp.async %{} <- %{}: {what}",
                k.name,
                k.buffer(dst.buf).name,
                k.buffer(src).name
            ))
        };
        let Some(thread) = self.gpu.as_ref().and_then(|g| g.thread) else {
            return Err(fail("outside a thread loop".into()));
        };
        let on = match valid {
            Some(c) => self.eval(c, m)?.i() != 0,
            None => true,
        };
        let size = k.buffer(dst.buf).elem.size() as usize;
        let bytes = size * lanes as usize;
        // The first element of each end, checked for alignment and for room for the whole copy.
        let check = |b: BufId,
                     r: usize,
                     byte: usize,
                     element: i64,
                     what: &str|
         -> Result<(usize, usize, u64)> {
            if element < 0 || element as u64 + lanes > k.buffer(b).numel() {
                return Err(fail(format!(
                    "{what} elements {element}.. leave %{}",
                    k.buffer(b).name
                )));
            }
            if !byte.is_multiple_of(bytes) {
                return Err(fail(format!(
                    "{what} byte {byte} is not aligned to the {bytes}-byte copy"
                )));
            }
            Ok((r, byte, element as u64))
        };
        let from = if on {
            let element = self.eval(from, m)?.i();
            let (r, base) = self.at[src.0 as usize];
            Some(check(
                src,
                r,
                base + (element.max(0) as usize) * size,
                element,
                "source",
            )?)
        } else {
            None
        };
        let (region, to, element) = {
            let (r, byte, _, element) = self.locate(dst.buf, &dst.at, m)?;
            check(dst.buf, r, byte, element as i64, "destination")?
        };
        let mut copies = Vec::with_capacity(lanes as usize);
        for l in 0..lanes {
            let data = match from {
                Some((r, byte, element)) => {
                    let byte = byte + l as usize * size;
                    self.touch(src, element + l, r, byte, false)?;
                    m[r][byte..byte + size].to_vec()
                }
                None => vec![0; size],
            };
            let byte = to + l as usize * size;
            self.touch(dst.buf, element + l, region, byte, true)?;
            copies.push(Landing {
                region,
                byte,
                data,
                buf: dst.buf,
                element: element + l,
            });
        }
        if let Some(g) = &mut self.gpu {
            for c in &copies {
                g.pending.insert((c.buf.0, c.element), thread);
            }
            g.inflight.entry(thread).or_default().extend(copies);
        }
        Ok(())
    }

    /// A warp reduction over every warp of the block: each thread's copy of the local scalar `buf`, combined
    /// in the butterfly order of `shfl.sync.bfly`.
    fn warp_reduce(&mut self, buf: BufId, op: BinOp, m: &mut [Vec<u8>]) -> Result<()> {
        let k = self.k;
        let (Some(g), Some(l)) = (&self.gpu, crate::gpu::launch(k)) else {
            return Err(InterpError::Program(format!(
                "@{}: warp.reduce outside a GPU kernel",
                k.name
            )));
        };
        if g.thread.is_some() {
            return Err(InterpError::Program(format!(
                "@{}: warp.reduce inside a thread loop",
                k.name
            )));
        }
        let t = k.buffer(buf).elem;
        let size = t.size() as usize;
        let (r, base) = self.at[buf.0 as usize];
        let per = g.per_thread[buf.0 as usize];
        let at = |lane: u64| base + per * lane as usize;
        for w in 0..l.block / 32 {
            let mut x: Vec<V> = (0..32)
                .map(|i| decode(t, &m[r][at(32 * w + i)..at(32 * w + i) + size]))
                .collect();
            for d in [16, 8, 4, 2, 1] {
                x = (0..32).map(|i| binary(op, x[i], x[i ^ d], t)).collect();
            }
            for (i, v) in x.into_iter().enumerate() {
                let a = at(32 * w + i as u64);
                encode(t, v, &mut m[r][a..a + size]);
            }
        }
        Ok(())
    }

    /// Every asynchronous copy of the block has been waited for.
    fn all_landed(&self) -> Result<()> {
        match self.gpu.as_ref().and_then(|g| g.pending.iter().next()) {
            Some(((b, element), thread)) => Err(InterpError::Program(format!(
                "@{}: thread {thread}'s cp.async to %{} element {element} is never waited for (cp.async.wait_all)",
                self.k.name, self.k.bufs[*b as usize].name
            ))),
            None => Ok(()),
        }
    }

    /// Where element `index` of `b` is: (region, byte, element type, row-major element number).
    fn locate(
        &mut self,
        b: BufId,
        index: &[Expr],
        m: &mut Vec<Vec<u8>>,
    ) -> Result<(usize, usize, Elem, u64)> {
        let buf = self.k.buffer(b);
        let mut ix = Vec::with_capacity(index.len());
        for e in index {
            ix.push(self.eval(e, m)?.i());
        }
        let oob = ix.len() != buf.dims.len()
            || ix
                .iter()
                .zip(&buf.dims)
                .any(|(i, d)| *i < 0 || *i as u64 >= *d);
        if oob {
            return Err(InterpError::OutOfBounds {
                kernel: self.k.name.clone(),
                buf: buf.name.clone(),
                index: ix,
                dims: buf.dims.clone(),
            });
        }
        let lin: u64 = ix
            .iter()
            .zip(&self.strides[b.0 as usize])
            .map(|(i, s)| *i as u64 * s)
            .sum();
        let (r, mut off) = self.at[b.0 as usize];
        if let Some(g) = &self.gpu {
            off += g.per_thread[b.0 as usize] * g.thread.unwrap_or(0) as usize;
        }
        let byte = off + (lin * buf.elem.size()) as usize;
        if byte + buf.elem.size() as usize > m[r].len() {
            return Err(InterpError::Program(format!(
                "@{}: %{} bound past the end of its memory",
                self.k.name, buf.name
            )));
        }
        Ok((r, byte, buf.elem, lin))
    }

    /// Records a GPU thread's access and reports a race with another thread.
    fn touch(&mut self, b: BufId, element: u64, r: usize, byte: usize, write: bool) -> Result<()> {
        let Some(thread) = self.gpu.as_ref().and_then(|g| g.thread) else {
            return Ok(());
        };
        let space = self.k.buffer(b).space;
        if space == Space::Local {
            return Ok(());
        }
        let Some(g) = &mut self.gpu else {
            return Ok(());
        };
        let block = g.block;
        let what = match space {
            Space::Shared if g.pending.contains_key(&(b.0, element)) => {
                let copier = g.pending[&(b.0, element)];
                Some(format!(
                    "thread {thread} {} it before thread {copier}'s cp.async to it has landed (no cp.async.wait_all)",
                    if write { "writes" } else { "reads" }
                ))
            }
            Space::Shared => {
                let (writer, reader) = g.shared.entry((b.0, element)).or_insert((None, None));
                let clash = match (write, *writer, *reader) {
                    (_, Some(w), _) if w != thread => {
                        Some(format!("thread {thread} {} it after thread {w} wrote it, with no barrier between", if write { "writes" } else { "reads" }))
                    }
                    (true, _, Some(rd)) if rd != thread => Some(format!("thread {thread} writes it after thread {rd} read it, with no barrier between")),
                    _ => None,
                };
                if write {
                    *writer = Some(thread);
                } else {
                    // -1: read by several threads.
                    *reader = match *reader {
                        Some(x) if x != thread => Some(-1),
                        _ => Some(thread),
                    };
                }
                clash
            }
            _ => match g.global.get(&(r, byte)).copied() {
                Some((wb, wt)) if (wb, wt) != (block, thread) => Some(format!(
                    "block {block} thread {thread} {} it after block {wb} thread {wt} wrote it in the same kernel",
                    if write { "writes" } else { "reads" }
                )),
                _ => {
                    if write {
                        g.global.insert((r, byte), (block, thread));
                    }
                    None
                }
            },
        };
        match what {
            Some(what) => Err(InterpError::Race {
                kernel: self.k.name.clone(),
                buf: self.k.buffer(b).name.clone(),
                element,
                what,
            }),
            None => Ok(()),
        }
    }

    fn eval(&mut self, e: &Expr, m: &mut Vec<Vec<u8>>) -> Result<V> {
        Ok(match e {
            Expr::Int(v) => V::I(*v),
            Expr::Float(v, t) => round(*t, *v),
            Expr::Var(v) => V::I(self.vars[v.0 as usize]),
            Expr::Load(b, ix) => {
                let (r, off, t, element) = self.locate(*b, ix, m)?;
                self.touch(*b, element, r, off, false)?;
                decode(t, &m[r][off..])
            }
            Expr::Unary(o, a) => {
                let x = self.eval(a, m)?;
                unary(*o, x, a.elem(self.k))
            }
            Expr::Binary(o, a, b) => {
                let t = a.elem(self.k);
                let (x, y) = (self.eval(a, m)?, self.eval(b, m)?);
                binary(*o, x, y, t)
            }
            Expr::Fma(a, b, c) => {
                let t = a.elem(self.k);
                let (x, y, z) = (self.eval(a, m)?, self.eval(b, m)?, self.eval(c, m)?);
                round(t, x.f().mul_add(y.f(), z.f()))
            }
            Expr::Select(c, a, b) => {
                if self.eval(c, m)?.i() != 0 {
                    self.eval(a, m)?
                } else {
                    self.eval(b, m)?
                }
            }
            Expr::Cast(t, a) => {
                let from = a.elem(self.k);
                let x = self.eval(a, m)?;
                match (from.is_float(), x) {
                    (true, _) if !t.is_float() && *t != Elem::Bool => {
                        // Saturating, as the code generators' fptosi.sat / fptoui.sat (NaN -> 0).
                        let f = x.f();
                        let (lo, hi) = match t {
                            Elem::I8 => (i8::MIN as f64, i8::MAX as f64),
                            Elem::U8 => (0.0, u8::MAX as f64),
                            Elem::I16 => (i16::MIN as f64, i16::MAX as f64),
                            Elem::U16 => (0.0, u16::MAX as f64),
                            Elem::I32 => (i32::MIN as f64, i32::MAX as f64),
                            Elem::U32 => (0.0, u32::MAX as f64),
                            Elem::U64 => {
                                let f = if f.is_nan() { 0.0 } else { f.trunc() };
                                return Ok(V::I(f.clamp(0.0, u64::MAX as f64) as u64 as i64));
                            }
                            _ => (i64::MIN as f64, i64::MAX as f64),
                        };
                        int_to(
                            *t,
                            if f.is_nan() {
                                0
                            } else {
                                f.trunc().clamp(lo, hi) as i64
                            },
                        )
                    }
                    (_, V::I(i)) if from == Elem::U64 && t.is_float() => round(*t, i as u64 as f64),
                    (_, V::I(i)) => int_to(*t, i),
                    (_, V::F(f)) => round(*t, f),
                }
            }
        })
    }
}

/// A program's memory while it runs: region 0 is the arena, then inputs, outputs and weights.
pub fn run_program(p: &Program, inputs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
    if inputs.len() != p.inputs.len() {
        return Err(InterpError::Program(format!(
            "{} inputs given, {} expected",
            inputs.len(),
            p.inputs.len()
        )));
    }
    let mut m: Vec<Vec<u8>> = vec![vec![0u8; p.arena_bytes as usize]];
    for (io, data) in p.inputs.iter().zip(inputs) {
        let want = io.bytes();
        if data.len() != want {
            return Err(InterpError::Program(format!(
                "input {} has {} bytes, expected {want}",
                io.name,
                data.len()
            )));
        }
        m.push(data.clone());
    }
    let out0 = m.len();
    for io in &p.outputs {
        m.push(vec![0u8; io.bytes()]);
    }
    let w0 = m.len();
    for w in &p.weights {
        m.push(w.data.as_ref().clone());
    }
    for s in &p.steps {
        let k = p
            .kernels
            .get(s.kernel)
            .ok_or_else(|| InterpError::Program(format!("no kernel {}", s.kernel)))?;
        let at = |a: &Place| match a {
            Place::Arena(o) => (0, *o as usize),
            Place::Input(i) => (1 + i, 0),
            Place::Output(i) => (out0 + i, 0),
            Place::Weight(i) => (w0 + i, 0),
        };
        if !s.runs(|p| {
            let (b, o) = at(&p);
            m.get(b)?.get(o).copied()
        }) {
            continue;
        }
        let args: Vec<(usize, usize)> = s.args.iter().map(at).collect();
        run_kernel(k, &mut m, &args)?;
        if let Some(c) = &s.check {
            let at = c.flag as usize;
            let flag = m[0].get(at..at + 4).ok_or_else(|| {
                InterpError::Program(format!("@{}: check flag outside the arena", k.name))
            })?;
            if flag != [0; 4] {
                return Err(InterpError::Data(c.message.clone()));
            }
        }
    }
    Ok(m[out0..w0].to_vec())
}
