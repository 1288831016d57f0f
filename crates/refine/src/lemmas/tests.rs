//! The lemma library's unit tests: each lemma relates what it should, and no more.

use super::classes::*;
use super::layout::*;
use super::sums::*;
use super::*;
use crate::eval::eval;
use crate::term::{Shapes, Term, CAT, SUM};
use egg::RecExpr;
use egg::{Id, Rewrite, Symbol};
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::HashMap;

/// An e-graph of `term` over rank tensors of the given shapes, run with one lemma; whether
/// `expected` is then in the term's class (a term not built by the lemma would be a new
/// class).
fn lemma_relates(name: &str, leaves: &[(&str, &[usize])], term: &str, expected: &str) -> bool {
    let mut g = Graph::new(Shapes::default());
    for (leaf, dims) in leaves {
        g.analysis
            .leaves
            .insert((*leaf).into(), Meta::new(DType::F64, dims.to_vec()));
    }
    let root = g.add_expr(&term.parse().unwrap());
    g.rebuild();
    let lemma = library().into_iter().find(|l| l.name == name).unwrap();
    let mut g = egg::Runner::default()
        .with_egraph(g)
        .with_iter_limit(2)
        .run(&lemma.rewrites())
        .egraph;
    let other = g.add_expr(&expected.parse().unwrap());
    g.rebuild();
    g.find(root) == g.find(other)
}

/// Copies of a gradient per expert regroup in the ranks' groups of experts only where those
/// are sums of tensor-parallel partials; plain groups keep the per-expert split.
#[test]
fn expert_copies_regroup_only_against_rank_sums() {
    let leaves: &[(&str, &[usize])] = &[
        ("%r0:a", &[1, 3]),
        ("%r0:b", &[2, 3]),
        ("%r1:b", &[2, 3]),
        ("%r2:b", &[2, 3]),
        ("%r3:b", &[2, 3]),
    ];
    let copies = "(cat 0 %r0:a %r0:a %r0:a %r0:a)";
    let pair = "(cat 0 %r0:a %r0:a)";
    let partials =
        format!("(aten.mul.Tensor {copies} (cat 0 (sum %r0:b %r2:b) (sum %r1:b %r3:b)))");
    let paired = format!(
        "(cat 0 (aten.mul.Tensor {pair} (sum %r0:b %r2:b)) (aten.mul.Tensor {pair} (sum %r1:b %r3:b)))"
    );
    assert!(lemma_relates(
        "elementwise-over-cat",
        leaves,
        &partials,
        &paired
    ));
    let plain = format!("(aten.mul.Tensor {copies} (cat 0 %r0:b %r1:b))");
    let paired = format!("(cat 0 (aten.mul.Tensor {pair} %r0:b) (aten.mul.Tensor {pair} %r1:b))");
    assert!(!lemma_relates(
        "elementwise-over-cat",
        leaves,
        &plain,
        &paired
    ));
}

/// A chunk's per-token sum becomes the chunk of the rank's sum only when the rank's sum is
/// in the graph.
#[test]
fn a_chunk_sum_is_the_ranks_only_where_the_rank_sums() {
    let leaves: &[(&str, &[usize])] = &[("%r0:z", &[2, 16, 3])];
    let chunk = "(aten.sum.dim_IntList (slice 2 0 2 (aten.view.default %r0:z (list 2 4 4 3))) (list 3) b:false none)";
    let rank = "(aten.sum.dim_IntList %r0:z (list 2) b:false none)";
    let expected = format!("(slice 2 0 2 (aten.view.default {rank} (list 2 4 4)))");
    assert!(!lemma_relates("sum-over-chunk", leaves, chunk, &expected));
    let both = format!(
        "(cat 0 (aten.view.default {chunk} (list 16)) (aten.view.default {rank} (list 32)))"
    );
    let expected_both = format!(
        "(cat 0 (aten.view.default {expected} (list 16)) (aten.view.default {rank} (list 32)))"
    );
    assert!(lemma_relates(
        "sum-over-chunk",
        leaves,
        &both,
        &expected_both
    ));
}

