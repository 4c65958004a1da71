//! `mlopt check --per-node`: with every kernel output probed, an unbroken build matches the interpreter
//! at every ONNX node, and a deliberately broken kernel (its stores scaled after scheduling) is named
//! as the first node out of tolerance, with its kernel and both values.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_driver::compare::Rule;
use mlopt_driver::{compile, probe, Options};
use mlopt_kir::{BinOp, Elem, Expr, Stmt};
use mlopt_target::{runnable_level, Target};
use mlopt_tests::{data, import};

/// Every f32 store of `body` (the kernel's accumulators and outputs alike) stores 1.5x its value.
fn scale_stores(body: &mut [Stmt], f32_bufs: &[bool]) {
    for s in body {
        match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => scale_stores(body, f32_bufs),
            Stmt::Store { buf, value, .. } if f32_bufs[buf.0 as usize] => {
                *value = Expr::Binary(
                    BinOp::Mul,
                    Box::new(value.clone()),
                    Box::new(Expr::Float(1.5, Elem::F32)),
                );
            }
            _ => {}
        }
    }
}

#[test]
fn per_node_names_the_first_broken_kernel() {
    let g = import("cnn");
    let t = Target::named(runnable_level(), 1).unwrap();
    let options = Options {
        config: mlopt_rewrite::Config::new(t.clone()),
        tune: false,
        winograd: mlopt_schedule::Winograd::Never,
        profile: false,
        dumps: false,
        probe: true,
    };
    let mut c = compile(&g, &options).unwrap();
    let (inputs, _) = data("cnn");
    let own = g.graph_outputs().len();
    let rule = Rule::AllClose {
        rtol: 1e-4,
        atol: 1e-5,
    };
    let outs = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    assert_eq!(outs.len(), c.optimized.plan.graph.graph_outputs().len());
    let fused = &c.optimized.plan.graph;
    let r = probe::per_node(&g, fused, own, &outs, &inputs, rule).unwrap();
    assert!(r.compared >= 3, "{r:?}");
    assert!(r.first_bad.is_none(), "{r:?}");
    // Break the kernel that computes the second convolution, and only it.
    let node = fused
        .node_ids()
        .find(|&n| fused.node(n).name == "conv2.bn")
        .unwrap();
    let id = fused.node(node).kernel.unwrap();
    let k = c
        .program
        .kernels
        .iter_mut()
        .find(|k| k.name == format!("k{id}"))
        .unwrap();
    let f32_bufs: Vec<bool> = k.bufs.iter().map(|b| b.elem == Elem::F32).collect();
    scale_stores(&mut k.body, &f32_bufs);
    let cpu = t.cpu().unwrap();
    c.code = mlopt_llvm::compile(&c.program, cpu).unwrap();
    let outs = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let r = probe::per_node(&g, &c.optimized.plan.graph, own, &outs, &inputs, rule).unwrap();
    let bad = r.first_bad.expect("the broken kernel is found");
    assert_eq!(
        (bad.node.as_str(), bad.op, bad.kernel),
        ("conv2.bn", "batch_norm", id)
    );
    assert!(
        !bad.comparison.pass && bad.comparison.detail.contains("got"),
        "{}",
        bad.comparison
    );
}
