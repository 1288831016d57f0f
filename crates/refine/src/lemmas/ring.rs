//! Lemmas for context parallelism: the sequence split into load-balanced chunks, attention
//! computed block by block around a ring and merged by the log-sum-exp rule.
//!
//! Under context parallelism a rank holds non-contiguous chunks of the sequence (chunks `i`
//! and `2 cp - 1 - i`), so a spec tensor is a concatenation of slices of several ranks'
//! tensors, and the ranks' own tensors are concatenations of their chunks. The lemmas here
//! name a chunk of a rank tensor as a slice of it, split position ranges (`arange`) at the
//! chunk boundaries other terms use, and relate causal masks of position ranges to
//! `triu` masks of index offsets.
//!
//! The attention lemmas take blocks of any rank from 3 up: `bmm` over `[b * heads, s, d]`
//! (the ranks' flash-attention blocks), and `matmul` over `[b, heads, s, d]` (the spec's
//! attention once tensor parallelism splits its heads, a dim of their own).

use super::{
    cat, cats, classes_of, int, int_list, is_one, is_zero, list, num, op, shape, sizes, slice,
    Graph, Lemma, SCALE,
};
use crate::term::{is_leaf, is_op, sym, Term, CAT, SLICE};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        arange_split(),
        view_through_rows(),
        mask_slices(),
        causal_mask_of_positions(),
        add_zero_fill(),
        softmax_from_logsumexp(),
        logsumexp_over_cat(),
        attention_drops_masked_keys(),
        attention_key_order(),
        lse_merge(),
        softmax_key_blocks(),
        logsumexp_key_blocks(),
        masked_block_probabilities(),
    ]
}

const SOFTMAX: &str = "aten._softmax.default";
const LOG_SOFTMAX: &str = "aten._log_softmax.default";
const LOGSUMEXP: &str = "aten.logsumexp.default";
const BMM: &str = "aten.bmm.default";
const MATMUL: &str = "aten.matmul.default";
const ADD: &str = "aten.add.Tensor";
const FULL: &str = "aten.full.default";
const TRIU: &str = "aten.triu.default";
const VIEW: &str = "aten.view.default";

/// The children of the `sym` nodes of a class (a few at most).
pub(super) fn calls(g: &Graph, id: Id, sym: &str) -> Vec<Vec<Id>> {
    // Interned once: comparing symbols is an integer compare, resolving one takes a lock.
    calls_op(g, id, Symbol::from(sym))
}

/// [`calls`] with the operator already interned: this file's own calls pass `sym!(NAME)`, so
/// that the walks run on every match (`finite_product`, `recomputes_probabilities`) take no
/// symbol-table lock per call.
pub(super) fn calls_op(g: &Graph, id: Id, sym: Symbol) -> Vec<Vec<Id>> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if *s == sym => Some(k.clone()),
            _ => None,
        })
        .take(4)
        .collect()
}

/// Whether a class holds a node of operator `sym` (checked without building anything: the
/// guard that keeps lemmas cheap on terms they do not match).
pub(super) fn has(g: &Graph, id: Id, sym: &str) -> bool {
    has_op(g, id, Symbol::from(sym))
}

/// [`has`] with the operator already interned (see [`calls_op`]).
pub(super) fn has_op(g: &Graph, id: Id, sym: Symbol) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if *s == sym))
}

/// Whether two classes are the same.
fn same(g: &Graph, a: Id, b: Id) -> bool {
    g.find(a) == g.find(b)
}

/// The float value of a literal class (`f:..` or an integer).
pub(super) fn float_literal(g: &Graph, id: Id) -> Option<f64> {
    g[id].nodes.iter().find_map(|n| match n {
        Term::Num(x) => Some(*x as f64),
        Term::Op(s, k) if k.is_empty() => s.as_str().strip_prefix("f:")?.parse().ok(),
        _ => None,
    })
}

/// A constant fill `full(size, v, dtype, layout, device, pin_memory)`: its shape, the fill
/// class and the option classes.
struct Fill {
    shape: Vec<usize>,
    value: Id,
    options: Vec<Id>,
}

fn fills(g: &Graph, id: Id) -> Vec<Fill> {
    calls_op(g, id, sym!(FULL))
        .into_iter()
        .filter(|k| k.len() == 6)
        .filter_map(|k| {
            let shape = int_list(g, k[0])?
                .into_iter()
                .map(|n| usize::try_from(n).ok())
                .collect::<Option<Vec<_>>>()?;
            Some(Fill {
                shape,
                value: k[1],
                options: k[2..].to_vec(),
            })
        })
        .collect()
}

/// A fill of `shape` with `value` and the options (dtype, layout, device, pin_memory) given.
pub(super) fn make_fill(g: &mut Graph, shape: &[usize], value: Id, options: &[Id]) -> Id {
    let l = list(g, shape);
    op(
        g,
        FULL,
        [l, value]
            .into_iter()
            .chain(options.iter().copied())
            .collect(),
    )
}

/// A `triu(full(..), k)` causal mask: the fill and the diagonal.
fn triu_fills(g: &Graph, id: Id) -> Vec<(Fill, i64)> {
    let mut out = Vec::new();
    for k in calls_op(g, id, sym!(TRIU)) {
        let Some(diag) = int(g, k[1]) else { continue };
        for f in fills(g, k[0]) {
            out.push((f, diag));
        }
    }
    out
}

fn make_triu(g: &mut Graph, shape: &[usize], value: Id, options: &[Id], diag: i64) -> Id {
    let f = make_fill(g, shape, value, options);
    let d = num(g, diag);
    op(g, TRIU, vec![f, d])
}

/// Whether a class holds an infinite constant directly (a fill, a masked fill or a mask of
/// infinities): the operands a product must not have for the product to be finite.
fn holds_infinity(g: &Graph, id: Id) -> bool {
    let infinite = |v: Id| float_literal(g, v).is_some_and(|x| !x.is_finite());
    fills(g, id).iter().any(|f| infinite(f.value))
        || triu_fills(g, id).iter().any(|(f, _)| infinite(f.value))
        || calls_op(g, id, sym!("aten.masked_fill.Scalar"))
            .iter()
            .any(|k| k.len() == 3 && infinite(k[2]))
}

/// Whether a class is a (scaled) matrix product of operands without infinite constants: in
/// exact arithmetic over the reals, a finite tensor.
fn finite_product(g: &Graph, id: Id, depth: usize) -> bool {
    if depth == 0 {
        return false;
    }
    // Operators compared as interned symbols (`is_op!`), not by name: `Symbol::as_str` takes
    // the symbol table's lock, and this walk runs on every node of every class it visits (3%
    // of the 16-rank DeepSeek case's CPU went to those lookups).
    g[id].nodes.iter().any(|n| match n {
        Term::Op(s, k) => {
            if (is_op!(s, BMM) || is_op!(s, "aten.mm.default") || is_op!(s, MATMUL)) && k.len() == 2
            {
                !holds_infinity(g, k[0]) && !holds_infinity(g, k[1])
            } else if is_op!(s, SCALE) && k.len() == 3 {
                finite_product(g, k[2], depth - 1)
            } else if is_op!(s, "aten.mul.Scalar") && k.len() == 2 {
                // A float factor the lowering leaves a multiplication by its literal (one too
                // small for a binary fraction with a 62-bit denominator) is finite as well.
                float_literal(g, k[1]).is_some_and(f64::is_finite)
                    && finite_product(g, k[0], depth - 1)
            } else if is_op!(s, CAT) && k.len() >= 2 {
                k[1..].iter().all(|&p| finite_product(g, p, depth - 1))
            } else if is_op!(s, SLICE) && k.len() == 4 {
                finite_product(g, k[3], depth - 1)
            } else {
                false
            }
        }
        Term::Num(_) => false,
    })
}

