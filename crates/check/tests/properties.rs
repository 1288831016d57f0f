//! Placement rules agree with the interpreter: for one-operator programs with random shapes and
//! random input placements on a 1-d mesh, random rank inputs are laid out per the placements
//! (a `Replicate()` input is the same tensor on every rank, a `Shard(d)` input's spec value is
//! the ranks' values concatenated along d, a `Partial()` input's spec value is their sum), the
//! spec and every rank run in the reference interpreter (`shardproof_interp::run_graph`), and
//! the output placement the checker infers must hold of the values: `Shard(d)` (and blocked
//! shards) concatenate to the spec value, `Partial(sum)` sums to it, `Replicate()` is the spec
//! value on every rank. Where the checker reports a violation (other than the postcondition
//! this harness does not declare) or infers `Varying`, it claims nothing and the case is only
//! counted.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Red};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{assemble, close, random, Make};

#[derive(Clone, Copy, Debug)]
enum In {
    R,
    S(usize),
    P,
}

/// The call text and output shape of an operator for given input shapes.
type Call = fn(&[Vec<usize>]) -> Option<(String, Vec<usize>)>;

/// A drawn case: operator, mesh, sizes, placements per input and mesh dim, seed.
type Drawn = (usize, Vec<usize>, Vec<usize>, Vec<Vec<In>>, u64);

/// One operator: its input ranks (number of dims) and the call, given the input names and
/// their local and global shapes; `None` when the shapes do not fit it.
struct Op {
    name: &'static str,
    inputs: usize,
    rank: usize,
    call: Call,
}

fn same(s: &[Vec<usize>]) -> bool {
    s.windows(2).all(|w| w[0] == w[1])
}

/// The broadcast of two shapes of one rank, when they broadcast (a size-1 dim meets any).
fn bcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    (a.len() == b.len())
        .then(|| {
            a.iter()
                .zip(b)
                .map(|(&x, &y)| match (x, y) {
                    _ if x == y => Some(x),
                    (1, y) => Some(y),
                    (x, 1) => Some(x),
                    _ => None,
                })
                .collect()
        })
        .flatten()
}

