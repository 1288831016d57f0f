//! The factor of a lifted partial's local means over every mesh dim whose rows reach it
//! (`engine/local_means.rs`, `lifted_reduction`; issue 44), as DeepSeek's expert gradients
//! carry them: rows split over dp and ep, gathered over ep, then reduced over dp alone.
//!
//! Mesh `dp × ep × tp`: logits `z [B, V]`, labels `[B]`, tokens `a [B, V]` split over dp and
//! ep (dp outermost: rank `(d, e, t)` holds block `d * ep + e`); `p` split alike and a partial
//! sum on tp. The spec computes `sum(nll_loss_backward(1, log_softmax(z), labels) * p +
//! neg³(a) * (1/B))`. Each rank does the same on its rows (the loss a mean over its own rows,
//! `dp * ep` times the spec's pieces; the share scaled by `dp * ep / (B * tp)`), gathers the
//! sum's rows over ep, sums them, sums over tp and reduces over dp as a test gives. The value
//! reduced over dp is `dp * ep` times the spec's pieces: only a division by `dp * ep` after
//! dp's sum gives the spec's value. Every program is run by the interpreter and compared with
//! the spec.

use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::dispatch::{load_written, Declared};
use common::folded::Folded;
use common::values::close;

/// Rows of the spec's tensors.
const B: usize = 16;
/// Classes (the columns of every tensor).
const V: usize = 4;
/// The spec's factor on the tokens.
const SPEC: f64 = 1.0 / B as f64;

/// The graph on `rows` rows with the share scaled by `factor`: `gather` lines define `yy`
/// (`f64[_, V]`) from the sum `y` (none: a copy), and `tail` reduces `l` (the sum of `yy`)
/// into `out`.
fn graph(rows: usize, factor: f64, gather: &str, tail: &str) -> String {
    let t = format!("\"f64[{rows}, {V}]\"");
    let gather = if gather.is_empty() {
        format!("        yy: {t} = torch.ops.aten.clone.default(y)\n")
    } else {
        gather.to_string()
    };
    format!(
        "class G(torch.nn.Module):
    def forward(self, z: {t}, labels: \"i64[{rows}]\", p: {t}, a: {t}):
        ls: {t} = torch.ops.aten._log_softmax.default(z, 1, False)
        nf = torch.ops.aten.nll_loss_forward.default(ls, labels, None, 1, -100)
        nl: \"f64[]\" = nf[0]
        tw: \"f64[]\" = nf[1]
        one: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        gz: {t} = torch.ops.aten.nll_loss_backward.default(one, ls, labels, None, 1, -100, tw)
        gp: {t} = torch.ops.aten.mul.Tensor(gz, p)
        t1: {t} = torch.ops.aten.neg.default(a)
        t2: {t} = torch.ops.aten.neg.default(t1)
        t3: {t} = torch.ops.aten.neg.default(t2)
        m: {t} = torch.ops.aten.mul.Tensor(t3, {factor:?})
        y: {t} = torch.ops.aten.add.Tensor(gp, m)
{gather}        l: \"f64[]\" = torch.ops.aten.sum.default(yy)
{tail}        return (out,)
"
    )
}

/// Lines of an all-reduce `op` of the scalar `input` over `group`, defining `output`.
fn ar0(input: &str, op: &str, group: &str, output: &str) -> String {
    format!(
        "        {output}_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default({input}, '{op}', '{group}')
        {output}: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default({output}_ar)
"
    )
}

/// As `common::folded::check_and_run`, with a group `dp_ep` spanning dp and ep besides each
/// mesh dim's own: the verdict, whether every rank's `out` is the spec's, and the report.
fn check_and_run(
    folded: &Folded,
    spec: &str,
    rank: &str,
    leaves: &BTreeMap<String, Tensor>,
    rank_leaves: impl Fn(usize) -> BTreeMap<String, Tensor>,
) -> (Verdict, bool, String) {
    let ranks: usize = folded.mesh.iter().map(|d| d.1).product();
    let mut groups: Vec<(&str, Vec<&str>)> = folded.mesh.iter().map(|d| (d.0, vec![d.0])).collect();
    groups.push(("dp_ep", vec!["dp", "ep"]));
    let declared = Declared {
        name: folded.name,
        mesh: folded.mesh,
        groups: &groups,
        inputs: folded.inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let case = load_written(spec, &vec![rank.to_string(); ranks], &declared);
    let report = check_case(&case).unwrap();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec)).map(|t| t.data.to_vec()));
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..ranks).map(rank_leaves).collect();
    let right = run_program(&case.program, &per_rank, &RunConfig::default()).is_ok_and(|envs| {
        envs.iter().zip(&case.program.ranks).all(|(env, g)| {
            env.get(at(g))
                .is_some_and(|t: &Tensor| want.as_ref().is_some_and(|w| close(&t.data, w)))
        })
    });
    (report.verdict, right, report.render())
}

