//! Gathers turned into transposes. A serial loop around a vector loop whose one store reads an operand
//! whose lanes lie far apart and whose steps of the outer loop lie close together:
//!
//! ```text
//! for q in 0..Q:                                   (serial)
//!   vector<w> c in 0..C:
//!     xp[.., q, c] = f(x[c, .., q * s + ph])       (lanes a channel plane apart: a gather per lane)
//! ```
//!
//! (the channels-innermost copy a bf16 convolution's blocks read, `mma_conv.rs`) runs `w` steps of q at
//! a time: for each of the `w` lanes' channels, one row of `w` elements along q (at stride s: two loads
//! and a shuffle, `strided_row`), the `w` x `w` block transposed in registers by log2(w) rounds of
//! two-source shuffles, and then each step's store with the gathered operand taken from the block's
//! column. `w` loads and w log2(w) shuffles replace w x w scalar loads and inserts.

use crate::codegen::*;
use inkwell::values::{IntValue, VectorValue};
use mlopt_kir::{BufId, Expr, LoopKind, Stmt, Var};

/// One vector loop of the serial loop's body in this module's form: its lanes (`lane`, `lanes` of them
/// in vectors of `w`), its one store (`inner`, into `dst`) and the operand it gathers (`src` at `index`, `st`
/// elements apart from one step of the serial loop to the next).
struct Gathering<'s> {
    /// The test the loop runs under, the same for every step.
    guard: Option<&'s Expr>,
    lane: Var,
    lanes: u64,
    w: u32,
    inner: &'s [Stmt],
    dst: BufId,
    src: BufId,
    index: Vec<Expr>,
    st: u32,
}

