//! Evaluating terms with the reference kernels: how lemmas are checked for soundness (and how
//! a relation can be checked on concrete values).

use crate::lemmas::SCALE;
use crate::term::{
    literal_arg, parse_leaf, Term, CAT, GET, LIST, MAX, MIN, SLICE, SUM, VOCAB_GRAD, VOCAB_LOOKUP,
    VOCAB_ONEHOT, VOCAB_PICK,
};
use egg::{Analysis, AstSize, EGraph, Extractor, Language, RecExpr};
use shardproof_ir::{Arg, DType, OpName, ValueId};
use shardproof_ops::{Meta, Registry, Tensor};
use std::collections::HashMap;

/// A value while evaluating: a tensor tuple, or an argument.
#[derive(Clone, Debug)]
enum Val {
    Tensors(Vec<Tensor>),
    Arg(Arg),
    /// A list holding tensors (the index list of `index.Tensor`).
    List(Vec<Val>),
}

/// Evaluates the root of `expr`; leaves are looked up by their value name (`%r0:a` → `a` of
/// rank 0, keyed `r0:a`).
pub fn eval(expr: &RecExpr<Term>, leaves: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, String> {
    let reg = Registry::builtin();
    let mut vals: Vec<Val> = Vec::with_capacity(expr.as_ref().len());
    for node in expr.as_ref() {
        let v = match node {
            Term::Num(n) => Val::Arg(Arg::Int(*n)),
            Term::Op(s, kids) => {
                let s = s.as_str();
                let kid = |i: usize| vals[usize::from(kids[i])].clone();
                let tensor = |i: usize| match kid(i) {
                    Val::Tensors(t) if t.len() == 1 => Ok(t[0].clone()),
                    other => Err(format!("{s}: child {i} is not one tensor: {other:?}")),
                };
                let int = |i: usize| match kid(i) {
                    Val::Arg(Arg::Int(n)) => Ok(n),
                    other => Err(format!("{s}: child {i} is not an integer: {other:?}")),
                };
                if let Some((r, name)) = parse_leaf(s) {
                    let key = format!("r{r}:{name}");
                    Val::Tensors(vec![leaves
                        .get(&key)
                        .cloned()
                        .ok_or(format!("no value for leaf {key}"))?])
                } else if kids.is_empty() && s == LIST {
                    // An empty list (the shape of a 0-d `full`).
                    Val::Arg(Arg::List(Vec::new()))
                } else if kids.is_empty() {
                    Val::Arg(literal_arg(s).ok_or(format!("unknown literal {s}"))?)
                } else {
                    match s {
                        LIST => {
                            let items: Vec<Val> = (0..kids.len()).map(kid).collect();
                            if items.iter().all(|v| matches!(v, Val::Arg(_))) {
                                Val::Arg(Arg::List(
                                    items
                                        .into_iter()
                                        .filter_map(|v| match v {
                                            Val::Arg(a) => Some(a),
                                            _ => None,
                                        })
                                        .collect(),
                                ))
                            } else {
                                Val::List(items)
                            }
                        }
                        CAT => {
                            let ts: Vec<Tensor> =
                                (1..kids.len()).map(tensor).collect::<Result<_, _>>()?;
                            let args = vec![
                                Arg::List(
                                    (0..ts.len())
                                        .map(|i| Arg::Value(ValueId::new(i, 0)))
                                        .collect(),
                                ),
                                Arg::Int(int(0)?),
                            ];
                            Val::Tensors(call(reg, "aten.cat.default", &ts, &args)?)
                        }
                        SUM | MAX | MIN => {
                            let op = match s {
                                SUM => "aten.add.Tensor",
                                MAX => "aten.maximum.default",
                                _ => "aten.minimum.default",
                            };
                            let mut acc = tensor(0)?;
                            for i in 1..kids.len() {
                                let ts = [acc, tensor(i)?];
                                acc = call(reg, op, &ts, &two())?.remove(0);
                            }
                            Val::Tensors(vec![acc])
                        }
                        SLICE => {
                            let ts = [tensor(3)?];
                            let args = vec![
                                Arg::Value(ValueId::new(0, 0)),
                                Arg::Int(int(0)?),
                                Arg::Int(int(1)?),
                                Arg::Int(int(2)?),
                            ];
                            Val::Tensors(call(reg, "aten.slice.Tensor", &ts, &args)?)
                        }
                        SCALE => {
                            let x = tensor(2)?;
                            let f = int(0)? as f64 / int(1)? as f64;
                            let data: Vec<f64> = x.data.iter().map(|v| v * f).collect();
                            Val::Tensors(vec![Tensor::new(x.meta.clone(), data)])
                        }
                        VOCAB_LOOKUP => {
                            let (w, t, s) = (tensor(0)?, tensor(1)?, int(2)?);
                            let (rows, cols) = (w.meta.shape[0] as i64, w.meta.shape[1]);
                            let mut data = Vec::with_capacity(t.data.len() * cols);
                            for &i in t.data.iter() {
                                let r = i as i64 - s;
                                if (0..rows).contains(&r) {
                                    let r = r as usize;
                                    data.extend_from_slice(&w.data[r * cols..(r + 1) * cols]);
                                } else {
                                    data.extend(std::iter::repeat_n(0.0, cols));
                                }
                            }
                            let mut shape = t.meta.shape.clone();
                            shape.push(cols);
                            Val::Tensors(vec![Tensor::new(Meta::new(w.meta.dtype, shape), data)])
                        }
                        VOCAB_PICK => {
                            let (x, t, s) = (tensor(0)?, tensor(1)?, int(2)?);
                            let w = *x.meta.shape.last().ok_or("vocab_pick of a 0-d tensor")?;
                            let data = t
                                .data
                                .iter()
                                .enumerate()
                                .map(|(p, &i)| {
                                    let c = i as i64 - s;
                                    if (0..w as i64).contains(&c) {
                                        x.data[p * w + c as usize]
                                    } else {
                                        0.0
                                    }
                                })
                                .collect();
                            Val::Tensors(vec![Tensor::new(
                                Meta::new(x.meta.dtype, t.meta.shape.clone()),
                                data,
                            )])
                        }
                        VOCAB_ONEHOT => {
                            Val::Tensors(vec![vocab_onehot(&tensor(0)?, int(1)?, int(2)?)?])
                        }
                        VOCAB_GRAD => Val::Tensors(vec![vocab_grad(
                            &tensor(0)?,
                            &tensor(1)?,
                            int(2)?,
                            int(3)?,
                        )?]),
                        GET => match kid(1) {
                            Val::Tensors(ts) => Val::Tensors(vec![ts
                                .get(int(0)? as usize)
                                .cloned()
                                .ok_or("get out of range")?]),
                            _ => return Err("get of a non-tuple".into()),
                        },
                        "aten.native_dropout.default" => {
                            let x = tensor(0)?;
                            let p = match kid(1) {
                                Val::Arg(a) => a.as_f64().ok_or("dropout p is not a number")?,
                                _ => return Err("dropout p is not a number".into()),
                            };
                            Val::Tensors(same_mask_dropout(&x, p))
                        }
                        _ => {
                            let name = OpName::parse(s).ok_or(format!("bad operator {s}"))?;
                            let def = reg.get(&name).ok_or(format!("unknown operator {s}"))?;
                            let mut tensors = Vec::new();
                            let mut kwargs = Vec::new();
                            for (i, sa) in def.schema.args.iter().enumerate().take(kids.len()) {
                                let a = to_arg(kid(i), &mut tensors)?;
                                kwargs.push((sa.name.clone(), a));
                            }
                            Val::Tensors(
                                reg.call(s, &tensors, &[], &kwargs)
                                    .map_err(|e| format!("{s}: {}", e.0))?,
                            )
                        }
                    }
                }
            }
        };
        vals.push(v);
    }
    match vals.pop() {
        Some(Val::Tensors(t)) => Ok(t),
        _ => Err("the expression is not a tensor".into()),
    }
}

/// `(vocab_onehot t s w)`: true at column `t - s` of each row where `s <= t < s + w`.
fn vocab_onehot(t: &Tensor, s: i64, w: i64) -> Result<Tensor, String> {
    let width = usize::try_from(w).map_err(|_| "vocab_onehot of a negative width")?;
    let mut data = vec![0.0; t.data.len() * width];
    for (p, &i) in t.data.iter().enumerate() {
        let c = i as i64 - s;
        if (0..w).contains(&c) {
            data[p * width + c as usize] = 1.0;
        }
    }
    let mut shape = t.meta.shape.clone();
    shape.push(width);
    Ok(Tensor::new(Meta::new(DType::Bool, shape), data))
}

/// `(vocab_grad G t s n)`: row `r` sums the rows of `G` at the positions where `t = s + r`.
fn vocab_grad(grad: &Tensor, t: &Tensor, s: i64, n: i64) -> Result<Tensor, String> {
    let rows = usize::try_from(n).map_err(|_| "vocab_grad of a negative row count")?;
    let h = *grad
        .meta
        .shape
        .last()
        .ok_or("vocab_grad of a 0-d gradient")?;
    if grad.data.len() != t.data.len() * h {
        return Err("vocab_grad: the gradient is not one row per index".into());
    }
    let mut data = vec![0.0; rows * h];
    for (p, &i) in t.data.iter().enumerate() {
        let r = i as i64 - s;
        if (0..n).contains(&r) {
            let r = r as usize;
            for c in 0..h {
                data[r * h + c] += grad.data[p * h + c];
            }
        }
    }
    Ok(Tensor::new(Meta::new(grad.meta.dtype, vec![rows, h]), data))
}

/// Dropout under the same-mask assumption: an element's keep bit is a hash of its value, so the
/// mask travels with the element through concatenations, slices and layouts, exactly what
/// `assume: { dropout: same-mask }` states of the two programs' random masks.
fn same_mask_dropout(x: &Tensor, p: f64) -> Vec<Tensor> {
    let keep: Vec<f64> = x
        .data
        .iter()
        .map(|v| {
            let mut h = v.to_bits().wrapping_add(0x9E37_79B9_7F4A_7C15);
            h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            h ^= h >> 31;
            f64::from((h as f64 / u64::MAX as f64 >= p) as u8)
        })
        .collect();
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let out = x
        .data
        .iter()
        .zip(&keep)
        .map(|(v, k)| v * k * scale)
        .collect();
    vec![
        Tensor::new(x.meta.clone(), out),
        Tensor::new(Meta::new(DType::Bool, x.meta.shape.clone()), keep),
    ]
}

fn to_arg(v: Val, tensors: &mut Vec<Tensor>) -> Result<Arg, String> {
    Ok(match v {
        Val::Tensors(mut t) if t.len() == 1 => {
            tensors.push(t.remove(0));
            Arg::Value(ValueId::new(tensors.len() - 1, 0))
        }
        Val::Tensors(_) => return Err("a tuple as an argument".into()),
        Val::Arg(a) => a,
        Val::List(items) => Arg::List(
            items
                .into_iter()
                .map(|v| to_arg(v, tensors))
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn two() -> Vec<Arg> {
    vec![
        Arg::Value(ValueId::new(0, 0)),
        Arg::Value(ValueId::new(1, 0)),
    ]
}

fn call(reg: &Registry, op: &str, ts: &[Tensor], args: &[Arg]) -> Result<Vec<Tensor>, String> {
    reg.call(op, ts, args, &[])
        .map_err(|e| format!("{op}: {}", e.0))
}

/// A tensor of `dtype` and `shape` with values from `next` (integers below `bound` for
/// integer dtypes).
pub fn random_tensor(
    dtype: DType,
    shape: Vec<usize>,
    bound: i64,
    next: &mut dyn FnMut() -> f64,
) -> Tensor {
    let meta = shardproof_ops::Meta::new(dtype, shape);
    let n = meta.numel();
    let data = (0..n)
        .map(|_| {
            let x = next();
            if dtype.is_float() {
                x * 2.0 - 1.0
            } else if dtype == DType::Bool {
                (x < 0.5) as i64 as f64
            } else {
                (x * bound as f64).floor()
            }
        })
        .collect();
    Tensor::new(meta, data)
}

/// A deterministic stream of values in [0, 1) for test tensors, started from `seed` in (0, 1):
/// unit tests share it so that their random tensors are reproducible without a generator crate.
pub fn seeded_values(mut seed: f64) -> impl FnMut() -> f64 {
    move || {
        seed = (seed * 7.31 + 0.17) % 1.0;
        seed
    }
}

/// Whether two tensor tuples have the same shapes and values within 1e-9 relative (equal
/// infinities, such as masked scores, are equal values).
pub fn tensors_agree(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.meta == y.meta
                && x.data
                    .iter()
                    .zip(y.data.iter())
                    .all(|(p, q)| p == q || (p - q).abs() <= 1e-9 * (1.0 + q.abs()))
        })
}

/// Checks a saturated e-graph against the reference kernels: every node of every class with
/// more than one node (its children taken as their smallest terms) must evaluate to the
/// tensors of the class's first node. This is how a rewrite that merged unequal terms is
/// caught. Returns the number of nodes compared with their class's first; the error names the
/// two terms that differ, or the term that failed to evaluate.
pub fn classes_agree<N: Analysis<Term>>(
    eg: &EGraph<Term, N>,
    leaves: &HashMap<String, Tensor>,
) -> Result<usize, String> {
    let ex = Extractor::new(eg, AstSize);
    let mut compared = 0;
    for class in eg.classes().filter(|c| c.nodes.len() > 1) {
        let mut first: Option<(RecExpr<Term>, Vec<Tensor>)> = None;
        for node in &class.nodes {
            let mut e = RecExpr::default();
            let mut kids = Vec::new();
            for &k in node.children() {
                let mut map = Vec::new();
                for n in ex.find_best(k).1.as_ref() {
                    map.push(e.add(n.clone().map_children(|c| map[usize::from(c)])));
                }
                kids.extend(map.last().copied());
            }
            let mut i = 0;
            e.add(node.clone().map_children(|_| {
                i += 1;
                kids[i - 1]
            }));
            let got = eval(&e, leaves).map_err(|err| format!("{e}: {err}"))?;
            match &first {
                None => first = Some((e, got)),
                Some((e0, want)) => {
                    if !tensors_agree(&got, want) {
                        return Err(format!("{e0} != {e}"));
                    }
                    compared += 1;
                }
            }
        }
    }
    Ok(compared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::term::Shapes;

    /// The check the soundness tests rest on fails when unequal terms share a class.
    #[test]
    fn classes_agree_names_a_wrong_merge() {
        let mut leaves = HashMap::new();
        leaves.insert(
            "r0:x".to_string(),
            random_tensor(DType::F64, vec![2, 3], 8, &mut seeded_values(0.4)),
        );
        let mut eg: EGraph<Term, Shapes> = EGraph::new(Shapes::default());
        let x = eg.add_expr(&"%r0:x".parse().unwrap());
        let neg = eg.add_expr(&"(aten.neg.default %r0:x)".parse().unwrap());
        let twice = eg.add_expr(
            &"(aten.neg.default (aten.neg.default %r0:x))"
                .parse()
                .unwrap(),
        );
        eg.union(x, twice);
        eg.rebuild();
        assert_eq!(classes_agree(&eg, &leaves), Ok(1));
        eg.union(x, neg);
        eg.rebuild();
        let err = classes_agree(&eg, &leaves).unwrap_err();
        assert!(err.contains("!="), "{err}");
    }
}