/// Factors compose in lowest terms: `1/sqrt(8)` as the binary fraction it is, times its
/// inverse over two, is one half, though the raw products overflow an i64; a product that
/// does not fit even reduced is none.
#[test]
fn factors_compose_reduced() {
    let (m, k) = crate::lower::rational(0.35355339059327373).unwrap();
    assert!(m.checked_mul(k).is_none());
    assert_eq!(product_reduced((k, m), (m, 2 * k)), Some((1, 2)));
    assert_eq!(product_reduced((-k, m), (m, k)), Some((-1, 1)));
    assert_eq!(product_reduced((i64::MAX, 1), (i64::MAX, 1)), None);
    assert_eq!(product_reduced((1, 2), (3, 0)), None);
}

/// A permutation of a tensor itself that only a view to unit dims follows puts the unit
/// dims into the split, so the chain needs no trailing view: the transposed chunk a
/// single-sequence rank builds as `permute(view(x, [1, 4, 2, 4]), [0, 1, 3, 2])` comes out
/// in that form; a result that differs by more than unit dims is left alone.
#[test]
fn unit_dims_go_into_the_split() {
    let steps = [
        LayoutStep::Permute(vec![0, 2, 1]),
        LayoutStep::View(vec![1, 4, 4, 2]),
    ];
    let (split, perm) = strided_permutation(&[4, 2, 4], &steps, &[1, 4, 4, 2]).unwrap();
    assert_eq!((&split[..], &perm[..]), (&[4, 2, 4][..], &[0, 2, 1][..]));
    assert_eq!(
        units_in_split(&split, &perm, &[1, 4, 4, 2]),
        Some((vec![1, 4, 2, 4], vec![0, 1, 3, 2]))
    );
    assert_eq!(
        units_in_split(&[3, 2], &[1, 0], &[2, 1, 3]),
        Some((vec![1, 3, 2], vec![2, 0, 1]))
    );
    assert_eq!(units_in_split(&[3, 2], &[1, 0], &[2, 3]), None);
    assert_eq!(units_in_split(&[3, 2], &[1, 0], &[1, 6]), None);
}

/// Adds `text` to `g`, returning its class and the expression (for evaluation).
fn add(g: &mut Graph, text: &str) -> (Id, RecExpr<Term>) {
    let e: RecExpr<Term> = text.parse().expect("term");
    (g.add_expr(&e), e)
}

/// The merge of 0-d linear combinations unites exactly the classes the reference kernels
/// evaluate equal: a flat sum with halved duplicates, nested sums and additions of the
/// same scalars, and leaves apart one whose coefficients differ.
#[test]
fn equal_linear_combinations_of_scalars_merge() {
    let mut g = Graph::new(Shapes::default());
    let mut leaves = HashMap::new();
    let mut x = 0.1;
    for (leaf, key) in [("%r0:a", "r0:a"), ("%r1:a", "r1:a"), ("%r0:b", "r0:b")] {
        g.analysis
            .leaves
            .insert(Symbol::from(leaf), Meta::new(DType::F64, vec![]));
        x += 0.37;
        leaves.insert(
            key.to_string(),
            Tensor::new(Meta::new(DType::F64, vec![]), vec![x]),
        );
    }
    let (flat, flat_e) = add(
        &mut g,
        "(sum %r0:a (scale 1 2 %r0:b) %r1:a (scale 1 2 %r0:b))",
    );
    let (nested, nested_e) = add(
        &mut g,
        "(aten.add.Tensor (sum %r0:a %r0:b) (scale 2 2 %r1:a) 1)",
    );
    let (other, other_e) = add(
        &mut g,
        "(aten.add.Tensor (sum %r0:a %r0:b) (scale 1 2 %r1:a) 1)",
    );
    g.rebuild();
    assert!(merge_linear_scalars(&mut g));
    let value = |e: &RecExpr<Term>| eval(e, &leaves).expect("evaluates")[0].data[0];
    assert_eq!(g.find(flat), g.find(nested));
    assert!((value(&flat_e) - value(&nested_e)).abs() < 1e-12);
    assert_ne!(g.find(flat), g.find(other));
    assert!((value(&flat_e) - value(&other_e)).abs() > 1e-3);
}

