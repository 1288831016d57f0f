//! `shardproof verify` on vocabulary-parallel Llama (Megatron's vocab-parallel embedding and
//! cross-entropy): full iterations verify, through the backward of the cross-entropy (softmax
//! minus the shard's one-hot) and of the masked embedding; the unmasked-embedding bug is never
//! verified.

mod common;

use common::{Out, Scratch};

/// Emits `zoo emit llama --mesh MESH --vocab-parallel EXTRA` into `case/` and verifies it.
fn verify_llama(mesh: &str, extra: &[&str]) -> Out {
    let s = Scratch::new();
    let mut args = vec!["zoo", "emit", "llama", "--mesh", mesh, "--vocab-parallel"];
    args.extend(extra);
    args.extend(["-o", "case"]);
    s.run(&args).expect_code(0);
    s.run(&["verify", "case/case.yaml"])
}

#[test]
fn vocab_parallel_full_iterations_verify() {
    for mesh in ["tp=2", "tp=4", "dp=2,tp=2"] {
        let out = verify_llama(mesh, &[]);
        out.expect_code(0).stdout_has(&[
            "certificate:",
            "loss = r0.loss",
            // The vocab-sharded parameters' updates: the embedding's through the masked
            // embedding backward, the LM head's through the cross-entropy backward.
            "embed_new = cat(dim=0; r0.embed_new, ",
            "lm_head_new = cat(dim=0; r0.lm_head_new, ",
        ]);
    }
}

#[test]
fn vocab_parallel_with_microbatches_verifies() {
    // Two microbatches per dp rank: the loss the ranks average over dp is reached only at the
    // end of a long chain (two vocab-parallel cross-entropies, their sum, the all-reduce); its
    // relation must be the ranks' loss, not a multiple of their all-reduce read as a bug.
    let out = verify_llama("dp=2,tp=2", &["--grad-accum", "2", "--batch", "4"]);
    out.expect_code(0)
        .stdout_has(&["loss = r0.loss", "embed_new = cat(dim=0; r0.embed_new, "]);
}

#[test]
fn vocab_parallel_training_options_verify() {
    // Clipping reads the dp-averaged embedding gradient whole (its squared norm), so the
    // gradient must relate shard by shard at once; ZeRO-1 updates a dp slice of each vocab
    // shard and gathers it back through a layout, a long way from the masked backward.
    for extra in [&["--clip-grad", "1.0"][..], &["--zero", "1"][..]] {
        let out = verify_llama("dp=2,tp=2", extra);
        out.expect_code(0)
            .stdout_has(&["loss = r0.loss", "embed_new = cat(dim=0; r0.embed_new, "]);
    }
}

#[test]
fn vocab_parallel_loss_not_averaged_is_refuted_at_the_loss() {
    let out = verify_llama("dp=2,tp=2", &["--bug", "dp-loss-not-averaged"]);
    out.expect_code(1).stdout_has(&[
        "relations stop at spec operator `loss`",
        "off by a constant factor",
    ]);
}

#[test]
fn unmasked_vocab_embedding_is_never_verified() {
    // Each rank looks up every token, its out-of-range ones at the clamped index, without
    // zeroing those rows before the all-reduce. No lemma relates the unmasked lookup, so the
    // engine may stop there without a verdict; it must never certify the plan.
    let out = verify_llama("tp=2", &["--bug", "llama-vocab-embedding-unmasked"]);
    match out.code {
        Some(1) => {
            out.stdout_has(&["relations stop at spec operator `embedding`"]);
        }
        Some(3) => {
            out.stdout_has(&["`embedding`"]);
        }
        _ => panic!("expected a refutation or inconclusive, got {out:?}"),
    }
}
