//! Compiled code on the fixture models: each optimised fixture is lowered, compiled by LLVM for this
//! machine, loaded into the process and run on the fixture's inputs; its outputs must match the graph
//! interpreter's. The unoptimised LLVM IR of each fixture is snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_cost::Target;
use mlopt_driver::{compile, Options};
use mlopt_ir::interp;
use mlopt_rewrite::{Config, Precision};
use mlopt_tests::{data, import, FIXTURES};

/// Compiles a fixture for this machine, runs it in-process; returns the error against the interpreter
/// (on the optimised graph) and the compiled model.
fn run_compiled(name: &str, precision: Precision, threads: u32) -> (f64, mlopt_driver::Compiled) {
    let g = import(name);
    let mut config = Config::new(Target::named("x86-64-v4", threads).unwrap());
    config.precision = precision;
    let c = compile(&g, &Options { config, target: "host".into(), threads, tune: false }).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (inputs, _) = data(name);
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let want = interp::run(&c.optimized.plan.graph, &inputs).unwrap();
    let mut worst = 0f64;
    for ((gn, g), (wn, w)) in got.iter().zip(&want) {
        assert_eq!(gn, wn);
        worst = worst.max(mlopt_rewrite::optimize::scaled_error(w, g));
    }
    (worst, c)
}

#[test]
fn compiled_fixtures_match_the_interpreter() {
    for name in FIXTURES {
        for threads in [1, 2] {
            let (err, _) = run_compiled(name, Precision::Fp32, threads);
            assert!(err < 1e-5, "{name} with {threads} threads: error {err:e}");
        }
    }
}

#[test]
fn compiled_low_precision_fixtures_match_the_interpreter() {
    for name in FIXTURES {
        let (err, _) = run_compiled(name, Precision::Bf16, 1);
        // Both sides round to bf16 at the same places; accumulation order differs.
        assert!(err < 1e-2, "{name} in bf16: error {err:e}");
    }
}

/// The LLVM IR of each fixture before optimisation (weights elided), so a codegen change shows in review.
#[test]
fn llvm_ir_snapshots() {
    for name in FIXTURES {
        let g = import(name);
        let config = Config::new(Target::named("x86-64-v4", 1).unwrap());
        let c = compile(&g, &Options { config, target: "x86-64-v4".into(), threads: 1, tune: false }).unwrap();
        insta::assert_snapshot!(format!("llvm_{name}"), c.code.llvm_ir);
    }
}
