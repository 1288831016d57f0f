//! The JSON graph format: lossless round trips, located errors, the committed schema.

mod common;

use proptest::prelude::*;
use shardproof_import::{from_json, json_schema, parse_fx, to_json};
use shardproof_ir::{
    Arg, DType, Dim, Graph, Node, NodeKind, OpName, Output, SourceLoc, Span, TensorType, ValueId,
};
use std::path::{Path, PathBuf};

/// IR equality that treats NaN as equal to itself and tells -0.0 from 0.0 (the Debug forms of
/// the graphs are compared).
fn assert_same(a: &Graph, b: &Graph) {
    assert_eq!(format!("{a:#?}"), format!("{b:#?}"));
}

/// fx → IR → JSON → IR equals the original; JSON → IR → JSON is byte-identical.
fn round_trip(g: &Graph) {
    let json = to_json(g);
    let back = from_json(&json, Path::new("g.json")).unwrap_or_else(|e| panic!("{e}\n{json}"));
    assert_same(g, &back);
    assert_eq!(to_json(&back), json);
}

fn fx_files() -> Vec<PathBuf> {
    let mut files = common::py_files(&common::fixtures_dir());
    if let Some(d) = common::samples_dir() {
        files.extend(common::py_files(&d));
    }
    files
}

#[test]
fn fx_graphs_round_trip_through_json() {
    let files = fx_files();
    assert!(files.len() >= 15);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let p = parse_fx(&text, &f).unwrap();
        round_trip(&p.graph);
        for s in &p.subgraphs {
            round_trip(s);
        }
    }
}

fn doc() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/formats/graph-json.md");
    std::fs::read_to_string(p).unwrap()
}

/// The fenced block of `lang` that follows the word "Example" in the format document.
fn doc_block(lang: &str) -> String {
    let d = doc();
    let from = d.find("## Example").unwrap();
    let rest = &d[from..];
    let start = rest.find(&format!("```{lang}\n")).unwrap() + lang.len() + 4;
    let end = rest[start..].find("```").unwrap();
    rest[start..start + end].to_string()
}

#[test]
fn documented_example_is_canonical_and_matches_its_fx_text() {
    let json = doc_block("json");
    let g = from_json(&json, Path::new("example.json")).unwrap();
    assert_eq!(
        to_json(&g),
        json,
        "the example in graph-json.md is not in canonical form"
    );
    let fx = parse_fx(&doc_block("python"), Path::new("example.py")).unwrap();
    assert_same(&fx.graph, &g);
    // Multi-output wiring survives.
    let drop = g.nodes.iter().find(|n| n.name == "native_dropout").unwrap();
    assert_eq!(drop.outputs[1].name, "getitem_1");
    assert_eq!(g.outputs[1], Some(ValueId::new(7, 1)));
}

