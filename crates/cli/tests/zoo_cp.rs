//! Context parallelism in the zoo (a `cp` mesh dim): every correct plan of the llama model
//! holds under `run` and `inspect --strict` (cp alone, with dp, with tp, with both, with kv
//! replicas, vocabulary parallelism and the training options; forward only and the full
//! iteration), the ring's sends and receives and the case layout are as documented, every
//! context-parallel bug of the catalog is found naming an output it changes, the listed-only
//! entry is refused, and requests the zoo cannot serve exit 2. The same for deepseek (its
//! attention is llama's) and gpt2 (sequence-first attention, learned positions).

mod common;

use common::zoo::{assert_has_all, p2p_calls, p2p_peers, NO_FLAGS};
use common::Scratch;
use shardproof_zoo::{find_bug, BUGS};

/// The flags of the full iteration with every training option: accumulation, Adam, clipping
/// and loss scaling.
const TRAINING_FLAGS: &[&str] = &[
    "--batch",
    "4",
    "--grad-accum",
    "2",
    "--optimizer",
    "adam",
    "--clip-grad",
    "0.5",
    "--loss-scale",
    "8",
];

/// The correct plans of `model` on each of `meshes`, forward only and the full iteration, hold
/// under `run` and `inspect --strict`.
fn plans_hold(s: &Scratch, model: &str, meshes: &[&str]) {
    for mesh in meshes {
        for (pass, flags) in [("forward", &["--forward-only"][..]), ("full", NO_FLAGS)] {
            let case = s.emit_model(&format!("{mesh}-{pass}"), model, mesh, flags);
            s.assert_holds_strictly(&case);
        }
    }
}

/// Plants every context-parallel bug of `model` (on tp=2,cp=2 when it needs tp, else on
/// dp=2,cp=2; forward only too unless it needs the backward): `inspect --strict` accepts each
/// case and `run` finds the bug, naming an output it changes. Returns the ids planted.
fn cp_bugs_are_found_in(s: &Scratch, model: &str) -> Vec<&'static str> {
    let mut planted = Vec::new();
    for bug in BUGS
        .iter()
        .filter(|b| b.needs_cp() && !b.listed_only() && b.models.contains(&model))
    {
        let mesh = if bug.needs_tp {
            "tp=2,cp=2"
        } else {
            "dp=2,cp=2"
        };
        for forward_only in [true, false] {
            if forward_only && bug.needs_backward {
                continue;
            }
            let mut flags = vec!["--bug", bug.id];
            if forward_only {
                flags.push("--forward-only");
            }
            let dir = format!("{}-{forward_only}", bug.id);
            let case = s.emit_model(&dir, model, mesh, &flags);
            s.assert_strict(&case);
            s.assert_bug_found(&case, bug.id);
        }
        planted.push(bug.id);
    }
    planted
}

/// `rank` (of dp=2,cp=2 with the default 8 positions, at cp rank 1) reads its dp rank's
/// sequences whole and keeps chunks 1 and 2 of 4: positions 2, 3 and 4, 5.
#[track_caller]
fn assert_holds_chunks_1_and_2(rank: &str) {
    assert_has_all(
        rank,
        &[
            "tokens: \"i64[1, 8]\"",
            "aten.arange.start(2, 4,",
            "aten.arange.start(4, 6,",
            "aten.slice.Tensor(tokens, 1, 2, 4)",
            "aten.slice.Tensor(tokens, 1, 4, 6)",
        ],
    );
}

/// The context-parallel bugs every model with a cp mesh dim can carry.
const CP_BUGS: [&str; 4] = [
    "cp-rope-no-offset",
    "cp-loss-overscaled",
    "cp-causal-mask-local",
    "tp-cp-layernorm-grad-scaled-by-tp",
];

const MESHES: [&str; 4] = ["cp=2", "dp=2,cp=2", "tp=2,cp=2", "dp=2,tp=2,cp=2"];

#[test]
fn llama_cp_plans_hold() {
    let s = Scratch::new();
    plans_hold(&s, "llama", &MESHES);
    // A longer ring (every rank meets blocks before and after its chunks), an odd one, and
    // kv heads replicated over tp ranks.
    for (dir, mesh, seq) in [
        ("cp4", "cp=4", "16"),
        ("cp3", "cp=3", "12"),
        ("tp4", "tp=4,cp=2", "8"),
    ] {
        let case = s.emit_model(dir, "llama", mesh, &["--seq", seq]);
        s.assert_holds_strictly(&case);
    }
}

