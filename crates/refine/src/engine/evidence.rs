//! Evidence of known bug classes at the operator where relations stop (the failure's hint):
//! misaligned pieces and rows, partial sums never reduced or reduced late or over the wrong
//! group, reductions over a sharded dim, values the ranks compute and drop.

use super::diagnose::clean_with_shape;
use super::relation::{tpl_values, Impl, Rel, State};
use super::report::render;
use crate::lower::{Lowered, Tpl, ValueRef};
use crate::term::{is_op, leaf_symbol, parse_leaf, Term, CAT, LIST, SLICE, SUM};
use egg::{Id, RecExpr, Symbol};
use shardproof_case::Case;
use shardproof_ir::ValueId;
use shardproof_ops::Meta;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Where an implementation tensor lies in a spec tensor: (spec input position, dim, start,
/// end), when it is a piece of (nested) concatenations along one dim that relate the input, or
/// a slice along that dim of such a piece or of a tensor equal to the whole input.
fn piece_range(
    imp: &Impl,
    inputs: &[(usize, Vec<RecExpr<Term>>)],
    v: ValueRef,
) -> Option<(usize, i64, i64, i64)> {
    let v = imp.canon(v);
    let leaf = leaf_symbol(v.rank?, &imp.name(v));
    let sliced = match imp.lowered.get(&v) {
        Some(Lowered::Term(Tpl::Op(op, k))) if op.as_str() == SLICE && k.len() == 4 => {
            match (&k[0], &k[1], &k[2], &k[3]) {
                (Tpl::Num(d), Tpl::Num(a), Tpl::Num(b), Tpl::Value(x)) => {
                    let x = imp.canon(*x);
                    Some((*d, *a, *b, leaf_symbol(x.rank?, &imp.name(x))))
                }
                _ => None,
            }
        }
        _ => None,
    };
    for (pos, exprs) in inputs {
        for e in exprs {
            let root = Id::from(e.as_ref().len() - 1);
            if let Some((d, a, b, x)) = &sliced {
                match locate(imp, e, root, x) {
                    Some(Place::Whole) => return Some((*pos, *d, *a, *b)),
                    Some(Place::Range(d2, a2, _)) if d2 == *d => {
                        return Some((*pos, *d, a2 + a, a2 + b))
                    }
                    _ => {}
                }
            }
            if let Some(Place::Range(d, a, b)) = locate(imp, e, root, &leaf) {
                return Some((*pos, d, a, b));
            }
        }
    }
    None
}

/// Where a leaf lies in a relation.
enum Place {
    /// The leaf is the whole tensor.
    Whole,
    /// The leaf covers `start..end` along `dim`.
    Range(i64, i64, i64),
}

/// Finds `leaf` in the subterm `id` of `e`, through concatenations along one dim.
fn locate(imp: &Impl, e: &RecExpr<Term>, id: Id, leaf: &str) -> Option<Place> {
    match &e[id] {
        Term::Op(s, k) if k.is_empty() => (s.as_str() == leaf).then_some(Place::Whole),
        Term::Op(s, k) if is_op!(s, CAT) && k.len() >= 3 => {
            let Term::Num(d) = e[k[0]] else { return None };
            let mut off = 0;
            for &kid in &k[1..] {
                let len = extent(imp, e, kid, d)?;
                match locate(imp, e, kid, leaf) {
                    Some(Place::Whole) => return Some(Place::Range(d, off, off + len)),
                    Some(Place::Range(d2, a, b)) if d2 == d => {
                        return Some(Place::Range(d, off + a, off + b))
                    }
                    Some(_) => return None,
                    None => {}
                }
                off += len;
            }
            None
        }
        _ => None,
    }
}

/// The extent along `d` of a subterm of a relation: leaves and concatenations.
fn extent(imp: &Impl, e: &RecExpr<Term>, id: Id, d: i64) -> Option<i64> {
    match &e[id] {
        Term::Op(s, k) if k.is_empty() => {
            let (rank, name) = crate::term::parse_leaf(s.as_str())?;
            let v = imp.find(rank, name)?;
            let m = imp.meta(ValueRef {
                rank: Some(rank),
                value: v,
            })?;
            m.shape.get(usize::try_from(d).ok()?).map(|&n| n as i64)
        }
        Term::Op(s, k) if is_op!(s, CAT) && k.len() >= 3 => {
            let Term::Num(d2) = e[k[0]] else { return None };
            if d2 == d {
                k[1..].iter().map(|&x| extent(imp, e, x, d)).sum()
            } else {
                extent(imp, e, k[1], d)
            }
        }
        _ => None,
    }
}

/// Evidence of misaligned pieces: the implementation applies the spec operator to a piece of
/// one input and a piece of another that cover different ranges along the same dim (a slice
/// with the wrong offset, microbatches paired with the wrong labels).
pub(super) fn misaligned_pieces(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    node: &shardproof_ir::Node,
) -> Option<String> {
    let op = node.op()?.to_string();
    let inputs: Vec<(usize, Vec<RecExpr<Term>>)> = node
        .args()
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            shardproof_ir::Arg::Value(x) => match state.get(x) {
                Some(State::Related(r)) if r.clean => Some((i, r.exprs.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    if inputs.len() < 2 {
        return None;
    }
    let mut aligned = false;
    let mut found = None;
    for &(r, n) in imp.calls_of(&op) {
        let g = &case.program.ranks[r];
        let nd = &g.nodes[n];
        let ranges: Vec<(usize, i64, i64, i64)> = nd
            .args()
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let x = a.as_value()?;
                piece_range(
                    imp,
                    &inputs,
                    ValueRef {
                        rank: Some(r),
                        value: x,
                    },
                )
                .filter(|p| p.0 == i)
            })
            .collect();
        if ranges.len() < 2 || ranges.iter().any(|p| p.1 != ranges[0].1) {
            continue;
        }
        let (d, a, b) = (ranges[0].1, ranges[0].2, ranges[0].3);
        // Pieces along dim 0 are contiguous blocks: the same fraction of two inputs is the
        // same rows, however their leading dims are flattened (a [s, b, h] activation and
        // its [s * b] statistics).
        let extent0 = |pos: usize| {
            let x = node.args().get(pos)?.as_value()?;
            let shape = case.spec.recorded_type(x)?.concrete_shape()?;
            shape.first().copied().filter(|&n| n > 0)
        };
        let same = |p: &(usize, i64, i64, i64)| {
            if (p.2, p.3) == (a, b) {
                return true;
            }
            match (d, extent0(ranges[0].0), extent0(p.0)) {
                (0, Some(n0), Some(n)) => {
                    i128::from(p.2) * i128::from(n0) == i128::from(a) * i128::from(n)
                        && i128::from(p.3) * i128::from(n0) == i128::from(b) * i128::from(n)
                }
                _ => false,
            }
        };
        if ranges.iter().all(same) {
            aligned = true;
        } else if found.is_none() {
            let q = ranges.iter().find(|p| !same(p))?;
            found = Some(format!(
                "`r{r}.{}` applies `{op}` to rows {a}..{b} of one input and rows {}..{} of another along dim {d}: the pieces are misaligned (a slice with the wrong offset, or microbatches paired with the wrong labels?)",
                g.nodes[n].name, q.2, q.3
            ));
        }
    }
    // Only when no implementation operator pairs the pieces correctly.
    found.filter(|_| !aligned)
}

/// Operators reached through when tracing which spec elements an implementation operand holds:
/// they only move elements.
pub(super) const LAYOUT_OPS: &[&str] = &[
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.permute.default",
    "aten.transpose.int",
    "aten.t.default",
    "aten.clone.default",
    "aten.contiguous.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.slice.Tensor",
    "aten.select.int",
    "aten.cat.default",
    SLICE,
    CAT,
];

/// Misaligned pieces found by where their elements come from, for layouts `misaligned_pieces`
/// cannot read (a sequence-major activation viewed to tokens, permuted labels): the spec
/// operator's inputs relate cleanly, and an implementation operator of the same kind pairs
/// row `k` of one operand with row `k` of another, but those rows hold different rows of the
/// spec's inputs (microbatches paired with the wrong labels).
///
/// Each rank tensor of the relations gets a tensor of distinct ids; evaluating a relation on
/// them gives, for every element of the spec's input, the rank element it is; evaluating the
/// operand's layout operators (see [`LAYOUT_OPS`]) on them gives its elements' ids.
///
/// The ids cost memory per element, so tensors of more than [`MAX_ROW_IDS`] elements in all
/// are not traced: `Err` then carries the element count, for the report to say the check was
/// not computed (never a hint, so never a refutation on a check that did not run).
pub(super) fn misaligned_rows(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    node: &shardproof_ir::Node,
) -> Result<Option<String>, usize> {
    Ok(misaligned_rows_bounded(case, imp, state, spec_metas, node)?.flatten())
}

/// The most elements [`misaligned_rows`] gives ids to: the rank tensors its relations read and
/// the spec inputs they build, together (a few hundred MB of ids and row tables at most).
pub(super) const MAX_ROW_IDS: usize = 1 << 22;

/// [`misaligned_rows`]: `Ok(None)` where the check does not apply, `Ok(Some(hint))` with its
/// answer, `Err(elements)` where the tensors are too large to trace.
fn misaligned_rows_bounded(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    node: &shardproof_ir::Node,
) -> Result<Option<Option<String>>, usize> {
    let Some(op) = node.op().map(|o| o.to_string()) else {
        return Ok(None);
    };
    // (argument position, relation, the spec input's shape), for clean tensor inputs.
    let inputs: Vec<(usize, &RecExpr<Term>, Vec<usize>)> = node
        .args()
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let (r, shape) = clean_with_shape(state, spec_metas, a.as_value()?)?;
            Some((i, r.exprs.first().filter(|_| !shape.is_empty())?, shape))
        })
        .collect();
    if inputs.len() < 2 || inputs.iter().any(|x| x.2[0] != inputs[0].2[0]) {
        return Ok(None);
    }
    // The size first, from shapes alone: nothing is allocated for tensors over the bound.
    let mut leaves: Vec<(String, Meta)> = Vec::new();
    let mut elements = inputs
        .iter()
        .fold(0usize, |n, x| n.saturating_add(x.2.iter().product()));
    for (_, e, _) in &inputs {
        for l in expr_leaves(imp, e) {
            let (Some(rank), Some(meta)) = (l.rank, imp.meta(l)) else {
                return Ok(None);
            };
            let key = format!("r{rank}:{}", imp.name(l));
            if leaves.iter().all(|(k, _)| *k != key) {
                elements = elements.saturating_add(meta.numel());
                leaves.push((key, meta));
            }
        }
    }
    if elements > MAX_ROW_IDS {
        return Err(elements);
    }
    // Distinct ids per rank tensor: element `j` of the `k`-th is `(k + 1) * 2^32 + j`.
    let mut ids: HashMap<String, shardproof_ops::Tensor> = HashMap::new();
    for (key, meta) in leaves {
        let base = (ids.len() as f64 + 1.0) * 4_294_967_296.0;
        let data = (0..meta.numel()).map(|j| base + j as f64).collect();
        ids.insert(key, shardproof_ops::Tensor::new(meta, data));
    }
    Ok(Some(rows_against_ids(case, imp, &ids, &inputs, &op)))
}

