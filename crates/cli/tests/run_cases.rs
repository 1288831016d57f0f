//! `shardproof run` on small hand-made cases: partial and sharded outputs, partial inputs,
//! random and unknown operators, the memory budget, outputs without expectations, deadlocks.

mod common;

use common::{colpar, rowpar, Scratch, RANK_MM_ALLREDUCE, RANK_MM_PARTIAL};

/// Exit code and verdict line of `run case.yaml` and the JSON verdict agree (invalid input has
/// no verdict line: nothing on stdout).
#[track_caller]
fn verdict(s: &Scratch, extra: &[&str], code: i32, word: &str) -> (common::Out, serde_json::Value) {
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    args.push("case.yaml");
    let text = s.run(&args);
    if code == 2 {
        text.expect_code(code);
        assert!(text.stdout.is_empty(), "{}", text.stdout);
    } else {
        text.expect_code(code)
            .stdout_has(&[&format!("verdict: {word}")]);
    }
    args.insert(1, "--json");
    let json = s.run(&args);
    json.expect_code(code);
    let v = json.json();
    assert_eq!(v["verdict"], word, "{}", json.stdout);
    (text, v)
}

// ---------------------------------------------------------------------------------------------
// Holds.

#[test]
fn row_parallel_matmul_with_a_partial_output() {
    let s = rowpar();
    // No all-reduce: each rank holds a partial sum of the spec's `mm`.
    s.write("r0.py", RANK_MM_PARTIAL);
    s.write("r1.py", RANK_MM_PARTIAL);
    let (text, v) = verdict(&s, &[], 0, "holds");
    text.stdout_has(&["case rowpar: spec + 2 ranks", "Partial()", "ok"]);
    assert_eq!(v["ranks"], 2);
    assert_eq!(v["outputs"][0]["name"], "mm");
    assert_eq!(v["outputs"][0]["placement"], "Partial()");
    assert_eq!(v["outputs"][0]["matched"], true);
    assert!(v["outputs"][0]["rel_error"].as_f64().unwrap() <= 1e-9);
    assert_eq!(v["first_mismatch"], serde_json::Value::Null);
    // Other seeds and precisions agree.
    verdict(&s, &["--seed", "7"], 0, "holds");
    verdict(&s, &["--dtype", "f32"], 0, "holds");
    verdict(&s, &["--dtype", "bf16"], 0, "holds");
}

#[test]
fn row_parallel_partial_output_expected_replicated_is_violated() {
    let s = rowpar();
    s.write("r0.py", RANK_MM_PARTIAL);
    s.write("r1.py", RANK_MM_PARTIAL);
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace("mm: Partial()", "mm: Replicate()"),
    );
    let (text, v) = verdict(&s, &[], 1, "violated");
    text.stdout_has(&["MISMATCH", "first mismatching output `mm`"]);
    assert_eq!(v["first_mismatch"], "mm");
    assert_eq!(v["outputs"][0]["matched"], false);
    assert!(v["outputs"][0]["rel_error"].as_f64().unwrap() > 1e-3);
}

#[test]
fn row_parallel_matmul_with_all_reduce_holds_as_partial_and_replicated() {
    // The case's `mm` names the rank value before the all-reduce: a partial sum.
    let s = rowpar();
    verdict(&s, &[], 0, "holds");
    // The value after the all-reduce is the spec's `mm` on every rank.
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace(
            "mm: Partial()",
            "mm: { impl: wait_tensor, placement: Replicate() }",
        ),
    );
    let (_, v) = verdict(&s, &[], 0, "holds");
    assert_eq!(v["outputs"][0]["placement"], "Replicate()");
}

#[test]
fn column_parallel_matmul_with_a_sharded_output() {
    let s = colpar();
    let (text, v) = verdict(&s, &[], 0, "holds");
    text.stdout_has(&["relu", "Shard(1)", "ok"]);
    assert_eq!(v["outputs"][0]["placement"], "Shard(1)");
    assert_eq!(v["outputs"][0]["rel_error"], 0.0);
    verdict(&s, &["--seed", "7", "--dtype", "f32"], 0, "holds");
}

