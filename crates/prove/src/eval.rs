//! Evaluation of expressions at a point: modulo a large prime with random interpretations of
//! the functions (a fast test of difference modulo function identities), exactly over the
//! rationals where every function met is exact, and in f64 with the real functions.

use crate::expr::{Arena, Atom, Coeff, ExprId, Func};
use num_rational::BigRational;
use rustc_hash::FxHashMap;
use std::collections::HashMap;

/// The prime of modular evaluation: 2^61 - 1.
pub const PRIME: u64 = (1 << 61) - 1;

fn mul_mod(a: u64, b: u64) -> u64 {
    // 2^61 ≡ 1 (mod 2^61 - 1): folding the high bits onto the low ones reduces without a
    // 128-bit division (which was a quarter of a zoo cp full iteration's time).
    let p = a as u128 * b as u128;
    let m = PRIME as u128;
    let r = (p & m) + (p >> 61);
    let r = ((r & m) + (r >> 61)) as u64;
    if r >= PRIME {
        r - PRIME
    } else {
        r
    }
}

fn add_mod(a: u64, b: u64) -> u64 {
    (a + b) % PRIME
}

fn pow_mod(mut b: u64, mut e: u64) -> u64 {
    let mut acc = 1;
    while e > 0 {
        if e & 1 == 1 {
            acc = mul_mod(acc, b);
        }
        b = mul_mod(b, b);
        e >>= 1;
    }
    acc
}

/// The inverse of `a` modulo [`PRIME`] (0 for 0).
pub fn inv_mod(a: u64) -> u64 {
    pow_mod(a, PRIME - 2)
}

/// A rational modulo [`PRIME`] (denominators divisible by the prime map to 0; with a 61-bit
/// prime and the dyadic denominators of f64 constants this does not happen in practice).
pub fn rat_mod(r: &Coeff) -> u64 {
    r.residue(PRIME, inv_mod)
}

/// A 64-bit mix (splitmix64's finalizer): the random interpretations of functions.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn func_code(f: &Func) -> u64 {
    let name = f.name();
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Evaluates expressions modulo [`PRIME`] at one point, memoized: symbols take the given
/// residues, `recip` is the modular inverse, every other function is a fixed random function
/// (keyed by `seed`) of its argument values; max and min hash their argument *set*, so they
/// stay commutative and idempotent, and comparisons return random bits.
pub struct ModEval<'a> {
    arena: &'a Arena,
    symbols: Vec<u64>,
    seed: u64,
    memo: FxHashMap<ExprId, u64>,
    atoms: FxHashMap<u32, u64>,
}

/// The residues a [`ModEval`] has computed, kept to resume it later on the same arena, point
/// and seed ([`ModEval::resume`]): an expression's residue never changes, since the arena
/// only grows.
#[derive(Default)]
pub(crate) struct ModMemo {
    memo: FxHashMap<ExprId, u64>,
    atoms: FxHashMap<u32, u64>,
}

impl<'a> ModEval<'a> {
    /// An evaluator with symbol residues `symbols` (by symbol number) and function seed `seed`.
    pub fn new(arena: &'a Arena, symbols: Vec<u64>, seed: u64) -> Self {
        Self::resume(arena, symbols, seed, ModMemo::default())
    }

    /// An evaluator that starts from `memo`, which must come from one over the same arena,
    /// residues and seed ([`ModEval::into_memo`]).
    pub(crate) fn resume(arena: &'a Arena, symbols: Vec<u64>, seed: u64, memo: ModMemo) -> Self {
        ModEval {
            arena,
            symbols,
            seed,
            memo: memo.memo,
            atoms: memo.atoms,
        }
    }

    /// What this evaluator has computed (its residues and seed are the caller's to keep).
    pub(crate) fn into_memo(self) -> ModMemo {
        ModMemo {
            memo: self.memo,
            atoms: self.atoms,
        }
    }

