//! `shardproof prove`: a correct zoo plan is proved, a planted catalog bug is refuted with a
//! counterexample the interpreter confirms (and written to disk, with a PyTorch replay that
//! reproduces it), an operator without a symbolic rule is inconclusive and named, shape
//! reduction prints its sizes and keeps the verdict, and invalid input exits 2.

mod common;

use common::Scratch;

fn emit(s: &Scratch, dir: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "zoo",
        "emit",
        "mlp",
        "--mesh",
        "tp=2",
        "--hidden",
        "8",
        "--forward-only",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-o", dir]);
    s.run(&args).expect_code(0);
    format!("{dir}/case.yaml")
}

#[test]
fn a_correct_plan_is_proved() {
    let s = Scratch::new();
    let case = emit(&s, "ok", &[]);
    let out = s.run(&["prove", &case]);
    out.expect_code(0);
    assert!(
        out.stdout.contains("proved: every expected output"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("normal-form"), "{}", out.stdout);
    let json = s.run(&["prove", &case, "--json", "--quiet"]);
    json.expect_code(0);
    let v = json.json();
    assert_eq!(v["verdict"], "proved");
    assert!(json.stderr.is_empty(), "--quiet: {}", json.stderr);
}

#[test]
fn a_missing_all_reduce_is_refuted_with_a_confirmed_counterexample() {
    let s = Scratch::new();
    let case = emit(&s, "bug", &["--bug", "tp-missing-allreduce"]);
    let out = s.run(&["prove", &case, "--counterexample", "cx"]);
    out.expect_code(1);
    assert!(
        out.stdout.contains("the interpreter confirms"),
        "{}",
        out.stdout
    );
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(s.path().join("cx/counterexample.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(index["output"], "loss");
    let (spec, rebuilt) = (
        index["spec_value"].as_f64().unwrap(),
        index["rebuilt_value"].as_f64().unwrap(),
    );
    assert!((spec - rebuilt).abs() > 1e-6 * (1.0 + spec.abs()));
    for f in [
        "inputs.safetensors",
        "spec_output.safetensors",
        "rebuilt_output.safetensors",
    ] {
        assert!(s.path().join("cx").join(f).is_file(), "{f}");
    }
    // `run` with its own random inputs agrees that the plan is wrong.
    s.run(&["run", &case]).expect_code(1);
}

/// The Python with torch and safetensors the replay needs (`SHARDPROOF_VENV`, by default
/// ~/.cache/shardproof/venv), or why there is none.
fn replay_python() -> Result<std::path::PathBuf, String> {
    let venv = std::env::var_os("SHARDPROOF_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/shardproof/venv")
        });
    let python = venv.join("bin/python");
    if !python.is_file() {
        return Err(format!("{} does not exist", python.display()));
    }
    let probe = std::process::Command::new(&python)
        .args(["-c", "import torch, safetensors"])
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} lacks torch or safetensors: {}",
            python.display(),
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    Ok(python)
}

#[test]
fn the_replay_script_reproduces_the_counterexample_in_pytorch() {
    let python = match replay_python() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED: the replay needs PyTorch: {why}");
            return;
        }
    };
    let s = Scratch::new();
    // dp x tp: the ranks' all-reduce runs over a named group of a two-dim mesh.
    s.run(&[
        "zoo",
        "emit",
        "mlp",
        "--mesh",
        "dp=2,tp=2",
        "--hidden",
        "8",
        "--forward-only",
        "--bug",
        "wrong-group",
        "-o",
        "bug",
    ])
    .expect_code(0);
    let case = "bug/case.yaml";
    s.run(&["prove", case, "--counterexample", "cx"])
        .expect_code(1);
    let cx = s.path().join("cx");
    for f in ["replay.py", "replay.json"] {
        assert!(cx.join(f).is_file(), "{f}");
    }
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cx.join("counterexample.json")).unwrap())
            .unwrap();
    assert_eq!(index["files"]["replay"], "replay.py");
    // Run from elsewhere: the script finds its files next to itself.
    let out = std::process::Command::new(&python)
        .arg(cx.join("replay.py"))
        .current_dir(s.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("differ:"))
        .unwrap_or_else(|| panic!("no `differ:` line in\n{stdout}"));
    // PyTorch's spec value at the first differing element is the interpreter's (6 digits).
    let spec: f64 = line
        .split("spec ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let want = index["spec_value"].as_f64().unwrap();
    assert!(
        (spec - want).abs() <= 1e-5 * (1.0 + want.abs()),
        "{line} vs {want}"
    );
    assert!(stdout.contains("max |spec - rebuilt| = "), "{stdout}");
}

