//! Cuts whose rank pieces are load-balanced sequence chunks: under context parallelism the
//! sequence is cut into `2p` chunks and rank `i` of the `p` ranks holds chunks `i` and
//! `2p - 1 - i`, in that order (Megatron's causal load balancing). No placement states that
//! (`Shard(d)` gives each rank one contiguous part), so such a relation is given to the plan
//! by spec name ([`LoadBalanced`], `PlanOptions::chunked`) and states:
//!
//! > the relation's placed layout holds of the spec value with its `2p` chunks along `dim`
//! > reordered as `0, 2p-1, 1, 2p-2, ..., p-1, p`.
//!
//! With `Shard(dim)` over a mesh dim of size `p`, the `i`-th contiguous part of the reordered
//! value is its positions `2i, 2i + 1`: chunks `i` and `2p - 1 - i`, what cp rank `i` holds.
//! Where a plan flattened batch and sequence into one dim (an MoE block's tokens), the dim
//! holds `B` sequences one after another and the reordering puts every rank's chunks of every
//! sequence together (`LoadBalanced::sequences`), which is the rank's flattened tokens.
//!
//! The stage builder encodes the reordering into each stage's *spec* graph (the rank graphs
//! hold the pieces already), so that every later step (leaves, rebuilt outputs, shape
//! reduction, the memo key, the interpreter's confirmation) sees a plain placed relation and
//! plain operators (`slice` and `cat` along `dim` at fixed fractions):
//!
//! - a stage that *establishes* the relation computes `reordered = cat(slices of x)` after the
//!   spec's `x` and expects it in the layout: it holds exactly when the relation does;
//! - a stage that *assumes* it reads a fresh input under `x`'s name, laid out by the layout, and
//!   computes `x = cat(slices of the input)` in the original order where the spec read `x`.
//!   In the whole run the relation gives `input = reordered(x)`, and undoing the reordering of
//!   `2p` equal chunks gives `x` back exactly, so the stage's inputs range over (at least)
//!   every whole run's values.
//!
//! So the chain of `stage/mod.rs` is unchanged: each stage states and proves the reordered
//! relation. The chunks must be equal: a dim whose size is not a multiple of `2p` is refused.

use super::micro::{call, remapped_node, type_of};
use shardproof_case::Case;
use shardproof_ir::{Arg, Graph, Node, NodeKind, OpName, Output, TensorType, ValueId};
use std::collections::BTreeMap;

/// How a relation's spec value is reordered before its layout applies: along `dim`, each of
/// `sequences` sequences (one after another) in `2 * ranks` equal chunks, rank `i` of `ranks`
/// holding chunks `i` and `2 * ranks - 1 - i` of every sequence, sequence by sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadBalanced {
    /// The sequence dim of the spec value.
    pub dim: usize,
    /// The number of ranks the sequence is split over (the cp mesh dim's size).
    pub ranks: usize,
    /// How many sequences `dim` holds one after another: 1 where it is the sequence itself,
    /// the batch size where a plan flattened batch and sequence into one dim (the tokens of an
    /// MoE block).
    pub sequences: usize,
}

/// Relations whose layout holds of the load-balanced reordering of their spec value, by spec
/// tensor name.
pub type ChunkedCuts = BTreeMap<String, LoadBalanced>;

impl LoadBalanced {
    /// The original chunk at each position of the reordered value (chunk `k` of sequence `b`
    /// is chunk `b * 2 * ranks + k` of the dim): every rank's chunks together, rank by rank, so
    /// that a rank's contiguous part is what it holds.
    fn order(&self) -> Vec<usize> {
        let p = self.ranks;
        (0..p)
            .flat_map(|i| {
                (0..self.sequences).flat_map(move |b| [b * 2 * p + i, b * 2 * p + 2 * p - 1 - i])
            })
            .collect()
    }

    /// The position in the reordered value of each original chunk.
    fn positions(&self) -> Vec<usize> {
        let order = self.order();
        let mut pos = vec![0; order.len()];
        for (at, &chunk) in order.iter().enumerate() {
            pos[chunk] = at;
        }
        pos
    }

