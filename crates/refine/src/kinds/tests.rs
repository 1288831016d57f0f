//! The element-kind analysis's unit tests: its rules, and its claims checked on random programs.

use super::*;
use crate::eval::{random_tensor, seeded_values};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_ir::ValueId;

fn op(name: &str, kids: Vec<Tpl>) -> Tpl {
    Tpl::Op(name.to_string(), kids)
}

fn lit(sym: &str) -> Tpl {
    op(sym, Vec::new())
}

fn list(ns: &[i64]) -> Tpl {
    op(LIST, ns.iter().map(|&n| Tpl::Num(n)).collect())
}

fn input(i: usize) -> Tpl {
    Tpl::Value(ValueRef {
        rank: Some(0),
        value: ValueId::new(i, 0),
    })
}

fn f64s(shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::new(Meta::new(DType::F64, shape.to_vec()), data)
}

/// `t` as a term whose input `i` is the leaf `%r0:x{i}`.
fn expr_of(t: &Tpl) -> RecExpr<Term> {
    fn add(e: &mut RecExpr<Term>, t: &Tpl) -> Id {
        match t {
            Tpl::Num(n) => e.add(Term::Num(*n)),
            Tpl::Value(v) => {
                let leaf = format!("%r0:x{}", v.value.node);
                e.add(Term::Op(Symbol::from(leaf), Vec::new()))
            }
            Tpl::Op(s, kids) => {
                let ids = kids.iter().map(|k| add(e, k)).collect();
                e.add(Term::Op(Symbol::from(s.as_str()), ids))
            }
        }
    }
    let mut e = RecExpr::default();
    add(&mut e, t);
    e
}

/// The reference value of `t` when input `i` is `xs[i]`.
fn evaluate(t: &Tpl, xs: &[Tensor]) -> Tensor {
    let leaves = xs
        .iter()
        .enumerate()
        .map(|(i, x)| (format!("r0:x{i}"), x.clone()))
        .collect();
    let mut out = eval(&expr_of(t), &leaves).unwrap_or_else(|e| panic!("{}: {e}", expr_of(t)));
    assert_eq!(out.len(), 1, "{}", expr_of(t));
    out.remove(0)
}

/// The analysis's claim for `t` when input `i` is abstracted by `abs[i]`.
fn claim(t: &Tpl, abs: &[Arc<Abs>]) -> Abs {
    interpret(t, &|v: ValueRef| abs.get(v.value.node).cloned())
        .unwrap_or_else(|| panic!("no claim for {}", expr_of(t)))
}

/// Whether `x` is of kind `k`.
fn holds(k: Kind, x: f64) -> bool {
    match k {
        Zero => x == 0.0,
        Pos => x.is_finite() && x > 0.0,
        NonNeg => x.is_finite() && x >= 0.0,
        Finite => x.is_finite(),
        NegInf => x == f64::NEG_INFINITY,
        Any => true,
    }
}

/// `Err` naming the first element of `got` that `claim` is wrong about.
fn agrees(claim: &Abs, got: &Tensor) -> Result<(), String> {
    if claim.meta() != &got.meta {
        return Err(format!("claimed {:?}, got {:?}", claim.meta(), got.meta));
    }
    if let Abs::Exact(want) = claim {
        let differ = |(a, b): (&f64, &f64)| a != b && !(a.is_nan() && b.is_nan());
        return match want.data.iter().zip(got.data.iter()).position(differ) {
            Some(i) => Err(format!(
                "element {i}: claimed exactly {}, got {}",
                want.data[i], got.data[i]
            )),
            None => Ok(()),
        };
    }
    let ks = claim.kinds().ok_or("no kinds")?;
    match ks
        .iter()
        .zip(got.data.iter())
        .position(|(&k, &x)| !holds(k, x))
    {
        Some(i) => Err(format!(
            "element {i}: claimed {:?}, got {}",
            ks[i], got.data[i]
        )),
        None => Ok(()),
    }
}

/// The tensor-valued subterms of `t`, children first.
fn subterms(t: &Tpl, out: &mut Vec<Tpl>) {
    if let Tpl::Op(s, kids) = t {
        if !kids.is_empty() && s != LIST {
            for k in kids {
                subterms(k, out);
            }
            if !out.contains(t) {
                out.push(t.clone());
            }
        }
    }
}

