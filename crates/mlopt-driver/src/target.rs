//! The one place a target becomes what code generation needs. `--target` is looked up once, in the
//! cost model's table (`mlopt_cost::Target::named`, the only table of target names, calibrated for
//! `host`); that `Target` travels in `Config` to every stage, and the code generator's view of it is
//! made here from its fields.

use mlopt_llvm::{CpuTarget, GpuTarget, MatrixUnit};

/// The x86-64 code generation target for a CPU `Target`: `host` as LLVM detects this machine, else the
/// row's LLVM CPU, its vector width and its bf16 matrix unit (AMX tiles, else AVX512-BF16 dot products).
pub fn cpu(t: &mlopt_cost::Target) -> crate::pipeline::Result<CpuTarget> {
    if t.is_gpu() {
        return Err(crate::DriverError::Input(format!(
            "--target {}: GPU code cannot run in this process; `mlopt compile --target {}` writes the GPU library",
            t.name, t.name
        )));
    }
    if t.llvm_cpu == "host" {
        return Ok(CpuTarget::host());
    }
    let matrix = MatrixUnit::of(|f| t.features.iter().any(|x| x == f));
    Ok(CpuTarget {
        name: t.name.clone(),
        cpu: t.llvm_cpu.clone(),
        features: String::new(),
        lanes: t.vector_bits / 32,
        matrix,
    })
}

/// The NVPTX target for a GPU `Target`: its compute capability and PTX version.
pub fn gpu(t: &mlopt_cost::Target) -> crate::pipeline::Result<GpuTarget> {
    if !t.is_gpu() {
        return Err(crate::DriverError::Input(format!(
            "--target {} is not a GPU",
            t.name
        )));
    }
    Ok(GpuTarget {
        name: t.name.clone(),
        ptx: t.ptx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name in the table gives the code generator a target of its kind, with the table's facts.
    #[test]
    fn every_named_target_resolves_for_its_code_generator() {
        for name in mlopt_cost::TARGET_NAMES {
            let t = mlopt_cost::Target::named(name, 1).unwrap();
            if t.is_gpu() {
                let g = gpu(&t).unwrap();
                assert!(g.ptx >= 70 && g.name == *name, "{name}: {g:?}");
                assert!(cpu(&t).is_err());
            } else {
                let c = cpu(&t).unwrap();
                assert!(c.lanes == 8 || c.lanes == 16, "{name}: {c:?}");
                assert!(gpu(&t).is_err());
            }
        }
        let zen4 = cpu(&mlopt_cost::Target::named("znver4", 1).unwrap()).unwrap();
        assert_eq!(
            (zen4.cpu.as_str(), zen4.lanes, zen4.matrix),
            ("znver4", 16, Some(MatrixUnit::Dot))
        );
        let v3 = cpu(&mlopt_cost::Target::named("x86-64-v3", 1).unwrap()).unwrap();
        assert_eq!((v3.lanes, v3.matrix), (8, None));
    }
}
