//! `gather` of blocked shards (`Shard(d, blocks=k)`) agrees with the interpreter (issue 44:
//! DeepSeek `tp=2` with sequence parallelism gathers the router's `[16, 4]` scores, held as
//! `Shard(0, blocks=4)`, along dim 1 at `[16, 2]` top-k indices held alike).
//!
//! A blocked shard is made as in the plans: a view merging `[k, m, c]` whose dim 1 is
//! `Shard(1)` (`[k, m*n, c]` in the spec) into `[k*m, c]`. Over tp=2 the ranks gather their
//! pieces and the spec the whole tensors; where the checker infers a shard (plain or
//! blocked) for the output, the ranks' outputs, put back block by block, must be the spec's;
//! `Replicate()` must be the spec's on every rank. The planted wrong variants (layouts whose
//! rows do not pair) are shown wrong by the interpreter and never hold.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, concat, random};

const N: usize = 2;

/// How an operand of the gather is laid out over tp.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lay {
    /// `[k, m, cols]` sharded on dim 1, viewed as `[k*m, cols]`: `Shard(0, blocks=k)`.
    Blocked,
    /// `[k*m, cols]` sharded on dim 0: a plain `Shard(0)` (another layout of the same rows).
    Plain,
    /// The same `[k*m, cols]` tensor on every rank (the spec's first rows, its local size).
    Replicated,
}

fn ty(dtype: &str, s: &[usize]) -> String {
    format!("\"{dtype}{s:?}\"")
}

/// One side's graph: `x` (`[k*m, c]`) gathered along `dim` at `i` (`[k*m, j]`), as `out`.
/// `m` is the local (or the spec's) rows per block.
fn graph(lays: [Lay; 2], dim: usize, k: usize, m: usize, (c, j): (usize, usize)) -> String {
    let rows = k * m;
    let mut params = Vec::new();
    let mut body = Vec::new();
    for (name, lay, cols, dt) in [("x", lays[0], c, "f64"), ("i", lays[1], j, "i64")] {
        match lay {
            Lay::Blocked => {
                params.push(format!("{name}3: {}", ty(dt, &[k, m, cols])));
                body.push(format!(
                    "{name}: {} = torch.ops.aten.view.default({name}3, [{rows}, {cols}])",
                    ty(dt, &[rows, cols])
                ));
            }
            Lay::Plain | Lay::Replicated => {
                params.push(format!("{name}: {}", ty(dt, &[rows, cols])))
            }
        }
    }
    body.push(format!(
        "out: {} = torch.ops.aten.gather.default(x, {dim}, i)",
        ty("f64", &[rows, j])
    ));
    common::hand::graph_module(&params, &body)
}

/// Rank `r`'s piece of a row-major `[rows, cols]` tensor laid out `lay` in `k` blocks.
fn piece(t: &[f64], rows: usize, cols: usize, k: usize, lay: Lay, r: usize) -> Vec<f64> {
    let blocks = match lay {
        Lay::Blocked => k,
        Lay::Plain => 1,
        Lay::Replicated => return t.to_vec(),
    };
    let per = rows / blocks / N;
    (0..blocks)
        .flat_map(|b| {
            let start = (b * N + r) * per * cols;
            t[start..start + per * cols].to_vec()
        })
        .collect()
}

/// One instance, run: the checker's verdict and placement of `out`, the spec's value (`None`
/// where the spec does not run: a replicated operand of the local rows beside the whole dim)
/// and the ranks' values.
struct Ran {
    verdict: Verdict,
    place: Place,
    want: Option<Vec<f64>>,
    got: Vec<Vec<f64>>,
    local: Vec<usize>,
}

