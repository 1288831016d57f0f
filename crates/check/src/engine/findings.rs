//! What the propagation driver asks per call besides the rules: the loss's terms (a backward
//! all-reduce's license), zero tensors, shards of one dim over two mesh dims, the wording
//! of a rule's violation as a finding, and of a call left `Unknown` without one.

use super::{RankPlacements, Shared, NONE};
use crate::place::{Place, Red};
use crate::report::{Check, RawFinding};
use crate::rules::{self, Exempt, Hint, Kind, Violation};
use shardproof_ir::{Arg, DecompExpr, Graph, NodeKind, OpMeaning, OpName, ValueId};
use shardproof_ops::{Args, Meta};
use std::collections::HashMap;

/// A rank's loss summed over groups: where the rank's loss is its term of a sum over a group
/// (`loss = all_reduce(local_loss, sum, g) / n`), its backward differentiates its own term,
/// and the backward of a forward all-reduce over `g` is an all-reduce of the gradient (PyTorch's
/// autograd of `all_reduce`): each rank's replicated gradient is one term of the sum.
pub(super) struct LossTerms {
    /// Per node: an ancestor of the loss (the forward).
    forward: Vec<bool>,
    /// Groups the loss is summed over, with the number of the forward's all-reduces (sum) over
    /// each on non-scalar tensors: the backward all-reduces they license.
    groups: HashMap<String, usize>,
}

impl LossTerms {
    pub(super) fn of(g: &Graph, metas: &[Vec<Option<Meta>>]) -> LossTerms {
        let n = g.nodes.len();
        let meta = |v: ValueId| {
            metas
                .get(v.node)
                .and_then(|o| o.get(v.output))
                .cloned()
                .flatten()
        };
        let mut forward = vec![false; n];
        let mut groups = HashMap::new();
        let loss = g
            .outputs
            .iter()
            .flatten()
            .copied()
            .find(|&v| meta(v).is_some_and(|m| m.shape.is_empty() && m.dtype.is_float()));
        let Some(loss) = loss else {
            return LossTerms { forward, groups };
        };
        forward[loss.node] = true;
        for i in (0..n).rev() {
            if forward[i] {
                for v in g.nodes[i].inputs() {
                    forward[v.node] = true;
                }
            }
        }
        let all_reduce_sum = |i: usize| -> Option<(String, bool)> {
            let node = &g.nodes[i];
            let NodeKind::Call { op, args, .. } = &node.kind else {
                return None;
            };
            if op.namespace != "_c10d_functional" || op.name != "all_reduce" {
                return None;
            }
            if args.get(1).and_then(|a| match a {
                Arg::Str(s) => Some(s.as_str()),
                _ => None,
            }) != Some("sum")
            {
                return None;
            }
            let Some(Arg::Str(group)) = args.get(2) else {
                return None;
            };
            let scalar = node
                .inputs()
                .first()
                .and_then(|&v| meta(v))
                .is_some_and(|m| m.shape.is_empty());
            Some((group.clone(), scalar))
        };
        // The loss is the group's sum of the ranks' terms only when it is that all-reduce,
        // waited, maybe scaled by a number or copied: a loss that adds other terms after it
        // (a replicated cross-entropy plus the shares of an auxiliary loss) is no rank's term.
        let mut v = loss.node;
        loop {
            if let Some((group, true)) = all_reduce_sum(v) {
                groups.insert(group, 0);
                break;
            }
            let node = &g.nodes[v];
            let passes = node.op().is_some_and(|op| {
                matches!(
                    op.name.as_str(),
                    "wait_tensor" | "div" | "mul" | "clone" | "view" | "_to_copy" | "alias"
                )
            }) && node.inputs().len() == 1;
            match node.inputs().first() {
                Some(x) if passes => v = x.node,
                _ => break,
            }
        }
        for i in (0..n).filter(|&i| forward[i]) {
            if let Some((group, false)) = all_reduce_sum(i) {
                if let Some(k) = groups.get_mut(&group) {
                    *k += 1;
                }
            }
        }
        LossTerms { forward, groups }
    }

