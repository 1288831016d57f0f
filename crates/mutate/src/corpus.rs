//! The case corpus: tiny zoo cases over every model and parallelism, emitted with
//! `shardproof zoo emit`. Sizes are the smallest the zoo's shapes allow while every
//! parallelism still splits something, so `verify` of the unmutated case is fast.

use std::path::Path;
use std::process::Command;

use crate::{CaseInput, MutateError};

/// A zoo case: a label and the arguments of `shardproof zoo emit` (without `-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZooCase {
    /// Directory name and report label.
    pub name: &'static str,
    /// `zoo emit` arguments.
    pub args: &'static str,
}

const MLP: &str = "--hidden 8 --ffn 8 --batch 4";
const LLAMA: &str = "--hidden 8 --heads 2 --kv-heads 2 --ffn 8 --seq 4 --batch 2 --vocab 8";
const GPT2: &str = "--hidden 8 --heads 2 --ffn 8 --seq 4 --batch 2 --vocab 8";
const DEEPSEEK: &str = "--hidden 8 --heads 2 --kv-heads 2 --ffn 8 --moe-ffn 4 --experts 2 --top-k 1 --seq 4 --batch 2 --vocab 8";

macro_rules! zoo {
    ($name:literal, $model:literal, $sizes:ident, $rest:literal) => {
        ZooCase {
            name: $name,
            args: concat!($model, " ", $rest, " ", "{", stringify!($sizes), "}"),
        }
    };
}

/// Expands the `{SIZES}` placeholder of a corpus entry.
fn expand(args: &str) -> String {
    args.replace("{MLP}", MLP)
        .replace("{LLAMA}", LLAMA)
        .replace("{GPT2}", GPT2)
        .replace("{DEEPSEEK}", DEEPSEEK)
}

/// The in-suite corpus: cases whose unmutated `verify` takes about 0.05-0.15 s in a debug
/// build (and whose mutants rarely send `verify` on long searches), covering tp, dp x tp,
/// pp (send/recv, two microbatches), forward-only and full iteration, mlp and gpt2.
pub const QUICK: &[ZooCase] = &[
    zoo!("mlp-tp2", "mlp", MLP, "--mesh tp=2"),
    zoo!(
        "mlp-dp2tp2-fwd",
        "mlp",
        MLP,
        "--mesh dp=2,tp=2 --forward-only"
    ),
    zoo!(
        "mlp-pp2-mb2",
        "mlp",
        MLP,
        "--mesh pp=2 --layers 2 --microbatches 2"
    ),
    zoo!("gpt2-tp2-fwd", "gpt2", GPT2, "--mesh tp=2 --forward-only"),
];

