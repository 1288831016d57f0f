//! Builds GPipe, 1F1B and interleaved-1F1B orders and checks them (deadlock, completeness,
//! gradient sync), printing each order's size, verdict and check time:
//! `cargo run --release -p shardproof-check --example pipeline_orders`.

use shardproof_check::pipeline::{build, check_order, PipelineKind, PipelineSpec};
use std::time::Instant;

fn main() {
    let sizes: &[(PipelineKind, usize, usize, usize)] = &[
        (PipelineKind::GPipe, 4, 8, 1),
        (PipelineKind::OneFOneB, 4, 8, 1),
        (PipelineKind::Interleaved, 4, 8, 2),
        (PipelineKind::GPipe, 16, 64, 1),
        (PipelineKind::OneFOneB, 16, 64, 1),
        (PipelineKind::Interleaved, 16, 64, 4),
        (PipelineKind::OneFOneB, 64, 512, 1),
        (PipelineKind::Interleaved, 64, 512, 8),
    ];
    println!("schedule      stages microbatches virtual   actions  problems  check time");
    for &(kind, stages, microbatches, virtual_stages) in sizes {
        let spec = PipelineSpec {
            kind,
            stages,
            microbatches,
            virtual_stages,
        };
        let order = match build(&spec) {
            Ok(o) => o,
            Err(e) => {
                println!("{kind:?} {stages}x{microbatches}x{virtual_stages}: {e}");
                continue;
            }
        };
        let actions: usize = order.devices.iter().map(Vec::len).sum();
        let started = Instant::now();
        let problems = check_order(&order);
        let took = started.elapsed();
        println!(
            "{:<13} {stages:>6} {microbatches:>12} {virtual_stages:>7} {actions:>9} {:>9} {:>9.2} ms",
            format!("{kind:?}"),
            problems.len(),
            took.as_secs_f64() * 1e3
        );
        for p in problems.iter().take(3) {
            println!("    {}", p.describe(&order));
        }
    }
}
