//! Deciding one goal `a == b`, layer by layer: normal forms, random points, Z3.

use crate::eval::{clearly_differ, ExactEval, FloatEval, ModEval, ModMemo, PRIME};
use crate::expr::{Arena, Coeff, ExprId, SymbolKind};
use crate::smt;
use num_rational::BigRational;

use serde::Serialize;
use std::time::{Duration, Instant};

mod split;

/// The layer that decided a goal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    /// Both sides have the same normal form.
    NormalForm,
    /// A random point where the two sides differ (evaluated exactly, or in f64 clearly).
    RandomWitness,
    /// The two sides' difference expands to zero once its `product` atoms are multiplied
    /// out ([`crate::expand`]).
    ProductExpansion,
    /// Cases on an index symbol between its comparisons' roots, the sides' forms equal on
    /// each (proved), or a point of a case where they differ that is a real witness
    /// (refuted) ([`split`]).
    CaseSplit,
    /// The SMT solver: unsat (proved) or a model that is a real witness (refuted).
    Z3,
    /// Nothing decided the goal.
    Unknown,
}

impl Layer {
    /// The layer's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Layer::NormalForm => "normal-form",
            Layer::RandomWitness => "random-witness",
            Layer::ProductExpansion => "product-expansion",
            Layer::CaseSplit => "case-split",
            Layer::Z3 => "z3",
            Layer::Unknown => "unknown",
        }
    }
}

/// Values of (some of) the symbols where two expressions differ, by symbol number; symbols
/// not listed may take any value.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Point {
    /// (symbol number, value).
    pub values: Vec<(u32, BigRational)>,
}

/// What is known of one goal.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The two sides are equal for every input.
    Proved(Layer),
    /// The two sides differ at `point` (a real difference, checked by evaluation).
    Refuted {
        /// The layer that found it.
        layer: Layer,
        /// Where they differ.
        point: Point,
    },
    /// Undecided, and why.
    Unknown(String),
}

/// Settings of the decision procedure.
#[derive(Clone, Debug)]
pub struct DecideConfig {
    /// Seed of the random points (results are deterministic for a seed).
    pub seed: u64,
    /// Modular points tried.
    pub modular_points: usize,
    /// Real points tried for a witness.
    pub real_points: usize,
    /// Z3's time limit per goal; `None` skips Z3.
    pub z3_timeout: Option<Duration>,
    /// Goals whose two sides hold more polynomial terms than this (through every function
    /// argument) skip Z3: non-linear real arithmetic of that size does not finish in time.
    pub z3_max_terms: usize,
    /// Terms the difference of a goal's sides may reach while its `product` atoms are
    /// expanded ([`crate::expand`]); past it the goal goes on to Z3.
    pub expand_max_terms: usize,
    /// When to stop: the random points and Z3 (its own timeout cut to what is left) end
    /// with [`Outcome::Unknown`] once it has passed.
    pub deadline: Option<Instant>,
}

impl Default for DecideConfig {
    fn default() -> Self {
        DecideConfig {
            seed: 0x5eed,
            modular_points: 3,
            real_points: 12,
            z3_timeout: Some(Duration::from_secs(10)),
            z3_max_terms: 400,
            expand_max_terms: 200_000,
            deadline: None,
        }
    }
}

/// A deterministic generator (splitmix64).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        crate::eval::mix(self.0)
    }

    /// A small rational of the symbol's kind: bools 0/1, ints in [-4, 4], reals k/8 in
    /// [-2, 2] (exact in f64, non-zero more often than not).
    pub(crate) fn value(&mut self, kind: SymbolKind) -> Coeff {
        let r = self.next();
        match kind {
            SymbolKind::Bool => Coeff::from_integer((r & 1) as i64),
            SymbolKind::Int => Coeff::from_integer((r % 9) as i64 - 4),
            SymbolKind::Index(bound) => Coeff::from_integer((r % bound.max(1) as u64) as i64),
            SymbolKind::Real => Coeff::new((r % 33) as i64 - 16, 8),
        }
    }
}

/// The modular points of one arena, shared by every goal decided in it (kept with the arena,
/// [`Arena::modular_points`]): the goals of a stage read the same activations and gradients,
/// which a point per goal evaluated afresh every time. A residue is the same at every point
/// for every goal reading it, so sharing the points changes no goal's chance of being told
/// apart (each goal's sides are fixed before the points are drawn), and the points are a
/// function of the seed and the symbols alone, so verdicts do not depend on the order in
/// which goals are decided.
#[derive(Default)]
pub(crate) struct ModularPoints {
    /// (seed, number of points, number of symbols) the points were drawn for.
    key: (u64, usize, usize),
    /// Per point: the symbols' residues, the functions' seed, and what has been evaluated.
    points: Vec<(Vec<u64>, u64, Option<ModMemo>)>,
}