#[test]
fn an_operator_without_a_symbolic_rule_is_inconclusive() {
    let s = Scratch::new();
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]"):
        cumsum: "f32[4, 8]" = torch.ops.aten.cumsum.default(x, 1);  x = None
        return (cumsum,)
"#;
    s.write("spec.py", spec);
    s.write("r0.py", spec);
    s.write("r1.py", spec);
    s.write(
        "case.yaml",
        "version: 1\nname: scan\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\noutputs:\n  cumsum: Replicate()\n",
    );
    let out = s.run(&["prove", "case.yaml"]);
    out.expect_code(3);
    assert!(out.stdout.contains("aten.cumsum.default"), "{}", out.stdout);
    let json = s.run(&["prove", "case.yaml", "--format", "sarif"]);
    json.expect_code(3);
    assert!(
        json.stdout.contains("unsupported-operator"),
        "{}",
        json.stdout
    );
}

#[test]
fn invalid_input_exits_2() {
    let s = Scratch::new();
    s.run(&["prove", "missing.yaml"]).expect_code(2);
    let case = emit(&s, "ok", &[]);
    s.run(&["prove", &case, "--time-limit", "-1"])
        .expect_code(2);
}

#[test]
fn shape_reduction_prints_the_sizes_and_keeps_the_verdict() {
    let s = Scratch::new();
    let emit3 = |dir: &str, bug: &[&str]| {
        let mut args = vec![
            "zoo",
            "emit",
            "mlp",
            "--mesh",
            "tp=2",
            "--hidden",
            "24",
            "--ffn",
            "48",
            "--batch",
            "6",
            "--forward-only",
        ];
        args.extend_from_slice(bug);
        args.extend_from_slice(&["-o", dir]);
        s.run(&args).expect_code(0);
        format!("{dir}/case.yaml")
    };
    let case = emit3("ok3", &[]);
    let out = s.run(&["prove", &case]);
    out.expect_code(0);
    assert!(out.stdout.contains("shape-reduced:"), "{}", out.stdout);
    assert!(
        out.stdout.contains("x: [6, 24] -> [3, 3]"),
        "{}",
        out.stdout
    );
    let json = s.run(&["prove", &case, "--json", "--quiet"]);
    json.expect_code(0);
    let v = json.json();
    assert_eq!(
        v["reduction"]["inputs"][0]["reduced"],
        serde_json::json!([3, 3])
    );
    // --no-reduce proves at full size, with no reduction reported.
    let full = s.run(&["prove", &case, "--no-reduce", "--json", "--quiet"]);
    full.expect_code(0);
    assert!(full.json()["reduction"].is_null());
    let bug = emit3("bug3", &["--bug", "tp-bias-before-allreduce"]);
    s.run(&["prove", &bug]).expect_code(1);
    s.run(&["prove", &bug, "--no-reduce"]).expect_code(1);
}

