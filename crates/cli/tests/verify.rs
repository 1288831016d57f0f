//! `shardproof verify` end to end: zoo cases verify, catalog bugs are refuted, the Megatron
//! bug sample is localized at `mm_7`.

mod common;

use common::{emit_zoo as emit_model, entangle_samples, verify_exit as verify, verify_exit_with};
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardproof"))
}

fn emit(dir: &Path, mesh: &str, extra: &[&str]) -> PathBuf {
    emit_model("mlp", dir, mesh, extra)
}

#[test]
fn correct_zoo_plans_verify() {
    for mesh in ["tp=2", "dp=2", "dp=2,tp=2", "tp=4", "dp=4", "tp=2,dp=2"] {
        for extra in [&[][..], &["--forward-only"][..]] {
            let dir = tempfile::tempdir().unwrap();
            let case = emit(dir.path(), mesh, extra);
            let (code, out) = verify(&case);
            assert_eq!(code, 0, "{mesh} {extra:?}:\n{out}");
            assert!(out.contains("certificate:"), "{out}");
        }
    }
}

/// The MLP catalog bugs `catalog_bugs_are_refuted` plants (dp=2 x tp=2).
const MLP_REFUTED: &[&str] = &[
    "tp-missing-allreduce",
    "tp-bias-before-allreduce",
    "dp-loss-not-averaged",
    "dp-grad-not-averaged",
    "wrong-group",
];

#[test]
fn catalog_bugs_are_refuted() {
    for &bug in MLP_REFUTED {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(dir.path(), "dp=2,tp=2", &["--bug", bug]);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{bug}:\n{out}");
        assert!(out.contains("relations stop at spec operator"), "{out}");
    }
}

#[test]
fn json_report_names_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), "tp=2", &[]);
    let out = bin()
        .arg("verify")
        .arg(&case)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "verified");
    assert!(v["certificate"].as_array().is_some_and(|c| !c.is_empty()));
}

#[test]
fn megatron_missing_allreduce_is_localized_at_mm_7() {
    let Some(dir) = entangle_samples() else {
        return;
    };
    let (code, out) = verify(&dir.join("case-bug-tp2.yaml"));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("relations stop at spec operator `mm_7`"),
        "{out}"
    );
    assert!(out.contains("unreduced partial sum"), "{out}");
}

/// The Megatron GPT sample's case, with graph paths made absolute and `extra` appended.
fn gpt_case(samples: &Path, dir: &Path, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(samples.join("case-tp2.yaml")).unwrap();
    let gpt = samples.join("gpt");
    let text = text.replace("gpt/", &format!("{}/", gpt.display())) + extra;
    let case = dir.join("case.yaml");
    std::fs::write(&case, text).unwrap();
    case
}

const GPT_CONSTANTS: &str = "constants:\n  _tensor_constant0: 0\n  _tensor_constant1: 0.0\n  _tensor_constant2: 0\n  _tensor_constant3: 0.0\n";

#[test]
fn megatron_gpt_without_constant_values_is_inconclusive() {
    // The cross-entropy's masked fills read `_tensor_constantN` attributes whose values the
    // graph text does not hold: the engine must say which to state, not guess them.
    let Some(dir) = entangle_samples() else {
        return;
    };
    let (code, out) = verify(&dir.join("case-tp2.yaml"));
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("constants:"), "{out}");
    // Half of them stated: still no verdict, and never a false alarm.
    let tmp = tempfile::tempdir().unwrap();
    let half = "constants:\n  _tensor_constant0: 0\n  _tensor_constant1: 0.0\n";
    let (code, out) = verify(&gpt_case(&dir, tmp.path(), half));
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("_tensor_constant3 (rank 0)"), "{out}");
}

#[test]
fn megatron_gpt_tp2_sp_vp_verifies() {
    let Some(dir) = entangle_samples() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (code, out) = verify(&gpt_case(&dir, tmp.path(), GPT_CONSTANTS));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("div_2 = r0.div_1"), "{out}");
}

#[test]
fn megatron_gpt_with_a_nonzero_fill_is_not_verified() {
    // Filling the out-of-shard target logits with 1.0 instead of 0.0 breaks the all-reduced
    // sum: the engine must not verify it.
    let Some(dir) = entangle_samples() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let wrong = GPT_CONSTANTS.replace("_tensor_constant3: 0.0", "_tensor_constant3: 1.0");
    let (code, out) = verify(&gpt_case(&dir, tmp.path(), &wrong));
    // No known bug pattern matches a wrong fill value: the engine stops at the target-logit
    // gather and says it cannot tell a bug from a missing lemma (never a pass).
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("`index_1`"), "{out}");
}

#[test]
fn an_unmet_output_expectation_is_refuted() {
    // The loss is replicated; a case claiming the ranks hold partial sums of it is wrong.
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), "tp=2", &[]);
    let text = std::fs::read_to_string(&case).unwrap();
    assert!(text.contains("  loss: Replicate()"), "{text}");
    std::fs::write(
        &case,
        text.replace("  loss: Replicate()", "  loss: { tp: Partial() }"),
    )
    .unwrap();
    let (code, out) = verify(&case);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the case expects `loss`"), "{out}");
    // The engine alone cannot tell a wrong expectation from a missing lemma; the refutation
    // stands on a concrete run that misses the placement.
    assert!(out.contains("a run on seeded random inputs"), "{out}");
    assert!(out.contains("relative error of 1.000e0"), "{out}");
}

