//! Type checking: every error class on tiny graphs, and zero errors on every correct program
//! we have (the real Megatron graphs of shared/samples and a spread of zoo cases).

use shardproof_interp::{storage_bytes, typecheck, TypeError, TypeErrorKind};
use shardproof_ir::Graph;
use shardproof_zoo::{
    emit_pipelined, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
    TrainOptions,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn graph(text: &str) -> Graph {
    shardproof_import::parse_fx(text, Path::new("g.py"))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph
}

fn errors(text: &str) -> Vec<TypeError> {
    typecheck(&graph(text), &BTreeMap::new()).expect_err("expected type errors")
}

fn module(sig: &str, body: &str) -> String {
    format!("class GraphModule(torch.nn.Module):\n    def forward(self, {sig}):\n{body}")
}

#[test]
fn a_correct_graph_type_checks() {
    let g = graph(&module(
        r#"x: "f32[8, 16]", w: "f32[16, 4]""#,
        r#"        mm: "f32[8, 4]" = torch.ops.aten.mm.default(x, w)
        relu: "f32[8, 4]" = torch.ops.aten.relu.default(mm)
        return (relu,)
"#,
    ));
    let inf = typecheck(&g, &BTreeMap::new()).unwrap();
    assert_eq!(inf.metas[2][0].as_ref().unwrap().shape, vec![8, 4]);
    assert_eq!(
        storage_bytes(&inf.metas, None),
        Some((128 + 64 + 32 + 32) * 8)
    );
}

#[test]
fn opaque_operators_are_not_type_errors() {
    let g = graph(&module(
        r#"x: "f32[8, 16]""#,
        r#"        y: "f32[8, 16]" = torch.ops.mylib.frob.default(x)
        z = torch.ops.mylib.frob.default(y)
        add: "f32[8, 16]" = torch.ops.aten.add.Tensor(z, x)
        return (add,)
"#,
    ));
    assert!(typecheck(&g, &BTreeMap::new()).is_ok());
}

#[test]
fn a_slice_along_the_wrong_dim_is_rejected_at_the_broadcast() {
    let errs = errors(&module(
        r#"x: "f32[8, 16]", b: "f32[8, 16]""#,
        r#"        s: "f32[4, 16]" = torch.ops.aten.slice.Tensor(x, 0, 0, 4)
        t: "f32[8, 8]" = torch.ops.aten.slice.Tensor(b, 1, 0, 8)
        add: "f32[4, 16]" = torch.ops.aten.add.Tensor(s, t)
        return (add,)
"#,
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    let e = &errs[0];
    assert_eq!(e.kind, TypeErrorKind::Rejected);
    assert_eq!(
        (e.file.as_str(), e.line, e.node.as_str()),
        ("g.py", Some(5), "add")
    );
    let text = e.to_string();
    assert!(
        text.starts_with("g.py:5: node `add` (aten.add.Tensor): the operator rejects"),
        "{text}"
    );
    assert!(text.contains("s: f32[4, 16], t: f32[8, 8]"), "{text}");
    assert!(text.contains("\n  hint: "), "{text}");
    let se = e.to_source_error().to_string();
    assert!(se.starts_with("g.py:5:1: node `add`"), "{se}");
}

#[test]
fn empty_tensors_are_refused_where_they_arise() {
    let errs = errors(&module(
        r#"x: "f32[0, 17]""#,
        r#"        neg: "f32[0, 17]" = torch.ops.aten.neg.default(x)
        return (neg,)
"#,
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].kind, TypeErrorKind::Empty);
    assert_eq!(errs[0].node, "x");
    assert_eq!(errs[0].line, Some(2));
    assert!(errs[0].message.contains("f32[0, 17]"), "{}", errs[0]);
    assert!(errs[0].message.contains("empty"), "{}", errs[0]);

    // An inferred empty tensor: a slice past the end.
    let errs = errors(&module(
        r#"x: "f32[8, 17]""#,
        r#"        s = torch.ops.aten.slice.Tensor(x, 1, 20, 30)
        neg = torch.ops.aten.neg.default(s)
        return (neg,)
"#,
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].kind, errs[0].node.as_str()),
        (TypeErrorKind::Empty, "s")
    );
    assert!(
        errs[0].message.contains("is computed as f32[8, 0]"),
        "{}",
        errs[0]
    );
}

#[test]
fn overflowing_tensors_are_refused() {
    // 2^62 x 16 elements overflow u64.
    let errs = errors(&module(
        r#"x: "f32[4611686018427387904, 16]", w: "f32[16, 4]""#,
        r#"        mm = torch.ops.aten.mm.default(x, w)
        return (mm,)
"#,
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].kind, errs[0].node.as_str()),
        (TypeErrorKind::Overflow, "x")
    );
    assert!(
        errs[0].message.contains("element count overflows"),
        "{}",
        errs[0]
    );

    // 2^63 - 1 f32 elements: the element count fits, the bytes do not.
    let errs = errors(&module(
        "",
        r#"        full = torch.ops.aten.full.default([9223372036854775807], 1.0, dtype = torch.float32)
        return (full,)
"#,
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].kind, errs[0].node.as_str()),
        (TypeErrorKind::Overflow, "full")
    );
    assert!(errs[0].message.contains("bytes overflow"), "{}", errs[0]);

    // [8, 2^32] is fine arithmetically: it type-checks, and its size is there to budget.
    let g = graph(&module(
        r#"x: "f32[8, 4294967296]""#,
        "        return (x,)\n",
    ));
    let inf = typecheck(&g, &BTreeMap::new()).unwrap();
    assert_eq!(storage_bytes(&inf.metas, None), Some(8u64 << 35));
    let live = vec![vec![false]];
    assert_eq!(storage_bytes(&inf.metas, Some(&live)), Some(0));
}

