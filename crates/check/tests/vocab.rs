//! The vocabulary range of a vocab-parallel embedding: masked rows are a partial sum only where
//! the mask is the rank's range and the index the id less the range's start. Wrong ranges,
//! a mask of other ids, an index shifted by another offset are never a pass; random ranges
//! run in the interpreter never hold with a wrong sum.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use shardproof_interp::{run_program, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::values::{close, random};

/// A vocab-parallel embedding on `tp = n` with a table of `n * l` rows: the ranks' range
/// starts `lo`, ends `hi`, index offsets `off`, and whether the mask reads other ids (`ids2`).
fn embedding(n: usize, l: usize, lo: &[i64], hi: &[i64], off: &[i64], other_ids: bool) -> String {
    let lits = |xs: &[i64]| {
        format!(
            "tp[{}]",
            xs.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mask_ids = if other_ids { "ids2" } else { "ids" };
    format!(
        "mesh tp={n}\n\
         input ids: i64[6] tp=Replicate()\n\
         input ids2: i64[6] tp=Replicate()\n\
         input w: f64[{v}, 3] tp=Shard(0)\n\
         below = lt({mask_ids}, {lo})\n\
         above = ge({mask_ids}, {hi})\n\
         mask = bitwise_or(below, above)\n\
         local = sub(ids, {off})\n\
         idx = masked_fill(local, mask, 0)\n\
         e = embedding(w, idx)\n\
         m = unsqueeze(mask, 1)\n\
         z = masked_fill(e, m, 0.0)\n\
         y = all_reduce(z, sum, tp)\n\
         output y tp=Replicate()\n",
        v = n * l,
        lo = lits(lo),
        hi = lits(hi),
        off = lits(off),
    )
}

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("vocab.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_rank_range_holds() {
    let r = check(&embedding(2, 8, &[0, 8], &[8, 16], &[0, 8], false));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn wrong_ranges_are_never_a_pass() {
    for (lo, hi, off) in [
        // Overlapping ranges: ids 4..8 counted twice.
        ([0, 4], [8, 12], [0, 4]),
        // A range that masks nothing on either rank.
        ([0, 1], [100, 101], [0, 8]),
        // The right ranges, the index shifted by another offset.
        ([0, 8], [8, 16], [0, 4]),
    ] {
        let r = check(&embedding(2, 8, &lo, &hi, &off, false));
        assert_eq!(
            r.verdict,
            Verdict::Inconclusive,
            "{lo:?} {hi:?} {off:?}: {}",
            r.render()
        );
        assert!(
            r.unknown
                .iter()
                .any(|u| u.reason.contains("vocabulary range")),
            "{}",
            r.render()
        );
    }
}

#[test]
fn a_mask_of_other_ids_is_never_a_pass() {
    let r = check(&embedding(2, 8, &[0, 8], &[8, 16], &[0, 8], true));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

/// A mask reshaped otherwise than the index: the mask's positions are not the lookup's.
#[test]
fn a_mask_reshaped_otherwise_is_never_a_pass() {
    let text = "mesh tp=2\n\
         input ids: i64[2, 3] tp=Replicate()\n\
         input w: f64[16, 3] tp=Shard(0)\n\
         below = lt(ids, tp[0, 8])\n\
         above = ge(ids, tp[8, 16])\n\
         mask = bitwise_or(below, above)\n\
         local = sub(ids, tp[0, 8])\n\
         idx = masked_fill(local, mask, 0)\n\
         e = embedding(w, idx)\n\
         mt = t(mask)\n\
         mv = view(mt, [2, 3])\n\
         m = unsqueeze(mv, 2)\n\
         z = masked_fill(e, m, 0.0)\n\
         y = all_reduce(z, sum, tp)\n\
         output y tp=Replicate()\n";
    let r = check(text);
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

/// Random ranges (mostly the rank's, sometimes shifted) on 2-4 ranks, run in the
/// interpreter: a program that holds sums to the table's rows of the ids on every rank.
#[test]
fn random_ranges_never_hold_with_a_wrong_sum() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut held, mut refused) = (0, 0);
    for _ in 0..120 {
        let n = rng.random_range(2..=4usize);
        let l = rng.random_range(1..=4usize);
        let v = n * l;
        // Rank-dependent literals are written without a sign: nudges stay at 0 or above.
        let nudge = |x: i64, rng: &mut ChaCha8Rng| {
            if rng.random_bool(0.85) {
                x
            } else {
                (x + rng.random_range(-2..=2i64)).max(0)
            }
        };
        let lo: Vec<i64> = (0..n).map(|r| nudge((r * l) as i64, &mut rng)).collect();
        let hi: Vec<i64> = (0..n)
            .map(|r| nudge(((r + 1) * l) as i64, &mut rng))
            .collect();
        let off: Vec<i64> = (0..n).map(|r| nudge((r * l) as i64, &mut rng)).collect();
        let text = embedding(n, l, &lo, &hi, &off, false);
        let case = parse_plan(Path::new("vocab.plan"), &text).unwrap();
        let report = check_case(&case).unwrap();
        let ids: Vec<f64> = (0..6).map(|_| rng.random_range(0..v) as f64).collect();
        let ids_t = Tensor::new(Meta::new(DType::I64, vec![6]), ids.clone());
        let w = random(&[v, 3], &mut rng);
        let leaves: Vec<BTreeMap<String, Tensor>> = (0..n)
            .map(|r| {
                let piece = Tensor::new(
                    Meta::new(DType::F64, vec![l, 3]),
                    w.data[r * l * 3..(r + 1) * l * 3].to_vec(),
                );
                BTreeMap::from([
                    ("ids".to_string(), ids_t.clone()),
                    ("ids2".to_string(), ids_t.clone()),
                    ("w".to_string(), piece),
                ])
            })
            .collect();
        // A shifted index can fall outside the shard: the run fails, and the check must
        // not have held.
        let Ok(envs) = run_program(&case.program, &leaves, &RunConfig::default()) else {
            assert_ne!(report.verdict, Verdict::Holds, "{text}");
            refused += 1;
            continue;
        };
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&id| w.data[id as usize * 3..id as usize * 3 + 3].to_vec())
            .collect();
        let g = &case.program.ranks[0];
        let y = g.nodes.iter().position(|nd| nd.name == "y").unwrap();
        let right = envs
            .iter()
            .all(|e| close(&e.get(ValueId::new(y, 0)).unwrap().data, &want));
        if report.verdict == Verdict::Holds {
            assert!(right, "held with a wrong sum:\n{text}");
            held += 1;
        } else {
            refused += 1;
        }
    }
    assert!(
        held >= 20 && refused >= 20,
        "held {held}, refused {refused}"
    );
}

/// The backward of vocab-parallel cross entropy and embedding on `tp = n`: the one-hot of the
/// ids over the rank's range and the gradient of the rank's table rows.
fn backward(n: usize, l: usize, lo: &[i64], hi: &[i64], off: &[i64], arange_len: usize) -> String {
    let lits = |xs: &[i64]| {
        format!(
            "tp[{}]",
            xs.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "mesh tp={n}\n\
         input ids: i64[6] tp=Replicate()\n\
         input g: f64[6, 3] tp=Replicate()\n\
         below = lt(ids, {lo})\n\
         above = ge(ids, {hi})\n\
         mask = bitwise_or(below, above)\n\
         local = sub(ids, {off})\n\
         idx = masked_fill(local, mask, 0)\n\
         u = unsqueeze(idx, 1)\n\
         um = unsqueeze(mask, 1)\n\
         cls = aten.arange.start(0, {arange_len})\n\
         hit = eq(u, cls)\n\
         keep = bitwise_not(um)\n\
         oh = bitwise_and(hit, keep)\n\
         gm = masked_fill(g, um, 0.0)\n\
         dw = embedding_dense_backward(gm, idx, {l}, -1, False)\n\
         output oh tp=Shard(1)\n\
         output dw tp=Shard(0)\n",
        lo = lits(lo),
        hi = lits(hi),
        off = lits(off),
    )
}

/// Random ranges for the backward, run in the interpreter: where the checker claims the
/// one-hot `Shard(1)` or the table gradient `Shard(0)`, the rank's values are those columns
/// of the one-hot of the ids over `n * len` classes (`len` the local classes), or those rows
/// of the table's gradient.
#[test]
fn the_backward_shards_agree_with_the_interpreter() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut claims, mut held) = (0, 0);
    for _ in 0..120 {
        let n = rng.random_range(2..=4usize);
        let l = rng.random_range(1..=4usize);
        let v = n * l;
        let nudge = |x: i64, rng: &mut ChaCha8Rng| {
            if rng.random_bool(0.85) {
                x
            } else {
                (x + rng.random_range(-2..=2i64)).max(0)
            }
        };
        let lo: Vec<i64> = (0..n).map(|r| nudge((r * l) as i64, &mut rng)).collect();
        let hi: Vec<i64> = (0..n)
            .map(|r| nudge(((r + 1) * l) as i64, &mut rng))
            .collect();
        let off: Vec<i64> = (0..n).map(|r| nudge((r * l) as i64, &mut rng)).collect();
        let len = if rng.random_bool(0.9) { l } else { l + 1 };
        let text = backward(n, l, &lo, &hi, &off, len);
        let case = parse_plan(Path::new("vocab.plan"), &text).unwrap();
        let report = check_case(&case).unwrap();
        let prop = shardproof_check::propagate(&case).unwrap();
        let ids: Vec<f64> = (0..6).map(|_| rng.random_range(0..v) as f64).collect();
        let ids_t = Tensor::new(Meta::new(DType::I64, vec![6]), ids.clone());
        let gr = random(&[6, 3], &mut rng);
        let leaves: Vec<BTreeMap<String, Tensor>> = (0..n)
            .map(|_| {
                BTreeMap::from([
                    ("ids".to_string(), ids_t.clone()),
                    ("g".to_string(), gr.clone()),
                ])
            })
            .collect();
        let Ok(envs) = run_program(&case.program, &leaves, &RunConfig::default()) else {
            assert_ne!(report.verdict, Verdict::Holds, "{text}");
            continue;
        };
        let g0 = &case.program.ranks[0];
        let node = |name: &str| g0.nodes.iter().position(|nd| nd.name == name).unwrap();
        for (r, env) in envs.iter().enumerate() {
            let oh = ValueId::new(node("oh"), 0);
            if prop.ranks[r].of(oh, 1)[0] == shardproof_check::Place::Shard(1) {
                claims += 1;
                let want: Vec<f64> = ids
                    .iter()
                    .flat_map(|&id| {
                        (r * len..(r + 1) * len).map(move |c| f64::from(id as usize == c))
                    })
                    .collect();
                assert!(close(&env.get(oh).unwrap().data, &want), "rank {r}: {text}");
            }
            let dw = ValueId::new(node("dw"), 0);
            if prop.ranks[r].of(dw, 1)[0] == shardproof_check::Place::Shard(0) {
                claims += 1;
                let mut want = vec![0.0; l * 3];
                for (p, &id) in ids.iter().enumerate() {
                    let id = id as usize;
                    if (r * l..(r + 1) * l).contains(&id) {
                        for k in 0..3 {
                            want[(id - r * l) * 3 + k] += gr.data[p * 3 + k];
                        }
                    }
                }
                assert!(close(&env.get(dw).unwrap().data, &want), "rank {r}: {text}");
            }
        }
        held += usize::from(report.verdict == Verdict::Holds);
    }
    assert!(held >= 20 && claims >= 100, "held {held}, claims {claims}");
}

/// `index_put(lookup, [mask], value)`, Megatron's `output_parallel[input_mask, :] = 0.0`.
fn index_put_lookup(mask: &str, value: &str, accumulate: &str) -> String {
    format!(
        "mesh tp=2\n\
         input w: f32[8, 3] tp=Shard(0)\n\
         input ids: i64[4] tp=Replicate()\n\
         below = lt(ids, tp[0, 4])\n\
         above = ge(ids, tp[4, 8])\n\
         mask = bitwise_or(below, above)\n\
         other = ge(ids, tp[0, 1])\n\
         local = sub(ids, tp[0, 4])\n\
         idx = masked_fill(local, mask, 0)\n\
         e = embedding(w, idx)\n\
         z = zeros([])\n\
         c = scalar_tensor(5.0)\n\
         y = index_put(e, [{mask}], {value}{accumulate})\n\
         r = all_reduce(y, sum, tp)\n\
         output r tp=Replicate()\n"
    )
}

/// Zeroing the rank's out-of-range rows by `index_put` holds; a value not proven zero, a mask
/// that is not the rank's range, or an accumulating write (which adds 0, zeroing nothing) is
/// never a pass. Before, any rank-dependent mask and any 0-d value held.
#[test]
fn index_put_zeroes_only_the_proven_range() {
    let r = check(&index_put_lookup("mask", "z", ""));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    for (mask, value, acc) in [
        ("mask", "c", ""),
        ("other", "z", ""),
        ("mask", "z", ", True"),
    ] {
        let r = check(&index_put_lookup(mask, value, acc));
        assert_ne!(
            r.verdict,
            Verdict::Holds,
            "{mask} {value}{acc}: {}",
            r.render()
        );
    }
}

/// Megatron's `predicted_logits = logits_2d[arange_1d, masked_target_1d]`, then zeroed at the
/// mask: one element per row of a column shard, a partial sum of each row's target logit. The
/// same pick from a row shard (the range read as columns of rows the rank does not hold
/// whole) is never a pass.
#[test]
fn the_pick_of_each_rows_target_holds_only_from_a_column_shard() {
    let plan = |x: &str, zero: &str| {
        format!(
            "mesh tp=2\n\
             input x: {x}\n\
             input ids: i64[4] tp=Replicate()\n\
             below = lt(ids, tp[0, 4])\n\
             above = ge(ids, tp[4, 8])\n\
             mask = bitwise_or(below, above)\n\
             local = sub(ids, tp[0, 4])\n\
             idx = masked_fill(local, mask, 0)\n\
             a = arange(4)\n\
             p = index(x, [a, idx])\n\
             z = zeros([])\n\
             {zero}\n\
             r = all_reduce(y, sum, tp)\n\
             output r tp=Replicate()\n"
        )
    };
    for zero in [
        "y = index_put(p, [mask], z)",
        "y = masked_fill(p, mask, 0.0)",
    ] {
        let r = check(&plan("f32[4, 8] tp=Shard(1)", zero));
        assert_eq!(r.verdict, Verdict::Holds, "{zero}: {}", r.render());
        let r = check(&plan("f32[8, 4] tp=Shard(0)", zero));
        assert_ne!(r.verdict, Verdict::Holds, "{zero}: {}", r.render());
    }
}
