//! Fixtures shared by the index-range and narrow-integer tests: a `tp = 2` mesh whose two
//! ranks run one graph on replicated inputs, a table `w: f32[rows, D]` looked up at `T`
//! tokens; the spec's and a rank's runs in the interpreter, and the assertion that no path of
//! the prover proves a case.
#![allow(dead_code)]

use shardproof_interp::RunConfig;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, prove_case_or_full_size, Proof, ProveConfig, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

/// Tokens looked up.
pub const T: usize = 2;
/// The table's row width.
pub const D: usize = 2;

/// The prover at the case's own sizes (no shape reduction).
pub fn full_size() -> ProveConfig {
    ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    }
}

/// A verdict, its message and the second-size check's outcome, for assertion messages.
pub fn report(p: &Proof) -> String {
    format!(
        "{:?} {:?} second={:?}",
        p.verdict,
        p.message,
        p.reduction.as_ref().and_then(|r| r.second_size.as_ref())
    )
}

fn tensor(dtype: DType, shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::new(Meta::new(dtype, shape.to_vec()), data)
}

/// A `tp = 2` case: the spec `spec` (its body after `forward`'s signature), both ranks
/// `rank`; inputs `w: f32[rows, D]` and `tokens: i64[T]`, replicated; output `out`, replicated.
pub fn write_case(
    dir: &Path,
    rows: usize,
    spec_body: &str,
    rank_body: &str,
) -> shardproof_case::Case {
    let head = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, w: \"f32[{rows}, {D}]\", tokens: \"i64[{T}]\"):\n"
    );
    std::fs::write(dir.join("spec.py"), format!("{head}{spec_body}")).unwrap();
    std::fs::write(dir.join("rank.py"), format!("{head}{rank_body}")).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: tokens\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  w: Replicate()\n  tokens: Replicate()\noutputs:\n  out: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The leaves: `w[i, j] = 1 + i·D + j`, the given tokens.
pub fn leaves(rows: usize, tokens: &[f64]) -> BTreeMap<String, Tensor> {
    let w: Vec<f64> = (0..rows * D).map(|i| 1.0 + i as f64).collect();
    BTreeMap::from([
        ("w".to_string(), tensor(DType::F32, &[rows, D], w)),
        (
            "tokens".to_string(),
            tensor(DType::I64, &[tokens.len()], tokens.to_vec()),
        ),
    ])
}

/// The spec's output and rank 0's on `tokens` (a rank's error as `Err`).
pub fn run_both(
    case: &shardproof_case::Case,
    rows: usize,
    tokens: &[f64],
) -> (Vec<f64>, Result<Vec<f64>, String>) {
    let cfg = RunConfig::default();
    let out = |g: &shardproof_ir::Graph| {
        shardproof_interp::run_graph(g, &leaves(rows, tokens), &cfg)
            .map(|env| {
                env.get(g.outputs[0].expect("an output"))
                    .expect("computed")
                    .data
                    .to_vec()
            })
            .map_err(|e| e.to_string())
    };
    let spec = out(&case.spec).expect("the spec runs on valid tokens");
    (spec, out(&case.program.ranks[0]))
}

/// The verdicts at full size, reduced, and through `prove_case_or_full_size` (the CLI's
/// path): none may be `Proved`.
pub fn assert_none_proved(case: &shardproof_case::Case) {
    let full = prove_case(case, &full_size());
    let reduced = prove_case(case, &ProveConfig::default());
    let (cli, _) = prove_case_or_full_size(case, &ProveConfig::default());
    let all = [("full size", &full), ("reduced", &reduced), ("cli", &cli)];
    assert!(
        all.iter().all(|(_, p)| p.verdict != Verdict::Proved),
        "{}",
        all.iter()
            .map(|(k, p)| format!("{k}: {}", report(p)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
