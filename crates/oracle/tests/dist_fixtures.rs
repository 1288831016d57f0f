//! The captured distributed programs (`$SHARDPROOF_ORACLE_DIR/dist/<name>/`) are well formed:
//! every graph parses, the registry's inference agrees with every recorded type, spec and ranks
//! agree on input and output names, and every process group a collective names is mapped by the
//! case file; and the interpreter's lock-step run of every program (with the per-rank inputs
//! the capture wrote) reproduces the losses of the capture's own numerical simulation, so the
//! expected verdict holds numerically. (Whether `shardproof run` reaches the expected verdict
//! from the case file alone is the CLI's test.)

mod common;

use common::{check_shapes, fixture_dir, load_tensors, read_json};
use serde_json::Value;
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{Arg, Graph, Mesh, NodeKind, ProcessGroup, Program};
use shardproof_ops::Tensor;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Relative error within which an f64 run must reproduce the simulated losses.
const TOL: f64 = 1e-9;

/// The quoted keys of the `groups:` block of a generated case file.
fn case_groups(case_yaml: &str) -> BTreeSet<String> {
    let mut in_groups = false;
    let mut names = BTreeSet::new();
    for line in case_yaml.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        if line.trim_end() == "  groups:" {
            in_groups = true;
            continue;
        }
        if in_groups {
            let Some(rest) = line.strip_prefix("    \"") else {
                break;
            };
            if let Some(end) = rest.find('"') {
                names.insert(rest[..end].to_string());
            }
        }
    }
    names
}

fn names_of(g: &Graph, values: impl Iterator<Item = shardproof_ir::ValueId>) -> Vec<String> {
    values.map(|v| g.value_name(v).to_string()).collect()
}

/// The group names used by the graph's collectives (the last string argument).
fn collective_groups(g: &Graph) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for n in &g.nodes {
        let NodeKind::Call { op, args, .. } = &n.kind else {
            continue;
        };
        if op.namespace != "_c10d_functional" || op.name == "wait_tensor" {
            continue;
        }
        let group = args.iter().rev().find_map(|a| match a {
            Arg::Str(s) => Some(s.clone()),
            _ => None,
        });
        out.push((n.name.clone(), group.unwrap_or_default()));
    }
    out
}

fn check_program(dir: &Path, failures: &mut Vec<String>) -> usize {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let expected = read_json(&dir.join("expected.json"));
    let verdict = expected["verdict"].as_str().unwrap_or_default();
    let bad = &expected["bad_output"];
    match verdict {
        "holds" if bad.is_null() => {}
        "violated" if bad.as_str() == Some("loss") => {}
        _ => failures.push(format!(
            "{name}: bad expected.json: verdict {verdict}, bad_output {bad}"
        )),
    }
    let world: u64 = expected["mesh"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).product())
        .unwrap_or(0);
    let yaml = std::fs::read_to_string(dir.join("case.yaml")).unwrap_or_default();
    let groups = case_groups(&yaml);
    let mut files = vec!["spec.py".to_string()];
    files.extend((0..world).map(|r| format!("r{r}.py")));
    let mut spec_io: Option<(Vec<String>, Vec<String>)> = None;
    for f in &files {
        if !yaml.contains(f.as_str()) {
            failures.push(format!("{name}: case.yaml does not name {f}"));
        }
        let g = match shardproof_import::load_graph(&dir.join(f)) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{name}/{f}: {e}"));
                continue;
            }
        };
        for p in check_shapes(&g, &Default::default()) {
            failures.push(format!("{name}/{f}: {p}"));
        }
        let inputs = names_of(&g, g.inputs.iter().copied());
        let outputs = names_of(&g, g.outputs.iter().flatten().copied());
        if outputs != ["loss"] {
            failures.push(format!(
                "{name}/{f}: outputs {outputs:?}, expected [\"loss\"]"
            ));
        }
        match &spec_io {
            None => spec_io = Some((inputs, outputs)),
            Some((si, _)) if *si != inputs => {
                failures.push(format!("{name}/{f}: inputs {inputs:?}, spec has {si:?}"))
            }
            _ => {}
        }
        let collectives = collective_groups(&g);
        if f == "spec.py" && !collectives.is_empty() {
            failures.push(format!("{name}: the spec has collectives {collectives:?}"));
        }
        for (node, group) in collectives {
            if !groups.contains(&group) {
                failures.push(format!(
                    "{name}/{f}: node `{node}` names process group {group:?}, which case.yaml does \
                     not map (it maps {groups:?})"
                ));
            }
        }
    }
    files.len()
}

