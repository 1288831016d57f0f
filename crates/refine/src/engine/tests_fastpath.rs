//! The fast path's rules against the interpreter (each derived relation, evaluated on the
//! ranks' values of random inputs, equals the spec's value), its preconditions (each a case
//! where the rule would derive a false or a differently written relation, and must decline),
//! and its audit against the e-graph on whole plans.

use super::fastpath::decide;
use super::inputs::input_state;
use super::relation::{Impl, Rel, State};
use super::tests::{impl_of, with_ctx};
use super::{verify, Options, Verdict};
use crate::eval::{eval, random_tensor, seeded_values, tensors_agree};
use crate::lower::{lower, Lowered};
use crate::term::parse_leaf;
use shardproof_case::Case;
use shardproof_interp::{infer_graph, run_graph};
use shardproof_ir::{NodeKind, ValueId};
use shardproof_ops::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A graph over inputs `x` and `y` computing `z = OP(args)` and then `out = tanh(z)` (so that
/// `z` is no checked output); `shape` is `X[ | Y[ | Z]]`, `Y` and `Z` by default `X`.
pub(super) fn graph(shape: &str, call: &str) -> String {
    let parts: Vec<&str> = shape.split(" | ").collect();
    let (x, y, z) = (
        parts[0],
        parts.get(1).unwrap_or(&parts[0]),
        parts.get(2).unwrap_or(&parts[0]),
    );
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{x}]\", y: \"f32[{y}]\"):\n        z: \"f32[{z}]\" = torch.ops.{call}\n        out: \"f32[{z}]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n"
    )
}

/// A case of `ranks` rank graphs under `mesh`, inputs and output laid out by `layout` (YAML
/// for each of `x`, `y`, `out`); the spec computes `call` at `spec_shape`, the ranks `rank_call`
/// at `rank_shape`.
pub(super) struct Plan<'a> {
    pub(super) mesh: &'a str,
    pub(super) ranks: usize,
    pub(super) layout: [&'a str; 3],
    pub(super) spec: (&'a str, &'a str),
    pub(super) rank: (&'a str, &'a str),
}

