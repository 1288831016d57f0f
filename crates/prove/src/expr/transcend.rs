//! Rules of the normal form for exp, log, reciprocals of sums of exponentials and IEEE
//! infinities: what softmax, logsumexp and the log-sum-exp merge of ring attention need to
//! meet one normal form (docs/prove.md, section 4).
//!
//! Every rule is a theorem over the extended reals the interpreter computes in, under the
//! side condition it checks here, never a random-point agreement:
//!
//! - `finite + c·(-inf) = -inf` (c > 0), `+inf` for c < 0, NaN when both infinities or a
//!   NaN meet: only where every other summand is *provably finite* ([`Class`]);
//! - `max(a, -inf) = a`, `min(a, +inf) = a` (for every a, NaN and infinities included);
//!   `exp(-inf) = 0`, `exp(+inf) = +inf`, `0·inf = NaN`;
//! - `exp(a)·exp(b) = exp(a + b)` for finite a, b;
//! - `exp(a + k·log S) = S^k·exp(a)` for finite a, integer k and S provably positive;
//! - `log(Σ c_k exp(b_k)) = C + log(Σ c_k exp(b_k - C))` and
//!   `1/Σ c_k exp(b_k) = exp(-C) / Σ c_k exp(b_k - C)` for finite b_k, C the terms every
//!   b_k shares (positive c_k for the logarithm); with one summand, `log(exp b) = b` and
//!   `1/exp(b) = exp(-b)`;
//! - `(p·recip(X))·(X·q) = p·q` for X provably positive.
//!
//! The shared-terms shift C makes the rules canonical: shifting every b_k by the same D
//! shifts C by D and leaves the rest unchanged, so softmax's and logsumexp's max shifts,
//! whatever their form, cancel.

use super::{
    add_term, from_map, mul_mono, Arena, Atom, AtomId, BudgetError, Built, Func, Mono, Poly,
};
use crate::coeff::Coeff;
use crate::expr::{ExprId, SymbolKind};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// What is provably known of an expression's value for every valid input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Class {
    /// A real number (never ±inf or NaN).
    pub finite: bool,
    /// Finite and >= 0.
    pub nonneg: bool,
    /// Finite and > 0.
    pub positive: bool,
}

const FINITE: Class = Class {
    finite: true,
    nonneg: false,
    positive: false,
};
pub(super) const NONNEG: Class = Class {
    finite: true,
    nonneg: true,
    positive: false,
};
const POSITIVE: Class = Class {
    finite: true,
    nonneg: true,
    positive: true,
};
const UNKNOWN: Class = Class {
    finite: false,
    nonneg: false,
    positive: false,
};

/// The largest |k| of a `k·log S` pulled out of an exponential as `S^k`.
const MAX_LOG_POWER: u32 = 4;

/// Named functions finite on every finite argument.
const FINITE_NAMED: &[&str] = &[
    "sin", "cos", "atan", "asinh", "floor", "ceil", "trunc", "round", "sign", "erfc", "sinh",
    "cosh", "expm1", "exp2",
];

impl Arena {
    /// Records a proved fact about `e` (a square is non-negative, a sum of non-negative
    /// terms too), joined with what its polynomial shows.
    pub(super) fn hint(&mut self, e: ExprId, fact: Class) {
        let c = self.class(e);
        let joined = Class {
            finite: c.finite || fact.finite,
            nonneg: c.nonneg || fact.nonneg,
            positive: c.positive || fact.positive,
        };
        self.classes.insert(e, joined);
    }

    /// What is already known of `e` without computing: its memoized class, or a constant's.
    pub(super) fn known_class(&self, e: ExprId) -> Option<Class> {
        if let Some(&c) = self.classes.get(&e) {
            return Some(c);
        }
        let c = self.as_const(e)?;
        Some(if c.is_positive() {
            POSITIVE
        } else if c.is_zero() {
            NONNEG
        } else {
            FINITE
        })
    }

