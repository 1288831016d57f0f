//! Exact rational coefficients with a machine-integer fast path.
//!
//! Almost every coefficient the prover meets is a small integer or a small dyadic fraction, yet
//! arbitrary-precision rationals allocate on every operation. [`Coeff`] keeps a value as a
//! reduced `i128 / i128` while it fits (wide enough for the exact value of f64 constants such as
//! `1e-5`, whose denominators pass 2^64), does each operation with checked machine arithmetic
//! and falls back to [`BigRational`] only when a result does not fit.
//!
//! The representation is canonical: a value is small exactly when its reduced numerator and
//! denominator both fit in `i128`. Equal values therefore have equal representations, so the
//! derived `Eq` and `Hash` agree with equality of the rationals, which hash-consing relies on.

use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::{BigRational, Ratio};
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::cmp::Ordering;
use std::fmt;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

/// An exact rational number: a reduced `i128` fraction when it fits, else a [`BigRational`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Coeff(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// Numerator and positive denominator, coprime.
    Small(i128, i128),
    /// A value whose reduced numerator or denominator does not fit in `i128`.
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
        Coeff::reduced(i128::from(n), i128::from(d))
    }

    /// The integer `n`.
    pub fn from_integer(n: i64) -> Coeff {
        Coeff(Repr::Small(i128::from(n), 1))
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
        match (r.numer().to_i128(), r.denom().to_i128()) {
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

    /// The reduced numerator and denominator when both fit in `i128` (the denominator positive).
    pub fn as_small(&self) -> Option<(i128, i128)> {
        match self.0 {
            Repr::Small(n, d) => Some((n, d)),
            Repr::Big(_) => None,
        }
    }

    /// n / d for d != 0, reduced and made canonical.
    fn reduced(n: i128, d: i128) -> Coeff {
        debug_assert!(d != 0);
        let Some(g) = gcd(n, d) else {
            return Coeff::from_big(BigRational::new(n.into(), d.into()));
        };
        let (n, d) = (div_exact(n, g), div_exact(d, g));
        if d > 0 {
            return Coeff(Repr::Small(n, d));
        }
        match (n.checked_neg(), d.checked_neg()) {
            (Some(n), Some(d)) => Coeff(Repr::Small(n, d)),
            _ => Coeff::from_big(BigRational::new(n.into(), d.into())),
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
                Coeff::reduced(*d, *n)
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
                n.rem_euclid(i128::from(p)) as u64,
                d.rem_euclid(i128::from(p)) as u64,
            ),
            Repr::Big(r) => (big_residue(r.numer(), p), big_residue(r.denom(), p)),
        };
        if d == 1 {
            return n;
        }
        ((u128::from(n) * u128::from(inv(d))) % u128::from(p)) as u64
    }

    fn add_ref(&self, o: &Coeff) -> Coeff {
        if let (Repr::Small(a, b), Repr::Small(c, d)) = (&self.0, &o.0) {
            if let Some(r) = small_add(*a, *b, *c, *d) {
                return r;
            }
        }
        Coeff::from_big(self.to_big() + o.to_big())
    }

    fn mul_ref(&self, o: &Coeff) -> Coeff {
        if let (Repr::Small(a, b), Repr::Small(c, d)) = (&self.0, &o.0) {
            if let Some(r) = small_mul(*a, *b, *c, *d) {
                return r;
            }
        }
        Coeff::from_big(self.to_big() * o.to_big())
    }

    fn div_ref(&self, o: &Coeff) -> Coeff {
        assert!(!o.is_zero(), "denominator == 0");
        if let (Repr::Small(a, b), Repr::Small(c, d)) = (&self.0, &o.0) {
            // a/b / c/d = a/b * d/c with the sign of c moved to the numerator.
            let (d, c) = if *c < 0 {
                (d.checked_neg(), c.checked_neg())
            } else {
                (Some(*d), Some(*c))
            };
            if let Some(r) = d.zip(c).and_then(|(d, c)| small_mul(*a, *b, d, c)) {
                return r;
            }
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

/// a/b + c/d for reduced fractions with positive denominators, None on overflow.
fn small_add(a: i128, b: i128, c: i128, d: i128) -> Option<Coeff> {
    if b == 1 && d == 1 {
        return Some(Coeff(Repr::Small(a.checked_add(c)?, 1)));
    }
    if b == d {
        return Some(Coeff::reduced(a.checked_add(c)?, b));
    }
    // Over the lcm of the denominators: the common factor g is divided out first.
    let g = gcd(b, d)?;
    let (b1, d1) = (div_exact(b, g), div_exact(d, g));
    let n = a.checked_mul(d1)?.checked_add(c.checked_mul(b1)?)?;
    let den = b.checked_mul(d1)?;
    Some(Coeff::reduced(n, den))
}

/// (a/b)(c/d) for reduced fractions with positive denominators, None on overflow.
fn small_mul(a: i128, b: i128, c: i128, d: i128) -> Option<Coeff> {
    if a == 0 || c == 0 {
        return Some(Coeff::ZERO);
    }
    if b == 1 && d == 1 {
        return Some(Coeff(Repr::Small(a.checked_mul(c)?, 1)));
    }
    // Cross-cancelling keeps the intermediate products small and the result reduced.
    let (g1, g2) = (gcd(a, d)?, gcd(c, b)?);
    let n = div_exact(a, g1).checked_mul(div_exact(c, g2))?;
    let den = div_exact(b, g2).checked_mul(div_exact(d, g1))?;
    Some(Coeff(Repr::Small(n, den)))
}

/// The non-negative gcd of `a` and `b` (0 for two zeros); None when it does not fit i128 (both are
/// i128::MIN). Values that fit in 64 bits, nearly all of them, take the much cheaper u64 path.
#[inline]
fn gcd(a: i128, b: i128) -> Option<i128> {
    let (x, y) = (a.unsigned_abs(), b.unsigned_abs());
    let g = match (u64::try_from(x), u64::try_from(y)) {
        (Ok(x), Ok(y)) => u128::from(x.gcd(&y)),
        _ => x.gcd(&y),
    };
    i128::try_from(g).ok()
}

/// n / g for g > 0 dividing n, in 64-bit arithmetic where both fit.
#[inline]
fn div_exact(n: i128, g: i128) -> i128 {
    match (i64::try_from(n), i64::try_from(g)) {
        (Ok(n), Ok(g)) => i128::from(n / g),
        _ => n / g,
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
            (Repr::Small(a, b), Repr::Small(c, d)) => {
                if b == d {
                    return a.cmp(c);
                }
                match (a.checked_mul(*d), c.checked_mul(*b)) {
                    (Some(x), Some(y)) => x.cmp(&y),
                    _ => self.to_big().cmp(&o.to_big()),
                }
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
        // The lcm outgrows i128 for many large coprime denominators: then go big.
        let lcm = gcd(den, d).and_then(|g| div_exact(den, g).checked_mul(d));
        match (gcd(num, n), lcm) {
            (Some(g), Some(l)) => (num, den) = (g, l),
            _ => {
                small = false;
                break;
            }
        }
    }
    if small {
        return if num == 0 {
            Coeff::ONE
        } else {
            Coeff::reduced(num, den)
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
    fn edge() -> impl Strategy<Value = i128> {
        prop_oneof![
            edge64().prop_map(i128::from),
            Just(i128::MAX),
            Just(i128::MIN),
            Just(i128::MAX - 1),
            Just(i128::MIN + 1),
            Just(1i128 << 100),
            Just(-(1i128 << 69)),
            Just(13_043_817_825_332_782_212),
            any::<i128>(),
        ]
    }

    fn edge64() -> impl Strategy<Value = i64> {
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
        let nz = || edge().prop_filter("non-zero", |d| *d != 0);
        prop_oneof![
            (edge(), nz()).prop_map(|(n, d)| big(n, d)),
            (edge64(), 1i64..64).prop_map(|(n, d)| big(n.into(), d.into())),
            // Values past i128 in numerator or denominator.
            (edge(), edge(), nz()).prop_map(|(n, m, d)| BigRational::new(
                BigInt::from(n) * BigInt::from(m),
                d.into()
            )),
            (edge(), nz(), nz()).prop_map(|(n, d, e)| BigRational::new(
                n.into(),
                BigInt::from(d) * BigInt::from(e)
            )),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(|x| BigRational::from_float(x).unwrap()),
        ]
    }

    /// The representation is canonical: small exactly when it fits.
    fn canonical(c: &Coeff) -> bool {
        let r = c.to_big();
        let fits = r.numer().to_i128().is_some() && r.denom().to_i128().is_some();
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
        let wide = &max * &max * Coeff::from_integer(4);
        assert!(wide.as_small().is_none());
        assert_eq!(
            wide.to_big(),
            BigRational::from_integer(BigInt::from(i64::MAX).pow(2) * 4)
        );
        assert_eq!(&wide / &Coeff::from_integer(4), &max * &max);
        assert!((&wide / &Coeff::from_integer(4)).as_small().is_some());
        let i128_min = &min * &min * Coeff::from_integer(-2);
        assert_eq!(i128_min.as_small(), Some((i128::MIN, 1)));
        assert!((-&i128_min).as_small().is_none());
        assert_eq!(-(-&i128_min), i128_min);
        assert!(i128_min.recip().as_small().is_none());
        assert_eq!(i128_min.recip().recip(), i128_min);
        assert_eq!(&max * &max / &max, max);
        assert_eq!(Coeff::from_float(1e-5).unwrap().to_f64(), 1e-5);
        assert!(Coeff::from_float(1e-5).unwrap().as_small().is_some());
        assert_eq!(Coeff::new(6, -4), Coeff::new(-3, 2));
        assert_eq!(Coeff::from_float(0.375), Some(Coeff::new(3, 8)));
        assert_eq!(Coeff::from_float(f64::NAN), None);
    }
}