/// Every distributed program listed in `dist/index.json` is well formed.
#[test]
fn dist_fixtures_are_well_formed() {
    let Some(dir) = fixture_dir("dist", "index.json") else {
        return;
    };
    let index = read_json(&dir.join("index.json"));
    let programs = index["programs"].as_array().expect("index.programs");
    assert!(
        !programs.is_empty(),
        "no distributed programs were captured"
    );
    let mut failures = Vec::new();
    let mut graphs = 0;
    for p in programs {
        let name = p["name"].as_str().expect("program name");
        graphs += check_program(&dir.join(name), &mut failures);
        println!(
            "{name:<40} expected {}",
            p["verdict"].as_str().unwrap_or("?")
        );
    }
    println!(
        "{} programs, {graphs} graphs, {} problems",
        programs.len(),
        failures.len()
    );
    let not_captured = index["not_captured"].as_array().map_or(0, |a| a.len());
    assert_eq!(
        not_captured, 0,
        "some programs were not captured: {}",
        index["not_captured"]
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn program_names(dir: &Path) -> Vec<String> {
    let index = read_json(&dir.join("index.json"));
    index["programs"]
        .as_array()
        .expect("index.programs")
        .iter()
        .map(|p| p["name"].as_str().expect("program name").to_string())
        .collect()
}

fn scalar_of(t: Option<&Tensor>) -> Result<f64, String> {
    match t {
        Some(t) if t.numel() == 1 => Ok(t.data[0]),
        Some(t) => Err(format!("the loss has shape {:?}", t.shape())),
        None => Err("the loss was not computed".into()),
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

/// Runs one program and its spec; returns the problems found.
fn run_one(dir: &Path, name: &str) -> Result<String, String> {
    let d = dir.join(name);
    let expected = read_json(&d.join("expected.json"));
    let mesh_json = expected["mesh"]
        .as_object()
        .ok_or("expected.json has no mesh")?;
    let order = ["dp", "tp"];
    let mesh = Mesh::new(
        order
            .iter()
            .filter_map(|k| {
                mesh_json
                    .get(*k)
                    .and_then(Value::as_u64)
                    .map(|n| (k.to_string(), n as usize))
            })
            .collect(),
    );
    let groups = expected["groups"]
        .as_object()
        .ok_or("expected.json has no groups")?
        .iter()
        .map(|(gname, g)| ProcessGroup {
            name: gname.clone(),
            members: g["ranks"]
                .as_array()
                .map(|sets| {
                    sets.iter()
                        .map(|s| {
                            s.as_array()
                                .map(|rs| {
                                    rs.iter()
                                        .filter_map(|r| r.as_u64().map(|r| r as usize))
                                        .collect()
                                })
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let load = |f: &str| shardproof_import::load_graph(&d.join(f)).map_err(|e| format!("{f}: {e}"));
    let spec = load("spec.py")?;
    let ranks = (0..mesh.size())
        .map(|r| load(&format!("r{r}.py")))
        .collect::<Result<Vec<_>, _>>()?;
    let tensors = load_tensors(&d.join("inputs.safetensors"))?;
    let leaves_of = |prefix: &str| -> BTreeMap<String, Tensor> {
        tensors
            .iter()
            .filter_map(|(k, t)| k.strip_prefix(prefix).map(|n| (n.to_string(), t.clone())))
            .collect()
    };
    let cfg = RunConfig::default();
    let sim = &expected["simulated_f64"];
    let spec_env = run_graph(&spec, &leaves_of("spec."), &cfg).map_err(|e| format!("spec: {e}"))?;
    let spec_loss = scalar_of(spec.outputs[0].and_then(|v| spec_env.get(v)))?;
    let want_spec = sim["spec_loss"].as_f64().ok_or("no simulated spec loss")?;
    let mut problems = Vec::new();
    if rel(spec_loss, want_spec) > TOL {
        problems.push(format!("spec loss {spec_loss}, simulation {want_spec}"));
    }
    let leaves: Vec<_> = (0..mesh.size())
        .map(|r| leaves_of(&format!("r{r}.")))
        .collect();
    let program = Program {
        mesh,
        groups,
        ranks: ranks.into_iter().map(std::sync::Arc::new).collect(),
    };
    let envs = run_program(&program, &leaves, &cfg).map_err(|e| format!("run_program: {e}"))?;
    let mut worst = 0.0f64;
    for (r, (g, env)) in program.ranks.iter().zip(&envs).enumerate() {
        let loss = scalar_of(g.outputs[0].and_then(|v| env.get(v)))
            .map_err(|e| format!("rank {r}: {e}"))?;
        let want = sim["rank_losses"][r]
            .as_f64()
            .ok_or("no simulated rank loss")?;
        if rel(loss, want) > TOL {
            problems.push(format!("rank {r}: loss {loss}, simulation {want}"));
        }
        worst = worst.max(rel(loss, spec_loss));
    }
    let holds = worst <= TOL;
    let verdict = expected["verdict"].as_str().unwrap_or_default();
    if holds != (verdict == "holds") {
        problems.push(format!(
            "expected verdict {verdict}, but the ranks' losses differ from the spec's by {worst:.3e}"
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "{name:<40} {verdict:<9} max rel error vs spec {worst:.2e}"
        ))
    } else {
        Err(format!("{name}: {}", problems.join("; ")))
    }
}

/// The interpreter runs every distributed program (collectives in lock step) and its spec to
/// the losses the capture simulated, so each program's expected verdict holds numerically.
#[test]
fn dist_programs_run_like_the_simulation() {
    let Some(dir) = fixture_dir("dist", "index.json") else {
        return;
    };
    let mut failures = Vec::new();
    for name in program_names(&dir) {
        match std::panic::catch_unwind(|| run_one(&dir, &name)) {
            Ok(Ok(line)) => println!("{line}"),
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push(format!("{name}: panicked")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
