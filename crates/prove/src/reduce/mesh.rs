//! Mesh-dim reduction along data parallelism: a case whose `dp` mesh dim has `D > 2`
//! coordinates is rewritten to `dp = 2` (two replicas, the spec's batch `2/D` of its size),
//! and a proof of the rewritten case is a proof of the case, when the conditions of
//! docs/prove.md section 2 hold. Each is *checked* here, never assumed:
//!
//! - **(a) one graph along dp**: ranks that differ only in their dp coordinate run the same
//!   graph, constants included (so no constant depends on the dp coordinate); inputs and
//!   outputs are `Shard` or `Replicate` along dp (held `at:` coordinates of other dims only),
//!   every process group either spans dp whole or stays at one dp coordinate, and every
//!   point-to-point message stays within one replica, the same at every replica.
//! - **(b) batch-local spec**: every spec operator maps the dp-sharded (batch) dim through row
//!   by row — no reduction, softmax, slice or concatenation along it, a reshape only with the
//!   batch as the outermost factor — until a reduction over it of the form below.
//! - **(c) linear, mean-scaled reductions**: a reduction over the batch is a mean over its rows
//!   (a `mean`, a mean `nll_loss`, or a sum of per-row terms that carry one factor `1/N`: the
//!   loss's backward seed, a literal multiple of the batch size); from there on every output is
//!   affine in it (sums, scalings by batch-free values; no product of two reduced values, no
//!   nonlinear function of one). On the ranks, the replicas meet only through a sum
//!   `all_reduce` over dp followed by a division by the mesh size (or an `avg` all-reduce),
//!   after which the same affine rule holds. A message carries its value's class from the
//!   sender to the receiver.
//!
//! Under (a)-(c) every output has the form `A(W) + L_W((1/n) Σ_r σ(X_r))` on both sides, for
//! every replica count `n`, with `A`, `L`, `σ` independent of `n` (`X_r`: replica r's rows,
//! `W`: everything replicated along dp). A proof at `n = 2` gives, for all inputs,
//! `Δ(X_1) + Δ(X_2) = 2(A' - A)` with `Δ = Lσ - L'σ'`, hence `Δ ≡ A' - A`, and then at any `n`
//! the difference `A - A' + (1/n) Σ_r Δ(X_r)` is 0. Batch-sharded outputs are row-wise on both
//! sides and `n`-independent, so block 0 at `n = 2` covers every block. Where a condition
//! fails the reduced case may still be proved or refuted, but a proof does not carry over
//! ([`MeshReduction::lifts`]); a refutation is confirmed on the case as written either way.

use super::rules::{self, GraphDims};
use super::sizes::{Sizes, Var};
use super::Refusal;
use shardproof_case::{Blocks, Case, Layout, Placement};
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};
use shardproof_ops::{Args, Meta, OpClass, Registry, Tensor, Values};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The replica count the reduction proves at.
const REDUCED: usize = 2;

/// A case rewritten to two replicas along dp.
#[derive(Clone, Debug)]
pub struct MeshReduction {
    /// The rewritten case (`dp = 2`).
    pub case: Case,
    /// The mesh dim reduced (`dp`).
    pub dim: String,
    /// Its size in the case.
    pub original: usize,
    /// Its size in the rewritten case.
    pub reduced: usize,
    /// `Ok` when conditions (b) and (c) hold, so a proof of the rewritten case proves the
    /// case; otherwise the failed condition, in words.
    pub lifts: Result<(), String>,
    /// The literals rewritten with the replica count, as `graph: old -> new`.
    pub rewritten: Vec<String>,
}

/// The dp mesh dim's position and size, when the case has one with more than two coordinates.
fn dp_dim(case: &Case) -> Option<(usize, usize)> {
    let g = case.program.mesh.dim_index("dp")?;
    let d = case.program.mesh.dims[g].1;
    (d > REDUCED).then_some((g, d))
}

/// Whether two graphs are the same program (operators, arguments, constants, types).
fn same_program(a: &Graph, b: &Graph) -> bool {
    a.inputs == b.inputs
        && a.outputs == b.outputs
        && a.nodes.len() == b.nodes.len()
        && a.nodes
            .iter()
            .zip(&b.nodes)
            .all(|(x, y)| x.kind == y.kind && x.outputs == y.outputs)
}

/// The placement along mesh dim `g` of a layout, or why it is not reduced.
fn placement_along(layout: &Layout, g: usize, what: &str) -> Result<Placement, String> {
    let Layout::Placed(p) = layout else {
        return Err(format!("(a) `{what}` has an `expr:` layout"));
    };
    // Held `at:` coordinates of other mesh dims (a pipeline stage's weights): the same
    // holders at every dp coordinate, so the replicas still run one program on the same
    // pieces. Held at some dp coordinates only, the replicas differ.
    if p.at.iter().any(|h| h.dim == g) {
        return Err(format!(
            "(a) `{what}` is held only `at:` some dp coordinates"
        ));
    }
    let pl = p.placements.get(g).cloned().unwrap_or(Placement::Replicate);
    match (&pl, &p.blocks) {
        (Placement::Partial(_), _) => Err(format!("(a) `{what}` is Partial along dp")),
        (Placement::Shard(_), Blocks::Equal { count: 1, .. }) | (Placement::Replicate, _) => Ok(pl),
        (Placement::Shard(_), _) => Err(format!(
            "(a) `{what}` is sharded along dp in fused or explicit blocks"
        )),
    }
}

/// Reduces the case's `dp` mesh dim to two replicas; `None` where it has no dp dim with more
/// than two coordinates, `Err` where the rewritten case cannot be built (condition (a), or a
/// spec shape the reduction cannot rewrite).
pub fn reduce_mesh(case: &Case) -> Option<Result<MeshReduction, String>> {
    let (g, d) = dp_dim(case)?;
    Some(build(case, g, d))
}

