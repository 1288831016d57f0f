//! Deciding a goal by cases on an index symbol (a token id, a label).
//!
//! A vocab-parallel embedding computes, on rank r, `where(t < lo_r or t >= hi_r, 0,
//! lookup(t - lo_r, rows lo_r..hi_r))` and sums the ranks' values; the spec computes `lookup(t,
//! rows)`. The normal forms differ (the ranks look up shifted indices in slices of the
//! table), and the goal holds the whole vocabulary, far past Z3. On each range of `t` between
//! the comparisons' roots, though, every comparison on `t` is a constant, so every `where`
//! picks a branch, and a lookup at `t + k` reads the same table entries for every `t` of the
//! range as a lookup of the same entries at `t` itself would: the entries
//! `table[lo + k .. hi + k]` read at `t - lo` (a *window*). Two sides whose forms on a case are
//! the same polynomial over the atoms free of `t`, `t` itself and windows (compared entry by
//! entry) are equal for every `t` of the case; the cases cover `[0, bound)`, every value `t`
//! can take, with no gap, so the goal holds. The split is over the comparisons' roots (two
//! per rank for the embedding), never over the table.
//!
//! Everything a form is built from is checked rather than assumed: a comparison must be a
//! constant on the whole case (its argument linear in `t`, the same sign at both ends), a
//! `where`'s condition a constant, a lookup's index `t + k` or a constant with every entry it
//! reads inside the table, and every atom kept in a form provably finite (so that the ring
//! arithmetic of the forms is the interpreter's: no `inf - inf`, no `0·NaN`). Anything else
//! (another function of `t`, a product atom holding it) leaves the goal to the other layers.

use crate::expr::{
    add_term, mul_mono, Arena, Atom, AtomId, Class, Coeff, ExprId, Func, SymbolKind,
};
use num_rational::BigRational;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::time::Instant;

/// Cases tried per symbol at most: one or two per comparison root (a vocab-parallel
/// embedding has two roots per rank). Past it (a one-hot over every class) the split is not
/// tried.
pub(crate) const MAX_CASES: usize = 1024;

/// Index symbols tried per goal at most (the goals of an embedding hold one token each).
const MAX_SYMBOLS: usize = 4;

/// Index symbols split label by label at most ([`decide_by_labels`]: a loss's goal holds one
/// per token).
const MAX_LABELS: usize = 256;

/// What the split found.
#[derive(Debug, PartialEq)]
pub(crate) enum Split {
    /// The sides are equal on every case: the goal holds.
    Equal,
    /// The forms differ on the cases `lo <= symbol < hi` listed: where a witness is likeliest
    /// (a difference of forms is not one by itself: distinct windows may hold equal values).
    Differs {
        /// The symbol split on.
        symbol: u32,
        /// The cases `(lo, hi)`: one where the two sides' forms differ; two where one label's
        /// part of the goal differs between them ([`decide_by_labels`]), either may be wrong.
        cases: Vec<(u64, u64)>,
    },
    /// The split does not apply, or a case has no form (why).
    Unknown(String),
}

/// A factor of a form's monomial.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key<'a> {
    /// An atom whose value does not depend on the split symbol.
    Atom(AtomId),
    /// The split symbol itself (on a case of more than one value).
    Symbol,
    /// The entries a lookup at `symbol + k` reads on the case `[lo, hi)`: `table[lo + k .. hi
    /// + k]`, read at `symbol - lo`. Equal windows (entry by entry) have equal values.
    Window(&'a [ExprId]),
}

type Mono<'a> = Vec<(Key<'a>, u32)>;

/// An expression's form on one case: a polynomial over [`Key`]s, no zero coefficient.
type Form<'a> = BTreeMap<Mono<'a>, Coeff>;

/// Why a case has no form.
type NoForm = String;

/// A term `c·m` of a goal's side: its monomial and coefficient.
type Term<'p> = (&'p [(AtomId, u32)], Coeff);