#[test]
fn a_time_limit_ends_the_proof_inconclusive() {
    let s = Scratch::new();
    // A llama full iteration takes seconds to prove; a fifth of a second stops it wherever it
    // is (symbolic execution, normalization or goal decision), inconclusive, naming the limit.
    s.run(&["zoo", "emit", "llama", "--mesh", "tp=2", "-o", "llama"])
        .expect_code(0);
    let out = s.run(&["prove", "llama/case.yaml", "--time-limit", "0.2"]);
    out.expect_code(3);
    assert!(
        out.stdout.contains("inconclusive: ")
            && out.stdout.contains("the time limit")
            && out.stdout.contains("ran out"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_time_limit_ends_a_staged_plan_inconclusive() {
    // `--jobs` proves in stages; the plan of a case of thousands of ranks takes minutes, so
    // the limit bounds the plan too: a microsecond stops it before any stage is built.
    let s = Scratch::new();
    s.run(&["zoo", "emit", "llama", "--mesh", "tp=2", "-o", "llama"])
        .expect_code(0);
    let out = s.run(&[
        "prove",
        "llama/case.yaml",
        "--jobs",
        "1",
        "--time-limit",
        "0.000001",
    ]);
    out.expect_code(3);
    assert!(
        out.stdout.contains("limit reached")
            && out.stdout.contains("while cutting the case into stages"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_literal_equal_to_a_reduced_size_does_not_hide_a_wrong_mean() {
    // The ranks write a mean over 8 as `sum * 0.5`: wrong at the case's size, and right at a
    // reduced size of 2. The reduction must choose sizes no literal can coincide with.
    let s = Scratch::new();
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 8]"):
        mean: "f32[8]" = torch.ops.aten.mean.dim(x, [1]);  x = None
        return (mean,)
"#;
    let rank = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 8]"):
        sum_1: "f32[8]" = torch.ops.aten.sum.dim_IntList(x, [1]);  x = None
        mean: "f32[8]" = torch.ops.aten.mul.Tensor(sum_1, 0.5);  sum_1 = None
        return (mean,)
"#;
    s.write("spec.py", spec);
    s.write("r0.py", rank);
    s.write("r1.py", rank);
    s.write(
        "case.yaml",
        "version: 1\nname: halfmean\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\noutputs:\n  mean: Replicate()\n",
    );
    let out = s.run(&["prove", "case.yaml"]);
    out.expect_code(1);
    assert!(out.stdout.contains("x: [8, 8] -> [3, 3]"), "{}", out.stdout);
}

/// Two tensor-parallel residual blocks `h = h + relu(h @ a) @ b` cut at the first block's
/// output; the rank's second block forgets its all-reduce.
fn two_blocks(s: &Scratch) {
    let block = |l: usize, h: &str, rank: bool, reduce: bool| {
        let col = if rank { 4 } else { 8 };
        let mut t = format!(
            "        mm{l}: \"f32[4, {col}]\" = torch.ops.aten.mm.default({h}, a{l})\n        relu{l}: \"f32[4, {col}]\" = torch.ops.aten.relu.default(mm{l})\n        down{l}: \"f32[4, 8]\" = torch.ops.aten.mm.default(relu{l}, b{l})\n"
        );
        if reduce {
            t.push_str(&format!("        ar{l}: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default(down{l}, 'sum', '0')\n        wt{l}: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(ar{l})\n        h{l}: \"f32[4, 8]\" = torch.ops.aten.add.Tensor({h}, wt{l})\n"));
        } else {
            t.push_str(&format!(
                "        h{l}: \"f32[4, 8]\" = torch.ops.aten.add.Tensor({h}, down{l})\n"
            ));
        }
        t
    };
    let head = |a: &str, b: &str| {
        format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\", a0: \"f32{a}\", b0: \"f32{b}\", a1: \"f32{a}\", b1: \"f32{b}\"):\n")
    };
    let spec = format!(
        "{}{}{}        return (h1,)\n",
        head("[8, 8]", "[8, 8]"),
        block(0, "x", false, false),
        block(1, "h0", false, false)
    );
    let rank = format!(
        "{}{}{}        return (h1,)\n",
        head("[8, 4]", "[4, 8]"),
        block(0, "x", true, true),
        block(1, "h0", true, false)
    );
    s.write("spec.py", &spec);
    s.write("r0.py", &rank);
    s.write("r1.py", &rank);
    s.write(
        "case.yaml",
        "version: 1\nname: blocks\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  a0: Shard(1)\n  b0: Shard(0)\n  a1: Shard(1)\n  b1: Shard(0)\n  h0: Replicate()\noutputs:\n  h1: Replicate()\n",
    );
}

#[test]
fn stages_are_reported_and_shards_run_as_processes_merge_into_the_same_report() {
    let s = Scratch::new();
    two_blocks(&s);
    let text = s.run(&["prove", "case.yaml", "--quiet"]);
    text.expect_code(1);
    text.stdout_has(&[
        "stage 0 cut `h0`",
        "proved",
        "stage 1 output `h1`",
        "refuted: stage 1",
    ]);
    let single = s.run(&["prove", "case.yaml", "--json", "--quiet"]);
    single.expect_code(1);
    assert_eq!(single.json()["stages"][0]["verdict"], "proved");
    let jobs = s.run(&["prove", "case.yaml", "--json", "--quiet", "--jobs", "2"]);
    assert_eq!(single.stdout, jobs.stdout, "--jobs 2");
    // Two shards at once, as an array job would start them.
    let children: Vec<_> = (0..2)
        .map(|i| {
            std::process::Command::new(env!("CARGO_BIN_EXE_shardproof"))
                .args(["prove", "case.yaml", "--quiet", "--shard"])
                .arg(format!("{i}/2"))
                .args(["--shard-dir", "results"])
                .current_dir(s.path())
                .spawn()
                .unwrap()
        })
        .collect();
    let codes: Vec<Option<i32>> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().status.code())
        .collect();
    // Shard 0 proves the correct block, shard 1 refutes the wrong one.
    assert_eq!(codes, [Some(0), Some(1)]);
    let merged = s.run(&[
        "prove",
        "case.yaml",
        "--merge",
        "results",
        "--json",
        "--quiet",
    ]);
    merged.expect_code(1);
    assert_eq!(single.stdout, merged.stdout);
    // `--counterexample` under `--merge` proves the refuted stage again to write its inputs.
    let merged = s.run(&[
        "prove",
        "case.yaml",
        "--merge",
        "results",
        "--counterexample",
        "cx",
        "--quiet",
    ]);
    merged
        .expect_code(1)
        .stdout_has(&["the stage's counterexample is written to cx"]);
    assert!(s.path().join("cx/counterexample.json").is_file());
    // A merge with a shard missing gives no verdict.
    std::fs::remove_file(s.path().join("results/shard-1-of-2.json")).unwrap();
    s.run(&["prove", "case.yaml", "--merge", "results", "--quiet"])
        .expect_code(3);
}

/// The text report of a dp=4 proof names the mesh-dim reduction, and says that the element
/// counts below the header are the two-replica case's, not the case's own.
#[test]
fn a_dp4_plan_is_mesh_reduced_and_the_counts_say_for_which_case() {
    let s = Scratch::new();
    s.run(&[
        "zoo", "emit", "mlp", "--mesh", "dp=4", "--hidden", "8", "-o", "dp4",
    ])
    .expect_code(0);
    let out = s.run(&["prove", "dp4/case.yaml"]);
    out.expect_code(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("mesh-reduced: dp 4 -> 2 (proved on two replicas")),
        "{}",
        out.stdout
    );
    assert!(
        lines[0].starts_with("case mlp-dp4: spec + 4 ranks; the sizes and element counts below are the mesh-reduced case's (spec + 2 ranks, dp 2)"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("mesh kept:"), "{}", out.stdout);
    // The JSON says which case its counts are for: `ranks` is the case's, the outputs'
    // elements the two-replica case's.
    let out = s.run(&["prove", "dp4/case.yaml", "--json"]);
    out.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["ranks"], 4, "{}", out.stdout);
    assert_eq!(v["counted_on"]["case"], "mesh-reduced", "{}", out.stdout);
    assert_eq!(v["counted_on"]["ranks"], 2, "{}", out.stdout);
    s.run(&[
        "zoo", "emit", "mlp", "--mesh", "tp=2", "--hidden", "8", "-o", "tp2",
    ])
    .expect_code(0);
    let out = s.run(&["prove", "tp2/case.yaml", "--json"]);
    out.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["counted_on"]["case"], "as-written", "{}", out.stdout);
    assert_eq!(v["counted_on"]["ranks"], 2, "{}", out.stdout);
}

