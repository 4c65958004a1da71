//! The register-tiled contraction schedule (MatMul, Gemm, 2-D Conv by implicit GEMM):
//!
//! ```text
//! for batch..                                   (parallel by the CPU schedule when it pays)
//!   for jo in 0..N/nr, io in 0..M/mr       (the last M % mr rows and N % nr columns: narrower tiles)
//!     acc[mr, nr] = 0                           (mr x nr/lanes vector registers)
//!     for k..                                   (the reduction: K, or Cin x KH x KW)
//!       unrolled ii in 0..mr, unrolled jv in 0..nr/lanes, vector jl in 0..lanes:
//!         acc[ii, jv*lanes+jl] = fma(a(io*mr+ii, k), b(k, jo*nr+jv*lanes+jl), acc[..])
//!     store acc (with the kernel's epilogue applied in registers)
//! ```
//!
//! (With `pack(a)` A is first copied into row tiles [M / mr, K, mr], so `a(io*mr+ii, k)` is read at
//! [io, k, ii]; with `pack(b)` the panels of B are copied before their tiles, a group at a time.)
//!
//! `a` is broadcast (one scalar per row), `b` is one vector load per `jv` reused by all `mr` rows: the
//! 6 x 64 AVX-512 micro-kernel keeps 24 accumulators, 4 B vectors and a broadcast in 29 of the 32 zmm
//! registers (6 x 16 with AVX2's 16 ymm). MatMul, Gemm, Winograd's GEMMs, convolutions and attention
//! are tiled through it from their algorithm form (`gemm.rs`, `conv.rs`, `attention.rs`).

use super::pack::{self, Group, PackedA};
use crate::error::Result;
use mlopt_kir::{BinOp, BufId, Elem, Expr, Kernel, LoopKind, Space, Stmt, Var};
use mlopt_target::CpuTarget;
// The micro-kernel model that picks the tile lives in the cost model, the one place kernel-level costs
// are estimated.
pub use mlopt_cost::tile::{blocks, k_block, pick, Tile, TileKey};

/// The tile for an M x N x K contraction on `target`: `tiles`' entry for it (from `--tune`) where it
/// is one the cost model could pick (`valid`), else the cost model's pick.
pub fn tile_for(
    tiles: &std::collections::HashMap<TileKey, Tile>,
    target: &CpuTarget,
    m: u64,
    n: u64,
    k: u64,
) -> Option<Tile> {
    tiles
        .get(&(m, n, k, target.lanes()))
        .copied()
        .filter(|t| mlopt_cost::tile::valid(target, *t, m, n))
        .or_else(|| pick(target, m, n, k))
}

/// The key of a kernel's `tile` schedule step.
pub fn tile_key(step: &mlopt_kir::ScheduleStep) -> Option<TileKey> {
    match *step {
        mlopt_kir::ScheduleStep::Tile { m, n, k, lanes, .. } => Some((m, n, k, lanes)),
        _ => None,
    }
}

/// A column of B as the tiling sees it: column `j` = `col0 + jo * nr + jj` of column block `block`.
#[derive(Debug)]
pub struct Col<'e> {
    pub block: usize,
    pub jo: &'e Expr,
    pub jj: &'e Expr,
    pub j: Expr,
}

impl<'e> Col<'e> {
    /// Column `jj` of panel `jo` of column block `block`, which starts at column `col0`, in panels
    /// `nr` wide.
    pub fn at((block, col0, nr): (usize, u64, u64), jo: &'e Expr, jj: &'e Expr) -> Col<'e> {
        let in_block = Expr::add(Expr::mul(jo.clone(), Expr::int(nr as i64)), jj.clone());
        Col {
            block,
            jo,
            jj,
            j: Expr::add(Expr::int(col0 as i64), in_block),
        }
    }
}

