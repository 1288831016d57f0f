//! Stage cuts at the zoo's decoder-layer (or every module's) outputs, read from the lineage
//! annotations of its graph files (shared by the `prove_presets`, `prove_zoo` and `zoo_sweep`
//! examples and the `cases` test).
// Each includer uses some of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

/// Every value a graph file's lineage names for each module it keeps, in file order (a
/// pipeline rank names a module once per microbatch): `keep(module, backward)` gives the key.
fn lineage(
    path: &Path,
    keep: impl Fn(&str, bool) -> Option<String>,
) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("# Annotation: {'module': '") else {
            continue;
        };
        let back = rest.contains("'phase': 'backward'");
        let (Some((module, _)), Some(output)) = (
            rest.split_once('\''),
            rest.split_once("'output': '")
                .and_then(|(_, o)| o.split_once('\''))
                .map(|(o, _)| o),
        ) else {
            continue;
        };
        if let Some(key) = keep(module, back) {
            out.entry(key).or_default().push(output.to_string());
        }
    }
    out
}

/// The forward decoder-layer outputs (and the embedding's) a graph file's lineage names,
/// every microbatch's in order: module -> value names.
fn layer_output_lists(path: &Path) -> BTreeMap<String, Vec<String>> {
    lineage(path, |module, back| {
        // A decoder layer ends where its last sublayer does.
        let layer_end = module == "embedding"
            || (module.starts_with("layers.")
                && (module.ends_with(".mlp")
                    || module.ends_with(".moe")
                    || module.matches('.').count() == 1));
        (!back && layer_end).then(|| module.to_string())
    })
}

/// Every module output a graph file's lineage names (`phase: backward` ones only with
/// `backward`), every microbatch's in order: "module phase" -> value names.
fn module_output_lists(path: &Path, backward: bool) -> BTreeMap<String, Vec<String>> {
    lineage(path, |module, back| {
        (backward || !back)
            .then(|| format!("{module} {}", if back { "backward" } else { "forward" }))
    })
}

/// [`module_output_lists`] with, for every layer whose attention and MoE outputs are each
/// named once, the residual stream after its MoE block ("layers.N residual forward"): the
/// value `add(a, view(m))` of attention output `a` and MoE output `m`. An MoE block's lineage
/// names the block's own output (`[batch * seq, hidden]`), so without this the next layer's
/// input is the sum of two cuts, and its weight gradients multiply that sum out.
fn module_output_lists_with_residuals(
    path: &Path,
    backward: bool,
) -> BTreeMap<String, Vec<String>> {
    let mut lists = module_output_lists(path, backward);
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // `name: "type" = torch.ops.OP(args)`: (name, OP, args).
    let calls: Vec<(&str, &str, &str)> = text
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(": ")?;
            let (_, call) = rest.split_once(" = torch.ops.")?;
            let (op, args) = call.split_once('(')?;
            Some((name, op, args.strip_suffix(')')?))
        })
        .collect();
    let layers: Vec<String> = lists
        .keys()
        .filter_map(|k| k.strip_suffix(".moe forward").map(str::to_string))
        .collect();
    for layer in layers {
        let one = |module: &str| match lists.get(&format!("{layer}.{module} forward")) {
            Some(v) if v.len() == 1 => Some(v[0].clone()),
            _ => None,
        };
        let (Some(attention), Some(moe)) = (one("attention"), one("moe")) else {
            continue;
        };
        let viewed = calls.iter().find(|(_, op, args)| {
            *op == "aten.view.default" && args.split(", ").next() == Some(moe.as_str())
        });
        let Some((view, _, _)) = viewed else { continue };
        let sum = format!("{attention}, {view}");
        if let Some((residual, _, _)) = calls
            .iter()
            .find(|(_, op, args)| *op == "aten.add.Tensor" && *args == sum)
        {
            lists.insert(
                format!("{layer} residual forward"),
                vec![residual.to_string()],
            );
        }
    }
    lists
}

/// The last value of each list: the value itself where a module is named once.
fn last(lists: BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
    lists
        .into_iter()
        .filter_map(|(k, v)| v.last().cloned().map(|n| (k, n)))
        .collect()
}

