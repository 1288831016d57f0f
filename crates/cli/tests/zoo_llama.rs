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

use common::graph_outputs as outputs;

use shardproof_ir::{DType, Graph};
use shardproof_ops::{Meta, Tensor};
use shardproof_zoo::{emit, EmitOptions, LlamaConfig, Mesh, MlpConfig};
use std::collections::BTreeMap;

/// A small deterministic generator (xorshift64*): the test needs no seed plumbing.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-scale, scale).
    fn uniform(&mut self, scale: f64) -> f64 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
    }
}

fn spec_graph(cfg: &LlamaConfig) -> Graph {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: cfg.clone(),
        mesh: Mesh::parse("tp=2").unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    let emitted = emit(&opts).unwrap();
    let (_, text) = emitted
        .files
        .iter()
        .find(|(n, _)| n == "spec.py")
        .expect("a spec");
    shardproof_import::parse_fx(text, std::path::Path::new("spec.py"))
        .unwrap()
        .graph
}

/// Random leaves for every input of `graph`: token ids below the vocabulary, floats in
/// [-0.5, 0.5) (small weights keep the loss smooth enough for finite differences).
fn leaves(graph: &Graph, vocab: usize, rng: &mut Rng) -> BTreeMap<String, Tensor> {
    graph
        .inputs
        .iter()
        .map(|&v| {
            let ty = graph.recorded_type(v).expect("typed input");
            let shape: Vec<usize> = ty
                .concrete_shape()
                .unwrap()
                .iter()
                .map(|&d| d as usize)
                .collect();
            let n: usize = shape.iter().product();
            let data = if ty.dtype == DType::I64 {
                (0..n).map(|_| (rng.next() % vocab as u64) as f64).collect()
            } else {
                (0..n).map(|_| rng.uniform(0.5)).collect()
            };
            let name = graph.value_name(v).to_string();
            (name, Tensor::new(Meta::new(ty.dtype, shape), data))
        })
        .collect()
}

/// `leaves` with element `i` of input `name` moved by `by`.
fn nudged(
    leaves: &BTreeMap<String, Tensor>,
    name: &str,
    i: usize,
    by: f64,
) -> BTreeMap<String, Tensor> {
    let mut out = leaves.clone();
    let t = &leaves[name];
    let mut data = t.data.to_vec();
    data[i] += by;
    out.insert(name.to_string(), Tensor::new(t.meta.clone(), data));
    out
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
    let graph = spec_graph(cfg);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let base = leaves(&graph, cfg.vocab, &mut rng);
    let out = outputs(&graph, &base);
    let loss = |l: &BTreeMap<String, Tensor>| outputs(&graph, l)["loss"].data[0];
    let params: Vec<String> = out
        .keys()
        .filter_map(|k| k.strip_suffix("_new").map(str::to_string))
        .collect();
    assert_eq!(params.len(), cfg.params(1, false).len(), "{params:?}");
    let h = 1e-5;
    let mut checked = 0;
    for p in &params {
        let value = &base[p];
        let new = &out[&format!("{p}_new")];
        // A few elements per parameter, spread over the tensor.
        let n = value.data.len();
        for i in [0, n / 3, n - 1] {
            let analytic = (value.data[i] - new.data[i]) / cfg.lr;
            let numeric =
                (loss(&nudged(&base, p, i, h)) - loss(&nudged(&base, p, i, -h))) / (2.0 * h);
            let err = (analytic - numeric).abs() / numeric.abs().max(1e-3);
            assert!(
                err < 1e-5,
                "{p}[{i}]: backward {analytic:e}, finite difference {numeric:e}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3 * params.len());
}

/// An independent Llama-3 forward in PyTorch (float64): `F.embedding`, RMSNorm, Hugging Face's
/// `rotate_half` RoPE, `repeat_interleave` for grouped-query attention,
/// `F.scaled_dot_product_attention(is_causal=True)`, SwiGLU, `F.cross_entropy`; autograd for
/// the gradients. Reads the inputs from the JSON file `argv[1]`, prints loss and gradients.
const TORCH_LLAMA: &str = r#"
import json, sys
import torch
import torch.nn.functional as F

d = json.load(open(sys.argv[1]))
c = d["config"]
def load(name, dtype=torch.float64):
    t = d["inputs"][name]
    return torch.tensor(t["data"], dtype=dtype).reshape(t["shape"])
tokens, labels = load("tokens", torch.long), load("labels", torch.long)
inv_freq = load("rope_inv_freq")
p = {n: load(n).requires_grad_() for n in d["params"]}
B, S, H = tokens.shape[0], tokens.shape[1], c["hidden"]
nh, nkv = c["heads"], c["kv_heads"]
hd = H // nh

def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]))

