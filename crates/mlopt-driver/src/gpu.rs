//! What the pipeline (`pipeline::run`) does for NVIDIA GPUs (`--target sm_80|sm_86|sm_89|sm_90`) beyond
//! its shared stages: the GPU schedules' options, ptxas (the registers, spills and shared memory of every
//! kernel, and the register plans it checks), and the package: `<name>.ptx`, `<name>.h`, and `lib<name>.a`
//! with the host side (the PTX, the weights and the launch table as constants, and the C API) and the
//! CUDA launcher, which opens libcuda at run time.

use crate::error::{DriverError, Result};
use mlopt_kir::Program;
use mlopt_llvm::{c_name, PtxOutput};
use mlopt_target::{GpuTarget, MatrixPrecision};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What ptxas says of one kernel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ptxas {
    pub registers: u32,
    pub spill_stores: u64,
    pub spill_loads: u64,
    pub stack_bytes: u64,
    pub smem_bytes: u64,
}

/// One launched kernel in the report.
#[derive(Debug, Clone)]
pub struct KernelReport {
    pub name: String,
    pub schedule: Vec<mlopt_kir::ScheduleStep>,
    pub launch: mlopt_kir::gpu::Launch,
    pub flops: u64,
    pub bytes: u64,
    /// The roofline time on the target: max(flops / peak, bytes / DRAM bandwidth), the peak being the
    /// tensor cores' for an `mma.sync` kernel and SIMT fp32 otherwise.
    pub roofline_s: f64,
    pub bound: mlopt_cost::Bound,
    /// None when no ptxas was found.
    pub ptxas: Option<Ptxas>,
    /// Resident warps per SM over the most there can be, from the block size, registers and shared memory.
    pub occupancy: Option<f64>,
}

#[derive(Debug)]
pub struct GpuCompiled {
    pub optimized: mlopt_rewrite::Optimized,
    pub cfg: mlopt_rewrite::Config,
    pub program: Program,
    pub ptx: PtxOutput,
    pub host_object: Vec<u8>,
    pub kernels: Vec<KernelReport>,
    /// The ptxas that checked the PTX, or None when none was found.
    pub ptxas: Option<PathBuf>,
    pub times: Vec<(&'static str, f64)>,
    /// Each stage's text, when the pipeline kept them (`Options::dumps`).
    pub dumps: Vec<(crate::Stage, String)>,
}

/// ptxas: `MLOPT_PTXAS`, else `ptxas` on PATH, else the one in a `.venv` (the nvidia-cuda-nvcc-cu12 wheel)
/// in the current directory or above it.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MLOPT_PTXAS") {
        return Some(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path)
            .map(|d| d.join("ptxas"))
            .find(|p| p.is_file())
        {
            return Some(p);
        }
    }
    let mut dir = std::env::current_dir().ok();
    while let Some(d) = dir {
        if let Ok(entries) = std::fs::read_dir(d.join(".venv/lib")) {
            if let Some(p) = entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
                .find(|p| p.is_file())
            {
                return Some(p);
            }
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    None
}

/// Assembles the distinct kernels of `ptx` for `arch`, its parts on threads (one ptxas each); returns
/// every kernel's figures (a copy has those of the kernel it copies), or ptxas's first errors.
pub fn assemble(ptxas: &Path, ptx: &PtxOutput, arch: &str) -> Result<Vec<(String, Ptxas)>> {
    let parts: Vec<Result<Vec<(String, Ptxas)>>> = std::thread::scope(|s| {
        let runs: Vec<_> = ptx
            .parts
            .iter()
            .map(|part| s.spawn(move || run_ptxas(ptxas, part, arch)))
            .collect();
        runs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(DriverError::Io("a ptxas thread panicked".into())))
            })
            .collect()
    });
    let mut figures: HashMap<String, Ptxas> = HashMap::new();
    for part in parts {
        figures.extend(part?);
    }
    Ok(ptx
        .sharing
        .iter()
        .filter_map(|(kernel, code)| Some((kernel.clone(), figures.get(code)?.clone())))
        .collect())
}

