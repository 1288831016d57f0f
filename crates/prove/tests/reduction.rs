//! Shape reduction against full size on small random programs (TrainVerify's theorem, section
//! 6): the verdict on the shape-reduced case equals the verdict at the case's sizes, and the
//! reference interpreter, run at those sizes on random inputs, finds a difference exactly when
//! the case is refuted. A bigger sweep is `cargo run -p shardproof-prove --example
//! reduction_sweep`.

mod random_programs;

use random_programs::{load, program, verdicts, Rng};
use shardproof_prove::Verdict;

#[test]
fn reduced_verdicts_equal_full_size_verdicts_on_random_programs() {
    let mut rng = Rng::new(45);
    let mut seen = Vec::new();
    for i in 0..6 {
        let p = program(&mut rng, 3);
        let dir = tempfile::tempdir().unwrap();
        let case = load(&p, dir.path());
        let (reduced, full, differs) = verdicts(&case, &mut rng);
        let show = format!("program {i} {:?}\n{}\n{}", p.ops, p.spec, p.rank);
        assert_eq!(reduced.verdict, full.verdict, "{show}");
        assert_ne!(full.verdict, Verdict::Inconclusive, "{show}");
        // A proof is never contradicted by a run; a refutation's counterexample is confirmed
        // by the interpreter inside the prover.
        assert!(!(full.verdict == Verdict::Proved && differs), "{show}");
        assert!(
            full.verdict != Verdict::Refuted || full.counterexample.is_some(),
            "{show}"
        );
        seen.push(full.verdict);
    }
    // The sample holds both verdicts, so neither side of the comparison is vacuous.
    assert!(seen.contains(&Verdict::Proved), "{seen:?}");
    assert!(seen.contains(&Verdict::Refuted), "{seen:?}");
}

/// A tp=2 case whose spec and ranks scale by `scale` (spec) and `rank_scale` (ranks) after a
/// row sum over 4 columns.
fn scaled_sum(dir: &std::path::Path, scale: &str, rank_scale: &str) -> shardproof_case::Case {
    let g = |s: &str| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]"):
        sum_1: "f32[4]" = torch.ops.aten.sum.dim_IntList(x, [1])
        y: "f32[4]" = torch.ops.aten.mul.Tensor(sum_1, {s})
        return (y,)
"#
        )
    };
    std::fs::write(dir.join("spec.py"), g(scale)).unwrap();
    std::fs::write(dir.join("r0.py"), g(rank_scale)).unwrap();
    std::fs::write(dir.join("r1.py"), g(rank_scale)).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: scaled\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

#[test]
fn a_literal_both_sides_write_pins_no_size_and_a_one_sided_one_still_does() {
    use shardproof_prove::reduce::reduce_case;
    use shardproof_prove::{prove_case, ProveConfig};
    // `0.25` on both sides (a literal product 4, 16): the 4s are reduced (to 3, which divides
    // no literal product), and the case is still proved.
    let dir = tempfile::tempdir().unwrap();
    let case = scaled_sum(dir.path(), "0.25", "0.25");
    let r = reduce_case(&case).unwrap();
    assert_eq!(r.inputs[0].2, vec![3, 3], "{:?}", r.inputs);
    assert!(r.mesh_literals.contains(&4));
    assert_eq!(
        prove_case(&case, &ProveConfig::default()).verdict,
        Verdict::Proved
    );
    // Written on one side only (the ranks' 0.25, the spec's 0.5) a literal may stand for a
    // size (a mean over 4) and keeps the sizes dividing it.
    let dir = tempfile::tempdir().unwrap();
    let case = scaled_sum(dir.path(), "0.5", "0.25");
    let r = reduce_case(&case).unwrap();
    assert_eq!(r.inputs[0].2, vec![4, 4], "{:?}", r.inputs);
    assert!(r.mesh_literals.is_empty());
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
}

