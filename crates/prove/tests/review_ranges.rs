//! Adversarial review of the index range analysis (`exec/range.rs`: `within`, the split of a
//! product on its boolean atoms, the intervals of `max`/`min` clamps) and of what feeds it:
//! each case is a rank program whose index the analysis must not show inside the rows when
//! some valid input takes it out (or to another row than the spec's), checked against the
//! interpreter; or a right program that must stay proved.
//!
//! The fixtures: a `tp = 2` mesh whose two ranks run the same graph on replicated inputs (the
//! index arithmetic is the rank's; the collectives do not matter here), a table `w` of `V`
//! rows looked up at `T` tokens.

#[path = "common/tokens.rs"]
mod tokens;
use shardproof_prove::{prove_case, Verdict};
use tokens::{assert_none_proved, full_size, report, run_both, write_case};

const SPEC_LOOKUP: &str = "        out: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        return (out,)\n";

/// An index narrowed through `uint8` and widened back: on a table of 257 rows token 256 is
/// row 0 on the ranks (the cast wraps, as torch's does) and row 256 in the spec. The
/// prover takes an integer-to-integer cast as the identity, so the ranks' index is the
/// token itself, shown within the rows.
#[test]
fn an_index_narrowed_through_uint8_is_not_proved() {
    let rows = 257;
    let rank = "        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        wide: \"i64[2]\" = torch.ops.aten._to_copy.default(narrow, dtype = torch.int64)\n        out: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, wide)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, SPEC_LOOKUP, rank);
    let (spec, rank) = run_both(&case, rows, &[256.0, 1.0]);
    assert_ne!(Ok(spec), rank, "the wrapped index reads another row");
    assert_none_proved(&case);
}

/// An index `(t >= 256) & t` (a bool and an integer, promoted to `int64`: the bitwise and of
/// 0 or 1 with the token) into a table of 257 rows; the spec reads row `t >= 256`. Token 256
/// is row 0 on the ranks (`1 & 256 = 0`) and row 1 in the spec; every other token agrees, so
/// a run on random tokens rarely tells them apart. The prover reads `bitwise_and` on
/// integers as the logical and (`[t >= 256]·[t != 0]`), the spec's index exactly.
#[test]
fn an_index_from_a_bitwise_and_of_integers_is_not_proved() {
    let rows = 257;
    let spec = "        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        top: \"b8[2]\" = torch.ops.aten.ge.Scalar(tokens, 256)\n        bit: \"i64[2]\" = torch.ops.aten._to_copy.default(top, dtype = torch.int64)\n        look: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, bit)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let rank = "        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        top: \"b8[2]\" = torch.ops.aten.ge.Scalar(tokens, 256)\n        bit: \"i64[2]\" = torch.ops.aten.bitwise_and.Tensor(top, tokens)\n        look: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, bit)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, spec, rank);
    let (spec, rank) = run_both(&case, rows, &[256.0, 1.0]);
    assert_ne!(
        Ok(spec),
        rank,
        "token 256 is row 0 on the ranks, row 1 in the spec"
    );
    assert_none_proved(&case);
}

/// `clamp(t, min = 5, max = 4)` with its bounds swapped is 4 for every token (torch: `max`
/// wins), one past a 4-row table: the interval of `min(max(t, 5), 4)` is `[4, 4]`, refused.
#[test]
fn a_clamp_with_swapped_bounds_past_the_rows_is_not_proved() {
    let rows = 4;
    let spec = "        out: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        return (out,)\n";
    let rank = "        c: \"i64[2]\" = torch.ops.aten.clamp.default(tokens, 5, 4)\n        part: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, c)\n        z: \"f32[2, 2]\" = torch.ops.aten.mul.Tensor(part, 0.0)\n        e: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(e, z)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, spec, rank);
    let (_, rank_run) = run_both(&case, rows, &[0.0, 1.0]);
    assert!(rank_run.is_err(), "{rank_run:?}");
    assert_none_proved(&case);
}

/// An index `~~t` (the bitwise not twice: `t` on integers) where the spec reads row
/// `t != 0`: token 2 is row 2 on the ranks and row 1 in the spec. The prover reads
/// `bitwise_not` on integers as the logical not, so `~~t` is `[t != 0]`, the spec's index.
#[test]
fn an_index_from_a_bitwise_not_of_integers_is_not_proved() {
    let rows = 4;
    let spec = "        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        nz: \"b8[2]\" = torch.ops.aten.ne.Scalar(tokens, 0)\n        bit: \"i64[2]\" = torch.ops.aten._to_copy.default(nz, dtype = torch.int64)\n        look: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, bit)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let rank = "        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        n1: \"i64[2]\" = torch.ops.aten.bitwise_not.default(tokens)\n        n2: \"i64[2]\" = torch.ops.aten.bitwise_not.default(n1)\n        look: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, n2)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, spec, rank);
    let (spec, rank) = run_both(&case, rows, &[2.0, 1.0]);
    assert_ne!(
        Ok(spec),
        rank,
        "token 2 is row 2 on the ranks, row 1 in the spec"
    );
    assert_none_proved(&case);
}

/// The right program with `~~t` as its index (the bitwise not twice on integers is the
/// token) stays proved: `~x` on integers is `-x - 1`.
#[test]
fn an_index_through_two_bitwise_nots_is_proved() {
    let rows = 4;
    let rank = "        n1: \"i64[2]\" = torch.ops.aten.bitwise_not.default(tokens)\n        n2: \"i64[2]\" = torch.ops.aten.bitwise_not.default(n1)\n        out: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, n2)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, SPEC_LOOKUP, rank);
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
}

