//! Hand-made cases written as files: a spec graph, rank graphs and a case YAML in a fresh
//! directory, checked, and the directory removed.
#![allow(dead_code)]

use shardproof_check::{check_case, Verdict};

/// Writes `files` (name, text; one of them `case.yaml`) into a directory of its own named by
/// `tag`, checks the case, prints the report (shown when a test fails) and returns its verdict.
pub fn check_files(tag: &str, files: &[(String, String)]) -> Verdict {
    let dir = std::env::temp_dir().join(format!("shardproof-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let report = check_case(&case).unwrap();
    eprintln!("{}", report.render());
    let _ = std::fs::remove_dir_all(&dir);
    report.verdict
}

/// The fx text of a graph module with signature `params` and lines `body` (unindented) that
/// returns its value `out`.
pub fn graph_module(params: &[String], body: &[String]) -> String {
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, {}):\n{}\n        return (out,)\n",
        params.join(", "),
        body.iter()
            .map(|l| format!("        {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}
