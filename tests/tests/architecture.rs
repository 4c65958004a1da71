//! The architecture invariants of docs/architecture.md, checked: which crates each crate may depend on,
//! and which crate may make which decision.
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
                "mlopt-minifloat",
            ],
        ),
        // The float8 / float4 formats: one definition both interpreters and code generation share.
        ("mlopt-minifloat", &[]),
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
        (
            "mlopt-kir",
            &["thiserror", "half", "libm", "mlopt-minifloat"],
        ),
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
            &[
                "mlopt-kir",
                "mlopt-target",
                "mlopt-minifloat",
                "inkwell",
                "thiserror",
            ],
        ),
        // A build-dependency for users' build scripts: it runs the mlopt binary, so it pulls in nothing.
        ("mlopt-build", &[]),
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
                // The digests of .mlopt-files.<name> (output.rs).
                "sha2",
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

/// The library code of a crate: each `src/**/*.rs` file up to its first test module, comments left out.
fn library_code(krate: &str) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates")
        .join(krate)
        .join("src");
    let mut files = vec![];
    walk(&src, &mut files);
    files
        .into_iter()
        .filter(|f| !f.ends_with("tests.rs"))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap()
                .lines()
                .map(|l| l.split("//").next().unwrap())
                .collect::<Vec<_>>()
                .join("\n");
            (f.display().to_string(), code)
        })
        .collect()
}

fn crates() -> Vec<String> {
    let mut out: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    out.sort();
    out
}

/// No stage parses a target name: only the target crate looks names up (and the CLI reads `--target`).
#[test]
fn only_the_target_crate_knows_target_names() {
    let names = [
        "Target::named(",
        "\"host\"",
        "\"sm_",
        "\"x86-64-v",
        "\"znver",
    ];
    for krate in crates() {
        if krate == "mlopt-target" || krate == "mlopt-cli" {
            continue;
        }
        for (file, code) in library_code(&krate) {
            for n in names {
                assert!(
                    !code.contains(n),
                    "{file} names a target ({n}): ask the Target instead"
                );
            }
        }
    }
}

/// Lowering writes algorithms: no schedule step, no vector, parallel or unrolled loop, no GPU mapping.
/// Only the schedule crate adds to a kernel's schedule (the kernel IR holds the steps' mechanics).
#[test]
fn only_the_schedule_crate_decides_how_loops_run() {
    for (file, code) in library_code("mlopt-lower") {
        for made in [
            "LoopKind::Vector",
            "LoopKind::Parallel",
            "LoopKind::Unrolled",
            "LoopKind::Gpu",
            "ScheduleStep::",
            "Stmt::Mma",
        ] {
            assert!(
                !code.contains(made),
                "{file}: lowering makes {made}, a schedule's choice"
            );
        }
    }
    for krate in crates() {
        if krate == "mlopt-schedule" || krate == "mlopt-kir" {
            continue;
        }
        for (file, code) in library_code(&krate) {
            assert!(
                !code.contains("schedule.push("),
                "{file} adds a schedule step: only mlopt-schedule decides schedules"
            );
        }
    }
}

/// Only the schedule crate rewrites a program's weights into a layout of its own (packed panels,
/// transposes, Winograd's transforms): lowering binds the graph's constants as they are.
#[test]
fn only_the_schedule_crate_lays_out_weights() {
    for krate in crates() {
        if krate == "mlopt-schedule" || krate == "mlopt-kir" {
            continue;
        }
        for (file, code) in library_code(&krate) {
            for layout in ["pack_blocks(", ".packed{", "fn transposed(", ".winograd\""] {
                assert!(
                    !code.contains(layout),
                    "{file} lays out a weight ({layout})"
                );
            }
        }
    }
}
