//! The engine's unit tests: extraction, exploration and relations on small emitted cases.

use super::explore::*;
use super::extract::*;
use super::pieces::*;
use super::relation::*;
use super::report::*;
use super::saturate::*;
use crate::lemmas::{Graph, SCALE};
use crate::lower::{pair_collectives, pair_messages, LowerCtx, Lowered, Tpl, ValueRef};
use crate::term::{leaf_symbol, Shapes, Term};
use egg::{Id, RecExpr, Symbol};
use shardproof_case::Case;
use shardproof_ir::{NodeKind, ValueId};
use shardproof_zoo::{
    emit_to_dir, EmitExtras, EmitOptions, LlamaConfig, Mesh, PipelineOptions, TrainOptions,
};
use std::collections::{HashMap, HashSet};

/// Small factors print as fractions; the binary fraction a float literal is prints as that
/// float, exactly, and so does its inverse (as a division); others as fractions.
#[test]
fn factors_print_exactly() {
    let (m, k) = crate::lower::rational(0.35355339059327373).unwrap();
    assert_eq!(factor_text(1, 4), "* 1/4");
    assert_eq!(factor_text(-3, 2), "* -3/2");
    assert_eq!(factor_text(m, k), "* 0.35355339059327373");
    assert_eq!(factor_text(k, m), "/ 0.35355339059327373");
    assert_eq!(factor_text(-k, m), "/ -0.35355339059327373");
    assert_eq!(factor_text(3 * m, 7 * k), format!("* {}/{}", 3 * m, 7 * k));
}

/// A one-layer llama on tp=2, forward only: its ranks scale the attention scores.
fn tiny_llama(dir: &std::path::Path) -> Case {
    one_layer_llama(dir, "tp=2", true)
}

/// A one-layer llama on `mesh`, emitted into `dir` and loaded.
fn one_layer_llama(dir: &std::path::Path, mesh: &str, forward_only: bool) -> Case {
    emit_and_load(
        dir,
        EmitOptions {
            model: "llama".into(),
            mlp: Default::default(),
            llama: LlamaConfig {
                layers: 1,
                ..LlamaConfig::default()
            },
            mesh: Mesh::parse(mesh).unwrap(),
            bug: None,
            forward_only,
            vocab_parallel: false,
        },
    )
}

/// The zoo case `opts` describes, emitted into `dir` and loaded.
fn emit_and_load(dir: &std::path::Path, opts: EmitOptions) -> Case {
    let pipeline = PipelineOptions::default();
    emit_to_dir(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::PLAIN,
        &pipeline,
        dir,
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// Runs `f` with the lowering context of `case`'s ranks, as `verify` builds it.
pub(super) fn with_ctx<R>(case: &Case, f: impl FnOnce(&LowerCtx) -> R) -> R {
    let leaves: Vec<_> = (0..case.program.ranks.len())
        .map(|r| case.rank_leaves(r))
        .collect();
    let (partners, _) = pair_collectives(&case.program, &case.ops, &leaves);
    let messages = pair_messages(&case.program);
    let ctx = LowerCtx {
        messages: &messages,
        custom_ops: &case.ops,
        same_mask: false,
        program: &case.program,
        partners: &partners,
        constants: &case.constants,
        ignore_index_unused: false,
    };
    f(&ctx)
}

/// The engine's view of `case`'s ranks, as `verify` builds it.
pub(super) fn impl_of(case: &Case) -> Impl<'_> {
    with_ctx(case, |ctx| build_impl(case, ctx))
}

/// Scales of scales fold into one, inside an expression too, and a unit factor drops; the
/// folded expression evaluates as the original did.
#[test]
fn nested_scales_fold_into_one() {
    use crate::eval::{eval, random_tensor, seeded_values, tensors_agree};
    let expr = |s: &str| -> RecExpr<Term> { s.parse().unwrap() };
    let mut leaves = HashMap::new();
    let mut next = seeded_values(0.29);
    for name in ["r0:x", "r1:x"] {
        let t = random_tensor(shardproof_ir::DType::F64, vec![2, 3], 4, &mut next);
        leaves.insert(name.to_string(), t);
    }
    for (nested, folded) in [
        ("(scale 1 8 (scale 2 1 %r0:x))", "(scale 1 4 %r0:x)"),
        ("(scale 1 2 (scale 2 1 %r0:x))", "%r0:x"),
        (
            "(cat 0 (scale 3 1 (scale 1 6 %r0:x)) (scale 5 1 %r1:x))",
            "(cat 0 (scale 1 2 %r0:x) (scale 5 1 %r1:x))",
        ),
    ] {
        let got = fold_nested_scales(&expr(nested));
        assert_eq!(got, expr(folded), "{nested}");
        let (a, b) = (eval(&expr(nested), &leaves), eval(&got, &leaves));
        assert!(tensors_agree(&a.unwrap(), &b.unwrap()), "{nested}");
    }
}

/// A factor every piece of a concatenation carries folds out of it, through nested
/// concatenations and into a scale around them, so the expression is a multiple of a clean one
/// at its top; where the factors differ, or a piece carries none (first or last), the
/// concatenation stays as it is. Each result evaluates as the original did.
#[test]
fn a_factor_every_piece_carries_folds_out_of_a_concatenation() {
    use crate::eval::{eval, random_tensor, seeded_values, tensors_agree};
    let expr = |s: &str| -> RecExpr<Term> { s.parse().unwrap() };
    let mut leaves = HashMap::new();
    let mut next = seeded_values(0.41);
    for name in ["r0:x", "r1:x"] {
        let t = random_tensor(shardproof_ir::DType::F64, vec![2, 3], 4, &mut next);
        leaves.insert(name.to_string(), t);
    }
    let kept = [
        "(cat 0 (scale 1 8 %r0:x) (scale 1 4 %r1:x))",
        "(cat 0 (scale 1 8 %r0:x) %r1:x)",
        "(cat 0 %r0:x (scale 1 8 %r1:x))",
        "(cat 1 (scale 1 8 (cat 0 %r0:x %r1:x)) (cat 0 (scale 1 8 %r0:x) %r1:x))",
    ];
    let folded = [
        (
            "(cat 0 (scale 1 8 %r0:x) (scale 1 8 %r1:x))",
            "(scale 1 8 (cat 0 %r0:x %r1:x))",
        ),
        (
            "(cat 1 (scale 1 8 (cat 0 %r0:x %r1:x)) (cat 0 (scale 1 8 %r0:x) (scale 2 16 %r1:x)))",
            "(scale 1 8 (cat 1 (cat 0 %r0:x %r1:x) (cat 0 %r0:x %r1:x)))",
        ),
        (
            "(cat 0 (scale 2 1 (scale 1 16 %r0:x)) (scale 1 8 %r1:x))",
            "(scale 1 8 (cat 0 %r0:x %r1:x))",
        ),
        (
            "(scale 2 1 (cat 0 (scale 1 8 %r0:x) (scale 1 8 %r1:x)))",
            "(scale 1 4 (cat 0 %r0:x %r1:x))",
        ),
    ];
    for (before, after) in kept.iter().map(|k| (*k, *k)).chain(folded) {
        let got = fold_nested_scales(&expr(before));
        assert_eq!(got, expr(after), "{before}");
        let (a, b) = (eval(&expr(before), &leaves), eval(&got, &leaves));
        assert!(tensors_agree(&a.unwrap(), &b.unwrap()), "{before}");
    }
}

/// Every value of rank `r` whose lowered definition is one of `ops`.
fn values_defined_by(imp: &Impl, r: usize, ops: &[&str]) -> Vec<ValueRef> {
    let g = &imp.case.program.ranks[r];
    let mut out: Vec<ValueRef> = (0..g.nodes.len())
        .flat_map(|n| {
            (0..g.nodes[n].outputs.len()).map(move |k| ValueRef {
                rank: Some(r),
                value: ValueId::new(n, k),
            })
        })
        .filter(|&v| imp.canon(v) == v && defining_op(imp, v).is_some_and(|s| ops.contains(&s)))
        .collect();
    out.sort();
    out
}

/// Runs every rank of `imp`'s case on random inputs (integers below 4): the values every
/// leaf of an e-graph over the ranks' tensors takes, keyed as [`crate::eval::eval`] reads
/// them.
fn rank_values(imp: &Impl) -> HashMap<String, shardproof_ops::Tensor> {
    use crate::eval::{random_tensor, seeded_values};
    let case = imp.case;
    let mut next = seeded_values(0.37);
    let leaves: Vec<std::collections::BTreeMap<String, shardproof_ops::Tensor>> = case
        .program
        .ranks
        .iter()
        .enumerate()
        .map(|(r, g)| {
            g.nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| matches!(n.kind, NodeKind::Input))
                .map(|(i, n)| {
                    let meta = imp
                        .meta(ValueRef {
                            rank: Some(r),
                            value: ValueId::new(i, 0),
                        })
                        .expect("an input's meta");
                    let t = random_tensor(meta.dtype, meta.shape.clone(), 4, &mut next);
                    (n.outputs[0].name.clone(), t)
                })
                .collect()
        })
        .collect();
    let envs = shardproof_interp::run_program(&case.program, &leaves, &Default::default())
        .expect("the ranks run");
    let mut out = HashMap::new();
    for (r, (g, env)) in case.program.ranks.iter().zip(&envs).enumerate() {
        for (n, node) in g.nodes.iter().enumerate() {
            for (k, o) in node.outputs.iter().enumerate() {
                if let Some(t) = env.get(ValueId::new(n, k)) {
                    out.insert(format!("r{r}:{}", o.name), t.clone());
                }
            }
        }
    }
    out
}

