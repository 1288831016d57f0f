//! Exact rational coefficients with a machine-integer fast path.
//!
//! Almost every coefficient the prover meets is a small integer or a small dyadic fraction, yet
//! arbitrary-precision rationals allocate on every operation. [`Coeff`] keeps a value as a
//! reduced `i64 / i64` while it fits, does each operation in `i128` (where the products of two
//! `i64`s cannot overflow) and falls back to [`BigRational`] only when a result does not fit.
//!
//! The representation is canonical: a value is small exactly when its reduced numerator and
//! denominator both fit in `i64`. Equal values therefore have equal representations, so the
//! derived `Eq` and `Hash` agree with equality of the rationals, which hash-consing relies on.

use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::{BigRational, Ratio};
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::cmp::Ordering;
use std::fmt;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

/// An exact rational number: a reduced `i64` fraction when it fits, else a [`BigRational`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Coeff(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// Numerator and positive denominator, coprime.
    Small(i64, i64),
    /// A value whose reduced numerator or denominator does not fit in `i64`.
    Big(Box<BigRational>),
}

impl Coeff {
    /// Zero.
    pub const ZERO: Coeff = Coeff(Repr::Small(0, 1));
    /// One.
    pub const ONE: Coeff = Coeff(Repr::Small(1, 1));

    /// n / d, reduced. Panics when `d` is zero, like [`BigRational::new`].
    pub fn new(n: i64, d: i64) -> Coeff {
        assert!(d != 0, "denominator == 0");
        Coeff::from_i128(i128::from(n), i128::from(d))
    }

    /// The integer `n`.
    pub fn from_integer(n: i64) -> Coeff {
        Coeff(Repr::Small(n, 1))
    }

    /// Zero.
    pub fn zero() -> Coeff {
        Coeff::ZERO
    }

    /// One.
    pub fn one() -> Coeff {
        Coeff::ONE
    }

    /// The exact value of a finite f64 (None for NaN and infinities).
    pub fn from_float(x: f64) -> Option<Coeff> {
        BigRational::from_float(x).map(Coeff::from_big)
    }

    /// The canonical form of an arbitrary-precision rational.
    pub fn from_big(r: BigRational) -> Coeff {
        match (r.numer().to_i64(), r.denom().to_i64()) {
            (Some(n), Some(d)) => Coeff(Repr::Small(n, d)),
            _ => Coeff(Repr::Big(Box::new(r))),
        }
    }

    /// The value as an arbitrary-precision rational.
    pub fn to_big(&self) -> BigRational {
        match &self.0 {
            Repr::Small(n, d) => BigRational::new_raw(BigInt::from(*n), BigInt::from(*d)),
            Repr::Big(r) => (**r).clone(),
        }
    }

    /// The reduced numerator and denominator when both fit in `i64` (the denominator positive).
    pub fn as_small(&self) -> Option<(i64, i64)> {
        match self.0 {
            Repr::Small(n, d) => Some((n, d)),
            Repr::Big(_) => None,
        }
    }

    /// n / d for d != 0 (at most 127 bits each in magnitude), reduced and made canonical.
    fn from_i128(n: i128, d: i128) -> Coeff {
        debug_assert!(d != 0);
        let g = n.gcd(&d);
        let (mut n, mut d) = (n / g, d / g);
        if d < 0 {
            match (n.checked_neg(), d.checked_neg()) {
                (Some(nn), Some(dd)) => (n, d) = (nn, dd),
                _ => return Coeff::from_big(BigRational::new(n.into(), d.into())),
            }
        }
        match (i64::try_from(n), i64::try_from(d)) {
            (Ok(n), Ok(d)) => Coeff(Repr::Small(n, d)),
            _ => Coeff(Repr::Big(Box::new(BigRational::new_raw(
                n.into(),
                d.into(),
            )))),
        }
    }

