//! Replicated operands that feed a partial or sharded region, compared across peers through
//! the collective that ends the region (issue 44, soundness).
//!
//! Each case runs on `dp=2` with `x: f32[4, 8]` replicated, `p: f32[4, 8]` `Partial(sum)` and
//! `s: f32[4, 8]` `Shard(0)` (`f32[2, 8]` per rank), and `y` declared `Replicate()`. The rules
//! compare a node with its peer node (the same name, operator and input names); a peer with no
//! such node counts as "not varying", so a value the ranks compute otherwise is `Replicate()`
//! for them. The output comparison stopped at a collective whose input is not replicated (its
//! result is the same on every member): on the base (a398d43) the cases marked "base: holds"
//! held with exit 0, while `shardproof run` finds `y` wrong.

mod common;

use shardproof_check::Verdict;

/// The verdict of a case whose spec runs `spec` and whose ranks 0 and 1 run `r0` and `r1`
/// (lines of a forward reading `x`, `p` and `s` and writing `y`).
fn verdict(spec: &str, r0: &str, r1: &str, dir: &str) -> Verdict {
    let tag = format!("region-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, rows: u32, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", p: \"f32[4, 8]\", s: \"f32[{rows}, 8]\"):\n{body}        return (y,)\n"
        )
    };
    files.push(("spec.py".to_string(), graph("Spec", 4, spec).to_string()));
    files.push(("r0.py".to_string(), graph("Rank", 2, r0).to_string()));
    files.push(("r1.py".to_string(), graph("Rank", 2, r1).to_string()));
    let case = "version: 1\nname: region\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Replicate()\n  p: Partial(sum)\n  s: Shard(0)\noutputs:\n  y: Replicate()\n";
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

/// One line `NAME: "f32[ROWS, 8]" = torch.ops.aten.CALL`.
fn line(name: &str, rows: u32, call: &str) -> String {
    format!("        {name}: \"f32[{rows}, 8]\" = torch.ops.aten.{call}\n")
}

/// `y = all_reduce(t, sum)` over dp (a rank's tail).
fn all_reduce(t: &str) -> String {
    format!(
        "        a: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default({t}, 'sum', '0')\n        y: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n"
    )
}

/// `y = all_gather(t)` over dp (a rank's tail).
fn all_gather(t: &str) -> String {
    format!(
        "        a: \"f32[4, 8]\" = torch.ops._c10d_functional.all_gather_into_tensor.default({t}, 2, '0')\n        y: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n"
    )
}

/// `h = H`, `t = h * p`, `y = all_reduce(t, sum)`; the spec computes `y = (x * 2) * p`.
fn factor(h: &str) -> (String, String) {
    let spec = line("h", 4, "mul.Tensor(x, 2)") + &line("y", 4, "mul.Tensor(h, p)");
    let rank = line("h", 4, h) + &line("t", 4, "mul.Tensor(h, p)") + &all_reduce("t");
    (spec, rank)
}

#[test]
fn a_factor_of_the_partial_a_peer_computes_otherwise() {
    // Base: holds with exit 0 (`run`: rel. error 2.39): rank 1's `h` calls `add`, so it has no
    // peer node and counts as replicated; the all-reduce's result was a shared leaf.
    let (spec, r0) = factor("mul.Tensor(x, 2)");
    let (_, r1) = factor("add.Tensor(x, 2)");
    assert_eq!(verdict(&spec, &r0, &r1, "factor-op"), Verdict::Inconclusive);
}

#[test]
fn a_factor_of_the_partial_under_another_name() {
    // Base: holds with exit 0: rank 1 computes its factor `g = x + 2` under another name, so
    // rank 0's `h` finds no node of its name there ("no peer": not varying).
    let (spec, r0) = factor("mul.Tensor(x, 2)");
    let r1 =
        line("g", 4, "add.Tensor(x, 2)") + &line("t", 4, "mul.Tensor(g, p)") + &all_reduce("t");
    assert_eq!(
        verdict(&spec, &r0, &r1, "factor-name"),
        Verdict::Inconclusive
    );
}

#[test]
fn a_factor_of_a_gathered_shard_a_peer_computes_otherwise() {
    // Base: holds with exit 0: the same through an all-gather of `s * h`, `h` a row.
    let row = |h: &str| {
        "        c: \"f32[8]\" = torch.ops.aten.sum.dim_IntList(x, [0])\n".to_string()
            + &format!("        h: \"f32[8]\" = torch.ops.aten.{h}\n")
    };
    let spec = row("mul.Tensor(c, 2)") + &line("y", 4, "mul.Tensor(s, h)");
    let rank = |h: &str| row(h) + &line("t", 2, "mul.Tensor(s, h)") + &all_gather("t");
    let (r0, r1) = (rank("mul.Tensor(c, 2)"), rank("add.Tensor(c, 2)"));
    assert_eq!(verdict(&spec, &r0, &r1, "gather-op"), Verdict::Inconclusive);
    assert_eq!(verdict(&spec, &r0, &r0, "gather-same"), Verdict::Holds);
}

