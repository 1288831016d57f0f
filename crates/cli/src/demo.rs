//! `shardproof demo`: the first thing a newcomer runs. Writes a built-in case (a 2-layer MLP
//! with Megatron tensor parallelism over 2 ranks, captured from PyTorch) and a planted bug (the
//! row-parallel all-reduce removed) to a temporary directory, and runs every engine on both.

use crate::run::RunArgs;
use crate::{inspect, run, Verdict};
use std::path::Path;

/// The embedded demo files: (file name, contents).
const FILES: &[(&str, &str)] = &[
    ("spec.py", include_str!("../demo/spec.py")),
    ("r0.py", include_str!("../demo/r0.py")),
    // Every rank runs the same program (SPMD), so one capture serves both ranks.
    ("r1.py", include_str!("../demo/r0.py")),
    ("bug_r0.py", include_str!("../demo/bug_r0.py")),
    ("bug_r1.py", include_str!("../demo/bug_r0.py")),
    ("case.yaml", include_str!("../demo/case.yaml")),
    ("bug.yaml", include_str!("../demo/bug.yaml")),
];

/// Runs the demo; exits 0 when the correct plan holds and the planted bug is caught.
pub fn main() -> Verdict {
    let dir = match tempfile::Builder::new()
        .prefix("shardproof-demo-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot create a temporary directory: {e}");
            return Verdict::Invalid;
        }
    };
    for (name, text) in FILES {
        if let Err(e) = std::fs::write(dir.path().join(name), text) {
            eprintln!(
                "error: cannot write {}: {e}",
                dir.path().join(name).display()
            );
            return Verdict::Invalid;
        }
    }
    outln!(
        "shardproof demo: a 2-layer MLP (MSE loss) with Megatron tensor parallelism on 2 ranks,"
    );
    outln!("captured from PyTorch, in {}\n", dir.path().display());
    let correct = check(&dir.path().join("case.yaml"), "correct plan");
    let bug = check(
        &dir.path().join("bug.yaml"),
        "planted bug: the row-parallel all-reduce removed",
    );
    outln!("\nsummary:");
    outln!("  correct plan:  {}", describe(correct));
    outln!("  planted bug:   {}", describe(bug));
    if correct == Verdict::Holds && bug == Verdict::Violated {
        outln!("the correct plan verifies and the planted bug is caught.");
        Verdict::Holds
    } else {
        outln!("unexpected verdicts: the demo did not behave as it should.");
        Verdict::Violated
    }
}

fn check(case: &Path, title: &str) -> Verdict {
    outln!("== {title}: {}", case.display());
    let shape = inspect::summary(case);
    if shape != Verdict::Holds {
        return shape;
    }
    let verdict = run::main(&RunArgs::new(case.to_path_buf()));
    outln!();
    verdict
}

fn describe(v: Verdict) -> &'static str {
    match v {
        Verdict::Holds => "holds (exit 0)",
        Verdict::Violated => "violated (exit 1)",
        Verdict::Invalid => "invalid input (exit 2)",
        Verdict::Inconclusive => "inconclusive (exit 3)",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn demo_verifies_the_correct_plan_and_catches_the_bug() {
        assert_eq!(super::main(), crate::Verdict::Holds);
    }
}
