//! The figures issue 48 sets as `verify`'s targets, printed one line per case: the Megatron GPT
//! sample (case-tp2), every catalog bug the catalog assigns to `verify` (each timed), the demo's
//! planted bug, llama tp=2 with 1 and 8 layers, llama3-70b-tiny, deepseek-v3-671b-tiny's full
//! iteration and the 16-rank DeepSeek full iteration (one layer).
//!
//! ```sh
//! cargo build --release -p shardproof            # the cases are emitted by `shardproof zoo emit`
//! SHARDPROOF_SHARED=/work/shared cargo run --release -p shardproof-refine --example targets -- \
//!     [GROUP ...] [--repeats N] [--jobs N] [--no-reuse] [--no-fast-path] [--slowest N]
//! ```
//!
//! `--slowest N` prints, after each case's line, its N slowest spec operators (wall seconds of
//! their inference, and how each was related: see `Outcome::operator_times`), and the time per
//! path; at `--jobs 1` those seconds add up to the walk's time. `--dump FILE` runs with
//! `Options::trace` and writes each case's outcome to FILE (appended, one case after another),
//! timing and the unserialized counters aside: the reports and every operator's relation, to
//! compare byte for byte across builds or `--jobs`.
//!
//! `--case FILE` (repeatable) times a case file as well, after the groups (none by default
//! when a case is given); `--node-limit N` sets `Options::node_limit` (to make a small case go
//! piecewise, say).
//!
//! `--no-reuse` infers every operator afresh (no twin's relation reused, see `Options::reuse`),
//! for the figures before and after repeated layers were solved once; each line also counts
//! the operators related by reuse, and the pieces of piecewise inference related by a sibling
//! piece over other ranks (symmetric ranks solved once; `--no-reuse` turns both off), and those
//! the fast path's placement rules decided with no e-graph (`--no-fast-path` turns it off, see
//! `Options::fast_path`).
//!
//! Groups: `sample`, `catalog`, `demo`, `layers` (the default set, a few minutes on two cores),
//! and the slow ones `70b`, `671b`, `deepseek16` (minutes each); `all` runs every group. A
//! word that is no group keeps the catalog entries whose bug id contains it. Emission is not
//! timed; each line is the run with the least CPU of `--repeats` runs (default 1) of [`verify`] alone.
//! `SHARDPROOF_BIN` names the `shardproof` binary (default: the workspace's release build).
//!
//! Figures are printed, never asserted: timings depend on the machine. Each line gives the
//! wall time and the process's CPU time (all threads) of the same run: on a machine shared with
//! other jobs the wall time grows with the load, the CPU time much less.

use shardproof_case::{load_case, Case};
use shardproof_refine::{verify, Options, Outcome};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The Megatron GPT sample needs the values of its four cross-entropy constants.
const GPT_CONSTANTS: &str =
    "constants:\n  _tensor_constant0: 0\n  _tensor_constant1: 0.0\n  _tensor_constant2: 0\n  _tensor_constant3: 0.0\n";

/// Emit flags of a pipelined catalog entry: two microbatches of two rows over two layers.
const PIPELINED: &[&str] = &["--microbatches", "2", "--layers", "2", "--batch", "4"];

