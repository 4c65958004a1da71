//! `mlopt`: the command-line front end. Each subcommand is a thin layer over the library crates; errors
//! are reported with their context and exit code 2, a failed `check` exits 1.

mod compare;
mod data;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use mlopt_ir::interp;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "mlopt", version, about = "An ahead-of-time compiler for ONNX models")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Stage {
    /// The graph IR right after import (shapes pinned, constants folded).
    Import,
    /// After equality saturation, extraction and fusion: kernels marked, with cost estimates.
    Optimized,
}

/// The optimiser's options, shared by `inspect`, `compile`, `run` and `check`.
#[derive(clap::Args, Debug, Clone)]
struct OptArgs {
    /// host, x86-64-v3, x86-64-v4, sm_80, sm_86, sm_89 or sm_90.
    #[arg(long, default_value = "host")]
    target: String,
    /// Threads the CPU code will use (scales the CPU roofline).
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// fp32, bf16, fp16 or auto (low precision where it pays, checked against fp32 within --tolerance).
    #[arg(long, default_value = "fp32")]
    precision: mlopt_rewrite::Precision,
    /// Prefer recomputation to keep peak activation memory under this many bytes.
    #[arg(long, value_name = "BYTES")]
    memory_budget: Option<u64>,
    /// --precision auto: largest error allowed, relative to each output's largest magnitude.
    #[arg(long, default_value_t = 1e-2)]
    tolerance: f64,
    /// --precision auto: check on the inputs in DIR (ONNX test-data layout, input_K.pb) instead of random ones.
    #[arg(long, value_name = "DIR")]
    calibration: Option<PathBuf>,
    /// Equality-saturation limits.
    #[arg(long, default_value_t = 12)]
    iter_limit: usize,
    #[arg(long, default_value_t = 200_000)]
    node_limit: usize,
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    time_limit: f64,
}

impl OptArgs {
    fn config(&self, names: &[String]) -> Result<mlopt_rewrite::Config> {
        let target = mlopt_cost::Target::named(&self.target, self.threads)?;
        let mut cfg = mlopt_rewrite::Config::new(target);
        cfg.precision = self.precision;
        cfg.memory_budget = self.memory_budget;
        cfg.tolerance = self.tolerance;
        cfg.limits = mlopt_rewrite::Limits { iterations: self.iter_limit, nodes: self.node_limit, time: std::time::Duration::from_secs_f64(self.time_limit.max(0.0)) };
        cfg.progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
        if let Some(dir) = &self.calibration {
            let (inputs, _) = data::read_test_dir(dir, names).with_context(|| format!("reading calibration inputs from {}", dir.display()))?;
            cfg.calibration = vec![inputs];
        }
        Ok(cfg)
    }

