//! The fast path's audit over case files: each case verified with the fast path's relation
//! compared, per operator, with the e-graph's (`Options::audit_fast_path`), then once more with
//! the fast path on. One line per case: the verdict, the operators inferred, how many the fast
//! path decides (and, in the audit, how many of those it writes as the e-graph does), those
//! reused, and every difference.
//!
//! ```sh
//! cargo run --release -p shardproof-refine --example fastpath_audit -- CASE.yaml ...
//! ```
//!
//! Exits 1 when any operator's relations differ, or the outcome (all but its timing and the
//! unserialized counters) differs between the audit (the e-graph's relations) and the fast path.

use shardproof_case::load_case;
use shardproof_refine::{verify, Options};
use std::path::Path;

fn main() {
    let mut different = 0usize;
    for path in std::env::args().skip(1) {
        let case = match load_case(Path::new(&path)) {
            Ok(c) => c,
            Err(e) => {
                println!("{path}: not loaded: {e}");
                continue;
            }
        };
        let audit = Options {
            audit_fast_path: true,
            jobs: Some(1),
            ..Options::default()
        };
        let a = verify(&case, &audit);
        let fast = Options {
            jobs: Some(1),
            ..Options::default()
        };
        let f = verify(&case, &fast);
        // The whole outcome but its timing and the unserialized counters.
        let report = |o: &shardproof_refine::Outcome| {
            let mut o = o.clone();
            o.seconds = 0.0;
            o.operators_reused = 0;
            o.pieces_reused = 0;
            o.operators_fast = 0;
            o.fast_path_differences.clear();
            o.operator_times.clear();
            format!("{o:?}")
        };
        let same_verdict = report(&a) == report(&f);
        println!(
            "{path}: {:?}/{:?} ops {} fast {} (audit: {} agree, {} differ) reused {} | {:.2} s audit, {:.2} s fast{}",
            a.verdict,
            f.verdict,
            f.spec_operators,
            f.operators_fast,
            a.operators_fast,
            a.fast_path_differences.len(),
            f.operators_reused,
            a.seconds,
            f.seconds,
            if same_verdict { "" } else { "  REPORT DIFFERS" }
        );
        for d in &a.fast_path_differences {
            println!("  {d}");
        }
        if !same_verdict || !a.fast_path_differences.is_empty() {
            different += 1;
        }
    }
    if different > 0 {
        println!("{different} cases differ");
        std::process::exit(1);
    }
}
