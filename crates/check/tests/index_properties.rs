//! `index_add`, `index_copy` and `index_fill` agree with the interpreter: over tp=2, `self`,
//! the 1-d index and the source each replicated or sharded, the ranks run the operator on
//! their pieces and the spec on the whole tensors. Where the checker infers `Shard(d)` for the
//! output, the ranks' outputs concatenated along `d` must be the spec's; `Replicate()` must be
//! it on every rank; `Partial(sum)` must sum to it. Before, these shared scatter's
//! `rows_alike`, which read a 1-d index's dim 0 as `self`'s rows: a sharded index (each rank
//! writing other positions) kept `self`'s shard where the sizes coincided.

use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{propagate, Place, Red};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, concat, random};

const N: usize = 2;

/// A placement over tp: `None` replicated, `Some(d)` sharded along `d`.
type P = Option<usize>;

fn local(shape: &[usize], p: P) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(d) = p {
        s[d] /= N;
    }
    s
}

/// Rank `r`'s piece of a row-major tensor of `shape` placed `p`.
fn piece(t: &[f64], shape: &[usize], p: P, r: usize) -> Vec<f64> {
    let Some(d) = p else { return t.to_vec() };
    let outer: usize = shape[..d].iter().product();
    let inner: usize = shape[d + 1..].iter().product();
    let k = shape[d] / N;
    let mut out = Vec::new();
    for o in 0..outer {
        let base = o * shape[d] * inner + r * k * inner;
        out.extend_from_slice(&t[base..base + k * inner]);
    }
    out
}

fn ty(dtype: &str, s: &[usize]) -> String {
    format!("\"{dtype}{s:?}\"")
}

fn placement(p: P) -> String {
    p.map_or("Replicate()".into(), |d| format!("Shard({d})"))
}

/// One case: `op` 0 index_add, 1 index_copy, 2 index_fill, on `self` `[rows, cols]` along
/// `dim` at `k` positions; placements of self, index and source. Whether a claim was checked.
#[allow(clippy::too_many_arguments)]
fn instance(
    op: usize,
    (rows, cols, k): (usize, usize, usize),
    dim: usize,
    (px, pi, ps): (P, P, P),
    seed: u64,
) -> Result<bool, TestCaseError> {
    let xs = vec![rows, cols];
    let mut ss = xs.clone();
    ss[dim] = k;
    let has_src = op < 2;
    let (xl, il, sl) = (local(&xs, px), local(&[k], pi), local(&ss, ps));
    // Only local programs the operator accepts: the index as long as the source's `dim`.
    if has_src && il[0] != sl[dim] {
        return Ok(false);
    }
    let graph = |x: &[usize], i: &[usize], s: &[usize]| {
        let call = match op {
            0 => format!("torch.ops.aten.index_add.default(x, {dim}, i, s)"),
            1 => format!("torch.ops.aten.index_copy.default(x, {dim}, i, s)"),
            _ => format!("torch.ops.aten.index_fill.int_Scalar(x, {dim}, i, 2.5)"),
        };
        let src = if has_src {
            format!(", s: {}", ty("f64", s))
        } else {
            String::new()
        };
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: {}, i: {}{src}):\n        out: {} = {call}\n        return (out,)\n",
            ty("f64", x),
            ty("i64", i),
            ty("f64", x)
        )
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), graph(&xs, &[k], &ss)).unwrap();
    for r in 0..N {
        std::fs::write(dir.path().join(format!("r{r}.py")), graph(&xl, &il, &sl)).unwrap();
    }
    let mut inputs = vec![
        format!("  x: {{ tp: {} }}", placement(px)),
        format!("  i: {{ tp: {} }}", placement(pi)),
    ];
    if has_src {
        inputs.push(format!("  s: {{ tp: {} }}", placement(ps)));
    }
    let yaml = format!(
        "version: 1\nname: index\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {N} }}\n  graphs: [r0.py, r1.py]\ninputs:\n{}\noutputs: {{}}\n",
        inputs.join("\n")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    // Pieces the operator does not take (a source not shaped as `self` but for `dim`): no
    // program to check.
    let Ok(prop) = propagate(&case) else {
        return Ok(false);
    };
    let out_node = |g: &shardproof_ir::Graph| g.nodes.iter().position(|n| n.name == "out").unwrap();
    let places: Vec<Place> = (0..N)
        .map(|r| prop.ranks[r].of(ValueId::new(out_node(&case.program.ranks[r]), 0), 1)[0])
        .collect();
    // Values: distinct positions (index_copy of repeated positions is any of the writes).
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(&xs, &mut rng);
    let s = random(&ss, &mut rng);
    let mut pos: Vec<usize> = (0..xs[dim]).collect();
    pos.shuffle(&mut rng);
    let idx: Vec<f64> = pos[..k].iter().map(|&p| p as f64).collect();
    let leaves =
        |x: Vec<f64>, xs: &[usize], i: Vec<f64>, is: &[usize], s: Vec<f64>, ss: &[usize]| {
            let mut m = BTreeMap::new();
            m.insert(
                "x".to_string(),
                Tensor::new(Meta::new(DType::F64, xs.to_vec()), x),
            );
            m.insert(
                "i".to_string(),
                Tensor::new(Meta::new(DType::I64, is.to_vec()), i),
            );
            if has_src {
                m.insert(
                    "s".to_string(),
                    Tensor::new(Meta::new(DType::F64, ss.to_vec()), s),
                );
            }
            m
        };
    let cfg = RunConfig::default();
    let run = |g: &shardproof_ir::Graph, l: BTreeMap<String, Tensor>| -> Option<Vec<f64>> {
        let env = run_graph(g, &l, &cfg).ok()?;
        Some(env.get(ValueId::new(out_node(g), 0))?.data.to_vec())
    };
    let want = run(
        &case.spec,
        leaves(
            x.data.to_vec(),
            &xs,
            idx.clone(),
            &[k],
            s.data.to_vec(),
            &ss,
        ),
    )
    .unwrap();
    // A rank whose piece of `self` lacks a global position the index names fails: no
    // values to compare (the checker makes no claim there either: `Shard(dim)` is `Varying`).
    let Some(got) = (0..N)
        .map(|r| {
            run(
                &case.program.ranks[r],
                leaves(
                    piece(&x.data, &xs, px, r),
                    &xl,
                    piece(&idx, &[k], pi, r),
                    &il,
                    piece(&s.data, &ss, ps, r),
                    &sl,
                ),
            )
        })
        .collect::<Option<Vec<Vec<f64>>>>()
    else {
        prop_assert!(
            matches!(places[0], Place::Varying | Place::Unknown),
            "op {op}: a claim on a program the ranks cannot run: {:?}",
            places
        );
        return Ok(false);
    };
    let what = format!(
        "op {op} [{rows}, {cols}] dim {dim} k {k} self {px:?} index {pi:?} source {ps:?}: {places:?}"
    );
    let place = places[0];
    prop_assert!(places.iter().all(|&p| p == place), "{}", what);
    match place {
        Place::Shard(d) => {
            prop_assert!(close(&concat(&got, &xl, d as usize), &want), "{}", what)
        }
        Place::Replicate => {
            for g in &got {
                prop_assert!(close(g, &want), "{}", what);
            }
        }
        Place::Partial(Red::Sum) => {
            let sum: Vec<f64> = (0..want.len())
                .map(|j| got.iter().map(|g| g[j]).sum())
                .collect();
            prop_assert!(close(&sum, &want), "{}", what);
        }
        Place::Varying | Place::Unknown => return Ok(false),
        p => prop_assert!(false, "{}: unexpected {}", what, p),
    }
    Ok(true)
}

