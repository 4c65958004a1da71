//! Model-level import: decode, check IR version and opsets, create graph inputs (pinning symbolic
//! dimensions from `--input-shape`), load initializers, convert nodes in order, bind outputs, verify.

use crate::convert::{convert_scoped, Importer, Item};
use crate::error::{OnnxError, Result};
use crate::interface::{element_name, form, Form};
use crate::proto::{data_type, tensor_shape_proto::dimension, ModelProto, ValueInfoProto};
use crate::tensor_io::{dtype_from_onnx, tensor_from_proto};
use mlopt_ir::{Graph, TensorType};
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The IR versions and default-domain opsets mlopt reads: what onnx 1.23 writes (IR version 14, opset
/// 28). IR versions 12-14 add element types (float8 E8M0, int2, float6), each refused where a tensor
/// has one. Opsets 24-28 change ops in three ways, each handled: new element types (refused per
/// tensor), new attributes and inputs (Cast's `round_mode`, Range's `stash_type`, SpaceToDepth's
/// `mode`, Attention's `nonpad_kv_seqlen` and windows: a converter refuses any attribute or input it
/// does not read), and semantics made precise where earlier opsets were silent (BitShift by the width or
/// more; Mod's float `fmod=0`, Python's %), which mlopt follows at every opset.
pub const IR_VERSIONS: std::ops::RangeInclusive<i64> = 3..=14;
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=28;

/// What the user pins before import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Concrete shapes for graph inputs, by name; required for inputs with symbolic dimensions.
    pub input_shapes: HashMap<String, Vec<usize>>,
    /// Values of graph inputs that may stand in where an op needs a constant operand (a Reshape's shape,
    /// reduction axes, ...). The graph is then specialised to these values, so only callers that evaluate
    /// it on exactly these inputs (`mlopt run` and `check`) may pass them.
    pub known_values: HashMap<String, mlopt_ir::Tensor>,
    /// Graph inputs fixed to a value (`--input-value`): each becomes a constant of the graph, which is no
    /// longer an input of the compiled code, and everything it decides folds (an `If` on it, shapes).
    pub pinned_values: HashMap<String, mlopt_ir::Tensor>,
    /// Lengths of sequence inputs (a sequence input `s`'s elements are the inputs `s.0`, `s.1`, ..,
    /// whose shapes `input_shapes` pins; without a length here, the elements it pins give it).
    pub sequence_lengths: HashMap<String, usize>,
    /// Optional inputs that are empty (compiled without them); the others are present.
    pub absent: HashSet<String>,
}

/// Parses `--input-value NAME=V,V,...` for the graph input `v`: as many values as its declared static
/// shape holds (one for a scalar), of its declared element type (integers exactly; `true`/`false` for
/// bool).
pub fn parse_input_value(
    arg: &str,
    v: &ValueInfoProto,
) -> std::result::Result<mlopt_ir::Tensor, String> {
    let (_, text) = arg
        .split_once('=')
        .ok_or_else(|| format!("'{arg}' is not NAME=VALUE (e.g. sr=16000, or x=1,2,3)"))?;
    let (dtype, dims) = declared_type(v).map_err(|e| e.to_string())?;
    let shape: Vec<usize> = dims
        .ok_or_else(|| format!("input '{}' has no declared shape to fill", v.name))?
        .iter()
        .map(|(d, sym)| {
            d.ok_or_else(|| format!("input '{}' has the symbolic dimension '{sym}'", v.name))
        })
        .collect::<std::result::Result<_, _>>()?;
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    let n = mlopt_ir::checked_numel(&shape).unwrap_or(usize::MAX);
    if items.len() != n {
        return Err(format!(
            "input '{}' holds {n} values ({shape:?}); {} given",
            v.name,
            items.len()
        ));
    }
    let bad = |x: &str| format!("input '{}': '{x}' is not a {dtype:?} value", v.name);
    let tensor = |t: Option<mlopt_ir::Tensor>| {
        t.map(|t| t.cast(dtype))
            .ok_or_else(|| format!("input '{}': {shape:?}", v.name))
    };
    if dtype.is_float() {
        let f: Vec<f64> = items
            .iter()
            .map(|x| x.parse::<f64>().map_err(|_| bad(x)))
            .collect::<std::result::Result<_, _>>()?;
        return tensor(mlopt_ir::Tensor::from_vec(&shape, f));
    }
    let ints: Vec<i64> = items
        .iter()
        .map(|x| match (dtype, *x) {
            (mlopt_ir::DType::Bool, "true" | "1") => Ok(1),
            (mlopt_ir::DType::Bool, "false" | "0") => Ok(0),
            (mlopt_ir::DType::Bool, _) => Err(bad(x)),
            _ => x.parse::<i64>().map_err(|_| bad(x)),
        })
        .collect::<std::result::Result<_, _>>()?;
    let t = tensor(mlopt_ir::Tensor::from_vec(&shape, ints.clone()))?;
    // Integers out of the type's range would wrap in the cast: refused instead.
    if t.to_i64_vec() != ints {
        return Err(format!(
            "input '{}': a value is out of {dtype:?}'s range",
            v.name
        ));
    }
    Ok(t)
}