/// Every catalog bug the catalog assigns to `verify`, on every model it is defined for: (model,
/// bug, mesh, emit flags) — the plans crates/cli/tests/verify.rs refutes at their operator.
const CATALOG: &[(&str, &str, &str, &[&str])] = &[
    ("mlp", "tp-missing-allreduce", "tp=2", &[]),
    ("gpt2", "tp-missing-allreduce", "tp=2", &[]),
    ("mlp", "tp-bias-before-allreduce", "tp=2", &[]),
    ("gpt2", "tp-bias-before-allreduce", "tp=2", &[]),
    ("mlp", "dp-loss-not-averaged", "dp=2", &[]),
    ("llama", "dp-loss-not-averaged", "dp=2", &[]),
    ("gpt2", "dp-loss-not-averaged", "dp=2", &[]),
    ("mlp", "dp-grad-not-averaged", "dp=2", &[]),
    ("llama", "dp-grad-not-averaged", "dp=2", &[]),
    ("gpt2", "dp-grad-not-averaged", "dp=2", &[]),
    ("mlp", "wrong-group", "dp=2,tp=2", &[]),
    ("llama", "wrong-group", "dp=2,tp=2", &[]),
    ("gpt2", "wrong-group", "dp=2,tp=2", &[]),
    ("llama", "llama-oproj-missing-allreduce", "tp=2", &[]),
    ("llama", "llama-attn-scale-local", "tp=2", &[]),
    ("llama", "llama-qkv-grad-missing-allreduce", "tp=2", &[]),
    ("llama", "llama-kv-grad-unsynced", "tp=4", &[]),
    (
        "gpt2",
        "sp-layernorm-grad-not-reduced",
        "tp=2",
        &["--sequence-parallel"],
    ),
    (
        "mlp",
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
    ),
    (
        "llama",
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
    ),
    (
        "gpt2",
        "grad-accum-loss-not-scaled",
        "dp=2",
        &["--grad-accum", "2", "--batch", "4"],
    ),
    ("mlp", "zero-param-update-skipped", "dp=2", &["--zero", "1"]),
    (
        "llama",
        "zero-param-update-skipped",
        "dp=2",
        &["--zero", "1"],
    ),
    (
        "gpt2",
        "zero-param-update-skipped",
        "dp=2",
        &["--zero", "1"],
    ),
    (
        "mlp",
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
    ),
    (
        "llama",
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
    ),
    (
        "gpt2",
        "grad-norm-replicated-overcounted",
        "tp=2",
        &["--clip-grad", "1.0"],
    ),
    (
        "mlp",
        "pp-grad-sync-before-last-microbatch",
        "pp=2,dp=2",
        PIPELINED,
    ),
    (
        "llama",
        "pp-grad-sync-before-last-microbatch",
        "pp=2,dp=2",
        PIPELINED,
    ),
    (
        "gpt2",
        "pp-grad-sync-before-last-microbatch",
        "pp=2,dp=2",
        PIPELINED,
    ),
    ("mlp", "pp-shuffled-microbatches", "pp=2", PIPELINED),
    ("llama", "pp-shuffled-microbatches", "pp=2", PIPELINED),
    ("gpt2", "pp-shuffled-microbatches", "pp=2", PIPELINED),
    ("deepseek", "pp-shuffled-microbatches", "pp=2", PIPELINED),
    ("mlp", "dangling-backward-tensor", "dp=2", &[]),
    ("mlp", "dangling-backward-tensor", "tp=2", &[]),
    (
        "gpt2",
        "zero-tied-embedding-untied",
        "dp=2",
        &["--zero", "1"],
    ),
    ("mlp", "fp8-amax-wrong-group", "dp=2,tp=2", &["--fp8"]),
    (
        "mlp",
        "loss-scale-not-unscaled",
        "dp=2",
        &["--loss-scale", "8"],
    ),
    (
        "llama",
        "loss-scale-not-unscaled",
        "dp=2",
        &["--loss-scale", "8"],
    ),
    (
        "gpt2",
        "loss-scale-not-unscaled",
        "dp=2",
        &["--loss-scale", "8"],
    ),
    ("deepseek", "moe-aux-loss-not-divided-by-tp", "tp=2", &[]),
    ("deepseek", "moe-router-grad-unsynced", "tp=2", &[]),
    ("deepseek", "norm-sharded-hidden", "tp=2", &[]),
    ("deepseek", "ep-expert-grad-not-averaged", "ep=2", &[]),
];

/// The groups run when none is named.
const DEFAULT_GROUPS: &[&str] = &["sample", "catalog", "demo", "layers"];
/// Every group.
const ALL_GROUPS: &[&str] = &[
    "sample",
    "catalog",
    "demo",
    "layers",
    "70b",
    "671b",
    "deepseek16",
];

/// The command line: groups, catalog filter words, repeats, jobs.
struct Args {
    groups: Vec<String>,
    words: Vec<String>,
    repeats: usize,
    jobs: Option<usize>,
    reuse: bool,
    fast_path: bool,
    /// How many of each case's slowest operators to print.
    slowest: usize,
    /// Where to write each case's traced outcome.
    dump: Option<PathBuf>,
    /// Case files to time as well (`--case FILE`, repeatable).
    cases: Vec<PathBuf>,
    /// The e-graph node limit, where not the default (`--node-limit N`).
    node_limit: Option<usize>,
}

fn parse_args() -> Args {
    let mut args = Args {
        groups: Vec::new(),
        words: Vec::new(),
        repeats: 1,
        jobs: None,
        reuse: true,
        fast_path: true,
        slowest: 0,
        dump: None,
        cases: Vec::new(),
        node_limit: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repeats" => args.repeats = it.next().and_then(|n| n.parse().ok()).unwrap_or(1),
            "--jobs" => args.jobs = it.next().and_then(|n| n.parse().ok()),
            "--no-reuse" => args.reuse = false,
            "--no-fast-path" => args.fast_path = false,
            "--dump" => args.dump = it.next().map(PathBuf::from),
            "--case" => args.cases.extend(it.next().map(PathBuf::from)),
            "--node-limit" => args.node_limit = it.next().and_then(|n| n.parse().ok()),
            "--slowest" => args.slowest = it.next().and_then(|n| n.parse().ok()).unwrap_or(20),
            "all" => args.groups.extend(ALL_GROUPS.iter().map(|g| g.to_string())),
            g if ALL_GROUPS.contains(&g) => args.groups.push(g.to_string()),
            w if !w.starts_with("--") => args.words.push(w.to_string()),
            _ => {}
        }
    }
    if args.groups.is_empty() && args.cases.is_empty() {
        let groups = if args.words.is_empty() {
            DEFAULT_GROUPS
        } else {
            &["catalog"][..]
        };
        args.groups = groups.iter().map(|g| g.to_string()).collect();
    }
    args
}

