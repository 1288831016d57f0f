//! `shardproof zoo`: every emitted correct plan verifies with `run`, every planted bug is found
//! naming an output it changes, and `inspect --strict` accepts every emitted case.

mod common;

use common::zoo::{check_plan_and_bugs, words};
use common::Scratch;
use shardproof_zoo::{Bug, LlamaConfig, Site, BUGS};

/// Every correct plan of `model` on the meshes holds under `run` and `inspect --strict`; every
/// applicable catalog bug is found by `run`, naming the loss when the bug changes it and an
/// updated parameter otherwise.
fn check_model(model: &str, meshes: &[(&str, usize, usize)], vocab_parallel: bool) {
    let mut planted = 0;
    let site = |dp, tp, forward_only| Site {
        model,
        dp,
        tp,
        forward_only,
        kv_replicated: model == "llama" && LlamaConfig::default().kv_replicas(tp) > 1,
        vocab_parallel,
        sequence_parallel: false,
    };
    let s = Scratch::new();
    for &(mesh, dp, tp) in meshes {
        for forward_only in [true, false] {
            // The MLP needs two layers for the backward all-reduce between layers.
            let layers = match model {
                "mlp" if tp > 1 && !forward_only => "2",
                "mlp" => "1",
                _ => "2",
            };
            let mut args = vec![model, "--mesh", mesh, "--layers", layers];
            if forward_only {
                args.push("--forward-only");
            }
            if vocab_parallel {
                args.push("--vocab-parallel");
            }
            let dir = format!("{mesh}-{forward_only}");
            let plan_site = site(dp, tp, forward_only);
            let applies = |bug: &Bug| bug.check_applies(&plan_site).is_ok();
            planted += check_plan_and_bugs(&s, &dir, &args, applies).len();
        }
    }
    // Every catalog bug of the model (and of this vocab layout) was planted in the matrix (the
    // training bugs, which need training flags, in zoo_train.rs; the pipeline bugs in
    // zoo_pp.rs; the context-parallel bugs in zoo_cp.rs).
    for bug in BUGS.iter().filter(|b| b.models.contains(&model)) {
        if bug.needs_vocab_parallel != vocab_parallel
            || bug.needs_training()
            || bug.needs_pipeline()
            || bug.needs_cp()
        {
            continue;
        }
        assert!(
            meshes.iter().any(|&(_, dp, tp)| [true, false]
                .iter()
                .any(|&fw| bug.check_applies(&site(dp, tp, fw)).is_ok())),
            "{model}: bug {} is never planted",
            bug.id
        );
    }
    assert!(planted > 0);
}

const MESHES: &[(&str, usize, usize)] = &[
    ("tp=2", 1, 2),
    ("dp=2", 2, 1),
    ("dp=2,tp=2", 2, 2),
    ("tp=4", 1, 4),
];

#[test]
fn mlp_correct_plans_hold_and_bugs_are_found() {
    check_model("mlp", MESHES, false);
}

#[test]
fn llama_correct_plans_hold_and_bugs_are_found() {
    // tp=4 exceeds the 2 kv heads of the tiny size: kv heads are replicated over rank pairs.
    check_model("llama", MESHES, false);
    // 8 ranks: kv-head replicas inside each dp slice.
    check_model("llama", &[("dp=2,tp=4", 2, 4)], false);
}

#[test]
fn llama_vocab_parallel_plans_hold_and_bugs_are_found() {
    check_model(
        "llama",
        &[("tp=2", 1, 2), ("dp=2,tp=2", 2, 2), ("tp=4", 1, 4)],
        true,
    );
}

#[test]
fn llama_sizes_are_configurable() {
    let s = Scratch::new();
    let sizes = "llama --mesh dp=2,tp=2 --hidden 24 --heads 6 --kv-heads 2 --ffn 20 --layers 1 \
                 --seq 5 --batch 4 --vocab 11";
    let case = s.emit_case("sized", &words(sizes));
    let spec = s.read("sized/spec.py");
    assert!(
        spec.contains("tokens: \"i64[4, 5]\"") && spec.contains("embed: \"f32[11, 24]\""),
        "{spec}"
    );
    let rank = s.read("sized/r0.py");
    // 6 heads of width 4 over tp=2: 12 query rows and 4 kv rows per rank; batch 2 per dp rank.
    assert!(
        rank.contains("wq_0: \"f32[12, 24]\"") && rank.contains("wk_0: \"f32[4, 24]\""),
        "{rank}"
    );
    assert!(rank.contains("tokens: \"i64[2, 5]\""), "{rank}");
    s.assert_strict(&case);
    s.run(&["run", &case]).expect_code(0);
}

