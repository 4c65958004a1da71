//! The C API under misuse, data errors, threads and fork() (tests/c/api.c), linked as users link it, and
//! again under ThreadSanitizer and AddressSanitizer + UBSan (the runtime's C instrumented) and under
//! valgrind (an `x86-64-v3` build, which valgrind can decode).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::{ConvAttrs, DType, Graph, Op, Tensor, TensorType, Unary};
use mlopt_target::{runnable_level, Target};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The model tests/c/api.c expects, compiled for `target` into `dir` as libapi.a and api.h.
fn build(dir: &Path, target: &str) {
    let mut g = Graph::new("api");
    let table = g.add_const(
        "table",
        Tensor::from_vec(&[4, 3], (0..12).map(|i| i as f32).collect::<Vec<f32>>()).unwrap(),
    );
    let ids = g.add_input("ids", TensorType::new(DType::I64, vec![5]));
    let y0 = g
        .add(Op::Gather { axis: 0 }, "gather0", &[table, ids])
        .unwrap();
    g.add_output("y0", y0);
    let (m, k, n) = (64, 256, 128);
    let w: Vec<f32> = (0..k * n)
        .map(|x| (((x / n) * 7 + x % n) % 13) as f32 / 16.0 - 6.0 / 16.0)
        .collect();
    let w = g.add_const("w", Tensor::from_vec(&[k, n], w).unwrap());
    let x = g.add_input("x", TensorType::new(DType::F32, vec![m, k]));
    let xw = g.add(Op::MatMul, "matmul0", &[x, w]).unwrap();
    let y1 = g.add(Op::Unary(Unary::Relu), "relu0", &[xw]).unwrap();
    g.add_output("y1", y1);
    // A convolution whose packed panels and padded rows once lived on the stack (256 KiB of them).
    let w2: Vec<f32> = (0..16 * 16 * 9)
        .map(|x| {
            (((x / 144) * 5 + (x / 9 % 16) * 3 + (x / 3 % 3) * 2 + x % 3) % 9) as f32 / 16.0 - 0.25
        })
        .collect();
    let w2 = g.add_const("w2", Tensor::from_vec(&[16, 16, 3, 3], w2).unwrap());
    let x2 = g.add_input("x2", TensorType::new(DType::F32, vec![1, 16, 64, 64]));
    let conv = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        group: 1,
        output_padding: vec![],
    };
    let y2 = g.add(Op::Conv(conv), "conv0", &[x2, w2]).unwrap();
    g.add_output("y2", y2);
    let config = mlopt_rewrite::Config::new(Target::named(target, 2).unwrap());
    let opts = mlopt_driver::Options::new(config);
    mlopt_driver::compile(&g, &opts)
        .unwrap()
        .write_library(dir, "api", &[])
        .unwrap();
}

/// Compiles tests/c/api.c against the library in `dir` with `flags`; with `runtime`, the runtime's C
/// source is compiled in (with the same flags) ahead of the library's copy.
fn harness(dir: &Path, name: &str, flags: &[&str], runtime: bool) -> PathBuf {
    let exe = dir.join(name);
    let mut cc = Command::new("cc");
    cc.args(["-std=gnu11", "-g", "-O1", "-Wall", "-Werror"])
        .args(flags)
        .arg("-I")
        .arg(dir)
        .arg(root().join("tests/c/api.c"));
    if runtime {
        cc.arg(root().join("crates/mlopt-runtime/runtime/mlopt_runtime.c"));
    }
    let out = cc
        .arg(dir.join("libapi.a"))
        .args(["-lm", "-lpthread", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn passes(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

#[test]
fn the_c_api_reports_errors_and_survives_threads_and_fork() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path(), runnable_level());
    passes(&mut Command::new(harness(tmp.path(), "api", &[], false)));
}

#[test]
fn the_runtime_is_clean_under_thread_sanitizer() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path(), runnable_level());
    let exe = harness(tmp.path(), "api_tsan", &["-fsanitize=thread"], true);
    // (die_after_fork=0: the harness forks on purpose, and its child starts the pool's threads anew.
    // setarch -R: without address randomisation, since TSan's shadow memory cannot follow every
    // kernel's mmap layout ("unexpected memory mapping").)
    passes(
        Command::new("setarch")
            .args([std::env::consts::ARCH, "-R"])
            .arg(exe)
            .env(
                "TSAN_OPTIONS",
                "halt_on_error=1 die_after_fork=0 exitcode=66",
            ),
    );
}

#[test]
fn the_runtime_is_clean_under_address_sanitizer() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path(), runnable_level());
    let exe = harness(
        tmp.path(),
        "api_asan",
        &["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
        true,
    );
    passes(Command::new(exe).env(
        "ASAN_OPTIONS",
        "detect_leaks=1 abort_on_error=0 exitcode=66",
    ));
}

#[test]
fn the_library_is_clean_under_valgrind() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path(), "x86-64-v3");
    let exe = harness(tmp.path(), "api_v3", &[], false);
    passes(
        Command::new("valgrind")
            .args([
                "--quiet",
                "--error-exitcode=99",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite",
                "--trace-children=yes",
            ])
            .arg(exe),
    );
}
