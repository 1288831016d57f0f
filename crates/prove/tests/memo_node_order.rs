//! The memo up to node order: a stage keyed by its graphs' dataflow and its schedule's pairing,
//! not by the order its nodes are written in nor by the group index a send or recv names its
//! peer with (see docs/prove/stages.md, "Memo up to node order").
//!
//! On a 1F1B pipeline every pipeline stage interleaves its microbatches otherwise, and its
//! sends and recvs name other `pp` indices: those stages are one proof. Stages whose
//! collectives meet otherwise, or whose recvs take another rank's message, are not, and each
//! such pair below has its second stage wrong: it must not be proved by the first's proof.

use shardproof_prove::stage::{plan_with, prove_staged_with};
use shardproof_prove::{PlanOptions, ProveConfig, Verdict};

/// Stages apart: one per expected output.
fn apart() -> PlanOptions {
    PlanOptions {
        outputs_apart: true,
        ..PlanOptions::default()
    }
}

/// The plan's stages as (target, representative), with unreduced and with reduced keys (they
/// must agree).
fn reps(case: &shardproof_case::Case) -> Vec<(String, usize)> {
    let keyed = |reduce: bool| -> Vec<(String, usize)> {
        let plan = plan_with(case, reduce, &apart()).unwrap();
        plan.stages
            .iter()
            .map(|s| (s.target.clone(), s.rep))
            .collect()
    };
    let unreduced = keyed(false);
    assert_eq!(
        unreduced,
        keyed(true),
        "reduced and unreduced keys disagree"
    );
    unreduced
}

/// The staged proof of the case, one stage per output.
fn staged(case: &shardproof_case::Case) -> shardproof_prove::stage::StagedProof {
    prove_staged_with(case, &ProveConfig::default(), 1, &apart())
}

/// Writes `files` (name, text) and `case_yaml` into a temporary directory and loads the case.
fn load(files: &[(&str, String)], case_yaml: &str) -> (tempfile::TempDir, shardproof_case::Case) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::write(dir.path().join("case.yaml"), case_yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    (dir, case)
}

const HEADER: &str = "class GraphModule(torch.nn.Module):\n";

/// Two microbatch-like halves gathered over `tp`: `a = cat([relu(x0), exp(x1)])` on pipeline
/// stage 0 (ranks 0, 1), `b` the same of `y0`, `y1` on stage 1 (ranks 2, 3).
mod gathers {
    use super::HEADER;

    const SPEC: &str = "    def forward(self, x0: \"f32[4, 2]\", x1: \"f32[4, 2]\", y0: \"f32[4, 2]\", y1: \"f32[4, 2]\"):\n        a0: \"f32[4, 2]\" = torch.ops.aten.relu.default(x0)\n        a1: \"f32[4, 2]\" = torch.ops.aten.exp.default(x1)\n        a: \"f32[8, 2]\" = torch.ops.aten.cat.default([a0, a1])\n        b0: \"f32[4, 2]\" = torch.ops.aten.relu.default(y0)\n        b1: \"f32[4, 2]\" = torch.ops.aten.exp.default(y1)\n        b: \"f32[8, 2]\" = torch.ops.aten.cat.default([b0, b1])\n        return (a, b)\n";

    /// One half on a rank: `f` of its tp shard of `input`, gathered over `tp` into `out`.
    fn half(f: &str, input: &str, out: &str) -> String {
        format!("        r_{out}: \"f32[2, 2]\" = torch.ops.aten.{f}.default({input})\n        g_{out}: \"f32[4, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(r_{out}, 2, 'tp')\n        {out}: \"f32[4, 2]\" = torch.ops._c10d_functional.wait_tensor.default(g_{out})\n")
    }

