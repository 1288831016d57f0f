//! Adversarial review of `check`'s records of sums over part of each rank's rows
//! (`part_rows`, `scale_unknown`, `rows::microbatch_sum`) and of the records a recv copies
//! from its sender (`engine/recv.rs`). Every program is run by the interpreter and compared
//! with the spec: one asserted never to hold is wrong in its values, one asserted to hold is
//! right. Only value differences that a hold claims count (docs/check.md).
//!
//! One stage: mesh `dp × ep` of (2, 2); `a [B, V]` split over dp, replicated over ep; the
//! spec reduces `a` to a scalar, the ranks reduce (part of) their rows and all-reduce over dp.
//! Across a message: mesh `pp × dp` of (2, 2); stage 0 holds `a` (split over dp), reduces
//! and sends; stage 1 receives, all-reduces over dp, and only its `out` is declared.

use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::dispatch::{load_written, Declared};
use common::values::close;

/// Rows of the spec's tensor.
const B: usize = 16;
/// Columns.
const V: usize = 4;
/// The data-parallel mesh dim's size.
const DP: usize = 2;
/// The expert-parallel mesh dim's size (replicating `a`), one stage.
const EP: usize = 2;
/// The pipeline mesh dim's size, across a message.
const PP: usize = 2;
/// Rows of one rank's shard.
const R: usize = B / DP;

/// The spec's tensor `a`.
fn spec_a() -> Vec<f64> {
    (0..B * V).map(|i| 0.25 + i as f64 * 0.5).collect()
}

/// A `[n, V]` tensor of `d`.
fn matrix(n: usize, d: Vec<f64>) -> Tensor {
    Tensor::new(Meta::new(DType::F64, vec![n, V]), d)
}

/// The spec reducing `a` to `out` by `spec_op` (`sum`, `mean`, `amax`).
fn spec_text(spec_op: &str) -> String {
    format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.{spec_op}.default(a)
        return (out,)
"
    )
}

/// The verdict, whether every declared rank's `out` equals the spec's, and the report.
fn judge(
    spec: &str,
    texts: &[String],
    declared: &Declared,
    per_rank: &[BTreeMap<String, Tensor>],
    compared: &dyn Fn(usize) -> bool,
) -> (Verdict, bool, String) {
    let case = load_written(spec, texts, declared);
    let report = check_case(&case).unwrap();
    let leaves = BTreeMap::from([("a".to_string(), matrix(B, spec_a()))]);
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default()).unwrap();
    let want = want.get(at(&case.spec)).unwrap().data.to_vec();
    let envs = run_program(&case.program, per_rank, &RunConfig::default()).unwrap();
    let right = envs
        .iter()
        .zip(&case.program.ranks)
        .enumerate()
        .filter(|(q, _)| compared(*q))
        .all(|(_, (env, g))| close(&env.get(at(g)).unwrap().data, &want));
    (report.verdict, right, report.render())
}

/// One stage: the rank at dp coordinate `d` runs `body_of(d)` on its rows `a` (`[R, V]`)
/// into the scalar `l`, all-reduced by `reduce_op` over dp into `out`; the spec reduces `a`
/// by `spec_op`.
fn one_stage(
    spec_op: &str,
    reduce_op: &str,
    body_of: &dyn Fn(usize) -> String,
) -> (Verdict, bool, String) {
    one_stage_at(spec_op, reduce_op, &|d, _| body_of(d))
}