pub type RowOp<'a> = &'a mut dyn FnMut(&mut Builder<'_>, &[Expr], &Expr, &[Expr]) -> Result<Expr>;
/// b(batch, row, k, column): the column both as a number and as its place in the tiling (so a packed B
/// can be indexed by panel). B is a GEMM's when it ignores the row (which a panel's packing does not
/// give: None); one that reads the row (a depthwise convolution's window, whose rows are output rows)
/// is loaded per row of the tile.
pub type ColOp<'a> =
    &'a mut dyn FnMut(&mut Builder<'_>, &[Expr], Option<&Expr>, &[Expr], &Col) -> Result<Expr>;
pub type StoreOp<'a> =
    &'a mut dyn FnMut(&mut Builder<'_>, &[Expr], &Expr, &Expr, Expr) -> Result<Stmt>;

/// What tiles are written with: the kernel being scheduled and the CPU it is scheduled for.
#[derive(Debug)]
pub struct Builder<'k> {
    pub k: &'k mut Kernel,
    pub target: &'k CpuTarget,
}

impl Builder<'_> {
    pub fn kernel(&mut self) -> &mut Kernel {
        self.k
    }

    /// A fresh loop variable named `prefix` and a number.
    pub fn fresh(&mut self, prefix: &str) -> Var {
        let n = self.k.vars.len();
        self.k.var(format!("{prefix}{n}"))
    }

    /// The target's f32 vector lanes.
    pub fn lanes(&self) -> u32 {
        self.target.lanes()
    }
}

/// Serial loops over `extents` around `body`, with fresh variables.
pub(crate) fn nest(
    l: &mut Builder<'_>,
    prefix: &str,
    extents: &[u64],
    body: impl FnOnce(&mut Builder<'_>, &[Expr]) -> Result<Vec<Stmt>>,
) -> Result<Vec<Stmt>> {
    let vars: Vec<Var> = extents.iter().map(|_| l.fresh(prefix)).collect();
    let idx: Vec<Expr> = vars.iter().map(|v| Expr::var(*v)).collect();
    let stmts = body(l, &idx)?;
    Ok(mlopt_kir::index::serial_loops(&vars, extents, stmts))
}

pub(super) fn buf(l: &mut Builder<'_>, prefix: &str, dims: Vec<u64>) -> BufId {
    let k = l.kernel();
    k.buf(
        format!("{prefix}{}", k.bufs.len()),
        Elem::F32,
        dims,
        Space::Local,
    )
}

/// B [K, N] (row-major f32 little-endian bytes; [N, K] when `trans`) packed for the column blocks of
/// `t`: one weight per block, laid out [columns / nr, K, nr], so a tile's k-th row of B is `nr`
/// contiguous floats and a panel is one sequential stream. The bytes are copied as they are.
pub fn pack_blocks(b: &[u8], k: u64, n: u64, t: Tile, trans: bool) -> Vec<(Vec<u64>, Vec<u8>)> {
    blocks(n, t)
        .into_iter()
        .map(|(col0, cols, bt)| {
            let mut out = Vec::with_capacity((k * cols * 4) as usize);
            for jo in 0..cols / bt.nr {
                for kk in 0..k {
                    for jj in 0..bt.nr {
                        let j = col0 + jo * bt.nr + jj;
                        let at = if trans { j * k + kk } else { kk * n + j } as usize * 4;
                        out.extend_from_slice(&b[at..at + 4]);
                    }
                }
            }
            (vec![cols / bt.nr, k, bt.nr], out)
        })
        .collect()
}

/// How the tiles read B.
#[derive(Debug, Clone, Copy)]
pub enum BForm<'w> {
    /// Through its operand, where it lies.
    InPlace,
    /// Copied into a local buffer before the tiles read it (`pack(b)`): a group of neighbouring
    /// nr-wide panels at a time, [panels, K, nr], read along B's rows (`Group`), or with K in blocks
    /// one panel per block. B's loads may then stride or compute (a stride-2 convolution's im2col, a
    /// transposed operand, rows a page apart) at the cost of K x nr copies per M x K x nr multiply-adds.
    Packed,
    /// A weight packed at compile time (`pack_blocks`: one [panels, K, nr] buffer per column block),
    /// read through its operand. The first time a panel is read it comes from DRAM (a model's weights
    /// do not stay in cache between calls), so while each block of it is multiplied the tiles prefetch
    /// the next block of the stream, spread over the block's tiles: otherwise the first row of tiles
    /// over each block waits on memory at several times the rate DRAM delivers.
    Weights(&'w [BufId]),
}

/// How A lies along K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AForm {
    /// Each row contiguous along K (a weight, a row-major operand): broadcast where it lies.
    InPlace,
    /// Strided along K (a swapped convolution's activations, [K, positions]): copied once per batch,
    /// before any tile, into row tiles [M / mr, K, mr] (`pack(a)`) where the cost model says it pays
    /// (`mlopt_cost::tile::pack_a_pays`), else broadcast where it lies.
    StridedK,
}

