//! Operands copied at run time before the register tiles read them (`tiler`): a strided A into row
//! tiles (`pack(a)`), and column panels of an in-place B, a group of them at a time or one panel per
//! block of K (`pack(b)`). Every copy of B's panels is the one loop nest `panel_copy` writes.

use super::tiler::{buf, nest, Builder, Col, ColOp, RowOp, Tile};
use crate::error::Result;
use mlopt_kir::{BufId, Expr, LoopKind, Stmt, Var};

/// Writes column `jj` of a panel at the loops' values over K (one step of `panel_copy`).
pub(super) type PanelStore<'a> =
    &'a mut dyn FnMut(&mut Builder<'_>, &[Expr], &Expr) -> Result<Stmt>;

/// The loops that copy B's column panels of tile `t` over the reduction loops `k`: for each step of K
/// (and each of `panels`' panels, where several are copied together) one vector of columns at a time,
/// `store` writing column `jj` of the tile at the loops' values.
pub(super) fn panel_copy(
    l: &mut Builder<'_>,
    k: &[u64],
    t: Tile,
    panels: Option<(Var, u64)>,
    store: PanelStore,
) -> Result<Vec<Stmt>> {
    nest(l, "k", k, |l, kk| {
        let (jv, jl) = (l.fresh("jv"), l.fresh("jl"));
        let jj = Expr::add(
            Expr::mul(Expr::var(jv), Expr::int(t.lanes as i64)),
            Expr::var(jl),
        );
        let st = store(l, kk, &jj)?;
        let lanes = Stmt::for_(jl, t.lanes as u64, LoopKind::Vector(t.lanes), vec![st]);
        let vectors = Stmt::for_(jv, t.nr / t.lanes as u64, LoopKind::Unrolled, vec![lanes]);
        Ok(vec![match panels {
            Some((jq, n)) => Stmt::for_(jq, n, LoopKind::Serial, vec![vectors]),
            None => vectors,
        }])
    })
}

/// A copied into row tiles (`pack(a)`, for `tiler::AForm::StridedK`): `buf` [tiles, K, mr] holds row r of A in tile
/// r / mr at lane r % mr (the last tile holds the M % mr rows of the tail).
#[derive(Debug, Clone, Copy)]
pub(super) struct PackedA {
    pub buf: BufId,
    pub mr: u64,
}

/// The packed A of an M x K operand `a` in tiles of `mr` rows, and the loops that fill it, one tile's
/// steps of K at a time.
pub(super) fn pack_a(
    l: &mut Builder<'_>,
    bi: &[Expr],
    (m, k, mr): (u64, &[u64], u64),
    a: &mut RowOp,
) -> Result<(PackedA, Vec<Stmt>)> {
    let kk: u64 = k.iter().product();
    let kdims: Vec<i64> = k.iter().map(|d| *d as i64).collect();
    let buf = buf(l, "apack", vec![m.div_ceil(mr), kk, mr]);
    let (full, rest) = (m / mr, m % mr);
    let mut fill = |l: &mut Builder<'_>, tile: Expr, rows: u64| -> Result<Vec<Stmt>> {
        nest(l, "k", k, |l, ks| {
            let ii = l.fresh("ii");
            let row = Expr::add(Expr::mul(tile.clone(), Expr::int(mr as i64)), Expr::var(ii));
            let st = Stmt::Store {
                buf,
                index: vec![
                    tile.clone(),
                    mlopt_kir::index::linear(ks, &kdims),
                    Expr::var(ii),
                ],
                value: a(l, bi, &row, ks)?,
            };
            Ok(vec![Stmt::for_(ii, rows, LoopKind::Unrolled, vec![st])])
        })
    };
    let mut out = Vec::new();
    if full > 0 {
        let ti = l.fresh("ta");
        let body = fill(l, Expr::var(ti), mr)?;
        out.push(Stmt::for_(ti, full, LoopKind::Serial, body));
    }
    if rest > 0 {
        out.extend(fill(l, Expr::int(full as i64), rest)?);
    }
    Ok((PackedA { buf, mr }, out))
}

/// Neighbouring column panels of B packed together into one local [panels, K, nr] buffer before the
/// tiles over them run: each row of B is then read `panels` x nr columns at a time (a run of
/// contiguous lines the prefetcher follows), where one panel at a time read one line per row, each
/// on its own page once rows are 4 KB apart (a 1x1 convolution's activations at 56 x 56), and its
/// lines fell into a few L1 sets when the row stride was a multiple of a large power of two.
pub(super) struct Group {
    pub buf: BufId,
    /// Panels in a group, and groups in the block.
    panels: u64,
    groups: u64,
    jc: Var,
    pub jp: Var,
}

impl Group {
    /// The group for a block of `total` panels of tile `t` over reduction `k`: the most panels that
    /// divide `total` and together fill at most a quarter of L2 (where `k_block` keeps one panel),
    /// leaving at least four groups a thread where the code runs on several (the loop over groups is
    /// the one the threads share: ResNet-50's 49 panels at 28 x 28 in 7 groups ran 4 against 3 on
    /// two threads, 1.05x the time unpacked).
    pub fn new(l: &mut Builder<'_>, k: &[u64], total: u64, t: Tile) -> Self {
        let panel = k.iter().product::<u64>() * t.nr * 4;
        let fit = (l.target.l2_bytes / 4 / panel.max(1)).max(1);
        let threads = u64::from(l.target.threads);
        let panels = (1..=fit.min(total))
            .rev()
            .find(|d| total.is_multiple_of(*d) && (threads < 2 || total / d >= 4 * threads))
            .unwrap_or(1);
        let buf = buf(l, "panel", vec![panels, k.iter().product(), t.nr]);
        Group {
            buf,
            panels,
            groups: total / panels,
            jc: l.fresh("jc"),
            jp: l.fresh("jp"),
        }
    }

    /// The loops over the block's groups around `body` (the tiles of one panel, at panel `jo`): each
    /// group packed, K outside so each row of B is read along its columns, then its panels' tiles.
    #[allow(clippy::too_many_arguments)]
    pub fn around(
        self,
        l: &mut Builder<'_>,
        bi: &[Expr],
        k: &[u64],
        (block, col0, t): (usize, u64, Tile),
        jo: Var,
        body: Vec<Stmt>,
        b: &mut ColOp,
    ) -> Result<Stmt> {
        let jo_at = Expr::add(
            Expr::mul(Expr::var(self.jc), Expr::int(self.panels as i64)),
            Expr::var(self.jp),
        );
        let body: Vec<Stmt> = body.into_iter().map(|s| s.subst(jo, &jo_at)).collect();
        let kdims: Vec<i64> = k.iter().map(|d| *d as i64).collect();
        let jq = l.fresh("jq");
        let q_at = Expr::add(
            Expr::mul(Expr::var(self.jc), Expr::int(self.panels as i64)),
            Expr::var(jq),
        );
        let packing = panel_copy(l, k, t, Some((jq, self.panels)), &mut |l, kk, jj| {
            let value = b(l, bi, None, kk, &Col::at((block, col0, t.nr), &q_at, jj))?;
            Ok(Stmt::Store {
                buf: self.buf,
                index: vec![
                    Expr::var(jq),
                    mlopt_kir::index::linear(kk, &kdims),
                    jj.clone(),
                ],
                value,
            })
        })?;
        let tiles = Stmt::for_(self.jp, self.panels, LoopKind::Serial, body);
        Ok(Stmt::for_(
            self.jc,
            self.groups,
            LoopKind::Serial,
            [packing, vec![tiles]].concat(),
        ))
    }
}
