//! The bug classes added to complete MISSION.md's list: every new catalog bug is planted where
//! it belongs and `run` fails naming the output it changes (or, for the one numerically
//! invisible bug, holds: its values are the correct plan's); the correct plans with the model
//! options those bugs need (`--recompute`, `--fp8`, `--tp-comm-overlap`) hold; the options
//! and bugs are refused where they do not apply.

mod common;

use common::zoo::{check_moe_bugs, words};
use common::Scratch;
use shardproof_zoo::{find_bug, Site, BUGS, MISSION_CLASSES};

/// Emits `args` (after `zoo emit`, on one line) into `dir` and returns the case path.
fn emit(scratch: &Scratch, dir: &str, args: &str) -> String {
    scratch.emit_case(dir, &words(args))
}

/// Each new bug, a plan it is planted in (model, mesh and flags), and the output `run` names
/// first (in spec order).
const PLANTED: &[(&str, &str, &str)] = &[
    ("norm-sharded-hidden", "deepseek --mesh tp=2", "loss"),
    (
        "norm-sharded-hidden",
        "deepseek --mesh dp=2,tp=2,ep=2 --forward-only",
        "loss",
    ),
    (
        "sp-pad-slice-mismatch",
        "gpt2 --mesh tp=2 --sequence-parallel --forward-only",
        "loss",
    ),
    (
        "sp-pad-slice-mismatch",
        "gpt2 --mesh dp=2,tp=2 --sequence-parallel",
        "loss",
    ),
    ("dangling-backward-tensor", "mlp --mesh dp=2", "w1_0_new"),
    (
        "dangling-backward-tensor",
        "mlp --mesh dp=2,tp=2 --layers 2 --optimizer adam",
        "exp_avg_w1_0_new",
    ),
    (
        "zero-tied-embedding-untied",
        "gpt2 --mesh dp=2 --zero 1",
        "wte_new",
    ),
    (
        "zero-tied-embedding-untied",
        "gpt2 --mesh dp=2,tp=2 --zero 3 --optimizer adam",
        "exp_avg_wte_new",
    ),
    (
        "recompute-stale-input",
        "mlp --mesh dp=2 --layers 2 --recompute",
        "w1_0_new",
    ),
    (
        "recompute-stale-input",
        "mlp --mesh dp=2,tp=2 --layers 3 --recompute --zero 1",
        "w1_0_new",
    ),
    (
        "fp8-amax-wrong-group",
        "mlp --mesh dp=2,tp=2 --fp8 --forward-only",
        "loss",
    ),
    (
        "fp8-amax-wrong-group",
        "mlp --mesh dp=2,tp=2 --layers 2 --fp8 --recompute",
        "loss",
    ),
    (
        "fp8-recompute-wrong-cast",
        "mlp --mesh tp=2 --fp8 --recompute",
        "w1_0_new",
    ),
    (
        "fp8-recompute-wrong-cast",
        "mlp --mesh dp=2 --layers 2 --fp8 --recompute",
        "w1_0_new",
    ),
    (
        "tp-overlap-wrong-chunk-order",
        "gpt2 --mesh tp=2 --sequence-parallel --tp-comm-overlap",
        "wo_0_new",
    ),
    (
        "tp-overlap-wrong-chunk-order",
        "gpt2 --mesh dp=2,tp=4 --sequence-parallel --tp-comm-overlap",
        "wo_0_new",
    ),
];

#[test]
fn new_bugs_are_found_naming_the_output_they_change() {
    let scratch = Scratch::new();
    for (i, &(id, plan, expected)) in PLANTED.iter().enumerate() {
        let bug = find_bug(id).expect("a catalog bug");
        let case = emit(&scratch, &format!("b{i}"), &format!("{plan} --bug {id}"));
        scratch.assert_strict(&case);
        let (out, first) = scratch.run_mismatch(&case);
        assert_eq!(first, expected, "{plan} --bug {id}\n{}", out.stdout);
        assert_eq!(bug.changes_loss, expected == "loss", "{id}");
    }
    // Every bug of the catalog that `run` catches and that needs a model option, and every
    // bug added with this file, is planted above.
    for b in BUGS.iter().filter(|b| b.run_catches()) {
        let needs_option = !b.mutation.option_needs().is_empty();
        if needs_option {
            assert!(
                PLANTED.iter().any(|(id, ..)| *id == b.id),
                "{} is never planted",
                b.id
            );
        }
    }
}