#[test]
fn a_term_every_rank_adds_otherwise() {
    // `y = all_reduce(p + h)` where both ranks add an `h` of their own.
    let spec = line("h", 4, "mul.Tensor(x, 2)") + &line("y", 4, "add.Tensor(p, h)");
    let rank = |h: &str| line("h", 4, h) + &line("t", 4, "add.Tensor(p, h)") + &all_reduce("t");
    let (r0, r1) = (rank("mul.Tensor(x, 2)"), rank("add.Tensor(x, 2)"));
    assert_eq!(verdict(&spec, &r0, &r1, "term-both"), Verdict::Inconclusive);
}

#[test]
fn the_same_factor_on_every_rank_holds() {
    let (spec, rank) = factor("mul.Tensor(x, 2)");
    assert_eq!(verdict(&spec, &rank, &rank, "factor-same"), Verdict::Holds);
}

#[test]
fn a_term_added_on_one_rank_only_holds() {
    // Megatron's replicated norm term, counted once: rank 0 adds `x * x` to its piece, rank 1
    // does not; the pieces sum to `P + x * x`.
    let spec = line("h", 4, "mul.Tensor(x, x)") + &line("y", 4, "add.Tensor(p, h)");
    let r0 =
        line("h", 4, "mul.Tensor(x, x)") + &line("t", 4, "add.Tensor(p, h)") + &all_reduce("t");
    let r1 = line("t", 4, "mul.Tensor(p, 1)") + &all_reduce("t");
    assert_eq!(verdict(&spec, &r0, &r1, "term-one"), Verdict::Holds);
}

/// The verdict on `dp=4` of ranks running `ranks[k]` (lines reading `x` and `p`, writing `t`,
/// the rank's piece), then `y = all_reduce(t, sum)`; the spec computes `y = p + x * x`.
fn verdict4(ranks: [&str; 4], dir: &str) -> Verdict {
    let tag = format!("region4-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", p: \"f32[4, 8]\"):\n{body}        return (y,)\n"
        )
    };
    let spec = line("h", 4, "mul.Tensor(x, x)") + &line("y", 4, "add.Tensor(p, h)");
    files.push(("spec.py".to_string(), graph("Spec", &spec).to_string()));
    for (k, body) in ranks.iter().enumerate() {
        let rank = body.to_string() + &all_reduce("t");
        files.push((
            format!("r{k}.py").to_string(),
            graph("Rank", &rank).to_string(),
        ));
    }
    let case = "version: 1\nname: region4\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 4 }\n  graphs: [r0.py, r1.py, r2.py, r3.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Replicate()\n  p: Partial(sum)\noutputs:\n  y: Replicate()\n";
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

#[test]
fn a_term_two_of_four_ranks_add_is_not_held() {
    // Base: holds with exit 0 (`run`: rel. error 0.67): ranks 0 and 1 add `x * x`, so the sum
    // counts it twice; each rank saw a peer without the term, which the rule reads as "added on
    // some ranks only".
    let adds = line("h", 4, "mul.Tensor(x, x)") + &line("t", 4, "add.Tensor(p, h)");
    let plain = line("t", 4, "mul.Tensor(p, 1)");
    assert_eq!(
        verdict4([&adds, &adds, &plain, &plain], "two"),
        Verdict::Inconclusive
    );
    assert_eq!(
        verdict4([&adds, &plain, &plain, &plain], "one"),
        Verdict::Holds
    );
}

#[test]
fn a_share_every_rank_adds_holds_and_half_the_ranks_do_not() {
    // `x * x / 4` added on every rank sums to `x * x`; on two of the four, to half of it.
    let share = line("g", 4, "mul.Tensor(x, x)")
        + &line("h", 4, "div.Tensor(g, 4)")
        + &line("t", 4, "add.Tensor(p, h)");
    let plain = line("t", 4, "mul.Tensor(p, 1)");
    assert_eq!(
        verdict4([&share, &share, &share, &share], "all"),
        Verdict::Holds
    );
    assert_ne!(
        verdict4([&share, &share, &plain, &plain], "half"),
        Verdict::Holds
    );
}
