//! The prover on whole cases: zoo plans proved, catalog bugs refuted with a counterexample the
//! interpreter confirms, an operator without a symbolic rule inconclusive, and small
//! hand-written layouts (row-parallel partial sums, a wrong placement).

use shardproof_prove::{prove_case, ProveConfig, Verdict};
use shardproof_zoo::{
    find_bug, DeepseekConfig, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig,
    PipelineOptions, TrainOptions,
};
use std::path::Path;
use zoo_emit::emit_sized;

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

fn emit(dir: &Path, mesh: &str, bug: Option<&str>, forward_only: bool) -> shardproof_case::Case {
    emit_model("mlp", dir, mesh, bug, forward_only)
}

fn emit_model(
    model: &str,
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    forward_only: bool,
) -> shardproof_case::Case {
    emit_sized(model, dir, mesh, bug, forward_only, (8, 16, 4))
}

#[test]
fn correct_mlp_plans_are_proved() {
    for (mesh, fw) in [("tp=2", true), ("tp=2", false), ("dp=2,tp=2", false)] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit(dir.path(), mesh, None, fw);
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh} {fw}: {:?}",
            proof.message
        );
        assert!(proof.outputs.iter().all(|o| o.status == "proved"));
        assert!(proof.layers.get("normal-form").copied().unwrap_or(0) > 0);
        assert!(proof.counterexample.is_none());
    }
}

#[test]
fn a_missing_all_reduce_is_refuted_with_a_confirmed_counterexample() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), "tp=2", Some("tp-missing-allreduce"), true);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    let cx = proof.counterexample.expect("a counterexample");
    assert_eq!(cx.output, "loss");
    assert!((cx.spec_value - cx.rebuilt_value).abs() > 1e-6);
    // The counterexample's inputs replayed through the interpreter give the same values.
    let cfg = shardproof_interp::RunConfig::default();
    let spec = shardproof_interp::run_graph(&case.spec, &cx.spec_inputs, &cfg).unwrap();
    let v = case.spec.find("loss").unwrap();
    assert_eq!(spec.get(v).unwrap().data[0], cx.spec_value);
    let out = tempfile::tempdir().unwrap();
    cx.write(out.path(), &proof.case).unwrap();
    for f in [
        "inputs.safetensors",
        "spec_output.safetensors",
        "rebuilt_output.safetensors",
        "counterexample.json",
    ] {
        assert!(out.path().join(f).is_file(), "{f}");
    }
    let bytes = std::fs::read(out.path().join("spec_output.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("loss").unwrap();
    assert_eq!(
        f64::from_le_bytes(t.data()[..8].try_into().unwrap()),
        cx.spec_value
    );
}

#[test]
fn a_llama_forward_under_dp_and_tp_is_proved_and_a_wrong_group_refuted() {
    // Token ids and targets are index symbols: the embedding is a lookup, the loss's mean
    // divides by the exact count of targets.
    let dir = tempfile::tempdir().unwrap();
    let case = emit_model("llama", dir.path(), "dp=2,tp=2", None, true);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let dir = tempfile::tempdir().unwrap();
    let case = emit_model("llama", dir.path(), "dp=2,tp=2", Some("wrong-group"), true);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

fn write_case(dir: &Path, spec: &str, rank: &str, case: &str) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    std::fs::write(dir.join("r1.py"), rank).unwrap();
    std::fs::write(dir.join("case.yaml"), case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

const SPEC_MM: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        return (mm,)
"#;

const RANK_MM: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]", w: "f32[4, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        return (mm,)
"#;

#[test]
fn row_parallel_partial_sums_are_proved_and_a_wrong_placement_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let case = |outputs: &str| {
        format!(
            "version: 1\nname: rowpar\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(1)\n  w: Shard(0)\noutputs:\n  mm: {outputs}\n"
        )
    };
    let c = write_case(dir.path(), SPEC_MM, RANK_MM, &case("Partial()"));
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    // Shape-reduced from 4 x 6 to 2 x 2 (the contraction split over tp keeps 2 a rank).
    assert_eq!(proof.outputs[0].elements, 4);
    let x = &proof.reduction.as_ref().unwrap().inputs[0];
    assert_eq!(
        (x.original.clone(), x.reduced.clone()),
        (vec![4, 8], vec![2, 4])
    );
    // Claiming each rank holds the whole product is wrong, and shown.
    let c = write_case(dir.path(), SPEC_MM, RANK_MM, &case("Replicate()"));
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

#[test]
fn a_case_that_does_not_type_check_is_never_proved() {
    // Spec and ranks alike, with a view whose annotation ([4, 7]) is not what it computes
    // ([4, 6]): the library's caller skipped the CLI's preflight, and the prover must not.
    let ill_typed = |g: &str| {
        g.replace(
            "        return (mm,)",
            "        v: \"f32[4, 7]\" = torch.ops.aten.view.default(mm, [4, 6])\n        return (v,)",
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let case = "version: 1\nname: illtyped\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(1)\n  w: Shard(0)\noutputs:\n  v: Partial()\n";
    let c = write_case(dir.path(), &ill_typed(SPEC_MM), &ill_typed(RANK_MM), case);
    for reduce in [true, false] {
        let cfg = ProveConfig {
            reduce,
            ..ProveConfig::default()
        };
        let proof = prove_case(&c, &cfg);
        assert_eq!(proof.verdict, Verdict::Inconclusive, "{:?}", proof.message);
        let message = proof.message.unwrap_or_default();
        assert!(message.contains("do not type-check"), "{message}");
    }
}

#[test]
fn an_operator_without_a_symbolic_rule_is_inconclusive_and_named() {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]"):
        cumsum: "f32[4, 8]" = torch.ops.aten.cumsum.default(x, 1);  x = None
        return (cumsum,)
"#;
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(
        dir.path(),
        spec,
        spec,
        "version: 1\nname: scan\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\noutputs:\n  cumsum: Replicate()\n",
    );
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Inconclusive);
    assert_eq!(proof.unsupported_op.as_deref(), Some("aten.cumsum.default"));
    assert!(proof.message.unwrap().contains("cumsum"));
}

#[test]
fn programs_over_the_element_limit_are_refused_before_executing() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), "tp=2", None, true);
    let cfg = ProveConfig {
        max_elements: 100,
        ..ProveConfig::default()
    };
    let proof = prove_case(&case, &cfg);
    assert_eq!(proof.verdict, Verdict::Inconclusive);
    let m = proof.message.unwrap();
    assert!(m.contains("limit of 100"), "{m}");
}

