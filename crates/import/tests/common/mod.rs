//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The shared samples folder, or `None` (with a printed note) when it is absent.
pub fn samples_dir() -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        Some(manifest.join("../../../shared/samples")),
        std::env::var_os("SHARDPROOF_SHARED").map(|s| {
            let p = PathBuf::from(s);
            if p.join("samples").is_dir() {
                p.join("samples")
            } else {
                p
            }
        }),
    ];
    for c in candidates.into_iter().flatten() {
        if c.is_dir() {
            return Some(c);
        }
    }
    println!(
        "SKIPPED: shared samples not found (looked in CARGO_MANIFEST_DIR/../../../shared/samples \
         and $SHARDPROOF_SHARED)"
    );
    None
}

/// Every `.py` file under `dir`, sorted.
pub fn py_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "py") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The fixture folder of this crate.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}
