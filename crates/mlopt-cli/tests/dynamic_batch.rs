//! A dynamic batch from C: `mlopt compile --max batch=8` on a model with a symbolic batch writes one
//! library whose run takes the batch size; n items give the interpreter's outputs for those items at
//! every n, and n past the bound is an argument error with a message. (The Python tests compare the
//! same with ONNX Runtime.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

mod common;
use common::{close, fixture, ok};

const MAIN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include "model.h"

int main(int argc, char **argv) {
    static float x[8 * MLOPT_MODEL_INPUT0_ELEMS], y[8 * MLOPT_MODEL_OUTPUT0_ELEMS];
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(x, sizeof x, 1, f) != 1) return 2;
    void *ctx = mlopt_model_create();
    const void *in[] = {x};
    void *out[] = {y};
    for (int n = 1; n <= MLOPT_MODEL_MAX_BATCH; n++) {
        if (mlopt_model_run(ctx, n, in, out) != MLOPT_OK) return 3;
        for (int i = 0; i < n * (int)MLOPT_MODEL_OUTPUT0_ELEMS; i++) printf("%d %.9g\n", n, y[i]);
    }
    if (mlopt_model_run(ctx, MLOPT_MODEL_MAX_BATCH + 1, in, out) != MLOPT_ERR_ARGUMENT) return 4;
    fprintf(stderr, "%s\n", mlopt_model_error(ctx));
    if (mlopt_model_run(ctx, 0, in, out) != MLOPT_ERR_ARGUMENT) return 5;
    mlopt_model_destroy(ctx);
    return 0;
}
"#;

#[test]
fn a_dynamic_batch_library_runs_every_batch_size_from_c() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let model = fixture("dynamic/model.onnx");
    let mlopt = env!("CARGO_BIN_EXE_mlopt");
    let out = dir.join("out");
    ok(Command::new(mlopt)
        .arg("compile")
        .arg(&model)
        .args(["--max", "batch=8", "-o"])
        .arg(&out));
    // Eight items, and the interpreter's outputs for them at batch 8.
    let x: Vec<f32> = (0..8 * 3 * 8 * 8)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let t = mlopt_ir::Tensor::from_vec(&[8, 3, 8, 8], x).unwrap();
    mlopt_onnx::write_npy(&dir.join("x.npy"), &t).unwrap();
    std::fs::write(dir.join("x.bin"), t.to_le_bytes()).unwrap();
    ok(Command::new(mlopt)
        .arg("run")
        .arg(&model)
        .arg("--interpret")
        .arg("--input")
        .arg(format!("x={}", dir.join("x.npy").display()))
        .arg("--output-dir")
        .arg(dir.join("want")));
    let want = mlopt_onnx::read_npy(&dir.join("want/y.npy"))
        .unwrap()
        .to_f64_vec();
    let per_item = want.len() / 8;
    std::fs::write(dir.join("main.c"), MAIN).unwrap();
    let exe = dir.join("main");
    ok(Command::new("cc")
        .arg(dir.join("main.c"))
        .arg("-I")
        .arg(&out)
        .arg(out.join("libmodel.a"))
        .args(["-lm", "-lpthread", "-o"])
        .arg(&exe));
    let run = ok(Command::new(&exe).arg(dir.join("x.bin")));
    let text = String::from_utf8_lossy(&run.stdout);
    for n in 1..=8usize {
        let got: Vec<f64> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(k, _)| k.parse::<usize>().unwrap() == n)
            .map(|(_, v)| v.parse().unwrap())
            .collect();
        close(&got, &want[..n * per_item], &format!("batch {n}"));
    }
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("the batch size 9 is out of range: model runs 1 to 8 items"),
        "{err}"
    );
}
