//! A rank's scaling by a number read against the spec's scaling at the same position, not the
//! spec's node of the same name (issue 44): a pipeline stage names its nodes from 0, so the
//! spec's node of a rank node's name is another node, and autograd folds a loss share's 1/n
//! into a constant (DeepSeek's router aux-loss gradient, `mul(sum, c / tp)` where the spec
//! has `mul(sum, c)`).
//!
//! Each case runs on `tp=4`: `a: f32[4, 8]` sharded on dim 1 and `w: f32[8, 8]` on dim 0, so
//! `mm(a, w)` is a partial sum; `b` and `c: f32[4, 8]` replicated. The spec computes
//! `y = mm(a, w) + b * 0.25` (its scaling named `mul_1`) and `z = c * 1.0` (`mul_2`); each
//! rank adds its scaled `b` to its partial product and all-reduces the sum.

mod common;

use shardproof_check::Verdict;

const TP: usize = 4;

/// The spec: `mul_1 = b * 0.25`, `mul_2 = c * 1.0`, `y = mm(a, w) + mul_1`, `z = mul_2`.
const SPEC: &str = "        mul_1: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(b, 0.25)
        mul_2: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(c, 1.0)
        p: \"f32[4, 8]\" = torch.ops.aten.mm.default(a, w)
        y: \"f32[4, 8]\" = torch.ops.aten.add.Tensor(p, mul_1)
        z: \"f32[4, 8]\" = torch.ops.aten.clone.default(mul_2)
";

/// A rank: `z = c * 1.0` named `z_scaled`, then `SCALE` (a line defining `s`, the rank's
/// scaled `b`, under whatever name it gives), `y = all_reduce(mm(a, w) + s)`.
fn rank(scale: &str, s: &str) -> String {
    format!(
        "        z_scaled: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(c, 1.0)
        z: \"f32[4, 8]\" = torch.ops.aten.clone.default(z_scaled)
{scale}        p: \"f32[4, 8]\" = torch.ops.aten.mm.default(a, w)
        t: \"f32[4, 8]\" = torch.ops.aten.add.Tensor(p, {s})
        ar: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', '0')
        y: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(ar)
"
    )
}

/// The verdict of the case whose ranks all run `body` (the spec runs [`SPEC`]).
fn verdict(body: &str, tag: &str) -> Verdict {
    verdict_of(SPEC, body, tag)
}

/// The verdict of the case whose spec runs `spec` and whose ranks all run `body`.
fn verdict_of(spec: &str, body: &str, tag: &str) -> Verdict {
    let graph = |class: &str, local: bool, body: &str| {
        let (a, w) = if local {
            ("f32[4, 2]", "f32[2, 8]")
        } else {
            ("f32[4, 8]", "f32[8, 8]")
        };
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, a: \"{a}\", w: \"{w}\", b: \"f32[4, 8]\", c: \"f32[4, 8]\"):\n{body}        return (y, z)\n"
        )
    };
    let mut files = vec![("spec.py".to_string(), graph("Spec", false, spec))];
    let mut names = Vec::new();
    for r in 0..TP {
        files.push((format!("r{r}.py"), graph("Rank", true, body)));
        names.push(format!("r{r}.py"));
    }
    let case = format!(
        "version: 1\nname: folded\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {TP} }}\n  graphs: [{}]\n  groups:\n    \"0\": tp\ninputs:\n  a: Shard(1)\n  w: Shard(0)\n  b: Replicate()\n  c: Replicate()\noutputs:\n  y: Replicate()\n  z: Replicate()\n",
        names.join(", ")
    );
    files.push(("case.yaml".to_string(), case));
    common::hand::check_files(&format!("folded-{tag}"), &files)
}

/// `NAME = b * X`.
fn scaled_b(name: &str, x: f64) -> String {
    format!("        {name}: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(b, {x:?})\n")
}

