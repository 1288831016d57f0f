//! `prove` under approximation overrides (`assume:`, TrainVerify section 5.3): per-device
//! BatchNorm statistics and node-limited MoE routing are proved with the assumption and
//! refuted without it, the report states every assumption used (text and JSON), and a wrong
//! override (a group the batch is not split over, a statistic that is not a mean, a wrong node
//! subset) is invalid input (exit 2) located at the `assume:` entry.

mod common;

use common::Scratch;

/// Batch normalization over the rows of `x` (no affine), written as `mean`s: the variance is
/// the mean of squared deviations from the mean.
fn batch_norm_graph(rows: usize) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{rows}, 2]"):
        mean: "f32[1, 2]" = torch.ops.aten.mean.dim(x, [0], True)
        sub: "f32[{rows}, 2]" = torch.ops.aten.sub.Tensor(x, mean);  x = mean = None
        mul: "f32[{rows}, 2]" = torch.ops.aten.mul.Tensor(sub, sub)
        var: "f32[1, 2]" = torch.ops.aten.mean.dim(mul, [0], True);  mul = None
        add: "f32[1, 2]" = torch.ops.aten.add.Tensor(var, 1e-05);  var = None
        rsqrt: "f32[1, 2]" = torch.ops.aten.rsqrt.default(add);  add = None
        out: "f32[{rows}, 2]" = torch.ops.aten.mul.Tensor(sub, rsqrt);  sub = rsqrt = None
        return (out,)
"#
    )
}

/// A data-parallel batch norm whose ranks normalize with their own rows' statistics, with the
/// `assume:` text given (its first line is line 12 of the file).
fn batch_norm_case(s: &Scratch, mesh: &str, placement: &str, assume: &str) -> String {
    let ranks = if mesh.contains("tp") { 4 } else { 2 };
    s.write("spec.py", &batch_norm_graph(4));
    s.write("rank.py", &batch_norm_graph(2));
    let graphs = vec!["rank.py"; ranks].join(", ");
    s.write(
        "case.yaml",
        &format!(
            "version: 1\nname: bn\nspec:\n  graph: spec.py\nimpl:\n  mesh: {mesh}\n  graphs: [{graphs}]\ninputs:\n  x: {placement}\noutputs:\n  out: {placement}\n{assume}"
        ),
    );
    "case.yaml".into()
}

#[test]
fn per_device_batch_norm_is_proved_only_under_its_assumption() {
    let s = Scratch::new();
    let case = batch_norm_case(&s, "{ dp: 2 }", "Shard(0)", "");
    let out = s.run(&["prove", &case]);
    out.expect_code(1);
    let case = batch_norm_case(
        &s,
        "{ dp: 2 }",
        "Shard(0)",
        "assume:\n  batch-norm: { per-device: dp, stats: [mean, var] }\n",
    );
    let out = s.run(&["prove", &case]);
    out.expect_code(0).stdout_has(&[
        "assuming batch-norm",
        "per-device batch statistics `mean`, `var` averaged over `dp`",
        "under the assumptions `batch-norm`",
    ]);
    let json = s.run(&["prove", &case, "--json", "--quiet"]);
    json.expect_code(0);
    let r = json.json();
    assert_eq!(r["verdict"], "proved", "{r:#}");
    assert_eq!(r["assumptions"][0]["assumption"], "batch-norm", "{r:#}");
    assert_eq!(r["assumptions"][0]["ranks"], 2, "{r:#}");
    // Staged (`--jobs`), the report carries the assumption too.
    let staged = s.run(&["prove", &case, "--jobs", "2", "--json", "--quiet"]);
    staged.expect_code(0);
    assert_eq!(
        staged.json()["assumptions"][0]["assumption"],
        "batch-norm",
        "{}",
        staged.stdout
    );
}

#[test]
fn a_wrong_batch_norm_override_is_invalid_input_at_its_entry() {
    let s = Scratch::new();
    // The batch is split over dp; averaging over tp, where every rank holds the same rows,
    // restores nothing.
    let case = batch_norm_case(
        &s,
        "{ dp: 2, tp: 2 }",
        "[Shard(0), Replicate()]",
        "assume:\n  batch-norm: { per-device: tp, stats: [mean, var] }\n",
    );
    s.run(&["prove", &case]).expect_code(2).stderr_has(&[
        "case.yaml:13:29",
        "`mean`'s input is the same on every rank along `tp`",
        "differs along `dp`",
    ]);
    // With dp named, the same mesh is proved.
    let case = batch_norm_case(
        &s,
        "{ dp: 2, tp: 2 }",
        "[Shard(0), Replicate()]",
        "assume:\n  batch-norm: { per-device: dp, stats: [mean, var] }\n",
    );
    s.run(&["prove", &case]).expect_code(0);
    // A statistic must be a mean; a name must exist.
    let case = batch_norm_case(
        &s,
        "{ dp: 2 }",
        "Shard(0)",
        "assume:\n  batch-norm: { per-device: dp, stats: [mean, sub] }\n",
    );
    s.run(&["prove", &case])
        .expect_code(2)
        .stderr_has(&["case.yaml:13:47", "`sub`", "not a mean"]);
    let case = batch_norm_case(
        &s,
        "{ dp: 2 }",
        "Shard(0)",
        "assume:\n  batch-norm: { per-device: dp, stats: [means] }\n",
    );
    s.run(&["prove", &case])
        .expect_code(2)
        .stderr_has(&["case.yaml:13:41", "did you mean `mean`"]);
    let case = batch_norm_case(
        &s,
        "{ dp: 2 }",
        "Shard(0)",
        "assume:\n  batch-norm: { per-device: pd, stats: [mean] }\n",
    );
    s.run(&["prove", &case])
        .expect_code(2)
        .stderr_has(&["case.yaml:13:29", "`dp`"]);
}

