//! Sequence inputs at the interface (`mlopt_onnx::interface`), on fixtures/control/10 (inputs x, flag and
//! the sequence `parts` of f32[2] elements): their data read from a `SequenceProto`, their length and
//! elements' shapes pinned, and every way of getting that wrong refused with a message that says what
//! to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_onnx::interface::{read_data, Data, Form, Given};
use mlopt_onnx::{import_file, ImportOptions};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/control/10")
}

fn import(opts: &ImportOptions) -> Result<mlopt_ir::Graph, String> {
    import_file(&fixture().join("model.onnx"), opts).map_err(|e| e.to_string())
}

fn shapes(pins: &[(&str, &[usize])]) -> ImportOptions {
    ImportOptions {
        input_shapes: pins
            .iter()
            .map(|(k, d)| (k.to_string(), d.to_vec()))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn a_sequence_file_reads_as_its_elements_named_in_turn() {
    let ds = fixture().join("test_data_set_0");
    let Data::Seq(parts) = read_data(&ds.join("input_2.pb"), Form::Seq).unwrap() else {
        panic!("not a sequence");
    };
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|t| t.shape() == [2]));
    let mut given = Given::default();
    given.add("parts", Data::Seq(parts.clone()));
    assert_eq!(given.lengths["parts"], 3);
    assert_eq!(given.tensors["parts.2"], parts[2]);
    // The same file read as a tensor is not silently taken for one.
    assert!(read_data(&ds.join("input_2.pb"), Form::Tensor)
        .map(|d| d != Data::Seq(parts))
        .unwrap_or(true));
}

#[test]
fn a_sequence_input_is_its_pinned_elements() {
    let g = import(&shapes(&[("parts.0", &[2]), ("parts.1", &[2])])).unwrap();
    let names: Vec<String> = g
        .graph_inputs()
        .iter()
        .map(|&n| g.node(n).name.clone())
        .collect();
    assert_eq!(names, ["x", "flag", "parts.0", "parts.1"]);
    // SequenceInsert grows it by one: the output sequence `grown` is three outputs.
    let outs: Vec<&str> = g.graph_outputs().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(outs, ["y", "grown.0", "grown.1", "grown.2", "n"]);
    // A length alone takes the declared element shape; an empty sequence is a length of 0.
    let mut opts = ImportOptions::default();
    opts.sequence_lengths.insert("parts".into(), 4);
    assert_eq!(import(&opts).unwrap().graph_inputs().len(), 6);
}

#[test]
fn sequence_inputs_pinned_wrongly_are_refused_saying_how() {
    let err = import(&ImportOptions::default()).unwrap_err();
    assert!(
        err.contains("'parts' is a sequence") && err.contains("--input-shape parts.0="),
        "{err}"
    );
    let err = import(&shapes(&[("parts", &[2])])).unwrap_err();
    assert!(err.contains("pin its elements' shapes as parts.0"), "{err}");
    let err = import(&shapes(&[("parts.01", &[2])])).unwrap_err();
    assert!(
        err.contains("'parts.01', which is not a graph input"),
        "{err}"
    );
    let err = import(&shapes(&[("parts.0", &[3])])).unwrap_err();
    assert!(err.contains("'parts.0' is declared f32[2]"), "{err}");
    let mut opts = shapes(&[("parts.5", &[2])]);
    opts.sequence_lengths.insert("parts".into(), 2);
    let err = import(&opts).unwrap_err();
    assert!(err.contains("'parts.5', past the end"), "{err}");
    let mut opts = ImportOptions::default();
    opts.sequence_lengths.insert("parts".into(), 1 << 40);
    let err = import(&opts).unwrap_err();
    assert!(err.contains("more than mlopt keeps"), "{err}");
    let mut opts = shapes(&[("parts.0", &[2])]);
    opts.sequence_lengths.insert("x".into(), 1);
    opts.absent.insert("flag".into());
    let err = import(&opts).unwrap_err();
    assert!(err.contains("'x', which is not a sequence input"), "{err}");
}

/// The fixture's test data folder, read against the model's ports: the inputs as given (the sequence
/// with its length), the outputs as the compiled model gives them (the grown sequence's elements in
/// turn); a folder with more files than ports, or none at all, is an error that names it.
#[test]
fn a_test_data_folder_reads_against_the_ports() {
    let model = mlopt_onnx::load_model(&fixture().join("model.onnx")).unwrap();
    let (inputs, outputs) = mlopt_onnx::interface::ports(&model).unwrap();
    let ds = fixture().join("test_data_set_0");
    let (given, expected) = mlopt_onnx::interface::read_test_data(&ds, &inputs, &outputs).unwrap();
    assert_eq!(given.lengths["parts"], 3);
    assert!(given.tensors.contains_key("x") && given.tensors.contains_key("parts.2"));
    let names: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["y", "grown.0", "grown.1", "grown.2", "grown.3", "n"]
    );
    let err = mlopt_onnx::interface::read_test_data(&ds, &inputs[..2], &outputs)
        .unwrap_err()
        .to_string();
    assert!(err.contains("has more inputs than the model's 2"), "{err}");
    let err = mlopt_onnx::interface::read_test_data(&ds.join("nothing"), &inputs, &outputs)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such test data folder"), "{err}");
    // A file that is not the value its port declares is named.
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(bad.path().join("input_0.pb"), b"\xff\xff\xff").unwrap();
    let err = mlopt_onnx::interface::read_test_data(bad.path(), &inputs, &outputs)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("reading ") && err.contains("input_0.pb"),
        "{err}"
    );
}