/// The row check of [`misaligned_rows`] over the ids of its rank tensors.
fn rows_against_ids(
    case: &Case,
    imp: &Impl,
    ids: &HashMap<String, shardproof_ops::Tensor>,
    inputs: &[(usize, &RecExpr<Term>, Vec<usize>)],
    op: &str,
) -> Option<String> {
    // For each input: the spec row (along dim 0) of every id.
    let mut rows_of: Vec<HashMap<u64, usize>> = Vec::new();
    for (_, e, shape) in inputs {
        let t = crate::eval::eval(e, ids).ok()?.into_iter().next()?;
        let stride: usize = shape[1..].iter().product();
        if t.shape() != shape.as_slice() || stride == 0 {
            return None;
        }
        rows_of.push(
            t.data
                .iter()
                .enumerate()
                .map(|(j, &id)| (id as u64, j / stride))
                .collect(),
        );
    }
    let mut aligned = false;
    let mut found = None;
    for &(r, n) in imp.calls_of(op) {
        let nd = &case.program.ranks[r].nodes[n];
        // For each related operand: the spec row of each of its rows.
        let mut operand_rows: Vec<Vec<usize>> = Vec::new();
        for (k, (pos, _, _)) in inputs.iter().enumerate() {
            let Some(x) = nd.args().get(*pos).and_then(|a| a.as_value()) else {
                break;
            };
            let v = ValueRef {
                rank: Some(r),
                value: x,
            };
            let Some(t) = operand_ids(imp, ids, v, 6) else {
                break;
            };
            let n = t.shape().first().copied().unwrap_or(0);
            if n == 0 {
                break;
            }
            let per_row = t.data.len() / n;
            let rows: Option<Vec<usize>> = (0..n)
                .map(|i| rows_of[k].get(&(t.data[i * per_row] as u64)).copied())
                .collect();
            let Some(rows) = rows else { break };
            operand_rows.push(rows);
        }
        if operand_rows.len() != inputs.len()
            || operand_rows
                .iter()
                .any(|o| o.len() != operand_rows[0].len())
        {
            continue;
        }
        let first = &operand_rows[0];
        let bad = operand_rows[1..]
            .iter()
            .find_map(|o| (0..o.len()).find(|&i| o[i] != first[i]).map(|i| (i, o[i])));
        match bad {
            None => aligned = true,
            Some((i, other)) if found.is_none() => {
                found = Some(format!(
                    "`r{r}.{}` applies `{op}` to row {i} of its operands, but that row holds row {} of one spec input and row {other} of another: the pieces are misaligned (microbatches paired with the wrong labels, or a shard taken at the wrong offset?)",
                    nd.name, first[i]
                ));
            }
            Some(_) => {}
        }
    }
    // Only when no implementation operator pairs the pieces correctly.
    found.filter(|_| !aligned)
}

