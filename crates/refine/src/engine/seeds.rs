//! The spec side of an operator's e-graph: spec equations it is seeded with (the forward's
//! products a backward operator's lemmas need), and relations carried back through the spec's
//! views.

use super::extract::extract;
use super::relation::{add_rec, add_relation, add_tpl, tpl_values, Impl, Rel, State};
use super::saturate::max_unclean_nodes;
use crate::lemmas::Graph;
use crate::lower::{lower, LowerCtx, Lowered, Tpl};
use crate::term::{is_op, Shapes, Term, LIST, SLICE};
use egg::{Id, RecExpr, Symbol};
use shardproof_ir::{Graph as IrGraph, ValueId};
use shardproof_ops::Meta;
use std::collections::HashMap;

/// The spec operators whose equations the e-graph of spec node `n` is seeded with (see
/// [`seed_spec_equations`]): for the softmax backward `_softmax_backward_data(dP, P)`, the
/// forward's products of the probabilities `P` (or of a view of them), `O = P V`, and the
/// layout operands (`V^T` a transpose of `V`) of the product `dP = dO V^T`. Its row statistic
/// `rowsum(dP * P)` is `rowsum(dO * O)` (`rowsum-of-scores-gradient`), the ranks' `D`, only
/// where the e-graph knows `O` and `V` as the spec computed them; other operators get none.
pub(super) fn spec_seeds(
    ctx: &LowerCtx,
    spec: &IrGraph,
    spec_metas: &[Vec<Option<Meta>>],
    spec_users: &[Vec<usize>],
    n: usize,
) -> Vec<(Tpl, ValueId)> {
    const PRODUCTS: [&str; 3] = ["aten.bmm.default", "aten.matmul.default", "aten.mm.default"];
    const LAYOUT: [&str; 4] = [
        "aten.view.default",
        "aten.transpose.int",
        "aten.t.default",
        "aten.permute.default",
    ];
    let op_of = |m: usize| {
        spec.nodes[m]
            .op()
            .map(|o| o.to_string())
            .unwrap_or_default()
    };
    if op_of(n) != "aten._softmax_backward_data.default" {
        return Vec::new();
    }
    let inputs = spec.nodes[n].inputs();
    let (Some(&grad), Some(&probs)) = (inputs.first(), inputs.get(1)) else {
        return Vec::new();
    };
    let mut wanted: Vec<ValueId> = Vec::new();
    // O = P V: products reading the probabilities or a view of them.
    let mut readers = vec![probs.node];
    readers.extend(
        spec_users[probs.node]
            .iter()
            .copied()
            .filter(|&u| op_of(u) == "aten.view.default"),
    );
    for r in readers {
        for &u in &spec_users[r] {
            if PRODUCTS.contains(&op_of(u).as_str()) {
                wanted.push(ValueId::new(u, 0));
            }
        }
    }
    // dP = dO V^T: the product under the gradient's views, and its layout operands.
    let mut at = grad.node;
    for _ in 0..3 {
        if PRODUCTS.contains(&op_of(at).as_str()) {
            for x in spec.nodes[at].inputs() {
                if LAYOUT.contains(&op_of(x.node).as_str()) {
                    wanted.push(x);
                }
            }
            break;
        }
        match spec.nodes[at].inputs().first() {
            Some(x) if LAYOUT.contains(&op_of(at).as_str()) => at = x.node,
            _ => break,
        }
    }
    wanted.sort();
    wanted.dedup();
    wanted
        .into_iter()
        .filter_map(
            |w| match lower(ctx, spec, spec_metas, None, w.node, w.output) {
                Lowered::Term(t) => Some((t, w)),
                _ => None,
            },
        )
        .collect()
}

/// Seeds an e-graph with spec equations: for each `(t, w)`, the spec's own operator `t` over
/// its inputs' relations equals `w`'s clean relation. Both sides denote the spec value `w` (a
/// relation is an expression equal to its spec value), so the union is a true equation; the
/// lemmas then read a forward product (`O = P V`) from the ranks' tensors it relates to.
pub(super) fn seed_spec_equations(
    eg: &mut Graph,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    seeds: &[(Tpl, ValueId)],
    ids: &mut HashMap<ValueId, Id>,
) {
    for (_, _, lhs, rhs) in seed_sides(eg, imp, state, seeds, ids) {
        eg.union(lhs, rhs);
    }
}

