//! The text form of a graph. Values are renumbered densely in topological order (`%0`, `%1`, ...), graph
//! inputs keep their names, attributes are sorted, and constants print their data only when small (at most
//! `INLINE_LIMIT` values); larger ones print by name (`const @"fc1.weight"`) and `parse` resolves them from a
//! weights table. `parse(print(g))` prints identically; see `text_tests`.
//!
//! ```text
//! graph @mlp(%x: f32[8,784]) {
//!   %0: f32[784,256] = const @"fc1.weight"
//!   %1: f32[8,256] = matmul %x, %0 @"MatMul_0"
//!   return %1 @"y"
//! }
//! ```

use crate::dispatch;
use crate::graph::{Graph, NodeId, Value};
use crate::op::Op;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::fmt::Write;

/// Constants with at most this many values print their data inline.
pub const INLINE_LIMIT: usize = 4;

/// `s` bare if it is a plain identifier, else quoted with `"` and `\` escaped.
pub fn ident(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain && s != "_" {
        s.to_string()
    } else {
        quote(s)
    }
}

pub fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            // Other control characters (a terminal's escape sequences) as \u{hex}, so printed IR is
            // safe on a terminal and still parses back to the same name.
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The inline data of a small constant, `[v, v, ...]` in row-major order.
pub fn inline_data(t: &Tensor) -> String {
    let items: Vec<String> = match t {
        Tensor::F16(a) => a.iter().map(|v| format!("{:?}", v.to_f32())).collect(),
        Tensor::BF16(a) => a.iter().map(|v| format!("{:?}", v.to_f32())).collect(),
        t => dispatch!(t, a => a.iter().map(|v| format!("{v:?}")).collect()),
    };
    format!("[{}]", items.join(", "))
}

/// For elementwise ops, the inputs whose shape differs from the output's, e.g. `%3 [256]` (a comment: facts
/// for the reader, ignored by the parser).
fn broadcast_note(
    g: &Graph,
    n: NodeId,
    ins: &[Option<Value>],
    names: &HashMap<Value, String>,
) -> String {
    let node = g.node(n);
    if !matches!(node.op, Op::Binary(_) | Op::Nary(_) | Op::Where) {
        return String::new();
    }
    let out = &node.outputs[0].shape;
    let parts: Vec<String> = ins
        .iter()
        .flatten()
        .copied()
        .filter(|v| &g.value_type(*v).shape != out)
        .map(|v| {
            format!(
                "{} {:?}",
                names.get(&v).map(String::as_str).unwrap_or("%?"),
                g.value_type(v).shape
            )
            .replace(", ", ",")
        })
        .collect();
    parts.join(", ")
}

/// Prints `g` in the text format.
pub fn print(g: &Graph) -> String {
    print_with(g, &|_| String::new())
}

/// Prints `g`; the nodes of each kernel (fusion group) print together in a `kernel kN { ... }` block, placed
/// where its last node is in topological order, headed by `note(N)` as a comment when that is not empty.
pub fn print_with(g: &Graph, note: &dyn Fn(u32) -> String) -> String {
    let mut names: HashMap<Value, String> = HashMap::new();
    let mut out = String::new();
    let inputs: Vec<String> = g
        .graph_inputs()
        .iter()
        .map(|&n| {
            let v = Value { node: n, output: 0 };
            let name = format!("%{}", ident(&g.node(n).name));
            names.insert(v, name.clone());
            format!("{name}: {}", g.value_type(v))
        })
        .collect();
    let _ = writeln!(out, "graph @{}({}) {{", ident(&g.name), inputs.join(", "));
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
    // Each kernel prints at its last member's place; members wait until then.
    let mut last: HashMap<u32, usize> = HashMap::new();
    for (i, &n) in order.iter().enumerate() {
        if let Some(k) = g.node(n).kernel {
            last.insert(k, i);
        }
    }
    let mut waiting: HashMap<u32, Vec<NodeId>> = HashMap::new();
    let mut next = 0;
    for (i, &n) in order.iter().enumerate() {
        let node = g.node(n);
        if node.op == Op::Input {
            continue;
        }
        let Some(k) = node.kernel else {
            print_node(g, n, &mut names, &mut next, "  ", &mut out);
            continue;
        };
        waiting.entry(k).or_default().push(n);
        if last.get(&k) == Some(&i) {
            let header = note(k);
            let _ = writeln!(
                out,
                "  kernel k{k} {{{}",
                if header.is_empty() {
                    String::new()
                } else {
                    format!("  ; {header}")
                }
            );
            for m in waiting.remove(&k).unwrap_or_default() {
                print_node(g, m, &mut names, &mut next, "    ", &mut out);
            }
            out.push_str("  }\n");
        }
    }
    let rets: Vec<String> = g
        .graph_outputs()
        .iter()
        .map(|(name, v)| {
            format!(
                "{} @{}",
                names.get(v).cloned().unwrap_or_else(|| "%?".into()),
                quote(name)
            )
        })
        .collect();
    let _ = writeln!(out, "  return {}", rets.join(", "));
    out.push_str("}\n");
    out
}

/// One node's line, naming its outputs `%next`, `%next+1`, ...
fn print_node(
    g: &Graph,
    n: NodeId,
    names: &mut HashMap<Value, String>,
    next: &mut usize,
    indent: &str,
    out: &mut String,
) {
    let node = g.node(n);
    let ins = g.inputs(n);
    let mut defs = vec![];
    for (i, ty) in node.outputs.iter().enumerate() {
        let name = format!("%{next}");
        *next += 1;
        defs.push(format!("{name}: {ty}"));
        names.insert(
            Value {
                node: n,
                output: i as u32,
            },
            name,
        );
    }
    let mut line = format!("{indent}{} = {}", defs.join(", "), node.op.name());
    match &node.op {
        Op::Const(t) if t.numel() <= INLINE_LIMIT => {
            let _ = write!(line, " {}", inline_data(t));
        }
        Op::Const(_) => {}
        op => {
            let attrs = op.spell_attrs();
            if !attrs.is_empty() {
                let parts: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(line, "[{}]", parts.join(", "));
            }
            let args: Vec<String> = ins
                .iter()
                .map(|v| {
                    v.and_then(|v| names.get(&v).cloned())
                        .unwrap_or_else(|| "_".into())
                })
                .collect();
            if !args.is_empty() {
                let _ = write!(line, " {}", args.join(", "));
            }
        }
    }
    if !node.name.is_empty() {
        let _ = write!(line, " @{}", quote(&node.name));
    }
    let broadcast = broadcast_note(g, n, &ins, names);
    if !broadcast.is_empty() {
        let _ = write!(line, "  ; broadcast {broadcast}");
    }
    out.push_str(&line);
    out.push('\n');
}
