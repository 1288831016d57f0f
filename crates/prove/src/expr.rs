//! Hash-consed scalar expressions in normal form.
//!
//! Every expression is stored once, as a polynomial with rational coefficients over *atoms*:
//! input symbols, non-finite constants, and applications of interpreted functions whose
//! arguments are themselves expressions in normal form. The smart constructors of [`Arena`]
//! normalize as they build (sums and products are expanded and collected, function arguments are
//! canonicalized), so two expressions with the same normal form get the same [`ExprId`] and
//! equality of ids is a proof of equality over the reals.

pub use crate::coeff::Coeff;
use num_rational::BigRational;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod apply;
mod func;
mod lookup;
mod render;
mod selector;
mod transcend;
pub use func::{erf, stable_order, Func};
pub use transcend::Class;

/// A hash-consed expression in normal form (an index into its [`Arena`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExprId(pub u32);

/// A hash-consed atom (an index into its [`Arena`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AtomId(pub u32);

/// What values an input symbol ranges over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymbolKind {
    /// Any real number (float tensors).
    Real,
    /// Any integer (integer tensors).
    Int,
    /// 0 or 1 (bool tensors).
    Bool,
    /// An integer in [0, bound): an index into something of that size (token ids, targets).
    Index(u32),
}

/// The function name of `0·x` for an x not provably finite ([`Arena::scale`]).
pub const ZERO_TIMES: &str = "zero_times";

/// What an atom is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Atom {
    /// Input symbol number `n` (see [`Arena::symbol_name`]).
    Symbol(u32),
    /// +inf (1), -inf (-1) or NaN (0): f64 constants that are not rationals.
    NonFinite(i8),
    /// A function applied to normalized arguments.
    App(Func, Vec<ExprId>),
}

/// A monomial: atoms with positive exponents, sorted by atom.
pub type Mono = Vec<(AtomId, u32)>;

/// A polynomial: terms sorted by monomial, no zero coefficient. The empty polynomial is 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Poly {
    /// The terms, sorted by monomial.
    pub terms: Vec<(Mono, Coeff)>,
}

/// An expression grew past a budget: the caller reports the program as too large.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} exceeds the limit of {limit} (reached {reached})")]
pub struct BudgetError {
    /// What grew too large.
    pub what: &'static str,
    /// The limit.
    pub limit: usize,
    /// How far it got.
    pub reached: usize,
}

/// Limits that keep normalization from running out of memory.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Terms of one expanded polynomial.
    pub terms_per_expr: usize,
    /// Terms stored in the whole arena.
    pub total_terms: usize,
    /// Products whose expansion would have more terms than this stay a product (a
    /// [`Func::Product`] atom of the factors' primitive parts) instead of being expanded:
    /// deep chains of linear maps would otherwise grow as the product of their widths.
    /// Both programs compute the same factors where they compute the same values, so the
    /// atoms match; where one distributes a product the other does not, the goal falls to
    /// the later layers (never to a wrong verdict).
    pub expand_limit: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            terms_per_expr: 20_000,
            total_terms: 50_000_000,
            expand_limit: 16,
        }
    }
}

/// The store of hash-consed expressions and atoms.
pub struct Arena {
    polys: Vec<Arc<Poly>>,
    // Interning hashes every polynomial built; Fx is several times cheaper than SipHash here,
    // and nothing iterates these maps, so output does not depend on the hasher.
    poly_ids: FxHashMap<Arc<Poly>, ExprId>,
    atoms: Vec<Atom>,
    atom_ids: FxHashMap<Atom, AtomId>,
    symbols: Vec<(String, SymbolKind)>,
    symbol_ids: HashMap<String, u32>,
    budget: Budget,
    stored_terms: usize,
    deadline: Option<Deadline>,
    // What is provably known of each expression's value (transcend.rs), memoized.
    classes: FxHashMap<ExprId, Class>,
    // Per atom: whether it is a `zero_times` application (see `intern`); and whether any is.
    zero_times: Vec<bool>,
    any_zero_times: bool,
    // The product expansion layer's rewriting, kept across the goals decided in this arena
    // (its ids are this arena's; `expand::RewriteMemo` empties itself when the arena grows).
    rewrite_memo: Mutex<crate::expand::RewriteMemo>,
    // The random witness layer's modular points and what they evaluated, likewise.
    modular_points: Mutex<crate::decide::ModularPoints>,
}

