//! Sequences and optionals at a model's interface. A compiled model takes and gives tensors only, so a
//! sequence input or output `s` of length n is the tensors `s.0` .. `s.{n-1}` (`element_name`), and an
//! optional is its content (a tensor, a sequence) or, where it is empty, nothing. An input sequence's
//! length and its elements' shapes are fixed at compile time like every other shape: by the data `run`
//! and `check` read (`Given`), or by `--input-shape s.0=DIMS --input-shape s.1=DIMS ..`.

use crate::error::{OnnxError, Result};
use crate::proto::{
    data_kind, type_proto, OptionalProto, SequenceProto, TensorProto, ValueInfoProto,
};
use crate::tensor_io::{folder_of, read_regular, tensor_from_proto};
use mlopt_ir::Tensor;
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// What a graph input or output is, from its declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Tensor,
    /// A sequence of tensors.
    Seq,
    /// An optional tensor.
    OptTensor,
    /// An optional sequence of tensors.
    OptSeq,
}

impl Form {
    pub fn is_seq(self) -> bool {
        matches!(self, Form::Seq | Form::OptSeq)
    }
    pub fn is_optional(self) -> bool {
        matches!(self, Form::OptTensor | Form::OptSeq)
    }
}

/// The form of `v`'s declared type (a tensor when no type is declared); an error naming it for maps,
/// sparse tensors, sequences of sequences and the like.
pub fn form(v: &ValueInfoProto) -> Result<Form> {
    use type_proto::Value as V;
    let err = || {
        OnnxError::Model(format!(
            "value '{}': only tensors, sequences of tensors and optionals of those are supported \
             (not maps, sparse tensors or nested sequences)",
            v.name
        ))
    };
    let inner = |t: &Option<Box<crate::proto::TypeProto>>| t.as_ref().and_then(|t| t.value.clone());
    Ok(match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        None | Some(V::TensorType(_)) => Form::Tensor,
        Some(V::SequenceType(s)) => match inner(&s.elem_type) {
            Some(V::TensorType(_)) => Form::Seq,
            _ => return Err(err()),
        },
        Some(V::OptionalType(o)) => match inner(&o.elem_type) {
            Some(V::TensorType(_)) => Form::OptTensor,
            Some(V::SequenceType(s)) => match inner(&s.elem_type) {
                Some(V::TensorType(_)) => Form::OptSeq,
                _ => return Err(err()),
            },
            _ => return Err(err()),
        },
        Some(_) => return Err(err()),
    })
}

/// The declared tensor type of `v`: its own, its sequence's elements' or its optional's content's.
pub(crate) fn tensor_type(v: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    let mut t = v.r#type.as_ref()?;
    loop {
        match t.value.as_ref()? {
            type_proto::Value::TensorType(x) => return Some(x),
            type_proto::Value::SequenceType(s) => t = s.elem_type.as_deref()?,
            type_proto::Value::OptionalType(o) => t = o.elem_type.as_deref()?,
            _ => return None,
        }
    }
}

/// A model's graph inputs (initializers left out) and outputs, each with its form.
pub type Ports = Vec<(String, Form)>;

/// The ports of `model`: its inputs and its outputs.
pub fn ports(model: &crate::proto::ModelProto) -> Result<(Ports, Ports)> {
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::Model("the model has no graph".into()))?;
    let inits: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    let port = |v: &ValueInfoProto| -> Result<(String, Form)> { Ok((v.name.clone(), form(v)?)) };
    let ins = g.input.iter().filter(|v| !inits.contains(v.name.as_str()));
    Ok((
        ins.map(port).collect::<Result<_>>()?,
        g.output.iter().map(port).collect::<Result<_>>()?,
    ))
}

/// The sequence of `ports` whose element the compiled model's input or output `name` is.
pub fn sequence_of<'a>(ports: &'a [(String, Form)], name: &str) -> Option<&'a str> {
    let (seq, k) = name.rsplit_once('.')?;
    let element = k.parse::<usize>().is_ok_and(|n| n.to_string() == k);
    ports
        .iter()
        .find(|(p, f)| element && f.is_seq() && p == seq)
        .map(|(p, _)| p.as_str())
}

/// The interface name of element `k` of the sequence `seq`.
pub fn element_name(seq: &str, k: usize) -> String {
    format!("{seq}.{k}")
}

/// A value given for an input, or expected of an output.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Tensor(Tensor),
    Seq(Vec<Tensor>),
    /// An empty optional.
    Absent,
}

impl Data {
    /// The tensors this is at the interface, for the value `name`, in order.
    pub fn tensors(self, name: &str) -> Vec<(String, Tensor)> {
        match self {
            Data::Tensor(t) => vec![(name.to_string(), t)],
            Data::Seq(ts) => ts
                .into_iter()
                .enumerate()
                .map(|(k, t)| (element_name(name, k), t))
                .collect(),
            Data::Absent => vec![],
        }
    }
}