#[test]
fn shape_reduction_keeps_the_verdict_of_every_mlp_plan() {
    // Sizes with a factor 3, which no literal of the mlp (the power 2) can stand for: every
    // size reduces.
    for (mesh, bug) in [
        ("tp=2", None),
        ("tp=2", Some("tp-missing-allreduce")),
        ("tp=2", Some("tp-bias-before-allreduce")),
        ("dp=2", Some("dp-loss-not-averaged")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_sized("mlp", dir.path(), mesh, bug, true, (24, 48, 6));
        let reduced = prove_case(&case, &ProveConfig::default());
        let full = prove_case(
            &case,
            &ProveConfig {
                reduce: false,
                ..ProveConfig::default()
            },
        );
        assert_eq!(
            reduced.verdict, full.verdict,
            "{mesh} {bug:?}: {:?}",
            reduced.message
        );
        let want = if bug.is_some() {
            Verdict::Refuted
        } else {
            Verdict::Proved
        };
        assert_eq!(
            reduced.verdict, want,
            "{mesh} {bug:?}: {:?}",
            reduced.message
        );
        assert_eq!(reduced.counterexample.is_some(), bug.is_some());
        let r = reduced.reduction.expect("reduced");
        assert!(full.reduction.is_none());
        assert!(
            r.elements_after * 20 < r.elements_before,
            "{} of {}",
            r.elements_after,
            r.elements_before
        );
        // The batch split over dp keeps 2 samples a rank.
        let x = r.inputs.iter().find(|i| i.name == "x").unwrap();
        let batch = if mesh == "dp=2" { 6 } else { 3 };
        assert_eq!(
            (x.original.clone(), x.reduced.clone()),
            (vec![6, 24], vec![batch, 3])
        );
    }
}

#[test]
fn an_operator_outside_the_reduction_list_is_refused_and_proved_at_full_size() {
    // A strided slice keeps every other element: not a dependency mapping that scales.
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]"):
        slice_1: "f32[4, 4]" = torch.ops.aten.slice.Tensor(x, 1, 0, 8, 2);  x = None
        return (slice_1,)
"#;
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(
        dir.path(),
        spec,
        spec,
        "version: 1\nname: strided\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\noutputs:\n  slice_1: Replicate()\n",
    );
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Inconclusive);
    assert_eq!(proof.unsupported_op.as_deref(), Some("aten.slice.Tensor"));
    let m = proof.message.unwrap();
    assert!(
        m.contains("shape reduction refused") && m.contains("spec.py:3"),
        "{m}"
    );
    let full = prove_case(
        &c,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(full.verdict, Verdict::Proved, "{:?}", full.message);
}

