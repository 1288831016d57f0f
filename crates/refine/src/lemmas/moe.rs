//! Lemmas for mixture-of-experts training (DeepSeek-style routers under tp, ep and dp).
//!
//! The MoE backward mixes partial sums with replicated terms: under tensor parallelism the
//! router's gradient is partial over tp (the gates weight the experts' tp-partial outputs),
//! while the auxiliary load-balancing loss, computed in full on every rank, contributes its
//! gradient scaled by 1/tp on each rank. Each rank adds its replicated share to its partial
//! sum, and the all-reduce recombines them.

use super::{
    cat, cats, int, int_list, is_one, is_zero, node_sym, op, scale, scales, shape, sizes, sums,
    with_kids, Graph, Lemma,
};
use crate::term::{is_op, sym, Term, GET, SUM};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The MoE lemmas.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        add_replicated_into_sum(),
        gather_over_cat(),
        sum_of_padded_pieces(),
        scatter_into_zeros_over_scale(),
        tokenwise_over_interleaved_cat(),
        permute_of_permute(),
        slice_through_layout(),
        permute_of_unit_dims(),
        permute_as_transpose(),
    ]
}

/// `sum(x_1..x_n) + n * y = sum(x_1 + y, .., x_n + y)`, and its scaled form
/// `(p/q) sum(x_1..x_n) + (p2/q2) y = (p/q) sum(x_1 + y, .., x_n + y)` when `n p / q = p2 / q2`.
fn add_replicated_into_sum() -> Lemma {
    Lemma {
        name: "add-replicated-into-sum",
        doc: "sum(x_1..x_n) + n * y = sum(x_1 + y, .., x_n + y), and (p/q) sum(x_1..x_n) + (p2/q2) y = (p/q) sum(x_1 + y, .., x_n + y) when n p / q = p2 / q2: every rank adds its share y of a replicated term to its partial sum before the reduction (the MoE auxiliary-loss gradient divided by tp; under tp x ep the routed part also carries the 1/ep of the token-parallel mean while each rank adds the whole auxiliary share)",
        roots: vec!["aten.add.Tensor".into()],
        examples: vec![
            (
                "(aten.add.Tensor (sum %r0:a %r1:a) (scale 2 1 %r0:b) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(aten.add.Tensor (scale 3 1 %r0:b) (sum %r0:a %r1:a %r2:a) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[3]")],
            ),
            (
                "(aten.add.Tensor (scale 1 2 (sum %r0:a %r1:a)) %r0:b 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(aten.add.Tensor %r0:b (scale 2 6 (sum %r0:a %r1:a %r2:a)) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[3]")],
            ),
            (
                "(aten.add.Tensor (scale 1 4 (sum %r0:a %r1:a)) (scale 1 2 %r0:b) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!("aten.add.Tensor")]).is_none() || !is_one(g, kids[2]) {
                return vec![];
            }
            let mut out = Vec::new();
            for (s, r, sum_first) in [(kids[0], kids[1], true), (kids[1], kids[0], false)] {
                for terms in sums(g, s).into_iter().take(2) {
                    let n = terms.len() as i64;
                    let Some(y) = replicated_share(g, r, n) else { continue };
                    let parts: Vec<Id> = terms
                        .iter()
                        .map(|&x| {
                            // The operands keep their order: the ranks compute it that way.
                            let pair = if sum_first { vec![x, y, kids[2]] } else { vec![y, x, kids[2]] };
                            op(g, "aten.add.Tensor", pair)
                        })
                        .collect();
                    out.push(op(g, SUM, parts));
                }
                // (p/q) sum(x_1..x_n) + (p2/q2) y with n p / q = p2 / q2: the sum's own
                // scaling absorbs y's n copies.
                let mut shares = vec![(1, 1, r)];
                shares.extend(scales(g, r));
                for (p, q, inner) in scales(g, s) {
                    for terms in sums(g, inner).into_iter().take(2) {
                        let n = terms.len() as i64;
                        for &(p2, q2, y) in &shares {
                            // In i128: two factors' products overflow an i64.
                            let wide = i128::from;
                            if wide(p) * wide(n) * wide(q2) != wide(p2) * wide(q) {
                                continue;
                            }
                            let parts: Vec<Id> = terms
                                .iter()
                                .map(|&x| {
                                    let pair = if sum_first { vec![x, y, kids[2]] } else { vec![y, x, kids[2]] };
                                    op(g, "aten.add.Tensor", pair)
                                })
                                .collect();
                            let whole = op(g, SUM, parts);
                            out.push(scale(g, p, q, whole));
                        }
                    }
                }
            }
            out
        }),
    }
}

/// The `y` of a class holding `n * y`.
fn replicated_share(g: &Graph, id: Id, n: i64) -> Option<Id> {
    scales(g, id)
        .into_iter()
        .find(|&(p, q, _)| q != 0 && i128::from(p) == i128::from(n) * i128::from(q))
        .map(|(_, _, y)| y)
}

/// `gather(cat_d(x_i), k, cat_d(t_i)) = cat_d(gather(x_i, k, t_i))` for `d != k`.
fn gather_over_cat() -> Lemma {
    Lemma {
        name: "gather-over-cat",
        doc: "gather(cat_d(x_i), k, cat_d(t_i)) = cat_d(gather(x_i, k, t_i)) for d != k, the source and the indices split alike along d (each token picks its routed experts' gate gradients from its own row)",
        roots: vec!["aten.gather.default".into()],
        examples: vec![
            (
                "(aten.gather.default (cat 0 %r0:x %r1:x) 1 (cat 0 %r0:t %r1:t) b:false)",
                &[("x", "f64[3,4]"), ("t", "i64[3,2]<4")],
            ),
            (
                "(aten.gather.default (cat 1 %r0:x %r1:y) 0 (cat 1 %r0:t %r1:u) b:false)",
                &[("x", "f64[3,2]"), ("y", "f64[3,1]"), ("t", "i64[2,2]<3"), ("u", "i64[2,1]<3")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(src), Some(index), Some(k)) = (shape(g, kids[0]), shape(g, kids[2]), int(g, kids[1])) else {
                return vec![];
            };
            let k = if k < 0 { k + src.len() as i64 } else { k };
            let mut out = Vec::new();
            for (d, ts) in cats(g, kids[2]) {
                // The pieces of x must start where the index pieces do: equal extents along d.
                if d as i64 == k || src.get(d) != index.get(d) {
                    continue;
                }
                let Some(szs) = sizes(g, &ts, d) else { continue };
                // Only pieces present: the source already split alike (no slices built).
                let Some((_, xs)) = cats(g, kids[0])
                    .into_iter()
                    .find(|(e, xs)| *e == d && sizes(g, xs, d).as_deref() == Some(&szs[..]))
                else {
                    continue;
                };
                let parts: Vec<Id> = xs
                    .iter()
                    .zip(&ts)
                    .map(|(&x, &t)| op(g, "aten.gather.default", vec![x, kids[1], t, kids[3]]))
                    .collect();
                out.push(cat(g, d, parts));
            }
            out
        }),
    }
}

