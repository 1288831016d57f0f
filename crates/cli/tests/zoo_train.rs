//! `shardproof zoo emit` with the rest of a real training iteration (`--optimizer adam`,
//! `--clip-grad`, `--loss-scale`, `--grad-accum`, `--zero`): for every model the correct plans
//! hold under `run` and `inspect --strict`, alone and combined; each training bug of the
//! catalog is found by `run` naming an output it changes, and refused without its flag; bad
//! flag combinations exit 2. The spec's optimizer math (loss scaling, global-norm clipping,
//! Adam with bias correction) is recomputed by hand from the SGD spec's gradients, and checked
//! against `torch.nn.utils.clip_grad_norm_` + `torch.optim.Adam` when the oracle suite is set
//! up (`SHARDPROOF_ORACLE_DIR`, as `scripts/test` sets it).

mod common;

use common::zoo::{assert_names_changed_output, catalog_bug};
use common::Scratch;
use shardproof_ir::{DType, Graph};
use shardproof_ops::{Meta, Tensor};
use shardproof_zoo::{
    emit_training, AdamConfig, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, Optimizer,
    TrainOptions,
};
use std::collections::BTreeMap;
use std::path::Path;

/// Emits `model` on `mesh` with the flags into `dir` and returns the case path.
fn emit(s: &Scratch, dir: &str, model: &str, mesh: &str, flags: &[&str]) -> String {
    // The MLP needs two layers for the backward all-reduce between layers; llama and gpt2 need
    // 4 sequences for two microbatches on each of 2 dp ranks.
    let sizes = if model == "mlp" {
        ["--layers", "2"]
    } else {
        ["--batch", "4"]
    };
    s.emit_model(dir, model, mesh, &[&sizes, flags].concat())
}

const MODELS: [&str; 3] = ["mlp", "llama", "gpt2"];

/// Correct plans: each flag alone, the combinations the issue names, and every ZeRO stage.
const PLANS: &[(&str, &[&str])] = &[
    ("tp=2", &["--optimizer", "adam"]),
    ("dp=2", &["--optimizer", "adam", "--adam-step", "3"]),
    ("tp=2", &["--clip-grad", "0.01"]),
    ("dp=2", &["--clip-grad", "0.01"]),
    ("tp=2", &["--loss-scale", "1024"]),
    ("dp=2", &["--grad-accum", "2"]),
    ("dp=2,tp=2", &["--grad-accum", "2"]),
    (
        "dp=2,tp=2",
        &[
            "--optimizer",
            "adam",
            "--clip-grad",
            "0.01",
            "--loss-scale",
            "1024",
        ],
    ),
    ("dp=2", &["--zero", "1"]),
    ("dp=2", &["--optimizer", "adam", "--zero", "1"]),
    ("dp=2", &["--optimizer", "adam", "--zero", "2"]),
    ("dp=2", &["--optimizer", "adam", "--zero", "3"]),
    ("dp=2,tp=2", &["--optimizer", "adam", "--zero", "1"]),
    ("dp=2,tp=2", &["--optimizer", "adam", "--zero", "2"]),
    ("dp=2,tp=2", &["--optimizer", "adam", "--zero", "3"]),
    (
        "dp=2,tp=2",
        &[
            "--optimizer",
            "adam",
            "--clip-grad",
            "0.01",
            "--loss-scale",
            "1024",
            "--grad-accum",
            "2",
            "--zero",
            "3",
        ],
    ),
    (
        "dp=2,tp=2",
        &["--clip-grad", "0.01", "--grad-accum", "2", "--zero", "2"],
    ),
    // ZeRO-1 clips by the norm of the rank's shards summed over dp, like ZeRO-2/3.
    (
        "dp=2,tp=2",
        &["--optimizer", "adam", "--clip-grad", "0.01", "--zero", "1"],
    ),
];

