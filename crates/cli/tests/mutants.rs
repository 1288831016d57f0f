//! Mutation test of the engines (issue 43): tiny zoo cases, a seeded sample of their mutants,
//! each run through `shardproof run` (seeds 0, 1, 2: the numeric oracle) and `shardproof
//! verify`. Fails on any false "verified" (verify exits 0 where the oracle found a difference,
//! where the mutant is not a valid program, or where a rank runs a collective on another
//! process group) and on any crash (an exit outside 0-3). The full corpus is
//! `scripts/mutants`; docs/mutation.md has its figures.

use std::path::Path;
use std::time::Duration;

use shardproof_mutate::{corpus, mutants_of, run_mutants, sample, DriverOptions, MutationKind};

/// At least this many mutants, spread over kinds and cases by the sampler.
const MUTANTS: usize = 220;
const SAMPLER_SEED: u64 = 43;

#[test]
fn no_mutant_is_falsely_verified_and_nothing_crashes() {
    let bin = Path::new(env!("CARGO_BIN_EXE_shardproof"));
    let work = tempfile::tempdir().unwrap();
    let cases: Vec<_> = corpus::QUICK
        .iter()
        .map(|z| {
            corpus::emit(bin, z.name, &z.emit_args(), work.path()).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let per_case: Vec<_> = cases
        .iter()
        .map(|c| mutants_of(c).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let selected = sample(&per_case, MUTANTS, SAMPLER_SEED);
    assert!(
        selected.len() >= 200,
        "only {} mutants sampled",
        selected.len()
    );
    for kind in MutationKind::ALL {
        assert!(
            selected.iter().any(|s| s.mutant.kind == kind),
            "no {kind} mutant sampled"
        );
    }
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    // A mutant that sends verify on a long search is a timeout, not a failure; 10 s keeps the
    // test inside its budget on 2 cores.
    let opts = DriverOptions {
        jobs,
        timeout: Duration::from_secs(10),
        ..DriverOptions::new(bin)
    };
    let report = run_mutants(&cases, &selected, &opts);
    println!("{}", report.matrix_text());
    let false_verified = report.false_verified();
    let crashes = report.crashes();
    assert!(
        false_verified.is_empty() && crashes.is_empty(),
        "{} false verified, {} crashes (lists above)",
        false_verified.len(),
        crashes.len()
    );
}
