//! `Rows` placements agree with the interpreter: every rank slices the same rows `start..end`
//! of its piece of a `Shard(0)` batch (a microbatch), then one operator runs on the slice
//! (and on the same slice of a second sharded tensor, or on a replicated operand). The spec
//! runs the operator on the selection: the ranks' slices concatenated in coordinate order.
//! Where the checker infers `Rows(d, _)` for the output, the ranks' outputs concatenated along
//! `d` must be the spec's output; `Partial(sum)` must sum to it; `Replicate()` must be it on
//! every rank. The slice itself must never be claimed a plain `Shard` (its rows are not the
//! batch's contiguous rows).

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{propagate, Place, Red};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, concat, random};

/// The second operand of a case.
#[derive(Clone, Copy, Debug)]
enum Other {
    /// None.
    None,
    /// The same rows of another sharded tensor of the same shape.
    Rows,
    /// A replicated bias `[c]`.
    Bias,
    /// A replicated weight `[c, k]`.
    Weight,
}

/// One operator on the slice `a` (`[m, c]`) and the second operand `b`: its call text and
/// output shape, or `None` where it does not take this operand.
fn op_call(op: usize, other: Other, m: usize, c: usize, k: usize) -> Option<(String, Vec<usize>)> {
    use Other as O;
    Some(match (op, other) {
        (0, O::None) => ("torch.ops.aten.relu.default(a)".into(), vec![m, c]),
        (1, O::Rows | O::Bias) => ("torch.ops.aten.add.Tensor(a, b)".into(), vec![m, c]),
        (2, O::Rows) => ("torch.ops.aten.mul.Tensor(a, b)".into(), vec![m, c]),
        (3, O::Weight) => ("torch.ops.aten.mm.default(a, b)".into(), vec![m, k]),
        (4, O::None) => ("torch.ops.aten.t.default(a)".into(), vec![c, m]),
        (5, O::None) => ("torch.ops.aten.sum.dim_IntList(a, [0])".into(), vec![c]),
        (6, O::None) => ("torch.ops.aten.sum.dim_IntList(a, [1])".into(), vec![m]),
        (7, O::None) => (
            "torch.ops.aten._softmax.default(a, 1, False)".into(),
            vec![m, c],
        ),
        (8, O::None) if c.is_multiple_of(2) => (
            format!("torch.ops.aten.view.default(a, [{}, {}])", m * 2, c / 2),
            vec![m * 2, c / 2],
        ),
        // `at` is `t(a)`, a node of its own (see `pre`).
        (9, O::Rows) => ("torch.ops.aten.mm.default(at, b)".into(), vec![c, c]),
        (10, O::None) => ("torch.ops.aten.mean.default(a)".into(), vec![]),
        // The top k values along the columns (`tk = topk(a, k, 1)`, see `pre`).
        (11, O::None) if k <= c => ("torch.ops.aten.clone.default(tv)".into(), vec![m, k]),
        // The top k values scattered at their columns into a zero `[m, c]` (the router).
        (12, O::None) if k <= c => (
            "torch.ops.aten.scatter.src(z, 1, ti, tv)".into(),
            vec![m, c],
        ),
        // The top k along the rows: each rank picks among its own rows only (no claim).
        (13, O::None) if k <= m => ("torch.ops.aten.clone.default(tv)".into(), vec![k, c]),
        _ => return None,
    })
}

/// Operators 0..N_OPS each make a checked claim; `TOPK_OF_ROWS` must make none.
const N_OPS: usize = 13;

/// The top k along the rows' dim.
const TOPK_OF_ROWS: usize = 13;

/// The nodes an operator's call reads besides the slices (`at = t(a)` for the contraction,
/// the top k of `a` and a zero matrix for the router's scatter).
fn pre(op: usize, m: usize, c: usize, k: usize) -> Vec<(&'static str, Vec<usize>, String)> {
    let topk = |dim: usize| format!("torch.ops.aten.topk.default(a, {k}, {dim})");
    match op {
        9 => vec![("at", vec![c, m], "torch.ops.aten.t.default(a)".into())],
        11 => vec![("tk", vec![], topk(1)), ("tv", vec![m, k], "tk[0]".into())],
        12 => vec![
            ("tk", vec![], topk(1)),
            ("tv", vec![m, k], "tk[0]".into()),
            ("ti", vec![m, k], "tk[1]".into()),
            (
                "z",
                vec![m, c],
                format!("torch.ops.aten.full.default([{m}, {c}], 0.0, dtype = torch.float64)"),
            ),
        ],
        13 => vec![("tk", vec![], topk(0)), ("tv", vec![k, c], "tk[0]".into())],
        _ => vec![],
    }
}

/// The FX annotation of a body line: none for a `topk`'s tuple (`tk`), `i64` for its indices
/// (`ti`), else `f64`.
fn annotation(name: &str, shape: &[usize]) -> String {
    match name {
        "tk" => String::new(),
        "ti" => format!(": \"i64{shape:?}\""),
        _ => format!(": \"f64{shape:?}\""),
    }
}

