//! Selectors of an index symbol: `[t == K]` for a token id or label `t` (an integer in `[0,
//! bound)`) and an integer `K` in that range.
//!
//! The spec's cross-entropy backward writes one selector per class (`nll_loss_backward`'s
//! one-hot `[t == k]`) and sums them over the row (`_log_softmax_backward_data`'s `Σ_k g_k`);
//! a vocab-parallel rank writes its one-hot as `eq(where(outside, 0, t - start), k) and not
//! outside`. Three exact rules bring both to the same normal form, `[t == start + k]`, and the
//! spec's row sum to its value:
//!
//! - **Comparisons of a `where`** (`Arena::is_zero_of_where`, from `eq0`'s normalization):
//!   `[α·where(c, a, b) + r == 0] = (1 - [c == 0])·[α·a + r == 0] + [c == 0]·[α·b + r == 0]`.
//!   `where` picks `a` exactly where `c` is not zero (NaN and ±inf included), which is where
//!   `[c == 0]` is 0; both sides are 0/1 everywhere, so the ring form is IEEE's.
//! - **Comparisons are 0/1** (`Arena::boolean_monomials`, applied to every product): a
//!   comparison to a power `k >= 1` is itself (`x^k = x` on {0, 1}), and in a monomial holding
//!   a selector `[t == K]` every other comparison whose value at `t = K` is a constant is
//!   replaced by that constant (`[t == K]·f(t) = [t == K]·f(K)`: where `t != K` both are 0, as
//!   `f` is 0 or 1, never a non-finite value; only comparisons are replaced).
//! - **A label is one class** (`Arena::fold_selector_sums`): `Σ_{K < bound} c·m·[t == K] =
//!   c·m` when every `K` in `[0, bound)` is present with the same coefficient and monomial `m`
//!   of provably finite atoms: exactly one selector is 1 for an integer `t` in `[0, bound)`,
//!   and `0·m` is 0 only for a finite `m`. Only index symbols have a bound, so a label that
//!   may be `ignore_index` (no `assume: ignore-index: unused`) is never folded.

use super::SymbolKind;
use super::{add_term, from_map, Arena, Atom, AtomId, Built, Coeff, ExprId, Func, Mono};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};

/// Nesting of comparisons evaluated at a selector's value at most.
const AT_INDEX_DEPTH: usize = 8;

/// Distinct comparisons a compared polynomial may hold for its truth table to be written out
/// ([`Arena::comparison_of_booleans`]: `2^4` assignments).
const MAX_BOOLEAN_ATOMS: usize = 4;

/// Terms of one polynomial evaluated at a selector's value at most.
const AT_INDEX_TERMS: usize = 64;

impl Arena {
    /// When atom `a` is a selector `[c·t + k == 0]` of an index symbol `t` whose root `K =
    /// -k/c` is an integer in `[0, bound)`: `(t, K)`.
    pub(crate) fn index_selector(&self, a: AtomId) -> Option<(u32, Coeff)> {
        let Atom::App(Func::IsZero, args) = self.atom(a) else {
            return None;
        };
        let mut symbol = None;
        let mut offset = Coeff::zero();
        for (m, c) in &self.poly(args[0]).terms {
            match m.as_slice() {
                [] => offset = c.clone(),
                [(x, 1)] if symbol.is_none() => match self.atom(*x) {
                    Atom::Symbol(s) => symbol = Some((*s, c.clone())),
                    _ => return None,
                },
                _ => return None,
            }
        }
        let (s, slope) = symbol?;
        let SymbolKind::Index(bound) = self.symbols[s as usize].1 else {
            return None;
        };
        let root = -(&offset * &slope.recip());
        let k = root.to_usize()?;
        (k < bound as usize).then_some((s, root))
    }

    /// Whether atom `a` is a comparison (0 or 1 at every point, NaN compared included).
    fn is_comparison(&self, a: AtomId) -> bool {
        matches!(
            self.atom(a),
            Atom::App(Func::Positive | Func::NonNegative | Func::IsZero, _)
        )
    }