/// The scale rewrites applied everywhere name a concatenation of multiples by the rank
/// tensors: a rank's `t = x / 2` makes the spec's chunk `x / 8` the multiple `t / 4`, and
/// the concatenation of it with `c / 4` is `cat(c, t) / 4`, as the reference kernels
/// evaluate it.
#[test]
fn scale_rewrites_everywhere_name_multiples_by_rank_tensors() {
    let mut g = Graph::new(Shapes::default());
    let meta = Meta::new(DType::F64, vec![2, 3]);
    for leaf in ["%r0:a", "%r0:b", "%r0:c", "%r0:t"] {
        g.analysis.leaves.insert(Symbol::from(leaf), meta.clone());
    }
    let (x, _) = add(&mut g, "(aten.add.Tensor %r0:a %r0:b 1)");
    let (t, _) = add(&mut g, "%r0:t");
    let (half, _) = add(&mut g, "(scale 1 2 (aten.add.Tensor %r0:a %r0:b 1))");
    g.union(t, half);
    let (chunks, chunks_e) = add(
        &mut g,
        "(cat 0 (scale 1 4 %r0:c) (scale 1 8 (aten.add.Tensor %r0:a %r0:b 1)))",
    );
    g.rebuild();
    let named = "(scale 1 4 (cat 0 %r0:c %r0:t))";
    let pairs = [
        ("linear-over-scale", SCALE),
        ("scale-through-sibling", SCALE),
        ("scale-and-cat", CAT),
    ];
    for _ in 0..3 {
        apply_everywhere(&mut g, &pairs);
    }
    let found = g.lookup_expr(&named.parse().expect("term"));
    assert_eq!(found.map(|f| g.find(f)), Some(g.find(chunks)));
    assert_ne!(g.find(x), g.find(t));
    // The rank tensor is half the sum; both forms evaluate alike.
    let mut leaves = HashMap::new();
    let vals = |k: f64| (0..6).map(|i| k + f64::from(i)).collect::<Vec<_>>();
    for (name, k) in [("r0:a", 0.5), ("r0:b", -1.25), ("r0:c", 2.0)] {
        leaves.insert(name.to_string(), Tensor::new(meta.clone(), vals(k)));
    }
    let sum: Vec<f64> = vals(0.5)
        .iter()
        .zip(vals(-1.25))
        .map(|(p, q)| (p + q) / 2.0)
        .collect();
    leaves.insert("r0:t".to_string(), Tensor::new(meta.clone(), sum));
    let value = |e: &RecExpr<Term>| eval(e, &leaves).expect("evaluates")[0].data.clone();
    assert_eq!(value(&chunks_e), value(&named.parse().expect("term")));
}

/// A factor over a sum of copies of one term is not spread into the copies: `sum(a, a) / 2`
/// spread as `sum(a / 2, a / 2)` names `a / 2`, whose class holds a sum of copies in turn,
/// a new multiple each iteration (a context-parallel MoE gradient's e-graph filled with
/// `a / 2^k`). The factor still reaches `a` by the replicas' multiple: `sum(a, a) / 2 = a`.
#[test]
fn a_factor_is_not_spread_over_copies_of_one_term() {
    let mut g = Graph::new(Shapes::default());
    let meta = Meta::new(DType::F64, vec![2, 3]);
    g.analysis
        .leaves
        .insert(Symbol::from("%r0:a"), meta.clone());
    let (half, half_e) = add(&mut g, "(scale 1 2 (sum %r0:a %r0:a))");
    let (a, _) = add(&mut g, "%r0:a");
    g.rebuild();
    let pairs = [
        ("linear-over-sum", SCALE),
        ("sum-of-replicas", SUM),
        ("linear-over-scale", SCALE),
    ];
    for _ in 0..6 {
        apply_everywhere(&mut g, &pairs);
    }
    assert_eq!(g.find(half), g.find(a));
    for k in [4, 8, 16] {
        let deeper = format!("(scale 1 {k} %r0:a)");
        assert!(
            g.lookup_expr(&deeper.parse().expect("term")).is_none(),
            "{deeper}"
        );
    }
    let vals: Vec<f64> = (0..6).map(|i| 0.25 + f64::from(i)).collect();
    let leaves = HashMap::from([("r0:a".to_string(), Tensor::new(meta, vals.clone()))]);
    assert_eq!(*eval(&half_e, &leaves).expect("evaluates")[0].data, vals);
}