impl ModularPoints {
    /// The points for `cfg` over `symbols`, drawn afresh (their memos empty) unless drawn for
    /// the same seed, count and symbols already.
    fn keep_for(&mut self, cfg: &DecideConfig, symbols: &[(String, SymbolKind)]) {
        let key = (cfg.seed, cfg.modular_points, symbols.len());
        if self.key == key && self.points.len() == cfg.modular_points {
            return;
        }
        let mut rng = Rng::new(cfg.seed ^ 0x6d6f_6475_6c61_7220);
        self.key = key;
        self.points = (0..cfg.modular_points)
            .map(|_| {
                let residues = symbols
                    .iter()
                    .map(|(_, kind)| match kind {
                        SymbolKind::Bool => rng.next() & 1,
                        SymbolKind::Index(bound) => rng.next() % (*bound).max(1) as u64,
                        _ => rng.next() % PRIME,
                    })
                    .collect();
                (residues, rng.next(), Some(ModMemo::default()))
            })
            .collect();
    }
}

/// Whether `a` and `b` differ at one of the arena's modular points, and how many points were
/// evaluated to see it; `None` where the deadline passed first.
fn modular_points_differ(
    arena: &Arena,
    a: ExprId,
    b: ExprId,
    cfg: &DecideConfig,
) -> Option<(bool, usize)> {
    let mut shared = arena.modular_points();
    shared.keep_for(cfg, arena.symbols());
    for (k, (residues, seed, memo)) in shared.points.iter_mut().enumerate() {
        if cfg.deadline.is_some_and(|d| Instant::now() > d) {
            return None;
        }
        // Taken out while it is in use: a panic in between leaves the point without a memo
        // (it starts afresh), never with a half-written one.
        let mut ev = ModEval::resume(
            arena,
            residues.clone(),
            *seed,
            memo.take().unwrap_or_default(),
        );
        let differ = ev.eval(a) != ev.eval(b);
        *memo = Some(ev.into_memo());
        if differ {
            return Some((true, k + 1));
        }
    }
    Some((false, shared.points.len()))
}

/// Why a goal is unknown when [`DecideConfig::deadline`] passed while deciding it.
pub const TIME_RAN_OUT: &str = "the time limit ran out while deciding this goal";