/// Spec of `relu(sum(x) / 2 + sum(y) / 2)` over the rows of x and y.
const SPEC_HALF_SUMS: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 6]", y: "f32[4, 6]"):
        sum_1: "f32[6]" = torch.ops.aten.sum.dim_IntList(x, [0]);  x = None
        mul: "f32[6]" = torch.ops.aten.mul.Scalar(sum_1, 0.5);  sum_1 = None
        sum_2: "f32[6]" = torch.ops.aten.sum.dim_IntList(y, [0]);  y = None
        mul_1: "f32[6]" = torch.ops.aten.mul.Scalar(sum_2, 0.5);  sum_2 = None
        add: "f32[6]" = torch.ops.aten.add.Tensor(mul, mul_1);  mul = mul_1 = None
        relu: "f32[6]" = torch.ops.aten.relu.default(add);  add = None
        return (relu,)
"#;

/// A data-parallel rank of `SPEC_HALF_SUMS` that adds its two partial sums as `a - (-b)` (no
/// lemma reads a subtraction of a negation as an addition), all-reduces and scales by SCALE.
const RANK_HALF_SUMS: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 6]", y: "f32[2, 6]"):
        sum_1: "f32[6]" = torch.ops.aten.sum.dim_IntList(x, [0]);  x = None
        sum_2: "f32[6]" = torch.ops.aten.sum.dim_IntList(y, [0]);  y = None
        neg: "f32[6]" = torch.ops.aten.neg.default(sum_2);  sum_2 = None
        sub: "f32[6]" = torch.ops.aten.sub.Tensor(sum_1, neg);  sum_1 = neg = None
        all_reduce: "f32[6]" = torch.ops._c10d_functional.all_reduce.default(sub, 'sum', 'dp');  sub = None
        wait_tensor: "f32[6]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        mul: "f32[6]" = torch.ops.aten.mul.Scalar(wait_tensor, SCALE);  wait_tensor = None
        relu: "f32[6]" = torch.ops.aten.relu.default(mul);  mul = None
        return (relu,)
"#;

const CASE_HALF_SUMS: &str = "version: 1
name: half-sums
spec:
  graph: spec.py
impl:
  mesh: { dp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  x: Shard(0)
  y: Shard(0)
outputs:
  relu: Replicate()
";

#[test]
fn a_refutation_stands_only_where_a_run_confirms_it() {
    // Correct, but combined by a route the library has no lemma for: the engine's evidence
    // (a value off by a constant factor) is not borne out by a run, so the verdict is
    // inconclusive, never a false alarm.
    let s = common::Scratch::new();
    s.write("spec.py", SPEC_HALF_SUMS);
    for r in ["r0.py", "r1.py"] {
        s.write(r, &RANK_HALF_SUMS.replace("SCALE", "0.5"));
    }
    let case = s.write("case.yaml", CASE_HALF_SUMS);
    let (code, out) = verify_exit_with(&case, &["--no-prove"]);
    assert_eq!(code, 3, "{out}");
    // The element-level prover decides what relation inference left open.
    let (code, proved) = verify(&case);
    assert_eq!(code, 0, "{proved}");
    assert!(proved.contains("decided by: prove"), "{proved}");
    assert!(
        proved.contains("relation inference alone was inconclusive"),
        "{proved}"
    );
    assert!(
        out.contains("relations stop at spec operator `add`"),
        "{out}"
    );
    assert!(out.contains("matches every output"), "{out}");
    // Scaled by a quarter instead of a half: the same evidence, now confirmed by the run.
    for r in ["r0.py", "r1.py"] {
        s.write(r, &RANK_HALF_SUMS.replace("SCALE", "0.25"));
    }
    let (code, out) = verify(&case);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("off by a constant factor"), "{out}");
    assert!(
        out.contains("confirms it: output `relu` differs from the spec"),
        "{out}"
    );
}

/// Spec of `(x + y) * (z + w)`; its ranks compute each sum as `a - (-b)`, which no lemma reads
/// as an addition: relations stop at both sums, on two independent paths.
const SPEC_TWO_SUMS: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4]", y: "f32[4]", z: "f32[4]", w: "f32[4]"):
        p: "f32[4]" = torch.ops.aten.add.Tensor(x, y);  x = y = None
        q: "f32[4]" = torch.ops.aten.add.Tensor(z, w);  z = w = None
        out: "f32[4]" = torch.ops.aten.mul.Tensor(p, q);  p = q = None
        return (out,)
"#;

const RANK_TWO_SUMS: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4]", y: "f32[4]", z: "f32[4]", w: "f32[4]"):
        neg: "f32[4]" = torch.ops.aten.neg.default(y);  y = None
        p: "f32[4]" = torch.ops.aten.sub.Tensor(x, neg);  x = neg = None
        neg_1: "f32[4]" = torch.ops.aten.neg.default(w);  w = None
        q: "f32[4]" = torch.ops.aten.sub.Tensor(z, neg_1);  z = neg_1 = None
        out: "f32[4]" = torch.ops.aten.mul.Tensor(p, q);  p = q = None
        return (out,)
"#;

/// Writes a tp=2 case whose two ranks both run `rank`: `rest` is the case file after its
/// program sections (the name, inputs and outputs).
fn write_tp2_case(s: &common::Scratch, spec: &str, rank: &str, rest: &str) -> PathBuf {
    s.write("spec.py", spec);
    s.write("r0.py", rank);
    s.write("r1.py", rank);
    let head =
        "version: 1\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\n";
    s.write("case.yaml", &format!("{head}{rest}"))
}