/// The wider attempt's layout steps on llama's cp=2 full iteration (one layer): from the
/// ranks' views, the sources behind their transposes are related back (a key block read
/// as `view(transpose(view(x)))`), and the chains of layouts over one received block (taken
/// once for the forward and once more for the backward) meet by congruence. Every class
/// the steps built holds on a run of the ranks.
#[test]
fn layout_sources_are_related_back_and_their_chains_meet() {
    let dir = tempfile::tempdir().unwrap();
    let case = one_layer_llama(dir.path(), "cp=2", false);
    let imp = impl_of(&case);
    let views = values_defined_by(&imp, 1, RESHAPES);
    let transposes = values_defined_by(&imp, 1, &["aten.transpose.int"]);
    let mut eg = new_graph(&imp);
    let mut t_rel: HashSet<ValueRef> = views.iter().copied().collect();
    let leaves: Vec<Id> = views.iter().map(|&v| imp.leaf(&mut eg, v)).collect();
    let mut added = HashSet::new();
    unfold_view_sources(&mut eg, &imp, &mut t_rel, &mut added);
    define_layout_chains(&mut eg, &imp, &t_rel, &mut added);
    eg.rebuild();

    // A transpose's source, reached only by inverting the transpose, is related.
    let behind_transpose = transposes.iter().any(|t| {
        t_rel.contains(t)
            && imp
                .term_inputs(*t)
                .iter()
                .any(|x| t_rel.contains(x) && !views.contains(x) && !transposes.contains(x))
    });
    assert!(behind_transpose, "no source behind a transpose was related");
    // Two of the ranks' views, distinct nodes of its program, are one class now.
    let classes: HashSet<Id> = leaves.iter().map(|&l| eg.find(l)).collect();
    assert!(classes.len() < leaves.len(), "no two chains met");
    // Every class holds on a run of the ranks.
    let compared = crate::eval::classes_agree(&eg, &rank_values(&imp)).unwrap();
    assert!(compared > 0);
}

/// A round's operators bring in the operators that only move elements over them, chains
/// of them in one round: every value taken moves elements, its inputs are related or
/// taken, some chain has two links, and nothing that could be taken is left behind.
#[test]
fn a_round_brings_in_the_element_moves_over_its_operators() {
    let dir = tempfile::tempdir().unwrap();
    let case = one_layer_llama(dir.path(), "tp=2", false);
    let imp = impl_of(&case);
    // Related: the ranks' inputs and every value an operator computes arithmetic for.
    // The round: the element moves over those alone.
    let t_rel: HashSet<ValueRef> = imp
        .lowered
        .iter()
        .filter(|(v, l)| {
            imp.canon(**v) == **v
                && match l {
                    Lowered::Leaf => true,
                    Lowered::Term(_) => !moves_elements(&imp, **v),
                    _ => false,
                }
        })
        .map(|(v, _)| *v)
        .collect();
    let ready = |v: &ValueRef, have: &dyn Fn(&ValueRef) -> bool| {
        imp.canon(*v) == *v
            && !imp.cut.contains(v)
            && !t_rel.contains(v)
            && matches!(imp.lowered.get(v), Some(Lowered::Term(_)))
            && imp
                .term_inputs(*v)
                .iter()
                .all(|i| have(i) || imp.const_only.contains(i))
    };
    let mut round: Vec<ValueRef> = imp
        .lowered
        .keys()
        .filter(|v| ready(v, &|i| t_rel.contains(i)))
        .copied()
        .collect();
    round.sort();
    let first: HashSet<ValueRef> = round.iter().copied().collect();
    follow_element_moves(&imp, &t_rel, &HashSet::new(), &mut round);
    let taken: HashSet<ValueRef> = round.iter().copied().collect();
    assert_eq!(taken.len(), round.len(), "a value taken twice");

    let later: Vec<ValueRef> = round
        .iter()
        .filter(|v| !first.contains(v))
        .copied()
        .collect();
    assert!(!later.is_empty(), "no operator followed");
    let known = |i: &ValueRef| t_rel.contains(i) || taken.contains(i);
    for v in &later {
        assert!(moves_elements(&imp, *v), "{}", imp.name(*v));
        assert!(ready(v, &known), "{} taken before its inputs", imp.name(*v));
    }
    let chained = later
        .iter()
        .any(|v| imp.term_inputs(*v).iter().any(|i| later.contains(i)));
    assert!(
        chained,
        "no chain of two element moves followed in one round"
    );
    // Closed: every element move over related or taken values is taken.
    for v in imp.lowered.keys() {
        if ready(v, &known) && moves_elements(&imp, *v) {
            assert!(taken.contains(v), "{} left behind", imp.name(*v));
        }
    }
}

/// Among equal leaves the extraction names the tensor computed first, then the lowest
/// rank, whatever order they entered the e-graph in; and it keeps that choice inside a
/// composite. The symbols are fresh so that interning order cannot decide.
#[test]
fn extraction_prefers_the_earliest_tensor_then_the_lowest_rank() {
    let mut eg = Graph::new(Shapes::default());
    let leaf = |eg: &mut Graph, sym: &str, at: (usize, usize)| {
        let s = Symbol::from(sym);
        eg.analysis.positions.insert(s, at);
        eg.add(Term::Op(s, Vec::new()))
    };
    // Replicas of one tensor on ranks 5, 3 and 1, then a copy computed later on rank 0.
    let r5 = leaf(&mut eg, "%r5:preference_test_x", (4, 5));
    let r3 = leaf(&mut eg, "%r3:preference_test_x", (4, 3));
    let copy = leaf(&mut eg, "%r0:preference_test_copy", (9, 0));
    let r1 = leaf(&mut eg, "%r1:preference_test_x", (4, 1));
    for other in [r3, copy, r1] {
        eg.union(r5, other);
    }
    let t = eg.add(Term::Op(Symbol::from("aten.t.default"), vec![r5]));
    let negated = eg.add(Term::Op(Symbol::from("aten.neg.default"), vec![t]));
    eg.rebuild();
    let best = extract(&eg, r5, false);
    assert_eq!(best[0].to_string(), "\"%r1:preference_test_x\"");
    let composite = extract(&eg, negated, false);
    assert!(
        composite[0].to_string().contains("%r1:preference_test_x"),
        "{}",
        composite[0]
    );
    // Every replica is still listed as a clean relation.
    let clean = extract(&eg, r5, true);
    assert!(clean.len() >= 4, "{clean:?}");
}

