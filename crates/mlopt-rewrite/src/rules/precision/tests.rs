//! The plans `--precision bf16` makes, interpreted against the fp32 graph: where values are rounded,
//! which kernels store them narrow, and that the results stay within bf16's error.

use crate::optimize::{optimize, random_inputs, Config, Precision};
use mlopt_ir::{Binary, DType, Graph, Op, Tensor, TensorType, Unary, Value};
use mlopt_target::Target;

/// A 1x1 convolution of `x`, `channels` (in, out), its weights a fixed pattern shifted by `seed`, and
/// with `bias` a bias.
fn pointwise(
    g: &mut Graph,
    name: &str,
    x: Value,
    (cin, cout): (usize, usize),
    seed: usize,
    bias: bool,
) -> Value {
    let w: Vec<f32> = (0..cout * cin)
        .map(|i| (((i + seed) * 7919) % 200) as f32 / 2000.0 - 0.05)
        .collect();
    let w = g.add_const(
        format!("{name}.w"),
        Tensor::from_vec(&[cout, cin, 1, 1], w).unwrap(),
    );
    let mut args = vec![x, w];
    if bias {
        let b: Vec<f32> = (0..cout).map(|i| (i % 7) as f32 / 10.0 - 0.3).collect();
        args.push(g.add_const(format!("{name}.b"), Tensor::from_vec(&[cout], b).unwrap()));
    }
    let a = mlopt_ir::ConvAttrs {
        strides: vec![1, 1],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        group: 1,
        output_padding: vec![],
    };
    g.add(Op::Conv(a), name, &args).unwrap()
}

/// The largest difference between `g`'s first output and `out`'s (interpreted, on random inputs),
/// over the largest magnitude of `g`'s.
fn relative_error(g: &Graph, out: &Graph) -> f64 {
    let inputs = random_inputs(g, 5);
    let want = mlopt_ir::interp::run(g, &inputs).unwrap();
    let got = mlopt_ir::interp::run(out, &inputs).unwrap();
    let (w, v) = (want[0].1.to_f64_vec(), got[0].1.to_f64_vec());
    let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
    let err = w
        .iter()
        .zip(&v)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    err / scale
}

/// `--precision bf16` rounds a biased convolution's sum once: where its epilogue (a SiLU) is in
/// its kernel, the bf16 product has an f32 result and the kernel narrows after the SiLU; where the
/// sum goes to memory for another kernel (a residual branch added to the other convolution), it
/// is rounded to bf16 before the store, half the bytes. Both plans compute the fp32 graph's values
/// within bf16's error.
#[test]
fn bf16_products_round_once_and_store_narrow() {
    let mut g = Graph::new("res");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 64, 28, 28]));
    let conv = |g: &mut Graph, name: &str, x, seed| pointwise(g, name, x, (64, 64), seed, true);
    let y = conv(&mut g, "c1", x, 1);
    let s = g.add(Op::Unary(Unary::Sigmoid), "sig", &[y]).unwrap();
    let y = g.add(Op::Binary(Binary::Mul), "silu", &[y, s]).unwrap();
    let p = conv(&mut g, "c2", y, 2);
    let q = conv(&mut g, "c3", y, 3);
    let z = g.add(Op::Binary(Binary::Add), "add", &[p, q]).unwrap();
    g.add_output("z", z);
    let mut cfg = Config::new(Target::named("znver4", 1).unwrap());
    cfg.precision = Precision::Bf16;
    let o = optimize(&g, &cfg).unwrap();
    let out = &o.plan.graph;
    let text = mlopt_ir::print::print(out);
    let kernel_of = |name: &str| {
        let n = out.node_ids().find(|&n| out.node(n).name == name).unwrap();
        out.node(n).kernel
    };
    // c1's product is f32 in its kernel, beside the SiLU, and only the SiLU's result is rounded.
    let c1 = out.node_ids().find(|&n| out.node(n).name == "c1").unwrap();
    assert_eq!(out.node(c1).outputs[0].dtype, DType::F32, "{text}");
    assert_eq!(kernel_of("c1"), kernel_of("silu"), "{text}");
    // One of c2, c3 is stored for the other's kernel, which adds them: the stored one is a conv
    // rounded before its store, the other widening.
    let roots: Vec<(Option<u32>, DType)> = ["c2", "c3"]
        .iter()
        .map(|name| {
            let n = out.node_ids().find(|&n| out.node(n).name == *name).unwrap();
            let conv = if matches!(out.node(n).op, Op::Conv(_)) {
                n
            } else {
                out.inputs(n)[0].unwrap().node
            };
            (out.node(conv).kernel, out.node(conv).outputs[0].dtype)
        })
        .collect();
    let mut dtypes: Vec<DType> = roots.iter().map(|r| r.1).collect();
    dtypes.sort_by_key(|d| d.name());
    assert_eq!(dtypes, [DType::BF16, DType::F32], "{text}");
    let wide = roots.iter().find(|r| r.1 == DType::F32).unwrap();
    assert_eq!(wide.0, kernel_of("add"), "{text}");
    let err = relative_error(&g, out);
    assert!(err <= 0.02, "error {err}");
}