/// `sum_i pad(x_i)` with zero pads that place the pieces side by side along one dim is their
/// concatenation.
fn sum_of_padded_pieces() -> Lemma {
    Lemma {
        name: "sum-of-padded-pieces",
        doc: "sum_i constant_pad_nd(x_i, p_i, 0) = cat_d(x_i) when every p_i pads only dim d and the pads put the pieces side by side, covering d once (expert-parallel ranks zero-pad their experts' columns and reduce-scatter)",
        // Matched at the pads, not at every sum of the graph: the sums are the pads' parents.
        roots: vec!["aten.constant_pad_nd.default".into()],
        examples: vec![
            (
                "(sum (aten.constant_pad_nd.default %r0:a (list 0 2) f:0.0) (aten.constant_pad_nd.default %r1:a (list 2 0) f:0.0))",
                &[("a", "f64[3,2]")],
            ),
            (
                "(sum (aten.constant_pad_nd.default %r1:b (list 0 0 2 0) 0) (aten.constant_pad_nd.default %r0:a (list 0 0 0 1) 0))",
                &[("a", "f64[2,3]"), ("b", "f64[1,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, _| {
            let pad = g.find(eclass);
            let sums: Vec<(Id, Vec<Id>)> = g[pad]
                .parents()
                .flat_map(|p| {
                    g[p].nodes
                        .iter()
                        .filter_map(|n| match n {
                            Term::Op(s, k) if is_op!(s, SUM) && k.iter().any(|&c| g.find(c) == pad) => {
                                Some((p, k.clone()))
                            }
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                })
                .take(4)
                .collect();
            let mut changed = false;
            for (class, terms) in sums {
                if let Some(whole) = padded_pieces_side_by_side(g, class, &terms) {
                    changed |= g.union(class, whole);
                }
            }
            if changed {
                vec![eclass]
            } else {
                vec![]
            }
        }),
    }
}

/// The concatenation that `sum(terms)` (of class `class`) is when its terms are zero-padded
/// pieces side by side along one dim.
fn padded_pieces_side_by_side(g: &mut Graph, class: Id, terms: &[Id]) -> Option<Id> {
    let out_shape = shape(g, class)?;
    // (dim, offset, piece) of every operand.
    let mut placed: Vec<(usize, usize, Id)> = Vec::new();
    for &k in terms {
        placed.push(zero_pad_placement(g, k, &out_shape)?);
    }
    let d = placed[0].0;
    if placed.iter().any(|p| p.0 != d) {
        return None;
    }
    placed.sort_by_key(|p| p.1);
    let mut at = 0;
    for &(_, off, x) in &placed {
        let w = shape(g, x)?.get(d).copied()?;
        if off != at {
            return None;
        }
        at += w;
    }
    if at != out_shape[d] {
        return None;
    }
    let pieces = placed.iter().map(|p| p.2).collect();
    Some(cat(g, d, pieces))
}

/// A class holding `constant_pad_nd(x, p, 0)` that pads only one dim `d` (and keeps the other
/// extents of `out`): `(d, left pad, x)`.
fn zero_pad_placement(g: &Graph, id: Id, out: &[usize]) -> Option<(usize, usize, Id)> {
    g[id].nodes.iter().find_map(|n| {
        let Term::Op(s, k) = n else { return None };
        if !is_op!(s, "aten.constant_pad_nd.default") || k.len() != 3 || !is_zero(g, k[2]) {
            return None;
        }
        let pads = int_list(g, k[1])?;
        let x = shape(g, k[0])?;
        if x.len() != out.len() || pads.len() % 2 != 0 || pads.len() / 2 > x.len() {
            return None;
        }
        let mut dim = None;
        for (j, pair) in pads.chunks(2).enumerate() {
            if pair[0] < 0 || pair[1] < 0 {
                return None; // a negative pad crops
            }
            if pair[0] != 0 || pair[1] != 0 {
                if dim.is_some() {
                    return None;
                }
                dim = Some((x.len() - 1 - j, pair[0] as usize));
            }
        }
        let (d, left) = dim?;
        let same_elsewhere = (0..x.len()).all(|e| e == d || x[e] == out[e]);
        same_elsewhere.then_some((d, left, k[0]))
    })
}

/// `scatter(zeros, d, i, c * x) = c * scatter(zeros, d, i, x)`.
fn scatter_into_zeros_over_scale() -> Lemma {
    Lemma {
        name: "scatter-into-zeros-over-scale",
        doc: "scatter(zeros, d, i, c * x) = c * scatter(zeros, d, i, x): scattering into a zero fill is linear in the source (the gate gradients of data-parallel ranks, scaled by 1/dp)",
        roots: vec!["aten.scatter.src".into()],
        examples: vec![(
            "(aten.scatter.src (aten.full.default (list 2 4) f:0.0 dt:f64 none dev b:false) 1 %r0:i (scale 1 2 %r0:a))",
            &[("i", "i64[2,2]<4"), ("a", "f64[2,2]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !is_zero_fill(g, kids[0]) {
                return vec![];
            }
            let sym = sym!("aten.scatter.src");
            scales(g, kids[3])
                .into_iter()
                .map(|(p, q, x)| {
                    let inner = g.add(with_kids(sym, kids, &[(3, x)]));
                    scale(g, p, q, inner)
                })
                .collect()
        }),
    }
}

/// Whether a class is a fill with zeros (`full(shape, 0)`).
fn is_zero_fill(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| {
        matches!(n, Term::Op(s, k) if is_op!(s, "aten.full.default") && k.len() > 1 && is_zero(g, k[1]))
    })
}

// ---------------------------------------------------------------------------------------------
// Tokens split inside a flattened dim (sequence parallelism around the MoE block).
//
// Under sequence parallelism each tp rank routes the tokens of its sequence chunk: the spec's
// tokens `[b*s, ..]` are `view(cat_1(x_i), ..)` of the ranks' `[b, s/tp, ..]` chunks, a fixed
// interleaving of the ranks' token rows. The experts' tensors carry the tokens in dim 1
// (`[experts, tokens, ..]`), the gates transposed, so the token dim is not always the first
// (rows.rs handles rows in dim 0 for row-wise products and elementwise operators of equal
// shapes). An operator that treats tokens independently commutes with any fixed reordering of
// them, so it works piece by piece and its result is put back in the same interleaved order.

/// A class that is a view of a concatenation whose dim `at` flattens several dims of the
/// concatenation, one of which (not the outermost) the pieces split.
struct TokenSplit {
    /// The flattened dim in the class's shape.
    at: usize,
    /// The extents of the concatenation's dims that flatten into `at`.
    lead: Vec<usize>,
    /// Which of `lead` the pieces split.
    split: usize,
    /// Per piece, its extents of `lead`.
    piece_leads: Vec<Vec<usize>>,
    /// The concatenation's pieces.
    sources: Vec<Id>,
    /// The class's shape.
    shape: Vec<usize>,
}

impl TokenSplit {
    /// Whether `other` splits its tokens the same way (its pieces hold the same tokens).
    fn aligned(&self, other: &TokenSplit) -> bool {
        self.lead == other.lead
            && self.split == other.split
            && self.piece_leads == other.piece_leads
    }

    /// The pieces viewed with their tokens flattened like the class (built only for a split
    /// a lemma uses).
    fn pieces(&self, g: &mut Graph) -> Vec<Id> {
        self.sources
            .iter()
            .zip(&self.piece_leads)
            .map(|(&x, pl)| {
                let mut ps = self.shape.clone();
                ps[self.at] = product(pl);
                view_as(g, x, &ps)
            })
            .collect()
    }
}

/// The product of a slice of extents.
fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// The token splits of a class (at most a few): its views of concatenations.
fn token_splits(g: &Graph, id: Id) -> Vec<TokenSplit> {
    let Some(s) = shape(g, id) else { return vec![] };
    let mut out = Vec::new();
    for c in super::views(g, id) {
        let Some(cs) = shape(g, c) else { continue };
        for (d, xs) in cats(g, c) {
            // Copies of one tensor (an expanded dim) are a broadcast, not ranks' tokens: working
            // piece by piece would only repeat one computation.
            if xs.iter().all(|&x| g.find(x) == g.find(xs[0])) {
                continue;
            }
            let Some(form) = token_split_of(g, &s, &cs, d, &xs) else {
                continue;
            };
            out.push(form);
        }
    }
    out.truncate(3);
    out
}

/// The token split of `view(cat_d(xs), s)`, the concatenation of shape `cs`.
fn token_split_of(g: &Graph, s: &[usize], cs: &[usize], d: usize, xs: &[Id]) -> Option<TokenSplit> {
    if product(s) != product(cs) {
        return None;
    }
    for at in 0..s.len() {
        let (before, through) = (product(&s[..at]), product(&s[..=at]));
        // The innermost start and outermost end of the dims of cs flattening into s[at].
        let i = (0..=d).rev().find(|&i| product(&cs[..i]) == before)?;
        let Some(j) = (d + 1..=cs.len()).find(|&j| product(&cs[..j]) == through) else {
            continue;
        };
        if i >= d || j - i < 2 {
            // The split dim is outermost (a block split: view-over-cat's case) or alone.
            return None;
        }
        let lead = cs[i..j].to_vec();
        let split = d - i;
        let mut piece_leads = Vec::new();
        for &x in xs {
            let mut pl = lead.clone();
            pl[split] = shape(g, x)?.get(d).copied()?;
            piece_leads.push(pl);
        }
        return Some(TokenSplit {
            at,
            lead,
            split,
            piece_leads,
            sources: xs.to_vec(),
            shape: s.to_vec(),
        });
    }
    None
}

/// `x` viewed as `target`: `x` itself, or the input of one of its views, when it has that
/// shape already.
fn view_as(g: &mut Graph, x: Id, target: &[usize]) -> Id {
    if shape(g, x).as_deref() == Some(target) {
        return x;
    }
    if let Some(v) = super::views(g, x)
        .into_iter()
        .find(|&v| shape(g, v).as_deref() == Some(target))
    {
        return v;
    }
    let l = super::list(g, target);
    op(g, "aten.view.default", vec![x, l])
}

/// The pieces' results (token dim `at` of shape `out` flattened like `form`) put back in the
/// interleaved order.
fn interleave_at(g: &mut Graph, form: &TokenSplit, at: usize, results: &[Id], out: &[usize]) -> Id {
    let parts = form
        .piece_leads
        .iter()
        .zip(results)
        .map(|(pl, &r)| {
            let mut s = out[..at].to_vec();
            s.extend_from_slice(pl);
            s.extend_from_slice(&out[at + 1..]);
            view_as(g, r, &s)
        })
        .collect();
    let c = cat(g, at + form.split, parts);
    let l = super::list(g, out);
    op(g, "aten.view.default", vec![c, l])
}

/// The pieces of operand `id` whose token dim is `at`, split like `form`: its own aligned
/// split, the pieces of a constant fill, or none.
fn aligned_pieces(g: &mut Graph, id: Id, at: usize, form: &TokenSplit) -> Option<Vec<Id>> {
    if let Some(f) = token_splits(g, id)
        .into_iter()
        .find(|f| f.at == at && f.aligned(form))
    {
        return Some(f.pieces(g));
    }
    if let Some(ps) = copies_pieces(g, id, at, form) {
        return Some(ps);
    }
    // A fill is a fill of every piece's shape.
    let s = shape(g, id)?;
    let fill = g[id].nodes.iter().find_map(|n| match n {
        Term::Op(sym, k) if is_op!(sym, "aten.full.default") => Some(k.clone()),
        _ => None,
    })?;
    let pieces = form
        .piece_leads
        .iter()
        .map(|pl| {
            let mut ps = s.clone();
            ps[at] = product(pl);
            let l = super::list(g, &ps);
            let mut k = fill.clone();
            k[0] = l;
            g.add(Term::Op(sym!("aten.full.default"), k))
        })
        .collect();
    Some(pieces)
}

/// The pieces of operand `id` split like `form` when it is a view of copies of one tensor
/// concatenated along the split dim (an expanded per-sequence factor: `expand-as-cat`'s form):
/// each piece is the copies its tokens take.
fn copies_pieces(g: &mut Graph, id: Id, at: usize, form: &TokenSplit) -> Option<Vec<Id>> {
    let (x, d) = copies_split(g, id, at, form)?;
    let s = shape(g, id)?;
    let w = shape(g, x)?[d];
    let pieces = form
        .piece_leads
        .iter()
        .map(|pl| {
            let c = cat(g, d, vec![x; pl[form.split] / w]);
            let mut ps = s.clone();
            ps[at] = product(pl);
            view_as(g, c, &ps)
        })
        .collect();
    Some(pieces)
}

/// The copied tensor and the concatenation dim of [`copies_pieces`]'s form, when `id` has it.
fn copies_split(g: &Graph, id: Id, at: usize, form: &TokenSplit) -> Option<(Id, usize)> {
    let s = shape(g, id)?;
    for v in super::views(g, id) {
        let Some(cs) = shape(g, v) else { continue };
        for (d, xs) in cats(g, v) {
            if xs.iter().any(|&x| g.find(x) != g.find(xs[0])) {
                continue;
            }
            let Some(f) = token_split_of(g, &s, &cs, d, &xs) else {
                continue;
            };
            if f.at != at || f.lead != form.lead || f.split != form.split {
                continue;
            }
            let Some(w) = shape(g, xs[0])
                .and_then(|x| x.get(d).copied())
                .filter(|&w| w > 0)
            else {
                continue;
            };
            if form
                .piece_leads
                .iter()
                .any(|pl| !pl[form.split].is_multiple_of(w))
            {
                continue;
            }
            return Some((xs[0], d));
        }
    }
    None
}

/// Whether a class holds a view of a class holding a concatenation.
fn views_a_cat(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.view.default") => g[k[0]]
            .nodes
            .iter()
            .any(|m| matches!(m, Term::Op(c, _) if is_op!(c, crate::term::CAT))),
        _ => false,
    })
}

/// Whether a class holds a call (the top-k under a `get`) on a view of a concatenation.
fn calls_on_view_of_cat(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.topk.default") => views_a_cat(g, k[0]),
        _ => false,
    })
}

