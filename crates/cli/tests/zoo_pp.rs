//! Pipeline parallelism in the zoo (a `pp` mesh dim): every correct plan of the mlp, llama,
//! gpt2 and deepseek models holds under `run` and `inspect --strict` (pp alone, with dp, with tp, with both; GPipe
//! and 1F1B; forward only and the full iteration; 2 and 4 microbatches), the catalog's pipeline
//! bugs are found (a wrong loss or wrong updated weights, exit 1; a recv without its send, a
//! located deadlock, exit 1), the other catalog bugs still are under pp, and requests the zoo
//! cannot pipeline exit 2. Uneven stages (`--pp-first-layers` / `--pp-last-layers`) hold and
//! carry the pipeline bugs too.

mod common;

use common::zoo::{assert_has_all, assert_names_changed_output, p2p_calls};
use common::Scratch;
use shardproof_zoo::BUGS;

/// The size flags a pipelined `model` needs: 4 layers (2 per stage on pp=2, 1 on pp=4) and a
/// batch that splits into dp = 2 ranks of `microbatches` microbatches.
fn sizes(model: &str, microbatches: usize) -> Vec<String> {
    let batch = match model {
        "mlp" => 8,
        _ => 2 * microbatches,
    };
    ["--layers", "4", "--batch", &batch.to_string()]
        .map(String::from)
        .to_vec()
}

/// [`sizes`] for `microbatches` microbatches, `--microbatches` and then `extra` (flags on one
/// line).
fn pipelined(model: &str, microbatches: usize, extra: &str) -> Vec<String> {
    let mut flags = sizes(model, microbatches);
    flags.extend(["--microbatches".into(), microbatches.to_string()]);
    flags.extend(extra.split_whitespace().map(String::from));
    flags
}

const MESHES: [&str; 4] = ["pp=2", "dp=2,pp=2", "pp=2,tp=2", "dp=2,pp=2,tp=2"];

/// Every correct plan of `model` holds, and `inspect --strict` checks every recorded type.
fn correct_plans_hold(model: &str) {
    let s = Scratch::new();
    for mesh in MESHES {
        for schedule in ["gpipe", "1f1b"] {
            for forward_only in [false, true] {
                let mut flags = pipelined(model, 2, &format!("--pp-schedule {schedule}"));
                if forward_only {
                    flags.push("--forward-only".into());
                }
                let dir = format!("{mesh}-{schedule}-{forward_only}");
                let case = s.emit_model(&dir, model, mesh, &flags);
                s.assert_holds(&case).stdout_has(&["loss", "at pp = 1"]);
                s.assert_strict(&case);
            }
        }
    }
    // Four microbatches through four stages (1F1B warms up with 3, 2, 1, 0 forwards), and
    // through two stages with dp and tp.
    for (mesh, layers) in [("pp=4", "4"), ("dp=2,pp=2,tp=2", "2")] {
        let mut flags = pipelined(model, 4, "--pp-schedule 1f1b");
        flags[1] = layers.into();
        let case = s.emit_model(&format!("mb4-{mesh}"), model, mesh, &flags);
        s.assert_holds(&case);
    }
}

#[test]
fn mlp_pipelined_plans_hold() {
    correct_plans_hold("mlp");
}

#[test]
fn llama_pipelined_plans_hold() {
    correct_plans_hold("llama");
}

#[test]
fn gpt2_pipelined_plans_hold() {
    correct_plans_hold("gpt2");
}

#[test]
fn deepseek_pipelined_plans_hold() {
    correct_plans_hold("deepseek");
}

