//! Vocabulary reduction with the labels (docs/prove.md, section 2, "The labels' range: when a
//! vocabulary may be reduced").
//!
//! An integer input whose values index a dim (the labels of a cross-entropy) keeps that dim's
//! size by default ([`super::rules::range_dims`]): the vocabulary `V = t·n` of a vocab-parallel
//! loss stays whole. Here it is reduced to `t·n'` where every condition of the argument is
//! checked on the graphs, each one refusing with its name where it fails (the vocabulary then
//! keeps its size exactly as before):
//!
//! - (V1) every value computed from the labels is elementwise in *one* label tensor: `add` /
//!   `sub` of a scalar, comparisons with a scalar, `where` / `masked_fill` between such a
//!   value and a scalar, booleans of such comparisons;
//! - (V2) every such scalar is `a·n + b` with `|b| <= B` ([`MAX_OFFSET`]), and every integer
//!   value is, element by element, `ℓ + a·n + b` or a constant `a·n + b` with `|b| <= B` once
//!   a chain's offsets accumulate; the reduced program writes `a·n' + b`;
//! - (V3) integer label values are read only as a `gather` index along a dim of `k·n`
//!   elements and as an `nll_loss` target over `k·n` classes (no class weights, no
//!   non-negative `ignore_index`); boolean ones (comparisons) also as an elementwise mask or
//!   `where` condition of other values; no label value is an output;
//! - (V4) every other operator meeting a dim whose size is a multiple of `n` treats its
//!   positions alike (elementwise, symmetric lane reductions, matmul, movements keeping the
//!   dim whole, slices, splits, concatenation and collectives at block boundaries; never an
//!   `arange`, `triu`/`tril`, an embedding, or a view merging the dim with another);
//! - (V5) `n' >= (4B + 2)·(N + 3)` for the `N` label elements at the reduced sizes, `n' < n`,
//!   and `n'` coinciding with no literal (the no-coincidence rule of `Sizes::reduced_value`).

use super::rules::{self, GraphDims, LitValue, Literal};
use super::sizes::{Mono, Sizes, Var};
use serde::Serialize;
use shardproof_case::Case;
use shardproof_ir::{Arg, DType, Graph, NodeKind, ValueId};
use shardproof_ops::{Args, Meta, Registry};
use std::collections::{BTreeSet, HashMap};

/// The largest offset `|b|` a label value or a literal `a·n + b` may carry (the bound `B` of
/// V2; the minimum block V5 asks grows with the offsets actually met, at most this).
pub const MAX_OFFSET: i64 = 1;

/// What became of one vocabulary an integer input's values range over (for the report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VocabReduction {
    /// The spec inputs whose values index it (the labels).
    pub labels: Vec<String>,
    /// Where the block's size variable first appeared.
    pub origin: String,
    /// The block `n` (a rank's share of the vocabulary) in the case.
    pub block: u64,
    /// The block `n'` in the reduced case (`block` where the vocabulary is kept).
    pub reduced_block: u64,
    /// `N`: label elements at the reduced sizes (0 where the conditions failed before).
    pub label_elements: u64,
    /// `B`: the largest offset met.
    pub offset_bound: u64,
    /// Why the vocabulary keeps its size (the condition that failed), if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

/// The graphs of a case as the reduction walked them: the spec, then each distinct rank
/// graph by its first rank.
pub(super) struct Walked<'a> {
    pub case: &'a Case,
    pub spec: &'a GraphDims,
    pub spec_metas: &'a [Vec<Option<Meta>>],
    pub ranks: &'a HashMap<usize, GraphDims>,
    pub rank_metas: &'a HashMap<usize, Vec<Vec<Option<Meta>>>>,
    pub first: &'a [usize],
}

/// Which graph a literal belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum GraphKey {
    /// The spec.
    Spec,
    /// The distinct rank graph of this first rank.
    Rank(usize),
}

