//! Compiled code on the fixture models: each optimised fixture is lowered, compiled by LLVM for this
//! machine, loaded into the process and run on the fixture's inputs; its outputs must match the graph
//! interpreter's. The unoptimised LLVM IR of each fixture is snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_cost::Target;
use mlopt_driver::{compile, Options};
use mlopt_ir::interp;
use mlopt_rewrite::{Config, Precision};
use mlopt_tests::{data, import, worst_error, FIXTURES};

/// Compiles a fixture for this machine, runs it in-process; returns the error against the interpreter
/// (on the optimised graph) and the compiled model.
fn run_compiled(name: &str, precision: Precision, threads: u32) -> (f64, mlopt_driver::Compiled) {
    let g = import(name);
    let mut config = Config::new(Target::named("x86-64-v4", threads).unwrap());
    config.precision = precision;
    let c = compile(&g, &Options { config, target: "host".into(), threads, tune: false, winograd: false }).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (inputs, _) = data(name);
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let want = interp::run(&c.optimized.plan.graph, &inputs).unwrap();
    (worst_error(&want, &got), c)
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
        let c = compile(&g, &Options { config, target: "x86-64-v4".into(), threads: 1, tune: false, winograd: false }).unwrap();
        insta::assert_snapshot!(format!("llvm_{name}"), c.code.llvm_ir);
    }
}

/// A convolution big enough that its padded input and Winograd's transforms are heap temporaries, compiled
/// with and without Winograd, against the graph interpreter.
#[test]
fn large_convolutions_compile_with_heap_temporaries() {
    use mlopt_ir::{ConvAttrs, DType, Op, Tensor, TensorType, Unary};
    let mut g = mlopt_ir::Graph::new("bigconv");
    let (c, hw) = (48usize, 48usize);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, c, hw, hw]));
    let w: Vec<f32> = (0..c * c * 9).map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1).collect();
    let w = g.add_const("w", Tensor::from_vec(&[c, c, 3, 3], w).unwrap());
    let a = ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1, output_padding: vec![] };
    let y = g.add(Op::Conv(a), "conv", &[x, w]).unwrap();
    let y = g.add(Op::Unary(Unary::Relu), "relu", &[y]).unwrap();
    g.add_output("y", y);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 3);
    let want = interp::run(&g, &inputs).unwrap();
    for winograd in [false, true] {
        let config = Config::new(Target::named("x86-64-v4", 2).unwrap());
        let c = compile(&g, &Options { config, target: "host".into(), threads: 2, tune: false, winograd }).unwrap();
        assert_eq!(c.program.kernels.iter().any(|k| k.schedule.iter().any(|s| s.starts_with("winograd"))), winograd);
        let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
        assert!(err < 1e-5, "winograd = {winograd}: error {err:e}");
    }
}
