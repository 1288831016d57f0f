//! The real sample cases from shared/samples/entangle load and resolve.

use shardproof_case::{load_case, rank_pieces, Layout, Placement};
use std::path::PathBuf;

/// The shared samples folder, or `None` (with a printed note) when this checkout has none.
fn samples() -> Option<PathBuf> {
    let root = std::env::var_os("SHARDPROOF_SHARED").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
        PathBuf::from,
    );
    let dir = root.join("samples/entangle");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (set SHARDPROOF_SHARED to the shared/ folder to run this test)",
            dir.display()
        );
        None
    }
}

#[test]
fn megatron_tp2_case_resolves() {
    let Some(dir) = samples() else { return };
    let case = load_case(&dir.join("case-tp2.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(case.name, "megatron-gpt-tp2-sp-layer1");
    assert_eq!(case.program.ranks.len(), 2);
    assert_eq!(case.inputs.len(), 22);
    assert!(case.inputs.iter().all(|r| !r.cut));
    let g = case.program.group("12").expect("group 12");
    assert_eq!(g.members, vec![vec![0, 1]]);
    let qkv = case.input("primals_4").unwrap();
    assert_eq!(
        qkv.layout,
        Layout::Placed(shardproof_case::PlacedLayout {
            placements: vec![Placement::Shard(0)],
            blocks: shardproof_case::Blocks::NONE,
            at: Vec::new(),
        })
    );
    let p = case.pieces(&qkv.layout, qkv.spec_value, 1).unwrap();
    assert_eq!(p.blocks, vec![vec![1152..2304, 0..768]]);
    let out = &case.outputs[0];
    assert_eq!(out.spec_name, "div_2");
    assert!(out.is_graph_output);
    assert!(case.assume.dropout.is_some());
    let spec_shape = [2304i64, 768];
    assert!(
        rank_pieces(&qkv.layout, &spec_shape, &case.program.mesh, 0)
            .unwrap()
            .blocks[0][0]
            .start
            == 0
    );
}

#[test]
fn missing_allreduce_case_resolves_with_a_cut() {
    let Some(dir) = samples() else { return };
    let case = load_case(&dir.join("case-bug-tp2.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let mul_4 = case.input("mul_4").unwrap();
    assert!(mul_4.cut, "mul_4 is an intermediate value of the spec");
    assert!(!case.input("primals_6").unwrap().cut);
    assert_eq!(case.outputs[0].spec_name, "mm_7");
    assert!(!case.outputs[0].is_graph_output);
    assert_eq!(case.ops.len(), 2);
    assert!(case
        .op_meaning(&shardproof_ir::OpName::new("tg", "log_tensor", "default"))
        .is_some());
    // No `groups:` on a 1-d mesh: every group the collectives name spans both ranks.
    for g in &case.program.groups {
        assert_eq!(g.members, vec![vec![0, 1]], "group {}", g.name);
    }
    assert!(case.program.group("1").is_some() && case.program.group("3").is_some());
}
