//! Parsing torch.fx readable text: the shared Megatron samples, fixtures captured from torch 2.x
//! (torch.export, AOTAutograd, functional collectives under the fake process group) and a
//! hand-written fixture of unusual syntax.

mod common;

use shardproof_import::{load_graph, parse_fx, parse_fx_lenient, FxParse};
use shardproof_ir::{Arg, DType, Dim, Graph, NodeKind, OpName, TensorType, ValueId};
use std::path::Path;

fn parse_file(path: &Path) -> FxParse {
    let text = std::fs::read_to_string(path).unwrap();
    parse_fx(&text, path).unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> FxParse {
    parse_file(&common::fixtures_dir().join(name))
}

fn sample(rel: &str) -> Option<FxParse> {
    let dir = common::samples_dir()?;
    Some(parse_file(&dir.join("entangle").join(rel)))
}

fn node<'g>(g: &'g Graph, name: &str) -> &'g shardproof_ir::Node {
    g.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

fn value(g: &Graph, name: &str) -> ValueId {
    g.find(name).unwrap_or_else(|| panic!("no value {name}"))
}

/// Every line is accounted for exactly once, and a strict parse leaves nothing unparsed.
fn assert_full_coverage(p: &FxParse) {
    let s = &p.stats;
    assert!(s.unparsed.is_empty(), "unparsed: {:?}", s.unparsed);
    assert_eq!(s.lines_parsed + s.lines_ignored, s.lines_total, "{s:?}");
    p.graph.check_structure().unwrap();
    for g in &p.subgraphs {
        g.check_structure().unwrap();
    }
}

#[test]
fn every_sample_parses_with_full_coverage() {
    let Some(dir) = common::samples_dir() else {
        return;
    };
    let files = common::py_files(&dir);
    assert!(!files.is_empty(), "no .py graphs under {}", dir.display());
    for f in files {
        let p = parse_file(&f);
        assert_full_coverage(&p);
        let s = &p.stats;
        println!(
            "{}: {} lines, {} parsed, {} ignored, {} unparsed; {} nodes, {} inputs, {} outputs",
            f.strip_prefix(&dir).unwrap().display(),
            s.lines_total,
            s.lines_parsed,
            s.lines_ignored,
            s.unparsed.len(),
            p.graph.nodes.len(),
            p.graph.inputs.len(),
            p.graph.outputs.len()
        );
    }
}

#[test]
fn every_fixture_parses_with_full_coverage() {
    let files = common::py_files(&common::fixtures_dir());
    assert!(files.len() >= 15);
    for f in files {
        let p = parse_file(&f);
        assert_full_coverage(&p);
        assert!(!p.graph.outputs.is_empty(), "{}", f.display());
    }
}

