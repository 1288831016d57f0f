//! Adversarial review (prove-review6) of the stage memo up to node order (`stage/canon.rs`:
//! canonical dataflow order, send/recv peers blank, messages in the key, only where every
//! collective meeting is diagonal) and of the narrow-type guards (`exec/rules.rs`
//! `exact_in_its_type`, `widened_operands_exact`).
//!
//! Two kinds of test:
//!
//! - false proofs: a program the interpreter shows wrong (the spec's output and the ranks'
//!   differ on concrete inputs) that no path of the prover may prove;
//! - memo twins: a plan holding a right stage and a wrong one that differ only in what the
//!   canonical key must still tell apart (a recv's pairing among same-tag messages, operand
//!   order, a group's member order, a dtype, a node no output reaches). The wrong stage must
//!   get its own key and be refuted, never proved by the right one's proof.

use shardproof_interp::RunConfig;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::stage::{plan_with, prove_staged_with};
use shardproof_prove::{
    prove_case, prove_case_or_full_size, PlanOptions, Proof, ProveConfig, StagedProof, Verdict,
};
use std::collections::BTreeMap;

const HEADER: &str = "class GraphModule(torch.nn.Module):\n";

/// Writes `files` (name, text) and `case_yaml` into a temporary directory and loads the case.
fn load(files: &[(&str, String)], case_yaml: &str) -> (tempfile::TempDir, shardproof_case::Case) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::write(dir.path().join("case.yaml"), case_yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    (dir, case)
}

fn tensor(dtype: DType, shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::new(Meta::new(dtype, shape.to_vec()), data)
}

/// A verdict and its message, for assertion messages.
fn report(p: &Proof) -> String {
    format!("{:?} {:?}", p.verdict, p.message)
}

/// The verdicts at full size, reduced, and through `prove_case_or_full_size` (the CLI's
/// path): none may be `Proved`.
fn assert_none_proved(case: &shardproof_case::Case, why: &str) {
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    let reduced = prove_case(case, &ProveConfig::default());
    let (cli, _) = prove_case_or_full_size(case, &ProveConfig::default());
    let all = [("full size", &full), ("reduced", &reduced), ("cli", &cli)];
    // The CLI's `--stages` path: each stage proved by `prove_case` at reduced sizes.
    let by_stages = prove_staged_with(case, &ProveConfig::default(), 1, &PlanOptions::default());
    assert!(
        all.iter().all(|(_, p)| p.verdict != Verdict::Proved)
            && by_stages.verdict != Verdict::Proved,
        "false proof ({why}):\n{}\nstaged: {:?} {:?}",
        all.iter()
            .map(|(k, p)| format!("{k}: {}", report(p)))
            .collect::<Vec<_>>()
            .join("\n"),
        by_stages.verdict,
        by_stages.message
    );
}

/// Narrow types: a `tp = 2` mesh whose ranks both run `rank` on replicated `x: i64[2]`,
/// `b: b8[2]`, `m: b8[2]` and `fl: f32[2]`, output `out: f32[...]` replicated.
mod fills {
    use super::*;

    const SIG: &str =
        "    def forward(self, x: \"i64[2]\", b: \"b8[2]\", m: \"b8[2]\", fl: \"f32[2]\"):\n";

    /// The case from the spec's and the rank's bodies.
    pub fn case(spec: &str, rank: &str) -> (tempfile::TempDir, shardproof_case::Case) {
        let files = vec![
            ("spec.py", format!("{HEADER}{SIG}{spec}")),
            ("rank.py", format!("{HEADER}{SIG}{rank}")),
        ];
        super::load(
            &files,
            "version: 1\nname: fills\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Replicate()\n  b: Replicate()\n  m: Replicate()\n  fl: Replicate()\noutputs:\n  out: Replicate()\n",
        )
    }

