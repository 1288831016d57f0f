//! PyTorch as the oracle of the importer, the registry's shape inference and the reference
//! interpreter, one ATen operator at a time.
//!
//! Reads `$SHARDPROOF_ORACLE_DIR/ops/manifest.json` (written by `python/capture.py`): for every
//! case, a graph printed by torch.export (`<case>.py`) and a safetensors file with its inputs
//! (`input.<placeholder>`) and PyTorch's outputs (`output.<i>`).

mod common;

use common::{check_shapes, fixture_dir, graph_ops, load_tensors, read_json};
use serde_json::Value;
use shardproof_interp::{run_graph, Precision, RunConfig};
use shardproof_ops::Tensor;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Relative Frobenius error allowed for float outputs.
const TOL: f64 = 1e-6;
/// Distinct ATen operators that must have been compared successfully.
const MIN_OPS: usize = 60;

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn cases(dir: &Path) -> Vec<Value> {
    let manifest = read_json(&dir.join("manifest.json"));
    let cases = manifest["cases"]
        .as_array()
        .expect("manifest.cases")
        .clone();
    assert!(!cases.is_empty(), "the manifest lists no cases");
    cases
}

/// Compares one output: `Ok(relative error)` within tolerance (0 for exact matches), or why not.
fn compare(got: &Tensor, want: &Tensor) -> Result<f64, String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, torch {:?}", got.shape(), want.shape()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, torch {}", got.dtype(), want.dtype()));
    }
    if !want.dtype().is_float() {
        let bad: Vec<usize> = (0..want.numel())
            .filter(|&i| got.data[i] != want.data[i])
            .collect();
        return match bad.first() {
            None => Ok(0.0),
            Some(&i) => Err(format!(
                "{} of {} elements differ; first at flat index {i}: {} vs torch {}",
                bad.len(),
                want.numel(),
                got.data[i],
                want.data[i]
            )),
        };
    }
    let (mut diff2, mut norm2) = (0.0f64, 0.0f64);
    for (i, (&a, &b)) in got.data.iter().zip(want.data.iter()).enumerate() {
        if a == b || (a.is_nan() && b.is_nan()) {
            if b.is_finite() {
                norm2 += b * b;
            }
            continue;
        }
        if !a.is_finite() || !b.is_finite() {
            return Err(format!("flat index {i}: {a} vs torch {b}"));
        }
        diff2 += (a - b) * (a - b);
        norm2 += b * b;
    }
    let rel = if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    };
    if rel <= TOL {
        Ok(rel)
    } else {
        Err(format!("relative Frobenius error {rel:.3e} > {TOL:e}"))
    }
}

