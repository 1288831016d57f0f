//! The Entangle sample (Megatron GPT, tp=2 with SP and vocab parallelism), when the shared
//! samples are present (`SHARDPROOF_SHARED`): Megatron zeroes the out-of-range rows of its
//! vocabulary lookups by `index_put(x, [mask], c)` with `c` a lifted module constant. With the
//! constants stated (`case-tp2-constants.yaml`) the write is proven to zero the rows and the
//! case holds; without them (`case-tp2.yaml`, as captured) `c` could be any value, so the
//! lookup is no proven partial sum: inconclusive, never a finding.

use shardproof_check::{check_case, Verdict};
use std::path::{Path, PathBuf};

fn samples() -> Option<PathBuf> {
    let shared = match std::env::var_os("SHARDPROOF_SHARED") {
        Some(s) => PathBuf::from(s),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    let dir = shared.join("samples/entangle");
    if dir.join("case-tp2-constants.yaml").is_file() {
        Some(dir)
    } else {
        println!("SKIPPED: no Entangle samples at {}", dir.display());
        None
    }
}

#[test]
fn the_sample_holds_with_its_constants_stated_and_is_inconclusive_without() {
    let Some(dir) = samples() else { return };
    let case = shardproof_case::load_case(&dir.join("case-tp2-constants.yaml")).unwrap();
    let r = check_case(&case).unwrap();
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    let case = shardproof_case::load_case(&dir.join("case-tp2.yaml")).unwrap();
    let r = check_case(&case).unwrap();
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(r.findings.is_empty(), "{}", r.render());
}
