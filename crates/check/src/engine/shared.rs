//! What propagation shares across ranks: the program's shared state ([`Shared`]), the
//! placements of a rank ([`RankPlacements`]), the spec's views and scalings, and the hashes
//! that find a node's peers on other ranks.

use super::scaling::{scaling_of_node, SpecScaling};
use crate::place::Place;
use crate::report::RawFinding;
use crate::ring;
use shardproof_ir::{Arg, Graph, Mesh, Node, NodeKind, OpMeaning, OpName, Program, ValueId};
use shardproof_ops::Meta;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The placements of one rank graph: per value (flattened: node, output), per mesh dim.
#[derive(Clone, Debug, Default)]
pub struct RankPlacements {
    /// Offset of each node's first output in `places` (divided by the mesh rank).
    pub offsets: Vec<u32>,
    /// Per value, per mesh dim.
    pub places: Vec<Place>,
    /// Per value, per mesh dim: the node where a partial placement began (`u32::MAX`: none).
    pub origin: Vec<u32>,
    /// Per value: no gradient flows through it (indices, masks, constants).
    pub invariant: Vec<bool>,
    /// Per value, per mesh dim: a replicated value scaled by 1/n (n the mesh dim's size), so
    /// that the n ranks' copies sum to the unscaled value.
    pub scaled: Vec<bool>,
    /// Per value, per mesh dim: `Unknown` there, but every rank holds n times the tensor (an
    /// all-reduce sum of pieces that average to it). Only a copy or view keeps it, and only
    /// a division by n the spec does not make turns it into `Replicate()` (the data-parallel
    /// loss: the sum of the local means, divided by n); every other reader sees `Unknown`.
    pub times_n: Vec<bool>,
    /// Per value and mesh dim (index `value * ndims + m`) where `times_n` is set by a
    /// reduction of a lifted partial's local means (`local_means::lifted_reduction`): the
    /// part of the factor this mesh dim counts (the whole factor on the first mesh dim of the
    /// group, 1 on the others). Absent: the mesh dim's size.
    pub times_factor: HashMap<usize, u64>,
    /// Per value, per mesh dim: a partial whose pieces were scaled by a number whose meaning
    /// is not known (a factor the spec lacks, or 1/n where another mesh dim has n coordinates
    /// too): its pieces combine by its reduction to the tensor times a factor not known. Rules
    /// see the partial (its findings stand); no reduction over the group and no declared
    /// output takes it as proven.
    pub scale_unknown: Vec<bool>,
    /// Per value, per mesh dim: where `scale_unknown` is set there only by a division by the
    /// size of another mesh dim `k` on which the same division made the value a share
    /// (`scaled`), `k + 1` (else 0): an all-reduce sum over `k` of that share makes up for the
    /// factor (the aux-loss share `aux / tp` beside dp's average), and clears the record.
    pub share_of: Vec<u8>,
    /// Per value, per mesh dim: a partial whose pieces sum a function of part of each rank's
    /// rows (one microbatch's sum, `rows::part_of_rows`), which is `scale_unknown` there for
    /// that reason alone: its pieces sum to the selected rows' sum, never the tensor's. Set by
    /// a rule run on such rows, carried by copies and views; an add of K of them that is the
    /// sum over the rank's whole shard (`rows::microbatch_sum`) clears `scale_unknown`.
    pub part_rows: Vec<bool>,
    /// Per value, per mesh dim `m` where it is a share (`scaled`) by a folded mean's reading
    /// (`scaling::FoldedShare`): the other mesh dims (bit `k`) whose pieces that reading says
    /// are each `n_k` times the spec's (a local mean over `k`'s split) and that no average
    /// over `k` has settled yet. Where the share is read as one (a lift), pieces of `k`
    /// summed into a partial there average instead.
    pub folded_pending: Vec<u64>,
    /// Per value, per mesh dim `m`, as `folded_pending`: the mesh dims (bit `k`) over which
    /// such pieces were summed (an all-reduce sum over `k`) with no division by `n_k` since.
    /// The share reading is refuted there: a lift of it is not proven.
    pub folded_summed: Vec<u64>,
    /// Per value: the mesh dims (bit `k`) where it derives, on this rank, from a share lifted
    /// by a partial plus it while `k` sharded both, their pieces there local means
    /// (`local_means::commit_folded`). A reduction over `k` of its partial sum there reads the
    /// pieces by their factor (`local_means::lifted_reduction`).
    pub lifted_means: Vec<u64>,
    /// Per value (index `offsets[node] + output`): a reduce-scatter of a lifted partial's
    /// local means (`local_means::LiftedReduction::Scattered`) left it, or a value it derives
    /// from, `f` times the spec's (`u64::MAX`: derived by a call other than a copy or view,
    /// which no division clears). Every call carries the record to its outputs; only a
    /// division by exactly `f` or a reduction that reads the local means' factor
    /// (`LiftedReduction::Sum`/`Average`) clears it, and a graph output or an in-place write
    /// still carrying it is `Unknown`.
    pub scattered_factor: HashMap<usize, u64>,
    /// Per value (index `offsets[node] + output`) whose pieces are not the spec's on every
    /// mesh dim: the local-means walk's answer (`local_means`: the mesh dims whose pieces are
    /// local means, each `n_k` times the spec's, and those where that is not known). Absent:
    /// the spec's pieces. Read through [`RankPlacements::piece_factor`].
    pub local_means: HashMap<usize, super::local_means::LocalMeanDims>,
    /// Nodes whose outputs are `Unknown` because of the node itself (no rule, opaque, an
    /// input without a layout), as (node, reason).
    pub unknown_sources: Vec<(usize, String)>,
    /// Values whose placement is `Unknown` on some mesh dim.
    pub unknown_values: usize,
    /// Per value: known to hold only zeros (see [`zero_output`]).
    pub zero: Vec<bool>,
    /// Per value: the dims along which it is known constant, `u64::MAX` for a fill (see
    /// `constant_output`).
    pub constant: Vec<u64>,
    /// The backward all-reduces of replicated gradients taken as duals of forward
    /// all-reduces (see [`LossTerms`]), as (node, group), in program order.
    pub dual_lifts: Vec<(usize, String)>,
    /// Findings of the operator rules.
    pub findings: Vec<RawFinding>,
    /// The mesh dims whose coordinate the propagation read (bit `m` for mesh dim `m`).
    pub coord_reads: u64,
}

impl RankPlacements {
    /// The placements of value `v` (one per mesh dim).
    pub fn of(&self, v: ValueId, ndims: usize) -> &[Place] {
        let i = (self.offsets[v.node] as usize + v.output) * ndims;
        &self.places[i..i + ndims]
    }

