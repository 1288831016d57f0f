//! Reductions (sums, means, maxima over dims) through concatenations and sums over ranks.

use super::{
    cat, cats, int, int_list, is_true, list, node_sym, op, output_per_piece, scale, shape, sizes,
    split_alike, with_kids, Lemma,
};
use crate::term::{is_op, sym, Term, GET, MAX, MIN, SUM};
use egg::Id;
use std::sync::Arc;

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    let mut l = Vec::new();
    // Reductions.
    l.push(Lemma {
        name: "reduce-over-cat",
        doc: "sum over dims of cat_d(x_i): a sum over ranks of the pieces' sums when d is reduced, else the cat of the pieces' sums (dim renumbered); max (min) along d is the max (min) over ranks",
        roots: vec![
            "aten.sum.dim_IntList".into(),
            "aten.sum.default".into(),
            "aten.amax.default".into(),
            "aten.amin.default".into(),
            "aten.max.default".into(),
            "aten.min.default".into(),
            "aten.mean.default".into(),
            "aten.mean.dim".into(),
        ],
        examples: vec![
            ("(aten.sum.dim_IntList (cat 0 %r0:a %r1:a) (list 0) b:false none)", &[("a", "f64[2,3]")]),
            ("(aten.sum.dim_IntList (cat 1 %r0:a %r1:a) (list 0) b:false none)", &[("a", "f64[2,3]")]),
            ("(aten.sum.default (cat 1 %r0:a %r1:a) none)", &[("a", "f64[2,3]")]),
            ("(aten.amax.default (cat 1 %r0:a %r1:a) (list 1) b:true)", &[("a", "f64[2,3]")]),
            ("(aten.amin.default (cat 0 %r0:a %r1:a) (list 0) b:false)", &[("a", "f64[2,3]")]),
            ("(aten.max.default (cat 1 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(aten.min.default (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(aten.mean.default (cat 0 %r0:a %r1:a) none)", &[("a", "f64[2,3]")]),
            ("(aten.mean.dim (cat 1 %r0:a %r1:a) (list 1) b:false none)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = [
                sym!("aten.sum.dim_IntList"),
                sym!("aten.sum.default"),
                sym!("aten.amax.default"),
                sym!("aten.amin.default"),
                sym!("aten.max.default"),
                sym!("aten.min.default"),
                sym!("aten.mean.default"),
                sym!("aten.mean.dim"),
            ];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else {
                return vec![];
            };
            let whole = matches!(
                sym.as_str(),
                "aten.sum.default" | "aten.mean.default" | "aten.max.default" | "aten.min.default"
            );
            let mean = sym.as_str().starts_with("aten.mean");
            let Some(src) = shape(g, kids[0]) else { return vec![] };
            let all: Vec<i64> = (0..src.len() as i64).collect();
            let dims = if whole { all.clone() } else { int_list(g, kids[1]).unwrap_or_default() };
            let dims = if dims.is_empty() { all } else { dims };
            let keep = !whole && is_true(g, kids[2]);
            let combine = match sym.as_str() {
                "aten.amax.default" | "aten.max.default" => MAX,
                "aten.amin.default" | "aten.min.default" => MIN,
                _ => SUM,
            };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let parts: Vec<Id> = pieces.iter().map(|&p| g.add(with_kids(sym, kids, &[(0, p)]))).collect();
                if dims.contains(&(d as i64)) {
                    if mean {
                        // A mean of equal pieces is the average of the pieces' means.
                        let Some(szs) = sizes(g, &pieces, d) else { continue };
                        if szs.iter().any(|&s| s != szs[0]) {
                            continue;
                        }
                        let n = parts.len() as i64;
                        let total = op(g, combine, parts);
                        out.push(scale(g, 1, n, total));
                        continue;
                    }
                    out.push(op(g, combine, parts));
                } else {
                    let nd = if keep { d } else { d - dims.iter().filter(|&&x| x < d as i64).count() };
                    out.push(cat(g, nd, parts));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "reduce-over-unit-dims",
        doc: "a sum or mean over dims of size one only drops them: view(x, out shape)",
        roots: vec!["aten.sum.dim_IntList".into(), "aten.mean.dim".into()],
        examples: vec![
            (
                "(aten.sum.dim_IntList %r0:a (list 1) b:false none)",
                &[("a", "f64[2,1,3]")],
            ),
            (
                "(aten.mean.dim %r0:a (list 2) b:true none)",
                &[("a", "f64[2,3,1]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(src), Some(out)) = (shape(g, kids[0]), shape(g, eclass)) else {
                return vec![];
            };
            let Some(dims) = int_list(g, kids[1]) else {
                return vec![];
            };
            let rank = src.len() as i64;
            let unit = !dims.is_empty()
                && dims.iter().all(|&d| {
                    let d = if d < 0 { d + rank } else { d };
                    usize::try_from(d).ok().and_then(|d| src.get(d)) == Some(&1)
                });
            if !unit || src.iter().product::<usize>() != out.iter().product::<usize>() {
                return vec![];
            }
            let l = list(g, &out);
            vec![op(g, "aten.view.default", vec![kids[0], l])]
        }),
    });
    l.push(Lemma {
        name: "max-dim-over-cat",
        doc: "max.dim(cat_d(x_i), d).values = max over ranks of max.dim(x_i, d).values; along another dim, the cat of the pieces' results",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (aten.max.dim (cat 1 %r0:a %r1:a) 1 b:false))", &[("a", "f64[2,3]")]),
            ("(get 1 (aten.max.dim (cat 0 %r0:a %r1:a) 1 b:false))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(k) = int(g, kids[0]) else { return vec![] };
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.max.dim") && !is_op!(s, "aten.min.dim") {
                    continue;
                }
                let (Some(dim), keep) = (int(g, ck[1]), is_true(g, ck[2])) else { continue };
                for (d, pieces) in cats(g, ck[0]) {
                    let parts = output_per_piece(g, s, &ck, kids[0], &pieces);
                    if d as i64 == dim {
                        if k == 0 {
                            out.push(op(g, if is_op!(s, "aten.max.dim") { MAX } else { MIN }, parts));
                        }
                    } else {
                        let nd = if keep || (d as i64) < dim { d } else { d - 1 };
                        out.push(cat(g, nd, parts));
                    }
                }
            }
            out
        }),
    });

    l.push(Lemma {
        name: "topk-over-cat",
        doc: "topk / sort along dim k of cat_d(x_i), d != k: values and indices are the cat of the pieces' (a router's top-k over the experts of each token)",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (aten.topk.default (cat 0 %r0:a %r1:a) 2 1 b:true b:true))", &[("a", "f64[2,4]")]),
            ("(get 1 (aten.topk.default (cat 0 %r0:a %r1:a) 2 -1 b:true b:true))", &[("a", "f64[2,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                let dim_at = match s.as_str() {
                    "aten.topk.default" => 2,
                    "aten.sort.default" | "aten.sort.stable" => 1,
                    _ => continue,
                };
                let Some(rank) = shape(g, ck[0]).map(|x| x.len() as i64) else { continue };
                let Some(k) = ck.get(dim_at).and_then(|&d| int(g, d)) else { continue };
                let k = if k < 0 { k + rank } else { k };
                for (d, pieces) in cats(g, ck[0]) {
                    if d as i64 == k {
                        continue;
                    }
                    let parts = output_per_piece(g, s, &ck, kids[0], &pieces);
                    out.push(cat(g, d, parts));
                }
            }
            out
        }),
    });

    l.push(Lemma {
        name: "scatter-over-cat",
        doc: "scatter along dim k into cat_d(s_i) with indices (and source) split alike along d != k is the cat of the pieces' scatters; a constant fill splits into smaller fills",
        roots: vec!["aten.scatter.src".into(), "aten.scatter.value".into()],
        examples: vec![
            ("(aten.scatter.src (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 (cat 0 %r0:i %r1:i) (cat 0 %r0:x %r1:x))", &[("i", "i64[2,2]<3"), ("x", "f64[2,2]")]),
            ("(aten.scatter.value (cat 0 %r0:s %r1:s) 1 (cat 0 %r0:i %r1:i) f:1.0)", &[("s", "f64[2,3]"), ("i", "i64[2,2]<3")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = [sym!("aten.scatter.src"), sym!("aten.scatter.value")];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else { return vec![] };
            let Some(rank) = shape(g, kids[0]).map(|x| x.len() as i64) else { return vec![] };
            let Some(k) = int(g, kids[1]) else { return vec![] };
            let k = if k < 0 { k + rank } else { k };
            let src_is_tensor = is_op!(sym, "aten.scatter.src");
            let mut out = Vec::new();
            for (d, index) in cats(g, kids[2]) {
                if d as i64 == k {
                    continue;
                }
                let Some(szs) = sizes(g, &index, d) else { continue };
                let Some(selves) = split_alike(g, kids[0], d, &szs) else { continue };
                let srcs = if src_is_tensor {
                    match split_alike(g, kids[3], d, &szs) {
                        Some(p) => p,
                        None => continue,
                    }
                } else {
                    vec![kids[3]; szs.len()]
                };
                let parts = (0..szs.len())
                    .map(|i| g.add(with_kids(sym, kids, &[(0, selves[i]), (2, index[i]), (3, srcs[i])])))
                    .collect();
                out.push(cat(g, d, parts));
            }
            out
        }),
    });

    l
}