/// Reads a `.pb` (or, for a tensor, a `.npy`) file holding a value of form `form`: a `TensorProto`, a
/// `SequenceProto` or an `OptionalProto`.
pub fn read_data(path: &Path, form: Form) -> Result<Data> {
    if path.extension().is_some_and(|e| e == "npy") {
        return Ok(Data::Tensor(crate::tensor_io::read_tensor_file(path)?));
    }
    let what = path.display().to_string();
    let bytes = read_regular(path)?;
    let decode_err = |e: prost::DecodeError| OnnxError::Decode {
        what: what.clone(),
        msg: e.to_string(),
    };
    let base = Some(folder_of(path));
    let tensor = |t: &TensorProto| tensor_from_proto(t, base);
    let seq = |s: &SequenceProto| -> Result<Data> {
        match s.elem_type {
            data_kind::TENSOR | data_kind::UNDEFINED => Ok(Data::Seq(
                s.tensor_values.iter().map(tensor).collect::<Result<_>>()?,
            )),
            k => Err(OnnxError::Model(format!(
                "{what}: a sequence of element kind {k}; mlopt reads sequences of tensors"
            ))),
        }
    };
    match form {
        Form::Tensor => Ok(Data::Tensor(tensor(
            &TensorProto::decode(bytes.as_slice()).map_err(decode_err)?,
        )?)),
        Form::Seq => seq(&SequenceProto::decode(bytes.as_slice()).map_err(decode_err)?),
        Form::OptTensor | Form::OptSeq => {
            let o = OptionalProto::decode(bytes.as_slice()).map_err(decode_err)?;
            match (o.elem_type, &o.tensor_value, &o.sequence_value) {
                (data_kind::TENSOR, Some(t), _) => Ok(Data::Tensor(tensor(t)?)),
                (data_kind::SEQUENCE, _, Some(s)) => seq(s),
                (data_kind::UNDEFINED, None, None) => Ok(Data::Absent),
                (k, _, _) => Err(OnnxError::Model(format!(
                    "{what}: an optional of kind {k} without matching content"
                ))),
            }
        }
    }
}

/// Inputs given as data (`run`, `check`, calibration): the tensors by interface name (a sequence's
/// elements as `NAME.K`), and what shapes alone do not say: each sequence's length, the optionals given
/// empty.
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub tensors: HashMap<String, Tensor>,
    pub lengths: HashMap<String, usize>,
    pub absent: HashSet<String>,
}

impl Given {
    /// Adds the value given for the input `name`.
    pub fn add(&mut self, name: &str, d: Data) {
        match &d {
            Data::Seq(ts) => {
                self.lengths.insert(name.to_string(), ts.len());
            }
            Data::Absent => {
                self.absent.insert(name.to_string());
            }
            Data::Tensor(_) => {}
        }
        self.tensors.extend(d.tensors(name));
    }

    /// Whether the input `name` is given (as a tensor, a sequence or an empty optional).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
            || self.lengths.contains_key(name)
            || self.absent.contains(name)
    }
}

/// A test data folder as ONNX's suites lay it out: `DIR/input_K.pb` bound to `inputs` in order, and
/// `DIR/output_K.pb` to `outputs`, each read in its port's form. Returns the inputs as given, and the
/// outputs as the compiled model gives them (a sequence's elements in turn, nothing for an empty
/// optional), by name. A file past the ports is an error; ports past the files are left out.
pub fn read_test_data(
    dir: &Path,
    inputs: &[(String, Form)],
    outputs: &[(String, Form)],
) -> Result<(Given, Vec<(String, Tensor)>)> {
    if !dir.is_dir() {
        return Err(OnnxError::TestData(format!(
            "{}: no such test data folder",
            dir.display()
        )));
    }
    let mut given = Given::default();
    for (name, d) in numbered(dir, "input", inputs)? {
        given.add(&name, d);
    }
    let expected = numbered(dir, "output", outputs)?
        .into_iter()
        .flat_map(|(name, d)| d.tensors(&name))
        .collect();
    Ok((given, expected))
}

/// `DIR/PREFIX_0.pb`, `DIR/PREFIX_1.pb`.. until one is missing, read in the forms of `ports` in order.
fn numbered(dir: &Path, prefix: &str, ports: &[(String, Form)]) -> Result<Vec<(String, Data)>> {
    let mut v = vec![];
    loop {
        let p = dir.join(format!("{prefix}_{}.pb", v.len()));
        if !p.exists() {
            return Ok(v);
        }
        let Some((name, form)) = ports.get(v.len()) else {
            return Err(OnnxError::TestData(format!(
                "{} has more {prefix}s than the model's {}",
                dir.display(),
                ports.len()
            )));
        };
        let d = read_data(&p, *form).map_err(|e| OnnxError::Reading {
            path: p.display().to_string(),
            source: Box::new(e),
        })?;
        v.push((name.clone(), d));
    }
}
