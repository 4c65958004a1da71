//! The hostile corpus (`xtask/py/gen_hostile.py`): models and inputs from someone else, each run through
//! every command that reads a model (inspect, compile, run, run --interpret, check --compiled; data
//! cases also check --emulated for a GPU) under 20 s and 2 GiB of address space. A rejected case must
//! exit 2 with a message naming what is at fault; none may panic, hang or run out of memory; valid ones
//! must run, and agree compiled and interpreted. No command may print a raw control character (names
//! with terminal escape sequences are printed escaped).

use crate::{root, setup, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const LIMIT_S: u32 = 20;
const LIMIT_KIB: u64 = 2 << 20;

/// One case's `case.txt`.
struct Case {
    dir: PathBuf,
    expect: String,
    needle: String,
    good: Vec<String>,
    bad: Vec<String>,
    /// `--input-value` flags under which a rejected model must compile (and inspect).
    pins: Vec<String>,
}

impl Case {
    fn read(dir: &Path) -> Result<Case> {
        let text = std::fs::read_to_string(dir.join("case.txt"))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut c = Case {
            dir: dir.to_path_buf(),
            expect: String::new(),
            needle: String::new(),
            good: vec![],
            bad: vec![],
            pins: vec![],
        };
        for line in text.lines() {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "expect" => c.expect = value.into(),
                "needle" => c.needle = value.into(),
                "pin" => c.pins.push(format!("--input-value={value}")),
                "good" | "bad" => {
                    let (_, file) = value
                        .split_once('=')
                        .ok_or_else(|| format!("{}: bad line {line:?}", dir.display()))?;
                    let input = format!("{}", dir.join(file).display());
                    if key == "good" {
                        &mut c.good
                    } else {
                        &mut c.bad
                    }
                    .push(input);
                }
                _ => return Err(format!("{}: unknown key {key:?}", dir.display())),
            }
        }
        Ok(c)
    }

    fn model(&self) -> String {
        self.dir.join("model.onnx").display().to_string()
    }
}

/// What one command did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs mlopt with `args` under the limits.
fn mlopt(exe: &Path, args: &[String]) -> Result<Ran> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {LIMIT_KIB}; exec timeout {LIMIT_S} \"$@\""
        ))
        .arg("sh")
        .arg(exe)
        .args(args)
        .output()
        .map_err(|e| format!("sh: {e}"))?;
    Ok(Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    })
}

/// A control character other than a newline or tab in what `r` printed: names come from the model, and
/// an escape sequence in one must not reach the user's terminal raw.
fn raw_control(r: &Ran) -> Option<String> {
    let bad = |t: &str| t.chars().any(|c| c.is_control() && c != '\n' && c != '\t');
    (bad(&r.stdout) || bad(&r.stderr)).then(|| "printed a raw control character".to_string())
}

/// The problem with `r` for a command that must fail cleanly with `needle` in its message, if any.
fn clean_error(r: &Ran, needle: &str) -> Option<String> {
    if let Some(p) = raw_control(r) {
        return Some(p);
    }
    match r.code {
        _ if r.stderr.contains("panicked") => Some(format!("panicked: {}", r.stderr.trim())),
        Some(124) => Some(format!("still running after {LIMIT_S} s")),
        Some(2) if r.stderr.contains(needle) => None,
        Some(2) => Some(format!(
            "the message does not name {needle:?}: {}",
            r.stderr.trim()
        )),
        code => Some(format!("exit {code:?}, not 2: {}", r.stderr.trim())),
    }
}

fn success(r: &Ran) -> Option<String> {
    (r.code != Some(0))
        .then(|| format!("exit {:?}: {}", r.code, r.stderr.trim()))
        .or_else(|| raw_control(r))
}

fn inputs(files: &[String]) -> Vec<String> {
    files.iter().map(|f| format!("--input={f}")).collect()
}