/// Token-wise operators over tokens interleaved in a flattened dim work piece by piece.
fn tokenwise_over_interleaved_cat() -> Lemma {
    // The elementwise operators rows.rs cannot take in an MoE block: the experts' activations
    // and gate weighting on [expert, token, ..] tensors, the top-k normalization by a per-token
    // column. Each root costs a search per saturation step on every model, so only these.
    let roots: Vec<&'static str> = [
        "aten.mul.Tensor",
        "aten.div.Tensor",
        "aten.silu.default",
        "aten.silu_backward.default",
        "aten.add.Tensor",
        "aten.sub.Tensor",
        "aten.sigmoid_backward.default",
    ]
    .into_iter()
    .chain([
        "aten.bmm.default",
        "aten.mm.default",
        "aten.sum.dim_IntList",
        "aten.scatter.src",
        "aten.scatter.value",
        "aten.gather.default",
        "aten.expand.default",
        "aten.transpose.int",
        GET,
    ])
    .collect();
    let matched: Vec<Symbol> = roots.iter().map(|&r| Symbol::from(r)).collect();
    Lemma {
        name: "tokenwise-over-interleaved-cat",
        doc: "f(view(cat_d(x_i), s)) where dim t of s flattens dims of the cat and d is one of them (not the outermost), f token-wise along t (elementwise, bmm over its rows, top-k, sums, scatters and gathers along other dims, expand, transpose; a product contracting the tokens is the sum of the pieces' products): the pieces' results put back in the interleaved order",
        roots: roots.iter().map(|r| r.to_string()).collect(),
        examples: vec![
            // top-k of each token's router scores.
            (
                "(get 1 (aten.topk.default (aten.view.default (cat 1 %r0:a %r1:a) (list 6 4)) 2 -1 b:true b:true))",
                &[("a", "f64[3,1,4]")],
            ),
            // Elementwise with a per-token column (rows.rs needs equal shapes).
            (
                "(aten.div.Tensor (aten.view.default (cat 1 %r0:a %r1:a) (list 4 3)) (aten.view.default (cat 1 %r0:b %r1:b) (list 4 1)))",
                &[("a", "f64[2,1,3]"), ("b", "f64[2,1,1]")],
            ),
            // Tokens in dim 1 of the experts' tensors.
            (
                "(aten.mul.Tensor (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) (aten.view.default (cat 2 %r0:b %r1:b) (list 2 6 1)))",
                &[("a", "f64[2,3,1,3]"), ("b", "f64[2,3,1,1]")],
            ),
            (
                "(aten.sum.dim_IntList (aten.view.default (cat 1 %r0:a %r1:a) (list 4 3)) (list 1) b:true none)",
                &[("a", "f64[2,1,3]")],
            ),
            (
                "(aten.sum.dim_IntList (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) (list 0) b:false none)",
                &[("a", "f64[2,3,1,3]")],
            ),
            (
                "(aten.scatter.src (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 (aten.view.default (cat 1 %r0:i %r1:i) (list 4 2)) (aten.view.default (cat 1 %r0:x %r1:x) (list 4 2)))",
                &[("i", "i64[2,1,2]<3"), ("x", "f64[2,1,2]")],
            ),
            (
                "(aten.scatter.value (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 (aten.view.default (cat 1 %r0:i %r1:i) (list 4 2)) f:1.0)",
                &[("i", "i64[2,1,2]<3")],
            ),
            (
                "(aten.expand.default (aten.view.default (cat 1 %r0:a %r1:a) (list 1 4 3)) (list 2 4 3) b:false)",
                &[("a", "f64[2,1,3]")],
            ),
            (
                "(aten.bmm.default (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) %r0:w)",
                &[("a", "f64[2,3,1,3]"), ("w", "f64[2,3,4]")],
            ),
            (
                "(aten.transpose.int (aten.view.default (cat 1 %r0:a %r1:a) (list 4 3)) 0 1)",
                &[("a", "f64[2,1,3]")],
            ),
            (
                "(aten.add.Tensor (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) (aten.view.default (cat 2 %r0:b %r1:b) (list 2 6 3)) 1)",
                &[("a", "f64[2,3,1,3]"), ("b", "f64[2,3,1,3]")],
            ),
            (
                "(aten.gather.default (aten.view.default (cat 1 %r0:x %r1:x) (list 4 3)) 1 (aten.view.default (cat 1 %r0:i %r1:i) (list 4 2)) b:false)",
                &[("x", "f64[2,1,3]"), ("i", "i64[2,1,2]<3")],
            ),
            // The top-k normalization's backward: a per-token column subtracted.
            (
                "(aten.sub.Tensor (aten.view.default (cat 1 %r0:a %r1:a) (list 4 2)) (aten.view.default (cat 1 %r0:b %r1:b) (list 4 1)) 1)",
                &[("a", "f64[2,1,2]"), ("b", "f64[2,1,1]")],
            ),
            (
                "(aten.sigmoid_backward.default (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) (aten.view.default (cat 2 %r0:b %r1:b) (list 2 6 3)))",
                &[("a", "f64[2,3,1,3]"), ("b", "f64[2,3,1,3]")],
            ),
            // A weight gradient: the contraction over interleaved tokens.
            (
                "(aten.mm.default (aten.view.default (cat 2 %r0:a %r1:a) (list 3 4)) (aten.view.default (cat 1 %r0:b %r1:b) (list 4 5)))",
                &[("a", "f64[3,2,1]"), ("b", "f64[2,1,5]")],
            ),
            // The experts' weight gradient: a batched contraction over interleaved tokens.
            (
                "(aten.bmm.default (aten.transpose.int (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) 1 2) (aten.view.default (cat 2 %r0:b %r1:b) (list 2 6 4)))",
                &[("a", "f64[2,3,1,3]"), ("b", "f64[2,3,1,4]")],
            ),
            (
                "(aten.mm.default (aten.transpose.int (aten.view.default (cat 1 %r0:a %r1:a) (list 4 3)) 0 1) (aten.view.default (cat 1 %r0:b %r1:b) (list 4 5)))",
                &[("a", "f64[2,1,3]"), ("b", "f64[2,1,5]")],
            ),
            // A per-sequence factor expanded over the sequence: copies split like the tokens.
            (
                "(aten.mul.Tensor (aten.view.default (cat 1 %r0:u %r0:u %r0:u %r0:u) (list 8 3)) (aten.view.default (cat 1 %r0:a %r1:a) (list 8 3)))",
                &[("u", "f64[2,1,3]"), ("a", "f64[2,2,3]")],
            ),
            // The experts' activation backward on [expert, token, ..] tensors.
            (
                "(aten.silu_backward.default (aten.view.default (cat 2 %r0:a %r1:a) (list 2 6 3)) (aten.view.default (cat 2 %r0:b %r1:b) (list 2 6 3)))",
                &[("a", "f64[2,3,1,3]"), ("b", "f64[2,3,1,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            // Cheap on every other term: a token split needs a view of a concatenation.
            if !kids.iter().any(|&k| views_a_cat(g, k) || calls_on_view_of_cat(g, k)) {
                return vec![];
            }
            let Some(sym) = node_sym(g, eclass, kids, &matched) else { return vec![] };
            let Some(out) = shape(g, eclass) else { return vec![] };
            tokenwise(g, sym, kids, &out).unwrap_or_default()
        }),
    }
}

/// Which operands of a call carry tokens and their token dims, and the output's token dim.
struct TokenPlan {
    /// (operand position, its token dim).
    operands: Vec<(usize, usize)>,
    /// The output's token dim.
    out_at: usize,
}

/// The token plan of a call given the split of its driving operand.
type TokenMap<'a> = &'a dyn Fn(&mut Graph, &TokenSplit) -> Option<TokenPlan>;

/// A call on one piece given its operands' pieces (operand position, piece).
type PerPiece<'a> = &'a dyn Fn(&mut Graph, &[(usize, Id)]) -> Id;

/// For every token split of operand `driver`, the call piece by piece (when every
/// token-carrying operand splits alike) put back in the interleaved order, into `results`.
fn split_call(
    g: &mut Graph,
    kids: &[Id],
    driver: usize,
    out: &[usize],
    map: TokenMap,
    per_piece: PerPiece,
    results: &mut Vec<Id>,
) {
    for form in token_splits(g, kids[driver]) {
        let Some(plan) = map(g, &form) else { continue };
        let mut pieces: Vec<(usize, Vec<Id>)> = Vec::new();
        let wanted = plan.operands.len();
        for (pos, at) in plan.operands {
            let ps = if pos == driver {
                Some(form.pieces(g))
            } else {
                aligned_pieces(g, kids[pos], at, &form)
            };
            match ps {
                Some(ps) => pieces.push((pos, ps)),
                None => break,
            }
        }
        let n = form.sources.len();
        if pieces.len() != wanted || pieces.iter().any(|(_, ps)| ps.len() != n) {
            continue;
        }
        let parts: Vec<Id> = (0..n)
            .map(|i| {
                let rep: Vec<(usize, Id)> = pieces.iter().map(|(p, ps)| (*p, ps[i])).collect();
                per_piece(g, &rep)
            })
            .collect();
        results.push(interleave_at(g, &form, plan.out_at, &parts, out));
    }
}

/// The interleaved forms of a token-wise call `sym(kids)` of output shape `out`.
fn tokenwise(g: &mut Graph, sym: Symbol, kids: &[Id], out: &[usize]) -> Option<Vec<Id>> {
    let s = sym.as_str();
    let norm = |d: i64, rank: usize| if d < 0 { d + rank as i64 } else { d };
    let mut results = Vec::new();
    // (operand positions carrying tokens and their token dims, the output's token dim).
    let mut plan = |g: &mut Graph, driver: usize, map: TokenMap, per_piece: PerPiece| {
        split_call(g, kids, driver, out, map, per_piece, &mut results)
    };
    let call = |g: &mut Graph, rep: &[(usize, Id)]| g.add(with_kids(sym, kids, rep));
    if let Some(e) = super::ew(s) {
        let tensors = e.1;
        let rank_of = |g: &Graph, k: Id| shape(g, k).map(|x| x.len());
        // rows.rs already handles equal shapes (or broadcast rows) with tokens in dim 0.
        for &driver in tensors {
            let Some(dr) = rank_of(g, kids[driver]) else {
                continue;
            };
            let lift = out.len().checked_sub(dr)?;
            let map = |g: &mut Graph, form: &TokenSplit| {
                let out_at = form.at + lift;
                let mut operands = Vec::new();
                let mut rows_case = out_at == 0;
                for &t in tensors {
                    let ts = shape(g, kids[t])?;
                    let Some(at) = (out_at + ts.len()).checked_sub(out.len()) else {
                        continue;
                    };
                    if ts[at] == 1 {
                        continue; // broadcast along the tokens: every piece takes it whole
                    }
                    if ts.as_slice() != out && ts.len() == out.len() && ts[0] != 1 {
                        rows_case = false;
                    }
                    operands.push((t, at));
                }
                // rows.rs takes the rows case, except for copies of a per-sequence factor
                // (which it does not split like the tokens).
                if rows_case
                    && !operands
                        .iter()
                        .any(|&(t, at)| t != driver && copies_split(g, kids[t], at, form).is_some())
                {
                    return None;
                }
                Some(TokenPlan { operands, out_at })
            };
            plan(g, driver, &map, &call);
        }
        return Some(results);
    }
    match s {
        "aten.bmm.default" => {
            // Tokens in the rows of the batched left operand; the right one is per expert.
            let map = |_: &mut Graph, form: &TokenSplit| {
                (form.at == 1).then(|| TokenPlan {
                    operands: vec![(0, 1)],
                    out_at: 1,
                })
            };
            plan(g, 0, &map, &call);
            contract_tokens(g, sym, kids, 2, &mut results);
        }
        "aten.sum.dim_IntList" => {
            let rank = shape(g, kids[0])?.len();
            let dims: Vec<i64> = int_list(g, kids[1])?
                .into_iter()
                .map(|d| norm(d, rank))
                .collect();
            let keep = super::is_true(g, kids[2]);
            let map = |_: &mut Graph, form: &TokenSplit| {
                let at = form.at as i64;
                if dims.is_empty() || dims.contains(&at) {
                    return None;
                }
                let out_at = if keep {
                    form.at
                } else {
                    form.at - dims.iter().filter(|&&d| d < at).count()
                };
                Some(TokenPlan {
                    operands: vec![(0, form.at)],
                    out_at,
                })
            };
            plan(g, 0, &map, &call);
        }
        "aten.scatter.src" | "aten.scatter.value" => {
            let rank = shape(g, kids[0])?.len();
            let dim = norm(int(g, kids[1])?, rank);
            let with_src = s == "aten.scatter.src";
            let map = |_: &mut Graph, form: &TokenSplit| {
                if form.at as i64 == dim {
                    return None;
                }
                let mut ops = vec![(0, form.at), (2, form.at)];
                if with_src {
                    ops.push((3, form.at));
                }
                Some(TokenPlan {
                    operands: ops,
                    out_at: form.at,
                })
            };
            plan(g, 2, &map, &call);
        }
        "aten.mm.default" => contract_tokens(g, sym, kids, 1, &mut results),
        "aten.gather.default" => {
            // Each token picks from its own row (the top-k gradient under sequence parallelism).
            let rank = shape(g, kids[0])?.len();
            let dim = norm(int(g, kids[1])?, rank);
            let map = |_: &mut Graph, form: &TokenSplit| {
                (form.at as i64 != dim).then(|| TokenPlan {
                    operands: vec![(0, form.at), (2, form.at)],
                    out_at: form.at,
                })
            };
            plan(g, 2, &map, &call);
        }
        "aten.expand.default" => {
            let src_rank = shape(g, kids[0])?.len();
            let lift = out.len().checked_sub(src_rank)?;
            let map = |_: &mut Graph, form: &TokenSplit| {
                Some(TokenPlan {
                    operands: vec![(0, form.at)],
                    out_at: form.at + lift,
                })
            };
            let per_piece = |g: &mut Graph, rep: &[(usize, Id)]| {
                let x = rep[0].1;
                let mut sizes = out.to_vec();
                if let Some(xs) = shape(g, x) {
                    for (k, &n) in xs.iter().enumerate() {
                        if n != 1 {
                            sizes[k + lift] = n;
                        }
                    }
                }
                let l = super::list(g, &sizes);
                op(g, "aten.expand.default", vec![x, l, kids[2]])
            };
            plan(g, 0, &map, &per_piece);
        }
        "aten.transpose.int" => {
            // The gates' [tokens, experts] to [experts, tokens]: matrices only. Batched
            // transposes (attention's [batch x heads, seq, dim]) are left to the layout lemmas,
            // which keep heads split along their own dim.
            let rank = shape(g, kids[0])?.len();
            if rank != 2 {
                return None;
            }
            let (a, b) = (
                norm(int(g, kids[1])?, rank) as usize,
                norm(int(g, kids[2])?, rank) as usize,
            );
            let map = |_: &mut Graph, form: &TokenSplit| {
                let out_at = if form.at == a {
                    b
                } else if form.at == b {
                    a
                } else {
                    form.at
                };
                Some(TokenPlan {
                    operands: vec![(0, form.at)],
                    out_at,
                })
            };
            plan(g, 0, &map, &call);
        }
        GET => {
            // get k of topk along another dim than the tokens.
            let k = kids[0];
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(call_sym, ck) = n else { continue };
                if !is_op!(call_sym, "aten.topk.default") {
                    continue;
                }
                let Some(rank) = shape(g, ck[0]).map(|x| x.len()) else {
                    continue;
                };
                let Some(dim) = int(g, ck[2]).map(|d| norm(d, rank)) else {
                    continue;
                };
                for form in token_splits(g, ck[0]) {
                    if form.at as i64 == dim {
                        continue;
                    }
                    let parts: Vec<Id> = form
                        .pieces(g)
                        .iter()
                        .map(|&p| {
                            let c = g.add(with_kids(call_sym, &ck, &[(0, p)]));
                            op(g, GET, vec![k, c])
                        })
                        .collect();
                    results.push(interleave_at(g, &form, form.at, &parts, out));
                }
            }
        }
        _ => {}
    }
    Some(results)
}

