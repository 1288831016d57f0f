//! The lemma library: equalities between terms, each with the condition under which it holds.
//!
//! A lemma matches a root operator with an egg pattern and, where the rewrite depends on
//! shapes or on how a child is partitioned (which `cat`/`sum` nodes its e-class holds), a
//! small condition function builds the right-hand side. Lemmas only ever add terms built from
//! pieces already in the e-graph, so the e-graph stays small (the constrained lemmas of the
//! Entangle paper, section 4.3.2). Every lemma carries examples; `tests::every_lemma_is_sound`
//! instantiates each with random values and checks both sides with the reference kernels.

use crate::term::{Shapes, Term, CAT, GET, LIST, MAX, MIN, SLICE, SUM};
use egg::{
    Applier, EGraph, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var,
};
use std::sync::Arc;

mod attention;
mod chunks;
mod classes;
mod elements;
mod elementwise;
mod flash;
mod identities;
pub(crate) mod layout;
mod linear;
mod loss_parallel;
mod matmul;
mod moe;
pub(crate) mod pieces;
mod reductions;
pub(crate) mod ring;
mod rows;
mod rowwise;
mod sums;
mod tables;
#[cfg(test)]
mod tests;
mod vocab;

use classes::{
    calls2, cat, int, int_list, int_list_node, is_arange, is_false, is_none, is_one, is_true,
    is_zero, last_dim_column_gathers, list_items, masked_shard_index, num, op, output_per_piece,
    output_per_piece_at, regroup, scales, sizes, slice, split_alike, transposes, views, with_kids,
    zero_fill,
};
pub use classes::{cats, scale, shape, sums, SCALE};
pub(crate) use classes::{classes_of, list, product_reduced, same_ratio};
use elementwise::split_elementwise;
pub use flash::mark_zero_blocks;
use matmul::matmul_over_cat;
pub use sums::{apply_everywhere, express_by_combination, merge_equal_sums};
use sums::{gcd128, pair_sums, Linear, MAX_SEPARATE_ADDS};
use tables::{elementwise_roots, ew, linear_positions, node_sym, symbols};
pub use tables::{may_be_linear_in, scales_with, ELEMENTWISE, LINEAR};

/// The e-graph type of the engine.
pub type Graph = EGraph<Term, Shapes>;

type Build = dyn Fn(&mut Graph, Id, &[Id]) -> Vec<Id> + Send + Sync;

/// One lemma: a name, what it says, the root operators it applies to, its right-hand sides.
pub struct Lemma {
    /// Stable identifier.
    pub name: &'static str,
    /// The equality in words.
    pub doc: &'static str,
    /// Root operators (full names, or clean operator names) the lemma rewrites; `name/n` matches
    /// only calls with `n` children.
    pub roots: Vec<String>,
    /// Examples: a left-hand side term and the shapes of its leaves, for the soundness test.
    pub examples: Vec<(&'static str, &'static [(&'static str, &'static str)])>,
    /// The case assumption (`assume:` key) the lemma needs, if any; the engine only uses it
    /// when the case states that assumption. Its examples satisfy the assumption. ([`WIDENED`]
    /// marks a lemma of the engine's wider second attempt instead.)
    pub requires: Option<&'static str>,
    build: Arc<Build>,
}

struct FnApplier {
    build: Arc<Build>,
    vars: Vec<Var>,
    /// Bound by a [`WideSearcher`]: the leading variables the match binds, not all of them.
    wide: bool,
}

/// The most children a [`WideSearcher`] binds.
const MAX_WIDE_ARITY: usize = 256;

/// Matches a variadic operator (`sum`, `max`, `min`, `cat`) with more children than the
/// per-count patterns cover (see [`root_arities`]), binding `?a0`, `?a1`, .. to its children.
/// Written by hand because an egg pattern has a fixed child count: without it a lemma never saw
/// a sum of more than 16 terms (a gradient norm over the 17th parameter on).
struct WideSearcher {
    op: Symbol,
    min: usize,
    vars: Vec<Var>,
}

impl Searcher<Term, Shapes> for WideSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &Graph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, Term>> {
        let substs: Vec<Subst> = egraph[eclass]
            .nodes
            .iter()
            .filter_map(|n| match n {
                Term::Op(s, k)
                    if *s == self.op && (self.min..=self.vars.len()).contains(&k.len()) =>
                {
                    let mut sub = Subst::with_capacity(k.len());
                    for (v, &c) in self.vars.iter().zip(k) {
                        sub.insert(*v, c);
                    }
                    Some(sub)
                }
                _ => None,
            })
            .take(limit)
            .collect();
        (!substs.is_empty()).then_some(SearchMatches {
            eclass,
            substs,
            ast: None,
        })
    }

    fn search_with_limit(&self, egraph: &Graph, mut limit: usize) -> Vec<SearchMatches<'_, Term>> {
        let mut out = Vec::new();
        for id in egraph.classes_for_op(&Some(self.op)).into_iter().flatten() {
            if limit == 0 {
                break;
            }
            if let Some(m) = self.search_eclass_with_limit(egraph, id, limit) {
                limit = limit.saturating_sub(m.substs.len());
                out.push(m);
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        self.vars.clone()
    }
}