const OPS: &[Op] = &[
    Op {
        name: "add",
        inputs: 2,
        rank: 2,
        call: |s| same(s).then(|| ("torch.ops.aten.add.Tensor(x0, x1)".into(), s[0].clone())),
    },
    // Broadcasts: the second operand of size 1 along a dim (drawn so below), or the first.
    // A replicated operand of the piece's size along a shard has no spec (its global shape
    // does not broadcast), so such draws are skipped; the claims on the others are checked.
    Op {
        name: "add_bcast_row",
        inputs: 2,
        rank: 2,
        call: |s| bcast(&s[0], &s[1]).map(|o| ("torch.ops.aten.add.Tensor(x0, x1)".into(), o)),
    },
    Op {
        name: "mul_bcast_col",
        inputs: 2,
        rank: 2,
        call: |s| bcast(&s[0], &s[1]).map(|o| ("torch.ops.aten.mul.Tensor(x0, x1)".into(), o)),
    },
    Op {
        name: "sub_bcast_left",
        inputs: 2,
        rank: 2,
        call: |s| bcast(&s[0], &s[1]).map(|o| ("torch.ops.aten.sub.Tensor(x0, x1)".into(), o)),
    },
    Op {
        name: "addcmul_bcast_row",
        inputs: 2,
        rank: 2,
        call: |s| {
            bcast(&s[0], &s[1]).map(|o| ("torch.ops.aten.addcmul.default(x0, x1, x1)".into(), o))
        },
    },
    Op {
        name: "mul",
        inputs: 2,
        rank: 2,
        call: |s| same(s).then(|| ("torch.ops.aten.mul.Tensor(x0, x1)".into(), s[0].clone())),
    },
    Op {
        name: "sub",
        inputs: 2,
        rank: 2,
        call: |s| same(s).then(|| ("torch.ops.aten.sub.Tensor(x0, x1)".into(), s[0].clone())),
    },
    Op {
        name: "neg",
        inputs: 1,
        rank: 2,
        call: |s| Some(("torch.ops.aten.neg.default(x0)".into(), s[0].clone())),
    },
    Op {
        name: "relu",
        inputs: 1,
        rank: 2,
        call: |s| Some(("torch.ops.aten.relu.default(x0)".into(), s[0].clone())),
    },
    Op {
        name: "mm",
        inputs: 2,
        rank: 2,
        call: |s| {
            (s[0][1] == s[1][0]).then(|| {
                (
                    "torch.ops.aten.mm.default(x0, x1)".into(),
                    vec![s[0][0], s[1][1]],
                )
            })
        },
    },
    Op {
        name: "t",
        inputs: 1,
        rank: 2,
        call: |s| {
            Some((
                "torch.ops.aten.t.default(x0)".into(),
                vec![s[0][1], s[0][0]],
            ))
        },
    },
    Op {
        name: "sum0",
        inputs: 1,
        rank: 2,
        call: |s| {
            Some((
                "torch.ops.aten.sum.dim_IntList(x0, [0])".into(),
                vec![s[0][1]],
            ))
        },
    },
    Op {
        name: "sum1",
        inputs: 1,
        rank: 2,
        call: |s| {
            Some((
                "torch.ops.aten.sum.dim_IntList(x0, [1])".into(),
                vec![s[0][0]],
            ))
        },
    },
    Op {
        name: "permute",
        inputs: 1,
        rank: 3,
        call: |s| {
            Some((
                "torch.ops.aten.permute.default(x0, [2, 0, 1])".into(),
                vec![s[0][2], s[0][0], s[0][1]],
            ))
        },
    },
    Op {
        name: "merge01",
        inputs: 1,
        rank: 3,
        call: |s| {
            let o = vec![s[0][0] * s[0][1], s[0][2]];
            Some((format!("torch.ops.aten.view.default(x0, {o:?})"), o))
        },
    },
    Op {
        name: "merge12",
        inputs: 1,
        rank: 3,
        call: |s| {
            let o = vec![s[0][0], s[0][1] * s[0][2]];
            Some((format!("torch.ops.aten.view.default(x0, {o:?})"), o))
        },
    },
    Op {
        name: "softmax0",
        inputs: 1,
        rank: 2,
        call: |s| {
            Some((
                "torch.ops.aten._softmax.default(x0, 0, False)".into(),
                s[0].clone(),
            ))
        },
    },
    Op {
        name: "softmax1",
        inputs: 1,
        rank: 2,
        call: |s| {
            Some((
                "torch.ops.aten._softmax.default(x0, 1, False)".into(),
                s[0].clone(),
            ))
        },
    },
    Op {
        name: "gelu",
        inputs: 1,
        rank: 2,
        call: |s| Some(("torch.ops.aten.gelu.default(x0)".into(), s[0].clone())),
    },
    Op {
        name: "div",
        inputs: 2,
        rank: 2,
        call: |s| same(s).then(|| ("torch.ops.aten.div.Tensor(x0, x1)".into(), s[0].clone())),
    },
    Op {
        name: "mean1",
        inputs: 1,
        rank: 2,
        call: |s| Some(("torch.ops.aten.mean.dim(x0, [1])".into(), vec![s[0][0]])),
    },
    Op {
        name: "amax1",
        inputs: 1,
        rank: 2,
        call: |s| Some(("torch.ops.aten.amax.default(x0, [1])".into(), vec![s[0][0]])),
    },
    Op {
        name: "unsqueeze1",
        inputs: 1,
        rank: 2,
        call: |s| {
            Some((
                "torch.ops.aten.unsqueeze.default(x0, 1)".into(),
                vec![s[0][0], 1, s[0][1]],
            ))
        },
    },
    Op {
        name: "view_insert1",
        inputs: 1,
        rank: 2,
        call: |s| {
            let o = vec![s[0][0], 1, s[0][1]];
            Some((format!("torch.ops.aten.view.default(x0, {o:?})"), o))
        },
    },
    Op {
        name: "transpose12",
        inputs: 1,
        rank: 3,
        call: |s| {
            Some((
                "torch.ops.aten.transpose.int(x0, 1, 2)".into(),
                vec![s[0][0], s[0][2], s[0][1]],
            ))
        },
    },
    Op {
        name: "cat0",
        inputs: 2,
        rank: 2,
        call: |s| {
            same(s).then(|| {
                (
                    "torch.ops.aten.cat.default([x0, x1], 0)".into(),
                    vec![2 * s[0][0], s[0][1]],
                )
            })
        },
    },
    Op {
        name: "cat1",
        inputs: 2,
        rank: 2,
        call: |s| {
            same(s).then(|| {
                (
                    "torch.ops.aten.cat.default([x0, x1], 1)".into(),
                    vec![s[0][0], 2 * s[0][1]],
                )
            })
        },
    },
    Op {
        name: "bmm",
        inputs: 2,
        rank: 3,
        call: |s| {
            (s[0][0] == s[1][0] && s[0][2] == s[1][1]).then(|| {
                (
                    "torch.ops.aten.bmm.default(x0, x1)".into(),
                    vec![s[0][0], s[0][1], s[1][2]],
                )
            })
        },
    },
];