#[test]
fn llama_cp_with_vocab_parallelism_and_training_options_holds() {
    let s = Scratch::new();
    for (dir, mesh, flags) in [
        ("vp", "tp=2,cp=2", vec!["--vocab-parallel"]),
        ("train", "dp=2,tp=2,cp=2", TRAINING_FLAGS.to_vec()),
    ] {
        let case = s.emit_model(dir, "llama", mesh, &flags);
        s.assert_holds_strictly(&case);
    }
}

#[test]
fn ring_messages_and_case_layout() {
    let s = Scratch::new();
    let case = s.emit_model("ring", "llama", "dp=2,tp=2,cp=2", NO_FLAGS);
    // Rank 6 = (dp 1, cp 1, tp 0): its cp peer is rank 4 (tp 0 of cp 0 in the same dp row),
    // index 0 of its `cp` group, as the messages name it.
    let r6 = s.read("ring/r6.py");
    assert_holds_chunks_1_and_2(&r6);
    let calls = p2p_calls(&r6);
    // Per layer: K and V forward (send, recv); in the backward K and V again (send, recv)
    // with their gradients (recv before the step that adds to them, send after; the last
    // send returns them to their owner).
    let layers = 2;
    let sends = calls.iter().filter(|c| c.starts_with("send")).count();
    let recvs = calls.iter().filter(|c| c.starts_with("recv")).count();
    assert_eq!((sends, recvs), (8 * layers, 8 * layers), "{r6}");
    assert!(
        p2p_peers(&r6).iter().all(|peer| peer == "0@cp"),
        "every message goes to or comes from cp index 0 (rank 4): {calls:?}"
    );
    // Every rank finds its messages (no deadlock, no stray send) and the plan holds.
    s.run(&["run", &case]).expect_code(0);
    let yaml = s.read("ring/case.yaml");
    assert_has_all(
        &yaml,
        &[
        "mesh: { dp: 2, cp: 2, tp: 2 }",
        "\"cp\": cp",
        "\"dp_cp\": [[0, 2, 4, 6], [1, 3, 5, 7]]",
        "tokens: { dp: Shard(0) }",
        "labels: { dp: Shard(0) }",
        "wq_0: { tp: Shard(0) }",
        "# Context parallel: the sequence in 4 load-balanced chunks, cp rank i holding chunks i and 3-i",
        ],
    );
    // The spec is the single-device model: no message, no chunk.
    let spec = s.read("ring/spec.py");
    assert!(!spec.contains("shardproof_p2p") && !spec.contains("logsumexp"));
}

#[test]
fn cp_bugs_are_found() {
    let s = Scratch::new();
    let planted = cp_bugs_are_found_in(&s, "llama");
    for id in CP_BUGS {
        assert!(planted.contains(&id), "{id} is never planted");
    }
    // The norm gradient bug names a norm's updated weight.
    let case = s.emit_model(
        "norm",
        "llama",
        "dp=2,tp=2,cp=2",
        &["--bug", "tp-cp-layernorm-grad-scaled-by-tp"],
    );
    let (out, first) = s.run_mismatch(&case);
    assert_eq!(first, "attn_norm_0_new", "{}", out.stdout);
    // RoPE without the chunk offsets is found on a longer ring too.
    let case = s.emit_model(
        "rope4",
        "llama",
        "cp=4",
        &["--seq", "16", "--bug", "cp-rope-no-offset"],
    );
    s.assert_bug_found(&case, "cp-rope-no-offset");
}

#[test]
fn the_listed_only_entry_is_refused() {
    let s = Scratch::new();
    let bug = find_bug("cp-attn-grad-noncontiguous").unwrap();
    assert!(bug.listed_only() && bug.needs_cp());
    assert!(bug.description.contains("numerically invisible"));
    s.zoo_emit("x", &["llama", "--mesh", "cp=2", "--bug", bug.id])
        .expect_code(2)
        .stderr_has(&["listed only", "cannot be planted"]);
    s.run(&["zoo", "list", "--bugs"])
        .expect_code(0)
        .stdout_has(&[bug.id, "TTrace"]);
}