    /// Whether node `i`, an all-reduce (sum) over `group` of a replicated tensor, is in the
    /// backward of a loss summed over `group` and still has a forward all-reduce to be the
    /// dual of (`used` counts the ones taken).
    pub(super) fn backward_dual(
        &self,
        i: usize,
        group: &str,
        used: &mut HashMap<String, usize>,
    ) -> bool {
        if self.forward.get(i).copied().unwrap_or(true) {
            return false;
        }
        let Some(&k) = self.groups.get(group) else {
            return false;
        };
        let u = used.entry(group.to_string()).or_insert(0);
        if *u < k {
            *u += 1;
            true
        } else {
            false
        }
    }
}

/// Whether a call's outputs hold only zeros: a creation with fill 0 (`zeros`, `full(.., 0)`,
/// `zeros_like`, `new_zeros`, `fill(.., 0)`, `zero`), or a copy or view of a zero tensor.
pub(super) fn zero_output(
    name: &str,
    family: &str,
    bound: &Args,
    inputs: &[ValueId],
    rp: &RankPlacements,
) -> bool {
    let literal = |arg: &str| {
        bound
            .schema()
            .index_of(arg)
            .and_then(|_| bound.get(arg))
            .and_then(|a| a.as_f64())
    };
    match name.trim_end_matches('_') {
        "zeros" | "zeros_like" | "new_zeros" | "zero" => true,
        "full" | "full_like" | "new_full" => literal("fill_value") == Some(0.0),
        "fill" => literal("value") == Some(0.0),
        _ => {
            crate::rules::moves_values(family)
                && inputs
                    .first()
                    .is_some_and(|v| rp.zero[rp.offsets[v.node] as usize + v.output])
        }
    }
}

/// The dims along which a call's outputs are known constant (bit `i`: every slice along dim `i`
/// is the same; `u64::MAX`: one literal value in every element, the same on every rank). A
/// creation or fill with a literal value (`ones`, `full(.., v)`, `fill(.., v)`, and every zero
/// of [`zero_output`]) is constant along every dim; an `expand` is along the dims it expands
/// (size 1, or new) and those its input was; `unsqueeze`, transposes, permutes and copies move
/// the input's bits; a view keeps only a fill's. Such a tensor is a piece, at any offset, of the
/// same construction of any size along those dims, so a shard may pair with it there. `empty`
/// is not a fill (its elements are whatever the allocator left).
pub(super) fn constant_output(
    name: &str,
    family: &str,
    bound: &Args,
    inputs: &[ValueId],
    rp: &RankPlacements,
    meta_of: &dyn Fn(ValueId) -> Option<Meta>,
    out: Option<&Meta>,
) -> u64 {
    let literal = |arg: &str| {
        bound
            .schema()
            .index_of(arg)
            .and_then(|_| bound.get(arg))
            .and_then(|a| a.as_f64())
    };
    if zero_output(name, family, bound, inputs, rp) {
        return u64::MAX;
    }
    match name.trim_end_matches('_') {
        "ones" | "ones_like" | "new_ones" => return u64::MAX,
        "full" | "full_like" | "new_full" if literal("fill_value").is_some() => return u64::MAX,
        "fill" if literal("value").is_some() => return u64::MAX,
        _ => {}
    }
    let [x] = inputs else { return 0 };
    let m = rp.constant[rp.offsets[x.node] as usize + x.output];
    if m == u64::MAX {
        return if crate::rules::moves_values(family) {
            u64::MAX
        } else {
            0
        };
    }
    let bit = |mask: u64, i: usize| i < 64 && mask & (1 << i) != 0;
    let (Some(xin), Some(out)) = (meta_of(*x), out) else {
        return 0;
    };
    let (k, n) = (xin.shape.len(), out.shape.len());
    let from = |f: &dyn Fn(usize) -> bool| {
        (0..n.min(64))
            .filter(|&i| f(i))
            .fold(0u64, |a, i| a | 1 << i)
    };
    let int = |arg: &str| {
        bound
            .schema()
            .index_of(arg)
            .and_then(|_| bound.get(arg))
            .and_then(|a| a.as_int())
    };
    let norm = |d: i64, r: usize| rules::norm_dim(d, r);
    match family {
        "linear-unary" if k == n => m,
        "expand" if n >= k => {
            let shift = n - k;
            from(&|i| i < shift || xin.shape[i - shift] == 1 || bit(m, i - shift))
        }
        "unsqueeze" if n == k + 1 => match int("dim").and_then(|d| norm(d, n)) {
            Some(d) => from(&|i| i == d || (i < d && bit(m, i)) || (i > d && bit(m, i - 1))),
            None => 0,
        },
        "transpose" if n == k => {
            let (a, b) = if n < 2 {
                (0, 0)
            } else {
                match (int("dim0"), int("dim1")) {
                    (Some(a), Some(b)) => match (norm(a, n), norm(b, n)) {
                        (Some(a), Some(b)) => (a, b),
                        _ => return 0,
                    },
                    _ => (0, 1),
                }
            };
            from(&|i| {
                bit(
                    m,
                    if i == a {
                        b
                    } else if i == b {
                        a
                    } else {
                        i
                    },
                )
            })
        }
        "permute" if n == k => {
            let Some(dims) = bound
                .schema()
                .index_of("dims")
                .and_then(|_| bound.get("dims"))
                .and_then(|a| a.as_int_list())
            else {
                return 0;
            };
            let perm: Option<Vec<usize>> = dims.iter().map(|&d| norm(d, n)).collect();
            match perm {
                Some(p) if p.len() == n => from(&|i| bit(m, p[i])),
                _ => 0,
            }
        }
        _ => 0,
    }
}

