//! The MoE combine of a SwitchMLP under tensor parallelism: each expert's output (a partial sum
//! over tp, its second linear row-parallel) is added into a zero buffer at its tokens' rows,
//! by an accumulating `index_put` or a `scatter_add`, and the buffer is all-reduced once
//! before the residual add.
//!
//! Without the all-reduce the residual is `x + sum_r(partial_r)`, clean but not what the next
//! layer reads: relations stop at the residual add, on the unreduced sum.

use shardproof_refine::{verify, Options, Verdict};
use std::path::Path;

/// Tokens, hidden size, expert width (at tp=1), tokens per expert.
const N: usize = 6;
const H: usize = 4;
const F: usize = 8;
const K: usize = 3;

/// How the experts' outputs are added into the buffer.
#[derive(Clone, Copy)]
enum Combine {
    IndexPut,
    ScatterAdd,
}

/// A two-expert SwitchMLP at tensor parallelism `tp`; `reduce` all-reduces the combined
/// buffer (the ranks' programs; the spec never reduces).
fn switch_mlp(tp: usize, combine: Combine, reduce: bool) -> String {
    let f = F / tp;
    let mut g = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{N}, {H}]\", idx_0: \"i64[{K}]\", idx_1: \"i64[{K}]\", w1_0: \"f32[{f}, {H}]\", w2_0: \"f32[{H}, {f}]\", w1_1: \"f32[{f}, {H}]\", w2_1: \"f32[{H}, {f}]\"):\n"
    );
    let mut line = |l: String| {
        g.push_str("        ");
        g.push_str(&l);
        g.push('\n');
    };
    line(format!("zeros: \"f32[{N}, {H}]\" = torch.ops.aten.zeros.default([{N}, {H}], dtype = torch.float32, device = device(type='cpu'), pin_memory = False)"));
    let mut acc = "zeros".to_string();
    for e in 0..2 {
        line(format!(
            "index_{e}: \"f32[{K}, {H}]\" = torch.ops.aten.index.Tensor(x, [idx_{e}])"
        ));
        line(format!(
            "t_{e}: \"f32[{H}, {f}]\" = torch.ops.aten.t.default(w1_{e})"
        ));
        line(format!(
            "mm_{e}: \"f32[{K}, {f}]\" = torch.ops.aten.mm.default(index_{e}, t_{e})"
        ));
        line(format!(
            "relu_{e}: \"f32[{K}, {f}]\" = torch.ops.aten.relu.default(mm_{e})"
        ));
        line(format!(
            "t2_{e}: \"f32[{f}, {H}]\" = torch.ops.aten.t.default(w2_{e})"
        ));
        line(format!(
            "out_{e}: \"f32[{K}, {H}]\" = torch.ops.aten.mm.default(relu_{e}, t2_{e})"
        ));
        let next = format!("combined_{e}");
        match combine {
            Combine::IndexPut => line(format!("{next}: \"f32[{N}, {H}]\" = torch.ops.aten.index_put.default({acc}, [idx_{e}], out_{e}, True)")),
            Combine::ScatterAdd => {
                line(format!("view_{e}: \"i64[{K}, 1]\" = torch.ops.aten.view.default(idx_{e}, [{K}, 1])"));
                line(format!("expand_{e}: \"i64[{K}, {H}]\" = torch.ops.aten.expand.default(view_{e}, [{K}, {H}])"));
                line(format!("{next}: \"f32[{N}, {H}]\" = torch.ops.aten.scatter_add.default({acc}, 0, expand_{e}, out_{e})"));
            }
        }
        acc = next;
    }
    if reduce {
        line(format!("all_reduce: \"f32[{N}, {H}]\" = torch.ops._c10d_functional.all_reduce.default({acc}, 'sum', 'tp')"));
        line(format!("wait_tensor: \"f32[{N}, {H}]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)"));
        acc = "wait_tensor".into();
    }
    // The residual connection around the MoE layer, and the next layer's first operator.
    line(format!(
        "residual: \"f32[{N}, {H}]\" = torch.ops.aten.add.Tensor(x, {acc})"
    ));
    line(format!(
        "output: \"f32[{N}, {H}]\" = torch.ops.aten.tanh.default(residual)"
    ));
    g.push_str("        return (output,)\n");
    g
}

const CASE: &str = "version: 1
name: switch-mlp
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  x: Replicate()
  idx_0: Replicate()
  idx_1: Replicate()
  w1_0: Shard(0)
  w2_0: Shard(1)
  w1_1: Shard(0)
  w2_1: Shard(1)
outputs:
  output: Replicate()
";

fn run(dir: &Path, combine: Combine, reduce: bool) -> shardproof_refine::Outcome {
    std::fs::write(dir.join("spec.py"), switch_mlp(1, combine, false)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), switch_mlp(2, combine, reduce)).unwrap();
    }
    std::fs::write(dir.join("case.yaml"), CASE).unwrap();
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    verify(&case, &Options::default())
}

#[test]
fn switch_mlp_combines_verify() {
    for combine in [Combine::IndexPut, Combine::ScatterAdd] {
        let dir = tempfile::tempdir().unwrap();
        let out = run(dir.path(), combine, true);
        assert_eq!(out.verdict, Verdict::Verified, "{out:#?}");
    }
}

#[test]
fn switch_mlp_without_the_all_reduce_is_refuted() {
    for combine in [Combine::IndexPut, Combine::ScatterAdd] {
        let dir = tempfile::tempdir().unwrap();
        let out = run(dir.path(), combine, false);
        assert_eq!(out.verdict, Verdict::Refuted, "{out:#?}");
        let f = out.failure.as_ref().unwrap();
        // Where the reduced sum is first needed: the residual add.
        assert_eq!(f.operator, "residual", "{f:#?}");
        assert!(
            f.hint
                .as_deref()
                .unwrap_or("")
                .contains("unreduced partial sum"),
            "{f:#?}"
        );
    }
}