fn build(case: &Case, g: usize, d: usize) -> Result<MeshReduction, String> {
    let mesh = &case.program.mesh;
    let ranks = &case.program.ranks;
    if case.inputs.iter().any(|r| r.cut) {
        return Err("a case with cuts is not reduced along dp".into());
    }
    // (a) one graph along dp.
    let mut base_of = vec![0usize; ranks.len()];
    for (r, graph) in ranks.iter().enumerate() {
        let mut c = mesh.coords(r);
        c[g] = 0;
        let r0 = rank_of(mesh, &c);
        base_of[r] = r0;
        if !Arc::ptr_eq(graph, &ranks[r0]) && !same_program(graph, &ranks[r0]) {
            return Err(format!(
                "(a) rank {r} runs another graph than rank {r0}, which differs from it only along dp (a rank-dependent constant or operator)"
            ));
        }
    }
    // Layouts along dp.
    let mut sharded: HashMap<ValueId, usize> = HashMap::new();
    for rel in &case.inputs {
        if let Placement::Shard(k) = placement_along(&rel.layout, g, &rel.spec_name)? {
            sharded.insert(rel.spec_value, k);
        }
    }
    if sharded.is_empty() {
        return Err("(b) no input is sharded along dp".into());
    }
    let scaled = scaled_inputs(case, &sharded, d);
    let mut out_place = Vec::new();
    for e in &case.outputs {
        out_place.push(placement_along(&e.layout, g, &e.spec_name)?);
    }
    // The spec's sizes, the batch's dp factor a variable of its own.
    let mut sizes = Sizes::default();
    let n_var = sizes.fresh(d as u64, "the dp mesh dim");
    let spec_metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let spec_dims = rules::walk(&mut sizes, &case.spec, &spec_metas, &mut |sz, v, shape| {
        let mut dims = Vec::new();
        for (k, &n) in shape.iter().enumerate() {
            let m = sz.fresh(n, format!("spec {} dim {k}", case.spec.value_name(v)));
            if sharded.get(&v) == Some(&k) {
                let what = format!("`{}` dim {k} along dp", case.spec.value_name(v));
                let parts = sz.split(&m, &[d as u64, n / d as u64], &what)?;
                sz.unify(&parts[0], &n_var, &what)?;
            }
            dims.push(m);
        }
        Ok(Some(dims))
    })
    .map_err(|r: Refusal| format!("the spec's shapes: {}", r.message))?;
    let n_norm = sizes.norm(&n_var);
    let nv: Var = match (n_norm.coef, n_norm.vars.iter().next()) {
        (1, Some((&v, &1))) if n_norm.vars.len() == 1 => v,
        _ => {
            return Err(
                "(b) a reshape splits the batch's dp factor (the batch is not kept whole)".into(),
            )
        }
    };
    let batch_rows = sharded
        .iter()
        .filter_map(|(&v, &k)| spec_dims.dims_of(v).map(|ds| sizes.original(&ds[k])))
        .min()
        .unwrap_or(d as u64);
    // (b) and (c) on the spec, (c) on the ranks.
    let mut lifts: Result<(), String> = Ok(());
    let mut rewritten = Vec::new();
    let spec_class = classify_spec(
        case,
        &spec_dims,
        &sizes,
        nv,
        (&sharded, &scaled),
        batch_rows,
        d,
    );
    let mut spec_out_class: HashMap<ValueId, Cls> = HashMap::new();
    let mut spec_lits = Vec::new();
    match &spec_class {
        Ok((classes, lits)) => {
            spec_lits = lits.clone();
            for (e, pl) in case.outputs.iter().zip(&out_place) {
                let c = classes[&e.spec_value];
                spec_out_class.insert(e.spec_value, c);
                let ok = match pl {
                    Placement::Replicate => matches!(c, Cls::Free | Cls::Global | Cls::Affine),
                    // Row-wise, or row-wise with one 1/N (a scaled cut's gradient, which the
                    // ranks must then hold divided by a replica count: below).
                    Placement::Shard(k) => {
                        matches!(c, Cls::Local(0) | Cls::Local(1))
                            && batch_dim(&spec_dims, &sizes, nv, e.spec_value) == Ok(Some(*k))
                    }
                    Placement::Partial(_) => false,
                };
                if !ok && lifts.is_ok() {
                    lifts = Err(format!(
                        "(c) spec output `{}` is {} but laid out {pl} along dp",
                        e.spec_name,
                        c.describe()
                    ));
                }
            }
        }
        Err(why) => lifts = Err(why.clone()),
    }
    if case.outputs.is_empty() && lifts.is_ok() {
        lifts = Err("(c) the case states no outputs, so their layouts along dp are unknown".into());
    }
    // Ranks: one classification per replica-0 rank, the classes of point-to-point messages
    // carried from sender to receiver until every rank's settle.
    let messages = replica_messages(case, g, &base_of)?;
    let mut classified = classify_ranks(case, &base_of, g, d, &scaled, &messages);
    let mut rank_lits: HashMap<usize, Vec<LitRewrite>> = HashMap::new();
    for r in 0..ranks.len() {
        if base_of[r] != r || rank_lits.contains_key(&r) {
            continue;
        }
        let result = classified.remove(&r).unwrap_or_else(|| {
            Err(format!(
                "(c) rank {r} receives a message whose class never settles (a cycle of messages)"
            ))
        });
        match result {
            Ok((classes, mut lits, mut pending)) => {
                for (e, pl) in case.outputs.iter().zip(&out_place) {
                    for &(rr, rv) in &e.rank_values {
                        if rr != r {
                            continue;
                        }
                        let c = classes[&rv];
                        let spec_c = spec_out_class.get(&e.spec_value).copied();
                        let ok = match pl {
                            Placement::Replicate => {
                                matches!(c, Cls::Free | Cls::Global | Cls::Affine)
                            }
                            // The spec's rows carry one 1/N: the rank's own rows divided by a
                            // replica count, whose constant then scales with it.
                            _ if spec_c == Some(Cls::Local(1)) => match pending.remove(&rv) {
                                Some(l) if c == Cls::RInv => {
                                    lits.push(l);
                                    true
                                }
                                _ => false,
                            },
                            // A division by a replica count read as the rank's own value, its
                            // constant kept (what the reduction did before scaled cuts).
                            _ => matches!(c, Cls::Free | Cls::RLocal | Cls::RInv),
                        };
                        if !ok && lifts.is_ok() {
                            lifts = Err(format!(
                                "(c) rank {r}'s `{}` is {} but laid out {pl} along dp",
                                ranks[r].value_name(rv),
                                c.describe()
                            ));
                        }
                    }
                }
                rank_lits.insert(r, lits);
            }
            Err(why) => {
                if lifts.is_ok() {
                    lifts = Err(why);
                }
                rank_lits.insert(r, Vec::new());
            }
        }
    }
    // The rewritten spec: the dp factor of the batch at 2, every other size as it was.
    sizes.fix(nv, REDUCED as u64);
    let mut spec = super::rewrite(&case.spec, &spec_dims, &sizes, &case.ops)
        .map_err(|r| format!("the spec at dp = {REDUCED}: {}", r.message))?;
    for l in &spec_lits {
        rewritten.push(format!("spec {}", l.apply(&mut spec)));
    }
    // The kept ranks: dp coordinates 0 and 1, renumbered on the smaller mesh.
    let mut new_mesh = mesh.clone();
    new_mesh.dims[g].1 = REDUCED;
    let mut new_index = vec![None; ranks.len()];
    let mut kept = Vec::new();
    for (r, slot) in new_index.iter_mut().enumerate() {
        let c = mesh.coords(r);
        if c[g] < REDUCED {
            *slot = Some(rank_of(&new_mesh, &c));
            kept.push(r);
        }
    }
    let mut graphs: HashMap<usize, Arc<Graph>> = HashMap::new();
    // In rank order, so that the report is the same on every run.
    let mut by_rank: Vec<(&usize, &Vec<LitRewrite>)> = rank_lits.iter().collect();
    by_rank.sort_by_key(|(r, _)| **r);
    for (&r, lits) in by_rank {
        if lits.is_empty() {
            graphs.insert(r, ranks[r].clone());
            continue;
        }
        let mut gr = (*ranks[r]).clone();
        for l in lits {
            rewritten.push(format!("rank {r} {}", l.apply(&mut gr)));
        }
        graphs.insert(r, Arc::new(gr));
    }
    let mut new_ranks = vec![None; kept.len()];
    for &r in &kept {
        new_ranks[new_index[r].expect("kept")] = Some(graphs[&base_of[r]].clone());
    }
    let mut groups = Vec::new();
    for grp in &case.program.groups {
        groups.push(shardproof_ir::ProcessGroup {
            name: grp.name.clone(),
            members: group_members(grp, mesh, g, d, &new_index)?,
        });
    }
    let mut reduced = case.clone();
    reduced.spec = spec;
    reduced.program = shardproof_ir::Program {
        mesh: new_mesh,
        groups,
        ranks: new_ranks
            .into_iter()
            .map(|g| g.expect("every rank"))
            .collect(),
    };
    let remap = |rv: &[(usize, ValueId)]| -> Vec<(usize, ValueId)> {
        rv.iter()
            .filter_map(|&(r, v)| new_index[r].map(|n| (n, v)))
            .collect()
    };
    let filter = |iv: &[ValueId]| -> Vec<ValueId> {
        if iv.len() != ranks.len() {
            return iv.to_vec();
        }
        kept.iter().map(|&r| iv[r]).collect()
    };
    for rel in &mut reduced.inputs {
        rel.rank_values = remap(&rel.rank_values);
        rel.impl_values = filter(&rel.impl_values);
    }
    for e in &mut reduced.outputs {
        e.rank_values = remap(&e.rank_values);
        e.impl_values = filter(&e.impl_values);
    }
    reduced.name = format!("{} (dp {d} -> {REDUCED})", case.name);
    Ok(MeshReduction {
        case: reduced,
        dim: "dp".into(),
        original: d,
        reduced: REDUCED,
        lifts,
        rewritten,
    })
}

