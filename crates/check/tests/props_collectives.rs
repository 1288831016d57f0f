//! Property tests of the collective and point-to-point rules against the interpreter
//! (harness: `common/props.rs`): `_c10d_functional` all_reduce, all_gather_into_tensor,
//! reduce_scatter_tensor, all_to_all_single and broadcast, each with its `wait_tensor`, over
//! either mesh dim of `tp=2`, `tp=3` or `dp=2,tp=2`, on inputs of random placements
//! (replicated, sharded, partial sum, average, max); and a ring of `shardproof_p2p` sends and
//! recvs along tp. The spec is the identity (a single-device program's collectives are):
//! every placement inferred for the collective's result and its wait must hold of the values.

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use shardproof_check::{Place, Red};

mod common;
#[path = "common/props.rs"]
mod props;
use props::{config, mesh, run, In, Input, Program, Tally};

/// A collective's rank lines on input `x` over `group` of `n` ranks, defining `c` (the
/// collective's result) and `out` (its wait).
#[derive(Clone, Copy, Debug)]
enum Coll {
    AllReduce(Red),
    AllGather,
    ReduceScatter(Red),
    AllToAll,
    Broadcast,
}

fn lines(coll: Coll, group: &str, n: usize, rows: usize) -> Vec<String> {
    let f = "torch.ops._c10d_functional";
    let c = match coll {
        Coll::AllReduce(r) => format!("c = {f}.all_reduce.default(x, '{}', '{group}')", r.name()),
        Coll::AllGather => format!("c = {f}.all_gather_into_tensor.default(x, {n}, '{group}')"),
        Coll::ReduceScatter(r) => format!(
            "c = {f}.reduce_scatter_tensor.default(x, '{}', {n}, '{group}')",
            r.name()
        ),
        Coll::AllToAll => {
            let splits = vec![(rows / n).to_string(); n].join(", ");
            format!("c = {f}.all_to_all_single.default(x, [{splits}], [{splits}], '{group}')")
        }
        Coll::Broadcast => format!("c = {f}.broadcast.default(x, 0, '{group}')"),
    };
    vec![c, format!("out = {f}.wait_tensor.default(c)")]
}

fn in_place() -> impl Strategy<Value = In> {
    prop_oneof![
        Just(In::R),
        (0..2usize).prop_map(In::S),
        Just(In::P(Red::Sum)),
        Just(In::P(Red::Avg)),
        Just(In::P(Red::Max)),
    ]
}

const REDS: [Red; 4] = [Red::Sum, Red::Avg, Red::Max, Red::Min];

/// The program of `coll` over mesh dim `over` (mod the mesh's rank) on an input `[rows, cols]`
/// per rank, `rows` a multiple of every group size.
fn program(
    coll: Coll,
    mesh: &[usize],
    over: usize,
    a: usize,
    cols: usize,
    places: Vec<In>,
) -> Program {
    let over = over % mesh.len();
    let names = props::mesh_names(mesh);
    let n = mesh[over];
    let rows = a * n;
    Program {
        mesh: mesh.to_vec(),
        inputs: vec![Input::f("x", &[rows, cols], &places[..mesh.len()])],
        spec: vec![
            "c = torch.ops.aten.clone.default(x)".into(),
            "out = torch.ops.aten.clone.default(c)".into(),
        ],
        ranks: vec![lines(coll, names[over], n, rows)],
        checked: vec![("c".into(), "c".into()), ("out".into(), "out".into())],
    }
}

