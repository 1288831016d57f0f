//! A stage's structure up to a renumbering of the ranks that hold it (the memo key's rank part).
//!
//! On a pipeline plan every pipeline stage's layers run on other ranks: keyed by absolute rank
//! numbers, the same layer on stage 3's ranks and on stage 7's is two proofs. A stage's theorem
//! reads the ranks only through what this key writes, with ranks numbered by their position
//! among the holders (see the module docs of [`super`], "Memo up to renumbering the holding
//! ranks", and docs/prove/stages.md for the argument):
//!
//! - the holders (ranks with a node of the stage, or a value of one of its relations), ordered
//!   and written with their mesh coordinates *relabelled* on every dim that all the stage's
//!   relations place `Replicate()`: there the coordinates of ranks that compute part of the
//!   stage or hold its target come first (in increasing order), then the others;
//! - each holder's graph (graphs equal up to names are written once, holders name them by
//!   first appearance);
//! - every process group a holder's call names, its member sets that hold a holder, members
//!   written as their holder position (a non-holder by its absolute rank, which only makes keys
//!   differ);
//! - every relation, its holders renumbered, its `at:` coordinates relabelled.
//!
//! Where the stage names ranks in another way, the key keeps absolute rank numbers
//! ([`renumbered`] answers `None`): a point-to-point call without `group` (its peer is a global
//! rank), an `expr:` layout (it names rank tensors), per-rank `impl_values` on a stage that
//! some rank does not hold, a rank count that is not the mesh's, and a one-dim (or no-dim)
//! mesh where a string argument could name an undeclared group (such a group is every rank).

use super::canon::{self, NodeOrder};
use shardproof_case::{Case, Layout, Placement};
use shardproof_ir::{Arg, Graph, NodeKind};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

/// Marks a rank that holds nothing of the stage in [`Holders::position`].
const NOT_HELD: usize = usize::MAX;

/// The ranks holding a stage, numbered by position, and the mesh dims whose coordinates the key
/// relabels.
struct Holders {
    /// Holding ranks, in the order of their relabelled coordinates.
    ranks: Vec<usize>,
    /// Per rank: its position among the holders, or [`NOT_HELD`].
    position: Vec<usize>,
    /// Per mesh dim: where every relation places it `Replicate()`, the new coordinate of each
    /// coordinate (those of ranks that compute part of the stage or hold its target first, in
    /// increasing order, then the others in increasing order); `None` elsewhere.
    relabel: Vec<Option<Vec<usize>>>,
}

/// Whether a call is a point-to-point send or recv whose peer is a global rank (no `group`:
/// the only string parameter of `send` and `recv` is `group`).
fn global_peer(op: &shardproof_ir::OpName, args: &[Arg], kwargs: &[(String, Arg)]) -> bool {
    op.namespace == shardproof_ops::P2P_NAMESPACE
        && !args
            .iter()
            .chain(kwargs.iter().map(|(_, a)| a))
            .any(|a| matches!(a, Arg::Str(_)))
}

/// Every string argument of `g`'s calls, lists included, added to `out` once; with
/// `skip_p2p`, not those of point-to-point calls (whose group is read only to resolve their
/// peer, which a key with messages writes instead).
fn strings_of<'g>(g: &'g Graph, skip_p2p: bool, out: &mut Vec<&'g str>) {
    fn walk<'g>(a: &'g Arg, out: &mut Vec<&'g str>) {
        match a {
            Arg::Str(s) if !out.contains(&s.as_str()) => out.push(s),
            Arg::List(items) => items.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    for n in &g.nodes {
        if skip_p2p && super::canon::is_p2p(&n.kind) {
            continue;
        }
        if let NodeKind::Call { args, kwargs, .. } = &n.kind {
            args.iter()
                .chain(kwargs.iter().map(|(_, a)| a))
                .for_each(|a| walk(a, out));
        }
    }
}

/// Whether a graph names a global rank (a point-to-point call without `group`) or, where
/// `declared` is given, has a string argument that names no declared group.
fn names_ranks(g: &Graph, declared: Option<&[&str]>) -> bool {
    g.nodes.iter().any(|n| match &n.kind {
        NodeKind::Call { op, args, kwargs } => {
            global_peer(op, args, kwargs)
                || declared.is_some_and(|names| {
                    args.iter()
                        .chain(kwargs.iter().map(|(_, a)| a))
                        .any(|a| matches!(a, Arg::Str(s) if !names.contains(&s.as_str())))
                })
        }
        _ => false,
    })
}