/// Whether every row (along the last dim) of a class has a finite entry, so that its
/// log-sum-exp is finite: a finite product, plus a mask that leaves every row's first entry
/// visible (`triu(.., k)` with `k >= 1`, or zeros); a concatenation along the last dim with
/// such a piece; row slices of such a tensor.
fn rows_finite(g: &Graph, id: Id, depth: usize) -> bool {
    if depth == 0 {
        return false;
    }
    if finite_product(g, id, 5) {
        return true;
    }
    let Some(last) = shape(g, id).and_then(|s| s.len().checked_sub(1)) else {
        return false;
    };
    // Symbols compared as in `finite_product`.
    g[id].nodes.iter().any(|n| match n {
        Term::Op(s, k) => {
            if is_op!(s, ADD) && k.len() == 3 && is_one(g, k[2]) {
                let mask_ok = |m: Id| {
                    fills(g, m).iter().any(|f| is_zero(g, f.value))
                        || triu_fills(g, m).iter().any(|(_, diag)| *diag >= 1)
                };
                (finite_product(g, k[0], 5) && mask_ok(k[1]))
                    || (finite_product(g, k[1], 5) && mask_ok(k[0]))
            } else if is_op!(s, CAT) && k.len() >= 2 {
                let d = int(g, k[0]).and_then(|d| usize::try_from(d).ok());
                if d == Some(last) {
                    k[1..].iter().any(|&p| rows_finite(g, p, depth - 1))
                } else {
                    k[1..].iter().all(|&p| rows_finite(g, p, depth - 1))
                }
            } else if is_op!(s, SLICE) && k.len() == 4 {
                int(g, k[0]).and_then(|d| usize::try_from(d).ok()) != Some(last)
                    && rows_finite(g, k[3], depth - 1)
            } else {
                false
            }
        }
        Term::Num(_) => false,
    })
}

/// Whether a class holds an implementation tensor, or a slice of one: a piece of such a class
/// has a clean expression as a slice of it.
fn names_a_tensor(g: &Graph, id: Id) -> bool {
    names_within(g, id, 3)
}

/// Whether a class holds an implementation tensor or a chain of at most `depth` slices of one
/// (the chunk of a chunk: a rank's attention block holds two query chunks by two key chunks).
fn names_within(g: &Graph, id: Id, depth: usize) -> bool {
    g[id].nodes.iter().any(|n| {
        is_leaf(n)
            || matches!(n, Term::Op(s, k) if is_op!(s, SLICE) && k.len() == 4
                && depth > 0 && names_within(g, k[3], depth - 1))
    })
}

/// Names every piece of a concatenation that is (or slices) an implementation tensor as a
/// slice of it: `x = cat_d(p_0, .., p_n)` implies `p_i = x[off_i : off_i + len_i]` along `d`.
///
/// A rank's tensor under context parallelism holds two chunks of the sequence, and the spec's
/// chunk is such a piece: this gives it a clean name. The engine runs it once after
/// saturation, before relations are extracted, rather than as a lemma: the names only serve
/// extraction, and as a rewrite the new slices would feed every slice lemma again on every
/// iteration. Returns whether it named anything. Pieces that already name a tensor keep their name (the engine records the slice
/// as a second name of such a piece when it passes relations on).
pub fn name_chunks(g: &mut Graph) -> bool {
    // A named piece may itself be a concatenation (of finer chunks): name those in turn.
    let mut named = false;
    for _ in 0..3 {
        if !name_chunks_once(g) {
            break;
        }
        named = true;
    }
    named
}

/// One pass of [`name_chunks`]: the pieces of the concatenations of classes named so far.
fn name_chunks_once(g: &mut Graph) -> bool {
    let mut todo: Vec<(Id, usize, Vec<Id>)> = Vec::new();
    for class in g.classes() {
        if !names_a_tensor(g, class.id) {
            continue;
        }
        for n in &class.nodes {
            let Term::Op(s, k) = n else { continue };
            if !is_op!(s, CAT) || k.len() < 3 {
                continue;
            }
            let Some(d) = int(g, k[0]).and_then(|d| usize::try_from(d).ok()) else {
                continue;
            };
            if k[1..].iter().any(|&p| !names_a_tensor(g, p)) {
                todo.push((class.id, d, k[1..].to_vec()));
            }
        }
    }
    if todo.is_empty() {
        return false;
    }
    // Whether a piece was unnamed before this pass: a piece of two tensors (a block of the
    // forward's probabilities that the backward recomputes) gets a name from each, so that
    // either travels on with the relation.
    let unnamed: Vec<Vec<bool>> = todo
        .iter()
        .map(|(_, _, pieces)| pieces.iter().map(|&p| !names_a_tensor(g, p)).collect())
        .collect();
    for ((x, d, pieces), unnamed) in todo.into_iter().zip(unnamed) {
        let Some(szs) = sizes(g, &pieces, d) else {
            continue;
        };
        let mut off = 0;
        for ((&p, &n), unnamed) in pieces.iter().zip(&szs).zip(unnamed) {
            if unnamed {
                let s = slice(g, d, off, off + n, x);
                g.union(p, s);
            }
            off += n;
        }
    }
    g.rebuild();
    true
}

/// The integer bounds of an `arange.start(a, b, ..)` node, with its other arguments.
fn arange_bounds(g: &Graph, n: &Term) -> Option<(i64, i64, Vec<Id>)> {
    match n {
        Term::Op(s, k) if is_op!(s, "aten.arange.start") && k.len() >= 2 => {
            Some((int(g, k[0])?, int(g, k[1])?, k[2..].to_vec()))
        }
        _ => None,
    }
}

/// A position range splits at the boundaries of the other ranges of the e-graph.
fn arange_split() -> Lemma {
    Lemma {
        name: "arange-split",
        doc: "arange(a, b) = cat_0(arange(a, c_1), arange(c_1, c_2), .., arange(c_k, b)) for a < c_1 < .. < c_k < b: the cuts are the bounds of the other aranges (same dtype and options) in the e-graph, so a whole sequence's positions meet a rank's chunks",
        roots: vec!["aten.arange.start".into()],
        examples: vec![(
            "(cat 0 (aten.arange.start 0 8 none none dev b:false) (aten.arange.start 2 4 none none dev b:false) (aten.arange.start 6 7 none none dev b:false))",
            &[],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(a), Some(b)) = (int(g, kids[0]), int(g, kids[1])) else {
                return vec![];
            };
            let rest = &kids[2..];
            let same_options =
                |k: &[Id]| k.len() == rest.len() && k.iter().zip(rest).all(|(x, y)| g.find(*x) == g.find(*y));
            let mut cuts: Vec<i64> = classes_of(g, "aten.arange.start")
                .into_iter()
                .flat_map(|c| g[c].nodes.iter())
                .filter_map(|n| arange_bounds(g, n))
                .filter(|(_, _, k)| same_options(k))
                .flat_map(|(x, y, _)| [x, y])
                .filter(|&c| a < c && c < b)
                .collect();
            if cuts.is_empty() {
                return vec![];
            }
            cuts.sort_unstable();
            cuts.dedup();
            let bounds: Vec<i64> = std::iter::once(a).chain(cuts).chain([b]).collect();
            let pieces: Vec<Id> = bounds
                .windows(2)
                .map(|w| {
                    let (x, y) = (g.add(Term::Num(w[0])), g.add(Term::Num(w[1])));
                    op(g, "aten.arange.start", [x, y].into_iter().chain(rest.iter().copied()).collect())
                })
                .collect();
            vec![cat(g, 0, pieces)]
        }),
    }
}

