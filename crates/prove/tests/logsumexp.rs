//! The log-sum-exp rules of the normal form against IEEE evaluation: random softmax,
//! logsumexp and ring-attention merges over lanes with `-inf` (masked) entries are built
//! symbolically and evaluated in f64 as the interpreter computes them, side by side. A
//! normal form must evaluate as its construction does (NaN where the construction gives NaN,
//! the same infinity), and the merge of two blocks must meet the whole lane's softmax in one
//! normal form exactly where each block has an unmasked entry.

use proptest::prelude::*;
use shardproof_prove::decide::{decide, DecideConfig, Outcome};
use shardproof_prove::eval::FloatEval;
use shardproof_prove::expr::{Arena, ExprId, Func, SymbolKind};

const SYMBOLS: usize = 4;

/// A finite scalar: symbols, small constants, sums, products, max, exp.
#[derive(Clone, Debug)]
enum Fin {
    Sym(usize),
    Const(i64),
    Add(Box<Fin>, Box<Fin>),
    Mul(Box<Fin>, Box<Fin>),
    Max(Box<Fin>, Box<Fin>),
    Exp(Box<Fin>),
}

/// A lane entry (its score `y_i · tanh(f)` for the entry's own symbol `y_i`, as attention
/// scores are: never a constant, no term shared between entries, so a lane's max is an atom
/// or one of its scores): a score, a masked score (`x + (-inf)`, as the spec adds a `triu` of
/// `-inf`), or `-inf` itself (as a rank's `masked_fill`).
#[derive(Clone, Debug)]
enum Entry {
    Score(Fin),
    Masked(Fin),
    NegInf,
}

fn fin() -> impl Strategy<Value = Fin> {
    let leaf = prop_oneof![
        (0..SYMBOLS).prop_map(Fin::Sym),
        (-2i64..3).prop_map(Fin::Const)
    ];
    leaf.prop_recursive(3, 8, 2, |inner| {
        let b = || inner.clone().prop_map(Box::new);
        prop_oneof![
            (b(), b()).prop_map(|(x, y)| Fin::Add(x, y)),
            (b(), b()).prop_map(|(x, y)| Fin::Mul(x, y)),
            (b(), b()).prop_map(|(x, y)| Fin::Max(x, y)),
            b().prop_map(Fin::Exp),
        ]
    })
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        3 => fin().prop_map(Entry::Score),
        1 => fin().prop_map(Entry::Masked),
        1 => Just(Entry::NegInf),
    ]
}

/// An expression and its IEEE value at the point, built side by side.
#[derive(Clone, Copy, Debug)]
struct V {
    e: ExprId,
    v: f64,
}

/// torch's maximum: NaN propagates.
fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

struct B<'a> {
    a: &'a mut Arena,
    xs: &'a [f64],
}

