//! Uses of a replicated value divided by the mesh size (`scaled`) and of nodes a peer computes
//! otherwise (issue 44, soundness).
//!
//! Each case runs on `dp=2` with `x`, `b: f32[4, 8]` and `w: f32[8, 8]` replicated and `y`
//! declared `Replicate()`. The cases marked "base: holds" held with exit 0 on the base
//! (168e183) while `shardproof run` finds `y` wrong (run exit 1, checked on the same cases).
//! A use of a halved value whose result is replicated (`x / 2 + b`, `relu(x / 2)`) still
//! holds: its placement is right, and the record cannot tell a share from a value the spec
//! divides too (docs/check.md, Open).

mod common;

use shardproof_check::Verdict;

/// The verdict of a case whose spec runs `spec` and whose ranks 0 and 1 run `r0` and `r1`
/// (lines of a forward reading `x`, `b`, `w` and writing `y`).
fn verdict(spec: &str, r0: &str, r1: &str, dir: &str) -> Verdict {
    let tag = format!("scaled-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, body: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", b: \"f32[4, 8]\", w: \"f32[8, 8]\"):\n{body}        return (y,)\n"
        )
    };
    files.push(("spec.py".to_string(), graph("Spec", spec).to_string()));
    files.push(("r0.py".to_string(), graph("Rank", r0).to_string()));
    files.push(("r1.py".to_string(), graph("Rank", r1).to_string()));
    let case = "version: 1\nname: scaled\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Replicate()\n  b: Replicate()\n  w: Replicate()\noutputs:\n  y: Replicate()\n";
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

/// One line `NAME: "f32[4, 8]" = torch.ops.aten.CALL`.
fn line(name: &str, call: &str) -> String {
    format!("        {name}: \"f32[4, 8]\" = torch.ops.aten.{call}\n")
}

/// `h = x / 2`, then `y = TAIL` (the spec computes `y = SPEC_TAIL` with `x` for `h`).
fn halved(tail: &str) -> String {
    line("h", "div.Tensor(x, 2)") + &line("y", tail)
}

#[test]
fn a_halved_value_as_the_second_factor_is_still_halved() {
    // Base: holds (`run`: rel. error 0.5): only a first operand carried the record, so the
    // product reached the output as the spec's replicated tensor.
    let spec = line("y", "mul.Tensor(b, x)");
    let rank = halved("mul.Tensor(b, h)");
    assert_eq!(verdict(&spec, &rank, &rank, "mul"), Verdict::Inconclusive);
}

/// `h = x / 2`, `s = b / 2`, `y = all_reduce(h + s, sum)` over dp.
const SHARES: &str = "        h: \"f32[4, 8]\" = torch.ops.aten.div.Tensor(x, 2)
        s: \"f32[4, 8]\" = torch.ops.aten.div.Tensor(b, 2)
        t: \"f32[4, 8]\" = torch.ops.aten.add.Tensor(h, s)
        a: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', '0')
        y: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(a)
";

#[test]
fn a_halved_share_summed_over_the_ranks_still_holds() {
    // The use the record is for: the all-reduce sum of the halves is the spec's `x + b`.
    let spec = line("y", "add.Tensor(x, b)");
    assert_eq!(verdict(&spec, SHARES, SHARES, "share"), Verdict::Holds);
}

#[test]
fn a_division_the_spec_makes_too_is_no_share() {
    // Spec and ranks both halve `x` at `h`: each rank holds the spec's `h`, and the sum over
    // the ranks of `h + b/2` counts it twice. Base: holds (`run`: `y` is `x + b`, the spec's
    // `x/2 + b`).
    let spec = halved("add.Tensor(h, b)");
    assert_ne!(verdict(&spec, SHARES, SHARES, "specdiv"), Verdict::Holds);
}

#[test]
fn a_peer_computing_a_node_with_another_operator_varies() {
    // Rank 1 adds where rank 0 multiplies: the ranks hold different tensors. Base: holds
    // (no peer node counted as "not varying").
    let spec = line("y", "mul.Tensor(x, 2)");
    let r1 = line("y", "add.Tensor(x, 2)");
    assert_ne!(verdict(&spec, &spec, &r1, "peerop"), Verdict::Holds);
}

#[test]
fn a_peer_computing_an_input_of_the_output_otherwise_varies() {
    // Both ranks compute `y = relu(h)`, but `h` is `x * 2` on rank 0 and `x + 2` on rank 1.
    // Base: holds (`y` has a peer node; `h` has none).
    let spec = line("h", "mul.Tensor(x, 2)") + &line("y", "relu.default(h)");
    let r1 = line("h", "add.Tensor(x, 2)") + &line("y", "relu.default(h)");
    assert_ne!(verdict(&spec, &spec, &r1, "peerdeep"), Verdict::Holds);
}

#[test]
fn a_peer_reading_other_inputs_varies() {
    // Rank 1 negates `b` where rank 0 negates `x`. Base: holds.
    let spec = line("y", "neg.default(x)");
    let r1 = line("y", "neg.default(b)");
    assert_ne!(verdict(&spec, &spec, &r1, "peerin"), Verdict::Holds);
}

#[test]
fn the_same_program_on_both_ranks_holds() {
    let spec = line("y", "mul.Tensor(x, 2)");
    assert_eq!(verdict(&spec, &spec, &spec, "same"), Verdict::Holds);
}

/// `h = H`, `s = h / 2`, `y = all_reduce(s, sum)` over dp.
fn summed_halves(h: &str) -> String {
    line("h", h)
        + &line("s", "div.Tensor(h, 2)")
        + "        a: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default(s, 'sum', '0')\n"
        + "        y: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n"
}

#[test]
fn a_share_a_peer_computes_otherwise_is_no_share() {
    // Round 3: rank 1 halves `x + 2` where rank 0 halves `x * 2`; the all-reduce result is
    // the same on both ranks, but the halves it adds are no shares of one tensor (`s` is not
    // replicated). Base (fdea54d): holds, the all-reduce's result counted as a shared leaf
    // (`run`: rel. error 0.93).
    let spec = line("y", "mul.Tensor(x, 2)");
    let r0 = summed_halves("mul.Tensor(x, 2)");
    let r1 = summed_halves("add.Tensor(x, 2)");
    assert_eq!(verdict(&spec, &r0, &r1, "peershare"), Verdict::Inconclusive);
}

#[test]
fn a_share_every_peer_computes_alike_still_holds() {
    let spec = line("y", "mul.Tensor(x, 2)");
    let rank = summed_halves("mul.Tensor(x, 2)");
    assert_eq!(verdict(&spec, &rank, &rank, "alikeshare"), Verdict::Holds);
}