#[test]
fn column_parallel_with_a_wrong_rank_is_violated() {
    // Rank 1 computes the right shape with the wrong operator (neg instead of relu).
    let s = colpar();
    s.write(
        "r1.py",
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 3]"):
        mm: "f32[4, 3]" = torch.ops.aten.mm.default(x, w);  x = w = None
        relu: "f32[4, 3]" = torch.ops.aten.neg.default(mm);  mm = None
        return (relu,)
"#,
    );
    let (text, v) = verdict(&s, &[], 1, "violated");
    text.stdout_has(&["first mismatching output `relu`"]);
    assert_eq!(v["first_mismatch"], "relu");
}

#[test]
fn an_output_expected_by_an_expression_is_evaluated() {
    // `relu` is [r0.relu | r1.relu] along dim 1: the expression states it with the operators of
    // the case format, and the same pieces in the wrong order are a mismatch.
    let s = colpar();
    s.write(
        "case.yaml",
        &common::CASE_COL.replace(
            "relu: Shard(1)",
            "relu: { expr: \"transpose(concat([transpose(r0.relu, 0, 1), transpose(slice(r1.relu, 1, 0, 3), 0, 1)], 0), 0, 1)\" }",
        ),
    );
    let (text, v) = verdict(&s, &[], 0, "holds");
    text.stdout_has(&["expr transpose(concat(", "ok"]);
    assert_eq!(v["outputs"][0]["rel_error"], 0.0);
    s.write(
        "case.yaml",
        &common::CASE_COL.replace(
            "relu: Shard(1)",
            "relu: { expr: \"concat([r1.relu, r0.relu], 1)\" }",
        ),
    );
    let (text, v) = verdict(&s, &[], 1, "violated");
    text.stdout_has(&["MISMATCH", "first mismatching output `relu`"]);
    assert_eq!(v["outputs"][0]["matched"], false);
}

const SPEC_ADD: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, g: "f32[4, 6]", b: "f32[6]"):
        add: "f32[4, 6]" = torch.ops.aten.add.Tensor(g, b);  g = b = None
        return (add,)
"#;

const RANK_REDUCE_ADD: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, g: "f32[4, 6]", b: "f32[6]"):
        all_reduce: "f32[4, 6]" = torch.ops._c10d_functional.all_reduce.default(g, 'sum', 'tp');  g = None
        wait_tensor: "f32[4, 6]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        add: "f32[4, 6]" = torch.ops.aten.add.Tensor(wait_tensor, b);  wait_tensor = b = None
        return (add,)
"#;

fn partial_input_case(g: &str) -> String {
    format!(
        "version: 1
name: partial-input
spec:
  graph: spec.py
impl:
  mesh: {{ tp: 2 }}
  graphs: [r0.py, r1.py]
  groups: {{ tp: tp }}
inputs:
  g: {g}
  b: Replicate()
outputs:
  add: Replicate()
"
    )
}

#[test]
fn partial_input_reduced_by_all_reduce() {
    let s = Scratch::new();
    s.write("spec.py", SPEC_ADD);
    s.write("r0.py", RANK_REDUCE_ADD);
    s.write("r1.py", RANK_REDUCE_ADD);
    s.write("case.yaml", &partial_input_case("Partial()"));
    verdict(&s, &[], 0, "holds");
    verdict(&s, &["--seed", "11"], 0, "holds");
    // The same program on a replicated gradient counts it twice.
    s.write("case.yaml", &partial_input_case("Replicate()"));
    let (_, v) = verdict(&s, &[], 1, "violated");
    assert_eq!(v["first_mismatch"], "add");
}

#[test]
fn partial_max_input_is_not_a_sum() {
    let s = Scratch::new();
    s.write("spec.py", SPEC_ADD);
    s.write("r0.py", RANK_REDUCE_ADD);
    s.write("r1.py", RANK_REDUCE_ADD);
    s.write("case.yaml", &partial_input_case("Partial(max)"));
    verdict(&s, &[], 1, "violated");
}

// ---------------------------------------------------------------------------------------------
// Inconclusive.

