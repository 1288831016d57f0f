//! Lemmas for rows flattened out of an inner partitioned dim.
//!
//! Megatron keeps activations sequence-first (`[s, b, h]`) and flattens them to `[s*b, h]` for
//! its linears, so under data parallelism (batch split, dim 1) the flattened rows of the ranks
//! interleave: `view(cat_1(x_i), [s*b, h])` is no block of rows of any rank. It is still a
//! fixed permutation of the rows of the pieces `view(x_i, [s*b_i, h])`, the same permutation
//! for every operand flattened the same way. So an operator that treats rows independently
//! works piece by piece, and the result is put back in the same interleaved order; an
//! operator that sums over rows (a weight gradient, a bias gradient, a summed loss) is the sum
//! of the pieces' results, since a sum does not depend on the order of its terms.

use super::{
    cat, ew, int, is_none, list, node_sym, op, shape, symbols, views, with_kids, Graph, Lemma, GET,
};
use crate::term::{is_op, sym, Term, SUM};
use egg::Id;
use std::sync::Arc;

/// The rows of one operand split into the ranks' pieces: `x = view(cat_dim(x_i), [R, rest])`
/// where the view flattens the dims `lead` (which include `dim`, not first) into the rows.
struct Interleaved {
    /// The partitioned dim among the flattened ones.
    dim: usize,
    /// Per piece, the flattened dims with the piece's size at `dim`.
    leads: Vec<Vec<usize>>,
    /// Per piece, its rows: `view(x_i, [R_i, rest])`.
    rows: Vec<Id>,
}

/// The interleaved-row forms of a class (at most a few): its views of a partitioned tensor,
/// and its transposes of such views that keep the rows in place.
fn interleaved(g: &mut Graph, id: Id) -> Vec<Interleaved> {
    let mut out = interleaved_views(g, id);
    for (x, a, b) in super::transposes(g, id) {
        if !matches!((int(g, a), int(g, b)), (Some(1..), Some(1..))) {
            continue;
        }
        for mut form in interleaved_views(g, x) {
            for r in &mut form.rows {
                *r = op(g, "aten.transpose.int", vec![*r, a, b]);
            }
            out.push(form);
        }
    }
    out
}

/// The interleaved-row forms of a class's views.
fn interleaved_views(g: &mut Graph, id: Id) -> Vec<Interleaved> {
    let Some(vs) = shape(g, id) else {
        return vec![];
    };
    let Some(&rows) = vs.first() else {
        return vec![];
    };
    let mut out = Vec::new();
    for x in views(g, id) {
        let Some(xs) = shape(g, x) else { continue };
        // The smallest prefix of x's dims that flattens into the rows, two dims at least.
        let mut acc = 1;
        let mut j = 0;
        while j < xs.len() && acc < rows {
            acc *= xs[j];
            j += 1;
        }
        if acc != rows || j < 2 {
            continue;
        }
        for (dim, pieces) in super::cats(g, x) {
            if dim == 0 || dim >= j {
                continue;
            }
            let mut leads = Vec::new();
            let mut piece_rows = Vec::new();
            for &p in &pieces {
                let Some(ps) = shape(g, p) else { break };
                let mut lead = xs[..j].to_vec();
                lead[dim] = ps[dim];
                let mut s = vec![lead.iter().product()];
                s.extend_from_slice(&vs[1..]);
                let l = list(g, &s);
                piece_rows.push(op(g, "aten.view.default", vec![p, l]));
                leads.push(lead);
            }
            if piece_rows.len() == pieces.len() {
                out.push(Interleaved {
                    dim,
                    leads,
                    rows: piece_rows,
                });
            }
        }
    }
    out
}

/// Puts the pieces' row results back in the interleaved order of `form`, as a tensor of
/// shape `out` (rows first).
fn interleave(g: &mut Graph, form: &Interleaved, results: &[Id], out: &[usize]) -> Id {
    let parts = form
        .leads
        .iter()
        .zip(results)
        .map(|(lead, &r)| {
            let mut s = lead.clone();
            s.extend_from_slice(&out[1..]);
            let l = list(g, &s);
            op(g, "aten.view.default", vec![r, l])
        })
        .collect();
    let c = cat(g, form.dim, parts);
    let l = list(g, out);
    op(g, "aten.view.default", vec![c, l])
}

