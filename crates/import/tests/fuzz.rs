//! The importers never panic, whatever the input: random bytes, truncated or mutated fixtures,
//! token soup.

mod common;

use proptest::prelude::*;
use shardproof_import::{from_json, parse_fx, parse_fx_lenient, to_json, FxParse};
use std::path::Path;
use std::sync::OnceLock;

fn fixtures() -> &'static [String] {
    static F: OnceLock<Vec<String>> = OnceLock::new();
    F.get_or_init(|| {
        common::py_files(&common::fixtures_dir())
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect()
    })
}

fn jsons() -> &'static [String] {
    static J: OnceLock<Vec<String>> = OnceLock::new();
    J.get_or_init(|| {
        fixtures()
            .iter()
            .map(|t| to_json(&parse_fx(t, Path::new("f.py")).unwrap().graph))
            .collect()
    })
}

fn check_coverage(r: &Result<FxParse, shardproof_ir::SourceError>) {
    if let Ok(p) = r {
        let s = &p.stats;
        assert_eq!(
            s.lines_parsed + s.lines_ignored + s.unparsed.len(),
            s.lines_total,
            "{s:?}"
        );
        p.graph.check_structure().unwrap();
    }
}

/// Runs every importer on `text`; they may fail, never panic, and errors are located.
fn all_importers(text: &str) {
    let p = Path::new("fuzz.py");
    if let Err(e) = parse_fx(text, p) {
        assert!(e.span.is_some(), "{e}");
    }
    let lenient = parse_fx_lenient(text, p);
    check_coverage(&lenient);
    let _ = from_json(text, Path::new("fuzz.json"));
}

fn truncate_chars(s: &str, frac: f64) -> &str {
    let n = s.chars().count();
    let keep = ((n as f64) * frac) as usize;
    match s.char_indices().nth(keep) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

const TOKENS: &[&str] = &[
    "class G(torch.nn.Module):\n",
    "    def forward(self, x: \"f32[2]\"):\n",
    "        ",
    "\n",
    "    ",
    "a",
    "b",
    "x",
    "getitem",
    " = ",
    ": ",
    "\"f32[2, s0]\"",
    "\"Sym(s0)\"",
    "torch.ops.aten.mm.default",
    "torch.ops.tg.op",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ";  ",
    "a = None",
    "return ",
    "None",
    "True",
    "-",
    "inf",
    "nan",
    "1e-05",
    "9223372036854775808",
    "'s'",
    "\"t\\\"\"",
    "device(type='cuda', index=0)",
    "torch.float16",
    "torch.strided",
    "self._tensor_constant0",
    "[0]",
    "operator.getitem(a, 1)",
    "# File: f.py:3 in g, code: y\n",
    "# No stacktrace found for following nodes\n",
    "fx_pytree.tree_flatten_spec([x], self._in_spec)",
    "pytree.tree_unflatten([a], self._out_spec)",
    "*",
    "**",
    "//",
    "->",
    ".",
    "import torch\n",
    "\t",
    "\u{e9}",
    "    def forward(self, a: \"f32[2]\", b, primals):\n",
    "        x, y, = ",
    "        a: \"f32[2]\"; b: \"i64[]\";\n",
    "        x_1 = x\n",
    "x.shape",
    "x.view(2)",
    "self.sub(x)",
    "a[1]",
    "a[0]",
    "    class S(torch.nn.Module):\n",
    "        return (a, None)\n",
    "getitem = a[2]\n",
    "\u{feff}",
];

/// Whole body lines, so that random programs reach the semantic checks.
const LINES: &[&str] = &[
    "        a: \"f32[2]\" = torch.ops.aten.neg.default(x)",
    "        b = torch.ops.aten.split.Tensor(a, 1)",
    "        c: \"f32[1]\" = b[0]",
    "        d = b[1];  b = None",
    "        e = operator.getitem(b, 3)",
    "        f = torch.ops.aten.cat.default([c, d], 0);  c = d = None",
    "        x_1 = x",
    "        p: \"f32[2]\"; q: \"f32[2]\";",
    "        p, q, = fx_pytree.tree_flatten_spec([x, primals], self._in_spec)",
    "        g = x.view(2)",
    "        h = -a",
    "        i = a + 1",
    "        j = self._tensor_constant0",
    "        k = a[0]",
    "        x = None",
    "        # File: m.py:1 in f, code: z",
    "        # No stacktrace found for following nodes",
    "        return (a, None)",
    "        return pytree.tree_unflatten([f, e], self._out_spec)",
    "    class Sub(torch.nn.Module):",
    "    def forward(self, y: \"f32[3]\"):",
    "",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn line_soup_never_panics(lines in proptest::collection::vec(0usize..LINES.len(), 0..30), joint in any::<bool>()) {
        let sig = if joint { "self, x, primals" } else { "self, x: \"f32[2]\", primals" };
        let mut text = format!("class G(torch.nn.Module):\n    def forward({sig}):\n");
        for l in lines {
            text.push_str(LINES[l]);
            text.push('\n');
        }
        all_importers(&text);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1500)) {
        all_importers(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn truncated_fixtures_never_panic(i in 0usize..64, frac in 0.0f64..1.0) {
        let f = &fixtures()[i % fixtures().len()];
        all_importers(truncate_chars(f, frac));
        let j = &jsons()[i % jsons().len()];
        all_importers(truncate_chars(j, frac));
    }

    #[test]
    fn mutated_fixtures_never_panic(i in 0usize..64, frac in 0.0f64..1.0, tok in 0usize..TOKENS.len(), del in 0usize..8) {
        let f = &fixtures()[i % fixtures().len()];
        let head = truncate_chars(f, frac);
        let rest: String = f[head.len()..].chars().skip(del).collect();
        all_importers(&format!("{head}{}{rest}", TOKENS[tok]));
        let j = &jsons()[i % jsons().len()];
        let head = truncate_chars(j, frac);
        let rest: String = j[head.len()..].chars().skip(del).collect();
        all_importers(&format!("{head}{}{rest}", TOKENS[tok]));
    }

    #[test]
    fn token_soup_never_panics(toks in proptest::collection::vec(0usize..TOKENS.len(), 0..120)) {
        let text: String = toks.iter().map(|&t| TOKENS[t]).collect();
        all_importers(&text);
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let body = format!(
        "class G(torch.nn.Module):\n    def forward(self, x):\n        a = torch.ops.aten.f.default({}x{})\n        return (a,)\n",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let e = parse_fx(&body, Path::new("deep.py")).unwrap_err();
    assert!(e.message.contains("nested deeper"), "{e}");
    let minus = format!(
        "class G(torch.nn.Module):\n    def forward(self, x):\n        a = torch.ops.aten.f.default({}1)\n        return (a,)\n",
        "-".repeat(5000)
    );
    assert!(parse_fx(&minus, Path::new("deep.py")).is_err());
    let json = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    assert!(from_json(&json, Path::new("deep.json")).is_err());
}
