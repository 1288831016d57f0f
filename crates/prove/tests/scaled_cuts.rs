//! Scaled cut relations (`stage::scale`): a data-parallel rank's activation gradient is the
//! replica count times the spec's on its rows. A full iteration cut at its backward lineage
//! with that scale is proved stage by stage, through the mesh-dim reduction where dp > 2 (its
//! replica-count constant rewritten with the ranks' `1/D`); a wrong scale is never proved.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_prove::stage::plan_with;
use shardproof_prove::{prove_staged_with, CutScales, PlanOptions, ProveConfig, Verdict};
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// A one-layer llama of width 4 (2 heads, 2 tokens, vocabulary 4) with a batch of `batch`,
/// full iteration, cut at every module output and input gradient its lineage names.
fn emit_cut(dir: &Path, mesh: &str, batch: usize) -> (shardproof_case::Case, CutScales) {
    emit_layers(dir, mesh, batch, 1)
}

/// [`emit_cut`] with `layers` layers.
fn emit_layers(
    dir: &Path,
    mesh: &str,
    batch: usize,
    layers: usize,
) -> (shardproof_case::Case, CutScales) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(layers, batch, 4),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    zoo_emit::emit_loaded(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    std::fs::copy(dir.join("case.yaml"), dir.join("uncut.yaml")).unwrap();
    assert!(layer_cuts::cut_at_modules(dir, true) >= 5);
    let scales = layer_cuts::backward_scales(dir);
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    (case, scales)
}

fn opts(scales: &CutScales) -> PlanOptions {
    PlanOptions {
        scales: scales.clone(),
        outputs_apart: false,
        ..PlanOptions::default()
    }
}

fn with(scales: &CutScales, c: u64) -> CutScales {
    scales.keys().map(|k| (k.clone(), c)).collect()
}

/// The whole case run by the interpreter at its own mesh on deterministic inputs (only `dp`
/// Shard(0) / Replicate layouts): every spec value and every rank's, by name.
fn run(case: &shardproof_case::Case) -> (shardproof_interp::Env, Vec<shardproof_interp::Env>) {
    use shardproof_case::{Layout, Placement};
    use shardproof_ops::Tensor;
    use std::collections::BTreeMap;
    let metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let d = case.program.ranks.len();
    let mut spec = BTreeMap::new();
    let mut ranks = vec![BTreeMap::new(); d];
    for (k, rel) in case.inputs.iter().enumerate() {
        let v = rel.spec_value;
        let meta = metas[v.node][v.output].clone().unwrap();
        let n = meta.numel();
        let data: Vec<f64> = if meta.dtype.is_float() {
            (0..n)
                .map(|i| (((i * 37 + k * 11) % 23) as f64 - 11.0) / 13.0)
                .collect()
        } else {
            let bound = shardproof_interp::index_bound(&case.spec, v, &metas);
            (0..n)
                .map(|i| ((i * 5 + k) as i64 % bound) as f64)
                .collect()
        };
        let t = Tensor::new(meta.clone(), data);
        let Layout::Placed(p) = &rel.layout else {
            panic!("placed")
        };
        for &(r, rv) in &rel.rank_values {
            let piece = match p.placements[0] {
                Placement::Replicate => t.clone(),
                Placement::Shard(0) => {
                    let rows = meta.shape[0] / d;
                    let per = n / meta.shape[0];
                    let mut shape = meta.shape.clone();
                    shape[0] = rows;
                    let mut m = meta.clone();
                    m.shape = shape;
                    Tensor::new(m, t.data[r * rows * per..(r + 1) * rows * per].to_vec())
                }
                ref other => panic!("{other}"),
            };
            let name = case.program.ranks[r].value_name(rv).to_string();
            ranks[r].insert(name, piece);
        }
        spec.insert(rel.spec_name.clone(), t);
    }
    let cfg = shardproof_interp::RunConfig {
        custom_ops: case.ops.clone(),
        ..Default::default()
    };
    let s = shardproof_interp::run_graph(&case.spec, &spec, &cfg).unwrap();
    let r = shardproof_interp::run_program(&case.program, &ranks, &cfg).unwrap();
    (s, r)
}