/// Makes `id` the view back of its unflattened form when the graph holds that form, the rows
/// unflattened like `form`'s (all its pieces' rows): `id = view(view(id, [lead.., rest..]),
/// shape(id))`. Under context parallelism the spec's chunks are slices of that form and tile
/// it, so it is a concatenation and `id` (a rank's rows) gets an interleaved form of its own;
/// looked up, never built.
fn view_back(g: &mut Graph, id: Id, form: &Interleaved) -> bool {
    let Some(s) = shape(g, id) else { return false };
    let Some(first) = form.leads.first() else {
        return false;
    };
    let mut whole = first.clone();
    whole[form.dim] = form.leads.iter().map(|l| l[form.dim]).sum();
    if s.first() != Some(&whole.iter().product()) {
        return false;
    }
    let mut target = whole;
    target.extend_from_slice(&s[1..]);
    let Some(l) = super::chunks::lookup_list(g, &target) else {
        return false;
    };
    let Some(u) = g.lookup(Term::Op(sym!("aten.view.default"), vec![id, l])) else {
        return false;
    };
    if super::cats(g, u).is_empty() {
        return false;
    }
    let ls = list(g, &s);
    let back = op(g, "aten.view.default", vec![u, ls]);
    g.union(back, id);
    true
}

/// For each interleaved form of the first of `operands`, the matching forms (same dim, same
/// flattened pieces) of the others: per operand, its pieces' rows.
fn aligned(g: &mut Graph, operands: &[Id]) -> Vec<(Interleaved, Vec<Vec<Id>>)> {
    if operands.is_empty() {
        return vec![];
    }
    let mut forms: Vec<Vec<Interleaved>> = operands.iter().map(|&o| interleaved(g, o)).collect();
    // An operand without a form may still be a view of an interleaved tensor of the graph.
    if let Some(k) = forms.iter().position(|f| !f.is_empty()) {
        for i in 0..operands.len() {
            if forms[i].is_empty() && view_back(g, operands[i], &forms[k][0]) {
                forms[i] = interleaved(g, operands[i]);
            }
        }
    }
    let mut forms = forms.into_iter();
    let first_forms = forms.next().unwrap_or_default();
    let other_forms: Vec<Vec<Interleaved>> = forms.collect();
    let mut out = Vec::new();
    for form in first_forms {
        let matched: Option<Vec<Vec<Id>>> = other_forms
            .iter()
            .map(|forms| {
                forms
                    .iter()
                    .find(|f| f.dim == form.dim && f.leads == form.leads)
                    .map(|f| f.rows.clone())
            })
            .collect();
        if let Some(mut rows) = matched {
            rows.insert(0, form.rows.clone());
            out.push((form, rows));
        }
    }
    out
}

/// Which operands of a row-wise call hold rows (and must be split alike); `None` when the
/// call is not row-wise in its first dim.
fn row_operands(g: &Graph, sym: &str, kids: &[Id], out: &[usize]) -> Option<Vec<usize>> {
    if let Some(e) = ew(sym) {
        let mut rows = Vec::new();
        for &i in e.1 {
            let s = shape(g, kids[i])?;
            if s == out {
                rows.push(i);
            } else if !(s.len() < out.len() || s.first() == Some(&1)) {
                return None;
            }
        }
        return (!rows.is_empty()).then_some(rows);
    }
    let not_rows = |k: Id| int(g, k).is_some_and(|d| d != 0 && d != -(out.len() as i64));
    match sym {
        "aten.mm.default" => Some(vec![0]),
        // The batch dim of a batched product is its rows.
        "aten.bmm.default" => Some(vec![0, 1]),
        "aten._softmax.default" | "aten._log_softmax.default" => not_rows(kids[1]).then(|| vec![0]),
        "aten._softmax_backward_data.default" | "aten._log_softmax_backward_data.default" => {
            not_rows(kids[2]).then(|| vec![0, 1])
        }
        // A reduced NLL's backward: each row's gradient depends on its own row and target and
        // the scalar upstream gradient and total weight.
        "aten.nll_loss_backward.default" => {
            let reduced = matches!(int(g, kids[4]), Some(1 | 2));
            let scalar = shape(g, kids[0]).is_some_and(|s| s.is_empty());
            (reduced && scalar && is_none(g, kids[3])).then(|| vec![1, 2])
        }
        _ => None,
    }
}

/// The operators [`rows_over_interleaved_cat`] applies to.
fn row_roots() -> Vec<String> {
    let mut roots = super::elementwise_roots();
    roots.extend(
        [
            "aten.mm.default",
            "aten.bmm.default",
            "aten._softmax.default",
            "aten._log_softmax.default",
            "aten._softmax_backward_data.default",
            "aten._log_softmax_backward_data.default",
            "aten.nll_loss_backward.default",
        ]
        .map(String::from),
    );
    roots
}