impl Applier<Term, Shapes> for FnApplier {
    fn apply_one(
        &self,
        egraph: &mut Graph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<Term>>,
        _: Symbol,
    ) -> Vec<Id> {
        let cap = egraph.analysis.node_cap;
        if cap != 0 && egraph.total_size() >= cap {
            return Vec::new();
        }
        let kids: Vec<Id> = if self.wide {
            self.vars
                .iter()
                .map_while(|v| subst.get(*v).copied())
                .collect()
        } else {
            self.vars.iter().map(|v| subst[*v]).collect()
        };
        let mut changed = Vec::new();
        for new in (self.build)(egraph, eclass, &kids) {
            // A lemma that unions other classes itself reports the match class as changed.
            if new == eclass || egraph.union(eclass, new) {
                changed.push(eclass);
            }
        }
        changed
    }
}

impl Lemma {
    /// The egg rewrites of this lemma, one per root operator (`arity` children each).
    pub fn rewrites(&self) -> Vec<Rewrite<Term, Shapes>> {
        let reg = shardproof_ops::Registry::builtin();
        self.roots
            .iter()
            .flat_map(|root| {
                // `sum/2`: only that many children.
                let (root, arities) = match root.split_once('/') {
                    Some((name, n)) => (name, n.parse().into_iter().collect()),
                    None => (root.as_str(), root_arities(reg, root)),
                };
                arities.into_iter().map(move |arity| (root, arity))
            })
            .filter_map(|(root, arity)| {
                let vars: Vec<Var> = (0..arity)
                    .map(|i| format!("?a{i}").parse().expect("var"))
                    .collect();
                let pat: Pattern<Term> = format!(
                    "({root} {})",
                    vars.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                )
                .parse()
                .ok()?;
                Rewrite::new(
                    format!("{}@{root}/{arity}", self.name),
                    pat,
                    FnApplier {
                        build: self.build.clone(),
                        vars,
                        wide: false,
                    },
                )
                .ok()
            })
            .chain(self.roots.iter().filter_map(|root| {
                let min = root_arities(reg, root).into_iter().max()? + 1;
                (min > 1 && [SUM, MAX, MIN, CAT].contains(&root.as_str())).then(|| {
                    let vars: Vec<Var> = (0..MAX_WIDE_ARITY)
                        .map(|i| format!("?a{i}").parse().expect("var"))
                        .collect();
                    Rewrite::new(
                        format!("{}@{root}/{min}+", self.name),
                        WideSearcher {
                            op: Symbol::from(root.as_str()),
                            min,
                            vars: vars.clone(),
                        },
                        FnApplier {
                            build: self.build.clone(),
                            vars,
                            wide: true,
                        },
                    )
                    .expect("a wide rewrite binds every variable it applies")
                })
            }))
            .collect()
    }
}

/// The child counts a root operator is matched with: its schema's, fixed ones for the clean
/// operators, and every group size up to 16 for the variadic `sum`/`cat`.
fn root_arities(reg: &shardproof_ops::Registry, root: &str) -> Vec<usize> {
    match root {
        SCALE | crate::term::VOCAB_LOOKUP | crate::term::VOCAB_PICK | crate::term::VOCAB_ONEHOT => {
            vec![3]
        }
        crate::term::VOCAB_GRAD => vec![4],
        SLICE => vec![4],
        GET => vec![2],
        SUM | MAX | MIN => (2..=16).collect(),
        CAT => (3..=17).collect(),
        _ => shardproof_ir::OpName::parse(root)
            .and_then(|o| reg.get(&o))
            .map_or_else(Vec::new, |def| vec![def.schema.args.len()]),
    }
}

/// The lemmas a case may use: every lemma whose required assumption (if any) it states.
pub fn library_for(assumed: &[&str]) -> Vec<Lemma> {
    library()
        .into_iter()
        .filter(|l| l.requires.is_none_or(|a| assumed.contains(&a)))
        .collect()
}

/// The `requires` of lemmas used only on the engine's second, wider attempt at a spec
/// operator that found no clean relation: on every attempt they would change which of several
/// equal relations is kept, and later operators depend on that choice.
pub const WIDENED: &str = "widened";

/// The `requires` of lemmas used only where an operator is inferred piece by piece: on every
/// operator they would only grow the e-graphs (a fifth more time on llama's cp=2 full
/// iteration).
pub const PIECEWISE: &str = "piecewise";

/// Every lemma of the library.
pub fn library() -> Vec<Lemma> {
    let mut l = Vec::new();
    l.extend(elementwise::lemmas());
    l.extend(linear::lemmas());
    l.extend(matmul::lemmas());
    l.extend(layout::lemmas());
    l.extend(reductions::lemmas());
    l.extend(rowwise::lemmas());
    l.extend(rows::lemmas());
    l.extend(chunks::lemmas());
    l.extend(vocab::lemmas());
    l.extend(moe::lemmas());
    l.extend(ring::lemmas());
    l.extend(flash::lemmas());
    l.extend(elements::lemmas());
    l.extend(loss_parallel::lemmas());
    l.extend(attention::lemmas());
    l
}
