//! What a rank's run knows before its first node and never changes during it: the graph, the
//! mesh as the rank sees it, the peers whose literals a rule compares, and the facts of the
//! whole graph the rules read (loss terms, vocabulary updates, in-place writes). Built once
//! per run ([`RunContext::new`]) so the driver's loop reads it, not recomputes it.

use super::findings::LossTerms;
use super::{peers, RankPlacements, Shared};
use crate::place::Place;
use shardproof_ir::{Graph, ValueId};
use shardproof_ops::{Meta, Registry};
use std::collections::HashSet;

/// The fixed facts of rank `r`'s run.
pub(super) struct RunContext<'a> {
    /// The rank's graph.
    pub g: &'a Graph,
    /// The number of mesh dims.
    pub nd: usize,
    /// Every mesh dim's size, by mesh dim.
    pub mesh_sizes: Vec<usize>,
    /// The operator registry.
    pub reg: &'static Registry,
    /// The rank's coordinates on the mesh.
    pub coords: Vec<usize>,
    /// The rank's local metas, by node and output.
    pub metas: &'a [Vec<Option<Meta>>],
    /// Per mesh dim, the rank's peers along it.
    pub peer_list: Vec<Vec<usize>>,
    /// Per mesh dim, the peers whose literals may differ from this rank's at a node, each
    /// with whether its graph is aligned with the rank's ([`Shared::aligned`]).
    pub literal_peers: Vec<Vec<(usize, bool)>>,
    /// The pipeline mesh dims (bit per mesh dim).
    pub pipeline_dims: u64,
    /// The loss terms of the graph ([`LossTerms`]).
    pub loss_terms: LossTerms,
    /// Updates `index(X, I) ± W` that an `index_put(X, I, ..)` writes back.
    pub updates: HashSet<usize>,
    /// Whether the graph writes some buffer in place.
    pub mutates: bool,
}

impl<'a> RunContext<'a> {
    /// The facts of rank `r`'s run.
    pub fn new(sh: &'a Shared, r: usize) -> RunContext<'a> {
        let program = sh.program;
        let g = &program.ranks[r];
        let mesh = &program.mesh;
        let nd = mesh.dims.len();
        let metas = &sh.metas[r][..];
        let peer_list: Vec<Vec<usize>> = (0..nd).map(|m| peers(mesh, r, m)).collect();
        // Per mesh dim, the peers whose literals may differ from this rank's at a node
        // (`varies` in the driver): a peer whose graph is of `r`'s class and shares `r`'s
        // literal hashes has node `i` with `r`'s literal, and peers of one class sharing one
        // literal table give one answer (`peer_node` is a function of the classes), so one of
        // each is asked (issue 44: asking all 16 dp replicas at every node was a tenth of the
        // check). With each, whether its graph is aligned with `r`'s (`Shared::aligned`): its
        // node of `i` is `i` or none, so an equal literal at `i` answers without looking the
        // node up.
        let literal_peers: Vec<Vec<(usize, bool)>> = peer_list
            .iter()
            .map(|ps| {
                let key = |p: usize| (sh.graph_class[p], std::sync::Arc::as_ptr(&sh.literals[p]));
                let mut seen = vec![key(r)];
                ps.iter()
                    .copied()
                    .filter(|&p| {
                        let k = key(p);
                        let new = !seen.contains(&k);
                        if new {
                            seen.push(k);
                        }
                        new
                    })
                    .map(|p| (p, sh.aligned(r, p)))
                    .collect()
            })
            .collect();
        let pipeline_dims = mesh
            .dims
            .iter()
            .enumerate()
            .filter(|&(k, _)| crate::is_pipeline_dim(mesh, k) && k < 64)
            .fold(0u64, |a, (k, _)| a | (1 << k));
        RunContext {
            g,
            nd,
            mesh_sizes: mesh.dims.iter().map(|d| d.1).collect(),
            reg: Registry::builtin(),
            coords: mesh.coords(r),
            metas,
            peer_list,
            literal_peers,
            pipeline_dims,
            loss_terms: LossTerms::of(g, metas),
            // The read of a vocabulary shard is checked at the write-back
            // (`vocab::update_shard`), not at the update.
            updates: crate::vocab::update_values(g),
            // A graph that writes some buffer in place (`add_`, `copy_`) may fill a zero
            // tensor after it is made: no value of it is taken to be zero.
            mutates: g.nodes.iter().any(|n| {
                n.op()
                    .is_some_and(|op| op.name.ends_with('_') && !op.name.ends_with("__"))
            }),
        }
    }

    /// The local meta of value `v`, where known.
    pub fn meta_of(&self, v: ValueId) -> Option<Meta> {
        self.metas
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
    }

    /// Places graph input `i` (first value `base`) of rank `r` as the case gives it.
    pub fn input_node(
        &self,
        sh: &Shared,
        (r, i, base): (usize, usize, usize),
        rp: &mut RankPlacements,
    ) {
        let nd = self.nd;
        match sh.inputs[r].get(&ValueId::new(i, 0)) {
            Some(ps) => {
                for (m, p) in ps.iter().enumerate() {
                    rp.places[base * nd + m] = *p;
                    if p.is_partial() {
                        rp.origin[base * nd + m] = i as u32;
                    }
                }
                if ps.contains(&Place::Unknown) {
                    rp.unknown_sources.push((i, "its layout is an expression over rank tensors, which the checker does not read".into()));
                }
            }
            None => rp
                .unknown_sources
                .push((i, "the case gives this input no layout".into())),
        }
        rp.invariant[base] = self
            .meta_of(ValueId::new(i, 0))
            .is_some_and(|m| !m.dtype.is_float());
    }

    /// Places a module constant `attr` (outputs `base..base + nout`): replicated, and where
    /// the case states its value, one literal in every element.
    pub fn constant_node(
        &self,
        sh: &Shared,
        attr: &str,
        (base, nout): (usize, usize),
        rp: &mut RankPlacements,
    ) {
        let nd = self.nd;
        let stated = sh.constants.get(attr).copied();
        for o in 0..nout {
            for m in 0..nd {
                rp.places[(base + o) * nd + m] = Place::Replicate;
            }
            rp.invariant[base + o] = true;
            if !self.mutates && stated.is_some() {
                rp.zero[base + o] = stated == Some(0.0);
                rp.constant[base + o] = u64::MAX;
            }
        }
    }
}
