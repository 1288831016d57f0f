//! Seed corpora of the fuzz targets: the importer's fixtures, cases the zoo emits in-process,
//! and (when present) the real Megatron graphs and cases of `shared/samples`.

use shardproof_zoo::{
    emit_pipelined, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
    TrainOptions,
};
use std::path::{Path, PathBuf};

/// A seed: a file name and its bytes.
pub type Seed = (String, Vec<u8>);

/// The files (name, text) of a zoo case emitted in-process: `case.yaml`, `spec.py`, `r0.py`...
/// Panics when the zoo refuses the request (seeds are fixed, so that is a bug here).
pub fn zoo_case(model: &str, mesh: &str, forward_only: bool) -> Vec<(String, String)> {
    let opts = EmitOptions {
        model: model.into(),
        mlp: MlpConfig {
            layers: 2,
            ..MlpConfig::default()
        },
        llama: LlamaConfig::default(),
        mesh: Mesh::parse(mesh).expect("seed mesh"),
        bug: None,
        forward_only,
        vocab_parallel: false,
    };
    let extras = EmitExtras {
        sequence_parallel: model == "gpt2",
        ..EmitExtras::default()
    };
    emit_pipelined(
        &opts,
        &extras,
        &TrainOptions::default(),
        &PipelineOptions::default(),
    )
    .unwrap_or_else(|e| panic!("zoo seed {model} {mesh}: {e}"))
    .files
}

/// The zoo cases the seeds come from: small models, several parallelisms.
const ZOO: [(&str, &str, bool); 6] = [
    ("mlp", "tp=2", true),
    ("mlp", "dp=2,tp=2", false),
    ("llama", "tp=2", true),
    ("gpt2", "tp=2", true),
    ("deepseek", "ep=2", true),
    ("mlp", "pp=2", false),
];

fn zoo_files() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (model, mesh, fw) in ZOO {
        let tag = format!(
            "{model}-{}-{}",
            mesh.replace([',', '='], ""),
            if fw { "fw" } else { "it" }
        );
        for (name, text) in zoo_case(model, mesh, fw) {
            out.push((tag.clone(), name, text));
        }
    }
    out
}

fn read_dir_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn files_as_seeds(paths: &[PathBuf], prefix: &str) -> Vec<Seed> {
    paths
        .iter()
        .filter_map(|p| {
            let bytes = std::fs::read(p).ok()?;
            let name = p.file_name()?.to_string_lossy().to_string();
            let parent = p
                .parent()
                .and_then(|q| q.file_name())
                .map(|q| q.to_string_lossy().to_string())
                .unwrap_or_default();
            Some((format!("{prefix}-{parent}-{name}"), bytes))
        })
        .collect()
}

/// torch.fx text seeds: the importer's fixtures, every zoo graph of [`ZOO`], the samples'
/// graphs (`samples`: include them; they are 30-80 KB each).
pub fn fx_seeds(samples: bool) -> Vec<Seed> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../import/tests/fixtures");
    let mut out = files_as_seeds(&read_dir_ext(&fixtures, "py"), "fixture");
    for (tag, name, text) in zoo_files() {
        if name.ends_with(".py") {
            out.push((format!("zoo-{tag}-{name}"), text.into_bytes()));
        }
    }
    if samples {
        if let Some(dir) = crate::samples_dir() {
            out.extend(files_as_seeds(&read_dir_ext(&dir, "py"), "sample"));
        }
    }
    out
}

/// JSON graph seeds: the JSON form of every fixture and zoo graph.
pub fn json_seeds() -> Vec<Seed> {
    fx_seeds(false)
        .into_iter()
        .filter_map(|(name, bytes)| {
            let text = String::from_utf8(bytes).ok()?;
            let g = shardproof_import::parse_fx_lenient(&text, Path::new(&name))
                .ok()?
                .graph;
            Some((
                format!("{}.json", name.trim_end_matches(".py")),
                shardproof_import::to_json(&g).into_bytes(),
            ))
        })
        .collect()
}

/// Case file seeds: every zoo case file of [`ZOO`] and the samples' cases.
pub fn case_seeds() -> Vec<Seed> {
    let mut out: Vec<Seed> = zoo_files()
        .into_iter()
        .filter(|(_, name, _)| name.ends_with(".yaml"))
        .map(|(tag, name, text)| (format!("zoo-{tag}-{name}"), text.into_bytes()))
        .collect();
    if let Some(dir) = crate::samples_dir() {
        out.extend(files_as_seeds(&read_dir_ext(&dir, "yaml"), "sample"));
    }
    out
}

/// The seeds of a target by its name (see [`crate::TARGETS`]).
pub fn for_target(target: &str) -> Vec<Seed> {
    match target {
        "fx" => fx_seeds(true),
        "json" => json_seeds(),
        "case" => case_seeds(),
        "infer" => {
            let mut s = fx_seeds(true);
            s.extend(json_seeds().into_iter().step_by(4));
            s
        }
        "interp" => fx_seeds(false),
        _ => Vec::new(),
    }
}