/// A one-layer llama forward at dp = 2 with a head dim of 32 (rope half 16) over 8 query and
/// 2 key/value heads, every rank graph passed through `mutate`.
/// Also whether `mutate` changed any graph.
fn wide_head_llama(
    dir: &std::path::Path,
    mutate: impl Fn(&str) -> String,
) -> (shardproof_case::Case, bool) {
    use shardproof_zoo::{
        EmitExtras, EmitOptions, LlamaConfig, Mesh, PipelineOptions, TrainOptions,
    };
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: Default::default(),
        llama: LlamaConfig {
            hidden: 256,
            heads: 8,
            kv_heads: 2,
            ffn: 32,
            layers: 1,
            seq: 8,
            vocab: 32,
            ..LlamaConfig::default()
        },
        mesh: Mesh::parse("dp=2").unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: false,
    };
    shardproof_zoo::emit_to_dir(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::default(),
        &PipelineOptions::default(),
        dir,
    )
    .unwrap();
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let mut files: Vec<_> = case
        .program
        .ranks
        .iter()
        .filter_map(|g| g.path.clone())
        .collect();
    files.dedup();
    let mut changed = false;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mutated = mutate(&text);
        changed |= mutated != text;
        std::fs::write(&f, mutated).unwrap();
    }
    (
        shardproof_case::load_case(&dir.join("case.yaml")).unwrap(),
        changed,
    )
}

/// The head dim reduces: a rank's reshape of `heads x head dim` is split the way the spec's
/// was (the 8 heads as the key/value heads times the group), not by splitting the rope half
/// (16, which 8 divides) into 8 x 2 — that tied the rope half to the head count and kept
/// both at their original sizes. Mutations of the rotate-half (which half is negated, which
/// half is read) are still refuted on the reduced sizes.
#[test]
fn the_head_dim_reduces_and_rope_mutations_are_refuted_on_the_reduced_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let (case, _) = wide_head_llama(dir.path(), |t| t.to_string());
    let red = shardproof_prove::reduce::reduce_case(&case).expect("reducible");
    let shape = |name: &str| {
        red.inputs
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, r)| r.clone())
            .unwrap()
    };
    let rope = shape("rope_inv_freq")[0];
    assert!(rope < 16, "rope half kept at {rope}");
    // The query width is heads x 2 x rope half: both reduced.
    assert!(shape("wq_0")[0] < 8 * 2 * 16, "{:?}", shape("wq_0"));
    let proof = shardproof_prove::prove_case(&case, &shardproof_prove::ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);

    let negate_wrong_half = |t: &str| {
        t.replace(
            "cat.default([neg, slice], 3)",
            "cat.default([slice, neg], 3)",
        )
    };
    let read_one_half_twice = |t: &str| {
        // The second half sliced from the first: `slice_1` is `x[..., 0:16]` too.
        t.replace("(transpose, 3, 16, 32)", "(transpose, 3, 0, 16)")
    };
    for (what, mutate) in [
        (
            "negate the wrong half",
            &negate_wrong_half as &dyn Fn(&str) -> String,
        ),
        ("read one half twice", &read_one_half_twice),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (case, changed) = wide_head_llama(dir.path(), mutate);
        assert!(changed, "{what}: the mutation applies");
        let red = shardproof_prove::reduce::reduce_case(&case).expect("reducible");
        assert!(
            red.inputs
                .iter()
                .any(|(n, o, r)| n == "rope_inv_freq" && r[0] < o[0]),
            "{what}: {:?}",
            red.inputs
        );
        let cfg = shardproof_prove::ProveConfig {
            reduce: false,
            ..Default::default()
        };
        let proof = shardproof_prove::prove_case(&red.case, &cfg);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{what}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{what}");
    }
}

