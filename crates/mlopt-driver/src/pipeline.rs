//! The compilation pipeline: one table of named stages (`STAGES`), each a `run` that makes the next
//! IR from the state, a `verify` of what it made and a `print` of it:
//!
//! ```text
//! import    ONNX -> graph IR (shapes pinned, constants folded)              verify: the graph's types
//! optimize  graph IR -> fused graph IR (egg + roofline + fusion)            verify: the fused graph
//! lower     fused graph -> kernel IR algorithms, the activation memory plan verify: the program
//! schedule  algorithms -> scheduled kernel IR for the target [--tune]       verify: the program
//! codegen   kernel IR -> x86 objects (LLVM) or PTX [ptxas]                  verify: ptxas assembled
//! package   -> the Library: archive, header, binding, report                verify: -
//! ```
//!
//! `run` goes through the table in order, timing each stage, and stops after the stage `inspect` asks
//! for with its text; `build` runs it all, and with `Options::dumps` keeps every stage's text, which
//! `mlopt compile` writes beside the library (`Stage::dump_suffix`). The target, resolved once before
//! the first stage (`mlopt_target::Target::named`), decides only what the schedule, codegen and package
//! stages make. Two loops live inside their stage: `--tune` (the schedule stage measures candidate
//! tiles by scheduling the algorithm with each) and a GPU's register plan (the schedule stage
//! assembles its PTX with ptxas and, where a kernel needs more registers than its tile planned,
//! schedules again with the shortfall added, at most twice; codegen then takes that PTX).

use crate::error::{DriverError, Result};
use crate::gpu::Ptxas;
use crate::library::Library;
use crate::Compiled;
use mlopt_ir::Graph;
use mlopt_kir::Program;
use mlopt_llvm::c_name;
use mlopt_target::{CpuTarget, GpuTarget, Target};
use std::borrow::Cow;
use std::path::Path;
use std::time::Instant;

/// What to compile for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The optimiser's configuration. Its target, looked up once from `--target`, is the target of
    /// every stage.
    pub config: mlopt_rewrite::Config,
    /// Measure candidate contraction tiles on this machine (`--tune`) instead of taking the model's.
    pub tune: bool,
    /// When eligible 3x3 convolutions run by Winograd F(2x2, 3x3) (`--winograd`).
    pub winograd: mlopt_schedule::Winograd,
    /// Build with a clock reading around each kernel call (`mlopt bench --profile`; see `profile.rs`).
    pub profile: bool,
    /// Keep every stage's text in the library, for `mlopt compile` to write.
    pub dumps: bool,
    /// Make each value a kernel writes an extra output, after the model's own (`mlopt check --per-node`;
    /// see `probe.rs`).
    pub probe: bool,
}

impl Options {
    /// What `mlopt compile` does by default for `config`: the model's tiles (no tuning), Winograd where
    /// it pays, no clock readings, no stage texts, no probes.
    pub fn new(config: mlopt_rewrite::Config) -> Options {
        Options {
            config,
            tune: false,
            winograd: mlopt_schedule::Winograd::Auto,
            profile: false,
            dumps: false,
            probe: false,
        }
    }
}

