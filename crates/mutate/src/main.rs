//! `mutants`: runs mutants of shardproof cases through `shardproof run` and `verify` and prints
//! the verdict matrix. Exit 0 when no mutant was falsely verified and nothing crashed, 1
//! otherwise, 2 on bad usage.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardproof_mutate::{
    corpus, mutants_of, run_mutants, sample, CaseInput, DriverOptions, MutationKind,
};

/// Mutation harness for shardproof's engines.
#[derive(Parser)]
#[command(name = "mutants", version)]
struct Args {
    /// The shardproof binary to test.
    #[arg(long, value_name = "PATH")]
    bin: PathBuf,
    /// A case directory (holding case.yaml) or case file; repeatable.
    #[arg(long = "case", value_name = "DIR")]
    cases: Vec<PathBuf>,
    /// A zoo case to emit, `NAME=ARGS` (e.g. `mlp-tp2=mlp --mesh tp=2 --hidden 8`); repeatable.
    #[arg(long = "zoo", value_name = "NAME=ARGS")]
    zoo: Vec<String>,
    /// A built-in zoo corpus: `quick` (the in-suite test's) or `full`.
    #[arg(long, value_name = "NAME")]
    corpus: Option<String>,
    /// Mutants to sample (0: every mutant).
    #[arg(long, default_value_t = 0)]
    sample: usize,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Mutants run at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Seconds each shardproof command may run.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Seconds verify's relation inference may run (`verify --time-limit`; default: three
    /// quarters of --timeout).
    #[arg(long, value_name = "SECONDS")]
    verify_time_limit: Option<f64>,
    /// Only mutation kinds with these names (comma-separated).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// List the sampled mutants instead of running them.
    #[arg(long)]
    list: bool,
    /// Write each selected mutant's changed files under this directory (`NNNN-CASE-KIND/`).
    #[arg(long, value_name = "DIR")]
    dump: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode, String> {
    let work = tempfile::Builder::new()
        .prefix("shardproof-mutants-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let mut cases: Vec<CaseInput> = Vec::new();
    for c in &args.cases {
        cases.push(CaseInput::load(c).map_err(|e| e.to_string())?);
    }
    let mut zoo: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(name) = &args.corpus {
        let list = corpus::named(name)
            .ok_or_else(|| format!("unknown corpus `{name}`\n  hint: use `quick` or `full`"))?;
        zoo.extend(list.iter().map(|z| (z.name.to_string(), z.emit_args())));
    }
    for z in &args.zoo {
        let (name, rest) = z.split_once('=').ok_or_else(|| {
            format!("--zoo `{z}` has no `=`\n  hint: write NAME=ARGS, e.g. mlp-tp2=mlp --mesh tp=2")
        })?;
        zoo.push((
            name.to_string(),
            rest.split_whitespace().map(str::to_string).collect(),
        ));
    }
    for (name, emit_args) in &zoo {
        cases.push(
            corpus::emit(&args.bin, name, emit_args, work.path()).map_err(|e| e.to_string())?,
        );
    }
    if cases.is_empty() {
        return Err(
            "no cases\n  hint: pass --case DIR, --zoo NAME=ARGS or --corpus quick|full".into(),
        );
    }
    let kinds: Vec<MutationKind> = args
        .kinds
        .iter()
        .map(|k| {
            MutationKind::ALL
                .iter()
                .copied()
                .find(|m| m.name() == k)
                .ok_or_else(|| {
                    format!(
                        "unknown mutation kind `{k}`\n  hint: one of {}",
                        MutationKind::ALL.map(|m| m.name()).join(", ")
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let mut per_case = Vec::new();
    for c in &cases {
        let mut ms = mutants_of(c).map_err(|e| e.to_string())?;
        if !kinds.is_empty() {
            ms.retain(|m| kinds.contains(&m.kind));
        }
        per_case.push(ms);
    }
    let total: usize = per_case.iter().map(Vec::len).sum();
    let n = if args.sample == 0 { total } else { args.sample };
    let selected = sample(&per_case, n, args.seed);
    eprintln!(
        "{} cases, {total} mutants, {} selected",
        cases.len(),
        selected.len()
    );
    if let Some(dir) = &args.dump {
        for (i, s) in selected.iter().enumerate() {
            let d = dir.join(format!("{i:04}-{}-{}", cases[s.case].label, s.mutant.kind));
            let file = d.join(&s.mutant.file);
            std::fs::create_dir_all(file.parent().unwrap_or(&d)).map_err(|e| e.to_string())?;
            std::fs::write(&file, &s.mutant.new_text).map_err(|e| e.to_string())?;
            if let Some(yaml) = &s.mutant.new_case_file {
                std::fs::write(d.join("case.yaml"), yaml).map_err(|e| e.to_string())?;
            }
        }
    }
    if args.list {
        for s in &selected {
            println!(
                "{} {} {}:{} {}",
                cases[s.case].label,
                s.mutant.kind,
                s.mutant.file,
                s.mutant.line,
                s.mutant.description
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let opts = DriverOptions {
        bin: args.bin.clone(),
        jobs: args.jobs,
        timeout: Duration::from_secs(args.timeout),
        verify_time_limit: args
            .verify_time_limit
            .map(|s| {
                Duration::try_from_secs_f64(s).map_err(|_| {
                    format!("--verify-time-limit: expected seconds, 0 or more, found {s}")
                })
            })
            .transpose()?,
        seeds: vec![0, 1, 2],
    };
    let report = run_mutants(&cases, &selected, &opts);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report.matrix_text());
    }
    let bad = !report.false_verified().is_empty() || !report.crashes().is_empty();
    Ok(if bad {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