/// Top-1 routing of one token over 4 experts (sigmoid scores): the spec over every expert.
const ROUTE_SPEC: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, logits: "f32[1, 4]"):
        sigmoid: "f32[1, 4]" = torch.ops.aten.sigmoid.default(logits);  logits = None
        topk = torch.ops.aten.topk.default(sigmoid, 1);  sigmoid = None
        getitem: "f32[1, 1]" = topk[0]
        getitem_1: "i64[1, 1]" = topk[1];  topk = None
        return (getitem, getitem_1)
"#;

/// The ranks' routing, limited to the experts of the best of 2 nodes (2 experts each; a node
/// scores the sum of its experts' scores), as DeepSeek-V3's group-limited routing masks them.
const ROUTE_LIMITED: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, logits: "f32[1, 4]"):
        sigmoid: "f32[1, 4]" = torch.ops.aten.sigmoid.default(logits);  logits = None
        view: "f32[1, 2, 2]" = torch.ops.aten.view.default(sigmoid, [1, 2, 2])
        sum_1: "f32[1, 2]" = torch.ops.aten.sum.dim_IntList(view, [-1]);  view = None
        topk = torch.ops.aten.topk.default(sum_1, 1);  sum_1 = None
        getitem_2: "i64[1, 1]" = topk[1];  topk = None
        zeros: "f32[1, 2]" = torch.ops.aten.zeros.default([1, 2], dtype = torch.float32, device = device(type='cpu'), pin_memory = False)
        scatter: "f32[1, 2]" = torch.ops.aten.scatter.value(zeros, 1, getitem_2, 1.0);  zeros = getitem_2 = None
        unsqueeze: "f32[1, 2, 1]" = torch.ops.aten.unsqueeze.default(scatter, -1);  scatter = None
        expand: "f32[1, 2, 2]" = torch.ops.aten.expand.default(unsqueeze, [1, 2, 2]);  unsqueeze = None
        clone: "f32[1, 2, 2]" = torch.ops.aten.clone.default(expand);  expand = None
        view_1: "f32[1, 4]" = torch.ops.aten.view.default(clone, [1, 4]);  clone = None
        eq: "b8[1, 4]" = torch.ops.aten.eq.Scalar(view_1, 0);  view_1 = None
        masked_fill: "f32[1, 4]" = torch.ops.aten.masked_fill.Scalar(sigmoid, eq, 0.0);  sigmoid = eq = None
        topk_1 = torch.ops.aten.topk.default(masked_fill, 1);  masked_fill = None
        getitem_3: "f32[1, 1]" = topk_1[0]
        getitem_4: "i64[1, 1]" = topk_1[1];  topk_1 = None
        return (getitem_3, getitem_4)
"#;

fn routing_case(s: &Scratch, assume: &str) -> String {
    s.write("spec.py", ROUTE_SPEC);
    s.write("rank.py", ROUTE_LIMITED);
    s.write(
        "case.yaml",
        &format!(
            "version: 1\nname: route\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ ep: 2 }}\n  graphs: [rank.py, rank.py]\ninputs:\n  logits: Replicate()\noutputs:\n  getitem: {{ impl: getitem_3, placement: Replicate() }}\n  getitem_1: {{ impl: getitem_4, placement: Replicate() }}\n{assume}"
        ),
    );
    "case.yaml".into()
}

#[test]
fn node_limited_routing_is_proved_only_under_its_assumption() {
    let s = Scratch::new();
    // Top-k has no place in shape reduction: these tiny programs are proved at their sizes.
    let case = routing_case(&s, "");
    s.run(&["prove", &case, "--no-reduce"]).expect_code(1);
    let case = routing_case(
        &s,
        "assume:\n  moe-routing: { node-limited: masked_fill, nodes: 2, top-nodes: 1 }\n",
    );
    s.run(&["prove", &case, "--no-reduce"])
        .expect_code(0)
        .stdout_has(&[
            "assuming moe-routing",
            "routing scores `masked_fill` limited to the top 1 of 2 nodes taken unmasked",
        ]);
    let r = s.run(&["prove", &case, "--no-reduce", "--json", "--quiet"]);
    r.expect_code(0);
    assert_eq!(
        r.json()["assumptions"][0]["assumption"],
        "moe-routing",
        "{}",
        r.stdout
    );
    // The wrong subset, the wrong value.
    let case = routing_case(
        &s,
        "assume:\n  moe-routing: { node-limited: masked_fill, nodes: 4, top-nodes: 1 }\n",
    );
    s.run(&["prove", &case, "--no-reduce"])
        .expect_code(2)
        .stderr_has(&[
            "case.yaml:14:52",
            "wrong node subset",
            "keeps the top 1 of 2 nodes",
        ]);
    let case = routing_case(
        &s,
        "assume:\n  moe-routing: { node-limited: view_1, nodes: 2, top-nodes: 1 }\n",
    );
    s.run(&["prove", &case, "--no-reduce"])
        .expect_code(2)
        .stderr_has(&["case.yaml:14:32", "not a masking of routing scores"]);
}
