//! Fuzzes the ONNX importer: any bytes must decode and import to a graph or a clear error, never a panic.
//! Imported graphs are also evaluated on zero inputs, which exercises shape inference against the
//! interpreter. Seeds: the fixture models (`fuzz/seed.sh`).
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
    // Evaluate only graphs whose every value is small: the interpreter is not meant for huge tensors.
    let big = g.node_ids().any(|n| {
        g.node(n)
            .outputs
            .iter()
            .any(|t| t.checked_bytes().is_none_or(|b| b > 1 << 22))
    });
    if big {
        return;
    }
    let inputs = g
        .graph_inputs()
        .iter()
        .map(|&n| {
            (
                g.node(n).name.clone(),
                mlopt_ir::Tensor::zeros(&g.node(n).outputs[0]),
            )
        })
        .collect();
    let _ = mlopt_ir::interp::run(&g, &inputs);
});
