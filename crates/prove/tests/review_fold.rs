//! Adversarial review of the selector fold (`Arena::fold_selector_sums`, applied to the row
//! sum of `_log_softmax_backward_data`): `Σ_{K < bound} c·m·[t == K]` folds to `c·m` only where
//! every class of the index's range is present with one coefficient and a finite monomial.
//! Each wrong rank (the interpreter shows spec and rank differ) must not be proved, at full size
//! or reduced; each right one stays proved.

use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

/// Rows and classes of every case.
const N: usize = 2;
const C: usize = 4;

/// A graph over `x: f32[N, C]`, `t: i64[N]` and `go: f32[]` with the lines of `body` after
/// `ls = log_softmax(x, 1)` and `tu = t.unsqueeze(1)`, returning `y: f32[N, C]`. The `nll`
/// line (an `nll_loss_forward` of `ls` at `t` with the given ignore_index, sum reduction) makes
/// `t` an index of the classes (bound C).
fn graph(ignore: i64, body: &str) -> String {
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{N}, {C}]\", t: \"i64[{N}]\", go: \"f32[]\"):\n        ls: \"f32[{N}, {C}]\" = torch.ops.aten._log_softmax.default(x, 1, False)\n        tu: \"i64[{N}, 1]\" = torch.ops.aten.unsqueeze.default(t, 1)\n        nll = torch.ops.aten.nll_loss_forward.default(ls, t, None, 2, {ignore})\n        tw: \"f32[]\" = nll[1]\n{body}        return (y,)\n"
    )
}

/// The spec's cross-entropy backward: `nll_loss_backward` (sum reduction, ignore_index
/// `ignore`) then `_log_softmax_backward_data`, whose row sum holds the one-hot's selectors.
fn ce_backward() -> &'static str {
    "        g: \"f32[2, 4]\" = torch.ops.aten.nll_loss_backward.default(go, ls, t, None, 2, IGNORE, tw)\n        y: \"f32[2, 4]\" = torch.ops.aten._log_softmax_backward_data.default(g, ls, 1, torch.float32)\n"
}

/// A rank's `g + exp(ls)·go·keep` (`keep` a `f32[N, 1]` line's name, or `go` alone where
/// `None`): the backward with the row sum taken as `-go·keep`.
fn folded_by_hand(keep: Option<&str>) -> String {
    let scaled = match keep {
        Some(k) => format!("        s: \"f32[2, 1]\" = torch.ops.aten.mul.Tensor({k}, go)\n"),
        None => "        s: \"f32[]\" = torch.ops.aten.clone.default(go)\n".to_string(),
    };
    format!("        g: \"f32[2, 4]\" = torch.ops.aten.nll_loss_backward.default(go, ls, t, None, 2, IGNORE, tw)\n        e: \"f32[2, 4]\" = torch.ops.aten.exp.default(ls)\n{scaled}        p: \"f32[2, 4]\" = torch.ops.aten.mul.Tensor(e, s)\n        y: \"f32[2, 4]\" = torch.ops.aten.add.Tensor(g, p)\n")
}

/// A `f32[N, 1]` line `keep = float(t != ignore)`.
fn kept(ignore: i64) -> String {
    format!("        kb: \"b8[2]\" = torch.ops.aten.ne.Scalar(t, {ignore})\n        kf: \"f32[2]\" = torch.ops.aten._to_copy.default(kb, dtype = torch.float32)\n        keep: \"f32[2, 1]\" = torch.ops.aten.unsqueeze.default(kf, 1)\n")
}