#[test]
fn plans_with_the_new_options_hold() {
    let scratch = Scratch::new();
    let plans = [
        "mlp --mesh dp=2,tp=2 --layers 2 --recompute",
        "mlp --mesh tp=4 --layers 3 --recompute --grad-accum 2",
        "mlp --mesh tp=2 --fp8 --forward-only",
        "mlp --mesh dp=2,tp=2 --layers 2 --fp8",
        "mlp --mesh dp=2,tp=2 --layers 2 --fp8 --recompute --zero 3 --optimizer adam",
        "mlp --mesh dp=2 --fp8 --recompute --clip-grad 0.5 --loss-scale 4",
        "gpt2 --mesh tp=2 --sequence-parallel --tp-comm-overlap",
        "gpt2 --mesh dp=2,tp=4 --sequence-parallel --tp-comm-overlap",
        "gpt2 --mesh dp=2,tp=2 --sequence-parallel --tp-comm-overlap --zero 1 --optimizer adam",
    ];
    for (i, plan) in plans.iter().enumerate() {
        let case = emit(&scratch, &format!("ok{i}"), plan);
        scratch.assert_holds_strictly(&case);
    }
    // The options are in the case's name and header; FP8 casts every weight of every block
    // (w1 and w2), each with one amax all-reduce over tp.
    let yaml = scratch.read("ok3/case.yaml");
    assert!(yaml.contains("name: mlp-dp2-tp2-fp8\n"), "{yaml}");
    assert!(yaml.contains("# Options: --fp8."), "{yaml}");
    let r0 = scratch.read("ok3/r0.py");
    assert_eq!(r0.matches("aten.round.default(").count(), 4, "{r0}");
    assert_eq!(r0.matches(", 'max', 'tp')").count(), 4, "{r0}");
    let spec = scratch.read("ok3/spec.py");
    assert!(
        spec.contains("aten.round.default(") && !spec.contains("'max'"),
        "{spec}"
    );
    // Recomputation reruns fc1 and the relu in the backward: two relus per block.
    let r0 = scratch.read("ok0/r0.py");
    assert_eq!(r0.matches("aten.relu.default(").count(), 4, "{r0}");
    let spec = scratch.read("ok0/spec.py");
    assert_eq!(spec.matches("aten.relu.default(").count(), 2, "{spec}");
    // Overlap: the o and fc2 weight gradients of each layer in tp chunks.
    let r1 = scratch.read("ok6/r1.py");
    emit(&scratch, "sp", "gpt2 --mesh tp=2 --sequence-parallel");
    let p1 = scratch.read("sp/r1.py");
    let layers = 2;
    assert_eq!(
        r1.matches("aten.mm.default(").count(),
        p1.matches("aten.mm.default(").count() + 2 * layers,
        "{r1}"
    );
}

#[test]
fn async_allreduce_without_wait_is_invisible_to_run() {
    let scratch = Scratch::new();
    let bug = find_bug("async-allreduce-no-wait").unwrap();
    assert!(!bug.run_catches() && !bug.engines.starts_with("run"));
    for (i, plan) in ["mlp --mesh tp=2", "mlp --mesh dp=2,tp=2 --layers 2"]
        .iter()
        .enumerate()
    {
        let case = emit(
            &scratch,
            &format!("w{i}"),
            &format!("{plan} --bug {}", bug.id),
        );
        emit(&scratch, &format!("ok{i}"), plan);
        // The same dataflow, one wait_tensor fewer: `run` computes the correct plan's values.
        scratch.assert_holds(&case);
        let waits = |dir: String| {
            scratch
                .read(&format!("{dir}/r0.py"))
                .matches("wait_tensor.default(")
                .count()
        };
        assert_eq!(waits(format!("w{i}")) + 1, waits(format!("ok{i}")));
        scratch.assert_strict(&case);
    }
}

#[test]
fn new_options_and_bugs_are_refused_where_they_do_not_apply() {
    let scratch = Scratch::new();
    let refused = [
        (
            "llama --recompute",
            "--recompute and --fp8 apply to the mlp model",
        ),
        ("gpt2 --fp8", "--recompute and --fp8 apply to the mlp model"),
        (
            "mlp --recompute --forward-only",
            "--recompute needs the full iteration",
        ),
        (
            "gpt2 --mesh tp=2 --tp-comm-overlap",
            "--tp-comm-overlap applies to the gpt2 model's full iteration",
        ),
        (
            "mlp --mesh pp=2 --layers 2 --recompute",
            "cannot be combined with a pp mesh dim",
        ),
        (
            "mlp --mesh dp=2 --layers 2 --bug recompute-stale-input",
            "activation recomputation (--recompute)",
        ),
        (
            "mlp --mesh dp=2 --recompute --bug recompute-stale-input",
            "at least two layers",
        ),
        (
            "mlp --mesh dp=2,tp=2 --bug fp8-amax-wrong-group",
            "FP8 weights (--fp8)",
        ),
        (
            "mlp --mesh tp=2 --fp8 --bug fp8-amax-wrong-group",
            "dp mesh dim",
        ),
        (
            "mlp --mesh tp=2 --fp8 --bug fp8-recompute-wrong-cast",
            "activation recomputation (--recompute)",
        ),
        (
            "gpt2 --mesh dp=2 --bug zero-tied-embedding-untied",
            "ZeRO (--zero 1, 2 or 3)",
        ),
        (
            "gpt2 --mesh tp=2 --sequence-parallel --bug tp-overlap-wrong-chunk-order",
            "TP communication overlap (--tp-comm-overlap)",
        ),
        (
            "gpt2 --mesh tp=2 --bug sp-pad-slice-mismatch",
            "--sequence-parallel",
        ),
        (
            "deepseek --mesh ep=2 --bug norm-sharded-hidden",
            "tp mesh dim",
        ),
        (
            "mlp --mesh dp=2 --bug async-allreduce-no-wait",
            "tp mesh dim",
        ),
        (
            "mlp --mesh dp=2 --forward-only --bug dangling-backward-tensor",
            "full iteration",
        ),
    ];
    for (request, word) in refused {
        scratch.assert_emit_refused(request, word);
    }
}