fn dropout_graph(rows: usize, p: &str) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{rows}, 6]"):
        native_dropout = torch.ops.aten.native_dropout.default(x, {p}, True);  x = None
        getitem: "f32[{rows}, 6]" = native_dropout[0]
        getitem_1: "b8[{rows}, 6]" = native_dropout[1];  native_dropout = None
        return (getitem,)
"#
    )
}

const CASE_DP: &str = "version: 1
name: data-parallel
spec:
  graph: spec.py
impl:
  mesh: { dp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  x: Shard(0)
outputs:
  OUT: Shard(0)
";

fn dropout_case(p: &str, assume: bool) -> Scratch {
    let s = Scratch::new();
    s.write("spec.py", &dropout_graph(4, p));
    s.write("r0.py", &dropout_graph(2, p));
    s.write("r1.py", &dropout_graph(2, p));
    let mut case = CASE_DP.replace("OUT", "getitem");
    if assume {
        case.push_str("assume:\n  dropout: same-mask\n");
    }
    s.write("case.yaml", &case);
    s
}

#[test]
fn dropout_is_inconclusive_with_a_hint() {
    let s = dropout_case("0.5", false);
    let (text, v) = verdict(&s, &[], 3, "inconclusive");
    text.stderr_has(&[
        "inconclusive",
        "native_dropout",
        "random",
        "hint: ",
        "p=0",
        "dropout: same-mask",
    ]);
    let message = v["message"].as_str().expect("a message");
    assert!(message.contains("native_dropout"), "{message}");
    assert!(message.contains("hint: "), "{message}");
    assert_eq!(v["first_mismatch"], serde_json::Value::Null);
}

#[test]
fn dropout_under_same_mask_is_still_inconclusive_for_run() {
    // `run` compares numbers drawn independently: it cannot honor the assumption, and must not
    // give a 0 it cannot stand behind.
    let s = dropout_case("0.5", true);
    verdict(&s, &[], 3, "inconclusive");
}

#[test]
fn dropout_with_p_0_is_deterministic() {
    let s = dropout_case("0.0", false);
    verdict(&s, &[], 0, "holds");
}

const SPEC_CUSTOM: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 6]"):
        foo: "f32[4, 6]" = torch.ops.mylib.foo.default(x);  x = None
        relu: "f32[4, 6]" = torch.ops.aten.relu.default(foo);  foo = None
        return (relu,)
"#;

fn custom_case(ops: &str) -> Scratch {
    let s = Scratch::new();
    s.write("spec.py", SPEC_CUSTOM);
    let rank = SPEC_CUSTOM.replace("[4, 6]", "[2, 6]");
    s.write("r0.py", &rank);
    s.write("r1.py", &rank);
    s.write("case.yaml", &(CASE_DP.replace("OUT", "relu") + ops));
    s
}

#[test]
fn unknown_operator_is_inconclusive_and_named() {
    let s = custom_case("");
    let (text, v) = verdict(&s, &[], 3, "inconclusive");
    text.stderr_has(&["mylib.foo", "ops:"]);
    let message = v["message"].as_str().expect("a message");
    assert!(message.contains("mylib.foo"), "{message}");
    // inspect reports it as opaque.
    s.run(&["inspect", "case.yaml"])
        .expect_code(0)
        .stdout_has(&["opaque operators: mylib.foo.default x1"]);
    s.run(&["inspect", "--strict", "case.yaml"]).expect_code(1);
}

#[test]
fn declared_operator_runs() {
    let s = custom_case("ops:\n  mylib.foo: identity\n");
    let (_, v) = verdict(&s, &[], 0, "holds");
    assert_eq!(v["outputs"][0]["name"], "relu");
    s.run(&["inspect", "--strict", "case.yaml"])
        .expect_code(0)
        .stdout_has(&["opaque operators: none"]);
}

#[test]
fn declared_operator_with_a_decomposition_runs() {
    let s = custom_case("ops:\n  mylib.foo.default: \"neg(neg($0))\"\n");
    verdict(&s, &[], 0, "holds");
    let s = custom_case("ops:\n  mylib.foo: \"relu($0)\"\n");
    verdict(&s, &[], 0, "holds");
}

