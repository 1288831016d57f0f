//! The values an integer expression can take, as an interval: what lets an index computed by
//! arithmetic on inputs (a label minus a rank's vocabulary offset, masked to 0 outside the
//! rank's range, as Megatron's vocab-parallel cross-entropy writes it) be shown within the
//! dim it selects along, so the symbolic `gather` may read it.
//!
//! Every step over-approximates: a sum of terms is the sum of their intervals, a `where` the
//! hull of its branches, each branch under the bounds its condition's outcome implies. A form
//! with no rule (a product of symbols, a real symbol, an unbounded integer) gives no interval,
//! so the caller refuses the index: never a range narrower than the values.

use crate::expr::{Arena, Atom, AtomId, Coeff, ExprId, Func, SymbolKind};
use std::collections::BTreeMap;

/// Bounds on integer symbols assumed along a branch: inclusive, `None` unbounded.
type Bounds = BTreeMap<u32, (Option<Coeff>, Option<Coeff>)>;

/// What an expression can take under some bounds.
#[derive(Clone, Debug, PartialEq)]
enum Range {
    /// No value: the bounds contradict each other (a branch no input reaches).
    Empty,
    /// Every value lies in `[lo, hi]`.
    Within(Coeff, Coeff),
}

/// Nested `where`s a range is followed through.
const MAX_DEPTH: u32 = 16;
/// Boolean atoms a condition is split on (2^k cases).
const MAX_CONDITION_ATOMS: usize = 6;

/// Whether every value `e` can take lies in `[0, n)`; `false` where that is not shown.
pub(crate) fn within(arena: &Arena, e: ExprId, n: usize) -> bool {
    let Ok(n) = i64::try_from(n) else {
        return false;
    };
    match expr_range(arena, e, &Bounds::new(), 0) {
        Some(Range::Within(lo, hi)) => !lo.is_negative() && hi < Coeff::from_integer(n),
        // No input reaches the expression: nothing to read out of range.
        Some(Range::Empty) => true,
        None => false,
    }
}

/// Whether every value `e` can take lies in `[lo, hi]`; `false` where that is not shown (an
/// integer cast to a narrower type keeps its value only there).
pub(crate) fn within_interval(arena: &Arena, e: ExprId, lo: i64, hi: i64) -> bool {
    match expr_range(arena, e, &Bounds::new(), 0) {
        Some(Range::Within(a, b)) => a >= Coeff::from_integer(lo) && b <= Coeff::from_integer(hi),
        Some(Range::Empty) => true,
        None => false,
    }
}

/// Whether `e`'s interval is known and reaches outside `[0, n)`: an index a kernel may fail
/// on. `false` where no interval is known (an integer of unknown range), where the caller
/// cannot tell either way. The kernels refuse any index not shown [`within`] their rows (an
/// unknown interval may leave them too); tests use this to tell the two apart.
#[cfg(test)]
pub(crate) fn may_leave(arena: &Arena, e: ExprId, n: usize) -> bool {
    let Ok(n) = i64::try_from(n) else {
        return false;
    };
    match expr_range(arena, e, &Bounds::new(), 0) {
        Some(Range::Within(lo, hi)) => lo.is_negative() || hi >= Coeff::from_integer(n),
        _ => false,
    }
}

fn expr_range(arena: &Arena, e: ExprId, bounds: &Bounds, depth: u32) -> Option<Range> {
    if depth > MAX_DEPTH {
        return None;
    }
    let (mut lo, mut hi) = (Coeff::zero(), Coeff::zero());
    for (mono, c) in &arena.poly(e).terms {
        let (a, b) = match mono.as_slice() {
            [] => (c.clone(), c.clone()),
            [(atom, 1)] => match atom_range(arena, *atom, bounds, depth)? {
                Range::Empty => return Some(Range::Empty),
                Range::Within(a, b) => {
                    let (x, y) = (c.clone() * &a, c.clone() * &b);
                    if c.is_negative() {
                        (y, x)
                    } else {
                        (x, y)
                    }
                }
            },
            // A product: a mask as an integer factor (`(t - lo) · inside`), split on its
            // boolean atoms.
            _ => return split_on_booleans(arena, e, bounds, depth),
        };
        lo += a;
        hi += b;
    }
    Some(Range::Within(lo, hi))
}

