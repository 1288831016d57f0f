//! A stage's structure up to a renumbering of the ranks that hold it (the memo key's rank part).
//!
//! On a pipeline plan every pipeline stage's layers run on other ranks: keyed by absolute rank
//! numbers, the same layer on stage 3's ranks and on stage 7's is two proofs. A stage's theorem
//! reads the ranks only through what this key writes, with ranks numbered by their position
//! among the holders (see the module docs of [`super`], "Memo up to renumbering the holding
//! ranks", and docs/prove/stages.md for the argument):
//!
//! - the holders (ranks with a node of the stage, or a value of one of its relations), and
//!   their mesh coordinates on every dim that is not *free*; a free dim is one on which the
//!   holders share one coordinate and which every relation of the stage places `Replicate()`;
//! - each holder's graph (graphs are written once, holders name them by first appearance);
//! - every declared process group's member sets that hold a holder, members written as their
//!   holder position (a non-holder by its absolute rank, which only makes keys differ);
//! - every relation, its holders renumbered, its `at:` on a free dim written as "the holders'
//!   coordinate" when it names exactly that one.
//!
//! Where the stage names ranks in another way, the key keeps absolute rank numbers
//! ([`renumbered`] answers `None`): a point-to-point call without `group` (its peer is a global
//! rank), an `expr:` layout (it names rank tensors), per-rank `impl_values` on a stage that
//! some rank does not hold, a rank count that is not the mesh's, and a one-dim (or no-dim)
//! mesh where a string argument could name an undeclared group (such a group is every rank).

use shardproof_case::{Case, Layout, Placement};
use shardproof_ir::{Arg, Graph, NodeKind};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;

/// Marks a rank that holds nothing of the stage in [`Holders::position`].
const NOT_HELD: usize = usize::MAX;

/// The ranks holding a stage, numbered by position, and the mesh dims the key leaves out.
struct Holders {
    /// Holding ranks, ascending.
    ranks: Vec<usize>,
    /// Per rank: its position among the holders, or [`NOT_HELD`].
    position: Vec<usize>,
    /// Per mesh dim: whether it is free (the holders share one coordinate on it and every
    /// relation places it `Replicate()`), with that coordinate.
    free: Vec<Option<usize>>,
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

/// Every string argument of `g`'s calls, lists included, added to `out` once.
fn strings_of<'g>(g: &'g Graph, out: &mut Vec<&'g str>) {
    fn walk<'g>(a: &'g Arg, out: &mut Vec<&'g str>) {
        match a {
            Arg::Str(s) if !out.contains(&s.as_str()) => out.push(s),
            Arg::List(items) => items.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    for n in &g.nodes {
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
        if !every && relations.clone().any(|(_, _, iv)| !iv.is_empty()) {
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
        let mut position = vec![NOT_HELD; nranks];
        for (k, &r) in ranks.iter().enumerate() {
            position[r] = k;
        }
        let coords: Vec<Vec<usize>> = ranks.iter().map(|&r| program.mesh.coords(r)).collect();
        let free = (0..program.mesh.dims.len())
            .map(|d| {
                let c = coords.first().map_or(0, |c| c[d]);
                let shared = coords.iter().all(|x| x[d] == c);
                let replicated = placed
                    .iter()
                    .all(|l| matches!(l.placements.get(d), Some(Placement::Replicate)));
                (shared && replicated).then_some(c)
            })
            .collect();
        Some(Holders {
            ranks,
            position,
            free,
        })
    }

    /// A rank as the key writes it: its position among the holders, or `!` and its number.
    fn name(&self, r: usize) -> String {
        match self.position.get(r) {
            Some(&k) if k != NOT_HELD => k.to_string(),
            _ => format!("!{r}"),
        }
    }

    /// A relation's holders renumbered.
    fn rank_values(&self, values: &[(usize, shardproof_ir::ValueId)]) -> String {
        let mut out = String::from("[");
        for &(r, v) in values {
            let _ = write!(out, "({},{}.{})", self.name(r), v.node, v.output);
        }
        out.push(']');
        out
    }

    /// A layout with its `at:` on free dims written as the holders' coordinate when it names
    /// exactly that one.
    fn layout(&self, layout: &Layout) -> String {
        let Layout::Placed(l) = layout else {
            return format!("{layout:?}");
        };
        let mut out = format!("{:?} {:?} at", l.placements, l.blocks);
        for h in &l.at {
            match self.free.get(h.dim).copied().flatten() {
                Some(c) if h.coords == [c] => {
                    let _ = write!(out, " {}:held", h.dim);
                }
                _ => {
                    let _ = write!(out, " {}:{:?}", h.dim, h.coords);
                }
            }
        }
        out
    }
}

/// The stage's structure with its holders renumbered (see the module docs), written after
/// `out`'s mesh, ops and assumptions; `graph_key` writes one graph. `None` where the stage
/// names ranks otherwise, and the caller keys it by absolute rank numbers.
pub(super) fn renumbered(
    case: &Case,
    graph_key: impl Fn(&mut String, &Graph),
) -> Option<String> {
    let holders = Holders::of(case)?;
    let program = &case.program;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "renumbered: {} holders of {}, free dims {:?}",
        holders.ranks.len(),
        program.ranks.len(),
        holders.free.iter().map(Option::is_some).collect::<Vec<_>>()
    );
    let mut graphs: Vec<*const Graph> = Vec::new();
    let mut named: Vec<&str> = Vec::new();
    let mut bodies = String::new();
    for (k, &r) in holders.ranks.iter().enumerate() {
        let g = &program.ranks[r];
        let id = match graphs.iter().position(|p| *p == Arc::as_ptr(g)) {
            Some(id) => id,
            None => {
                graphs.push(Arc::as_ptr(g));
                strings_of(g, &mut named);
                let _ = writeln!(bodies, "graph {}", graphs.len() - 1);
                graph_key(&mut bodies, g);
                graphs.len() - 1
            }
        };
        let coords = program.mesh.coords(r);
        let kept: Vec<usize> = (0..coords.len())
            .filter(|&d| holders.free[d].is_none())
            .map(|d| coords[d])
            .collect();
        let _ = writeln!(out, "holder {k} at {kept:?} = graph {id}");
    }
    // The groups the holders' calls name (a string argument equal to a group's name: a string
    // that only happens to equal one adds a group to the key, never removes one).
    for group in program.groups.iter().filter(|g| named.contains(&g.name.as_str())) {
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
    graph_key(&mut out, &case.spec);
    out.push_str(&bodies);
    for rel in &case.inputs {
        let _ = writeln!(
            out,
            "input {:?} {} {} {:?}",
            rel.spec_value,
            holders.layout(&rel.layout),
            holders.rank_values(&rel.rank_values),
            rel.impl_values
        );
    }
    for o in &case.outputs {
        let _ = writeln!(
            out,
            "output {:?} {} {} {:?}",
            o.spec_value,
            holders.layout(&o.layout),
            holders.rank_values(&o.rank_values),
            o.impl_values
        );
    }
    Some(out)
}