pub(super) fn write_case(dir: &Path, p: &Plan) -> Case {
    std::fs::write(dir.join("spec.py"), graph(p.spec.0, p.spec.1)).unwrap();
    let mut graphs = Vec::new();
    for r in 0..p.ranks {
        std::fs::write(dir.join(format!("r{r}.py")), graph(p.rank.0, p.rank.1)).unwrap();
        graphs.push(format!("r{r}.py"));
    }
    let yaml = format!(
        "version: 1\nname: fastpath\nspec:\n  graph: spec.py\nimpl:\n  mesh: {}\n  graphs: [{}]\ninputs:\n  x: {}\n  y: {}\noutputs:\n  out: {}\n",
        p.mesh,
        graphs.join(", "),
        p.layout[0],
        p.layout[1],
        p.layout[2]
    );
    std::fs::write(dir.join("case.yaml"), yaml).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The relations of the case's inputs, as the walk starts from them.
pub(super) fn input_states(case: &Case, imp: &Impl) -> HashMap<ValueId, State> {
    (0..case.inputs.len())
        .map(|i| (case.inputs[i].spec_value, input_state(case, i, imp)))
        .collect()
}

/// The spec value named `name` and its lowered term.
pub(super) fn spec_term(case: &Case, name: &str) -> (ValueId, crate::lower::Tpl) {
    let n = case.spec.nodes.iter().position(|n| n.name == name).unwrap();
    let metas = infer_graph(&case.spec, &case.ops).metas;
    let low = with_ctx(case, |ctx| lower(ctx, &case.spec, &metas, None, n, 0));
    let Lowered::Term(t) = low else {
        panic!("{name} lowers to {low:?}")
    };
    (ValueId::new(n, 0), t)
}

/// The fast path's relation of `z` in `case`, from its inputs' relations.
pub(super) fn fast_z(case: &Case) -> Option<Rel> {
    let imp = impl_of(case);
    let state = input_states(case, &imp);
    let (_, t) = spec_term(case, "z");
    decide(&imp, &state, &t)
}

/// Runs the spec and every rank on random inputs that meet the inputs' relations (each rank
/// input random, a spec input the value of its relation's first expression over them; leaves
/// a relation lists as replicas take one value), and checks that every expression of `rel`,
/// and every group of equal leaves, evaluates to the spec's `z`. `Err` names what differs.
pub(super) fn holds(case: &Case, rel: &Rel, seed: f64) -> Result<(), String> {
    let imp = impl_of(case);
    let state = input_states(case, &imp);
    let mut next = seeded_values(seed);
    let mut rank_inputs: Vec<BTreeMap<String, Tensor>> =
        vec![BTreeMap::new(); case.program.ranks.len()];
    let mut leaves: HashMap<String, Tensor> = HashMap::new();
    let mut spec_inputs = BTreeMap::new();
    for input in &case.inputs {
        let Some(State::Related(r)) = state.get(&input.spec_value) else {
            return Err("an input without relation".into());
        };
        // Replicas (alternative expressions that are single leaves) share one value.
        let mut shared: Option<Tensor> = None;
        for e in &r.exprs {
            for node in e.as_ref() {
                let crate::term::Term::Op(s, k) = node else {
                    continue;
                };
                let Some((rank, name)) = parse_leaf(s.as_str()).filter(|_| k.is_empty()) else {
                    continue;
                };
                let key = format!("r{rank}:{name}");
                if leaves.contains_key(&key) {
                    continue;
                }
                let g = &case.program.ranks[rank];
                let v = g.find(name).unwrap();
                let meta = imp
                    .meta(crate::lower::ValueRef {
                        rank: Some(rank),
                        value: v,
                    })
                    .unwrap();
                let t = if e.as_ref().len() == 1 {
                    shared
                        .get_or_insert_with(|| {
                            random_tensor(meta.dtype, meta.shape.clone(), 4, &mut next)
                        })
                        .clone()
                } else {
                    random_tensor(meta.dtype, meta.shape.clone(), 4, &mut next)
                };
                rank_inputs[rank].insert(name.to_string(), t.clone());
                leaves.insert(key, t);
            }
        }
        let value = eval(&r.exprs[0], &leaves)?;
        spec_inputs.insert(input.spec_name.clone(), value[0].clone());
    }
    let spec_env =
        run_graph(&case.spec, &spec_inputs, &Default::default()).map_err(|e| e.to_string())?;
    let (z, _) = spec_term(case, "z");
    let want = spec_env.get(z).unwrap().clone();
    for (r, g) in case.program.ranks.iter().enumerate() {
        let env = run_graph(g, &rank_inputs[r], &Default::default()).map_err(|e| e.to_string())?;
        for (n, node) in g.nodes.iter().enumerate() {
            if matches!(node.kind, NodeKind::Input) {
                continue;
            }
            for (k, o) in node.outputs.iter().enumerate() {
                if let Some(t) = env.get(ValueId::new(n, k)) {
                    leaves.insert(format!("r{r}:{}", o.name), t.clone());
                }
            }
        }
    }
    for e in &rel.exprs {
        let got = eval(e, &leaves)?;
        if !tensors_agree(&got, std::slice::from_ref(&want)) {
            return Err(format!("{e} is not the spec's z"));
        }
    }
    for group in &rel.equal_leaves {
        let key = |s: &egg::Symbol| {
            let (r, n) = parse_leaf(s.as_str()).unwrap();
            format!("r{r}:{n}")
        };
        let first = &leaves[&key(&group[0])];
        for s in group {
            if !tensors_agree(
                std::slice::from_ref(&leaves[&key(s)]),
                std::slice::from_ref(first),
            ) {
                return Err(format!("{s} differs from {}", group[0]));
            }
        }
    }
    Ok(())
}

/// The element-wise calls the property tests run, as FX call text over `x` and `y`.
const CALLS: &[&str] = &[
    "aten.add.Tensor(x, y)",
    "aten.sub.Tensor(x, y)",
    "aten.mul.Tensor(x, y)",
    "aten.div.Tensor(x, y)",
    "aten.maximum.default(x, y)",
    "aten.relu.default(x)",
    "aten.gelu.default(y)",
    "aten.exp.default(x)",
    "aten.sigmoid.default(x)",
    "aten.add.Tensor(x, x)",
    "aten.mul.Scalar(x, 3.0)",
    "aten.neg.default(y)",
];

/// Element-wise over tensors concatenated alike: the rule derives the concatenation of the
/// ranks' results, and it holds on random inputs, for every call, split dim and degree.
#[test]
fn elementwise_over_shards_derives_the_concatenation_of_the_ranks_results() {
    for (mesh, ranks, dim, spec_shape, rank_shape) in [
        ("{ tp: 2 }", 2, 0, "4, 6", "2, 6"),
        ("{ tp: 2 }", 2, 1, "4, 6", "4, 3"),
        ("{ tp: 4 }", 4, 0, "8, 3", "2, 3"),
    ] {
        for call in CALLS {
            let dir = tempfile::tempdir().unwrap();
            let shard = format!("Shard({dim})");
            let case = write_case(
                dir.path(),
                &Plan {
                    mesh,
                    ranks,
                    layout: [&shard, &shard, &shard],
                    spec: (spec_shape, call),
                    rank: (rank_shape, call),
                },
            );
            let rel = fast_z(&case).unwrap_or_else(|| panic!("{call} on {mesh}: declined"));
            let text = rel.exprs[0].to_string();
            assert!(text.starts_with(&format!("(cat {dim} ")), "{call}: {text}");
            for seed in [0.11, 0.23, 0.59] {
                holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call} on {mesh}: {e}"));
            }
        }
    }
}