#[test]
fn deepseek_stages_carry_experts_and_balance_losses() {
    let s = Scratch::new();
    // Expert parallelism inside the stages (with dp, tp, SP and the all-to-all dispatcher):
    // every stage's balance losses reach the loss, their gradients seeded in each stage.
    for (mesh, batch, extra) in [
        ("pp=2,ep=2", "4", ""),
        ("pp=2,tp=2,ep=2", "4", "--pp-schedule 1f1b"),
        ("dp=2,pp=2,tp=2,ep=2", "8", "--pp-schedule 1f1b"),
        ("pp=2,tp=2,ep=2", "4", "--sequence-parallel"),
        ("pp=2,ep=2", "4", "--ep-dispatch alltoall --forward-only"),
    ] {
        let mut flags = pipelined("deepseek", 2, extra);
        flags[3] = batch.into();
        let dir = format!("{mesh}{}", extra.replace(' ', ""));
        let case = s.emit_model(&dir, "deepseek", mesh, &flags);
        s.assert_holds_strictly(&case);
    }
    let yaml = s.read("dp=2,pp=2,tp=2,ep=2--pp-schedule1f1b/case.yaml");
    assert_has_all(
        &yaml,
        &[
            "  expert_gate_2: { placement: { tp: Shard(1), ep: Shard(0) }, at: { pp: 1 } }",
            "  router_0: { placement: Replicate(), at: { pp: 0 } }",
            "  loss: { placement: Replicate(), at: { pp: 1 } }",
        ],
    );
    // The data group of the replicated weights: dp x ep within each stage and tp index.
    assert!(
        yaml.contains("\"dp_ep\": [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]"),
        "{yaml}"
    );
    // The first stage's balance losses reach the last stage's loss over pp.
    let r0 = s.read("dp=2,pp=2,tp=2,ep=2--pp-schedule1f1b/r0.py");
    assert!(r0.contains(", 'sum', 'pp')"), "{r0}");
    // Uneven stages (61 layers over 8 stages, as deepseek-v3-671b: here 5 over 3).
    let mut flags = pipelined("deepseek", 2, "--pp-first-layers 1");
    flags[1] = "5".into();
    let case = s.emit_model("uneven", "deepseek", "pp=3", &flags);
    s.run(&["run", &case]).expect_code(0);
    // The deepseek bugs inside stages.
    for (mesh, batch, bug) in [
        ("pp=2,tp=2", "4", "moe-aux-loss-not-divided-by-tp"),
        ("pp=2,tp=2", "4", "moe-router-grad-unsynced"),
        ("dp=2,pp=2,ep=2", "8", "ep-expert-grad-not-averaged"),
    ] {
        let mut flags = pipelined("deepseek", 2, &format!("--bug {bug}"));
        flags[3] = batch.into();
        let case = s.emit_model(bug, "deepseek", mesh, &flags);
        s.assert_bug_found(&case, bug);
    }
}

#[test]
fn gpt2_stages_share_the_tied_embedding() {
    let s = Scratch::new();
    let flags = pipelined("gpt2", 2, "--pp-schedule 1f1b");
    s.emit_model("c", "gpt2", "dp=2,pp=2,tp=2", &flags);
    let read = |f: &str| s.read(&format!("c/{f}"));
    let yaml = read("case.yaml");
    assert_has_all(
        &yaml,
        &[
            // Per dp and tp index, the first and the last stage's ranks.
            "\"embd\": [[0, 4], [1, 5], [2, 6], [3, 7]]",
            "  wpe: { placement: Replicate(), at: { pp: 0 } }",
            "  lnf_w: { placement: Replicate(), at: { pp: 1 } }",
            "  tokens: { placement: { dp: Shard(0) }, at: { pp: 0 } }",
            "  labels: { placement: { dp: Shard(0) }, at: { pp: 1 } }",
        ],
    );
    // The token embedding lives on both stages (every stage of two: no `at:`), and each
    // stage's share of its gradient is summed over `embd` before the dp reduction.
    assert!(yaml.contains("  wte: Replicate()\n"), "{yaml}");
    for r in ["r0.py", "r5.py"] {
        let graph = read(r);
        assert!(graph.contains(", 'sum', 'embd')"), "{r}\n{graph}");
    }
    // A middle stage holds no copy.
    s.emit_model("three", "gpt2", "pp=3", &{
        let mut f = sizes("gpt2", 1);
        f[1] = "3".into();
        f
    });
    let yaml = s.read("three/case.yaml");
    assert!(
        yaml.contains("  wte: { placement: Replicate(), at: { pp: [0, 2] } }"),
        "{yaml}"
    );
    assert!(!s.read("three/r1.py").contains("embd"));
    s.run(&["run", "three/case.yaml"]).expect_code(0);
    // Sequence parallelism inside the stages; clipping counts the tied embedding once (the
    // last stage's copy is Megatron's `shared` parameter); Adam with ZeRO-1.
    for (dir, extra) in [
        ("sp", "--sequence-parallel --pp-schedule 1f1b"),
        ("clip", "--clip-grad 0.01 --loss-scale 8"),
        ("adam", "--optimizer adam --zero 1"),
    ] {
        let flags = pipelined("gpt2", 2, extra);
        let case = s.emit_model(dir, "gpt2", "dp=2,pp=2,tp=2", &flags);
        s.assert_holds_strictly(&case);
    }
    // The tied weight's shares never summed (TTrace's untied embedding, here across stages),
    // and the gpt2 tp and SP bugs inside a stage.
    for (mesh, bug, extra) in [
        ("dp=2,pp=2", "zero-tied-embedding-untied", "--zero 1"),
        ("pp=2,tp=2", "tp-missing-allreduce", ""),
        (
            "pp=2,tp=2",
            "sp-layernorm-grad-not-reduced",
            "--sequence-parallel",
        ),
    ] {
        let flags = pipelined("gpt2", 2, &format!("--bug {bug} {extra}"));
        let case = s.emit_model(bug, "gpt2", mesh, &flags);
        s.assert_bug_found(&case, bug);
    }
}

