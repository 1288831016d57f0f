//! A row-parallel linear whose replicated bias is divided by the tensor-parallel size before
//! the all-reduce (what DTensor's `RowwiseParallel` captures: the replicated bias becomes one
//! rank's share of a `Partial(sum)`) is well-typed; the same bias undivided is counted once
//! per rank and is a finding.

use shardproof_check::{check_case, Verdict};

const SPEC: &str = r#"class Spec(torch.nn.Module):
    def forward(self, w: "f32[4, 8]", b: "f32[4]", x: "f32[3, 8]"):
        t: "f32[8, 4]" = torch.ops.aten.t.default(w);  w = None
        out: "f32[3, 4]" = torch.ops.aten.addmm.default(b, x, t);  b = x = t = None
        return (out,)
"#;

fn rank(bias: &str) -> String {
    format!(
        r#"class Rank(torch.nn.Module):
    def forward(self, w: "f32[4, 4]", b: "f32[4]", x: "f32[3, 4]"):
        t: "f32[4, 4]" = torch.ops.aten.t.default(w);  w = None
{bias}        addmm: "f32[3, 4]" = torch.ops.aten.addmm.default(share, x, t);  share = x = t = None
        all_reduce: "f32[3, 4]" = torch.ops._c10d_functional.all_reduce.default(addmm, 'sum', '0');  addmm = None
        out: "f32[3, 4]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        return (out,)
"#
    )
}

const CASE: &str = r#"version: 1
name: scaled-bias
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
  groups:
    "0": tp
inputs:
  w: Shard(1)
  b: Replicate()
  x: Shard(1)
outputs:
  out: Replicate()
"#;

fn verdict(bias: &str, dir: &str) -> Verdict {
    let dir = std::env::temp_dir().join(format!("shardproof-check-{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("spec.py"), SPEC).unwrap();
    for r in ["r0.py", "r1.py"] {
        std::fs::write(dir.join(r), rank(bias)).unwrap();
    }
    std::fs::write(dir.join("case.yaml"), CASE).unwrap();
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    eprintln!("{}", report.render());
    let _ = std::fs::remove_dir_all(&dir);
    report.verdict
}

#[test]
fn a_bias_divided_by_the_tp_size_before_the_all_reduce_holds() {
    let share = "        share: \"f32[4]\" = torch.ops.aten.div.Tensor(b, 2);  b = None\n";
    assert_eq!(verdict(share, "div"), Verdict::Holds);
}

#[test]
fn a_bias_divided_by_another_number_is_counted_wrongly() {
    let share = "        share: \"f32[4]\" = torch.ops.aten.div.Tensor(b, 3);  b = None\n";
    assert_eq!(verdict(share, "div3"), Verdict::Violated);
}

#[test]
fn an_undivided_bias_is_counted_once_per_rank() {
    let share = "        share: \"f32[4]\" = torch.ops.aten.clone.default(b);  b = None\n";
    assert_eq!(verdict(share, "clone"), Verdict::Violated);
}
