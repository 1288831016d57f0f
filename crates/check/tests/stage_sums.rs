//! A sum over the pipeline stages of their own terms (issue 44): each stage adds the terms
//! its layers compute (DeepSeek's auxiliary losses, gpt2's tied embedding gradients) and the
//! stages all-reduce (sum) over `pp`. It holds only where each stage's tensor is its share of
//! one spec sum (`rules::stage_shares`): every spec term computed by one stage, once per
//! microbatch, divided alike.
//!
//! Each case runs on `pp=2` with 2 microbatches of `x: f32[4, 8]` (rows 0:2 and 2:4). The
//! spec computes `s = mean(x @ w0) + mean(relu(x @ w0) @ w1)`; stage 0 the first term of each
//! microbatch (sending `relu(x_k @ w0)` on with tag k), stage 1 the second (receiving it), each
//! divided by 2, added, all-reduced over `pp`; `s` is declared `Replicate()`. The correct
//! program was inconclusive on the base (b82f5da: the all-reduce of the stages' own tensors is
//! unknown); every other case adds a wrong sum and must stay not held.

mod common;

use shardproof_check::Verdict;

/// Stage 0's microbatch `k` (rows `rows`) term `d{k} = mean(x_k @ w0) / kk`, and its send
/// (to stage 1, tag k).
fn first(k: usize, rows: (u32, u32), kk: u32) -> String {
    computed(k, rows, kk) + &format!(
        "        send{k}: \"f32[{}, 8]\" = torch.ops.shardproof_p2p.send.default(r{k}, 1, {k}, 'pp')\n",
        rows.1 - rows.0
    )
}

/// Stage 0's microbatch `k` term `d{k}` and the activation `r{k}` it sends on.
fn computed(k: usize, rows: (u32, u32), kk: u32) -> String {
    let (s, e) = rows;
    let n = e - s;
    format!(
        "        x{k}: \"f32[{n}, 8]\" = torch.ops.aten.slice.Tensor(x, 0, {s}, {e})\n\
         \x20       h{k}: \"f32[{n}, 8]\" = torch.ops.aten.mm.default(x{k}, w0)\n\
         \x20       m{k}: \"f32[]\" = torch.ops.aten.mean.default(h{k})\n\
         \x20       d{k}: \"f32[]\" = torch.ops.aten.div.Scalar(m{k}, {kk})\n\
         \x20       r{k}: \"f32[{n}, 8]\" = torch.ops.aten.relu.default(h{k})\n"
    )
}

/// Stage 1's microbatch `k` term `e{k} = mean(recv_k @ w1) / kk` (`None`: `n{k}`, not
/// divided).
fn second(k: usize, kk: Option<u32>) -> String {
    second_of(k, kk, 2)
}

/// [`second`] of a microbatch of `rows` rows.
fn second_of(k: usize, kk: Option<u32>, rows: u32) -> String {
    let out = format!(
        "        v{k}: \"f32[{rows}, 8]\" = torch.ops.shardproof_p2p.recv.default([{rows}, 8], torch.float32, 0, {k}, 'pp')\n\
         \x20       g{k}: \"f32[{rows}, 8]\" = torch.ops.aten.mm.default(v{k}, w1)\n\
         \x20       n{k}: \"f32[]\" = torch.ops.aten.mean.default(g{k})\n"
    );
    match kk {
        Some(kk) => {
            out + &format!("        e{k}: \"f32[]\" = torch.ops.aten.div.Scalar(n{k}, {kk})\n")
        }
        None => out,
    }
}

/// `t = a + b (+ c ..)` from the terms `terms`, then the all-reduce over `pp` into `s`.
fn reduce(terms: &[&str]) -> String {
    let mut out = String::new();
    let mut acc = terms[0].to_string();
    for (j, t) in terms.iter().enumerate().skip(1) {
        out += &format!("        t{j}: \"f32[]\" = torch.ops.aten.add.Tensor({acc}, {t})\n");
        acc = format!("t{j}");
    }
    out + &format!(
        "        a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default({acc}, 'sum', 'pp')\n\
         \x20       s: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n"
    )
}