/// When normalization gives up, and how often it looks at the clock.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    at: Instant,
    limit: Duration,
    // Reading the clock on every interned polynomial would cost more than some of the
    // normalizations it guards; every few thousand still ends a runaway loop within
    // milliseconds.
    countdown: u32,
}

const CLOCK_EVERY: u32 = 4096;

/// [`BudgetError::what`] when the deadline of [`Arena::set_deadline`] passed (limit and
/// reached in milliseconds).
pub const TIME_LIMIT: &str = "the time limit (milliseconds)";

impl Default for Arena {
    fn default() -> Self {
        Arena::new(Budget::default())
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Arena({} exprs, {} atoms, {} symbols)",
            self.polys.len(),
            self.atoms.len(),
            self.symbols.len()
        )
    }
}

/// The result of a constructor: the expression, or the budget it broke.
pub type Built = Result<ExprId, BudgetError>;

impl Arena {
    /// An empty arena with the given limits.
    pub fn new(budget: Budget) -> Self {
        Arena {
            polys: Vec::new(),
            poly_ids: FxHashMap::default(),
            atoms: Vec::new(),
            atom_ids: FxHashMap::default(),
            symbols: Vec::new(),
            symbol_ids: HashMap::new(),
            budget,
            stored_terms: 0,
            deadline: None,
            classes: FxHashMap::default(),
            zero_times: Vec::new(),
            any_zero_times: false,
            rewrite_memo: Mutex::default(),
            modular_points: Mutex::default(),
        }
    }

    /// Makes every constructor fail with a [`BudgetError`] once `limit` has passed since
    /// `started`: normalization loops (a wide matmul, a long sum) end promptly at a time
    /// limit instead of running to completion first.
    pub fn set_deadline(&mut self, started: Instant, limit: Duration) {
        self.deadline = Some(Deadline {
            at: started + limit,
            limit,
            countdown: CLOCK_EVERY,
        });
    }

    /// Number of distinct expressions stored.
    pub fn len(&self) -> usize {
        self.polys.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.polys.is_empty()
    }

    /// Number of distinct atoms stored.
    pub fn atom_count(&self) -> usize {
        self.atoms.len()
    }

    /// Terms stored over all expressions.
    pub fn stored_terms(&self) -> usize {
        self.stored_terms
    }

    /// The expression whose normal form is `p`, if one is stored (nothing is interned).
    pub(crate) fn find_poly(&self, p: &Poly) -> Option<ExprId> {
        self.poly_ids.get(p).copied()
    }

    /// Atom `a`'s number, if it is stored (nothing is interned).
    pub(crate) fn find_atom(&self, a: &Atom) -> Option<AtomId> {
        self.atom_ids.get(a).copied()
    }

