//! Ops that only exist to describe shapes or values known before run time: Constant, Shape, Size,
//! ConstantOfShape, Range (all become constants, since shapes are static), and Identity/Dropout (aliases
//! of their input in inference).

use super::NodeCx;
use crate::error::Result;
use mlopt_ir::{with_dtype, DType, Elem, Tensor, Value};

pub(crate) const OPS: &[&str] = &[
    "Constant",
    "Shape",
    "Size",
    "ConstantOfShape",
    "Range",
    "Identity",
    "Dropout",
];

pub(crate) fn convert(cx: &mut NodeCx<'_, '_>, op: &str) -> Option<Result<Vec<Value>>> {
    let r = (|| -> Result<Option<Vec<Value>>> {
        let out = match op {
            "Identity" => vec![cx.req(0)?],
            "Dropout" => dropout(cx)?,
            "Constant" => vec![constant(cx)?],
            "Shape" => {
                let x = cx.req(0)?;
                let s: Vec<i64> = cx.ty(x).shape.iter().map(|&d| d as i64).collect();
                let r = s.len() as i64;
                let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let start = clampi(cx.int("start", 0)?);
                let end = clampi(cx.int("end", r)?);
                cx.static_size(0, start..end.max(start))?;
                let part = s[start..end.max(start)].to_vec();
                let n = part.len();
                vec![cx.konst_value(Tensor::from_vec(&[n], part).ok_or_else(|| cx.err("shape"))?)]
            }
            "Size" => {
                let x = cx.req(0)?;
                cx.static_size(0, 0..cx.ty(x).rank())?;
                let n = cx.ty(x).numel() as i64;
                vec![cx.konst_value(Tensor::scalar(n))]
            }
            "ConstantOfShape" => {
                let shape = cx
                    .konst_ints(0)?
                    .ok_or_else(|| cx.err_in(0, "required input is missing"))?;
                let shape: Vec<usize> = shape
                    .iter()
                    .map(|&d| {
                        usize::try_from(d)
                            .map_err(|_| cx.err_in(0, format!("negative dimension {d}")))
                    })
                    .collect::<Result<_>>()?;
                let value = cx.tensor("value")?.unwrap_or_else(|| Tensor::scalar(0f32));
                if value.numel() != 1 {
                    return Err(cx.err("attribute 'value' must hold exactly one element"));
                }
                // A scalar broadcast to the shape: folded when small, a runtime expand otherwise.
                let scalar = value
                    .reshape(&[])
                    .ok_or_else(|| cx.err("attribute 'value' is empty"))?;
                let s = cx.konst_value(scalar);
                vec![cx.add1(mlopt_ir::Op::Expand { shape }, &[s])?]
            }
            "Range" => vec![range(cx)?],
            _ => return Ok(None),
        };
        Ok(Some(out))
    })();
    r.transpose()
}

fn dropout(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Value>> {
    let x = cx.req(0)?;
    cx.float("ratio", 0.5)?;
    cx.int("is_test", 1)?;
    cx.int_opt("seed")?;
    if cx.opset() >= 12 {
        // The ratio (input 1) does not matter in inference: read, so it is not an unknown input.
        cx.input(1)?;
        if let Some(t) = cx.konst(2)? {
            if t.to_f64_vec().first().is_some_and(|&v| v != 0.0) {
                return Err(cx.err_in(
                    2,
                    "training_mode=true is not supported (mlopt compiles inference)",
                ));
            }
        } else if cx.input(2)?.is_some() {
            return Err(cx.err_in(2, "training_mode must be a constant"));
        }
    }
    let mut outs = vec![x];
    if cx.num_outputs() > 1 {
        // In inference the mask keeps everything: all true (bool from opset 10, the input's type before).
        let ty = cx.ty(x).clone();
        let mask = if cx.opset() >= 10 {
            Tensor::full(&mlopt_ir::TensorType::new(DType::Bool, ty.shape), 1.0)
        } else {
            Tensor::full(&ty, 1.0)
        };
        outs.push(cx.konst_value(mask));
    }
    Ok(outs)
}

fn constant(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let mut found = vec![];
    if let Some(t) = cx.tensor("value")? {
        found.push(t);
    }
    if let Some(v) = cx.float_opt("value_float")? {
        found.push(Tensor::scalar(v));
    }
    if let Some(v) = cx.floats("value_floats")? {
        found.push(Tensor::from_vec(&[v.len()], v).ok_or_else(|| cx.err("value_floats"))?);
    }
    if let Some(v) = cx.int_opt("value_int")? {
        found.push(Tensor::scalar(v));
    }
    if let Some(v) = cx.ints("value_ints")? {
        found.push(Tensor::from_vec(&[v.len()], v).ok_or_else(|| cx.err("value_ints"))?);
    }
    for unsupported in ["value_string", "value_strings", "sparse_value"] {
        if cx.has_attr(unsupported) {
            return Err(cx.err(format!("attribute '{unsupported}' is not supported")));
        }
    }
    match found.len() {
        1 => Ok(cx.konst_value(found.remove(0))),
        0 => Err(cx.err("needs one of value, value_float(s), value_int(s)")),
        _ => Err(cx.err("has more than one value attribute")),
    }
}

fn range(cx: &mut NodeCx<'_, '_>) -> Result<Value> {
    let get = |cx: &NodeCx<'_, '_>, i: usize| -> Result<Tensor> {
        let t = cx
            .konst(i)?
            .ok_or_else(|| cx.err_in(i, "required input is missing"))?;
        if t.numel() != 1 {
            return Err(cx.err_in(i, "must be a scalar"));
        }
        Ok((*t).clone())
    };
    let (start, limit, delta) = (get(cx, 0)?, get(cx, 1)?, get(cx, 2)?);
    let dtype = start.dtype();
    if limit.dtype() != dtype || delta.dtype() != dtype {
        return Err(cx.err("start, limit and delta must have the same type"));
    }
    with_dtype!(dtype, T => {
        let (s, l, d) = (start.to_f64_vec()[0], limit.to_f64_vec()[0], delta.to_f64_vec()[0]);
        if d == 0.0 {
            return Err(cx.err_in(2, "delta cannot be 0"));
        }
        let n = ((l - s) / d).ceil().max(0.0);
        if n * dtype.size() as f64 > super::FOLD_LIMIT_BYTES as f64 {
            return Err(cx.err(format!("a range of {n} values is larger than mlopt folds into a constant")));
        }
        let n = n as usize;
        let v: Vec<T> = if dtype.is_int() {
            // In i128: start + i * delta may leave i64 (i * delta alone does for start near i64::MIN),
            // and n from f64 may count one value too many; such a value is an error, not a wrap.
            let (si, di) = (start.to_i64_vec()[0] as i128, delta.to_i64_vec()[0] as i128);
            (0..n as i128)
                .map(|i| i64::try_from(si + i * di).map(T::from_i64).map_err(|_| cx.err(format!("value {} of the range overflows", si + i * di))))
                .collect::<Result<_>>()?
        } else {
            // ONNX accumulates in the element type: start, start+delta, start+2*delta, ...
            let mut acc = T::from_f64(s);
            let step = T::from_f64(d);
            (0..n).map(|_| { let cur = acc; acc = T::from_f64(acc.to_f64() + step.to_f64()); cur }).collect()
        };
        Ok(cx.konst_value(Tensor::from_vec(&[n], v).ok_or_else(|| cx.err("range"))?))
    })
}