/// Guards ring attention's zeros: masked probabilities and their gradients are exactly zero.
#[test]
fn causal_block_is_zero_where_masked() {
    let arange = |a: i64, b: i64| {
        let rest = ["none", "none", "dev", "b:false"].map(lit);
        op(
            "aten.arange.start",
            [Tpl::Num(a), Tpl::Num(b)].into_iter().chain(rest).collect(),
        )
    };
    let unsqueeze = |x: &Tpl, d: i64| op("aten.unsqueeze.default", vec![x.clone(), Tpl::Num(d)]);
    let bmm = |a: Tpl, b: Tpl| op("aten.bmm.default", vec![a, b]);
    let add = |a: Tpl, b: Tpl| op("aten.add.Tensor", vec![a, b, Tpl::Num(1)]);
    let sub = |a: Tpl, b: Tpl| op("aten.sub.Tensor", vec![a, b, Tpl::Num(1)]);
    let pos = op("cat", vec![Tpl::Num(0), arange(0, 2), arange(6, 8)]);
    let later = op(
        "aten.gt.Tensor",
        vec![unsqueeze(&pos, 0), unsqueeze(&pos, 1)],
    );
    let zeros = op(
        "aten.full.default",
        [list(&[4, 4]), lit("f:0.0")]
            .into_iter()
            .chain(["dt:f64", "none", "dev", "b:false"].map(lit))
            .collect(),
    );
    let mask = op("aten.masked_fill.Scalar", vec![zeros, later, lit("f:-inf")]);
    let scores = op(
        "aten.mul.Scalar",
        vec![bmm(input(0), input(1)), lit("f:0.5")],
    );
    let masked = add(scores, mask.clone());
    let lse = op(
        "aten.logsumexp.default",
        vec![masked.clone(), list(&[2]), lit("b:true")],
    );
    let probs = op("aten.exp.default", vec![sub(masked, lse)]);
    let ds = op(
        "aten.mul.Tensor",
        vec![probs.clone(), sub(bmm(input(2), input(3)), input(4))],
    );
    let dq = bmm(ds.clone(), input(5));
    let shapes: [&[usize]; 6] = [
        &[2, 4, 3],
        &[2, 3, 4],
        &[2, 4, 3],
        &[2, 3, 4],
        &[2, 4, 1],
        &[2, 4, 3],
    ];
    let abs: Vec<Arc<Abs>> = shapes
        .iter()
        .map(|s| Arc::new(Abs::Uniform(Meta::new(DType::F64, s.to_vec()), Finite)))
        .collect();

    let Abs::Exact(m) = claim(&mask, &abs) else {
        panic!("the mask is not a constant")
    };
    let hidden: Vec<bool> = m.data.iter().map(|&x| x == f64::NEG_INFINITY).collect();
    assert_eq!(hidden.iter().filter(|&&h| h).count(), 6);
    let hidden = hidden.repeat(2);
    for (t, rest) in [(&probs, Pos), (&ds, Finite)] {
        let ks = claim(t, &abs).kinds().unwrap();
        let zero: Vec<bool> = ks.iter().map(|&k| k == Zero).collect();
        assert_eq!(zero, hidden, "{}: {ks:?}", expr_of(t));
        assert_eq!(zero.iter().filter(|&&z| z).count(), 12);
        assert!(ks.iter().all(|&k| k == Zero || k == rest), "{ks:?}");
    }
    assert_eq!(claim(&dq, &abs).joined(), Finite);

    let mut terms = Vec::new();
    subterms(&dq, &mut terms);
    for seed in [0.13, 0.29, 0.47, 0.71, 0.93] {
        let mut next = seeded_values(seed);
        let xs: Vec<Tensor> = shapes
            .iter()
            .map(|s| random_tensor(DType::F64, s.to_vec(), 0, &mut next))
            .collect();
        for t in &terms {
            if let Err(e) = agrees(&claim(t, &abs), &evaluate(t, &xs)) {
                panic!("{}: {e}", expr_of(t));
            }
        }
    }
}

/// A call of a generated program: its term over the program's inputs, the analysis's
/// claim, and its value in each draw of the inputs.
struct Entry {
    full: Tpl,
    abs: Arc<Abs>,
    vals: Vec<Tensor>,
}

const DRAWS: usize = 4;

fn pick<T: Clone>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())].clone()
}

fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// A program's inputs: finite tensors (drawn anew for each draw), constants holding zeros,
/// -infs, positives and negatives, and constant masks.
fn program_inputs(rng: &mut ChaCha8Rng) -> Vec<Entry> {
    let mut pool: Vec<Entry> = Vec::new();
    let exact = |pool: &mut Vec<Entry>, t: Tensor| {
        let full = input(pool.len());
        let vals = vec![t.clone(); DRAWS];
        pool.push(Entry {
            full,
            abs: Arc::new(Abs::Exact(t)),
            vals,
        });
    };
    for shape in [[3, 4], [3, 4], [1, 4], [3, 1]] {
        let n = shape.iter().product();
        let vals = (0..DRAWS)
            .map(|_| {
                let data = (0..n)
                    .map(|_| {
                        if rng.random_bool(0.25) {
                            pick(rng, &[0.0, -0.0, 1.0, -1.0, 0.5])
                        } else {
                            rng.random_range(-3.0..3.0)
                        }
                    })
                    .collect();
                f64s(&shape, data)
            })
            .collect();
        pool.push(Entry {
            full: input(pool.len()),
            abs: Arc::new(Abs::Uniform(Meta::new(DType::F64, shape.to_vec()), Finite)),
            vals,
        });
    }
    for shape in [[3, 4], [3, 4], [1, 4]] {
        let n = shape.iter().product();
        let data = (0..n)
            .map(|_| pick(rng, &[0.0, f64::NEG_INFINITY, 0.5, 2.0, -1.5]))
            .collect();
        exact(&mut pool, f64s(&shape, data));
    }
    for shape in [[3, 4], [1, 4], [3, 1]] {
        let n = shape.iter().product();
        let data = (0..n).map(|_| f64::from(rng.random_bool(0.5))).collect();
        exact(
            &mut pool,
            Tensor::new(Meta::new(DType::Bool, shape.to_vec()), data),
        );
    }
    pool
}

/// A random call over `pool` (children as `input(j)` for entry `j`); `None` when the pick
/// does not apply.
fn random_call(rng: &mut ChaCha8Rng, pool: &[Entry]) -> Option<Tpl> {
    let shape = |j: usize| pool[j].abs.meta().shape.clone();
    let of = |f: &dyn Fn(usize) -> bool| (0..pool.len()).filter(|&j| f(j)).collect::<Vec<_>>();
    let floats = of(&|j| pool[j].abs.meta().dtype.is_float());
    let bools = of(&|j| pool[j].abs.meta().dtype == DType::Bool);
    // Half the calls extend the latest result, for long chains.
    let x = if rng.random_bool(0.5) {
        *floats.last()?
    } else {
        pick(rng, &floats)
    };
    let sx = shape(x);
    let rank = sx.len() as i64;
    let y = pick(
        rng,
        &of(&|j| floats.contains(&j) && broadcast_shape(&sx, &shape(j)).is_some()),
    );
    let masks = of(&|j| bools.contains(&j) && broadcast_shape(&shape(j), &sx) == Some(sx.clone()));
    let dim = |rng: &mut ChaCha8Rng| {
        let d = rng.random_range(0..rank);
        if rng.random_bool(0.5) {
            d - rank
        } else {
            d
        }
    };
    let keep = |rng: &mut ChaCha8Rng| lit(["b:false", "b:true"][usize::from(rng.random_bool(0.7))]);
    let unary = |name: &str| Some(op(name, vec![input(x)]));
    let n = Tpl::Num;
    match rng.random_range(0..30) {
        0 => unary("aten.exp.default"),
        28 => unary("aten.sigmoid.default"),
        1 => unary("aten.log.default"),
        2 => unary("aten.neg.default"),
        3 => unary("aten.rsqrt.default"),
        4 => unary("aten.sqrt.default"),
        5 => {
            let c = pick(
                rng,
                &["f:-2.0", "f:-0.5", "f:0.0", "f:0.5", "f:3.0", "f:-inf"],
            );
            Some(op("aten.mul.Scalar", vec![input(x), lit(c)]))
        }
        6 => Some(op(
            "aten.mul.Scalar",
            vec![input(x), n(pick(rng, &[-1, 0, 2]))],
        )),
        7 => {
            let c = pick(rng, &["f:1.5", "f:-2.0", "f:0.0", "f:-inf"]);
            let alpha = n(pick(rng, &[1, -1]));
            Some(op("aten.add.Scalar", vec![input(x), lit(c), alpha]))
        }
        8 => {
            let e = pick(rng, &[n(2), lit("f:0.5"), n(-1), n(3)]);
            Some(op("aten.pow.Tensor_Scalar", vec![input(x), e]))
        }
        9 => {
            let (p, q) = (pick(rng, &[-1, 0, 1, 3]), pick(rng, &[1, 2]));
            Some(op("scale", vec![n(p), n(q), input(x)]))
        }
        10 if rank > 0 => Some(op("aten.flip.default", vec![input(x), list(&[dim(rng)])])),
        11 if rank > 0 => {
            // A window of `cat(x, y)` as large as `x`.
            let y = pick(rng, &of(&|j| floats.contains(&j) && shape(j) == sx));
            let d = rng.random_range(0..rank);
            let size = sx[d as usize] as i64;
            let s = rng.random_range(0..=size);
            let both = op("cat", vec![n(d), input(x), input(y)]);
            Some(op("slice", vec![n(d), n(s), n(s + size), both]))
        }
        12 => {
            let dims = match rng.random_range(0..3) {
                _ if rank == 0 => lit("none"),
                0 => list(&[dim(rng)]),
                1 => list(&(0..rank).collect::<Vec<_>>()),
                _ => lit("none"),
            };
            let k = keep(rng);
            Some(op(
                "aten.sum.dim_IntList",
                vec![input(x), dims, k, lit("none")],
            ))
        }
        13 | 14 if rank > 0 => {
            let name = ["aten.amax.default", "aten.logsumexp.default"][rng.random_range(0..2)];
            let dims = list(&[dim(rng)]);
            Some(op(name, vec![input(x), dims, keep(rng)]))
        }
        15 | 16 if rank > 0 => Some(op(
            "aten._softmax.default",
            vec![input(x), n(dim(rng)), lit("b:false")],
        )),
        17 | 18 if !masks.is_empty() => {
            let v = pick(rng, &["f:-inf", "f:0.0", "f:2.5", "f:-1.0"]);
            Some(op(
                "aten.masked_fill.Scalar",
                vec![input(x), input(pick(rng, &masks)), lit(v)],
            ))
        }
        19 => Some(op("aten.gt.Tensor", vec![input(x), input(y)])),
        29 if rank > 0 => {
            // Pads the last one or two dims (or crops one from a side of three or more)
            // with a number of each kind, an integer literal among them.
            let k = rng.random_range(1..=rank.min(2)) as usize;
            let mut pads = Vec::new();
            for i in 0..k {
                let lo = if sx[sx.len() - 1 - i] >= 3 { -1 } else { 0 };
                pads.push(rng.random_range(lo..=2));
                pads.push(rng.random_range(lo..=2));
            }
            let v = pick(
                rng,
                &[
                    lit("f:0.0"),
                    lit("f:-inf"),
                    lit("f:inf"),
                    lit("f:1.5"),
                    lit("f:-2.0"),
                    n(0),
                    n(3),
                ],
            );
            Some(op(
                "aten.constant_pad_nd.default",
                vec![input(x), list(&pads), v],
            ))
        }
        20 => {
            let sxy = broadcast_shape(&sx, &shape(y))?;
            let conds = of(&|j| bools.contains(&j) && broadcast_shape(&shape(j), &sxy).is_some());
            if conds.is_empty() {
                return None;
            }
            let c = pick(rng, &conds);
            Some(op("aten.where.self", vec![input(c), input(x), input(y)]))
        }
        21..=27 => {
            let name = pick(
                rng,
                &[
                    "aten.add.Tensor",
                    "aten.sub.Tensor",
                    "aten.mul.Tensor",
                    "aten.div.Tensor",
                    "aten.maximum.default",
                    "aten.minimum.default",
                ],
            );
            let mut kids = vec![input(x), input(y)];
            if name.starts_with("aten.add") || name.starts_with("aten.sub") {
                kids.push(n(1));
            }
            Some(op(name, kids))
        }
        _ => None,
    }
}

