//! Checks every tiny correct zoo plan of the test matrix and prints each verdict.
#[path = "../tests/common/plans.rs"]
mod plans;
fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let verbose = std::env::args().nth(2).is_some();
    let root = tempfile::tempdir().unwrap();
    // ZOO_CHECK_KEEP=DIR keeps the emitted cases there, for reading the graphs of a finding.
    let keep = std::env::var_os("ZOO_CHECK_KEEP").map(std::path::PathBuf::from);
    for (i, p) in plans::correct_plans().iter().enumerate() {
        if !p.label().contains(&filter) {
            continue;
        }
        // ZOO_CHECK_BUG=ID plants a catalog bug in every selected plan.
        let bug = std::env::var("ZOO_CHECK_BUG").ok();
        let p = &plans::Plan {
            bug: bug.and_then(|b| shardproof_zoo::find_bug(&b)),
            ..p.clone()
        };
        let dir = keep
            .as_deref()
            .unwrap_or(root.path())
            .join(format!("{i:03}"));
        let Ok(case) = p.emit(&dir) else { continue };
        let case = shardproof_case::load_case(&case).unwrap();
        match shardproof_check::check_case(&case) {
            Ok(r) => {
                println!(
                    "{i:03} {:<40} {:?} findings={} unknown={}",
                    p.label(),
                    r.verdict,
                    r.findings.len(),
                    r.unknown_values
                );
                if verbose {
                    print!("{}", r.render());
                } else {
                    for f in r.findings.iter().take(2) {
                        println!(
                            "    {} {} {}: {}",
                            f.check.name(),
                            f.node,
                            f.op.clone().unwrap_or_default(),
                            f.message
                        );
                    }
                    for u in r.unknown.iter().take(3) {
                        println!("    unknown {} x {} ({})", u.count, u.reason, u.first);
                    }
                }
            }
            Err(e) => println!("{i:03} {} INVALID {e}", p.label()),
        }
    }
}
