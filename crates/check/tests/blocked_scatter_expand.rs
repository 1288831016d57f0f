//! `scatter` and `expand` of blocked shards (`Shard(d, blocks=k)`, DTensor's `_StridedShard`)
//! agree with the interpreter (issue 44: DeepSeek `tp=2` with sequence parallelism, whose
//! expert dispatch scatters into a zero `[16, 4]` at indices held as `Shard(0, blocks=4)`,
//! and expands a `Shard(1, blocks=4)` weight from `[1, 16, 16]` to `[4, 16, 16]`).
//!
//! A blocked shard is made as in the plans: a view merging `[k, m, ..]` whose dim 1 is
//! `Shard(1)` (`[k, m*n, ..]` in the spec) into `[k*m, ..]`. Over tp=2 the ranks run the
//! operator on their pieces and the spec on the whole tensors; where the checker infers a
//! shard (plain or blocked) for the output, the ranks' outputs, put back block by block, must
//! be the spec's; `Replicate()` must be the spec's on every rank. The planted wrong variants
//! (layouts that do not match) are shown wrong by the interpreter and never hold.

use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, concat, random};

const N: usize = 2;

/// How an input of the scatter is laid out over tp.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lay {
    /// `[k, m, c]` sharded on dim 1, viewed as `[k*m, c]`: `Shard(0, blocks=k)`.
    Blocked,
    /// `[k*m, c]` sharded on dim 0: a plain `Shard(0)` (another layout of the same rows).
    Plain,
    /// The same `[k*m, c]` tensor on every rank (the spec's at the local size).
    Replicated,
    /// (`self` only) `zeros` made on each rank, at the spec's size in the spec.
    Zeros,
}

/// Rank `r`'s piece of a row-major `[rows, cols]` tensor laid out `lay` in `k` blocks.
fn piece(t: &[f64], rows: usize, cols: usize, k: usize, lay: Lay, r: usize) -> Vec<f64> {
    let rows_in = |blocks: usize| -> Vec<f64> {
        let per = rows / blocks / N;
        (0..blocks)
            .flat_map(|b| {
                let start = (b * N + r) * per * cols;
                t[start..start + per * cols].to_vec()
            })
            .collect()
    };
    match lay {
        Lay::Blocked => rows_in(k),
        Lay::Plain => rows_in(1),
        Lay::Replicated | Lay::Zeros => t.to_vec(),
    }
}

/// The ranks' `[rows/n, ..]` outputs put back as a shard of dim `d` in `k` blocks.
fn unblock(parts: &[Vec<f64>], local: &[usize], d: usize, k: usize) -> Vec<f64> {
    let mut split = local.to_vec();
    split[d] /= k;
    split.insert(d, k);
    concat(parts, &split, d + 1)
}

fn ty(dtype: &str, s: &[usize]) -> String {
    format!("\"{dtype}{s:?}\"")
}

/// The graph of one side: the inputs' parameters and views, then the scatter `op` (0
/// `scatter.src`, 1 `scatter.value`, 2 `scatter_add`) along dim 1 as `out`. `m` is the local
/// (or the spec's) rows per block.
fn scatter_graph(op: usize, lays: [Lay; 3], k: usize, m: usize, c: usize, j: usize) -> String {
    let mut params = Vec::new();
    let mut body = Vec::new();
    for (name, lay, cols, dt) in [
        ("x", lays[0], c, "f64"),
        ("i", lays[1], j, "i64"),
        ("s", lays[2], j, "f64"),
    ] {
        if name == "s" && op == 1 {
            continue;
        }
        let rows = k * m;
        match lay {
            Lay::Blocked => {
                params.push(format!("{name}3: {}", ty(dt, &[k, m, cols])));
                body.push(format!(
                    "{name}: {} = torch.ops.aten.view.default({name}3, [{rows}, {cols}])",
                    ty(dt, &[rows, cols])
                ));
            }
            Lay::Zeros => body.push(format!(
                "{name}: {} = torch.ops.aten.zeros.default([{rows}, {cols}], dtype = torch.float64, device = device(type='cpu'), pin_memory = False)",
                ty(dt, &[rows, cols])
            )),
            Lay::Plain | Lay::Replicated => {
                params.push(format!("{name}: {}", ty(dt, &[rows, cols])))
            }
        }
    }
    let call = match op {
        0 => "torch.ops.aten.scatter.src(x, 1, i, s)",
        1 => "torch.ops.aten.scatter.value(x, 1, i, 2.5)",
        _ => "torch.ops.aten.scatter_add.default(x, 1, i, s)",
    };
    body.push(format!("out: {} = {call}", ty("f64", &[k * m, c])));
    common::hand::graph_module(&params, &body)
}