/// Every plan of `plans` (mesh, flags) of `model` holds under `run` and `inspect --strict`.
fn check_plans(model: &str, plans: &[(&str, &[&str])]) {
    let s = Scratch::new();
    for (i, (mesh, flags)) in plans.iter().enumerate() {
        let case = emit(&s, &i.to_string(), model, mesh, flags);
        s.assert_holds_strictly(&case);
    }
}

#[test]
fn mlp_training_plans_hold() {
    check_plans("mlp", PLANS);
}

#[test]
fn llama_training_plans_hold() {
    check_plans("llama", PLANS);
    // The vocab-parallel embedding and LM head, split over dp too by ZeRO.
    check_plans(
        "llama",
        &[(
            "dp=2,tp=2",
            &[
                "--vocab-parallel",
                "--optimizer",
                "adam",
                "--clip-grad",
                "0.01",
                "--zero",
                "2",
            ],
        )],
    );
}

#[test]
fn gpt2_training_plans_hold() {
    check_plans("gpt2", PLANS);
    // Sequence parallelism: the LayerNorm gradients are synchronized before the clipping norm.
    check_plans(
        "gpt2",
        &[(
            "dp=2,tp=2",
            &[
                "--sequence-parallel",
                "--optimizer",
                "adam",
                "--clip-grad",
                "0.01",
                "--grad-accum",
                "2",
                "--zero",
                "3",
            ],
        )],
    );
}

/// Each training bug on the plans that need it: (bug, mesh, flags).
const BUG_PLANS: &[(&str, &str, &[&str])] = &[
    ("grad-accum-loss-not-scaled", "dp=2", &["--grad-accum", "2"]),
    (
        "grad-accum-loss-not-scaled",
        "tp=2",
        &["--optimizer", "adam", "--grad-accum", "2"],
    ),
    ("zero-param-update-skipped", "dp=2", &["--zero", "1"]),
    (
        "zero-param-update-skipped",
        "dp=2,tp=2",
        &["--optimizer", "adam", "--zero", "2"],
    ),
    (
        "zero-param-update-skipped",
        "dp=2,tp=2",
        &["--optimizer", "adam", "--zero", "3"],
    ),
    (
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "0.01"],
    ),
    (
        "grad-norm-replicated-overcounted",
        "dp=2,tp=2",
        &["--optimizer", "adam", "--clip-grad", "0.01", "--zero", "3"],
    ),
    ("loss-scale-not-unscaled", "dp=2", &["--loss-scale", "1024"]),
    (
        "loss-scale-not-unscaled",
        "dp=2,tp=2",
        &["--optimizer", "adam", "--loss-scale", "1024"],
    ),
];

#[test]
fn training_bugs_are_found() {
    let s = Scratch::new();
    for model in MODELS {
        for (i, (id, mesh, flags)) in BUG_PLANS.iter().enumerate() {
            let what = format!("{model} {mesh} {flags:?} --bug {id}");
            let mut with_bug = flags.to_vec();
            with_bug.extend(["--bug", id]);
            let case = emit(&s, &format!("{model}-{i}"), model, mesh, &with_bug);
            s.assert_strict(&case);
            let (out, first) = s.run_mismatch(&case);
            assert_names_changed_output(catalog_bug(id), &first, &what, &out);
            if *id == "zero-param-update-skipped" {
                // The optimizer states are updated; only the parameter is stale.
                assert!(!first.starts_with("exp_avg"), "{what}: {first}");
            }
        }
    }
}

#[test]
fn training_bugs_need_their_flag() {
    let s = Scratch::new();
    for (id, mesh, flag) in [
        ("grad-accum-loss-not-scaled", "dp=2", "--grad-accum"),
        ("zero-param-update-skipped", "dp=2", "--zero"),
        ("grad-norm-replicated-overcounted", "tp=2", "--clip-grad"),
        ("loss-scale-not-unscaled", "tp=2", "--loss-scale"),
    ] {
        s.zoo_emit("refused", &["mlp", "--mesh", mesh, "--bug", id])
            .expect_code(2)
            .stderr_has(&[id, flag]);
    }
    // Clipping without tp has no replicas to over-count.
    s.assert_emit_refused(
        "mlp --bug grad-norm-replicated-overcounted --mesh dp=2 --clip-grad 1",
        "tp mesh dim",
    );
}