#[test]
fn pipelines_combine_with_the_training_options_and_kv_replicas() {
    let s = Scratch::new();
    // Adam, loss scaling and ZeRO-1 on every stage.
    for model in ["mlp", "llama"] {
        let flags = pipelined(model, 2, "--optimizer adam --loss-scale 64 --zero 1");
        let case = s.emit_model(&format!("{model}-train"), model, "dp=2,pp=2", &flags);
        s.run(&["run", &case])
            .expect_code(0)
            .stdout_has(&["exp_avg_sq_"]);
    }
    // tp = 4 > 2 kv heads: the replicas' gradients are all-reduced within each stage.
    let mut flags = sizes("llama", 1);
    flags.extend(["--pp-schedule", "1f1b"].map(String::from));
    let case = s.emit_model("kv", "llama", "pp=2,tp=4", &flags);
    s.run(&["run", &case]).expect_code(0);
    let yaml = s.read("kv/case.yaml");
    assert!(
        yaml.contains("\"kv\": [[0, 1], [2, 3], [4, 5], [6, 7]]"),
        "{yaml}"
    );
    assert!(
        yaml.contains("wk_2: { placement: { tp: Shard(0) }, replicas: 2, at: { pp: 1 } }"),
        "{yaml}"
    );
}

#[test]
fn pipelines_clip_the_global_norm_and_split_the_vocabulary() {
    let s = Scratch::new();
    // A small maximal norm, so that clipping scales every gradient: each stage's share of the
    // squared norm is all-reduced over tp, then over pp.
    for model in ["mlp", "llama"] {
        let flags = pipelined(model, 2, "--clip-grad 0.01");
        let dir = format!("{model}-clip");
        let case = s.emit_model(&dir, model, "dp=2,pp=2,tp=2", &flags);
        s.run(&["run", &case]).expect_code(0);
        let r0 = s.read(&format!("{dir}/r0.py"));
        assert!(r0.contains("all_reduce.default(wait_tensor"), "{r0}");
        assert!(r0.contains(", 'sum', 'pp')"), "{r0}");
    }
    // Llama's vocab-parallel embedding on the first stage and cross-entropy on the last.
    for mesh in ["pp=2,tp=2", "dp=2,pp=2,tp=2"] {
        let flags = pipelined("llama", 2, "--vocab-parallel --pp-schedule 1f1b");
        let case = s.emit_model(&format!("vp-{mesh}"), "llama", mesh, &flags);
        s.run(&["run", &case]).expect_code(0);
    }
    // Their bugs are found under pp too.
    for (model, flag, bug) in [
        ("mlp", "--clip-grad", "grad-norm-replicated-overcounted"),
        (
            "llama",
            "--vocab-parallel",
            "llama-vocab-embedding-unmasked",
        ),
    ] {
        let mut flags = sizes(model, 1);
        flags.push(flag.into());
        if flag == "--clip-grad" {
            flags.push("0.01".into());
        }
        flags.extend(["--bug", bug].map(String::from));
        let case = s.emit_model(bug, model, "pp=2,tp=2", &flags);
        s.assert_bug_found(&case, bug);
    }
}