/// The verdict of a case whose stage 0 runs `stage0`, stage 1 `stage1` (each ending in `s`),
/// stage 1 also given `x` and `w0` where `more` (to compute stage 0's term).
fn verdict(stage0: &str, stage1: &str, more: bool, dir: &str) -> Verdict {
    let module = |params: &str, body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, {params}):\n{body}        return (s,)\n"
        )
    };
    let spec = "        h: \"f32[4, 8]\" = torch.ops.aten.mm.default(x, w0)\n\
                \x20       m: \"f32[]\" = torch.ops.aten.mean.default(h)\n\
                \x20       r: \"f32[4, 8]\" = torch.ops.aten.relu.default(h)\n\
                \x20       g: \"f32[4, 8]\" = torch.ops.aten.mm.default(r, w1)\n\
                \x20       n: \"f32[]\" = torch.ops.aten.mean.default(g)\n\
                \x20       s: \"f32[]\" = torch.ops.aten.add.Tensor(m, n)\n";
    let all = "x: \"f32[4, 8]\", w0: \"f32[8, 8]\", w1: \"f32[8, 8]\"";
    let files = vec![
        ("spec.py".to_string(), module(all, spec)),
        (
            "r0.py".to_string(),
            module("x: \"f32[4, 8]\", w0: \"f32[8, 8]\"", stage0),
        ),
        (
            "r1.py".to_string(),
            module(if more { all } else { "w1: \"f32[8, 8]\"" }, stage1),
        ),
        (
            "case.yaml".to_string(),
            format!(
                "version: 1\nname: stage-sums\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2 }}\n  \
                 graphs: [r0.py, r1.py]\n  groups:\n    \"pp\": pp\ninputs:\n  \
                 x: {{ placement: Replicate(), at: {{ pp: {} }} }}\n  \
                 w0: {{ placement: Replicate(), at: {{ pp: {} }} }}\n  \
                 w1: {{ placement: Replicate(), at: {{ pp: 1 }} }}\noutputs:\n  s: Replicate()\n",
                if more { "[0, 1]" } else { "0" },
                if more { "[0, 1]" } else { "0" },
            ),
        ),
    ];
    common::hand::check_files(&format!("stage-sums-{dir}"), &files)
}

fn stage0() -> String {
    first(0, (0, 2), 2) + &first(1, (2, 4), 2) + &reduce(&["d0", "d1"])
}

fn stage1() -> String {
    second(0, Some(2)) + &second(1, Some(2)) + &reduce(&["e0", "e1"])
}

#[test]
fn each_stage_adding_its_own_terms_holds() {
    assert_eq!(verdict(&stage0(), &stage1(), false, "ok"), Verdict::Holds);
}

#[test]
fn a_stage_adding_a_term_twice_is_not_held() {
    // Stage 1 adds its first microbatch's term twice.
    let twice = second(0, Some(2)) + &second(1, Some(2)) + &reduce(&["e0", "e1", "e0"]);
    assert_eq!(
        verdict(&stage0(), &twice, false, "twice"),
        Verdict::Inconclusive
    );
}

#[test]
fn a_stage_dropping_a_microbatch_is_not_held() {
    let dropped = second(0, Some(2)) + &second(1, Some(2)) + &reduce(&["e0"]);
    assert_eq!(
        verdict(&stage0(), &dropped, false, "drop"),
        Verdict::Inconclusive
    );
}

#[test]
fn a_stage_adding_the_other_stages_term_is_not_held() {
    // Stage 1 adds stage 0's term (computed again from `x` and `w0`) to its own.
    let theirs = second(0, Some(2))
        + &second(1, Some(2))
        + &computed(2, (0, 2), 2)
        + &computed(3, (2, 4), 2)
        + &reduce(&["e0", "e1", "d2", "d3"]);
    assert_eq!(
        verdict(&stage0(), &theirs, true, "theirs"),
        Verdict::Inconclusive
    );
}

#[test]
fn a_stage_adding_the_received_term_of_the_other_is_not_held() {
    // Stage 1 receives stage 0's sum and adds it to its own: stage 0's terms twice.
    let sent = stage0().replace(
        "        a: \"f32[]\"",
        "        sent: \"f32[]\" = torch.ops.shardproof_p2p.send.default(t1, 1, 9, 'pp')\n        a: \"f32[]\"",
    );
    let got = second(0, Some(2))
        + &second(1, Some(2))
        + "        o: \"f32[]\" = torch.ops.shardproof_p2p.recv.default([], torch.float32, 0, 9, 'pp')\n"
        + &reduce(&["e0", "e1", "o"]);
    assert_ne!(verdict(&sent, &got, false, "received"), Verdict::Holds);
}

#[test]
fn a_microbatch_counted_twice_is_not_held() {
    // Stage 0's two terms both read rows 0:2.
    let twice = first(0, (0, 2), 2) + &first(1, (0, 2), 2) + &reduce(&["d0", "d1"]);
    assert_eq!(
        verdict(&twice, &stage1(), false, "mb-twice"),
        Verdict::Inconclusive
    );
}

#[test]
fn terms_divided_by_another_count_are_not_held() {
    let by3 = first(0, (0, 2), 3) + &first(1, (2, 4), 3) + &reduce(&["d0", "d1"]);
    assert_eq!(
        verdict(&by3, &stage1(), false, "by3"),
        Verdict::Inconclusive
    );
    // One stage divides by the microbatch count, the other does not.
    let undivided = second(0, None) + &second(1, None) + &reduce(&["n0", "n1"]);
    assert_eq!(
        verdict(&stage0(), &undivided, false, "undivided"),
        Verdict::Inconclusive
    );
}

#[test]
fn microbatches_of_other_sizes_are_not_held() {
    // Stage 0's second term reads row 1 alone (inside the first's rows 0:2), and stage 1
    // receives that row.
    let overlapping = first(0, (0, 2), 2) + &first(1, (1, 2), 2) + &reduce(&["d0", "d1"]);
    let one_row = second(0, Some(2)) + &second_of(1, Some(2), 1) + &reduce(&["e0", "e1"]);
    assert_eq!(
        verdict(&overlapping, &one_row, false, "sizes"),
        Verdict::Inconclusive
    );
}
