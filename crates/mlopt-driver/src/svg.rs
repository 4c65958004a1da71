//! Plots as hand-written SVG: the roofline of a compiled model (every kernel a point under the target's
//! roofs) and the latency/throughput curve of a batch sweep. Hand-written rather than plotters: the
//! output is a few kilobytes of plain text with one `<circle class="kernel">` per kernel (which tests
//! count), it needs no font or image dependency, and a browser shows each point's figures on hover.

use crate::profile::KernelRecord;
use mlopt_cost::{class_rate, ScheduleClass};
use mlopt_target::{MatrixPrecision, Target};
use std::fmt::Write;

const W: f64 = 1060.0;
const H: f64 = 600.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 330.0;
const TOP: f64 = 64.0;
const BOTTOM: f64 = 64.0;
/// Kernels numbered on the plot and listed beside it, slowest first.
const LABELLED: usize = 12;

/// `s` with XML's special characters escaped, for text and attribute values.
pub fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

fn color(c: ScheduleClass) -> &'static str {
    match c {
        ScheduleClass::Tiled => "#2a9d8f",
        ScheduleClass::Vector => "#3a6ea5",
        ScheduleClass::Scalar => "#e63946",
    }
}

/// A log-scaled axis over whole decades.
struct LogAxis {
    lo: f64,
    hi: f64,
    from: f64,
    to: f64,
}

impl LogAxis {
    fn new(min: f64, max: f64, from: f64, to: f64) -> LogAxis {
        let lo = min.max(1e-12).log10().floor();
        let hi = max.max(min * 10.0).log10().ceil().max(lo + 1.0);
        LogAxis { lo, hi, from, to }
    }
    fn at(&self, v: f64) -> f64 {
        let t = (v.max(1e-300).log10().clamp(self.lo, self.hi) - self.lo) / (self.hi - self.lo);
        self.from + t * (self.to - self.from)
    }
    fn min(&self) -> f64 {
        10f64.powf(self.lo)
    }
    fn max(&self) -> f64 {
        10f64.powf(self.hi)
    }
    fn decades(&self) -> impl Iterator<Item = f64> {
        (self.lo as i32..=self.hi as i32).map(|e| 10f64.powi(e))
    }
}

fn number(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').to_string()
    }
}

/// The roofline plot: x = arithmetic intensity (FLOP/byte), y = GFLOP/s (achieved where measured,
/// else the cost model's estimate), each kernel a circle whose area is its share of the time, coloured
/// by schedule class, under the target's memory roof, its fp32 and bf16 compute roofs (and the integer
/// contractions' where a kernel runs on it) and the ceiling of a
/// scalar nest. Kernels without FLOPs (copies, layout changes) sit on the bottom edge, hollow.
pub fn roofline(title: &str, t: &Target, kernels: &[KernelRecord]) -> String {
    let measured = kernels.iter().any(|k| k.measured_s.is_some());
    let total: f64 = kernels
        .iter()
        .map(KernelRecord::time_s)
        .sum::<f64>()
        .max(1e-12);
    let bf16 = t.fast_matrix(MatrixPrecision::Bf16);
    // The integer contractions' roof, drawn where a kernel runs on it (a quantized model).
    let i16 = t.fast_matrix(MatrixPrecision::I16).filter(|_| {
        kernels
            .iter()
            .any(|k| k.matrix == Some(MatrixPrecision::I16))
    });
    let peak = t
        .roof()
        .fp32
        .max(bf16.unwrap_or(0.0))
        .max(i16.unwrap_or(0.0))
        / 1e9;
    let bw = t.roof().dram_bw / 1e9;
    let scalar_roof = t.roof().fp32 * class_rate(t, ScheduleClass::Scalar) / 1e9;
    let with_flops: Vec<&KernelRecord> = kernels
        .iter()
        .filter(|k| k.flops > 0.0 && k.bytes > 0.0)
        .collect();
    let imin = with_flops
        .iter()
        .map(|k| k.intensity())
        .fold(0.05, f64::min);
    let imax = with_flops
        .iter()
        .map(|k| k.intensity())
        .fold(100.0, f64::max);
    let ymin = with_flops
        .iter()
        .map(|k| k.gflops())
        .fold(scalar_roof.min(1.0), f64::min);
    let p = Plot {
        x: LogAxis::new(imin, imax, LEFT, W - RIGHT),
        y: LogAxis::new(ymin, peak * 2.0, H - BOTTOM, TOP),
        bw,
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r##"<rect width="{W}" height="{H}" fill="#ffffff"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="17" font-weight="bold">{}</text>"#,
        xml(title)
    );
    let what = if measured {
        "measured"
    } else {
        "estimated by the cost model"
    };
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="44" fill="#555">{} kernels, {:.3} ms {what}; {} ({:.1} GFLOP/s fp32, {:.1} GB/s)</text>"##,
        kernels.len(),
        total * 1e3,
        xml(t.name()),
        t.roof().fp32 / 1e9,
        bw
    );
    p.axes(&mut s);
    p.roof(&mut s, t.roof().fp32 / 1e9, "", "fp32");
    if let Some(b) = bf16.filter(|b| *b > t.roof().fp32) {
        p.roof(&mut s, b / 1e9, r#"stroke-dasharray="8 4""#, "bf16");
    }
    if let Some(i) = i16.filter(|i| *i > t.roof().fp32) {
        p.roof(
            &mut s,
            i / 1e9,
            r#"stroke-dasharray="2 3""#,
            "int8 (i16 pairs)",
        );
    }
    p.scalar_and_bandwidth(&mut s, scalar_roof);
    // Kernels, largest first so small ones stay visible on top.
    let mut order: Vec<&KernelRecord> = kernels.iter().collect();
    order.sort_by(|a, b| b.time_s().total_cmp(&a.time_s()));
    for (rank, k) in order.iter().enumerate() {
        p.kernel(&mut s, rank, k, total);
    }
    legend(&mut s, kernels, &order, total);
    s.push_str("</svg>\n");
    s
}

