//! `shardproof zoo emit gpt2`: every correct plan (dp, tp, dp x tp, with and without sequence
//! parallelism, forward-only and full iteration) holds under `run` and `inspect --strict`;
//! every applicable catalog bug is found naming an output it changes. The spec itself is a
//! faithful GPT-2: its explicit backward matches central finite differences (always) and its
//! loss and gradients match an independent PyTorch implementation (float64, autograd) when the
//! oracle suite is set up (`SHARDPROOF_ORACLE_DIR`, as `scripts/test` sets it).

mod common;

use common::spec_check::{
    check_gradients as check_spec, oracle_python, spec_graph_of, Torch, TORCH_HEADER,
};
use common::zoo::{check_plan_and_bugs, words};
use common::Scratch;
use shardproof_ir::Graph;
use shardproof_zoo::{Bug, EmitExtras, Gpt2Config, LlamaConfig, Site, BUGS};

/// The correct plans hold; each applicable bug is found, naming the loss when it changes the
/// loss and an updated parameter otherwise. Returns the number of bugs planted.
fn check_plans(meshes: &[(&str, usize, usize)], sequence_parallel: bool) -> usize {
    let s = Scratch::new();
    let mut planted = 0;
    for &(mesh, dp, tp) in meshes {
        for forward_only in [true, false] {
            let mut args = vec!["gpt2", "--mesh", mesh];
            if forward_only {
                args.push("--forward-only");
            }
            if sequence_parallel {
                args.push("--sequence-parallel");
            }
            let site = Site {
                model: "gpt2",
                dp,
                tp,
                forward_only,
                kv_replicated: false,
                vocab_parallel: false,
                sequence_parallel,
            };
            let dir = format!("{mesh}-{forward_only}");
            let applies = |bug: &Bug| bug.check_applies(&site).is_ok();
            planted += check_plan_and_bugs(&s, &dir, &args, applies).len();
        }
    }
    planted
}

#[test]
fn gpt2_plans_hold_and_bugs_are_found() {
    let planted = check_plans(
        &[
            ("tp=2", 1, 2),
            ("dp=2", 2, 1),
            ("dp=2,tp=2", 2, 2),
            ("tp=4", 1, 4),
        ],
        false,
    );
    // dp and tp: loss and gradient averaging, the missing reduction, the bias before it and
    // the wrong group.
    assert!(planted >= 10, "{planted}");
}

#[test]
fn gpt2_sequence_parallel_plans_hold_and_bugs_are_found() {
    let planted = check_plans(&[("tp=2", 1, 2), ("dp=2,tp=2", 2, 2), ("tp=4", 1, 4)], true);
    assert!(planted >= 10, "{planted}");
    // Every gpt2 bug of the catalog is planted somewhere in the two matrices (the training
    // bugs, which need training flags, in zoo_train.rs; the context-parallel bugs in
    // zoo_cp.rs; the pipeline bugs in zoo_pp.rs).
    for bug in BUGS.iter().filter(|b| {
        b.models.contains(&"gpt2") && !b.needs_training() && !b.needs_cp() && !b.needs_pipeline()
    }) {
        let somewhere = [(2, 2, false), (2, 2, true)].iter().any(|&(dp, tp, sp)| {
            bug.check_applies(&Site {
                model: "gpt2",
                dp,
                tp,
                forward_only: false,
                kv_replicated: false,
                vocab_parallel: false,
                sequence_parallel: sp,
            })
            .is_ok()
        });
        assert!(somewhere, "{} is never planted", bug.id);
    }
}

#[test]
fn sequence_parallel_uses_gather_and_reduce_scatter() {
    let s = Scratch::new();
    s.emit_case("sp", &words("gpt2 --mesh tp=2 --sequence-parallel"));
    let r1 = s.read("sp/r1.py");
    assert!(
        !r1.contains("all_reduce.default(mm"),
        "no all-reduce of activations\n{r1}"
    );
    // Per layer: gathers before q/k/v and fc1, reduce-scatters after o and fc2 (forward);
    // in the backward the mirror images, plus the final norm's gather and the embedding's.
    let layers = Gpt2Config::default().layers;
    assert_eq!(
        r1.matches("reduce_scatter_tensor.default(").count(),
        4 * layers
    );
    assert_eq!(
        r1.matches("all_gather_into_tensor.default(").count(),
        4 * layers + 2
    );
    // Rank 1 keeps the second half of the sequence (8 positions over tp=2).
    assert!(r1.contains("aten.slice.Tensor(add, 0, 4, 8)"), "{r1}");
    // LayerNorm gradients are all-reduced over tp; the wrong-chunk bug and unsupported
    // requests are refused or changed.
    assert!(r1.contains("all_reduce.default(getitem"), "{r1}");
    // llama --sequence-parallel; heads 4 over tp=3; an odd sequence; --kv-heads is llama only.
    for request in [
        "llama --sequence-parallel",
        "gpt2 --mesh tp=3 --sequence-parallel",
        "gpt2 --kv-heads 2",
    ] {
        s.zoo_emit("bad", &words(request)).expect_code(2);
    }
    let out = s.zoo_emit(
        "bad",
        &words("gpt2 --mesh tp=2 --seq 5 --sequence-parallel"),
    );
    assert!(
        out.stderr.contains("seq 5 is not divisible"),
        "{}",
        out.stderr
    );
}

