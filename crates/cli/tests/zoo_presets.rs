//! `shardproof zoo emit --preset`: every tiny preset emits a case that `run` and
//! `inspect --strict` accept; flags override presets; bad presets are usage errors; shared rank
//! graphs keep cases valid.

mod common;

use common::zoo::{words, NO_FLAGS};
use common::Scratch;
use shardproof_zoo::PRESETS;

/// Emits the arguments `args` (one line) into `dir` and returns its case file's text.
fn emitted_case(s: &Scratch, dir: &str, args: &str) -> String {
    let case = s.emit_case(dir, &words(args));
    s.read(&case)
}

/// The `graphs:` line of an emitted case.
fn graphs_line(s: &Scratch, dir: &str) -> String {
    s.read(&format!("{dir}/case.yaml"))
        .lines()
        .find(|l| l.trim_start().starts_with("graphs:"))
        .expect("a graphs: line")
        .trim()
        .to_string()
}

/// Emits `args` into `dir` with shared rank graphs, checks the summary and the `graphs:` line,
/// and that `run` holds on the case.
fn check_shared(s: &Scratch, dir: &str, args: &[&str], summary: &str, graphs: &str) {
    let mut all = args.to_vec();
    all.push("--share-graphs");
    s.zoo_emit(dir, &all).expect_code(0).stdout_has(&[summary]);
    assert_eq!(graphs_line(s, dir), graphs);
    s.run(&["run", &format!("{dir}/case.yaml"), "--quiet"])
        .expect_code(0)
        .stdout_has(&["verdict: holds"]);
}

/// The tiny preset emits with shared rank graphs, and `run` and `inspect --strict` hold.
fn check_tiny(name: &str) {
    let s = Scratch::new();
    // Pipelined ranks name their peers, so only presets without pp share graph files.
    s.zoo_emit("out", &["--preset", name])
        .expect_code(0)
        .stdout_has(&["wrote out/case.yaml (spec + "]);
    s.run(&["run", "out/case.yaml", "--quiet"])
        .expect_code(0)
        .stdout_has(&["verdict: holds"]);
    s.assert_strict("out/case.yaml");
}

/// The tiny presets this file tests, one test each (so they run in parallel).
const TESTED: &[&str] = &[
    "llama3-8b-tiny",
    "llama3-70b-tiny",
    "llama3-405b-tiny",
    "deepseek-v3-16b-tiny",
    "deepseek-v3-236b-tiny",
    "deepseek-v3-671b-tiny",
];

#[test]
fn every_tiny_preset_is_tested() {
    let tiny: Vec<&str> = PRESETS
        .iter()
        .filter(|p| p.tiny_of.is_some())
        .map(|p| p.name)
        .collect();
    assert_eq!(tiny, TESTED);
}

#[test]
fn llama3_8b_tiny_runs() {
    check_tiny("llama3-8b-tiny");
}

#[test]
fn llama3_70b_tiny_runs() {
    check_tiny("llama3-70b-tiny");
}

#[test]
fn llama3_405b_tiny_runs() {
    check_tiny("llama3-405b-tiny");
}

#[test]
fn deepseek_v3_16b_tiny_runs() {
    check_tiny("deepseek-v3-16b-tiny");
}

#[test]
fn deepseek_v3_236b_tiny_runs() {
    check_tiny("deepseek-v3-236b-tiny");
}

#[test]
fn deepseek_v3_671b_tiny_runs() {
    check_tiny("deepseek-v3-671b-tiny");
}

#[test]
fn unknown_preset_is_a_usage_error_listing_the_presets() {
    let s = Scratch::new();
    let mut expected = vec!["error: unknown preset `llama3-7b`; known: "];
    expected.extend(PRESETS.iter().map(|p| p.name));
    s.zoo_emit("out", &words("--preset llama3-7b"))
        .expect_code(2)
        .stderr_has(&expected);
    assert!(!s.path().join("out").exists(), "nothing is written");
}

#[test]
fn model_and_preset_must_agree_and_one_is_needed() {
    let s = Scratch::new();
    s.zoo_emit("out", &words("mlp --preset llama3-8b-tiny"))
        .expect_code(2)
        .stderr_has(&["preset `llama3-8b-tiny` is a llama model, not `mlp`"]);
    s.zoo_emit("out", NO_FLAGS)
        .expect_code(2)
        .stderr_has(&["give a MODEL or --preset NAME"]);
    // Naming the preset's own model is allowed.
    s.zoo_emit("out", &words("llama --preset llama3-8b-tiny"))
        .expect_code(0);
}