    /// The spec's output and rank 0's, in the interpreter, on `x = [7, 9]`,
    /// `b = [False, True]`, `m = [True, False]`, `fl = [0.5, 1.5]`.
    pub fn run_both(case: &shardproof_case::Case) -> (Vec<f64>, Vec<f64>) {
        let leaves = BTreeMap::from([
            ("x".to_string(), tensor(DType::I64, &[2], vec![7.0, 9.0])),
            ("b".to_string(), tensor(DType::Bool, &[2], vec![0.0, 1.0])),
            ("m".to_string(), tensor(DType::Bool, &[2], vec![1.0, 0.0])),
            ("fl".to_string(), tensor(DType::F32, &[2], vec![0.5, 1.5])),
        ]);
        let cfg = RunConfig::default();
        let out = |g: &shardproof_ir::Graph| {
            let env = shardproof_interp::run_graph(g, &leaves, &cfg).expect("runs");
            env.get(g.outputs[0].expect("an output"))
                .expect("computed")
                .data
                .to_vec()
        };
        (out(&case.spec), out(&case.program.ranks[0]))
    }

    /// The case is wrong in the interpreter (`expected` the spec's output, the rank's
    /// differing) and must not be proved.
    pub fn check_wrong(spec: &str, rank: &str, expected: (&[f64], &[f64]), why: &str) {
        let (_d, case) = case(spec, rank);
        let (spec_out, rank_out) = run_both(&case);
        assert_eq!(
            (spec_out.as_slice(), rank_out.as_slice()),
            expected,
            "the interpreter's evidence changed"
        );
        assert_ne!(spec_out, rank_out);
        assert_none_proved(&case, why);
    }
}

/// `masked_fill` casts its fill to `self`'s type (the kernel's `cast_value`: 2.5 into an
/// `int64` is 2), where the prover's rule reads the scalar as written. The spec fills `x` with
/// 2.5 (an `int64`: 2) and widens it to `f32`; the ranks fill the widened `x` with 2.5.
/// The interpreter: spec `[2, 9]`, ranks `[2.5, 9]`. A false proof if proved.
#[test]
fn a_fractional_fill_into_an_integer_is_cast_by_the_kernel() {
    fills::check_wrong(
        "        f: \"i64[2]\" = torch.ops.aten.masked_fill.Scalar(x, m, 2.5)\n        out: \"f32[2]\" = torch.ops.aten._to_copy.default(f, dtype = torch.float32)\n        return (out,)\n",
        "        xf: \"f32[2]\" = torch.ops.aten._to_copy.default(x, dtype = torch.float32)\n        out: \"f32[2]\" = torch.ops.aten.where.ScalarSelf(m, 2.5, xf)\n        return (out,)\n",
        (&[2.0, 9.0], &[2.5, 9.0]),
        "masked_fill's 2.5 into int64 is 2 in the kernel",
    );
}

/// The narrowest type: `masked_fill` of a `bool` with 2 stores `True` (1), the prover's rule
/// keeps 2, and a cast out of `bool` keeps it. The interpreter: spec `[1, 1]`, ranks `[2, 1]`.
#[test]
fn a_fill_of_two_into_a_bool_is_true() {
    fills::check_wrong(
        "        f: \"b8[2]\" = torch.ops.aten.masked_fill.Scalar(b, m, 2)\n        out: \"f32[2]\" = torch.ops.aten._to_copy.default(f, dtype = torch.float32)\n        return (out,)\n",
        "        bf: \"f32[2]\" = torch.ops.aten._to_copy.default(b, dtype = torch.float32)\n        out: \"f32[2]\" = torch.ops.aten.where.ScalarSelf(m, 2.0, bf)\n        return (out,)\n",
        (&[1.0, 1.0], &[2.0, 1.0]),
        "masked_fill's 2 into bool is True (1) in the kernel",
    );
}

