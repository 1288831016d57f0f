//! `shardproof verify` on the DeepSeek-style MoE model beyond the forward pass: full training
//! iterations under tp, ep and dp (the router and gate backward: top-k gradients, the gate
//! scatter's backward, the auxiliary loss's share per rank), the sequence-parallel forward, the
//! all-to-all dispatcher's forward, the context-parallel forward, and the MoE catalog bugs
//! (and the context-parallel bugs on deepseek), never verified.

mod common;

use common::{emit_zoo, verify_exit as verify};
use std::path::{Path, PathBuf};

/// Emits the zoo's deepseek under `mesh` into `dir` and returns its case file.
fn emit_deepseek(dir: &Path, mesh: &str, extra: &[&str]) -> PathBuf {
    emit_zoo("deepseek", dir, mesh, extra)
}

/// Emits and verifies one plan, asserting the exit code.
fn expect(mesh: &str, extra: &[&str], want: i32) -> String {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_deepseek(dir.path(), mesh, extra);
    let (code, out) = verify(&case);
    assert_eq!(code, want, "deepseek {mesh} {extra:?}:\n{out}");
    out
}

#[test]
fn full_iteration_verifies_under_tp() {
    // The router gradient is partial over tp while each rank adds 1/tp of the replicated
    // auxiliary-loss gradient: sum(x_k) + tp * y = sum(x_k + y).
    let out = expect("tp=2", &[], 0);
    assert!(out.contains("certificate:"), "{out}");
}

#[test]
fn full_iteration_verifies_under_dp() {
    // The gate gradients of each dp rank's tokens: gather and scatter per token piece.
    expect("dp=2", &[], 0);
}

#[test]
fn full_iteration_verifies_under_ep() {
    // Each ep rank zero-pads its experts' gate gradients to all experts and reduce-scatters
    // them over the tokens: the sum of the padded pieces is their concatenation.
    expect("ep=2", &[], 0);
}

#[test]
fn many_experts_per_rank_full_iteration_verifies() {
    // 16 experts per ep rank: the routing mask's expand over the experts is a cat of copies of
    // the shorter expand the rank holds (`expand-as-cat` past 8 copies).
    expect("ep=2", &["--experts", "32", "--top-k", "3"], 0);
}

#[test]
fn sequence_parallel_forward_verifies() {
    // Each tp rank routes its sequence chunk: the spec's tokens are the ranks' chunks
    // interleaved, through top-k, the gate scatter and the experts' [expert, token] products.
    expect("tp=2", &["--sequence-parallel", "--forward-only"], 0);
}

#[test]
fn sequence_parallel_full_iteration_verifies() {
    // The backward on interleaved tokens: the experts' and the router's backward token by
    // token, the weight gradients contracting the tokens as sums of the chunks' products, the
    // auxiliary loss's per-sequence factor expanded over the chunks.
    expect("tp=2", &["--sequence-parallel"], 0);
}

#[test]
fn full_iteration_verifies_under_dp_and_ep() {
    // Each ep group's tokens gathered on one rank: the spec's per-rank token pieces regroup into
    // the concatenations the ranks hold.
    expect("dp=2,ep=2", &[], 0);
}

#[test]
fn all_to_all_dispatcher_forward_verifies() {
    // The gates laid out per expert group and exchanged by all_to_all_single: a block of rows
    // of view(permute(view(gates))) is a slice of the gates' columns.
    expect("ep=2", &["--ep-dispatch", "alltoall", "--forward-only"], 0);
}

#[test]
fn full_iteration_verifies_under_tp_and_ep() {
    // The routed gate gradient carries the 1/ep of the token-parallel mean and is partial over
    // tp, while each rank adds the whole auxiliary share: (1/n) sum(x_k) + y = (1/n) sum(x_k + y).
    expect("tp=2,ep=2", &[], 0);
}

#[test]
#[ignore = "about 40 s of release CPU, over two minutes in the test profile on a loaded machine; run with --ignored"]
fn full_iteration_verifies_under_dp_tp_and_ep() {
    // The routed part carries 1/(dp ep) over a tp sum, the auxiliary share 1/dp:
    // (1/4) sum_tp(x_k) + (1/2) y = (1/4) sum_tp(x_k + y).
    expect("dp=2,tp=2,ep=2", &[], 0);
}

#[test]
fn all_to_all_dispatcher_full_iteration_verifies() {
    // The combine's all_to_all backward: the gradients exchanged back per expert group.
    expect("ep=2", &["--ep-dispatch", "alltoall"], 0);
}

#[test]
fn all_to_all_dispatcher_full_iteration_verifies_under_tp_and_ep() {
    expect("tp=2,ep=2", &["--ep-dispatch", "alltoall"], 0);
}

#[test]
fn pipelined_expert_parallel_full_iteration_verifies() {
    // Two stages, each layer's experts split over ep, exchanged through send/recv.
    expect("pp=2,ep=2", &[], 0);
}

