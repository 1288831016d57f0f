//! The zoo's real-size presets with their TrainVerify Table 2 plans, shape-reduced and proved:
//! prints, per preset, the verdict, the tensor elements before and after shape reduction, the
//! wall time and the process's peak resident memory.
//!
//! ```text
//! cargo run --release -p shardproof-prove --example prove_presets -- [PRESET ...] [--time-limit S] [--forward | --whole] [--plan-only] [--dir D]
//! ```
//!
//! `--plan-only` makes the staged plan (within the time limit) and proves nothing: it prints
//! the stages, the distinct ones, the plan's digest and the plan's wall and CPU time.
//!
//! Without names: llama3-8b, llama3-405b and deepseek-v3-671b. The peak memory is the
//! process's (`VmHWM`), so it only grows across presets: run one preset per process for each
//! one's own figure. With `--forward` the forward pass and loss are emitted, cut at the
//! embedding's and every decoder layer's output (the zoo's lineage annotations; the residual
//! stream batch-sharded on `dp`, replicated elsewhere) and proved in stages with the memo;
//! each stage goes through the mesh-dim reduction along dp where it applies. Without it the
//! full iteration is cut the same way at every module output and every module input gradient
//! the lineage names, a backward cut on a dp mesh stating that each rank holds the replica
//! count times the spec's rows (`CutScales`); `--whole` proves the full iteration uncut. On a
//! pipeline plan a module output (and, in the full iteration, a module input gradient) is cut
//! as the microbatches its stage's ranks compute (`MicrobatchCut`), the gradients scaled by the
//! replica count as well. The time limit covers the plan too: a plan it stops is inconclusive,
//! "limit reached".

#[path = "common/layer_cuts.rs"]
mod layer_cuts;
use layer_cuts::{
    backward_scales, cut_at_layers, cut_at_modules, microbatch_backward_scales,
    microbatch_cuts_at_modules,
};
use shardproof_prove::{prove_case, CutScales, PlanOptions, ProveConfig};
use shardproof_zoo::{emit_to_dir, find_preset, TrainOptions};
use std::time::{Duration, Instant};

/// The process's peak resident set, in GB, where /proc tells it.
fn peak_gb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0 / 1024.0)
}

/// The sizes shape reduction left at their original values (the largest first) and why: a
/// pinned variable's literal or operator, a size kept whole by the equation that kept it.
fn print_unreduced(red: &serde_json::Value) {
    let mut kept: Vec<(u64, String)> = Vec::new();
    for s in red["sizes"].as_array().into_iter().flatten() {
        let (orig, reduced) = (s["original"].as_u64(), s["reduced"].as_u64());
        if let (Some(o), Some(r)) = (orig, reduced) {
            if o == r && o > 8 {
                let why = s["why"]
                    .as_str()
                    .unwrap_or("no smaller size avoids the literals");
                kept.push((
                    o,
                    format!("{} ({why})", s["origin"].as_str().unwrap_or("?")),
                ));
            }
        }
    }
    for k in red["kept_whole"].as_array().into_iter().flatten() {
        if let Some(o) = k["size"].as_u64().filter(|&o| o > 8) {
            kept.push((
                o,
                format!(
                    "{} kept whole ({})",
                    k["origin"].as_str().unwrap_or("?"),
                    k["why"].as_str().unwrap_or("?")
                ),
            ));
        }
    }
    // One line per kind (digits, as in file lines and value numbers, ignored), with a count:
    // a layer's microbatches repeat the same reason.
    kept.sort_by(|a, b| b.cmp(a));
    let mut kinds: Vec<(u64, String, String, usize)> = Vec::new();
    for (size, what) in kept {
        let kind: String = what.chars().filter(|c| !c.is_ascii_digit()).collect();
        match kinds.iter_mut().find(|k| k.0 == size && k.1 == kind) {
            Some(k) => k.3 += 1,
            None => kinds.push((size, kind, what, 1)),
        }
    }
    for (size, _, what, n) in kinds.iter().take(12) {
        println!("    unreduced {size} (x{n}): {what}");
    }
    // The largest reduced sizes, and the spec inputs' shapes: where the elements remain.
    let mut reduced: Vec<(u64, u64, &str)> = red["sizes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            Some((
                s["reduced"].as_u64()?,
                s["original"].as_u64()?,
                s["origin"].as_str()?,
            ))
        })
        .filter(|&(r, o, _)| r != o && r > 2)
        .collect();
    reduced.sort_by(|a, b| b.cmp(a));
    for (r, o, origin) in reduced.iter().take(6) {
        println!("    reduced {o} -> {r}: {origin}");
    }
    for i in red["inputs"].as_array().into_iter().flatten().take(8) {
        println!(
            "    input {} {} -> {}",
            i["name"], i["original"], i["reduced"]
        );
    }
}

