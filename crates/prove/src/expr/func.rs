//! The interpreted functions atoms apply, and their f64 semantics (the interpreter's: IEEE
//! values, NaN propagated by max and min, torch's tie rules for sorting).

use super::ZERO_TIMES;

/// An interpreted function: what an atom applies to its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Func {
    /// e^x.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// 1 / x of a non-constant x (constants are inverted exactly).
    Recip,
    /// Hyperbolic tangent.
    Tanh,
    /// The error function.
    Erf,
    /// Maximum of a normalized multiset of arguments (commutative, idempotent, flattened).
    Max,
    /// Minimum of a normalized multiset of arguments.
    Min,
    /// The position (from 0) of the first maximum of the arguments, in their order (torch's
    /// `argmax` / `max.dim` indices); the arguments are not reordered.
    ArgMax,
    /// The position of the first minimum of the arguments, in their order.
    ArgMin,
    /// The `rank`-th (from 0) of the arguments sorted descending (`largest`) or ascending: a
    /// `topk` value. Symmetric: its arguments are kept sorted.
    SortedValue {
        /// Which position of the sorted list.
        rank: u32,
        /// Descending order (largest first) when true.
        largest: bool,
    },
    /// The position, among the arguments in their order, of the `rank`-th of a stable sort
    /// (ties keep their order): a `topk` index.
    SortedIndex {
        /// Which position of the sorted list.
        rank: u32,
        /// Descending order (largest first) when true.
        largest: bool,
    },
    /// 1 when the argument is positive, else 0.
    Positive,
    /// 1 when the argument is non-negative, else 0.
    NonNegative,
    /// 1 when the argument is zero, else 0 (the argument's sign is normalized).
    IsZero,
    /// `where(c, a, b)`: a when c is non-zero, else b.
    Where,
    /// x^e for a rational, non-integer exponent e (stored as its f64 bits).
    PowConst(u64),
    /// The product of two polynomials too large to expand (see [`Budget::expand_limit`]),
    /// each primitive (integer coefficients without a common factor, positive leading
    /// coefficient), sorted.
    Product,
    /// `lookup(i, t_0, ..., t_{n-1})`: t_i for an integer i in [0, n) (an embedding row or a
    /// gathered element at a symbolic index); outside that range it has no value.
    Lookup,
    /// Another elementwise function, by its ATen name (`sin`, `floor`, ...), evaluated by f64.
    Named(String),
}

impl Func {
    /// The function's display name.
    pub fn name(&self) -> String {
        match self {
            Func::Exp => "exp".into(),
            Func::Log => "log".into(),
            Func::Sqrt => "sqrt".into(),
            Func::Recip => "recip".into(),
            Func::Tanh => "tanh".into(),
            Func::Erf => "erf".into(),
            Func::Max => "max".into(),
            Func::Min => "min".into(),
            Func::ArgMax => "argmax".into(),
            Func::ArgMin => "argmin".into(),
            Func::SortedValue { rank, largest } => format!("sorted_value[{rank},{largest}]"),
            Func::SortedIndex { rank, largest } => format!("sorted_index[{rank},{largest}]"),
            Func::Positive => "gt0".into(),
            Func::NonNegative => "ge0".into(),
            Func::IsZero => "eq0".into(),
            Func::Where => "where".into(),
            Func::PowConst(bits) => format!("pow[{}]", f64::from_bits(*bits)),
            Func::Lookup => "lookup".into(),
            Func::Product => "product".into(),
            Func::Named(n) => n.clone(),
        }
    }

