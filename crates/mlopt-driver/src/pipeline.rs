//! The compilation pipeline, one flat list of named stages (import happens before, in `data`):
//!
//! optimise (egg + roofline + fusion) -> lower (kernel IR: the algorithm) -> schedule (vector/parallel
//! loops, or GPU launches) -> codegen (LLVM, default<O3>, object)
//!
//! each timed; and what to do with the result: load it into this process and run it, or write the
//! library users link.

use mlopt_ir::{Graph, Tensor};
use mlopt_kir::Program;
use mlopt_llvm::{c_name, CpuTarget};
use mlopt_runtime::Loaded;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("optimising: {0}")]
    Optimize(#[from] mlopt_rewrite::RewriteError),
    #[error("lowering to the kernel IR: {0}")]
    Lower(#[from] mlopt_lower::LowerError),
    #[error("generating code: {0}")]
    Codegen(#[from] mlopt_llvm::LlvmError),
    #[error(transparent)]
    Runtime(#[from] mlopt_runtime::RuntimeError),
    #[error("ptxas rejected the generated PTX (a bug in mlopt's code generation):\n{0}")]
    Ptxas(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Input(String),
}

pub type Result<T, E = DriverError> = std::result::Result<T, E>;

/// What to compile for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The optimiser's configuration. Its target, looked up once from `--target`, is the target of
    /// every stage: the cost model's peaks and, through `target.rs`, the code generator's CPU or GPU.
    pub config: mlopt_rewrite::Config,
    /// Threads of parallel loops (the default; the runtime can override it).
    pub threads: u32,
    /// Measure candidate contraction tiles on this machine (`--tune`) instead of taking the rule's.
    pub tune: bool,
    /// When eligible 3x3 convolutions are lowered by Winograd F(2x2, 3x3) (`--winograd`).
    pub winograd: mlopt_lower::Winograd,
    /// Build with a clock reading around each kernel call (`mlopt bench --profile`; see `profile.rs`).
    pub profile: bool,
}

#[derive(Debug)]
pub struct Compiled {
    pub optimized: mlopt_rewrite::Optimized,
    pub cfg: mlopt_rewrite::Config,
    pub program: Program,
    pub code: mlopt_llvm::Output,
    pub target: CpuTarget,
    /// (stage, seconds) in pipeline order.
    pub times: Vec<(&'static str, f64)>,
    /// Built with per-kernel clock readings (`Options::profile`).
    pub profiled: bool,
}

/// A stage of the pipeline after optimisation whose output `inspect` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The kernel IR as lowering writes it: the algorithm, before any schedule.
    Lowered,
    /// The kernel IR with its schedules (vector, parallel and unrolled loops; GPU blocks and threads).
    Scheduled,
    /// What code generation makes of it: LLVM IR for a CPU, PTX for a GPU.
    Code,
}

/// The text of `stage` for an imported graph: each stage runs the ones before it, as `compile` does.
pub fn inspect(g: &Graph, opt: &Options, stage: Stage) -> Result<String> {
    let cfg = &opt.config;
    let optimized = mlopt_rewrite::optimize(g, cfg)?;
    let graph = &optimized.plan.graph;
    let lower = if cfg.target.is_gpu() { crate::gpu::lowering(crate::gpu::schedule_for(cfg)) } else { cpu_lowering(opt, &crate::target::cpu(&cfg.target)?) };
    let program = mlopt_lower::lower_algorithm(graph, &lower)?;
    let program = if stage == Stage::Lowered { program } else { mlopt_lower::schedule::schedule(program, &lower)? };
    Ok(match stage {
        Stage::Lowered | Stage::Scheduled => mlopt_kir::print::program(&program),
        Stage::Code if cfg.target.is_gpu() => mlopt_llvm::compile_ptx(&program, &crate::target::gpu(&cfg.target)?)?.ptx,
        Stage::Code => mlopt_llvm::compile(&program, &crate::target::cpu(&cfg.target)?, opt.threads.max(1))?.llvm_ir,
    })
}

/// Lowering and CPU scheduling options for `target`: its lanes, the thread count, and bf16 `mma` blocks
/// where the matrix unit beats the fp32 FMAs (`vdpbf16ps` does not on every CPU that has it:
/// calibration measured half the FMA rate on this machine's cores).
fn cpu_lowering(opt: &Options, target: &CpuTarget) -> mlopt_lower::Options {
    let t = &opt.config.target;
    let faster = t.bf16_matrix.is_some_and(|p| p > t.fp32);
    let sched = mlopt_lower::CpuSchedule { lanes: target.lanes, threads: opt.threads.max(1), mma: target.matrix.is_some() && faster };
    mlopt_lower::Options { cpu: Some(sched), winograd: opt.winograd, ..Default::default() }
}

/// Runs the pipeline on an imported graph.
pub fn compile(g: &Graph, opt: &Options) -> Result<Compiled> {
    let target = crate::target::cpu(&opt.config.target)?;
    let mut times = Vec::new();
    let mut t = Instant::now();
    let mut lap = |name: &'static str, times: &mut Vec<(&'static str, f64)>| {
        times.push((name, t.elapsed().as_secs_f64()));
        t = Instant::now();
    };
    let cfg = opt.config.clone();
    let optimized = mlopt_rewrite::optimize(g, &cfg)?;
    lap("optimise", &mut times);
    let mut lower = cpu_lowering(opt, &target);
    if opt.tune {
        lower.tiles = crate::tune::tune(&optimized.plan.graph, &lower, &target, opt.threads.max(1))?;
        lap("tune", &mut times);
    }
    let program = mlopt_lower::lower_algorithm(&optimized.plan.graph, &lower)?;
    lap("lower", &mut times);
    let program = mlopt_lower::schedule::schedule(program, &lower)?;
    lap("schedule", &mut times);
    let code = mlopt_llvm::compile_with(&program, &target, opt.threads.max(1), opt.profile)?;
    lap("codegen", &mut times);
    Ok(Compiled { optimized, cfg, program, code, target, times, profiled: opt.profile })
}

impl Compiled {
    /// Links the object with the runtime and loads it into this process.
    pub fn load(&self) -> Result<Loaded> {
        let p = &self.program;
        Ok(Loaded::new(
            &self.code.objects,
            &c_name(&p.name),
            p.context_bytes(),
            p.inputs.iter().map(mlopt_kir::Io::bytes).collect(),
            p.outputs.iter().map(mlopt_kir::Io::bytes).collect(),
        )?)
    }

    /// The input buffers for named tensors, checked against the compiled shapes and types.
    pub fn input_bytes(&self, inputs: &HashMap<String, Tensor>) -> Result<Vec<Vec<u8>>> {
        self.program
            .inputs
            .iter()
            .map(|io| {
                let t = inputs.get(&io.name).ok_or_else(|| DriverError::Input(format!("graph input '{}': no value given", io.name)))?;
                let want: Vec<usize> = io.dims.iter().map(|d| *d as usize).collect();
                if t.shape() != want.as_slice() || t.dtype().name() != io.elem.name() {
                    return Err(DriverError::Input(format!("input '{}' is {}, the model was compiled for {}{:?}", io.name, t.ty(), io.elem, want)));
                }
                Ok(t.to_le_bytes())
            })
            .collect()
    }

    /// Runs loaded code on named tensors.
    pub fn run(&self, lib: &mut Loaded, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>> {
        let ins = self.input_bytes(inputs)?;
        let refs: Vec<&[u8]> = ins.iter().map(|b| b.as_slice()).collect();
        let mut outs: Vec<Vec<u8>> = self.program.outputs.iter().map(|io| vec![0u8; io.bytes()]).collect();
        lib.run(&refs, &mut outs)?;
        self.program.outputs.iter().zip(&outs).map(|(io, b)| Ok((io.name.clone(), mlopt_lower::program::tensor(io, b).map_err(DriverError::Io)?))).collect()
    }

    /// Runs loaded code `warmups` times untimed, then `runs` times, and returns each timed run's seconds
    /// (in run order): what `bench` and the profiler measure.
    pub fn timed_runs(&self, lib: &mut Loaded, inputs: &[&[u8]], warmups: usize, runs: usize) -> Result<Vec<f64>> {
        let mut outs: Vec<Vec<u8>> = self.program.outputs.iter().map(|io| vec![0u8; io.bytes()]).collect();
        for _ in 0..warmups {
            lib.run(inputs, &mut outs)?;
        }
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            lib.run(inputs, &mut outs)?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(times)
    }

    /// Writes lib<stem>.a, <stem>.h, <stem>.rs, the stage dumps and `extra` (name, bytes: the report)
    /// into `dir`, all or none (`output.rs`); returns the paths written.
    pub fn write_library(&self, dir: &Path, stem: &str, extra: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>> {
        let files = [
            (format!("{stem}.h"), crate::emit::c_header(&self.program, &self.target)),
            (format!("{stem}.rs"), crate::emit::rust_binding(&self.program, stem)),
            (format!("{stem}.optimized.mlir"), mlopt_rewrite::report::dump(&self.optimized, &self.cfg)),
            (format!("{stem}.kir"), mlopt_kir::print::program(&self.program)),
            (format!("{stem}.ll"), self.code.llvm_ir.clone()),
        ];
        write_files(dir, stem, files.into(), &self.code.objects, mlopt_runtime::write_archive, extra)
    }
}

/// `mlopt_runtime::write_archive` or `write_gpu_archive`: objects -> a static library, into a file.
pub(crate) type Archive = fn(&mut std::fs::File, &[(&str, &[u8])]) -> std::io::Result<()>;

/// Writes `files` (name, text), lib<stem>.a holding `objects` by `archive`, and `extra` into `dir`, all or
/// none; returns the paths written.
pub(crate) fn write_files(
    dir: &Path,
    stem: &str,
    files: Vec<(String, String)>,
    objects: &[Vec<u8>],
    archive: Archive,
    extra: &[(String, Vec<u8>)],
) -> Result<Vec<PathBuf>> {
    use crate::output::Content;
    let names: Vec<String> = (0..objects.len()).map(|i| if i == 0 { format!("{stem}.o") } else { format!("{stem}.{i}.o") }).collect();
    let members: Vec<(&str, &[u8])> = names.iter().zip(objects).map(|(n, o)| (n.as_str(), o.as_slice())).collect();
    let mut all: Vec<(String, Content)> = files.into_iter().map(|(n, t)| (n, Content::Bytes(t.into_bytes()))).collect();
    all.push((format!("lib{stem}.a"), Content::Stream(Box::new(|f: &mut std::fs::File| archive(f, &members)))));
    all.extend(extra.iter().map(|(n, b)| (n.clone(), Content::Bytes(b.clone()))));
    crate::output::write_atomically(dir, &all)
}
