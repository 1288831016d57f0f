//! Runs mutants through the `shardproof` binary and classifies what the engines say.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::{CaseInput, MutationKind, Selected};

/// How to run mutants.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// The `shardproof` binary.
    pub bin: PathBuf,
    /// Mutants run at the same time (each runs its commands one after another).
    pub jobs: usize,
    /// Wall-clock limit of each `shardproof` command.
    pub timeout: Duration,
    /// `verify --time-limit`: how long relation inference may run before verify settles on
    /// its counterexample search alone (`None`: three quarters of `timeout`, so a verify that
    /// runs out of time still reports a verdict with its reason instead of being killed).
    pub verify_time_limit: Option<Duration>,
    /// Seeds of the numeric oracle (`shardproof run --seed S`).
    pub seeds: Vec<u64>,
}

impl DriverOptions {
    /// Defaults: 2 jobs, 60 s per command, seeds 0, 1, 2.
    pub fn new(bin: impl Into<PathBuf>) -> DriverOptions {
        DriverOptions {
            bin: bin.into(),
            jobs: 2,
            timeout: Duration::from_secs(60),
            verify_time_limit: None,
            seeds: vec![0, 1, 2],
        }
    }

    /// The `--time-limit` given to `verify`, in seconds.
    pub fn verify_time_limit_seconds(&self) -> f64 {
        self.verify_time_limit
            .unwrap_or(self.timeout.mul_f64(0.75))
            .as_secs_f64()
    }
}

/// What the numeric oracle (`shardproof run` over the seeds) says of a mutant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OracleClass {
    /// Every seed exits 0: all outputs match.
    Equivalent,
    /// Some seed exits 1: an output differs, or the ranks deadlock.
    NonEquivalent,
    /// Some seed exits 2: the mutant is not a valid program.
    Invalid,
    /// Inconclusive (exit 3) or timed out on some seed, and no seed decided.
    Unknown,
    /// `run` itself crashed (exit outside 0-3, or a signal).
    Crash,
}

impl OracleClass {
    const ALL: [OracleClass; 5] = [
        OracleClass::NonEquivalent,
        OracleClass::Equivalent,
        OracleClass::Invalid,
        OracleClass::Unknown,
        OracleClass::Crash,
    ];
    fn name(self) -> &'static str {
        match self {
            OracleClass::Equivalent => "equivalent",
            OracleClass::NonEquivalent => "non-equivalent",
            OracleClass::Invalid => "invalid",
            OracleClass::Unknown => "unknown",
            OracleClass::Crash => "crash",
        }
    }
}

/// What `shardproof verify` says of a mutant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyVerdict {
    /// Exit 0.
    Verified,
    /// Exit 1.
    Refuted,
    /// Exit 3.
    Inconclusive,
    /// Exit 2.
    Invalid,
    /// Any other exit code, or killed by a signal (a panic exits 101).
    Crash,
    /// Ran past the timeout.
    Timeout,
}

impl VerifyVerdict {
    const ALL: [VerifyVerdict; 6] = [
        VerifyVerdict::Verified,
        VerifyVerdict::Refuted,
        VerifyVerdict::Inconclusive,
        VerifyVerdict::Invalid,
        VerifyVerdict::Crash,
        VerifyVerdict::Timeout,
    ];
    fn name(self) -> &'static str {
        match self {
            VerifyVerdict::Verified => "verified",
            VerifyVerdict::Refuted => "refuted",
            VerifyVerdict::Inconclusive => "inconclusive",
            VerifyVerdict::Invalid => "invalid",
            VerifyVerdict::Crash => "crash",
            VerifyVerdict::Timeout => "timeout",
        }
    }
}

