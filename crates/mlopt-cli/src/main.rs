//! `mlopt`: the command-line front end. Each subcommand is a thin layer over the library crates; errors
//! are reported with their context and exit code 2, a failed `check` exits 1.

/// Writes to standard output, returning the write's error: a reader that went away (`mlopt inspect
/// m.onnx | head`) ends the command quietly, as it ends other Unix tools, where `print!` would panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        std::io::stdout().lock().write_all(crate::terminal_safe(&format!($($arg)*)).as_bytes())
    }};
}

/// `out!` with a newline.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*) + "\n";
        std::io::stdout().lock().write_all(crate::terminal_safe(&line).as_bytes())
    }};
}

/// `eprintln!` through `terminal_safe`.
macro_rules! errln {
    ($($arg:tt)*) => {{
        eprintln!("{}", crate::terminal_safe(&format!($($arg)*)))
    }};
}

mod bench;
mod data;

use anyhow::{bail, Context, Result};
use bench::Bench;
use clap::{Parser, Subcommand};
use mlopt_driver::compare;
use mlopt_ir::interp;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "mlopt",
    version,
    about = "An ahead-of-time compiler for ONNX models"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--stage`: every stage of the pipeline, by its name or the name of what it makes.
fn stage_parser() -> impl clap::builder::TypedValueParser<Value = mlopt_driver::Stage> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = mlopt_driver::Stage::ALL.map(|st| {
        let v = PossibleValue::new(st.name()).help(st.about());
        match st.output_name() {
            Some(alias) => v.alias(alias),
            None => v,
        }
    });
    PossibleValuesParser::new(values).try_map(|s| s.parse::<mlopt_driver::Stage>())
}

/// The optimiser's options, shared by `inspect`, `compile`, `run` and `check`.
#[derive(clap::Args, Debug, Clone)]
pub struct OptArgs {
    /// host, x86-64-v3, x86-64-v4, znver4, sapphirerapids, sm_80, sm_86, sm_89 or sm_90.
    #[arg(long, default_value = "host")]
    target: String,
    /// Threads the CPU code will use (scales the CPU roofline).
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// fp32, bf16, fp16, auto (low precision where it pays, checked against fp32 within --tolerance) or
    /// int8 (mlopt quantizes the convolutions and MatMuls that run in integers, on ranges calibrated on
    /// --calibration's inputs, and reports each output's error against fp32).
    #[arg(long, default_value = "fp32")]
    precision: mlopt_rewrite::Precision,
    /// Prefer recomputation to keep peak activation memory under this many bytes.
    #[arg(long, value_name = "BYTES")]
    memory_budget: Option<u64>,
    /// --precision auto: largest error allowed, relative to each output's largest magnitude.
    #[arg(long, default_value_t = 1e-2)]
    tolerance: f64,
    /// --precision auto: check on the inputs in DIR (ONNX test-data layout, input_K.pb) instead of random
    /// ones; --precision int8: calibrate on them. DIR holds one set, or several in subdirectories
    /// (test_data_set_0, test_data_set_1, ..).
    #[arg(long, value_name = "DIR")]
    calibration: Option<PathBuf>,
    /// Equality-saturation limits.
    #[arg(long, default_value_t = 12)]
    iter_limit: usize,
    #[arg(long, default_value_t = 200_000)]
    node_limit: usize,
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    time_limit: f64,
    /// Time candidate contraction tiles on this machine and keep the fastest (cached per shape).
    #[arg(long)]
    tune: bool,
    /// When 3x3 stride-1 convolutions with 16+ channels are lowered by Winograd F(2x2, 3x3): auto (where
    /// the cost model rates it faster than the direct kernel), always or never.
    #[arg(long, default_value = "auto", value_name = "WHEN")]
    winograd: mlopt_schedule::Winograd,
}

impl OptArgs {
    fn config(&self, ports: &data::Ports) -> Result<mlopt_rewrite::Config> {
        let target = mlopt_target::Target::named(&self.target, self.threads)?;
        let mut cfg = mlopt_rewrite::Config::new(target);
        cfg.precision = self.precision;
        cfg.memory_budget = self.memory_budget;
        cfg.tolerance = self.tolerance;
        cfg.limits = mlopt_rewrite::Limits {
            iterations: self.iter_limit,
            nodes: self.node_limit,
            time: std::time::Duration::try_from_secs_f64(self.time_limit.max(0.0))
                .unwrap_or(std::time::Duration::MAX),
        };
        cfg.progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
        if let Some(dir) = &self.calibration {
            cfg.calibration = data::read_input_sets(dir, ports)
                .with_context(|| format!("reading calibration inputs from {}", dir.display()))?;
        }
        Ok(cfg)
    }

    /// The driver's options: the optimiser's configuration, whose target (looked up once) every stage uses.
    fn driver(&self, ports: &data::Ports) -> Result<mlopt_driver::Options> {
        Ok(mlopt_driver::Options {
            config: self.config(ports)?,
            tune: self.tune,
            winograd: self.winograd,
            profile: false,
            dumps: false,
            probe: false,
        })
    }

    fn optimize(
        &self,
        g: &mlopt_ir::Graph,
        ports: &data::Ports,
    ) -> Result<(mlopt_rewrite::Optimized, mlopt_rewrite::Config)> {
        let cfg = self.config(ports)?;
        let o = mlopt_rewrite::optimize(g, &cfg).context("optimising")?;
        Ok((o, cfg))
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the graph IR of a model after a pipeline stage.
    Inspect {
        model: PathBuf,
        /// Pin an input's shape: NAME=1x3x224x224 (repeatable).
        #[arg(long = "input-shape", value_name = "NAME=DIMS")]
        input_shapes: Vec<String>,
        /// Fix an input to a value, NAME=V or NAME=V,V,.. (its declared shape and type): it becomes a
        /// constant, no longer an input of the compiled code, and what it decides folds (an If on it).
        /// NAME=none leaves an optional input empty.
        #[arg(long = "input-value", value_name = "NAME=VALUE")]
        input_values: Vec<String>,
        #[arg(long, default_value = "import", value_parser = stage_parser())]
        stage: mlopt_driver::Stage,
        #[command(flatten)]
        opt: OptArgs,
    },
    /// Compile a model into OUTPUT/lib<name>.a with OUTPUT/<name>.h (C API), OUTPUT/<name>.rs (Rust
    /// binding), <name>.report.json and every stage's dump (<name>.import.gir, .optimized.gir, .lowered.kir,
    /// .scheduled.kir, and .ll or .ptx). <name> is --name, else the model file's name.
    Compile {
        model: PathBuf,
        /// The library's name, a C identifier: its files (lib<name>.a, <name>.h), symbols
        /// (mlopt_<name>_run) and macros (MLOPT_<NAME>_...). Default: the model file's name without
        /// .onnx, with each character other than a letter, digit or _ made _ (never the graph's name
        /// inside the file: every PyTorch export calls it main_graph). Give each model linked into one
        /// program its own.
        #[arg(long)]
        name: Option<String>,
        /// A dynamic batch: SYMBOL=BOUND, where SYMBOL is a leading dimension of --input-shape
        /// (x=Nx3x224x224) or the name of the inputs' symbolic first dimension, and BOUND the most
        /// items one run takes. The library's run takes the batch size (mlopt_<name>_run(ctx, n, ..)).
        #[arg(long, value_name = "SYMBOL=BOUND")]
        max: Option<String>,
        #[arg(long = "input-shape", value_name = "NAME=DIMS")]
        input_shapes: Vec<String>,
        /// Fix an input to a value, NAME=V or NAME=V,V,.. (its declared shape and type): it becomes a
        /// constant, no longer an input of the compiled code, and what it decides folds (an If on it).
        /// NAME=none leaves an optional input empty.
        #[arg(long = "input-value", value_name = "NAME=VALUE")]
        input_values: Vec<String>,
        #[arg(short, long, default_value = "out")]
        output: PathBuf,
        /// Print the per-kernel report.
        #[arg(long)]
        report: bool,
        #[command(flatten)]
        opt: OptArgs,
    },
    /// Measure this machine's FMA throughput and memory bandwidth for the host target's cost model.
    Calibrate,
    /// Compile a model, run it on input tensors and print or write its outputs (--interpret: evaluate the
    /// imported graph with the reference interpreter instead).
    Run {
        model: PathBuf,
        #[arg(long)]
        interpret: bool,
        #[command(flatten)]
        opt: OptArgs,
        /// An input tensor as .pb (TensorProto) or .npy: NAME=FILE, or FILE for the model's next input in
        /// order (repeatable; every input is a --input, not a bare argument).
        #[arg(long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        #[arg(long = "input-shape", value_name = "NAME=DIMS")]
        input_shapes: Vec<String>,
        /// Write each output to DIR/<name>.npy (or .pb with --format pb).
        #[arg(long)]
        output_dir: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "npy")]
        format: data::Format,
    },
    /// Run a model on DIR/input_K.pb and compare with DIR/output_K.pb (ONNX's test data layout): each
    /// value within --atol + --rtol * |expected|, or, when the optimised or compiled model runs at a
    /// low --precision (bf16, fp16, auto, int8), each output's scaled error (largest difference over its
    /// largest magnitude, at least 1) within --tolerance, the measure --precision auto accepts by.
    Check {
        model: PathBuf,
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value_t = 1e-3)]
        rtol: f64,
        #[arg(long, default_value_t = 1e-7)]
        atol: f64,
        /// Evaluate the optimised graph for this target instead of the imported one.
        #[arg(long)]
        optimized: bool,
        /// Compile the model for this target and run the compiled code.
        #[arg(long, conflicts_with = "optimized")]
        compiled: bool,
        /// Lower the model with GPU schedules for this target (sm_XX) and run them in the kernel IR's
        /// emulator (grid, threads, shared memory, barriers; races are errors); their PTX must also
        /// assemble with ptxas (when installed) without spills.
        #[arg(long, conflicts_with_all = ["optimized", "compiled"])]
        emulated: bool,
        /// With --optimized, --compiled or --emulated: also compare every value a kernel writes with
        /// the interpreter's value of the ONNX node it computes, by the same rule, and name the first
        /// node out of tolerance with both values (the outputs are still checked as without it).
        #[arg(long)]
        per_node: bool,
        #[command(flatten)]
        opt: OptArgs,
    },
    /// Compile a model and measure the latency of the compiled code (random inputs unless --input).
    Bench {
        model: PathBuf,
        #[arg(long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        #[arg(long = "input-shape", value_name = "NAME=DIMS")]
        input_shapes: Vec<String>,
        /// Fix an input to a value, NAME=V or NAME=V,V,.. (as compile does): the benchmark runs the
        /// library compile would write.
        #[arg(long = "input-value", value_name = "NAME=VALUE")]
        input_values: Vec<String>,
        /// Timed runs (after 3 warm-up runs), 1 to 1,000,000.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=MAX_ITERS))]
        iters: u64,
        /// Print one JSON line instead of text.
        #[arg(long)]
        json: bool,
        /// Build with a clock reading around each kernel and print, per kernel (slowest first), its
        /// measured time, share, the cost model's estimate, GFLOP/s, GB/s, bound, schedule class and
        /// fraction of the roofline; writes OUTPUT/roofline.svg with the measured points.
        #[arg(long)]
        profile: bool,
        /// Compile at each batch size (the leading dimension of inputs whose first dimension is symbolic or
        /// given by --input-shape) and print latency (median, p90, p99) and throughput at 1 and at all
        /// threads; writes OUTPUT/batch.svg.
        #[arg(long, value_delimiter = ',', value_name = "B,B,...")]
        batch: Vec<u64>,
        /// With --batch: mark the largest batch whose p99 latency meets this budget.
        #[arg(long, value_name = "MS", requires = "batch")]
        max_latency_ms: Option<f64>,
        /// Where --profile and --batch write their SVG plots.
        #[arg(short, long, default_value = "out")]
        output: PathBuf,
        #[command(flatten)]
        opt: OptArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("error: {}", message(&e));
            ExitCode::from(2)
        }
    }
}

/// Text for the terminal: names inside it come from model files and file names, so control characters
/// (an escape sequence retitles or recolours a terminal) are shown escaped, `\u{1b}`; newlines and tabs
/// stay.
fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out.into()
}

/// The longest error message printed whole: names and shapes in one come from the model or its inputs,
/// and a message past this is cut, saying how much was left out.
const MAX_MESSAGE: usize = 4096;

/// `msg` cut to `MAX_MESSAGE` characters, saying how many were left out.
fn bounded(msg: String) -> String {
    let n = msg.chars().count();
    if n <= MAX_MESSAGE {
        return msg;
    }
    let head: String = msg.chars().take(MAX_MESSAGE).collect();
    format!("{head}... ({} more characters)", n - MAX_MESSAGE)
}

/// Whether `e` is standard output's reader having gone away.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The error and its causes, joined by ": ", leaving out a cause whose text the message already holds
/// (the library errors that wrap another print it themselves).
fn message(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    bounded(msg)
}

/// The most timed runs `bench --iters` takes: each keeps a time, and a run takes at least microseconds.
const MAX_ITERS: u64 = 1_000_000;

/// `mlopt compile`: the library, its report and every stage's text, written into `output` all or none.
fn compile(
    model: &std::path::Path,
    (name, max): (Option<&str>, Option<&str>),
    (input_shapes, input_values): (&[String], &[String]),
    output: &std::path::Path,
    report: bool,
    opt: &OptArgs,
) -> Result<ExitCode> {
    let start = std::time::Instant::now();
    let (name, name_from) = data::library_name(model, name)?;
    let m = data::load(model)?;
    let mut options = opt.driver(&data::ports(&m)?)?;
    options.dumps = true;
    let import = |shapes: &[String]| -> Result<mlopt_onnx::ImportOptions> {
        let mut import = data::import_options(shapes, &Default::default())?;
        data::pin_values(&mut import, &m, input_values)?;
        Ok(import)
    };
    let lib = match max {
        None => {
            let import = import(input_shapes)?;
            mlopt_driver::build(data::source(&m, model, &name, &import), &options)?
        }
        Some(flag) => {
            let (sym, bound) = data::parse_max(flag)?;
            if options.config.target.is_gpu() {
                bail!("--max: a dynamic batch is for CPU targets");
            }
            let mut variants = Vec::new();
            for b in mlopt_driver::batch::variant_sizes(bound) {
                let import = import(&data::shapes_at(&m, input_shapes, &sym, b)?)?;
                let variant = format!("{name}_b{b}");
                let source = data::source(&m, model, &variant, &import);
                variants.push((b, mlopt_driver::compile(source, &options)?));
            }
            mlopt_driver::Library::Batched(Box::new(mlopt_driver::batch::Batched::new(
                &name, &sym, bound, variants,
            )?))
        }
    };
    let compile_s = start.elapsed().as_secs_f64();
    // The report is written with the library, all files or none.
    // (Named after the library too, so several models compiled into one folder keep their own.)
    let report_file = format!("{name}.report.json");
    let json = output.join(&report_file);
    let summary = lib.report(compile_s);
    let mut files = vec![(report_file.clone(), summary.json.into_bytes())];
    if let Some(svg) = lib
        .roofline(&format!("{}: estimated roofline", bench::label(model)))
        .filter(|_| report)
    {
        files.push((format!("{name}.roofline.svg"), svg.into_bytes()));
    }
    let written = lib.write(output, lib.name(), &files)?;
    if report {
        out!("{}", summary.text)?;
    }
    for p in written.iter().filter(|p| !p.ends_with(&report_file)) {
        errln!("wrote {}", p.display());
    }
    for note in lib.notes() {
        errln!("{note}");
    }
    if let Some(q) = data::quantized_ops(&m) {
        errln!("note: the model is quantized ({q}); a Conv (one group) or MatMul of dequantized 8-bit operands runs as an integer contraction where the CPU has an integer dot product and the cost model prices it faster, as do QLinearConv, ConvInteger (one group), QLinearMatMul and MatMulInteger always; every other op computes in float with ONNX's rounding and saturation (fake quantization)");
    }
    errln!(
        "wrote {}; compiled {name} (named by {name_from}) for {} in {compile_s:.2} s",
        json.display(),
        lib.target_name()
    );
    Ok(ExitCode::SUCCESS)
}

/// `mlopt calibrate`: measures this CPU, checks the figures and stores them for `--target host`.
fn calibrate() -> Result<ExitCode> {
    use mlopt_target::calibrate;
    let c = calibrate::measure()?;
    let path = calibrate::store(&c, 0).context("writing the calibration cache")?;
    let (fp32_max, bf16_max) = calibrate::per_cycle_limits(&calibrate::host_features());
    let per_cycle = |flops: f64| flops / (c.ghz * 1e9);
    outln!("cpu: {}", calibrate::cpu_model())?;
    outln!("clock: {:.2} GHz (dependent adds)", c.ghz)?;
    outln!(
        "fp32 FMA: {:.1} GFLOP/s per core ({:.1} FLOP/cycle of at most {fp32_max})",
        c.fp32 / 1e9,
        per_cycle(c.fp32)
    )?;
    if bf16_max > 0.0 {
        outln!(
            "bf16 dot: {:.1} GFLOP/s per core ({:.1} FLOP/cycle of at most {bf16_max}; {:.2}x the fp32 FMAs)",
            c.bf16 / 1e9,
            per_cycle(c.bf16),
            c.bf16 / c.fp32
        )?;
    } else {
        outln!("bf16 dot: none (no AVX512-BF16)")?;
    }
    outln!(
        "read bandwidth: {:.1} GB/s one core, {:.1} GB/s all cores",
        c.bw_one / 1e9,
        c.bw_all / 1e9
    )?;
    outln!("wrote {}", path.display())?;
    Ok(ExitCode::SUCCESS)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Inspect {
            model,
            input_shapes,
            input_values,
            stage,
            opt,
        } => {
            let m = data::load(&model)?;
            let mut import = data::import_options(&input_shapes, &Default::default())?;
            data::pin_values(&mut import, &m, &input_values)?;
            let (name, _) = data::library_name(&model, None)?;
            let source = data::source(&m, &model, &name, &import);
            let options = opt.driver(&data::ports(&m)?)?;
            out!("{}", mlopt_driver::inspect(source, &options, stage)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Compile {
            model,
            name,
            max,
            input_shapes,
            input_values,
            output,
            report,
            opt,
        } => compile(
            &model,
            (name.as_deref(), max.as_deref()),
            (&input_shapes, &input_values),
            &output,
            report,
            &opt,
        ),
        Cmd::Calibrate => calibrate(),
        Cmd::Run {
            model,
            interpret,
            opt,
            inputs,
            input_shapes,
            output_dir,
            format,
        } => {
            let m = data::load(&model)?;
            let ports = data::ports(&m)?;
            let given = data::read_inputs(&inputs, &ports)?;
            let g = data::import(&m, &model, (&input_shapes, &[]), &given)?;
            let outs = if interpret {
                interp::run(&g, &given.tensors).context("evaluating the model")?
            } else {
                let c = mlopt_driver::compile(&g, &opt.driver(&ports)?)?;
                c.run(&mut c.load()?, &given.tensors)?
            };
            for (name, t) in &outs {
                outln!("{name}: {t}")?;
            }
            if let Some(dir) = output_dir {
                data::write_outputs(&dir, &outs, format)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            model,
            inputs,
            input_shapes,
            input_values,
            iters,
            json,
            profile,
            batch,
            max_latency_ms,
            output,
            opt,
        } => {
            let b = Bench {
                model: &model,
                inputs: &inputs,
                input_shapes: &input_shapes,
                input_values: &input_values,
                // At most MAX_ITERS (clap's range), so this fits any usize.
                iters: iters as usize,
                json,
                output: &output,
                opt: &opt,
            };
            if !batch.is_empty() {
                if profile {
                    bail!("--profile and --batch are separate runs: give one of them");
                }
                return bench::batch_sweep(&b, &batch, max_latency_ms);
            }
            if profile {
                return bench::profile(&b);
            }
            bench::plain(&b)
        }
        Cmd::Check {
            model,
            data: dir,
            rtol,
            atol,
            optimized,
            compiled,
            emulated,
            per_node,
            opt,
        } => {
            if per_node && !(optimized || compiled || emulated) {
                bail!("--per-node compares the optimised, compiled or emulated model with the interpreter: add --optimized, --compiled or --emulated");
            }
            let engine = match (optimized, compiled) {
                _ if emulated => Engine::Emulated(&opt),
                (_, true) => Engine::Compiled(&opt),
                (true, _) => Engine::Optimized(&opt),
                _ => Engine::Interpreter,
            };
            let low = !matches!(opt.precision, mlopt_rewrite::Precision::Fp32);
            let rule = match engine {
                Engine::Interpreter => compare::Rule::AllClose { rtol, atol },
                _ if low => compare::Rule::Scaled(opt.tolerance),
                _ => compare::Rule::AllClose { rtol, atol },
            };
            check(&model, &dir, rule, engine, per_node)
        }
    }
}

/// What `check` runs.
enum Engine<'a> {
    Interpreter,
    Optimized(&'a OptArgs),
    Compiled(&'a OptArgs),
    Emulated(&'a OptArgs),
}

fn check(
    model: &Path,
    dir: &Path,
    rule: compare::Rule,
    engine: Engine,
    per_node: bool,
) -> Result<ExitCode> {
    let m = data::load(model)?;
    let ports = data::ports(&m)?;
    let (given, expected) = data::read_test_dir(dir, &ports)?;
    let g = data::import(&m, model, (&[], &[]), &given)?;
    let inputs = given.tensors;
    let driver = |opt: &OptArgs| -> Result<mlopt_driver::Options> {
        let mut o = opt.driver(&ports)?;
        o.probe = per_node;
        Ok(o)
    };
    // The outputs, and the optimised graph whose kernel outputs follow them (--per-node).
    let (mut outs, fused) = match engine {
        Engine::Interpreter => (
            interp::run(&g, &inputs).context("evaluating the model")?,
            None,
        ),
        Engine::Optimized(opt) => {
            let mut fused = opt.optimize(&g, &ports)?.0.plan.graph;
            if per_node {
                mlopt_driver::probe::add_kernel_outputs(&mut fused);
            }
            let outs = interp::run(&fused, &inputs).context("evaluating the model")?;
            (outs, Some(fused))
        }
        Engine::Compiled(opt) => {
            let c = mlopt_driver::compile(&g, &driver(opt)?)?;
            (
                c.run(&mut c.load()?, &inputs)?,
                Some(c.optimized.plan.graph),
            )
        }
        Engine::Emulated(opt) => {
            // The kernels must become PTX that ptxas assembles without spilling, and match in the emulator.
            let c = mlopt_driver::compile_gpu(&g, &driver(opt)?)
                .context("compiling the GPU kernels")?;
            c.check_spills().context("assembling the GPU kernels")?;
            let outs = mlopt_lower::interpret(&c.program, &inputs)
                .map_err(|e| anyhow::anyhow!("emulating the GPU kernels: {e}"))?;
            (outs, Some(c.optimized.plan.graph))
        }
    };
    let own = g.graph_outputs().len();
    if let (true, Some(fused)) = (per_node, &fused) {
        let r = mlopt_driver::probe::per_node(&g, fused, own, &outs, &inputs, rule)?;
        outln!(
            "per node: {} kernel outputs compared with their ONNX nodes' values ({} made by rewrites, not compared)",
            r.compared,
            r.unmatched
        )?;
        match &r.first_bad {
            Some(b) => outln!(
                "first node out of tolerance: '{}' ({}) in kernel k{}: {}",
                b.node.escape_default(),
                b.op,
                b.kernel,
                b.comparison
            )?,
            None => outln!("every compared node is within tolerance")?,
        }
    }
    outs.truncate(own);
    // Outputs sized by the data: their first `count` entries, and not the counts themselves.
    let outs = mlopt_ir::extent::exact_outputs(&g, &outs).map_err(|e| anyhow::anyhow!(e))?;
    if outs.len() != expected.len() {
        anyhow::bail!(
            "the model has {} outputs, {} has {} expected outputs",
            outs.len(),
            dir.display(),
            expected.len()
        );
    }
    let mut ok = true;
    for ((name, got), want) in outs.iter().zip(&expected) {
        let r = compare::compare(got, want, rule);
        outln!("{name}: {r}")?;
        ok &= r.pass;
    }
    outln!("{}", if ok { "PASS" } else { "FAIL" })?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