    /// What value `v`'s placements claim of its values on a mesh of the given `sizes`: the
    /// spec's value, the spec's value times a factor (local means), or nothing (a local mean
    /// whose factor is not known, a share or a partial scaled by a factor the spec lacks);
    /// see [`super::PieceFactor`].
    pub fn piece_factor(&self, v: ValueId, sizes: &[usize]) -> super::PieceFactor {
        let at = self.offsets[v.node] as usize + v.output;
        // A share (`scaled`: each copy the spec's over n) or a partial scaled by a factor not
        // known is not the spec's value laid out by its placements, unless the local-means
        // walk reached it (its division then settles a local mean's factor).
        let nd = sizes.len();
        let set = |record: &[bool]| {
            record
                .get(at * nd..(at + 1) * nd)
                .is_some_and(|dims| dims.contains(&true))
        };
        match self.local_means.get(&at) {
            // The walk's answer, where it reached the value, reads the value's own scalings.
            Some(&d) => super::PieceFactor::of(d, sizes),
            None if set(&self.scaled) || set(&self.scale_unknown) => super::PieceFactor::NotKnown,
            None => super::PieceFactor::Spec,
        }
    }
}

/// The mesh dims a process group spans, when it is one group per combination of the other
/// coordinates (as `groups: { tp: tp }` declares); `None` for explicit rank lists that are not.
pub fn group_dims(mesh: &Mesh, members: &[Vec<usize>]) -> Option<Vec<usize>> {
    let n = mesh.dims.len();
    if n > 12 {
        return None;
    }
    let mut sorted: Vec<Vec<usize>> = members
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.sort_unstable();
            m
        })
        .collect();
    sorted.sort();
    // The only dims that can fit: those of size over 1 along which some group's members
    // differ (a dim of size 1 splits nothing, and the masks are tried smallest first, so a
    // fit never names one). One `groups_along` to confirm, where every mask was tried
    // before (issue 44: 2^n scans of every rank, per group, per pipeline on 8192 ranks).
    let mut varying = vec![false; n];
    for m in &sorted {
        let Some(&first) = m.first() else { continue };
        if first >= mesh.size() {
            return None;
        }
        let base = mesh.coords(first);
        for &r in &m[1..] {
            if r >= mesh.size() {
                return None;
            }
            for (d, (a, b)) in mesh.coords(r).iter().zip(&base).enumerate() {
                varying[d] |= a != b;
            }
        }
    }
    let dims: Vec<usize> = (0..n).filter(|&d| varying[d]).collect();
    let mut g = mesh.groups_along(&dims);
    g.sort();
    (g == sorted).then_some(dims)
}

/// For every node of one graph, the index of the same node in another, where asked
/// ([`Shared::peer_node`]).
pub type PeerMap = Vec<u32>;

/// One rank graph's local metas: per node, per output.
pub type RankMetas = Vec<Vec<Option<Meta>>>;

/// `f` of every rank graph, computed once per distinct graph: ranks that run one program
/// (the same `Arc`, as a case that names one file for several ranks loads them) share the
/// result. `f` must depend on the graph only.
pub fn per_graph<'g, T>(
    graphs: &'g [Arc<Graph>],
    mut f: impl FnMut(&'g Arc<Graph>) -> Result<Arc<T>, String>,
) -> Result<Vec<Arc<T>>, String> {
    let mut seen: HashMap<*const Graph, Arc<T>> = HashMap::new();
    let mut out = Vec::with_capacity(graphs.len());
    for g in graphs {
        let t = match seen.get(&Arc::as_ptr(g)) {
            Some(t) => t.clone(),
            None => {
                let t = f(g)?;
                seen.insert(Arc::as_ptr(g), t.clone());
                t
            }
        };
        out.push(t);
    }
    Ok(out)
}

/// Everything propagation needs that is shared by the ranks.
pub struct Shared<'a> {
    /// The program.
    pub program: &'a Program,
    /// Custom operator meanings.
    pub custom: &'a BTreeMap<String, OpMeaning>,
    /// Per rank: its input placements by graph value.
    pub inputs: Vec<HashMap<ValueId, Vec<Place>>>,
    /// Per rank: local metas of every value (from type inference); ranks that run one
    /// graph (the same `Arc`) share one inference.
    pub metas: Vec<Arc<RankMetas>>,
    /// Per rank: node name -> node index (shared like `metas`).
    pub names: Vec<Arc<HashMap<&'a str, u32>>>,
    /// Per rank, per node: a hash of its literal arguments (shared like `metas`).
    pub literals: Vec<Arc<Vec<u64>>>,
    /// Per rank, per node: a hash of its operator and the names of the values it reads
    /// (shared like `metas`).
    pub structure: Vec<Arc<Vec<u64>>>,
    /// Per rank, where the mesh has a pipeline dim (`pp`, more than one stage): its graph's
    /// nodes by structure hash (the first of each; shared like `metas`), to find whether
    /// another stage computes the same expression ([`Shared::stage_alike`]). Empty otherwise.
    pub by_structure: Vec<Arc<HashMap<u64, u32>>>,
    /// Per pair of graph classes: the node pairs compared on their structure so far
    /// ([`same_expression`]), so that a structure hash match is confirmed before it is used.
    pub same_exprs: std::cell::RefCell<HashMap<(usize, usize), ExprMemo>>,
    /// Group name -> the mesh dims it spans (`None`: explicit rank lists).
    pub groups: HashMap<String, Option<Vec<usize>>>,
    /// Per recv (rank, node): the send (rank, node) whose message it takes.
    pub messages: &'a BTreeMap<(usize, usize), (usize, usize)>,
    /// The single-device spec's scalings, when the case has a spec: node name -> (operator,
    /// scalar factor) of every `mul` or `div` by a literal number (see [`spec_scalings`]).
    pub spec_scalings: HashMap<&'a str, (&'a OpName, f64, Option<i64>)>,
    /// Per rank: its `mul`s and `div`s by a number that stand where the spec scales, by
    /// position rather than by name ([`spec_scaling_positions`]); shared like `metas`.
    pub spec_scaling_at: Vec<std::sync::Arc<HashMap<u32, SpecScaling<'a>>>>,
    /// Whether the case has a single-device spec (a plan has none: its own operators are
    /// the program its placements describe, every literal scaling included).
    pub has_spec: bool,
    /// Whether the case assumes no loss target equals its loss's `ignore_index` (`assume:
    /// ignore-index: unused`): only then does a rank's count of targets follow from its rows
    /// alone, so that a mean over equal row shards is the spec's times a mesh size.
    pub ignore_index_unused: bool,
    /// Per rank: the class of ranks whose graphs are equal node for node (names, operators,
    /// arguments and inputs), so that the same node of a peer is the same index.
    pub graph_class: Vec<usize>,
    /// Per rank: the first rank whose graph equals it up to point-to-point peers, compared
    /// as offsets from each graph's own rank ([`relative_classes`]).
    pub rel_class: Vec<usize>,
    /// The spec's views: every view node's operator and global input and output shapes
    /// ([`SpecViews`]).
    pub spec_views: SpecViews<'a>,
    /// Per rank: for every node, the spec's view node it is, where one is found
    /// ([`SpecViews::matches`]); shared by ranks with equal graphs.
    pub view_matches: Vec<std::sync::Arc<Vec<Option<u32>>>>,
    /// The row selections met so far ([`Place::Rows`]), numbered in the order met.
    pub rows: std::cell::RefCell<crate::place::RowTable>,
    /// The values whose pieces travel along rings ([`Place::Rolled`]), numbered in the order
    /// met.
    pub ring_roots: std::cell::RefCell<ring::RingRoots>,
    /// Values of 0-d module constants the case states (`constants:`), by attribute name: a
    /// constant stated 0 is a zero tensor (a captured masked assignment's lifted literal).
    pub constants: &'a BTreeMap<String, f64>,
    /// Per pair of graph classes (a rank's, a peer's of another class): for every node of
    /// the first asked so far, the same node of the second ([`Shared::peer_node`]).
    pub peer_maps: std::cell::RefCell<HashMap<(usize, usize), PeerMap>>,
    /// The all-reduce calls (rank, node) whose input is the calling pipeline stage's share of
    /// one spec sum ([`crate::rules::stage_shares`]): `Partial(sum)` on the pipeline dim; by
    /// collective (the members' calls of one all-reduce share a number).
    pub stage_shares: crate::rules::StageShares,
    /// Per pair of graph classes (a rank's, a peer's): whether the peer's graph has distinct
    /// node names and every node of the first has the name of the second's node at its
    /// index ([`Shared::aligned`]).
    pub aligned: std::cell::RefCell<HashMap<(usize, usize), bool>>,
}