/// A (batched) product contracting the tokens (a weight gradient: tokens in dim `k` of the left
/// operand, the last, and in dim `k - 1` of the right): the sum of the pieces' products. The
/// left operand's split is its own, or that of the tokens-first tensor it transposes.
fn contract_tokens(g: &mut Graph, sym: Symbol, kids: &[Id], k: usize, results: &mut Vec<Id>) {
    let mut lefts: Vec<(TokenSplit, Option<(Id, Id)>)> = token_splits(g, kids[0])
        .into_iter()
        .filter(|f| f.at == k)
        .map(|f| (f, None))
        .collect();
    for (x, a, b) in super::transposes(g, kids[0]) {
        if (int(g, a), int(g, b)) != (Some(k as i64 - 1), Some(k as i64)) {
            continue;
        }
        for f in token_splits(g, x) {
            if f.at == k - 1 {
                lefts.push((f, Some((a, b))));
            }
        }
    }
    for (form, transposed) in lefts {
        let Some(rights) = aligned_pieces(g, kids[1], k - 1, &form) else {
            continue;
        };
        let mut ls = form.pieces(g);
        if let Some((a, b)) = transposed {
            ls = ls
                .into_iter()
                .map(|x| op(g, "aten.transpose.int", vec![x, a, b]))
                .collect();
        }
        if ls.len() != rights.len() {
            continue;
        }
        let parts: Vec<Id> = ls
            .iter()
            .zip(&rights)
            .map(|(&a, &b)| g.add(with_kids(sym, kids, &[(0, a), (1, b)])))
            .collect();
        results.push(op(g, SUM, parts));
    }
}

