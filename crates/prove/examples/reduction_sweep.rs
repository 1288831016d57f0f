//! Shape reduction against full size on many random programs: for each, the verdict on the
//! shape-reduced case, at full size, and whether the interpreter finds a difference at full
//! size on random inputs; prints every disagreement (a reduced verdict other than the
//! full-size one, a proof the interpreter contradicts) and every case the reduction leaves
//! undecided, and the totals. Exits 1 on a disagreement.
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
    let (mut unseen, mut undecided) = (0, 0);
    let started = std::time::Instant::now();
    for i in 0..n {
        let p = program(&mut rng, steps);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let case = load(&p, dir.path());
        let (reduced, full, differs) = verdicts(&case, &mut rng);
        match full.verdict {
            Verdict::Proved => proved += 1,
            Verdict::Refuted => refuted += 1,
            Verdict::Inconclusive => other += 1,
        }
        if full.verdict == Verdict::Refuted && !differs {
            unseen += 1;
        }
        // A disagreement: the verdicts differ where both decided, a reduced verdict where full
        // size has none, or a proof the interpreter contradicts.
        let decided = |v: Verdict| v != Verdict::Inconclusive;
        let wrong = (decided(reduced.verdict) && reduced.verdict != full.verdict)
            || (full.verdict == Verdict::Proved && differs);
        if wrong {
            disagree += 1;
        }
        if wrong || (reduced.verdict != full.verdict && decided(full.verdict)) {
            if !wrong {
                undecided += 1;
            }
            println!(
                "program {i}: reduced {:?} ({}), full {:?}, interpreter differs {differs}: {:?}",
                reduced.verdict,
                reduced.message.as_deref().unwrap_or(""),
                full.verdict,
                p.ops
            );
        }
    }
    println!(
        "{n} programs of {steps} steps (seed {seed}): at full size {proved} proved, {refuted} refuted ({unseen} of them not seen by the interpreter at one random point), {other} inconclusive; reduced: {disagree} disagreements, {undecided} undecided where full size decides; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if disagree > 0 {
        std::process::exit(1);
    }
}
