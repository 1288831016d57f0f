//! A dp shard of a local batch of 1 merged with cp rows (issue 44, zoo plans 025/051: llama
//! `dp=2,cp=2,tp=2`, `[1, s, h] -> [s, h]` of the spec's `[2, S, h] -> [2 * S, h]`): the
//! factor reading places cp's rows in 2 blocks of the merged dim, one of which the rank's dp
//! coordinate holds (`RowKey::Blocks` with the rank holding fewer blocks than the key), and
//! other mesh dims see those rows as the blocked shard they are. Agreed with the interpreter.
//!
//! Mesh `dp: 2, cp: 2` (rank `2 * dp + cp`). `x` `[2, S, H]` is `Shard(0)` on dp; each rank
//! slices its cp chunks of the sequence and joins them, merges batch and sequence, projects
//! (`mm` with a replicated `w`), splits the merged dim again, squares and sums over the
//! sequence: `out` `[1, H2]`, `Shard(0)` on dp and `Partial(sum)` on cp. Planted: a chunk
//! twice (a row of another rank's), and every dp coordinate reading batch 0 of a dp-replicated
//! `x` (the size-1 batch dim not the rank's shard).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, RunConfig};
use shardproof_ir::ValueId;
use std::collections::BTreeMap;

mod common;
use common::chunks::{chunks, megatron, Table};
use common::values::{close, random, ty};

const N: usize = 2;
const H: usize = 3;
const H2: usize = 2;

/// The lines from the merged `m` `[b * l, H]` to `out` `[b, H2]`.
fn tail(b: usize, l: usize) -> Vec<String> {
    vec![
        format!("y: {} = torch.ops.aten.mm.default(m, w)", ty(&[b * l, H2])),
        format!(
            "z: {} = torch.ops.aten.view.default(y, [{b}, {l}, {H2}])",
            ty(&[b, l, H2])
        ),
        format!("q: {} = torch.ops.aten.mul.Tensor(z, z)", ty(&[b, l, H2])),
        format!(
            "out: {} = torch.ops.aten.sum.dim_IntList(q, [1])",
            ty(&[b, H2])
        ),
    ]
}

fn spec_graph(s: usize) -> String {
    let mut body = vec![
        format!("xc: {} = torch.ops.aten.clone.default(x)", ty(&[N, s, H])),
        format!(
            "m: {} = torch.ops.aten.view.default(xc, [{}, {H}])",
            ty(&[N * s, H]),
            N * s
        ),
    ];
    body.extend(tail(N, s));
    let params = [
        format!("x: {}", ty(&[N, s, H])),
        format!("w: {}", ty(&[H, H2])),
    ];
    common::hand::graph_module(&params, &body)
}

/// A rank's graph: its chunks `segs` of its batch (`whole_x`: `x` is the whole `[N, s, H]`
/// and the rank takes batch 0, the planted bug).
fn rank_graph(s: usize, segs: &[(usize, usize)], whole_x: bool) -> String {
    let l: usize = segs.iter().map(|(a, e)| e - a).sum();
    let mut body = Vec::new();
    let src = if whole_x {
        body.push(format!(
            "xb: {} = torch.ops.aten.slice.Tensor(x, 0, 0, 1)",
            ty(&[1, s, H])
        ));
        "xb"
    } else {
        "x"
    };
    let mut parts = Vec::new();
    for (i, &(a, e)) in segs.iter().enumerate() {
        body.push(format!(
            "p{i}: {} = torch.ops.aten.slice.Tensor({src}, 1, {a}, {e})",
            ty(&[1, e - a, H])
        ));
        parts.push(format!("p{i}"));
    }
    body.push(format!(
        "xc: {} = torch.ops.aten.cat.default([{}], 1)",
        ty(&[1, l, H]),
        parts.join(", ")
    ));
    body.push(format!(
        "m: {} = torch.ops.aten.view.default(xc, [{l}, {H}])",
        ty(&[l, H])
    ));
    body.extend(tail(1, l));
    let x = if whole_x {
        ty(&[N, s, H])
    } else {
        ty(&[1, s, H])
    };
    let params = [format!("x: {x}"), format!("w: {}", ty(&[H, H2]))];
    common::hand::graph_module(&params, &body)
}

/// The verdict, and whether the ranks' outputs (summed over cp, joined over dp) are the spec's.
fn instance(s: usize, table: &Table, whole_x: bool, seed: u64) -> (Verdict, bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec_graph(s)).unwrap();
    for r in 0..N * N {
        let segs = &table[r % N];
        std::fs::write(
            dir.path().join(format!("r{r}.py")),
            rank_graph(s, segs, whole_x),
        )
        .unwrap();
    }
    let x_dp = if whole_x { "Replicate()" } else { "Shard(0)" };
    let yaml = format!(
        "version: 1\nname: dp-cp-rows\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: {N}, cp: {N} }}\n  graphs: [r0.py, r1.py, r2.py, r3.py]\ninputs:\n  x: {{ dp: {x_dp}, cp: Replicate() }}\n  w: {{ dp: Replicate(), cp: Replicate() }}\noutputs:\n  out: {{ dp: Shard(0), cp: Partial(sum) }}\n"
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(&[N, s, H], &mut rng);
    let w = random(&[H, H2], &mut rng);
    let out_of = |g: &shardproof_ir::Graph, x: &shardproof_ops::Tensor| {
        let leaves: BTreeMap<String, shardproof_ops::Tensor> =
            [("x".to_string(), x.clone()), ("w".to_string(), w.clone())].into();
        let env = run_graph(g, &leaves, &RunConfig::default()).expect("runs");
        let at = g.nodes.iter().position(|n| n.name == "out").unwrap();
        env.get(ValueId::new(at, 0)).unwrap().data.to_vec()
    };
    let spec_out = out_of(&case.spec, &x);
    let xs = x.data.to_vec();
    let per_batch = s * H;
    let mut got = Vec::new();
    for dp in 0..N {
        let mine = if whole_x {
            x.clone()
        } else {
            let mut t = random(&[1, s, H], &mut rng);
            t.data = xs[dp * per_batch..(dp + 1) * per_batch].to_vec().into();
            t
        };
        let mut sum = vec![0.0; H2];
        for cp in 0..N {
            let o = out_of(&case.program.ranks[N * dp + cp], &mine);
            sum.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        }
        got.extend(sum);
    }
    (report.verdict, close(&got, &spec_out), report.render())
}

#[test]
fn a_dp_shard_of_one_batch_merged_with_cp_rows_holds_and_agrees_with_the_interpreter() {
    for c in [1, 2] {
        let s = 2 * N * c;
        let (verdict, right, report) = instance(s, &megatron(N, c), false, c as u64);
        assert!(right, "c {c}: the correct program is wrong when run");
        assert_eq!(verdict, Verdict::Holds, "c {c}\n{report}");
    }
}

#[test]
fn a_chunk_twice_beside_a_dp_shard_of_one_batch_never_holds() {
    let table = chunks(1, &[vec![0, 3], vec![0, 2]]);
    let (verdict, right, report) = instance(4, &table, false, 7);
    assert!(!right, "not wrong when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn every_dp_coordinate_reading_batch_0_never_holds() {
    let (verdict, right, report) = instance(4, &megatron(N, 1), true, 9);
    assert!(!right, "not wrong when run");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}