/// The process's CPU time so far (user and system), in seconds, where /proc tells it.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) start at its closing paren.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// `--plan-only`: the plan alone (no stage proved), with its wall and CPU time: stages,
/// distinct stages, and where a time limit stopped it.
fn print_plan(
    name: &str,
    case: &shardproof_case::Case,
    opts: &PlanOptions,
    limit: f64,
    started: Instant,
) {
    let opts = PlanOptions {
        deadline: Some(started + Duration::from_secs_f64(limit)),
        ..opts.clone()
    };
    let cpu_before = cpu_seconds().unwrap_or(f64::NAN);
    let planned = Instant::now();
    let plan = shardproof_prove::stage::plan_until(case, true, &opts);
    let wall = planned.elapsed().as_secs_f64();
    let cpu = cpu_seconds().unwrap_or(f64::NAN) - cpu_before;
    match plan {
        Ok(plan) => println!(
            "{name} plan: {} stages, {} distinct, digest {}; plan {wall:.1} s wall, {cpu:.1} s CPU, peak {:.2} GB",
            plan.stages.len(),
            plan.distinct.len(),
            plan.digest,
            peak_gb().unwrap_or(f64::NAN)
        ),
        Err(e) => println!(
            "{name} plan: not made ({e}); {wall:.1} s wall, {cpu:.1} s CPU, peak {:.2} GB",
            peak_gb().unwrap_or(f64::NAN)
        ),
    }
}