    /// A sum of items each known non-negative is non-negative, positive when one is.
    pub(super) fn hint_sum(&mut self, items: &[ExprId], sum: ExprId) {
        let mut positive = false;
        for &e in items {
            match self.known_class(e) {
                Some(c) if c.nonneg => positive |= c.positive,
                _ => return,
            }
        }
        self.hint(sum, if positive { POSITIVE } else { NONNEG });
    }

    /// What is provably known of `e`'s value (memoized).
    pub fn class(&mut self, e: ExprId) -> Class {
        if let Some(&c) = self.classes.get(&e) {
            return c;
        }
        // Computed with the arena's memo taken out, so that one implementation serves this and
        // the callers that hold the arena shared ([`Arena::class_in`]).
        let mut memo = std::mem::take(&mut self.classes);
        let class = self.class_in(e, &mut memo);
        self.classes = memo;
        class
    }

    /// `e`'s class as [`Arena::class`] computes it, for a caller holding the arena shared
    /// (the case split, `decide/split.rs`): the arena's memoized classes (its recorded facts
    /// included) are read, and what is computed beyond them is kept in `memo`.
    pub(crate) fn class_in(&self, e: ExprId, memo: &mut FxHashMap<ExprId, Class>) -> Class {
        if let Some(&c) = self.classes.get(&e).or_else(|| memo.get(&e)) {
            return c;
        }
        let terms = &self.poly(e).terms;
        let mut finite = true;
        let mut nonneg = true;
        let mut positive_term = false;
        for (m, c) in terms {
            let mut mono_nonneg = true;
            let mut mono_positive = true;
            for &(a, k) in m {
                let ac = self.atom_class_in(a, memo);
                finite &= ac.finite;
                mono_nonneg &= ac.nonneg || k % 2 == 0;
                mono_positive &= ac.positive;
            }
            nonneg &= c.is_positive() && mono_nonneg;
            positive_term |= c.is_positive() && mono_positive;
        }
        let class = if !finite {
            UNKNOWN
        } else if nonneg && positive_term {
            POSITIVE
        } else if nonneg {
            NONNEG
        } else {
            FINITE
        };
        memo.insert(e, class);
        class
    }

    /// What is provably known of atom `a`'s value ([`Arena::class_in`] for its arguments).
    pub(crate) fn atom_class_in(&self, a: AtomId, memo: &mut FxHashMap<ExprId, Class>) -> Class {
        match self.atom(a) {
            Atom::Symbol(s) => match self.symbols[*s as usize].1 {
                SymbolKind::Real | SymbolKind::Int => FINITE,
                SymbolKind::Bool | SymbolKind::Index(_) => NONNEG,
            },
            Atom::NonFinite(_) => UNKNOWN,
            Atom::App(f, args) => {
                let cs: Vec<Class> = args.iter().map(|&x| self.class_in(x, memo)).collect();
                let all_finite = cs.iter().all(|c| c.finite);
                match f {
                    Func::Exp if all_finite => POSITIVE,
                    Func::Log if cs[0].positive => FINITE,
                    Func::Sqrt if cs[0].positive => POSITIVE,
                    Func::Sqrt if cs[0].nonneg => NONNEG,
                    Func::Recip if cs[0].positive => POSITIVE,
                    Func::Tanh | Func::Erf | Func::Product if all_finite => FINITE,
                    Func::Max if all_finite => {
                        if cs.iter().any(|c| c.positive) {
                            POSITIVE
                        } else if cs.iter().any(|c| c.nonneg) {
                            NONNEG
                        } else {
                            FINITE
                        }
                    }
                    // One of the arguments: what all of them are.
                    Func::Min if all_finite => weakest(&cs),
                    // Comparisons are 0 or 1 whatever their argument (NaN compares false);
                    // indices are positions.
                    Func::Positive
                    | Func::NonNegative
                    | Func::IsZero
                    | Func::ArgMax
                    | Func::ArgMin
                    | Func::SortedIndex { .. } => NONNEG,
                    // One of the arguments: what all of them are.
                    Func::SortedValue { .. } if all_finite => weakest(&cs),
                    // One of the branches (the condition may be anything, NaN included).
                    Func::Where if cs[1].finite && cs[2].finite => weakest(&cs[1..]),
                    // lookup(i, t...) is t_i where i is provably an index into the table.
                    Func::Lookup if cs[1..].iter().all(|c| c.finite) => {
                        let n = args.len() - 1;
                        let in_range = match self.as_const(args[0]) {
                            Some(i) => i.to_usize().is_some_and(|i| i < n),
                            None => self
                                .index_bound(args[0])
                                .or_else(|| self.position_bound(args[0]))
                                .is_some_and(|b| b as usize <= n),
                        };
                        if in_range {
                            weakest(&cs[1..])
                        } else {
                            UNKNOWN
                        }
                    }
                    Func::Named(n) if all_finite && FINITE_NAMED.contains(&n.as_str()) => FINITE,
                    _ => UNKNOWN,
                }
            }
        }
    }

