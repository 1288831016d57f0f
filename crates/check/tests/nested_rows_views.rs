//! Views of plain shards that several mesh dims nest on one dim (issue 44: DeepSeek's labels
//! `{ dp: Shard(0), ep: Shard(0) }`, a microbatch of them flattened `[1, s] -> [s]`): read as
//! one shard in any nesting order (`rules::views::nested_group_view`). Each program pairs two
//! tensors element by element after such views and sums; the interpreter says whether the
//! ranks' sums add up to the spec's, and the checker must hold the right programs only.
//!
//! Mesh `dp: 2, ep: 2`; rank `dp * 2 + ep` holds piece `dp * 2 + ep` of a dim both shard (the
//! case format's order: the earlier mesh dim major).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, random, ty};

/// Coordinates of dp and of ep.
const N: usize = 2;
/// Microbatches (rows of a rank's shard).
const K: usize = 2;
/// Columns of a row.
const S: usize = 3;

/// What a program does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Program {
    /// Per microbatch: the row of `x` and of `y`, each flattened `[1, S] -> [S]`, multiplied and
    /// summed (right).
    Microbatches,
    /// As `Microbatches`, `x`'s row of the other microbatch (a pairing of other rows).
    OtherMicrobatch,
    /// `x` `[2, 4S]` sharded on dim 1 (its rows' columns), flattened `[2, S] -> [2S]` (the shard
    /// merged with the dim outside it: two blocks) and multiplied with `y` `[8S]` sharded on
    /// dim 0 (contiguous pieces): the rank pairs other elements than the spec does.
    MergedOutside,
}

/// A global input: its name, global shape and the dim both mesh dims shard.
struct Input {
    name: &'static str,
    shape: Vec<usize>,
    dim: usize,
}

fn inputs(program: Program) -> Vec<Input> {
    match program {
        Program::Microbatches | Program::OtherMicrobatch => vec![
            Input {
                name: "x",
                shape: vec![N * N * K, S],
                dim: 0,
            },
            Input {
                name: "y",
                shape: vec![N * N * K, S],
                dim: 0,
            },
        ],
        Program::MergedOutside => vec![
            Input {
                name: "x",
                shape: vec![2, N * N * S],
                dim: 1,
            },
            Input {
                name: "y",
                shape: vec![2 * N * N * S],
                dim: 0,
            },
        ],
    }
}

/// The local shape of `input` (its dim divided by the N * N pieces).
fn local(input: &Input) -> Vec<usize> {
    let mut s = input.shape.clone();
    s[input.dim] /= N * N;
    s
}

fn rank_graph(program: Program) -> String {
    let ins = inputs(program);
    let params: Vec<String> = ins
        .iter()
        .map(|i| format!("{}: {}", i.name, ty(&local(i))))
        .collect();
    let mut body = Vec::new();
    match program {
        Program::Microbatches | Program::OtherMicrobatch => {
            for k in 0..K {
                let kx = if program == Program::OtherMicrobatch {
                    K - 1 - k
                } else {
                    k
                };
                for (v, at) in [("x", kx), ("y", k)] {
                    body.push(format!(
                        "{v}s{k}: {} = torch.ops.aten.slice.Tensor({v}, 0, {at}, {})",
                        ty(&[1, S]),
                        at + 1
                    ));
                    body.push(format!(
                        "{v}v{k}: {} = torch.ops.aten.view.default({v}s{k}, [{S}])",
                        ty(&[S])
                    ));
                }
                body.push(format!(
                    "m{k}: {} = torch.ops.aten.mul.Tensor(xv{k}, yv{k})",
                    ty(&[S])
                ));
                body.push(format!(
                    "o{k}: {} = torch.ops.aten.sum.default(m{k})",
                    ty(&[])
                ));
            }
            body.push(format!(
                "out: {} = torch.ops.aten.add.Tensor(o0, o1)",
                ty(&[])
            ));
        }
        Program::MergedOutside => {
            body.push(format!(
                "xv: {} = torch.ops.aten.view.default(x, [{}])",
                ty(&[2 * S]),
                2 * S
            ));
            body.push(format!(
                "m: {} = torch.ops.aten.mul.Tensor(xv, y)",
                ty(&[2 * S])
            ));
            body.push(format!("out: {} = torch.ops.aten.sum.default(m)", ty(&[])));
        }
    }
    common::hand::graph_module(&params, &body)
}

