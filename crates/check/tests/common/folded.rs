//! The plumbing of the folded-mean cases (`engine/scaling.rs`, issue 44): one rank graph run
//! by every rank of a mesh whose dims are each a group of their own name, the case written,
//! loaded and checked, and the spec and every rank run through the interpreter on the same
//! data, each rank's `out` compared with the spec's.
#![allow(dead_code)]

use super::dispatch::{load_written, Declared};
use super::values::close;
use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{Graph, ValueId};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

/// The graph of a program on `rows × cols` tokens `a` scaling them by `factor` (after three
/// negations) and summing them into `l`, followed by `tail` (lines reading `l`, defining
/// `out`).
pub fn scaled_sum_graph((rows, cols): (usize, usize), factor: f64, tail: &str) -> String {
    format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{rows}, {cols}]\"):
        t1: \"f64[{rows}, {cols}]\" = torch.ops.aten.neg.default(a)
        t2: \"f64[{rows}, {cols}]\" = torch.ops.aten.neg.default(t1)
        t3: \"f64[{rows}, {cols}]\" = torch.ops.aten.neg.default(t2)
        m: \"f64[{rows}, {cols}]\" = torch.ops.aten.mul.Tensor(t3, {factor:?})
        l: \"f64[]\" = torch.ops.aten.sum.default(m)
{tail}        return (out,)
"
    )
}

/// What differs between the folded-mean cases besides their graphs and data.
pub struct Folded<'a> {
    /// The case's name.
    pub name: &'a str,
    /// Mesh dims and sizes, outermost first; each dim is also the group of its name.
    pub mesh: &'a [(&'a str, usize)],
    /// Inputs and their placements (YAML text, e.g. `{ dp: Shard(0) }`).
    pub inputs: &'a [(&'a str, String)],
}

/// Writes `spec` and `rank` (as every rank's graph) under `folded`, checks the case, and runs
/// the spec on `leaves` and rank `q` on `rank_leaves(q)`: the verdict, whether every rank's
/// `out` is the spec's `out` (a program the interpreter cannot run is not right), and the
/// report.
pub fn check_and_run(
    folded: &Folded,
    spec: &str,
    rank: &str,
    leaves: &BTreeMap<String, Tensor>,
    rank_leaves: impl Fn(usize) -> BTreeMap<String, Tensor>,
) -> (Verdict, bool, String) {
    let ranks: usize = folded.mesh.iter().map(|d| d.1).product();
    let groups: Vec<(&str, Vec<&str>)> = folded.mesh.iter().map(|d| (d.0, vec![d.0])).collect();
    let declared = Declared {
        name: folded.name,
        mesh: folded.mesh,
        groups: &groups,
        inputs: folded.inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let case = load_written(spec, &vec![rank.to_string(); ranks], &declared);
    let report = check_case(&case).unwrap();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec)).map(|t| t.data.to_vec()));
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..ranks).map(rank_leaves).collect();
    let right = run_program(&case.program, &per_rank, &RunConfig::default()).is_ok_and(|envs| {
        envs.iter().zip(&case.program.ranks).all(|(env, g)| {
            env.get(at(g))
                .is_some_and(|t: &Tensor| want.as_ref().is_some_and(|w| close(&t.data, w)))
        })
    });
    (report.verdict, right, report.render())
}
