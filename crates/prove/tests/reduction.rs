//! Shape reduction against full size on small random programs (TrainVerify's theorem, section
//! 6): the verdict on the shape-reduced case equals the verdict at the case's sizes, and the
//! reference interpreter, run at those sizes on random inputs, finds a difference exactly when
//! the case is refuted. A bigger sweep is `cargo run -p shardproof-prove --example
//! reduction_sweep`.

mod random_programs;

use random_programs::{load, program, verdicts, Rng};
use shardproof_prove::Verdict;

#[test]
fn reduced_verdicts_equal_full_size_verdicts_on_random_programs() {
    let mut rng = Rng::new(45);
    let mut seen = Vec::new();
    for i in 0..6 {
        let p = program(&mut rng, 3);
        let dir = tempfile::tempdir().unwrap();
        let case = load(&p, dir.path());
        let (reduced, full, differs) = verdicts(&case, &mut rng);
        let show = format!("program {i} {:?}\n{}\n{}", p.ops, p.spec, p.rank);
        assert_eq!(reduced.verdict, full.verdict, "{show}");
        assert_ne!(full.verdict, Verdict::Inconclusive, "{show}");
        // A proof is never contradicted by a run; a refutation's counterexample is confirmed
        // by the interpreter inside the prover.
        assert!(!(full.verdict == Verdict::Proved && differs), "{show}");
        assert!(
            full.verdict != Verdict::Refuted || full.counterexample.is_some(),
            "{show}"
        );
        seen.push(full.verdict);
    }
    // The sample holds both verdicts, so neither side of the comparison is vacuous.
    assert!(seen.contains(&Verdict::Proved), "{seen:?}");
    assert!(seen.contains(&Verdict::Refuted), "{seen:?}");
}
