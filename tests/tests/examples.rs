//! The examples users start from: examples/c and examples/rust link the library `mlopt compile` writes for
//! the mlp fixture, run it on the fixture's input and print the outputs, which must match the
//! interpreter's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_cost::Target;
use mlopt_ir::interp;
use mlopt_tests::{data, dir, import};
use std::path::Path;
use std::process::Command;

/// Compiles the mlp fixture into `out` and writes its input as raw floats; returns the expected output.
fn prepare(out: &Path) -> Vec<f64> {
    let g = import("mlp");
    let config = mlopt_rewrite::Config::new(Target::named("x86-64-v4", 1).unwrap());
    let c =
        mlopt_driver::compile(&g, &mlopt_driver::Options { config, threads: 2, tune: false, winograd: mlopt_lower::Winograd::Auto, profile: false }).unwrap();
    c.write_library(out, "mlp").unwrap();
    let (inputs, _) = data("mlp");
    std::fs::write(out.join("input.bin"), inputs["x"].to_le_bytes()).unwrap();
    interp::run(&g, &inputs).unwrap()[0].1.to_f64_vec()
}

fn check_printed(stdout: &[u8], want: &[f64]) {
    let got: Vec<f64> = String::from_utf8_lossy(stdout).lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn the_c_example_links_the_library_and_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let want = prepare(tmp.path());
    let exe = tmp.path().join("mlp");
    let src = dir("mlp").join("../../examples/c/main.c");
    run(Command::new("cc").arg(&src).arg("-I").arg(tmp.path()).arg(tmp.path().join("libmlp.a")).args(["-lm", "-lpthread", "-o"]).arg(&exe));
    let out = run(Command::new(&exe).arg(tmp.path().join("input.bin")));
    check_printed(&out.stdout, &want);
}

#[test]
fn the_rust_example_links_the_library_and_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let want = prepare(tmp.path());
    let manifest = dir("mlp").join("../../examples/rust/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = run(Command::new(cargo)
        .args(["run", "--quiet", "--offline", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(tmp.path().join("target"))
        .arg("--")
        .arg(tmp.path().join("input.bin"))
        .env("MLOPT_OUT", tmp.path()));
    check_printed(&out.stdout, &want);
}
