//! Several models in one program: two models whose graphs are both named `main_graph` (as every PyTorch
//! export's is) compile into one folder under their files' names and link into one C program (with and
//! without `--whole-archive`) and, through mlopt-build, into one Rust program, each giving its own
//! fixture's expected output; examples/rust builds with mlopt-build from a clean target dir.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_onnx::proto::ModelProto;
use prost::Message;
use std::path::Path;
use std::process::Command;

mod common;
use common::{close, fixture, ok};

/// The fixture `name` saved as `dir/<as>.onnx` with its graph renamed `main_graph`; its input as raw
/// floats in `dir/<as>.bin`; returns its expected output.
fn model_as(dir: &Path, name: &str, as_: &str) -> Vec<f64> {
    let mut m =
        ModelProto::decode(&*std::fs::read(fixture(&format!("{name}/model.onnx"))).unwrap())
            .unwrap();
    m.graph.as_mut().unwrap().name = "main_graph".into();
    std::fs::write(dir.join(format!("{as_}.onnx")), m.encode_to_vec()).unwrap();
    let data = fixture(&format!("{name}/test_data_set_0"));
    let (_, x) = mlopt_onnx::read_pb(&data.join("input_0.pb")).unwrap();
    std::fs::write(dir.join(format!("{as_}.bin")), x.to_le_bytes()).unwrap();
    mlopt_onnx::read_pb(&data.join("output_0.pb"))
        .unwrap()
        .1
        .to_f64_vec()
}

const MAIN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include "alpha.h"
#include "beta.h"

static void *read_all(const char *path, size_t bytes) {
    void *p = malloc(bytes);
    FILE *f = fopen(path, "rb");
    if (!p || !f || fread(p, 1, bytes, f) != bytes) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    static float ya[MLOPT_ALPHA_OUTPUT0_ELEMS], yb[MLOPT_BETA_OUTPUT0_ELEMS];
    const void *ia[] = {read_all(argv[1], sizeof(float) * MLOPT_ALPHA_INPUT0_ELEMS)};
    const void *ib[] = {read_all(argv[2], sizeof(float) * MLOPT_BETA_INPUT0_ELEMS)};
    void *oa[] = {ya}, *ob[] = {yb};
    void *a = mlopt_alpha_create(), *b = mlopt_beta_create();
    if (!a || !b) return 3;
    /* Each model refuses the other's context. */
    if (mlopt_alpha_run(b, ia, oa) != MLOPT_ERR_ARGUMENT) return 4;
    if (mlopt_alpha_run(a, ia, oa) != MLOPT_OK || mlopt_beta_run(b, ib, ob) != MLOPT_OK) return 5;
    for (unsigned i = 0; i < MLOPT_ALPHA_OUTPUT0_ELEMS; i++) printf("a %.9g\n", ya[i]);
    for (unsigned i = 0; i < MLOPT_BETA_OUTPUT0_ELEMS; i++) printf("b %.9g\n", yb[i]);
    mlopt_alpha_destroy(a);
    mlopt_beta_destroy(b);
    return 0;
}
"#;

#[test]
fn two_main_graph_models_link_into_one_c_program() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let want_a = model_as(dir, "mlp", "alpha");
    let want_b = model_as(dir, "cnn", "beta");
    let out = dir.join("out");
    for m in ["alpha", "beta"] {
        ok(Command::new(env!("CARGO_BIN_EXE_mlopt"))
            .arg("compile")
            .arg(dir.join(format!("{m}.onnx")))
            .arg("-o")
            .arg(&out));
    }
    // The second compile into the folder keeps the first's files (each library has its own record).
    for f in [
        "libalpha.a",
        "alpha.h",
        "alpha.rs",
        "alpha.report.json",
        "libbeta.a",
        "beta.h",
        "beta.report.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    std::fs::write(dir.join("main.c"), MAIN).unwrap();
    for whole in [false, true] {
        let exe = dir.join(format!("main{whole}"));
        let mut cc = Command::new("cc");
        cc.arg(dir.join("main.c")).arg("-I").arg(&out);
        if whole {
            cc.arg("-Wl,--whole-archive");
        }
        cc.arg(out.join("libalpha.a")).arg(out.join("libbeta.a"));
        if whole {
            cc.arg("-Wl,--no-whole-archive");
        }
        ok(cc.args(["-lm", "-lpthread", "-o"]).arg(&exe));
        let run = ok(Command::new(&exe)
            .arg(dir.join("alpha.bin"))
            .arg(dir.join("beta.bin")));
        let text = String::from_utf8_lossy(&run.stdout);
        for (tag, want) in [("a", &want_a), ("b", &want_b)] {
            let got: Vec<f64> = text
                .lines()
                .filter_map(|l| l.strip_prefix(tag).map(|v| v.trim().parse().unwrap()))
                .collect();
            close(&got, want, tag);
        }
    }
}