/// Assembles `ptx` for `arch` with `ptxas -v`; returns each entry's figures, or ptxas's errors.
pub fn run_ptxas(ptxas: &Path, ptx: &str, arch: &str) -> Result<Vec<(String, Ptxas)>> {
    let dir = std::env::temp_dir().join(format!(
        "mlopt-ptxas-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| DriverError::Io(format!("{}: {e}", dir.display())))?;
    let src = dir.join("kernels.ptx");
    std::fs::write(&src, ptx).map_err(|e| DriverError::Io(format!("{}: {e}", src.display())))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(dir.join("kernels.cubin"))
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.map_err(|e| DriverError::Io(format!("running {}: {e}", ptxas.display())))?;
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(DriverError::Ptxas(text));
    }
    Ok(parse_ptxas(&text))
}

/// The figures in ptxas -v's report, per entry.
fn parse_ptxas(text: &str) -> Vec<(String, Ptxas)> {
    let mut out: Vec<(String, Ptxas)> = Vec::new();
    let num = |s: &str, before: &str| -> u64 {
        s.split(before)
            .next()
            .and_then(|p| p.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push((name, Ptxas::default()));
        } else if let Some((_, p)) = out.last_mut() {
            if line.contains("bytes stack frame") {
                p.stack_bytes = num(line, " bytes stack frame");
                p.spill_stores = num(line, " bytes spill stores");
                p.spill_loads = num(line, " bytes spill loads");
            } else if line.contains("Used ") && line.contains(" registers") {
                p.registers = num(line, " registers") as u32;
                if line.contains(" bytes smem") {
                    p.smem_bytes = num(line, " bytes smem");
                }
            }
        }
    }
    out
}

/// A tile's registers, as its schedule plans them (the `gpu.gemm` step's `N registers planned`).
pub fn planned_registers(schedule: &[mlopt_kir::ScheduleStep]) -> Option<u32> {
    schedule.iter().find_map(|s| match s {
        mlopt_kir::ScheduleStep::GpuGemm { registers, .. } => Some(*registers),
        _ => None,
    })
}

/// The most registers any kernel of `program` needs beyond its plan, by ptxas's `figures`.
pub(crate) fn register_shortfall(program: &Program, figures: &[(String, Ptxas)]) -> u32 {
    let used = |name: &str| {
        figures
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f.registers)
    };
    program
        .kernels
        .iter()
        .filter_map(|k| used(&k.name)?.checked_sub(planned_registers(&k.schedule)?))
        .max()
        .unwrap_or(0)
}

/// The package stage for a GPU: the host object (the PTX, the weights, the launch table and the C API)
/// and each launch's report.
pub(crate) fn package(
    optimized: mlopt_rewrite::Optimized,
    cfg: mlopt_rewrite::Config,
    program: Program,
    ptx: PtxOutput,
    ptxas: Option<PathBuf>,
    figures: Option<Vec<(String, Ptxas)>>,
) -> Result<GpuCompiled> {
    let target = crate::pipeline::gpu_target(&cfg.target)?;
    let host_object = mlopt_llvm::host_object(&program, &ptx.ptx)?;
    let kernels = program
        .kernels
        .iter()
        .filter_map(|k| {
            let launch = mlopt_kir::gpu::launch(k)?;
            let (flops, bytes) = mlopt_kir::gpu::work(k);
            // Tensor-core kernels run at the matrix peak of their input type.
            let matrix = mlopt_kir::gpu::matrix_input(k).map(|e| match e {
                mlopt_kir::Elem::BF16 => MatrixPrecision::Bf16,
                mlopt_kir::Elem::F16 => MatrixPrecision::F16,
                _ => MatrixPrecision::Tf32,
            });
            let roofline = mlopt_cost::kernel::launch(target, flops as f64, bytes as f64, matrix);
            let ptxas = figures
                .as_ref()
                .and_then(|f| f.iter().find(|(n, _)| *n == k.name).map(|(_, p)| p.clone()));
            let occupancy = ptxas.as_ref().map(|p| {
                mlopt_cost::kernel::occupancy(
                    target,
                    launch.block,
                    p.registers,
                    p.smem_bytes.max(launch.shared_bytes),
                )
            });
            Some(KernelReport {
                name: k.name.clone(),
                schedule: k.schedule.clone(),
                launch,
                flops,
                bytes,
                roofline_s: roofline.time.as_secs(),
                bound: roofline.bound,
                ptxas,
                occupancy,
            })
        })
        .collect();
    Ok(GpuCompiled {
        optimized,
        cfg,
        program,
        ptx,
        host_object,
        kernels,
        ptxas,
        times: vec![],
        dumps: vec![],
    })
}

