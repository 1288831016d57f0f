//! Counterexamples: a refuted goal's point turned into concrete inputs, run through the
//! reference interpreter (spec and every rank), and accepted only when the interpreter's
//! spec output and the output rebuilt from its ranks really differ there.

use super::inputs::Leaves;
use super::layout::rebuild;
use super::unflatten;
use crate::decide::{Point, Rng};
use crate::eval::{clearly_differ, FloatEval};
use crate::expr::{rat_to_f64, Arena};
use crate::tensor::SymTensor;
use serde::Serialize;
use shardproof_case::{Case, Layout, Reduce};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// A confirmed counterexample.
#[derive(Clone, Debug, Serialize)]
pub struct Counterexample {
    /// The spec output that differs.
    pub output: String,
    /// The element that differs.
    pub index: Vec<usize>,
    /// The interpreter's spec value there.
    pub spec_value: f64,
    /// The value rebuilt from the interpreter's rank outputs.
    pub rebuilt_value: f64,
    /// The spec's inputs and constants.
    #[serde(skip)]
    pub spec_inputs: BTreeMap<String, Tensor>,
    /// Every rank's inputs and constants.
    #[serde(skip)]
    pub rank_inputs: Vec<BTreeMap<String, Tensor>>,
    /// The interpreter's spec output.
    #[serde(skip)]
    pub spec_output: Tensor,
    /// The output rebuilt from the ranks (NaN where no rank holds an element).
    #[serde(skip)]
    pub rebuilt_output: Tensor,
    /// The PyTorch replay plan (`replay.json`), or why there is none.
    #[serde(skip)]
    pub replay: Result<serde_json::Value, String>,
}

fn concrete(eval: &mut FloatEval, t: &SymTensor) -> Tensor {
    let data = t.elems.iter().map(|&e| eval.eval(e)).collect();
    Tensor::new(Meta::new(t.dtype, t.shape.clone()), data)
}

/// Runs the interpreter on the point (other symbols drawn from `seed`) and checks that the
/// expected output `name` differs from the spec at `spec_index` (`None`: at its first element
/// that clearly differs).
#[allow(clippy::too_many_arguments)]
pub fn confirm(
    case: &Case,
    arena: &Arena,
    leaves: &Leaves,
    name: &str,
    spec_value: ValueId,
    holders: &[(usize, ValueId)],
    layout: &Layout,
    spec_index: Option<usize>,
    point: &Point,
    seed: u64,
) -> Result<Counterexample, String> {
    let mut rng = Rng::new(seed ^ 0xc0de);
    let mut values: Vec<f64> = arena
        .symbols()
        .iter()
        .map(|(_, kind)| rng.value(*kind).to_f64())
        .collect();
    for (s, v) in &point.values {
        values[*s as usize] = rat_to_f64(v);
    }
    let mut eval = FloatEval::new(arena, values);
    let spec_inputs: BTreeMap<String, Tensor> = leaves
        .spec
        .iter()
        .map(|(n, t)| (n.clone(), concrete(&mut eval, t)))
        .collect();
    let rank_inputs: Vec<BTreeMap<String, Tensor>> = leaves
        .ranks
        .iter()
        .map(|l| {
            l.iter()
                .map(|(n, t)| (n.clone(), concrete(&mut eval, t)))
                .collect()
        })
        .collect();
    let cfg = RunConfig {
        custom_ops: case.ops.clone(),
        ..RunConfig::default()
    };
    let spec_env = run_graph(&case.spec, &spec_inputs, &cfg).map_err(|e| format!("spec: {e}"))?;
    let rank_envs =
        run_program(&case.program, &rank_inputs, &cfg).map_err(|e| format!("ranks: {e}"))?;
    let spec = spec_env
        .get(spec_value)
        .cloned()
        .ok_or_else(|| format!("the interpreter did not compute `{name}`"))?;
    let value_of = |r: usize| -> Option<&Tensor> {
        let &(_, v) = holders.iter().find(|(h, _)| *h == r)?;
        rank_envs[r].get(v)
    };
    let shape_of = |r: usize| value_of(r).map(|t| t.shape().to_vec());
    // Each holder's pieces apart: a replicated element has a copy on every holder, and the
    // ranks may differ on one copy only (the goal refuted on it), so no single copy stands
    // for the others.
    let mut copies: Vec<(usize, usize, f64)> = Vec::new();
    for (position, &(h, _)) in holders.iter().enumerate() {
        let pieces = rebuild(
            layout,
            spec.shape(),
            &case.program.mesh,
            &[h],
            &shape_of,
            &mut |r, i| value_of(r).expect("shape checked").data[i],
            &mut |red, xs: Vec<f64>| {
                Ok(match red {
                    Reduce::Sum => xs.iter().sum(),
                    Reduce::Avg => xs.iter().sum::<f64>() / xs.len() as f64,
                    Reduce::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    Reduce::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
                })
            },
        )
        .map_err(|m| m.0)?;
        copies.extend(
            pieces
                .into_iter()
                .map(|p| (position, p.spec_index, p.value)),
        );
    }
    let differing_copy = |i: usize| {
        copies
            .iter()
            .find(|&&(_, j, v)| j == i && clearly_differ(spec.data[i], v))
            .map(|&(position, _, _)| position)
    };
    let spec_index = match spec_index {
        Some(i) => i,
        None => (0..spec.numel())
            .find(|&i| differing_copy(i).is_some())
            .ok_or_else(|| "no element of the output differs".to_string())?,
    };
    // The holder whose copy differs is put last, so that the rebuilt output and the replay
    // (both take an element's last copy) show the difference.
    let mut holders = holders.to_vec();
    if let Some(position) = differing_copy(spec_index) {
        let h = holders.remove(position);
        holders.push(h);
        // A stable sort: the other holders' copies keep their order.
        copies.sort_by_key(|c| c.0 == position);
    }
    let mut full = vec![f64::NAN; spec.numel()];
    for &(_, i, v) in &copies {
        full[i] = v;
    }
    let replay = super::replay::plan(
        case,
        name,
        spec_value,
        spec.shape(),
        &holders,
        layout,
        &spec_inputs,
        &rank_inputs,
        &shape_of,
    );
    let (want, got) = (spec.data[spec_index], full[spec_index]);
    if !clearly_differ(want, got) {
        return Err(format!(
            "at {:?} the interpreter gives spec {want} and rebuilt {got}",
            unflatten(spec_index, spec.shape())
        ));
    }
    Ok(Counterexample {
        output: name.to_string(),
        index: unflatten(spec_index, spec.shape()),
        spec_value: want,
        rebuilt_value: got,
        spec_inputs,
        rank_inputs,
        replay,
        rebuilt_output: Tensor::new(spec.meta.clone(), full),
        spec_output: spec,
    })
}