/// Decides `a == b` by cases on each index symbol compared in them (up to [`MAX_SYMBOLS`]),
/// stopping at the first split that proves it; otherwise the first case where the forms
/// differ (a split on one symbol keeps the others' atoms opaque, so another may still prove
/// it).
pub(crate) fn decide_by_cases(
    arena: &Arena,
    a: ExprId,
    b: ExprId,
    deadline: Option<Instant>,
) -> Split {
    if !arena
        .symbols()
        .iter()
        .any(|(_, k)| matches!(k, SymbolKind::Index(_)))
    {
        return Split::Unknown("no index symbol".into());
    }
    let roots = comparison_roots(arena, &[a, b]);
    if roots.is_empty() {
        return Split::Unknown("no comparison of an index symbol".into());
    }
    let mut why = String::new();
    let mut differs = None;
    for (&symbol, roots) in roots.iter().take(MAX_SYMBOLS) {
        let SymbolKind::Index(bound) = arena.symbols()[symbol as usize].1 else {
            continue;
        };
        let cases = cases_between(roots, u64::from(bound));
        if cases.is_empty() {
            // No value at all (an empty range): nothing to split, and nothing proved by it.
            continue;
        }
        if cases.len() > MAX_CASES {
            why = format!("{} cases on one symbol (limit {MAX_CASES})", cases.len());
            continue;
        }
        let mut split = Splitter::new(arena, symbol);
        let mut all_equal = true;
        for &(lo, hi) in &cases {
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Split::Unknown(super::TIME_RAN_OUT.into());
            }
            match split.equal_on(a, b, lo, hi) {
                Ok(true) => {}
                Ok(false) => {
                    differs.get_or_insert(Split::Differs {
                        symbol,
                        cases: vec![(lo, hi)],
                    });
                    all_equal = false;
                    break;
                }
                Err(e) => {
                    why = e;
                    all_equal = false;
                    break;
                }
            }
        }
        if all_equal {
            return Split::Equal;
        }
    }
    if roots.len() >= 2 {
        match decide_by_labels(arena, a, b, &roots, deadline) {
            Split::Unknown(e) => why = e,
            decided => return decided,
        }
    }
    differs.unwrap_or(Split::Unknown(why))
}

/// Decides `a == b` label by label: a loss over several tokens is `mean_i (lse_i -
/// logit_i[ℓ_i])` on the ranks against the spec's one-hot `-mean_i Σ_j [ℓ_i = j]·
/// log_softmax_i[j]`, each term holding one label. The difference `a - b` is `D_0 + Σ_s D_s`,
/// `D_s` the terms whose first compared symbol is `s` and `D_0` those holding none. Where `D_s`
/// has the same form on every case of `s`, a polynomial over atoms free of `s` (no window, not
/// `s` itself: those are functions of `s` within a case, and the same key for two symbols),
/// that form `F_s` is `D_s`'s value for every value of every symbol; `D_0 + Σ_s F_s` is then
/// the difference everywhere, and where it is the zero polynomial the goal holds. Each symbol
/// is split on its own cases only (`Σ_s cases(s)` forms, never their product); every atom
/// kept is checked finite as on one symbol.
fn decide_by_labels(
    arena: &Arena,
    a: ExprId,
    b: ExprId,
    roots: &BTreeMap<u32, Vec<BigRational>>,
    deadline: Option<Instant>,
) -> Split {
    if roots.len() > MAX_LABELS {
        return Split::Unknown(format!(
            "{} index symbols compared (limit {MAX_LABELS})",
            roots.len()
        ));
    }
    let mut labels = Vec::new();
    for &symbol in roots.keys() {
        let SymbolKind::Index(bound) = arena.symbols()[symbol as usize].1 else {
            return Split::Unknown("a compared symbol that is not an index".into());
        };
        let cases = cases_between(&roots[&symbol], u64::from(bound));
        if cases.is_empty() || cases.len() > MAX_CASES {
            return Split::Unknown(format!(
                "{} cases on one symbol (limit {MAX_CASES})",
                cases.len()
            ));
        }
        labels.push((symbol, cases, Splitter::new(arena, symbol)));
    }
    // The difference's terms by the one symbol each holds (`None`: no symbol).
    let mut parts: BTreeMap<Option<usize>, Vec<Term>> = BTreeMap::new();
    for (side, sign) in [(a, Coeff::one()), (b, -Coeff::one())] {
        for (m, c) in &arena.poly(side).terms {
            // A term holding several symbols goes with the first: the others' atoms are kept
            // in its forms as they are, values like any atom free of the symbol split on.
            let held = labels
                .iter_mut()
                .position(|(_, _, split)| m.iter().any(|&(atom, _)| split.atom_involves(atom)));
            parts
                .entry(held)
                .or_default()
                .push((m.as_slice(), c * &sign));
        }
    }
    let mut total = Form::new();
    for (held, terms) in &parts {
        let Some(i) = *held else {
            // Free of every symbol: each atom kept as it is, whatever the case.
            match labels[0].2.terms_form(terms) {
                Ok(f) => add_form(&mut total, f),
                Err(e) => return Split::Unknown(e),
            }
            continue;
        };
        let (symbol, cases, split) = &mut labels[i];
        let mut first: Option<(Form, (u64, u64))> = None;
        for &(lo, hi) in cases.iter() {
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Split::Unknown(super::TIME_RAN_OUT.into());
            }
            split.case = (lo, hi);
            split.forms.clear();
            let form = match split.terms_form(terms) {
                Ok(f) => f,
                Err(e) => return Split::Unknown(e),
            };
            // A window or the symbol itself is a function of the symbol on the case: the part's
            // value is then not one polynomial over atoms free of it.
            let varies = form
                .keys()
                .flatten()
                .any(|(k, _)| !matches!(k, Key::Atom(_)));
            if varies {
                return Split::Unknown(
                    "a label's part of the goal depends on the label within a case".into(),
                );
            }
            match &first {
                None => first = Some((form, (lo, hi))),
                Some((f, case)) if *f != form => {
                    return Split::Differs {
                        symbol: *symbol,
                        cases: vec![*case, (lo, hi)],
                    };
                }
                Some(_) => {}
            }
        }
        if let Some((f, _)) = first {
            add_form(&mut total, f);
        }
    }
    if total.is_empty() {
        Split::Equal
    } else {
        Split::Unknown("the labels' parts of the goal do not cancel".into())
    }
}

