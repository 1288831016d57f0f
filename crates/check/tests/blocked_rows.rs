//! Rows merged with the batch (`RowKey::Blocks`; issue 44: the context-parallel `[b, s, h] ->
//! [b * s, h]` before a projection, the sequence held as Megatron's load-balanced chunks)
//! agree with the interpreter.
//!
//! Each rank slices its chunks of a replicated `x` `[B, S, H]` along the sequence (dim 1) and
//! joins them, merges batch and sequence (`view` to `[B * L, H]`), projects (`mm` with a
//! replicated `w`), and then either splits the merged dim again and sums the squares over the
//! sequence, or contracts the merged rows (a weight gradient `t(m) @ y`). The spec does the
//! same on the whole sequence. Where the checker claims `Partial(sum)`, the ranks' sums add up
//! to the spec's; where it claims the split rows `Rows` on dim 1, the ranks' rows, joined in
//! coordinate order, are the spec's rows in the order of the ranks' chunks. Planted: the
//! merged dim split back in the wrong order (`[L, B]`, then permuted to `[B, L]`: batch and
//! sequence interleaved), a chunk twice, a chunk missing.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Red, Report, Verdict};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::chunks::{chunks, megatron, order, Table};
use common::values::{close, concat, random, ty};

const N: usize = 2;
const H: usize = 3;
const H2: usize = 2;

/// How a rank splits the merged dim again.
#[derive(Clone, Copy, Debug)]
enum Split {
    /// `view(y, [B, L, H2])`: the merge undone.
    Right,
    /// `permute(view(y, [L, B, H2]), [1, 0, 2])`: batch and sequence interleaved (planted).
    Swapped,
}

/// What the rank computes from the projection.
#[derive(Clone, Copy, Debug)]
enum Tail {
    /// The merged dim split (`split`), squared, summed over the sequence: `out` `[B, H2]`.
    SumSeq(Split),
    /// The merged rows contracted: `out = t(m) @ y` `[H, H2]`.
    Contract,
}

/// The lines after the merged `m` `[rows, H]` (`b` batches of `l` rows each).
fn tail(b: usize, l: usize, t: Tail) -> Vec<String> {
    let rows = b * l;
    let mut body = vec![format!(
        "y: {} = torch.ops.aten.mm.default(m, w)",
        ty(&[rows, H2])
    )];
    match t {
        Tail::SumSeq(split) => {
            match split {
                Split::Right => body.push(format!(
                    "z: {} = torch.ops.aten.view.default(y, [{b}, {l}, {H2}])",
                    ty(&[b, l, H2])
                )),
                Split::Swapped => {
                    body.push(format!(
                        "z0: {} = torch.ops.aten.view.default(y, [{l}, {b}, {H2}])",
                        ty(&[l, b, H2])
                    ));
                    body.push(format!(
                        "z: {} = torch.ops.aten.permute.default(z0, [1, 0, 2])",
                        ty(&[b, l, H2])
                    ));
                }
            }
            body.push(format!(
                "q: {} = torch.ops.aten.mul.Tensor(z, z)",
                ty(&[b, l, H2])
            ));
            body.push(format!(
                "out: {} = torch.ops.aten.sum.dim_IntList(q, [1])",
                ty(&[b, H2])
            ));
        }
        Tail::Contract => {
            body.push(format!(
                "mt: {} = torch.ops.aten.t.default(m)",
                ty(&[H, rows])
            ));
            body.push(format!(
                "out: {} = torch.ops.aten.mm.default(mt, y)",
                ty(&[H, H2])
            ));
        }
    }
    body
}

fn params(b: usize, s: usize) -> Vec<String> {
    vec![
        format!("x: {}", ty(&[b, s, H])),
        format!("w: {}", ty(&[H, H2])),
    ]
}

fn rank_graph(b: usize, s: usize, segs: &[(usize, usize)], t: Tail) -> String {
    let l: usize = segs.iter().map(|(a, e)| e - a).sum();
    let mut body = Vec::new();
    let mut parts = Vec::new();
    for (i, &(a, e)) in segs.iter().enumerate() {
        body.push(format!(
            "p{i}: {} = torch.ops.aten.slice.Tensor(x, 1, {a}, {e})",
            ty(&[b, e - a, H])
        ));
        parts.push(format!("p{i}"));
    }
    body.push(format!(
        "xc: {} = torch.ops.aten.cat.default([{}], 1)",
        ty(&[b, l, H]),
        parts.join(", ")
    ));
    body.push(format!(
        "m: {} = torch.ops.aten.view.default(xc, [{}, {H}])",
        ty(&[b * l, H]),
        b * l
    ));
    body.extend(tail(b, l, t));
    common::hand::graph_module(&params(b, s), &body)
}