/// `constant_pad_nd` casts its value to the padded tensor's type (2.5 into an `int64` is 2),
/// but the prover runs the kernel on `f64` element indices, where the fill stays 2.5. The
/// interpreter: spec `[2, 7, 9]`, ranks `[2.5, 7, 9]`.
#[test]
fn a_fractional_pad_value_into_an_integer_is_cast_by_the_kernel() {
    fills::check_wrong(
        "        p: \"i64[3]\" = torch.ops.aten.constant_pad_nd.default(x, [1, 0], 2.5)\n        out: \"f32[3]\" = torch.ops.aten._to_copy.default(p, dtype = torch.float32)\n        return (out,)\n",
        "        xf: \"f32[2]\" = torch.ops.aten._to_copy.default(x, dtype = torch.float32)\n        out: \"f32[3]\" = torch.ops.aten.constant_pad_nd.default(xf, [1, 0], 2.5)\n        return (out,)\n",
        (&[2.0, 7.0, 9.0], &[2.5, 7.0, 9.0]),
        "constant_pad_nd's 2.5 into int64 is 2 in the kernel",
    );
}

/// Stages apart: one per expected output.
fn apart() -> PlanOptions {
    PlanOptions {
        outputs_apart: true,
        ..PlanOptions::default()
    }
}

/// The plan's stages as (target, representative), with unreduced and with reduced keys (they
/// must agree).
fn reps(case: &shardproof_case::Case) -> Vec<(String, usize)> {
    let keyed = |reduce: bool| -> Vec<(String, usize)> {
        let plan = plan_with(case, reduce, &apart()).unwrap();
        plan.stages
            .iter()
            .map(|s| (s.target.clone(), s.rep))
            .collect()
    };
    let unreduced = keyed(false);
    assert_eq!(
        unreduced,
        keyed(true),
        "reduced and unreduced keys disagree"
    );
    unreduced
}

/// The staged proof of the case, one stage per output.
fn staged(case: &shardproof_case::Case) -> StagedProof {
    prove_staged_with(case, &ProveConfig::default(), 1, &apart())
}

