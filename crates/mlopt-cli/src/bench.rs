//! `mlopt bench`: latency of the compiled code (plain), per-kernel times (`--profile`), and the
//! latency/throughput trade-off over batch sizes (`--batch`).

use crate::{data, OptArgs};
use anyhow::{bail, Context, Result};
use mlopt_driver::svg::{self, BatchPoint};
use mlopt_ir::Tensor;
use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

/// The arguments every kind of bench shares.
#[derive(Debug)]
pub struct Bench<'a> {
    pub model: &'a Path,
    pub inputs: &'a [String],
    pub input_shapes: &'a [String],
    pub input_values: &'a [String],
    pub iters: usize,
    pub json: bool,
    pub output: &'a Path,
    pub opt: &'a OptArgs,
}

/// A compiled, loaded model with its input buffers.
struct Ready {
    c: mlopt_driver::Compiled,
    lib: mlopt_driver::Loaded,
    ins: Vec<Vec<u8>>,
    compile_s: f64,
}

impl Ready {
    fn build(b: &Bench, input_shapes: &[String], threads: u32, profile: bool) -> Result<Ready> {
        let start = Instant::now();
        let m = data::load(b.model)?;
        let ports = data::ports(&m)?;
        let given = data::read_inputs(b.inputs, &ports)?;
        let g = data::import(&m, b.model, (input_shapes, b.input_values), &given)?;
        let mut opt = b.opt.clone();
        opt.threads = threads;
        let mut options = opt.driver(&ports)?;
        options.profile = profile;
        let c = mlopt_driver::compile(&g, &options)?;
        let compile_s = start.elapsed().as_secs_f64();
        let lib = c.load()?;
        let inputs: HashMap<String, Tensor> = if given.tensors.is_empty() {
            mlopt_rewrite::optimize::random_inputs(&g, 1)
        } else {
            given.tensors
        };
        let ins = c.input_bytes(&inputs)?;
        Ok(Ready {
            c,
            lib,
            ins,
            compile_s,
        })
    }

    /// Milliseconds of `iters` runs after 3 warm-ups, sorted.
    fn times(&mut self, iters: usize) -> Result<Vec<f64>> {
        let refs: Vec<&[u8]> = self.ins.iter().map(|b| b.as_slice()).collect();
        let mut times: Vec<f64> = self
            .c
            .timed_runs(&mut self.lib, &refs, 3, iters.max(1))?
            .into_iter()
            .map(|s| s * 1e3)
            .collect();
        times.sort_by(f64::total_cmp);
        Ok(times)
    }
}