#[test]
fn invalid_training_requests_exit_2() {
    let s = Scratch::new();
    for (request, word) in [
        (
            "mlp --forward-only --optimizer adam",
            "--optimizer adam need the full iteration",
        ),
        ("mlp --mesh tp=2 --zero 1", "dp mesh dim"),
        ("mlp --mesh dp=2 --zero 4", "--zero"),
        (
            "mlp --mesh dp=2 --grad-accum 3",
            "not divisible into --grad-accum 3",
        ),
        ("mlp --grad-accum 0", "at least one microbatch"),
        (
            "mlp --mesh dp=3 --batch 6 --zero 2",
            "nothing would be split",
        ),
        ("mlp --clip-grad=-1", "positive"),
        ("mlp --loss-scale 0", "positive"),
        (
            "mlp --adam-step 2",
            "--adam-step applies to --optimizer adam",
        ),
        ("mlp --optimizer adam --adam-step 0", "step >= 1"),
        ("llama --mesh dp=2,tp=4 --zero 1", "kv heads replicated"),
        ("mlp --optimizer lion", "--optimizer"),
    ] {
        s.assert_emit_refused(request, word);
    }
}

#[test]
fn list_shows_the_training_options() {
    Scratch::new()
        .run(&["zoo", "list"])
        .expect_code(0)
        .stdout_has(&[
            "training",
            "--optimizer sgd|adam",
            "--clip-grad MAXNORM",
            "--loss-scale S",
            "--grad-accum M",
            "--zero 1|2|3",
        ]);
}

// ---------------------------------------------------------------------------------------------
// The optimizer math of the spec.

/// A tiny MLP: every tensor a few elements; lr 1 keeps `(w - w_new) / lr` free of cancellation.
fn tiny() -> MlpConfig {
    MlpConfig {
        hidden: 3,
        ffn: 4,
        batch: 2,
        layers: 1,
        lr: 1.0,
    }
}

/// The spec of the tiny MLP trained with `train`.
fn spec(train: &TrainOptions) -> Graph {
    let opts = EmitOptions {
        model: "mlp".into(),
        mlp: tiny(),
        llama: LlamaConfig::default(),
        mesh: Mesh::parse("tp=1").unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    let emitted = emit_training(&opts, &EmitExtras::default(), train).unwrap();
    let text = &emitted
        .files
        .iter()
        .find(|(n, _)| n == "spec.py")
        .unwrap()
        .1;
    shardproof_import::parse_fx(text, Path::new("spec.py"))
        .unwrap()
        .graph
}

/// Deterministic values for the inputs of the tiny MLP's spec (a different phase per input),
/// with Adam's states; second moments non-negative, as Adam keeps them.
fn inputs() -> BTreeMap<String, Tensor> {
    let cfg = tiny();
    let data = vec![cfg.batch, cfg.hidden];
    let mut shapes = vec![
        ("x".to_string(), data.clone()),
        ("target".to_string(), data),
    ];
    let params = cfg.params();
    shapes.extend(params.iter().map(|p| (p.name.clone(), p.shape.clone())));
    for state in ["exp_avg", "exp_avg_sq"] {
        shapes.extend(
            params
                .iter()
                .map(|p| (format!("{state}_{}", p.name), p.shape.clone())),
        );
    }
    shapes
        .into_iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let n: usize = shape.iter().product();
            let values = (0..n)
                .map(|i| {
                    let x = ((i * 31 + k * 17) as f64 * 0.7).sin() * 0.8;
                    if name.starts_with("exp_avg_sq_") {
                        x.abs() * 0.01
                    } else {
                        x
                    }
                })
                .collect();
            (name, Tensor::new(Meta::new(DType::F32, shape), values))
        })
        .collect()
}

