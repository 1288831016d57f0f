//! A sum over part of each rank's rows (a microbatch of a batch shard), reduced over the
//! batch's mesh dim, is the sum of the selected rows only, never the spec's sum of every row.
//! Each program is run by the interpreter and compared with the spec, so a program asserted
//! never to hold is wrong in its values, and one asserted to hold is right.
//!
//! Mesh `dp × ep` of (2, 2); `a [B, V]` split over dp (outermost), replicated over ep. The
//! spec sums `a`; the ranks sum the microbatch(es) of their shard named by each test and
//! all-reduce the sum over dp.

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
/// The expert-parallel mesh dim's size (replicating `a`).
const EP: usize = 2;

/// The verdict of the rank program whose lines `body` reduce the rank's rows `a` (local
/// `[B / DP, V]`) into the scalar `l`, and whether every rank's `out` equals the spec's.
fn verdict_and_values(body: &str) -> (Verdict, bool, String) {
    verdict_and_values_of("sum", "sum", body)
}

/// [`verdict_and_values`] where the spec reduces `a` by `spec_op` (`sum`, `mean`) and the
/// ranks all-reduce `l` by `reduce_op` (`sum`, `avg`).
fn verdict_and_values_of(spec_op: &str, reduce_op: &str, body: &str) -> (Verdict, bool, String) {
    let r = B / DP;
    let spec = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.{spec_op}.default(a)
        return (out,)
"
    );
    let rank = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{r}, {V}]\"):
{body}        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(l, '{reduce_op}', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
"
    );
    let groups: Vec<(&str, Vec<&str>)> = vec![("dp", vec!["dp"]), ("ep", vec!["ep"])];
    let inputs = [("a", "{ dp: Shard(0), ep: Replicate() }".to_string())];
    let declared = Declared {
        name: "rows-part-sums",
        mesh: &[("dp", DP), ("ep", EP)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let case = load_written(&spec, &vec![rank; DP * EP], &declared);
    let report = check_case(&case).unwrap();
    let a: Vec<f64> = (0..B * V).map(|i| 0.25 + i as f64 * 0.5).collect();
    let matrix = |n: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![n, V]), d);
    let leaves = BTreeMap::from([("a".to_string(), matrix(B, a.clone()))]);
    // Rank `q = d * EP + e` holds row block `d`.
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..DP * EP)
        .map(|q| {
            let d = q / EP;
            BTreeMap::from([(
                "a".to_string(),
                matrix(r, a[d * r * V..(d + 1) * r * V].to_vec()),
            )])
        })
        .collect();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default()).unwrap();
    let want = want.get(at(&case.spec)).unwrap().data.to_vec();
    let envs = run_program(&case.program, &per_rank, &RunConfig::default()).unwrap();
    let right = envs
        .iter()
        .zip(&case.program.ranks)
        .all(|(env, g)| close(&env.get(at(g)).unwrap().data, &want));
    (report.verdict, right, report.render())
}