/// Decides `a == b` over the reals (every symbol ranging over its kind).
pub fn decide(arena: &Arena, a: ExprId, b: ExprId, cfg: &DecideConfig) -> Outcome {
    if a == b {
        return Outcome::Proved(Layer::NormalForm);
    }
    let symbols = arena.symbols();
    let mut rng = Rng::new(cfg.seed ^ (a.0 as u64) << 32 ^ b.0 as u64);
    let out_of_time = || cfg.deadline.is_some_and(|d| Instant::now() > d);
    let time_ran_out = || Outcome::Unknown(TIME_RAN_OUT.into());
    // Modular screening: distinct normal forms differ at a random residue unless they are
    // equal through identities of the functions, which only the layers below can see.
    let modular_difference = match modular_points_differ(arena, a, b, cfg) {
        Some((differ, evaluated)) => {
            // The real points are drawn as when each goal drew its own modular points from
            // this generator first (one value per symbol and a seed per point): a witness
            // found then is found again, and where it is confirmed by the interpreter (an
            // index in range on every rank) stays so.
            for _ in 0..evaluated * (symbols.len() + 1) {
                rng.next();
            }
            differ
        }
        None => return time_ran_out(),
    };
    // The product expansion's answer, where it came before the last real points.
    let mut expanded = None;
    let mut split_tried = false;
    if modular_difference {
        // Residues tell apart sides equal only once their softmax weights leave the products
        // (the modular evaluation hashes exponentials, so `exp(a)·exp(b)` and `exp(a + b)`
        // differ there): the rewriting, kept with the arena across goals, is far cheaper than
        // twelve exact evaluations of both closures (ring attention's backward: 8 s a goal).
        if crate::expand::equal_with_weights_outside(
            arena,
            a,
            b,
            cfg.expand_max_terms,
            cfg.deadline,
        ) == Ok(true)
        {
            return Outcome::Proved(Layer::ProductExpansion);
        }
        for k in 0..cfg.real_points {
            if out_of_time() {
                return time_ran_out();
            }
            let values: Vec<Coeff> = symbols.iter().map(|(_, k)| rng.value(*k)).collect();
            if let Some(point) = witness_at(arena, a, b, &values) {
                return Outcome::Refuted {
                    layer: Layer::RandomWitness,
                    point,
                };
            }
            // One point shows most differences. Past it, the expansion comes before the other
            // points: a split table's goal is proved by it, and each point evaluates both whole
            // closures in floats (40% of deepseek tp=2 full's time when all twelve came first).
            // The points keep their order, so every witness the twelve found is found again.
            if k == 0 {
                let result = expand(arena, a, b, cfg);
                if result == Ok(true) {
                    return Outcome::Proved(Layer::ProductExpansion);
                }
                expanded = Some(result);
                // A masked lookup at a shifted token (a vocab-parallel embedding) is one: no
                // point shows a difference, and the table is past Z3.
                if let Some(outcome) = by_cases(arena, a, b, cfg) {
                    return outcome;
                }
                split_tried = true;
            }
        }
    }
    // No point tells the sides apart: they may differ only in how products group their
    // factors or how linear atoms split their tables, which an expansion of their difference
    // shows. (Residues alone do not settle it: `lookup`s at a non-symbol index, and the
    // atoms over them, are hashed, so a split table's residues differ from the whole one's.)
    let expanded = expanded.unwrap_or_else(|| expand(arena, a, b, cfg));
    if expanded == Ok(true) {
        return Outcome::Proved(Layer::ProductExpansion);
    }
    if !split_tried {
        if let Some(outcome) = by_cases(arena, a, b, cfg) {
            return outcome;
        }
    }
    let Some(timeout) = cfg.z3_timeout else {
        return Outcome::Unknown("the sides differ in normal form and Z3 is off".into());
    };
    let size = arena.reachable_terms(&[a, b]);
    if size > cfg.z3_max_terms {
        return Outcome::Unknown(format!(
            "the sides differ in normal form, no random point separates them, and at {size} terms the goal is too large for Z3 (limit {})",
            cfg.z3_max_terms
        ));
    }
    let timeout = match cfg.deadline {
        Some(d) => match d.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => timeout.min(left),
            _ => return time_ran_out(),
        },
        None => timeout,
    };
    match smt::prove_equal(arena, a, b, timeout) {
        smt::SmtResult::Equal => Outcome::Proved(Layer::Z3),
        smt::SmtResult::Model(values) => {
            // Z3's model is a witness only where it is a real difference: functions Z3 left
            // uninterpreted may have values no real function takes.
            let mut full: Vec<Coeff> = symbols.iter().map(|_| Coeff::zero()).collect();
            for (s, v) in &values {
                full[*s as usize] = v.clone();
            }
            match witness_at(arena, a, b, &full) {
                Some(point) => Outcome::Refuted {
                    layer: Layer::Z3,
                    point,
                },
                None => Outcome::Unknown(
                    "Z3 found a model only through its uninterpreted functions; no real witness"
                        .into(),
                ),
            }
        }
        smt::SmtResult::Unknown(why) => Outcome::Unknown(format!("Z3: {why}")),
    }
}

/// The goal decided by cases on an index symbol ([`split`]): proved where the forms agree on
/// every case; refuted where a case whose forms differ holds a real witness (its ends and
/// middle tried, the other symbols drawn from a generator of its own, so that the real
/// points after it are drawn as before); `None` otherwise.
fn by_cases(arena: &Arena, a: ExprId, b: ExprId, cfg: &DecideConfig) -> Option<Outcome> {
    match split::decide_by_cases(arena, a, b, cfg.deadline) {
        split::Split::Equal => Some(Outcome::Proved(Layer::CaseSplit)),
        split::Split::Differs { symbol, cases } => {
            let symbols = arena.symbols();
            let mut rng = Rng::new(cfg.seed ^ 0x0073_706c_6974 ^ (a.0 as u64) << 32 ^ b.0 as u64);
            let values = cases
                .iter()
                .flat_map(|&(lo, hi)| [lo, hi - 1, lo + (hi - lo) / 2]);
            for t in values {
                let mut values: Vec<Coeff> = symbols.iter().map(|(_, k)| rng.value(*k)).collect();
                values[symbol as usize] = Coeff::from_integer(t as i64);
                if let Some(point) = witness_at(arena, a, b, &values) {
                    return Some(Outcome::Refuted {
                        layer: Layer::CaseSplit,
                        point,
                    });
                }
            }
            None
        }
        split::Split::Unknown(_) => None,
    }
}

