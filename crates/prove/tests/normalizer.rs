//! The normalizer against direct evaluation of random expression trees: a normal form
//! evaluates as its tree does (exactly for the rational fragment, closely in f64 with the
//! transcendental functions); equal normal forms mean equal values; and every witness the
//! decision procedure reports is a real difference of the two trees.

use num_rational::BigRational as Rat;
use num_traits::Zero;
use proptest::prelude::*;
use shardproof_prove::decide::{decide, DecideConfig, Outcome};
use shardproof_prove::eval::{ExactEval, FloatEval};
use shardproof_prove::expr::{rat_to_f64, Arena, Budget, Coeff, ExprId, Func, SymbolKind};

const SYMBOLS: usize = 3;

#[derive(Clone, Debug)]
enum Tree {
    Sym(usize),
    Const(i64),
    Add(Box<Tree>, Box<Tree>),
    Sub(Box<Tree>, Box<Tree>),
    Mul(Box<Tree>, Box<Tree>),
    DivConst(Box<Tree>, i64),
    Max(Box<Tree>, Box<Tree>),
    Min(Box<Tree>, Box<Tree>),
    Gt(Box<Tree>, Box<Tree>),
    Where(Box<Tree>, Box<Tree>, Box<Tree>),
    Exp(Box<Tree>),
    Tanh(Box<Tree>),
    /// `cos` and `sin` (named functions; their values at 0 are folded).
    Cos(Box<Tree>),
    Sin(Box<Tree>),
    /// `lookup(i, t0, t1, t2)` at the index symbol `x3` (an integer in [0, 3)).
    Lookup(Box<[Tree; 3]>),
}

/// The index symbol's number in a point (after the real symbols).
const INDEX: usize = SYMBOLS;

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = prop_oneof![
        (0..SYMBOLS).prop_map(Tree::Sym),
        (-3i64..4).prop_map(Tree::Const),
    ];
    leaf.prop_recursive(5, 24, 3, |inner| {
        let b = || inner.clone().prop_map(Box::new);
        prop_oneof![
            (b(), b()).prop_map(|(x, y)| Tree::Add(x, y)),
            (b(), b()).prop_map(|(x, y)| Tree::Sub(x, y)),
            (b(), b()).prop_map(|(x, y)| Tree::Mul(x, y)),
            (b(), prop_oneof![Just(2i64), Just(-4), Just(3)])
                .prop_map(|(x, k)| Tree::DivConst(x, k)),
            (b(), b()).prop_map(|(x, y)| Tree::Max(x, y)),
            (b(), b()).prop_map(|(x, y)| Tree::Min(x, y)),
            (b(), b()).prop_map(|(x, y)| Tree::Gt(x, y)),
            (b(), b(), b()).prop_map(|(c, x, y)| Tree::Where(c, x, y)),
            b().prop_map(Tree::Exp),
            b().prop_map(Tree::Tanh),
            b().prop_map(Tree::Cos),
            b().prop_map(Tree::Sin),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(x, y, z)| Tree::Lookup(Box::new([x, y, z]))),
        ]
    })
}

fn build(a: &mut Arena, t: &Tree) -> ExprId {
    let r = match t {
        Tree::Sym(i) => a.symbol(&format!("x{i}"), SymbolKind::Real),
        Tree::Const(k) => a.int(*k),
        Tree::Add(x, y) => {
            let (x, y) = (build(a, x), build(a, y));
            a.add(x, y)
        }
        Tree::Sub(x, y) => {
            let (x, y) = (build(a, x), build(a, y));
            a.sub(x, y)
        }
        Tree::Mul(x, y) => {
            let (x, y) = (build(a, x), build(a, y));
            a.mul(x, y)
        }
        Tree::DivConst(x, k) => {
            let x = build(a, x);
            let k = a.int(*k).unwrap();
            a.div(x, k)
        }
        Tree::Max(x, y) => {
            let (x, y) = (build(a, x), build(a, y));
            a.max(x, y)
        }
        Tree::Min(x, y) => {
            let (x, y) = (build(a, x), build(a, y));
            a.min(x, y)
        }
        Tree::Gt(x, y) => {
            let (x, y) = (build(a, x), build(a, y));
            a.gt(x, y)
        }
        Tree::Where(c, x, y) => {
            let (c, x, y) = (build(a, c), build(a, x), build(a, y));
            a.select(c, x, y)
        }
        Tree::Exp(x) => {
            let x = build(a, x);
            a.app(Func::Exp, vec![x])
        }
        Tree::Tanh(x) => {
            let x = build(a, x);
            a.app(Func::Tanh, vec![x])
        }
        Tree::Cos(x) => {
            let x = build(a, x);
            a.app(Func::Named("cos".into()), vec![x])
        }
        Tree::Sin(x) => {
            let x = build(a, x);
            a.app(Func::Named("sin".into()), vec![x])
        }
        Tree::Lookup(ts) => {
            let i = a
                .symbol(&format!("x{INDEX}"), SymbolKind::Index(3))
                .unwrap();
            let mut args = vec![i];
            args.extend(ts.iter().map(|t| build(a, t)));
            a.app(Func::Lookup, args)
        }
    };
    r.expect("within budget")
}

