//! Lemmas for the sequence chunks a rank holds under context parallelism.
//!
//! A cp rank holds chunks `i` and `2cp-1-i` of the sequence, concatenated, so the spec's
//! activations `[b, s, ..]` are concatenations of slices of the ranks' tensors (the engine's
//! `name_chunks`). Where the spec flattens `[b, s]` into token rows (the MoE router and
//! experts), a chunk's tokens interleave with the other chunks'; rows.rs and moe.rs run a
//! token-wise operator piece by piece, each piece the tokens of one slice of a rank tensor. A
//! token-wise operator on the tokens of a slice is the same slice of the operator on all the
//! tokens, and the rank computes exactly that call on its own tensor. The lemma looks the
//! rank's call up and never builds it: on models without cp nothing matches, and a call built
//! speculatively on a rank tensor would only grow the graph.

use super::{cats, ew, int, int_list, is_true, list, node_sym, op, shape, sizes, slice, symbols};
use super::{views, with_kids, Graph, Lemma, GET, SUM};
use crate::term::{is_op, sym, Term, CAT, LIST, SLICE};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        tokenwise_over_chunk(),
        contraction_over_chunks(),
        sum_over_chunk(),
    ]
}

/// A class whose token dim holds the tokens of a slice: `view(slice(x, d, a, b), s)` (or the
/// slice itself), where dim `at` of `s` flattens the slice's dims `i..j` and `i < d < j` (the
/// chunk's tokens interleave with the other chunks').
struct Chunk {
    /// The class's token dim.
    at: usize,
    /// The sliced tensor `x`.
    source: Id,
    /// The extents of `x`'s dims `i..j` (all its tokens).
    lead: Vec<usize>,
    /// Which of `lead` the slice cuts (`d - i`).
    split: usize,
    /// The slice's range along it.
    range: (usize, usize),
}

impl Chunk {
    /// Whether `other` holds the same tokens of its source (same flattening, same slice).
    fn aligned(&self, other: &Chunk) -> bool {
        self.lead == other.lead && self.split == other.split && self.range == other.range
    }

    /// The number of tokens of the whole source.
    fn whole_tokens(&self) -> usize {
        self.lead.iter().product()
    }

    /// The number of tokens of the chunk.
    fn chunk_tokens(&self) -> usize {
        let mut l = self.lead.clone();
        l[self.split] = self.range.1 - self.range.0;
        l.iter().product()
    }
}

/// The product of a slice of extents.
fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// The chunk forms of a class (at most a few): slices in the class itself or under its views.
fn chunks(g: &Graph, id: Id) -> Vec<Chunk> {
    let Some(s) = shape(g, id) else { return vec![] };
    let mut out = Vec::new();
    for v in std::iter::once(id).chain(views(g, id)) {
        let Some(ps) = shape(g, v) else { continue };
        for n in &g[v].nodes {
            let Term::Op(sym, k) = n else { continue };
            if !is_op!(sym, SLICE) || k.len() != 4 {
                continue;
            }
            let (Some(d), Some(a), Some(b)) = (int(g, k[0]), int(g, k[1]), int(g, k[2])) else {
                continue;
            };
            let (Ok(d), Ok(a), Ok(b)) =
                (usize::try_from(d), usize::try_from(a), usize::try_from(b))
            else {
                continue;
            };
            let Some(xs) = shape(g, k[3]) else { continue };
            if let Some(c) = chunk_of(&s, &ps, &xs, d, (a, b), k[3]) {
                out.push(c);
            }
        }
    }
    out.truncate(3);
    out
}

/// The chunk form of `view(slice(x, d, a, b), s)`, the slice of shape `ps`, `x` of shape `xs`.
fn chunk_of(
    s: &[usize],
    ps: &[usize],
    xs: &[usize],
    d: usize,
    range: (usize, usize),
    source: Id,
) -> Option<Chunk> {
    if d >= ps.len() || xs.len() != ps.len() || product(s) != product(ps) || range.0 >= range.1 {
        return None;
    }
    // The slice cuts dim d only.
    let same_elsewhere = xs
        .iter()
        .zip(ps)
        .enumerate()
        .all(|(k, (x, p))| k == d || x == p);
    if !same_elsewhere || ps[d] != range.1 - range.0 || range.1 > xs[d] {
        return None;
    }
    for at in 0..s.len() {
        let (before, through) = (product(&s[..at]), product(&s[..=at]));
        // The innermost start and outermost end of the slice's dims flattening into s[at].
        let Some(i) = (0..=d).rev().find(|&i| product(&ps[..i]) == before) else {
            continue;
        };
        let Some(j) = (d + 1..=ps.len()).find(|&j| product(&ps[..j]) == through) else {
            continue;
        };
        if i == d && j - i > 1 {
            // The slice cuts the outermost of several flattened dims: a block of whole rows,
            // which `view-over-cat` and the row lemmas already relate (gpt2's sequence-first
            // chunks).
            return None;
        }
        return Some(Chunk {
            at,
            source,
            lead: xs[i..j].to_vec(),
            split: d - i,
            range,
        });
    }
    None
}

