//! The vocab-parallel cross-entropy backward against the spec's
//! `_log_softmax_backward_data(nll_loss_backward(..))`.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_prove::expr::{Arena, ExprId, Func, SymbolKind};
use shardproof_prove::stage::{plan_until, prove_stages};
use shardproof_prove::{PlanOptions, ProveConfig, Verdict};
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The four-layer dp=2,pp=2,tp=2 vocab-parallel llama of `preset_full_iteration.rs`, cut as
/// `prove_presets` cuts it.
fn emit_llama(dir: &Path) -> (shardproof_case::Case, PlanOptions) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(4, 8, 8),
        mesh: Mesh::parse("dp=2,pp=2,tp=2").unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: true,
    };
    let pipeline = PipelineOptions {
        microbatches: 2,
        ..PipelineOptions::default()
    };
    zoo_emit::emit(dir, &opts, &EmitExtras::default(), &pipeline);
    layer_cuts::cut_at_modules(dir, true);
    let micro = layer_cuts::microbatch_cuts_at_modules(dir, true);
    let mut scales = layer_cuts::backward_scales(dir);
    scales.extend(layer_cuts::microbatch_backward_scales(dir, &micro));
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let plan = PlanOptions {
        scales,
        outputs_apart: true,
        microbatch_cuts: micro,
        ..PlanOptions::default()
    };
    (case, plan)
}

/// A zoo preset's full iteration (`name`, e.g. `llama3-405b-tiny`), cut as `prove_presets`
/// cuts it.
fn emit_preset(dir: &Path, name: &str) -> (shardproof_case::Case, PlanOptions) {
    let preset = shardproof_zoo::find_preset(name).expect("a zoo preset");
    let (opts, extras, pipeline) = preset.request();
    shardproof_zoo::emit_to_dir(
        &opts,
        &extras,
        &shardproof_zoo::TrainOptions::PLAIN,
        &pipeline,
        dir,
    )
    .unwrap();
    layer_cuts::cut_at_modules(dir, true);
    let micro = layer_cuts::microbatch_cuts_at_modules(dir, true);
    let mut scales = layer_cuts::backward_scales(dir);
    scales.extend(layer_cuts::microbatch_backward_scales(dir, &micro));
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let plan = PlanOptions {
        scales,
        outputs_apart: true,
        microbatch_cuts: micro,
        ..PlanOptions::default()
    };
    (case, plan)
}

/// Proves the stage of `plan` whose target is ``cut `name` `` alone (on its own clock of
/// `limit` seconds).
fn prove_cut(
    case: &shardproof_case::Case,
    opts: &PlanOptions,
    name: &str,
    limit: u64,
) -> shardproof_prove::Proof {
    let plan = plan_until(case, true, opts).unwrap();
    let target = format!("cut `{name}`");
    let stage = plan
        .distinct
        .iter()
        .copied()
        .find(|&i| plan.stages[i].target == target)
        .unwrap_or_else(|| panic!("no stage {target}"));
    let cfg = ProveConfig {
        time_limit: Some(Duration::from_secs(limit)),
        ..ProveConfig::default()
    };
    prove_stages(&plan, &[stage], &cfg, 1).remove(0).2
}

#[test]
fn the_vocab_parallel_llama_s_first_backward_cut_is_proved_in_normal_form() {
    // The cut after the last layer's MLP backward: the cross-entropy backward, the lm_head and
    // final norm backward and the MLP's, on a dp=2,pp=2,tp=2 mesh with the vocabulary split.
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_llama(dir.path());
    let p = prove_cut(&case, &opts, "add_30", 120);
    assert_eq!(p.verdict, Verdict::Proved, "{:?}", p.message);
    assert_eq!(
        p.layers.keys().collect::<Vec<_>>(),
        ["normal-form"],
        "{:?}",
        p.layers
    );
}