/// Reuse sorts a renamed relation as extraction would: `clean_size` is extraction's size of
/// every clean expression it returns, and they come smallest first, then by text.
#[test]
fn clean_size_is_the_size_extraction_ranks_by() {
    let mut eg = Graph::new(Shapes::default());
    let sym = Symbol::from;
    let a = eg.add(Term::Op(sym("%r0:size_test_a"), Vec::new()));
    let b = eg.add(Term::Op(sym("%r1:size_test_b"), Vec::new()));
    let c = eg.add(Term::Op(sym("%r0:size_test_c"), Vec::new()));
    let (zero, one) = (eg.add(Term::Num(0)), eg.add(Term::Num(1)));
    let cat = eg.add(Term::Op(sym(crate::term::CAT), vec![zero, b, c]));
    let tr = eg.add(Term::Op(sym("aten.transpose.int"), vec![zero, one, b]));
    let sum = eg.add(Term::Op(sym(crate::term::SUM), vec![b, c]));
    let neg = eg.add(Term::Op(sym("aten.neg.default"), vec![c]));
    for x in [cat, tr, sum, neg] {
        eg.union(a, x);
    }
    eg.rebuild();
    let clean = extract(&eg, a, true);
    let sizes: Vec<usize> = clean.iter().map(clean_size).collect();
    assert_eq!(sizes, [1, 2, 3, 3], "{clean:?}");
    let keys: Vec<(usize, String)> = clean
        .iter()
        .map(|e| (clean_size(e), e.to_string()))
        .collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
    let negated: RecExpr<Term> = "(aten.neg.default \"%r0:size_test_c\")".parse().unwrap();
    assert_eq!(clean_size(&negated), usize::MAX);
}

#[test]
fn a_multiple_of_a_clean_expression_is_the_expression_over_the_scaled_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let case = tiny_llama(dir.path());
    let imp = impl_of(&case);
    // A rank tensor the implementation defines as a multiple of another: u = (p/q) y.
    let mut scaled: Vec<(ValueRef, i64, i64, ValueRef)> = imp
        .lowered
        .iter()
        .filter_map(|(u, l)| match l {
            Lowered::Term(Tpl::Op(op, kids)) if op == SCALE => match kids.as_slice() {
                [Tpl::Num(p), Tpl::Num(q), Tpl::Value(y)]
                    if imp.canon(*u) == *u && imp.canon(*y) == *y && y.rank.is_some() =>
                {
                    Some((*u, *p, *q, *y))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    scaled.sort_by_key(|(u, ..)| (u.rank, u.value));
    let &(u, p, q, y) = scaled.first().expect("a scaled rank tensor");
    let leaf = |v: ValueRef| leaf_symbol(v.rank.unwrap(), &imp.name(v));
    let (lu, ly) = (leaf(u), leaf(y));
    let expr = |s: String| -> RecExpr<Term> { s.parse().unwrap() };
    let top = |e: &RecExpr<Term>| e.as_ref().len() - 1;

    // (p/q) slice(y) = slice(u), and (q/p) u = y.
    let e = expr(format!("(slice 0 0 1 {ly})"));
    let got = rescaled(&imp, &e, top(&e), (p, q)).expect("scaled onto u");
    assert_eq!(got, expr(format!("(slice 0 0 1 {lu})")));
    let e = expr(lu.clone());
    let got = rescaled(&imp, &e, top(&e), (q, p)).expect("scaled back onto y");
    assert_eq!(got, expr(ly.clone()));
    // A zero fill stays; another constant, an unscaled leaf, or a rank max under a
    // negative factor has no such form.
    let e = expr(format!(
        "(cat 0 {ly} (aten.full.default (list 1) f:0.0 dt:f32 none dev b:false))"
    ));
    assert!(rescaled(&imp, &e, top(&e), (p, q)).is_some());
    let e = expr(format!(
        "(cat 0 {ly} (aten.full.default (list 1) f:1.0 dt:f32 none dev b:false))"
    ));
    assert!(rescaled(&imp, &e, top(&e), (p, q)).is_none());
    let e = expr(format!("(aten.exp.default {ly})"));
    assert!(rescaled(&imp, &e, top(&e), (p, q)).is_none());
    // A symbol that is no literal argument (a constant of unknown value) has none either.
    let e = expr(format!("(cat 0 {ly} opaque_constant)"));
    assert!(rescaled(&imp, &e, top(&e), (p, q)).is_none());
    let e = expr(format!("(max {ly} {ly})"));
    assert!(rescaled(&imp, &e, top(&e), (-p, q)).is_none());
}

/// An mlp on `mesh`, with catalog bug `bug` planted if given, emitted into `dir` and loaded.
fn mlp_case(dir: &std::path::Path, mesh: &str, bug: Option<&str>) -> Case {
    zoo_case(dir, "mlp", mesh, bug, false)
}

/// The zoo's tiny `model` plan on `mesh` (a full iteration unless `forward_only`), with
/// catalog `bug` planted: emitted and loaded.
pub(super) fn zoo_case(
    dir: &std::path::Path,
    model: &str,
    mesh: &str,
    bug: Option<&str>,
    forward_only: bool,
) -> Case {
    emit_and_load(
        dir,
        EmitOptions {
            model: model.into(),
            mlp: Default::default(),
            llama: LlamaConfig::default(),
            mesh: Mesh::parse(mesh).unwrap(),
            bug: bug.map(|b| shardproof_zoo::find_bug(b).unwrap()),
            forward_only,
            vocab_parallel: false,
        },
    )
}

/// `case` is refuted at the loss's `operator` with a hint containing `hint`, after inferring
/// fewer than `max_inferred` spec operators (the fast refutation skipped what is downstream).
fn assert_fast_refutation(case: &Case, operator: &str, hint: &str, max_inferred: usize) {
    let o = super::verify(case, &super::Options::default());
    assert_eq!(o.verdict, Verdict::Refuted);
    let f = o.failure.as_ref().unwrap();
    assert_eq!((f.output.as_str(), f.operator.as_str()), ("loss", operator));
    assert!(f.hint.as_deref().is_some_and(|h| h.contains(hint)), "{f:?}");
    assert!(
        o.spec_operators < max_inferred,
        "{} inferred",
        o.spec_operators
    );
}

/// Fast refutation: the loss, the first checked output, fails on the strongest evidence in the
/// forward pass, so the backward is never explored; the verdict and where relations stop are
/// those of the whole walk (the mlp's missing all-reduce stops at `add_1`). A correct plan
/// walks every operator.
#[test]
fn a_refuted_first_output_settles_the_verdict_before_the_backward() {
    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "tp=2", Some("tp-missing-allreduce"));
    let o = super::verify(&case, &super::Options::default());
    assert_eq!(o.verdict, Verdict::Refuted);
    let f = o.failure.as_ref().unwrap();
    assert_eq!((f.output.as_str(), f.operator.as_str()), ("loss", "add_1"));
    assert!(f.hint.as_deref().is_some_and(|h| h.contains("partial sum")));
    assert!(o.operators_skipped > 0, "{o:?}");

    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "tp=2", None);
    let o = super::verify(&case, &super::Options::default());
    assert_eq!(o.verdict, Verdict::Verified);
    assert_eq!(o.operators_skipped, 0);
}

/// Fast refutation past a view: gpt2's attention projection reduced over the dp group instead
/// of tp stops at `addmm_3` (the sum over all four ranks its collectives never complete, since
/// no later collective combines the tp ranks of what they computed from it). `addmm_3` is
/// viewed by the next operator, so it is judged once that view is committed; its consumers,
/// and the view's, are not explored (the whole walk inferred 106 operators before the loss
/// settled the verdict), and the report names the same operator with the same evidence.
#[test]
fn a_sum_over_the_wrong_group_that_nothing_completes_stops_exploration_past_its_view() {
    let dir = tempfile::tempdir().unwrap();
    let case = zoo_case(dir.path(), "gpt2", "dp=2,tp=2", Some("wrong-group"), false);
    assert_fast_refutation(&case, "addmm_3", "wrong process group", 80);
}

/// The llama dp2 x tp2 plan whose layer-0 attention all-reduce runs over dp: emitted (two
/// layers, the zoo's tiny sizes) and loaded.
fn llama_wrong_group(dir: &std::path::Path) -> Case {
    zoo_case(dir, "llama", "dp=2,tp=2", Some("wrong-group"), false)
}

/// The llama wrong-group plan: the tp ranks' partial sums of layer 0's attention output
/// (`r0.mm_3 + r1.mm_3`, which the ranks reduce over dp instead) reach later tp all-reduces
/// only through the norm's `h * rsqrt(mean(h^2))`, the FFN's `silu(w1 x) * w3 x`, the
/// residual `h + mlp(norm(h))` and the backward's products with gradients computed from `h`:
/// none is linear in the sum, so no later collective completes it. The walk that counted each
/// of these as linear in `h` (one operand at a time) reached layer 1's tp all-reduces.
#[test]
fn a_wrong_group_sum_that_reaches_collectives_only_through_nonlinear_products_is_never_completed() {
    let dir = tempfile::tempdir().unwrap();
    let case = llama_wrong_group(dir.path());
    let imp = impl_of(&case);
    let e: RecExpr<Term> = "(sum %r0:mm_3 %r1:mm_3)".parse().unwrap();
    assert!(super::evidence::never_completed(&case, &imp, [&e]));
}

/// The stricter walk still passes a partial sum through a product whose other operand is not
/// computed from it (a weight): tp=2 MLP, `relu`'s tp sum flows through `mm(relu, w2)` into
/// the tp all-reduce, which completes it.
#[test]
fn a_sum_through_a_product_with_a_weight_is_completed_by_a_later_collective() {
    let dir = tempfile::tempdir().unwrap();
    let case = zoo_case(dir.path(), "mlp", "tp=2", None, true);
    let imp = impl_of(&case);
    let e: RecExpr<Term> = "(sum %r0:relu %r1:relu)".parse().unwrap();
    assert!(!super::evidence::never_completed(&case, &imp, [&e]));
    // Through `relu`, nonlinear, nothing completes it.
    let e: RecExpr<Term> = "(sum %r0:add %r1:add)".parse().unwrap();
    assert!(super::evidence::never_completed(&case, &imp, [&e]));
}

/// The llama wrong-group plan is refuted at layer 0's residual add with the wrong group's
/// evidence, and the operators downstream are not explored (the whole walk inferred 171
/// operators before the loss settled the verdict).
#[test]
fn llama_wrong_group_stops_exploration_at_the_residual_add() {
    let dir = tempfile::tempdir().unwrap();
    let case = llama_wrong_group(dir.path());
    assert_fast_refutation(&case, "add_4", "wrong process group", 120);
}

/// A norm's mean of squares taken over each rank's tp shard of the hidden dim (deepseek
/// `norm-sharded-hidden`): the ranks' statistics go into `rsqrt(m + eps)` and no collective
/// ever combines them, so the evidence is final at `mean_1` and its consumers are not
/// explored (the whole walk inferred 243 operators before the loss settled the verdict); the
/// report names the same operator with the same evidence.
#[test]
fn a_statistic_over_a_shard_that_nothing_completes_stops_exploration() {
    let dir = tempfile::tempdir().unwrap();
    let case = zoo_case(
        dir.path(),
        "deepseek",
        "tp=2",
        Some("norm-sharded-hidden"),
        false,
    );
    assert_fast_refutation(&case, "mean_1", "each rank reduces its own shard", 150);
}

/// gpt2 tp=2 with the FFN's row-parallel all-reduce left out: `addmm_5`'s product is the
/// tp ranks' partial sum, never reduced, and nothing the ranks compute from it linearly
/// reaches a collective (the layer norm's `(h - mean(h)) * rsqrt(var(h))` stops it). `addmm_5`
/// is viewed by the next operator, so it is judged once that view is committed, on the
/// evidence at its own product; its consumers are not explored (the whole walk inferred 106
/// operators before the loss settled the verdict), and the report is the same.
#[test]
fn a_partial_sum_never_reduced_is_final_past_its_view_where_nothing_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let case = zoo_case(
        dir.path(),
        "gpt2",
        "tp=2",
        Some("tp-missing-allreduce"),
        false,
    );
    assert_fast_refutation(&case, "addmm_5", "never reduces it across ranks", 90);
}