#[test]
fn the_layer_norm_backward_rule_agrees_with_the_kernel() {
    use shardproof_prove::eval::FloatEval;
    use shardproof_prove::exec::{run_graph, ExecLimits};
    use shardproof_prove::expr::{Arena, SymbolKind};
    use shardproof_prove::tensor::SymTensor;
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, g: "f32[3, 4]", x: "f32[3, 4]", w: "f32[4]", b: "f32[4]"):
        native_layer_norm = torch.ops.aten.native_layer_norm.default(x, [4], w, b, 1e-5)
        getitem: "f32[3, 4]" = native_layer_norm[0]
        getitem_1: "f32[3, 1]" = native_layer_norm[1]
        getitem_2: "f32[3, 1]" = native_layer_norm[2]
        native_layer_norm_backward = torch.ops.aten.native_layer_norm_backward.default(g, x, [4], getitem_1, getitem_2, w, b, [True, True, True])
        getitem_3: "f32[3, 4]" = native_layer_norm_backward[0]
        getitem_4: "f32[4]" = native_layer_norm_backward[1]
        getitem_5: "f32[4]" = native_layer_norm_backward[2]
        return (getitem_3, getitem_4, getitem_5)
"#;
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(
        dir.path(),
        spec,
        spec,
        "version: 1\nname: lnb\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  g: Replicate()\n  x: Replicate()\n  w: Replicate()\n  b: Replicate()\n",
    );
    let mut arena = Arena::default();
    let mut leaves = std::collections::BTreeMap::new();
    let mut concrete = std::collections::BTreeMap::new();
    let mut values = Vec::new();
    for (name, shape) in [
        ("g", vec![3, 4]),
        ("x", vec![3, 4]),
        ("w", vec![4]),
        ("b", vec![4]),
    ] {
        let n: usize = shape.iter().product();
        let mut elems = Vec::new();
        let mut data = Vec::new();
        for i in 0..n {
            elems.push(
                arena
                    .symbol(&format!("{name}{i}"), SymbolKind::Real)
                    .unwrap(),
            );
            // Distinct, irregular values.
            let v = ((values.len() * 7919 + 13) % 101) as f64 / 17.0 - 2.5;
            values.push(v);
            data.push(v);
        }
        let meta = shardproof_ops::Meta::new(shardproof_ir::DType::F32, shape.clone());
        leaves.insert(
            name.to_string(),
            SymTensor::new(shardproof_ir::DType::F32, shape.clone(), elems),
        );
        concrete.insert(name.to_string(), shardproof_ops::Tensor::new(meta, data));
    }
    let env = run_graph(&mut arena, &c.spec, &leaves, &c.ops, &ExecLimits::default()).unwrap();
    let run =
        shardproof_interp::run_graph(&c.spec, &concrete, &shardproof_interp::RunConfig::default())
            .unwrap();
    let mut eval = FloatEval::new(&arena, values);
    for name in ["getitem_3", "getitem_4", "getitem_5"] {
        let v = c.spec.find(name).unwrap();
        let sym = env[v.node][v.output].as_ref().unwrap();
        let want = &run.get(v).unwrap().data;
        for (k, &e) in sym.elems.iter().enumerate() {
            let got = eval.eval(e);
            assert!(
                (got - want[k]).abs() <= 1e-9 * (1.0 + want[k].abs()),
                "{name}[{k}]: {got} vs {}",
                want[k]
            );
        }
    }
}