/// Element-wise over replicas: every rank's result is a replica of the spec's, and they are
/// one group of equal leaves.
#[test]
fn elementwise_over_replicas_derives_every_ranks_result() {
    for call in CALLS {
        let dir = tempfile::tempdir().unwrap();
        let case = write_case(
            dir.path(),
            &Plan {
                mesh: "{ tp: 2 }",
                ranks: 2,
                layout: ["Replicate()", "Replicate()", "Replicate()"],
                spec: ("4, 6", call),
                rank: ("4, 6", call),
            },
        );
        let rel = fast_z(&case).unwrap_or_else(|| panic!("{call}: declined"));
        assert_eq!(rel.exprs.len(), 2, "{call}: {:?}", rel.exprs);
        assert_eq!(rel.equal_leaves.len(), 1, "{call}");
        for seed in [0.11, 0.23, 0.59] {
            holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call}: {e}"));
        }
    }
}

/// Precondition: the operator is in the element-wise rule table. A cumulative sum along the
/// split dim computed on each shard is no piece of the spec's (the rule would be false).
#[test]
fn an_operator_outside_the_table_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let call = "aten.cumsum.default(x, 0)";
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Shard(0)", "Shard(0)"],
            spec: ("4, 6", call),
            rank: ("2, 6", call),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// Precondition: the ranks' call has the spec's literal arguments. `x + 2y` on the ranks for