/// A short name for plots: the file stem, or for `.../resnet50/dynamo/model.onnx` (the zoo's layout) the
/// folders that tell models apart.
pub fn label(model: &Path) -> String {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if stem != "model" {
        return stem;
    }
    let abs = std::path::absolute(model).unwrap_or_else(|_| model.to_path_buf());
    let parts: Vec<String> = abs
        .parent()
        .into_iter()
        .flat_map(|p| p.iter().rev().take(2))
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        stem
    } else {
        parts.into_iter().rev().collect::<Vec<_>>().join("/")
    }
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Median and minimum latency of `iters` runs.
pub fn plain(b: &Bench) -> Result<ExitCode> {
    let mut r = Ready::build(b, b.input_shapes, b.opt.threads, false)?;
    let times = r.times(b.iters)?;
    let (median, min) = (quantile(&times, 0.5), times[0]);
    if b.json {
        outln!(
            "{{\"model\": {:?}, \"threads\": {}, \"median_ms\": {median:.4}, \"min_ms\": {min:.4}, \"compile_s\": {:.3}}}",
            b.model.display().to_string(),
            b.opt.threads,
            r.compile_s
        )?;
    } else {
        outln!(
            "{}: median {median:.4} ms, min {min:.4} ms over {} runs ({} threads, {}); compiled in {:.2} s",
            b.model.display(),
            times.len(),
            b.opt.threads,
            r.c.cfg.target.name(),
            r.compile_s
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--profile`: a build with a clock reading around each kernel; the table (or JSON) and roofline.svg.
pub fn profile(b: &Bench) -> Result<ExitCode> {
    let mut r = Ready::build(b, b.input_shapes, b.opt.threads, true)?;
    let refs: Vec<&[u8]> = r.ins.iter().map(|b| b.as_slice()).collect();
    let p = r.c.profile(&mut r.lib, &refs, b.iters)?;
    let name = b.model.display().to_string();
    let title = format!(
        "{} on {} thread{}",
        label(b.model),
        b.opt.threads,
        if b.opt.threads == 1 { "" } else { "s" }
    );
    let svg = svg::roofline(&title, &r.c.cfg.target, &p.kernels);
    let path = write_file(b.output, "roofline.svg", svg)?;
    if b.json {
        outln!("{}", mlopt_driver::profile::json(&name, b.opt.threads, &p))?;
    } else {
        outln!(
            "{name}: {} kernels, {} threads, {}; compiled in {:.2} s",
            p.kernels.len(),
            b.opt.threads,
            r.c.cfg.target,
            r.compile_s
        )?;
        out!("{}", mlopt_driver::profile::table(&p))?;
    }
    errln!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// The `--input-shape` flags that pin batch `n`: each input whose leading dimension is given by a flag or
/// is symbolic (with every other dimension known) gets `n` there.
fn batch_shapes(
    m: &mlopt_onnx::proto::ModelProto,
    names: &[String],
    flags: &[String],
    n: u64,
) -> Result<Vec<String>> {
    let g = m.graph.as_ref().context("the model has no graph")?;
    let mut pinned: HashMap<String, Vec<usize>> = HashMap::new();
    for f in flags {
        let (name, dims) = mlopt_onnx::parse_input_shape(f).map_err(anyhow::Error::msg)?;
        pinned.insert(name, dims);
    }
    let mut out = Vec::new();
    let mut batched = 0;
    for name in names {
        let Some(v) = g.input.iter().find(|v| &v.name == name) else {
            continue;
        };
        let (_, declared) = mlopt_onnx::import::declared_type(v)?;
        let dims: Option<Vec<usize>> = match (pinned.get(name), declared) {
            (Some(p), _) if !p.is_empty() => {
                let mut p = p.clone();
                p[0] = n as usize;
                batched += 1;
                Some(p)
            }
            (Some(p), _) => Some(p.clone()),
            (None, Some(d)) if !d.is_empty() && d[0].0.is_none() => {
                let rest: Option<Vec<usize>> = d[1..].iter().map(|(v, _)| *v).collect();
                let Some(rest) = rest else {
                    bail!("input '{name}': only its leading dimension may be symbolic for --batch; pin the others with --input-shape")
                };
                batched += 1;
                Some(std::iter::once(n as usize).chain(rest).collect())
            }
            _ => None,
        };
        if let Some(d) = dims {
            out.push(format!(
                "{name}={}",
                d.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join("x")
            ));
        }
    }
    if batched == 0 {
        bail!("--batch: no input has a symbolic leading dimension, and --input-shape names none: nothing to batch");
    }
    Ok(out)
}

/// `--batch 1,2,4,...`: compiles at each batch size, at 1 thread and at all threads, and prints latency
/// and throughput; writes batch.svg.
pub fn batch_sweep(b: &Bench, batches: &[u64], budget_ms: Option<f64>) -> Result<ExitCode> {
    if !b.inputs.is_empty() {
        bail!("--batch makes random inputs of each batch size: leave out --input");
    }
    if let Some(&bad) = batches.iter().find(|&&n| n == 0 || n > 4096) {
        bail!("--batch {bad}: batch sizes run from 1 to 4096");
    }
    let m = data::load(b.model)?;
    let names = data::ports(&m)?.input_names();
    let all = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let mut thread_counts = vec![1];
    if all > 1 {
        thread_counts.push(all);
    }
    let mut points = Vec::new();
    if !b.json {
        outln!(
            "{:>6} {:>8} {:>11} {:>11} {:>11} {:>13} {:>10}",
            "batch",
            "threads",
            "median ms",
            "p90 ms",
            "p99 ms",
            "items/s",
            "compile s"
        )?;
    }
    for &n in batches {
        let shapes = batch_shapes(&m, &names, b.input_shapes, n)?;
        for &t in &thread_counts {
            let mut r = Ready::build(b, &shapes, t, false).with_context(|| format!("batch {n}"))?;
            let times = r.times(b.iters)?;
            let p = BatchPoint {
                batch: n,
                threads: t,
                median_ms: quantile(&times, 0.5),
                p90_ms: quantile(&times, 0.9),
                p99_ms: quantile(&times, 0.99),
                throughput: n as f64 / (quantile(&times, 0.5) / 1e3),
            };
            if !b.json {
                outln!(
                    "{:>6} {:>8} {:>11.3} {:>11.3} {:>11.3} {:>13.1} {:>10.2}",
                    n,
                    t,
                    p.median_ms,
                    p.p90_ms,
                    p.p99_ms,
                    p.throughput,
                    r.compile_s
                )?;
            }
            points.push(p);
        }
    }
    // Per thread count, the largest batch whose p99 meets the budget.
    let best: Vec<(u32, Option<u64>)> = thread_counts
        .iter()
        .map(|&t| {
            (
                t,
                points
                    .iter()
                    .filter(|p| p.threads == t && budget_ms.is_none_or(|ms| p.p99_ms <= ms))
                    .map(|p| p.batch)
                    .max(),
            )
        })
        .collect();
    let title = format!(
        "{}: batch sizes {}",
        label(b.model),
        batches
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let path = write_file(
        b.output,
        "batch.svg",
        svg::batch_curve(&title, &points, budget_ms),
    )?;
    if b.json {
        let pts: Vec<String> = points
            .iter()
            .map(|p| {
                format!(
                    "{{\"batch\": {}, \"threads\": {}, \"median_ms\": {}, \"p90_ms\": {}, \"p99_ms\": {}, \"items_per_s\": {}}}",
                    p.batch, p.threads, p.median_ms, p.p90_ms, p.p99_ms, p.throughput
                )
            })
            .collect();
        let best_json: Vec<String> = best
            .iter()
            .map(|(t, b)| format!("\"{t}\": {}", b.map_or("null".into(), |b| b.to_string())))
            .collect();
        outln!(
            "{{\"model\": {:?}, \"max_latency_ms\": {}, \"points\": [{}], \"largest_batch_within_budget\": {{{}}}}}",
            b.model.display().to_string(),
            budget_ms.map_or("null".into(), |v| v.to_string()),
            pts.join(", "),
            best_json.join(", ")
        )?;
    } else if let Some(ms) = budget_ms {
        for (t, n) in &best {
            match n {
                Some(n) => {
                    outln!("within {ms} ms (p99) at {t} thread(s): batch {n} is the largest")?
                }
                None => {
                    outln!("within {ms} ms (p99) at {t} thread(s): no batch size meets the budget")?
                }
            }
        }
    }
    errln!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` as `dir/name` by rename (`mlopt_driver::output::replace_files`): a link planted at the
/// name is replaced, never written through.
fn write_file(dir: &std::path::Path, name: &str, text: String) -> Result<std::path::PathBuf> {
    use mlopt_driver::output::{replace_files, Content};
    let written = replace_files(
        dir,
        &[(name.to_string(), Content::Bytes(text.into_bytes()))],
    )?;
    Ok(written.into_iter().next().unwrap_or_else(|| dir.join(name)))
}
