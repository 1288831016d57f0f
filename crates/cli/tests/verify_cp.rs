//! `shardproof verify` on context-parallel plans (ring attention): correct plans verify, the
//! catalog's cp bugs are never verified.
//!
//! The suite runs the forward plans and one-layer full iterations; `heavy` holds the full
//! iterations at the zoo's default sizes, the larger meshes and the wider bug sweeps, minutes
//! each, which `scripts/heavy` runs (the default nextest profile leaves `heavy::` out).

mod common;

use common::{emit_zoo as emit, verify_exit as verify};

#[test]
fn llama_ring_attention_forward_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit("llama", dir.path(), "cp=2", &["--forward-only"]);
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("certificate:"), "{out}");
}

/// Head dim 2, forward: the scores are scaled by 1/sqrt(2), a factor that is no integer's
/// inverse; the ring's blocks are still finite products and its masked blocks drop out.
#[test]
fn llama_ring_attention_forward_with_an_irrational_softmax_scale_verifies() {
    llama_cp_verifies_with_scale(
        &["--forward-only", "--heads", "4", "--hidden", "8"],
        "0.7071067811865475",
    );
}

/// Head dim 8, full iteration: the scores are scaled by 1/sqrt(8), the exact binary fraction
/// that float is; the backward's factors (that scale, the ranks' share of the loss) compose
/// reduced, so the softmax backward relates and every parameter's update verifies.
#[test]
fn llama_ring_attention_full_iteration_with_an_irrational_softmax_scale_verifies() {
    llama_cp_verifies_with_scale(
        &[
            "--layers",
            "1",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--hidden",
            "16",
        ],
        "0.35355339059327373",
    );
}

/// Head dim 2, full iteration: the head dim equals the chunk length (8 tokens in 4 chunks), so
/// the attention's blocks are square; the row-sum lemma takes no transpose the graph lacks of a
/// square operand, and the backward's e-graph stays under the node limit.
#[test]
fn llama_ring_attention_full_iteration_with_square_blocks_verifies() {
    llama_cp_verifies_with_scale(
        &["--layers", "1", "--heads", "4", "--hidden", "8"],
        "0.7071067811865475",
    );
}

/// Emits llama on cp=2 with the `extra` emit flags, checks that rank 0 scales by the literal
/// `scale`, and asserts the case verifies.
fn llama_cp_verifies_with_scale(extra: &[&str], scale: &str) {
    let dir = tempfile::tempdir().unwrap();
    let case = emit("llama", dir.path(), "cp=2", extra);
    let text = std::fs::read_to_string(dir.path().join("r0.py")).unwrap();
    assert!(text.contains(scale), "{text}");
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("certificate:"), "{out}");
}

/// Bugs of the ring (masks, positions, loss scaling) are refuted or inconclusive, never
/// verified.
#[test]
fn cp_bugs_are_never_verified() {
    bugs_never_verify(
        "llama",
        "cp=2",
        &["--forward-only"],
        &["cp-causal-mask-local", "cp-loss-overscaled"],
    );
}

#[test]
fn gpt2_ring_attention_forward_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit("gpt2", dir.path(), "cp=2", &["--forward-only"]);
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("certificate:"), "{out}");
}

/// The ring within each dp replica: the chunks are taken from the dp rank's batch half.
#[test]
fn llama_dp_by_cp_forward_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit("llama", dir.path(), "dp=2,cp=2", &["--forward-only"]);
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("certificate:"), "{out}");
}

/// Emits `model` under tp=2 x cp=2 (forward only) and asserts it verifies: the ranks' merged
/// attention output lies deeper than most relations, in the engine's extra exploration rounds.
fn tp_by_cp_forward_verifies(model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(model, dir.path(), "tp=2,cp=2", &["--forward-only"]);
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{model}:\n{out}");
    assert!(out.contains("certificate:"), "{out}");
}

#[test]
fn llama_tp_by_cp_forward_verifies() {
    tp_by_cp_forward_verifies("llama");
}

/// deepseek under cp=2 x ep=2 (forward, one layer): each rank runs its experts on the tokens
/// its ep group gathered for its cp chunks, so the spec's experts-times-gates product relates
/// only as chunks cut out of the ranks' whole products, through different chains of views for
/// the outputs and the gates (`elementwise-through-layout`); it was inconclusive before.
#[test]
fn deepseek_cp_by_ep_forward_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(
        "deepseek",
        dir.path(),
        "cp=2,ep=2",
        &["--forward-only", "--layers", "1"],
    );
    let (code, out) = verify(&case);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("certificate:"), "{out}");
}

