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

/// The size of what the integer input `v` of `graph` indexes (embedding rows, an indexed dim,
/// a gathered dim, classes of nll_loss), following dtype casts and the views and movements
/// that keep every element (permute, transpose, squeeze, expand...), the smallest where it
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
    let consumers = graph.consumers();
    let mut bound = i64::MAX;
    let mut frontier = vec![v];
    let mut seen = 0;
    while let Some(cur) = frontier.pop() {
        seen += 1;
        if seen > 64 {
            break;
        }
        for &c in &consumers[cur.node] {
            let node = &graph.nodes[c];
            let Some(op) = node.op() else { continue };
            let args = node.args();
            let is = |i: usize| args.get(i).and_then(|a| a.as_value()) == Some(cur);
            let dim_of = |i: usize, d: usize| -> Option<i64> {
                let t = args.get(i)?.as_value()?;
                metas[t.node]
                    .get(t.output)?
                    .as_ref()?
                    .shape
                    .get(d)
                    .map(|&s| s as i64)
            };
            let found = match op.name.as_str() {
                "embedding" if is(1) => dim_of(0, 0),
                "nll_loss_forward" | "nll_loss_backward" if is(1) || is(2) => {
                    let i = if op.name == "nll_loss_forward" { 0 } else { 1 };
                    let t = args.get(i).and_then(|a| a.as_value());
                    t.and_then(|t| metas[t.node].get(t.output)?.as_ref())
                        .and_then(|m| {
                            m.shape
                                .get(if m.shape.len() > 1 { 1 } else { 0 })
                                .map(|&s| s as i64)
                        })
                }
                "index_select" | "gather" | "scatter" | "scatter_add" if is(2) => args
                    .get(1)
                    .and_then(|a| a.as_int())
                    .and_then(|d| dim_of(0, if d < 0 { 0 } else { d as usize })),
                "index" | "index_put" => match args.get(1) {
                    Some(Arg::List(items)) => items
                        .iter()
                        .position(|a| a.as_value() == Some(cur))
                        .and_then(|d| dim_of(0, d)),
                    _ => None,
                },
                "_to_copy" | "clone" | "view" | "_unsafe_view" | "reshape" | "detach" | "to"
                | "contiguous" | "lift_fresh_copy" | "permute" | "transpose" | "t" | "squeeze"
                | "unsqueeze" | "expand" | "flatten" | "alias" => {
                    if node.outputs.len() == 1 {
                        frontier.push(ValueId::new(c, 0));
                    }
                    None
                }
                _ => None,
            };
            if let Some(b) = found {
                bound = bound.min(b);
            }
        }
    }
    (bound != i64::MAX).then(|| bound.max(1))
}
