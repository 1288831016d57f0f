//! The `trace compare` benchmark: writes a synthetic reference (with one perturbed run) and a
//! tensor x data parallel candidate trace of at least `--gb` GB (default 2) in a temporary
//! directory, compares them, prints the throughput and the peak resident memory of the
//! comparison, and deletes the traces.
//!
//! `cargo run --release -p shardproof-trace --example bench -- [--gb 2] [--dtype float32|bfloat16]`
//!
//! Throughput is candidate bytes per second and all bytes read (reference, perturbed run,
//! candidate) per second. The traces were just written, so they are read from the page cache:
//! the figure is the comparer's, not the disk's. Peak memory is the process's peak resident set
//! during the comparison (reset before it through /proc/self/clear_refs, on Linux), mapped
//! pages included; the comparer drops each tensor's pages when done with it.

use shardproof_trace::synthetic::{
    candidate_bytes, largest_tensor, write_candidate, write_reference, Spec,
};
use shardproof_trace::{compare_dirs, RunDtype};
use std::time::Instant;

fn status_kb(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User and system CPU seconds of this process so far (Linux; clock ticks of 1/100 s).
fn cpu_seconds() -> Option<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |k: usize| fields.get(k)?.parse::<f64>().ok().map(|t| t / 100.0);
    Some((ticks(11)?, ticks(12)?))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|k| args.get(k + 1))
            .cloned()
    };
    let gb: f64 = value("--gb").and_then(|v| v.parse().ok()).unwrap_or(2.0);
    let dtype = value("--dtype")
        .and_then(|d| RunDtype::parse(&d))
        .unwrap_or(RunDtype::Float32);
    // Square weights of 4096 (67 MB of f32 each) and as many tokens as it takes to reach the size.
    let mut spec = Spec {
        layers: 8,
        hidden: 4096,
        tokens: 256,
        dtype,
        tp: 2,
        dp: 2,
        noise: 1.0,
        bug: None,
    };
    while (candidate_bytes(&spec) as f64) < gb * 1e9 {
        spec.tokens += 256;
    }
    let dir = tempfile::Builder::new()
        .prefix("shardproof-trace-bench-")
        .tempdir()
        .expect("a temporary directory");
    let (r, c) = (dir.path().join("ref"), dir.path().join("cand"));
    let started = Instant::now();
    write_reference(&r, &spec, 1).expect("the reference is written");
    write_candidate(&c, &spec).expect("the candidate is written");
    let size = dtype.storage()[0].size() as u64;
    println!(
        "wrote {:.2} GB candidate ({} ranks, {} layers, {} tokens x {} hidden, {dtype}) and its reference with 1 perturbed run in {:.1} s",
        candidate_bytes(&spec) as f64 / 1e9,
        spec.tp * spec.dp,
        spec.layers,
        spec.tokens,
        spec.hidden,
        started.elapsed().as_secs_f64()
    );
    // Reset the peak resident set so it measures the comparison only.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_kb("VmRSS:").unwrap_or(0);
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let result = compare_dirs(&r, &c).expect("the traces are valid");
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_before
        .zip(cpu_seconds())
        .map(|((u0, s0), (u1, s1))| (u1 - u0, s1 - s0));
    let peak = status_kb("VmHWM:").unwrap_or(0);
    println!(
        "verdict: {:?} ({} tensors compared)",
        result.verdict, result.compared
    );
    println!(
        "compare: {:.2} s, {:.2} GB/s of candidate trace, {:.2} GB/s of all data read ({:.2} GB) on {} threads",
        seconds,
        candidate_bytes(&spec) as f64 / 1e9 / seconds,
        result.bytes_read as f64 / 1e9 / seconds,
        result.bytes_read as f64 / 1e9,
        rayon::current_num_threads()
    );
    if let Some((user, system)) = cpu {
        println!(
            "cpu: {user:.2} s user, {system:.2} s system: {:.2} GB/s of all data read per CPU second (the machine's load shares the cores)",
            result.bytes_read as f64 / 1e9 / (user + system)
        );
    }
    println!(
        "memory: peak resident {:.0} MB during compare{} (resident before: {:.0} MB); largest logical tensor {:.0} MB",
        peak as f64 / 1024.0,
        if reset { "" } else { " (peak not reset: the whole process)" },
        before as f64 / 1024.0,
        (largest_tensor(&spec) * size) as f64 / 1e6
    );
    drop(dir);
}