#[test]
fn tp2_forward_sample_structure() {
    let Some(p) = sample("gpt/paral2_layer1/fw.g0.r0.py") else {
        return;
    };
    let g = &p.graph;
    assert_eq!(g.name, "fw.g0.r0");
    assert_eq!(
        (g.nodes.len(), g.inputs.len(), g.outputs.len()),
        (173, 22, 45)
    );
    assert_eq!(p.stats.lines_total, 326);
    assert_eq!(p.stats.lines_parsed, 175);
    // The loss is returned twice.
    assert_eq!(g.outputs[0], g.outputs[1]);
    assert_eq!(g.value_name(g.outputs[0].unwrap()), "div_2");
    assert_eq!(
        g.recorded_type(value(g, "primals_19")),
        Some(&TensorType::new(DType::Bool, &[8, 1, 1536, 1536]))
    );

    // Multi-output nodes: getitem lines become outputs of the producing node.
    let ln = node(g, "fused_layer_norm_affine_fwd");
    let names: Vec<&str> = ln.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["getitem_2", "getitem_3", "getitem_4"]);
    assert_eq!(ln.outputs[1].ty, Some(TensorType::new(DType::F32, &[6144])));
    assert_eq!(
        g.value_name(ValueId::new(value(g, "getitem_2").node, 2)),
        "getitem_4"
    );
    let drop = node(g, "native_dropout");
    assert_eq!(drop.outputs.len(), 2);
    assert_eq!(
        drop.outputs[1].ty,
        Some(TensorType::new(DType::Bool, &[768, 8, 768]))
    );
    // Only output 0 of `max.dim` is taken: the vector grows only as far as needed.
    assert_eq!(node(g, "max_1").outputs.len(), 1);
    assert_eq!(node(g, "max_1").outputs[0].name, "getitem_20");
    // A reader of an output refers to (node, output).
    let add3 = node(g, "add_3");
    assert_eq!(add3.args()[0], Arg::Value(value(g, "getitem")));
    assert_eq!(
        value(g, "getitem"),
        ValueId::new(value(g, "getitem_1").node, 0)
    );

    // Source locations come from the `# File:` comment above a node.
    let mm = node(g, "mm");
    let loc = mm.loc.as_ref().unwrap();
    assert_eq!(
        loc.file,
        "/opt/tiger/Megatron-LM/megatron/core/tensor_parallel/layers.py"
    );
    assert_eq!(loc.line, 697);
    assert_eq!(
        loc.function,
        "linear_with_grad_accumulation_and_async_allreduce"
    );
    assert_eq!(
        loc.code,
        "return LinearWithGradAccumulationAndAsyncCommunication.apply(*args)"
    );
    assert_eq!(mm.line, Some(111));

    // kwargs: dtype, layout, device, memory format, bools; floats keep their value.
    let c = node(g, "_to_copy");
    assert_eq!(c.kwarg("dtype"), Some(&Arg::Dtype(DType::I64)));
    assert_eq!(c.kwarg("layout"), Some(&Arg::Layout("strided".into())));
    assert_eq!(c.kwarg("device"), Some(&Arg::Device("cuda:0".into())));
    assert_eq!(
        node(g, "zeros").kwarg("device"),
        Some(&Arg::Device("cuda".into()))
    );
    assert_eq!(
        node(g, "zeros").kwarg("pin_memory"),
        Some(&Arg::Bool(false))
    );
    assert_eq!(node(g, "zeros").args(), &[Arg::List(vec![])]);
    assert_eq!(
        node(g, "clone_1").kwarg("memory_format"),
        Some(&Arg::MemoryFormat("contiguous_format".into()))
    );
    let b = node(g, "baddbmm");
    assert_eq!(b.kwarg("alpha"), Some(&Arg::Float(0.17677669529663687)));
    assert_eq!(b.kwarg("beta"), Some(&Arg::Float(0.0)));
    assert_eq!(node(g, "slice_1").args()[3], Arg::Int(9223372036854775807));
    assert_eq!(node(g, "masked_fill").args()[2], Arg::Float(-10000.0));

    // Collectives and constants.
    let ar = node(g, "all_reduce");
    assert_eq!(
        ar.op(),
        Some(&OpName::new("_c10d_functional", "all_reduce", "default"))
    );
    assert_eq!(
        ar.args()[1..],
        [Arg::Str("sum".into()), Arg::Str("12".into())]
    );
    assert_eq!(
        node(g, "_tensor_constant0").kind,
        NodeKind::Constant {
            attr: "_tensor_constant0".into()
        }
    );
    assert_eq!(node(g, "_tensor_constant0").outputs[0].ty, None);
}

#[test]
fn joint_form_inputs_and_outputs() {
    let Some(p) = sample("bug_missing_allreduce_under_wrong_config/tp1/both.g1.r0.py") else {
        return;
    };
    let g = &p.graph;
    let names: Vec<&str> = g.inputs.iter().map(|v| g.value_name(*v)).collect();
    assert_eq!(names, ["primals_1", "primals_2", "tangents_1"]);
    for v in &g.inputs {
        assert_eq!(
            g.recorded_type(*v),
            Some(&TensorType::new(DType::F32, &[1]))
        );
        assert_eq!(
            g.node(*v).line,
            Some(31),
            "inputs point at their declaration line"
        );
    }
    assert_eq!(
        g.outputs,
        vec![Some(value(g, "mul")), Some(value(g, "mul_1")), None]
    );
    assert_eq!(g.nodes.len(), 5);
    assert_eq!(node(g, "mul").loc.as_ref().unwrap().function, "scale_loss");
}

#[test]
fn joint_sample_collectives_and_auto_functionalized() {
    let Some(p) = sample("bug_missing_allreduce_under_wrong_config/tp2.bug/both.g0.r0.py") else {
        return;
    };
    let g = &p.graph;
    assert_eq!(g.inputs.len(), 46);
    // Location comments with odd indentation still apply to the nodes below them.
    let w = node(g, "wait_tensor");
    assert_eq!(
        w.op(),
        Some(&OpName::new("_c10d_functional", "wait_tensor", "default"))
    );
    assert_eq!(
        w.loc.as_ref().unwrap().code,
        "return torch.ops._c10d_functional.wait_tensor(tensor)  # type: ignore[attr-defined]"
    );
    let af = node(g, "auto_functionalized_v2");
    assert_eq!(
        af.op(),
        Some(&OpName::new("higher_order", "auto_functionalized_v2", ""))
    );
    assert_eq!(
        af.args(),
        &[Arg::Op(OpName::new("tg", "inplace_log_tensor", "default"))]
    );
    assert_eq!(af.kwarg("_t_base_index"), Some(&Arg::Int(0)));
    assert_eq!(
        af.kwarg("_all_bases"),
        Some(&Arg::List(vec![Arg::Value(value(g, "clone"))]))
    );
    // Only output 1 is taken; output 0 keeps a placeholder name that no Python name can clash
    // with.
    assert_eq!(af.outputs[0].name, "auto_functionalized_v2[0]");
    assert_eq!(af.outputs[1].name, "getitem_1");
}

