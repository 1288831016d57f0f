//! Checks case files (`case.yaml`, as `zoo emit` or `ZOO_CHECK_KEEP` leave them) and prints
//! each report: `cargo run -p shardproof-check --example check_case -- DIR/case.yaml`.

fn main() {
    let mut status = 0;
    for path in std::env::args().skip(1) {
        let case = match shardproof_case::load_case(std::path::Path::new(&path)) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{path}: {e}");
                status = 2;
                continue;
            }
        };
        match shardproof_check::check_case(&case) {
            Ok(report) => println!("== {path}\n{}", report.render()),
            Err(e) => {
                eprintln!("{path}: {e}");
                status = 2;
            }
        }
    }
    std::process::exit(status);
}