/// Everything recorded about one mutant.
#[derive(Debug, Clone, Serialize)]
pub struct MutantOutcome {
    /// The case's label.
    pub case: String,
    /// The mutation kind.
    pub kind: MutationKind,
    /// The rank graph changed.
    pub file: String,
    /// Its 1-based line.
    pub line: usize,
    /// What changed.
    pub description: String,
    /// Whether the edit was made on every rank.
    pub all_ranks: bool,
    /// Whether the mutant can never be equivalent (one rank on another process group).
    pub never_equivalent: bool,
    /// The numeric oracle's class.
    pub oracle: OracleClass,
    /// `run`'s exit code per seed run (`None`: timed out or killed by a signal).
    pub run_exits: Vec<Option<i32>>,
    /// `verify`'s verdict.
    pub verify: VerifyVerdict,
    /// `verify`'s exit code (`None`: timed out or killed by a signal).
    pub verify_exit: Option<i32>,
    /// The engine that decided, when `verify --json` reports `decided_by`.
    pub decided_by: Option<String>,
    /// The first line of `verify`'s message, reason or stderr, for crashes and surprises.
    pub verify_note: Option<String>,
    /// Seconds `verify` took.
    pub verify_seconds: f64,
}

impl MutantOutcome {
    /// `verify` said verified where the oracle found a difference, where the mutant is invalid,
    /// or on a kind that can never be equivalent.
    pub fn is_false_verified(&self) -> bool {
        self.verify == VerifyVerdict::Verified
            && (matches!(
                self.oracle,
                OracleClass::NonEquivalent | OracleClass::Invalid
            ) || self.never_equivalent)
    }
    /// `run` or `verify` exited outside 0-3 or died of a signal.
    pub fn is_crash(&self) -> bool {
        self.verify == VerifyVerdict::Crash || self.oracle == OracleClass::Crash
    }
    /// `verify` refuted a mutant every seed of the oracle found equivalent.
    pub fn is_false_alarm(&self) -> bool {
        self.verify == VerifyVerdict::Refuted
            && self.oracle == OracleClass::Equivalent
            && !self.never_equivalent
    }
    /// `case kind file:line description`, for lists.
    pub fn locator(&self) -> String {
        format!(
            "{} {}{} {}:{} {}",
            self.case,
            self.kind,
            if self.all_ranks { " (all ranks)" } else { "" },
            self.file,
            self.line,
            self.description
        )
    }
}

/// The outcomes of a mutant run, in input order.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// One per mutant, in the order they were given.
    pub outcomes: Vec<MutantOutcome>,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
}

struct Exit {
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
    seconds: f64,
}

fn run_command(bin: &Path, args: &[&str], dir: &Path, tag: &str, timeout: Duration) -> Exit {
    let out_path = dir.join(format!(".{tag}.stdout"));
    let err_path = dir.join(format!(".{tag}.stderr"));
    let start = Instant::now();
    let files = std::fs::File::create(&out_path)
        .and_then(|o| std::fs::File::create(&err_path).map(|e| (o, e)));
    let spawned = files.and_then(|(o, e)| {
        Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(o)
            .stderr(e)
            .spawn()
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return Exit {
                code: None,
                timed_out: false,
                stdout: String::new(),
                stderr: format!("cannot start {}: {e}", bin.display()),
                seconds: 0.0,
            }
        }
    };
    let mut poll = Duration::from_millis(2);
    let (code, timed_out) = loop {
        match child.try_wait() {
            Ok(Some(status)) => break (status.code(), false),
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break (None, true);
            }
            Ok(None) => {
                std::thread::sleep(poll);
                poll = (poll * 2).min(Duration::from_millis(50));
            }
            Err(_) => break (None, false),
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    Exit {
        code,
        timed_out,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        seconds,
    }
}

/// Writes the mutant's case into `dir`: the case file and the mutated graph as files, every
/// other graph a link to (or, off unix, a copy of) the original.
fn materialize(case: &CaseInput, sel: &Selected, dir: &Path) -> Result<PathBuf, String> {
    let src = case.dir();
    let case_name = case
        .case_file
        .file_name()
        .ok_or("the case file has no name")?;
    let case_path = dir.join(case_name);
    let yaml = sel.mutant.new_case_file.as_deref().unwrap_or(&case.yaml);
    std::fs::write(&case_path, yaml).map_err(|e| e.to_string())?;
    let mut files: Vec<&String> = vec![&case.spec_graph];
    files.extend(case.rank_graphs.iter());
    for rel in files {
        let rel_path = Path::new(rel);
        if rel_path.is_absolute() {
            continue;
        }
        if rel_path
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(format!(
                "graph path `{rel}` leaves the case directory, which the mutator cannot copy"
            ));
        }
        let target = dir.join(rel_path);
        if target.exists() {
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        if *rel == sel.mutant.file {
            std::fs::write(&target, &sel.mutant.new_text).map_err(|e| e.to_string())?;
            continue;
        }
        if let Some((_, text)) = sel.mutant.other_files.iter().find(|(f, _)| f == rel) {
            std::fs::write(&target, text).map_err(|e| e.to_string())?;
            continue;
        }
        let original = src
            .join(rel_path)
            .canonicalize()
            .map_err(|e| format!("{rel}: {e}"))?;
        #[cfg(unix)]
        std::os::unix::fs::symlink(&original, &target).map_err(|e| e.to_string())?;
        #[cfg(not(unix))]
        std::fs::copy(&original, &target)
            .map(|_| ())
            .map_err(|e| e.to_string())?;
    }
    Ok(case_path)
}

fn first_line(s: &str) -> Option<String> {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(300).collect())
}