/// The range of a polynomial whose products hold boolean atoms (a mask as an integer factor:
/// `(t - lo) · inside`): every assignment of its boolean atoms (at most
/// [`MAX_CONDITION_ATOMS`]) that the bounds it implies admit leaves each term a constant or
/// a single atom; the hull over the assignments. `None` where a term keeps a product.
fn split_on_booleans(arena: &Arena, e: ExprId, bounds: &Bounds, depth: u32) -> Option<Range> {
    if depth > MAX_DEPTH {
        return None;
    }
    let poly = arena.poly(e);
    let mut atoms: Vec<AtomId> = poly
        .terms
        .iter()
        .flat_map(|(m, _)| m.iter().map(|&(a, _)| a))
        .filter(|&a| is_boolean(arena, a))
        .collect();
    atoms.sort_unstable();
    atoms.dedup();
    if atoms.is_empty() || atoms.len() > MAX_CONDITION_ATOMS {
        return None;
    }
    let mut hull: Option<(Coeff, Coeff)> = None;
    'cases: for mask in 0u32..(1 << atoms.len()) {
        let value = |a: AtomId| {
            atoms
                .iter()
                .position(|&b| b == a)
                .map(|k| mask & (1 << k) != 0)
        };
        let mut inner = bounds.clone();
        for &a in &atoms {
            for (s, lo, hi) in atom_facts(arena, a, value(a).expect("collected")) {
                if !tighten(&mut inner, s, lo, hi) {
                    continue 'cases;
                }
            }
        }
        // The terms left once the atoms take their values, like terms collected (`t - t·b`
        // at `b = 1` is 0, not `[lo, hi] - [lo, hi]`).
        let mut left: BTreeMap<Vec<_>, Coeff> = BTreeMap::new();
        for (m, c) in &poly.terms {
            // A boolean atom's power is the atom: 0 drops the term, 1 leaves the rest.
            if m.iter().any(|&(a, _)| value(a) == Some(false)) {
                continue;
            }
            let rest: Vec<_> = m
                .iter()
                .filter(|&&(a, _)| value(a).is_none())
                .copied()
                .collect();
            *left.entry(rest).or_insert_with(Coeff::zero) += c;
        }
        let (mut lo, mut hi) = (Coeff::zero(), Coeff::zero());
        for (m, c) in left.iter().filter(|(_, c)| !c.is_zero()) {
            let (a, b) = match m.as_slice() {
                [] => (c.clone(), c.clone()),
                [(atom, 1)] => match atom_range(arena, *atom, &inner, depth + 1)? {
                    // A symbol its bounds leave no value: no input reaches this assignment.
                    Range::Empty => continue 'cases,
                    Range::Within(x, y) => {
                        let (x, y) = (c.clone() * &x, c.clone() * &y);
                        if c.is_negative() {
                            (y, x)
                        } else {
                            (x, y)
                        }
                    }
                },
                _ => return None,
            };
            lo += a;
            hi += b;
        }
        hull = Some(match hull {
            None => (lo, hi),
            Some((a, b)) => (a.min(lo), b.max(hi)),
        });
    }
    Some(hull.map_or(Range::Empty, |(lo, hi)| Range::Within(lo, hi)))
}

fn atom_range(arena: &Arena, a: AtomId, bounds: &Bounds, depth: u32) -> Option<Range> {
    match arena.atom(a) {
        Atom::Symbol(s) => symbol_range(arena, *s, bounds),
        Atom::App(Func::Positive | Func::NonNegative | Func::IsZero, _) => {
            Some(Range::Within(Coeff::zero(), Coeff::one()))
        }
        Atom::App(Func::Where, args) => {
            let (c, x, y) = (args[0], args[1], args[2]);
            let mut hull: Option<(Coeff, Coeff)> = None;
            for (holds, facts) in condition_cases(arena, c)? {
                let mut inner = bounds.clone();
                let mut feasible = true;
                for (s, lo, hi) in facts {
                    feasible &= tighten(&mut inner, s, lo, hi);
                }
                if !feasible {
                    continue;
                }
                let branch = if holds { x } else { y };
                match expr_range(arena, branch, &inner, depth + 1)? {
                    Range::Empty => {}
                    Range::Within(lo, hi) => {
                        hull = Some(match hull {
                            None => (lo, hi),
                            Some((a, b)) => (a.min(lo), b.max(hi)),
                        });
                    }
                }
            }
            Some(hull.map_or(Range::Empty, |(lo, hi)| Range::Within(lo, hi)))
        }
        // `clamp`: the largest (smallest) of the arguments lies between the largest
        // (smallest) of their lower ends and of their upper ends.
        Atom::App(f @ (Func::Max | Func::Min), args) => {
            let mut ends: Option<(Coeff, Coeff)> = None;
            for &x in args {
                match expr_range(arena, x, bounds, depth + 1)? {
                    Range::Empty => return Some(Range::Empty),
                    Range::Within(lo, hi) => {
                        ends = Some(match ends {
                            None => (lo, hi),
                            Some((a, b)) if *f == Func::Max => (a.max(lo), b.max(hi)),
                            Some((a, b)) => (a.min(lo), b.min(hi)),
                        });
                    }
                }
            }
            ends.map(|(lo, hi)| Range::Within(lo, hi))
        }
        _ => None,
    }
}