/// `t` over the program's inputs, its children `input(j)` replaced by entry `j`'s term.
fn substitute(t: &Tpl, pool: &[Entry]) -> Tpl {
    match t {
        Tpl::Value(v) => pool[v.value.node].full.clone(),
        Tpl::Num(_) => t.clone(),
        Tpl::Op(s, kids) => op(s, kids.iter().map(|k| substitute(k, pool)).collect()),
    }
}

fn size(t: &Tpl) -> usize {
    match t {
        Tpl::Op(_, kids) => 1 + kids.iter().map(size).sum::<usize>(),
        _ => 1,
    }
}

/// Where floating point may part from the reals: a value near overflow or underflow.
fn wild(x: f64) -> bool {
    x.is_finite() && (x.abs() > 1e100 || (x != 0.0 && x.abs() < 1e-100))
}

/// A router's top-k of sigmoid scores is positive, so dividing by its sum stays finite (the
/// ring attention after a MoE layer keeps its masked blocks zero).
#[test]
fn top_k_of_sigmoid_scores_is_positive() {
    let scores = op("aten.sigmoid.default", vec![input(0)]);
    let top = op("aten.topk.default", vec![scores.clone(), Tpl::Num(2)]);
    let values = op(GET, vec![Tpl::Num(0), top]);
    let sum = op(
        "aten.sum.dim_IntList",
        vec![values.clone(), list(&[1]), lit("b:true"), lit("none")],
    );
    let share = op("aten.div.Tensor", vec![values.clone(), sum]);
    let x = Arc::new(Abs::Uniform(Meta::new(DType::F64, vec![3, 4]), Finite));
    for (t, want) in [(&scores, Pos), (&values, Pos), (&share, Pos)] {
        let got = claim(t, std::slice::from_ref(&x));
        assert_eq!(got.joined(), want, "{}", expr_of(t));
    }
}

