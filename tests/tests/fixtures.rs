//! The fixture models in `fixtures/` (built by fixtures/make_fixtures.py): their import dumps are
//! snapshot-tested, and the interpreter's outputs must match ONNX Runtime's, committed next to each model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::{interp, print};

use mlopt_tests::{data, import, FIXTURES};

#[test]
fn import_dumps() {
    for name in FIXTURES {
        insta::assert_snapshot!(format!("import_{name}"), print::print(&import(name)));
    }
}

#[test]
fn import_dumps_round_trip_through_the_parser() {
    for name in FIXTURES {
        let g = import(name);
        let text = print::print(&g);
        let back = mlopt_ir::parse::parse(&text, &|n| g.const_by_name(n)).expect("parse");
        assert_eq!(print::print(&back), text, "{name}");
    }
}

/// The interpreter's outputs against the expected ones, within 1e-3 relative error (1e-5 absolute floor).
fn matches_expected(name: &str) {
    let (inputs, expected) = data(name);
    let outs = interp::run(&import(name), &inputs).expect("run");
    assert_eq!(outs.len(), expected.len());
    for ((got_name, got), (want_name, want)) in outs.iter().zip(&expected) {
        assert_eq!(got_name, want_name);
        assert_eq!(got.ty(), want.ty(), "{name}/{got_name}");
        let worst = got
            .to_f64_vec()
            .iter()
            .zip(want.to_f64_vec())
            .map(|(a, b)| (a - b).abs() / (1e-5 + b.abs()))
            .fold(0.0, f64::max);
        assert!(
            worst < 1e-3,
            "{name}/{got_name}: worst relative error {worst:e}"
        );
    }
}

#[test]
fn interpreter_matches_onnx_runtime() {
    for name in FIXTURES {
        matches_expected(name);
    }
}

/// Every numbered case in a fixture set; at least `min` of them.
fn each_case(set: &str, min: usize) {
    let n = std::fs::read_dir(mlopt_tests::dir(set))
        .expect("fixture set")
        .count();
    assert!(n >= min, "{set} has {n} cases");
    for k in 0..n {
        matches_expected(&format!("{set}/{k}"));
    }
}

/// Einsum equations (expected outputs from numpy's einsum) through the import lowering.
#[test]
fn einsum_matches_numpy() {
    each_case("einsum", 8);
}

/// RNN/GRU/LSTM in the directions and modes ONNX's node tests leave out, against ONNX Runtime.
#[test]
fn recurrent_ops_match_onnx_runtime() {
    each_case("rnn", 5);
}

/// DeformConv (groups, offset groups, mask, bias, stride, dilation, padding) and RoiAlign (avg, max;
/// boxes partly outside the image) on several channels and images, interpreted and compiled, against
/// ONNX Runtime (onnx's reference where ORT lacks the op or differs from the specification).
#[test]
fn sampling_ops_match_the_reference_interpreted_and_compiled() {
    each_case("sampling", 3);
    for k in 0..3 {
        compiled_matches_expected(&format!("sampling/{k}"));
    }
}

/// The fixture compiled for this machine's best x86 level with 2 threads: its outputs against the
/// expected ones, within 1e-5 (`worst_error`).
fn compiled_matches_expected(name: &str) {
    let config = mlopt_rewrite::Config::new(
        mlopt_target::Target::named(mlopt_target::runnable_level(), 2).unwrap(),
    );
    let c = mlopt_driver::compile(&import(name), &mlopt_driver::Options::new(config)).unwrap();
    let (inputs, want) = data(name);
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let err = mlopt_tests::worst_error(&want, &got);
    assert!(err < 1e-5, "{name} compiled: error {err:e}");
}

/// Control flow (an If on a shape, a Loop with a scan output, a Scan with a reversed input and a
/// transposed output, an If nested in a Loop, all unrolled and folded at import; an If on an input, taken
/// each way at run time; Ifs on inputs nested, each way, whose untaken branches gather out of range, so
/// they pass only if what an untaken branch alone needs does not run; sequences built by an If on an
/// input, each way, mapped and joined, and a sequence input grown and given back): interpreted and
/// compiled (the newest x86 level this CPU runs, 2 threads), against ONNX Runtime.
#[test]
fn control_flow_matches_onnx_runtime_interpreted_and_compiled() {
    each_case("control", 12);
    for k in 0..12 {
        compiled_matches_expected(&format!("control/{k}"));
    }
}

/// Outputs whose size depends on the data (NonMaxSuppression then gathers; NonZero transposed; Compress
/// then a row sum; Unique of values, then doubled, and of rows): computed at a bound with a count, cut to the count, against ONNX Runtime,
/// interpreted and compiled.
#[test]
fn data_sized_outputs_match_onnx_runtime_interpreted_and_compiled() {
    let config = mlopt_rewrite::Config::new(
        mlopt_target::Target::named(mlopt_target::runnable_level(), 2).unwrap(),
    );
    for k in 0..3 {
        let name = format!("counted/{k}");
        let (g, (inputs, want)) = (import(&name), data(&name));
        let outs = interp::run(&g, &inputs).unwrap();
        let got = mlopt_ir::extent::exact_outputs(&g, &outs).unwrap();
        assert_eq!(
            mlopt_tests::worst_error(&want, &got),
            0.0,
            "{name} interpreted"
        );
        let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config.clone())).unwrap();
        let outs = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        let got = mlopt_ir::extent::exact_outputs(&g, &outs).unwrap();
        let err = mlopt_tests::worst_error(&want, &got);
        assert!(err < 1e-6, "{name} compiled: error {err:e}");
    }
}

#[test]
fn the_shape_subgraph_folds_away() {
    let text = print::print(&import("dynamic"));
    for gone in ["shape", "gather", "concat", "unsqueeze"] {
        assert!(
            !text.contains(&format!("= {gone}")),
            "{gone} survived:\n{text}"
        );
    }
    assert!(text.contains("reshape[shape=[2,256]]"), "{text}");
}