/// Both sides of each seed equation whose right side `w` has a clean relation and whose
/// operator's inputs are all related, added to the e-graph (the inputs' relations added once,
/// into `ids`): the operator, `w`'s relation, the left and the right class.
pub(super) fn seed_sides<'s>(
    eg: &mut Graph,
    imp: &Impl,
    state: &'s HashMap<ValueId, State>,
    seeds: &'s [(Tpl, ValueId)],
    ids: &mut HashMap<ValueId, Id>,
) -> Vec<(&'s Tpl, &'s Rel, Id, Id)> {
    let mut sides = Vec::new();
    for (t, w) in seeds {
        let Some(State::Related(rw)) = state.get(w) else {
            continue;
        };
        if !rw.clean {
            continue;
        }
        let mut ins = Vec::new();
        tpl_values(t, &mut ins);
        if !ins
            .iter()
            .all(|x| matches!(state.get(&x.value), Some(State::Related(_))))
        {
            continue;
        }
        for x in &ins {
            if let (std::collections::hash_map::Entry::Vacant(slot), Some(State::Related(r))) =
                (ids.entry(x.value), state.get(&x.value))
            {
                slot.insert(add_relation(eg, imp, r));
            }
        }
        let lhs = add_tpl(eg, t, &mut |_, x| ids[&x.value]);
        let rhs = add_relation(eg, imp, rw);
        sides.push((t, rw, lhs, rhs));
    }
    sides
}

/// A clean relation of `view(x, shape)` is one of `x` too, viewed back (`x = view(view(x,
/// shape), x's shape)`, a reshape keeping the element order): where `x`'s own relation is not
/// clean, it becomes that view. Later consumers of `x` then start from the ranks' tensors (the
/// attention backward reads the 4-d probabilities whose 3-d view the forward related to the
/// ranks' blocks), not from the spec's operators over them.
/// Whether a clean relation of `node`'s output is viewed back onto its input ([`view_back`]):
/// the one way a later operator changes an earlier value's relation.
pub(super) fn views_back(node: &shardproof_ir::Node) -> bool {
    node.op().map(|o| o.to_string()).as_deref() == Some("aten.view.default")
}

pub(super) fn view_back(
    spec_metas: &[Vec<Option<Meta>>],
    node: &shardproof_ir::Node,
    s: &State,
    state: &mut HashMap<ValueId, State>,
) {
    let State::Related(c) = s else { return };
    if !c.clean || !views_back(node) {
        return;
    }
    let Some(&x) = node.inputs().first() else {
        return;
    };
    if !matches!(state.get(&x), Some(State::Related(r)) if !r.clean) {
        return;
    }
    let Some(Some(meta)) = spec_metas.get(x.node).and_then(|m| m.get(x.output)) else {
        return;
    };
    let exprs: Vec<RecExpr<Term>> = c
        .exprs
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let root = Id::from(e.as_ref().len() - 1);
            let dims: Vec<Id> = meta
                .shape
                .iter()
                .map(|&d| e.add(Term::Num(d as i64)))
                .collect();
            let list = e.add(Term::Op(Symbol::from(LIST), dims));
            e.add(Term::Op(
                Symbol::from("aten.view.default"),
                vec![root, list],
            ));
            e
        })
        .collect();
    state.insert(
        x,
        State::Related(Rel {
            exprs,
            clean: true,
            equal_leaves: c.equal_leaves.clone(),
            equal_slices: c.equal_slices.clone(),
            explored: Vec::new(),
        }),
    );
}

/// Whether an expression slices a slice.
pub(super) fn nested_slices(e: &RecExpr<Term>) -> bool {
    let nodes = e.as_ref();
    let is_slice = |n: &Term| matches!(n, Term::Op(s, k) if is_op!(s, SLICE) && k.len() == 4);
    nodes.iter().any(|n| match n {
        Term::Op(s, k) if is_op!(s, SLICE) && k.len() == 4 => is_slice(&nodes[usize::from(k[3])]),
        _ => false,
    })
}

/// The spec operator over its inputs' first relations, before any lemma (built in an e-graph
/// of its own, which is small): kept beside a clean form found by naming chunks, so the next
/// operators' lemmas still match the spec's operators (a softmax, say), which the chunks'
/// names do not show.
pub(super) fn spec_form(
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    t: &Tpl,
) -> Option<RecExpr<Term>> {
    let mut ins = Vec::new();
    tpl_values(t, &mut ins);
    let mut small = Graph::new(Shapes::default());
    let mut ids: HashMap<ValueId, Id> = HashMap::new();
    for x in &ins {
        if ids.contains_key(&x.value) {
            continue;
        }
        let Some(State::Related(r)) = state.get(&x.value) else {
            return None;
        };
        ids.insert(x.value, add_rec(&mut small, imp, r.exprs.first()?));
    }
    let root = add_tpl(&mut small, t, &mut |_, x| ids[&x.value]);
    small.rebuild();
    extract(&small, small.find(root), false)
        .into_iter()
        .next()
        .filter(|e| e.as_ref().len() <= max_unclean_nodes(imp))
}