/// A loss refuted where its inputs relate (the dp loss left unaveraged: a constant factor, no
/// strong evidence) settles too, since its diagnosis reads nothing the backward can change;
/// the report is the one the whole walk gave before (refuted at `loss`, off by a factor).
#[test]
fn a_loss_refuted_where_its_inputs_relate_settles_before_the_backward() {
    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "dp=2", Some("dp-loss-not-averaged"));
    let o = super::verify(&case, &super::Options::default());
    assert_eq!(o.verdict, Verdict::Refuted);
    let f = o.failure.as_ref().unwrap();
    assert_eq!((f.output.as_str(), f.operator.as_str()), ("loss", "loss"));
    assert!(
        f.hint
            .as_deref()
            .is_some_and(|h| h.contains("constant factor")),
        "{f:?}"
    );
    assert!(o.operators_skipped > 0, "{o:?}");
}

#[test]
fn progress_counts_every_needed_operator_and_stops_where_the_walk_settles() {
    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "tp=2", None);
    let progress = std::sync::Arc::new(crate::Progress::default());
    let opts = super::Options {
        progress: Some(progress.clone()),
        ..super::Options::default()
    };
    let o = super::verify(&case, &opts);
    assert_eq!(o.verdict, Verdict::Verified);
    let (done, total, current) = progress.snapshot();
    assert!(total > 0 && done == total, "{done}/{total}");
    assert!(
        case.spec.nodes.iter().any(|n| n.name == current),
        "{current}"
    );

    // A settled refutation leaves the operators it skipped undone.
    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "tp=2", Some("tp-missing-allreduce"));
    let o = super::verify(&case, &opts);
    assert_eq!(o.verdict, Verdict::Refuted);
    let (done, total, _) = progress.snapshot();
    assert_eq!(done + o.operators_skipped, total);
}

/// A llama on tp=2 with `layers` layers, forward only.
fn llama_layers(dir: &std::path::Path, layers: usize) -> Case {
    llama_tp2(dir, layers, true)
}

/// A llama on tp=2 with `layers` layers, the full training iteration.
fn llama_full_layers(dir: &std::path::Path, layers: usize) -> Case {
    llama_tp2(dir, layers, false)
}

/// `case` verified with a trace on one thread, with layer reuse on or off, its time zeroed
/// (so reports compare byte for byte).
fn traced_one_thread(case: &Case, reuse: bool) -> super::Outcome {
    let mut o = super::verify(
        case,
        &super::Options {
            trace: true,
            jobs: Some(1),
            reuse,
            ..super::Options::default()
        },
    );
    o.seconds = 0.0;
    o
}

/// A llama on tp=2 with `layers` layers.
fn llama_tp2(dir: &std::path::Path, layers: usize, forward_only: bool) -> Case {
    emit_and_load(
        dir,
        EmitOptions {
            model: "llama".into(),
            mlp: Default::default(),
            llama: LlamaConfig {
                layers,
                ..LlamaConfig::default()
            },
            mesh: Mesh::parse("tp=2").unwrap(),
            bug: None,
            forward_only,
            vocab_parallel: false,
        },
    )
}

