//! ONNX backend node conformance: generate the suite with the pinned `onnx` package, run `mlopt check` on
//! every case (every data set), and report `N passed, M failed`, a per-op table and each failure's
//! reason. The cases listed in `tests/conformance/passing.txt` must keep passing; `--update` rewrites it.

use crate::{build_mlopt, root, run, setup, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Ops the interpreter must cover: each needs at least one passing ONNX test case.
const REQUIRED_OPS: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "BatchNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Clip",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "Erf",
    "Gelu",
    "Softplus",
    "Softmax",
    "LogSoftmax",
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Neg",
    "Abs",
    "Floor",
    "Ceil",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Equal",
    "Greater",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
    "Where",
    "Not",
    "And",
    "Or",
    "Cast",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "Pad",
    "Resize",
    "Upsample",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "LRN",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL2",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
    "Shape",
    "ConstantOfShape",
    "Range",
    "Identity",
    "Dropout",
];

#[derive(Debug, Default)]
pub(crate) struct Options {
    pub update: bool,
    pub filter: Option<String>,
    /// What runs each case; every mode has its own passing list.
    pub mode: Mode,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) enum Mode {
    /// The imported graph, by the reference interpreter.
    #[default]
    Imported,
    /// The optimised graph for a target (`--optimized TARGET`), by the reference interpreter.
    Optimized(String),
    /// Compiled code for a CPU target (`--compiled TARGET`), loaded and run.
    Compiled(String),
    /// GPU schedules for a GPU target (`--emulated TARGET`), run by the kernel IR's emulator.
    Emulated(String),
}

impl Mode {
    fn args(&self) -> Vec<String> {
        match self {
            Mode::Imported => vec![],
            Mode::Optimized(t) => vec!["--optimized".into(), "--target".into(), t.clone()],
            Mode::Compiled(t) => vec!["--compiled".into(), "--target".into(), t.clone()],
            Mode::Emulated(t) => vec!["--emulated".into(), "--target".into(), t.clone()],
        }
    }
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--update" => o.update = true,
                "--filter" => o.filter = Some(it.next().ok_or("--filter needs a value")?.clone()),
                "--optimized" => {
                    o.mode = Mode::Optimized(it.next().ok_or("--optimized needs a target")?.clone())
                }
                "--compiled" => {
                    o.mode = Mode::Compiled(it.next().ok_or("--compiled needs a target")?.clone())
                }
                "--emulated" => {
                    o.mode =
                        Mode::Emulated(it.next().ok_or("--emulated needs a GPU target")?.clone())
                }
                other => return Err(format!("conformance: unknown argument {other}")),
            }
        }
        Ok(o)
    }
}

struct Case {
    name: String,
    rtol: String,
    atol: String,
    data_sets: usize,
    ops: Vec<String>,
}

#[derive(Debug, Clone)]
enum Outcome {
    Pass,
    Fail(String),
}

fn suite_dir() -> PathBuf {
    root().join("target/onnx-node-tests")
}

/// Generates the suite unless it is there for the pinned onnx version.
fn generate() -> Result<Vec<Case>> {
    let dir = suite_dir();
    let stamp = dir.join("stamp");
    let req = std::fs::read_to_string(root().join("xtask/py/requirements.txt"))
        .map_err(|e| e.to_string())?;
    let pin = req
        .lines()
        .find(|l| l.starts_with("onnx=="))
        .unwrap_or("onnx")
        .to_string();
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pin.as_str()) {
        eprintln!("conformance: generating ONNX's node tests with {pin}");
        run(Command::new(setup::venv_python())
            .arg("xtask/py/gen_node_tests.py")
            .arg(&dir))?;
        std::fs::write(&stamp, &pin).map_err(|e| e.to_string())?;
    }
    let manifest =
        std::fs::read_to_string(dir.join("manifest.tsv")).map_err(|e| format!("manifest: {e}"))?;
    Ok(manifest
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() == 5).then(|| Case {
                name: f[0].into(),
                rtol: f[1].into(),
                atol: f[2].into(),
                data_sets: f[3].parse().unwrap_or(1),
                ops: f[4]
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            })
        })
        .collect())
}

/// The first line of `mlopt check`'s output that says what went wrong.
fn reason(code: Option<i32>, stdout: &str, stderr: &str) -> String {
    let line = |s: &str, pat: &[&str]| {
        s.lines()
            .find(|l| pat.iter().any(|p| l.contains(p)))
            .map(str::to_string)
    };
    match code {
        Some(1) => format!(
            "wrong output: {}",
            line(stdout, &["MISMATCH"]).unwrap_or_default()
        ),
        Some(2) => {
            let msg = line(stderr, &["error"]).unwrap_or_default();
            let msg = msg.trim_start_matches("error: ");
            if msg.contains(") is not supported") && msg.contains("(domain") {
                format!("unsupported op: {msg}")
            } else if msg.contains("data type") && msg.contains("not supported") {
                format!("unsupported dtype: {msg}")
            } else {
                format!("error: {msg}")
            }
        }
        _ => format!(
            "crash ({code:?}): {}",
            line(stderr, &["panicked", "error"]).unwrap_or_default()
        ),
    }
}

fn check_case(mlopt: &Path, case: &Case, mode: &[String]) -> Outcome {
    let dir = suite_dir().join(&case.name);
    for k in 0..case.data_sets {
        let mut cmd = Command::new(mlopt);
        cmd.arg("check")
            .arg(dir.join("model.onnx"))
            .arg("--data")
            .arg(dir.join(format!("test_data_set_{k}")))
            .args(["--rtol", &case.rtol, "--atol", &case.atol]);
        cmd.args(mode);
        let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return Outcome::Fail(format!("crash: {e}")),
        };
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() > TIMEOUT => {
                    let _ = child.kill();
                    return Outcome::Fail(format!("timeout after {}s", TIMEOUT.as_secs()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Outcome::Fail(format!("crash: {e}")),
            }
        };
        let out = match child.wait_with_output() {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("crash: {e}")),
        };
        if !status.success() {
            let (so, se) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            return Outcome::Fail(reason(status.code(), &so, &se));
        }
    }
    Outcome::Pass
}