/// `cases` random instances of the collectives `colls` (fixed seed `seed`).
fn property(cases: u32, seed: u64, colls: Vec<Coll>) -> Tally {
    let strategy = (
        proptest::sample::select(colls),
        mesh(),
        0..2usize,
        1..=2usize,
        1..=3usize,
        proptest::collection::vec(in_place(), 2),
        any::<u64>(),
    );
    let mut runner = TestRunner::new(config(cases, seed));
    let tally = std::cell::RefCell::new(Tally::default());
    let result = runner.run(&strategy, |(coll, mesh, over, a, cols, places, seed)| {
        // A broadcast of a shard on its own mesh dim is a known bug (pinned by
        // `a_broadcast_shard_is_no_replica`): drawn only for the other placements.
        if matches!(coll, Coll::Broadcast)
            && matches!(places.get(over % mesh.len()), Some(In::S(_)))
        {
            return Ok(());
        }
        // A gather or scatter of dim 0 over the outer mesh dim while the inner one shards
        // dim 0 too is a known bug (pinned by
        // `a_collective_over_the_outer_mesh_dim_keeps_no_inner_shard_of_dim_0`).
        if matches!(coll, Coll::AllGather | Coll::ReduceScatter(_))
            && mesh.len() == 2
            && over % 2 == 0
            && places[1] == In::S(0)
        {
            return Ok(());
        }
        let prog = program(coll, &mesh, over, a, cols, places);
        let seen = run(&prog, seed).map_err(|e| TestCaseError::fail(format!("{coll:?}: {e}")))?;
        tally.borrow_mut().add(&seen);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = tally.into_inner();
    eprintln!("{t:?}");
    t
}

#[test]
fn all_reduce_placements_agree_with_the_interpreter() {
    let t = property(96, 0x5eed_4411, REDS.map(Coll::AllReduce).to_vec());
    assert!(t.claims > 0, "{t:?}");
}

#[test]
fn all_gather_placements_agree_with_the_interpreter() {
    let t = property(64, 0x5eed_4412, vec![Coll::AllGather]);
    assert!(t.claims > 0, "{t:?}");
}

#[test]
fn reduce_scatter_placements_agree_with_the_interpreter() {
    let t = property(96, 0x5eed_4413, REDS.map(Coll::ReduceScatter).to_vec());
    assert!(t.claims > 0, "{t:?}");
}

#[test]
fn all_to_all_and_broadcast_placements_agree_with_the_interpreter() {
    let t = property(96, 0x5eed_4414, vec![Coll::AllToAll, Coll::Broadcast]);
    assert!(t.claims > 0, "{t:?}");
}

/// The rules' central claims, each checked against the values: a partial completed by the
/// all-reduce of its own reduction is replicated; a shard of dim 0 gathered is replicated;
/// a shard of dim 1 gathered is the stack of its pieces; a partial sum reduce-scattered is a
/// shard of dim 0; over the other mesh dim of a 2-d mesh the placements are kept.
/// A collective, its mesh, the mesh dim it runs over, the input's placement (on every mesh
/// dim) and the placements its wait must be inferred.
type Claim = (Coll, Vec<usize>, usize, In, Vec<Place>);

#[test]
fn each_collective_makes_its_checked_claim() {
    let cases: Vec<Claim> = vec![
        (
            Coll::AllReduce(Red::Sum),
            vec![2],
            0,
            In::P(Red::Sum),
            vec![Place::Replicate],
        ),
        (
            Coll::AllReduce(Red::Max),
            vec![3],
            0,
            In::P(Red::Max),
            vec![Place::Replicate],
        ),
        (
            Coll::AllReduce(Red::Avg),
            vec![2],
            0,
            In::P(Red::Avg),
            vec![Place::Replicate],
        ),
        (
            Coll::AllGather,
            vec![2],
            0,
            In::S(0),
            vec![Place::Replicate],
        ),
        (
            Coll::AllGather,
            vec![2],
            0,
            In::S(1),
            vec![Place::Stacked(1)],
        ),
        (
            Coll::ReduceScatter(Red::Sum),
            vec![3],
            0,
            In::P(Red::Sum),
            vec![Place::Shard(0)],
        ),
    ];
    for (coll, mesh, over, p, want) in cases {
        let prog = program(coll, &mesh, over, 2, 2, vec![p, p]);
        let seen = run(&prog, 5).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(seen.places[1], want, "{coll:?} {p:?}: {seen:?}");
        assert_eq!(seen.claims, 2, "{coll:?} {p:?}: {seen:?}");
    }
    // 2-d: the all-reduce over tp keeps dp's shard.
    let prog = program(
        Coll::AllReduce(Red::Sum),
        &[2, 2],
        1,
        1,
        2,
        vec![In::S(1), In::P(Red::Sum)],
    );
    let seen = run(&prog, 6).unwrap();
    assert_eq!(
        seen.places[1],
        vec![Place::Shard(1), Place::Replicate],
        "{seen:?}"
    );
    assert_eq!(seen.claims, 2, "{seen:?}");
}

/// A ring along tp: rank (i, j) sends `x` to (i, j+1) and receives from (i, j-1). The result
/// of the send (its input) and of the recv must hold whatever they claim: a replicated or
/// partial input's recv is what the sender held.
#[test]
fn send_and_recv_placements_agree_with_the_interpreter() {
    let strategy = (
        mesh(),
        1..=2usize,
        1..=3usize,
        proptest::collection::vec(in_place(), 2),
        any::<u64>(),
    );
    let mut runner = TestRunner::new(config(64, 0x5eed_4415));
    let tally = std::cell::RefCell::new(Tally::default());
    runner
        .run(&strategy, |(mesh, a, b, places, seed)| {
            let nranks: usize = mesh.iter().product();
            let tp = *mesh.last().unwrap();
            let ranks = (0..nranks)
                .map(|r| {
                    let (row, j) = (r / tp, r % tp);
                    let dst = row * tp + (j + 1) % tp;
                    let src = row * tp + (j + tp - 1) % tp;
                    vec![
                        format!("snd = torch.ops.shardproof_p2p.send.default(x, {dst}, 0)"),
                        format!(
                            "out = torch.ops.shardproof_p2p.recv.default([{a}, {b}], torch.float64, {src}, 0)"
                        ),
                    ]
                })
                .collect();
            let places: Vec<In> = places[..mesh.len()].to_vec();
            let prog = Program {
                mesh: mesh.clone(),
                inputs: vec![Input::f("x", &[a, b], &places)],
                spec: vec![
                    "snd = torch.ops.aten.clone.default(x)".into(),
                    "out = torch.ops.aten.clone.default(x)".into(),
                ],
                ranks,
                checked: vec![("snd".into(), "snd".into()), ("out".into(), "out".into())],
            };
            let seen = run(&prog, seed).map_err(TestCaseError::fail)?;
            tally.borrow_mut().add(&seen);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let t = tally.into_inner();
    eprintln!("{t:?}");
    assert!(t.claims > 0, "{t:?}");
}

/// Known bug: a broadcast over a mesh dim where its input is a shard makes every rank hold
/// the source rank's piece, which the rule claims `Replicate()` (the whole tensor); so is a
/// broadcast of a `Varying` tensor. A piece broadcast is the same on every rank but no
/// replica of the spec's tensor: the rule should claim `Replicate()` only of a replicated
/// input.
#[test]
fn a_broadcast_shard_is_no_replica() {
    for p in [In::S(0), In::S(1)] {
        let prog = program(Coll::Broadcast, &[2], 0, 1, 2, vec![p, p]);
        let seen = run(&prog, 7).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(seen.claims, 0, "{seen:?}");
    }
}

/// Known bug: on `dp x tp` (dp outer), gathering dim 0 over dp while tp shards dim 0 too
/// gives rank (i, j) `[x_0j; x_1j]`: tp's layout is then a blocked shard (one block per dp
/// piece), yet the rule keeps `Shard(0)` on tp (its `undoes` test does not ask which mesh dim
/// is outer). Likewise a reduce-scatter over dp of a tp shard of dim 0 leaves rank (i, j)
/// chunk i of piece j, which `dp: Shard(0), tp: Shard(0)` (dp outer) does not describe.
#[test]
fn a_collective_over_the_outer_mesh_dim_keeps_no_inner_shard_of_dim_0() {
    let gather = program(Coll::AllGather, &[2, 2], 0, 1, 1, vec![In::S(0), In::S(0)]);
    let scatter = program(
        Coll::ReduceScatter(Red::Avg),
        &[2, 2],
        0,
        1,
        1,
        vec![In::R, In::S(0)],
    );
    let errors: Vec<String> = [gather, scatter]
        .iter()
        .filter_map(|prog| run(prog, 3).err())
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}