/// The tree's value at `xs`, exactly; `None` when a transcendental function is reached.
fn exact(t: &Tree, xs: &[Rat]) -> Option<Rat> {
    Some(match t {
        Tree::Sym(i) => xs[*i].clone(),
        Tree::Const(k) => Rat::from_integer((*k).into()),
        Tree::Add(x, y) => exact(x, xs)? + exact(y, xs)?,
        Tree::Sub(x, y) => exact(x, xs)? - exact(y, xs)?,
        Tree::Mul(x, y) => exact(x, xs)? * exact(y, xs)?,
        Tree::DivConst(x, k) => exact(x, xs)? / Rat::from_integer((*k).into()),
        Tree::Max(x, y) => exact(x, xs)?.max(exact(y, xs)?),
        Tree::Min(x, y) => exact(x, xs)?.min(exact(y, xs)?),
        Tree::Gt(x, y) => Rat::from_integer(((exact(x, xs)? > exact(y, xs)?) as i64).into()),
        Tree::Where(c, x, y) => {
            if exact(c, xs)?.is_zero() {
                exact(y, xs)?
            } else {
                exact(x, xs)?
            }
        }
        Tree::Lookup(ts) => {
            let i: usize = xs[INDEX].to_integer().try_into().ok()?;
            exact(ts.get(i)?, xs)?
        }
        Tree::Exp(_) | Tree::Tanh(_) | Tree::Cos(_) | Tree::Sin(_) => return None,
    })
}

fn float(t: &Tree, xs: &[f64]) -> f64 {
    match t {
        Tree::Sym(i) => xs[*i],
        Tree::Const(k) => *k as f64,
        Tree::Add(x, y) => float(x, xs) + float(y, xs),
        Tree::Sub(x, y) => float(x, xs) - float(y, xs),
        Tree::Mul(x, y) => float(x, xs) * float(y, xs),
        Tree::DivConst(x, k) => float(x, xs) / *k as f64,
        Tree::Max(x, y) => float(x, xs).max(float(y, xs)),
        Tree::Min(x, y) => float(x, xs).min(float(y, xs)),
        Tree::Gt(x, y) => (float(x, xs) > float(y, xs)) as i64 as f64,
        Tree::Where(c, x, y) => {
            if float(c, xs) != 0.0 {
                float(x, xs)
            } else {
                float(y, xs)
            }
        }
        Tree::Exp(x) => float(x, xs).exp(),
        Tree::Tanh(x) => float(x, xs).tanh(),
        Tree::Cos(x) => float(x, xs).cos(),
        Tree::Sin(x) => float(x, xs).sin(),
        Tree::Lookup(ts) => float(&ts[xs[INDEX] as usize], xs),
    }
}