    /// When `e` is exactly `c·(±inf)` or `c·NaN`: the value's kind (1: +inf, -1: -inf,
    /// 0: NaN).
    pub fn pure_nonfinite(&self, e: ExprId) -> Option<i8> {
        match self.poly(e).terms.as_slice() {
            [(m, c)] if m.len() == 1 && m[0].1 == 1 => match self.atom(m[0].0) {
                Atom::NonFinite(0) => Some(0),
                Atom::NonFinite(k) if c.is_positive() => Some(*k),
                Atom::NonFinite(k) => Some(-*k),
                _ => None,
            },
            _ => None,
        }
    }

    /// The non-finite value of kind `k` (as [`Arena::pure_nonfinite`]).
    pub(super) fn nonfinite(&mut self, k: i8) -> Built {
        self.float(match k {
            1 => f64::INFINITY,
            -1 => f64::NEG_INFINITY,
            _ => f64::NAN,
        })
    }

    /// A sum holding a pure infinity or NaN whose other summands are provably finite: its
    /// IEEE value. `None` when the rule does not apply (the sum is built as a polynomial).
    pub(super) fn absorb_sum(&mut self, items: &[ExprId]) -> Option<Built> {
        let kinds: Vec<Option<i8>> = items.iter().map(|&e| self.pure_nonfinite(e)).collect();
        if kinds.iter().all(Option::is_none) {
            return None;
        }
        for (&e, k) in items.iter().zip(&kinds) {
            if k.is_none() && !self.class(e).finite {
                return None;
            }
        }
        let ks: Vec<i8> = kinds.into_iter().flatten().collect();
        let value = if ks.contains(&0) || (ks.contains(&1) && ks.contains(&-1)) {
            0
        } else {
            ks[0]
        };
        Some(self.nonfinite(value))
    }

