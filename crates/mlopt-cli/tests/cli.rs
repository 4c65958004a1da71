//! End-to-end tests of the `mlopt` binary: bad input of every kind gets a clear message naming the node,
//! op and input, exit code 2 and no panic; `run` and `check` read and write tensors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_onnx::proto::*;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mlopt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlopt"))
        .args(args)
        .output()
        .expect("run mlopt")
}

fn fixture(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
        .display()
        .to_string()
}

/// Asserts exit code 2, no panic, and that stderr mentions every needle.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr should mention {n:?}: {err}");
    }
}

fn tensor_type(elem: i32, dims: &[Option<i64>]) -> TypeProto {
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                Some(v) => tensor_shape_proto::dimension::Value::DimValue(*v),
                None => tensor_shape_proto::dimension::Value::DimParam("batch".into()),
            }),
            ..Default::default()
        })
        .collect();
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: elem,
            shape: Some(TensorShapeProto { dim }),
        })),
        ..Default::default()
    }
}

fn value(name: &str, elem: i32, dims: &[Option<i64>]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(tensor_type(elem, dims)),
        ..Default::default()
    }
}

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn f32_tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        float_data: values.to_vec(),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes,
            input: inputs,
            output: outputs,
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn save(dir: &Path, m: &ModelProto) -> String {
    let p = dir.join("model.onnx");
    std::fs::write(&p, m.encode_to_vec()).expect("write model");
    p.display().to_string()
}

fn relu_model() -> ModelProto {
    model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[Some(2), Some(3)])],
        vec![value("y", data_type::FLOAT, &[Some(2), Some(3)])],
        vec![],
    )
}

fn str_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

#[test]
fn truncated_and_garbage_models_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = std::fs::read(fixture("mlp/model.onnx")).expect("fixture");
    let p = dir.path().join("cut.onnx");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).expect("write");
    fails_with(
        &mlopt(&["inspect", &p.display().to_string()]),
        &["not a valid ONNX protobuf"],
    );
    std::fs::write(&p, b"\xff\xff\xff\xff garbage").expect("write");
    fails_with(
        &mlopt(&["inspect", &p.display().to_string()]),
        &["not a valid ONNX protobuf"],
    );
    fails_with(
        &mlopt(&["inspect", "/nonexistent/model.onnx"]),
        &["/nonexistent/model.onnx"],
    );
}

#[test]
fn unknown_op_and_domain_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = relu_model();
    m.graph.as_mut().expect("graph").node[0].op_type = "Frobnicate".into();
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'r'", "Frobnicate", "not supported"],
    );
    let mut m = relu_model();
    m.graph.as_mut().expect("graph").node[0].domain = "com.example".into();
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'r'", "Relu", "com.example"],
    );
}

#[test]
fn unsupported_attributes_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = relu_model();
    m.graph.as_mut().expect("graph").node[0]
        .attribute
        .push(str_attr("flavour", "spicy"));
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'r'", "Relu", "attribute 'flavour' is not supported"],
    );
    let m = model(
        vec![node(
            "Gelu",
            "g",
            &["x"],
            &["y"],
            vec![str_attr("approximate", "cubic")],
        )],
        vec![value("x", data_type::FLOAT, &[Some(2)])],
        vec![value("y", data_type::FLOAT, &[Some(2)])],
        vec![],
    );
    let mut m = m;
    m.opset_import[0].version = 20;
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'g'", "Gelu", "approximate='cubic'"],
    );
}

fn int_attr(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// Found by fuzzing: SAME padding with a strides list of the wrong length indexed past its end.
#[test]
fn pooling_geometry_of_the_wrong_length_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let attrs = vec![
        str_attr("auto_pad", "SAME_UPPER"),
        int_attr("kernel_shape", &[2, 2]),
        int_attr("strides", &[2]),
    ];
    let m = model(
        vec![node("MaxPool", "pool", &["x"], &["y"], attrs)],
        vec![value(
            "x",
            data_type::FLOAT,
            &[Some(1), Some(1), Some(4), Some(4)],
        )],
        vec![value(
            "y",
            data_type::FLOAT,
            &[Some(1), Some(1), Some(2), Some(2)],
        )],
        vec![],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'pool'", "MaxPool", "strides has 1 values, expected 2"],
    );
}

fn i64_tensor(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: data_type::INT64,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

/// Absurd sizes from a model are errors, not overflows or huge allocations; large but sane constant
/// shapes stay computations instead of being folded into the model.
#[test]
fn absurd_sizes_are_errors_and_large_constants_are_not_folded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fill = |dims: &[i64]| {
        model(
            vec![node("ConstantOfShape", "fill", &["shape"], &["y"], vec![])],
            vec![],
            vec![value(
                "y",
                data_type::FLOAT,
                &dims.iter().map(|&d| Some(d)).collect::<Vec<_>>(),
            )],
            vec![i64_tensor("shape", dims)],
        )
    };
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &fill(&[1 << 40, 1 << 40]))]),
        &["node 'fill'", "larger than mlopt's limit"],
    );
    let tile = model(
        vec![node("Tile", "tile", &["x", "reps"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[Some(2)])],
        vec![value("y", data_type::FLOAT, &[None])],
        vec![i64_tensor("reps", &[i64::MAX])],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &tile)]),
        &["node 'tile'", "larger than mlopt's limit"],
    );
    let ok = mlopt(&["inspect", &save(dir.path(), &fill(&[8192, 8192]))]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("= expand[shape=[8192,8192]]"));
}

#[test]
fn dtype_and_shape_mismatches_name_the_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(
        vec![node("Add", "add", &["x", "n"], &["y"], vec![])],
        vec![
            value("x", data_type::FLOAT, &[Some(2)]),
            value("n", data_type::INT64, &[Some(2)]),
        ],
        vec![value("y", data_type::FLOAT, &[Some(2)])],
        vec![],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'add'", "add", "input 1", "dtype i64"],
    );
    let m = model(
        vec![node("MatMul", "mm", &["a", "b"], &["y"], vec![])],
        vec![
            value("a", data_type::FLOAT, &[Some(2), Some(3)]),
            value("b", data_type::FLOAT, &[Some(4), Some(5)]),
        ],
        vec![value("y", data_type::FLOAT, &[Some(2), Some(5)])],
        vec![],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'mm'", "matmul", "inner dimensions"],
    );
    let m = model(
        vec![node("Reshape", "rs", &["x", "shape"], &["y"], vec![])],
        vec![
            value("x", data_type::FLOAT, &[Some(2), Some(3)]),
            value("shape", data_type::INT64, &[Some(2)]),
        ],
        vec![value("y", data_type::FLOAT, &[Some(3), Some(2)])],
        vec![],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &[
            "node 'rs'",
            "Reshape",
            "input 'shape'",
            "must be a constant",
        ],
    );
}

