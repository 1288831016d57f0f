//! One test per kind of case-file error: each asserts the line, the column, the message and
//! that a hint is given.

mod common;

use common::{assert_error, rank_linear, spec_linear, G};
use shardproof_case::{parse_case, resolve_case, Case, Layout};
use shardproof_ir::{Graph, SourceError, Span};
use std::path::Path;

const BASE: &str = r#"version: 1
name: linear
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
  groups: { "12": tp }
inputs:
  primals_1: Replicate()
  primals_4: Shard(0)
outputs:
  mm: Shard(1)
"#;

fn resolve_with(text: &str, ranks: Vec<Graph>) -> Result<Case, SourceError> {
    let file = parse_case(text, Path::new("case.yaml"))?;
    resolve_case(file, spec_linear(), ranks)
}

fn resolve(text: &str) -> Result<Case, SourceError> {
    resolve_with(text, vec![rank_linear(0, 1152), rank_linear(1, 1152)])
}

/// `text` with line `line` (1-based) replaced.
fn with_line(line: usize, new: &str) -> String {
    let mut lines: Vec<&str> = BASE.lines().collect();
    lines[line - 1] = new;
    lines.join("\n") + "\n"
}

#[test]
fn the_base_case_resolves() {
    let case = resolve(BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(case.inputs.len(), 2);
    assert_eq!(case.outputs[0].impl_values.len(), 2);
    assert_eq!(case.program.group("12").unwrap().members, vec![vec![0, 1]]);
}

#[test]
fn unknown_tensor_suggests_the_nearest_name() {
    let text = with_line(11, "  primal_4: Shard(0)");
    let e = assert_error(resolve(&text), 11, 3, "unknown tensor `primal_4`");
    assert!(e.message.contains("did you mean `primals_4`?"), "{e}");
}

#[test]
fn bad_placement_syntax_points_inside_the_placement() {
    let text = with_line(11, "  primals_4: Shard(x)");
    assert_error(resolve(&text), 11, 20, "`Shard` takes a tensor dim");
    let text = with_line(11, "  primals_4: shard(0)");
    assert_error(resolve(&text), 11, 14, "did you mean `Shard`?");
}

#[test]
fn placement_that_does_not_fit_shows_both_shapes() {
    let e = assert_error(
        resolve_with(BASE, vec![rank_linear(0, 1000), rank_linear(1, 1152)]),
        11,
        14,
        "does not fit",
    );
    assert_eq!(
        e.message,
        "`primals_4`: Shard(0) does not fit: spec f32[2304, 768], rank 0 has f32[1000, 768], \
         rank 1 has f32[1152, 768] (expected 1152 = 2304 / 2 along dim 0)"
    );
    let text = with_line(11, "  primals_4: Shard(2)");
    let e = assert_error(resolve(&text), 11, 14, "out of range");
    assert!(e.message.contains("spec f32[2304, 768]"), "{e}");
    assert!(e.message.contains("ranks 0-1 have f32[1152, 768]"), "{e}");
}

#[test]
fn wrong_number_of_rank_graphs() {
    let text = with_line(7, "  graphs: [r0.py, r1.py, r2.py]");
    let e = assert_error(
        resolve(&text),
        7,
        11,
        "has 2 ranks but `graphs` lists 3 graphs",
    );
    assert!(e.message.contains("{ tp: 2 }"), "{e}");
    assert_error(
        resolve_with(BASE, vec![rank_linear(0, 1152)]),
        7,
        11,
        "has 2 ranks but the caller gave 1 graphs",
    );
}

#[test]
fn unparseable_yaml() {
    let text = with_line(10, "  primals_1: [Replicate()");
    let e = resolve(&text).expect_err("bad YAML");
    assert!(e.message.contains("not valid YAML"), "{e}");
    // The unclosed `[` swallows the next line, whose `:` is where YAML notices.
    assert_eq!(e.span, Some(Span::new(11, 12)), "{e}");
    let e = resolve("version: 1\n  spec: x\n").expect_err("bad YAML");
    assert_eq!(e.span, Some(Span::new(2, 7)), "{e}");
    assert!(e.hint.is_some());
}

#[test]
fn unknown_key_suggests_the_known_one() {
    let text = with_line(7, "  grpahs: [r0.py, r1.py]");
    let e = assert_error(resolve(&text), 7, 3, "unknown key `grpahs` in `impl`");
    assert!(e.message.contains("did you mean `graphs`?"), "{e}");
    let text = BASE.replace("outputs:", "output:");
    assert_error(resolve(&text), 12, 1, "did you mean `outputs`?");
}

#[test]
fn unknown_mesh_dim_in_a_per_dim_placement() {
    let text = with_line(11, "  primals_4: { tq: Shard(0) }");
    let e = assert_error(resolve(&text), 11, 16, "unknown mesh dim `tq`");
    assert!(e.message.contains("did you mean `tp`?"), "{e}");
    let text = with_line(11, "  primals_4: { placment: Shard(0) }");
    let e = assert_error(resolve(&text), 11, 16, "unknown mesh dim `placment`");
    assert!(e.message.contains("did you mean `placement`?"), "{e}");
}

#[test]
fn unknown_group_dim() {
    let text = with_line(8, r#"  groups: { "12": tq }"#);
    let e = assert_error(
        resolve(&text),
        8,
        19,
        "unknown mesh dim `tq` in process group `12`",
    );
    assert!(e.message.contains("did you mean `tp`?"), "{e}");
}

#[test]
fn expr_parse_error_points_inside_the_string() {
    let text = with_line(13, r#"  mm: { expr: "concat([r0.mm, r1.mm] 1)" }"#);
    assert_error(resolve(&text), 13, 38, "expected `,`");
    let text = with_line(13, r#"  mm: { expr: "concat([r0.mm, r1.mn], 1)" }"#);
    let e = assert_error(
        resolve(&text),
        13,
        31,
        "`mn` is not a value of the graph of rank 1",
    );
    assert!(e.message.contains("did you mean `mm`?"), "{e}");
    let text = with_line(13, r#"  mm: { expr: "concat([r0.mm, r2.mm], 1)" }"#);
    assert_error(resolve(&text), 13, 31, "rank 2 does not exist");
    let text = with_line(13, r#"  mm: { expr: "concat([r0.mm, r1.mm], 0)" }"#);
    assert_error(resolve(&text), 13, 7, "gives shape [16, 1152]");
    let text = with_line(13, r#"  mm: { expr: "concat([r0.mm, r1.mm], 1)" }"#);
    let case = resolve(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(case.outputs[0].layout, Layout::Expr(_)));
}

#[test]
fn bare_shard_on_a_2d_mesh_asks_for_the_per_dim_form() {
    let text = BASE.replace("{ tp: 2 }", "{ dp: 1, tp: 2 }");
    let e = assert_error(resolve(&text), 11, 14, "ambiguous on the 2-d mesh");
    assert!(e.hint.unwrap().contains("{ dp: Shard(0) }"));
    let ok = text
        .replace("primals_4: Shard(0)", "primals_4: { tp: Shard(0) }")
        .replace("mm: Shard(1)", "mm: [Replicate(), Shard(1)]");
    resolve(&ok).unwrap_or_else(|e| panic!("{e}"));
    let bad = ok.replace("[Replicate(), Shard(1)]", "[Shard(1)]");
    assert_error(resolve(&bad), 13, 7, "1 placements for the 2-d mesh");
}

#[test]
fn undeclared_group_on_an_nd_mesh_names_group_and_collective() {
    let text = BASE
        .replace("{ tp: 2 }", "{ dp: 1, tp: 2 }")
        .replace("  groups: { \"12\": tp }\n", "")
        .replace("primals_4: Shard(0)", "primals_4: { tp: Shard(0) }")
        .replace("mm: Shard(1)", "mm: { tp: Shard(1) }");
    let e = assert_error(resolve(&text), 5, 1, "process group `12`");
    assert!(
        e.message
            .contains("_c10d_functional.all_gather_into_tensor"),
        "{e}"
    );
}

#[test]
fn group_checks() {
    let text = with_line(8, r#"  groups: { "12": [[0, 1], [1]] }"#);
    assert_error(resolve(&text), 8, 29, "rank 1 appears twice");
    let text = with_line(8, r#"  groups: { "12": [[0, 2]] }"#);
    assert_error(resolve(&text), 8, 24, "rank 2 is outside the mesh");
    let text = with_line(8, r#"  groups: { "12": [[0], [1]] }"#);
    assert_error(resolve(&text), 8, 13, "runs on 2 ranks");
    let text = with_line(8, r#"  groups: { "12": [[0]] }"#);
    assert_error(resolve(&text), 8, 13, "does not contain rank 1");
    let text = with_line(8, r#"  groups: { "12": all, "pair": [[1, 0]] }"#);
    let case = resolve(&text).unwrap();
    assert_eq!(
        case.program.group("pair").unwrap().members,
        vec![vec![0, 1]]
    );
}

#[test]
fn impl_names_must_exist_on_every_rank() {
    let text = with_line(11, "  primals_4: { impl: w_local, placement: Shard(0) }");
    let e = assert_error(
        resolve(&text),
        11,
        22,
        "`w_local` is not a value of the graph of rank 0",
    );
    assert!(e.message.contains("r0.py"), "{e}");
    let r1 = G::new("r1")
        .input("primals_1", &[8, 768])
        .input("w", &[1152, 768])
        .call("t", "t", &["w"], &[768, 1152])
        .call("mm", "mm", &["primals_1", "t"], &[8, 1152])
        .outputs(&["mm"])
        .build();
    let e = assert_error(
        resolve_with(BASE, vec![rank_linear(0, 1152), r1]),
        11,
        3,
        "`primals_4` is not a value of the graph of rank 1",
    );
    assert!(e.hint.unwrap().contains("impl: NAME"));
}

#[test]
fn version_and_required_keys() {
    let text = with_line(1, "version: 2");
    assert_error(resolve(&text), 1, 10, "unsupported case format version 2");
    let text = BASE.replace(
        "inputs:\n  primals_1: Replicate()\n  primals_4: Shard(0)\n",
        "",
    );
    assert_error(resolve(&text), 1, 1, "has no `inputs`");
    let text = BASE.replace("  primals_1: Replicate()\n", "  primals_4: Replicate()\n");
    assert_error(resolve(&text), 11, 3, "`primals_4` appears twice");
    assert_error(resolve(""), 1, 1, "empty");
}

#[test]
fn assumptions_are_checked() {
    let text = format!("{BASE}assume:\n  dropuot: same-mask\n");
    assert_error(resolve(&text), 15, 3, "did you mean `dropout`?");
    let text = format!("{BASE}assume:\n  dropout: same_mask\n");
    assert_error(resolve(&text), 15, 12, "did you mean `same-mask`?");
    let text = format!("{BASE}assume:\n  dropout: same-mask\n");
    assert!(resolve(&text).unwrap().assume.dropout.is_some());
}

#[test]
fn ops_are_parsed_and_validated() {
    let text = format!(
        "{BASE}ops:\n  tg.log_tensor: identity\n  mylib.fused_gelu_bias: \"gelu(add($0, $1))\"\n"
    );
    let case = resolve(&text).unwrap();
    assert_eq!(case.ops.len(), 2);
    let e = case
        .validate_ops(&|op| op.name != "gelu")
        .expect_err("gelu is unknown here");
    assert_eq!(e.span, Some(Span::new(16, 27)));
    assert!(e.message.contains("aten.gelu.default"));
    case.validate_ops(&|_| true).unwrap();
    let text = format!("{BASE}ops:\n  mylib.f: \"gelu(add($0 $1))\"\n");
    assert_error(resolve(&text), 15, 25, "expected `,` or `)`");
    let text = format!("{BASE}ops:\n  logtensor: identity\n");
    assert_error(resolve(&text), 15, 3, "not an operator name");
}

#[test]
fn fused_blocks_and_replicas() {
    let blocks = with_line(
        11,
        "  primals_4: { placement: Shard(0), blocks: [1536, 384, 384] }",
    );
    let case = resolve(&blocks).unwrap_or_else(|e| panic!("{e}"));
    let r = case.input("primals_4").unwrap();
    let p = case.pieces(&r.layout, r.spec_value, 1).unwrap();
    assert_eq!(p.blocks.len(), 3);
    assert_eq!(p.blocks[1][0], 1728..1920);
    let bad = with_line(
        11,
        "  primals_4: { placement: Shard(0), blocks: [1536, 384, 380] }",
    );
    assert_error(resolve(&bad), 11, 14, "add up to 2300");
    let rep = with_line(11, "  primals_4: { placement: Shard(0), replicas: 2 }");
    let e = assert_error(resolve(&rep), 11, 14, "expected 2304 = 2304 along dim 0");
    assert!(e.message.contains("with replicas 2"), "{e}");
    let rep3 = with_line(11, "  primals_4: { placement: Shard(0), replicas: 3 }");
    assert_error(
        resolve(&rep3),
        11,
        14,
        "replicas: 3 does not divide the 2 shards",
    );
    let on_replicate = with_line(11, "  primals_4: { placement: Replicate(), blocks: 2 }");
    assert_error(resolve(&on_replicate), 11, 14, "no placement is `Shard`");
    let mixed = with_line(
        11,
        "  primals_4: { placement: Shard(0), expr: \"r0.primals_4\" }",
    );
    assert_error(resolve(&mixed), 11, 16, "cannot be combined with `expr`");
}

#[test]
fn cuts_and_partials() {
    let text = with_line(10, "  t: Shard(1)");
    let case = resolve(&text).unwrap_or_else(|e| panic!("{e}"));
    let t = case.input("t").unwrap();
    assert!(t.cut);
    assert!(!case.input("primals_4").unwrap().cut);
    let text = with_line(10, "  primals_1: Partial(avg)");
    let case = resolve(&text).unwrap();
    let r = case.input("primals_1").unwrap();
    let p = case.pieces(&r.layout, r.spec_value, 1).unwrap();
    let share = p.partial.unwrap();
    assert_eq!((share.index, share.group), (1, vec![0, 1]));
    let text = with_line(10, "  primals_1: Partial(prod)");
    assert_error(resolve(&text), 10, 22, "`prod` is not a reduction");
}

#[test]
fn load_case_reads_graphs_relative_to_the_case() {
    let dir = tempfile::tempdir().unwrap();
    let fx = |shape: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{shape}]\"):\n        \
             neg: \"f32[{shape}]\" = torch.ops.aten.neg.default(x);  x = None\n        \
             return (neg,)\n"
        )
    };
    std::fs::create_dir(dir.path().join("g")).unwrap();
    std::fs::write(dir.path().join("g/spec.py"), fx("4, 6")).unwrap();
    std::fs::write(dir.path().join("g/r0.py"), fx("2, 6")).unwrap();
    std::fs::write(dir.path().join("g/r1.py"), fx("2, 6")).unwrap();
    let case_text = "version: 1\nspec: { graph: g/spec.py }\nimpl:\n  mesh: { tp: 2 }\n  \
                     graphs: [g/r0.py, g/r1.py]\ninputs:\n  x: Shard(0)\noutputs:\n  neg: Shard(0)\n";
    let path = dir.path().join("case.yaml");
    std::fs::write(&path, case_text).unwrap();
    let case = shardproof_case::load_case(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(case.name, "case");
    assert_eq!(case.program.ranks.len(), 2);
    std::fs::write(&path, case_text.replace("g/r1.py", "g/r9.py")).unwrap();
    let e = shardproof_case::load_case(&path).unwrap_err();
    assert_eq!(e.span, Some(Span::new(5, 21)), "{e}");
    assert!(
        e.message
            .contains("cannot find the graph of rank 1 `g/r9.py`"),
        "{e}"
    );
    let e = shardproof_case::load_case(&dir.path().join("nope.yaml")).unwrap_err();
    assert!(e.message.contains("cannot read the case file"), "{e}");
}

#[test]
fn constants_are_checked() {
    // The linear graphs have no module constants: naming one is an error that says so.
    let text = format!("{BASE}constants:\n  _tensor_constant0: 0.0\n");
    let e = assert_error(
        resolve(&text),
        15,
        3,
        "no graph of the case has a module constant",
    );
    assert!(e.hint.unwrap().contains("no module constants"));
    let text = format!("{BASE}constants:\n  _tensor_constant0: zero\n");
    assert_error(resolve(&text), 15, 22, "must be a number");
    let text = format!("{BASE}constants: [0]\n");
    assert_error(resolve(&text), 14, 12, "must be a mapping");
}

#[test]
fn invalid_utf8_in_a_case_file_names_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.yaml");
    let text = BASE.replace("name: linear", "name: lin\u{e9}ar");
    let bytes = text.replace('\u{e9}', "\u{1}").into_bytes();
    let bytes: Vec<u8> = bytes
        .into_iter()
        .map(|b| if b == 1 { 0xe9 } else { b })
        .collect();
    std::fs::write(&path, bytes).unwrap();
    let shown = shardproof_case::load_case(&path).unwrap_err().to_string();
    assert!(
        shown.starts_with(&format!(
            "{}:2:10: the file is not valid UTF-8",
            path.display()
        )),
        "{shown}"
    );
    assert!(shown.contains("hint: "), "{shown}");
}

#[test]
fn a_long_identifier_is_quoted_as_an_excerpt() {
    let long = "q".repeat(3000);
    let e = resolve(&BASE.replace("Shard(1)", &format!("Shard({long})"))).unwrap_err();
    let shown = e.to_string();
    assert!(shown.chars().count() < 600, "{shown:.300}");
}

/// An HLO replica-group name states its own members: on a 1-d mesh it is not taken for the
/// whole mesh (which would change the sums when the groups are pairs) but must be declared.
#[test]
fn undeclared_hlo_group_on_a_1d_mesh_must_be_declared() {
    let group = "hlo{{0,1}}";
    let rank = |r: usize| {
        G::new(&format!("r{r}"))
            .input("primals_1", &[8, 768])
            .input("primals_4", &[1152, 768])
            .call("t", "t", &["primals_4"], &[768, 1152])
            .call("mm", "mm", &["primals_1", "t"], &[8, 1152])
            .all_gather("all_gather_into_tensor", "mm", 2, group, &[16, 1152])
            .outputs(&["mm"])
            .build()
    };
    let undeclared = BASE.replace("  groups: { \"12\": tp }\n", "");
    let e = assert_error(
        resolve_with(&undeclared, vec![rank(0), rank(1)]),
        5,
        1,
        "process group `hlo{{0,1}}`",
    );
    assert!(e.hint.unwrap().contains("states its members"));
    let declared = BASE.replace(
        "  groups: { \"12\": tp }\n",
        "  groups: { \"hlo{{0,1}}\": [[0, 1]] }\n",
    );
    resolve_with(&declared, vec![rank(0), rank(1)]).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn mapped_op_declarations_are_parsed_and_checked() {
    let text = format!(
        "{BASE}ops:\n  _C.rms_norm: {{ args: [result, input, weight, eps], writes: {{ result: \"mul($1, $2)\" }} }}\n  vllm.all_reduce: \"_c10d_functional.all_reduce($0, 'sum', $1)\"\n"
    );
    let case = resolve(&text).unwrap();
    assert_eq!(case.ops.len(), 2);
    // A write to a parameter `args` does not name.
    let text =
        format!("{BASE}ops:\n  _C.f: {{ args: [out, x], writes: {{ result: \"relu($1)\" }} }}\n");
    assert_error(resolve(&text), 15, 37, "not a parameter in `args`");
    // `$i` past the parameters.
    let text =
        format!("{BASE}ops:\n  _C.f: {{ args: [out, x], writes: {{ out: \"relu($2)\" }} }}\n");
    assert_error(resolve(&text), 15, 42, "reads `$2`");
    // Neither a result nor a write.
    let text = format!("{BASE}ops:\n  _C.f: {{ args: [out, x] }}\n");
    assert_error(resolve(&text), 15, 9, "neither `returns` nor `writes`");
    // An unclosed string.
    let text = format!("{BASE}ops:\n  _C.f: \"all_reduce($0, 'sum)\"\n");
    assert_error(resolve(&text), 15, 25, "no closing quote");
}

/// `scale:` on an `inputs:` entry: a whole number of at least 1, inputs only, and read by
/// `shardproof prove` alone, so the loaders the other engines use refuse it at the value.
#[test]
fn scale_is_a_whole_number_on_inputs_read_by_prove_only() {
    let scaled = with_line(11, "  primals_4: { placement: Shard(0), scale: 2 }");
    let e = assert_error(resolve(&scaled), 11, 44, "read by `shardproof prove` only");
    assert!(e.message.contains("`primals_4`"), "{e}");
    let zero = with_line(11, "  primals_4: { placement: Shard(0), scale: 0 }");
    assert_error(
        resolve(&zero),
        11,
        44,
        "`scale` must be at least 1, found 0",
    );
    let fraction = with_line(11, "  primals_4: { placement: Shard(0), scale: 0.5 }");
    assert_error(resolve(&fraction), 11, 44, "`scale` must be an integer");
    let typo = with_line(11, "  primals_4: { placement: Shard(0), scales: 2 }");
    let e = assert_error(resolve(&typo), 11, 37, "unknown key `scales`");
    assert!(e.message.contains("did you mean `scale`?"), "{e}");
    let output = with_line(13, "  mm: { placement: Shard(1), scale: 2 }");
    assert_error(resolve(&output), 13, 37, "`scale` on the output `mm`");
    let with_expr = with_line(11, "  primals_4: { expr: \"r0.primals_4\", scale: 2 }");
    assert_error(
        resolve(&with_expr),
        11,
        38,
        "cannot be combined with `expr`",
    );
}

/// A case loaded with its scales (`load_case_with_scales`, as `shardproof prove` loads it)
/// gives them by spec name; `load_case` refuses the same file.
#[test]
fn a_case_loaded_with_its_scales_gives_them_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let graph = |rows: usize| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, 2]\"):\n        y: \"f32[{rows}, 2]\" = torch.ops.aten.mul.Tensor(x, 3)\n        return (y,)\n"
        )
    };
    std::fs::write(dir.path().join("spec.py"), graph(4)).unwrap();
    std::fs::write(dir.path().join("rank.py"), graph(2)).unwrap();
    let case = dir.path().join("case.yaml");
    std::fs::write(
        &case,
        "version: 1\nspec: { graph: spec.py }\nimpl:\n  mesh: { dp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  x: { placement: Shard(0), scale: 2 }\noutputs:\n  y: Shard(0)\n",
    )
    .unwrap();
    let loaded = shardproof_case::load_case_with_scales(&case).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        loaded.scales(),
        std::collections::BTreeMap::from([("x".to_string(), 2)])
    );
    let e = shardproof_case::load_case(&case).expect_err("`scale` refused");
    assert_eq!(e.span, Some(Span::new(7, 36)), "{e}");
}