fn run_spec(graph: &Graph, leaves: &BTreeMap<String, Tensor>) -> BTreeMap<String, Vec<f64>> {
    common::graph_outputs(graph, leaves)
        .into_iter()
        .map(|(name, t)| (name, t.data.to_vec()))
        .collect()
}

/// The parameters' gradients, from the SGD spec: `grad = (w - w_new) / lr`.
fn gradients(leaves: &BTreeMap<String, Tensor>) -> BTreeMap<String, Vec<f64>> {
    let sgd = spec(&TrainOptions::default());
    let own: BTreeMap<String, Tensor> = leaves
        .iter()
        .filter(|(n, _)| !n.starts_with("exp_avg"))
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    let out = run_spec(&sgd, &own);
    tiny()
        .params()
        .iter()
        .map(|p| {
            let w = &leaves[&p.name].data;
            let new = &out[&format!("{}_new", p.name)];
            let lr = tiny().lr;
            let g = w.iter().zip(new).map(|(w, n)| (w - n) / lr).collect();
            (p.name.clone(), g)
        })
        .collect()
}

/// Adam at `step` with the loss scale `scale` (no clipping yet).
fn adam_probe(step: u32, scale: f64) -> (AdamConfig, TrainOptions) {
    let adam = AdamConfig {
        step,
        ..AdamConfig::default()
    };
    let train = TrainOptions {
        optimizer: Optimizer::Adam(adam),
        loss_scale: Some(scale),
        ..TrainOptions::default()
    };
    (adam, train)
}

type Values = BTreeMap<String, Vec<f64>>;

/// The spec's inputs, the plain gradients there and their global norm.
fn plain_gradients() -> (BTreeMap<String, Tensor>, Values, f64) {
    let leaves = inputs();
    let grads = gradients(&leaves);
    let norm = grads.values().flatten().map(|g| g * g).sum::<f64>().sqrt();
    (leaves, grads, norm)
}

#[track_caller]
fn assert_close(ours: &[f64], want: &[f64], what: &str) {
    assert_eq!(ours.len(), want.len(), "{what}");
    for (i, (a, b)) in ours.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{what}[{i}]: spec {a}, expected {b}"
        );
    }
}

/// The spec's loss scaling, clipping and Adam step agree with the formulas, computed here from
/// the plain gradients: `coef = min(1, max / (norm + 1e-6))`, `m' = b1 m + (1 - b1) g`,
/// `v' = b2 v + (1 - b2) g^2`, `w' = w - lr / (1 - b1^t) * m' / (sqrt(v' / (1 - b2^t)) + eps)`.
#[test]
fn spec_adam_clipping_and_loss_scaling_match_the_formulas() {
    let (adam, base) = adam_probe(3, 1000.0);
    let (leaves, grads, norm) = plain_gradients();
    // Clipping active (half the norm) and inactive (twice the norm).
    for max_norm in [norm / 2.0, norm * 2.0] {
        let train = TrainOptions {
            clip_grad: Some(max_norm),
            ..base
        };
        let out = run_spec(&spec(&train), &leaves);
        let coef = (max_norm / (norm + 1e-6)).min(1.0);
        let t = adam.step as i32;
        let (bias1, bias2) = (1.0 - adam.beta1.powi(t), 1.0 - adam.beta2.powi(t));
        for p in tiny().params() {
            let n = &p.name;
            let at = |k: &str, i: usize| leaves[k].data[i];
            let mut want = (Vec::new(), Vec::new(), Vec::new());
            for (i, g) in grads[n].iter().enumerate() {
                let g = g * coef;
                let m = adam.beta1 * at(&format!("exp_avg_{n}"), i) + (1.0 - adam.beta1) * g;
                let v = adam.beta2 * at(&format!("exp_avg_sq_{n}"), i) + (1.0 - adam.beta2) * g * g;
                let denom = (v / bias2).sqrt() + adam.eps;
                want.0.push(at(n, i) - tiny().lr / bias1 * m / denom);
                want.1.push(m);
                want.2.push(v);
            }
            let what = format!("{n} (max norm {max_norm})");
            assert_close(&out[&format!("{n}_new")], &want.0, &what);
            assert_close(&out[&format!("exp_avg_{n}_new")], &want.1, &what);
            assert_close(&out[&format!("exp_avg_sq_{n}_new")], &want.2, &what);
        }
    }
}

