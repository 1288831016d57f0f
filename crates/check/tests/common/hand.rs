//! Hand-made cases written as files: a spec graph, rank graphs and a case YAML in a fresh
//! directory, checked, and the directory removed.
#![allow(dead_code)]

use super::values::close;
use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{Graph, NodeKind, ValueId};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

/// Writes `files` (name, text; one of them `case.yaml`) into a directory of its own named by
/// `tag`, checks the case, prints the report (shown when a test fails) and returns its verdict.
pub fn check_files(tag: &str, files: &[(String, String)]) -> Verdict {
    // A directory of its own per call: tests of one binary run on threads of one process, so
    // a name made of the tag and the process id was shared by tests of the same tag.
    let tmp = tempfile::Builder::new()
        .prefix(&format!("shardproof-{tag}-"))
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    eprintln!("{}", report.render());
    report.verdict
}

/// The fx text of a graph module with signature `params` and lines `body` (unindented) that
/// returns its value `out`.
pub fn graph_module(params: &[String], body: &[String]) -> String {
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, {}):\n{}\n        return (out,)\n",
        params.join(", "),
        body.iter()
            .map(|l| format!("        {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

/// As [`check_files`], and runs the case through the interpreter: the spec on `leaf(name)`
/// for each of its inputs, rank `q` on `rank_leaf(q, name)` for each of its graph's inputs.
/// Returns the verdict and whether every rank's value named `out` equals the spec's (a
/// program the interpreter cannot run is not right).
pub fn check_and_run_files(
    tag: &str,
    files: &[(String, String)],
    out: &str,
    leaf: impl Fn(&str) -> Tensor,
    rank_leaf: impl Fn(usize, &str) -> Tensor,
) -> (Verdict, bool) {
    // A directory of its own per call: tests of one binary run on threads of one process, so
    // a name made of the tag and the process id was shared by tests of the same tag.
    let tmp = tempfile::Builder::new()
        .prefix(&format!("shardproof-{tag}-"))
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    eprintln!("{}", report.render());
    let inputs = |g: &Graph| -> Vec<String> {
        g.nodes
            .iter()
            .filter(|n| matches!(n.kind, NodeKind::Input))
            .map(|n| n.name.clone())
            .collect()
    };
    let at = |g: &Graph| {
        g.nodes
            .iter()
            .position(|n| n.name == out)
            .map(|i| ValueId::new(i, 0))
    };
    let spec_leaves: BTreeMap<String, Tensor> = inputs(&case.spec)
        .into_iter()
        .map(|n| {
            let t = leaf(&n);
            (n, t)
        })
        .collect();
    let want = run_graph(&case.spec, &spec_leaves, &RunConfig::default())
        .ok()
        .and_then(|env| {
            at(&case.spec)
                .and_then(|v| env.get(v))
                .map(|t| t.data.to_vec())
        });
    let per_rank: Vec<BTreeMap<String, Tensor>> = case
        .program
        .ranks
        .iter()
        .enumerate()
        .map(|(q, g)| {
            inputs(g)
                .into_iter()
                .map(|n| {
                    let t = rank_leaf(q, &n);
                    (n, t)
                })
                .collect()
        })
        .collect();
    let right = run_program(&case.program, &per_rank, &RunConfig::default()).is_ok_and(|envs| {
        envs.iter().zip(&case.program.ranks).all(|(env, g)| {
            at(g)
                .and_then(|v| env.get(v))
                .is_some_and(|t: &Tensor| want.as_ref().is_some_and(|w| close(&t.data, w)))
        })
    });
    (report.verdict, right)
}
