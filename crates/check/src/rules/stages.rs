//! Pipeline stages' shares of one spec sum (issue 44): an all-reduce (sum) over the pipeline
//! mesh dim whose members each add their own terms, as DeepSeek's stages add their layers'
//! auxiliary losses, or gpt2's first and last stages their tied embedding's gradients.
//!
//! Each stage's tensor there is its own (`Varying` on `pp`), so the all-reduce proves nothing
//! by placements alone. [`stage_shares`] reads the graphs instead: every member's input is a
//! sum (nested `add`s) of atoms; each atom, less a division by a number (a microbatch mean's
//! `1/K`), is matched to the spec node of the same skeleton ([`Skeleton`]: operators and
//! parameters by name, the deepest depth at which any spec node matches, one spec node only
//! there) and the same type, and to the microbatch it reads (the one tag of its received
//! messages and start of its slices of graph inputs). It is a share where the matched spec
//! nodes are exactly the terms of one spec sum (nested `add`s), each computed by one stage
//! only, every stage computing each of its terms once per microbatch (K microbatches, the
//! same K everywhere, each once), all divided alike (by K, or not at all). The all-reduce's
//! input is then `Partial(sum)` on the pipeline dim: its result the spec's sum.

use shardproof_ir::{Arg, Graph, NodeKind, Program, ValueId};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// The all-reduces of stage shares ([`stage_shares`]), and what is read of the ranks' graphs
/// through them.
#[derive(Default)]
pub struct StageShares {
    /// The all-reduce calls (rank, node) whose input is the calling stage's share, each with
    /// the number of its collective (the members' calls of one all-reduce share it).
    pub calls: HashMap<(usize, usize), usize>,
    /// Per such call (rank, node), the all-reduces (sum) over other mesh dims that its
    /// reading went through (node, the mesh dims their group spans), each read as `n` times
    /// its input: sound only where that input is the same on every member, which the engine
    /// confirms from its placements ([`StageShares::through`]) before it takes the share.
    through: HashMap<(usize, usize), Vec<ReadThrough>>,
    /// Per rank asked: its nodes' expression hashes with the shares' results as leaves
    /// ([`share_hashes`]), and the first node of each hash.
    hashes: RefCell<HashMap<usize, Arc<ShareHashes>>>,
}

/// An all-reduce a stage share's reading went through: its node, and the mesh dims its group
/// spans ([`StageShares::through`]).
pub type ReadThrough = (usize, Vec<usize>);

/// A rank graph's [`share_hashes`] and the first node of each.
type ShareHashes = (Vec<u64>, HashMap<u64, u32>);

impl StageShares {
    /// Whether any all-reduce is a stage share.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The all-reduces (node, mesh dims of its group) that the reading of the stage share
    /// at call (rank, node) went through, each read as the sum of `n` equal copies of its
    /// input: the share holds only where every such input is proven `Replicate` on those
    /// dims, with a known factor.
    pub fn through(&self, call: &(usize, usize)) -> &[ReadThrough] {
        self.through.get(call).map_or(&[], Vec::as_slice)
    }

    /// The collective number of an all-reduce call (rank, node) of stage shares.
    pub fn get(&self, call: &(usize, usize)) -> Option<usize> {
        self.calls.get(call).copied()
    }

    fn hashes(&self, sh: &crate::engine::Shared, r: usize) -> Arc<ShareHashes> {
        if let Some(h) = self.hashes.borrow().get(&r) {
            return h.clone();
        }
        let hs = share_hashes(&sh.program.ranks[r], &sh.literals[r], |k| self.get(&(r, k)));
        let mut first = HashMap::with_capacity(hs.len());
        for (k, &h) in hs.iter().enumerate() {
            first.entry(h).or_insert(k as u32);
        }
        let h = Arc::new((hs, first));
        self.hashes.borrow_mut().insert(r, h.clone());
        h
    }
}

