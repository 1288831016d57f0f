//! Writes the seed corpus of every fuzz target: `seed-corpus DIR` creates `DIR/<target>/` and
//! one file per seed (by default DIR is `crates/fuzz/fuzz/corpus`, where cargo-fuzz looks).

fn main() {
    let dir = std::env::args_os().nth(1).map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus"),
        std::path::PathBuf::from,
    );
    for (target, _) in shardproof_fuzz::TARGETS {
        let d = dir.join(target);
        if let Err(e) = std::fs::create_dir_all(&d) {
            eprintln!("error: cannot create {}: {e}", d.display());
            std::process::exit(2);
        }
        let seeds = shardproof_fuzz::seeds::for_target(target);
        for (name, bytes) in &seeds {
            if let Err(e) = std::fs::write(d.join(name), bytes) {
                eprintln!("error: cannot write {}: {e}", d.join(name).display());
                std::process::exit(2);
            }
        }
        println!("{target}: {} seeds in {}", seeds.len(), d.display());
    }
}