/// A top-k router on tp = 2 (`x [6, 4] @ r [4, 8]` gives 6 tokens' scores over 8 experts):
/// the top `k` scores normalized by `norm` (a line computing `den [6, 1]` from `vals`, the
/// selected scores, and `scores`), scattered into a dense `[6, 8]` gate matrix, gathered back
/// at the selected experts, and the gates times the expert outputs `w [8, 6]`, column-sharded
/// over tp. The spec normalizes by `spec_norm`, the ranks by `rank_norm`; `index` is the
/// tensor the gather reads its indices from.
fn router_case(
    dir: &std::path::Path,
    k: usize,
    spec_norm: &str,
    rank_norm: &str,
    index: &str,
) -> shardproof_case::Case {
    let g = |norm: &str, cols: usize| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[6, 4]", r: "f32[4, 8]", w: "f32[8, {cols}]", labels: "i64[6, {k}]"):
        logits: "f32[6, 8]" = torch.ops.aten.mm.default(x, r)
        scores: "f32[6, 8]" = torch.ops.aten.sigmoid.default(logits)
        topk = torch.ops.aten.topk.default(scores, {k})
        vals: "f32[6, {k}]" = topk[0]
        idx: "i64[6, {k}]" = topk[1]
        {norm}
        g: "f32[6, {k}]" = torch.ops.aten.div.Tensor(vals, den)
        zeros: "f32[6, 8]" = torch.ops.aten.full.default([6, 8], 0.0, dtype = torch.float32, device = device(type='cpu'), pin_memory = False)
        gates: "f32[6, 8]" = torch.ops.aten.scatter.src(zeros, 1, idx, g)
        back: "f32[6, {k}]" = torch.ops.aten.gather.default(gates, 1, {index})
        y: "f32[6, {cols}]" = torch.ops.aten.mm.default(gates, w)
        return (y, back)
"#
        )
    };
    std::fs::write(dir.join("spec.py"), g(spec_norm, 6)).unwrap();
    std::fs::write(dir.join("rank.py"), g(rank_norm, 3)).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: router\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Replicate()\n  r: Replicate()\n  w: Shard(1)\n  labels: Replicate()\noutputs:\n  y: Shard(1)\n  back: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// Normalized over the selected scores.
const TOPK_SUM: &str = r#"den: "f32[6, 1]" = torch.ops.aten.sum.dim_IntList(vals, [1], True)"#;

/// The reduced proof of `case` and the full-size one, which must agree.
fn reduced_and_full(case: &shardproof_case::Case) -> (shardproof_prove::Proof, Verdict) {
    use shardproof_prove::{prove_case, ProveConfig};
    let reduced = prove_case(case, &ProveConfig::default());
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(reduced.verdict, full.verdict, "{:?}", reduced.message);
    (reduced, full.verdict)
}

/// Shape reduction passes a top-k router (topk, scatter, gather): the tokens and the model
/// width shrink, the experts (the lane the indices range over) and `k` keep their sizes, and
/// the reduced verdict is the full-size one.
#[test]
fn a_topk_router_reduces_keeping_the_experts_and_k_and_is_proved() {
    use shardproof_prove::reduce::reduce_case;
    let dir = tempfile::tempdir().unwrap();
    let case = router_case(dir.path(), 2, TOPK_SUM, TOPK_SUM, "idx");
    let red = reduce_case(&case).expect("reducible");
    let shape = |name: &str| {
        red.inputs
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, r)| r.clone())
            .unwrap()
    };
    // Tokens and width reduced; the 8 experts kept (router columns, expert rows).
    assert!(shape("x")[0] < 6 && shape("x")[1] < 4, "{:?}", red.inputs);
    assert_eq!(shape("r")[1], 8, "{:?}", red.inputs);
    assert_eq!(shape("w")[0], 8, "{:?}", red.inputs);
    assert!(red
        .sizes
        .iter()
        .any(|s| s.origin.contains("top-k count") && s.original == 2 && s.reduced == 2));
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());
}

/// A bug that shows only with more experts than `k + 1`: the ranks normalize the top-1
/// score by itself plus the smallest score, the spec by the sum of every score, which agree
/// exactly when there are 2 experts. The experts keep their 8 (the topk rule keeps the lane),
/// so the reduced case is refuted; reducing them to 2 proves it.
#[test]
fn a_router_bug_past_the_reduced_expert_range_stays_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let spec_norm = r#"den: "f32[6, 1]" = torch.ops.aten.sum.dim_IntList(scores, [1], True)"#;
    let rank_norm = r#"low: "f32[6, 1]" = torch.ops.aten.amin.default(scores, [1], True)
        den: "f32[6, 1]" = torch.ops.aten.add.Tensor(vals, low)"#;
    let case = router_case(dir.path(), 1, spec_norm, rank_norm, "idx");
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