/// A twin's relation renamed onto an operator's tensors is kept only where the check proves
/// it: the transpose of a column-parallel weight reuses its own solution, and the same
/// solution with the ranks' blocks swapped (a relation that does not hold) is rejected.
#[test]
fn a_reused_relation_is_kept_only_where_the_check_proves_it() {
    use super::reuse::{reuse, Solved};
    let dir = tempfile::tempdir().unwrap();
    let case = tiny_llama(dir.path());
    let imp = impl_of(&case);
    let spec = &case.spec;
    let metas = shardproof_interp::infer_graph(spec, &case.ops).metas;
    let rules: Vec<_> = crate::lemmas::library_for(&[])
        .iter()
        .flat_map(|l| l.rewrites())
        .collect();
    let opts = super::Options::default();
    // The first weight transpose whose weight the case relates.
    let (i, n) = (0..spec.nodes.len())
        .find_map(|n| {
            let node = &spec.nodes[n];
            if node.op().map(|o| o.to_string()).as_deref() != Some("aten.t.default") {
                return None;
            }
            let w = *node.inputs().first()?;
            let i = case.inputs.iter().position(|r| r.spec_value == w)?;
            Some((i, n))
        })
        .expect("a weight transpose");
    let w = case.inputs[i].spec_value;
    let state: HashMap<ValueId, State> = [(w, super::inputs::input_state(&case, i, &imp))].into();
    let Lowered::Term(t) = with_ctx(&case, |ctx| {
        crate::lower::lower(ctx, spec, &metas, None, n, 0)
    }) else {
        panic!("the transpose lowers to a term")
    };
    let v = ValueId::new(n, 0);
    let mut mismatches = HashMap::new();
    let State::Related(rel) = infer_one(
        &imp,
        &rules,
        &opts,
        &state,
        &t,
        None,
        &mut mismatches,
        v,
        false,
        &[],
        &Attempt::default(),
    ) else {
        panic!("the transpose relates")
    };
    assert!(rel.clean);
    let twin = |out: &Rel| std::sync::Arc::new(Solved::new(&t, &[], &state, out, false).unwrap());
    let lemmas = (&rules[..], &rules[..]);
    let kept = reuse(&imp, lemmas, &opts, &state, &t, &[], &[twin(&rel)])
        .expect("its own solution checks");
    assert_eq!(kept.rel.exprs, rel.exprs);

    // The ranks' blocks swapped: every leaf of rank 0 named as rank 1's and back.
    let swap = |e: &RecExpr<Term>| -> RecExpr<Term> {
        let text = e
            .to_string()
            .replace("%r0:", "%rX:")
            .replace("%r1:", "%r0:");
        text.replace("%rX:", "%r1:").parse().unwrap()
    };
    let wrong = Rel::of(rel.exprs.iter().map(swap).collect(), true);
    assert_ne!(wrong.exprs, rel.exprs);
    assert!(
        reuse(&imp, lemmas, &opts, &state, &t, &[], &[twin(&wrong)]).is_none(),
        "a relation that does not hold was kept"
    );
    // A twin that was itself reused passes on the lemmas its check needed, tried alone first:
    // that first try is a check too, so the wrong relation is rejected whatever lemmas the
    // twin names (none, the ones the right relation's check used, all of them).
    let all: std::sync::Arc<[usize]> = (0..rules.len()).collect();
    for used in [std::sync::Arc::from([]), kept.lemmas_used.clone(), all] {
        let checked = |out: &Rel| {
            let solved = Solved::new(&t, &[], &state, out, false).unwrap();
            std::sync::Arc::new(solved.checked_with(Some(used.clone())))
        };
        let again = reuse(&imp, lemmas, &opts, &state, &t, &[], &[checked(&rel)])
            .expect("its own solution checks with the twin's lemmas or all");
        assert_eq!(again.rel.exprs, rel.exprs);
        assert!(
            reuse(&imp, lemmas, &opts, &state, &t, &[], &[checked(&wrong)]).is_none(),
            "a relation that does not hold was kept on the twin's lemmas ({} of them)",
            used.len()
        );
    }

    // Across ranks (a sibling piece, `across_ranks`): the problem with the ranks swapped,
    // solved, renames back onto this one and checks; the wrong relation does not.
    let swap_rel = |r: &Rel| Rel {
        exprs: r.exprs.iter().map(swap).collect(),
        clean: r.clean,
        equal_leaves: r
            .equal_leaves
            .iter()
            .map(|g| {
                g.iter()
                    .map(|s| {
                        let s = s.as_str().replace("%r0:", "%rX:").replace("%r1:", "%r0:");
                        Symbol::from(s.replace("%rX:", "%r1:"))
                    })
                    .collect()
            })
            .collect(),
        equal_slices: r
            .equal_slices
            .iter()
            .map(|g| g.iter().map(swap).collect())
            .collect(),
        explored: Vec::new(),
    };
    let State::Related(input) = &state[&w] else {
        panic!("the weight relates")
    };
    let swapped_state: HashMap<ValueId, State> = [(w, State::Related(swap_rel(input)))].into();
    let sibling = Solved::new(&t, &[], &swapped_state, &swap_rel(&rel), false).unwrap();
    let found = super::reuse::across_ranks(&imp, &rules, &opts, (&state, &t, &[]), &sibling)
        .expect("the sibling's relation renames back and checks");
    assert_eq!(found.exprs, rel.exprs);
    let wrong_sibling = Solved::new(&t, &[], &swapped_state, &rel, false).unwrap();
    assert!(
        matches!(
            super::reuse::across_ranks(&imp, &rules, &opts, (&state, &t, &[]), &wrong_sibling),
            Err(super::reuse::Miss::Check)
        ),
        "a sibling's relation that does not hold here was kept"
    );
    // A sibling's constant multiple of a clean relation (a gradient's piece under data
    // parallelism, which symmetric ranks once also takes): over the weight taken twice, the
    // transpose is twice its clean relation, and the sibling's renames and checks with its
    // factor; the same with another factor is rejected.
    let scaled = |r: &Rel, p: i64| Rel {
        exprs: r
            .exprs
            .iter()
            .map(|e| format!("(scale {p} 1 {e})").parse().unwrap())
            .collect(),
        clean: false,
        ..r.clone()
    };
    let doubled: HashMap<ValueId, State> = [(w, State::Related(scaled(input, 2)))].into();
    let doubled_swapped: HashMap<ValueId, State> =
        [(w, State::Related(scaled(&swap_rel(input), 2)))].into();
    let sibling_times = |p: i64| {
        Solved::new(
            &t,
            &[],
            &doubled_swapped,
            &scaled(&swap_rel(&rel), p),
            false,
        )
        .unwrap()
    };
    let found =
        super::reuse::across_ranks(&imp, &rules, &opts, (&doubled, &t, &[]), &sibling_times(2))
            .expect("the sibling's multiple renames back and checks");
    assert_eq!(found.exprs, scaled(&rel, 2).exprs);
    assert!(
        matches!(
            super::reuse::across_ranks(&imp, &rules, &opts, (&doubled, &t, &[]), &sibling_times(3)),
            Err(super::reuse::Miss::Check)
        ),
        "a sibling's multiple at the wrong factor was kept"
    );

    // A twin on other ranks (a pipeline stage's first layer, whose twins are the previous
    // stage's): `reuse` renames ranks too, and still keeps only what checks.
    let twin_elsewhere = std::sync::Arc::new(sibling);
    let found = reuse(&imp, lemmas, &opts, &state, &t, &[], &[twin_elsewhere])
        .expect("a twin on other ranks renames back and checks");
    assert_eq!(found.rel.exprs, rel.exprs);
    assert!(
        reuse(
            &imp,
            lemmas,
            &opts,
            &state,
            &t,
            &[],
            &[std::sync::Arc::new(wrong_sibling)]
        )
        .is_none(),
        "a twin's relation on other ranks that does not hold here was kept"
    );
}

