//! A replicated operand beside a blocked shard `Shard(0, blocks=k)` (issue 44, DeepSeek `tp=2`
//! full with sequence parallelism: the router's `[4, 4]` gradient expanded per token and
//! merged to `[16, 4]`, times the probabilities `Shard(0, blocks=4)`).
//!
//! A table `[R, S]` unsqueezed at dim 1, expanded to `[R, c, S]` and merged to `[R * c, S]` is
//! R equal runs along dim 0; the spec makes the same construction with runs of `c` times tp's
//! size. Where R divides k, each run holds k/R whole blocks on every rank and in the spec, so
//! the product keeps the blocks. The table merged the other way round (unsqueezed at dim 0:
//! its rows alternate), or with more runs than blocks, pairs other rows than the spec's on
//! some rank. Every claim is checked against the interpreter; the wrong variants, which it
//! shows wrong, never hold. A table of the piece's size given as a graph input (no
//! construction the spec repeats) is a `shape-divisibility` finding again (last round: open).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::values::{close, concat, random, ty};

const N: usize = 2;
/// Columns of the table and of the sharded tensor.
const S: usize = 3;

/// How the replicated operand of the product is made.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Table {
    /// `[R, S]` unsqueezed at dim 1, expanded to `[R, c, S]`, merged: R runs of c rows.
    Runs(usize),
    /// `[R, S]` unsqueezed at dim 0, expanded to `[c, R, S]`, merged: the rows alternate.
    Cycles(usize),
    /// A graph input of the local rows (the same tensor in the spec).
    Input,
}

/// One side's graph: `x3: [k, m, S]` merged to `[k*m, S]` (over tp sharded on dim 1: a
/// blocked shard), times the table made for `k*m` rows; `tr`: both moved to `[S, k*m]` first
/// (the shard by a `transpose`, the table by a `permute`), so the runs' dim moves too.
fn graph(table: Table, k: usize, m: usize, tr: bool) -> String {
    let rows = k * m;
    let mut params = vec![format!("x3: {}", ty(&[k, m, S]))];
    let mut body = vec![format!(
        "x: {} = torch.ops.aten.view.default(x3, [{rows}, {S}])",
        ty(&[rows, S])
    )];
    match table {
        Table::Runs(r) | Table::Cycles(r) => {
            let c = rows / r;
            let inner = matches!(table, Table::Runs(_));
            let (u, e) = if inner {
                ([r, 1, S], [r, c, S])
            } else {
                ([1, r, S], [c, r, S])
            };
            params.push(format!("t: {}", ty(&[r, S])));
            body.push(format!(
                "u: {} = torch.ops.aten.unsqueeze.default(t, {})",
                ty(&u),
                usize::from(inner)
            ));
            body.push(format!(
                "e: {} = torch.ops.aten.expand.default(u, {e:?})",
                ty(&e)
            ));
            body.push(format!(
                "cl: {} = torch.ops.aten.clone.default(e, memory_format = torch.contiguous_format)",
                ty(&e)
            ));
            body.push(format!(
                "w: {} = torch.ops.aten.view.default(cl, [{rows}, {S}])",
                ty(&[rows, S])
            ));
        }
        Table::Input => params.push(format!("w: {}", ty(&[rows / N, S]))),
    }
    if tr {
        body.push(format!(
            "xt: {} = torch.ops.aten.transpose.int(x, 0, 1)",
            ty(&[S, rows])
        ));
        body.push(format!(
            "wt: {} = torch.ops.aten.permute.default(w, [1, 0])",
            ty(&[S, rows])
        ));
        body.push(format!(
            "out: {} = torch.ops.aten.mul.Tensor(xt, wt)",
            ty(&[S, rows])
        ));
    } else {
        body.push(format!(
            "out: {} = torch.ops.aten.mul.Tensor(x, w)",
            ty(&[rows, S])
        ));
    }
    common::hand::graph_module(&params, &body)
}

/// One instance, run: the checker's verdict and placement of `out`, the spec's value (`None`
/// where the spec does not run) and the ranks' outputs put back as `Shard(0, blocks=k)`.
struct Ran {
    verdict: Verdict,
    place: Place,
    want: Option<Vec<f64>>,
    got: Vec<f64>,
}