/// Row-wise operators over interleaved rows work piece by piece.
fn rows_over_interleaved_cat() -> Lemma {
    // Built once: the applier runs on every match of every root.
    let roots = row_roots();
    let matched = symbols(&roots);
    Lemma {
        name: "rows-over-interleaved-cat",
        doc: "f(view(cat_d(x_i), [R, ..]), ..) for f row-wise and d an inner flattened dim = the pieces' results put back in the interleaved row order",
        roots,
        examples: vec![
            (
                "(aten.mm.default (aten.view.default (cat 1 %r0:a %r1:a) (list 6 4)) %r0:b)",
                &[("a", "f64[3,1,4]"), ("b", "f64[4,5]")],
            ),
            (
                "(aten.bmm.default (aten.view.default (cat 1 %r0:a %r1:a) (list 4 3 2)) (aten.transpose.int (aten.view.default (cat 1 %r0:b %r1:b) (list 4 5 2)) 1 2))",
                &[("a", "f64[2,1,3,2]"), ("b", "f64[2,1,5,2]")],
            ),
            (
                "(aten.add.Tensor (aten.view.default (cat 1 %r0:a %r1:a) (list 6 4)) %r0:b 1)",
                &[("a", "f64[3,1,2,2]"), ("b", "f64[4]")],
            ),
            (
                "(aten._log_softmax_backward_data.default (aten.view.default (cat 1 %r0:a %r1:a) (list 4 3)) (aten.view.default (cat 1 %r0:b %r1:b) (list 4 3)) 1 dt:f64)",
                &[("a", "f64[2,1,3]"), ("b", "f64[2,1,3]")],
            ),
            (
                "(aten.nll_loss_backward.default %r0:g (aten.view.default (cat 1 %r0:x %r1:x) (list 4 3)) (aten.view.default (cat 1 %r0:t %r1:t) (list 4)) none 2 -100 %r0:g)",
                &[("g", "f64[]"), ("x", "f64[2,1,3]"), ("t", "i64[2,1]<3")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &matched) else { return vec![] };
            let Some(out_shape) = shape(g, eclass) else { return vec![] };
            if out_shape.is_empty() {
                return vec![];
            }
            let Some(rows) = row_operands(g, sym.as_str(), kids, &out_shape) else {
                return vec![];
            };
            let operands: Vec<Id> = rows.iter().map(|&i| kids[i]).collect();
            let mut out = Vec::new();
            for (form, pieces) in aligned(g, &operands) {
                let results: Vec<Id> = (0..form.rows.len())
                    .map(|p| {
                        let replace: Vec<(usize, Id)> =
                            rows.iter().zip(&pieces).map(|(&i, ps)| (i, ps[p])).collect();
                        g.add(with_kids(sym, kids, &replace))
                    })
                    .collect();
                out.push(interleave(g, &form, &results, &out_shape));
            }
            out
        }),
    }
}

