//! The decision by cases on an index symbol (`decide/split.rs`) on vocab-parallel embeddings
//! built as the symbolic executor builds them (`lt`, `ge`, `bitwise_or`, `sub`, `masked_fill`,
//! `embedding`, the all-reduce's sum): the correct layouts on 2 and 4 ranks are proved, every
//! planted layout bug (an offset of the wrong rank, a mask off by one, overlapping ranges, a
//! gap, the all-reduce missing) is refuted with a witness that direct evaluation confirms, and
//! on random layouts, right or wrong, a proof is checked against every token value.

use num_rational::BigRational as Rat;
use proptest::prelude::*;
use shardproof_prove::decide::{decide, DecideConfig, Layer, Outcome};
use shardproof_prove::eval::ExactEval;
use shardproof_prove::expr::{Arena, Coeff, ExprId, Func, SymbolKind};

/// One rank's part of the embedding: it masks tokens outside `[lo, hi)` (with `<=` for the
/// lower test where `off_by_one`), looks up `token - shift` in the rows it holds, `start..start
/// + rows` of the table, and zeroes the masked tokens' rows.
#[derive(Clone, Copy, Debug)]
struct Rank {
    lo: i64,
    hi: i64,
    shift: i64,
    start: usize,
    rows: usize,
    off_by_one: bool,
}

impl Rank {
    /// The rank of a correct layout: its range and its rows are the same.
    fn exact(lo: usize, hi: usize) -> Rank {
        Rank {
            lo: lo as i64,
            hi: hi as i64,
            shift: lo as i64,
            start: lo,
            rows: hi - lo,
            off_by_one: false,
        }
    }

    /// The rank's value at token `t` for a table `table`, as the interpreter computes it:
    /// `None` where the lookup leaves the rank's rows (the kernel fails).
    fn value(&self, t: i64, table: &[Rat]) -> Option<Rat> {
        let below = if self.off_by_one {
            t <= self.lo
        } else {
            t < self.lo
        };
        let outside = below || t >= self.hi;
        let local = if outside { 0 } else { t - self.shift };
        let row = usize::try_from(local).ok().filter(|&i| i < self.rows)?;
        let entry = table.get(self.start + row)?.clone();
        Some(if outside {
            Rat::from_integer(0.into())
        } else {
            entry
        })
    }
}

/// `1 - eq0(x)`: the executor's truth value of `x` (as `bitwise_or` reads its operands).
fn truthy(ar: &mut Arena, x: ExprId) -> ExprId {
    let z = ar.app(Func::IsZero, vec![x]).unwrap();
    ar.not(z).unwrap()
}

/// The rank's output element, built as the executor builds the zoo's vocab-parallel
/// embedding (one hidden column).
fn rank_value(ar: &mut Arena, token: ExprId, table: &[ExprId], r: &Rank) -> ExprId {
    let lo = ar.int(r.lo).unwrap();
    let hi = ar.int(r.hi).unwrap();
    let below = if r.off_by_one {
        ar.ge(lo, token).unwrap()
    } else {
        ar.gt(lo, token).unwrap()
    };
    let above = ar.ge(token, hi).unwrap();
    let (tb, ta) = (truthy(ar, below), truthy(ar, above));
    let s = ar.add(tb, ta).unwrap();
    let p = ar.mul(tb, ta).unwrap();
    let outside = ar.sub(s, p).unwrap();
    let shift = ar.int(r.shift).unwrap();
    let shifted = ar.sub(token, shift).unwrap();
    let zero = ar.int(0).unwrap();
    let ids = ar.select(outside, zero, shifted).unwrap();
    let mut args = vec![ids];
    args.extend_from_slice(&table[r.start..r.start + r.rows]);
    let rows = ar.app(Func::Lookup, args).unwrap();
    ar.select(outside, zero, rows).unwrap()
}

/// An arena with the token (an index below `vocab`) and a table of `vocab` reals; the spec's
/// `lookup(token, table)` and the ranks' all-reduced sum.
struct Embedding {
    ar: Arena,
    spec: ExprId,
    ranks: ExprId,
    vocab: usize,
}

fn embedding(vocab: usize, ranks: &[Rank]) -> Embedding {
    let mut ar = Arena::default();
    let token = ar.symbol("token", SymbolKind::Index(vocab as u32)).unwrap();
    let table: Vec<ExprId> = (0..vocab)
        .map(|i| ar.symbol(&format!("e{i}"), SymbolKind::Real).unwrap())
        .collect();
    let mut args = vec![token];
    args.extend_from_slice(&table);
    let spec = ar.app(Func::Lookup, args).unwrap();
    let parts: Vec<ExprId> = ranks
        .iter()
        .map(|r| rank_value(&mut ar, token, &table, r))
        .collect();
    let sum = ar.sum(&parts).unwrap();
    Embedding {
        ar,
        spec,
        ranks: sum,
        vocab,
    }
}