/// The spec: both inputs flattened, multiplied, summed; for `MergedOutside`, `y` viewed as
/// `x` (so that no spec view of `x` settles the rank's).
fn spec_graph(program: Program) -> String {
    let ins = inputs(program);
    let params: Vec<String> = ins
        .iter()
        .map(|i| format!("{}: {}", i.name, ty(&i.shape)))
        .collect();
    let all: usize = ins[0].shape.iter().product();
    if program == Program::MergedOutside {
        let xs = &ins[0].shape;
        let body = vec![
            format!("yv: {} = torch.ops.aten.view.default(y, {xs:?})", ty(xs)),
            format!("m: {} = torch.ops.aten.mul.Tensor(x, yv)", ty(xs)),
            format!("out: {} = torch.ops.aten.sum.default(m)", ty(&[])),
        ];
        return common::hand::graph_module(&params, &body);
    }
    let body = vec![
        format!(
            "xv: {} = torch.ops.aten.view.default(x, [{all}])",
            ty(&[all])
        ),
        format!(
            "yv: {} = torch.ops.aten.view.default(y, [{all}])",
            ty(&[all])
        ),
        format!("m: {} = torch.ops.aten.mul.Tensor(xv, yv)", ty(&[all])),
        format!("out: {} = torch.ops.aten.sum.default(m)", ty(&[])),
    ];
    common::hand::graph_module(&params, &body)
}

/// Piece `c` of `n` along `dim` of a row-major tensor.
fn piece(t: &Tensor, dim: usize, c: usize, n: usize) -> Tensor {
    let shape = &t.meta.shape;
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let len = shape[dim] / n;
    let mut data = Vec::new();
    for o in 0..outer {
        let at = (o * shape[dim] + c * len) * inner;
        data.extend_from_slice(&t.data[at..at + len * inner]);
    }
    let mut s = shape.clone();
    s[dim] = len;
    Tensor::new(Meta::new(DType::F64, s), data)
}

/// What the checker and the interpreter say of one program.
struct Ran {
    verdict: Verdict,
    /// Whether the ranks' outputs sum to the spec's.
    right: bool,
    report: String,
}

fn run(program: Program) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec_graph(program)).unwrap();
    std::fs::write(dir.path().join("r0.py"), rank_graph(program)).unwrap();
    let ins = inputs(program);
    let declared: String = ins
        .iter()
        .map(|i| {
            format!(
                "  {}: {{ dp: Shard({d}), ep: Shard({d}) }}\n",
                i.name,
                d = i.dim
            )
        })
        .collect();
    let yaml = format!(
        "version: 1\nname: nested-rows-views\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: {N}, ep: {N} }}\n  graphs: [r0.py, r0.py, r0.py, r0.py]\n  groups:\n    \"dp\": dp\n    \"ep\": ep\ninputs:\n{declared}outputs:\n  out: {{ dp: Partial(sum), ep: Partial(sum) }}\n"
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .unwrap_or_else(|e| panic!("{program:?}: {e}"));
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let at = |g: &shardproof_ir::Graph, name: &str| {
        ValueId::new(g.nodes.iter().position(|n| n.name == name).unwrap(), 0)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    let globals: Vec<Tensor> = ins.iter().map(|i| random(&i.shape, &mut rng)).collect();
    let leaves: BTreeMap<String, Tensor> = ins
        .iter()
        .zip(&globals)
        .map(|(i, t)| (i.name.to_string(), t.clone()))
        .collect();
    let want = run_graph(&case.spec, &leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec, "out")).map(|t| t.data.to_vec()));
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..N * N)
        .map(|q| {
            ins.iter()
                .zip(&globals)
                .map(|(i, t)| (i.name.to_string(), piece(t, i.dim, q, N * N)))
                .collect()
        })
        .collect();
    let envs = run_program(&case.program, &per_rank, &RunConfig::default()).expect("the ranks run");
    let got: f64 = envs
        .iter()
        .enumerate()
        .map(|(q, env)| env.get(at(&case.program.ranks[q], "out")).unwrap().data[0])
        .sum();
    Ran {
        verdict: report.verdict,
        right: want.is_some_and(|w| close(&[got], &w)),
        report: report.render(),
    }
}

#[test]
fn a_microbatch_flattened_on_two_nested_mesh_dims_holds() {
    let ran = run(Program::Microbatches);
    let what = format!("{:?}\n{}", ran.verdict, ran.report);
    assert!(ran.right, "the correct program is wrong: {what}");
    assert_eq!(ran.verdict, Verdict::Holds, "{what}");
}

/// Asserts the interpreter shows the program wrong and the checker does not hold.
fn never_holds(program: Program) {
    let ran = run(program);
    let what = format!("{program:?}: {:?}\n{}", ran.verdict, ran.report);
    eprintln!("{what}");
    assert!(!ran.right, "not wrong when run: {what}");
    assert_ne!(ran.verdict, Verdict::Holds, "{what}");
}

#[test]
fn rows_of_another_microbatch_never_hold() {
    never_holds(Program::OtherMicrobatch);
}

#[test]
fn a_nested_shard_merged_with_a_dim_outside_it_never_holds() {
    never_holds(Program::MergedOutside);
}