/// What the checker and the interpreter say of ranks on `dp × ep × tp` that reduce over dp
/// by `dp_tail` (lines reading the tp sum `t`, defining `out`), the sum's rows gathered over
/// ep first: the verdict, whether every rank's `out` is the spec's, and the report.
fn run(mesh: (usize, usize, usize), dp_tail: &str) -> (Verdict, bool, String) {
    run_gathered(mesh, true, dp_tail)
}

/// As [`run`], the rows gathered over ep first where `gathered` (else each rank sums its own).
fn run_gathered(
    (dp, ep, tp): (usize, usize, usize),
    gathered: bool,
    dp_tail: &str,
) -> (Verdict, bool, String) {
    let r = B / (dp * ep);
    let spec = graph(
        B,
        SPEC,
        "",
        "        out: \"f64[]\" = torch.ops.aten.clone.default(l)\n",
    );
    let gather = if !gathered {
        String::new()
    } else {
        format!(
        "        yg: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(y, {ep}, 'ep')
        yy: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.wait_tensor.default(yg)
",
            g = r * ep
        )
    };
    let tail = ar0("l", "sum", "tp", "t") + dp_tail;
    let rank = graph(r, SPEC * (dp * ep) as f64 / tp as f64, &gather, &tail);
    let split = "{ dp: Shard(0), ep: Shard(0) }".to_string();
    let folded = Folded {
        name: "lift-factor-groups",
        mesh: &[("dp", dp), ("ep", ep), ("tp", tp)],
        inputs: &[
            ("z", split.clone()),
            ("labels", split.clone()),
            (
                "p",
                "{ dp: Shard(0), ep: Shard(0), tp: Partial() }".to_string(),
            ),
            ("a", split),
        ],
    };
    let z: Vec<f64> = (0..B * V)
        .map(|i| ((i * 7) % 11) as f64 * 0.3 - 1.0)
        .collect();
    let labels: Vec<f64> = (0..B).map(|i| ((i * 3) % V) as f64).collect();
    let p: Vec<f64> = (0..B * V).map(|i| 1.5 - i as f64 * 0.125).collect();
    let a: Vec<f64> = (0..B * V).map(|i| 0.25 + i as f64 * 0.5).collect();
    let matrix = |rows: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![rows, V]), d);
    let vector = |rows: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::I64, vec![rows]), d);
    let leaves = BTreeMap::from([
        ("z".to_string(), matrix(B, z.clone())),
        ("labels".to_string(), vector(B, labels.clone())),
        ("p".to_string(), matrix(B, p.clone())),
        ("a".to_string(), matrix(B, a.clone())),
    ]);
    check_and_run(&folded, &spec, &rank, &leaves, |q| {
        // Rank `q = (d * ep + e) * tp + t` holds row block `d * ep + e`.
        let block = q / tp;
        let rows = |x: &[f64]| x[block * r * V..(block + 1) * r * V].to_vec();
        BTreeMap::from([
            ("z".to_string(), matrix(r, rows(&z))),
            (
                "labels".to_string(),
                vector(r, labels[block * r..(block + 1) * r].to_vec()),
            ),
            (
                "p".to_string(),
                matrix(r, rows(&p).iter().map(|v| v / tp as f64).collect()),
            ),
            ("a".to_string(), matrix(r, rows(&a))),
        ])
    })
}