/// The roofline plot's axes and the memory roof's bandwidth in GB/s.
struct Plot {
    x: LogAxis,
    y: LogAxis,
    bw: f64,
}

impl Plot {
    /// The grid, the frame and the axes' labels.
    fn axes(&self, s: &mut String) {
        let (x, y) = (&self.x, &self.y);
        for d in x.decades() {
            let px = x.at(d);
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#e6e6e6"/>"##,
                H - BOTTOM
            );
            let _ = writeln!(
                s,
                r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                H - BOTTOM + 18.0,
                number(d)
            );
        }
        for d in y.decades() {
            let py = y.at(d);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e6e6e6"/>"##,
                W - RIGHT
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                py + 4.0,
                number(d)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
            W - RIGHT - LEFT,
            H - BOTTOM - TOP
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            H - 20.0
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(22,{:.1}) rotate(-90)" text-anchor="middle">GFLOP/s</text>"#,
            (TOP + H - BOTTOM) / 2.0
        );
    }

    /// A roof: bandwidth x intensity up to the compute peak `p` (GFLOP/s).
    fn roof(&self, s: &mut String, p: f64, dash: &str, label: &str) {
        let (x, y, bw) = (&self.x, &self.y, self.bw);
        let ridge = p / bw;
        let (x0, x1) = (x.min(), x.max());
        let start = (x0, (bw * x0).min(p));
        let pts = if ridge > x0 && ridge < x1 {
            vec![start, (ridge, p), (x1, p)]
        } else {
            vec![start, (x1, (bw * x1).min(p))]
        };
        let path: Vec<String> = pts
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x.at(*a), y.at(*b)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#222" stroke-width="2" {dash}/>"##,
            path.join(" ")
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#222">{} {:.0} GFLOP/s</text>"##,
            W - RIGHT - 4.0,
            y.at(p) - 5.0,
            xml(label),
            p
        );
    }

    /// The scalar nest's ceiling and the memory roof's label.
    fn scalar_and_bandwidth(&self, s: &mut String, scalar_roof: f64) {
        let (x, y, bw) = (&self.x, &self.y, self.bw);
        let sy = y.at(scalar_roof);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{sy:.1}" x2="{:.1}" y2="{sy:.1}" stroke="#e63946" stroke-dasharray="3 3"/>"##,
            W - RIGHT
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#e63946">scalar nest {scalar_roof:.1} GFLOP/s</text>"##,
            LEFT + 110.0,
            sy - 5.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#222">{bw:.1} GB/s</text>"##,
            x.at(x.min()) + 6.0,
            y.at(bw * x.min()) - 6.0
        );
    }

    /// Kernel `k`, the `rank`-th slowest, as a circle with its figures on hover (numbered when it is
    /// among the slowest).
    fn kernel(&self, s: &mut String, rank: usize, k: &KernelRecord, total: f64) {
        let (x, y) = (&self.x, &self.y);
        let share = k.time_s() / total;
        let r = 3.0 + 26.0 * share.sqrt();
        let flopless = k.flops <= 0.0 || k.bytes <= 0.0;
        let (px, py) = if flopless {
            (x.at(x.min()), y.at(y.min()))
        } else {
            (x.at(k.intensity()), y.at(k.gflops()))
        };
        let c = color(k.schedule);
        let fill = if flopless { "none" } else { c };
        let tip = format!(
            "{} [{}] {} -> {}: {:.1} us ({:.1}%), estimate {:.1} us, {:.2} GFLOP/s, {:.2} GB/s, {:.1} FLOP/B, {:.1}% of roofline{}",
            k.id,
            k.schedule,
            k.ops.join(" "),
            k.output,
            k.time_s() * 1e6,
            100.0 * share,
            k.estimate_s * 1e6,
            k.gflops(),
            k.gbps(),
            k.intensity(),
            100.0 * k.roofline_fraction(),
            if k.nodes.is_empty() { String::new() } else { format!("; nodes {}", k.nodes.join(", ")) }
        );
        let _ = writeln!(
            s,
            r#"<circle class="kernel" data-id="{}" cx="{px:.1}" cy="{py:.1}" r="{r:.1}" fill="{fill}" fill-opacity="0.55" stroke="{c}" stroke-width="1.5"><title>{}</title></circle>"#,
            xml(&k.id),
            xml(&tip)
        );
        if rank < LABELLED && !flopless {
            let _ = writeln!(
                s,
                r##"<text x="{px:.1}" y="{:.1}" text-anchor="middle" fill="#111" font-size="10" font-weight="bold">{}</text>"##,
                py + 3.5,
                rank + 1
            );
        }
    }
}