#[test]
fn stages_send_activations_forward_and_gradients_back() {
    let s = Scratch::new();
    let flags = pipelined("mlp", 2, "--pp-schedule 1f1b");
    s.emit_model("c", "mlp", "dp=2,pp=2,tp=2", &flags);
    let read = |f: &str| s.read(&format!("c/{f}"));
    let yaml = read("case.yaml");
    assert_has_all(
        &yaml,
        &[
        "name: mlp-pp2-dp2-tp2-mb2-1f1b",
        "# Pipeline: 2 stages (stage 0: layers 0-1, stage 1: layers 2-3), 2 microbatch(es) per \
         dp rank, 1f1b schedule.",
        "  mesh: { pp: 2, dp: 2, tp: 2 }",
        "  x: { placement: { dp: Shard(0) }, at: { pp: 0 } }",
        "  target: { placement: { dp: Shard(0) }, at: { pp: 1 } }",
        "  w1_2: { placement: { tp: Shard(0) }, at: { pp: 1 } }",
        "  loss: { placement: Replicate(), at: { pp: 1 } }",
        "  b2_0_new: { placement: Replicate(), at: { pp: 0 } }",
        ],
    );
    // Rank 1 (stage 0, dp 0, tp 1) talks to rank 5 (stage 1, dp 0, tp 1), index 1 of its `pp`
    // group; 1F1B on the first of two stages: F0 F1 B0 B1 after one warm-up forward.
    let r1 = read("r1.py");
    assert_eq!(
        p2p_calls(&r1),
        [
            "send.default(add_3, 1, 0, 'pp')",
            "send.default(add_7, 1, 1, 'pp')",
            "recv.default([2, 16], torch.float32, 1, 0, 'pp')",
            "recv.default([2, 16], torch.float32, 1, 1, 'pp')",
        ],
        "{r1}"
    );
    // The last stage of 1F1B alternates: F0 B0 F1 B1.
    let r5 = read("r5.py");
    let ends: Vec<&str> = p2p_calls(&r5)
        .iter()
        .map(|c| c.split('.').next().unwrap())
        .collect();
    assert_eq!(ends, ["recv", "send", "recv", "send"], "{r5}");
}

#[test]
fn pipeline_bugs_are_found() {
    let s = Scratch::new();
    let mut planted = 0;
    for model in ["mlp", "llama", "gpt2", "deepseek"] {
        for bug in BUGS
            .iter()
            .filter(|b| b.needs_pipeline() && b.models.contains(&model))
        {
            for schedule in ["gpipe", "1f1b"] {
                let what = format!("{model} {} {schedule}", bug.id);
                let flags = pipelined(
                    model,
                    2,
                    &format!("--pp-schedule {schedule} --bug {}", bug.id),
                );
                let dir = format!("{model}-{}-{schedule}", bug.id);
                let case = s.emit_model(&dir, model, "dp=2,pp=2", &flags);
                s.assert_strict(&case);
                planted += 1;
                if bug.id == "pp-mismatched-send-recv" {
                    // The waiting recv of the second stage leads the report: its message is
                    // the one the first stage never sends.
                    s.run(&["run", &case]).expect_code(1).stderr_has(&[
                        "a recv is never matched by a send (deadlock)",
                        "r2.py:",
                        "waits for a message from rank 0 with tag",
                        "that rank 0 never sends",
                        "hint:",
                    ]);
                } else {
                    let (out, first) = s.run_mismatch(&case);
                    assert_names_changed_output(bug, &first, &what, &out);
                }
            }
        }
    }
    // deepseek: every pipeline bug but the early dp sync (its parameters finish over
    // different groups).
    assert_eq!(planted, (3 * 4 + 3) * 2);
}

#[test]
fn other_catalog_bugs_are_found_under_pp() {
    let s = Scratch::new();
    for (model, mesh, bug, extra) in [
        ("mlp", "pp=2,tp=2", "tp-missing-allreduce", ""),
        ("mlp", "dp=2,pp=2", "dp-grad-not-averaged", ""),
        ("llama", "pp=2,tp=2", "llama-oproj-missing-allreduce", ""),
        ("llama", "dp=2,pp=2,tp=2", "wrong-group", ""),
        ("llama", "dp=2,pp=2", "grad-accum-loss-not-scaled", "2"),
    ] {
        let mut flags = sizes(model, 2);
        if !extra.is_empty() {
            flags.extend(["--microbatches", extra].map(String::from));
        }
        flags.extend(["--bug", bug].map(String::from));
        let case = s.emit_model(bug, model, mesh, &flags);
        s.assert_bug_found(&case, bug);
    }
}