/// A stage of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// ONNX -> the graph IR (shapes pinned, constants folded).
    Import,
    /// Equality saturation, extraction and fusion: kernels marked, with cost estimates.
    Optimize,
    /// The kernel IR as lowering writes it: each kernel's algorithm, before any schedule.
    Lower,
    /// The kernel IR with its schedules (tiles, vector/parallel/unrolled loops; GPU blocks and threads).
    Schedule,
    /// What code generation makes of it: LLVM IR for a CPU, PTX for a GPU.
    Codegen,
    /// The library and its report.
    Package,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Import,
        Stage::Optimize,
        Stage::Lower,
        Stage::Schedule,
        Stage::Codegen,
        Stage::Package,
    ];

    pub fn name(self) -> &'static str {
        STAGES[self as usize].name
    }

    /// The name of what the stage makes, which names it too (`inspect --stage optimized`).
    pub fn output_name(self) -> Option<&'static str> {
        match self {
            Stage::Optimize => Some("optimized"),
            Stage::Lower => Some("lowered"),
            Stage::Schedule => Some("scheduled"),
            Stage::Codegen => Some("code"),
            Stage::Import | Stage::Package => None,
        }
    }

    /// What its text shows.
    pub fn about(self) -> &'static str {
        match self {
            Stage::Import => "the graph IR right after import (shapes pinned, constants folded)",
            Stage::Optimize => "after equality saturation, extraction and fusion: kernels marked, with cost estimates",
            Stage::Lower => "the kernel IR as lowering writes it: each kernel's algorithm, before any schedule",
            Stage::Schedule => "the kernel IR with its schedules (tiles, vector/parallel/unrolled loops; GPU blocks and threads)",
            Stage::Codegen => "the generated code: LLVM IR before optimisation (CPU targets), or PTX (GPU targets)",
            Stage::Package => "the library's report: its kernels, arena and stage times",
        }
    }

    /// The file (after `<name>.`) `mlopt compile` writes this stage's text to: the graph IR's `.gir`, the
    /// kernel IR's `.kir`, LLVM's `.ll`, PTX's `.ptx`; None for the package, whose text is the report.
    pub fn dump_suffix(self, target: &Target) -> Option<&'static str> {
        match self {
            Stage::Import => Some("import.gir"),
            Stage::Optimize => Some("optimized.gir"),
            Stage::Lower => Some("lowered.kir"),
            Stage::Schedule => Some("scheduled.kir"),
            Stage::Codegen if target.is_gpu() => Some("ptx"),
            Stage::Codegen => Some("ll"),
            Stage::Package => None,
        }
    }
}

impl std::str::FromStr for Stage {
    type Err = String;

    /// A stage by its name, or by the name of what it makes (`optimized`, `lowered`, `scheduled`, `code`).
    fn from_str(s: &str) -> std::result::Result<Stage, String> {
        Stage::ALL
            .into_iter()
            .find(|st| st.name() == s || st.output_name() == Some(s))
            .ok_or_else(|| {
                let names: Vec<&str> = Stage::ALL.iter().map(|st| st.name()).collect();
                format!("`{s}`: expected a stage, one of {}", names.join(", "))
            })
    }
}

/// What the pipeline starts from.
#[derive(Debug, Clone)]
pub enum Source<'a> {
    /// An ONNX model, imported with `options` and named `name` (made a C identifier by `c_name`: the
    /// library's files, symbols and macros are named after it, not after the graph's name, which every
    /// PyTorch export sets to `main_graph`); external data is read from `dir`.
    Onnx {
        model: &'a mlopt_onnx::proto::ModelProto,
        dir: Option<&'a Path>,
        name: &'a str,
        options: &'a mlopt_onnx::ImportOptions,
    },
    /// A graph already in the IR (built by a program, or imported by the caller).
    Graph(&'a Graph),
}

impl<'a> From<&'a Graph> for Source<'a> {
    fn from(g: &'a Graph) -> Source<'a> {
        Source::Graph(g)
    }
}

/// One row of the pipeline.
struct StageDef {
    name: &'static str,
    run: fn(&mut State) -> Result<()>,
    verify: fn(&State) -> Result<()>,
    print: fn(&State) -> Result<String>,
}

