//! Megatron's sequence-parallel layer norm backward (apex's fused kernel): the gradient and
//! input are split along the sequence (dim 0 of [s, b, h]) and the statistics are flattened to
//! one value per row ([s * b]), so rank 0 holds rows 0..s/2 of the one and 0..s*b/2 of the
//! other: the same rows. The weight and bias gradients are partial sums over tp that Megatron
//! all-reduces; without that all-reduce the report must name the unreduced partial sum, not
//! misaligned pieces.

use shardproof_refine::{verify, Options, Verdict};
use std::path::Path;

const S: usize = 4;
const B: usize = 2;
const H: usize = 3;

fn layer_norm_grad(tp: usize, reduce: bool) -> String {
    let s = S / tp;
    let rows = s * B;
    let mut g = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, grad: \"f32[{s}, {B}, {H}]\", mean: \"f32[{rows}]\", invvar: \"f32[{rows}]\", x: \"f32[{s}, {B}, {H}]\", w: \"f32[{H}]\", b: \"f32[{H}]\"):\n"
    );
    let mut line = |l: String| {
        g.push_str("        ");
        g.push_str(&l);
        g.push('\n');
    };
    line("bwd = torch.ops.apex.fused_layer_norm_affine_bwd.default(grad, mean, invvar, x, [3], w, b, 1e-05)".into());
    line(format!("getitem: \"f32[{s}, {B}, {H}]\" = bwd[0]"));
    line(format!("getitem_1: \"f32[{H}]\" = bwd[1]"));
    line(format!("getitem_2: \"f32[{H}]\" = bwd[2];  bwd = None"));
    let mut dw = "getitem_1".to_string();
    if reduce {
        line(format!("all_reduce: \"f32[{H}]\" = torch.ops._c10d_functional.all_reduce.default(getitem_1, 'sum', 'tp')"));
        line(format!("wait_tensor: \"f32[{H}]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)"));
        dw = "wait_tensor".into();
    }
    // The optimizer's second moment of the weight gradient.
    line(format!(
        "mul: \"f32[{H}]\" = torch.ops.aten.mul.Tensor({dw}, {dw})"
    ));
    g.push_str("        return (getitem, mul)\n");
    g
}

const CASE: &str = "version: 1
name: sp-layer-norm-grad
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  grad: Shard(0)
  mean: Shard(0)
  invvar: Shard(0)
  x: Shard(0)
  w: Replicate()
  b: Replicate()
outputs:
  getitem: Shard(0)
  mul: Replicate()
";

fn run(dir: &Path, reduce: bool) -> shardproof_refine::Outcome {
    std::fs::write(dir.join("spec.py"), layer_norm_grad(1, false)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), layer_norm_grad(2, reduce)).unwrap();
    }
    std::fs::write(dir.join("case.yaml"), CASE).unwrap();
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    verify(&case, &Options::default())
}

#[test]
fn sequence_parallel_layer_norm_grad_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), true);
    assert_eq!(out.verdict, Verdict::Verified, "{out:#?}");
}

#[test]
fn unreduced_layer_norm_weight_grad_is_named_a_partial_sum() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), false);
    assert_eq!(out.verdict, Verdict::Refuted, "{out:#?}");
    let f = out.failure.as_ref().unwrap();
    assert_eq!(f.operator, "mul", "{f:#?}");
    let hint = f.hint.as_deref().unwrap_or("");
    assert!(hint.contains("unreduced partial sum"), "{f:#?}");
    assert!(!hint.contains("misaligned"), "{f:#?}");
}