impl Shared<'_> {
    /// The same node as node `i` of rank `r`'s graph in rank `p`'s graph: the same index
    /// where the two graphs are equal node for node, else the node of the same name calling
    /// the same operator on inputs of the same names (graphs that differ per rank, as where a
    /// replicated term is counted on some ranks only, shift the names of the nodes after
    /// it). A function of the two graphs only, so each answer is kept per pair of graph
    /// classes and node ([`Shared::peer_maps`]): ranks whose peers run the same graphs ask
    /// once. Asked lazily: most nodes of a program with unknown placements never ask.
    pub fn peer_node(&self, r: usize, p: usize, i: usize) -> Option<usize> {
        let key = (self.graph_class[r], self.graph_class[p]);
        if key.0 == key.1 {
            return Some(i);
        }
        if let Some(&j) = self.peer_maps.borrow().get(&key).and_then(|m| m.get(i)) {
            if j != PEER_UNSET {
                return (j != PEER_NONE).then_some(j as usize);
            }
        }
        let (g, pg) = (&self.program.ranks[r], &self.program.ranks[p]);
        let node = &g.nodes[i];
        // Where `p`'s node names are distinct (its name table holds one entry per node), the
        // node of that name is the one at the same index if that one has the name: found
        // without hashing the name (issue 44: the literal comparison asks every node of every
        // other tp class once, a twentieth of the check).
        let same_index = pg.nodes.get(i).is_some_and(|n| n.name == node.name)
            && self.names[p].len() == pg.nodes.len();
        let found = match &node.kind {
            NodeKind::Call { op: called, .. } => {
                let at = if same_index {
                    Some(i as u32)
                } else {
                    self.names[p].get(node.name.as_str()).copied()
                };
                at.filter(|&j| {
                    let pn = &pg.nodes[j as usize];
                    matches!(&pn.kind, NodeKind::Call { op: pop, .. } if pop == called)
                        && pn
                            .inputs()
                            .iter()
                            .map(|v| pg.nodes[v.node].name.as_str())
                            .eq(node.inputs().iter().map(|v| g.nodes[v.node].name.as_str()))
                })
            }
            _ => None,
        };
        let mut maps = self.peer_maps.borrow_mut();
        let map = maps
            .entry(key)
            .or_insert_with(|| vec![PEER_UNSET; g.nodes.len()]);
        if let Some(slot) = map.get_mut(i) {
            *slot = found.unwrap_or(PEER_NONE);
        }
        found.map(|j| j as usize)
    }
}

impl Shared<'_> {
    /// Whether [`Shared::peer_node`] of every node `i` of rank `r`'s graph in rank `p`'s is
    /// `i` or none: `p`'s node names are distinct and each of `r`'s nodes has the name of
    /// `p`'s node at its index (a function of the two graph classes, kept per pair).
    pub fn aligned(&self, r: usize, p: usize) -> bool {
        let key = (self.graph_class[r], self.graph_class[p]);
        if let Some(&a) = self.aligned.borrow().get(&key) {
            return a;
        }
        let (g, pg) = (&self.program.ranks[r], &self.program.ranks[p]);
        let a = self.names[p].len() == pg.nodes.len()
            && g.nodes.len() <= pg.nodes.len()
            && g.nodes.iter().zip(&pg.nodes).all(|(a, b)| a.name == b.name);
        self.aligned.borrow_mut().insert(key, a);
        a
    }
}

impl Shared<'_> {
    /// Whether node `i` of rank `r`'s graph and node `j` of rank `p`'s compute the same
    /// expression of the same leaves ([`same_expression`], memoized per pair of graph
    /// classes): what an equal structure hash suggests, confirmed.
    pub fn same_expr(&self, r: usize, i: usize, p: usize, j: usize) -> bool {
        let mut memo = self.same_exprs.borrow_mut();
        let memo = memo
            .entry((self.graph_class[r], self.graph_class[p]))
            .or_default();
        same_expression(
            &self.program.ranks[r],
            &self.structure[r],
            i,
            &self.program.ranks[p],
            &self.structure[p],
            j,
            memo,
        )
    }

    /// Whether rank `p` (another pipeline stage) holds the same tensor as output `o` of node
    /// `i` of rank `r`: its graph computes the same expression of the same leaves (structure
    /// hash, confirmed on the structure itself: [`same_expression`]) with the same local
    /// type. Stages run different programs, so a node of the same name there proves nothing;
    /// only the same computation does.
    pub fn stage_alike(&self, r: usize, p: usize, i: usize, o: usize) -> bool {
        let Some(&j) = self
            .by_structure
            .get(p)
            .and_then(|m| m.get(&self.structure[r][i]))
        else {
            return false;
        };
        let same = self.same_expr(r, i, p, j as usize);
        if !same {
            return false;
        }
        let meta = |q: usize, n: usize| {
            self.metas[q]
                .get(n)
                .and_then(|x| x.get(o))
                .cloned()
                .flatten()
        };
        let mine = meta(r, i);
        mine.is_some() && mine == meta(p, j as usize)
    }
}

