//! Test-only crate; the tests live in tests/. Shared here: loading the fixture models and their data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::Tensor;
use mlopt_onnx::{import_file, read_pb, ImportOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FIXTURES: &[&str] = &["mlp", "cnn", "transformer", "dynamic"];

pub fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// Inputs and expected outputs of the fixture's first test data set, by name.
pub fn data(name: &str) -> (HashMap<String, Tensor>, Vec<(String, Tensor)>) {
    let ds = dir(name).join("test_data_set_0");
    let read = |prefix: &str| {
        (0..)
            .map(|k| ds.join(format!("{prefix}_{k}.pb")))
            .take_while(|p| p.exists())
            .map(|p| read_pb(&p).expect("test data"))
            .collect::<Vec<_>>()
    };
    (read("input").into_iter().collect(), read("output"))
}

pub fn import(name: &str) -> mlopt_ir::Graph {
    let (inputs, _) = data(name);
    let opts = ImportOptions {
        input_shapes: inputs
            .iter()
            .map(|(k, v)| (k.clone(), v.shape().to_vec()))
            .collect(),
        ..Default::default()
    };
    import_file(&dir(name).join("model.onnx"), &opts).expect("import")
}

/// The largest error of `got` against `want`, output by output, each relative to its output's scale
/// (`mlopt_rewrite::optimize::scaled_error`); names, types and the number of outputs must agree.
pub fn worst_error(want: &[(String, Tensor)], got: &[(String, Tensor)]) -> f64 {
    assert_eq!(want.len(), got.len(), "number of outputs");
    let mut worst = 0f64;
    for ((wn, w), (gn, g)) in want.iter().zip(got) {
        assert_eq!(wn, gn);
        assert_eq!(w.ty(), g.ty(), "{wn}");
        worst = worst.max(mlopt_rewrite::optimize::scaled_error(w, g));
    }
    worst
}