/// dp's all-reduce `op` of `t`, divided by `divisor` where given.
fn dp_tail(op: &str, divisor: Option<usize>) -> String {
    match divisor {
        Some(n) => {
            ar0("t", op, "dp", "s")
                + &format!("        out: \"f64[]\" = torch.ops.aten.div.Tensor(s, {n})\n")
        }
        None => ar0("t", op, "dp", "out"),
    }
}

/// Meshes the cases run on (dp, ep, tp).
const MESHES: [(usize, usize, usize); 2] = [(2, 2, 2), (4, 2, 2)];

#[test]
fn rows_gathered_over_ep_summed_over_dp_and_divided_by_dp_times_ep_hold() {
    // The zoo's expert-gradient reduction (plan 039): a sum over dp alone, divided by the
    // data group's size, dp x ep, the factor of the pieces.
    for mesh in MESHES {
        let what = format!("sum over dp / (dp * ep), {mesh:?}");
        let (verdict, right, report) = run(mesh, &dp_tail("sum", Some(mesh.0 * mesh.1)));
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(right, "{what} is wrong when run\n{report}");
        assert_eq!(verdict, Verdict::Holds, "{what}\n{report}");
    }
}

#[test]
fn rows_gathered_over_ep_summed_over_dp_and_divided_by_dp_never_hold() {
    // A division by the reduction group's size alone leaves ep times the tensor: the factor
    // counts ep's local means too.
    for mesh in MESHES {
        let what = format!("sum over dp / dp, {mesh:?}");
        let (verdict, right, report) = run(mesh, &dp_tail("sum", Some(mesh.0)));
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(!right, "{what} is right when run\n{report}");
        assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
    }
}

#[test]
fn rows_gathered_over_ep_summed_over_dp_never_hold() {
    for mesh in MESHES {
        let what = format!("sum over dp, {mesh:?}");
        let (verdict, right, report) = run(mesh, &dp_tail("sum", None));
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(!right, "{what} is right when run\n{report}");
        assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
    }
}

#[test]
fn rows_gathered_over_ep_averaged_over_dp_never_hold() {
    // dp's average of pieces dp x ep times the spec's: ep times the tensor.
    for mesh in MESHES {
        let what = format!("avg over dp, {mesh:?}");
        let (verdict, right, report) = run(mesh, &dp_tail("avg", None));
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(!right, "{what} is right when run\n{report}");
        assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
        assert!(report.contains("averages over"), "{what}\n{report}");
    }
}

#[test]
fn rows_summed_over_a_group_of_dp_and_ep_and_divided_by_its_size_hold() {
    // Dense gradients in plan 039: each rank sums its own rows, the data group `dp_ep` sums
    // them, and the division by dp x ep completes the mean. The group reads the lift on both
    // its mesh dims; the factor counts once (on dp; 1 on ep), so dp x ep completes it.
    for mesh in MESHES {
        let what = format!("sum over dp_ep / (dp * ep), {mesh:?}");
        let tail = ar0("t", "sum", "dp_ep", "s")
            + &format!(
                "        out: \"f64[]\" = torch.ops.aten.div.Tensor(s, {})\n",
                mesh.0 * mesh.1
            );
        let (verdict, right, report) = run_gathered(mesh, false, &tail);
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(right, "{what} is wrong when run\n{report}");
        assert_eq!(verdict, Verdict::Holds, "{what}\n{report}");
    }
}

#[test]
fn rows_summed_over_a_group_of_dp_and_ep_and_divided_by_dp_never_hold() {
    for mesh in MESHES {
        let what = format!("sum over dp_ep / dp, {mesh:?}");
        let tail = ar0("t", "sum", "dp_ep", "s")
            + &format!(
                "        out: \"f64[]\" = torch.ops.aten.div.Tensor(s, {})\n",
                mesh.0
            );
        let (verdict, right, report) = run_gathered(mesh, false, &tail);
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(!right, "{what} is right when run\n{report}");
        assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
    }
}