/// Measurement, not a check: every distinct stage of the vocab-parallel llama (or of preset
/// `SHARDPROOF_CE_PRESET`), its verdict, layer and time (`SHARDPROOF_CE_DIR` keeps the emitted
/// case there; `SHARDPROOF_CE_LIMIT` seconds a stage, default 60; `SHARDPROOF_CE_ONLY`:
/// comma-separated parts of the targets proved).
#[test]
#[ignore = "measurement: prints each stage's verdict and time"]
fn measure_vocab_parallel_llama_stages() {
    let keep = std::env::var("SHARDPROOF_CE_DIR").ok();
    let tmp = tempfile::tempdir().unwrap();
    let dir = keep.as_deref().map(Path::new).unwrap_or(tmp.path());
    std::fs::create_dir_all(dir).unwrap();
    let (case, opts) = match std::env::var("SHARDPROOF_CE_PRESET") {
        Ok(name) => emit_preset(dir, &name),
        Err(_) => emit_llama(dir),
    };
    let limit: u64 = std::env::var("SHARDPROOF_CE_LIMIT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let plan = plan_until(&case, true, &opts).unwrap();
    eprintln!(
        "{} stages, {} distinct",
        plan.stages.len(),
        plan.distinct.len()
    );
    let only = std::env::var("SHARDPROOF_CE_ONLY").unwrap_or_default();
    for &i in &plan.distinct {
        if !only.split(',').any(|o| plan.stages[i].target.contains(o)) {
            continue;
        }
        let cfg = ProveConfig {
            time_limit: Some(Duration::from_secs(limit)),
            ..ProveConfig::default()
        };
        let t = Instant::now();
        let out = prove_stages(&plan, &[i], &cfg, 1);
        for (_, _, p) in &out {
            if std::env::var("SHARDPROOF_CE_VERBOSE").is_ok() {
                if let Some(r) = &p.reduction {
                    for input in &r.inputs {
                        eprintln!("  reduced {input:?}");
                    }
                }
            }
            eprintln!(
                "stage {i} {}: {:?} {:?} {:.1}s {:?}",
                plan.stages[i].target,
                p.verdict,
                p.layers,
                t.elapsed().as_secs_f64(),
                p.message
            );
        }
    }
}

/// Labels (rows of logits) in the hand-written fixture.
const N: usize = 4;

/// The spec: the logits' gradient of the mean cross-entropy of `N` rows over `v` classes,
/// written as the spec's trace writes it (`_log_softmax_backward_data` of `nll_loss_backward`
/// with the forward's total weight).
fn spec(v: usize) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{N}, {v}]", labels: "i64[{N}]"):
        _log_softmax: "f32[{N}, {v}]" = torch.ops.aten._log_softmax.default(x, 1, False)
        nll_loss_forward = torch.ops.aten.nll_loss_forward.default(_log_softmax, labels, None, 1, -100)
        loss: "f32[]" = nll_loss_forward[0]
        total_weight: "f32[]" = nll_loss_forward[1]
        full_1: "f32[]" = torch.ops.aten.full.default([], 1.0, dtype = torch.float32, device = device(type='cpu'), pin_memory = False)
        nll_loss_backward: "f32[{N}, {v}]" = torch.ops.aten.nll_loss_backward.default(full_1, _log_softmax, labels, None, 1, -100, total_weight)
        grad: "f32[{N}, {v}]" = torch.ops.aten._log_softmax_backward_data.default(nll_loss_backward, _log_softmax, 1, torch.float32)
        return (grad,)
"#
    )
}

/// Rank `r`'s logits' gradient over its `rows` classes `[r·rows, (r+1)·rows)` as the zoo emits
/// Megatron's vocab-parallel cross-entropy backward: `(exp(x - max) / Σ exp(x - max) -
/// one_hot) / N`, the max and the sum all-reduced, the one-hot `[label - start == k]` by
/// `arange` masked to the labels inside the range.
fn rank(r: usize, rows: usize) -> String {
    let (start, end) = (r * rows, (r + 1) * rows);
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{N}, {rows}]", labels: "i64[{N}]"):
        amax: "f32[{N}, 1]" = torch.ops.aten.amax.default(x, [1], True)
        all_reduce: "f32[{N}, 1]" = torch.ops._c10d_functional.all_reduce.default(amax, 'max', 'tp')
        wait_tensor: "f32[{N}, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        sub: "f32[{N}, {rows}]" = torch.ops.aten.sub.Tensor(x, wait_tensor)
        lt: "b8[{N}]" = torch.ops.aten.lt.Scalar(labels, {start})
        ge: "b8[{N}]" = torch.ops.aten.ge.Scalar(labels, {end})
        bitwise_or: "b8[{N}]" = torch.ops.aten.bitwise_or.Tensor(lt, ge)
        sub_1: "i64[{N}]" = torch.ops.aten.sub.Scalar(labels, {start})
        masked_fill: "i64[{N}]" = torch.ops.aten.masked_fill.Scalar(sub_1, bitwise_or, 0)
        unsqueeze: "i64[{N}, 1]" = torch.ops.aten.unsqueeze.default(masked_fill, 1)
        unsqueeze_1: "b8[{N}, 1]" = torch.ops.aten.unsqueeze.default(bitwise_or, 1)
        exp: "f32[{N}, {rows}]" = torch.ops.aten.exp.default(sub)
        sum_1: "f32[{N}, 1]" = torch.ops.aten.sum.dim_IntList(exp, [1], True)
        all_reduce_2: "f32[{N}, 1]" = torch.ops._c10d_functional.all_reduce.default(sum_1, 'sum', 'tp')
        wait_tensor_2: "f32[{N}, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce_2)
        div: "f32[{N}, {rows}]" = torch.ops.aten.div.Tensor(exp, wait_tensor_2)
        arange: "i64[{rows}]" = torch.ops.aten.arange.start(0, {rows}, device = device(type='cpu'), pin_memory = False)
        eq: "b8[{N}, {rows}]" = torch.ops.aten.eq.Tensor(unsqueeze, arange)
        bitwise_not: "b8[{N}, 1]" = torch.ops.aten.bitwise_not.default(unsqueeze_1)
        bitwise_and: "b8[{N}, {rows}]" = torch.ops.aten.bitwise_and.Tensor(eq, bitwise_not)
        _to_copy: "f32[{N}, {rows}]" = torch.ops.aten._to_copy.default(bitwise_and, dtype = torch.float32)
        sub_2: "f32[{N}, {rows}]" = torch.ops.aten.sub.Tensor(div, _to_copy)
        grad: "f32[{N}, {rows}]" = torch.ops.aten.div.Scalar(sub_2, {N})
        return (grad,)