/// A symbol's own range (an index's `[0, bound)`, a bool's `{0, 1}`) met with the bounds.
fn symbol_range(arena: &Arena, s: u32, bounds: &Bounds) -> Option<Range> {
    let (mut lo, mut hi) = match arena.symbols().get(s as usize)?.1 {
        SymbolKind::Index(b) => (
            Some(Coeff::zero()),
            Some(Coeff::from_integer(i64::from(b) - 1)),
        ),
        SymbolKind::Bool => (Some(Coeff::zero()), Some(Coeff::one())),
        SymbolKind::Int => (None, None),
        SymbolKind::Real => return None,
    };
    if let Some((blo, bhi)) = bounds.get(&s) {
        lo = max_opt(lo, blo.clone());
        hi = min_opt(hi, bhi.clone());
    }
    match (lo, hi) {
        (Some(lo), Some(hi)) if lo > hi => Some(Range::Empty),
        (Some(lo), Some(hi)) => Some(Range::Within(lo, hi)),
        _ => None,
    }
}

fn max_opt(a: Option<Coeff>, b: Option<Coeff>) -> Option<Coeff> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn min_opt(a: Option<Coeff>, b: Option<Coeff>) -> Option<Coeff> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Meets symbol `s`'s bounds with `[lo, hi]`; whether they still admit an integer.
fn tighten(bounds: &mut Bounds, s: u32, lo: Option<Coeff>, hi: Option<Coeff>) -> bool {
    let entry = bounds.entry(s).or_insert((None, None));
    entry.0 = max_opt(entry.0.take(), lo);
    entry.1 = min_opt(entry.1.take(), hi);
    !matches!(&*entry, (Some(l), Some(h)) if l > h)
}

/// A bound on a symbol: `(symbol, lower, upper)`, inclusive.
type Fact = (u32, Option<Coeff>, Option<Coeff>);

/// The cases of a 0/1 condition `c`: for every assignment of its boolean atoms, whether `c`
/// is non-zero and the bounds the assignment implies. `None` where `c` is not a polynomial
/// in boolean atoms (its outcome could not be split on).
fn condition_cases(arena: &Arena, c: ExprId) -> Option<Vec<(bool, Vec<Fact>)>> {
    let poly = arena.poly(c);
    let mut atoms: Vec<AtomId> = poly
        .terms
        .iter()
        .flat_map(|(m, _)| m.iter().map(|&(a, _)| a))
        .collect();
    atoms.sort_unstable();
    atoms.dedup();
    if atoms.len() > MAX_CONDITION_ATOMS || !atoms.iter().all(|&a| is_boolean(arena, a)) {
        return None;
    }
    let mut out = Vec::with_capacity(1 << atoms.len());
    for mask in 0u32..(1 << atoms.len()) {
        let value = |a: AtomId| -> bool {
            let k = atoms.iter().position(|&b| b == a).expect("collected");
            mask & (1 << k) != 0
        };
        let mut sum = Coeff::zero();
        for (m, k) in &poly.terms {
            if m.iter().all(|&(a, _)| value(a)) {
                sum += k;
            }
        }
        let mut facts = Vec::new();
        for &a in &atoms {
            facts.extend(atom_facts(arena, a, value(a)));
        }
        out.push((!sum.is_zero(), facts));
    }
    Some(out)
}

/// A 0/1-valued atom: a comparison, or a bool symbol.
fn is_boolean(arena: &Arena, a: AtomId) -> bool {
    match arena.atom(a) {
        Atom::App(Func::Positive | Func::NonNegative | Func::IsZero, _) => true,
        Atom::Symbol(s) => arena
            .symbols()
            .get(*s as usize)
            .is_some_and(|(_, k)| *k == SymbolKind::Bool),
        _ => false,
    }
}