/// The pipeline, in order (indexed by `Stage`).
const STAGES: [StageDef; 6] = [
    StageDef {
        name: "import",
        run: import,
        verify: |s| Ok(mlopt_ir::verify::verify(need(&s.graph, "graph")?)?),
        print: |s| {
            let g = need(&s.graph, "graph")?;
            Ok(format!(
                "; mlopt graph @{} after \"import\"\n{}",
                mlopt_ir::print::ident(&g.name),
                mlopt_ir::print::print(g)
            ))
        },
    },
    StageDef {
        name: "optimize",
        run: |s| {
            let g = need(&s.graph, "graph")?;
            let mut o = mlopt_rewrite::optimize(g, &s.opt.config)?;
            if s.opt.probe {
                crate::probe::add_kernel_outputs(&mut o.plan.graph);
            }
            s.optimized = Some(o);
            Ok(())
        },
        verify: |s| {
            Ok(mlopt_ir::verify::verify(
                &need(&s.optimized, "plan")?.plan.graph,
            )?)
        },
        print: |s| {
            let o = need(&s.optimized, "plan")?;
            Ok(mlopt_rewrite::report::dump(o, &s.opt.config))
        },
    },
    StageDef {
        name: "lower",
        run: |s| {
            let graph = &need(&s.optimized, "plan")?.plan.graph;
            // The memory plan places the values for lowering and is what the report says of the arena.
            let memory = mlopt_lower::plan_memory(graph)?;
            let mut program = mlopt_lower::lower(graph, &memory)?;
            // Outputs sized by the data, as the imported graph says (its outputs are the program's).
            let counted = mlopt_ir::extent::counted_outputs(need(&s.graph, "graph")?)?;
            for (io, (c, _)) in program.outputs.iter_mut().zip(counted) {
                io.counted = c.map(|c| mlopt_kir::Counted {
                    axis: c.axis,
                    output: c.count,
                });
            }
            // Elements of the model's sequences, by the names the importer gives them.
            if let Source::Onnx { model, .. } = &s.source {
                let (ins, outs) = mlopt_onnx::interface::ports(model)?;
                for (list, ports) in [(&mut program.inputs, &ins), (&mut program.outputs, &outs)] {
                    for io in list.iter_mut() {
                        io.sequence =
                            mlopt_onnx::interface::sequence_of(ports, &io.name).map(str::to_string);
                    }
                }
            }
            s.program = Some(program);
            s.memory = Some(memory);
            Ok(())
        },
        verify: verify_program,
        print: print_program,
    },
    StageDef {
        name: "schedule",
        run: schedule,
        verify: verify_program,
        print: print_program,
    },
    StageDef {
        name: "codegen",
        run: codegen,
        verify: |_| Ok(()),
        print: |s| {
            Ok(match need(&s.code, "code")? {
                Code::Cpu(c) => c.llvm_ir.clone(),
                Code::Gpu { ptx, .. } => ptx.ptx.clone(),
            })
        },
    },
    StageDef {
        name: "package",
        run: package,
        verify: |_| Ok(()),
        print: |s| Ok(need(&s.library, "library")?.report(0.0).text),
    },
];

/// What codegen made: x86 objects, or PTX with what ptxas said of it (None without a ptxas).
enum Code {
    Cpu(mlopt_llvm::Output),
    Gpu {
        ptx: mlopt_llvm::PtxOutput,
        ptxas: Option<Vec<(String, Ptxas)>>,
    },
}

/// Everything the stages have made so far.
struct State<'a> {
    opt: &'a Options,
    source: Source<'a>,
    graph: Option<Cow<'a, Graph>>,
    optimized: Option<mlopt_rewrite::Optimized>,
    memory: Option<mlopt_lower::MemoryPlan>,
    /// The kernel IR: the lowered algorithm, then the scheduled program.
    program: Option<Program>,
    /// The PTX the schedule stage assembled to check its register plans (a GPU's).
    planned: Option<Code>,
    code: Option<Code>,
    library: Option<Library>,
    times: Times,
}

/// `x`, or the error that an earlier stage did not make it (a bug in mlopt's driver).
fn need<'s, T>(x: &'s Option<T>, what: &str) -> Result<&'s T> {
    x.as_ref().ok_or_else(|| {
        DriverError::Io(format!(
            "no {what} at this stage of the pipeline (a bug in mlopt's driver)"
        ))
    })
}

fn verify_program(s: &State) -> Result<()> {
    mlopt_kir::verify_program(need(&s.program, "kernel IR")?).map_err(|e| {
        DriverError::Io(format!(
            "the kernel IR does not verify (a bug in mlopt):\n{}",
            e.join("\n")
        ))
    })
}

fn print_program(s: &State) -> Result<String> {
    Ok(mlopt_kir::print::program(need(&s.program, "kernel IR")?))
}

