//! The zoo emitter the prove tests share: a model on a mesh, with a catalog bug or not, at
//! small mlp sizes, loaded back as a case.

use shardproof_zoo::{
    find_bug, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions, TrainOptions,
};
use std::path::Path;

/// Emits with the mlp's (hidden, ffn, batch).
#[allow(dead_code)] // ring_attention.rs includes this module for `emit_loaded` alone
pub fn emit_sized(
    model: &str,
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    forward_only: bool,
    (hidden, ffn, batch): (usize, usize, usize),
) -> shardproof_case::Case {
    let opts = EmitOptions {
        model: model.into(),
        mlp: MlpConfig {
            hidden,
            ffn,
            batch,
            layers: 1,
            ..MlpConfig::default()
        },
        llama: LlamaConfig::default(),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only,
        vocab_parallel: false,
    };
    emit_loaded(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    )
}

/// Emits `opts` with `extras` and `pipeline` (default training) into `dir`.
pub fn emit(dir: &Path, opts: &EmitOptions, extras: &EmitExtras, pipeline: &PipelineOptions) {
    shardproof_zoo::emit_to_dir(opts, extras, &TrainOptions::default(), pipeline, dir).unwrap();
}

/// [`emit`], then the case loaded back.
#[allow(dead_code)] // pipeline_cuts.rs edits the case file before loading it
pub fn emit_loaded(
    dir: &Path,
    opts: &EmitOptions,
    extras: &EmitExtras,
    pipeline: &PipelineOptions,
) -> shardproof_case::Case {
    emit(dir, opts, extras, pipeline);
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The width-4 llama the staged tests cut and reduce: two heads (as many kv heads), ffn 4, two
/// positions; `layers`, the global `batch` and `vocab` as given.
#[allow(dead_code)] // not every test file that includes this module emits it
pub fn width4_llama(layers: usize, batch: usize, vocab: usize) -> LlamaConfig {
    LlamaConfig {
        hidden: 4,
        heads: 2,
        kv_heads: 2,
        ffn: 4,
        layers,
        seq: 2,
        batch,
        vocab,
        ..LlamaConfig::default()
    }
}

/// Rewrites the first line of rank `rank`'s emitted graph file holding `pattern` with `edit`
/// (where operators repeat, e.g. the embedding's token lines before the loss's label lines,
/// the first is the one edited).
#[allow(dead_code)] // the vocab tests plant bugs with it
pub fn edit_rank(dir: &Path, rank: usize, pattern: &str, edit: &dyn Fn(&str) -> String) {
    let path = dir.join(format!("r{rank}.py"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let i = lines
        .iter()
        .position(|l| l.contains(pattern))
        .unwrap_or_else(|| panic!("r{rank}.py has no `{pattern}`"));
    lines[i] = edit(&lines[i]);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
}

/// Replaces the integer literal closing `line` (`op(x, LIT)`) by `lit`.
#[allow(dead_code)] // the vocab tests plant bugs with it
pub fn with_literal(line: &str, lit: i64) -> String {
    let comma = line.rfind(", ").expect("two arguments");
    format!("{}, {lit})", &line[..comma])
}
