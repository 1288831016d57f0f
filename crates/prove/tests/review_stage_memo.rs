//! Adversarial review of the stage memo (`stage::plan`'s keys: each stage's structure with
//! names dropped, and with shape reduction each size's reduced and original values) and of the
//! staged plan: two stages share a proof only where they state the same theorem. Each case
//! holds a right stage and a wrong twin (the interpreter shows the twin's ranks differ from
//! its spec at the case's own sizes), and the staged verdict must not be `Proved`.

use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::stage::{self, shard};
use shardproof_prove::{
    prove_case, prove_case_or_full_size, prove_staged_with, PlanOptions, Proof, ProveConfig,
    StagedProof, Verdict,
};
use std::collections::BTreeMap;
use std::path::Path;

fn tensor(dtype: DType, shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::new(Meta::new(dtype, shape.to_vec()), data)
}

/// One stage per output.
fn apart() -> PlanOptions {
    PlanOptions {
        outputs_apart: true,
        ..Default::default()
    }
}

/// The stages' targets, verdicts, memo hits and keys, for assertion messages.
fn stages(p: &StagedProof) -> String {
    p.stages
        .iter()
        .map(|s| {
            format!(
                "{} {:?} hit={} key={} {:?}",
                s.target, s.verdict, s.memo_hit, s.key, s.message
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes `spec.py`, `r0.py` (every rank's graph) and a `tp = 2` case.
fn write_case(
    dir: &Path,
    spec: &str,
    rank: &str,
    inputs: &str,
    outputs: &str,
) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        format!("version: 1\nname: review-memo\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r0.py]\ninputs:\n{inputs}outputs:\n{outputs}"),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

// ---------------------------------------------------------------------------------------
// Two stages whose reductions coincide: the same reduced program, the same (reduced,
// original) sizes, but the size reduced is another tensor's.
// ---------------------------------------------------------------------------------------

/// Graph lines of output `out = mean(a, 0) + h(b)`: `h` the spec's `mean(b, 0)`, or the
/// rank's `sum(b, 0) / k` with `k = (s + s) / s` (2, computed without a literal: the mean at
/// 2 rows only).
fn mean_plus_halved(a: &str, b: &str, out: &str, rank: bool) -> String {
    let h = if rank {
        format!("        {out}_s: \"f32[1]\" = torch.ops.aten.sum.dim_IntList({b}, [0])\n        {out}_ss: \"f32[1]\" = torch.ops.aten.add.Tensor({out}_s, {out}_s)\n        {out}_k: \"f32[1]\" = torch.ops.aten.div.Tensor({out}_ss, {out}_s)\n        {out}_h: \"f32[1]\" = torch.ops.aten.div.Tensor({out}_s, {out}_k)\n")
    } else {
        format!("        {out}_h: \"f32[1]\" = torch.ops.aten.mean.dim({b}, [0])\n")
    };
    format!("        {out}_m: \"f32[1]\" = torch.ops.aten.mean.dim({a}, [0])\n{h}        {out}: \"f32[1]\" = torch.ops.aten.add.Tensor({out}_m, {out}_h)\n")
}

/// Output `o1` over `a1` (8 rows) and `b1` (2 rows): right, the halved sum is `b1`'s mean.
/// Output `o2` over `a2` (2 rows) and `b2` (8 rows): wrong, the halved sum of 8 rows is 4
/// times their mean. Shape reduction takes the 8 rows to 2 in both stages: one reduced
/// program, sizes `[(2, 8)]` each, but stage `o1`'s second-size check grows `a1` (where
/// nothing is wrong) and stage `o2`'s would grow `b2`.
fn swapped_sizes(dir: &Path) -> shardproof_case::Case {
    let graph = |rank: bool| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, a1: \"f32[8, 1]\", b1: \"f32[2, 1]\", a2: \"f32[2, 1]\", b2: \"f32[8, 1]\"):\n{}{}        return (o1, o2)\n",
            mean_plus_halved("a1", "b1", "o1", rank),
            mean_plus_halved("a2", "b2", "o2", rank)
        )
    };
    write_case(
        dir,
        &graph(false),
        &graph(true),
        "  a1: Replicate()\n  b1: Replicate()\n  a2: Replicate()\n  b2: Replicate()\n",
        "  o1: Replicate()\n  o2: Replicate()\n",
    )
}

#[test]
fn a_stage_whose_reduction_coincides_with_a_right_ones_is_not_proved_by_its_memo() {
    let dir = tempfile::tempdir().unwrap();
    let case = swapped_sizes(dir.path());
    let leaves = BTreeMap::from([
        ("a1".to_string(), tensor(DType::F32, &[8, 1], vec![1.0; 8])),
        ("b1".to_string(), tensor(DType::F32, &[2, 1], vec![1.0; 2])),
        ("a2".to_string(), tensor(DType::F32, &[2, 1], vec![1.0; 2])),
        ("b2".to_string(), tensor(DType::F32, &[8, 1], vec![1.0; 8])),
    ]);
    let run = |g: &shardproof_ir::Graph, name: &str| {
        let env = shardproof_interp::run_graph(g, &leaves, &Default::default()).unwrap();
        env.get(g.find(name).unwrap()).unwrap().data.to_vec()
    };
    // o1 is right (1 + 1); o2's halved sum of 8 ones is 4.
    assert_eq!(run(&case.spec, "o1"), run(&case.program.ranks[0], "o1"));
    assert_eq!(run(&case.spec, "o2"), vec![2.0]);
    assert_eq!(run(&case.program.ranks[0], "o2"), vec![5.0]);
    let staged = prove_staged_with(&case, &ProveConfig::default(), 1, &apart());
    eprintln!("{}", stages(&staged));
    assert_ne!(staged.verdict, Verdict::Proved, "{}", stages(&staged));
}

/// The same case proved in two shards, one stage each, and merged: the shard that proves
/// `o1` and the shard that finds `o2` not proved give the single process's report, not a
/// proof.
#[test]
fn merged_shards_of_a_right_stage_and_its_wrong_twin_are_not_a_proof() {
    let dir = tempfile::tempdir().unwrap();
    let case = swapped_sizes(dir.path());
    let cfg = ProveConfig::default();
    let single = prove_staged_with(&case, &cfg, 1, &apart());
    let plan = stage::plan_with(&case, cfg.reduce, &apart()).unwrap();
    assert_eq!(plan.distinct.len(), 2, "{}", stages(&single));
    let out = dir.path().join("results");
    for i in 0..2 {
        let mine = shard::shard_stages(&plan, i, 2);
        let results: Vec<_> = stage::prove_stages(&plan, &mine, &cfg, 1)
            .into_iter()
            .map(|(k, o, _)| (k, o))
            .collect();
        shard::write_shard(&out, &case.name, &plan, i, 2, &results).unwrap();
    }
    let merged = stage::assemble(&case, &plan, &shard::read_shards(&out, &plan).unwrap());
    assert_ne!(merged.verdict, Verdict::Proved, "{}", stages(&merged));
    assert_eq!(
        serde_json::to_string(&merged).unwrap(),
        serde_json::to_string(&single).unwrap()
    );
}

// ---------------------------------------------------------------------------------------
// Twins that differ in one place the key must see: a kwarg, an output's layout.
// ---------------------------------------------------------------------------------------

/// Outputs `o1 = x1 + y1` and `o2 = x2 + y2`; the rank writes `add(x, y, alpha = a)` with
/// `alpha = 1` for `o1` (right) and `alpha = 2` for `o2` (wrong): one structure but a kwarg.
#[test]
fn twins_differing_in_a_kwarg_do_not_share_a_proof() {
    let dir = tempfile::tempdir().unwrap();
    let graph = |rank: bool| {
        let add = |x: &str, y: &str, out: &str, alpha: u32| {
            if rank {
                format!("        {out}: \"f32[4, 3]\" = torch.ops.aten.add.Tensor({x}, {y}, alpha = {alpha})\n")
            } else {
                format!("        {out}: \"f32[4, 3]\" = torch.ops.aten.add.Tensor({x}, {y})\n")
            }
        };
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x1: \"f32[4, 3]\", y1: \"f32[4, 3]\", x2: \"f32[4, 3]\", y2: \"f32[4, 3]\"):\n{}{}        return (o1, o2)\n",
            add("x1", "y1", "o1", 1),
            add("x2", "y2", "o2", 2)
        )
    };
    let case = write_case(
        dir.path(),
        &graph(false),
        &graph(true),
        "  x1: Replicate()\n  y1: Replicate()\n  x2: Replicate()\n  y2: Replicate()\n",
        "  o1: Replicate()\n  o2: Replicate()\n",
    );
    for reduce in [true, false] {
        let cfg = ProveConfig {
            reduce,
            ..ProveConfig::default()
        };
        let staged = prove_staged_with(&case, &cfg, 1, &apart());
        assert_eq!(
            staged.stages[0].verdict,
            Some(Verdict::Proved),
            "{}",
            stages(&staged)
        );
        assert!(!staged.stages[1].memo_hit, "{}", stages(&staged));
        assert_eq!(staged.verdict, Verdict::Refuted, "{}", stages(&staged));
    }
}

/// Outputs `o1 = x1 @ w1` and `o2 = x2 @ w2`, the contraction dim split over tp: each rank's
/// local product is a partial sum, declared `Partial()` for `o1` (right) and `Replicate()` for
/// `o2` (wrong: the all-reduce is missing). The twins differ in their relation only.
#[test]
fn twins_differing_in_an_output_relation_do_not_share_a_proof() {
    let dir = tempfile::tempdir().unwrap();
    let graph = |k: u32| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x1: \"f32[4, {k}]\", w1: \"f32[{k}, 3]\", x2: \"f32[4, {k}]\", w2: \"f32[{k}, 3]\"):\n        o1: \"f32[4, 3]\" = torch.ops.aten.mm.default(x1, w1)\n        o2: \"f32[4, 3]\" = torch.ops.aten.mm.default(x2, w2)\n        return (o1, o2)\n"
        )
    };
    let case = write_case(
        dir.path(),
        &graph(4),
        &graph(2),
        "  x1: Shard(1)\n  w1: Shard(0)\n  x2: Shard(1)\n  w2: Shard(0)\n",
        "  o1: Partial()\n  o2: Replicate()\n",
    );
    for reduce in [true, false] {
        let cfg = ProveConfig {
            reduce,
            ..ProveConfig::default()
        };
        let staged = prove_staged_with(&case, &cfg, 1, &apart());
        assert_eq!(
            staged.stages[0].verdict,
            Some(Verdict::Proved),
            "{}",
            stages(&staged)
        );
        assert!(!staged.stages[1].memo_hit, "{}", stages(&staged));
        assert_eq!(staged.verdict, Verdict::Refuted, "{}", stages(&staged));
    }
}