    /// The residue of `e`.
    pub fn eval(&mut self, e: ExprId) -> u64 {
        if let Some(&v) = self.memo.get(&e) {
            return v;
        }
        let mut total = 0;
        for (m, c) in &self.arena.poly(e).terms {
            let mut t = rat_mod(c);
            for &(a, k) in m {
                let v = self.atom(a.0);
                t = mul_mod(t, pow_mod(v, k as u64));
            }
            total = add_mod(total, t);
        }
        self.memo.insert(e, total);
        total
    }

    fn atom(&mut self, a: u32) -> u64 {
        if let Some(&v) = self.atoms.get(&a) {
            return v;
        }
        let v = match self.arena.atom(crate::expr::AtomId(a)).clone() {
            Atom::Symbol(s) => self.symbols[s as usize],
            Atom::NonFinite(k) => mix(self.seed ^ (k as i64 as u64) ^ 0x5eed) % PRIME,
            Atom::App(Func::Recip, args) => inv_mod(self.eval(args[0])),
            Atom::App(Func::Product, args) => {
                args.iter().fold(1, |acc, &x| mul_mod(acc, self.eval(x)))
            }
            Atom::App(Func::Lookup, args) if (self.eval(args[0]) as usize) < args.len() - 1 => {
                // Index symbols take residues within their range: the lookup is exact.
                let i = self.eval(args[0]) as usize;
                self.eval(args[1 + i])
            }
            Atom::App(Func::Where, args) => {
                if self.eval(args[0]) != 0 {
                    self.eval(args[1])
                } else {
                    self.eval(args[2])
                }
            }
            Atom::App(f, args) => {
                let mut vals: Vec<u64> = args.iter().map(|&x| self.eval(x)).collect();
                if matches!(f, Func::Max | Func::Min) {
                    vals.sort_unstable();
                    vals.dedup();
                }
                let h = vals
                    .iter()
                    .fold(mix(self.seed ^ func_code(&f)), |h, &v| mix(h ^ v));
                match f {
                    Func::Positive | Func::NonNegative | Func::IsZero => h & 1,
                    _ => h % PRIME,
                }
            }
        };
        self.atoms.insert(a, v);
        v
    }
}

/// Evaluates expressions exactly over the rationals at one point, memoized; `None` where the
/// value is not a rational the ring and the exact functions reach (exp, log, an irrational
/// square root, division by zero, a non-finite constant).
pub struct ExactEval<'a> {
    arena: &'a Arena,
    symbols: Vec<Coeff>,
    memo: HashMap<ExprId, Option<Coeff>>,
}

impl<'a> ExactEval<'a> {
    /// An evaluator with symbol values `symbols` (by symbol number).
    pub fn new(arena: &'a Arena, symbols: Vec<impl Into<Coeff>>) -> Self {
        ExactEval {
            arena,
            symbols: symbols.into_iter().map(Into::into).collect(),
            memo: HashMap::new(),
        }
    }

    /// The exact value of `e`, if it is rational.
    pub fn eval(&mut self, e: ExprId) -> Option<BigRational> {
        self.value(e).map(|v| v.to_big())
    }

    /// The exact value of `e` as a coefficient, if it is rational.
    pub fn value(&mut self, e: ExprId) -> Option<Coeff> {
        if let Some(v) = self.memo.get(&e) {
            return v.clone();
        }
        let v = self.value_uncached(e);
        self.memo.insert(e, v.clone());
        v
    }

    /// [`Self::value`] without its memo. One atom without a rational value (an exponential)
    /// leaves the whole sum without one: the rest is not evaluated (in a goal of millions of
    /// terms reached through such atoms, that was most of the exact points' time).
    fn value_uncached(&mut self, e: ExprId) -> Option<Coeff> {
        let mut total = Coeff::zero();
        for (m, c) in &self.arena.poly(e).terms {
            let mut t = c.clone();
            for &(a, k) in m {
                let v = self.atom(a.0)?;
                for _ in 0..k {
                    t *= &v;
                }
            }
            total += t;
        }
        Some(total)
    }

