//! Slices, selects and concatenations of a blocked shard `Shard(0, blocks=k)` agree with the
//! interpreter (issue 44, llama `dp=2,cp=2,tp=2`: the rope halves of the merged `b*h` heads,
//! `[b*h, s, d]` sliced along the head dim and joined again, with the heads over tp and the
//! batch outside them).
//!
//! Over tp=2, `x3` `[k, m, c]` is `Shard(1)`, viewed as `[k*m, c]` (`Shard(0, blocks=k)`);
//! the ranks and the spec run the same operator with the same literals on it. Where the
//! checker claims a shard (plain or blocked) or `Replicate()`, the ranks' outputs must make
//! up the spec's. Planted (the rule's conditions broken): a slice or a select of the blocked
//! dim itself (every rank takes the same local rows, which are other rows of each block than
//! the spec's), and a concatenation along it (each rank's pieces side by side): never a shard.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{propagate, Place};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::values::{close, concat, random, ty};

const N: usize = 2;

/// The operator applied to the blocked `x` `[rows, c]`.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// `slice(x, dim, a, b)`.
    Slice(usize, usize, usize),
    /// `select(x, dim, a)`.
    Select(usize, usize),
    /// `cat([x, x], dim)`.
    Cat(usize),
    /// The rope rotation along dim 1: `cat([neg(x[:, h:]), x[:, :h]], 1)`, `h = c / 2`.
    Rotate,
}

/// One side's graph: `k` blocks of `m` rows (the rank's or the spec's), `c` columns.
fn graph(op: Op, k: usize, m: usize, c: usize) -> String {
    let rows = k * m;
    let mut body = vec![format!(
        "x: {} = torch.ops.aten.view.default(x3, [{rows}, {c}])",
        ty(&[rows, c])
    )];
    let sizes = [rows, c];
    match op {
        Op::Slice(d, a, b) => {
            let mut o = sizes.to_vec();
            o[d] = b - a;
            body.push(format!(
                "out: {} = torch.ops.aten.slice.Tensor(x, {d}, {a}, {b})",
                ty(&o)
            ));
        }
        Op::Select(d, a) => {
            let o = vec![sizes[1 - d]];
            body.push(format!(
                "out: {} = torch.ops.aten.select.int(x, {d}, {a})",
                ty(&o)
            ));
        }
        Op::Cat(d) => {
            let mut o = sizes.to_vec();
            o[d] *= 2;
            body.push(format!(
                "out: {} = torch.ops.aten.cat.default([x, x], {d})",
                ty(&o)
            ));
        }
        Op::Rotate => {
            let h = c / 2;
            body.push(format!(
                "lo: {} = torch.ops.aten.slice.Tensor(x, 1, 0, {h})",
                ty(&[rows, h])
            ));
            body.push(format!(
                "hi: {} = torch.ops.aten.slice.Tensor(x, 1, {h}, {c})",
                ty(&[rows, c - h])
            ));
            body.push(format!(
                "nh: {} = torch.ops.aten.neg.default(hi)",
                ty(&[rows, c - h])
            ));
            body.push(format!(
                "out: {} = torch.ops.aten.cat.default([nh, lo], 1)",
                ty(&[rows, c])
            ));
        }
    }
    common::hand::graph_module(&[format!("x3: {}", ty(&[k, m, c]))], &body)
}

/// One instance: the checker's placement of `out` (the same on both ranks), the spec's value
/// and the ranks' values with their shapes.
struct Ran {
    place: Place,
    want: Option<Vec<f64>>,
    got: Vec<(Vec<f64>, Vec<usize>)>,
}

impl Ran {
    /// Whether the ranks' values make up the spec's under `place` (`None`: no claim to test).
    fn agrees(&self, place: Place) -> Option<bool> {
        let want = self.want.as_ref();
        match place {
            Place::Replicate => {
                Some(want.is_some_and(|w| self.got.iter().all(|(g, _)| close(g, w))))
            }
            p => p.blocks().map(|(d, kk)| {
                let mut split = self.got[0].1.clone();
                if d >= split.len() || !split[d].is_multiple_of(kk) {
                    return false;
                }
                split[d] /= kk;
                split.insert(d, kk);
                let parts: Vec<Vec<f64>> = self.got.iter().map(|(g, _)| g.clone()).collect();
                want.is_some_and(|w| close(&concat(&parts, &split, d + 1), w))
            }),
        }
    }
}

/// Builds, checks and runs one instance: `k` blocks of `m` local rows, `c` columns.
fn instance(op: Op, k: usize, m: usize, c: usize, seed: u64) -> Ran {
    instance_per_rank(op, [op; N], k, m, c, seed)
}