fn save(path: &Path, tensors: &[(String, &Tensor)]) -> Result<(), String> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let data = t.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.clone(), t.shape().to_vec(), data)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, shape, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F64, shape.clone(), data)
                .map(|v| (n.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

impl Counterexample {
    /// Writes the counterexample into `dir`: `inputs.safetensors` (the spec's inputs by name,
    /// rank r's as `r<r>/<name>`), `spec_output.safetensors`, `rebuilt_output.safetensors`
    /// (f64; NaN where no rank holds an element), `counterexample.json`, the index, and
    /// `replay.py` with its `replay.json`, which reproduce the difference in PyTorch.
    pub fn write(&self, dir: &Path, case: &str) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut inputs: Vec<(String, &Tensor)> = self
            .spec_inputs
            .iter()
            .map(|(n, t)| (n.clone(), t))
            .collect();
        for (r, l) in self.rank_inputs.iter().enumerate() {
            inputs.extend(l.iter().map(|(n, t)| (format!("r{r}/{n}"), t)));
        }
        save(&dir.join("inputs.safetensors"), &inputs)?;
        save(
            &dir.join("spec_output.safetensors"),
            &[(self.output.clone(), &self.spec_output)],
        )?;
        save(
            &dir.join("rebuilt_output.safetensors"),
            &[(self.output.clone(), &self.rebuilt_output)],
        )?;
        let index = serde_json::json!({
            "case": case,
            "output": self.output,
            "index": self.index,
            "spec_value": self.spec_value,
            "rebuilt_value": self.rebuilt_value,
            "confirmed_by": "shardproof_interp (f64)",
            "files": {
                "inputs": "inputs.safetensors",
                "spec_output": "spec_output.safetensors",
                "rebuilt_output": "rebuilt_output.safetensors",
            },
            "spec_inputs": self.spec_inputs.keys().collect::<Vec<_>>(),
            "rank_inputs": self.rank_inputs.iter().map(|l| l.keys().collect::<Vec<_>>()).collect::<Vec<_>>(),
        });
        let mut index = index;
        match &self.replay {
            Ok(plan) => {
                let plan = serde_json::to_string(plan).expect("json");
                std::fs::write(dir.join("replay.json"), plan + "\n")
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                std::fs::write(dir.join("replay.py"), super::replay::SCRIPT)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                index["files"]["replay"] = serde_json::json!("replay.py");
            }
            Err(e) => index["replay_unavailable"] = serde_json::json!(e),
        }
        let text = serde_json::to_string_pretty(&index).expect("json");
        std::fs::write(dir.join("counterexample.json"), text + "\n")
            .map_err(|e| format!("{}: {e}", dir.display()))
    }
}