    fn optimize(&self, g: &mlopt_ir::Graph, names: &[String]) -> Result<(mlopt_rewrite::Optimized, mlopt_rewrite::Config)> {
        let cfg = self.config(names)?;
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
        #[arg(long, value_enum, default_value = "import")]
        stage: Stage,
        #[command(flatten)]
        opt: OptArgs,
    },
    /// Optimise a model for a target and write the optimised graph and report.json to the output
    /// directory. (Native code generation comes with the kernel IR; today this stops after fusion.)
    Compile {
        model: PathBuf,
        #[arg(long = "input-shape", value_name = "NAME=DIMS")]
        input_shapes: Vec<String>,
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
    /// Evaluate a model on input tensors and print or write its outputs.
    Run {
        model: PathBuf,
        /// An input tensor, NAME=FILE or FILE (positional), as .pb (TensorProto) or .npy (repeatable).
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
    /// Run a model on DIR/input_K.pb and compare with DIR/output_K.pb (ONNX's test data layout).
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
        #[command(flatten)]
        opt: OptArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Inspect { model, input_shapes, stage, opt } => {
            let m = data::load(&model)?;
            let g = data::import(&m, &model, &input_shapes, &HashMap::new())?;
            match stage {
                Stage::Import => print!("; mlopt graph @{} after \"import\"\n{}", mlopt_ir::print::ident(&g.name), mlopt_ir::print::print(&g)),
                Stage::Optimized => {
                    let (o, cfg) = opt.optimize(&g, &data::input_names(&m)?)?;
                    print!("{}", mlopt_rewrite::report::dump(&o, &cfg));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Compile { model, input_shapes, output, report, opt } => {
            let start = std::time::Instant::now();
            let m = data::load(&model)?;
            let g = data::import(&m, &model, &input_shapes, &HashMap::new())?;
            let (o, cfg) = opt.optimize(&g, &data::input_names(&m)?)?;
            std::fs::create_dir_all(&output).with_context(|| format!("creating {}", output.display()))?;
            let ir = output.join(format!("{}.optimized.mlir", file_stem(&g.name)));
            std::fs::write(&ir, mlopt_rewrite::report::dump(&o, &cfg)).with_context(|| format!("writing {}", ir.display()))?;
            let json = output.join("report.json");
            let mem = mlopt_lower::plan_memory(&o.plan.graph).context("planning memory")?;
            let extra = [("arena_bytes", mem.arena_bytes.to_string()), ("in_place", mem.in_place.len().to_string())];
            std::fs::write(&json, mlopt_rewrite::report::json(&o, &cfg, &extra)).with_context(|| format!("writing {}", json.display()))?;
            if report {
                print!("{}", mlopt_rewrite::report::header(&o, &cfg));
                print!("{}", mlopt_rewrite::report::table(&o));
                println!(
                    "activation arena: {:.3} MB for {} stored values ({} written in place, {} views; {:.3} MB without reuse)",
                    mem.arena_bytes as f64 / 1e6,
                    mem.slots.len(),
                    mem.in_place.len(),
                    mem.aliases.len(),
                    mem.unshared_bytes as f64 / 1e6
                );
            }
            eprintln!("wrote {} and {} in {:.2} s (code generation is not implemented yet: this build stops after fusion)", ir.display(), json.display(), start.elapsed().as_secs_f64());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Calibrate => {
            let c = mlopt_cost::calibrate::measure();
            let path = mlopt_cost::calibrate::store(&c).context("writing the calibration cache")?;
            println!("fp32 FMA: {:.1} GFLOP/s per core", c.fp32 / 1e9);
            println!("bf16 dot: {:.1} GFLOP/s per core", c.bf16 / 1e9);
            println!("read bandwidth: {:.1} GB/s one core, {:.1} GB/s all cores", c.bw_one / 1e9, c.bw_all / 1e9);
            println!("wrote {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run { model, inputs, input_shapes, output_dir, format } => {
            let m = data::load(&model)?;
            let names = data::input_names(&m)?;
            let given = data::read_inputs(&inputs, &names)?;
            let g = data::import(&m, &model, &input_shapes, &given)?;
            let outs = interp::run(&g, &given).context("evaluating the model")?;
            for (name, t) in &outs {
                println!("{name}: {t}");
            }
            if let Some(dir) = output_dir {
                data::write_outputs(&dir, &outs, format)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check { model, data: dir, rtol, atol, optimized, opt } => check(&model, &dir, rtol, atol, optimized.then_some(&opt)),
    }
}

/// A file name for output named after the model's graph: the graph name comes from the model file, so
/// anything but letters, digits, `_` and `-` becomes `_` (so no path separators and no `..`).
fn file_stem(graph_name: &str) -> String {
    let s: String = graph_name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if s.is_empty() { "model".into() } else { s }
}

fn check(model: &Path, dir: &Path, rtol: f64, atol: f64, opt: Option<&OptArgs>) -> Result<ExitCode> {
    let m = data::load(model)?;
    let names = data::input_names(&m)?;
    let (inputs, expected) = data::read_test_dir(dir, &names)?;
    let mut g = data::import(&m, model, &[], &inputs)?;
    if let Some(opt) = opt {
        g = opt.optimize(&g, &names)?.0.plan.graph;
    }
    let outs = interp::run(&g, &inputs).context("evaluating the model")?;
    if outs.len() != expected.len() {
        anyhow::bail!("the model has {} outputs, {} has {} expected outputs", outs.len(), dir.display(), expected.len());
    }
    let mut ok = true;
    for ((name, got), want) in outs.iter().zip(&expected) {
        let r = compare::compare(got, want, rtol, atol);
        println!("{name}: {r}");
        ok &= r.pass;
    }
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