/// A process group's member sets on the kept ranks, or why its sets are not the same at every
/// dp coordinate (condition (a)): each set either spans dp whole as a product (the same ranks
/// of the other mesh dims at every dp coordinate) or lies at one dp coordinate, and the sets
/// at one coordinate are those at any other, moved along dp.
fn group_members(
    grp: &shardproof_ir::ProcessGroup,
    mesh: &shardproof_ir::Mesh,
    g: usize,
    d: usize,
    new_index: &[Option<usize>],
) -> Result<Vec<Vec<usize>>, String> {
    let refuse = |what: &str| Err(format!("(a) process group `{}` {what}", grp.name));
    // A rank as (dp coordinate, its position on the other mesh dims).
    let split = |r: usize| {
        let mut c = mesh.coords(r);
        let at = c[g];
        c[g] = 0;
        (at, rank_of(mesh, &c))
    };
    let mut per_coord: Vec<Vec<Vec<usize>>> = vec![Vec::new(); d];
    let mut members = Vec::new();
    for set in &grp.members {
        let mut by_coord: Vec<Vec<usize>> = vec![Vec::new(); d];
        for &r in set {
            let (at, other) = split(r);
            by_coord[at].push(other);
        }
        for o in &mut by_coord {
            o.sort_unstable();
        }
        let held: Vec<usize> = (0..d).filter(|&c| !by_coord[c].is_empty()).collect();
        if held.len() == 1 {
            per_coord[held[0]].push(by_coord[held[0]].clone());
        } else if held.len() != d || by_coord.iter().any(|o| *o != by_coord[0]) {
            return refuse("has a set that is not the same ranks at every dp coordinate");
        }
        let k: Vec<usize> = set.iter().filter_map(|&r| new_index[r]).collect();
        if !k.is_empty() {
            members.push(k);
        }
    }
    for sets in &mut per_coord {
        sets.sort();
    }
    if per_coord.iter().any(|s| *s != per_coord[0]) {
        return refuse("has other sets at some dp coordinates than at others");
    }
    Ok(members)
}

/// The rank at mesh coordinates `c` (row-major).
fn rank_of(mesh: &shardproof_ir::Mesh, c: &[usize]) -> usize {
    c.iter()
        .zip(&mesh.dims)
        .fold(0, |acc, (&x, (_, s))| acc * s + x)
}

/// How a value depends on the replicas (docs/prove.md section 2, conditions (b), (c)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cls {
    /// Independent of the rows and of the replica count (weights, constants).
    Free,
    /// Spec: carries the batch dim, row by row; the degree (0 or 1) in the factor `1/n`.
    Local(u8),
    /// `(1/n) Σ_r σ(X_r)`: a mean over the replicas' rows.
    Global,
    /// `A(W) + Global`.
    Affine,
    /// Spec: `nll_loss`'s `total_weight`, the count of the batch's targets.
    Count,
    /// Rank: a function of the rank's own rows, independent of the replica count.
    RLocal,
    /// Rank: `Σ_r τ(X_r)`, a sum over the replicas not yet divided by their number.
    RSum,
    /// Rank: the rank's own rows' value divided by the replica count `n` (times a whole
    /// number): a scaled cut's input before its `mul` by `k·n`, or a rank value divided by
    /// `k·n` that only an output reads.
    RInv,
}

impl Cls {
    fn describe(self) -> &'static str {
        match self {
            Cls::Free => "batch-free",
            Cls::Local(0) => "row-wise along the batch",
            Cls::Local(_) => "row-wise with a 1/N scale",
            Cls::Global => "a mean over the batch",
            Cls::Affine => "affine in a mean over the batch",
            Cls::Count => "a count of the batch's targets",
            Cls::RLocal => "the rank's own rows' value",
            Cls::RSum => "a sum over the replicas not divided by their number",
            Cls::RInv => "the rank's own rows' value divided by the replica count",
        }
    }
}

/// A literal that scales with the replica count, rewritten at the reduced count.
#[derive(Clone, Debug)]
struct LitRewrite {
    node: usize,
    /// Position of the literal among the positional arguments.
    arg: usize,
    old: f64,
    new: f64,
}

impl LitRewrite {
    fn apply(&self, g: &mut Graph) -> String {
        let name = g.nodes[self.node].outputs.first().map(|o| o.name.clone());
        if let NodeKind::Call { args, .. } = &mut g.nodes[self.node].kind {
            args[self.arg] = if self.new.fract() == 0.0 && matches!(args[self.arg], Arg::Int(_)) {
                Arg::Int(self.new as i64)
            } else {
                Arg::Float(self.new)
            };
        }
        format!(
            "`{}`: {} -> {}",
            name.unwrap_or_default(),
            self.old,
            self.new
        )
    }
}