/// The bounds boolean atom `a` having the truth value `holds` implies; none where it implies
/// nothing this module can state (which only widens the ranges found).
fn atom_facts(arena: &Arena, a: AtomId, holds: bool) -> Vec<Fact> {
    match arena.atom(a) {
        Atom::Symbol(s) => {
            let v = Coeff::from_integer(holds as i64);
            vec![(*s, Some(v.clone()), Some(v))]
        }
        Atom::App(f @ (Func::Positive | Func::NonNegative | Func::IsZero), args) => {
            let p = args[0];
            // The comparison of a 0/1 atom (`truthy` writes `1 - iszero(x)` over a
            // comparison x): the atom's own truth value.
            if let Some(inner) = single_boolean(arena, p) {
                let inner_holds = match (f, holds) {
                    (Func::Positive, h) => h,
                    (Func::IsZero, h) => !h,
                    // Every 0/1 value is non-negative: no input makes this false.
                    (_, false) => return vec![contradiction()],
                    (_, true) => return Vec::new(),
                };
                return atom_facts(arena, inner, inner_holds);
            }
            let Some((s, k, b)) = linear_in_one_integer(arena, p) else {
                return Vec::new();
            };
            // k·s + b compared with 0, s an integer and k, b integers.
            let (lo, hi): (Option<Coeff>, Option<Coeff>) = match (f, holds) {
                (Func::Positive, true) => (Some(Coeff::one()), None),
                (Func::Positive, false) => (None, Some(Coeff::zero())),
                (Func::NonNegative, true) => (Some(Coeff::zero()), None),
                (Func::NonNegative, false) => (None, Some(Coeff::from_integer(-1))),
                (_, true) => (Some(Coeff::zero()), Some(Coeff::zero())),
                (_, false) => return Vec::new(),
            };
            // lo <= k·s + b <= hi, so s between (lo - b)/k and (hi - b)/k (swapped for k < 0).
            let solve = |x: Option<Coeff>| x.map(|x| (x - b.clone()) * &k.recip());
            let (a, z) = (solve(lo), solve(hi));
            let (slo, shi) = if k.is_negative() { (z, a) } else { (a, z) };
            vec![(s, slo.map(|x| ceil(&x)), shi.map(|x| floor(&x)))]
        }
        _ => Vec::new(),
    }
}

/// A fact no symbol satisfies: symbol 0 between 1 and 0.
fn contradiction() -> Fact {
    (0, Some(Coeff::one()), Some(Coeff::zero()))
}

/// `e` as exactly one boolean atom (coefficient 1, exponent 1).
fn single_boolean(arena: &Arena, e: ExprId) -> Option<AtomId> {
    match arena.poly(e).terms.as_slice() {
        [(m, c)] if c.is_one() => match m.as_slice() {
            [(a, 1)] if is_boolean(arena, *a) => Some(*a),
            _ => None,
        },
        _ => None,
    }
}

/// `e = k·s + b` with `s` an integer symbol and `k != 0`, `b` integers.
fn linear_in_one_integer(arena: &Arena, e: ExprId) -> Option<(u32, Coeff, Coeff)> {
    let mut b = Coeff::zero();
    let mut found: Option<(u32, Coeff)> = None;
    for (m, c) in &arena.poly(e).terms {
        if !c.is_integer() {
            return None;
        }
        match m.as_slice() {
            [] => b = c.clone(),
            [(a, 1)] if found.is_none() => match arena.atom(*a) {
                Atom::Symbol(s)
                    if matches!(
                        arena.symbols().get(*s as usize).map(|x| x.1),
                        Some(SymbolKind::Int | SymbolKind::Index(_) | SymbolKind::Bool)
                    ) =>
                {
                    found = Some((*s, c.clone()));
                }
                _ => return None,
            },
            _ => return None,
        }
    }
    let (s, k) = found?;
    Some((s, k, b))
}

fn floor(x: &Coeff) -> Coeff {
    Coeff::from_big(x.to_big().floor())
}

