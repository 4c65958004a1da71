//! The rule tables, one file per concern, and the two rule shapes they use:
//! - pattern rules (`rw`), for attribute-free ops, with an optional guard on the matched classes' facts;
//! - scan rules (`scan`): a guard that picks classes and a builder that adds the equivalent form, for rules
//!   that read or compute attributes (perms, shapes, dtypes) or constants.
//!
//! Every builder adds nodes through `add`, which types them first, and the rule's result is merged only when
//! its types equal the matched class's: a rule with a wrong shape computation adds nothing rather than
//! corrupting a class (and the soundness tests, which evaluate every node of every class, catch it).

pub mod algebra;
pub mod fusion;
pub mod layout;
pub mod merge;
pub mod precision;
pub mod quant;

use crate::lang::{Analysis, EGraph, Head, MNode, Rewrite};
use egg::{Applier, Id, PatternAst, SearchMatches, Searcher, Subst, Symbol, Var};
use mlopt_ir::{Op, Tensor, TensorType};
use std::sync::Arc;

/// Which rule families a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleSet {
    pub algebra: bool,
    pub layout: bool,
    pub fusion: bool,
    pub merge: bool,
    /// Lower matrix ops to this dtype (bf16 or f16), when the cost model prefers it.
    pub lower_to: Option<mlopt_ir::DType>,
    /// Run contractions of dequantized operands as integer ones (`quant.rs`): the target has an
    /// integer dot product.
    pub integer: bool,
}

/// All rules of the enabled families.
pub fn rules(set: &RuleSet) -> Vec<Rewrite> {
    let mut r = vec![];
    if set.algebra {
        r.extend(algebra::rules());
        r.extend(quant::requantize_rules());
    }
    if set.layout {
        r.extend(layout::rules());
    }
    if set.fusion {
        r.extend(fusion::rules());
    }
    if set.merge {
        r.extend(merge::rules());
    }
    if let Some(d) = set.lower_to {
        r.extend(precision::rules(d));
    }
    if set.integer {
        r.extend(quant::rules());
    }
    r
}

/// Every rule of every family (bf16 precision rules), for listing and testing.
pub fn all_rules() -> Vec<Rewrite> {
    rules(&RuleSet {
        algebra: true,
        layout: true,
        fusion: true,
        merge: true,
        lower_to: Some(mlopt_ir::DType::BF16),
        integer: true,
    })
}

/// A pattern rule `lhs => rhs` over attribute-free ops.
pub(crate) fn rw(name: &str, lhs: &str, rhs: &str) -> Rewrite {
    rw_if(name, lhs, rhs, |_, _| true)
}

/// A pattern rule with a guard on the substitution.
pub(crate) fn rw_if(
    name: &str,
    lhs: &str,
    rhs: &str,
    guard: fn(&EGraph, &Subst) -> bool,
) -> Rewrite {
    let (Ok(l), Ok(r)) = (
        lhs.parse::<egg::Pattern<MNode>>(),
        rhs.parse::<egg::Pattern<MNode>>(),
    ) else {
        unreachable!(
            "rule {name}: patterns are fixed text and parse (checked by the rule-table test)"
        )
    };
    match Rewrite::new(
        name,
        l,
        egg::ConditionalApplier {
            condition: Guard(guard),
            applier: Typed(r),
        },
    ) {
        Ok(rw) => rw,
        Err(e) => unreachable!("rule {name}: {e}"),
    }
}

type GuardFn = dyn Fn(&EGraph, Id) -> bool + Send + Sync;
type BuildFn = dyn Fn(&mut EGraph, Id) -> Vec<(Id, Id)> + Send + Sync;

/// A scan rule: `guard` picks classes, `build` returns equivalent classes it added for the picked one.
pub(crate) fn scan(
    name: &str,
    guard: impl Fn(&EGraph, Id) -> bool + Send + Sync + 'static,
    build: impl Fn(&mut EGraph, Id) -> Vec<Id> + Send + Sync + 'static,
) -> Rewrite {
    scan_pairs(name, guard, move |eg, id| {
        build(eg, id).into_iter().map(|n| (id, n)).collect()
    })
}

/// A scan rule whose builder returns (existing class, equivalent new class) pairs anywhere in the e-graph
/// (the multi-pattern rules, which rewrite several classes at once).
pub(crate) fn scan_pairs(
    name: &str,
    guard: impl Fn(&EGraph, Id) -> bool + Send + Sync + 'static,
    build: impl Fn(&mut EGraph, Id) -> Vec<(Id, Id)> + Send + Sync + 'static,
) -> Rewrite {
    match Rewrite::new(name, Scan(Box::new(guard)), Build(Box::new(build))) {
        Ok(rw) => rw,
        Err(e) => unreachable!("rule {name}: {e}"),
    }
}

struct Guard(fn(&EGraph, &Subst) -> bool);
impl egg::Condition<MNode, Analysis> for Guard {
    fn check(&self, eg: &mut EGraph, _: Id, s: &Subst) -> bool {
        (self.0)(eg, s)
    }
}

