//! `shardproof zoo emit deepseek`: every correct plan (dp, tp, ep and their products,
//! forward-only and full iteration) holds under `run`; every MoE bug of the catalog is found,
//! naming an output it changes; bad sizes are refused with exit 2. The spec itself is a
//! faithful DeepSeek-V3 style MoE: its explicit backward (router, top-k gates, experts,
//! auxiliary loss) matches central finite differences (always), and its loss and gradients
//! match an independent PyTorch implementation (float64, autograd) when the oracle suite is set
//! up (`SHARDPROOF_ORACLE_DIR`, as `scripts/test` sets it).

mod common;

use common::spec_check::{
    check_gradients, oracle_python, spec_graph_of, Torch, TORCH_HEADER, TORCH_LLAMA_PIECES,
};
use common::zoo::{check_moe_bugs, plant_bugs, words, NO_FLAGS};
use common::Scratch;
use shardproof_ir::Graph;
use shardproof_zoo::{Bug, DeepseekConfig, EmitExtras, LlamaConfig, Site, BUGS};

/// The correct plans of every mesh: (mesh, dp, tp, ep).
const MESHES: &[(&str, usize, usize, usize)] = &[
    ("tp=2", 1, 2, 1),
    ("dp=2", 2, 1, 1),
    ("ep=2", 1, 1, 2),
    ("dp=2,ep=2", 2, 1, 2),
    ("tp=2,ep=2", 1, 2, 2),
    ("dp=2,tp=2,ep=2", 2, 2, 2),
];

/// Emits a deepseek case into `dir` (relative to the scratch directory) and returns the path
/// of its case file.
fn emit(scratch: &Scratch, dir: &str, mesh: &str, flags: &[&str]) -> String {
    scratch.emit_model(dir, "deepseek", mesh, flags)
}

#[test]
fn deepseek_plans_hold_and_moe_bugs_are_found() {
    let scratch = Scratch::new();
    let mut planted: Vec<&str> = Vec::new();
    for &(mesh, dp, tp, ep) in MESHES {
        for forward_only in [true, false] {
            let flags: &[&str] = if forward_only {
                &["--forward-only"]
            } else {
                &[]
            };
            let dir = format!("{mesh}-{forward_only}");
            let case = emit(&scratch, &dir, mesh, flags);
            scratch.assert_holds(&case);
            let args = [&["deepseek", "--mesh", mesh], flags].concat();
            let site = Site::new("deepseek", dp, tp, forward_only);
            planted.extend(check_moe_bugs(&scratch, &dir, &args, &site, ep));
        }
    }
    // (The bugs of sequence parallelism in the MoE blocks are planted in zoo_bugs_extra.rs,
    // those of context parallelism in zoo_cp.rs, the pipeline bugs in zoo_pp.rs.)
    for bug in BUGS.iter().filter(|b| {
        b.models.contains(&"deepseek")
            && !b.needs_sequence_parallel
            && !b.needs_cp()
            && !b.needs_pipeline()
    }) {
        assert!(planted.contains(&bug.id), "{} is never planted", bug.id);
    }
}

#[test]
fn expert_parallel_dispatch_and_static_checks() {
    let scratch = Scratch::new();
    let case = emit(&scratch, "ep", "dp=2,tp=2,ep=2", NO_FLAGS);
    scratch.assert_strict(&case);
    let r5 = scratch.read("ep/r5.py");
    // Rank 5 = (dp 1, tp 0, ep 1) holds experts 2 and 3 with half their inner width.
    assert!(r5.contains("expert_gate_0: \"f32[2, 4, 16]\""), "{r5}");
    assert!(r5.contains("tokens: \"i64[1, 8]\""), "{r5}");
    // Per layer: the MoE input, the gates and the output gradient gathered over ep; the
    // output, the input gradient and the gate gradient reduce-scattered.
    let layers = DeepseekConfig::default().base.layers;
    let gathers = r5.matches("all_gather_into_tensor.default(").count();
    let scatters = r5.matches("reduce_scatter_tensor.default(").count();
    assert_eq!((gathers, scatters), (3 * layers, 3 * layers), "{r5}");
    assert_eq!(r5.matches("'ep')").count(), 6 * layers, "{r5}");
    let yaml = scratch.read("ep/case.yaml");
    assert!(
        yaml.contains("\"dp_ep\": [[0, 1, 4, 5], [2, 3, 6, 7]]"),
        "{yaml}"
    );
    assert!(
        yaml.contains("tokens: { dp: Shard(0), ep: Shard(0) }"),
        "{yaml}"
    );
    assert!(
        yaml.contains("expert_down_1_new: { tp: Shard(2), ep: Shard(0) }"),
        "{yaml}"
    );
}