/// The pairs of nodes of two graphs [`same_expression`] decided, by their indices.
pub type ExprMemo = HashMap<(u32, u32), bool>;

/// A [`PeerMap`] entry not asked yet.
const PEER_UNSET: u32 = u32::MAX;
/// A [`PeerMap`] entry: no such node in the peer's graph.
const PEER_NONE: u32 = u32::MAX - 1;

/// The views of a spec (`view`, `reshape`, `_unsafe_view`), by index, with their operator
/// and recorded global input and output shapes, found by node name or by the node they view.
#[derive(Default)]
pub struct SpecViews<'a> {
    /// Spec node index -> (operator, global input shape, global output shape).
    pub shapes: HashMap<usize, SpecView<'a>>,
    /// Spec view name -> node index.
    by_name: HashMap<&'a str, usize>,
    /// The name of the node a view reads ([`view_source`]) -> the view, where exactly one
    /// view reads it.
    by_input: HashMap<&'a str, usize>,
    /// The views by depth and [`skeletons`] hash at that depth.
    by_skeleton: HashMap<(usize, u64), Vec<usize>>,
    /// The spec's skeletons, to confirm a hash match on the structure.
    skeleton: Option<Skeleton>,
    /// (operator name, global input shape) -> the views with that input shape.
    by_global_input: HashMap<(&'a str, Vec<i64>), Vec<usize>>,
}

