//! The normalizer against direct evaluation of random expression trees: a normal form
//! evaluates as its tree does (exactly for the rational fragment, closely in f64 with the
//! transcendental functions); equal normal forms mean equal values; and every witness the
//! decision procedure reports is a real difference of the two trees.

use num_rational::BigRational as Rat;
use num_traits::Zero;
use proptest::prelude::*;
use shardproof_prove::decide::{decide, DecideConfig, Layer, Outcome};
use shardproof_prove::eval::{ExactEval, FloatEval};
use shardproof_prove::expand::equal_with_weights_outside;
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
            check_witness(&a, &t, &u, &point)?;
        }
    }

    /// The goals of one arena share its memos (the modular points and what they evaluated,
    /// the product expansion layer's rewriting) while the arena grows between them: every
    /// witness is still a real difference, every proof an equality at random points, and no
    /// goal is proved in the shared arena and refuted in a fresh one (or the reverse).
    #[test]
    fn goals_sharing_an_arena_get_sound_verdicts(
        goals in proptest::collection::vec((tree(), tree()), 2..6),
        p in point(),
    ) {
        let cfg = DecideConfig { z3_timeout: None, ..DecideConfig::default() };
        let mut shared = Arena::default();
        for (t, u) in &goals {
            let (e, f) = (build(&mut shared, t), build(&mut shared, u));
            let outcome = decide(&shared, e, f, &cfg);
            let mut fresh = Arena::default();
            let (e1, f1) = (build(&mut fresh, t), build(&mut fresh, u));
            let alone = decide(&fresh, e1, f1, &cfg);
            let proved = |o: &Outcome| matches!(o, Outcome::Proved(_));
            let refuted = |o: &Outcome| matches!(o, Outcome::Refuted { .. });
            prop_assert!(!(proved(&outcome) && refuted(&alone)), "{t:?} vs {u:?}");
            prop_assert!(!(refuted(&outcome) && proved(&alone)), "{t:?} vs {u:?}");
            match outcome {
                Outcome::Refuted { point, .. } => check_witness(&shared, t, u, &point)?,
                Outcome::Proved(_) => {
                    let xs = rats(&p);
                    if let (Some(x), Some(y)) = (exact(t, &xs), exact(u, &xs)) {
                        prop_assert_eq!(x, y);
                    }
                }
                Outcome::Unknown(_) => {}
            }
        }
    }
}

