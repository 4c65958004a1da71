//! What each kernel of a compiled model costs: the cost model's view (FLOPs, bytes, the estimate priced
//! for the schedule that was chosen, the roofline bound) joined with the time a profiled build measured
//! (`mlopt bench --profile`), one record per step of the entry point.

use crate::error::{DriverError, Result};
use crate::Compiled;
use mlopt_cost::{roofline, Bound, Mix, ScheduleClass, Work};
use mlopt_kir::Kernel;
use mlopt_runtime::Loaded;
use std::fmt::Write;

/// One kernel call of the entry point.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRecord {
    /// The kernel's name in the kernel IR (`k12` for the optimised graph's kernel 12, `copyN` for the copy
    /// of graph output N).
    pub id: String,
    /// The graph ops it computes, and the names of their nodes (the ONNX node names where import kept them).
    pub ops: Vec<String>,
    pub nodes: Vec<String>,
    /// The type of what the kernel writes (its first parameter), e.g. `f32[1,256,14,14]`.
    pub output: String,
    pub flops: f64,
    pub bytes: f64,
    /// The cost model's estimate, priced for how the kernel's arithmetic runs (`mlopt_cost::priced`), seconds.
    pub estimate_s: f64,
    /// The roofline bound: max(FLOPs at the target's peak, bytes at its bandwidth), seconds.
    pub roofline_s: f64,
    pub bound: Bound,
    pub schedule: ScheduleClass,
    /// The precision most of its matrix arithmetic runs in (`i16` for a quantized model's integer
    /// contractions), when it has any.
    pub matrix: Option<mlopt_target::MatrixPrecision>,
    /// Mean seconds per run, from a profiled build.
    pub measured_s: Option<f64>,
    /// What the call is made under (`when flag`: one branch of an `If` decided at run time); a run
    /// that skips it measures next to nothing for it.
    pub guard: Vec<String>,
}

impl KernelRecord {
    /// FLOP per byte.
    pub fn intensity(&self) -> f64 {
        if self.bytes > 0.0 {
            self.flops / self.bytes
        } else {
            0.0
        }
    }

    /// The time the figures below use: measured where there is a measurement, else the estimate.
    pub fn time_s(&self) -> f64 {
        self.measured_s.unwrap_or(self.estimate_s)
    }

    pub fn gflops(&self) -> f64 {
        self.flops / self.time_s().max(1e-12) / 1e9
    }

    pub fn gbps(&self) -> f64 {
        self.bytes / self.time_s().max(1e-12) / 1e9
    }

    /// How close the kernel came to its roofline bound (1 = at the roof).
    pub fn roofline_fraction(&self) -> f64 {
        self.roofline_s / self.time_s().max(1e-12)
    }
}

/// A whole profiled run: the median of the timed runs and every kernel's mean.
#[derive(Debug, Clone)]
pub struct Profile {
    pub runs: usize,
    pub median_s: f64,
    pub mean_s: f64,
    /// Sorted by measured time, slowest first.
    pub kernels: Vec<KernelRecord>,
}

impl Profile {
    /// The kernels' times added up, seconds per run.
    pub fn kernel_sum_s(&self) -> f64 {
        self.kernels.iter().map(KernelRecord::time_s).sum()
    }
}

/// How a kernel's work runs, by the kernel IR's count of it (`mlopt_kir::analysis::arithmetic`): what
/// the cost model prices and classes it by.
pub fn mix(k: &Kernel) -> Mix {
    let a = mlopt_kir::analysis::arithmetic(k);
    Mix::of(a.tiled, a.tiled_gather, a.vector, a.gather, a.scalar)
}