"#
    )
}

/// The case of `tp` ranks of `rows` classes each, rank `r`'s program edited by `edit(r, text)`;
/// the labels never equal the negative ignore_index (`assume: ignore-index: unused`).
fn case(
    dir: &Path,
    tp: usize,
    rows: usize,
    edit: &dyn Fn(usize, String) -> String,
) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec(tp * rows)).unwrap();
    let mut graphs = Vec::new();
    for r in 0..tp {
        let name = format!("r{r}.py");
        std::fs::write(dir.join(&name), edit(r, rank(r, rows))).unwrap();
        graphs.push(name);
    }
    std::fs::write(
        dir.join("case.yaml"),
        format!(
            "version: 1\nname: vocab-parallel-ce-backward\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {tp} }}\n  graphs: [{}]\n  groups:\n    \"tp\": tp\ninputs:\n  x: {{ tp: Shard(1) }}\n  labels: Replicate()\noutputs:\n  grad: {{ tp: Shard(1) }}\nassume:\n  ignore-index: unused\n",
            graphs.join(", ")
        ),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The case's proof on the symbolic layers alone (no random interpreter run first), at the
/// case's own sizes.
fn prove(case: &shardproof_case::Case) -> shardproof_prove::Proof {
    let cfg = ProveConfig {
        run_first: false,
        reduce: false,
        time_limit: Some(Duration::from_secs(60)),
        ..ProveConfig::default()
    };
    shardproof_prove::prove_case(case, &cfg)
}

/// Rank `r`'s program with `from` replaced by `to` (the pattern must be there).
fn replace(text: String, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from}");
    text.replace(from, to)
}

#[test]
fn the_vocab_parallel_backward_is_equal_to_the_spec_in_normal_form() {
    for (tp, rows) in [(2, 4), (4, 4), (2, 8)] {
        let dir = tempfile::tempdir().unwrap();
        let p = prove(&case(dir.path(), tp, rows, &|_, g| g));
        assert_eq!(p.verdict, Verdict::Proved, "tp {tp}: {:?}", p.message);
        // Every element in normal form: the shift cancels, the spec's row sum of the one-hot
        // is 1 and the ranks' masked one-hot at `label - start` is the spec's selector.
        let goals = N * tp * rows;
        assert_eq!(
            p.layers,
            BTreeMap::from([("normal-form".to_string(), goals)]),
            "tp {tp}"
        );
    }
}

/// The case with rank 1's program edited, proved on the symbolic layers alone: refuted with a
/// counterexample the interpreter confirms.
fn assert_refuted(what: &str, edit: &dyn Fn(usize, String) -> String) {
    let dir = tempfile::tempdir().unwrap();
    let p = prove(&case(dir.path(), 2, 4, edit));
    assert_eq!(p.verdict, Verdict::Refuted, "{what}: {:?}", p.message);
    assert!(p.counterexample.is_some(), "{what}: {:?}", p.message);
}