    /// Whether the value is 0.
    pub fn is_zero(&self) -> bool {
        matches!(self.0, Repr::Small(0, _))
    }

    /// Whether the value is 1.
    pub fn is_one(&self) -> bool {
        matches!(self.0, Repr::Small(1, 1))
    }

    /// Whether the value is an integer.
    pub fn is_integer(&self) -> bool {
        match &self.0 {
            Repr::Small(_, d) => *d == 1,
            Repr::Big(r) => r.is_integer(),
        }
    }

    /// Whether the value is below 0.
    pub fn is_negative(&self) -> bool {
        match &self.0 {
            Repr::Small(n, _) => *n < 0,
            Repr::Big(r) => r.is_negative(),
        }
    }

    /// Whether the value is above 0.
    pub fn is_positive(&self) -> bool {
        match &self.0 {
            Repr::Small(n, _) => *n > 0,
            Repr::Big(r) => r.is_positive(),
        }
    }

    /// |self|.
    pub fn abs(&self) -> Coeff {
        if self.is_negative() {
            -self
        } else {
            self.clone()
        }
    }

    /// 1 / self. Panics on zero, like [`BigRational::recip`].
    pub fn recip(&self) -> Coeff {
        match &self.0 {
            Repr::Small(n, d) => {
                assert!(*n != 0, "denominator == 0");
                Coeff::from_i128(i128::from(*d), i128::from(*n))
            }
            Repr::Big(r) => Coeff::from_big(r.recip()),
        }
    }

    /// The value as a `usize` when it is a non-negative integer that fits.
    pub fn to_usize(&self) -> Option<usize> {
        match &self.0 {
            Repr::Small(n, 1) => usize::try_from(*n).ok(),
            Repr::Small(..) => None,
            Repr::Big(r) => r.is_integer().then(|| r.to_integer().to_usize()).flatten(),
        }
    }

    /// The nearest f64, rounded exactly as [`BigRational`]'s conversion rounds.
    pub fn to_f64(&self) -> f64 {
        match &self.0 {
            Repr::Small(n, d) => Ratio::new_raw(*n, *d).to_f64().unwrap_or(f64::NAN),
            Repr::Big(r) => big_to_f64(r),
        }
    }

    /// The value modulo `p` (a prime below 2^63): numerator times the inverse of the
    /// denominator, with `inv` computing modular inverses.
    pub fn residue(&self, p: u64, inv: impl Fn(u64) -> u64) -> u64 {
        let (n, d) = match &self.0 {
            Repr::Small(n, d) => (
                i128::from(*n).rem_euclid(i128::from(p)) as u64,
                i128::from(*d).rem_euclid(i128::from(p)) as u64,
            ),
            Repr::Big(r) => (big_residue(r.numer(), p), big_residue(r.denom(), p)),
        };
        ((u128::from(n) * u128::from(inv(d))) % u128::from(p)) as u64
    }

    fn add_ref(&self, o: &Coeff) -> Coeff {
        if let (Repr::Small(a, b), Repr::Small(c, d)) = (&self.0, &o.0) {
            if *b == 1 && *d == 1 {
                if let Some(s) = a.checked_add(*c) {
                    return Coeff(Repr::Small(s, 1));
                }
            }
            if b == d {
                return Coeff::from_i128(i128::from(*a) + i128::from(*c), i128::from(*b));
            }
            let (a, b, c, d) = (
                i128::from(*a),
                i128::from(*b),
                i128::from(*c),
                i128::from(*d),
            );
            if let Some(n) = (a * d).checked_add(c * b) {
                return Coeff::from_i128(n, b * d);
            }
        }
        Coeff::from_big(self.to_big() + o.to_big())
    }