/// A list class of these integers, when the graph has one.
pub(super) fn lookup_list(g: &Graph, v: &[usize]) -> Option<Id> {
    let ids = v
        .iter()
        .map(|&n| g.lookup(Term::Num(n as i64)))
        .collect::<Option<Vec<Id>>>()?;
    g.lookup(Term::Op(sym!(LIST), ids))
}

/// `x` viewed as `target`, when the graph has that class: `x` itself, the input of one of its
/// views, or an existing view of either.
fn existing_view(g: &Graph, x: Id, target: &[usize]) -> Option<Id> {
    if shape(g, x).as_deref() == Some(target) {
        return Some(x);
    }
    let inputs = views(g, x);
    if let Some(&u) = inputs
        .iter()
        .find(|&&u| shape(g, u).as_deref() == Some(target))
    {
        return Some(u);
    }
    let l = lookup_list(g, target)?;
    std::iter::once(x)
        .chain(inputs)
        .find_map(|u| g.lookup(Term::Op(sym!("aten.view.default"), vec![u, l])))
}

/// `x` viewed as `target` (`x` itself when it has that shape).
fn view_to(g: &mut Graph, x: Id, target: &[usize]) -> Id {
    if shape(g, x).as_deref() == Some(target) {
        return x;
    }
    let l = list(g, target);
    op(g, "aten.view.default", vec![x, l])
}

/// How a token-wise call carries its tokens: which operands hold them (and in which dim), the
/// output's token dim, and the operand that lists the output's sizes (`expand`).
struct TokenPlan {
    /// (operand position, its token dim).
    operands: Vec<(usize, usize)>,
    /// The output's token dim.
    out_at: usize,
    /// The position of a sizes list naming the output's token count.
    sizes: Option<usize>,
}

/// A dim index made non-negative.
fn norm(d: i64, rank: usize) -> Option<usize> {
    usize::try_from(if d < 0 { d + rank as i64 } else { d }).ok()
}

/// The operand positions a chunk form is looked for in, for a call `sym`.
fn drivers(sym: &str) -> Vec<usize> {
    if let Some(e) = ew(sym) {
        return e.1.to_vec();
    }
    match sym {
        "aten.scatter.src" | "aten.scatter.value" | "aten.gather.default" => vec![2],
        _ => vec![0],
    }
}

/// The token plan of `sym(kids)` (output shape `out`) when operand `driver` holds tokens in
/// dim `at`; `None` when the call is not token-wise along that dim.
fn plan(
    g: &Graph,
    sym: &str,
    kids: &[Id],
    out: &[usize],
    driver: usize,
    at: usize,
) -> Option<TokenPlan> {
    let rank = |k: Id| shape(g, k).map(|s| s.len());
    let simple = |out_at| {
        Some(TokenPlan {
            operands: vec![(driver, at)],
            out_at,
            sizes: None,
        })
    };
    if let Some(e) = ew(sym) {
        let out_at = at + out.len().checked_sub(rank(kids[driver])?)?;
        let mut operands = Vec::new();
        for &t in e.1 {
            let ts = shape(g, kids[t])?;
            // Fewer dims, or one along the tokens: broadcast, every token takes it whole.
            let Some(a) = (out_at + ts.len()).checked_sub(out.len()) else {
                continue;
            };
            if ts[a] == 1 {
                continue;
            }
            if ts[a] != out[out_at] {
                return None;
            }
            operands.push((t, a));
        }
        return Some(TokenPlan {
            operands,
            out_at,
            sizes: None,
        });
    }
    match sym {
        "aten.mm.default" => (at == 0).then_some(())?,
        "aten.bmm.default" => (at == 1).then_some(())?,
        _ => {}
    }
    match sym {
        "aten.mm.default" | "aten.bmm.default" => simple(at),
        "aten._softmax.default" | "aten._log_softmax.default" => {
            let dim = norm(int(g, kids[1])?, rank(kids[0])?)?;
            (dim != at).then_some(())?;
            simple(at)
        }
        "aten.sum.dim_IntList" => {
            let r = rank(kids[0])?;
            let dims = int_list(g, kids[1])?
                .into_iter()
                .map(|d| norm(d, r))
                .collect::<Option<Vec<usize>>>()?;
            if dims.is_empty() || dims.contains(&at) {
                return None;
            }
            let kept = is_true(g, kids[2]);
            simple(if kept {
                at
            } else {
                at - dims.iter().filter(|&&d| d < at).count()
            })
        }
        "aten.scatter.src" | "aten.scatter.value" | "aten.gather.default" => {
            let dim = norm(int(g, kids[1])?, rank(kids[0])?)?;
            if dim == at {
                return None;
            }
            let mut operands = vec![(0, at), (2, at)];
            if sym == "aten.scatter.src" {
                operands.push((3, at));
            }
            Some(TokenPlan {
                operands,
                out_at: at,
                sizes: None,
            })
        }
        "aten.expand.default" => {
            let out_at = at + out.len().checked_sub(rank(kids[0])?)?;
            // The tokens themselves are not expanded.
            if shape(g, kids[0])?[at] != out[out_at] {
                return None;
            }
            Some(TokenPlan {
                operands: vec![(0, at)],
                out_at,
                sizes: Some(1),
            })
        }
        "aten.transpose.int" => {
            let r = rank(kids[0])?;
            let (a, b) = (norm(int(g, kids[1])?, r)?, norm(int(g, kids[2])?, r)?);
            simple(if at == a {
                b
            } else if at == b {
                a
            } else {
                at
            })
        }
        _ => None,
    }
}