fn passing_list(o: &Options) -> PathBuf {
    match &o.mode {
        Mode::Imported => root().join("tests/conformance/passing.txt"),
        Mode::Optimized(t) => root().join(format!("tests/conformance/passing-optimized-{t}.txt")),
        Mode::Compiled(t) => root().join(format!("tests/conformance/passing-compiled-{t}.txt")),
        Mode::Emulated(t) => root().join(format!("tests/conformance/passing-emulated-{t}.txt")),
    }
}

/// Sets up, builds `mlopt` and runs the suite; returns (cases in the passing list that passed, cases run).
pub(crate) fn conformance(o: &Options) -> Result<(usize, usize)> {
    setup::setup()?;
    run_suite(&build_mlopt()?, o)
}

/// Runs the suite with the `mlopt` binary at `mlopt` (set-up done by the caller).
pub(crate) fn run_suite(mlopt: &Path, o: &Options) -> Result<(usize, usize)> {
    let mlopt = mlopt.to_path_buf();
    let mut cases = generate()?;
    if let Some(f) = &o.filter {
        cases.retain(|c| c.name.contains(f.as_str()));
    }
    let started = Instant::now();
    let cases = Arc::new(cases);
    let results = Arc::new(Mutex::new(vec![None; cases.len()]));
    let next = Arc::new(Mutex::new(0usize));
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (cases, results, next, mlopt, opt) = (
                cases.clone(),
                results.clone(),
                next.clone(),
                mlopt.clone(),
                o.mode.args(),
            );
            std::thread::spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(case) = cases.get(i) else { break };
                let r = check_case(&mlopt, case, &opt);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let results: Vec<Outcome> = results
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|r| r.clone().unwrap_or(Outcome::Fail("not run".into())))
        .collect();
    report(&cases, &results, o, started.elapsed())
}

fn report(
    cases: &[Case],
    results: &[Outcome],
    o: &Options,
    took: Duration,
) -> Result<(usize, usize)> {
    let mut per_op: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    let mut passed = BTreeSet::new();
    println!("\n== failures");
    for (c, r) in cases.iter().zip(results) {
        let ok = matches!(r, Outcome::Pass);
        for op in &c.ops {
            let e = per_op.entry(op).or_default();
            e.0 += ok as usize;
            e.1 += 1;
        }
        match r {
            Outcome::Pass => {
                passed.insert(c.name.clone());
            }
            Outcome::Fail(why) => {
                *kinds
                    .entry(why.split(':').next().unwrap_or(""))
                    .or_default() += 1;
                println!("{}: {why}", c.name);
            }
        }
    }
    println!("\n== per op (passed/total)");
    let cells: Vec<String> = per_op
        .iter()
        .map(|(op, (p, t))| format!("{op} {p}/{t}"))
        .collect();
    for row in cells.chunks(6) {
        println!("  {}", row.join(" | "));
    }
    println!("\n== failure kinds");
    for (k, n) in &kinds {
        println!("  {k}: {n}");
    }
    let failed = cases.len() - passed.len();
    let list = passing_list(o);
    let mut regressions = vec![];
    let mut listed = passed.len();
    if o.update {
        if let Some(dir) = list.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        let text: String = passed.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(&list, text).map_err(|e| e.to_string())?;
        println!(
            "\nwrote {} passing cases to {}",
            passed.len(),
            list.display()
        );
    } else if o.filter.is_none() {
        let want =
            std::fs::read_to_string(&list).map_err(|e| format!("{}: {e}", list.display()))?;
        regressions = want
            .lines()
            .filter(|n| !n.is_empty() && !passed.contains(*n))
            .map(String::from)
            .collect();
        listed = want.lines().filter(|n| !n.is_empty()).count() - regressions.len();
        let new = passed
            .len()
            .saturating_sub(want.lines().count() - regressions.len());
        if new > 0 {
            println!(
                "\n{new} case(s) pass that are not in {}; run `cargo xtask conformance --update`",
                list.display()
            );
        }
    }
    // Every required op must pass through the interpreter; compiled code reports its coverage only.
    let uncovered: Vec<&str> =
        if o.filter.is_none() && !matches!(o.mode, Mode::Compiled(_) | Mode::Emulated(_)) {
            REQUIRED_OPS
                .iter()
                .copied()
                .filter(|op| per_op.get(op).is_none_or(|(p, _)| *p == 0))
                .collect()
        } else {
            vec![]
        };
    let mode = match &o.mode {
        Mode::Imported => String::new(),
        Mode::Optimized(t) => format!(" (optimised for {t})"),
        Mode::Compiled(t) => format!(" (compiled for {t})"),
        Mode::Emulated(t) => format!(" (GPU schedules for {t}, emulated)"),
    };
    println!(
        "\nconformance{mode}: {} cases in {:.1}s",
        cases.len(),
        took.as_secs_f64()
    );
    println!("{} passed, {failed} failed", passed.len());
    if !uncovered.is_empty() {
        return Err(format!(
            "required op(s) with no passing case: {}",
            uncovered.join(", ")
        ));
    }
    if !regressions.is_empty() {
        return Err(format!(
            "{} case(s) in the passing list regressed: {}",
            regressions.len(),
            regressions.join(", ")
        ));
    }
    Ok((listed, cases.len()))
}