impl Compiled {
    /// One record per step, in call order, with the cost model's figures (no measurement).
    pub fn kernel_records(&self) -> Vec<KernelRecord> {
        let g = &self.optimized.plan.graph;
        let members = g.kernels();
        let target = &self.cfg.target;
        self.program
            .steps
            .iter()
            .map(|step| {
                let k = &self.program.kernels[step.kernel];
                let mix = mix(k);
                let class = mix.class();
                let graph_kernel = k.name.strip_prefix('k').and_then(|n| n.parse::<u32>().ok());
                let guard = graph_kernel
                    .and_then(|id| self.optimized.plan.kernels.get(id as usize))
                    .map(|info| info.guard.clone())
                    .unwrap_or_default();
                let (ops, nodes, work) = match graph_kernel
                    .and_then(|id| Some((id, self.optimized.plan.kernels.get(id as usize)?)))
                {
                    Some((id, info)) => {
                        let nodes = members
                            .get(&id)
                            .map(|m| {
                                m.members
                                    .iter()
                                    .map(|n| g.node(*n).name.clone())
                                    .filter(|n| !n.is_empty())
                                    .collect()
                            })
                            .unwrap_or_default();
                        (
                            info.ops.iter().map(|s| s.to_string()).collect(),
                            nodes,
                            info.work,
                        )
                    }
                    // The copy of a graph output that no kernel writes in place: read once, written once.
                    None => {
                        let bytes = k
                            .params()
                            .iter()
                            .map(|b| {
                                let buf = &k.bufs[b.0 as usize];
                                buf.numel() * buf.elem.size()
                            })
                            .sum::<u64>();
                        (
                            vec!["Copy".to_string()],
                            vec![],
                            Work {
                                bytes: bytes as f64,
                                ..Work::default()
                            },
                        )
                    }
                };
                let e = mlopt_cost::priced(&work, target, mix);
                let peak = roofline::estimate(&work, target);
                let output = k.params().first().map(|b| {
                    let buf = &k.bufs[b.0 as usize];
                    format!(
                        "{}[{}]",
                        buf.elem,
                        buf.dims
                            .iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                });
                KernelRecord {
                    id: k.name.clone(),
                    ops,
                    nodes,
                    output: output.unwrap_or_default(),
                    flops: work.flops(),
                    bytes: work.bytes,
                    estimate_s: e.time.as_secs(),
                    roofline_s: peak.compute_s.max(peak.memory_s),
                    bound: peak.bound,
                    schedule: class,
                    matrix: work.matrix_precision(),
                    measured_s: None,
                    guard,
                }
            })
            .collect()
    }

    /// Runs a profiled build (`Options::profile`) `runs` times after 3 warm-ups and returns each kernel's
    /// mean time beside the cost model's figures.
    pub fn profile(&self, lib: &mut Loaded, inputs: &[&[u8]], runs: usize) -> Result<Profile> {
        if !self.profiled {
            return Err(DriverError::Input(
                "profiling needs a build with Options::profile set".into(),
            ));
        }
        let runs = runs.max(1);
        let steps = self.program.steps.len();
        let symbol = mlopt_llvm::profile_symbol(&self.program.name);
        self.timed_runs(lib, inputs, 3, 0)?;
        lib.counters(&symbol, steps)?.fill(0);
        let mut times = self.timed_runs(lib, inputs, 0, runs)?;
        let ns = lib.counters(&symbol, steps)?.to_vec();
        let mean_s = times.iter().sum::<f64>() / runs as f64;
        times.sort_by(f64::total_cmp);
        let mut kernels = self.kernel_records();
        for (k, n) in kernels.iter_mut().zip(ns) {
            k.measured_s = Some(n as f64 * 1e-9 / runs as f64);
        }
        kernels.sort_by(|a, b| b.time_s().total_cmp(&a.time_s()));
        Ok(Profile {
            runs,
            median_s: times[runs / 2],
            mean_s,
            kernels,
        })
    }
}

fn list(v: &[String], max: usize) -> String {
    let mut s = v.iter().take(max).cloned().collect::<Vec<_>>().join(",");
    if v.len() > max {
        let _ = write!(s, ",+{}", v.len() - max);
    }
    s
}

/// The profile as a table, slowest kernel first.
pub fn table(p: &Profile) -> String {
    let mut t = String::new();
    let total = p.kernel_sum_s().max(1e-12);
    let _ = writeln!(
        t,
        "{:<8} {:>10} {:>6} {:>10} {:>9} {:>8} {:>8} {:<8} {:<6} {:>6}  {:<30} {:<22} nodes",
        "kernel",
        "measured",
        "share",
        "estimate",
        "GFLOP/s",
        "GB/s",
        "bound",
        "schedule",
        "matrix",
        "roof",
        "ops",
        "output"
    );
    for k in &p.kernels {
        let _ = writeln!(
            t,
            "{:<8} {:>8.1}us {:>5.1}% {:>8.1}us {:>9.2} {:>8.2} {:>8} {:<8} {:<6} {:>5.1}%  {:<30} {:<22} {}",
            k.id,
            k.time_s() * 1e6,
            100.0 * k.time_s() / total,
            k.estimate_s * 1e6,
            k.gflops(),
            k.gbps(),
            k.bound,
            k.schedule,
            k.matrix.map_or("-".to_string(), |m| m.to_string()),
            100.0 * k.roofline_fraction(),
            list(&k.ops, 4),
            k.output,
            list(&k.nodes, 3),
        );
        if !k.guard.is_empty() {
            t.pop();
            let _ = writeln!(t, " ({})", k.guard.join(" and "));
        }
    }
    let est: f64 = p.kernels.iter().map(|k| k.estimate_s).sum();
    let _ = writeln!(
        t,
        "kernels: {:.3} ms in all (mean run {:.3} ms, median {:.3} ms over {} runs); estimate {:.3} ms",
        total * 1e3,
        p.mean_s * 1e3,
        p.median_s * 1e3,
        p.runs,
        est * 1e3
    );
    let mut by_class: Vec<(ScheduleClass, usize, f64)> = vec![];
    for c in [
        ScheduleClass::Tiled,
        ScheduleClass::Vector,
        ScheduleClass::Scalar,
    ] {
        let ks: Vec<&KernelRecord> = p.kernels.iter().filter(|k| k.schedule == c).collect();
        by_class.push((
            c,
            ks.len(),
            ks.iter().map(|k| k.time_s()).sum::<f64>().max(0.0),
        ));
    }
    let parts: Vec<String> = by_class
        .iter()
        .map(|(c, n, s)| format!("{n} {c} ({:.1}%)", 100.0 * s / total))
        .collect();
    let _ = writeln!(t, "schedules: {}", parts.join(", "));
    let _ = writeln!(
        t,
        "estimate within 2x of the measured time for kernels holding {:.1}% of the time",
        100.0 * within_2x_share(p)
    );
    t
}

/// The share of measured time held by kernels whose estimate is within 2x of their measured time.
pub fn within_2x_share(p: &Profile) -> f64 {
    let total = p.kernel_sum_s().max(1e-12);
    p.kernels
        .iter()
        .filter(|k| {
            k.measured_s
                .is_some_and(|m| k.estimate_s <= 2.0 * m && m <= 2.0 * k.estimate_s)
        })
        .map(|k| k.time_s())
        .sum::<f64>()
        / total
}

/// `--profile --json`: one object, `{"model", "threads", "median_ms", "kernels": [...]}`.
pub fn json(model: &str, threads: u32, p: &Profile) -> String {
    use mlopt_rewrite::report::json_str;
    let strs = |v: &[String]| v.iter().map(|s| json_str(s)).collect::<Vec<_>>().join(", ");
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v:e}")
        } else {
            "null".into()
        }
    };
    let kernels: Vec<String> = p
        .kernels
        .iter()
        .map(|k| {
            format!(
                "{{\"id\": {}, \"ops\": [{}], \"nodes\": [{}], \"output\": {}, \"measured_ms\": {}, \"estimate_ms\": {}, \"flops\": {}, \"bytes\": {}, \"gflops\": {}, \"gbps\": {}, \"bound\": \"{}\", \"roofline_fraction\": {}, \"schedule\": \"{}\", \"matrix\": {}, \"guard\": [{}]}}",
                json_str(&k.id),
                strs(&k.ops),
                strs(&k.nodes),
                json_str(&k.output),
                num(k.time_s() * 1e3),
                num(k.estimate_s * 1e3),
                num(k.flops),
                num(k.bytes),
                num(k.gflops()),
                num(k.gbps()),
                k.bound,
                num(k.roofline_fraction()),
                k.schedule,
                k.matrix
                    .map_or("null".to_string(), |m| format!("\"{m}\"")),
                strs(&k.guard)
            )
        })
        .collect();
    format!(
        "{{\"model\": {}, \"threads\": {threads}, \"runs\": {}, \"median_ms\": {}, \"mean_ms\": {}, \"kernel_sum_ms\": {}, \"estimate_within_2x_share\": {}, \"kernels\": [{}]}}",
        json_str(model),
        p.runs,
        num(p.median_s * 1e3),
        num(p.mean_s * 1e3),
        num(p.kernel_sum_s() * 1e3),
        num(within_2x_share(p)),
        kernels.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_kir::{Elem, Expr, LoopKind, Space, Stmt};

    /// A kernel's class follows how its loops run: no vector loop is scalar, a vector loop is vector, a
    /// vector loop inside an unrolled one (a register tile) is tiled (here stores with no arithmetic).
    #[test]
    fn schedule_classes_follow_the_loops() {
        let nest = |outer: LoopKind, inner: LoopKind| {
            let mut k = Kernel::new("k0");
            let b = k.buf("out0", Elem::F32, vec![4, 16], Space::Global);
            let (i, j) = (k.var("i"), k.var("j"));
            let store = Stmt::Store {
                buf: b,
                index: vec![Expr::var(i), Expr::var(j)],
                value: Expr::f32(1.0),
            };
            k.body = vec![Stmt::For {
                var: i,
                extent: 4,
                kind: outer,
                body: vec![Stmt::For {
                    var: j,
                    extent: 16,
                    kind: inner,
                    body: vec![store],
                }],
            }];
            k
        };
        assert_eq!(
            mix(&nest(LoopKind::Serial, LoopKind::Serial)).class(),
            ScheduleClass::Scalar
        );
        assert_eq!(
            mix(&nest(LoopKind::Parallel, LoopKind::Serial)).class(),
            ScheduleClass::Scalar
        );
        assert_eq!(
            mix(&nest(LoopKind::Parallel, LoopKind::Vector(16))).class(),
            ScheduleClass::Vector
        );
        assert_eq!(
            mix(&nest(LoopKind::Unrolled, LoopKind::Vector(16))).class(),
            ScheduleClass::Tiled
        );
    }
}