#[test]
fn export_fixture_kwargs_and_outputs() {
    let p = fixture("export_linear.py");
    let g = &p.graph;
    let names: Vec<&str> = g.inputs.iter().map(|v| g.value_name(*v)).collect();
    assert_eq!(
        names,
        [
            "p_lin_weight",
            "p_lin_bias",
            "b_buf",
            "c_lifted_tensor_0",
            "x",
            "y"
        ]
    );
    let md = node(g, "_assert_tensor_metadata_default");
    assert_eq!(md.kwarg("device"), Some(&Arg::Device("cpu".into())));
    assert_eq!(md.kwarg("dtype"), Some(&Arg::Dtype(DType::F32)));
    assert_eq!(node(g, "to").args()[1], Arg::Dtype(DType::F16));
    let split = node(g, "split_with_sizes");
    assert_eq!(
        split
            .outputs
            .iter()
            .map(|o| o.name.as_str())
            .collect::<Vec<_>>(),
        ["getitem_2", "getitem_3"]
    );
    assert_eq!(g.outputs.len(), 5);
    // Strides and devices in annotations are accepted and dropped.
    let strided = fixture("export_strides.py");
    assert_eq!(
        format!("{:?}", strided.graph.nodes),
        format!("{:?}", g.nodes)
    );
}

#[test]
fn export_fixture_symbolic_shapes() {
    let g = fixture("export_dynamic.py").graph;
    assert_eq!(
        g.recorded_type(value(&g, "x")),
        Some(&TensorType {
            dtype: DType::F32,
            shape: vec![Dim::Sym("s77".into()), Dim::Known(6)]
        })
    );
    assert_eq!(
        node(&g, "slice_1").outputs[0].ty.as_ref().unwrap().shape[0],
        Dim::Sym("(s77//2)".into())
    );
    // Symbolic integers: `Sym(...)` annotations leave the type unrecorded; Python operators
    // become `operator.*` calls.
    assert_eq!(node(&g, "sym_size_int_1").outputs[0].ty, None);
    let fd = node(&g, "floordiv");
    assert_eq!(fd.op(), Some(&OpName::new("operator", "floordiv", "")));
    assert_eq!(
        fd.args(),
        &[Arg::Value(value(&g, "sym_size_int_1")), Arg::Int(2)]
    );
    assert_eq!(node(&g, "slice_1").args()[2], Arg::None);
    assert_eq!(
        node(&g, "ones").args()[0],
        Arg::List(vec![Arg::Value(value(&g, "add_1"))])
    );
}

#[test]
fn export_fixture_nested_cond_subgraphs() {
    let p = fixture("export_cond.py");
    assert_eq!(p.graph.name, "export_cond");
    let names: Vec<&str> = p.subgraphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["true_graph_0", "false_graph_0"]);
    assert_eq!(p.subgraphs[0].nodes.len(), 3);
    let g = &p.graph;
    assert_eq!(
        node(g, "true_graph_0").kind,
        NodeKind::Constant {
            attr: "true_graph_0".into()
        }
    );
    let cond = node(g, "cond");
    assert_eq!(cond.args()[3], Arg::List(vec![Arg::Value(value(g, "x"))]));
    assert_eq!(cond.outputs[0].name, "getitem");
}

#[test]
fn export_fixture_strings_and_special_floats() {
    let g = fixture("export_strings.py").graph;
    assert_eq!(
        node(&g, "inplace_log").args()[1],
        Arg::Str("it's \"quoted\"\n".into())
    );
    assert_eq!(node(&g, "mul").args()[1], Arg::Float(f64::INFINITY));
    assert!(matches!(node(&g, "new_full").args()[2], Arg::Float(f) if f.is_nan()));
    assert_eq!(node(&g, "full").args()[1], Arg::Float(-1e-05));
    assert_eq!(
        node(&g, "full").kwarg("dtype"),
        Some(&Arg::Dtype(DType::Bf16))
    );
}

