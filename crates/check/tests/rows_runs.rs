//! A replicated table of equal runs beside rows of a selection merged with an outer dim
//! (issue 44, DeepSeek `cp=2` full, zoo plan 050: the router's aux-loss gradient `[b, E]`,
//! all-reduced over cp, unsqueezed, expanded over each batch's tokens and merged to
//! `[b*s, E]`, times the router's probabilities, `Rows` of batch and sequence merged).
//!
//! Each cp rank takes its chunks of every batch's sequence and merges batch and sequence:
//! `Rows(0, id)` in `b` blocks, one per batch. A table `[R, S]` unsqueezed at dim 1, expanded
//! and merged over the rank's `b*l` rows is R runs; where R divides b, each run holds whole
//! batches on every rank and in the spec (runs of `b*s/R`), so the product is the selection's
//! rows of the spec's product. The product's rows are summed per batch: the output is
//! `Partial(sum)` on cp, compared with the spec by the interpreter. Planted: more runs than
//! batches (a run cuts a batch's tokens), the table merged the other way (its rows alternate),
//! the table's all-reduce over cp missing (each rank's own partial counts), and a dp shard of
//! a batch of 1 beside a table of two runs over the rank's tokens (a batch's tokens split
//! between two table rows on each rank, one row in the spec).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::chunks::{chunks, megatron, Table as Chunks};
use common::values::{close, concat, random, ty};

/// Coordinates of each mesh dim.
const N: usize = 2;
/// Columns of the rows and of the table.
const S: usize = 3;

/// How the replicated operand of the product is made.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Table {
    /// A graph input `[R, S]` unsqueezed at dim 1, expanded over the rows, merged: R runs.
    Runs(usize),
    /// `[R, S]` unsqueezed at dim 0, expanded, merged: the rows alternate.
    Cycles(usize),
    /// The per-batch sum of the rank's rows `[b, S]`, all-reduced over cp (`true`) or not,
    /// then as `Runs(b)`: the aux-loss gradient's construction.
    Reduced(bool),
}

