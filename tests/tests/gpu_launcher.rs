//! The GPU library's launcher (`mlopt-runtime/runtime/mlopt_cuda.c`) without a GPU: libraries linked
//! into C programs run against a stand-in libcuda that records what it is asked to do: the launches in
//! program order, the weights uploaded once, a data check's flag read back, and only the branch an `If`
//! takes launched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_driver::GpuCompiled;
use mlopt_rewrite::{Config, Precision};
use mlopt_target::Target;
use mlopt_tests::import;
use std::process::Command;

/// Fixture `name` compiled for sm_80 in fp32.
fn compiled(name: &str) -> GpuCompiled {
    let mut config = Config::new(Target::named("sm_80", 1).unwrap());
    config.precision = Precision::Fp32;
    mlopt_driver::compile_gpu(&import(name), &mlopt_driver::Options::new(config))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A stand-in for libcuda.so.1: device memory is host memory, and every call is logged to $MOCK_LOG.
/// Kernels do not run, except that with $MOCK_FAIL_CHECKS a data check's kernel (`..._check..`) sets its
/// flag (its first argument), as one finding invalid data would.
const MOCK_CUDA: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static FILE *log_file(void) { static FILE *f; if (!f) f = fopen(getenv("MOCK_LOG"), "w"); return f; }
int cuInit(unsigned f) { fprintf(log_file(), "init\n"); return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { fprintf(log_file(), "release\n"); fflush(log_file()); return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuModuleLoadData(void **m, const void *ptx) { fprintf(log_file(), "module %d\n", strstr(ptx, ".entry") != 0); *m = (void *)1; return 0; }
int cuModuleUnload(void *m) { return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { *f = strdup(name); return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) { *p = (unsigned long long)calloc(1, n); fprintf(log_file(), "alloc %zu\n", n); return 0; }
int cuMemFree_v2(unsigned long long p) { free((void *)p); return 0; }
int cuMemcpyHtoDAsync_v2(unsigned long long d, const void *s, size_t n, void *st) { memcpy((void *)d, s, n); fprintf(log_file(), "htod %zu\n", n); return 0; }
int cuMemcpyDtoHAsync_v2(void *d, unsigned long long s, size_t n, void *st) { memcpy(d, (void *)s, n); fprintf(log_file(), "dtoh %zu\n", n); return 0; }
int cuStreamCreate(void **s, unsigned f) { *s = (void *)2; return 0; }
int cuStreamDestroy_v2(void *s) { return 0; }
int cuStreamSynchronize(void *s) { fprintf(log_file(), "sync\n"); return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, void *s, void **params, void **extra) {
    fprintf(log_file(), "launch %s %ux%u\n", (const char *)f, gx, bx);
    if (getenv("MOCK_FAIL_CHECKS") && strstr((const char *)f, "_check")) *(float *)*(unsigned long long *)params[0] = 1.0f;
    return 0; }
int cuGetErrorString(int r, const char **s) { *s = "mock error"; return 0; }
"#;

/// `main` built from the C source `main_c` in `dir`, linked against `lib<lib>.a` there (and libdl).
fn link_c(dir: &std::path::Path, main_c: &str, lib: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("main.c"), main_c).unwrap();
    let exe = dir.join("main");
    let cc = Command::new("cc")
        .current_dir(dir)
        .args(["-std=c11", "-Wall", "-Werror", "main.c", "-L."])
        .arg(format!("-l{lib}"))
        .args(["-ldl", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "linking main.c against lib{lib}.a: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

/// Builds the stand-in libcuda.so.1 in `dir`/mock; returns that folder (for LD_LIBRARY_PATH).
fn mock_driver(dir: &std::path::Path) -> std::path::PathBuf {
    let mock = dir.join("mock");
    std::fs::create_dir_all(&mock).unwrap();
    std::fs::write(mock.join("cuda.c"), MOCK_CUDA).unwrap();
    let so = Command::new("cc")
        .current_dir(&mock)
        .args(["-shared", "-fPIC", "cuda.c", "-o", "libcuda.so.1"])
        .output()
        .unwrap();
    assert!(
        so.status.success(),
        "{}",
        String::from_utf8_lossy(&so.stderr)
    );
    mock
}

const MAIN_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mlp.h"
int main(void) {
    void *m = mlopt_mlp_create(0);
    if (!m) { printf("create failed: %s\n", mlopt_mlp_last_error()); return 3; }
    static _Alignas(16) float x[MLOPT_MLP_INPUT0_ELEMS], y[MLOPT_MLP_OUTPUT0_ELEMS];
    const void *in[] = {x};
    void *out[] = {y};
    for (int i = 0; i < 2; i++)
        if (mlopt_mlp_run(m, in, out)) { printf("run failed: %s\n", mlopt_mlp_last_error()); return 4; }
    /* Device buffers must be 16-byte aligned (the kernels move 16 bytes at a time). */
    uint64_t bad[] = {(uint64_t)(x + 1)}, good[] = {(uint64_t)y};
    if (mlopt_mlp_run_device(m, bad, good, NULL) != -1 || !strstr(mlopt_mlp_last_error(), "not 16-byte aligned")) { printf("misaligned input accepted\n"); return 5; }
    mlopt_mlp_destroy(m);
    printf("ok\n");
    return 0;
}
"#;

#[test]
fn the_gpu_library_links_and_launches_in_order() {
    let c = compiled("mlp");
    let dir = tempfile::tempdir().unwrap();
    c.write_library(dir.path(), "mlp", &[]).unwrap();
    for f in ["mlp.h", "mlp.ptx", "libmlp.a", "mlp.ll"] {
        assert!(dir.path().join(f).exists(), "{f} not written");
    }
    let exe = link_c(dir.path(), MAIN_C, "mlp");
    // Without a driver, create fails with a message (this machine has no GPU; with one, skip this).
    let gpu = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success());
    if !gpu {
        let out = Command::new(&exe)
            .env("LD_LIBRARY_PATH", dir.path().join("none"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("no CUDA driver"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Against the stand-in driver: one module, weights uploaded once, the kernels launched in program
    // order with the scheduled grid and block, per run.
    let mock = mock_driver(dir.path());
    let log = dir.path().join("calls.log");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &mock)
        .env("MOCK_LOG", &log)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let calls = std::fs::read_to_string(&log).unwrap();
    let (_, blob, _) = mlopt_llvm::launch_table(&c.program).unwrap();
    let weights = format!("htod {}", blob.len());
    assert_eq!(
        calls.lines().filter(|l| *l == weights).count(),
        1,
        "weights uploaded once:\n{calls}"
    );
    assert_eq!(
        calls.lines().filter(|l| l.starts_with("module 1")).count(),
        1,
        "{calls}"
    );
    let mut want = Vec::new();
    for _ in 0..2 {
        for s in &c.program.steps {
            let k = &c.program.kernels[s.kernel];
            let l = mlopt_kir::gpu::launch(k).unwrap();
            want.push(format!("launch {} {}x{}", k.name, l.grid, l.block));
        }
    }
    let got: Vec<&str> = calls.lines().filter(|l| l.starts_with("launch")).collect();
    assert_eq!(got, want, "{calls}");
    assert_eq!(
        calls.lines().filter(|l| l.starts_with("dtoh")).count(),
        2,
        "{calls}"
    );
}

const CHECKED_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include "gather.h"
int main(void) {
    void *m = mlopt_gather_create(0);
    if (!m) { printf("create failed: %s\n", mlopt_gather_last_error()); return 3; }
    static _Alignas(16) long long ids[4] = {0, 1, 2, 3};
    static _Alignas(16) float y[12];
    const void *in[] = {ids};
    void *out[] = {y};
    int r = mlopt_gather_run(m, in, out);
    printf("%d %s\n", r, r ? mlopt_gather_last_error() : "");
    mlopt_gather_destroy(m);
    return 0;
}
"#;

/// A data check on the GPU: the launcher reads the check's flag back after its kernel (a 4-byte copy
/// and a synchronisation) and fails the run with the check's message when the flag is set.
#[test]
fn the_gpu_launcher_reads_data_checks_back() {
    use mlopt_ir::{DType, Graph, Op, Tensor, TensorType};
    let mut g = Graph::new("gather");
    let t = g.add_const(
        "t",
        Tensor::from_vec(&[4, 3], (0..12).map(|x| x as f32).collect::<Vec<f32>>()).unwrap(),
    );
    let i = g.add_input("ids", TensorType::new(DType::I64, vec![4]));
    let y = g.add(Op::Gather { axis: 0 }, "gather0", &[t, i]).unwrap();
    g.add_output("y", y);
    let config = mlopt_rewrite::Config::new(Target::named("sm_80", 1).unwrap());
    let opts = mlopt_driver::Options::new(config);
    let c = mlopt_driver::compile_gpu(&g, &opts).unwrap();
    assert!(
        c.program.steps.iter().any(|s| s.check.is_some()),
        "no check step"
    );
    let dir = tempfile::tempdir().unwrap();
    c.write_library(dir.path(), "gather", &[]).unwrap();
    let exe = link_c(dir.path(), CHECKED_C, "gather");
    let mock = mock_driver(dir.path());
    let log = dir.path().join("calls.log");
    let run = |fail: bool| {
        let mut cmd = Command::new(&exe);
        cmd.env("LD_LIBRARY_PATH", &mock).env("MOCK_LOG", &log);
        if fail {
            cmd.env("MOCK_FAIL_CHECKS", "1");
        }
        let out = cmd.output().unwrap();
        (
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            std::fs::read_to_string(&log).unwrap(),
        )
    };
    let (printed, calls) = run(false);
    assert_eq!(printed, "0", "{calls}");
    // After the check's launch: its flag comes back (4 bytes) and the stream is waited for.
    let lines: Vec<&str> = calls.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("launch") && l.contains("_check"))
        .unwrap_or_else(|| panic!("{calls}"));
    assert_eq!(&lines[at + 1..at + 3], &["dtoh 4", "sync"], "{calls}");
    let (printed, _) = run(true);
    assert!(
        printed.starts_with("-1 ")
            && printed.contains("'gather0'")
            && printed.contains("out of range"),
        "{printed}"
    );
}

const BRANCH_C: &str = r#"
#include <stdio.h>
#include "branch.h"
int main(int argc, char **argv) {
    void *m = mlopt_branch_create(0);
    if (!m) { printf("create failed: %s\n", mlopt_branch_last_error()); return 3; }
    static _Alignas(16) float x[6], y[6];
    static _Alignas(16) unsigned char flag[16];
    flag[0] = argc > 1 && argv[1][0] == '1';
    const void *in[] = {x, flag};
    void *out[] = {y};
    int r = mlopt_branch_run(m, in, out);
    printf("%d\n", r);
    mlopt_branch_destroy(m);
    return 0;
}
"#;

/// An `If` on an input, on the GPU: before each guarded launch the launcher reads the condition's
/// byte back (a 1-byte copy and a synchronisation) and launches only the branch taken.
#[test]
fn the_gpu_launcher_launches_only_the_branch_taken() {
    let mut g = import("control/4");
    g.name = "branch".into();
    let config = Config::new(Target::named("sm_80", 1).unwrap());
    let c = mlopt_driver::compile_gpu(&g, &mlopt_driver::Options::new(config)).unwrap();
    let guarded = |when: bool| {
        c.program.steps.iter().any(|s| {
            s.guard
                == [mlopt_kir::Guard {
                    place: mlopt_kir::Place::Input(1),
                    when,
                }]
        })
    };
    assert!(guarded(true) && guarded(false), "{:?}", c.program.steps);
    let dir = tempfile::tempdir().unwrap();
    c.write_library(dir.path(), "branch", &[]).unwrap();
    let exe = link_c(dir.path(), BRANCH_C, "branch");
    let mock = mock_driver(dir.path());
    let log = dir.path().join("calls.log");
    for flag in [true, false] {
        let out = Command::new(&exe)
            .arg(if flag { "1" } else { "0" })
            .env("LD_LIBRARY_PATH", &mock)
            .env("MOCK_LOG", &log)
            .output()
            .unwrap();
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "{calls}");
        let want: Vec<String> = c
            .program
            .steps
            .iter()
            .filter(|s| s.guard.iter().all(|g| g.when == flag))
            .map(|s| {
                let k = &c.program.kernels[s.kernel];
                let l = mlopt_kir::gpu::launch(k).unwrap();
                format!("launch {} {}x{}", k.name, l.grid, l.block)
            })
            .collect();
        let got: Vec<&str> = calls.lines().filter(|l| l.starts_with("launch")).collect();
        assert_eq!(got, want, "flag {flag}:\n{calls}");
        let reads = calls.lines().filter(|l| *l == "dtoh 1").count();
        let guarded = c
            .program
            .steps
            .iter()
            .filter(|s| !s.guard.is_empty())
            .count();
        assert_eq!(reads, guarded, "{calls}");
    }
}