#[test]
fn deepseek_sequence_parallel_plans_hold_and_moe_bugs_are_found() {
    let scratch = Scratch::new();
    let mut planted: Vec<&str> = Vec::new();
    for (mesh, dp, tp, ep) in [
        ("tp=2", 1, 2, 1),
        ("tp=2,ep=2", 1, 2, 2),
        ("dp=2,tp=2,ep=2", 2, 2, 2),
    ] {
        for forward_only in [true, false] {
            let mut flags = format!("deepseek --mesh {mesh} --sequence-parallel");
            if forward_only {
                flags.push_str(" --forward-only");
            }
            let dir = format!("{mesh}-{forward_only}");
            let case = emit(&scratch, &dir, &flags);
            scratch.assert_holds_strictly(&case);
            let site = Site {
                sequence_parallel: true,
                ..Site::new("deepseek", dp, tp, forward_only)
            };
            planted.extend(check_moe_bugs(&scratch, &dir, &words(&flags), &site, ep));
        }
    }
    for id in [
        "moe-experts-sharded-under-sp",
        "moe-router-grad-unsynced",
        "norm-sharded-hidden",
        "ep-expert-grad-not-averaged",
    ] {
        assert!(planted.contains(&id), "{id} is never planted under SP");
    }
    assert!(!planted.contains(&"moe-aux-loss-not-divided-by-tp"));
    // The MoE blocks' experts (shared and routed) are replicated over tp, split over ep; the
    // block runs on the rank's sequence chunk and all-gathers the chunks' outputs over tp.
    let yaml = scratch.read("tp=2,ep=2-false/case.yaml");
    assert!(yaml.contains("name: deepseek-tp2-ep2-sp\n"), "{yaml}");
    assert!(
        yaml.contains("  expert_gate_0: { ep: Shard(0) }\n"),
        "{yaml}"
    );
    assert!(yaml.contains("  shared_up_0: Replicate()\n"), "{yaml}");
    let r1 = scratch.read("tp=2,ep=2-false/r1.py");
    assert!(r1.contains("expert_gate_0: \"f32[2, 8, 16]\""), "{r1}");
    let bug = scratch.read("tp=2,ep=2-false-moe-experts-sharded-under-sp/case.yaml");
    assert!(
        bug.contains("  expert_gate_0: { tp: Shard(1), ep: Shard(0) }\n"),
        "{bug}"
    );
    // With the all-to-all dispatcher too; the aux-loss bug has no share to miss under SP.
    let case = emit(
        &scratch,
        "a2a",
        "deepseek --mesh dp=2,tp=2,ep=2 --sequence-parallel --ep-dispatch alltoall",
    );
    scratch.run(&["run", &case]).expect_code(0);
    for (request, word) in [
        (
            "deepseek --mesh tp=2 --sequence-parallel --bug moe-aux-loss-not-divided-by-tp",
            "not defined under --sequence-parallel",
        ),
        (
            "deepseek --mesh tp=2 --bug moe-experts-sharded-under-sp",
            "--sequence-parallel",
        ),
        (
            "deepseek --mesh tp=2 --seq 5 --sequence-parallel",
            "seq 5 is not divisible by tp = 2",
        ),
        (
            "llama --mesh tp=2 --sequence-parallel",
            "sequence parallelism applies to the gpt2 and deepseek models",
        ),
    ] {
        scratch.assert_emit_refused(request, word);
    }
}

#[test]
fn every_mission_class_has_catalog_entries() {
    for (class, ids) in MISSION_CLASSES {
        assert!(!ids.is_empty(), "{class}");
    }
    // `zoo list --bugs` shows every entry, the invisible one with the engine that can see it.
    let scratch = Scratch::new();
    let out = scratch.run(&["zoo", "list", "--bugs"]);
    out.expect_code(0);
    let line = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("async-allreduce-no-wait "))
        .expect("listed");
    assert!(line.contains("check (missing wait)"), "{line}");
}