#[test]
fn values_defined_twice_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(
        vec![
            node("Relu", "a", &["x"], &["y"], vec![]),
            node("Neg", "b", &["x"], &["y"], vec![]),
        ],
        vec![value("x", data_type::FLOAT, &[Some(2)])],
        vec![value("y", data_type::FLOAT, &[Some(2)])],
        vec![],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["node 'b'", "Neg", "'y' is already defined"],
    );
}

#[test]
fn unpinned_dynamic_dims_are_errors_until_pinned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[None, Some(3)])],
        vec![value("y", data_type::FLOAT, &[None, Some(3)])],
        vec![],
    );
    let p = save(dir.path(), &m);
    fails_with(
        &mlopt(&["inspect", &p]),
        &["input 'x'", "'batch'", "--input-shape"],
    );
    let ok = mlopt(&["inspect", &p, "--input-shape", "x=4x3"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("%x: f32[4,3]"));
    fails_with(
        &mlopt(&["inspect", &p, "--input-shape", "x=4x5"]),
        &["input 'x' is declared f32[batch, 3], but its shape is pinned to [4, 5]"],
    );
    fails_with(
        &mlopt(&["inspect", &p, "--input-shape", "nope=4x3"]),
        &["'nope'"],
    );
}

#[test]
fn model_versions_outside_the_supported_range_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = relu_model();
    m.ir_version = 2;
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &m)]),
        &["IR version 2"],
    );
    let mut m = relu_model();
    m.opset_import[0].version = 99;
    fails_with(&mlopt(&["inspect", &save(dir.path(), &m)]), &["opset 99"]);
}

#[test]
fn external_data_is_read_and_must_stay_in_the_model_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let weights: Vec<u8> = [1f32, -2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(
        dir.path().join("weights.bin"),
        [vec![0u8; 8], weights].concat(),
    )
    .expect("write");
    let ext = |loc: &str| TensorProto {
        name: "w".into(),
        dims: vec![3],
        data_type: data_type::FLOAT,
        data_location: tensor_proto::DATA_LOCATION_EXTERNAL,
        external_data: vec![
            StringStringEntryProto {
                key: "location".into(),
                value: loc.into(),
            },
            StringStringEntryProto {
                key: "offset".into(),
                value: "8".into(),
            },
            StringStringEntryProto {
                key: "length".into(),
                value: "12".into(),
            },
        ],
        ..Default::default()
    };
    let build = |t| {
        model(
            vec![node("Mul", "mul", &["x", "w"], &["y"], vec![])],
            vec![value("x", data_type::FLOAT, &[Some(3)])],
            vec![value("y", data_type::FLOAT, &[Some(3)])],
            vec![t],
        )
    };
    let p = save(dir.path(), &build(ext("weights.bin")));
    let x = dir.path().join("x.pb");
    std::fs::write(&x, f32_tensor("x", &[3], &[2.0, 2.0, 2.0]).encode_to_vec()).expect("write");
    let out = mlopt(&["run", &p, "--input", &format!("x={}", x.display())]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[2.0, -4.0, 6.0]"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &build(ext("../weights.bin")))]),
        &["tensor 'w'", "escapes the model's folder"],
    );
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &build(ext("/etc/passwd")))]),
        &["escapes the model's folder"],
    );
    // A model named by its bare file name, from its own folder: the data lies in `.` (the parent of
    // `model.onnx` is the empty path), as with every dynamo export run in place.
    save(dir.path(), &build(ext("weights.bin")));
    let out = Command::new(env!("CARGO_BIN_EXE_mlopt"))
        .args(["run", "model.onnx", "--input", "x=x.pb"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[2.0, -4.0, 6.0]"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mlopt"))
        .args(["compile", "model.onnx", "-o", "out"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only regular files are data: a FIFO in the folder would block the read forever.
    let fifo = dir.path().join("fifo.bin");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    fails_with(
        &mlopt(&["inspect", &save(dir.path(), &build(ext("fifo.bin")))]),
        &["tensor 'w'", "not a regular file"],
    );
}

/// A device or FIFO given as the model or an input is refused up front: `/dev/zero` never ends (reading it
/// grew memory without bound) and a FIFO blocks.
#[test]
fn only_regular_files_are_read_as_models_and_inputs() {
    fails_with(
        &mlopt(&["inspect", "/dev/zero"]),
        &["/dev/zero", "not a regular file"],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let p = save(dir.path(), &relu_model());
    fails_with(
        &mlopt(&["run", &p, "--input", "x=/dev/zero"]),
        &["/dev/zero", "not a regular file"],
    );
    let fifo = dir.path().join("x.npy");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    fails_with(
        &mlopt(&["run", &p, "--input", &format!("x={}", fifo.display())]),
        &["not a regular file"],
    );
    // A .npy header whose shape's element count overflows: a clean error, not an arithmetic panic.
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551615, 3), }\n";
    npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    npy.extend_from_slice(&[0u8; 12]);
    let huge = dir.path().join("huge.npy");
    std::fs::write(&huge, npy).expect("write");
    fails_with(
        &mlopt(&["run", &p, "--input", &format!("x={}", huge.display())]),
        &["huge.npy", "does not match the shape"],
    );
}

#[test]
fn run_reports_missing_and_mismatched_inputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = save(dir.path(), &relu_model());
    fails_with(
        &mlopt(&["run", &p, "--input", "x=/nonexistent/x.pb"]),
        &["reading input 'x'", "/nonexistent/x.pb"],
    );
    fails_with(&mlopt(&["run", &p]), &["graph input 'x'", "no value given"]);
    let x = dir.path().join("x.pb");
    std::fs::write(&x, f32_tensor("x", &[3], &[1.0, 2.0, 3.0]).encode_to_vec()).expect("write");
    fails_with(
        &mlopt(&["run", &p, "--input", &x.display().to_string()]),
        &["the tensor given for input 'x' is f32[3], but the model declares f32[2, 3]"],
    );
    fails_with(
        &mlopt(&["run", &p, "--input", "y=whatever.pb"]),
        &["no input 'y'"],
    );
}