fn fx(shapes: &[Vec<usize>], call: &str, out: &[usize]) -> String {
    let params: Vec<String> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| format!("x{i}: \"f64{s:?}\""))
        .collect();
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, {}):\n        out: \"f64{out:?}\" = {call}\n        return (out,)\n",
        params.join(", ")
    )
}

const NAMES: [&str; 2] = ["dp", "tp"];

/// Runs one instance on a mesh of `mesh` sizes (names dp, tp; a 1-d mesh is tp); `ins[i][m]`
/// is input i's placement on mesh dim m. Returns whether the checker made a claim (it held).
fn instance(
    op: &Op,
    mesh: &[usize],
    local: Vec<Vec<usize>>,
    ins: Vec<Vec<In>>,
    seed: u64,
) -> Result<bool, TestCaseError> {
    let names: &[&str] = if mesh.len() == 1 {
        &NAMES[1..]
    } else {
        &NAMES[..]
    };
    let nranks: usize = mesh.iter().product();
    let Some((call, out_local)) = (op.call)(&local) else {
        return Ok(false);
    };
    let global: Vec<Vec<usize>> = local
        .iter()
        .zip(&ins)
        .map(|(s, ps)| {
            let mut g = s.clone();
            for (m, p) in ps.iter().enumerate() {
                if let In::S(d) = p {
                    g[*d] *= mesh[m];
                }
            }
            g
        })
        .collect();
    let Some((spec_call, out_global)) = (op.call)(&global) else {
        return Ok(false);
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spec.py"),
        fx(&global, &spec_call, &out_global),
    )
    .unwrap();
    let mut graphs = Vec::new();
    for r in 0..nranks {
        std::fs::write(
            dir.path().join(format!("r{r}.py")),
            fx(&local, &call, &out_local),
        )
        .unwrap();
        graphs.push(format!("r{r}.py"));
    }
    let inputs: Vec<String> = ins
        .iter()
        .enumerate()
        .map(|(i, ps)| {
            let per: Vec<String> = ps
                .iter()
                .enumerate()
                .map(|(m, p)| {
                    let p = match p {
                        In::R => "Replicate()".to_string(),
                        In::S(d) => format!("Shard({d})"),
                        In::P => "Partial()".to_string(),
                    };
                    format!("{}: {p}", names[m])
                })
                .collect();
            format!("  x{i}: {{ {} }}", per.join(", "))
        })
        .collect();
    let mesh_yaml: Vec<String> = mesh
        .iter()
        .enumerate()
        .map(|(m, n)| format!("{}: {n}", names[m]))
        .collect();
    let yaml = format!(
        "version: 1\nname: prop\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ {} }}\n  graphs: [{}]\ninputs:\n{}\noutputs: {{}}\n",
        mesh_yaml.join(", "),
        graphs.join(", "),
        inputs.join("\n")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .map_err(|e| TestCaseError::fail(format!("{}: {e}", op.name)))?;
    let report = check_case(&case).map_err(|e| TestCaseError::fail(format!("{}: {e}", op.name)))?;
    // (No output is declared: the postcondition's report of an undeclared partial output is
    // no rule's violation.)
    if report
        .findings
        .iter()
        .any(|f| f.check.name() != "postcondition")
    {
        return Ok(false);
    }
    let prop = propagate(&case).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    // Rank inputs per placement (equal where replicated), and the spec inputs they lay out.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let coords = |r: usize| -> Vec<usize> {
        let mut c = vec![0; mesh.len()];
        let mut x = r;
        for m in (0..mesh.len()).rev() {
            c[m] = x % mesh[m];
            x /= mesh[m];
        }
        c
    };
    let mut rank_leaves = vec![BTreeMap::new(); nranks];
    let mut spec_leaves = BTreeMap::new();
    for (i, ps) in ins.iter().enumerate() {
        let name = format!("x{i}");
        let mut drawn: BTreeMap<Vec<usize>, Tensor> = BTreeMap::new();
        let mut data = Vec::new();
        for (r, leaves) in rank_leaves.iter_mut().enumerate() {
            let key: Vec<usize> = coords(r)
                .iter()
                .zip(ps)
                .map(|(&c, p)| if matches!(p, In::R) { 0 } else { c })
                .collect();
            let t = drawn
                .entry(key)
                .or_insert_with(|| random(&local[i], &mut rng))
                .clone();
            data.push(t.data.to_vec());
            leaves.insert(name.clone(), t);
        }
        let makes: Vec<Make> = ps
            .iter()
            .map(|p| match p {
                In::R => Make::Same,
                In::S(d) => Make::Cat(*d, 1),
                In::P => Make::Sum,
            })
            .collect();
        let (spec, shape) =
            assemble(&data, &local[i], mesh, &makes).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&shape, &global[i]);
        spec_leaves.insert(name, Tensor::new(Meta::new(DType::F64, shape), spec));
    }
    let cfg = RunConfig::default();
    let out_of = |g: &shardproof_ir::Graph, env: &shardproof_interp::Env| -> Vec<f64> {
        let i = g.nodes.iter().position(|nd| nd.name == "out").unwrap();
        env.get(ValueId::new(i, 0)).unwrap().data.to_vec()
    };
    let spec_env = run_graph(&case.spec, &spec_leaves, &cfg).unwrap();
    let want = out_of(&case.spec, &spec_env);
    let got: Vec<Vec<f64>> = (0..nranks)
        .map(|r| {
            let g = &case.program.ranks[r];
            out_of(g, &run_graph(g, &rank_leaves[r], &cfg).unwrap())
        })
        .collect();
    let oi = case.program.ranks[0]
        .nodes
        .iter()
        .position(|nd| nd.name == "out")
        .unwrap();
    let places: Vec<Place> = prop.ranks[0].of(ValueId::new(oi, 0), mesh.len()).to_vec();
    for r in 1..nranks {
        prop_assert_eq!(
            prop.ranks[r].of(ValueId::new(oi, 0), mesh.len()),
            &places[..],
            "{}: ranks disagree",
            op.name
        );
    }
    let what = format!(
        "{} {:?} local {:?} on {:?} -> {:?}",
        op.name, ins, local, mesh, places
    );
    let mut makes = Vec::new();
    for p in &places {
        makes.push(match p {
            Place::Replicate => Make::Same,
            Place::Partial(Red::Sum) => Make::Sum,
            Place::Shard(_) | Place::Blocked(..) => {
                let (d, k) = p.blocks().unwrap();
                Make::Cat(d, k)
            }
            _ => return Ok(false),
        });
    }
    let assembled = assemble(&got, &out_local, mesh, &makes);
    prop_assert!(assembled.is_ok(), "{what}: {:?}", assembled.err());
    let (value, shape) = assembled.unwrap();
    prop_assert_eq!(&shape, &out_global, "{}: assembled shape", what);
    prop_assert!(
        close(&value, &want),
        "{what}: the ranks' values do not make up the spec value"
    );
    Ok(true)
}