    /// The shape of a chunk of `ty` (the value's type), or why the value cannot be chunked.
    fn chunk_type(&self, ty: &TensorType, name: &str) -> Result<(TensorType, i64), String> {
        let mut shape = ty
            .concrete_shape()
            .ok_or_else(|| format!("chunked cut `{name}`: its shape is not concrete"))?;
        let parts = (2 * self.ranks * self.sequences) as i64;
        let Some(len) = shape.get_mut(self.dim) else {
            return Err(format!(
                "chunked cut `{name}`: it has no dim {} to chunk",
                self.dim
            ));
        };
        if parts == 0 || *len % parts != 0 {
            return Err(format!(
                "chunked cut `{name}`: dim {} of size {len} is not {parts} equal chunks",
                self.dim
            ));
        }
        let c = *len / parts;
        *len = c;
        Ok((TensorType::new(ty.dtype, &shape), c))
    }
}

/// Pushes onto `out` the chunks of its value `x` in the order `chunks` names them, then their
/// concatenation along the chunked dim, named `name`; returns the concatenation. The chunks'
/// names are fresh in `taken` (the graph `out` is rebuilt from) and in `out`.
fn push_reordered(
    out: &mut Graph,
    taken: &Graph,
    x: ValueId,
    lb: &LoadBalanced,
    chunks: &[usize],
    name: String,
    spec_name: &str,
) -> Result<ValueId, String> {
    let ty = type_of(out, x)?;
    let (piece, c) = lb.chunk_type(&ty, spec_name)?;
    let mut parts = Vec::with_capacity(chunks.len());
    for &k in chunks {
        let start = c * k as i64;
        let base = crate::fresh_value_name(taken, &format!("{name}_chunk{k}"));
        let slice_name = crate::fresh_value_name(out, &base);
        let at = out.push(call(
            slice_name,
            OpName::new("aten", "slice", "Tensor"),
            vec![
                Arg::Value(x),
                Arg::Int(lb.dim as i64),
                Arg::Int(start),
                Arg::Int(start + c),
            ],
            Some(piece.clone()),
        ));
        parts.push(Arg::Value(ValueId::new(at, 0)));
    }
    let at = out.push(call(
        name,
        OpName::new("aten", "cat", "default"),
        vec![Arg::List(parts), Arg::Int(lb.dim as i64)],
        Some(ty.clone()),
    ));
    Ok(ValueId::new(at, 0))
}

/// `g` with its input `v` read as the load-balanced reordering of a fresh input of the same
/// name: the assuming side. Returns the graph, the fresh input and where each node went.
fn reorder_input(
    g: &Graph,
    v: ValueId,
    lb: &LoadBalanced,
    spec_name: &str,
) -> Result<(Graph, ValueId, Vec<Option<usize>>), String> {
    if !matches!(g.nodes[v.node].kind, NodeKind::Input) || v.output != 0 {
        return Err(format!(
            "chunked cut `{spec_name}`: `{}` is not an input of the stage's spec graph",
            g.value_name(v)
        ));
    }
    let ty = type_of(g, v)?;
    let mut out = Graph::new(g.name.clone());
    out.path = g.path.clone();
    let mut map: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut fresh = ValueId::new(0, 0);
    for (i, node) in g.nodes.iter().enumerate() {
        if i == v.node {
            let at = out.push(Node {
                name: node.name.clone(),
                kind: NodeKind::Input,
                outputs: vec![Output {
                    name: node.outputs[0].name.clone(),
                    ty: Some(ty.clone()),
                }],
                loc: None,
                line: None,
            });
            fresh = ValueId::new(at, 0);
            // Undo the reordering; every reader of `v` reads the result.
            let name = format!("{}_in_order", node.outputs[0].name);
            let name = crate::fresh_value_name(g, &name);
            let whole = push_reordered(&mut out, g, fresh, lb, &lb.positions(), name, spec_name)?;
            map[i] = Some(whole.node);
            continue;
        }
        map[i] = Some(out.push(remapped_node(node, &map)?));
    }
    let moved = |x: ValueId| map[x.node].map(|n| ValueId::new(n, x.output));
    for &i in &g.inputs {
        out.inputs.push(if i == v {
            fresh
        } else {
            moved(i).ok_or("an input of the stage graph was lost")?
        });
    }
    out.outputs = g.outputs.iter().map(|o| o.and_then(moved)).collect();
    Ok((out, fresh, map))
}