/// Twins' inputs match as sets, up to a renaming that keeps ranks: extraction sorts a
/// relation's expressions by their text, and a renaming reorders them.
#[test]
fn twins_inputs_match_in_any_order_and_across_ranks_only_one_to_one() {
    let dir = tempfile::tempdir().unwrap();
    let case = tiny_llama(dir.path());
    let imp = impl_of(&case);
    let rel = |exprs: &[&str]| Rel::of(exprs.iter().map(|e| e.parse().unwrap()).collect(), true);
    let twin = rel(&[
        "(cat 0 \"%r0:mm_95\" \"%r1:mm_95\")",
        "(cat 0 \"%r0:view_97\" \"%r1:view_97\")",
    ]);
    // The next layer's names sort the other way round.
    let next = rel(&[
        "(cat 0 \"%r0:view_122\" \"%r1:view_122\")",
        "(cat 0 \"%r0:mm_120\" \"%r1:mm_120\")",
    ]);
    assert!(super::reuse::alike(&imp, &twin, &next, false));
    // One tensor bound to two images.
    let split = rel(&[
        "(cat 0 \"%r0:mm_120\" \"%r1:mm_120\")",
        "(cat 0 \"%r0:mm_120\" \"%r1:view_122\")",
    ]);
    let twin_one = rel(&[
        "(cat 0 \"%r0:mm_95\" \"%r1:mm_95\")",
        "(cat 0 \"%r0:view_97\" \"%r1:mm_95\")",
    ]);
    assert!(!super::reuse::alike(&imp, &twin_one, &split, false));
    // The ranks' blocks swapped.
    let swapped = rel(&[
        "(cat 0 \"%r1:mm_120\" \"%r0:mm_120\")",
        "(cat 0 \"%r1:view_122\" \"%r0:view_122\")",
    ]);
    assert!(!super::reuse::alike(&imp, &twin, &swapped, false));
    // Across ranks (a sibling piece over another group's ranks) only one to one.
    assert!(super::reuse::alike(&imp, &twin, &swapped, true));
    let other_group = rel(&[
        "(cat 0 \"%r2:mm_95\" \"%r3:mm_95\")",
        "(cat 0 \"%r2:view_97\" \"%r3:view_97\")",
    ]);
    assert!(super::reuse::alike(&imp, &twin, &other_group, true));
    assert!(!super::reuse::alike(&imp, &twin, &other_group, false));
    let one_rank = rel(&[
        "(cat 0 \"%r2:mm_95\" \"%r2:mm_96\")",
        "(cat 0 \"%r2:view_97\" \"%r2:view_98\")",
    ]);
    assert!(!super::reuse::alike(&imp, &twin, &one_rank, true));
}

/// Sibling pieces' inputs match where a slice in a group of equal slices names the other of
/// two tensors the relation proves equal (extraction's tie-break among equal tensors, which
/// the data-parallel groups' pieces of the 16-rank DeepSeek's `_softmax_backward_data` and
/// `bmm_1` differ in), and only there: a slice of a tensor outside the group, or at another
/// offset, still fails; a layer's twin (not across ranks) still matches exactly.
#[test]
fn sibling_pieces_slices_match_up_to_the_inputs_equal_tensors_only() {
    let dir = tempfile::tempdir().unwrap();
    let case = tiny_llama(dir.path());
    let imp = impl_of(&case);
    let rel = |expr: &str, leaves: &[&str], slices: &[&str]| Rel {
        equal_leaves: vec![leaves.iter().map(|s| Symbol::from(*s)).collect()],
        equal_slices: vec![slices.iter().map(|e| e.parse().unwrap()).collect()],
        ..Rel::of(vec![expr.parse().unwrap()], true)
    };
    let first = rel(
        "(cat 0 \"%r0:a\" \"%r1:a\")",
        &["%r0:b", "%r0:c"],
        &["\"%r0:d\"", "(slice 0 0 2 \"%r0:b\")"],
    );
    let sibling = |slice: &str| {
        rel(
            "(cat 0 \"%r2:a\" \"%r3:a\")",
            &["%r2:b", "%r2:c"],
            &["\"%r2:d\"", slice],
        )
    };
    // The image of `b` is `%r2:b`; the sibling's slice names `%r2:c`, proven equal to it.
    assert!(super::reuse::alike(
        &imp,
        &first,
        &sibling("(slice 0 0 2 \"%r2:c\")"),
        true
    ));
    assert!(super::reuse::alike(
        &imp,
        &first,
        &sibling("(slice 0 0 2 \"%r2:b\")"),
        true
    ));
    // A tensor the sibling does not prove equal to the image, and another offset.
    assert!(!super::reuse::alike(
        &imp,
        &first,
        &sibling("(slice 0 0 2 \"%r2:e\")"),
        true
    ));
    assert!(!super::reuse::alike(
        &imp,
        &first,
        &sibling("(slice 0 2 4 \"%r2:c\")"),
        true
    ));
    // Equal in the first piece's relation only: the sibling's equal tensors decide.
    let unequal_here = Rel {
        equal_leaves: vec![vec![Symbol::from("%r2:b"), Symbol::from("%r2:e")]],
        ..sibling("(slice 0 0 2 \"%r2:c\")")
    };
    assert!(!super::reuse::alike(&imp, &first, &unequal_here, true));
    // A layer's twin keeps its exact match.
    let next_layer = rel(
        "(cat 0 \"%r0:a2\" \"%r1:a2\")",
        &["%r0:b2", "%r0:c2"],
        &["\"%r0:d2\"", "(slice 0 0 2 \"%r0:c2\")"],
    );
    assert!(!super::reuse::alike(&imp, &first, &next_layer, false));
}

/// A renaming keeps distinct tensors distinct where several compute the same operator from
/// the same images: with two accumulation steps each rank transposes each weight twice
/// (`t = t(w1_0)`, `t_4 = t(w1_0)`), and a twin's relation naming both (equal leaves) renames
/// onto both, not onto the first twice (`t = t`, a true relation naming fewer tensors than
/// inference finds, which made the 70b-tiny's later projections fail to rename).
#[test]
fn a_renaming_keeps_tensors_computed_alike_apart() {
    let dir = tempfile::tempdir().unwrap();
    emit_to_dir(
        &EmitOptions {
            model: "mlp".into(),
            mlp: shardproof_zoo::MlpConfig {
                batch: 4,
                ..Default::default()
            },
            llama: LlamaConfig::default(),
            mesh: Mesh::parse("tp=2").unwrap(),
            bug: None,
            forward_only: false,
            vocab_parallel: false,
        },
        &EmitExtras::default(),
        &shardproof_zoo::TrainOptions {
            grad_accum: 2,
            ..TrainOptions::PLAIN
        },
        &PipelineOptions::default(),
        dir.path(),
    )
    .unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let imp = impl_of(&case);
    // Rank 0's transposes of its first weight shard, in program order.
    let g = &case.program.ranks[0];
    let w = g
        .nodes
        .iter()
        .position(|n| n.name == "w1_0")
        .expect("the weight shard");
    let transposes: Vec<Symbol> = g
        .nodes
        .iter()
        .filter(|n| {
            n.op().map(|o| o.to_string()).as_deref() == Some("aten.t.default")
                && n.inputs().first().is_some_and(|x| x.node == w)
        })
        .map(|n| Symbol::from(leaf_symbol(0, &n.name)))
        .collect();
    assert_eq!(transposes.len(), 2, "{transposes:?}");
    let weight = Symbol::from(leaf_symbol(0, "w1_0"));
    let mut rel = Rel::of(Vec::new(), true);
    rel.equal_leaves = vec![transposes.clone()];
    let out = super::reuse::renamed(&imp, &[(weight, weight)], &rel).expect("renames");
    assert_eq!(out.equal_leaves, vec![transposes]);
}

/// A later layer's operators take the first layer's relations, checked, and the report is the
/// one full inference gives, byte for byte (timing aside).
#[test]
fn later_layers_reuse_the_first_layers_relations_and_report_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let case = llama_layers(dir.path(), 2);
    let run = |reuse: bool| traced_one_thread(&case, reuse);
    let (with, without) = (run(true), run(false));
    assert_eq!(with.verdict, Verdict::Verified);
    assert!(with.operators_reused > 0, "nothing was reused");
    assert_eq!(without.operators_reused, 0);
    let json = |o: &Outcome| report_text(o);
    assert_eq!(json(&with), json(&without));
}

