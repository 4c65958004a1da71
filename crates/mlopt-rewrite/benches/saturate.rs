//! Saturation + extraction + fusion time on model-sized graphs (ResNet-50, BERT-base), on this machine.
//! Run with `cargo bench -p mlopt-rewrite`; the e-graph sizes and estimates print once before timing.

#![allow(clippy::unwrap_used)]

mod models;

use criterion::{criterion_group, criterion_main, Criterion};
use mlopt_rewrite::{optimize, Config};
use mlopt_target::Target;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let graphs = [
        ("resnet50", models::resnet50()),
        ("bert-base", models::bert(12, 768, 12, 128, 3072)),
    ];
    for (name, g) in &graphs {
        let ops = g
            .node_ids()
            .filter(|n| !matches!(g.node(*n).op, mlopt_ir::Op::Input | mlopt_ir::Op::Const(_)))
            .count();
        for target in ["x86-64-v4", "sm_80"] {
            let cfg = Config::new(Target::named(target, 1).unwrap());
            let t = std::time::Instant::now();
            let o = optimize(g, &cfg).unwrap();
            let s = &o.stats;
            eprintln!(
                "{name} on {target}: {} nodes ({ops} ops) -> {} kernels; e-graph {} nodes / {} classes, {} iterations ({}); saturate {:.3} s, extract+fuse {:.3} s, total {:.3} s; estimate {} -> {} ({:.2}x); rules {:?}",
                g.num_nodes(),
                o.plan.kernels.iter().filter(|k| !k.view).count(),
                s.egraph_nodes,
                s.egraph_classes,
                s.iterations,
                s.stop_reason,
                s.saturate_s,
                s.extract_s,
                t.elapsed().as_secs_f64(),
                o.before,
                o.plan.total,
                o.before.as_secs() / o.plan.total.as_secs(),
                s.applied
            );
        }
        let cfg = Config::new(Target::named("x86-64-v4", 1).unwrap());
        c.bench_function(&format!("optimize {name}"), |b| {
            b.iter(|| optimize(g, &cfg).unwrap())
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(20));
    targets = bench
}
criterion_main!(benches);