#[test]
fn max_min_with_indices_argmax_topk_scatter_and_gather_agree_with_the_kernels_ties_included() {
    use shardproof_prove::eval::FloatEval;
    use shardproof_prove::exec::{run_graph, ExecLimits};
    use shardproof_prove::expr::{Arena, SymbolKind};
    use shardproof_prove::tensor::SymTensor;
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[3, 4]"):
        max_1 = torch.ops.aten.max.dim(x, 1)
        getitem: "f32[3]" = max_1[0]
        getitem_1: "i64[3]" = max_1[1]
        min_1 = torch.ops.aten.min.dim(x, 0, True)
        getitem_2: "f32[1, 4]" = min_1[0]
        getitem_3: "i64[1, 4]" = min_1[1]
        argmax: "i64[]" = torch.ops.aten.argmax.default(x)
        argmin: "i64[3, 1]" = torch.ops.aten.argmin.default(x, -1, True)
        topk = torch.ops.aten.topk.default(x, 3)
        getitem_4: "f32[3, 3]" = topk[0]
        getitem_5: "i64[3, 3]" = topk[1]
        topk_1 = torch.ops.aten.topk.default(x, 2, 0, False)
        getitem_6: "f32[2, 4]" = topk_1[0]
        getitem_7: "i64[2, 4]" = topk_1[1]
        neg: "f32[3, 4]" = torch.ops.aten.neg.default(x)
        scatter: "f32[3, 4]" = torch.ops.aten.scatter.src(neg, 1, getitem_5, getitem_4)
        scatter_1: "f32[3, 4]" = torch.ops.aten.scatter.value(x, 0, getitem_7, 9.0)
        gather: "f32[3, 3]" = torch.ops.aten.gather.default(neg, 1, getitem_5)
        return (getitem, getitem_1, getitem_2, getitem_3, argmax, argmin, getitem_4, getitem_5, getitem_6, getitem_7, scatter, scatter_1, gather)
"#;
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(
        dir.path(),
        spec,
        spec,
        "version: 1\nname: ext\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n",
    );
    // Row 0 ties at its maximum, column 1 ties at its minimum, the global maximum ties.
    let data = [
        3.0, 1.0, 3.0, -2.0, //
        0.5, -4.0, 7.0, 7.0, //
        -1.0, -4.0, 2.0, 6.0,
    ];
    let mut arena = Arena::default();
    let elems = (0..12)
        .map(|i| arena.symbol(&format!("x{i}"), SymbolKind::Real).unwrap())
        .collect();
    let mut leaves = std::collections::BTreeMap::new();
    leaves.insert(
        "x".to_string(),
        SymTensor::new(shardproof_ir::DType::F32, vec![3, 4], elems),
    );
    let mut concrete = std::collections::BTreeMap::new();
    concrete.insert(
        "x".to_string(),
        shardproof_ops::Tensor::new(
            shardproof_ops::Meta::new(shardproof_ir::DType::F32, vec![3, 4]),
            data.to_vec(),
        ),
    );
    let env = run_graph(&mut arena, &c.spec, &leaves, &c.ops, &ExecLimits::default()).unwrap();
    let run =
        shardproof_interp::run_graph(&c.spec, &concrete, &shardproof_interp::RunConfig::default())
            .unwrap();
    let mut eval = FloatEval::new(&arena, data.to_vec());
    for name in [
        "getitem",
        "getitem_1",
        "getitem_2",
        "getitem_3",
        "argmax",
        "argmin",
    ] {
        let v = c.spec.find(name).unwrap();
        let sym = env[v.node][v.output].as_ref().unwrap();
        let want = run.get(v).unwrap();
        assert_eq!(sym.shape, want.shape(), "{name}");
        let got: Vec<f64> = sym.elems.iter().map(|&e| eval.eval(e)).collect();
        assert_eq!(got, *want.data, "{name}");
    }
}

#[test]
fn sharded_argmax_rows_are_proved_and_an_argmin_in_their_place_refuted() {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 3]"):
        argmax: "i64[4]" = torch.ops.aten.argmax.default(x, 1)
        return (argmax,)
"#;
    let rank = |op: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 3]\"):\n        argmax: \"i64[2]\" = torch.ops.aten.{op}.default(x, 1)\n        return (argmax,)\n"
        )
    };
    let case = "version: 1\nname: argmax\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\noutputs:\n  argmax: Shard(0)\n";
    // Argmax is outside the shape reduction's operator list: proved at full size.
    let full = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let ok = write_case(dir.path(), spec, &rank("argmax"), case);
    let proof = prove_case(&ok, &full);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    // Scaling by 2 keeps every argmax but changes the normal form: Z3 decides it.
    let scaled = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 3]\"):\n        mul: \"f32[2, 3]\" = torch.ops.aten.mul.Tensor(x, 2.0)\n        argmax: \"i64[2]\" = torch.ops.aten.argmax.default(mul, 1)\n        return (argmax,)\n";
    let proof = prove_case(&write_case(dir.path(), spec, scaled, case), &full);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(
        proof.layers.get("z3").is_some_and(|&n| n > 0),
        "{:?}",
        proof.layers
    );
    let bad = write_case(dir.path(), spec, &rank("argmin"), case);
    let proof = prove_case(&bad, &full);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