/// A graph using every IR feature, including ones no torch.fx text produces.
fn odd_graph() -> Graph {
    let mut g = Graph::new("odd");
    let ty = |d: DType, s: Vec<Dim>| Some(TensorType { dtype: d, shape: s });
    let x = g.push(Node {
        name: "x".into(),
        kind: NodeKind::Input,
        outputs: vec![Output {
            name: "x".into(),
            ty: ty(
                DType::F8e4m3,
                vec![Dim::Sym("s0 + 1".into()), Dim::Known(0)],
            ),
        }],
        loc: None,
        line: None,
    });
    g.inputs.push(ValueId::new(x, 0));
    let c = g.push(Node {
        name: "c".into(),
        kind: NodeKind::Constant {
            attr: "sub.weight".into(),
        },
        outputs: vec![Output {
            name: "c".into(),
            ty: None,
        }],
        loc: Some(SourceLoc {
            file: "é/\"q\".py".into(),
            line: 7,
            function: "<lambda>".into(),
            code: "a\tb\\n".into(),
        }),
        line: Some(3),
    });
    let floats = [
        0.0,
        -0.0,
        1.0,
        0.1,
        1e-5,
        -1e300,
        5e-324,
        f64::MAX,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let args = vec![
        Arg::Value(ValueId::new(x, 0)),
        Arg::List(floats.iter().map(|f| Arg::Float(*f)).collect()),
        Arg::List(vec![
            Arg::Int(i64::MIN),
            Arg::Int(i64::MAX),
            Arg::Int(0),
            Arg::Bool(true),
            Arg::None,
        ]),
        Arg::List(vec![
            Arg::List(vec![Arg::Value(ValueId::new(c, 0))]),
            Arg::List(vec![]),
        ]),
        Arg::Str("{\"value\": \"x\"}\n\u{1F600}".into()),
        Arg::Dtype(DType::Bool),
        Arg::Device("cuda:3".into()),
        Arg::Layout("sparse_coo".into()),
        Arg::MemoryFormat("channels_last".into()),
        Arg::Op(OpName::new("tg", "inplace_log_tensor", "default")),
        Arg::Op(OpName::new("torch._C._nn", "linear", "")),
    ];
    let m = g.push(Node {
        name: "multi".into(),
        kind: NodeKind::Call {
            op: OpName::new("my.lib", "op", ""),
            args,
            kwargs: vec![
                ("z".into(), Arg::Int(1)),
                ("a".into(), Arg::Float(2.0)),
                ("".into(), Arg::None),
            ],
        },
        outputs: vec![
            Output {
                name: "multi[0]".into(),
                ty: None,
            },
            Output {
                name: "out 1".into(),
                ty: ty(DType::Bf16, vec![]),
            },
        ],
        loc: None,
        line: Some(usize::MAX),
    });
    g.push(Node {
        name: "none_out".into(),
        kind: NodeKind::Call {
            op: OpName::new("aten", "empty", "memory_format"),
            args: vec![],
            kwargs: vec![],
        },
        outputs: vec![],
        loc: None,
        line: None,
    });
    g.outputs = vec![Some(ValueId::new(m, 1)), None, Some(ValueId::new(x, 0))];
    g
}

#[test]
fn every_ir_feature_round_trips() {
    let g = odd_graph();
    round_trip(&g);
    let json = to_json(&g);
    assert!(
        !json.contains("\"path\""),
        "a graph without path writes none"
    );
    assert!(
        json.contains("{\"float\": \"nan\"}") && json.contains("-0.0") && json.contains("5e-324")
    );
    assert!(json.contains("{\"namespace\": \"my.lib\", \"name\": \"op\", \"overload\": \"\"}"));
    let mut with_path = g;
    with_path.path = Some(PathBuf::from("/captures/fw.g0.r0.py"));
    round_trip(&with_path);
}

/// The line and column of the first occurrence of `needle` in `text`.
fn pos(text: &str, needle: &str) -> Span {
    let off = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not found"));
    let before = &text[..off];
    let line = before.matches('\n').count() + 1;
    let col = before[before.rfind('\n').map_or(0, |p| p + 1)..]
        .chars()
        .count()
        + 1;
    Span::new(line, col)
}

/// Reads `text` and returns the error.
fn err(text: &str) -> shardproof_ir::SourceError {
    let e = from_json(text, Path::new("bad.json")).unwrap_err();
    assert_eq!(e.file, Path::new("bad.json"));
    assert!(e.hint.as_deref().is_some_and(|h| !h.is_empty()), "{e}");
    e
}

const GOOD: &str = r#"{
  "format": "shardproof-graph",
  "version": 1,
  "name": "g",
  "inputs": ["x"],
  "outputs": ["y"],
  "nodes": [
    {
      "name": "x",
      "kind": "input",
      "outputs": [{"name": "x"}]
    },
    {
      "name": "y",
      "kind": "call",
      "op": "aten.neg.default",
      "args": [{"value": "x"}],
      "outputs": [{"name": "y"}]
    }
  ]
}
"#;

#[test]
fn hand_written_json_reads() {
    let g = from_json(GOOD, Path::new("good.json")).unwrap();
    assert_eq!(g.nodes[1].args(), &[Arg::Value(ValueId::new(0, 0))]);
    assert_eq!(to_json(&g), GOOD);
}

#[test]
fn syntax_error_is_located() {
    let e = err("{\n  \"format\": \"shardproof-graph\",\n  \"version\": 1,,\n}");
    assert_eq!(e.span, Some(Span::new(3, 16)), "{e}");
    assert!(e.message.starts_with("invalid JSON graph"));
}

#[test]
fn unknown_field_is_located() {
    let text = GOOD.replace("\"kind\": \"call\",", "\"kind\": \"call\", \"opp\": 1,");
    let e = err(&text);
    assert_eq!(e.span.unwrap().line, pos(&text, "\"opp\"").line, "{e}");
    assert!(e.message.contains("unknown field `opp`"), "{e}");
}