/// One vocabulary whose conditions V1-V4 hold: reduced once V5 is met.
pub(super) struct Plan {
    /// The block's size variable `n`.
    pub var: Var,
    /// The label inputs (spec values).
    pub labels: Vec<ValueId>,
    /// `B`.
    pub offset_bound: i64,
    /// The literals `a·n + b` to rewrite as `a·n' + b`.
    pub literals: Vec<(GraphKey, Literal)>,
}

/// The outcome for one vocabulary.
pub(super) enum Outcome {
    /// V1-V4 hold.
    Reduce(Plan),
    /// A condition fails: the labels keep their range.
    Keep {
        /// The labels (spec values).
        labels: Vec<ValueId>,
        /// The block variable, when one was found.
        var: Option<Var>,
        /// The condition and where.
        why: String,
    },
}

/// Every vocabulary the `ranged` spec inputs index, with whether V1-V4 hold for it.
pub(super) fn analyse(w: &Walked<'_>, ranged: &[ValueId], sizes: &Sizes) -> Vec<Outcome> {
    let range_of = |v: ValueId| -> Vec<Mono> {
        rules::range_dims(&w.case.spec, w.spec, v)
            .iter()
            .map(|m| sizes.norm(m))
            .collect()
    };
    // The vocabularies are the ones the ranged inputs index (those keep their range today).
    let vars: BTreeSet<Var> = ranged
        .iter()
        .flat_map(|&v| range_of(v))
        .flat_map(|m| m.vars.into_keys())
        .collect();
    // Their labels are every integer spec input indexing them, ranged or not (one read
    // directly as an nll_loss target too): each is checked and counts towards N.
    let integer = |v: &ValueId| {
        w.spec_metas
            .get(v.node)
            .and_then(|m| m.get(v.output)?.as_ref())
            .is_some_and(|m| m.dtype.is_int())
    };
    let mut inputs: Vec<ValueId> = w.case.spec.inputs.iter().copied().filter(integer).collect();
    inputs.extend(ranged.iter().copied());
    inputs.sort_unstable();
    inputs.dedup();
    let ranges: Vec<(ValueId, Vec<Mono>)> = inputs.into_iter().map(|v| (v, range_of(v))).collect();
    let mut out = Vec::new();
    let mut decided: BTreeSet<ValueId> = BTreeSet::new();
    for var in vars {
        let labels: Vec<ValueId> = ranges
            .iter()
            .filter(|(_, ds)| ds.iter().any(|m| m.vars.contains_key(&var)))
            .map(|(v, _)| *v)
            .collect();
        if labels.iter().any(|v| decided.contains(v)) {
            // An input ranging over two vocabularies: kept by the first one's outcome.
            continue;
        }
        decided.extend(labels.iter().copied());
        let blocks = |m: &Mono| m.vars.len() == 1 && m.vars.get(&var) == Some(&1);
        let whole = ranges
            .iter()
            .filter(|(v, _)| labels.contains(v))
            .flat_map(|(_, ds)| ds.iter())
            .find(|m| !blocks(m));
        if let Some(m) = whole {
            out.push(Outcome::Keep {
                labels,
                var: Some(var),
                why: format!(
                    "V3: a label indexes a dim of size {} that is not a whole number of vocabulary blocks",
                    sizes.original(m)
                ),
            });
            continue;
        }
        match check(w, &labels, var, sizes) {
            Ok((offset_bound, literals)) => out.push(Outcome::Reduce(Plan {
                var,
                labels,
                offset_bound,
                literals,
            })),
            Err(why) => out.push(Outcome::Keep {
                labels,
                var: Some(var),
                why,
            }),
        }
    }
    // An input indexing no dim has no vocabulary to reduce: nothing to decide.
    out
}

