//! An all-reduce (sum) over a group spanning two mesh dims of pieces that average to the
//! tensor (each rank's mean over its rows of a batch sharded by dp and ep) is 4 times the
//! tensor on every rank; one division by the group's size (dp x ep = 4) makes up for both mesh
//! dims (DeepSeek's `dp=2,tp=2,ep=2` loss). On the base (b82f5da) only a division by one mesh
//! dim's size was followed: the correct program was inconclusive. A division by 2 leaves the
//! loss twice the spec's and must not hold.

mod common;

use shardproof_check::Verdict;

fn verdict(divisor: u32, dir: &str) -> Verdict {
    let graph = |rows: u32, body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, 8]\"):\n{body}        return (loss,)\n"
        )
    };
    let spec = "        p: \"f32[8, 8]\" = torch.ops.aten.mul.Tensor(x, x)\n        loss: \"f32[]\" = torch.ops.aten.mean.default(p)\n";
    let rank = format!(
        "        p: \"f32[2, 8]\" = torch.ops.aten.mul.Tensor(x, x)\n\
         \x20       t: \"f32[]\" = torch.ops.aten.mean.default(p)\n\
         \x20       a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'dp_ep')\n\
         \x20       w: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n\
         \x20       loss: \"f32[]\" = torch.ops.aten.div.Scalar(w, {divisor})\n"
    );
    let mut files = vec![("spec.py".to_string(), graph(8, spec))];
    for r in 0..4 {
        files.push((format!("r{r}.py"), graph(2, &rank)));
    }
    files.push((
        "case.yaml".to_string(),
        "version: 1\nname: group-division\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2, ep: 2 }\n  \
         graphs: [r0.py, r1.py, r2.py, r3.py]\n  groups:\n    \"dp_ep\": [[0, 1, 2, 3]]\ninputs:\n  \
         x: { dp: Shard(0), ep: Shard(0) }\noutputs:\n  loss: Replicate()\n"
            .to_string(),
    ));
    common::hand::check_files(&format!("group-division-{dir}"), &files)
}

#[test]
fn a_division_by_the_groups_size_makes_up_for_both_mesh_dims() {
    assert_eq!(verdict(4, "four"), Verdict::Holds);
}

#[test]
fn a_division_by_one_mesh_dims_size_is_not_held() {
    assert_ne!(verdict(2, "two"), Verdict::Holds);
}
