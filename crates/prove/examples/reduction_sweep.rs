//! Shape reduction against full size on many random programs: for each, the verdict on the
//! shape-reduced case, at full size, and whether the interpreter finds a difference at full
//! size; prints every disagreement and the totals.
//!
//! `cargo run -p shardproof-prove --example reduction_sweep -- [PROGRAMS] [STEPS] [SEED]`

#[path = "../tests/random_programs/mod.rs"]
mod random_programs;

use random_programs::{load, program, verdicts, Rng};
use shardproof_prove::Verdict;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (n, steps, seed) = (arg(0, 200), arg(1, 4) as usize, arg(2, 1));
    let mut rng = Rng::new(seed);
    let (mut proved, mut refuted, mut other, mut disagree) = (0, 0, 0, 0);
    let started = std::time::Instant::now();
    for i in 0..n {
        let p = program(&mut rng, steps);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let case = load(&p, dir.path());
        let (reduced, full, differs) = verdicts(&case, &mut rng);
        match full {
            Verdict::Proved => proved += 1,
            Verdict::Refuted => refuted += 1,
            Verdict::Inconclusive => other += 1,
        }
        if reduced != full || (full == Verdict::Refuted) != differs {
            disagree += 1;
            println!(
                "program {i}: reduced {reduced:?}, full {full:?}, interpreter differs {differs}: {:?}",
                p.ops
            );
        }
    }
    println!(
        "{n} programs of {steps} steps (seed {seed}): {proved} proved, {refuted} refuted, {other} inconclusive at full size; {disagree} disagreements; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if disagree > 0 {
        std::process::exit(1);
    }
}
