//! Which values an integer input may take without indexing out of range.

use shardproof_ir::{Arg, Graph, ValueId};
use shardproof_ops::Meta;

/// The largest safe value + 1 for an integer input `v` of `graph`: the size of what it indexes
/// (embedding rows, an indexed dim, a gathered dim, classes of nll_loss), following dtype casts
/// and views; 8 when it indexes nothing. `run` draws integer inputs below it, and `prove`
/// ranges integer symbols over it.
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
                | "contiguous" | "lift_fresh_copy" => {
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
    if bound == i64::MAX {
        DEFAULT
    } else {
        bound.max(1)
    }
}