/// V1-V4 on every graph: the largest offset met and the literals to rewrite, or the condition
/// that fails.
fn check(
    w: &Walked<'_>,
    labels: &[ValueId],
    var: Var,
    sizes: &Sizes,
) -> Result<(i64, Vec<(GraphKey, Literal)>), String> {
    let n = sizes.original(&Mono::var(var)) as i64;
    let mut literals = Vec::new();
    let mut bound = 0;
    let mut spec = GraphCheck::new(&w.case.spec, w.spec, w.spec_metas, sizes, var, n);
    for &v in labels {
        spec.label_input(v, v)?;
    }
    spec.run()?;
    bound = bound.max(spec.bound);
    literals.extend(spec.literals.into_iter().map(|l| (GraphKey::Spec, l)));
    let mut firsts: Vec<usize> = w.ranks.keys().copied().collect();
    firsts.sort_unstable();
    for r in firsts {
        let g = &w.case.program.ranks[r];
        let mut c = GraphCheck::new(g, &w.ranks[&r], &w.rank_metas[&r], sizes, var, n);
        // The rank inputs holding a piece of a label input hold label values.
        for rel in &w.case.inputs {
            if !labels.contains(&rel.spec_value) {
                continue;
            }
            for &(rr, rv) in &rel.rank_values {
                if w.first[rr] == r {
                    c.label_input(rv, rel.spec_value)?;
                }
            }
        }
        c.run()?;
        bound = bound.max(c.bound);
        literals.extend(c.literals.into_iter().map(|l| (GraphKey::Rank(r), l)));
    }
    Ok((bound, literals))
}

/// One element of an integer value computed from a label `ℓ`: `ℓ + a·n + b`, or the
/// constant `a·n + b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Form {
    of_label: bool,
    a: i64,
    b: i64,
}

/// A value computed from one label tensor (`label`, the spec input).
#[derive(Clone, Debug)]
enum LabelValue {
    /// Integer: each element one of these forms.
    Int { label: ValueId, forms: Vec<Form> },
    /// Boolean: each element a boolean of comparisons of the label with points `a·n + b`.
    Bool { label: ValueId },
}

impl LabelValue {
    fn label(&self) -> ValueId {
        match self {
            LabelValue::Int { label, .. } | LabelValue::Bool { label } => *label,
        }
    }
}

/// Whether `base` is a movement whose every output element is an element of its first input:
/// the value-keeping movements of the selections, and `aten._to_copy`, which moves a label
/// value only to an integer or boolean type (checked where a label value is moved, in
/// `GraphCheck::label_op`; a cast to a float is refused as reading the label as a number).
fn is_movement(base: &str) -> bool {
    rules::VALUE_KEEPING.contains(&base) || base == "aten._to_copy"
}

const COMPARISONS: &[&str] = &[
    "aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge",
];

const BOOLEAN: &[&str] = &[
    "aten.logical_and",
    "aten.logical_or",
    "aten.logical_xor",
    "aten.bitwise_and",
    "aten.bitwise_or",
    "aten.bitwise_xor",
];

/// Operators that treat every position of a dim alike, whatever the dim (V4).
const ALIKE: &[&str] = &[
    "aten.sum",
    "aten.mean",
    "aten.amax",
    "aten.amin",
    "aten.prod",
    "aten.logsumexp",
    "aten.mm",
    "aten.bmm",
    "aten.addmm",
    "aten.t",
    "aten.transpose",
    "aten.permute",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.full",
    "aten.zeros",
    "aten.ones",
    "aten.empty",
    "aten.scalar_tensor",
    "shardproof_p2p.send",
    "shardproof_p2p.recv",
];

/// The walk of one graph: which values are computed from the labels, checked op by op.
struct GraphCheck<'a> {
    g: &'a Graph,
    dims: &'a GraphDims,
    metas: &'a [Vec<Option<Meta>>],
    sizes: &'a Sizes,
    var: Var,
    n: i64,
    values: HashMap<ValueId, LabelValue>,
    literals: Vec<Literal>,
    bound: i64,
}

impl<'a> GraphCheck<'a> {
    fn new(
        g: &'a Graph,
        dims: &'a GraphDims,
        metas: &'a [Vec<Option<Meta>>],
        sizes: &'a Sizes,
        var: Var,
        n: i64,
    ) -> Self {
        GraphCheck {
            g,
            dims,
            metas,
            sizes,
            var,
            n,
            values: HashMap::new(),
            literals: Vec::new(),
            bound: 0,
        }
    }

    fn at(&self, i: usize) -> String {
        rules::location(self.g, i)
    }