/// The all-reduce calls, as (rank, node), whose input on the pipeline mesh dim is proven the
/// calling stage's share of one sum of the spec (`spec`; none without one).
pub(crate) fn stage_shares(spec: &Graph, program: &Program) -> StageShares {
    let mut out = HashMap::new();
    let mut through = HashMap::new();
    let mut collectives = 0;
    let mesh = &program.mesh;
    let pipeline: Vec<usize> = (0..mesh.dims.len())
        .filter(|&m| crate::is_pipeline_dim(mesh, m) && mesh.dims[m].1 > 1)
        .collect();
    if spec.nodes.is_empty() || pipeline.is_empty() {
        return StageShares::default();
    }
    let mut spec_side: Option<SpecSide> = None;
    for (r, g) in program.ranks.iter().enumerate() {
        for (i, _) in g.nodes.iter().enumerate() {
            if out.contains_key(&(r, i)) {
                continue;
            }
            let Some(group) = sum_reduce_group(g, i) else {
                continue;
            };
            let Some(members) = program.group(group).and_then(|pg| pg.group_of(r)) else {
                continue;
            };
            // Members that differ on a pipeline dim only: stages of one replica.
            let coords = mesh.coords(r);
            let stages_only = members.len() > 1
                && members.iter().all(|&q| {
                    let c = mesh.coords(q);
                    (0..mesh.dims.len()).all(|m| pipeline.contains(&m) || c[m] == coords[m])
                });
            if !stages_only {
                continue;
            }
            // Each member's call: the same position among its all-reduces on this group.
            let Some(k) = sum_reduces(g, group).iter().position(|&j| j == i) else {
                continue;
            };
            let calls: Option<Vec<(usize, usize)>> = members
                .iter()
                .map(|&q| {
                    sum_reduces(&program.ranks[q], group)
                        .get(k)
                        .map(|&j| (q, j))
                })
                .collect();
            let Some(calls) = calls else { continue };
            let spec_side = spec_side.get_or_insert_with(|| SpecSide::new(spec));
            if let Some(reads) = shares_of_one_sum(spec, spec_side, program, &calls) {
                out.extend(calls.iter().map(|&c| (c, collectives)));
                through.extend(calls.into_iter().zip(reads));
                collectives += 1;
            }
        }
    }
    StageShares {
        calls: out,
        through,
        hashes: RefCell::default(),
    }
}

/// Per node of `g` (literal hashes `literals`, as [`Shared::literals`]), a hash of its
/// expression as [`structure_hashes`] reads it, but where an all-reduce of stage shares
/// (`share(node)`: its collective number), or its wait, is a leaf of that number: the same
/// on every member, whatever each stage added.
///
/// [`Shared::literals`]: crate::engine::Shared::literals
/// [`structure_hashes`]: crate::engine::structure_hashes
fn share_hashes(g: &Graph, literals: &[u64], share: impl Fn(usize) -> Option<usize>) -> Vec<u64> {
    crate::engine::structure_hashes_with_leaves(g, literals, |k| {
        let n = &g.nodes[k];
        let waits = n.op().is_some_and(|op| op.name == "wait_tensor");
        share(k)
            .or_else(|| {
                waits
                    .then(|| n.inputs().first().and_then(|v| share(v.node)))
                    .flatten()
            })
            .map(|c| c as u64)
    })
}

/// The group of an all-reduce (sum) call, node `i` of `g`.
fn sum_reduce_group(g: &Graph, i: usize) -> Option<&str> {
    let n = &g.nodes[i];
    let op = n.op()?;
    if op.namespace != "_c10d_functional" || op.name != "all_reduce" {
        return None;
    }
    match (n.args().first(), n.args().get(1), n.args().get(2)) {
        (Some(Arg::Value(_)), Some(Arg::Str(red)), Some(Arg::Str(group))) if red == "sum" => {
            Some(group.as_str())
        }
        _ => None,
    }
}