/// out(batch, i, j) = sum over k of a(batch, i, k) * b(batch, k, j), tiled by `t`, A and B read as
/// `a_form` and `form` say.
#[allow(clippy::too_many_arguments)]
pub fn tiled(
    l: &mut Builder<'_>,
    batch: &[u64],
    m: u64,
    n: u64,
    k: &[u64],
    t: Tile,
    (a_form, form): (AForm, BForm),
    a: RowOp,
    b: ColOp,
    store: StoreOp,
) -> Result<Vec<Stmt>> {
    let pack = matches!(form, BForm::Packed);
    let kk: u64 = k.iter().product();
    let lanes = l.lanes();
    l.kernel().schedule.push(mlopt_kir::ScheduleStep::Tile {
        mr: t.mr,
        nr: t.nr,
        m,
        n,
        k: kk,
        lanes,
    });
    if pack {
        l.kernel().schedule.push(mlopt_kir::ScheduleStep::PackB);
    }
    let pack_a = a_form == AForm::StridedK && mlopt_cost::tile::pack_a_pays(l.target, t, m, n, kk);
    if pack_a {
        l.kernel().schedule.push(mlopt_kir::ScheduleStep::PackA);
    }
    let chunk = k_block(l.target, k, t.nr);
    if let Some(c) = chunk {
        l.kernel().schedule.push(mlopt_kir::ScheduleStep::KBlock {
            k: c * k[1..].iter().product::<u64>(),
        });
    }
    let mut ops = Ops { a, b, store };
    nest(l, "b", batch, |l, bi| {
        let (apack, mut out) = match pack_a {
            true => {
                let (packed, fill) = pack::pack_a(l, bi, (m, k, t.mr), &mut ops.a)?;
                (Some(packed), fill)
            }
            false => (None, Vec::new()),
        };
        for (block, (col0, cols, ct)) in blocks(n, t).into_iter().enumerate() {
            let main = m - m % ct.mr;
            // One loop over the block's column panels holds the main rows' tiles and the tail's, so
            // each panel of B (the weight, usually) is read while in cache for both: as two loops the
            // tail streamed the whole weight again (ResNet-50's 7x7 pointwise convolutions, 49 rows
            // = 9 tiles of 5 and a tail of 4, read their 4 MB weight twice).
            let (jo, cut) = (l.fresh("jo"), (block, col0, cols));
            // Packed without K blocks, `group` neighbouring panels are packed together (`Group`).
            let group = match (pack, chunk) {
                (true, None) => Some(Group::new(l, k, cols / ct.nr, ct)),
                _ => None,
            };
            let red = (k, chunk, pack && group.is_none());
            let mut panel = Vec::new();
            if main > 0 {
                // The main rows' tiles prefetch (the tail's one row of tiles would ask for a whole
                // block per tile), where the weight is worth it: whole cache lines per step of K, a
                // weight that would not sit in L2 from call to call, and at most two prefetches per
                // step (rows enough for a block's lines).
                let bytes = cols.saturating_mul(kk).saturating_mul(4);
                let streams = ct.nr.is_multiple_of(16)
                    && mlopt_cost::tile::weight_streams(l.target, bytes)
                    && (main / ct.mr) * 32 >= ct.nr;
                let stream = match form {
                    BForm::Weights(w) if streams => w.get(block).copied(),
                    _ => None,
                };
                panel.extend(tile_block(
                    l,
                    bi,
                    (0, main),
                    (cut, jo),
                    ct,
                    red,
                    (stream, group.as_ref(), apack),
                    &mut ops,
                )?);
            }
            if main < m {
                let tail = Tile { mr: m - main, ..ct };
                panel.extend(tile_block(
                    l,
                    bi,
                    (main, m - main),
                    (cut, jo),
                    tail,
                    red,
                    (None, group.as_ref(), apack),
                    &mut ops,
                )?);
            }
            match group {
                None => out.push(Stmt::for_(jo, cols / ct.nr, LoopKind::Serial, panel)),
                Some(g) => {
                    out.push(g.around(l, bi, k, (block, col0, ct), jo, panel, &mut ops.b)?)
                }
            }
        }
        Ok(out)
    })
}