/// [`crate::expand::equal_after_expanding_products`] under `cfg`'s limits.
fn expand(arena: &Arena, a: ExprId, b: ExprId, cfg: &DecideConfig) -> Result<bool, String> {
    crate::expand::equal_after_expanding_products(arena, a, b, cfg.expand_max_terms, cfg.deadline)
}

/// The point `values` when `a` and `b` really differ there: exactly, or clearly in f64.
fn witness_at(arena: &Arena, a: ExprId, b: ExprId, values: &[Coeff]) -> Option<Point> {
    let mut exact = ExactEval::new(arena, values.to_vec());
    let differ = match (exact.value(a), exact.value(b)) {
        (Some(x), Some(y)) => x != y,
        _ => {
            let mut ev = FloatEval::at_exact_point(arena, values);
            clearly_differ(ev.eval(a), ev.eval(b))
        }
    };
    differ.then(|| Point {
        values: values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u32, v.to_big()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::Func;
    use num_traits::Zero;

    fn cfg() -> DecideConfig {
        DecideConfig::default()
    }

    #[test]
    fn layers_decide_what_they_can() {
        let mut ar = Arena::default();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let xy = ar.add(x, y).unwrap();
        let yx = ar.add(y, x).unwrap();
        assert_eq!(
            decide(&ar, xy, yx, &cfg()),
            Outcome::Proved(Layer::NormalForm)
        );
        // x + y vs x: a random point shows it.
        match decide(&ar, xy, x, &cfg()) {
            Outcome::Refuted { layer, point } => {
                assert_eq!(layer, Layer::RandomWitness);
                assert!(point.values.iter().any(|(s, v)| *s == 1 && !v.is_zero()));
            }
            other => panic!("{other:?}"),
        }
        // max(x, y) + min(x, y) == x + y only through the meaning of max and min: Z3 proves it.
        let mx = ar.max(x, y).unwrap();
        let mn = ar.min(x, y).unwrap();
        let lhs = ar.add(mx, mn).unwrap();
        assert_eq!(decide(&ar, lhs, xy, &cfg()), Outcome::Proved(Layer::Z3));
        // relu(x) - relu(-x) == x, likewise.
        let zero = ar.int(0).unwrap();
        let r = ar.max(x, zero).unwrap();
        let nx = ar.neg(x).unwrap();
        let rn = ar.max(nx, zero).unwrap();
        let d = ar.sub(r, rn).unwrap();
        assert_eq!(decide(&ar, d, x, &cfg()), Outcome::Proved(Layer::Z3));
    }

    #[test]
    fn a_passed_deadline_leaves_goals_unknown_never_decided() {
        let mut ar = Arena::default();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let mx = ar.max(x, y).unwrap();
        let past = DecideConfig {
            deadline: Some(Instant::now()),
            ..cfg()
        };
        std::thread::sleep(Duration::from_millis(2));
        // Distinct normal forms need the random points or Z3, which the deadline cuts off.
        assert_eq!(
            decide(&ar, mx, x, &past),
            Outcome::Unknown(TIME_RAN_OUT.into())
        );
        // Equal normal forms cost nothing and are still proved.
        assert_eq!(
            decide(&ar, mx, mx, &past),
            Outcome::Proved(Layer::NormalForm)
        );
    }

    #[test]
    fn the_modular_points_follow_the_arenas_symbols() {
        let mut ar = Arena::default();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let one = ar.int(1).unwrap();
        let x1 = ar.add(x, one).unwrap();
        assert!(matches!(
            decide(&ar, x1, x, &cfg()),
            Outcome::Refuted { .. }
        ));
        // A symbol made after the points were drawn needs a residue too.
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let xy = ar.add(x, y).unwrap();
        match decide(&ar, xy, x, &cfg()) {
            Outcome::Refuted { point, .. } => {
                assert!(point.values.iter().any(|(s, v)| *s == 1 && !v.is_zero()));
            }
            other => panic!("{other:?}"),
        }
        // Another seed draws other points, and still decides alike.
        let other = DecideConfig { seed: 7, ..cfg() };
        assert!(matches!(
            decide(&ar, xy, x, &other),
            Outcome::Refuted { .. }
        ));
        let yx = ar.add(y, x).unwrap();
        assert_eq!(
            decide(&ar, xy, yx, &other),
            Outcome::Proved(Layer::NormalForm)
        );
    }

    #[test]
    fn function_identities_are_never_refuted() {
        let mut ar = Arena::default();
        let x = ar.symbol("x", SymbolKind::Real).unwrap();
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let s = ar.add(x, y).unwrap();
        let lhs = ar.app(crate::expr::Func::Exp, vec![s]).unwrap();
        let ex = ar.app(crate::expr::Func::Exp, vec![x]).unwrap();
        let ey = ar.app(crate::expr::Func::Exp, vec![y]).unwrap();
        let rhs = ar.mul(ex, ey).unwrap();
        // exp(x + y) == exp(x) exp(y) is a rule of the normal form (x, y finite).
        assert_eq!(
            decide(&ar, lhs, rhs, &cfg()),
            Outcome::Proved(Layer::NormalForm)
        );
        // sin(x)^2 + cos(x)^2 == 1 is not: no real witness, and Z3 without the functions'
        // axioms cannot prove it, so it stays unknown, never refuted.
        let sin = ar
            .app(crate::expr::Func::Named("sin".into()), vec![x])
            .unwrap();
        let cos = ar
            .app(crate::expr::Func::Named("cos".into()), vec![x])
            .unwrap();
        let (s2, c2) = (ar.mul(sin, sin).unwrap(), ar.mul(cos, cos).unwrap());
        let lhs = ar.add(s2, c2).unwrap();
        let one = ar.int(1).unwrap();
        assert!(matches!(decide(&ar, lhs, one, &cfg()), Outcome::Unknown(_)));
    }

    /// Split tables gathered at a top-k position: the residues tell the sides apart (the
    /// lookup is hashed), so the expansion comes after the first real point. It proves the
    /// all-reduced partial tables, and a planted wrong entry is still refuted by a point.
    #[test]
    fn split_tables_at_a_position_are_proved_by_expansion_and_a_wrong_entry_is_refuted() {
        let mut ar = Arena::default();
        let xs: Vec<ExprId> = (0..2)
            .map(|i| ar.symbol(&format!("x{i}"), SymbolKind::Real).unwrap())
            .collect();
        let idx = ar.app(Func::ArgMax, xs.clone()).unwrap();
        let table = |ar: &mut Arena, name: &str| -> Vec<ExprId> {
            (0..2)
                .map(|j| ar.symbol(&format!("{name}{j}"), SymbolKind::Real).unwrap())
                .collect()
        };
        let (a, b) = (table(&mut ar, "a"), table(&mut ar, "b"));
        let sums: Vec<ExprId> = (0..2).map(|j| ar.add(a[j], b[j]).unwrap()).collect();
        let whole = ar.app(Func::Lookup, vec![idx, sums[0], sums[1]]).unwrap();
        let la = ar.app(Func::Lookup, vec![idx, a[0], a[1]]).unwrap();
        let lb = ar.app(Func::Lookup, vec![idx, b[0], b[1]]).unwrap();
        let parts = ar.add(la, lb).unwrap();
        assert_ne!(whole, parts);
        let cfg = DecideConfig {
            z3_timeout: None,
            ..cfg()
        };
        assert_eq!(
            modular_points_differ(&ar, whole, parts, &cfg).map(|(d, _)| d),
            Some(true),
            "the residues differ: the expansion runs between the real points"
        );
        assert_eq!(
            decide(&ar, whole, parts, &cfg),
            Outcome::Proved(Layer::ProductExpansion)
        );
        let wrong = ar.app(Func::Lookup, vec![idx, sums[0], a[1]]).unwrap();
        assert!(matches!(
            decide(&ar, wrong, parts, &cfg),
            Outcome::Refuted {
                layer: Layer::RandomWitness,
                ..
            }
        ));
        // A difference too small for any point to show (10^-12·exp(x0), past f64's clear
        // margin and without an exact value): the expansion's "not zero" proves nothing, and
        // with Z3 off the goal stays unknown.
        let e = ar.app(Func::Exp, vec![xs[0]]).unwrap();
        let tiny = ar.scale(e, &Coeff::new(1, 1_000_000_000_000)).unwrap();
        let nearly = ar.add(parts, tiny).unwrap();
        assert!(matches!(
            decide(&ar, whole, nearly, &cfg),
            Outcome::Unknown(_)
        ));
    }
}
