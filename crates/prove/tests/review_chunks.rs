//! Adversarial review of load-balanced chunk cuts (`stage/chunks.rs`, `PlanOptions::chunked`):
//! a cp rank holds sequence chunks `i` and `2p-1-i`, selected from the whole sequence in its
//! graph (`slice`s of `tokens` and `labels`, `arange`s of its positions). Planted in the
//! ranks' selection: a wrong chunk pair, the right pair in the wrong order, positions right on
//! one chunk and wrong on the other; each is refuted, never proved. cp = 4 (8 chunks) and
//! chunks of 2 tokens are proved, and orders stated for another rank count or as two
//! sequences refuted.
//!
//! Two known holes (ignored tests): a chunk order is a restatement of a relation, right for a
//! cut (the chain establishes what later stages assume) but not for a case input (it replaces
//! what the case assumes of the input: a wrong selection is proved) nor for an `outputs:`
//! entry naming a chunked cut (the entry's contiguous claim is proved as the reordered one).

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;
use zoo_emit::edit_rank;

use shardproof_prove::{
    prove_staged_with, ChunkedCuts, LoadBalanced, PlanOptions, ProveConfig, Verdict,
};
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// A one-layer llama of width 4 (2 heads, `2·cp` tokens: one per chunk, vocabulary 4, batch
/// 2) on `cp=<cp>`, forward, emitted into `dir` (ranks edited by `edit`) and cut at every
/// module output as load-balanced chunks.
fn emit_cut(dir: &Path, cp: usize, edit: &dyn Fn(&Path)) -> (shardproof_case::Case, PlanOptions) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: shardproof_zoo::LlamaConfig {
            seq: 2 * cp,
            ..zoo_emit::width4_llama(1, 2, 4)
        },
        mesh: Mesh::parse(&format!("cp={cp}")).unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: false,
    };
    zoo_emit::emit(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    edit(dir);
    let (cuts, chunked) = layer_cuts::cut_at_modules_load_balanced(dir, false);
    assert!(cuts >= 2 && chunked.len() == cuts, "{cuts} {chunked:?}");
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let plan = PlanOptions {
        chunked,
        ..PlanOptions::default()
    };
    (case, plan)
}

/// The staged verdict; a refutation must carry a counterexample the interpreter confirmed.
fn verdict(case: &shardproof_case::Case, plan: &PlanOptions) -> Verdict {
    let proof = prove_staged_with(case, &ProveConfig::default(), 1, plan);
    if proof.verdict == Verdict::Refuted {
        assert!(
            proof
                .refuted
                .as_ref()
                .is_some_and(|p| p.counterexample.is_some()),
            "{:?}",
            proof.message
        );
    }
    proof.verdict
}

/// Replaces `from` by `to` in the first line of rank `rank` holding `pattern`.
fn replace(dir: &Path, rank: usize, pattern: &str, from: &str, to: &str) {
    edit_rank(dir, rank, pattern, &|l| {
        assert!(l.contains(from), "{l}");
        l.replacen(from, to, 1)
    });
}

// The selection lines every cp rank's graph opens with (cp = 2, one token per chunk).
const TOKENS_2ND: &str = "slice_1: \"i64[2, 1]\" = torch.ops.aten.slice.Tensor(tokens";
const LABELS_2ND: &str = "slice_3: \"i64[2, 1]\" = torch.ops.aten.slice.Tensor(labels";
const POSITIONS_2ND: &str = "arange_1: \"i64[1]\" = torch.ops.aten.arange.start(";

#[test]
fn a_wrong_chunk_pair_is_refuted() {
    // Rank 0 holds chunks 0 and 2 (tokens, labels and positions alike): token 3 is never
    // computed, token 2 twice.
    let dir = tempfile::tempdir().unwrap();
    let (case, plan) = emit_cut(dir.path(), 2, &|d| {
        replace(d, 0, TOKENS_2ND, "1, 3, 4)", "1, 2, 3)");
        replace(d, 0, LABELS_2ND, "1, 3, 4)", "1, 2, 3)");
        replace(d, 0, POSITIONS_2ND, "(3, 4,", "(2, 3,");
    });
    assert_eq!(verdict(&case, &plan), Verdict::Refuted);
}

