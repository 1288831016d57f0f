//! Operands whose shapes do not show how they pair with a shard (issue 44, soundness review
//! of the element-wise merge): the merge took a shard as proven whenever *no* operand had a
//! local shape, and the gathers, scatters and losses that dropped their operands' shapes on
//! purpose (their dims do not broadcast) relied on that. Each program below held with exit 0
//! before: a replicated index, table, target or destination beside a shard pairs every rank's
//! rows with the same rows, where the single-device program pairs the whole dim (the global
//! program does not even type-check). Each now claims no shard; the sound forms still hold.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("unpaired.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// A plan on tp=2 with the given inputs and body, its output `y` declared `tp=OUT`.
fn plan(inputs: &str, body: &str, out: &str) -> String {
    format!("mesh tp=2\n{inputs}{body}output y tp={out}\n")
}

/// `gather` along dim 1 with the rows sharded on one operand only: a replicated index of the
/// piece's rows beside row-sharded values (the global gather reads the first rows only), and a
/// replicated table beside a row-sharded index (the global index has more rows than the
/// table). Sharded alike, with as many rows, it is the shard.
#[test]
fn gather_with_one_operand_sharded_along_the_rows_is_never_a_pass() {
    for (inputs, holds) in [
        (
            "input x: f32[8, 3] tp=Shard(0)\ninput i: i64[4, 1] tp=Replicate()\n",
            false,
        ),
        (
            "input x: f32[4, 3] tp=Replicate()\ninput i: i64[8, 1] tp=Shard(0)\n",
            false,
        ),
        (
            // Fewer index rows than the piece: rank 1 reads rows 4..6, the global gather 0..4.
            "input x: f32[8, 3] tp=Shard(0)\ninput i: i64[4, 1] tp=Shard(0)\n",
            false,
        ),
        (
            "input x: f32[8, 3] tp=Shard(0)\ninput i: i64[8, 1] tp=Shard(0)\n",
            true,
        ),
    ] {
        let r = check(&plan(inputs, "y = gather(x, 1, i)\n", "Shard(0)"));
        if holds {
            assert_eq!(r.verdict, Verdict::Holds, "{inputs}: {}", r.render());
        } else {
            assert_ne!(r.verdict, Verdict::Holds, "{inputs}: {}", r.render());
        }
    }
}

/// Sharded values written by `index_put` at replicated column indices: into a replicated
/// destination of the piece's rows (a table without the rank's offset) no shard; into zeros
/// made on each rank (a piece of the zeros of any size), or into the same shard, the shard.
#[test]
fn index_put_of_sharded_values_into_a_replicated_table_is_never_a_pass() {
    let inputs = "input x: f32[4, 3] tp=Replicate()\n\
                  input xs: f32[8, 3] tp=Shard(0)\n\
                  input j: i64[2] tp=Replicate()\n\
                  input v: f32[8, 2] tp=Shard(0)\n";
    for (body, holds) in [
        ("y = index_put(x, [None, j], v)\n", false),
        ("z = zeros([4, 3])\ny = index_put(z, [None, j], v)\n", true),
        ("y = index_put(xs, [None, j], v)\n", true),
    ] {
        let r = check(&plan(inputs, body, "Shard(0)"));
        if holds {
            assert_eq!(r.verdict, Verdict::Holds, "{body}: {}", r.render());
        } else {
            assert_ne!(r.verdict, Verdict::Holds, "{body}: {}", r.render());
        }
    }
}

/// Data parallelism whose labels were not sliced at the rank's offset: row-sharded logits and
/// a replicated target of the piece's rows. The loss (and its backward) is no rank's share of
/// the global loss; with the labels sharded like the logits it is.
#[test]
fn a_loss_with_labels_not_sharded_like_the_logits_is_never_a_pass() {
    for (target, holds) in [("tp=Replicate()", false), ("tp=Shard(0)", true)] {
        let inputs = format!(
            "input x: f32[8, 5] tp=Shard(0)\ninput t: i64[{}] {target}\n",
            if holds { 8 } else { 4 }
        );
        let forward = "l, tw = nll_loss_forward(x, t, None, 1, -100)\n\
                       y = all_reduce(l, avg, tp)\n";
        let r = check(&plan(&inputs, forward, "Replicate()"));
        if holds {
            assert_eq!(r.verdict, Verdict::Holds, "{target}: {}", r.render());
        } else {
            assert_ne!(r.verdict, Verdict::Holds, "{target}: {}", r.render());
        }
        let backward = "g = ones([])\n\
                        w = ones([])\n\
                        y = nll_loss_backward(g, x, t, None, 1, -100, w)\n";
        let r = check(&plan(&inputs, backward, "Shard(0)"));
        if holds {
            assert_eq!(r.verdict, Verdict::Holds, "{target}: {}", r.render());
        } else {
            assert_ne!(r.verdict, Verdict::Holds, "{target}: {}", r.render());
        }
    }
}

const SPEC: &str = r#"class Spec(torch.nn.Module):
    def forward(self, a: "f32[s0, 3]", b: "f32[s1, 3]"):
        y: "f32[s0, 3]" = torch.ops.aten.add.Tensor(a, b);  a = b = None
        return (y,)
"#;

const RANK: &str = r#"class Rank(torch.nn.Module):
    def forward(self, a: "f32[s0, 3]", b: "f32[s1, 3]"):
        y: "f32[s0, 3]" = torch.ops.aten.add.Tensor(a, b);  a = b = None
        return (y,)
"#;

const CASE: &str = r#"version: 1
name: symbolic
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  a: Shard(0)
  b: Replicate()
outputs:
  y: Shard(0)
"#;

/// A graph captured with dynamic shapes (`f32[s0, 3]`) has no local shapes at all: a shard
/// plus a replicated tensor of unknown size pairs in no known way. It was `Shard(0)` (the
/// merge took "no operand has a shape" as "nothing to pair"), and the case held.
#[test]
fn a_shard_beside_operands_of_symbolic_shape_is_never_a_pass() {
    let dir = std::env::temp_dir().join(format!("shardproof-check-sym-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("spec.py"), SPEC).unwrap();
    for r in ["r0.py", "r1.py"] {
        std::fs::write(dir.join(r), RANK).unwrap();
    }
    std::fs::write(dir.join("case.yaml"), CASE).unwrap();
    let loaded = shardproof_case::load_case(&dir.join("case.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
    let case = loaded.unwrap_or_else(|e| panic!("{e}"));
    let r = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}