/// The failures of one case, as `command: problem`.
fn check(exe: &Path, c: &Case, out: &Path) -> Result<Vec<String>> {
    let m = c.model();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let compile = s(&["compile", &m, "-o", &out.display().to_string()]);
    let mut failures = Vec::new();
    let mut expect = |what: &[String], problem: Option<String>| {
        if let Some(p) = problem {
            failures.push(format!("mlopt {}: {p}", what.join(" ")));
        }
    };
    let data = |dir: &str| c.dir.join(dir).display().to_string();
    match c.expect.as_str() {
        "reject" => {
            for args in [
                s(&["inspect", &m]),
                compile.clone(),
                s(&["run", &m]),
                s(&["run", "--interpret", &m]),
                s(&["check", "--compiled", &m, "--data", &data(".")]),
            ] {
                let r = mlopt(exe, &args)?;
                expect(&args, clean_error(&r, &c.needle));
            }
            if !c.pins.is_empty() {
                for args in [s(&["inspect", &m]), compile.clone()] {
                    let args = [args, c.pins.clone()].concat();
                    let r = mlopt(exe, &args)?;
                    expect(&args, success(&r));
                }
            }
        }
        "data" | "ok" => {
            for args in [s(&["inspect", &m]), compile] {
                let r = mlopt(exe, &args)?;
                expect(&args, success(&r));
            }
            let mut printed = Vec::new();
            for mode in [&[][..], &["--interpret".to_string()][..]] {
                let args: Vec<String> = [s(&["run", &m]), mode.to_vec(), inputs(&c.good)].concat();
                let r = mlopt(exe, &args)?;
                expect(&args, success(&r));
                printed.push(r.stdout);
                if c.expect == "data" {
                    let args: Vec<String> =
                        [s(&["run", &m]), mode.to_vec(), inputs(&c.bad)].concat();
                    let r = mlopt(exe, &args)?;
                    expect(&args, clean_error(&r, &c.needle));
                }
            }
            if printed[0] != printed[1] {
                expect(
                    &s(&["run"]),
                    Some(format!(
                        "compiled and interpreted outputs differ:\n{}\n{}",
                        printed[0], printed[1]
                    )),
                );
            }
            if c.dir.join("good").is_dir() {
                let args = s(&["check", "--compiled", &m, "--data", &data("good")]);
                let r = mlopt(exe, &args)?;
                expect(&args, success(&r));
            }
            if c.expect == "data" {
                // Compiled for this CPU, and scheduled for a GPU and run in the kernel IR's emulator.
                for mode in [
                    &["--compiled"][..],
                    &["--emulated", "--target", "sm_80"][..],
                ] {
                    let args = [s(&["check"]), s(mode), s(&[&m, "--data", &data("bad")])].concat();
                    let r = mlopt(exe, &args)?;
                    expect(&args, clean_error(&r, &c.needle));
                }
                let args = s(&[
                    "check",
                    "--emulated",
                    "--target",
                    "sm_80",
                    &m,
                    "--data",
                    &data("good"),
                ]);
                let r = mlopt(exe, &args)?;
                expect(&args, success(&r));
            }
        }
        other => return Err(format!("{}: expect {other:?}?", c.dir.display())),
    }
    Ok(failures)
}

/// Generates the corpus into target/hostile and checks every case; an error lists the failures.
pub(crate) fn run(exe: &Path) -> Result<usize> {
    let dir = root().join("target/hostile");
    crate::run(
        Command::new(setup::venv_python())
            .arg("xtask/py/gen_hostile.py")
            .arg(&dir),
    )?;
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    cases.sort();
    let out = dir.join("out");
    let mut failed = Vec::new();
    let mut count = 0;
    for case in cases.iter().filter(|p| p.join("case.txt").exists()) {
        let c = Case::read(case)?;
        count += 1;
        for f in check(exe, &c, &out)? {
            failed.push(format!(
                "{}: {f}",
                case.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ));
        }
    }
    if failed.is_empty() {
        Ok(count)
    } else {
        Err(format!(
            "hostile corpus: {} failure(s):\n{}",
            failed.len(),
            failed.join("\n")
        ))
    }
}