    /// The value of `e` at `t = k` where it is a constant there: `e` a polynomial in `t` and
    /// comparisons of such (nested at most [`AT_INDEX_DEPTH`]); `None` where any other atom
    /// is met.
    fn value_at_index(&self, e: ExprId, t: u32, k: &Coeff, depth: usize) -> Option<Coeff> {
        let p = self.poly(e);
        if depth == 0 || p.terms.len() > AT_INDEX_TERMS {
            return None;
        }
        let mut sum = Coeff::zero();
        for (m, c) in &p.terms {
            let mut v = c.clone();
            for &(a, pow) in m {
                let x = self.atom_at_index(a, t, k, depth)?;
                for _ in 0..pow {
                    v = &v * &x;
                }
            }
            sum += v;
        }
        Some(sum)
    }

    /// Atom `a`'s value at `t = k` where [`Arena::value_at_index`] finds one.
    fn atom_at_index(&self, a: AtomId, t: u32, k: &Coeff, depth: usize) -> Option<Coeff> {
        match self.atom(a) {
            Atom::Symbol(s) if *s == t => Some(k.clone()),
            Atom::App(f @ (Func::Positive | Func::NonNegative | Func::IsZero), args) => {
                let v = self.value_at_index(args[0], t, k, depth - 1)?;
                let holds = match f {
                    Func::Positive => v.is_positive(),
                    Func::NonNegative => !v.is_negative(),
                    _ => v.is_zero(),
                };
                Some(Coeff::from_integer(i64::from(holds)))
            }
            _ => None,
        }
    }

    /// Whether monomial `m` is changed by [`Arena::boolean_monomial`]: a comparison to a
    /// power above 1, or a selector with another comparison.
    fn boolean_rules_apply(&self, m: &Mono) -> bool {
        let mut comparisons = 0;
        let mut selector = false;
        for &(a, k) in m {
            if self.is_comparison(a) {
                if k > 1 {
                    return true;
                }
                comparisons += 1;
                selector = selector || self.index_selector(a).is_some();
            }
        }
        selector && comparisons >= 2
    }

    /// Monomial `m` with every comparison to the power 1 and, beside a selector `[t == K]`,
    /// every other comparison constant at `t = K` replaced by its value (`None`: the
    /// monomial is 0). See the module's rules.
    fn boolean_monomial(&self, m: &Mono) -> Option<Mono> {
        let m: Mono = m
            .iter()
            .map(|&(a, k)| (a, if self.is_comparison(a) { 1 } else { k }))
            .collect();
        let Some((selector, (t, value))) = m
            .iter()
            .find_map(|&(a, _)| self.index_selector(a).map(|s| (a, s)))
        else {
            return Some(m);
        };
        let mut out = Vec::with_capacity(m.len());
        let mut vanishes = false;
        for &(a, k) in &m {
            if a != selector && self.is_comparison(a) {
                match self.atom_at_index(a, t, &value, AT_INDEX_DEPTH) {
                    Some(v) if v.is_zero() => vanishes = true,
                    Some(_) => continue,
                    None => {}
                }
            }
            out.push((a, k));
        }
        if vanishes {
            // The term is `0·rest` at every point: 0 only where the rest is finite (IEEE's
            // `0·inf` is NaN); otherwise it is kept as it is.
            let mut memo = FxHashMap::default();
            let finite = m.iter().all(|&(a, _)| {
                self.is_comparison(a)
                    || (!self.is_zero_times(a)
                        && !matches!(self.atom(a), Atom::NonFinite(_))
                        && self.atom_class_in(a, &mut memo).finite)
            });
            return if finite { None } else { Some(m) };
        }
        Some(out)
    }

    /// The terms of a product with the 0/1 rules of comparisons applied (see the module).
    pub(super) fn boolean_monomials(&self, acc: BTreeMap<Mono, Coeff>) -> BTreeMap<Mono, Coeff> {
        if !acc.keys().any(|m| self.boolean_rules_apply(m)) {
            return acc;
        }
        let mut out = BTreeMap::new();
        for (m, c) in acc {
            if !self.boolean_rules_apply(&m) {
                add_term(&mut out, m, c);
            } else if let Some(m) = self.boolean_monomial(&m) {
                add_term(&mut out, m, c);
            }
        }
        out
    }