/// Guards every table entry: each claim on random programs holds on random finite inputs.
#[test]
fn random_programs_claims_hold() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut checked, mut skipped) = (0usize, 0usize);
    let mut claimed: HashMap<Kind, usize> = HashMap::new();
    for _ in 0..1000 {
        let mut pool = program_inputs(&mut rng);
        let inputs = pool.len();
        let input_abs: Vec<Arc<Abs>> = pool.iter().map(|e| e.abs.clone()).collect();
        // Draws no longer checked: floating point left the reals' range in them.
        let mut off = [false; DRAWS];
        for _ in 0..rng.random_range(1..=12) {
            let Some(call) = (0..20).find_map(|_| random_call(&mut rng, &pool)) else {
                break;
            };
            let pool_abs: Vec<Arc<Abs>> = pool.iter().map(|e| e.abs.clone()).collect();
            let abs = Arc::new(claim(&call, &pool_abs));
            let full = substitute(&call, &pool);
            let Tpl::Op(name, kids) = &call else {
                unreachable!()
            };
            let mut vals = Vec::with_capacity(DRAWS);
            for (d, off) in off.iter_mut().enumerate() {
                let xs: Vec<Tensor> = pool.iter().map(|e| e.vals[d].clone()).collect();
                let got = evaluate(&call, &xs);
                // Past this, floats may round where the reals do not (an exponential of a
                // large argument, a value near overflow or underflow): skip the draw.
                let exps = matches!(
                    name.as_str(),
                    "aten.exp.default" | "aten._softmax.default" | "aten.sigmoid.default"
                );
                let large = |t: &Tensor| t.data.iter().any(|x| x.is_finite() && x.abs() > 300.0);
                let exp_arg = exps && matches!(&kids[0], Tpl::Value(v) if large(&xs[v.value.node]));
                *off |= exp_arg || got.data.iter().any(|&x| wild(x));
                if *off {
                    skipped += 1;
                } else if let Err(e) = agrees(&abs, &got) {
                    let ins: Vec<_> = pool[..inputs].iter().map(|e| &e.vals[d].data).collect();
                    panic!("{}: {e}\ninputs x0..: {ins:?}", expr_of(&full));
                } else {
                    checked += 1;
                }
                vals.push(got);
            }
            if !matches!(*abs, Abs::Exact(_)) {
                for k in abs.kinds().unwrap() {
                    *claimed.entry(k).or_default() += 1;
                }
            }
            pool.push(Entry { full, abs, vals });
        }
        // The program as one term gets the claim its calls got one at a time.
        let last = pool.last().unwrap();
        if pool.len() > inputs && size(&last.full) <= 200 {
            let whole = claim(&last.full, &input_abs);
            assert_eq!(whole.kinds(), last.abs.kinds(), "{}", expr_of(&last.full));
        }
    }
    assert!(
        checked > 4 * skipped,
        "{checked} checked, {skipped} skipped"
    );
    for k in [Zero, Pos, NonNeg, Finite, NegInf, Any] {
        assert!(
            claimed.get(&k).is_some_and(|&n| n > 0),
            "{k:?}: {claimed:?}"
        );
    }
}

/// `claim` against `got` like [`agrees`], also for uniform claims past [`MAX_ELEMS`].
fn agrees_any(claim: &Abs, got: &Tensor) -> Result<(), String> {
    match claim {
        Abs::Uniform(m, k) if claim.kinds().is_none() => {
            if m != &got.meta {
                return Err(format!("claimed {m:?}, got {:?}", got.meta));
            }
            match got.data.iter().position(|&x| !holds(*k, x)) {
                Some(i) => Err(format!("element {i}: claimed {k:?}, got {}", got.data[i])),
                None => Ok(()),
            }
        }
        _ => agrees(claim, got),
    }
}

