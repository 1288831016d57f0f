//! Gradient accumulation's loss: K microbatch means, each divided by K, added (issue 44).
//!
//! Each case runs on `dp=2` with `x: f32[8, 8]` sharded on its rows (`f32[4, 8]` per rank);
//! the spec computes `loss = mean(x * x)` and each rank the mean over microbatches of its
//! rows, all-reduced (sum) and divided by 2, `loss` declared `Replicate()`. A factor 1/K the
//! spec lacks left the pieces' factor unknown (`scale_unknown`), so the correct program was
//! inconclusive on the base (a398d43); it holds once the terms are proven to be the K
//! microbatches of one selection, each once. Every other case gives a wrong `loss`
//! (`shardproof run` exit 1) and must stay not held.

mod common;

use shardproof_check::Verdict;

/// The verdict of a case whose ranks both run `body` (lines reading `x` and writing `t`, the
/// rank's loss piece), then `loss = all_reduce(t, sum) / 2`.
fn verdict(body: &str, dir: &str) -> Verdict {
    let tag = format!("mb-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, rows: u32, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, 8]\"):\n{body}        return (loss,)\n"
        )
    };
    let spec = "        p: \"f32[8, 8]\" = torch.ops.aten.mul.Tensor(x, x)\n        loss: \"f32[]\" = torch.ops.aten.mean.default(p)\n";
    let rank = body.to_string()
        + "        a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'dp')\n"
        + "        w: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n"
        + "        loss: \"f32[]\" = torch.ops.aten.div.Scalar(w, 2)\n";
    files.push(("spec.py".to_string(), graph("Spec", 8, spec).to_string()));
    files.push(("r0.py".to_string(), graph("Rank", 4, &rank).to_string()));
    files.push(("r1.py".to_string(), graph("Rank", 4, &rank).to_string()));
    let case = "version: 1\nname: mb\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"dp\": dp\ninputs:\n  x: { dp: Shard(0) }\noutputs:\n  loss: Replicate()\n";
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

/// Microbatch `k`'s mean `m{k} = mean(a * b)` with `a`, `b` the rows `A` and `B` of `x`
/// (`start:end`), divided by `kk` (`d{k}`).
fn term(k: usize, a: (u32, u32), b: (u32, u32), kk: u32) -> String {
    let slice = |n: &str, (s, e): (u32, u32)| {
        format!(
            "        {n}: \"f32[{}, 8]\" = torch.ops.aten.slice.Tensor(x, 0, {s}, {e})\n",
            e - s
        )
    };
    slice(&format!("s{k}"), a)
        + &slice(&format!("r{k}"), b)
        + &format!(
            "        p{k}: \"f32[{}, 8]\" = torch.ops.aten.mul.Tensor(s{k}, r{k})\n        m{k}: \"f32[]\" = torch.ops.aten.mean.default(p{k})\n        d{k}: \"f32[]\" = torch.ops.aten.div.Scalar(m{k}, {kk})\n",
            a.1 - a.0
        )
}

/// `t = d0 + d1 (+ d2 ..)`.
fn sum(k: usize) -> String {
    let mut out = "        t0: \"f32[]\" = torch.ops.aten.add.Tensor(d0, d1)\n".to_string();
    for j in 2..k {
        out += &format!(
            "        t{}: \"f32[]\" = torch.ops.aten.add.Tensor(t{}, d{j})\n",
            j - 1,
            j - 2
        );
    }
    out + &format!(
        "        t: \"f32[]\" = torch.ops.aten.mul.Tensor(t{}, 1)\n",
        k - 2
    )
}

#[test]
fn two_microbatches_hold() {
    // Base: inconclusive (the 1/2 a factor the spec lacks).
    let body = term(0, (0, 2), (0, 2), 2) + &term(1, (2, 4), (2, 4), 2) + &sum(2);
    assert_eq!(verdict(&body, "two"), Verdict::Holds);
}

#[test]
fn four_microbatches_hold() {
    let body = term(0, (0, 1), (0, 1), 4)
        + &term(1, (1, 2), (1, 2), 4)
        + &term(2, (2, 3), (2, 3), 4)
        + &term(3, (3, 4), (3, 4), 4)
        + &sum(4);
    assert_eq!(verdict(&body, "four"), Verdict::Holds);
}

#[test]
fn a_wrong_microbatch_count_is_not_held() {
    // Each mean divided by 3 over 2 microbatches (`run`: `loss` is 2/3 of the spec's).
    let body = term(0, (0, 2), (0, 2), 3) + &term(1, (2, 4), (2, 4), 3) + &sum(2);
    assert_eq!(verdict(&body, "k3"), Verdict::Inconclusive);
}

#[test]
fn one_microbatch_counted_twice_is_not_held() {
    let body = term(0, (0, 2), (0, 2), 2) + &term(1, (0, 2), (0, 2), 2) + &sum(2);
    assert_eq!(verdict(&body, "twice"), Verdict::Inconclusive);
}

#[test]
fn microbatches_of_unequal_rows_are_not_held() {
    // The means of 1 and 3 rows, averaged: not the mean of the 4.
    let body = term(0, (0, 1), (0, 1), 2) + &term(1, (1, 4), (1, 4), 2) + &sum(2);
    assert_eq!(verdict(&body, "unequal"), Verdict::Inconclusive);
}

#[test]
fn a_term_reading_another_microbatch_is_not_held() {
    // Microbatch 1's product reads microbatch 0's rows as its second factor (a finding: rows
    // of two selections paired).
    let body = term(0, (0, 2), (0, 2), 2) + &term(1, (2, 4), (0, 2), 2) + &sum(2);
    assert_ne!(verdict(&body, "mixed"), Verdict::Holds);
}
