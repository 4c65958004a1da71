//! ONNX node -> IR ops. `NodeCx` gives a converter typed access to one node's inputs and attributes and
//! adds IR nodes on its behalf; every attribute a converter does not read is reported as unsupported, so an
//! attribute mlopt does not understand can never be silently ignored.
//!
//! Nodes whose inputs are all constants are evaluated right away by the reference interpreter (constant
//! folding during import). Since shapes are static, this folds the shape subgraphs exporters emit
//! (`Shape -> Gather -> Concat -> Reshape`, `ConstantOfShape`, `Range`, ...) before they reach the graph.

mod composite;
mod control;
mod counted;
mod einsum;
mod elementwise;
mod layout;
mod linalg;
mod nn;
mod quant;
mod rnn;
mod roi;
mod sequence;
mod shape;
mod spectral;
mod transformer;
mod unpool;

pub(crate) use sequence::MAX_SEQUENCE;

use crate::error::{OnnxError, Result};
use crate::proto::{attribute_type as at, AttributeProto, NodeProto};
use crate::tensor_io::tensor_from_proto;
use mlopt_ir::{interp::eval_op, Graph, Op, Tensor, TensorType, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// Constant folding creates constants of at most this many bytes.
pub const FOLD_LIMIT_BYTES: usize = 64 << 20;

/// Whether values of these types are small enough to fold into constants.
fn fits_fold_limit(tys: &[TensorType]) -> bool {
    tys.iter()
        .map(|t| t.checked_bytes().unwrap_or(usize::MAX))
        .fold(0usize, usize::saturating_add)
        <= FOLD_LIMIT_BYTES
}

/// What an ONNX name stands for during import. mlopt's graphs hold tensors only: a sequence is known at
/// compile time as its tensors (its length is static), an optional as its content or its absence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    Tensor(Value),
    Seq(Vec<Value>),
    /// An optional without a value.
    Absent,
}

impl Item {
    /// What kind of value this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Item::Tensor(_) => "a tensor",
            Item::Seq(_) => "a sequence",
            Item::Absent => "an empty optional",
        }
    }
}

/// State shared by all nodes of one import.
pub(crate) struct Importer<'m> {
    pub g: Graph,
    pub vals: HashMap<String, Item>,
    pub opset: i64,
    pub base: Option<&'m Path>,
    /// Values of graph inputs that may be used as constant operands (see `ImportOptions::known_values`).
    pub known: &'m HashMap<String, Tensor>,
    /// Whether a data-sized op (`mlopt_ir::extent`) was added: only then may a value's size differ
    /// from its type's.
    pub counted: bool,
    /// The data-sized values so far, kept up to date as nodes are added (`NodeCx::static_size`).
    pub extents: mlopt_ir::extent::Growing,
    /// Body nodes converted so far by unrolled `Loop`s and `Scan`s, nested ones included (see
    /// `control::MAX_UNROLLED_NODES`).
    pub unrolled: usize,
}

/// One node being converted.
pub(crate) struct NodeCx<'a, 'm> {
    pub imp: &'a mut Importer<'m>,
    pub node: &'a NodeProto,
    /// The node's name for messages: its ONNX name, else its first output's.
    pub name: String,
    attrs: HashMap<&'a str, &'a AttributeProto>,
    used: HashSet<&'a str>,
    /// The inputs the converter has read (`input`): a present input it never read is an error, as an
    /// attribute it never read is (a node with too many inputs).
    read: std::cell::RefCell<Vec<bool>>,
    /// Keep the ops this node adds even where their inputs are constants (a dequantized 8-bit weight:
    /// the optimiser folds it, and reads its integers from the ops, `quant.rs`).
    pub keep_ops: bool,
}

impl<'a, 'm> NodeCx<'a, 'm> {
    pub fn err(&self, msg: impl Into<String>) -> OnnxError {
        OnnxError::Node {
            node: self.name.clone(),
            op: self.node.op_type.clone(),
            input: None,
            msg: msg.into(),
        }
    }

