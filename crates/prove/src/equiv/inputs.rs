//! Symbolic leaves of a case: every spec input element a symbol, laid out onto the ranks by
//! the case's placements; partial inputs split into fresh shares; module constants by value
//! or by name.

use super::layout::piece_indices;
use crate::exec::ExecError;
use crate::expr::{Arena, ExprId, SymbolKind};
use crate::tensor::SymTensor;
use shardproof_case::{rank_pieces, Case, Layout, Reduce};
use shardproof_ir::{DType, Graph, NodeKind, ValueId};
use shardproof_ops::Meta;
use std::collections::BTreeMap;

/// Leaves by name, for the spec and for every rank.
pub struct Leaves {
    /// The spec's inputs and constants.
    pub spec: BTreeMap<String, SymTensor>,
    /// Every rank's inputs and constants.
    pub ranks: Vec<BTreeMap<String, SymTensor>>,
}

/// A readable element name: `x[1,0]`.
fn element_name(base: &str, shape: &[usize], flat: usize) -> String {
    let st = crate::tensor::strides(shape);
    let idx: Vec<String> = (0..shape.len())
        .map(|d| ((flat / st[d]) % shape[d]).to_string())
        .collect();
    format!("{base}[{}]", idx.join(","))
}

/// An integer tensor's symbols range over [0, bound) only where the graph indexes with it
/// (out-of-range values are no valid input there); elsewhere over every integer: `run`'s
/// default range of 8 would prove a claim for the values below 8 only.
fn kind_of(dtype: DType, bound: Option<i64>) -> SymbolKind {
    if dtype == DType::Bool {
        SymbolKind::Bool
    } else if dtype.is_int() {
        match bound {
            Some(b) => SymbolKind::Index(b.clamp(1, u32::MAX as i64) as u32),
            None => SymbolKind::Int,
        }
    } else {
        SymbolKind::Real
    }
}

/// The `ignore_index` of an `nll_loss` that reads the integer input `v` of `graph` as its
/// target, where it lies outside `[0, bound)`: a target equal to it is a valid input (the
/// loss ignores it) that symbols ranging over `[0, bound)` never take.
fn ignore_index_outside(
    graph: &Graph,
    v: ValueId,
    metas: &[Vec<Option<Meta>>],
    bound: i64,
) -> Option<i64> {
    let rank = |t: ValueId| Some(metas.get(t.node)?.get(t.output)?.as_ref()?.shape.len());
    shardproof_interp::index_uses(graph, v, shardproof_interp::IndexWalk::BOUND, rank)
        .iter()
        .filter_map(|u| {
            let node = &graph.nodes[u.consumer];
            let at = match node.op()?.name.as_str() {
                "nll_loss_forward" => 4,
                "nll_loss_backward" => 5,
                _ => return None,
            };
            node.args().get(at)?.as_int()
        })
        .find(|i| !(0..bound).contains(i))
}

/// A tensor of fresh symbols named after `base`.
fn symbols(
    arena: &mut Arena,
    base: &str,
    meta: &Meta,
    bound: Option<i64>,
) -> Result<SymTensor, ExecError> {
    let kind = kind_of(meta.dtype, bound);
    let elems = (0..meta.numel())
        .map(|i| arena.symbol(&element_name(base, &meta.shape, i), kind))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SymTensor::new(meta.dtype, meta.shape.clone(), elems))
}