#[test]
fn requests_the_zoo_cannot_split_exit_2() {
    let s = Scratch::new();
    for (args, message) in [
        (
            "mlp --mesh cp=2",
            "applies to the llama, deepseek and gpt2 models, not `mlp`",
        ),
        ("gpt2 --mesh cp=3", "seq 8 does not split into 2 * cp = 6"),
        (
            "gpt2 --mesh tp=4,cp=2 --seq 12 --sequence-parallel",
            "the rank's 6 positions (seq 12 / cp = 2) do not split over tp = 4",
        ),
        (
            "gpt2 --mesh dp=2,cp=2 --zero 1",
            "--zero is not combined with context parallelism",
        ),
        (
            "llama --mesh pp=2,cp=2 --layers 2",
            "not combined with pipeline parallelism",
        ),
        ("llama --mesh cp=3", "seq 8 does not split into 2 * cp = 6"),
        (
            "llama --mesh dp=2,cp=2 --zero 1",
            "--zero is not combined with context parallelism",
        ),
        (
            "llama --mesh dp=2 --bug cp-loss-overscaled",
            "needs a cp mesh dim of size >= 2",
        ),
        (
            "llama --mesh cp=2 --bug tp-cp-layernorm-grad-scaled-by-tp",
            "tp mesh dim",
        ),
    ] {
        s.assert_emit_refused(args, message);
    }
}

/// The deepseek meshes with cp (its attention is llama's, so its ring too).
const DEEPSEEK_MESHES: [&str; 4] = ["cp=2", "dp=2,cp=2", "cp=2,ep=2", "tp=2,cp=2,ep=2"];

#[test]
fn deepseek_cp_plans_hold() {
    let s = Scratch::new();
    plans_hold(&s, "deepseek", &DEEPSEEK_MESHES);
    // Every dim at once, the all-to-all dispatcher, and sequence parallelism in the MoE
    // blocks on top of the ring.
    for (dir, mesh, flags) in [
        ("all", "dp=2,tp=2,cp=2,ep=2", vec![]),
        ("a2a", "tp=2,cp=2,ep=2", vec!["--ep-dispatch", "alltoall"]),
        ("sp", "tp=2,cp=2", vec!["--sequence-parallel"]),
    ] {
        let case = s.emit_model(dir, "deepseek", mesh, &flags);
        s.assert_holds_strictly(&case);
    }
    // The balance loss's per-sequence counts and probability sums span both chunks of every
    // cp rank: all-reduced over cp in the forward, the probability sums' gradient in the
    // backward; the data group spans dp x cp x ep, the experts' replicas dp x cp.
    let yaml = s.read("all/case.yaml");
    assert_has_all(
        &yaml,
        &[
            "mesh: { dp: 2, cp: 2, tp: 2, ep: 2 }",
            "\"dp_cp_ep\": [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]",
            "\"dp_cp\": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]",
            "tokens: { dp: Shard(0), ep: Shard(0) }",
        ],
    );
    let r5 = s.read("all/r5.py");
    let layers = 2;
    // Collectives over cp (the ring's sends and recvs name the `cp` group too).
    let over_cp = r5
        .lines()
        .filter(|l| l.contains("_c10d_functional") && l.contains("'cp')"))
        .count();
    assert_eq!(over_cp, 3 * layers, "{r5}");
    assert!(
        r5.contains("'dp_cp_ep')") && r5.contains("'dp_cp')"),
        "{r5}"
    );
}

#[test]
fn cp_attention_bugs_are_found_in_deepseek() {
    let s = Scratch::new();
    for bug in BUGS
        .iter()
        .filter(|b| b.needs_cp() && b.models.contains(&"deepseek"))
    {
        let case = s.emit_model(bug.id, "deepseek", "tp=2,cp=2,ep=2", &["--bug", bug.id]);
        s.assert_bug_found(&case, bug.id);
    }
    for id in ["cp-rope-no-offset", "cp-causal-mask-local"] {
        assert!(find_bug(id).unwrap().models.contains(&"deepseek"), "{id}");
    }
}

#[test]
fn gpt2_cp_plans_hold() {
    let s = Scratch::new();
    plans_hold(&s, "gpt2", &MESHES);
    // A longer ring, sequence parallelism inside the tensor-parallel regions on top of the
    // ring (with TP communication overlap), and the training options.
    for (dir, mesh, flags) in [
        ("cp4", "cp=4", vec!["--seq", "16"]),
        ("sp", "tp=2,cp=2", vec!["--sequence-parallel"]),
        (
            "overlap",
            "dp=2,tp=2,cp=2",
            vec!["--sequence-parallel", "--tp-comm-overlap"],
        ),
        ("train", "dp=2,tp=2,cp=2", TRAINING_FLAGS.to_vec()),
    ] {
        let case = s.emit_model(dir, "gpt2", mesh, &flags);
        s.assert_holds_strictly(&case);
    }
}

