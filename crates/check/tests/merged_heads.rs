//! Heads merged with a dp-sharded batch of 1 and split back by a view the spec has under no
//! name or skeleton of its own (issue 44, llama `dp=2,cp=2,tp=2`: the ring attention's output
//! `[b*h, s, d] -> [b, h, s, d]`, computed on the ranks by a concatenation the spec does not
//! have). The spec's view is found by the global input shape the placements imply
//! (`SpecViews::by_global_input`); the factor reading then places each mesh dim. Agreed with
//! the interpreter.
//!
//! Mesh `dp: 2, tp: 2` (rank `2 * dp + tp`). `x` `[2, 4, S, D]` is `Shard(0)` on dp and
//! `Shard(1)` on tp. Each side merges batch and heads (`m`, the spec's name), rotates the
//! halves of the head dim (slices and a concatenation of the blocked shard), adds the rotation
//! to `m` (the ranks subtract its negation: another skeleton), splits the merged dim back
//! and squares it. The spec has a second view that the rank's view could be by its local
//! shapes (`[4, S, D] -> [2, 2, S, D]`), so no skeleton match settles it. Planted: the size-1
//! batch dim not the rank's dp shard (every dp coordinate takes batch 0 of a dp-replicated
//! `x`). A view that moves a size-1 dim elsewhere moves no data, so it is no planted bug.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::values::{close, random, ty};

const N: usize = 2;
const B: usize = 2;
const HEADS: usize = 4;
const S: usize = 2;
const D: usize = 4;

/// The merge, the rotation and its sum, of a side with `b` batches and `h` heads, the sum
/// named `sum_name` (`negated`: the ranks' form, `m - neg(rot)`, another skeleton).
fn head(b: usize, h: usize, negated: bool, sum_name: &str) -> Vec<String> {
    let bh = b * h;
    let half = D / 2;
    let mut lines = vec![
        format!(
            "m: {} = torch.ops.aten.view.default(x, [{bh}, {S}, {D}])",
            ty(&[bh, S, D])
        ),
        format!(
            "lo: {} = torch.ops.aten.slice.Tensor(m, 2, 0, {half})",
            ty(&[bh, S, half])
        ),
        format!(
            "hi: {} = torch.ops.aten.slice.Tensor(m, 2, {half}, {D})",
            ty(&[bh, S, half])
        ),
        format!(
            "nh: {} = torch.ops.aten.neg.default(hi)",
            ty(&[bh, S, half])
        ),
        format!(
            "rot: {} = torch.ops.aten.cat.default([nh, lo], 2)",
            ty(&[bh, S, D])
        ),
    ];
    if negated {
        lines.push(format!(
            "nrot: {} = torch.ops.aten.neg.default(rot)",
            ty(&[bh, S, D])
        ));
        lines.push(format!(
            "{sum_name}: {} = torch.ops.aten.sub.Tensor(m, nrot)",
            ty(&[bh, S, D])
        ));
    } else {
        lines.push(format!(
            "{sum_name}: {} = torch.ops.aten.add.Tensor(m, rot)",
            ty(&[bh, S, D])
        ));
    }
    lines
}

fn spec_graph() -> String {
    let mut body = head(B, HEADS, false, "e");
    body.push(format!(
        "y: {} = torch.ops.aten.view.default(e, [{B}, {HEADS}, {S}, {D}])",
        ty(&[B, HEADS, S, D])
    ));
    body.push(format!(
        "out: {} = torch.ops.aten.mul.Tensor(y, y)",
        ty(&[B, HEADS, S, D])
    ));
    // Another view whose shapes could hold the ranks' local ones (unused).
    let q = B * HEADS / 2;
    body.push(format!(
        "part: {} = torch.ops.aten.slice.Tensor(m, 0, 0, {q})",
        ty(&[q, S, D])
    ));
    body.push(format!(
        "other: {} = torch.ops.aten.view.default(part, [2, {}, {S}, {D}])",
        ty(&[2, q / 2, S, D]),
        q / 2
    ));
    let params = [format!("x: {}", ty(&[B, HEADS, S, D]))];
    common::hand::graph_module(&params, &body)
}