#[test]
fn unknown_value_name_points_at_the_node() {
    let text = GOOD.replace("[{\"value\": \"x\"}]", "[{\"value\": \"q\"}]");
    let e = err(&text);
    assert_eq!(e.span, Some(pos(&text, "\"args\"")), "{e}");
    assert!(e.message.contains("unknown value `q`"));
    assert!(e.hint.unwrap().contains("`y`"));
}

#[test]
fn value_used_before_definition_is_an_error() {
    let text = r#"{"format": "shardproof-graph", "version": 1, "name": "g", "inputs": [], "outputs": [],
"nodes": [{"name": "a", "kind": "call", "op": "aten.neg.default", "args": [], "kwargs": {"k": {"value": "b"}}, "outputs": [{"name": "a"}]},
{"name": "b", "kind": "input", "outputs": [{"name": "b"}]}]}"#;
    let e = err(text);
    let col = text.lines().nth(1).unwrap().find("\"kwargs\"").unwrap() + 1;
    assert_eq!(e.span, Some(Span::new(2, col)), "{e}");
    assert!(e.message.contains("unknown value `b`"));
}

#[test]
fn semantic_errors_point_at_the_node() {
    let no_op = GOOD.replace("\"op\": \"aten.neg.default\",", "");
    let e = err(&no_op);
    let y_node = pos(&no_op, "\"name\": \"y\"");
    assert_eq!(e.span, Some(Span::new(y_node.line - 1, 5)), "{e}");
    assert!(e.message.contains("expected an `op`"));

    let bad_op = GOOD.replace("aten.neg.default", "aten..neg");
    let e = err(&bad_op);
    assert_eq!(e.span, Some(pos(&bad_op, "\"op\"")), "{e}");
    assert!(e.message.contains("malformed operator name"));

    let dup = GOOD.replace(
        "\"outputs\": [{\"name\": \"y\"}]",
        "\"outputs\": [{\"name\": \"x\"}]",
    );
    let e = err(&dup);
    let second = dup.rfind("\"outputs\"").unwrap();
    assert_eq!(
        e.span,
        Some(pos(&format!("{}#", &dup[..second]), "#")),
        "{e}"
    );
    assert!(e.message.contains("defined twice"));

    let attr = GOOD.replace(
        "\"kind\": \"input\",",
        "\"kind\": \"input\", \"attr\": \"w\",",
    );
    let e = err(&attr);
    assert_eq!(e.span, Some(pos(&attr, "\"attr\"")), "{e}");

    let input = GOOD.replace("\"inputs\": [\"x\"]", "\"inputs\": [\"y\"]");
    let e = err(&input);
    assert_eq!(e.span, Some(Span::new(5, 3)), "{e}");
    assert!(e.message.contains("not the output of an input node"));

    let output = GOOD.replace("\"outputs\": [\"y\"]", "\"outputs\": [\"z\"]");
    let e = err(&output);
    assert_eq!(e.span, Some(Span::new(6, 3)), "{e}");
}

#[test]
fn format_and_version_are_checked() {
    let e = err(&GOOD.replace("shardproof-graph", "other"));
    assert_eq!(e.span, Some(Span::new(2, 3)));
    let e = err(&GOOD.replace("\"version\": 1", "\"version\": 9"));
    assert_eq!(e.span, Some(Span::new(3, 3)));
    assert!(e.message.contains("unsupported format version 9"));
}

#[test]
fn bad_dtype_and_argument_objects_are_located() {
    let t = GOOD.replace(
        "\"outputs\": [{\"name\": \"x\"}]",
        "\"outputs\": [{\"name\": \"x\", \"type\": {\"dtype\": \"c64\", \"shape\": []}}]",
    );
    let e = err(&t);
    assert_eq!(e.span.unwrap().line, pos(&t, "c64").line, "{e}");
    assert!(e.message.contains("unknown dtype `c64`"));
    let t = GOOD.replace(
        "[{\"value\": \"x\"}]",
        "[{\"value\": \"x\", \"float\": \"inf\"}]",
    );
    let e = err(&t);
    assert_eq!(e.span.unwrap().line, pos(&t, "\"float\"").line, "{e}");
    assert!(e.message.contains("exactly one key"));
    let t = GOOD.replace("[{\"value\": \"x\"}]", "[{\"float\": \"1.5\"}]");
    assert!(err(&t).message.contains("finite floats are plain numbers"));
    let t = GOOD.replace("[{\"value\": \"x\"}]", "[18446744073709551615]");
    assert!(err(&t).message.contains("out of range"));
}