/// [`one_stage`] where the body may depend on the rank's ep coordinate too (`body_of(d, e)`).
fn one_stage_at(
    spec_op: &str,
    reduce_op: &str,
    body_of: &dyn Fn(usize, usize) -> String,
) -> (Verdict, bool, String) {
    let texts: Vec<String> = (0..DP * EP)
        .map(|q| {
            format!(
                "class G(torch.nn.Module):
    def forward(self, a: \"f64[{R}, {V}]\"):
{body}        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(l, '{reduce_op}', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
",
                body = body_of(q / EP, q % EP)
            )
        })
        .collect();
    let groups: Vec<(&str, Vec<&str>)> = vec![("dp", vec!["dp"]), ("ep", vec!["ep"])];
    let inputs = [("a", "{ dp: Shard(0), ep: Replicate() }".to_string())];
    let declared = Declared {
        name: "review-records",
        mesh: &[("dp", DP), ("ep", EP)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let a = spec_a();
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..DP * EP)
        .map(|q| {
            let d = q / EP;
            BTreeMap::from([(
                "a".to_string(),
                matrix(R, a[d * R * V..(d + 1) * R * V].to_vec()),
            )])
        })
        .collect();
    judge(&spec_text(spec_op), &texts, &declared, &per_rank, &|_| true)
}

/// [`one_stage`] summing, with the same body on every rank.
fn sums(body: &str) -> (Verdict, bool, String) {
    one_stage("sum", "sum", &|_| body.to_string())
}

/// The lines summing rows `[start, end)` of `a` (sliced with `step`) into `l{k}`.
fn part_sum(k: usize, start: usize, end: usize, step: usize) -> String {
    let n = (end - start).div_ceil(step);
    format!(
        "        s{k}: \"f64[{n}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end}, {step})
        l{k}: \"f64[]\" = torch.ops.aten.sum.default(s{k})
"
    )
}

/// Asserts a wrong program never holds.
fn never_holds((verdict, right, report): (Verdict, bool, String), what: &str) {
    assert!(!right, "{what} is right when run");
    assert_ne!(verdict, Verdict::Holds, "{what}: {report}");
}

/// Asserts a right program holds.
fn holds((verdict, right, report): (Verdict, bool, String), what: &str) {
    assert!(right, "{what} is wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{what}: {report}");
}

// ---- One microbatch selected by other operators than a slice ----

#[test]
fn one_microbatch_narrowed_never_holds() {
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.narrow.default(a, 0, 0, 4)
        l: \"f64[]\" = torch.ops.aten.sum.default(s0)
"
    );
    never_holds(sums(&body), "one narrowed microbatch's sum");
}

#[test]
fn one_microbatch_selected_from_a_view_never_holds() {
    let body = format!(
        "        w: \"f64[2, 4, {V}]\" = torch.ops.aten.view.default(a, [2, 4, {V}])
        s0: \"f64[4, {V}]\" = torch.ops.aten.select.int(w, 0, 0)
        l: \"f64[]\" = torch.ops.aten.sum.default(s0)
"
    );
    never_holds(sums(&body), "one selected microbatch's sum");
}

#[test]
fn one_microbatch_split_off_never_holds() {
    let body = format!(
        "        sp = torch.ops.aten.split.Tensor(a, 4)
        s0: \"f64[4, {V}]\" = sp[0]
        l: \"f64[]\" = torch.ops.aten.sum.default(s0)
"
    );
    never_holds(sums(&body), "one split microbatch's sum");
}

#[test]
fn one_microbatch_index_selected_never_holds() {
    let body = format!(
        "        ix: \"i64[4]\" = torch.ops.aten.arange.start(0, 4, dtype = torch.int64)
        s0: \"f64[4, {V}]\" = torch.ops.aten.index_select.default(a, 0, ix)
        l: \"f64[]\" = torch.ops.aten.sum.default(s0)
"
    );
    never_holds(sums(&body), "one index-selected microbatch's sum");
}

#[test]
fn one_microbatch_max_reduced_by_max_never_holds() {
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        l: \"f64[]\" = torch.ops.aten.amax.default(s0)
"
    );
    never_holds(
        one_stage("amax", "max", &|_| body.clone()),
        "one microbatch's max",
    );
}

#[test]
fn each_dp_rank_summing_another_microbatch_never_holds() {
    // dp rank 0 sums the first half of its rows, dp rank 1 the second half: every rank sums
    // a K-th of its shard, and the pieces differ per rank.
    let (verdict, right, report) = one_stage("sum", "sum", &|d| {
        part_sum(0, d * 4, d * 4 + 4, 1).replace("l0:", "l:")
    });
    never_holds((verdict, right, report), "another microbatch per dp rank");
}

// ---- K microbatch sums that do not tile the shard ----

#[test]
fn four_microbatches_one_twice_one_skipped_never_hold() {
    // K = 4 quarters of 2 rows at starts 0, 2, 2, 6: counts equal, rows 4..6 lost.
    let mut body = String::new();
    for (k, start) in [0, 2, 2, 6].into_iter().enumerate() {
        body += &part_sum(k, start, start + 2, 1);
    }
    body += "        t0: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
        t1: \"f64[]\" = torch.ops.aten.add.Tensor(l2, l3)
        l: \"f64[]\" = torch.ops.aten.add.Tensor(t0, t1)
";
    never_holds(sums(&body), "a microbatch twice and one skipped");
}

#[test]
fn a_strided_microbatch_and_a_half_never_hold() {
    // Rows 0, 2, 4, 6 (a step-2 slice, a K-th of the shard starting at 0) and rows 4..8:
    // starts 0 and 4 look like a tiling; rows 4 and 6 twice, 1 and 3 never.
    let body = part_sum(0, 0, R, 2)
        + &part_sum(1, 4, 8, 1)
        + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n";
    never_holds(sums(&body), "a strided microbatch and a half");
}

#[test]
fn strided_microbatches_interleaved_are_right() {
    // Even rows and odd rows (step-2 slices at 0 and 1): every row once. A hold is not
    // required (the tiling check takes step-1 slices only); a violation would be false.
    let body = part_sum(0, 0, R, 2)
        + &part_sum(1, 1, R, 2)
        + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n";
    let (verdict, right, report) = sums(&body);
    assert!(right, "interleaved microbatches are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

#[test]
fn four_microbatch_sums_in_any_association_hold() {
    let mut sums4 = String::new();
    for k in 0..4 {
        sums4 += &part_sum(k, 2 * k, 2 * k + 2, 1);
    }
    let right_nested = sums4.clone()
        + "        t0: \"f64[]\" = torch.ops.aten.add.Tensor(l2, l3)
        t1: \"f64[]\" = torch.ops.aten.add.Tensor(l1, t0)
        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, t1)
";
    holds(sums(&right_nested), "four sums nested right");
    let shuffled = sums4
        + "        t0: \"f64[]\" = torch.ops.aten.add.Tensor(l3, l0)
        t1: \"f64[]\" = torch.ops.aten.add.Tensor(l1, l2)
        l: \"f64[]\" = torch.ops.aten.add.Tensor(t1, t0)
";
    holds(sums(&shuffled), "four sums paired out of order");
}

#[test]
fn microbatch_sums_added_with_alpha_never_hold() {
    let body = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1, alpha = 2)\n";
    never_holds(sums(&body), "microbatch sums added with alpha 2");
}

#[test]
fn microbatch_sums_subtracted_never_hold() {
    let body = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        l: \"f64[]\" = torch.ops.aten.sub.Tensor(l0, l1)\n";
    never_holds(sums(&body), "microbatch sums subtracted");
}

#[test]
fn three_microbatch_sums_one_added_twice_never_hold() {
    // Both halves, and the first again: three terms (not a K-th each).
    let body = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        t: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
        l: \"f64[]\" = torch.ops.aten.add.Tensor(t, l0)
";
    never_holds(sums(&body), "a microbatch sum added twice");
}

#[test]
fn microbatch_means_divided_by_the_wrong_count_never_hold() {
    // K = 2 microbatch means each divided by 4.
    let mut body = String::new();
    for (k, start) in [(0, 0), (1, 4)] {
        body += &format!(
            "        s{k}: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        q{k}: \"f64[]\" = torch.ops.aten.mean.default(s{k})
        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(q{k}, 4)
",
            end = start + 4
        );
    }
    body += "        l: \"f64[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";
    never_holds(
        one_stage("mean", "avg", &|_| body.clone()),
        "microbatch means divided by 4",
    );
}

#[test]
fn microbatch_means_not_divided_never_hold() {
    let mut body = String::new();
    for (k, start) in [(0, 0), (1, 4)] {
        body += &format!(
            "        s{k}: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        q{k}: \"f64[]\" = torch.ops.aten.mean.default(s{k})
",
            end = start + 4
        );
    }
    body += "        l: \"f64[]\" = torch.ops.aten.add.Tensor(q0, q1)\n";
    never_holds(
        one_stage("mean", "avg", &|_| body.clone()),
        "microbatch means added undivided",
    );
}

// ---- Across a message ----

/// Across a message (mesh `pp × dp`): stage 0 (holding `a`, split over dp) runs `stage0`
/// (its sends included) and outputs a constant; stage 1 runs `stage1` (its recvs included)
/// into `m`, all-reduced by `reduce_op` over dp into `out`, compared with the spec's
/// (`spec_op` of `a`).
fn across(spec_op: &str, reduce_op: &str, stage0: &str, stage1: &str) -> (Verdict, bool, String) {
    across_with(&spec_text(spec_op), &["a"], reduce_op, stage0, stage1)
}

/// As [`across`] where the spec is `spec` and stage 0 holds the inputs `names` (each a
/// `[B, V]` tensor split over dp; `a` is [`spec_a`], every other one its negation).
fn across_with(
    spec: &str,
    names: &[&str],
    reduce_op: &str,
    stage0: &str,
    stage1: &str,
) -> (Verdict, bool, String) {
    let params: Vec<String> = names
        .iter()
        .map(|n| format!("{n}: \"f64[{R}, {V}]\""))
        .collect();
    let first = format!(
        "class G(torch.nn.Module):
    def forward(self, {params}):
{stage0}        out0: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        return (out0,)
",
        params = params.join(", ")
    );
    let second = format!(
        "class G(torch.nn.Module):
    def forward(self):
{stage1}        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(m, '{reduce_op}', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
"
    );
    let texts: Vec<String> = (0..PP * DP)
        .map(|q| {
            if q < DP {
                first.clone()
            } else {
                second.clone()
            }
        })
        .collect();
    let groups: Vec<(&str, Vec<&str>)> = vec![("pp", vec!["pp"]), ("dp", vec!["dp"])];
    let inputs: Vec<(&str, String)> = names
        .iter()
        .map(|&n| {
            (
                n,
                "{ placement: { dp: Shard(0) }, at: { pp: 0 } }".to_string(),
            )
        })
        .collect();
    let declared = Declared {
        name: "review-records-message",
        mesh: &[("pp", PP), ("dp", DP)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[(
            "out",
            "{ placement: Replicate(), at: { pp: 1 } }".to_string(),
        )],
    };
    let a = spec_a();
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..PP * DP)
        .map(|q| {
            if q >= DP {
                return BTreeMap::new();
            }
            let block: Vec<f64> = a[q * R * V..(q + 1) * R * V].to_vec();
            names
                .iter()
                .map(|&n| {
                    let data = if n == "a" {
                        block.clone()
                    } else {
                        block.iter().map(|x| -x).collect()
                    };
                    (n.to_string(), matrix(R, data))
                })
                .collect()
        })
        .collect();
    judge(spec, &texts, &declared, &per_rank, &|q| q >= DP)
}

/// A send of `x` (shape `shape`) to stage 1 with `tag`.
fn send(x: &str, shape: &str, tag: usize) -> String {
    format!(
        "        sent{tag}: \"f64[{shape}]\" = torch.ops.shardproof_p2p.send.default({x}, 1, {tag}, 'pp')\n"
    )
}

/// A recv into `v` (shape `shape`) from stage 0 with `tag`.
fn recv(v: &str, shape: &str, tag: usize) -> String {
    let dims = if shape.is_empty() {
        "[]".to_string()
    } else {
        format!("[{shape}]")
    };
    format!(
        "        {v}: \"f64[{shape}]\" = torch.ops.shardproof_p2p.recv.default({dims}, torch.float64, 0, {tag}, 'pp')\n"
    )
}

#[test]
fn a_view_of_one_microbatch_sum_sent_never_holds() {
    let stage0 = part_sum(0, 0, 4, 1)
        + "        w: \"f64[1]\" = torch.ops.aten.view.default(l0, [1])\n"
        + &send("w", "1", 0);
    let stage1 = recv("v", "1", 0) + "        m: \"f64[]\" = torch.ops.aten.view.default(v, [])\n";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "a view of one microbatch's sum sent",
    );
}

#[test]
fn a_slice_of_microbatch_sums_sent_never_holds() {
    // Stage 0 stacks its two microbatches' sums and sends the first only.
    let stage0 = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        st: \"f64[2]\" = torch.ops.aten.stack.default([l0, l1])
        w: \"f64[1]\" = torch.ops.aten.slice.Tensor(st, 0, 0, 1)
" + &send("w", "1", 0);
    let stage1 = recv("v", "1", 0) + "        m: \"f64[]\" = torch.ops.aten.view.default(v, [])\n";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "a slice of the microbatch sums sent",
    );
}