fn instance(table: Table, k: usize, m: usize, outputs: &str, seed: u64) -> Ran {
    instance_moved(table, k, m, false, outputs, seed)
}

/// [`instance`], with both operands moved to `[S, k*m]` where `tr` (the output then
/// `Shard(1, blocks=k)`).
fn instance_moved(table: Table, k: usize, m: usize, tr: bool, outputs: &str, seed: u64) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let rank = match table {
        // The input is the local rows on every rank and in the spec alike.
        Table::Input => graph(table, k, m, tr).replace(&ty(&[k * m / N, S]), &ty(&[k * m, S])),
        _ => graph(table, k, m, tr),
    };
    std::fs::write(dir.path().join("spec.py"), graph(table, k, m * N, tr)).unwrap();
    for r in 0..N {
        std::fs::write(dir.path().join(format!("r{r}.py")), &rank).unwrap();
    }
    let table_input = if table == Table::Input { "w" } else { "t" };
    let yaml = format!(
        "version: 1\nname: runs\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {N} }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x3: {{ tp: Shard(1) }}\n  {table_input}: {{ tp: Replicate() }}\noutputs: {outputs}\n"
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case =
        shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let verdict = check_case(&case).unwrap_or_else(|e| panic!("{e}")).verdict;
    let oi = case.program.ranks[0]
        .nodes
        .iter()
        .position(|nd| nd.name == "out")
        .unwrap();
    let prop = propagate(&case).unwrap_or_else(|e| panic!("{e}"));
    let place = prop.ranks[0].of(ValueId::new(oi, 0), 1)[0];
    assert_eq!(prop.ranks[1].of(ValueId::new(oi, 0), 1)[0], place);
    // Values: the spec's tensors; each rank's x3 is its slice of dim 1, the table the same.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x3 = random(&[k, m * N, S], &mut rng);
    let t = match table {
        Table::Runs(r) | Table::Cycles(r) => random(&[r, S], &mut rng),
        Table::Input => random(&[k * m, S], &mut rng),
    };
    let piece = |r: usize| {
        let per = m * S;
        let data: Vec<f64> = (0..k)
            .flat_map(|b| {
                let start = (b * N + r) * per;
                x3.data[start..start + per].to_vec()
            })
            .collect();
        Tensor::new(
            shardproof_ops::Meta::new(x3.meta.dtype, vec![k, m, S]),
            data,
        )
    };
    let run = |g: &shardproof_ir::Graph, x: Tensor| -> Option<Vec<f64>> {
        let leaves = BTreeMap::from([("x3".to_string(), x), (table_input.to_string(), t.clone())]);
        let env = run_graph(g, &leaves, &RunConfig::default()).ok()?;
        Some(env.get(ValueId::new(oi, 0))?.data.to_vec())
    };
    let want = run(&case.spec, x3.clone());
    let parts: Vec<Vec<f64>> = (0..N)
        .map(|r| run(&case.program.ranks[r], piece(r)).expect("a rank runs"))
        .collect();
    // `[k*m, S]` pieces put back block by block: `[k, m, S]` concatenated along dim 1.
    let got = if tr {
        concat(&parts, &[S, k, m], 2)
    } else {
        concat(&parts, &[k, m, S], 1)
    };
    Ran {
        verdict,
        place,
        want,
        got,
    }
}

fn agrees(ran: &Ran) -> bool {
    ran.want.as_ref().is_some_and(|w| close(&ran.got, w))
}

