//! mlopt's cost model: target descriptions (x86-64 host, x86-64-v3/v4, sm_80/86/89/90) and the roofline
//! estimate of a kernel (a fusion group): FLOPs and bytes from shapes and dtypes, time = max(compute,
//! memory) + launch overhead, in a saturating `Cost` measured in seconds.
//!
//! Architecture invariant: depends on the graph IR only for op and type definitions; knows nothing of egg,
//! the kernel IR or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod error;
pub mod gpu_tile;
pub mod kernel;
pub mod roofline;
pub mod tile;
pub mod winograd;

pub use error::{CostError, Result};
pub use kernel::{class_rate, gather_rate, priced, Mix, ScheduleClass};
pub use mlopt_target::MatrixPrecision;
pub use roofline::{estimate, op_work, op_work_on, standalone, Bound, Cost, Estimate, Work};

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_ir::{DType, Op, TensorType};
    use mlopt_target::Target;

    #[test]
    fn cost_saturates_and_orders() {
        assert_eq!(Cost::secs(f64::NAN), Cost::INFINITY);
        assert_eq!(Cost::secs(1e308) + Cost::secs(1e308), Cost::INFINITY);
        assert!(Cost::secs(1.0) < Cost::INFINITY);
        assert_eq!(Cost::secs(-1.0), Cost::ZERO);
        assert_eq!(
            [Cost::secs(1.0), Cost::secs(2.0)].into_iter().sum::<Cost>(),
            Cost::secs(3.0)
        );
    }

    #[test]
    fn matmul_roofline_on_a100() {
        // 1024^3 fp32 GEMM: 2.1 GFLOP; at 19.5 TFLOP/s that is 110 us, compute-bound.
        let t = Target::named("sm_80", 1).unwrap();
        let a = TensorType::new(DType::F32, vec![1024, 1024]);
        let mut w = op_work(
            &Op::MatMul,
            &[Some(&a), Some(&a)],
            std::slice::from_ref(&a),
            false,
        );
        assert_eq!(w.flops(), 2.0 * 1024f64.powi(3));
        w.bytes = 3.0 * 4.0 * 1024.0 * 1024.0;
        let e = estimate(&w, &t);
        assert_eq!(e.bound, Bound::Compute);
        assert!((e.compute_s - 2.0 * 1024f64.powi(3) / 19.5e12).abs() < 1e-12);
        // In bf16 the same GEMM runs on tensor cores, 16x faster.
        let b = TensorType::new(DType::BF16, vec![1024, 1024]);
        let wb = op_work(
            &Op::MatMul,
            &[Some(&b), Some(&b)],
            std::slice::from_ref(&b),
            false,
        );
        assert!((estimate(&wb, &t).compute_s * 16.0 - e.compute_s).abs() < 1e-9);
    }

    #[test]
    fn elementwise_is_memory_bound() {
        let t = Target::named("x86-64-v4", 1).unwrap();
        let a = TensorType::new(DType::F32, vec![1 << 20]);
        let mut w = op_work(
            &Op::Binary(mlopt_ir::Binary::Add),
            &[Some(&a), Some(&a)],
            std::slice::from_ref(&a),
            false,
        );
        w.bytes = 12.0 * (1 << 20) as f64;
        let e = estimate(&w, &t);
        assert_eq!(e.bound, Bound::Memory);
        assert_eq!(e.time, Cost::secs(e.memory_s + t.roof().launch_s));
    }

    #[test]
    fn conv_and_attention_flops_by_hand() {
        use mlopt_ir::ConvAttrs;
        // 3x3 conv, 16 -> 32 channels, 8x8 output: 2 * (32*8*8) * (16*3*3) FLOPs.
        let x = TensorType::new(DType::F32, vec![1, 16, 8, 8]);
        let w = TensorType::new(DType::F32, vec![32, 16, 3, 3]);
        let y = TensorType::new(DType::F32, vec![1, 32, 8, 8]);
        let c = Op::Conv(ConvAttrs {
            strides: vec![1, 1],
            pads: vec![1; 4],
            dilations: vec![1, 1],
            group: 1,
            output_padding: vec![],
        });
        assert_eq!(
            op_work(&c, &[Some(&x), Some(&w)], std::slice::from_ref(&y), false).flops(),
            2.0 * 2048.0 * 144.0
        );
        // Attention over [2, 4, S=16, d=8] with T=16: two contractions of 2*S*T*d each per head, plus the
        // softmax's 20 FLOPs per score.
        let q = TensorType::new(DType::BF16, vec![2, 4, 16, 8]);
        let kt = TensorType::new(DType::BF16, vec![2, 4, 8, 16]);
        let w = op_work(
            &Op::Attention { scale: 1.0 },
            &[Some(&q), Some(&kt), Some(&q)],
            std::slice::from_ref(&q),
            false,
        );
        let scores = 2.0 * 4.0 * 16.0 * 16.0;
        assert_eq!(
            w.matrix_flops[MatrixPrecision::Bf16 as usize],
            2.0 * scores * 8.0 * 2.0
        );
        assert_eq!(w.vector_flops, 20.0 * scores);
        // On a GPU, attention reaches the tensor cores; a grouped convolution runs on the SIMT lanes, an
        // ungrouped one on the tensor cores; a CPU's schedules count them as `op_work` does.
        let ins = [Some(&q), Some(&kt), Some(&q)];
        assert_eq!(
            op_work_on(
                &Op::Attention { scale: 1.0 },
                &ins,
                std::slice::from_ref(&q),
                &Target::named("sm_80", 1).unwrap(),
                false
            ),
            w
        );
        let dw = Op::Conv(ConvAttrs {
            strides: vec![1, 1],
            pads: vec![1; 4],
            dilations: vec![1, 1],
            group: 16,
            output_padding: vec![],
        });
        let wd = TensorType::new(DType::F32, vec![16, 1, 3, 3]);
        let yd = TensorType::new(DType::F32, vec![1, 16, 8, 8]);
        let sm80 = Target::named("sm_80", 1).unwrap();
        assert_eq!(
            op_work_on(
                &dw,
                &[Some(&x), Some(&wd)],
                std::slice::from_ref(&yd),
                &sm80,
                false
            )
            .matrix_flops,
            [0.0; 5]
        );
        assert_eq!(
            op_work_on(
                &c,
                &[
                    Some(&x),
                    Some(&TensorType::new(DType::F32, vec![32, 16, 3, 3]))
                ],
                std::slice::from_ref(&y),
                &sm80,
                false
            )
            .vector_flops,
            0.0
        );
        let cpu = Target::named("x86-64-v4", 1).unwrap();
        assert_eq!(
            op_work_on(
                &dw,
                &[Some(&x), Some(&wd)],
                std::slice::from_ref(&yd),
                &cpu,
                false
            ),
            op_work(
                &dw,
                &[Some(&x), Some(&wd)],
                std::slice::from_ref(&yd),
                false
            )
        );
    }

    #[test]
    fn priced_estimates_follow_the_schedule() {
        let t = Target::named("x86-64-v4", 1).unwrap();
        let w = Work {
            vector_flops: 1e9,
            matrix_flops: [1e9, 0.0, 0.0, 0.0, 0.0],
            bytes: 1e3,
        };
        let at = |mix: Mix| priced(&w, &t, mix).compute_s;
        let peak = estimate(&w, &t).compute_s;
        assert_eq!(
            at(Mix {
                tiled: 1.0,
                ..Mix::default()
            }),
            peak
        );
        assert!(
            (at(Mix {
                vector: 1.0,
                ..Mix::default()
            }) - 2.0 * peak)
                .abs()
                < 1e-12
        );
        assert!(
            (at(Mix {
                gather: 1.0,
                ..Mix::default()
            }) - 16.0 * peak)
                .abs()
                < 1e-9
        );
        assert!(
            (at(Mix {
                scalar: 1.0,
                ..Mix::default()
            }) - 64.0 * peak)
                .abs()
                < 1e-9
        );
        let half = at(Mix {
            tiled: 0.5,
            scalar: 0.5,
            ..Mix::default()
        });
        assert!((half - 32.5 * peak).abs() < 1e-9);
        // A GPU's kernels keep the roofline estimate.
        let g = Target::named("sm_80", 1).unwrap();
        assert_eq!(
            priced(
                &w,
                &g,
                Mix {
                    scalar: 1.0,
                    ..Mix::default()
                }
            ),
            estimate(&w, &g)
        );
    }
}
