//! Contractions in the algorithm form lowering writes, one output element per iteration of the
//! data-parallel loops:
//!
//! ```text
//! %acc[] = 0.0f32
//! serial %r.. { %acc[] = fma(x, y, %acc[]) }   ; one or more reduction loops (K)
//! <epilogue reading %acc[]>                    ; bias, activation, casts, the store
//! ```
//!
//! or the same in i32, `%acc[] = (%acc[] + (x * y))` (a quantized model's integer contraction, which
//! only `mma` blocks on the integer dot product schedule: `sum`).
//!
//! The data-parallel loops split by which operand reads them: the columns (N) are those of the operand
//! that reads the innermost loop, the rows (M) those of the other, and loops both or neither read are a
//! batch. The GPU's tiled GEMMs (`gpu/gemm.rs`) schedule what this finds.

use mlopt_kir::analysis::expr_loads;
use mlopt_kir::{BinOp, BufId, Elem, Expr, Kernel, LoopKind, Space, Stmt, Var};

/// A contraction recognised in a loop nest's body.
#[derive(Clone)]
pub(crate) struct Contraction {
    pub(crate) acc: BufId,
    pub(crate) rows: Vec<(Var, u64)>,
    pub(crate) cols: Vec<(Var, u64)>,
    pub(crate) batch: Vec<(Var, u64)>,
    pub(crate) red: Vec<(Var, u64)>,
    /// The operands: `a` reads rows (and batch, K), `b` columns.
    pub(crate) a: Expr,
    pub(crate) b: Expr,
    pub(crate) epilogue: Vec<Stmt>,
    /// What the products are summed in: f32 (an FMA), or i32 (wrapping).
    pub(crate) sum: Elem,
}

impl Contraction {
    pub(crate) fn extent(loops: &[(Var, u64)]) -> u64 {
        loops.iter().map(|(_, e)| *e).product()
    }

    /// The epilogue's store (buffer, index, value), when the epilogue is that one store.
    pub(crate) fn store(&self) -> Option<(BufId, Vec<Expr>, Expr)> {
        match &self.epilogue[..] {
            [Stmt::Store { buf, index, value }] => Some((*buf, index.clone(), value.clone())),
            _ => None,
        }
    }

    /// The contraction transposed, C^T = B^T A^T: `b`'s loops are the rows, `a`'s the columns.
    pub(crate) fn swapped(&self) -> Contraction {
        Contraction {
            rows: self.cols.clone(),
            cols: self.rows.clone(),
            a: self.b.clone(),
            b: self.a.clone(),
            ..self.clone()
        }
    }

    /// Reduction loops of one iteration (a pointwise convolution's window) as index 0, when another
    /// reduction loop remains.
    pub(crate) fn drop_unit_reductions(&mut self) {
        if self.red.iter().all(|(_, e)| *e == 1) {
            return;
        }
        for (v, _) in self.red.iter().filter(|(_, e)| *e == 1) {
            self.a = self.a.subst(*v, &Expr::int(0));
            self.b = self.b.subst(*v, &Expr::int(0));
        }
        self.red.retain(|(_, e)| *e != 1);
    }

    /// Column loops whose addresses do not continue the inner columns' become batch loops (outside
    /// the tiles), with every column loop outside them: the tiler flattens the columns into one index
    /// whose vector lanes must be consecutive elements of B and of the epilogue's `store` (buffer,
    /// index, value).
    /// A batched pointwise convolution's images are such a loop: in [N, C, H, W] one image's H x W
    /// positions are contiguous but the next image starts C x H x W further, so the flattened column
    /// gathered each vector (ResNet-50's 1x1 convolutions ran at 15-28 GFLOP/s at batch 8 against 100+
    /// at batch 1). Accesses not affine in the columns are left to the code generator as before.
    pub(crate) fn split_strided_cols(&mut self, k: &Kernel, store: (BufId, &[Expr], &Expr)) {
        let mut flats = vec![mlopt_kir::analysis::flat_index(k, store.0, store.1)];
        for e in [&self.b, store.2] {
            mlopt_kir::analysis::for_each_load(e, &mut |buf, ix| {
                flats.push(mlopt_kir::analysis::flat_index(k, buf, ix));
            });
        }
        let coef = |flat: &Expr, v: Var| mlopt_kir::analysis::coefficient(flat, v);
        // Walking out from the innermost column: each access's step per column must be the inner
        // columns' span times its step along the innermost.
        let Some(&(inner, _)) = self.cols.last() else {
            return;
        };
        let mut span = 1i64;
        let mut keep = 1;
        for w in self.cols.windows(2).rev() {
            let ((outer, _), (_, e)) = (w[0], w[1]);
            span *= e as i64;
            let continues = flats
                .iter()
                .all(|f| match (coef(f, inner), coef(f, outer)) {
                    (Some(c), Some(o)) => o == c * span,
                    _ => true,
                });
            if !continues {
                break;
            }
            keep += 1;
        }
        let at = self.cols.len() - keep;
        self.batch.extend(self.cols.drain(..at));
    }
}