/// the spec's `x + y` is declined (the rule would be false).
#[test]
fn a_call_with_other_literals_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Shard(0)", "Shard(0)"],
            spec: ("4, 6", "aten.add.Tensor(x, y)"),
            rank: ("2, 6", "aten.add.Tensor(x, y, alpha = 2)"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// Precondition: the ranks' call reads the spec's inputs in the spec's places. `y - x` on the
/// ranks for the spec's `x - y` is declined.
#[test]
fn a_call_over_other_operands_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Replicate()", "Replicate()", "Replicate()"],
            spec: ("4, 6", "aten.sub.Tensor(x, y)"),
            rank: ("4, 6", "aten.sub.Tensor(y, x)"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// Inputs split along different dims (`x` by rows, `y` by columns) are declined: each rank
/// would pair pieces of other shapes, which broadcasting pairs wrongly.
#[test]
fn inputs_split_along_other_dims_are_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Shard(1)", "Replicate()"],
            spec: ("2, 2", "aten.add.Tensor(x, y)"),
            rank: ("1, 2 | 2, 1 | 2, 2", "aten.add.Tensor(x, y)"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// Precondition: every input's piece `i` has one shape. A vector split in two added to the
/// rows of a matrix split in two (the spec broadcasts the vector along the rows; each rank
/// adds its half of the vector to its row) is declined: the concatenation of the ranks'
/// results is not the spec's sum.
#[test]
fn pieces_of_other_shapes_are_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Shard(0)", "Shard(0)"],
            spec: ("2 | 2, 2 | 2, 2", "aten.add.Tensor(x, y)"),
            rank: ("1 | 1, 2 | 1, 2", "aten.add.Tensor(x, y)"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// The inputs relate alike (all replicas or all concatenations), or no rule applies: a row shard
/// plus a replicated row vector (broadcast) is left to the e-graph.
#[test]
fn a_shard_beside_a_replica_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Replicate()", "Shard(0)"],
            spec: ("4, 6 | 6", "aten.add.Tensor(x, y)"),
            rank: ("2, 6 | 6", "aten.add.Tensor(x, y)"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// The audit on a plan the fast path decides: the e-graph writes the same relations, the
/// verdict is the same, and the fast path decides the operator.
#[test]
fn the_audit_finds_the_e_graphs_relations_on_small_plans() {
    for (layout, spec_shape, rank_shape) in [
        ("Shard(0)", "4, 6", "2, 6"),
        ("Shard(1)", "4, 6", "4, 3"),
        ("Replicate()", "4, 6", "4, 6"),
    ] {
        for call in CALLS {
            let dir = tempfile::tempdir().unwrap();
            let case = write_case(
                dir.path(),
                &Plan {
                    mesh: "{ tp: 2 }",
                    ranks: 2,
                    layout: [layout, layout, layout],
                    spec: (spec_shape, call),
                    rank: (rank_shape, call),
                },
            );
            let audit = verify(
                &case,
                &Options {
                    audit_fast_path: true,
                    ..Options::default()
                },
            );
            assert!(
                audit.fast_path_differences.is_empty(),
                "{call} {layout}: {:#?}",
                audit.fast_path_differences
            );
            assert_eq!(audit.operators_fast, 1, "{call} {layout}");
            let fast = verify(&case, &Options::default());
            assert_eq!(fast.verdict, Verdict::Verified, "{call} {layout}");
            assert_eq!(fast.operators_fast, 1, "{call} {layout}");
            assert_eq!(audit.verdict, fast.verdict);
        }
    }
}

/// The audit on zoo plans: wherever the fast path decides, the e-graph writes the same
/// relation (the reports cannot change), and the fast path decides some operators.
#[test]
fn the_audit_finds_the_e_graphs_relations_on_zoo_plans() {
    let mut decided = 0;
    for (model, mesh, forward_only) in [
        ("mlp", "tp=2", false),
        ("mlp", "dp=2,tp=2", false),
        ("llama", "tp=2", true),
        ("gpt2", "dp=2", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = super::tests::zoo_case(dir.path(), model, mesh, None, forward_only);
        let audit = verify(
            &case,
            &Options {
                audit_fast_path: true,
                ..Options::default()
            },
        );
        eprintln!(
            "{model} {mesh}: {:?}, {} operators, {} decided by the fast path alike, {} differ",
            audit.verdict,
            audit.spec_operators,
            audit.operators_fast,
            audit.fast_path_differences.len()
        );
        assert!(
            audit.fast_path_differences.is_empty(),
            "{model} {mesh}: {:#?}",
            audit.fast_path_differences
        );
        decided += audit.operators_fast;
    }
    assert!(decided > 0);
}

/// Precondition of a concatenation's alternatives: they are merged piece by piece only where
/// their pieces have the same shapes. Two splits of one 6-row tensor, 2 + 4 rows and 4 + 2,
/// are not one split: a merge would call a 2-row and a 4-row tensor equal.
#[test]
fn concatenations_split_otherwise_are_not_merged() {
    use super::fastpath::{form_of, Form};
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Shard(0)", "Shard(0)"],
            spec: ("4, 6 | 8, 6", "aten.neg.default(x)"),
            rank: ("2, 6 | 4, 6", "aten.neg.default(x)"),
        },
    );
    let imp = impl_of(&case);
    let cat = |s: &str| -> egg::RecExpr<crate::term::Term> { s.parse().unwrap() };
    let rel = |exprs: Vec<egg::RecExpr<crate::term::Term>>| Rel::of(exprs, true);
    let alike = rel(vec![cat("(cat 0 %r0:x %r1:x)"), cat("(cat 0 %r1:x %r0:x)")]);
    assert!(matches!(form_of(&imp, &alike), Some(Form::Sharded { .. })));
    let apart = rel(vec![cat("(cat 0 %r0:x %r1:y)"), cat("(cat 0 %r0:y %r1:x)")]);
    assert_eq!(form_of(&imp, &apart), None);
}

/// Precondition (the e-graph's form): no collective combines the output's rank tensors. Where
/// the ranks all-gather their pieces of the sum (sequence parallelism), the e-graph's relation
/// also names the gathered tensors, so the fast path declines; the audit agrees.
#[test]
fn an_output_a_collective_gathers_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph("4, 6", "aten.add.Tensor(x, y)");
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 6]\", y: \"f32[2, 6]\"):\n        z: \"f32[2, 6]\" = torch.ops.aten.add.Tensor(x, y)\n        all_gather_into_tensor: \"f32[4, 6]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(z, 2, '0')\n        wait_tensor: \"f32[4, 6]\" = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor)\n        out: \"f32[4, 6]\" = torch.ops.aten.tanh.default(wait_tensor)\n        return (out,)\n";
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank).unwrap();
    }
    let yaml = "version: 1\nname: gathered\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  y: Shard(0)\noutputs:\n  out: Replicate()\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(audit.fast_path_differences.is_empty());
}

/// The calls of the families the fast path relates over replicas only (products, views,
/// transposes, permutes, reductions, softmax), as (FX call text over `x` and `y`, shapes
/// `X | Y | Z`). A view, transpose or permute is also written as the call over `x`'s
/// preferred replica, as extraction writes it.
const OVER_REPLICAS: &[(&str, &str)] = &[
    ("aten.mm.default(x, y)", "4, 6 | 6, 4 | 4, 4"),
    ("aten.bmm.default(x, y)", "2, 3, 4 | 2, 4, 3 | 2, 3, 3"),
    ("aten.view.default(x, [24])", "4, 6 | 4, 6 | 24"),
    ("aten.view.default(x, [2, 2, 6])", "4, 6 | 4, 6 | 2, 2, 6"),
    ("aten.unsqueeze.default(x, 0)", "4, 6 | 4, 6 | 1, 4, 6"),
    ("aten.t.default(x)", "4, 6 | 4, 6 | 6, 4"),
    ("aten.transpose.int(x, 0, 1)", "4, 6 | 4, 6 | 6, 4"),
    (
        "aten.permute.default(x, [1, 2, 0])",
        "2, 3, 4 | 2, 3, 4 | 3, 4, 2",
    ),
    ("aten.sum.dim_IntList(x, [1])", "4, 6 | 4, 6 | 4"),
    ("aten.sum.dim_IntList(x, [0], True)", "4, 6 | 4, 6 | 1, 6"),
    ("aten.amax.default(x, [1])", "4, 6 | 4, 6 | 4"),
    ("aten._softmax.default(x, 1, False)", "4, 6 | 4, 6 | 4, 6"),
];

