//! Reads a kernel back from the text `print::kernel` writes, so kernel dumps can be edited and replayed;
//! `parse(print(k))` prints identically (tested on every lowered fixture kernel).

use crate::ir::*;
use crate::print::{BINOPS, UNOPS};

#[derive(Debug, thiserror::Error)]
#[error("kernel text, line {line}: {msg}")]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

struct P<'s> {
    s: &'s str,
    at: usize,
    k: Kernel,
}

type R<T> = Result<T, ParseError>;

/// Parses one kernel (with its optional `; schedule:` header).
pub fn parse_kernel(text: &str) -> R<Kernel> {
    let mut p = P {
        s: text,
        at: 0,
        k: Kernel::new(""),
    };
    p.ws();
    if p.eat("; schedule:") {
        let line = p.rest_of_line();
        for step in crate::step::split_steps(&line) {
            match step.parse() {
                Ok(s) => p.k.schedule.push(s),
                Err(msg) => return p.err(msg),
            }
        }
    }
    p.expect("kernel")?;
    p.expect("@")?;
    p.k.name = p.ident()?;
    p.expect("(")?;
    while !p.eat(")") {
        p.expect("%")?;
        let name = p.ident()?;
        p.expect(":")?;
        let (elem, dims) = p.ty()?;
        p.k.buf(name, elem, dims, Space::Global);
        p.eat(",");
    }
    p.expect("{")?;
    loop {
        let space = if p.eat("local") {
            Space::Local
        } else if p.eat("shared") {
            Space::Shared
        } else {
            break;
        };
        p.expect("%")?;
        let name = p.ident()?;
        p.expect(":")?;
        let (elem, dims) = p.ty()?;
        p.k.buf(name, elem, dims, space);
    }
    p.k.body = p.block()?;
    Ok(p.k)
}

