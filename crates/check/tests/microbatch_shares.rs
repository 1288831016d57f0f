//! A microbatch average of pending shares (`rows::microbatch_average`, `engine/scaling.rs`;
//! issue 44): DeepSeek's stages divide each layer's balance loss by tp (every tp rank computes
//! the whole loss, the sum over tp adds the shares) and each microbatch's sum by K, so the
//! microbatch average's terms are shares of tp whose factor on dp is not known until tp's
//! sum. The average is read where every microbatch's mean is the same pending share
//! (`share_of`), and the share is kept on the sum until tp's all-reduce makes up for it.
//!
//! Mesh `dp × tp`: tokens `x [B, H]` sharded on dp, replicated on tp. The spec computes
//! `mean(neg³(x)) * C`; each rank runs K microbatches of its rows (`slice` along dim 0), each
//! `mean(neg³(x_k)) * C / tp / K` (or the variant a test gives), adds them, sums over tp, sums
//! over dp and divides by dp. Every program is run by the interpreter and compared with the
//! spec: a wrong one never holds.

use shardproof_check::Verdict;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::folded::{check_and_run, Folded};

/// Rows of the spec's tokens.
const B: usize = 16;
/// Columns of the tokens.
const H: usize = 4;
/// The loss's own factor (the spec's too).
const C: f64 = 0.375;

/// One microbatch's term: `k`, its rows `h`, and the lines defining `d{k}` from the mean
/// `q{k}` (`f64[]`) of its rows.
type Term<'a> = &'a dyn Fn(usize) -> String;

/// The rank graph: `micro` microbatches of `rows / micro` rows each, term lines from `term`,
/// added into `t`, then `tail` (reading `t`, defining `out`).
fn rank_graph(rows: usize, micro: usize, term: Term, tail: &str) -> String {
    let h = rows / micro;
    let mut body = String::new();
    for k in 0..micro {
        body += &format!(
            "        x{k}: \"f64[{h}, {H}]\" = torch.ops.aten.slice.Tensor(x, 0, {}, {})
        a{k}: \"f64[{h}, {H}]\" = torch.ops.aten.neg.default(x{k})
        b{k}: \"f64[{h}, {H}]\" = torch.ops.aten.neg.default(a{k})
        c{k}: \"f64[{h}, {H}]\" = torch.ops.aten.neg.default(b{k})
        q{k}: \"f64[]\" = torch.ops.aten.mean.default(c{k})
        aux_loss_{k}: \"f64[]\" = torch.ops.aten.mul.Tensor(q{k}, {C:?})
",
            k * h,
            (k + 1) * h
        );
        body += &term(k);
    }
    let mut sum = "d0".to_string();
    for k in 1..micro {
        let next = if k + 1 == micro {
            "t".to_string()
        } else {
            format!("s{k}")
        };
        body += &format!("        {next}: \"f64[]\" = torch.ops.aten.add.Tensor({sum}, d{k})\n");
        sum = next;
    }
    format!(
        "class G(torch.nn.Module):
    def forward(self, x: \"f64[{rows}, {H}]\"):
{body}{tail}        return (out,)
"
    )
}

/// The spec: `mean(neg³(x)) * C`.
fn spec_graph() -> String {
    format!(
        "class G(torch.nn.Module):
    def forward(self, x: \"f64[{B}, {H}]\"):
        a: \"f64[{B}, {H}]\" = torch.ops.aten.neg.default(x)
        b: \"f64[{B}, {H}]\" = torch.ops.aten.neg.default(a)
        c: \"f64[{B}, {H}]\" = torch.ops.aten.neg.default(b)
        q: \"f64[]\" = torch.ops.aten.mean.default(c)
        aux_loss: \"f64[]\" = torch.ops.aten.mul.Tensor(q, {C:?})
        out: \"f64[]\" = torch.ops.aten.clone.default(aux_loss)
        return (out,)
"
    )
}

/// Lines of an all-reduce sum of the scalar `input` over `group`, defining `output`.
fn ar0(input: &str, group: &str, output: &str) -> String {
    format!(
        "        {output}_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default({input}, 'sum', '{group}')
        {output}: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default({output}_ar)
"
    )
}

/// What the checker and the interpreter say of ranks on `dp × tp` running `micro`
/// microbatches with terms `term`: the verdict, whether every rank's `out` is the spec's, and
/// the report.
fn run((dp, tp): (usize, usize), micro: usize, term: Term) -> (Verdict, bool, String) {
    let rows = B / dp;
    let tail = ar0("t", "tp", "u")
        + &ar0("u", "dp", "w")
        + &format!("        out: \"f64[]\" = torch.ops.aten.div.Scalar(w, {dp})\n");
    let rank = rank_graph(rows, micro, term, &tail);
    let folded = Folded {
        name: "microbatch-shares",
        mesh: &[("dp", dp), ("tp", tp)],
        inputs: &[("x", "{ dp: Shard(0) }".to_string())],
    };
    let data: Vec<f64> = (0..B * H)
        .map(|i| ((i * 5) % 13) as f64 * 0.25 - 1.0)
        .collect();
    let tensor = |r: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![r, H]), d);
    let leaves = BTreeMap::from([("x".to_string(), tensor(B, data.clone()))]);
    check_and_run(&folded, &spec_graph(), &rank, &leaves, |q| {
        let d = q / tp;
        BTreeMap::from([(
            "x".to_string(),
            tensor(rows, data[d * rows * H..(d + 1) * rows * H].to_vec()),
        )])
    })
}