/// Row-wise operators and products through views that keep the rows.
fn view_through_rows() -> Lemma {
    Lemma {
        name: "view-through-rows",
        doc: "views that keep the last dims: view(softmax(x, last), s) = softmax(view(x, s), last) (log-softmax alike) when s keeps the last dim; view(f(a, m), s) = f(view(a, s), m) for f in add/sub/mul and m broadcast over the leading dims s regroups (its dims are the last dims of both shapes); view(matmul(a, b), [B, m, n]) = bmm(view(a, [B, m, k]), view(b, [B, k, n])) for equal batch dims flattening to B",
        roots: vec![VIEW.into()],
        examples: vec![
            ("(aten.view.default (aten._softmax.default %r0:a 2 b:false) (list 6 4))", &[("a", "f64[2,3,4]")]),
            ("(aten.view.default (aten.add.Tensor %r0:a %r0:m 1) (list 6 4 4))", &[("a", "f64[2,3,4,4]"), ("m", "f64[4,4]")]),
            ("(aten.view.default (aten.matmul.default %r0:a %r0:b) (list 6 2 5))", &[("a", "f64[2,3,2,4]"), ("b", "f64[2,3,4,5]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(target), Some(src)) = (shape(g, eclass), shape(g, kids[0])) else {
                return vec![];
            };
            if target.is_empty() || src.is_empty() || target.last() != src.last() {
                return vec![];
            }
            let candidates: Vec<Term> = g[kids[0]]
                .nodes
                .iter()
                .filter(|n| match n {
                    Term::Op(s, k) => match s.as_str() {
                        SOFTMAX | LOG_SOFTMAX => k.len() == 3,
                        "aten.matmul.default" => src.len() >= 4,
                        // A broadcast operand of lower rank.
                        ADD | "aten.sub.Tensor" | "aten.mul.Tensor" => k[..2].iter().any(|&x| {
                            shape(g, x).is_some_and(|xs| xs.len() < src.len())
                        }),
                        _ => false,
                    },
                    Term::Num(_) => false,
                })
                .cloned()
                .collect();
            let mut out = Vec::new();
            for n in candidates {
                let Term::Op(s, k) = n else { continue };
                match s.as_str() {
                    SOFTMAX | LOG_SOFTMAX if k.len() == 3 => {
                        if int(g, k[1]) != Some(src.len() as i64 - 1) {
                            continue;
                        }
                        let v = op(g, VIEW, vec![k[0], kids[1]]);
                        let d = num(g, target.len() as i64 - 1);
                        out.push(g.add(Term::Op(s, vec![v, d, k[2]])));
                    }
                    ADD | "aten.sub.Tensor" | "aten.mul.Tensor" if k.len() >= 2 => {
                        for (whole, broadcast) in [(0, 1), (1, 0)] {
                            let (Some(ws), Some(bs)) = (shape(g, k[whole]), shape(g, k[broadcast])) else {
                                continue;
                            };
                            let r = bs.len();
                            if ws != src || r >= src.len() || r > target.len() {
                                continue;
                            }
                            if bs[..] != src[src.len() - r..] || bs[..] != target[target.len() - r..] {
                                continue;
                            }
                            let v = op(g, VIEW, vec![k[whole], kids[1]]);
                            let mut nk = k.clone();
                            nk[whole] = v;
                            out.push(g.add(Term::Op(s, nk)));
                        }
                    }
                    "aten.matmul.default" if k.len() == 2 => {
                        let (Some(a), Some(b)) = (shape(g, k[0]), shape(g, k[1])) else { continue };
                        let r = src.len();
                        if r < 4 || a.len() != r || b.len() != r || a[..r - 2] != src[..r - 2] || b[..r - 2] != src[..r - 2] {
                            continue;
                        }
                        let batch: usize = src[..r - 2].iter().product();
                        if target != [batch, src[r - 2], src[r - 1]] {
                            continue;
                        }
                        let (la, lb) = (list(g, &[batch, a[r - 2], a[r - 1]]), list(g, &[batch, b[r - 2], b[r - 1]]));
                        let va = op(g, VIEW, vec![k[0], la]);
                        let vb = op(g, VIEW, vec![k[1], lb]);
                        out.push(op(g, BMM, vec![va, vb]));
                    }
                    _ => {}
                }
            }
            out
        }),
    }
}

/// Constant masks restricted to a block are constant masks of the block.
fn mask_slices() -> Lemma {
    Lemma {
        name: "mask-slices",
        doc: "a slice of full(s, v) is full(s', v); triu(full(s, v), k) sliced at offset a along the row dim is triu(full(s', v), k + a), along the column dim triu(full(s', v), k - a), along a batch dim triu(full(s', v), k); triu(full([.., n, m], v), k) is full(v) when k <= 1 - n and zeros when k >= m",
        roots: vec![SLICE.into(), TRIU.into()],
        examples: vec![
            ("(slice 1 1 3 (aten.triu.default (aten.full.default (list 4 4) f:-inf dt:f64 none dev b:false) 1))", &[]),
            ("(slice 0 2 4 (aten.triu.default (aten.full.default (list 4 3) f:2.0 dt:f64 none dev b:false) 0))", &[]),
            ("(slice 0 0 1 (aten.full.default (list 2 3) f:2.0 dt:f64 none dev b:false))", &[]),
            ("(cat 0 (aten.triu.default (aten.full.default (list 2 3) f:2.0 dt:f64 none dev b:false) 3) (aten.triu.default (aten.full.default (list 2 3) f:2.0 dt:f64 none dev b:false) -1))", &[]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let x = if kids.len() == 4 { kids[3] } else { kids[0] };
            if !has_op(g, x, sym!(FULL)) && !has_op(g, x, sym!(TRIU)) {
                return vec![];
            }
            let mut out = Vec::new();
            if kids.len() == 4 {
                let (Some(d), Some(a), Some(b)) = (int(g, kids[0]), int(g, kids[1]), int(g, kids[2])) else {
                    return vec![];
                };
                let Ok(d) = usize::try_from(d) else { return vec![] };
                for f in fills(g, kids[3]) {
                    if d < f.shape.len() {
                        let mut sh = f.shape.clone();
                        sh[d] = (b - a) as usize;
                        out.push(make_fill(g, &sh, f.value, &f.options));
                    }
                }
                for (f, diag) in triu_fills(g, kids[3]) {
                    let r = f.shape.len();
                    if r < 2 || d >= r {
                        continue;
                    }
                    let nd = if d == r - 2 {
                        diag + a
                    } else if d == r - 1 {
                        diag - a
                    } else {
                        diag
                    };
                    let mut sh = f.shape.clone();
                    sh[d] = (b - a) as usize;
                    out.push(make_triu(g, &sh, f.value, &f.options, nd));
                }
                return out;
            }
            let Some(diag) = int(g, kids[1]) else { return vec![] };
            for f in fills(g, kids[0]) {
                let r = f.shape.len();
                if r < 2 {
                    continue;
                }
                let (n, m) = (f.shape[r - 2] as i64, f.shape[r - 1] as i64);
                if diag <= 1 - n {
                    out.push(kids[0]);
                } else if diag >= m {
                    let integer = g[f.value].nodes.iter().any(|x| matches!(x, Term::Num(_)));
                    let zero = if integer { num(g, 0) } else { op(g, "f:0.0", vec![]) };
                    out.push(make_fill(g, &f.shape, zero, &f.options));
                }
            }
            out
        }),
    }
}

/// The start of a position range `view(arange(c, c + len), shape)` viewed to `shape`.
fn positions_start(g: &Graph, id: Id, len: usize, view_shape: &[i64]) -> Option<i64> {
    calls_op(g, id, sym!(VIEW)).into_iter().find_map(|k| {
        if int_list(g, k[1]).as_deref() != Some(view_shape) {
            return None;
        }
        g[k[0]].nodes.iter().find_map(|n| {
            let (a, b, _) = arange_bounds(g, n)?;
            (b - a == len as i64).then_some(a)
        })
    })
}

/// The causal mask of two position ranges is a `triu` mask of their offset.
fn causal_mask_of_positions() -> Lemma {
    Lemma {
        name: "causal-mask-of-positions",
        doc: "masked_fill(zeros([n, m]), k > q, v) with keys k = view(arange(c, c + m), [1, m]) and queries q = view(arange(a, a + n), [n, 1]) is triu(full([n, m], v), a - c + 1) (k >= q: a - c); lt/le with the operands swapped alike",
        roots: vec!["aten.masked_fill.Scalar".into()],
        examples: vec![
            ("(aten.masked_fill.Scalar (aten.full.default (list 2 3) f:0.0 dt:f64 none dev b:false) (aten.gt.Tensor (aten.view.default (aten.arange.start 4 7 none none dev b:false) (list 1 3)) (aten.view.default (aten.arange.start 5 7 none none dev b:false) (list 2 1))) f:-5.0)", &[]),
            ("(aten.masked_fill.Scalar (aten.full.default (list 2 2) f:0.0 dt:f64 none dev b:false) (aten.lt.Tensor (aten.view.default (aten.arange.start 0 2 none none dev b:false) (list 2 1)) (aten.view.default (aten.arange.start 6 8 none none dev b:false) (list 1 2))) f:-inf)", &[]),
            ("(aten.masked_fill.Scalar (aten.full.default (list 2 2) f:0.0 dt:f64 none dev b:false) (aten.ge.Tensor (aten.view.default (aten.arange.start 1 3 none none dev b:false) (list 1 2)) (aten.view.default (aten.arange.start 1 3 none none dev b:false) (list 2 1))) f:3.0)", &[]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !has_op(g, kids[0], sym!(FULL)) {
                return vec![];
            }
            let mut out = Vec::new();
            for f in fills(g, kids[0]) {
                if f.shape.len() != 2 || !is_zero(g, f.value) {
                    continue;
                }
                let (n, m) = (f.shape[0], f.shape[1]);
                // (later operand, earlier operand, strict): masked where later > (>=) earlier.
                let mut forms = Vec::new();
                for (sym, swap, strict) in [
                    ("aten.gt.Tensor", false, true),
                    ("aten.ge.Tensor", false, false),
                    ("aten.lt.Tensor", true, true),
                    ("aten.le.Tensor", true, false),
                ] {
                    for k in calls(g, kids[1], sym) {
                        if k.len() == 2 {
                            let (later, earlier) = if swap { (k[1], k[0]) } else { (k[0], k[1]) };
                            forms.push((later, earlier, strict));
                        }
                    }
                }
                for (later, earlier, strict) in forms {
                    let Some(c) = positions_start(g, later, m, &[1, m as i64]) else { continue };
                    let Some(a) = positions_start(g, earlier, n, &[n as i64, 1]) else { continue };
                    let diag = a - c + i64::from(strict);
                    out.push(make_triu(g, &f.shape, kids[2], &f.options, diag));
                }
            }
            out
        }),
    }
}

/// Adding zeros changes nothing.
fn add_zero_fill() -> Lemma {
    Lemma {
        name: "add-zero-fill",
        doc: "x + full(s, 0) = x when the sum has x's shape (a mask block with nothing masked)",
        roots: vec![ADD.into()],
        examples: vec![
            ("(aten.add.Tensor %r0:a (aten.full.default (list 3) f:0.0 dt:f64 none dev b:false) 1)", &[("a", "f64[2,3]")]),
            ("(aten.add.Tensor (aten.full.default (list 2 3) f:0.0 dt:f64 none dev b:false) %r0:a 1)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !has_op(g, kids[0], sym!(FULL)) && !has_op(g, kids[1], sym!(FULL)) {
                return vec![];
            }
            let Some(out) = shape(g, eclass) else { return vec![] };
            let zero = |g: &Graph, id: Id| fills(g, id).iter().any(|f| is_zero(g, f.value));
            let mut res = Vec::new();
            if zero(g, kids[1]) && shape(g, kids[0]).as_deref() == Some(&out[..]) {
                res.push(kids[0]);
            }
            if is_one(g, kids[2]) && zero(g, kids[0]) && shape(g, kids[1]).as_deref() == Some(&out[..]) {
                res.push(kids[1]);
            }
            res
        }),
    }
}

