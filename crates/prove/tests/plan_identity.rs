//! The staged plan's cost is made to scale with the ranks that hold part of a stage (marks and
//! slices only for them, pairing closed by a worklist, the whole run's meetings indexed once),
//! none of which may change the plan: which stages exist, what each targets and assumes, its
//! graphs and relations (its memo key, unreduced: the whole stage case's structure), which
//! stage proves it and its node counts.
//!
//! The fingerprints below were computed by the plan code before that change (commit 0b468fd,
//! dense marks on every rank, pairing closed by rescanning every meeting, the whole run's
//! meetings collected per stage) on the same emitted cases. They depend on the zoo's emission
//! too: a change to what the zoo emits for these models changes them, and they are then
//! recomputed from the plan as it stands (`print_fingerprints` below, `--ignored`), after
//! checking that the plan change alone is not the cause.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_prove::stage::{absolute_key_digest, plan_until, Plan};
use shardproof_prove::PlanOptions;
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions, TrainOptions};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// FNV-1a, 64 bits (the plan's own digest): the same in every process.
fn digest_text(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Every stage's target, assumptions, unreduced key digest with absolute rank numbers, memo
/// representative by that key, and node counts, one line each, and the digest of the whole;
/// with the stage and distinct counts: the plan's stages (their graphs and relations) as the
/// code before the memo up to renumbering computed them, the memo apart.
fn stages_fingerprint(plan: &Plan) -> String {
    let mut lines = String::new();
    let mut first: HashMap<String, usize> = HashMap::new();
    for (k, s) in plan.stages.iter().enumerate() {
        let key = absolute_key_digest(&s.case);
        let rep = *first.entry(key.clone()).or_insert(k);
        let _ = writeln!(
            lines,
            "{k} {} | {} | {} {} {} {}",
            s.target,
            s.assumes.join(","),
            key,
            rep,
            s.spec_nodes,
            s.rank_nodes
        );
    }
    format!(
        "{} stages, {} distinct, {}",
        plan.stages.len(),
        first.len(),
        digest_text(&lines)
    )
}

/// The memo: the distinct count and every stage's representative. A stage's representative by
/// the key up to renumbering is never later than by the absolute key (equal absolute keys are
/// equal renumbered keys), which is checked here; the reps are pinned by the constants.
fn memo_fingerprint(plan: &Plan) -> String {
    let mut first: HashMap<String, usize> = HashMap::new();
    let mut reps = String::new();
    for (k, s) in plan.stages.iter().enumerate() {
        let absolute_rep = *first.entry(absolute_key_digest(&s.case)).or_insert(k);
        assert!(
            s.rep <= absolute_rep && plan.stages[s.rep].key == s.key,
            "stage {k}: rep {} (absolute {absolute_rep})",
            s.rep
        );
        let _ = write!(reps, "{} ", s.rep);
    }
    format!("{} distinct, {}", plan.distinct.len(), digest_text(&reps))
}

/// Both fingerprints.
fn fingerprint(plan: &Plan) -> (String, String) {
    (stages_fingerprint(plan), memo_fingerprint(plan))
}

/// A pipeline full iteration cut as `prove_presets` cuts one: at every module output and input
/// gradient, microbatched, the gradients scaled, each weight update apart.
fn full_iteration_cuts(dir: &Path) -> PlanOptions {
    layer_cuts::cut_at_modules(dir, true);
    let micro = layer_cuts::microbatch_cuts_at_modules(dir, true);
    let mut scales = layer_cuts::backward_scales(dir);
    scales.extend(layer_cuts::microbatch_backward_scales(dir, &micro));
    PlanOptions {
        scales,
        outputs_apart: true,
        microbatch_cuts: micro,
        ..PlanOptions::default()
    }
}

/// A forward cut as `prove_presets --forward` cuts it.
fn forward_cuts(dir: &Path) -> PlanOptions {
    layer_cuts::cut_at_layers(dir);
    PlanOptions {
        microbatch_cuts: layer_cuts::microbatch_cuts_at_modules(dir, false),
        ..PlanOptions::default()
    }
}

/// The plan of the case in `dir` under `opts`, unreduced keys, fingerprinted.
fn planned(dir: &Path, opts: &PlanOptions) -> (String, String) {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    // Every stage's own case: the stages fingerprint pins each one's graphs and relations.
    let opts = PlanOptions {
        keep_memo_hit_cases: true,
        ..opts.clone()
    };
    let plan = plan_until(&case, false, &opts).unwrap();
    fingerprint(&plan)
}

/// The four-layer dp=2,pp=2,tp=2 llama (two microbatches) of `preset_full_iteration.rs`.
fn zoo_llama(forward: bool, vocab_parallel: bool) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(4, 8, 8),
        mesh: Mesh::parse("dp=2,pp=2,tp=2").unwrap(),
        bug: None,
        forward_only: forward,
        vocab_parallel,
    };
    let pipeline = PipelineOptions {
        microbatches: 2,
        ..PipelineOptions::default()
    };
    zoo_emit::emit(dir.path(), &opts, &EmitExtras::default(), &pipeline);
    let cuts = if forward {
        forward_cuts(dir.path())
    } else {
        full_iteration_cuts(dir.path())
    };
    planned(dir.path(), &cuts)
}