/// A scalar literal that is `k·m` or `1/(k·m)` for a whole `k >= 1`; the literal with `m`
/// replaced by `m·2/D` (exact: `m` is a multiple of `D`).
fn scaled_literal(x: f64, m: u64, d: usize) -> Option<(bool, f64)> {
    if !(x.is_finite() && x > 0.0) {
        return None;
    }
    let whole = |y: f64| (y.round() - y).abs() < 1e-9 * y.max(1.0) && y.round() >= 1.0;
    let ratio = REDUCED as f64 / d as f64;
    if whole(x) && (x.round() as u64).is_multiple_of(m) {
        return Some((true, x.round() * ratio));
    }
    let inv = 1.0 / x;
    if whole(inv) && (inv.round() as u64).is_multiple_of(m) {
        return Some((false, 1.0 / (inv.round() * ratio)));
    }
    None
}

struct MetaValues<'a>(&'a [Vec<Option<Meta>>]);

impl Values for MetaValues<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node)?.get(v.output)?.clone()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

/// The dim of `v` that holds the batch (its size has the dp factor), if any; `Err` when two do.
fn batch_dim(dims: &GraphDims, sizes: &Sizes, nv: Var, v: ValueId) -> Result<Option<usize>, ()> {
    let Some(ds) = dims.dims_of(v) else {
        return Ok(None);
    };
    let with: Vec<usize> = ds
        .iter()
        .enumerate()
        .filter(|(_, m)| sizes.norm(m).vars.contains_key(&nv))
        .map(|(k, _)| k)
        .collect();
    match with.len() {
        0 => Ok(None),
        1 => Ok(Some(with[0])),
        _ => Err(()),
    }
}

fn norm_dim(d: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let x = if d < 0 { d + r } else { d };
    (0..r.max(1)).contains(&x).then_some(x as usize)
}

/// Operators that move or copy elements: each output element is one input element.
const MOVEMENT: &[&str] = &[
    "aten.view",
    "aten._unsafe_view",
    "aten.reshape",
    "aten.t",
    "aten.transpose",
    "aten.permute",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.expand",
    "aten.clone",
    "aten.contiguous",
    "aten.detach",
    "aten.alias",
    "aten._to_copy",
    "aten.slice",
    "aten.cat",
    "aten.split",
    "aten.split_with_sizes",
    "aten.neg",
    "_c10d_functional.wait_tensor",
];

/// Operators linear in their first tensor argument, the others read as coefficients.
const LINEAR_FIRST: &[&str] = &[
    "aten.threshold_backward",
    "aten.silu_backward",
    "aten.gelu_backward",
    "aten.sigmoid_backward",
    "aten.tanh_backward",
    "aten._softmax_backward_data",
    "aten._log_softmax_backward_data",
];

/// Row-wise operators that are nonlinear (every argument of degree 0); a `dim` argument must
/// not be the batch dim.
const NONLINEAR: &[&str] = &[
    "aten.pow",
    "aten.abs",
    "aten.reciprocal",
    "aten.relu",
    "aten.silu",
    "aten.gelu",
    "aten.sigmoid",
    "aten.tanh",
    "aten.exp",
    "aten.log",
    "aten.sqrt",
    "aten.rsqrt",
    "aten.sin",
    "aten.cos",
    "aten.erf",
    "aten.maximum",
    "aten.minimum",
    "aten.where",
    "aten.masked_fill",
    "aten.eq",
    "aten.ne",
    "aten.lt",
    "aten.le",
    "aten.gt",
    "aten.ge",
    "aten.logical_not",
    "aten._softmax",
    "aten._log_softmax",
    "aten.triu",
    "aten.tril",
];

/// Classes of batch-free values under a linear operator: `+` (`add`) or `×` by a coefficient.
fn add_global(a: Cls, b: Cls) -> Option<Cls> {
    use Cls::*;
    Some(match (a, b) {
        (Free, Free) => Free,
        (Global, Global) => Global,
        (RSum, RSum) => RSum,
        (Free, Global) | (Global, Free) => Affine,
        (Affine, Free | Global | Affine) | (Free | Global, Affine) => Affine,
        _ => return None,
    })
}

fn mul_global(a: Cls, b: Cls) -> Option<Cls> {
    use Cls::*;
    Some(match (a, b) {
        (Free, x) | (x, Free) if matches!(x, Free | Global | Affine | RSum) => x,
        _ => return None,
    })
}

/// The value arguments of a call node, in order (lists flattened).
fn value_args(node: &shardproof_ir::Node) -> Vec<ValueId> {
    node.inputs()
}

