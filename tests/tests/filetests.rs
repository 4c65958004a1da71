//! Filetests: one stage run on one small input, as data in `tests/filetests/<stage>/`, in the manner of
//! Cranelift's filetests. Each file opens with a header of comment lines saying what to run,
//!
//! ```text
//! ; test: schedule            (verify, schedule or optimize: the directory's stage)
//! ; target: x86-64-v4 threads=2
//! ; check: parallel(i)        (optional, repeatable: a line the output must hold)
//! ; error: may leave 0..10    (verify only, repeatable: an error the verifier must report)
//! ; weights: w b              (schedule only: parameters bound to constant weights, not inputs)
//! ```
//!
//! then the input (a kernel in the kernel IR's text, `.kir`, or a graph in the graph IR's, `.gir`), and,
//! for the stages that make something, the expected output after a line `; output:`. The runner checks
//! the output against it and every output numerically against the input: the kernel IR interpreter (the
//! GPU emulator for GPU schedules) on the scheduled kernels against the algorithm, the graph
//! interpreter on the optimised graph against the input graph, on the same pseudo-random inputs.
//! `INSTA_UPDATE=always` (the switch that re-blesses the insta snapshots) writes the outputs instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_kir::{Elem, Io, Kernel, Place, Program, Step};
use std::path::{Path, PathBuf};

const OUTPUT: &str = "; output:";

/// A filetest's header and its parts.
#[derive(Debug)]
struct FileTest {
    path: PathBuf,
    test: String,
    target: Option<String>,
    threads: u32,
    checks: Vec<String>,
    errors: Vec<String>,
    weights: Vec<String>,
    input: String,
    expected: Option<String>,
}

fn read(path: &Path) -> FileTest {
    let text = std::fs::read_to_string(path).unwrap();
    let (input, expected) = match text.split_once(&format!("\n{OUTPUT}\n")) {
        Some((i, o)) => (format!("{i}\n"), Some(o.to_string())),
        None => (text.clone(), None),
    };
    let mut t = FileTest {
        path: path.to_path_buf(),
        test: String::new(),
        target: None,
        threads: 1,
        checks: vec![],
        errors: vec![],
        weights: vec![],
        input,
        expected,
    };
    for line in text.lines().take_while(|l| l.starts_with(';')) {
        let Some((key, value)) = line.trim_start_matches(';').trim().split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        match key {
            "test" => t.test = value,
            "check" => t.checks.push(value),
            "error" => t.errors.push(value),
            "weights" => t.weights = value.split_whitespace().map(str::to_string).collect(),
            "target" => {
                let mut words = value.split_whitespace();
                t.target = words.next().map(str::to_string);
                for w in words {
                    if let Some(n) = w.strip_prefix("threads=") {
                        t.threads = n.parse().unwrap();
                    }
                }
            }
            _ => {}
        }
    }
    t
}