/// Parses `NAME=1x3x224x224` (a scalar is `NAME=`).
pub fn parse_input_shape(s: &str) -> std::result::Result<(String, Vec<usize>), String> {
    let (name, dims) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not NAME=DIMS (e.g. x=1x3x224x224)"))?;
    let dims = if dims.is_empty() {
        vec![]
    } else {
        dims.split(['x', ','])
            .map(|d| {
                d.trim()
                    .parse()
                    .map_err(|_| format!("bad dimension '{d}' in '{s}'"))
            })
            .collect::<std::result::Result<_, _>>()?
    };
    Ok((name.to_string(), dims))
}

pub fn decode_model(bytes: &[u8], what: &str) -> Result<ModelProto> {
    ModelProto::decode(bytes).map_err(|e| OnnxError::Decode {
        what: what.to_string(),
        msg: e.to_string(),
    })
}

pub fn load_model(path: &Path) -> Result<ModelProto> {
    let bytes = crate::tensor_io::read_regular(path)?;
    decode_model(&bytes, &path.display().to_string())
}

/// Reads and imports a model file; external data is looked up next to it.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Graph> {
    let model = load_model(path)?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    import_model(&model, Some(crate::tensor_io::folder_of(path)), &stem, opts)
}

/// The default-domain opset a model imports.
pub fn default_opset(model: &ModelProto) -> Result<i64> {
    let mut opset = None;
    for o in &model.opset_import {
        if o.domain.is_empty() || o.domain == "ai.onnx" {
            opset = Some(o.version);
        }
    }
    let opset = opset.ok_or_else(|| {
        OnnxError::Model("no opset is imported for the default ONNX domain".into())
    })?;
    if (1..*OPSETS.start()).contains(&opset) {
        return older_opset(model, opset);
    }
    if !OPSETS.contains(&opset) {
        return Err(OnnxError::Model(format!(
            "opset {opset} is not supported (mlopt reads opsets {}..={}, and older ones whose ops \
             are defined as at opset {})",
            OPSETS.start(),
            OPSETS.end(),
            OPSETS.start()
        )));
    }
    Ok(opset)
}

/// The default-domain ops whose opset-7 definition is older than opset 7, with the opset it dates from
/// (onnx's schema history): a model of an older opset whose every op is here, from that opset or an
/// earlier one, means what it would at opset 7. Ops defined anew at 6 or 7 (Add's legacy broadcast, Cast's
/// `to` as a string before 6, BatchNormalization's `consumed_inputs`) are not, or date from then.
#[rustfmt::skip]
const UNCHANGED_SINCE: &[(&str, i64)] = &[
    ("Abs", 6), ("ArgMax", 1), ("ArgMin", 1), ("Cast", 6), ("Ceil", 6), ("Clip", 6), ("Concat", 4),
    ("Constant", 1), ("Conv", 1), ("ConvTranspose", 1), ("DepthToSpace", 1), ("Elu", 6), ("Exp", 6),
    ("Flatten", 1), ("Floor", 6), ("Gather", 1), ("GlobalAveragePool", 1), ("GlobalLpPool", 2),
    ("GlobalMaxPool", 1), ("HardSigmoid", 6), ("Hardmax", 1), ("Identity", 1), ("If", 1),
    ("InstanceNormalization", 6), ("LRN", 1), ("LeakyRelu", 6), ("Log", 6), ("LogSoftmax", 1),
    ("Loop", 1), ("LpNormalization", 1), ("LpPool", 2), ("MatMul", 1), ("Max", 6), ("MaxPool", 1),
    ("MaxRoiPool", 1), ("Mean", 6), ("Min", 6), ("Neg", 6), ("Not", 1), ("Pad", 2), ("RandomNormal", 1),
    ("RandomNormalLike", 1), ("RandomUniform", 1), ("RandomUniformLike", 1), ("Reciprocal", 6),
    ("ReduceL1", 1), ("ReduceL2", 1), ("ReduceLogSum", 1), ("ReduceLogSumExp", 1), ("ReduceMax", 1),
    ("ReduceMean", 1), ("ReduceMin", 1), ("ReduceProd", 1), ("ReduceSum", 1), ("ReduceSumSquare", 1),
    ("Relu", 6), ("Reshape", 5), ("Selu", 6), ("Shape", 1), ("Sigmoid", 6), ("Size", 1), ("Slice", 1),
    ("Softmax", 1), ("Softplus", 1), ("Softsign", 1), ("SpaceToDepth", 1), ("Split", 2), ("Sqrt", 6),
    ("Squeeze", 1), ("Sum", 6), ("Tanh", 6), ("Tile", 6), ("TopK", 1), ("Transpose", 1),
    ("Unsqueeze", 1),
];