def rotate_half(x):
    return torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1)

angles = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
emb = torch.cat([angles, angles], -1)
cos, sin = emb.cos(), emb.sin()
x = F.embedding(tokens, p["embed"])
for l in range(c["layers"]):
    h = rms(x, p[f"attn_norm_{l}"])
    q = (h @ p[f"wq_{l}"].T).view(B, S, nh, hd).transpose(1, 2)
    k = (h @ p[f"wk_{l}"].T).view(B, S, nkv, hd).transpose(1, 2)
    v = (h @ p[f"wv_{l}"].T).view(B, S, nkv, hd).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + a.transpose(1, 2).reshape(B, S, nh * hd) @ p[f"wo_{l}"].T
    h = rms(x, p[f"mlp_norm_{l}"])
    x = x + (F.silu(h @ p[f"w_gate_{l}"].T) * (h @ p[f"w_up_{l}"].T)) @ p[f"w_down_{l}"].T
logits = rms(x, p["final_norm"]) @ p["lm_head"].T
loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
loss.backward()
print(json.dumps({"loss": loss.item(), "grads": {n: t.grad.flatten().tolist() for n, t in p.items()}}))
"#;

fn json_tensor(t: &Tensor) -> serde_json::Value {
    serde_json::json!({ "shape": t.shape(), "data": t.data.to_vec() })
}

#[test]
fn spec_matches_pytorch() {
    let Some(python) = common::oracle_python() else {
        eprintln!("skipped: SHARDPROOF_ORACLE_DIR is not set (scripts/test sets up the oracle)");
        return;
    };
    let cfg = LlamaConfig::default();
    let graph = spec_graph(&cfg);
    let mut rng = Rng(0x0dd_ba11);
    let base = leaves(&graph, cfg.vocab, &mut rng);
    let out = outputs(&graph, &base);
    let params: Vec<String> = cfg.params(1, false).into_iter().map(|p| p.name).collect();
    let inputs: serde_json::Map<String, serde_json::Value> = base
        .iter()
        .map(|(n, t)| (n.clone(), json_tensor(t)))
        .collect();
    let request = serde_json::json!({
        "config": {
            "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
            "layers": cfg.layers, "eps": cfg.eps,
        },
        "inputs": inputs,
        "params": params,
    });
    let torch = common::run_oracle(&python, TORCH_LLAMA, &request);
    let ours = out["loss"].data[0];
    let theirs = torch["loss"].as_f64().unwrap();
    assert!(
        (ours - theirs).abs() <= 1e-12 * theirs.abs(),
        "loss: ours {ours}, torch {theirs}"
    );
    for p in &params {
        let theirs: Vec<f64> = torch["grads"][p]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let ours: Vec<f64> = base[p]
            .data
            .iter()
            .zip(out[&format!("{p}_new")].data.iter())
            .map(|(w, new)| (w - new) / cfg.lr)
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{p}");
        let diff: f64 = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b) * (a - b))
            .sum();
        let norm: f64 = theirs.iter().map(|b| b * b).sum();
        assert!(
            diff.sqrt() <= 1e-9 * norm.sqrt().max(1e-12),
            "{p}: gradient differs from PyTorch's (relative error {:e})",
            diff.sqrt() / norm.sqrt()
        );
    }
}