/// The operands and the store of a tiled contraction.
struct Ops<'a, 'b, 'c> {
    a: RowOp<'a>,
    b: ColOp<'b>,
    store: StoreOp<'c>,
}

/// Where one block of tiles lies: its rows and columns, its tile, and the loops over its tiles.
struct Geometry<'e> {
    bi: &'e [Expr],
    row0: u64,
    /// The block's rows.
    rows: u64,
    block: usize,
    col0: u64,
    t: Tile,
    io: Var,
    jo: Expr,
    /// A packed into row tiles, and the tiles' rows (`pack_a`).
    apack: Option<PackedA>,
}

impl Geometry<'_> {
    /// The output row of a tile's row `ii`.
    fn row(&self, ii: &Expr) -> Expr {
        let in_block = Expr::add(
            Expr::mul(Expr::var(self.io), Expr::int(self.t.mr as i64)),
            ii.clone(),
        );
        Expr::add(Expr::int(self.row0 as i64), in_block)
    }

    /// The tile's column of vector `jv`, lane `jl`.
    fn col_in_tile(&self, jv: Var, jl: Var) -> Expr {
        Expr::add(
            Expr::mul(Expr::var(jv), Expr::int(self.t.lanes as i64)),
            Expr::var(jl),
        )
    }

    /// The tile's column `jj` as B's operand sees it.
    fn column<'j>(&'j self, jj: &'j Expr) -> Col<'j> {
        Col::at((self.block, self.col0, self.t.nr), &self.jo, jj)
    }

    /// One sweep over the tile: unrolled rows, unrolled vectors, one vector of lanes.
    fn sweep(
        &self,
        l: &mut Builder<'_>,
        f: &mut dyn FnMut(&mut Builder<'_>, Expr, Expr) -> Result<Stmt>,
    ) -> Result<Stmt> {
        let t = self.t;
        let (ii, jv, jl) = (l.fresh("ii"), l.fresh("jv"), l.fresh("jl"));
        let s = f(l, Expr::var(ii), self.col_in_tile(jv, jl))?;
        let inner = Stmt::for_(jl, t.lanes as u64, LoopKind::Vector(t.lanes), vec![s]);
        let vectors = Stmt::for_(jv, t.nr / t.lanes as u64, LoopKind::Unrolled, vec![inner]);
        Ok(Stmt::for_(ii, t.mr, LoopKind::Unrolled, vec![vectors]))
    }

    /// The packed panel of B: [K, nr] (or one block of K), filled one vector of columns at a time.
    fn pack_panel(
        &self,
        l: &mut Builder<'_>,
        red: &Reduction,
        panel: BufId,
        b: &mut ColOp,
    ) -> Result<Vec<Stmt>> {
        super::pack::panel_copy(l, &red.kv, self.t, None, &mut |l, kk, jj| {
            let value = b(l, self.bi, None, &red.full(kk), &self.column(jj))?;
            Ok(Stmt::Store {
                buf: panel,
                index: vec![red.at(kk), jj.clone()],
                value,
            })
        })
    }

    /// The loops over K, each step a multiply-add of the whole tile (B from the panel, if packed), and
    /// with `stream` (B a packed weight, [panels, K, nr]) prefetches of the block of it read next.
    fn update(
        &self,
        l: &mut Builder<'_>,
        red: &Reduction,
        acc: BufId,
        (panel, stream): (Option<(BufId, Option<Var>)>, Option<BufId>),
        ops: &mut Ops,
    ) -> Result<Vec<Stmt>> {
        nest(l, "k", &red.kv, |l, kk| {
            let (at, kk) = (red.at(kk), red.full(kk));
            let prefetch = match stream {
                Some(w) => self.prefetch_next(w, red, &at),
                None => Vec::new(),
            };
            let mut step = vec![self.sweep(l, &mut |l, ii, jj| {
                let av = match self.apack {
                    // Row row0 + io x mr + ii of A is in tile row0 / ap.mr + io (row0 is a
                    // multiple of ap.mr: 0, or the main rows before the tail), at lane ii.
                    Some(ap) => {
                        let tile =
                            Expr::add(Expr::int((self.row0 / ap.mr) as i64), Expr::var(self.io));
                        Expr::load(ap.buf, vec![tile, red.full_at(&at), ii.clone()])
                    }
                    None => (ops.a)(l, self.bi, &self.row(&ii), &kk)?,
                };
                let bv = match panel {
                    Some((p, None)) => Expr::load(p, vec![at.clone(), jj.clone()]),
                    Some((p, Some(jp))) => {
                        Expr::load(p, vec![Expr::var(jp), at.clone(), jj.clone()])
                    }
                    None => (ops.b)(l, self.bi, Some(&self.row(&ii)), &kk, &self.column(&jj))?,
                };
                let sum = Expr::fma(av, bv, Expr::load(acc, vec![ii.clone(), jj.clone()]));
                Ok(Stmt::Store {
                    buf: acc,
                    index: vec![ii, jj],
                    value: sum,
                })
            })?];
            step.extend(prefetch);
            Ok(step)
        })
    }

    /// The prefetches of one step `at` (the linear index in this block of K) of the tiles reading the
    /// packed weight `w` ([panels, K, nr]): the block read next (the next block of K, or the next
    /// panel's first) follows this one in memory, and its lines are spread evenly over the steps of all
    /// the rows' tiles, `slots` of them: where there are fewer lines than slots, slot s = io x steps +
    /// at fetches line s x lines / slots (neighbouring slots ask for one line, a hit in the line's
    /// fill); else slot s fetches lines s x per, .. + per, where `per` lines a step cover the block,
    /// and none past it. (The stream's last block asks past the buffer's end, which a prefetch may.)
    /// A line every step from the first tile on, then none, asked for lines at the memory's bandwidth
    /// while the block lasted: ResNet-50's 7x7-map 1x1 convolutions, whose 4 MB weights serve 49
    /// positions, ran 7% faster spread.
    fn prefetch_next(&self, w: BufId, red: &Reduction, at: &Expr) -> Vec<Stmt> {
        // f32 elements in a 64-byte line (packed weights are f32).
        const LINE: u64 = 16;
        let (t, steps) = (self.t, red.kv.iter().product::<u64>());
        let k_all = steps * red.kb.map_or(1, |(_, _, blocks)| blocks);
        let tiles = (self.rows / t.mr).max(1);
        let lines = (steps * t.nr).div_ceil(LINE);
        let per = lines.div_ceil(tiles * steps);
        // Where this block starts in the buffer, in rows of nr: panel jo's K rows, then kb blocks.
        let mut row0 = Expr::mul(self.jo.clone(), Expr::int(k_all as i64));
        if let Some((v, c, _)) = red.kb {
            let rest: u64 = red.kv[1..].iter().product();
            row0 = Expr::add(row0, Expr::mul(Expr::var(v), Expr::int((c * rest) as i64)));
        }
        let next = Expr::mul(
            Expr::add(row0, Expr::int(steps as i64)),
            Expr::int(t.nr as i64),
        );
        let slot = Expr::add(
            Expr::mul(Expr::var(self.io), Expr::int(steps as i64)),
            at.clone(),
        );
        let slots = tiles * steps;
        if lines < slots {
            let line = Expr::div(
                Expr::mul(slot, Expr::int(lines as i64)),
                Expr::int(slots as i64),
            );
            return vec![Stmt::Prefetch {
                buf: w,
                at: Expr::add(next, Expr::mul(line, Expr::int(LINE as i64))),
            }];
        }
        (0..per)
            .map(|p| {
                let line = Expr::add(
                    Expr::mul(slot.clone(), Expr::int(per as i64)),
                    Expr::int(p as i64),
                );
                // Past the block, every step asks for its last line again (a hit): a clamp, where a
                // guard in the innermost loop cost BERT's projections 12%.
                let line = Expr::bin(BinOp::Min, line, Expr::int(lines as i64 - 1));
                Stmt::Prefetch {
                    buf: w,
                    at: Expr::add(next.clone(), Expr::mul(line, Expr::int(LINE as i64))),
                }
            })
            .collect()
    }

    /// One block `v` of `blocks` of K: between blocks the tile's sums wait in `sums` [column panels,
    /// rows, nr]; the first block starts from zero and the last applies the epilogue (`out`).
    fn k_blocked(
        &self,
        l: &mut Builder<'_>,
        (acc, sums): (BufId, BufId),
        (v, blocks): (Var, u64),
        zero: Stmt,
        update: Vec<Stmt>,
        out: Stmt,
    ) -> Result<Vec<Stmt>> {
        let at = |ii: &Expr, jj: &Expr| {
            let row = Expr::add(
                Expr::mul(Expr::var(self.io), Expr::int(self.t.mr as i64)),
                ii.clone(),
            );
            vec![self.jo.clone(), row, jj.clone()]
        };
        let reload = self.sweep(l, &mut |_, ii, jj| {
            let value = Expr::load(sums, at(&ii, &jj));
            Ok(Stmt::Store {
                buf: acc,
                index: vec![ii.clone(), jj.clone()],
                value,
            })
        })?;
        let save = self.sweep(l, &mut |_, ii, jj| {
            let value = Expr::load(acc, vec![ii.clone(), jj.clone()]);
            Ok(Stmt::Store {
                buf: sums,
                index: at(&ii, &jj),
                value,
            })
        })?;
        let is = |o: BinOp, at: u64| Expr::bin(o, Expr::var(v), Expr::int(at as i64));
        let mut body = vec![
            Stmt::If {
                cond: is(BinOp::Eq, 0),
                then: vec![zero],
            },
            Stmt::If {
                cond: is(BinOp::Ne, 0),
                then: vec![reload],
            },
        ];
        body.extend(update);
        body.push(Stmt::If {
            cond: is(BinOp::Eq, blocks - 1),
            then: vec![out],
        });
        body.push(Stmt::If {
            cond: is(BinOp::Ne, blocks - 1),
            then: vec![save],
        });
        Ok(body)
    }
}

