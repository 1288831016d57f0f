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
