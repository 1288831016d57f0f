//! Diagnostics about whole files: invalid UTF-8 is located at its byte's line and column, and
//! a very long line is quoted as a short excerpt.

use shardproof_import::{load_graph, parse_fx};
use std::path::Path;

#[test]
fn invalid_utf8_names_the_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.py");
    let mut bytes = b"class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\"):\n        # caf\xc3\xa9 \xe9\n".to_vec();
    bytes.extend_from_slice(b"        return (x,)\n");
    std::fs::write(&path, &bytes).unwrap();
    let e = load_graph(&path).unwrap_err();
    let shown = e.to_string();
    // Line 3; `        # café ` is 15 characters, so the bad byte is at column 16.
    assert!(
        shown.starts_with(&format!(
            "{}:3:16: the file is not valid UTF-8: byte 0xe9",
            path.display()
        )),
        "{shown}"
    );
    assert!(shown.contains("hint: "), "{shown}");

    let json = dir.path().join("g.json");
    std::fs::write(&json, b"{\"nodes\": \xff}").unwrap();
    let shown = load_graph(&json).unwrap_err().to_string();
    assert!(
        shown.contains("g.json:1:11: the file is not valid UTF-8"),
        "{shown}"
    );
}

#[test]
fn a_long_name_is_quoted_as_an_excerpt() {
    let long = "n".repeat(5000);
    let text = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\"):\n        y = torch.ops.aten.neg.default(x) {long}\n        return (y,)\n"
    );
    let e = parse_fx(&text, Path::new("g.py")).unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.len() < 600,
        "{} characters: {shown:.300}",
        shown.len()
    );
    assert!(shown.contains('…'), "{shown}");
}

/// Fuzz finding (json target): an unknown JSON key of hundreds of characters holding backticks
/// was quoted whole, since its own backticks hid the quotes from the excerpt cutter.
#[test]
fn a_long_unknown_json_key_with_backticks_is_quoted_as_an_excerpt() {
    let key = format!(
        "fo{}{}{}",
        "{,".repeat(100),
        "`".repeat(60),
        "a,".repeat(200)
    );
    let text = format!("{{\n  \"{key}\": 1\n}}");
    let e = shardproof_import::from_json(&text, Path::new("g.json")).unwrap_err();
    let shown = e.to_string();
    assert!(shown.starts_with("g.json:2:"), "{shown:.300}");
    assert!(e.message.contains("unknown field"), "{shown:.300}");
    assert!(
        e.message.chars().count() < 300,
        "{} characters: {shown:.300}",
        e.message.chars().count()
    );
    assert!(e.message.contains('…'), "{shown:.300}");
}