    /// A comparison (`func`: `gt0`, `ge0`, `eq0`) of a polynomial `d` in at most
    /// [`MAX_BOOLEAN_ATOMS`] comparisons: the multilinear polynomial of its truth table, `Σ_v
    /// [func(d(v))]·Π_i (v_i ? b_i : 1 - b_i)` over the assignments `v` of 0/1 to the atoms
    /// `b_i`. Exact: each `b_i` is 0 or 1 at every point, so at every point the atoms take one
    /// assignment `v`, where exactly one product is 1 and the sum is `func(d(v))`. (So
    /// `not(eq(t, k))` is `1 - [t == k]` and a mask's `bitwise_and` a product of comparisons,
    /// in one form however the program negates or combines them.) `None` where `d` holds any
    /// other atom.
    pub(super) fn comparison_of_booleans(&mut self, func: &Func, d: ExprId) -> Option<Built> {
        let p = self.polys[d.0 as usize].clone();
        let mut atoms: Vec<AtomId> = Vec::new();
        for (m, _) in &p.terms {
            for &(a, _) in m {
                if !self.is_comparison(a) {
                    return None;
                }
                if !atoms.contains(&a) {
                    atoms.push(a);
                    if atoms.len() > MAX_BOOLEAN_ATOMS {
                        return None;
                    }
                }
            }
        }
        if atoms.is_empty() {
            return None;
        }
        atoms.sort_unstable();
        Some((|| {
            let mut acc = self.int(0)?;
            for bits in 0..(1u32 << atoms.len()) {
                let on = |a: AtomId| {
                    let i = atoms.iter().position(|&x| x == a).unwrap_or(0);
                    bits >> i & 1 == 1
                };
                let mut value = Coeff::zero();
                for (m, c) in &p.terms {
                    if m.iter().all(|&(a, _)| on(a)) {
                        value += c.clone();
                    }
                }
                let holds = match func {
                    Func::Positive => value.is_positive(),
                    Func::NonNegative => !value.is_negative(),
                    _ => value.is_zero(),
                };
                if !holds {
                    continue;
                }
                let mut term = self.int(1)?;
                for (i, &a) in atoms.iter().enumerate() {
                    let x = self.atom_expr(self.atom(a).clone())?;
                    let factor = if bits >> i & 1 == 1 { x } else { self.not(x)? };
                    term = self.mul(term, factor)?;
                }
                acc = self.add(acc, term)?;
            }
            Ok(acc)
        })())
    }