/// The outcome of one case.
struct Outcome {
    name: String,
    ops: Vec<String>,
    strict: bool,
    max_err: f64,
    problems: Vec<String>,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

fn run_case(dir: &Path, case: &Value) -> Outcome {
    let name = case["name"].as_str().unwrap_or("?").to_string();
    let mut out = Outcome {
        name: name.clone(),
        ops: str_list(&case["ops"]),
        strict: case["strict"].as_bool().unwrap_or(true),
        max_err: 0.0,
        problems: Vec::new(),
    };
    let graph_path = dir.join(case["graph"].as_str().unwrap_or_default());
    let graph = match shardproof_import::load_graph(&graph_path) {
        Ok(g) => g,
        Err(e) => {
            out.problems.push(format!("import: {e}"));
            return out;
        }
    };
    let tensors = match load_tensors(&dir.join(case["tensors"].as_str().unwrap_or_default())) {
        Ok(t) => t,
        Err(e) => {
            out.problems.push(format!("fixture: {e}"));
            return out;
        }
    };
    let leaves: BTreeMap<String, Tensor> = tensors
        .iter()
        .filter_map(|(k, t)| k.strip_prefix("input.").map(|n| (n.to_string(), t.clone())))
        .collect();
    for p in check_shapes(&graph, &leaves) {
        out.problems.push(format!("shape: {p}"));
    }
    let precision = match case["precision"].as_str() {
        Some("native") => Precision::Native,
        _ => Precision::F64,
    };
    let cfg = RunConfig {
        precision,
        ..Default::default()
    };
    let env = match catch_unwind(AssertUnwindSafe(|| run_graph(&graph, &leaves, &cfg))) {
        Ok(Ok(env)) => env,
        Ok(Err(e)) => {
            out.problems.push(format!("run: {e}"));
            return out;
        }
        Err(p) => {
            out.problems
                .push(format!("run panicked: {}", panic_message(p.as_ref())));
            return out;
        }
    };
    let n_out = tensors.keys().filter(|k| k.starts_with("output.")).count();
    if graph.outputs.len() != n_out {
        out.problems.push(format!(
            "the graph returns {} values, torch returned {n_out}",
            graph.outputs.len()
        ));
    }
    for (i, v) in graph.outputs.iter().enumerate() {
        let Some(want) = tensors.get(&format!("output.{i}")) else {
            continue;
        };
        let got = match v.and_then(|v| env.get(v)) {
            Some(t) => t,
            None => {
                out.problems.push(format!("output {i}: not computed"));
                continue;
            }
        };
        match compare(got, want) {
            Ok(e) => out.max_err = out.max_err.max(e),
            Err(e) => out.problems.push(format!("output {i}: {e}")),
        }
    }
    out
}

/// Every per-operator graph runs in the interpreter and reproduces PyTorch's outputs.
#[test]
fn ops_match_torch() {
    let Some(dir) = fixture_dir("ops", "manifest.json") else {
        return;
    };
    let outcomes: Vec<Outcome> = cases(&dir).iter().map(|c| run_case(&dir, c)).collect();

    // Per case.
    println!("{:<36} {:>10}  result", "case", "max rel");
    for o in &outcomes {
        let status = if o.problems.is_empty() {
            "ok".to_string()
        } else {
            format!(
                "FAIL{}: {}",
                if o.strict { "" } else { " (non-strict)" },
                o.problems[0]
            )
        };
        println!("{:<36} {:>10.2e}  {status}", o.name, o.max_err);
    }

    // Per operator: over the cases that call it.
    let mut per_op: BTreeMap<&str, (usize, usize, f64)> = BTreeMap::new();
    for o in &outcomes {
        for op in &o.ops {
            let e = per_op.entry(op.as_str()).or_insert((0, 0, 0.0));
            e.0 += 1;
            if o.problems.is_empty() {
                e.1 += 1;
                e.2 = e.2.max(o.max_err);
            }
        }
    }
    println!(
        "\n{:<48} {:>6} {:>6} {:>10}",
        "operator", "cases", "passed", "max rel"
    );
    for (op, (n, ok, err)) in &per_op {
        println!("{op:<48} {n:>6} {ok:>6} {err:>10.2e}");
    }
    let compared: BTreeSet<&str> = per_op
        .iter()
        .filter(|(op, (n, ok, _))| op.starts_with("aten.") && ok == n)
        .map(|(op, _)| *op)
        .collect();
    let passed = outcomes.iter().filter(|o| o.problems.is_empty()).count();
    println!(
        "\n{passed}/{} cases match PyTorch; {} distinct ATen operators compared (every case \
         calling them passed), {} seen",
        outcomes.len(),
        compared.len(),
        per_op.keys().filter(|op| op.starts_with("aten.")).count()
    );

    let mut failures = Vec::new();
    for o in &outcomes {
        if o.problems.is_empty() {
            continue;
        }
        let tag = if o.strict {
            ""
        } else {
            " [non-strict, not failing]"
        };
        println!("\n{}{tag}:", o.name);
        for p in &o.problems {
            println!("  - {p}");
        }
        if o.strict {
            failures.push(format!("{}: {}", o.name, o.problems.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} operator cases disagree with PyTorch:\n{}",
        failures.len(),
        outcomes.len(),
        failures.join("\n")
    );
    assert!(
        compared.len() >= MIN_OPS,
        "only {} distinct ATen operators compared, want at least {MIN_OPS}",
        compared.len()
    );
}

/// Every per-operator graph parses, its operators are exactly the ones torch.export emitted
/// (the manifest's record), and it calls the operators the case targets.
#[test]
fn graphs_parse_with_the_ops_torch_emitted() {
    let Some(dir) = fixture_dir("ops", "manifest.json") else {
        return;
    };
    let mut failures = Vec::new();
    let all = cases(&dir);
    let mut lenient = Vec::new();
    for case in &all {
        let name = case["name"].as_str().unwrap_or("?");
        let strict = case["strict"].as_bool().unwrap_or(true);
        let before = failures.len();
        let missing = str_list(&case["targets_missing"]);
        if !missing.is_empty() {
            failures.push(format!(
                "{name}: torch did not emit the targeted {missing:?}"
            ));
        }
        let path = dir.join(case["graph"].as_str().unwrap_or_default());
        match shardproof_import::load_graph(&path) {
            Err(e) => failures.push(format!("{name}: {e}")),
            Ok(g) => {
                if let Err(e) = g.check_structure() {
                    failures.push(format!("{name}: malformed graph: {e}"));
                }
                let ops = graph_ops(&g);
                // The importer rewrites in-place operators to their out-of-place forms
                // (`aten.add_.Scalar` -> `aten.add.Scalar`) where that is sound, and copying
                // twins of views to the views (`view_copy` -> `view`).
                let mut torch_ops: Vec<String> = str_list(&case["ops"])
                    .into_iter()
                    .map(|op| {
                        let renamed = shardproof_ir::OpName::parse(&op)
                            .and_then(|o| shardproof_import::functional_form(&o))
                            .map(|o| o.to_string());
                        match renamed {
                            Some(r) if !ops.contains(&op) => r,
                            _ => op,
                        }
                    })
                    .collect();
                torch_ops.sort();
                torch_ops.dedup();
                if ops != torch_ops {
                    failures.push(format!(
                        "{name}: imported ops {ops:?}, torch emitted {torch_ops:?}"
                    ));
                }
                let n_inputs = case["inputs"].as_array().map_or(0, |a| a.len());
                if g.inputs.len() != n_inputs {
                    failures.push(format!(
                        "{name}: {} graph inputs imported, torch had {n_inputs}",
                        g.inputs.len()
                    ));
                }
            }
        }
        if !strict {
            lenient.extend(failures.drain(before..));
        }
    }
    for p in &lenient {
        println!("non-strict case, not failing: {p}");
    }
    println!("{} graphs parsed, {} problems", all.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