/// The correct layout of `vocab` rows on `n` ranks (the last rank takes the remainder).
fn layout(vocab: usize, n: usize) -> Vec<Rank> {
    let per = vocab / n;
    (0..n)
        .map(|r| Rank::exact(r * per, if r + 1 == n { vocab } else { (r + 1) * per }))
        .collect()
}

/// Z3 off: the split alone must decide these (the tables are small enough for it).
fn cfg() -> DecideConfig {
    DecideConfig {
        z3_timeout: None,
        ..DecideConfig::default()
    }
}

/// Both sides at a point by the programs' own semantics (the spec's lookup and the ranks'
/// sum): `None` where a rank's lookup leaves its rows.
fn direct(ranks: &[Rank], t: i64, table: &[Rat]) -> (Rat, Option<Rat>) {
    let spec = table[t as usize].clone();
    let sum = ranks.iter().map(|r| r.value(t, table)).sum::<Option<Rat>>();
    (spec, sum)
}

/// The point's token value and table, by symbol number (token first, then the table).
fn split_point(point: &[(u32, Rat)], vocab: usize) -> (i64, Vec<Rat>) {
    let mut values = vec![Rat::from_integer(0.into()); vocab + 1];
    for (s, v) in point {
        values[*s as usize] = v.clone();
    }
    let t = values[0].to_integer().try_into().unwrap();
    (t, values[1..].to_vec())
}

/// A refutation's point is a real difference of the two programs.
fn assert_real_witness(e: &Embedding, ranks: &[Rank], outcome: &Outcome) {
    let Outcome::Refuted { point, .. } = outcome else {
        panic!("not refuted: {outcome:?}");
    };
    let (t, table) = split_point(&point.values, e.vocab);
    let (spec, sum) = direct(ranks, t, &table);
    assert!(
        sum.is_none_or(|s| s != spec),
        "no difference at token {t}: {outcome:?}"
    );
}

#[test]
fn the_correct_embedding_on_2_and_4_ranks_is_proved_by_cases() {
    for (vocab, n) in [(16, 2), (64, 4), (67, 4), (1000, 4)] {
        let e = embedding(vocab, &layout(vocab, n));
        assert_ne!(e.spec, e.ranks, "the normal forms differ");
        assert_eq!(
            decide(&e.ar, e.spec, e.ranks, &cfg()),
            Outcome::Proved(Layer::CaseSplit),
            "vocab {vocab} on {n} ranks"
        );
    }
}

/// Each planted bug of the brief, on 2 and 4 ranks: refuted with a real witness.
#[test]
fn planted_layout_bugs_are_refuted_with_real_witnesses() {
    for n in [2usize, 4] {
        let vocab = 16 * n;
        let good = layout(vocab, n);
        let mut bugs: Vec<(&str, Vec<Rank>)> = Vec::new();
        // Rank 1 masks and shifts by rank 0's range, on its own rows.
        let mut wrong_offset = good.clone();
        (
            wrong_offset[1].lo,
            wrong_offset[1].hi,
            wrong_offset[1].shift,
        ) = (good[0].lo, good[0].hi, good[0].shift);
        bugs.push(("an offset of the wrong rank", wrong_offset));
        // `<=` for `<`: rank 1 also masks its first token.
        let mut off_by_one = good.clone();
        off_by_one[1].off_by_one = true;
        bugs.push(("a mask off by one", off_by_one));
        // Rank 0's range reaches one token into rank 1's (it holds one row more).
        let mut overlap = good.clone();
        overlap[0].hi += 1;
        overlap[0].rows += 1;
        bugs.push(("two ranges overlapping", overlap));
        // Rank 0 stops one token short.
        let mut gap = good.clone();
        gap[0].hi -= 1;
        gap[0].rows -= 1;
        bugs.push(("a gap between ranges", gap));
        // Rank 0's value alone, no all-reduce.
        bugs.push(("the all-reduce missing", good[..1].to_vec()));
        for (what, ranks) in bugs {
            let e = embedding(vocab, &ranks);
            let outcome = decide(&e.ar, e.spec, e.ranks, &cfg());
            assert!(
                matches!(outcome, Outcome::Refuted { .. }),
                "{what} on {n} ranks: {outcome:?}"
            );
            assert_real_witness(&e, &ranks, &outcome);
        }
    }
}

