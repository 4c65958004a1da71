//! Several models in one program: two models whose graphs are both named `main_graph` (as every PyTorch
//! export's is) compile into one folder under their files' names and link into one C program, with
//! and without `--whole-archive`, each giving its own fixture's expected output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_onnx::proto::ModelProto;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

fn ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

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
            assert_eq!(got.len(), want.len(), "{tag}");
            for (g, w) in got.iter().zip(want.iter()) {
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "{tag}: {g} vs {w}"
                );
            }
        }
    }
}