#[test]
fn decomposition_calling_an_unknown_operator_is_invalid_input() {
    // `mul` alone means `aten.mul.default`, which does not exist (`mul.Tensor` does): the case
    // is wrong, and the error points at the call in the case file (line 13, inside the quotes).
    let s = custom_case("ops:\n  mylib.foo: \"mul($0, 3)\"\n");
    for cmd in ["run", "inspect"] {
        s.run(&[cmd, "case.yaml"]).expect_code(2).stderr_has(&[
            "case.yaml:13:15",
            "unknown operator `aten.mul.default`",
            "hint: ",
        ]);
    }
}

#[test]
fn memory_budget_is_inconclusive() {
    let s = colpar();
    let (text, v) = verdict(&s, &["--max-memory", "1KB"], 3, "inconclusive");
    text.stderr_has(&["memory budget", "1024 bytes", "hint: ", "--max-memory"]);
    assert!(v["message"].as_str().unwrap().contains("memory budget"));
    // Within the budget it runs.
    verdict(&s, &["--max-memory", "1MB"], 0, "holds");
    verdict(&s, &["--max-memory", "1048576"], 0, "holds");
}

// ---------------------------------------------------------------------------------------------
// No expectations: every spec output is matched against the simple placements.

const SPEC_TWO_OUTPUTS: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        clone: "f32[4, 6]" = torch.ops.aten.clone.default(mm)
        return (clone, mm)
"#;

/// Row parallel: output 0 all-reduced (replicated), output 1 the partial sum.
const RANK_TWO_OUTPUTS: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]", w: "f32[4, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        all_reduce: "f32[4, 6]" = torch.ops._c10d_functional.all_reduce.default(mm, 'sum', 'tp')
        wait_tensor: "f32[4, 6]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        return (wait_tensor, mm)
"#;

#[test]
fn without_outputs_the_report_lists_the_matched_placements() {
    let s = Scratch::new();
    s.write("spec.py", SPEC_TWO_OUTPUTS);
    s.write("r0.py", RANK_TWO_OUTPUTS);
    s.write("r1.py", RANK_TWO_OUTPUTS);
    let case = common::CASE_ROWPAR.replace("outputs:\n  mm: Partial()\n", "");
    assert!(!case.contains("outputs"));
    s.write("case.yaml", &case);
    let (text, v) = verdict(&s, &[], 0, "holds");
    let line = |name: &str| {
        text.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for `{name}`:\n{}", text.stdout))
            .to_string()
    };
    assert!(line("clone").contains("Replicate()"), "{}", line("clone"));
    assert!(line("mm").contains("Partial()"), "{}", line("mm"));
    let outputs = v["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 2, "{}", v);
    assert_eq!(outputs[0]["name"], "clone");
    assert_eq!(outputs[0]["placement"], "Replicate()");
    assert_eq!(outputs[1]["name"], "mm");
    assert_eq!(outputs[1]["placement"], "Partial()");
    assert!(outputs.iter().all(|o| o["matched"] == true));

    // Column parallel: the output matches Shard(1).
    let s = colpar();
    s.write(
        "case.yaml",
        &common::CASE_COL.replace("outputs:\n  relu: Shard(1)\n", ""),
    );
    let (text, v) = verdict(&s, &[], 0, "holds");
    text.stdout_has(&["Shard(1)"]);
    assert_eq!(v["outputs"][0]["placement"], "Shard(1)");
}

#[test]
fn without_outputs_a_wrong_output_is_violated_with_the_closest_placement() {
    let s = rowpar();
    // Rank 1 negates the reduced value: the outputs fit no placement.
    s.write(
        "r1.py",
        &RANK_MM_ALLREDUCE.replace(
            "return (wait_tensor,)",
            "neg: \"f32[4, 6]\" = torch.ops.aten.neg.default(wait_tensor)\n        return (neg,)",
        ),
    );
    let case = common::CASE_ROWPAR.replace("outputs:\n  mm: Partial()\n", "");
    s.write("case.yaml", &case);
    let (text, v) = verdict(&s, &[], 1, "violated");
    text.stdout_has(&["MISMATCH", "matches no simple placement"]);
    assert_eq!(v["outputs"][0]["matched"], false);
    assert!(v["first_mismatch"].is_string());
}

// ---------------------------------------------------------------------------------------------
// Collectives that never meet.

#[test]
fn all_reduce_on_different_groups_is_a_deadlock() {
    let s = rowpar();
    s.write("r1.py", &RANK_MM_ALLREDUCE.replace("'tp'", "'other'"));
    let (text, v) = verdict(&s, &[], 1, "violated");
    text.stderr_has(&["rank 0", "rank 1", "`tp`", "`other`", "all_reduce"]);
    let message = v["message"].as_str().expect("a message");
    assert!(message.contains("`other`"), "{message}");
    // Both groups declared over the tp dim: still a deadlock.
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace(
            "  graphs: [r0.py, r1.py]\n",
            "  graphs: [r0.py, r1.py]\n  groups: { tp: tp, other: tp }\n",
        ),
    );
    verdict(&s, &[], 1, "violated");
}

#[test]
fn all_reduce_on_one_rank_only_is_a_deadlock() {
    let s = rowpar();
    s.write("r1.py", RANK_MM_PARTIAL);
    verdict(&s, &[], 1, "violated");
}

#[test]
fn expr_input_layouts_are_inconclusive_for_run() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace(
            "  w: Shard(0)",
            "  w: { expr: \"concat([r0.w, r1.w], 0)\" }",
        ),
    );
    let (text, _) = verdict(&s, &[], 3, "inconclusive");
    text.stderr_has(&["`w`", "expr:", "hint: "]);
    // An output's `expr:` is evaluated (the partial sums add up to the spec's product).
    s.write("r0.py", RANK_MM_PARTIAL);
    s.write("r1.py", RANK_MM_PARTIAL);
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace("mm: Partial()", "mm: { expr: \"sum([r0.mm, r1.mm])\" }"),
    );
    let (text, _) = verdict(&s, &[], 0, "holds");
    text.stdout_has(&["expr sum(", "ok"]);
}

