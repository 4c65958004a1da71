//! The optimiser's report: per kernel, its ops, FLOPs, bytes, estimated time and bound; totals before and
//! after; the e-graph figures. As text (the dump header, `--report`) and as JSON (`report.json`).

use crate::optimize::{Config, Optimized};
use std::fmt::Write;

/// One line describing kernel `k`, for the printed graph's `kernel kN {` header.
pub fn kernel_note(o: &Optimized, k: u32) -> String {
    let Some(info) = o.plan.kernels.get(k as usize) else {
        return String::new();
    };
    if info.view {
        return "view (no code)".into();
    }
    let guard = if info.guard.is_empty() {
        String::new()
    } else {
        format!(", runs {}", info.guard.join(" and "))
    };
    format!(
        "{:.3} MFLOP, {:.3} MB, {}, {}-bound{guard}",
        info.work.flops() / 1e6,
        info.work.bytes / 1e6,
        info.estimate.time,
        info.estimate.bound
    )
}

/// The dump header: stage, target, saturation figures and totals, as `;` comment lines.
pub fn header(o: &Optimized, cfg: &Config) -> String {
    let s = &o.stats;
    let mut h = String::new();
    let _ = writeln!(
        h,
        "; mlopt graph after \"optimized\" for target {}",
        cfg.target
    );
    let _ = writeln!(
        h,
        "; precision {}{}",
        cfg.precision,
        s.precision_error
            .map(|e| format!(", max relative error {e:.2e} vs fp32"))
            .unwrap_or_default()
    );
    if let Some(errors) = int8_errors(o) {
        let _ = writeln!(h, "; {errors}");
    }
    if !s.backed_off.is_empty() {
        let _ = writeln!(
            h,
            "; kept in fp32 by the precision check: {}",
            s.backed_off.join(", ")
        );
    }
    let _ = writeln!(
        h,
        "; e-graph: stopped by {} after {} iterations, {} e-nodes in {} e-classes, saturation {:.3} s, extraction+fusion {:.3} s",
        s.stop_reason, s.iterations, s.egraph_nodes, s.egraph_classes, s.saturate_s, s.extract_s
    );
    let applied: Vec<String> = s
        .applied
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} x{n}"))
        .collect();
    if !applied.is_empty() {
        let _ = writeln!(h, "; rules applied: {}", applied.join(", "));
    }
    let kernels = o.plan.kernels.iter().filter(|k| !k.view).count();
    let _ = writeln!(
        h,
        "; estimate: {} before (one kernel per op), {} after ({} kernels), {:.2}x; peak activation memory {:.3} MB",
        o.before,
        o.plan.total,
        kernels,
        o.before.as_secs() / o.plan.total.as_secs().max(1e-12),
        o.plan.peak_bytes as f64 / 1e6
    );
    h
}

/// `--precision int8`: how many contractions mlopt quantized and each output's error against fp32.
pub fn int8_errors(o: &Optimized) -> Option<String> {
    let s = &o.stats;
    (s.quantized > 0 || !s.output_errors.is_empty()).then(|| {
        let errors: Vec<String> = s
            .output_errors
            .iter()
            .map(|(name, e)| format!("{} {e:.2e}", name.escape_default()))
            .collect();
        format!(
            "int8: {} contractions quantized by mlopt (per-channel i8 weights, u8 activations calibrated by min and max); error against fp32 per output (largest difference over its largest magnitude, on the calibration inputs): {}",
            s.quantized,
            errors.join(", ")
        )
    })
}

/// The printed optimised graph with its header.
pub fn dump(o: &Optimized, cfg: &Config) -> String {
    header(o, cfg) + &mlopt_ir::print::print_with(&o.plan.graph, &|k| kernel_note(o, k))
}

/// A table of kernels, one per line.
pub fn table(o: &Optimized) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<6} {:>12} {:>12} {:>12} {:>8}  ops",
        "kernel", "MFLOP", "MB", "estimate", "bound"
    );
    for (i, k) in o.plan.kernels.iter().enumerate() {
        let bound = if k.view {
            "view".to_string()
        } else {
            k.estimate.bound.to_string()
        };
        let guard = if k.guard.is_empty() {
            String::new()
        } else {
            format!("  ({})", k.guard.join(" and "))
        };
        let _ = writeln!(
            t,
            "k{:<5} {:>12.3} {:>12.3} {:>12} {:>8}  {}{guard}",
            i,
            k.work.flops() / 1e6,
            k.work.bytes / 1e6,
            k.estimate.time.to_string(),
            bound,
            k.ops.join(" ")
        );
    }
    let _ = writeln!(
        t,
        "total: {} before, {} after ({:.2}x), peak activation memory {:.3} MB",
        o.before,
        o.plan.total,
        o.before.as_secs() / o.plan.total.as_secs().max(1e-12),
        o.plan.peak_bytes as f64 / 1e6
    );
    t
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `report.json`: the same figures, machine-readable; `extra` adds top-level fields (name, JSON value) from
/// later stages.
pub fn json(o: &Optimized, cfg: &Config, extra: &[(&str, String)]) -> String {
    let s = &o.stats;
    let kernels: Vec<String> = o
        .plan
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let ops: Vec<String> = k.ops.iter().map(|op| json_str(op)).collect();
            let guard: Vec<String> = k.guard.iter().map(|g| json_str(g)).collect();
            format!(
                "    {{\"id\": {i}, \"root\": {}, \"ops\": [{}], \"guard\": [{}], \"flops\": {}, \"bytes\": {}, \"estimate_s\": {:e}, \"bound\": \"{}\"}}",
                json_str(&k.root),
                ops.join(", "),
                guard.join(", "),
                k.work.flops(),
                k.work.bytes,
                k.estimate.time.as_secs(),
                if k.view { "view".into() } else { k.estimate.bound.to_string() }
            )
        })
        .collect();
    let applied: Vec<String> = s
        .applied
        .iter()
        .map(|(r, n)| format!("{}: {n}", json_str(r)))
        .collect();
    format!(
        "{{\n  \"target\": {},\n  \"precision\": \"{}\",\n  \"egraph\": {{\"stop_reason\": {}, \"iterations\": {}, \"nodes\": {}, \"classes\": {}, \"saturate_s\": {}, \"extract_s\": {}}},\n  \"rules_applied\": {{{}}},\n  \"output_errors\": {{{}}},\n  \"before_s\": {:e},\n  \"after_s\": {:e},\n  \"peak_activation_bytes\": {},\n{}  \"kernels\": [\n{}\n  ]\n}}\n",
        json_str(cfg.target.name()),
        cfg.precision,
        json_str(&s.stop_reason),
        s.iterations,
        s.egraph_nodes,
        s.egraph_classes,
        s.saturate_s,
        s.extract_s,
        applied.join(", "),
        s.output_errors
            .iter()
            .map(|(n, e)| format!("{}: {e:e}", json_str(n)))
            .collect::<Vec<_>>()
            .join(", "),
        o.before.as_secs(),
        o.plan.total.as_secs(),
        o.plan.peak_bytes,
        extra.iter().map(|(k, v)| format!("  {}: {v},\n", json_str(k))).collect::<String>(),
        kernels.join(",\n")
    )
}