/// Flags are input too: an input or a pinned shape given twice is an error (not the last one silently
/// kept), `--iters` is bounded, an input file of absurd rank is refused in a short message naming it.
#[test]
fn repeated_and_absurd_flags_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = save(dir.path(), &relu_model());
    let x = dir.path().join("x.pb");
    std::fs::write(&x, f32_tensor("x", &[2, 3], &[1.0; 6]).encode_to_vec()).expect("write");
    let x = format!("x={}", x.display());
    fails_with(
        &mlopt(&["run", &p, "--input", &x, "--input", &x]),
        &["input 'x' is given twice"],
    );
    fails_with(
        &mlopt(&[
            "bench",
            &p,
            "--input-shape",
            "x=2x3",
            "--input-shape",
            "x=2x3",
        ]),
        &["input 'x' is given twice"],
    );
    for iters in ["0", "1000000000000", "18446744073709551615"] {
        let out = mlopt(&["bench", &p, "--iters", iters]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2)
                && err.contains("1..=1000000")
                && !err.contains("panicked"),
            "--iters {iters}: {err}"
        );
    }
    let deep = dir.path().join("deep.pb");
    let mut t = f32_tensor("x", &[1], &[1.0]);
    t.dims = vec![1; 1_000_000];
    std::fs::write(&deep, t.encode_to_vec()).expect("write");
    let out = mlopt(&["run", &p, "--input", &format!("x={}", deep.display())]);
    fails_with(
        &out,
        &[
            "reading input 'x'",
            "rank 1000000 exceeds mlopt's limit of 64",
        ],
    );
    assert!(
        out.stderr.len() < 4096,
        "{} bytes of message",
        out.stderr.len()
    );
}

/// A library checks at its entry point that the CPU has what it was compiled for: on a CPU without
/// (simulated by `MLOPT_CPU_DISABLE`), the run fails with the platform status and names the target, where
/// the kernels' first AVX instruction would have killed the process.
#[test]
fn a_library_refuses_a_cpu_without_its_instruction_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = save(dir.path(), &relu_model());
    let x = dir.path().join("x.pb");
    std::fs::write(&x, f32_tensor("x", &[2, 3], &[1.0; 6]).encode_to_vec()).expect("write");
    let run = |disable: &str| {
        Command::new(env!("CARGO_BIN_EXE_mlopt"))
            .args([
                "run",
                &p,
                "--input",
                &x.display().to_string(),
                "--target",
                "x86-64-v3",
            ])
            .env("MLOPT_CPU_DISABLE", disable)
            .output()
            .unwrap()
    };
    assert!(run("").status.success());
    assert!(
        run("avx512f,amx-tile").status.success(),
        "features v3 does not use"
    );
    for missing in ["avx2", "bmi1,fma"] {
        fails_with(
            &run(missing),
            &["lacks an instruction set", "target x86-64-v3", "(status 4)"],
        );
    }
}

fn run_to(dir: &Path, model: &str, input: &str, format: &str) -> PathBuf {
    let out_dir = dir.join(format);
    let out = mlopt(&[
        "run",
        model,
        "--input",
        input,
        "--output-dir",
        &out_dir.display().to_string(),
        "--format",
        format,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_dir
}

/// `run --output-dir` and `bench --profile -o` write by rename as `compile` does: a link planted at an
/// output's name is replaced, not written through; outputs whose names sanitise alike get a file each.
#[test]
fn run_and_bench_outputs_never_follow_links_and_never_collide() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(
        vec![
            node("Relu", "r", &["x"], &["y:0"], vec![]),
            node("Neg", "n", &["x"], &["y_0"], vec![]),
        ],
        vec![value("x", data_type::FLOAT, &[Some(2), Some(3)])],
        vec![
            value("y:0", data_type::FLOAT, &[Some(2), Some(3)]),
            value("y_0", data_type::FLOAT, &[Some(2), Some(3)]),
        ],
        vec![],
    );
    let p = save(dir.path(), &m);
    let x = dir.path().join("x.pb");
    std::fs::write(
        &x,
        f32_tensor("x", &[2, 3], &[1.0, -2.0, 3.0, -4.0, 5.0, -6.0]).encode_to_vec(),
    )
    .expect("write");
    let (out, victim) = (dir.path().join("npy"), dir.path().join("victim.txt"));
    std::fs::create_dir(&out).unwrap();
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, out.join("y_0.npy")).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("roofline.svg")).unwrap();
    let out = run_to(dir.path(), &p, &x.display().to_string(), "npy");
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["roofline.svg", "y_0.npy", "y_0_2.npy"]);
    assert!(!std::fs::symlink_metadata(out.join("y_0.npy"))
        .unwrap()
        .file_type()
        .is_symlink());
    let profiled = mlopt(&[
        "bench",
        &p,
        "--iters",
        "2",
        "--profile",
        "-o",
        &out.display().to_string(),
    ]);
    assert!(
        profiled.status.success(),
        "{}",
        String::from_utf8_lossy(&profiled.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "keep",
        "a link was written through"
    );
    assert!(std::fs::read_to_string(out.join("roofline.svg"))
        .unwrap()
        .contains("<svg"));
}

#[test]
fn run_writes_outputs_that_check_accepts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = fixture("cnn/model.onnx");
    let input = fixture("cnn/test_data_set_0/input_0.pb");
    let pb_dir = run_to(dir.path(), &model, &input, "pb");
    let npy_dir = run_to(dir.path(), &model, &input, "npy");
    let from_pb = mlopt_onnx::read_pb(&pb_dir.join("logits.pb"))
        .expect("pb")
        .1;
    let from_npy = mlopt_onnx::read_npy(&npy_dir.join("logits.npy")).expect("npy");
    assert_eq!(from_pb, from_npy);
    // The written output becomes the expected output of a test data folder: check must pass on it...
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::copy(&input, data.join("input_0.pb")).expect("copy");
    std::fs::copy(pb_dir.join("logits.pb"), data.join("output_0.pb")).expect("copy");
    let ok = mlopt(&["check", &model, "--data", &data.display().to_string()]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    // ...and fail with exit code 1 once one value is off.
    let mut t = TensorProto::decode(
        std::fs::read(data.join("output_0.pb"))
            .expect("read")
            .as_slice(),
    )
    .expect("decode");
    let mut v = t.raw_data[..4].to_vec();
    v[3] ^= 0x40;
    t.raw_data.splice(..4, v);
    std::fs::write(data.join("output_0.pb"), t.encode_to_vec()).expect("write");
    let bad = mlopt(&["check", &model, "--data", &data.display().to_string()]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stdout).contains("MISMATCH"));
}

/// Inputs the fuzzer found (fuzz/regressions): each is a clear error now, quickly and in little memory.
#[test]
fn fuzz_regressions_are_clear_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/regressions") {
        let path = entry.expect("entry").path();
        let start = std::time::Instant::now();
        fails_with(
            &mlopt(&["inspect", &path.display().to_string()]),
            &["node '"],
        );
        assert!(
            start.elapsed().as_secs() < 10,
            "{} took {:?}",
            path.display(),
            start.elapsed()
        );
        seen += 1;
    }
    assert!(seen >= 2);
}

