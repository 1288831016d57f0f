//! Throughput of `shardproof check` on the zoo presets: operators checked per second per core.
//!
//! `cargo run --release -p shardproof-check --example throughput [PRESET...]` emits each preset
//! (default: every `-tiny` preset; name the full-size ones, e.g. `llama3-405b`, to run them)
//! into a temporary directory the way `zoo emit --preset` does (a file per distinct rank
//! program), loads it, checks it `REPEAT` times (env `BENCH_REPEAT`, default 1) and prints, per
//! preset: the emit, load and best check seconds, the distinct rank files, the rank nodes (every
//! rank counted, shared files too), the operators the checker counted, operators per second
//! per core (both counts over the check time; the checker runs on one thread), the peak
//! resident set after each phase (VmHWM from `/proc/self/status`, reset before each preset by
//! writing `5` to `/proc/self/clear_refs`; a `*` marks peaks that could not be reset, i.e.
//! since the process started) and the verdict; then the check's CPU seconds and the rates over
//! them (what one core gives where other jobs share the machine).
//!
//! `BENCH_KEEP=DIR` keeps each emitted case in `DIR/PRESET`; with `BENCH_REUSE=1` a case kept
//! there earlier is loaded instead of emitted again (emit seconds then read 0).
//! Findings are printed verbatim. `BENCH_TWINS=1` prints how many ranks took a twin's
//! placements, `BENCH_UNKNOWN=1` where unknown placements begin. No assertion: figures only.

use shardproof_check::check_case;
use shardproof_zoo::{emit_to_dir, find_preset, TrainOptions, PRESETS};
use std::path::Path;
use std::time::Instant;

/// A `kB` field of `/proc/self/status` (`VmHWM`), in MiB.
fn status_mib(field: &str) -> f64 {
    let read = || -> Option<f64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    read().unwrap_or(f64::NAN)
}

/// CPU seconds this process has used (user + system, every thread), from `/proc/self/stat`
/// at 100 ticks a second (Linux's USER_HZ): on a machine shared with other jobs the check's
/// CPU time, not its wall time, is what one core gives.
fn cpu_seconds() -> f64 {
    let read = || -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces) closed by `)`.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (utime, stime): (f64, f64) =
            (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
        Some((utime + stime) / 100.0)
    };
    read().unwrap_or(f64::NAN)
}

/// Resets VmHWM to the current resident set; false where the kernel refuses.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Total size of the files in `dir`, in MB.
fn megabytes_in(dir: &Path) -> f64 {
    let bytes: u64 = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    bytes as f64 / 1e6
}