/// A failed condition of the mesh-dim reduction is named once, on the `mesh kept:` line. (Its
/// inconclusive-fallback half used llama dp=4 x cp=2, undecided while `logsumexp` was refused
/// by shape reduction; that plan is proved since s72, `tests/mesh_reduction.rs` in the prover.)
#[test]
fn a_failed_mesh_condition_is_named_once() {
    let s = Scratch::new();
    // gpt2's layer norm is not known to be row-wise along the batch: condition (b).
    s.run(&[
        "zoo",
        "emit",
        "gpt2",
        "--mesh",
        "dp=4",
        "--batch",
        "4",
        "--forward-only",
        "-o",
        "g4",
    ])
    .expect_code(0);
    let out = s.run(&["prove", "g4/case.yaml"]);
    out.expect_code(0);
    let kept = out
        .stdout
        .lines()
        .find(|l| l.starts_with("mesh kept:"))
        .unwrap_or_else(|| panic!("no `mesh kept:` line in\n{}", out.stdout));
    assert!(
        kept.contains("(b) aten.native_layer_norm"),
        "{}",
        out.stdout
    );
    // Proved at the case's own mesh: the header's counts are the case's.
    assert!(
        out.stdout.starts_with("case gpt2-dp4-fw: spec + 4 ranks\n"),
        "{}",
        out.stdout
    );
}

