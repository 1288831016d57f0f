//! Ring attention's `D = Σ_h dO_h·O_h` where the output gradient `dO` holds softmax weights
//! of its own: with the cross-entropy's one-hot row sum folded to 1, the loss gradient
//! `softmax_k/N - [t == k]/N` is small enough that the products above it are expanded, and
//! the loss softmax's weights reach the attention output's gradient. The product expansion
//! layer moves the attention weights out of `product(O, dO)` although `dO` is weighted too
//! (`p·q = Σ_w w·(p_w·q)` whatever `q` holds); a mutated merge is never proved, and each
//! planted bug really differs and is refuted with a real witness.

use proptest::prelude::*;
use shardproof_prove::decide::{decide, DecideConfig, Layer, Outcome};
use shardproof_prove::eval::FloatEval;
use shardproof_prove::expand::{equal_after_expanding_products, equal_with_weights_outside};
use shardproof_prove::expr::{rat_to_f64, Arena, Budget, Coeff, ExprId, Func, SymbolKind};

/// One block of the merged output: `coeff·w·V` with `w` the attention weight it holds (0
/// none, 1 `P0`, 2 `P1`, 3 `P0·P1`) and `V`'s coefficients on `v0..v2`.
#[derive(Clone, Debug)]
struct Block {
    coeff: i64,
    weight: usize,
    values: Vec<i64>,
}

fn block(coeff: i64, weight: usize, values: [i64; 3]) -> Block {
    Block {
        coeff,
        weight,
        values: values.to_vec(),
    }
}

/// An arena whose products of sums stay `product` atoms, with attention scores `s0, s1`,
/// values `v0..v2`, and an output gradient that holds a second softmax (over `z0, z1`).
struct Ring {
    a: Arena,
    /// `P0`, `P1`: the attention's softmax weights.
    p: [ExprId; 2],
    v: [ExprId; 3],
    /// `g0·Q0 + 2·g1·Q1 - g2`, `Q` the loss softmax over `z0, z1`.
    d_o: ExprId,
}

impl Ring {
    fn new() -> Ring {
        let mut a = Arena::new(Budget {
            expand_limit: 2,
            ..Budget::default()
        });
        let sym = |a: &mut Arena, n: &str| a.symbol(n, SymbolKind::Real).unwrap();
        let softmax = |a: &mut Arena, names: [&str; 2]| {
            let e = names.map(|n| {
                let x = sym(a, n);
                a.app(Func::Exp, vec![x]).unwrap()
            });
            let total = a.add(e[0], e[1]).unwrap();
            let r = a.recip(total).unwrap();
            e.map(|x| a.mul(x, r).unwrap())
        };
        let p = softmax(&mut a, ["s0", "s1"]);
        let v = [sym(&mut a, "v0"), sym(&mut a, "v1"), sym(&mut a, "v2")];
        let q = softmax(&mut a, ["z0", "z1"]);
        let g = [sym(&mut a, "g0"), sym(&mut a, "g1"), sym(&mut a, "g2")];
        let g0q0 = a.mul(g[0], q[0]).unwrap();
        let g1q1 = a.mul(g[1], q[1]).unwrap();
        let g1q1 = a.scale(g1q1, &Coeff::from_integer(2)).unwrap();
        let d_o = a.add(g0q0, g1q1).unwrap();
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

    /// The ring's `product(Σ_j c_j·w_j·V_j, dO)`: the attention weights inside the product.
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

    /// The spec's `Σ_j c_j·w_j·product(V_j, dO)`: the attention weights outside.
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
        equal_after_expanding_products(&self.a, x, y, 200_000, None) == Ok(true)
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

/// The merge is proved by the rewriting alone although both factors of the ring's product
/// hold softmax weights; the planted bugs of a ring backward are not, and each is refuted
/// at a real witness.
#[test]
fn a_ring_merge_with_a_weighted_output_gradient_is_proved_and_planted_bugs_are_not() {
    let correct = [block(1, 1, [1, 2, 0]), block(1, 2, [0, 1, -1])];
    let mut r = Ring::new();
    let inside = r.inside(&correct);
    let outside = r.outside(&correct);
    assert_ne!(
        inside, outside,
        "the normal form keeps the two groupings apart"
    );
    // Moving only a factor's weights out where the other holds none leaves the ring's
    // `product(O, dO)` as it is: this is what the rewriting must get past.
    assert_eq!(
        equal_with_weights_outside(&r.a, inside, outside, 200_000, None),
        Ok(true)
    );
    let cfg = DecideConfig {
        z3_timeout: None,
        ..DecideConfig::default()
    };
    assert_eq!(
        decide(&r.a, inside, outside, &cfg),
        Outcome::Proved(Layer::ProductExpansion)
    );
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
    for (what, blocks) in planted {
        let wrong = r.outside(&blocks);
        assert!(r.differ(inside, wrong), "{what}");
        assert_ne!(
            equal_with_weights_outside(&r.a, inside, wrong, 200_000, None),
            Ok(true),
            "{what}"
        );
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

fn any_block() -> impl Strategy<Value = Block> {
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// With a weighted output gradient, moving the attention weights out of products proves
    /// only equalities: inside against outside is always equal, and a mutated outside (one
    /// block's coefficient changed) is proved only where it does not change the value.
    #[test]
    fn weights_moved_out_past_a_weighted_factor_prove_only_equalities(
        blocks in proptest::collection::vec(any_block(), 1..4),
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
        if equal_with_weights_outside(&r.a, inside, mutated, 200_000, None) == Ok(true) {
            prop_assert!(!r.differ(inside, mutated), "{blocks:?} rewritten, mutated at {j}");
        }
        // Distinct weights, each on a sum: the rewriting meets the other side.
        let mut weights: Vec<usize> = blocks.iter().map(|b| b.weight).collect();
        weights.sort();
        weights.dedup();
        let sums = blocks.iter().all(|b| b.values.iter().filter(|&&k| k != 0).count() >= 2);
        if weights.len() == blocks.len() && sums {
            prop_assert!(r.proved(inside, outside), "{blocks:?}");
            // And by the rewriting alone, past the weighted output gradient.
            prop_assert_eq!(
                equal_with_weights_outside(&r.a, inside, outside, 200_000, None),
                Ok(true),
                "{:?}",
                blocks
            );
        }
    }
}
