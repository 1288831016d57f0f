//! Megatron's vocab-parallel cross entropy backward updates the logits' gradient in place at
//! the targets: `grad_2d[arange, masked_target] -= 1 - target_mask`, captured as
//! `index_put(X, [a, t], index(X, [a, t]) - rsub(mask, 1))`. The read `index(X, [a, t])` of
//! the vocabulary shard is `Unmasked`; the write-back keeps X's `Shard(1)` where the rows are
//! `arange`, `t` is the rank's masked index and the update is zero on the masked rows
//! (`vocab::update_shard`). Wrong forms are never a pass.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, plan::parse_plan, Place, Report, Verdict};
use shardproof_interp::{run_program, RunConfig};
use shardproof_ir::{DType, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::values::{close, random};

fn lits(xs: &[i64]) -> String {
    let s: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    format!("tp[{}]", s.join(", "))
}

/// The update on `tp = n` ranks with `l` local classes and 4 rows: the mask's bounds `lo`,
/// `hi` and the index's offset `off` (per coordinate), the update's constant `c` (`c - mask`), the rows index
/// (`arange(4)` or the input `rows`) and the tensor written (`x`, or `x2`).
fn update(n: usize, l: usize, [lo, hi, off]: [&[i64]; 3], c: f64, rows: &str, dst: &str) -> String {
    let v = n * l;
    format!(
        "mesh tp={n}\n\
         input x: f64[4, {v}] tp=Shard(1)\n\
         input x2: f64[4, {v}] tp=Shard(1)\n\
         input ids: i64[4] tp=Replicate()\n\
         input rows: i64[4] tp=Replicate()\n\
         below = lt(ids, {lo})\n\
         above = ge(ids, {hi})\n\
         mask = bitwise_or(below, above)\n\
         local = sub(ids, {off})\n\
         t = masked_fill(local, mask, 0)\n\
         a = arange(4)\n\
         picked = index(x, [{rows}, t])\n\
         mf = _to_copy(mask, dtype=f64)\n\
         w = rsub(mf, {c:?})\n\
         upd = sub(picked, w)\n\
         y = index_put({dst}, [{rows}, t], upd)\n\
         output y tp=Shard(1)\n",
        lo = lits(lo),
        hi = lits(hi),
        off = lits(off),
    )
}

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("ce.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

fn ranges(n: usize, l: usize) -> (Vec<i64>, Vec<i64>) {
    let lo = (0..n).map(|r| (r * l) as i64).collect();
    let hi = (0..n).map(|r| ((r + 1) * l) as i64).collect();
    (lo, hi)
}

/// The form Megatron captures holds (it was an `spmd-type` finding at the update).
#[test]
fn the_write_back_of_the_update_keeps_the_shard() {
    let (lo, hi) = ranges(2, 4);
    let r = check(&update(2, 4, [&lo, &hi, &lo], 1.0, "a", "x"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// An update that is not zero on the masked rows, rows that are not `arange`, a write into
/// another tensor, an index at another offset: never a pass.
#[test]
fn wrong_updates_are_never_a_pass() {
    let (lo, hi) = ranges(2, 4);
    let shifted = vec![0, 2];
    for (what, text) in [
        ("2 - mask", update(2, 4, [&lo, &hi, &lo], 2.0, "a", "x")),
        (
            "rows not arange",
            update(2, 4, [&lo, &hi, &lo], 1.0, "rows", "x"),
        ),
        (
            "written elsewhere",
            update(2, 4, [&lo, &hi, &lo], 1.0, "a", "x2"),
        ),
        (
            "index offset",
            update(2, 4, [&lo, &hi, &shifted], 1.0, "a", "x"),
        ),
        ("range", update(2, 4, [&lo, &[4, 6], &lo], 1.0, "a", "x")),
    ] {
        let r = check(&text);
        assert_ne!(r.verdict, Verdict::Holds, "{what}: {}", r.render());
    }
}

/// Random ranges, offsets and constants run in the interpreter: where the checker claims
/// `Shard(1)`, rank r holds columns `r*l .. (r+1)*l` of X with 1 subtracted at each row's id.
#[test]
fn the_write_back_agrees_with_the_interpreter() {
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    let (mut claims, mut refused) = (0, 0);
    for _ in 0..80 {
        let n = rng.random_range(2..=3usize);
        let l = rng.random_range(2..=3usize);
        let v = n * l;
        let nudge = |x: i64, rng: &mut ChaCha8Rng| {
            if rng.random_bool(0.85) {
                x
            } else {
                (x + rng.random_range(-1..=1i64)).max(0)
            }
        };
        let lo: Vec<i64> = (0..n).map(|r| nudge((r * l) as i64, &mut rng)).collect();
        let hi: Vec<i64> = (0..n)
            .map(|r| nudge(((r + 1) * l) as i64, &mut rng))
            .collect();
        let off: Vec<i64> = (0..n).map(|r| nudge((r * l) as i64, &mut rng)).collect();
        let c = if rng.random_bool(0.85) { 1.0 } else { 0.5 };
        let text = update(n, l, [&lo, &hi, &off], c, "a", "x");
        let case = parse_plan(Path::new("ce.plan"), &text).unwrap();
        let report = check_case(&case).unwrap();
        let prop = shardproof_check::propagate(&case).unwrap();
        let ids: Vec<f64> = (0..4).map(|_| rng.random_range(0..v) as f64).collect();
        let ids_t = Tensor::new(Meta::new(DType::I64, vec![4]), ids.clone());
        let rows_t = Tensor::new(Meta::new(DType::I64, vec![4]), vec![0.0, 1.0, 2.0, 3.0]);
        let full = random(&[4, v], &mut rng);
        let piece = |r: usize| -> Vec<f64> {
            (0..4)
                .flat_map(|i| (r * l..(r + 1) * l).map(move |j| (i, j)))
                .map(|(i, j)| full.data[i * v + j])
                .collect()
        };
        let leaves: Vec<BTreeMap<String, Tensor>> = (0..n)
            .map(|r| {
                let p = Tensor::new(Meta::new(DType::F64, vec![4, l]), piece(r));
                BTreeMap::from([
                    ("x".to_string(), p.clone()),
                    ("x2".to_string(), p),
                    ("ids".to_string(), ids_t.clone()),
                    ("rows".to_string(), rows_t.clone()),
                ])
            })
            .collect();
        let g0 = &case.program.ranks[0];
        let y = ValueId::new(g0.nodes.iter().position(|nd| nd.name == "y").unwrap(), 0);
        let claimed: Vec<bool> = (0..n)
            .map(|r| prop.ranks[r].of(y, 1)[0] == Place::Shard(1))
            .collect();
        let Ok(envs) = run_program(&case.program, &leaves, &RunConfig::default()) else {
            // An index out of the piece (a nudged offset): the program fails, no claim kept.
            assert_ne!(report.verdict, Verdict::Holds, "{text}");
            refused += 1;
            continue;
        };
        if !claimed.iter().all(|&b| b) {
            assert_ne!(report.verdict, Verdict::Holds, "{text}");
            refused += 1;
            continue;
        }
        // The single-device update: 1 subtracted at each row's id.
        let mut want = full.data.to_vec();
        for (i, &id) in ids.iter().enumerate() {
            want[i * v + id as usize] -= 1.0;
        }
        for (r, env) in envs.iter().enumerate() {
            claims += 1;
            let got = &env.get(y).unwrap().data;
            let mine: Vec<f64> = (0..4)
                .flat_map(|i| (r * l..(r + 1) * l).map(move |j| (i, j)))
                .map(|(i, j)| want[i * v + j])
                .collect();
            assert!(close(got, &mine), "rank {r}: {text}");
        }
    }
    assert!(
        claims >= 60 && refused >= 5,
        "claims {claims}, refused {refused}"
    );
}