impl B<'_> {
    fn sym(&mut self, i: usize) -> V {
        let e = self.a.symbol(&format!("x{i}"), SymbolKind::Real).unwrap();
        V { e, v: self.xs[i] }
    }
    fn float(&mut self, x: f64) -> V {
        V {
            e: self.a.float(x).unwrap(),
            v: x,
        }
    }
    fn add(&mut self, x: V, y: V) -> V {
        V {
            e: self.a.add(x.e, y.e).unwrap(),
            v: x.v + y.v,
        }
    }
    fn sub(&mut self, x: V, y: V) -> V {
        V {
            e: self.a.sub(x.e, y.e).unwrap(),
            v: x.v - y.v,
        }
    }
    fn mul(&mut self, x: V, y: V) -> V {
        V {
            e: self.a.mul(x.e, y.e).unwrap(),
            v: x.v * y.v,
        }
    }
    fn div(&mut self, x: V, y: V) -> V {
        V {
            e: self.a.div(x.e, y.e).unwrap(),
            v: x.v / y.v,
        }
    }
    fn max(&mut self, xs: &[V]) -> V {
        let e = self
            .a
            .app(Func::Max, xs.iter().map(|x| x.e).collect())
            .unwrap();
        let v = xs.iter().map(|x| x.v).fold(f64::NEG_INFINITY, fmax);
        V { e, v }
    }
    fn exp(&mut self, x: V) -> V {
        V {
            e: self.a.app(Func::Exp, vec![x.e]).unwrap(),
            v: x.v.exp(),
        }
    }
    fn log(&mut self, x: V) -> V {
        V {
            e: self.a.app(Func::Log, vec![x.e]).unwrap(),
            v: x.v.ln(),
        }
    }
    fn sum(&mut self, xs: &[V]) -> V {
        let e = self
            .a
            .sum(&xs.iter().map(|x| x.e).collect::<Vec<_>>())
            .unwrap();
        V {
            e,
            v: xs.iter().map(|x| x.v).sum(),
        }
    }

    fn fin(&mut self, f: &Fin) -> V {
        match f {
            Fin::Sym(i) => self.sym(*i),
            Fin::Const(k) => self.float(*k as f64),
            Fin::Add(x, y) => {
                let (x, y) = (self.fin(x), self.fin(y));
                self.add(x, y)
            }
            Fin::Mul(x, y) => {
                let (x, y) = (self.fin(x), self.fin(y));
                self.mul(x, y)
            }
            Fin::Max(x, y) => {
                let (x, y) = (self.fin(x), self.fin(y));
                self.max(&[x, y])
            }
            Fin::Exp(x) => {
                let x = self.fin(x);
                self.exp(x)
            }
        }
    }

    fn score(&mut self, pos: usize, f: &Fin) -> V {
        let e = self.a.symbol(&format!("y{pos}"), SymbolKind::Real).unwrap();
        let y = V {
            e,
            v: self.xs[SYMBOLS + pos],
        };
        // tanh keeps scores in (-2, 2): exp of a large score overflows f64 in one order of
        // evaluation and not in another, and rounding is outside the semantics.
        let f = self.fin(f);
        let t = V {
            e: self.a.app(Func::Tanh, vec![f.e]).unwrap(),
            v: f.v.tanh(),
        };
        self.mul(y, t)
    }

    fn entry(&mut self, pos: usize, t: &Entry) -> V {
        match t {
            Entry::Score(f) => self.score(pos, f),
            Entry::Masked(f) => {
                let x = self.score(pos, f);
                let m = self.float(f64::NEG_INFINITY);
                self.add(x, m)
            }
            Entry::NegInf => self.float(f64::NEG_INFINITY),
        }
    }

    /// The lane's max m and `exp(x - m)` of each entry.
    fn shifted_exps(&mut self, lane: &[V]) -> (V, Vec<V>) {
        let m = self.max(lane);
        let exps = lane
            .iter()
            .map(|&x| {
                let d = self.sub(x, m);
                self.exp(d)
            })
            .collect();
        (m, exps)
    }

    /// softmax over the lane, shifted by its max (the spec's `_softmax`).
    fn softmax(&mut self, lane: &[V]) -> Vec<V> {
        let (_, exps) = self.shifted_exps(lane);
        let s = self.sum(&exps);
        exps.iter().map(|&e| self.div(e, s)).collect()
    }

    /// logsumexp over the lane (the ranks' `logsumexp`: max + log(sum exp(x - max))).
    fn logsumexp(&mut self, lane: &[V]) -> V {
        let (m, exps) = self.shifted_exps(lane);
        let s = self.sum(&exps);
        let l = self.log(s);
        self.add(m, l)
    }

    /// Ring attention over two blocks of the lane: each block's weights exp(x - lse_b)
    /// and lse_b, merged by the running max as the zoo's ranks do; the weight of every entry.
    fn ring(&mut self, a: &[V], b: &[V]) -> Vec<V> {
        let (la, lb) = (self.logsumexp(a), self.logsumexp(b));
        let m = self.max(&[la, lb]);
        let (da, db) = (self.sub(la, m), self.sub(lb, m));
        let (ea, eb) = (self.exp(da), self.exp(db));
        let tot = self.sum(&[ea, eb]);
        let (wa, wb) = (self.div(ea, tot), self.div(eb, tot));
        let mut out = Vec::new();
        for (block, lse, w) in [(a, la, wa), (b, lb, wb)] {
            for &x in block {
                let d = self.sub(x, lse);
                let p = self.exp(d);
                out.push(self.mul(p, w));
            }
        }
        out
    }
}

fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan())
        || a == b
        || (a.is_finite() && b.is_finite() && (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs())))
}

fn point() -> impl Strategy<Value = Vec<f64>> {
    // x0..x3, then y0..y5 (one per lane position).
    proptest::collection::vec((-8i64..9).prop_map(|k| k as f64 / 4.0), SYMBOLS + 6)
}

fn unmasked(lane: &[Entry]) -> bool {
    lane.iter().any(|e| matches!(e, Entry::Score(_)))
}

