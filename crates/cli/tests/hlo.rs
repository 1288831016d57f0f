//! JAX programs as XLA HLO text, end to end: the fixtures `python/hlo/capture.py` wrote into
//! `crates/import/tests/fixtures/hlo/` (a tensor-parallel MLP and transformer block with
//! `NamedSharding` on 1, 2 and 4 host devices, and a `shard_map` MLP and block whose `psum` is
//! dropped) through `inspect --strict`, `run` and `verify`. No JAX is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../import/tests/fixtures/hlo")
}

/// Exit code and stdout + stderr of `shardproof ARGS... CASE`.
fn shardproof(args: &[&str], file: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(args)
        .arg(dir().join(file))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[track_caller]
fn expect(args: &[&str], file: &str, code: i32, has: &[&str]) -> String {
    let (c, out) = shardproof(args, file);
    assert_eq!(
        c, code,
        "shardproof {args:?} {file}: expected exit {code}, got {c}\n{out}"
    );
    for h in has {
        assert!(
            out.contains(h),
            "shardproof {args:?} {file}: expected `{h}` in\n{out}"
        );
    }
    out
}

#[test]
fn inspect_strict_parses_every_hlo_fixture_and_case() {
    let mut n = 0;
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if !(name.ends_with(".hlo") || name.ends_with(".yaml")) {
            continue;
        }
        expect(
            &["inspect", "--strict"],
            &name,
            0,
            &["clean: every line parsed, no opaque operator, every shape agrees"],
        );
        n += 1;
    }
    assert!(n >= 30, "{n} files");
}

#[test]
fn inspect_shows_hlo_groups_and_line_coverage() {
    let out = expect(
        &["inspect"],
        "mlp.tp2.dev1.hlo",
        0,
        &[
            "inputs (3): arg0: f32[8, 16], arg1: f32[16, 16], arg2: f32[16, 16]",
            "outputs (1): out0: f32[8, 16]",
            "collectives: all_reduce on group \"hlo{{0,1}}\" x1",
            "0 unparsed",
        ],
    );
    assert!(!out.contains("hlo."), "nothing opaque:\n{out}");
}

#[test]
fn run_holds_on_the_correct_plans() {
    for case in [
        "mlp.tp1.yaml",
        "mlp.tp2.yaml",
        "mlp.tp4.yaml",
        "block.tp1.yaml",
        "block.tp2.yaml",
        "block.tp4.yaml",
    ] {
        expect(&["run"], case, 0, &["verdict: holds"]);
    }
}

#[test]
fn run_catches_the_dropped_psum() {
    for case in [
        "mlp_bug.tp2.yaml",
        "mlp_bug.tp4.yaml",
        "block_bug.tp2.yaml",
        "block_bug.tp4.yaml",
    ] {
        expect(
            &["run"],
            case,
            1,
            &["verdict: violated", "out0", "MISMATCH"],
        );
    }
}

#[test]
fn verify_proves_the_correct_mlp_plans() {
    for case in ["mlp.tp1.yaml", "mlp.tp2.yaml", "mlp.tp4.yaml"] {
        expect(&["verify"], case, 0, &["verified: jax-mlp-tp"]);
    }
}

#[test]
fn verify_refutes_the_dropped_psum_at_the_second_matmul_in_the_users_file() {
    for (case, partial) in [
        ("mlp_bug.tp2.yaml", "sum(r0.out0, r1.out0)"),
        (
            "mlp_bug.tp4.yaml",
            "sum(r0.out0, r1.out0, r2.out0, r3.out0)",
        ),
    ] {
        expect(
            &["verify"],
            case,
            1,
            &[
                "refuted: jax-mlp_bug-tp",
                "relations stop at spec operator `out0` (aten.mm.default)",
                // The report points at the Python source the HLO metadata names.
                "python/hlo/capture.py:",
                " in mlp",
                partial,
                "decided by: counterexample",
            ],
        );
    }
}

/// The block's per-device programs compute softmax as `exp * (1 / sum)` where the spec writes
/// `exp / sum` (`div-as-reciprocal-product`), and relu as `maximum(x, 0)` over the unreshaped
/// column shards (`elementwise-with-scalars-through-view`): relations alone rebuild the output.
#[test]
fn verify_proves_the_correct_block_plans_by_relations() {
    for case in ["block.tp1.yaml", "block.tp2.yaml", "block.tp4.yaml"] {
        expect(
            &["verify"],
            case,
            0,
            &["verified: jax-block-tp", "decided by: relations"],
        );
    }
}

/// A `shard_map` block whose attention output projection is added to the residual without its
/// `psum`: refuted at the residual add in the user's source, the partial sum named.
#[test]
fn verify_refutes_the_blocks_dropped_psum_at_the_attention_residual() {
    for (case, partial) in [
        (
            "block_bug.tp2.yaml",
            "sum(r0.bitcast_13_reshape, r1.bitcast_13_reshape)",
        ),
        (
            "block_bug.tp4.yaml",
            "r2.bitcast_20_reshape, r3.bitcast_20_reshape)",
        ),
    ] {
        expect(
            &["verify"],
            case,
            1,
            &[
                "refuted: jax-block_bug-tp",
                "relations stop at spec operator `add_17` (aten.add.Tensor)",
                // `x = x + jnp.einsum("bqhk,hkd->bqd", o, wo)` in `block`.
                "python/hlo/capture.py:65 in block",
                partial,
                "is an unreduced partial sum",
                "decided by: relations",
            ],
        );
    }
}
