//! The architecture invariants of docs/architecture.md, checked: which crates each crate may depend on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// The names in a crate's `[dependencies]` table (not dev-dependencies).
fn deps(krate: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = vec![];
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            out.push(line.split(['=', '.', ' ']).next().unwrap().to_string());
        }
    }
    out
}

#[test]
fn crate_dependencies_follow_the_rules() {
    let rules: &[(&str, &[&str])] = &[
        // The IR knows nothing of ONNX, egg, the kernel IR or LLVM.
        (
            "mlopt-ir",
            &[
                "petgraph",
                "ndarray",
                "num-traits",
                "half",
                "libm",
                "thiserror",
            ],
        ),
        // Only the ONNX crate knows ONNX (and protobuf).
        ("mlopt-onnx", &["mlopt-ir", "prost", "thiserror", "half"]),
        // What a machine is: nothing of mlopt's.
        ("mlopt-target", &["thiserror"]),
        // The cost model sees ops, types and the target only.
        ("mlopt-cost", &["mlopt-ir", "mlopt-target", "thiserror"]),
        // The only crate that knows egg.
        (
            "mlopt-rewrite",
            &[
                "mlopt-ir",
                "mlopt-cost",
                "mlopt-target",
                "egg",
                "thiserror",
                "indicatif",
            ],
        ),
        // The kernel IR knows nothing of ONNX, the graph IR or LLVM.
        ("mlopt-kir", &["thiserror", "half", "libm"]),
        // Lowering sees the graph IR and the kernel IR, and no target or cost model.
        ("mlopt-lower", &["mlopt-ir", "mlopt-kir", "thiserror"]),
        // Scheduling sees the kernel IR, the target and the cost model: every target decision.
        (
            "mlopt-schedule",
            &["mlopt-kir", "mlopt-cost", "mlopt-target", "thiserror"],
        ),
        // The only crate that links LLVM; it sees the kernel IR and the target only.
        (
            "mlopt-llvm",
            &["mlopt-kir", "mlopt-target", "inkwell", "thiserror"],
        ),
        // The runtime knows no IR at all.
        (
            "mlopt-runtime",
            &["thiserror", "libloading", "object", "tempfile"],
        ),
        // The driver strings the stages together.
        (
            "mlopt-driver",
            &[
                "mlopt-ir",
                "mlopt-onnx",
                "mlopt-kir",
                "mlopt-cost",
                "mlopt-target",
                "mlopt-rewrite",
                "mlopt-lower",
                "mlopt-schedule",
                "mlopt-llvm",
                "mlopt-runtime",
                "thiserror",
                "tempfile",
            ],
        ),
        // anyhow only in the CLI.
        (
            "mlopt-cli",
            &[
                "mlopt-ir",
                "mlopt-onnx",
                "mlopt-target",
                "mlopt-rewrite",
                "mlopt-lower",
                "mlopt-schedule",
                "mlopt-driver",
                "clap",
                "anyhow",
            ],
        ),
    ];
    for (krate, allowed) in rules {
        for d in deps(krate) {
            assert!(
                allowed.contains(&d.as_str()),
                "{krate} must not depend on {d} (docs/architecture.md)"
            );
        }
    }
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates")).unwrap()
    {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            rules.iter().any(|(k, _)| *k == name),
            "crate {name} has no dependency rule here"
        );
        if name != "mlopt-cli" {
            assert!(
                !deps(&name).contains(&"anyhow".to_string()),
                "{name}: anyhow is for the CLI only"
            );
        }
    }
}

/// docs/onnx-ops.md names every ONNX op the importer supports.
#[test]
fn the_op_table_lists_every_supported_op() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/onnx-ops.md"))
            .unwrap();
    let words: std::collections::HashSet<&str> =
        doc.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let missing: Vec<&str> = mlopt_onnx::supported_ops()
        .into_iter()
        .filter(|op| !words.contains(op))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/onnx-ops.md does not mention {missing:?}"
    );
}
