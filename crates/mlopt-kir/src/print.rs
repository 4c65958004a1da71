//! The kernel IR's text form. One kernel:
//!
//! ```text
//! ; schedule: split(j, 16) vector(j.v)
//! kernel @k3(%x: f32[16,64], %y: out f32[16,64]) {
//!   local %acc: f32[]
//!   parallel %i in 0..16 {
//!     serial %j.o in 0..4 {
//!       vector<16> %j.v in 0..16 {
//!         %y[%i, ((%j.o * 16) + %j.v)] = max(%x[%i, ((%j.o * 16) + %j.v)], 0.0f32)
//!       }
//!     }
//!   }
//! }
//! ```
//!
//! Index arithmetic (`+ - * / %`) prints infix, fully parenthesised; everything else as a call. `parse`
//! reads this back (print -> parse -> print is the identity, tested on every lowered kernel).

use crate::ir::*;
use crate::program::*;
use std::fmt::Write;

pub fn loop_kind(k: LoopKind) -> String {
    match k {
        LoopKind::Serial => "serial".into(),
        LoopKind::Parallel => "parallel".into(),
        LoopKind::Vector(w) => format!("vector<{w}>"),
        LoopKind::Unrolled => "unrolled".into(),
        LoopKind::GpuBlock(a) => format!("gpu.block.{}", axis(a)),
        LoopKind::GpuThread(a) => format!("gpu.thread.{}", axis(a)),
    }
}

fn axis(a: u8) -> char {
    ['x', 'y', 'z'].get(a as usize).copied().unwrap_or('?')
}

pub fn unop_name(o: UnOp) -> &'static str {
    match o {
        UnOp::Neg => "neg",
        UnOp::Abs => "abs",
        UnOp::Exp => "exp",
        UnOp::Log => "log",
        UnOp::Sqrt => "sqrt",
        UnOp::Tanh => "tanh",
        UnOp::Erf => "erf",
        UnOp::Floor => "floor",
        UnOp::Ceil => "ceil",
        UnOp::Round => "round",
        UnOp::Sin => "sin",
        UnOp::Cos => "cos",
        UnOp::Asin => "asin",
        UnOp::Acos => "acos",
        UnOp::Atan => "atan",
        UnOp::Not => "not",
    }
}

pub const UNOPS: [UnOp; 16] = [
    UnOp::Neg,
    UnOp::Abs,
    UnOp::Exp,
    UnOp::Log,
    UnOp::Sqrt,
    UnOp::Tanh,
    UnOp::Erf,
    UnOp::Floor,
    UnOp::Ceil,
    UnOp::Round,
    UnOp::Sin,
    UnOp::Cos,
    UnOp::Asin,
    UnOp::Acos,
    UnOp::Atan,
    UnOp::Not,
];
pub const BINOPS: [BinOp; 19] = [
    BinOp::Add,
    BinOp::Sub,
    BinOp::Mul,
    BinOp::Div,
    BinOp::Rem,
    BinOp::Min,
    BinOp::Max,
    BinOp::AtMost,
    BinOp::AtLeast,
    BinOp::Pow,
    BinOp::Lt,
    BinOp::Le,
    BinOp::Eq,
    BinOp::Ne,
    BinOp::And,
    BinOp::Or,
    BinOp::Xor,
    BinOp::Shl,
    BinOp::Shr,
];

/// The infix symbol of index arithmetic, or the call name of the other binary ops.
pub fn binop_name(o: BinOp) -> &'static str {
    match o {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Rem => "%",
        BinOp::Min => "min",
        BinOp::Max => "max",
        BinOp::AtMost => "atmost",
        BinOp::AtLeast => "atleast",
        BinOp::Pow => "pow",
        BinOp::Lt => "lt",
        BinOp::Le => "le",
        BinOp::Eq => "eq",
        BinOp::Ne => "ne",
        BinOp::And => "and",
        BinOp::Or => "or",
        BinOp::Xor => "xor",
        BinOp::Shl => "shl",
        BinOp::Shr => "shr",
    }
}