#[test]
fn a_stack_of_microbatch_sums_sent_and_summed_holds_or_is_unproven() {
    // The counterpart: the stack of both sums summed on stage 1 is right; a hold is not
    // required, a violation would be false.
    let stage0 = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        st: \"f64[2]\" = torch.ops.aten.stack.default([l0, l1])\n"
        + &send("st", "2", 0);
    let stage1 = recv("v", "2", 0) + "        m: \"f64[]\" = torch.ops.aten.sum.default(v)\n";
    let (verdict, right, report) = across("sum", "sum", &stage0, &stage1);
    assert!(right, "the stacked sums are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

/// Stage 0's lines sending the first microbatch's sum (tag 0) and the whole shard's (tag 1).
fn part_then_whole() -> String {
    part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        t: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n"
        + &send("l0", "", 0)
        + &send("t", "", 1)
}

#[test]
fn of_two_messages_the_part_received_never_holds() {
    let stage1 = recv("v0", "", 0)
        + &recv("v1", "", 1)
        + "        m: \"f64[]\" = torch.ops.aten.clone.default(v0)\n";
    never_holds(
        across("sum", "sum", &part_then_whole(), &stage1),
        "the part of two messages",
    );
}

#[test]
fn of_two_messages_the_whole_received_holds() {
    let stage1 = recv("v0", "", 0)
        + &recv("v1", "", 1)
        + "        m: \"f64[]\" = torch.ops.aten.clone.default(v1)\n";
    holds(
        across("sum", "sum", &part_then_whole(), &stage1),
        "the whole of two messages",
    );
}

#[test]
fn of_two_messages_received_in_swapped_order_the_part_never_holds() {
    // Stage 0 sends the whole first (tag 0), the part second (tag 1).
    let stage0 = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        t: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n"
        + &send("t", "", 0)
        + &send("l0", "", 1);
    let stage1 = recv("v0", "", 0)
        + &recv("v1", "", 1)
        + "        m: \"f64[]\" = torch.ops.aten.clone.default(v1)\n";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "the part sent second",
    );
}

#[test]
fn one_microbatch_sum_received_and_doubled_never_holds() {
    // v + v: the received part counted twice (as many terms as microbatches, K = 2).
    let stage0 = part_sum(0, 0, 4, 1) + &send("l0", "", 0);
    let stage1 = recv("v", "", 0) + "        m: \"f64[]\" = torch.ops.aten.add.Tensor(v, v)\n";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "a received microbatch sum doubled",
    );
}