/// The full corpus: every model and parallelism, forward-only and full iteration.
pub const FULL: &[ZooCase] = &[
    zoo!("mlp-tp2", "mlp", MLP, "--mesh tp=2"),
    zoo!("mlp-tp2-fwd", "mlp", MLP, "--mesh tp=2 --forward-only"),
    zoo!("mlp-dp2", "mlp", MLP, "--mesh dp=2"),
    zoo!("mlp-dp2tp2", "mlp", MLP, "--mesh dp=2,tp=2"),
    zoo!(
        "mlp-dp2tp2-fwd",
        "mlp",
        MLP,
        "--mesh dp=2,tp=2 --forward-only"
    ),
    zoo!("mlp-pp2", "mlp", MLP, "--mesh pp=2 --layers 2"),
    zoo!(
        "mlp-pp2-mb2",
        "mlp",
        MLP,
        "--mesh pp=2 --layers 2 --microbatches 2"
    ),
    zoo!("mlp-dp2-zero1", "mlp", MLP, "--mesh dp=2 --zero 1"),
    zoo!("mlp-dp2-zero3", "mlp", MLP, "--mesh dp=2 --zero 3"),
    zoo!(
        "mlp-tp2-adam-clip",
        "mlp",
        MLP,
        "--mesh tp=2 --optimizer adam --clip-grad 1.0"
    ),
    zoo!("mlp-tp2-fp8", "mlp", MLP, "--mesh tp=2 --fp8"),
    zoo!("mlp-tp2-recompute", "mlp", MLP, "--mesh tp=2 --recompute"),
    zoo!(
        "llama-tp2-fwd",
        "llama",
        LLAMA,
        "--mesh tp=2 --forward-only"
    ),
    zoo!("llama-tp2", "llama", LLAMA, "--mesh tp=2"),
    zoo!("llama-dp2", "llama", LLAMA, "--mesh dp=2"),
    zoo!(
        "llama-tp2-vocab",
        "llama",
        LLAMA,
        "--mesh tp=2 --vocab-parallel"
    ),
    zoo!(
        "llama-dp2tp2-fwd",
        "llama",
        LLAMA,
        "--mesh dp=2,tp=2 --forward-only"
    ),
    zoo!("llama-pp2", "llama", LLAMA, "--mesh pp=2 --layers 2"),
    zoo!(
        "llama-cp2-fwd",
        "llama",
        LLAMA,
        "--mesh cp=2 --seq 8 --batch 1 --forward-only"
    ),
    zoo!("gpt2-tp2-fwd", "gpt2", GPT2, "--mesh tp=2 --forward-only"),
    zoo!("gpt2-tp2", "gpt2", GPT2, "--mesh tp=2"),
    zoo!(
        "gpt2-tp2-sp-fwd",
        "gpt2",
        GPT2,
        "--mesh tp=2 --sequence-parallel --forward-only"
    ),
    zoo!(
        "gpt2-tp2-sp",
        "gpt2",
        GPT2,
        "--mesh tp=2 --sequence-parallel"
    ),
    zoo!("gpt2-dp2-zero2", "gpt2", GPT2, "--mesh dp=2 --zero 2"),
    zoo!(
        "gpt2-pp2-fwd",
        "gpt2",
        GPT2,
        "--mesh pp=2 --layers 2 --forward-only"
    ),
    zoo!(
        "gpt2-cp2-fwd",
        "gpt2",
        GPT2,
        "--mesh cp=2 --seq 8 --batch 1 --forward-only"
    ),
    zoo!(
        "deepseek-ep2-fwd",
        "deepseek",
        DEEPSEEK,
        "--mesh ep=2 --forward-only"
    ),
    zoo!(
        "deepseek-ep2-a2a-fwd",
        "deepseek",
        DEEPSEEK,
        "--mesh ep=2 --ep-dispatch alltoall --forward-only"
    ),
    zoo!(
        "deepseek-tp2-fwd",
        "deepseek",
        DEEPSEEK,
        "--mesh tp=2 --forward-only"
    ),
    zoo!(
        "deepseek-dp2-fwd",
        "deepseek",
        DEEPSEEK,
        "--mesh dp=2 --forward-only"
    ),
    zoo!(
        "deepseek-pp2-fwd",
        "deepseek",
        DEEPSEEK,
        "--mesh pp=2 --layers 2 --forward-only"
    ),
    zoo!("deepseek-ep2", "deepseek", DEEPSEEK, "--mesh ep=2 --seq 2"),
];

/// Looks a corpus up by name: `quick` or `full`.
pub fn named(name: &str) -> Option<&'static [ZooCase]> {
    match name {
        "quick" => Some(QUICK),
        "full" => Some(FULL),
        _ => None,
    }
}

impl ZooCase {
    /// The `zoo emit` arguments, sizes expanded.
    pub fn emit_args(&self) -> Vec<String> {
        let expanded = expand(self.args);
        let tokens: Vec<&str> = expanded.split_whitespace().collect();
        // The entry's own flags come before the shared sizes and win over them.
        let mut args: Vec<String> = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            let t = tokens[i];
            let takes_value =
                t.starts_with("--") && tokens.get(i + 1).is_some_and(|n| !n.starts_with("--"));
            let width = if takes_value { 2 } else { 1 };
            if !t.starts_with("--") || !args.iter().any(|a| a == t) {
                args.extend(tokens[i..i + width].iter().map(|s| s.to_string()));
            }
            i += width;
        }
        // One layer unless the entry asks for more (pipeline stages need one each).
        if !args.iter().any(|a| a == "--layers") {
            args.extend(["--layers".to_string(), "1".to_string()]);
        }
        args
    }
}

/// Emits a zoo case into `parent/NAME` with `bin zoo emit ARGS -o DIR` and reads it.
pub fn emit(
    bin: &Path,
    name: &str,
    args: &[String],
    parent: &Path,
) -> Result<CaseInput, MutateError> {
    let dir = parent.join(name);
    let output = Command::new(bin)
        .arg("zoo")
        .arg("emit")
        .args(args)
        .arg("-o")
        .arg(&dir)
        .output()
        .map_err(|e| {
            MutateError::new(
                bin,
                0,
                format!("cannot run `zoo emit`: {e}"),
                "pass the shardproof binary with --bin PATH",
            )
        })?;
    if !output.status.success() {
        return Err(MutateError::new(
            &dir,
            0,
            format!(
                "`shardproof zoo emit {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            "see `shardproof zoo emit --help` for the size flags each model takes",
        ));
    }
    let mut case = CaseInput::load(&dir)?;
    // The corpus name says the plan and sizes better than the zoo's own case name.
    case.label = name.to_string();
    Ok(case)
}
