//! `shardproof zoo emit gpt2`: every correct plan (dp, tp, dp x tp, with and without sequence
//! parallelism, forward-only and full iteration) holds under `run` and `inspect --strict`;
//! every applicable catalog bug is found naming an output it changes. The spec itself is a
//! faithful GPT-2: its explicit backward matches central finite differences (always) and its
//! loss and gradients match an independent PyTorch implementation (float64, autograd) when the
//! oracle suite is set up (`SHARDPROOF_ORACLE_DIR`, as `scripts/test` sets it).

mod common;

use common::graph_outputs as outputs;

use shardproof_ir::{DType, Graph};
use shardproof_ops::{Meta, Tensor};
use shardproof_zoo::{
    emit_with, EmitExtras, EmitOptions, Gpt2Config, LlamaConfig, Mesh, MlpConfig, Site, BUGS,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

fn shardproof(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(args)
        .output()
        .expect("run shardproof")
}

#[track_caller]
fn expect(o: &Output, code: i32, what: &str) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Emits a gpt2 case into `dir` with the flags (and bug) and returns the case path.
fn emit(dir: &Path, mesh: &str, flags: &[&str], bug: Option<&str>) -> String {
    let mut args = vec![
        "zoo",
        "emit",
        "gpt2",
        "--mesh",
        mesh,
        "-o",
        dir.to_str().unwrap(),
    ];
    args.extend(flags);
    if let Some(b) = bug {
        args.extend(["--bug", b]);
    }
    expect(&shardproof(&args), 0, &format!("{args:?}"));
    dir.join("case.yaml").to_str().unwrap().to_string()
}

/// The correct plans hold; each applicable bug is found, naming the loss when it changes the
/// loss and an updated parameter otherwise. Returns the number of bugs planted.
fn check_plans(meshes: &[(&str, usize, usize)], sequence_parallel: bool) -> usize {
    let mut planted = 0;
    for &(mesh, dp, tp) in meshes {
        for forward_only in [true, false] {
            let mut flags = Vec::new();
            if forward_only {
                flags.push("--forward-only");
            }
            if sequence_parallel {
                flags.push("--sequence-parallel");
            }
            let tmp = tempfile::tempdir().unwrap();
            let what = format!("gpt2, mesh {mesh}, flags {flags:?}");
            let case = emit(&tmp.path().join("ok"), mesh, &flags, None);
            let out = expect(&shardproof(&["run", &case]), 0, &what);
            assert!(out.contains("verdict: holds"), "{what}\n{out}");
            expect(&shardproof(&["inspect", "--strict", &case]), 0, &what);
            let site = Site {
                model: "gpt2",
                dp,
                tp,
                forward_only,
                kv_replicated: false,
                vocab_parallel: false,
                sequence_parallel,
            };
            for bug in BUGS {
                if bug.check_applies(&site).is_err() {
                    continue;
                }
                planted += 1;
                let what = format!("{what}, bug {}", bug.id);
                let case = emit(&tmp.path().join(bug.id), mesh, &flags, Some(bug.id));
                let out = expect(&shardproof(&["run", &case]), 1, &what);
                let first = out
                    .split("first mismatching output `")
                    .nth(1)
                    .and_then(|r| r.split('`').next())
                    .unwrap_or_else(|| panic!("{what}: no mismatching output named\n{out}"));
                if bug.changes_loss {
                    assert_eq!(first, "loss", "{what}\n{out}");
                } else {
                    assert!(first.ends_with("_new"), "{what}\n{out}");
                }
            }
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
    // bugs, which need training flags, in zoo_train.rs).
    for bug in BUGS
        .iter()
        .filter(|b| b.models.contains(&"gpt2") && !b.needs_training())
    {
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
    let tmp = tempfile::tempdir().unwrap();
    emit(tmp.path(), "tp=2", &["--sequence-parallel"], None);
    let r1 = std::fs::read_to_string(tmp.path().join("r1.py")).unwrap();
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
    let out = tmp.path().join("bad");
    let o = shardproof(&[
        "zoo",
        "emit",
        "llama",
        "--sequence-parallel",
        "-o",
        out.to_str().unwrap(),
    ]);
    expect(&o, 2, "llama --sequence-parallel is refused");
    let o = shardproof(&[
        "zoo",
        "emit",
        "gpt2",
        "--mesh",
        "tp=3",
        "--sequence-parallel",
        "-o",
        out.to_str().unwrap(),
    ]);
    expect(&o, 2, "heads 4 over tp=3 is refused");
    let o = shardproof(&[
        "zoo",
        "emit",
        "gpt2",
        "--mesh",
        "tp=2",
        "--seq",
        "5",
        "--sequence-parallel",
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("seq 5 is not divisible"), "{err}");
    let o = shardproof(&[
        "zoo",
        "emit",
        "gpt2",
        "--kv-heads",
        "2",
        "-o",
        out.to_str().unwrap(),
    ]);
    expect(&o, 2, "--kv-heads is llama only");
}

#[test]
fn gpt2_sizes_are_configurable() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let args = [
        "zoo",
        "emit",
        "gpt2",
        "--mesh",
        "dp=2,tp=2",
        "--sequence-parallel",
        "--hidden",
        "24",
        "--heads",
        "6",
        "--ffn",
        "20",
        "--layers",
        "1",
        "--seq",
        "6",
        "--batch",
        "4",
        "--vocab",
        "11",
        "-o",
        out,
    ];
    expect(&shardproof(&args), 0, "emit");
    let spec = std::fs::read_to_string(tmp.path().join("spec.py")).unwrap();
    assert!(
        spec.contains("tokens: \"i64[4, 6]\"")
            && spec.contains("wte: \"f32[11, 24]\"")
            && spec.contains("wpe: \"f32[6, 24]\""),
        "{spec}"
    );
    let rank = std::fs::read_to_string(tmp.path().join("r0.py")).unwrap();
    assert!(
        rank.contains("wq_0: \"f32[12, 24]\"") && rank.contains("fc1_w_0: \"f32[10, 24]\""),
        "{rank}"
    );
    let case = tmp.path().join("case.yaml");
    expect(&shardproof(&["run", case.to_str().unwrap()]), 0, "run");
}

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

fn spec_graph(cfg: &Gpt2Config) -> Graph {
    let opts = EmitOptions {
        model: "gpt2".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig::default(),
        mesh: Mesh::parse("tp=2").unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    let extras = EmitExtras {
        gpt2: cfg.clone(),
        sequence_parallel: false,
    };
    let emitted = emit_with(&opts, &extras).unwrap();
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
    let graph = spec_graph(cfg);
    let mut rng = Rng(0x5eed_1234_abcd_0002);
    let base = leaves(&graph, cfg.vocab, &mut rng);
    let out = outputs(&graph, &base);
    let loss = |l: &BTreeMap<String, Tensor>| outputs(&graph, l)["loss"].data[0];
    let params: Vec<String> = out
        .keys()
        .filter_map(|k| k.strip_suffix("_new").map(str::to_string))
        .collect();
    assert_eq!(params.len(), cfg.params().len(), "{params:?}");
    let h = 1e-5;
    let mut checked = 0;
    for p in &params {
        let value = &base[p];
        let new = &out[&format!("{p}_new")];
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

/// An independent GPT-2 forward in PyTorch (float64): `F.embedding` of tokens and positions,
/// `F.layer_norm`, `F.linear` with biases, `F.scaled_dot_product_attention(is_causal=True)`,
/// exact `F.gelu`, the LM head tied to the token embedding, `F.cross_entropy`; autograd for the
/// gradients. Reads the inputs from the JSON file `argv[1]`, prints loss and gradients.
const TORCH_GPT2: &str = r#"
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
    let cfg = Gpt2Config::default();
    let graph = spec_graph(&cfg);
    let mut rng = Rng(0x0dd_ba12);
    let base = leaves(&graph, cfg.vocab, &mut rng);
    let out = outputs(&graph, &base);
    let params: Vec<String> = cfg.params().into_iter().map(|p| p.name).collect();
    let inputs: serde_json::Map<String, serde_json::Value> = base
        .iter()
        .map(|(n, t)| (n.clone(), json_tensor(t)))
        .collect();
    let request = serde_json::json!({
        "config": {
            "hidden": cfg.hidden, "heads": cfg.heads, "layers": cfg.layers, "eps": cfg.eps,
        },
        "inputs": inputs,
        "params": params,
    });
    let torch = common::run_oracle(&python, TORCH_GPT2, &request);
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
        // The key bias's gradient is exactly zero (it adds the same `q . bk` to every score of
        // a row, which softmax ignores): both sides are rounding noise there, so the bound has
        // an absolute floor.
        assert!(
            diff.sqrt() <= 1e-9 * norm.sqrt().max(1e-6),
            "{p}: gradient differs from PyTorch's (relative error {:e})",
            diff.sqrt() / norm.sqrt()
        );
    }
}