/// The ids (see [`misaligned_rows`]) of an implementation value: a rank tensor of the relations
/// itself, or layout operators over such tensors, at most `depth` operators deep.
fn operand_ids(
    imp: &Impl,
    ids: &HashMap<String, shardproof_ops::Tensor>,
    v: ValueRef,
    depth: usize,
) -> Option<shardproof_ops::Tensor> {
    let v = imp.canon(v);
    if let Some(t) = ids.get(&format!("r{}:{}", v.rank?, imp.name(v))) {
        return Some(t.clone());
    }
    let Some(Lowered::Term(t)) = imp.lowered.get(&v) else {
        return None;
    };
    if depth == 0 {
        return None;
    }
    // The term, its values named as leaves whose ids come from the next level down.
    fn build(
        t: &Tpl,
        imp: &Impl,
        ids: &HashMap<String, shardproof_ops::Tensor>,
        depth: usize,
        leaves: &mut HashMap<String, shardproof_ops::Tensor>,
        r: &mut RecExpr<Term>,
    ) -> Option<Id> {
        Some(match t {
            Tpl::Num(n) => r.add(Term::Num(*n)),
            Tpl::Value(x) => {
                let x = imp.canon(*x);
                let key = format!("r{}:{}", x.rank?, imp.name(x));
                if let std::collections::hash_map::Entry::Vacant(slot) = leaves.entry(key) {
                    slot.insert(operand_ids(imp, ids, x, depth - 1)?);
                }
                r.add(Term::Op(
                    Symbol::from(leaf_symbol(x.rank?, &imp.name(x))),
                    vec![],
                ))
            }
            Tpl::Op(op, kids) => {
                let is_literal = kids.is_empty();
                if !is_literal && op != LIST && !LAYOUT_OPS.contains(&op.as_str()) {
                    return None;
                }
                let kids: Option<Vec<Id>> = kids
                    .iter()
                    .map(|k| build(k, imp, ids, depth, leaves, r))
                    .collect();
                r.add(Term::Op(Symbol::from(op.as_str()), kids?))
            }
        })
    }
    let mut leaves = HashMap::new();
    let mut rec = RecExpr::default();
    build(t, imp, ids, depth, &mut leaves, &mut rec)?;
    crate::eval::eval(&rec, &leaves).ok()?.into_iter().next()
}

/// The ranks whose tensors the collective node `n` of rank `r` combines.
pub(super) fn collective_ranks(imp: &Impl, r: usize, n: usize) -> Option<BTreeSet<usize>> {
    let out = ValueRef {
        rank: Some(r),
        value: ValueId::new(n, 0),
    };
    let Some(Lowered::Term(t)) = imp.lowered.get(&out) else {
        return None;
    };
    let mut vals = Vec::new();
    tpl_values(t, &mut vals);
    Some(vals.iter().filter_map(|v| v.rank).collect())
}

/// The ranks of the implementation tensors in the subterm `root` of `e`.
pub(super) fn leaf_ranks(e: &RecExpr<Term>, root: Id) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        match &e[id] {
            Term::Op(s, k) if k.is_empty() => {
                if let Some((r, _)) = crate::term::parse_leaf(s.as_str()) {
                    out.insert(r);
                }
            }
            Term::Op(_, k) => stack.extend(k.iter().copied()),
            Term::Num(_) => {}
        }
    }
    out
}

/// Whether a relation is a sum over ranks at its top (a partial sum).
pub(super) fn is_rank_sum(e: &RecExpr<Term>) -> bool {
    e.as_ref()
        .last()
        .is_some_and(|t| matches!(t, Term::Op(s, _) if is_op!(s, SUM)))
}

/// The ranks each summand of a rank sum reads (empty when `e` is no sum).
pub(super) fn summands_of(e: &RecExpr<Term>) -> Vec<BTreeSet<usize>> {
    match e.as_ref().last() {
        Some(Term::Op(s, kids)) if is_op!(s, SUM) => {
            kids.iter().map(|&k| leaf_ranks(e, k)).collect()
        }
        _ => Vec::new(),
    }
}

/// The implementation tensors an expression reads.
pub(super) fn expr_leaves(imp: &Impl, e: &RecExpr<Term>) -> Vec<ValueRef> {
    e.as_ref()
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if k.is_empty() => {
                crate::term::parse_leaf(s.as_str()).and_then(|(r, nm)| {
                    imp.find(r, nm).map(|v| ValueRef {
                        rank: Some(r),
                        value: v,
                    })
                })
            }
            _ => None,
        })
        .collect()
}

/// The rank tensors of a relation, when every one of its expressions is over rank tensors that
/// no implementation operator reads and no rank returns (named as `rK.name`, from the first
/// expression): a value the ranks compute and then drop.
pub(super) fn unread_leaves(case: &Case, imp: &Impl, rel: &Rel) -> Option<Vec<String>> {
    let exprs = &rel.exprs[..];
    let unread_one = |l: &ValueRef| {
        let Some(r) = l.rank else { return false };
        let g = &case.program.ranks[r];
        let c = imp.canon(*l);
        let canon_of = |v: ValueId| {
            imp.canon(ValueRef {
                rank: Some(r),
                value: v,
            })
        };
        imp.consumers.get(&c).is_none_or(Vec::is_empty)
            && !g.nodes.iter().any(|n| n.inputs().contains(&l.value))
            && !g.outputs.iter().flatten().any(|&o| canon_of(o) == c)
    };
    // A tensor the relation proves equal to one that is read is read through it.
    let unread = |l: &ValueRef| {
        let name = leaf_symbol(l.rank.unwrap_or(0), &imp.name(*l));
        let group = rel
            .equal_leaves
            .iter()
            .find(|g| g.iter().any(|s| s.as_str() == name));
        unread_one(l)
            && group.is_none_or(|g| {
                g.iter().all(|s| {
                    parse_leaf(s.as_str())
                        .and_then(|(r, n)| imp.find(r, n).map(|v| (r, v)))
                        .is_none_or(|(r, v)| {
                            unread_one(&ValueRef {
                                rank: Some(r),
                                value: v,
                            })
                        })
                })
            })
    };
    let leaves: Vec<Vec<ValueRef>> = exprs.iter().map(|e| expr_leaves(imp, e)).collect();
    let dropped = !leaves.is_empty()
        && leaves
            .iter()
            .all(|ls| !ls.is_empty() && ls.iter().all(unread));
    dropped.then(|| {
        leaves[0]
            .iter()
            .map(|l| format!("r{}.{}", l.rank.unwrap_or(0), imp.name(*l)))
            .collect()
    })
}