/// The right narrowing casts stay proved: tokens of a 256-row table through `uint8` and back,
/// and through `int32`, keep their values (every token lies in the target type's range).
#[test]
fn an_index_narrowed_within_its_type_is_proved() {
    let rows = 256;
    for dtype in ["uint8", "int32"] {
        let short = if dtype == "uint8" { "u8" } else { "i32" };
        let rank = format!("        narrow: \"{short}[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.{dtype})\n        wide: \"i64[2]\" = torch.ops.aten._to_copy.default(narrow, dtype = torch.int64)\n        out: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, wide)\n        return (out,)\n");
        let dir = tempfile::tempdir().unwrap();
        let case = write_case(dir.path(), rows, SPEC_LOOKUP, &rank);
        let proof = prove_case(&case, &full_size());
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{dtype}: {}",
            report(&proof)
        );
    }
}

/// A token narrowed to `uint8` (every token of a 256-row lookup fits) and shifted by one *in
/// `uint8`*, then widened: token 255 is `255 + 1 = 0` on the ranks (the add wraps) and row
/// 256 of a 257-row table in the spec (`t + 1` in `int64`). The cast keeps the value, but the
/// prover's `add` on `uint8` is exact, so the index is `t + 1`, within 257 rows.
#[test]
fn an_index_shifted_in_uint8_is_not_proved() {
    let rows = 257;
    let spec = "        s: \"f32[256, 2]\" = torch.ops.aten.slice.Tensor(w, 0, 0, 256)\n        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(s, tokens)\n        up: \"i64[2]\" = torch.ops.aten.add.Tensor(tokens, 1)\n        look: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, up)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let rank = "        s: \"f32[256, 2]\" = torch.ops.aten.slice.Tensor(w, 0, 0, 256)\n        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(s, tokens)\n        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        up8: \"u8[2]\" = torch.ops.aten.add.Tensor(narrow, 1)\n        up: \"i64[2]\" = torch.ops.aten._to_copy.default(up8, dtype = torch.int64)\n        look: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, up)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, spec, rank);
    let (spec, rank) = run_both(&case, rows, &[255.0, 1.0]);
    assert_ne!(Ok(spec), rank, "token 255 + 1 wraps to row 0 on the ranks");
    assert_none_proved(&case);
}

/// A comparison on a `uint8` sum, `(u + 1) > 0` with `u` the token as `uint8`: false for
/// token 255 (the add wraps to 0), so the ranks read row 0 there where the spec reads row
/// 255. The prover's `uint8` add is exact: `u + 1 > 0` always, the index is the token. No
/// cast follows the add, so a check on casts alone does not see it.
#[test]
fn a_mask_from_a_uint8_sum_is_not_proved() {
    let rows = 256;
    let rank = "        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        up: \"u8[2]\" = torch.ops.aten.add.Tensor(narrow, 1)\n        pos: \"b8[2]\" = torch.ops.aten.gt.Scalar(up, 0)\n        idx: \"i64[2]\" = torch.ops.aten.where.ScalarOther(pos, tokens, 0)\n        out: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, idx)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, SPEC_LOOKUP, rank);
    let (spec, rank) = run_both(&case, rows, &[255.0, 1.0]);
    assert_ne!(Ok(spec), rank, "token 255 is row 0 on the ranks");
    assert_none_proved(&case);
}

/// An integer tensor raised to a negative power, then multiplied by 0: torch (and the
/// interpreter) refuse `Integers to negative integer powers` on every input, so the ranks
/// never compute. The prover's `t^-1 · 0` would be 0 and the ranks' output the spec's
/// lookup: it must not be proved (it is not).
#[test]
fn an_integer_to_a_negative_power_is_not_proved() {
    let rows = 4;
    let rank = "        p: \"i64[2]\" = torch.ops.aten.pow.Tensor_Scalar(tokens, -1)\n        z: \"i64[2]\" = torch.ops.aten.mul.Tensor(p, 0)\n        zf: \"f32[2]\" = torch.ops.aten._to_copy.default(z, dtype = torch.float32)\n        zc: \"f32[2, 1]\" = torch.ops.aten.unsqueeze.default(zf, 1)\n        e: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(e, zc)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, SPEC_LOOKUP, rank);
    let (_, rank_run) = run_both(&case, rows, &[2.0, 1.0]);
    assert!(
        rank_run
            .as_ref()
            .is_err_and(|e| e.contains("negative integer powers")),
        "{rank_run:?}"
    );
    assert_none_proved(&case);
}

/// The sum of a `uint8` tensor is an `int64` (torch promotes), so it does not wrap again: the
/// sum of `uint8(t) + 1` over the tokens, less the tokens' sum and 2, is 0 in the prover's
/// exact arithmetic and -256 on the ranks when a token is 255 (its `+ 1` wrapped to 0). Added
/// to the lookup, the ranks' output differs from the spec's there.
#[test]
fn a_sum_of_a_uint8_tensor_is_not_proved() {
    let rows = 256;
    let rank = "        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        up: \"u8[2]\" = torch.ops.aten.add.Tensor(narrow, 1)\n        s: \"i64[]\" = torch.ops.aten.sum.default(up)\n        st: \"i64[]\" = torch.ops.aten.sum.default(tokens)\n        d0: \"i64[]\" = torch.ops.aten.sub.Tensor(s, st)\n        d: \"i64[]\" = torch.ops.aten.sub.Tensor(d0, 2)\n        df: \"f32[]\" = torch.ops.aten._to_copy.default(d, dtype = torch.float32)\n        e: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(e, df)\n        return (out,)\n";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), rows, SPEC_LOOKUP, rank);
    let (spec, rank) = run_both(&case, rows, &[255.0, 1.0]);
    assert_ne!(
        Ok(spec),
        rank,
        "token 255's wrapped + 1 makes the sum 256 short"
    );
    assert_none_proved(&case);
}