/// At the node cap a lemma's match adds nothing, where below it the same match adds its
/// terms: one iteration stops growing the e-graph once it reaches the cap.
#[test]
fn lemmas_add_nothing_at_the_node_cap() {
    let rules: Vec<Rewrite<Term, Shapes>> = library()
        .into_iter()
        .filter(|l| l.name == "sum-of-replicas")
        .flat_map(|l| l.rewrites())
        .collect();
    let tripled = |capped: bool| {
        let mut g = Graph::new(Shapes::default());
        let meta = Meta::new(DType::F64, vec![2, 3]);
        g.analysis.leaves.insert(Symbol::from("%r0:a"), meta);
        add(&mut g, "(sum %r0:a %r0:a %r0:a)");
        g.rebuild();
        if capped {
            g.analysis.node_cap = g.total_size();
        }
        let runner = egg::Runner::default()
            .with_egraph(g)
            .with_iter_limit(1)
            .run(&rules);
        let three = "(scale 3 1 %r0:a)".parse().expect("term");
        runner.egraph.lookup_expr(&three).is_some()
    };
    assert!(tripled(false));
    assert!(!tripled(true));
}

/// Declares 0-d f64 leaves.
fn scalar_leaves(g: &mut Graph, names: &[&str]) {
    for leaf in names {
        g.analysis
            .leaves
            .insert(Symbol::from(*leaf), Meta::new(DType::F64, vec![]));
    }
}

/// Two replicas' running sums found equal (one class, both definitions) make their
/// per-layer atoms equal too: a combination over one replica's atoms merges with the same
/// combination over the other's, though no class unites the atoms themselves.
#[test]
fn combinations_over_replica_atoms_merge_by_the_replicas_identity() {
    let mut g = Graph::new(Shapes::default());
    scalar_leaves(&mut g, &["%r0:a", "%r2:a", "%r1:b"]);
    let (half0, _) = add(&mut g, "(scale 1 2 %r0:a)");
    let (half2, _) = add(&mut g, "(scale 1 2 %r2:a)");
    g.union(half0, half2);
    let (over0, _) = add(&mut g, "(aten.add.Tensor (scale 1 4 %r0:a) %r1:b 1)");
    let (over2, _) = add(&mut g, "(aten.add.Tensor (scale 1 4 %r2:a) %r1:b 1)");
    let (other, _) = add(&mut g, "(aten.add.Tensor (scale 1 2 %r2:a) %r1:b 1)");
    g.rebuild();
    assert!(merge_linear_scalars(&mut g));
    assert_eq!(g.find(over0), g.find(over2));
    assert_ne!(g.find(over0), g.find(other));
}

/// A flat sum of the ranks' terms is expressed by the ranks' own running sums (each the
/// sum of its terms), with one coefficient; a sum that mixes terms no candidate
/// combination reaches is left alone.
#[test]
fn a_scalar_is_expressed_by_the_candidates_combination() {
    let mut g = Graph::new(Shapes::default());
    scalar_leaves(
        &mut g,
        &["%r0:a", "%r0:b", "%r1:a", "%r1:b", "%r0:s", "%r1:s"],
    );
    let mut candidates = Vec::new();
    for r in 0..2 {
        let (leaf, _) = add(&mut g, &format!("%r{r}:s"));
        let (def, _) = add(&mut g, &format!("(aten.add.Tensor %r{r}:a %r{r}:b 1)"));
        g.union(leaf, def);
        candidates.push(leaf);
    }
    let (root, root_e) = add(
        &mut g,
        "(sum (scale 1 2 %r0:a) (scale 1 2 %r0:b) (scale 1 2 %r1:a) (scale 1 2 %r1:b))",
    );
    let (mixed, _) = add(&mut g, "(sum %r0:a %r1:b)");
    g.rebuild();
    assert!(express_by_combination(&mut g, root, &candidates));
    let (want, _) = add(&mut g, "(scale 1 2 (sum %r0:s %r1:s))");
    g.rebuild();
    assert_eq!(g.find(root), g.find(want));
    assert!(!express_by_combination(&mut g, mixed, &candidates));
    // The built term evaluates to the root's value with the candidates' definitions.
    let mut leaves = HashMap::new();
    let mut x = 0.25;
    for key in ["r0:a", "r0:b", "r1:a", "r1:b"] {
        x += 0.5;
        leaves.insert(
            key.to_string(),
            Tensor::new(Meta::new(DType::F64, vec![]), vec![x]),
        );
    }
    for r in 0..2 {
        let s = leaves[&format!("r{r}:a")].data[0] + leaves[&format!("r{r}:b")].data[0];
        leaves.insert(
            format!("r{r}:s"),
            Tensor::new(Meta::new(DType::F64, vec![]), vec![s]),
        );
    }
    let value = |text: &str| {
        let e: RecExpr<Term> = text.parse().expect("term");
        eval(&e, &leaves).expect("evaluates")[0].data[0]
    };
    let built = value("(scale 1 2 (sum %r0:s %r1:s))");
    assert!((eval(&root_e, &leaves).expect("evaluates")[0].data[0] - built).abs() < 1e-12);
}

