//! A partial divided by another mesh dim's size, made up by that dim's all-reduce (issue 44).
//!
//! DeepSeek's aux loss under `dp x tp`: every tp rank holds the rank's mean (a `Partial(avg)`
//! over dp, replicated over tp) and divides it by tp's size, so the tp all-reduce sums the
//! shares back; on dp the 1/2 is a factor the spec lacks, and on a mesh with two dims of 2
//! which one it makes up for was not read (`scale_unknown`), so the correct program was
//! inconclusive on the base (a398d43). Each case computes `loss = mean(x * x)` in the spec,
//! `x` sharded over dp, declared `Replicate()`; the ranks all run one graph.

mod common;

use shardproof_check::Verdict;

/// The verdict on mesh `{dp: 2, tp: TP}` of ranks running `s = mean(x * x) / DIV`, then an
/// all-reduce (sum) over each group of `groups` in turn, then `/ 2` (dp's average).
fn verdict(tp: usize, div: u32, groups: &[&str], dir: &str) -> Verdict {
    let tag = format!("share-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, rows: u32, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, 8]\"):\n        p: \"f32[{rows}, 8]\" = torch.ops.aten.mul.Tensor(x, x)\n        m: \"f32[]\" = torch.ops.aten.mean.default(p)\n{body}        return (loss,)\n"
        )
    };
    let spec = "        loss: \"f32[]\" = torch.ops.aten.mul.Tensor(m, 1)\n";
    let mut rank = format!("        t0: \"f32[]\" = torch.ops.aten.div.Scalar(m, {div})\n");
    for (k, g) in groups.iter().enumerate() {
        rank += &format!(
            "        a{k}: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t{k}, 'sum', '{g}')\n        t{}: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a{k})\n",
            k + 1
        );
    }
    rank += &format!(
        "        loss: \"f32[]\" = torch.ops.aten.div.Scalar(t{}, 2)\n",
        groups.len()
    );
    files.push(("spec.py".to_string(), graph("Spec", 8, spec).to_string()));
    files.push(("r.py".to_string(), graph("Rank", 4, &rank).to_string()));
    let graphs = vec!["r.py"; 2 * tp].join(", ");
    let case = format!("version: 1\nname: share\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: 2, tp: {tp} }}\n  graphs: [{graphs}]\n  groups:\n    \"dp\": dp\n    \"tp\": tp\ninputs:\n  x: {{ dp: Shard(0), tp: Replicate() }}\noutputs:\n  loss: Replicate()\n");
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

#[test]
fn a_share_summed_over_its_dim_holds() {
    // Base: inconclusive (which mesh dim the 1/2 makes up for was not read).
    assert_eq!(verdict(2, 2, &["tp", "dp"], "ok"), Verdict::Holds);
}

#[test]
fn a_share_never_summed_over_its_dim_is_not_held() {
    // The tp all-reduce is missing: `loss` is half the spec's (`run`: rel. error 0.5).
    assert_ne!(verdict(2, 2, &["dp"], "unsummed"), Verdict::Holds);
}

#[test]
fn a_share_divided_by_the_wrong_dims_size_is_not_held() {
    // tp = 4, the share divided by dp's size (2): the tp sum counts the mean twice (`run`:
    // rel. error 1.0).
    assert_ne!(verdict(4, 2, &["tp", "dp"], "wrong"), Verdict::Holds);
}

#[test]
fn a_share_summed_over_dp_first_then_its_dim_is_not_violated() {
    // The same program with the two all-reduces in the other order (`run`: rel. error 3e-16).
    // On 086bab4 the tp all-reduce was judged an all-reduce of a replicated tensor
    // (`comm-legality`, violated): the share's `scaled` record did not survive the dp sum.
    assert_ne!(verdict(2, 2, &["dp", "tp"], "dp-first"), Verdict::Violated);
}

#[test]
fn an_unscaled_value_summed_over_dp_then_tp_stays_violated() {
    // No division: the tp all-reduce sums a replicated tensor (`run`: rel. error 1.0). The
    // 1/n kept through the dp sum must not excuse a sum with no share behind it.
    assert_eq!(verdict(2, 1, &["dp", "tp"], "unscaled"), Verdict::Violated);
}