/// (b), (c) on the spec: each value's class, and the literals to rewrite.
#[allow(clippy::type_complexity)]
fn classify_spec(
    case: &Case,
    dims: &GraphDims,
    sizes: &Sizes,
    nv: Var,
    (sharded, scaled): (&HashMap<ValueId, usize>, &HashSet<ValueId>),
    batch_rows: u64,
    d: usize,
) -> Result<(HashMap<ValueId, Cls>, Vec<LitRewrite>), String> {
    let g = &case.spec;
    let reg = Registry::builtin();
    let metas = shardproof_interp::infer_graph(g, &case.ops).metas;
    let mut cls: HashMap<ValueId, Cls> = HashMap::new();
    let mut lits = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let here = || rules::location(g, i);
        let outs: Vec<ValueId> = (0..node.outputs.len())
            .map(|k| ValueId::new(i, k))
            .collect();
        let mut bd = Vec::new();
        for &v in &outs {
            bd.push(
                batch_dim(dims, sizes, nv, v)
                    .map_err(|_| format!("(b) {}: two dims hold the batch", here()))?,
            );
        }
        let (op, args, kwargs) = match &node.kind {
            NodeKind::Input => {
                let v = ValueId::new(i, 0);
                cls.insert(
                    v,
                    if scaled.contains(&v) {
                        // Read as `γ/N` (the proof is for every input, so for every `γ`):
                        // every rank reads its rows only times a multiple of `n`, which is
                        // `k·γ/b`, free of `n` (section 2, scaled cuts).
                        Cls::Local(1)
                    } else if sharded.contains_key(&v) {
                        Cls::Local(0)
                    } else {
                        Cls::Free
                    },
                );
                if !sharded.contains_key(&v) && bd[0].is_some() {
                    return Err(format!(
                        "(b) {}: a replicated input carries the batch",
                        here()
                    ));
                }
                continue;
            }
            NodeKind::Constant { .. } => {
                cls.insert(ValueId::new(i, 0), Cls::Free);
                continue;
            }
            NodeKind::Call { op, args, kwargs } => (op, args, kwargs),
        };
        let base = op.base();
        let b = base.as_str();
        let def = reg
            .get(op)
            .ok_or_else(|| format!("(b) {}: unknown operator", here()))?;
        let mv = MetaValues(&metas);
        let bound = Args::bind(&def.schema, args, kwargs, &mv)
            .map_err(|e| format!("(b) {}: {e}", here()))?;
        if !matches!(def.class, OpClass::Pure | OpClass::Wait) {
            return Err(format!(
                "(b) {}: a {:?} operator in the spec",
                here(),
                def.class
            ));
        }
        let get =
            |name: &str| -> Option<Arg> { def.schema.index_of(name).and_then(|_| bound.get(name)) };
        let ins = value_args(node);
        let ic: Vec<Cls> = ins.iter().map(|v| cls[v]).collect();
        let ib: Vec<Option<usize>> = ins
            .iter()
            .map(|&v| batch_dim(dims, sizes, nv, v).unwrap_or(None))
            .collect();
        let rows_in = ic.iter().any(|c| matches!(c, Cls::Local(_)));
        let rows_out = bd.iter().any(Option::is_some);
        let bad = |what: &str| Err(format!("{what} at {}", here()));
        let dim_arg = |name: &str, v: usize| -> Option<usize> {
            let rank = metas
                .get(ins[v].node)?
                .get(ins[v].output)?
                .as_ref()?
                .shape
                .len();
            get(name)?.as_int().and_then(|x| norm_dim(x, rank))
        };
        // Reading the batch back into the rows after a reduction (or a count anywhere but
        // the loss's backward) is neither row-wise nor linear.
        let mixes = rows_in && ic.iter().any(|c| matches!(c, Cls::Global | Cls::Affine));
        if mixes {
            return bad(
                "(b) a statistic over the batch is read back row by row (a batch statistic)",
            );
        }
        let out = if b == "aten.nll_loss_forward" {
            if get("reduction").and_then(|a| a.as_int()) != Some(1)
                || get("weight").is_some()
                || ic.iter().any(|&c| c != Cls::Local(0))
                || ib.first().copied().flatten() != Some(0)
            {
                return bad("(c) an nll_loss that is not a mean over the batch's rows");
            }
            if case.assume.ignore_index_unused.is_none() {
                return bad("(c) nll_loss's mean counts the targets not ignored (a batch statistic) without `assume: ignore-index: unused`");
            }
            cls.insert(outs[0], Cls::Global);
            if outs.len() > 1 {
                cls.insert(outs[1], Cls::Count);
            }
            continue;
        } else if b == "aten.nll_loss_backward" {
            let ok = get("reduction").and_then(|a| a.as_int()) == Some(1)
                && get("weight").is_none()
                && ic.first() == Some(&Cls::Free)
                && ic.get(1) == Some(&Cls::Local(0))
                && ic.get(2) == Some(&Cls::Local(0))
                && ic.get(3) == Some(&Cls::Count)
                && case.assume.ignore_index_unused.is_some();
            if !ok {
                return bad("(c) an nll_loss backward that is not the mean loss's");
            }
            Cls::Local(1)
        } else if ic.contains(&Cls::Count) {
            return bad("(c) the count of the batch's targets is read");
        } else if b.starts_with("_c10d_functional.") && b != "_c10d_functional.wait_tensor" {
            return bad("(b) a collective in the spec");
        } else if matches!(
            b,
            "aten.full" | "aten.zeros" | "aten.ones" | "aten.empty" | "aten.scalar_tensor"
        ) {
            // A constant fill is the same in every row.
            if rows_out {
                Cls::Local(0)
            } else {
                Cls::Free
            }
        } else if b == "aten.arange" {
            if rows_out {
                return bad("(b) an arange along the batch");
            }
            Cls::Free
        } else if !rows_in {
            // Batch-free values: Free, or (affine in) a mean over the batch.
            if rows_out {
                if b == "aten.expand" && ic.iter().all(|&c| c == Cls::Free) {
                    // A batch-free tensor broadcast over the rows is the same in every row.
                    Cls::Local(0)
                } else {
                    return bad("(b) the batch appears from batch-free values");
                }
            } else {
                global_rule(b, &ic, &get).ok_or_else(|| {
                    format!(
                        "(c) {b} is not affine in the mean over the batch at {}",
                        here()
                    )
                })?
            }
        } else if rows_in && !rows_out {
            // A reduction over the batch: only a mean of per-row terms.
            match b {
                "aten.mean" if ic[0] == Cls::Local(0) => Cls::Global,
                "aten.sum" if ic[0] == Cls::Local(1) => Cls::Global,
                "aten.mm" | "aten.bmm" => {
                    let deg: u8 = ic.iter().map(|c| degree(*c)).sum();
                    let contracted = match b {
                        "aten.mm" => ib.first() == Some(&Some(1)) && ib.get(1) == Some(&Some(0)),
                        _ => ib.first() == Some(&Some(2)) && ib.get(1) == Some(&Some(1)),
                    };
                    if !contracted || deg != 1 || ic.iter().any(|c| !matches!(c, Cls::Local(_))) {
                        return bad("(c) a product over the batch that is not a mean of per-row terms");
                    }
                    Cls::Global
                }
                "aten.embedding_dense_backward"
                    if ic.first() == Some(&Cls::Local(1)) && ic.get(1) == Some(&Cls::Local(0)) =>
                {
                    Cls::Global
                }
                "aten.sum" => {
                    return bad("(c) a sum over the batch without the mean's 1/N (not a mean over the replicas)")
                }
                _ => return bad(&format!("(b) {b} reduces over the batch (a batch statistic)")),
            }
        } else {
            // Row-wise: the batch is carried through.
            let deg = |c: &Cls| degree(*c);
            if MOVEMENT.contains(&b) {
                let x = ib.first().copied();
                match b {
                    "aten.view" | "aten._unsafe_view" | "aten.reshape" => {
                        let outer = |v: ValueId, k: Option<usize>| -> bool {
                            let Some(k) = k else { return false };
                            dims.dims_of(v)
                                .is_some_and(|ds| ds[..k].iter().all(|m| sizes.original(m) == 1))
                        };
                        if !outer(ins[0], x.flatten()) || !outer(outs[0], bd[0]) {
                            return bad("(b) a reshape with the batch not its outermost factor");
                        }
                    }
                    "aten.slice" | "aten.split" | "aten.split_with_sizes"
                        if dim_arg("dim", 0) == ib[0] =>
                    {
                        return bad("(b) a slice along the batch");
                    }
                    "aten.cat" => {
                        let rank = metas[i][0].as_ref().map_or(0, |m| m.shape.len());
                        let dim = get("dim").and_then(|a| a.as_int()).unwrap_or(0);
                        if norm_dim(dim, rank) == bd[0] || ic.iter().any(|c| *c != ic[0]) {
                            return bad("(b) a concatenation along the batch or of rows with batch-free values");
                        }
                    }
                    _ => {}
                }
                ic[0]
            } else if b == "aten.embedding" {
                // Each row looks up its own indices in a batch-free table.
                if ic.first() != Some(&Cls::Free) || ic.get(1) != Some(&Cls::Local(0)) {
                    return bad("(b) an embedding whose table holds the batch");
                }
                Cls::Local(0)
            } else if matches!(b, "aten.add" | "aten.sub" | "aten.rsub") {
                let degs: Vec<u8> = ic.iter().map(deg).collect();
                if degs[0] > 0 && nonzero_scalar(&get) {
                    return bad("(c) a constant added to a 1/N-scaled row");
                }
                if degs.iter().any(|&x| x != degs[0]) {
                    return bad("(c) a sum of terms with and without the batch's 1/N scale");
                }
                if degs[0] > 0 && ic.contains(&Cls::Free) {
                    return bad("(c) a batch-free term added to a 1/N-scaled row");
                }
                Cls::Local(degs[0])
            } else if matches!(b, "aten.mul" | "aten.div") {
                let mut total: u8 = ic.iter().map(deg).sum();
                if b == "aten.div" && ic.len() == 2 && deg(&ic[1]) > 0 {
                    return bad("(c) a division by a 1/N-scaled value");
                }
                if ic.len() == 1 && total == 0 {
                    // A literal that is a multiple of the batch size carries its 1/N.
                    if let Some(x) = get("other").and_then(|a| a.as_f64()) {
                        let recip = b == "aten.div";
                        if let Some((mult, new)) = scaled_literal(x, batch_rows, d) {
                            if mult == recip {
                                total = 1;
                                let pos = def.schema.index_of("other").unwrap_or(1);
                                if pos < args.len() {
                                    lits.push(LitRewrite {
                                        node: i,
                                        arg: pos,
                                        old: x,
                                        new,
                                    });
                                } else {
                                    return bad("(c) a batch-size literal passed by keyword");
                                }
                            }
                        }
                    }
                }
                if total > 1 {
                    return bad("(c) a product of two 1/N-scaled values (not linear in the mean)");
                }
                Cls::Local(total)
            } else if matches!(b, "aten.mm" | "aten.bmm") {
                let contracted = match b {
                    "aten.mm" => ib.first() == Some(&Some(1)) || ib.get(1) == Some(&Some(0)),
                    _ => ib.first() == Some(&Some(2)) || ib.get(1) == Some(&Some(1)),
                };
                if contracted {
                    return bad("(b) a product contracting the batch with more left");
                }
                let total: u8 = ic.iter().map(deg).sum();
                if total > 1 {
                    return bad("(c) a product of two 1/N-scaled values");
                }
                Cls::Local(total)
            } else if matches!(b, "aten.sum" | "aten.mean") {
                // Not over the batch (it is still there).
                Cls::Local(deg(&ic[0]))
            } else if LINEAR_FIRST.contains(&b) {
                if ic[1..].iter().any(|c| deg(c) > 0) {
                    return bad("(c) a backward whose coefficients carry the 1/N scale");
                }
                if matches!(
                    b,
                    "aten._softmax_backward_data" | "aten._log_softmax_backward_data"
                ) && dim_arg("dim", 0) == ib[0]
                {
                    return bad("(b) a softmax backward along the batch");
                }
                ic[0]
            } else if NONLINEAR.contains(&b) || b == "aten.amax" || b == "aten.amin" {
                if b == "aten.masked_fill"
                    && get("value").and_then(|a| a.as_f64()) == Some(0.0)
                    && ic[1..].iter().all(|c| deg(c) == 0)
                {
                    ic[0]
                } else {
                    if ic.iter().any(|c| deg(c) > 0) {
                        return bad(&format!(
                            "(c) {b} of a 1/N-scaled value (not linear in the mean)"
                        ));
                    }
                    if matches!(b, "aten._softmax" | "aten._log_softmax")
                        && dim_arg("dim", 0) == ib[0]
                    {
                        return bad("(b) a softmax along the batch");
                    }
                    if matches!(b, "aten.triu" | "aten.tril") {
                        let r = ib[0].unwrap_or(0);
                        let rank = metas[i][0].as_ref().map_or(0, |m| m.shape.len());
                        if r + 2 >= rank {
                            return bad("(b) a triangular mask over the batch");
                        }
                    }
                    Cls::Local(0)
                }
            } else {
                return bad(&format!(
                    "(b) {b} is not known to be row-wise along the batch"
                ));
            }
        };
        for &v in &outs {
            cls.insert(v, out);
        }
    }
    Ok((cls, lits))
}

