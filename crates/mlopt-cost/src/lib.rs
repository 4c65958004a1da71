//! mlopt's cost model: target descriptions (x86-64 host, x86-64-v3/v4, sm_80/86/89/90) and the roofline
//! estimate of a kernel (a fusion group): FLOPs and bytes from shapes and dtypes, time = max(compute,
//! memory) + launch overhead, in a saturating `Cost` measured in seconds.
//!
//! Architecture invariant: depends on the graph IR only for op and type definitions; knows nothing of egg,
//! the kernel IR or LLVM.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod calibrate;
pub mod error;
pub mod roofline;
pub mod target;

pub use error::{CostError, Result};
pub use roofline::{estimate, op_work, Bound, Cost, Estimate, Work};
pub use target::{Kind, MatrixPrecision, Target, TARGET_NAMES};

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_ir::{DType, Op, TensorType};

    #[test]
    fn cost_saturates_and_orders() {
        assert_eq!(Cost::secs(f64::NAN), Cost::INFINITY);
        assert_eq!(Cost::secs(1e308) + Cost::secs(1e308), Cost::INFINITY);
        assert!(Cost::secs(1.0) < Cost::INFINITY);
        assert_eq!(Cost::secs(-1.0), Cost::ZERO);
        assert_eq!([Cost::secs(1.0), Cost::secs(2.0)].into_iter().sum::<Cost>(), Cost::secs(3.0));
    }

    #[test]
    fn every_named_target_resolves() {
        for name in TARGET_NAMES {
            let t = Target::named(name, 1).unwrap();
            assert!(t.fp32 > 0.0 && t.dram_bw > 0.0, "{t}");
        }
        assert!(Target::named("sm_75", 1).is_err());
    }

    #[test]
    fn matmul_roofline_on_a100() {
        // 1024^3 fp32 GEMM: 2.1 GFLOP; at 19.5 TFLOP/s that is 110 us, compute-bound.
        let t = Target::named("sm_80", 1).unwrap();
        let a = TensorType::new(DType::F32, vec![1024, 1024]);
        let mut w = op_work(&Op::MatMul, &[Some(&a), Some(&a)], std::slice::from_ref(&a), false);
        assert_eq!(w.flops(), 2.0 * 1024f64.powi(3));
        w.bytes = 3.0 * 4.0 * 1024.0 * 1024.0;
        let e = estimate(&w, &t);
        assert_eq!(e.bound, Bound::Compute);
        assert!((e.compute_s - 2.0 * 1024f64.powi(3) / 19.5e12).abs() < 1e-12);
        // In bf16 the same GEMM runs on tensor cores, 16x faster.
        let b = TensorType::new(DType::BF16, vec![1024, 1024]);
        let wb = op_work(&Op::MatMul, &[Some(&b), Some(&b)], std::slice::from_ref(&b), false);
        assert!((estimate(&wb, &t).compute_s * 16.0 - e.compute_s).abs() < 1e-9);
    }

    #[test]
    fn elementwise_is_memory_bound() {
        let t = Target::named("x86-64-v4", 1).unwrap();
        let a = TensorType::new(DType::F32, vec![1 << 20]);
        let mut w = op_work(&Op::Binary(mlopt_ir::Binary::Add), &[Some(&a), Some(&a)], std::slice::from_ref(&a), false);
        w.bytes = 12.0 * (1 << 20) as f64;
        let e = estimate(&w, &t);
        assert_eq!(e.bound, Bound::Memory);
        assert_eq!(e.time, Cost::secs(e.memory_s + t.launch_s));
    }
}
