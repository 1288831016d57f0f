//! Ring attention (cp=2): the ranks merge their attention blocks by log-sum-exp, the spec
//! computes one causal softmax. The normal form's log-sum-exp rules prove the plan; a
//! mutated plan is refuted with a counterexample the interpreter confirms. A refutation on
//! reduced sizes is confirmed at full size by a run first.

use shardproof_prove::{prove_case, ProveConfig, Verdict};
use shardproof_zoo::{find_bug, EmitExtras, EmitOptions, LlamaConfig, Mesh, PipelineOptions};
use std::path::Path;

mod zoo_emit;

fn emit_llama_cp2(dir: &Path, bug: Option<&str>) -> shardproof_case::Case {
    let llama = LlamaConfig {
        layers: 1,
        ..LlamaConfig::default()
    };
    emit_llama_cp2_with(dir, bug, llama, true)
}

fn emit_llama_cp2_with(
    dir: &Path,
    bug: Option<&str>,
    llama: LlamaConfig,
    forward_only: bool,
) -> shardproof_case::Case {
    let opts = EmitOptions {
        model: "llama".into(),
        llama,
        mesh: Mesh::parse("cp=2").unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only,
        vocab_parallel: false,
        mlp: Default::default(),
    };
    zoo_emit::emit_loaded(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    )
}

/// Shape reduction refuses the ring's send/recv: proved at full size.
fn full_size() -> ProveConfig {
    ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    }
}

#[test]
fn a_cp2_ring_attention_forward_is_proved_by_the_normal_form() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_llama_cp2(dir.path(), None);
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert_eq!(
        proof.layers.get("normal-form"),
        Some(&1),
        "{:?}",
        proof.layers
    );
}

#[test]
fn a_cp2_ring_attention_with_a_local_causal_mask_is_refuted_and_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_llama_cp2(dir.path(), Some("cp-causal-mask-local"));
    // Symbolically: the log-sum-exp rules must not make the mutation's forms meet.
    let symbolic = ProveConfig {
        run_first: false,
        ..full_size()
    };
    let proof = prove_case(&case, &symbolic);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    let cx = proof.counterexample.expect("a confirmed counterexample");
    assert_eq!(cx.output, "loss");
    // The interpreter's spec output at the counterexample's inputs is the reported one.
    let cfg = shardproof_interp::RunConfig::default();
    let spec = shardproof_interp::run_graph(&case.spec, &cx.spec_inputs, &cfg).unwrap();
    let v = case.spec.find("loss").unwrap();
    assert_eq!(spec.get(v).unwrap().data[0], cx.spec_value);
    assert!((cx.spec_value - cx.rebuilt_value).abs() > 1e-6);
}

/// A refutation found on reduced sizes is shown on the case as written by a run of the
/// interpreter on random inputs first (a full-size symbolic proof only where no run shows
/// it): gpt2's dp=2 `dp-loss-not-averaged` took 14 s through the symbolic recheck.
#[test]
fn a_reduced_refutation_is_confirmed_at_full_size_by_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmitOptions {
        model: "llama".into(),
        llama: LlamaConfig {
            layers: 1,
            ..LlamaConfig::default()
        },
        mesh: Mesh::parse("dp=2").unwrap(),
        bug: Some(find_bug("dp-loss-not-averaged").unwrap()),
        forward_only: true,
        vocab_parallel: false,
        mlp: Default::default(),
    };
    let case = zoo_emit::emit_loaded(
        dir.path(),
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    let m = proof.message.as_deref().unwrap();
    assert!(m.contains("a run of the case as written"), "{m}");
    let cx = proof.counterexample.expect("a confirmed counterexample");
    // At full size: the case's own inputs, confirmed by the interpreter.
    let cfg = shardproof_interp::RunConfig::default();
    let spec = shardproof_interp::run_graph(&case.spec, &cx.spec_inputs, &cfg).unwrap();
    let v = case.spec.find("loss").unwrap();
    assert_eq!(spec.get(v).unwrap().data[0], cx.spec_value);
    assert!((cx.spec_value - cx.rebuilt_value).abs() > 1e-6);
    assert!(!proof.reduction.unwrap().counterexample_reduced);
}

/// The smallest llama the ring runs on: one layer, one head, width 4, 4 positions (2 per rank).
fn tiny_llama() -> LlamaConfig {
    LlamaConfig {
        hidden: 4,
        heads: 1,
        kv_heads: 1,
        ffn: 4,
        layers: 1,
        seq: 4,
        batch: 1,
        vocab: 4,
        ..LlamaConfig::default()
    }
}

/// The ring's backward computes `D = Σ_h dO_h·O_h` from the merged output `O_h = Σ_j P_j·V_jh`
/// where the spec's softmax backward holds each weight outside: `P_j·Σ_h V_jh·dO_h`. The
/// product expansion layer moves the weights out of the products (docs/prove.md section 4),
/// so the gradients through the scores (`wq`, `wk`, the norms and the embedding) are proved.
#[test]
fn a_cp2_ring_attention_backward_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_llama_cp2_with(dir.path(), None, tiny_llama(), false);
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.counterexample.is_none());
    for o in &proof.outputs {
        assert_eq!(o.status, "proved", "{}: {:?}", o.name, o.note);
    }
    assert!(
        proof
            .layers
            .get("product-expansion")
            .is_some_and(|&n| n > 0),
        "{:?}",
        proof.layers
    );
}

/// The same full iteration with the causal mask applied per rank (the ring's mutation): a
/// run of the case as written finds the difference, and the interpreter confirms it.
#[test]
fn a_cp2_ring_attention_full_iteration_with_a_local_mask_is_refuted_and_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_llama_cp2_with(
        dir.path(),
        Some("cp-causal-mask-local"),
        tiny_llama(),
        false,
    );
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    let cx = proof.counterexample.expect("a confirmed counterexample");
    // The interpreter's spec output at the counterexample's inputs is the reported one.
    let cfg = shardproof_interp::RunConfig::default();
    let spec = shardproof_interp::run_graph(&case.spec, &cx.spec_inputs, &cfg).unwrap();
    let v = case.spec.find(&cx.output).unwrap();
    assert_eq!(spec.get(v).unwrap().data, cx.spec_output.data);
    assert!((cx.spec_value - cx.rebuilt_value).abs() > 1e-6);
}

/// The catalog's cp bugs on the full iteration, decided symbolically (no run first): the
/// weights moved out of the ring backward's products must not make a mutated plan meet the
/// spec; each is refuted with a counterexample the interpreter confirms.
#[test]
fn cp2_full_iteration_bugs_are_refuted_symbolically() {
    for bug in [
        "cp-rope-no-offset",
        "cp-loss-overscaled",
        "cp-causal-mask-local",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_cp2_with(dir.path(), Some(bug), tiny_llama(), false);
        let symbolic = ProveConfig {
            run_first: false,
            ..full_size()
        };
        let proof = prove_case(&case, &symbolic);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        let cx = proof.counterexample.expect("a confirmed counterexample");
        let cfg = shardproof_interp::RunConfig::default();
        let spec = shardproof_interp::run_graph(&case.spec, &cx.spec_inputs, &cfg).unwrap();
        let v = case.spec.find(&cx.output).unwrap();
        assert_eq!(spec.get(v).unwrap().data, cx.spec_output.data, "{bug}");
        assert!((cx.spec_value - cx.rebuilt_value).abs() > 1e-6, "{bug}");
    }
}