/// The legend beside the roofline: each schedule class's kernels and share of the time, and the
/// slowest kernels (`order`, slowest first) by number.
fn legend(s: &mut String, kernels: &[KernelRecord], order: &[&KernelRecord], total: f64) {
    let lx = W - RIGHT + 20.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx}" y="{}" font-weight="bold">schedule</text>"#,
        TOP + 8.0
    );
    let classes = [
        ScheduleClass::Tiled,
        ScheduleClass::Vector,
        ScheduleClass::Scalar,
    ];
    for (i, c) in classes.into_iter().enumerate() {
        let ly = TOP + 30.0 + 24.0 * i as f64;
        let n = kernels.iter().filter(|k| k.schedule == c).count();
        let time: f64 = kernels
            .iter()
            .filter(|k| k.schedule == c)
            .map(KernelRecord::time_s)
            .sum();
        let share = (time / total).max(0.0);
        let _ = writeln!(
            s,
            r#"<circle cx="{}" cy="{ly}" r="7" fill="{}" fill-opacity="0.55" stroke="{}"/>"#,
            lx + 7.0,
            color(c),
            color(c)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{c}: {n} kernels, {:.1}% of time</text>"#,
            lx + 20.0,
            ly + 4.0,
            100.0 * share
        );
    }
    let ly = TOP + 30.0 + 24.0 * 3.0;
    let _ = writeln!(
        s,
        r##"<circle cx="{}" cy="{ly}" r="7" fill="none" stroke="#555"/>"##,
        lx + 7.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}">no FLOPs (bottom-left)</text>"#,
        lx + 20.0,
        ly + 4.0
    );
    let _ = writeln!(
        s,
        r##"<text x="{lx}" y="{}" fill="#555">area = share of time; hover for figures</text>"##,
        ly + 26.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{lx}" y="{}" font-weight="bold">slowest kernels</text>"#,
        ly + 56.0
    );
    for (rank, k) in order.iter().take(LABELLED).enumerate() {
        let op = k
            .ops
            .iter()
            .find(|o| matches!(o.as_str(), "conv" | "matmul" | "gemm" | "attention"))
            .or(k.ops.first())
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(
            s,
            r#"<text x="{lx}" y="{}" font-size="11"><tspan font-weight="bold">{}</tspan> {} {} [{}] {:.1}%, {:.2} GFLOP/s</text>"#,
            ly + 76.0 + 17.0 * rank as f64,
            rank + 1,
            xml(&k.id),
            xml(&op),
            k.schedule,
            100.0 * k.time_s() / total,
            k.gflops()
        );
    }
}