/// `--precision bf16` stores a residual stream once, in bf16: each block's sum is read by the next
/// block's convolution (narrowed) and by its add (f32). It used to be stored in f32 and narrowed by
/// a kernel of its own; now no kernel is a lone cast and every value between kernels is bf16, and
/// the plan computes the fp32 graph's values within bf16's error.
#[test]
fn bf16_residual_stream_is_stored_once_narrow() {
    let mut g = Graph::new("res");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 64, 28, 28]));
    let conv = |g: &mut Graph, name: &str, x, seed| pointwise(g, name, x, (64, 64), seed, false);
    let mut r = conv(&mut g, "c0", x, 0);
    r = g.add(Op::Unary(Unary::Relu), "r0", &[r]).unwrap();
    for i in 1..4 {
        let y = conv(&mut g, &format!("c{i}"), r, i);
        let y = g
            .add(Op::Binary(Binary::Add), format!("add{i}"), &[y, r])
            .unwrap();
        r = g
            .add(Op::Unary(Unary::Relu), format!("r{i}"), &[y])
            .unwrap();
    }
    let z = conv(&mut g, "head", r, 9);
    g.add_output("z", z);
    let mut cfg = Config::new(Target::named("znver4", 1).unwrap());
    cfg.precision = Precision::Bf16;
    let o = optimize(&g, &cfg).unwrap();
    let out = &o.plan.graph;
    let text = mlopt_ir::print::print(out);
    let returned: Vec<_> = out.graph_outputs().iter().map(|(_, v)| v.node).collect();
    for k in out.kernels().values() {
        // (The graph input is narrowed by a kernel of its own.)
        let reads_input = k.members.iter().any(|&n| {
            out.inputs(n)
                .iter()
                .flatten()
                .any(|v| matches!(out.node(v.node).op, Op::Input))
        });
        let casts = k
            .members
            .iter()
            .all(|&n| matches!(out.node(n).op, Op::Cast { .. }));
        assert!(reads_input || !casts, "a kernel only casts: {text}");
        for &r in k.roots.iter().filter(|r| !returned.contains(r)) {
            assert_eq!(out.node(r).outputs[0].dtype, DType::BF16, "{text}");
        }
    }
    let err = relative_error(&g, out);
    assert!(err <= 0.03, "error {err}");
}

/// `--precision bf16`: a convolution's result read by two concatenations (DenseNet's growth
/// convolutions, read by every later layer's concatenation) is stored in bf16, each concatenation
/// widening it itself; it was widened once, in the convolution's kernel, and stored in f32.
#[test]
fn bf16_result_read_by_several_kernels_is_stored_narrow() {
    let mut g = Graph::new("dense");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 32, 14, 14]));
    let conv =
        |g: &mut Graph, name: &str, x, cin, seed| pointwise(g, name, x, (cin, 32), seed, false);
    let y = conv(&mut g, "grow", x, 32, 1);
    let cat = |g: &mut Graph, name: &str, xs: &[Value]| {
        let c = g.add(Op::Concat { axis: 1 }, name, xs).unwrap();
        g.add(Op::Unary(Unary::Relu), format!("{name}.relu"), &[c])
            .unwrap()
    };
    let a = cat(&mut g, "cat1", &[x, y]);
    let b = cat(&mut g, "cat2", &[y, x]);
    let p = conv(&mut g, "c2", a, 64, 2);
    let q = conv(&mut g, "c3", b, 64, 3);
    let z = g.add(Op::Binary(Binary::Add), "add", &[p, q]).unwrap();
    g.add_output("z", z);
    let mut cfg = Config::new(Target::named("znver4", 1).unwrap());
    cfg.precision = Precision::Bf16;
    let o = optimize(&g, &cfg).unwrap();
    let out = &o.plan.graph;
    let text = mlopt_ir::print::print(out);
    let grow = out
        .node_ids()
        .find(|&n| {
            matches!(out.node(n).op, Op::Conv(_))
                && out.node(n).outputs[0].shape[1] == 32
                && out.inputs(n)[0].is_some_and(|v| out.value_type(v).shape[1] == 32)
        })
        .unwrap();
    let k = out.node(grow).kernel;
    let roots: Vec<mlopt_ir::NodeId> = out
        .kernels()
        .into_values()
        .filter(|kn| kn.members.contains(&grow))
        .flat_map(|kn| kn.roots)
        .collect();
    assert!(k.is_some() && !roots.is_empty(), "{text}");
    for r in roots {
        assert_eq!(out.node(r).outputs[0].dtype, DType::BF16, "{text}");
    }
    let err = relative_error(&g, out);
    assert!(err <= 0.02, "error {err}");
}