    /// Number of expressions whose class (finite, non-negative, positive) is known.
    pub(crate) fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// The product expansion layer's memo for this arena ([`crate::expand`]).
    pub(crate) fn rewrite_memo(&self) -> MutexGuard<'_, crate::expand::RewriteMemo> {
        // A panic while the memo was held leaves it possibly half-written: start afresh.
        self.rewrite_memo.lock().unwrap_or_else(|poisoned| {
            let mut memo = poisoned.into_inner();
            *memo = Default::default();
            memo
        })
    }

    /// The random witness layer's modular points for this arena ([`crate::decide`]).
    pub(crate) fn modular_points(&self) -> MutexGuard<'_, crate::decide::ModularPoints> {
        self.modular_points.lock().unwrap_or_else(|poisoned| {
            let mut points = poisoned.into_inner();
            *points = Default::default();
            points
        })
    }

    /// The limits this arena normalizes under.
    pub(crate) fn budget(&self) -> Budget {
        self.budget
    }

    /// The normal form of `e`.
    pub fn poly(&self, e: ExprId) -> &Poly {
        &self.polys[e.0 as usize]
    }

    /// Atom `a`.
    pub fn atom(&self, a: AtomId) -> &Atom {
        &self.atoms[a.0 as usize]
    }

    /// The symbols, by number: name and kind.
    pub fn symbols(&self) -> &[(String, SymbolKind)] {
        &self.symbols
    }

    /// The name of symbol number `s`.
    pub fn symbol_name(&self, s: u32) -> &str {
        &self.symbols[s as usize].0
    }

    /// The number of the symbol named `name`, if one is.
    pub fn symbol_number(&self, name: &str) -> Option<u32> {
        self.symbol_ids.get(name).copied()
    }

    fn intern(&mut self, mut p: Poly) -> Built {
        if self.any_zero_times {
            // A monomial with a `zero_times` factor is 0 or NaN at every point (0·x times
            // anything finite is 0; with x or another factor non-finite it is NaN), and so is
            // any non-zero multiple of it: its coefficient is canonically 1. This also keeps
            // such terms from cancelling (NaN - NaN is NaN, not 0).
            for (m, c) in &mut p.terms {
                if !c.is_one() && m.iter().any(|&(a, _)| self.zero_times[a.0 as usize]) {
                    *c = Coeff::one();
                }
            }
        }
        if let Some(d) = &mut self.deadline {
            d.countdown -= 1;
            if d.countdown == 0 {
                d.countdown = CLOCK_EVERY;
                let now = Instant::now();
                if now > d.at {
                    let limit = d.limit.as_millis() as usize;
                    return Err(BudgetError {
                        what: TIME_LIMIT,
                        limit,
                        reached: limit + now.duration_since(d.at).as_millis() as usize,
                    });
                }
            }
        }
        if p.terms.len() > self.budget.terms_per_expr {
            return Err(BudgetError {
                what: "terms of one expression",
                limit: self.budget.terms_per_expr,
                reached: p.terms.len(),
            });
        }
        if let Some(&id) = self.poly_ids.get(&p) {
            return Ok(id);
        }
        self.stored_terms += p.terms.len();
        if self.stored_terms > self.budget.total_terms {
            return Err(BudgetError {
                what: "terms stored in all expressions",
                limit: self.budget.total_terms,
                reached: self.stored_terms,
            });
        }
        let id = ExprId(u32::try_from(self.polys.len()).map_err(|_| BudgetError {
            what: "expressions",
            limit: u32::MAX as usize,
            reached: self.polys.len(),
        })?);
        let p = Arc::new(p);
        self.polys.push(p.clone());
        self.poly_ids.insert(p, id);
        Ok(id)
    }

    fn intern_atom(&mut self, a: Atom) -> AtomId {
        if let Some(&id) = self.atom_ids.get(&a) {
            return id;
        }
        let id = AtomId(self.atoms.len() as u32);
        // An atom whose value is 0 or NaN at every point: `0·x`, or a product with such a
        // factor (every term of the factor holding such an atom).
        let zero_times = match &a {
            Atom::App(Func::Named(n), _) => n == ZERO_TIMES,
            Atom::App(Func::Product, args) => {
                self.any_zero_times
                    && args.iter().any(|&f| {
                        let p = &self.polys[f.0 as usize];
                        !p.terms.is_empty()
                            && p.terms
                                .iter()
                                .all(|(m, _)| m.iter().any(|&(x, _)| self.zero_times[x.0 as usize]))
                    })
            }
            _ => false,
        };
        self.zero_times.push(zero_times);
        self.any_zero_times |= zero_times;
        self.atoms.push(a.clone());
        self.atom_ids.insert(a, id);
        id
    }

    /// Whether atom `a` is 0 or NaN at every point (`zero_times`, or a product with such a factor).
    pub fn is_zero_times(&self, a: AtomId) -> bool {
        self.zero_times[a.0 as usize]
    }

    /// The expression that is just atom `a`.
    fn atom_expr(&mut self, a: Atom) -> Built {
        let id = self.intern_atom(a);
        self.intern(Poly {
            terms: vec![(vec![(id, 1)], Coeff::one())],
        })
    }

    /// The constant `r`.
    pub fn constant(&mut self, r: Coeff) -> Built {
        if r.is_zero() {
            self.intern(Poly::default())
        } else {
            self.intern(Poly {
                terms: vec![(Vec::new(), r)],
            })
        }
    }

    /// The integer constant `n`.
    pub fn int(&mut self, n: i64) -> Built {
        self.constant(Coeff::from_integer(n))
    }

    /// The f64 constant `x`: its exact rational value, or a non-finite atom.
    pub fn float(&mut self, x: f64) -> Built {
        match Coeff::from_float(x) {
            Some(r) if x.is_finite() => self.constant(r),
            _ => {
                let code = if x.is_nan() {
                    0
                } else if x > 0.0 {
                    1
                } else {
                    -1
                };
                self.atom_expr(Atom::NonFinite(code))
            }
        }
    }

    /// The input symbol `name` of kind `kind` (the same name always gives the same symbol).
    pub fn symbol(&mut self, name: &str, kind: SymbolKind) -> Built {
        let n = match self.symbol_ids.get(name) {
            Some(&n) => n,
            None => {
                let n = self.symbols.len() as u32;
                self.symbols.push((name.to_string(), kind));
                self.symbol_ids.insert(name.to_string(), n);
                n
            }
        };
        self.atom_expr(Atom::Symbol(n))
    }

    /// When `e` is exactly an index symbol (an integer in [0, bound)): its bound.
    pub fn index_bound(&self, e: ExprId) -> Option<u32> {
        match self.poly(e).terms.as_slice() {
            [(m, c)] if m.len() == 1 && m[0].1 == 1 && c.is_one() => match self.atom(m[0].0) {
                Atom::Symbol(s) => match self.symbols[*s as usize].1 {
                    SymbolKind::Index(b) => Some(b),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        }
    }

    /// When `e` is exactly a position among k arguments (`argmax`, `argmin`, or the index of
    /// a sorted position `rank < k`: an integer in [0, k), whatever the arguments' values,
    /// NaN included, since the order is a permutation of them): k. A top-k router's
    /// gathered weights look their experts up so: without the bound such a lookup is not
    /// provably in range, so not finite, and every `0·x` downstream (a causal mask's zero
    /// gradients) stays a `zero_times` atom that the product expansion leaves alone.
    pub(crate) fn position_bound(&self, e: ExprId) -> Option<u32> {
        let (f, args) = self.single_app(e)?;
        let k = u32::try_from(args.len()).ok()?;
        match f {
            Func::ArgMax | Func::ArgMin if k > 0 => Some(k),
            Func::SortedIndex { rank, .. } if *rank < k => Some(k),
            _ => None,
        }
    }

    /// Whether `d == 0` is impossible by the range of the one index symbol it holds: `d` is
    /// `c (t - k)` for an index symbol t in [0, bound) and k outside it (or not an integer).
    fn zero_out_of_range(&self, d: ExprId) -> bool {
        let p = self.poly(d);
        let [(m0, k), (m1, c)] = p.terms.as_slice() else {
            return false;
        };
        if !m0.is_empty() || m1.len() != 1 || m1[0].1 != 1 {
            return false;
        }
        let Atom::Symbol(s) = self.atom(m1[0].0) else {
            return false;
        };
        let SymbolKind::Index(bound) = self.symbols[*s as usize].1 else {
            return false;
        };
        // c t + k == 0 iff t == -k / c.
        let root = -(k / c);
        !root.is_integer() || root.is_negative() || root >= Coeff::from_integer(i64::from(bound))
    }

    /// The constant value of `e`, if it is constant.
    pub fn as_const(&self, e: ExprId) -> Option<Coeff> {
        let p = self.poly(e);
        match p.terms.as_slice() {
            [] => Some(Coeff::zero()),
            [(m, c)] if m.is_empty() => Some(c.clone()),
            _ => None,
        }
    }

    /// The f64 value of `e` when it is a constant (rational or non-finite).
    pub fn as_f64_const(&self, e: ExprId) -> Option<f64> {
        if let Some(r) = self.as_const(e) {
            return Some(r.to_f64());
        }
        match self.poly(e).terms.as_slice() {
            [(m, c)] if m.len() == 1 && m[0].1 == 1 && c.is_one() => match self.atom(m[0].0) {
                Atom::NonFinite(1) => Some(f64::INFINITY),
                Atom::NonFinite(-1) => Some(f64::NEG_INFINITY),
                Atom::NonFinite(_) => Some(f64::NAN),
                _ => None,
            },
            _ => None,
        }
    }

    /// a + b.
    pub fn add(&mut self, a: ExprId, b: ExprId) -> Built {
        self.sum(&[a, b])
    }

    /// The sum of `items`.
    pub fn sum(&mut self, items: &[ExprId]) -> Built {
        match items {
            [] => return self.int(0),
            [a] => return Ok(*a),
            _ => {}
        }
        if let Some(r) = self.absorb_sum(items) {
            return r;
        }
        let r = self.sum_expanded(items)?;
        self.hint_sum(items, r);
        Ok(r)
    }

    fn sum_expanded(&mut self, items: &[ExprId]) -> Built {
        let mut acc: BTreeMap<Mono, Coeff> = BTreeMap::new();
        for &e in items {
            for (m, c) in &self.polys[e.0 as usize].terms {
                add_term(&mut acc, m.clone(), c.clone());
            }
            if acc.len() > self.budget.terms_per_expr {
                return Err(BudgetError {
                    what: "terms of one expression",
                    limit: self.budget.terms_per_expr,
                    reached: acc.len(),
                });
            }
        }
        self.intern(from_map(acc))
    }

    /// -a.
    pub fn neg(&mut self, a: ExprId) -> Built {
        self.scale(a, &-Coeff::one())
    }

    /// a - b.
    pub fn sub(&mut self, a: ExprId, b: ExprId) -> Built {
        let nb = self.neg(b)?;
        self.add(a, nb)
    }

    /// r * a.
    pub fn scale(&mut self, a: ExprId, r: &Coeff) -> Built {
        if let Some(k) = self.pure_nonfinite(a) {
            // 0·inf is NaN; a non-zero scale keeps an infinity, flipped when negative.
            let k = if r.is_zero() {
                0
            } else if r.is_negative() {
                -k
            } else {
                k
            };
            return self.nonfinite(k);
        }
        if r.is_zero() && !self.poly(a).terms.is_empty() && !self.class(a).finite {
            // 0·x is NaN where x is infinite or NaN: kept as an atom unless x is provably
            // finite (IEEE, as the interpreter computes it).
            // Whether x is finite is whether every atom in it is (a non-zero multiple of a
            // monomial of finite atoms is finite, and one with an infinite or NaN atom is
            // not; a sum is finite iff every term is): the argument is canonically the sum
            // of x's distinct atoms, so `0·x` of differently scaled or grouped x agree.
            let mut atoms: Vec<AtomId> = self
                .poly(a)
                .terms
                .iter()
                .flat_map(|(m, _)| m.iter().map(|&(at, _)| at))
                .collect();
            atoms.sort_unstable();
            atoms.dedup();
            let terms = atoms
                .into_iter()
                .map(|at| (vec![(at, 1)], Coeff::one()))
                .collect();
            let p = self.intern(Poly { terms })?;
            return self.app(Func::Named(ZERO_TIMES.into()), vec![p]);
        }
        if r.is_zero() {
            return self.int(0);
        }
        if r.is_one() {
            return Ok(a);
        }
        let terms = self
            .poly(a)
            .terms
            .iter()
            .map(|(m, c)| (m.clone(), c * r))
            .collect();
        let e = self.intern(Poly { terms })?;
        if r.is_positive() {
            if let Some(c) = self.known_class(a) {
                self.hint(e, c);
            }
        }
        Ok(e)
    }

    /// a * b, expanded.
    pub fn mul(&mut self, a: ExprId, b: ExprId) -> Built {
        let r = self.mul_expanded(a, b)?;
        if a == b && self.class(a).finite {
            // A square of a real number is non-negative, which its expansion may not show.
            self.hint(r, transcend::NONNEG);
        }
        Ok(r)
    }

    fn mul_expanded(&mut self, a: ExprId, b: ExprId) -> Built {
        if let Some(c) = self.as_const(a) {
            return self.scale(b, &c);
        }
        if let Some(c) = self.as_const(b) {
            return self.scale(a, &c);
        }
        if let Some(r) = self.cancel_recip(a, b) {
            return r;
        }
        let (pa, pb) = (
            self.polys[a.0 as usize].clone(),
            self.polys[b.0 as usize].clone(),
        );
        let product = pa.terms.len().saturating_mul(pb.terms.len());
        // A softmax weight (a single term over exponentials) times a sum is always
        // expanded: the log-sum-exp rules cancel its reciprocal only in expanded form.
        let weight = (pa.terms.len() == 1 && self.softmax_weight(&pa.terms[0].0))
            || (pb.terms.len() == 1 && self.softmax_weight(&pb.terms[0].0));
        if (pa.terms.len() > 1 || pb.terms.len() > 1)
            && product > self.budget.expand_limit
            && !weight
        {
            // (c p)(d q) = c d product(p, q) with p, q primitive: canonical, and no blowup.
            let (ca, cb) = (primitive_scale(&pa), primitive_scale(&pb));
            let pa1 = self.scale(a, &ca.recip())?;
            let pb1 = self.scale(b, &cb.recip())?;
            let mut args = vec![pa1, pb1];
            args.sort();
            let atom = self.atom_expr(Atom::App(Func::Product, args))?;
            return self.scale(atom, &(ca * cb));
        }
        if product > self.budget.terms_per_expr.saturating_mul(4) {
            return Err(BudgetError {
                what: "terms of one product before collection",
                limit: self.budget.terms_per_expr * 4,
                reached: product,
            });
        }
        let mut acc: BTreeMap<Mono, Coeff> = BTreeMap::new();
        for (ma, ca) in &pa.terms {
            for (mb, cb) in &pb.terms {
                add_term(&mut acc, mul_mono(ma, mb), ca * cb);
            }
        }
        let acc = self.boolean_monomials(acc);
        self.merge_exps(acc)
    }

    /// The product of `items`.
    pub fn product(&mut self, items: &[ExprId]) -> Built {
        let mut acc = self.int(1)?;
        for &e in items {
            acc = self.mul(acc, e)?;
        }
        Ok(acc)
    }

    /// a^n for an integer n (negative: the reciprocal of a^-n).
    pub fn pow_int(&mut self, a: ExprId, n: i64) -> Built {
        let mut acc = self.int(1)?;
        for _ in 0..n.unsigned_abs() {
            acc = self.mul(acc, a)?;
        }
        if n < 0 {
            self.recip(acc)
        } else {
            Ok(acc)
        }
    }

    /// a^e for a constant exponent.
    pub fn pow_const(&mut self, a: ExprId, e: f64) -> Built {
        if e.fract() == 0.0 && e.abs() <= 64.0 {
            return self.pow_int(a, e as i64);
        }
        if e == 0.5 {
            return self.app(Func::Sqrt, vec![a]);
        }
        if e == -0.5 {
            let s = self.app(Func::Sqrt, vec![a])?;
            return self.recip(s);
        }
        self.app(Func::PowConst(e.to_bits()), vec![a])
    }

    /// 1 / a: exact for a non-zero constant; otherwise the constant content is pulled out and
    /// the rest becomes a `recip` atom (1/(c*p) = (1/c) * recip(p)).
    pub fn recip(&mut self, a: ExprId) -> Built {
        if let Some(c) = self.as_const(a) {
            if !c.is_zero() {
                return self.constant(c.recip());
            }
            return self.float(f64::INFINITY);
        }
        if let Some(r) = self.recip_rule(a) {
            return r;
        }
        let lead = self.poly(a).terms[0].1.clone();
        let monic = self.scale(a, &lead.recip())?;
        let r = self.app(Func::Recip, vec![monic])?;
        self.scale(r, &lead.recip())
    }

    /// a / b.
    pub fn div(&mut self, a: ExprId, b: ExprId) -> Built {
        let r = self.recip(b)?;
        self.mul(a, r)
    }

    /// max(a, b).
    pub fn max(&mut self, a: ExprId, b: ExprId) -> Built {
        self.app(Func::Max, vec![a, b])
    }

    /// min(a, b).
    pub fn min(&mut self, a: ExprId, b: ExprId) -> Built {
        self.app(Func::Min, vec![a, b])
    }

    /// 1 when a > b, else 0.
    pub fn gt(&mut self, a: ExprId, b: ExprId) -> Built {
        if let Some(r) = self.same_infinities(a, b, 0) {
            return r;
        }
        let d = self.sub(a, b)?;
        self.app(Func::Positive, vec![d])
    }

    /// 1 when a >= b, else 0.
    pub fn ge(&mut self, a: ExprId, b: ExprId) -> Built {
        if let Some(r) = self.same_infinities(a, b, 1) {
            return r;
        }
        let d = self.sub(a, b)?;
        self.app(Func::NonNegative, vec![d])
    }

    /// 1 when a == b, else 0.
    pub fn eq(&mut self, a: ExprId, b: ExprId) -> Built {
        if let Some(r) = self.same_infinities(a, b, 1) {
            return r;
        }
        let d = self.sub(a, b)?;
        self.app(Func::IsZero, vec![d])
    }

    /// A comparison of two equal infinities, which their difference (NaN) cannot decide:
    /// `equal` (1 for >= and ==, 0 for >).
    fn same_infinities(&mut self, a: ExprId, b: ExprId, equal: i64) -> Option<Built> {
        match (self.pure_nonfinite(a), self.pure_nonfinite(b)) {
            (Some(x), Some(y)) if x == y && x != 0 => Some(self.int(equal)),
            _ => None,
        }
    }

    /// 1 - a (logical not of a 0/1 value).
    pub fn not(&mut self, a: ExprId) -> Built {
        let one = self.int(1)?;
        self.sub(one, a)
    }

    /// where(c, a, b).
    pub fn select(&mut self, c: ExprId, a: ExprId, b: ExprId) -> Built {
        self.app(Func::Where, vec![c, a, b])
    }

    /// When `e` is exactly one function application (coefficient 1, exponent 1): it.
    pub fn single_app(&self, e: ExprId) -> Option<(&Func, &[ExprId])> {
        match self.poly(e).terms.as_slice() {
            [(m, c)] if m.len() == 1 && m[0].1 == 1 && c.is_one() => match self.atom(m[0].0) {
                Atom::App(f, args) => Some((f, args.as_slice())),
                _ => None,
            },
            _ => None,
        }
    }

    /// Every atom reachable from `roots` (through function arguments), in increasing order.
    pub fn reachable_atoms(&self, roots: &[ExprId]) -> Vec<AtomId> {
        let mut seen_expr = std::collections::HashSet::new();
        let mut seen_atom = std::collections::BTreeSet::new();
        let mut stack: Vec<ExprId> = roots.to_vec();
        while let Some(e) = stack.pop() {
            if !seen_expr.insert(e) {
                continue;
            }
            for (m, _) in &self.poly(e).terms {
                for &(a, _) in m {
                    if seen_atom.insert(a) {
                        if let Atom::App(_, args) = self.atom(a) {
                            stack.extend(args.iter().copied());
                        }
                    }
                }
            }
        }
        seen_atom.into_iter().collect()
    }

    /// Polynomial terms of `roots` and of every function argument they reach, each distinct
    /// expression counted once.
    pub fn reachable_terms(&self, roots: &[ExprId]) -> usize {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<ExprId> = roots.to_vec();
        let mut total = 0;
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            for (m, _) in &self.poly(e).terms {
                total += 1;
                for &(a, _) in m {
                    if let Atom::App(_, args) = self.atom(a) {
                        stack.extend(args.iter().copied());
                    }
                }
            }
        }
        total
    }
}

