//! Stage cuts at the zoo's decoder-layer (or every module's) outputs, read from the lineage
//! annotations of its graph files (shared by the `prove_presets`, `prove_zoo` and `zoo_sweep`
//! examples and the `cases` test).
// Each includer uses some of these.
#![allow(dead_code)]

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

/// Every module output a graph file's lineage names (`phase: backward` ones only with
/// `backward`): (module, phase) -> value name.
pub fn module_outputs(path: &Path, backward: bool) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("# Annotation: {'module': '") else {
            continue;
        };
        let back = rest.contains("'phase': 'backward'");
        if back && !backward {
            continue;
        }
        let (Some((module, _)), Some(output)) = (
            rest.split_once('\''),
            rest.split_once("'output': '")
                .and_then(|(_, o)| o.split_once('\''))
                .map(|(o, _)| o),
        ) else {
            continue;
        };
        let phase = if back { "backward" } else { "forward" };
        out.insert(format!("{module} {phase}"), output.to_string());
    }
    out
}

/// Adds the lineage's layer outputs to the case file as cuts (every rank's graph must name
/// the same value), laid out as the residual stream (batch-sharded on `dp`, replicated
/// elsewhere); returns how many. None on a mesh with `cp`: see [`cut_at`].
pub fn cut_at_layers(dir: &Path) -> usize {
    cut_at(dir, layer_outputs)
}

/// Adds every module output the lineage names to the case file as a cut (`backward`: the
/// modules' input gradients too), laid out as the residual stream (batch-sharded on `dp`,
/// replicated elsewhere); returns how many. A dp rank's activation gradients are its own
/// loss's (scaled by the replica count), which no placement states: ask for backward cuts only
/// on meshes without dp, or their stages are refuted.
pub fn cut_at_modules(dir: &Path, backward: bool) -> usize {
    cut_at(dir, |p| module_outputs(p, backward))
}

/// Writes the cuts `read` finds; none on a mesh with a `cp` dim, where a rank's residual stream
/// is its two load-balanced sequence chunks (i and 2cp-1-i), which no placement states (the
/// `Replicate()` written here would make their stages refuted, never a bug found).
fn cut_at(dir: &Path, read: impl Fn(&Path) -> BTreeMap<String, String>) -> usize {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    if case.program.mesh.dim_index("cp").is_some() {
        return 0;
    }
    let spec = read(case.spec.path.as_deref().expect("spec file"));
    let mut files: Vec<&Path> = case
        .program
        .ranks
        .iter()
        .map(|g| g.path.as_deref().expect("rank file"))
        .collect();
    // Sorted first: a plan's ranks interleave their files (llama3-405b's tp ranks r0..r7 repeat
    // along dp and pp), so `dedup` alone kept all 8192 and read each ~1 MB file a thousand times.
    files.sort_unstable();
    files.dedup();
    let ranks: Vec<BTreeMap<String, String>> = files.iter().map(|f| read(f)).collect();
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

/// The scales of the backward cuts `cut_at_modules(dir, true)` wrote: on a mesh with `dp`, a
/// rank's activation gradient is its own loss's, the replica count times the spec's on its
/// rows (`shardproof_prove::CutScales`); empty without `dp`.
pub fn backward_scales(dir: &Path) -> BTreeMap<String, u64> {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    let Some(dp) = case.program.mesh.dim_index("dp") else {
        return BTreeMap::new();
    };
    let d = case.program.mesh.dims[dp].1 as u64;
    let spec = module_outputs(case.spec.path.as_deref().expect("spec file"), true);
    spec.iter()
        .filter(|(k, _)| k.ends_with(" backward"))
        .filter(|(_, name)| case.inputs.iter().any(|r| r.cut && &r.spec_name == *name))
        .map(|(_, name)| (name.clone(), d))
        .collect()
}