#[test]
fn an_inconclusive_verdict_names_every_stop() {
    let s = common::Scratch::new();
    let case = write_tp2_case(
        &s,
        SPEC_TWO_SUMS,
        RANK_TWO_SUMS,
        "name: two-sums\ninputs:\n  x: Replicate()\n  y: Replicate()\n  z: Replicate()\n  w: Replicate()\noutputs:\n  out: Replicate()\n",
    );
    let (code, out) = verify_exit_with(&case, &["--no-prove"]);
    assert_eq!(code, 3, "{out}");
    // The element-level prover decides what relation inference left open.
    let (code, proved) = verify(&case);
    assert_eq!(code, 0, "{proved}");
    assert!(proved.contains("decided by: prove"), "{proved}");
    assert!(
        proved.contains("relation inference alone was inconclusive"),
        "{proved}"
    );
    assert!(
        out.contains("relations stop at spec operator `p` (aten.add.Tensor)"),
        "{out}"
    );
    assert!(
        out.contains("relations also stop at `q (aten.add.Tensor)`"),
        "{out}"
    );
    let json = bin()
        .args(["verify", "--json", "--no-prove"])
        .arg(&case)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        report["failure"]["other_stops"],
        serde_json::json!(["q (aten.add.Tensor)"]),
        "{report}"
    );
}

/// A program computing `p` from `x` and `y` by `sum` (its lines), then squaring it eight times:
/// the spec adds, its ranks compute `x - (-y)`, so every square has only a computed (unclean)
/// expression, doubling in size at each square.
fn squares_program(sum: &str) -> String {
    let mut text = String::from(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4]\", y: \"f32[4]\"):\n",
    );
    text.push_str(sum);
    for k in 1..=8 {
        let prev = if k == 1 {
            "p".to_string()
        } else {
            format!("s{}", k - 1)
        };
        text.push_str(&format!(
            "        s{k}: \"f32[4]\" = torch.ops.aten.mul.Tensor({prev}, {prev});  {prev} = None\n"
        ));
    }
    text + "        return (s8,)\n"
}

#[test]
fn a_lost_relation_names_the_operator_whose_expression_outgrew_the_limit() {
    let s = common::Scratch::new();
    let case = write_tp2_case(
        &s,
        &squares_program(
            "        p: \"f32[4]\" = torch.ops.aten.add.Tensor(x, y);  x = y = None\n",
        ),
        &squares_program(concat!(
            "        neg: \"f32[4]\" = torch.ops.aten.neg.default(y);  y = None\n",
            "        p: \"f32[4]\" = torch.ops.aten.sub.Tensor(x, neg);  x = neg = None\n",
        )),
        "name: squares\ninputs:\n  x: Replicate()\n  y: Replicate()\n",
    );
    let (code, out) = verify_exit_with(&case, &["--no-prove"]);
    assert_eq!(code, 3, "{out}");
    // The element-level prover decides what relation inference left open.
    let (code, proved) = verify(&case);
    assert_eq!(code, 0, "{proved}");
    assert!(proved.contains("decided by: prove"), "{proved}");
    assert!(
        proved.contains("relation inference alone was inconclusive"),
        "{proved}"
    );
    // The output inherits the state; the report names where the expression outgrew the limit,
    // not the output, and not the operator where relations stopped.
    assert!(
        out.contains("relations stop at spec operator `p` (aten.add.Tensor)"),
        "{out}"
    );
    assert!(
        out.contains("the expression computed for `s7` grew beyond the size limit ("),
        "{out}"
    );
    assert!(out.contains("nodes, at most 400)"), "{out}");
}

#[test]
fn the_size_limit_of_a_lost_relation_grows_with_the_ranks() {
    // The same program on eight ranks: expressions over more ranks' pieces are larger, so
    // the limit is per rank, and the relation is lost one square later, past 800 nodes.
    let s = common::Scratch::new();
    let spec =
        squares_program("        p: \"f32[4]\" = torch.ops.aten.add.Tensor(x, y);  x = y = None\n");
    let rank = squares_program(concat!(
        "        neg: \"f32[4]\" = torch.ops.aten.neg.default(y);  y = None\n",
        "        p: \"f32[4]\" = torch.ops.aten.sub.Tensor(x, neg);  x = neg = None\n",
    ));
    s.write("spec.py", &spec);
    let mut graphs = Vec::new();
    for r in 0..8 {
        s.write(&format!("r{r}.py"), &rank);
        graphs.push(format!("r{r}.py"));
    }
    let case = s.write(
        "case.yaml",
        &format!(
            "version: 1\nname: squares\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 8 }}\n  graphs: [{}]\ninputs:\n  x: Replicate()\n  y: Replicate()\n",
            graphs.join(", ")
        ),
    );
    let (code, out) = verify_exit_with(&case, &["--no-prove"]);
    assert_eq!(code, 3, "{out}");
    // The element-level prover decides what relation inference left open.
    let (code, proved) = verify(&case);
    assert_eq!(code, 0, "{proved}");
    assert!(proved.contains("decided by: prove"), "{proved}");
    assert!(
        proved.contains("relation inference alone was inconclusive"),
        "{proved}"
    );
    assert!(
        out.contains("the expression computed for `s8` grew beyond the size limit ("),
        "{out}"
    );
    assert!(out.contains("nodes, at most 800)"), "{out}");
}