    /// A rank's graph computing `a` and `b`; with `exp_first`, each output's `exp` half (and
    /// its gather) is written before its `relu` half.
    pub fn rank(exp_first: bool) -> String {
        let mut text = format!("{HEADER}    def forward(self, x0: \"f32[2, 2]\", x1: \"f32[2, 2]\", y0: \"f32[2, 2]\", y1: \"f32[2, 2]\"):\n");
        for (out, first, second) in [("a", "x0", "x1"), ("b", "y0", "y1")] {
            let (relu, exp) = (
                half("relu", first, &format!("{out}0")),
                half("exp", second, &format!("{out}1")),
            );
            if exp_first {
                text.push_str(&exp);
                text.push_str(&relu);
            } else {
                text.push_str(&relu);
                text.push_str(&exp);
            }
            text.push_str(&format!(
                "        {out}: \"f32[8, 2]\" = torch.ops.aten.cat.default([{out}0, {out}1])\n"
            ));
        }
        text.push_str("        return (a, b)\n");
        text
    }

    /// The case with rank `r`'s graph `graphs[r]` (ranks 0, 1 on pipeline stage 0).
    pub fn case(graphs: [String; 4]) -> (tempfile::TempDir, shardproof_case::Case) {
        let mut files = vec![("spec.py", format!("{HEADER}{SPEC}"))];
        let names = ["r0.py", "r1.py", "r2.py", "r3.py"];
        for (name, g) in names.iter().zip(graphs) {
            files.push((name, g));
        }
        let yaml = format!(
            "version: 1\nname: gathers\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2, tp: 2 }}\n  graphs: [{}]\n  groups:\n    \"tp\": tp\ninputs:\n  x0: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 0 }} }}\n  x1: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 0 }} }}\n  y0: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 1 }} }}\n  y1: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 1 }} }}\noutputs:\n  a: {{ placement: Replicate(), at: {{ pp: 0 }} }}\n  b: {{ placement: Replicate(), at: {{ pp: 1 }} }}\n",
            names.join(", ")
        );
        super::load(&files, &yaml)
    }
}

/// Pipeline stage 1 writes each output's halves in the other order (as a 1F1B stage
/// interleaves its microbatches otherwise): the same dataflow, each gather meeting the same
/// half on both tp ranks, so one proof proves both stages.
#[test]
fn halves_written_in_another_order_are_one_proof() {
    let (_d, case) = gathers::case([
        gathers::rank(false),
        gathers::rank(false),
        gathers::rank(true),
        gathers::rank(true),
    ]);
    assert_eq!(
        reps(&case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)]
    );
    let proof = staged(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert_eq!((proof.distinct_stages, proof.memo_hits), (1, 1));
}

/// Rank 2 writes `b`'s halves in the other order, rank 3 does not: their first gathers meet
/// (relu's half with exp's) and `b` is scrambled. The dataflow is the same as stage `a`'s on
/// every rank; only the pairing differs, so `b` must be keyed in program order and refuted.
#[test]
fn gathers_that_meet_across_halves_are_another_stage() {
    let (_d, case) = gathers::case([
        gathers::rank(false),
        gathers::rank(false),
        gathers::rank(true),
        gathers::rank(false),
    ]);
    assert_eq!(
        reps(&case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 1)]
    );
    let proof = staged(&case);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert_eq!(proof.stages[1].verdict, Some(Verdict::Refuted));
}

/// Sends between pipeline stages on a mesh { pp: 4, tp: 2 }: pipeline stage 0 sends its tp
/// shard of `x` to stage 1 (`a = relu(x)` there), stage 2 its shard of `y` to stage 3 (`b`).
/// A send names its peer `dst` and a recv `src` as indices within group `group`.
mod messages {
    use super::HEADER;

    const SPEC: &str = "    def forward(self, x: \"f32[4, 2]\", y: \"f32[4, 2]\"):\n        a: \"f32[4, 2]\" = torch.ops.aten.relu.default(x)\n        b: \"f32[4, 2]\" = torch.ops.aten.relu.default(y)\n        return (a, b)\n";

    fn sender(input: &str, dst: usize, group: &str) -> String {
        format!("{HEADER}    def forward(self, {input}: \"f32[2, 2]\"):\n        s: \"f32[2, 2]\" = torch.ops.shardproof_p2p.send.default({input}, {dst}, 0, '{group}')\n        return (s,)\n")
    }

    fn receiver(output: &str, src: usize, group: &str) -> String {
        format!("{HEADER}    def forward(self):\n        v: \"f32[2, 2]\" = torch.ops.shardproof_p2p.recv.default([2, 2], torch.float32, {src}, 0, '{group}')\n        {output}: \"f32[2, 2]\" = torch.ops.aten.relu.default(v)\n        return ({output},)\n")
    }

