//! Every lemma, instantiated on its examples with random values, must rewrite its left-hand
//! side into terms that the reference kernels evaluate to the same values.

use egg::{AstSize, EGraph, Extractor, Language, RecExpr, Runner};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_ir::DType;
use shardproof_ops::Meta;
use shardproof_refine::eval::{eval, random_tensor};
use shardproof_refine::lemmas::library;
use shardproof_refine::term::{parse_leaf, Shapes, Term};
use std::collections::HashMap;

/// `f64[2,3]` or `i64[4]<10` (integers below 10).
fn parse_shape(s: &str) -> (DType, Vec<usize>, i64) {
    let (body, bound) = s
        .split_once('<')
        .map_or((s, 8), |(b, n)| (b, n.parse().unwrap()));
    let (dt, dims) = body.split_once('[').unwrap();
    let dims = dims.trim_end_matches(']');
    let shape = dims
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.trim().parse().unwrap())
        .collect();
    (DType::from_short_name(dt).unwrap(), shape, bound)
}

#[test]
fn every_lemma_is_sound() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let lemmas = library();
    let mut checked = 0;
    for lemma in &lemmas {
        assert!(
            !lemma.examples.is_empty(),
            "lemma `{}` has no soundness example",
            lemma.name
        );
        for (lhs, shapes) in &lemma.examples {
            let expr: RecExpr<Term> = lhs.parse().unwrap_or_else(|e| panic!("{lhs}: {e}"));
            let mut eg: EGraph<Term, Shapes> = EGraph::new(Shapes::default());
            let mut leaves = HashMap::new();
            for node in expr.as_ref() {
                if let Term::Op(s, k) = node {
                    if let (true, Some((r, name))) = (k.is_empty(), parse_leaf(s.as_str())) {
                        let spec = shapes
                            .iter()
                            .find(|(n, _)| *n == name)
                            .unwrap_or_else(|| panic!("{lhs}: no shape for {name}"))
                            .1;
                        let (dt, shape, bound) = parse_shape(spec);
                        eg.analysis.leaves.insert(*s, Meta::new(dt, shape.clone()));
                        let key = format!("r{r}:{name}");
                        leaves.entry(key).or_insert_with(|| {
                            random_tensor(dt, shape, bound, &mut || rng.random::<f64>())
                        });
                    }
                }
            }
            let premise = matches!(expr.as_ref().last(), Some(Term::Op(s, _)) if s.as_str() == "=");
            if !premise {
                eval(&expr, &leaves).unwrap_or_else(|e| panic!("{}: {lhs}: {e}", lemma.name));
            }
            let root = eg.add_expr(&expr);
            // A premise `(= a b)`: two terms the evaluator proves equal, merged before the lemma
            // runs (lemmas such as cat injectivity act on equalities already in the e-graph).
            if let Some(Term::Op(s, k)) = expr.as_ref().last() {
                if s.as_str() == "=" && k.len() == 2 {
                    let side = |i: usize| {
                        let sub = RecExpr::from(expr.as_ref()[..=usize::from(k[i])].to_vec());
                        eval(&sub, &leaves).unwrap()
                    };
                    let (a, b) = (side(0), side(1));
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.meta == y.meta
                            && x.data
                                .iter()
                                .zip(y.data.iter())
                                .all(|(p, q)| p == q || (p - q).abs() <= 1e-9 * (1.0 + p.abs()))),
                        "{}: the premise of {lhs} does not hold",
                        lemma.name
                    );
                    let kids: Vec<egg::Id> = eg[root].nodes[0].children().to_vec();
                    eg.union(kids[0], kids[1]);
                }
            }
            eg.rebuild();
            let before = (eg.total_size(), eg.number_of_classes());
            let runner = Runner::default()
                .with_egraph(eg)
                .with_iter_limit(3)
                .run(&lemma.rewrites());
            let eg = runner.egraph;
            assert_ne!(
                (eg.total_size(), eg.number_of_classes()),
                before,
                "lemma `{}` did not apply to {lhs}",
                lemma.name
            );
            // Every class: all its nodes evaluate to the same tensors.
            let ex = Extractor::new(&eg, AstSize);
            for class in eg.classes().filter(|c| c.nodes.len() > 1) {
                let mut first: Option<(RecExpr<Term>, Vec<shardproof_ops::Tensor>)> = None;
                for node in &class.nodes {
                    let mut e = RecExpr::default();
                    let mut ids = Vec::new();
                    for &k in node.children() {
                        let sub = ex.find_best(k).1;
                        let mut map = Vec::new();
                        for n in sub.as_ref() {
                            map.push(e.add(n.clone().map_children(|c| map[usize::from(c)])));
                        }
                        ids.push(*map.last().unwrap());
                    }
                    let mut i = 0;
                    e.add(node.clone().map_children(|_| {
                        i += 1;
                        ids[i - 1]
                    }));
                    let got = eval(&e, &leaves)
                        .unwrap_or_else(|err| panic!("{}: {e}: {err}", lemma.name));
                    match &first {
                        None => first = Some((e, got)),
                        Some((e0, want)) => {
                            for (a, b) in got.iter().zip(want) {
                                assert_eq!(
                                    a.meta, b.meta,
                                    "{}: {e0} vs {e}: shapes differ",
                                    lemma.name
                                );
                                for (x, y) in a.data.iter().zip(b.data.iter()) {
                                    // Equal infinities (masked scores) are equal values.
                                    assert!(
                                        x == y || (x - y).abs() <= 1e-9 * (1.0 + y.abs()),
                                        "{}: {e0} != {e}",
                                        lemma.name
                                    );
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    println!(
        "lemmas: {} (every one checked on its examples: 100% coverage); rewritten terms checked: {checked}",
        lemmas.len()
    );
}