#[test]
fn flags_override_the_preset_and_mesh_replaces_its_plan() {
    let s = Scratch::new();
    let case = emitted_case(&s, "two", "--preset llama3-8b-tiny --layers 2 --seq 4");
    let spec = s.read("two/spec.py");
    assert!(spec.contains("wq_1: \"f32[32, 32]\""), "hidden 32 kept");
    assert!(!spec.contains("wq_2"), "2 layers");
    assert!(spec.contains("tokens: \"i64[2, 4]\""), "seq 4, batch 2");
    assert!(case.contains("name: llama3-8b-tiny-dp2\n"), "{case}");
    assert!(case.contains("# Preset `llama3-8b-tiny`"), "{case}");
    // The preset's uneven stages stand with its plan; the stage flags override them.
    let case = emitted_case(
        &s,
        "uneven",
        "--preset llama3-405b-tiny --layers 6 --seq 4 \
         --pp-first-layers 1 --pp-last-layers 1",
    );
    assert!(
        case.contains("name: llama3-405b-tiny-pp4-dp2-tp2-vp-mb2-1f1b-uneven\n"),
        "{case}"
    );
    assert!(
        case.contains(
            "(stage 0: layers 0-0, stage 1: layers 1-2, stage 2: layers 3-4, stage 3: layers 5-5)"
        ),
        "{case}"
    );
    s.zoo_emit("bad-div", &words("--preset llama3-405b-tiny --layers 6"))
        .expect_code(2)
        .stderr_has(&["more than the model's 6"]);

    // --mesh replaces the plan: no vocab parallelism unless asked for.
    let case = emitted_case(&s, "tp", "--preset llama3-70b-tiny --mesh tp=4");
    assert!(case.contains("name: llama3-70b-tiny-tp4\n"), "{case}");
    assert!(case.contains("  embed: Replicate()\n"), "{case}");
    let vp = "--preset llama3-70b-tiny --mesh tp=4 --vocab-parallel";
    // Without --mesh the preset's pipeline stands, its microbatches overridable.
    let case = emitted_case(
        &s,
        "pp",
        "--preset llama3-70b-tiny --microbatches 4 --batch 8",
    );
    assert!(
        case.contains("name: llama3-70b-tiny-pp2-dp2-tp2-vp-mb4-1f1b\n"),
        "{case}"
    );
    let case = emitted_case(&s, "vp", vp);
    assert!(case.contains("  embed: { tp: Shard(0) }\n"), "{case}");

    // Sizes the preset's plan cannot split are refused like any other.
    s.zoo_emit("bad", &words("--preset deepseek-v3-16b-tiny --experts 3"))
        .expect_code(2)
        .stderr_has(&["experts 3 is not divisible by ep = 2"]);
}

#[test]
fn shared_graphs_are_opt_in_without_a_preset_and_opt_out_with_one() {
    let s = Scratch::new();
    let vp = ["llama", "--mesh", "dp=2,tp=2", "--vocab-parallel"];
    s.zoo_emit("plain", &vp).expect_code(0);
    assert_eq!(
        graphs_line(&s, "plain"),
        "graphs: [r0.py, r1.py, r2.py, r3.py]"
    );
    // The tp ranks differ by their vocabulary range, the dp replicas not at all.
    check_shared(
        &s,
        "shared",
        &vp,
        "(spec + 4 ranks sharing 2 graph files)",
        "graphs: [r0.py, r1.py, r0.py, r1.py]",
    );
    assert!(!s.path().join("shared/r2.py").exists());
    for (a, b) in [("r0.py", "r0.py"), ("r1.py", "r1.py"), ("r2.py", "r0.py")] {
        let plain = std::fs::read(s.path().join("plain").join(a)).unwrap();
        let shared = std::fs::read(s.path().join("shared").join(b)).unwrap();
        assert_eq!(
            plain, shared,
            "{a} of the per-rank emission is {b} of the shared one"
        );
    }
    // ZeRO gives each dp rank its own program (its shard of the optimizer step).
    check_shared(
        &s,
        "zero",
        &["llama", "--mesh", "dp=2,tp=2", "--zero", "1"],
        "(spec + 4 ranks sharing 2 graph files)",
        "graphs: [r0.py, r0.py, r2.py, r2.py]",
    );

    s.zoo_emit(
        "per-rank",
        &words("--preset llama3-8b-tiny --share-graphs=false"),
    )
    .expect_code(0);
    assert_eq!(graphs_line(&s, "per-rank"), "graphs: [r0.py, r1.py]");
}

#[test]
fn list_shows_the_presets() {
    let s = Scratch::new();
    let out = s.run(&["zoo", "list"]);
    out.expect_code(0);
    let mut expected = vec!["presets (--preset NAME"];
    expected.extend(PRESETS.iter().map(|p| p.name));
    expected.extend([
        "hidden 16384, heads 128/8 kv, ffn 53248, 126 layers, seq 8192, batch 1024, vocab 128256",
        "Table 2 L3: DP 64 TP 8 PP 16, 16 microbatches, 8192 GPUs; emitted as pp=16,dp=64,tp=8 \
         --vocab-parallel --microbatches 16 --pp-schedule 1f1b --pp-first-layers 7 \
         --pp-last-layers 7",
        "256 experts top-8 moe_ffn 2048",
    ]);
    // `zoo list` wraps its columns: compare with whitespace collapsed.
    let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let listed = words(&out.stdout);
    for part in expected {
        assert!(
            listed.contains(&words(part)),
            "zoo list lacks {part:?}:\n{}",
            out.stdout
        );
    }
}