#[test]
fn an_unmet_expression_expectation_is_settled_by_a_run() {
    // Shard pieces expected in the wrong order, written as an `expr:`: the engine's relation
    // differs, and a run evaluates the expression on the ranks' values and confirms it.
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), "tp=2", &[]);
    let text = std::fs::read_to_string(&case).unwrap();
    assert!(text.contains("  w1_0_new: { tp: Shard(0) }"), "{text}");
    let text = text.replace(
        "  w1_0_new: { tp: Shard(0) }",
        "  w1_0_new: { expr: \"concat([r1.w1_0_new, r0.w1_0_new], 0)\" }",
    );
    std::fs::write(&case, &text).unwrap();
    let (code, out) = verify(&case);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the case expects `w1_0_new`"), "{out}");
    assert!(out.contains("a run on seeded random inputs"), "{out}");
    // The same with an input laid out by an `expr:`, which a run cannot build rank inputs
    // from: nothing concrete confirms the difference, so the verdict is never 1 (nor 0).
    std::fs::write(
        &case,
        text.replace(
            "  w1_0: { tp: Shard(0) }",
            "  w1_0: { expr: \"concat([r0.w1_0, r1.w1_0], 0)\" }",
        ),
    )
    .unwrap();
    let (code, out) = verify(&case);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("a run could not settle it"), "{out}");
}

#[test]
fn correct_llama_plans_verify() {
    // RMSNorm, RoPE, grouped-query attention (kv heads replicated when tp exceeds them),
    // SwiGLU, cross-entropy; backward and SGD in the full iteration.
    for (mesh, extra) in [
        ("tp=2", &[][..]),
        ("tp=2", &["--forward-only"][..]),
        ("tp=4", &[][..]),
        ("dp=2", &[][..]),
        ("dp=2,tp=2", &[][..]),
        ("tp=2", &["--vocab-parallel", "--forward-only"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_model("llama", dir.path(), mesh, extra);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "llama {mesh} {extra:?}:\n{out}");
        assert!(out.contains("loss = r0.loss"), "{out}");
    }
}

// The vocab-parallel full iterations (cross-entropy and embedding backward): verify_vocab.rs.

#[test]
fn llama_missing_oproj_allreduce_is_refuted_at_the_residual() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_model(
        "llama",
        dir.path(),
        "tp=2",
        &["--bug", "llama-oproj-missing-allreduce"],
    );
    let (code, out) = verify(&case);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("(aten.add.Tensor)"), "{out}");
    assert!(out.contains("unreduced partial sum"), "{out}");
}

#[test]
fn expr_layouts_are_relations() {
    // The same plan with two inputs laid out by explicit expressions instead of placements.
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), "tp=2", &[]);
    let text = std::fs::read_to_string(&case).unwrap();
    let text = text
        .replace(
            "  w1_0: { tp: Shard(0) }",
            "  w1_0: { expr: \"concat([r0.w1_0, r1.w1_0], 0)\" }",
        )
        .replace(
            "  w2_0: { tp: Shard(1) }",
            "  w2_0: { expr: \"transpose(concat([transpose(r0.w2_0, 0, 1), transpose(r1.w2_0, 1, 0)], 0), -1, 0)\" }",
        );
    assert!(text.contains("expr:"), "{text}");
    std::fs::write(&case, &text).unwrap();
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{out}");
    // Pieces in the wrong order: never verified.
    std::fs::write(
        &case,
        text.replace(
            "concat([r0.w1_0, r1.w1_0], 0)",
            "concat([r1.w1_0, r0.w1_0], 0)",
        ),
    )
    .unwrap();
    let (code, out) = verify(&case);
    assert_ne!(code, 0, "{out}");
}

/// Llama catalog bugs: (bug, mesh, the operator named, the evidence named).
type Refuted = (&'static str, &'static str, &'static str, &'static str);
const LLAMA_REFUTED: &[Refuted] = &[
    (
        "llama-attn-scale-local",
        "tp=2",
        "`mul_7`",
        "wrong scale factor",
    ),
    ("wrong-group", "dp=2,tp=2", "`add_4`", "wrong process group"),
    (
        "llama-qkv-grad-missing-allreduce",
        "tp=2",
        "(aten.add.Tensor)",
        "partial sum",
    ),
    (
        "llama-kv-grad-unsynced",
        "tp=4",
        "(aten.sub.Tensor)",
        "unreduced partial sum",
    ),
];

#[test]
fn llama_catalog_bugs_are_refuted_with_their_evidence() {
    for &(bug, mesh, op, evidence) in LLAMA_REFUTED {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_model("llama", dir.path(), mesh, &["--bug", bug]);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{bug}:\n{out}");
        assert!(out.contains(op) && out.contains(evidence), "{bug}:\n{out}");
    }
}