impl<'a> SpecViews<'a> {
    /// The views of `spec`.
    pub fn new(spec: &'a Graph) -> SpecViews<'a> {
        let mut sv = SpecViews::default();
        let mut by_input: HashMap<&str, Option<usize>> = HashMap::new();
        let sk = Skeleton::new(spec);
        for (j, n) in spec.nodes.iter().enumerate() {
            let Some((source, entry)) = spec_view(spec, n) else {
                continue;
            };
            sv.by_global_input
                .entry((entry.0.name.as_str(), entry.1.clone()))
                .or_default()
                .push(j);
            sv.shapes.insert(j, entry);
            for (d, level) in sk.levels.iter().enumerate() {
                sv.by_skeleton.entry((d, level[j])).or_default().push(j);
            }
            sv.by_name.insert(n.name.as_str(), j);
            // Two views of one node: neither is taken (which one a rank's view is, is open).
            by_input
                .entry(spec.nodes[source].name.as_str())
                .and_modify(|e| *e = None)
                .or_insert(Some(j));
        }
        sv.by_input = by_input
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        sv.skeleton = Some(sk);
        sv
    }

    /// The spec's [`Skeleton`] (shared with the position reading of its scalings).
    pub fn skeleton(&self) -> Option<&Skeleton> {
        self.skeleton.as_ref()
    }

    /// The spec's view for a rank's view `op` matched by no name or skeleton, from the global
    /// input shape its placements imply (`global_in`: the local shape with every dim that a
    /// mesh dim shards or holds rows of scaled by that mesh dim's size): the spec's views of
    /// `op` with exactly that input shape, whose output shape holds `local_out` (every dim a
    /// multiple, as many dims), where they all have the same output shape (a view computed
    /// otherwise on the ranks, as the ring's merged attention output). Like every match, it
    /// only selects among the readings the local shapes admit.
    pub fn by_global_input(
        &self,
        op: &str,
        global_in: &[i64],
        local_out: &[usize],
    ) -> Option<(&[i64], &[i64])> {
        let holds = |go: &[i64]| {
            go.len() == local_out.len()
                && go
                    .iter()
                    .zip(local_out)
                    .all(|(&g, &l)| l > 0 && g >= l as i64 && g % l as i64 == 0)
        };
        let mut found: Option<(&[i64], &[i64])> = None;
        for j in self.by_global_input.get(&(op, global_in.to_vec()))? {
            let (_, gi, go) = self.shapes.get(j)?;
            if !holds(go) {
                continue;
            }
            match found {
                None => found = Some((gi.as_slice(), go.as_slice())),
                Some((_, f)) if f == go.as_slice() => {}
                Some(_) => return None,
            }
        }
        found
    }

    /// For every node of rank graph `g` (local metas `metas`), the spec's view it is: the
    /// spec's view of the same name, or else the spec's one view of the node this view reads
    /// (through copies; a view of a view reads the spec's match of that view), whichever has
    /// global shapes that can hold the local ones (every global dim a multiple of the local
    /// one, as many dims) and the same operator. Names shift between the programs where a
    /// rank has more views than the spec (ZeRO-3's regrouped parameters): the node a view
    /// reads settles it then. The match only selects among the readings the local shapes
    /// admit (the view rules check the one they take against the local shapes).
    pub fn matches(
        &self,
        spec: &Graph,
        g: &Graph,
        sk: &Skeleton,
        metas: &[Vec<Option<Meta>>],
    ) -> Vec<Option<u32>> {
        let mut out: Vec<Option<u32>> = vec![None; g.nodes.len()];
        let Some(spec_sk) = self.skeleton.as_ref().filter(|_| !self.shapes.is_empty()) else {
            return out;
        };
        let mut memo = SkeletonMemo::new();
        let holds = |gs: &[i64], l: Option<&Meta>| {
            l.is_some_and(|l| {
                gs.len() == l.shape.len()
                    && gs
                        .iter()
                        .zip(&l.shape)
                        .all(|(&gd, &ld)| ld > 0 && gd >= ld as i64 && gd % ld as i64 == 0)
            })
        };
        for (i, n) in g.nodes.iter().enumerate() {
            let Some(op) = n.op() else { continue };
            if !matches!(op.name.as_str(), "view" | "reshape" | "_unsafe_view") {
                continue;
            }
            let Some(input) = n.inputs().first().copied() else {
                continue;
            };
            let local_in = metas
                .get(input.node)
                .and_then(|o| o.get(input.output))
                .cloned()
                .flatten();
            let local_out = metas.get(i).and_then(|o| o.first()).cloned().flatten();
            let fits = |j: &usize| {
                self.shapes.get(j).is_some_and(|(sop, gi, go)| {
                    *sop == op && holds(gi, local_in.as_ref()) && holds(go, local_out.as_ref())
                })
            };
            let source = view_source(g, input.node);
            let source_key = out[source].map_or(g.nodes[source].name.as_str(), |j| {
                spec.nodes[j as usize].name.as_str()
            });
            // The spec's views of the same skeleton that fit, where they all have the same
            // global shapes (the same layer's view in another microbatch, or the same view of
            // layers alike): names shift between the programs (a pipeline stage's graph
            // names its first layer's nodes from 0, its second microbatch's after its first).
            // The deepest skeleton with a fitting spec view decides; deeper levels stop
            // matching where the rank's graph reads a message the spec computes in place.
            // A candidate counts only where its structure is the same to that depth (equal
            // hashes could be a collision).
            let by_skeleton = (0..sk.levels.len())
                .rev()
                .find_map(|d| {
                    let cands = self.by_skeleton.get(&(d, sk.levels[d][i]))?;
                    let mut same = |j: usize| sk.same(g, i, spec_sk, spec, j, d, &mut memo);
                    let first = cands.iter().copied().find(|&j| fits(&j) && same(j))?;
                    let (_, gi, go) = self.shapes.get(&first)?;
                    // Another fitting candidate of other global shapes, alike in structure:
                    // no match. One of the same shapes reads alike, confirmed or not.
                    let agree = cands.iter().copied().all(|j| {
                        j == first
                            || !fits(&j)
                            || self
                                .shapes
                                .get(&j)
                                .is_some_and(|(_, gi2, go2)| gi2 == gi && go2 == go)
                            || !same(j)
                    });
                    // Candidates of different global shapes at the deepest level that fits: no
                    // match (a shallower level only adds candidates).
                    Some(agree.then_some(first))
                })
                .flatten();
            out[i] = by_skeleton
                .or_else(|| self.by_name.get(n.name.as_str()).copied().filter(fits))
                .or_else(|| self.by_input.get(source_key).copied().filter(fits))
                .and_then(|j| u32::try_from(j).ok());
        }
        out
    }
}

/// How many operators deep a view's [`skeletons`] hashes read, at most.
const SKELETON_DEPTH: usize = 16;

/// What a node is in a [`Skeleton`]: its rule, read once.
#[derive(Clone, Copy, PartialEq)]
enum Leaf {
    /// Any value (a received message, a node that is not an operator call).
    Any,
    /// The graph input (by index) that this node is, or rearranges.
    Input(usize),
}

/// One node's step in a [`Skeleton`].
enum Step {
    /// The same at every depth.
    Fixed(Leaf, u64),
    /// Read through: the node it reads, at the same depth.
    Through(usize),
    /// An operator (index into the graph's node, for its name) and its hash, and the values
    /// it reads.
    Op(usize, u64, Vec<ValueId>),
}

/// The skeletons of a graph's nodes ([`skeletons`]) and the steps they hash, so that a hash
/// match can be confirmed on the structure itself ([`Skeleton::same`]).
pub struct Skeleton {
    /// Per depth (index d - 1), per node: the hash.
    pub levels: Vec<Vec<u64>>,
    steps: Vec<Step>,
}

impl Skeleton {
    /// Per depth d (1 to [`SKELETON_DEPTH`], index d - 1) and node of `g`, a hash of its
    /// computation d operators deep, without
    /// literals (a rank's local shapes are not the spec's global ones) and without node names
    /// (they shift between programs): operators, and graph inputs by name (the parameters a
    /// layer reads, which the spec and the ranks name alike). Communication the spec does not
    /// have and that keeps the shape (an all-reduce, its wait) is read through; a received
    /// message is any value (the spec computes it in place). Two nodes of equal skeletons
    /// compute the same operators from the same parameters near them, whatever their names;
    /// equal hashes only suggest it ([`Skeleton::same`] decides).
    pub fn new(g: &Graph) -> Skeleton {
        let hash = |x: &dyn Fn(&mut std::collections::hash_map::DefaultHasher)| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            x(&mut h);
            h.finish()
        };
        let any = hash(&|h| "*".hash(h));
        // A graph input, and a rearrangement of one that the spec does not have (ZeRO-3
        // gathers a parameter's chunks and regroups them: views, permutes, copies, the gather
        // and its wait): the input, by name, at every depth.
        let mut leaf: Vec<Option<(usize, u64)>> = Vec::with_capacity(g.nodes.len());
        for (k, n) in g.nodes.iter().enumerate() {
            let l = match &n.kind {
                NodeKind::Call { op, .. } => {
                    let moves = matches!(
                        (op.namespace.as_str(), op.name.as_str()),
                        (
                            "aten",
                            "view"
                                | "reshape"
                                | "_unsafe_view"
                                | "permute"
                                | "clone"
                                | "contiguous"
                        ) | ("_c10d_functional", "all_gather_into_tensor" | "wait_tensor")
                    );
                    n.inputs()
                        .first()
                        .filter(|_| moves)
                        .and_then(|v| leaf[v.node])
                }
                _ => Some((
                    k,
                    hash(&|h| {
                        "input".hash(h);
                        n.name.hash(h);
                    }),
                )),
            };
            leaf.push(l);
        }
        let steps: Vec<Step> = g
            .nodes
            .iter()
            .enumerate()
            .map(|(k, n)| match (&n.kind, leaf[k]) {
                (_, Some((input, l))) => Step::Fixed(Leaf::Input(input), l),
                (NodeKind::Call { op, .. }, None) => {
                    let first = n.inputs().first().copied();
                    match (op.namespace.as_str(), op.name.as_str(), first) {
                        ("_c10d_functional", "wait_tensor" | "all_reduce", Some(v)) => {
                            Step::Through(v.node)
                        }
                        ("shardproof_p2p", _, _) => Step::Fixed(Leaf::Any, any),
                        _ => Step::Op(
                            k,
                            hash(&|h| {
                                op.namespace.hash(h);
                                op.name.hash(h);
                            }),
                            n.inputs(),
                        ),
                    }
                }
                (_, None) => Step::Fixed(Leaf::Any, any),
            })
            .collect();
        // A cheap mix per level (the operator and leaf hashes are SipHash already).
        let mix = |h: u64, x: u64| (h ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        let mut levels: Vec<Vec<u64>> = Vec::with_capacity(SKELETON_DEPTH);
        let mut prev: Vec<u64> = vec![any; g.nodes.len()];
        for _ in 0..SKELETON_DEPTH {
            let mut cur: Vec<u64> = Vec::with_capacity(g.nodes.len());
            for step in &steps {
                let v = match step {
                    Step::Fixed(_, x) => *x,
                    Step::Through(q) => cur[*q],
                    Step::Op(_, oh, ins) => ins
                        .iter()
                        .fold(*oh, |h, v| mix(mix(h, prev[v.node]), v.output as u64)),
                };
                cur.push(v);
            }
            levels.push(cur);
            prev = levels.last().cloned().unwrap_or_default();
        }
        Skeleton { levels, steps }
    }

