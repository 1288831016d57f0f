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

/// Emits `opts` with `extras` and `pipeline` (default training) into `dir` and loads the case
/// back.
pub fn emit_loaded(
    dir: &Path,
    opts: &EmitOptions,
    extras: &EmitExtras,
    pipeline: &PipelineOptions,
) -> shardproof_case::Case {
    shardproof_zoo::emit_to_dir(opts, extras, &TrainOptions::default(), pipeline, dir).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}