fn spec_graph(b: usize, s: usize, t: Tail) -> String {
    let t = match t {
        Tail::SumSeq(_) => Tail::SumSeq(Split::Right),
        Tail::Contract => Tail::Contract,
    };
    let mut body = vec![
        format!("xc: {} = torch.ops.aten.clone.default(x)", ty(&[b, s, H])),
        format!(
            "m: {} = torch.ops.aten.view.default(xc, [{}, {H}])",
            ty(&[b * s, H]),
            b * s
        ),
    ];
    body.extend(tail(b, s, t));
    common::hand::graph_module(&params(b, s), &body)
}

/// One instance, checked and run.
struct Ran {
    report: Report,
    /// The checker's placement of `z` (`Unknown` where the ranks differ or there is none) and
    /// of `out`.
    z: Place,
    out: Place,
    spec_z: Option<Vec<f64>>,
    spec_out: Vec<f64>,
    z_got: Vec<Option<Vec<f64>>>,
    out_got: Vec<Vec<f64>>,
}

fn instance(b: usize, s: usize, table: &Table, t: Tail, seed: u64) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec_graph(b, s, t)).unwrap();
    for (r, segs) in table.iter().enumerate() {
        std::fs::write(
            dir.path().join(format!("r{r}.py")),
            rank_graph(b, s, segs, t),
        )
        .unwrap();
    }
    let yaml = format!(
        "version: 1\nname: blocked-rows\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ cp: {N} }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x: {{ cp: Replicate() }}\n  w: {{ cp: Replicate() }}\noutputs:\n  out: {{ cp: Partial(sum) }}\n"
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case =
        shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let prop = propagate(&case).unwrap_or_else(|e| panic!("{e}"));
    let at = |g: &shardproof_ir::Graph, name: &str| {
        g.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| ValueId::new(i, 0))
    };
    let place = |name: &str| {
        let p: Vec<Place> = (0..N)
            .filter_map(|r| at(&case.program.ranks[r], name).map(|v| prop.ranks[r].of(v, 1)[0]))
            .collect();
        if p.len() == N && p.iter().all(|&x| x == p[0]) {
            p[0]
        } else {
            Place::Unknown
        }
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let leaves: BTreeMap<String, Tensor> = [
        ("x".to_string(), random(&[b, s, H], &mut rng)),
        ("w".to_string(), random(&[H, H2], &mut rng)),
    ]
    .into();
    let run = |g: &shardproof_ir::Graph| {
        let env = run_graph(g, &leaves, &RunConfig::default()).expect("runs");
        let get = |n: &str| at(g, n).map(|v| env.get(v).unwrap().data.to_vec());
        (get("z"), get("out").expect("an output"))
    };
    let (spec_z, spec_out) = run(&case.spec);
    let (z_got, out_got) = (0..N).map(|r| run(&case.program.ranks[r])).unzip();
    Ran {
        z: place("z"),
        out: place("out"),
        report,
        spec_z,
        spec_out,
        z_got,
        out_got,
    }
}

fn ranks_summed(ran: &Ran) -> Vec<f64> {
    (0..ran.spec_out.len())
        .map(|j| {
            ran.out_got
                .iter()
                .map(|o| o.get(j).copied().unwrap_or(f64::NAN))
                .sum()
        })
        .collect()
}

/// Whether the checker's claims about `z` and `out` are the interpreter's values: the claims
/// made, (`Partial(sum)` out, `Rows` z).
fn claims_hold(ran: &Ran, b: usize, s: usize, table: &Table) -> Result<(bool, bool), String> {
    let sum_ok = close(&ranks_summed(ran), &ran.spec_out);
    let partial = ran.out == Place::Partial(Red::Sum);
    if partial && !sum_ok {
        return Err("out claimed Partial(sum) but the ranks' sums differ".into());
    }
    if ran.report.verdict == Verdict::Holds && !sum_ok {
        return Err("holds, but the ranks' sums differ from the spec's".into());
    }
    let rows = matches!(ran.z, Place::Rows(1, _));
    if rows {
        let (Some(spec_z), Some(l)) = (
            &ran.spec_z,
            table
                .first()
                .map(|t| t.iter().map(|(a, e)| e - a).sum::<usize>()),
        ) else {
            return Err("rows claimed without values".into());
        };
        let parts: Vec<Vec<f64>> = ran.z_got.iter().map(|z| z.clone().unwrap()).collect();
        let joined = concat(&parts, &[b, l, H2], 1);
        let want: Vec<f64> = (0..b)
            .flat_map(|bi| {
                order(table)
                    .into_iter()
                    .flat_map(move |i| (0..H2).map(move |j| (bi * s + i) * H2 + j))
            })
            .map(|k| spec_z[k])
            .collect();
        if !close(&joined, &want) {
            return Err(format!(
                "z claimed {:?} but its rows are not the spec's",
                ran.z
            ));
        }
    }
    Ok((partial, rows))
}