#[test]
fn one_microbatch_sum_received_twice_and_added_never_holds() {
    // Stage 0 sends the same microbatch's sum twice; stage 1 adds the two messages.
    let stage0 = part_sum(0, 0, 4, 1) + &send("l0", "", 0) + &send("l0", "", 1);
    let stage1 = recv("v0", "", 0)
        + &recv("v1", "", 1)
        + "        m: \"f64[]\" = torch.ops.aten.add.Tensor(v0, v1)\n";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "one microbatch's sum received twice",
    );
}

#[test]
fn both_microbatch_sums_received_and_added_are_right() {
    // The two halves' sums sent apart, added on stage 1: right; a hold is not required (the
    // tiling is not followed through messages), a violation would be false.
    let stage0 =
        part_sum(0, 0, 4, 1) + &part_sum(1, 4, 8, 1) + &send("l0", "", 0) + &send("l1", "", 1);
    let stage1 = recv("v0", "", 0)
        + &recv("v1", "", 1)
        + "        m: \"f64[]\" = torch.ops.aten.add.Tensor(v0, v1)\n";
    let (verdict, right, report) = across("sum", "sum", &stage0, &stage1);
    assert!(right, "both received sums added are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

#[test]
fn a_received_part_sum_cat_with_a_local_zero_never_holds() {
    let stage0 = part_sum(0, 0, 4, 1)
        + "        w: \"f64[1]\" = torch.ops.aten.view.default(l0, [1])\n"
        + &send("w", "1", 0);
    let stage1 = recv("v", "1", 0)
        + "        z: \"f64[1]\" = torch.ops.aten.zeros.default([1], dtype = torch.float64)
        c: \"f64[2]\" = torch.ops.aten.cat.default([v, z])
        m: \"f64[]\" = torch.ops.aten.sum.default(c)
";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "a received part sum cat with a zero",
    );
}

#[test]
fn a_received_part_sum_stacked_with_itself_never_holds() {
    let stage0 = part_sum(0, 0, 4, 1) + &send("l0", "", 0);
    let stage1 = recv("v", "", 0)
        + "        c: \"f64[2]\" = torch.ops.aten.stack.default([v, v])
        m: \"f64[]\" = torch.ops.aten.sum.default(c)
";
    never_holds(
        across("sum", "sum", &stage0, &stage1),
        "a received part sum stacked with itself",
    );
}

#[test]
fn one_microbatch_sum_reduced_then_sent_never_holds() {
    // Stage 0 all-reduces its part sum over dp before the send: every rank holds the same
    // wrong value; stage 1 averages it over dp (a replicated value's avg is itself).
    let stage0 = part_sum(0, 0, 4, 1)
        + "        r_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(l0, 'sum', 'dp')
        rw: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(r_ar)
" + &send("rw", "", 0);
    let stage1 = recv("v", "", 0) + "        m: \"f64[]\" = torch.ops.aten.clone.default(v)\n";
    never_holds(
        across("sum", "avg", &stage0, &stage1),
        "a part sum reduced then sent",
    );
}

#[test]
fn one_microbatch_mean_sent_and_averaged_never_holds() {
    let stage0 = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        q0: \"f64[]\" = torch.ops.aten.mean.default(s0)
"
    ) + &send("q0", "", 0);
    let stage1 = recv("v", "", 0) + "        m: \"f64[]\" = torch.ops.aten.clone.default(v)\n";
    never_holds(
        across("mean", "avg", &stage0, &stage1),
        "one microbatch's mean sent",
    );
}

