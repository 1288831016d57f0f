//! Matrix products of partitioned operands: a product over concatenations is a concatenation
//! of products, or (operands split along the contracted dim) a sum of them.

use super::{cat, cats, op, regroup, shape, sizes, Graph, Lemma};
use crate::term::{Term, SUM};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        Lemma {
            name: "mm-over-cat",
            doc: "cat_0(a_i) @ b = cat_0(a_i @ b); a @ cat_1(b_i) = cat_1(a @ b_i); cat_1(a_i) @ cat_0(b_i) = sum_i a_i @ b_i",
            roots: vec!["aten.mm.default".into()],
            examples: vec![
                ("(aten.mm.default (cat 0 %r0:a %r1:a) %r0:b)", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
                ("(aten.mm.default %r0:a (cat 1 %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
                ("(aten.mm.default (cat 1 %r0:a %r1:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
            ],
            requires: None,
            build: Arc::new(|g, _, kids| matmul_over_cat(g, "aten.mm.default", kids, 0)),
        },
        Lemma {
            name: "bmm-over-cat",
            doc: "batched products: batch-dim pieces pair up; row pieces of a, column pieces of b, and contracted pieces sum",
            roots: vec!["aten.bmm.default".into()],
            examples: vec![
                ("(aten.bmm.default (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[2,2,3]"), ("b", "f64[2,3,4]")]),
                ("(aten.bmm.default (cat 2 %r0:a %r1:a) (cat 1 %r0:b %r1:b))", &[("a", "f64[2,2,3]"), ("b", "f64[2,3,4]")]),
                ("(aten.bmm.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[1,2,3]"), ("b", "f64[2,3,4]")]),
            ],
            requires: None,
            build: Arc::new(|g, _, kids| matmul_over_cat(g, "aten.bmm.default", kids, 1)),
        },
    ]
}

pub(super) fn matmul_over_cat(g: &mut Graph, sym: &str, kids: &[Id], batch: usize) -> Vec<Id> {
    let s = Symbol::from(sym);
    let (a, b) = (kids[0], kids[1]);
    let (row, inner_a, inner_b, col) = (batch, batch + 1, batch, batch + 1);
    let mut out = Vec::new();
    let ca = cats(g, a);
    let cb = cats(g, b);
    for (d, pieces) in &ca {
        if *d == row {
            let parts = pieces
                .iter()
                .map(|&p| g.add(Term::Op(s, vec![p, b])))
                .collect();
            out.push(cat(g, row, parts));
        }
        if *d < batch {
            // A batch dim of a: b must be split the same way, or broadcast along it.
            let Some(szs) = sizes(g, pieces, *d) else {
                continue;
            };
            // b's pieces along d, regrouped where one side is split finer than the other
            // (per-expert pieces against per-rank groups of experts).
            let paired = cb.iter().filter(|(bd, _)| bd == d).find_map(|(_, bp)| {
                let bs = sizes(g, bp, *d)?;
                if bs == szs {
                    return Some((pieces.clone(), bp.clone()));
                }
                if let Some(ap) = regroup(g, pieces, *d, &szs, &bs) {
                    return Some((ap, bp.clone()));
                }
                regroup(g, bp, *d, &bs, &szs).map(|bp| (pieces.clone(), bp))
            });
            if let Some((ap, bp)) = paired {
                let parts = ap
                    .iter()
                    .zip(&bp)
                    .map(|(&x, &y)| g.add(Term::Op(s, vec![x, y])))
                    .collect();
                out.push(cat(g, *d, parts));
            } else if shape(g, b).is_some_and(|bs| bs.get(*d) == Some(&1)) {
                let parts = pieces
                    .iter()
                    .map(|&x| g.add(Term::Op(s, vec![x, b])))
                    .collect();
                out.push(cat(g, *d, parts));
            }
        }
        if *d == inner_a {
            let Some(szs) = sizes(g, pieces, *d) else {
                continue;
            };
            if let Some((_, bp)) = cb.iter().find(|(bd, bp)| {
                *bd == inner_b && sizes(g, bp, inner_b).as_deref() == Some(&szs[..])
            }) {
                let parts = pieces
                    .iter()
                    .zip(bp)
                    .map(|(&x, &y)| g.add(Term::Op(s, vec![x, y])))
                    .collect();
                out.push(op(g, SUM, parts));
            }
        }
    }
    for (d, pieces) in &cb {
        if *d == col {
            let parts = pieces
                .iter()
                .map(|&p| g.add(Term::Op(s, vec![a, p])))
                .collect();
            out.push(cat(g, col, parts));
        }
    }
    out
}