fn placement(rank: usize) -> impl Strategy<Value = In> {
    prop_oneof![Just(In::R), (0..rank).prop_map(In::S), Just(In::P)]
}

fn case_strategy() -> impl Strategy<Value = Drawn> {
    (
        0..OPS.len(),
        prop_oneof![
            Just(vec![2usize]),
            Just(vec![3usize]),
            Just(vec![2usize, 2])
        ],
        proptest::collection::vec(1usize..=3, 6),
        proptest::collection::vec(proptest::collection::vec(placement(3), 2), 2),
        any::<u64>(),
    )
        .prop_map(|(op, mesh, sizes, ins, seed)| {
            let nd = mesh.len();
            let ins = ins
                .into_iter()
                .map(|ps| ps.into_iter().take(nd).collect())
                .collect();
            (op, mesh, sizes, ins, seed)
        })
}

proptest! {
    // A fixed seed: the same 400 cases on every run. (Random seeds once drew the case of
    // `a_replicated_operand_meeting_a_shard_of_another_mesh_dim_claims_no_shard`; 6,000 random
    // cases pass since it was fixed.)
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0044),
        ..ProptestConfig::default()
    })]

    #[test]
    fn placement_rules_agree_with_the_interpreter((op, mesh, sizes, ins, seed) in case_strategy()) {
        let op = &OPS[op];
        let ins: Vec<Vec<In>> = ins.into_iter().take(op.inputs).map(|ps: Vec<In>| ps.into_iter().map(|p| match p {
            In::S(d) if d >= op.rank => In::S(d % op.rank),
            p => p,
        }).collect()).collect();
        // Shapes that fit the operator: the second input's from the first where they must agree.
        let a: Vec<usize> = sizes[..op.rank].to_vec();
        let b: Vec<usize> = match op.name {
            "mm" => vec![a[1], sizes[3]],
            "bmm" => vec![a[0], a[2], sizes[3]],
            "add_bcast_row" | "addcmul_bcast_row" => vec![1, a[1]],
            "mul_bcast_col" => vec![a[0], 1],
            _ => a.clone(),
        };
        let local = match op.name {
            "sub_bcast_left" => vec![vec![1, a[1]], a],
            _ if op.inputs == 2 => vec![a, b],
            _ => vec![a],
        };
        instance(op, &mesh, local, ins, seed)?;
    }
}