#[test]
fn sharded_topk_rows_are_proved_and_a_smallest_k_in_their_place_refuted() {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 3]"):
        topk = torch.ops.aten.topk.default(x, 2)
        getitem: "f32[4, 2]" = topk[0]
        getitem_1: "i64[4, 2]" = topk[1]
        return (getitem, getitem_1)
"#;
    let rank = |body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 3]\"):\n{body}        return (getitem, getitem_1)\n"
        )
    };
    let plain = "        topk = torch.ops.aten.topk.default(x, 2)\n        getitem: \"f32[2, 2]\" = topk[0]\n        getitem_1: \"i64[2, 2]\" = topk[1]\n";
    // Sorting 2x and halving the values changes the normal forms, not the result: Z3.
    let scaled = "        mul: \"f32[2, 3]\" = torch.ops.aten.mul.Tensor(x, 2.0)\n        topk = torch.ops.aten.topk.default(mul, 2)\n        getitem_2: \"f32[2, 2]\" = topk[0]\n        getitem_1: \"i64[2, 2]\" = topk[1]\n        getitem: \"f32[2, 2]\" = torch.ops.aten.mul.Tensor(getitem_2, 0.5)\n";
    let smallest = "        topk = torch.ops.aten.topk.default(x, 2, -1, False)\n        getitem: \"f32[2, 2]\" = topk[0]\n        getitem_1: \"i64[2, 2]\" = topk[1]\n";
    let case = "version: 1\nname: topk\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\noutputs:\n  getitem: Shard(0)\n  getitem_1: Shard(0)\n";
    let full = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let proof = prove_case(&write_case(dir.path(), spec, &rank(plain), case), &full);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let proof = prove_case(&write_case(dir.path(), spec, &rank(scaled), case), &full);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(
        proof.layers.get("z3").is_some_and(|&n| n > 0),
        "{:?}",
        proof.layers
    );
    let proof = prove_case(&write_case(dir.path(), spec, &rank(smallest), case), &full);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

#[test]
fn a_deepseek_moe_forward_is_proved_at_full_size_and_a_sharded_norm_refuted() {
    // The router's topk, scatter and the experts' dispatch all have symbolic rules.
    let full = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let ok = emit_model("deepseek", &dir.path().join("ok"), "tp=2", None, true);
    let proof = prove_case(&ok, &full);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let bad = emit_model(
        "deepseek",
        &dir.path().join("bad"),
        "tp=2",
        Some("norm-sharded-hidden"),
        true,
    );
    let proof = prove_case(&bad, &full);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

/// DeepSeek at small sizes: one layer, two heads (one kv head), 4 experts of width 2 (top 2),
/// a batch of 2, and the given (width, tokens per sequence, vocabulary).
fn emit_small_deepseek(
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    (hidden, seq, vocab): (usize, usize, usize),
) -> shardproof_case::Case {
    let extras = EmitExtras {
        deepseek: DeepseekConfig {
            base: LlamaConfig {
                hidden,
                heads: 2,
                kv_heads: 1,
                ffn: 4,
                layers: 1,
                seq,
                batch: 2,
                vocab,
                ..LlamaConfig::default()
            },
            moe_ffn: 2,
            ..DeepseekConfig::default()
        },
        ..EmitExtras::default()
    };
    let opts = EmitOptions {
        model: "deepseek".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig::default(),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only: false,
        vocab_parallel: false,
    };
    zoo_emit::emit_loaded(dir, &opts, &extras, &PipelineOptions::default())
}

#[test]
fn deepseek_full_iterations_under_dp_and_ep_are_proved_and_unaveraged_expert_grads_refuted() {
    // Needs the gathered routing weights' tables scaled before or after the gather to share
    // one `lookup` atom, multiples of `0·x` (the masked scores' gradients) to share one normal
    // form, and RoPE's cos(0) and sin(0) to fold; without them 14 of 17 outputs differ in
    // normal form under dp=2 at width 4. At width 8 over 4 tokens, a product kept unexpanded
    // with a `0·x` factor must count as `0·x` too (4 outputs differ without).
    let full = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    for (mesh, sizes) in [
        ("dp=2", (4, 2, 4)),
        ("dp=2", (8, 4, 8)),
        ("ep=2", (4, 2, 4)),
    ] {
        let ok = emit_small_deepseek(
            &dir.path().join(format!("{mesh}-{}", sizes.0)),
            mesh,
            None,
            sizes,
        );
        let proof = prove_case(&ok, &full);
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh}: {:?}",
            proof.message
        );
    }
    let bad = emit_small_deepseek(
        &dir.path().join("bad"),
        "ep=2",
        Some("ep-expert-grad-not-averaged"),
        (4, 2, 4),
    );
    let proof = prove_case(&bad, &full);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