/// The loops over K a tile runs: all of it, or one block of its first axis, which `kb` (the block
/// loop, the block's size, the number of blocks) picks.
struct Reduction {
    kb: Option<(Var, u64, u64)>,
    /// The extents of the loops, and as i64 for linear indices.
    kv: Vec<u64>,
    kdims: Vec<i64>,
}

impl Reduction {
    fn new(l: &mut Builder<'_>, k: &[u64], chunk: Option<u64>) -> Self {
        let kb = chunk.map(|c| (l.fresh("kb"), c, k[0] / c));
        let kv: Vec<u64> = match kb {
            Some((_, c, _)) => [vec![c], k[1..].to_vec()].concat(),
            None => k.to_vec(),
        };
        let kdims = kv.iter().map(|d| *d as i64).collect();
        Reduction { kb, kv, kdims }
    }

    /// The reduction's indices at the loops' values `kk`.
    fn full(&self, kk: &[Expr]) -> Vec<Expr> {
        match self.kb {
            Some((v, c, _)) => {
                let first = Expr::add(Expr::mul(Expr::var(v), Expr::int(c as i64)), kk[0].clone());
                [vec![first], kk[1..].to_vec()].concat()
            }
            None => kk.to_vec(),
        }
    }

    /// The loops' values `kk` as one linear index (a row of the packed panel).
    fn at(&self, kk: &[Expr]) -> Expr {
        mlopt_kir::index::linear(kk, &self.kdims)
    }

