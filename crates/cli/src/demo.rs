//! `shardproof demo`: the first thing a newcomer runs. Emits, from the model zoo, a tiny
//! Llama-3 style model with Megatron tensor parallelism over 2 ranks (a full training
//! iteration: forward, cross-entropy loss, explicit backward, SGD step) and the same plan with
//! a planted bug (the all-reduce after the row-parallel attention output projection removed)
//! into a temporary directory, and runs every engine on both.

use crate::check::CheckArgs;
use crate::run::RunArgs;
use crate::verify::VerifyArgs;
use crate::{check, inspect, run, verify, Verdict};
use clap::Parser;
use shardproof_zoo::{emit, find_bug, EmitOptions, LlamaConfig, Mesh, MlpConfig};
use std::path::{Path, PathBuf};

/// The planted bug of the demo.
const BUG: &str = "llama-oproj-missing-allreduce";

/// Parses `verify`'s own command-line arguments, so the demo runs it exactly as a user would.
#[derive(Parser)]
struct VerifyCli {
    #[command(flatten)]
    args: VerifyArgs,
}

/// Parses `check`'s own command-line arguments, as for `verify`.
#[derive(Parser)]
struct CheckCli {
    #[command(flatten)]
    args: CheckArgs,
}

/// The verdicts of every engine on one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Verdicts {
    check: Verdict,
    run: Verdict,
    verify: Verdict,
}

/// Runs the demo. Exits 0 when `run` holds on the correct plan and catches the planted bug,
/// and `verify` contradicts neither (it may be inconclusive: its verdict is printed as is).
pub fn main() -> Verdict {
    let dir = match tempfile::Builder::new()
        .prefix("shardproof-demo-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            errln!("error: cannot create a temporary directory: {e}");
            return Verdict::Invalid;
        }
    };
    let correct_case = match write_case(&dir.path().join("correct"), None) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let bug_case = match write_case(&dir.path().join("bug"), Some(BUG)) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let c = LlamaConfig::default();
    outln!(
        "shardproof demo: a tiny Llama-3 style model (hidden {}, {} heads, {} kv heads, ffn {}, \
         {} layers, seq {}, batch {}, vocab {}),",
        c.hidden,
        c.heads,
        c.kv_heads,
        c.ffn,
        c.layers,
        c.seq,
        c.batch,
        c.vocab
    );
    outln!(
        "one full training iteration (forward, cross-entropy, backward, SGD) with Megatron tensor"
    );
    outln!(
        "parallelism on 2 ranks, emitted by `shardproof zoo emit llama --mesh tp=2` into {}\n",
        dir.path().display()
    );
    let correct = examine(&correct_case, "correct plan");
    let bug = examine(
        &bug_case,
        "planted bug: the all-reduce after the attention output projection of layer 0 removed",
    );
    outln!("\nsummary:");
    for (name, v) in [("correct plan", correct), ("planted bug", bug)] {
        outln!(
            "  {name:13}  check: {:22}  run: {:19}  verify: {}",
            describe(v.check),
            describe(v.run),
            describe(v.verify)
        );
    }
    // No engine may pass the bug or fail the correct plan; inconclusive is honest.
    let sound =
        |v: fn(&Verdicts) -> Verdict| v(&correct) != Verdict::Violated && v(&bug) != Verdict::Holds;
    if correct.run == Verdict::Holds
        && bug.run == Verdict::Violated
        && sound(|v| v.verify)
        && sound(|v| v.check)
    {
        outln!("the correct plan holds and the planted bug is caught.");
        for (engine, undecided) in [
            (
                "verify, the refinement engine,",
                correct.verify == Verdict::Inconclusive || bug.verify == Verdict::Inconclusive,
            ),
            (
                "check, the static checker,",
                correct.check == Verdict::Inconclusive || bug.check == Verdict::Inconclusive,
            ),
        ] {
            if undecided {
                outln!(
                    "({engine} could not decide this plan; an inconclusive verdict is reported \
                     as such, never as a pass or a failure.)"
                );
            }
        }
        Verdict::Holds
    } else {
        outln!("unexpected verdicts: the demo did not behave as it should.");
        Verdict::Violated
    }
}

/// Emits the tiny Llama case (with `bug`, if any) into `dir`; returns the case file's path.
fn write_case(dir: &Path, bug: Option<&str>) -> Result<PathBuf, Verdict> {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig::default(),
        mesh: Mesh::parse("tp=2").expect("a valid mesh"),
        bug: bug.map(|id| find_bug(id).expect("the demo's bug is in the catalog")),
        forward_only: false,
        vocab_parallel: false,
    };
    let emitted = emit(&opts).map_err(|e| {
        errln!("error: cannot emit the demo case: {e}");
        Verdict::Invalid
    })?;
    emitted.write(dir).map_err(|e| {
        errln!("error: cannot write {}: {e}", dir.display());
        Verdict::Invalid
    })?;
    Ok(dir.join("case.yaml"))
}

/// Runs every engine on `case`, under the heading `title`.
fn examine(case: &Path, title: &str) -> Verdicts {
    outln!("== {title}: {}", case.display());
    let shape = inspect::summary(case);
    if shape != Verdict::Holds {
        return Verdicts {
            check: shape,
            run: shape,
            verify: shape,
        };
    }
    outln!("-- check (static placements, SPMD types, async waits; no spec, no values)");
    let check =
        match CheckCli::try_parse_from(["check".as_ref(), case.as_os_str(), "--quiet".as_ref()]) {
            Ok(cli) => check::main(&cli.args),
            Err(e) => {
                errln!("error: {e}");
                Verdict::Invalid
            }
        };
    outln!("-- run (numerical differential check)");
    let run = run::main(&RunArgs::new(case.to_path_buf()));
    outln!("-- verify (refinement inference)");
    let verify = match VerifyCli::try_parse_from([
        "verify".as_ref(),
        case.as_os_str(),
        "--quiet".as_ref(),
    ]) {
        Ok(cli) => verify::main(&cli.args),
        Err(e) => {
            errln!("error: {e}");
            Verdict::Invalid
        }
    };
    outln!();
    Verdicts { check, run, verify }
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