#[test]
fn collectives_under_fake_process_group() {
    let g = fixture("export_collectives.py").graph;
    let ops: Vec<String> = g
        .nodes
        .iter()
        .filter_map(|n| n.op().map(|o| o.base()))
        .collect();
    for want in [
        "_c10d_functional.all_gather_into_tensor",
        "_c10d_functional.all_reduce",
        "_c10d_functional.reduce_scatter_tensor",
        "_c10d_functional.broadcast",
        "_c10d_functional.wait_tensor",
    ] {
        assert!(ops.iter().any(|o| o == want), "missing {want}");
    }
    assert_eq!(
        node(&g, "reduce_scatter_tensor").args()[1..],
        [Arg::Str("sum".into()), Arg::Int(2), Arg::Str("0".into())]
    );
}

#[test]
fn aot_joint_unlifted_and_code_forms() {
    let j = fixture("aot_joint.py").graph;
    assert_eq!(j.inputs.len(), 5);
    assert_eq!(
        node(&j, "native_layer_norm_backward").args()[7],
        Arg::List(vec![Arg::Bool(true), Arg::Bool(false), Arg::Bool(false)])
    );
    let d = fixture("aot_joint_dynamic.py").graph;
    assert_eq!(
        d.recorded_type(value(&d, "primals_1")),
        None,
        "Sym inputs have no tensor type"
    );
    assert_eq!(d.outputs.iter().filter(|o| o.is_none()).count(), 3);
    assert_eq!(
        node(&d, "mul_1").loc.as_ref().unwrap().line,
        16,
        "`# Backward of forward node: File:` sets the location"
    );

    // `ep.module()`: pytree signature with a dict, attribute constants, a call_module.
    let u = fixture("export_unlifted.py").graph;
    assert_eq!(u.inputs.len(), 1);
    assert_eq!(
        u.recorded_type(u.inputs[0]),
        Some(&TensorType::new(DType::F32, &[2, 4]))
    );
    assert_eq!(
        node(&u, "lin_weight").kind,
        NodeKind::Constant {
            attr: "lin.weight".into()
        }
    );
    assert_eq!(
        node(&u, "_guards_fn").op(),
        Some(&OpName::new("module", "_guards_fn", ""))
    );

    // `GraphModule.code`: no class, no annotations.
    let c = fixture("code_only.py").graph;
    assert_eq!(c.inputs.len(), 3);
    assert!(c.nodes.iter().all(|n| n.outputs[0].ty.is_none()));

    // `print_readable(expanded_def=True)`: one parameter per line.
    let e = fixture("export_expanded_def.py");
    assert_eq!(e.graph.inputs.len(), 3);
    assert_eq!(e.graph.node(e.graph.inputs[2]).line, Some(6));
}

#[test]
fn handwritten_fixture_covers_argument_syntax() {
    let p = fixture("handwritten.py");
    let g = &p.graph;
    let names: Vec<&str> = g.inputs.iter().map(|v| g.value_name(*v)).collect();
    assert_eq!(names, ["x", "s0", "idx", "flag"]);
    assert_eq!(
        node(g, "wait").op(),
        Some(&OpName::new("_c10d_functional", "wait_tensor", ""))
    );
    let split = node(g, "split");
    assert_eq!(
        split.outputs.len(),
        2,
        "operator.getitem and [i] both pick outputs"
    );
    let full = node(g, "full");
    assert_eq!(full.args()[1], Arg::Float(f64::NEG_INFINITY));
    assert_eq!(full.kwarg("device"), Some(&Arg::Device("cuda:1".into())));
    assert_eq!(full.kwarg("layout"), Some(&Arg::Layout("strided".into())));
    assert_eq!(
        full.loc, None,
        "`# No stacktrace found` clears the location"
    );
    assert_eq!(
        node(g, "clamp").args()[1..],
        [Arg::Float(-1.5e20), Arg::Float(1e-05)]
    );
    assert_eq!(
        node(g, "index").args()[1],
        Arg::List(vec![Arg::Value(value(g, "idx")), Arg::None])
    );
    assert_eq!(
        node(g, "empty").kwarg("memory_format"),
        Some(&Arg::MemoryFormat("preserve_format".into()))
    );
    assert_eq!(
        node(g, "const").kind,
        NodeKind::Constant {
            attr: "_tensor_constant0".into()
        }
    );
    let tag = node(g, "tag");
    assert_eq!(
        tag.args()[1..],
        [
            Arg::Str("dq\"uote \\ back".into()),
            Arg::Str("sq'uote\t".into()),
            Arg::List(vec![Arg::Int(1), Arg::List(vec![Arg::Int(2), Arg::Int(3)])]),
            Arg::List(vec![]),
            Arg::List(vec![]),
        ]
    );
    assert_eq!(node(g, "big").args()[1], Arg::Int(i64::MIN));
    let nested = node(g, "nested");
    let (x, gi, gi1) = (value(g, "x"), value(g, "getitem"), value(g, "getitem_1"));
    assert_eq!(
        nested.args()[0],
        Arg::List(vec![
            Arg::List(vec![Arg::Value(x), Arg::Value(gi)]),
            Arg::List(vec![Arg::Value(gi1)])
        ])
    );
    assert_eq!(nested.args()[4], Arg::Dtype(DType::Bf16));
    assert_eq!(
        node(g, "size").op(),
        Some(&OpName::new("builtins", "getattr", ""))
    );
    assert_eq!(
        node(g, "view").op(),
        Some(&OpName::new("method", "view", ""))
    );
    assert_eq!(node(g, "view").args()[0], Arg::Value(x));
    assert_eq!(
        node(g, "neg").op(),
        Some(&OpName::new("operator", "neg", ""))
    );
    let cat_loc = node(g, "cat").loc.clone().unwrap();
    assert_eq!(
        (
            cat_loc.file.as_str(),
            cat_loc.line,
            cat_loc.function.as_str()
        ),
        ("C:\\work\\model.py", 12, "block")
    );
    assert_eq!(node(g, "sin").loc.as_ref().unwrap().file, "/src/model.py");
    assert_eq!(
        g.outputs,
        vec![Some(value(g, "clamp")), Some(value(g, "nested")), None]
    );
    // The multi-line signature and return count as parsed code lines.
    assert_eq!(p.stats.lines_total, 42);
    assert_eq!(p.stats.lines_ignored, 11);
}

