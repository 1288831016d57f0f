//! Unit tests of the normal form's constructors.

use super::*;

fn arena() -> Arena {
    Arena::default()
}

#[test]
fn a_passed_deadline_stops_construction() {
    let mut a = Arena::default();
    a.set_deadline(Instant::now(), Duration::ZERO);
    std::thread::sleep(Duration::from_millis(2));
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let stopped = (0..3 * CLOCK_EVERY as i64)
        .map(|k| {
            let c = a.int(k)?;
            a.add(x, c)
        })
        .find_map(Result::err)
        .expect("the clock is read every CLOCK_EVERY constructions");
    assert_eq!(stopped.what, TIME_LIMIT);
}

#[test]
fn ring_identities_have_one_normal_form() {
    let mut a = arena();
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let y = a.symbol("y", SymbolKind::Real).unwrap();
    // (x + y)^2 == x^2 + 2xy + y^2
    let s = a.add(x, y).unwrap();
    let lhs = a.mul(s, s).unwrap();
    let x2 = a.mul(x, x).unwrap();
    let y2 = a.mul(y, y).unwrap();
    let xy = a.mul(x, y).unwrap();
    let two_xy = a.scale(xy, &Coeff::from_integer(2)).unwrap();
    let rhs = a.sum(&[x2, two_xy, y2]).unwrap();
    assert_eq!(lhs, rhs);
    // (x + y) - y == x; x / 4 * 4 == x.
    let back = a.sub(s, y).unwrap();
    assert_eq!(back, x);
    let four = a.int(4).unwrap();
    let q = a.div(x, four).unwrap();
    assert_eq!(a.mul(q, four).unwrap(), x);
    assert_ne!(lhs, x2);
}

#[test]
fn max_is_commutative_idempotent_and_flattened() {
    let mut a = arena();
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let y = a.symbol("y", SymbolKind::Real).unwrap();
    let z = a.symbol("z", SymbolKind::Real).unwrap();
    let xy = a.max(x, y).unwrap();
    let yx = a.max(y, x).unwrap();
    assert_eq!(xy, yx);
    let xyz = a.max(xy, z).unwrap();
    let yz = a.max(y, z).unwrap();
    let xyz2 = a.max(x, yz).unwrap();
    assert_eq!(xyz, xyz2);
    assert_eq!(a.max(xy, x).unwrap(), xy);
    let zero = a.int(0).unwrap();
    let three = a.int(3).unwrap();
    let c = a.max(zero, three).unwrap();
    assert_eq!(a.as_const(c), Some(Coeff::from_integer(3)));
}

#[test]
fn reciprocals_pull_out_constants_and_comparisons_normalize_sign() {
    let mut a = arena();
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let y = a.symbol("y", SymbolKind::Real).unwrap();
    let two = a.int(2).unwrap();
    let two_y = a.mul(two, y).unwrap();
    // x / (2y) == (x / 2) / y
    let l = a.div(x, two_y).unwrap();
    let half = a.div(x, two).unwrap();
    let r = a.div(half, y).unwrap();
    assert_eq!(l, r);
    // x == y iff y == x; x > y iff 2x > 2y.
    assert_eq!(a.eq(x, y).unwrap(), a.eq(y, x).unwrap());
    let x2 = a.mul(two, x).unwrap();
    assert_eq!(a.gt(x, y).unwrap(), a.gt(x2, two_y).unwrap());
    assert_ne!(a.gt(x, y).unwrap(), a.gt(y, x).unwrap());
}

#[test]
fn index_ranges_decide_equalities_outside_them() {
    let mut a = arena();
    let t = a.symbol("t", SymbolKind::Index(8)).unwrap();
    assert_eq!(a.index_bound(t), Some(8));
    // t == -100 is impossible for t in [0, 8); t == 3 is not decided.
    let ignore = a.int(-100).unwrap();
    let e = a.eq(t, ignore).unwrap();
    assert_eq!(a.as_const(e), Some(Coeff::zero()));
    let three = a.int(3).unwrap();
    let e = a.eq(t, three).unwrap();
    assert!(a.as_const(e).is_none());
    let eight = a.int(8).unwrap();
    let e = a.eq(t, eight).unwrap();
    assert_eq!(a.as_const(e), Some(Coeff::zero()));
    // A real symbol has no range.
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let e = a.eq(x, ignore).unwrap();
    assert!(a.as_const(e).is_none());
}