/// The cp bugs of a model on the full iteration (forward, backward through the ring, the
/// gradient reduction and the step) are refuted or inconclusive, never verified: the guard
/// the attention-backward lemmas must keep.
fn full_iteration_bugs_never_verify(model: &str, bugs: &[&str]) {
    bugs_never_verify(model, "cp=2", &[], bugs);
}

/// Each of `bugs`, planted in `model` on `mesh` with the `extra` emit flags, is refuted or
/// inconclusive, never verified.
fn bugs_never_verify(model: &str, mesh: &str, extra: &[&str], bugs: &[&str]) {
    for bug in bugs {
        let dir = tempfile::tempdir().unwrap();
        let mut args = extra.to_vec();
        args.extend(["--bug", bug]);
        let case = emit(model, dir.path(), mesh, &args);
        let (code, out) = verify(&case);
        assert!(code == 1 || code == 3, "{model} {mesh} {bug}:\n{out}");
    }
}

#[test]
fn deepseek_cp_bug_full_iteration_is_never_verified() {
    full_iteration_bugs_never_verify("deepseek", &["cp-causal-mask-local"]);
}

/// Minutes each: run by `scripts/heavy`, outside the suite.
mod heavy {
    use super::common::shardproof_in;
    use super::*;

    #[test]
    fn gpt2_tp_by_cp_forward_verifies() {
        tp_by_cp_forward_verifies("gpt2");
    }

    #[test]
    fn deepseek_tp_by_cp_forward_verifies() {
        tp_by_cp_forward_verifies("deepseek");
    }

