//! mlopt's graph IR: element types and static tensor types, the closed `Op` enum, the dataflow `Graph`
//! over petgraph, shape and dtype inference, the verifier, the text format (print + parse), and the
//! reference interpreter that every later stage is checked against.
//!
//! Architecture invariant: this crate knows nothing of ONNX, egg, the kernel IR or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod demand;
pub mod dtype;
pub mod error;
pub mod extent;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod narrow;
pub mod op;
pub mod op_syntax;
pub mod parse;
pub mod print;
pub mod tensor;
pub mod verify;

pub use dtype::{broadcast_shapes, checked_numel, normalize_axis, DType, TensorType};
pub use error::{IrError, Result};
pub use graph::{Graph, KernelNodes, Node, NodeId, Value};
pub use half;
pub use op::*;
pub use tensor::{Elem, Tensor};

#[cfg(test)]
mod text_tests;