#[test]
fn correct_gpt2_plans_verify() {
    // LayerNorm, learned positions, biased linears (addmm), GELU; Megatron TP and SP. The
    // activations are sequence-first, so under dp the flattened rows of the ranks interleave.
    for (mesh, extra) in [
        ("tp=2", &[][..]),
        ("dp=2", &[][..]),
        ("tp=2", &["--sequence-parallel"][..]),
        ("tp=4", &[][..]),
        ("dp=2,tp=2", &["--sequence-parallel", "--forward-only"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_model("gpt2", dir.path(), mesh, extra);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "gpt2 {mesh} {extra:?}:\n{out}");
    }
}

#[test]
fn gpt2_fused_linear_bugs_are_refuted_inside_addmm() {
    // GPT-2's linears are fused (addmm): the evidence is the product inside the operator.
    for (bug, mesh, evidence) in [
        ("tp-missing-allreduce", "tp=2", "unreduced partial sum"),
        ("tp-bias-before-allreduce", "tp=2", "reduces only after"),
        ("wrong-group", "dp=2,tp=2", "wrong process group"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_model("gpt2", dir.path(), mesh, &["--bug", bug, "--forward-only"]);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{bug}:\n{out}");
        assert!(
            out.contains("(aten.addmm.default)")
                && out.contains("the product inside")
                && out.contains(evidence),
            "{bug}:\n{out}"
        );
    }
}

#[test]
fn correct_training_plans_verify() {
    // Adam, clipping with Megatron's distributed norm (tp-replicated parameters counted on one
    // rank, partial running totals), loss scaling, gradient accumulation and ZeRO.
    for (model, mesh, extra) in [
        ("mlp", "dp=2,tp=2", &["--optimizer", "adam"][..]),
        ("mlp", "tp=2", &["--clip-grad", "1.0"][..]),
        ("mlp", "dp=2,tp=2", &["--loss-scale", "1024"][..]),
        ("mlp", "dp=2", &["--grad-accum", "2", "--batch", "4"][..]),
        ("mlp", "dp=2", &["--zero", "3"][..]),
        ("llama", "tp=2", &["--clip-grad", "1.0"][..]),
        // ZeRO-2 shards every gradient over dp: each rank's running total of squared norms
        // holds other terms than the spec's chain, reduced over tp and then dp.
        (
            "gpt2",
            "dp=2,tp=2",
            &["--clip-grad", "1.0", "--zero", "2"][..],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_model(model, dir.path(), mesh, extra);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "{model} {mesh} {extra:?}:\n{out}");
    }
}

/// Training catalog bugs on the MLP: (bug, mesh, emit flags, the evidence named).
type TrainingRefuted = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);
const TRAINING_REFUTED: &[TrainingRefuted] = &[
    (
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
        "constant factor",
    ),
    (
        "zero-param-update-skipped",
        "dp=2",
        &["--zero", "1"],
        "the case expects",
    ),
    (
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
        "counted once per rank",
    ),
];

#[test]
fn training_bugs_are_refuted() {
    for &(bug, mesh, extra, evidence) in TRAINING_REFUTED {
        let dir = tempfile::tempdir().unwrap();
        let mut args = extra.to_vec();
        args.extend(["--bug", bug]);
        let case = emit_model("mlp", dir.path(), mesh, &args);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{bug}:\n{out}");
        assert!(out.contains(evidence), "{bug}:\n{out}");
    }
}

#[test]
fn pipelines_verify_through_send_and_recv() {
    // A recv is the tensor its matched send posted, on the sending stage; microbatch losses and
    // accumulated gradients are the sums the spec's whole-batch operators split into.
    for (model, mesh, extra) in [
        ("mlp", "pp=2,dp=2,tp=2", &["--pp-schedule", "1f1b"][..]),
        ("mlp", "pp=2", &["--forward-only"][..]),
        ("llama", "pp=2", &[][..]),
        // The tied token embedding held by the first and last stages, its shares all-reduced.
        ("gpt2", "pp=2", &[][..]),
        ("deepseek", "pp=2", &["--forward-only", "--batch", "8"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["--layers", "2", "--microbatches", "2"];
        args.extend(extra);
        let case = emit_model(model, dir.path(), mesh, &args);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "{model} {mesh} {extra:?}:\n{out}");
    }
}

/// Pipeline catalog bugs: (model, bug, mesh, the exit code verify gives).
const PIPELINE_VERDICTS: &[(&str, &str, &str, i32)] = &[
    ("mlp", "pp-grad-sync-before-last-microbatch", "dp=2,pp=2", 1),
    ("mlp", "pp-shuffled-microbatches", "dp=2,pp=2", 1),
    ("mlp", "pp-mismatched-send-recv", "pp=2", 1),
    ("mlp", "pp-wrong-stage-division", "pp=2", 1),
];

/// Pipeline bugs `verify` refutes without relations reaching them: a recv that waits forever
/// (the schedule check) and a stage division that computes another model (a counterexample).
const REFUTED_BY_A_RUN_OR_THE_SCHEDULE: &[&str] =
    &["pp-mismatched-send-recv", "pp-wrong-stage-division"];

#[test]
fn pipeline_bugs_are_never_verified() {
    // Gradients synchronized before the last microbatch are refuted at a weight gradient; a
    // recv that never gets its message is a hang; a wrong stage division a counterexample.
    for &(model, bug, mesh, want) in PIPELINE_VERDICTS {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "--layers",
            "2",
            "--batch",
            "4",
            "--microbatches",
            "2",
            "--bug",
            bug,
        ];
        let case = emit_model(model, dir.path(), mesh, &args);
        let (code, out) = verify(&case);
        assert_eq!(code, want, "{model} {bug}:\n{out}");
        if bug == "pp-shuffled-microbatches" {
            assert!(out.contains("misaligned"), "{out}");
        }
        // A recv that waits forever is a hang found before any relation; a wrong stage
        // division computes another loss, which a run shows.
        if bug == "pp-mismatched-send-recv" {
            assert!(out.contains("decided by: schedule"), "{out}");
        }
        if bug == "pp-wrong-stage-division" {
            assert!(out.contains("decided by: counterexample"), "{out}");
        }
    }
}

#[test]
fn moe_forward_plans_verify() {
    // Top-k routing and the gate scatter per token piece, expert groups regrouped across the
    // all-gather dispatch and reduce-scatter combine.
    for mesh in ["tp=2", "ep=2", "tp=2,ep=2"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_model("deepseek", dir.path(), mesh, &["--forward-only"]);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "deepseek {mesh}:\n{out}");
    }
}