impl Holders {
    /// The holders of a stage case, or `None` where its theorem names ranks otherwise than
    /// through what the renumbered key writes (see the module docs).
    fn of(case: &Case) -> Option<Holders> {
        let program = &case.program;
        let nranks = program.ranks.len();
        if program.mesh.size() != nranks {
            return None;
        }
        let mut held = vec![false; nranks];
        for (r, g) in program.ranks.iter().enumerate() {
            held[r] = !g.nodes.is_empty();
        }
        let relations = case
            .inputs
            .iter()
            .map(|r| (&r.layout, &r.rank_values, &r.impl_values))
            .chain(
                case.outputs
                    .iter()
                    .map(|o| (&o.layout, &o.rank_values, &o.impl_values)),
            );
        let mut placed = Vec::new();
        for (layout, rank_values, _) in relations.clone() {
            let Layout::Placed(l) = layout else {
                return None;
            };
            placed.push(l);
            for &(r, _) in rank_values {
                *held.get_mut(r)? = true;
            }
        }
        let ranks: Vec<usize> = (0..nranks).filter(|&r| held[r]).collect();
        let every = ranks.len() == nranks;
        if relations
            .clone()
            .any(|(_, _, iv)| !iv.is_empty() && (!every || iv.len() != nranks))
        {
            return None;
        }
        // A one-dim mesh's undeclared group is every rank: a renumbering is then the identity
        // (all ranks hold the stage) or not allowed.
        let names: Vec<&str> = program.groups.iter().map(|g| g.name.as_str()).collect();
        let declared = (program.mesh.dims.len() <= 1 && !every).then_some(names.as_slice());
        let mut seen: Vec<*const Graph> = Vec::new();
        for &r in &ranks {
            let g = &program.ranks[r];
            if !seen.contains(&Arc::as_ptr(g)) {
                seen.push(Arc::as_ptr(g));
                if names_ranks(g, declared) {
                    return None;
                }
            }
        }
        // A rank is active where it computes part of the stage or holds its target; the others
        // hold only inputs that the relations lay out on them.
        let mut active = vec![false; nranks];
        for (r, g) in program.ranks.iter().enumerate() {
            active[r] = g.nodes.iter().any(|n| !matches!(n.kind, NodeKind::Input));
        }
        for o in &case.outputs {
            for &(r, _) in &o.rank_values {
                if let Some(a) = active.get_mut(r) {
                    *a = true;
                }
            }
        }
        let mesh = &program.mesh;
        let coords: Vec<Vec<usize>> = (0..nranks).map(|r| mesh.coords(r)).collect();
        let relabel: Vec<Option<Vec<usize>>> = (0..mesh.dims.len())
            .map(|d| {
                let replicated = placed
                    .iter()
                    .all(|l| matches!(l.placements.get(d), Some(Placement::Replicate)));
                if !replicated {
                    return None;
                }
                let size = mesh.dims[d].1;
                let mut hot = vec![false; size];
                for r in (0..nranks).filter(|&r| active[r]) {
                    hot[coords[r][d]] = true;
                }
                let order = (0..size)
                    .filter(|&c| hot[c])
                    .chain((0..size).filter(|&c| !hot[c]));
                let mut map = vec![0; size];
                for (new, old) in order.enumerate() {
                    map[old] = new;
                }
                Some(map)
            })
            .collect();
        let canonical = |r: usize| -> usize {
            let relabelled: Vec<usize> = coords[r]
                .iter()
                .zip(&relabel)
                .map(|(&c, map)| map.as_ref().map_or(c, |m| m[c]))
                .collect();
            mesh.rank(&relabelled)
        };
        let mut ranks = ranks;
        ranks.sort_by_key(|&r| canonical(r));
        let mut position = vec![NOT_HELD; nranks];
        for (k, &r) in ranks.iter().enumerate() {
            position[r] = k;
        }
        Some(Holders {
            ranks,
            position,
            relabel,
        })
    }

    /// A rank's mesh coordinates, relabelled.
    fn coords(&self, mesh: &shardproof_ir::Mesh, r: usize) -> Vec<usize> {
        mesh.coords(r)
            .iter()
            .zip(&self.relabel)
            .map(|(&c, map)| map.as_ref().map_or(c, |m| m[c]))
            .collect()
    }