/// Products, views, transposes, permutes, reductions and softmax over replicas: every rank's
/// result is a replica of the spec's (and a layout call over a replica is one), on random
/// inputs, over two and four ranks.
#[test]
fn products_views_and_reductions_over_replicas_derive_every_ranks_result() {
    for (mesh, ranks) in [("{ tp: 2 }", 2), ("{ dp: 4 }", 4)] {
        for (call, shapes) in OVER_REPLICAS {
            let dir = tempfile::tempdir().unwrap();
            let case = write_case(
                dir.path(),
                &Plan {
                    mesh,
                    ranks,
                    layout: ["Replicate()", "Replicate()", "Replicate()"],
                    spec: (shapes, call),
                    rank: (shapes, call),
                },
            );
            let rel = fast_z(&case).unwrap_or_else(|| panic!("{call} on {mesh}: declined"));
            let leaves = rel.exprs.iter().filter(|e| e.as_ref().len() == 1).count();
            assert_eq!(leaves, ranks, "{call}: {:?}", rel.exprs);
            for seed in [0.11, 0.23, 0.59] {
                holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call} on {mesh}: {e}"));
            }
        }
    }
}

/// Precondition: the families related over replicas only take no concatenated input. A sum
/// over the split dim computed on each shard is a partial sum, and a flattening view of a
/// column shard interleaves: the concatenation of the ranks' results is not the spec's
/// value (the rule for element-wise calls would be false).
#[test]
fn a_reduction_or_view_over_shards_is_declined() {
    for (call, spec_shapes, rank_shapes, out) in [
        (
            "aten.sum.dim_IntList(x, [1])",
            "4, 6 | 4, 6 | 4",
            "4, 3 | 4, 3 | 4",
            "Replicate()",
        ),
        (
            "aten.view.default(x, [24])",
            "4, 6 | 4, 6 | 24",
            "4, 3 | 4, 3 | 12",
            "Shard(0)",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = write_case(
            dir.path(),
            &Plan {
                mesh: "{ tp: 2 }",
                ranks: 2,
                layout: ["Shard(1)", "Shard(1)", out],
                spec: (spec_shapes, call),
                rank: (rank_shapes, call),
            },
        );
        assert!(fast_z(&case).is_none(), "{call}");
    }
}

/// The audit on the replica rules: the e-graph writes every relation as the fast path does
/// (the leaves, and for a layout call the call over the preferred replica with the inputs'
/// group of equal leaves), and the verdict is the same.
#[test]
fn the_audit_finds_the_e_graphs_relations_over_replicas() {
    for (call, shapes) in OVER_REPLICAS {
        let dir = tempfile::tempdir().unwrap();
        let case = write_case(
            dir.path(),
            &Plan {
                mesh: "{ tp: 2 }",
                ranks: 2,
                layout: ["Replicate()", "Replicate()", "Replicate()"],
                spec: (shapes, call),
                rank: (shapes, call),
            },
        );
        let audit = verify(
            &case,
            &Options {
                audit_fast_path: true,
                ..Options::default()
            },
        );
        assert!(
            audit.fast_path_differences.is_empty(),
            "{call}: {:#?}",
            audit.fast_path_differences
        );
        assert_eq!(audit.operators_fast, 1, "{call}");
        let fast = verify(&case, &Options::default());
        assert_eq!(fast.verdict, Verdict::Verified, "{call}");
        assert_eq!(audit.verdict, fast.verdict, "{call}");
    }
}

/// The layout operators the fast path writes as extraction does are clean operators of
/// extraction's (a change of either list shows here).
#[test]
fn the_layout_operators_are_extractions_clean_ones() {
    for op in super::fastpath::LAYOUT_OPS {
        assert!(super::extract::CLEAN_OPS.contains(op), "{op}");
    }
}

/// A transpose or permute of a concatenation: the concatenation of the ranks' results along
/// the dim the split dim moves to (beside the call over the input's concatenation), on random
/// inputs; and the audit finds the e-graph's relation written alike.
#[test]
fn a_transpose_or_permute_of_shards_concatenates_along_the_moved_dim() {
    for (call, layout, spec_shapes, rank_shapes, out_dim) in [
        (
            "aten.t.default(x)",
            "Shard(0)",
            "4, 6 | 4, 6 | 6, 4",
            "2, 6 | 2, 6 | 6, 2",
            1,
        ),
        (
            "aten.transpose.int(x, 0, 1)",
            "Shard(1)",
            "4, 6 | 4, 6 | 6, 4",
            "4, 3 | 4, 3 | 3, 4",
            0,
        ),
        (
            "aten.transpose.int(x, 1, 2)",
            "Shard(0)",
            "2, 3, 4 | 2, 3, 4 | 2, 4, 3",
            "1, 3, 4 | 1, 3, 4 | 1, 4, 3",
            0,
        ),
        (
            "aten.permute.default(x, [1, 2, 0])",
            "Shard(0)",
            "2, 3, 4 | 2, 3, 4 | 3, 4, 2",
            "1, 3, 4 | 1, 3, 4 | 3, 4, 1",
            2,
        ),
        (
            "aten.permute.default(x, [2, 0, 1])",
            "Shard(2)",
            "2, 3, 4 | 2, 3, 4 | 4, 2, 3",
            "2, 3, 2 | 2, 3, 2 | 2, 2, 3",
            0,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = write_case(
            dir.path(),
            &Plan {
                mesh: "{ tp: 2 }",
                ranks: 2,
                layout: [layout, layout, &format!("Shard({out_dim})")],
                spec: (spec_shapes, call),
                rank: (rank_shapes, call),
            },
        );
        let rel = fast_z(&case).unwrap_or_else(|| panic!("{call}: declined"));
        let text = rel.exprs[0].to_string();
        assert!(
            text.starts_with(&format!("(cat {out_dim} ")),
            "{call}: {text}"
        );
        for seed in [0.11, 0.23, 0.59] {
            holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call}: {e}"));
        }
        let audit = verify(
            &case,
            &Options {
                audit_fast_path: true,
                ..Options::default()
            },
        );
        assert!(
            audit.fast_path_differences.is_empty(),
            "{call}: {:#?}",
            audit.fast_path_differences
        );
        assert_eq!(audit.operators_fast, 1, "{call}");
        assert_eq!(audit.verdict, Verdict::Verified, "{call}");
    }
}

/// Precondition (the e-graph's form): a permute that swaps two dims is declined. The e-graph
/// also writes it as a transpose, which the rule does not write; the audit agrees.
#[test]
fn a_permute_that_swaps_two_dims_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let call = "aten.permute.default(x, [1, 0])";
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Replicate()", "Replicate()", "Replicate()"],
            spec: ("4, 6 | 4, 6 | 6, 4", call),
            rank: ("4, 6 | 4, 6 | 6, 4", call),
        },
    );
    assert!(fast_z(&case).is_none());
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(audit.fast_path_differences.is_empty());
}