/// `permute(permute(x, p), q) = permute(x, p∘q)`, or `x` when the composition is the identity.
fn permute_of_permute() -> Lemma {
    Lemma {
        name: "permute-of-permute",
        doc: "permute(permute(x, p), q) = permute(x, [p[q[0]], p[q[1]], ..]), x itself when that is the identity (sequence-parallel ranks permute tokens to sequence-first for the all-gather and back)",
        roots: vec!["aten.permute.default".into()],
        examples: vec![
            (
                "(aten.permute.default (aten.permute.default %r0:a (list 1 0 2)) (list 1 0 2))",
                &[("a", "f64[2,3,4]")],
            ),
            (
                "(aten.permute.default (aten.permute.default %r0:a (list 1 2 0)) (list 1 0 2))",
                &[("a", "f64[2,3,4]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(q) = int_list(g, kids[1]) else { return vec![] };
            let mut out = Vec::new();
            let inner: Vec<(Id, Id)> = g[kids[0]]
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Term::Op(s, k) if is_op!(s, "aten.permute.default") => Some((k[0], k[1])),
                    _ => None,
                })
                .take(2)
                .collect();
            for (x, p) in inner {
                let Some(p) = int_list(g, p) else { continue };
                let rank = p.len() as i64;
                let norm = |d: i64| if d < 0 { d + rank } else { d };
                let composed: Option<Vec<usize>> = q
                    .iter()
                    .map(|&qi| usize::try_from(norm(qi)).ok().and_then(|qi| p.get(qi)).map(|&pi| norm(pi) as usize))
                    .collect();
                let Some(c) = composed else { continue };
                if c.len() != p.len() {
                    continue;
                }
                if c.iter().enumerate().all(|(i, &ci)| i == ci) {
                    out.push(x);
                } else {
                    let l = super::list(g, &c);
                    out.push(op(g, "aten.permute.default", vec![x, l]));
                }
            }
            out
        }),
    }
}