/// A model of default-domain opset `opset` below 7, read as opset 7 when each of its nodes (in subgraphs
/// too) is an op that `UNCHANGED_SINCE` dates from `opset` or earlier; else an error naming the first
/// node that is not.
fn older_opset(model: &ModelProto, opset: i64) -> Result<i64> {
    fn check(g: &crate::proto::GraphProto, opset: i64) -> Result<()> {
        for n in &g.node {
            let since = (n.domain.is_empty() || n.domain == "ai.onnx")
                .then(|| UNCHANGED_SINCE.iter().find(|(op, _)| *op == n.op_type))
                .flatten()
                .map(|(_, since)| *since);
            if since.is_none_or(|since| since > opset) {
                return Err(OnnxError::Model(format!(
                    "opset {opset}: node '{}' ({}) is defined otherwise at opset {}, the oldest mlopt \
                     reads (an older model is read when its ops are unchanged since its opset)",
                    n.name,
                    n.op_type,
                    OPSETS.start()
                )));
            }
            for a in &n.attribute {
                for sub in a.g.iter().chain(&a.graphs) {
                    check(sub, opset)?;
                }
            }
        }
        Ok(())
    }
    if let Some(g) = &model.graph {
        check(g, opset)?;
    }
    Ok(*OPSETS.start())
}

/// Declared dimensions: a size, or `None` with the symbol of a symbolic or unknown dimension.
pub type DeclaredDims = Vec<(Option<usize>, String)>;

/// An initializer that is also a graph input (the value the input defaults to) must be of the input's
/// declared type: ONNX Runtime refuses an f32[4] initializer for an input declared f32[7], and so does
/// mlopt (it would otherwise compute with the initializer while a caller passes seven values).
fn check_default(v: &ValueInfoProto, t: &mlopt_ir::Tensor) -> Result<()> {
    let err = |declared: String| {
        OnnxError::Model(format!(
            "input '{}' is declared {declared} but its initializer is {}",
            v.name,
            t.ty()
        ))
    };
    let (dtype, dims) = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        // An input declared without a type takes its initializer's.
        None => return Ok(()),
        Some(_) => declared_type(v)?,
    };
    if dtype != t.dtype() {
        return Err(err(format!("{dtype}")));
    }
    let Some(dims) = dims else { return Ok(()) };
    let fits = dims.len() == t.shape().len()
        && dims
            .iter()
            .zip(t.shape())
            .all(|((d, _), n)| d.is_none_or(|d| d == *n));
    if !fits {
        let text: Vec<String> = dims
            .iter()
            .take(mlopt_ir::graph::MAX_RANK)
            .map(|(d, sym)| d.map_or(sym.clone(), |d| d.to_string()))
            .collect();
        return Err(err(format!("{dtype}[{}]", text.join(","))));
    }
    Ok(())
}

/// The declared tensor type of a graph input or output (of a sequence's elements, of an optional's
/// content: see `interface::form`): dtype and dims (`None` for a symbolic or unknown dim, with its
/// symbol), or `None` when the shape is not given at all.
pub fn declared_type(v: &ValueInfoProto) -> Result<(mlopt_ir::DType, Option<DeclaredDims>)> {
    let err = |msg: String| OnnxError::Model(format!("value '{}': {msg}", v.name));
    form(v)?;
    let Some(t) = crate::interface::tensor_type(v) else {
        return Err(err("its type declares no tensor".into()));
    };
    let dtype = dtype_from_onnx(t.elem_type).ok_or_else(|| {
        err(format!(
            "data type {} is not supported",
            data_type::name(t.elem_type)
        ))
    })?;
    let dims = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(n)) if *n >= 0 => {
                    (Some(*n as usize), String::new())
                }
                Some(dimension::Value::DimParam(p)) => (None, p.clone()),
                _ => (None, "?".to_string()),
            })
            .collect()
    });
    Ok((dtype, dims))
}