/// A bug that shows only at `k > 2`: the ranks normalize the top-3 scores by their largest
/// plus their smallest, which is their sum at `k = 2`. `k` keeps its 3, so it is refuted.
#[test]
fn a_router_bug_past_a_reduced_k_stays_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let rank_norm = r#"hi: "f32[6, 1]" = torch.ops.aten.amax.default(vals, [1], True)
        lo: "f32[6, 1]" = torch.ops.aten.amin.default(vals, [1], True)
        den: "f32[6, 1]" = torch.ops.aten.add.Tensor(hi, lo)"#;
    let case = router_case(dir.path(), 3, TOPK_SUM, rank_norm, "idx");
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

/// An index that is an input (an integer computation on inputs, here the input itself) is
/// accepted with its range kept: the dim it indexes in the spec, the 8 experts, keeps its
/// size, so the labels take the same values at full and reduced sizes; the reduced verdict is
/// the full-size one.
#[test]
fn a_gather_of_an_input_index_keeps_its_range() {
    use shardproof_prove::reduce::reduce_case;
    let dir = tempfile::tempdir().unwrap();
    let case = router_case(dir.path(), 2, TOPK_SUM, TOPK_SUM, "labels");
    let red = reduce_case(&case).expect("reducible");
    assert!(
        red.sizes
            .iter()
            .any(|s| s.original == 8 && s.reduced == 8 && s.pinned),
        "{:?}",
        red.sizes
    );
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

/// Writes a one-graph tp=2 case (every input replicated, `y` replicated) whose spec is
/// `spec` and whose ranks both run `rank`.
fn replicated_case(
    dir: &std::path::Path,
    spec: &str,
    rank: &str,
    inputs: &[&str],
) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("rank.py"), rank).unwrap();
    let ins: String = inputs
        .iter()
        .map(|i| format!("  {i}: Replicate()\n"))
        .collect();
    std::fs::write(
        dir.join("case.yaml"),
        format!("version: 1\nname: replicated\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [rank.py, rank.py]\ninputs:\n{ins}outputs:\n  y: Replicate()\n"),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// An index computed from positions (`arange`, whose values follow a reduced size) is refused
/// by shape reduction, naming the gather.
#[test]
fn a_gather_of_positions_is_refused() {
    use shardproof_prove::reduce::reduce_case;
    let dir = tempfile::tempdir().unwrap();
    let g = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[6, 8]"):
        pos: "i64[8]" = torch.ops.aten.arange.start(0, 8, device = device(type='cpu'), pin_memory = False)
        row: "i64[1, 8]" = torch.ops.aten.unsqueeze.default(pos, 0)
        idx: "i64[6, 8]" = torch.ops.aten.expand.default(row, [6, 8])
        y: "f32[6, 8]" = torch.ops.aten.gather.default(x, 1, idx)
        return (y,)
"#;
    let case = replicated_case(dir.path(), g, g, &["x"]);
    let refusal = reduce_case(&case).expect_err("refused");
    assert_eq!(
        refusal.op.as_deref(),
        Some("aten.gather.default"),
        "{}",
        refusal.message
    );
}

/// A token compared with a literal (`tokens < 10` in the spec, `< 11` on the ranks: they
/// differ for token 10 of the 16-row table). Reduced with the table, the tokens would range
/// below 10 and both masks keep every row: proved at the reduced sizes, wrong at full size.
/// An integer computation on an input keeps that input's range, so the table keeps its 16
/// rows and the case is refuted, as at full size.
#[test]
fn a_token_compared_with_a_literal_keeps_its_range_and_is_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let g = |lit: i64| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, table: "f32[16, 4]", tokens: "i64[6]"):
        rows: "f32[6, 4]" = torch.ops.aten.embedding.default(table, tokens)
        far: "b8[6]" = torch.ops.aten.ge.Scalar(tokens, {lit})
        far2: "b8[6, 1]" = torch.ops.aten.unsqueeze.default(far, 1)
        y: "f32[6, 4]" = torch.ops.aten.masked_fill.Scalar(rows, far2, 0.0)
        return (y,)
