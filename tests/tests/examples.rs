//! The examples users start from: examples/c links the library `mlopt compile` writes for the mlp
//! fixture, runs it on the fixture's input and prints the outputs, which must match the interpreter's
//! (examples/rust, built by mlopt-build, is tested in mlopt-cli's tests/link.rs, beside the binary).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::interp;
use mlopt_target::{runnable_level, Target};
use mlopt_tests::{data, dir, import};
use std::path::Path;
use std::process::Command;

/// Compiles the mlp fixture into `out` and writes its input as raw floats; returns the expected output.
fn prepare(out: &Path) -> Vec<f64> {
    let g = import("mlp");
    let config = mlopt_rewrite::Config::new(Target::named(runnable_level(), 2).unwrap());
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
    c.write_library(out, "mlp", &[]).unwrap();
    let (inputs, _) = data("mlp");
    std::fs::write(out.join("input.bin"), inputs["x"].to_le_bytes()).unwrap();
    interp::run(&g, &inputs).unwrap()[0].1.to_f64_vec()
}

fn check_printed(stdout: &[u8], want: &[f64]) {
    let got: Vec<f64> = String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn the_c_example_links_the_library_and_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let want = prepare(tmp.path());
    let exe = tmp.path().join("mlp");
    let src = dir("mlp").join("../../examples/c/main.c");
    run(Command::new("cc")
        .arg(&src)
        .arg("-I")
        .arg(tmp.path())
        .arg(tmp.path().join("libmlp.a"))
        .args(["-lm", "-lpthread", "-o"])
        .arg(&exe));
    let out = run(Command::new(&exe).arg(tmp.path().join("input.bin")));
    check_printed(&out.stdout, &want);
}

/// Names from a hostile model file: comment terminators, line breaks, quotes, backslashes, braces, a
/// trigraph, non-ASCII, an empty name and a C keyword. The header must compile (no live C), its name
/// macros must spell the names exactly, and the Rust binding must compile (no live Rust).
#[test]
fn hostile_names_stay_inside_comments_and_literals() {
    use mlopt_ir::{DType, Graph, Op, TensorType, Unary};
    let names = [
        "x */ int injected; /*",
        "line\nbreak(); //",
        "quote\" back\\slash {brace} ??=",
        "é\u{1F600}",
        "",
        "int",
    ];
    let mut g = Graph::new("evil */ model\nfn injected() {}");
    for (i, name) in names.iter().enumerate() {
        let x = g.add_input(*name, TensorType::new(DType::F32, vec![2, 3]));
        let y = g
            .add(Op::Unary(Unary::Neg), format!("neg{i}"), &[x])
            .unwrap();
        g.add_output(format!("{name}.out"), y);
    }
    let config = mlopt_rewrite::Config::new(Target::named(runnable_level(), 1).unwrap());
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    c.write_library(tmp.path(), "evil", &[]).unwrap();
    let header = std::fs::read_to_string(tmp.path().join("evil.h")).unwrap();
    // Every name stays on its comment's or literal's line: no line of the header starts with a name's tail.
    assert!(
        header
            .lines()
            .all(|l| !l.trim_start().starts_with("break();")
                && !l.trim_start().starts_with("fn injected")),
        "{header}"
    );
    // A C program that includes the header (with every warning an error) and prints each name macro.
    let up = mlopt_llvm::c_name(&g.name).to_uppercase();
    let prints: String = (0..names.len())
        .map(|i| format!("    fputs(MLOPT_{up}_INPUT{i}_NAME, stdout); putchar(0);\n    fputs(MLOPT_{up}_OUTPUT{i}_NAME, stdout); putchar(0);\n"))
        .collect();
    let src = tmp.path().join("names.c");
    std::fs::write(&src, format!("#include <stdio.h>\n#include \"evil.h\"\nint main(void) {{\n{prints}    return 0;\n}}\n")).unwrap();
    let exe = tmp.path().join("names");
    run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-Wtrigraphs", "-I"])
        .arg(tmp.path())
        .arg(&src)
        .arg("-o")
        .arg(&exe));
    let out = run(&mut Command::new(&exe));
    let printed: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(printed[2 * i], name.as_bytes(), "input {i}");
        assert_eq!(
            printed[2 * i + 1],
            format!("{name}.out").as_bytes(),
            "output {i}"
        );
    }
    // The binding compiles as a library (it only declares the C functions, so nothing is linked).
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    run(Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "lib",
            "--emit",
            "metadata",
            "-D",
            "warnings",
            "-o",
        ])
        .arg(tmp.path().join("evil.rmeta"))
        .arg(tmp.path().join("evil.rs")));
}