#[test]
fn a_deepseek_moe_output_split_over_tp_is_proved_by_expanding_its_products() {
    // Under tp=2 each rank holds half of every expert's inner width, so the spec's
    // `product(w, E0 + E1)` (routing weight times the expert's output, past the expansion
    // limit) meets the ranks' all-reduced `product(w, E0) + product(w, E1)`: the normal forms
    // differ, and only the product expansion of the goal's difference proves the MoE block's
    // all-reduced output (its cut stage is unknown without it). The same cut stated as a
    // partial sum (each rank holding a share) is false, and stays refuted.
    let dir = tempfile::tempdir().unwrap();
    let extras = EmitExtras {
        deepseek: DeepseekConfig {
            base: zoo_emit::width4_llama(1, 2, 4),
            moe_ffn: 2,
            ..DeepseekConfig::default()
        },
        ..EmitExtras::default()
    };
    let opts = EmitOptions {
        model: "deepseek".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig::default(),
        mesh: Mesh::parse("tp=2").unwrap(),
        bug: None,
        forward_only: false,
        vocab_parallel: false,
    };
    let full = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    for (k, partial) in [false, true].into_iter().enumerate() {
        let d = dir.path().join(k.to_string());
        shardproof_zoo::emit_to_dir(
            &opts,
            &extras,
            &TrainOptions::default(),
            &PipelineOptions::default(),
            &d,
        )
        .unwrap();
        assert!(layer_cuts::cut_at_modules(&d, true) >= 3);
        let spec = layer_cuts::module_outputs(&d.join("spec.py"), false);
        let moe = spec["layers.0.moe forward"].clone();
        if partial {
            let path = d.join("case.yaml");
            let text = std::fs::read_to_string(&path).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("  {moe}: ")))
                .unwrap();
            let text = text.replace(line, &line.replace("Replicate()", "Partial()"));
            std::fs::write(&path, text).unwrap();
        }
        let case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
        let plan = shardproof_prove::stage::plan(&case, false).unwrap();
        let stage = plan
            .stages
            .iter()
            .position(|s| s.target == format!("cut `{moe}`"))
            .unwrap();
        let (_, outcome, proof) = shardproof_prove::stage::prove_stages(&plan, &[stage], &full, 1)
            .pop()
            .unwrap();
        if partial {
            assert_eq!(outcome.verdict, Verdict::Refuted, "{:?}", outcome.message);
            assert!(proof.counterexample.is_some());
        } else {
            assert_eq!(outcome.verdict, Verdict::Proved, "{:?}", outcome.message);
            assert!(outcome.layers.contains_key("product-expansion"));
        }
    }
}

/// An mlp of two layers on `pp=2` with two microbatches, optionally with a catalog bug.
fn emit_pipelined_mlp(dir: &Path, bug: Option<&str>, forward_only: bool) -> shardproof_case::Case {
    let opts = EmitOptions {
        model: "mlp".into(),
        mlp: MlpConfig {
            hidden: 8,
            ffn: 16,
            batch: 4,
            layers: 2,
            ..MlpConfig::default()
        },
        llama: LlamaConfig::default(),
        mesh: Mesh::parse("pp=2").unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only,
        vocab_parallel: false,
    };
    let pipeline = PipelineOptions {
        microbatches: 2,
        ..PipelineOptions::default()
    };
    zoo_emit::emit_loaded(dir, &opts, &EmitExtras::default(), &pipeline)
}

#[test]
fn pipelined_mlp_plans_are_proved_at_full_size_and_shuffled_microbatches_refuted() {
    let full_size = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    for forward_only in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_pipelined_mlp(dir.path(), None, forward_only);
        // At full size: shape reduction refuses the stages' send/recv.
        let proof = prove_case(&case, &full_size);
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "forward only {forward_only}: {:?}",
            proof.message
        );
    }
    for bug in ["pp-shuffled-microbatches", "pp-wrong-stage-division"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_pipelined_mlp(dir.path(), Some(bug), true);
        let proof = prove_case(&case, &full_size);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{bug}");
    }
}

