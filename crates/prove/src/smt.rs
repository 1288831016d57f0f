//! The Z3 layer: `a != b` over the reals, with max, min, comparisons, `where` and division
//! encoded exactly and the transcendental functions uninterpreted (with true axioms, such as
//! exp(x) > 0 and sqrt(x)^2 = x for x >= 0). Unsat is a proof for every interpretation of
//! the uninterpreted functions, so in particular for the real ones.

mod ffi;

use crate::expr::{Arena, Atom, AtomId, Coeff, ExprId, Func, SymbolKind};
use ffi::{Answer, Ast, Z3};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// What Z3 says of `a != b`.
#[derive(Clone, Debug, PartialEq)]
pub enum SmtResult {
    /// Unsat: equal for all inputs.
    Equal,
    /// Sat, with the symbols' values in the model (by symbol number).
    Model(Vec<(u32, Coeff)>),
    /// Unknown (time limit, non-linear arithmetic, a value that is not a rational).
    Unknown(String),
}

struct Encoder<'a> {
    z3: &'a Z3,
    arena: &'a Arena,
    exprs: HashMap<ExprId, Ast>,
    atoms: HashMap<AtomId, Ast>,
    symbols: BTreeMap<u32, Ast>,
    side: Vec<Ast>,
    /// Whether a non-finite constant was encoded: Z3's reals have no inf or NaN (`0·inf = 0`
    /// there, `NaN` is IEEE's), so an "equal" answer then proves nothing.
    nonfinite: bool,
}

impl Encoder<'_> {
    fn rat(&self, r: &Coeff) -> Ast {
        match r.as_small() {
            Some((n, d)) => self.z3.numeral(&format!("{n}/{d}")),
            None => {
                let r = r.to_big();
                self.z3.numeral(&format!("{}/{}", r.numer(), r.denom()))
            }
        }
    }

    fn expr(&mut self, e: ExprId) -> Ast {
        if let Some(&r) = self.exprs.get(&e) {
            return r;
        }
        let mut terms = Vec::new();
        for (m, c) in &self.arena.poly(e).terms {
            let mut factors = vec![self.rat(c)];
            for &(a, k) in m {
                let v = self.atom(a);
                factors.extend(std::iter::repeat_n(v, k as usize));
            }
            terms.push(if factors.len() == 1 {
                factors[0]
            } else {
                self.z3.mul(&factors)
            });
        }
        let out = match terms.len() {
            0 => self.z3.numeral("0"),
            1 => terms[0],
            _ => self.z3.add(&terms),
        };
        self.exprs.insert(e, out);
        out
    }

    fn atom(&mut self, a: AtomId) -> Ast {
        if let Some(&r) = self.atoms.get(&a) {
            return r;
        }
        let z3 = self.z3;
        let zero = z3.numeral("0");
        let one = z3.numeral("1");
        let out = match self.arena.atom(a).clone() {
            Atom::Symbol(s) => {
                let (name, kind) = &self.arena.symbols()[s as usize];
                let v = match kind {
                    SymbolKind::Int | SymbolKind::Index(_) => z3.int_const_as_real(name),
                    _ => z3.real_const(name),
                };
                if *kind == SymbolKind::Bool {
                    let is01 = z3.or(&[z3.eq(v, zero), z3.eq(v, one)]);
                    self.side.push(is01);
                }
                if let SymbolKind::Index(bound) = kind {
                    let range = z3.and(&[z3.ge(v, zero), z3.lt(v, z3.numeral(&bound.to_string()))]);
                    self.side.push(range);
                }
                self.symbols.insert(s, v);
                v
            }
            Atom::NonFinite(k) => {
                self.nonfinite = true;
                z3.real_const(&format!("nonfinite_{k}"))
            }
            Atom::App(f, args) => {
                let xs: Vec<Ast> = args.iter().map(|&x| self.expr(x)).collect();
                match f {
                    Func::Recip => z3.div(one, xs[0]),
                    Func::Product => z3.mul(&xs),
                    Func::Max | Func::Min => {
                        let mut acc = xs[0];
                        for &x in &xs[1..] {
                            let pick_x = if f == Func::Max {
                                z3.gt(x, acc)
                            } else {
                                z3.lt(x, acc)
                            };
                            acc = z3.ite(pick_x, x, acc);
                        }
                        acc
                    }
                    Func::ArgMax | Func::ArgMin => {
                        // The first extreme: a later argument wins only when strictly better.
                        let (mut best, mut at) = (xs[0], zero);
                        for (k, &x) in xs.iter().enumerate().skip(1) {
                            let better = if f == Func::ArgMax {
                                z3.gt(x, best)
                            } else {
                                z3.lt(x, best)
                            };
                            best = z3.ite(better, x, best);
                            at = z3.ite(better, z3.numeral(&k.to_string()), at);
                        }
                        at
                    }
                    Func::SortedValue { rank, largest } | Func::SortedIndex { rank, largest } => {
                        // Position i is the rank-th of a stable sort when exactly `rank`
                        // arguments precede it: strictly better ones, and equal ones before it.
                        let n = xs.len();
                        let mut acc = if matches!(f, Func::SortedValue { .. }) {
                            xs[n - 1]
                        } else {
                            z3.numeral(&(n - 1).to_string())
                        };
                        for i in (0..n.saturating_sub(1)).rev() {
                            let before: Vec<Ast> = (0..n)
                                .filter(|&l| l != i)
                                .map(|l| {
                                    let better = if largest {
                                        z3.gt(xs[l], xs[i])
                                    } else {
                                        z3.lt(xs[l], xs[i])
                                    };
                                    let ahead = if l < i {
                                        z3.or(&[better, z3.eq(xs[l], xs[i])])
                                    } else {
                                        better
                                    };
                                    z3.ite(ahead, one, zero)
                                })
                                .collect();
                            let count = if before.is_empty() {
                                zero
                            } else {
                                z3.add(&before)
                            };
                            let hit = z3.eq(count, z3.numeral(&rank.to_string()));
                            let here = if matches!(f, Func::SortedValue { .. }) {
                                xs[i]
                            } else {
                                z3.numeral(&i.to_string())
                            };
                            acc = z3.ite(hit, here, acc);
                        }
                        acc
                    }
                    Func::Positive => z3.ite(z3.gt(xs[0], zero), one, zero),
                    Func::NonNegative => z3.ite(z3.ge(xs[0], zero), one, zero),
                    Func::IsZero => z3.ite(z3.eq(xs[0], zero), one, zero),
                    Func::Where => z3.ite(z3.eq(xs[0], zero), xs[2], xs[1]),
                    Func::Lookup => {
                        // An index outside the table has no value: an unconstrained one.
                        let mut acc = z3.real_const(&format!("lookup_outside_{}", a.0));
                        for (k, &t) in xs[1..].iter().enumerate().rev() {
                            let hit = z3.eq(xs[0], z3.numeral(&k.to_string()));
                            acc = z3.ite(hit, t, acc);
                        }
                        acc
                    }
                    Func::Sqrt => {
                        let r = z3.apply_uninterpreted("sqrt", &xs);
                        let square = z3.eq(z3.mul(&[r, r]), xs[0]);
                        let root = z3.and(&[z3.ge(r, zero), square]);
                        self.side.push(z3.implies(z3.ge(xs[0], zero), root));
                        r
                    }
                    Func::Exp => {
                        let r = z3.apply_uninterpreted("exp", &xs);
                        self.side.push(z3.gt(r, zero));
                        r
                    }
                    other => {
                        let name = format!("f_{}_{}", other.name(), xs.len());
                        z3.apply_uninterpreted(&name, &xs)
                    }
                }
            }
        };
        self.atoms.insert(a, out);
        out
    }
}

