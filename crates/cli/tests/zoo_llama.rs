//! The llama spec's explicit backward is the true gradient of its loss: every `<param>_new`
//! output of the full iteration is `param - lr * d loss / d param`, checked element by element
//! against central finite differences of the loss, run by the reference interpreter in f64.
//! (`run` only compares spec and ranks with each other; this checks the spec itself.)

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

fn outputs(graph: &Graph, leaves: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    let env = shardproof_interp::run_graph(graph, leaves, &Default::default()).unwrap();
    graph
        .outputs
        .iter()
        .flatten()
        .map(|&v| {
            (
                graph.value_name(v).to_string(),
                env.get(v).expect("computed").clone(),
            )
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
    let cfg = LlamaConfig::default();
    let graph = spec_graph(&cfg);
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
