//! Views and injective layout ops, pulled: the output index of a Reshape, Transpose, Expand, Slice,
//! Tile, Split, Concat, Gather (and its kin), Pad, Trilu, DepthToSpace/SpaceToDepth or Resize maps to
//! input indices (Resize's taps and weights are tables computed at compile time), so a chain of them
//! costs one load per kernel input.

use crate::elementwise::elem;
use crate::error::Result;
use crate::kernel::Lowerer;
use mlopt_ir::{NodeId, Op, Value};
use mlopt_kir::index::{all, clamp, convert, delinear, in_range, linear, lit, modulo, wrap_index};
use mlopt_kir::{BinOp, BufId, Elem, Expr};

impl Lowerer<'_> {
    /// Views and injective layout ops: the output index maps to one input index.
    pub(crate) fn pull_view(&mut self, n: NodeId, out: usize, idx: &[Expr]) -> Result<Expr> {
        let node = self.g.node(n);
        let x = self.input(n, 0)?;
        let in_shape: Vec<i64> = self.ty(x).shape.iter().map(|d| *d as i64).collect();
        let out_shape: Vec<i64> = node.outputs[out].shape.iter().map(|d| *d as i64).collect();
        match &node.op {
            Op::Reshape { .. } => {
                let flat = linear(idx, &out_shape);
                let ix = delinear(flat, &in_shape);
                self.pull(x, &ix)
            }
            Op::Transpose { perm } => {
                let mut ix = vec![Expr::int(0); idx.len()];
                for (i, p) in perm.iter().enumerate() {
                    ix[*p] = idx[i].clone();
                }
                self.pull(x, &ix)
            }
            Op::Expand { .. } => self.pull_broadcast(n, 0, idx),
            Op::Slice { starts, steps, .. } => {
                let ix = idx
                    .iter()
                    .enumerate()
                    .map(|(a, e)| {
                        Expr::add(
                            Expr::int(starts[a] as i64),
                            Expr::mul(Expr::int(steps[a]), e.clone()),
                        )
                    })
                    .collect::<Vec<_>>();
                self.pull(x, &ix)
            }
            Op::Tile { .. } => {
                let ix = idx
                    .iter()
                    .enumerate()
                    .map(|(a, e)| Expr::rem(e.clone(), Expr::int(in_shape[a])))
                    .collect::<Vec<_>>();
                self.pull(x, &ix)
            }
            Op::Split { axis, sizes } => {
                let off: i64 = sizes[..out].iter().map(|s| *s as i64).sum();
                let mut ix = idx.to_vec();
                ix[*axis] = Expr::add(idx[*axis].clone(), Expr::int(off));
                self.pull(x, &ix)
            }
            Op::Concat { axis } => {
                let arity = self.g.inputs(n).len();
                let mut parts = Vec::new();
                let mut off = 0i64;
                for i in 0..arity {
                    let v = self.input(n, i)?;
                    let len = self.ty(v).shape[*axis] as i64;
                    if len == 0 {
                        continue;
                    }
                    let mut ix = idx.to_vec();
                    ix[*axis] = clamp(Expr::sub(idx[*axis].clone(), Expr::int(off)), len);
                    parts.push((off + len, self.pull(v, &ix)?));
                    off += len;
                }
                if parts.is_empty() {
                    return Err(self.unsupported(n, "no non-empty input"));
                }
                Ok(pick_part(&idx[*axis], parts))
            }
            Op::Gather { axis } => {
                let ind = self.input(n, 1)?;
                let ind_t = elem(self.ty(ind).dtype);
                let r = self.ty(ind).shape.len();
                let raw = self.pull(ind, &idx[*axis..*axis + r])?;
                let mut ix: Vec<Expr> = idx[..*axis].to_vec();
                ix.push(wrap_index(convert(raw, ind_t, Elem::I64), in_shape[*axis]));
                ix.extend_from_slice(&idx[*axis + r..]);
                self.pull(x, &ix)
            }
            Op::GatherElements { axis } => {
                // out[i] = data[i with i[axis] = indices[i]] (negative indices count from the end).
                let ind = self.input(n, 1)?;
                let ind_t = elem(self.ty(ind).dtype);
                let raw = self.pull(ind, idx)?;
                let mut ix = idx.to_vec();
                ix[*axis] = wrap_index(convert(raw, ind_t, Elem::I64), in_shape[*axis]);
                self.pull(x, &ix)
            }
            Op::GatherNd { batch_dims } => {
                // out[b.., i.., s..] = data[b.., indices[b.., i.., 0..last], s..].
                let ind = self.input(n, 1)?;
                let q = self.ty(ind).shape.len();
                let mut ix: Vec<Expr> = idx[..*batch_dims].to_vec();
                ix.extend(self.index_tuple(ind, &idx[..q - 1], &in_shape[*batch_dims..])?);
                ix.extend_from_slice(&idx[q - 1..]);
                self.pull(x, &ix)
            }
            Op::Trilu { upper, k } => {
                // Keep element (i, j) of the last two axes when j - i >= k (upper) or j - i <= k (lower).
                let r = idx.len();
                let d = Expr::sub(idx[r - 1].clone(), idx[r - 2].clone());
                let keep = if *upper {
                    Expr::bin(BinOp::Le, Expr::int(*k), d)
                } else {
                    Expr::bin(BinOp::Le, d, Expr::int(*k))
                };
                let t = elem(self.ty(x).dtype);
                let v = self.pull(x, idx)?;
                Ok(Expr::select(keep, v, lit(0.0, t)))
            }
            Op::Resize(r) => self.pull_resize(n, x, r, idx),
            Op::DepthToSpace { blocksize, crd } => {
                // out[n, c, h*b + i, w*b + j] = in[n, (i*b + j)*C' + c, h, w] (DCR) or in[n, c*b*b + i*b + j, h, w] (CRD).
                let b = *blocksize as i64;
                let c_out = out_shape[1];
                let (i, j) = (
                    Expr::rem(idx[2].clone(), Expr::int(b)),
                    Expr::rem(idx[3].clone(), Expr::int(b)),
                );
                let ij = Expr::add(Expr::mul(i, Expr::int(b)), j);
                let ch = if *crd {
                    Expr::add(Expr::mul(idx[1].clone(), Expr::int(b * b)), ij)
                } else {
                    Expr::add(Expr::mul(ij, Expr::int(c_out)), idx[1].clone())
                };
                self.pull(
                    x,
                    &[
                        idx[0].clone(),
                        ch,
                        Expr::div(idx[2].clone(), Expr::int(b)),
                        Expr::div(idx[3].clone(), Expr::int(b)),
                    ],
                )
            }
            Op::SpaceToDepth { blocksize } => {
                // out[n, (i*b + j)*C + c, h, w] = in[n, c, h*b + i, w*b + j].
                let b = *blocksize as i64;
                let c_in = in_shape[1];
                let (c, t) = (
                    Expr::rem(idx[1].clone(), Expr::int(c_in)),
                    Expr::div(idx[1].clone(), Expr::int(c_in)),
                );
                let (i, j) = (
                    Expr::div(t.clone(), Expr::int(b)),
                    Expr::rem(t, Expr::int(b)),
                );
                self.pull(
                    x,
                    &[
                        idx[0].clone(),
                        c,
                        Expr::add(Expr::mul(idx[2].clone(), Expr::int(b)), i),
                        Expr::add(Expr::mul(idx[3].clone(), Expr::int(b)), j),
                    ],
                )
            }
            Op::Pad { pads, mode, value } => {
                let rank = in_shape.len();
                let t = elem(self.ty(x).dtype);
                let src: Vec<Expr> = (0..rank)
                    .map(|a| Expr::sub(idx[a].clone(), Expr::int(pads[a])))
                    .collect();
                // Constant mode: the axes that grow take `value` outside the input; the other modes map
                // every position to one inside it (edge clamps, reflect mirrors, wrap repeats).
                let grows = |a: usize| pads[a] > 0 || pads[a + rank] > 0;
                let inside = match mode {
                    mlopt_ir::PadMode::Constant => all((0..rank)
                        .filter(|a| grows(*a))
                        .map(|a| in_range(src[a].clone(), in_shape[a]))),
                    _ => None,
                };
                let ix: Vec<Expr> = src
                    .into_iter()
                    .enumerate()
                    .map(|(a, e)| {
                        let len = in_shape[a];
                        let e = match mode {
                            _ if !grows(a) => e,
                            mlopt_ir::PadMode::Reflect if len > 1 => {
                                // Period 2(len - 1): position r of a period reads r, or its mirror 2(len - 1) - r.
                                let m = 2 * (len - 1);
                                let r = modulo(e, m);
                                Expr::select(
                                    Expr::bin(BinOp::Lt, r.clone(), Expr::int(len)),
                                    r.clone(),
                                    Expr::sub(Expr::int(m), r),
                                )
                            }
                            mlopt_ir::PadMode::Wrap => modulo(e, len),
                            _ => e,
                        };
                        clamp(e, len)
                    })
                    .collect();
                let e = self.pull(x, &ix)?;
                Ok(match inside {
                    Some(c) => Expr::select(c, e, lit(*value, t)),
                    None => e,
                })
            }
            _ => Err(self.unsupported(n, "no code generation for this op yet")),
        }
    }

    /// Resize: the taps of every resized axis (input positions and weights, fixed by the static shapes)
    /// are tables computed at compile time, and each output element is the weighted sum over all tap
    /// combinations, in f32. Axes that keep their size are read straight through.
    fn pull_resize(
        &mut self,
        n: NodeId,
        x: Value,
        r: &mlopt_ir::ResizeAttrs,
        idx: &[Expr],
    ) -> Result<Expr> {
        let xt = self.ty(x).clone();
        let t = elem(xt.dtype);
        // Floats are computed in f32; integers in f64 and rounded half away from zero, as the reference.
        let ct = if t.is_float() { Elem::F32 } else { Elem::F64 };
        // Per axis: either the index itself, or (index table, weight table, valid table, taps).
        let mut axes: Vec<Option<(BufId, BufId, BufId, usize)>> = Vec::new();
        for d in 0..xt.shape.len() {
            let (n_in, n_out) = (xt.shape[d], r.sizes[d]);
            if n_in == n_out
                && r.scales[d] == 1.0
                && r.coord != mlopt_ir::CoordMode::TfCropAndResize
            {
                axes.push(None);
                continue;
            }
            let taps = mlopt_ir::interp::resize_taps(r, d, n_in, n_out);
            let width = taps
                .iter()
                .map(|t| t.as_ref().map_or(0, |v| v.len()))
                .max()
                .unwrap_or(0)
                .max(1);
            let (mut ix, mut w, mut ok) = (Vec::new(), Vec::new(), Vec::new());
            for tp in &taps {
                for k in 0..width {
                    let (i, wt) = tp
                        .as_ref()
                        .and_then(|v| v.get(k))
                        .copied()
                        .unwrap_or((0, 0.0));
                    ix.extend_from_slice(&(i as i64).to_le_bytes());
                    if ct == Elem::F32 {
                        w.extend_from_slice(&(wt as f32).to_le_bytes());
                    } else {
                        w.extend_from_slice(&wt.to_le_bytes());
                    }
                }
                ok.extend_from_slice(&(if tp.is_some() { 1.0f32 } else { 0.0 }).to_le_bytes());
            }
            let name = &self.g.node(n).name;
            let mk = |l: &mut Self, what: &str, elem: Elem, dims: Vec<u64>, data: Vec<u8>| {
                l.weight(mlopt_kir::Weight {
                    name: format!("{name}.{what}{d}"),
                    elem,
                    dims,
                    data: std::sync::Arc::new(data),
                })
            };
            let bi = mk(
                self,
                "taps",
                Elem::I64,
                vec![n_out as u64, width as u64],
                ix,
            );
            let bw = mk(self, "weights", ct, vec![n_out as u64, width as u64], w);
            let bv = mk(self, "valid", Elem::F32, vec![n_out as u64], ok);
            axes.push(Some((bi, bw, bv, width)));
        }
        // Every combination of one tap per resized axis.
        let mut combos: Vec<(Vec<Expr>, Expr)> = vec![(Vec::new(), lit(1.0, ct))];
        for (d, a) in axes.iter().enumerate() {
            let mut next = Vec::new();
            for (ix, w) in combos {
                match a {
                    None => {
                        let mut ix = ix.clone();
                        ix.push(idx[d].clone());
                        next.push((ix, w));
                    }
                    Some((bi, bw, _, width)) => {
                        for k in 0..*width as i64 {
                            let at = vec![idx[d].clone(), Expr::int(k)];
                            let mut ix2 = ix.clone();
                            ix2.push(clamp(Expr::load(*bi, at.clone()), xt.shape[d] as i64));
                            next.push((ix2, Expr::bin(BinOp::Mul, w.clone(), Expr::load(*bw, at))));
                        }
                    }
                }
            }
            combos = next;
        }
        let mut sum: Option<Expr> = None;
        for (ix, w) in combos {
            let v = self.pull(x, &ix)?;
            let term = Expr::bin(BinOp::Mul, w, convert(v, t, ct));
            sum = Some(match sum {
                None => term,
                Some(s) => Expr::bin(BinOp::Add, s, term),
            });
        }
        let mut y = sum.unwrap_or_else(|| lit(0.0, ct));
        // tf_crop_and_resize: outside the crop box, the extrapolation value.
        let valid: Vec<Expr> = axes
            .iter()
            .enumerate()
            .filter_map(|(d, a)| a.map(|(_, _, bv, _)| Expr::load(bv, vec![idx[d].clone()])))
            .collect();
        if r.coord == mlopt_ir::CoordMode::TfCropAndResize && !valid.is_empty() {
            let all = valid
                .into_iter()
                .reduce(|p, q| Expr::bin(BinOp::Mul, p, q))
                .unwrap_or_else(|| lit(1.0, Elem::F32));
            y = Expr::select(
                Expr::bin(BinOp::Lt, lit(0.5, Elem::F32), all),
                y,
                lit(r.extrapolation_value as f64, ct),
            );
        }
        if !t.is_float() {
            let half = |e: Expr| {
                Expr::un(
                    mlopt_kir::UnOp::Floor,
                    Expr::bin(BinOp::Add, e, lit(0.5, ct)),
                )
            };
            let neg = Expr::bin(BinOp::Lt, y.clone(), lit(0.0, ct));
            y = Expr::select(
                neg,
                Expr::un(
                    mlopt_kir::UnOp::Neg,
                    half(Expr::un(mlopt_kir::UnOp::Neg, y.clone())),
                ),
                half(y),
            );
        }
        Ok(convert(y, ct, t))
    }
}

/// The part of a concatenation (each part's end along the axis, and its value) that position `at`
/// falls in: a chain of selects, first part outermost, up to `LINEAR_FOLD` parts; beyond, a balanced
/// search on the ends, so the select nest is as deep as the logarithm of the part count (a Concat of
/// 10,000 inputs nested 10,000 deep overflowed the passes that walk it).
fn pick_part(at: &Expr, mut parts: Vec<(i64, Expr)>) -> Expr {
    let below = |end: i64, lo: Expr, hi: Expr| {
        Expr::select(Expr::bin(BinOp::Lt, at.clone(), Expr::int(end)), lo, hi)
    };
    if parts.len() > crate::elementwise::LINEAR_FOLD {
        let right = parts.split_off(parts.len() / 2);
        let end = parts.last().map_or(0, |p| p.0);
        return below(end, pick_part(at, parts), pick_part(at, right));
    }
    let (_, mut e) = parts.pop().unwrap_or((0, Expr::int(0)));
    while let Some((end, p)) = parts.pop() {
        e = below(end, p, e);
    }
    e
}