/// Every table over every small block count: a blocked output is claimed only where the
/// interpreter puts the spec's value back together from the ranks' pieces, and wherever the
/// runs (of more than one row) divide the blocks; a wrong pairing is never held.
#[test]
fn run_pairings_agree_with_the_interpreter() {
    let mut claimed = 0;
    let mut wrong = 0;
    for k in 2usize..=4 {
        for m in 1..=3 {
            let rows = k * m;
            for r in (1..=rows).filter(|r| rows.is_multiple_of(*r)) {
                for table in [Table::Runs(r), Table::Cycles(r)] {
                    let seed = (k * 100 + m * 10 + r) as u64;
                    let outputs = format!("{{ out: {{ placement: Shard(0), blocks: {k} }} }}");
                    let ran = instance(table, k, m, &outputs, seed);
                    let what = format!("{table:?} k={k} m={m}: {} {:?}", ran.place, ran.verdict);
                    if ran.place == Place::Blocked(0, k as u16) {
                        assert!(agrees(&ran), "claimed, not the spec's: {what}");
                        claimed += 1;
                    }
                    // Runs of one row: the view only drops a size-1 dim, no construction.
                    if matches!(table, Table::Runs(_)) && k.is_multiple_of(r) && r < rows {
                        assert_eq!(ran.place, Place::Blocked(0, k as u16), "{what}");
                    }
                    if !agrees(&ran) {
                        assert_ne!(ran.verdict, Verdict::Holds, "{what}");
                        assert_ne!(ran.place, Place::Blocked(0, k as u16), "{what}");
                        wrong += 1;
                    }
                }
            }
        }
    }
    // Both kinds occur: the test would pass vacuously otherwise.
    assert!(
        claimed > 10 && wrong > 10,
        "claimed {claimed}, wrong {wrong}"
    );
}

/// The router's shape (k = 4 blocks of 2 local rows, 4 runs): the product keeps the blocks
/// and the plan holds (before: an open pairing, inconclusive).
#[test]
fn the_routers_table_keeps_the_blocks_and_holds() {
    let ran = instance(
        Table::Runs(4),
        4,
        2,
        "{ out: { placement: Shard(0), blocks: 4 } }",
        1,
    );
    assert_eq!(ran.place, Place::Blocked(0, 4));
    assert!(agrees(&ran));
    assert_eq!(ran.verdict, Verdict::Holds);
}

/// Planted wrong variants of the router's shape (4 blocks of 4 local rows), each shown wrong
/// by the interpreter: more runs than blocks (8 runs of 2 rows), and the table merged the
/// other way (alternating rows). Neither holds, however the output is declared.
#[test]
fn planted_wrong_tables_never_hold() {
    for table in [Table::Runs(8), Table::Cycles(8)] {
        for outputs in [
            "{ out: { placement: Shard(0), blocks: 4 } }",
            "{ out: { tp: Shard(0) } }",
        ] {
            let ran = instance(table, 4, 4, outputs, 2);
            assert!(!agrees(&ran), "{table:?} is not wrong");
            assert_ne!(ran.verdict, Verdict::Holds, "{table:?} {outputs}");
        }
    }
}

/// A replicated graph input of the piece's rows beside the blocked shard: the spec pairs
/// the whole dim with a table of half its rows, which does not even run. A finding (last
/// round's trade-off: an open pairing, inconclusive).
#[test]
fn a_replicated_input_of_the_pieces_rows_is_a_finding() {
    let ran = instance(Table::Input, 4, 2, "{}", 3);
    assert!(ran.want.is_none(), "the spec ran");
    assert_eq!(ran.verdict, Verdict::Violated);
}

/// The runs' dim follows a `permute` of the table (and the shard's a `transpose`): on
/// `[S, k*m]` the product keeps `Shard(1, blocks=k)` where R divides k, as the interpreter
/// confirms, and the wrong tables never hold there either.
#[test]
fn runs_move_with_their_dim() {
    let out = "{ out: { placement: Shard(1), blocks: 4 } }";
    let ran = instance_moved(Table::Runs(4), 4, 2, true, out, 4);
    assert_eq!(ran.place, Place::Blocked(1, 4));
    assert!(agrees(&ran));
    assert_eq!(ran.verdict, Verdict::Holds);
    for table in [Table::Runs(8), Table::Cycles(8)] {
        let ran = instance_moved(table, 4, 4, true, out, 5);
        assert!(!agrees(&ran), "{table:?} is not wrong");
        assert_ne!(ran.verdict, Verdict::Holds, "{table:?}");
    }
}
