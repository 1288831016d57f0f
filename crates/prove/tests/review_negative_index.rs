//! Adversarial review: an integer input read by advanced indexing (`aten.index.Tensor`),
//! which (unlike `gather`, `index_select` and `embedding`) accepts negative indices and wraps
//! them: a valid input outside the `[0, n)` that `index_bound_known` would range a symbol
//! over. A rank clamping negative indices to 0 is wrong on them (the interpreter shows it);
//! the prover has no symbolic rule for a symbolic `index` and stays inconclusive, never
//! proving it. (Should `index` get a symbolic rule, its indices must range over `[-n, n)`.)

use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

fn spec() -> &'static str {
    r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[6, 2]", idx: "i64[3]"):
        y: "f32[3, 2]" = torch.ops.aten.index.Tensor(x, [idx])
        return (y,)
"#
}

fn clamped() -> &'static str {
    r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[6, 2]", idx: "i64[3]"):
        lt: "b8[3]" = torch.ops.aten.lt.Scalar(idx, 0)
        masked_fill: "i64[3]" = torch.ops.aten.masked_fill.Scalar(idx, lt, 0)
        y: "f32[3, 2]" = torch.ops.aten.index.Tensor(x, [masked_fill])
        return (y,)
"#
}

fn write(dir: &Path, rank: &str) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec()).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    std::fs::write(dir.join("r1.py"), rank).unwrap();
    std::fs::write(dir.join("case.yaml"), "version: 1\nname: idx\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  idx: Replicate()\noutputs:\n  y: Replicate()\n").unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

#[test]
fn a_rank_clamping_negative_indices_is_never_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write(dir.path(), clamped());
    let cfg = shardproof_interp::RunConfig::default();
    let leaves = BTreeMap::from([
        (
            "x".to_string(),
            Tensor::new(
                Meta::new(DType::F32, vec![6, 2]),
                (0..12).map(f64::from).collect(),
            ),
        ),
        (
            "idx".to_string(),
            Tensor::new(Meta::new(DType::I64, vec![3]), vec![-1.0, 2.0, 0.0]),
        ),
    ]);
    let y = |g: &shardproof_ir::Graph| {
        let env = shardproof_interp::run_graph(g, &leaves, &cfg).unwrap();
        env.get(g.find("y").unwrap()).unwrap().data[..2].to_vec()
    };
    // Index -1 is the last row in the spec, row 0 on the rank.
    assert_eq!(y(&case.spec), vec![10.0, 11.0]);
    assert_eq!(y(&case.program.ranks[0]), vec![0.0, 1.0]);
    for reduce in [true, false] {
        let cfg = ProveConfig {
            reduce,
            ..ProveConfig::default()
        };
        assert_ne!(prove_case(&case, &cfg).verdict, Verdict::Proved, "{reduce}");
    }
}