/// Checks the analysis's claim on `t` and on each of its subterms against the reference
/// value in every draw of the inputs (`draws[d][i]` is input `i`); returns the claim on `t`.
/// A subterm the reference interpreter cannot evaluate may only get no claim or `Any`.
fn check_claims(
    t: &Tpl,
    abs: &[Arc<Abs>],
    draws: &[Vec<Tensor>],
    unevaluated: &mut Vec<String>,
) -> Option<Abs> {
    let mut terms = Vec::new();
    subterms(t, &mut terms);
    let mut last = None;
    for s in &terms {
        let c = interpret(s, &|v: ValueRef| abs.get(v.value.node).cloned());
        for (d, xs) in draws.iter().enumerate() {
            let leaves = xs
                .iter()
                .enumerate()
                .map(|(i, x)| (format!("r0:x{i}"), x.clone()))
                .collect();
            match eval(&expr_of(s), &leaves) {
                Ok(outs) if outs.len() == 1 => {
                    if let Some(c) = &c {
                        if let Err(e) = agrees_any(c, &outs[0]) {
                            panic!("{}: {e} (draw {d})", expr_of(s));
                        }
                    }
                }
                // A tuple: the analysis has no tensor claim on it.
                Ok(_) => assert!(c.is_none(), "{}: a claim on a tuple", expr_of(s)),
                Err(e) => {
                    let k = c.as_ref().map(|c| c.joined());
                    assert!(
                        k.is_none() || k == Some(Any),
                        "{}: claimed {k:?} but the interpreter fails: {e}",
                        expr_of(s)
                    );
                    let e = format!("{}: {e}", expr_of(s));
                    if !unevaluated.contains(&e) {
                        unevaluated.push(e);
                    }
                }
            }
        }
        last = c;
    }
    last
}

