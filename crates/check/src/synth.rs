//! Fix hints by synthesis (the seed's beam-search synthesis): for postcondition, legality,
//! SPMD-type and placement findings, search for the smallest set of edits (insert an
//! all-reduce, all-gather or reduce-scatter after a value, on every rank that computes it; or
//! drop a collective that has nothing to do) after which the program checks with no finding,
//! and print it as the hints.
//!
//! The search is a beam search over edit sets: a state's candidates are the edits at the
//! nodes its findings name (the node and the producers of its inputs), pruned by the inferred
//! placements (an all-reduce where the value is partial over the group, an all-gather where
//! it is sharded on dim 0, a reduce-scatter of a partial); each candidate program is checked
//! in full, states are ranked by their number of findings, and the first state with none is
//! the fix. Programs above [`MAX_NODES`] rank nodes are not searched (the hints stay the
//! rules' own), and the search stops after [`MAX_EVALUATIONS`] candidates or once its checks
//! have covered [`MAX_CHECKED_NODES`] rank nodes, whichever comes first: a check's cost grows
//! with the program, so a big program gets fewer checks than a small one.
//!
//! Two edit sequences often build the same program (dropping `a` then `b`, or `b` then `a`);
//! the search checks such a program once and reuses its report (see [`Checked`]).

use crate::place::Place;
use crate::report::{Check, Report};
use shardproof_case::Case;
use shardproof_ir::{Arg, Graph, Node, NodeKind, OpName, Output, ValueId};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;

/// Programs with more rank nodes than this are not searched.
pub const MAX_NODES: usize = 4000;
/// Candidate programs considered at most per search (a candidate whose program an earlier one
/// built counts too, though it is not checked again).
pub const MAX_EVALUATIONS: usize = 200;
/// Rank nodes checked at most per search, summed over the candidate programs checked: the
/// [`MAX_EVALUATIONS`] checks of a program of 1,000 nodes. A program of 3,000 nodes gets 66.
pub const MAX_CHECKED_NODES: usize = 200_000;
const BEAM: usize = 4;
const DEPTH: usize = 3;

/// The collective an edit inserts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Collective {
    /// `all_reduce(x, red, group)`.
    AllReduce(String),
    /// `all_gather_into_tensor(x, n, group)` (along dim 0).
    AllGather,
    /// `reduce_scatter_tensor(x, red, n, group)` (along dim 0).
    ReduceScatter(String),
}

/// One edit of a program.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Edit {
    /// Insert a collective (and its wait) after node `after`, on every rank that has it; the
    /// later readers of its value read the collective's result.
    Insert {
        /// The node (by name) whose first output is communicated.
        after: String,
        /// The collective.
        collective: Collective,
        /// The process group.
        group: String,
    },
    /// Replace the collective node `node` by a copy of its input.
    Drop {
        /// The collective node's name.
        node: String,
    },
}

impl Edit {
    /// The edit as a hint (`insert all_reduce(sum) over tp after `mm_3``).
    pub fn describe(&self) -> String {
        match self {
            Edit::Insert {
                after,
                collective,
                group,
            } => {
                let c = match collective {
                    Collective::AllReduce(r) => format!("all_reduce({r})"),
                    Collective::AllGather => "all_gather".to_string(),
                    Collective::ReduceScatter(r) => format!("reduce_scatter({r})"),
                };
                format!("insert {c} over {group} after `{after}`")
            }
            Edit::Drop { node } => format!("drop the collective `{node}` (pass its input on)"),
        }
    }
}

/// A found fix: its edits, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fix {
    /// The edits.
    pub edits: Vec<Edit>,
}