    /// Whether value `v` has a dim whose size is a multiple of the block.
    fn meets_vocab(&self, v: ValueId) -> bool {
        self.dims
            .dims_of(v)
            .is_some_and(|ds| ds.iter().any(|m| self.is_vocab(m)))
    }

    fn is_vocab(&self, m: &Mono) -> bool {
        self.sizes.norm(m).vars.contains_key(&self.var)
    }

    /// A dim of `k·n` elements, `n` the block (a whole number of blocks).
    fn is_blocks(&self, m: &Mono) -> bool {
        let m = self.sizes.norm(m);
        m.vars.len() == 1 && m.vars.get(&self.var) == Some(&1)
    }

    fn label_input(&mut self, v: ValueId, label: ValueId) -> Result<(), String> {
        if self.meets_vocab(v) {
            return Err(format!(
                "V1: the label input `{}` has a dim whose size is a multiple of the vocabulary block",
                self.g.value_name(v)
            ));
        }
        self.values.insert(
            v,
            LabelValue::Int {
                label,
                forms: vec![Form {
                    of_label: true,
                    a: 0,
                    b: 0,
                }],
            },
        );
        Ok(())
    }

    /// `c` as `a·n + b` with `|b| <= B` (V2).
    fn decompose(&mut self, c: &Arg, i: usize) -> Result<(i64, i64), String> {
        let x = match c {
            Arg::Int(k) => *k as f64,
            Arg::Float(x) if x.is_finite() && x.fract() == 0.0 => *x,
            Arg::Bool(b) => f64::from(u8::from(*b)),
            other => {
                return Err(format!(
                    "V2: {}: a label compared with or shifted by {other:?}, not an integer",
                    self.at(i)
                ))
            }
        };
        let a = (x / self.n as f64).round() as i64;
        let b = x as i64 - a * self.n;
        if b.abs() > MAX_OFFSET {
            return Err(format!(
                "V2: {}: the literal {x} is {a}·{} {} {}, an offset over the bound {MAX_OFFSET} from a block edge",
                self.at(i),
                self.n,
                if b < 0 { '-' } else { '+' },
                b.abs()
            ));
        }
        self.bound = self.bound.max(b.abs());
        Ok((a, b))
    }

