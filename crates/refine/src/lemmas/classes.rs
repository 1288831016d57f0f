//! Helpers over e-classes that every lemma family uses: reading a class (its shape, integers,
//! `cat`/`sum`/`scale`/`view` nodes, literals) and building the small terms lemmas add
//! (concatenations, slices, scales, fills, calls with some children replaced).

use super::{gcd128, Graph};
use crate::term::{is_op, sym, Data, Term, CAT, GET, LIST, SLICE, SUM};
use egg::{Id, Symbol};

/// The single-tensor shape of a class.
pub fn shape(g: &Graph, id: Id) -> Option<Vec<usize>> {
    g[id].data.shape().map(<[usize]>::to_vec)
}

pub(super) fn int(g: &Graph, id: Id) -> Option<i64> {
    match g[id].data {
        Data::Int(n) => Some(n),
        _ => None,
    }
}

pub(super) fn int_list(g: &Graph, id: Id) -> Option<Vec<i64>> {
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, kids) if is_op!(s, LIST) => kids.iter().map(|&k| int(g, k)).collect(),
        _ => None,
    })
}

/// The `cat` nodes of a class: (dim, pieces).
pub fn cats(g: &Graph, id: Id) -> Vec<(usize, Vec<Id>)> {
    let mut out: Vec<(usize, Vec<Id>)> = g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, kids) if is_op!(s, CAT) && kids.len() >= 3 => {
                Some((usize::try_from(int(g, kids[0])?).ok()?, kids[1..].to_vec()))
            }
            _ => None,
        })
        .collect();
    out.truncate(4);
    out
}

/// The `sum` nodes of a class (rank reductions): their operands.
pub fn sums(g: &Graph, id: Id) -> Vec<Vec<Id>> {
    let mut out: Vec<Vec<Id>> = g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, kids) if is_op!(s, SUM) => Some(kids.clone()),
            _ => None,
        })
        .collect();
    out.truncate(4);
    out
}

/// The classes holding a node of operator `sym` (egg's per-operator index).
pub(crate) fn classes_of(g: &Graph, sym: &str) -> Vec<Id> {
    g.classes_for_op(&Some(Symbol::from(sym)))
        .map(|it| it.map(|c| g.find(c)).collect())
        .unwrap_or_default()
}

/// `(p/q) (p2/q2)` in lowest terms, when that fits: factors that are exact binary fractions
/// (`1/sqrt(d)` is `m / 2^k`) meet their inverses only after reduction, their raw products
/// overflow.
pub(crate) fn product_reduced(a: (i64, i64), b: (i64, i64)) -> Option<(i64, i64)> {
    let n = i128::from(a.0) * i128::from(b.0);
    let d = i128::from(a.1) * i128::from(b.1);
    let r = gcd128(n, d) * d.signum();
    if r == 0 {
        return None;
    }
    Some((i64::try_from(n / r).ok()?, i64::try_from(d / r).ok()?))
}

/// The `scale` nodes of a class: (numerator, denominator, operand).
pub(super) fn scales(g: &Graph, id: Id) -> Vec<(i64, i64, Id)> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, kids) if is_op!(s, SCALE) && kids.len() == 3 => {
                Some((int(g, kids[0])?, int(g, kids[1])?, kids[2]))
            }
            _ => None,
        })
        .take(2)
        .collect()
}

pub(super) fn num(g: &mut Graph, n: i64) -> Id {
    g.add(Term::Num(n))
}

pub(super) fn op(g: &mut Graph, sym: &str, kids: Vec<Id>) -> Id {
    g.add(Term::Op(Symbol::from(sym), kids))
}

pub(super) fn cat(g: &mut Graph, d: usize, pieces: Vec<Id>) -> Id {
    if pieces.len() == 1 {
        return pieces[0];
    }
    let d = num(g, d as i64);
    g.add(Term::Op(
        sym!(CAT),
        std::iter::once(d).chain(pieces).collect(),
    ))
}

pub(super) fn slice(g: &mut Graph, d: usize, a: usize, b: usize, x: Id) -> Id {
    let full = shape(g, x).and_then(|s| s.get(d).copied());
    if a == 0 && full == Some(b) {
        return x;
    }
    let kids = vec![num(g, d as i64), num(g, a as i64), num(g, b as i64), x];
    g.add(Term::Op(sym!(SLICE), kids))
}