/// The nearest f64 of an arbitrary-precision rational (coefficients have [`Coeff::to_f64`]).
pub fn rat_to_f64(r: &BigRational) -> f64 {
    crate::coeff::big_to_f64(r)
}

/// The content of a polynomial with the sign of its leading coefficient: p divided by it is
/// primitive with a positive leading coefficient.
pub(crate) fn primitive_scale(p: &Poly) -> Coeff {
    let c = content(p);
    if p.terms.first().is_some_and(|t| t.1.is_negative()) {
        -c
    } else {
        c
    }
}

/// The positive content of a polynomial: gcd of the numerators over lcm of the
/// denominators, so that p / content has coprime integer coefficients.
fn content(p: &Poly) -> Coeff {
    crate::coeff::content(p.terms.iter().map(|(_, c)| c))
}

fn exact_sqrt(c: &Coeff) -> Option<Coeff> {
    if c.is_negative() {
        return None;
    }
    let small = c
        .as_small()
        .and_then(|(n, d)| Some((u64::try_from(n).ok()?, u64::try_from(d).ok()?)));
    if let Some((n, d)) = small {
        let (rn, rd) = (isqrt(n), isqrt(d));
        return (rn * rn == n && rd * rd == d).then(|| Coeff::new(rn as i64, rd as i64));
    }
    let c = c.to_big();
    let n = c.numer().sqrt();
    let d = c.denom().sqrt();
    (&n * &n == *c.numer() && &d * &d == *c.denom())
        .then(|| Coeff::from_big(BigRational::new(n, d)))
}

