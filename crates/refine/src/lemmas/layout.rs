//! Layout operators (transposes, permutes, views, expands, slices) through concatenations,
//! including the layout chains a view of a concatenation reaches by a strided permutation.

use super::moe;
use super::{
    cat, cats, ew, int, int_list, int_list_node, is_one, list, matmul_over_cat, node_sym, num, op,
    pair_sums, product_reduced, scale, scales, shape, sizes, slice, sums, transposes, views, Graph,
    Lemma, MAX_SEPARATE_ADDS, PIECEWISE, SCALE,
};
use crate::term::{is_op, sym, Term, CAT, SLICE, SUM};
use egg::Id;
use std::sync::Arc;

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    let mut l = Vec::new();
    // Layout operators through concatenations.
    l.push(Lemma {
        name: "transpose-over-cat",
        doc: "transpose(cat_d(x_i), a, b) = cat_{swap(d)}(transpose(x_i, a, b))",
        roots: vec!["aten.transpose.int".into()],
        examples: vec![(
            "(aten.transpose.int (cat 1 %r0:a %r1:a) 0 1)",
            &[("a", "f64[2,3]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(a), Some(b)) = (int(g, kids[1]), int(g, kids[2])) else {
                return vec![];
            };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let nd = if d as i64 == a {
                    b
                } else if d as i64 == b {
                    a
                } else {
                    d as i64
                } as usize;
                let ps: Vec<Id> = pieces
                    .iter()
                    .map(|&p| op(g, "aten.transpose.int", vec![p, kids[1], kids[2]]))
                    .collect();
                out.push(cat(g, nd, ps));
            }
            // Transposing back undoes a transpose.
            for (x, xa, xb) in transposes(g, kids[0]) {
                if (int(g, xa), int(g, xb)) == (Some(a), Some(b)) {
                    out.push(x);
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "view-over-cat",
        doc: "view(cat_d(x_i), s) = cat_d'(view(x_i, s_i)) when every piece is a whole block of rows of dim d' of s; view(view(x)) = view(x); a view to x's own shape is x",
        roots: vec!["aten.view.default".into()],
        examples: vec![
            ("(aten.view.default (cat 0 %r0:a %r1:a) (list 12 4))", &[("a", "f64[3,2,4]")]),
            ("(aten.view.default (cat 2 %r0:a %r1:a) (list 6 8))", &[("a", "f64[3,2,4]")]),
            ("(aten.view.default (cat 1 %r0:a %r1:a) (list 2 2 6))", &[("a", "f64[2,6]")]),
            ("(aten.view.default (aten.view.default %r0:a (list 6)) (list 3 2))", &[("a", "f64[2,3]")]),
            ("(aten.view.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (list 2 4 3))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let Some(src) = shape(g, kids[0]) else { continue };
                if let Some(id) = view_of_cat(g, &src, &target, d, &pieces) {
                    out.push(id);
                }
            }
            // Collapse chains of views, and views back to a class's own shape.
            for inner in views(g, kids[0]) {
                if shape(g, inner).as_deref() == Some(&target[..]) {
                    out.push(inner);
                } else {
                    out.push(op(g, "aten.view.default", vec![inner, kids[1]]));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "permute-over-cat",
        doc: "permute(cat_d(x_i), p) = cat_{p^-1(d)}(permute(x_i, p))",
        roots: vec!["aten.permute.default".into()],
        examples: vec![(
            "(aten.permute.default (cat 1 %r0:a %r1:a) (list 2 0 1))",
            &[("a", "f64[2,3,4]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(p) = int_list(g, kids[1]) else {
                return vec![];
            };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let Some(nd) = p.iter().position(|&x| x == d as i64) else {
                    continue;
                };
                let ps: Vec<Id> = pieces
                    .iter()
                    .map(|&x| op(g, "aten.permute.default", vec![x, kids[1]]))
                    .collect();
                out.push(cat(g, nd, ps));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "layout-chain",
        doc: "a chain of views, transposes and permutes that only reorders x's elements is permute(view(x, s), p) (strides computed exactly)",
        roots: vec!["aten.view.default".into()],
        examples: vec![
            ("(aten.view.default (aten.transpose.int (aten.view.default %r0:a (list 3 8 2)) 0 1) (list 2 4 3 2))", &[("a", "f64[3,2,4,2]")]),
            ("(aten.view.default (aten.permute.default %r0:a (list 0 2 1)) (list 3 2 2 2))", &[("a", "f64[3,4,2]")]),
            ("(aten.view.default (aten.transpose.int %r0:a 1 2) (list 1 4 3 1 2))", &[("a", "f64[4,2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, _| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            let mut out = Vec::new();
            for (base, steps) in layout_chains(g, eclass) {
                if !steps.iter().any(|s| matches!(s, LayoutStep::Permute(_))) {
                    continue;
                }
                let Some(bs) = shape(g, base) else { continue };
                let Some((split, perm)) = strided_permutation(&bs, &steps, &target) else { continue };
                // A permutation of `base` itself that only a view to unit dims follows is the
                // chain as it was: the unit dims go into the split instead.
                let (split, perm) = if split == bs {
                    units_in_split(&split, &perm, &target).unwrap_or((split, perm))
                } else {
                    (split, perm)
                };
                let mut x = base;
                if split != bs {
                    let l = list(g, &split);
                    x = op(g, "aten.view.default", vec![x, l]);
                }
                if perm.iter().enumerate().any(|(i, &p)| i != p) {
                    let l = list(g, &perm);
                    x = op(g, "aten.permute.default", vec![x, l]);
                }
                let now: Vec<usize> = perm.iter().map(|&p| split[p]).collect();
                if now != target {
                    let l = list(g, &target);
                    x = op(g, "aten.view.default", vec![x, l]);
                }
                out.push(x);
            }
            out
        }),
    });
    l.push(Lemma {
        name: "view-through-unary",
        doc: "view(f(x, c), s) = f(view(x, s), c) for an elementwise f of one tensor",
        roots: vec!["aten.view.default".into()],
        examples: vec![
            (
                "(aten.view.default (aten.mul.Scalar %r0:a f:0.5) (list 6))",
                &[("a", "f64[2,3]")],
            ),
            (
                "(aten.view.default (scale 1 3 %r0:a) (list 3 2))",
                &[("a", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                let at = if is_op!(s, SCALE) {
                    2
                } else if ew(s.as_str()).is_some_and(|e| e.1 == [0]) {
                    0
                } else {
                    continue;
                };
                let v = op(g, "aten.view.default", vec![ck[at], kids[1]]);
                let mut k = ck.clone();
                k[at] = v;
                out.push(g.add(Term::Op(s, k)));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "bmm-unflatten",
        doc: "view(bmm(a, b), [B.., m, n]) with prod(B) the batch = matmul(view(a, [B.., m, k]), view(b, [B.., k, n]))",
        roots: vec!["aten.view.default".into()],
        examples: vec![("(aten.view.default (aten.bmm.default %r0:a %r0:b) (list 2 3 2 4))", &[("a", "f64[6,2,5]"), ("b", "f64[6,5,4]")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            if target.len() < 4 {
                return vec![];
            }
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.bmm.default") {
                    continue;
                }
                let (Some(a), Some(b)) = (shape(g, ck[0]), shape(g, ck[1])) else { continue };
                let r = target.len();
                let batch: usize = target[..r - 2].iter().product();
                if batch != a[0] || target[r - 2] != a[1] || target[r - 1] != b[2] {
                    continue;
                }
                let mut sa = target[..r - 2].to_vec();
                sa.extend([a[1], a[2]]);
                let mut sb = target[..r - 2].to_vec();
                sb.extend([b[1], b[2]]);
                let (la, lb) = (list(g, &sa), list(g, &sb));
                let va = op(g, "aten.view.default", vec![ck[0], la]);
                let vb = op(g, "aten.view.default", vec![ck[1], lb]);
                out.push(op(g, "aten.matmul.default", vec![va, vb]));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "matmul-flatten",
        doc: "matmul(view(a, [B.., m, k]), y) with a of shape [prod(B), m, k] and y batched alike = view(bmm(a, view(y, [prod(B), k, n])), [B.., m, n]): the inverse of bmm-unflatten, for a product whose left operand was unflattened from a 3-d one (the piece of an attention product over one head group, whose ranks multiply 3-d blocks)",
        roots: vec!["aten.matmul.default".into()],
        examples: vec![("(aten.matmul.default (aten.view.default %r0:a (list 2 3 2 5)) %r0:b)", &[("a", "f64[6,2,5]"), ("b", "f64[2,3,5,4]")])],
        requires: Some(PIECEWISE),
        build: Arc::new(|g, eclass, kids| {
            let (Some(out), Some(sy)) = (shape(g, eclass), shape(g, kids[1])) else {
                return vec![];
            };
            let r = out.len();
            if r < 4 || sy.len() != r || sy[..r - 2] != out[..r - 2] {
                return vec![];
            }
            let batch: usize = out[..r - 2].iter().product();
            let Some(a) = views(g, kids[0]).into_iter().find(|&a| {
                shape(g, a).is_some_and(|sa| sa.len() == 3 && sa[0] == batch && sa[1] == out[r - 2])
            }) else {
                return vec![];
            };
            let flat_y = list(g, &[batch, sy[r - 2], sy[r - 1]]);
            let vy = op(g, "aten.view.default", vec![kids[1], flat_y]);
            let product = op(g, "aten.bmm.default", vec![a, vy]);
            let target = list(g, &out);
            vec![op(g, "aten.view.default", vec![product, target])]
        }),
    });
    l.push(Lemma {
        name: "matmul-over-cat",
        doc: "batched matmul: batch-dim pieces pair up (or meet a broadcast operand); row pieces of a, column pieces of b, and contracted pieces sum",
        roots: vec!["aten.matmul.default".into()],
        examples: vec![
            ("(aten.matmul.default (cat 1 %r0:a %r1:a) (cat 1 %r0:b %r1:b))", &[("a", "f64[2,2,3,4]"), ("b", "f64[2,2,4,3]")]),
            ("(aten.matmul.default (cat 1 %r0:a %r1:a) %r0:b)", &[("a", "f64[2,2,3,4]"), ("b", "f64[2,1,4,3]")]),
            ("(aten.matmul.default (cat 3 %r0:a %r1:a) (cat 2 %r0:b %r1:b))", &[("a", "f64[2,2,3,4]"), ("b", "f64[2,2,4,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(a), Some(b)) = (shape(g, kids[0]), shape(g, kids[1])) else { return vec![] };
            if a.len() != b.len() || a.len() < 3 {
                return vec![];
            }
            matmul_over_cat(g, "aten.matmul.default", kids, a.len() - 2)
        }),
    });
    l.push(Lemma {
        name: "cat-interchange",
        doc: "cat_d(cat_e(x_i), cat_e(y_i), ...) = cat_e(cat_d(x_i, y_i, ...)) when every operand is split along e (e != d) into pieces of the same sizes",
        roots: vec![CAT.into()],
        examples: vec![("(cat 1 (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[2,2]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(d) = int(g, kids[0]) else { return vec![] };
            let d = d as usize;
            let operands = &kids[1..];
            let mut out = Vec::new();
            let Some(first) = operands.first() else { return vec![] };
            for (e, pieces0) in cats(g, *first) {
                if e == d {
                    continue;
                }
                let Some(szs) = sizes(g, &pieces0, e) else { continue };
                let mut columns: Vec<Vec<Id>> = vec![Vec::new(); pieces0.len()];
                let mut ok = true;
                for &o in operands {
                    let found = cats(g, o)
                        .into_iter()
                        .find(|(oe, ps)| *oe == e && sizes(g, ps, e).as_deref() == Some(&szs[..]));
                    match found {
                        Some((_, ps)) => {
                            for (c, p) in columns.iter_mut().zip(ps) {
                                c.push(p);
                            }
                        }
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    let parts: Vec<Id> = columns.into_iter().map(|c| cat(g, d, c)).collect();
                    out.push(cat(g, e, parts));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "sum-of-replicas",
        doc: "sum(x, x, .., x) of n equal terms = n * x (a replicated value all-reduced: each rank's share counted once per rank); a sum in which each distinct term appears k times = k * the sum of the distinct terms (a value summed over a mesh dim it is replicated on)",
        roots: vec![SUM.into()],
        examples: vec![
            ("(sum %r0:a %r0:a %r0:a)", &[("a", "f64[2,3]")]),
            ("(sum %r0:a %r0:a %r1:a %r1:a)", &[("a", "f64[2,3]")]),
            ("(sum %r0:a %r1:a %r2:a %r1:a %r0:a %r2:a)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let first = g.find(kids[0]);
            if kids.iter().all(|&k| g.find(k) == first) {
                return vec![scale(g, kids.len() as i64, 1, first)];
            }
            // Distinct terms in order of first appearance, with their counts.
            let mut distinct: Vec<(Id, usize)> = Vec::new();
            for &k in kids {
                let k = g.find(k);
                match distinct.iter_mut().find(|(d, _)| *d == k) {
                    Some((_, n)) => *n += 1,
                    None => distinct.push((k, 1)),
                }
            }
            let copies = distinct[0].1;
            if copies < 2 || distinct.iter().any(|&(_, n)| n != copies) {
                return vec![];
            }
            let terms: Vec<Id> = distinct.into_iter().map(|(d, _)| d).collect();
            let inner = op(g, SUM, terms);
            vec![scale(g, copies as i64, 1, inner)]
        }),
    });
    l.push(Lemma {
        name: "sum-of-sums",
        doc: "sum(sum(x_1..x_n), sum(y_1..y_m), ...) = sum(x_1..x_n, y_1..y_m, ...): rank sums nested by mesh dim are one sum",
        roots: vec![SUM.into()],
        examples: vec![("(sum (sum %r0:a %r1:a) (sum %r2:a %r3:a))", &[("a", "f64[2,3]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut flat = Vec::new();
            for &k in kids {
                let Some(inner) = sums(g, k).into_iter().next() else { return vec![] };
                flat.extend(inner);
            }
            if flat.len() > 16 {
                return vec![];
            }
            vec![op(g, SUM, flat)]
        }),
    });
    l.push(Lemma {
        name: "add-into-sum",
        doc: "a + sum(b_1..b_n) = sum(b_1, .., a + b_k, .., b_n) (a running total one rank adds to before the reduction); sum(a_i) + sum(b_j) = sum of the a_i with each b_j added to the term the graph adds it to; sum(.., a + b, ..) = sum(.., a, b, ..); sum(a, b, c) = (a + b) + c where the graph has those additions",
        roots: vec!["aten.add.Tensor".into(), SUM.into()],
        examples: vec![
            ("(aten.add.Tensor %r0:a (sum %r0:b %r1:b) 1)", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
            ("(sum (aten.add.Tensor %r0:a %r0:b 1) %r1:a)", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
            // Running totals: the ranks' own additions sit beside the two sums.
            ("(cat 0 (aten.add.Tensor (sum %r0:a %r1:a %r2:a) (sum %r0:b %r2:b) 1) (aten.add.Tensor %r0:a %r0:b 1) (aten.add.Tensor %r2:a %r2:b 1))", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
            // The addition the rank computed sits beside the sum.
            ("(cat 0 (sum %r0:a %r0:b %r0:c) (aten.add.Tensor (aten.add.Tensor %r0:a %r0:b 1) %r0:c 1))", &[("a", "f64[2,3]"), ("b", "f64[2,3]"), ("c", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(out) = shape(g, eclass) else { return vec![] };
            let full = |g: &Graph, id: Id| shape(g, id).as_deref() == Some(&out[..]);
            let mut res = Vec::new();
            if node_sym(g, eclass, kids, &[sym!("aten.add.Tensor")]).is_some() {
                if !is_one(g, kids[2]) || !full(g, kids[0]) || !full(g, kids[1]) {
                    return vec![];
                }
                // Two rank sums added: each term of one joins a term of the other where the
                // graph has their addition (a rank adding to its own running total: the
                // squared norms of a global gradient norm), looked up, never built; terms
                // without a partner stay terms.
                for xs in sums(g, kids[0]).into_iter().take(2) {
                    for ys in sums(g, kids[1]).into_iter().take(2) {
                        res.extend(pair_sums(g, &xs, &ys, kids[2]));
                    }
                }
                for (a, b, a_first) in [(kids[0], kids[1], true), (kids[1], kids[0], false)] {
                    if !sums(g, a).is_empty() {
                        continue;
                    }
                    for terms in sums(g, b).into_iter().take(1) {
                        for k in 0..terms.len() {
                            if !full(g, terms[k]) {
                                continue;
                            }
                            let mut t = terms.clone();
                            // The operands keep their order: the rank computes it that way.
                            let pair = if a_first { vec![a, terms[k], kids[2]] } else { vec![terms[k], a, kids[2]] };
                            t[k] = op(g, "aten.add.Tensor", pair);
                            res.push(op(g, SUM, t));
                        }
                    }
                }
                return res;
            }
            // A sum of tensors one rank adds up itself (microbatch losses, accumulated
            // gradients) is those additions, in order, when the graph has them: looked up, never
            // built, so sums do not grow additions nobody computes.
            if kids.len() >= 2 && kids.iter().all(|&k| full(g, k)) {
                if let Some(one) = g.lookup(Term::Num(1)) {
                    let add = sym!("aten.add.Tensor");
                    let mut acc = Some(kids[0]);
                    for &k in &kids[1..] {
                        acc = acc.and_then(|a| {
                            g.lookup(Term::Op(add, vec![a, k, one]))
                                .or_else(|| g.lookup(Term::Op(add, vec![k, a, one])))
                        });
                    }
                    res.extend(acc);
                }
            }
            // Inside a sum, an addition is more terms of the sum.
            if kids.len() >= 16 {
                return res;
            }
            let adds: Vec<Option<(Id, Id)>> = kids
                .iter()
                .map(|&k| {
                    g[k].nodes.iter().find_map(|n| match n {
                        Term::Op(s, c) if is_op!(s, "aten.add.Tensor") && is_one(g, c[2]) => {
                            Some((c[0], c[1])).filter(|&(a, b)| full(g, a) && full(g, b))
                        }
                        _ => None,
                    })
                })
                .collect();
            // The additions at `only` (all of them for `None`) split into their terms.
            let split = |g: &mut Graph, only: Option<usize>| {
                let mut t = Vec::with_capacity(kids.len() + 1);
                for (i, &k) in kids.iter().enumerate() {
                    match adds[i] {
                        Some((a, b)) if only.is_none_or(|j| j == i) => t.extend([a, b]),
                        _ => t.push(k),
                    }
                }
                op(g, SUM, t)
            };
            let positions: Vec<usize> = (0..kids.len()).filter(|&i| adds[i].is_some()).collect();
            if positions.len() <= MAX_SEPARATE_ADDS {
                for &i in &positions {
                    res.push(split(g, Some(i)));
                }
            } else {
                // One addition at a time, a sum of many additions would grow every subset of
                // them split (2^n sums, gpt2's attention backward under cp): all at once.
                res.push(split(g, None));
            }
            res
        }),
    });
    l.push(Lemma {
        name: "cat-of-sums",
        doc: "cat_d(sum_i x_i, sum_i y_i, ...) = sum_i cat_d(x_i, y_i, ...) (rank sums of the same length, paired in order)",
        roots: vec![CAT.into()],
        examples: vec![("(cat 1 (sum %r0:a %r1:a) (sum %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[2,2]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(d) = int(g, kids[0]).and_then(|d| usize::try_from(d).ok()) else { return vec![] };
            let Some(first) = sums(g, kids[1]).into_iter().next() else { return vec![] };
            let n = first.len();
            let mut operands = vec![first];
            for &k in &kids[2..] {
                match sums(g, k).into_iter().find(|s| s.len() == n) {
                    Some(s) => operands.push(s),
                    None => return vec![],
                }
            }
            let terms: Vec<Id> = (0..n)
                .map(|i| {
                    let pieces = operands.iter().map(|s| s[i]).collect();
                    cat(g, d, pieces)
                })
                .collect();
            vec![op(g, SUM, terms)]
        }),
    });
    l.push(Lemma {
        name: "cat-flatten",
        doc: "cat_d(.., cat_d(x_i), ..) = cat_d(.., x_i, ..): nested concatenations along one dim are one; backwards only where the inner concatenation is in the e-graph already (finer pieces regroup into the ones the ranks hold)",
        roots: vec![CAT.into()],
        examples: vec![
            ("(cat 1 (cat 1 %r0:a %r1:a) %r0:b)", &[("a", "f64[2,3]"), ("b", "f64[2,2]")]),
            ("(cat 0 (cat 0 %r0:a %r1:a) %r0:a %r1:a %r2:a)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(d) = int(g, kids[0]) else { return vec![] };
            let d = d as usize;
            // Backwards: runs of pieces whose concatenation is present (looked up, not built).
            let regrouped = moe::present_runs(g, d, &kids[1..]);
            let mut flat = Vec::new();
            let mut changed = false;
            for &o in &kids[1..] {
                match cats(g, o).into_iter().find(|(od, _)| *od == d) {
                    Some((_, ps)) => {
                        flat.extend(ps);
                        changed = true;
                    }
                    None => flat.push(o),
                }
            }
            let mut out: Vec<Id> = regrouped.into_iter().collect();
            if changed && flat.len() <= 16 {
                out.push(cat(g, d, flat));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "expand-as-cat",
        doc: "expanding one size-1 dim e to n (no other dim expanded) is the cat along e of n copies (n <= 8), or past 8 the cat of n/m copies of a shorter expand to m of the same source already in the graph (many experts per rank: a routing mask over 16 or 32 experts)",
        roots: vec!["aten.expand.default".into()],
        examples: vec![
            ("(aten.expand.default %r0:a (list 2 3 4) b:false)", &[("a", "f64[2,1,4]")]),
            (
                "(cat 1 (aten.expand.default %r0:a (list 2 16 4) b:false) (aten.expand.default %r0:a (list 2 32 4) b:false))",
                &[("a", "f64[2,1,4]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(target), Some(src)) = (shape(g, eclass), shape(g, kids[0])) else { return vec![] };
            if src.len() != target.len() {
                return vec![];
            }
            let diff: Vec<usize> = (0..src.len()).filter(|&i| src[i] != target[i]).collect();
            let [e] = diff.as_slice() else { return vec![] };
            let e = *e;
            let n = target[e];
            if src[e] != 1 || n < 2 {
                return vec![];
            }
            if n <= 8 {
                return vec![cat(g, e, vec![kids[0]; n])];
            }
            // Past 8 copies a flat cat would explode; a shorter expand of the same source that
            // the graph already holds (looked up, never built) splits it into at most 8 blocks.
            let here = g.find(eclass);
            let shorter: Vec<(Id, usize)> = g[kids[0]]
                .parents()
                .filter(|&p| g.find(p) != here)
                .filter_map(|p| {
                    let s = shape(g, p)?;
                    let m = *s.get(e)?;
                    let expands_source = g[p].nodes.iter().any(|t| {
                        matches!(t, Term::Op(sym, c) if is_op!(sym, "aten.expand.default") && g.find(c[0]) == g.find(kids[0]))
                    });
                    let same_elsewhere = s.len() == target.len() && (0..s.len()).all(|i| i == e || s[i] == target[i]);
                    (expands_source && same_elsewhere && m >= 2 && m < n && n % m == 0 && n / m <= 8).then_some((p, m))
                })
                .collect();
            let mut best: Option<(Id, usize)> = None;
            for (p, m) in shorter {
                if best.is_none_or(|(_, bm)| m > bm) {
                    best = Some((p, m));
                }
            }
            match best {
                Some((p, m)) => vec![cat(g, e, vec![p; n / m])],
                None => vec![],
            }
        }),
    });
    l.push(Lemma {
        name: "scale-and-cat",
        doc: "scale(c, cat_d(x_i)) = cat_d(scale(c, x_i)); cat_d(scale(c_i, x_i)) = scale(c_1, cat_d(scale(c_i / c_1, x_i)))",
        roots: vec![SCALE.into(), CAT.into()],
        examples: vec![
            ("(scale 1 2 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(cat 1 (scale 1 2 %r0:a) (scale -1 2 %r1:a))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let mut out = Vec::new();
            if kids.len() == 3 && node_sym(g, eclass, kids, &[sym!(SCALE)]).is_some() {
                for (d, pieces) in cats(g, kids[2]) {
                    let parts: Vec<Id> = pieces.iter().map(|&p| op(g, SCALE, vec![kids[0], kids[1], p])).collect();
                    out.push(cat(g, d, parts));
                }
                return out;
            }
            let Some(d) = int(g, kids[0]) else { return vec![] };
            let factors: Option<Vec<(i64, i64, Id)>> = kids[1..].iter().map(|&k| scales(g, k).into_iter().next()).collect();
            let Some(factors) = factors else { return vec![] };
            let (p1, q1, _) = factors[0];
            if p1 == 0 {
                return vec![];
            }
            // (p/q) / (p1/q1), reduced; a ratio that does not fit back in i64 leaves the cat
            // alone.
            let ratios: Option<Vec<(i64, i64, Id)>> = factors
                .iter()
                .map(|&(p, q, x)| {
                    let (n, m) = product_reduced((p, q), (q1, p1))?;
                    Some((n, m, x))
                })
                .collect();
            let Some(ratios) = ratios else { return vec![] };
            let parts: Vec<Id> = ratios
                .into_iter()
                .map(|(n, m, x)| {
                    if n == m {
                        x
                    } else {
                        let (a, b) = (num(g, n), num(g, m));
                        op(g, SCALE, vec![a, b, x])
                    }
                })
                .collect();
            let inner = cat(g, d as usize, parts);
            let (a, b) = (num(g, p1), num(g, q1));
            vec![op(g, SCALE, vec![a, b, inner])]
        }),
    });
    l.push(Lemma {
        name: "expand-over-cat",
        doc: "expand(cat_d(x_i), s) = cat_d(expand(x_i, s_i)) when dim d is not broadcast (s_i is s with the piece's size at d)",
        roots: vec!["aten.expand.default".into()],
        examples: vec![("(aten.expand.default (cat 0 %r0:a %r1:a) (list 2 3 4) b:false)", &[("a", "f64[1,1,4]")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            let Some(src) = shape(g, kids[0]) else { return vec![] };
            if src.len() > target.len() {
                return vec![];
            }
            let lead = target.len() - src.len();
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                if src[d] != target[lead + d] {
                    continue; // broadcast along the split dim
                }
                let Some(szs) = sizes(g, &pieces, d) else { continue };
                let parts: Vec<Id> = pieces
                    .iter()
                    .zip(&szs)
                    .map(|(&p, &n)| {
                        let mut t = target.clone();
                        t[lead + d] = n;
                        let l = list(g, &t);
                        op(g, "aten.expand.default", vec![p, l, kids[2]])
                    })
                    .collect();
                out.push(cat(g, lead + d, parts));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "slice-of-cat",
        doc: "a slice of cat_d(x_i) along d is the pieces it covers (sliced at the ends); along another dim it is the cat of the sliced pieces; slice(slice(x)) is one slice",
        roots: vec![SLICE.into()],
        examples: vec![
            ("(slice 0 2 4 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(slice 0 1 3 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(slice 1 1 3 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(slice 0 1 3 (slice 0 1 4 %r0:a))", &[("a", "f64[5,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(d), Some(a), Some(b)) = (int(g, kids[0]), int(g, kids[1]), int(g, kids[2])) else { return vec![] };
            let (d, a, b) = (d as usize, a as usize, b as usize);
            let mut out = Vec::new();
            for (cd, pieces) in cats(g, kids[3]) {
                let Some(szs) = sizes(g, &pieces, cd) else { continue };
                if cd == d {
                    let mut parts = Vec::new();
                    let mut off = 0;
                    for (&p, &n) in pieces.iter().zip(&szs) {
                        let (lo, hi) = (a.max(off), b.min(off + n));
                        if lo < hi {
                            parts.push(slice(g, d, lo - off, hi - off, p));
                        }
                        off += n;
                    }
                    if !parts.is_empty() {
                        out.push(cat(g, d, parts));
                    }
                } else {
                    let parts = pieces.iter().map(|&p| slice(g, d, a, b, p)).collect();
                    out.push(cat(g, cd, parts));
                }
            }
            for n in g[kids[3]].nodes.clone() {
                if let Term::Op(s, k) = n {
                    if is_op!(s, SLICE) && int(g, k[0]) == Some(d as i64) {
                        if let Some(a2) = int(g, k[1]) {
                            out.push(slice(g, d, a + a2 as usize, b + a2 as usize, k[3]));
                        }
                    }
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "cat-of-adjacent-slices",
        doc: "x = cat_d(x[a_0:a_1], x[a_1:a_2], ...) when slices of x that tile dim d are already in the e-graph",
        roots: vec![SLICE.into()],
        examples: vec![("(cat 0 (slice 0 0 2 %r0:a) (slice 0 2 5 %r0:a))", &[("a", "f64[5,3]")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(d), Some(x)) = (int(g, kids[0]), Some(kids[3])) else { return vec![] };
            let Some(n) = shape(g, x).and_then(|s| s.get(d as usize).copied()) else { return vec![] };
            // Every slice of x along d present in the e-graph, by start. Only the classes of x's
            // parents can hold one: egg lists every node ever added over a class among its
            // parents (kept through unions), so this finds what a scan of every class finds,
            // and the sort below makes the order they are found in irrelevant. The scan of
            // every class, on every slice match, was a tenth of 16-rank DeepSeek's CPU.
            let mut holders: Vec<Id> = g[x].parents().map(|p| g.find(p)).collect();
            holders.sort_unstable();
            holders.dedup();
            let mut by_start: Vec<(i64, i64, Id)> = Vec::new();
            for &id in &holders {
                for node in &g[id].nodes {
                    if let Term::Op(s, k) = node {
                        if is_op!(s, SLICE) && g.find(k[3]) == g.find(x) && int(g, k[0]) == Some(d) {
                            if let (Some(a), Some(b)) = (int(g, k[1]), int(g, k[2])) {
                                by_start.push((a, b, id));
                            }
                        }
                    }
                }
            }
            by_start.sort();
            by_start.dedup_by_key(|t| t.0);
            let mut parts = Vec::new();
            let mut at = 0;
            for &(a, b, id) in &by_start {
                if a == at {
                    parts.push(id);
                    at = b;
                }
            }
            if at as usize != n || parts.len() < 2 {
                return vec![];
            }
            let whole = cat(g, d as usize, parts);
            if g.union(whole, x) {
                vec![eclass]
            } else {
                vec![]
            }
        }),
    });

    l.push(Lemma {
        name: "cat-pieces-equal",
        doc: "cat_d(a_i) = cat_d(b_i) with equal piece sizes implies a_i = b_i",
        roots: vec![CAT.into()],
        examples: vec![(
            "(= (cat 0 %r0:a %r0:b) (cat 0 (slice 0 0 2 (cat 0 %r0:a %r0:b)) (slice 0 2 5 (cat 0 %r0:a %r0:b))))",
            &[("a", "f64[2,3]"), ("b", "f64[3,3]")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, _| {
            let cs = cats(g, eclass);
            let mut changed = false;
            for (i, (d, ps)) in cs.iter().enumerate() {
                for (d2, qs) in &cs[i + 1..] {
                    if d == d2 && ps.len() == qs.len() && sizes(g, ps, *d) == sizes(g, qs, *d) {
                        for (&p, &q) in ps.iter().zip(qs) {
                            changed |= g.union(p, q);
                        }
                    }
                }
            }
            if changed {
                vec![eclass]
            } else {
                vec![]
            }
        }),
    });

    l
}

/// One step of a layout chain, from the base tensor outward.
#[derive(Clone, Debug)]
pub(super) enum LayoutStep {
    /// A view to this shape.
    View(Vec<usize>),
    /// A permutation of dims (`out[i] = in[p[i]]`).
    Permute(Vec<usize>),
}

/// The chains of views, transposes and permutes that end at `id`: (base, steps from the base
/// outward), one per class along the way (2 steps at least). One node per class is followed,
/// up to 5 steps.
fn layout_chains(g: &Graph, id: Id) -> Vec<(Id, Vec<LayoutStep>)> {
    let mut classes = vec![id];
    let mut top_down: Vec<LayoutStep> = Vec::new();
    for _ in 0..5 {
        let at = *classes.last().expect("non-empty");
        let Some(out_shape) = shape(g, at) else { break };
        let next = g[at].nodes.iter().find_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.view.default") => {
                Some((k[0], LayoutStep::View(out_shape.clone())))
            }
            Term::Op(s, k) if is_op!(s, "aten.transpose.int") => {
                let (a, b) = (int(g, k[1])? as usize, int(g, k[2])? as usize);
                let mut p: Vec<usize> = (0..out_shape.len()).collect();
                p.swap(a, b);
                Some((k[0], LayoutStep::Permute(p)))
            }
            Term::Op(s, k) if is_op!(s, "aten.permute.default") => {
                let p = int_list(g, k[1])?.into_iter().map(|d| d as usize).collect();
                Some((k[0], LayoutStep::Permute(p)))
            }
            _ => None,
        });
        let Some((inner, step)) = next else { break };
        if classes.contains(&g.find(inner)) {
            break;
        }
        top_down.push(step);
        classes.push(g.find(inner));
    }
    (2..classes.len())
        .map(|k| {
            let mut steps = top_down[..k].to_vec();
            steps.reverse();
            (classes[k], steps)
        })
        .collect()
}

/// When viewing `base` through `steps` gives `target` as a pure reordering of `base`'s elements:
/// the shape `split` that `base` is viewed to and the permutation `perm` such that
/// `view(permute(view(base, split), perm), target)` is the chain.
pub(super) fn strided_permutation(
    base: &[usize],
    steps: &[LayoutStep],
    target: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    // Dims as (size, stride) over base's contiguous storage.
    let mut dims: Vec<(usize, usize)> = Vec::new();
    let mut stride = 1;
    for &n in base.iter().rev() {
        dims.push((n, stride));
        stride *= n;
    }
    dims.reverse();
    for step in steps {
        match step {
            LayoutStep::Permute(p) => {
                if p.len() != dims.len() {
                    return None;
                }
                dims = p
                    .iter()
                    .map(|&i| dims.get(i).copied())
                    .collect::<Option<_>>()?;
            }
            LayoutStep::View(shape) => dims = view_strides(&dims, shape)?,
        }
    }
    if dims.iter().map(|d| d.0).collect::<Vec<_>>() != target {
        return None;
    }
    // Non-unit dims ordered by decreasing stride must tile the storage densely.
    let mut order: Vec<usize> = (0..dims.len()).filter(|&i| dims[i].0 != 1).collect();
    order.sort_by(|&a, &b| dims[b].1.cmp(&dims[a].1));
    let mut expect = 1;
    for &i in order.iter().rev() {
        if dims[i].1 != expect {
            return None;
        }
        expect *= dims[i].0;
    }
    let split: Vec<usize> = order.iter().map(|&i| dims[i].0).collect();
    // perm: the result's non-unit dims in target order, as positions in `split`.
    let perm: Vec<usize> = (0..dims.len())
        .filter(|&i| dims[i].0 != 1)
        .map(|i| order.iter().position(|&o| o == i).expect("listed"))
        .collect();
    let split = if split.is_empty() { vec![1] } else { split };
    let perm = if perm.is_empty() { vec![0] } else { perm };
    Some((split, perm))
}

/// A split and permutation of [`strided_permutation`] whose result differs from `target` only
/// by unit dims, with those unit dims leading the split and `perm` putting every dim where
/// `target` has it (no view after the permutation): the form a rank holding one sequence
/// builds (`permute(view(x, [1, 4, 2, 4]), [0, 1, 3, 2])`, the ring's key gradient under dp x
/// cp). `None` when the result differs otherwise or `target` has no unit dim.
pub(super) fn units_in_split(
    split: &[usize],
    perm: &[usize],
    target: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    let units: Vec<usize> = (0..target.len()).filter(|&i| target[i] == 1).collect();
    let now: Vec<usize> = perm.iter().map(|&p| split[p]).collect();
    let rest: Vec<usize> = target.iter().copied().filter(|&n| n != 1).collect();
    if units.is_empty() || now != rest || split.contains(&1) {
        return None;
    }
    let mut with_units = vec![1; units.len()];
    with_units.extend_from_slice(split);
    let mut kept = perm.iter();
    let full = (0..target.len())
        .map(|i| match units.iter().position(|&u| u == i) {
            Some(u) => Some(u),
            None => kept.next().map(|&p| units.len() + p),
        })
        .collect::<Option<Vec<usize>>>()?;
    Some((with_units, full))
}

/// The strides of viewing strided dims as `shape`, by torch's rule (`computeStride`): each
/// group of target dims must cover source dims that are contiguous among themselves.
fn view_strides(dims: &[(usize, usize)], shape: &[usize]) -> Option<Vec<(usize, usize)>> {
    let total: usize = dims.iter().map(|d| d.0).product();
    if shape.iter().product::<usize>() != total || dims.is_empty() {
        return (total == 1 || dims.is_empty() && shape.iter().product::<usize>() == 1)
            .then(|| shape.iter().map(|&n| (n, 1)).collect());
    }
    let mut out = vec![(0usize, 0usize); shape.len()];
    let mut view_d = shape.len() as isize - 1;
    let mut chunk_base = dims[dims.len() - 1].1;
    let (mut tensor_n, mut view_n) = (1usize, 1usize);
    for td in (0..dims.len()).rev() {
        tensor_n *= dims[td].0;
        if td == 0 || (dims[td - 1].0 != 1 && dims[td - 1].1 != tensor_n * chunk_base) {
            while view_d >= 0 && (view_n < tensor_n || shape[view_d as usize] == 1) {
                let vd = view_d as usize;
                out[vd] = (shape[vd], view_n * chunk_base);
                view_n *= shape[vd];
                view_d -= 1;
            }
            if view_n != tensor_n {
                return None;
            }
            if td > 0 {
                chunk_base = dims[td - 1].1;
                tensor_n = 1;
                view_n = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// The pieces of `view(cat_d(pieces), target)` when each piece is a block of whole rows of one
/// target dim.
/// `view(cat_d(pieces), target)` when the pieces tile target dim `td + 1` inside each row of
/// target dim `td` (a flattened batch x heads dim split back, with pieces of a few heads): a cat
/// along `td` of cats along `td + 1`.
fn nested_view_of_cat(
    g: &mut Graph,
    target: &[usize],
    td: usize,
    rest: usize,
    szs: &[usize],
    pieces: &[Id],
) -> Option<Id> {
    if td + 1 >= target.len() {
        return None;
    }
    let inner: usize = target[td + 2..].iter().product();
    let row = target[td + 1] * inner;
    let mut rows = Vec::new();
    let mut current = Vec::new();
    let mut filled = 0;
    for (&p, &m) in pieces.iter().zip(szs) {
        let n = m * rest;
        if !n.is_multiple_of(inner) || filled + n > row {
            return None;
        }
        let mut s: Vec<i64> = target.iter().map(|&x| x as i64).collect();
        s[td] = 1;
        s[td + 1] = (n / inner) as i64;
        let l = int_list_node(g, &s);
        current.push(op(g, "aten.view.default", vec![p, l]));
        filled += n;
        if filled == row {
            rows.push(cat(g, td + 1, std::mem::take(&mut current)));
            filled = 0;
        }
    }
    if filled != 0 || rows.len() != target[td] {
        return None;
    }
    Some(cat(g, td, rows))
}

/// Where a view of `src` to `target` puts `src`'s dim `d`: the target dim `td` it starts (the
/// dims before it flatten alike: their products agree), with the element counts after `d` in
/// `src` and after `td` in `target`. `None` where no target dim starts there. Shared with the
/// fast path, which must relate a view of a concatenation exactly as this lemma does.
pub(crate) fn cat_dim_in_view(
    src: &[usize],
    target: &[usize],
    d: usize,
) -> Option<(usize, usize, usize)> {
    let before: usize = src[..d].iter().product();
    let (mut acc, mut td) = (1usize, 0usize);
    while td < target.len() && acc < before {
        acc *= target[td];
        td += 1;
    }
    if acc != before || td >= target.len() {
        return None;
    }
    let rest: usize = src[d + 1..].iter().product();
    let trest: usize = target[td + 1..].iter().product();
    Some((td, rest, trest))
}

fn view_of_cat(
    g: &mut Graph,
    src: &[usize],
    target: &[usize],
    d: usize,
    pieces: &[Id],
) -> Option<Id> {
    let (td, rest, trest) = cat_dim_in_view(src, target, d)?;
    let szs = sizes(g, pieces, d)?;
    if szs.iter().any(|&m| !(m * rest).is_multiple_of(trest)) {
        return nested_view_of_cat(g, target, td, rest, &szs, pieces);
    }
    let mut parts = Vec::new();
    for (&p, &m) in pieces.iter().zip(&szs) {
        if !(m * rest).is_multiple_of(trest) {
            return None;
        }
        let mut s: Vec<i64> = target.iter().map(|&x| x as i64).collect();
        s[td] = (m * rest / trest) as i64;
        let l = int_list_node(g, &s);
        parts.push(op(g, "aten.view.default", vec![p, l]));
    }
    Some(cat(g, td, parts))
}
