//! Group-relative point-to-point peers (issues 44 and 45): the zoo names a send's and recv's
//! peer by its index in the rank's `pp` group. `verify` pairs the messages by their global
//! peers either way: the same pipelined plan with its peers rewritten to global ranks gets the
//! same verdict and reason.

use shardproof_case::Case;
use shardproof_ir::{Arg, NodeKind};
use shardproof_ops::{p2p_node_call, program_members, P2pEnd};
use shardproof_refine::{verify, Options, Verdict};
use shardproof_zoo::{
    emit_pipelined, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
    TrainOptions,
};
use std::sync::Arc;

/// The mlp on dp=2, pp=2 with two microbatches, full iteration, as the zoo writes it
/// (group-relative peers) and with every peer rewritten to its global rank.
fn both_forms(dir: &std::path::Path) -> (Case, Case) {
    let opts = EmitOptions {
        model: "mlp".into(),
        mlp: MlpConfig {
            layers: 2,
            batch: 8,
            ..MlpConfig::default()
        },
        llama: LlamaConfig::default(),
        mesh: Mesh::parse("dp=2,pp=2").unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    let pipeline = PipelineOptions {
        microbatches: 2,
        ..PipelineOptions::DEFAULT
    };
    let e = emit_pipelined(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::default(),
        &pipeline,
    )
    .unwrap();
    e.write(dir).unwrap();
    let file = dir.join("case.yaml");
    let grouped = shardproof_case::load_case(&file).unwrap();
    let mut global = shardproof_case::load_case(&file).unwrap();
    let mut rewritten = 0;
    for (r, g) in global.program.ranks.iter_mut().enumerate() {
        let members = program_members(&grouped.program, r);
        let mut graph = (**g).clone();
        for node in &mut graph.nodes {
            let NodeKind::Call { op, args, kwargs } = &mut node.kind else {
                continue;
            };
            let Some(call) = p2p_node_call(op, args, kwargs, &members) else {
                continue;
            };
            let call = call.unwrap();
            let at = if call.end == P2pEnd::Send { 1 } else { 2 };
            assert_eq!(args.len(), at + 3, "the zoo names the group: {args:?}");
            args.truncate(at);
            args.extend([Arg::Int(call.peer as i64), Arg::Int(call.tag)]);
            rewritten += 1;
        }
        *g = Arc::new(graph);
    }
    assert!(rewritten > 0);
    (grouped, global)
}

#[test]
fn a_pipelined_plan_verifies_alike_with_group_and_global_peers() {
    let dir = tempfile::tempdir().unwrap();
    let (grouped, global) = both_forms(dir.path());
    let a = verify(&grouped, &Options::default());
    let b = verify(&global, &Options::default());
    assert_eq!(a.verdict, Verdict::Verified, "{:?}", a.reason);
    assert_eq!((a.verdict, &a.reason), (b.verdict, &b.reason));
}