#[test]
fn one_microbatch_max_sent_never_holds() {
    let stage0 = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        q0: \"f64[]\" = torch.ops.aten.amax.default(s0)
"
    ) + &send("q0", "", 0);
    let stage1 = recv("v", "", 0) + "        m: \"f64[]\" = torch.ops.aten.clone.default(v)\n";
    never_holds(
        across("amax", "max", &stage0, &stage1),
        "one microbatch's max sent",
    );
}

// ---- Rows moved along the data-parallel dim (a ring step) ----

/// The lines of dp rank `d` sending `x` (`[n, V]`) to the other dp rank and receiving the
/// other's as `y`.
fn swap_rows(d: usize, x: &str, n: usize) -> String {
    let peer = 1 - d;
    format!(
        "        sw: \"f64[{n}, {V}]\" = torch.ops.shardproof_p2p.send.default({x}, {peer}, 0, 'dp')
        y: \"f64[{n}, {V}]\" = torch.ops.shardproof_p2p.recv.default([{n}, {V}], torch.float64, {peer}, 0, 'dp')
"
    )
}

#[test]
fn the_peers_first_microbatch_received_and_summed_never_holds() {
    let (verdict, right, report) = one_stage("sum", "sum", &|d| {
        format!("        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)\n")
            + &swap_rows(d, "s0", 4)
            + "        l: \"f64[]\" = torch.ops.aten.sum.default(y)\n"
    });
    never_holds(
        (verdict, right, report),
        "the peer's first microbatch summed",
    );
}

#[test]
fn the_peers_shard_received_then_sliced_and_summed_never_holds() {
    let (verdict, right, report) = one_stage("sum", "sum", &|d| {
        swap_rows(d, "a", R)
            + &format!("        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(y, 0, 0, 4)\n")
            + "        l: \"f64[]\" = torch.ops.aten.sum.default(s0)\n"
    });
    never_holds(
        (verdict, right, report),
        "a slice of the peer's shard summed",
    );
}