/// A graph module: inputs `params` (name, shape), body lines `(name, shape, call)`, the last
/// one `out`.
fn fx(params: &[(&str, Vec<usize>)], body: &[(&str, Vec<usize>, String)]) -> String {
    let ps: Vec<String> = params
        .iter()
        .map(|(n, s)| format!("{n}: \"f64{s:?}\""))
        .collect();
    let mut t = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, {}):\n",
        ps.join(", ")
    );
    for (n, s, call) in body {
        t.push_str(&format!("        {n}{} = {call}\n", annotation(n, s)));
    }
    t.push_str("        return (out,)\n");
    t
}

/// Runs one case; returns whether the checker's claim on the output was checked.
#[allow(clippy::too_many_arguments)]
fn instance(
    op: usize,
    other: Other,
    n: usize,
    l: usize,
    c: usize,
    k: usize,
    (start, end): (usize, usize),
    seed: u64,
) -> Result<bool, TestCaseError> {
    let m = end - start;
    let Some((call, out_local)) = op_call(op, other, m, c, k) else {
        return Ok(false);
    };
    let Some((spec_call, out_global)) = op_call(op, other, n * m, c, k) else {
        return Ok(false);
    };
    let b_local = match other {
        Other::None => None,
        Other::Rows => Some(vec![l, c]),
        Other::Bias => Some(vec![c]),
        Other::Weight => Some(vec![c, k]),
    };
    let mut rank_params = vec![("x", vec![l, c])];
    let mut rank_body = vec![(
        "a",
        vec![m, c],
        format!("torch.ops.aten.slice.Tensor(x, 0, {start}, {end})"),
    )];
    // The spec selects the same rows of the whole batch: `[n*l, c] -> [n, l, c]`, rows
    // `start..end` of every coordinate's block, flattened back in coordinate order.
    let select = |src: &str, dst: &'static str| -> Vec<(&'static str, Vec<usize>, String)> {
        let (v, s, cl) = match dst {
            "a" => ("a_v", "a_s", "a_c"),
            _ => ("b_v", "b_s", "b_c"),
        };
        vec![
            (
                v,
                vec![n, l, c],
                format!("torch.ops.aten.view.default({src}, [{n}, {l}, {c}])"),
            ),
            (
                s,
                vec![n, m, c],
                format!("torch.ops.aten.slice.Tensor({v}, 1, {start}, {end})"),
            ),
            (
                cl,
                vec![n, m, c],
                format!("torch.ops.aten.clone.default({s})"),
            ),
            (
                dst,
                vec![n * m, c],
                format!("torch.ops.aten.view.default({cl}, [{}, {c}])", n * m),
            ),
        ]
    };
    let mut spec_params = vec![("x", vec![n * l, c])];
    let mut spec_body = select("x", "a");
    match other {
        Other::Rows => {
            rank_params.push(("y", vec![l, c]));
            rank_body.push((
                "b",
                vec![m, c],
                format!("torch.ops.aten.slice.Tensor(y, 0, {start}, {end})"),
            ));
            spec_params.push(("y", vec![n * l, c]));
            spec_body.extend(select("y", "b"));
        }
        Other::Bias | Other::Weight => {
            let bs = b_local.clone().unwrap();
            rank_params.push(("b", bs.clone()));
            spec_params.push(("b", bs));
        }
        Other::None => {}
    }
    rank_body.extend(pre(op, m, c, k));
    rank_body.push(("out", out_local.clone(), call));
    spec_body.extend(pre(op, n * m, c, k));
    spec_body.push(("out", out_global.clone(), spec_call));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), fx(&spec_params, &spec_body)).unwrap();
    let graphs: Vec<String> = (0..n).map(|r| format!("r{r}.py")).collect();
    for g in &graphs {
        std::fs::write(dir.path().join(g), fx(&rank_params, &rank_body)).unwrap();
    }
    let mut inputs = vec!["  x: { dp: Shard(0) }".to_string()];
    match other {
        Other::Rows => inputs.push("  y: { dp: Shard(0) }".into()),
        Other::Bias | Other::Weight => inputs.push("  b: { dp: Replicate() }".into()),
        Other::None => {}
    }
    let yaml = format!(
        "version: 1\nname: rows\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: {n} }}\n  graphs: [{}]\ninputs:\n{}\noutputs: {{}}\n",
        graphs.join(", "),
        inputs.join("\n")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .map_err(|e| TestCaseError::fail(format!("op {op}: {e}")))?;
    let prop = propagate(&case).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let g0 = &case.program.ranks[0];
    let idx = |name: &str| g0.nodes.iter().position(|nd| nd.name == name).unwrap();
    // The slice: rows of a selection (or no claim), never a plain shard.
    let a_place = prop.ranks[0].of(ValueId::new(idx("a"), 0), 1)[0];
    prop_assert!(
        matches!(a_place, Place::Rows(0, _) | Place::Varying),
        "slice {start}..{end} of {l}: {a_place}"
    );
    let place = prop.ranks[0].of(ValueId::new(idx("out"), 0), 1)[0];
    for r in 1..n {
        prop_assert_eq!(prop.ranks[r].of(ValueId::new(idx("out"), 0), 1)[0], place);
    }
    // Values: rank inputs, and the spec's selection from them.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let xs: Vec<Tensor> = (0..n).map(|_| random(&[l, c], &mut rng)).collect();
    let ys: Vec<Tensor> = (0..n).map(|_| random(&[l, c], &mut rng)).collect();
    let shared_b = b_local.as_ref().map(|s| random(s, &mut rng));
    let whole = |ts: &[Tensor]| -> Tensor {
        let d: Vec<f64> = ts.iter().flat_map(|t| t.data.iter().copied()).collect();
        Tensor::new(Meta::new(DType::F64, vec![n * l, c]), d)
    };
    let mut spec_leaves = BTreeMap::new();
    spec_leaves.insert("x".to_string(), whole(&xs));
    match other {
        Other::Rows => {
            spec_leaves.insert("y".to_string(), whole(&ys));
        }
        Other::Bias | Other::Weight => {
            spec_leaves.insert("b".to_string(), shared_b.clone().unwrap());
        }
        Other::None => {}
    }
    let cfg = RunConfig::default();
    let out_of = |g: &shardproof_ir::Graph, env: &shardproof_interp::Env| -> Vec<f64> {
        let i = g.nodes.iter().position(|nd| nd.name == "out").unwrap();
        env.get(ValueId::new(i, 0)).unwrap().data.to_vec()
    };
    let want = out_of(
        &case.spec,
        &run_graph(&case.spec, &spec_leaves, &cfg).unwrap(),
    );
    let got: Vec<Vec<f64>> = (0..n)
        .map(|r| {
            let g = &case.program.ranks[r];
            let mut leaves = BTreeMap::new();
            leaves.insert("x".to_string(), xs[r].clone());
            match other {
                Other::Rows => {
                    leaves.insert("y".to_string(), ys[r].clone());
                }
                Other::Bias | Other::Weight => {
                    leaves.insert("b".to_string(), shared_b.clone().unwrap());
                }
                Other::None => {}
            }
            out_of(g, &run_graph(g, &leaves, &cfg).unwrap())
        })
        .collect();
    let what = format!("op {op} {other:?} n={n} [{l}, {c}] rows {start}..{end}: {place}");
    match place {
        Place::Rows(d, _) => {
            prop_assert!(
                close(&concat(&got, &out_local, d as usize), &want),
                "{}",
                what
            );
        }
        Place::Partial(Red::Sum) => {
            let sum: Vec<f64> = (0..want.len())
                .map(|i| got.iter().map(|g| g[i]).sum())
                .collect();
            prop_assert!(close(&sum, &want), "{}", what);
        }
        Place::Partial(Red::Avg) => {
            let avg: Vec<f64> = (0..want.len())
                .map(|i| got.iter().map(|g| g[i]).sum::<f64>() / n as f64)
                .collect();
            prop_assert!(close(&avg, &want), "{}", what);
        }
        Place::Replicate => {
            for g in &got {
                prop_assert!(close(g, &want), "{}", what);
            }
        }
        Place::Shard(_) | Place::Blocked(..) => {
            prop_assert!(
                false,
                "{}: a plain shard claimed for rows of a selection",
                what
            )
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn other() -> impl Strategy<Value = Other> {
    prop_oneof![
        Just(Other::None),
        Just(Other::Rows),
        Just(Other::Bias),
        Just(Other::Weight)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x0044_0057),
        ..ProptestConfig::default()
    })]

    #[test]
    fn rows_placements_agree_with_the_interpreter(
        op in 0..=TOPK_OF_ROWS,
        other in other(),
        n in 2usize..=3,
        l in 2usize..=5,
        c in 1usize..=4,
        k in 1usize..=3,
        a in 0usize..5,
        b in 0usize..5,
        seed in any::<u64>(),
    ) {
        let (start, end) = (a.min(b) % l, (a.max(b) % l) + 1);
        if start < end && end - start < l {
            instance(op, other, n, l, c, k, (start, end), seed)?;
        }
    }
}

/// Every operator makes a claim the interpreter confirms on fixed shapes.
#[test]
fn each_operator_makes_a_checked_claim() {
    for op in 0..N_OPS {
        let claimed = [Other::None, Other::Rows, Other::Bias, Other::Weight]
            .into_iter()
            .any(|o| instance(op, o, 2, 4, 2, 2, (1, 3), op as u64).unwrap());
        assert!(claimed, "op {op}: no claim checked");
    }
    // The top k along the rows is the sort rule's finding: no placement to check.
    assert!(!instance(TOPK_OF_ROWS, Other::None, 2, 4, 2, 2, (1, 3), 7).unwrap());
}