impl GpuCompiled {
    /// An error naming the first kernel that spills, by ptxas (none without ptxas).
    pub fn check_spills(&self) -> Result<()> {
        match self.kernels.iter().find_map(|k| {
            Some((
                &k.name,
                k.ptxas
                    .as_ref()
                    .filter(|p| p.spill_stores + p.spill_loads > 0)?,
            ))
        }) {
            Some((name, f)) => Err(DriverError::Ptxas(format!(
                "{name} spills ({} bytes stored, {} loaded)",
                f.spill_stores, f.spill_loads
            ))),
            None => Ok(()),
        }
    }

    /// Writes lib<stem>.a, <stem>.h, <stem>.ptx, the stage dumps and `extra` (the report) into `dir`, all
    /// or none; returns the paths written.
    pub fn write_library(
        &self,
        dir: &Path,
        stem: &str,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Vec<PathBuf>> {
        let target = crate::pipeline::gpu_target(&self.cfg.target)?;
        // The PTX is the codegen stage's text and a file of the library, always written.
        let mut files = vec![
            (format!("{stem}.h"), c_header(&self.program, target)),
            (format!("{stem}.ptx"), self.ptx.ptx.clone()),
            (format!("{stem}.ll"), self.ptx.llvm_ir.clone()),
        ];
        let dumps: Vec<(crate::Stage, String)> = self
            .dumps
            .iter()
            .filter(|(st, _)| *st != crate::Stage::Codegen)
            .cloned()
            .collect();
        files.extend(crate::library::dump_files(&dumps, stem, &self.cfg.target));
        let host = mlopt_runtime::Member::object(format!("{stem}.o"), &self.host_object)
            .map_err(|e| DriverError::Io(format!("the host object: {e}")))?;
        crate::output::write_files(
            dir,
            files,
            (stem, &[host]),
            mlopt_runtime::write_gpu_archive,
            extra,
        )
    }

    /// The per-kernel table `--report` prints.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<10} {:>12} {:>8} {:>12} {:>12} {:>10} {:>8} {:>5} {:>6} {:>7} {:>5}  schedule",
            "kernel",
            "grid x block",
            "smem B",
            "FLOPs",
            "bytes",
            "roofline",
            "bound",
            "regs",
            "spills",
            "ptx smem",
            "occ"
        );
        for k in &self.kernels {
            let (regs, spills, smem) = match &k.ptxas {
                Some(p) => (
                    p.registers.to_string(),
                    (p.spill_stores + p.spill_loads).to_string(),
                    p.smem_bytes.to_string(),
                ),
                None => ("?".into(), "?".into(), "?".into()),
            };
            let occ = k
                .occupancy
                .map_or("?".into(), |o| format!("{:.0}%", o * 100.0));
            let _ = writeln!(
                s,
                "{:<10} {:>12} {:>8} {:>12} {:>12} {:>8.2}us {:>8} {:>5} {:>6} {:>7} {:>5}  {}",
                k.name,
                format!("{}x{}", k.launch.grid, k.launch.block),
                k.launch.shared_bytes,
                k.flops,
                k.bytes,
                k.roofline_s * 1e6,
                k.bound,
                regs,
                spills,
                smem,
                occ,
                mlopt_kir::step::schedule_text(&k.schedule)
            );
        }
        let total: f64 = self.kernels.iter().map(|k| k.roofline_s).sum();
        let launches = self.kernels.len() as f64 * self.cfg.target.roof().launch_s;
        let _ = writeln!(
            s,
            "{} launches, roofline {:.2} us + {:.1} us of launch overhead on {} ({})",
            self.kernels.len(),
            total * 1e6,
            launches * 1e6,
            self.cfg.target.name(),
            self.cfg.target.roof().source
        );
        s
    }

    /// The `gpu_kernels` field of report.json.
    pub fn json(&self) -> String {
        let rows: Vec<String> = self
            .kernels
            .iter()
            .map(|k| {
                let p = k.ptxas.as_ref();
                let opt = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
                format!(
                    "{{\"name\": \"{}\", \"grid\": {}, \"block\": {}, \"shared_bytes\": {}, \"flops\": {}, \"bytes\": {}, \"roofline_s\": {:e}, \"bound\": \"{}\", \"registers\": {}, \"registers_planned\": {}, \"spill_stores\": {}, \"spill_loads\": {}, \"stack_bytes\": {}, \"ptxas_smem_bytes\": {}, \"occupancy\": {}, \"schedule\": \"{}\"}}",
                    k.name,
                    k.launch.grid,
                    k.launch.block,
                    k.launch.shared_bytes,
                    k.flops,
                    k.bytes,
                    k.roofline_s,
                    k.bound,
                    opt(p.map(|p| p.registers as u64)),
                    opt(planned_registers(&k.schedule).map(u64::from)),
                    opt(p.map(|p| p.spill_stores)),
                    opt(p.map(|p| p.spill_loads)),
                    opt(p.map(|p| p.stack_bytes)),
                    opt(p.map(|p| p.smem_bytes)),
                    k.occupancy.map_or("null".to_string(), |o| format!("{o:.3}")),
                    mlopt_kir::step::schedule_text(&k.schedule).replace('"', "'")
                )
            })
            .collect();
        format!("[\n    {}\n  ]", rows.join(",\n    "))
    }
}