fn run_one(case: &CaseInput, sel: &Selected, opts: &DriverOptions) -> MutantOutcome {
    let m = &sel.mutant;
    let mut outcome = MutantOutcome {
        case: case.label.clone(),
        kind: m.kind,
        file: m.file.clone(),
        line: m.line,
        description: m.description.clone(),
        all_ranks: m.all_ranks,
        never_equivalent: m.never_equivalent(),
        oracle: OracleClass::Unknown,
        run_exits: Vec::new(),
        verify: VerifyVerdict::Crash,
        verify_exit: None,
        decided_by: None,
        verify_note: None,
        verify_seconds: 0.0,
    };
    let tmp = match tempfile::Builder::new()
        .prefix("shardproof-mutant-")
        .tempdir()
    {
        Ok(t) => t,
        Err(e) => {
            outcome.verify_note = Some(format!("cannot make a temporary directory: {e}"));
            return outcome;
        }
    };
    let case_path = match materialize(case, sel, tmp.path()) {
        Ok(p) => p,
        Err(e) => {
            outcome.verify_note = Some(format!("cannot write the mutant: {e}"));
            return outcome;
        }
    };
    let case_arg = case_path.to_string_lossy().into_owned();
    // The oracle: stop at the first seed that decides.
    let mut all_equal = true;
    for seed in &opts.seeds {
        let seed_text = seed.to_string();
        let exit = run_command(
            &opts.bin,
            &["run", &case_arg, "--json", "--quiet", "--seed", &seed_text],
            tmp.path(),
            "run",
            opts.timeout,
        );
        outcome.run_exits.push(exit.code);
        match (exit.code, exit.timed_out) {
            (Some(0), _) => {}
            (Some(1), _) => {
                outcome.oracle = OracleClass::NonEquivalent;
                all_equal = false;
                break;
            }
            (Some(2), _) => {
                outcome.oracle = OracleClass::Invalid;
                all_equal = false;
                break;
            }
            (Some(3), _) | (None, true) => all_equal = false,
            _ => {
                outcome.oracle = OracleClass::Crash;
                all_equal = false;
                break;
            }
        }
    }
    if all_equal {
        outcome.oracle = OracleClass::Equivalent;
    }
    let limit = format!("{:.3}", opts.verify_time_limit_seconds());
    let exit = run_command(
        &opts.bin,
        &[
            "verify",
            &case_arg,
            "--json",
            "--quiet",
            "--time-limit",
            &limit,
        ],
        tmp.path(),
        "verify",
        opts.timeout,
    );
    outcome.verify_exit = exit.code;
    outcome.verify_seconds = exit.seconds;
    outcome.verify = match (exit.code, exit.timed_out) {
        (_, true) => VerifyVerdict::Timeout,
        (Some(0), _) => VerifyVerdict::Verified,
        (Some(1), _) => VerifyVerdict::Refuted,
        (Some(2), _) => VerifyVerdict::Invalid,
        (Some(3), _) => VerifyVerdict::Inconclusive,
        _ => VerifyVerdict::Crash,
    };
    let json: Option<serde_json::Value> = serde_json::from_str(&exit.stdout).ok();
    if let Some(j) = &json {
        outcome.decided_by = j
            .get("decided_by")
            .and_then(|d| d.as_str())
            .map(str::to_string);
    }
    let json_note = json.as_ref().and_then(|j| {
        ["message", "reason"]
            .iter()
            .find_map(|k| j.get(*k).and_then(|v| v.as_str()).and_then(first_line))
    });
    outcome.verify_note = if outcome.verify == VerifyVerdict::Crash {
        // A crash's story is on stderr (the panic message).
        first_line(&exit.stderr).or(json_note)
    } else {
        json_note.or_else(|| first_line(&exit.stderr))
    };
    outcome
}