/// The last dim of a class's shape.
fn last_dim(g: &Graph, id: Id) -> Option<usize> {
    shape(g, id)?.len().checked_sub(1)
}

/// Whether `dims` (a list class) is exactly the last dim of a tensor of rank `last + 1`.
fn is_last_dim_list(g: &Graph, dims: Id, last: usize) -> bool {
    int_list(g, dims).is_some_and(|d| {
        d.len() == 1 && (d[0] == last as i64 || d[0] == last as i64 - (last as i64 + 1))
    })
}

/// The log-sum-exps over the last dim with kept dims in a class: their operands.
fn logsumexps(g: &Graph, id: Id) -> Vec<Id> {
    calls_op(g, id, sym!(LOGSUMEXP))
        .into_iter()
        .filter(|k| {
            k.len() == 3
                && super::is_true(g, k[2])
                && last_dim(g, k[0]).is_some_and(|l| is_last_dim_list(g, k[1], l))
        })
        .map(|k| k[0])
        .collect()
}

/// Softmax written with its log-sum-exp.
fn softmax_from_logsumexp() -> Lemma {
    Lemma {
        name: "softmax-from-logsumexp",
        doc: "exp(x - logsumexp(x, [last], keepdim=True)) = softmax(x, last) (flash attention's probabilities)",
        roots: vec!["aten.exp.default".into()],
        examples: vec![(
            "(aten.exp.default (aten.sub.Tensor %r0:x (aten.logsumexp.default %r0:x (list 1) b:true) 1))",
            &[("x", "f64[2,3]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !has_op(g, kids[0], sym!("aten.sub.Tensor")) {
                return vec![];
            }
            let mut out = Vec::new();
            for k in calls_op(g, kids[0], sym!("aten.sub.Tensor")) {
                if k.len() != 3 || !is_one(g, k[2]) || !has_op(g, k[1], sym!(LOGSUMEXP)) {
                    continue;
                }
                let Some(last) = last_dim(g, k[0]) else { continue };
                if logsumexps(g, k[1]).iter().any(|&x| same(g, x, k[0])) {
                    let d = num(g, last as i64);
                    let no = op(g, "b:false", vec![]);
                    out.push(op(g, SOFTMAX, vec![k[0], d, no]));
                }
            }
            out
        }),
    }
}

/// Log-sum-exp along unpartitioned dims works piece by piece.
fn logsumexp_over_cat() -> Lemma {
    Lemma {
        name: "logsumexp-over-cat",
        doc: "logsumexp(cat_d(x_i), dims, keep) with d not reduced is the cat of the pieces' log-sum-exps (along d, renumbered when dims are dropped)",
        roots: vec![LOGSUMEXP.into()],
        examples: vec![
            ("(aten.logsumexp.default (cat 0 %r0:a %r1:a) (list 1) b:true)", &[("a", "f64[2,3]")]),
            ("(aten.logsumexp.default (cat 1 %r0:a %r1:a) (list 0) b:false)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(rank) = shape(g, kids[0]).map(|s| s.len() as i64) else { return vec![] };
            let Some(dims) = int_list(g, kids[1]) else { return vec![] };
            let dims: Vec<i64> = dims.iter().map(|&d| if d < 0 { d + rank } else { d }).collect();
            let keep = super::is_true(g, kids[2]);
            let sym = sym!(LOGSUMEXP);
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                if dims.contains(&(d as i64)) {
                    continue;
                }
                let parts: Vec<Id> = pieces
                    .iter()
                    .map(|&p| g.add(Term::Op(sym, vec![p, kids[1], kids[2]])))
                    .collect();
                let nd = if keep { d } else { d - dims.iter().filter(|&&x| x < d as i64).count() };
                out.push(cat(g, nd, parts));
            }
            out
        }),
    }
}