/// The all-reduce (sum) calls of `g` on `group`, in program order.
fn sum_reduces(g: &Graph, group: &str) -> Vec<usize> {
    (0..g.nodes.len())
        .filter(|&j| sum_reduce_group(g, j) == Some(group))
        .collect()
}

/// What is read of the spec once: its call nodes by operator, and the readers of every
/// node.
struct SpecSide {
    by_op: HashMap<(String, String), Vec<usize>>,
    users: Vec<Vec<usize>>,
}

impl SpecSide {
    fn new(spec: &Graph) -> SpecSide {
        let mut by_op: HashMap<(String, String), Vec<usize>> = HashMap::new();
        let mut users = vec![Vec::new(); spec.nodes.len()];
        for (j, n) in spec.nodes.iter().enumerate() {
            if let Some(op) = n.op() {
                by_op
                    .entry((op.namespace.clone(), op.name.clone()))
                    .or_default()
                    .push(j);
            }
            for v in n.inputs() {
                users[v.node].push(j);
            }
        }
        SpecSide { by_op, users }
    }
}

/// How many operators deep a term is compared with the spec's nodes, at most.
const DEPTH: u8 = 16;

/// What a node is to [`alike`]: a graph input (by name), any value (a received message:
/// the spec computes it in place), or an operator call.
#[derive(Clone, Copy, PartialEq)]
enum Seen<'g> {
    Input(&'g str),
    Any,
    Call(usize),
}

/// Node `j` of `g` as [`alike`] reads it: a graph input, or a rearrangement or slice of one
/// (views, permutes, copies, a gather and its wait; a microbatch's slice, whose rows
/// [`microbatch`] reads), is the input; an all-reduce or wait the spec does not have is read
/// through; a received message is any value.
fn seen(g: &Graph, mut j: usize) -> Seen<'_> {
    let mut first = j;
    loop {
        let n = &g.nodes[j];
        let Some(op) = n.op() else {
            return match n.kind {
                NodeKind::Input => Seen::Input(n.name.as_str()),
                _ => Seen::Any,
            };
        };
        if op.namespace == "shardproof_p2p" {
            return Seen::Any;
        }
        let Some(x) = n.inputs().first().map(|v| v.node) else {
            return Seen::Call(first);
        };
        match (op.namespace.as_str(), op.name.as_str()) {
            ("_c10d_functional", "wait_tensor" | "all_reduce") if j == first => {
                j = x;
                first = x;
            }
            (
                "aten",
                "view" | "reshape" | "_unsafe_view" | "permute" | "clone" | "contiguous" | "slice",
            )
            | ("_c10d_functional", "all_gather_into_tensor" | "wait_tensor") => j = x,
            _ => return Seen::Call(first),
        }
    }
}

/// How many operators deep (at most `limit`) node `a` of `g` and node `b` of the spec compute
/// alike: the same operator on the same outputs of inputs alike one level shallower, graph
/// inputs of the same name; any value (a received message) is alike to any depth; a `div` or
/// `mul` by a number in `g` where the spec calls another operator is read through.
fn alike(
    g: &Graph,
    a: usize,
    spec: &Graph,
    b: usize,
    limit: u8,
    memo: &mut HashMap<(usize, usize, u8), u8>,
) -> u8 {
    if limit == 0 {
        return 0;
    }
    let (sa, sb) = (seen(g, a), seen(spec, b));
    let (a, b) = match (sa, sb) {
        (Seen::Any, _) => return limit,
        (Seen::Input(x), Seen::Input(y)) => return if x == y { limit } else { 0 },
        (Seen::Call(a), Seen::Call(b)) => (a, b),
        _ => return 0,
    };
    if let Some(&d) = memo.get(&(a, b, limit)) {
        return d;
    }
    let (na, nb) = (&g.nodes[a], &spec.nodes[b]);
    // A scaling by a number the spec does not have at this point (a microbatch's 1/K in the
    // backward) is read through: the values' scale is not what this match reads.
    if let (Some(op), Some(sop), [Arg::Value(x), Arg::Int(_) | Arg::Float(_)]) =
        (na.op(), nb.op(), na.args())
    {
        if matches!(op.name.as_str(), "div" | "mul") && sop.name != op.name && x.output == 0 {
            let d = alike(g, x.node, spec, b, limit, memo);
            memo.insert((a, b, limit), d);
            return d;
        }
    }
    let same_op = match (na.op(), nb.op()) {
        (Some(x), Some(y)) => x.namespace == y.namespace && x.name == y.name,
        _ => false,
    };
    let (ia, ib) = (na.inputs(), nb.inputs());
    let d = if !same_op || ia.len() != ib.len() {
        0
    } else {
        let mut d = limit;
        for (u, v) in ia.iter().zip(&ib) {
            let under = if u.output == v.output {
                alike(g, u.node, spec, v.node, limit - 1, memo)
            } else {
                0
            };
            d = d.min(under + 1);
        }
        d
    };
    memo.insert((a, b, limit), d);
    d
}