/// Declared dimensions as text: `[batch, 64]` (a symbol for each symbolic dimension, `?` where none).
pub fn dims_text(dims: &DeclaredDims) -> String {
    let d: Vec<String> = dims
        .iter()
        .map(|(d, sym)| d.map_or_else(|| sym.clone(), |d| d.to_string()))
        .collect();
    format!("[{}]", d.join(", "))
}

/// Whether `shape` fits the declared dimensions (same rank, same size where one is given).
pub fn fits_declared(dims: &DeclaredDims, shape: &[usize]) -> bool {
    dims.len() == shape.len()
        && dims
            .iter()
            .zip(shape)
            .all(|((d, _), s)| d.is_none_or(|d| d == *s))
}

/// The type of the graph input `name` declared by `v` (itself, or an element of the sequence `v`).
fn input_type(v: &ValueInfoProto, name: &str, pinned: Option<&Vec<usize>>) -> Result<TensorType> {
    let (dtype, dims) = declared_type(v)?;
    match (dims, pinned) {
        (Some(dims), Some(p)) => {
            if !fits_declared(&dims, p) {
                return Err(OnnxError::Model(format!(
                    "input '{name}' is declared {dtype}{}, but its shape is pinned to {p:?}",
                    dims_text(&dims),
                )));
            }
            Ok(TensorType::new(dtype, p.clone()))
        }
        (None, Some(p)) => Ok(TensorType::new(dtype, p.clone())),
        (None, None) => Err(OnnxError::DynamicDim {
            input: name.to_string(),
            dim: 0,
            symbol: "unknown rank".into(),
        }),
        (Some(dims), None) => {
            let mut shape = vec![];
            for (i, (d, sym)) in dims.into_iter().enumerate() {
                match d {
                    Some(d) => shape.push(d),
                    None => {
                        return Err(OnnxError::DynamicDim {
                            input: name.to_string(),
                            dim: i,
                            symbol: sym,
                        })
                    }
                }
            }
            Ok(TensorType::new(dtype, shape))
        }
    }
}