fn instance(
    lays: [Lay; 2],
    dim: usize,
    (k, m, c, j): (usize, usize, usize, usize),
    outputs: &str,
    seed: u64,
) -> Ran {
    let g = k * m * N;
    let mut spec = graph(lays, dim, k, m * N, (c, j));
    // A replicated operand keeps its local shape in the spec.
    for (name, lay, cols, dt) in [("x", lays[0], c, "f64"), ("i", lays[1], j, "i64")] {
        if lay == Lay::Replicated {
            spec = spec.replace(
                &format!("{name}: {}", ty(dt, &[g, cols])),
                &format!("{name}: {}", ty(dt, &[k * m, cols])),
            );
        }
    }
    let rank = graph(lays, dim, k, m, (c, j));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), &spec).unwrap();
    for r in 0..N {
        std::fs::write(dir.path().join(format!("r{r}.py")), &rank).unwrap();
    }
    let inputs: Vec<String> = [("x", lays[0]), ("i", lays[1])]
        .iter()
        .map(|&(name, lay)| match lay {
            Lay::Blocked => format!("  {name}3: {{ tp: Shard(1) }}"),
            Lay::Plain => format!("  {name}: {{ tp: Shard(0) }}"),
            Lay::Replicated => format!("  {name}: {{ tp: Replicate() }}"),
        })
        .collect();
    let yaml = format!(
        "version: 1\nname: gather\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {N} }}\n  graphs: [r0.py, r1.py]\ninputs:\n{}\noutputs: {outputs}\n",
        inputs.join("\n")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case =
        shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let verdict = check_case(&case).unwrap_or_else(|e| panic!("{e}")).verdict;
    let prop = propagate(&case).unwrap_or_else(|e| panic!("{e}"));
    let oi = case.program.ranks[0]
        .nodes
        .iter()
        .position(|nd| nd.name == "out")
        .unwrap();
    let place = prop.ranks[0].of(ValueId::new(oi, 0), 1)[0];
    assert_eq!(prop.ranks[1].of(ValueId::new(oi, 0), 1)[0], place);
    // Values: the spec's; positions below the local size along `dim`, so every side runs.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(&[g, c], &mut rng).data.to_vec();
    let bound = if dim == 0 { k * m } else { c };
    let idx: Vec<f64> = (0..g * j)
        .map(|_| rng.random_range(0..bound) as f64)
        .collect();
    let leaves = |rank: Option<usize>| -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (name, lay, cols, data, dt) in [
            ("x", lays[0], c, &x, DType::F64),
            ("i", lays[1], j, &idx, DType::I64),
        ] {
            let (rows, vals) = match (rank, lay) {
                // A replicated operand: the spec's first rows, the same everywhere.
                (_, Lay::Replicated) => (k * m, data[..k * m * cols].to_vec()),
                (None, _) => (g, data.clone()),
                (Some(r), _) => (k * m, piece(data, g, cols, k, lay, r)),
            };
            let (key, shape) = match lay {
                Lay::Blocked => (format!("{name}3"), vec![k, rows / k, cols]),
                _ => (name.to_string(), vec![rows, cols]),
            };
            out.insert(key, Tensor::new(Meta::new(dt, shape), vals));
        }
        out
    };
    let run = |gr: &shardproof_ir::Graph, l: BTreeMap<String, Tensor>| -> Option<Vec<f64>> {
        let env = run_graph(gr, &l, &RunConfig::default()).ok()?;
        Some(env.get(ValueId::new(oi, 0))?.data.to_vec())
    };
    let want = run(&case.spec, leaves(None));
    let got = (0..N)
        .map(|r| run(&case.program.ranks[r], leaves(Some(r))).expect("a rank runs"))
        .collect();
    Ran {
        verdict,
        place,
        want,
        got,
        local: vec![k * m, j],
    }
}

/// Whether the ranks' values make up the spec's under `place` (`None`: no claim to test).
fn agrees(ran: &Ran, place: Place) -> Option<bool> {
    let want = ran.want.as_ref();
    Some(match place {
        Place::Replicate => want.is_some_and(|w| ran.got.iter().all(|g| close(g, w))),
        p => {
            let (d, k) = p.blocks()?;
            let mut split = ran.local.clone();
            split[d] /= k;
            split.insert(d, k);
            want.is_some_and(|w| close(&concat(&ran.got, &split, d + 1), w))
        }
    })
}

fn lay() -> impl Strategy<Value = Lay> {
    prop_oneof![Just(Lay::Blocked), Just(Lay::Plain), Just(Lay::Replicated)]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 120,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0046),
        ..ProptestConfig::default()
    })]

    /// Every claim the checker makes about a gather of blocked (or mixed) operands is what
    /// the interpreter computes.
    #[test]
    fn gather_claims_agree_with_the_interpreter(
        x in lay(),
        i in lay(),
        dim in 0usize..2,
        (k, m, c) in (2usize..=3, 1usize..=2, 2usize..=4),
        jj in 1usize..=4,
        seed in any::<u64>(),
    ) {
        let ran = instance([x, i], dim, (k, m, c, jj.min(c)), "{}", seed);
        if let Some(ok) = agrees(&ran, ran.place) {
            prop_assert!(ok, "{:?} dim {dim} k={k} m={m} c={c}: claimed {}", [x, i], ran.place);
        }
    }
}

/// The router's shape: scores and top-k indices both `Shard(0, blocks=4)`, gathered along
/// dim 1, keep the blocks, as the interpreter confirms, and the plan holds (before:
/// `Varying`, inconclusive).
#[test]
fn blocked_scores_gathered_at_blocked_indices_keep_the_blocks() {
    let out = "{ out: { placement: Shard(0), blocks: 4 } }";
    let ran = instance([Lay::Blocked; 2], 1, (4, 2, 4, 2), out, 5);
    assert_eq!(ran.place, Place::Blocked(0, 4));
    assert_eq!(agrees(&ran, ran.place), Some(true));
    assert_eq!(ran.verdict, Verdict::Holds);
}

/// Planted wrong variants, each shown wrong by the interpreter: blocked scores at plain
/// indices (other rows on each rank), and blocked scores gathered along the blocked dim
/// (positions of the whole dim read in the rank's piece). Neither holds, however the output
/// is declared.
#[test]
fn planted_wrong_gathers_never_hold() {
    for (lays, dim) in [([Lay::Blocked, Lay::Plain], 1), ([Lay::Blocked; 2], 0)] {
        for out in [
            "{ out: { placement: Shard(0), blocks: 4 } }",
            "{ out: { tp: Shard(0) } }",
        ] {
            let ran = instance(lays, dim, (4, 2, 4, 2), out, 6);
            assert_eq!(
                agrees(&ran, Place::Blocked(0, 4)),
                Some(false),
                "{lays:?} dim {dim} is not wrong"
            );
            assert_ne!(ran.verdict, Verdict::Holds, "{lays:?} dim {dim} {out}");
        }
    }
}