/// How a hint names dropped rank tensors: the list, and the pronoun that stands for it.
pub(super) fn dropped_clause(names: &[String]) -> String {
    format!(
        "no implementation operator reads {} and no rank returns {}: the ranks compute the value and drop it (a dangling tensor, e.g. a gradient never reduced or applied?)",
        names.join(", "),
        if names.len() > 1 { "them" } else { "it" }
    )
}

/// A reduction over a sharded dim: the spec operator reduces (a `dim` list, its second
/// argument) a cleanly related input along dims that an implementation operator of the same
/// kind sees only a piece of, and no collective reads that operator's result: each rank's
/// statistic covers its own shard (an RMSNorm's mean of squares over a tp-split hidden dim).
/// Only when no implementation operator of the kind reduces the whole dim.
pub(super) fn reduced_over_shard(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    node: &shardproof_ir::Node,
) -> Option<String> {
    shard_reductions(case, imp, state, spec_metas, node)?
        .into_iter()
        .find(|s| !read_by_collective(case, imp, s.rank, s.node))
        .map(|s| s.evidence)
}

/// Whether the reductions over a shard behind [`reduced_over_shard`]'s evidence at `node` are
/// final (fast refutation): none of the ranks' statistics flows, along operators linear in it
/// as a whole ([`reduction_path_past`]'s strict walk), into a collective over two ranks or
/// more. A later sum over the ranks of each one's partial statistic (a sum of squares
/// all-reduced, then divided) would complete it; past a nonlinear operator (`rsqrt(m +
/// eps)`) none can. Any collective of two ranks counts as completing it (not only one over
/// the ranks holding other shards), and a search cut by its bounds too: a doubt answers
/// `false`, which only costs time (see [`never_completed`]).
pub(super) fn shard_reductions_never_completed(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    node: &shardproof_ir::Node,
) -> bool {
    let Some(found) = shard_reductions(case, imp, state, spec_metas, node) else {
        return false;
    };
    let summands: Vec<BTreeSet<usize>> = (0..case.program.ranks.len())
        .map(|r| BTreeSet::from([r]))
        .collect();
    !found.is_empty()
        && found.iter().all(|s| {
            let from = imp.canon(ValueRef {
                rank: Some(s.rank),
                value: ValueId::new(s.node, 0),
            });
            let dep = computed_from(case, imp, from);
            let path = reduction_path_past(
                case,
                imp,
                from,
                &summands,
                &BTreeSet::new(),
                Some(&dep),
                MAX_SEEN,
            );
            !path.reduced && !path.truncated
        })
}

/// An implementation operator that reduces a piece of a dim the spec operator reduces whole.
struct ShardReduction {
    rank: usize,
    node: usize,
    /// The evidence, in words.
    evidence: String,
}

/// The implementation operators of `node`'s kind and dims that reduce only a piece of a dim
/// `node` reduces, in rank and program order; `None` where `node` is no such reduction of a
/// cleanly related input, or where some implementation operator reduces the whole dim.
fn shard_reductions(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    node: &shardproof_ir::Node,
) -> Option<Vec<ShardReduction>> {
    let op = node.op()?.to_string();
    let (r, shape) = clean_with_shape(state, spec_metas, node.args().first()?.as_value()?)?;
    let dims: Vec<i64> = match node.args().get(1)? {
        shardproof_ir::Arg::List(items) => items
            .iter()
            .map(|a| a.as_int())
            .collect::<Option<Vec<i64>>>()?,
        a => vec![a.as_int()?],
    };
    let rank = shape.len() as i64;
    let reduced: Vec<i64> = dims
        .iter()
        .map(|&d| if d < 0 { d + rank } else { d })
        .collect();
    if reduced.iter().any(|&d| d < 0 || d >= rank) {
        return None;
    }
    let inputs = [(0, r.exprs.clone())];
    let mut whole = false;
    let mut found = Vec::new();
    for &(rk, n) in imp.calls_of(&op) {
        let nd = &case.program.ranks[rk].nodes[n];
        if nd.args().get(1) != node.args().get(1) {
            continue;
        }
        let Some(v) = nd.args().first().and_then(|a| a.as_value()) else {
            continue;
        };
        let operand = ValueRef {
            rank: Some(rk),
            value: v,
        };
        let Some((_, d, a, b)) = piece_range(imp, &inputs, operand) else {
            continue;
        };
        let full = shape[d as usize] as i64;
        if !reduced.contains(&d) || (a, b) == (0, full) {
            whole = true;
            continue;
        }
        found.push(ShardReduction {
            rank: rk,
            node: n,
            evidence: format!(
                "`r{rk}.{}` applies `{op}` over dim {d} to `r{rk}.{}`, which holds only {a}..{b} of that dim's {full}: each rank reduces its own shard, and no collective combines the results (a statistic over a sharded dim, e.g. a norm's mean of squares taken per rank?)",
                nd.name,
                imp.name(imp.canon(operand))
            ),
        });
    }
    (!whole).then_some(found)
}

/// Evidence of a value the ranks compute and then drop: an input of the operator where
/// relations stop whose every clean expression is over unread rank tensors (see
/// [`unread_leaves`]). An unread tensor cannot be how the ranks compute the output.
pub(super) fn dropped_input(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    node: &shardproof_ir::Node,
) -> Option<String> {
    node.inputs().into_iter().find_map(|x| {
        let r = match state.get(&x) {
            Some(State::Related(r)) if r.clean => r,
            _ => return None,
        };
        let names = unread_leaves(case, imp, r)?;
        Some(format!(
            "input `{}` is {}, but {}",
            case.spec.value_name(x),
            render(&r.exprs[0], r.exprs[0].as_ref().len() - 1),
            dropped_clause(&names)
        ))
    })
}

/// Whether node `n` of rank `r` is a collective.
fn is_collective(case: &Case, r: usize, n: usize) -> bool {
    case.program.ranks[r].nodes[n]
        .op()
        .is_some_and(|o| o.namespace == "_c10d_functional")
}

/// Whether a collective reads the first output of node `n` of rank `r`.
fn read_by_collective(case: &Case, imp: &Impl, r: usize, n: usize) -> bool {
    let out = ValueRef {
        rank: Some(r),
        value: ValueId::new(n, 0),
    };
    imp.consumers
        .get(&out)
        .is_some_and(|cs| cs.iter().any(|&(r2, n2)| is_collective(case, r2, n2)))
}