/// [`instance`] with the spec running `op` and rank `r` running `ops[r]`.
fn instance_per_rank(op: Op, ops: [Op; N], k: usize, m: usize, c: usize, seed: u64) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), graph(op, k, m * N, c)).unwrap();
    for (r, o) in ops.iter().enumerate() {
        std::fs::write(dir.path().join(format!("r{r}.py")), graph(*o, k, m, c)).unwrap();
    }
    let yaml = format!(
        "version: 1\nname: blocked-slices\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {N} }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x3: {{ tp: Shard(1) }}\noutputs: {{}}\n"
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let prop = propagate(&case).unwrap();
    let oi = case.program.ranks[0]
        .nodes
        .iter()
        .position(|nd| nd.name == "out")
        .unwrap();
    let places: Vec<Place> = prop
        .ranks
        .iter()
        .map(|r| r.of(ValueId::new(oi, 0), 1)[0])
        .collect();
    assert_eq!(places[0], places[1]);
    let place = places[0];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let whole = random(&[k, m * N, c], &mut rng);
    let run = |g: &shardproof_ir::Graph, t: Tensor| -> Option<(Vec<f64>, Vec<usize>)> {
        let i = g.nodes.iter().position(|nd| nd.name == "out")?;
        let leaves: BTreeMap<String, Tensor> = [("x3".to_string(), t)].into();
        let env = run_graph(g, &leaves, &RunConfig::default()).ok()?;
        let o = env.get(ValueId::new(i, 0))?;
        Some((o.data.to_vec(), o.meta.shape.clone()))
    };
    let want = run(&case.spec, whole.clone()).map(|(w, _)| w);
    let got: Vec<(Vec<f64>, Vec<usize>)> = (0..N)
        .map(|r| {
            let data: Vec<f64> = (0..k)
                .flat_map(|b| {
                    let start = (b * m * N + r * m) * c;
                    whole.data[start..start + m * c].to_vec()
                })
                .collect();
            let t = Tensor::new(Meta::new(DType::F64, vec![k, m, c]), data);
            run(&case.program.ranks[r], t).expect("a rank runs")
        })
        .collect();
    Ran { place, want, got }
}

fn op(k: usize, m: usize, c: usize) -> impl Strategy<Value = Op> {
    let rows = k * m;
    prop_oneof![
        (0..c, 1..=c).prop_map(move |(a, b)| Op::Slice(1, a.min(b - 1), b)),
        (0..rows, 1..=rows).prop_map(move |(a, b)| Op::Slice(0, a.min(b - 1), b)),
        (0..c).prop_map(|a| Op::Select(1, a)),
        (0..rows).prop_map(|a| Op::Select(0, a)),
        (0usize..2).prop_map(Op::Cat),
        Just(Op::Rotate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0044),
        ..ProptestConfig::default()
    })]

    /// Every claim the checker makes about a slice, select or concatenation of a blocked
    /// shard (one block: a plain shard) is what the interpreter computes.
    #[test]
    fn blocked_slice_claims_agree_with_the_interpreter(
        (k, m, c, o, seed) in (1usize..=3, 1usize..=2, 2usize..=4)
            .prop_flat_map(|(k, m, c)| (Just(k), Just(m), Just(c), op(k, m, c), any::<u64>()))
    ) {
        let ran = instance(o, k, m, c, seed);
        if let Some(ok) = ran.agrees(ran.place) {
            prop_assert!(ok, "{o:?} k={k} m={m} c={c}: claimed {}", ran.place);
        }
    }
}

/// The rope halves and any slice, select or join of another dim keep the blocks, and the
/// interpreter confirms it (before: `Varying`, llama `dp=2,cp=2,tp=2` inconclusive).
#[test]
fn slices_and_joins_of_another_dim_keep_the_blocks() {
    for o in [Op::Rotate, Op::Slice(1, 1, 3), Op::Cat(1), Op::Select(1, 2)] {
        let ran = instance(o, 2, 2, 4, 5);
        assert_eq!(ran.place, Place::Blocked(0, 2), "{o:?}");
        assert_eq!(ran.agrees(ran.place), Some(true), "{o:?}");
    }
}

/// Planted: a part of the blocked dim itself, or the pieces joined along it. The ranks'
/// values make up no blocked shard of the spec's (run-confirmed), and the checker claims none.
#[test]
fn a_slice_or_join_of_the_blocked_dim_is_never_a_shard() {
    for o in [Op::Slice(0, 0, 2), Op::Slice(0, 1, 3), Op::Cat(0)] {
        let ran = instance(o, 2, 2, 4, 6);
        for claim in [Place::Blocked(0, 2), Place::Shard(0)] {
            assert_eq!(ran.agrees(claim), Some(false), "{o:?} as {claim}");
        }
        assert!(
            !matches!(
                ran.place,
                Place::Shard(_) | Place::Blocked(..) | Place::Replicate
            ),
            "{o:?}: claimed {}",
            ran.place
        );
    }
}

/// Planted: each rank slices another column range of the head dim (rank-dependent bounds
/// along a dim the blocks do not shard): the ranks' pieces are no blocked shard of the spec's
/// slice (run-confirmed), and the checker claims none.
#[test]
fn rank_dependent_slices_of_another_dim_are_never_a_shard() {
    let ran = instance_per_rank(
        Op::Slice(1, 0, 2),
        [Op::Slice(1, 0, 2), Op::Slice(1, 2, 4)],
        2,
        2,
        4,
        8,
    );
    assert_eq!(ran.agrees(Place::Blocked(0, 2)), Some(false));
    assert!(
        !matches!(
            ran.place,
            Place::Shard(_) | Place::Blocked(..) | Place::Replicate
        ),
        "claimed {}",
        ran.place
    );
}

/// Planted: a plain shard (one block) sliced from 0 to its local length, the spec taking the
/// same literals: each rank keeps its whole piece, the spec only the first rows of the global
/// dim. The ranks' values are no shard of the spec's (run-confirmed), and the checker claims
/// none (before: `Shard(0)`, from the local lengths alone).
#[test]
fn a_slice_ending_at_the_local_length_is_no_shard_of_the_spec_slice() {
    let ran = instance(Op::Slice(0, 0, 2), 1, 2, 4, 9);
    assert_eq!(ran.agrees(Place::Shard(0)), Some(false));
    assert!(
        !matches!(
            ran.place,
            Place::Shard(_) | Place::Blocked(..) | Place::Replicate
        ),
        "claimed {}",
        ran.place
    );
}