/// A boundary bug no random token finds (one value of 4000): the case split's own points
/// find it, at the case where the forms differ.
#[test]
fn a_boundary_bug_is_found_at_its_case() {
    let mut ranks = layout(4000, 4);
    ranks[2].off_by_one = true;
    let e = embedding(4000, &ranks);
    let outcome = decide(&e.ar, e.spec, e.ranks, &cfg());
    assert!(
        matches!(
            outcome,
            Outcome::Refuted {
                layer: Layer::CaseSplit,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_real_witness(&e, &ranks, &outcome);
}

/// What the split leaves alone: a lookup at twice the token (no window of the table), and a
/// comparison of the token with a real (no root to split at). Both goals are equalities, so
/// nothing may refute them, and without a form nothing proves them either.
#[test]
fn forms_the_split_cannot_build_leave_the_goal_unknown() {
    let mut ar = Arena::default();
    let token = ar.symbol("token", SymbolKind::Index(8)).unwrap();
    let x = ar.symbol("x", SymbolKind::Real).unwrap();
    let table: Vec<ExprId> = (0..16)
        .map(|i| ar.symbol(&format!("e{i}"), SymbolKind::Real).unwrap())
        .collect();
    let two_t = ar.add(token, token).unwrap();
    let mut args = vec![two_t];
    args.extend_from_slice(&table);
    let doubled = ar.app(Func::Lookup, args).unwrap();
    let (zero, four) = (ar.int(0).unwrap(), ar.int(4).unwrap());
    let below = ar.gt(four, token).unwrap();
    let above = ar.ge(token, four).unwrap();
    let kept_below = ar.select(below, doubled, zero).unwrap();
    let zeroed_above = ar.select(above, zero, doubled).unwrap();
    assert_ne!(kept_below, zeroed_above);
    assert!(matches!(
        decide(&ar, kept_below, zeroed_above, &cfg()),
        Outcome::Unknown(_)
    ));
    let over = ar.gt(x, token).unwrap();
    let not_over = ar.ge(token, x).unwrap();
    let by_x = ar.select(over, table[0], table[1]).unwrap();
    let by_x_swapped = ar.select(not_over, table[1], table[0]).unwrap();
    assert_ne!(by_x, by_x_swapped);
    assert!(matches!(
        decide(&ar, by_x, by_x_swapped, &cfg()),
        Outcome::Unknown(_)
    ));
}

/// A random layout: up to 4 ranks over a small vocabulary, each boundary moved by -1, 0 or 1
/// for the range and (independently) for the rows and offset, the lower mask off by one at
/// random, a rank dropped at random.
fn random_layout() -> impl Strategy<Value = (usize, Vec<Rank>)> {
    (1usize..=4, 1usize..=3).prop_flat_map(|(n, per)| {
        let vocab = n * per + 1;
        (
            Just(vocab),
            Just(layout(vocab, n)),
            proptest::collection::vec((-1i64..=1, -1i64..=1, -1i64..=1, 0u8..8), n),
        )
            .prop_map(|(vocab, good, moves)| {
                let mut ranks = Vec::new();
                for (r, (dlo, dhi, doff, flags)) in good.into_iter().zip(moves) {
                    if flags == 7 {
                        continue;
                    }
                    let lo = (r.lo + dlo).clamp(0, vocab as i64);
                    let hi = (r.hi + dhi).clamp(lo, vocab as i64);
                    let start = (r.start as i64 + doff).clamp(0, vocab as i64 - 1) as usize;
                    // Mostly the shift its rows need; sometimes its range's start instead.
                    let shift = if flags == 5 { lo } else { start as i64 };
                    let rows = ((hi - lo).max(1) as usize).min(vocab - start);
                    ranks.push(Rank {
                        lo,
                        hi,
                        shift,
                        start,
                        rows,
                        off_by_one: flags == 6,
                    });
                }
                (vocab, ranks)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A proof holds at every token value (checked exhaustively, exactly, on a table of
    /// distinct values); a refutation is a real difference; the correct layouts are proved.
    #[test]
    fn proofs_hold_at_every_token_and_witnesses_are_real(
        (vocab, ranks) in random_layout(),
        seed in 0u64..1000,
    ) {
        let e = embedding(vocab, &ranks);
        let outcome = decide(&e.ar, e.spec, e.ranks, &cfg());
        match &outcome {
            Outcome::Proved(_) => {
                let table: Vec<Rat> = (0..vocab)
                    .map(|i| Rat::from_integer(((i as u64 * 7919 + seed) % 1009 + 1).into()))
                    .collect();
                for t in 0..vocab as i64 {
                    let (spec, sum) = direct(&ranks, t, &table);
                    prop_assert_eq!(Some(spec), sum, "token {} of {:?}", t, ranks);
                    // The normal forms evaluate alike there too.
                    let mut values = vec![Coeff::from_integer(t)];
                    values.extend(table.iter().map(|r| Coeff::from_big(r.clone())));
                    let mut ev = ExactEval::new(&e.ar, values);
                    prop_assert_eq!(ev.eval(e.spec), ev.eval(e.ranks));
                }
            }
            Outcome::Refuted { .. } => assert_real_witness(&e, &ranks, &outcome),
            Outcome::Unknown(_) => {}
        }
        let correct = ranks.iter().all(|r| {
                r.shift == r.lo && r.start as i64 == r.lo && r.rows as i64 == r.hi - r.lo && !r.off_by_one
            })
            && (0..vocab as i64).all(|t| ranks.iter().filter(|r| r.lo <= t && t < r.hi).count() == 1);
        if correct {
            prop_assert!(matches!(outcome, Outcome::Proved(_)), "{:?}: {:?}", ranks, outcome);
        }
    }
}
