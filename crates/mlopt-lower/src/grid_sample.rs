//! GridSample as an anchor: for each output position, every spatial axis's coordinate is denormalised,
//! mapped by the padding mode and turned into taps (index, weight, valid) held in locals, once for all
//! channels; the channel loop then sums the tensor product of the taps. Computed in f64, as the reference
//! interpreter does, so nearest-mode rounding and reflections land on the same input positions.

use crate::error::Result;
use crate::kernel::Lowerer;
use crate::nests::get;
use mlopt_ir::{GridPadding, NodeId, ResizeMode};
use mlopt_kir::index::{all, clamp, in_range};
use mlopt_kir::index::{convert, lit};
use mlopt_kir::{BinOp, BufId, Elem, Expr, Space, Stmt, UnOp};

const F: Elem = Elem::F64;

fn f(v: f64) -> Expr {
    lit(v, F)
}

/// A scalar local holding `value`: the statement that sets it and a load of it.
fn bind(l: &mut Lowerer, stmts: &mut Vec<Stmt>, t: Elem, value: Expr) -> Expr {
    let buf =
        l.k.buf(format!("g{}", l.k.bufs.len()), t, vec![], Space::Local);
    stmts.push(Stmt::Store {
        buf,
        index: vec![],
        value,
    });
    Expr::load(buf, vec![])
}

/// `x` reflected into [lo, hi] (x itself inside): the distance past the nearer border, folded by the
/// span, taken from one border or the other by the parity of the number of folds.
fn reflect(x: &Expr, lo: f64, hi: f64) -> Expr {
    let span = hi - lo;
    if span <= 0.0 {
        return f(lo);
    }
    let below = Expr::bin(BinOp::Lt, x.clone(), f(lo));
    let above = Expr::bin(BinOp::Lt, f(hi), x.clone());
    let d = Expr::select(
        below.clone(),
        Expr::bin(BinOp::Sub, f(lo), x.clone()),
        Expr::bin(BinOp::Sub, x.clone(), f(hi)),
    );
    let folds = Expr::un(UnOp::Floor, Expr::bin(BinOp::Div, d.clone(), f(span)));
    let r = Expr::bin(BinOp::Sub, d, Expr::bin(BinOp::Mul, folds.clone(), f(span)));
    let half = Expr::un(UnOp::Floor, Expr::bin(BinOp::Div, folds.clone(), f(2.0)));
    let even = Expr::bin(
        BinOp::Eq,
        Expr::bin(BinOp::Sub, folds, Expr::bin(BinOp::Mul, half, f(2.0))),
        f(0.0),
    );
    let folded = Expr::select(
        Expr::bin(BinOp::Eq, below.clone(), even),
        Expr::bin(BinOp::Add, f(lo), r.clone()),
        Expr::bin(BinOp::Sub, f(hi), r),
    );
    Expr::select(Expr::bin(BinOp::Or, below, above), folded, x.clone())
}

/// The cubic convolution kernel (A = -0.75) for |x| <= 1 (`near`) and 1 < |x| < 2 (`far`).
fn cubic(x: Expr, near: bool) -> Expr {
    let a = -0.75;
    if near {
        Expr::bin(
            BinOp::Add,
            Expr::bin(
                BinOp::Mul,
                Expr::bin(
                    BinOp::Mul,
                    Expr::bin(
                        BinOp::Sub,
                        Expr::bin(BinOp::Mul, f(a + 2.0), x.clone()),
                        f(a + 3.0),
                    ),
                    x.clone(),
                ),
                x,
            ),
            f(1.0),
        )
    } else {
        let inner = Expr::bin(
            BinOp::Add,
            Expr::bin(
                BinOp::Mul,
                Expr::bin(
                    BinOp::Sub,
                    Expr::bin(BinOp::Mul, f(a), x.clone()),
                    f(5.0 * a),
                ),
                x.clone(),
            ),
            f(8.0 * a),
        );
        Expr::bin(BinOp::Sub, Expr::bin(BinOp::Mul, inner, x), f(4.0 * a))
    }
}

/// One tap of one axis: input index (in range), weight, and whether it contributes.
struct Tap {
    index: Expr,
    weight: Expr,
    valid: Option<Expr>,
}