    /// `[α·where(c, a, b) + r == 0]` for a constant `r`, as `(1 - [c == 0])·[α·a + r == 0] +
    /// [c == 0]·[α·b + r == 0]` (`None` where `d` is not `α·where(..) + r`).
    pub(super) fn is_zero_of_where(&mut self, d: ExprId) -> Option<Built> {
        let mut picked = None;
        let mut offset = Coeff::zero();
        for (m, c) in &self.poly(d).terms {
            match m.as_slice() {
                [] => offset = c.clone(),
                [(w, 1)] if picked.is_none() => match self.atom(*w) {
                    Atom::App(Func::Where, args) => {
                        picked = Some((args[0], args[1], args[2], c.clone()));
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
        let (cond, a, b, alpha) = picked?;
        Some((|| {
            let r = self.constant(offset)?;
            let branch = |ar: &mut Arena, x: ExprId| -> Built {
                let scaled = ar.scale(x, &alpha)?;
                let v = ar.add(scaled, r)?;
                ar.app(Func::IsZero, vec![v])
            };
            let (ea, eb) = (branch(self, a)?, branch(self, b)?);
            let zero = self.app(Func::IsZero, vec![cond])?;
            let picks_a = self.not(zero)?;
            let on_a = self.mul(picks_a, ea)?;
            let on_b = self.mul(zero, eb)?;
            self.add(on_a, on_b)
        })())
    }

    /// `e` with every full set of selectors folded: the terms `c·m·[t == K]` for every `K` in
    /// `[0, bound)` of an index symbol `t`, with the same `c` and a monomial `m` of provably
    /// finite atoms, become `c·m` (a label is exactly one class). Used on the spec's
    /// `Σ_k nll_loss_backward_k`, where the one-hot would otherwise multiply every element of
    /// the row's softmax term by one selector per class.
    pub fn fold_selector_sums(&mut self, e: ExprId) -> Built {
        let p = self.polys[e.0 as usize].clone();
        // (symbol, rest of the monomial, coefficient) -> (term index, K).
        let mut groups: BTreeMap<(u32, Mono, Coeff), Vec<(usize, usize)>> = BTreeMap::new();
        for (i, (m, c)) in p.terms.iter().enumerate() {
            let mut selectors = m
                .iter()
                .filter(|&&(_, k)| k == 1)
                .filter_map(|&(a, _)| self.index_selector(a).map(|s| (a, s)));
            let (Some((a, (t, value))), None) = (selectors.next(), selectors.next()) else {
                continue;
            };
            let Some(value) = value.to_usize() else {
                continue;
            };
            let rest: Mono = m.iter().filter(|x| x.0 != a).copied().collect();
            groups
                .entry((t, rest, c.clone()))
                .or_default()
                .push((i, value));
        }
        let mut folded = vec![false; p.terms.len()];
        let mut added = Vec::new();
        let mut memo = FxHashMap::default();
        for ((t, rest, c), members) in groups {
            let SymbolKind::Index(bound) = self.symbols[t as usize].1 else {
                continue;
            };
            let values: BTreeSet<usize> = members.iter().map(|&(_, v)| v).collect();
            // Every value is below the bound (`index_selector`), so `bound` distinct ones are
            // all of them.
            if values.len() != bound as usize {
                continue;
            }
            let finite = rest.iter().all(|&(a, _)| {
                !self.is_zero_times(a)
                    && !matches!(self.atom(a), Atom::NonFinite(_))
                    && self.atom_class_in(a, &mut memo).finite
            });
            if !finite {
                continue;
            }
            for (i, _) in members {
                folded[i] = true;
            }
            added.push((rest, c));
        }
        if added.is_empty() {
            return Ok(e);
        }
        let mut acc = BTreeMap::new();
        for (i, (m, c)) in p.terms.iter().enumerate() {
            if !folded[i] {
                add_term(&mut acc, m.clone(), c.clone());
            }
        }
        for (m, c) in added {
            add_term(&mut acc, m, c);
        }
        self.intern(from_map(acc))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Arena, ExprId, Func, SymbolKind};

    /// `[t == k]` for each `k` of `ks`.
    fn selectors(ar: &mut Arena, t: ExprId, ks: std::ops::Range<i64>) -> Vec<ExprId> {
        ks.map(|k| {
            let k = ar.int(k).unwrap();
            ar.eq(t, k).unwrap()
        })
        .collect()
    }

    /// `Σ_k [t == k]·x` over `ks`.
    fn selected_sum(ar: &mut Arena, t: ExprId, x: ExprId, ks: std::ops::Range<i64>) -> ExprId {
        let terms: Vec<_> = selectors(ar, t, ks)
            .into_iter()
            .map(|s| ar.mul(s, x).unwrap())
            .collect();
        ar.sum(&terms).unwrap()
    }

    #[test]
    fn a_full_set_of_selectors_is_one_and_a_partial_set_is_not() {
        let mut ar = Arena::default();
        let t = ar.symbol("t", SymbolKind::Index(3)).unwrap();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let all = selected_sum(&mut ar, t, x, 0..3);
        assert_eq!(ar.fold_selector_sums(all).unwrap(), x);
        let two = selected_sum(&mut ar, t, x, 0..2);
        assert_eq!(ar.fold_selector_sums(two).unwrap(), two);
    }

    #[test]
    fn selectors_of_a_label_that_is_not_an_index_are_never_folded() {
        let mut ar = Arena::default();
        let t = ar.symbol("t", SymbolKind::Int).unwrap();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let all = selected_sum(&mut ar, t, x, 0..3);
        assert_eq!(ar.fold_selector_sums(all).unwrap(), all);
    }

    #[test]
    fn selectors_times_a_value_that_may_not_be_finite_are_never_folded() {
        // Σ_k [t == k]·log(x) is NaN where log(x) is ±inf (0·inf), log(x) is not.
        let mut ar = Arena::default();
        let t = ar.symbol("t", SymbolKind::Index(3)).unwrap();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let log = ar.app(Func::Log, vec![x]).unwrap();
        let all = selected_sum(&mut ar, t, log, 0..3);
        assert_eq!(ar.fold_selector_sums(all).unwrap(), all);
    }

    #[test]
    fn a_selector_fixes_the_other_comparisons_of_its_index() {
        let mut ar = Arena::default();
        let t = ar.symbol("t", SymbolKind::Index(8)).unwrap();
        let (two, four) = (ar.int(2).unwrap(), ar.int(4).unwrap());
        let is_two = ar.eq(t, two).unwrap();
        let below_four = ar.gt(four, t).unwrap();
        // [t == 2]·[t < 4] = [t == 2]; [t == 2]·[t >= 4] = 0; [t == 2]² = [t == 2].
        assert_eq!(ar.mul(is_two, below_four).unwrap(), is_two);
        let at_least_four = ar.not(below_four).unwrap();
        let zero = ar.int(0).unwrap();
        assert_eq!(ar.mul(is_two, at_least_four).unwrap(), zero);
        assert_eq!(ar.mul(is_two, is_two).unwrap(), is_two);
        // Only comparisons lose their powers: [t == 2]·[t < 4]·x² keeps x².
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let square = ar.mul(x, x).unwrap();
        let masked_square = ar.mul(below_four, square).unwrap();
        let want = ar.mul(is_two, square).unwrap();
        assert_eq!(ar.mul(is_two, masked_square).unwrap(), want);
        assert_ne!(want, ar.mul(is_two, x).unwrap());
    }

    #[test]
    fn a_term_a_selector_zeroes_is_dropped_only_where_its_rest_is_finite() {
        // [t == 2]·[t >= 4]·log(x) is NaN at t = 2, x = 0 (0·-inf): kept; with a finite
        // rest it is 0.
        let mut ar = Arena::default();
        let t = ar.symbol("t", SymbolKind::Index(8)).unwrap();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let (two, four) = (ar.int(2).unwrap(), ar.int(4).unwrap());
        let is_two = ar.eq(t, two).unwrap();
        let at_least_four = ar.ge(t, four).unwrap();
        let log = ar.app(Func::Log, vec![x]).unwrap();
        let masked_log = ar.mul(at_least_four, log).unwrap();
        let zero = ar.int(0).unwrap();
        assert_ne!(ar.mul(is_two, masked_log).unwrap(), zero);
        let masked_x = ar.mul(at_least_four, x).unwrap();
        assert_eq!(ar.mul(is_two, masked_x).unwrap(), zero);
    }

    #[test]
    fn only_comparisons_are_zero_or_one() {
        let mut ar = Arena::default();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let t = ar.symbol("t", SymbolKind::Index(8)).unwrap();
        let zero = ar.int(0).unwrap();
        // x² is not x, and [x == 0] is not 1 - x, for a real x.
        let square = ar.mul(x, x).unwrap();
        assert_ne!(square, x);
        let is_zero = ar.eq(x, zero).unwrap();
        let one_minus = ar.not(x).unwrap();
        assert_ne!(is_zero, one_minus);
        // A comparison's negation, written as a comparison with 0, is 1 minus it.
        let is_three = {
            let three = ar.int(3).unwrap();
            ar.eq(t, three).unwrap()
        };
        let not_three = ar.eq(is_three, zero).unwrap();
        assert_eq!(not_three, ar.not(is_three).unwrap());
    }

    #[test]
    fn a_masked_index_compared_is_the_selector_of_the_shifted_class() {
        // eq(where(t < 4 or t >= 8, 0, t - 4), 1) and not(t < 4 or t >= 8) = [t == 5].
        let mut ar = Arena::default();
        let t = ar.symbol("t", SymbolKind::Index(12)).unwrap();
        let (four, eight, one) = (ar.int(4).unwrap(), ar.int(8).unwrap(), ar.int(1).unwrap());
        let below = ar.gt(four, t).unwrap();
        let above = ar.ge(t, eight).unwrap();
        let either = ar.add(below, above).unwrap();
        let both = ar.mul(below, above).unwrap();
        let outside = ar.sub(either, both).unwrap();
        let zero = ar.int(0).unwrap();
        let local = ar.sub(t, four).unwrap();
        let masked = ar.select(outside, zero, local).unwrap();
        let hit = ar.eq(masked, one).unwrap();
        let inside = ar.app(Func::IsZero, vec![outside]).unwrap();
        let one_hot = ar.mul(hit, inside).unwrap();
        let five = ar.int(5).unwrap();
        assert_eq!(one_hot, ar.eq(t, five).unwrap());
    }
}