/// `acc += f`.
fn add_form<'a>(acc: &mut Form<'a>, f: Form<'a>) {
    for (m, c) in f {
        add_term(acc, m, c);
    }
}

/// The roots of the comparisons (`gt0`, `ge0`, `eq0`) whose argument is linear in one index
/// symbol, by symbol: where their values can change.
fn comparison_roots(arena: &Arena, roots: &[ExprId]) -> BTreeMap<u32, Vec<BigRational>> {
    let mut out: BTreeMap<u32, Vec<BigRational>> = BTreeMap::new();
    for atom in arena.reachable_atoms(roots) {
        let Atom::App(Func::Positive | Func::NonNegative | Func::IsZero, args) = arena.atom(atom)
        else {
            continue;
        };
        if let Some((symbol, slope, offset)) = linear_in_index(arena, args[0]) {
            out.entry(symbol)
                .or_default()
                .push(-offset.to_big() / slope.to_big());
        }
    }
    out
}

/// `e` as `slope·s + offset` for an index symbol s and a non-zero slope.
fn linear_in_index(arena: &Arena, e: ExprId) -> Option<(u32, Coeff, Coeff)> {
    let mut found = None;
    let mut offset = Coeff::zero();
    for (m, c) in &arena.poly(e).terms {
        match m.as_slice() {
            [] => offset = c.clone(),
            [(a, 1)] => match arena.atom(*a) {
                Atom::Symbol(s)
                    if matches!(arena.symbols()[*s as usize].1, SymbolKind::Index(_))
                        && found.is_none() =>
                {
                    found = Some((*s, c.clone()))
                }
                _ => return None,
            },
            _ => return None,
        }
    }
    found.map(|(s, slope)| (s, slope, offset))
}