pub(super) fn int_list_node(g: &mut Graph, v: &[i64]) -> Id {
    let kids = v.iter().map(|&d| num(g, d)).collect();
    g.add(Term::Op(sym!(LIST), kids))
}

/// Whether `a.0 / a.1 == b.0 / b.1`, cross-multiplied in i128 (the i64 products of two scale
/// factors overflow, and a wrapped product could call two different factors equal).
pub(crate) fn same_ratio(a: (i64, i64), b: (i64, i64)) -> bool {
    i128::from(a.0) * i128::from(b.1) == i128::from(a.1) * i128::from(b.0)
}

/// Rational scale factor node: `(scale P Q x)` is `x * P / Q`.
pub const SCALE: &str = "scale";

/// `x * p / q`, the fraction reduced, folded into nothing when it is one.
pub fn scale(g: &mut Graph, p: i64, q: i64, x: Id) -> Id {
    // Any multiple of zeros is those zeros: scaling a zero fill anew would start a chain c x,
    // c^2 x, .. through the scale lemmas (ring attention's masked blocks are zero fills) until
    // the factor overflows.
    if zero_fill(g, x, 2).is_some() {
        return x;
    }
    // Reduced in i128: `i64::MIN / -1` overflows an i64 (a factor built by the scale lemmas'
    // products can reach it); a fraction that does not fit stays unreduced.
    let s = gcd128(i128::from(p), i128::from(q)) * i128::from(q.signum());
    let (p, q) = match (
        i64::try_from(i128::from(p) / s),
        i64::try_from(i128::from(q) / s),
    ) {
        (Ok(a), Ok(b)) if s != 0 => (a, b),
        _ => (p, q),
    };
    if p == q {
        return x;
    }
    let kids = vec![num(g, p), num(g, q), x];
    g.add(Term::Op(sym!(SCALE), kids))
}

/// The sizes of pieces along `d`.
pub(super) fn sizes(g: &Graph, pieces: &[Id], d: usize) -> Option<Vec<usize>> {
    pieces
        .iter()
        .map(|&p| shape(g, p)?.get(d).copied())
        .collect()
}

/// Rebuilds `root`'s call with children replaced.
pub(super) fn with_kids(sym: Symbol, kids: &[Id], replace: &[(usize, Id)]) -> Term {
    let mut k = kids.to_vec();
    for &(i, id) in replace {
        k[i] = id;
    }
    Term::Op(sym, k)
}

/// The transpose nodes of a class: (input, dim a, dim b).
pub(super) fn transposes(g: &Graph, id: Id) -> Vec<(Id, Id, Id)> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.transpose.int") => Some((k[0], k[1], k[2])),
            _ => None,
        })
        .collect()
}

/// A `list` class of integers.
/// The `list` node of these integers.
pub(crate) fn list(g: &mut Graph, v: &[usize]) -> Id {
    let ids: Vec<Id> = v.iter().map(|&n| num(g, n as i64)).collect();
    op(g, LIST, ids)
}

/// The fill value and the options (dtype, layout, device, pin_memory) of a zero fill in a
/// class, directly or under up to `depth` layout operators (a transposed or sliced zero block
/// is zeros too): what a zero fill of another shape is built from.
pub(super) fn zero_fill(g: &Graph, id: Id, depth: usize) -> Option<(Id, Vec<Id>)> {
    for n in &g[id].nodes {
        let Term::Op(s, k) = n else { continue };
        // Interned names (`is_op!`): resolving `s` takes the symbol table's lock, and the
        // zero-block lemmas call this on every operand they match (5% of llama3-70b-tiny's CPU).
        if is_op!(s, "aten.full.default") {
            if k.len() == 6 && is_zero(g, k[1]) {
                return Some((k[1], k[2..].to_vec()));
            }
        } else if is_op!(s, "aten.transpose.int")
            || is_op!(s, "aten.permute.default")
            || is_op!(s, "aten.view.default")
            || is_op!(s, "aten.expand.default")
            || is_op!(s, "aten.clone.default")
        {
            if depth > 0 && !k.is_empty() {
                if let Some(f) = zero_fill(g, k[0], depth - 1) {
                    return Some(f);
                }
            }
        } else if is_op!(s, SLICE) && depth > 0 && k.len() == 4 {
            if let Some(f) = zero_fill(g, k[3], depth - 1) {
                return Some(f);
            }
        }
    }
    None
}