#[test]
fn constant_padding_moves_elements_and_fills_with_its_value() {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 3]"):
        constant_pad_nd: "f32[4, 6]" = torch.ops.aten.constant_pad_nd.default(x, [1, 2], 0.5);  x = None
        return (constant_pad_nd,)
"#;
    let rank = |pad: &str, value: &str| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 3]"):
        constant_pad_nd: "f32[2, 6]" = torch.ops.aten.constant_pad_nd.default(x, [{pad}], {value});  x = None
        return (constant_pad_nd,)
"#
        )
    };
    let case = "version: 1\nname: pad\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\noutputs:\n  constant_pad_nd: Shard(0)\n";
    let full_size = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(dir.path(), spec, &rank("1, 2", "0.5"), case);
    let proof = prove_case(&c, &full_size);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    // Another fill value, or the padding on the other sides, is refuted and confirmed.
    for (pad, value) in [("1, 2", "0.0"), ("2, 1", "0.5")] {
        let c = write_case(dir.path(), spec, &rank(pad, value), case);
        let proof = prove_case(&c, &full_size);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{pad} {value}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{pad} {value}");
    }
}

#[test]
fn a_norm_epsilon_pins_no_size_and_a_wrong_epsilon_is_still_refuted() {
    // 1e-5 is 1 / (2^5 5^5): as an ordinary literal it would pin the hidden size 16.
    let graph = |rows: usize, eps: &str| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{rows}, 16]", w: "f32[16]", b: "f32[16]"):
        native_layer_norm = torch.ops.aten.native_layer_norm.default(x, [16], w, b, {eps});  x = w = b = None
        getitem: "f32[{rows}, 16]" = native_layer_norm[0]
        getitem_1: "f32[{rows}, 1]" = native_layer_norm[1]
        getitem_2: "f32[{rows}, 1]" = native_layer_norm[2];  native_layer_norm = None
        return (getitem, getitem_1, getitem_2)
"#
        )
    };
    let case = "version: 1\nname: ln\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  w: Replicate()\n  b: Replicate()\noutputs:\n  getitem: Shard(0)\n";
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(dir.path(), &graph(4, "1e-5"), &graph(2, "1e-5"), case);
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let x = &proof.reduction.as_ref().unwrap().inputs[0];
    assert_eq!(x.original, vec![4, 16]);
    assert!(x.reduced[1] < 16, "{:?}", x.reduced);
    // A rank with another epsilon is refuted on the reduced sizes, and the refutation is
    // rechecked where the epsilon would have pinned a size.
    let c = write_case(dir.path(), &graph(4, "1e-5"), &graph(2, "1e-6"), case);
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

/// A mean cross-entropy over `[batch, seq]` labels read through a permute, as gpt2's loss
/// reads them (logits `[seq, batch, classes]`), the batch split over `dp` ranks (the ranks'
/// partial means summed and divided by `dp`); `dp = 1` is the spec.
fn permuted_label_loss(batch: usize, seq: usize, classes: usize, dp: usize) -> String {
    let (b, n) = (batch / dp, batch / dp * seq);
    let tail = if dp > 1 {
        format!(
            "        all_reduce: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(nll, 'sum', 'dp')\n        \
             wait_tensor: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)\n        \
             loss: \"f32[]\" = torch.ops.aten.div.Scalar(wait_tensor, {dp})\n"
        )
    } else {
        "        loss: \"f32[]\" = torch.ops.aten.clone.default(nll)\n".to_string()
    };
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{seq}, {b}, {classes}]", labels: "i64[{b}, {seq}]"):
        logits: "f32[{n}, {classes}]" = torch.ops.aten.view.default(x, [{n}, {classes}])
        permute: "i64[{seq}, {b}]" = torch.ops.aten.permute.default(labels, [1, 0])
        clone: "i64[{seq}, {b}]" = torch.ops.aten.clone.default(permute, memory_format = torch.contiguous_format)
        view: "i64[{n}]" = torch.ops.aten.view.default(clone, [{n}])
        _log_softmax: "f32[{n}, {classes}]" = torch.ops.aten._log_softmax.default(logits, 1, False)
        nll_loss_forward = torch.ops.aten.nll_loss_forward.default(_log_softmax, view, None, 1, -100)
        nll: "f32[]" = nll_loss_forward[0]
        total_weight: "f32[]" = nll_loss_forward[1]
{tail}        return (loss,)
"#
    )
}

