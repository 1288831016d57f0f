//! `shardproof`: the command-line front of the shardproof engines.
//!
//! Exit codes, for every verdict-producing command: 0 the property holds, 1 it is violated,
//! 2 the input is invalid (bad case, unreadable graph, usage error), 3 inconclusive.
//! The commands live in the library (`src/lib.rs`), which the Python extension shares.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(shardproof_cli::main_with_args(std::env::args_os()))
}