/// The `shardproof` binary that emits the zoo cases.
fn shardproof_bin() -> PathBuf {
    std::env::var_os("SHARDPROOF_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/shardproof")
        })
}

/// `shardproof zoo emit ARGS -o DIR`, loaded; why not, when it fails.
fn emit(dir: &Path, args: &[&str]) -> Result<Case, String> {
    let out = Command::new(shardproof_bin())
        .args(["zoo", "emit"])
        .args(args)
        .arg("-o")
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", shardproof_bin().display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    load_case(&dir.join("case.yaml")).map_err(|e| e.to_string())
}

/// This process's CPU time so far (user and system, all threads), in seconds, from
/// `/proc/self/stat` (in USER_HZ ticks, 100 a second on Linux); 0 where it cannot be read.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The command name, field 2, may hold spaces: the fields after it follow its last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: Vec<f64> = rest
        .split_whitespace()
        .skip(11) // state .. cmajflt (fields 3-13): utime and stime are fields 14 and 15
        .take(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    ticks.iter().sum::<f64>() / 100.0
}

/// Verifies `case` `repeats` times; prints the verdict, where it stops, and the wall and CPU
/// time of the run with the least CPU; returns the outcome and that CPU time.
fn time(label: &str, case: &Case, args: &Args) -> (Outcome, f64) {
    let opts = Options {
        jobs: args.jobs,
        reuse: args.reuse,
        fast_path: args.fast_path,
        trace: args.dump.is_some(),
        ..Options::default()
    };
    let opts = Options {
        node_limit: args.node_limit.unwrap_or(opts.node_limit),
        ..opts
    };
    let (mut best, mut wall) = (f64::INFINITY, 0.0);
    let mut last = None;
    for _ in 0..args.repeats.max(1) {
        let (t, c) = (Instant::now(), cpu_seconds());
        let o = verify(case, &opts);
        let cpu = cpu_seconds() - c;
        if cpu < best {
            (best, wall) = (cpu, t.elapsed().as_secs_f64());
        }
        last = Some(o);
    }
    let o = last.expect("one run at least");
    let at = o
        .failure
        .as_ref()
        .map(|f| format!(" at `{}`", f.operator))
        .unwrap_or_default();
    println!(
        "{label:<58} {:>12} {:>5} ops {:>5} skipped {:>5} reused {:>4} pieces {:>4} fast {wall:>9.3} s {best:>8.2} s cpu{at}",
        format!("{:?}", o.verdict).to_lowercase(),
        o.spec_operators,
        o.operators_skipped,
        o.operators_reused,
        o.pieces_reused,
        o.operators_fast,
    );
    if args.slowest > 0 {
        print_slowest(&o, args.slowest);
    }
    if let Some(path) = &args.dump {
        dump(path, label, &o);
    }
    (o, best)
}

/// Appends `o` to `path` under `label`: the whole outcome but its timing and the counters
/// the report does not carry (those differ by design with reuse and the fast path).
fn dump(path: &Path, label: &str, o: &Outcome) {
    use std::io::Write as _;
    let mut o = o.clone();
    o.seconds = 0.0;
    o.operators_reused = 0;
    o.pieces_reused = 0;
    o.operators_fast = 0;
    o.fast_path_differences.clear();
    o.operator_times.clear();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "== {label}\n{o:#?}"));
    if let Err(e) = written {
        println!("    (cannot write {}: {e})", path.display());
    }
}

/// The `n` slowest operators of the last run, and the seconds and operators per path.
fn print_slowest(o: &Outcome, n: usize) {
    let mut by_path: Vec<(&str, f64, usize)> = Vec::new();
    for t in &o.operator_times {
        match by_path.iter_mut().find(|p| p.0 == t.path) {
            Some(p) => (p.1, p.2) = (p.1 + t.seconds, p.2 + 1),
            None => by_path.push((t.path, t.seconds, 1)),
        }
    }
    let paths: Vec<String> = by_path
        .iter()
        .map(|(p, s, k)| format!("{p} {s:.2} s ({k})"))
        .collect();
    println!("    by path: {}", paths.join(", "));
    let mut times: Vec<&shardproof_refine::engine::OperatorTime> =
        o.operator_times.iter().collect();
    times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    for t in times.into_iter().take(n) {
        println!(
            "    {:>8.3} s  {:<9} {:<28} {:<36} {}",
            t.seconds,
            t.path,
            t.tensor,
            t.op,
            t.attempts.join("; ")
        );
    }
}