#[test]
fn the_sum_of_one_microbatch_reduced_over_dp_never_holds() {
    // The first half of every rank's rows: half the rows are lost.
    let h = B / DP / 2;
    let body = format!(
        "        sl: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, {h})
        l: \"f64[]\" = torch.ops.aten.sum.default(sl)
"
    );
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(!right, "one microbatch's sum is right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn the_sums_of_every_microbatch_added_then_reduced_over_dp_hold() {
    // Gradient accumulation of sums: both halves summed and added cover every row once. Pins
    // that a guard against one microbatch's sum keeps this hold.
    let h = B / DP / 2;
    let body = format!(
        "        s0: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, {h})
        l0: \"f64[]\" = torch.ops.aten.sum.default(s0)
        s1: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {h}, {r})
        l1: \"f64[]\" = torch.ops.aten.sum.default(s1)
        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
",
        r = B / DP
    );
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(right, "both microbatches' sums are wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn the_sums_of_one_microbatch_twice_added_never_hold() {
    // The first microbatch counted twice: the second half of the rows is lost.
    let h = B / DP / 2;
    let body = format!(
        "        s0: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, {h})
        l0: \"f64[]\" = torch.ops.aten.sum.default(s0)
        s1: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, {h})
        l1: \"f64[]\" = torch.ops.aten.sum.default(s1)
        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)
"
    );
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(!right, "one microbatch twice is right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

/// The rank program's lines for two microbatch sums `l0`, `l1` over rows `[a0, b0)` and
/// `[a1, b1)` of the rank's shard, each passed through `post` (a line template for `{k}`),
/// added into `l`.
fn two_sums(b: [(usize, usize); 2], post: &str) -> String {
    let mut body = String::new();
    for (k, (start, end)) in b.into_iter().enumerate() {
        let n = end - start;
        body += &format!(
            "        s{k}: \"f64[{n}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        l{k}: \"f64[]\" = torch.ops.aten.sum.default(s{k})
"
        );
        body += &post.replace("{k}", &k.to_string());
    }
    body
}

#[test]
fn overlapping_microbatches_of_one_size_never_hold() {
    // Rows [0, 4) and [2, 6) of 8: two microbatches of a K-th each, at distinct starts that
    // do not tile the shard (rows 2..4 twice, 6..8 never). Pins the tiling check (a start at
    // a multiple of the microbatch's size).
    let body = two_sums([(0, 4), (2, 6)], "")
        + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n";
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(!right, "overlapping microbatches are right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn microbatch_sums_each_doubled_never_hold() {
    // Every microbatch's sum times 2, added: the same expression in every term and the
    // microbatches tile the shard, but each term's factor is unknown for the product too,
    // not only for summing part of the rows: twice the tensor's sum. Pins that every term's
    // factor is unknown only by its rows being a part (`part_rows`).
    let post = "        d{k}: \"f64[]\" = torch.ops.aten.mul.Tensor(l{k}, 2.0)\n";
    let body = two_sums([(0, 4), (4, 8)], post)
        + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(!right, "doubled microbatch sums are right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn views_of_every_microbatch_sum_added_hold() {
    // Each microbatch's sum viewed as `[1]` before the add (a view keeps a sum over part of
    // the rows one), the total viewed back: right, and proven. Pins that views carry the
    // record.
    let post = "        v{k}: \"f64[1]\" = torch.ops.aten.view.default(l{k}, [1])\n";
    let body = two_sums([(0, 4), (4, 8)], post)
        + "        t: \"f64[1]\" = torch.ops.aten.add.Tensor(v0, v1)
        l: \"f64[]\" = torch.ops.aten.view.default(t, [])
";
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(right, "viewed microbatch sums are wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn a_view_of_one_microbatch_sum_never_holds() {
    // A view of one microbatch's sum is still a part: its reduction is not the tensor's sum.
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        l0: \"f64[]\" = torch.ops.aten.sum.default(s0)
        v0: \"f64[1]\" = torch.ops.aten.view.default(l0, [1])
        l: \"f64[]\" = torch.ops.aten.view.default(v0, [])
"
    );
    let (verdict, right, report) = verdict_and_values(&body);
    assert!(!right, "one microbatch's viewed sum is right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn the_mean_of_one_microbatch_averaged_over_dp_never_holds() {
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        l: \"f64[]\" = torch.ops.aten.mean.default(s0)
"
    );
    let (verdict, right, report) = verdict_and_values_of("mean", "avg", &body);
    assert!(!right, "one microbatch's mean is right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn one_microbatch_mean_as_a_share_of_ep_never_holds() {
    // One microbatch's mean divided by ep (a share of ep, where every ep rank computes it),
    // summed over ep, averaged over dp: the sum over ep makes up for the share, not for the
    // rows left out. Pins that the sum making up for a share keeps the record of the part.
    let body = format!(
        "        s0: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, 4)
        q0: \"f64[]\" = torch.ops.aten.mean.default(s0)
        h0: \"f64[]\" = torch.ops.aten.div.Scalar(q0, {EP})
        e_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(h0, 'sum', 'ep')
        l: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(e_ar)
"
    );
    let (verdict, right, report) = verdict_and_values_of("mean", "avg", &body);
    assert!(!right, "one microbatch's mean share is right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn every_microbatch_mean_as_a_share_of_ep_averaged_holds() {
    // Each microbatch's mean divided by ep (its share) and by K = 2, added, summed over ep,
    // averaged over dp: the spec's mean. Pins that a mean over part of the rows may still be
    // a share of another mesh dim, and the K shares averaged the whole shard's.
    let mut body = String::new();
    for (k, start) in [(0, 0), (1, 4)] {
        body += &format!(
            "        s{k}: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        q{k}: \"f64[]\" = torch.ops.aten.mean.default(s{k})
        h{k}: \"f64[]\" = torch.ops.aten.div.Scalar(q{k}, {EP})
        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(h{k}, 2)
",
            end = start + 4
        );
    }
    body += "        t: \"f64[]\" = torch.ops.aten.add.Tensor(d0, d1)
        e_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'ep')
        l: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(e_ar)
";
    let (verdict, right, report) = verdict_and_values_of("mean", "avg", &body);
    assert!(right, "the microbatch mean shares are wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn every_microbatch_mean_averaged_holds() {
    // Gradient accumulation of means: each microbatch's mean divided by K = 2, added,
    // averaged over dp: the spec's mean. Pins that a microbatch average takes means whose
    // factor is unknown only by their rows being a part.
    let mut body = String::new();
    for (k, start) in [(0, 0), (1, 4)] {
        body += &format!(
            "        s{k}: \"f64[4, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, {start}, {end})
        q{k}: \"f64[]\" = torch.ops.aten.mean.default(s{k})
        d{k}: \"f64[]\" = torch.ops.aten.div.Scalar(q{k}, 2)
",
            end = start + 4
        );
    }
    body += "        l: \"f64[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";
    let (verdict, right, report) = verdict_and_values_of("mean", "avg", &body);
    assert!(right, "the microbatch means are wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn one_microbatch_sum_declared_partial_is_not_proven() {
    // The rank's sum of its first microbatch declared a pending sum over dp: its pieces sum to
    // the microbatch's rows only. The output check names why.
    let h = B / DP / 2;
    let spec = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.sum.default(a)
        return (out,)
"
    );
    let rank = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{r}, {V}]\"):
        sl: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, {h})
        out: \"f64[]\" = torch.ops.aten.sum.default(sl)
        return (out,)
",
        r = B / DP
    );
    let groups: Vec<(&str, Vec<&str>)> = vec![("dp", vec!["dp"]), ("ep", vec!["ep"])];
    let inputs = [("a", "{ dp: Shard(0), ep: Replicate() }".to_string())];
    let declared = Declared {
        name: "rows-part-sums-declared",
        mesh: &[("dp", DP), ("ep", EP)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[("out", "{ dp: Partial(sum) }".to_string())],
    };
    let case = load_written(&spec, &vec![rank; DP * EP], &declared);
    let report = check_case(&case).unwrap();
    let text = report.render();
    assert_ne!(report.verdict, Verdict::Holds, "{text}");
    assert!(text.contains("part of each rank's rows"), "{text}");
}

// ---- Across a message: the recv keeps the sender's records ----

/// As [`verdict_and_values`] on a pipeline `pp × dp` = (2, 2): stage 0 (which holds `a`)
/// reduces its rows by `body` into the scalar `l` and sends `l` to stage 1, which receives
/// it as `v` (pending over dp there too), runs `received` on it into `m`, all-reduces `m`
/// over dp into `out`. Only stage 1's `out` is declared (and compared with the spec's).
fn across_stages(body: &str, received: &str) -> (Verdict, bool, String) {
    let (pp, r) = (2usize, B / DP);
    let spec = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.sum.default(a)
        return (out,)
"
    );
    let stage0 = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{r}, {V}]\"):
{body}        sent: \"f64[]\" = torch.ops.shardproof_p2p.send.default(l, 1, 0, 'pp')
        out0: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        return (out0,)
"
    );
    let stage1 = format!(
        "class G(torch.nn.Module):
    def forward(self):
        v: \"f64[]\" = torch.ops.shardproof_p2p.recv.default([], torch.float64, 0, 0, 'pp')
{received}        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(m, 'sum', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
"
    );
    let texts: Vec<String> = (0..pp * DP)
        .map(|q| {
            if q < DP {
                stage0.clone()
            } else {
                stage1.clone()
            }
        })
        .collect();
    let groups: Vec<(&str, Vec<&str>)> = vec![("pp", vec!["pp"]), ("dp", vec!["dp"])];
    let inputs = [(
        "a",
        "{ placement: { dp: Shard(0) }, at: { pp: 0 } }".to_string(),
    )];
    let declared = Declared {
        name: "rows-part-sums-message",
        mesh: &[("pp", pp), ("dp", DP)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[(
            "out",
            "{ placement: Replicate(), at: { pp: 1 } }".to_string(),
        )],
    };
    let case = load_written(&spec, &texts, &declared);
    let report = check_case(&case).unwrap();
    let a: Vec<f64> = (0..B * V).map(|i| 0.25 + i as f64 * 0.5).collect();
    let matrix = |n: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![n, V]), d);
    let leaves = BTreeMap::from([("a".to_string(), matrix(B, a.clone()))]);
    // Stage-0 rank `q = d` holds row block `d`; stage 1 holds nothing.
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..pp * DP)
        .map(|q| {
            if q >= DP {
                return BTreeMap::new();
            }
            BTreeMap::from([(
                "a".to_string(),
                matrix(r, a[q * r * V..(q + 1) * r * V].to_vec()),
            )])
        })
        .collect();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default()).unwrap();
    let want = want.get(at(&case.spec)).unwrap().data.to_vec();
    let envs = run_program(&case.program, &per_rank, &RunConfig::default()).unwrap();
    let right = envs
        .iter()
        .zip(&case.program.ranks)
        .skip(DP)
        .all(|(env, g)| close(&env.get(at(g)).unwrap().data, &want));
    (report.verdict, right, report.render())
}