/// `cargo run` of the package at `manifest` from a clean target dir, offline, with this `mlopt` as the
/// compiler mlopt-build runs; its stdout.
fn cargo_run(manifest: &Path, target: &Path, args: &[&Path]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = ok(Command::new(cargo)
        .args(["run", "--quiet", "--offline", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target)
        .arg("--")
        .args(args)
        .env("MLOPT", env!("CARGO_BIN_EXE_mlopt")));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// examples/rust, whose build.rs compiles the mlp fixture with mlopt-build, builds from a clean target
/// dir and prints the fixture's expected output.
#[test]
fn the_rust_example_builds_with_mlopt_build_and_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let want = model_as(tmp.path(), "mlp", "mlp");
    let manifest = fixture("../examples/rust/Cargo.toml");
    let text = cargo_run(
        &manifest,
        &tmp.path().join("target"),
        &[&tmp.path().join("mlp.bin")],
    );
    let got: Vec<f64> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    close(&got, &want, "mlp");
}

/// A crate whose build.rs compiles the two `main_graph` models with mlopt-build (one by its file's name,
/// one renamed by `Config::name`) runs both in one program, one of them moved to another thread; a
/// third model, with a dynamic batch (`Config::max_batch`), runs one and three items.
#[test]
fn two_main_graph_models_link_into_one_rust_program() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let want_a = model_as(dir, "mlp", "alpha");
    let want_b = model_as(dir, "cnn", "beta");
    let krate = dir.join("app");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlopt-build");
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[build-dependencies]\nmlopt-build = {{ path = {:?} }}\n\n[workspace]\n",
            build.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(
        krate.join("build.rs"),
        format!(
            "fn main() {{\n    let mut c = mlopt_build::Config::new();\n    c.target(\"x86-64-v3\");\n    c.compile({:?}).unwrap();\n    c.name(\"second\").compile({:?}).unwrap();\n    c.max_batch(\"batch\", 4).compile({:?}).unwrap();\n}}\n",
            dir.join("alpha.onnx"),
            dir.join("beta.onnx"),
            fixture("dynamic/model.onnx")
        ),
    )
    .unwrap();
    std::fs::write(
        krate.join("src/main.rs"),
        r#"include!(concat!(env!("OUT_DIR"), "/mlopt/models.rs"));

fn read(path: &str) -> Vec<f32> {
    let b = std::fs::read(path).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (xa, xb) = (read(&args[1]), read(&args[2]));
    let mut a = alpha::Model::new().unwrap();
    // Model is Send: this one runs on another thread.
    let b = second::Model::new().unwrap();
    let yb = std::thread::spawn(move || {
        let mut b = b;
        let mut yb = vec![0f32; second::OUTPUT0_SHAPE.iter().product()];
        b.run(&xb, &mut yb).unwrap();
        yb
    })
    .join()
    .unwrap();
    let mut ya = vec![0f32; alpha::OUTPUT0_SHAPE.iter().product()];
    a.run(&xa, &mut ya).unwrap();
    for v in ya { println!("a {v:.9e}"); }
    for v in yb { println!("b {v:.9e}"); }
    // A dynamic batch: three items give, for the first, what one item gives.
    let mut d = model::Model::new().unwrap();
    let item: usize = model::INPUT0_SHAPE.iter().product();
    let out: usize = model::OUTPUT0_SHAPE.iter().product();
    let x: Vec<f32> = (0..3 * item).map(|i| (i % 7) as f32 - 3.0).collect();
    let (mut y1, mut y3) = (vec![0f32; out], vec![0f32; 3 * out]);
    d.run(1, &x[..item], &mut y1).unwrap();
    d.run(3, &x, &mut y3).unwrap();
    assert_eq!(model::Model::MAX_BATCH, 4);
    assert!(d.run(5, &vec![0f32; 5 * item], &mut vec![0f32; 5 * out]).is_err());
    assert!(y1.iter().zip(&y3).all(|(p, q)| (p - q).abs() <= 1e-5 * p.abs().max(1.0)));
    println!("dynamic ok");
}
"#,
    )
    .unwrap();
    let text = cargo_run(
        &krate.join("Cargo.toml"),
        &dir.join("target"),
        &[&dir.join("alpha.bin"), &dir.join("beta.bin")],
    );
    for (tag, want) in [("a ", &want_a), ("b ", &want_b)] {
        let got: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix(tag).map(|v| v.trim().parse().unwrap()))
            .collect();
        close(&got, want, tag);
    }
    assert!(text.contains("dynamic ok"), "{text}");
}