    /// A rank as the key writes it: its position among the holders, or `!` and its number.
    fn name(&self, r: usize) -> String {
        match self.position.get(r) {
            Some(&k) if k != NOT_HELD => k.to_string(),
            _ => format!("!{r}"),
        }
    }

    /// A relation's holders renumbered, in position order (a rank's own values, a pipeline
    /// rank's microbatches, keep their order).
    /// `node` writes a rank's node (its number, or its place in the rank's canonical order).
    fn rank_values(&self, values: &[(usize, shardproof_ir::ValueId)], node: &NodeName) -> String {
        let mut sorted = values.to_vec();
        sorted.sort_by_key(|&(r, _)| self.position.get(r).copied().unwrap_or(NOT_HELD));
        let mut out = String::from("[");
        for &(r, v) in &sorted {
            let _ = write!(out, "({},{}.{})", self.name(r), node(r, v.node), v.output);
        }
        out.push(']');
        out
    }

    /// Per-rank values (every rank's, or none) in position order, nodes written by `node`.
    fn impl_values(&self, values: &[shardproof_ir::ValueId], node: &NodeName) -> String {
        let permuted: Vec<(usize, usize)> = self
            .ranks
            .iter()
            .filter_map(|&r| values.get(r).map(|v| (node(r, v.node), v.output)))
            .collect();
        format!("{permuted:?}")
    }

    /// A layout with its `at:` coordinates relabelled on the dims the key relabels.
    fn layout(&self, layout: &Layout) -> String {
        let Layout::Placed(l) = layout else {
            return format!("{layout:?}");
        };
        let mut out = format!("{:?} {:?} at", l.placements, l.blocks);
        for h in &l.at {
            let mut coords = h.coords.clone();
            if let Some(Some(map)) = self.relabel.get(h.dim) {
                coords = coords
                    .iter()
                    .map(|&c| map.get(c).copied().unwrap_or(c))
                    .collect();
                coords.sort_unstable();
            }
            let _ = write!(out, " {}:{:?}", h.dim, coords);
        }
        out
    }
}

/// How a key writes a rank's node: `(rank, node)` to its number or its canonical place.
type NodeName<'a> = dyn Fn(usize, usize) -> usize + 'a;

/// Writes one graph, in program order or in the given canonical order.
type GraphKey<'a> = dyn Fn(&mut String, &Graph, Option<&NodeOrder>) + 'a;

/// The stage's structure with its holders renumbered (see the module docs), written after
/// `out`'s mesh, ops and assumptions; `graph_key` writes one graph. `None` where the stage
/// names ranks otherwise, and the caller keys it by absolute rank numbers. Where the stage's
/// schedule allows it ([`canon::pairing`]), the graphs are written in canonical node order
/// with the messages; otherwise in program order.
pub(super) fn renumbered(
    case: &Case,
    graph_key: impl Fn(&mut String, &Graph, Option<&NodeOrder>),
) -> Option<String> {
    let holders = Holders::of(case)?;
    let orders = canon::Orders::of(case);
    let messages = canon::pairing(case, &orders, &|r| {
        holders.position.get(r).copied().unwrap_or(NOT_HELD)
    });
    Some(match messages {
        Some(messages) => write_key(case, &holders, Some((&orders, messages)), &graph_key),
        None => write_key(case, &holders, None, &graph_key),
    })
}