/// llama3-405b-tiny (16 ranks, llama3-405b's plan), as `prove_presets` emits and cuts it.
fn tiny_405b(forward: bool) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let preset = shardproof_zoo::find_preset("llama3-405b-tiny").unwrap();
    let (mut opts, extras, pipeline) = preset.request();
    opts.forward_only = forward;
    shardproof_zoo::emit_to_dir(&opts, &extras, &TrainOptions::PLAIN, &pipeline, dir.path())
        .unwrap();
    let cuts = if forward {
        forward_cuts(dir.path())
    } else {
        full_iteration_cuts(dir.path())
    };
    planned(dir.path(), &cuts)
}

/// Per plan: its stages as the code before the memo up to renumbering planned them, and its
/// memo (distinct count, every stage's representative).
type Fingerprint = (&'static str, &'static str);

const ZOO_FULL: Fingerprint = (
    "57 stages, 48 distinct, f8b52f33e9b28e54",
    "35 distinct, b081e27e42666d44",
);
const ZOO_FULL_VOCAB: Fingerprint = (
    "57 stages, 48 distinct, 1b8ea912003fe231",
    "35 distinct, b081e27e42666d44",
);
const ZOO_FORWARD: Fingerprint = (
    "10 stages, 7 distinct, 467954314fdc2150",
    "5 distinct, 7caa378073006440",
);
const TINY_FULL: Fingerprint = (
    "1643 stages, 98 distinct, 093413ed07d192ea",
    "35 distinct, 92d068acb75c2036",
);
const TINY_FORWARD: Fingerprint = (
    "254 stages, 13 distinct, fab83caf2ea00f67",
    "5 distinct, 6612460c85c044bf",
);

fn assert_fingerprint(got: (String, String), want: Fingerprint) {
    assert_eq!(got.0, want.0, "the stages changed");
    assert_eq!(got.1, want.1, "the memo changed");
}

#[test]
fn a_zoo_pipeline_plan_is_unchanged() {
    assert_fingerprint(zoo_llama(false, false), ZOO_FULL);
    assert_fingerprint(zoo_llama(false, true), ZOO_FULL_VOCAB);
    assert_fingerprint(zoo_llama(true, false), ZOO_FORWARD);
}

#[test]
fn llama3_405b_tiny_plans_are_unchanged() {
    assert_fingerprint(tiny_405b(false), TINY_FULL);
    assert_fingerprint(tiny_405b(true), TINY_FORWARD);
}

/// Prints the fingerprints of the plans as the code stands (to recompute the constants above
/// where the zoo's emission changed).
#[test]
#[ignore = "prints the fingerprints; run with --ignored --nocapture to recompute them"]
fn print_fingerprints() {
    println!("ZOO_FULL {:?}", zoo_llama(false, false));
    println!("ZOO_FULL_VOCAB {:?}", zoo_llama(false, true));
    println!("ZOO_FORWARD {:?}", zoo_llama(true, false));
    println!("TINY_FULL {:?}", tiny_405b(false));
    println!("TINY_FORWARD {:?}", tiny_405b(true));
}

/// A relation read through the spec only lays out its rank tensors too, and a later relation
/// naming the same rank tensor is then read (the plan examines relations in order): here the
/// output stage reads `x` on the spec, the ranks compute their output from `y` alone, and cut
/// `b` is held by the ranks' `x`, so laying out `x` makes the stage assume `b` as well.
#[test]
fn a_later_relation_on_a_laid_out_tensor_is_assumed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", y: \"f32[4, 8]\"):\n        b: \"f32[4, 8]\" = torch.ops.aten.neg.default(x)\n        r: \"f32[4, 8]\" = torch.ops.aten.relu.default(x)\n        c: \"f32[4, 8]\" = torch.ops.aten.add.Tensor(r, y)\n        return (c,)\n";
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", y: \"f32[4, 8]\"):\n        c: \"f32[4, 8]\" = torch.ops.aten.relu.default(y)\n        return (c,)\n";
    std::fs::write(d.join("spec.py"), spec).unwrap();
    std::fs::write(d.join("r0.py"), rank).unwrap();
    std::fs::write(d.join("r1.py"), rank).unwrap();
    std::fs::write(
        d.join("case.yaml"),
        "version: 1\nname: shared\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  y: Replicate()\n  b: { impl: x, placement: Replicate() }\n",
    )
    .unwrap();
    let case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
    let plan = plan_until(&case, false, &PlanOptions::default()).unwrap();
    let output = plan
        .stages
        .iter()
        .find(|s| s.target.contains("`c`"))
        .expect("the output stage");
    let order: Vec<&str> = case.inputs.iter().map(|r| r.spec_name.as_str()).collect();
    assert!(
        output.assumes.contains(&"b".to_string()),
        "{:?} {order:?} {:?}",
        output.assumes,
        plan.stages.iter().map(|s| &s.target).collect::<Vec<_>>()
    );
}