/// A rank's graph (`whole_x`: `x` is the whole batch and the rank takes batch 0).
fn rank_graph(whole_x: bool) -> String {
    let h = HEADS / N;
    let mut body = Vec::new();
    if whole_x {
        body.push(format!(
            "xb: {} = torch.ops.aten.slice.Tensor(x, 0, 0, 1)",
            ty(&[1, h, S, D])
        ));
    }
    body.extend(head(1, h, true, "e2"));
    if whole_x {
        body[1] = body[1].replace("view.default(x,", "view.default(xb,");
    }
    let shape = [1, h, S, D];
    body.push(format!(
        "yr: {} = torch.ops.aten.view.default(e2, {shape:?})",
        ty(&shape)
    ));
    body.push(format!(
        "out: {} = torch.ops.aten.mul.Tensor(yr, yr)",
        ty(&shape)
    ));
    let b = if whole_x { B } else { 1 };
    common::hand::graph_module(&[format!("x: {}", ty(&[b, h, S, D]))], &body)
}

/// The verdict, whether the ranks' outputs (joined over dp on dim 0 and over tp on dim 1)
/// are the spec's, and the report.
fn instance(whole_x: bool, seed: u64) -> (Verdict, bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec_graph()).unwrap();
    for r in 0..N * N {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank_graph(whole_x)).unwrap();
    }
    let x_dp = if whole_x { "Replicate()" } else { "Shard(0)" };
    let yaml = format!(
        "version: 1\nname: merged-heads\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: {N}, tp: {N} }}\n  graphs: [r0.py, r1.py, r2.py, r3.py]\ninputs:\n  x: {{ dp: {x_dp}, tp: Shard(1) }}\noutputs:\n  out: {{ dp: Shard(0), tp: Shard(1) }}\n"
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(&[B, HEADS, S, D], &mut rng);
    let out_of = |g: &shardproof_ir::Graph, x: Tensor| {
        let leaves: BTreeMap<String, Tensor> = [("x".to_string(), x)].into();
        let env = run_graph(g, &leaves, &RunConfig::default()).expect("runs");
        let at = g.nodes.iter().position(|n| n.name == "out").unwrap();
        env.get(ValueId::new(at, 0)).unwrap().data.to_vec()
    };
    let spec_out = out_of(&case.spec, x.clone());
    let h = HEADS / N;
    let block = S * D;
    // The spec's layout [B, HEADS, S*D]: rank (dp, tp) holds batch dp, heads tp*h..(tp+1)*h.
    let mut got = vec![f64::NAN; spec_out.len()];
    let mut fits = true;
    for dp in 0..N {
        for tp in 0..N {
            // Rank (dp, tp)'s `x`: its heads of its batch, or of every batch (`whole_x`).
            let batches: Vec<usize> = if whole_x { (0..B).collect() } else { vec![dp] };
            let mut mine = random(&[batches.len(), h, S, D], &mut rng);
            mine.data = batches
                .iter()
                .flat_map(|&b| {
                    let start = (b * HEADS + tp * h) * block;
                    x.data[start..start + h * block].to_vec()
                })
                .collect::<Vec<f64>>()
                .into();
            let o = out_of(&case.program.ranks[N * dp + tp], mine);
            fits &= o.len() == h * block;
            // The rank's output read in the declared layout: batch dp, heads tp*h.. of the
            // spec's.
            let at = (dp * HEADS + tp * h) * block;
            for (k, v) in o.iter().enumerate() {
                if let Some(g) = got.get_mut(at + k) {
                    *g = *v;
                }
            }
        }
    }
    let right = fits && close(&got, &spec_out);
    (report.verdict, right, report.render())
}

#[test]
fn heads_merged_with_a_batch_of_one_split_back_hold_and_agree_with_the_interpreter() {
    let (verdict, right, report) = instance(false, 1);
    assert!(right, "the correct program is wrong when run");
    assert_eq!(verdict, Verdict::Holds, "{report}");
}

/// Planted: every dp coordinate takes batch 0 (the size-1 batch dim not its dp shard).
#[test]
fn every_dp_coordinate_reading_batch_0_never_holds() {
    let (verdict, right, report) = instance(true, 2);
    assert!(!right, "not wrong when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}