/// Writes and loads a `tp=2` case (every input replicated, `y` replicated).
fn case(dir: &Path, spec: &str, rank: &str, assume_unused: bool) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    let assume = if assume_unused {
        "assume:\n  ignore-index: unused\n"
    } else {
        ""
    };
    std::fs::write(
        dir.join("case.yaml"),
        format!("version: 1\nname: fold\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r0.py]\ninputs:\n  x: Replicate()\n  t: Replicate()\n  go: Replicate()\noutputs:\n  y: Replicate()\n{assume}"),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// `y` of the spec and of rank 0 by the interpreter at labels `t` (and irregular logits,
/// `go = 1.5`).
fn interpreted(case: &shardproof_case::Case, t: [i64; N]) -> (Vec<f64>, Vec<f64>) {
    let tensor =
        |dtype, shape: Vec<usize>, data: Vec<f64>| Tensor::new(Meta::new(dtype, shape), data);
    let leaves = BTreeMap::from([
        (
            "x".to_string(),
            tensor(
                DType::F32,
                vec![N, C],
                (0..N * C)
                    .map(|i| ((i * 37 + 5) % 11) as f64 / 4.0 - 1.0)
                    .collect(),
            ),
        ),
        (
            "t".to_string(),
            tensor(DType::I64, vec![N], t.iter().map(|&v| v as f64).collect()),
        ),
        ("go".to_string(), tensor(DType::F32, vec![], vec![1.5])),
    ]);
    let y = |g: &shardproof_ir::Graph| {
        let env = shardproof_interp::run_graph(g, &leaves, &Default::default()).unwrap();
        env.get(g.find("y").unwrap()).unwrap().data.to_vec()
    };
    (y(&case.spec), y(&case.program.ranks[0]))
}

/// Whether two outputs differ beyond rounding somewhere.
fn differ(a: &[f64], b: &[f64]) -> bool {
    a.iter().zip(b).any(|(x, y)| (x - y).abs() > 1e-6)
}

/// The verdicts of the symbolic layers alone (no run of the case first) at full size and
/// on reduced sizes.
fn verdicts(case: &shardproof_case::Case) -> (Verdict, Verdict) {
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            run_first: false,
            ..ProveConfig::default()
        },
    );
    let reduced = prove_case(
        case,
        &ProveConfig {
            run_first: false,
            ..ProveConfig::default()
        },
    );
    eprintln!("full {:?} {:?}", full.verdict, full.message);
    eprintln!("reduced {:?} {:?}", reduced.verdict, reduced.message);
    (full.verdict, reduced.verdict)
}

/// Asserts the case is proved at full size, every goal in normal form: the spec's row sum
/// folded to the rank's `-go·keep` (without the fold, case splits over the labels prove it).
fn assert_proved_in_normal_form(case: &shardproof_case::Case) {
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            run_first: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(full.verdict, Verdict::Proved, "{:?}", full.message);
    assert_eq!(
        full.layers.keys().collect::<Vec<_>>(),
        ["normal-form"],
        "{:?}",
        full.layers
    );
}

/// `s` with its `IGNORE` placeholder replaced.
fn with_ignore(s: &str, ignore: i64) -> String {
    s.replace("IGNORE", &ignore.to_string())
}

/// A target equal to ignore_index (-100, outside the classes) has a zero row: its row sum is 0,
/// not `-go`. Folding the one-hot to 1 there would prove the rank that forgets it.
#[test]
fn a_rank_forgetting_ignored_targets_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph(-100, &with_ignore(ce_backward(), -100));
    let rank = graph(-100, &with_ignore(&folded_by_hand(None), -100));
    let c = case(dir.path(), &spec, &rank, false);
    let (s, r) = interpreted(&c, [1, -100]);
    assert!(differ(&s, &r), "{s:?} {r:?}");
    let (s, r) = interpreted(&c, [1, 3]);
    assert!(!differ(&s, &r), "{s:?} {r:?}");
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}

/// The same rank under `assume: ignore-index: unused` is right, and proved in normal form
/// (the fold); with the kept rows' mask it is right without the assumption, and proved in
/// normal form (the fold under the ignored-target flag, `[flag == 0]·m`).
#[test]
fn ranks_folding_the_one_hot_by_hand_are_proved_where_right() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph(-100, &with_ignore(ce_backward(), -100));
    let rank = graph(-100, &with_ignore(&folded_by_hand(None), -100));
    let c = case(dir.path(), &spec, &rank, true);
    assert_proved_in_normal_form(&c);
    let masked = graph(
        -100,
        &with_ignore(
            &format!("{}{}", kept(-100), folded_by_hand(Some("keep"))),
            -100,
        ),
    );
    let c = case(dir.path(), &spec, &masked, false);
    let (s, r) = interpreted(&c, [1, -100]);
    assert!(!differ(&s, &r), "{s:?} {r:?}");
    assert_proved_in_normal_form(&c);
}

/// An ignore_index inside the classes (0): a target of class 0 has a zero row. The one-hot
/// lacks class 0, so nothing folds; the rank that forgets it is wrong.
#[test]
fn an_ignore_index_inside_the_classes_is_not_folded() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph(0, &with_ignore(ce_backward(), 0));
    let rank = graph(0, &with_ignore(&folded_by_hand(None), 0));
    let c = case(dir.path(), &spec, &rank, false);
    let (s, r) = interpreted(&c, [0, 2]);
    assert!(differ(&s, &r), "{s:?} {r:?}");
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
    let masked = graph(
        0,
        &with_ignore(&format!("{}{}", kept(0), folded_by_hand(Some("keep"))), 0),
    );
    let c = case(dir.path(), &spec, &masked, false);
    let (s, r) = interpreted(&c, [0, 2]);
    assert!(!differ(&s, &r), "{s:?} {r:?}");
    assert_eq!(verdicts(&c).0, Verdict::Proved);
}

