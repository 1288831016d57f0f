//! A folded share lifted by a partial plus it while dp still shards it (`engine/local_means.rs`
//! `commit_folded`; issue 44). The share's pieces on dp are local
//! means (each dp times the spec's); the sum is one tensor only where the partial's pieces on
//! dp are local means too: the main loss gradient (`nll_loss_backward` with the mean over the
//! rank's rows) beside the balance loss's share, as DeepSeek's router gradient adds them.
//!
//! Mesh `dp × tp`: logits `z [B, V]`, labels `[B]`, tokens `a [B, V]` sharded on dp; `p`
//! sharded on dp and a partial sum on tp. The spec computes
//! `sum(nll_loss_backward(1, log_softmax(z), labels) * p + neg³(a) * (1/B))`; each rank does
//! the same on its rows with the local mean's factor over tp for the share, sums, sums over tp
//! and reduces over dp as a test gives. Every program is run by the interpreter and compared
//! with the spec.

use shardproof_check::Verdict;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::folded::{check_and_run, Folded};

/// Rows of the spec's tensors.
const B: usize = 8;
/// Classes (the columns of every tensor).
const V: usize = 4;
/// The spec's factor on the tokens.
const SPEC: f64 = 1.0 / B as f64;

/// The rank's (or the spec's, `rows` = `B`) graph: `partial` lines define `gp` (`f64[rows, V]`)
/// from the loss gradient `gz`, the share `m` is the tokens scaled by `factor`, `post` lines
/// define `yy` from their sum `y` (none: `yy` is `y`; `ROWS` in them stands for `rows`), and
/// `tail` reduces `l` (the sum of `yy`) into `out`.
fn graph(rows: usize, partial: &str, factor: f64, post: &str, tail: &str) -> String {
    let t = format!("\"f64[{rows}, {V}]\"");
    let post = if post.is_empty() {
        format!("        yy: {t} = torch.ops.aten.clone.default(y)\n")
    } else {
        post.replace("ROWS", &rows.to_string())
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
{partial}        t1: {t} = torch.ops.aten.neg.default(a)
        t2: {t} = torch.ops.aten.neg.default(t1)
        t3: {t} = torch.ops.aten.neg.default(t2)
        m: {t} = torch.ops.aten.mul.Tensor(t3, {factor:?})
        y: {t} = torch.ops.aten.add.Tensor(gp, m)
{post}        l: \"f64[]\" = torch.ops.aten.sum.default(yy)
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

/// The spec's partial side: the loss gradient times `p`.
fn gradient_times_p(rows: usize) -> String {
    format!("        gp: \"f64[{rows}, {V}]\" = torch.ops.aten.mul.Tensor(gz, p)\n")
}

/// What the checker and the interpreter say of ranks on `dp × tp` running `partial` (lines
/// defining `gp` from `gz`, `p`, `z`) and reducing over dp by `dp_op` after tp's sum, against
/// the spec's `gz * p`: the verdict, whether every rank's `out` is the spec's, and the report.
fn run(mesh: (usize, usize), partial: &str, dp_op: &str) -> (Verdict, bool, String) {
    run_with_spec_partial(mesh, partial, &gradient_times_p(B), "", dp_op)
}

/// The words of a lift whose partial's pieces are not known to be local means
/// (`engine::local_means::commit_folded`).
const MIXED: &str = "not known to be local means";

/// The words of a reduction of a lifted partial whose pieces are no longer known to be local
/// means (`engine::local_means::lifted_without_local_means`).
const UNREAD: &str = "no longer known to be local means";

/// Meshes the cases run on.
const MESHES: [(usize, usize); 2] = [(4, 2), (2, 2)];

#[test]
fn the_loss_gradient_plus_the_share_averaged_over_dp_holds() {
    // Both sides local means on dp: after tp's sum each dp piece is dp times the spec's, and
    // dp's average is the spec's sum. The lift is taken (no unknown at it); dp's average over
    // a group as large as the pieces' factor (dp) completes the mean
    // (`local_means::lifted_reduction`).
    for mesh in MESHES {
        let what = format!("gradient plus share, dp avg, {mesh:?}");
        let (verdict, right, report) = run(mesh, &gradient_times_p(B / mesh.0), "avg");
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(right, "{what} is wrong when run\n{report}");
        assert_eq!(verdict, Verdict::Holds, "{what}\n{report}");
        assert!(!report.contains(MIXED), "{what}\n{report}");
        assert!(!report.contains(UNREAD), "{what}\n{report}");
    }
}

#[test]
fn the_loss_gradient_squared_plus_the_share_never_holds() {
    // The partial side is a product of two local means (dp² times the spec's on dp): the
    // sum mixes factors; no reduction over dp gives the spec's.
    for mesh in MESHES {
        let r = B / mesh.0;
        let partial = format!(
            "        gg: \"f64[{r}, {V}]\" = torch.ops.aten.mul.Tensor(gz, gz)\n\
             \x20       gp: \"f64[{r}, {V}]\" = torch.ops.aten.mul.Tensor(gg, p)\n"
        );
        for op in ["avg", "sum"] {
            let what = format!("gradient squared plus share, dp {op}, {mesh:?}");
            let (verdict, right, report) = run_squared(mesh, &partial, op);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(!right, "{what} is right when run\n{report}");
            assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
            assert!(report.contains(MIXED), "{what}\n{report}");
        }
    }
}

/// As [`run`], against a spec whose partial side is the squared gradient times `p` too:
/// only the factors differ.
fn run_squared(mesh: (usize, usize), partial: &str, dp_op: &str) -> (Verdict, bool, String) {
    let spec_partial = format!(
        "        gg: \"f64[{B}, {V}]\" = torch.ops.aten.mul.Tensor(gz, gz)\n\
         \x20       gp: \"f64[{B}, {V}]\" = torch.ops.aten.mul.Tensor(gg, p)\n"
    );
    run_with_spec_partial(mesh, partial, &spec_partial, "", dp_op)
}

#[test]
fn the_loss_gradient_plus_an_input_plus_the_share_never_holds() {
    // The partial side adds `p` itself (the spec's pieces on dp) to the loss gradient's
    // product (local means): the sum mixes factors.
    for mesh in MESHES {
        let r = B / mesh.0;
        let partial = format!(
            "        gq: \"f64[{r}, {V}]\" = torch.ops.aten.mul.Tensor(gz, p)\n\
             \x20       gp: \"f64[{r}, {V}]\" = torch.ops.aten.add.Tensor(gq, p)\n"
        );
        let spec_partial = format!(
            "        gq: \"f64[{B}, {V}]\" = torch.ops.aten.mul.Tensor(gz, p)\n\
             \x20       gp: \"f64[{B}, {V}]\" = torch.ops.aten.add.Tensor(gq, p)\n"
        );
        for op in ["avg", "sum"] {
            let what = format!("gradient plus input plus share, dp {op}, {mesh:?}");
            let (verdict, right, report) =
                run_with_spec_partial(mesh, &partial, &spec_partial, "", op);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(!right, "{what} is right when run\n{report}");
            assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
            assert!(report.contains(MIXED), "{what}\n{report}");
        }
    }
}

#[test]
fn the_loss_gradient_plus_the_share_summed_over_dp_never_holds() {
    // dp sums the ranks' local means (each dp times the spec's) with no division: dp times
    // the tensor on every rank. The pieces' factor (dp) is read at the sum (`times_n`), and
    // only a division by it completes the mean (was: held).
    for mesh in MESHES {
        let what = format!("gradient plus share, dp sum, {mesh:?}");
        let (verdict, right, report) = run(mesh, &gradient_times_p(B / mesh.0), "sum");
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(!right, "{what} is right when run\n{report}");
        assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
    }
}

#[test]
fn the_loss_gradient_with_a_number_scattered_in_plus_the_share_never_holds() {
    // A number written into the loss gradient (`scatter.value`) is the spec's own, not a
    // local mean: the partial side mixes factors on dp, whatever dp's reduction.
    for mesh in MESHES {
        let r = B / mesh.0;
        let scattered = |rows: usize| {
            format!(
                "        ix: \"i64[{rows}, 1]\" = torch.ops.aten.unsqueeze.default(labels, 1)\n\
                 \x20       gs: \"f64[{rows}, {V}]\" = torch.ops.aten.scatter.value(gz, 1, ix, 0.5)\n\
                 \x20       gp: \"f64[{rows}, {V}]\" = torch.ops.aten.mul.Tensor(gs, p)\n"
            )
        };
        for op in ["avg", "sum/n"] {
            let what = format!("gradient with a number scattered in plus share, dp {op}, {mesh:?}");
            let (verdict, right, report) =
                run_with_spec_partial(mesh, &scattered(r), &scattered(B), "", op);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(!right, "{what} is right when run\n{report}");
            assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
            assert!(report.contains(MIXED), "{what}\n{report}");
        }
    }
}

#[test]
fn the_loss_gradient_plus_the_share_summed_and_divided_over_dp_holds() {
    // dp's sum divided by dp (as the zoo reduces every gradient over dp): the division by the
    // pieces' factor completes the mean.
    for mesh in MESHES {
        let what = format!("gradient plus share, dp sum/n, {mesh:?}");
        let (verdict, right, report) = run(mesh, &gradient_times_p(B / mesh.0), "sum/n");
        eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
        assert!(right, "{what} is wrong when run\n{report}");
        assert_eq!(verdict, Verdict::Holds, "{what}\n{report}");
        assert!(!report.contains(UNREAD), "{what}\n{report}");
    }
}

#[test]
fn the_loss_gradient_plus_the_share_divided_twice_over_dp_never_holds() {
    // Both sides divided by dp before the sum, then averaged over dp (or summed and divided
    // by dp): 1/dp of the tensor.
    for mesh in MESHES {
        let r = B / mesh.0;
        let divided = format!(
            "        gq: \"f64[{r}, {V}]\" = torch.ops.aten.mul.Tensor(gz, p)\n\
             \x20       gp: \"f64[{r}, {V}]\" = torch.ops.aten.div.Tensor(gq, {})\n",
            mesh.0
        );
        for op in ["avg", "sum/n"] {
            let what = format!("gradient divided by dp plus share, dp {op}, {mesh:?}");
            let (verdict, right, report) = run(mesh, &divided, op);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(!right, "{what} is right when run\n{report}");
            assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
        }
    }
}

#[test]
fn the_lifted_sum_times_the_loss_gradient_never_holds() {
    // After a consistent lift, the sum times the loss gradient again: dp's pieces are two
    // local means' product (dp² times the spec's), which no reduction over dp makes the
    // spec's. The lift's record (`lifted_means`) reaches dp's reduction, where the walk does
    // not find local means: not proven, however dp reduces (was: the sum held).
    for mesh in MESHES {
        let r = B / mesh.0;
        let post = format!("        yy: \"f64[ROWS, {V}]\" = torch.ops.aten.mul.Tensor(y, gz)\n");
        for op in ["avg", "sum", "sum/n"] {
            let what = format!("lifted sum times the loss gradient, dp {op}, {mesh:?}");
            let (verdict, right, report) =
                run_with_spec_partial(mesh, &gradient_times_p(r), &gradient_times_p(B), &post, op);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(!right, "{what} is right when run\n{report}");
            assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
            assert!(report.contains(UNREAD), "{what}\n{report}");
        }
    }
}

/// As [`run`], with the spec's partial side `spec_partial` (lines defining `gp` on `B` rows).
fn run_with_spec_partial(
    (dp, tp): (usize, usize),
    partial: &str,
    spec_partial: &str,
    post: &str,
    dp_op: &str,
) -> (Verdict, bool, String) {
    let r = B / dp;
    let spec = graph(
        B,
        spec_partial,
        SPEC,
        post,
        "        out: \"f64[]\" = torch.ops.aten.clone.default(l)\n",
    );
    let share = SPEC * dp as f64 / tp as f64;
    // `sum/n`: dp's sum divided by dp afterwards (the zoo's gradient reduction).
    let tail = match dp_op {
        "sum/n" => {
            ar0("l", "sum", "tp", "t")
                + &ar0("t", "sum", "dp", "s")
                + &format!("        out: \"f64[]\" = torch.ops.aten.div.Tensor(s, {dp})\n")
        }
        _ => ar0("l", "sum", "tp", "t") + &ar0("t", dp_op, "dp", "out"),
    };
    let rank = graph(r, partial, share, post, &tail);
    let folded = Folded {
        name: "lift-local-means",
        mesh: &[("dp", dp), ("tp", tp)],
        inputs: &[
            ("z", "{ dp: Shard(0) }".to_string()),
            ("labels", "{ dp: Shard(0) }".to_string()),
            ("p", "{ dp: Shard(0), tp: Partial() }".to_string()),
            ("a", "{ dp: Shard(0) }".to_string()),
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
        let d = q / tp;
        let rows = |x: &[f64]| x[d * r * V..(d + 1) * r * V].to_vec();
        BTreeMap::from([
            ("z".to_string(), matrix(r, rows(&z))),
            (
                "labels".to_string(),
                vector(r, labels[d * r..(d + 1) * r].to_vec()),
            ),
            (
                "p".to_string(),
                matrix(r, rows(&p).iter().map(|v| v / tp as f64).collect()),
            ),
            ("a".to_string(), matrix(r, rows(&a))),
        ])
    })
}
