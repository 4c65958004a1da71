//! Lowering to the kernel IR on the fixture models: every optimised fixture becomes a program whose kernels
//! verify, and the kernel IR interpreter running it matches the graph interpreter on the fixture's inputs.
//! The kernel dumps are snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_cost::Target;
use mlopt_ir::interp;
use mlopt_lower::{interpret, lower_program, CpuSchedule, Options};
use mlopt_rewrite::{optimize, Config, Precision};
use mlopt_tests::{data, import, FIXTURES};

fn lowered(name: &str, target: &str, precision: Precision, opts: &Options) -> (f64, mlopt_kir::Program) {
    let g = import(name);
    let mut cfg = Config::new(Target::named(target, 1).unwrap());
    cfg.precision = precision;
    let o = optimize(&g, &cfg).unwrap();
    let p = lower_program(&o.plan.graph, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (inputs, _) = data(name);
    let want = interp::run(&o.plan.graph, &inputs).unwrap();
    let got = interpret(&p, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut worst = 0f64;
    for ((wn, w), (gn, g)) in want.iter().zip(&got) {
        assert_eq!(wn, gn);
        worst = worst.max(mlopt_rewrite::optimize::scaled_error(w, g));
    }
    (worst, p)
}

#[test]
fn lowered_fixtures_match_the_graph_interpreter() {
    for name in FIXTURES {
        for (target, p) in [("x86-64-v4", Precision::Fp32), ("sm_80", Precision::Fp32), ("x86-64-v4", Precision::Bf16)] {
            let (err, _) = lowered(name, target, p, &Options::default());
            assert!(err < 1e-5, "{name} on {target} {p:?}: error {err:e}");
        }
        // Schedules change only how loops run: the interpreter still gets the same numbers.
        for lanes in [8, 16] {
            let (err, _) = lowered(name, "x86-64-v4", Precision::Fp32, &Options { cpu: Some(CpuSchedule { lanes, threads: 2 }) });
            assert!(err < 1e-5, "{name} scheduled for {lanes} lanes: error {err:e}");
        }
    }
}

#[test]
fn kernel_dumps() {
    for name in FIXTURES {
        let (_, p) = lowered(name, "x86-64-v4", Precision::Fp32, &Options { cpu: Some(CpuSchedule { lanes: 16, threads: 2 }) });
        insta::assert_snapshot!(format!("kir_{name}"), mlopt_kir::print::program(&p));
    }
}