    /// deepseek on dp=2 x cp=2 x tp=2 x ep=2 (16 ranks, forward, one layer) verifies. The router
    /// statistics sum a rank's tokens over the sequence and all-reduce them over cp, which sums
    /// ranks of one tp group; the sum relates to that all-reduce only if every chunk of its
    /// operand names a rank of the same tp group, and through the tensor the rank computed, not
    /// through its copy all-gathered over ep. The extraction names, among equal expressions, the
    /// earliest-computed tensor and then the lowest rank; before, the choice followed the order
    /// terms entered the e-graph and relations stopped at `sum_2`.
    #[test]
    fn deepseek_dp_by_cp_by_tp_by_ep_forward_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(
            "deepseek",
            dir.path(),
            "dp=2,cp=2,tp=2,ep=2",
            &["--forward-only", "--layers", "1"],
        );
        let text = verified_trace(dir.path(), &case);
        let stats = trace_line(&text, "sum_2");
        assert!(
            stats.contains("[clean]") && stats.contains(".all_reduce_1"),
            "{stats}"
        );
    }

    /// The ring's bugs stay unverified when tp splits the heads as well, so that the spec's
    /// attention is a 4-D `matmul` over `[b, heads, seq, d]`: the rank-generic forms of the
    /// attention lemmas are no looser than the 3-D ones.
    #[test]
    fn tp_by_cp_bugs_are_never_verified() {
        bugs_never_verify(
            "llama",
            "tp=2,cp=2",
            &["--forward-only"],
            &[
                "cp-causal-mask-local",
                "cp-rope-no-offset",
                "cp-loss-overscaled",
            ],
        );
    }

    /// gpt2's cp bugs (positions without the chunk offset, block-local causal masks, the loss
    /// scaled by cp twice) are refuted or inconclusive, never verified.
    #[test]
    fn gpt2_cp_bugs_are_never_verified() {
        bugs_never_verify(
            "gpt2",
            "cp=2",
            &["--forward-only"],
            &[
                "cp-loss-overscaled",
                "cp-rope-no-offset",
                "cp-causal-mask-local",
            ],
        );
    }

    /// A bug or two per model (each full iteration runs a minute or more to its verdict); the
    /// forward tests cover every cp bug of llama and gpt2.
    #[test]
    fn llama_cp_bug_full_iteration_is_never_verified() {
        // The local mask hides other blocks than the global one: the zero blocks the ranks'
        // programs make must not stand in for the spec's.
        full_iteration_bugs_never_verify("llama", &["cp-rope-no-offset", "cp-causal-mask-local"]);
    }

    /// The ring's backward relates block by block: the recomputed probabilities' masked blocks are
    /// zeros (the element analysis of the ranks' programs), so each rank's whole-block products are
    /// the spec's block products, and dQ, dK and dV meet the ranks' running totals.
    #[test]
    fn llama_ring_attention_full_iteration_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let case = emit("llama", dir.path(), "cp=2", &[]);
        let (code, out) = verify(&case);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("certificate:"), "{out}");
    }

    /// The trace of `verify` on a model's cp=2 full iteration, which must verify with a certificate.
    fn verified_cp_trace(model: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(model, dir.path(), "cp=2", &[]);
        let text = verified_trace(dir.path(), &case);
        assert!(text.contains("certificate:"), "{text}");
        text
    }

    /// The trace of `verify` on `case` (emitted into `dir`), which must verify.
    fn verified_trace(dir: &std::path::Path, case: &std::path::Path) -> String {
        let out = shardproof_in(
            dir,
            &["verify", "--quiet", "--trace", case.to_str().unwrap()],
        );
        let text = format!("{}{}", out.stdout, out.stderr);
        assert_eq!(out.code, Some(0), "{text}");
        text
    }

    /// The trace line of spec operator `op`.
    fn trace_line<'a>(text: &'a str, op: &str) -> &'a str {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{op} (")))
            .unwrap_or_else(|| panic!("no trace line for {op}:\n{text}"))
    }

    /// gpt2's positions without the chunk offset and its block-local masks stay unverified on the
    /// full iteration, now that its correct full iteration verifies (the lemmas that read a rank's
    /// products as multiples and blocks of its tensors must not paper over a wrong mask).
    #[test]
    fn gpt2_cp_bug_full_iteration_is_never_verified() {
        full_iteration_bugs_never_verify("gpt2", &["cp-rope-no-offset", "cp-causal-mask-local"]);
    }

    /// gpt2's full iteration verifies under cp. Its ranks scale the scores' gradient before the
    /// products (`bmm(transpose(0.5 dS), Q)`) while the spec's blocks hold the unscaled one: the
    /// products the lemmas look up are the ranks' tensors' multiples. dK's block of a rank's
    /// second chunk is that rank's product the other way round, its first query chunk masked; the
    /// spec's sums of transposed blocks meet the sums the ranks pass along the ring; dQ's blocks
    /// are rows of a rank's products over the keys it holds.
    #[test]
    fn gpt2_ring_attention_full_iteration_verifies() {
        let text = verified_cp_trace("gpt2");
        for (op, pieces) in [
            (
                "bmm_7",
                &[
                    "transpose.int(r1.bmm_12[dim 1: 2..4], 1, 2)",
                    "transpose.int(r0.bmm_17[dim 1: 2..4], 1, 2)",
                ][..],
            ),
            (
                "view_40",
                &["permute(r0.add_16[dim 2: 0..2], [0, 1, 3, 2])"][..],
            ),
            ("bmm_6", &["r1.add_15[dim 1: 0..2]"][..]),
        ] {
            let line = trace_line(&text, op);
            // Every block product reached the ranks' tensors: a multiple of a clean expression.
            assert!(!line.contains("bmm("), "{line}");
            for piece in pieces {
                assert!(line.contains(piece), "{line}");
            }
        }
    }

    /// gpt2 on dp=2 x cp=2, full iteration: each rank holds one sequence, so the key gradient the
    /// ring passes back is a batch of one; its blocks (the spec's sums of transposed products,
    /// viewed with the unit batch dim) meet the sums the ranks add as `[1, H, S, D]` tensors, and
    /// the key weight's gradient relates to the ranks' (a multiple of their sum).
    #[test]
    fn gpt2_dp_by_cp_full_iteration_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(
            "gpt2",
            dir.path(),
            "dp=2,cp=2",
            &["--layers", "1", "--heads", "2", "--hidden", "8"],
        );
        let text = verified_trace(dir.path(), &case);
        let line = trace_line(&text, "view_26");
        assert!(line.contains("permute(r1.add_10, [0, 1, 3, 2])"), "{line}");
        assert!(!line.contains("sum("), "{line}");
    }

    /// deepseek on cp=2 x ep=2, full iteration at the zoo's default sizes (two layers), verifies.
    /// Three steps were needed, each checked here by the trace:
    /// - the experts' output gradient relates as the ranks' own products (each rank's gates times
    ///   the gradient gathered over ep and broadcast over its experts: one expert's piece is one
    ///   index of that broadcast), and the experts' updated weights are clean;
    /// - the recomputed probabilities' masked blocks are known zero behind the ep reduce-scatter,
    ///   which pads its operand (the zero analysis pads);
    /// - the second layer's query gradient relates as a quarter of the ranks' chunks
    ///   (`r0.add_31 = slice + bmm(dS / 2, K)`), by the scale rewrites applied everywhere at the
    ///   first operator without a relation (the scheduler had banned them).
    #[test]
    fn deepseek_cp_by_ep_full_iteration_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let case = emit("deepseek", dir.path(), "cp=2,ep=2", &[]);
        let text = verified_trace(dir.path(), &case);
        assert!(text.contains("verified: deepseek-cp2-ep2"), "{text}");
        // Both layers' expert output gradients.
        for (op, rank_op) in [("mul_37", "mul_43"), ("mul_63", "mul_75")] {
            let grads = trace_line(&text, op);
            assert!(
                grads.contains(&format!("r0.{rank_op}"))
                    && grads.contains(&format!("r3.{rank_op}")),
                "{grads}"
            );
            assert!(!grads.contains("mul.Tensor("), "{grads}");
        }
        for layer in 0..2 {
            for weight in ["expert_gate", "expert_up", "expert_down"] {
                let line = trace_line(&text, &format!("{weight}_{layer}_new"));
                assert!(line.contains("[clean]"), "{line}");
            }
        }
        let dq = trace_line(&text, "bmm_18");
        assert!(
            dq.contains("r0.add_31") && dq.contains("r1.add_31") && dq.ends_with("* 1/4)"),
            "{dq}"
        );
        assert!(!dq.contains("bmm(") && !dq.contains("add.Tensor("), "{dq}");
    }

    /// gpt2's overscaled loss is refuted at the loss, and a run confirms it.
    #[test]
    fn gpt2_cp_bug_full_iteration_is_refuted() {
        let dir = tempfile::tempdir().unwrap();
        let case = emit("gpt2", dir.path(), "cp=2", &["--bug", "cp-loss-overscaled"]);
        let (code, out) = verify(&case);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("a run on seeded random inputs"), "{out}");
    }

    /// deepseek's full iteration verifies under cp. Its MoE backward relates first: the auxiliary
    /// loss's gradient (one value per sequence and expert, expanded over the tokens) and the
    /// router's logit gradient are the ranks' own per-token tensors over their chunks, halved (a
    /// rank's gradients are twice the spec's until the averaging over cp); each needs the engine's
    /// wider second attempt. The attention backward after it needs the router's top-k scores known
    /// positive (so the recomputed probabilities' masked blocks are known zero behind the MoE
    /// layer), and the experts' weight gradients sum each rank's two chunks of tokens.
    #[test]
    fn deepseek_ring_attention_full_iteration_verifies() {
        let text = verified_cp_trace("deepseek");
        for (op, tensor) in [
            ("mul_43", "mul_49"),
            ("sub_2", "sub_10"),
            ("add_20", "add_26"),
            ("sigmoid_backward", "sigmoid_backward"),
        ] {
            let line = trace_line(&text, op);
            for rank in ["r0", "r1"] {
                assert!(
                    line.contains(&format!("view({rank}.{tensor}, [4, 4, 4])")),
                    "{line}"
                );
            }
            assert!(line.ends_with("* 1/2)"), "{line}");
        }
    }

    /// The small llama (one layer, two heads, one kv head, width 8) on dp=2 x cp=2, full
    /// iteration; `extra` adds emit flags. Returns the case and its directory.
    fn small_llama_dp_by_cp(extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
        small_llama(
            "dp=2,cp=2",
            &["--heads", "2", "--kv-heads", "1", "--hidden", "8"],
            extra,
        )
    }

    /// The small llama (one layer, four heads, two kv heads, width 16: tp=2 takes half of each)
    /// on tp=2 x cp=2, full iteration; `extra` adds emit flags.
    fn small_llama_tp_by_cp(extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
        small_llama(
            "tp=2,cp=2",
            &["--heads", "4", "--kv-heads", "2", "--hidden", "16"],
            extra,
        )
    }

    /// The small llama on dp=2 x tp=2 x cp=2, full iteration, verifies. In the backward each rank
    /// reads the key block the ring sends once more through views and a transpose, where the
    /// relations name the forward's copy: the query gradient (`bmm_4 = bmm(dS, K)`) relates only
    /// once the wider attempt relates the sources behind the ranks' transposes and the two chains
    /// over one received block meet. Its trace line is then a quarter of the ranks' own sums
    /// (`add_N`: the block products of the ring's steps added up).
    #[test]
    fn llama_dp_by_tp_by_cp_full_iteration_verifies() {
        let (dir, case) = small_llama(
            "dp=2,tp=2,cp=2",
            &["--heads", "4", "--kv-heads", "2", "--hidden", "16"],
            &[],
        );
        let text = verified_trace(dir.path(), &case);
        let line = trace_line(&text, "bmm_4");
        assert!(line.contains("[clean]") || line.contains("* 1/4"), "{line}");
        assert!(!line.contains("bmm("), "{line}");
    }

    /// A one-layer llama of the given heads and width on `mesh`, full iteration.
    fn small_llama(
        mesh: &str,
        size: &[&str],
        extra: &[&str],
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["--layers", "1"];
        args.extend_from_slice(size);
        args.extend_from_slice(extra);
        let case = emit("llama", dir.path(), mesh, &args);
        (dir, case)
    }

    /// Under dp x cp the softmax backward's e-graph outgrows the node limit (each attention block
    /// once per dp group, combined in every nesting of their concatenations); piece by piece along
    /// the batch, each dp group's share relates as under cp alone, and the output is their
    /// concatenation.
    #[test]
    fn llama_dp_by_cp_full_iteration_verifies_piece_by_piece() {
        let (dir, case) = small_llama_dp_by_cp(&[]);
        assert_softmax_backward_joins_pieces(dir.path(), &case, "cat(dim=0; ", ["r0.", "r2."]);
    }

    /// `case` verifies, and the softmax backward's trace line is a concatenation (`joined`) of
    /// pieces over the `ranks`' tensors, with no spec softmax backward left in it.
    fn assert_softmax_backward_joins_pieces(
        dir: &std::path::Path,
        case: &std::path::Path,
        joined: &str,
        ranks: [&str; 2],
    ) {
        let text = verified_trace(dir, case);
        assert!(text.contains("certificate:"), "{text}");
        let line = trace_line(&text, "_softmax_backward_data");
        assert!(line.contains(joined), "{line}");
        assert!(ranks.iter().all(|r| line.contains(r)), "{line}");
        assert!(!line.contains("_softmax_backward_data("), "{line}");
    }

    /// The same plan with a block-local causal mask is never verified.
    #[test]
    fn llama_dp_by_cp_bug_full_iteration_is_never_verified() {
        let (_dir, case) = small_llama_dp_by_cp(&["--bug", "cp-causal-mask-local"]);
        let (code, out) = verify(&case);
        assert!(code == 1 || code == 3, "{out}");
    }

    /// Under tp x cp the softmax backward's e-graph outgrows the node limit as under dp x cp, the
    /// groups' blocks split along the heads instead of the batch: piece by piece along the heads
    /// dim, each tp group's heads relate as under cp alone (its ranks expose the gradient scaled
    /// or unscaled, and the pieces meet at one factor), and the output is their concatenation.
    #[test]
    fn llama_tp_by_cp_full_iteration_verifies_piece_by_piece() {
        let (dir, case) = small_llama_tp_by_cp(&[]);
        assert_softmax_backward_joins_pieces(
            dir.path(),
            &case,
            "[clean] cat(dim=1; ",
            ["r0.", "r1."],
        );
    }

    /// The same plan with a block-local causal mask is never verified.
    #[test]
    fn llama_tp_by_cp_bug_full_iteration_is_never_verified() {
        let (_dir, case) = small_llama_tp_by_cp(&["--bug", "cp-causal-mask-local"]);
        let (code, out) = verify(&case);
        assert!(code == 1 || code == 3, "{out}");
    }
}