#[test]
fn gpt2_sizes_are_configurable() {
    let s = Scratch::new();
    let sizes = "gpt2 --mesh dp=2,tp=2 --sequence-parallel --hidden 24 --heads 6 --ffn 20 \
                 --layers 1 --seq 6 --batch 4 --vocab 11";
    let case = s.emit_case("sized", &words(sizes));
    let spec = s.read("sized/spec.py");
    assert!(
        spec.contains("tokens: \"i64[4, 6]\"")
            && spec.contains("wte: \"f32[11, 24]\"")
            && spec.contains("wpe: \"f32[6, 24]\""),
        "{spec}"
    );
    let rank = s.read("sized/r0.py");
    assert!(
        rank.contains("wq_0: \"f32[12, 24]\"") && rank.contains("fc1_w_0: \"f32[10, 24]\""),
        "{rank}"
    );
    s.run(&["run", &case]).expect_code(0);
}

fn spec_graph(cfg: &Gpt2Config) -> Graph {
    let extras = EmitExtras {
        gpt2: cfg.clone(),
        ..EmitExtras::default()
    };
    spec_graph_of("gpt2", "tp=2", LlamaConfig::default(), &extras)
}

#[test]
fn spec_gradients_match_finite_differences() {
    check_gradients(&Gpt2Config::default());
    // Other sizes: one layer, odd batch and sequence lengths, a narrow MLP.
    check_gradients(&Gpt2Config {
        hidden: 6,
        heads: 2,
        ffn: 10,
        layers: 1,
        seq: 5,
        batch: 3,
        vocab: 7,
        ..Gpt2Config::default()
    });
}

fn check_gradients(cfg: &Gpt2Config) {
    let params = cfg.params().len();
    check_spec(
        &spec_graph(cfg),
        cfg.vocab,
        cfg.lr,
        params,
        0x5eed_1234_abcd_0002,
    );
}

/// An independent GPT-2 forward in PyTorch (float64): `F.embedding` of tokens and positions,
/// `F.layer_norm`, `F.linear` with biases, `F.scaled_dot_product_attention(is_causal=True)`,
/// exact `F.gelu`, the LM head tied to the token embedding, `F.cross_entropy`; autograd for the
/// gradients (after the shared header, which reads the inputs and reports).
const TORCH_GPT2: &str = r#"
B, S, H, nh = tokens.shape[0], tokens.shape[1], c["hidden"], c["heads"]
hd = H // nh
x = F.embedding(tokens, p["wte"]) + F.embedding(torch.arange(S), p["wpe"])
for l in range(c["layers"]):
    h = F.layer_norm(x, (H,), p[f"ln1_w_{l}"], p[f"ln1_b_{l}"], c["eps"])
    heads = lambda n: F.linear(h, p[f"w{n}_{l}"], p[f"b{n}_{l}"]).view(B, S, nh, hd).transpose(1, 2)
    a = F.scaled_dot_product_attention(heads("q"), heads("k"), heads("v"), is_causal=True)
    x = x + F.linear(a.transpose(1, 2).reshape(B, S, H), p[f"wo_{l}"], p[f"bo_{l}"])
    h = F.layer_norm(x, (H,), p[f"ln2_w_{l}"], p[f"ln2_b_{l}"], c["eps"])
    m = F.gelu(F.linear(h, p[f"fc1_w_{l}"], p[f"fc1_b_{l}"]))
    x = x + F.linear(m, p[f"fc2_w_{l}"], p[f"fc2_b_{l}"])
logits = F.layer_norm(x, (H,), p["lnf_w"], p["lnf_b"], c["eps"]) @ p["wte"].T
report(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))
"#;

#[test]
fn spec_matches_pytorch() {
    let Some(python) = oracle_python() else {
        return;
    };
    let cfg = Gpt2Config::default();
    let params: Vec<String> = cfg.params().into_iter().map(|p| p.name).collect();
    // The key bias's gradient is exactly zero (it adds the same `q . bk` to every score of a
    // row, which softmax ignores): both sides are rounding noise there, so the bound has an
    // absolute floor.
    let torch = Torch {
        python: &python,
        script: [TORCH_HEADER, TORCH_GPT2].concat(),
        config: serde_json::json!({
            "hidden": cfg.hidden, "heads": cfg.heads, "layers": cfg.layers, "eps": cfg.eps,
        }),
        norm_floor: 1e-6,
    };
    torch.check(&spec_graph(&cfg), cfg.vocab, cfg.lr, &params, 0x0dd_ba12);
}