/// The one-hot `[t + 1 == k]` over the classes (`eq(t + 1, arange(C))`): the last class's
/// target has no class, its row sums to 0. Its roots (`k - 1`) miss the range's last value,
/// so nothing folds; `g - exp(ls)` is wrong.
#[test]
fn a_one_hot_of_an_index_plus_one_is_not_folded() {
    let dir = tempfile::tempdir().unwrap();
    let onehot = |shift: &str| {
        format!("        t1: \"i64[2, 1]\" = torch.ops.aten.add.Tensor(tu, {shift})\n        ar: \"i64[4]\" = torch.ops.aten.arange.default(4, dtype = torch.int64, device = device(type='cpu'), pin_memory = False)\n        hb: \"b8[2, 4]\" = torch.ops.aten.eq.Tensor(t1, ar)\n        g: \"f32[2, 4]\" = torch.ops.aten._to_copy.default(hb, dtype = torch.float32)\n")
    };
    let spec = graph(
        -100,
        &format!("{}        y: \"f32[2, 4]\" = torch.ops.aten._log_softmax_backward_data.default(g, ls, 1, torch.float32)\n", onehot("1")),
    );
    let rank = graph(
        -100,
        &format!("{}        e: \"f32[2, 4]\" = torch.ops.aten.exp.default(ls)\n        y: \"f32[2, 4]\" = torch.ops.aten.sub.Tensor(g, e)\n", onehot("1")),
    );
    let c = case(dir.path(), &spec, &rank, true);
    let (s, r) = interpreted(&c, [3, 1]);
    assert!(differ(&s, &r), "{s:?} {r:?}");
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
    // Shifted by 0 it is the one-hot itself: every row sums to 1, and the rank is right.
    let spec0 = spec.replace("(tu, 1)", "(tu, 0)");
    let rank0 = rank.replace("(tu, 1)", "(tu, 0)");
    let c = case(dir.path(), &spec0, &rank0, true);
    assert_eq!(verdicts(&c).0, Verdict::Proved);
}

/// The one-hot summed over the rows (dim 0) instead of the classes: `Σ_n [t_n == k]` counts
/// the targets of class `k`, selectors of different indices, which never fold.
#[test]
fn a_one_hot_summed_over_the_rows_is_not_folded() {
    let dir = tempfile::tempdir().unwrap();
    let onehot = "        ar: \"i64[4]\" = torch.ops.aten.arange.default(4, dtype = torch.int64, device = device(type='cpu'), pin_memory = False)\n        hb: \"b8[2, 4]\" = torch.ops.aten.eq.Tensor(tu, ar)\n        g: \"f32[2, 4]\" = torch.ops.aten._to_copy.default(hb, dtype = torch.float32)\n        ls0: \"f32[2, 4]\" = torch.ops.aten._log_softmax.default(x, 0, False)\n";
    let spec = graph(
        -100,
        &format!("{onehot}        y: \"f32[2, 4]\" = torch.ops.aten._log_softmax_backward_data.default(g, ls0, 0, torch.float32)\n"),
    );
    let rank = graph(
        -100,
        &format!("{onehot}        e: \"f32[2, 4]\" = torch.ops.aten.exp.default(ls0)\n        y: \"f32[2, 4]\" = torch.ops.aten.sub.Tensor(g, e)\n"),
    );
    let c = case(dir.path(), &spec, &rank, true);
    let (s, r) = interpreted(&c, [3, 1]);
    assert!(differ(&s, &r), "{s:?} {r:?}");
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}

/// A one-hot compared against half-integers (`t == k + 0.5`) is 0 everywhere: nothing to fold.
#[test]
fn a_one_hot_against_floats_is_not_folded() {
    let dir = tempfile::tempdir().unwrap();
    let onehot = "        tf: \"f32[2, 1]\" = torch.ops.aten._to_copy.default(tu, dtype = torch.float32)\n        ar: \"i64[4]\" = torch.ops.aten.arange.default(4, dtype = torch.int64, device = device(type='cpu'), pin_memory = False)\n        af: \"f32[4]\" = torch.ops.aten._to_copy.default(ar, dtype = torch.float32)\n        ah: \"f32[4]\" = torch.ops.aten.add.Tensor(af, 0.5)\n        hb: \"b8[2, 4]\" = torch.ops.aten.eq.Tensor(tf, ah)\n        g: \"f32[2, 4]\" = torch.ops.aten._to_copy.default(hb, dtype = torch.float32)\n";
    let spec = graph(
        -100,
        &format!("{onehot}        y: \"f32[2, 4]\" = torch.ops.aten._log_softmax_backward_data.default(g, ls, 1, torch.float32)\n"),
    );
    let rank = graph(
        -100,
        &format!("{onehot}        e: \"f32[2, 4]\" = torch.ops.aten.exp.default(ls)\n        y: \"f32[2, 4]\" = torch.ops.aten.sub.Tensor(g, e)\n"),
    );
    let c = case(dir.path(), &spec, &rank, true);
    let (s, r) = interpreted(&c, [3, 1]);
    assert!(differ(&s, &r), "{s:?} {r:?}");
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}