/// Imports a decoded model. `base` is the model's folder (for external data), `name` the graph's name
/// when the model does not give one.
pub fn import_model(
    model: &ModelProto,
    base: Option<&Path>,
    name: &str,
    opts: &ImportOptions,
) -> Result<Graph> {
    if !IR_VERSIONS.contains(&model.ir_version) {
        return Err(OnnxError::Model(format!(
            "IR version {} is not supported (mlopt reads IR versions {}..={})",
            model.ir_version,
            IR_VERSIONS.start(),
            IR_VERSIONS.end()
        )));
    }
    let opset = default_opset(model)?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::Model("the model has no graph".into()))?;
    if let Some(s) = graph.sparse_initializer.first() {
        let n = s.values.as_ref().map(|v| v.name.as_str()).unwrap_or("");
        return Err(OnnxError::Tensor {
            name: n.into(),
            msg: "sparse initializers are not supported".into(),
        });
    }
    let gname = if graph.name.is_empty() {
        name.to_string()
    } else {
        graph.name.clone()
    };
    let mut imp = Importer {
        g: Graph::new(gname),
        vals: HashMap::new(),
        opset,
        base,
        known: &opts.known_values,
        unrolled: 0,
        counted: false,
        extents: Default::default(),
    };
    let inits: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut declared: HashMap<&str, Form> = HashMap::new();
    for v in graph
        .input
        .iter()
        .filter(|v| !inits.contains(v.name.as_str()))
    {
        declared.insert(v.name.as_str(), form(v)?);
    }
    check_named(opts, &declared)?;
    for v in &graph.input {
        if inits.contains(v.name.as_str()) {
            continue;
        }
        if imp.vals.contains_key(&v.name) {
            return Err(OnnxError::Model(format!(
                "input '{}' is declared twice",
                v.name
            )));
        }
        let f = form(v)?;
        let item = if f.is_optional() && opts.absent.contains(&v.name) {
            Item::Absent
        } else if f.is_seq() {
            let n = sequence_length(v, opts)?;
            let mut elems = Vec::with_capacity(n);
            for k in 0..n {
                let name = element_name(&v.name, k);
                if declared.contains_key(name.as_str()) || inits.contains(name.as_str()) {
                    return Err(OnnxError::Model(format!(
                        "input '{}' is a sequence whose element {k} is the input '{name}', a name \
                         the model gives another value",
                        v.name
                    )));
                }
                elems.push(tensor_input(&mut imp, v, &name, opts)?);
            }
            Item::Seq(elems)
        } else {
            Item::Tensor(tensor_input(&mut imp, v, &v.name, opts)?)
        };
        imp.vals.insert(v.name.clone(), item);
    }
    let mut seen = HashSet::new();
    for t in &graph.initializer {
        if !seen.insert(t.name.as_str()) {
            return Err(OnnxError::Tensor {
                name: t.name.clone(),
                msg: "initializer is defined twice".into(),
            });
        }
        let tensor = tensor_from_proto(t, base)?;
        if let Some(v) = graph.input.iter().find(|v| v.name == t.name) {
            check_default(v, &tensor)?;
        }
        let val = imp.g.add_const(t.name.clone(), tensor);
        imp.vals.insert(t.name.clone(), Item::Tensor(val));
    }
    for node in &graph.node {
        convert_scoped(&mut imp, node)?;
    }
    // Values whose size depends on the data: their declared size along that axis is not the bound.
    let sized = if imp.counted {
        imp.extents.update(&imp.g)?.clone()
    } else {
        Default::default()
    };
    let mut named: HashSet<String> = graph.output.iter().map(|o| o.name.clone()).collect();
    for out in &graph.output {
        let item = imp.vals.get(&out.name).cloned().ok_or_else(|| {
            OnnxError::Model(format!("output '{}' is not produced by any node", out.name))
        })?;
        let f = form(out)?;
        let declared_as = |what: &str| {
            OnnxError::Model(format!(
                "output '{}' is declared {what} but computes {}",
                out.name,
                item.kind()
            ))
        };
        match &item {
            Item::Tensor(v) if !f.is_seq() => {
                check_output(&imp.g, out, &out.name, *v, &sized)?;
                imp.g.add_output(out.name.clone(), *v);
            }
            Item::Seq(vs) if f.is_seq() => {
                for (k, &v) in vs.iter().enumerate() {
                    let name = element_name(&out.name, k);
                    if !named.insert(name.clone()) {
                        return Err(OnnxError::Model(format!(
                            "output '{}' is a sequence whose element {k} is the output '{name}', a \
                             name the model gives another output",
                            out.name
                        )));
                    }
                    check_output(&imp.g, out, &name, v, &sized)?;
                    imp.g.add_output(name, v);
                }
            }
            Item::Absent if f.is_optional() => {}
            _ if f.is_seq() => return Err(declared_as("a sequence")),
            _ if f.is_optional() => return Err(declared_as("an optional tensor")),
            _ => return Err(declared_as("a tensor")),
        }
    }
    if imp.counted {
        mlopt_ir::extent::expose_counts(&mut imp.g)?;
    }
    imp.g.remove_dead();
    mlopt_ir::verify::verify(&imp.g)?;
    Ok(imp.g)
}

/// An error unless the graph output `name` (`out` itself, or an element of the sequence `out`) computes
/// what `out` declares; along an axis sized by the data (`sized`) the declared size is not the bound.
fn check_output(
    g: &Graph,
    out: &ValueInfoProto,
    name: &str,
    v: mlopt_ir::Value,
    sized: &HashMap<mlopt_ir::Value, mlopt_ir::extent::Extent>,
) -> Result<()> {
    let got = g.value_type(v).clone();
    let Ok((dtype, dims)) = declared_type(out) else {
        return Ok(());
    };
    let dims_ok = dims.as_ref().is_none_or(|d| {
        d.len() == got.rank()
            && d.iter().zip(&got.shape).enumerate().all(|(k, (a, b))| {
                a.0.is_none_or(|a| a == *b) || sized.get(&v).is_some_and(|e| e.axis == k)
            })
    });
    if dtype != got.dtype || !dims_ok {
        return Err(OnnxError::Model(format!(
            "output '{name}' is declared {:?} {:?} but computes {got}",
            dtype,
            dims.map(|d| d.iter().map(|x| x.0).collect::<Vec<_>>())
        )));
    }
    Ok(())
}