/// The one spec node an atom `v` of rank graph `g` computes: of the spec's calls of the same
/// operator and the same recorded type, the only one alike to the full depth ([`alike`],
/// [`DEPTH`] operators); none where the atom is a received message.
fn spec_term(g: &Graph, v: ValueId, spec: &Graph, side: &SpecSide) -> Option<usize> {
    let ty = |h: &Graph, x: ValueId| h.nodes[x.node].outputs.get(x.output)?.ty.clone();
    let mine = ty(g, v)?;
    let Seen::Call(a) = seen(g, v.node) else {
        return None;
    };
    if a != v.node {
        return None;
    }
    let op = g.nodes[a].op()?;
    let mut memo = HashMap::new();
    let mut best: Option<(u8, usize)> = None;
    let mut tied = false;
    for &j in side.by_op.get(&(op.namespace.clone(), op.name.clone()))? {
        if ty(spec, ValueId::new(j, v.output)).as_ref() != Some(&mine) {
            continue;
        }
        let d = alike(g, a, spec, j, DEPTH, &mut memo);
        match best {
            Some((b, _)) if d < b => {}
            Some((b, _)) if d == b => tied = true,
            _ => {
                best = Some((d, j));
                tied = false;
            }
        }
    }
    best.filter(|&(d, _)| d == DEPTH && !tied).map(|(_, j)| j)
}

/// An `add` of two tensors (no `alpha`): the nodes a sum is read through.
fn plain_add(g: &Graph, v: ValueId) -> Option<[ValueId; 2]> {
    let n = &g.nodes[v.node];
    let op = n.op()?;
    let NodeKind::Call { args, kwargs, .. } = &n.kind else {
        return None;
    };
    match (args.as_slice(), kwargs.is_empty(), v.output) {
        ([Arg::Value(a), Arg::Value(b)], true, 0) if op.namespace == "aten" && op.name == "add" => {
            Some([*a, *b])
        }
        _ => None,
    }
}

/// The atoms of a sum: `v` read through nested plain adds, except through `stop`.
fn atoms(g: &Graph, v: ValueId, stop: &dyn Fn(ValueId) -> bool) -> Vec<ValueId> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        match plain_add(g, x).filter(|_| !stop(x)) {
            Some([a, b]) => {
                stack.push(b);
                stack.push(a);
            }
            None => out.push(x),
        }
    }
    out
}