pub fn is_infix(o: BinOp) -> bool {
    matches!(
        o,
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem
    )
}

pub fn expr(k: &Kernel, e: &Expr) -> String {
    let mut s = String::new();
    write_expr(k, e, &mut s);
    s
}

fn write_expr(k: &Kernel, e: &Expr, s: &mut String) {
    match e {
        Expr::Int(v) => {
            let _ = write!(s, "{v}");
        }
        Expr::Float(v, t) => {
            let _ = write!(s, "{v:?}{t}");
        }
        Expr::Var(v) => {
            let _ = write!(s, "%{}", k.var_name(*v));
        }
        Expr::Load(b, ix) => {
            let _ = write!(s, "%{}[", k.buffer(*b).name);
            for (i, x) in ix.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                write_expr(k, x, s);
            }
            s.push(']');
        }
        Expr::Unary(o, a) => call(k, s, unop_name(*o), &[a]),
        Expr::Binary(o, a, b) if is_infix(*o) => {
            s.push('(');
            write_expr(k, a, s);
            let _ = write!(s, " {} ", binop_name(*o));
            write_expr(k, b, s);
            s.push(')');
        }
        Expr::Binary(o, a, b) => call(k, s, binop_name(*o), &[a, b]),
        Expr::Fma(a, b, c) => call(k, s, "fma", &[a, b, c]),
        Expr::Select(c, a, b) => call(k, s, "select", &[c, a, b]),
        Expr::Cast(t, a) => call(k, s, &format!("cast<{t}>"), &[a]),
    }
}

fn call(k: &Kernel, s: &mut String, name: &str, args: &[&Expr]) {
    s.push_str(name);
    s.push('(');
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        write_expr(k, a, s);
    }
    s.push(')');
}

pub fn dims(d: &[u64]) -> String {
    let parts: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// Prints a kernel (with its schedule as a header comment).
pub fn kernel(k: &Kernel) -> String {
    let mut s = String::new();
    if !k.schedule.is_empty() {
        let _ = writeln!(s, "; schedule: {}", crate::step::schedule_text(&k.schedule));
    }
    let params: Vec<String> = k
        .params()
        .iter()
        .map(|b| {
            let b = k.buffer(*b);
            format!("%{}: {}{}", b.name, b.elem, dims(&b.dims))
        })
        .collect();
    let _ = writeln!(s, "kernel @{}({}) {{", k.name, params.join(", "));
    for b in &k.bufs {
        let space = match b.space {
            Space::Global => continue,
            Space::Local => "local",
            Space::Shared => "shared",
        };
        let _ = writeln!(s, "  {space} %{}: {}{}", b.name, b.elem, dims(&b.dims));
    }
    for st in &k.body {
        stmt(k, st, 1, &mut s);
    }
    s.push_str("}\n");
    s
}

fn stmt(k: &Kernel, st: &Stmt, depth: usize, s: &mut String) {
    let pad = "  ".repeat(depth);
    match st {
        Stmt::For {
            var,
            extent,
            kind,
            body,
        } => {
            let _ = writeln!(
                s,
                "{pad}{} %{} in 0..{extent} {{",
                loop_kind(*kind),
                k.var_name(*var)
            );
            for b in body {
                stmt(k, b, depth + 1, s);
            }
            let _ = writeln!(s, "{pad}}}");
        }
        Stmt::Store { buf, index, value } => {
            let ix: Vec<String> = index.iter().map(|e| expr(k, e)).collect();
            let _ = writeln!(
                s,
                "{pad}%{}[{}] = {}",
                k.buffer(*buf).name,
                ix.join(", "),
                expr(k, value)
            );
        }
        Stmt::If { cond, then } => {
            let _ = writeln!(s, "{pad}if {} {{", expr(k, cond));
            for b in then {
                stmt(k, b, depth + 1, s);
            }
            let _ = writeln!(s, "{pad}}}");
        }
        Stmt::Barrier => {
            let _ = writeln!(s, "{pad}barrier");
        }
        Stmt::Mma {
            m,
            n,
            k: depth_k,
            c,
            a,
            b,
            acc,
            ahead,
        } => {
            let _ = writeln!(
                s,
                "{pad}mma<{m}x{n}x{depth_k}> {} {} {} * {}{}",
                block(k, c),
                if *acc { "+=" } else { "=" },
                block(k, a),
                block(k, b),
                if *ahead { " ahead" } else { "" }
            );
        }
        Stmt::WarpMma { c, a, b } => {
            let _ = writeln!(
                s,
                "{pad}mma.sync {} += {} * {}",
                block(k, c),
                block(k, a),
                block(k, b)
            );
        }
        Stmt::CopyAsync {
            dst,
            src,
            from,
            lanes,
            valid,
        } => {
            let when = valid
                .as_ref()
                .map(|c| format!(" when {}", expr(k, c)))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "{pad}cp.async x{lanes} {} <- {}{when}",
                block(k, dst),
                flat(k, *src, from)
            );
        }
        Stmt::AsyncWait => {
            let _ = writeln!(s, "{pad}cp.async.wait_all");
        }
        Stmt::Prefetch { buf, at } => {
            let _ = writeln!(s, "{pad}prefetch {}", flat(k, *buf, at));
        }
        Stmt::WarpReduce { buf, op } => {
            let _ = writeln!(
                s,
                "{pad}warp.reduce({}) %{}[]",
                binop_name(*op),
                k.buffer(*buf).name
            );
        }
    }
}