/// Sums over interleaved rows are sums of the pieces' sums.
fn sums_over_interleaved_rows() -> Lemma {
    Lemma {
        name: "sums-over-interleaved-rows",
        doc: "a reduction over all rows of view(cat_d(x_i), [R, ..]) (mm(transpose(a), b), sum over dim 0, a summed NLL) = sum over ranks of the pieces' reductions",
        roots: vec![
            "aten.mm.default".into(),
            "aten.sum.dim_IntList".into(),
            GET.into(),
        ],
        examples: vec![
            (
                "(aten.mm.default (aten.transpose.int (aten.view.default (cat 1 %r0:a %r1:a) (list 6 4)) 0 1) (aten.view.default (cat 1 %r0:b %r1:b) (list 6 2)))",
                &[("a", "f64[3,1,4]"), ("b", "f64[3,1,2]")],
            ),
            (
                "(aten.sum.dim_IntList (aten.view.default (cat 1 %r0:a %r1:a) (list 6 4)) (list 0) b:false none)",
                &[("a", "f64[3,1,4]")],
            ),
            (
                "(get 0 (aten.nll_loss_forward.default (aten.view.default (cat 1 %r0:x %r1:x) (list 4 3)) (aten.view.default (cat 1 %r0:t %r1:t) (list 4)) none 2 -100))",
                &[("x", "f64[2,1,3]"), ("t", "i64[2,1]<3")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let mut out = Vec::new();
            // mm(transpose(a, 0, 1), b): the contraction runs over the rows of a and b.
            if let Some(sym) = node_sym(g, eclass, kids, &[sym!("aten.mm.default")]) {
                for (a, d0, d1) in super::transposes(g, kids[0]) {
                    if (int(g, d0), int(g, d1)) != (Some(0), Some(1)) {
                        continue;
                    }
                    for (_, pieces) in aligned(g, &[a, kids[1]]) {
                        let parts: Vec<Id> = pieces[0]
                            .iter()
                            .zip(&pieces[1])
                            .map(|(&x, &y)| {
                                let t = op(g, "aten.transpose.int", vec![x, d0, d1]);
                                g.add(with_kids(sym, kids, &[(0, t), (1, y)]))
                            })
                            .collect();
                        out.push(op(g, SUM, parts));
                    }
                }
                return out;
            }
            if let Some(sym) = node_sym(g, eclass, kids, &[sym!("aten.sum.dim_IntList")]) {
                if super::int_list(g, kids[1]).as_deref() != Some(&[0]) {
                    return vec![];
                }
                for (_, pieces) in aligned(g, &[kids[0]]) {
                    let parts: Vec<Id> = pieces[0]
                        .iter()
                        .map(|&x| g.add(with_kids(sym, kids, &[(0, x)])))
                        .collect();
                    out.push(op(g, SUM, parts));
                }
                return out;
            }
            // get 0 of a sum-reduced, unweighted NLL.
            if kids.len() != 2 || int(g, kids[0]) != Some(0) {
                return vec![];
            }
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.nll_loss_forward.default")
                    || int(g, ck[3]) != Some(2)
                    || !is_none(g, ck[2])
                {
                    continue;
                }
                for (_, pieces) in aligned(g, &[ck[0], ck[1]]) {
                    let parts: Vec<Id> = pieces[0]
                        .iter()
                        .zip(&pieces[1])
                        .map(|(&x, &t)| {
                            let call = g.add(with_kids(s, &ck, &[(0, x), (1, t)]));
                            op(g, GET, vec![kids[0], call])
                        })
                        .collect();
                    out.push(op(g, SUM, parts));
                }
            }
            out
        }),
    }
}

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![rows_over_interleaved_cat(), sums_over_interleaved_rows()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{classes_agree, random_tensor, seeded_values};
    use crate::term::Shapes;
    use egg::{RecExpr, Runner};
    use shardproof_ir::DType;
    use shardproof_ops::Meta;
    use std::collections::HashMap;

    /// A rank's summed NLL over its own logits `x` (no interleaved form) and its chunks'
    /// labels: once the graph holds `view(x, [2, 4, 3])` as the concatenation of its chunks,
    /// `x` is the view back of it and the NLL splits per chunk; every class keeps one value.
    #[test]
    fn view_back_splits_a_rank_loss_over_its_chunks() {
        let mut next = seeded_values(0.35);
        let mut leaves = HashMap::new();
        leaves.insert(
            "r0:x".to_string(),
            random_tensor(DType::F64, vec![8, 3], 8, &mut next),
        );
        leaves.insert(
            "r0:t".to_string(),
            random_tensor(DType::I64, vec![2, 4], 3, &mut next),
        );
        let mut g = Graph::new(Shapes::default());
        g.analysis
            .leaves
            .insert("%r0:x".into(), Meta::new(DType::F64, vec![8, 3]));
        g.analysis
            .leaves
            .insert("%r0:t".into(), Meta::new(DType::I64, vec![2, 4]));
        let loss: RecExpr<Term> = "(get 0 (aten.nll_loss_forward.default %r0:x (aten.view.default (cat 1 (slice 1 0 2 %r0:t) (slice 1 2 4 %r0:t)) (list 8)) none 2 -100))"
            .parse()
            .unwrap();
        let root = g.add_expr(&loss);
        // The spec's chunks tile the unflattened logits (`cat-of-adjacent-slices`' fact).
        let unflat: RecExpr<Term> = "(aten.view.default %r0:x (list 2 4 3))".parse().unwrap();
        let chunked: RecExpr<Term> = "(cat 1 (slice 1 0 2 (aten.view.default %r0:x (list 2 4 3))) (slice 1 2 4 (aten.view.default %r0:x (list 2 4 3))))"
            .parse()
            .unwrap();
        let (u, c) = (g.add_expr(&unflat), g.add_expr(&chunked));
        g.union(u, c);
        g.rebuild();
        let g = Runner::default()
            .with_egraph(g)
            .with_iter_limit(3)
            .run(&sums_over_interleaved_rows().rewrites())
            .egraph;
        assert!(!super::super::sums(&g, root).is_empty(), "the loss split");
        classes_agree(&g, &leaves).unwrap();
    }
}