/// Stage 1's lines taking the received `v` as `m` unchanged.
const AS_RECEIVED: &str = "        m: \"f64[]\" = torch.ops.aten.clone.default(v)\n";

#[test]
fn one_microbatch_sum_sent_to_another_stage_never_holds() {
    // Stage 0 sums the first half of its rows and sends it on; stage 1 sums the pieces over
    // dp. Pins that the recv keeps the sender's `part_rows` record: without it the received
    // partial is read as the whole sum's pieces.
    let h = B / DP / 2;
    let body = format!(
        "        sl: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(a, 0, 0, {h})
        l: \"f64[]\" = torch.ops.aten.sum.default(sl)
"
    );
    let (verdict, right, report) = across_stages(&body, AS_RECEIVED);
    assert!(!right, "one microbatch's sum is right when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn every_microbatch_sum_added_then_sent_to_another_stage_holds() {
    // The counterpart: both halves' sums added on stage 0 are the whole shard's; the records
    // the recv keeps let stage 1's reduction over dp prove it.
    let r = B / DP;
    let body = two_sums([(0, r / 2), (r / 2, r)], "")
        + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(l0, l1)\n";
    let (verdict, right, report) = across_stages(&body, AS_RECEIVED);
    assert!(right, "both microbatches' sums are wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}