/// What the emit phase gave: rank files and rank nodes (unknown when a kept case was reused).
struct Emitted {
    seconds: f64,
    rank_files: Option<usize>,
    rank_nodes: Option<usize>,
}

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<String> = if names.is_empty() {
        PRESETS
            .iter()
            .filter(|p| p.name.ends_with("-tiny"))
            .map(|p| p.name.to_string())
            .collect()
    } else {
        names
    };
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let resettable = reset_peak();
    let star = if resettable { "" } else { "*" };
    println!(
        "{:<22} {:>5} {:>5} {:>11} {:>11} {:>8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>8} {:>8}  verdict",
        "preset",
        "ranks",
        "files",
        "rank nodes",
        "operators",
        "emit s",
        "load s",
        "check s",
        "nodes/s/c",
        "ops/s/core",
        format!("emitMiB{star}"),
        format!("loadMiB{star}"),
        format!("peakMiB{star}"),
    );
    let (mut all_ops, mut all_s) = (0usize, 0f64);
    for name in &names {
        let preset = match find_preset(name) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        let (opts, extras, pipeline) = preset.request();
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let keep = std::env::var_os("BENCH_KEEP").map(|k| std::path::PathBuf::from(k).join(name));
        let dir = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
        let reuse = keep.is_some()
            && std::env::var_os("BENCH_REUSE").is_some()
            && dir.join("case.yaml").is_file();
        reset_peak();
        let emitted = if reuse {
            Emitted {
                seconds: 0.0,
                rank_files: None,
                rank_nodes: None,
            }
        } else {
            let t = Instant::now();
            match emit_to_dir(&opts, &extras, &TrainOptions::default(), &pipeline, &dir) {
                Ok(s) => Emitted {
                    seconds: t.elapsed().as_secs_f64(),
                    rank_files: Some(s.rank_files),
                    rank_nodes: Some(s.rank_nodes),
                },
                Err(e) => {
                    eprintln!("{name}: {e}");
                    continue;
                }
            }
        };
        let emit_mib = status_mib("VmHWM:");
        // Progress on stderr, so that a run stopped by a memory limit still says how far it got.
        eprintln!(
            "{name}: emitted in {:.1} s ({} files, {} rank nodes), peak {emit_mib:.0} MiB",
            emitted.seconds,
            emitted.rank_files.map_or("-".into(), |n| n.to_string()),
            emitted.rank_nodes.map_or("-".into(), |n| n.to_string()),
        );
        let t = Instant::now();
        let case = match shardproof_case::load_case(&dir.join("case.yaml")) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        let load_s = t.elapsed().as_secs_f64();
        let load_mib = status_mib("VmHWM:");
        eprintln!("{name}: loaded in {load_s:.1} s, peak {load_mib:.0} MiB");
        let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
        let mut last = None;
        for _ in 0..repeat {
            let (t, cpu) = (Instant::now(), cpu_seconds());
            let r = check_case(&case);
            best = best.min(t.elapsed().as_secs_f64());
            best_cpu = best_cpu.min(cpu_seconds() - cpu);
            last = Some(r);
        }
        let peak_mib = status_mib("VmHWM:");
        let count = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
        match last {
            Some(Ok(r)) => {
                all_ops += r.operators;
                all_s += best;
                let per_s = |n: Option<usize>| {
                    n.map_or("-".to_string(), |n| format!("{:.0}", n as f64 / best))
                };
                println!(
                    "{:<22} {:>5} {:>5} {:>11} {:>11} {:>8.1} {:>8.1} {:>8.1} {:>11} {:>11.0} {:>8.0} {:>8.0} {:>8.0}  {:?} ({} findings, {} unknown)",
                    name,
                    r.ranks,
                    count(emitted.rank_files),
                    count(emitted.rank_nodes),
                    r.operators,
                    emitted.seconds,
                    load_s,
                    best,
                    per_s(emitted.rank_nodes),
                    r.operators as f64 / best,
                    emit_mib,
                    load_mib,
                    peak_mib,
                    r.verdict,
                    r.findings.len(),
                    r.unknown_values
                );
                println!(
                    "    case: {:.1} MB on disk; check CPU {best_cpu:.1} s: {:.0} rank nodes/CPU-s, \
                     {:.0} operators/CPU-s",
                    megabytes_in(&dir),
                    emitted.rank_nodes.map_or(f64::NAN, |n| n as f64 / best_cpu),
                    r.operators as f64 / best_cpu
                );
                // BENCH_TWINS=1 counts the ranks whose placements a twin's run gave (an
                // untimed propagation more).
                if std::env::var_os("BENCH_TWINS").is_some() {
                    if let Ok(p) = shardproof_check::propagate(&case) {
                        println!(
                            "    twin ranks: {} of {}; runs again: {}, {} of them a twin's",
                            p.twin_ranks, r.ranks, p.again_runs, p.again_twin_runs
                        );
                    }
                }
                // Findings verbatim: a preset's plan is expected to hold.
                for f in &r.findings {
                    println!(
                        "    finding {} rank(s) {:?} {} {}: {}",
                        f.check.name(),
                        f.ranks,
                        f.node,
                        f.op.clone().unwrap_or_default(),
                        f.message
                    );
                }
                // BENCH_UNKNOWN=1 lists where the unknown placements begin.
                if std::env::var_os("BENCH_UNKNOWN").is_some() {
                    for u in &r.unknown {
                        println!("    {} x {} (first: {})", u.count, u.reason, u.first);
                    }
                }
            }
            Some(Err(e)) => eprintln!("{name}: invalid: {e}"),
            None => {}
        }
    }
    if all_s > 0.0 {
        println!(
            "total: {all_ops} operators in {:.1} ms: {:.0} operators/s/core",
            all_s * 1e3,
            all_ops as f64 / all_s
        );
    }
}
