//! The e-graph's language and analysis.
//!
//! An e-node is a `Head` plus children. `Head::Op` wraps a graph-IR `Op` keyed by its text spelling
//! (`transpose[perm=[1,0]]`), so attributes take part in hash-consing; graph inputs and constants are
//! leaves that index side tables; `Head::Absent` stands for an optional input left out; a node with several
//! outputs is a tuple that `Head::Proj(i)` nodes pick from.
//!
//! Rule patterns name attribute-free ops only (`add`, `relu`, `matmul`); rules about ops with attributes
//! are scan rules written in Rust (`rules/mod.rs`).
//!
//! The analysis carries each class's output types and, when known, its constant value: a node whose inputs
//! are all constants is evaluated by the reference interpreter (up to `FOLD_LIMIT` bytes) and its class gets
//! a `Const` node, which is how every rule's constant arithmetic (Conv+BatchNorm folding, weight casts and
//! transposes) is done.

use egg::{DidMerge, Id, Language};
use mlopt_ir::op_syntax::AttrReader;
use mlopt_ir::{Op, Tensor, TensorType};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

/// Constants larger than this are not produced by folding (64 MiB).
pub const FOLD_LIMIT: usize = 64 << 20;

/// An op and the spelling that identifies it (name and attributes, no spaces).
#[derive(Debug, Clone)]
pub struct OpKey {
    pub op: Op,
    key: Box<str>,
}

impl OpKey {
    pub fn new(op: Op) -> OpKey {
        let attrs = op.spell_attrs();
        let key = if attrs.is_empty() {
            op.name().to_string()
        } else {
            let parts: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{}[{}]", op.name(), parts.join(",")).replace(' ', "")
        };
        OpKey {
            op,
            key: key.into(),
        }
    }
}

impl PartialEq for OpKey {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for OpKey {}
impl std::hash::Hash for OpKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key.hash(h)
    }
}
impl PartialOrd for OpKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OpKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

/// What an e-node is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Head {
    /// Graph input `i` (of `Facts`' input table).
    Input(u32),
    /// Constant `i` (of the analysis' constant table).
    Const(u32),
    /// An optional input left out.
    Absent,
    /// Output `i` of a multi-output node.
    Proj(u32),
    Op(OpKey),
}

/// An e-node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MNode {
    pub head: Head,
    pub children: Vec<Id>,
}

impl MNode {
    pub fn op(op: Op, children: Vec<Id>) -> MNode {
        MNode {
            head: Head::Op(OpKey::new(op)),
            children,
        }
    }

    /// Output `i` of the multi-output class `tuple`.
    pub fn proj(i: usize, tuple: Id) -> MNode {
        MNode {
            head: Head::Proj(i as u32),
            children: vec![tuple],
        }
    }

    /// An optional input left out.
    pub fn absent() -> MNode {
        MNode {
            head: Head::Absent,
            children: vec![],
        }
    }

    /// The IR op, if this is an op node.
    pub fn as_op(&self) -> Option<&Op> {
        match &self.head {
            Head::Op(k) => Some(&k.op),
            _ => None,
        }
    }
}

impl Language for MNode {
    type Discriminant = (&'static str, u32);

    fn discriminant(&self) -> Self::Discriminant {
        match &self.head {
            Head::Input(i) => ("input", *i),
            Head::Const(i) => ("const", *i),
            Head::Absent => ("_", 0),
            Head::Proj(i) => ("proj", *i),
            Head::Op(k) => (k.op.name(), 0),
        }
    }

    /// Ops match by name: patterns hold attribute-free ops only, whose name is their whole key.
    fn matches(&self, other: &Self) -> bool {
        self.discriminant() == other.discriminant() && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for MNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.head {
            Head::Input(i) => write!(f, "input{i}"),
            Head::Const(i) => write!(f, "const{i}"),
            Head::Absent => write!(f, "_"),
            Head::Proj(i) => write!(f, "proj{i}"),
            Head::Op(k) => f.write_str(&k.key),
        }
    }
}

impl egg::FromOp for MNode {
    type Error = String;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        if op == "_" {
            return Ok(MNode {
                head: Head::Absent,
                children,
            });
        }
        match Op::from_spelling(op, &mut AttrReader::new(BTreeMap::new())) {
            Ok(o) if o.spell_attrs().is_empty() => Ok(MNode::op(o, children)),
            Ok(_) => Err(format!(
                "'{op}' has attributes: write a scan rule for it, not a pattern"
            )),
            Err(_) => Err(format!("unknown or attributed op '{op}' in a rule pattern")),
        }
    }
}

/// What the analysis knows about a class: its output types (one per output; empty for `Absent`) and its
/// value when it is a constant.
#[derive(Debug, Clone)]
pub struct Facts {
    pub types: Vec<TensorType>,
    pub value: Option<Arc<Tensor>>,
}

impl Facts {
    /// The type of a single-output class.
    pub fn ty(&self) -> Option<&TensorType> {
        match self.types.as_slice() {
            [t] => Some(t),
            _ => None,
        }
    }
}

/// The analysis: side tables for leaves, and type inference and constant folding for every node.
#[derive(Debug, Default, Clone)]
pub struct Analysis {
    /// Graph inputs: name and type.
    pub inputs: Vec<(String, TensorType)>,
    /// Constants: name (empty for folded ones) and value.
    pub consts: Vec<(String, Arc<Tensor>)>,
    /// Whether to fold constants (the soundness checker turns it off to see each rule alone).
    pub no_fold: bool,
    /// Classes that precision lowering must leave in fp32 (`auto` precision's back-off).
    pub keep_fp32: Vec<Id>,
    /// Constants by content hash, so that a rule adding the same constant twice gets one class.
    pub(crate) by_content: HashMap<(u64, TensorType), Vec<u32>>,
}