#[test]
fn megatron_chunks_merged_with_the_batch_hold_and_agree_with_the_interpreter() {
    for (b, c) in [(2, 1), (3, 2), (1, 2)] {
        let s = 2 * N * c;
        let table = megatron(N, c);
        for t in [Tail::SumSeq(Split::Right), Tail::Contract] {
            let ran = instance(b, s, &table, t, (b * 10 + c) as u64);
            let claims = claims_hold(&ran, b, s, &table);
            let want_rows = matches!(t, Tail::SumSeq(_));
            assert_eq!(claims, Ok((true, want_rows)), "b {b} c {c} {t:?}");
            assert_eq!(
                ran.report.verdict,
                Verdict::Holds,
                "b {b} c {c} {t:?}\n{}",
                ran.report.render()
            );
        }
    }
}

#[test]
fn the_merged_dim_split_in_the_wrong_order_never_holds() {
    // Batch 2, two rows per rank: `[L, B]` permuted interleaves batch and sequence.
    let table = megatron(N, 1);
    let ran = instance(2, 4, &table, Tail::SumSeq(Split::Swapped), 3);
    assert!(
        !close(&ranks_summed(&ran), &ran.spec_out),
        "not wrong when run"
    );
    assert_ne!(
        ran.report.verdict,
        Verdict::Holds,
        "{}",
        ran.report.render()
    );
    assert!(claims_hold(&ran, 2, 4, &table).is_ok());
}

#[test]
fn merged_rows_of_a_chunk_twice_or_missing_never_hold() {
    let c = 1;
    for (what, idx) in [
        ("a chunk twice", vec![vec![0, 3], vec![1, 1]]),
        ("a chunk missing, one twice", vec![vec![0, 3], vec![0, 2]]),
    ] {
        let table = chunks(c, &idx);
        for t in [Tail::SumSeq(Split::Right), Tail::Contract] {
            let ran = instance(2, 4, &table, t, 5);
            assert!(
                !close(&ranks_summed(&ran), &ran.spec_out),
                "{what} {t:?}: not wrong when run"
            );
            assert_ne!(
                ran.report.verdict,
                Verdict::Holds,
                "{what} {t:?}\n{}",
                ran.report.render()
            );
            assert!(claims_hold(&ran, 2, 4, &table).is_ok(), "{what} {t:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    /// Random chunk tables (2 to 6 chunks of 1 to 2 rows, 1 to 3 per coordinate, any chunk any
    /// number of times), batches 1 to 3, either tail and either split: every claim the checker
    /// makes is the interpreter's, and a permutation of the chunks dealt out in equal counts,
    /// merged and split back right, always holds.
    #[test]
    fn random_merged_chunk_tables_agree_with_the_interpreter(
        c in 1usize..=2,
        k in 2usize..=6,
        b in 1usize..=3,
        picks in proptest::collection::vec(proptest::collection::vec(0usize..6, 1..=3), N),
        perm in proptest::bool::ANY,
        contract in proptest::bool::ANY,
        swapped in proptest::bool::ANY,
        seed in 0u64..1000,
    ) {
        let idx: Vec<Vec<usize>> = if perm && k % N == 0 {
            let mut all: Vec<usize> = (0..k).collect();
            all.rotate_left(seed as usize % k);
            (0..N).map(|r| all.iter().copied().skip(r).step_by(N).collect()).collect()
        } else {
            picks.iter().map(|r| r.iter().map(|&x| x % k).collect()).collect()
        };
        let table = chunks(c, &idx);
        let len = |r: usize| table[r].iter().map(|(a, e)| e - a).sum::<usize>();
        // Every rank's graph must type: the spec's shapes do not depend on the table, but the
        // ranks' must be equal for the case to be one program.
        prop_assume!((0..N).all(|r| len(r) == len(0)));
        let t = if contract {
            Tail::Contract
        } else if swapped {
            Tail::SumSeq(Split::Swapped)
        } else {
            Tail::SumSeq(Split::Right)
        };
        let s = k * c;
        let ran = instance(b, s, &table, t, seed);
        let claims = claims_hold(&ran, b, s, &table);
        prop_assert!(claims.is_ok(), "{:?}\n{}", claims, ran.report.render());
        let mut rows = order(&table);
        rows.sort_unstable();
        let permutation = rows == (0..s).collect::<Vec<_>>();
        let plain = (0..N).all(|r| table[r] == vec![(r * len(0), (r + 1) * len(0))]);
        if permutation && !plain && !matches!(t, Tail::SumSeq(Split::Swapped)) {
            prop_assert_eq!(ran.report.verdict, Verdict::Holds, "{}", ran.report.render());
        }
    }
}
