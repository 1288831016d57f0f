//! Approximation overrides (TrainVerify, seed 000, section 5.3): a parallel plan may compute
//! an *approximation* of the spec on purpose — per-device BatchNorm statistics instead of the
//! global batch's, MoE routing limited to a few nodes instead of every expert. The user accepts
//! it in `assume:`; following the seed, the prover substitutes the strict computation *in the
//! ranks* before symbolic execution (the omitted cross-device average restored; the mask that
//! limits routing bypassed), so the proof states that the plan equals the spec up to exactly
//! the accepted approximations, and the report lists each one.
//!
//! An override is checked against the graphs before it is applied, and a wrong one is invalid
//! input (exit 2) located at the `assume:` entry: a statistic that is not a mean, a mesh dim
//! along which the statistic's input does not differ between ranks (averaging over it would
//! change nothing: the batch is split over another dim), a masked value that is not a
//! `masked_fill` / `where`, or a mask whose node selection is not a top-`top-nodes` of `nodes`.
//! These checks only reject: a proof under an override is a proof of the overridden ranks,
//! never of the approximate ones.

use serde::Serialize;
use shardproof_case::{Case, Layout, Override, Placement};
use shardproof_ir::{
    Arg, Graph, Located, Node, NodeKind, OpName, Output, ProcessGroup, SourceError, ValueId,
};
use std::collections::HashMap;
use std::sync::Arc;

/// One override applied, for the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AppliedOverride {
    /// The `assume:` key (`batch-norm`, `moe-routing`).
    pub assumption: String,
    /// What was substituted, in words.
    pub substituted: String,
    /// Distinct rank graphs rewritten.
    pub graphs: usize,
    /// Ranks whose graph was rewritten.
    pub ranks: usize,
}

/// Applies every override of `case.assume` to the ranks and returns the rewritten case with
/// what was applied (empty, and the case unchanged, when there is none). A wrong override is a
/// [`SourceError`] at its `assume:` entry.
pub fn apply_overrides(case: &Case) -> Result<(Case, Vec<AppliedOverride>), SourceError> {
    let mut out = case.clone();
    let mut applied = Vec::new();
    for o in &case.assume.overrides {
        applied.push(apply_one(&mut out, o)?);
    }
    Ok((out, applied))
}

/// How a rewritten graph's values map to the original's: `map[node][output]`.
type ValueMap = Vec<Vec<ValueId>>;

fn err(case: &Case, at: shardproof_ir::Span, msg: String, hint: String) -> SourceError {
    SourceError::new(&case.file, Some(at), msg).with_hint(hint)
}

fn apply_one(case: &mut Case, o: &Override) -> Result<AppliedOverride, SourceError> {
    let names = match o {
        Override::BatchNormPerDevice { stats, .. } => stats,
        Override::NodeLimitedRouting { scores, .. } => scores,
    };
    // Every named value must be somewhere among the ranks.
    for n in names {
        if !case
            .program
            .ranks
            .iter()
            .any(|g| g.find(&n.value).is_some())
        {
            let all: Vec<&str> = case
                .program
                .ranks
                .iter()
                .flat_map(|g| g.nodes.iter().flat_map(|n| n.outputs.iter()))
                .map(|o| o.name.as_str())
                .collect();
            return Err(err(
                case,
                n.span,
                format!(
                    "no rank graph has a value `{}`{}",
                    n.value,
                    suggestion(&n.value, &all)
                ),
                "name values of the rank graphs (the ranks compute the approximation)".into(),
            ));
        }
    }
    let mut group_name = None;
    if let Override::BatchNormPerDevice { dim, .. } = o {
        group_name = Some(group_along(case, *dim));
    }
    // Rewrite each distinct graph once; ranks sharing a graph share the rewritten one.
    let mut done: Vec<(*const Graph, Arc<Graph>, ValueMap)> = Vec::new();
    let mut ranks = 0;
    for r in 0..case.program.ranks.len() {
        let g = case.program.ranks[r].clone();
        if !names.iter().any(|n| g.find(&n.value).is_some()) {
            continue;
        }
        ranks += 1;
        let key = Arc::as_ptr(&g);
        let (new, map) = match done.iter().find(|(k, _, _)| *k == key) {
            Some((_, new, map)) => (new.clone(), map.clone()),
            None => {
                let (graph, map) = match o {
                    Override::BatchNormPerDevice {
                        group, dim, stats, ..
                    } => {
                        let varies = varying(case, &g);
                        average_stats(
                            case,
                            &g,
                            &varies,
                            group,
                            *dim,
                            stats,
                            group_name.as_deref().unwrap_or_default(),
                        )?
                    }
                    Override::NodeLimitedRouting {
                        scores,
                        nodes,
                        top_nodes,
                        ..
                    } => unmask_scores(case, &g, scores, nodes, top_nodes)?,
                };
                let graph = Arc::new(graph);
                done.push((key, graph.clone(), map.clone()));
                (graph, map)
            }
        };
        case.program.ranks[r] = new;
        let remap = |v: &mut ValueId| *v = map[v.node][v.output];
        for rel in &mut case.inputs {
            remap_rank(&mut rel.impl_values, &mut rel.rank_values, r, remap);
        }
        for exp in &mut case.outputs {
            remap_rank(&mut exp.impl_values, &mut exp.rank_values, r, remap);
        }
    }
    let quoted: Vec<String> = names.iter().map(|n| format!("`{}`", n.value)).collect();
    let (assumption, substituted) = match o {
        Override::BatchNormPerDevice { group, .. } => (
            "batch-norm",
            format!(
                "per-device batch statistics {} averaged over `{}` (the global batch's statistics)",
                quoted.join(", "),
                group.value
            ),
        ),
        Override::NodeLimitedRouting {
            nodes, top_nodes, ..
        } => (
            "moe-routing",
            format!(
                "routing scores {} limited to the top {} of {} nodes taken unmasked (routing over every expert)",
                quoted.join(", "),
                top_nodes.value,
                nodes.value
            ),
        ),
    };
    Ok(AppliedOverride {
        assumption: assumption.into(),
        substituted,
        graphs: done.len(),
        ranks,
    })
}