/// Every operator of the table above makes claims the interpreter confirms, on fixed inputs
/// chosen to reach its interesting rules (a shard that moves, a contraction, a merge).
#[test]
fn each_operator_makes_a_checked_claim() {
    for op in OPS {
        let mut claimed = false;
        for d in 0..op.rank {
            let local: Vec<Vec<usize>> = match op.name {
                "mm" => vec![vec![2, 3], vec![3, 2]],
                "bmm" => vec![vec![2, 2, 3], vec![2, 3, 2]],
                _ if op.rank == 3 => vec![vec![2, 3, 2]; op.inputs],
                _ => vec![vec![2, 3]; op.inputs],
            };
            let ins = (0..op.inputs).map(|_| vec![In::S(d)]).collect();
            claimed |= instance(op, &[2], local.clone(), ins, d as u64).unwrap();
            let ins = std::iter::once(vec![In::S(d)])
                .chain((1..op.inputs).map(|_| vec![In::R]))
                .collect();
            claimed |= instance(op, &[2], local.clone(), ins, 7).unwrap();
            // 2-d: sharded over dp on dim d, replicated over tp.
            let ins = (0..op.inputs).map(|_| vec![In::S(d), In::R]).collect();
            claimed |= instance(op, &[2, 2], local, ins, 11).unwrap();
        }
        assert!(claimed, "{}: no placement claim was checked", op.name);
    }
    // A contraction over a sharded dim is a partial sum; a merged sharded dim is blocked.
    let op = OPS.iter().find(|o| o.name == "mm").unwrap();
    let ins = vec![vec![In::S(1)], vec![In::S(0)]];
    assert!(instance(op, &[2], vec![vec![2, 3], vec![3, 2]], ins, 3).unwrap());
    let ins = vec![vec![In::R, In::S(1)], vec![In::R, In::S(0)]];
    assert!(instance(op, &[2, 2], vec![vec![2, 3], vec![3, 2]], ins, 4).unwrap());
    let op = OPS.iter().find(|o| o.name == "merge01").unwrap();
    assert!(instance(op, &[2], vec![vec![2, 3, 2]], vec![vec![In::S(1)]], 5).unwrap());
}