fn degree(c: Cls) -> u8 {
    match c {
        Cls::Local(k) => k,
        _ => 0,
    }
}

/// The class of a batch-free operator's output from its inputs' classes: anything of
/// batch-free values, linear maps of means, or `None` where it is not affine in them.
fn global_rule(b: &str, ic: &[Cls], get: &dyn Fn(&str) -> Option<Arg>) -> Option<Cls> {
    if ic.iter().all(|&c| c == Cls::Free) {
        return Some(Cls::Free);
    }
    if ic
        .iter()
        .any(|c| !matches!(c, Cls::Free | Cls::Global | Cls::Affine | Cls::RSum))
    {
        return None;
    }
    if MOVEMENT.contains(&b) || matches!(b, "aten.sum" | "aten.mean") {
        return ic.iter().copied().try_fold(ic[0], add_global_same);
    }
    match b {
        "aten.add" | "aten.sub" | "aten.rsub" => {
            // A scalar operand is a batch-free term.
            let first = if nonzero_scalar(get) {
                add_global(ic[0], Cls::Free)?
            } else {
                ic[0]
            };
            ic.iter().skip(1).try_fold(first, |a, &c| add_global(a, c))
        }
        "aten.mul" | "aten.mm" | "aten.bmm" => {
            ic.iter().skip(1).try_fold(ic[0], |a, &c| mul_global(a, c))
        }
        "aten.div" => {
            if ic.len() == 2 && ic[1] != Cls::Free {
                return None;
            }
            Some(ic[0])
        }
        "aten.addmm" => {
            // bias + mat1 @ mat2
            let prod = mul_global(ic[1], ic[2])?;
            add_global(ic[0], prod)
        }
        _ => None,
    }
}

/// Whether an `add`/`sub`/`rsub` has a nonzero scalar (not tensor) operand `other`.
fn nonzero_scalar(get: &dyn Fn(&str) -> Option<Arg>) -> bool {
    get("other")
        .and_then(|a| a.as_f64())
        .is_some_and(|x| x != 0.0)
}

/// A movement of several operands (cat): all of one class.
fn add_global_same(a: Cls, b: Cls) -> Option<Cls> {
    (a == b).then_some(a)
}