/// The epilogue's store (`store`: buffer, index, value) with its loops replaced by `by` and its reads of
/// the accumulator `acc` by `v` (a tile's register).
pub(crate) fn store_at(
    (buf, index, value): (BufId, &[Expr], &Expr),
    acc: BufId,
    by: &[(Var, Expr)],
    v: &Expr,
) -> Stmt {
    let value = value.subst_all(by).map_loads(&|x, ix| {
        if x == acc {
            v.clone()
        } else {
            Expr::load(x, ix)
        }
    });
    Stmt::Store {
        buf,
        index: index.iter().map(|e| e.subst_all(by)).collect(),
        value,
    }
}

/// Recognises `inner` (the body inside the data-parallel loops `prefix`) as a contraction.
pub(crate) fn recognise(k: &Kernel, prefix: &[(Var, u64)], inner: &[Stmt]) -> Option<Contraction> {
    let [Stmt::Store {
        buf: acc,
        index,
        value: zero,
    }, red_nest, epilogue @ ..] = inner
    else {
        return None;
    };
    let buf = k.buffer(*acc);
    let sum = match zero {
        Expr::Float(z, Elem::F32) if *z == 0.0 => Elem::F32,
        Expr::Cast(Elem::I32, z) if **z == Expr::Int(0) => Elem::I32,
        _ => return None,
    };
    if buf.space != Space::Local || buf.elem != sum || !index.is_empty() {
        return None;
    }
    let mut red = Vec::new();
    let mut cur = std::slice::from_ref(red_nest);
    while let [Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    }] = cur
    {
        red.push((*var, *extent));
        cur = body;
    }
    let me = Expr::load(*acc, vec![]);
    let [Stmt::Store {
        buf: b,
        index,
        value,
    }] = cur
    else {
        return None;
    };
    let (x, y, z) = match (value, sum) {
        (Expr::Fma(x, y, z), Elem::F32) => (x, y, &**z),
        (Expr::Binary(BinOp::Add, z, xy), Elem::I32) => match &**xy {
            Expr::Binary(BinOp::Mul, x, y) => (x, y, &**z),
            _ => return None,
        },
        _ => return None,
    };
    if b != acc || !index.is_empty() || *z != me || red.is_empty() {
        return None;
    }
    let reads_acc = |e: &Expr| expr_loads(e).contains_key(acc);
    if reads_acc(x) || reads_acc(y) || x.elem(k) != sum || !epilogue_ok(epilogue, *acc) {
        return None;
    }
    // Which operand reads each data-parallel loop.
    let innermost = prefix.iter().rev().find(|(_, e)| *e > 1)?.0;
    let (a, b) = match (x.uses(innermost), y.uses(innermost)) {
        (false, true) => ((**x).clone(), (**y).clone()),
        (true, false) => ((**y).clone(), (**x).clone()),
        _ => return None,
    };
    let (mut rows, mut cols, mut batch) = (Vec::new(), Vec::new(), Vec::new());
    for &(v, e) in prefix {
        match (a.uses(v), b.uses(v)) {
            (true, false) if e > 1 => rows.push((v, e)),
            (false, true) if e > 1 => cols.push((v, e)),
            _ => batch.push((v, e)),
        }
    }
    Some(Contraction {
        acc: *acc,
        rows,
        cols,
        batch,
        red,
        a,
        b,
        epilogue: epilogue.to_vec(),
        sum,
    })
}

/// Whether the epilogue only reads the accumulator (and holds no barrier or mma).
fn epilogue_ok(body: &[Stmt], acc: BufId) -> bool {
    body.iter().all(|s| match s {
        Stmt::Store { buf, .. } => *buf != acc,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => epilogue_ok(body, acc),
        Stmt::Barrier
        | Stmt::Mma { .. }
        | Stmt::WarpMma { .. }
        | Stmt::CopyAsync { .. }
        | Stmt::AsyncWait
        | Stmt::Prefetch { .. }
        | Stmt::WarpReduce { .. } => false,
    })
}
