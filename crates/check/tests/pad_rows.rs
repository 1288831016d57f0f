//! Pads of a microbatch's rows (issue 44: DeepSeek's router-score gradient, a rank's expert
//! columns padded into place before the reduce-scatter): a pad of other dims than the rows'
//! keeps each row (`rows::rows_mode`); a pad of the rows' own dim reads their order and is
//! never taken as the selection. The interpreter says whether the ranks' outputs make the
//! spec's, and the checker must hold the right program only.
//!
//! Mesh `dp: 2`; each rank holds its shard of `x [B, H]` and `y [B, H + P]` and works on `K`
//! microbatches of `L` rows of it.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, random, ty};

/// Coordinates of dp.
const N: usize = 2;
/// Microbatches.
const K: usize = 2;
/// Rows of a microbatch of a rank's shard.
const L: usize = 2;
/// Columns of `x`.
const H: usize = 3;
/// Columns the pad adds.
const P: usize = 2;

/// What a program does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Program {
    /// Per microbatch: `x`'s rows padded with `P` zero columns, times `y`'s rows, summed.
    PadColumns,
    /// Per microbatch: `x`'s rows padded along the rows into the rank's block of `N` blocks
    /// (as an expert-parallel rank puts its columns in place), the microbatches concatenated:
    /// summed over the ranks, microbatch-major rows, not the batch's order.
    PadRowsInPlace,
}

fn rank_graph(program: Program, r: usize) -> String {
    let params = vec![
        format!("x: {}", ty(&[K * L, H])),
        format!("y: {}", ty(&[K * L, H + P])),
    ];
    let mut body = Vec::new();
    for k in 0..K {
        body.push(format!(
            "xs{k}: {} = torch.ops.aten.slice.Tensor(x, 0, {}, {})",
            ty(&[L, H]),
            k * L,
            (k + 1) * L
        ));
        match program {
            Program::PadColumns => {
                body.push(format!(
                    "xp{k}: {} = torch.ops.aten.constant_pad_nd.default(xs{k}, [0, {P}], 0.0)",
                    ty(&[L, H + P])
                ));
                body.push(format!(
                    "ys{k}: {} = torch.ops.aten.slice.Tensor(y, 0, {}, {})",
                    ty(&[L, H + P]),
                    k * L,
                    (k + 1) * L
                ));
                body.push(format!(
                    "m{k}: {} = torch.ops.aten.mul.Tensor(xp{k}, ys{k})",
                    ty(&[L, H + P])
                ));
                body.push(format!(
                    "o{k}: {} = torch.ops.aten.sum.default(m{k})",
                    ty(&[])
                ));
            }
            Program::PadRowsInPlace => body.push(format!(
                "o{k}: {} = torch.ops.aten.constant_pad_nd.default(xs{k}, [0, 0, {}, {}], 0.0)",
                ty(&[N * L, H]),
                r * L,
                (N - 1 - r) * L
            )),
        }
    }
    body.push(match program {
        Program::PadColumns => format!("out: {} = torch.ops.aten.add.Tensor(o0, o1)", ty(&[])),
        Program::PadRowsInPlace => format!(
            "out: {} = torch.ops.aten.cat.default([o0, o1])",
            ty(&[K * N * L, H])
        ),
    });
    common::hand::graph_module(&params, &body)
}

fn spec_graph(program: Program) -> String {
    let b = N * K * L;
    let params = vec![
        format!("x: {}", ty(&[b, H])),
        format!("y: {}", ty(&[b, H + P])),
    ];
    let body = match program {
        Program::PadColumns => vec![
            format!(
                "xp: {} = torch.ops.aten.constant_pad_nd.default(x, [0, {P}], 0.0)",
                ty(&[b, H + P])
            ),
            format!("m: {} = torch.ops.aten.mul.Tensor(xp, y)", ty(&[b, H + P])),
            format!("out: {} = torch.ops.aten.sum.default(m)", ty(&[])),
        ],
        Program::PadRowsInPlace => vec![format!(
            "out: {} = torch.ops.aten.clone.default(x)",
            ty(&[b, H])
        )],
    };
    common::hand::graph_module(&params, &body)
}

/// Rows `c * len .. (c + 1) * len` of a 2-d tensor.
fn rows_of(t: &Tensor, c: usize, len: usize) -> Tensor {
    let w = t.meta.shape[1];
    Tensor::new(
        Meta::new(DType::F64, vec![len, w]),
        t.data[c * len * w..(c + 1) * len * w].to_vec(),
    )
}

/// The verdict, whether the ranks' outputs summed over dp are the spec's, and the report.
fn run(program: Program) -> (Verdict, bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec_graph(program)).unwrap();
    let names: Vec<String> = (0..N).map(|r| format!("r{r}.py")).collect();
    for (r, name) in names.iter().enumerate() {
        std::fs::write(dir.path().join(name), rank_graph(program, r)).unwrap();
    }
    let yaml = format!(
        "version: 1\nname: pad-rows\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: {N} }}\n  graphs: [{}]\n  groups:\n    \"dp\": dp\ninputs:\n  x: Shard(0)\n  y: Shard(0)\noutputs:\n  out: Partial(sum)\n",
        names.join(", ")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .unwrap_or_else(|e| panic!("{program:?}: {e}"));
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let at = |g: &shardproof_ir::Graph, name: &str| {
        ValueId::new(g.nodes.iter().position(|n| n.name == name).unwrap(), 0)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let x = random(&[N * K * L, H], &mut rng);
    let y = random(&[N * K * L, H + P], &mut rng);
    let leaves = BTreeMap::from([("x".to_string(), x.clone()), ("y".to_string(), y.clone())]);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec, "out")).map(|t| t.data.to_vec()));
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..N)
        .map(|r| {
            BTreeMap::from([
                ("x".to_string(), rows_of(&x, r, K * L)),
                ("y".to_string(), rows_of(&y, r, K * L)),
            ])
        })
        .collect();
    let envs = run_program(&case.program, &per_rank, &RunConfig::default()).expect("the ranks run");
    let mut got: Vec<f64> = Vec::new();
    for (r, env) in envs.iter().enumerate() {
        let o = &env.get(at(&case.program.ranks[r], "out")).unwrap().data;
        if got.is_empty() {
            got = vec![0.0; o.len()];
        }
        got.iter_mut().zip(o.iter()).for_each(|(a, v)| *a += v);
    }
    let right = want.is_some_and(|w| close(&got, &w));
    (report.verdict, right, report.render())
}

#[test]
fn a_pad_of_the_columns_of_a_microbatch_holds() {
    let (verdict, right, report) = run(Program::PadColumns);
    assert!(right, "the correct program is wrong: {report}");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn a_pad_of_the_rows_into_place_never_holds() {
    let (verdict, right, report) = run(Program::PadRowsInPlace);
    eprintln!("{verdict:?}\n{report}");
    assert!(!right, "not wrong when run: {report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}