    pub fn err_in(&self, i: usize, msg: impl Into<String>) -> OnnxError {
        let input = self
            .node
            .input
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("#{i}"));
        OnnxError::Node {
            node: self.name.clone(),
            op: self.node.op_type.clone(),
            input: Some(input),
            msg: msg.into(),
        }
    }

    pub fn opset(&self) -> i64 {
        self.imp.opset
    }

    pub fn num_inputs(&self) -> usize {
        self.node.input.len()
    }

    /// Output slots the model actually uses (trailing empty names dropped).
    pub fn num_outputs(&self) -> usize {
        self.node
            .output
            .iter()
            .rposition(|o| !o.is_empty())
            .map_or(0, |i| i + 1)
    }

    /// Input `i`, or `None` when absent or given as the empty name: a tensor.
    pub fn input(&self, i: usize) -> Result<Option<Value>> {
        match self.item(i)? {
            None => Ok(None),
            Some(Item::Tensor(v)) => Ok(Some(v)),
            Some(other) => Err(self.err_in(
                i,
                format!(
                    "is {}; {} takes a tensor here",
                    other.kind(),
                    self.node.op_type
                ),
            )),
        }
    }

    /// Input `i` as whatever it is (a tensor, a sequence, an empty optional), or `None` when absent or
    /// given as the empty name.
    pub fn item(&self, i: usize) -> Result<Option<Item>> {
        if let Some(r) = self.read.borrow_mut().get_mut(i) {
            *r = true;
        }
        match self.node.input.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => match self.imp.vals.get(name) {
                Some(v) => Ok(Some(v.clone())),
                None => Err(self.err_in(
                    i,
                    "is not produced by an earlier node, an initializer or a graph input",
                )),
            },
        }
    }

    pub fn req(&self, i: usize) -> Result<Value> {
        self.input(i)?
            .ok_or_else(|| self.err_in(i, "required input is missing"))
    }

    /// An error unless a value of type `t` fits mlopt's per-value limit: for sizes taken from the model
    /// (an attribute, a constant) before anything of that size is allocated.
    pub fn fits(&self, t: &TensorType) -> Result<()> {
        match t.checked_bytes() {
            Some(b) if b <= mlopt_ir::graph::max_value_bytes() => Ok(()),
            _ => Err(self.err(format!(
                "{t} is larger than mlopt's limit of {} per value",
                mlopt_ir::graph::gib(mlopt_ir::graph::max_value_bytes())
            ))),
        }
    }

    /// A constant of `n` values of `bytes` each that a converter builds (ids, a window) fits
    /// `FOLD_LIMIT_BYTES`: checked before it is allocated, since `n` comes from the file (a window of
    /// 2^40 values aborted the import on its allocation).
    /// `input` is the input that gave `n`.
    pub fn constant_fits(&self, n: usize, bytes: usize, input: usize) -> Result<()> {
        if n.saturating_mul(bytes) <= FOLD_LIMIT_BYTES {
            return Ok(());
        }
        Err(self.err_in(
            input,
            format!(
                "a constant of {n} values is larger than mlopt builds ({} MiB)",
                FOLD_LIMIT_BYTES >> 20
            ),
        ))
    }

    pub fn ty(&self, v: Value) -> &TensorType {
        self.imp.g.value_type(v)
    }

    /// An error if the size of input `i`'s value along an axis in `axes` depends on the data (its
    /// type holds only the bound): for converters that read a size from a value's type.
    pub fn static_size(&mut self, i: usize, axes: std::ops::Range<usize>) -> Result<()> {
        let Some(v) = self.input(i)? else {
            return Ok(());
        };
        if !self.imp.counted {
            return Ok(());
        }
        let imp = &mut *self.imp;
        let sized = imp.extents.update(&imp.g)?.get(&v).copied();
        match sized {
            Some(e) if axes.contains(&e.axis) => Err(self.err_in(
                i,
                format!(
                    "its size along axis {} depends on the data (mlopt computes it at a bound of \
                     {}, with a count); a size read from it would be the bound",
                    e.axis,
                    self.ty(v).shape[e.axis]
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The value of input `i`, which must be a constant when present: folded already, or computable from
    /// constants and known input values (see `ImportOptions::known_values`).
    pub fn konst(&self, i: usize) -> Result<Option<Arc<Tensor>>> {
        match self.input(i)? {
            None => Ok(None),
            Some(v) => match self.evaluate(v, &mut HashMap::new()) {
                Some(t) => Ok(Some(t)),
                None => Err(self.err_in(i, "must be a constant (mlopt compiles static shapes; this input depends on data, or is too large to fold)")),
            },
        }
    }

    /// Evaluates `v` if everything it depends on is a constant or a known input value.
    fn evaluate(
        &self,
        v: Value,
        memo: &mut HashMap<mlopt_ir::NodeId, Option<Vec<Arc<Tensor>>>>,
    ) -> Option<Arc<Tensor>> {
        let g = &self.imp.g;
        let node = g.node(v.node);
        match &node.op {
            Op::Const(t) => return Some(t.clone()),
            Op::Input => return self.imp.known.get(&node.name).map(|t| Arc::new(t.clone())),
            _ => {}
        }
        if !memo.contains_key(&v.node) {
            // Only what folding would also create: shape operands are small.
            if !fits_fold_limit(&node.outputs) {
                return None;
            }
            let ins = g.inputs(v.node);
            let mut args = vec![];
            for a in &ins {
                args.push(match a {
                    Some(a) => Some(self.evaluate(*a, memo)?),
                    None => None,
                });
            }
            let refs: Vec<Option<&Tensor>> = args.iter().map(|a| a.as_deref()).collect();
            let outs = eval_op(&node.op, &refs, &node.outputs)
                .ok()
                .map(|o| o.into_iter().map(Arc::new).collect());
            memo.insert(v.node, outs);
        }
        memo.get(&v.node)?.as_ref()?.get(v.output as usize).cloned()
    }

    /// A constant integer input (shape, axes, pads, ...) as i64s.
    pub fn konst_ints(&self, i: usize) -> Result<Option<Vec<i64>>> {
        Ok(self.konst(i)?.map(|t| t.to_i64_vec()))
    }

    fn attr(&mut self, name: &'a str, kinds: &[i32]) -> Result<Option<&'a AttributeProto>> {
        let Some(&a) = self.attrs.get(name) else {
            return Ok(None);
        };
        self.used.insert(name);
        if !a.ref_attr_name.is_empty() {
            return Err(self.err(format!(
                "attribute '{name}' refers to a function attribute; only graphs are supported"
            )));
        }
        if a.r#type != at::UNDEFINED && !kinds.contains(&a.r#type) {
            return Err(self.err(format!(
                "attribute '{name}' has the wrong type ({})",
                a.r#type
            )));
        }
        Ok(Some(a))
    }

    pub fn int_opt(&mut self, name: &'a str) -> Result<Option<i64>> {
        Ok(self.attr(name, &[at::INT])?.map(|a| a.i))
    }
    pub fn int(&mut self, name: &'a str, default: i64) -> Result<i64> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }
    pub fn float_opt(&mut self, name: &'a str) -> Result<Option<f32>> {
        Ok(self.attr(name, &[at::FLOAT])?.map(|a| a.f))
    }
    pub fn float(&mut self, name: &'a str, default: f32) -> Result<f32> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }
    pub fn ints(&mut self, name: &'a str) -> Result<Option<Vec<i64>>> {
        Ok(self.attr(name, &[at::INTS])?.map(|a| a.ints.clone()))
    }
    pub fn floats(&mut self, name: &'a str) -> Result<Option<Vec<f32>>> {
        Ok(self.attr(name, &[at::FLOATS])?.map(|a| a.floats.clone()))
    }
    pub fn string(&mut self, name: &'a str, default: &str) -> Result<String> {
        Ok(self
            .attr(name, &[at::STRING])?
            .map_or(default.to_string(), |a| {
                String::from_utf8_lossy(&a.s).into_owned()
            }))
    }
    pub fn strings(&mut self, name: &'a str) -> Result<Option<Vec<String>>> {
        Ok(self.attr(name, &[at::STRINGS])?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }
    pub fn tensor(&mut self, name: &'a str) -> Result<Option<Tensor>> {
        match self.attr(name, &[at::TENSOR])? {
            Some(a) => {
                let t =
                    a.t.as_ref()
                        .ok_or_else(|| self.err(format!("attribute '{name}' holds no tensor")))?;
                Ok(Some(tensor_from_proto(t, self.imp.base)?))
            }
            None => Ok(None),
        }
    }
    /// Marks an attribute as read when its only supported value is the default (checked by the caller).
    pub fn has_attr(&self, name: &str) -> bool {
        self.attrs.contains_key(name)
    }

    /// A non-negative integer list attribute, or `default` when absent.
    pub fn usizes(&mut self, name: &'a str, default: Vec<usize>) -> Result<Vec<usize>> {
        match self.ints(name)? {
            None => Ok(default),
            Some(v) => v
                .iter()
                .map(|&x| {
                    usize::try_from(x).map_err(|_| {
                        self.err(format!("attribute '{name}' has a negative value {x}"))
                    })
                })
                .collect(),
        }
    }

    /// Adds an IR op. If every input present is a constant, the op is evaluated now and its outputs become
    /// constants. Returns at most `n_out` outputs (all when `None`).
    pub fn add(
        &mut self,
        op: Op,
        inputs: &[Option<Value>],
        n_out: Option<usize>,
    ) -> Result<Vec<Value>> {
        let g = &mut self.imp.g;
        let all_const =
            inputs.iter().flatten().all(|v| g.const_value(*v).is_some()) && !inputs.is_empty();
        let outs = g.infer_outputs(&op, &self.name, inputs, n_out)?;
        // Large results stay computations rather than becoming constants in the model.
        if !(all_const && fits_fold_limit(&outs)) || self.keep_ops {
            return Ok(g.add_typed(op, self.name.clone(), inputs, outs));
        }
        let args: Vec<Option<Arc<Tensor>>> = inputs
            .iter()
            .map(|v| v.and_then(|v| g.const_value(v).cloned()))
            .collect();
        let refs: Vec<Option<&Tensor>> = args.iter().map(|a| a.as_deref()).collect();
        let vals = eval_op(&op, &refs, &outs)
            .map_err(|msg| self.err(format!("folding {}: {msg}", op.name())))?;
        Ok(vals
            .into_iter()
            .map(|t| self.imp.g.add_const("", t))
            .collect())
    }

    pub fn add1(&mut self, op: Op, inputs: &[Value]) -> Result<Value> {
        let ins: Vec<Option<Value>> = inputs.iter().copied().map(Some).collect();
        Ok(self.add(op, &ins, Some(1))?[0])
    }

    pub fn konst_value(&mut self, t: Tensor) -> Value {
        self.imp.g.add_const("", t)
    }
}

/// Converts one node and records its outputs under their ONNX names.
/// Converts `node` of a graph or a subgraph in the importer's scope: default-domain ops only.
pub(crate) fn convert_scoped(imp: &mut Importer<'_>, node: &NodeProto) -> Result<()> {
    if !(node.domain.is_empty() || node.domain == "ai.onnx") {
        return Err(OnnxError::UnsupportedOp {
            node: if node.name.is_empty() {
                node.output.first().cloned().unwrap_or_default()
            } else {
                node.name.clone()
            },
            op: node.op_type.clone(),
            domain: node.domain.clone(),
            opset: imp.opset,
        });
    }
    convert_node(imp, node)
}

fn convert_node(imp: &mut Importer<'_>, node: &NodeProto) -> Result<()> {
    let name = if node.name.is_empty() {
        node.output.first().cloned().unwrap_or_default()
    } else {
        node.name.clone()
    };
    let attrs = node
        .attribute
        .iter()
        .map(|a| (a.name.as_str(), a))
        .collect();
    let read = std::cell::RefCell::new(vec![false; node.input.len()]);
    let mut cx = NodeCx {
        imp,
        node,
        name,
        attrs,
        used: HashSet::new(),
        read,
        keep_ops: false,
    };
    let outs = dispatch(&mut cx)?;
    if let Some(unused) = node
        .attribute
        .iter()
        .find(|a| !cx.used.contains(a.name.as_str()))
    {
        return Err(cx.err(format!("attribute '{}' is not supported", unused.name)));
    }
    let unread = cx
        .read
        .borrow()
        .iter()
        .zip(&node.input)
        .position(|(r, name)| !r && !name.is_empty());
    if let Some(i) = unread {
        return Err(cx.err_in(
            i,
            format!("{} takes no input {i} (too many inputs)", node.op_type),
        ));
    }
    let wanted = cx.num_outputs();
    if outs.len() < wanted {
        return Err(cx.err(format!(
            "output {} ('{}') is not supported (mlopt produces {} output(s) for this op)",
            outs.len(),
            node.output[outs.len()],
            outs.len()
        )));
    }
    for (name, item) in node.output.iter().zip(outs) {
        if name.is_empty() {
            continue;
        }
        if cx.imp.vals.contains_key(name) {
            return Err(cx.err(format!(
                "output '{name}' is already defined (ONNX values are defined once)"
            )));
        }
        // A folded constant takes the name of the ONNX value it stands for.
        if let Item::Tensor(v) = item {
            let n = cx.imp.g.node_mut(v.node);
            if matches!(n.op, Op::Const(_)) && n.name.starts_with("const.") {
                n.name = name.clone();
            }
        }
        cx.imp.vals.insert(name.clone(), item);
    }
    Ok(())
}

/// A family of converters: `Some` when it knows the op type.
type Converter = fn(&mut NodeCx<'_, '_>, &str) -> Option<Result<Vec<Value>>>;

/// A family of converters whose inputs or outputs may be sequences or optionals: `Some` when it takes
/// the node.
type ItemConverter = fn(&mut NodeCx<'_, '_>, &str) -> Option<Result<Vec<Item>>>;

/// The families that handle sequences and optionals, tried first, with the op types they handle.
const ITEM_FAMILIES: &[(ItemConverter, &[&str])] = &[
    (sequence::convert, sequence::OPS),
    (control::convert, control::OPS),
];

/// Every converter family, with the ONNX op types it handles.
const FAMILIES: &[(Converter, &[&str])] = &[
    (elementwise::convert, elementwise::OPS),
    (nn::convert, nn::OPS),
    (layout::convert, layout::OPS),
    (shape::convert, shape::OPS),
    (composite::convert, composite::OPS),
    (rnn::convert, rnn::OPS),
    (quant::convert, quant::OPS),
    (spectral::convert, spectral::OPS),
    (roi::convert, roi::OPS),
    (counted::convert, counted::OPS),
];

fn dispatch(cx: &mut NodeCx<'_, '_>) -> Result<Vec<Item>> {
    let op = cx.node.op_type.as_str();
    for (convert, _) in ITEM_FAMILIES {
        if let Some(r) = convert(cx, op) {
            return r;
        }
    }
    for (convert, _) in FAMILIES {
        if let Some(r) = convert(cx, op) {
            return Ok(r?.into_iter().map(Item::Tensor).collect());
        }
    }
    Err(OnnxError::UnsupportedOp {
        node: cx.name.clone(),
        op: op.to_string(),
        domain: cx.node.domain.clone(),
        opset: cx.opset(),
    })
}

/// The quantization ops mlopt imports (computed in float today: `quant.rs`).
pub fn quantization_ops() -> &'static [&'static str] {
    quant::OPS
}

/// The supported ONNX op types, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<&str> = FAMILIES
        .iter()
        .flat_map(|(_, ops)| ops.iter().copied())
        .chain(
            ITEM_FAMILIES
                .iter()
                .flat_map(|(_, ops)| ops.iter().copied()),
        )
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