    /// The case: `group` is the process group the calls name, `groups` the case's `groups:`
    /// entries (YAML lines), `peers` the (dst, src) indices of the first pair of pipeline
    /// stages and of the second.
    pub fn case(
        group: &str,
        groups: &str,
        peers: [(usize, usize); 2],
    ) -> (tempfile::TempDir, shardproof_case::Case) {
        let [(dst_a, src_a), (dst_b, src_b)] = peers;
        let files = vec![
            ("spec.py", format!("{HEADER}{SPEC}")),
            ("send_x.py", sender("x", dst_a, group)),
            ("recv_a.py", receiver("a", src_a, group)),
            ("send_y.py", sender("y", dst_b, group)),
            ("recv_b.py", receiver("b", src_b, group)),
        ];
        let graphs = ["send_x.py", "recv_a.py", "send_y.py", "recv_b.py"]
            .iter()
            .flat_map(|g| [*g, *g])
            .collect::<Vec<_>>()
            .join(", ");
        let yaml = format!(
            "version: 1\nname: messages\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 4, tp: 2 }}\n  graphs: [{graphs}]\n  groups:\n{groups}inputs:\n  x: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 0 }} }}\n  y: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 2 }} }}\noutputs:\n  a: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 1 }} }}\n  b: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 3 }} }}\n"
        );
        super::load(&files, &yaml)
    }
}

/// Stage 2 sends to `pp` index 3 and stage 3 receives from index 2, where stages 0 and 1 write 1
/// and 0: other numbers, the same messages up to renumbering the holders. One proof.
#[test]
fn a_message_to_another_pp_index_is_one_proof() {
    let (_d, case) = messages::case("pp", "    \"pp\": pp\n", [(1, 0), (3, 2)]);
    assert_eq!(
        reps(&case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)]
    );
    let proof = staged(&case);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert_eq!((proof.distinct_stages, proof.memo_hits), (1, 1));
}

/// The same text on every pipeline stage (`dst` 1, `src` 0 within group `g`), but `g` pairs
/// stage 2's tp ranks with stage 3's crossed: rank 6 receives rank 5's shard and rank 7 rank
/// 4's, so `b` holds its shards swapped. Only the messages tell the stages apart: another stage,
/// refuted; pairing them straight makes it one proof again.
#[test]
fn a_recv_that_takes_another_ranks_message_is_another_stage() {
    let crossed = "    \"g\": [[0, 2], [1, 3], [4, 7], [5, 6]]\n";
    let (_d, case) = messages::case("g", crossed, [(1, 0), (1, 0)]);
    assert_eq!(
        reps(&case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 1)]
    );
    let proof = staged(&case);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert_eq!(proof.stages[1].verdict, Some(Verdict::Refuted));

    let straight = "    \"g\": [[0, 2], [1, 3], [4, 6], [5, 7]]\n";
    let (_d, case) = messages::case("g", straight, [(1, 0), (1, 0)]);
    assert_eq!(
        reps(&case),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)]
    );
    assert_eq!(staged(&case).verdict, Verdict::Proved);
}

/// A memo hit keeps its representative's case (one copy, freed of its own graphs), unless the
/// plan is asked to keep every stage's own.
#[test]
fn a_memo_hit_shares_its_representatives_case() {
    let (_d, case) = messages::case("pp", "    \"pp\": pp\n", [(1, 0), (3, 2)]);
    let plan = plan_with(&case, true, &apart()).unwrap();
    assert_eq!(plan.stages[1].rep, 0);
    assert!(std::sync::Arc::ptr_eq(
        &plan.stages[0].case,
        &plan.stages[1].case
    ));
    let kept = PlanOptions {
        keep_memo_hit_cases: true,
        ..apart()
    };
    let plan = plan_with(&case, true, &kept).unwrap();
    assert_eq!(plan.stages[1].rep, 0);
    assert!(!std::sync::Arc::ptr_eq(
        &plan.stages[0].case,
        &plan.stages[1].case
    ));
    assert!(plan.stages[1].case.name.contains("output `b`"));
}
