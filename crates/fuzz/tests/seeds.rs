//! Every fuzz target passes over its seed corpus (so the targets keep compiling on stable and
//! the seeds stay free of findings), and over a few edge inputs.

use shardproof_fuzz::{seeds, TARGETS};

#[test]
fn every_target_passes_its_seeds() {
    for (target, run) in TARGETS {
        let seeds = seeds::for_target(target);
        assert!(seeds.len() >= 5, "{target}: {} seeds", seeds.len());
        for (name, bytes) in &seeds {
            // The samples' graphs are big: the interpreter target skips them by budget, the
            // others parse them once.
            run(bytes);
            let _ = name;
        }
    }
}

#[test]
fn every_target_takes_edge_inputs() {
    let edges: [&[u8]; 6] = [
        b"",
        b"\xff\xfe",
        b"{",
        b"class GraphModule",
        b"\n\n\n",
        b"version: 1\n",
    ];
    for (_, run) in TARGETS {
        for e in edges {
            run(e);
        }
    }
}

#[test]
fn the_interp_target_runs_its_seeds() {
    let seeds = seeds::for_target("interp");
    let ran = seeds
        .iter()
        .filter(|(_, b)| matches!(shardproof_fuzz::run_small(b), Some(Ok(_))))
        .count();
    assert!(ran >= 10, "only {ran} of {} seeds ran", seeds.len());
}