#[test]
fn uneven_stages_hold_and_their_bugs_are_found() {
    let s = Scratch::new();
    // Megatron's --decoder-first/last-pipeline-num-layers: the first and/or last stage get
    // their own count, the other stages divide the rest evenly.
    for (model, mesh, layers, first_last, division) in [
        (
            "llama",
            "pp=3,dp=2",
            "5",
            "--pp-first-layers 1",
            "stage 0: layers 0-0, stage 1: layers 1-2, stage 2: layers 3-4",
        ),
        (
            "llama",
            "pp=2,tp=2",
            "3",
            "--pp-last-layers 1",
            "stage 0: layers 0-1, stage 1: layers 2-2",
        ),
        (
            "mlp",
            "pp=4",
            "6",
            "--pp-last-layers 3",
            "stage 0: layers 0-0, stage 1: layers 1-1, stage 2: layers 2-2, stage 3: layers 3-5",
        ),
    ] {
        let mut flags = pipelined(model, 2, &format!("{first_last} --pp-schedule 1f1b"));
        flags[1] = layers.into();
        let dir = format!("{model}-{mesh}-{layers}");
        let case = s.emit_model(&dir, model, mesh, &flags);
        let yaml = s.read(&case);
        assert!(yaml.contains(division), "{division}\n{yaml}");
        assert!(yaml.contains("-mb2-1f1b-uneven\n"), "{yaml}");
        s.assert_holds_strictly(&case);
    }
    // The first and last stage both set (Llama 3 405B's rule, at 4 stages): 1 + 2 + 2 + 1.
    let mut flags = pipelined("llama", 2, "--pp-first-layers 1 --pp-last-layers 1");
    flags[1] = "6".into();
    let case = s.emit_model("both", "llama", "pp=4", &flags);
    s.run(&["run", &case]).expect_code(0);
    // The pipeline bugs in uneven stages.
    for bug in BUGS.iter().filter(|b| b.needs_pipeline()) {
        let mut flags = pipelined("llama", 2, &format!("--pp-first-layers 1 --bug {}", bug.id));
        flags[1] = "5".into();
        let case = s.emit_model(bug.id, "llama", "pp=3,dp=2", &flags);
        if bug.id == "pp-mismatched-send-recv" {
            s.run(&["run", &case])
                .expect_code(1)
                .stderr_has(&["a recv is never matched by a send (deadlock)"]);
        } else {
            s.assert_bug_found(&case, bug.id);
        }
    }
}

#[test]
fn verify_proves_pipelines_through_send_and_recv() {
    let s = Scratch::new();
    let case = s.emit_model("v", "mlp", "pp=2", &sizes("mlp", 1));
    s.run(&["verify", &case]).expect_code(0);
}

#[test]
fn requests_the_zoo_cannot_pipeline_exit_2() {
    let s = Scratch::new();
    for (args, message) in [
        (
            "deepseek --mesh dp=2,pp=2 --batch 4 --microbatches 2 \
             --bug pp-grad-sync-before-last-microbatch",
            "defined for the model(s) mlp, llama, gpt2, not `deepseek`",
        ),
        (
            "deepseek --mesh pp=2,cp=2",
            "context parallelism (cp) is not combined with pipeline parallelism",
        ),
        (
            "gpt2 --mesh pp=2,cp=2",
            "context parallelism (cp) is not combined with pipeline parallelism",
        ),
        (
            "gpt2 --mesh pp=2,tp=2 --sequence-parallel --tp-comm-overlap",
            "cannot be combined with a pp mesh dim",
        ),
        ("mlp --mesh pp=2", "do not divide into pp = 2 stages"),
        (
            "llama --mesh pp=2 --layers 3",
            "set --layers to a multiple of 2, or give the first and/or last stage its own count",
        ),
        (
            "llama --mesh pp=3 --layers 6 --pp-first-layers 1",
            "the 5 layer(s) left by --pp-first-layers / --pp-last-layers do not divide",
        ),
        (
            "llama --mesh pp=2 --layers 4 --pp-first-layers 1 --pp-last-layers 2",
            "no other stage for the remaining 1",
        ),
        (
            "llama --mesh pp=2 --layers 4 --pp-first-layers 5",
            "more than the model's 4",
        ),
        (
            "mlp --mesh tp=2 --pp-first-layers 1",
            "apply to a pp mesh dim",
        ),
        ("mlp --mesh tp=2 --microbatches 2", "apply to a pp mesh dim"),
        (
            "mlp --mesh tp=2 --pp-schedule 1f1b",
            "apply to a pp mesh dim",
        ),
        (
            "mlp --mesh pp=2 --layers 2 --grad-accum 2",
            "use --microbatches instead",
        ),
        (
            "mlp --mesh dp=2,pp=2 --layers 2 --microbatches 3",
            "not divisible into --microbatches 3",
        ),
        (
            "mlp --mesh pp=2 --layers 2 --bug pp-shuffled-microbatches",
            "--microbatches 2 or more",
        ),
        (
            "mlp --mesh tp=2 --bug pp-wrong-stage-division",
            "needs a pp mesh dim of size >= 2",
        ),
        (
            "mlp --mesh dp=2,pp=2 --layers 2 --microbatches 2 --zero 1 \
             --bug pp-grad-sync-before-last-microbatch",
            "not defined with --zero",
        ),
        (
            "mlp --mesh pp=2 --layers 2 --microbatches 0",
            "at least one microbatch",
        ),
    ] {
        s.assert_emit_refused(args, message);
    }
}