/// Emits `args` into a scratch directory and times it under `label`.
fn emitted(label: &str, emit_args: &[&str], args: &Args) {
    let tmp = tempfile::tempdir().expect("temp dir");
    match emit(tmp.path(), emit_args) {
        Ok(case) => {
            time(label, &case, args);
        }
        Err(e) => println!("{label:<58} not emitted: {e}"),
    }
}

fn shared() -> Option<PathBuf> {
    let dir = std::env::var_os("SHARDPROOF_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    dir.join("samples/entangle").is_dir().then_some(dir)
}

fn sample(args: &Args) {
    let Some(shared) = shared() else {
        println!("(samples not found: set SHARDPROOF_SHARED to the shared folder)");
        return;
    };
    let samples = shared.join("samples/entangle");
    let tmp = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(samples.join("case-tp2.yaml")).expect("sample case");
    let text = text.replace("gpt/", &format!("{}/", samples.join("gpt").display()));
    let gpt = tmp.path().join("gpt.yaml");
    std::fs::write(&gpt, text + GPT_CONSTANTS).expect("write case");
    for (label, path) in [
        ("sample case-tp2 + constants (target < 0.2 s)", gpt),
        ("sample case-bug-tp2", samples.join("case-bug-tp2.yaml")),
    ] {
        match load_case(&path) {
            Ok(c) => {
                time(label, &c, args);
            }
            Err(e) => println!("{label:<58} {e}"),
        }
    }
}

fn catalog(args: &Args) {
    let mut total = 0.0;
    let mut worst: (f64, String) = (0.0, String::new());
    for &(model, bug, mesh, flags) in CATALOG {
        if !args.words.is_empty() && !args.words.iter().any(|w| bug.contains(w.as_str())) {
            continue;
        }
        let label = format!("catalog {model} {bug} {mesh}");
        let mut emit_args = vec![model, "--mesh", mesh, "--bug", bug];
        emit_args.extend(flags);
        let tmp = tempfile::tempdir().expect("temp dir");
        match emit(tmp.path(), &emit_args) {
            Ok(case) => {
                let (_, s) = time(&label, &case, args);
                total += s;
                if s > worst.0 {
                    worst = (s, label);
                }
            }
            Err(e) => println!("{label:<58} not emitted: {e}"),
        }
    }
    println!(
        "catalog: {total:.2} s of CPU in all (best of repeats); slowest {:.2} s: {} (target < 5 s each)",
        worst.0, worst.1
    );
}

fn main() {
    let args = parse_args();
    println!(
        "{:<58} {:>12} {:>9} {:>13} {:>11} {:>11}",
        "case", "verdict", "spec", "", "wall", "least cpu"
    );
    for group in &args.groups {
        match group.as_str() {
            "sample" => sample(&args),
            "catalog" => catalog(&args),
            "demo" => emitted(
                "demo: llama tp=2 llama-oproj-missing-allreduce (target < 2 s)",
                &[
                    "llama",
                    "--mesh",
                    "tp=2",
                    "--bug",
                    "llama-oproj-missing-allreduce",
                ],
                &args,
            ),
            "layers" => {
                for layers in ["1", "8"] {
                    emitted(
                        &format!("llama tp=2 full layers={layers}"),
                        &["llama", "--mesh", "tp=2", "--layers", layers],
                        &args,
                    );
                }
            }
            "70b" => emitted(
                "preset llama3-70b-tiny (target < 60 s)",
                &["--preset", "llama3-70b-tiny"],
                &args,
            ),
            "671b" => emitted(
                "preset deepseek-v3-671b-tiny full (target < 300 s)",
                &["--preset", "deepseek-v3-671b-tiny"],
                &args,
            ),
            "deepseek16" => emitted(
                "deepseek dp=2,cp=2,tp=2,ep=2 layers=1 full (target < 30 s)",
                &["deepseek", "--mesh", "dp=2,cp=2,tp=2,ep=2", "--layers", "1"],
                &args,
            ),
            _ => {}
        }
    }
    for path in &args.cases {
        let label = path.display().to_string();
        match load_case(path) {
            Ok(c) => {
                time(&label, &c, &args);
            }
            Err(e) => println!("{label:<58} {e}"),
        }
    }
}
