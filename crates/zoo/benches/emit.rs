//! Emission benchmark: emits every preset at its default plan (`zoo emit --preset NAME`) into a
//! temporary directory and prints one line per preset: ranks, rank graph files, nodes (spec and
//! all ranks), bytes written, seconds and peak memory. Run with
//! `cargo bench -p shardproof-zoo --bench emit` (release build); name presets as arguments to
//! run only those (`cargo bench -p shardproof-zoo --bench emit -- llama3-405b`).
//!
//! Peak memory is the process's VmHWM (peak resident set) from `/proc/self/status`, reset
//! before each preset by writing `5` to `/proc/self/clear_refs` (Linux >= 4.0); where the
//! reset is refused the column is the peak since the process started, and the header says so.
//! The bytes written are what an emission that kept every file in memory would have held.
//!
//! Figures are printed, never asserted: they depend on the machine.

use shardproof_zoo::{emit_to_dir, TrainOptions, PRESETS};
use std::path::Path;
use std::time::Instant;

/// A `kB` field of `/proc/self/status` (`VmHWM`, `VmRSS`), in MiB.
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Resets VmHWM to the current resident set; false where the kernel refuses.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Total size of the files in `dir`.
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    // `cargo bench` passes `--bench`; every other argument names a preset.
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let resettable = reset_peak();
    println!(
        "{:<24} {:>6} {:>6} {:>8} {:>11} {:>10} {:>9} {:>10}",
        "preset",
        "ranks",
        "files",
        "spec",
        "rank nodes",
        "MB written",
        "seconds",
        if resettable { "peak MiB" } else { "peak MiB*" }
    );
    for preset in PRESETS {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == preset.name) {
            continue;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (opts, extras, pipeline) = preset.request();
        reset_peak();
        let start = Instant::now();
        let emitted = emit_to_dir(&opts, &extras, &TrainOptions::PLAIN, &pipeline, dir.path());
        let seconds = start.elapsed().as_secs_f64();
        let peak = status_mib("VmHWM:").unwrap_or(f64::NAN);
        match emitted {
            Ok(s) => println!(
                "{:<24} {:>6} {:>6} {:>8} {:>11} {:>10.1} {:>9.2} {:>10.1}",
                preset.name,
                s.ranks,
                s.rank_files,
                s.spec_nodes,
                s.rank_nodes,
                bytes_in(dir.path()) as f64 / 1e6,
                seconds,
                peak
            ),
            Err(e) => println!("{:<24} error: {e}", preset.name),
        }
    }
    if !resettable {
        println!("* peak since the process started: /proc/self/clear_refs refused the reset");
    }
}