/// Two selectors of one index in each class's term: `[t == k]·[t == k]` is the one-hot (its
/// row sums to 1, the rank is right), `[t == k]·[t == k + 1]` is 0 (its row sums to 0, the
/// same rank is wrong).
#[test]
fn two_selectors_of_one_index_fold_only_where_they_agree() {
    let dir = tempfile::tempdir().unwrap();
    let onehot = |shift: &str| {
        format!("        ar: \"i64[4]\" = torch.ops.aten.arange.default(4, dtype = torch.int64, device = device(type='cpu'), pin_memory = False)\n        a1: \"i64[4]\" = torch.ops.aten.add.Tensor(ar, {shift})\n        hb: \"b8[2, 4]\" = torch.ops.aten.eq.Tensor(tu, ar)\n        hc: \"b8[2, 4]\" = torch.ops.aten.eq.Tensor(tu, a1)\n        h: \"b8[2, 4]\" = torch.ops.aten.bitwise_and.Tensor(hb, hc)\n        g: \"f32[2, 4]\" = torch.ops.aten._to_copy.default(h, dtype = torch.float32)\n")
    };
    let spec = |shift: &str| {
        graph(
            -100,
            &format!("{}        y: \"f32[2, 4]\" = torch.ops.aten._log_softmax_backward_data.default(g, ls, 1, torch.float32)\n", onehot(shift)),
        )
    };
    let rank = |shift: &str| {
        graph(
            -100,
            &format!("{}        e: \"f32[2, 4]\" = torch.ops.aten.exp.default(ls)\n        y: \"f32[2, 4]\" = torch.ops.aten.sub.Tensor(g, e)\n", onehot(shift)),
        )
    };
    let c = case(dir.path(), &spec("1"), &rank("1"), true);
    let (s, r) = interpreted(&c, [3, 1]);
    assert!(differ(&s, &r), "{s:?} {r:?}");
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
    let c = case(dir.path(), &spec("0"), &rank("0"), true);
    let (s, r) = interpreted(&c, [3, 1]);
    assert!(!differ(&s, &r), "{s:?} {r:?}");
    assert_proved_in_normal_form(&c);
}

/// Class weights make each class's term differ (`[t == k]·w_k`): the row sums to `w_t`, which
/// no fold may take for 1; the rank's `g + exp(ls)·go` is wrong unless every weight is 1.
#[test]
fn weighted_classes_are_not_folded() {
    let dir = tempfile::tempdir().unwrap();
    let weighted = |body: &str| {
        graph(-100, body)
            .replace(", go: \"f32[]\"):", ", go: \"f32[]\", cw: \"f32[4]\"):")
            .replace("(ls, t, None, 2, -100)", "(ls, t, cw, 2, -100)")
            .replace(
                "(go, ls, t, None, 2, -100, tw)",
                "(go, ls, t, cw, 2, -100, tw)",
            )
    };
    let spec = weighted(&with_ignore(ce_backward(), -100));
    let rank = weighted(&with_ignore(&folded_by_hand(None), -100));
    std::fs::write(dir.path().join("spec.py"), &spec).unwrap();
    std::fs::write(dir.path().join("r0.py"), &rank).unwrap();
    std::fs::write(
        dir.path().join("case.yaml"),
        "version: 1\nname: fold\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r0.py]\ninputs:\n  x: Replicate()\n  t: Replicate()\n  go: Replicate()\n  cw: Replicate()\noutputs:\n  y: Replicate()\nassume:\n  ignore-index: unused\n",
    )
    .unwrap();
    let c = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let leaves = BTreeMap::from([
        (
            "x".to_string(),
            Tensor::new(Meta::new(DType::F32, vec![N, C]), vec![0.25; N * C]),
        ),
        (
            "t".to_string(),
            Tensor::new(Meta::new(DType::I64, vec![N]), vec![1.0, 2.0]),
        ),
        (
            "go".to_string(),
            Tensor::new(Meta::new(DType::F32, vec![]), vec![1.0]),
        ),
        (
            "cw".to_string(),
            Tensor::new(Meta::new(DType::F32, vec![C]), vec![1.0, 2.0, 0.5, 1.0]),
        ),
    ]);
    let y = |g: &shardproof_ir::Graph| {
        let env = shardproof_interp::run_graph(g, &leaves, &Default::default()).unwrap();
        env.get(g.find("y").unwrap()).unwrap().data.to_vec()
    };
    assert!(differ(&y(&c.spec), &y(&c.program.ranks[0])));
    let (full, reduced) = verdicts(&c);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}