    /// Whether node `a` of `g` (skeleton `self`) and node `b` of `h` (skeleton `other`) have
    /// the same skeleton at level `d` (depth d + 1), compared on the structure the hashes
    /// stand for: the same operators on the same outputs of inputs alike one level
    /// shallower, the same graph inputs by name, read through the same communication. A hash
    /// match alone could be a collision and select a wrong spec view; unequal hashes settle
    /// a difference. `memo` keeps, per pair of nodes of these two graphs, the deepest level
    /// found alike and the shallowest found different (alike at a level is alike at every
    /// shallower one), so a DAG's shared inputs are read once per pair.
    #[allow(clippy::too_many_arguments)]
    pub fn same(
        &self,
        g: &Graph,
        a: usize,
        other: &Skeleton,
        h: &Graph,
        b: usize,
        d: usize,
        memo: &mut SkeletonMemo,
    ) -> bool {
        // Through steps read the same level: resolve them first.
        let resolve = |s: &Skeleton, mut n: usize| {
            while let Some(Step::Through(q)) = s.steps.get(n) {
                n = *q;
            }
            n
        };
        let (a, b) = (resolve(self, a), resolve(other, b));
        if self.levels.get(d).and_then(|l| l.get(a)) != other.levels.get(d).and_then(|l| l.get(b)) {
            return false;
        }
        let key = (a as u32, b as u32);
        let d8 = d as i8;
        if let Some(&(alike, differs)) = memo.get(&key) {
            if d8 <= alike {
                return true;
            }
            if d8 >= differs {
                return false;
            }
        }
        let x = match (self.steps.get(a), other.steps.get(b)) {
            (Some(Step::Fixed(la, _)), Some(Step::Fixed(lb, _))) => match (la, lb) {
                (Leaf::Any, Leaf::Any) => true,
                (Leaf::Input(p), Leaf::Input(q)) => g.nodes[*p].name == h.nodes[*q].name,
                _ => false,
            },
            (Some(Step::Op(na, _, ia)), Some(Step::Op(nb, _, ib))) => {
                let same_op = match (g.nodes[*na].op(), h.nodes[*nb].op()) {
                    (Some(x), Some(y)) => x.namespace == y.namespace && x.name == y.name,
                    _ => false,
                };
                same_op
                    && ia.len() == ib.len()
                    && ia.iter().zip(ib).all(|(u, v)| {
                        u.output == v.output
                            && (d == 0 || self.same(g, u.node, other, h, v.node, d - 1, memo))
                    })
            }
            _ => false,
        };
        let e = memo.entry(key).or_insert((-1, i8::MAX));
        if x {
            e.0 = e.0.max(d8);
        } else {
            e.1 = e.1.min(d8);
        }
        x
    }
}

/// The pairs of nodes [`Skeleton::same`] compared: the deepest level found alike and the
/// shallowest found different (-1 and `i8::MAX`: none).
pub type SkeletonMemo = HashMap<(u32, u32), (i8, i8)>;

/// A spec view's operator and global input and output shapes.
pub type SpecView<'a> = (&'a OpName, Vec<i64>, Vec<i64>);

/// A view node of `spec`: the node it views ([`view_source`]), its operator, and its global input
/// and output shapes.
fn spec_view<'a>(spec: &'a Graph, n: &'a Node) -> Option<(usize, SpecView<'a>)> {
    let op = n.op()?;
    if !matches!(op.name.as_str(), "view" | "reshape" | "_unsafe_view") {
        return None;
    }
    let shape = n.outputs.first()?.ty.as_ref()?.concrete_shape()?;
    let input = n.inputs().first().copied()?;
    let source = &spec.nodes[input.node];
    let in_shape = source
        .outputs
        .get(input.output)?
        .ty
        .as_ref()?
        .concrete_shape()?;
    Some((view_source(spec, input.node), (op, in_shape, shape)))
}

/// The node a view's input is known by across programs: the node itself, or where it is a
/// `clone` (a copy whose name shifts with the number of copies before it), or an all-reduce
/// or its wait (communication the spec does not have, which keeps the shape), what it reads.
pub fn view_source(g: &Graph, mut node: usize) -> usize {
    loop {
        let n = &g.nodes[node];
        let through = n.op().is_some_and(|op| {
            matches!(
                (op.namespace.as_str(), op.name.as_str()),
                ("aten", "clone") | ("_c10d_functional", "wait_tensor" | "all_reduce")
            )
        });
        match n.inputs().first() {
            Some(v) if through => node = v.node,
            _ => return node,
        }
    }
}

/// The classes of equal rank graphs ([`Shared::graph_class`]): each rank's class is the
/// first rank whose graph equals its own, compared in full (a hash only groups candidates).
pub fn graph_classes(graphs: &[Arc<Graph>]) -> Vec<usize> {
    let sig = |g: &Graph| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        g.nodes.len().hash(&mut h);
        for n in &g.nodes {
            n.name.hash(&mut h);
        }
        h.finish()
    };
    let mut firsts: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut class = Vec::with_capacity(graphs.len());
    // One graph read for several ranks: its class is known without hashing it again.
    let mut by_ptr: HashMap<*const Graph, usize> = HashMap::new();
    for (r, g) in graphs.iter().enumerate() {
        if let Some(&q) = by_ptr.get(&Arc::as_ptr(g)) {
            class.push(class[q]);
            continue;
        }
        by_ptr.insert(Arc::as_ptr(g), r);
        let cands = firsts.entry(sig(g)).or_default();
        let same = cands.iter().copied().find(|&q| {
            let o = &graphs[q];
            std::sync::Arc::ptr_eq(o, g)
                || o.nodes.len() == g.nodes.len()
                    && o.nodes
                        .iter()
                        .zip(&g.nodes)
                        .all(|(a, b)| a.name == b.name && a.kind == b.kind)
        });
        match same {
            Some(q) => class.push(q),
            None => {
                cands.push(r);
                class.push(r);
            }
        }
    }
    class
}