/// The atoms of a sum as [`atoms`] reads them, each with the number it is divided by, where a
/// division of a sum by a literal number is read through as the sum of its terms each divided
/// by it (`(a + b) / c = a / c + b / c`: a stage adding its layers' terms for one microbatch
/// and dividing that by the microbatch count, as DeepSeek's stages do), and an all-reduce
/// (sum) over another mesh dim's group of `n` members (a tensor-parallel sum of the stage's
/// shares) as `n` times its input, whose atoms are then divided by `1/n` more. The
/// all-reduces read through are returned (node, the mesh dims their group spans): that reading
/// holds only where the input is the same on every member, which the caller must have proven.
/// A division of a non-sum is left to [`undivided`], so one term keeps one division as before.
fn divided_atoms(
    program: &Program,
    q: usize,
    v: ValueId,
) -> (Vec<(ValueId, f64)>, Vec<ReadThrough>) {
    let g = &program.ranks[q];
    let mut out = Vec::new();
    let mut reads = Vec::new();
    let mut stack = vec![(v, 1.0)];
    while let Some((x, d)) = stack.pop() {
        for atom in atoms(g, x, &|_| false) {
            if let Some((input, node, dims, n)) = other_dims_sum(program, q, atom) {
                reads.push((node, dims));
                stack.push((input, d / n as f64));
                continue;
            }
            let (core, c) = undivided(g, atom);
            if c != 1.0 && plain_add(g, core).is_some() {
                stack.push((core, d * c));
            } else {
                out.push((atom, d));
            }
        }
    }
    (out, reads)
}

/// Where `v` (of rank `q`) is an all-reduce (sum), or its wait, over a group of more than one
/// member that differ from `q` on mesh dims other than the pipeline's only: its input, its
/// node, the mesh dims the members differ on, and the member count.
fn other_dims_sum(
    program: &Program,
    q: usize,
    v: ValueId,
) -> Option<(ValueId, usize, Vec<usize>, usize)> {
    let g = &program.ranks[q];
    if v.output != 0 {
        return None;
    }
    let n = &g.nodes[v.node];
    let op = n.op()?;
    let node = if op.namespace == "_c10d_functional" && op.name == "wait_tensor" {
        n.inputs().first()?.node
    } else {
        v.node
    };
    let group = sum_reduce_group(g, node)?;
    let input = g.nodes[node].inputs().first().copied()?;
    let members = program.group(group)?.group_of(q)?;
    let mesh = &program.mesh;
    let coords = mesh.coords(q);
    let mut dims: Vec<usize> = Vec::new();
    for &p in members {
        let c = mesh.coords(p);
        for m in 0..mesh.dims.len() {
            if c[m] != coords[m] && !dims.contains(&m) {
                dims.push(m);
            }
        }
    }
    let stages = dims.iter().any(|&m| crate::is_pipeline_dim(mesh, m));
    if members.len() < 2 || stages || dims.is_empty() {
        return None;
    }
    dims.sort_unstable();
    Some((input, node, dims, members.len()))
}

/// An atom less a division by a literal number (`div(x, c)`): (x, c); (atom, 1) otherwise.
fn undivided(g: &Graph, v: ValueId) -> (ValueId, f64) {
    let n = &g.nodes[v.node];
    if let (Some(op), 0) = (n.op(), v.output) {
        if op.namespace == "aten" && op.name == "div" {
            if let [Arg::Value(x), c] = n.args() {
                let c = match c {
                    Arg::Int(c) => Some(*c as f64),
                    Arg::Float(c) => Some(*c),
                    _ => None,
                };
                if let Some(c) = c.filter(|c| c.is_finite() && *c != 0.0) {
                    return (*x, c);
                }
            }
        }
    }
    (v, 1.0)
}