/// Writes and loads a case of `spec` and the two ranks' `rank` graph; `inputs` and
/// `outputs` are the yaml entries.
fn load(spec: &str, rank: &str, inputs: &[String], outputs: &str) -> shardproof_case::Case {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..N {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank).unwrap();
    }
    let yaml = format!(
        "version: 1\nname: blocked\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {N} }}\n  graphs: [r0.py, r1.py]\ninputs:\n{}\noutputs: {outputs}\n",
        inputs.join("\n")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_or_else(|e| panic!("{e}"))
}

/// The placement each rank's propagation gives the node named `out` (one mesh dim).
fn out_places(case: &shardproof_case::Case) -> Vec<Place> {
    let prop = propagate(case).unwrap_or_else(|e| panic!("{e}"));
    let oi = case.program.ranks[0]
        .nodes
        .iter()
        .position(|nd| nd.name == "out")
        .unwrap();
    prop.ranks
        .iter()
        .map(|r| r.of(ValueId::new(oi, 0), 1)[0])
        .collect()
}

fn out_of(g: &shardproof_ir::Graph, leaves: &BTreeMap<String, Tensor>) -> Option<Vec<f64>> {
    let i = g.nodes.iter().position(|nd| nd.name == "out")?;
    let env = run_graph(g, leaves, &RunConfig::default()).ok()?;
    Some(env.get(ValueId::new(i, 0))?.data.to_vec())
}

/// What one scatter instance gives: the checker's output placement, the spec's value (`None`
/// where the spec does not run: a replicated `self` too small for the whole index) and the
/// ranks' values.
struct Ran {
    place: Place,
    want: Option<Vec<f64>>,
    got: Vec<Vec<f64>>,
    local: Vec<usize>,
    case: shardproof_case::Case,
}

/// Builds and runs one scatter instance: `k` blocks of `m` local rows, `c` columns, `j`
/// distinct positions per row.
#[allow(clippy::too_many_arguments)]
fn scatter_instance(
    op: usize,
    lays: [Lay; 3],
    (k, m, c, j): (usize, usize, usize, usize),
    outputs: &str,
    seed: u64,
) -> Ran {
    let g = k * m * N;
    // The spec's rows: a replicated input is the same tensor at the local size there too.
    let spec_m = |lay: Lay| if lay == Lay::Replicated { m } else { m * N };
    let spec_lays = lays;
    let mut spec_text = scatter_graph(op, spec_lays, k, m * N, c, j);
    // A replicated input keeps its local shape in the spec.
    for (name, lay, cols, dt) in [
        ("x", lays[0], c, "f64"),
        ("i", lays[1], j, "i64"),
        ("s", lays[2], j, "f64"),
    ] {
        if lay == Lay::Replicated {
            spec_text = spec_text.replace(
                &format!("{name}: {}", ty(dt, &[g, cols])),
                &format!("{name}: {}", ty(dt, &[spec_m(lay) * k, cols])),
            );
        }
    }
    let rank_text = scatter_graph(op, lays, k, m, c, j);
    let mut inputs = Vec::new();
    for (name, lay) in [("x", lays[0]), ("i", lays[1]), ("s", lays[2])] {
        if name == "s" && op == 1 {
            continue;
        }
        match lay {
            Lay::Blocked => inputs.push(format!("  {name}3: {{ tp: Shard(1) }}")),
            Lay::Plain => inputs.push(format!("  {name}: {{ tp: Shard(0) }}")),
            Lay::Replicated => inputs.push(format!("  {name}: {{ tp: Replicate() }}")),
            Lay::Zeros => {}
        }
    }
    let case = load(&spec_text, &rank_text, &inputs, outputs);
    let places = out_places(&case);
    let place = places[0];
    assert_eq!(places[1], place);
    // Values: the spec's tensors, each rank's piece of them.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(&[g, c], &mut rng).data.to_vec();
    let s = random(&[g, j], &mut rng).data.to_vec();
    let idx: Vec<f64> = (0..g)
        .flat_map(|_| {
            let mut pos: Vec<usize> = (0..c).collect();
            pos.shuffle(&mut rng);
            pos[..j].iter().map(|&p| p as f64).collect::<Vec<_>>()
        })
        .collect();
    let tensor = |name: &str, lay: Lay, rows: usize, cols: usize, data: Vec<f64>| {
        let dt = if name == "i" { DType::I64 } else { DType::F64 };
        let (key, shape) = match lay {
            Lay::Blocked => (format!("{name}3"), vec![k, rows / k, cols]),
            _ => (name.to_string(), vec![rows, cols]),
        };
        (key, Tensor::new(Meta::new(dt, shape), data))
    };
    let leaves = |rank: Option<usize>| -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (name, lay, cols, data) in [
            ("x", lays[0], c, &x),
            ("i", lays[1], j, &idx),
            ("s", lays[2], j, &s),
        ] {
            if lay == Lay::Zeros || (name == "s" && op == 1) {
                continue;
            }
            // A replicated input: the first rows of the spec's tensor, the same everywhere.
            let whole = if lay == Lay::Replicated {
                data[..k * m * cols].to_vec()
            } else {
                data.clone()
            };
            let (rows, vals) = match (rank, lay) {
                (_, Lay::Replicated) => (k * m, whole),
                (None, _) => (g, whole),
                (Some(r), _) => (k * m, piece(&whole, g, cols, k, lay, r)),
            };
            let (key, t) = tensor(name, lay, rows, cols, vals);
            out.insert(key, t);
        }
        out
    };
    let want = out_of(&case.spec, &leaves(None));
    let got: Vec<Vec<f64>> = (0..N)
        .map(|r| out_of(&case.program.ranks[r], &leaves(Some(r))).expect("a rank runs"))
        .collect();
    Ran {
        place,
        want,
        got,
        local: vec![k * m, c],
        case,
    }
}