#[test]
fn the_right_chunk_pair_in_the_wrong_order_is_refuted() {
    // Rank 1 holds chunk 2 then chunk 1, consistently (tokens, labels, positions).
    let dir = tempfile::tempdir().unwrap();
    let (case, plan) = emit_cut(dir.path(), 2, &|d| {
        for (pattern, from, to) in [
            ("cat: \"i64[2, 2]\"", "[slice, slice_1]", "[slice_1, slice]"),
            (
                "cat_1: \"i64[2, 2]\"",
                "[slice_2, slice_3]",
                "[slice_3, slice_2]",
            ),
            (
                "cat_2: \"i64[2]\"",
                "[arange, arange_1]",
                "[arange_1, arange]",
            ),
        ] {
            replace(d, 1, pattern, from, to);
        }
    });
    assert_eq!(verdict(&case, &plan), Verdict::Refuted);
}

#[test]
fn positions_right_on_one_chunk_and_wrong_on_the_other_are_refuted() {
    // Rank 0's second chunk (3) at position 2: its tokens and the first chunk are right.
    let dir = tempfile::tempdir().unwrap();
    let (case, plan) = emit_cut(dir.path(), 2, &|d| {
        replace(d, 0, POSITIONS_2ND, "(3, 4,", "(2, 3,")
    });
    assert_eq!(verdict(&case, &plan), Verdict::Refuted);
}

#[test]
fn cp_4_forward_cut_at_load_balanced_chunks_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let (case, plan) = emit_cut(dir.path(), 4, &|_| {});
    assert!(plan.chunked.values().all(|lb| lb.ranks == 4));
    assert_eq!(verdict(&case, &plan), Verdict::Proved);
    // Stated for 2 ranks (4 chunks of 2 tokens), the cuts are refuted.
    let two: ChunkedCuts = plan
        .chunked
        .iter()
        .map(|(k, lb)| (k.clone(), LoadBalanced { ranks: 2, ..*lb }))
        .collect();
    let wrong = PlanOptions {
        chunked: two,
        ..plan.clone()
    };
    assert_eq!(verdict(&case, &wrong), Verdict::Refuted);
}

#[test]
fn chunks_of_two_tokens_are_proved_and_read_as_two_sequences_refuted() {
    // cp = 2 over 8 tokens: chunks of 2. The same dim stated as 2 sequences of 4 (each in 4
    // chunks of 1: the order of a flattened batch) puts other tokens on each rank: refuted.
    let dir = tempfile::tempdir().unwrap();
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: shardproof_zoo::LlamaConfig {
            seq: 8,
            ..zoo_emit::width4_llama(1, 2, 4)
        },
        mesh: Mesh::parse("cp=2").unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: false,
    };
    zoo_emit::emit(
        dir.path(),
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    let (_, chunked) = layer_cuts::cut_at_modules_load_balanced(dir.path(), false);
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let plan = PlanOptions {
        chunked,
        ..PlanOptions::default()
    };
    assert_eq!(verdict(&case, &plan), Verdict::Proved);
    let as_two = PlanOptions {
        chunked: plan
            .chunked
            .iter()
            .map(|(k, lb)| {
                (
                    k.clone(),
                    LoadBalanced {
                        sequences: 2,
                        ..*lb
                    },
                )
            })
            .collect(),
        ..plan.clone()
    };
    assert_eq!(verdict(&case, &as_two), Verdict::Refuted);
}

/// The spec `loss = sum(x · w)` over 4 positions; cp rank `r` selects its chunks of `x` at
/// `x_chunks[r]` and of `w` at the load-balanced `w_chunks[r]` (one position per chunk), sums
/// its products and the ranks all-reduce: right exactly where every rank's `x` and `w`
/// chunks are the same positions.
fn weighted_sum_case(dir: &Path, x_chunks: [[usize; 2]; 2]) -> shardproof_case::Case {
    weighted_sum_with(dir, x_chunks, "", "")
}