/// Operand `id` over all the tokens of the chunk `form`'s sources, its token dim `at`: its own
/// aligned chunk's source, or a constant fill of the whole shape; looked up, never built.
fn whole_operand(g: &Graph, id: Id, at: usize, form: &Chunk) -> Option<Id> {
    let mut whole = shape(g, id)?;
    whole[at] = form.whole_tokens();
    if let Some(c) = chunks(g, id)
        .into_iter()
        .find(|c| c.at == at && c.aligned(form))
    {
        return existing_view(g, c.source, &whole);
    }
    if let Some(w) = copies_over_tokens(g, id, at, form, &whole) {
        return Some(w);
    }
    // A fill is a fill of the whole shape (the scatters' zeros).
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.full.default") => {
            let mut k = k.clone();
            k[0] = lookup_list(g, &whole)?;
            g.lookup(Term::Op(*s, k))
        }
        _ => None,
    })
}

/// An operand constant along the chunk's tokens, `view(cat_e(c, .., c), s)` with one copy of
/// `c` per token (a per-sequence value expanded over the sequence, the auxiliary loss's
/// gradient): over all the tokens it is the same copies, one per token of the whole, when the
/// graph has that cat.
fn copies_over_tokens(g: &Graph, id: Id, at: usize, form: &Chunk, whole: &[usize]) -> Option<Id> {
    let s = shape(g, id)?;
    let mut lead = form.lead.clone();
    lead[form.split] = form.range.1 - form.range.0;
    let mut unflat = s[..at].to_vec();
    unflat.extend_from_slice(&lead);
    unflat.extend_from_slice(&s[at + 1..]);
    let e = at + form.split;
    for v in std::iter::once(id).chain(views(g, id)) {
        if shape(g, v).as_deref() != Some(&unflat[..]) {
            continue;
        }
        for n in &g[v].nodes {
            let Term::Op(sym, k) = n else { continue };
            if !is_op!(sym, CAT)
                || k.len() != lead[form.split] + 1
                || int(g, k[0]) != Some(e as i64)
            {
                continue;
            }
            let c = g.find(k[1]);
            if k[2..].iter().any(|&p| g.find(p) != c)
                || shape(g, c).and_then(|cs| cs.get(e).copied()) != Some(1)
            {
                continue;
            }
            let copies = std::iter::once(k[0])
                .chain(std::iter::repeat_n(c, form.lead[form.split]))
                .collect();
            let all = g.lookup(Term::Op(sym!(CAT), copies))?;
            return existing_view(g, all, whole);
        }
    }
    None
}

/// The chunk `form` of the rank's result `y` (all the tokens, token dim `out_at`), as the
/// class shape `out`: `view(slice(view(y, unflattened), ..), out)`.
fn chunk_of_result(g: &mut Graph, y: Id, form: &Chunk, out: &[usize], out_at: usize) -> Option<Id> {
    if out.get(out_at) != Some(&form.chunk_tokens()) {
        return None;
    }
    let mut unflat = out[..out_at].to_vec();
    unflat.extend_from_slice(&form.lead);
    unflat.extend_from_slice(&out[out_at + 1..]);
    let v = view_to(g, y, &unflat);
    // y is also the view back of its unflattened form. Once the chunks' slices tile that form
    // (`cat-of-adjacent-slices`), the rank's own later calls on y see its chunks as
    // interleaved rows and split piece by piece as the spec's calls on the chunks do (the
    // loss summed over them).
    if let Some(ys) = shape(g, y) {
        let back = view_to(g, v, &ys);
        g.union(back, y);
    }
    let s = slice(g, out_at + form.split, form.range.0, form.range.1, v);
    Some(view_to(g, s, out))
}