/// A tree equal to `t` by ring identities and the commutativity of max and min: operands
/// swapped, products distributed over sums, differences written as sums of negations.
fn rewrite(t: &Tree) -> Tree {
    let r = |x: &Tree| Box::new(rewrite(x));
    match t {
        Tree::Sym(_) | Tree::Const(_) => t.clone(),
        Tree::Add(x, y) => Tree::Add(r(y), r(x)),
        Tree::Sub(x, y) => Tree::Add(r(x), Box::new(Tree::Mul(Box::new(Tree::Const(-1)), r(y)))),
        Tree::Mul(x, y) => match &**y {
            Tree::Add(p, q) => Tree::Add(
                Box::new(Tree::Mul(r(x), r(p))),
                Box::new(Tree::Mul(r(q), r(x))),
            ),
            _ => Tree::Mul(r(y), r(x)),
        },
        Tree::DivConst(x, k) => Tree::DivConst(r(x), *k),
        Tree::Max(x, y) => Tree::Max(r(y), r(x)),
        Tree::Min(x, y) => Tree::Min(r(y), r(x)),
        Tree::Gt(x, y) => Tree::Gt(Box::new(Tree::Sub(r(x), r(y))), Box::new(Tree::Const(0))),
        Tree::Where(c, x, y) => Tree::Where(r(c), r(x), r(y)),
        Tree::Exp(x) => Tree::Exp(r(x)),
        Tree::Tanh(x) => Tree::Tanh(r(x)),
        Tree::Cos(x) => Tree::Cos(r(x)),
        Tree::Sin(x) => Tree::Sin(r(x)),
        // lookup(i, t) = lookup(i, -4 t) / -4: tables that differ by a constant factor.
        Tree::Lookup(ts) => Tree::DivConst(
            Box::new(Tree::Lookup(Box::new(ts.clone().map(|t| {
                Tree::Mul(Box::new(Tree::Const(-4)), Box::new(rewrite(&t)))
            })))),
            -4,
        ),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// Values of the real symbols (in quarters) and last, the index symbol's (4 i for index i).
fn point() -> impl Strategy<Value = Vec<i64>> {
    (proptest::collection::vec(-12i64..13, SYMBOLS), 0i64..3).prop_map(|(mut v, i)| {
        v.push(4 * i);
        v
    })
}

/// Symbol values by symbol number (the arena numbers symbols as it meets them).
fn by_number<T: Clone>(a: &Arena, xs: &[T]) -> Vec<T> {
    a.symbols()
        .iter()
        .map(|(name, _)| xs[name[1..].parse::<usize>().unwrap()].clone())
        .collect()
}

fn rats(p: &[i64]) -> Vec<Rat> {
    p.iter().map(|&k| Rat::new(k.into(), 4.into())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn normal_forms_evaluate_as_their_trees(t in tree(), p in point(), expand in prop_oneof![Just(1024usize), Just(2)]) {
        // A tiny expansion limit keeps products of sums as `product` atoms.
        let mut a = Arena::new(Budget { expand_limit: expand, ..Budget::default() });
        let e = build(&mut a, &t);
        let xs = rats(&p);
        if let Some(want) = exact(&t, &xs) {
            let got = ExactEval::new(&a, by_number(&a, &xs)).eval(e);
            prop_assert_eq!(got, Some(want));
        }
        let fx: Vec<f64> = p.iter().map(|&k| k as f64 / 4.0).collect();
        let got = FloatEval::new(&a, by_number(&a, &fx)).eval(e);
        let want = float(&t, &fx);
        // Exponentials of large arguments lose relative precision in different orders.
        if want.is_finite() && want.abs() < 1e12 {
            prop_assert!(close(got, want), "{got} vs {want}");
        }
    }

    #[test]
    fn identities_give_equal_normal_forms_and_values(t in tree(), p in point()) {
        let u = rewrite(&t);
        let mut a = Arena::default();
        let (e, f) = (build(&mut a, &t), build(&mut a, &u));
        prop_assert_eq!(e, f, "{:?} vs {:?}", t, u);
        let xs = rats(&p);
        if let (Some(x), Some(y)) = (exact(&t, &xs), exact(&u, &xs)) {
            prop_assert_eq!(x, y);
        }
        let fx: Vec<f64> = p.iter().map(|&k| k as f64 / 4.0).collect();
        let (x, y) = (float(&t, &fx), float(&u, &fx));
        if x.is_finite() && x.abs() < 1e9 {
            prop_assert!(close(x, y), "{x} vs {y}");
        }
    }

    #[test]
    fn every_witness_is_a_real_difference(t in tree(), u in tree()) {
        let mut a = Arena::default();
        let (e, f) = (build(&mut a, &t), build(&mut a, &u));
        let cfg = DecideConfig { z3_timeout: None, ..DecideConfig::default() };
        if let Outcome::Refuted { point, .. } = decide(&a, e, f, &cfg) {
            let mut xs = vec![Rat::zero(); SYMBOLS + 1];
            for (s, v) in &point.values {
                let name = a.symbol_name(*s);
                xs[name[1..].parse::<usize>().unwrap()] = v.clone();
            }
            match (exact(&t, &xs), exact(&u, &xs)) {
                (Some(x), Some(y)) => prop_assert_ne!(x, y),
                _ => {
                    let fx: Vec<f64> = xs.iter().map(rat_to_f64).collect();
                    let (x, y) = (float(&t, &fx), float(&u, &fx));
                    // A side that overflows f64 (exp(exp(exp(2)))) is beyond every finite f64
                    // the other side can be, so the two differ; where both overflow or one is
                    // NaN, f64 cannot judge the witness and the exact sides above did not apply.
                    if x.is_finite() && y.is_finite() {
                        prop_assert!((x - y).abs() > 1e-7 * (1.0 + x.abs().max(y.abs())), "{x} vs {y} at {fx:?}");
                    } else if x.is_nan() || y.is_nan() || x.is_infinite() && y.is_infinite() {
                        prop_assume!(false, "both sides overflow f64");
                    }
                }
            }
        }
    }
}

/// `0·q` of a q not provably finite (here x / y) is 0 or NaN at every point, and so is every
/// non-zero multiple of it: the multiples share one normal form, and `z - z` stays NaN where
/// z is (the interpreter's IEEE value), instead of cancelling to 0.
#[test]
fn multiples_of_zero_times_share_one_normal_form_and_never_cancel() {
    let mut a = Arena::default();
    let x = a.symbol("x0", SymbolKind::Real).unwrap();
    let y = a.symbol("x1", SymbolKind::Real).unwrap();
    let r = a.recip(y).unwrap();
    let q = a.mul(x, r).unwrap();
    let z = a.scale(q, &Coeff::zero()).unwrap();
    assert!(
        a.render(z, 200).contains("zero_times"),
        "{}",
        a.render(z, 200)
    );
    for k in [2, -3] {
        let zk = a.scale(z, &Coeff::from_integer(k)).unwrap();
        assert_eq!(zk, z, "{}", a.render(zk, 200));
    }
    // 0·(5 x/y + x) is NaN exactly where 0·(x/y) is: where x/y is not finite.
    let q5 = a.scale(q, &Coeff::from_integer(5)).unwrap();
    let q5x = a.add(q5, x).unwrap();
    let z5 = a.scale(q5x, &Coeff::zero()).unwrap();
    assert_eq!(z5, z, "{} vs {}", a.render(z5, 200), a.render(z, 200));
    let d = a.sub(z, z).unwrap();
    let value = |a: &Arena, e, ys: [f64; 2]| FloatEval::new(a, ys.to_vec()).eval(e);
    // 0·(1/0) - 0·(1/0) is NaN in IEEE arithmetic; 0·(1/1) - 0·(1/1) is 0.
    assert!(value(&a, d, [1.0, 0.0]).is_nan());
    assert_eq!(value(&a, d, [1.0, 1.0]), 0.0);
    assert!(value(&a, z, [1.0, 0.0]).is_nan());
}

/// The named functions' exact values at 0 fold to constants, equal to their f64 values.
#[test]
fn named_functions_at_zero_fold_to_their_values() {
    let mut a = Arena::default();
    let zero = a.int(0).unwrap();
    for name in [
        "sin", "cos", "tan", "sinh", "cosh", "asin", "atan", "expm1", "log1p", "erfc",
    ] {
        let f = Func::Named(name.into());
        let e = a.app(f.clone(), vec![zero]).unwrap();
        let c = a
            .as_const(e)
            .unwrap_or_else(|| panic!("{name}(0) not folded"));
        assert_eq!(c.to_f64(), f.eval_f64(&[0.0]), "{name}");
    }
}

/// A product kept unexpanded whose one factor is `0·q` is itself 0 or NaN at every point: its
/// multiples share one normal form too, and the f64 value is the interpreter's.
#[test]
fn a_product_with_a_zero_times_factor_is_zero_times_too() {
    // An expansion limit of 1 keeps (x + y)·(0·(x/y)) a `product` atom.
    let mut a = Arena::new(Budget {
        expand_limit: 1,
        ..Budget::default()
    });
    let x = a.symbol("x0", SymbolKind::Real).unwrap();
    let y = a.symbol("x1", SymbolKind::Real).unwrap();
    let r = a.recip(y).unwrap();
    let q = a.mul(x, r).unwrap();
    let z = a.scale(q, &Coeff::zero()).unwrap();
    let s = a.add(x, y).unwrap();
    let p = a.mul(s, z).unwrap();
    assert!(
        a.render(p, 200).starts_with("product("),
        "{}",
        a.render(p, 200)
    );
    let p3 = a.scale(p, &Coeff::from_integer(3)).unwrap();
    assert_eq!(p3, p, "{}", a.render(p3, 200));
    let value = |a: &Arena, e, ys: [f64; 2]| FloatEval::new(a, ys.to_vec()).eval(e);
    assert!(value(&a, p3, [1.0, 0.0]).is_nan());
    assert_eq!(value(&a, p3, [1.0, 2.0]), 0.0);
}
