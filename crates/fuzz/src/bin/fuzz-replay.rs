//! Runs one fuzz target over files on the stable toolchain, without libFuzzer:
//! `fuzz-replay TARGET FILE...` (a crash found by `cargo fuzz run` reproduces here as a panic
//! with its backtrace).

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(target) = args.next() else {
        eprintln!("usage: fuzz-replay TARGET FILE...  (targets: fx, json, case, infer, interp)");
        std::process::exit(2);
    };
    let Some(&(_, run)) = shardproof_fuzz::TARGETS.iter().find(|(n, _)| *n == target) else {
        eprintln!("error: unknown target `{target}` (targets: fx, json, case, infer, interp)");
        std::process::exit(2);
    };
    for file in args {
        match std::fs::read(&file) {
            Ok(bytes) => {
                run(&bytes);
                println!("{file}: ok");
            }
            Err(e) => {
                eprintln!("error: cannot read {file}: {e}");
                std::process::exit(2);
            }
        }
    }
}