/// The rank's call over all the tokens for a call over a chunk of them, as the chunk of its
/// result; `None` unless the rank's call is in the graph.
fn over_chunk(g: &mut Graph, sym: Symbol, kids: &[Id], out: &[usize]) -> Option<Id> {
    let s = sym.as_str();
    for driver in drivers(s) {
        for form in chunks(g, kids[driver]) {
            let Some(p) = plan(g, s, kids, out, driver, form.at) else {
                continue;
            };
            let replaced: Option<Vec<(usize, Id)>> = p
                .operands
                .iter()
                .map(|&(pos, at)| Some((pos, whole_operand(g, kids[pos], at, &form)?)))
                .collect();
            let Some(mut replaced) = replaced else {
                continue;
            };
            if let Some(pos) = p.sizes {
                let mut sizes = out.to_vec();
                sizes[p.out_at] = form.whole_tokens();
                let Some(l) = lookup_list(g, &sizes) else {
                    continue;
                };
                replaced.push((pos, l));
            }
            let Some(y) = g.lookup(with_kids(sym, kids, &replaced)) else {
                continue;
            };
            if let Some(r) = chunk_of_result(g, y, &form, out, p.out_at) {
                return Some(r);
            }
        }
    }
    None
}

/// `get k` of a top-k over a chunk (along another dim than the tokens) as the chunk of the
/// rank's top-k over all the tokens.
fn topk_over_chunk(g: &mut Graph, k: Id, call: Id, out: &[usize]) -> Option<Id> {
    for n in g[call].nodes.clone() {
        let Term::Op(sym, ck) = n else { continue };
        if !is_op!(sym, "aten.topk.default") {
            continue;
        }
        let Some(dim) = shape(g, ck[0]).and_then(|x| norm(int(g, ck[2])?, x.len())) else {
            continue;
        };
        for form in chunks(g, ck[0]) {
            if form.at == dim {
                continue;
            }
            let Some(whole) = whole_operand(g, ck[0], form.at, &form) else {
                continue;
            };
            let Some(t) = g.lookup(with_kids(sym, &ck, &[(0, whole)])) else {
                continue;
            };
            let Some(y) = g.lookup(Term::Op(sym!(GET), vec![k, t])) else {
                continue;
            };
            if let Some(r) = chunk_of_result(g, y, &form, out, form.at) {
                return Some(r);
            }
        }
    }
    None
}

/// Whether a class, or the input of one of its views, holds a slice.
fn holds_slice(g: &Graph, id: Id) -> bool {
    std::iter::once(id).chain(views(g, id)).any(|v| {
        g[v].nodes
            .iter()
            .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, SLICE)))
    })
}

/// The operands of the top-k calls of a class.
fn topk_operands(g: &Graph, id: Id) -> impl Iterator<Item = Id> + '_ {
    g[id].nodes.iter().filter_map(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.topk.default") => Some(k[0]),
        _ => None,
    })
}

/// The operators [`tokenwise_over_chunk`] applies to.
fn chunk_roots() -> Vec<String> {
    // Each root costs a search per saturation step on every model, so only the elementwise
    // operators of the router, the experts and the shared expert (moe.rs's choice).
    [
        "aten.mul.Tensor",
        "aten.div.Tensor",
        "aten.add.Tensor",
        "aten.sub.Tensor",
        "aten.sigmoid.default",
        "aten.silu.default",
        // The SwiGLU backward of a context-parallel llama, the router's of deepseek.
        "aten.silu_backward.default",
        "aten.sigmoid_backward.default",
    ]
    .into_iter()
    .chain([
        "aten.mm.default",
        "aten.bmm.default",
        "aten._softmax.default",
        "aten._log_softmax.default",
        "aten.sum.dim_IntList",
        "aten.scatter.src",
        "aten.scatter.value",
        "aten.gather.default",
        "aten.expand.default",
        "aten.transpose.int",
        GET,
    ])
    .map(String::from)
    .collect()
}