/// [`weighted_sum_case`] with more `inputs:` and `outputs:` entries (yaml lines).
fn weighted_sum_with(
    dir: &Path,
    x_chunks: [[usize; 2]; 2],
    inputs: &str,
    outputs: &str,
) -> shardproof_case::Case {
    std::fs::write(
        dir.join("spec.py"),
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1, 4]", w: "f32[1, 4]"):
        mul: "f32[1, 4]" = torch.ops.aten.mul.Tensor(x, w)
        loss: "f32[]" = torch.ops.aten.sum.default(mul)
        return (loss,)
"#,
    )
    .unwrap();
    let w_chunks = [[0, 3], [1, 2]];
    for r in 0..2 {
        let [a, b] = x_chunks[r];
        let [c, d] = w_chunks[r];
        std::fs::write(
            dir.join(format!("r{r}.py")),
            format!(
                r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1, 4]", w: "f32[1, 4]"):
        slice: "f32[1, 1]" = torch.ops.aten.slice.Tensor(x, 1, {a}, {})
        slice_1: "f32[1, 1]" = torch.ops.aten.slice.Tensor(x, 1, {b}, {})
        cat: "f32[1, 2]" = torch.ops.aten.cat.default([slice, slice_1], 1)
        slice_2: "f32[1, 1]" = torch.ops.aten.slice.Tensor(w, 1, {c}, {})
        slice_3: "f32[1, 1]" = torch.ops.aten.slice.Tensor(w, 1, {d}, {})
        cat_1: "f32[1, 2]" = torch.ops.aten.cat.default([slice_2, slice_3], 1)
        mul: "f32[1, 2]" = torch.ops.aten.mul.Tensor(cat, cat_1)
        sum_1: "f32[]" = torch.ops.aten.sum.default(mul)
        all_reduce: "f32[]" = torch.ops._c10d_functional.all_reduce.default(sum_1, 'sum', 'cp')
        loss: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        return (loss,)
"#,
                a + 1,
                b + 1,
                c + 1,
                d + 1
            ),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("case.yaml"),
        format!(
            "version: 1\nname: balanced\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ cp: 2 }}\n  graphs: [r0.py, r1.py]\n  groups:\n    \"cp\": cp\ninputs:\n  x: Replicate()\n  w: Replicate()\n{inputs}outputs:\n  loss: Replicate()\n{outputs}"
        ),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// A chunk order for the case input `x` (2 ranks, one sequence along dim 1).
fn x_in_chunks() -> PlanOptions {
    PlanOptions {
        chunked: ChunkedCuts::from([(
            "x".to_string(),
            LoadBalanced {
                dim: 1,
                ranks: 2,
                sequences: 1,
            },
        )]),
        ..PlanOptions::default()
    }
}

#[test]
fn contiguous_x_against_balanced_weights_is_refuted_as_written() {
    // The truth for the test below: the right selection is proved, the contiguous halves of
    // `x` (rank 0: positions 0, 1 against weights 0, 3) refuted with a confirmed
    // counterexample.
    let dir = tempfile::tempdir().unwrap();
    let right = weighted_sum_case(dir.path(), [[0, 3], [1, 2]]);
    assert_eq!(verdict(&right, &PlanOptions::default()), Verdict::Proved);
    let dir = tempfile::tempdir().unwrap();
    let wrong = weighted_sum_case(dir.path(), [[0, 1], [2, 3]]);
    assert_eq!(verdict(&wrong, &PlanOptions::default()), Verdict::Refuted);
}

#[test]
fn a_chunk_order_on_a_case_input_is_not_a_proof_of_the_case() {
    let dir = tempfile::tempdir().unwrap();
    let wrong = weighted_sum_case(dir.path(), [[0, 1], [2, 3]]);
    let proof = prove_staged_with(&wrong, &ProveConfig::default(), 1, &x_in_chunks());
    assert_ne!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

#[test]
fn an_output_entry_naming_a_chunked_cut_states_contiguous_pieces() {
    // The ranks' products are their load-balanced chunks: the cut `mul` stated in chunk order
    // holds, the `outputs:` entry `mul: Shard(1)` (contiguous pieces) does not.
    let dir = tempfile::tempdir().unwrap();
    let case = weighted_sum_with(
        dir.path(),
        [[0, 3], [1, 2]],
        "  mul: Shard(1)\n",
        "  mul: Shard(1)\n",
    );
    let mut plan = x_in_chunks();
    let order = plan.chunked.remove("x").unwrap();
    plan.chunked.insert("mul".into(), order);
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &plan);
    assert_ne!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

#[test]
fn a_cut_in_chunk_order_is_proved_and_in_contiguous_pieces_refuted() {
    // The control for the test above: the cut alone, in chunk order, is proved; stated as
    // contiguous pieces (no order), refuted.
    let dir = tempfile::tempdir().unwrap();
    let case = weighted_sum_with(dir.path(), [[0, 3], [1, 2]], "  mul: Shard(1)\n", "");
    let mut plan = x_in_chunks();
    let order = plan.chunked.remove("x").unwrap();
    plan.chunked.insert("mul".into(), order);
    assert_eq!(verdict(&case, &plan), Verdict::Proved);
    assert_eq!(verdict(&case, &PlanOptions::default()), Verdict::Refuted);
}