#[test]
fn inspect_optimized_marks_kernels_and_reports_the_search() {
    let out = mlopt(&[
        "inspect",
        &fixture("cnn/model.onnx"),
        "--stage",
        "optimized",
        "--target",
        "sm_80",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "after \"optimized\" for target sm_80",
        "stopped by saturated",
        "conv-batchnorm-fold",
        "kernel k0 {",
        "memory-bound",
        "before (one kernel per op)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert!(
        !text.contains("batch_norm"),
        "BatchNormalization should fold into the convolutions:\n{text}"
    );
}

/// An unbounded saturation time is a limit like any other, not a panic converting it to a Duration.
#[test]
fn an_infinite_time_limit_is_no_limit() {
    let out = mlopt(&[
        "inspect",
        &fixture("mlp/model.onnx"),
        "--stage",
        "optimized",
        "--time-limit",
        "inf",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every stage after optimisation prints: the kernels before scheduling, with their schedules, and the
/// code (LLVM IR for a CPU, PTX for a GPU).
#[test]
fn inspect_prints_every_stage() {
    let text = |stage: &str, target: &str| {
        let out = mlopt(&[
            "inspect",
            &fixture("cnn/model.onnx"),
            "--stage",
            stage,
            "--target",
            target,
        ]);
        assert!(
            out.status.success(),
            "{stage} for {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // A loop-kind step (`vector<16>(c5)`) is the CPU schedule's; lowering writes none.
    let scheduled_loops = |t: &str| {
        t.lines()
            .filter(|l| l.starts_with("; schedule:") && l.contains(">("))
            .count()
    };
    let (lowered, scheduled) = (text("lowered", "x86-64-v4"), text("scheduled", "x86-64-v4"));
    assert!(
        lowered.contains("kernel @k0(") && scheduled.contains("kernel @k0("),
        "{lowered}"
    );
    assert_eq!(scheduled_loops(&lowered), 0, "{lowered}");
    assert!(scheduled_loops(&scheduled) > 0, "{scheduled}");
    assert!(text("code", "x86-64-v4").contains("i32 @mlopt_model_k0("));
    assert!(text("scheduled", "sm_80").contains("gpu."));
    assert!(text("code", "sm_80").contains(".target sm_80"));
}

#[test]
fn compile_writes_the_optimised_graph_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = mlopt(&[
        "compile",
        &fixture("mlp/model.onnx"),
        "--name",
        "mlp",
        "--target",
        "x86-64-v4",
        "-o",
        out_dir.to_str().unwrap(),
        "--report",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("kernel") && table.contains("gemm") && table.contains("total:"),
        "{table}"
    );
    let text = std::fs::read_to_string(out_dir.join("mlp.report.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("mlp.report.json is not JSON ({e}):\n{text}"));
    assert_eq!(json["target"], "x86-64-v4");
    assert_eq!(json["precision"], "fp32");
    assert!(json["egraph"]["stop_reason"].is_string());
    assert!(json["peak_activation_bytes"].as_u64().is_some());
    assert!(json["arena_bytes"].as_u64().is_some() && json["in_place"].as_u64().is_some());
    assert!(table.contains("activation arena:"), "{table}");
    let kernels = json["kernels"].as_array().unwrap();
    assert!(!kernels.is_empty());
    for k in kernels {
        assert!(
            k["flops"].as_f64().is_some()
                && k["bytes"].as_f64().is_some()
                && k["estimate_s"].as_f64().is_some(),
            "{k}"
        );
        assert!(
            ["compute", "memory", "view"].contains(&k["bound"].as_str().unwrap()),
            "{k}"
        );
    }
    let total: f64 = kernels
        .iter()
        .map(|k| k["estimate_s"].as_f64().unwrap())
        .sum();
    assert!(
        (total - json["after_s"].as_f64().unwrap()).abs() < 1e-9
            && total < json["before_s"].as_f64().unwrap()
    );
    assert!(std::fs::read_to_string(out_dir.join("mlp.optimized.gir"))
        .unwrap()
        .contains("kernel k0"));
    // The library users link, its interface, and every stage's dump.
    assert!(std::fs::read(out_dir.join("libmlp.a"))
        .unwrap()
        .starts_with(b"!<arch>\n"));
    let header = std::fs::read_to_string(out_dir.join("mlp.h")).unwrap();
    for needle in [
        "void *mlopt_mlp_create(void);",
        "int mlopt_mlp_run(void *ctx",
        "const char *mlopt_mlp_error(const void *ctx);",
        "#define MLOPT_MLP_INPUT0_DIMS {8, 64}",
        "f32[8,10]",
    ] {
        assert!(
            header.contains(needle),
            "{needle:?} missing from:\n{header}"
        );
    }
    assert!(std::fs::read_to_string(out_dir.join("mlp.rs"))
        .unwrap()
        .contains("pub fn run(&mut self, in0: &[f32], out0: &mut [f32]) -> Result<(), Error>"));
    assert!(std::fs::read_to_string(out_dir.join("mlp.scheduled.kir"))
        .unwrap()
        .contains("kernel @k0("));
    // The imported graph and the algorithm before any schedule: each stage's text parses back.
    let import = std::fs::read_to_string(out_dir.join("mlp.import.gir")).unwrap();
    assert!(
        import.starts_with("; mlopt graph @mlp after \"import\""),
        "{import}"
    );
    let lowered = std::fs::read_to_string(out_dir.join("mlp.lowered.kir")).unwrap();
    assert!(lowered.contains("kernel @k0(") && !lowered.contains("; schedule:"));
    assert!(std::fs::read_to_string(out_dir.join("mlp.ll"))
        .unwrap()
        .contains("define i32 @mlopt_mlp_run("));
    assert!(
        json["compile_s"].as_str().is_some() || json["compile_s"].as_f64().is_some(),
        "{json}"
    );
    stages_in_order(
        &text,
        &[
            "import", "optimize", "lower", "schedule", "codegen", "package",
        ],
    );
}

/// report.json times the pipeline's stages, at its end, in the order they ran.
fn stages_in_order(report: &str, stages: &[&str]) {
    let at: Vec<usize> = stages
        .iter()
        .map(|s| {
            report
                .rfind(&format!("\"{s}\""))
                .unwrap_or_else(|| panic!("stage {s} missing from {report}"))
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "stages out of order in {report}"
    );
}

#[test]
fn bench_prints_one_json_line() {
    let out = mlopt(&[
        "bench",
        &fixture("mlp/model.onnx"),
        "--iters",
        "5",
        "--threads",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON line ({e}): {text}"));
    assert_eq!(json["threads"], 2);
    assert!(json["median_ms"].as_f64().unwrap() >= json["min_ms"].as_f64().unwrap());
    assert!(
        json["compile_s"].as_f64().is_some()
            && json["model"].as_str().unwrap().ends_with("model.onnx")
    );
}

/// What code generation cannot do is an error naming the node and op, or the target, with exit code 2.
#[test]
fn compile_errors_name_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out").display().to_string();
    // GPU code is compiled, not run, here: commands that run code in-process say so.
    fails_with(
        &mlopt(&["bench", &fixture("mlp/model.onnx"), "--target", "sm_80"]),
        &["sm_80", "cannot run in this process", "mlopt compile"],
    );
    fails_with(
        &mlopt(&[
            "compile",
            &fixture("mlp/model.onnx"),
            "--target",
            "pdp11",
            "-o",
            &out,
        ]),
        &["pdp11"],
    );
}

#[test]
fn compile_for_a_gpu_writes_ptx_a_library_and_the_launches() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = mlopt(&[
        "compile",
        &fixture("mlp/model.onnx"),
        "--target",
        "sm_80",
        "-o",
        out_dir.to_str().unwrap(),
        "--report",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "model.ptx",
        "model.h",
        "libmodel.a",
        "model.scheduled.kir",
        "model.report.json",
    ] {
        assert!(out_dir.join(f).exists(), "{f} missing");
    }
    let ptx = std::fs::read_to_string(out_dir.join("model.ptx")).unwrap();
    assert!(
        ptx.contains(".target sm_80") && ptx.contains(".entry k0"),
        "{ptx}"
    );
    let report = std::fs::read_to_string(out_dir.join("model.report.json")).unwrap();
    for needle in [
        "\"gpu_kernels\"",
        "\"grid\"",
        "\"registers\"",
        "\"occupancy\"",
    ] {
        assert!(report.contains(needle), "{needle} missing from {report}");
    }
    // The same pipeline as for a CPU, with ptxas inside the schedule stage where it is installed.
    let ptxas = if mlopt_driver::gpu::find_ptxas().is_some() {
        vec!["ptxas"]
    } else {
        vec![]
    };
    stages_in_order(
        &report,
        &[
            &["import", "optimize", "lower", "schedule"][..],
            &ptxas,
            &["codegen", "package"],
        ]
        .concat(),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("grid x block") && table.contains("launches, roofline"),
        "{table}"
    );
}

/// The library is named after the model file (or `--name`), never after the graph's name inside it: the
/// name is a C identifier, the same for the files, symbols and macros, and cannot lead outside the output
/// directory; a `--name` that is not one is refused.
#[test]
fn compile_names_the_library_after_the_file_or_name_flag() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model();
    m.graph.as_mut().unwrap().name = "../../escaped/x".into();
    let path = dir.path().join("my-model v2.0.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let out_dir = dir.path().join("a").join("out");
    let compile = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            path.to_str().unwrap(),
            "-o",
            out_dir.to_str().unwrap(),
            "--target",
            "x86-64-v4",
        ];
        args.extend_from_slice(extra);
        mlopt(&args)
    };
    let out = compile(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("compiled my_model_v2_0 (named by the model file's name)"),
        "{err}"
    );
    let header = std::fs::read_to_string(out_dir.join("my_model_v2_0.h")).unwrap();
    for needle in [
        "#ifndef MLOPT_MY_MODEL_V2_0_H",
        "int mlopt_my_model_v2_0_run(",
        "libmy_model_v2_0.a",
    ] {
        assert!(header.contains(needle), "{needle}: {header}");
    }
    assert!(out_dir.join("libmy_model_v2_0.a").exists());
    assert!(!dir.path().join("escaped").exists());
    // --name as given, or refused before anything is written.
    assert!(compile(&["--name", "relu_A"]).status.success());
    assert!(std::fs::read_to_string(out_dir.join("relu_A.h"))
        .unwrap()
        .contains("void *mlopt_relu_A_create(void);"));
    for bad in ["../../escaped/x", "my-model", "2fast", "", &"n".repeat(129)] {
        fails_with(&compile(&["--name", bad]), &["is not a C identifier"]);
    }
    assert!(!dir.path().join("escaped").exists());
}

/// Output names come from the model file: a compile never replaces a file it cannot prove an earlier
/// compile wrote (a model named `main` compiled into a crate's `src`), and a name too long for a C
/// identifier is cut to `NAME_MAX` bytes.
#[test]
fn compile_outputs_never_shadow_the_users_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("main.rs"), "fn main() {}").unwrap();
    let compile = |stem: &str, out: &Path| {
        let path = dir.path().join(format!("{stem}.onnx"));
        std::fs::write(&path, relu_model().encode_to_vec()).unwrap();
        mlopt(&[
            "compile",
            path.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--target",
            "x86-64-v4",
        ])
    };
    fails_with(
        &compile("main", &src),
        &["main.rs exists", "not a file an earlier compile wrote"],
    );
    assert_eq!(
        std::fs::read_to_string(src.join("main.rs")).unwrap(),
        "fn main() {}"
    );
    let names = |d: &Path| std::fs::read_dir(d).unwrap().count();
    assert_eq!(names(&src), 1, "a refused compile wrote files");
    // Compiled again into its own folder, it replaces only what it wrote there.
    let out = dir.path().join("out");
    assert!(compile("main", &out).status.success());
    assert!(compile("main", &out).status.success());
    let long = "n".repeat(250);
    let far = dir.path().join("far");
    assert!(compile(&long, &far).status.success());
    assert!(far.join(format!("lib{}.a", &long[..128])).exists());
}

#[test]
fn bad_optimiser_options_are_errors() {
    let m = fixture("mlp/model.onnx");
    fails_with(
        &mlopt(&["inspect", &m, "--stage", "optimized", "--target", "sm_75"]),
        &["unknown target 'sm_75'", "sm_80"],
    );
    fails_with(
        &mlopt(&["inspect", &m, "--stage", "optimized", "--precision", "int3"]),
        &["unknown precision 'int3'"],
    );
    fails_with(
        &mlopt(&[
            "inspect",
            &m,
            "--stage",
            "optimized",
            "--precision",
            "auto",
            "--calibration",
            "/nonexistent",
        ]),
        &["calibration", "/nonexistent"],
    );
}

#[test]
fn check_optimized_matches_the_reference_data() {
    for p in ["fp32", "auto"] {
        let out = mlopt(&[
            "check",
            &fixture("transformer/model.onnx"),
            "--data",
            &fixture("transformer/test_data_set_0"),
            "--optimized",
            "--target",
            "sm_80",
            "--precision",
            p,
            "--tolerance",
            "1e-4",
            "--rtol",
            "1e-2",
            "--atol",
            "1e-3",
        ]);
        assert!(
            out.status.success(),
            "{p}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// At a low precision `check` holds each output to `--tolerance` on the scaled error (the measure
/// `--precision auto` accepts by), not to fp32's rtol: bf16 passes at 5e-2 and fails at 1e-9; every
/// line shows the scaled error.
#[test]
fn check_at_low_precision_uses_the_tolerance_measure() {
    let run = |tolerance: &str| {
        mlopt(&[
            "check",
            &fixture("transformer/model.onnx"),
            "--data",
            &fixture("transformer/test_data_set_0"),
            "--compiled",
            "--target",
            mlopt_target::runnable_level(),
            "--precision",
            "bf16",
            "--tolerance",
            tolerance,
        ])
    };
    let ok = run("5e-2");
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success() && text.contains("scaled err") && text.contains("(tolerance 5.0e-2)"),
        "{text}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = run("1e-9");
    assert_eq!(
        bad.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&bad.stdout)
    );
    assert!(String::from_utf8_lossy(&bad.stdout).contains("MISMATCH"));
}

#[test]
fn calibration_is_cached_and_used_by_the_host_target() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mlopt"))
            .args(args)
            .env("MLOPT_CACHE_DIR", dir.path())
            .output()
            .unwrap()
    };
    // The first use of `host` on this CPU measures it and caches the figures per CPU model and features.
    let first = run(&[
        "inspect",
        &fixture("mlp/model.onnx"),
        "--stage",
        "optimized",
    ]);
    assert!(
        String::from_utf8_lossy(&first.stdout).contains("host calibration, measured on first use"),
        "{}",
        String::from_utf8_lossy(&first.stdout)
    );
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.len() == 1 && files[0].starts_with("host-calibration-"),
        "{files:?}"
    );
    let again = run(&[
        "inspect",
        &fixture("mlp/model.onnx"),
        "--stage",
        "optimized",
    ]);
    // (A spot check that finds the first measurement low re-measures, and says so.)
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(
        again.contains("host calibration cache") || again.contains("host calibration re-measured"),
        "{again}"
    );
    // `calibrate` measures again and shows each figure against what the instructions can do per cycle.
    let cal = run(&["calibrate"]);
    let text = String::from_utf8_lossy(&cal.stdout);
    assert!(
        cal.status.success()
            && text.contains("GHz")
            && text.contains("FLOP/cycle of at most")
            && text.contains("GB/s"),
        "{text}"
    );
}

/// `--tune` times candidate tiles, caches the winners per shape, and the tuned code still checks.
#[test]
fn tune_measures_caches_and_stays_correct() {
    let cache = tempfile::tempdir().unwrap();
    let model = fixture("transformer/model.onnx");
    let data = fixture("transformer/test_data_set_0");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mlopt"))
            .args(args)
            .env("MLOPT_CACHE_DIR", cache.path())
            .output()
            .unwrap()
    };
    let out = run(&["check", &model, "--data", &data, "--compiled", "--tune"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tune: 16x64x64 tile"), "{stderr}");
    let cached = std::fs::read_to_string(cache.path().join("tiles.txt")).unwrap();
    assert!(cached.lines().count() >= 2, "{cached}");
    // The second time, every shape comes from the cache.
    let again = run(&["check", &model, "--data", &data, "--compiled", "--tune"]);
    assert!(again.status.success());
    assert!(!String::from_utf8_lossy(&again.stderr).contains("tune:"));
    // The cache is a file anyone can write: zero, odd and oversized tiles are ignored (and their shapes
    // measured again), never divided by or used to leave outputs unwritten.
    for bad in ["0 0 0", "5 48 7", "64 4096 16"] {
        let planted: String = cached
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                format!("{} {bad}\n", f[..f.len() - 3].join(" "))
            })
            .collect();
        std::fs::write(cache.path().join("tiles.txt"), planted).unwrap();
        let out = run(&["check", &model, "--data", &data, "--compiled", "--tune"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("PASS"),
            "{bad}: {stderr}"
        );
        assert!(
            stderr.contains("ignoring a cached tile") && stderr.contains("tune: 16x64x64 tile"),
            "{bad}: {stderr}"
        );
    }
}

/// The circles of class `class` in an SVG file, which must parse as XML.
fn svg_points(path: &Path, class: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "circle" && n.attribute("class") == Some(class))
        .map(|n| n.attribute("data-id").unwrap_or_default().to_string())
        .collect()
}

/// `bench --profile --json`: one object whose kernels (one per kernel call, each with the cost model's
/// figures and a schedule class) add up to the measured run, and a roofline.svg with one point per kernel.
#[test]
fn bench_profile_kernels_add_up_to_the_run_and_are_plotted() {
    let dir = tempfile::tempdir().unwrap();
    let out = mlopt(&[
        "bench",
        &fixture("transformer/model.onnx"),
        "--profile",
        "--json",
        "--iters",
        "30",
        "-o",
        &dir.path().display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"));
    assert!(json["model"].as_str().unwrap().ends_with("model.onnx"));
    assert_eq!(json["threads"], 1);
    let kernels = json["kernels"].as_array().unwrap();
    assert!(kernels.len() >= 3, "{text}");
    let mut sum = 0.0;
    let mut last = f64::INFINITY;
    for k in kernels {
        for key in [
            "id",
            "ops",
            "nodes",
            "measured_ms",
            "estimate_ms",
            "gflops",
            "gbps",
            "bound",
            "roofline_fraction",
            "schedule",
        ] {
            assert!(!k[key].is_null(), "kernel without {key}: {k}");
        }
        assert!(
            ["tiled", "vector", "scalar"].contains(&k["schedule"].as_str().unwrap()),
            "{k}"
        );
        let ms = k["measured_ms"].as_f64().unwrap();
        assert!(
            ms >= 0.0 && ms <= last,
            "kernels are sorted by measured time: {text}"
        );
        last = ms;
        sum += ms;
    }
    // The clock readings sit between the kernel calls: what they miss is the call into the library.
    let mean = json["mean_ms"].as_f64().unwrap();
    assert!(
        sum <= mean * 1.001 && sum >= 0.85 * mean,
        "kernels add up to {sum} ms of a {mean} ms run"
    );
    assert!((json["kernel_sum_ms"].as_f64().unwrap() - sum).abs() < 1e-6 * sum.max(1.0));
    // The transformer's projections are tiled contractions, in f32 (the profile says which matrix
    // precision each kernel's products run in: null for a kernel without any).
    assert!(
        kernels.iter().any(|k| k["schedule"] == "tiled"
            && k["matrix"] == "f32"
            && k["ops"].as_array().unwrap().iter().any(|o| o == "matmul")),
        "{text}"
    );
    assert!(kernels.iter().all(|k| k["matrix"].is_null()
        || ["f32", "tf32", "f16", "bf16", "i16"].contains(&k["matrix"].as_str().unwrap())));
    let mut ids: Vec<String> = kernels
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect();
    let mut points = svg_points(&dir.path().join("roofline.svg"), "kernel");
    ids.sort();
    points.sort();
    assert_eq!(ids, points);
}

/// `compile --report` plots the cost model's estimates: one point per kernel of the kernel IR.
#[test]
fn compile_report_writes_the_estimated_roofline() {
    let dir = tempfile::tempdir().unwrap();
    let out = mlopt(&[
        "compile",
        &fixture("cnn/model.onnx"),
        "-o",
        &dir.path().display().to_string(),
        "--report",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kir = std::fs::read_to_string(dir.path().join("model.scheduled.kir")).unwrap();
    let kernels = kir.lines().filter(|l| l.starts_with("kernel @")).count();
    assert!(kernels > 0);
    assert_eq!(
        svg_points(&dir.path().join("model.roofline.svg"), "kernel").len(),
        kernels
    );
}

/// `bench --batch`: one point per batch size and thread count, the budget's largest batch, batch.svg.
#[test]
fn bench_batch_sweeps_latency_against_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().display().to_string();
    let out = mlopt(&[
        "bench",
        &fixture("dynamic/model.onnx"),
        "--batch",
        "1,4",
        "--iters",
        "5",
        "--json",
        "--max-latency-ms",
        "10000",
        "-o",
        &o,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let points = json["points"].as_array().unwrap();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(points.len(), 2 * if threads > 1 { 2 } else { 1 }, "{json}");
    for p in points {
        let (median, p90, p99) = (
            p["median_ms"].as_f64().unwrap(),
            p["p90_ms"].as_f64().unwrap(),
            p["p99_ms"].as_f64().unwrap(),
        );
        assert!(median > 0.0 && median <= p90 && p90 <= p99, "{p}");
        assert!(
            (p["items_per_s"].as_f64().unwrap() - p["batch"].as_f64().unwrap() / (median / 1e3))
                .abs()
                < 1e-2 * p["items_per_s"].as_f64().unwrap()
        );
    }
    assert_eq!(json["largest_batch_within_budget"]["1"], 4);
    assert_eq!(
        svg_points(&dir.path().join("batch.svg"), "batch").len(),
        points.len()
    );
    // A model without a batch dimension to vary is a clear error, and so is batch 0.
    fails_with(
        &mlopt(&[
            "bench",
            &fixture("mlp/model.onnx"),
            "--batch",
            "1,2",
            "-o",
            &o,
        ]),
        &["nothing to batch"],
    );
    fails_with(
        &mlopt(&[
            "bench",
            &fixture("dynamic/model.onnx"),
            "--batch",
            "0",
            "-o",
            &o,
        ]),
        &["batch sizes run from 1"],
    );
}

/// `compile -o DIR` renames finished files into place: a link planted at an output's name is replaced,
/// not written through; files a previous compile wrote and this one does not are removed if unchanged,
/// the user's other files stay whatever `.mlopt-files.model` says; a failed compile changes nothing; no
/// temporary file is left behind.
#[test]
fn compile_writes_by_rename_never_through_links_and_removes_stale_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, victim) = (tmp.path().join("out"), tmp.path().join("victim.txt"));
    std::fs::create_dir(&out).unwrap();
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, out.join("model.h")).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let compile = |model: &str, report: bool| {
        let mut args = vec![
            "compile",
            model,
            "--target",
            "x86-64-v4",
            "-o",
            out.to_str().unwrap(),
        ];
        if report {
            args.push("--report");
        }
        mlopt(&args)
    };
    let mlp = fixture("mlp/model.onnx");
    let first = compile(&mlp, true);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "keep",
        "the link's target was written through"
    );
    assert!(!std::fs::symlink_metadata(out.join("model.h"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read_to_string(out.join("model.h"))
        .unwrap()
        .contains("mlopt_model_run"));
    assert!(
        out.join("model.roofline.svg").exists()
            && out.join("model.report.json").exists()
            && out.join("libmodel.a").exists()
    );
    let second = compile(&mlp, false);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        !out.join("model.roofline.svg").exists(),
        "a stale file from the previous compile stayed"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
    // Only what a compile wrote, byte for byte, is removed: not a file the user has since replaced, and
    // nothing a planted record names.
    assert!(compile(&mlp, true).status.success());
    std::fs::write(out.join("model.roofline.svg"), "my own plot").unwrap();
    assert!(compile(&mlp, false).status.success());
    assert_eq!(
        std::fs::read_to_string(out.join("model.roofline.svg")).unwrap(),
        "my own plot"
    );
    std::fs::remove_file(out.join("model.roofline.svg")).unwrap();
    std::fs::write(
        out.join(".mlopt-files.model"),
        "notes.txt\nsha256:00 notes.txt\nsha256:00 model.h\n",
    )
    .unwrap();
    // (Its digests prove nothing, so the compile will not replace model.h either: it writes nothing.)
    fails_with(&compile(&mlp, false), &["model.h exists"]);
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine",
        "a planted record removed a file"
    );
    let before: Vec<(String, Vec<u8>)> = listing(&out);
    let bad = tmp.path().join("bad.onnx");
    std::fs::write(&bad, b"not a model").unwrap();
    let failed = compile(bad.to_str().unwrap(), false);
    assert_eq!(failed.status.code(), Some(2));
    assert_eq!(
        listing(&out),
        before,
        "a failed compile changed the output folder"
    );
    assert!(
        before
            .iter()
            .all(|(n, _)| !n.starts_with(".mlopt-") || n == ".mlopt-files.model"),
        "{:?}",
        before.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
}

/// Every file in `dir`, by name, with its bytes.
fn listing(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A reader that goes away (`mlopt inspect m.onnx | head`) ends the command quietly: exit 0, no
/// panic about a broken pipe.
#[test]
fn closed_stdout_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlopt"))
        .args(["inspect", &fixture("cnn/model.onnx"), "--stage", "code"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mlopt");
    // Closing the read end before mlopt writes makes its write fail with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for mlopt");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}

/// A QDQ model compiles, and the compile says what runs in integers: its convolution of dequantized
/// 8-bit operands (an i8 weight per output channel) on this CPU's integer dot product (every x86-64
/// host with AVX2); the quantize step and the rest in float.
#[test]
fn compile_says_which_contractions_of_a_quantized_model_run_in_integers() {
    let dir = tempfile::tempdir().unwrap();
    // (Large enough that the integer form's arithmetic, not its extra kernel, decides.)
    let (m_out, c_in) = (32usize, 32usize);
    let scale = f32_tensor("s", &[], &[0.05]);
    let w_scale = f32_tensor(
        "ws",
        &[m_out as i64],
        &(0..m_out)
            .map(|i| 0.01 + i as f32 * 0.001)
            .collect::<Vec<_>>(),
    );
    let w = TensorProto {
        name: "w".into(),
        dims: vec![m_out as i64, c_in as i64, 3, 3],
        data_type: data_type::INT8,
        raw_data: (0..m_out * c_in * 9)
            .map(|i| ((i * 37) % 255) as u8)
            .collect(),
        ..Default::default()
    };
    let m = model(
        vec![
            node("QuantizeLinear", "q", &["x", "s"], &["xq"], vec![]),
            node("DequantizeLinear", "dq", &["xq", "s"], &["xd"], vec![]),
            node(
                "DequantizeLinear",
                "dqw",
                &["w", "ws"],
                &["wd"],
                vec![AttributeProto {
                    name: "axis".into(),
                    r#type: attribute_type::INT,
                    i: 0,
                    ..Default::default()
                }],
            ),
            node(
                "Conv",
                "conv",
                &["xd", "wd"],
                &["y"],
                vec![int_attr("pads", &[1, 1, 1, 1])],
            ),
        ],
        vec![value(
            "x",
            data_type::FLOAT,
            &[Some(1), Some(c_in as i64), Some(28), Some(28)],
        )],
        vec![value(
            "y",
            data_type::FLOAT,
            &[Some(1), Some(m_out as i64), Some(28), Some(28)],
        )],
        vec![scale, w_scale, w],
    );
    let p = save(dir.path(), &m);
    let out = mlopt(&[
        "compile",
        &p,
        "-o",
        &dir.path().join("out").display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("note: the model is quantized (1 QuantizeLinear, 2 DequantizeLinear)")
            && err.contains("1 of 1 convolutions and matrix products run as integer contractions"),
        "{err}"
    );
}

/// A folder an older mlopt compiled into has one record (`.mlopt-files`) for all its libraries: a
/// compile takes that record's lines for its own files, replaces them, and leaves another library's.
#[test]
fn compile_replaces_what_an_older_version_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let compile = || {
        mlopt(&[
            "compile",
            &fixture("mlp/model.onnx"),
            "--target",
            "x86-64-v4",
            "-o",
            out.to_str().unwrap(),
        ])
    };
    assert!(compile().status.success());
    // The record as older versions kept it, also listing another library's file.
    let record = std::fs::read_to_string(out.join(".mlopt-files.model")).unwrap();
    std::fs::remove_file(out.join(".mlopt-files.model")).unwrap();
    // (Byte for byte what the record says, so only its name keeps it.)
    std::fs::copy(out.join("model.h"), out.join("other.h")).unwrap();
    let other = record
        .lines()
        .find(|l| l.ends_with(" model.h"))
        .unwrap()
        .replace(" model.h", " other.h");
    std::fs::write(out.join(".mlopt-files"), format!("{record}{other}\n")).unwrap();
    let again = compile();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(out.join(".mlopt-files.model").exists() && out.join("libmodel.a").exists());
    assert!(
        out.join("other.h").exists(),
        "another library's file was removed"
    );
}

/// `--input-value NAME=none` leaves an optional input empty: OptionalHasElement of it folds to false and
/// the library has no input; none for a tensor input, or an input given twice, is refused naming it.
#[test]
fn input_value_none_leaves_an_optional_input_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let optional = ValueInfoProto {
        name: "o".into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::OptionalType(type_proto::Optional {
                elem_type: Some(Box::new(tensor_type(data_type::FLOAT, &[Some(2)]))),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut m = model(
        vec![
            node("OptionalHasElement", "has", &["o"], &["h"], vec![]),
            node("Relu", "r", &["x"], &["y"], vec![]),
        ],
        vec![optional, value("x", data_type::FLOAT, &[Some(2)])],
        vec![
            value("h", data_type::BOOL, &[]),
            value("y", data_type::FLOAT, &[Some(2)]),
        ],
        vec![],
    );
    m.opset_import[0].version = 18;
    let p = save(dir.path(), &m);
    let out = mlopt(&["inspect", &p, "--input-value", "o=none"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("%o") && text.contains("false"), "{text}");
    let lib = dir.path().join("lib");
    let lib_s = lib.display().to_string();
    let out = mlopt(&["compile", &p, "--input-value", "o=none", "-o", &lib_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = std::fs::read_to_string(lib.join("model.h")).expect("header");
    assert!(header.contains("MLOPT_MODEL_NUM_INPUTS 1"), "{header}");
    fails_with(
        &mlopt(&["inspect", &p, "--input-value", "x=none"]),
        &["--input-value x=none", "input 'x' is not optional"],
    );
    fails_with(
        &mlopt(&[
            "inspect",
            &p,
            "--input-value",
            "o=none",
            "--input-value",
            "o=none",
        ]),
        &["input 'o' is given twice"],
    );
}

/// `--precision int8` quantizes a float model itself: without calibration inputs it says what it needs;
/// with two input sets in `test_data_set_*` folders it runs the convolution in integers and reports
/// the output's error against fp32.
#[test]
fn int8_quantizes_on_calibration_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let c = 32usize;
    let w: Vec<f32> = (0..c * c * 9)
        .map(|i| (i as f32 * 0.37).sin() * 0.1)
        .collect();
    let m = model(
        vec![node(
            "Conv",
            "conv",
            &["x", "w"],
            &["y"],
            vec![int_attr("pads", &[1, 1, 1, 1])],
        )],
        vec![value(
            "x",
            data_type::FLOAT,
            &[Some(1), Some(c as i64), Some(8), Some(8)],
        )],
        vec![value(
            "y",
            data_type::FLOAT,
            &[Some(1), Some(c as i64), Some(8), Some(8)],
        )],
        vec![f32_tensor("w", &[c as i64, c as i64, 3, 3], &w)],
    );
    let p = save(dir.path(), &m);
    let out = dir.path().join("out").display().to_string();
    fails_with(
        &mlopt(&["compile", &p, "--precision", "int8", "-o", &out]),
        &["--precision int8", "--calibration DIR"],
    );
    let cal = dir.path().join("cal");
    for k in 0..2 {
        let set = cal.join(format!("test_data_set_{k}"));
        std::fs::create_dir_all(&set).unwrap();
        let x: Vec<f32> = (0..c * 64)
            .map(|i| ((i * (k + 3)) as f32 * 0.11).cos())
            .collect();
        let t = f32_tensor("x", &[1, c as i64, 8, 8], &x);
        std::fs::write(set.join("input_0.pb"), t.encode_to_vec()).unwrap();
    }
    let run = mlopt(&[
        "compile",
        &p,
        "--precision",
        "int8",
        "--calibration",
        cal.to_str().unwrap(),
        "-o",
        &out,
    ]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(
        err.contains("1 of 1 convolutions and matrix products run as integer contractions")
            && err.contains("int8: 1 contractions quantized by mlopt")
            && err.contains("on the calibration inputs): y "),
        "{err}"
    );
}
