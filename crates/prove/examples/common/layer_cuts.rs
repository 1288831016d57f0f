//! Stage cuts at the zoo's decoder-layer outputs, read from the lineage annotations of its
//! graph files (shared by the `prove_presets` and `prove_zoo` examples).

use std::collections::BTreeMap;
use std::path::Path;

/// The forward decoder-layer outputs a graph file's lineage names: module -> value name.
pub fn layer_outputs(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("# Annotation: {'module': '") else {
            continue;
        };
        if rest.contains("'phase': 'backward'") {
            continue;
        }
        let Some((module, rest)) = rest.split_once('\'') else {
            continue;
        };
        let Some(output) = rest
            .split_once("'output': '")
            .and_then(|(_, o)| o.split_once('\''))
            .map(|(o, _)| o)
        else {
            continue;
        };
        // A decoder layer ends where its last sublayer does.
        let layer_end = module == "embedding"
            || (module.starts_with("layers.")
                && (module.ends_with(".mlp")
                    || module.ends_with(".moe")
                    || module.matches('.').count() == 1));
        if layer_end {
            out.insert(module.to_string(), output.to_string());
        }
    }
    out
}

/// Adds the lineage's layer outputs to the case file as cuts (every rank's graph must name
/// the same value); returns how many.
pub fn cut_at_layers(dir: &Path) -> usize {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    let spec = layer_outputs(case.spec.path.as_deref().expect("spec file"));
    let mut files: Vec<&Path> = case
        .program
        .ranks
        .iter()
        .map(|g| g.path.as_deref().expect("rank file"))
        .collect();
    files.dedup();
    let ranks: Vec<BTreeMap<String, String>> = files.iter().map(|f| layer_outputs(f)).collect();
    let placement: Vec<&str> = case
        .program
        .mesh
        .dims
        .iter()
        .map(|d| {
            if d.0 == "dp" {
                "Shard(0)"
            } else {
                "Replicate()"
            }
        })
        .collect();
    let mut lines = String::new();
    let mut cuts = 0;
    for (module, name) in &spec {
        let names: Vec<Option<&String>> = ranks.iter().map(|r| r.get(module)).collect();
        let Some(Some(rank_name)) = names.first() else {
            continue;
        };
        if names.iter().any(|n| *n != Some(*rank_name)) {
            continue;
        }
        lines.push_str(&format!(
            "  {name}: {{ impl: {rank_name}, placement: [{}] }}\n",
            placement.join(", ")
        ));
        cuts += 1;
    }
    let path = dir.join("case.yaml");
    let text = std::fs::read_to_string(&path).expect("case.yaml");
    let text = text.replacen("inputs:\n", &format!("inputs:\n{lines}"), 1);
    std::fs::write(&path, text).expect("case.yaml");
    cuts
}