/// The C header of a GPU library: the CPU library's shape (create, run, destroy and the sizes), plus the
/// device to create on, device-buffer runs on a stream, and the last error.
pub fn c_header(p: &Program, t: &GpuTarget) -> String {
    let n = c_name(&p.name);
    let up = n.to_uppercase();
    let mut s = crate::emit::io_defines(p, &format!("/* Generated by mlopt {} for {} ({}, PTX {}); link with lib{n}.a -ldl. The CUDA driver\n   (libcuda.so.1) is opened at run time: no CUDA toolkit is needed to build or link. */", env!("CARGO_PKG_VERSION"), crate::emit::comment(&p.name), t.name, t.ptx_version()));
    let _ = writeln!(s, "/* Creates the model on CUDA device `device`: loads its PTX, uploads the weights (once) and allocates\n   the activation memory ({} bytes). NULL on failure: mlopt_{n}_last_error() says why. */", p.arena_bytes);
    let _ = writeln!(s, "void *mlopt_{n}_create(int device);");
    let _ = writeln!(s, "/* Runs the model on host buffers of the sizes above: copies the inputs in, launches the kernels on\n   the model's stream, copies the outputs back and waits (buffers aligned to their element type; as every input is copied\n   in before any output is copied back, an output may overlap an input). 0 on success, -1 on a CUDA error, a NULL argument, or input data the model rejects (an index out\n   of range, an integer division by zero: the interpreter's error). */");
    let _ = writeln!(
        s,
        "int mlopt_{n}_run(void *ctx, const void *const *inputs, void *const *outputs);"
    );
    let _ = writeln!(s, "/* Launches the kernels on device buffers (CUdeviceptr values) on `stream` (a CUstream; NULL: the\n   model's own), without waiting, except after a data check, whose flag is read back (the stream is\n   synchronised there). One run at a time per context. Every buffer must start 16-byte aligned\n   (cuMemAlloc's are). 0 on success, -1 on a CUDA error, a misaligned buffer or rejected data. */");
    let _ = writeln!(s, "int mlopt_{n}_run_device(void *ctx, const uint64_t *inputs, const uint64_t *outputs, void *stream);");
    let _ = writeln!(s, "void mlopt_{n}_destroy(void *ctx);");
    let _ = writeln!(
        s,
        "/* The last error of this thread, as text. */\nconst char *mlopt_{n}_last_error(void);\n"
    );
    let _ = writeln!(
        s,
        "#ifdef __cplusplus\n}}\n#endif\n\n#endif /* MLOPT_{up}_H */"
    );
    s
}
