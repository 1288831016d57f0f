//! Where `check` spends its time on one zoo preset: type inference, the simulated schedule,
//! propagation (which includes both) and the whole check, in seconds, with the rank runs of
//! propagation (`RUST_LOG=debug` shows the count). `cargo run --release -p shardproof-check
//! --example phases PRESET`. Figures only.
use std::time::Instant;
fn main() {
    let name = std::env::args().nth(1).unwrap();
    let preset = shardproof_zoo::find_preset(&name).unwrap();
    let (opts, extras, pipeline) = preset.request();
    let dir = tempfile::tempdir().unwrap();
    let e = shardproof_zoo::emit_pipelined(
        &opts,
        &extras,
        &shardproof_zoo::TrainOptions::default(),
        &pipeline,
    )
    .unwrap();
    e.write(dir.path()).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let t = Instant::now();
    for g in &case.program.ranks {
        let _ = shardproof_interp::typecheck(g, &case.ops);
    }
    println!("typecheck {:.3}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let leaves: Vec<_> = (0..case.program.ranks.len())
        .map(|r| case.rank_leaves(r))
        .collect();
    let _ = shardproof_interp::schedule(&case.program, &case.ops, Some(&leaves));
    println!("schedule {:.3}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let prop = shardproof_check::propagate(&case).unwrap();
    println!(
        "propagate (incl typecheck+schedule) {:.3}s, {} of {} ranks' placements from a twin",
        t.elapsed().as_secs_f64(),
        prop.twin_ranks,
        case.program.ranks.len()
    );
    let t = Instant::now();
    let r = shardproof_check::check_case(&case).unwrap();
    println!(
        "check_case {:.3}s ops {} {:?}",
        t.elapsed().as_secs_f64(),
        r.operators,
        r.verdict
    );
    // The first findings, for a violated preset.
    for f in r.findings.iter().take(3) {
        println!(
            "  {} {} {}: {}",
            f.check.name(),
            f.node,
            f.op.clone().unwrap_or_default(),
            f.message
        );
    }
}