#[test]
fn the_peers_shard_received_and_summed_is_right() {
    // Every dp rank sums the other's whole shard: right; a violation would be false.
    let (verdict, right, report) = one_stage("sum", "sum", &|d| {
        swap_rows(d, "a", R) + "        l: \"f64[]\" = torch.ops.aten.sum.default(y)\n"
    });
    assert!(right, "the peer's shard summed is wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

#[test]
fn the_peers_microbatch_sum_received_never_holds() {
    // The part sum itself moves along dp: the pending piece of another coordinate.
    let (verdict, right, report) = one_stage("sum", "sum", &|d| {
        let peer = 1 - d;
        part_sum(0, 0, 4, 1)
            + &format!(
                "        sw: \"f64[]\" = torch.ops.shardproof_p2p.send.default(l0, {peer}, 0, 'dp')
        l: \"f64[]\" = torch.ops.shardproof_p2p.recv.default([], torch.float64, {peer}, 0, 'dp')
"
            )
    });
    never_holds((verdict, right, report), "the peer's microbatch sum");
}

// ---- A receiver propagated before its sender (resumed) ----

/// As [`across`] with the stages swapped: `a` lives on stage 1, which sends to stage 0, so
/// the receiving ranks come first and run again once their senders are done.
fn across_backwards(stage1: &str, stage0: &str) -> (Verdict, bool, String) {
    let sender = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{R}, {V}]\"):
{stage1}        out1: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        return (out1,)
"
    );
    let receiver = format!(
        "class G(torch.nn.Module):
    def forward(self):
{stage0}        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(m, 'sum', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
"
    );
    let texts: Vec<String> = (0..PP * DP)
        .map(|q| {
            if q < DP {
                receiver.clone()
            } else {
                sender.clone()
            }
        })
        .collect();
    let groups: Vec<(&str, Vec<&str>)> = vec![("pp", vec!["pp"]), ("dp", vec!["dp"])];
    let inputs = [(
        "a",
        "{ placement: { dp: Shard(0) }, at: { pp: 1 } }".to_string(),
    )];
    let declared = Declared {
        name: "review-records-backwards",
        mesh: &[("pp", PP), ("dp", DP)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[(
            "out",
            "{ placement: Replicate(), at: { pp: 0 } }".to_string(),
        )],
    };
    let a = spec_a();
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..PP * DP)
        .map(|q| {
            if q < DP {
                return BTreeMap::new();
            }
            let d = q - DP;
            BTreeMap::from([(
                "a".to_string(),
                matrix(R, a[d * R * V..(d + 1) * R * V].to_vec()),
            )])
        })
        .collect();
    judge(&spec_text("sum"), &texts, &declared, &per_rank, &|q| q < DP)
}

/// Stage 1's lines: take stage 0's token (tag 0, unused: it only orders the ranks so that
/// stage 0's recv reads a sender not yet done), then `body`, then send `x` back (tag 0) and
/// synchronize over dp (the schedule check reads the answer as a backward pass).
fn answer(body: &str, x: &str) -> String {
    format!(
        "        tk: \"f64[]\" = torch.ops.shardproof_p2p.recv.default([], torch.float64, 0, 0, 'pp')
{body}        sent: \"f64[]\" = torch.ops.shardproof_p2p.send.default({x}, 0, 0, 'pp')
        g_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(tk, 'avg', 'dp')
        g: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(g_ar)
"
    )
}

/// Stage 0's lines: send a token to stage 1 (tag 0), receive the answer as `v` and take it as
/// `m`.
const ASK: &str =
    "        one: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        tks: \"f64[]\" = torch.ops.shardproof_p2p.send.default(one, 1, 0, 'pp')
        v: \"f64[]\" = torch.ops.shardproof_p2p.recv.default([], torch.float64, 1, 0, 'pp')
        m: \"f64[]\" = torch.ops.aten.clone.default(v)
";

#[test]
fn one_microbatch_sum_sent_to_an_earlier_stage_never_holds() {
    let stage1 = answer(&part_sum(0, 0, 4, 1), "l0");
    never_holds(
        across_backwards(&stage1, ASK),
        "one microbatch's sum sent back",
    );
}

#[test]
fn every_microbatch_sum_sent_to_an_earlier_stage_holds() {
    let body = part_sum(0, 0, 4, 1)
        + &part_sum(1, 4, 8, 1)
        + "        t: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n";
    holds(
        across_backwards(&answer(&body, "t"), ASK),
        "the whole shard's sum sent back",
    );
}

// ---- A part sum through other operators ----

#[test]
fn one_microbatch_sum_expanded_and_summed_never_holds() {
    // The part's sum broadcast to K = 2 places and summed: twice one microbatch.
    let body = part_sum(0, 0, 4, 1)
        + "        w: \"f64[1]\" = torch.ops.aten.view.default(l0, [1])
        e: \"f64[2]\" = torch.ops.aten.expand.default(w, [2])
        l: \"f64[]\" = torch.ops.aten.sum.default(e)
";
    never_holds(sums(&body), "one microbatch's sum expanded");
}

#[test]
fn one_microbatch_contracted_by_a_matmul_never_holds() {
    // ones[1, 4] @ rows 0..4: the first microbatch's column sums, then summed.
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        o: \"f64[1, 4]\" = torch.ops.aten.ones.default([1, 4], dtype = torch.float64)
        c: \"f64[1, {V}]\" = torch.ops.aten.mm.default(o, s0)
        l: \"f64[]\" = torch.ops.aten.sum.default(c)
"
    );
    never_holds(sums(&body), "one microbatch contracted by a matmul");
}

#[test]
fn one_microbatch_through_a_cumulative_sum_never_holds() {
    // The running sum over the rank's rows, row 3 taken: rows 0..4 only.
    let body = format!(
        "        c: \"f64[{R}, {V}]\" = torch.ops.aten.cumsum.default(a, 0)
        s0: \"f64[{V}]\" = torch.ops.aten.select.int(c, 0, 3)
        l: \"f64[]\" = torch.ops.aten.sum.default(s0)
"
    );
    never_holds(sums(&body), "one microbatch through a cumulative sum");
}

#[test]
fn microbatch_means_halved_by_a_product_hold_or_are_unproven() {
    // Each microbatch's mean times 0.5 (K = 2) added: right; a violation would be false.
    let mut body = String::new();
    for (k, start) in [(0, 0), (1, 4)] {
        body += &format!(
            "        s{k}: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        q{k}: \"f64[]\" = torch.ops.aten.mean.default(s{k})
        d{k}: \"f64[]\" = torch.ops.aten.mul.Tensor(q{k}, 0.5)
",
            end = start + 4
        );
    }
    body += "        l: \"f64[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";
    let (verdict, right, report) = one_stage("mean", "avg", &|_| body.clone());
    assert!(right, "microbatch means halved are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

#[test]
fn one_microbatch_min_reduced_by_min_never_holds() {
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 4, 8)
        l: \"f64[]\" = torch.ops.aten.amin.default(s0)
"
    );
    never_holds(
        one_stage("amin", "min", &|_| body.clone()),
        "one microbatch's min",
    );
}

