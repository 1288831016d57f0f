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
    assert!(
        all.iter().all(|(_, p)| p.verdict != Verdict::Proved),
        "false proof ({why}):\n{}",
        all.iter()
            .map(|(k, p)| format!("{k}: {}", report(p)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Narrow types: a `tp = 2` mesh whose ranks both run `rank` on replicated `x: i64[2]`,
/// `b: b8[2]` and `m: b8[2]`, output `out: f32[...]` replicated.
mod fills {
    use super::*;

    const SIG: &str =
        "    def forward(self, x: \"i64[2]\", b: \"b8[2]\", m: \"b8[2]\"):\n";

    /// The case from the spec's and the rank's bodies.
    pub fn case(spec: &str, rank: &str) -> (tempfile::TempDir, shardproof_case::Case) {
        let files = vec![
            ("spec.py", format!("{HEADER}{SIG}{spec}")),
            ("rank.py", format!("{HEADER}{SIG}{rank}")),
        ];
        super::load(
            &files,
            "version: 1\nname: fills\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Replicate()\n  b: Replicate()\n  m: Replicate()\noutputs:\n  out: Replicate()\n",
        )
    }

    /// The spec's output and rank 0's, in the interpreter, on `x = [7, 9]`,
    /// `b = [False, True]`, `m = [True, False]`.
    pub fn run_both(case: &shardproof_case::Case) -> (Vec<f64>, Vec<f64>) {
        let leaves = BTreeMap::from([
            ("x".to_string(), tensor(DType::I64, &[2], vec![7.0, 9.0])),
            ("b".to_string(), tensor(DType::Bool, &[2], vec![0.0, 1.0])),
            ("m".to_string(), tensor(DType::Bool, &[2], vec![1.0, 0.0])),
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
