//! Every lemma, instantiated on its examples with random values, must rewrite its left-hand
//! side into terms that the reference kernels evaluate to the same values.

use egg::{EGraph, Language, RecExpr, Runner};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_ir::DType;
use shardproof_ops::Meta;
use shardproof_refine::eval::{classes_agree, eval, random_tensor, tensors_agree};
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
            // A leaf given as `=TERM` is the tensor a rank computes by that term over the other
            // leaves: its class holds the term too (lemmas that only look up implementation
            // tensors need one).
            let mut defined: Vec<(egg::Symbol, String, RecExpr<Term>)> = Vec::new();
            for node in expr.as_ref() {
                if let Term::Op(s, k) = node {
                    if let (true, Some((r, name))) = (k.is_empty(), parse_leaf(s.as_str())) {
                        let spec = shapes
                            .iter()
                            .find(|(n, _)| *n == name)
                            .unwrap_or_else(|| panic!("{lhs}: no shape for {name}"))
                            .1;
                        if let Some(term) = spec.strip_prefix('=') {
                            let def: RecExpr<Term> =
                                term.parse().unwrap_or_else(|e| panic!("{term}: {e}"));
                            defined.push((*s, format!("r{r}:{name}"), def));
                            continue;
                        }
                        let (dt, shape, bound) = parse_shape(spec);
                        eg.analysis.leaves.insert(*s, Meta::new(dt, shape.clone()));
                        let key = format!("r{r}:{name}");
                        leaves.entry(key).or_insert_with(|| {
                            random_tensor(dt, shape, bound, &mut || rng.random::<f64>())
                        });
                    }
                }
            }
            for (sym, key, def) in &defined {
                let value = eval(def, &leaves)
                    .unwrap_or_else(|e| panic!("{}: {lhs}: {e}", lemma.name))
                    .swap_remove(0);
                eg.analysis.leaves.insert(*sym, value.meta.clone());
                leaves.insert(key.clone(), value);
            }
            let premise = matches!(expr.as_ref().last(), Some(Term::Op(s, _)) if s.as_str() == "=");
            if !premise {
                eval(&expr, &leaves).unwrap_or_else(|e| panic!("{}: {lhs}: {e}", lemma.name));
            }
            let root = eg.add_expr(&expr);
            for (sym, _, def) in &defined {
                let leaf = eg.add(Term::Op(*sym, vec![]));
                let term = eg.add_expr(def);
                eg.union(leaf, term);
            }
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
                        tensors_agree(&a, &b),
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
            checked +=
                classes_agree(&eg, &leaves).unwrap_or_else(|e| panic!("{}: {e}", lemma.name));
        }
    }
    println!(
        "lemmas: {} (every one checked on its examples: 100% coverage); rewritten terms checked: {checked}",
        lemmas.len()
    );
}

/// A product the ring-attention lemmas look up is also the multiple of the rank tensor that
/// scales it: with `t = (1/2) bmm(2 t, ones)` in the e-graph (t a rank tensor, `ones` a
/// `[.., 1, 1]` fill, so the premise holds), the row slice of `bmm(2 t, ones)` is also a slice
/// of `2 t`, and every class still evaluates to one value.
#[test]
fn a_looked_up_product_is_a_multiple_of_the_rank_tensor_scaling_it() {
    let ones = "(aten.full.default (list 2 1 1) f:1.0 dt:f64 none dev b:false)";
    let product = format!("(aten.bmm.default (scale 2 1 %r0:t) {ones})");
    let premise: RecExpr<Term> = format!("(= %r0:t (scale 1 2 {product}))").parse().unwrap();
    let rows: RecExpr<Term> = format!("(aten.bmm.default (slice 1 0 1 (scale 2 1 %r0:t)) {ones})")
        .parse()
        .unwrap();
    let leaf = egg::Symbol::from("%r0:t");
    let mut eg: EGraph<Term, Shapes> = EGraph::new(Shapes::default());
    eg.analysis
        .leaves
        .insert(leaf, Meta::new(DType::F64, vec![2, 3, 1]));
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let leaves = HashMap::from([(
        "r0:t".to_string(),
        random_tensor(DType::F64, vec![2, 3, 1], 8, &mut || rng.random::<f64>()),
    )]);
    let root = eg.add_expr(&premise);
    let sides: Vec<egg::Id> = eg[root].nodes[0].children().to_vec();
    eg.union(sides[0], sides[1]);
    let slice_rows = eg.add_expr(&rows);
    eg.rebuild();
    let lemma = library()
        .into_iter()
        .find(|l| l.name == "product-of-row-slice")
        .unwrap();
    let runner = Runner::default()
        .with_egraph(eg)
        .with_iter_limit(2)
        .run(&lemma.rewrites());
    let eg = runner.egraph;
    let t = eg.lookup(Term::Op(leaf, vec![])).unwrap();
    let of_rank_tensor = eg[slice_rows].nodes.iter().any(|n| {
        matches!(n, Term::Op(s, k) if s.as_str() == "slice"
            && eg[k[3]].nodes.iter().any(|m| matches!(m, Term::Op(s2, k2) if s2.as_str() == "scale" && eg.find(k2[2]) == t)))
    });
    assert!(
        of_rank_tensor,
        "the row slice did not reach a multiple of the rank tensor"
    );
    classes_agree(&eg, &leaves).unwrap();
}
