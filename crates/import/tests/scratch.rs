mod common;
use shardproof_import::*;
#[test]
fn scratch() {
    let mut files = common::py_files(&common::fixtures_dir());
    if let Some(d) = common::samples_dir() { files.extend(common::py_files(&d)); }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let t = std::time::Instant::now();
        match parse_fx(&text, &f) {
            Ok(p) => println!("{} OK nodes={} in={} out={} sub={} stats={:?} parsed/total={}/{} ign={} {:?}", f.display(), p.graph.nodes.len(), p.graph.inputs.len(), p.graph.outputs.len(), p.subgraphs.len(), p.stats.unparsed.len(), p.stats.lines_parsed, p.stats.lines_total, p.stats.lines_ignored, t.elapsed()),
            Err(e) => println!("{} ERR {}", f.display(), e),
        }
    }
}
#[test]
fn dump() {
    let f = std::path::PathBuf::from(std::env::var("DUMP").unwrap_or_default());
    if !f.is_file() { return; }
    let text = std::fs::read_to_string(&f).unwrap();
    let p = parse_fx(&text, &f).unwrap();
    std::fs::write("/tmp/dump.json", to_json(&p.graph)).unwrap();
    for s in &p.subgraphs { println!("{}", to_json(s)); }
}
