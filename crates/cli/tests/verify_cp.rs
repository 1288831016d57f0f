//! `shardproof verify` on context-parallel plans (ring attention): correct plans verify, the
//! catalog's cp bugs are never verified.

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

/// Bugs of the ring (masks, positions, loss scaling) are refuted or inconclusive, never
/// verified.
#[test]
fn cp_bugs_are_never_verified() {
    for bug in ["cp-causal-mask-local", "cp-loss-overscaled"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(
            "llama",
            dir.path(),
            "cp=2",
            &["--forward-only", "--bug", bug],
        );
        let (code, out) = verify(&case);
        assert!(code == 1 || code == 3, "{bug}:\n{out}");
    }
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

/// gpt2's cp bugs (positions without the chunk offset, block-local causal masks, the loss
/// scaled by cp twice) are refuted or inconclusive, never verified.
#[test]
fn gpt2_cp_bugs_are_never_verified() {
    for bug in [
        "cp-loss-overscaled",
        "cp-rope-no-offset",
        "cp-causal-mask-local",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(
            "gpt2",
            dir.path(),
            "cp=2",
            &["--forward-only", "--bug", bug],
        );
        let (code, out) = verify(&case);
        assert!(code == 1 || code == 3, "{bug}:\n{out}");
    }
}

/// The cp bugs of a model on the full iteration (forward, backward through the ring, the
/// gradient reduction and the step) are refuted or inconclusive, never verified: the guard
/// the attention-backward lemmas must keep.
fn full_iteration_bugs_never_verify(model: &str, bugs: &[&str]) {
    for bug in bugs {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(model, dir.path(), "cp=2", &["--bug", bug]);
        let (code, out) = verify(&case);
        assert!(code == 1 || code == 3, "{model} {bug}:\n{out}");
    }
}

#[test]
fn llama_cp_bugs_full_iteration_are_never_verified() {
    full_iteration_bugs_never_verify(
        "llama",
        &[
            "cp-causal-mask-local",
            "cp-rope-no-offset",
            "cp-loss-overscaled",
        ],
    );
}

#[test]
fn gpt2_cp_bugs_full_iteration_are_never_verified() {
    full_iteration_bugs_never_verify(
        "gpt2",
        &[
            "cp-causal-mask-local",
            "cp-rope-no-offset",
            "cp-loss-overscaled",
        ],
    );
}

/// The catalog defines `cp-loss-overscaled` for the dense models only.
#[test]
fn deepseek_cp_bugs_full_iteration_are_never_verified() {
    full_iteration_bugs_never_verify("deepseek", &["cp-causal-mask-local", "cp-rope-no-offset"]);
}
