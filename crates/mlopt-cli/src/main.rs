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
    },
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
        Cmd::Inspect { model, input_shapes, stage } => {
            let g = data::import(&data::load(&model)?, &model, &input_shapes, &HashMap::new())?;
            let stage = match stage {
                Stage::Import => "import",
            };
            print!("; mlopt graph @{} after \"{stage}\"\n{}", mlopt_ir::print::ident(&g.name), mlopt_ir::print::print(&g));
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
        Cmd::Check { model, data: dir, rtol, atol } => check(&model, &dir, rtol, atol),
    }
}

fn check(model: &Path, dir: &Path, rtol: f64, atol: f64) -> Result<ExitCode> {
    let m = data::load(model)?;
    let names = data::input_names(&m)?;
    let (inputs, expected) = data::read_test_dir(dir, &names)?;
    let g = data::import(&m, model, &[], &inputs)?;
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