/// Whether the ranks' values make up the spec's under `place` (`None`: no claim to test).
fn agrees(ran: &Ran, place: Place) -> Option<bool> {
    let want = ran.want.as_ref();
    Some(match place {
        Place::Replicate => want.is_some_and(|w| ran.got.iter().all(|g| close(g, w))),
        p => {
            let (d, k) = p.blocks()?;
            want.is_some_and(|w| close(&unblock(&ran.got, &ran.local, d, k), w))
        }
    })
}

fn lay() -> impl Strategy<Value = Lay> {
    prop_oneof![Just(Lay::Blocked), Just(Lay::Plain), Just(Lay::Replicated)]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 160,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0045),
        ..ProptestConfig::default()
    })]

    /// Every claim the checker makes about a scatter of blocked (or mixed) inputs is what the
    /// interpreter computes.
    #[test]
    fn scatter_claims_agree_with_the_interpreter(
        op in 0usize..3,
        x in prop_oneof![lay(), Just(Lay::Zeros)],
        i in lay(),
        s in lay(),
        (k, m, c) in (2usize..=3, 1usize..=2, 2usize..=4),
        jj in 1usize..=4,
        seed in any::<u64>(),
    ) {
        let j = jj.min(c);
        // Zeros beside a replicated index are a replicated zero of the local size (the
        // checker's `Replicate()`, as before this rule); this harness sizes the spec's zeros
        // as a shard's, which is another program.
        prop_assume!(!(x == Lay::Zeros && i == Lay::Replicated));
        let ran = scatter_instance(op, [x, i, s], (k, m, c, j), "{}", seed);
        if let Some(ok) = agrees(&ran, ran.place) {
            prop_assert!(ok, "{op} {:?} k={k} m={m} c={c} j={j}: claimed {}", [x, i, s], ran.place);
        }
    }
}

/// The dispatch's shape: zeros scattered at blocked indices and sources is the same blocked
/// shard, which the interpreter confirms (before: `Varying`, the plan inconclusive).
#[test]
fn zeros_scattered_at_blocked_rows_keep_the_blocks() {
    for op in 0..3 {
        let lays = [Lay::Zeros, Lay::Blocked, Lay::Blocked];
        let ran = scatter_instance(op, lays, (4, 2, 4, 2), "{ out: { tp: Shard(0) } }", 7);
        assert_eq!(ran.place, Place::Blocked(0, 4), "op {op}");
        assert_eq!(agrees(&ran, ran.place), Some(true), "op {op}");
        let ran = scatter_instance(op, [Lay::Blocked; 3], (3, 1, 3, 2), "{}", 8);
        assert_eq!(ran.place, Place::Blocked(0, 3), "op {op}");
        assert_eq!(agrees(&ran, ran.place), Some(true), "op {op}");
    }
}