#[test]
fn dp_backward_cuts_hold_at_the_replica_count_in_a_run() {
    // The relation the scale states, checked by the interpreter on the whole case at dp = 4
    // (before any cut): each rank's input gradient at a backward cut is 4 times the spec's
    // rows it holds, and not 2 or 8 times.
    let dir = tempfile::tempdir().unwrap();
    let (_, scales) = emit_cut(dir.path(), "dp=4", 4);
    assert_eq!(scales.len(), 2, "{scales:?}");
    assert!(scales.values().all(|&c| c == 4));
    let whole = shardproof_case::load_case(&dir.path().join("uncut.yaml")).unwrap();
    let (spec, ranks) = run(&whole);
    for name in scales.keys() {
        let s = spec.get(whole.spec.find(name).unwrap()).unwrap();
        let rows = s.shape()[0] / 4;
        let per = s.numel() / s.shape()[0];
        for (r, env) in ranks.iter().enumerate() {
            let v = whole.program.ranks[r].find(name).unwrap();
            let rank = env.get(v).unwrap();
            let piece = &s.data[r * rows * per..(r + 1) * rows * per];
            assert!(
                piece.iter().any(|x| x.abs() > 1e-6),
                "{name}: a zero gradient"
            );
            for (a, b) in rank.data.iter().zip(piece) {
                assert!(
                    (a - 4.0 * b).abs() <= 1e-9 * (1.0 + b.abs()),
                    "{name} rank {r}"
                );
            }
        }
    }
}

#[test]
fn dp_4_full_iteration_cut_at_its_gradients_is_proved_through_the_mesh_reduction() {
    let dir = tempfile::tempdir().unwrap();
    let (case, scales) = emit_cut(dir.path(), "dp=4", 4);
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&scales));
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    // Every stage reading or establishing a backward cut went through the mesh reduction
    // with its relation's constant 4 rewritten to 2, as the ranks' 1/4.
    let plan = plan_with(&case, true, &opts(&scales)).unwrap();
    let mut through = 0;
    for p in &proof.proofs {
        let stage = &plan.stages[p.stage];
        let scaled = scales
            .keys()
            .any(|n| stage.assumes.contains(n) || stage.target.contains(&format!("`{n}`")));
        if !scaled {
            continue;
        }
        let mesh = &p.proof["mesh"];
        assert!(
            mesh.is_object(),
            "{}: not through the reduction",
            stage.target
        );
        let rewritten = mesh["rewritten"].to_string();
        assert!(
            rewritten.contains("4 -> 2"),
            "{}: {rewritten}",
            stage.target
        );
        through += 1;
    }
    assert!(through >= 2, "{through}");
}

#[test]
fn a_wrong_replica_count_at_dp_4_is_never_proved() {
    // 8 is a multiple of the replica count (rewritten to 4 on two replicas, still wrong) and
    // 2 is not (no rewrite, so no proof carries over from two replicas): both are refuted at a
    // backward cut's stage, each counterexample confirmed by the interpreter.
    let dir = tempfile::tempdir().unwrap();
    let (case, scales) = emit_cut(dir.path(), "dp=4", 4);
    for c in [8, 2] {
        let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&with(&scales, c)));
        assert_eq!(proof.verdict, Verdict::Refuted, "{c}: {:?}", proof.message);
    }
}