/// An element-wise operator whose operands shard one tensor dim over different mesh dims
/// ([`rules::mixed_mesh_shards`]): a `placement-consistency` finding, and the output is
/// `Varying` on those mesh dims (each mesh dim's rule alone called it a shard).
#[allow(clippy::too_many_arguments)]
pub(super) fn mixed_shards(
    sh: &Shared,
    r: usize,
    i: usize,
    inputs: &[ValueId],
    nout: usize,
    nd: usize,
    meta_of: &dyn Fn(ValueId) -> Option<Meta>,
    rp: &mut RankPlacements,
) {
    let ranks: Vec<usize> = inputs
        .iter()
        .map(|&v| meta_of(v).map_or(0, |m| m.shape.len()))
        .collect();
    // Spread rows in every coordinate's own block (positions `arange(k*L, (k+1)*L)`) pair
    // with a plain shard row by row: no finding. The rules still see rows beside a shard
    // (`Varying`, inconclusive): read as a shard, a replicated operand of the local size
    // beside them would be taken for its own tiling, which the positions are not.
    let shard_layout = |p: Place| match p {
        Place::Rows(d, id)
            if sh
                .rows
                .borrow()
                .key(id)
                .is_some_and(|k| crate::rows::spread_is_shard(&k)) =>
        {
            Place::Shard(d)
        }
        p => p,
    };
    let seen: Vec<Vec<Place>> = inputs
        .iter()
        .map(|&v| rp.of(v, nd).iter().map(|&p| shard_layout(p)).collect())
        .collect();
    let args: Vec<(&[Place], usize)> = seen
        .iter()
        .zip(&ranks)
        .map(|(p, &k)| (p.as_slice(), k))
        .collect();
    let out_rank = meta_of(ValueId::new(i, 0)).map_or(0, |m| m.shape.len());
    let Some((dim, mesh_dims)) = rules::mixed_mesh_shards(&args, out_rank) else {
        return;
    };
    let base = rp.offsets[i] as usize;
    // Spread rows of different pieces joined along their dim by a concatenation (the cat rule
    // made the output rows of the joined segments on every such mesh dim): no pairing.
    let joined = mesh_dims.iter().all(|&m| {
        (0..nout).all(|o| match rp.places[(base + o) * nd + m] {
            Place::Rows(d, id) => {
                d as usize == dim
                    && matches!(
                        sh.rows.borrow().key(id),
                        Some(crate::place::RowKey::Spread { .. })
                    )
            }
            _ => false,
        })
    });
    if joined {
        return;
    }
    for o in 0..nout {
        for &m in &mesh_dims {
            let p = &mut rp.places[(base + o) * nd + m];
            if p.blocks().is_some_and(|(d, _)| d == dim) {
                *p = Place::Varying;
            }
        }
    }
    if rp.findings.last().is_some_and(|f| f.node == i) {
        return;
    }
    let names: Vec<&str> = mesh_dims
        .iter()
        .map(|&m| sh.program.mesh.dims[m].0.as_str())
        .collect();
    let v = Violation {
        kind: Kind::Consistency,
        message: format!(
            "pairs operands whose dim {dim} is sharded over different mesh dims ({}): each rank \
             combines pieces the single-device operator never pairs",
            names.join(", ")
        ),
        hint: Hint::Text(format!(
            "shard every operand's dim {dim} over the same mesh dims (all-gather the extra \
             shards, or slice the replicated operand to the same layout)"
        )),
        recover: vec![Place::Varying; nout],
        exempt: Exempt::No,
    };
    let finding = raw_finding(sh, r, i, mesh_dims[0], &v, rp, inputs);
    rp.findings.push(finding);
}