    fn atom(&mut self, a: u32) -> Option<Coeff> {
        match self.arena.atom(crate::expr::AtomId(a)).clone() {
            Atom::Symbol(s) => Some(self.symbols[s as usize].clone()),
            Atom::NonFinite(_) => None,
            Atom::App(f, args) => {
                let vals: Option<Vec<Coeff>> = match f {
                    // Only the chosen branch needs a value.
                    Func::Where => {
                        let c = self.value(args[0])?;
                        return self.value(if c.is_zero() { args[2] } else { args[1] });
                    }
                    Func::Lookup => {
                        let i = self.value(args[0])?;
                        let i = i.to_usize()?;
                        return self.value(*args.get(1 + i)?);
                    }
                    // The functions with a rational value at rational arguments.
                    Func::Recip
                    | Func::Product
                    | Func::Max
                    | Func::Min
                    | Func::ArgMax
                    | Func::ArgMin
                    | Func::SortedValue { .. }
                    | Func::SortedIndex { .. }
                    | Func::Positive
                    | Func::NonNegative
                    | Func::IsZero => args.iter().map(|&x| self.value(x)).collect(),
                    // No rational value whatever the arguments: they are not evaluated.
                    _ => return None,
                };
                let vals = vals?;
                match f {
                    Func::Recip => (!vals[0].is_zero()).then(|| vals[0].recip()),
                    Func::Product => Some(vals.iter().product()),
                    Func::Max => vals.into_iter().max(),
                    Func::Min => vals.into_iter().min(),
                    Func::ArgMax | Func::ArgMin => {
                        let mut best = 0;
                        for i in 1..vals.len() {
                            let better = if f == Func::ArgMax {
                                vals[i] > vals[best]
                            } else {
                                vals[i] < vals[best]
                            };
                            if better {
                                best = i;
                            }
                        }
                        Some(Coeff::from_integer(best as i64))
                    }
                    Func::SortedValue { rank, largest } => {
                        let order = crate::expr::stable_order(&vals, largest);
                        order.get(rank as usize).map(|&i| vals[i].clone())
                    }
                    Func::SortedIndex { rank, largest } => {
                        let order = crate::expr::stable_order(&vals, largest);
                        order
                            .get(rank as usize)
                            .map(|&i| Coeff::from_integer(i as i64))
                    }
                    Func::Positive => Some(Coeff::from_integer(i64::from(vals[0].is_positive()))),
                    Func::NonNegative => {
                        Some(Coeff::from_integer(i64::from(!vals[0].is_negative())))
                    }
                    Func::IsZero => Some(Coeff::from_integer(i64::from(vals[0].is_zero()))),
                    _ => None,
                }
            }
        }
    }
}

/// Evaluates expressions in f64 with the real functions at one point, memoized.
pub struct FloatEval<'a> {
    arena: &'a Arena,
    symbols: Vec<f64>,
    memo: HashMap<ExprId, f64>,
    /// The same point exactly, where known: a function's arguments are taken from it when
    /// they have a rational value, so a comparison or a `where` whose argument is exactly 0
    /// is not decided by f64 rounding (`x - 3·(x/3)` is not 0 in f64).
    exact: Option<ExactEval<'a>>,
}

impl<'a> FloatEval<'a> {
    /// An evaluator with symbol values `symbols` (by symbol number).
    pub fn new(arena: &'a Arena, symbols: Vec<f64>) -> Self {
        FloatEval {
            arena,
            symbols,
            memo: HashMap::new(),
            exact: None,
        }
    }

    /// An evaluator at the rational point `values`: f64 where a value is irrational (a
    /// transcendental function's), exact for every function argument with a rational value.
    pub fn at_exact_point(arena: &'a Arena, values: &[Coeff]) -> Self {
        FloatEval {
            arena,
            symbols: values.iter().map(Coeff::to_f64).collect(),
            memo: HashMap::new(),
            exact: Some(ExactEval::new(arena, values.to_vec())),
        }
    }

