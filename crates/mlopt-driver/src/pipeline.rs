//! The compilation pipeline, one function (`run`) of named stages (import happens before, in `data`):
//!
//! optimise (egg + roofline + fusion) -> [tune] -> lower (kernel IR: the algorithm) -> schedule (vector and
//! parallel loops, or GPU launches) -> codegen (LLVM: x86 objects, or PTX) -> [ptxas] -> package
//!
//! each timed. The target is resolved once, before the first stage (a `Codegen`); the target's kind
//! decides only what codegen and package make. `build` runs every stage and returns the `Library`;
//! `inspect` stops after one and returns its text.

use crate::gpu::GpuCompiled;
use crate::library::Library;
use mlopt_ir::{Graph, Tensor};
use mlopt_kir::Program;
use mlopt_llvm::c_name;
use mlopt_runtime::{Loaded, Member};
use mlopt_target::{CpuTarget, GpuTarget, Target};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("optimising: {0}")]
    Optimize(#[from] mlopt_rewrite::RewriteError),
    #[error("lowering to the kernel IR: {0}")]
    Lower(#[from] mlopt_lower::LowerError),
    #[error("scheduling: {0}")]
    Schedule(#[from] mlopt_schedule::ScheduleError),
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
    /// Measure candidate contraction tiles on this machine (`--tune`) instead of taking the rule's.
    pub tune: bool,
    /// When eligible 3x3 convolutions run by Winograd F(2x2, 3x3) (`--winograd`).
    pub winograd: mlopt_schedule::Winograd,
    /// Build with a clock reading around each kernel call (`mlopt bench --profile`; see `profile.rs`).
    pub profile: bool,
}

#[derive(Debug)]
pub struct Compiled {
    pub optimized: mlopt_rewrite::Optimized,
    pub cfg: mlopt_rewrite::Config,
    /// The arena layout of the optimised graph's values (the scratch past it is the program's).
    pub memory: mlopt_lower::MemoryPlan,
    pub program: Program,
    pub code: mlopt_llvm::Output,
    /// (stage, seconds) in pipeline order.
    pub times: Vec<(&'static str, f64)>,
    /// Built with per-kernel clock readings (`Options::profile`).
    pub profiled: bool,
}

/// A stage of the pipeline whose output `inspect` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The optimised graph: fusion groups, layouts and precisions, with the optimiser's report.
    Optimised,
    /// The kernel IR as lowering writes it: the algorithm, before any schedule.
    Lowered,
    /// The kernel IR with its schedules (vector, parallel and unrolled loops; GPU blocks and threads).
    Scheduled,
    /// What code generation makes of it: LLVM IR for a CPU, PTX for a GPU.
    Code,
}

/// What the codegen stage makes, with the target it made it for.
enum Code {
    Cpu(mlopt_llvm::Output),
    Gpu(mlopt_llvm::PtxOutput),
}

/// The stages' seconds, in pipeline order; a stage run again (a GPU schedule planned again) adds to its
/// first entry.
#[derive(Debug, Default)]
struct Times(Vec<(&'static str, f64)>);

impl Times {
    fn stage<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let out = f();
        let dt = t.elapsed().as_secs_f64();
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += dt,
            None => self.0.push((name, dt)),
        }
        out
    }
}

/// How far `run` goes: every stage, or up to one whose text is wanted.
enum Ran {
    Built(Library),
    Stopped(String),
}

/// Runs the whole pipeline on an imported graph for `opt`'s target: a CPU or a GPU library.
pub fn build(g: &Graph, opt: &Options) -> Result<Library> {
    match run(g, opt, None)? {
        Ran::Built(lib) => Ok(lib),
        Ran::Stopped(_) => Err(DriverError::Io(
            "the pipeline stopped before packaging (a bug in mlopt's driver)".into(),
        )),
    }
}

/// The text of `stage` for an imported graph: the pipeline up to that stage.
pub fn inspect(g: &Graph, opt: &Options, stage: Stage) -> Result<String> {
    match run(g, opt, Some(stage))? {
        Ran::Stopped(text) => Ok(text),
        Ran::Built(_) => Err(DriverError::Io(format!(
            "the pipeline did not stop at {stage:?} (a bug in mlopt's driver)"
        ))),
    }
}

/// Runs the pipeline for a CPU target and keeps the result in this process (to load and run, or bench).
pub fn compile(g: &Graph, opt: &Options) -> Result<Compiled> {
    cpu_target(&opt.config.target)?;
    match build(g, opt)? {
        Library::Cpu(c) => Ok(*c),
        Library::Gpu(_) => Err(DriverError::Io(
            "a CPU target built a GPU library (a bug in mlopt's driver)".into(),
        )),
    }
}

/// Runs the pipeline for a GPU target.
pub fn compile_gpu(g: &Graph, opt: &Options) -> Result<GpuCompiled> {
    gpu_target(&opt.config.target)?;
    match build(g, opt)? {
        Library::Gpu(c) => Ok(*c),
        Library::Cpu(_) => Err(DriverError::Io(
            "a GPU target built a CPU library (a bug in mlopt's driver)".into(),
        )),
    }
}

/// The pipeline, stopping after `stop` with its text when given.
fn run(g: &Graph, opt: &Options, stop: Option<Stage>) -> Result<Ran> {
    let cfg = opt.config.clone();
    let target = &opt.config.target;
    let mut times = Times::default();
    let optimized = times.stage("optimise", || Ok(mlopt_rewrite::optimize(g, &cfg)?))?;
    if stop == Some(Stage::Optimised) {
        return Ok(Ran::Stopped(mlopt_rewrite::report::dump(&optimized, &cfg)));
    }
    let graph = &optimized.plan.graph;
    // The memory plan places the values for lowering and is what the report says of the arena.
    let (memory, algorithm) = times.stage("lower", || {
        let memory = mlopt_lower::plan_memory(graph)?;
        let algorithm = mlopt_lower::lower(graph, &memory)?;
        Ok((memory, algorithm))
    })?;
    if stop == Some(Stage::Lowered) {
        return Ok(Ran::Stopped(mlopt_kir::print::program(&algorithm)));
    }
    let mut schedule = schedule_options(opt);
    if let (Target::Cpu(t), true) = (target, opt.tune) {
        schedule.tiles = times.stage("tune", || crate::tune::tune(&algorithm, t, &schedule))?;
    }
    let ptxas = target.is_gpu().then(crate::gpu::find_ptxas).flatten();
    // A GPU tile's registers are planned by an estimate and checked against ptxas: where a kernel needs
    // more than its plan, the schedules are planned again with the shortfall added to every estimate (at
    // most twice), so the occupancy a tile was chosen for is the one it gets.
    let mut attempt = 0;
    // A GPU may schedule the algorithm again; a CPU schedules it once, and the schedule stage takes it:
    // its unpacked weights are freed as their packed panels replace them.
    let mut algorithm = Some(algorithm);
    let (program, code, figures) = loop {
        let input = if target.is_gpu() {
            algorithm.clone()
        } else {
            algorithm.take()
        };
        let input = input.ok_or_else(|| {
            DriverError::Io(
                "the algorithm was scheduled twice for a CPU (a bug in mlopt's driver)".into(),
            )
        })?;
        let program = times.stage("schedule", || {
            Ok(mlopt_schedule::schedule(input, target, &schedule)?)
        })?;
        if stop == Some(Stage::Scheduled) {
            return Ok(Ran::Stopped(mlopt_kir::print::program(&program)));
        }
        let code = times.stage("codegen", || {
            Ok(match target {
                Target::Cpu(t) => Code::Cpu(mlopt_llvm::compile_with(&program, t, opt.profile)?),
                Target::Gpu(t) => Code::Gpu(mlopt_llvm::compile_ptx(&program, t)?),
            })
        })?;
        if stop == Some(Stage::Code) {
            return Ok(Ran::Stopped(match code {
                Code::Cpu(c) => c.llvm_ir,
                Code::Gpu(c) => c.ptx,
            }));
        }
        let figures = match (&code, &ptxas) {
            (Code::Gpu(c), Some(p)) => {
                Some(times.stage("ptxas", || crate::gpu::run_ptxas(p, &c.ptx, target.name()))?)
            }
            _ => None,
        };
        let short = figures
            .as_deref()
            .map_or(0, |f| crate::gpu::register_shortfall(&program, f));
        if target.is_gpu() && short > 0 && attempt < 2 {
            schedule.register_margin += short as u64;
            attempt += 1;
        } else {
            break (program, code, figures);
        }
    };
    let lib = times.stage("package", || {
        Ok(match code {
            Code::Cpu(code) => Library::Cpu(Box::new(Compiled {
                optimized,
                cfg,
                memory,
                program,
                code,
                times: vec![],
                profiled: opt.profile,
            })),
            Code::Gpu(ptx) => Library::Gpu(Box::new(crate::gpu::package(
                optimized, cfg, program, ptx, ptxas, figures,
            )?)),
        })
    })?;
    Ok(Ran::Built(lib.with_times(times.0)))
}

/// The schedule stage's options: the Winograd policy, and tf32 tensor cores only where the precision
/// accepts their rounding of f32 operands to 10 mantissa bits (`--precision bf16|fp16`, as the cost
/// model assumes), never under `fp32` or `auto`.
fn schedule_options(opt: &Options) -> mlopt_schedule::Options {
    let tf32 = matches!(
        opt.config.precision,
        mlopt_rewrite::Precision::Bf16 | mlopt_rewrite::Precision::Fp16
    );
    mlopt_schedule::Options {
        winograd: opt.winograd,
        tf32,
        ..Default::default()
    }
}

/// The CPU of `t`, or an error saying a GPU's code cannot run in this process.
pub fn cpu_target(t: &Target) -> Result<&CpuTarget> {
    t.cpu().ok_or_else(|| {
        DriverError::Input(format!(
            "--target {0}: GPU code cannot run in this process; `mlopt compile --target {0}` writes the GPU library",
            t.name()
        ))
    })
}

/// The GPU of `t`, or an error saying it is not one.
pub fn gpu_target(t: &Target) -> Result<&GpuTarget> {
    t.gpu()
        .ok_or_else(|| DriverError::Input(format!("--target {} is not a GPU", t.name())))
}

impl Compiled {
    /// Links the object with the runtime and loads it into this process.
    pub fn load(&self) -> Result<Loaded> {
        let p = &self.program;
        Ok(Loaded::new(
            &members(&c_name(&p.name), &self.code)?,
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
                let t = inputs.get(&io.name).ok_or_else(|| {
                    DriverError::Input(format!("graph input '{}': no value given", io.name))
                })?;
                let want: Vec<usize> = io.dims.iter().map(|d| *d as usize).collect();
                if t.shape() != want.as_slice() || t.dtype().name() != io.elem.name() {
                    return Err(DriverError::Input(format!(
                        "input '{}' is {}, the model was compiled for {}{:?}",
                        io.name,
                        t.ty(),
                        io.elem,
                        want
                    )));
                }
                Ok(t.to_le_bytes())
            })
            .collect()
    }

    /// Runs loaded code on named tensors.
    pub fn run(
        &self,
        lib: &mut Loaded,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        let ins = self.input_bytes(inputs)?;
        let refs: Vec<&[u8]> = ins.iter().map(|b| b.as_slice()).collect();
        let mut outs: Vec<Vec<u8>> = self
            .program
            .outputs
            .iter()
            .map(|io| vec![0u8; io.bytes()])
            .collect();
        lib.run(&refs, &mut outs)?;
        self.program
            .outputs
            .iter()
            .zip(&outs)
            .map(|(io, b)| {
                Ok((
                    io.name.clone(),
                    mlopt_lower::program::tensor(io, b).map_err(DriverError::Io)?,
                ))
            })
            .collect()
    }

    /// Runs loaded code `warmups` times untimed, then `runs` times, and returns each timed run's seconds
    /// (in run order): what `bench` and the profiler measure.
    pub fn timed_runs(
        &self,
        lib: &mut Loaded,
        inputs: &[&[u8]],
        warmups: usize,
        runs: usize,
    ) -> Result<Vec<f64>> {
        let mut outs: Vec<Vec<u8>> = self
            .program
            .outputs
            .iter()
            .map(|io| vec![0u8; io.bytes()])
            .collect();
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
    pub fn write_library(
        &self,
        dir: &Path,
        stem: &str,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Vec<PathBuf>> {
        let files = [
            (
                format!("{stem}.h"),
                crate::emit::c_header(&self.program, self.cfg.target.name()),
            ),
            (
                format!("{stem}.rs"),
                crate::emit::rust_binding(&self.program, stem),
            ),
            (
                format!("{stem}.optimized.mlir"),
                mlopt_rewrite::report::dump(&self.optimized, &self.cfg),
            ),
            (
                format!("{stem}.kir"),
                mlopt_kir::print::program(&self.program),
            ),
            (format!("{stem}.ll"), self.code.llvm_ir.clone()),
        ];
        write_files(
            dir,
            files.into(),
            (stem, &members(stem, &self.code)?),
            mlopt_runtime::write_archive,
            extra,
        )
    }
}

/// `mlopt_runtime::write_archive` or `write_gpu_archive`: objects -> a static library, into a file.
pub(crate) type Archive = fn(&mut std::fs::File, &[Member]) -> std::io::Result<()>;

/// The objects of CPU code as a library's members: the entry point's (`<stem>.o`), the weights'
/// (`<stem>.1.o`, in pieces that share the program's weight buffers), then each group of kernels'.
pub fn members<'a>(stem: &str, code: &'a mlopt_llvm::Output) -> Result<Vec<Member<'a>>> {
    let name = |i: usize| {
        if i == 0 {
            format!("{stem}.o")
        } else {
            format!("{stem}.{i}.o")
        }
    };
    let mut all = vec![Member {
        name: name(1),
        parts: code.data.parts(),
        symbols: code.data.symbols().to_vec(),
    }];
    for (i, o) in code.objects.iter().enumerate() {
        // The entry point's object goes first, the kernels' after the weights'.
        let at = if i == 0 { 0 } else { i + 1 };
        all.insert(
            at,
            Member::object(name(at), o)
                .map_err(|e| DriverError::Io(format!("{}: {e}", name(at))))?,
        );
    }
    Ok(all)
}

/// Writes `files` (name, text), lib<stem>.a holding `members` by `archive`, and `extra` into `dir`, all or
/// none; returns the paths written.
pub(crate) fn write_files(
    dir: &Path,
    files: Vec<(String, String)>,
    (stem, members): (&str, &[Member]),
    archive: Archive,
    extra: &[(String, Vec<u8>)],
) -> Result<Vec<PathBuf>> {
    use crate::output::Content;
    let mut all: Vec<(String, Content)> = files
        .into_iter()
        .map(|(n, t)| (n, Content::Bytes(t.into_bytes())))
        .collect();
    all.push((
        format!("lib{stem}.a"),
        Content::Stream(Box::new(|f: &mut std::fs::File| archive(f, members))),
    ));
    all.extend(
        extra
            .iter()
            .map(|(n, b)| (n.clone(), Content::Bytes(b.clone()))),
    );
    crate::output::write_atomically(dir, &all)
}
