//! The ONNX crate's one error type. Node errors name the node, its op and (where one is at fault) the input.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum OnnxError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{what} is not a valid ONNX protobuf (malformed or truncated): {msg}")]
    Decode { what: String, msg: String },
    #[error("model: {0}")]
    Model(String),
    #[error("node '{node}' ({op}){}: {msg}", input.as_ref().map(|i| format!(", input '{i}'")).unwrap_or_default())]
    Node {
        node: String,
        op: String,
        input: Option<String>,
        msg: String,
    },
    #[error("node '{node}': op {op} (domain '{domain}', opset {opset}) is not supported")]
    UnsupportedOp {
        node: String,
        op: String,
        domain: String,
        opset: i64,
    },
    #[error("graph input '{input}': dimension {dim} ('{symbol}') is dynamic; pin it with --input-shape {input}=<dims separated by x>")]
    DynamicDim {
        input: String,
        dim: usize,
        symbol: String,
    },
    #[error("tensor '{name}': {msg}")]
    Tensor { name: String, msg: String },
    /// A test data folder that does not match the model's ports (`interface::read_test_data`).
    #[error("{0}")]
    TestData(String),
    /// What went wrong reading one file of a test data folder, naming the file.
    #[error("reading {path}: {source}")]
    Reading {
        path: String,
        source: Box<OnnxError>,
    },
    #[error(transparent)]
    Ir(#[from] mlopt_ir::IrError),
}

pub type Result<T, E = OnnxError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> OnnxError + '_ {
    move |source| OnnxError::Io {
        path: path.display().to_string(),
        source,
    }
}