/// Precondition (the e-graph's form): no rank slices the output's replicas. Where each rank
/// keeps its own chunk of the product (sequence parallelism's scatter), the e-graph's
/// relation also names the concatenation of the chunks, so the fast path declines; the audit
/// agrees.
#[test]
fn a_replicated_output_the_ranks_slice_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\", y: \"f32[6, 4]\"):\n        z: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, y)\n        out: \"f32[4, 4]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n";
    let rank = |r: usize| {
        format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\", y: \"f32[6, 4]\"):\n        z: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, y)\n        piece: \"f32[2, 4]\" = torch.ops.aten.slice.Tensor(z, 0, {}, {})\n        out: \"f32[2, 4]\" = torch.ops.aten.tanh.default(piece)\n        return (out,)\n", 2 * r, 2 * r + 2)
    };
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank(r)).unwrap();
    }
    let yaml = "version: 1\nname: scattered\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  y: Replicate()\noutputs:\n  out: Shard(0)\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(audit.fast_path_differences.is_empty());
}

/// Products over pieces: rows or batches of the left operand (and the batches of the right)
/// and columns of the right give the concatenation of the ranks' products; pieces of the
/// contraction dim give their sum. Each holds on random inputs, and the audit finds the
/// e-graph's relation written alike.
#[test]
fn products_over_pieces_concatenate_or_sum_the_ranks_products() {
    for (call, layout, spec_shapes, rank_shapes, form) in [
        (
            "aten.mm.default(x, y)",
            ["Replicate()", "Shard(1)", "Shard(1)"],
            "4, 6 | 6, 4 | 4, 4",
            "4, 6 | 6, 2 | 4, 2",
            "(cat 1 ",
        ),
        (
            "aten.mm.default(x, y)",
            ["Shard(0)", "Replicate()", "Shard(0)"],
            "4, 6 | 6, 4 | 4, 4",
            "2, 6 | 6, 4 | 2, 4",
            "(cat 0 ",
        ),
        (
            "aten.bmm.default(x, y)",
            ["Shard(0)", "Shard(0)", "Shard(0)"],
            "2, 3, 4 | 2, 4, 3 | 2, 3, 3",
            "1, 3, 4 | 1, 4, 3 | 1, 3, 3",
            "(cat 0 ",
        ),
        (
            "aten.bmm.default(x, y)",
            ["Shard(1)", "Replicate()", "Shard(1)"],
            "2, 4, 4 | 2, 4, 3 | 2, 4, 3",
            "2, 2, 4 | 2, 4, 3 | 2, 2, 3",
            "(cat 1 ",
        ),
        (
            "aten.mm.default(x, y)",
            ["Shard(1)", "Shard(0)", "Replicate()"],
            "4, 6 | 6, 4 | 4, 4",
            "4, 3 | 3, 4 | 4, 4",
            "(sum ",
        ),
        (
            "aten.bmm.default(x, y)",
            ["Shard(2)", "Shard(1)", "Replicate()"],
            "2, 3, 4 | 2, 4, 3 | 2, 3, 3",
            "2, 3, 2 | 2, 2, 3 | 2, 3, 3",
            "(sum ",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = write_case(
            dir.path(),
            &Plan {
                mesh: "{ tp: 2 }",
                ranks: 2,
                layout,
                spec: (spec_shapes, call),
                rank: (rank_shapes, call),
            },
        );
        let rel = fast_z(&case).unwrap_or_else(|| panic!("{call} {layout:?}: declined"));
        let text = rel.exprs[0].to_string();
        assert!(text.starts_with(form), "{call} {layout:?}: {text}");
        for seed in [0.11, 0.23, 0.59] {
            holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call} {layout:?}: {e}"));
        }
        let audit = verify(
            &case,
            &Options {
                audit_fast_path: true,
                ..Options::default()
            },
        );
        assert!(
            audit.fast_path_differences.is_empty(),
            "{call} {layout:?}: {:#?}",
            audit.fast_path_differences
        );
        assert_eq!(audit.operators_fast, 1, "{call} {layout:?}");
    }
}