/// Guards the claims a review found unsound (constants past [`MAX_ELEMS`], fills and pads
/// with infinities, divisions hidden in composite operators, random draws taken for
/// constants, multi-output calls): every claim holds on inputs that reach each hazard and on
/// random draws, while finite operators of finite inputs stay finite.
#[test]
fn former_unsound_claims_are_gone() {
    let n = Tpl::Num;
    let lits = |xs: &[&str]| xs.iter().map(|s| lit(s)).collect::<Vec<_>>();
    let call = |name: &str, kids: Vec<Tpl>, rest: &[&str]| {
        op(name, kids.into_iter().chain(lits(rest)).collect())
    };
    let factory = ["dt:f64", "none", "dev", "b:false"];
    let full =
        |shape: &[i64], v: &str| call("aten.full.default", vec![list(shape), lit(v)], &factory);
    let get = |k: i64, t: &Tpl| op(GET, vec![n(k), t.clone()]);
    let (x0, x1, x2, idx, m, w, b) = (
        input(0),
        input(1),
        input(2),
        input(3),
        input(4),
        input(5),
        input(6),
    );
    let f64m = |s: &[usize]| Meta::new(DType::F64, s.to_vec());
    let idx_t = Tensor::new(Meta::new(DType::I64, vec![1]), vec![1.0]);
    let m_t = Tensor::new(
        Meta::new(DType::Bool, vec![3, 4]),
        (0..12).map(|i| f64::from(u8::from(i % 4 == 3))).collect(),
    );
    let finite = |s: &[usize]| Arc::new(Abs::Uniform(f64m(s), Finite));
    let abs = vec![
        finite(&[3, 3]),
        finite(&[3, 3]),
        finite(&[3, 4]),
        Arc::new(Abs::Exact(idx_t.clone())),
        Arc::new(Abs::Exact(m_t.clone())),
        finite(&[3]),
        finite(&[3]),
    ];
    // Inputs that reach every hazard (a constant row, zero divisors), then random draws.
    let mut draws = vec![vec![
        f64s(&[3, 3], vec![0.5, 0.0, -1.0, 2.0, 2.0, 2.0, 0.3, 0.1, 0.7]),
        f64s(&[3, 3], vec![1.0, 0.0, 2.0, 0.5, 0.0, 0.0, 1.0, 1.0, 1.0]),
        f64s(
            &[3, 4],
            vec![0.5, -1.0, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0, -0.3, 0.2, 0.0, 4.0],
        ),
        idx_t.clone(),
        m_t.clone(),
        f64s(&[3], vec![1.5, -0.5, 0.0]),
        f64s(&[3], vec![0.0, 2.0, -1.0]),
    ]];
    for seed in [0.13, 0.47, 0.71, 0.93] {
        let mut next = seeded_values(seed);
        let mut r = |s: &[usize]| random_tensor(DType::F64, s.to_vec(), 0, &mut next);
        let (a, c, d, e, f) = (r(&[3, 3]), r(&[3, 3]), r(&[3, 4]), r(&[3]), r(&[3]));
        draws.push(vec![a, c, d, idx_t.clone(), m_t.clone(), e, f]);
    }
    let fixed = draws[0].clone();

    let gt = op("aten.gt.Tensor", vec![x0.clone(), x1.clone()]);
    let pad = op(
        "aten.constant_pad_nd.default",
        vec![x0.clone(), list(&[0, 1]), lit("f:-inf")],
    );
    let lnorm0 = op(
        "aten.native_layer_norm.default",
        vec![
            x0.clone(),
            list(&[3]),
            lit("none"),
            lit("none"),
            lit("f:0.0"),
        ],
    );
    let masked_exp = op(
        "aten.exp.default",
        vec![op(
            "aten.masked_fill.Scalar",
            vec![x2.clone(), m.clone(), lit("f:-inf")],
        )],
    );
    let bern = op(
        "aten.bernoulli.p",
        vec![full(&[3, 4], "f:0.5"), lit("f:0.5"), lit("none")],
    );
    let bern_mask = call("aten._to_copy.default", vec![bern.clone()], &["dt:b8"]);
    let bern_exp = op(
        "aten.exp.default",
        vec![op(
            "aten.masked_fill.Scalar",
            vec![x2.clone(), bern_mask, lit("f:-inf")],
        )],
    );
    let empty_const = call(
        "aten.empty_like.default",
        vec![full(&[3, 3], "f:0.0")],
        &["none", "none", "dev", "b:false", "none"],
    );
    // Each term, and whether the fixed inputs make it infinite or NaN somewhere.
    let hazards: Vec<(Tpl, bool)> = vec![
        (full(&[300, 300], "f:-inf"), true),
        (
            call(
                "aten.new_full.default",
                vec![x0.clone(), list(&[2, 2]), lit("f:-inf")],
                &factory,
            ),
            true,
        ),
        (
            call(
                "aten.full_like.default",
                vec![x0.clone(), lit("f:-inf")],
                &["dt:f64", "none", "dev", "b:false", "none"],
            ),
            true,
        ),
        (
            op("aten.fill.Scalar", vec![x0.clone(), lit("f:-inf")]),
            true,
        ),
        (pad.clone(), true),
        (
            op(
                "aten.where.ScalarOther",
                vec![gt.clone(), x0.clone(), lit("f:-inf")],
            ),
            true,
        ),
        (
            op(
                "aten.where.Scalar",
                vec![gt.clone(), lit("f:-inf"), lit("f:0.0")],
            ),
            true,
        ),
        (
            op(
                "aten.scatter.value",
                vec![
                    x0.clone(),
                    n(1),
                    op("aten.view.default", vec![idx.clone(), list(&[1, 1])]),
                    lit("f:-inf"),
                ],
            ),
            true,
        ),
        (
            op(
                "aten.index_fill.int_Scalar",
                vec![x0.clone(), n(0), idx.clone(), lit("f:-inf")],
            ),
            true,
        ),
        (
            op(
                "aten.clamp.default",
                vec![x0.clone(), lit("f:inf"), lit("none")],
            ),
            true,
        ),
        (
            op("aten.rsub.Scalar", vec![x0.clone(), lit("f:inf"), n(1)]),
            true,
        ),
        (
            op(
                "aten.addcdiv.default",
                vec![x0.clone(), x0.clone(), x1.clone(), n(1)],
            ),
            true,
        ),
        (
            op(
                "aten.var.correction",
                vec![x0.clone(), list(&[1]), n(3), lit("b:false")],
            ),
            true,
        ),
        (
            op(
                "aten.layer_norm.default",
                vec![
                    x0.clone(),
                    list(&[3]),
                    lit("none"),
                    lit("none"),
                    lit("f:0.0"),
                    lit("b:false"),
                ],
            ),
            true,
        ),
        (get(0, &lnorm0), true),
        (get(1, &lnorm0), false),
        (get(2, &lnorm0), true),
        (
            call(
                "aten.empty_like.default",
                vec![x0.clone()],
                &["none", "none", "dev", "b:false", "none"],
            ),
            true,
        ),
        (empty_const.clone(), true),
        (
            op("aten.mul.Tensor", vec![masked_exp.clone(), pad.clone()]),
            true,
        ),
        (bern.clone(), false),
        (bern_exp.clone(), false),
    ];
    let mut unevaluated = Vec::new();
    for (t, hazard) in &hazards {
        let c = check_claims(t, &abs, &draws, &mut unevaluated);
        match eval(
            &expr_of(t),
            &fixed
                .iter()
                .enumerate()
                .map(|(i, x)| (format!("r0:x{i}"), x.clone()))
                .collect(),
        ) {
            Ok(v) => {
                // Evaluated terms must get a claim, or the check above is vacuous.
                assert!(c.is_some(), "no claim for {}", expr_of(t));
                let bad = v[0].data.iter().any(|x| !x.is_finite());
                assert_eq!(bad, *hazard, "{}: {:?}", expr_of(t), v[0].data);
            }
            Err(_) => assert!(c.is_none_or(|c| c.joined() == Any)),
        }
    }

    // Column 3 of the masked exponential is zero, but times `-inf` padding it is NaN.
    let prod = op("aten.mul.Tensor", vec![masked_exp.clone(), pad]);
    let ks = claim(&prod, &abs).kinds().unwrap();
    assert!(
        ks.iter().skip(3).step_by(4).all(|&k| k != Zero),
        "{}: {ks:?}",
        expr_of(&prod)
    );
    assert_eq!(claim(&masked_exp, &abs).kinds().unwrap()[3], Zero);
    // Random draws and uninitialised memory are no constants.
    for t in [&bern, &empty_const] {
        let c = claim(t, &abs);
        assert!(!matches!(c, Abs::Exact(_)), "{}: {c:?}", expr_of(t));
    }
    let ks = claim(&bern_exp, &abs).kinds().unwrap();
    assert!(!ks.contains(&Zero), "{}: {ks:?}", expr_of(&bern_exp));

    // Precision kept: finite operators of finite inputs are finite.
    let lnorm = op(
        "aten.native_layer_norm.default",
        vec![x0.clone(), list(&[3]), w.clone(), b.clone(), lit("f:1e-5")],
    );
    let finites = [
        get(0, &lnorm),
        get(1, &lnorm),
        get(2, &lnorm),
        op("aten.silu.default", vec![x0.clone()]),
        op("aten.gelu.default", vec![x0.clone()]),
        op("aten.cos.default", vec![x0.clone()]),
        op(
            "aten.addmm.default",
            vec![w.clone(), x0.clone(), x1.clone()],
        ),
    ];
    for t in &finites {
        let c = check_claims(t, &abs, &draws, &mut unevaluated);
        let k = c.map(|c| c.joined());
        assert_eq!(k, Some(Finite), "{}", expr_of(t));
    }
    assert!(unevaluated.is_empty(), "{unevaluated:#?}");
}