/// Instantiates a pattern, merging only when the types agree with the matched class.
struct Typed(egg::Pattern<MNode>);
impl Applier<MNode, Analysis> for Typed {
    fn apply_one(
        &self,
        eg: &mut EGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<MNode>>,
        _: Symbol,
    ) -> Vec<Id> {
        let id = instantiate(eg, &self.0.ast, subst);
        merge_into(eg, eclass, id.into_iter().collect())
    }
    fn vars(&self) -> Vec<Var> {
        self.0.vars()
    }
}

/// Adds a pattern's instance bottom-up through `add`, so every node is typed before it lands.
fn instantiate(eg: &mut EGraph, ast: &PatternAst<MNode>, subst: &Subst) -> Option<Id> {
    let mut ids: Vec<Id> = vec![];
    for n in ast.as_ref() {
        let id = match n {
            egg::ENodeOrVar::Var(v) => subst[*v],
            egg::ENodeOrVar::ENode(n) => {
                let children: Vec<Id> = n.children.iter().map(|c| ids[usize::from(*c)]).collect();
                match &n.head {
                    Head::Op(k) => add(eg, k.op.clone(), children)?,
                    _ => return None,
                }
            }
        };
        ids.push(id);
    }
    ids.last().copied()
}

fn merge_into(eg: &mut EGraph, eclass: Id, ids: Vec<Id>) -> Vec<Id> {
    let mut changed = vec![];
    for id in ids {
        if eg[id].data.types == eg[eclass].data.types && eg.union(eclass, id) {
            changed.push(id);
        }
    }
    changed
}

struct Scan(Box<GuardFn>);
impl Searcher<MNode, Analysis> for Scan {
    fn search_eclass_with_limit(
        &self,
        eg: &EGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, MNode>> {
        (limit > 0 && (self.0)(eg, eclass)).then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }
    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

struct Build(Box<BuildFn>);
impl Applier<MNode, Analysis> for Build {
    fn apply_one(
        &self,
        eg: &mut EGraph,
        eclass: Id,
        _: &Subst,
        _: Option<&PatternAst<MNode>>,
        _: Symbol,
    ) -> Vec<Id> {
        let pairs = (self.0)(eg, eclass);
        pairs
            .into_iter()
            .flat_map(|(old, new)| merge_into(eg, old, vec![new]))
            .collect()
    }
}

// ---- helpers for rule bodies ----

/// The op nodes of class `id`, with their children.
pub(crate) fn ops(eg: &EGraph, id: Id) -> Vec<(Op, Vec<Id>)> {
    eg[id]
        .nodes
        .iter()
        .filter_map(|n| n.as_op().map(|o| (o.clone(), n.children.clone())))
        .collect()
}

/// Whether class `id` has an op node satisfying `f`.
pub(crate) fn has(eg: &EGraph, id: Id, f: impl Fn(&Op, &[Id]) -> bool) -> bool {
    eg[id]
        .nodes
        .iter()
        .any(|n| n.as_op().is_some_and(|o| f(o, &n.children)))
}

/// The type of a single-output class.
pub(crate) fn ty(eg: &EGraph, id: Id) -> Option<TensorType> {
    eg[id].data.ty().cloned()
}

/// The value of a constant class whose elements are all equal (a scalar or a splat).
pub(crate) fn splat(eg: &EGraph, id: Id) -> Option<f64> {
    eg[id].data.value.as_ref()?.splat_f64()
}

pub(crate) fn is_const(eg: &EGraph, id: Id) -> bool {
    eg[id].data.value.is_some()
}

/// Adds `op` over `children` if its types infer; `None` otherwise.
pub(crate) fn add(eg: &mut EGraph, op: Op, children: Vec<Id>) -> Option<Id> {
    let ins: Vec<Option<&TensorType>> = children.iter().map(|c| eg[*c].data.ty()).collect();
    mlopt_ir::infer::infer(&op, &ins).ok()?;
    Some(eg.add(MNode::op(op, children)))
}

/// Adds a constant.
pub(crate) fn konst(eg: &mut EGraph, t: Tensor) -> Id {
    Analysis::add_const(eg, String::new(), Arc::new(t))
}

/// `c`, or an absent optional input.
pub(crate) fn or_absent(eg: &mut EGraph, c: Option<Id>) -> Id {
    c.unwrap_or_else(|| absent(eg))
}

/// Output `i` of the multi-output class `tuple`.
pub(crate) fn proj(eg: &mut EGraph, tuple: Id, i: usize) -> Id {
    eg.add(MNode::proj(i, tuple))
}

/// An absent optional input.
pub(crate) fn absent(eg: &mut EGraph) -> Id {
    eg.add(MNode::absent())
}

pub(crate) fn v(name: &str) -> Var {
    match name.parse() {
        Ok(v) => v,
        Err(_) => unreachable!("'{name}' is a fixed variable name"),
    }
}
