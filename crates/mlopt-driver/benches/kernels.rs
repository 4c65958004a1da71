//! Compiled kernels on this machine against its measured roofline: GEMM (1024^3 and BERT-base shapes),
//! convolutions (ResNet-50 3x3 and 1x1 layers), softmax, layer norm and an elementwise chain, each
//! compiled by the whole pipeline for `host` on one thread and run in-process.
//!
//! Run with `cargo bench -p mlopt-driver`. Criterion reports FLOP/s (as elements/s) for compute-bound
//! kernels and bytes/s for memory-bound ones; before timing, each kernel prints its median GFLOP/s or
//! GB/s next to the calibrated single-core peak (`mlopt calibrate`, or measured now if not cached).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mlopt_ir::{ConvAttrs, DType, Graph, Op, Tensor, TensorType, Unary};
use mlopt_target::Target;

fn f32s(shape: &[usize], seed: u32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        shape,
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 1000.0
                    - 0.5
            })
            .collect(),
    )
    .unwrap()
}

fn input(g: &mut Graph, shape: &[usize]) -> mlopt_ir::Value {
    g.add_input("x", TensorType::new(DType::F32, shape.to_vec()))
}

fn gemm(m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("gemm");
    let x = input(&mut g, &[1, m, k]);
    let w = g.add_const("w", f32s(&[k, n], 1));
    let y = g.add(Op::MatMul, "mm", &[x, w]).unwrap();
    g.add_output("y", y);
    g
}

fn conv(c: usize, hw: usize, m: usize, k: usize) -> Graph {
    let mut g = Graph::new("conv");
    let x = input(&mut g, &[1, c, hw, hw]);
    let w = g.add_const("w", f32s(&[m, c, k, k], 2));
    let p = k / 2;
    let a = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![p, p, p, p],
        dilations: vec![1, 1],
        group: 1,
        output_padding: vec![],
    };
    let y = g.add(Op::Conv(a), "conv", &[x, w]).unwrap();
    let y = g.add(Op::Unary(Unary::Relu), "relu", &[y]).unwrap();
    g.add_output("y", y);
    g
}

fn rowwise(op: Op, rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new("rows");
    let x = input(&mut g, &[rows, cols]);
    let y = match op {
        Op::LayerNorm { .. } => {
            let s = g.add_const("s", f32s(&[cols], 3));
            let b = g.add_const("b", f32s(&[cols], 4));
            g.add(op, "ln", &[x, s, b]).unwrap()
        }
        _ => g.add(op, "op", &[x]).unwrap(),
    };
    g.add_output("y", y);
    g
}

fn chain(n: usize) -> Graph {
    let mut g = Graph::new("chain");
    let x = input(&mut g, &[n]);
    let b = g.add_const("b", f32s(&[n], 5));
    let y = g
        .add(Op::Binary(mlopt_ir::Binary::Add), "add", &[x, b])
        .unwrap();
    let y = g.add(Op::Unary(Unary::Sigmoid), "sig", &[y]).unwrap();
    let y = g
        .add(Op::Binary(mlopt_ir::Binary::Mul), "mul", &[y, x])
        .unwrap();
    g.add_output("y", y);
    g
}

/// (name, graph, FLOPs or None, bytes moved)
fn cases() -> Vec<(&'static str, Graph, Option<f64>, f64)> {
    let mm = |m: usize, k: usize, n: usize| Some(2.0 * (m * k * n) as f64);
    vec![
        (
            "gemm 1024x1024x1024",
            gemm(1024, 1024, 1024),
            mm(1024, 1024, 1024),
            0.0,
        ),
        (
            "gemm bert qkv 128x768x768",
            gemm(128, 768, 768),
            mm(128, 768, 768),
            0.0,
        ),
        (
            "gemm bert ffn 128x768x3072",
            gemm(128, 768, 3072),
            mm(128, 768, 3072),
            0.0,
        ),
        (
            "conv resnet 3x3 64x56x56",
            conv(64, 56, 64, 3),
            Some(2.0 * (64 * 64 * 9 * 56 * 56) as f64),
            0.0,
        ),
        (
            "conv resnet 1x1 256->64 x56x56",
            conv(256, 56, 64, 1),
            Some(2.0 * (256 * 64 * 56 * 56) as f64),
            0.0,
        ),
        (
            "softmax 1536x128",
            rowwise(Op::Softmax { axis: 1 }, 1536, 128),
            None,
            2.0 * 4.0 * (1536 * 128) as f64,
        ),
        (
            "layernorm 128x768",
            rowwise(
                Op::LayerNorm {
                    axis: 1,
                    epsilon: 1e-5,
                },
                128,
                768,
            ),
            None,
            2.0 * 4.0 * (128 * 768) as f64,
        ),
        (
            "add-sigmoid-mul 4M",
            chain(1 << 22),
            None,
            3.0 * 4.0 * (1 << 22) as f64,
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let peak = mlopt_target::calibrate::calibration()
        .map(|(c, _)| c)
        .expect("calibrating this CPU");
    eprintln!(
        "calibrated single-core peaks: {:.1} GFLOP/s fp32 FMA, {:.1} GB/s read",
        peak.fp32 / 1e9,
        peak.bw_one / 1e9
    );
    for (name, g, flops, bytes) in cases() {
        let config = mlopt_rewrite::Config::new(Target::named("x86-64-v4", 1).unwrap());
        let compiled = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
        let mut lib = compiled.load().unwrap();
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 7);
        let ins = compiled.input_bytes(&inputs).unwrap();
        let refs: Vec<&[u8]> = ins.iter().map(|b| b.as_slice()).collect();
        let mut outs: Vec<Vec<u8>> = compiled
            .program
            .outputs
            .iter()
            .map(|io| vec![0u8; io.bytes()])
            .collect();
        // A quick median first, to print against the peaks.
        let mut t: Vec<f64> = (0..15)
            .map(|_| {
                let s = std::time::Instant::now();
                lib.run(&refs, &mut outs).unwrap();
                s.elapsed().as_secs_f64()
            })
            .collect();
        t.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        match flops {
            Some(f) => eprintln!(
                "{name}: {:.3} ms, {:.1} GFLOP/s = {:.0}% of the FMA peak",
                med * 1e3,
                f / med / 1e9,
                100.0 * f / med / peak.fp32
            ),
            None => {
                eprintln!(
                    "{name}: {:.3} ms, {:.1} GB/s = {:.0}% of one core's read bandwidth",
                    med * 1e3,
                    bytes / med / 1e9,
                    100.0 * bytes / med / peak.bw_one
                )
            }
        }
        let mut group = c.benchmark_group("kernels");
        group.sample_size(10);
        group.throughput(match flops {
            Some(f) => Throughput::Elements(f as u64),
            None => Throughput::Bytes(bytes as u64),
        });
        group.bench_function(name, |b| b.iter(|| lib.run(&refs, &mut outs).unwrap()));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