    fn mul_ref(&self, o: &Coeff) -> Coeff {
        if let (Repr::Small(a, b), Repr::Small(c, d)) = (&self.0, &o.0) {
            if *b == 1 && *d == 1 {
                if let Some(p) = a.checked_mul(*c) {
                    return Coeff(Repr::Small(p, 1));
                }
            }
            return Coeff::from_i128(
                i128::from(*a) * i128::from(*c),
                i128::from(*b) * i128::from(*d),
            );
        }
        Coeff::from_big(self.to_big() * o.to_big())
    }

    fn div_ref(&self, o: &Coeff) -> Coeff {
        if let (Repr::Small(a, b), Repr::Small(c, d)) = (&self.0, &o.0) {
            assert!(*c != 0, "denominator == 0");
            return Coeff::from_i128(
                i128::from(*a) * i128::from(*d),
                i128::from(*b) * i128::from(*c),
            );
        }
        Coeff::from_big(self.to_big() / o.to_big())
    }

    fn neg_ref(&self) -> Coeff {
        match &self.0 {
            Repr::Small(n, d) => match n.checked_neg() {
                Some(m) => Coeff(Repr::Small(m, *d)),
                None => Coeff::from_big(-self.to_big()),
            },
            Repr::Big(r) => Coeff::from_big(-(**r).clone()),
        }
    }
}

/// The nearest f64 of an arbitrary-precision rational, also when numerator or denominator
/// alone exceed the f64 range.
pub(crate) fn big_to_f64(r: &BigRational) -> f64 {
    r.to_f64().unwrap_or_else(|| {
        // Very large numerators and denominators: scale both down together.
        let n = r.numer().to_f64().unwrap_or(f64::INFINITY);
        let d = r.denom().to_f64().unwrap_or(f64::INFINITY);
        n / d
    })
}

fn big_residue(n: &BigInt, p: u64) -> u64 {
    let p = BigInt::from(p);
    let r = ((n % &p) + &p) % &p;
    r.to_u64().unwrap_or(0)
}

impl Default for Coeff {
    fn default() -> Coeff {
        Coeff::ZERO
    }
}

impl From<i64> for Coeff {
    fn from(n: i64) -> Coeff {
        Coeff::from_integer(n)
    }
}

impl From<BigRational> for Coeff {
    fn from(r: BigRational) -> Coeff {
        Coeff::from_big(r)
    }
}

impl From<&Coeff> for BigRational {
    fn from(c: &Coeff) -> BigRational {
        c.to_big()
    }
}

impl Ord for Coeff {
    fn cmp(&self, o: &Coeff) -> Ordering {
        match (&self.0, &o.0) {
            // Cross-multiplied in i128: each product is below 2^126 in magnitude.
            (Repr::Small(a, b), Repr::Small(c, d)) => {
                (i128::from(*a) * i128::from(*d)).cmp(&(i128::from(*c) * i128::from(*b)))
            }
            _ => self.to_big().cmp(&o.to_big()),
        }
    }
}

impl PartialOrd for Coeff {
    fn partial_cmp(&self, o: &Coeff) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Written as [`BigRational`] writes itself: `n` for integers, else `n/d`.
impl fmt::Display for Coeff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Small(n, 1) => write!(f, "{n}"),
            Repr::Small(n, d) => write!(f, "{n}/{d}"),
            Repr::Big(r) => write!(f, "{r}"),
        }
    }
}

impl fmt::Debug for Coeff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

macro_rules! binop {
    ($trait:ident, $method:ident, $imp:ident) => {
        impl $trait<&Coeff> for &Coeff {
            type Output = Coeff;
            fn $method(self, o: &Coeff) -> Coeff {
                self.$imp(o)
            }
        }
        impl $trait<Coeff> for &Coeff {
            type Output = Coeff;
            fn $method(self, o: Coeff) -> Coeff {
                self.$imp(&o)
            }
        }
        impl $trait<&Coeff> for Coeff {
            type Output = Coeff;
            fn $method(self, o: &Coeff) -> Coeff {
                self.$imp(o)
            }
        }
        impl $trait<Coeff> for Coeff {
            type Output = Coeff;
            fn $method(self, o: Coeff) -> Coeff {
                self.$imp(&o)
            }
        }
    };
}