fn import(s: &mut State) -> Result<()> {
    s.graph = Some(match &s.source {
        Source::Graph(g) => Cow::Borrowed(*g),
        Source::Onnx {
            model,
            dir,
            name,
            options,
        } => {
            let mut g = mlopt_onnx::import_model(model, *dir, name, options)?;
            g.name = c_name(name);
            Cow::Owned(g)
        }
    });
    Ok(())
}

/// The schedule stage: `--tune`'s measurements, then the schedules; for a GPU, the register plans
/// checked against ptxas (see the module's text).
fn schedule(s: &mut State) -> Result<()> {
    let target = &s.opt.config.target;
    let mut options = schedule_options(s.opt);
    let algorithm = s.program.take().ok_or_else(|| {
        DriverError::Io("no algorithm to schedule (a bug in mlopt's driver)".into())
    })?;
    if let (Target::Cpu(t), true) = (target, s.opt.tune) {
        options.tiles = s
            .times
            .stage("tune", || crate::tune::tune(&algorithm, t, &options))?;
    }
    // A CPU schedules the algorithm once, and takes it: its unpacked weights are freed as their packed
    // panels replace them.
    let Target::Gpu(t) = target else {
        s.program = Some(mlopt_schedule::schedule(algorithm, target, &options)?);
        return Ok(());
    };
    let ptxas = crate::gpu::find_ptxas();
    for attempt in 0.. {
        let program = mlopt_schedule::schedule(algorithm.clone(), target, &options)?;
        let ptx = mlopt_llvm::compile_ptx(&program, t)?;
        let figures = match &ptxas {
            Some(p) => Some(
                s.times
                    .stage("ptxas", || crate::gpu::assemble(p, &ptx, &t.name))?,
            ),
            None => None,
        };
        let short = figures
            .as_deref()
            .map_or(0, |f| crate::gpu::register_shortfall(&program, f));
        s.program = Some(program);
        s.planned = Some(Code::Gpu {
            ptx,
            ptxas: figures,
        });
        if short == 0 || attempt == 2 {
            break;
        }
        options.register_margin += u64::from(short);
    }
    Ok(())
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

fn codegen(s: &mut State) -> Result<()> {
    let program = need(&s.program, "kernel IR")?;
    s.code = Some(match &s.opt.config.target {
        Target::Cpu(t) => Code::Cpu(mlopt_llvm::compile_with(program, t, s.opt.profile)?),
        // The PTX the schedule stage assembled for its register plans.
        Target::Gpu(_) => s.planned.take().ok_or_else(|| {
            DriverError::Io("a GPU's schedule made no PTX (a bug in mlopt's driver)".into())
        })?,
    });
    Ok(())
}

fn package(s: &mut State) -> Result<()> {
    let missing =
        |what: &str| DriverError::Io(format!("no {what} to package (a bug in mlopt's driver)"));
    let optimized = s.optimized.take().ok_or_else(|| missing("plan"))?;
    let program = s.program.take().ok_or_else(|| missing("program"))?;
    let cfg = s.opt.config.clone();
    s.library = Some(match s.code.take().ok_or_else(|| missing("code"))? {
        Code::Cpu(code) => Library::Cpu(Box::new(Compiled {
            optimized,
            cfg,
            memory: s.memory.take().ok_or_else(|| missing("memory plan"))?,
            program,
            code,
            times: vec![],
            dumps: vec![],
            profiled: s.opt.profile,
        })),
        Code::Gpu { ptx, ptxas } => Library::Gpu(Box::new(crate::gpu::package(
            optimized,
            cfg,
            program,
            ptx,
            crate::gpu::find_ptxas(),
            ptxas,
        )?)),
    });
    Ok(())
}

/// The stages' seconds, in pipeline order; a loop inside a stage (`tune`, `ptxas`) is timed on its own.
#[derive(Debug, Default)]
struct Times(Vec<(&'static str, f64)>);

impl Times {
    /// Runs `f`, timed as `name`.
    fn stage<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let out = f();
        self.add(name, t.elapsed().as_secs_f64());
        out
    }

    fn add(&mut self, name: &'static str, seconds: f64) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += seconds,
            None => self.0.push((name, seconds)),
        }
    }
}

/// Runs the pipeline up to `stop` (every stage when None): the state, and each stage's text when
/// `dumps` (or the stopping stage's).
fn run<'a>(
    source: Source<'a>,
    opt: &'a Options,
    stop: Option<Stage>,
) -> Result<(State<'a>, Vec<(Stage, String)>)> {
    let mut s = State {
        opt,
        source,
        graph: None,
        optimized: None,
        memory: None,
        program: None,
        planned: None,
        code: None,
        library: None,
        times: Times::default(),
    };
    let mut texts = Vec::new();
    for stage in Stage::ALL {
        let def = &STAGES[stage as usize];
        // The stage's entry comes before those of the loops inside it (`tune`, `ptxas`).
        s.times.add(def.name, 0.0);
        let start = Instant::now();
        (def.run)(&mut s)?;
        s.times.add(def.name, start.elapsed().as_secs_f64());
        (def.verify)(&s)?;
        let dumped = opt.dumps && stage.dump_suffix(&opt.config.target).is_some();
        if dumped || stop == Some(stage) {
            texts.push((stage, (def.print)(&s)?));
        }
        if stop == Some(stage) {
            break;
        }
    }
    Ok((s, texts))
}