/// The lines making the table `w` `[rows, S]` from `xc` `[b, l, S]` (or the input `t`).
fn table_lines(table: Table, b: usize, l: usize, body: &mut Vec<String>) {
    let rows = b * l;
    let (src, r, inner) = match table {
        Table::Runs(r) => ("t".to_string(), r, true),
        Table::Cycles(r) => ("t".to_string(), r, false),
        Table::Reduced(all_reduce) => {
            body.push(format!(
                "ts: {} = torch.ops.aten.sum.dim_IntList(xc, [1])",
                ty(&[b, S])
            ));
            let src = if all_reduce {
                body.push(format!(
                    "ar: {} = torch.ops._c10d_functional.all_reduce.default(ts, 'sum', 'cp')",
                    ty(&[b, S])
                ));
                body.push(format!(
                    "tw: {} = torch.ops._c10d_functional.wait_tensor.default(ar)",
                    ty(&[b, S])
                ));
                "tw"
            } else {
                "ts"
            };
            (src.to_string(), b, true)
        }
    };
    let c = rows / r;
    let (u, e) = if inner {
        ([r, 1, S], [r, c, S])
    } else {
        ([1, r, S], [c, r, S])
    };
    body.push(format!(
        "u: {} = torch.ops.aten.unsqueeze.default({src}, {})",
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

/// A graph over `x` `[b, s, S]`: the chunks `segs` of every batch's sequence (`None`: the
/// whole sequence, the spec), merged to `[b*l, S]`, times the table, summed per batch.
fn graph(table: Table, b: usize, s: usize, segs: Option<&[(usize, usize)]>) -> String {
    let mut params = vec![format!("x: {}", ty(&[b, s, S]))];
    if let Table::Runs(r) | Table::Cycles(r) = table {
        params.push(format!("t: {}", ty(&[r, S])));
    }
    let mut body = Vec::new();
    let l = match segs {
        Some(segs) => {
            let mut parts = Vec::new();
            for (i, &(a, e)) in segs.iter().enumerate() {
                body.push(format!(
                    "p{i}: {} = torch.ops.aten.slice.Tensor(x, 1, {a}, {e})",
                    ty(&[b, e - a, S])
                ));
                parts.push(format!("p{i}"));
            }
            let l = segs.iter().map(|(a, e)| e - a).sum();
            body.push(format!(
                "xc: {} = torch.ops.aten.cat.default([{}], 1)",
                ty(&[b, l, S]),
                parts.join(", ")
            ));
            l
        }
        None => {
            body.push(format!(
                "xc: {} = torch.ops.aten.clone.default(x)",
                ty(&[b, s, S])
            ));
            s
        }
    };
    body.push(format!(
        "xm: {} = torch.ops.aten.view.default(xc, [{}, {S}])",
        ty(&[b * l, S]),
        b * l
    ));
    table_lines(table, b, l, &mut body);
    body.push(format!(
        "prod: {} = torch.ops.aten.mul.Tensor(xm, w)",
        ty(&[b * l, S])
    ));
    body.push(format!(
        "pv: {} = torch.ops.aten.view.default(prod, [{b}, {l}, {S}])",
        ty(&[b, l, S])
    ));
    body.push(format!(
        "out: {} = torch.ops.aten.sum.dim_IntList(pv, [1])",
        ty(&[b, S])
    ));
    common::hand::graph_module(&params, &body)
}

/// One instance on `cp` (with `dp` of `N` sharding the batch of `b` where `dp`): the verdict,
/// the product's placement on cp (rank 0), and whether the ranks' outputs (summed over cp,
/// joined over dp) are the spec's (`false` where the spec does not run).
struct Ran {
    verdict: Verdict,
    prod: Place,
    right: bool,
    report: String,
}

fn instance(table: Table, b: usize, segs: &Chunks, dp: bool, seed: u64) -> Ran {
    let s: usize = segs.iter().flatten().map(|(a, e)| e - a).sum();
    let b_local = if dp { b / N } else { b };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), graph(table, b, s, None)).unwrap();
    let ranks = if dp { N * N } else { N };
    let names: Vec<String> = (0..ranks).map(|r| format!("r{r}.py")).collect();
    for (r, name) in names.iter().enumerate() {
        let text = graph(table, b_local, s, Some(&segs[r % N]));
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let (mesh, x, t, out) = if dp {
        (
            format!("{{ dp: {N}, cp: {N} }}"),
            "{ dp: Shard(0), cp: Replicate() }",
            "{ dp: Replicate(), cp: Replicate() }",
            "{ dp: Shard(0), cp: Partial(sum) }",
        )
    } else {
        (
            format!("{{ cp: {N} }}"),
            "Replicate()",
            "Replicate()",
            "Partial(sum)",
        )
    };
    let t_line = match table {
        Table::Runs(_) | Table::Cycles(_) => format!("  t: {t}\n"),
        Table::Reduced(_) => String::new(),
    };
    let yaml = format!(
        "version: 1\nname: rows-runs\nspec:\n  graph: spec.py\nimpl:\n  mesh: {mesh}\n  graphs: [{}]\n  groups:\n    \"cp\": cp\ninputs:\n  x: {x}\n{t_line}outputs:\n  out: {out}\n",
        names.join(", ")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .unwrap_or_else(|e| panic!("{table:?}: {e}"));
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let prop = propagate(&case).unwrap_or_else(|e| panic!("{e}"));
    let g0 = &case.program.ranks[0];
    let at = |g: &shardproof_ir::Graph, name: &str| {
        ValueId::new(g.nodes.iter().position(|n| n.name == name).unwrap(), 0)
    };
    let nd = case.program.mesh.dims.len();
    let prod = prop.ranks[0].of(at(g0, "prod"), nd)[nd - 1];
    // Values: the spec's inputs; each dp coordinate's batches.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let xg = random(&[b, s, S], &mut rng);
    let tg = match table {
        Table::Runs(r) | Table::Cycles(r) => Some(random(&[r, S], &mut rng)),
        Table::Reduced(_) => None,
    };
    let leaves = |x: Tensor| {
        let mut m = BTreeMap::from([("x".to_string(), x)]);
        if let Some(t) = &tg {
            m.insert("t".to_string(), t.clone());
        }
        m
    };
    let want = run_graph(&case.spec, &leaves(xg.clone()), &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec, "out")).map(|t| t.data.to_vec()));
    let per_batch = s * S;
    let x_of = |r: usize| {
        let first = if dp { (r / N) * b_local } else { 0 };
        let data = xg.data[first * per_batch..(first + b_local) * per_batch].to_vec();
        Tensor::new(
            shardproof_ops::Meta::new(xg.meta.dtype, vec![b_local, s, S]),
            data,
        )
    };
    let all: Vec<_> = (0..ranks).map(|r| leaves(x_of(r))).collect();
    let envs = run_program(&case.program, &all, &RunConfig::default()).expect("the ranks run");
    let mut got = Vec::new();
    for d in 0..ranks / N {
        let mut sum = vec![0.0; b_local * S];
        for c in 0..N {
            let env = &envs[d * N + c];
            let o = env.get(at(&case.program.ranks[d * N + c], "out")).unwrap();
            sum.iter_mut().zip(o.data.iter()).for_each(|(a, v)| *a += v);
        }
        got.push(sum);
    }
    let got = concat(&got, &[b_local * S], 0);
    Ran {
        verdict: report.verdict,
        prod,
        right: want.is_some_and(|w| close(&got, &w)),
        report: report.render(),
    }
}

/// Whether `p` is rows of a selection.
fn rows(p: Place) -> bool {
    matches!(p, Place::Rows(0, _))
}

/// Whether `p` is rows of a selection or, where every coordinate took its own block, the plain
/// blocked shard they are.
fn rows_or_blocks(p: Place) -> bool {
    rows(p) || p.blocks().is_some_and(|(d, _)| d == 0)
}

/// Every table over small batch counts, chunk sizes and chunk tables: where the plan holds
/// or the product is read as rows, the interpreter puts the spec's value back together; a
/// program the interpreter shows wrong never holds; and runs dividing the batches over a
/// correct chunk table hold.
#[test]
fn runs_beside_rows_agree_with_the_interpreter() {
    let (mut held, mut wrong) = (0, 0);
    for b in [2usize, 4] {
        for c in [1usize, 2] {
            let s = 2 * N * c;
            let layouts = [
                ("megatron", megatron(N, c), true),
                ("contiguous", chunks(2 * c, &[vec![0], vec![1]]), true),
                ("reversed", chunks(c, &[vec![3, 0], vec![2, 1]]), true),
                ("a chunk twice", chunks(c, &[vec![0, 3], vec![0, 2]]), false),
            ];
            for (name, segs, correct) in &layouts {
                let l = s / N;
                let tables = (1..=b * l)
                    .filter(|r| (b * l).is_multiple_of(*r))
                    .flat_map(|r| [Table::Runs(r), Table::Cycles(r)])
                    .chain([Table::Reduced(true), Table::Reduced(false)]);
                for table in tables {
                    let seed = (b * 100 + c * 10) as u64;
                    let ran = instance(table, b, segs, false, seed);
                    let what = format!(
                        "{table:?} b={b} c={c} {name}: {} {:?}\n{}",
                        ran.prod, ran.verdict, ran.report
                    );
                    if ran.verdict == Verdict::Holds {
                        assert!(ran.right, "held, not the spec's: {what}");
                        held += 1;
                    }
                    if !ran.right {
                        assert_ne!(ran.verdict, Verdict::Holds, "{what}");
                        wrong += 1;
                    }
                    let aligned = match table {
                        Table::Runs(r) => b.is_multiple_of(r),
                        Table::Reduced(all_reduce) => all_reduce,
                        Table::Cycles(_) => false,
                    };
                    if *correct && aligned {
                        assert!(ran.right, "the correct program is wrong: {what}");
                        assert!(rows_or_blocks(ran.prod), "{what}");
                        assert_eq!(ran.verdict, Verdict::Holds, "{what}");
                    }
                }
            }
        }
    }
    // Both kinds occur: the test would pass vacuously otherwise.
    assert!(held > 10 && wrong > 10, "held {held}, wrong {wrong}");
}

/// The aux gradient's shape (4 batches of 2 local tokens each, Megatron's chunks): the
/// all-reduced per-batch table keeps the rows and the plan holds; without the all-reduce
/// (each rank's own partial sums as the table) it never holds.
#[test]
fn the_all_reduced_table_holds_and_a_missing_all_reduce_never_does() {
    let ran = instance(Table::Reduced(true), 4, &megatron(N, 1), false, 1);
    assert!(ran.right, "the correct program is wrong");
    assert!(rows(ran.prod), "{}", ran.prod);
    assert_eq!(ran.verdict, Verdict::Holds, "{}", ran.report);
    let ran = instance(Table::Reduced(false), 4, &megatron(N, 1), false, 1);
    assert!(!ran.right, "the missing all-reduce is not wrong");
    assert!(!rows(ran.prod), "{}", ran.prod);
    assert_ne!(ran.verdict, Verdict::Holds, "{}", ran.report);
}

/// Planted: more runs than batches, a batch's tokens split between table rows (4 runs a
/// batch of 2 local tokens each on Megatron's chunks of 4; 2 runs a batch over chunks taken
/// in reverse order, each rank's later chunk first: on Megatron's order two runs a batch
/// happen to pair alike), and the table merged the other way. Shown wrong by the
/// interpreter, never rows, never holds.
#[test]
fn runs_that_cut_a_batch_never_hold() {
    let reversed = chunks(1, &[vec![3, 0], vec![2, 1]]);
    for (table, b, segs) in [
        (Table::Runs(8), 2, megatron(N, 4)),
        (Table::Runs(4), 2, reversed),
        (Table::Cycles(4), 4, megatron(N, 1)),
    ] {
        let ran = instance(table, b, &segs, false, 2);
        assert!(!ran.right, "{table:?} is not wrong");
        assert!(!rows(ran.prod), "{table:?}: {}", ran.prod);
        assert_ne!(ran.verdict, Verdict::Holds, "{table:?}\n{}", ran.report);
    }
}

/// Planted: dp shards a batch of 2 (one batch per rank, merged with cp's rows: the factor
/// reading's blocks, of which the rank holds one) beside a replicated table of two runs over
/// the rank's tokens: each rank pairs its batch's first chunk with one table row and its
/// second with the other, where the spec pairs the whole batch with its own row. Two runs
/// divide the key's two blocks, but the rank holds one of them: never rows, never holds.
#[test]
fn runs_over_a_dp_shard_of_the_blocks_never_hold() {
    let ran = instance(Table::Runs(2), 2, &megatron(N, 1), true, 3);
    assert!(!ran.right, "not wrong when run");
    assert!(!rows(ran.prod), "{}", ran.prod);
    assert_ne!(ran.verdict, Verdict::Holds, "{}", ran.report);
}