/// Whether a class is the number zero (an integer or a float literal).
pub(super) fn is_zero(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Num(0) => true,
        Term::Op(s, k) if k.is_empty() => {
            matches!(
                s.as_str().strip_prefix("f:").map(str::parse::<f64>),
                Some(Ok(0.0))
            )
        }
        _ => false,
    })
}

/// The pieces of `id` along dim `d` of sizes `szs`: its own pieces when it is split so, smaller
/// fills when it is a constant fill, else slices.
pub(super) fn split_alike(g: &mut Graph, id: Id, d: usize, szs: &[usize]) -> Option<Vec<Id>> {
    if let Some((_, ps)) = cats(g, id)
        .into_iter()
        .find(|(e, ps)| *e == d && sizes(g, ps, d).as_deref() == Some(szs))
    {
        return Some(ps);
    }
    let shape_of = shape(g, id)?;
    if shape_of.get(d).copied() != Some(szs.iter().sum()) {
        return None;
    }
    let fill = g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.full.default") => Some(k.clone()),
        _ => None,
    });
    let mut off = 0;
    let mut pieces = Vec::new();
    for &n in szs {
        pieces.push(match &fill {
            Some(k) => {
                let mut s = shape_of.clone();
                s[d] = n;
                let l = list(g, &s);
                let mut k = k.clone();
                k[0] = l;
                g.add(Term::Op(sym!("aten.full.default"), k))
            }
            None => slice(g, d, off, off + n, id),
        });
        off += n;
    }
    Some(pieces)
}

/// Pieces of sizes `have` along `d`, grouped into consecutive runs of sizes `want` (each run a
/// cat of its pieces); `None` when the boundaries do not line up.
pub(super) fn regroup(
    g: &mut Graph,
    pieces: &[Id],
    d: usize,
    have: &[usize],
    want: &[usize],
) -> Option<Vec<Id>> {
    if want.len() >= have.len() {
        return None;
    }
    let mut out = Vec::new();
    let mut at = 0;
    for &w in want {
        let mut run = Vec::new();
        let mut filled = 0;
        while filled < w {
            filled += *have.get(at)?;
            run.push(pieces[at]);
            at += 1;
        }
        if filled != w {
            return None;
        }
        out.push(cat(g, d, run));
    }
    (at == pieces.len()).then_some(out)
}

/// Whether a class is the number one (an integer or a float literal).
pub(super) fn is_one(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Num(1) => true,
        Term::Op(s, k) if k.is_empty() => {
            matches!(
                s.as_str().strip_prefix("f:").map(str::parse::<f64>),
                Some(Ok(1.0))
            )
        }
        _ => false,
    })
}

/// The (first, second) children of the `sym` calls in a class.
pub(super) fn calls2(g: &Graph, id: Id, sym: &str) -> Vec<(Id, Id)> {
    let sym = Symbol::from(sym);
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if *s == sym && k.len() >= 2 => Some((k[0], k[1])),
            _ => None,
        })
        .take(3)
        .collect()
}

/// The two items of a `list` class.
pub(super) fn list_items(g: &Graph, id: Id) -> Option<[Id; 2]> {
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, LIST) && k.len() == 2 => Some([k[0], k[1]]),
        _ => None,
    })
}

/// Whether a class is `arange(0, n)` (integers 0..n).
pub(super) fn is_arange(g: &Graph, id: Id, n: usize) -> bool {
    g[id].nodes.iter().any(|node| match node {
        Term::Op(s, k) if is_op!(s, "aten.arange.start") && k.len() >= 2 => {
            int(g, k[0]) == Some(0) && int(g, k[1]) == Some(n as i64)
        }
        Term::Op(s, k) if is_op!(s, "aten.arange.default") && !k.is_empty() => {
            int(g, k[0]) == Some(n as i64)
        }
        _ => false,
    })
}

/// The gathers along the last dim in class `id` whose index is a column (`[.., 1]`), as
/// `(x, index, w)` with `w` the size of x's last dim: the target-logit pick written as a gather,
/// by hand in Megatron and by DTensor's `loss_parallel`.
pub(super) fn last_dim_column_gathers(g: &Graph, id: Id) -> Vec<(Id, Id, usize)> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.gather.default") && k.len() >= 3 => {
                let xs = shape(g, k[0])?;
                let w = *xs.last()?;
                let column = shape(g, k[2]).is_some_and(|s| s.last() == Some(&1));
                (int(g, k[1]) == Some(xs.len() as i64 - 1) && column).then_some((k[0], k[2], w))
            }
            _ => None,
        })
        .collect()
}