/// `prove_staged_with` on one thread, printing the plan phase's wall and CPU time and the
/// peak memory after it before the stages are proved.
fn prove_planned(
    case: &shardproof_case::Case,
    cfg: &ProveConfig,
    opts: &PlanOptions,
    started: Instant,
) -> shardproof_prove::StagedProof {
    use shardproof_prove::stage::{assemble, limit_reached, prove_stages, refused, PlanError};
    let opts = PlanOptions {
        deadline: cfg.time_limit.map(|t| started + t),
        ..opts.clone()
    };
    let cpu_before = cpu_seconds().unwrap_or(f64::NAN);
    let planned = Instant::now();
    let plan = shardproof_prove::stage::plan_until(case, cfg.reduce, &opts);
    println!(
        "  plan phase: {:.1} s wall, {:.1} s CPU, peak {:.2} GB",
        planned.elapsed().as_secs_f64(),
        cpu_seconds().unwrap_or(f64::NAN) - cpu_before,
        peak_gb().unwrap_or(f64::NAN)
    );
    let plan = match plan {
        Ok(p) => p,
        Err(PlanError::Refused(why)) => return refused(case, &why),
        Err(PlanError::OutOfTime(why)) => return limit_reached(case, &why),
    };
    let outcomes = prove_stages(&plan, &plan.distinct, cfg, 1)
        .into_iter()
        .map(|(k, o, _)| (k, o))
        .collect();
    assemble(case, &plan, &outcomes)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let limit = args
        .iter()
        .position(|a| a == "--time-limit")
        .and_then(|i| args.get(i + 1))
        .map_or(600.0, |s| s.parse().expect("--time-limit SECONDS"));
    let mut names: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| {
            !a.starts_with("--")
                && (*i == 0 || (args[i - 1] != "--time-limit" && args[i - 1] != "--dir"))
        })
        .map(|(_, a)| a.as_str())
        .collect();
    let forward = args.iter().any(|a| a == "--forward");
    let whole = args.iter().any(|a| a == "--whole");
    let plan_only = args.iter().any(|a| a == "--plan-only");
    if names.is_empty() {
        names = vec!["llama3-8b", "llama3-405b", "deepseek-v3-671b"];
    }
    for name in names {
        let preset = find_preset(name).expect("a zoo preset");
        let (mut opts, extras, pipeline) = preset.request();
        opts.forward_only = forward;
        let temp = tempfile::tempdir().expect("a temporary directory");
        // `--dir D` emits into D/NAME (kept afterwards, to read the graphs).
        let kept = args
            .iter()
            .position(|a| a == "--dir")
            .and_then(|i| args.get(i + 1))
            .map(|d| std::path::Path::new(d).join(name));
        if let Some(d) = &kept {
            std::fs::create_dir_all(d).expect("--dir");
        }
        let dir = kept.as_deref().unwrap_or(temp.path());
        let started = Instant::now();
        emit_to_dir(&opts, &extras, &TrainOptions::PLAIN, &pipeline, dir).expect("emit");
        let emitted = started.elapsed().as_secs_f64();
        let case_started = Instant::now();
        if !whole {
            let (cuts, scales, microbatch_cuts) = if forward {
                // Every module output where a pipeline stage computes it per microbatch: an
                // MoE block's lineage names the block's output, not the residual stream after
                // it, so the attention's output (the residual before it) is cut too.
                (
                    cut_at_layers(dir),
                    CutScales::new(),
                    microbatch_cuts_at_modules(dir, false),
                )
            } else {
                // A pipeline's microbatched cuts at module outputs and input gradients, the
                // gradients scaled by the replica count as the plain backward cuts are.
                let cuts = cut_at_modules(dir, true);
                let micro = microbatch_cuts_at_modules(dir, true);
                let mut scales = backward_scales(dir);
                scales.extend(microbatch_backward_scales(dir, &micro));
                (cuts, scales, micro)
            };
            let cuts = cuts + microbatch_cuts.len();
            let micro = microbatch_cuts.len();
            let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
            let cfg = ProveConfig {
                time_limit: Some(Duration::from_secs_f64(limit)),
                started: Some(case_started),
                ..ProveConfig::default()
            };
            // Apart, each layer's weight updates are one stage proved once for all layers.
            let opts = PlanOptions {
                scales: scales.clone(),
                outputs_apart: !forward,
                microbatch_cuts,
                ..PlanOptions::default()
            };
            if plan_only {
                print_plan(name, &case, &opts, limit, case_started);
                continue;
            }
            let proof = prove_planned(&case, &cfg, &opts, case_started);
            let secs = case_started.elapsed().as_secs_f64();
            // Stages proved (by their own proof or a memo hit's) against the distinct stages
            // proved: the first is what the case's verdict needs, the second what was proved.
            let proved = |s: &&shardproof_prove::stage::StageReport| {
                s.verdict == Some(shardproof_prove::Verdict::Proved)
            };
            let covered = proof.stages.iter().filter(proved).count();
            let own = || proof.stages.iter().filter(|s| !s.memo_hit);
            let distinct_proved = own().filter(proved).count();
            let not_begun = own()
                .filter(|s| {
                    s.message
                        .as_deref()
                        .is_some_and(|m| m.contains("ran out before this stage began"))
                })
                .count();
            let stages_line = format!(
                "{} stages, {covered} of them proved; {} distinct, {distinct_proved} of them proved, {not_begun} not begun; {} memo hits",
                proof.stages.len(),
                proof.distinct_stages,
                proof.memo_hits
            );
            println!(
                "{name} {} ({}; {} ranks; cut at {cuts} {}, {} of them scaled gradients, {micro} microbatched): {:?} in {secs:.1} s (emitted in {emitted:.1} s), {stages_line}, goals by layer {:?}, peak {:.2} GB{}",
                if forward { "forward" } else { "full iteration" },
                preset.plan_note(),
                case.program.ranks.len(),
                if forward { "layer outputs" } else { "module outputs and input gradients" },
                scales.len(),
                proof.verdict,
                proof.layers,
                peak_gb().unwrap_or(f64::NAN),
                proof
                    .message
                    .as_deref()
                    .map(|m| format!("\n  {m}"))
                    .unwrap_or_default()
            );
            for p in &proof.proofs {
                let q = &p.proof;
                let mesh = &q["mesh"];
                let red = &q["reduction"];
                println!(
                    "  stage {} ({}): {}, goals {}{}{}",
                    p.stage,
                    proof.stages[p.stage].target,
                    q["verdict"],
                    q["layers"],
                    if mesh.is_object() {
                        format!(
                            ", {} {} -> {}",
                            mesh["dim"], mesh["original"], mesh["reduced"]
                        )
                    } else {
                        String::new()
                    },
                    if red.is_object() {
                        format!(
                            ", {} -> {} tensor elements on two replicas before and after shape reduction",
                            red["elements_before"], red["elements_after"]
                        )
                    } else {
                        String::new()
                    }
                );
                if let Some(m) = q["message"].as_str() {
                    println!("    {m}");
                }
                if q["verdict"] != "proved" && red.is_object() {
                    print_unreduced(red);
                }
            }
            continue;
        }
        let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
        let cfg = ProveConfig {
            time_limit: Some(Duration::from_secs_f64(limit)),
            ..ProveConfig::default()
        };
        let started = Instant::now();
        let proof = prove_case(&case, &cfg);
        let secs = started.elapsed().as_secs_f64();
        let (before, after) = proof
            .reduction
            .as_ref()
            .map_or((0, 0), |r| (r.elements_before, r.elements_after));
        println!(
            "{name} ({}; {} ranks): {:?} in {secs:.1} s (emitted in {emitted:.1} s), {before:.3e} -> {after:.3e} tensor elements, peak {:.2} GB{}",
            preset.plan_note(),
            case.program.ranks.len(),
            proof.verdict,
            peak_gb().unwrap_or(f64::NAN),
            proof
                .message
                .as_deref()
                .map(|m| format!("\n  {m}"))
                .unwrap_or_default()
        );
    }
}
