//! The zoo emitter the prove tests share: a model on a mesh, with a catalog bug or not, at
//! small mlp sizes, loaded back as a case.

use shardproof_zoo::{
    find_bug, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions, TrainOptions,
};
use std::path::Path;

/// Emits with the mlp's (hidden, ffn, batch).
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
    shardproof_zoo::emit_to_dir(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::default(),
        &PipelineOptions::default(),
        dir,
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}