#[test]
fn the_replica_count_left_unrewritten_on_two_replicas_is_refuted() {
    // What rewriting the relation's constant guards against: a backward cut's stage at dp = 4
    // reduced to two replicas with its input's `mul(x, 4)` left at 4 (its output's `div` by 4
    // rewritten to 2) is refuted, so a reduction that forgot the constant could never prove
    // the right plan, and one that rewrote it wrongly is caught the same way.
    let dir = tempfile::tempdir().unwrap();
    let (case, scales) = emit_cut(dir.path(), "dp=4", 4);
    let plan = plan_with(&case, true, &opts(&scales)).unwrap();
    // The stage establishing one backward cut from another: it reads `mul(x, 4)` and
    // expects `div(y, 4)`.
    let k = plan
        .stages
        .iter()
        .position(|s| {
            scales.keys().any(|n| s.target == format!("cut `{n}`"))
                && scales.keys().any(|n| s.assumes.contains(n))
        })
        .unwrap();
    let m = shardproof_prove::reduce::mesh::reduce_mesh(&plan.stages[k].case)
        .unwrap()
        .unwrap();
    assert_eq!(m.lifts, Ok(()));
    assert!(
        m.rewritten.iter().any(|r| r.contains("4 -> 2")),
        "{:?}",
        m.rewritten
    );
    let mut reduced = m.case.clone();
    let mut undone = 0;
    for g in reduced.program.ranks.iter_mut() {
        let mut x = (**g).clone();
        let names: Vec<String> = x.nodes.iter().map(|n| n.name.clone()).collect();
        for n in x.nodes.iter_mut() {
            let shardproof_ir::NodeKind::Call { op, args, .. } = &mut n.kind else {
                continue;
            };
            let reads_unscaled = matches!(args.first(),
                Some(shardproof_ir::Arg::Value(v)) if names[v.node].ends_with("_unscaled"));
            if op.base() == "aten.mul" && reads_unscaled && args[1] == shardproof_ir::Arg::Int(2) {
                args[1] = shardproof_ir::Arg::Int(4);
                undone += 1;
            }
        }
        *g = std::sync::Arc::new(x);
    }
    assert!(undone > 0);
    let proof = shardproof_prove::prove_case(&reduced, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
}

#[test]
fn dp_2_backward_cuts_are_proved_at_2_and_refuted_at_3() {
    let dir = tempfile::tempdir().unwrap();
    let (case, scales) = emit_cut(dir.path(), "dp=2", 2);
    assert!(scales.values().all(|&c| c == 2));
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&scales));
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let wrong = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&with(&scales, 3)));
    assert_eq!(wrong.verdict, Verdict::Refuted, "{:?}", wrong.message);
    // Unscaled, as the plain placement states it, the backward cuts are refuted too.
    let plain = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&with(&scales, 1)));
    assert_eq!(plain.verdict, Verdict::Refuted, "{:?}", plain.message);
}

#[test]
fn outputs_apart_prove_each_layers_weight_updates_once() {
    // Two layers at dp = 4, one stage per expected output: the second layer's weight updates
    // state the first's theorem about renamed tensors, so they are memo hits, and the case is
    // proved as it is with the outputs together.
    let dir = tempfile::tempdir().unwrap();
    let (case, scales) = emit_layers(dir.path(), "dp=4", 4, 2);
    assert_eq!(scales.len(), 4, "{scales:?}");
    let apart = PlanOptions {
        scales: scales.clone(),
        outputs_apart: true,
        ..PlanOptions::default()
    };
    let together = plan_with(&case, true, &opts(&scales)).unwrap();
    let plan = plan_with(&case, true, &apart).unwrap();
    let outputs = case.outputs.len();
    assert_eq!(plan.stages.len(), together.stages.len() - 1 + outputs);
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &apart);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let hits: Vec<&str> = proof
        .stages
        .iter()
        .filter(|s| s.memo_hit && s.target.starts_with("output"))
        .map(|s| s.target.as_str())
        .collect();
    assert!(hits.iter().any(|t| t.contains("wq_1_new")), "{hits:?}");
}

#[test]
fn a_scale_for_a_tensor_the_case_does_not_relate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (case, mut scales) = emit_cut(dir.path(), "dp=4", 4);
    scales.insert("no_such_tensor".into(), 4);
    let why = plan_with(&case, true, &opts(&scales)).unwrap_err();
    assert!(why.contains("no_such_tensor"), "{why}");
}

#[test]
fn dp_4_tp_2_full_iteration_cut_at_its_gradients_is_proved_through_the_mesh_reduction() {
    // The tp ranks of one replica hold the same rows: each holds 4 times the spec's.
    let dir = tempfile::tempdir().unwrap();
    let (case, scales) = emit_cut(dir.path(), "dp=4,tp=2", 4);
    assert!(scales.values().all(|&c| c == 4));
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&scales));
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.proofs.iter().all(|p| p.proof["mesh"].is_object()));
    let wrong = prove_staged_with(&case, &ProveConfig::default(), 1, &opts(&with(&scales, 8)));
    assert_eq!(wrong.verdict, Verdict::Refuted, "{:?}", wrong.message);
}