/// Runs every selected mutant (in parallel, `opts.jobs` at a time) and returns their outcomes
/// in the order given.
pub fn run_mutants(cases: &[CaseInput], selected: &[Selected], opts: &DriverOptions) -> Report {
    let start = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs.max(1))
        .build();
    let work = || {
        selected
            .par_iter()
            .map(|s| run_one(&cases[s.case], s, opts))
            .collect::<Vec<_>>()
    };
    let outcomes = match pool {
        Ok(p) => p.install(work),
        Err(_) => selected
            .iter()
            .map(|s| run_one(&cases[s.case], s, opts))
            .collect(),
    };
    Report {
        outcomes,
        seconds: start.elapsed().as_secs_f64(),
    }
}

#[derive(Serialize)]
struct Totals {
    mutants: usize,
    non_equivalent: usize,
    non_equivalent_refuted: usize,
    non_equivalent_refuted_share: f64,
    false_verified: usize,
    crashes: usize,
    false_alarms: usize,
    timeouts: usize,
    seconds: f64,
}

impl Report {
    /// Mutants `verify` wrongly verified (see [`MutantOutcome::is_false_verified`]).
    pub fn false_verified(&self) -> Vec<&MutantOutcome> {
        self.outcomes
            .iter()
            .filter(|o| o.is_false_verified())
            .collect()
    }
    /// Mutants on which `run` or `verify` crashed.
    pub fn crashes(&self) -> Vec<&MutantOutcome> {
        self.outcomes.iter().filter(|o| o.is_crash()).collect()
    }
    /// Mutants `verify` refuted though the oracle found them equivalent.
    pub fn false_alarms(&self) -> Vec<&MutantOutcome> {
        self.outcomes
            .iter()
            .filter(|o| o.is_false_alarm())
            .collect()
    }

    /// Non-equivalent mutants verify did not refute (inconclusive with its reason, or timed
    /// out).
    pub fn unrefuted(&self) -> Vec<&MutantOutcome> {
        self.outcomes
            .iter()
            .filter(|o| {
                o.oracle == OracleClass::NonEquivalent && o.verify != VerifyVerdict::Refuted
            })
            .collect()
    }

    fn totals(&self) -> Totals {
        let non_eq: Vec<_> = self
            .outcomes
            .iter()
            .filter(|o| o.oracle == OracleClass::NonEquivalent)
            .collect();
        let refuted = non_eq
            .iter()
            .filter(|o| o.verify == VerifyVerdict::Refuted)
            .count();
        Totals {
            mutants: self.outcomes.len(),
            non_equivalent: non_eq.len(),
            non_equivalent_refuted: refuted,
            non_equivalent_refuted_share: if non_eq.is_empty() {
                0.0
            } else {
                refuted as f64 / non_eq.len() as f64
            },
            false_verified: self.false_verified().len(),
            crashes: self.crashes().len(),
            false_alarms: self.false_alarms().len(),
            timeouts: self
                .outcomes
                .iter()
                .filter(|o| o.verify == VerifyVerdict::Timeout)
                .count(),
            seconds: self.seconds,
        }
    }

    fn counts(
        &self,
    ) -> BTreeMap<(MutationKind, bool, OracleClass), BTreeMap<VerifyVerdict, usize>> {
        let mut m: BTreeMap<(MutationKind, bool, OracleClass), BTreeMap<VerifyVerdict, usize>> =
            BTreeMap::new();
        for o in &self.outcomes {
            *m.entry((o.kind, o.all_ranks, o.oracle))
                .or_default()
                .entry(o.verify)
                .or_default() += 1;
        }
        m
    }