    /// Every term of `e` as `c·exp(b)` (one exp atom, exponent 1, nothing else): the
    /// (coefficient, argument) pairs; `None` otherwise or for 0.
    fn exp_terms(&self, e: ExprId) -> Option<Vec<(Coeff, ExprId)>> {
        let p = self.poly(e);
        if p.terms.is_empty() {
            return None;
        }
        p.terms
            .iter()
            .map(|(m, c)| match m.as_slice() {
                [(a, 1)] => match self.atom(*a) {
                    Atom::App(Func::Exp, args) => Some((c.clone(), args[0])),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// The terms every one of `args` holds with the same coefficient.
    fn shared_terms(&self, args: &[ExprId]) -> Poly {
        let first = &self.poly(args[0]).terms;
        let terms = first
            .iter()
            .filter(|t| {
                args[1..].iter().all(|&b| {
                    self.poly(b)
                        .terms
                        .binary_search_by(|u| u.0.cmp(&t.0))
                        .ok()
                        .is_some_and(|i| self.poly(b).terms[i].1 == t.1)
                })
            })
            .cloned()
            .collect();
        Poly { terms }
    }

    /// `e = Σ c_k exp(b_k)` with finite b_k sharing a non-zero C (and positive c_k where
    /// `positive`): (C, Σ c_k exp(b_k - C)).
    fn factor_exp_shift(
        &mut self,
        e: ExprId,
        positive: bool,
    ) -> Option<Result<(ExprId, ExprId), BudgetError>> {
        // A constant term is c·exp(0): a lane entry equal to its shift.
        let constant = self.poly(e).terms.iter().any(|(m, _)| m.is_empty());
        let terms = if constant {
            let zero = match self.int(0) {
                Ok(z) => z,
                Err(err) => return Some(Err(err)),
            };
            let p = self.poly(e).terms.clone();
            let mut out = Vec::with_capacity(p.len());
            for (m, c) in p {
                if m.is_empty() {
                    out.push((c, zero));
                    continue;
                }
                let single = self.intern(Poly {
                    terms: vec![(m, Coeff::one())],
                });
                match single {
                    Ok(t) => out.push((c, self.exp_terms(t)?[0].1)),
                    Err(err) => return Some(Err(err)),
                }
            }
            out
        } else {
            self.exp_terms(e)?
        };
        if positive && !terms.iter().all(|(c, _)| c.is_positive()) {
            return None;
        }
        let args: Vec<ExprId> = terms.iter().map(|t| t.1).collect();
        if !args.iter().all(|&b| self.class(b).finite) {
            return None;
        }
        let shared = self.shared_terms(&args);
        if shared.terms.is_empty() {
            return None;
        }
        Some((|| {
            let c = self.intern(shared)?;
            let mut rest = Vec::with_capacity(terms.len());
            for (k, b) in &terms {
                let d = self.sub(*b, c)?;
                let x = self.app(Func::Exp, vec![d])?;
                rest.push(self.scale(x, k)?);
            }
            Ok((c, self.sum(&rest)?))
        })())
    }

    /// exp(a) by the rules above; `None` where the atom is built as it is.
    pub(super) fn exp_rule(&mut self, a: ExprId) -> Option<Built> {
        if let Some(k) = self.pure_nonfinite(a) {
            return Some(match k {
                -1 => self.int(0),
                k => self.nonfinite(k),
            });
        }
        if !self.class(a).finite {
            return None;
        }
        // exp(rest + Σ k log S) = exp(rest) Π S^k.
        let mut pulled: Vec<(ExprId, i64)> = Vec::new();
        let mut rest = Vec::new();
        for (m, c) in self.poly(a).terms.clone() {
            let log_of = match m.as_slice() {
                [(x, 1)]
                    if c.is_integer() && c.abs() <= Coeff::from_integer(MAX_LOG_POWER as i64) =>
                {
                    match self.atom(*x) {
                        Atom::App(Func::Log, args) => Some(args[0]),
                        _ => None,
                    }
                }
                _ => None,
            };
            match log_of {
                Some(s) if self.class(s).positive => {
                    pulled.push((s, c.to_f64() as i64));
                }
                _ => rest.push((m, c)),
            }
        }
        if pulled.is_empty() {
            return None;
        }
        Some((|| {
            let r = self.intern(Poly { terms: rest })?;
            let mut acc = self.app(Func::Exp, vec![r])?;
            for (s, k) in pulled {
                let p = self.pow_int(s, k)?;
                acc = self.mul(acc, p)?;
            }
            Ok(acc)
        })())
    }

    /// log(a) by the rules above.
    pub(super) fn log_rule(&mut self, a: ExprId) -> Option<Built> {
        if let [(m, c)] = self.poly(a).terms.as_slice() {
            if let ([(x, 1)], true) = (m.as_slice(), c.is_one()) {
                if let Atom::App(Func::Exp, args) = self.atom(*x) {
                    let b = args[0];
                    if self.class(b).finite {
                        return Some(Ok(b));
                    }
                }
            }
        }
        let built = self.factor_exp_shift(a, true)?;
        Some(built.and_then(|(c, r)| {
            let l = self.app(Func::Log, vec![r])?;
            self.add(c, l)
        }))
    }

    /// 1/a by the rules above.
    pub(super) fn recip_rule(&mut self, a: ExprId) -> Option<Built> {
        if let Some(k) = self.pure_nonfinite(a) {
            // 1/±inf = 0, 1/NaN = NaN.
            return Some(if k == 0 {
                self.nonfinite(0)
            } else {
                self.int(0)
            });
        }
        if let Some(terms) = self.exp_terms(a) {
            if let [(c, b)] = terms.as_slice() {
                if self.class(*b).finite {
                    let (c, b) = (c.clone(), *b);
                    return Some((|| {
                        let nb = self.neg(b)?;
                        let e = self.app(Func::Exp, vec![nb])?;
                        self.scale(e, &c.recip())
                    })());
                }
            }
        }
        let built = self.factor_exp_shift(a, false)?;
        Some(built.and_then(|(c, r)| {
            let nc = self.neg(c)?;
            let e = self.app(Func::Exp, vec![nc])?;
            let inv = self.recip(r)?;
            self.mul(e, inv)
        }))
    }

    /// Whether monomial `m` holds an exponential or the reciprocal of a sum of
    /// exponentials (a softmax weight, a log-sum-exp rescaling).
    pub(crate) fn softmax_weight(&self, m: &Mono) -> bool {
        m.iter().any(|&(a, _)| self.is_weight_atom(a))
    }

    /// Whether atom `a` is a softmax weight's factor: an exponential, or the reciprocal of
    /// a sum of exponentials.
    pub(crate) fn is_weight_atom(&self, a: AtomId) -> bool {
        match self.atom(a) {
            Atom::App(Func::Exp, _) => true,
            Atom::App(Func::Recip, args) => self.exp_terms(args[0]).is_some(),
            _ => false,
        }
    }

    /// Whether `e` is already known to be finite (a memoized class; nothing is computed).
    pub(crate) fn known_finite(&self, e: ExprId) -> bool {
        self.known_class(e).is_some_and(|c| c.finite)
    }

    /// Whether atom `a` is an exponential of a finite argument.
    fn finite_exp(&mut self, a: AtomId) -> Option<ExprId> {
        match self.atom(a) {
            Atom::App(Func::Exp, args) => {
                let b = args[0];
                self.class(b).finite.then_some(b)
            }
            _ => None,
        }
    }

    /// Merges the exponentials of each monomial of `acc` (exp(a)^i exp(b)^j = exp(ia + jb),
    /// finite a, b) and collects the result; `acc` as it is when no monomial has two.
    pub(super) fn merge_exps(&mut self, acc: BTreeMap<Mono, Coeff>) -> Built {
        let mut needs = false;
        for m in acc.keys() {
            let mut n = 0;
            for &(a, k) in m {
                if matches!(self.atom(a), Atom::App(Func::Exp, _)) {
                    n += k;
                }
            }
            if n >= 2 {
                needs = true;
                break;
            }
        }
        if !needs {
            return self.intern(from_map(acc));
        }
        let mut plain: BTreeMap<Mono, Coeff> = BTreeMap::new();
        let mut merged: Vec<ExprId> = Vec::new();
        for (m, c) in acc {
            let mut args: Vec<(ExprId, u32)> = Vec::new();
            let mut others: Mono = Vec::new();
            for &(a, k) in &m {
                match self.finite_exp(a) {
                    Some(b) => args.push((b, k)),
                    None => others.push((a, k)),
                }
            }
            if args.iter().map(|x| x.1).sum::<u32>() < 2 {
                add_term(&mut plain, m, c);
                continue;
            }
            let mut parts = Vec::with_capacity(args.len());
            for (b, k) in args {
                parts.push(self.scale(b, &Coeff::from_integer(i64::from(k)))?);
            }
            let s = self.sum(&parts)?;
            let e = self.app(Func::Exp, vec![s])?;
            let rest = self.intern(Poly {
                terms: vec![(others, c)],
            })?;
            merged.push(self.mul(rest, e)?);
        }
        let p = self.intern(from_map(plain))?;
        merged.push(p);
        self.sum(&merged)
    }

    /// `(p·recip(X))·y` where y = X·q for a single term q without exponentials and X
    /// provably positive: p·q. `None` where no such X divides.
    pub(super) fn cancel_recip(&mut self, a: ExprId, b: ExprId) -> Option<Built> {
        for (x, y) in [(a, b), (b, a)] {
            let first = match self.poly(x).terms.first() {
                Some(t) => t.0.clone(),
                None => continue,
            };
            for &(r, _) in &first {
                let Atom::App(Func::Recip, args) = self.atom(r) else {
                    continue;
                };
                let den = args[0];
                if self.poly(den).terms.len() != self.poly(y).terms.len() {
                    continue;
                }
                if !self
                    .poly(x)
                    .terms
                    .iter()
                    .all(|(m, _)| m.iter().any(|&(at, _)| at == r))
                {
                    continue;
                }
                let Some(q) = self.quotient_term(y, den) else {
                    continue;
                };
                if !self.class(den).positive {
                    continue;
                }
                return Some((|| {
                    let mut acc: BTreeMap<Mono, Coeff> = BTreeMap::new();
                    for (m, c) in &self.poly(x).terms {
                        let m2: Mono = m
                            .iter()
                            .filter_map(|&(at, k)| match (at == r, k) {
                                (true, 1) => None,
                                (true, k) => Some((at, k - 1)),
                                _ => Some((at, k)),
                            })
                            .collect();
                        add_term(&mut acc, m2, c.clone());
                    }
                    let p = self.intern(from_map(acc))?;
                    let q = self.intern(Poly { terms: vec![q] })?;
                    self.mul(p, q)
                })());
            }
        }
        None
    }

    /// The single term q with y = X·q exactly, when there is one without exponentials.
    fn quotient_term(&self, y: ExprId, x: ExprId) -> Option<(Mono, Coeff)> {
        let (py, px) = (self.poly(y), self.poly(x));
        let (m0, c0) = px.terms.first()?;
        for (my, cy) in &py.terms {
            let Some(qm) = mono_div(my, m0) else {
                continue;
            };
            if qm
                .iter()
                .any(|&(a, _)| matches!(self.atom(a), Atom::App(Func::Exp, _)))
            {
                continue;
            }
            let qc = cy / c0;
            let mut product: Vec<(Mono, Coeff)> = px
                .terms
                .iter()
                .map(|(m, c)| (mul_mono(m, &qm), c * &qc))
                .collect();
            product.sort_by(|s, t| s.0.cmp(&t.0));
            if product == py.terms {
                return Some((qm, qc));
            }
        }
        None
    }
}

/// What every one of `cs` (all finite) is.
fn weakest(cs: &[Class]) -> Class {
    if cs.iter().all(|c| c.positive) {
        POSITIVE
    } else if cs.iter().all(|c| c.nonneg) {
        NONNEG
    } else {
        FINITE
    }
}

/// m / d as monomials, when d divides m.
fn mono_div(m: &Mono, d: &Mono) -> Option<Mono> {
    let mut out = Vec::with_capacity(m.len());
    let mut j = 0;
    for &(a, k) in m {
        if j < d.len() && d[j].0 == a {
            if d[j].1 > k {
                return None;
            }
            if k > d[j].1 {
                out.push((a, k - d[j].1));
            }
            j += 1;
        } else if j < d.len() && d[j].0 < a {
            return None;
        } else {
            out.push((a, k));
        }
    }
    (j == d.len()).then_some(out)
}