/// The ranges `[lo, hi)` covering `[0, bound)` with no gap and no overlap, cut where a
/// comparison with one of `roots` can change its value: before and after an integer root
/// (which is a case of its own), at the ceiling of another.
fn cases_between(roots: &[BigRational], bound: u64) -> Vec<(u64, u64)> {
    let mut cuts = vec![0, bound];
    let clip = |x: &BigRational| -> Option<u64> {
        if x <= &BigRational::from_integer(0.into()) {
            return None;
        }
        let n = x.to_integer();
        u64::try_from(n).ok().filter(|&n| n < bound)
    };
    for r in roots {
        cuts.extend(clip(&r.ceil()));
        cuts.extend(clip(&(r.floor() + BigRational::from_integer(1.into()))));
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Builds the forms of expressions on the cases of one symbol.
struct Splitter<'a> {
    arena: &'a Arena,
    symbol: u32,
    /// Whether an expression's value depends on the symbol (its closure holds it).
    involves: FxHashMap<ExprId, bool>,
    /// The classes computed beyond the arena's memo (an atom is kept in a form only where it
    /// is provably finite).
    classes: FxHashMap<ExprId, Class>,
    /// The case being formed, and the forms built on it.
    case: (u64, u64),
    forms: FxHashMap<ExprId, Form<'a>>,
}

impl<'a> Splitter<'a> {
    fn new(arena: &'a Arena, symbol: u32) -> Self {
        Splitter {
            arena,
            symbol,
            involves: FxHashMap::default(),
            classes: FxHashMap::default(),
            case: (0, 0),
            forms: FxHashMap::default(),
        }
    }

    /// Whether `a` and `b` have the same form on `lo <= symbol < hi`.
    fn equal_on(&mut self, a: ExprId, b: ExprId, lo: u64, hi: u64) -> Result<bool, NoForm> {
        self.case = (lo, hi);
        self.forms.clear();
        let fa = self.form(a)?;
        let fb = self.form(b)?;
        Ok(fa == fb)
    }

    fn involves(&mut self, e: ExprId) -> bool {
        if let Some(&v) = self.involves.get(&e) {
            return v;
        }
        let arena = self.arena;
        let v = arena
            .poly(e)
            .terms
            .iter()
            .any(|(m, _)| m.iter().any(|&(atom, _)| self.atom_involves(atom)));
        self.involves.insert(e, v);
        v
    }

    fn atom_involves(&mut self, atom: AtomId) -> bool {
        match self.arena.atom(atom) {
            Atom::Symbol(s) => *s == self.symbol,
            Atom::NonFinite(_) => false,
            Atom::App(_, args) => args.iter().any(|&x| self.involves(x)),
        }
    }

    /// Whether atom `atom` is provably finite, by the normal form's own classes
    /// ([`Arena::class_in`]: what the arena has memoized and recorded, the rest computed by the
    /// same rules): an RMSNorm's `recip(sqrt(mean(x²) + eps))` and a softmax's `recip(Σ
    /// exp(b_k))` are positive, so finite, though no class was memoized for the atom alone.
    fn finite_atom(&mut self, atom: AtomId) -> bool {
        !self.arena.is_zero_times(atom) && self.arena.atom_class_in(atom, &mut self.classes).finite
    }

    /// `e`'s form on the current case. The forms are kept for this case only: on another
    /// the comparisons may take other values.
    fn form(&mut self, e: ExprId) -> Result<Form<'a>, NoForm> {
        if let Some(f) = self.forms.get(&e) {
            return Ok(f.clone());
        }
        let arena = self.arena;
        let involves = self.involves(e);
        let mut out = Form::new();
        for (m, c) in &arena.poly(e).terms {
            add_form(&mut out, self.term_form(m, c.clone(), involves)?);
        }
        if involves {
            self.forms.insert(e, out.clone());
        }
        Ok(out)
    }

    /// The form of the sum of `terms` on the current case.
    fn terms_form(&mut self, terms: &[Term]) -> Result<Form<'a>, NoForm> {
        let mut out = Form::new();
        for (m, c) in terms {
            add_form(&mut out, self.term_form(m, c.clone(), true)?);
        }
        Ok(out)
    }

    /// The form of the term `c·m` on the current case (`involves`: whether any of its atoms
    /// may hold the symbol).
    fn term_form(
        &mut self,
        m: &[(AtomId, u32)],
        c: Coeff,
        involves: bool,
    ) -> Result<Form<'a>, NoForm> {
        let mut term = constant(c);
        for &(atom, k) in m {
            let f = if involves && self.atom_involves(atom) {
                self.atom_form(atom)?
            } else {
                self.kept(atom)?
            };
            for _ in 0..k {
                term = mul(&term, &f);
            }
        }
        Ok(term)
    }

    /// Atom `atom`, free of the symbol, as a form: itself, where it is provably finite.
    fn kept(&mut self, atom: AtomId) -> Result<Form<'a>, NoForm> {
        if !self.finite_atom(atom) {
            return Err("an atom not provably finite in a form".into());
        }
        Ok(Form::from([(vec![(Key::Atom(atom), 1)], Coeff::one())]))
    }

    /// The form of an atom that depends on the symbol.
    fn atom_form(&mut self, atom: AtomId) -> Result<Form<'a>, NoForm> {
        let arena = self.arena;
        let (lo, hi) = self.case;
        match arena.atom(atom) {
            Atom::Symbol(_) if hi - lo == 1 => Ok(constant(Coeff::from_integer(lo as i64))),
            Atom::Symbol(_) => Ok(Form::from([(vec![(Key::Symbol, 1)], Coeff::one())])),
            Atom::NonFinite(_) => Err("a non-finite constant".into()),
            Atom::App(f @ (Func::Positive | Func::NonNegative | Func::IsZero), args) => {
                let x = self.form(args[0])?;
                let (slope, offset) = linear(&x)
                    .ok_or_else(|| "a comparison not linear in the symbol".to_string())?;
                let at = |t: u64| &slope * Coeff::from_integer(t as i64) + &offset;
                let holds = |v: Coeff| match f {
                    Func::Positive => v.is_positive(),
                    Func::NonNegative => !v.is_negative(),
                    _ => v.is_zero(),
                };
                let (first, last) = (at(lo), at(hi - 1));
                // A linear function takes every value between its ends, so its sign is the same
                // on the whole case when it is at both ends; `eq0` also needs no zero inside
                // (both ends non-zero with one sign) unless the case is one value.
                let constant_on_case = match f {
                    _ if slope.is_zero() || hi - lo == 1 => true,
                    Func::IsZero => {
                        !first.is_zero()
                            && !last.is_zero()
                            && first.is_positive() == last.is_positive()
                    }
                    _ => holds(first.clone()) == holds(last),
                };
                if !constant_on_case {
                    return Err("a comparison that changes value inside a case".into());
                }
                Ok(constant(Coeff::from_integer(i64::from(holds(first)))))
            }
            Atom::App(Func::Where, args) => {
                let c = self.form(args[0])?;
                let Some(c) = as_constant(&c) else {
                    return Err("a `where` whose condition is not constant on a case".into());
                };
                self.form(if c.is_zero() { args[2] } else { args[1] })
            }
            Atom::App(Func::Lookup, args) => {
                let table = &args[1..];
                let index = self.form(args[0])?;
                let entry = |i: Coeff| -> Result<usize, NoForm> {
                    i.to_usize()
                        .filter(|&i| i < table.len())
                        .ok_or_else(|| "a lookup outside its table on a case".to_string())
                };
                if let Some(i) = as_constant(&index) {
                    let i = entry(i)?;
                    return self.form(table[i]);
                }
                let (slope, shift) = linear(&index)
                    .ok_or_else(|| "a lookup index not linear in the symbol".to_string())?;
                if !slope.is_one() {
                    return Err("a lookup index with a slope other than 1".into());
                }
                // Entries read for t = lo .. hi - 1: table[lo + shift ..= hi - 1 + shift].
                let first = entry(Coeff::from_integer(lo as i64) + &shift)?;
                let last = entry(Coeff::from_integer((hi - 1) as i64) + &shift)?;
                let window = &table[first..=last];
                // Equal windows read equal entries at every t (whatever the entries hold);
                // their atoms must be finite for the forms' ring arithmetic to be IEEE's.
                for &x in window {
                    for (m, _) in &arena.poly(x).terms {
                        for &(a, _) in m {
                            if !self.finite_atom(a) {
                                return Err("a table entry not provably finite".into());
                            }
                        }
                    }
                }
                if window.iter().all(|&x| x == window[0]) {
                    return self.form(window[0]);
                }
                Ok(Form::from([(vec![(Key::Window(window), 1)], Coeff::one())]))
            }
            Atom::App(f, _) => Err(format!(
                "`{}` of the split symbol has no form by cases",
                f.name()
            )),
        }
    }
}

