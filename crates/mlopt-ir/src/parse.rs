//! The parser for the text form written by `print`. Types are taken as written and checked afterwards by
//! the verifier, so a hand-edited dump with a wrong type is reported, not silently fixed.

use crate::dtype::{DType, TensorType};
use crate::error::{IrError, Result};
use crate::graph::{Graph, Value};
use crate::op::Op;
use crate::op_syntax::{AttrReader, RawAttr};
use crate::tensor::Tensor;
use crate::with_dtype;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// `%name` or `%"name"`.
    Val(String),
    /// `@name` or `@"name"`.
    At(String),
    /// A bare word: identifier, number, `_`.
    Word(String),
    Punct(char),
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>> {
    let mut toks = vec![];
    for (ln, line) in src.lines().enumerate() {
        let line_no = ln + 1;
        let err = |msg: &str| IrError::Parse {
            line: line_no,
            msg: msg.into(),
        };
        let mut cs = line.chars().peekable();
        while let Some(&c) = cs.peek() {
            if c.is_whitespace() {
                cs.next();
            } else if c == ';' {
                break;
            } else if c == '%' || c == '@' {
                cs.next();
                let name = if cs.peek() == Some(&'"') {
                    quoted(&mut cs).ok_or_else(|| err("unterminated string"))?
                } else {
                    word(&mut cs)
                };
                if name.is_empty() {
                    return Err(err("empty name"));
                }
                toks.push((
                    line_no,
                    if c == '%' {
                        Tok::Val(name)
                    } else {
                        Tok::At(name)
                    },
                ));
            } else if "()[]{},:=".contains(c) {
                cs.next();
                toks.push((line_no, Tok::Punct(c)));
            } else if is_word_char(c) {
                toks.push((line_no, Tok::Word(word(&mut cs))));
            } else {
                return Err(err(&format!("unexpected character '{c}'")));
            }
        }
    }
    Ok(toks)
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.+-".contains(c)
}

fn word(cs: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut s = String::new();
    while let Some(&c) = cs.peek() {
        if !is_word_char(c) {
            break;
        }
        s.push(c);
        cs.next();
    }
    s
}

fn quoted(cs: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<String> {
    cs.next();
    let mut s = String::new();
    loop {
        match cs.next()? {
            '"' => return Some(s),
            '\\' => s.push(match cs.next()? {
                'n' => '\n',
                'u' => {
                    // \u{hex}, as `quote` writes control characters.
                    if cs.next()? != '{' {
                        return None;
                    }
                    let hex: String = cs.by_ref().take_while(|c| *c != '}').collect();
                    char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                }
                c => c,
            }),
            c => s.push(c),
        }
    }
}

struct Parser<'a> {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    weights: &'a dyn Fn(&str) -> Option<Arc<Tensor>>,
}

impl Parser<'_> {
    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or(self.toks.last())
            .map(|t| t.0)
            .unwrap_or(0)
    }
    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(IrError::Parse {
            line: self.line(),
            msg: msg.into(),
        })
    }
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.1)
    }
    fn next(&mut self) -> Result<Tok> {
        let t = self.toks.get(self.pos).map(|t| t.1.clone());
        self.pos += 1;
        match t {
            Some(t) => Ok(t),
            None => self.err("unexpected end of input"),
        }
    }
    fn punct(&mut self, c: char) -> Result<()> {
        match self.next()? {
            Tok::Punct(p) if p == c => Ok(()),
            t => self.err(format!("expected '{c}', found {t:?}")),
        }
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn word(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Word(w) => Ok(w),
            t => self.err(format!("expected a word, found {t:?}")),
        }
    }
    fn ty(&mut self) -> Result<TensorType> {
        let d = self.word()?;
        let Some(dtype) = DType::from_name(&d) else {
            return self.err(format!("unknown dtype '{d}'"));
        };
        self.punct('[')?;
        let mut shape = vec![];
        while !self.eat(']') {
            let w = self.word()?;
            match w.parse() {
                Ok(n) => shape.push(n),
                Err(_) => return self.err(format!("bad dimension '{w}'")),
            }
            self.eat(',');
        }
        Ok(TensorType::new(dtype, shape))
    }
    /// `[a, b, ...]` of words, after the opening bracket was seen.
    fn word_list(&mut self) -> Result<Vec<String>> {
        let mut v = vec![];
        while !self.eat(']') {
            v.push(self.word()?);
            self.eat(',');
        }
        Ok(v)
    }
}

fn parse_data(ty: &TensorType, items: &[String]) -> Option<Tensor> {
    if ty.dtype == DType::Bool {
        let v: Option<Vec<bool>> = items.iter().map(|s| s.parse().ok()).collect();
        return Tensor::from_vec(&ty.shape, v?);
    }
    if ty.dtype.is_float() {
        let v: Option<Vec<f64>> = items
            .iter()
            .map(|s| {
                s.parse::<f32>()
                    .ok()
                    .map(|f| f as f64)
                    .or_else(|| s.parse().ok())
            })
            .collect();
        let v = v?;
        return with_dtype!(ty.dtype, T => Tensor::from_vec(&ty.shape, v.iter().map(|&x| <T as crate::Elem>::from_f64(x)).collect::<Vec<T>>()));
    }
    let v: Option<Vec<i64>> = items.iter().map(|s| s.parse().ok()).collect();
    let v = v?;
    with_dtype!(ty.dtype, T => Tensor::from_vec(&ty.shape, v.iter().map(|&x| <T as crate::Elem>::from_i64(x)).collect::<Vec<T>>()))
}