/// The forward decoder-layer outputs a graph file's lineage names: module -> value name.
pub fn layer_outputs(path: &Path) -> BTreeMap<String, String> {
    last(layer_output_lists(path))
}

/// Every module output a graph file's lineage names (`phase: backward` ones only with
/// `backward`): (module, phase) -> value name.
pub fn module_outputs(path: &Path, backward: bool) -> BTreeMap<String, String> {
    last(module_output_lists(path, backward))
}

/// Adds the lineage's layer outputs to the case file as cuts (every rank's graph must name
/// the same value), laid out as the residual stream (batch-sharded on `dp`, replicated
/// elsewhere); returns how many. None on a mesh with `cp`: see [`cut_at`].
pub fn cut_at_layers(dir: &Path) -> usize {
    cut_at(dir, layer_output_lists, false).0
}

/// Adds every module output the lineage names to the case file as a cut (`backward`: the
/// modules' input gradients too), laid out as the residual stream (batch-sharded on `dp`,
/// replicated elsewhere); returns how many. A dp rank's activation gradients are its own
/// loss's (scaled by the replica count), which no placement states: ask for backward cuts only
/// on meshes without dp, or their stages are refuted.
pub fn cut_at_modules(dir: &Path, backward: bool) -> usize {
    cut_at(dir, |p| module_output_lists(p, backward), false).0
}

/// [`cut_at_modules`] (and the residual stream after each MoE block), and on a mesh with `cp`
/// too: there each cut's sequence is split over
/// `cp` and holds of the spec value's load-balanced chunks (`shardproof_prove::LoadBalanced`;
/// a cp rank holds sequence chunks `i` and `2cp-1-i`), which the returned orders state: pass
/// them to the plan (`PlanOptions::chunked`), or the cp stages are refuted.
pub fn cut_at_modules_load_balanced(
    dir: &Path,
    backward: bool,
) -> (usize, shardproof_prove::ChunkedCuts) {
    cut_at(
        dir,
        |p| module_output_lists_with_residuals(p, backward),
        true,
    )
}

/// Writes the cuts `read` finds, and the chunk order of each on a mesh with a `cp` dim. There
/// a rank's residual stream is its two load-balanced sequence chunks (i and 2cp-1-i), which no
/// placement states: no cut unless `load_balanced`, and then the caller states the orders to
/// the plan (the `Shard` over cp written here alone would make their stages refuted, never a
/// bug found). A value `[batch, seq, ..]` is split along dim 1; one `[batch * seq, ..]` (an
/// MoE block's flattened tokens) along dim 0, as `batch` sequences, where no other mesh dim
/// splits its batch; any other value is not cut.
fn cut_at(
    dir: &Path,
    read: impl Fn(&Path) -> BTreeMap<String, Vec<String>>,
    load_balanced: bool,
) -> (usize, shardproof_prove::ChunkedCuts) {
    let mut orders = shardproof_prove::ChunkedCuts::new();
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    let cp = case.program.mesh.dim_index("cp");
    if cp.is_some() && !load_balanced {
        return (0, orders);
    }
    let spec = last(read(case.spec.path.as_deref().expect("spec file")));
    let ranks = distinct_files(&case)
        .iter()
        .map(|f| read(f))
        .collect::<Vec<_>>();
    let residual = residual_placements(&case);
    let tokens = case
        .spec
        .find("tokens")
        .and_then(|v| case.spec.recorded_type(v))
        .and_then(|t| t.concrete_shape());
    let mut lines = String::new();
    let mut cuts = 0;
    for (module, name) in &spec {
        // Named once by every graph: one value per rank (a pipeline's microbatches, or a
        // module only some stages run, are `microbatch_cuts`').
        let names: Vec<Option<&Vec<String>>> = ranks.iter().map(|r| r.get(module)).collect();
        let Some(Some(first)) = names.first() else {
            continue;
        };
        if first.len() != 1 || names.iter().any(|n| *n != Some(*first)) {
            continue;
        }
        let mut placements = residual.clone();
        if let Some(cp) = cp {
            let shape = case
                .spec
                .find(name)
                .and_then(|v| case.spec.recorded_type(v))
                .and_then(|t| t.concrete_shape());
            let (Some(shape), Some(&[batch, seq])) = (shape, tokens.as_deref()) else {
                continue;
            };
            let ranks = case.program.mesh.dims[cp].1;
            let order = if shape.len() == 3 && shape[..2] == [batch, seq] {
                (1, 1)
            } else if shape.len() == 2
                && shape[0] == batch * seq
                && residual.iter().all(|p| *p != "Shard(0)")
            {
                placements[cp] = "Shard(0)";
                (0, batch as usize)
            } else {
                continue;
            };
            orders.insert(
                name.clone(),
                shardproof_prove::LoadBalanced {
                    dim: order.0,
                    ranks,
                    sequences: order.1,
                },
            );
        }
        lines.push_str(&format!(
            "  {name}: {{ impl: {}, placement: [{}] }}\n",
            first[0],
            placements.join(", ")
        ));
        cuts += 1;
    }
    let path = dir.join("case.yaml");
    let text = std::fs::read_to_string(&path).expect("case.yaml");
    let text = text.replacen("inputs:\n", &format!("inputs:\n{lines}"), 1);
    std::fs::write(&path, text).expect("case.yaml");
    (cuts, orders)
}