/// A two-rank Ulysses-style case: columns sharded, `all_to_all_single` to rows, an elementwise
/// op, and back (`back: false` leaves the rows layout, which the case does not expect).
fn all_to_all_case(dir: &Path, back: bool) -> PathBuf {
    std::fs::write(
        dir.join("spec.py"),
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\"):\n        y: \"f32[4, 6]\" = torch.ops.aten.relu.default(x)\n        return (y,)\n",
    )
    .unwrap();
    let tail = if back {
        "        a2a_1: \"f32[4, 3]\" = torch.ops._c10d_functional.all_to_all_single.default(relu, [2, 2], [2, 2], 'ep')\n        y: \"f32[4, 3]\" = torch.ops._c10d_functional.wait_tensor.default(a2a_1)\n"
    } else {
        "        y: \"f32[4, 3]\" = torch.ops.aten.clone.default(relu)\n"
    };
    let rank = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 3]\"):\n        a2a: \"f32[4, 3]\" = torch.ops._c10d_functional.all_to_all_single.default(x, [2, 2], [2, 2], 'ep')\n        rows: \"f32[4, 3]\" = torch.ops._c10d_functional.wait_tensor.default(a2a)\n        relu: \"f32[4, 3]\" = torch.ops.aten.relu.default(rows)\n{tail}        return (y,)\n"
    );
    std::fs::write(dir.join("r0.py"), &rank).unwrap();
    std::fs::write(dir.join("r1.py"), &rank).unwrap();
    let case = dir.join("case.yaml");
    std::fs::write(
        &case,
        "version: 1\nname: a2a\nspec:\n  graph: spec.py\nimpl:\n  mesh: { ep: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"ep\": ep\ninputs:\n  x: { ep: Shard(1) }\noutputs:\n  y: { ep: Shard(1) }\n",
    )
    .unwrap();
    case
}

#[test]
fn all_to_all_is_a_rearrangement() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = verify(&all_to_all_case(dir.path(), true));
    assert_eq!(code, 0, "{out}");
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = verify(&all_to_all_case(dir.path(), false));
    assert_ne!(code, 0, "{out}");
}

/// Further catalog bugs verify refutes: (model, bug, mesh, emit flags).
const OTHER_REFUTED: &[(&str, &str, &str, &[&str])] = &[
    ("mlp", "dangling-backward-tensor", "dp=2", &[]),
    (
        "gpt2",
        "zero-tied-embedding-untied",
        "dp=2",
        &["--zero", "1"],
    ),
    (
        "gpt2",
        "sp-layernorm-grad-not-reduced",
        "tp=2",
        &["--sequence-parallel"],
    ),
    ("mlp", "fp8-amax-wrong-group", "dp=2,tp=2", &["--fp8"]),
];

#[test]
fn more_catalog_bugs_are_refuted() {
    for &(model, bug, mesh, extra) in OTHER_REFUTED {
        let dir = tempfile::tempdir().unwrap();
        let mut args = extra.to_vec();
        args.extend(["--bug", bug]);
        let case = emit_model(model, dir.path(), mesh, &args);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{bug}:\n{out}");
        assert!(out.contains("relations stop at spec operator"), "{out}");
    }
}

/// Every catalog bug the catalog assigns to `verify`, on every model it is defined for: (model,
/// bug, mesh, emit flags, the spec operator where relations stop). The operator is the first
/// spec value the ranks never compute (see each entry's `spec_op` in the catalog).
type Localized = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);
/// The emit flags of a pipelined entry: two microbatches of two rows over two layers.
const PIPELINED: &[&str] = &["--microbatches", "2", "--layers", "2", "--batch", "4"];