/// A class reached through a cycle of scalings (`b = 2a` beside `a = b/2`) still gets the
/// combination of its grounded definition, whatever order the classes are met in: `a =
/// sum(x, y)` merges with `x + y` built elsewhere, and `b` with `2x + 2y`.
#[test]
fn scalars_on_a_cycle_of_scalings_merge_by_their_definitions() {
    let mut g = Graph::new(Shapes::default());
    for leaf in ["%r0:x", "%r0:y"] {
        g.analysis
            .leaves
            .insert(Symbol::from(leaf), Meta::new(DType::F64, vec![]));
    }
    let (a, _) = add(&mut g, "(sum %r0:x %r0:y)");
    let (b, _) = add(&mut g, "(scale 2 1 (sum %r0:x %r0:y))");
    let (half_b, _) = add(&mut g, "(scale 1 2 (scale 2 1 (sum %r0:x %r0:y)))");
    g.union(a, half_b);
    let (added, _) = add(&mut g, "(aten.add.Tensor %r0:x %r0:y 1)");
    let (doubled, _) = add(
        &mut g,
        "(aten.add.Tensor (scale 2 1 %r0:x) (scale 2 1 %r0:y) 1)",
    );
    g.rebuild();
    assert!(merge_linear_scalars(&mut g));
    assert_eq!(g.find(a), g.find(added));
    assert_eq!(g.find(b), g.find(doubled));
    assert_ne!(g.find(a), g.find(b));
}

/// An accumulating index_put into zeros spreads over a partial sum of its values; a plain
/// index_put (later writes replace earlier ones) and an accumulation into a non-zero buffer
/// that is not a sum do not.
#[test]
fn accumulation_spreads_over_sums_only_when_it_accumulates() {
    let leaves: &[(&str, &[usize])] = &[
        ("%r0:i", &[3]),
        ("%r0:a", &[3, 2]),
        ("%r1:a", &[3, 2]),
        ("%r0:x", &[4, 2]),
    ];
    let zeros = "(aten.full.default (list 4 2) f:0.0 dt:f64 none dev b:false)";
    let put = |x: &str, v: &str, acc: bool| {
        format!("(aten.index_put.default {x} (list %r0:i) {v} b:{acc})")
    };
    let spread =
        |x: &str, acc: bool| format!("(sum {} {})", put(x, "%r0:a", acc), put(x, "%r1:a", acc));
    let sum = "(sum %r0:a %r1:a)";
    assert!(lemma_relates(
        "accumulate-over-sum",
        leaves,
        &put(zeros, sum, true),
        &spread(zeros, true)
    ));
    assert!(!lemma_relates(
        "accumulate-over-sum",
        leaves,
        &put(zeros, sum, false),
        &spread(zeros, false)
    ));
    assert!(!lemma_relates(
        "accumulate-over-sum",
        leaves,
        &put("%r0:x", sum, true),
        &spread("%r0:x", true)
    ));
}