    /// The function at a real point, in f64.
    pub fn eval_f64(&self, args: &[f64]) -> f64 {
        let x = args.first().copied().unwrap_or(f64::NAN);
        match self {
            Func::Exp => x.exp(),
            Func::Log => x.ln(),
            Func::Sqrt => x.sqrt(),
            Func::Recip => 1.0 / x,
            Func::Tanh => x.tanh(),
            Func::Erf => erf(x),
            Func::Max => args.iter().copied().fold(f64::NEG_INFINITY, f64_max_nan),
            Func::Min => args.iter().copied().fold(f64::INFINITY, f64_min_nan),
            Func::ArgMax => first_extreme(args, |x, best| x > best) as f64,
            Func::ArgMin => first_extreme(args, |x, best| x < best) as f64,
            Func::SortedValue { rank, largest } => {
                let order = stable_order(args, *largest);
                order.get(*rank as usize).map_or(f64::NAN, |&i| args[i])
            }
            Func::SortedIndex { rank, largest } => {
                let order = stable_order(args, *largest);
                order.get(*rank as usize).map_or(f64::NAN, |&i| i as f64)
            }
            Func::Positive => bool_f64(x > 0.0),
            Func::NonNegative => bool_f64(x >= 0.0),
            Func::IsZero => bool_f64(x == 0.0),
            Func::Where => {
                if x != 0.0 {
                    args[1]
                } else {
                    args[2]
                }
            }
            Func::PowConst(bits) => x.powf(f64::from_bits(*bits)),
            Func::Product => args.iter().product(),
            Func::Lookup => {
                let n = args.len() - 1;
                if x.fract() == 0.0 && x >= 0.0 && (x as usize) < n {
                    args[1 + x as usize]
                } else {
                    f64::NAN
                }
            }
            Func::Named(n) => named_f64(n, x),
        }
    }
}

/// The position of the first extreme of `xs` (`beats(x, best)`: x replaces the best so far);
/// a NaN wins at its first occurrence, as torch's CPU kernels and the interpreter do.
fn first_extreme(xs: &[f64], beats: impl Fn(f64, f64) -> bool) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate().skip(1) {
        if xs[best].is_nan() {
            break;
        }
        if x.is_nan() || beats(x, xs[best]) {
            best = i;
        }
    }
    best
}

/// The positions of `xs` in a stable sort, descending when `largest`; NaN counts as larger
/// than every number, as in the interpreter's `sort`/`topk` kernels.
pub fn stable_order<T: PartialOrd>(xs: &[T], largest: bool) -> Vec<usize> {
    use std::cmp::Ordering;
    let nan = |a: &T| a.partial_cmp(a).is_none();
    let cmp = |a: &T, b: &T| match (nan(a), nan(b)) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    };
    let mut idx: Vec<usize> = (0..xs.len()).collect();
    if largest {
        idx.sort_by(|&i, &j| cmp(&xs[j], &xs[i]));
    } else {
        idx.sort_by(|&i, &j| cmp(&xs[i], &xs[j]));
    }
    idx
}

fn bool_f64(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Max that propagates NaN, as torch's `maximum` does.
fn f64_max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn f64_min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// The error function (Abramowitz-Stegun 7.1.26 is too coarse for witnesses; this uses the
/// series below 3 and the continued fraction tail above).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let a = x.abs();
    let v = if a < 3.0 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)).
        let mut sum: f64 = 0.0;
        let mut term = a;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs().max(1e-300) && n < 200.0 {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -a * a / n;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/(x sqrt(pi)) * continued fraction.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (a + f);
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * (a + f))
    };
    v.copysign(x)
}

/// Elementwise functions known by name.
fn named_f64(name: &str, x: f64) -> f64 {
    match name {
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tan" => x.tan(),
        "sinh" => x.sinh(),
        "cosh" => x.cosh(),
        "asin" => x.asin(),
        "acos" => x.acos(),
        "atan" => x.atan(),
        "asinh" => x.asinh(),
        "acosh" => x.acosh(),
        "atanh" => x.atanh(),
        "expm1" => x.exp_m1(),
        "log1p" => x.ln_1p(),
        "log2" => x.log2(),
        "log10" => x.log10(),
        "exp2" => x.exp2(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        "trunc" => x.trunc(),
        "round" => {
            // Round half to even, as torch.
            let r = x.round();
            if (x - x.trunc()).abs() == 0.5 {
                2.0 * (x / 2.0).round()
            } else {
                r
            }
        }
        "sign" => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        "erfc" => 1.0 - erf(x),
        // 0·x of an x not provably finite: 0, or NaN where x is ±inf or NaN.
        ZERO_TIMES => 0.0 * x,
        _ => f64::NAN,
    }
}