const LOCALIZED: &[Localized] = &[
    (
        "mlp",
        "tp-missing-allreduce",
        "tp=2",
        &[],
        "`add_1` (aten.add.Tensor)",
    ),
    (
        "gpt2",
        "tp-missing-allreduce",
        "tp=2",
        &[],
        "`addmm_5` (aten.addmm.default)",
    ),
    (
        "mlp",
        "tp-bias-before-allreduce",
        "tp=2",
        &[],
        "`add_1` (aten.add.Tensor)",
    ),
    (
        "gpt2",
        "tp-bias-before-allreduce",
        "tp=2",
        &[],
        "`addmm_5` (aten.addmm.default)",
    ),
    (
        "mlp",
        "dp-loss-not-averaged",
        "dp=2",
        &[],
        "`loss` (aten.mean.default)",
    ),
    (
        "llama",
        "dp-loss-not-averaged",
        "dp=2",
        &[],
        "`loss` (aten.nll_loss_forward.default)",
    ),
    (
        "gpt2",
        "dp-loss-not-averaged",
        "dp=2",
        &[],
        "`loss` (aten.nll_loss_forward.default)",
    ),
    (
        "mlp",
        "dp-grad-not-averaged",
        "dp=2",
        &[],
        "`mm_4` (aten.mm.default)",
    ),
    (
        "llama",
        "dp-grad-not-averaged",
        "dp=2",
        &[],
        "`embedding_dense_backward` (aten.embedding_dense_backward.default)",
    ),
    (
        "gpt2",
        "dp-grad-not-averaged",
        "dp=2",
        &[],
        "`add_15` (aten.add.Tensor)",
    ),
    (
        "mlp",
        "wrong-group",
        "dp=2,tp=2",
        &[],
        "`add_1` (aten.add.Tensor)",
    ),
    (
        "llama",
        "wrong-group",
        "dp=2,tp=2",
        &[],
        "`add_4` (aten.add.Tensor)",
    ),
    (
        "gpt2",
        "wrong-group",
        "dp=2,tp=2",
        &[],
        "`addmm_3` (aten.addmm.default)",
    ),
    (
        "llama",
        "llama-oproj-missing-allreduce",
        "tp=2",
        &[],
        "`add_4` (aten.add.Tensor)",
    ),
    (
        "llama",
        "llama-attn-scale-local",
        "tp=2",
        &[],
        "`mul_7` (aten.mul.Scalar)",
    ),
    (
        "llama",
        "llama-qkv-grad-missing-allreduce",
        "tp=2",
        &[],
        "`add_28` (aten.add.Tensor)",
    ),
    (
        "llama",
        "llama-kv-grad-unsynced",
        "tp=4",
        &[],
        "`wk_0_new` (aten.sub.Tensor)",
    ),
    (
        "gpt2",
        "sp-layernorm-grad-not-reduced",
        "tp=2",
        &["--sequence-parallel"],
        "`ln1_w_0_new` (aten.sub.Tensor)",
    ),
    (
        "mlp",
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
        "`loss` (aten.mean.default)",
    ),
    (
        "llama",
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
        "`loss` (aten.nll_loss_forward.default)",
    ),
    (
        "gpt2",
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
        "`loss` (aten.nll_loss_forward.default)",
    ),
    (
        "mlp",
        "zero-param-update-skipped",
        "dp=2",
        &["--zero", "1"],
        "`w1_0_new` (aten.sub.Tensor)",
    ),
    (
        "llama",
        "zero-param-update-skipped",
        "dp=2",
        &["--zero", "1"],
        "`embed_new` (aten.sub.Tensor)",
    ),
    (
        "gpt2",
        "zero-param-update-skipped",
        "dp=2",
        &["--zero", "1"],
        "`wte_new` (aten.sub.Tensor)",
    ),
    (
        "mlp",
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
        "`add_2` (aten.add.Tensor)",
    ),
    (
        "llama",
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
        "`add_30` (aten.add.Tensor)",
    ),
    (
        "gpt2",
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
        "`add_19` (aten.add.Tensor)",
    ),
    (
        "mlp",
        "pp-grad-sync-before-last-microbatch",
        "pp=2,dp=2",
        PIPELINED,
        "`mm_10` (aten.mm.default)",
    ),
    (
        "llama",
        "pp-grad-sync-before-last-microbatch",
        "pp=2,dp=2",
        PIPELINED,
        "`embedding_dense_backward` (aten.embedding_dense_backward.default)",
    ),
    (
        "gpt2",
        "pp-grad-sync-before-last-microbatch",
        "pp=2,dp=2",
        PIPELINED,
        "`add_15` (aten.add.Tensor)",
    ),
    (
        "mlp",
        "pp-shuffled-microbatches",
        "pp=2",
        PIPELINED,
        "`sub` (aten.sub.Tensor)",
    ),
    (
        "llama",
        "pp-shuffled-microbatches",
        "pp=2",
        PIPELINED,
        "`loss` (aten.nll_loss_forward.default)",
    ),
    (
        "gpt2",
        "pp-shuffled-microbatches",
        "pp=2",
        PIPELINED,
        "`loss` (aten.nll_loss_forward.default)",
    ),
    (
        "deepseek",
        "pp-shuffled-microbatches",
        "pp=2",
        PIPELINED,
        "`nll_loss` (aten.nll_loss_forward.default)",
    ),
    (
        "mlp",
        "dangling-backward-tensor",
        "dp=2",
        &[],
        "`mm_4` (aten.mm.default)",
    ),
    (
        "mlp",
        "dangling-backward-tensor",
        "tp=2",
        &[],
        "`mul_1` (aten.mul.Scalar)",
    ),
    (
        "gpt2",
        "zero-tied-embedding-untied",
        "dp=2",
        &["--zero", "1"],
        "`add_15` (aten.add.Tensor)",
    ),
    (
        "mlp",
        "fp8-amax-wrong-group",
        "dp=2,tp=2",
        &["--fp8"],
        "`div` (aten.div.Tensor)",
    ),
    (
        "mlp",
        "loss-scale-not-unscaled",
        "dp=2",
        &["--loss-scale", "8"],
        "`mul_2` (aten.mul.Scalar)",
    ),
    (
        "llama",
        "loss-scale-not-unscaled",
        "dp=2",
        &["--loss-scale", "8"],
        "`mul_68` (aten.mul.Scalar)",
    ),
    (
        "gpt2",
        "loss-scale-not-unscaled",
        "dp=2",
        &["--loss-scale", "8"],
        "`mul_5` (aten.mul.Scalar)",
    ),
    (
        "deepseek",
        "moe-aux-loss-not-divided-by-tp",
        "tp=2",
        &[],
        "`loss` (aten.add.Tensor)",
    ),
    (
        "deepseek",
        "moe-router-grad-unsynced",
        "tp=2",
        &[],
        "`router_0_new` (aten.sub.Tensor)",
    ),
    (
        "deepseek",
        "norm-sharded-hidden",
        "tp=2",
        &[],
        "`mean_1` (aten.mean.dim)",
    ),
    (
        "deepseek",
        "ep-expert-grad-not-averaged",
        "ep=2",
        &[],
        "`bmm_22` (aten.bmm.default)",
    ),
];

/// Emits and verifies the entries of [`LOCALIZED`] for `models`: each is refuted at its
/// operator.
fn bugs_are_refuted_at_their_operator(models: &[&str]) {
    for &(model, bug, mesh, extra, at) in LOCALIZED.iter().filter(|l| models.contains(&l.0)) {
        let dir = tempfile::tempdir().unwrap();
        let mut args = extra.to_vec();
        args.extend(["--bug", bug]);
        let case = emit_model(model, dir.path(), mesh, &args);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{model} {bug} {mesh}:\n{out}");
        assert!(
            out.contains(&format!("relations stop at spec operator {at}")),
            "{model} {bug} {mesh}: expected the stop at {at}:\n{out}"
        );
    }
}