/// The report as text (its `Debug` form: the crate has no JSON serializer of its own).
fn report_text(o: &Outcome) -> String {
    format!(
        "{:?}",
        (
            o.verdict,
            &o.certificate,
            &o.failure,
            &o.reason,
            &o.trace,
            o.spec_operators
        )
    )
}

/// One rank's program of the gathered-leaf case: its sequence chunk `g` (columns) all-gathered
/// along dim 0, split back into the members' chunks and concatenated along the columns
/// (SequenceParallel's gather of a gradient), and the same with one chunk computed on
/// (`relu`), which moves no collective result only.
fn gathered_rank() -> &'static str {
    "class GraphModule(torch.nn.Module):\n    def forward(self, g: \"f32[2, 2]\", a: \"f32[2, 2]\"):\n        all_gather_into_tensor: \"f32[4, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(g, 2, '0')\n        wait_tensor: \"f32[4, 2]\" = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor)\n        split = torch.ops.aten.split.Tensor(wait_tensor, 2)\n        getitem: \"f32[2, 2]\" = split[0]\n        getitem_1: \"f32[2, 2]\" = split[1]\n        cat: \"f32[2, 4]\" = torch.ops.aten.cat.default([getitem, getitem_1], 1)\n        relu: \"f32[2, 2]\" = torch.ops.aten.relu.default(getitem_1)\n        cat_1: \"f32[2, 4]\" = torch.ops.aten.cat.default([getitem, relu], 1)\n        add: \"f32[2, 4]\" = torch.ops.aten.add.Tensor(cat, cat_1)\n        return (add,)\n"
}

/// A leaf of an unclean relation passed on that only moves elements of an all-gather's result
/// (`cat(slice(all_gather(g)), ..)`) comes in with its definitions down to the collective, so
/// the e-graph learns it is the members' chunks laid out (`cat(g_0, g_1)`); a leaf computed on
/// (a `relu` of a chunk) does not, nor does any leaf of a clean relation. Every class the
/// definitions and the lemmas built holds on a run of the ranks.
#[test]
fn gathered_leaves_of_unclean_relations_come_in_with_their_layout() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, g: \"f32[2, 4]\", a: \"f32[2, 4]\"):\n        add: \"f32[2, 4]\" = torch.ops.aten.add.Tensor(g, a)\n        return (add,)\n";
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), gathered_rank()).unwrap();
    }
    let yaml = "version: 1\nname: gathered-leaf\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": tp\ninputs:\n  g: Shard(1)\n  a: Shard(1)\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let imp = impl_of(&case);
    let rules: Vec<_> = crate::lemmas::library_for(&[])
        .iter()
        .flat_map(|l| l.rewrites())
        .collect();
    let rank0 = |name: &str| ValueRef {
        rank: Some(0),
        value: case.program.ranks[0].find(name).expect(name),
    };
    // The spec's `add`, passed on unclean over the gathered leaf and over the computed one.
    let v = case.spec.find("add").unwrap();
    let ins = [ValueRef {
        rank: None,
        value: v,
    }];
    let unclean = "(aten.add.Tensor %r0:cat (aten.add.Tensor %r0:cat_1 (cat 1 %r0:a %r1:a) 1) 1)";
    let with = |clean: bool| -> HashMap<ValueId, State> {
        [(
            v,
            State::Related(Rel::of(vec![unclean.parse().unwrap()], clean)),
        )]
        .into()
    };

    // A clean relation's leaves are not unfolded.
    let mut eg = new_graph(&imp);
    let mut added = HashSet::new();
    assert!(!define_gathered_leaves(
        &mut eg,
        &imp,
        &with(true),
        &ins,
        &mut added
    ));
    assert!(added.is_empty());

    let mut eg = new_graph(&imp);
    let rel = Rel::of(vec![unclean.parse().unwrap()], false);
    add_relation(&mut eg, &imp, &rel);
    let mut added = HashSet::new();
    assert!(define_gathered_leaves(
        &mut eg,
        &imp,
        &with(false),
        &ins,
        &mut added
    ));
    assert!(added.contains(&rank0("cat")), "{added:?}");
    assert!(
        !added.contains(&rank0("cat_1")),
        "a computed leaf came in: {added:?}"
    );
    assert!(!added.contains(&rank0("relu")), "{added:?}");
    saturate(
        &mut eg,
        &rules,
        &super::Options::default(),
        &Attempt::default(),
    );
    let gathered = add_rec(&mut eg, &imp, &"(cat 1 %r0:g %r1:g)".parse().unwrap());
    let leaf = imp.leaf(&mut eg, rank0("cat"));
    eg.rebuild();
    assert_eq!(
        eg.find(gathered),
        eg.find(leaf),
        "the gathered leaf is not the chunks' layout"
    );
    let compared = crate::eval::classes_agree(&eg, &rank_values(&imp)).unwrap();
    assert!(compared > 0);
}

/// A middle layer repeats the layer before it, so all its operators take that layer's
/// relations, renamed and checked, but its checked outputs (the optimizer's new weights, never
/// reused): the unclean ones too (the attention backward's `grad x V^T` product stays unclean in
/// every layer) and their consumers (its `grad x V` product, whose check needs the definitions
/// of the value's tensors one level back). The reports are the ones full inference gives.
#[test]
fn a_middle_layer_is_reused_in_full_but_its_checked_outputs() {
    let run = |layers: usize, reuse: bool| {
        let dir = tempfile::tempdir().unwrap();
        let case = llama_full_layers(dir.path(), layers);
        traced_one_thread(&case, reuse)
    };
    let (two, three) = (run(2, true), run(3, true));
    assert_eq!(two.verdict, Verdict::Verified);
    assert_eq!(three.verdict, Verdict::Verified);
    // Operators the fast path decides take no e-graph either.
    let afresh = |o: &Outcome| o.spec_operators - o.operators_reused - o.operators_fast;
    assert_eq!(
        afresh(&three) - afresh(&two),
        three.certificate.len() - two.certificate.len(),
        "operators of the middle layer inferred afresh"
    );
    assert_eq!(report_text(&two), report_text(&run(2, false)));
}

/// The reference for [`reduction_path`]: the search as it read the program before its table
/// (`SearchGraph`) and memo, naming each visited node's operator and scanning the tables, with
/// rank values hashed into `Impl::consumers` and a visited set; bounded at `max_seen` tensors.
fn reduction_path_per_visit(
    case: &Case,
    imp: &Impl,
    from: ValueRef,
    summands: &[std::collections::BTreeSet<usize>],
    max_seen: usize,
) -> (bool, bool, bool) {
    let (mut reduced, mut used_unreduced, mut truncated) = (false, false, false);
    let mut seen: HashSet<ValueRef> = HashSet::new();
    let mut frontier = vec![from];
    for _ in 0..1024 {
        let mut next = Vec::new();
        for v in frontier {
            for &(r, n) in imp.consumers.get(&v).map_or(&[][..], Vec::as_slice) {
                let node = &case.program.ranks[r].nodes[n];
                let collective = node.op().is_some_and(|o| o.namespace == "_c10d_functional");
                if collective {
                    if let Some(ranks) = super::evidence::collective_ranks(imp, r, n) {
                        let met = summands
                            .iter()
                            .filter(|s| s.iter().any(|r| ranks.contains(r)))
                            .count();
                        if met >= 2 {
                            reduced = true;
                            continue;
                        }
                    }
                }
                let op = node.op().map(|o| o.to_string()).unwrap_or_default();
                let linear = collective
                    || node.args().iter().enumerate().any(|(i, a)| {
                        let mut vals = Vec::new();
                        a.values(&mut vals);
                        crate::lemmas::may_be_linear_in(&op, i)
                            && vals.into_iter().any(|x| {
                                imp.canon(ValueRef {
                                    rank: Some(r),
                                    value: x,
                                }) == v
                            })
                    });
                if !linear {
                    used_unreduced |= Some(r) == from.rank;
                    continue;
                }
                for k in 0..node.outputs.len() {
                    let out = ValueRef {
                        rank: Some(r),
                        value: ValueId::new(n, k),
                    };
                    if seen.len() >= max_seen {
                        truncated = true;
                    } else if seen.insert(out) {
                        next.push(out);
                    }
                }
            }
        }
        if next.is_empty() {
            return (reduced, used_unreduced, truncated);
        }
        frontier = next;
    }
    (reduced, used_unreduced, true)
}