/// `cat_d(pieces)` with runs of pieces whose concatenation the e-graph holds replaced by it
/// (looked up, never built); `None` when no run is present. cat-flatten's way backwards: under
/// dp x ep an ep group's tokens are gathered on one rank, so the spec's per-rank token pieces
/// regroup into the concatenations the ranks hold.
pub(super) fn present_runs(g: &mut Graph, d: usize, pieces: &[Id]) -> Option<Id> {
    if pieces.len() < 3 || pieces.iter().all(|&p| g.find(p) == g.find(pieces[0])) {
        return None;
    }
    let dim = g.lookup(Term::Num(d as i64))?;
    let sym = sym!(crate::term::CAT);
    let mut grouped = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        // The longest run from i whose concatenation exists, shorter than the whole.
        let run = (i + 2..=pieces.len())
            .rev()
            .filter(|&j| j - i < pieces.len())
            .find_map(|j| {
                let node = Term::Op(
                    sym,
                    std::iter::once(dim)
                        .chain(pieces[i..j].iter().copied())
                        .collect(),
                );
                g.lookup(node).map(|id| (j, id))
            })
            .filter(|&(j, _)| !one_rank_run(g, &pieces[i..j]));
        match run {
            Some((j, id)) => {
                grouped.push(id);
                i = j;
            }
            None => {
                grouped.push(pieces[i]);
                i += 1;
            }
        }
    }
    (grouped.len() < pieces.len()).then(|| cat(g, d, grouped))
}