/// The mesh-dim reduction's fallback when the two-replica case is undecided: a dp=4 case
/// whose ranks multiply their rows by `sin² + cos²` (1, which no decision layer shows: the
/// functions are uninterpreted) is undecided on two replicas, then on its own four ranks, and
/// the verdict is inconclusive (exit 3), naming the undecided two-replica case once.
#[test]
fn an_undecided_two_replica_case_is_inconclusive_and_says_so() {
    let s = Scratch::new();
    s.write(
        "spec.py",
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 2]"):
        y: "f32[8, 2]" = torch.ops.aten.clone.default(x)
        return (y,)
"#,
    );
    s.write(
        "rank.py",
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]"):
        s: "f32[2, 2]" = torch.ops.aten.sin.default(x)
        c: "f32[2, 2]" = torch.ops.aten.cos.default(x)
        s2: "f32[2, 2]" = torch.ops.aten.mul.Tensor(s, s)
        c2: "f32[2, 2]" = torch.ops.aten.mul.Tensor(c, c)
        one: "f32[2, 2]" = torch.ops.aten.add.Tensor(s2, c2)
        y: "f32[2, 2]" = torch.ops.aten.mul.Tensor(x, one)
        return (y,)
"#,
    );
    s.write(
        "case.yaml",
        "version: 1\nname: pythagoras\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 4 }\n  graphs: [rank.py, rank.py, rank.py, rank.py]\ninputs:\n  x: Shard(0)\noutputs:\n  y: Shard(0)\n",
    );
    let out = s.run(&["prove", "case.yaml"]);
    out.expect_code(3);
    let undecided = "through the mesh-dim reduction along dp (4 -> 2) it is undecided: ";
    let kept: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("mesh kept: "))
        .collect();
    assert_eq!(kept.len(), 1, "{}", out.stdout);
    assert!(kept[0].contains(undecided), "{}", out.stdout);
    assert!(
        out.stdout.lines().any(|l| l.starts_with("inconclusive: ")),
        "{}",
        out.stdout
    );
    // Named once: the verdict line carries the case's own reason only.
    assert_eq!(out.stdout.matches(undecided).count(), 1, "{}", out.stdout);
    let json = s.run(&["prove", "case.yaml", "--json"]);
    json.expect_code(3);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["verdict"], "inconclusive", "{}", json.stdout);
    assert!(
        v["mesh_kept"]
            .as_str()
            .is_some_and(|m| m.contains(undecided)),
        "{}",
        json.stdout
    );
    // The case as written: counted on its own four ranks.
    assert_eq!(v["counted_on"]["case"], "as-written", "{}", json.stdout);
}

/// A dp=2 rank averages its loss over its own 2 rows, so its activation gradient `h` is twice
/// the spec's rows (the spec's `1/4` against the rank's `1/2`): `scale: 2` on the cut states
/// it, and the case is proved in stages; `scale: 3` (and no scale) is refuted. The other
/// engines refuse a case with a scale, pointing at it.
#[test]
fn a_scaled_cut_is_proved_and_the_wrong_scale_refuted() {
    let s = Scratch::new();
    s.write(
        "spec.py",
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 2]"):
        h: "f32[4, 2]" = torch.ops.aten.mul.Tensor(x, 0.25)
        y: "f32[4, 2]" = torch.ops.aten.mul.Tensor(h, 3)
        return (y,)
"#,
    );
    s.write(
        "rank.py",
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]"):
        h: "f32[2, 2]" = torch.ops.aten.mul.Tensor(x, 0.5)
        g: "f32[2, 2]" = torch.ops.aten.mul.Tensor(h, 3)
        y: "f32[2, 2]" = torch.ops.aten.div.Tensor(g, 2)
        return (y,)
"#,
    );
    let case = |h: &str| {
        format!("version: 1\nname: scaled\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: 2 }}\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Shard(0)\n  h: {h}\noutputs:\n  y: Shard(0)\n")
    };
    s.write("right.yaml", &case("{ placement: Shard(0), scale: 2 }"));
    s.write("wrong.yaml", &case("{ placement: Shard(0), scale: 3 }"));
    s.write("plain.yaml", &case("Shard(0)"));
    let out = s.run(&["prove", "right.yaml"]);
    out.expect_code(0);
    let out = s.run(&["prove", "wrong.yaml"]);
    out.expect_code(1);
    assert!(out.stdout.contains("`h`"), "{}", out.stdout);
    s.run(&["prove", "plain.yaml"]).expect_code(1);
    // Line 10, column 36: the value of `scale`.
    let out = s.run(&["check", "right.yaml"]);
    out.expect_code(2);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("right.yaml:10:36"), "{all}");
    assert!(
        all.contains("`scale` on the input `h` is read by `shardproof prove` only"),
        "{all}"
    );
}
