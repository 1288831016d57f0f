//! Writes a synthetic reference trace (with two perturbed runs) and a 2 x 2 (TP x DP)
//! candidate trace into a directory, to try `shardproof trace compare` on:
//!
//! ```text
//! cargo run -p shardproof-trace --example synthetic -- DIR [--dtype bfloat16] [--bug KIND:NAME]
//! shardproof trace compare DIR/ref DIR/cand --html DIR/report.html
//! ```
//!
//! `--bug` plants a bug in the candidate: `diverge:layers.2.mlp` (a module 5% off),
//! `replica:layers.1.mlp.weight` (DP replicas of a main gradient that disagree),
//! `missing:layers.3.mlp` (a module not recorded) or `piece:layers.0.mlp` (a piece no rank
//! holds).

use shardproof_trace::synthetic::{write_candidate, write_reference, Bug, Spec};
use shardproof_trace::RunDtype;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|k| args.get(k + 1))
            .cloned()
    };
    let Some(dir) = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
    else {
        eprintln!(
            "usage: synthetic DIR [--dtype DTYPE] [--bug diverge|replica|missing|piece:NAME]"
        );
        return ExitCode::from(2);
    };
    let mut spec = Spec::default();
    if let Some(d) = value("--dtype") {
        let Some(dtype) = RunDtype::parse(&d) else {
            eprintln!("error: unknown dtype {d:?}\n  hint: float32, bfloat16, float16, float8_e4m3fn or float64");
            return ExitCode::from(2);
        };
        spec.dtype = dtype;
    }
    if let Some(b) = value("--bug") {
        let (kind, name) = b.split_once(':').unwrap_or((b.as_str(), ""));
        let name = name.to_string();
        spec.bug = Some(match kind {
            "diverge" => Bug::Diverge {
                module: name,
                relative: 0.05,
            },
            "replica" => Bug::DivergentReplica { parameter: name },
            "missing" => Bug::MissingModule { module: name },
            "piece" => Bug::MissingPiece { module: name },
            _ => {
                eprintln!("error: unknown bug {kind:?}\n  hint: diverge, replica, missing or piece, then :NAME");
                return ExitCode::from(2);
            }
        });
    }
    let written = write_reference(&dir.join("ref"), &spec, 2)
        .and_then(|()| write_candidate(&dir.join("cand"), &spec));
    match written {
        Ok(()) => {
            println!(
                "wrote {0}/ref (2 perturbed runs) and {0}/cand",
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