/// `text` with every run of whitespace one space: `zoo list` wraps its cells at spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn list_shows_models_and_bugs() {
    let out = Scratch::new().run(&["zoo", "list"]);
    out.expect_code(0)
        .stdout_has(&["mlp", "llama", "dp", "tp", "spec operator"]);
    let text = one_line(&out.stdout);
    for bug in BUGS {
        for field in [bug.id, bug.description] {
            assert!(text.contains(&one_line(field)), "{}: {field}", bug.id);
        }
    }
}

#[test]
fn list_bugs_prints_only_the_catalog() {
    let out = Scratch::new().run(&["zoo", "list", "--bugs"]);
    let out = &out.expect_code(0).stdout;
    assert!(
        !out.contains("models:") && out.starts_with("bugs:"),
        "{out}"
    );
    let lines: Vec<&str> = out.lines().collect();
    let header = lines
        .iter()
        .find(|l| l.trim_start().starts_with("ID "))
        .unwrap();
    let (engines_at, parallelism_at) = (
        header.find("ENGINES").unwrap(),
        header.find("PARALLELISM").unwrap(),
    );
    let starts_row = |l: &str, id: &str| l.trim_start().starts_with(&format!("{id} "));
    for bug in BUGS {
        let at = lines
            .iter()
            .position(|l| starts_row(l, bug.id))
            .unwrap_or_else(|| panic!("{} missing\n{out}", bug.id));
        // The row: its id line and the lines continuing its wrapped cells.
        let row_end = at
            + 1
            + lines[at + 1..]
                .iter()
                .take_while(|l| {
                    l.len() > engines_at && l.get(..engines_at).is_some_and(|p| p.trim().is_empty())
                })
                .count();
        let cell = |from: usize, to: usize| {
            let parts: Vec<&str> = lines[at..row_end]
                .iter()
                .map(|l| l.get(from..to.min(l.len())).unwrap_or("").trim())
                .collect();
            one_line(&parts.join(" "))
        };
        assert_eq!(cell(engines_at, parallelism_at), bug.engines, "{}", bug.id);
        assert_eq!(
            cell(parallelism_at, usize::MAX),
            bug.parallelism,
            "{}",
            bug.id
        );
        // The details below the row, up to the next bug's row.
        let block_end = lines[row_end..]
            .iter()
            .position(|l| BUGS.iter().any(|b| starts_row(l, b.id)))
            .map_or(lines.len(), |n| row_end + n);
        let details = one_line(&lines[row_end..block_end].join("\n"));
        for field in [bug.spec_op, bug.source, bug.description] {
            assert!(
                details.contains(&one_line(field)),
                "{}: {field}\n{details}",
                bug.id
            );
        }
    }
}

#[test]
fn invalid_requests_exit_2() {
    let s = Scratch::new();
    for (request, word) in [
        ("gpt9", "unknown model `gpt9`"),
        ("mlp --bug nope", "unknown bug `nope`"),
        ("mlp --mesh tp:2", "--mesh"),
        ("mlp --mesh zz=2", "unknown mesh dim `zz`"),
        ("mlp --mesh tp=2 --bug wrong-group", "dp mesh dim"),
        (
            "mlp --heads 4",
            "--heads applies to the llama and gpt2 models",
        ),
        ("llama --mesh tp=3", "heads 4 is not divisible by tp = 3"),
        (
            "mlp --vocab-parallel",
            "vocab parallelism applies to the llama model",
        ),
        ("llama --kv-heads 0", "kv_heads must be at least 1"),
        (
            "llama --bug llama-kv-grad-unsynced",
            "tp larger than the kv heads",
        ),
    ] {
        s.assert_emit_refused(request, word);
    }
}