/// Precondition: the operands' pieces meet as one of the product's layouts. Rows of the left
/// operand beside columns of the right: each rank computes one diagonal block of the
/// product, neither a concatenation nor a sum of the spec's (declined).
#[test]
fn a_product_of_rows_by_columns_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph("4, 6 | 6, 4 | 4, 4", "aten.mm.default(x, y)");
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 6]\", y: \"f32[6, 2]\"):\n        z: \"f32[2, 2]\" = torch.ops.aten.mm.default(x, y)\n        out: \"f32[2, 4]\" = torch.ops.aten.cat.default([z, z], 1)\n        return (out,)\n";
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank).unwrap();
    }
    let yaml = "version: 1\nname: blocks\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  y: Shard(1)\noutputs:\n  out: Shard(0)\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
}

/// Preconditions (the e-graph's form): no call combines the summands, and no collective reads
/// them (this case fails only when both are removed: the all-reduce does both). The
/// all-reduced tensors are the whole sum, which the e-graph's relation also names, so the
/// fast path declines; the audit agrees and the plan verifies.
#[test]
fn a_partial_product_an_all_reduce_sums_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph("4, 6 | 6, 4 | 4, 4", "aten.mm.default(x, y)");
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 3]\", y: \"f32[3, 4]\"):\n        z: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, y)\n        all_reduce: \"f32[4, 4]\" = torch.ops._c10d_functional.all_reduce.default(z, 'sum', '0')\n        wait_tensor: \"f32[4, 4]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)\n        out: \"f32[4, 4]\" = torch.ops.aten.tanh.default(wait_tensor)\n        return (out,)\n";
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank).unwrap();
    }
    let yaml = "version: 1\nname: reduced\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(1)\n  y: Shard(0)\noutputs:\n  out: Replicate()\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(audit.fast_path_differences.is_empty());
}

/// Precondition (the e-graph's form): a layout call over a tensor the ranks define by a
/// layout call is declined. The e-graph composes a view of a view into one view of the first
/// view's input and writes that form too; the audit agrees, and the first view is decided.
#[test]
fn a_view_of_a_view_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let g = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\", y: \"f32[4, 6]\"):\n        w: \"f32[24]\" = torch.ops.aten.view.default(x, [24])\n        z: \"f32[6, 4]\" = torch.ops.aten.view.default(w, [6, 4])\n        out: \"f32[6, 4]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n";
    for f in ["spec.py", "r0.py", "r1.py"] {
        std::fs::write(dir.path().join(f), g).unwrap();
    }
    let yaml = "version: 1\nname: views\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  y: Replicate()\noutputs:\n  out: Replicate()\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let imp = impl_of(&case);
    let mut state = input_states(&case, &imp);
    let (w, tw) = spec_term(&case, "w");
    let rel_w = decide(&imp, &state, &tw).expect("the first view is decided");
    state.insert(w, State::Related(rel_w));
    let (_, tz) = spec_term(&case, "z");
    assert!(decide(&imp, &state, &tz).is_none());
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(
        audit.fast_path_differences.is_empty(),
        "{:#?}",
        audit.fast_path_differences
    );
    assert_eq!(audit.operators_fast, 1);
}