impl Fix {
    /// The fix as one hint line, each edit located in `case` (the graph file and line of the
    /// node it names, and the captured source line where the graph records one).
    pub fn describe(&self, case: &Case) -> String {
        let parts: Vec<String> = self
            .edits
            .iter()
            .map(|e| {
                let node = match e {
                    Edit::Insert { after, .. } => after,
                    Edit::Drop { node } => node,
                };
                let at = case.program.ranks.iter().find_map(|g| {
                    let n = g.nodes.iter().find(|n| &n.name == node)?;
                    let file = g
                        .path
                        .as_ref()
                        .map_or_else(|| g.name.clone(), |p| p.display().to_string());
                    let mut s = match n.line {
                        Some(l) => format!("{file}:{l}"),
                        None => file,
                    };
                    if let Some(loc) = &n.loc {
                        s.push_str(&format!(", {}:{}", loc.file, loc.line));
                    }
                    Some(s)
                });
                match at {
                    Some(at) => format!("{} ({at})", e.describe()),
                    None => e.describe(),
                }
            })
            .collect();
        parts.join("; ")
    }
}

/// The checks whose findings synthesis tries to fix.
fn targeted(c: Check) -> bool {
    matches!(
        c,
        Check::Postcondition | Check::CommLegality | Check::SpmdType | Check::PlacementConsistency
    )
}

fn collective_node(name: String, op: &str, args: Vec<Arg>, line: Option<usize>) -> Node {
    Node {
        name: name.clone(),
        kind: NodeKind::Call {
            op: OpName::parse(op).unwrap_or_else(|| OpName::new("aten", "clone", "default")),
            args,
            kwargs: Vec::new(),
        },
        outputs: vec![Output { name, ty: None }],
        loc: None,
        line,
    }
}

fn remap_arg(a: &mut Arg, f: &dyn Fn(ValueId) -> ValueId) {
    match a {
        Arg::Value(v) => *v = f(*v),
        Arg::List(items) => items.iter_mut().for_each(|x| remap_arg(x, f)),
        _ => {}
    }
}

