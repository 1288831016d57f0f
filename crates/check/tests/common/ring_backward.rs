//! The zoo's llama plan on a context-parallel ring (the ring backward's key and value
//! gradients, `attention/key_grads.rs`): emitted once per ring size, its rank graphs edited as
//! text, checked and run in the interpreter, and the final recvs of the last layer's key and
//! value gradients compared with the spec's.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::values::close;

/// The emitted llama plan on a ring of `cp` ranks (2 or 4): its file names and texts.
pub fn emitted(cp: usize) -> &'static Vec<(String, String)> {
    static TWO: OnceLock<Vec<(String, String)>> = OnceLock::new();
    static FOUR: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let (cell, mesh) = if cp == 2 {
        (&TWO, "cp=2")
    } else {
        (&FOUR, "cp=4")
    };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let plan = super::plans::Plan::new("llama", mesh, false);
        let case = plan.emit(dir.path()).unwrap();
        let root = case.parent().unwrap();
        let ranks = (0..cp).map(|r| format!("r{r}.py"));
        ["case.yaml".to_string(), "spec.py".to_string()]
            .into_iter()
            .chain(ranks)
            .map(|f| {
                let text = std::fs::read_to_string(root.join(&f)).unwrap();
                (f, text)
            })
            .collect()
    })
}

/// The last layer's final recvs of the keys' and values' gradients on a ring of `cp` ranks
/// (the first in the backward).
pub fn final_recvs(cp: usize) -> [&'static str; 2] {
    if cp == 2 {
        ["recv_8", "recv_9"]
    } else {
        ["recv_24", "recv_25"]
    }
}

/// What a run of the checker and the interpreter gave.
pub struct Ran {
    pub verdict: Verdict,
    pub render: String,
    /// Per rank and final recv (`recv_8`, `recv_9`): whether the checker claims rows on dim 2.
    pub claimed: Vec<[bool; 2]>,
    /// Per rank and final recv: whether the value is the rank's rows of the spec's gradient
    /// (`None`: the program does not run, a recv waits forever).
    pub right: Option<Vec<[bool; 2]>>,
}

pub fn value_at(g: &Graph, name: &str) -> ValueId {
    let i = g.nodes.iter().position(|x| x.name == name);
    ValueId::new(i.unwrap_or_else(|| panic!("no node `{name}`")), 0)
}

/// Checks and runs the plan on a ring of `cp` ranks, each rank's graph text edited by
/// `edit(rank, text)` (the identity: the zoo's plan), on inputs of `seed`.
pub fn run_edited(cp: usize, edit: &dyn Fn(usize, &str) -> String, seed: u64) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in emitted(cp) {
        let rank = (0..cp).find(|r| *name == format!("r{r}.py"));
        let text = rank.map_or_else(|| text.clone(), |r| edit(r, text));
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    let prop = propagate(&case).unwrap();
    let leaves = inputs(&case.spec, seed);
    let spec = run_graph(&case.spec, &leaves, &RunConfig::default()).expect("spec runs");
    let envs = run_program(&case.program, &vec![leaves; cp], &RunConfig::default());
    let (mut claimed, mut right) = (Vec::new(), Vec::new());
    let c = 8 / (2 * cp);
    for r in 0..cp {
        let g = &case.program.ranks[r];
        // The ranks' positions: chunks r and 2 cp - 1 - r of c tokens.
        let pos: Vec<usize> = [r, 2 * cp - 1 - r]
            .iter()
            .flat_map(|&k| c * k..c * k + c)
            .collect();
        let (mut cl, mut ri) = ([false; 2], [false; 2]);
        for (j, (recv, whole)) in final_recvs(cp)
            .into_iter()
            .zip(["sum_2", "sum_3"])
            .enumerate()
        {
            cl[j] = matches!(prop.ranks[r].of(value_at(g, recv), 1)[0], Place::Rows(2, _));
            let want = spec.get(value_at(&case.spec, whole)).unwrap();
            // `[b, kv heads, 8, d]` -> the rank's rows of dim 2.
            let (b, h, s, d) = (2, 2, 8, 4);
            let want: Vec<f64> = (0..b * h)
                .flat_map(|bh| {
                    pos.iter()
                        .flat_map(move |&p| (0..d).map(move |k| (bh * s + p) * d + k))
                })
                // Each cp rank's loss is the mean over its own tokens: its output gradient is n
                // times its rows of the spec's (the gradients' average over cp divides it).
                .map(|k| cp as f64 * want.data[k])
                .collect();
            ri[j] = envs.as_ref().is_ok_and(|envs| {
                envs[r]
                    .get(value_at(g, recv))
                    .is_some_and(|t| close(&t.data, &want))
            });
        }
        claimed.push(cl);
        right.push(ri);
    }
    Ran {
        verdict: report.verdict,
        render: report.render(),
        claimed,
        right: envs.is_ok().then_some(right),
    }
}

/// Random inputs for the spec's signature: token ids below the vocabulary, floats otherwise.
pub fn inputs(spec: &Graph, seed: u64) -> BTreeMap<String, Tensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    spec.inputs
        .iter()
        .map(|&v| {
            let node = &spec.nodes[v.node];
            let meta = node.outputs[0]
                .ty
                .as_ref()
                .and_then(Meta::from_type)
                .unwrap();
            let n: usize = meta.shape.iter().product();
            let data: Vec<f64> = if meta.dtype == DType::I64 {
                (0..n).map(|_| rng.random_range(0..32) as f64).collect()
            } else {
                (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
            };
            (node.name.clone(), Tensor::new(meta, data))
        })
        .collect()
}

/// Every claim is the interpreter's value.
pub fn claims_hold(ran: &Ran) -> Result<(), String> {
    let Some(right) = &ran.right else {
        return Ok(());
    };
    for (r, (claimed, right)) in ran.claimed.iter().zip(right).enumerate() {
        for j in 0..2 {
            if claimed[j] && !right[j] {
                return Err(format!(
                    "rank {r}: final recv {j} claimed rows of the gradient, but it is not"
                ));
            }
        }
    }
    Ok(())
}