#[test]
fn a_folded_share_under_a_shifted_name_holds() {
    // `b * 0.0625` is each rank's quarter of the spec's `b * 0.25`: the all-reduce sums the
    // quarters. The spec has no node `mul_3`: read by name, the factor is no share, and the
    // partial plus it was the finding "partial + replicate" (the false finding the DeepSeek
    // presets met on their last stage).
    let body = rank(&scaled_b("mul_3", 0.0625), "mul_3");
    assert_eq!(verdict(&body, "share"), Verdict::Holds);
}

#[test]
fn a_forgotten_share_is_no_share() {
    // Planted bug: every rank adds the spec's whole `b * 0.25`, counted four times.
    let body = rank(&scaled_b("mul_3", 0.25), "mul_3");
    assert_eq!(verdict(&body, "forgotten"), Verdict::Violated);
}

#[test]
fn a_forgotten_share_named_like_another_spec_scaling_is_no_share() {
    // Planted bug: the rank forgets the 1/4 (`b * 0.25`) under the name of the spec's
    // `mul_2 = c * 1.0`, a quarter of whose factor it is. Read by name, it was a quarter
    // share of the spec's `mul_2` and the sum held; by position it is the spec's `mul_1`.
    let body = rank(&scaled_b("mul_2", 0.25), "mul_2").replace("z_scaled", "mul_4");
    assert_eq!(verdict(&body, "coincident"), Verdict::Violated);
}

#[test]
fn a_share_of_another_operand_is_no_share() {
    // Planted bug: a quarter of the factor, but of `c`, not of `b` (the spec's `mul_1`
    // scales `b`): the position reads no spec scaling of this factor.
    let line = "        mul_3: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(c, 0.0625)\n";
    let body = rank(line, "mul_3");
    assert_ne!(verdict(&body, "operand"), Verdict::Holds);
}

/// The verdict of a case on `tp=2` whose spec scales `neg(neg(neg(b)))` by 0.25 and adds it to
/// `mm(a, w)`, and whose ranks do the same per half of the rows (two microbatches, joined
/// before the all-reduce), scaling each half by `factor`.
fn halves_verdict(factor: f64, tag: &str) -> Verdict {
    let spec = "        t1: \"f32[4, 8]\" = torch.ops.aten.neg.default(b)
        t2: \"f32[4, 8]\" = torch.ops.aten.neg.default(t1)
        t3: \"f32[4, 8]\" = torch.ops.aten.neg.default(t2)
        g: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(t3, 0.25)
        p: \"f32[4, 8]\" = torch.ops.aten.mm.default(a, w)
        y: \"f32[4, 8]\" = torch.ops.aten.add.Tensor(p, g)
"
    .to_string();
    let mut rank = "        p: \"f32[4, 8]\" = torch.ops.aten.mm.default(a, w)\n".to_string();
    for k in 0..2 {
        let (s, e) = (2 * k, 2 * k + 2);
        rank += &format!(
            "        b{k}: \"f32[2, 8]\" = torch.ops.aten.slice.Tensor(b, 0, {s}, {e})
        u{k}: \"f32[2, 8]\" = torch.ops.aten.neg.default(b{k})
        v{k}: \"f32[2, 8]\" = torch.ops.aten.neg.default(u{k})
        n{k}: \"f32[2, 8]\" = torch.ops.aten.neg.default(v{k})
        h{k}: \"f32[2, 8]\" = torch.ops.aten.mul.Tensor(n{k}, {factor:?})
        p{k}: \"f32[2, 8]\" = torch.ops.aten.slice.Tensor(p, 0, {s}, {e})
        y{k}: \"f32[2, 8]\" = torch.ops.aten.add.Tensor(p{k}, h{k})
"
        );
    }
    rank += "        yc: \"f32[4, 8]\" = torch.ops.aten.cat.default([y0, y1])
        ar: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default(yc, 'sum', '0')
        y: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(ar)
";
    let graph = |class: &str, local: bool, body: &str| {
        let (a, w) = if local {
            ("f32[4, 4]", "f32[4, 8]")
        } else {
            ("f32[4, 8]", "f32[8, 8]")
        };
        format!(
            "class {class}(torch.nn.Module):\n    def forward(self, a: \"{a}\", w: \"{w}\", b: \"f32[4, 8]\"):\n{body}        return (y,)\n"
        )
    };
    let files = vec![
        ("spec.py".to_string(), graph("Spec", false, &spec)),
        ("r0.py".to_string(), graph("Rank", true, &rank)),
        ("r1.py".to_string(), graph("Rank", true, &rank)),
        (
            "case.yaml".to_string(),
            "version: 1\nname: halves\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"0\": tp\ninputs:\n  a: Shard(1)\n  w: Shard(0)\n  b: Replicate()\noutputs:\n  y: Replicate()\n".to_string(),
        ),
    ];
    common::hand::check_files(&format!("folded-halves-{tag}"), &files)
}