#[test]
fn schema_is_committed_and_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/formats/graph.schema.json");
    let generated = json_schema();
    if std::env::var_os("SHARDPROOF_REGEN_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
        println!("regenerated {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/formats/graph.schema.json is stale; regenerate it with \
         `SHARDPROOF_REGEN_SCHEMA=1 cargo test -p shardproof-import --test json_roundtrip schema`"
    );
    // Every documented top-level key is in the schema.
    for key in [
        "format", "version", "name", "path", "inputs", "outputs", "nodes",
    ] {
        assert!(generated.contains(&format!("\"{key}\"")));
    }
}

fn arb_arg(values: usize) -> impl Strategy<Value = Arg> {
    let leaf = prop_oneof![
        Just(Arg::None),
        any::<bool>().prop_map(Arg::Bool),
        any::<i64>().prop_map(Arg::Int),
        any::<f64>().prop_map(Arg::Float),
        prop_oneof![Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(-0.0)].prop_map(Arg::Float),
        ".{0,8}".prop_map(Arg::Str),
        (0..values.max(1)).prop_map(move |i| if values == 0 {
            Arg::None
        } else {
            Arg::Value(ValueId::new(i, 0))
        }),
        proptest::sample::select(DType::ALL.to_vec()).prop_map(Arg::Dtype),
        "[a-z]{1,4}(:[0-9])?".prop_map(Arg::Device),
        "[a-z_]{1,8}".prop_map(Arg::Layout),
        "[a-z_]{1,8}".prop_map(Arg::MemoryFormat),
        ("[a-z_.]{1,6}", "[a-z_.]{1,6}", "[a-z_.]{0,6}")
            .prop_map(|(a, b, c)| Arg::Op(OpName::new(&a, &b, &c))),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        proptest::collection::vec(inner, 0..4).prop_map(Arg::List)
    })
}

fn arb_graph() -> impl Strategy<Value = Graph> {
    (1usize..6)
        .prop_flat_map(|n| {
            let nodes: Vec<_> = (0..n)
                .map(|i| {
                    (
                        proptest::collection::vec(arb_arg(i), 0..4),
                        proptest::collection::vec(("[a-z]{1,3}", arb_arg(i)), 0..3),
                        proptest::option::of((
                            proptest::sample::select(DType::ALL.to_vec()),
                            proptest::collection::vec(
                                prop_oneof![
                                    any::<i64>().prop_map(Dim::Known),
                                    "s[0-9]".prop_map(Dim::Sym)
                                ],
                                0..3,
                            ),
                        )),
                        any::<bool>(),
                    )
                })
                .collect();
            (
                nodes,
                proptest::collection::vec(proptest::option::of(0..n), 0..4),
            )
        })
        .prop_map(|(nodes, outs)| {
            let mut g = Graph::new("random");
            for (i, (args, kwargs, ty, input)) in nodes.into_iter().enumerate() {
                let mut kw: Vec<(String, Arg)> = Vec::new();
                for (k, a) in kwargs {
                    if !kw.iter().any(|(k2, _)| *k2 == k) {
                        kw.push((k, a));
                    }
                }
                let kind = if input || i == 0 {
                    NodeKind::Input
                } else {
                    NodeKind::Call {
                        op: OpName::new("aten", &format!("op{i}"), "default"),
                        args,
                        kwargs: kw,
                    }
                };
                let ty = ty.map(|(dtype, shape)| TensorType { dtype, shape });
                let name = format!("v{i}");
                g.push(Node {
                    name: name.clone(),
                    kind,
                    outputs: vec![Output { name, ty }],
                    loc: None,
                    line: Some(i + 1),
                });
                if matches!(g.nodes[i].kind, NodeKind::Input) {
                    g.inputs.push(ValueId::new(i, 0));
                }
            }
            g.outputs = outs
                .into_iter()
                .map(|o| o.map(|i| ValueId::new(i, 0)))
                .collect();
            g
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_graphs_round_trip(g in arb_graph()) {
        g.check_structure().unwrap();
        round_trip(&g);
    }
}