fn p() -> impl Strategy<Value = P> {
    prop_oneof![Just(None), Just(Some(0)), Just(Some(1))]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x0044_0063),
        ..ProptestConfig::default()
    })]

    #[test]
    fn index_placements_agree_with_the_interpreter(
        op in 0usize..3,
        rows in prop_oneof![Just(2usize), Just(4)],
        cols in prop_oneof![Just(2usize), Just(4)],
        k in prop_oneof![Just(2usize), Just(4)],
        dim in 0usize..2,
        px in p(),
        pi in prop_oneof![Just(None), Just(Some(0))],
        ps in p(),
        seed in any::<u64>(),
    ) {
        let size = if dim == 0 { rows } else { cols };
        if k <= size {
            instance(op, (rows, cols, k), dim, (px, pi, ps), seed)?;
        }
    }
}

/// A sharded index with as many local entries as `self`'s local rows: before, `index_fill`
/// kept `self`'s `Shard(0)`, though each rank fills other columns. (For `index_add` and
/// `index_copy` the source's `dim` has the index's length, so a consistent program with a
/// sharded index shards the source along `dim`, never alike `self`.)
#[test]
fn a_sharded_index_keeps_no_shard_of_self() {
    // k = 4 over tp=2: 2 local entries, as many as the 2 local rows of `self`.
    let r = instance(2, (4, 4, 4), 1, (Some(0), Some(0), None), 7);
    assert!(r.is_ok(), "{r:?}");
}

/// The rows of `self`, the source's same rows and a replicated index: every rank writes the
/// same positions of its own rows, a shard the checker keeps (and the interpreter confirms).
#[test]
fn a_replicated_index_keeps_the_rows_shard() {
    for op in 0..3 {
        let src = if op < 2 { Some(0) } else { None };
        let checked = instance(op, (4, 4, 2), 1, (Some(0), None, src), 11);
        assert!(matches!(checked, Ok(true)), "op {op}: {checked:?}");
    }
}
