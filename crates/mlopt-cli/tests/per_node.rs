//! `mlopt check --per-node` from the command line: it needs a build to compare, and reports how many
//! kernel outputs it compared and the first node out of tolerance (none at fp32; the first bf16
//! kernel when the tolerance is below bf16's rounding).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn check(extra: &[&str]) -> Output {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/transformer");
    Command::new(env!("CARGO_BIN_EXE_mlopt"))
        .arg("check")
        .arg(format!("{dir}/model.onnx"))
        .arg("--data")
        .arg(format!("{dir}/test_data_set_0"))
        .args(["--per-node", "--target", mlopt_target::runnable_level()])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn per_node_reports_the_first_node_out_of_tolerance() {
    let out = check(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("add --optimized, --compiled or --emulated")
    );
    for mode in ["--optimized", "--compiled"] {
        let out = check(&[mode]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("kernel outputs compared")
                && text.contains("every compared node is within tolerance"),
            "{text}"
        );
    }
    let out = check(&["--compiled", "--precision", "bf16", "--tolerance", "1e-5"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("first node out of tolerance: 'ln1' (layer_norm) in kernel k0: MISMATCH"),
        "{text}"
    );
}