/// The microbatch an atom reads: the one tag of the messages it receives and the one index
/// of its slices of graph inputs (start over length, each a whole piece of its dim), agreeing,
/// with the number of pieces its slices cut their dims into (`None`: no slice); `(None, _)`
/// where it reads neither; `None` where they disagree, a slice is no piece, or two slices cut
/// their dims into different numbers of pieces.
fn microbatch(g: &Graph, v: ValueId) -> Option<(Option<i64>, Option<i64>)> {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = vec![v.node];
    let mut found: BTreeSet<i64> = BTreeSet::new();
    let mut pieces: BTreeSet<i64> = BTreeSet::new();
    while let Some(j) = stack.pop() {
        if std::mem::replace(&mut seen[j], true) {
            continue;
        }
        let n = &g.nodes[j];
        let Some(op) = n.op() else { continue };
        match (op.namespace.as_str(), op.name.as_str()) {
            ("shardproof_p2p", "recv") => {
                let tag = n
                    .kwarg("tag")
                    .or_else(|| n.args().get(3))
                    .map_or(Some(0), Arg::as_int)?;
                found.insert(tag);
                continue;
            }
            ("aten", "slice") => {
                let input = n.inputs().first().copied()?;
                if matches!(g.nodes[input.node].kind, NodeKind::Input) {
                    let int = |k: usize, default: i64| match n.args().get(k) {
                        None => Some(default),
                        Some(a) => a.as_int(),
                    };
                    let dim = int(1, 0)?;
                    let (start, end, step) = (int(2, 0)?, int(3, i64::MAX)?, int(4, 1)?);
                    let size = g.nodes[input.node]
                        .outputs
                        .get(input.output)
                        .and_then(|o| o.ty.as_ref())
                        .and_then(|t| {
                            let d = usize::try_from(dim).ok()?;
                            match t.shape.get(d)? {
                                shardproof_ir::Dim::Known(n) => Some(*n),
                                shardproof_ir::Dim::Sym(_) => None,
                            }
                        })?;
                    let len = end.min(size) - start;
                    if step != 1 || start < 0 || len <= 0 || size % len != 0 || start % len != 0 {
                        return None;
                    }
                    found.insert(start / len);
                    pieces.insert(size / len);
                    continue;
                }
            }
            _ => {}
        }
        stack.extend(n.inputs().iter().map(|u| u.node));
    }
    if found.len() > 1 || pieces.len() > 1 {
        return None;
    }
    Some((found.first().copied(), pieces.first().copied()))
}

/// One copy of a spec term on a stage: the microbatch it reads (`None`: no selection), the
/// number of pieces its slices cut the batch into (`None`: no slice) and the number it is
/// divided by.
type TermCopy = (Option<i64>, Option<i64>, f64);

/// Whether the inputs of the all-reduce calls `calls` (rank, node; one per stage) are the
/// stages' shares of one spec sum (the module's rule).
fn shares_of_one_sum(
    spec: &Graph,
    side: &SpecSide,
    program: &Program,
    calls: &[(usize, usize)],
) -> Option<Vec<Vec<ReadThrough>>> {
    let mut reads = Vec::with_capacity(calls.len());
    one_sum(spec, side, program, calls, &mut reads).then_some(reads)
}