/// An error unless every input `--input-shape` and `--input-value` name (and every sequence length and
/// empty optional) is a graph input of the right form: a sequence's shapes are its elements', `s.0`,
/// `s.1`, ..; a value pins a tensor.
fn check_named(opts: &ImportOptions, declared: &HashMap<&str, Form>) -> Result<()> {
    let element = |k: &str| {
        let (seq, i) = k.rsplit_once('.')?;
        let f = declared.get(seq)?;
        (f.is_seq() && i.parse::<usize>().is_ok_and(|n| n.to_string() == i)).then_some(())
    };
    for k in opts.input_shapes.keys() {
        match declared.get(k.as_str()) {
            Some(f) if f.is_seq() => {
                return Err(OnnxError::Model(format!(
                    "--input-shape names '{k}', a sequence: pin its elements' shapes as {k}.0, \
                     {k}.1, .."
                )))
            }
            Some(_) => {}
            None if element(k).is_some() => {}
            None => {
                return Err(OnnxError::Model(format!(
                    "--input-shape names '{k}', which is not a graph input"
                )))
            }
        }
    }
    for k in opts.pinned_values.keys() {
        if declared.get(k.as_str()).is_none_or(|f| f.is_seq()) {
            return Err(OnnxError::Model(format!(
                "--input-value names '{k}', which is not a graph input holding a tensor"
            )));
        }
    }
    for k in opts.sequence_lengths.keys() {
        if !declared.get(k.as_str()).is_some_and(|f| f.is_seq()) {
            return Err(OnnxError::Model(format!(
                "a sequence is given for '{k}', which is not a sequence input"
            )));
        }
    }
    for k in &opts.absent {
        if !declared.get(k.as_str()).is_some_and(|f| f.is_optional()) {
            return Err(OnnxError::Model(format!(
                "an empty optional is given for '{k}', which is not an optional input"
            )));
        }
    }
    Ok(())
}

/// The length of the sequence input `v`: given, or one past the last element `--input-shape` pins.
fn sequence_length(v: &ValueInfoProto, opts: &ImportOptions) -> Result<usize> {
    let pinned: Vec<usize> = opts
        .input_shapes
        .keys()
        .filter_map(|k| {
            let i = k.strip_prefix(v.name.as_str())?.strip_prefix('.')?;
            i.parse::<usize>().ok().filter(|n| n.to_string() == i)
        })
        .collect();
    let n = match (opts.sequence_lengths.get(&v.name), pinned.iter().max()) {
        (Some(&n), _) => n,
        (None, Some(&last)) => last.saturating_add(1),
        (None, None) => {
            return Err(OnnxError::Model(format!(
                "input '{0}' is a sequence: mlopt compiles sequences of a static length; pin each \
                 element's shape with --input-shape {0}.0=DIMS --input-shape {0}.1=DIMS ..",
                v.name
            )))
        }
    };
    if n > crate::convert::MAX_SEQUENCE {
        return Err(OnnxError::Model(format!(
            "input '{}': a sequence of {n} elements is more than mlopt keeps ({})",
            v.name,
            crate::convert::MAX_SEQUENCE
        )));
    }
    if let Some(k) = pinned.iter().find(|&&k| k >= n) {
        return Err(OnnxError::Model(format!(
            "--input-shape pins '{}', past the end of the sequence '{}' of {n} elements",
            element_name(&v.name, *k),
            v.name
        )));
    }
    Ok(n)
}

/// The graph input `name` (`v` itself, or an element of the sequence `v`): a constant where
/// `--input-value` pins it, else an input of its pinned or declared shape within mlopt's limits.
fn tensor_input(
    imp: &mut Importer<'_>,
    v: &ValueInfoProto,
    name: &str,
    opts: &ImportOptions,
) -> Result<mlopt_ir::Value> {
    match opts.pinned_values.get(name) {
        Some(_) if opts.input_shapes.contains_key(name) => Err(OnnxError::Model(format!(
            "input '{name}' is given both a shape and a value"
        ))),
        Some(t) => Ok(imp.g.add_const(name.to_string(), t.clone())),
        None => {
            let ty = input_type(v, name, opts.input_shapes.get(name))?;
            if ty.rank() > mlopt_ir::graph::MAX_RANK
                || ty
                    .checked_bytes()
                    .is_none_or(|b| b > mlopt_ir::graph::max_value_bytes())
            {
                return Err(OnnxError::Model(format!(
                    "input '{name}': {ty} is beyond mlopt's limits (rank {}, {} per value)",
                    mlopt_ir::graph::MAX_RANK,
                    mlopt_ir::graph::gib(mlopt_ir::graph::max_value_bytes())
                )));
            }
            Ok(imp.g.add_input(name.to_string(), ty))
        }
    }
}