/// Guards the block query: zero only for in-range blocks whose every element is proved zero.
#[test]
fn zero_blocks_cover_only_zero_regions() {
    let m = |shape: &[usize]| Meta::new(DType::F64, shape.to_vec());
    let [a, b, c, z, e] = ["%r0:a", "%r0:b", "%r0:c", "%r0:z", "%r0:e"].map(Symbol::from);
    let blocks = ZeroBlocks::new([
        (
            a,
            Arc::new(Abs::Elems(
                m(&[2, 3]),
                vec![Zero, Zero, Pos, Zero, Finite, Zero],
            )),
        ),
        (b, Arc::new(Abs::Uniform(m(&[2, 2]), Finite))),
        (
            c,
            Arc::new(Abs::Exact(Tensor::new(
                Meta::new(DType::Bool, vec![2]),
                vec![0.0, 0.0],
            ))),
        ),
        (z, Arc::new(Abs::Uniform(m(&[2, 2]), Zero))),
        (e, Arc::new(Abs::Exact(f64s(&[2], vec![0.0, 3.0])))),
    ]);
    assert!(!blocks.is_empty());
    assert!(blocks.has(a) && blocks.has(z) && blocks.has(e));
    assert!(!blocks.has(b) && !blocks.has(c));
    // Fully zero regions.
    assert!(blocks.is_zero(a, &[(0, 1), (0, 2)]));
    assert!(blocks.is_zero(a, &[(0, 2), (0, 1)]));
    assert!(blocks.is_zero(a, &[(1, 2), (2, 3)]));
    assert!(blocks.is_zero(a, &[(0, 1), (1, 2)]));
    assert!(blocks.is_zero(z, &[(0, 2), (0, 2)]));
    assert!(blocks.is_zero(e, &[(0, 1)]));
    // Partly zero regions.
    assert!(!blocks.is_zero(a, &[(0, 2), (0, 2)]));
    assert!(!blocks.is_zero(a, &[(0, 1), (0, 3)]));
    assert!(!blocks.is_zero(a, &[(0, 2), (0, 3)]));
    assert!(!blocks.is_zero(a, &[(1, 2), (1, 3)]));
    assert!(!blocks.is_zero(e, &[(0, 2)]));
    // Out of range, empty, of the wrong rank, or of a tensor without zeros.
    assert!(!blocks.is_zero(a, &[(0, 3), (0, 1)]));
    assert!(!blocks.is_zero(a, &[(1, 2), (2, 4)]));
    assert!(!blocks.is_zero(z, &[(0, 2), (0, 3)]));
    assert!(!blocks.is_zero(a, &[(0, 0), (0, 1)]));
    assert!(!blocks.is_zero(a, &[(1, 1), (0, 1)]));
    assert!(!blocks.is_zero(a, &[(0, 1)]));
    assert!(!blocks.is_zero(a, &[(0, 1), (0, 1), (0, 1)]));
    assert!(!blocks.is_zero(b, &[(0, 1), (0, 1)]));
    assert!(!blocks.is_zero(c, &[(0, 1)]));
    assert!(ZeroBlocks::new(Vec::<(Symbol, Arc<Abs>)>::new()).is_empty());
}