#[test]
fn mlp_bugs_are_refuted_at_their_operator() {
    bugs_are_refuted_at_their_operator(&["mlp"]);
}

#[test]
fn llama_bugs_are_refuted_at_their_operator() {
    bugs_are_refuted_at_their_operator(&["llama"]);
}

#[test]
fn gpt2_bugs_are_refuted_at_their_operator() {
    bugs_are_refuted_at_their_operator(&["gpt2"]);
}

#[test]
fn deepseek_bugs_are_refuted_at_their_operator() {
    bugs_are_refuted_at_their_operator(&["deepseek"]);
}

#[test]
fn every_model_of_a_verify_bug_is_localized() {
    let claimed: std::collections::BTreeSet<(&str, &str)> = shardproof_zoo::BUGS
        .iter()
        .filter(|b| b.engines.split(',').any(|e| e.trim() == "verify"))
        .flat_map(|b| b.models.iter().map(move |m| (b.id, *m)))
        .collect();
    let tested: std::collections::BTreeSet<(&str, &str)> =
        LOCALIZED.iter().map(|l| (l.1, l.0)).collect();
    assert_eq!(claimed, tested);
}

#[test]
fn the_catalog_assigns_to_verify_exactly_the_bugs_these_tests_refute() {
    let mut tested: std::collections::BTreeSet<&str> = MLP_REFUTED.iter().copied().collect();
    tested.extend(LLAMA_REFUTED.iter().map(|r| r.0));
    tested.extend(TRAINING_REFUTED.iter().map(|r| r.0));
    // The catalog's `verify` means relations localize the bug; the pipeline bugs that only a
    // run or the schedule check refutes are not claimed.
    tested.extend(
        PIPELINE_VERDICTS
            .iter()
            .filter(|r| r.3 == 1 && !REFUTED_BY_A_RUN_OR_THE_SCHEDULE.contains(&r.1))
            .map(|r| r.1),
    );
    tested.extend(OTHER_REFUTED.iter().map(|r| r.1));
    tested.insert("llama-oproj-missing-allreduce");
    tested.extend(LOCALIZED.iter().map(|l| l.1));
    let claimed: std::collections::BTreeSet<&str> = shardproof_zoo::BUGS
        .iter()
        .filter(|b| b.engines.split(',').any(|e| e.trim() == "verify"))
        .map(|b| b.id)
        .collect();
    assert_eq!(claimed, tested);
}

#[test]
fn fp8_plans_verify() {
    // The per-tensor amax of a sharded weight is a max over ranks (an all-reduce max); the FP8
    // quantize-dequantize (log2, floor, clamp, exp2, round) is elementwise, so it acts piece by
    // piece on the shards.
    for (mesh, extra) in [
        ("tp=2", &["--fp8"][..]),
        ("dp=2,tp=2", &["--fp8", "--recompute"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(dir.path(), mesh, extra);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "{mesh} {extra:?}:\n{out}");
    }
    // The recomputation reading the master weight instead of its FP8 cast is `run`'s to find;
    // under dp the local mean's factor (made good by the gradient average) must not be blamed.
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--fp8", "--recompute", "--bug", "fp8-recompute-wrong-cast"];
    let case = emit(dir.path(), "dp=2,tp=2", &extra);
    let (code, out) = verify(&case);
    assert_ne!(code, 0, "{out}");
    assert!(
        !out.contains("scale factor") && !out.contains("constant factor"),
        "{out}"
    );
}

/// `--time-limit` stops relation inference; the verdict then rests on the counterexample
/// search, which runs first: a planted bug is still refuted (by the run), a correct plan is
/// inconclusive with the limit named (with `--no-prove`), never verified by relations; the
/// element-level prover then proves it. A limit of a microsecond is always hit: relation
/// inference takes milliseconds even on the smallest case. `limit` is the limit and any further
/// flags, separated by spaces.
#[test]
fn time_limit_leaves_the_verdict_to_the_counterexample_search() {
    let json_verify = |case: &Path, limit: &str| {
        let out = bin()
            .arg("verify")
            .arg(case)
            .args(["--json", "--quiet", "--time-limit"])
            .args(limit.split(' '))
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code(), report)
    };
    let dir = tempfile::tempdir().unwrap();
    let buggy = emit(dir.path(), "tp=2", &["--bug", "tp-missing-allreduce"]);
    let (code, r) = json_verify(&buggy, "0.000001");
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(r["decided_by"], "counterexample", "{r:#}");
    assert!(r["counterexample"]["output"].is_string(), "{r:#}");
    assert!(
        r["reason"].as_str().unwrap().contains("time limit"),
        "{r:#}"
    );

    let dir = tempfile::tempdir().unwrap();
    let correct = emit(dir.path(), "tp=2", &[]);
    let (code, r) = json_verify(&correct, "0.000001 --no-prove");
    assert_eq!(code, Some(3), "{r:#}");
    assert_eq!(r["verdict"], "inconclusive", "{r:#}");
    assert!(
        r["reason"].as_str().unwrap().contains("time limit"),
        "{r:#}"
    );
    assert!(
        r["search"]
            .as_str()
            .unwrap()
            .contains("matches every output"),
        "{r:#}"
    );
    // The element-level prover, on by default, decides what the limit left open.
    let (code, r) = json_verify(&correct, "0.000001");
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["decided_by"], "prove", "{r:#}");
    // A generous limit changes nothing.
    let (code, r) = json_verify(&correct, "600");
    assert_eq!(code, Some(0), "{r:#}");

    let out = bin()
        .arg("verify")
        .arg(&correct)
        .arg("--time-limit=-1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected a number of seconds"));
}
