//! A partial sum whose reduction lies beyond the diagnosis's bounded search: each rank's
//! row-parallel product goes through a long chain of reshapes before its all-reduce. The
//! implementation is correct (`tanh` of the reduced product, as the spec computes), but
//! inference stops at `tanh` (exploration does not follow the whole chain), where the input is
//! a rank sum. The search for a collective that reduces it is cut off at its bounds, so the
//! diagnosis must not say "never reduces it" (that hint would refute a correct plan): it says
//! the search was cut off, and the verdict is inconclusive.

use shardproof_refine::{verify, Options, Verdict};
use std::path::Path;

/// The spec's and the ranks' program: `tanh(mm(x, w))`; the ranks' `x: f32[4, 4]` and `w:
/// f32[4, 4]` are the column and row shards of the spec's `f32[4, 8]` and `f32[8, 4]`, and
/// their product is reshaped `views` times (flattened and back, alternately) before it is
/// all-reduced.
fn program(rank: bool, views: usize) -> String {
    let k = if rank { 4 } else { 8 };
    let mut g = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, {k}]\", w: \"f32[{k}, 4]\"):\n"
    );
    let mut line = |l: String| {
        g.push_str("        ");
        g.push_str(&l);
        g.push('\n');
    };
    line("mm: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, w)".into());
    let mut last = "mm".to_string();
    if rank {
        for i in 0..views {
            let (shape, size) = if i % 2 == 0 {
                ("f32[16]", "[16]")
            } else {
                ("f32[4, 4]", "[4, 4]")
            };
            line(format!(
                "view_{i}: \"{shape}\" = torch.ops.aten.view.default({last}, {size})"
            ));
            last = format!("view_{i}");
        }
        let shape = if views % 2 == 1 {
            "f32[16]"
        } else {
            "f32[4, 4]"
        };
        line(format!("all_reduce: \"{shape}\" = torch.ops._c10d_functional.all_reduce.default({last}, 'sum', 'tp')"));
        line(format!(
            "wait_tensor: \"{shape}\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)"
        ));
        line("reduced: \"f32[4, 4]\" = torch.ops.aten.view.default(wait_tensor, [4, 4])".into());
        last = "reduced".into();
    }
    line(format!(
        "tanh: \"f32[4, 4]\" = torch.ops.aten.tanh.default({last})"
    ));
    g.push_str("        return (tanh,)\n");
    g
}

const CASE: &str = "version: 1
name: long-reduction-path
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  x: Shard(1)
  w: Shard(0)
outputs:
  tanh: Replicate()
";

fn run(dir: &Path, views: usize) -> shardproof_refine::Outcome {
    std::fs::write(dir.join("spec.py"), program(false, 0)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), program(true, views)).unwrap();
    }
    std::fs::write(dir.join("case.yaml"), CASE).unwrap();
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    verify(&case, &Options::default())
}

/// The same plan with a short chain verifies: the chain itself is no bug.
#[test]
fn a_short_chain_before_the_all_reduce_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), 2);
    assert_eq!(out.verdict, Verdict::Verified, "{out:#?}");
}

/// Past the search's bounds (1024 steps), nothing names the unreduced sum as the cause.
#[test]
fn a_reduction_beyond_the_search_bound_is_not_named_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), 1100);
    assert_ne!(out.verdict, Verdict::Refuted, "{out:#?}");
    let f = out.failure.as_ref().expect("a located stop");
    assert_eq!(f.operator, "tanh", "{f:#?}");
    assert!(
        !f.hint.as_deref().unwrap_or("").contains("never reduces"),
        "{f:#?}"
    );
    assert!(
        f.not_computed
            .as_deref()
            .is_some_and(|n| n.contains("cut off")),
        "{f:#?}"
    );
}
