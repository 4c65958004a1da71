//! The IR crate's one error type. Every variant that is about a node names it and its op.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum IrError {
    #[error("node '{node}' ({op}){}: {msg}", input.map(|i| format!(", input {i}")).unwrap_or_default())]
    Infer {
        node: String,
        op: &'static str,
        input: Option<usize>,
        msg: String,
    },
    #[error("evaluating node '{node}' ({op}): {msg}")]
    Eval {
        node: String,
        op: &'static str,
        msg: String,
    },
    #[error("graph input '{name}': {msg}")]
    Input { name: String, msg: String },
    #[error("the graph has a cycle")]
    Cycle,
    #[error("line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("the graph failed verification:\n{}", .0.join("\n"))]
    Verify(Vec<String>),
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;