#[test]
fn deepseek_sizes_are_configurable_and_checked() {
    let scratch = Scratch::new();
    let sizes = "--experts 6 --top-k 3 --moe-ffn 6 --ffn 12 --hidden 12 --heads 2 --kv-heads 2 \
                 --seq 5 --batch 6 --vocab 11 --layers 1";
    let case = emit(&scratch, "sized", "tp=2,ep=3", &words(sizes));
    let r0 = scratch.read("sized/r0.py");
    assert!(r0.contains("expert_up_0: \"f32[2, 3, 12]\""), "{r0}");
    assert!(r0.contains("aten.topk.default(sigmoid, 3)"), "{r0}");
    scratch.run(&["run", &case]).expect_code(0);
    // Each request, and a word of the error it must exit 2 with.
    let refused = [
        (
            "deepseek --mesh ep=3",
            "batch 4 is not divisible by dp x ep = 3",
        ),
        (
            "deepseek --mesh ep=4 --batch 8 --experts 6",
            "experts 6 is not divisible by ep = 4",
        ),
        ("deepseek --top-k 5", "top_k 5 exceeds the 4 experts"),
        ("deepseek --experts 0", "experts must be at least 1"),
        (
            "deepseek --mesh tp=4",
            "kv_heads 2 is not divisible by tp = 4",
        ),
        (
            "deepseek --mesh ep=2 --bug moe-router-grad-unsynced",
            "tp mesh dim",
        ),
        (
            "deepseek --mesh tp=2 --bug ep-expert-grad-not-averaged",
            "needs an ep mesh dim",
        ),
        ("deepseek --vocab-parallel", "vocab parallelism applies"),
        (
            "llama --mesh ep=2",
            "the ep mesh dim applies to the deepseek model",
        ),
        (
            "gpt2 --experts 4",
            "--experts applies to the deepseek model",
        ),
        (
            "llama --bug moe-aux-loss-not-divided-by-tp",
            "defined for the model(s) deepseek",
        ),
    ];
    for (request, word) in refused {
        scratch.assert_emit_refused(request, word);
    }
}

/// The spec (which does not depend on the mesh; this one every size divides).
fn spec_graph(cfg: &DeepseekConfig) -> Graph {
    let deepseek = cfg.clone();
    let llama = LlamaConfig::default();
    spec_graph_of(
        "deepseek",
        "dp=1",
        llama,
        &EmitExtras {
            deepseek,
            ..EmitExtras::default()
        },
    )
}

#[test]
fn spec_gradients_match_finite_differences() {
    let check = |cfg: &DeepseekConfig, seed| {
        let params = cfg.params(1).len();
        check_gradients(&spec_graph(cfg), cfg.base.vocab, cfg.base.lr, params, seed);
    };
    check(&DeepseekConfig::default(), 0x5eed_1234_abcd_0003);
    // Other sizes: a heavy auxiliary loss (its gradient then dominates the router's), top-1
    // routing over 3 experts, one layer, odd batch and sequence lengths.
    check(
        &DeepseekConfig {
            base: LlamaConfig {
                hidden: 8,
                heads: 2,
                kv_heads: 1,
                ffn: 6,
                layers: 1,
                seq: 5,
                batch: 2,
                vocab: 7,
                ..LlamaConfig::default()
            },
            moe_ffn: 5,
            experts: 3,
            top_k: 1,
            aux_alpha: 0.7,
        },
        0x5eed_1234_abcd_0004,
    );
    check(
        &DeepseekConfig {
            aux_alpha: 0.5,
            top_k: 3,
            ..DeepseekConfig::default()
        },
        0x5eed_1234_abcd_0005,
    );
}

/// An independent DeepSeek-V3 style MoE in PyTorch (float64), after the shared header and
/// Llama pieces: llama's attention, then per layer sigmoid router scores, `topk`, gates normalized over the
/// selected scores, each routed expert applied where `top_i == e`, the shared expert, and the
/// sequence-wise balance loss of DeepSeek-V3 (eqs. 17-20: `f_i = E / (K * S) * count_i`,
/// `P_i` the mean of the scores normalized per token) from `F.one_hot` counts; `F.cross_entropy`
/// plus the balance losses; autograd for the gradients.
const TORCH_DEEPSEEK: &str = r#"
E, K = c["experts"], c["top_k"]

