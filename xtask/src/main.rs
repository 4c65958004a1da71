//! Developer tasks, run as `cargo xtask <task>`:
//!
//! - `setup`: install what is missing (apt: LLVM 19 and friends; a project-local venv with the pinned
//!   Python tools), idempotently, saying what it does.
//! - `demo`: set up, build mlopt, and run it on a model shipped in `fixtures/`.
//! - `test`: set up, check style (`cargo fmt --check`, clippy with `-D warnings`), run the whole test
//!   suite (cargo tests, the Python package's pytest tests, the hostile corpus, then the ONNX
//!   conformance suite against the committed lists of passing cases).
//! - `conformance [--update] [--filter S]`: generate ONNX's backend node tests and run `mlopt check` on each.
//! - `fixtures`: rebuild the fixture models and their ONNX Runtime outputs.

mod conformance;
mod hostile;
mod setup;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

pub(crate) type Result<T = ()> = std::result::Result<T, String>;

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Runs a command from the project root, echoing it; fails on a non-zero exit.
pub(crate) fn run(cmd: &mut Command) -> Result {
    eprintln!("$ {}", describe(cmd));
    let status = cmd
        .current_dir(root())
        .status()
        .map_err(|e| format!("{}: {e}", describe(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed with {status}", describe(cmd)))
    }
}

pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Builds the `mlopt` binary and returns its path. The dev profile already optimises (see Cargo.toml), and
/// sharing it with `cargo test` means the workspace is compiled once.
pub(crate) fn build_mlopt() -> Result<PathBuf> {
    run(cargo().args(["build", "--quiet", "-p", "mlopt-cli"]))?;
    Ok(root().join("target/debug/mlopt"))
}

fn demo() -> Result {
    setup::setup()?;
    let mlopt = build_mlopt()?;
    let model = "fixtures/cnn/model.onnx";
    let data = "fixtures/cnn/test_data_set_0";
    println!("\n== mlopt inspect {model}  (the graph IR after import)");
    run(Command::new(&mlopt).args(["inspect", model]))?;
    println!("\n== mlopt compile {model} --name cnn --target host -o target/demo --report  (optimised, fused and compiled for this CPU: target/demo/libcnn.a, cnn.h)");
    run(Command::new(&mlopt).args([
        "compile",
        model,
        "--name",
        "cnn",
        "--target",
        "host",
        "-o",
        "target/demo",
        "--report",
    ]))?;
    println!("\n== mlopt inspect {model} --stage optimized --target sm_80  (the same model planned for an A100)");
    run(Command::new(&mlopt).args([
        "inspect",
        model,
        "--stage",
        "optimized",
        "--target",
        "sm_80",
    ]))?;
    println!("\n== mlopt check {model}  (the imported graph, by the interpreter, against ONNX Runtime's output committed next to the model)");
    run(Command::new(&mlopt).args(["check", model, "--data", data]))?;
    println!("\n== mlopt check {model} --compiled  (the compiled code against the same output)");
    run(Command::new(&mlopt).args([
        "check",
        model,
        "--data",
        data,
        "--compiled",
        "--target",
        "host",
    ]))?;
    println!("\n== mlopt bench {model}  (latency of the compiled code)");
    run(Command::new(&mlopt).args(["bench", model, "--iters", "100"]))?;
    println!("\n== mlopt bench {model} --profile  (time per kernel against the cost model; target/demo/roofline.svg)");
    run(Command::new(&mlopt).args([
        "bench",
        model,
        "--profile",
        "--iters",
        "100",
        "-o",
        "target/demo",
    ]))
}

/// The target the conformance suite's optimised run uses: fixed, so the passing list does not depend on the
/// machine.
const OPTIMIZED_TARGET: &str = "x86-64-v4";

/// The target compiled conformance runs use: this machine (the code must run here).
const COMPILED_TARGET: &str = "host";

/// The GPU target whose schedules the conformance suite runs in the kernel IR's emulator.
const EMULATED_TARGET: &str = "sm_80";

/// The style gate: the tree is `cargo fmt` clean and clippy has nothing to say, warnings included.
fn lint() -> Result {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))
}