binop!(Add, add, add_ref);
binop!(Mul, mul, mul_ref);
binop!(Div, div, div_ref);

impl Sub<&Coeff> for &Coeff {
    type Output = Coeff;
    fn sub(self, o: &Coeff) -> Coeff {
        self.add_ref(&o.neg_ref())
    }
}

impl Sub<Coeff> for Coeff {
    type Output = Coeff;
    fn sub(self, o: Coeff) -> Coeff {
        &self - &o
    }
}

impl Neg for &Coeff {
    type Output = Coeff;
    fn neg(self) -> Coeff {
        self.neg_ref()
    }
}

impl Neg for Coeff {
    type Output = Coeff;
    fn neg(self) -> Coeff {
        self.neg_ref()
    }
}

impl AddAssign<Coeff> for Coeff {
    fn add_assign(&mut self, o: Coeff) {
        *self = self.add_ref(&o);
    }
}

impl AddAssign<&Coeff> for Coeff {
    fn add_assign(&mut self, o: &Coeff) {
        *self = self.add_ref(o);
    }
}

impl MulAssign<&Coeff> for Coeff {
    fn mul_assign(&mut self, o: &Coeff) {
        *self = self.mul_ref(o);
    }
}

impl<'a> std::iter::Product<&'a Coeff> for Coeff {
    fn product<I: Iterator<Item = &'a Coeff>>(iter: I) -> Coeff {
        iter.fold(Coeff::ONE, |acc, x| acc.mul_ref(x))
    }
}