    /// The verdict matrix as text: a row per kind and oracle class, a column per verify
    /// verdict, then the totals and the lists of false verdicts and crashes.
    pub fn matrix_text(&self) -> String {
        let counts = self.counts();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "verdict matrix: {} mutants (rows: kind x run oracle; columns: verify verdict)",
            self.outcomes.len()
        );
        let _ = write!(s, "{:<24} {:<15}", "kind", "oracle");
        for v in VerifyVerdict::ALL {
            let _ = write!(s, " {:>12}", v.name());
        }
        s.push('\n');
        let write_row =
            |s: &mut String, kind: &str, oracle: &str, row: &BTreeMap<VerifyVerdict, usize>| {
                let _ = write!(s, "{kind:<24} {oracle:<15}");
                for v in VerifyVerdict::ALL {
                    let _ = write!(s, " {:>12}", row.get(&v).copied().unwrap_or(0));
                }
                s.push('\n');
            };
        for kind in MutationKind::ALL {
            for all_ranks in [false, true] {
                let label = if all_ranks {
                    format!("{kind} (all)")
                } else {
                    kind.name().to_string()
                };
                let mut first = true;
                for oracle in OracleClass::ALL {
                    if let Some(row) = counts.get(&(kind, all_ranks, oracle)) {
                        write_row(&mut s, if first { &label } else { "" }, oracle.name(), row);
                        first = false;
                    }
                }
            }
        }
        for oracle in OracleClass::ALL {
            let mut row: BTreeMap<VerifyVerdict, usize> = BTreeMap::new();
            for ((_, _, o), r) in &counts {
                if *o == oracle {
                    for (v, n) in r {
                        *row.entry(*v).or_default() += n;
                    }
                }
            }
            if !row.is_empty() {
                write_row(&mut s, "(all)", oracle.name(), &row);
            }
        }
        let t = self.totals();
        let _ = writeln!(
            s,
            "non-equivalent refuted: {}/{} ({:.1}%)",
            t.non_equivalent_refuted,
            t.non_equivalent,
            100.0 * t.non_equivalent_refuted_share
        );
        let _ = writeln!(s, "false verified: {}", t.false_verified);
        let _ = writeln!(s, "crashes: {}", t.crashes);
        let _ = writeln!(
            s,
            "false alarms (refuted, oracle equivalent): {}",
            t.false_alarms
        );
        let _ = writeln!(s, "verify timeouts: {}", t.timeouts);
        let _ = writeln!(s, "wall time: {:.1} s", t.seconds);
        for (title, list) in [
            ("false verified", self.false_verified()),
            ("crashes", self.crashes()),
            ("false alarms", self.false_alarms()),
            ("non-equivalent, not refuted", self.unrefuted()),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(s, "{title}:");
            for o in list {
                let _ = writeln!(
                    s,
                    "  {} [run {:?}, verify {:?}{}]",
                    o.locator(),
                    o.oracle,
                    o.verify_exit,
                    o.verify_note
                        .as_deref()
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default()
                );
            }
        }
        s
    }

    /// The report as JSON: totals, the matrix (kind -> oracle class -> verify verdict -> count)
    /// and every outcome.
    pub fn to_json(&self) -> serde_json::Value {
        let mut matrix = serde_json::Map::new();
        for ((kind, all_ranks, oracle), row) in self.counts() {
            let label = if all_ranks {
                format!("{kind} (all ranks)")
            } else {
                kind.name().to_string()
            };
            let k = matrix.entry(label).or_insert_with(|| serde_json::json!({}));
            let r: serde_json::Map<String, serde_json::Value> = row
                .iter()
                .map(|(v, n)| (v.name().to_string(), serde_json::json!(n)))
                .collect();
            k[oracle.name()] = serde_json::Value::Object(r);
        }
        serde_json::json!({
            "totals": self.totals(),
            "matrix": matrix,
            "false_verified": self.false_verified(),
            "crashes": self.crashes(),
            "outcomes": self.outcomes,
        })
    }
}