/// [`shares_of_one_sum`]'s decision; `reads` gets, per call, the all-reduces its reading went
/// through ([`divided_atoms`]).
fn one_sum(
    spec: &Graph,
    side: &SpecSide,
    program: &Program,
    calls: &[(usize, usize)],
    reads: &mut Vec<Vec<ReadThrough>>,
) -> bool {
    // Spec term -> the stage computing it; per (stage, term): microbatches and divisors.
    let mut owner: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut copies: BTreeMap<(usize, (usize, usize)), Vec<TermCopy>> = BTreeMap::new();
    for (s, &(q, j)) in calls.iter().enumerate() {
        let g = &program.ranks[q];
        let Some(&input) = g.nodes[j].inputs().first() else {
            return false;
        };
        let (divided, through) = divided_atoms(program, q, input);
        reads.push(through);
        for (atom, outer) in divided {
            let (core, inner) = undivided(g, atom);
            let c = outer * inner;
            let Some(t) = spec_term(g, core, spec, side) else {
                return false;
            };
            let Some((mb, pieces)) = microbatch(g, core) else {
                return false;
            };
            let term = (t, core.output);
            if *owner.entry(term).or_insert(s) != s {
                return false;
            }
            copies.entry((s, term)).or_default().push((mb, pieces, c));
        }
    }
    // One microbatch count K for every stage's every term, each microbatch once, one divisor
    // (1 or K) everywhere.
    let Some(k) = copies.values().next().map(Vec::len) else {
        return false;
    };
    let divisor = copies.values().next().and_then(|c| c.first()).map(|c| c.2);
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    let Some(divisor) = divisor.filter(|&d| near(d, 1.0) || near(d, k as f64)) else {
        return false;
    };
    for c in copies.values() {
        let mbs: BTreeSet<Option<i64>> = c.iter().map(|x| x.0).collect();
        let whole = if k == 1 {
            mbs.len() == 1
        } else {
            mbs == (0..k as i64).map(Some).collect()
        };
        // A slice cuts its dim into K pieces (microbatches of equal rows, none overlapping).
        let cut = c.iter().all(|x| x.1.is_none_or(|p| p == k as i64));
        if c.len() != k || !whole || !cut || c.iter().any(|x| !near(x.2, divisor)) {
            return false;
        }
    }
    // The matched terms: exactly the atoms of one spec sum, each once.
    let terms: BTreeSet<(usize, usize)> = owner.keys().copied().collect();
    let Some(&first) = terms.iter().next() else {
        return false;
    };
    let is_term = |x: ValueId| terms.contains(&(x.node, x.output));
    // Candidate sums: the adds above the first term, through adds only.
    let mut stack = vec![first.0];
    let mut seen = HashSet::new();
    while let Some(n) = stack.pop() {
        for &u in &side.users[n] {
            let v = ValueId::new(u, 0);
            if !seen.insert(u) || plain_add(spec, v).is_none() {
                continue;
            }
            let mut found: Vec<(usize, usize)> = atoms(spec, v, &is_term)
                .into_iter()
                .map(|x| (x.node, x.output))
                .collect();
            found.sort_unstable();
            if found.iter().copied().eq(terms.iter().copied()) {
                return true;
            }
            stack.push(u);
        }
    }
    false
}

/// Whether rank `q` computes the same expression as output `o` of node `i` of rank `r`, of
/// the same recorded type, where the results of the all-reduces of stage shares
/// ([`stage_shares`], read through their waits) are the same leaf on every member of one such
/// all-reduce: the spec's sum on each. What [`Shared::stage_alike`] decides, through those
/// all-reduces (whose inputs differ by stage). The node is found by [`share_hashes`] (names
/// shift between stages) and confirmed on the structure.
///
/// [`Shared::stage_alike`]: crate::engine::Shared::stage_alike
pub(crate) fn stage_alike_through_shares(
    sh: &crate::engine::Shared,
    r: usize,
    q: usize,
    i: usize,
    o: usize,
) -> bool {
    let shares = &sh.stage_shares;
    let (mine, theirs) = (shares.hashes(sh, r), shares.hashes(sh, q));
    let Some(&j) = mine.0.get(i).and_then(|h| theirs.1.get(h)) else {
        return false;
    };
    let j = j as usize;
    let (g, h) = (&sh.program.ranks[r], &sh.program.ranks[q]);
    let ty = |x: &Graph, n: usize| x.nodes[n].outputs.get(o).and_then(|t| t.ty.clone());
    if ty(g, i).is_none() || ty(g, i) != ty(h, j) {
        return false;
    }
    // The all-reduce a node is, or waits for.
    let reduce = |x: &Graph, n: usize| {
        let node = &x.nodes[n];
        match node
            .op()
            .map(|op| (op.namespace.as_str(), op.name.as_str()))
        {
            Some(("_c10d_functional", "wait_tensor")) => node.inputs().first().map(|v| v.node),
            _ => Some(n),
        }
    };
    let share =
        |rank: usize, x: &Graph, n: usize| reduce(x, n).and_then(|k| shares.get(&(rank, k)));
    let leaf = |x: usize, y: usize| match (share(r, g, x), share(q, h, y)) {
        (None, None) => None,
        (a, b) => Some(a == b),
    };
    let mut memo = crate::engine::ExprMemo::default();
    crate::engine::same_expression_upto(g, None, i, h, None, j, &mut memo, &leaf, &|_, _| false)
}
