//! The optimiser on the fixture models: the optimised graph must compute what the original computes
//! (checked by the interpreter on the fixtures' inputs), for CPU and GPU targets and every precision; and
//! the before/after diff of each fixture is snapshot-tested, so a change in rules, extraction or fusion
//! shows in review.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::{interp, print};
use mlopt_rewrite::{optimize, report, Config, Precision};
use mlopt_target::Target;
use mlopt_tests::{data, import, worst_error, FIXTURES};

fn config(target: &str, precision: Precision) -> Config {
    let mut c = Config::new(Target::named(target, 1).unwrap());
    c.precision = precision;
    c
}

/// The largest error of the optimised graph against the original, relative to each output's largest
/// magnitude (at least 1).
fn error(name: &str, cfg: &Config) -> (f64, mlopt_rewrite::Optimized) {
    let g = import(name);
    let o = optimize(&g, cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (inputs, _) = data(name);
    let want = interp::run(&g, &inputs).unwrap();
    let got = interp::run(&o.plan.graph, &inputs).unwrap();
    (worst_error(&want, &got), o)
}

#[test]
fn optimised_fixtures_match_the_interpreter_in_fp32() {
    for target in ["x86-64-v3", "x86-64-v4", "sm_80", "sm_90"] {
        for name in FIXTURES {
            let (err, o) = error(name, &config(target, Precision::Fp32));
            assert!(err < 1e-5, "{name} on {target}: error {err:e}");
            assert!(
                o.plan.total <= o.before,
                "{name} on {target}: the plan costs more than the input graph"
            );
        }
    }
}

#[test]
fn optimised_fixtures_match_the_interpreter_in_low_precision() {
    for (target, p) in [
        ("x86-64-v4", Precision::Bf16),
        ("sm_80", Precision::Fp16),
        ("sm_80", Precision::Bf16),
    ] {
        for name in FIXTURES {
            let (err, o) = error(name, &config(target, p));
            // bf16 keeps 8 bits of mantissa: a few 2^-8 of the output's scale after a few layers.
            assert!(err < 5e-2, "{name} on {target} {p:?}: error {err:e}");
            let low = o.plan.graph.node_ids().any(|n| {
                matches!(
                    o.plan.graph.node(n).outputs[0].dtype,
                    mlopt_ir::DType::BF16 | mlopt_ir::DType::F16
                )
            });
            assert!(low, "{name} on {target} {p:?}: nothing was lowered");
        }
    }
}

#[test]
fn auto_precision_stays_within_the_tolerance() {
    for name in FIXTURES {
        for tol in [1e-2, 1e-4, 1e-7] {
            let mut cfg = config("sm_80", Precision::Auto);
            cfg.tolerance = tol;
            let (err, o) = error(name, &cfg);
            assert!(
                err <= tol,
                "{name} at tolerance {tol:e}: error {err:e} (backed off {:?})",
                o.stats.backed_off
            );
        }
    }
}

#[test]
fn a_memory_budget_never_raises_peak_memory_or_changes_results() {
    for name in FIXTURES {
        let free = error(name, &config("x86-64-v4", Precision::Fp32)).1;
        let mut cfg = config("x86-64-v4", Precision::Fp32);
        cfg.memory_budget = Some(0);
        let (err, tight) = error(name, &cfg);
        assert!(err < 1e-5, "{name}: error {err:e}");
        assert!(
            tight.plan.peak_bytes <= free.plan.peak_bytes,
            "{name}: {} > {}",
            tight.plan.peak_bytes,
            free.plan.peak_bytes
        );
    }
}

/// The memory plan of every optimised fixture: valid (no two live values share bytes), at least the largest
/// value and never more than the values laid end to end.
#[test]
fn memory_plans_of_the_optimised_fixtures_are_valid() {
    for name in FIXTURES {
        for (target, p, budget) in [
            ("x86-64-v4", Precision::Fp32, None),
            ("sm_80", Precision::Bf16, None),
            ("x86-64-v4", Precision::Fp32, Some(0)),
        ] {
            let mut cfg = config(target, p);
            cfg.memory_budget = budget;
            let o = optimize(&import(name), &cfg).unwrap();
            let plan = mlopt_lower::plan_memory(&o.plan.graph).unwrap();
            plan.verify()
                .unwrap_or_else(|e| panic!("{name} on {target}: {e}"));
            // Never worse than laying the values end to end, and at least the largest of them.
            let end_to_end: u64 = plan.slots.iter().map(|s| s.bytes.div_ceil(64) * 64).sum();
            let largest = plan.slots.iter().map(|s| s.bytes).max().unwrap_or(0);
            assert!(
                largest <= plan.arena_bytes && plan.arena_bytes <= end_to_end,
                "{name} on {target}: arena {} (largest {largest}, end to end {end_to_end})",
                plan.arena_bytes
            );
        }
    }
}

#[test]
fn optimised_dumps_round_trip_through_the_parser() {
    for name in FIXTURES {
        let o = error(name, &config("sm_80", Precision::Bf16)).1;
        let text = print::print_with(&o.plan.graph, &|k| report::kernel_note(&o, k));
        let g = &o.plan.graph;
        let back = mlopt_ir::parse::parse(&text, &|n| g.const_by_name(n)).expect("parse");
        assert_eq!(print::print(&back), print::print(g), "{name}");
    }
}

/// Optimising the same graph again gives the same graph, names included: where classes merged (the
/// nested Ifs' `not` and the reshape of its value to a scalar), the name of the one loaded first,
/// where a HashMap's order picked one per run before.
#[test]
fn optimising_is_deterministic() {
    let g = import("control/6");
    let cfg = config("x86-64-v4", Precision::Fp32);
    let first = print::print(&optimize(&g, &cfg).unwrap().plan.graph);
    assert!(first.contains("@\"nb\""), "{first}");
    for _ in 0..8 {
        assert_eq!(print::print(&optimize(&g, &cfg).unwrap().plan.graph), first);
    }
}

/// The before/after diff per fixture and target, with the estimate, as insta snapshots.
#[test]
fn optimised_diffs() {
    for name in FIXTURES {
        for target in ["x86-64-v4", "sm_80"] {
            let g = import(name);
            let cfg = config(target, Precision::Fp32);
            let o = optimize(&g, &cfg).unwrap();
            let after = print::print_with(&o.plan.graph, &|k| report::kernel_note(&o, k));
            let diff = similar::TextDiff::from_lines(&print::print(&g), &after)
                .unified_diff()
                .context_radius(2)
                .to_string();
            let summary = format!(
                "; estimate on {target}: {} before, {} after; rules applied: {:?}\n",
                o.before, o.plan.total, o.stats.applied
            );
            insta::assert_snapshot!(format!("optimized_{name}_{target}"), summary + &diff);
        }
    }
}