/// Parses the text form. `weights` resolves constants printed by name. The result is verified.
pub fn parse(src: &str, weights: &dyn Fn(&str) -> Option<Arc<Tensor>>) -> Result<Graph> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
        weights,
    };
    if p.word()? != "graph" {
        return p.err("expected 'graph'");
    }
    let Tok::At(name) = p.next()? else {
        return p.err("expected the graph's @name");
    };
    let mut g = Graph::new(name);
    let mut vals: HashMap<String, Value> = HashMap::new();
    p.punct('(')?;
    while !p.eat(')') {
        let Tok::Val(n) = p.next()? else {
            return p.err("expected an input %name");
        };
        p.punct(':')?;
        let ty = p.ty()?;
        let v = g.add_input(n.clone(), ty);
        if vals.insert(n.clone(), v).is_some() {
            return p.err(format!("%{n} defined twice"));
        }
        p.eat(',');
    }
    p.punct('{')?;
    let mut kernel: Option<u32> = None;
    loop {
        match p.next()? {
            Tok::Word(w) if w == "return" && kernel.is_none() => break,
            Tok::Word(w) if w == "kernel" && kernel.is_none() => {
                let k = p.word()?;
                match k.strip_prefix('k').and_then(|n| n.parse().ok()) {
                    Some(n) => kernel = Some(n),
                    None => return p.err(format!("bad kernel name '{k}' (expected kN)")),
                }
                p.punct('{')?;
            }
            Tok::Punct('}') if kernel.is_some() => kernel = None,
            Tok::Val(first) => {
                let id = parse_node(&mut p, &mut g, &mut vals, first)?;
                g.node_mut(id).kernel = kernel;
            }
            t => {
                return p.err(format!(
                    "expected a definition, a kernel or 'return', found {t:?}"
                ))
            }
        }
    }
    loop {
        let Tok::Val(v) = p.next()? else {
            return p.err("expected a returned %value");
        };
        let Tok::At(name) = p.next()? else {
            return p.err("expected the output's @name");
        };
        let Some(&val) = vals.get(&v) else {
            return p.err(format!("%{v} is not defined"));
        };
        g.add_output(name, val);
        if !p.eat(',') {
            break;
        }
    }
    p.punct('}')?;
    if p.peek().is_some() {
        return p.err("trailing input after the graph");
    }
    crate::verify::verify(&g)?;
    Ok(g)
}

fn parse_node(
    p: &mut Parser<'_>,
    g: &mut Graph,
    vals: &mut HashMap<String, Value>,
    first: String,
) -> Result<crate::graph::NodeId> {
    let mut defs = vec![(first, {
        p.punct(':')?;
        p.ty()?
    })];
    while p.eat(',') {
        let Tok::Val(n) = p.next()? else {
            return p.err("expected a %value");
        };
        p.punct(':')?;
        defs.push((n, p.ty()?));
    }
    p.punct('=')?;
    let opname = p.word()?;
    let types: Vec<TensorType> = defs.iter().map(|d| d.1.clone()).collect();
    let (op, inputs) = if opname == "const" {
        let ty = types.first().cloned().ok_or(IrError::Parse {
            line: p.line(),
            msg: "const needs a type".into(),
        })?;
        let data = if p.eat('[') {
            Some(p.word_list()?)
        } else {
            None
        };
        let name = match p.peek() {
            Some(Tok::At(n)) => n.clone(),
            _ => String::new(),
        };
        let t = match data {
            Some(items) => match parse_data(&ty, &items) {
                Some(t) => Arc::new(t),
                None => return p.err(format!("constant data does not fit {ty}")),
            },
            None => match (p.weights)(&name) {
                Some(t) => t,
                None => {
                    return p.err(format!(
                        "no data for constant @{}",
                        crate::print::quote(&name)
                    ))
                }
            },
        };
        (Op::Const(t), vec![])
    } else {
        let mut attrs = BTreeMap::new();
        if p.eat('[') {
            while !p.eat(']') {
                let k = p.word()?;
                p.punct('=')?;
                let v = if p.eat('[') {
                    RawAttr::List(p.word_list()?)
                } else {
                    RawAttr::One(p.word()?)
                };
                attrs.insert(k, v);
                p.eat(',');
            }
        }
        let mut reader = AttrReader::new(attrs);
        let op = match Op::from_spelling(&opname, &mut reader)
            .and_then(|op| reader.finish().map(|_| op))
        {
            Ok(op) => op,
            Err(e) => return p.err(format!("{opname}: {e}")),
        };
        let mut inputs = vec![];
        loop {
            match p.peek() {
                Some(Tok::Val(v)) => {
                    let Some(&val) = vals.get(v) else {
                        return p.err(format!("%{v} is not defined"));
                    };
                    inputs.push(Some(val));
                }
                Some(Tok::Word(w)) if w == "_" => inputs.push(None),
                _ => break,
            }
            p.pos += 1;
            if !p.eat(',') {
                break;
            }
        }
        (op, inputs)
    };
    let name = match p.peek() {
        Some(Tok::At(n)) => {
            let n = n.clone();
            p.pos += 1;
            n
        }
        _ => String::new(),
    };
    let id = g.add_raw(op, name, &inputs, types);
    for (i, (n, _)) in defs.into_iter().enumerate() {
        if vals
            .insert(
                n.clone(),
                Value {
                    node: id,
                    output: i as u32,
                },
            )
            .is_some()
        {
            return p.err(format!("%{n} defined twice"));
        }
    }
    Ok(id)
}