/// The rank graph files, each once. Sorted first: a plan's ranks interleave their files
/// (llama3-405b's tp ranks r0..r7 repeat along dp and pp), so `dedup` alone kept all 8192
/// and read each ~1 MB file a thousand times.
fn distinct_files(case: &shardproof_case::Case) -> Vec<&Path> {
    let mut files: Vec<&Path> = case
        .program
        .ranks
        .iter()
        .map(|g| g.path.as_deref().expect("rank file"))
        .collect();
    files.sort_unstable();
    files.dedup();
    files
}

/// The residual stream's placements: the batch (dim 0) split as the case splits its `tokens`
/// (over `dp`, and `ep` where experts are parallel to data), the sequence (dim 1) over `cp`
/// (as load-balanced chunks, which the plan is told apart), replicated elsewhere; without
/// `tokens`, batch-sharded on `dp`.
fn residual_placements(case: &shardproof_case::Case) -> Vec<&'static str> {
    let tokens = case.inputs.iter().find(|r| r.spec_name == "tokens");
    let split = |i: usize, name: &str| match tokens.map(|t| &t.layout) {
        Some(shardproof_case::Layout::Placed(l)) => {
            l.placements.get(i) == Some(&shardproof_case::Placement::Shard(0))
        }
        _ => name == "dp",
    };
    case.program
        .mesh
        .dims
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if split(i, &d.0) {
                "Shard(0)"
            } else if d.0 == "cp" {
                "Shard(1)"
            } else {
                "Replicate()"
            }
        })
        .collect()
}

/// The layer outputs of a pipeline plan (or one with several microbatches) as microbatched
/// cuts ([`shardproof_prove::MicrobatchCut`]): the modules `cut_at_layers` leaves out because a
/// rank names them once per microbatch or only one pipeline stage's ranks run them.
pub fn microbatch_cuts_at_layers(dir: &Path) -> Vec<shardproof_prove::MicrobatchCut> {
    microbatch_cuts(dir, layer_output_lists)
}

/// [`microbatch_cuts_at_layers`] at every module output (`backward`: and input gradient).
pub fn microbatch_cuts_at_modules(
    dir: &Path,
    backward: bool,
) -> Vec<shardproof_prove::MicrobatchCut> {
    microbatch_cuts(dir, |p| module_output_lists(p, backward))
}