#[test]
fn a_share_of_each_microbatch_holds() {
    // Each half of the rows scaled by 0.125, a half of the spec's 0.25: the share is read
    // whatever part of the rows a microbatch holds (was: the spec's elements over the rank's,
    // 2 here, made the factor look like the whole and the sum a finding).
    assert_eq!(halves_verdict(0.125, "share"), Verdict::Holds);
}

#[test]
fn a_microbatch_that_forgets_the_share_is_no_share() {
    // Planted bug: each half scaled by the spec's whole 0.25, counted twice by the sum. The
    // rank holds half the spec's elements: read by element counts, its factor was the share.
    assert_eq!(halves_verdict(0.25, "forgotten"), Verdict::Violated);
}

#[test]
fn spec_scalings_of_one_position_and_two_factors_name_no_share() {
    // Planted bug: the spec scales `b` twice at one position, by 0.25 (`z`) and by 0.5 (the
    // term of `y`); each rank adds `b * 0.0625` to its partial product, a quarter of the
    // 0.25 but not of the 0.5 its sum stands for. Which spec scaling a rank's `mul(b, ..)`
    // stands for is not told by position: no reading (taking the first was a share).
    let spec = "        mul_1: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(b, 0.25)
        mul_2: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(b, 0.5)
        p: \"f32[4, 8]\" = torch.ops.aten.mm.default(a, w)
        y: \"f32[4, 8]\" = torch.ops.aten.add.Tensor(p, mul_2)
        z: \"f32[4, 8]\" = torch.ops.aten.clone.default(mul_1)
";
    let body = rank(&scaled_b("mul_3", 0.0625), "mul_3").replace(
        "torch.ops.aten.mul.Tensor(c, 1.0)",
        "torch.ops.aten.mul.Tensor(b, 0.25)",
    );
    assert_eq!(verdict_of(spec, &body, "two-factors"), Verdict::Violated);
}

#[test]
fn a_scaling_alike_only_near_the_operator_is_no_share() {
    // Planted bug: the spec's one scaling is `b * 0.25`; each rank adds `neg(c) * 0.0625`, a
    // quarter of that factor on another tensor. One level deep both are "a `mul` of one
    // value": too shallow to stand in its place.
    let spec = SPEC.replace(
        "torch.ops.aten.mul.Tensor(c, 1.0)",
        "torch.ops.aten.clone.default(c)",
    );
    let lines = "        nc: \"f32[4, 8]\" = torch.ops.aten.neg.default(c)
        mul_3: \"f32[4, 8]\" = torch.ops.aten.mul.Tensor(nc, 0.0625)
";
    let body = rank(lines, "mul_3").replace(
        "torch.ops.aten.mul.Tensor(c, 1.0)",
        "torch.ops.aten.clone.default(c)",
    );
    assert_eq!(verdict_of(&spec, &body, "shallow"), Verdict::Violated);
}
