//! No input makes the case reader panic: random mutations and truncations of a valid case text
//! are parsed and resolved against small graphs, and must end in `Ok` or a located error.

mod common;

use common::{rank_linear, spec_linear};
use proptest::prelude::*;
use shardproof_case::{parse_case, resolve_case};
use std::path::Path;

const VALID: &str = r#"version: 1
name: fuzz
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
  groups: { "12": tp, "w": all, "p": [[0], [1]] }
inputs:
  primals_1: { impl: primals_1, placement: Partial(avg) }
  primals_4:
    placement: { tp: Shard(0) }
    blocks: [1536, { size: 384, replicas: 1 }, 384]
  t: [Shard(1)]
outputs:
  mm: { expr: "concat([slice(r0.mm, 1, 0, 1152), transpose(transpose(r1.mm, 0, 1), 0, 1)], 1)" }
ops:
  tg.log_tensor: identity
  mylib.f: "gelu(add($0, [1, -2.5e3], True))"
assume:
  dropout: same-mask
"#;

fn check(text: &str) {
    let Ok(file) = parse_case(text, Path::new("fuzz.yaml")) else {
        return;
    };
    let _ = resolve_case(
        file,
        spec_linear(),
        vec![rank_linear(0, 1152), rank_linear(1, 1152)],
    );
}

#[test]
fn the_fuzz_seed_is_valid() {
    let file = parse_case(VALID, Path::new("fuzz.yaml")).unwrap();
    resolve_case(
        file,
        spec_linear(),
        vec![rank_linear(0, 1152), rank_linear(1, 1152)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[derive(Debug, Clone)]
enum Edit {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, String),
    Replace(usize, char),
    Duplicate(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let n = VALID.len();
    let pieces = prop::sample::select(vec![
        ":",
        "{",
        "}",
        "[",
        "]",
        "(",
        ")",
        ",",
        "-",
        "\"",
        "'",
        "\n",
        " ",
        "  ",
        "#",
        "&a",
        "*a",
        "!",
        "|",
        ">",
        "?",
        "0",
        "9",
        "-1",
        "99999999999999999999",
        "Shard(",
        "Replicate()",
        "Partial(",
        "r7.",
        "$",
        "$9",
        "\t",
        "\u{e9}",
        "\u{1F600}",
        "concat(",
        "[[",
        "]]",
        "all",
        "blocks: ",
        "replicas: 0",
        "expr: ",
        "impl: ",
        "tp",
        "dp: 3",
        "~",
        "null",
        "---\n",
    ]);
    prop_oneof![
        (0..=n).prop_map(Edit::Truncate),
        (0..n, 1..40usize).prop_map(|(a, l)| Edit::Delete(a, l)),
        (0..=n, pieces).prop_map(|(a, s)| Edit::Insert(a, s.to_string())),
        (0..n, any::<char>()).prop_map(|(a, c)| Edit::Replace(a, c)),
        (0..n, 1..80usize).prop_map(|(a, l)| Edit::Duplicate(a, l)),
    ]
}

/// Applies edits at char positions so that every edit keeps the text valid UTF-8.
fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let len = chars.len();
        match e {
            Edit::Truncate(a) => chars.truncate((*a).min(len)),
            Edit::Delete(a, l) => {
                let a = (*a).min(len);
                let b = (a + l).min(len);
                chars.drain(a..b);
            }
            Edit::Insert(a, s) => {
                let a = (*a).min(len);
                chars.splice(a..a, s.chars());
            }
            Edit::Replace(a, c) => {
                if *a < len {
                    chars[*a] = *c;
                }
            }
            Edit::Duplicate(a, l) => {
                let a = (*a).min(len);
                let b = (a + l).min(len);
                let copy: Vec<char> = chars[a..b].to_vec();
                chars.splice(b..b, copy);
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn mutated_cases_never_panic(edits in prop::collection::vec(edit(), 1..6)) {
        check(&apply(VALID, &edits));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        check(&text);
    }
}

#[test]
fn every_prefix_is_handled() {
    for i in 0..=VALID.len() {
        check(&VALID[..i]);
    }
}