"#
        )
    };
    let case = replicated_case(dir.path(), &g(10), &g(11), &["table", "tokens"]);
    let red = shardproof_prove::reduce::reduce_case(&case).expect("reducible");
    let table = red.inputs.iter().find(|(n, _, _)| n == "table").unwrap();
    assert_eq!(table.2[0], 16, "{:?}", red.inputs);
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

/// An embedding's backward whose gradient and indices nothing else relates (a stage whose
/// cut is the gradient: the zoo's deepseek dp=2 x tp=2 full iteration): the gradient's rows
/// are the indices' positions, so they reduce together. Here the indices' second dim is also
/// halved by a slice (a multiple of 2), the gradient's is not: reduced apart, the symbolic
/// backward indexed past the gradient and panicked.
#[test]
fn an_embedding_backward_reduces_its_gradient_with_its_indices() {
    let dir = tempfile::tempdir().unwrap();
    let g = r#"class GraphModule(torch.nn.Module):
    def forward(self, tokens: "i64[4, 6]", grad: "f32[4, 6, 8]"):
        table: "f32[10, 8]" = torch.ops.aten.embedding_dense_backward.default(grad, tokens, 10, -1, False)
        half: "i64[4, 3]" = torch.ops.aten.slice.Tensor(tokens, 1, 0, 3)
        return (table, half)
"#;
    for f in ["spec.py", "rank.py"] {
        std::fs::write(dir.path().join(f), g).unwrap();
    }
    std::fs::write(
        dir.path().join("case.yaml"),
        "version: 1\nname: embedding-backward\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  tokens: Replicate()\n  grad: Replicate()\noutputs:\n  table: Replicate()\n  half: Replicate()\n",
    )
    .unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let red = shardproof_prove::reduce::reduce_case(&case).expect("reducible");
    let shape = |name: &str| {
        red.inputs
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, r)| r.clone())
            .unwrap()
    };
    assert_eq!(shape("tokens")[..], shape("grad")[..2], "{:?}", red.inputs);
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());
}

/// A tp=2 case: the spec's `logsumexp` over the 8 columns of `x`; each rank holds 4 columns
/// (`Shard(1)`), runs `local` on them into `l: [4, 1]` and merges the ranks' `l` as a ring
/// attention merge does (the max across ranks, plus the log of the sum of the shifted exps).
fn sharded_logsumexp(dir: &std::path::Path, local: &str) -> shardproof_case::Case {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]"):
        y: "f32[4]" = torch.ops.aten.logsumexp.default(x, [1])
        return (y,)
"#;
    let rank = format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]"):
        {local}
        ar_max: "f32[4, 1]" = torch.ops._c10d_functional.all_reduce.default(l, 'max', 'tp')
        m: "f32[4, 1]" = torch.ops._c10d_functional.wait_tensor.default(ar_max)
        d: "f32[4, 1]" = torch.ops.aten.sub.Tensor(l, m)
        e: "f32[4, 1]" = torch.ops.aten.exp.default(d)
        ar_sum: "f32[4, 1]" = torch.ops._c10d_functional.all_reduce.default(e, 'sum', 'tp')
        s: "f32[4, 1]" = torch.ops._c10d_functional.wait_tensor.default(ar_sum)
        lg: "f32[4, 1]" = torch.ops.aten.log.default(s)
        z: "f32[4, 1]" = torch.ops.aten.add.Tensor(m, lg)
        y: "f32[4]" = torch.ops.aten.squeeze.dim(z, 1)
        return (y,)