/// A token-wise operator over a slice's tokens is the slice of the rank's call over all of
/// them.
fn tokenwise_over_chunk() -> Lemma {
    let roots = chunk_roots();
    let matched = symbols(&roots);
    Lemma {
        name: "tokenwise-over-chunk",
        doc: "f(view(slice(x, d, a, b), s)) where dim t of s flattens dims of the slice including d, f token-wise along t (elementwise, mm/bmm rows, sums, scatters and gathers along other dims, top-k, expand, transpose) = the same slice of f(view(x, s')), only when that call is in the graph",
        roots,
        examples: vec![
            // The router's product on one chunk's rows, beside the rank's product on all rows.
            (
                "(cat 0 (aten.mm.default (aten.view.default (slice 1 1 3 %r0:x) (list 4 3)) %r0:w) (aten.mm.default (aten.view.default %r0:x (list 8 3)) %r0:w))",
                &[("x", "f64[2,4,3]"), ("w", "f64[3,5]")],
            ),
            (
                "(cat 0 (aten.sigmoid.default (aten.view.default (slice 1 0 2 %r0:x) (list 4 3))) (aten.sigmoid.default (aten.view.default %r0:x (list 8 3))))",
                &[("x", "f64[2,4,3]")],
            ),
            // A chunk of a view of the rank's tensor: the view's input is the whole.
            (
                "(cat 0 (aten.sigmoid.default (aten.view.default (slice 1 0 2 (aten.view.default %r0:y (list 2 4 3))) (list 4 3))) (aten.sigmoid.default %r0:y))",
                &[("y", "f64[8,3]")],
            ),
            // The SwiGLU backward on one chunk's rows, beside the rank's on all rows.
            (
                "(cat 0 (aten.silu_backward.default (aten.view.default (slice 1 0 2 %r0:g) (list 4 3)) (aten.view.default (slice 1 0 2 %r0:x) (list 4 3))) (aten.silu_backward.default (aten.view.default %r0:g (list 8 3)) (aten.view.default %r0:x (list 8 3))))",
                &[("g", "f64[2,4,3]"), ("x", "f64[2,4,3]")],
            ),
            (
                "(cat 0 (aten.sigmoid_backward.default (aten.view.default (slice 1 2 4 %r0:g) (list 4 3)) (aten.view.default (slice 1 2 4 %r0:y) (list 4 3))) (aten.sigmoid_backward.default (aten.view.default %r0:g (list 8 3)) (aten.view.default %r0:y (list 8 3))))",
                &[("g", "f64[2,4,3]"), ("y", "f64[2,4,3]")],
            ),
            // An operand constant over the tokens (one value per sequence, copied over it).
            (
                "(cat 0 (aten.mul.Tensor (aten.view.default (slice 1 0 2 %r0:x) (list 4 3)) (aten.view.default (cat 1 %r0:c %r0:c) (list 4 3))) (aten.mul.Tensor (aten.view.default %r0:x (list 8 3)) (aten.view.default (cat 1 %r0:c %r0:c %r0:c %r0:c) (list 8 3))))",
                &[("x", "f64[2,4,3]"), ("c", "f64[2,1,3]")],
            ),
            // Two chunked operands and a per-token column.
            (
                "(cat 0 (aten.div.Tensor (aten.view.default (slice 1 2 4 %r0:a) (list 4 2)) (aten.view.default (slice 1 2 4 %r0:b) (list 4 1))) (aten.div.Tensor (aten.view.default %r0:a (list 8 2)) (aten.view.default %r0:b (list 8 1))))",
                &[("a", "f64[2,4,2]"), ("b", "f64[2,4,1]")],
            ),
            (
                "(cat 0 (get 1 (aten.topk.default (aten.view.default (slice 1 0 2 %r0:x) (list 4 4)) 2 1 b:true b:true)) (get 1 (aten.topk.default (aten.view.default %r0:x (list 8 4)) 2 1 b:true b:true)))",
                &[("x", "f64[2,4,4]")],
            ),
            (
                "(cat 0 (aten.sum.dim_IntList (aten.view.default (slice 1 0 2 %r0:x) (list 4 3)) (list 1) b:true none) (aten.sum.dim_IntList (aten.view.default %r0:x (list 8 3)) (list 1) b:true none))",
                &[("x", "f64[2,4,3]")],
            ),
            (
                "(cat 0 (aten.scatter.src (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 (aten.view.default (slice 1 2 4 %r0:i) (list 4 2)) (aten.view.default (slice 1 2 4 %r0:v) (list 4 2))) (aten.scatter.src (aten.full.default (list 8 3) f:0.0 dt:f64 none dev b:false) 1 (aten.view.default %r0:i (list 8 2)) (aten.view.default %r0:v (list 8 2))))",
                &[("i", "i64[2,4,2]<3"), ("v", "f64[2,4,2]")],
            ),
            (
                "(cat 0 (aten.scatter.value (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 (aten.view.default (slice 1 0 2 %r0:i) (list 4 2)) f:1.0) (aten.scatter.value (aten.full.default (list 8 3) f:0.0 dt:f64 none dev b:false) 1 (aten.view.default %r0:i (list 8 2)) f:1.0))",
                &[("i", "i64[2,4,2]<3")],
            ),
            (
                "(cat 0 (aten.gather.default (aten.view.default (slice 1 0 2 %r0:x) (list 4 3)) 1 (aten.view.default (slice 1 0 2 %r0:i) (list 4 2)) b:false) (aten.gather.default (aten.view.default %r0:x (list 8 3)) 1 (aten.view.default %r0:i (list 8 2)) b:false))",
                &[("x", "f64[2,4,3]"), ("i", "i64[2,4,2]<3")],
            ),
            (
                "(cat 0 (aten._log_softmax.default (aten.view.default (slice 1 2 4 %r0:x) (list 4 5)) 1 b:false) (aten._log_softmax.default (aten.view.default %r0:x (list 8 5)) 1 b:false))",
                &[("x", "f64[2,4,5]")],
            ),
            // The experts' [expert, token, ..] tensors: tokens in dim 1.
            (
                "(cat 1 (aten.bmm.default (aten.expand.default (aten.view.default (slice 1 1 3 %r0:x) (list 1 4 3)) (list 2 4 3) b:false) %r0:w) (aten.bmm.default (aten.expand.default (aten.view.default %r0:x (list 1 8 3)) (list 2 8 3) b:false) %r0:w))",
                &[("x", "f64[2,4,3]"), ("w", "f64[2,3,5]")],
            ),
            (
                "(cat 1 (aten.transpose.int (aten.view.default (slice 1 0 2 %r0:x) (list 4 3)) 0 1) (aten.transpose.int (aten.view.default %r0:x (list 8 3)) 0 1))",
                &[("x", "f64[2,4,3]")],
            ),
            // A broadcast operand is taken whole.
            (
                "(cat 0 (aten.mul.Tensor (aten.view.default (slice 1 0 2 %r0:x) (list 4 3)) %r0:c) (aten.mul.Tensor (aten.view.default %r0:x (list 8 3)) %r0:c))",
                &[("x", "f64[2,4,3]"), ("c", "f64[3]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            // Cheap on every other term: a chunk needs a slice in an operand (or under the
            // top-k a `get` reads).
            let sliced = |k: Id| holds_slice(g, k) || topk_operands(g, k).any(|x| holds_slice(g, x));
            if !kids.iter().any(|&k| sliced(k)) {
                return vec![];
            }
            let Some(sym) = node_sym(g, eclass, kids, &matched) else { return vec![] };
            let Some(out) = shape(g, eclass) else { return vec![] };
            if out.is_empty() {
                return vec![];
            }
            let found = if is_op!(sym, GET) {
                topk_over_chunk(g, kids[0], kids[1], &out)
            } else {
                over_chunk(g, sym, kids, &out)
            };
            found.into_iter().collect()
        }),
    }
}

const MM: &str = "aten.mm.default";
const BMM: &str = "aten.bmm.default";
const TRANSPOSE: &str = "aten.transpose.int";

/// An operand of a product whose contracted dim flattens a concatenation's dims: `view(cat_d(
/// pieces), target)`, or a transpose of one, where `target[at]` flattens dims `lo..hi` of the
/// concatenation and `lo < d < hi` (each piece's tokens interleave with the others').
struct FlatOperand {
    /// The transpose's dim operands, when the operand is a transpose of the view.
    transposed: Option<(Id, Id)>,
    /// The view's shape.
    target: Vec<usize>,
    /// The view's flattened dim.
    at: usize,
    /// The extents of the concatenation's dims `lo..hi`.
    lead: Vec<usize>,
    /// Which of `lead` the concatenation joins along (`d - lo`).
    split: usize,
    /// The concatenation's dim.
    d: usize,
    /// The pieces.
    pieces: Vec<Id>,
}

/// The flattened-concatenation forms of product operand `x` contracted along `dim`; `other`
/// is the dim a transpose swaps with it.
fn flat_operands(g: &Graph, x: Id, dim: usize, other: usize) -> Vec<FlatOperand> {
    let mut out = Vec::new();
    let direct = std::iter::once((x, dim, None));
    let through = super::ring::calls(g, x, TRANSPOSE)
        .into_iter()
        .filter_map(|t| {
            let dims = (int(g, t[1])?, int(g, t[2])?);
            let swaps = dims == (dim as i64, other as i64) || dims == (other as i64, dim as i64);
            swaps.then_some((t[0], other, Some((t[1], t[2]))))
        });
    for (v, at, transposed) in direct.chain(through) {
        let Some(target) = shape(g, v) else { continue };
        for c in views(g, v) {
            let Some(src) = shape(g, c) else { continue };
            let Some((lo, hi)) = flattened_range(&src, &target, at) else {
                continue;
            };
            for (d, pieces) in cats(g, c) {
                if lo < d && d < hi {
                    out.push(FlatOperand {
                        transposed,
                        target: target.clone(),
                        at,
                        lead: src[lo..hi].to_vec(),
                        split: d - lo,
                        d,
                        pieces,
                    });
                }
            }
        }
    }
    out.truncate(2);
    out
}

/// The dims `lo..hi` of `src` that dim `at` of `target` flattens, all other dims kept.
fn flattened_range(src: &[usize], target: &[usize], at: usize) -> Option<(usize, usize)> {
    let lo = at;
    let hi = src.len().checked_sub(target.len() - at - 1)?;
    let keeps = src[..lo] == target[..lo] && src[hi..] == target[at + 1..];
    (keeps && hi > lo + 1 && product(&src[lo..hi]) == target[at]).then_some((lo, hi))
}

/// The slice `(source, start)` along `d` that a piece is, if any.
fn piece_slice(g: &Graph, piece: Id, d: usize) -> Option<(Id, i64)> {
    super::ring::calls(g, piece, SLICE)
        .into_iter()
        .find_map(|k| (int(g, k[0])? == d as i64).then(|| Some((g.find(k[3]), int(g, k[1])?)))?)
}

/// The pieces' indices grouped by the tensors both sides slice them from (in the order of the
/// left side's slices); a piece that is no slice stands alone.
fn groups_by_source(g: &Graph, left: &FlatOperand, right: &FlatOperand) -> Vec<Vec<usize>> {
    // Per pair of sources (left, right): the members' (left start, index).
    let mut sources: Vec<(Id, Id)> = Vec::new();
    let mut members: Vec<Vec<(i64, usize)>> = Vec::new();
    let mut alone = Vec::new();
    for i in 0..left.pieces.len() {
        let l = piece_slice(g, left.pieces[i], left.d);
        let r = piece_slice(g, right.pieces[i], right.d);
        let (Some((ls, start)), Some((rs, _))) = (l, r) else {
            alone.push(vec![i]);
            continue;
        };
        match sources.iter().position(|&key| key == (ls, rs)) {
            Some(k) => members[k].push((start, i)),
            None => {
                sources.push((ls, rs));
                members.push(vec![(start, i)]);
            }
        }
    }
    members
        .into_iter()
        .map(|mut m| {
            m.sort_unstable();
            m.into_iter().map(|(_, i)| i).collect()
        })
        .chain(alone)
        .collect()
}

/// One side of a group's product: the group's pieces joined (adjacent slices of one tensor,
/// see [`adjacent_slices`](super::flash::adjacent_slices)), flattened as the operand was, and
/// transposed back where it was; `None` when the pieces do not join.
fn group_operand(g: &mut Graph, side: &FlatOperand, group: &[usize]) -> Option<Id> {
    let pieces: Vec<Id> = group.iter().map(|&k| side.pieces[k]).collect();
    let joined = match pieces[..] {
        [p] => p,
        _ => super::flash::adjacent_slices(g, &pieces, side.d)?,
    };
    let extent = shape(g, joined)?.get(side.d).copied()?;
    let mut lead = side.lead.clone();
    lead[side.split] = extent;
    let mut target = side.target.clone();
    target[side.at] = product(&lead);
    let viewed = view_to(g, joined, &target);
    Some(match side.transposed {
        Some((a, b)) => op(g, TRANSPOSE, vec![viewed, a, b]),
        None => viewed,
    })
}

/// The product of a group's pieces on both sides; a group whose pieces do not join on both
/// sides is its pieces' products, one each. `None` when a piece cannot be viewed back (the sum
/// would miss its term).
fn group_products(
    g: &mut Graph,
    sym: &str,
    l: &FlatOperand,
    r: &FlatOperand,
    group: &[usize],
) -> Option<Vec<Id>> {
    let product = |g: &mut Graph, grp: &[usize]| {
        let (a, b) = (group_operand(g, l, grp)?, group_operand(g, r, grp)?);
        Some(op(g, sym, vec![a, b]))
    };
    if let Some(t) = product(g, group) {
        return Some(vec![t]);
    }
    group.iter().map(|&k| product(g, &[k])).collect()
}

/// A product contracting the flattened tokens of two concatenations of chunks is a sum of
/// products over any partition of the tokens: per group of pieces that join back into one
/// slice of a rank's tensor, the product of the joined pieces.
fn contraction_over_chunks() -> Lemma {
    Lemma {
        name: "contraction-over-chunks",
        doc: "mm/bmm(a, b) contracting a dim that flattens dims lo..hi of cat_d(x_i) on both sides (view(cat_d(x_i)) or a transpose of it, lo < d < hi, pieces of equal sizes) = the sum over groups of pieces of mm/bmm of the groups' pieces, flattened alike: a sum over tokens is a sum over any partition of them, each group's pieces adjacent slices of one tensor on both sides (a cp rank's weight gradient over both of its chunks), or a piece alone",
        roots: vec![MM.into(), BMM.into()],
        examples: vec![
            ("(aten.bmm.default (aten.transpose.int (aten.view.default (cat 2 (slice 2 0 1 %r0:x) (slice 2 0 1 %r1:x) (slice 2 1 2 %r1:x) (slice 2 1 2 %r0:x)) (list 2 8 3)) 1 2) (aten.view.default (cat 2 (slice 2 0 1 %r0:y) (slice 2 0 1 %r1:y) (slice 2 1 2 %r1:y) (slice 2 1 2 %r0:y)) (list 2 8 5)))", &[("x", "f64[2,2,2,3]"), ("y", "f64[2,2,2,5]")]),
            ("(aten.mm.default (aten.transpose.int (aten.view.default (cat 1 %r0:x %r1:x) (list 8 3)) 0 1) (aten.view.default (cat 1 %r0:y %r1:y) (list 8 5)))", &[("x", "f64[2,2,3]"), ("y", "f64[2,2,5]")]),
            ("(aten.mm.default (aten.view.default (cat 2 %r0:x %r1:x) (list 3 8)) (aten.transpose.int (aten.view.default (cat 2 %r0:y %r1:y) (list 5 8)) 0 1))", &[("x", "f64[3,2,2]"), ("y", "f64[5,2,2]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &[sym!(MM), sym!(BMM)]) else {
                return vec![];
            };
            // (left's contracted dim and the one a transpose swaps it with; right's likewise)
            let (ka, ra, kb, cb) = if sym.as_str() == MM { (1, 0, 0, 1) } else { (2, 1, 1, 2) };
            let lefts = flat_operands(g, kids[0], ka, ra);
            if lefts.is_empty() {
                return vec![];
            }
            let rights = flat_operands(g, kids[1], kb, cb);
            let mut out = Vec::new();
            for l in &lefts {
                for r in &rights {
                    let same_tokens = l.lead == r.lead
                        && l.split == r.split
                        && l.pieces.len() == r.pieces.len()
                        && sizes(g, &l.pieces, l.d).is_some_and(|s| sizes(g, &r.pieces, r.d) == Some(s));
                    if !same_tokens {
                        continue;
                    }
                    // Every piece in a term, or no result: a sum missing a piece is wrong.
                    let terms: Option<Vec<Vec<Id>>> = groups_by_source(g, l, r)
                        .iter()
                        .map(|group| group_products(g, sym.as_str(), l, r, group))
                        .collect();
                    match terms.map(|t| t.concat()).as_deref() {
                        Some([t]) => out.push(*t),
                        Some(ts) if !ts.is_empty() => out.push(op(g, SUM, ts.to_vec())),
                        _ => {}
                    }
                }
            }
            out
        }),
    }
}

/// `sum(slice(view(z, s), d, a, b), trailing dims)` = `slice(view(sum(z, trailing dims), s'), d,
/// a, b)` when the view leaves the trailing dims as they are (it regroups the leading ones), d
/// is a leading dim, and the rank's sum of `z` is in the graph (looked up, never built): a
/// chunk of the tokens of a rank's per-token sum (the experts' gate gradient, `sum(g * y, -1)`,
/// per group of experts), where the spec's tokens interleave the cp ranks' chunks.
fn sum_over_chunk() -> Lemma {
    Lemma {
        name: "sum-over-chunk",
        doc: "sum over the trailing dims of slice(view(z, s), d, a, b), d a leading dim and the view regrouping only leading dims, = slice(view(sum(z, its trailing dims), s'), d, a, b), only when that sum of z is in the graph",
        roots: vec!["aten.sum.dim_IntList".into()],
        examples: vec![
            // The chunk's sum beside the rank's sum over its whole tokens.
            (
                "(cat 0 (aten.view.default (aten.sum.dim_IntList (slice 2 0 2 (aten.view.default %r0:z (list 2 4 4 3))) (list 3) b:false none) (list 16)) (aten.view.default (aten.sum.dim_IntList %r0:z (list 2) b:false none) (list 32)))",
                &[("z", "f64[2,16,3]")],
            ),
            (
                "(cat 0 (aten.view.default (aten.sum.dim_IntList (slice 1 2 4 (aten.view.default %r0:z (list 2 4 2 3))) (list -2 -1) b:false none) (list 4)) (aten.view.default (aten.sum.dim_IntList %r0:z (list 1 2) b:false none) (list 8)))",
                &[("z", "f64[8,2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if is_true(g, kids[2]) {
                return vec![];
            }
            let (Some(src), Some(dims)) = (shape(g, kids[0]), int_list(g, kids[1])) else {
                return vec![];
            };
            let mut dims: Vec<usize> = match dims.iter().map(|&d| norm(d, src.len())).collect() {
                Some(d) => d,
                None => return vec![],
            };
            dims.sort_unstable();
            dims.dedup();
            let k = dims.len();
            let lead = src.len().saturating_sub(k);
            if k == 0 || lead == 0 || dims != (lead..src.len()).collect::<Vec<_>>() {
                return vec![];
            }
            let at = |id: Id| usize::try_from(int(g, id)?).ok();
            let slices: Vec<(usize, usize, usize, Id)> = super::ring::calls(g, kids[0], SLICE)
                .into_iter()
                .filter_map(|c| Some((at(c[0])?, at(c[1])?, at(c[2])?, c[3])))
                .collect();
            let mut out = Vec::new();
            for (d, a, b, y) in slices {
                if d >= lead {
                    continue;
                }
                let Some(ys) = shape(g, y) else { continue };
                for z in views(g, y) {
                    let Some(zs) = shape(g, z) else { continue };
                    if zs.len() <= k || zs[zs.len() - k..] != ys[lead..] {
                        continue;
                    }
                    let whole: Vec<usize> = (zs.len() - k..zs.len()).collect();
                    let Some(l) = lookup_list(g, &whole) else { continue };
                    let call = Term::Op(
                        sym!("aten.sum.dim_IntList"),
                        vec![z, l, kids[2], kids[3]],
                    );
                    let Some(total) = g.lookup(call) else { continue };
                    let v = view_to(g, total, &ys[..lead]);
                    out.push(slice(g, d, a, b, v));
                }
            }
            out
        }),
    }
}