#[test]
fn a_numerator_shifted_by_the_local_max_is_refuted() {
    assert_refuted("local max", &|r, g| {
        if r != 1 {
            return g;
        }
        replace(
            g,
            "div: \"f32[4, 4]\" = torch.ops.aten.div.Tensor(exp, wait_tensor_2)",
            "sub_9: \"f32[4, 4]\" = torch.ops.aten.sub.Tensor(x, amax)\n        exp_9: \"f32[4, 4]\" = torch.ops.aten.exp.default(sub_9)\n        div: \"f32[4, 4]\" = torch.ops.aten.div.Tensor(exp_9, wait_tensor_2)",
        )
    });
}

#[test]
fn a_one_hot_without_the_shard_offset_is_refuted() {
    assert_refuted("no offset", &|r, g| {
        if r != 1 {
            return g;
        }
        replace(
            g,
            "torch.ops.aten.sub.Scalar(labels, 4)",
            "torch.ops.aten.sub.Scalar(labels, 0)",
        )
    });
}

#[test]
fn a_one_hot_not_masked_to_the_shard_is_refuted() {
    // The masked index is 0 for a label outside the shard: unmasked, its one-hot hits the
    // shard's first class.
    assert_refuted("no mask", &|r, g| {
        if r != 1 {
            return g;
        }
        replace(
            g,
            "torch.ops.aten._to_copy.default(bitwise_and,",
            "torch.ops.aten._to_copy.default(eq,",
        )
    });
}

#[test]
fn a_wrong_token_count_is_refuted() {
    for wrong in [2 * N, N / 2] {
        assert_refuted("divisor", &|_, g| {
            replace(
                g,
                &format!("torch.ops.aten.div.Scalar(sub_2, {N})"),
                &format!("torch.ops.aten.div.Scalar(sub_2, {wrong})"),
            )
        });
    }
}

/// `exp(x_i - m)·recip(Σ_j exp(x_j - m))` over `xs`.
fn shifted_weight(ar: &mut Arena, xs: &[ExprId], i: usize, num: ExprId, den: ExprId) -> ExprId {
    let e = |ar: &mut Arena, x: ExprId, m: ExprId| {
        let d = ar.sub(x, m).unwrap();
        ar.app(Func::Exp, vec![d]).unwrap()
    };
    let top = e(ar, xs[i], num);
    let bottom: Vec<_> = xs.iter().map(|&x| e(ar, x, den)).collect();
    let s = ar.sum(&bottom).unwrap();
    let r = ar.recip(s).unwrap();
    ar.mul(top, r).unwrap()
}

#[test]
fn a_shift_common_to_numerator_and_denominator_cancels_in_normal_form() {
    let mut ar = Arena::default();
    let xs: Vec<_> = (0..4)
        .map(|i| ar.symbol(&format!("x{i}"), SymbolKind::Real).unwrap())
        .collect();
    let zero = ar.int(0).unwrap();
    let plain = shifted_weight(&mut ar, &xs, 1, zero, zero);
    // The spec's max over the row, the ranks' all-reduced max of two shard maxes, and an
    // opaque value: one normal form.
    let row_max = ar.app(Func::Max, xs.clone()).unwrap();
    let m0 = ar.app(Func::Max, xs[..2].to_vec()).unwrap();
    let m1 = ar.app(Func::Max, xs[2..].to_vec()).unwrap();
    let reduced_max = ar.max(m0, m1).unwrap();
    let opaque = ar.symbol("m", SymbolKind::Real).unwrap();
    for m in [row_max, reduced_max, opaque] {
        assert_eq!(
            shifted_weight(&mut ar, &xs, 1, m, m),
            plain,
            "{}",
            ar.render(m, 80)
        );
    }
    // A numerator shifted by another value than its denominator is another weight.
    assert_ne!(shifted_weight(&mut ar, &xs, 1, m0, reduced_max), plain);
    assert_ne!(shifted_weight(&mut ar, &xs, 1, opaque, row_max), plain);
}

/// Masks and one-hots over an index `t` in `[0, BOUND)` and a real `x`: the trees whose normal
/// forms the selector rules rewrite (comparisons of `where`s, of comparisons, products of a
/// selector with other comparisons), checked against direct evaluation at every `t`.
mod selector_rules_against_evaluation {
    use super::*;
    use proptest::prelude::*;
    use shardproof_prove::eval::ExactEval;
    use shardproof_prove::expr::Coeff;

    const BOUND: i64 = 6;

    #[derive(Clone, Debug)]
    enum Tree {
        Index,
        Real,
        Const(i64),
        Add(Box<Tree>, Box<Tree>),
        Sub(Box<Tree>, Box<Tree>),
        Mul(Box<Tree>, Box<Tree>),
        Eq(Box<Tree>, Box<Tree>),
        Gt(Box<Tree>, Box<Tree>),
        Ge(Box<Tree>, Box<Tree>),
        Not(Box<Tree>),
        Where(Box<Tree>, Box<Tree>, Box<Tree>),
    }