impl P<'_> {
    fn err<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(ParseError {
            line: self.s[..self.at].matches('\n').count() + 1,
            msg: msg.into(),
        })
    }

    fn ws(&mut self) {
        while let Some(c) = self.s[self.at..].chars().next() {
            if c.is_whitespace() {
                self.at += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        if self.s[self.at..].starts_with(tok) {
            self.at += tok.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: &str) -> R<()> {
        if self.eat(tok) {
            Ok(())
        } else {
            let found: String = self.s[self.at..].chars().take(20).collect();
            self.err(format!("expected '{tok}', found '{found}'"))
        }
    }

    fn rest_of_line(&mut self) -> String {
        let end = self.s[self.at..]
            .find('\n')
            .map_or(self.s.len(), |i| self.at + i);
        let line = self.s[self.at..end].to_string();
        self.at = end;
        line
    }

    /// Letters, digits, `_` and `.` (split loops are named `j.o`).
    fn ident(&mut self) -> R<String> {
        self.ws();
        let start = self.at;
        while let Some(c) = self.s[self.at..].chars().next() {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                self.at += 1;
            } else {
                break;
            }
        }
        if start == self.at {
            return self.err("expected a name");
        }
        Ok(self.s[start..self.at].to_string())
    }

    fn int(&mut self) -> R<i64> {
        self.ws();
        let start = self.at;
        if self.s[self.at..].starts_with('-') {
            self.at += 1;
        }
        while self.s[self.at..].starts_with(|c: char| c.is_ascii_digit()) {
            self.at += 1;
        }
        self.s[start..self.at]
            .parse()
            .or_else(|_| self.err("expected an integer"))
    }

    fn ty(&mut self) -> R<(Elem, Vec<u64>)> {
        let name = self.ident()?;
        let elem = match Elem::from_name(&name) {
            Some(e) => e,
            None => return self.err(format!("unknown element type {name}")),
        };
        self.expect("[")?;
        let mut dims = Vec::new();
        while !self.eat("]") {
            dims.push(self.int()? as u64);
            self.eat(",");
        }
        Ok((elem, dims))
    }

    fn block(&mut self) -> R<Vec<Stmt>> {
        let mut body = Vec::new();
        while !self.eat("}") {
            body.push(self.stmt()?);
        }
        Ok(body)
    }

    fn kind(&mut self) -> Option<LoopKind> {
        for (tok, kind) in [
            ("serial", LoopKind::Serial),
            ("parallel", LoopKind::Parallel),
            ("unrolled", LoopKind::Unrolled),
        ] {
            if self.eat(tok) {
                return Some(kind);
            }
        }
        if self.eat("vector<") {
            let w = self.int().ok()? as u32;
            self.eat(">");
            return Some(LoopKind::Vector(w));
        }
        for (tok, block) in [("gpu.block.", true), ("gpu.thread.", false)] {
            if self.eat(tok) {
                let axis = ['x', 'y', 'z']
                    .iter()
                    .position(|c| self.s[self.at..].starts_with(*c))?
                    as u8;
                self.at += 1;
                return Some(if block {
                    LoopKind::GpuBlock(axis)
                } else {
                    LoopKind::GpuThread(axis)
                });
            }
        }
        None
    }

    fn stmt(&mut self) -> R<Stmt> {
        if let Some(kind) = self.kind() {
            self.expect("%")?;
            let name = self.ident()?;
            let var = self.k.var(name);
            self.expect("in")?;
            self.expect("0..")?;
            let extent = self.int()? as u64;
            self.expect("{")?;
            let body = self.block()?;
            return Ok(Stmt::For {
                var,
                extent,
                kind,
                body,
            });
        }
        if self.eat("barrier") {
            return Ok(Stmt::Barrier);
        }
        if self.eat("warp.reduce(") {
            let start = self.at;
            let end = self.s[start..]
                .find(')')
                .map_or(self.s.len(), |i| start + i);
            let name = self.s[start..end].to_string();
            self.at = end;
            self.expect(")")?;
            let Some(op) = BINOPS
                .iter()
                .find(|o| crate::print::binop_name(**o) == name)
            else {
                return self.err(format!("unknown operator {name}"));
            };
            self.expect("%")?;
            let b = self.ident()?;
            let buf = self.buffer(&b)?;
            self.expect("[")?;
            self.expect("]")?;
            return Ok(Stmt::WarpReduce { buf, op: *op });
        }
        if self.eat("cp.async.wait_all") {
            return Ok(Stmt::AsyncWait);
        }
        if self.eat("prefetch") {
            let (buf, at) = self.flat_operand()?;
            return Ok(Stmt::Prefetch { buf, at });
        }
        if self.eat("cp.async x") {
            let lanes = self.int()? as u64;
            let dst = self.block_operand()?;
            self.expect("<-")?;
            let (src, from) = self.flat_operand()?;
            let valid = if self.eat("when") {
                Some(self.expr()?)
            } else {
                None
            };
            return Ok(Stmt::CopyAsync {
                dst,
                src,
                from,
                lanes,
                valid,
            });
        }
        if self.eat("mma.sync ") {
            let c = self.block_operand()?;
            self.expect("+=")?;
            let a = self.block_operand()?;
            self.expect("*")?;
            let b = self.block_operand()?;
            return Ok(Stmt::WarpMma { c, a, b });
        }
        if self.eat("mma<") {
            let m = self.int()? as u64;
            self.expect("x")?;
            let n = self.int()? as u64;
            self.expect("x")?;
            let k = self.int()? as u64;
            self.expect(">")?;
            let c = self.block_operand()?;
            let acc = self.eat("+=");
            if !acc {
                self.expect("=")?;
            }
            let a = self.block_operand()?;
            self.expect("*")?;
            let b = self.block_operand()?;
            let ahead = self.eat("ahead");
            return Ok(Stmt::Mma {
                m,
                n,
                k,
                c,
                a,
                b,
                acc,
                ahead,
            });
        }
        if self.eat("if ") {
            let cond = self.expr()?;
            self.expect("{")?;
            return Ok(Stmt::If {
                cond,
                then: self.block()?,
            });
        }
        self.expect("%")?;
        let name = self.ident()?;
        let buf = self.buffer(&name)?;
        let index = self.indices()?;
        self.expect("=")?;
        Ok(Stmt::Store {
            buf,
            index,
            value: self.expr()?,
        })
    }

    /// `%buf.flat[e]`: a buffer and a row-major element position in it (of `cp.async` and `prefetch`).
    fn flat_operand(&mut self) -> R<(BufId, Expr)> {
        self.expect("%")?;
        let name = self.ident()?;
        let buf = self.buffer(name.strip_suffix(".flat").unwrap_or(&name))?;
        self.expect("[")?;
        let at = self.expr()?;
        self.expect("]")?;
        Ok((buf, at))
    }

    /// `%buf[index..]`: an operand block of an `mma`.
    fn block_operand(&mut self) -> R<crate::Block> {
        self.expect("%")?;
        let name = self.ident()?;
        let buf = self.buffer(&name)?;
        Ok(crate::Block {
            buf,
            at: self.indices()?,
        })
    }

    fn buffer(&self, name: &str) -> R<BufId> {
        match self.k.bufs.iter().position(|b| b.name == name) {
            Some(i) => Ok(BufId(i as u32)),
            None => self.err(format!("unknown buffer %{name}")),
        }
    }

    fn indices(&mut self) -> R<Vec<Expr>> {
        self.expect("[")?;
        let mut ix = Vec::new();
        while !self.eat("]") {
            ix.push(self.expr()?);
            self.eat(",");
        }
        Ok(ix)
    }

    fn args(&mut self, n: usize) -> R<Vec<Expr>> {
        self.expect("(")?;
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 {
                self.expect(",")?;
            }
            v.push(self.expr()?);
        }
        self.expect(")")?;
        Ok(v)
    }

    fn expr(&mut self) -> R<Expr> {
        self.ws();
        if self.eat("(") {
            let a = self.expr()?;
            self.ws();
            let op = ["+", "-", "*", "/", "%"]
                .iter()
                .position(|t| self.s[self.at..].starts_with(t));
            let Some(op) = op else {
                return self.err("expected + - * / %");
            };
            self.at += 1;
            let b = self.expr()?;
            self.expect(")")?;
            let o = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Rem][op];
            return Ok(Expr::bin(o, a, b));
        }
        if self.eat("%") {
            let name = self.ident()?;
            self.ws();
            if self.s[self.at..].starts_with('[') {
                let b = self.buffer(&name)?;
                return Ok(Expr::Load(b, self.indices()?));
            }
            // The innermost (latest) variable of that name.
            return match self.k.vars.iter().rposition(|v| *v == name) {
                Some(i) => Ok(Expr::Var(Var(i as u32))),
                None => self.err(format!("unknown variable %{name}")),
            };
        }
        if self.eat("cast<") {
            let t = self.ident()?;
            let Some(t) = Elem::from_name(&t) else {
                return self.err(format!("unknown type {t}"));
            };
            self.expect(">")?;
            let a = self.args(1)?;
            return Ok(Expr::cast(t, a.into_iter().next().unwrap_or(Expr::Int(0))));
        }
        let rest = &self.s[self.at..];
        if rest.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == 'i' || c == 'N')
            && self.number_ahead()
        {
            return self.number();
        }
        let name = self.ident()?;
        let mut it = |n| self.args(n).map(|v| v.into_iter());
        if let Some(o) = UNOPS.iter().find(|o| crate::print::unop_name(**o) == name) {
            let mut a = it(1)?;
            return Ok(Expr::un(*o, a.next().unwrap_or(Expr::Int(0))));
        }
        if let Some(o) = BINOPS
            .iter()
            .find(|o| !crate::print::is_infix(**o) && crate::print::binop_name(**o) == name)
        {
            let mut a = it(2)?;
            let (x, y) = (
                a.next().unwrap_or(Expr::Int(0)),
                a.next().unwrap_or(Expr::Int(0)),
            );
            return Ok(Expr::bin(*o, x, y));
        }
        if name == "fma" || name == "select" {
            let mut a = it(3)?;
            let (x, y, z) = (
                a.next().unwrap_or(Expr::Int(0)),
                a.next().unwrap_or(Expr::Int(0)),
                a.next().unwrap_or(Expr::Int(0)),
            );
            return Ok(if name == "fma" {
                Expr::fma(x, y, z)
            } else {
                Expr::select(x, y, z)
            });
        }
        self.err(format!("unknown function {name}"))
    }

    /// Whether a number starts here (`-` followed by a digit or `inf`, a digit, `inf`, `NaN`).
    fn number_ahead(&self) -> bool {
        let r = self.s[self.at..].trim_start_matches('-');
        r.starts_with(|c: char| c.is_ascii_digit()) || r.starts_with("inf") || r.starts_with("NaN")
    }

    /// An integer (`-3`) or a float with its type suffix (`1.5f32`, `-inff32`, `NaNf64`, `1e-5f32`).
    fn number(&mut self) -> R<Expr> {
        let start = self.at;
        let end = self.s[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
            .map_or(self.s.len(), |i| start + i);
        let tok = &self.s[start..end];
        self.at = end;
        for t in [Elem::BF16, Elem::F16, Elem::F32, Elem::F64] {
            if let Some(v) = tok.strip_suffix(t.name()) {
                return match v.parse::<f64>() {
                    Ok(x) => Ok(Expr::Float(x, t)),
                    Err(_) => self.err(format!("bad float {tok}")),
                };
            }
        }
        match tok.parse::<i64>() {
            Ok(v) => Ok(Expr::Int(v)),
            Err(_) => self.err(format!("bad number {tok}")),
        }
    }
}