#[test]
fn gpt2_positions_and_ring() {
    let s = Scratch::new();
    let case = s.emit_model("ring", "gpt2", "dp=2,tp=2,cp=2", NO_FLAGS);
    let r6 = s.read("ring/r6.py");
    // Rank 6 = (dp 1, cp 1, tp 0) keeps chunks 1 and 2 of 4, whose rows of the position table
    // it looks up and whose rows of the (whole) position-table gradient it fills.
    assert_holds_chunks_1_and_2(&r6);
    assert!(!r6.contains("aten.arange.start(0, 4,"), "{r6}");
    let wpe_grad = r6
        .lines()
        .find(|l| l.contains("f32[8, 16]") && l.contains("embedding_dense_backward.default("))
        .unwrap_or_else(|| panic!("the position-table gradient has all 8 rows\n{r6}"));
    assert!(
        wpe_grad.contains("cat"),
        "scattered at the chunks' positions: {wpe_grad}"
    );
    // K and V around the ring, forward and backward, with their gradients: 8 messages each
    // way per layer, all to or from the cp peer, rank 4 (index 0 of the rank's `cp` group).
    let p2p = p2p_calls(&r6);
    assert_eq!(p2p.len(), 2 * 8 * 2, "{r6}");
    assert!(p2p_peers(&r6).iter().all(|peer| peer == "0@cp"), "{p2p:?}");
    // The position table's gradient is averaged over dp x cp like every replicated parameter.
    assert!(r6.contains("'dp_cp')"), "{r6}");
    s.run(&["run", &case]).expect_code(0);
    let yaml = s.read("ring/case.yaml");
    assert_has_all(
        &yaml,
        &[
            "mesh: { dp: 2, cp: 2, tp: 2 }",
            "\"dp_cp\": [[0, 2, 4, 6], [1, 3, 5, 7]]",
            "tokens: { dp: Shard(0) }",
            "wpe: Replicate()",
            "# Context parallel: the sequence in 4 load-balanced chunks",
        ],
    );
    // The spec is the single-device model: no message, no chunk, the position table read at
    // arange(seq).
    let spec = s.read("ring/spec.py");
    assert!(!spec.contains("shardproof_p2p") && !spec.contains("logsumexp"));
    assert!(spec.contains("aten.arange.start(0, 8,"), "{spec}");
}

#[test]
fn cp_bugs_are_found_in_gpt2() {
    let s = Scratch::new();
    let planted = cp_bugs_are_found_in(&s, "gpt2");
    for id in CP_BUGS {
        assert!(planted.contains(&id), "{id} is never planted in gpt2");
    }
    // The LayerNorm gradient bug names the first LayerNorm's updated weight, with and
    // without sequence parallelism (whose reduction of the LayerNorm gradients over tp it
    // repeats).
    for (dir, flags) in [
        ("ln", vec!["--bug", "tp-cp-layernorm-grad-scaled-by-tp"]),
        (
            "ln-sp",
            vec![
                "--sequence-parallel",
                "--bug",
                "tp-cp-layernorm-grad-scaled-by-tp",
            ],
        ),
    ] {
        let case = s.emit_model(dir, "gpt2", "dp=2,tp=2,cp=2", &flags);
        let (out, first) = s.run_mismatch(&case);
        assert_eq!(first, "ln1_w_0_new", "{}", out.stdout);
    }
    // Under tp x cp and on a longer ring too.
    for (dir, mesh, seq, bug) in [
        ("mask-tp", "tp=2,cp=2", "8", "cp-causal-mask-local"),
        ("pos4", "cp=4", "16", "cp-rope-no-offset"),
    ] {
        let case = s.emit_model(dir, "gpt2", mesh, &["--seq", seq, "--bug", bug]);
        s.assert_bug_found(&case, bug);
    }
    // The listed-only entry is refused in gpt2 too.
    s.assert_emit_refused(
        "gpt2 --mesh cp=2 --bug cp-attn-grad-noncontiguous",
        "listed only",
    );
}