/// (c) on a rank graph: each value's class, the mesh-size literals to rewrite, and the
/// rewrites of divisions by a replica count that only an output reads (applied where that
/// output's spec rows carry one 1/N).
#[allow(clippy::type_complexity)]
fn classify_rank(
    case: &Case,
    r: usize,
    gdim: usize,
    d: usize,
    scaled: &HashSet<ValueId>,
    msgs: &mut Messages,
) -> Result<RankClasses, Stop> {
    let g = &case.program.ranks[r];
    let mesh = &case.program.mesh;
    let reg = Registry::builtin();
    let metas = shardproof_interp::infer_graph(g, &case.ops).metas;
    let mut cls: HashMap<ValueId, Cls> = HashMap::new();
    let mut lits = Vec::new();
    let mut pending = HashMap::new();
    let read = readers(g);
    let spans_dp = |name: &str| -> Option<bool> {
        let grp = case.program.group(name)?;
        let set = grp.group_of(r)?;
        let mut along: Vec<usize> = set.iter().map(|&x| mesh.coords(x)[gdim]).collect();
        along.sort_unstable();
        along.dedup();
        Some(along.len() > 1)
    };
    for (i, node) in g.nodes.iter().enumerate() {
        let here = || format!("rank {r} {}", rules::location(g, i));
        let outs: Vec<ValueId> = (0..node.outputs.len())
            .map(|k| ValueId::new(i, k))
            .collect();
        let (op, args, kwargs) = match &node.kind {
            NodeKind::Input => {
                let v = ValueId::new(i, 0);
                let rel = case
                    .inputs
                    .iter()
                    .find(|rel| rel.rank_values.iter().any(|&(rr, rv)| rr == r && rv == v));
                let c = match rel {
                    Some(rel) if scaled.contains(&rel.spec_value) => Cls::RInv,
                    Some(rel) => match placement_along(&rel.layout, gdim, &rel.spec_name)? {
                        Placement::Shard(_) => Cls::RLocal,
                        _ => Cls::Free,
                    },
                    None => {
                        return Err(Stop::Fails(format!(
                            "(a) {}: an input the case does not lay out",
                            here()
                        )))
                    }
                };
                cls.insert(v, c);
                continue;
            }
            NodeKind::Constant { .. } => {
                cls.insert(ValueId::new(i, 0), Cls::Free);
                continue;
            }
            NodeKind::Call { op, args, kwargs } => (op, args, kwargs),
        };
        let base = op.base();
        let b = base.as_str();
        let def = reg
            .get(op)
            .ok_or_else(|| format!("(c) {}: unknown operator", here()))?;
        let mv = MetaValues(&metas);
        let bound = Args::bind(&def.schema, args, kwargs, &mv)
            .map_err(|e| format!("(c) {}: {e}", here()))?;
        match def.class {
            OpClass::Pure | OpClass::Wait => {}
            OpClass::Collective if b.starts_with("_c10d_functional.") => {}
            OpClass::PointToPoint => {
                // A send's result is the posted value; a recv's buffer is the value its
                // sender posted, on the same replica (`replica_messages`).
                let c = if b == "shardproof_p2p.send" {
                    let x = node
                        .inputs()
                        .first()
                        .copied()
                        .ok_or_else(|| format!("(a) {}: a send of nothing", here()))?;
                    let c = cls[&x];
                    msgs.sent.insert((r, i), c);
                    c
                } else {
                    let from = msgs
                        .pairs
                        .get(&(r, i))
                        .ok_or_else(|| format!("(a) {}: a recv no rank sends to", here()))?;
                    match msgs.sent.get(from) {
                        Some(&c) => c,
                        None => return Err(Stop::Blocked),
                    }
                };
                for &v in &outs {
                    cls.insert(v, c);
                }
                continue;
            }
            other => {
                // Messages between ranks and random draws are not compared across replicas.
                return Err(Stop::Fails(format!("(a) {}: a {other:?} operator", here())));
            }
        }
        let get =
            |name: &str| -> Option<Arg> { def.schema.index_of(name).and_then(|_| bound.get(name)) };
        let ins = value_args(node);
        let ic: Vec<Cls> = ins.iter().map(|v| cls[v]).collect();
        let bad = |what: &str| Err(Stop::Fails(format!("{what} at {}", here())));
        let local = ic.iter().all(|c| matches!(c, Cls::Free | Cls::RLocal));
        // A multiplication or division by a whole multiple `k·D` of the replica count: its
        // rewrite to `k·2`.
        let replica_literal = |times: bool| -> Option<LitRewrite> {
            if ic.len() != 1 || !matches!(b, "aten.mul" | "aten.div") {
                return None;
            }
            let x = get("other").and_then(|a| a.as_f64())?;
            let (mult, new) = scaled_literal(x, d as u64, d)?;
            let pos = def.schema.index_of("other").unwrap_or(1);
            (mult == (times == (b == "aten.mul")) && pos < args.len()).then_some(LitRewrite {
                node: i,
                arg: pos,
                old: x,
                new,
            })
        };
        let out = if ic.contains(&Cls::RInv) {
            // A scaled cut's input, read times `k·n`: `k·γ/b`, the rank's own rows' value.
            match replica_literal(true) {
                Some(l) => {
                    lits.push(l);
                    Cls::RLocal
                }
                None => return bad("(c) a scaled cut read otherwise than times a replica count"),
            }
        } else if local
            && ic.contains(&Cls::RLocal)
            && outs.len() == 1
            && read[outs[0].node] == 0
            && replica_literal(false).is_some()
        {
            // The rank's own rows divided by `k·n`, read by nothing but an output: whether its
            // constant is a replica count depends on that output's spec rows (see `build`).
            pending.insert(outs[0], replica_literal(false).expect("checked"));
            Cls::RInv
        } else if b.starts_with("_c10d_functional.") && b != "_c10d_functional.wait_tensor" {
            let group = match get("group_name").or_else(|| get("group")) {
                Some(Arg::Str(s)) => s,
                _ => args
                    .iter()
                    .rev()
                    .find_map(|a| match a {
                        Arg::Str(s) => Some(s.clone()),
                        _ => None,
                    })
                    .unwrap_or_default(),
            };
            let Some(dp) = spans_dp(&group) else {
                return bad("(a) a collective over an unknown group");
            };
            let reduce = get("reduceOp")
                .or_else(|| get("reduce_op"))
                .and_then(|a| match a {
                    Arg::Str(s) => Some(s.to_lowercase()),
                    _ => None,
                });
            if !dp {
                // Over other mesh dims the replicas do not meet.
                if local {
                    if ic.contains(&Cls::RLocal) {
                        Cls::RLocal
                    } else {
                        Cls::Free
                    }
                } else if b == "_c10d_functional.all_reduce" && reduce.as_deref() == Some("sum") {
                    ic[0]
                } else {
                    return bad("(c) a collective other than a sum over a value reduced over dp");
                }
            } else if b != "_c10d_functional.all_reduce" {
                return bad(&format!("(c) {b} over dp (only all_reduce is reduced)"));
            } else if !local {
                return bad("(c) a second all_reduce over dp");
            } else {
                match reduce.as_deref() {
                    Some("sum") => Cls::RSum,
                    Some("avg") => Cls::Global,
                    _ => return bad("(c) an all_reduce over dp that is not a sum or a mean"),
                }
            }
        } else if local {
            // Anything of the rank's own rows is independent of the replica count.
            if ic.contains(&Cls::RLocal) {
                Cls::RLocal
            } else {
                Cls::Free
            }
        } else if ic.contains(&Cls::RLocal) {
            return bad("(c) a value summed over dp is read back into the rank's own rows");
        } else if ic.contains(&Cls::RSum) && matches!(b, "aten.div" | "aten.mul") && ic.len() == 1 {
            // The division of the sum by the replica count makes it a mean.
            let x = get("other").and_then(|a| a.as_f64());
            match x.and_then(|x| scaled_literal(x, d as u64, d).map(|s| (x, s))) {
                Some((x, (mult, new))) if mult == (b == "aten.div") => {
                    let pos = def.schema.index_of("other").unwrap_or(1);
                    if pos >= args.len() {
                        return bad("(c) a mesh-size literal passed by keyword");
                    }
                    lits.push(LitRewrite {
                        node: i,
                        arg: pos,
                        old: x,
                        new,
                    });
                    Cls::Global
                }
                _ => Cls::RSum,
            }
        } else {
            global_rule(b, &ic, &get)
                .ok_or_else(|| format!("(c) {b} is not affine in the mean over dp at {}", here()))?
        };
        for &v in &outs {
            cls.insert(v, out);
        }
    }
    Ok((cls, lits, pending))
}

