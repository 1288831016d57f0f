//! Throughput of `shardproof check` on the zoo presets: operators checked per second per core.
//!
//! `cargo run --release -p shardproof-check --example throughput [PRESET...]` emits each preset
//! (default: every `-tiny` preset; name the full-size ones to run them) into a temporary
//! directory, loads it, checks it `REPEAT` times (env `BENCH_REPEAT`, default 1) and prints the
//! best time. The checker runs on one thread, so operators per second is per core. Emitting and
//! loading are not timed. `BENCH_TWINS=1` prints how many ranks took a twin's placements. No
//! assertion: figures only.

use shardproof_check::check_case;
use shardproof_zoo::{emit_pipelined, find_preset, TrainOptions, PRESETS};
use std::time::Instant;

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
    println!(
        "{:<22} {:>6} {:>12} {:>10} {:>14}  verdict",
        "preset", "ranks", "operators", "best ms", "ops/s/core"
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
        let dir = tempfile::tempdir().expect("a temporary directory");
        let emitted = match emit_pipelined(&opts, &extras, &TrainOptions::default(), &pipeline) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        // BENCH_KEEP=DIR keeps the emitted case in DIR/PRESET, for reading its graphs.
        let keep = std::env::var_os("BENCH_KEEP").map(|k| std::path::PathBuf::from(k).join(name));
        let dir_path = keep.clone().unwrap_or_else(|| dir.path().to_path_buf());
        if let Err(e) = emitted.write(&dir_path) {
            eprintln!("{name}: {e}");
            continue;
        }
        let case = match shardproof_case::load_case(&dir_path.join("case.yaml")) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        let mut best = f64::INFINITY;
        let mut last = None;
        for _ in 0..repeat {
            let t = Instant::now();
            let r = check_case(&case);
            best = best.min(t.elapsed().as_secs_f64());
            last = Some(r);
        }
        match last {
            Some(Ok(r)) => {
                all_ops += r.operators;
                all_s += best;
                println!(
                    "{:<22} {:>6} {:>12} {:>10.1} {:>14.0}  {:?} ({} findings, {} unknown)",
                    name,
                    r.ranks,
                    r.operators,
                    best * 1e3,
                    r.operators as f64 / best,
                    r.verdict,
                    r.findings.len(),
                    r.unknown_values
                );
                // BENCH_TWINS=1 counts the ranks whose placements a twin's run gave (an
                // untimed propagation more).
                if std::env::var_os("BENCH_TWINS").is_some() {
                    if let Ok(p) = shardproof_check::propagate(&case) {
                        println!("    twin ranks: {} of {}", p.twin_ranks, r.ranks);
                    }
                }
                // BENCH_UNKNOWN=1 lists the findings and where the unknown placements begin.
                if std::env::var_os("BENCH_UNKNOWN").is_some() {
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