#[test]
fn pipelined_full_iteration_verifies_under_dp_and_tp() {
    // The loss: the spec's flat sum of the ranks' losses and aux shares is the implementation's
    // aux shares all-reduced over tp, then pp, added to each dp rank's loss, then all-reduced
    // over dp (0-d classes merged by their linear combination of the same atoms).
    let dir = tempfile::tempdir().unwrap();
    let case = emit_deepseek(dir.path(), "pp=2,dp=2,tp=2", &[]);
    let (code, first) = verify(&case);
    assert_eq!(code, 0, "{first}");
    // The same report from another process: its certificate once named other replicas from
    // run to run (leaf symbols numbered in a hash map's order), here in most runs.
    let (_, second) = verify(&case);
    let report = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("time:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(report(&first), report(&second));
}

#[test]
fn pipelined_full_iteration_verifies_under_tp_and_ep() {
    expect("pp=2,tp=2,ep=2", &[], 0);
}

#[test]
fn many_layers_per_stage_forward_verifies() {
    // 17 layers per stage: the spec's running sum of balance losses is clean only at the
    // stages' all-reduce, 17 additions past the stage boundary, deeper than one operator's
    // exploration rounds; each unclean relation carries the 0-d values explored so far.
    expect("pp=2", &["--forward-only", "--layers", "34"], 0);
    never_verified(
        "pp-wrong-stage-division",
        "pp=2",
        &["--forward-only", "--layers", "34"],
    );
}

#[test]
fn many_layers_per_stage_forward_verifies_under_tp() {
    // 14 layers per stage under tp: each stage's running sum of aux shares is a chain of 14
    // 0-d additions, explored one a round (such rounds are not counted), and the replicas'
    // halves `aux / 2` sit on cycles of scalings that the loss's linear combination must break
    // at one class per cycle. Inconclusive at 24 layers and more before.
    let layers = ["--forward-only", "--layers", "28", "--microbatches", "1"];
    expect("pp=2,tp=2", &layers, 0);
    never_verified("moe-aux-loss-not-divided-by-tp", "pp=2,tp=2", &layers);
}

#[test]
fn context_parallel_forward_verifies() {
    // Each cp rank routes the tokens of its chunks i and 2cp-1-i: the router and the experts on
    // one chunk's tokens are that chunk of the rank's own calls (`tokenwise-over-chunk`), and
    // the balance loss's per-sequence sums are all-reduced over cp.
    let out = expect("cp=2", &["--forward-only"], 0);
    assert!(out.contains("certificate:"), "{out}");
}

#[test]
fn context_parallel_forward_verifies_under_dp() {
    expect("dp=2,cp=2", &["--forward-only"], 0);
}

#[test]
fn context_parallel_mask_bug_is_never_verified() {
    // The chunk lemmas relate the MoE block only where the ranks' attention already relates:
    // a causal mask by block-local positions or RoPE without the chunks' offsets never does.
    // One layer: the first layer's attention already differs.
    never_verified(
        "cp-causal-mask-local",
        "cp=2",
        &["--forward-only", "--layers", "1"],
    );
}

/// Minutes each: run by `scripts/heavy`, outside the suite (see tests/verify_cp.rs).
mod heavy {
    use super::*;

    /// RoPE without the chunks' offsets: relations stop inside the attention (the seeded run
    /// decides it after a minute and more of relation inference).
    #[test]
    fn context_parallel_rope_bug_is_never_verified() {
        never_verified("cp-rope-no-offset", "cp=2", &["--forward-only"]);
    }
}

/// Plants `bug` and asserts that verify refutes it (1) or is inconclusive (3): never 0.
fn never_verified(bug: &str, mesh: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = extra.to_vec();
    args.extend(["--bug", bug]);
    let case = emit_deepseek(dir.path(), mesh, &args);
    let (code, out) = verify(&case);
    assert!(
        code == 1 || code == 3,
        "{bug} {mesh} {extra:?}: exit {code}\n{out}"
    );
}

#[test]
fn tp_router_bugs_are_never_verified() {
    // The full iteration with the auxiliary loss counted tp times is inconclusive (and slow:
    // every gradient upstream of the router differs); its forward shows the same loss.
    never_verified(
        "moe-aux-loss-not-divided-by-tp",
        "tp=2",
        &["--forward-only"],
    );
    never_verified("moe-router-grad-unsynced", "tp=2", &[]);
}

#[test]
fn ep_expert_grad_bug_is_never_verified() {
    never_verified("ep-expert-grad-not-averaged", "ep=2", &[]);
    // With 16 experts per rank the expands relate (above): the missing average still stands.
    never_verified(
        "ep-expert-grad-not-averaged",
        "ep=2",
        &["--experts", "32", "--top-k", "3"],
    );
}

#[test]
fn sharded_norm_bug_is_never_verified() {
    never_verified("norm-sharded-hidden", "tp=2", &["--forward-only"]);
}

#[test]
fn sp_sharded_experts_bug_is_never_verified() {
    // X_i A_i B_i on each rank's sequence chunk: never the cross terms of the spec's experts.
    never_verified(
        "moe-experts-sharded-under-sp",
        "tp=2",
        &["--sequence-parallel", "--forward-only"],
    );
    // The full iteration with the sharded experts is inconclusive too, slowly (its expressions
    // grow through the whole backward); the router's missing all-reduce is refuted.
    never_verified("moe-router-grad-unsynced", "tp=2", &["--sequence-parallel"]);
}

#[test]
fn tp_and_ep_bugs_are_never_verified() {
    // ep-expert-grad-not-averaged under tp x ep is refuted too (about 14 s of release CPU);
    // one case keeps the test under a minute.
    never_verified("moe-router-grad-unsynced", "tp=2,ep=2", &[]);
}

#[test]
fn pipelined_aux_loss_bug_is_never_verified() {
    // The aux loss counted tp times on every stage never meets the spec's loss (the full
    // iteration is refuted too, slowly: about 150 s of release CPU).
    never_verified(
        "moe-aux-loss-not-divided-by-tp",
        "pp=2,dp=2,tp=2",
        &["--forward-only"],
    );
}
