//! Fuzzes the optimiser differentially: every graph that imports is optimised (the first input byte picks
//! target and precision), which must succeed or fail with an error, never panic; in fp32 the optimised graph
//! must compute what the imported one computes on the same inputs. Seeds: as for `import` (`fuzz/seed.sh`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlopt_onnx::{import::decode_model, import_model, ImportOptions};
use mlopt_rewrite::{optimize, Config, Precision};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let Ok(model) = decode_model(bytes, "fuzz input") else {
        return;
    };
    let Ok(g) = import_model(&model, None, "fuzz", &ImportOptions::default()) else {
        return;
    };
    let big = g.node_ids().any(|n| {
        g.node(n)
            .outputs
            .iter()
            .any(|t| t.checked_bytes().is_none_or(|b| b > 1 << 20))
    });
    if big || g.num_nodes() > 200 {
        return;
    }
    let targets = ["x86-64-v4", "sm_80", "x86-64-v3", "sm_90"];
    let Ok(target) = mlopt_target::Target::named(targets[(pick & 3) as usize], 1) else {
        return;
    };
    let mut cfg = Config::new(target);
    cfg.precision = [
        Precision::Fp32,
        Precision::Fp32,
        Precision::Bf16,
        Precision::Auto,
    ][((pick >> 2) & 3) as usize];
    cfg.memory_budget = (pick & 16 != 0).then_some(0);
    let Ok(o) = optimize(&g, &cfg) else { return };
    if cfg.precision != Precision::Fp32 {
        return;
    }
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 1);
    let (Ok(want), Ok(got)) = (
        mlopt_ir::interp::run(&g, &inputs),
        mlopt_ir::interp::run(&o.plan.graph, &inputs),
    ) else {
        return;
    };
    for ((name, w), (_, o)) in want.iter().zip(&got) {
        assert_eq!(w.ty(), o.ty(), "{name}");
        let e = mlopt_rewrite::optimize::scaled_error(w, o);
        assert!(
            e <= 1e-4,
            "output {name}: optimised {o} vs {w} (error {e:e})"
        );
    }
});
