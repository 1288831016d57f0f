//! The llama spec is a faithful Llama-3 and its explicit backward is the true gradient:
//! - every `<param>_new` output of the full iteration is `param - lr * d loss / d param`,
//!   checked element by element against central finite differences of the loss, run by the
//!   reference interpreter in f64 (always);
//! - the loss and every gradient agree with an independent PyTorch implementation (float64,
//!   autograd) when the oracle suite is set up (`SHARDPROOF_ORACLE_DIR`, as `scripts/test`
//!   sets it).
//!
//! (`run` only compares spec and ranks with each other; these check the spec itself.)

mod common;

use common::spec_check::{
    check_gradients as check_spec, oracle_python, spec_graph_of, Torch, TORCH_HEADER,
    TORCH_LLAMA_PIECES,
};
use shardproof_ir::Graph;
use shardproof_zoo::{EmitExtras, LlamaConfig};

fn spec_graph(cfg: &LlamaConfig) -> Graph {
    spec_graph_of("llama", "tp=2", cfg.clone(), &EmitExtras::default())
}

#[test]
fn spec_gradients_match_finite_differences() {
    check_gradients(&LlamaConfig::default());
    // Other sizes: plain multi-head attention (no kv repeat), one layer, odd batch and
    // sequence lengths.
    check_gradients(&LlamaConfig {
        hidden: 8,
        heads: 2,
        kv_heads: 2,
        ffn: 12,
        layers: 1,
        seq: 5,
        batch: 3,
        vocab: 7,
        ..LlamaConfig::default()
    });
}

fn check_gradients(cfg: &LlamaConfig) {
    let params = cfg.params(1, false).len();
    check_spec(
        &spec_graph(cfg),
        cfg.vocab,
        cfg.lr,
        params,
        0x5eed_1234_abcd_0001,
    );
}

/// An independent Llama-3 forward in PyTorch (float64): `F.embedding`, RMSNorm, Hugging Face's
/// `rotate_half` RoPE, `repeat_interleave` for grouped-query attention,
/// `F.scaled_dot_product_attention(is_causal=True)`, SwiGLU, `F.cross_entropy`; autograd for
/// the gradients (after the shared header and Llama pieces, which read the inputs).
const TORCH_LLAMA: &str = r#"
x = F.embedding(tokens, p["embed"])
for l in range(c["layers"]):
    x = attention(x, l)
    h = rms(x, p[f"mlp_norm_{l}"])
    x = x + (F.silu(h @ p[f"w_gate_{l}"].T) * (h @ p[f"w_up_{l}"].T)) @ p[f"w_down_{l}"].T
report(lm_loss(x))
"#;

#[test]
fn spec_matches_pytorch() {
    let Some(python) = oracle_python() else {
        return;
    };
    let cfg = LlamaConfig::default();
    let params: Vec<String> = cfg.params(1, false).into_iter().map(|p| p.name).collect();
    let torch = Torch {
        python: &python,
        script: [TORCH_HEADER, TORCH_LLAMA_PIECES, TORCH_LLAMA].concat(),
        config: serde_json::json!({
            "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
            "layers": cfg.layers, "eps": cfg.eps,
        }),
        norm_floor: 1e-12,
    };
    torch.check(&spec_graph(&cfg), cfg.vocab, cfg.lr, &params, 0x0dd_ba11);
}
