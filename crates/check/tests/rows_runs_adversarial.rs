//! Adversarial programs against the equal-runs reading beside rows (`rows::runs_fill_blocks`,
//! issue 44): a replicated operand of R equal runs along the dim facing a selection's rows
//! held in k blocks pairs each row with the spec's row when R divides k. Each program here
//! breaks one thing that reading relies on; the interpreter shows the ranks' pieces are not
//! the spec's, and the checker must not hold or claim rows for the product.
//!
//! Mesh `cp: 2`. Every rank takes its chunks of each batch's sequence `x [b, s, S]`, joins
//! them (`xc [b, l, S]`), merges batch and sequence (`Rows` of the merge, one block a batch;
//! or another layout), multiplies by a replicated table `w` and sums per batch: the output is
//! `Partial(sum)` on cp. The spec runs the same program on the whole sequence; the table's
//! construction is written for each side with the sizes that side has.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::chunks::{chunks, megatron, Table as Chunks};
use common::values::{close, random, ty};

/// Coordinates of cp.
const N: usize = 2;
/// Columns of the rows and of the table.
const S: usize = 3;

/// The sizes one side of the case runs at: `b` batches of `l` tokens (the rank's `l`, or the
/// whole sequence in the spec).
#[derive(Clone, Copy)]
struct Side {
    b: usize,
    l: usize,
}

/// How the rank (and the spec) lays out `xc [b, l, S]` before the product, and the name of
/// the 2-d rows `xm` the product reads.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// `[b, l, S] -> [b*l, S]`: batch-major blocks (`RowKey::Blocks`).
    BatchMajor,
    /// `[b, l, S] -> [l, b, S] -> [l*b, S]`: the rows outer, each batch spread over the dim
    /// (no blocks: a `Merge` key).
    TokenMajor,
}

