//! Which values an integer input may take without indexing out of range.

use shardproof_ir::{Arg, Graph, ValueId};
use shardproof_ops::Meta;

/// The largest safe value + 1 for an integer input `v` of `graph`: [`index_bound_known`], or
/// 8 when it indexes nothing. `run` draws integer inputs below it (any range is a valid test
/// input there); `prove` must not range symbols over the default, which would prove a claim
/// for the values below 8 only, and uses [`index_bound_known`].
///
/// ```
/// use shardproof_interp::{index_bound, infer_graph};
/// let text = "def forward(self, w: \"f32[10, 4]\", t: \"i64[3]\"):\n    \
///     e: \"f32[3, 4]\" = torch.ops.aten.embedding.default(w, t)\n    return (e,)\n";
/// let g = shardproof_import::parse_fx(text, std::path::Path::new("g.py")).unwrap().graph;
/// let metas = infer_graph(&g, &Default::default()).metas;
/// assert_eq!(index_bound(&g, g.inputs[1], &metas), 10);
/// ```
pub fn index_bound(graph: &Graph, v: ValueId, metas: &[Vec<Option<Meta>>]) -> i64 {
    const DEFAULT: i64 = 8;
    index_bound_known(graph, v, metas).unwrap_or(DEFAULT)
}

/// The size of what the integer input `v` of `graph` indexes (embedding rows, an embedding
/// backward's `num_weights` rows, an indexed dim, a gathered dim, classes of nll_loss),
/// following dtype casts and the views and movements that keep every element (permute,
/// transpose, squeeze, expand...), the smallest where it
/// indexes several; `None` when it indexes nothing found there. Movements that keep only
/// some elements (slice, select) are not followed: their consumer's bound would say nothing
/// of the elements they drop.
///
/// ```
/// use shardproof_interp::{index_bound_known, infer_graph};
/// let text = "def forward(self, w: \"f32[10, 4]\", t: \"i64[2, 3]\"):\n    \
///     p: \"i64[3, 2]\" = torch.ops.aten.permute.default(t, [1, 0])\n    \
///     e: \"f32[3, 2, 4]\" = torch.ops.aten.embedding.default(w, p)\n    return (e,)\n";
/// let g = shardproof_import::parse_fx(text, std::path::Path::new("g.py")).unwrap().graph;
/// let metas = infer_graph(&g, &Default::default()).metas;
/// assert_eq!(index_bound_known(&g, g.inputs[1], &metas), Some(10));
/// assert_eq!(index_bound_known(&g, g.inputs[0], &metas), None);
/// ```
pub fn index_bound_known(graph: &Graph, v: ValueId, metas: &[Vec<Option<Meta>>]) -> Option<i64> {
    let meta = |t: ValueId| metas.get(t.node)?.get(t.output)?.as_ref();
    index_uses(graph, v, IndexWalk::BOUND, |t| {
        meta(t).map(|m| m.shape.len())
    })
    .iter()
    .filter_map(|u| meta(u.table)?.shape.get(u.dim).map(|&s| s as i64))
    .min()
    .map(|b| b.max(1))
}

/// How far [`index_uses`] walks from the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexWalk {
    /// Also follow `slice`, which keeps only some elements: right for keeping every dim an
    /// index may read (shape reduction), wrong for a bound on every element.
    pub through_slices: bool,
    /// Stop after this many values (the value itself counts): a use found before is kept.
    pub max_values: usize,
}

impl IndexWalk {
    /// The walk [`index_bound_known`] takes: whole-value movements only, 64 values.
    pub const BOUND: IndexWalk = IndexWalk {
        through_slices: false,
        max_values: 64,
    };
}

/// One use of a value as an index: `consumer` reads it to index dim `dim` of `table`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexUse {
    /// The node that indexes (embedding and its dense backward, nll_loss, gather, scatter,
    /// index_select, index).
    pub consumer: usize,
    /// The tensor indexed (the embedding's table, the loss's input, the gather's source, an
    /// embedding backward's output: the table gradient whose rows the indices name).
    pub table: ValueId,
    /// The dim of `table` whose size bounds the index values.
    pub dim: usize,
}

