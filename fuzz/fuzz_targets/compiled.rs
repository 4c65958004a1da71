//! Fuzzes compiled code differentially: every small graph that imports is compiled for this machine and
//! run on random inputs, and must give the reference interpreter's outputs (floats within 1e-3 of the
//! largest magnitude, other types exactly), or fail where the interpreter fails (a data error). Compiling
//! may refuse a graph (an op the code generator lacks) but never panic; the run may not crash. Float
//! outputs the interpreter computes as non-finite or beyond 1e10 (mutated weights overflow) are compared
//! by type only: near the overflow threshold an FMA or another summation order turns 3e38 into inf.
//! Seeds: as for `import` (`fuzz/seed.sh`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlopt_onnx::{import::decode_model, import_model, ImportOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(model) = decode_model(data, "fuzz input") else {
        return;
    };
    let Ok(g) = import_model(&model, None, "fuzz", &ImportOptions::default()) else {
        return;
    };
    let big = g.node_ids().any(|n| {
        g.node(n)
            .outputs
            .iter()
            .any(|t| t.checked_bytes().is_none_or(|b| b > 1 << 18))
    });
    if big || g.num_nodes() > 100 || g.graph_inputs().is_empty() {
        return;
    }
    let Ok(target) = mlopt_target::Target::named("host", 1) else {
        return;
    };
    let config = mlopt_rewrite::Config::new(target);
    let opts = mlopt_driver::Options::new(config);
    let Ok(c) = mlopt_driver::compile(&g, &opts) else {
        return;
    };
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, data.len() as u64);
    let want = mlopt_ir::interp::run(&g, &inputs);
    let mut lib = c.load().expect("linking and loading compiled code");
    let got = c.run(&mut lib, &inputs);
    match (want, got) {
        (Ok(want), Ok(got)) => {
            assert_eq!(want.len(), got.len());
            for ((name, w), (_, o)) in want.iter().zip(&got) {
                assert_eq!(w.ty(), o.ty(), "output {name}");
                let wild = w.dtype().is_float()
                    && w.to_f64_vec()
                        .iter()
                        .any(|x| !x.is_finite() || x.abs() > 1e10);
                if wild {
                    continue;
                }
                let e = mlopt_rewrite::optimize::scaled_error(w, o);
                let tol = if w.dtype().is_float() { 1e-3 } else { 0.0 };
                assert!(
                    e <= tol,
                    "output {name}: compiled {o} vs interpreted {w} (error {e:e})"
                );
            }
        }
        (Err(w), Ok(_)) => panic!("the interpreter fails ({w}) where compiled code runs"),
        (Ok(_), Err(e)) => panic!("compiled code fails ({e}) where the interpreter runs"),
        (Err(_), Err(_)) => {}
    }
});
