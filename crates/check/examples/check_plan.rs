//! Checks plan files (docs/formats/plan.md) and prints each report:
//! `cargo run -p shardproof-check --example check_plan -- examples/plans/tp_linear.plan`.

use shardproof_check::{check_case, plan::load_plan};

fn main() {
    let mut status = 0;
    for path in std::env::args().skip(1) {
        let case = match load_plan(std::path::Path::new(&path)) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                status = 2;
                continue;
            }
        };
        match check_case(&case) {
            Ok(report) => println!("== {path}\n{}", report.render()),
            Err(e) => {
                eprintln!("{path}: {e}");
                status = 2;
            }
        }
    }
    std::process::exit(status);
}