#[test]
fn a_case_with_nothing_to_compare_is_inconclusive_not_verified() {
    let s = rowpar();
    let returns_nothing = |g: &str| {
        g.replace("return (mm,)", "return (None,)")
            .replace("return (wait_tensor,)", "return (None,)")
    };
    s.write("spec.py", &returns_nothing(common::SPEC_MM));
    s.write("r0.py", &returns_nothing(RANK_MM_ALLREDUCE));
    s.write("r1.py", &returns_nothing(RANK_MM_ALLREDUCE));
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace("outputs:\n  mm: Partial()\n", ""),
    );
    let (text, _) = verdict(&s, &[], 3, "inconclusive");
    text.stderr_has(&["nothing to compare"]);
}

// ---------------------------------------------------------------------------------------------
// Point-to-point messages.

const P2P_SPEC: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]", y: "f32[2]"):
        mul: "f32[2]" = torch.ops.aten.mul.Scalar(x, 2.0);  x = None
        add: "f32[2]" = torch.ops.aten.add.Tensor(mul, y);  mul = y = None
        return (add,)
"#;

/// Stage 0 doubles `x`, sends it to stage 1 and receives the sum back as its `add`.
const P2P_STAGE0: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]", y: "f32[2]"):
        mul: "f32[2]" = torch.ops.aten.mul.Scalar(x, 2.0);  x = None
        send: "f32[2]" = torch.ops.shardproof_p2p.send.default(mul, 1, 0)
        add: "f32[2]" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 1, 1)
        return (add,)
"#;

/// Stage 1 adds `y` to what it receives and sends the sum back.
const P2P_STAGE1: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]", y: "f32[2]"):
        recv: "f32[2]" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 0, 0)
        add: "f32[2]" = torch.ops.aten.add.Tensor(recv, y);  recv = y = None
        send: "f32[2]" = torch.ops.shardproof_p2p.send.default(add, 0, 1)
        return (add,)
"#;

fn p2p() -> Scratch {
    let s = Scratch::new();
    s.write("spec.py", P2P_SPEC);
    s.write("r0.py", P2P_STAGE0);
    s.write("r1.py", P2P_STAGE1);
    s.write(
        "case.yaml",
        "version: 1\nname: p2p\nspec: { graph: spec.py }\nimpl:\n  mesh: { pp: 2 }\n  \
         graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  y: Replicate()\noutputs:\n  \
         add: Replicate()\n",
    );
    s
}