/// A case over replicated `x: f32[xs]` and `y: f32[ys]` whose spec runs the FX body `body`
/// and every rank `rank_body` (`{r}` replaced by the rank), each returning a replicated `out`.
fn replicated_case(dir: &Path, (xs, ys): (&str, &str), body: &str, rank_body: &str) -> Case {
    let module = |body: &str| {
        format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{xs}]\", y: \"f32[{ys}]\"):\n{body}        return (out,)\n")
    };
    std::fs::write(dir.join("spec.py"), module(body)).unwrap();
    for r in 0..2 {
        std::fs::write(
            dir.join(format!("r{r}.py")),
            module(&rank_body.replace("{r}", &r.to_string())),
        )
        .unwrap();
    }
    let yaml = "version: 1\nname: replicated\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  y: Replicate()\noutputs:\n  out: Replicate()\n";
    std::fs::write(dir.join("case.yaml"), yaml).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// Asserts that the fast path declines `z` and that the audit finds no difference and the
/// same verified verdict.
fn declined_and_audited(case: &Case) {
    assert!(fast_z(case).is_none(), "the fast path decides z");
    let audit = verify(
        case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(
        audit.fast_path_differences.is_empty(),
        "{:#?}",
        audit.fast_path_differences
    );
}

/// Precondition (the e-graph's form): a reduction over size-1 dims only keeps every element;
/// the e-graph also writes it as a view, so the fast path declines.
#[test]
fn a_reduction_over_size_one_dims_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let body = "        z: \"f32[4, 6]\" = torch.ops.aten.sum.dim_IntList(x, [1])\n        out: \"f32[4, 6]\" = torch.ops.aten.tanh.default(z)\n";
    let case = replicated_case(dir.path(), ("4, 1, 6", "4, 6"), body, body);
    declined_and_audited(&case);
}

/// Precondition (the e-graph's form): no rank views the output and views that back to its
/// shape. The e-graph composes the two views into the output itself and names the second
/// among its equal leaves, so the fast path declines.
#[test]
fn an_output_viewed_back_to_its_shape_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "        z: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, y)\n        out: \"f32[4, 4]\" = torch.ops.aten.tanh.default(z)\n";
    let rank = "        z: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, y)\n        w: \"f32[16]\" = torch.ops.aten.view.default(z, [16])\n        u: \"f32[4, 4]\" = torch.ops.aten.view.default(w, [4, 4])\n        out: \"f32[4, 4]\" = torch.ops.aten.tanh.default(u)\n";
    let case = replicated_case(dir.path(), ("4, 6", "6, 4"), spec, rank);
    declined_and_audited(&case);
}

/// Precondition (the e-graph's form): a layout call over replicas some rank slices is
/// declined. The e-graph moves the slices through the layout call (a transpose of the
/// concatenation of the ranks' chunks) and writes that form too.
#[test]
fn a_layout_call_over_sliced_replicas_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "        z: \"f32[6, 4]\" = torch.ops.aten.t.default(x)\n        out: \"f32[6, 4]\" = torch.ops.aten.tanh.default(z)\n";
    let case = replicated_case(dir.path(), ("4, 6", "4, 6"), spec, SLICED_RANK);
    declined_and_audited(&case);
}

/// The ranks' body of [`a_layout_call_over_sliced_replicas_is_left_to_the_e_graph`]: each
/// slices `x` into two chunks of rows and transposes `x`.
const SLICED_RANK: &str = "        piece: \"f32[2, 6]\" = torch.ops.aten.slice.Tensor(x, 0, 0, 2)\n        rest: \"f32[2, 6]\" = torch.ops.aten.slice.Tensor(x, 0, 2, 4)\n        z: \"f32[6, 4]\" = torch.ops.aten.t.default(x)\n        out: \"f32[6, 4]\" = torch.ops.aten.tanh.default(z)\n";

/// Precondition (the e-graph's form): no collective reads a product's pieces. Where the ranks
/// all-gather their row pieces, the gathered tensor is the spec's product too, which the
/// e-graph's relation also names, so the fast path declines; the audit agrees.
#[test]
fn a_product_a_collective_gathers_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = graph("4, 6 | 6, 4 | 4, 4", "aten.mm.default(x, y)");
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 6]\", y: \"f32[6, 4]\"):\n        z: \"f32[2, 4]\" = torch.ops.aten.mm.default(x, y)\n        all_gather_into_tensor: \"f32[4, 4]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(z, 2, '0')\n        wait_tensor: \"f32[4, 4]\" = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor)\n        out: \"f32[4, 4]\" = torch.ops.aten.tanh.default(wait_tensor)\n        return (out,)\n";
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank).unwrap();
    }
    let yaml = "version: 1\nname: gathered\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  y: Replicate()\noutputs:\n  out: Replicate()\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert_eq!(audit.verdict, Verdict::Verified);
    assert!(audit.fast_path_differences.is_empty());
}
