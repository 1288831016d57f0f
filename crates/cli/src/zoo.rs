//! `shardproof zoo`: list the model zoo and the bug catalog, emit a case.

use crate::Verdict;
use clap::{Args as ClapArgs, Subcommand};
use shardproof_zoo::{emit, find_bug, EmitOptions, Mesh, MlpConfig, BUGS, MODELS, PARALLELISMS};
use std::path::PathBuf;

/// Subcommands of `shardproof zoo`.
#[derive(Subcommand)]
pub enum ZooCommand {
    /// List the models, parallelisms and the bug catalog.
    List,
    /// Emit a spec graph, one graph per rank and a case file into a directory.
    Emit(EmitArgs),
}

/// Arguments of `shardproof zoo emit`.
#[derive(ClapArgs)]
pub struct EmitArgs {
    /// The model (see `zoo list`).
    model: String,
    /// The mesh, e.g. `dp=2,tp=2`.
    #[arg(long, default_value = "tp=2")]
    mesh: String,
    /// Plant a bug from the catalog (see `zoo list`).
    #[arg(long)]
    bug: Option<String>,
    /// Emit the forward pass and loss only.
    #[arg(long)]
    forward_only: bool,
    /// Model width.
    #[arg(long, default_value_t = 16)]
    hidden: usize,
    /// Inner width of every layer.
    #[arg(long, default_value_t = 32)]
    ffn: usize,
    /// Global batch size.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Number of fc1 + relu + fc2 blocks.
    #[arg(long, default_value_t = 1)]
    layers: usize,
    /// Output directory.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
}

/// Runs `shardproof zoo ...`.
pub fn main(cmd: &ZooCommand) -> Verdict {
    match cmd {
        ZooCommand::List => {
            list();
            Verdict::Holds
        }
        ZooCommand::Emit(args) => match emit_case(args) {
            Ok(()) => Verdict::Holds,
            Err(e) => {
                eprintln!("error: {e}");
                Verdict::Invalid
            }
        },
    }
}

fn list() {
    outln!("models:");
    for (m, d) in MODELS {
        outln!("  {m:6}  {d}");
    }
    outln!("parallelisms (mesh dims):");
    for (p, d) in PARALLELISMS {
        outln!("  {p:6}  {d}");
    }
    outln!("bugs:");
    outln!(
        "  {:26}  {:20}  {:8}  {:48}  {:70}  source",
        "id",
        "parallelism",
        "engines",
        "spec operator",
        "description"
    );
    for b in BUGS {
        outln!(
            "  {:26}  {:20}  {:8}  {:48}  {:70}  {}",
            b.id,
            b.parallelism,
            b.engines,
            b.spec_op,
            b.description,
            b.source
        );
    }
}

fn emit_case(args: &EmitArgs) -> Result<(), String> {
    let mesh = Mesh::parse(&args.mesh).map_err(|e| format!("--mesh: {e}"))?;
    let bug = match &args.bug {
        None => None,
        Some(id) => Some(find_bug(id).ok_or_else(|| {
            let known: Vec<&str> = BUGS.iter().map(|b| b.id).collect();
            format!("unknown bug `{id}`; known: {}", known.join(", "))
        })?),
    };
    let opts = EmitOptions {
        model: args.model.clone(),
        mlp: MlpConfig {
            hidden: args.hidden,
            ffn: args.ffn,
            batch: args.batch,
            layers: args.layers,
            ..MlpConfig::default()
        },
        mesh,
        bug,
        forward_only: args.forward_only,
    };
    let emitted = emit(&opts)?;
    emitted
        .write(&args.out)
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    outln!(
        "wrote {} (spec + {} ranks)",
        args.out.join("case.yaml").display(),
        opts.mesh.ranks()
    );
    Ok(())
}