/// The classes of rank graphs equal up to their point-to-point peers (issue 44, step 1 of
/// the class design): graphs equal node for node (names and kinds, as [`graph_classes`])
/// except that a `shardproof_p2p.send`'s and a `recv`'s global peer (a group-relative one
/// resolved through `program`'s groups) is compared as an offset from the graph's own rank.
/// Data-parallel replicas of a pipeline stage with global peers differ only there (`send(x, 4)`
/// on rank 0, `send(x, 6)` on rank 2). Every class of [`graph_classes`] lies in one relative
/// class; `program.ranks[r]` is rank `r`'s graph.
pub fn relative_classes(program: &Program) -> Vec<usize> {
    let graphs = &program.ranks;
    let mut firsts: HashMap<(usize, u64), Vec<usize>> = HashMap::new();
    let mut class: Vec<usize> = Vec::with_capacity(graphs.len());
    // Per graph read (ranks that load one file share it): its names' hash, its point-to-point
    // nodes, and whether every other node's kind equals itself (no NaN literal). Two ranks of
    // one graph compare equal node for node except where a route is read: there only
    // (issue 44: comparing every node of every rank was a twelfth of the check).
    let mut per_graph: HashMap<*const Graph, (u64, Vec<usize>, bool)> = HashMap::new();
    for (r, g) in graphs.iter().enumerate() {
        let (hash, p2p, reflexive) = &*per_graph.entry(Arc::as_ptr(g)).or_insert_with(|| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for n in &g.nodes {
                n.name.hash(&mut h);
            }
            let is_p2p = |n: &shardproof_ir::Node| {
                n.op()
                    .is_some_and(|o| o.namespace == shardproof_ops::P2P_NAMESPACE)
            };
            let p2p = (0..g.nodes.len())
                .filter(|&i| is_p2p(&g.nodes[i]))
                .collect();
            // `==` on one node with itself: false only for a NaN literal (`Arg`'s floats).
            #[allow(clippy::eq_op)]
            let reflexive = g.nodes.iter().all(|n| is_p2p(n) || n.kind == n.kind);
            (h.finish(), p2p, reflexive)
        });
        let cands = firsts.entry((g.nodes.len(), *hash)).or_default();
        let same = cands.iter().copied().find(|&q| {
            let o = &graphs[q];
            if Arc::ptr_eq(o, g) {
                return *reflexive
                    && p2p.iter().all(|&i| {
                        same_up_to_peers(program, &o.nodes[i].kind, q, &g.nodes[i].kind, r)
                    });
            }
            o.nodes
                .iter()
                .zip(&g.nodes)
                .all(|(a, b)| a.name == b.name && same_up_to_peers(program, &a.kind, q, &b.kind, r))
        });
        match same {
            Some(q) => class.push(class[q]),
            None => {
                cands.push(r);
                class.push(r);
            }
        }
    }
    class
}

/// Whether node kinds `a` (of rank `ra`'s graph) and `b` (of rank `rb`'s) are equal, a
/// point-to-point call's route (its global peer, as an offset from the graph's own rank, and
/// its tag) compared instead of the literals that state it.
fn same_up_to_peers(program: &Program, a: &NodeKind, ra: usize, b: &NodeKind, rb: usize) -> bool {
    match (a, b) {
        (
            NodeKind::Call {
                op: oa,
                args: aa,
                kwargs: ka,
            },
            NodeKind::Call {
                op: ob,
                args: ab,
                kwargs: kb,
            },
        ) if oa.namespace == shardproof_ops::P2P_NAMESPACE && oa == ob => {
            let route = |args: &[Arg], kwargs: &[(String, Arg)], r: usize| {
                shardproof_ops::p2p_node_call(
                    oa,
                    args,
                    kwargs,
                    &shardproof_ops::program_members(program, r),
                )
                .and_then(Result::ok)
            };
            let (Some(x), Some(y)) = (route(aa, ka, ra), route(ab, kb, rb)) else {
                return a == b;
            };
            // The peer's position (`send(input, dst, tag, group)`, `recv(size, dtype, src,
            // tag, group)`): the arguments before it say what is sent or received; those from
            // it on, and the route's keywords, are the route.
            let at = if x.end == shardproof_ops::P2pEnd::Send {
                1
            } else {
                2
            };
            let route_key = |k: &str| matches!(k, "dst" | "src" | "tag" | "group");
            let rest = |kw: &[(String, Arg)]| {
                kw.iter()
                    .filter(|(k, _)| !route_key(k))
                    .cloned()
                    .collect::<Vec<_>>()
            };
            // The same form on both sides (a global peer, or an index into the same group),
            // so that literal comparisons of the two graphs' nodes (`same_expression`) agree
            // for a twin and its representative.
            let group = |args: &[Arg], kwargs: &[(String, Arg)]| {
                args.get(at + 2)
                    .or_else(|| kwargs.iter().find(|(k, _)| k == "group").map(|(_, a)| a))
                    .filter(|a| **a != Arg::None)
                    .cloned()
            };
            x.end == y.end
                && group(aa, ka) == group(ab, kb)
                && x.tag == y.tag
                && x.peer as i64 - ra as i64 == y.peer as i64 - rb as i64
                && aa.iter().take(at).eq(ab.iter().take(at))
                && rest(ka) == rest(kb)
        }
        _ => a == b,
    }
}

/// The scalings of `spec` (the case's single-device program): every `mul` or `div` by a
/// literal number, by node name. A rank node of the same name and operator whose factor is
/// the spec's divided by a mesh dim's size n (autograd folds the 1/n of a loss share into
/// its backward's constants) makes a replicated value whose n copies sum to the spec's.
pub fn spec_scalings(spec: &Graph) -> HashMap<&str, (&OpName, f64, Option<i64>)> {
    spec.nodes
        .iter()
        .filter_map(|n| Some((n.name.as_str(), scaling_of_node(n)?)))
        .collect()
}

fn hash_arg(a: &Arg, h: &mut impl Hasher) {
    std::mem::discriminant(a).hash(h);
    match a {
        Arg::None | Arg::Value(_) => {}
        Arg::Bool(b) => b.hash(h),
        Arg::Int(i) => i.hash(h),
        Arg::Float(f) => f.to_bits().hash(h),
        // Each rank names its own device (`cuda:0`, `cuda:1`): not a rank-dependent value.
        Arg::Device(_) => {}
        Arg::Str(s) | Arg::Layout(s) | Arg::MemoryFormat(s) => s.hash(h),
        Arg::List(items) => {
            items.len().hash(h);
            items.iter().for_each(|x| hash_arg(x, h));
        }
        Arg::Dtype(d) => d.hash(h),
        Arg::Op(o) => o.hash(h),
    }
}

/// A hash of the literal arguments of every node of `g` (values count only by position).
pub fn literal_hashes(g: &Graph) -> Vec<u64> {
    g.nodes
        .iter()
        .map(|n| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            if let NodeKind::Call { args, kwargs, .. } = &n.kind {
                args.iter().for_each(|a| hash_arg(a, &mut h));
                for (k, a) in kwargs {
                    k.hash(&mut h);
                    hash_arg(a, &mut h);
                }
            }
            h.finish()
        })
        .collect()
}

/// A hash of every node's computation: its operator, literals and the hashes of the values it
/// reads (graph inputs and constants by name), so that two ranks' nodes hash alike exactly when
/// they compute the same expression of the same leaves.
pub fn structure_hashes(g: &Graph, literals: &[u64]) -> Vec<u64> {
    structure_hashes_with_leaves(g, literals, |_| None)
}