/// The messages of the case as the interpreter pairs them (recv (rank, node) -> send (rank,
/// node)), checked to stay within one dp replica and to be the same at every replica: the
/// message a rank receives is, moved to dp coordinate 0, the one its replica-0 rank receives.
/// Then a value received on replica 0 stands for the value received on every replica, and
/// classes carried along replica 0's messages are every replica's (condition (a)). Empty
/// where no graph has a point-to-point call.
fn replica_messages(case: &Case, g: usize, base_of: &[usize]) -> Result<Pairs, String> {
    let ranks = &case.program.ranks;
    let first = shardproof_interp::first_equal(ranks);
    let any = (0..ranks.len()).any(|r| first[r] == r && super::has_point_to_point(&ranks[r]));
    if !any {
        return Ok(Default::default());
    }
    let sched = shardproof_interp::schedule(&case.program, &case.ops, None);
    if let Some(p) = &sched.problem {
        return Err(format!(
            "(a) the point-to-point messages do not pair: {}",
            p.message()
        ));
    }
    let mesh = &case.program.mesh;
    for (&(rr, ri), &(sr, si)) in &sched.messages {
        if mesh.coords(rr)[g] != mesh.coords(sr)[g] {
            return Err(format!(
                "(a) rank {rr} receives a message from rank {sr}, another dp replica"
            ));
        }
        if sched.messages.get(&(base_of[rr], ri)) != Some(&(base_of[sr], si)) {
            return Err(format!(
                "(a) rank {rr}'s message from rank {sr} is not the one its replica-0 rank {} receives",
                base_of[rr]
            ));
        }
    }
    Ok(sched.messages)
}

/// Point-to-point messages: recv (rank, node) -> send (rank, node).
type Pairs = std::collections::BTreeMap<(usize, usize), (usize, usize)>;

/// The point-to-point state of [`classify_ranks`]: the pairing, and the class of every
/// posted value classified so far, by (replica-0 rank, send node).
struct Messages<'a> {
    pairs: &'a Pairs,
    sent: HashMap<(usize, usize), Cls>,
}

/// Why a rank's classification stopped.
enum Stop {
    /// A condition fails, in words.
    Fails(String),
    /// A recv whose send is not classified yet.
    Blocked,
}

impl From<String> for Stop {
    fn from(why: String) -> Self {
        Stop::Fails(why)
    }
}

/// The classification of every replica-0 rank, passes repeated while a blocked rank's senders
/// make progress (a pipeline's later stages wait for the earlier ones, and a 1F1B schedule's
/// backward messages for the later stages). A rank still blocked when no pass makes progress
/// is left out.
fn classify_ranks(
    case: &Case,
    base_of: &[usize],
    g: usize,
    d: usize,
    scaled: &HashSet<ValueId>,
    pairs: &Pairs,
) -> HashMap<usize, Result<RankClasses, String>> {
    let bases: Vec<usize> = (0..base_of.len()).filter(|&r| base_of[r] == r).collect();
    let mut msgs = Messages {
        pairs,
        sent: HashMap::new(),
    };
    let mut out = HashMap::new();
    loop {
        let mut progressed = false;
        for &r in &bases {
            if out.contains_key(&r) {
                continue;
            }
            let known = msgs.sent.len();
            match classify_rank(case, r, g, d, scaled, &mut msgs) {
                Ok(c) => {
                    out.insert(r, Ok(c));
                }
                Err(Stop::Fails(why)) => {
                    out.insert(r, Err(why));
                }
                Err(Stop::Blocked) => {
                    progressed |= msgs.sent.len() > known;
                    continue;
                }
            }
            progressed = true;
        }
        if out.len() == bases.len() || !progressed {
            return out;
        }
    }
}

/// A rank's classes, its literal rewrites, and those pending on an output's spec class.
type RankClasses = (
    HashMap<ValueId, Cls>,
    Vec<LitRewrite>,
    HashMap<ValueId, LitRewrite>,
);

/// How many call arguments read each node's values.
fn readers(g: &Graph) -> Vec<usize> {
    let mut n = vec![0; g.nodes.len()];
    for node in &g.nodes {
        for v in node.inputs() {
            n[v.node] += 1;
        }
    }
    n
}

/// The spec inputs sharded along dp that every rank holding them reads only times a whole
/// multiple `k·D` of the replica count (`mul(x, k·D)`, as a scaled cut's stage writes them;
/// `stage::scale`), and never returns: a data-parallel rank's activation gradient, which is
/// `D` times the spec's rows. Their spec rows are read as carrying one 1/N.
fn scaled_inputs(case: &Case, sharded: &HashMap<ValueId, usize>, d: usize) -> HashSet<ValueId> {
    let mut out = HashSet::new();
    for rel in &case.inputs {
        if !sharded.contains_key(&rel.spec_value) || rel.rank_values.is_empty() {
            continue;
        }
        let all = rel.rank_values.iter().all(|&(r, v)| {
            let g = &case.program.ranks[r];
            let mut any = false;
            let returned = g.outputs.iter().flatten().any(|o| *o == v);
            let only = g.nodes.iter().all(|n| {
                if !n.inputs().contains(&v) {
                    return true;
                }
                any = true;
                let NodeKind::Call { op, args, kwargs } = &n.kind else {
                    return false;
                };
                let times = match args.as_slice() {
                    [Arg::Value(x), lit] if *x == v && kwargs.is_empty() => {
                        lit.as_f64().and_then(|c| scaled_literal(c, d as u64, d))
                    }
                    _ => None,
                };
                matches!(
                    (op.base().as_str(), times),
                    ("aten.mul", Some((true, _))) | ("aten.div", Some((false, _)))
                )
            });
            any && only && !returned
        });
        if all {
            out.insert(rel.spec_value);
        }
    }
    out
}
