//! Test-only crate; the tests live in tests/. Shared here: loading the fixture models and their data,
//! and building layers of the zoo's shapes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::{ConvAttrs, DType, Graph, Op, Tensor, TensorType, Unary};
use mlopt_onnx::interface::Given;
use mlopt_onnx::{import_file, load_model, ImportOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FIXTURES: &[&str] = &["mlp", "cnn", "transformer", "dynamic"];

pub fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// Inputs and expected outputs of the fixture's first test data set, by name, as the compiled model
/// takes and gives them (a sequence as its elements `NAME.K`: `mlopt_onnx::interface`).
pub fn given(name: &str) -> (Given, Vec<(String, Tensor)>) {
    let model = load_model(&dir(name).join("model.onnx")).expect("model");
    let (inputs, outputs) = mlopt_onnx::interface::ports(&model).expect("ports");
    let ds = dir(name).join("test_data_set_0");
    mlopt_onnx::interface::read_test_data(&ds, &inputs, &outputs).expect("test data")
}

/// `given`'s tensors by name, and the expected outputs.
pub fn data(name: &str) -> (HashMap<String, Tensor>, Vec<(String, Tensor)>) {
    let (given, outs) = given(name);
    (given.tensors, outs)
}

pub fn import(name: &str) -> mlopt_ir::Graph {
    let (given, _) = given(name);
    let opts = ImportOptions {
        input_shapes: given
            .tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.shape().to_vec()))
            .collect(),
        sequence_lengths: given.lengths,
        absent: given.absent,
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

/// Deterministic weights in [-0.5, 0.5) / sqrt(fan-in), so outputs keep the inputs' scale.
pub fn weights(shape: &[usize], fan_in: usize, seed: u64) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n = shape.iter().product();
    let scale = 1.0 / (fan_in.max(1) as f32).sqrt();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect();
    Tensor::from_vec(shape, v).unwrap()
}

/// A convolution (1-D or 2-D) of `n` images of `c` -> `m` channels over `size`, a k-wide window at
/// `stride` padded by k / 2, in `group` groups, + bias, + ReLU when `relu`.
#[allow(clippy::too_many_arguments)]
pub fn conv_graph(
    n: usize,
    c: usize,
    m: usize,
    size: &[usize],
    k: usize,
    stride: usize,
    group: usize,
    relu: bool,
) -> Graph {
    let sp = size.len();
    let mut g = Graph::new("layer");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, [vec![n, c], size.to_vec()].concat()),
    );
    let w = g.add_const(
        "w",
        weights(
            &[vec![m, c / group], vec![k; sp]].concat(),
            c / group * k.pow(sp as u32),
            1,
        ),
    );
    let b = g.add_const("b", weights(&[m], 1, 2));
    let a = ConvAttrs {
        strides: vec![stride; sp],
        pads: vec![k / 2; 2 * sp],
        dilations: vec![1; sp],
        group,
        output_padding: vec![],
    };
    let mut y = g.add(Op::Conv(a), "conv", &[x, w, b]).unwrap();
    if relu {
        y = g.add(Op::Unary(Unary::Relu), "relu", &[y]).unwrap();
    }
    g.add_output("y", y);
    g
}