#[test]
fn load_graph_dispatches_on_extension() {
    let path = common::fixtures_dir().join("export_collectives.py");
    let g = load_graph(&path).unwrap();
    assert_eq!(g.path.as_deref(), Some(path.as_path()));
    let dir = std::env::temp_dir().join(format!("shardproof-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("g.json");
    let mut unnamed = g.clone();
    unnamed.path = None;
    std::fs::write(&json, shardproof_import::to_json(&unnamed)).unwrap();
    let back = load_graph(&json).unwrap();
    assert_eq!(
        back.path.as_deref(),
        Some(json.as_path()),
        "a JSON graph without path gets the file's"
    );
    assert_eq!(back.nodes, g.nodes);
    let e = load_graph(&dir.join("missing.py")).unwrap_err();
    assert_eq!(e.span, None);
    assert!(e.hint.is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lenient_mode_lists_what_it_does_not_understand() {
    let text = "class G(torch.nn.Module):\n    def forward(self, x: \"f32[2]\"):\n        a: \"f32[2]\" = torch.ops.aten.neg.default(x)\n        b = $$$\n        c = torch.ops.aten.neg.default(b)\n        d = torch.ops.aten.abs.default(a)\n        return (d,)\n";
    assert!(parse_fx(text, Path::new("g.py")).is_err());
    let p = parse_fx_lenient(text, Path::new("g.py")).unwrap();
    assert_eq!(
        p.stats.unparsed,
        vec![
            (4, "        b = $$$".to_string()),
            (5, "        c = torch.ops.aten.neg.default(b)".to_string())
        ]
    );
    assert_eq!(p.stats.lines_parsed, 5);
    assert_eq!(
        p.stats.lines_parsed + p.stats.lines_ignored + p.stats.unparsed.len(),
        p.stats.lines_total
    );
    assert_eq!(p.graph.nodes.len(), 3);
}

#[test]
fn parsing_the_largest_sample_is_fast() {
    let Some(dir) = common::samples_dir() else {
        return;
    };
    let Some((path, text)) = common::py_files(&dir)
        .into_iter()
        .map(|f| {
            let t = std::fs::read_to_string(&f).unwrap();
            (f, t)
        })
        .max_by_key(|(_, t)| t.len())
    else {
        return;
    };
    let mut best = std::time::Duration::MAX;
    for _ in 0..10 {
        let t = std::time::Instant::now();
        std::hint::black_box(parse_fx(&text, &path).unwrap());
        best = best.min(t.elapsed());
    }
    println!(
        "parsed {} ({} lines) in {best:?}",
        path.display(),
        text.lines().count()
    );
    // Generous: test builds are barely optimized and CI machines are small; release builds take
    // a few milliseconds.
    assert!(best < std::time::Duration::from_millis(200), "{best:?}");
}