/// The first implementation operator (`rK.name = op`) that reads one of `leaves` and whose
/// result a collective reads: the tensor is reduced one step later, after that operator changed
/// it.
pub(super) fn changed_before_reduction(
    case: &Case,
    imp: &Impl,
    leaves: &[ValueRef],
) -> Option<String> {
    for l in leaves {
        for &(r, n) in imp.consumers.get(l).map_or(&[][..], Vec::as_slice) {
            if is_collective(case, r, n) {
                continue;
            }
            // An operator linear in the partial sum (a flip, a roll, a cumulative sum, a zero
            // pad) adds nothing once per rank: reducing after it is reducing the sum itself.
            if linear_in_leaf(case, imp, r, n, *l) {
                continue;
            }
            if read_by_collective(case, imp, r, n) {
                let nd = &case.program.ranks[r].nodes[n];
                let op = nd.op().map(|o| o.to_string()).unwrap_or_default();
                return Some(format!("r{r}.{} = {op}", nd.name));
            }
        }
    }
    None
}

/// Whether node `n` of rank `r` is a function of `leaf` alone (its other tensor arguments
/// integer or boolean: indices, masks) that may be linear in every argument reading it
/// ([`crate::lemmas::may_be_linear_in`], over-approximated: used only to withhold blame). An
/// addition of a bias reads another float tensor and stays blamed, and so does a pad or a fill
/// by a nonzero constant (affine: the constant is counted once per rank); a zero fill (the
/// buffer of a select or a scatter) is no other operand.
pub(super) fn linear_in_leaf(case: &Case, imp: &Impl, r: usize, n: usize, leaf: ValueRef) -> bool {
    let node = &case.program.ranks[r].nodes[n];
    let Some(op) = node.op().map(|o| o.to_string()) else {
        return false;
    };
    if let Some((k, key)) = constant_operand(&op) {
        // Given by position or by keyword (`value = 1.0`).
        if node
            .args()
            .get(k)
            .or_else(|| node.kwarg(key))
            .and_then(|a| a.as_f64())
            .is_some_and(|c| c != 0.0)
        {
            return false;
        }
    }
    // Tensors given by keyword sit at no position the tables name: the leaf there is not
    // known to be read linearly, and any other float tensor there must be a zero fill, as
    // at a position.
    if let shardproof_ir::NodeKind::Call { kwargs, .. } = &node.kind {
        for (_, a) in kwargs {
            for x in arg_values(imp, r, a) {
                if x == leaf
                    || (imp.meta(x).is_none_or(|m| m.dtype.is_float()) && !zero_fill(case, x))
                {
                    return false;
                }
            }
        }
    }
    // An elementwise product reading the sum twice (`p * p`) is quadratic in it.
    let jointly_additive = crate::lemmas::ELEMENTWISE
        .iter()
        .find(|e| e.0 == op)
        .is_none_or(|e| e.3);
    let mut read_at = 0;
    // `other - p` with `other` zero (checked above) is `-p`.
    let linear_at =
        |i: usize| crate::lemmas::may_be_linear_in(&op, i) || (op == "aten.rsub.Scalar" && i == 0);
    let mut reads = false;
    for (i, a) in node.args().iter().enumerate() {
        for x in arg_values(imp, r, a) {
            if x == leaf {
                reads = true;
                read_at += 1;
                if !linear_at(i) || (read_at > 1 && !jointly_additive) {
                    return false;
                }
            } else if imp.meta(x).is_none_or(|m| m.dtype.is_float()) && !zero_fill(case, x) {
                return false;
            }
        }
    }
    reads
}

/// The position of the scalar an operator places or adds beside its tensor operand (a pad's
/// or a masked fill's value, the `other` of `other - x`): linear in the tensor only where it
/// is zero.
fn constant_operand(op: &str) -> Option<(usize, &'static str)> {
    match op {
        "aten.constant_pad_nd.default" | "aten.masked_fill.Scalar" => Some((2, "value")),
        "aten.rsub.Scalar" => Some((1, "other")),
        _ => None,
    }
}

/// Whether implementation tensor `x` is made by a creation operator filled with zeros.
fn zero_fill(case: &Case, x: ValueRef) -> bool {
    let Some(r) = x.rank else {
        return false;
    };
    let node = &case.program.ranks[r].nodes[x.value.node];
    let Some(op) = node.op().map(|o| o.to_string()) else {
        return false;
    };
    let fill_at = match op.as_str() {
        "aten.zeros_like.default" | "aten.zeros.default" | "aten.new_zeros.default" => return true,
        "aten.scalar_tensor.default" => 0,
        "aten.full.default" | "aten.full_like.default" => 1,
        "aten.new_full.default" => 2,
        _ => return false,
    };
    node.args().get(fill_at).and_then(|a| a.as_f64()) == Some(0.0)
}

/// The first addition (`rK.name = op`) of a chain of additions that starts at one of `leaves`
/// and ends in a collective: a rank's running total that goes on growing before it is
/// reduced (the terms after the spec's total: replicated parameters' squared norms every rank
/// adds). [`changed_before_reduction`] is the chain of one addition.
pub(super) fn added_to_before_reduction(
    case: &Case,
    imp: &Impl,
    leaves: &[ValueRef],
) -> Option<String> {
    const MAX_CHAIN: usize = 256;
    let is_add = |r: usize, n: usize| {
        case.program.ranks[r].nodes[n]
            .op()
            .is_some_and(|o| o.to_string() == "aten.add.Tensor")
    };
    for l in leaves {
        for &(r, n) in imp.consumers.get(l).map_or(&[][..], Vec::as_slice) {
            if !is_add(r, n) {
                continue;
            }
            // Along the chain: each addition's only reader is the next addition, until a
            // collective reads one.
            let mut at = (r, n);
            for _ in 0..MAX_CHAIN {
                if read_by_collective(case, imp, at.0, at.1) {
                    let nd = &case.program.ranks[r].nodes[n];
                    return Some(format!("r{r}.{} = aten.add.Tensor", nd.name));
                }
                let out = ValueRef {
                    rank: Some(at.0),
                    value: ValueId::new(at.1, 0),
                };
                match imp.consumers.get(&out).map_or(&[][..], Vec::as_slice) {
                    [(r2, n2)] if is_add(*r2, *n2) => at = (*r2, *n2),
                    _ => break,
                }
            }
        }
    }
    None
}

/// Where an implementation tensor's partial sum goes (bounded search along operators linear in
/// it, stopping at collectives that combine ranks of different summands).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReductionPath {
    /// Some path reaches such a collective.
    pub(super) reduced: bool,
    /// Some path on the tensor's own rank reaches an operator nonlinear in the partial value
    /// first: the implementation computes with the unreduced value.
    pub(super) used_unreduced: bool,
    /// The search stopped at its bounds with tensors left to follow: `reduced` may be missing
    /// a collective further on.
    pub(super) truncated: bool,
}

