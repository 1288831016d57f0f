//! Regression tests: absurd sizes are refused with an error, never a panic or an abort.

use shardproof_interp::{run_graph, InterpErrorKind, RunConfig};
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn graph(text: &str) -> shardproof_ir::Graph {
    shardproof_import::parse_fx(text, Path::new("big.py"))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph
}

fn refused(text: &str, leaves: &[(&str, Tensor)]) -> String {
    let g = graph(text);
    let leaves: BTreeMap<String, Tensor> = leaves
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let e = run_graph(&g, &leaves, &RunConfig::default()).expect_err("expected a refusal");
    assert_eq!(e.kind, InterpErrorKind::Invalid, "{}", e.message);
    e.message
}

#[test]
fn full_of_2_pow_63_minus_1_is_refused() {
    let m = refused(
        r#"
class GraphModule(torch.nn.Module):
    def forward(self):
        full: "f32[9223372036854775807]" = torch.ops.aten.full.default([9223372036854775807], 1.0, dtype = torch.float32)
        return (full,)
"#,
        &[],
    );
    assert!(
        m.starts_with("big.py:4: node `full` (aten.full.default)"),
        "{m}"
    );
    assert!(m.contains("too large"), "{m}");
}

#[test]
fn expand_to_2_pow_63_minus_1_is_refused() {
    let m = refused(
        r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1]"):
        expand: "f32[9223372036854775807]" = torch.ops.aten.expand.default(x, [9223372036854775807])
        return (expand,)
"#,
        &[("x", Tensor::new(Meta::new(DType::F32, vec![1]), vec![1.0]))],
    );
    assert!(m.contains("node `expand` (aten.expand.default)"), "{m}");
    assert!(m.contains("too large"), "{m}");
}

#[test]
fn a_matmul_input_of_2_pow_62_by_16_is_refused() {
    // What a caller building inputs from an overflowing shape would hand over: a tensor whose
    // element count wrapped to 0.
    let x = Tensor {
        meta: Meta::new(DType::F32, vec![1 << 62, 16]),
        data: Arc::new(Vec::new()),
    };
    let w = Tensor::new(Meta::new(DType::F32, vec![16, 2]), vec![0.5; 32]);
    let text = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4611686018427387904, 16]", w: "f32[16, 2]"):
        matmul: "f32[4611686018427387904, 2]" = torch.ops.aten.matmul.default(x, w)
        return (matmul,)
"#;
    let m = refused(text, &[("x", x), ("w", w.clone())]);
    assert!(m.contains("value `x`") && m.contains("overflows"), "{m}");
    // A tensor whose data disagrees with its shape is refused the same way.
    let short = Tensor {
        meta: Meta::new(DType::F32, vec![4, 16]),
        data: Arc::new(vec![0.0; 5]),
    };
    let text = text.replace("4611686018427387904", "4");
    let m = refused(&text, &[("x", short), ("w", w)]);
    assert!(m.contains("holding 5 elements instead of 64"), "{m}");
}

#[test]
fn a_huge_but_countable_result_is_refused_before_allocating() {
    // 2^59 elements (4 EiB of f64): no overflow, but no machine can hold it.
    let m = refused(
        r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1, 1]"):
        expand: "f32[1099511627776, 524288]" = torch.ops.aten.expand.default(x, [1099511627776, 524288])
        return (expand,)
"#,
        &[(
            "x",
            Tensor::new(Meta::new(DType::F32, vec![1, 1]), vec![1.0]),
        )],
    );
    assert!(m.contains("cannot allocate"), "{m}");
}