/// Every filetest, by path.
fn all() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let mut out = vec![];
    for dir in std::fs::read_dir(&root).unwrap() {
        for f in std::fs::read_dir(dir.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

fn bless() -> bool {
    std::env::var("INSTA_UPDATE").is_ok_and(|v| v == "always")
}

/// Runs one filetest; Err says what failed.
fn run(t: &FileTest) -> Result<(), String> {
    let dir = t.path.parent().and_then(Path::file_name).unwrap();
    if t.test != dir.to_string_lossy() {
        return Err(format!("its test is `{}`, not its folder's", t.test));
    }
    let output = match t.test.as_str() {
        "verify" => return verify(t),
        "schedule" => schedule(t)?,
        "optimize" => optimize(t)?,
        other => return Err(format!("no test kind `{other}`")),
    };
    for c in &t.checks {
        if !output.contains(c.as_str()) {
            return Err(format!("the output does not hold `{c}`:\n{output}"));
        }
    }
    if bless() {
        let text = format!("{}{OUTPUT}\n{output}", t.input);
        std::fs::write(&t.path, text).unwrap();
        return Ok(());
    }
    match &t.expected {
        Some(e) if *e == output => Ok(()),
        Some(e) => Err(format!(
            "the output changed (INSTA_UPDATE=always blesses it):\n{}",
            similar::TextDiff::from_lines(e.as_str(), output.as_str()).unified_diff()
        )),
        None => Err("no expected output (INSTA_UPDATE=always writes it)".into()),
    }
}

/// The input without its header's comment lines.
fn body(t: &FileTest) -> String {
    t.input
        .lines()
        .filter(|l| !l.starts_with(';'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `verify`: the kernel's text round-trips, and the verifier accepts it or reports each `error:`.
fn verify(t: &FileTest) -> Result<(), String> {
    let body = body(t);
    let k = mlopt_kir::parse_kernel(&body).map_err(|e| format!("{e:?}"))?;
    if mlopt_kir::print::kernel(&k) != body {
        return Err(format!(
            "does not print back as written:\n{}",
            mlopt_kir::print::kernel(&k)
        ));
    }
    match (mlopt_kir::verify(&k), t.errors.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => Err(format!("verifies, but should report {:?}", t.errors)),
        (Err(e), true) => Err(format!("does not verify: {e:?}")),
        (Err(e), false) => match t
            .errors
            .iter()
            .find(|want| !e.iter().any(|m| m.contains(want.as_str())))
        {
            Some(missing) => Err(format!("reports {e:?}, not `{missing}`")),
            None => Ok(()),
        },
    }
}

/// `schedule`: the kernel as a program of one step (the parameters it stores to are its outputs),
/// scheduled for the target; the output is the scheduled kernels' text, which must compute what the
/// algorithm does.
fn schedule(t: &FileTest) -> Result<String, String> {
    let k = mlopt_kir::parse_kernel(&body(t)).map_err(|e| format!("{e:?}"))?;
    mlopt_kir::verify(&k).map_err(|e| format!("the input does not verify: {e:?}"))?;
    let target = mlopt_target::Target::named(t.target.as_deref().unwrap_or("x86-64-v4"), t.threads)
        .map_err(|e| e.to_string())?;
    let algorithm = program_of(k, &t.weights);
    let scheduled = mlopt_schedule::schedule(algorithm.clone(), &target, &Default::default())
        .map_err(|e| e.to_string())?;
    let inputs: Vec<Vec<u8>> = algorithm
        .inputs
        .iter()
        .enumerate()
        .map(|(i, io)| data(io, i))
        .collect();
    let want = mlopt_kir::run_program(&algorithm, &inputs).map_err(|e| e.to_string())?;
    let got = mlopt_kir::run_program(&scheduled, &inputs).map_err(|e| e.to_string())?;
    for ((io, w), g) in algorithm.outputs.iter().zip(&want).zip(&got) {
        if !close(io.elem, w, g) {
            return Err(format!(
                "the scheduled kernels compute another {} than the algorithm",
                io.name
            ));
        }
    }
    Ok(scheduled
        .kernels
        .iter()
        .map(mlopt_kir::print::kernel)
        .collect::<Vec<_>>()
        .join("\n"))
}

/// A one-kernel program: its parameters are the program's inputs, outputs when it stores to them, or
/// weights (of pseudo-random data) when they are named in `weights`.
fn program_of(k: Kernel, weights: &[String]) -> Program {
    let stored = mlopt_kir::analysis::stored(&k.body);
    let mut p = Program {
        name: k.name.clone(),
        ..Program::default()
    };
    let mut args = vec![];
    for b in k.params() {
        let buf = k.buffer(b);
        let io = Io {
            name: buf.name.clone(),
            elem: buf.elem,
            dims: buf.dims.clone(),
            counted: None,
            sequence: None,
        };
        if weights.contains(&buf.name) {
            let data = std::sync::Arc::new(data(&io, 99 + p.weights.len()));
            p.weights.push(mlopt_kir::Weight {
                name: io.name,
                elem: io.elem,
                dims: io.dims,
                data,
            });
            args.push(Place::Weight(p.weights.len() - 1));
        } else if stored.contains(&b) {
            p.outputs.push(io);
            args.push(Place::Output(p.outputs.len() - 1));
        } else {
            p.inputs.push(io);
            args.push(Place::Input(p.inputs.len() - 1));
        }
    }
    p.steps.push(Step::call(0, args));
    p.kernels.push(k);
    p
}

/// Pseudo-random values for input `seed`: floats in [-1, 1), integers 0..3 (valid indices of small
/// axes), booleans alternating.
fn data(io: &Io, seed: usize) -> Vec<u8> {
    let n = io.dims.iter().product::<u64>() as usize;
    let mut state =
        0x9E37_79B9_7F4A_7C15u64 ^ (seed as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .flat_map(|_| match io.elem {
            Elem::F32 => (((next() % 2000) as f32 - 1000.0) / 1000.0)
                .to_le_bytes()
                .to_vec(),
            Elem::F64 => (((next() % 2000) as f64 - 1000.0) / 1000.0)
                .to_le_bytes()
                .to_vec(),
            Elem::I64 => ((next() % 3) as i64).to_le_bytes().to_vec(),
            Elem::I32 => ((next() % 3) as i32).to_le_bytes().to_vec(),
            e => vec![(next() % 2) as u8; e.size() as usize],
        })
        .collect()
}

/// Whether `g` is `w`: exactly for integers, within 1e-5 of the largest magnitude for floats.
fn close(e: Elem, w: &[u8], g: &[u8]) -> bool {
    let floats = |b: &[u8]| -> Vec<f64> {
        match e {
            Elem::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            _ => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        }
    };
    if !matches!(e, Elem::F32 | Elem::F64) {
        return w == g;
    }
    let (w, g) = (floats(w), floats(g));
    let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    w.len() == g.len() && w.iter().zip(&g).all(|(a, b)| (a - b).abs() <= 1e-5 * scale)
}

/// `optimize`: the graph optimised for the target; the output is the optimised graph's dump, which must
/// compute what the input graph does.
fn optimize(t: &FileTest) -> Result<String, String> {
    let g = mlopt_ir::parse::parse(&body(t), &|_| None).map_err(|e| e.to_string())?;
    let target = mlopt_target::Target::named(t.target.as_deref().unwrap_or("x86-64-v4"), t.threads)
        .map_err(|e| e.to_string())?;
    let cfg = mlopt_rewrite::Config::new(target);
    let o = mlopt_rewrite::optimize(&g, &cfg).map_err(|e| e.to_string())?;
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 1);
    let want = mlopt_ir::interp::run(&g, &inputs).map_err(|e| e.to_string())?;
    let got = mlopt_ir::interp::run(&o.plan.graph, &inputs).map_err(|e| e.to_string())?;
    for ((name, w), (_, gt)) in want.iter().zip(&got) {
        let err = mlopt_rewrite::optimize::scaled_error(w, gt);
        if err > 1e-5 {
            return Err(format!(
                "the optimised graph computes another {name} (error {err:e})"
            ));
        }
    }
    // The report's timings and the host's figures change from run to run; the graph does not.
    Ok(mlopt_ir::print::print(&o.plan.graph))
}

#[test]
fn filetests() {
    let files = all();
    assert!(!files.is_empty(), "no filetests found");
    let failures: Vec<String> = files
        .iter()
        .filter_map(|p| run(&read(p)).err().map(|e| format!("{}: {e}", p.display())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} filetests failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}