/// A program: the replicated inputs the table reads (name, global shape) and the lines that
/// make `w` (broadcastable against the rows `[b*l, S]`) at the given side's sizes.
struct Attack {
    what: &'static str,
    layout: Layout,
    inputs: Vec<(&'static str, Vec<usize>)>,
    table: Box<dyn Fn(Side) -> Vec<String>>,
}

/// The lines of `[rows, S]` made from `src` (`[r, S]`) unsqueezed at 1, expanded to
/// `[r, rows / r, S]` and merged: r runs.
fn runs_from(src: &str, r: usize, rows: usize) -> Vec<String> {
    let c = rows / r;
    vec![
        format!(
            "u: {} = torch.ops.aten.unsqueeze.default({src}, 1)",
            ty(&[r, 1, S])
        ),
        format!(
            "e: {} = torch.ops.aten.expand.default(u, [{r}, {c}, {S}])",
            ty(&[r, c, S])
        ),
        format!(
            "cl: {} = torch.ops.aten.clone.default(e, memory_format = torch.contiguous_format)",
            ty(&[r, c, S])
        ),
        format!(
            "w: {} = torch.ops.aten.view.default(cl, [{rows}, {S}])",
            ty(&[rows, S])
        ),
    ]
}

fn graph(attack: &Attack, side: Side, s: usize, segs: Option<&[(usize, usize)]>) -> String {
    let Side { b, l } = side;
    let mut params = vec![format!("x: {}", ty(&[b, s, S]))];
    params.extend(
        attack
            .inputs
            .iter()
            .map(|(n, sh)| format!("{n}: {}", ty(sh))),
    );
    let mut body = Vec::new();
    match segs {
        Some(segs) => {
            let mut parts = Vec::new();
            for (i, &(a, e)) in segs.iter().enumerate() {
                body.push(format!(
                    "p{i}: {} = torch.ops.aten.slice.Tensor(x, 1, {a}, {e})",
                    ty(&[b, e - a, S])
                ));
                parts.push(format!("p{i}"));
            }
            body.push(format!(
                "xc: {} = torch.ops.aten.cat.default([{}], 1)",
                ty(&[b, l, S]),
                parts.join(", ")
            ));
        }
        None => body.push(format!(
            "xc: {} = torch.ops.aten.clone.default(x)",
            ty(&[b, l, S])
        )),
    }
    let rows = b * l;
    match attack.layout {
        Layout::BatchMajor => {
            body.push(format!(
                "xm: {} = torch.ops.aten.view.default(xc, [{rows}, {S}])",
                ty(&[rows, S])
            ));
        }
        Layout::TokenMajor => {
            body.push(format!(
                "xt: {} = torch.ops.aten.transpose.int(xc, 0, 1)",
                ty(&[l, b, S])
            ));
            body.push(format!(
                "xk: {} = torch.ops.aten.clone.default(xt, memory_format = torch.contiguous_format)",
                ty(&[l, b, S])
            ));
            body.push(format!(
                "xm: {} = torch.ops.aten.view.default(xk, [{rows}, {S}])",
                ty(&[rows, S])
            ));
        }
    }
    body.extend((attack.table)(side));
    body.push(format!(
        "prod: {} = torch.ops.aten.mul.Tensor(xm, w)",
        ty(&[rows, S])
    ));
    // Back to per-batch rows, summed over the tokens.
    match attack.layout {
        Layout::BatchMajor => body.push(format!(
            "pv: {} = torch.ops.aten.view.default(prod, [{b}, {l}, {S}])",
            ty(&[b, l, S])
        )),
        Layout::TokenMajor => {
            body.push(format!(
                "pl: {} = torch.ops.aten.view.default(prod, [{l}, {b}, {S}])",
                ty(&[l, b, S])
            ));
            body.push(format!(
                "pv: {} = torch.ops.aten.transpose.int(pl, 0, 1)",
                ty(&[b, l, S])
            ));
        }
    }
    body.push(format!(
        "out: {} = torch.ops.aten.sum.dim_IntList(pv, [1])",
        ty(&[b, S])
    ));
    common::hand::graph_module(&params, &body)
}

/// What the checker and the interpreter say of one program.
struct Ran {
    verdict: Verdict,
    /// The product's placement on cp (rank 0).
    prod: Place,
    /// Whether the ranks' outputs summed over cp are the spec's.
    right: bool,
    report: String,
}

fn run(attack: &Attack, b: usize, segs: &Chunks, seed: u64) -> Ran {
    let s: usize = segs.iter().flatten().map(|(a, e)| e - a).sum::<usize>() / N;
    let s = s * N;
    let l = s / N;
    let dir = tempfile::tempdir().unwrap();
    let spec = graph(attack, Side { b, l: s }, s, None);
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    let names: Vec<String> = (0..N).map(|r| format!("r{r}.py")).collect();
    for (r, name) in names.iter().enumerate() {
        let text = graph(attack, Side { b, l }, s, Some(&segs[r]));
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let extra: String = attack
        .inputs
        .iter()
        .map(|(n, _)| format!("  {n}: Replicate()\n"))
        .collect();
    let yaml = format!(
        "version: 1\nname: rows-runs-adversarial\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ cp: {N} }}\n  graphs: [{}]\n  groups:\n    \"cp\": cp\ninputs:\n  x: Replicate()\n{extra}outputs:\n  out: Partial(sum)\n",
        names.join(", ")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .unwrap_or_else(|e| panic!("{}: {e}", attack.what));
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let prop = propagate(&case).unwrap_or_else(|e| panic!("{e}"));
    let at = |g: &shardproof_ir::Graph, name: &str| {
        ValueId::new(g.nodes.iter().position(|n| n.name == name).unwrap(), 0)
    };
    let g0 = &case.program.ranks[0];
    let prod = prop.ranks[0].of(at(g0, "prod"), 1)[0];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut leaves = BTreeMap::from([("x".to_string(), random(&[b, s, S], &mut rng))]);
    for (n, sh) in &attack.inputs {
        leaves.insert(n.to_string(), random(sh, &mut rng));
    }
    let want = run_graph(&case.spec, &leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec, "out")).map(|t| t.data.to_vec()));
    let all = vec![leaves; N];
    let envs = run_program(&case.program, &all, &RunConfig::default()).expect("the ranks run");
    let mut got = vec![0.0; b * S];
    for (r, env) in envs.iter().enumerate() {
        let o: &Tensor = env.get(at(&case.program.ranks[r], "out")).unwrap();
        got.iter_mut().zip(o.data.iter()).for_each(|(a, v)| *a += v);
    }
    Ran {
        verdict: report.verdict,
        prod,
        right: want.is_some_and(|w| close(&got, &w)),
        report: report.render(),
    }
}

/// Asserts the interpreter shows the program wrong and the checker neither holds nor reads
/// the product as rows (or as the blocked shard they are).
fn never_holds(attack: &Attack, b: usize, segs: &Chunks) {
    let ran = run(attack, b, segs, 7);
    let what = format!(
        "{}: {} {:?}\n{}",
        attack.what, ran.prod, ran.verdict, ran.report
    );
    assert!(!ran.right, "not wrong when run: {what}");
    assert!(
        !matches!(ran.prod, Place::Rows(..)) && ran.prod.blocks().is_none(),
        "{what}"
    );
    assert_ne!(ran.verdict, Verdict::Holds, "{what}");
}

/// Asserts the interpreter shows the program right and the checker holds (the control of an
/// attack: the same construction where the reading applies).
fn holds(attack: &Attack, b: usize, segs: &Chunks) {
    let ran = run(attack, b, segs, 7);
    let what = format!(
        "{}: {} {:?}\n{}",
        attack.what, ran.prod, ran.verdict, ran.report
    );
    assert!(ran.right, "the correct program is wrong: {what}");
    assert_eq!(ran.verdict, Verdict::Holds, "{what}");
}

/// The table `[b, S]` (a graph input), as runs of one batch each: the construction the
/// reading is for.
fn per_batch_table(b: usize, layout: Layout) -> Attack {
    Attack {
        what: "a per-batch table",
        layout,
        inputs: vec![("t", vec![b, S])],
        table: Box::new(|side| runs_from("t", side.b, side.b * side.l)),
    }
}

#[test]
fn the_per_batch_table_holds_on_batch_major_blocks() {
    holds(&per_batch_table(4, Layout::BatchMajor), 4, &megatron(N, 1));
}

/// Rows merged the other way (`[l, b] -> [l*b]`: each batch's tokens spread over the dim,
/// no blocks): runs of the table meet tokens of several batches, and the spec's runs other
/// ones. Only one run (constant along the dim) would pair alike.
#[test]
fn runs_beside_token_major_rows_never_hold() {
    never_holds(&per_batch_table(4, Layout::TokenMajor), 4, &megatron(N, 1));
}

/// The table's rows are the side's own token count: a slice `t[0:l]` of a replicated input
/// `t [rows, S]` (`pos_emb[:seq_len]` with the rank's local length), expanded over the
/// batches and merged: `l` runs on a rank, `s` in the spec.
fn local_length_table(rows: usize) -> Attack {
    Attack {
        what: "t[0:l] expanded over the batches",
        layout: Layout::BatchMajor,
        inputs: vec![("t", vec![rows, S])],
        table: Box::new(|Side { b, l }| {
            let mut lines = vec![format!(
                "ts: {} = torch.ops.aten.slice.Tensor(t, 0, 0, {l})",
                ty(&[l, S])
            )];
            lines.extend(runs_from("ts", l, b * l));
            lines
        }),
    }
}

/// `t[0:l]` on Megatron's chunks: 2 runs (dividing 4 batches) on a rank, 4 in the spec, one
/// a batch. The ranks pair batches 0 and 1 with `t[0]`, the spec batch 1 with `t[1]`.
/// (Held, `Rows(0, #3)`, before the runs walk asked the spec's view for its run dims.)
#[test]
fn runs_counted_by_the_local_length_never_hold() {
    never_holds(&local_length_table(4), 4, &megatron(N, 1));
}

/// One token a rank in reversed order (rows, not a shard): `t[0:1]` expanded is one run, constant
/// along the rows on a rank, and two runs in the spec. (Held before the size-1 dim had to
/// be size 1 in the spec's view too.)
#[test]
fn one_local_run_that_is_two_in_the_spec_never_holds() {
    never_holds(&local_length_table(2), 2, &chunks(1, &[vec![1], vec![0]]));
}

/// The same beside a plain shard (contiguous chunks: `Shard(0, blocks=2)`, the element-wise
/// rule's own runs reading, not `runs_fill_blocks`). (Held before the runs walk asked the
/// spec's view, as the two above: the false hold predates the runs beside rows.)
#[test]
fn one_local_run_beside_a_plain_shard_never_holds() {
    never_holds(&local_length_table(2), 2, &chunks(1, &[vec![0], vec![1]]));
}

/// Two local runs (`t[0:2]`) beside a plain shard of four batches (contiguous chunks of 2),
/// four in the spec: the element-wise rule's own runs reading. (Held before, as above.)
#[test]
fn runs_counted_by_the_local_length_beside_a_plain_shard_never_hold() {
    never_holds(&local_length_table(4), 4, &chunks(2, &[vec![0], vec![1]]));
}

/// The same with positions: `arange(l)` made on every rank (the cp-rope-no-offset pattern) as
/// the table's rows, expanded over the batches and merged. (Held before, as above.)
#[test]
fn runs_of_local_positions_never_hold() {
    let attack = Attack {
        what: "arange(l) expanded over the batches",
        layout: Layout::BatchMajor,
        inputs: vec![],
        table: Box::new(|Side { b, l }| {
            let rows = b * l;
            vec![
                format!(
                    "pos: \"i64[{l}]\" = torch.ops.aten.arange.start(0, {l}, device = device(type='cpu'), pin_memory = False)"
                ),
                format!(
                    "pf: \"f64[{l}]\" = torch.ops.aten._to_copy.default(pos, dtype = torch.float64)"
                ),
                format!("pu: \"f64[{l}, 1]\" = torch.ops.aten.unsqueeze.default(pf, 1)"),
                format!("u: \"f64[{l}, 1, 1]\" = torch.ops.aten.unsqueeze.default(pu, 2)"),
                format!(
                    "e: {} = torch.ops.aten.expand.default(u, [{l}, {b}, {S}])",
                    ty(&[l, b, S])
                ),
                format!(
                    "cl: {} = torch.ops.aten.clone.default(e, memory_format = torch.contiguous_format)",
                    ty(&[l, b, S])
                ),
                format!(
                    "w: {} = torch.ops.aten.view.default(cl, [{rows}, {S}])",
                    ty(&[rows, S])
                ),
            ]
        }),
    };
    never_holds(&attack, 4, &megatron(N, 1));
}

/// Four runs over six batches of two local tokens (runs of 3 rows): a run cuts a batch on
/// every rank, and the spec's runs (of 6 rows) cut other ones. R does not divide k. (On
/// Megatron's order the cuts happen to pair alike; the chunks reversed, they do not.)
#[test]
fn runs_that_do_not_divide_the_blocks_never_hold() {
    let attack = Attack {
        what: "4 runs over 6 batches",
        layout: Layout::BatchMajor,
        inputs: vec![("t", vec![4, S])],
        table: Box::new(|Side { b, l }| runs_from("t", 4, b * l)),
    };
    never_holds(&attack, 6, &chunks(1, &[vec![3, 0], vec![2, 1]]));
}

/// The per-batch table expanded, then its run dim moved inside (`[b, c, S] -> [c, b, S]`)
/// before the merge: the rows alternate between the batches' table rows, no runs.
#[test]
fn runs_reordered_by_a_transpose_before_the_merge_never_hold() {
    let attack = Attack {
        what: "the per-batch table transposed before the merge",
        layout: Layout::BatchMajor,
        inputs: vec![("t", vec![4, S])],
        table: Box::new(|Side { b, l }| {
            let rows = b * l;
            vec![
                format!("u: {} = torch.ops.aten.unsqueeze.default(t, 1)", ty(&[b, 1, S])),
                format!(
                    "e: {} = torch.ops.aten.expand.default(u, [{b}, {l}, {S}])",
                    ty(&[b, l, S])
                ),
                format!("et: {} = torch.ops.aten.transpose.int(e, 0, 1)", ty(&[l, b, S])),
                format!(
                    "cl: {} = torch.ops.aten.clone.default(et, memory_format = torch.contiguous_format)",
                    ty(&[l, b, S])
                ),
                format!(
                    "w: {} = torch.ops.aten.view.default(cl, [{rows}, {S}])",
                    ty(&[rows, S])
                ),
            ]
        }),
    };
    never_holds(&attack, 4, &megatron(N, 1));
}

/// Equal runs along the columns (one run: constant along dim 1) of a table whose rows are the
/// rank's own positions `arange(b*l)`: the runs face no rows, and the rows dim is the whole
/// replicated table's.
#[test]
fn runs_along_another_dim_than_the_rows_never_hold() {
    let attack = Attack {
        what: "runs along the columns",
        layout: Layout::BatchMajor,
        inputs: vec![],
        table: Box::new(|Side { b, l }| {
            let rows = b * l;
            vec![
                format!(
                    "pos: \"i64[{rows}]\" = torch.ops.aten.arange.start(0, {rows}, device = device(type='cpu'), pin_memory = False)"
                ),
                format!(
                    "pf: \"f64[{rows}]\" = torch.ops.aten._to_copy.default(pos, dtype = torch.float64)"
                ),
                format!("pu: \"f64[{rows}, 1]\" = torch.ops.aten.unsqueeze.default(pf, 1)"),
                format!("u: \"f64[{rows}, 1, 1]\" = torch.ops.aten.unsqueeze.default(pu, 2)"),
                format!(
                    "e: {} = torch.ops.aten.expand.default(u, [{rows}, 1, {S}])",
                    ty(&[rows, 1, S])
                ),
                format!(
                    "cl: {} = torch.ops.aten.clone.default(e, memory_format = torch.contiguous_format)",
                    ty(&[rows, 1, S])
                ),
                format!(
                    "w: {} = torch.ops.aten.view.default(cl, [{rows}, {S}])",
                    ty(&[rows, S])
                ),
            ]
        }),
    };
    never_holds(&attack, 4, &megatron(N, 1));
}