"#
    );
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("rank.py"), rank).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: lse\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Shard(1)\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// `logsumexp` is on the reduction list (a reduction over its dims, as `sum`): a sharded
/// logsumexp merged across ranks reduces its rows and columns and is proved, the verdict the
/// full-size one; planted bugs are never proved: the local logsumexp over the wrong dim
/// (rows, transposed back into place) and a local `amax` in its place, which equals the
/// logsumexp of a one-element lane, so only the reduced lane's minimum of 2 per rank keeps
/// it refuted.
#[test]
fn a_sharded_logsumexp_reduces_and_its_wrong_dim_or_max_is_refuted() {
    use shardproof_prove::reduce::reduce_case;
    let dir = tempfile::tempdir().unwrap();
    let right = r#"l: "f32[4, 1]" = torch.ops.aten.logsumexp.default(x, [1], True)"#;
    let case = sharded_logsumexp(dir.path(), right);
    let red = reduce_case(&case).expect("reducible");
    let x = &red.inputs.iter().find(|(n, _, _)| n == "x").unwrap().2;
    assert!(x[0] < 4 && x[1] < 8 && x[1] >= 4, "{:?}", red.inputs);
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());

    let bugs = [
        r#"lr: "f32[1, 4]" = torch.ops.aten.logsumexp.default(x, [0], True)
        l: "f32[4, 1]" = torch.ops.aten.t.default(lr)"#,
        r#"l: "f32[4, 1]" = torch.ops.aten.amax.default(x, [1], True)"#,
    ];
    for bug in bugs {
        let dir = tempfile::tempdir().unwrap();
        let case = sharded_logsumexp(dir.path(), bug);
        reduce_case(&case).expect("reducible");
        let (proof, _) = reduced_and_full(&case);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{bug}");
        assert!(proof.reduction.is_some(), "{bug}");
    }
}