/// The group name that reduces exactly mesh dim `m`, else the dim's name.
pub fn group_name_for(sh: &Shared, m: usize) -> String {
    group_reducing(&sh.groups, &sh.program.mesh, m)
}

/// The first (by name) of `groups` that reduces exactly mesh dim `m`, else the dim's name.
pub(crate) fn group_reducing(
    groups: &HashMap<String, Option<Vec<usize>>>,
    mesh: &shardproof_ir::Mesh,
    m: usize,
) -> String {
    groups
        .iter()
        .filter(|(_, d)| d.as_deref() == Some(&[m][..]))
        .map(|(n, _)| n)
        .min()
        .map_or_else(|| mesh.dims[m].0.clone(), |n| n.clone())
}

pub(super) fn placements_text(sh: &Shared, rp: &RankPlacements, g: &Graph, v: ValueId) -> String {
    let nd = sh.program.mesh.dims.len();
    let ps = rp.of(v, nd);
    let inv = rp.invariant[rp.offsets[v.node] as usize + v.output];
    let body: Vec<String> = sh
        .program
        .mesh
        .dims
        .iter()
        .zip(ps)
        .map(|((name, _), p)| {
            let t = p
                .spmd_type(inv)
                .map_or("?".to_string(), |t| format!("{t:?}"));
            format!("{name}: {p} [{t}]")
        })
        .collect();
    let sizes: Vec<usize> = sh.program.mesh.dims.iter().map(|d| d.1).collect();
    // A local mean's pieces are not the spec's: the placements say so with their factor.
    let pieces = match rp.piece_factor(v, &sizes) {
        super::PieceFactor::Spec => String::new(),
        super::PieceFactor::Times(f) => {
            format!(", pieces {f} times the spec's (local means)")
        }
        super::PieceFactor::NotKnown => {
            ", pieces the spec's times a factor not known (local means or a scaling)".to_string()
        }
    };
    format!("`{}` {{{}}}{pieces}", g.value_name(v), body.join(", "))
}