/// Attention of a class: `bmm(softmax(cat_last(S_j)), V)` (or `matmul` with any number of
/// leading batch dims) read as key blocks, (S_j, V_j): the scores split along their last dim,
/// the values alike along their key dim (second to last).
fn key_blocks(g: &Graph, p: Id, v: Id) -> Vec<(Vec<Id>, Vec<Id>)> {
    if !has_op(g, p, sym!(SOFTMAX)) || !has_op(g, v, sym!(CAT)) {
        return vec![];
    }
    let mut out = Vec::new();
    for k in calls_op(g, p, sym!(SOFTMAX)) {
        let (Some(ss), Some(vs)) = (shape(g, k[0]), shape(g, v)) else {
            continue;
        };
        // Under tensor parallelism the heads are a dim of their own (`[b, heads, seq, d]`),
        // so attention is any rank from 3 up, the scores' and the values' rank alike.
        let rank = ss.len();
        if rank < 3 || vs.len() != rank || !softmax_over_last(g, &k, rank) {
            continue;
        }
        let (score_keys, value_keys) = (rank - 1, rank - 2);
        // Every concatenation of both (not the first few): cat-flatten regroups runs of pieces
        // into the concatenations present, so a class holds many groupings and the scores'
        // and the values' alike may be anywhere among them.
        let values = cats_along(g, v, value_keys);
        for pieces in cats_along(g, k[0], score_keys) {
            let Some(szs) = sizes(g, &pieces, score_keys) else {
                continue;
            };
            // Values split alike (no new slices: the lemma only reads what is there).
            for vp in &values {
                if sizes(g, vp, value_keys).as_deref() == Some(&szs[..]) {
                    out.push((pieces.clone(), vp.clone()));
                }
            }
        }
    }
    // The finest splits first (the blocks the ranks compute).
    out.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
    out.truncate(4);
    out
}

/// Whether the children of a `_softmax` node take it over the last dim of a rank-`rank`
/// tensor, in the input's dtype (`half_to_float` false).
fn softmax_over_last(g: &Graph, softmax_kids: &[Id], rank: usize) -> bool {
    softmax_kids.len() == 3
        && int(g, softmax_kids[1]) == Some(rank as i64 - 1)
        && super::is_false(g, softmax_kids[2])
}

/// The pieces of every concatenation along `d` in a class.
/// The pieces of every concatenation along `d` in a class.
pub(super) fn cats_along(g: &Graph, id: Id, d: usize) -> Vec<Vec<Id>> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, CAT) && k.len() >= 3 && int(g, k[0]) == Some(d as i64) => {
                Some(k[1..].to_vec())
            }
            _ => None,
        })
        .collect()
}

/// `bmm(softmax(cat_2(S_j)), cat_1(V_j))` for 3-D blocks, `matmul(softmax(cat_{r-1}(S_j)),
/// cat_{r-2}(V_j))` for rank-`r` blocks with more than one batch dim (`bmm` takes one only).
fn attend(g: &mut Graph, s: &[Id], v: &[Id]) -> Option<Id> {
    let rank = shape(g, *s.first()?)?.len();
    if rank < 3 || s.len() != v.len() || !joinable(g, s, rank - 1) || !joinable(g, v, rank - 2) {
        return None;
    }
    let scores = cat(g, rank - 1, s.to_vec());
    let values = cat(g, rank - 2, v.to_vec());
    let d = num(g, rank as i64 - 1);
    let no = op(g, "b:false", vec![]);
    let p = op(g, SOFTMAX, vec![scores, d, no]);
    Some(op(g, if rank == 3 { BMM } else { MATMUL }, vec![p, values]))
}

/// Whether pieces of one rank concatenate along `d`: every other dim agrees.
fn joinable(g: &Graph, pieces: &[Id], d: usize) -> bool {
    let Some(first) = pieces.first().and_then(|&p| shape(g, p)) else {
        return false;
    };
    pieces.iter().all(|&p| {
        shape(g, p).is_some_and(|s| {
            s.len() == first.len()
                && s.iter()
                    .zip(&first)
                    .enumerate()
                    .all(|(i, (a, b))| i == d || a == b)
        })
    })
}

/// Whether a block of scores is masked entirely: `x + full(-inf)` with `x` finite.
pub(super) fn fully_masked(g: &Graph, id: Id) -> bool {
    calls_op(g, id, sym!(ADD)).iter().any(|k| {
        let minus_inf = |m: Id| {
            fills(g, m)
                .iter()
                .any(|f| float_literal(g, f.value) == Some(f64::NEG_INFINITY))
        };
        k.len() == 3
            && is_one(g, k[2])
            && ((minus_inf(k[1]) && finite_product(g, k[0], 5))
                || (minus_inf(k[0]) && finite_product(g, k[1], 5)))
    })
}

/// Keys masked for every query add nothing to attention.
fn attention_drops_masked_keys() -> Lemma {
    Lemma {
        name: "attention-drops-masked-keys",
        doc: "bmm(softmax(cat_2(S_j)), cat_1(V_j)) (or matmul(softmax(cat_{r-1}(S_j)), cat_{r-2}(V_j)) over rank-r blocks) is the same without the key blocks whose scores are x + full(-inf) (x finite), as long as one block remains: their probabilities are zero",
        roots: vec![BMM.into(), MATMUL.into()],
        examples: vec![(
            "(aten.bmm.default (aten._softmax.default (cat 2 (aten.bmm.default %r0:q %r0:k) (aten.add.Tensor (aten.bmm.default %r0:q %r1:k) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1)) 2 b:false) (cat 1 %r0:v %r1:v))",
            &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]"), ("v", "f64[2,3,5]")],
        ), (
            "(aten.matmul.default (aten._softmax.default (cat 3 (aten.matmul.default %r0:q %r0:k) (aten.add.Tensor (aten.matmul.default %r0:q %r1:k) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1)) 3 b:false) (cat 2 %r0:v %r1:v))",
            &[("q", "f64[2,2,2,4]"), ("k", "f64[2,2,4,3]"), ("v", "f64[2,2,3,5]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for (s, v) in key_blocks(g, kids[0], kids[1]) {
                let keep: Vec<usize> = (0..s.len()).filter(|&j| !fully_masked(g, s[j])).collect();
                if keep.is_empty() || keep.len() == s.len() {
                    continue;
                }
                let ks: Vec<Id> = keep.iter().map(|&j| s[j]).collect();
                let kv: Vec<Id> = keep.iter().map(|&j| v[j]).collect();
                out.extend(attend(g, &ks, &kv));
            }
            out
        }),
    }
}