pub fn grid_sample(
    l: &mut Lowerer,
    n: NodeId,
    mode: ResizeMode,
    padding: GridPadding,
    align: bool,
    out_t: Elem,
    dst: BufId,
) -> Result<Vec<Stmt>> {
    let (x, grid) = (l.input(n, 0)?, l.input(n, 1)?);
    let xs: Vec<i64> = l.ty(x).shape.iter().map(|d| *d as i64).collect();
    let gs: Vec<u64> = l.ty(grid).shape.iter().map(|d| *d as u64).collect();
    let sp = xs.len() - 2;
    let positions: Vec<u64> = gs[..gs.len() - 1].to_vec();
    l.nest("i", &positions, |l, pos| {
        let mut stmts = Vec::new();
        let mut axes: Vec<Vec<Tap>> = Vec::new();
        for i in 0..sp {
            let d = xs[2 + i];
            let df = d as f64;
            let (lo, hi) = if align {
                (0.0, df - 1.0)
            } else {
                (-0.5, df - 0.5)
            };
            // The grid's last axis lists coordinates innermost axis first.
            let mut gi = pos.to_vec();
            gi.push(Expr::int((sp - 1 - i) as i64));
            let v = get(l, grid, &gi, F)?;
            let mut c = if align {
                Expr::bin(
                    BinOp::Mul,
                    Expr::bin(BinOp::Div, Expr::bin(BinOp::Add, v, f(1.0)), f(2.0)),
                    f(df - 1.0),
                )
            } else {
                Expr::bin(
                    BinOp::Div,
                    Expr::bin(
                        BinOp::Sub,
                        Expr::bin(BinOp::Mul, Expr::bin(BinOp::Add, v, f(1.0)), f(df)),
                        f(1.0),
                    ),
                    f(2.0),
                )
            };
            if mode == ResizeMode::Nearest {
                c = Expr::un(UnOp::Round, c);
            }
            let c = bind(l, &mut stmts, F, c);
            let outside = Expr::bin(
                BinOp::Or,
                Expr::bin(BinOp::Lt, c.clone(), f(lo)),
                Expr::bin(BinOp::Lt, f(hi), c.clone()),
            );
            let c = match padding {
                GridPadding::Border => bind(
                    l,
                    &mut stmts,
                    F,
                    Expr::select(
                        outside,
                        Expr::bin(
                            BinOp::Min,
                            Expr::bin(BinOp::Max, c.clone(), f(0.0)),
                            f(df - 1.0),
                        ),
                        c,
                    ),
                ),
                GridPadding::Reflection => bind(l, &mut stmts, F, reflect(&c, lo, hi)),
                GridPadding::Zeros => c,
            };
            let base = bind(l, &mut stmts, F, Expr::un(UnOp::Floor, c.clone()));
            let t = bind(
                l,
                &mut stmts,
                F,
                Expr::bin(BinOp::Sub, c.clone(), base.clone()),
            );
            let bi = Expr::cast(Elem::I64, base);
            let raw: Vec<(Expr, Expr)> = match mode {
                ResizeMode::Nearest => vec![(Expr::cast(Elem::I64, c), f(1.0))],
                ResizeMode::Linear => vec![
                    (bi.clone(), Expr::bin(BinOp::Sub, f(1.0), t.clone())),
                    (Expr::add(bi, Expr::int(1)), t),
                ],
                ResizeMode::Cubic => {
                    let ws = [
                        cubic(Expr::bin(BinOp::Add, t.clone(), f(1.0)), false),
                        cubic(t.clone(), true),
                        cubic(Expr::bin(BinOp::Sub, f(1.0), t.clone()), true),
                        cubic(Expr::bin(BinOp::Sub, f(2.0), t), false),
                    ];
                    ws.into_iter()
                        .enumerate()
                        .map(|(k, w)| (Expr::add(bi.clone(), Expr::int(k as i64 - 1)), w))
                        .collect()
                }
            };
            let mut taps = Vec::new();
            for (k, w) in raw {
                let k = bind(l, &mut stmts, Elem::I64, k);
                // The clamp stays in the index expression, where the verifier sees the bound.
                let (index, valid) = match padding {
                    GridPadding::Zeros => (
                        clamp(k.clone(), d),
                        Some(bind(l, &mut stmts, Elem::Bool, in_range(k, d))),
                    ),
                    GridPadding::Border => (clamp(k, d), None),
                    GridPadding::Reflection => {
                        let kf = bind(l, &mut stmts, F, Expr::cast(F, k));
                        (clamp(Expr::cast(Elem::I64, reflect(&kf, lo, hi)), d), None)
                    }
                };
                let weight = bind(l, &mut stmts, F, w);
                taps.push(Tap {
                    index,
                    weight,
                    valid,
                });
            }
            axes.push(taps);
        }
        // Every combination of one tap per axis, in the reference's order (last axis fastest).
        let mut combos: Vec<Vec<usize>> = vec![Vec::new()];
        for taps in &axes {
            combos = combos
                .into_iter()
                .flat_map(|c| (0..taps.len()).map(move |k| [c.clone(), vec![k]].concat()))
                .collect();
        }
        stmts.extend(l.nest("c", &[xs[1] as u64], |l, ch| {
            let mut sum = f(0.0);
            for combo in &combos {
                let mut xi = vec![pos[0].clone(), ch[0].clone()];
                let mut w = f(1.0);
                let mut valid = Vec::new();
                for (a, k) in combo.iter().enumerate() {
                    let tap = &axes[a][*k];
                    xi.push(tap.index.clone());
                    w = Expr::bin(BinOp::Mul, w, tap.weight.clone());
                    valid.extend(tap.valid.clone());
                }
                let term = Expr::bin(BinOp::Mul, w, get(l, x, &xi, F)?);
                let term = match all(valid) {
                    Some(ok) => Expr::select(ok, term, f(0.0)),
                    None => term,
                };
                sum = Expr::bin(BinOp::Add, sum, term);
            }
            let mut oi = vec![pos[0].clone(), ch[0].clone()];
            oi.extend_from_slice(&pos[1..]);
            Ok(vec![Stmt::Store {
                buf: dst,
                index: oi,
                value: convert(sum, F, out_t),
            }])
        })?);
        Ok(stmts)
    })
}