    /// Records scalar argument `arg` of node `i`, the literal `a·n + b`, to rewrite.
    fn rewrite_scalar(&mut self, i: usize, arg: &str, c: &Arg, a: i64, b: i64) {
        let arg: &'static str = match arg {
            "other" => "other",
            "value" => "value",
            "self" => "self",
            _ => return,
        };
        self.literals.push(Literal {
            node: i,
            arg,
            value: LitValue::Offset {
                unit: Mono::var(self.var),
                a,
                b,
                float: matches!(c, Arg::Float(_)),
            },
        });
    }

    fn run(&mut self) -> Result<(), String> {
        let reg = Registry::builtin();
        for (i, node) in self.g.nodes.iter().enumerate() {
            let NodeKind::Call { op, args, kwargs } = &node.kind else {
                continue;
            };
            let def = reg
                .get(op)
                .ok_or_else(|| format!("{}: unknown operator", self.at(i)))?;
            let values = rules::MetaValues(self.metas);
            let bound = Args::bind(&def.schema, args, kwargs, &values)
                .map_err(|e| format!("{}: {e}", self.at(i)))?;
            let base = op.base();
            let reads_label = node.inputs().iter().any(|v| self.values.contains_key(v));
            if reads_label {
                self.label_op(i, &base, &bound, &def.schema)?;
            }
            self.alike(i, &base, &bound, &def.schema)?;
        }
        for v in self.g.outputs.iter().flatten() {
            if self.values.contains_key(v) {
                return Err(format!(
                    "V3: the label value `{}` is an output",
                    self.g.value_name(*v)
                ));
            }
        }
        Ok(())
    }

    fn get(&self, bound: &Args<'_>, schema: &shardproof_ops::Schema, name: &str) -> Option<Arg> {
        schema.index_of(name)?;
        bound.get(name)
    }

    fn label_of(&self, a: &Option<Arg>) -> Option<&LabelValue> {
        match a {
            Some(Arg::Value(v)) => self.values.get(v),
            _ => None,
        }
    }

    fn out_dtype(&self, i: usize) -> Option<DType> {
        Some(self.metas.get(i)?.first()?.as_ref()?.dtype)
    }

    /// V1-V3 for a node reading a value computed from the labels.
    fn label_op(
        &mut self,
        i: usize,
        base: &str,
        bound: &Args<'_>,
        schema: &shardproof_ops::Schema,
    ) -> Result<(), String> {
        let get = |name: &str| self.get(bound, schema, name);
        let at = self.at(i);
        let out = ValueId::new(i, 0);
        let result: Option<LabelValue> = if is_movement(base) {
            let Some(x) = self.label_of(&get("self")).cloned() else {
                return Err(format!(
                    "V1: {at}: a label value moved as a non-first operand"
                ));
            };
            if base == "aten._to_copy" {
                let to = self.out_dtype(i);
                let keeps = match &x {
                    LabelValue::Int { .. } => to.is_some_and(|d| d.is_int()),
                    LabelValue::Bool { .. } => to == Some(DType::Bool),
                };
                if !keeps {
                    return Err(format!(
                        "V3: {at}: a label value cast to {to:?}, read as a number"
                    ));
                }
            }
            Some(x)
        } else if base == "aten.add" || base == "aten.sub" {
            let Some(LabelValue::Int { label, forms }) = self.label_of(&get("self")).cloned()
            else {
                return Err(format!(
                    "V1: {at}: a label value added to or subtracted from another value"
                ));
            };
            let other = get("other");
            let Some(c) = other.clone().filter(|a| !matches!(a, Arg::Value(_))) else {
                return Err(format!(
                    "V1: {at}: a label value combined with a tensor, not a scalar"
                ));
            };
            match get("alpha") {
                None | Some(Arg::Int(1)) => {}
                Some(Arg::Float(1.0)) => {}
                Some(a) => {
                    return Err(format!("V2: {at}: a label shifted with alpha {a:?}"));
                }
            }
            let (a, b) = self.decompose(&c, i)?;
            let sign = if base == "aten.sub" { -1 } else { 1 };
            let mut shifted = Vec::new();
            for f in forms {
                let g = Form {
                    of_label: f.of_label,
                    a: f.a + sign * a,
                    b: f.b + sign * b,
                };
                if g.b.abs() > MAX_OFFSET {
                    return Err(format!(
                        "V2: {at}: the offsets of a chain accumulate to {}, over the bound {MAX_OFFSET}",
                        g.b
                    ));
                }
                self.bound = self.bound.max(g.b.abs());
                shifted.push(g);
            }
            self.rewrite_scalar(i, "other", &c, a, b);
            Some(LabelValue::Int {
                label,
                forms: shifted,
            })
        } else if COMPARISONS.contains(&base) {
            let Some(LabelValue::Int { label, .. }) = self.label_of(&get("self")).cloned() else {
                return Err(format!(
                    "V1: {at}: a label value compared as the other operand or as a boolean"
                ));
            };
            let other = get("other");
            let Some(c) = other.clone().filter(|a| !matches!(a, Arg::Value(_))) else {
                return Err(format!(
                    "V1: {at}: a label compared with a tensor, not a scalar"
                ));
            };
            let (a, b) = self.decompose(&c, i)?;
            self.rewrite_scalar(i, "other", &c, a, b);
            Some(LabelValue::Bool { label })
        } else if base == "aten.logical_not" || base == "aten.bitwise_not" {
            match self.label_of(&get("self")) {
                Some(LabelValue::Bool { label }) => Some(LabelValue::Bool { label: *label }),
                _ => return Err(format!("V1: {at}: a negation of an integer label value")),
            }
        } else if BOOLEAN.contains(&base) {
            let (x, y) = (
                self.label_of(&get("self")).cloned(),
                self.label_of(&get("other")).cloned(),
            );
            // Both comparisons of labels; of the same labels, checked below for every operand.
            match (x, y) {
                (Some(LabelValue::Bool { label }), Some(LabelValue::Bool { .. })) => {
                    Some(LabelValue::Bool { label })
                }
                _ => {
                    return Err(format!(
                        "V1: {at}: a boolean combining a label comparison with a value not computed from the same labels"
                    ))
                }
            }
        } else if base == "aten.masked_fill" {
            let (x, mask, value) = (get("self"), get("mask"), get("value"));
            let mask_label = match self.label_of(&mask) {
                Some(LabelValue::Bool { label }) => Some(*label),
                Some(LabelValue::Int { .. }) => {
                    return Err(format!("V3: {at}: an integer label value used as a mask"))
                }
                None => None,
            };
            match self.label_of(&x).cloned() {
                Some(LabelValue::Int { label, mut forms }) => {
                    // A mask of label comparisons (of the same labels: checked below).
                    if mask_label.is_none() {
                        return Err(format!(
                            "V1: {at}: a label value masked by a mask not computed from the same labels"
                        ));
                    }
                    let Some(c) = value.filter(|a| !matches!(a, Arg::Value(_))) else {
                        return Err(format!("V1: {at}: a label value filled with a tensor"));
                    };
                    let (a, b) = self.decompose(&c, i)?;
                    self.rewrite_scalar(i, "value", &c, a, b);
                    forms.push(Form {
                        of_label: false,
                        a,
                        b,
                    });
                    Some(LabelValue::Int { label, forms })
                }
                Some(LabelValue::Bool { .. }) => {
                    return Err(format!("V3: {at}: a label comparison filled as a value"))
                }
                None => {
                    if mask_label.is_none() || self.label_of(&value).is_some() {
                        return Err(format!("V3: {at}: a label value read as a fill value"));
                    }
                    // A mask of label comparisons on other values: the comparisons keep their
                    // outcomes (the argument's ψ), so the selection is the same.
                    None
                }
            }
        } else if base == "aten.where" {
            let (cond, x, y) = (get("condition"), get("self"), get("other"));
            let cond_label = match self.label_of(&cond) {
                Some(LabelValue::Bool { label }) => Some(*label),
                Some(LabelValue::Int { .. }) => {
                    return Err(format!(
                        "V3: {at}: an integer label value used as a condition"
                    ))
                }
                None => None,
            };
            let (lx, ly) = (self.label_of(&x).cloned(), self.label_of(&y).cloned());
            if lx.is_none() && ly.is_none() {
                // A condition of label comparisons selecting between other values.
                None
            } else {
                let mut forms = Vec::new();
                let mut label = None;
                for (name, arg, lv) in [("self", x, lx), ("other", y, ly)] {
                    match (lv, arg) {
                        (Some(LabelValue::Int { label: l, forms: f }), _) => {
                            label = Some(l);
                            forms.extend(f);
                        }
                        (Some(LabelValue::Bool { .. }), _) => {
                            return Err(format!("V3: {at}: a label comparison selected as a value"))
                        }
                        (None, Some(c)) if !matches!(c, Arg::Value(_)) => {
                            let (a, b) = self.decompose(&c, i)?;
                            self.rewrite_scalar(i, name, &c, a, b);
                            forms.push(Form {
                                of_label: false,
                                a,
                                b,
                            });
                        }
                        _ => {
                            return Err(format!(
                                "V1: {at}: a label value selected against a tensor not computed from the labels"
                            ))
                        }
                    }
                }
                let label = label.expect("one side is a label value");
                // A condition of label comparisons (of the same labels: checked below).
                if cond_label.is_none() {
                    return Err(format!(
                        "V1: {at}: a label value selected by a condition not computed from the same labels"
                    ));
                }
                Some(LabelValue::Int { label, forms })
            }
        } else if base == "aten.gather" {
            let (x, index) = (get("self"), get("index"));
            if !matches!(self.label_of(&index), Some(LabelValue::Int { .. }))
                || self.label_of(&x).is_some()
            {
                return Err(format!(
                    "V3: {at}: a gather reading a label value other than as its index"
                ));
            }
            let Some(Arg::Value(xv)) = x else {
                return Err(format!("V3: {at}: a gather without a source"));
            };
            let xd = self.dims.dims_of(xv).cloned().unwrap_or_default();
            let d = get("dim")
                .and_then(|a| a.as_int())
                .and_then(|d| rules::norm_dim(d, xd.len()));
            if !d.is_some_and(|d| self.is_blocks(&xd[d])) {
                return Err(format!(
                    "V3: {at}: a label indexes a dim that is not a whole number of vocabulary blocks"
                ));
            }
            None
        } else if base == "aten.nll_loss_forward" || base == "aten.nll_loss_backward" {
            let target = get("target");
            if !matches!(self.label_of(&target), Some(LabelValue::Int { .. })) {
                return Err(format!(
                    "V3: {at}: an nll_loss reading a label value other than as its target"
                ));
            }
            for name in ["self", "grad_output", "weight", "total_weight"] {
                if self.label_of(&get(name)).is_some() {
                    return Err(format!("V3: {at}: a label value read as `{name}`"));
                }
            }
            if get("weight").is_some() {
                return Err(format!(
                    "V4: {at}: an nll_loss with class weights (a value per vocabulary position)"
                ));
            }
            if get("ignore_index")
                .and_then(|a| a.as_int())
                .is_none_or(|k| k >= 0)
            {
                return Err(format!(
                    "V2: {at}: an nll_loss whose ignore_index may equal a label"
                ));
            }
            let Some(Arg::Value(xv)) = get("self") else {
                return Err(format!("V3: {at}: an nll_loss without its input"));
            };
            let xd = self.dims.dims_of(xv).cloned().unwrap_or_default();
            let classes = if xd.len() >= 2 { 1 } else { 0 };
            if !xd.get(classes).is_some_and(|m| self.is_blocks(m)) {
                return Err(format!(
                    "V3: {at}: a label's classes that are not a whole number of vocabulary blocks"
                ));
            }
            None
        } else {
            return Err(format!(
                "V3: {at}: a label value read by `{base}`, not a gather index, an nll_loss target or a mask"
            ));
        };
        if let Some(lv) = result {
            if self.g.nodes[i].outputs.len() != 1 {
                return Err(format!("V1: {at}: a label value with several outputs"));
            }
            if self.meets_vocab(out) {
                return Err(format!(
                    "V1: {at}: a label value spread over a vocabulary dim"
                ));
            }
            // Every operand computed from labels must be of the same label tensor.
            let others: Vec<ValueId> = self.g.nodes[i]
                .inputs()
                .into_iter()
                .filter(|v| self.values.get(v).is_some_and(|x| x.label() != lv.label()))
                .collect();
            if !others.is_empty() {
                return Err(format!(
                    "V1: {at}: values computed from two label tensors combined"
                ));
            }
            self.values.insert(out, lv);
        }
        Ok(())
    }

    /// V4: an operator meeting a vocabulary dim treats its positions alike.
    fn alike(
        &self,
        i: usize,
        base: &str,
        bound: &Args<'_>,
        schema: &shardproof_ops::Schema,
    ) -> Result<(), String> {
        let node = &self.g.nodes[i];
        let outs: Vec<ValueId> = (0..node.outputs.len())
            .map(|k| ValueId::new(i, k))
            .collect();
        let ins = node.inputs();
        if !ins.iter().chain(&outs).any(|&v| self.meets_vocab(v)) {
            return Ok(());
        }
        let at = self.at(i);
        let get = |name: &str| self.get(bound, schema, name);
        let dims_of = |v: ValueId| self.dims.dims_of(v).cloned().unwrap_or_default();
        let value = |name: &str| match get(name) {
            Some(Arg::Value(v)) => Some(v),
            _ => None,
        };
        let n = self.n as u64;
        let whole = |m: &Mono| self.sizes.original(m).is_multiple_of(n);
        let fail = |what: &str| Err(format!("V4: {at}: {what}"));
        if (rules::ELEMENTWISE.contains(&base) && base != "aten.triu" && base != "aten.tril")
            || ALIKE.contains(&base)
        {
            return Ok(());
        }
        match base {
            "aten.view" | "aten._unsafe_view" | "aten.reshape" => {
                let vocab = |ds: Vec<Mono>| {
                    let mut v: Vec<Mono> = ds
                        .iter()
                        .filter(|m| self.is_vocab(m))
                        .map(|m| self.sizes.norm(m))
                        .collect();
                    v.sort();
                    v
                };
                let x = value("self").map(dims_of).unwrap_or_default();
                if vocab(x) == vocab(dims_of(outs[0])) {
                    Ok(())
                } else {
                    fail("a view merging or splitting a vocabulary dim")
                }
            }
            "aten.expand" => {
                let x = value("self").map(dims_of).unwrap_or_default();
                let y = dims_of(outs[0]);
                for (k, m) in y.iter().enumerate() {
                    if !self.is_vocab(m) {
                        continue;
                    }
                    let src = (x.len() + k >= y.len()).then(|| &x[x.len() + k - y.len()]);
                    let same = src.is_some_and(|s| s.is_one() || self.sizes.norm(s) == self.sizes.norm(m));
                    if !same {
                        return fail("an expand creating a vocabulary dim from another");
                    }
                }
                Ok(())
            }
            "aten.slice" => {
                let x = value("self").map(dims_of).unwrap_or_default();
                let Some(d) = get("dim")
                    .and_then(|a| a.as_int())
                    .or(Some(0))
                    .and_then(|d| rules::norm_dim(d, x.len()))
                else {
                    return fail("a slice of an unknown dim");
                };
                if !self.is_vocab(&x[d]) {
                    return Ok(());
                }
                let size = self.sizes.original(&x[d]) as i64;
                let clamp = |v: i64| (if v < 0 { v + size } else { v }).clamp(0, size) as u64;
                let start = clamp(get("start").and_then(|a| a.as_int()).unwrap_or(0));
                let end = clamp(get("end").and_then(|a| a.as_int()).unwrap_or(size));
                if start.is_multiple_of(n) && end.is_multiple_of(n) {
                    Ok(())
                } else {
                    fail("a slice of a vocabulary dim off its block edges")
                }
            }
            "aten.cat" | "aten.split" | "aten.split_with_sizes" => {
                // Every piece (the parts, or the outputs) along the dim a whole number of blocks.
                let pieces: Vec<ValueId> = if base == "aten.cat" {
                    ins.clone()
                } else {
                    outs.clone()
                };
                let d = get("dim").and_then(|a| a.as_int()).unwrap_or(0);
                for p in pieces {
                    let pd = dims_of(p);
                    let Some(k) = rules::norm_dim(d, pd.len()) else {
                        return fail("a piece of an unknown dim");
                    };
                    if self.is_vocab(&pd[k]) && !whole(&pd[k]) {
                        return fail("a concatenation or split of a vocabulary dim off its block edges");
                    }
                }
                Ok(())
            }
            "_c10d_functional.all_gather_into_tensor" | "_c10d_functional.reduce_scatter_tensor" => {
                for v in ins.iter().chain(&outs) {
                    let d = dims_of(*v);
                    if d.first().is_some_and(|m| self.is_vocab(m) && !whole(m)) {
                        return fail("a collective splitting a vocabulary dim off its block edges");
                    }
                }
                Ok(())
            }
            "aten.gather" => {
                if matches!(self.label_of(&get("index")), Some(LabelValue::Int { .. })) {
                    Ok(())
                } else {
                    fail("a gather on a vocabulary dim with an index not computed from the labels")
                }
            }
            "aten.nll_loss_forward" | "aten.nll_loss_backward" => {
                if matches!(self.label_of(&get("target")), Some(LabelValue::Int { .. })) {
                    Ok(())
                } else {
                    fail("an nll_loss over vocabulary classes with a target not computed from the labels")
                }
            }
            _ => fail(&format!(
                "`{base}` meets a vocabulary dim and may tell its positions apart (an arange, a mask by position, a lookup)"
            )),
        }
    }
}