/// The positive gcd of the numerators over the lcm of the denominators of `cs` (1 when all
/// are zero or there are none): dividing by it leaves coprime integers.
pub fn content<'a>(cs: impl Iterator<Item = &'a Coeff> + Clone) -> Coeff {
    let mut num: i128 = 0;
    let mut den: i128 = 1;
    let mut small = true;
    for c in cs.clone() {
        let Some((n, d)) = c.as_small() else {
            small = false;
            break;
        };
        num = num.gcd(&i128::from(n));
        // The lcm grows past i128 only for many large coprime denominators: then go big.
        let g = den.gcd(&i128::from(d));
        match (den / g).checked_mul(i128::from(d)) {
            Some(l) => den = l,
            None => {
                small = false;
                break;
            }
        }
    }
    if small {
        return if num == 0 {
            Coeff::ONE
        } else {
            Coeff::from_i128(num, den)
        };
    }
    let mut num = BigInt::zero();
    let mut den = BigInt::one();
    for c in cs {
        let r = c.to_big();
        num = num.gcd(r.numer());
        den = den.lcm(r.denom());
    }
    if num.is_zero() {
        Coeff::ONE
    } else {
        Coeff::from_big(BigRational::new(num, den))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn big(n: i128, d: i128) -> BigRational {
        BigRational::new(n.into(), d.into())
    }

    /// Numerators and denominators that stress the i64 and i128 boundaries.
    fn edge() -> impl Strategy<Value = i64> {
        prop_oneof![
            -9i64..10,
            Just(i64::MAX),
            Just(i64::MIN),
            Just(i64::MAX - 1),
            Just(i64::MIN + 1),
            Just(1i64 << 62),
            Just(-(1i64 << 62)),
            Just(1i64 << 32),
            Just(3_037_000_499),
            any::<i64>(),
        ]
    }

    fn value() -> impl Strategy<Value = BigRational> {
        prop_oneof![
            (edge(), edge().prop_filter("non-zero", |d| *d != 0))
                .prop_map(|(n, d)| big(n.into(), d.into())),
            // Values past i64 in numerator or denominator.
            (edge(), edge(), 1i64..5)
                .prop_map(|(n, m, d)| big(i128::from(n) * i128::from(m), i128::from(d))),
            (edge(), edge().prop_filter("non-zero", |d| *d != 0), edge())
                .prop_map(|(n, d, e)| big(n.into(), i128::from(d) * i128::from(e) | 1)),
        ]
    }

    /// The representation is canonical: small exactly when it fits.
    fn canonical(c: &Coeff) -> bool {
        let r = c.to_big();
        let fits = r.numer().to_i64().is_some() && r.denom().to_i64().is_some();
        fits == c.as_small().is_some()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn agrees_with_big_rationals(x in value(), y in value()) {
            let (a, b) = (Coeff::from_big(x.clone()), Coeff::from_big(y.clone()));
            let results = [
                (&a + &b, &x + &y),
                (&a - &b, &x - &y),
                (&a * &b, &x * &y),
                (-&a, -x.clone()),
                (a.abs(), x.abs()),
            ];
            for (got, want) in results {
                prop_assert!(canonical(&got));
                prop_assert_eq!(got.to_big(), want.clone());
                prop_assert_eq!(got, Coeff::from_big(want));
            }
            if !y.is_zero() {
                prop_assert_eq!((&a / &b).to_big(), &x / &y);
                prop_assert!(canonical(&(&a / &b)));
                prop_assert_eq!(b.recip().to_big(), y.recip());
            }
            prop_assert_eq!(a.cmp(&b), x.cmp(&y));
            prop_assert_eq!(a.to_string(), x.to_string());
            prop_assert_eq!(a.to_f64(), big_to_f64(&x));
            prop_assert_eq!(a.is_integer(), x.is_integer());
            prop_assert_eq!(a.is_negative(), x.is_negative());
            prop_assert_eq!(a.is_positive(), x.is_positive());
            prop_assert_eq!(a.is_zero(), x.is_zero());
            prop_assert_eq!(a.is_one(), x.is_one());
            let p = (1u64 << 61) - 1;
            let inv = |v: u64| big_residue(&BigInt::from(v).modpow(&BigInt::from(p - 2), &BigInt::from(p)), p);
            let want = (u128::from(big_residue(x.numer(), p)) * u128::from(inv(big_residue(x.denom(), p))) % u128::from(p)) as u64;
            prop_assert_eq!(a.residue(p, inv), want);
        }

        #[test]
        fn content_agrees_with_big_rationals(xs in prop::collection::vec(value(), 0..5)) {
            let cs: Vec<Coeff> = xs.iter().cloned().map(Coeff::from_big).collect();
            let mut num = BigInt::zero();
            let mut den = BigInt::one();
            for x in &xs {
                num = num.gcd(x.numer());
                den = den.lcm(x.denom());
            }
            let want = if num.is_zero() { BigRational::one() } else { BigRational::new(num, den) };
            let got = content(cs.iter());
            prop_assert!(canonical(&got));
            prop_assert_eq!(got.to_big(), want);
        }
    }

    #[test]
    fn overflow_edges_fall_back_and_come_back() {
        let max = Coeff::from_integer(i64::MAX);
        let min = Coeff::from_integer(i64::MIN);
        let past = &max + &Coeff::ONE;
        assert!(past.as_small().is_none());
        assert_eq!(past.to_big(), big(i128::from(i64::MAX) + 1, 1));
        assert_eq!(&past - &Coeff::ONE, max);
        assert!((&past - &Coeff::ONE).as_small().is_some());
        assert!((-&min).as_small().is_none());
        assert_eq!(-(-&min), min);
        assert_eq!(min.recip().to_big(), big(-1, 1i128 << 63));
        assert_eq!(&max * &max / &max, max);
        assert_eq!(Coeff::new(6, -4), Coeff::new(-3, 2));
        assert_eq!(Coeff::from_float(0.375), Some(Coeff::new(3, 8)));
        assert_eq!(Coeff::from_float(f64::NAN), None);
    }
}