/// [`reduction_path_past`] with nothing past and no strict check, for `case`'s tensor `from`.
/// Memoized in `imp` ([`Impl::reduction_paths`]): the search reads only the program, so each
/// answer is the one a fresh search would give, whichever thread asked first.
pub(super) fn reduction_path(
    case: &Case,
    imp: &Impl,
    from: ValueRef,
    summands: &[BTreeSet<usize>],
) -> ReductionPath {
    // The memo is `imp`'s, so the answer must be for its case.
    debug_assert!(std::ptr::eq(case, imp.case));
    let key = (from, summands.to_vec());
    if let Some(p) = imp
        .reduction_paths
        .lock()
        .ok()
        .and_then(|m| m.get(&key).copied())
    {
        return p;
    }
    // Searched outside the lock: two threads asking at once both search, and agree.
    let p = reduction_path_past(case, imp, from, summands, &BTreeSet::new(), None, MAX_SEEN);
    if let Ok(mut m) = imp.reduction_paths.lock() {
        m.insert(key, p);
    }
    p
}

/// [`reduction_path`] unmemoized, with the search bounded at `max_seen` tensors: a bound the
/// test programs reach, to compare the cut-off answers too.
#[cfg(test)]
pub(super) fn reduction_path_within(
    case: &Case,
    imp: &Impl,
    from: ValueRef,
    summands: &[BTreeSet<usize>],
    max_seen: usize,
) -> ReductionPath {
    reduction_path_past(case, imp, from, summands, &BTreeSet::new(), None, max_seen)
}

/// The most tensors one search for a reducing collective visits ([`reduction_pass`]).
const MAX_SEEN: usize = 4096;

/// The values of argument `a` of a node of rank `r`, canonical.
pub(super) fn arg_values(imp: &Impl, r: usize, a: &shardproof_ir::Arg) -> Vec<ValueRef> {
    let mut vals = Vec::new();
    a.values(&mut vals);
    vals.into_iter()
        .map(|x| {
            imp.canon(ValueRef {
                rank: Some(r),
                value: x,
            })
        })
        .collect()
}

/// Operators, beyond the operator tables, whose result's values depend on the values (not only
/// the shape) of their operands at these positions: the softmax and loss chain between a
/// model's last activation and its gradients.
const VALUE_DEPENDENT: &[(&str, &[usize])] = &[
    ("aten._softmax.default", &[0]),
    ("aten._log_softmax.default", &[0]),
    ("aten._softmax_backward_data.default", &[0, 1]),
    ("aten._log_softmax_backward_data.default", &[0, 1]),
    ("aten.nll_loss_forward.default", &[0]),
    ("aten.embedding.default", &[0, 1]),
    ("aten.amax.default", &[0]),
];

/// Whether operator `op`'s result values depend on the values of its operand at `pos`: its
/// tensor operands if elementwise, its linear positions, and [`VALUE_DEPENDENT`].
/// Under-approximated (see [`computed_from`]).
fn value_dependent(op: &str, pos: usize) -> bool {
    crate::lemmas::may_be_linear_in(op, pos)
        || crate::lemmas::ELEMENTWISE
            .iter()
            .any(|e| e.0 == op && e.1.contains(&pos))
        || VALUE_DEPENDENT
            .iter()
            .any(|e| e.0 == op && e.1.contains(&pos))
}

/// The implementation tensors whose values are computed from `from`'s values: through
/// collectives and through operators whose result depends on the values of the operand
/// holding it ([`value_dependent`]). Only the first result of a multi-output operator counts
/// (a loss's total weight depends on the targets alone, a dropout's mask on no value).
///
/// Under-approximated on purpose: it is used only to stop [`reduction_path_past`]'s strict
/// walk, and a tensor left out only lets the walk go further (fewer refutations). Operators
/// that read only an operand's shape (`zeros_like`, `new_empty`, sizes) are in no table, so a
/// constant built from a partial sum's shape is never counted as computed from it.
fn computed_from(case: &Case, imp: &Impl, from: ValueRef) -> HashSet<ValueRef> {
    const MAX: usize = 1 << 16;
    let mut dep: HashSet<ValueRef> = HashSet::from([from]);
    let mut frontier = vec![from];
    while let Some(v) = frontier.pop() {
        for &(r, n) in imp.consumers.get(&v).map_or(&[][..], Vec::as_slice) {
            let node = &case.program.ranks[r].nodes[n];
            let reads = if is_collective(case, r, n) {
                true
            } else {
                let op = node.op().map(|o| o.to_string()).unwrap_or_default();
                node.args()
                    .iter()
                    .enumerate()
                    .any(|(i, a)| value_dependent(&op, i) && arg_values(imp, r, a).contains(&v))
            };
            if !reads || node.outputs.is_empty() {
                continue;
            }
            let out = imp.canon(ValueRef {
                rank: Some(r),
                value: ValueId::new(n, 0),
            });
            if dep.len() < MAX && dep.insert(out) {
                frontier.push(out);
            }
        }
    }
    dep
}

/// Whether an operator the (non-strict) walk counts as linear in a partial sum is known not to
/// pass it on, given the tensors `dep` computed from the sum and those `linear` in it so far:
/// an elementwise or tabled linear operator with an operand computed from the sum that is not
/// linear in it or sits where the operator is not linear (`h * rsqrt(mean(h^2))`, the
/// residual `h + mlp(norm(h))`), or a product of two operands computed from it (`silu(w1 x) *
/// w3 x`, `mm(x, x)`), where the operator is not jointly additive like `add`. Operators in no
/// table, and operand positions the tables do not name, never stop it.
fn passes_not(
    imp: &Impl,
    r: usize,
    node: &shardproof_ir::Node,
    op: &str,
    dep: &HashSet<ValueRef>,
    linear: &HashSet<ValueRef>,
) -> bool {
    let (operands, joint): (&[usize], bool) =
        if let Some(e) = crate::lemmas::ELEMENTWISE.iter().find(|e| e.0 == op) {
            (e.1, e.3)
        } else if let Some(e) = crate::lemmas::LINEAR.iter().find(|e| e.0 == op) {
            // Linear in each of these on its own (mm, bmm: bilinear).
            (e.1, e.1.len() < 2)
        } else {
            return false;
        };
    let args = node.args();
    let mut computed = 0;
    for &i in operands {
        let Some(a) = args.get(i) else { continue };
        let vals: Vec<ValueRef> = arg_values(imp, r, a)
            .into_iter()
            .filter(|x| dep.contains(x) || linear.contains(x))
            .collect();
        if vals.is_empty() {
            continue;
        }
        computed += 1;
        if !crate::lemmas::may_be_linear_in(op, i) || vals.iter().any(|x| !linear.contains(x)) {
            return true;
        }
    }
    computed >= 2 && !joint
}