/// [`renumbered`]'s text: in canonical node order with the messages where `canonical` gives
/// them, in program order otherwise.
fn write_key(
    case: &Case,
    holders: &Holders,
    canonical: Option<(&canon::Orders, String)>,
    graph_key: &GraphKey,
) -> String {
    let program = &case.program;
    let orders = canonical.as_ref().map(|(o, _)| *o);
    let node = |r: usize, n: usize| orders.map_or(n, |o| o.place(r, n));
    let mut out = String::new();
    if canonical.is_some() {
        out.push_str("canonical node order\n");
    }
    let _ = writeln!(
        out,
        "renumbered: {} holders of {}, relabelled dims {:?}",
        holders.ranks.len(),
        program.ranks.len(),
        holders
            .relabel
            .iter()
            .map(Option::is_some)
            .collect::<Vec<_>>()
    );
    // Graphs by what the key writes of them: holders whose stage graphs are equal up to names
    // run the same computation whether or not they share one graph object.
    let mut by_pointer: HashMap<*const Graph, usize> = HashMap::new();
    let mut texts: HashMap<String, usize> = HashMap::new();
    let mut named: Vec<&str> = Vec::new();
    let mut bodies = String::new();
    for (k, &r) in holders.ranks.iter().enumerate() {
        let g = &program.ranks[r];
        let id = match by_pointer.get(&Arc::as_ptr(g)) {
            Some(&id) => id,
            None => {
                strings_of(g, orders.is_some(), &mut named);
                let mut text = String::new();
                graph_key(&mut text, g, orders.and_then(|o| o.of_graph(g)));
                let id = match texts.get(&text) {
                    Some(&id) => id,
                    None => {
                        let id = texts.len();
                        let _ = writeln!(bodies, "graph {id}");
                        bodies.push_str(&text);
                        texts.insert(text, id);
                        id
                    }
                };
                by_pointer.insert(Arc::as_ptr(g), id);
                id
            }
        };
        let _ = writeln!(
            out,
            "holder {k} at {:?} = graph {id}",
            holders.coords(&program.mesh, r)
        );
    }
    // The groups the holders' calls name (a string argument equal to a group's name: a string
    // that only happens to equal one adds a group to the key, never removes one).
    for group in program
        .groups
        .iter()
        .filter(|g| named.contains(&g.name.as_str()))
    {
        let index = group.index(program.ranks.len());
        let mut sets: HashSet<*const usize> = HashSet::new();
        let _ = write!(out, "group {:?}:", group.name);
        for &r in &holders.ranks {
            let Some(set) = index.group_of(r) else {
                continue;
            };
            if !sets.insert(set.as_ptr()) {
                continue;
            }
            let members: Vec<String> = set.iter().map(|&m| holders.name(m)).collect();
            let _ = write!(out, " [{}]", members.join(","));
        }
        out.push('\n');
    }
    out.push_str("spec\n");
    graph_key(&mut out, &case.spec, None);
    out.push_str(&bodies);
    for rel in &case.inputs {
        let _ = writeln!(
            out,
            "input {:?} {} {} {}",
            rel.spec_value,
            holders.layout(&rel.layout),
            holders.rank_values(&rel.rank_values, &node),
            holders.impl_values(&rel.impl_values, &node)
        );
    }
    for o in &case.outputs {
        let _ = writeln!(
            out,
            "output {:?} {} {} {}",
            o.spec_value,
            holders.layout(&o.layout),
            holders.rank_values(&o.rank_values, &node),
            holders.impl_values(&o.impl_values, &node)
        );
    }
    if let Some((_, messages)) = canonical {
        out.push_str(&messages);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_ir::ValueId;

    const TWO_STAGE_SPEC: &str = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[3, 2]\"):\n        s: \"f32[]\" = torch.ops.aten.sum.default(x)\n        return (s,)\n";

    /// A two-rank pipeline: rank 0 sends `x`'s double to rank 1 (`send` written as `send`,
    /// which names the peer), rank 1 sums it; `groups` is the case's `groups:` block.
    fn pipeline(send: &str, groups: &str) -> (tempfile::TempDir, Case) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let first = format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[3, 2]\"):\n        sent: \"f32[3, 2]\" = torch.ops.shardproof_p2p.send.default({send})\n        return (sent,)\n");
        let second = "class GraphModule(torch.nn.Module):\n    def forward(self):\n        v: \"f32[3, 2]\" = torch.ops.shardproof_p2p.recv.default([3, 2], torch.float32, 0, 0, 'pp')\n        s: \"f32[]\" = torch.ops.aten.sum.default(v)\n        return (s,)\n";
        std::fs::write(d.join("spec.py"), TWO_STAGE_SPEC).unwrap();
        std::fs::write(d.join("s0.py"), first).unwrap();
        std::fs::write(d.join("s1.py"), second).unwrap();
        let case = format!("version: 1\nname: two-stages\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2 }}\n  graphs: [s0.py, s1.py]\n{groups}inputs:\n  x: {{ placement: Replicate(), at: {{ pp: 0 }} }}\n");
        std::fs::write(d.join("case.yaml"), case).unwrap();
        let case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
        (dir, case)
    }

    const PP_GROUP: &str = "  groups:\n    \"pp\": pp\n";

    /// A send to a global rank (no `group`) names the rank by number: no renumbering.
    #[test]
    fn a_send_to_a_global_rank_keeps_absolute_numbers() {
        let (_d, grouped) = pipeline("x, 1, 0, 'pp'", PP_GROUP);
        assert!(Holders::of(&grouped).is_some());
        let (_d, global) = pipeline("x, 1, 0", PP_GROUP);
        assert!(Holders::of(&global).is_none());
    }

    /// On a one-dim mesh a group the case does not declare is every rank: with a rank that
    /// holds nothing, a call naming one keeps absolute numbers; declared, the group is keyed.
    #[test]
    fn an_undeclared_group_on_a_one_dim_mesh_keeps_absolute_numbers() {
        for (groups, renumbered) in [(PP_GROUP, true), ("", false)] {
            let (_d, mut case) = pipeline("x, 1, 0, 'pp'", groups);
            case.program.ranks[1] = Arc::new(Graph::new("empty"));
            assert_eq!(Holders::of(&case).is_some(), renumbered, "{groups:?}");
        }
    }

    /// A mesh { pp: 2, tp: 2 } whose pipeline stage `stage` alone holds anything (as a stage of
    /// that pipeline stage slices the others), `x` laid out as `layout` (YAML).
    fn one_stage(stage: usize, layout: &str) -> (tempfile::TempDir, Case) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[3, 1]\"):\n        s: \"f32[]\" = torch.ops.aten.sum.default(x)\n        return (s,)\n";
        std::fs::write(d.join("spec.py"), TWO_STAGE_SPEC).unwrap();
        std::fs::write(d.join("r.py"), rank).unwrap();
        let case = format!("version: 1\nname: one-holder\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2, tp: 2 }}\n  graphs: [r.py, r.py, r.py, r.py]\ninputs:\n  x: {layout}\n");
        std::fs::write(d.join("case.yaml"), case).unwrap();
        let mut case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
        let held = |r: usize| r / 2 == stage;
        for r in (0..4).filter(|&r| !held(r)) {
            case.program.ranks[r] = Arc::new(Graph::new("empty"));
        }
        case.inputs[0].rank_values.retain(|&(r, _)| held(r));
        // A stage's per-rank values are empty where some rank lacks the value.
        case.inputs[0].impl_values.clear();
        (dir, case)
    }

    /// Pipeline stage 0's ranks alone hold anything.
    fn rank_zero_only(layout: &str) -> (tempfile::TempDir, Case) {
        one_stage(0, layout)
    }

    /// A dim is relabelled only where every relation places it `Replicate()`: a holder's piece
    /// of a tensor sharded along it depends on its coordinate there.
    #[test]
    fn a_dim_a_relation_shards_is_not_relabelled() {
        let (_d, mut case) = rank_zero_only("{ placement: { tp: Shard(1) }, at: { pp: 0 } }");
        let holders = Holders::of(&case).unwrap();
        assert_eq!(holders.ranks, vec![0, 1]);
        assert_eq!(holders.relabel, vec![Some(vec![0, 1]), None]);
        let Layout::Placed(l) = &mut case.inputs[0].layout else {
            panic!("placed")
        };
        l.placements[0] = Placement::Shard(1);
        assert_eq!(Holders::of(&case).unwrap().relabel, vec![None, None]);
    }

    /// The same stage on pipeline stage 0 and on 1 has one key (pp relabelled); an `at:` that
    /// names other coordinates is another key.
    #[test]
    fn an_at_is_written_relabelled() {
        let key = |stage: usize, at: &str| {
            let (_d, case) = one_stage(
                stage,
                &format!("{{ placement: {{ tp: Shard(1) }}, at: {{ pp: {at} }} }}"),
            );
            super::super::structure(&case)
        };
        let (first, second) = (key(0, "0"), key(1, "1"));
        assert!(first.contains("renumbered"), "{first}");
        assert_eq!(first, second);
        assert_ne!(second, key(1, "[0, 1]"));
    }

    /// `impl_values` count every rank: on a stage some rank does not hold they would be read
    /// by position, so the key keeps absolute numbers.
    #[test]
    fn per_rank_impl_values_on_a_partly_held_stage_keep_absolute_numbers() {
        let (_d, mut case) = rank_zero_only("{ placement: { tp: Shard(1) }, at: { pp: 0 } }");
        assert!(Holders::of(&case).is_some());
        case.inputs[0].impl_values = vec![ValueId::new(0, 0); 4];
        assert!(Holders::of(&case).is_none());
    }
}