/// How long past its own time limit a Z3 check is waited for before the goal is left unknown
/// ([`ffi::Z3::check_apart`]).
const Z3_GRACE: Duration = Duration::from_secs(2);

/// Asks Z3 whether `a != b` is satisfiable within `timeout`.
pub fn prove_equal(arena: &Arena, a: ExprId, b: ExprId, timeout: Duration) -> SmtResult {
    let z3 = Z3::new(timeout.as_millis().min(u32::MAX as u128) as u32);
    let mut enc = Encoder {
        z3: &z3,
        arena,
        exprs: HashMap::new(),
        atoms: HashMap::new(),
        symbols: BTreeMap::new(),
        side: Vec::new(),
        nonfinite: false,
    };
    let (x, y) = (enc.expr(a), enc.expr(b));
    for &s in &enc.side {
        z3.assert(s);
    }
    z3.assert(z3.not(z3.eq(x, y)));
    if z3.error() != 0 {
        return SmtResult::Unknown(format!("Z3 rejected the encoding (error {})", z3.error()));
    }
    let (numbers, asts): (Vec<u32>, Vec<Ast>) = enc.symbols.iter().map(|(s, a)| (*s, *a)).unzip();
    let nonfinite = enc.nonfinite;
    drop(enc);
    let Some(checked) = z3.check_apart(Z3_GRACE, asts) else {
        return SmtResult::Unknown(format!(
            "Z3 ran past its time limit and {} s more",
            Z3_GRACE.as_secs()
        ));
    };
    match checked.answer {
        // Over the reals a non-finite constant is a number: `[c]·inf` is 0 where `c` is
        // false, IEEE's NaN; equal there is no proof.
        Answer::Unsat if nonfinite => SmtResult::Unknown(
            "Z3 found the sides equal over the reals, which a non-finite constant is not in".into(),
        ),
        Answer::Unsat => SmtResult::Equal,
        Answer::Unknown => SmtResult::Unknown(checked.reason),
        Answer::Sat => {
            let mut values = Vec::new();
            for (s, v) in numbers.into_iter().zip(checked.values) {
                match v.and_then(|t| {
                    t.parse::<num_rational::BigRational>()
                        .ok()
                        .map(Coeff::from_big)
                }) {
                    Some(r) => values.push((s, r)),
                    None => {
                        return SmtResult::Unknown(format!(
                            "the model's value of `{}` is not a rational",
                            arena.symbol_name(s)
                        ))
                    }
                }
            }
            SmtResult::Model(values)
        }
    }
}
