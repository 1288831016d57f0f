//! A declared shard whose pieces a peer computes otherwise (issue 44, soundness, round 3).
//!
//! Each case runs on `dp=2` with `x: f32[4, 8]` replicated, `w: f32[8, 8]` sharded on its
//! columns (`Shard(1)`, `f32[8, 4]` per rank) and `y = mm(h, w)` declared `Shard(1)`. The
//! rules compare a node with its peer node of the same name and operator; a peer whose `h`
//! calls another operator had no such node, so `h` counted as replicated and `y` as the
//! declared shard. On the base (47467bf) `operator_differs` held with exit 0, while
//! `shardproof run` on the same case finds `y` wrong (rel. error 0.89, exit 1): rank 1's
//! columns are `mm(x + 2, w)`, not the spec's `mm(x * 2, w)`, so no one `h` makes the pieces
//! one tensor.

mod common;

use shardproof_check::Verdict;

/// The verdict of a case whose spec and rank 0 compute `h = x * 2` and whose rank 1 computes
/// `h = H1`; all three then compute `y = mm(h, w)`.
fn verdict(h1: &str, dir: &str) -> Verdict {
    let tag = format!("peershard-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, h: &str, cols: u32| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", w: \"f32[8, {cols}]\"):\n        h: \"f32[4, 8]\" = torch.ops.aten.{h}\n        y: \"f32[4, {cols}]\" = torch.ops.aten.mm.default(h, w)\n        return (y,)\n"
        )
    };
    let h0 = "mul.Tensor(x, 2)";
    files.push(("spec.py".to_string(), graph("Spec", h0, 8).to_string()));
    files.push(("r0.py".to_string(), graph("Rank", h0, 4).to_string()));
    files.push(("r1.py".to_string(), graph("Rank", h1, 4).to_string()));
    let case = "version: 1\nname: peershard\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Replicate()\n  w: Shard(1)\noutputs:\n  y: Shard(1)\n";
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

#[test]
fn operator_differs() {
    // Base: holds (a peer with no peer node counted as "not varying").
    assert_eq!(verdict("add.Tensor(x, 2)", "op"), Verdict::Inconclusive);
}

#[test]
fn literal_differs() {
    // The same operator under the same name with another literal: the rules compare the
    // literals (`Varying`), which already made this inconclusive on the base; pinned here.
    assert_eq!(verdict("mul.Tensor(x, 3)", "lit"), Verdict::Inconclusive);
}

#[test]
fn same_program_holds() {
    // The control: every rank computes its columns the same way.
    assert_eq!(verdict("mul.Tensor(x, 2)", "same"), Verdict::Holds);
}

/// The verdict of `y = mul(h, p)` declared `Partial(sum)` with `p: Partial(sum)`, where the
/// spec and rank 0 compute `h = x * 2` and rank 1 computes `h = H1`.
fn partial_verdict(h1: &str, dir: &str) -> Verdict {
    let tag = format!("peerpart-{dir}");
    let mut files: Vec<(String, String)> = Vec::new();
    let graph = |class: &str, h: &str| {
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", p: \"f32[4, 8]\"):\n        h: \"f32[4, 8]\" = torch.ops.aten.{h}\n        y: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(h, p)\n        return (y,)\n"
        )
    };
    let h0 = "mul.Tensor(x, 2)";
    files.push(("spec.py".to_string(), graph("Spec", h0).to_string()));
    files.push(("r0.py".to_string(), graph("Rank", h0).to_string()));
    files.push(("r1.py".to_string(), graph("Rank", h1).to_string()));
    let case = "version: 1\nname: peerpart\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": dp\ninputs:\n  x: Replicate()\n  p: Partial(sum)\noutputs:\n  y: Partial(sum)\n";
    files.push(("case.yaml".to_string(), case.to_string()));
    common::hand::check_files(&tag, &files)
}

#[test]
fn partial_operator_differs() {
    // Base (789fa4c): holds; the pieces sum to `x*2*p0 + (x+2)*p1`, no `h * P` for one `h`
    // (`run`: rel. error 2.39).
    assert_eq!(
        partial_verdict("add.Tensor(x, 2)", "op"),
        Verdict::Inconclusive
    );
}

#[test]
fn partial_same_program_holds() {
    assert_eq!(partial_verdict("mul.Tensor(x, 2)", "same"), Verdict::Holds);
}