/// Applies `edit` to `case` (every rank graph that has the node).
pub fn apply(case: &Case, edit: &Edit) -> Case {
    let mut out = case.clone();
    for r in 0..out.program.ranks.len() {
        let g = &out.program.ranks[r];
        match edit {
            Edit::Drop { node } => {
                let Some(i) = g.nodes.iter().position(|n| &n.name == node) else {
                    continue;
                };
                let Some(&input) = g.nodes[i].inputs().first() else {
                    continue;
                };
                let g = Arc::make_mut(&mut out.program.ranks[r]);
                g.nodes[i].kind = NodeKind::Call {
                    op: OpName::new("aten", "clone", "default"),
                    args: vec![Arg::Value(input)],
                    kwargs: Vec::new(),
                };
            }
            Edit::Insert {
                after,
                collective,
                group,
            } => {
                let Some(at) = g.nodes.iter().position(|n| &n.name == after) else {
                    continue;
                };
                let size = out
                    .program
                    .group(group)
                    .and_then(|pg| pg.group_of(r))
                    .map_or(1, <[usize]>::len) as i64;
                let x = ValueId::new(at, 0);
                let line = g.nodes[at].line;
                let base = format!("{after}_fix");
                let (op, args) = match collective {
                    Collective::AllReduce(red) => (
                        "_c10d_functional.all_reduce.default",
                        vec![
                            Arg::Value(x),
                            Arg::Str(red.clone()),
                            Arg::Str(group.clone()),
                        ],
                    ),
                    Collective::AllGather => (
                        "_c10d_functional.all_gather_into_tensor.default",
                        vec![Arg::Value(x), Arg::Int(size), Arg::Str(group.clone())],
                    ),
                    Collective::ReduceScatter(red) => (
                        "_c10d_functional.reduce_scatter_tensor.default",
                        vec![
                            Arg::Value(x),
                            Arg::Str(red.clone()),
                            Arg::Int(size),
                            Arg::Str(group.clone()),
                        ],
                    ),
                };
                let started = collective_node(format!("{base}_async"), op, args, line);
                let waited = collective_node(
                    base,
                    "_c10d_functional.wait_tensor.default",
                    vec![Arg::Value(ValueId::new(at + 1, 0))],
                    line,
                );
                let replacement = ValueId::new(at + 2, 0);
                let shift = |v: ValueId| {
                    if v.node > at {
                        ValueId::new(v.node + 2, v.output)
                    } else {
                        v
                    }
                };
                let rewire = |v: ValueId| if v == x { replacement } else { shift(v) };
                let mut ng = Graph {
                    name: g.name.clone(),
                    path: g.path.clone(),
                    nodes: Vec::with_capacity(g.nodes.len() + 2),
                    inputs: g.inputs.iter().map(|&v| shift(v)).collect(),
                    outputs: g.outputs.iter().map(|o| o.map(rewire)).collect(),
                };
                ng.nodes.extend(g.nodes[..=at].iter().cloned());
                ng.nodes.push(started);
                ng.nodes.push(waited);
                for n in &g.nodes[at + 1..] {
                    let mut n = n.clone();
                    if let NodeKind::Call { args, kwargs, .. } = &mut n.kind {
                        args.iter_mut().for_each(|a| remap_arg(a, &rewire));
                        kwargs.iter_mut().for_each(|(_, a)| remap_arg(a, &rewire));
                    }
                    ng.nodes.push(n);
                }
                out.program.ranks[r] = Arc::new(ng);
                for rel in &mut out.inputs {
                    for rv in &mut rel.rank_values {
                        if rv.0 == r {
                            rv.1 = shift(rv.1);
                        }
                    }
                    for (k, v) in rel.impl_values.iter_mut().enumerate() {
                        if k == r {
                            *v = shift(*v);
                        }
                    }
                }
                for exp in &mut out.outputs {
                    for rv in &mut exp.rank_values {
                        if rv.0 == r {
                            rv.1 = rewire(rv.1);
                        }
                    }
                    for (k, v) in exp.impl_values.iter_mut().enumerate() {
                        if k == r {
                            *v = rewire(*v);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The candidate edits for the targeted findings of `report` on `case`.
fn candidates(case: &Case, report: &Report) -> Vec<Edit> {
    let Ok(prop) = crate::propagate(case) else {
        return Vec::new();
    };
    let program = &case.program;
    let nd = program.mesh.dims.len();
    let mut out: Vec<Edit> = Vec::new();
    for f in report.findings.iter().filter(|f| targeted(f.check)) {
        let r = f.ranks[0];
        let g = &program.ranks[r];
        let Some(i) = g.nodes.iter().position(|n| n.name == f.node) else {
            continue;
        };
        if f.check == Check::CommLegality {
            out.push(Edit::Drop {
                node: f.node.clone(),
            });
        }
        let mut positions = vec![i];
        positions.extend(g.nodes[i].inputs().iter().map(|v| v.node));
        for p in positions {
            let v = ValueId::new(p, 0);
            if g.nodes[p].outputs.is_empty() {
                continue;
            }
            let places = prop.ranks[r].of(v, nd).to_vec();
            let mut groups: Vec<(&String, &Option<Vec<usize>>)> = prop.groups.iter().collect();
            groups.sort();
            for (name, dims) in groups {
                let Some(dims) = dims else { continue };
                let on: Vec<Place> = dims.iter().map(|&m| places[m]).collect();
                let after = g.nodes[p].name.clone();
                let mut add = |collective| {
                    out.push(Edit::Insert {
                        after: after.clone(),
                        collective,
                        group: name.clone(),
                    })
                };
                if let Some(Place::Partial(red)) = on.iter().find(|p| p.is_partial()) {
                    add(Collective::AllReduce(red.name().to_string()));
                    add(Collective::ReduceScatter(red.name().to_string()));
                }
                if on.contains(&Place::Shard(0)) {
                    add(Collective::AllGather);
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The reports of the candidate programs a search has checked, keyed by a hash of the program
/// and kept with the edits that built it: a hash match is confirmed by rebuilding that program
/// from the original and comparing it whole, so a reused report is always the program's own.
struct Checked<'a> {
    original: &'a Case,
    by_hash: HashMap<u64, Vec<CheckedProgram>>,
}

/// A checked candidate: the edits that built it from the original, and the check's answer
/// (`None` for an invalid program).
type CheckedProgram = (Vec<Edit>, Option<Report>);

/// Feeds formatted text to a hasher without building the string.
struct HashWriter(DefaultHasher);

impl std::fmt::Write for HashWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// A hash of what [`apply`] changes in a case: the rank graphs (the case's input and output
/// values follow them; [`Checked::get`] compares the whole case anyway).
fn program_hash(case: &Case) -> u64 {
    use std::fmt::Write;
    let mut w = HashWriter(DefaultHasher::new());
    for g in &case.program.ranks {
        // Writing to a hasher cannot fail.
        let _ = write!(w, "{:?}", g.nodes);
        let _ = write!(w, "{:?}{:?}", g.inputs, g.outputs);
    }
    w.0.finish()
}

impl<'a> Checked<'a> {
    fn new(original: &'a Case) -> Self {
        Checked {
            original,
            by_hash: HashMap::new(),
        }
    }

    /// The report of `case` (filed under `hash`) if an earlier candidate built the same
    /// program: `Some(report)` (the check's answer, itself `None` for an invalid
    /// program) or `None` when it is new.
    fn get(&self, hash: u64, case: &Case) -> Option<Option<Report>> {
        self.by_hash.get(&hash)?.iter().find_map(|(edits, report)| {
            let built = edits
                .iter()
                .fold(self.original.clone(), |c, e| apply(&c, e));
            (&built == case).then(|| report.clone())
        })
    }

    fn insert(&mut self, hash: u64, edits: Vec<Edit>, report: Option<Report>) {
        self.by_hash.entry(hash).or_default().push((edits, report));
    }
}

/// The nodes of all of `case`'s rank graphs: what a check's cost grows with.
fn rank_nodes(case: &Case) -> usize {
    case.program.ranks.iter().map(|g| g.nodes.len()).sum()
}

/// Searches a fix for the targeted findings of `report` (the report of `case`); `None` when
/// there are none, the program is too big, or no edit set within the search's bounds makes
/// the program check with no finding.
pub fn synthesize(
    case: &Case,
    report: &Report,
    check: &dyn Fn(&Case) -> Option<Report>,
) -> Option<Fix> {
    search(case, report, check, MAX_CHECKED_NODES)
}

/// [`synthesize`] with at most `max_checked_nodes` rank nodes checked.
fn search(
    case: &Case,
    report: &Report,
    check: &dyn Fn(&Case) -> Option<Report>,
    max_checked_nodes: usize,
) -> Option<Fix> {
    if !report.findings.iter().any(|f| targeted(f.check)) {
        return None;
    }
    let nodes = rank_nodes(case);
    if nodes > MAX_NODES {
        return None;
    }
    let mut evaluations = 0;
    let mut checked_nodes = 0;
    let mut checked = Checked::new(case);
    let mut beam: Vec<(Vec<Edit>, Case, Report)> = vec![(Vec::new(), case.clone(), report.clone())];
    for _ in 0..DEPTH {
        let mut next: Vec<(usize, Vec<Edit>, Case, Report)> = Vec::new();
        for (edits, c, rep) in &beam {
            // No candidate is smaller than the original program, so once one more check of it
            // would pass a bound, no new program can be checked: what remains are programs
            // checked already, none of them a fix. Stopping here skips their candidates'
            // propagations.
            if evaluations >= MAX_EVALUATIONS || checked_nodes + nodes > max_checked_nodes {
                return None;
            }
            for edit in candidates(c, rep) {
                if edits.contains(&edit) || evaluations >= MAX_EVALUATIONS {
                    continue;
                }
                let changed = apply(c, &edit);
                let mut e = edits.clone();
                e.push(edit);
                let hash = program_hash(&changed);
                let new_report = match checked.get(hash, &changed) {
                    Some(seen) => seen,
                    None => {
                        let size = rank_nodes(&changed);
                        if checked_nodes + size > max_checked_nodes {
                            continue;
                        }
                        checked_nodes += size;
                        let fresh = check(&changed);
                        checked.insert(hash, e.clone(), fresh.clone());
                        fresh
                    }
                };
                evaluations += 1;
                let Some(new_report) = new_report else {
                    continue;
                };
                if new_report.findings.is_empty() {
                    tracing::debug!(evaluations, checked_nodes, "fix synthesized");
                    return Some(Fix { edits: e });
                }
                next.push((new_report.findings.len(), e, changed, new_report));
            }
        }
        next.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        next.truncate(BEAM);
        if next.is_empty() {
            return None;
        }
        beam = next.into_iter().map(|(_, e, c, r)| (e, c, r)).collect();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_case_without_fixes, plan::parse_plan};
    use std::cell::RefCell;
    use std::path::Path;

    const SPMD_DEMO: &str = include_str!("../../../examples/plans/spmd_demo.plan");

    fn spmd_demo() -> (Case, Report) {
        let case = parse_plan(Path::new("spmd_demo.plan"), SPMD_DEMO).unwrap();
        let report = check_case_without_fixes(&case).unwrap();
        (case, report)
    }

    fn insert_after(node: &str) -> Edit {
        Edit::Insert {
            after: node.to_string(),
            collective: Collective::AllReduce("sum".to_string()),
            group: "tp".to_string(),
        }
    }

    /// A stored report answers only for the very program it was checked on: two edit orders
    /// that build one program share it; another program under the same hash does not get it.
    #[test]
    fn a_reused_report_is_the_programs_own() {
        let (case, report) = spmd_demo();
        let (a, b) = (insert_after("pp"), insert_after("act"));
        let ab = apply(&apply(&case, &a), &b);
        let ba = apply(&apply(&case, &b), &a);
        assert_eq!(ab, ba, "inserts after two nodes commute");
        assert_eq!(program_hash(&ab), program_hash(&ba));
        let mut checked = Checked::new(&case);
        let hash = program_hash(&ab);
        checked.insert(hash, vec![a.clone(), b.clone()], Some(report.clone()));
        let render = |got: Option<Option<Report>>| got.map(|r| r.map(|r| r.render()));
        assert_eq!(render(checked.get(hash, &ba)), Some(Some(report.render())));
        // Another program filed under the same hash (a collision) is not answered.
        let other = apply(&case, &a);
        assert_ne!(other, ab);
        assert!(checked.get(hash, &other).is_none());
        assert!(checked.get(hash.wrapping_add(1), &ab).is_none());
    }

    /// The search checks no program twice, and finds the fix it found when it checked every
    /// candidate (the three edits `plans.rs` applies).
    #[test]
    fn a_search_checks_each_program_once() {
        let (case, report) = spmd_demo();
        let seen: RefCell<Vec<Case>> = RefCell::new(Vec::new());
        let repeats = RefCell::new(0);
        let recording = |c: &Case| {
            if seen.borrow().contains(c) {
                *repeats.borrow_mut() += 1;
            }
            seen.borrow_mut().push(c.clone());
            check_case_without_fixes(c).ok()
        };
        let fix = synthesize(&case, &report, &recording).expect("spmd_demo has a fix");
        assert_eq!(fix.edits.len(), 3, "{}", fix.describe(&case));
        assert_eq!(*repeats.borrow(), 0);
        let fixed = fix.edits.iter().fold(case, |c, e| apply(&c, e));
        assert!(check_case_without_fixes(&fixed)
            .unwrap()
            .findings
            .is_empty());
    }

    /// The rank nodes a search checks stay within its bound: a bound below one candidate
    /// checks nothing (and finds nothing), a bound of a few candidates checks no more.
    #[test]
    fn a_search_checks_within_its_node_bound() {
        let (case, report) = spmd_demo();
        for candidates in [0, 1, 3] {
            let bound = candidates * (rank_nodes(&case) + 2);
            let checked_nodes = RefCell::new(0);
            let counting = |c: &Case| {
                *checked_nodes.borrow_mut() += rank_nodes(c);
                check_case_without_fixes(c).ok()
            };
            let fix = search(&case, &report, &counting, bound);
            assert!(*checked_nodes.borrow() <= bound, "{candidates}");
            if candidates == 0 {
                assert_eq!(*checked_nodes.borrow(), 0);
                assert_eq!(fix, None);
            }
        }
    }
}