    /// The f64 value of `e`.
    pub fn eval(&mut self, e: ExprId) -> f64 {
        if let Some(&v) = self.memo.get(&e) {
            return v;
        }
        let mut total = 0.0;
        for (m, c) in &self.arena.poly(e).terms {
            let mut t = c.to_f64();
            for &(a, k) in m {
                t *= self.atom(a.0).powi(k as i32);
            }
            total += t;
        }
        self.memo.insert(e, total);
        total
    }

    fn atom(&mut self, a: u32) -> f64 {
        match self.arena.atom(crate::expr::AtomId(a)).clone() {
            Atom::Symbol(s) => self.symbols[s as usize],
            Atom::NonFinite(1) => f64::INFINITY,
            Atom::NonFinite(-1) => f64::NEG_INFINITY,
            Atom::NonFinite(_) => f64::NAN,
            Atom::App(f, args) => {
                let vals: Vec<f64> = args
                    .iter()
                    .map(|&x| {
                        let exact = self.exact.as_mut().and_then(|ex| ex.value(x));
                        exact.map_or_else(|| self.eval(x), |v| v.to_f64())
                    })
                    .collect();
                f.eval_f64(&vals)
            }
        }
    }
}

/// True when two f64 values differ beyond rounding noise: a real difference, not a rounding
/// artifact of evaluating two different but equal expressions.
pub fn clearly_differ(a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return false;
    }
    if a.is_infinite() || b.is_infinite() {
        return a != b && (a.is_finite() || b.is_finite());
    }
    (a - b).abs() > 1e-6 * (1.0 + a.abs().max(b.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::SymbolKind;

    #[test]
    fn modular_arithmetic_inverts() {
        for a in [1u64, 2, 12345, PRIME - 1] {
            assert_eq!(mul_mod(a, inv_mod(a)), 1);
        }
        let r = Coeff::new(3, 4);
        assert_eq!(mul_mod(rat_mod(&r), 4), 3);
        let neg = Coeff::from_integer(-5);
        assert_eq!(add_mod(rat_mod(&neg), 5), 0);
    }

    #[test]
    fn folded_products_are_the_remainders_of_a_division() {
        let edges = [
            0u64,
            1,
            2,
            PRIME - 2,
            PRIME - 1,
            PRIME,
            PRIME + 1,
            1 << 62,
            u64::MAX,
        ];
        let mut z = 0x1234_5678u64;
        let mut values: Vec<u64> = edges.to_vec();
        for _ in 0..2000 {
            z = mix(z.wrapping_add(0x9e37_79b9_7f4a_7c15));
            values.push(z);
            values.push(z % PRIME);
        }
        for (i, &a) in values.iter().enumerate() {
            for &b in values.iter().skip(i % 7).step_by(97).chain(edges.iter()) {
                let reference = ((a as u128 * b as u128) % PRIME as u128) as u64;
                assert_eq!(mul_mod(a, b), reference, "{a} * {b}");
            }
        }
    }

    #[test]
    fn the_three_evaluations_agree_on_ring_expressions() {
        let mut a = Arena::default();
        let x = a.symbol("x", SymbolKind::Real).unwrap();
        let y = a.symbol("y", SymbolKind::Real).unwrap();
        let xy = a.mul(x, y).unwrap();
        let three = a.int(3).unwrap();
        let e = a.div(xy, three).unwrap();
        let e = a.sub(e, y).unwrap();
        let exact = ExactEval::new(&a, vec![Coeff::from_integer(2), Coeff::from_integer(6)])
            .value(e)
            .unwrap();
        assert_eq!(exact, Coeff::from_integer(-2));
        assert_eq!(FloatEval::new(&a, vec![2.0, 6.0]).eval(e), -2.0);
        assert_eq!(ModEval::new(&a, vec![2, 6], 7).eval(e), rat_mod(&exact));
    }

    #[test]
    fn float_differences_ignore_rounding() {
        assert!(!clearly_differ(0.1 + 0.2, 0.3));
        assert!(clearly_differ(1.0, 1.001));
        assert!(clearly_differ(f64::INFINITY, 1.0));
        assert!(!clearly_differ(f64::NAN, 1.0));
    }
}