/// apex's layer norm backward over sequence pieces with flattened statistics: the weight
/// gradient is the sum of the pieces'; statistics split at other rows relate nothing.
#[test]
fn apex_norm_backward_splits_with_flattened_statistics() {
    let leaves: &[(&str, &[usize])] = &[
        ("%r0:g", &[2, 2, 3]),
        ("%r1:g", &[2, 2, 3]),
        ("%r0:x", &[2, 2, 3]),
        ("%r1:x", &[2, 2, 3]),
        ("%r0:m", &[4]),
        ("%r1:m", &[4]),
        ("%r0:r", &[4]),
        ("%r1:r", &[4]),
        ("%r0:w", &[3]),
        ("%r0:b", &[3]),
        ("%r0:q", &[2]),
        ("%r1:q", &[6]),
    ];
    let call = |g: &str, m: &str, r: &str, x: &str| {
        format!("(apex.fused_layer_norm_affine_bwd.default {g} {m} {r} {x} (list 3) %r0:w %r0:b f:1e-5 b:false)")
    };
    let whole = call(
        "(cat 0 %r0:g %r1:g)",
        "(cat 0 %r0:m %r1:m)",
        "(cat 0 %r0:r %r1:r)",
        "(cat 0 %r0:x %r1:x)",
    );
    let piece = |r: usize| {
        call(
            &format!("%r{r}:g"),
            &format!("%r{r}:m"),
            &format!("%r{r}:r"),
            &format!("%r{r}:x"),
        )
    };
    assert!(lemma_relates(
        "apex-norm-backward-over-cat",
        leaves,
        &format!("(get 1 {whole})"),
        &format!("(sum (get 1 {}) (get 1 {}))", piece(0), piece(1))
    ));
    // Statistics cut at rows 2 and 6 belong to other rows than the gradient's pieces.
    let skewed = call(
        "(cat 0 %r0:g %r1:g)",
        "(cat 0 %r0:q %r1:q)",
        "(cat 0 %r0:q %r1:q)",
        "(cat 0 %r0:x %r1:x)",
    );
    let skewed_piece = |r: usize| {
        call(
            &format!("%r{r}:g"),
            &format!("%r{r}:q"),
            &format!("%r{r}:q"),
            &format!("%r{r}:x"),
        )
    };
    assert!(!lemma_relates(
        "apex-norm-backward-over-cat",
        leaves,
        &format!("(get 1 {skewed})"),
        &format!(
            "(sum (get 1 {}) (get 1 {}))",
            skewed_piece(0),
            skewed_piece(1)
        )
    ));
}

/// `cat-of-adjacent-slices` looks for the slices of `x` among the classes of `x`'s parents
/// only: that also finds slices built over another class before it was united with `x` (egg
/// keeps the parents of both), and no tiling with a gap.
#[test]
fn adjacent_slices_are_found_over_a_united_source() {
    let tiles = |second: &str| {
        let mut g = Graph::new(Shapes::default());
        for leaf in ["%r0:a", "%r0:b"] {
            g.analysis
                .leaves
                .insert(leaf.into(), Meta::new(DType::F64, vec![5, 3]));
        }
        let a = g.add_expr(&"%r0:a".parse().unwrap());
        let b = g.add_expr(&"%r0:b".parse().unwrap());
        g.add_expr(&"(slice 0 0 2 %r0:a)".parse().unwrap());
        g.add_expr(&second.parse().unwrap());
        g.union(a, b);
        g.rebuild();
        let lemma = library()
            .into_iter()
            .find(|l| l.name == "cat-of-adjacent-slices")
            .unwrap();
        let mut g = egg::Runner::default()
            .with_egraph(g)
            .with_iter_limit(2)
            .run(&lemma.rewrites())
            .egraph;
        let whole = g.add_expr(
            &"(cat 0 (slice 0 0 2 %r0:a) (slice 0 2 5 %r0:a))"
                .parse()
                .unwrap(),
        );
        g.rebuild();
        g.find(whole) == g.find(a)
    };
    assert!(tiles("(slice 0 2 5 %r0:b)"));
    assert!(!tiles("(slice 0 3 5 %r0:b)"));
}
