//! Checks that a zoo model's spec is the model it claims to be, shared by the zoo tests: its
//! explicit backward against central finite differences of its own loss (run by the reference
//! interpreter in f64), and its loss and gradients against an independent PyTorch
//! implementation (float64, autograd) when the oracle suite is set up.

use shardproof_ir::{DType, Graph};
use shardproof_ops::{Meta, Tensor};
use shardproof_zoo::{emit_with, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig};
use std::collections::BTreeMap;

/// A small deterministic generator (xorshift64*): the tests need no seed plumbing.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-scale, scale).
    pub fn uniform(&mut self, scale: f64) -> f64 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
    }
}

/// The full-iteration spec of `model` with the sizes of `llama` (the llama model's) and
/// `extras` (the others'), emitted for `mesh` (the spec does not depend on it).
pub fn spec_graph_of(model: &str, mesh: &str, llama: LlamaConfig, extras: &EmitExtras) -> Graph {
    let opts = EmitOptions {
        model: model.into(),
        mlp: MlpConfig::default(),
        llama,
        mesh: Mesh::parse(mesh).unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    let emitted = emit_with(&opts, extras).unwrap();
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
pub fn leaves(graph: &Graph, vocab: usize, rng: &mut Rng) -> BTreeMap<String, Tensor> {
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
pub fn nudged(
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

/// Checks that every `<param>_new` output of the full-iteration spec `graph` is
/// `param - lr * d loss / d param`, on three elements per parameter, against central finite
/// differences of the output `loss` (inputs drawn from `seed`); `params` is the number of
/// parameters the model has.
pub fn check_gradients(graph: &Graph, vocab: usize, lr: f64, params: usize, seed: u64) {
    let mut rng = Rng(seed);
    let base = leaves(graph, vocab, &mut rng);
    let out = super::graph_outputs(graph, &base);
    let loss = |l: &BTreeMap<String, Tensor>| super::graph_outputs(graph, l)["loss"].data[0];
    let names: Vec<String> = out
        .keys()
        .filter_map(|k| k.strip_suffix("_new").map(str::to_string))
        .collect();
    assert_eq!(names.len(), params, "{names:?}");
    let h = 1e-5;
    let mut checked = 0;
    for p in &names {
        let value = &base[p];
        let new = &out[&format!("{p}_new")];
        // A few elements per parameter, spread over the tensor.
        let n = value.data.len();
        for i in [0, n / 3, n - 1] {
            let analytic = (value.data[i] - new.data[i]) / lr;
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
    assert_eq!(checked, 3 * names.len());
}

/// The oracle suite's Python when the suite is set up (see [`super::oracle_python`]); says
/// that the test is skipped otherwise.
pub fn oracle_python() -> Option<std::path::PathBuf> {
    let python = super::oracle_python();
    if python.is_none() {
        eprintln!("skipped: SHARDPROOF_ORACLE_DIR is not set (scripts/test sets up the oracle)");
    }
    python
}

fn json_tensor(t: &Tensor) -> serde_json::Value {
    serde_json::json!({ "shape": t.shape(), "data": t.data.to_vec() })
}

/// The start of every PyTorch oracle script: reads the request (JSON file `argv[1]`: `config`,
/// `inputs`, `params`), loads `tokens`, `labels` and the parameters `p` (float64, requiring
/// gradients), and defines `report(loss)`, which prints the loss and the gradients.
pub const TORCH_HEADER: &str = r#"
import json, sys
import torch
import torch.nn.functional as F

d = json.load(open(sys.argv[1]))
c = d["config"]
def load(name, dtype=torch.float64):
    t = d["inputs"][name]
    return torch.tensor(t["data"], dtype=dtype).reshape(t["shape"])
tokens, labels = load("tokens", torch.long), load("labels", torch.long)
p = {n: load(n).requires_grad_() for n in d["params"]}

def report(loss):
    loss.backward()
    grads = {n: t.grad.flatten().tolist() for n, t in p.items()}
    print(json.dumps({"loss": loss.item(), "grads": grads}))
"#;

/// After [`TORCH_HEADER`], the Llama-3 pieces the llama and deepseek oracles share: `rms`,
/// Hugging Face's `rotate_half` RoPE, `attention(x, l)` (layer `l`'s RMSNorm, q/k/v,
/// grouped-query attention by `repeat_interleave`, `F.scaled_dot_product_attention` with
/// `is_causal=True`, o and the residual) and `lm_loss(x)` (final norm, LM head,
/// `F.cross_entropy`).
pub const TORCH_LLAMA_PIECES: &str = r#"
inv_freq = load("rope_inv_freq")
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

def attention(x, l):
    h = rms(x, p[f"attn_norm_{l}"])
    q = (h @ p[f"wq_{l}"].T).view(B, S, nh, hd).transpose(1, 2)
    k = (h @ p[f"wk_{l}"].T).view(B, S, nkv, hd).transpose(1, 2)
    v = (h @ p[f"wv_{l}"].T).view(B, S, nkv, hd).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return x + a.transpose(1, 2).reshape(B, S, nh * hd) @ p[f"wo_{l}"].T

def lm_loss(x):
    logits = rms(x, p["final_norm"]) @ p["lm_head"].T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
"#;

/// An independent implementation to compare a spec with.
pub struct Torch<'a> {
    /// The Python's oracle interpreter.
    pub python: &'a std::path::Path,
    /// The script: [`TORCH_HEADER`], then the model computing the loss and `report(loss)`.
    pub script: String,
    /// The `config` object handed to it.
    pub config: serde_json::Value,
    /// Gradients within `1e-9` of PyTorch's relative to their norm, or to this floor when
    /// the norm is smaller (a gradient that is exactly zero is rounding noise on both sides).
    pub norm_floor: f64,
}

impl Torch<'_> {
    /// Runs the spec `graph` and the script on the same random inputs (from `seed`) and
    /// checks that the losses agree within 1e-12 and every gradient (read from the SGD step
    /// with learning rate `lr`) of `params` within 1e-9, relative.
    pub fn check(&self, graph: &Graph, vocab: usize, lr: f64, params: &[String], seed: u64) {
        let mut rng = Rng(seed);
        let base = leaves(graph, vocab, &mut rng);
        let out = super::graph_outputs(graph, &base);
        let inputs: serde_json::Map<String, serde_json::Value> = base
            .iter()
            .map(|(n, t)| (n.clone(), json_tensor(t)))
            .collect();
        let request = serde_json::json!({
            "config": self.config,
            "inputs": inputs,
            "params": params,
        });
        let torch = super::run_oracle(self.python, &self.script, &request);
        let ours = out["loss"].data[0];
        let theirs = torch["loss"].as_f64().unwrap();
        assert!(
            (ours - theirs).abs() <= 1e-12 * theirs.abs(),
            "loss: ours {ours}, torch {theirs}"
        );
        for p in params {
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
                .map(|(w, new)| (w - new) / lr)
                .collect();
            assert_eq!(ours.len(), theirs.len(), "{p}");
            let diff: f64 = ours
                .iter()
                .zip(&theirs)
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            let norm: f64 = theirs.iter().map(|b| b * b).sum();
            assert!(
                diff.sqrt() <= 1e-9 * norm.sqrt().max(self.norm_floor),
                "{p}: gradient differs from PyTorch's (relative error {:e})",
                diff.sqrt() / norm.sqrt()
            );
        }
    }
}