/// PyTorch's clipping and Adam step on the same parameters, gradients and states: prints the
/// updated parameters and states as JSON.
const TORCH_STEP: &str = r#"
import json, sys
import torch

d = json.load(open(sys.argv[1]))
def t(v):
    return torch.tensor(v["data"], dtype=torch.float64).reshape(v["shape"])
params = []
opt_params = {}
for name, p in d["params"].items():
    w = t(p["value"]).requires_grad_()
    w.grad = t(p["grad"])
    params.append(w)
    opt_params[name] = (w, p)
opt = torch.optim.Adam(params, lr=d["lr"], betas=(d["beta1"], d["beta2"]), eps=d["eps"])
for name, (w, p) in opt_params.items():
    opt.state[w] = {
        "step": torch.tensor(float(d["step"] - 1)),
        "exp_avg": t(p["exp_avg"]),
        "exp_avg_sq": t(p["exp_avg_sq"]),
    }
torch.nn.utils.clip_grad_norm_(params, d["max_norm"])
with torch.no_grad():
    opt.step()
out = {}
for name, (w, p) in opt_params.items():
    s = opt.state[w]
    out[name] = {"new": w.detach().flatten().tolist(),
                 "exp_avg": s["exp_avg"].flatten().tolist(),
                 "exp_avg_sq": s["exp_avg_sq"].flatten().tolist()}
print(json.dumps(out))
"#;

#[test]
fn spec_optimizer_step_matches_pytorch() {
    let Some(python) = common::oracle_python() else {
        eprintln!("skipped: SHARDPROOF_ORACLE_DIR is not set (scripts/test sets up the oracle)");
        return;
    };
    let (adam, probe) = adam_probe(2, 512.0);
    let (leaves, grads, norm) = plain_gradients();
    let train = TrainOptions {
        clip_grad: Some(norm / 3.0),
        ..probe
    };
    let out = run_spec(&spec(&train), &leaves);
    let json =
        |v: &[f64], like: &str| serde_json::json!({ "shape": leaves[like].shape(), "data": v });
    let params: serde_json::Map<String, serde_json::Value> = tiny()
        .params()
        .iter()
        .map(|p| {
            let n = &p.name;
            let m = format!("exp_avg_{n}");
            let v = format!("exp_avg_sq_{n}");
            let entry = serde_json::json!({
                "value": json(&leaves[n].data, n),
                "grad": json(&grads[n], n),
                "exp_avg": json(&leaves[&m].data, n),
                "exp_avg_sq": json(&leaves[&v].data, n),
            });
            (n.clone(), entry)
        })
        .collect();
    let request = serde_json::json!({
        "params": params, "lr": tiny().lr, "beta1": adam.beta1, "beta2": adam.beta2,
        "eps": adam.eps, "step": adam.step, "max_norm": norm / 3.0,
    });
    let torch = common::run_oracle(&python, TORCH_STEP, &request);
    for p in tiny().params() {
        let n = &p.name;
        let theirs = |k: &str| -> Vec<f64> {
            torch[n][k]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        assert_close(&out[&format!("{n}_new")], &theirs("new"), n);
        assert_close(&out[&format!("exp_avg_{n}_new")], &theirs("exp_avg"), n);
        assert_close(
            &out[&format!("exp_avg_sq_{n}_new")],
            &theirs("exp_avg_sq"),
            n,
        );
    }
}