#[test]
fn one_microbatch_max_by_max_default_never_holds() {
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        l: \"f64[]\" = torch.ops.aten.max.default(s0)
"
    );
    never_holds(
        one_stage("max", "max", &|_| body.clone()),
        "one microbatch's max (max.default)",
    );
}

#[test]
fn every_microbatch_max_combined_is_right() {
    // The maxima of both halves combined by `maximum`, reduced by max over dp: right. A hold
    // is not required (no tiling of maxima is proven), a violation would be false.
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        l0: \"f64[]\" = torch.ops.aten.amax.default(s0)
        s1: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 4, 8)
        l1: \"f64[]\" = torch.ops.aten.amax.default(s1)
        l: \"f64[]\" = torch.ops.aten.maximum.default(l0, l1)
"
    );
    let (verdict, right, report) = one_stage("amax", "max", &|_| body.clone());
    assert!(right, "the combined maxima are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

#[test]
fn the_max_of_the_whole_shard_reduced_by_max_holds() {
    // Pins that a guard against a part's max keeps the max over the rank's whole shard.
    let body = "        l: \"f64[]\" = torch.ops.aten.amax.default(a)\n";
    holds(
        one_stage("amax", "max", &|_| body.to_string()),
        "the whole shard's max",
    );
}

// ---- Received microbatches of two tensors ----

/// The spec of two inputs `a`, `b` whose output is `a`'s sum.
fn spec_of_a_beside_b() -> String {
    format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\", b: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.sum.default(a)
        return (out,)
"
    )
}

/// Stage 0 sends rows 0..4 of `first` (tag 0) and rows 4..8 of `second` (tag 1); stage 1
/// sums each message and adds the sums.
fn halves_of(first: &str, second: &str) -> (Verdict, bool, String) {
    let stage0 = format!(
        "        h0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor({first}, 0, 0, 4)
        h1: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor({second}, 0, 4, 8)
"
    ) + &send("h0", &format!("4, {V}"), 0)
        + &send("h1", &format!("4, {V}"), 1);
    let stage1 = recv("v0", &format!("4, {V}"), 0)
        + &recv("v1", &format!("4, {V}"), 1)
        + "        l0: \"f64[]\" = torch.ops.aten.sum.default(v0)
        l1: \"f64[]\" = torch.ops.aten.sum.default(v1)
        m: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
";
    across_with(&spec_of_a_beside_b(), &["a", "b"], "sum", &stage0, &stage1)
}

#[test]
fn received_microbatches_of_one_tensor_summed_hold() {
    holds(halves_of("a", "a"), "both halves of a, received and summed");
}

#[test]
fn received_microbatches_of_two_tensors_summed_never_hold() {
    // Rows 0..4 of `a` and rows 4..8 of `b`: each a K-th of a shard at distinct starts, but
    // not of one tensor.
    never_holds(
        halves_of("a", "b"),
        "halves of a and b, received and summed",
    );
}

#[test]
fn microbatch_sums_of_two_tensors_added_then_sent_never_hold() {
    // The same attack on stage 0 itself: the slice pairing compares the sliced tensors.
    let stage0 = format!(
        "        h0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        h1: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(b, 0, 4, 8)
        l0: \"f64[]\" = torch.ops.aten.sum.default(h0)
        l1: \"f64[]\" = torch.ops.aten.sum.default(h1)
        t: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
"
    ) + &send("t", "", 0);
    let stage1 = recv("v", "", 0) + "        m: \"f64[]\" = torch.ops.aten.clone.default(v)\n";
    never_holds(
        across_with(&spec_of_a_beside_b(), &["a", "b"], "sum", &stage0, &stage1),
        "halves of a and b summed, then sent",
    );
}

#[test]
fn one_microbatch_sum_copied_never_holds() {
    let body = part_sum(0, 0, 4, 1)
        + "        l: \"f64[]\" = torch.ops.aten._to_copy.default(l0, dtype = torch.float64)\n";
    never_holds(sums(&body), "one microbatch's sum copied");
}

