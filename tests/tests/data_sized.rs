//! Ops whose output size depends on the data (NonZero, Compress, NonMaxSuppression, Unique): computed
//! at a bound with a count, the same bits from the interpreter, compiled x86 code (2 threads) and the
//! GPU kernels in the kernel IR's emulator, on inputs where the order is not total (NaN, -0), where
//! values differ only past f64's precision, and where everything or nothing is kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::{interp, DType, Graph, Op, Tensor, TensorType};
use mlopt_rewrite::Config;
use mlopt_target::{runnable_level, Target};
use std::collections::HashMap;

/// Runs `g` (outputs already named) three ways on `inputs`; all must agree bit for bit, counts
/// included. Returns the interpreter's outputs cut to their counts.
fn agree(g: &Graph, inputs: &[(&str, Tensor)]) -> Vec<(String, Tensor)> {
    let inputs: HashMap<String, Tensor> = inputs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let want = interp::run(g, &inputs).unwrap();
    let cpu = mlopt_driver::Options::new(Config::new(Target::named(runnable_level(), 2).unwrap()));
    let c = mlopt_driver::compile(g, &cpu).unwrap();
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let gpu = mlopt_driver::Options::new(Config::new(Target::named("sm_80", 1).unwrap()));
    let c = mlopt_driver::compile_gpu(g, &gpu).unwrap();
    let emulated = mlopt_lower::interpret(&c.program, &inputs).unwrap();
    for (how, outs) in [("compiled", &got), ("emulated", &emulated)] {
        assert_eq!(outs.len(), want.len());
        for ((name, w), (_, o)) in want.iter().zip(outs.iter()) {
            assert!(o.same_bits(w), "{how} {name}: {o:?}, interpreted {w:?}");
        }
    }
    mlopt_ir::extent::exact_outputs(g, &want).unwrap()
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

/// One data-sized op on inputs of the given types, its outputs (but the count) named y0, y1, ...
fn graph(op: Op, inputs: &[(&str, TensorType)]) -> Graph {
    let mut g = Graph::new("t");
    let ins: Vec<_> = inputs
        .iter()
        .map(|(n, t)| Some(g.add_input(*n, t.clone())))
        .collect();
    let outs = g.add_node(op, "op", &ins, None).unwrap();
    for (k, v) in outs[..outs.len() - 1].iter().enumerate() {
        g.add_output(format!("y{k}"), *v);
    }
    mlopt_ir::extent::expose_counts(&mut g).unwrap();
    g
}

#[test]
fn unique_agrees_on_nan_and_signed_zeros() {
    let x = f32s(
        &[9],
        &[2.0, f32::NAN, -0.0, 0.0, 2.0, f32::NAN, -1.5, 0.0, -1.5],
    );
    for sorted in [true, false] {
        let g = graph(
            Op::Unique { axis: 0, sorted },
            &[("x", TensorType::new(DType::F32, vec![9]))],
        );
        let out = agree(&g, &[("x", x.clone())]);
        // 2, -0 (= 0), -1.5 and each NaN (equal to nothing) are distinct: five.
        assert_eq!(out[0].1.numel(), 5, "sorted {sorted}: {:?}", out[0].1);
        assert_eq!(
            out[2].1.to_i64_vec().len(),
            9,
            "the inverse keeps the input's size"
        );
    }
}

#[test]
fn unique_slices_tell_apart_integers_past_f64_precision() {
    let big = 1i64 << 60;
    let x = Tensor::from_vec(&[2, 4], vec![big, big + 1, big, 7, 1, 1, 1, 7]).unwrap();
    let g = graph(
        Op::Unique {
            axis: 1,
            sorted: true,
        },
        &[("x", TensorType::new(DType::I64, vec![2, 4]))],
    );
    let out = agree(&g, &[("x", x)]);
    // Columns (big, 1), (big + 1, 1), (big, 1), (7, 7): three distinct, in order.
    assert_eq!(out[0].1.to_i64_vec(), [7, big, big + 1, 7, 1, 1]);
    assert_eq!(out[1].1.to_i64_vec(), [3, 0, 1]);
    assert_eq!(out[2].1.to_i64_vec(), [1, 2, 1, 0]);
    assert_eq!(out[3].1.to_i64_vec(), [1, 2, 1]);
}

#[test]
fn non_zero_and_compress_keep_all_or_nothing() {
    let t = TensorType::new(DType::F32, vec![2, 3]);
    let g = graph(Op::NonZero, &[("x", t)]);
    for x in [[0.0f32; 6], [f32::NAN, -0.0, 1.0, 0.0, -2.0, 3.0], [1.0; 6]] {
        let out = agree(&g, &[("x", f32s(&[2, 3], &x))]);
        let n = x.iter().filter(|v| **v != 0.0).count();
        assert_eq!(out[0].1.shape(), [2, n]);
    }
    let t = TensorType::new(DType::U8, vec![2, 3, 4]);
    let c = TensorType::new(DType::Bool, vec![3]);
    let g = graph(Op::Compress { axis: 2 }, &[("x", t), ("c", c)]);
    let x = Tensor::from_vec(&[2, 3, 4], (0..24u8).collect()).unwrap();
    for keep in [[false; 3], [true, false, true], [true; 3]] {
        let c = Tensor::from_vec(&[3], keep.to_vec()).unwrap();
        let out = agree(&g, &[("x", x.clone()), ("c", c)]);
        let n = keep.iter().filter(|k| **k).count();
        assert_eq!(out[0].1.shape(), [2, 3, n]);
    }
}

#[test]
fn non_max_suppression_agrees_with_run_time_limits() {
    // Two batches, three classes, seven boxes; corners in either order, one box of no area.
    let mut s = 0x2545_f491_u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 1000) as f32 / 250.0
    };
    let boxes: Vec<f32> = (0..2 * 7 * 4)
        .map(|i| if i == 8 { 1.0 } else { rnd() })
        .collect();
    let scores: Vec<f32> = (0..2 * 3 * 7).map(|_| rnd() / 4.0).collect();
    let ty = |d: DType, s: Vec<usize>| TensorType::new(d, s);
    for center_point_box in [false, true] {
        let g = graph(
            Op::NonMaxSuppression {
                center_point_box,
                bound: 2 * 3 * 7,
            },
            &[
                ("boxes", ty(DType::F32, vec![2, 7, 4])),
                ("scores", ty(DType::F32, vec![2, 3, 7])),
                ("most", ty(DType::I64, vec![1])),
                ("iou", ty(DType::F32, vec![1])),
                ("floor", ty(DType::F32, vec![1])),
            ],
        );
        for (most, iou, floor) in [
            (3i64, 0.3f32, 0.2f32),
            (7, 0.0, 0.0),
            (0, 0.5, 0.0),
            (-1, 0.5, 0.0),
        ] {
            let out = agree(
                &g,
                &[
                    ("boxes", f32s(&[2, 7, 4], &boxes)),
                    ("scores", f32s(&[2, 3, 7], &scores)),
                    ("most", Tensor::from_vec(&[1], vec![most]).unwrap()),
                    ("iou", f32s(&[1], &[iou])),
                    ("floor", f32s(&[1], &[floor])),
                ],
            );
            let rows = out[0].1.shape()[0] as i64;
            assert!(
                rows <= 6 * most.max(0),
                "{rows} rows for at most {most} per class"
            );
        }
    }
}