pub type EGraph = egg::EGraph<MNode, Analysis>;
pub type Rewrite = egg::Rewrite<MNode, Analysis>;

impl Analysis {
    /// Adds a constant, or finds the one with the same type and contents.
    pub fn add_const(eg: &mut EGraph, name: String, t: Arc<Tensor>) -> Id {
        let key = (t.content_hash(), t.ty());
        let a = &mut eg.analysis;
        let same = a.by_content.get(&key).and_then(|is| {
            is.iter()
                .copied()
                .find(|i| a.consts[*i as usize].1.same_bits(&t))
        });
        let i = match same {
            Some(i) => i,
            None => {
                let i = a.consts.len() as u32;
                a.consts.push((name, t));
                a.by_content.entry(key).or_default().push(i);
                i
            }
        };
        eg.add(MNode {
            head: Head::Const(i),
            children: vec![],
        })
    }
}

/// Whether `n` is a step of dequantizing 8-bit values: `f32(q)` of u8 or i8 `q`, or a `sub` or `mul`
/// whose first operand's class holds such a step (at most two deep: `(f32(q) - z) * s`; a class may
/// hold itself, `x * 1` in `x`'s).
fn dequantizes(eg: &EGraph, n: &MNode) -> bool {
    fn at(eg: &EGraph, n: &MNode, depth: u32) -> bool {
        use mlopt_ir::{Binary, DType};
        match (n.as_op(), &n.children[..]) {
            (Some(Op::Cast { to: DType::F32 }), &[q]) => eg[q]
                .data
                .ty()
                .is_some_and(|t| matches!(t.dtype, DType::U8 | DType::I8)),
            (Some(Op::Binary(Binary::Sub | Binary::Mul)), &[x, _]) if depth < 2 => {
                eg[x].nodes.iter().any(|m| at(eg, m, depth + 1))
            }
            _ => false,
        }
    }
    at(eg, n, 0)
}

/// Whether folding `op` is worth it and safe: not for leaves and not for ops that only produce a view of a
/// large constant (folding would duplicate it).
fn foldable(op: &Op) -> bool {
    !matches!(op, Op::Input | Op::Const(_))
}

impl egg::Analysis<MNode> for Analysis {
    type Data = Facts;

    fn make(eg: &mut EGraph, n: &MNode) -> Facts {
        let none = Facts {
            types: vec![],
            value: None,
        };
        match &n.head {
            Head::Input(i) => Facts {
                types: vec![eg.analysis.inputs[*i as usize].1.clone()],
                value: None,
            },
            Head::Const(i) => {
                let t = eg.analysis.consts[*i as usize].1.clone();
                Facts {
                    types: vec![t.ty()],
                    value: Some(t),
                }
            }
            Head::Absent => none,
            Head::Proj(i) => {
                let d = &eg[n.children[0]].data;
                Facts {
                    types: d.types.get(*i as usize).cloned().into_iter().collect(),
                    value: None,
                }
            }
            Head::Op(k) => {
                let ins: Vec<Option<&TensorType>> =
                    n.children.iter().map(|c| eg[*c].data.ty()).collect();
                let Ok(types) = mlopt_ir::infer::infer(&k.op, &ins) else {
                    return none;
                };
                // Multi-output ops keep all their outputs (tuple); the importer may have dropped trailing
                // optional ones, which `Proj` nodes simply never pick.
                let mut value = None;
                let small = types
                    .iter()
                    .map(|t| t.checked_bytes().unwrap_or(usize::MAX))
                    .fold(0usize, usize::saturating_add)
                    <= FOLD_LIMIT;
                if !eg.analysis.no_fold && types.len() == 1 && small && foldable(&k.op) {
                    let vals: Option<Vec<Option<Arc<Tensor>>>> = n
                        .children
                        .iter()
                        .map(|c| {
                            let d = &eg[*c].data;
                            if d.types.is_empty() {
                                Some(None) // absent optional input
                            } else {
                                d.value.clone().map(Some)
                            }
                        })
                        .collect();
                    if let Some(vals) = vals {
                        let refs: Vec<Option<&Tensor>> =
                            vals.iter().map(|v| v.as_deref()).collect();
                        if let Ok(mut out) = mlopt_ir::interp::eval_op(&k.op, &refs, &types) {
                            value = out.pop().map(Arc::new);
                        }
                    }
                }
                Facts { types, value }
            }
        }
    }

    fn merge(&mut self, a: &mut Facts, b: Facts) -> DidMerge {
        let mut changed_a = false;
        if a.types.is_empty() && !b.types.is_empty() {
            a.types = b.types.clone();
            changed_a = true;
        }
        if a.value.is_none() && b.value.is_some() {
            a.value = b.value;
            changed_a = true;
        }
        DidMerge(changed_a, true)
    }

    fn modify(eg: &mut EGraph, id: Id) {
        let Some(v) = eg[id].data.value.clone() else {
            return;
        };
        if eg[id]
            .nodes
            .iter()
            .any(|n| matches!(n.head, Head::Const(_)))
        {
            return;
        }
        let c = Analysis::add_const(eg, String::new(), v);
        eg.union(id, c);
        // A constant needs nothing else: drop the ways of computing it, but for a dequantized 8-bit
        // weight's (`(f32(w) - z) * s`), which the integer contraction rule reads its integers from
        // (`rules/quant.rs`; extraction still takes the constant).
        let keep: Vec<bool> = eg[id]
            .nodes
            .iter()
            .map(|n| n.children.is_empty() || dequantizes(eg, n))
            .collect();
        let mut keep = keep.into_iter();
        eg[id].nodes.retain(|_| keep.next().unwrap_or(false));
    }
}