/// Round tick values from 0 up to `max`: steps of 1, 2 or 5 times a power of ten, about five of them.
fn ticks(max: f64) -> Vec<f64> {
    let raw = (max / 5.0).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (0..)
        .map(|i| i as f64 * step)
        .take_while(|v| *v <= max * (1.0 + 1e-9))
        .collect()
}

/// One point of a batch sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPoint {
    pub batch: u64,
    pub threads: u32,
    pub median_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// Items per second at the median latency.
    pub throughput: f64,
}

/// Throughput against latency (p99 on x, items/s on y), one line per thread count, each point labelled
/// with its batch; a latency budget, when given, is a vertical line.
pub fn batch_curve(title: &str, points: &[BatchPoint], budget_ms: Option<f64>) -> String {
    let xmax = points
        .iter()
        .map(|p| p.p99_ms)
        .fold(budget_ms.unwrap_or(0.0), f64::max)
        .max(1e-3)
        * 1.1;
    let ymax = points
        .iter()
        .map(|p| p.throughput)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.15;
    let px = |v: f64| LEFT + v / xmax * (W - RIGHT - LEFT);
    let py = |v: f64| H - BOTTOM - v / ymax * (H - BOTTOM - TOP);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r##"<rect width="{W}" height="{H}" fill="#ffffff"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="17" font-weight="bold">{}</text>"#,
        xml(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="44" fill="#555">throughput against p99 latency, one point per batch size</text>"##
    );
    for vx in ticks(xmax) {
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{TOP}" x2="{:.1}" y2="{:.1}" stroke="#e6e6e6"/>"##,
            px(vx),
            px(vx),
            H - BOTTOM
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            px(vx),
            H - BOTTOM + 18.0,
            number(vx)
        );
    }
    for vy in ticks(ymax) {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#e6e6e6"/>"##,
            py(vy),
            W - RIGHT,
            py(vy)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            py(vy) + 4.0,
            number(vy)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
        W - RIGHT - LEFT,
        H - BOTTOM - TOP
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">p99 latency (ms)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 20.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(22,{:.1}) rotate(-90)" text-anchor="middle">throughput (items/s)</text>"#,
        (TOP + H - BOTTOM) / 2.0
    );
    if let Some(b) = budget_ms {
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{TOP}" x2="{:.1}" y2="{:.1}" stroke="#e63946" stroke-dasharray="6 4" stroke-width="2"/>"##,
            px(b),
            px(b),
            H - BOTTOM
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#e63946">budget {b} ms</text>"##,
            px(b) + 4.0,
            TOP + 14.0
        );
    }
    let mut threads: Vec<u32> = points.iter().map(|p| p.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    let palette = ["#3a6ea5", "#2a9d8f", "#e9c46a", "#8e44ad"];
    for (i, t) in threads.iter().enumerate() {
        let c = palette[i % palette.len()];
        let mut line: Vec<&BatchPoint> = points.iter().filter(|p| p.threads == *t).collect();
        line.sort_by_key(|p| p.batch);
        let path: Vec<String> = line
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.p99_ms), py(p.throughput)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for p in line {
            let _ = writeln!(
                s,
                r#"<circle class="batch" cx="{:.1}" cy="{:.1}" r="5" fill="{c}"><title>batch {} at {} threads: median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, {:.1} items/s</title></circle>"#,
                px(p.p99_ms),
                py(p.throughput),
                p.batch,
                p.threads,
                p.median_ms,
                p.p90_ms,
                p.p99_ms,
                p.throughput
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="11">b={}</text>"#,
                px(p.p99_ms) + 7.0,
                py(p.throughput) - 6.0,
                p.batch
            );
        }
        let ly = TOP + 30.0 + 24.0 * i as f64;
        let lx = W - RIGHT + 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/>"#,
            lx + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{t} thread{}</text>"#,
            lx + 26.0,
            ly + 4.0,
            if *t == 1 { "" } else { "s" }
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_cost::Bound;

    fn record(id: &str, flops: f64, bytes: f64, ms: f64, class: ScheduleClass) -> KernelRecord {
        KernelRecord {
            id: id.into(),
            ops: vec!["conv".into(), "<&\"'>".into()],
            nodes: vec!["a</title><script>".into()],
            output: "f32[1,8]".into(),
            flops,
            bytes,
            estimate_s: ms * 1e-3,
            roofline_s: ms * 1e-4,
            bound: Bound::Compute,
            schedule: class,
            matrix: None,
            measured_s: Some(ms * 1e-3),
            guard: Vec::new(),
        }
    }

    /// One circle per kernel, flop-less ones included, every name escaped: the file parses as XML whatever
    /// the model's node names hold.
    #[test]
    fn roofline_has_one_escaped_point_per_kernel() {
        let t = mlopt_target::Target::named("x86-64-v4", 1).unwrap();
        let ks = vec![
            record("k0", 2e9, 1e7, 10.0, ScheduleClass::Tiled),
            record("k1&", 1e6, 1e6, 1.0, ScheduleClass::Scalar),
            record("copy0", 0.0, 4e3, 0.01, ScheduleClass::Vector),
        ];
        let svg = roofline("model <with> \"quotes\"", &t, &ks);
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let ids: Vec<&str> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("kernel"))
            .filter_map(|n| n.attribute("data-id"))
            .collect();
        assert_eq!(ids, ["k0", "k1&", "copy0"]);
        assert!(!svg.contains("<script>"));
        // The tiled kernel, at 200 GFLOP/s on a 140 GFLOP/s roof, is clamped inside the plot.
        let cy: Vec<f64> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("kernel"))
            .map(|n| n.attribute("cy").unwrap().parse().unwrap())
            .collect();
        assert!(cy.iter().all(|y| (TOP..=H - BOTTOM).contains(y)), "{cy:?}");
    }

    /// The integer contractions' roof is drawn where a kernel runs on it (a quantized model on a CPU
    /// with an integer dot product), and only there.
    #[test]
    fn roofline_draws_the_integer_roof_for_integer_kernels() {
        let t = mlopt_target::Target::named("x86-64-v4", 1).unwrap();
        let mut k = record("k0", 2e9, 1e7, 10.0, ScheduleClass::Tiled);
        assert!(!roofline("float", &t, std::slice::from_ref(&k)).contains("int8 (i16 pairs)"));
        k.matrix = Some(MatrixPrecision::I16);
        let svg = roofline("quantized", &t, &[k]);
        roxmltree::Document::parse(&svg).unwrap();
        assert!(svg.contains("int8 (i16 pairs)"));
    }

    #[test]
    fn batch_curve_has_one_point_per_batch_and_thread_count() {
        let pts: Vec<BatchPoint> = [(1, 1, 2.0), (4, 1, 6.0), (1, 2, 1.5), (4, 2, 4.0)]
            .into_iter()
            .map(|(b, t, ms)| BatchPoint {
                batch: b,
                threads: t,
                median_ms: ms,
                p90_ms: ms * 1.1,
                p99_ms: ms * 1.2,
                throughput: b as f64 / (ms / 1e3),
            })
            .collect();
        let svg = batch_curve("m", &pts, Some(5.0));
        let doc = roxmltree::Document::parse(&svg).unwrap();
        assert_eq!(
            doc.descendants()
                .filter(|n| n.attribute("class") == Some("batch"))
                .count(),
            4
        );
        assert_eq!(
            doc.descendants()
                .filter(|n| n.tag_name().name() == "polyline")
                .count(),
            2
        );
    }
}