/// Megatron's shard-local index: `idx` = masked_fill(t - s, m, c) with 0 <= c < width, where
/// `mask_class` is m (or a view of m adding unit dims) and m = (t < s) | (t >= s + width).
/// Returns every (t, s) that fits.
pub(super) fn masked_shard_index(
    g: &Graph,
    idx: Id,
    width: usize,
    mask_class: Id,
) -> Vec<(Id, i64)> {
    let mut out = Vec::new();
    let mask_ok = |g: &Graph, m: Id| {
        g.find(m) == g.find(mask_class)
            || views(g, mask_class).iter().any(|&v| g.find(v) == g.find(m))
    };
    for n in &g[idx].nodes {
        let Term::Op(sym, k) = n else { continue };
        if !is_op!(sym, "aten.masked_fill.Scalar") || k.len() != 3 {
            continue;
        }
        let (shifted, m, c) = (k[0], k[1], k[2]);
        if !mask_ok(g, m) || !int(g, c).is_some_and(|c| (0..width as i64).contains(&c)) {
            continue;
        }
        // m = bitwise_or(lt(t, s), ge(t, e)) with e - s = width.
        for mn in &g[m].nodes {
            let Term::Op(ms, mk) = mn else { continue };
            if !is_op!(ms, "aten.bitwise_or.Tensor") {
                continue;
            }
            let (Some((t1, s)), Some((t2, e))) = (
                scalar_cmp(g, mk[0], "aten.lt.Scalar"),
                scalar_cmp(g, mk[1], "aten.ge.Scalar"),
            ) else {
                continue;
            };
            if g.find(t1) != g.find(t2) || e - s != width as i64 {
                continue;
            }
            // The shifted index is t itself (s = 0) or sub(t, s, 1).
            let shifted_ok = (s == 0 && g.find(shifted) == g.find(t1))
                || g[shifted].nodes.iter().any(|sn| match sn {
                    Term::Op(ss, sk)
                        if matches!(ss.as_str(), "aten.sub.Tensor" | "aten.sub.Scalar")
                            && sk.len() == 3 =>
                    {
                        g.find(sk[0]) == g.find(t1)
                            && int(g, sk[1]) == Some(s)
                            && int(g, sk[2]) == Some(1)
                    }
                    _ => false,
                });
            if shifted_ok {
                out.push((t1, s));
            }
        }
    }
    out
}

/// `(tensor, integer)` of a `sym(tensor, integer)` comparison node in a class.
fn scalar_cmp(g: &Graph, id: Id, sym: &str) -> Option<(Id, i64)> {
    let sym = Symbol::from(sym);
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if *s == sym && k.len() == 2 => Some((k[0], int(g, k[1])?)),
        _ => None,
    })
}

/// Whether a class is the literal `False`.
pub(super) fn is_false(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, "b:false")))
}

/// Whether a class is the literal `None`.
pub(super) fn is_none(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, k) if k.is_empty() && is_op!(s, "none")))
}

/// Whether a class is the literal `True`.
pub(super) fn is_true(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, "b:true")))
}

/// Output `k` of the multi-output call `sym(call_kids)` applied to each piece in place of its
/// first operand.
pub(super) fn output_per_piece(
    g: &mut Graph,
    sym: Symbol,
    call_kids: &[Id],
    k: Id,
    pieces: &[Id],
) -> Vec<Id> {
    output_per_piece_at(g, sym, call_kids, 0, k, pieces)
}

/// Output `k` of the multi-output call `sym(call_kids)` applied to each piece in place of its
/// operand `at`.
pub(super) fn output_per_piece_at(
    g: &mut Graph,
    sym: Symbol,
    call_kids: &[Id],
    at: usize,
    k: Id,
    pieces: &[Id],
) -> Vec<Id> {
    pieces
        .iter()
        .map(|&p| {
            let call = g.add(with_kids(sym, call_kids, &[(at, p)]));
            op(g, GET, vec![k, call])
        })
        .collect()
}

/// The inputs of the view nodes of a class.
pub(super) fn views(g: &Graph, id: Id) -> Vec<Id> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.view.default") => Some(k[0]),
            _ => None,
        })
        .take(3)
        .collect()
}