/// Whether some rank holds (a slice of) every piece, or a piece is no rank's tensor: such a run
/// is not regrouped. Regrouping gathers the pieces of several ranks into the concatenation one
/// rank holds (dp x ep); a rank's own chunks under context parallelism are the blocks ring
/// attention computes with, and regrouped, the relation passed on would hide them.
fn one_rank_run(g: &Graph, pieces: &[Id]) -> bool {
    let ranks = |p: Id| -> Vec<usize> {
        let leaf_ranks = |c: Id| {
            g[c].nodes.iter().filter_map(|n| match n {
                Term::Op(s, k) if k.is_empty() => {
                    crate::term::parse_leaf(s.as_str()).map(|(r, _)| r)
                }
                _ => None,
            })
        };
        let mut out: Vec<usize> = leaf_ranks(p).collect();
        for n in &g[p].nodes {
            if let Term::Op(s, k) = n {
                if is_op!(s, crate::term::SLICE) && k.len() == 4 {
                    out.extend(leaf_ranks(k[3]));
                }
            }
        }
        out
    };
    let sets: Vec<Vec<usize>> = pieces.iter().map(|&p| ranks(p)).collect();
    if sets.iter().any(Vec::is_empty) {
        return true;
    }
    sets[0]
        .iter()
        .any(|r| sets[1..].iter().all(|s| s.contains(r)))
}

// ---------------------------------------------------------------------------------------------
// The all-to-all dispatcher: each rank lays its tokens' gates out per expert group
// (`view(permute(view(gates, [t, groups, e]), [1, 0, 2]), [groups * t, e])`) and the
// all-to-all hands group g's rows to rank g. A block of rows of such a layout is a slice of the
// gates' columns.

/// `slice(d, a, b, view(y, s))` where the slice takes whole blocks of the outermost of the dims
/// of `y` that flatten into dim `d` of `s`: that slice of `y`, `(i, a', b')`.
fn slice_of_view(
    ys: &[usize],
    s: &[usize],
    d: usize,
    a: usize,
    b: usize,
) -> Option<(usize, usize, usize)> {
    if d >= s.len() || product(ys) != product(s) {
        return None;
    }
    // The dims of s and ys that flatten into one another from d: s[d..l] and ys[i..j], i the
    // innermost dim of ys where the flat prefixes meet (leading unit dims skipped).
    let before = product(&s[..d]);
    let i = (0..ys.len()).rev().find(|&i| product(&ys[..i]) == before)?;
    // The smallest l > d and j > i where the prefixes meet again.
    let (mut l, mut j) = (d + 1, i + 1);
    loop {
        let (ps, py) = (product(&s[..l]), product(&ys[..j]));
        if ps == py {
            break;
        }
        if ps < py {
            l += 1;
        } else {
            j += 1;
        }
        if l > s.len() || j > ys.len() {
            return None;
        }
    }
    // Slicing dim d (the outermost of its group) takes the group's flat run
    // [a * ms, b * ms): a slice of ys[i] when that run is whole blocks of it.
    let ms = product(&s[d + 1..l]);
    let mt = product(&ys[i + 1..j]);
    if !(a * ms).is_multiple_of(mt) || !(b * ms).is_multiple_of(mt) {
        return None;
    }
    Some((i, a * ms / mt, b * ms / mt))
}

/// A slice: (dim, start, end).
type Range = (usize, usize, usize);