/// [`structure_hashes`], where `leaf(node)` names nodes hashed as leaves of the given tag
/// instead of by their computation (`None`: hashed as usual), and what reads them by that.
pub fn structure_hashes_with_leaves(
    g: &Graph,
    literals: &[u64],
    leaf: impl Fn(usize) -> Option<u64>,
) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::with_capacity(g.nodes.len());
    for (i, n) in g.nodes.iter().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        match (&n.kind, leaf(i)) {
            (_, Some(tag)) => ("leaf", tag).hash(&mut h),
            (NodeKind::Call { op, .. }, None) => {
                op.hash(&mut h);
                literals[i].hash(&mut h);
                for v in n.inputs() {
                    out[v.node].hash(&mut h);
                    v.output.hash(&mut h);
                }
            }
            _ => n.name.hash(&mut h),
        }
        out.push(h.finish());
    }
    out
}

/// Whether two literal arguments are equal as [`hash_arg`] reads them (values by position
/// only, devices not at all).
pub(super) fn same_arg(a: &Arg, b: &Arg) -> bool {
    match (a, b) {
        (Arg::None, Arg::None)
        | (Arg::Value(_), Arg::Value(_))
        | (Arg::Device(_), Arg::Device(_)) => true,
        (Arg::Bool(x), Arg::Bool(y)) => x == y,
        (Arg::Int(x), Arg::Int(y)) => x == y,
        (Arg::Float(x), Arg::Float(y)) => x.to_bits() == y.to_bits(),
        (Arg::Str(x), Arg::Str(y))
        | (Arg::Layout(x), Arg::Layout(y))
        | (Arg::MemoryFormat(x), Arg::MemoryFormat(y)) => x == y,
        (Arg::List(x), Arg::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(u, v)| same_arg(u, v))
        }
        (Arg::Dtype(x), Arg::Dtype(y)) => x == y,
        (Arg::Op(x), Arg::Op(y)) => x == y,
        _ => false,
    }
}

/// Whether two arguments are of one kind, their literal values aside (lists element by
/// element).
fn loose_arg(a: &Arg, b: &Arg) -> bool {
    match (a, b) {
        (Arg::List(x), Arg::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(u, v)| loose_arg(u, v))
        }
        (Arg::List(_), _) | (_, Arg::List(_)) => false,
        _ => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// Whether node `a` of `g` and node `b` of `h` compute the same expression of the same leaves,
/// compared on the structure [`structure_hashes`] (`sa`, `sb`) stands for: the same operator
/// and literals on the same outputs of nodes alike, graph inputs and constants by name. Equal
/// hashes only suggest it (a collision would merge two stages' different tensors); unequal
/// hashes settle it. `memo` keeps the pairs decided for this pair of graphs. Iterative: an
/// expression can reach back through the whole graph.
pub fn same_expression(
    g: &Graph,
    sa: &[u64],
    a: usize,
    h: &Graph,
    sb: &[u64],
    b: usize,
    memo: &mut ExprMemo,
) -> bool {
    same_expression_upto(
        g,
        Some(sa),
        a,
        h,
        Some(sb),
        b,
        memo,
        &|_, _| None,
        &|_, _| false,
    )
}

/// [`same_expression`] where `leaf(x, y)` may decide a pair of nodes without reading their
/// inputs (a collective's result the same on every member, say), `loose(x, y)` lets a pair's
/// literal arguments differ (where a rule read both, as for a node and its peer node), and
/// the structure tables (`sa`, `sb`), where given, settle unequal pairs first (they hash
/// whole subexpressions, literals included, so they are left out with `leaf` or `loose`).
#[allow(clippy::too_many_arguments)]
pub fn same_expression_upto(
    g: &Graph,
    sa: Option<&[u64]>,
    a: usize,
    h: &Graph,
    sb: Option<&[u64]>,
    b: usize,
    memo: &mut ExprMemo,
    leaf: &dyn Fn(usize, usize) -> Option<bool>,
    loose: &dyn Fn(usize, usize) -> bool,
) -> bool {
    let key = |a: usize, b: usize| (a as u32, b as u32);
    // (pair, whether its inputs were pushed already).
    let mut stack: Vec<(usize, usize, bool)> = vec![(a, b, false)];
    while let Some((x, y, expanded)) = stack.pop() {
        if memo.contains_key(&key(x, y)) {
            continue;
        }
        let (nx, ny) = (&g.nodes[x], &h.nodes[y]);
        if expanded {
            let all = nx
                .inputs()
                .iter()
                .zip(ny.inputs())
                .all(|(u, v)| memo.get(&key(u.node, v.node)).copied().unwrap_or(false));
            memo.insert(key(x, y), all);
            continue;
        }
        if let Some(same) = leaf(x, y) {
            memo.insert(key(x, y), same);
            continue;
        }
        let local = match (sa, sb) {
            (Some(sa), Some(sb)) => sa.get(x) == sb.get(y),
            _ => true,
        } && match (&nx.kind, &ny.kind) {
            (
                NodeKind::Call {
                    op: o1,
                    args: a1,
                    kwargs: k1,
                },
                NodeKind::Call {
                    op: o2,
                    args: a2,
                    kwargs: k2,
                },
            ) => {
                let (ix, iy) = (nx.inputs(), ny.inputs());
                let lo = loose(x, y);
                let arg = |u: &Arg, v: &Arg| {
                    if lo {
                        loose_arg(u, v)
                    } else {
                        same_arg(u, v)
                    }
                };
                o1 == o2
                    && a1.len() == a2.len()
                    && a1.iter().zip(a2).all(|(u, v)| arg(u, v))
                    && k1.len() == k2.len()
                    && k1
                        .iter()
                        .zip(k2)
                        .all(|((n1, u), (n2, v))| n1 == n2 && arg(u, v))
                    && ix.len() == iy.len()
                    && ix.iter().zip(&iy).all(|(u, v)| u.output == v.output)
            }
            (NodeKind::Call { .. }, _) | (_, NodeKind::Call { .. }) => false,
            // Graph inputs and constants by name (and kind: an input is no constant).
            (k1, k2) => k1 == k2 && nx.name == ny.name,
        };
        if !local {
            memo.insert(key(x, y), false);
            continue;
        }
        stack.push((x, y, true));
        for (u, v) in nx.inputs().iter().zip(ny.inputs()) {
            if !memo.contains_key(&key(u.node, v.node)) {
                stack.push((u.node, v.node, false));
            }
        }
    }
    memo.get(&key(a, b)).copied().unwrap_or(false)
}

/// The ranks along mesh dim `m` through `rank` (its coordinate varied), in coordinate order.
pub fn peers(mesh: &Mesh, rank: usize, m: usize) -> Vec<usize> {
    let mut c = mesh.coords(rank);
    (0..mesh.dims[m].1)
        .map(|k| {
            c[m] = k;
            mesh.rank(&c)
        })
        .collect()
}

#[cfg(test)]
mod tests;