/// Rewrites a stage case so that every relation named in `cuts` states its layout of the
/// load-balanced reordering of its spec value (see the module documentation); relations not
/// named are left as they are. Its expected outputs are rewritten only where the stage
/// establishes a cut (`cut_target`): an `outputs:` entry states its own relation.
pub(crate) fn encode(case: &mut Case, cuts: &ChunkedCuts, cut_target: bool) -> Result<(), String> {
    for k in 0..case.inputs.len() {
        let Some(lb) = cuts.get(&case.inputs[k].spec_name) else {
            continue;
        };
        let name = case.inputs[k].spec_name.clone();
        let (g, fresh, map) = reorder_input(&case.spec, case.inputs[k].spec_value, lb, &name)?;
        let moved = |x: ValueId| map[x.node].map(|n| ValueId::new(n, x.output));
        for (j, rel) in case.inputs.iter_mut().enumerate() {
            rel.spec_value = if j == k {
                fresh
            } else {
                moved(rel.spec_value).ok_or("a related spec value was lost")?
            };
        }
        for o in case.outputs.iter_mut() {
            o.spec_value = moved(o.spec_value).ok_or("an expected spec value was lost")?;
        }
        case.spec = g;
    }
    if !cut_target {
        return Ok(());
    }
    for k in 0..case.outputs.len() {
        let Some(lb) = cuts.get(&case.outputs[k].spec_name) else {
            continue;
        };
        let name = case.outputs[k].spec_name.clone();
        let v = case.outputs[k].spec_value;
        let base = format!("{}_chunked", case.spec.value_name(v));
        let fresh_name = crate::fresh_value_name(&case.spec, &base);
        let mut g = case.spec.clone();
        let reordered = push_reordered(&mut g, &case.spec, v, lb, &lb.order(), fresh_name, &name)?;
        for o in g.outputs.iter_mut().flatten() {
            if *o == v {
                *o = reordered;
            }
        }
        case.spec = g;
        case.outputs[k].spec_value = reordered;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_i_holds_chunks_i_and_its_mirror() {
        let lb = |ranks, sequences| LoadBalanced {
            dim: 1,
            ranks,
            sequences,
        };
        assert_eq!(lb(2, 1).order(), vec![0, 3, 1, 2]);
        assert_eq!(lb(2, 1).positions(), vec![0, 2, 3, 1]);
        assert_eq!(lb(3, 1).order(), vec![0, 5, 1, 4, 2, 3]);
        // Two sequences of 4 chunks: rank 0 holds chunks 0 and 3 of each, rank 1 chunks 1, 2.
        assert_eq!(lb(2, 2).order(), vec![0, 3, 4, 7, 1, 2, 5, 6]);
        for l in [lb(3, 1), lb(2, 2), lb(3, 4)] {
            for (at, &chunk) in l.order().iter().enumerate() {
                assert_eq!(l.positions()[chunk], at);
            }
        }
    }

    #[test]
    fn unequal_chunks_are_refused() {
        let lb = LoadBalanced {
            dim: 1,
            ranks: 2,
            sequences: 1,
        };
        let ty = TensorType::new(shardproof_ir::DType::F32, &[2, 6, 4]);
        assert!(lb.chunk_type(&ty, "x").is_err());
        let ty = TensorType::new(shardproof_ir::DType::F32, &[2, 8, 4]);
        assert_eq!(lb.chunk_type(&ty, "x").unwrap().1, 2);
        assert!(LoadBalanced { dim: 3, ..lb }.chunk_type(&ty, "x").is_err());
        assert!(LoadBalanced { sequences: 3, ..lb }
            .chunk_type(&ty, "x")
            .is_err());
    }
}