/// Attention does not depend on the order of its key blocks.
fn attention_key_order() -> Lemma {
    Lemma {
        name: "attention-key-order",
        doc: "bmm(softmax(cat_2(S_j)), cat_1(V_j)) (or matmul(softmax(cat_{r-1}(S_j)), cat_{r-2}(V_j)) over rank-r blocks) is unchanged when the key blocks (S_j, V_j) are permuted together; the blocks are put in a canonical order (by e-class) so that the same blocks in any order meet",
        roots: vec![BMM.into(), MATMUL.into()],
        examples: vec![(
            "(aten.bmm.default (aten._softmax.default (cat 2 (aten.neg.default %r0:a) %r0:a) 2 b:false) (cat 1 %r0:v %r1:v))",
            &[("a", "f64[2,3,2]"), ("v", "f64[2,2,4]")],
        ), (
            "(aten.matmul.default (aten._softmax.default (cat 3 (aten.neg.default %r0:a) %r0:a) 3 b:false) (cat 2 %r0:v %r1:v))",
            &[("a", "f64[2,2,3,2]"), ("v", "f64[2,2,2,4]")],
        ), (
            "(aten.matmul.default (aten._softmax.default (cat 2 (aten.neg.default %r0:a) %r0:a) 2 b:false) (cat 1 %r0:v %r1:v))",
            &[("a", "f64[2,3,2]"), ("v", "f64[2,2,4]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for (s, v) in key_blocks(g, kids[0], kids[1]) {
                let key = |j: usize| (g.find(s[j]), g.find(v[j]));
                let mut order: Vec<usize> = (0..s.len()).collect();
                order.sort_by_key(|&j| key(j));
                if order.iter().enumerate().all(|(i, &j)| i == j) {
                    continue;
                }
                let ss: Vec<Id> = order.iter().map(|&j| s[j]).collect();
                let vv: Vec<Id> = order.iter().map(|&j| v[j]).collect();
                out.extend(attend(g, &ss, &vv));
            }
            out
        }),
    }
}

/// The (log-sum-exp, shift) of an `exp(l - m)` class.
fn shifted_exps(g: &Graph, e: Id) -> Vec<(Id, Id)> {
    let mut out = Vec::new();
    for k in calls_op(g, e, sym!("aten.exp.default")) {
        for s in calls_op(g, k[0], sym!("aten.sub.Tensor")) {
            if s.len() == 3 && is_one(g, s[2]) {
                out.push((s[0], s[1]));
            }
        }
    }
    out
}

/// Whether `m` is `maximum(a, b)` (either order).
pub(super) fn is_maximum_of(g: &Graph, m: Id, a: Id, b: Id) -> bool {
    calls_op(g, m, sym!("aten.maximum.default"))
        .iter()
        .any(|k| {
            k.len() == 2
                && ((same(g, k[0], a) && same(g, k[1], b))
                    || (same(g, k[0], b) && same(g, k[1], a)))
        })
}

/// The (e1, e2, l1, l2) of a normalizer `t = e1 + e2` with `e_i = exp(l_i - m)`,
/// `m = maximum(l1, l2)`.
pub(super) fn normalizer_parts(g: &Graph, t: Id) -> Vec<(Id, Id, Id, Id)> {
    let mut out = Vec::new();
    for k in calls_op(g, t, sym!(ADD)) {
        if k.len() != 3 || !is_one(g, k[2]) {
            continue;
        }
        for (l1, m1) in shifted_exps(g, k[0]) {
            for (l2, m2) in shifted_exps(g, k[1]) {
                if same(g, m1, m2) && is_maximum_of(g, m1, l1, l2) {
                    out.push((k[0], k[1], l1, l2));
                }
            }
        }
    }
    out
}

/// The score blocks `S` with `l = logsumexp(S, [last], True)` whose rows all have a finite
/// entry.
fn finite_lse_scores(g: &Graph, l: Id) -> Vec<Id> {
    logsumexps(g, l)
        .into_iter()
        .filter(|&s| rows_finite(g, s, 6))
        .collect()
}

/// The (scores, values) of an attention output `bmm(softmax(S, last), V)` or
/// `matmul(softmax(S, last), V)` (scores and values of the same rank, 3 or more).
fn attentions(g: &Graph, o: Id) -> Vec<(Id, Id)> {
    let mut out = Vec::new();
    for k in calls_op(g, o, sym!(BMM))
        .into_iter()
        .chain(calls_op(g, o, sym!(MATMUL)))
    {
        let Some(rank) = shape(g, k[0]).map(|s| s.len()) else {
            continue;
        };
        if rank < 3 || shape(g, k[1]).map(|s| s.len()) != Some(rank) {
            continue;
        }
        for sm in calls_op(g, k[0], sym!(SOFTMAX)) {
            if softmax_over_last(g, &sm, rank) {
                out.push((sm[0], k[1]));
            }
        }
    }
    out
}

/// The (o, w) operands of the products in a class.
fn products(g: &Graph, id: Id) -> Vec<(Id, Id)> {
    calls_op(g, id, sym!("aten.mul.Tensor"))
        .into_iter()
        .filter(|k| k.len() == 2)
        .flat_map(|k| [(k[0], k[1]), (k[1], k[0])])
        .collect()
}

/// The numerator of `n / t` in a class, for a given `t`.
fn quotients(g: &Graph, id: Id) -> Vec<(Id, Id)> {
    calls_op(g, id, sym!("aten.div.Tensor"))
        .into_iter()
        .filter(|k| k.len() == 2)
        .map(|k| (k[0], k[1]))
        .collect()
}

/// The log-sum-exp merge of ring attention.
fn lse_merge() -> Lemma {
    Lemma {
        name: "lse-merge",
        doc: "with l_i = logsumexp(S_i, [last], True) finite (every row of S_i has a finite entry), m = maximum(l_1, l_2), e_i = exp(l_i - m), t = e_1 + e_2: o_1 * (e_1 / t) + o_2 * (e_2 / t) = bmm(softmax(cat_2(S_1, S_2)), cat_1(V_1, V_2)) for o_i = bmm(softmax(S_i), V_i) (matmul and cat along the last and second-to-last dims for blocks of any rank from 3), and m + log(t) = logsumexp(cat_last(S_1, S_2), [last], True): attention over two key blocks from each block's attention and log-sum-exp",
        roots: vec![ADD.into()],
        examples: vec![
            ("(aten.add.Tensor (aten.mul.Tensor (aten.bmm.default (aten._softmax.default (aten.bmm.default %r0:q %r0:k) 2 b:false) %r0:v) (aten.div.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) 1))) (aten.mul.Tensor (aten.bmm.default (aten._softmax.default (aten.bmm.default %r0:q %r1:k) 2 b:false) %r1:v) (aten.div.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) 1))) 1)", &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]"), ("v", "f64[2,3,5]")]),
            ("(aten.add.Tensor (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) (aten.log.default (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)) 1)) 1)", &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]")]),
            ("(aten.add.Tensor (aten.mul.Tensor (aten.matmul.default (aten._softmax.default (aten.matmul.default %r0:q %r0:k) 3 b:false) %r0:v) (aten.div.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) 1))) (aten.mul.Tensor (aten.matmul.default (aten._softmax.default (aten.matmul.default %r0:q %r1:k) 3 b:false) %r1:v) (aten.div.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) 1))) 1)", &[("q", "f64[2,2,2,4]"), ("k", "f64[2,2,4,3]"), ("v", "f64[2,2,3,5]")]),
            ("(aten.add.Tensor (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) (aten.log.default (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true) (aten.maximum.default (aten.logsumexp.default (aten.matmul.default %r0:q %r0:k) (list 3) b:true) (aten.logsumexp.default (aten.matmul.default %r0:q %r1:k) (list 3) b:true)) 1)) 1)) 1)", &[("q", "f64[2,2,2,4]"), ("k", "f64[2,2,4,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let products_pair = has_op(g, kids[0], sym!("aten.mul.Tensor")) && has_op(g, kids[1], sym!("aten.mul.Tensor"));
            let max_plus_log = (has_op(g, kids[0], sym!("aten.maximum.default")) && has_op(g, kids[1], sym!("aten.log.default")))
                || (has_op(g, kids[1], sym!("aten.maximum.default")) && has_op(g, kids[0], sym!("aten.log.default")));
            if !is_one(g, kids[2]) || !(products_pair || max_plus_log) {
                return vec![];
            }
            let mut out = Vec::new();
            // The output: o_1 * (e_1 / t) + o_2 * (e_2 / t).
            let mut found = Vec::new();
            for (o1, w1) in products(g, kids[0]) {
                for (o2, w2) in products(g, kids[1]) {
                    for (n1, t1) in quotients(g, w1) {
                        for (n2, t2) in quotients(g, w2) {
                            if !same(g, t1, t2) {
                                continue;
                            }
                            for (e1, e2, l1, l2) in normalizer_parts(g, t1) {
                                if same(g, e1, n1) && same(g, e2, n2) {
                                    found.push((o1, o2, l1, l2));
                                }
                            }
                        }
                    }
                }
            }
            for (o1, o2, l1, l2) in found.into_iter().take(4) {
                let (s1s, s2s) = (finite_lse_scores(g, l1), finite_lse_scores(g, l2));
                let a1: Vec<(Id, Id)> = attentions(g, o1).into_iter().filter(|(s, _)| s1s.iter().any(|&x| same(g, x, *s))).collect();
                let a2: Vec<(Id, Id)> = attentions(g, o2).into_iter().filter(|(s, _)| s2s.iter().any(|&x| same(g, x, *s))).collect();
                for &(s1, v1) in a1.iter().take(2) {
                    for &(s2, v2) in a2.iter().take(2) {
                        out.extend(attend(g, &[s1, s2], &[v1, v2]));
                    }
                }
            }
            // The log-sum-exp: m + log(t).
            for (m, lg) in [(kids[0], kids[1]), (kids[1], kids[0])] {
                for k in calls_op(g, lg, sym!("aten.log.default")) {
                    for (_, _, l1, l2) in normalizer_parts(g, k[0]) {
                        if !is_maximum_of(g, m, l1, l2) {
                            continue;
                        }
                        let (s1s, s2s) = (finite_lse_scores(g, l1), finite_lse_scores(g, l2));
                        for &s1 in s1s.iter().take(2) {
                            for &s2 in s2s.iter().take(2) {
                                let Some(last) = last_dim(g, s1) else { continue };
                                if !joinable(g, &[s1, s2], last) {
                                    continue;
                                }
                                let scores = cat(g, last, vec![s1, s2]);
                                let dims = list(g, &[last]);
                                let yes = op(g, "b:true", vec![]);
                                out.push(op(g, LOGSUMEXP, vec![scores, dims, yes]));
                            }
                        }
                    }
                }
            }
            out
        }),
    }
}

/// A softmax over key blocks is, block by block, the exponential of the block's scores minus
/// the log-sum-exp over every block.
fn softmax_key_blocks() -> Lemma {
    Lemma {
        name: "softmax-key-blocks",
        doc: "softmax(cat_last(S_j), last) = cat_last(exp(S_j - logsumexp(cat_last(S_j), [last], True))) for blocks of rank 3 or more (the finest split present): the spec's attention probabilities in the blocks the ring ranks compute, against their merged log-sum-exp",
        roots: vec![SOFTMAX.into()],
        examples: vec![
            // Beside recomputed probabilities (the lemma's guard: ring attention's backward).
            ("(cat 2 (aten._softmax.default (cat 2 (aten.bmm.default %r0:q %r0:k) (aten.bmm.default %r0:q %r1:k)) 2 b:false) (aten.exp.default (aten.sub.Tensor (aten.bmm.default %r0:q %r0:k) (aten.neg.default (aten.logsumexp.default (aten.bmm.default %r0:q %r1:k) (list 2) b:true)) 1)))", &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]")]),
            ("(cat 3 (aten._softmax.default (cat 3 (aten.neg.default %r0:a) %r0:a %r1:a) 3 b:false) (aten.exp.default (aten.sub.Tensor %r0:a (aten.neg.default (aten.logsumexp.default %r1:a (list 3) b:true)) 1)))", &[("a", "f64[2,2,3,2]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            // Only where the ranks recompute probabilities against a log-sum-exp of other
            // scores (ring attention's backward): elsewhere a softmax stays whole and this
            // costs a look-up over the `exp` classes.
            if !has_op(g, kids[0], sym!(CAT)) || !recomputes_probabilities(g) {
                return vec![];
            }
            let Some(rank) = shape(g, kids[0]).map(|s| s.len()) else { return vec![] };
            if rank < 3 || !softmax_over_last(g, kids, rank) {
                return vec![];
            }
            let last = rank - 1;
            // The finest split only: the ranks' blocks are the smallest pieces.
            let Some(pieces) = cats_along(g, kids[0], last).into_iter().max_by_key(|p| p.len()) else {
                return vec![];
            };
            let dims = list(g, &[last]);
            let yes = op(g, "b:true", vec![]);
            let lse = op(g, LOGSUMEXP, vec![kids[0], dims, yes]);
            let one = num(g, 1);
            let blocks: Vec<Id> = pieces
                .iter()
                .map(|&s| {
                    let d = op(g, "aten.sub.Tensor", vec![s, lse, one]);
                    op(g, "aten.exp.default", vec![d])
                })
                .collect();
            vec![cat(g, last, blocks)]
        }),
    }
}

/// Whether the e-graph holds `exp(S - l)` for scores `S` (more than one key) and a row
/// statistic `l` (one entry per row) that is not itself a log-sum-exp: a block's
/// probabilities under a log-sum-exp gathered elsewhere, as ring attention's backward
/// recomputes them (from the saved, merged one). The forward's blocks, and the pieces
/// rewrites cut them into, subtract a log-sum-exp; the merge weights have one entry per row.
fn recomputes_probabilities(g: &Graph) -> bool {
    classes_of(g, "aten.exp.default").into_iter().any(|e| {
        calls_op(g, e, sym!("aten.exp.default")).iter().any(|k| {
            calls_op(g, k[0], sym!("aten.sub.Tensor")).iter().any(|s| {
                s.len() == 3
                    && shape(g, s[0])
                        .and_then(|x| x.last().copied())
                        .is_some_and(|n| n > 1)
                    && shape(g, s[1]).and_then(|x| x.last().copied()) == Some(1)
                    && !has_op(g, s[1], sym!(LOGSUMEXP))
            })
        })
    })
}

/// A log-sum-exp over key blocks ignores fully masked blocks and the blocks' order.
fn logsumexp_key_blocks() -> Lemma {
    Lemma {
        name: "logsumexp-key-blocks",
        doc: "logsumexp(cat_last(S_j), [last], keep) is the same over the blocks that are not x + full(-inf) (x finite; as long as one remains: exp(-inf) adds nothing), in a canonical order (by e-class: the sum runs over every entry of a row), for blocks of rank 3 or more: the spec's row log-sum-exp meets the ranks' merged one, which runs over the visible blocks in ring order",
        roots: vec![LOGSUMEXP.into()],
        examples: vec![
            ("(aten.logsumexp.default (cat 2 (aten.bmm.default %r0:q %r0:k) (aten.add.Tensor (aten.bmm.default %r0:q %r1:k) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1)) (list 2) b:true)", &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]")]),
            ("(aten.logsumexp.default (cat 2 (aten.neg.default %r0:a) %r0:a %r1:a) (list 2) b:true)", &[("a", "f64[2,3,2]")]),
            ("(aten.logsumexp.default (cat 3 (aten.add.Tensor (aten.matmul.default %r0:q %r1:k) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1) (aten.matmul.default %r0:q %r0:k)) (list -1) b:false)", &[("q", "f64[2,2,2,4]"), ("k", "f64[2,2,4,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !has_op(g, kids[0], sym!(CAT)) {
                return vec![];
            }
            let Some(last) = last_dim(g, kids[0]) else { return vec![] };
            if last < 2 || !is_last_dim_list(g, kids[1], last) {
                return vec![];
            }
            let mut out = Vec::new();
            for pieces in cats_along(g, kids[0], last).into_iter().take(4) {
                let mut keep: Vec<Id> = pieces.iter().copied().filter(|&p| !fully_masked(g, p)).collect();
                if keep.is_empty() {
                    continue;
                }
                keep.sort_by_key(|&p| g.find(p));
                if keep.len() == pieces.len() && keep.iter().zip(&pieces).all(|(a, b)| same(g, *a, *b)) {
                    continue;
                }
                let x = if keep.len() == 1 { keep[0] } else { cat(g, last, keep) };
                out.push(g.add(Term::Op(sym!(LOGSUMEXP), vec![x, kids[1], kids[2]])));
            }
            out
        }),
    }
}

/// Whether a class is a finite log-sum-exp: over scores whose every row has a finite entry.
pub(super) fn finite_lse(g: &Graph, l: Id) -> bool {
    calls_op(g, l, sym!(LOGSUMEXP)).iter().any(|k| {
        k.len() == 3
            && last_dim(g, k[0]).is_some_and(|d| is_last_dim_list(g, k[1], d))
            && rows_finite(g, k[0], 6)
    })
}

/// A fully masked block's probabilities are zeros.
fn masked_block_probabilities() -> Lemma {
    Lemma {
        name: "masked-block-probabilities",
        doc: "exp((x + full(-inf)) - l) = zeros (the exp's shape) for x a finite product and l a finite log-sum-exp (over scores whose every row has a finite entry): -inf - l = -inf, exp(-inf) = 0",
        roots: vec!["aten.exp.default".into()],
        examples: vec![(
            "(aten.exp.default (aten.sub.Tensor (aten.add.Tensor (aten.bmm.default %r0:q %r1:k) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1) (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) 1))",
            &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]")],
        ), (
            // Scores multiplied by a float literal (`1/sqrt(2)`), not a `scale` node.
            "(aten.exp.default (aten.sub.Tensor (aten.add.Tensor (aten.mul.Scalar (aten.bmm.default %r0:q %r1:k) f:0.7071067811865475) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1) (aten.logsumexp.default (aten.mul.Scalar (aten.bmm.default %r0:q %r0:k) f:0.7071067811865475) (list 2) b:true) 1))",
            &[("q", "f64[2,2,2]"), ("k", "f64[2,2,3]")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !has_op(g, kids[0], sym!("aten.sub.Tensor")) {
                return vec![];
            }
            let Some(out_shape) = shape(g, eclass) else { return vec![] };
            let mut out = Vec::new();
            for k in calls_op(g, kids[0], sym!("aten.sub.Tensor")) {
                if k.len() != 3 || !is_one(g, k[2]) || !has_op(g, k[0], sym!(ADD)) || !fully_masked(g, k[0]) {
                    continue;
                }
                if !finite_lse(g, k[1]) {
                    continue;
                }
                // The fill's options (dtype, device) from the mask.
                let options = calls_op(g, k[0], sym!(ADD))
                    .into_iter()
                    .flat_map(|a| a.into_iter().take(2))
                    .flat_map(|m| fills(g, m))
                    .find(|f| float_literal(g, f.value) == Some(f64::NEG_INFINITY))
                    .map(|f| f.options);
                let Some(options) = options else { continue };
                let zero = op(g, "f:0.0", vec![]);
                out.push(make_fill(g, &out_shape, zero, &options));
                break;
            }
            out
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{classes_agree, eval, random_tensor, seeded_values};
    use crate::term::Shapes;
    use egg::RecExpr;
    use shardproof_ir::DType;
    use shardproof_ops::Meta;
    use std::collections::HashMap;

    /// The slice names `name_chunks` gives to the pieces of a rank tensor's concatenation hold
    /// the pieces' values.
    #[test]
    fn chunk_names_are_the_pieces() {
        let mut next = seeded_values(0.25);
        let mut leaves = HashMap::new();
        leaves.insert(
            "r0:a".to_string(),
            random_tensor(DType::F64, vec![2, 3], 8, &mut next),
        );
        leaves.insert(
            "r0:b".to_string(),
            random_tensor(DType::F64, vec![1, 3], 8, &mut next),
        );
        let pieces: RecExpr<Term> = "(cat 0 (aten.neg.default %r0:a) (aten.exp.default %r0:b))"
            .parse()
            .unwrap();
        let x = eval(&pieces, &leaves).unwrap().remove(0);
        leaves.insert("r0:x".to_string(), x);
        let mut g = Graph::new(Shapes::default());
        for (name, shape) in [
            ("%r0:a", vec![2, 3]),
            ("%r0:b", vec![1, 3]),
            ("%r0:x", vec![3, 3]),
        ] {
            g.analysis
                .leaves
                .insert(name.into(), Meta::new(DType::F64, shape));
        }
        let whole = g.add_expr(&pieces);
        let leaf = g.add_expr(&"%r0:x".parse().unwrap());
        g.union(whole, leaf);
        g.rebuild();
        assert!(name_chunks(&mut g));
        let checked = classes_agree(&g, &leaves).unwrap();
        assert!(checked >= 3, "the pieces were named");
    }

    /// The pieces of a named piece (a chunk of a chunk) get slices of slices as names, and
    /// they hold the pieces' values.
    #[test]
    fn nested_chunk_names_are_the_pieces() {
        let mut next = seeded_values(0.5);
        let mut leaves = HashMap::new();
        for (name, shape) in [
            ("r0:a", vec![2, 1]),
            ("r0:b", vec![2, 2]),
            ("r0:c", vec![1, 3]),
        ] {
            leaves.insert(
                name.to_string(),
                random_tensor(DType::F64, shape, 8, &mut next),
            );
        }
        let pieces: RecExpr<Term> =
            "(cat 0 (cat 1 (aten.neg.default %r0:a) (aten.exp.default %r0:b)) (aten.neg.default %r0:c))"
                .parse()
                .unwrap();
        let x = eval(&pieces, &leaves).unwrap().remove(0);
        leaves.insert("r0:x".to_string(), x);
        let mut g = Graph::new(Shapes::default());
        for (name, shape) in [
            ("%r0:a", vec![2, 1]),
            ("%r0:b", vec![2, 2]),
            ("%r0:c", vec![1, 3]),
            ("%r0:x", vec![3, 3]),
        ] {
            g.analysis
                .leaves
                .insert(name.into(), Meta::new(DType::F64, shape));
        }
        let whole = g.add_expr(&pieces);
        let leaf = g.add_expr(&"%r0:x".parse().unwrap());
        g.union(whole, leaf);
        g.rebuild();
        assert!(name_chunks(&mut g));
        let inner: RecExpr<Term> = "(aten.exp.default %r0:b)".parse().unwrap();
        let inner = g.add_expr(&inner);
        assert!(names_a_tensor(&g, inner), "the chunk of a chunk was named");
        classes_agree(&g, &leaves).unwrap();
    }
}