// ---------------------------------------------------------------------------------------
// The second-size check's draws (`equiv/second_size.rs`): a proof on reduced sizes stands
// when two interpreter runs at larger sizes agree. Each case below agrees at the first and
// the second sizes on the inputs the check draws, and differs at its own sizes.
// ---------------------------------------------------------------------------------------

/// The verdict, message and second-size record, for assertion messages.
fn report(p: &Proof) -> String {
    format!(
        "{:?} {:?} second={:?}",
        p.verdict,
        p.message,
        p.reduction.as_ref().and_then(|r| r.second_size.as_ref())
    )
}

/// Neither `prove_case` nor `prove_case_or_full_size` (the CLI's path) proves `case`.
fn assert_not_proved(case: &shardproof_case::Case) {
    let proof = prove_case(case, &ProveConfig::default());
    let (cli, _) = prove_case_or_full_size(case, &ProveConfig::default());
    assert!(
        proof.verdict != Verdict::Proved && cli.verdict != Verdict::Proved,
        "prove_case: {}\ncli: {}",
        report(&proof),
        report(&cli)
    );
}

/// Output `y` of the spec and of rank 0 run by the interpreter on `leaves`.
fn run_y(case: &shardproof_case::Case, leaves: &BTreeMap<String, Tensor>) -> (Vec<f64>, Vec<f64>) {
    let y = |graph: &shardproof_ir::Graph| {
        let env = shardproof_interp::run_graph(graph, leaves, &Default::default()).unwrap();
        env.get(graph.find("y").unwrap()).unwrap().data.to_vec()
    };
    (y(&case.spec), y(&case.program.ranks[0]))
}