/// The tests that need an NVIDIA GPU (ignored by `cargo test`): run where `nvidia-smi` finds one, and
/// said to be skipped where none is, never passed silently.
fn gpu_tests() -> Result {
    let gpu = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    match gpu {
        Some(o) => {
            println!(
                "gpu: running the real-GPU tests on {}",
                String::from_utf8_lossy(&o.stdout).trim()
            );
            run(cargo().args([
                "test",
                "-p",
                "mlopt-tests",
                "--test",
                "gpu",
                "--quiet",
                "--",
                "--ignored",
            ]))
        }
        None => {
            println!("gpu: skipped: no GPU (nvidia-smi found none): tests/tests/gpu.rs's the_gpu_library_runs_on_a_real_gpu did not run; the PTX is checked by ptxas and every GPU schedule by the emulator");
            Ok(())
        }
    }
}

/// The Python package (python/): installed into the venv from the working tree, as a user would with
/// pip, and its tests run against ONNX Runtime with `mlopt` as the compiler.
fn python_tests(mlopt: &std::path::Path) -> Result {
    let py = setup::venv_python();
    run(Command::new(&py).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "./python",
    ]))?;
    run(Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
        .env("MLOPT", mlopt))
}

fn test() -> Result {
    setup::setup()?;
    lint()?;
    run(cargo().args(["test", "--workspace", "--quiet"]))?;
    gpu_tests()?;
    let mlopt = build_mlopt()?;
    python_tests(&mlopt)?;
    let hostile = hostile::run(&mlopt)?;
    println!("hostile corpus (xtask/py/gen_hostile.py): {hostile} cases through inspect, compile, run, run --interpret and check --compiled, 0 failed");
    let (listed, _) = conformance::run_suite(&mlopt, &conformance::Options::default())?;
    let optimized = conformance::Options {
        mode: conformance::Mode::Optimized(OPTIMIZED_TARGET.into()),
        ..Default::default()
    };
    let (listed_opt, _) = conformance::run_suite(&mlopt, &optimized)?;
    let compiled = conformance::Options {
        mode: conformance::Mode::Compiled(COMPILED_TARGET.into()),
        ..Default::default()
    };
    let (listed_comp, _) = conformance::run_suite(&mlopt, &compiled)?;
    let emulated = conformance::Options {
        mode: conformance::Mode::Emulated(EMULATED_TARGET.into()),
        ..Default::default()
    };
    let (listed_emu, _) = conformance::run_suite(&mlopt, &emulated)?;
    // The cases the suite asserts are the ones in the committed passing lists; the others are reported above.
    println!("\nconformance regression suite (tests/conformance/passing.txt, imported graphs):");
    println!("{listed} passed, 0 failed");
    println!("conformance regression suite (tests/conformance/passing-optimized-{OPTIMIZED_TARGET}.txt, optimised graphs):");
    println!("{listed_opt} passed, 0 failed");
    println!("conformance regression suite (tests/conformance/passing-compiled-{COMPILED_TARGET}.txt, compiled code):");
    println!("{listed_comp} passed, 0 failed");
    println!("conformance regression suite (tests/conformance/passing-emulated-{EMULATED_TARGET}.txt, GPU schedules in the emulator):");
    println!("{listed_emu} passed, 0 failed");
    println!(
        "\n{} passed, 0 failed",
        listed + listed_opt + listed_comp + listed_emu
    );
    Ok(())
}

fn fixtures() -> Result {
    setup::setup()?;
    run(Command::new(setup::venv_python()).args(["fixtures/make_fixtures.py", "fixtures"]))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::setup(),
        Some("demo") => demo(),
        Some("test") => test(),
        Some("fixtures") => fixtures(),
        Some("hostile") => setup::setup().and_then(|_| build_mlopt()).and_then(|m| hostile::run(&m)).map(|n| println!("{n} hostile cases, 0 failed")),
        Some("conformance") => conformance::Options::parse(&args[1..]).and_then(|o| conformance::conformance(&o).map(|_| ())),
        _ => Err("usage: cargo xtask <setup|demo|test|hostile|conformance [--update] [--filter S] [--optimized TARGET | --compiled TARGET]|fixtures>".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