/// The term `aux_loss_k / tp / K` (DeepSeek's share, then the microbatch's 1/K).
fn share_then_k(tp: usize, k_div: usize) -> impl Fn(usize) -> String {
    move |k| {
        format!(
            "        aux_share_{k}: \"f64[]\" = torch.ops.aten.div.Scalar(aux_loss_{k}, {tp})
        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(aux_share_{k}, {k_div})
"
        )
    }
}

/// Meshes `(dp, tp)` the cases run on.
const MESHES: [(usize, usize); 3] = [(2, 2), (4, 2), (2, 4)];

#[test]
fn microbatch_shares_of_tp_averaged_hold() {
    // Base: inconclusive (the average took no term with a pending share, and the division by
    // K dropped the share: the dp all-reduce read an unknown factor).
    for mesh in MESHES {
        for micro in [2, 4] {
            let term = share_then_k(mesh.1, micro);
            let what = format!("shares averaged, K = {micro}, {mesh:?}");
            let (verdict, right, report) = run(mesh, micro, &term);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(right, "{what} is wrong when run\n{report}");
            assert_eq!(verdict, Verdict::Holds, "{what}\n{report}");
        }
    }
}

/// Asserts the interpreter finds the program wrong and the checker does not say it holds.
fn wrong_never_holds(what: &str, mesh: (usize, usize), micro: usize, term: Term) {
    let (verdict, right, report) = run(mesh, micro, term);
    eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
    assert!(!right, "{what} is right when run\n{report}");
    assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
}

#[test]
fn microbatch_shares_divided_by_another_count_never_hold() {
    // Two microbatches each divided by 3 (or 4): a wrong K.
    for mesh in MESHES {
        for wrong in [3, 4] {
            let term = share_then_k(mesh.1, wrong);
            wrong_never_holds(
                &format!("K = 2 divided by {wrong}, {mesh:?}"),
                mesh,
                2,
                &term,
            );
        }
    }
}

#[test]
fn microbatches_missing_the_share_never_hold() {
    // No division by tp: the sum over tp counts every tp rank's loss.
    for mesh in MESHES {
        let term = |k: usize| {
            format!("        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(aux_loss_{k}, 2)\n")
        };
        wrong_never_holds(&format!("no share, {mesh:?}"), mesh, 2, &term);
    }
}

#[test]
fn one_microbatch_missing_the_share_never_holds() {
    // Microbatch 0 divided by tp, microbatch 1 not: the terms hold different shares.
    for mesh in MESHES {
        let tp = mesh.1;
        let term = move |k: usize| {
            if k == 0 {
                share_then_k(tp, 2)(k)
            } else {
                format!("        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(aux_loss_{k}, 2)\n")
            }
        };
        wrong_never_holds(&format!("one share missing, {mesh:?}"), mesh, 2, &term);
    }
}

#[test]
fn microbatch_shares_of_another_size_never_hold() {
    // dp = 2 x tp = 4: each loss divided by 2 (dp's size, not tp's) as its share.
    let term = share_then_k(2, 2);
    wrong_never_holds("share by 2 on tp = 4", (2, 4), 2, &term);
}

#[test]
fn one_microbatch_counted_twice_never_holds() {
    // Both terms read microbatch 0's rows (through its mean): x[h:2h] never counts.
    let mesh = (2, 2);
    let term = |k: usize| {
        format!(
            "        aux_share_{k}: \"f64[]\" = torch.ops.aten.div.Scalar(aux_loss_0, 2)
        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(aux_share_{k}, 2)
"
        )
    };
    wrong_never_holds("microbatch 0 twice", mesh, 2, &term);
}