/// Planted: `self` a plain `Shard(0)` beside blocked indices and sources of the same local
/// size. Each rank scatters other rows into its piece: neither layout makes up the spec's
/// value (run-confirmed), and the checker claims neither.
#[test]
fn a_plain_self_beside_blocked_rows_is_never_a_shard() {
    let lays = [Lay::Plain, Lay::Blocked, Lay::Blocked];
    for declared in ["{ tp: Shard(0) }", "{ placement: Shard(0), blocks: 2 }"] {
        let ran = scatter_instance(0, lays, (2, 2, 4, 2), &format!("{{ out: {declared} }}"), 3);
        assert_eq!(agrees(&ran, Place::Shard(0)), Some(false));
        assert_eq!(agrees(&ran, Place::Blocked(0, 2)), Some(false));
        assert!(
            !matches!(
                ran.place,
                Place::Shard(_) | Place::Blocked(..) | Place::Replicate
            ),
            "{}",
            ran.place
        );
        let report = check_case(&ran.case).unwrap();
        assert_ne!(report.verdict, Verdict::Holds, "{}", report.render());
    }
}

/// The expand: `[1, k, m, c]` sharded on dim 2, viewed as `[1, k*m, c]`
/// (`Shard(1, blocks=k)`), expanded to `[lead.., e, k*m, c]`. Returns the placement, the spec's
/// value, the ranks' values, their local shape and the case.
fn expand_instance((k, m, c, e): (usize, usize, usize, usize), lead: bool, outputs: &str) -> Ran {
    let graph = |m: usize| {
        let rows = k * m;
        let (size, shape) = if lead {
            (format!("[3, {e}, {rows}, {c}]"), vec![3, e, rows, c])
        } else {
            (format!("[{e}, {rows}, {c}]"), vec![e, rows, c])
        };
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, w4: {}):\n        w: {} = torch.ops.aten.view.default(w4, [1, {rows}, {c}])\n        out: {} = torch.ops.aten.expand.default(w, {size})\n        return (out,)\n",
            ty("f64", &[1, k, m, c]),
            ty("f64", &[1, rows, c]),
            ty("f64", &shape)
        )
    };
    let case = load(
        &graph(m * N),
        &graph(m),
        &["  w4: { tp: Shard(2) }".to_string()],
        outputs,
    );
    let place = out_places(&case)[0];
    let mut rng = ChaCha8Rng::seed_from_u64((k * 100 + m * 10 + c) as u64);
    let whole = random(&[1, k, m * N, c], &mut rng);
    let mut leaves = BTreeMap::new();
    leaves.insert("w4".to_string(), whole.clone());
    let want = out_of(&case.spec, &leaves);
    let got = (0..N)
        .map(|r| {
            // Rank r's piece of dim 2: rows r*m .. (r+1)*m of every block.
            let data: Vec<f64> = (0..k)
                .flat_map(|b| {
                    let start = (b * m * N + r * m) * c;
                    whole.data[start..start + m * c].to_vec()
                })
                .collect();
            let mut l = BTreeMap::new();
            l.insert(
                "w4".to_string(),
                Tensor::new(Meta::new(DType::F64, vec![1, k, m, c]), data),
            );
            out_of(&case.program.ranks[r], &l).expect("a rank runs")
        })
        .collect();
    let local = if lead {
        vec![3, e, k * m, c]
    } else {
        vec![e, k * m, c]
    };
    Ran {
        place,
        want,
        got,
        local,
        case,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0046),
        ..ProptestConfig::default()
    })]

    /// An expand of a blocked shard along other dims keeps the blocks (moved by the new
    /// leading dims), as the interpreter computes.
    #[test]
    fn expand_claims_agree_with_the_interpreter(
        (k, m, c, e) in (2usize..=4, 1usize..=2, 1usize..=3, 1usize..=4),
        lead in any::<bool>(),
    ) {
        let ran = expand_instance((k, m, c, e), lead, "{}");
        let d = if lead { 2 } else { 1 };
        prop_assert_eq!(ran.place, Place::Blocked(d, k as u16));
        prop_assert_eq!(agrees(&ran, ran.place), Some(true));
    }
}

/// Planted: the expanded blocked shard declared a plain `Shard(1)`. The ranks' outputs
/// concatenated along dim 1 are not the spec's (run-confirmed); the check does not hold.
#[test]
fn an_expanded_blocked_shard_declared_plain_does_not_hold() {
    let ran = expand_instance((4, 1, 2, 4), false, "{ out: { tp: Shard(1) } }");
    assert_eq!(ran.place, Place::Blocked(1, 4));
    assert_eq!(agrees(&ran, Place::Shard(1)), Some(false));
    let report = check_case(&ran.case).unwrap();
    assert_ne!(report.verdict, Verdict::Holds, "{}", report.render());
    assert_eq!(agrees(&ran, Place::Blocked(1, 4)), Some(true));
}