/// [`reduction_path`], where collectives over the rank sets in `past` only pass the value on
/// (the collectives already found reducing it over the wrong ranks).
///
/// `strict` (the tensors computed from `from`, [`computed_from`]) also stops the walk at
/// operators that the tables count as linear in the sum but that are not linear in it as a
/// whole ([`passes_not`]). The linear tensors are then found to a fixpoint: an operand
/// reached later in one pass may be linear after all, and is judged so in the next.
fn reduction_path_past(
    case: &Case,
    imp: &Impl,
    from: ValueRef,
    summands: &[BTreeSet<usize>],
    past: &BTreeSet<BTreeSet<usize>>,
    strict: Option<&HashSet<ValueRef>>,
    max_seen: usize,
) -> ReductionPath {
    let mut known: HashSet<ValueRef> = HashSet::from([from]);
    loop {
        let (path, seen) = reduction_pass(
            case,
            imp,
            from,
            summands,
            past,
            strict.map(|dep| (dep, &known)),
            max_seen,
        );
        // Without the strict check no operator depends on `known`: one pass is the answer.
        if strict.is_none() || path.truncated || seen == known {
            return path;
        }
        known = seen;
    }
}

/// What the search for a reducing collective ([`reduction_pass`]) reads of a rank's node,
/// worked out once per program: the search visits the same nodes for every partial sum that
/// fast refutation diagnoses, and naming each node's operator and scanning the operator
/// tables per visit was most of its time.
pub(super) struct SearchNode {
    /// The node's rank and its index in that rank's program.
    rank: usize,
    node: usize,
    /// For a collective, the ranks it combines (`None` where its lowering names none).
    collective: Option<Option<BTreeSet<usize>>>,
    /// The canonical values at the argument positions the tables may count the operator linear
    /// in ([`crate::lemmas::may_be_linear_in`]), as [`SearchGraph`] indices.
    linear_in: Vec<u32>,
}

/// The program as the search for a reducing collective walks it, built once per program: every
/// rank value it may meet numbered densely, with its consumers ([`Impl::consumers`]) and each
/// node's [`SearchNode`]. The search runs once per distinct (tensor, summands) question, tens of
/// thousands in a deep pipelined model, each visiting up to `MAX_SEEN` tensors: hashing rank
/// values into `Impl::consumers` and a visited set per step was most of its time.
pub(super) struct SearchGraph {
    /// Per rank and node: the index of its first output (outputs are numbered in node order),
    /// and after the last node the index past its outputs.
    outputs_from: Vec<Vec<u32>>,
    /// The rank value of each index: the nodes' outputs, then the values read (consumers'
    /// keys, canonical operands) that are no node's output.
    values: Vec<ValueRef>,
    /// Indices of the values that are no node's output.
    others: HashMap<ValueRef, u32>,
    /// Per value index `i`, its consumers are `consumers[consumers_from[i]..consumers_from[i + 1]]`,
    /// as indices into `nodes`, in `Impl::consumers`' order.
    consumers_from: Vec<u32>,
    consumers: Vec<u32>,
    /// Per rank, the index in `nodes` of its node 0.
    nodes_from: Vec<u32>,
    nodes: Vec<SearchNode>,
}

impl SearchGraph {
    fn build(case: &Case, imp: &Impl) -> SearchGraph {
        let ranks = &case.program.ranks;
        let mut values = Vec::new();
        let outputs_from: Vec<Vec<u32>> = ranks
            .iter()
            .enumerate()
            .map(|(r, g)| {
                let mut from: Vec<u32> = (0..g.nodes.len())
                    .map(|n| {
                        let first = values.len() as u32;
                        values.extend((0..g.nodes[n].outputs.len()).map(|k| ValueRef {
                            rank: Some(r),
                            value: ValueId::new(n, k),
                        }));
                        first
                    })
                    .collect();
                from.push(values.len() as u32);
                from
            })
            .collect();
        let mut graph = SearchGraph {
            outputs_from,
            values,
            others: HashMap::new(),
            consumers_from: Vec::new(),
            consumers: Vec::new(),
            nodes_from: Vec::new(),
            nodes: Vec::new(),
        };
        for (r, g) in ranks.iter().enumerate() {
            graph.nodes_from.push(graph.nodes.len() as u32);
            for (n, node) in g.nodes.iter().enumerate() {
                let op = node.op().map(|o| o.to_string()).unwrap_or_default();
                let linear_in = node
                    .args()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| crate::lemmas::may_be_linear_in(&op, *i))
                    .flat_map(|(_, a)| arg_values(imp, r, a))
                    .map(|v| graph.intern(v))
                    .collect();
                graph.nodes.push(SearchNode {
                    rank: r,
                    node: n,
                    collective: is_collective(case, r, n).then(|| collective_ranks(imp, r, n)),
                    linear_in,
                });
            }
        }
        let mut read: Vec<(u32, &[(usize, usize)])> = imp
            .consumers
            .iter()
            .map(|(v, c)| (graph.intern(*v), c.as_slice()))
            .collect();
        read.sort_unstable_by_key(|e| e.0);
        let mut read = read.into_iter().peekable();
        for i in 0..graph.values.len() as u32 {
            graph.consumers_from.push(graph.consumers.len() as u32);
            if let Some((_, c)) = read.next_if(|e| e.0 == i) {
                let nodes_from = &graph.nodes_from;
                graph
                    .consumers
                    .extend(c.iter().map(|&(r, n)| nodes_from[r] + n as u32));
            }
        }
        graph.consumers_from.push(graph.consumers.len() as u32);
        graph
    }

    /// The index of rank value `v`, numbered anew where no node outputs it.
    fn intern(&mut self, v: ValueRef) -> u32 {
        if let Some(i) = self.index(v) {
            return i;
        }
        let i = self.values.len() as u32;
        self.values.push(v);
        self.others.insert(v, i);
        i
    }

    /// The index of rank value `v`, if the program outputs or reads it.
    fn index(&self, v: ValueRef) -> Option<u32> {
        let output = v.rank.and_then(|r| {
            let outputs = self.outputs_from.get(r)?;
            let first = *outputs.get(v.value.node)?;
            let end = *outputs.get(v.value.node + 1)?;
            (v.value.output < (end - first) as usize).then_some(first + v.value.output as u32)
        });
        output.or_else(|| self.others.get(&v).copied())
    }

    fn consumers_of(&self, i: u32) -> &[u32] {
        let i = i as usize;
        self.consumers
            .get(self.consumers_from[i] as usize..self.consumers_from[i + 1] as usize)
            .unwrap_or(&[])
    }
}

/// The program's [`SearchGraph`], built on first use and kept in `imp`.
fn search_graph<'i>(case: &Case, imp: &'i Impl) -> &'i SearchGraph {
    debug_assert!(std::ptr::eq(case, imp.case));
    imp.search_graph
        .get_or_init(|| SearchGraph::build(case, imp))
}