/// A context-parallel position embedding: the spec looks a `[rows, 4]` table up at
/// `arange(8)`, rank `r` at `arange(4·r, 4·r + 4)` (`starts[r]`), its rows of the output.
fn position_case(dir: &std::path::Path, rows: usize, starts: [usize; 2]) -> shardproof_case::Case {
    std::fs::write(
        dir.join("spec.py"),
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, wpe: "f32[{rows}, 4]"):
        pos: "i64[8]" = torch.ops.aten.arange.start(0, 8, device = device(type='cpu'), pin_memory = False)
        y: "f32[8, 4]" = torch.ops.aten.embedding.default(wpe, pos)
        return (y,)
"#
        ),
    )
    .unwrap();
    for (r, start) in starts.iter().enumerate() {
        std::fs::write(
            dir.join(format!("r{r}.py")),
            format!(
                r#"class GraphModule(torch.nn.Module):
    def forward(self, wpe: "f32[{rows}, 4]"):
        pos: "i64[4]" = torch.ops.aten.arange.start({start}, {end}, device = device(type='cpu'), pin_memory = False)
        y: "f32[4, 4]" = torch.ops.aten.embedding.default(wpe, pos)
        return (y,)
"#,
                end = start + 4
            ),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: positions\nspec:\n  graph: spec.py\nimpl:\n  mesh: { cp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  wpe: Replicate()\noutputs:\n  y: Shard(0)\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// An embedding at positions keeps its table at least as long as the positions: as many
/// rows as positions reduce with them (the ranks' chunks `2·v` included), more rows are kept
/// whole. Reduced apart, the table fell below the ranks' positions and the reduced spec
/// indexed out of range (gpt2's cp plans). A rank whose chunk forgets its offset is refuted.
#[test]
fn a_position_table_reduces_with_its_positions_and_a_missing_offset_is_refuted() {
    use shardproof_prove::reduce::reduce_case;
    let dir = tempfile::tempdir().unwrap();
    let case = position_case(dir.path(), 8, [0, 4]);
    let red = reduce_case(&case).expect("reducible");
    let wpe = &red.inputs.iter().find(|(n, _, _)| n == "wpe").unwrap().2;
    assert!(
        wpe[0] < 8,
        "{:?} {:?} {:?}",
        red.inputs,
        red.sizes,
        red.kept_whole
    );
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());

    let dir = tempfile::tempdir().unwrap();
    let case = position_case(dir.path(), 10, [0, 4]);
    let red = reduce_case(&case).expect("reducible");
    let wpe = &red.inputs.iter().find(|(n, _, _)| n == "wpe").unwrap().2;
    assert_eq!(wpe[0], 10, "{:?}", red.inputs);
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);

    let dir = tempfile::tempdir().unwrap();
    let case = position_case(dir.path(), 8, [0, 0]);
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

/// An expert-parallel combine as the ep backward writes it: the spec's `relu` over 8 columns;
/// each tp rank holds 4 columns (`Shard(1)`), zero-pads its `relu` to all 8 with widths
/// `pads[r]` (`constant_pad_nd`, or `pad` in `mode`) and sums the padded pieces across ranks.
fn padded_case(dir: &std::path::Path, pads: [[i64; 2]; 2], mode: &str) -> shardproof_case::Case {
    std::fs::write(
        dir.join("spec.py"),
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[6, 8]"):
        y: "f32[6, 8]" = torch.ops.aten.relu.default(x)
        return (y,)
"#,
    )
    .unwrap();
    for (r, [lo, hi]) in pads.iter().enumerate() {
        let width = 4 + lo + hi;
        let pad = match mode {
            "" => format!("torch.ops.aten.constant_pad_nd.default(a, [{lo}, {hi}], 0.0)"),
            m => format!("torch.ops.aten.pad.default(a, [{lo}, {hi}], '{m}')"),
        };
        std::fs::write(
            dir.join(format!("r{r}.py")),
            format!(
                r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[6, 4]"):
        a: "f32[6, 4]" = torch.ops.aten.relu.default(x)
        p: "f32[6, {width}]" = {pad}
        s: "f32[6, {width}]" = torch.ops._c10d_functional.all_reduce.default(p, 'sum', 'tp')
        y: "f32[6, {width}]" = torch.ops._c10d_functional.wait_tensor.default(s)
        return (y,)
"#
            ),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: padded\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(1)\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// `constant_pad_nd` is on the reduction list: widths that are whole numbers of the padded
/// dim's units scale with them, so the expert-parallel combine reduces its columns (4 per
/// rank to fewer) and rows and is proved, the full-size verdict the same. Planted wrong pads
/// are refuted on the reduced sizes, each with a counterexample, and at full size (where the
/// run finds it first): both ranks padding into the first half (widths that scale), and
/// rank 1's piece one column early (`[3, 1]`: no common unit with the 4 columns, so the
/// columns keep their size and the reduced case is the full one along them).
#[test]
fn a_constant_pad_reduces_with_its_dim_and_a_wrong_pad_is_refuted() {
    use shardproof_prove::reduce::reduce_case;
    let columns = |case: &shardproof_case::Case| {
        let red = reduce_case(case).expect("reducible");
        red.inputs
            .iter()
            .find(|(n, _, _)| n == "x")
            .unwrap()
            .2
            .clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let case = padded_case(dir.path(), [[0, 4], [4, 0]], "");
    let x = columns(&case);
    assert!(x[0] < 6 && x[1] < 8, "{x:?}");
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());
    // `pad` in mode `constant` is the same operator.
    let dir = tempfile::tempdir().unwrap();
    let case = padded_case(dir.path(), [[0, 4], [4, 0]], "constant");
    assert!(columns(&case)[1] < 8);
    let (proof, _) = reduced_and_full(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);

    for (pads, kept) in [([[0, 4], [0, 4]], false), ([[0, 4], [3, 1]], true)] {
        let dir = tempfile::tempdir().unwrap();
        let case = padded_case(dir.path(), pads, "");
        assert_eq!(columns(&case)[1] == 8, kept, "{pads:?}");
        let (proof, _) = reduced_and_full(&case);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{pads:?}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{pads:?}");
        assert!(proof.reduction.is_some(), "{pads:?}");
    }
}

/// A pad whose border reads the input (`reflect`, `replicate`, `circular`) or that crops (a
/// negative width) is refused, naming the operator: its offsets do not scale with the sizes.
#[test]
fn a_pad_of_another_mode_or_a_crop_is_refused() {
    use shardproof_prove::reduce::reduce_case;
    for (pads, mode, why) in [
        ([[2, 2], [2, 2]], "reflect", "mode `reflect`"),
        ([[2, 2], [2, 2]], "replicate", "mode `replicate`"),
        ([[0, 4], [-1, 5]], "", "negative width"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = padded_case(dir.path(), pads, mode);
        let refusal = reduce_case(&case).expect_err(mode);
        assert!(
            refusal.op.as_deref().is_some_and(|o| o.contains("pad")),
            "{refusal:?}"
        );
        assert!(refusal.message.contains(why), "{refusal:?}");
    }
}