/// Every normal form evaluates (FloatEval) as its construction does in IEEE f64.
fn check_values(a: &Arena, xs: &[f64], vs: &[V]) -> Result<(), TestCaseError> {
    let sym: Vec<f64> = a
        .symbols()
        .iter()
        .map(|(n, _)| {
            let i = n[1..].parse::<usize>().unwrap();
            if n.starts_with('y') {
                xs[SYMBOLS + i]
            } else {
                xs[i]
            }
        })
        .collect();
    let mut ev = FloatEval::new(a, sym);
    for v in vs {
        let got = ev.eval(v.e);
        prop_assert!(
            close(got, v.v),
            "normal form {} evaluates to {got}, its construction to {}",
            a.render(v.e, 300),
            v.v
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn softmax_logsumexp_and_merges_evaluate_as_constructed(
        a_lane in proptest::collection::vec(entry(), 1..4),
        b_lane in proptest::collection::vec(entry(), 1..4),
        xs in point(),
    ) {
        let mut arena = Arena::default();
        let mut b = B { a: &mut arena, xs: &xs };
        let a_v: Vec<V> = a_lane.iter().enumerate().map(|(i, t)| b.entry(i, t)).collect();
        let b_v: Vec<V> = b_lane.iter().enumerate().map(|(i, t)| b.entry(3 + i, t)).collect();
        let whole: Vec<V> = a_v.iter().chain(&b_v).copied().collect();
        let mut all = b.softmax(&whole);
        // A merge with a fully masked block is NaN in IEEE (-inf - -inf), and so is its
        // product with the other block's zero weights: 0·x stays an atom unless x is
        // provably finite.
        all.extend(b.ring(&a_v, &b_v));
        all.push(b.logsumexp(&whole));
        all.extend(a_v.iter().chain(&b_v).copied());
        check_values(&arena, &xs, &all)?;
    }

    #[test]
    fn a_ring_merge_meets_the_whole_softmax_where_every_block_has_an_unmasked_entry(
        a_lane in proptest::collection::vec(entry(), 1..4),
        b_lane in proptest::collection::vec(entry(), 1..4),
        xs in point(),
    ) {
        prop_assume!(unmasked(&a_lane) && unmasked(&b_lane));
        let mut arena = Arena::default();
        let mut b = B { a: &mut arena, xs: &xs };
        let a_v: Vec<V> = a_lane.iter().enumerate().map(|(i, t)| b.entry(i, t)).collect();
        let b_v: Vec<V> = b_lane.iter().enumerate().map(|(i, t)| b.entry(3 + i, t)).collect();
        let whole: Vec<V> = a_v.iter().chain(&b_v).copied().collect();
        let soft = b.softmax(&whole);
        let ring = b.ring(&a_v, &b_v);
        // The merge's log-sum-exp equals the whole lane's.
        let lse = b.logsumexp(&whole);
        let (la, lb) = (b.logsumexp(&a_v), b.logsumexp(&b_v));
        let m = b.max(&[la, lb]);
        let (da, db) = (b.sub(la, m), b.sub(lb, m));
        let (ea, eb) = (b.exp(da), b.exp(db));
        let s = b.sum(&[ea, eb]);
        let l = b.log(s);
        let merged_lse = b.add(m, l);
        for (x, y) in soft.iter().zip(&ring) {
            prop_assert_eq!(x.e, y.e, "{} vs {}", arena.render(x.e, 300), arena.render(y.e, 300));
        }
        prop_assert_eq!(lse.e, merged_lse.e);
        let mut vs = soft.clone();
        vs.extend(&ring);
        vs.extend([lse, merged_lse]);
        check_values(&arena, &xs, &vs)?;
        for (x, y) in soft.iter().zip(&ring) {
            prop_assert!(close(x.v, y.v), "{} vs {}", x.v, y.v);
        }
    }
}

/// A merge that forgets to rescale the second block's weights (uses exp(x - lse_b) as they
/// are) differs from the softmax, and is never proved.
#[test]
fn a_merge_without_the_rescale_is_not_proved() {
    let xs = [0.5, -1.0, 1.5, 0.25];
    let mut arena = Arena::default();
    let mut b = B {
        a: &mut arena,
        xs: &xs,
    };
    let lane: Vec<V> = (0..4).map(|i| b.sym(i)).collect();
    let soft = b.softmax(&lane);
    let lb = b.logsumexp(&lane[2..]);
    let d = b.sub(lane[3], lb);
    let wrong = b.exp(d);
    assert_ne!(soft[3].e, wrong.e);
    let cfg = DecideConfig {
        z3_timeout: None,
        ..DecideConfig::default()
    };
    assert!(matches!(
        decide(&arena, soft[3].e, wrong.e, &cfg),
        Outcome::Refuted { .. }
    ));
}
