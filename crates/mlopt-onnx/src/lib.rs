//! ONNX for mlopt: protobuf messages written against the ONNX schema (`proto`), the importer that turns a
//! model into a static-shaped `mlopt_ir::Graph` (`import`, `convert`), and tensor files (`tensor_io`).
//!
//! Architecture invariant: this is the only crate that knows ONNX; everything after import sees the IR.

mod convert;
pub mod error;
pub mod import;
pub mod interface;
pub mod proto;
pub mod tensor_io;

pub use convert::{quantization_ops, supported_ops};
pub use error::{OnnxError, Result};
pub use import::{
    import_file, import_model, load_model, parse_input_shape, parse_input_value, ImportOptions,
};
pub use interface::{Data, Form, Given};
pub use tensor_io::{read_npy, read_pb, read_tensor_file, write_npy, write_pb};