/// A replicated operand of size 1 along the shard's dim broadcasts (from the right or the
/// left, in a ternary too): the shard is claimed, and the interpreter confirms it.
#[test]
fn a_broadcast_replicated_operand_keeps_the_shard() {
    type Case = (&'static str, Vec<Vec<usize>>, Vec<Vec<In>>);
    let cases: [Case; 4] = [
        (
            "add_bcast_row",
            vec![vec![2, 3], vec![1, 3]],
            vec![vec![In::S(0)], vec![In::R]],
        ),
        (
            "mul_bcast_col",
            vec![vec![2, 3], vec![2, 1]],
            vec![vec![In::S(1)], vec![In::R]],
        ),
        (
            "sub_bcast_left",
            vec![vec![1, 3], vec![2, 3]],
            vec![vec![In::R], vec![In::S(0)]],
        ),
        (
            "addcmul_bcast_row",
            vec![vec![2, 3], vec![1, 3]],
            vec![vec![In::S(0)], vec![In::R]],
        ),
    ];
    for (name, local, ins) in cases {
        let op = OPS.iter().find(|o| o.name == name).unwrap();
        assert!(instance(op, &[2], local, ins, 9).unwrap(), "{name}");
    }
}

/// Element-wise operands sharded on the same tensor dim over different mesh dims, each
/// replicated over the other's (`x0 {dp: R, tp: Shard(1)}` plus `x1 {dp: Shard(1), tp: R}`,
/// local `[1, 1]`): each mesh dim's merge alone reads a shard, where rank (i, j) adds x0's piece
/// j to x1's piece i. Found by the property test on another seed; the checker must claim no
/// shard (and report the pairing).
#[test]
fn a_replicated_operand_meeting_a_shard_of_another_mesh_dim_claims_no_shard() {
    let op = OPS.iter().find(|o| o.name == "add").unwrap();
    let ins = vec![vec![In::R, In::S(1)], vec![In::S(1), In::R]];
    let claimed = instance(op, &[2, 2], vec![vec![1, 1], vec![1, 1]], ins, 1).unwrap();
    assert!(
        !claimed,
        "the mixed pairing must be a finding, not a placement claim"
    );
    // The same dim sharded over the same mesh dims on both operands is a shard.
    let ins = vec![vec![In::R, In::S(1)], vec![In::R, In::S(1)]];
    assert!(instance(op, &[2, 2], vec![vec![1, 2], vec![1, 2]], ins, 2).unwrap());
}