/// A slice followed inward: the class it finally slices, the slice there, and the layout
/// steps back out (innermost first).
type Traced = (Id, Range, Vec<LayoutStep>);

/// One layout step on the way from a slice to the tensor it slices.
enum LayoutStep {
    /// `permute(x, p)` (the list class).
    Permute(Id),
    /// `view(x, s)` to shape `s`, sliced along dim `.1` to extent `.2`.
    View(Vec<usize>, usize, usize),
}

/// The slice `(d, a, b)` of class `x` followed through its layout operators: the class it
/// finally slices, the slice there, and the steps from there back out (innermost first);
/// `None` where a step does not turn into a slice. Follows at most `depth` steps.
fn slice_through(g: &Graph, x: Id, (d, a, b): Range, depth: usize) -> Option<Traced> {
    let layout = g[x].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.permute.default") || is_op!(s, "aten.view.default") => {
            Some((is_op!(s, "aten.permute.default"), k[0], k[1]))
        }
        _ => None,
    });
    let Some((is_permute, inner, arg)) = layout.filter(|_| depth > 0) else {
        return Some((x, (d, a, b), Vec::new()));
    };
    let (inner_slice, step) = if is_permute {
        let p = int_list(g, arg)?;
        let rank = p.len() as i64;
        let pd = *p.get(d)?;
        (
            (
                usize::try_from(if pd < 0 { pd + rank } else { pd }).ok()?,
                a,
                b,
            ),
            LayoutStep::Permute(arg),
        )
    } else {
        let s = shape(g, x)?;
        (
            slice_of_view(&shape(g, inner)?, &s, d, a, b)?,
            LayoutStep::View(s, d, b - a),
        )
    };
    let (base, at, mut steps) = slice_through(g, inner, inner_slice, depth - 1)?;
    steps.push(step);
    Some((base, at, steps))
}

/// Slices of chains of views and permutes that are the chains over a slice.
fn slice_through_layout() -> Lemma {
    Lemma {
        name: "slice-through-layout",
        doc: "slice(d, a, b, permute(z, p)) = permute(slice(p[d], a, b, z), p); slice(d, a, b, view(y, s)) = view(slice(i, a', b', y), s') when dim d of s is the outermost of a group of dims flattening dims i.. of y and [a, b) takes whole blocks of y's dim i; applied to whole chains with a permute in them, and only when every step turns into a slice (the all-to-all dispatcher's rows per expert group)",
        roots: vec![super::SLICE.into()],
        examples: vec![
            (
                "(slice 0 0 1 (aten.permute.default %r0:z (list 1 0 2)))",
                &[("z", "f64[4,2,3]")],
            ),
            (
                "(slice 0 0 4 (aten.view.default (aten.permute.default %r0:y (list 1 0 2)) (list 8 3)))",
                &[("y", "f64[4,2,3]")],
            ),
            (
                "(slice 0 0 4 (aten.view.default (aten.permute.default (aten.view.default %r0:x (list 4 2 2)) (list 1 0 2)) (list 8 2)))",
                &[("x", "f64[4,4]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(d), Some(a), Some(b)) = (int(g, kids[0]), int(g, kids[1]), int(g, kids[2])) else {
                return vec![];
            };
            let (Ok(d), Ok(a), Ok(b)) = (usize::try_from(d), usize::try_from(a), usize::try_from(b)) else {
                return vec![];
            };
            let Some((base, (bd, ba, bb), steps)) = slice_through(g, kids[3], (d, a, b), 4) else {
                return vec![];
            };
            // Only chains through a permute: a slice of a plain view is left as it is (the
            // layout lemmas and the relations handle those).
            if !steps.iter().any(|s| matches!(s, LayoutStep::Permute(_))) {
                return vec![];
            }
            let mut x = super::slice(g, bd, ba, bb, base);
            for step in steps {
                x = match step {
                    LayoutStep::Permute(p) => op(g, "aten.permute.default", vec![x, p]),
                    LayoutStep::View(mut s, dim, len) => {
                        s[dim] = len;
                        view_as(g, x, &s)
                    }
                };
            }
            vec![x]
        }),
    }
}

/// A permute that keeps the dims longer than one in order is a view.
fn permute_of_unit_dims() -> Lemma {
    Lemma {
        name: "permute-of-unit-dims",
        doc: "permute(x, p) = view(x, shape) when p keeps the order of the dims longer than one (it only moves dims of size one)",
        roots: vec!["aten.permute.default".into()],
        examples: vec![(
            "(aten.permute.default %r0:x (list 1 0 2))",
            &[("x", "f64[4,1,2]")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(p), Some(xs), Some(out)) = (int_list(g, kids[1]), shape(g, kids[0]), shape(g, eclass)) else {
                return vec![];
            };
            let rank = xs.len() as i64;
            let kept: Vec<i64> = p
                .iter()
                .map(|&d| if d < 0 { d + rank } else { d })
                .filter(|&d| usize::try_from(d).ok().and_then(|d| xs.get(d)).is_some_and(|&n| n != 1))
                .collect();
            if kept.windows(2).any(|w| w[0] > w[1]) || p.iter().enumerate().all(|(i, &d)| i as i64 == d) {
                return vec![];
            }
            vec![view_as(g, kids[0], &out)]
        }),
    }
}

/// A permute that swaps two dims is that transpose.
fn permute_as_transpose() -> Lemma {
    Lemma {
        name: "permute-as-transpose",
        doc: "permute(x, p) = transpose(x, a, b) when p swaps dims a < b and keeps the others (the layout lemmas write permutes, the ranks transpose: a weight gradient's transposed activations under sequence parallelism)",
        roots: vec!["aten.permute.default".into()],
        examples: vec![
            ("(aten.permute.default %r0:x (list 1 0))", &[("x", "f64[3,2]")]),
            ("(aten.permute.default %r0:x (list 0 3 2 1))", &[("x", "f64[2,3,4,2]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(p) = int_list(g, kids[1]) else { return vec![] };
            let rank = p.len() as i64;
            let moved: Vec<usize> = p
                .iter()
                .enumerate()
                .filter(|&(i, &d)| (if d < 0 { d + rank } else { d }) != i as i64)
                .map(|(i, _)| i)
                .collect();
            let [a, b] = moved[..] else { return vec![] };
            let norm = |d: i64| if d < 0 { d + rank } else { d };
            if norm(p[a]) != b as i64 || norm(p[b]) != a as i64 {
                return vec![];
            }
            let (a, b) = (super::num(g, a as i64), super::num(g, b as i64));
            vec![op(g, "aten.transpose.int", vec![kids[0], a, b])]
        }),
    }
}