#[test]
fn point_to_point_messages_between_two_stages_hold() {
    let s = p2p();
    verdict(&s, &[], 0, "holds");
    s.run(&["inspect", "--strict", "case.yaml"]).expect_code(0);
}

#[test]
fn a_recv_whose_send_is_missing_is_a_located_deadlock() {
    let s = p2p();
    s.write("r1.py", &P2P_STAGE1.replace("(add, 0, 1)", "(add, 0, 2)"));
    let (text, v) = verdict(&s, &[], 1, "violated");
    text.stderr_has(&[
        "r0.py:5: node `add`",
        "waits for a message from rank 1 with tag 1 (f32[2])",
        "other tags (1 with tag 2)",
        "hint:",
    ]);
    assert!(v["message"].as_str().unwrap().contains("deadlock"), "{v}");
    // A recv that declares another type than what its send sends (the rank's graph otherwise
    // type-checks: it views the received tensor back to the spec's shape).
    let s = p2p();
    s.write(
        "r1.py",
        &P2P_STAGE1
            .replace("recv: \"f32[2]\"", "recv: \"f32[1, 2]\"")
            .replace(
                "        add: ",
                "        flat: \"f32[2]\" = torch.ops.aten.view.default(recv, [2])\n        add: ",
            )
            .replace("add.Tensor(recv, y)", "add.Tensor(flat, y)")
            .replace(
                "([2], torch.float32, 0, 0)",
                "([1, 2], torch.float32, 0, 0)",
            ),
    );
    let (text, _) = verdict(&s, &[], 1, "violated");
    text.stderr_has(&[
        "r1.py:3: node `recv`",
        "but declares f32[1, 2]",
        "r0.py:4: node `send`",
    ]);
    // A peer outside the mesh is invalid input.
    let s = p2p();
    s.write("r0.py", &P2P_STAGE0.replace("(mul, 1, 0)", "(mul, 5, 0)"));
    verdict(&s, &[], 2, "invalid");
}

#[test]
fn stages_hold_their_own_inputs_and_outputs_with_at() {
    // Stage 0 has only `x`, stage 1 only `y` and the result: `at:` says which stage holds what.
    let s = p2p();
    s.write(
        "r0.py",
        &P2P_STAGE0
            .replace(", y: \"f32[2]\"", "")
            .replace(
                "        add: \"f32[2]\" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 1, 1)\n        return (add,)",
                "        return (send,)",
            ),
    );
    s.write(
        "r1.py",
        &P2P_STAGE1.replace("x: \"f32[2]\", ", "").replace(
            "        send: \"f32[2]\" = torch.ops.shardproof_p2p.send.default(add, 0, 1)\n",
            "",
        ),
    );
    s.write(
        "case.yaml",
        "version: 1\nname: p2p\nspec: { graph: spec.py }\nimpl:\n  mesh: { pp: 2 }\n  \
         graphs: [r0.py, r1.py]\ninputs:\n  x: { placement: Replicate(), at: { pp: 0 } }\n  \
         y: { placement: Replicate(), at: { pp: 1 } }\noutputs:\n  \
         add: { placement: Replicate(), at: { pp: 1 } }\n",
    );
    let (text, v) = verdict(&s, &[], 0, "holds");
    text.stdout_has(&["Replicate() at pp = 1"]);
    assert_eq!(v["outputs"][0]["placement"], "Replicate() at pp = 1");
    // Expected on the wrong stage: stage 0 has no `add`, which the case resolution reports.
    s.write(
        "case.yaml",
        &std::fs::read_to_string(s.path().join("case.yaml"))
            .unwrap()
            .replace(
                "add: { placement: Replicate(), at: { pp: 1 } }",
                "add: { placement: Replicate(), at: { pp: 0 } }",
            ),
    );
    let out = s.run(&["run", "case.yaml"]);
    out.expect_code(2)
        .stderr_has(&["`add` is not a value of the graph of rank 0", "pp = 0"]);
}