/// `%buf.flat[e]`: element `e` of `buf`, row-major.
fn flat(k: &Kernel, buf: BufId, e: &Expr) -> String {
    format!("%{}.flat[{}]", k.buffer(buf).name, expr(k, e))
}

/// `%buf[index..]`: an operand block.
fn block(k: &Kernel, x: &crate::Block) -> String {
    format!(
        "%{}[{}]",
        k.buffer(x.buf).name,
        x.at.iter()
            .map(|e| expr(k, e))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Prints a program: its interface, arena, weights (by name and shape, never data), kernels and steps.
pub fn program(p: &Program) -> String {
    let mut s = String::new();
    let io = |v: &[Io]| {
        v.iter()
            .map(|x| {
                let counted = x
                    .counted
                    .map(|c| format!(" (axis {} sized by output {})", c.axis, c.output))
                    .unwrap_or_default();
                let seq = x
                    .sequence
                    .as_ref()
                    .map(|s| format!(" (of sequence {s})"))
                    .unwrap_or_default();
                format!("%{}: {}{}{counted}{seq}", x.name, x.elem, dims(&x.dims))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "; program @{}({}) -> ({}), arena {} bytes",
        p.name,
        io(&p.inputs),
        io(&p.outputs),
        p.arena_bytes
    );
    for w in &p.weights {
        let _ = writeln!(s, "; weight @\"{}\": {}{}", w.name, w.elem, dims(&w.dims));
    }
    for k in &p.kernels {
        s.push('\n');
        s.push_str(&kernel(k));
    }
    s.push('\n');
    for st in &p.steps {
        let args: Vec<String> = st.args.iter().map(place).collect();
        let check = st
            .check
            .as_ref()
            .map(|c| format!(" check arena+{} \"{}\"", c.flag, c.message.escape_default()))
            .unwrap_or_default();
        let guard: String = st
            .guard
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let word = if g.when { "when" } else { "unless" };
                let sep = if i == 0 { " " } else { " and " };
                format!("{sep}{word} {}", place(&g.place))
            })
            .collect();
        let _ = writeln!(
            s,
            "call @{}({}){check}{guard}",
            p.kernels[st.kernel].name,
            args.join(", ")
        );
    }
    s
}

/// A step argument's or guard's place: `in0`, `out0`, `w0`, `arena+64`.
fn place(a: &Place) -> String {
    match a {
        Place::Input(i) => format!("in{i}"),
        Place::Output(i) => format!("out{i}"),
        Place::Weight(i) => format!("w{i}"),
        Place::Arena(o) => format!("arena+{o}"),
    }
}