/// Every place the integer value `v` of `graph` indexes a dim, directly or through dtype
/// casts and the movements that keep every element (and slices, where `walk` says so): an
/// embedding's rows (or its dense backward's `num_weights` output rows), an `nll_loss`
/// target's classes, the dim a gather, scatter or index_select names, an `index` position's
/// dim. `rank` gives a value's rank (to normalize a negative dim and find the classes dim); a
/// use whose rank is unknown is left out, so a caller that needs every use must know every
/// rank. This is the one walk both the
/// prover's symbol ranges ([`index_bound_known`]) and shape reduction's kept ranges
/// (`shardproof_prove`'s `range_dims`) take, so the reduction keeps every dim a range is
/// read from.
///
/// ```
/// use shardproof_interp::{index_uses, infer_graph, IndexWalk};
/// let text = "def forward(self, w: \"f32[10, 4]\", x: \"f32[3, 7]\", t: \"i64[3]\"):\n    \
///     e: \"f32[3, 4]\" = torch.ops.aten.embedding.default(w, t)\n    \
///     u: \"i64[3, 1]\" = torch.ops.aten.unsqueeze.default(t, 1)\n    \
///     g: \"f32[3, 1]\" = torch.ops.aten.gather.default(x, -1, u)\n    return (e, g)\n";
/// let g = shardproof_import::parse_fx(text, std::path::Path::new("g.py")).unwrap().graph;
/// let metas = infer_graph(&g, &Default::default()).metas;
/// let rank = |v: shardproof_ir::ValueId| Some(metas[v.node][v.output].as_ref()?.shape.len());
/// let mut uses = index_uses(&g, g.inputs[2], IndexWalk::BOUND, rank);
/// uses.sort_by_key(|u| u.consumer);
/// // The embedding's rows, then the gather's last dim (not dim 0) of `x`.
/// assert_eq!((uses[0].table, uses[0].dim), (g.inputs[0], 0));
/// assert_eq!((uses[1].table, uses[1].dim), (g.inputs[1], 1));
/// ```
pub fn index_uses(
    graph: &Graph,
    v: ValueId,
    walk: IndexWalk,
    rank: impl Fn(ValueId) -> Option<usize>,
) -> Vec<IndexUse> {
    let consumers = graph.consumers();
    let mut uses = Vec::new();
    let mut frontier = vec![v];
    let mut seen = 0;
    while let Some(cur) = frontier.pop() {
        seen += 1;
        if seen > walk.max_values {
            break;
        }
        for &c in &consumers[cur.node] {
            let node = &graph.nodes[c];
            let Some(op) = node.op() else { continue };
            let args = node.args();
            let is = |i: usize| args.get(i).and_then(|a| a.as_value()) == Some(cur);
            let value = |i: usize| args.get(i).and_then(|a| a.as_value());
            let found: Option<(ValueId, usize)> = match op.name.as_str() {
                "embedding" if is(1) => value(0).map(|t| (t, 0)),
                // The backward writes each position's gradient to the row its index names:
                // the rows are the output's dim 0, `num_weights` long (shape inference sets
                // it from that literal, and shape reduction rewrites the literal from the same
                // dim), and an index outside them is no valid input, as for `embedding`.
                "embedding_dense_backward" if is(1) => Some((ValueId::new(c, 0), 0)),
                "nll_loss_forward" | "nll_loss_backward" if is(1) || is(2) => {
                    let i = if op.name == "nll_loss_forward" { 0 } else { 1 };
                    value(i).and_then(|t| Some((t, if rank(t)? > 1 { 1 } else { 0 })))
                }
                "index_select" | "gather" | "scatter" | "scatter_add" if is(2) => value(0)
                    .and_then(|t| {
                        let d = args.get(1)?.as_int()?;
                        let r = rank(t)? as i64;
                        let d = if d < 0 { d + r } else { d };
                        (0..r.max(1)).contains(&d).then_some((t, d as usize))
                    }),
                "index" | "index_put" => match args.get(1) {
                    Some(Arg::List(items)) => items
                        .iter()
                        .position(|a| a.as_value() == Some(cur))
                        .and_then(|d| Some((value(0)?, d))),
                    _ => None,
                },
                "slice" if !walk.through_slices => None,
                "_to_copy" | "clone" | "view" | "_unsafe_view" | "reshape" | "detach" | "to"
                | "contiguous" | "lift_fresh_copy" | "permute" | "transpose" | "t" | "squeeze"
                | "unsqueeze" | "expand" | "flatten" | "alias" | "slice" => {
                    if node.outputs.len() == 1 {
                        frontier.push(ValueId::new(c, 0));
                    }
                    None
                }
                _ => None,
            };
            if let Some((table, dim)) = found {
                uses.push(IndexUse {
                    consumer: c,
                    table,
                    dim,
                });
            }
        }
    }
    uses
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer_graph;

    fn graph(text: &str) -> (Graph, Vec<Vec<Option<Meta>>>) {
        let g = shardproof_import::parse_fx(text, std::path::Path::new("g.py"))
            .unwrap()
            .graph;
        let metas = infer_graph(&g, &Default::default()).metas;
        (g, metas)
    }

    #[test]
    fn the_walk_finds_each_use_and_follows_slices_only_when_asked() {
        // Labels index nll_loss's classes (dim 1 of a 2-d input) whole, and a table's rows
        // through a slice only.
        let (g, metas) = graph(
            "def forward(self, x: \"f32[4, 9]\", w: \"f32[5, 2]\", t: \"i64[4]\"):\n    \
             n = torch.ops.aten.nll_loss_forward.default(x, t, None, 1, -100)\n    \
             l: \"f32[]\" = n[0]\n    \
             s: \"i64[2]\" = torch.ops.aten.slice.Tensor(t, 0, 0, 2)\n    \
             e: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, s)\n    return (l, e)\n",
        );
        let rank = |v: ValueId| Some(metas[v.node][v.output].as_ref()?.shape.len());
        let t = g.inputs[2];
        let whole = index_uses(&g, t, IndexWalk::BOUND, rank);
        assert_eq!(
            whole.iter().map(|u| (u.table, u.dim)).collect::<Vec<_>>(),
            vec![(g.inputs[0], 1)]
        );
        let sliced = IndexWalk {
            through_slices: true,
            ..IndexWalk::BOUND
        };
        let mut all: Vec<_> = index_uses(&g, t, sliced, rank)
            .iter()
            .map(|u| (u.table, u.dim))
            .collect();
        all.sort();
        assert_eq!(all, vec![(g.inputs[0], 1), (g.inputs[1], 0)]);
        // The bound reads the whole-value uses only: 9 classes, not the sliced 5 rows.
        assert_eq!(index_bound_known(&g, t, &metas), Some(9));
        // A walk cut before its first use finds nothing.
        let none = IndexWalk {
            through_slices: true,
            max_values: 0,
        };
        assert!(index_uses(&g, t, none, rank).is_empty());
    }

    #[test]
    fn an_embedding_backward_bounds_its_indices_by_its_rows() {
        // The only use of the tokens: the backward's 10 output rows (its `num_weights`), read
        // through a view; the gradient (a float input) indexes nothing.
        let (g, metas) = graph(
            "def forward(self, grad: \"f32[2, 3, 4]\", t: \"i64[6]\"):\n    \
             v: \"i64[2, 3]\" = torch.ops.aten.view.default(t, [2, 3])\n    \
             w: \"f32[10, 4]\" = torch.ops.aten.embedding_dense_backward.default(grad, v, 10, -1, False)\n    \
             return (w,)\n",
        );
        let rank = |v: ValueId| Some(metas[v.node][v.output].as_ref()?.shape.len());
        let t = g.inputs[1];
        let uses = index_uses(&g, t, IndexWalk::BOUND, rank);
        let backward = g.find("w").unwrap();
        assert_eq!(
            uses.iter().map(|u| (u.table, u.dim)).collect::<Vec<_>>(),
            vec![(backward, 0)]
        );
        assert_eq!(index_bound_known(&g, t, &metas), Some(10));
        assert_eq!(index_bound(&g, t, &metas), 10);
        assert_eq!(index_bound_known(&g, g.inputs[0], &metas), None);
    }

    #[test]
    fn a_negative_gather_dim_bounds_by_the_dim_it_names() {
        // gather along -1 of a [3, 100] source: the index ranges over 100, not dim 0's 3.
        let (g, metas) = graph(
            "def forward(self, x: \"f32[3, 100]\", t: \"i64[3, 1]\"):\n    \
             y: \"f32[3, 1]\" = torch.ops.aten.gather.default(x, -1, t)\n    return (y,)\n",
        );
        assert_eq!(index_bound_known(&g, g.inputs[1], &metas), Some(100));
    }
}
