//! `shardproof verify` hands what relation inference and the runs leave undecided to the
//! element-level prover: a bug random inputs miss is refuted with a counterexample, a limit
//! leaves the verdict inconclusive and says so, and a refutation no run can confirm (a case
//! too large to run) gets the prover's counterexample on the shape-reduced case.

mod common;

use common::{emit_zoo, verify_exit as verify, verify_exit_with, Scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `out = where(x CMP y, x, z)`: with `ge` in the spec and `gt` in the ranks the two differ only
/// where `x == y` (and `x != z`), which random inputs never draw.
fn ties_graph(cmp: &str) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4]", y: "f32[4]", z: "f32[4]"):
        c: "b8[4]" = torch.ops.aten.{cmp}.Tensor(x, y);  y = None
        out: "f32[4]" = torch.ops.aten.where.self(c, x, z);  c = x = z = None
        return (out,)
"#
    )
}

/// A tp=2 case, both ranks replicating the spec's `where` with `rank_cmp`.
fn ties_case(s: &Scratch, rank_cmp: &str) -> PathBuf {
    s.write("spec.py", &ties_graph("ge"));
    s.write("rank.py", &ties_graph(rank_cmp));
    s.write(
        "case.yaml",
        "version: 1\nname: ties\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Replicate()\n  y: Replicate()\n  z: Replicate()\noutputs:\n  out: Replicate()\n",
    )
}

fn verify_json(case: &Path, flags: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .arg("verify")
        .arg(case)
        .arg("--json")
        .args(flags)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap_or(-1), report)
}

#[test]
fn a_bug_random_inputs_miss_is_refuted_by_the_prover() {
    let s = Scratch::new();
    let case = ties_case(&s, "gt");
    // Relations have no lemma for `ge` against `gt`, and every seeded run agrees.
    let (code, out) = verify_exit_with(&case, &["--no-prove"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("matches every output"), "{out}");
    let dir = s.path().join("cx");
    let (code, out) = verify_exit_with(&case, &["--counterexample", dir.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("decided by: prove"), "{out}");
    assert!(out.contains("the element-level prover refutes it"), "{out}");
    assert!(
        out.contains("on inputs the reference interpreter confirms"),
        "{out}"
    );
    for f in ["counterexample.json", "inputs.safetensors", "replay.py"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("counterexample.json")).unwrap())
            .unwrap();
    assert_eq!(index["output"], "out", "{index:#}");
    let (code, r) = verify_json(&case, &[]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(r["verdict"], "refuted", "{r:#}");
    assert_eq!(r["decided_by"], "prove", "{r:#}");
    assert_eq!(r["prove"]["asked"], "decide", "{r:#}");
    assert_eq!(r["prove"]["verdict"], "refuted", "{r:#}");
    let cx = &r["prove"]["counterexample"];
    assert_eq!(cx["output"], "out", "{r:#}");
    assert_ne!(cx["spec_value"], cx["rebuilt_value"], "{r:#}");
}

#[test]
fn the_correct_program_is_verified_without_the_prover() {
    let s = Scratch::new();
    let case = ties_case(&s, "ge");
    let (code, r) = verify_json(&case, &[]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["decided_by"], "relations", "{r:#}");
    assert!(r.get("prove").is_none(), "{r:#}");
}

#[test]
fn the_provers_time_limit_leaves_the_verdict_inconclusive() {
    let s = Scratch::new();
    let case = ties_case(&s, "gt");
    let (code, r) = verify_json(&case, &["--prove-time-limit", "0.000001"]);
    assert_eq!(code, 3, "{r:#}");
    assert_eq!(r["verdict"], "inconclusive", "{r:#}");
    assert_eq!(r["prove"]["verdict"], "inconclusive", "{r:#}");
    assert_eq!(r["prove"]["time_limited"], true, "{r:#}");
    let reason = r["reason"].as_str().unwrap();
    assert!(reason.contains("--prove-time-limit"), "{reason}");
}

#[test]
fn a_refutation_too_large_to_run_gets_the_provers_counterexample() {
    // 304 GB of tensors: no run confirms what relations find, the prover does on the
    // shape-reduced case.
    let s = Scratch::new();
    let case = emit_zoo(
        "mlp",
        s.path(),
        "tp=2",
        &[
            "--forward-only",
            "--hidden",
            "65536",
            "--ffn",
            "65536",
            "--batch",
            "4096",
            "--bug",
            "tp-missing-allreduce",
        ],
    );
    let (code, out) = verify(&case);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("not confirmed by a run"), "{out}");
    assert!(out.contains("the element-level prover refutes it"), "{out}");
    assert!(out.contains("at the shape-reduced sizes"), "{out}");
    let (code, r) = verify_json(&case, &[]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(r["decided_by"], "relations", "{r:#}");
    assert_eq!(r["prove"]["asked"], "confirm", "{r:#}");
    assert_eq!(r["prove"]["counterexample"]["reduced"], true, "{r:#}");
    // Without the prover the refutation stands unconfirmed, with no counterexample.
    let (code, r) = verify_json(&case, &["--no-prove"]);
    assert_eq!(code, 1, "{r:#}");
    assert!(r.get("prove").is_none(), "{r:#}");
}