#[test]
fn budgets_refuse_blowups() {
    let mut a = Arena::new(Budget {
        terms_per_expr: 50,
        total_terms: 1000,
        expand_limit: usize::MAX,
    });
    let xs: Vec<ExprId> = (0..10)
        .map(|i| a.symbol(&format!("x{i}"), SymbolKind::Real).unwrap())
        .collect();
    let s = a.sum(&xs).unwrap();
    let err = a.mul(s, s).unwrap_err();
    assert_eq!(err.what, "terms of one expression");
}

#[test]
fn erf_is_accurate() {
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (-2.0, -0.995_322_265_018_952_7),
        (3.5, 0.999_999_256_901_627_7),
    ] {
        assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {}", erf(x));
    }
}

#[test]
fn infinities_are_absorbed_as_ieee_computes_them() {
    let mut a = arena();
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let ninf = a.float(f64::NEG_INFINITY).unwrap();
    let inf = a.float(f64::INFINITY).unwrap();
    // A masked score: x + (-inf) = -inf for a finite x; exp of it is 0.
    let masked = a.add(x, ninf).unwrap();
    assert_eq!(masked, ninf);
    let e = a.app(Func::Exp, vec![masked]).unwrap();
    assert_eq!(a.as_const(e), Some(Coeff::zero()));
    // max(x, -inf) = x; -inf - -inf and 0·inf are NaN; equal infinities compare equal.
    assert_eq!(a.max(x, ninf).unwrap(), x);
    let d = a.sub(ninf, ninf).unwrap();
    assert_eq!(a.pure_nonfinite(d), Some(0));
    let zero = a.int(0).unwrap();
    let z = a.mul(zero, inf).unwrap();
    assert_eq!(a.pure_nonfinite(z), Some(0));
    let ge = a.ge(ninf, ninf).unwrap();
    assert_eq!(a.as_const(ge), Some(Coeff::one()));
    let gt = a.gt(ninf, ninf).unwrap();
    assert_eq!(a.as_const(gt), Some(Coeff::zero()));
    // Next to something not provably finite (log x may be -inf or NaN), -inf stays formal.
    let l = a.app(Func::Log, vec![x]).unwrap();
    let s = a.add(l, ninf).unwrap();
    assert_eq!(a.pure_nonfinite(s), None);
    // 0·log(x) is NaN for x <= 0: not 0; 0·x of a finite x is.
    let z = a.mul(zero, l).unwrap();
    assert_ne!(a.as_const(z), Some(Coeff::zero()));
    let z = a.mul(zero, x).unwrap();
    assert_eq!(a.as_const(z), Some(Coeff::zero()));
}

#[test]
fn exponentials_merge_and_shifts_cancel_only_where_proved() {
    let mut a = arena();
    let x = a.symbol("x", SymbolKind::Real).unwrap();
    let y = a.symbol("y", SymbolKind::Real).unwrap();
    let m = a.max(x, y).unwrap();
    // softmax(x, y)_0 with the max shift equals exp(x) / (exp(x) + exp(y)).
    let (dx, dy) = (a.sub(x, m).unwrap(), a.sub(y, m).unwrap());
    let (ex, ey) = (
        a.app(Func::Exp, vec![dx]).unwrap(),
        a.app(Func::Exp, vec![dy]).unwrap(),
    );
    let s = a.add(ex, ey).unwrap();
    let shifted = a.div(ex, s).unwrap();
    let (px, py) = (
        a.app(Func::Exp, vec![x]).unwrap(),
        a.app(Func::Exp, vec![y]).unwrap(),
    );
    let t = a.add(px, py).unwrap();
    let plain = a.div(px, t).unwrap();
    assert_eq!(shifted, plain);
    // log(exp(x)) = x; exp(log(exp(x) + exp(y))) = exp(x) + exp(y) (a positive sum).
    let le = a.app(Func::Log, vec![px]).unwrap();
    assert_eq!(le, x);
    let lt = a.app(Func::Log, vec![t]).unwrap();
    assert_eq!(a.app(Func::Exp, vec![lt]).unwrap(), t);
    // exp(log(x)) is not x: x may be negative.
    let lx = a.app(Func::Log, vec![x]).unwrap();
    assert_ne!(a.app(Func::Exp, vec![lx]).unwrap(), x);
}