#[test]
fn every_microbatch_sum_copied_then_added_holds() {
    let post =
        "        c{k}: \"f64[]\" = torch.ops.aten._to_copy.default(l{k}, dtype = torch.float64)\n";
    let mut body = String::new();
    for k in 0..2 {
        body += &part_sum(k, 4 * k, 4 * k + 4, 1);
        body += &post.replace("{k}", &k.to_string());
    }
    body += "        l: \"f64[]\" = torch.ops.aten.add.Tensor(c0, c1)\n";
    let (verdict, right, report) = sums(&body);
    assert!(right, "copied microbatch sums are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

// ---- Microbatches sliced from a received shard ----

/// Stage 0 sends `first` (tag 0) and `second` (tag 1) whole; stage 1 sums rows `[s0, s0 + 4)`
/// of the first message and `[s1, s1 + 4)` of the second, and adds the sums.
fn slices_of_received(first: &str, second: &str, s0: usize, s1: usize) -> (Verdict, bool, String) {
    let shard = format!("{R}, {V}");
    let stage0 = send(first, &shard, 0) + &send(second, &shard, 1);
    let stage1 = recv("v0", &shard, 0)
        + &recv("v1", &shard, 1)
        + &format!(
            "        h0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(v0, 0, {s0}, {e0})
        h1: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(v1, 0, {s1}, {e1})
        l0: \"f64[]\" = torch.ops.aten.sum.default(h0)
        l1: \"f64[]\" = torch.ops.aten.sum.default(h1)
        m: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
",
            e0 = s0 + 4,
            e1 = s1 + 4
        );
    across_with(&spec_of_a_beside_b(), &["a", "b"], "sum", &stage0, &stage1)
}

#[test]
fn microbatches_of_a_received_shard_are_right() {
    // Both halves of `a` (sent twice): right; a hold is not required (two messages are two
    // tensors to the slice pairing), a violation would be false.
    let (verdict, right, report) = slices_of_received("a", "a", 0, 4);
    assert!(right, "both halves of a received are wrong when run");
    assert_ne!(verdict, Verdict::Violated, "{report}");
}

#[test]
fn one_microbatch_of_a_received_shard_twice_never_holds() {
    never_holds(
        slices_of_received("a", "a", 0, 0),
        "the first half of a received, twice",
    );
}

#[test]
fn microbatches_of_two_received_shards_never_hold() {
    never_holds(
        slices_of_received("a", "b", 0, 4),
        "halves of a and b sliced after the recv",
    );
}

// ---- Microbatches chunked over ep (the rows of a microbatch another mesh dim splits) ----

/// Rank `(d, e)`'s lines: each microbatch `k` of `[4k, 4k + 4)` (starts `starts`), its rows
/// `[w e, w e + w)` taken (a chunk of width `w` at the ep coordinate), summed, the sums added
/// and summed over ep into `l`.
fn chunked_sums(e: usize, starts: [usize; 2], w: usize) -> String {
    let mut body = String::new();
    for (k, start) in starts.into_iter().enumerate() {
        body += &format!(
            "        s{k}: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        c{k}: \"f64[{w}, {V}]\" = torch.ops.aten.slice.Tensor(s{k}, 0, {c}, {ce})
        l{k}: \"f64[]\" = torch.ops.aten.sum.default(c{k})
",
            end = start + 4,
            c = w * e,
            ce = w * e + w
        );
    }
    body + "        t: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
        e_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'ep')
        l: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(e_ar)
"
}

#[test]
fn microbatches_chunked_over_ep_hold() {
    // Each ep rank sums its half of each microbatch: every row once, and proven (the chunk
    // path of the tiling check, `chunked`). Pins that the attacks below fail for their rows.
    holds(
        one_stage_at("sum", "sum", &|_, e| chunked_sums(e, [0, 4], 2)),
        "the chunked microbatches",
    );
}

#[test]
fn microbatches_chunked_short_over_ep_never_hold() {
    // Chunks of one row at the ep coordinate: rows 0 and 1 of each microbatch only.
    never_holds(
        one_stage_at("sum", "sum", &|_, e| chunked_sums(e, [0, 4], 1)),
        "microbatches chunked a row short",
    );
}

#[test]
fn one_microbatch_chunked_over_ep_twice_never_holds() {
    never_holds(
        one_stage_at("sum", "sum", &|_, e| chunked_sums(e, [0, 0], 2)),
        "one microbatch chunked over ep, twice",
    );
}

/// As [`halves_of`] for means: stage 1 averages each received half, divides by K = 2, adds,
/// and the sum is averaged over dp; the spec is `a`'s mean.
fn mean_halves_of(first: &str, second: &str) -> (Verdict, bool, String) {
    let spec = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\", b: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.mean.default(a)
        return (out,)
"
    );
    let stage0 = format!(
        "        h0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor({first}, 0, 0, 4)
        h1: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor({second}, 0, 4, 8)
"
    ) + &send("h0", &format!("4, {V}"), 0)
        + &send("h1", &format!("4, {V}"), 1);
    let stage1 = recv("v0", &format!("4, {V}"), 0)
        + &recv("v1", &format!("4, {V}"), 1)
        + "        q0: \"f64[]\" = torch.ops.aten.mean.default(v0)
        q1: \"f64[]\" = torch.ops.aten.mean.default(v1)
        d0: \"f64[]\" = torch.ops.aten.div.Scalar(q0, 2)
        d1: \"f64[]\" = torch.ops.aten.div.Scalar(q1, 2)
        m: \"f64[]\" = torch.ops.aten.add.Tensor(d0, d1)
";
    across_with(&spec, &["a", "b"], "avg", &stage0, &stage1)
}

#[test]
fn received_microbatch_means_of_one_tensor_averaged_hold() {
    holds(
        mean_halves_of("a", "a"),
        "both halves of a, received and averaged",
    );
}

#[test]
fn received_microbatch_means_of_two_tensors_averaged_never_hold() {
    never_holds(
        mean_halves_of("a", "b"),
        "halves of a and b, received and averaged",
    );
}