#[test]
fn a_dp_mean_loss_over_permuted_labels_is_proved_on_reduced_sizes() {
    // Labels reach nll_loss through a permute: their range is the classes. Taken as run's
    // default range [0, 8), they could name no class of the reduced 3, each sample's weight
    // stayed a sum of equality atoms and the ranks' means did not normalize to the global
    // one (gpt2 dp=2 forward was inconclusive on reduced sizes). Averaging the ranks' means
    // is the global mean only when no target equals ignore_index: the case assumes so (without
    // it the program is refuted, `tests/review_ignore_index.rs`).
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(
        dir.path(),
        &permuted_label_loss(2, 4, 16, 1),
        &permuted_label_loss(2, 4, 16, 2),
        "version: 1\nname: dploss\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"dp\": dp\ninputs:\n  x: { dp: Shard(1) }\n  labels: { dp: Shard(0) }\noutputs:\n  loss: Replicate()\nassume:\n  ignore-index: unused\n",
    );
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let x = &proof.reduction.as_ref().unwrap().inputs[0];
    assert!(x.reduced[2] < 8, "{:?}", x.reduced);
}

#[test]
fn an_integer_input_that_indexes_nothing_ranges_over_every_integer() {
    // `t` is only compared: nothing bounds it. Ranged over run's default [0, 8), both tests
    // fold to false and a rank comparing with 10 where the spec compares with 9 was proved;
    // over every integer Z3 finds t = 9 or 10 and the interpreter confirms it.
    let graph = |k: u32| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, t: "i64[4]", x: "f32[4]", y: "f32[4]"):
        eq: "b8[4]" = torch.ops.aten.eq.Scalar(t, {k})
        where: "f32[4]" = torch.ops.aten.where.self(eq, x, y)
        return (where,)
"#
        )
    };
    let case = "version: 1\nname: cmp\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  t: Replicate()\n  x: Replicate()\n  y: Replicate()\noutputs:\n  where: Replicate()\n";
    let dir = tempfile::tempdir().unwrap();
    let c = write_case(dir.path(), &graph(9), &graph(9), case);
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let c = write_case(dir.path(), &graph(9), &graph(10), case);
    let proof = prove_case(&c, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
}

#[test]
fn a_replicated_output_wrong_on_one_copy_only_is_refuted_and_confirmed_on_that_copy() {
    // Rank 0's copy is wrong, rank 1's (the last holder) is right: the counterexample must be
    // read on rank 0's copy, by the run first and by the symbolic path alike.
    let dir = tempfile::tempdir().unwrap();
    let graph = |factor: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\"):\n        mul: \"f32[4, 6]\" = torch.ops.aten.mul.Tensor(x, {factor});  x = None\n        return (mul,)\n"
        )
    };
    std::fs::write(dir.path().join("spec.py"), graph("2.0")).unwrap();
    std::fs::write(dir.path().join("r0.py"), graph("3.0")).unwrap();
    std::fs::write(dir.path().join("r1.py"), graph("2.0")).unwrap();
    std::fs::write(
        dir.path().join("case.yaml"),
        "version: 1\nname: one-copy\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\noutputs:\n  mul: Replicate()\n",
    )
    .unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    for run_first in [true, false] {
        let cfg = ProveConfig {
            run_first,
            ..ProveConfig::default()
        };
        let proof = prove_case(&case, &cfg);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{run_first}: {:?}",
            proof.message
        );
        let cx = proof.counterexample.expect("a confirmed counterexample");
        assert!(
            (cx.rebuilt_value - 1.5 * cx.spec_value).abs() <= 1e-9 * cx.spec_value.abs(),
            "{run_first}: spec {} rebuilt {}",
            cx.spec_value,
            cx.rebuilt_value
        );
        let out = tempfile::tempdir().unwrap();
        cx.write(out.path(), "one-copy").unwrap();
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("replay.json")).unwrap())
                .unwrap();
        // The replay rebuilds the element from rank 0's copy too.
        let flat = cx.index[0] * 6 + cx.index[1];
        assert_eq!(
            plan["sources"][flat][0], 0,
            "{run_first}: {}",
            plan["sources"][flat]
        );
    }
}