/// Whether the decision procedure's witness `point` for `t` against `u` (built in `a`) is a
/// real difference of the two trees.
fn check_witness(
    a: &Arena,
    t: &Tree,
    u: &Tree,
    point: &shardproof_prove::decide::Point,
) -> Result<(), TestCaseError> {
    let mut xs = vec![Rat::zero(); SYMBOLS + 1];
    for (s, v) in &point.values {
        let name = a.symbol_name(*s);
        xs[name[1..].parse::<usize>().unwrap()] = v.clone();
    }
    match (exact(t, &xs), exact(u, &xs)) {
        (Some(x), Some(y)) => prop_assert_ne!(x, y),
        _ => {
            let fx: Vec<f64> = xs.iter().map(rat_to_f64).collect();
            let (x, y) = (float(t, &fx), float(u, &fx));
            // A side that overflows f64 (exp(exp(exp(2)))) is beyond every finite f64
            // the other side can be, so the two differ; where both overflow or one is
            // NaN, f64 cannot judge the witness and the exact sides above did not apply.
            if x.is_finite() && y.is_finite() {
                prop_assert!(
                    (x - y).abs() > 1e-7 * (1.0 + x.abs().max(y.abs())),
                    "{x} vs {y} at {fx:?}"
                );
            } else if x.is_nan() || y.is_nan() || x.is_infinite() && y.is_infinite() {
                prop_assume!(false, "both sides overflow f64");
            }
        }
    }
    Ok(())
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

/// One block of a ring attention merge `Σ_j c_j·w_j·V_j`: its coefficient, the softmax
/// weight it holds (0 none, 1 `P0`, 2 `P1`, 3 `P0·P1`) and its values' coefficients on
/// `v0..v2` (zero or one term as well as sums).
#[derive(Clone, Debug)]
struct Block {
    coeff: i64,
    weight: usize,
    values: Vec<i64>,
}

fn block() -> impl Strategy<Value = Block> {
    (
        prop_oneof![Just(-2i64), Just(-1), Just(1), Just(3)],
        0usize..4,
        proptest::collection::vec(-2i64..3, 3),
    )
        .prop_map(|(coeff, weight, values)| Block {
            coeff,
            weight,
            values,
        })
}

/// An arena whose products of sums stay `product` atoms, with the symbols of
/// [`weighted_value`]: scores `s0, s1`, values `v0..v2`, output gradients `g0..g2`.
struct Ring {
    a: Arena,
    /// `P0`, `P1`: softmax weights over the two scores.
    p: [ExprId; 2],
    v: [ExprId; 3],
    /// The output gradient `g0 + 2·g1 - g2`.
    d_o: ExprId,
}

impl Ring {
    fn new() -> Ring {
        let mut a = Arena::new(Budget {
            expand_limit: 2,
            ..Budget::default()
        });
        let sym = |a: &mut Arena, n: &str| a.symbol(n, SymbolKind::Real).unwrap();
        let s = [sym(&mut a, "s0"), sym(&mut a, "s1")];
        let v = [sym(&mut a, "v0"), sym(&mut a, "v1"), sym(&mut a, "v2")];
        let g = [sym(&mut a, "g0"), sym(&mut a, "g1"), sym(&mut a, "g2")];
        let e = s.map(|x| a.app(Func::Exp, vec![x]).unwrap());
        let total = a.add(e[0], e[1]).unwrap();
        let r = a.recip(total).unwrap();
        let p = e.map(|x| a.mul(x, r).unwrap());
        let g1 = a.scale(g[1], &Coeff::from_integer(2)).unwrap();
        let d_o = a.sum(&[g[0], g1]).unwrap();
        let d_o = a.sub(d_o, g[2]).unwrap();
        Ring { a, p, v, d_o }
    }

    fn weight(&mut self, w: usize) -> ExprId {
        match w {
            0 => self.a.int(1).unwrap(),
            1 => self.p[0],
            2 => self.p[1],
            _ => self.a.mul(self.p[0], self.p[1]).unwrap(),
        }
    }

    fn values(&mut self, b: &Block) -> ExprId {
        let mut parts = Vec::new();
        for (i, &k) in b.values.iter().enumerate() {
            parts.push(self.a.scale(self.v[i], &Coeff::from_integer(k)).unwrap());
        }
        self.a.sum(&parts).unwrap()
    }

    /// The ring's `product(Σ_j c_j·w_j·V_j, dO)`: the weights inside the product.
    fn inside(&mut self, blocks: &[Block]) -> ExprId {
        let mut parts = Vec::new();
        for b in blocks {
            let (w, v) = (self.weight(b.weight), self.values(b));
            let wv = self.a.mul(w, v).unwrap();
            parts.push(self.a.scale(wv, &Coeff::from_integer(b.coeff)).unwrap());
        }
        let o = self.a.sum(&parts).unwrap();
        self.a.mul(o, self.d_o).unwrap()
    }

    /// The spec's `Σ_j c_j·w_j·product(V_j, dO)`: the weights outside.
    fn outside(&mut self, blocks: &[Block]) -> ExprId {
        let mut parts = Vec::new();
        for b in blocks {
            let (w, v) = (self.weight(b.weight), self.values(b));
            let vd = self.a.mul(v, self.d_o).unwrap();
            let wvd = self.a.mul(w, vd).unwrap();
            parts.push(self.a.scale(wvd, &Coeff::from_integer(b.coeff)).unwrap());
        }
        self.a.sum(&parts).unwrap()
    }

    fn proved(&self, x: ExprId, y: ExprId) -> bool {
        shardproof_prove::expand::equal_after_expanding_products(&self.a, x, y, 200_000, None)
            == Ok(true)
    }

    /// Whether `x` and `y` differ in f64 at some of a few fixed points.
    fn differ(&self, x: ExprId, y: ExprId) -> bool {
        (0..6).any(|k| {
            let xs: Vec<f64> = (0..self.a.symbols().len())
                .map(|i| ((i * 7 + k * 5) % 11) as f64 / 4.0 - 1.25)
                .collect();
            let mut ev = FloatEval::new(&self.a, xs);
            let (u, v) = (ev.eval(x), ev.eval(y));
            (u - v).abs() > 1e-9 * (1.0 + u.abs().max(v.abs()))
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Moving softmax weights out of products (the product expansion layer) proves only
    /// equalities: the weights inside against outside are always equal, and a mutated
    /// outside (one block's coefficient changed: a dropped block, a flipped sign, a wrong
    /// scale) is proved only where it does not change the value.
    #[test]
    fn weights_moved_out_of_products_prove_only_equalities(
        blocks in proptest::collection::vec(block(), 1..4),
        which in 0usize..3,
        delta in prop_oneof![Just(-1i64), Just(1), Just(-2)],
    ) {
        let mut r = Ring::new();
        let inside = r.inside(&blocks);
        let outside = r.outside(&blocks);
        prop_assert!(!r.differ(inside, outside));
        let mut bad = blocks.clone();
        let j = which % bad.len();
        bad[j].coeff += delta;
        let mutated = r.outside(&bad);
        if r.proved(inside, mutated) {
            prop_assert!(!r.differ(inside, mutated), "{blocks:?} mutated at {j}");
        }
        // Distinct weights, each on a sum: the rewriting meets the other side.
        let mut weights: Vec<usize> = blocks.iter().map(|b| b.weight).collect();
        weights.sort();
        weights.dedup();
        let sums = blocks.iter().all(|b| b.values.iter().filter(|&&k| k != 0).count() >= 2);
        if weights.len() == blocks.len() && sums {
            prop_assert!(r.proved(inside, outside), "{blocks:?}");
        }
    }
}

/// Ring attention's `D = Σ_h dO_h·O_h` against the spec's weights outside: proved; the
/// planted bugs of a ring backward (a block dropped, a block's scale wrong, the weights
/// swapped between blocks, the weights dropped) are not, and each really differs.
#[test]
fn a_ring_merge_is_proved_with_its_weights_outside_and_planted_bugs_are_not() {
    let block = |coeff, weight, values: [i64; 3]| Block {
        coeff,
        weight,
        values: values.to_vec(),
    };
    let correct = [block(1, 1, [1, 2, 0]), block(1, 2, [0, 1, -1])];
    let mut r = Ring::new();
    let inside = r.inside(&correct);
    let outside = r.outside(&correct);
    assert_ne!(
        inside, outside,
        "the normal form keeps the two groupings apart"
    );
    assert!(r.proved(inside, outside));
    let planted: [(&str, Vec<Block>); 4] = [
        ("a block dropped", vec![correct[0].clone()]),
        (
            "a block's scale",
            vec![block(2, 1, [1, 2, 0]), correct[1].clone()],
        ),
        (
            "weights swapped",
            vec![block(1, 2, [1, 2, 0]), block(1, 1, [0, 1, -1])],
        ),
        (
            "weights dropped",
            vec![block(1, 0, [1, 2, 0]), block(1, 0, [0, 1, -1])],
        ),
    ];
    // Through the whole decision procedure, which tries the rewriting before the real points.
    let cfg = DecideConfig {
        z3_timeout: None,
        ..DecideConfig::default()
    };
    assert_eq!(
        decide(&r.a, inside, outside, &cfg),
        Outcome::Proved(Layer::ProductExpansion)
    );
    for (what, blocks) in planted {
        let wrong = r.outside(&blocks);
        assert!(r.differ(inside, wrong), "{what}");
        assert!(!r.proved(inside, wrong), "{what}");
        match decide(&r.a, inside, wrong, &cfg) {
            Outcome::Refuted { point, .. } => {
                let mut xs = vec![0.0; r.a.symbols().len()];
                for (s, v) in &point.values {
                    xs[*s as usize] = rat_to_f64(v);
                }
                let mut ev = FloatEval::new(&r.a, xs);
                let (u, v) = (ev.eval(inside), ev.eval(wrong));
                assert!(
                    (u - v).abs() > 1e-9 * (1.0 + u.abs().max(v.abs())),
                    "{what}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// The rewriting's memo is kept with the arena across goals, and a form it remembers depends
/// on what the arena stores and on the term limit: after the arena grows, or under another
/// limit, it is rewritten again (else a product whose parts were stored later would stay as
/// it was, and a factor once past a small limit would stay past a larger one).
#[test]
fn the_rewriting_memo_follows_its_arena_and_its_limit() {
    let block = |coeff, weight, values: [i64; 3]| Block {
        coeff,
        weight,
        values: values.to_vec(),
    };
    let blocks = [block(1, 1, [1, 2, 0]), block(1, 2, [0, 1, -1])];
    let mut r = Ring::new();
    let inside = r.inside(&blocks);
    let lone = r.a.symbol("lone", SymbolKind::Real).unwrap();
    // Before the spec's products exist, the weights cannot leave the ring's product.
    assert_eq!(
        equal_with_weights_outside(&r.a, inside, lone, 200_000, None),
        Ok(false)
    );
    let outside = r.outside(&blocks);
    assert_eq!(
        equal_with_weights_outside(&r.a, inside, outside, 200_000, None),
        Ok(true),
        "the arena grew: the memo must not answer from before"
    );
    // A limit of one term stops the rewriting; the memo must not carry that over.
    assert!(equal_with_weights_outside(&r.a, inside, outside, 1, None).is_err());
    assert_eq!(
        equal_with_weights_outside(&r.a, inside, outside, 200_000, None),
        Ok(true),
        "another limit: the memo must not answer from the smaller one"
    );
}

/// A lookup at a position among k values (`argmax`, `argmin`, a top-k index of rank < k) is
/// in range when the table has at least k entries, so `0·lookup(..)` is 0 there (a top-k
/// router's gathered weights). With a shorter table, or a rank past the values, the
/// position may fall outside it (NaN, and `0·NaN` is NaN): `0·x` stays `zero_times`. Checked
/// against direct f64 evaluation at points that put every position first.
#[test]
fn zero_times_a_lookup_at_a_sorted_position_is_zero_only_in_range() {
    let mut in_range_seen = 0;
    let mut out_of_range_seen = 0;
    for k in 1..=3usize {
        let positions = [
            Func::ArgMax,
            Func::ArgMin,
            Func::SortedIndex {
                rank: 0,
                largest: true,
            },
            Func::SortedIndex {
                rank: k as u32 - 1,
                largest: false,
            },
            Func::SortedIndex {
                rank: k as u32,
                largest: true,
            },
        ];
        for f in positions {
            // Tables of 2 entries or more: a one-entry table is read as its entry whatever
            // the index (the normal form assumes an index in range, as every program has).
            for n in 2..=4usize {
                let mut a = Arena::default();
                let xs: Vec<ExprId> = (0..k)
                    .map(|i| a.symbol(&format!("x{i}"), SymbolKind::Real).unwrap())
                    .collect();
                let ts: Vec<ExprId> = (0..n)
                    .map(|j| a.symbol(&format!("t{j}"), SymbolKind::Real).unwrap())
                    .collect();
                let index = a.app(f.clone(), xs.clone()).unwrap();
                let mut args = vec![index];
                args.extend(&ts);
                let looked_up = a.app(Func::Lookup, args).unwrap();
                let z = a.scale(looked_up, &Coeff::zero()).unwrap();
                let proved_zero = a.as_const(z).is_some_and(|c| c.is_zero());
                // Each position first in turn (largest and smallest), the table entries finite.
                let mut any_nan = false;
                for hot in 0..k {
                    for sign in [1.0, -1.0] {
                        let values: Vec<f64> = (0..k)
                            .map(|i| if i == hot { 4.0 * sign } else { i as f64 * 0.5 })
                            .collect();
                        let table: Vec<f64> = (0..n).map(|j| j as f64 + 1.0).collect();
                        let at = f.eval_f64(&values);
                        let entry = if at >= 0.0 && (at as usize) < n {
                            table[at as usize]
                        } else {
                            f64::NAN
                        };
                        let direct = 0.0 * entry;
                        // Symbols are numbered as made: the values, then the table.
                        let point = [values.clone(), table].concat();
                        let normal = FloatEval::new(&a, point).eval(z);
                        assert!(
                            direct == normal || (direct.is_nan() && normal.is_nan()),
                            "{f:?} k={k} n={n}: direct {direct}, normal form {normal} ({})",
                            a.render(z, 200)
                        );
                        any_nan |= direct.is_nan();
                    }
                }
                let covered = match f {
                    Func::SortedIndex { rank, .. } => (rank as usize) < k && k <= n,
                    _ => k <= n,
                };
                assert_eq!(proved_zero, covered, "{f:?} k={k} n={n}");
                if covered {
                    in_range_seen += 1;
                } else if any_nan {
                    out_of_range_seen += 1;
                }
            }
        }
    }
    assert!(in_range_seen > 0 && out_of_range_seen > 0);
}

/// A comparison whose argument is exactly 0 at a witness (`where(x0, -3, x1) - x1` at `x0 = 0`,
/// normalized to `-x1 - 3·where(x0, 1, -x1/3)`, is 2e-16 in f64) is evaluated exactly: the
/// witness check took `tanh(gt0(..)) = tanh(1)` for 0 and refuted the goal at a point where
/// both sides are 0 (found by `goals_sharing_an_arena_get_sound_verdicts`).
#[test]
fn a_comparison_exactly_at_zero_is_no_witness() {
    let t = Tree::Sin(Box::new(Tree::Const(0)));
    let u = Tree::Tanh(Box::new(Tree::Gt(
        Box::new(Tree::Where(
            Box::new(Tree::Sym(0)),
            Box::new(Tree::Const(-3)),
            Box::new(Tree::Sym(1)),
        )),
        Box::new(Tree::Sym(1)),
    )));
    let mut a = Arena::default();
    let f = build(&mut a, &u);
    let point = [Coeff::from_integer(0), Coeff::new(-7, 4)];
    let at = FloatEval::at_exact_point(&a, &point).eval(f);
    assert_eq!(at, 0.0);
    let cfg = DecideConfig {
        z3_timeout: None,
        ..DecideConfig::default()
    };
    let e = build(&mut a, &t);
    if let Outcome::Refuted { point, .. } = decide(&a, e, f, &cfg) {
        check_witness(&a, &t, &u, &point).unwrap();
    }
}