/// The constant `c` as a form.
fn constant<'a>(c: Coeff) -> Form<'a> {
    let mut f = Form::new();
    if !c.is_zero() {
        f.insert(Vec::new(), c);
    }
    f
}

/// The form's value when it is a constant.
fn as_constant(f: &Form) -> Option<Coeff> {
    match f.len() {
        0 => Some(Coeff::zero()),
        1 => f.get(&Vec::new()).cloned(),
        _ => None,
    }
}

/// The form as `slope·symbol + offset` (the slope possibly zero).
fn linear(f: &Form) -> Option<(Coeff, Coeff)> {
    let mut slope = Coeff::zero();
    let mut offset = Coeff::zero();
    for (m, c) in f {
        match m.as_slice() {
            [] => offset = c.clone(),
            [(Key::Symbol, 1)] => slope = c.clone(),
            _ => return None,
        }
    }
    Some((slope, offset))
}

fn mul<'a>(a: &Form<'a>, b: &Form<'a>) -> Form<'a> {
    let mut out = Form::new();
    for (ma, ca) in a {
        for (mb, cb) in b {
            add_term(&mut out, mul_mono(ma, mb), ca * cb);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(ar: &mut Arena, bound: u32) -> ExprId {
        ar.symbol("t", SymbolKind::Index(bound)).unwrap()
    }

    fn reals(ar: &mut Arena, name: &str, n: usize) -> Vec<ExprId> {
        (0..n)
            .map(|i| ar.symbol(&format!("{name}{i}"), SymbolKind::Real).unwrap())
            .collect()
    }

    #[test]
    fn the_cases_cover_the_range_with_no_gap_and_integer_roots_alone() {
        let r = |n: i64, d: i64| BigRational::new(n.into(), d.into());
        assert_eq!(
            cases_between(&[r(3, 1), r(7, 2), r(-1, 1), r(12, 1)], 10),
            vec![(0, 3), (3, 4), (4, 10)]
        );
        assert_eq!(cases_between(&[r(0, 1)], 5), vec![(0, 1), (1, 5)]);
        assert_eq!(cases_between(&[], 5), vec![(0, 5)]);
        assert!(cases_between(&[r(1, 1)], 0).is_empty());
    }

    /// `where(t < 4, a, b)` against `where(t >= 4, b, a)`: the same on both cases; a `where`
    /// with the branches swapped on one side differs on a case.
    #[test]
    fn wheres_on_complementary_comparisons_are_equal_by_cases() {
        let mut ar = Arena::default();
        let t = index(&mut ar, 8);
        let v = reals(&mut ar, "v", 2);
        let four = ar.int(4).unwrap();
        let below = ar.gt(four, t).unwrap();
        let above = ar.ge(t, four).unwrap();
        let x = ar.select(below, v[0], v[1]).unwrap();
        let y = ar.select(above, v[1], v[0]).unwrap();
        assert_ne!(x, y);
        assert_eq!(decide_by_cases(&ar, x, y, None), Split::Equal);
        let z = ar.select(above, v[0], v[1]).unwrap();
        assert!(matches!(
            decide_by_cases(&ar, x, z, None),
            Split::Differs { cases, .. } if cases == vec![(0, 4)]
        ));
    }

    /// `gt0(t - 4·[t >= 2])` is linear in t on each case of `[t >= 2]`'s root, but changes
    /// value inside `[3, 8)` (at t = 5): read at the case's first value only, it would equal
    /// `[t == 1]`, which it is not at t = 5.
    #[test]
    fn a_comparison_that_changes_inside_a_case_gives_no_form() {
        let mut ar = Arena::default();
        let t = index(&mut ar, 8);
        let v = reals(&mut ar, "v", 2);
        let (one, two, four) = (ar.int(1).unwrap(), ar.int(2).unwrap(), ar.int(4).unwrap());
        let step = ar.ge(t, two).unwrap();
        let shift = ar.mul(four, step).unwrap();
        let d = ar.sub(t, shift).unwrap();
        let c = ar.app(Func::Positive, vec![d]).unwrap();
        let x = ar.select(c, v[0], v[1]).unwrap();
        let at_one = ar.eq(t, one).unwrap();
        let y = ar.select(at_one, v[0], v[1]).unwrap();
        assert!(matches!(
            decide_by_cases(&ar, x, y, None),
            Split::Unknown(_)
        ));
    }

    /// `where(t < 4, -inf, 0) - where(not(t >= 4), -inf, 0)` is NaN for t < 4 (`-inf - -inf`),
    /// not 0: a non-finite atom is never kept in a form, in a branch or in a table entry.
    #[test]
    fn non_finite_atoms_are_never_cancelled_by_the_forms() {
        let mut ar = Arena::default();
        let t = index(&mut ar, 8);
        let v = reals(&mut ar, "v", 8);
        let (zero, four) = (ar.int(0).unwrap(), ar.int(4).unwrap());
        let ninf = ar.float(f64::NEG_INFINITY).unwrap();
        let below = ar.gt(four, t).unwrap();
        let above = ar.ge(t, four).unwrap();
        let not_above = ar.not(above).unwrap();
        let x = ar.select(below, ninf, zero).unwrap();
        let y = ar.select(not_above, ninf, zero).unwrap();
        let d = ar.sub(x, y).unwrap();
        assert!(matches!(
            decide_by_cases(&ar, d, zero, None),
            Split::Unknown(_)
        ));
        // The same through a table holding -inf: the lookups' windows cancel only as reals.
        let mut args = vec![t, ninf];
        args.extend_from_slice(&v[1..]);
        let row = ar.app(Func::Lookup, args).unwrap();
        let x = ar.select(below, row, zero).unwrap();
        let y = ar.select(not_above, row, zero).unwrap();
        let d = ar.sub(x, y).unwrap();
        assert!(matches!(
            decide_by_cases(&ar, d, zero, None),
            Split::Unknown(_)
        ));
        // With a finite table the same difference is 0 on every case.
        let mut args = vec![t];
        args.extend_from_slice(&v);
        let row = ar.app(Func::Lookup, args).unwrap();
        let x = ar.select(below, row, zero).unwrap();
        let y = ar.select(not_above, row, zero).unwrap();
        let d = ar.sub(x, y).unwrap();
        assert_eq!(decide_by_cases(&ar, d, zero, None), Split::Equal);
    }

    /// A masked lookup that stops one row short of its range's end reads past its table on
    /// the last case: no form (the kernel fails there), never a proof.
    #[test]
    fn a_window_past_its_table_gives_no_form() {
        let mut ar = Arena::default();
        let t = index(&mut ar, 8);
        let v = reals(&mut ar, "v", 8);
        let zero = ar.int(0).unwrap();
        let eight = ar.int(8).unwrap();
        let inside = ar.gt(eight, t).unwrap();
        let mut args = vec![t];
        args.extend_from_slice(&v[..7]);
        let short = ar.app(Func::Lookup, args).unwrap();
        let x = ar.select(inside, short, zero).unwrap();
        let mut args = vec![t];
        args.extend_from_slice(&v);
        let whole = ar.app(Func::Lookup, args).unwrap();
        assert!(matches!(
            decide_by_cases(&ar, x, whole, None),
            Split::Unknown(_)
        ));
    }

    /// A vocab-parallel loss over labels `t_i` in `[0, 4)`, two ranks of two classes each: the
    /// ranks' `lse_i - where(lo_r <= t_i < hi_r, lookup(t_i - lo_r, own rows), 0)` summed,
    /// against the spec's one-hot `Σ_j [t_i = j]·(lse_i - x_ij)`. `rank1_rows` picks the rows
    /// rank 1 reads (its own: 2..4).
    fn two_label_loss(ar: &mut Arena, rank1_rows: std::ops::Range<usize>) -> (ExprId, ExprId) {
        let (mut ranks, mut spec) = (Vec::new(), Vec::new());
        for i in 0..2 {
            let t = ar.symbol(&format!("t{i}"), SymbolKind::Index(4)).unwrap();
            let x = reals(ar, &format!("x{i}_"), 4);
            let exps: Vec<ExprId> = x
                .iter()
                .map(|&v| ar.app(Func::Exp, vec![v]).unwrap())
                .collect();
            let s = ar.sum(&exps).unwrap();
            let lse = ar.app(Func::Log, vec![s]).unwrap();
            ranks.push(lse);
            for (r, rows) in [(0usize, 0..2), (1, rank1_rows.clone())] {
                let (lo, hi) = (
                    ar.int(2 * r as i64).unwrap(),
                    ar.int(2 * r as i64 + 2).unwrap(),
                );
                let (from, below) = (ar.ge(t, lo).unwrap(), ar.gt(hi, t).unwrap());
                let inside = ar.mul(from, below).unwrap();
                let mut args = vec![ar.sub(t, lo).unwrap()];
                args.extend_from_slice(&x[rows]);
                let row = ar.app(Func::Lookup, args).unwrap();
                let zero = ar.int(0).unwrap();
                let picked = ar.select(inside, row, zero).unwrap();
                ranks.push(ar.neg(picked).unwrap());
            }
            for (j, &xj) in x.iter().enumerate() {
                let jj = ar.int(j as i64).unwrap();
                let hot = ar.eq(t, jj).unwrap();
                let nll = ar.sub(lse, xj).unwrap();
                spec.push(ar.mul(hot, nll).unwrap());
            }
        }
        (ar.sum(&ranks).unwrap(), ar.sum(&spec).unwrap())
    }

    /// Each label is split on its own four cases (not the sixteen of both), the parts' forms
    /// the same on every case and cancelling the ranks' `lse` terms: proved. Rank 1 reading
    /// rank 0's rows (the wrong vocab shard) gives a label part that differs between cases:
    /// never proved (with the cases compared only through the first, it would be: on `t = 0`
    /// the part is right).
    #[test]
    fn a_loss_over_two_labels_is_decided_label_by_label() {
        let mut ar = Arena::default();
        let (ranks, spec) = two_label_loss(&mut ar, 2..4);
        assert_ne!(ranks, spec);
        assert_eq!(decide_by_cases(&ar, ranks, spec, None), Split::Equal);
        let mut ar = Arena::default();
        let (ranks, spec) = two_label_loss(&mut ar, 0..2);
        assert!(matches!(
            decide_by_cases(&ar, ranks, spec, None),
            Split::Differs { ref cases, .. } if cases.len() == 2
        ));
        // The decision procedure refutes it with a real witness.
        let cfg = crate::decide::DecideConfig {
            z3_timeout: None,
            ..Default::default()
        };
        assert!(matches!(
            crate::decide::decide(&ar, ranks, spec, &cfg),
            crate::decide::Outcome::Refuted { .. }
        ));
    }

    /// `t1` against `t2`, each written `t·[t < 2] + t·[t >= 2]`: each label's part is "the
    /// symbol" on both of its cases, the same key for both labels, so summing the parts would
    /// cancel them. A part that depends on its label within a case is never summed.
    #[test]
    fn a_label_part_that_varies_within_a_case_is_never_summed() {
        let mut ar = Arena::default();
        let two = ar.int(2).unwrap();
        let mut sides = Vec::new();
        for i in 0..2 {
            let t = ar.symbol(&format!("t{i}"), SymbolKind::Index(4)).unwrap();
            let below = ar.gt(two, t).unwrap();
            let above = ar.ge(t, two).unwrap();
            let lower = ar.mul(t, below).unwrap();
            let upper = ar.mul(t, above).unwrap();
            sides.push(ar.add(lower, upper).unwrap());
        }
        assert_ne!(decide_by_cases(&ar, sides[0], sides[1], None), Split::Equal);
        let mut by_labels = labels_of(&ar, sides[0], sides[1]);
        assert!(matches!(by_labels(), Split::Unknown(_)));
    }

    /// `[t1 < 2] + [t1 >= 2] + x` against the same with `t2` and `y`: each label's part is
    /// the constant 1 on every case, but the rest, `x - y`, does not cancel.
    #[test]
    fn label_parts_whose_sum_is_not_zero_are_not_proved() {
        let mut ar = Arena::default();
        let two = ar.int(2).unwrap();
        let mut sides = Vec::new();
        for (i, name) in ["x", "y"].into_iter().enumerate() {
            let t = ar.symbol(&format!("t{i}"), SymbolKind::Index(4)).unwrap();
            let v = ar.symbol(name, SymbolKind::Real).unwrap();
            let below = ar.gt(two, t).unwrap();
            let above = ar.ge(t, two).unwrap();
            sides.push(ar.sum(&[below, above, v]).unwrap());
        }
        let mut by_labels = labels_of(&ar, sides[0], sides[1]);
        assert!(matches!(by_labels(), Split::Unknown(_)));
        assert_ne!(decide_by_cases(&ar, sides[0], sides[1], None), Split::Equal);
    }

    /// [`decide_by_labels`] on `a`, `b` and the roots of their comparisons.
    fn labels_of<'a>(ar: &'a Arena, a: ExprId, b: ExprId) -> impl FnMut() -> Split + 'a {
        let roots = comparison_roots(ar, &[a, b]);
        move || decide_by_labels(ar, a, b, &roots, None)
    }

    /// `where(t < 4, r, 0) - where(not(t >= 4), r, 0)` is 0 only where `r` is finite: proved
    /// for an RMSNorm's `recip(x² + eps)` and a softmax's `recip(exp(x) + exp(y))` (positive),
    /// never for `recip(x²)` or `recip(x)`, infinite at `x = 0` (`inf - inf` is NaN).
    #[test]
    fn a_reciprocal_is_kept_in_a_form_only_where_it_is_provably_positive() {
        let mut ar = Arena::default();
        let t = index(&mut ar, 8);
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let (zero, four) = (ar.int(0).unwrap(), ar.int(4).unwrap());
        let eps = ar.float(1e-5).unwrap();
        let square = ar.mul(x, x).unwrap();
        let variance = ar.add(square, eps).unwrap();
        let (ex, ey) = (
            ar.app(Func::Exp, vec![x]).unwrap(),
            ar.app(Func::Exp, vec![y]).unwrap(),
        );
        let exps = ar.add(ex, ey).unwrap();
        let below = ar.gt(four, t).unwrap();
        let above = ar.ge(t, four).unwrap();
        let not_above = ar.not(above).unwrap();
        let masked_difference = |ar: &mut Arena, of: ExprId| {
            let r = ar.recip(of).unwrap();
            let u = ar.select(below, r, zero).unwrap();
            let v = ar.select(not_above, r, zero).unwrap();
            ar.sub(u, v).unwrap()
        };
        for (of, finite) in [(variance, true), (exps, true), (square, false), (x, false)] {
            let d = masked_difference(&mut ar, of);
            let split = decide_by_cases(&ar, d, zero, None);
            if finite {
                assert_eq!(split, Split::Equal, "{}", ar.render(of, 80));
            } else {
                assert!(matches!(split, Split::Unknown(_)), "{}", ar.render(of, 80));
            }
        }
    }
}