/// Runs every stage for `opt`'s target: a CPU or a GPU library (with its stage texts when
/// `opt.dumps`).
pub fn build<'a>(source: impl Into<Source<'a>>, opt: &'a Options) -> Result<Library> {
    let (mut s, texts) = run(source.into(), opt, None)?;
    let lib = s.library.take().ok_or_else(|| {
        DriverError::Io("the pipeline stopped before packaging (a bug in mlopt's driver)".into())
    })?;
    Ok(lib.with_times(s.times.0).with_dumps(texts))
}

/// The text of `stage`: the pipeline up to that stage.
pub fn inspect<'a>(
    source: impl Into<Source<'a>>,
    opt: &'a Options,
    stage: Stage,
) -> Result<String> {
    let (_, mut texts) = run(source.into(), opt, Some(stage))?;
    texts
        .pop()
        .filter(|(st, _)| *st == stage)
        .map(|(_, text)| text)
        .ok_or_else(|| {
            DriverError::Io(format!(
                "the pipeline did not stop at {} (a bug in mlopt's driver)",
                stage.name()
            ))
        })
}

/// Runs the pipeline for a CPU target and keeps the result in this process (to load and run, or bench).
pub fn compile<'a>(source: impl Into<Source<'a>>, opt: &'a Options) -> Result<Compiled> {
    cpu_target(&opt.config.target)?;
    match build(source, opt)? {
        Library::Cpu(c) => Ok(*c),
        Library::Gpu(_) | Library::Batched(_) => Err(DriverError::Io(
            "a CPU target built another kind of library (a bug in mlopt's driver)".into(),
        )),
    }
}

/// Runs the pipeline for a GPU target.
pub fn compile_gpu<'a>(
    source: impl Into<Source<'a>>,
    opt: &'a Options,
) -> Result<crate::GpuCompiled> {
    gpu_target(&opt.config.target)?;
    match build(source, opt)? {
        Library::Gpu(c) => Ok(*c),
        Library::Cpu(_) | Library::Batched(_) => Err(DriverError::Io(
            "a GPU target built a CPU library (a bug in mlopt's driver)".into(),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is indexed by the stage, every stage has a distinct name that parses back, and the
    /// names of what they make parse too.
    #[test]
    fn stages_are_one_table_in_order() {
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            assert_eq!(stage as usize, i);
            assert_eq!(stage.name().parse::<Stage>(), Ok(stage));
        }
        for (alias, stage) in [("optimized", Stage::Optimize), ("code", Stage::Codegen)] {
            assert_eq!(alias.parse::<Stage>(), Ok(stage));
        }
        assert!("egg".parse::<Stage>().is_err());
    }
}