thread_local! {
    /// The search's visited set, reused across searches on a thread: the pass number each
    /// [`SearchGraph`] index was last visited in (a fresh set per search would be cleared at
    /// the program's size each time, for searches that mostly visit a few tensors).
    static VISITED: std::cell::RefCell<(u32, Vec<u32>)> = const { std::cell::RefCell::new((0, Vec::new())) };
}

/// One pass of [`reduction_path_past`]: the path, and the tensors found linear in `from`
/// (the previous pass's, `known` in `strict` with the tensors computed from `from`, are what
/// the strict check reads), collected only for a strict search (none reads them otherwise).
fn reduction_pass(
    case: &Case,
    imp: &Impl,
    from: ValueRef,
    summands: &[BTreeSet<usize>],
    past: &BTreeSet<BTreeSet<usize>>,
    strict: Option<(&HashSet<ValueRef>, &HashSet<ValueRef>)>,
    max_seen: usize,
) -> (ReductionPath, HashSet<ValueRef>) {
    let graph = search_graph(case, imp);
    // A tensor the program neither outputs nor reads has no consumers: past every index.
    let from_index = graph.index(from).unwrap_or(graph.values.len() as u32);
    VISITED.with_borrow_mut(|(pass, visited)| {
        if visited.len() < graph.values.len() {
            visited.resize(graph.values.len(), 0);
        }
        *pass = pass.wrapping_add(1);
        if *pass == 0 {
            visited.fill(0);
            *pass = 1;
        }
        let pass = *pass;
        let mut path = ReductionPath::default();
        let mut seen = 0usize;
        let mut linear_found = Vec::new();
        let mut frontier = vec![from_index];
        let mut next = Vec::new();
        // Deep enough for a running total over every parameter (a global gradient norm adds one
        // squared norm per parameter before its reduction); the visited set bounds the work.
        for _ in 0..1024 {
            for &v in &frontier {
                let consumers = if v == from_index && from_index as usize == graph.values.len() {
                    &[][..]
                } else {
                    graph.consumers_of(v)
                };
                for &c in consumers {
                    let step = &graph.nodes[c as usize];
                    let r = step.rank;
                    if let Some(ranks) = &step.collective {
                        // A collective that combines ranks of different summands (a chain of
                        // them may combine the rest: tensor then expert groups).
                        if let Some(ranks) = ranks.as_ref().filter(|g| !past.contains(*g)) {
                            let met = summands
                                .iter()
                                .filter(|s| s.iter().any(|r| ranks.contains(r)))
                                .count();
                            if met >= 2 {
                                path.reduced = true;
                                continue;
                            }
                        }
                    }
                    let node = &case.program.ranks[r].nodes[step.node];
                    // Past an operator nonlinear in it, the value is no longer a partial sum
                    // that a later reduction completes.
                    // A collective is linear in its input: a rearrangement or a partial
                    // reduction passes the sum on to the next one.
                    let linear = step.collective.is_some()
                        || (step.linear_in.contains(&v)
                            && !strict.is_some_and(|(dep, known)| {
                                let op = node.op().map(|o| o.to_string()).unwrap_or_default();
                                passes_not(imp, r, node, &op, dep, known)
                            }));
                    if !linear {
                        // Judged on the tensor's own rank: the other members of a collective
                        // complete their sums through their own earlier collectives, which
                        // this walk does not follow back.
                        if Some(r) == from.rank {
                            path.used_unreduced = true;
                        }
                        continue;
                    }
                    let outputs = &graph.outputs_from[r];
                    for out in outputs[step.node]..outputs[step.node + 1] {
                        if seen >= max_seen {
                            path.truncated = true;
                        } else if visited[out as usize] != pass {
                            visited[out as usize] = pass;
                            seen += 1;
                            next.push(out);
                            if strict.is_some() {
                                linear_found.push(out);
                            }
                        }
                    }
                }
            }
            if next.is_empty() {
                return (path, linear_set(graph, from, &linear_found));
            }
            std::mem::swap(&mut frontier, &mut next);
            next.clear();
        }
        path.truncated = true;
        (path, linear_set(graph, from, &linear_found))
    })
}

/// The tensors a strict pass found linear in `from`, and `from` itself.
fn linear_set(graph: &SearchGraph, from: ValueRef, found: &[u32]) -> HashSet<ValueRef> {
    found
        .iter()
        .map(|&i| graph.values[i as usize])
        .chain([from])
        .collect()
}

/// Whether a reduction over the wrong ranks is final (fast refutation): no tensor of a rank
/// sum in `exprs` flows, along operators linear in it, into a collective that combines ranks
/// of two of its summands ([`reduction_path`]), other than the collectives over the rank sets
/// that already reduce those tensors (the wrong groups, which only pass the value on). A later
/// collective over the missing ranks (a weight gradient reduced over dp, then over tp) would
/// complete the sum; where none is reachable, no later operator can.
///
/// The direction that matters: `true` withholds the operators downstream from inference, so a
/// wrong `true` could refute a plan whose later operators complete the sum; a wrong `false`
/// only costs time. So every approximation here errs towards `false`: the walk passes the sum
/// through every operator the tables may count as linear in it, except where it is known not to
/// be linear in the sum as a whole ([`passes_not`]: a product of two values both computed from
/// it, `h * rsqrt(mean(h^2))`, or a sum with a nonlinear function of it, `h + mlp(norm(h))`).
/// Such a value is a nonlinear function `f` of the rank's partial sum, and a later sum over the
/// missing ranks gives `f(a) + f(b)`, not `f(a + b)`. What counts as "computed from" the sum is
/// under-approximated ([`computed_from`]), so a doubt lets the sum pass; a search cut by its
/// bounds answers `false`.
pub(super) fn never_completed<'e>(
    case: &Case,
    imp: &Impl,
    exprs: impl IntoIterator<Item = &'e RecExpr<Term>>,
) -> bool {
    exprs.into_iter().filter(|e| is_rank_sum(e)).all(|e| {
        let summands = summands_of(e);
        let leaves: Vec<ValueRef> = expr_leaves(imp, e)
            .into_iter()
            .map(|l| imp.canon(l))
            .collect();
        let past: BTreeSet<BTreeSet<usize>> = leaves
            .iter()
            .flat_map(|l| imp.consumers.get(l).map_or(&[][..], Vec::as_slice))
            .filter(|&&(r, n)| is_collective(case, r, n))
            .filter_map(|&(r, n)| collective_ranks(imp, r, n))
            .collect();
        leaves.iter().all(|&l| {
            let dep = computed_from(case, imp, l);
            let path = reduction_path_past(case, imp, l, &summands, &past, Some(&dep), MAX_SEEN);
            !path.reduced && !path.truncated
        })
    })
}