/// The integer square root (floor) of `x`.
fn isqrt(x: u64) -> u64 {
    let mut r = (x as f64).sqrt() as u64;
    // The f64 estimate is off by at most a few units near 2^64: correct it exactly.
    while r.checked_mul(r).is_none_or(|sq| sq > x) {
        r -= 1;
    }
    while (r + 1).checked_mul(r + 1).is_some_and(|sq| sq <= x) {
        r += 1;
    }
    r
}

/// Adds `c·m` to a polynomial's terms, dropping a term whose coefficient cancels (any monomial
/// key: atoms here, the case split's keys in `decide/split.rs`).
pub(crate) fn add_term<M: Ord>(acc: &mut BTreeMap<M, Coeff>, m: M, c: Coeff) {
    use std::collections::btree_map::Entry;
    match acc.entry(m) {
        Entry::Vacant(v) => {
            v.insert(c);
        }
        Entry::Occupied(mut o) => {
            *o.get_mut() += c;
            if o.get().is_zero() {
                o.remove();
            }
        }
    }
}

fn from_map(acc: BTreeMap<Mono, Coeff>) -> Poly {
    Poly {
        terms: acc.into_iter().filter(|(_, c)| !c.is_zero()).collect(),
    }
}

/// The product of two monomials sorted by key: exponents of equal keys add (any key: atoms
/// here, the case split's keys in `decide/split.rs`).
pub(crate) fn mul_mono<K: Ord + Clone>(a: &[(K, u32)], b: &[(K, u32)]) -> Vec<(K, u32)> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => {
                out.push(a[i].clone());
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j].clone());
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push((a[i].0.clone(), a[i].1 + b[j].1));
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

#[cfg(test)]
mod tests;
