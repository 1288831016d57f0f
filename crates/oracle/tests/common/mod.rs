//! Helpers shared by the oracle tests: locating the fixtures, reading safetensors into
//! shardproof tensors, and per-node shape checks against the types torch recorded.

#![allow(dead_code)]

use safetensors::{Dtype, SafeTensors};
use shardproof_ir::{DType, Graph, NodeKind, ValueId};
use shardproof_ops::{Meta, Registry, Tensor, Values};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The fixture directory (`$SHARDPROOF_ORACLE_DIR/<sub>`), or `None` (with a message) when the
/// variable is unset. Panics when it is set but the directory lacks `<sub>/<marker>`.
pub fn fixture_dir(sub: &str, marker: &str) -> Option<PathBuf> {
    let Some(root) = std::env::var_os("SHARDPROOF_ORACLE_DIR") else {
        eprintln!(
            "SKIP: SHARDPROOF_ORACLE_DIR is not set; run `scripts/oracle-capture` and set it to \
             target/oracle (scripts/test does both) to compare against PyTorch"
        );
        return None;
    };
    let dir = PathBuf::from(root).join(sub);
    let m = dir.join(marker);
    assert!(
        m.is_file(),
        "SHARDPROOF_ORACLE_DIR is set but {} is missing: run `scripts/oracle-capture` first",
        m.display()
    );
    Some(dir)
}

/// Reads a JSON file.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The shardproof dtype of a safetensors dtype.
pub fn dtype_of(d: Dtype) -> Result<DType, String> {
    Ok(match d {
        Dtype::F64 => DType::F64,
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::Bf16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I16 => DType::I16,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        other => return Err(format!("unsupported safetensors dtype {other:?}")),
    })
}

fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = ((bits >> 10) & 0x1f) as i32;
    let frac = (bits & 0x3ff) as f64;
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 if frac == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Decodes a little-endian safetensors buffer into f64 elements.
pub fn decode(d: Dtype, bytes: &[u8]) -> Result<Vec<f64>, String> {
    macro_rules! le {
        ($t:ty, $n:expr) => {
            bytes
                .chunks_exact($n)
                .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect()
        };
    }
    Ok(match d {
        Dtype::F64 => le!(f64, 8),
        Dtype::F32 => le!(f32, 4),
        Dtype::I64 => le!(i64, 8),
        Dtype::I32 => le!(i32, 4),
        Dtype::I16 => le!(i16, 2),
        Dtype::I8 => bytes.iter().map(|&b| b as i8 as f64).collect(),
        Dtype::U8 => bytes.iter().map(|&b| b as f64).collect(),
        Dtype::BOOL => bytes.iter().map(|&b| (b != 0) as u8 as f64).collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16_to_f64(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64)
            .collect(),
        other => return Err(format!("unsupported safetensors dtype {other:?}")),
    })
}

/// Every tensor of a safetensors file, by key.
pub fn load_tensors(path: &std::path::Path) -> Result<BTreeMap<String, Tensor>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{} is not a safetensors file: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for name in st.names() {
        let view = st.tensor(name).map_err(|e| format!("{name}: {e}"))?;
        let dtype = dtype_of(view.dtype())?;
        let data = decode(view.dtype(), view.data())?;
        let meta = Meta::new(dtype, view.shape().to_vec());
        if meta.numel() != data.len() {
            return Err(format!(
                "{name}: {} elements for shape {:?}",
                data.len(),
                view.shape()
            ));
        }
        out.insert(name.to_string(), Tensor::new(meta, data));
    }
    Ok(out)
}

/// Metas taken from the types recorded in the graph text (what torch printed), so that every
/// node's inference is checked on its own, from torch's view of its inputs; plus the data of
/// the graph inputs, when known (inference of data-dependent shapes, such as indexing with a
/// boolean mask, may read them).
pub struct RecordedMetas<'g> {
    /// The graph whose recorded types are read.
    pub graph: &'g Graph,
    /// Known values (graph inputs).
    pub data: BTreeMap<ValueId, Tensor>,
}

impl Values for RecordedMetas<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        if let Some(t) = self.data.get(&v) {
            return Some(t.meta.clone());
        }
        self.graph
            .nodes
            .get(v.node)?
            .outputs
            .get(v.output)?
            .ty
            .as_ref()
            .and_then(Meta::from_type)
    }
    fn tensor(&self, v: ValueId) -> Option<&Tensor> {
        self.data.get(&v)
    }
}

/// Checks the registry's inference of every call node against the recorded output types, with
/// the given graph inputs' data (by name) available to inference.
/// Returns one message per disagreement (or per node the registry does not know or rejects).
pub fn check_shapes(graph: &Graph, inputs: &BTreeMap<String, Tensor>) -> Vec<String> {
    let reg = Registry::builtin();
    let data = inputs
        .iter()
        .filter_map(|(name, t)| graph.find(name).map(|v| (v, t.clone())))
        .collect();
    let values = RecordedMetas { graph, data };
    let mut problems = Vec::new();
    for node in &graph.nodes {
        let NodeKind::Call { op, args, kwargs } = &node.kind else {
            continue;
        };
        if node.outputs.iter().all(|o| o.ty.is_none()) {
            continue;
        }
        // A symbolic input (`f64[u0]`, `Sym(u0)`) has no concrete meta: nothing to check against.
        if node.inputs().iter().any(|&v| values.meta(v).is_none()) {
            continue;
        }
        let Some(def) = reg.get(op) else {
            problems.push(format!(
                "node `{}`: operator {op} is not in the registry",
                node.name
            ));
            continue;
        };
        let inferred = match reg.infer(def, args, kwargs, &values) {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!(
                    "node `{}` ({op}): inference failed: {e}",
                    node.name
                ));
                continue;
            }
        };
        for (o, out) in node.outputs.iter().enumerate() {
            let Some(ty) = &out.ty else { continue };
            let Some(want) = Meta::from_type(ty) else {
                continue;
            };
            match inferred.get(o) {
                Some(got) if *got == want => {}
                Some(got) => problems.push(format!(
                    "node `{}` ({op}) output {o} `{}`: torch recorded {ty}, inference says {}",
                    node.name,
                    out.name,
                    got.to_type()
                )),
                None => problems.push(format!(
                    "node `{}` ({op}): torch recorded output {o} `{}` ({ty}), inference gave {} outputs",
                    node.name,
                    out.name,
                    inferred.len()
                )),
            }
        }
    }
    problems
}

/// The distinct operators called by a graph, as `namespace.name.overload`.
pub fn graph_ops(graph: &Graph) -> Vec<String> {
    let mut ops: Vec<String> = graph
        .nodes
        .iter()
        .filter_map(|n| n.op().map(|o| o.to_string()))
        .collect();
    ops.sort();
    ops.dedup();
    ops
}
