//! A partial's reduction label (`Partial(sum)` or `Partial(avg)`) through scalings by a number
//! and through collectives whose reduction is the other one (issue 44, soundness).
//!
//! Each case runs one graph on both ranks of `dp=2` with `x: f32[4, 8]` sharded along its rows;
//! every rank's local mean is `Partial(avg)`. Before, the label was kept through every product
//! with a number and an all-reduce or reduce-scatter took a sum for an average: the cases marked
//! "base: holds" held with exit 0 while `shardproof run` finds the output wrong (each was checked
//! so: their values differ from the spec's by the mesh size).

mod common;

use shardproof_check::Verdict;

/// The verdict of a case whose spec is `spec` (lines of its forward, reading `x: f32[4, 8]`,
/// returning `y`) and whose two ranks run `rank` (reading their `x: f32[2, 8]`), with `y`
/// declared `declared` over `dp`.
fn verdict(spec: &str, rank: &str, declared: &str, dir: &str) -> Verdict {
    let tag = format!("avg-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, rows: usize, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, 8]\"):\n{body}        return (y,)\n"
        )
    };
    files.push(("spec.py".to_string(), graph("Spec", 4, spec).to_string()));
    for r in ["r0.py", "r1.py"] {
        files.push((r.to_string(), graph("Rank", 2, rank).to_string()));
    }
    let case = format!(
        "version: 1\nname: avg\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: 2 }}\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Shard(0)\noutputs:\n  y: {declared}\n"
    );
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

const MEAN: &str = "        y: \"f32[]\" = torch.ops.aten.mean.default(x)\n";
const SUM: &str = "        y: \"f32[]\" = torch.ops.aten.sum.default(x)\n";

/// `m = OP(x)`, then `y = SCALE(m, FACTOR)`.
fn scaled(op: &str, scale: &str, factor: &str) -> String {
    format!(
        "        m: \"f32[]\" = torch.ops.aten.{op}.default(x)\n        y: \"f32[]\" = torch.ops.aten.{scale}.Tensor(m, {factor})\n"
    )
}

/// `m = OP(x)`, all-reduced with `red` over dp, then `tail` (reading `w`, writing `y`).
fn all_reduced(op: &str, red: &str, tail: &str) -> String {
    format!(
        "        m: \"f32[]\" = torch.ops.aten.{op}.default(x)\n        a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(m, '{red}', '0')\n        w: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n{tail}"
    )
}

const COPY: &str = "        y: \"f32[]\" = torch.ops.aten.clone.default(w)\n";

#[test]
fn a_local_mean_divided_by_n_where_the_spec_does_not_is_no_average() {
    // Base: holds. The pieces m_r / 2 sum to the mean and average to half of it.
    let r = verdict(MEAN, &scaled("mean", "div", "2"), "Partial(avg)", "div");
    assert_eq!(r, Verdict::Inconclusive);
}

#[test]
fn the_specs_own_division_keeps_the_average() {
    let spec = scaled("mean", "div", "2");
    assert_eq!(
        verdict(&spec, &spec, "Partial(avg)", "same"),
        Verdict::Holds
    );
}

#[test]
fn a_factor_of_one_over_n_against_the_specs_own_turns_an_average_into_a_sum() {
    // The spec halves its mean, each rank quarters its local mean: the pieces sum to the
    // spec's value (`run` agrees), and average to half of it.
    let spec = scaled("mean", "mul", "0.5");
    let rank = scaled("mean", "mul", "0.25");
    // Base: inconclusive (the label stayed `avg`).
    assert_eq!(
        verdict(&spec, &rank, "Partial(sum)", "quarter-sum"),
        Verdict::Holds
    );
    // Base: holds.
    assert_eq!(
        verdict(&spec, &rank, "Partial(avg)", "quarter-avg"),
        Verdict::Inconclusive
    );
}

#[test]
fn an_all_reduce_sum_of_local_means_is_not_the_mean() {
    // Base: holds. Every rank holds twice the mean.
    let r = verdict(MEAN, &all_reduced("mean", "sum", COPY), "Replicate()", "ar");
    assert_eq!(r, Verdict::Inconclusive);
}

#[test]
fn an_all_reduce_average_of_local_sums_is_not_the_sum() {
    // Base: holds. Every rank holds half the sum.
    let r = verdict(
        SUM,
        &all_reduced("sum", "avg", COPY),
        "Replicate()",
        "ar-avg",
    );
    assert_eq!(r, Verdict::Inconclusive);
}

#[test]
fn the_data_parallel_loss_divided_by_n_after_the_sum_holds() {
    let div = "        y: \"f32[]\" = torch.ops.aten.div.Tensor(w, 2)\n";
    assert_eq!(
        verdict(MEAN, &all_reduced("mean", "sum", div), "Replicate()", "ddp"),
        Verdict::Holds
    );
    // Another factor leaves no known placement.
    let other = "        y: \"f32[]\" = torch.ops.aten.div.Tensor(w, 3)\n";
    assert_eq!(
        verdict(
            MEAN,
            &all_reduced("mean", "sum", other),
            "Replicate()",
            "ddp3"
        ),
        Verdict::Inconclusive
    );
    // The matching reduction needs no division.
    assert_eq!(
        verdict(
            MEAN,
            &all_reduced("mean", "avg", COPY),
            "Replicate()",
            "avg"
        ),
        Verdict::Holds
    );
}

#[test]
fn a_reduce_scatter_sum_of_local_means_is_not_the_mean() {
    let spec = "        y: \"f32[8]\" = torch.ops.aten.mean.dim(x, [0])\n";
    let rank = |red: &str| {
        format!(
            "        m: \"f32[8]\" = torch.ops.aten.mean.dim(x, [0])\n        rs: \"f32[4]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(m, '{red}', 2, '0')\n        y: \"f32[4]\" = torch.ops._c10d_functional.wait_tensor.default(rs)\n"
        )
    };
    // Base: holds.
    assert_eq!(
        verdict(spec, &rank("sum"), "Shard(0)", "rs"),
        Verdict::Inconclusive
    );
    assert_eq!(
        verdict(spec, &rank("avg"), "Shard(0)", "rs-avg"),
        Verdict::Holds
    );
}

#[test]
fn a_replicated_value_divided_by_n_where_the_spec_does_not_is_not_proven() {
    // Replicated rows on both ranks: each rank's `y` is half the spec's mean. Base: holds
    // (the division by n is recorded as `scaled`, a share of a sum, and passed as the
    // replicated value); `run` finds the output wrong.
    let tag = "avg-rep".to_string();
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\"):\n{body}        return (y,)\n"
        )
    };
    files.push(("spec.py".to_string(), graph("Spec", MEAN).to_string()));
    for r in ["r0.py", "r1.py"] {
        files.push((
            r.to_string(),
            graph("Rank", &scaled("mean", "div", "2")).to_string(),
        ));
    }
    files.push((
        "case.yaml".to_string(),
        "version: 1\nname: rep\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Replicate()\noutputs:\n  y: Replicate()\n".to_string(),
    ));
    assert_eq!(
        common::hand::check_files(&tag, &files),
        Verdict::Inconclusive
    );
}