pub(super) fn raw_finding(
    sh: &Shared,
    r: usize,
    i: usize,
    m: usize,
    v: &Violation,
    rp: &RankPlacements,
    inputs: &[ValueId],
) -> RawFinding {
    let g = &sh.program.ranks[r];
    let nd = sh.program.mesh.dims.len();
    let dim = &sh.program.mesh.dims[m].0;
    let node = &g.nodes[i];
    let check = match v.kind {
        Kind::Spmd => Check::SpmdType,
        Kind::Consistency => Check::PlacementConsistency,
        Kind::Legality => Check::CommLegality,
        Kind::Shape => Check::ShapeDivisibility,
    };
    let mut seen = Vec::new();
    let placements: Vec<String> = inputs
        .iter()
        .filter(|v| {
            let new = !seen.contains(*v);
            seen.push(**v);
            new
        })
        .map(|&v| placements_text(sh, rp, g, v))
        .collect();
    let hint = match &v.hint {
        Hint::ReducePartial => {
            let partial = inputs.iter().find(|&&x| rp.of(x, nd)[m].is_partial());
            match partial {
                Some(&x) => {
                    let red = match rp.of(x, nd)[m] {
                        Place::Partial(r) => r,
                        _ => Red::Sum,
                    };
                    let o = rp.origin[(rp.offsets[x.node] as usize + x.output) * nd + m];
                    let origin = if o == NONE { x.node } else { o as usize };
                    let on = &g.nodes[origin];
                    let at = on
                        .loc
                        .as_ref()
                        .map(|l| format!(", {}:{}", l.file, l.line))
                        .unwrap_or_default();
                    format!(
                        "insert all_reduce({}) over {} after `{}`{at} (the partial sum over mesh dim `{dim}` begins there)",
                        red.name(),
                        group_name_for(sh, m),
                        on.name
                    )
                }
                None => format!("reduce the partial input over `{dim}` first"),
            }
        }
        Hint::GatherShard => {
            let sharded = inputs
                .iter()
                .find(|&&x| matches!(rp.of(x, nd)[m], Place::Shard(_)));
            match sharded {
                Some(&x) => format!(
                    "all-gather `{}` over {} before `{}`, or keep the dim whole over `{dim}`",
                    g.value_name(x),
                    group_name_for(sh, m),
                    node.name
                ),
                None => format!("keep the dim whole over `{dim}`"),
            }
        }
        Hint::Text(t) => t.clone(),
    };
    RawFinding {
        check,
        rank: r,
        node: i,
        message: format!("on mesh dim `{dim}`: {}", v.message),
        placements,
        hint,
    }
}

/// The operator a declared meaning calls when it only renames it: `Call { op, args: [$0, $1,
/// ...] }` over all `positional` arguments of the call.
pub(super) fn plain_rename(meaning: &OpMeaning, positional: usize) -> Option<&OpName> {
    match meaning {
        OpMeaning::Decompose(DecompExpr::Call { op, args })
            if args.len() == positional
                && args
                    .iter()
                    .enumerate()
                    .all(|(k, a)| *a == DecompExpr::Arg(k)) =>
        {
            Some(op)
        }
        _ => None,
    }
}

/// Why a call left its output `Unknown` on a mesh dim without a finding (the rule's result
/// read `Varying` where it needed a layout), in the words of the rule's family.
pub(super) fn inconclusive_reason(
    op: &OpName,
    family: &str,
    stage_dim: bool,
    dim_name: &str,
) -> String {
    if matches!(
        family,
        "norm" | "norm-backward" | "softmax" | "softmax-backward" | "sort"
    ) {
        format!(
            "`{op}` on mesh dim `{}` normalizes (or sorts) a tensor of \
         unknown layout (`Varying`): its normalized dims may be \
         sharded, not known",
            dim_name
        )
    } else if stage_dim && (family == "all-reduce" || family == "reduce-scatter") {
        // The stages' own tensors are never a shard there: what is
        // missing is the proof that they are shares of one sum.
        format!(
            "`{op}` on mesh dim `{}` sums the pipeline stages' own tensors (`Varying`): \
         whether each is its stage's share of one sum (a tied \
         weight's gradient, a loss term) is not proven",
            dim_name
        )
    } else if family == "all-reduce" || family == "reduce-scatter" {
        format!(
            "`{op}` on mesh dim `{}` reduces a tensor of unknown layout \
         (`Varying`): a partial sum (completed) or a shard (different \
         slices added), not known which",
            dim_name
        )
    } else if family == "all-gather" {
        format!(
            "`{op}` on mesh dim `{}` gathers a tensor of unknown layout \
         (`Varying`): the same data on every rank, in an order not \
         known (a shard's rows in rank order not proven)",
            dim_name
        )
    } else {
        format!(
            "`{op}` on mesh dim `{}` combines a partial sum with a tensor \
         of unknown layout (`Varying`): no placement, and no finding",
            dim_name
        )
    }
}