def swiglu(x, gate, up, down):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T

x = F.embedding(tokens, p["embed"])
balance = 0.0
for l in range(c["layers"]):
    x = attention(x, l)
    h = rms(x, p[f"mlp_norm_{l}"]).reshape(B * S, H)
    scores = torch.sigmoid(h @ p[f"router_{l}"].T)
    top_v, top_i = scores.topk(K, dim=-1)
    gates = top_v / top_v.sum(-1, keepdim=True)
    routed = torch.zeros_like(h)
    for e in range(E):
        gate_e = (gates * (top_i == e)).sum(-1, keepdim=True)
        w = [p[f"expert_{n}_{l}"][e] for n in ("gate", "up", "down")]
        routed = routed + gate_e * swiglu(h, *w)
    shared = swiglu(h, p[f"shared_gate_{l}"], p[f"shared_up_{l}"], p[f"shared_down_{l}"])
    x = x + (routed + shared).view(B, S, H)
    counts = F.one_hot(top_i, E).sum(1).view(B, S, E).sum(1).double()
    f = counts * E / (K * S)
    P = (scores / scores.sum(-1, keepdim=True)).view(B, S, E).mean(1)
    balance = balance + c["aux_alpha"] * (f * P).sum(-1).mean()
report(lm_loss(x) + balance)
"#;

#[test]
fn spec_matches_an_independent_pytorch_moe() {
    let Some(python) = oracle_python() else {
        return;
    };
    // A heavier auxiliary loss than the default, so that its gradient weighs.
    let cfg = DeepseekConfig {
        aux_alpha: 0.3,
        ..DeepseekConfig::default()
    };
    let b = &cfg.base;
    let params: Vec<String> = cfg.params(1).into_iter().map(|p| p.name).collect();
    let torch = Torch {
        python: &python,
        script: [TORCH_HEADER, TORCH_LLAMA_PIECES, TORCH_DEEPSEEK].concat(),
        config: serde_json::json!({
            "hidden": b.hidden, "heads": b.heads, "kv_heads": b.kv_heads, "layers": b.layers,
            "eps": b.eps, "experts": cfg.experts, "top_k": cfg.top_k,
            "aux_alpha": cfg.aux_alpha,
        }),
        norm_floor: 1e-12,
    };
    torch.check(&spec_graph(&cfg), b.vocab, b.lr, &params, 0x0dd_ba13);
}

#[test]
fn all_to_all_dispatch_holds_and_moe_bugs_are_still_found() {
    let scratch = Scratch::new();
    for &(mesh, dp, tp, ep) in MESHES.iter().filter(|m| m.3 > 1) {
        for forward_only in [true, false] {
            let mut flags = vec!["--ep-dispatch", "alltoall"];
            if forward_only {
                flags.push("--forward-only");
            }
            let dir = format!("a2a-{mesh}-{forward_only}");
            let case = emit(&scratch, &dir, mesh, &flags);
            scratch.assert_holds_strictly(&case);
            let r0 = scratch.read(&format!("{dir}/r0.py"));
            // Per layer two all-to-alls out (tokens, gates) and one back; the backward mirrors
            // them. No all-gather or reduce-scatter over ep is left.
            let layers = DeepseekConfig::default().base.layers;
            let per_layer = if forward_only { 3 } else { 6 };
            assert_eq!(
                r0.matches("all_to_all_single.default(").count(),
                per_layer * layers,
                "{r0}"
            );
            assert!(!r0.contains("all_gather"), "{r0}");
            let site = Site::new("deepseek", dp, tp, forward_only);
            let applies = |bug: &Bug| bug.check_applies_with_ep(&site, ep).is_ok();
            let args = [&["deepseek", "--mesh", mesh], flags.as_slice()].concat();
            for (_, case) in plant_bugs(&scratch, &dir, &args, applies) {
                scratch
                    .run(&["run", &case])
                    .expect_code(1)
                    .stdout_has(&["first mismatching output `"]);
            }
        }
    }
    let yaml = scratch.read("a2a-ep=2-false/case.yaml");
    assert!(yaml.contains("name: deepseek-ep2-a2a\n"), "{yaml}");
    // The option needs the deepseek model and an ep mesh dim.
    for request in [
        "deepseek --mesh tp=2 --ep-dispatch alltoall",
        "llama --mesh tp=2 --ep-dispatch alltoall",
    ] {
        scratch.assert_emit_refused(
            request,
            "--ep-dispatch alltoall applies to the deepseek model",
        );
    }
}
