//! Idempotent set-up: each step checks first and only installs what is missing, saying so.

use crate::{root, run, Result};
use std::path::PathBuf;
use std::process::Command;

const APT_PACKAGES: &[&str] = &[
    "llvm-19-dev",
    "libpolly-19-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "valgrind",
];

pub(crate) fn venv_python() -> PathBuf {
    root().join(".venv/bin/python")
}

fn apt_missing() -> Vec<&'static str> {
    APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output();
            !out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

fn apt() -> Result {
    let missing = apt_missing();
    if missing.is_empty() {
        eprintln!("setup: apt packages present ({})", APT_PACKAGES.join(" "));
        return Ok(());
    }
    eprintln!("setup: installing apt packages: {}", missing.join(" "));
    let sudo = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() != "0")
        .unwrap_or(true);
    let apt_get = |args: &[&str]| {
        let mut c = if sudo {
            Command::new("sudo")
        } else {
            Command::new("apt-get")
        };
        if sudo {
            c.arg("apt-get");
        }
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run(&mut apt_get(&["update", "-qq"]))?;
    let mut install = apt_get(&["install", "-y", "-qq", "--no-install-recommends"]);
    install.args(&missing);
    run(&mut install)
}

/// True when the venv has every pinned package at its pinned version.
fn venv_ok(req: &str) -> bool {
    let pins: Vec<(&str, &str)> = req
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once("=="))
        .collect();
    let script = format!("import importlib.metadata as m, sys\nsys.exit(0 if all(m.version(p) == v for p, v in {pins:?}) else 1)");
    Command::new(venv_python())
        .args(["-c", &script])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn venv() -> Result {
    let req_path = root().join("xtask/py/requirements.txt");
    let req =
        std::fs::read_to_string(&req_path).map_err(|e| format!("{}: {e}", req_path.display()))?;
    if venv_python().exists() && venv_ok(&req) {
        eprintln!("setup: Python venv .venv has the pinned packages");
        return Ok(());
    }
    if !venv_python().exists() {
        eprintln!("setup: creating the Python venv .venv");
        if run(Command::new("python3").args(["-m", "venv", ".venv"])).is_err() {
            // Debian's own python3 needs python3-venv for this.
            run(Command::new("apt-get").args(["install", "-y", "-qq", "python3-venv"]))?;
            run(Command::new("python3").args(["-m", "venv", ".venv"]))?;
        }
    }
    eprintln!("setup: installing pinned Python packages into .venv (xtask/py/requirements.txt)");
    run(Command::new(venv_python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&req_path))
}

/// ptxas from the nvidia-cuda-nvcc-cu12 wheel in the venv.
pub(crate) fn ptxas() -> Result<PathBuf> {
    let lib = root().join(".venv/lib");
    let found = std::fs::read_dir(&lib)
        .map_err(|e| format!("{}: {e}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
        .find(|p| p.exists());
    found.ok_or_else(|| "ptxas is missing from .venv (nvidia-cuda-nvcc-cu12)".to_string())
}

/// rustfmt and clippy, which the tests run; a minimal Rust toolchain may lack them.
fn rust_components() -> Result {
    let missing: Vec<&str> = [("rustfmt", "fmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(_, sub)| {
            !crate::cargo()
                .args([*sub, "--version"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(component, _)| component)
        .collect();
    if missing.is_empty() {
        eprintln!("setup: rustfmt and clippy present");
        return Ok(());
    }
    eprintln!("setup: installing Rust components: {}", missing.join(" "));
    run(Command::new("rustup")
        .args(["component", "add"])
        .args(&missing))
}

pub(crate) fn setup() -> Result {
    apt()?;
    rust_components()?;
    venv()?;
    let ptxas = ptxas()?;
    let out = Command::new(&ptxas)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", ptxas.display()))?;
    let version = String::from_utf8_lossy(&out.stdout);
    let line = version.lines().last().unwrap_or_default().to_string();
    eprintln!("setup: ptxas works ({line})");
    Ok(())
}