    fn tree() -> impl Strategy<Value = Tree> {
        let leaf = prop_oneof![
            3 => Just(Tree::Index),
            1 => Just(Tree::Real),
            2 => (-2i64..8).prop_map(Tree::Const),
        ];
        leaf.prop_recursive(5, 40, 3, |inner| {
            let b = |t: Tree| Box::new(t);
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(move |(x, y)| Tree::Add(b(x), b(y))),
                (inner.clone(), inner.clone()).prop_map(move |(x, y)| Tree::Sub(b(x), b(y))),
                (inner.clone(), inner.clone()).prop_map(move |(x, y)| Tree::Mul(b(x), b(y))),
                (inner.clone(), inner.clone()).prop_map(move |(x, y)| Tree::Eq(b(x), b(y))),
                (inner.clone(), inner.clone()).prop_map(move |(x, y)| Tree::Gt(b(x), b(y))),
                (inner.clone(), inner.clone()).prop_map(move |(x, y)| Tree::Ge(b(x), b(y))),
                inner.clone().prop_map(move |x| Tree::Not(b(x))),
                (inner.clone(), inner.clone(), inner).prop_map(move |(c, x, y)| Tree::Where(
                    b(c),
                    b(x),
                    b(y)
                )),
            ]
        })
    }

    fn build(ar: &mut Arena, t: &Tree, index: ExprId, real: ExprId) -> ExprId {
        let go = |ar: &mut Arena, x: &Tree| build(ar, x, index, real);
        match t {
            Tree::Index => index,
            Tree::Real => real,
            Tree::Const(c) => ar.int(*c).unwrap(),
            Tree::Add(x, y) | Tree::Sub(x, y) | Tree::Mul(x, y) => {
                let (x, y) = (go(ar, x), go(ar, y));
                match t {
                    Tree::Add(..) => ar.add(x, y),
                    Tree::Sub(..) => ar.sub(x, y),
                    _ => ar.mul(x, y),
                }
                .unwrap()
            }
            Tree::Eq(x, y) | Tree::Gt(x, y) | Tree::Ge(x, y) => {
                let (x, y) = (go(ar, x), go(ar, y));
                match t {
                    Tree::Eq(..) => ar.eq(x, y),
                    Tree::Gt(..) => ar.gt(x, y),
                    _ => ar.ge(x, y),
                }
                .unwrap()
            }
            // `bitwise_not` as the lowering writes it: `x == 0`.
            Tree::Not(x) => {
                let x = go(ar, x);
                ar.app(Func::IsZero, vec![x]).unwrap()
            }
            Tree::Where(c, x, y) => {
                let (c, x, y) = (go(ar, c), go(ar, x), go(ar, y));
                ar.select(c, x, y).unwrap()
            }
        }
    }

    fn eval(t: &Tree, index: i64, real: i64) -> i128 {
        let go = |x: &Tree| eval(x, index, real);
        match t {
            Tree::Index => i128::from(index),
            Tree::Real => i128::from(real),
            Tree::Const(c) => i128::from(*c),
            Tree::Add(x, y) => go(x) + go(y),
            Tree::Sub(x, y) => go(x) - go(y),
            Tree::Mul(x, y) => go(x) * go(y),
            Tree::Eq(x, y) => i128::from(go(x) == go(y)),
            Tree::Gt(x, y) => i128::from(go(x) > go(y)),
            Tree::Ge(x, y) => i128::from(go(x) >= go(y)),
            Tree::Not(x) => i128::from(go(x) == 0),
            Tree::Where(c, x, y) => {
                if go(c) != 0 {
                    go(x)
                } else {
                    go(y)
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

        #[test]
        fn normal_forms_of_masks_evaluate_as_their_trees(t in tree(), real in -3i64..9) {
            let mut ar = Arena::default();
            let index = ar.symbol("t", SymbolKind::Index(BOUND as u32)).unwrap();
            let x = ar.symbol("x", SymbolKind::Real).unwrap();
            let e = build(&mut ar, &t, index, x);
            for value in 0..BOUND {
                let want = eval(&t, value, real);
                let point = vec![Coeff::from_integer(value), Coeff::from_integer(real)];
                let got = ExactEval::new(&ar, point).value(e);
                prop_assert_eq!(
                    got,
                    Some(Coeff::from_integer(want as i64)),
                    "t = {}, x = {}: {}",
                    value,
                    real,
                    ar.render(e, 200)
                );
            }
        }
    }
}