fn ceil(x: &Coeff) -> Coeff {
    Coeff::from_big(x.to_big().ceil())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::Budget;

    /// Megatron's masked local label: `where(l < lo | l >= hi, 0, l - lo)`, as the exec
    /// rules build it (`truthy` over each comparison, `a + b - ab` for the or).
    fn masked_label(ar: &mut Arena, l: ExprId, lo: i64, hi: i64) -> ExprId {
        let (clo, chi) = (ar.int(lo).unwrap(), ar.int(hi).unwrap());
        let below = ar.gt(clo, l).unwrap();
        let above = ar.ge(l, chi).unwrap();
        let truthy = |ar: &mut Arena, x: ExprId| {
            let z = ar.app(Func::IsZero, vec![x]).unwrap();
            ar.not(z).unwrap()
        };
        let (tb, ta) = (truthy(ar, below), truthy(ar, above));
        let s = ar.add(tb, ta).unwrap();
        let p = ar.mul(tb, ta).unwrap();
        let outside = ar.sub(s, p).unwrap();
        let shifted = ar.sub(l, clo).unwrap();
        let zero = ar.int(0).unwrap();
        ar.select(outside, zero, shifted).unwrap()
    }

    #[test]
    fn a_masked_label_lies_in_its_ranks_range() {
        let mut ar = Arena::new(Budget::default());
        let l = ar.symbol("labels[0]", SymbolKind::Index(64)).unwrap();
        for r in 0..4 {
            let e = masked_label(&mut ar, l, 16 * r, 16 * (r + 1));
            assert!(within(&ar, e, 16), "rank {r}");
            assert!(!within(&ar, e, 15), "rank {r}: 15 is one short");
        }
    }

    #[test]
    fn an_unmasked_or_misshifted_label_is_not_in_range() {
        let mut ar = Arena::new(Budget::default());
        let l = ar.symbol("labels[0]", SymbolKind::Index(64)).unwrap();
        // The mask off by one at the top: l = hi reads position 16 of 16.
        let off = masked_label(&mut ar, l, 16, 33);
        assert!(!within(&ar, off, 16));
        // No mask: l - 16 ranges over [-16, 47].
        let c = ar.int(16).unwrap();
        let bare = ar.sub(l, c).unwrap();
        assert!(!within(&ar, bare, 16));
        // An integer of unknown range is never in range.
        let n = ar.symbol("n", SymbolKind::Int).unwrap();
        assert!(!within(&ar, n, 16));
        let masked_n = masked_label(&mut ar, n, 16, 32);
        assert!(within(&ar, masked_n, 16));
        // Known to reach outside: the mask one row long, the bare shift; not known: `n`.
        assert!(may_leave(&ar, off, 16) && may_leave(&ar, bare, 16));
        assert!(!may_leave(&ar, n, 16));
        let fits = masked_label(&mut ar, l, 16, 32);
        assert!(!may_leave(&ar, fits, 16) && !may_leave(&ar, masked_n, 16));
    }

    /// The mask as an integer factor, `(l - lo) · not(l < lo or l >= hi)`: each assignment of
    /// the comparisons bounds `l`, and `l - l·b` at `b = 1` is 0 (like terms collected before
    /// their intervals are added). One row long, the index leaves the rows.
    #[test]
    fn a_label_masked_by_a_product_has_its_interval() {
        let mut ar = Arena::new(Budget::default());
        let l = ar.symbol("labels[0]", SymbolKind::Index(64)).unwrap();
        let product_masked = |ar: &mut Arena, lo: i64, hi: i64| {
            let (clo, chi) = (ar.int(lo).unwrap(), ar.int(hi).unwrap());
            let below = ar.gt(clo, l).unwrap();
            let above = ar.ge(l, chi).unwrap();
            let truthy = |ar: &mut Arena, x: ExprId| {
                let z = ar.app(Func::IsZero, vec![x]).unwrap();
                ar.not(z).unwrap()
            };
            let (tb, ta) = (truthy(ar, below), truthy(ar, above));
            let s = ar.add(tb, ta).unwrap();
            let p = ar.mul(tb, ta).unwrap();
            let outside = ar.sub(s, p).unwrap();
            let inside = ar.app(Func::IsZero, vec![outside]).unwrap();
            let shifted = ar.sub(l, clo).unwrap();
            ar.mul(shifted, inside).unwrap()
        };
        let fits = product_masked(&mut ar, 16, 32);
        assert!(within(&ar, fits, 16) && !may_leave(&ar, fits, 16));
        let long = product_masked(&mut ar, 16, 33);
        assert!(!within(&ar, long, 16) && may_leave(&ar, long, 16));
    }

    /// `clamp(l - 16, 0, k)`: within 16 rows for `k = 15`, one past them for `k = 16`.
    #[test]
    fn a_clamped_label_has_its_interval() {
        let mut ar = Arena::new(Budget::default());
        let l = ar.symbol("labels[0]", SymbolKind::Index(64)).unwrap();
        let c = ar.int(16).unwrap();
        let shifted = ar.sub(l, c).unwrap();
        let zero = ar.int(0).unwrap();
        let floor = ar.max(shifted, zero).unwrap();
        let (k15, k16) = (ar.int(15).unwrap(), ar.int(16).unwrap());
        let fits = ar.min(floor, k15).unwrap();
        let past = ar.min(floor, k16).unwrap();
        assert!(within(&ar, fits, 16) && !may_leave(&ar, fits, 16));
        assert!(!within(&ar, past, 16) && may_leave(&ar, past, 16));
    }
}