fn suggestion(name: &str, all: &[&str]) -> String {
    match shardproof_case::did_you_mean(name, all.iter().copied()).first() {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

fn remap_rank(
    impl_values: &mut [ValueId],
    rank_values: &mut [(usize, ValueId)],
    rank: usize,
    remap: impl Fn(&mut ValueId),
) {
    if let Some(v) = impl_values.get_mut(rank) {
        remap(v);
    }
    for (r, v) in rank_values.iter_mut() {
        if *r == rank {
            remap(v);
        }
    }
}

/// The process group that varies only mesh dim `dim`: an existing one with those members, or
/// one added to the program.
fn group_along(case: &mut Case, dim: usize) -> String {
    let members = case.program.mesh.groups_along(&[dim]);
    let mut sorted = members.clone();
    sorted.sort();
    for g in &case.program.groups {
        let mut m = g.members.clone();
        m.iter_mut().for_each(|x| x.sort());
        m.sort();
        if m == sorted {
            return g.name.clone();
        }
    }
    let base = format!("assume-{}", case.program.mesh.dims[dim].0);
    let mut name = base.clone();
    let mut k = 1;
    while case.program.group(&name).is_some() {
        k += 1;
        name = format!("{base}-{k}");
    }
    case.program.groups.push(ProcessGroup {
        name: name.clone(),
        members,
    });
    name
}

/// For every value of `g`, the mesh dims (bits, by index) along which ranks running `g` may
/// hold different data: a rank input differs along the dims its layout shards or splits into
/// partial shares, an input the case does not lay out along every dim; a result along the
/// union of its arguments'. An over-approximation: it only serves to reject an override.
fn varying(case: &Case, g: &Arc<Graph>) -> Vec<u64> {
    let all = u64::MAX;
    let mut input_bits: HashMap<usize, u64> = HashMap::new();
    for rel in &case.inputs {
        let bits = match &rel.layout {
            Layout::Placed(p) => p
                .placements
                .iter()
                .enumerate()
                .filter(|(_, pl)| !matches!(pl, Placement::Replicate))
                .fold(0u64, |b, (i, _)| b | (1u64 << i.min(63))),
            Layout::Expr(_) => all,
        };
        for &(r, v) in &rel.rank_values {
            if Arc::ptr_eq(&case.program.ranks[r], g) {
                *input_bits.entry(v.node).or_insert(0) |= bits;
            }
        }
    }
    let mut out = vec![0u64; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        out[i] = match &n.kind {
            NodeKind::Input => input_bits.get(&i).copied().unwrap_or(all),
            NodeKind::Constant { .. } => 0,
            NodeKind::Call { .. } => n.inputs().iter().fold(0, |b, v| b | out[v.node]),
        };
    }
    out
}

fn where_in(g: &Graph, node: &Node) -> String {
    let file = g
        .path
        .as_ref()
        .map_or_else(|| g.name.clone(), |p| p.display().to_string());
    match node.line {
        Some(l) => format!("{file}:{l}"),
        None => file,
    }
}

/// Restores the cross-device average of each per-device statistic: after every named `mean`,
/// an `all_reduce(avg)` over mesh dim `dim` and its `wait_tensor`, read by every later use.
fn average_stats(
    case: &Case,
    g: &Graph,
    varies: &[u64],
    group: &Located<String>,
    dim: usize,
    stats: &[Located<String>],
    group_name: &str,
) -> Result<(Graph, ValueMap), SourceError> {
    let mut marked: HashMap<usize, &Located<String>> = HashMap::new();
    for s in stats {
        let Some(v) = g.find(&s.value) else { continue };
        let node = &g.nodes[v.node];
        let is_mean = node
            .op()
            .is_some_and(|op| op.namespace == "aten" && op.name == "mean");
        if !is_mean || v.output != 0 {
            return Err(err(
                case,
                s.span,
                format!(
                    "`{}` ({}) is `{}`, not a mean: a per-device batch statistic is a mean over the batch",
                    s.value,
                    where_in(g, node),
                    node.op().map_or_else(|| "an input".into(), |op| op.to_string())
                ),
                "name the means of the batch statistics; write a variance as the mean of squared deviations from the (overridden) mean, whose average over the devices is the global variance".into(),
            ));
        }
        let input = node.args().first().and_then(Arg::as_value);
        let differs = input.is_some_and(|x| varies[x.node] & (1u64 << dim.min(63)) != 0);
        if !differs {
            let other: Vec<&str> = case
                .program
                .mesh
                .dims
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    input.is_some_and(|x| varies[x.node] & (1u64 << (*i).min(63)) != 0)
                })
                .map(|(_, (n, _))| n.as_str())
                .collect();
            return Err(err(
                case,
                group.span,
                format!(
                    "`{}`'s input is the same on every rank along `{}` ({}): its statistics are not per-device along `{}`, so averaging over it would change nothing",
                    s.value,
                    group.value,
                    where_in(g, node),
                    group.value
                ),
                if other.is_empty() {
                    "name the mesh dim the batch is split over".into()
                } else {
                    format!(
                        "name the mesh dim the batch is split over; the input differs along {}",
                        other
                            .iter()
                            .map(|n| format!("`{n}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
            ));
        }
        marked.insert(v.node, s);
    }
    let mut map: ValueMap = Vec::with_capacity(g.nodes.len());
    let mut nodes: Vec<Node> = Vec::with_capacity(g.nodes.len() + 2 * marked.len());
    // Named against the graph as given: the added nodes' names differ by their suffixes.
    let fresh = |base: String| crate::fresh_value_name(g, &base);
    for (i, n) in g.nodes.iter().enumerate() {
        let mut node = n.clone();
        remap_args(&mut node, &map);
        nodes.push(node);
        let at = nodes.len() - 1;
        let mut outs: Vec<ValueId> = (0..n.outputs.len()).map(|o| ValueId::new(at, o)).collect();
        if let Some(s) = marked.get(&i) {
            let ty = n.outputs[0].ty.clone();
            let call = |name: String, op: OpName, args: Vec<Arg>| Node {
                name: name.clone(),
                kind: NodeKind::Call {
                    op,
                    args,
                    kwargs: Vec::new(),
                },
                outputs: vec![Output {
                    name,
                    ty: ty.clone(),
                }],
                loc: n.loc.clone(),
                line: n.line,
            };
            let reduce = call(
                fresh(format!("{}_assume_all_reduce", s.value)),
                OpName::new("_c10d_functional", "all_reduce", "default"),
                vec![
                    Arg::Value(ValueId::new(at, 0)),
                    Arg::Str("avg".into()),
                    Arg::Str(group_name.into()),
                ],
            );
            nodes.push(reduce);
            let wait = call(
                fresh(format!("{}_assume_avg", s.value)),
                OpName::new("_c10d_functional", "wait_tensor", "default"),
                vec![Arg::Value(ValueId::new(at + 1, 0))],
            );
            nodes.push(wait);
            outs[0] = ValueId::new(at + 2, 0);
        }
        map.push(outs);
    }
    let graph = Graph {
        name: g.name.clone(),
        path: g.path.clone(),
        nodes,
        inputs: g.inputs.iter().map(|v| map[v.node][v.output]).collect(),
        outputs: g
            .outputs
            .iter()
            .map(|o| o.map(|v| map[v.node][v.output]))
            .collect(),
    };
    Ok((graph, map))
}

/// Rewrites every value argument of `node` through `map`.
fn remap_args(node: &mut Node, map: &ValueMap) {
    fn walk(a: &mut Arg, map: &ValueMap) {
        match a {
            Arg::Value(v) => *v = map[v.node][v.output],
            Arg::List(xs) => xs.iter_mut().for_each(|x| walk(x, map)),
            _ => {}
        }
    }
    if let NodeKind::Call { args, kwargs, .. } = &mut node.kind {
        args.iter_mut().for_each(|a| walk(a, map));
        kwargs.iter_mut().for_each(|(_, a)| walk(a, map));
    }
}

/// Bypasses the mask that limits routing to some nodes: every read of a named `masked_fill` /
/// `where` reads its unmasked scores instead.
fn unmask_scores(
    case: &Case,
    g: &Graph,
    scores: &[Located<String>],
    nodes_n: &Located<usize>,
    top: &Located<usize>,
) -> Result<(Graph, ValueMap), SourceError> {
    let mut map: ValueMap = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (0..n.outputs.len()).map(|o| ValueId::new(i, o)).collect())
        .collect();
    let metas = shardproof_interp::infer_graph(g, &case.ops).metas;
    for s in scores {
        let Some(v) = g.find(&s.value) else { continue };
        let node = &g.nodes[v.node];
        let value = |i: usize| node.args().get(i).and_then(Arg::as_value);
        let (unmasked, mask) = match node.op() {
            Some(op) if op.namespace == "aten" && op.name == "masked_fill" => (value(0), value(1)),
            Some(op) if op.namespace == "aten" && op.name == "where" => (value(1), value(0)),
            _ => (None, None),
        };
        let (Some(unmasked), Some(mask)) = (unmasked, mask) else {
            return Err(err(
                case,
                s.span,
                format!(
                    "`{}` ({}) is `{}`, not a masking of routing scores",
                    s.value,
                    where_in(g, node),
                    node.op()
                        .map_or_else(|| "an input".into(), |op| op.to_string())
                ),
                "name the `masked_fill` (or `where`) that keeps only the selected nodes' experts"
                    .into(),
            ));
        };
        // The node selection: the nearest top-k the mask is computed from.
        let mut found = Vec::new();
        let mut stack = vec![mask.node];
        let mut seen = vec![false; g.nodes.len()];
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            let n = &g.nodes[i];
            if n.op()
                .is_some_and(|op| op.namespace == "aten" && op.name == "topk")
            {
                found.push(i);
                continue;
            }
            stack.extend(n.inputs().iter().map(|v| v.node));
        }
        found.sort_unstable();
        let Some(&t) = found.last() else {
            return Err(err(
                case,
                s.span,
                format!(
                    "`{}`'s mask ({}) is not computed from a top-k: it does not select nodes",
                    s.value,
                    where_in(g, node)
                ),
                "name the scores masked to the experts of the top-scoring nodes".into(),
            ));
        };
        let tn = &g.nodes[t];
        let k = tn
            .args()
            .get(1)
            .or_else(|| tn.kwarg("k"))
            .and_then(Arg::as_int);
        let d = tn
            .args()
            .get(2)
            .or_else(|| tn.kwarg("dim"))
            .and_then(Arg::as_int)
            .unwrap_or(-1);
        let n = tn
            .args()
            .first()
            .and_then(Arg::as_value)
            .and_then(|x| metas.get(x.node)?.get(x.output)?.clone())
            .and_then(|m| {
                let r = m.shape.len() as i64;
                let d = if d < 0 { d + r } else { d };
                (0..r).contains(&d).then(|| m.shape[d as usize])
            });
        if k != Some(top.value as i64) || n != Some(nodes_n.value) {
            let at = if n != Some(nodes_n.value) {
                nodes_n.span
            } else {
                top.span
            };
            return Err(err(
                case,
                at,
                format!(
                    "wrong node subset: `{}`'s mask keeps the top {} of {} nodes (`{}`, {}), not {} of {}",
                    s.value,
                    k.map_or_else(|| "?".into(), |k| k.to_string()),
                    n.map_or_else(|| "?".into(), |n| n.to_string()),
                    tn.name,
                    where_in(g, tn),
                    top.value,
                    nodes_n.value
                ),
                "write the plan's node count and the number of nodes a token may be routed to".into(),
            ));
        }
        map[v.node][v.output] = unmasked;
    }
    let mut nodes = g.nodes.clone();
    nodes.iter_mut().for_each(|n| remap_args(n, &map));
    let graph = Graph {
        name: g.name.clone(),
        path: g.path.clone(),
        nodes,
        inputs: g.inputs.clone(),
        outputs: g
            .outputs
            .iter()
            .map(|o| o.map(|v| map[v.node][v.output]))
            .collect(),
    };
    Ok((graph, map))
}