/// The stages' targets, verdicts, memo hits and messages, for assertion messages.
fn stages(p: &StagedProof) -> String {
    p.stages
        .iter()
        .map(|s| {
            format!(
                "{} {:?} hit={} {:?}",
                s.target, s.verdict, s.memo_hit, s.message
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A right stage `a` and its twin `b` (wrong): `b` keeps its own key and is refuted.
fn assert_twin_refuted(case: &shardproof_case::Case, why: &str) {
    assert_eq!(
        reps(case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 1)],
        "{why}: the wrong stage `b` shares the right stage's key"
    );
    let proof = staged(case);
    assert_eq!(
        proof.stages[0].verdict,
        Some(Verdict::Proved),
        "{why}:\n{}",
        stages(&proof)
    );
    assert_eq!(
        proof.stages[1].verdict,
        Some(Verdict::Refuted),
        "{why}:\n{}",
        stages(&proof)
    );
    assert_eq!(proof.verdict, Verdict::Refuted, "{why}");
}

/// Two stages on a mesh { pp: 2 }: rank 0 computes `a` from `x0`, `x1`, rank 1 `b` from `y0`,
/// `y1`; the spec computes both by `spec_op` (`a = op(x0, x1)`, `b = op(y0, y1)`).
mod pairs {
    use super::HEADER;

    /// The case: `rank_a` and `rank_b` are the ranks' bodies after their signatures (each
    /// returns its output).
    pub fn case(
        spec_op: &str,
        rank_a: &str,
        rank_b: &str,
    ) -> (tempfile::TempDir, shardproof_case::Case) {
        let spec = format!("{HEADER}    def forward(self, x0: \"f32[2, 2]\", x1: \"f32[2, 2]\", y0: \"f32[2, 2]\", y1: \"f32[2, 2]\"):\n        a: \"f32[2, 2]\" = torch.ops.aten.{spec_op}(x0, x1)\n        b: \"f32[2, 2]\" = torch.ops.aten.{spec_op}(y0, y1)\n        return (a, b)\n");
        let ra = format!(
            "{HEADER}    def forward(self, x0: \"f32[2, 2]\", x1: \"f32[2, 2]\"):\n{rank_a}"
        );
        let rb = format!(
            "{HEADER}    def forward(self, y0: \"f32[2, 2]\", y1: \"f32[2, 2]\"):\n{rank_b}"
        );
        let files = vec![("spec.py", spec), ("ra.py", ra), ("rb.py", rb)];
        super::load(
            &files,
            "version: 1\nname: pairs\nspec:\n  graph: spec.py\nimpl:\n  mesh: { pp: 2 }\n  graphs: [ra.py, rb.py]\ninputs:\n  x0: { placement: Replicate(), at: { pp: 0 } }\n  x1: { placement: Replicate(), at: { pp: 0 } }\n  y0: { placement: Replicate(), at: { pp: 1 } }\n  y1: { placement: Replicate(), at: { pp: 1 } }\noutputs:\n  a: { placement: Replicate(), at: { pp: 0 } }\n  b: { placement: Replicate(), at: { pp: 1 } }\n",
        )
    }
}

/// Operand order after canonicalization: rank 1 computes `sub(y1, y0)` for the spec's
/// `sub(y0, y1)`. Its canonical graph is rank 0's (`in, in, sub(%0, %1)`: each operand is
/// placed where it is first read), so only the relations (which input sits at place 0) tell
/// the stages apart. Survives: `b` is keyed apart and refuted.
#[test]
fn a_non_commutative_operand_swap_is_another_stage() {
    let (_d, case) = pairs::case(
        "sub.Tensor",
        "        a: \"f32[2, 2]\" = torch.ops.aten.sub.Tensor(x0, x1)\n        return (a,)\n",
        "        b: \"f32[2, 2]\" = torch.ops.aten.sub.Tensor(y1, y0)\n        return (b,)\n",
    );
    assert_twin_refuted(&case, "sub's operands swapped");
}

/// The same with the swap hidden behind equal program text up to names: rank 1's inputs are
/// declared in the other order (`forward(y1, y0)` is not expressible here, so the rank reads
/// them through `alias` nodes written in the other order). Survives.
#[test]
fn operands_read_through_aliases_in_another_order_are_another_stage() {
    let (_d, case) = pairs::case(
        "div.Tensor",
        "        p: \"f32[2, 2]\" = torch.ops.aten.alias.default(x0)\n        q: \"f32[2, 2]\" = torch.ops.aten.alias.default(x1)\n        a: \"f32[2, 2]\" = torch.ops.aten.div.Tensor(p, q)\n        return (a,)\n",
        "        q: \"f32[2, 2]\" = torch.ops.aten.alias.default(y0)\n        p: \"f32[2, 2]\" = torch.ops.aten.alias.default(y1)\n        b: \"f32[2, 2]\" = torch.ops.aten.div.Tensor(p, q)\n        return (b,)\n",
    );
    assert_twin_refuted(&case, "div's operands swapped through aliases");
}

/// Constants: rank 1 scales by 3 where the spec (and rank 0) scale by 2. Survives.
#[test]
fn a_constant_that_differs_is_another_stage() {
    let (_d, case) = pairs::case(
        "add.Tensor",
        "        s: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(x0, x1)\n        t: \"f32[2, 2]\" = torch.ops.aten.mul.Tensor(s, 2)\n        a: \"f32[2, 2]\" = torch.ops.aten.div.Tensor(t, 2)\n        return (a,)\n",
        "        s: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(y0, y1)\n        t: \"f32[2, 2]\" = torch.ops.aten.mul.Tensor(s, 3)\n        b: \"f32[2, 2]\" = torch.ops.aten.div.Tensor(t, 2)\n        return (b,)\n",
    );
    assert_twin_refuted(&case, "a literal differs");
}

/// Point-to-point on a mesh { pp: 4 } (group `pp`): rank 0 sends `relu(x)` then `exp(x)` to
/// rank 1 with one tag, rank 1 takes them in order and outputs `a = r1 - r2`; ranks 2 and 3
/// do the same for `b` from `y`.
mod same_tag {
    use super::HEADER;

    const SPEC: &str = "    def forward(self, x: \"f32[2, 2]\", y: \"f32[2, 2]\"):\n        x1: \"f32[2, 2]\" = torch.ops.aten.relu.default(x)\n        x2: \"f32[2, 2]\" = torch.ops.aten.exp.default(x)\n        a: \"f32[2, 2]\" = torch.ops.aten.sub.Tensor(x1, x2)\n        y1: \"f32[2, 2]\" = torch.ops.aten.relu.default(y)\n        y2: \"f32[2, 2]\" = torch.ops.aten.exp.default(y)\n        b: \"f32[2, 2]\" = torch.ops.aten.sub.Tensor(y1, y2)\n        return (a, b)\n";

    /// The sender: `relu` then `exp` of `input` sent to pp index `dst`.
    fn sender(input: &str, dst: usize) -> String {
        format!("{HEADER}    def forward(self, {input}: \"f32[2, 2]\"):\n        p: \"f32[2, 2]\" = torch.ops.aten.relu.default({input})\n        q: \"f32[2, 2]\" = torch.ops.aten.exp.default({input})\n        s1: \"f32[2, 2]\" = torch.ops.shardproof_p2p.send.default(p, {dst}, 0, 'pp')\n        s2: \"f32[2, 2]\" = torch.ops.shardproof_p2p.send.default(q, {dst}, 0, 'pp')\n        return (s1, s2)\n")
    }

    /// The receiver: `output = r1 - r2`; with `swapped`, `r2`'s recv is written first (it takes
    /// the first message, `relu`'s).
    fn receiver(output: &str, src: usize, swapped: bool) -> String {
        let r1 = format!("        r1: \"f32[2, 2]\" = torch.ops.shardproof_p2p.recv.default([2, 2], torch.float32, {src}, 0, 'pp')\n");
        let r2 = format!("        r2: \"f32[2, 2]\" = torch.ops.shardproof_p2p.recv.default([2, 2], torch.float32, {src}, 0, 'pp')\n");
        let recvs = if swapped { r2 + &r1 } else { r1 + &r2 };
        format!("{HEADER}    def forward(self):\n{recvs}        {output}: \"f32[2, 2]\" = torch.ops.aten.sub.Tensor(r1, r2)\n        return ({output},)\n")
    }

    /// The case; with `swapped`, rank 3 writes its recvs in the other order.
    pub fn case(swapped: bool) -> (tempfile::TempDir, shardproof_case::Case) {
        let files = vec![
            ("spec.py", format!("{HEADER}{SPEC}")),
            ("sx.py", sender("x", 1)),
            ("ra.py", receiver("a", 0, false)),
            ("sy.py", sender("y", 3)),
            ("rb.py", receiver("b", 2, swapped)),
        ];
        super::load(
            &files,
            "version: 1\nname: same-tag\nspec:\n  graph: spec.py\nimpl:\n  mesh: { pp: 4 }\n  graphs: [sx.py, ra.py, sy.py, rb.py]\n  groups:\n    \"pp\": pp\ninputs:\n  x: { placement: Replicate(), at: { pp: 0 } }\n  y: { placement: Replicate(), at: { pp: 2 } }\noutputs:\n  a: { placement: Replicate(), at: { pp: 1 } }\n  b: { placement: Replicate(), at: { pp: 3 } }\n",
        )
    }
}

/// Which send a recv takes among messages of one tag: rank 3 writes its two recvs in the
/// other order, so `r2` takes `relu(y)`, `r1` takes `exp(y)` and `b = exp(y) - relu(y)`. The
/// graphs are equal in canonical order (a recv is placed where `sub` first reads it, not by
/// its program position) and the peers are blank: only the messages tell the stages apart
/// (deleting the key's messages line makes this test fail). Survives; the recvs in one order
/// are one proof (the control).
#[test]
fn same_tag_recvs_in_another_order_are_another_stage() {
    let (_d, case) = same_tag::case(true);
    assert_twin_refuted(&case, "same-tag recvs written in the other order");
    let (_d, case) = same_tag::case(false);
    assert_eq!(
        reps(&case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)]
    );
    assert_eq!(staged(&case).verdict, Verdict::Proved);
}

/// `add` of two `bool` tensors is a `bool` (`True + True` is `True`: the kernel casts the sum
/// back), where the prover's ring rule keeps 2, and a cast out of `bool` keeps it. The
/// interpreter: spec `[0, 1]`, ranks `[0, 2]`.
#[test]
fn a_sum_of_two_bools_is_a_bool() {
    fills::check_wrong(
        "        s: \"b8[2]\" = torch.ops.aten.add.Tensor(b, b)\n        out: \"f32[2]\" = torch.ops.aten._to_copy.default(s, dtype = torch.float32)\n        return (out,)\n",
        "        bf: \"f32[2]\" = torch.ops.aten._to_copy.default(b, dtype = torch.float32)\n        out: \"f32[2]\" = torch.ops.aten.mul.Tensor(bf, 2)\n        return (out,)\n",
        (&[0.0, 1.0], &[0.0, 2.0]),
        "bool + bool is a bool in the kernel",
    );
}

/// `copy` casts `src` to `self`'s type (`f32` 0.5 into an `int64` is 0), but the prover runs
/// it as data movement on `f64` element indices and keeps the float elements. The spec copies
/// `fl` into `x`'s type and widens it back; the ranks return `fl`. The interpreter: spec
/// `[0, 1]`, ranks `[0.5, 1.5]`. Survives today only because shape reduction refuses `copy`
/// and the full-size paths' run on random inputs finds the difference first.
#[test]
fn a_copy_into_an_integer_is_cast_by_the_kernel() {
    fills::check_wrong(
        "        c: \"i64[2]\" = torch.ops.aten.copy.default(x, fl)\n        out: \"f32[2]\" = torch.ops.aten._to_copy.default(c, dtype = torch.float32)\n        return (out,)\n",
        "        out: \"f32[2]\" = torch.ops.aten.mul.Tensor(fl, 1)\n        return (out,)\n",
        (&[0.0, 1.0], &[0.5, 1.5]),
        "copy of f32 0.5 into int64 is 0 in the kernel",
    );
}

/// `scatter.value` casts its value to `self`'s type (2.5 into an `int64` is 2), where the
/// prover's rule reads the scalar as written: the same cause as `masked_fill`'s fill. The
/// index is a constant zero. The interpreter: spec `[2, 9]`, ranks `[2.5, 9]`. Survives today
/// only because shape reduction refuses this index and the full-size paths' run on random
/// inputs finds the difference first.
#[test]
fn a_fractional_scatter_value_into_an_integer_is_cast_by_the_kernel() {
    fills::check_wrong(
        "        i: \"i64[1]\" = torch.ops.aten.zeros.default([1], dtype = torch.int64)\n        s: \"i64[2]\" = torch.ops.aten.scatter.value(x, 0, i, 2.5)\n        out: \"f32[2]\" = torch.ops.aten._to_copy.default(s, dtype = torch.float32)\n        return (out,)\n",
        "        xf: \"f32[2]\" = torch.ops.aten._to_copy.default(x, dtype = torch.float32)\n        i: \"i64[1]\" = torch.ops.aten.zeros.default([1], dtype = torch.int64)\n        out: \"f32[2]\" = torch.ops.aten.scatter.value(xf, 0, i, 2.5)\n        return (out,)\n",
        (&[2.0, 9.0], &[2.5, 9.0]),
        "scatter's 2.5 into int64 is 2 in the kernel",
    );
}