/// A module is cut where every graph that names it names the same values (one per
/// microbatch), and the ranks running those graphs are exactly one pipeline stage's (every
/// rank where there is no `pp`): its rank values are then that stage's microbatches of the
/// residual stream's piece.
fn microbatch_cuts(
    dir: &Path,
    read: impl Fn(&Path) -> BTreeMap<String, Vec<String>>,
) -> Vec<shardproof_prove::MicrobatchCut> {
    use shardproof_case::{Blocks, Held, PlacedLayout, Placement};
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    let mesh = &case.program.mesh;
    if mesh.dim_index("cp").is_some() {
        return Vec::new();
    }
    let spec = last(read(case.spec.path.as_deref().expect("spec file")));
    let files = distinct_files(&case);
    let lists: BTreeMap<&Path, BTreeMap<String, Vec<String>>> =
        files.iter().map(|&f| (f, read(f))).collect();
    let pp = mesh.dim_index("pp");
    let placements: Vec<Placement> = residual_placements(&case)
        .iter()
        .map(|p| {
            if *p == "Shard(0)" {
                Placement::Shard(0)
            } else {
                Placement::Replicate
            }
        })
        .collect();
    let mut cuts = Vec::new();
    for (module, name) in &spec {
        let mut values: Option<&Vec<String>> = None;
        let mut holders = Vec::new();
        let mut alike = true;
        for (r, g) in case.program.ranks.iter().enumerate() {
            let Some(v) = g.path.as_deref().and_then(|p| lists[p].get(module)) else {
                continue;
            };
            alike &= values.is_none_or(|w| w == v);
            values = Some(v);
            holders.push(r);
        }
        let Some(values) = values else { continue };
        let everywhere = holders.len() == case.program.ranks.len();
        if !alike || (everywhere && values.len() == 1) {
            // Unrelatable, or a plain cut (`cut_at`).
            continue;
        }
        let at = if everywhere {
            Vec::new()
        } else {
            let Some(pp) = pp else { continue };
            let stage = mesh.coords(holders[0])[pp];
            let stage_ranks: Vec<usize> = (0..case.program.ranks.len())
                .filter(|&r| mesh.coords(r)[pp] == stage)
                .collect();
            if stage_ranks != holders {
                continue;
            }
            vec![Held {
                dim: pp,
                name: "pp".into(),
                coords: vec![stage],
            }]
        };
        cuts.push(shardproof_prove::MicrobatchCut {
            spec_name: name.clone(),
            layout: PlacedLayout {
                placements: placements.clone(),
                blocks: Blocks::NONE,
                at,
            },
            values: values.clone(),
        });
    }
    cuts
}

/// The scales of the backward cuts `cut_at_modules(dir, true)` wrote: on a mesh with `dp` or
/// `cp`, a rank's activation gradient is its own loss's (the mean over its own tokens), the
/// product of their sizes times the spec's on its tokens (`shardproof_prove::CutScales`);
/// empty without either.
pub fn backward_scales(dir: &Path) -> BTreeMap<String, u64> {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    scaled_backward(&case, |name| {
        case.inputs.iter().any(|r| r.cut && r.spec_name == name)
    })
}

/// The scales of the backward cuts among `cuts` (from `microbatch_cuts_at_modules(dir,
/// true)`): a pipeline rank's microbatch loss is the mean over the microbatch's tokens times
/// `1/M`, so the microbatches' activation gradients, concatenated, are the replica count
/// (`dp`, times `cp`) times the spec's on the rank's rows, as without microbatches.
pub fn microbatch_backward_scales(
    dir: &Path,
    cuts: &[shardproof_prove::MicrobatchCut],
) -> BTreeMap<String, u64> {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    scaled_backward(&case, |name| cuts.iter().any(|c| c.spec_name == name))
}

/// Every module input gradient the spec's lineage names and `cut` accepts, with the replica
/// count of `case`'s mesh: the product of its `dp` and `cp` sizes; empty without either.
fn scaled_backward(
    case: &shardproof_case::Case,
    cut: impl Fn(&str) -> bool,
) -> BTreeMap<String, u64> {
    let mesh = &case.program.mesh;
    let size = |name: &str| mesh.dim_index(name).map(|i| mesh.dims[i].1 as u64);
    let d = match (size("dp"), size("cp")) {
        (None, None) => return BTreeMap::new(),
        (dp, cp) => dp.unwrap_or(1) * cp.unwrap_or(1),
    };
    let spec = module_outputs(case.spec.path.as_deref().expect("spec file"), true);
    spec.iter()
        .filter(|(k, _)| k.ends_with(" backward"))
        .filter(|(_, name)| cut(name))
        .map(|(_, name)| (name.clone(), d))
        .collect()
}