/// `s = sum(x, 0)`, `k = (s + s) / s` (2 without a literal), `h = s / k`, `m = mean(x, 0)`,
/// `d = h - m` (0 at 2 rows only), for `x` of `cols` columns.
fn halved_and_mean(cols: u64) -> String {
    format!("        s: \"f32[{cols}]\" = torch.ops.aten.sum.dim_IntList(x, [0])\n        ss: \"f32[{cols}]\" = torch.ops.aten.add.Tensor(s, s)\n        k: \"f32[{cols}]\" = torch.ops.aten.div.Tensor(ss, s)\n        h: \"f32[{cols}]\" = torch.ops.aten.div.Tensor(s, k)\n        m: \"f32[{cols}]\" = torch.ops.aten.mean.dim(x, [0])\n        d: \"f32[{cols}]\" = torch.ops.aten.sub.Tensor(h, m)\n")
}

/// The spec's `mean(x, 0)` and `emb = embedding(w, u[0:2])` (`w` of 2 rows, `u` read through
/// a slice: its range unknown); the rank's `m + d·t·(t - 1)` and the same `emb`, `t` an integer
/// that indexes nothing. Right at 2 rows of `x` (`d = 0`), and at more rows only where every
/// `t` is 0 or 1.
fn int_masked_with_a_stopping_index(rank: bool) -> String {
    let (rows, cols) = (8, 3);
    let body = if rank {
        format!("{}        tf: \"f32[{cols}]\" = torch.ops.aten._to_copy.default(t, dtype = torch.float32)\n        tm: \"f32[{cols}]\" = torch.ops.aten.sub.Tensor(tf, 1)\n        tt: \"f32[{cols}]\" = torch.ops.aten.mul.Tensor(tf, tm)\n        e: \"f32[{cols}]\" = torch.ops.aten.mul.Tensor(d, tt)\n        y: \"f32[{cols}]\" = torch.ops.aten.add.Tensor(m, e)\n", halved_and_mean(cols))
    } else {
        format!("        y: \"f32[{cols}]\" = torch.ops.aten.mean.dim(x, [0])\n")
    };
    format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, {cols}]\", t: \"i64[{cols}]\", w: \"f32[2, {cols}]\", u: \"i64[4]\"):\n        us: \"i64[2]\" = torch.ops.aten.slice.Tensor(u, 0, 0, 2)\n        emb: \"f32[2, {cols}]\" = torch.ops.aten.embedding.default(w, us)\n{body}        return (y, emb)\n")
}