#[test]
fn contradicting_recorded_shapes_are_reported() {
    let errs = errors(&module(
        r#"x: "f32[8, 16]", w: "f32[16, 4]""#,
        r#"        mm: "f32[8, 5]" = torch.ops.aten.mm.default(x, w)
        return (mm,)
"#,
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].kind, TypeErrorKind::Mismatch);
    assert!(
        errs[0].message.contains("recorded as f32[8, 5]"),
        "{}",
        errs[0]
    );
}

/// The shared samples folder, or `None` (with a printed note) when this checkout has none.
fn samples() -> Option<PathBuf> {
    let root = std::env::var_os("SHARDPROOF_SHARED").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
        PathBuf::from,
    );
    let dir = root.join("samples/entangle");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (set SHARDPROOF_SHARED to the shared/ folder to run this test)",
            dir.display()
        );
        None
    }
}

fn assert_types(graph: &Graph, ops: &BTreeMap<String, shardproof_ir::OpMeaning>, what: &str) {
    if let Err(errs) = typecheck(graph, ops) {
        let shown: Vec<String> = errs.iter().take(5).map(|e| e.to_string()).collect();
        panic!("{what}: {} type errors:\n{}", errs.len(), shown.join("\n"));
    }
}

#[test]
fn the_megatron_samples_type_check() {
    let Some(dir) = samples() else { return };
    let mut files = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "py") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 7, "{files:?}");
    for f in &files {
        let g = shardproof_import::load_graph(f).unwrap_or_else(|e| panic!("{e}"));
        assert_types(&g, &BTreeMap::new(), &f.display().to_string());
    }
    for case in [
        "case-tp2.yaml",
        "case-tp2-constants.yaml",
        "case-bug-tp2.yaml",
    ] {
        let case = shardproof_case::load_case(&dir.join(case)).unwrap_or_else(|e| panic!("{e}"));
        assert_types(&case.spec, &case.ops, "spec");
        for g in &case.program.ranks {
            assert_types(g, &case.ops, &g.name);
        }
    }
}

#[test]
fn zoo_cases_type_check() {
    let base = |model: &str, mesh: &str, forward_only: bool| EmitOptions {
        model: model.into(),
        mlp: MlpConfig {
            layers: 2,
            ..MlpConfig::default()
        },
        llama: LlamaConfig::default(),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: None,
        forward_only,
        vocab_parallel: false,
    };
    let sp = EmitExtras {
        sequence_parallel: true,
        ..EmitExtras::default()
    };
    let plain = EmitExtras::default();
    let cases: Vec<(EmitOptions, &EmitExtras)> = vec![
        (base("mlp", "dp=2,tp=2", false), &plain),
        (base("llama", "tp=2", false), &plain),
        (base("gpt2", "tp=2", false), &sp),
        (base("deepseek", "ep=2", false), &plain),
        (base("llama", "cp=2", true), &plain),
        (base("mlp", "pp=2", false), &plain),
        (base("gpt2", "dp=2,cp=2", false), &plain),
        (base("deepseek", "tp=2,ep=2", false), &plain),
    ];
    for (o, extras) in cases {
        let what = format!("{} {}", o.model, o.mesh.label());
        let e = emit_pipelined(
            &o,
            extras,
            &TrainOptions::default(),
            &PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let dir = tempfile::tempdir().unwrap();
        e.write(dir.path()).unwrap();
        let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_types(&case.spec, &case.ops, &format!("{what} spec"));
        for g in &case.program.ranks {
            assert_types(g, &case.ops, &format!("{what} {}", g.name));
        }
    }
}