/// The search for a collective that reduces a partial sum answers from its table of rank
/// nodes and its memo as the search that reads each node afresh does, for every rank tensor
/// of a correct plan and of one missing its all-reduce, asked twice (the second answer is
/// the memo's), with the summands one rank each and the ranks split in two; and so it does
/// where its bound cuts it off (bounds these programs reach: which collectives and operators
/// a cut-off search meets depends on the order it visits tensors in).
#[test]
fn the_reduction_search_answers_from_its_table_and_memo_as_afresh() {
    use super::evidence::{reduction_path, reduction_path_within};
    use std::collections::BTreeSet;
    for (mesh, bug) in [("dp=2,tp=2", None), ("tp=2", Some("tp-missing-allreduce"))] {
        let dir = tempfile::tempdir().unwrap();
        let case = mlp_case(dir.path(), mesh, bug);
        let imp = impl_of(&case);
        let ranks = case.program.ranks.len();
        let singles: Vec<BTreeSet<usize>> = (0..ranks).map(|r| BTreeSet::from([r])).collect();
        let halves: Vec<BTreeSet<usize>> =
            vec![(0..ranks / 2).collect(), (ranks / 2..ranks).collect()];
        let mut tensors: Vec<ValueRef> = imp.consumers.keys().copied().collect();
        tensors.sort_unstable();
        assert!(tensors.len() > 20, "{mesh}: {} tensors", tensors.len());
        let mut reduced = 0;
        let (mut truncated, mut cut_differs) = (0, 0);
        for summands in [&singles, &halves] {
            for &t in &tensors {
                let want = reduction_path_per_visit(&case, &imp, t, summands, 4096);
                for max_seen in [1, 2, 3, 5, 8, 13] {
                    let p = reduction_path_within(&case, &imp, t, summands, max_seen);
                    let cut = reduction_path_per_visit(&case, &imp, t, summands, max_seen);
                    assert_eq!(
                        (p.reduced, p.used_unreduced, p.truncated),
                        cut,
                        "{mesh} {bug:?}: {t:?} over {summands:?} within {max_seen}"
                    );
                    truncated += usize::from(cut.2);
                    cut_differs += usize::from(cut.0 != want.0 || cut.1 != want.1);
                }
                for _ in 0..2 {
                    let p = reduction_path(&case, &imp, t, summands);
                    assert_eq!(
                        (p.reduced, p.used_unreduced, p.truncated),
                        want,
                        "{mesh} {bug:?}: {t:?} over {summands:?}"
                    );
                }
                reduced += usize::from(want.0);
            }
        }
        // Both answers occur in the correct plan (its partial sums reach their all-reduces);
        // the plan missing its only all-reduce has none to reach.
        if bug.is_none() {
            assert!(
                reduced > 0 && reduced < 2 * tensors.len(),
                "{mesh}: {reduced}"
            );
        } else {
            assert_eq!(reduced, 0, "{mesh} {bug:?}");
        }
        // The small bounds cut searches off, and some cut-off searches miss a collective or an
        // operator the whole search meets: the comparison covers the answers a bound changes.
        assert!(truncated > 0, "{mesh}: no search cut off");
        if bug.is_none() {
            assert!(cut_differs > 0, "{mesh}: no answer changed by a bound");
        }
        let memo = imp.reduction_paths.lock().unwrap();
        // On two ranks the halves are the single ranks: the same question.
        let splits = if singles == halves { 1 } else { 2 };
        assert_eq!(
            memo.len(),
            splits * tensors.len(),
            "{mesh}: one entry per question"
        );
    }
}

/// The evidence checks' indexes answer as the scans of every rank's program they replace: the
/// calls of each operator in rank and program order ([`Impl::calls_of`]), and each leaf of a
/// relation as the first value of its name ([`super::evidence::expr_leaves`], `Graph::find`).
#[test]
fn the_call_and_leaf_indexes_answer_as_a_scan_of_the_programs() {
    use super::evidence::expr_leaves;
    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "dp=2,tp=2", None);
    let imp = impl_of(&case);
    let mut ops: Vec<String> = Vec::new();
    for g in &case.program.ranks {
        for nd in &g.nodes {
            if let Some(op) = nd.op().map(|o| o.to_string()) {
                if !ops.contains(&op) {
                    ops.push(op);
                }
            }
        }
    }
    assert!(ops.len() > 5, "{ops:?}");
    for op in ops
        .iter()
        .map(String::as_str)
        .chain(["aten.no_such_op.default"])
    {
        let scanned: Vec<(usize, usize)> = case
            .program
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(r, g)| {
                g.nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, nd)| nd.op().map(|o| o.to_string()).as_deref() == Some(op))
                    .map(move |(n, _)| (r, n))
            })
            .collect();
        assert_eq!(imp.calls_of(op), scanned.as_slice(), "{op}");
    }
    let mut leaves = 0;
    for (r, g) in case.program.ranks.iter().enumerate() {
        for v in g.values() {
            let name = g.value_name(v);
            let mut e = egg::RecExpr::default();
            e.add(crate::term::Term::Op(
                egg::Symbol::from(crate::term::leaf_symbol(r, name)),
                Vec::new(),
            ));
            let want = g.find(name).map(|value| ValueRef {
                rank: Some(r),
                value,
            });
            assert_eq!(expr_leaves(&imp, &e), want.into_iter().collect::<Vec<_>>());
            leaves += 1;
        }
    }
    assert!(leaves > 20, "{leaves} leaves");
}

/// `has_clean_descendant` read up to the last node with a state answers as the pass to the end
/// of the spec graph, mid-walk (only nodes up to `k` have states) and at the horizon itself: a
/// state only at node `k`, the last one read, must still be found.
#[test]
fn a_clean_descendant_is_found_up_to_the_last_node_with_a_state() {
    use super::diagnose::has_clean_descendant;
    let dir = tempfile::tempdir().unwrap();
    let case = mlp_case(dir.path(), "dp=2,tp=2", None);
    let spec = &case.spec;
    let clean = State::Related(Rel {
        exprs: Vec::new(),
        clean: true,
        equal_leaves: Vec::new(),
        equal_slices: Vec::new(),
        explored: Vec::new(),
    });
    let is_float = |_: &ValueId| true;
    let end = spec.nodes.len() - 1;
    let (mut found, mut asked) = (0, 0);
    for k in 0..spec.nodes.len() {
        // Mid-walk: node k just committed, every node before it unclean, node k clean.
        let mut state: HashMap<ValueId, State> = HashMap::new();
        for n in 0..=k {
            for o in 0..spec.nodes[n].outputs.len() {
                let s = if n == k {
                    clean.clone()
                } else {
                    State::Unrelated("test".into())
                };
                state.insert(ValueId::new(n, o), s);
            }
        }
        for v in spec.values().filter(|v| v.node < k) {
            let bounded = has_clean_descendant(spec, &state, &is_float, v, k);
            asked += 1;
            found += usize::from(bounded);
            assert_eq!(
                bounded,
                has_clean_descendant(spec, &state, &is_float, v, end),
                "{v:?} at {k}"
            );
        }
    }
    assert!(found > 0 && found < asked, "{found} of {asked}");
}