impl<'c> Gen<'_, 'c> {
    /// Emits the first steps of serial loop `q` (extent `extent`, `body`) as blocks of transposed rows
    /// where the loop has this module's form, and returns how many steps it emitted (a multiple of the
    /// block's steps; 0 where the loop is not of the form): the caller runs the rest. The body may be
    /// several vector loops (a row of 28 is a vector of 16 and one of 12): each runs its block of
    /// steps in turn, its rows padded to the block's power of two for the transpose.
    pub(crate) fn transposed_steps(&mut self, q: Var, extent: u64, body: &[Stmt]) -> Ret<u64> {
        let mut loops = Vec::new();
        for stmt in body {
            // A guard the loop's steps share (an edge block's epilogue) stays around its loops.
            let (guard, inner) = match stmt {
                Stmt::If { cond, then } if !cond.uses(q) => (Some(cond), &then[..]),
                s => (None, std::slice::from_ref(s)),
            };
            for s in inner {
                match self.gathering(q, s) {
                    Some(l) => loops.push(Gathering { guard, ..l }),
                    None => return Ok(0),
                }
            }
        }
        // Rows are read for all of a block's steps before any of them stores: not where the loops
        // write what they read.
        if loops.is_empty() || loops.iter().any(|l| loops.iter().any(|m| m.dst == l.src)) {
            return Ok(0);
        }
        let t = loops
            .iter()
            .map(|l| l.w)
            .max()
            .unwrap_or(1)
            .next_power_of_two();
        let steps = u64::from(t);
        if extent < steps {
            return Ok(0);
        }
        let blocks = extent / steps;
        let name = self.kernel.var_name(q).replace('.', "_");
        let (zero, end) = (self.i64(0), self.i64(blocks as i64));
        self.counted(&format!("{name}_t"), zero, end, 1, &mut |g, qb| {
            let q0 = g.builder.build_int_mul(qb, g.i64(i64::from(t)), "q0")?;
            for l in &loops {
                let mut lanes = |g: &mut Self| g.transposed_block(q, (q0, t), l, &name);
                match l.guard {
                    Some(cond) => g.guarded(cond, &mut lanes)?,
                    None => lanes(g)?,
                }
            }
            Ok(())
        })?;
        self.vars.remove(&q);
        Ok(blocks * steps)
    }

    /// Loop `l`'s `t` steps of `q` from `q0`, its lanes `w` at a time: each lane's row along q (padded
    /// to `t` rows), the block transposed (column i is step q0 + i), and each step's store with the
    /// gathered operand taken from its column.
    fn transposed_block(
        &mut self,
        q: Var,
        (q0, t): (IntValue<'c>, u32),
        l: &Gathering,
        name: &str,
    ) -> Ret<()> {
        let elem = self.kernel.buffer(l.src).elem;
        let flat = self.flat(l.src, &l.index);
        let (c_zero, c_end) = (self.i64(0), self.i64(l.lanes as i64));
        self.counted(
            &format!("{name}_c"),
            c_zero,
            c_end,
            u64::from(l.w),
            &mut |g, c0| {
                let mut rows = Vec::with_capacity(t as usize);
                for j in 0..l.w {
                    let c = g.builder.build_int_add(c0, g.i64(i64::from(j)), "c")?;
                    g.vars.insert(q, VarVal::Scalar(q0));
                    g.vars.insert(l.lane, VarVal::Scalar(c));
                    let i = g.eval(&flat)?.into_int_value();
                    let p = g.elem_ptr(l.src, i)?;
                    rows.push(g.strided_row(p, elem, t, l.st)?);
                }
                let pad = rows[0].get_type().get_poison();
                rows.resize(t as usize, pad);
                let columns = g.transpose(rows)?;
                g.width = Some(l.w);
                for (i, column) in columns.into_iter().enumerate() {
                    let at = g.builder.build_int_add(q0, g.i64(i as i64), "q")?;
                    g.vars.insert(q, VarVal::Scalar(at));
                    g.vars.insert(l.lane, VarVal::Lanes(c0));
                    let column = match l.w < t {
                        true => g.shuffle((column, column), 0..l.w, "lanes")?,
                        false => column,
                    };
                    let v = g.unshuffled(column, elem, l.w)?;
                    g.forced = Some((l.src, l.index.clone(), v));
                    let r = g.block(l.inner);
                    g.forced = None;
                    r?;
                }
                g.width = None;
                g.vars.remove(&l.lane);
                Ok(())
            },
        )
    }

    /// `stmt` as a vector loop of this module's form inside serial loop `q`: one store whose one
    /// gathered operand has lanes more than 4 elements apart (nearer ones load as strided rows
    /// already) and steps of q 1 to 4 apart.
    fn gathering<'s>(&mut self, q: Var, stmt: &'s Stmt) -> Option<Gathering<'s>> {
        let Stmt::For {
            var: lane,
            extent: lanes,
            kind: LoopKind::Vector(w),
            body: inner,
        } = stmt
        else {
            return None;
        };
        let [Stmt::Store {
            buf: dst, value, ..
        }] = &inner[..]
        else {
            return None;
        };
        if *w < 4 || *w > 16 || lanes % u64::from(*w) != 0 {
            return None;
        }
        let (src, index, st) =
            mlopt_kir::analysis::transposed_operand(self.kernel, value, *lane, q)?;
        Some(Gathering {
            guard: None,
            lane: *lane,
            lanes: *lanes,
            w: *w,
            inner,
            dst: *dst,
            src,
            index,
            st: st as u32,
        })
    }

    /// The transpose of the square block whose rows are `rows` (n vectors of n lanes, n a power of two):
    /// log2(n) rounds, each exchanging the off-diagonal b x b blocks of every 2b x 2b block by one
    /// two-source shuffle per row (b = n/2, .., 1).
    fn transpose(&mut self, mut rows: Vec<VectorValue<'c>>) -> Ret<Vec<VectorValue<'c>>> {
        let n = rows.len() as u32;
        let mut b = n / 2;
        while b >= 1 {
            let mut next = rows.clone();
            for i in (0..n).filter(|i| i & b == 0) {
                let (lo, hi) = (rows[i as usize], rows[(i + b) as usize]);
                // Row i keeps its lanes with bit b clear and takes row i + b's lanes with it clear in
                // the others; row i + b takes row i's lanes with bit b set, keeps its own.
                let first = (0..n).map(|j| if j & b == 0 { j } else { n + j - b });
                let second = (0..n).map(|j| if j & b == 0 { j + b } else { n + j });
                next[i as usize] = self.shuffle((lo, hi), first, "tr")?;
                next[(i + b) as usize] = self.shuffle((lo, hi), second, "tr")?;
            }
            rows = next;
            b /= 2;
        }
        Ok(rows)
    }
}