/// The spec's and every rank's symbolic leaves.
pub fn make_leaves(arena: &mut Arena, case: &Case) -> Result<Leaves, ExecError> {
    let mesh = &case.program.mesh;
    let spec_metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let mut spec = BTreeMap::new();
    let mut ranks = vec![BTreeMap::new(); case.program.ranks.len()];
    for rel in &case.inputs {
        if let Layout::Expr(_) = rel.layout {
            return Err(ExecError::unsupported(
                "inputs",
                format!(
                    "`{}` is laid out by an `expr:`; the prover lays out inputs by placements only",
                    rel.spec_name
                ),
            ));
        }
        let v = rel.spec_value;
        let meta = spec_metas[v.node][v.output].clone().ok_or_else(|| {
            ExecError::invalid(format!(
                "the shape of spec tensor `{}` is unknown",
                rel.spec_name
            ))
        })?;
        let bound = shardproof_interp::index_bound_known(&case.spec, v, &spec_metas);
        let ignored = bound
            .filter(|_| case.assume.ignore_index_unused.is_none())
            .and_then(|b| ignore_index_outside(&case.spec, v, &spec_metas, b));
        let mut value = symbols(arena, &rel.spec_name, &meta, bound)?;
        if let Some(ignore) = ignored {
            // A loss target may also equal the loss's ignore_index, outside the range its
            // symbol takes: each element is `where(g, ignore_index, t)` for a fresh flag g.
            let ig = arena.int(ignore)?;
            let mut elems = Vec::with_capacity(value.elems.len());
            for (i, &e) in value.elems.iter().enumerate() {
                let name = element_name(&format!("{}:ignored", rel.spec_name), &meta.shape, i);
                let g = arena.symbol(&name, SymbolKind::Bool)?;
                elems.push(arena.select(g, ig, e)?);
            }
            value = SymTensor::new(value.dtype, value.shape.clone(), elems);
        }
        let shape_i64: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
        for &(r, iv) in &rel.rank_values {
            let piece = rank_pieces(&rel.layout, &shape_i64, mesh, r)
                .map_err(|e| ExecError::invalid(format!("`{}`: {e}", rel.spec_name)))?;
            let graph = &case.program.ranks[r];
            let dtype = graph.recorded_type(iv).map_or(meta.dtype, |t| t.dtype);
            let indices = piece_indices(&piece, &meta.shape);
            let local_shape: Vec<usize> = piece.local_shape().iter().map(|&d| d as usize).collect();
            let mut elems: Vec<ExprId> = indices.iter().map(|&i| value.elems[i]).collect();
            if let Some(share) = &piece.partial {
                elems = partial_share(arena, &rel.spec_name, &meta.shape, &indices, &elems, share)?;
            }
            ranks[r].insert(
                graph.value_name(iv).to_string(),
                SymTensor::new(dtype, local_shape, elems),
            );
        }
        spec.insert(rel.spec_name.clone(), value);
    }
    add_constants(arena, &case.spec, &spec_metas, &case.constants, &mut spec)?;
    for (g, leaves) in case.program.ranks.iter().zip(ranks.iter_mut()) {
        let metas = shardproof_interp::infer_graph(g, &case.ops).metas;
        add_constants(arena, g, &metas, &case.constants, leaves)?;
    }
    Ok(Leaves { spec, ranks })
}

/// A rank's share of partial values: members before the last hold fresh symbols, the last
/// the rest (sum: value - others; avg: value + noise, the noises summing to zero). Every
/// tuple of shares that combines into the value is an instance, so a proof covers them all.
fn partial_share(
    arena: &mut Arena,
    name: &str,
    spec_shape: &[usize],
    indices: &[usize],
    values: &[ExprId],
    share: &shardproof_case::PartialShare,
) -> Result<Vec<ExprId>, ExecError> {
    let k = share.group.len();
    let label = |m: usize| format!("{name}@r{}", share.group[m]);
    let fresh = |arena: &mut Arena, m: usize, flat: usize| {
        arena.symbol(&element_name(&label(m), spec_shape, flat), SymbolKind::Real)
    };
    let mut out = Vec::with_capacity(values.len());
    for (&flat, &value) in indices.iter().zip(values) {
        let e = match share.reduce {
            Reduce::Sum | Reduce::Avg if share.index + 1 < k => {
                let noise = fresh(arena, share.index, flat)?;
                if share.reduce == Reduce::Sum {
                    noise
                } else {
                    arena.add(value, noise)?
                }
            }
            Reduce::Sum | Reduce::Avg => {
                let others = (0..k - 1)
                    .map(|m| fresh(arena, m, flat))
                    .collect::<Result<Vec<_>, _>>()?;
                let s = arena.sum(&others)?;
                arena.sub(value, s)?
            }
            Reduce::Max | Reduce::Min => {
                return Err(ExecError::unsupported(
                    "inputs",
                    format!("`{name}`: partial max/min inputs have no symbolic layout"),
                ))
            }
        };
        out.push(e);
    }
    Ok(out)
}

/// Module constants: the stated value or the literal of the captured line (0-d), else
/// symbols named after the attribute, so equal names are equal in every graph (as `run`
/// keys its random constants).
fn add_constants(
    arena: &mut Arena,
    graph: &Graph,
    metas: &[Vec<Option<Meta>>],
    stated: &BTreeMap<String, f64>,
    leaves: &mut BTreeMap<String, SymTensor>,
) -> Result<(), ExecError> {
    for (i, node) in graph.nodes.iter().enumerate() {
        let NodeKind::Constant { attr } = &node.kind else {
            continue;
        };
        if leaves.contains_key(&node.outputs[0].name) {
            continue;
        }
        let Some(meta) = &metas[i][0] else { continue };
        let known = stated.get(attr).copied().or_else(|| {
            node.loc
                .as_ref()
                .filter(|_| meta.shape.is_empty())
                .and_then(|l| l.assigned_literal())
        });
        let t = match known {
            Some(x) => {
                let c = arena.float(x)?;
                SymTensor::new(meta.dtype, meta.shape.clone(), vec![c; meta.numel()])
            }
            None => {
                let bound = shardproof_interp::index_bound_known(graph, ValueId::new(i, 0), metas);
                symbols(arena, &format!("const:{attr}"), meta, bound)?
            }
        };
        leaves.insert(node.outputs[0].name.clone(), t);
    }
    Ok(())
}