    /// A linear index `at` into this block of K (what `at` gives) as one into all of K (a packed
    /// A's), past the blocks before.
    fn full_at(&self, at: &Expr) -> Expr {
        match self.kb {
            Some((v, _, _)) => {
                let block: u64 = self.kv.iter().product();
                Expr::add(Expr::mul(Expr::var(v), Expr::int(block as i64)), at.clone())
            }
            None => at.clone(),
        }
    }
}

/// Rows `row0..row0 + rows` by the columns of block `block` (`col0..col0 + cols`) in tiles `t`, for
/// one step `jo` of the loop over the block's column panels (the caller's): with `chunk`, the
/// reduction in blocks of `chunk` of its first axis (`k_block`); with `pack`, B through a packed
/// panel; with `stream`, B the packed weight `stream` whose next block the tiles prefetch.
#[allow(clippy::too_many_arguments)]
fn tile_block(
    l: &mut Builder<'_>,
    bi: &[Expr],
    (row0, rows): (u64, u64),
    ((block, col0, cols), jo): ((usize, u64, u64), Var),
    t: Tile,
    (k, chunk, pack): (&[u64], Option<u64>, bool),
    (stream, group, apack): (Option<BufId>, Option<&Group>, Option<PackedA>),
    ops: &mut Ops,
) -> Result<Vec<Stmt>> {
    // Each block has its own accumulators, so a parallel loop over one block's tiles keeps them private.
    let acc = buf(l, "acc", vec![t.mr, t.nr]);
    let io = l.fresh("io");
    let g = Geometry {
        bi,
        row0,
        rows,
        block,
        col0,
        t,
        io,
        jo: Expr::var(jo),
        apack,
    };
    let zero = g.sweep(l, &mut |_, ii, jj| {
        Ok(Stmt::Store {
            buf: acc,
            index: vec![ii, jj],
            value: Expr::f32(0.0),
        })
    })?;
    let red = Reduction::new(l, k, chunk);
    let panel = pack.then(|| buf(l, "panel", vec![red.kv.iter().product(), t.nr]));
    let mut packing = match panel {
        Some(p) => g.pack_panel(l, &red, p, &mut ops.b)?,
        None => Vec::new(),
    };
    let read = match (panel, group) {
        (Some(p), _) => Some((p, None)),
        (None, Some(gr)) => Some((gr.buf, Some(gr.jp))),
        (None, None) => None,
    };
    let update = g.update(l, &red, acc, (read, stream), ops)?;
    let out = g.sweep(l, &mut |l, ii, jj| {
        let v = Expr::load(acc, vec![ii.clone(), jj.clone()]);
        (ops.store)(l, bi, &g.row(&ii), &g.column(&jj).j, v)
    })?;
    let body = match red.kb {
        None => [vec![zero], update, vec![out]].concat(),
        Some((v, _, blocks)) => {
            let sums = buf(l, "sums", vec![cols / t.nr, rows, t.nr]);
            g.k_blocked(l, (acc, sums), (v, blocks), zero, update, out)?
        }
    };
    // Column panels outside, rows inside: one nr-wide panel of B stays in cache while every row of A
    // passes over it (B is usually the larger operand: the weights). K blocks go between them.
    packing.push(Stmt::for_(io, rows / t.mr, LoopKind::Serial, body));
    Ok(match red.kb {
        Some((v, _, blocks)) => vec![Stmt::for_(v, blocks, LoopKind::Serial, packing)],
        None => packing,
    })
}