/// `review_second::a_coincidence_hidden_by_integers_drawn_as_0_or_1_is_not_proved` with one
/// more integer input, `u`, that a 2-row embedding reads through a slice (so its range is not
/// known): drawn in [-4, 4] the interpreter stops on it, and the check draws again with every
/// integer 0 or 1, `t` included, which hides `t·(t - 1)`. At 8 rows a `t` of 2 shows the
/// difference (every `u` a valid row).
#[test]
fn a_coincidence_hidden_by_the_redraw_of_another_integer_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &int_masked_with_a_stopping_index(false),
        &int_masked_with_a_stopping_index(true),
        "  x: Replicate()\n  t: Replicate()\n  w: Replicate()\n  u: Replicate()\n",
        "  y: Replicate()\n  emb: Replicate()\n",
    );
    let leaves = BTreeMap::from([
        (
            "x".to_string(),
            tensor(
                DType::F32,
                &[8, 3],
                (0..24).map(|i| 1.0 + f64::from(i)).collect(),
            ),
        ),
        (
            "t".to_string(),
            tensor(DType::I64, &[3], vec![0.0, 1.0, 2.0]),
        ),
        ("w".to_string(), tensor(DType::F32, &[2, 3], vec![1.0; 6])),
        (
            "u".to_string(),
            tensor(DType::I64, &[4], vec![0.0, 1.0, 1.0, 0.0]),
        ),
    ]);
    let (s, r) = run_y(&case, &leaves);
    assert!(
        (s[0] - r[0]).abs() < 1e-9 && (s[1] - r[1]).abs() < 1e-9,
        "{s:?} {r:?}"
    );
    assert!((s[2] - r[2]).abs() > 1.0, "{s:?} {r:?}");
    assert_not_proved(&case);
}
