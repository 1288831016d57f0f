//! Scalings of partial pieces by a number, relative to the spec's (issue 44): how a `mul` or
//! `div` changes what the pieces combine to, and which other mesh dim's share a division is;
//! what a call's scalings leave on its output (`scaled`, `scale_unknown`, `share_of`), and
//! how a call reads an input that is n times the tensor (`times_n`).

use super::{CallOnDim, RankPlacements, Shared, Skeleton, SkeletonMemo};
use crate::place::{Place, Red};
use crate::rows;
use crate::rules::{self, Violation};
use shardproof_ir::{Arg, Graph, Node, NodeKind, OpName, ValueId};
use shardproof_ops::Args;
use std::collections::HashMap;

/// A scaling by a literal number: the `mul` or `div` operator, the factor, and the output's
/// element count where its shape is known (the spec's: global).
pub type SpecScaling<'a> = (&'a OpName, f64, Option<i64>);

/// A node's scaling by a literal number: a `mul` or `div` whose second argument is a number.
pub(crate) fn scaling_of_node(n: &Node) -> Option<SpecScaling<'_>> {
    let NodeKind::Call { op, args, .. } = &n.kind else {
        return None;
    };
    if !matches!(op.name.as_str(), "mul" | "div") {
        return None;
    }
    let x = args.get(1).and_then(Arg::as_f64)?;
    let numel = n
        .outputs
        .first()
        .and_then(|o| o.ty.as_ref())
        .and_then(|t| t.concrete_shape())
        .map(|s| s.iter().product());
    Some((op, x, numel))
}

/// The fewest skeleton levels (operators deep, graph inputs by name at every level) a rank's
/// scaling must share with the spec's to stand in its place: the operator and three levels
/// of what it scales. A shallower match says only "a `mul` of something".
const POSITION_DEPTH: usize = 4;

/// The spec's scaling that each scaling of rank graph `g` (skeleton `sk`) stands in the place
/// of, by position rather than by node name (issue 44: a pipeline stage names its nodes from
/// 0, so the spec's node of a rank node's name is another node; autograd folds a loss
/// share's 1/n into a constant there, `mul(sum, 0.000416..)` where the spec has
/// `mul(sum, 0.000208..)`). At the deepest skeleton level (at least [`POSITION_DEPTH`]) where
/// some spec scaling of the same operator is alike in structure (confirmed by
/// [`Skeleton::same`], not by hash alone), every such spec scaling must agree on factor and
/// element count (the same layer's scaling in another layer or microbatch), else none is
/// taken. Nodes without such a match are read by name, as before.
pub fn spec_scaling_positions<'a>(
    spec: &'a Graph,
    spec_sk: &Skeleton,
    g: &Graph,
    sk: &Skeleton,
) -> HashMap<u32, SpecScaling<'a>> {
    let mut out = HashMap::new();
    let spec_nodes: Vec<(usize, SpecScaling<'a>)> = spec
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(j, n)| Some((j, scaling_of_node(n)?)))
        .collect();
    if spec_nodes.is_empty() {
        return out;
    }
    let levels = sk.levels.len().min(spec_sk.levels.len());
    let mut by_level: HashMap<(usize, u64), Vec<usize>> = HashMap::new();
    for (k, &(j, _)) in spec_nodes.iter().enumerate() {
        for d in POSITION_DEPTH - 1..levels {
            by_level
                .entry((d, spec_sk.levels[d][j]))
                .or_default()
                .push(k);
        }
    }
    let mut memo = SkeletonMemo::new();
    for (i, n) in g.nodes.iter().enumerate() {
        let Some((op, _, _)) = scaling_of_node(n) else {
            continue;
        };
        let found = (POSITION_DEPTH - 1..levels).rev().find_map(|d| {
            let cands: Vec<SpecScaling<'a>> = by_level
                .get(&(d, sk.levels[d][i]))?
                .iter()
                .map(|&k| spec_nodes[k])
                .filter(|&(j, (sop, _, _))| {
                    sop.name == op.name && sk.same(g, i, spec_sk, spec, j, d, &mut memo)
                })
                .map(|(_, e)| e)
                .collect();
            let (&first, rest) = cands.split_first()?;
            let agree = rest.iter().all(|&(sop, y, numel)| {
                sop.name == first.0.name && y.to_bits() == first.1.to_bits() && numel == first.2
            });
            // The deepest level with a candidate decides: disagreeing ones are no match.
            Some(agree.then_some(first))
        });
        if let (Some(Some(e)), Ok(i)) = (found, u32::try_from(i)) {
            out.insert(i, e);
        }
    }
    out
}

/// The spec's scaling that node `i` of rank `r` (named `name`) stands in the place of: the
/// one at its position ([`spec_scaling_positions`]), else the spec's node of its name.
pub(super) fn spec_scaling<'a>(
    sh: &Shared<'a>,
    r: usize,
    i: usize,
    name: &str,
) -> Option<SpecScaling<'a>> {
    u32::try_from(i)
        .ok()
        .and_then(|i| sh.spec_scaling_at.get(r)?.get(&i).copied())
        .or_else(|| sh.spec_scalings.get(name).copied())
}

/// The mesh dim (k + 1; 0: none) whose size a division (`div` by a number, or `mul` by its
/// inverse) of a partial on mesh dim `m` is by, where the dividend (`input`, its placement per
/// mesh dim) is replicated there, so the quotient is a share on it (`scaled`), and exactly one
/// such dim other than `m` exists; none where the spec scales the node (`spec_scales`).
pub(super) fn share_of_other_dim(
    op: &str,
    factor: Option<f64>,
    mesh: &shardproof_ir::Mesh,
    m: usize,
    input: Option<&[Place]>,
    spec_scales: bool,
) -> u8 {
    let (Some(x), Some(input)) = (factor, input) else {
        return 0;
    };
    let divisor = match op {
        "div" => x,
        "mul" if x != 0.0 => 1.0 / x,
        _ => return 0,
    };
    if spec_scales {
        return 0;
    }
    let dims: Vec<usize> = (0..mesh.dims.len())
        .filter(|&k| {
            k != m
                && mesh.dims[k].1 > 1
                && (mesh.dims[k].1 as f64 - divisor).abs() < 1e-9
                && input.get(k) == Some(&Place::Replicate)
        })
        .collect();
    match dims.as_slice() {
        [k] => u8::try_from(*k + 1).unwrap_or(0),
        _ => 0,
    }
}

/// How a product scales a partial's pieces relative to the spec's value (see
/// [`partial_scaling`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scaling {
    /// As the spec scales its tensor (or no scaling): the pieces combine as before.
    Same,
    /// By 1/n more than the spec: pieces that averaged now sum.
    ByInverseN,
    /// By n more than the spec: pieces that summed now average.
    ByN,
    /// By another factor, or one not read: no linear reduction is known.
    Other,
}

/// What a scaling is read on: a partial's pieces, or a value known to be n times the tensor
/// (`times_n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// A partial's pieces; `scaled_from[k]` says whether an operand from the k-th on (k = 0,
    /// 1) is a replicated value divided by n (any operand of a `mul`, the divisor of a `div`).
    Partial {
        /// From operand 0, from operand 1.
        scaled_from: [bool; 2],
    },
    /// A value n times the tensor: a factor the spec lacks is read by its number.
    TimesN,
}

/// The scaling of a partial's pieces (or of a `times_n` value: `read`) by a call of operator
/// `op` on a mesh dim of size `n` (> 1), relative to the spec: `factor` is the call's literal
/// number (`other`), `spec` the spec's scaling of the node of this name (operator, factor),
/// `has_spec` whether the case has a spec. A factor the spec lacks is `Other` unless 1, or
/// unless read on a `times_n` value.
pub(super) fn partial_scaling(
    op: &str,
    factor: Option<f64>,
    n: f64,
    has_spec: bool,
    spec: Option<(&OpName, f64, Option<i64>)>,
    read: Read,
) -> Scaling {
    let rank_only = read == Read::TimesN;
    let scaled_from = |k: usize| match read {
        Read::Partial { scaled_from } => scaled_from[k],
        Read::TimesN => false,
    };
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    // The rank's factor over the spec's, as a multiplier.
    let classify = |ratio: f64| {
        if near(ratio, 1.0) {
            Scaling::Same
        } else if near(ratio * n, 1.0) {
            Scaling::ByInverseN
        } else if near(ratio, n) {
            Scaling::ByN
        } else {
            Scaling::Other
        }
    };
    match (op, factor) {
        ("mul" | "div", Some(x)) => {
            let mine = if op == "mul" { x } else { 1.0 / x };
            match spec {
                Some((sop, y, _)) if sop.name == op && y != 0.0 && x != 0.0 => {
                    let theirs = if op == "mul" { y } else { 1.0 / y };
                    classify(mine / theirs)
                }
                // A plan is its own spec: the scaling is in the program the placements
                // describe.
                _ if !has_spec => Scaling::Same,
                // The spec does not scale this node: the factor is the rank's own. On a
                // value known to be n times the tensor (`times_n`) it is read as it is; on
                // a partial, what it makes up for is not read from the number (a 1/n may
                // average microbatches as well as a mesh dim's pieces).
                _ if rank_only || near(mine, 1.0) => classify(mine),
                _ => Scaling::Other,
            }
        }
        ("mul", None) if scaled_from(0) => Scaling::ByInverseN,
        ("div", None) if scaled_from(1) => Scaling::ByN,
        // A product with a tensor the checker does not know to be scaled: the spec is
        // taken to compute the same product (as for every other operator).
        _ => Scaling::Same,
    }
}

/// The product of the sizes of the mesh dims other than `m` (pipeline dims aside) that split
/// a value placed `places` (a shard, blocks or rows of a selection: each coordinate holds its
/// own part); `None` where one of them holds it in a layout not known.
fn other_dims_split(mesh: &shardproof_ir::Mesh, m: usize, places: &[Place]) -> Option<f64> {
    let mut split = 1.0;
    for (k, p) in places.iter().enumerate() {
        if k == m || crate::is_pipeline_dim(mesh, k) {
            continue;
        }
        match p {
            Place::Replicate | Place::Partial(_) => {}
            Place::Shard(_) | Place::Blocked(..) | Place::Rows(..) => {
                split *= mesh.dims.get(k)?.1 as f64;
            }
            _ => return None,
        }
    }
    Some(split)
}

/// What a call's scalings leave on its output on one mesh dim (the records of
/// [`RankPlacements`] it sets).
pub(super) struct ScaleRecord {
    /// A replicated output divided by n (`scaled`), before the pipeline and literal checks.
    pub scaled: bool,
    /// A partial output whose pieces' factor is not known (`scale_unknown`).
    pub scale_unknown: bool,
    /// The other mesh dim whose share the output is (`share_of`, k + 1; 0: none).
    pub share_dim: u8,
    /// Whether a partial input's factor was not known.
    pub input_scale_unknown: bool,
    /// Why a reduction of pieces scaled by an unknown factor is not proven.
    pub why: Option<String>,
    /// The output is a share (`scaled`) only by the folded mean's reading: the rank's factor
    /// is the spec's times the split of the other mesh dims that shard the value, over n.
    pub folded: bool,
    /// Other mesh dims (bit k) on which a division this call's microbatch average read as
    /// the 1/K made a term a share (`scaled`): the output is no share there.
    pub divisions_read_as_k: u64,
    /// The output's factor is unknown only because its partial inputs reduce part of the
    /// rows (`part_rows`), and perhaps a share of another mesh dim the call made: it keeps
    /// the record.
    pub keeps_part: bool,
}

/// Reads the call `s`'s scalings by a number on its mesh dim: a replicated value divided by n
/// (`scaled`), a partial relabelled by its factor relative to the spec's, and the pieces
/// whose factor is not known. `in_group`: the call is a collective over the mesh dim;
/// `lift_reads_scaled`: a lift consumed a `scaled` input. A reduction of pieces scaled by an
/// unknown factor makes `result` `Unknown`.
pub(super) fn scale_records(
    s: &CallOnDim,
    in_group: bool,
    lift_reads_scaled: bool,
    violation: &Option<Violation>,
    result: &mut [Place],
) -> ScaleRecord {
    let CallOnDim {
        sh,
        r,
        i,
        m,
        nd,
        op,
        family,
        bound,
        inputs,
        rp,
        place,
        ..
    } = *s;
    let mesh = &sh.program.mesh;
    let g = &sh.program.ranks[r];
    let name = g.nodes[i].name.as_str();
    let spec_here = spec_scaling(sh, r, i, name);
    let scaled_of = |v: ValueId| s.scaled_of(v);
    // Scaling by 1/n of a replicated value.
    let n_m = mesh.dims[m].1 as f64;
    let other = if bound.schema().index_of("other").is_some() {
        bound.get("other")
    } else {
        None
    };
    let factor = other.and_then(|a| a.as_f64());
    // The spec divides by the same number at this node: the rank's value is
    // the spec's tensor, not 1/n of it (a later sum over the ranks would count
    // it n times).
    let spec_same = sh.has_spec
        && factor.is_some_and(|x| spec_here.is_some_and(|(sop, y, _)| sop == op && y == x));
    let plain_by_n = !spec_same
        && match (op.name.as_str(), factor) {
            ("div", Some(x)) => n_m > 1.0 && x == n_m,
            ("mul", Some(x)) => n_m > 1.0 && (x * n_m - 1.0).abs() < 1e-12,
            _ => false,
        }
        // The spec's own factor over n (a global normalization divided by n): the rank's
        // value is the spec's over n where the other mesh dims' pieces are the spec's, a
        // share with no local mean behind it (was: no share, so a correct global
        // `1/(B·tp)` summed over dp and tp was "an all-reduce of a Replicate").
        || (sh.has_spec
            && n_m > 1.0
            && matches!(op.name.as_str(), "mul" | "div")
            && factor.is_some_and(|x| {
                spec_here.is_some_and(|(sop, y, _)| {
                    let ratio = if op.name == "mul" { x / y } else { y / x };
                    sop == op && y != 0.0 && (ratio * n_m - 1.0).abs() < 1e-9
                })
            }));
    let folded_by_n = n_m > 1.0
        && matches!(op.name.as_str(), "mul" | "div")
        && factor.is_some_and(|x| {
            spec_here.is_some_and(|(sop, y, _)| {
                // A mean that autograd folded into the constant counts the
                // rank's local elements where other mesh dims shard the batch:
                // their sizes multiply the factor. Not the spec's elements over
                // the rank's: a pipeline's microbatch holds a K-th of them, and
                // the gradient accumulation's 1/K folds into the constant too
                // (a rank forgetting it had the factor a local count gives).
                let Some(local) = inputs
                    .first()
                    .and_then(|&v| other_dims_split(mesh, m, rp.of(v, nd)))
                else {
                    return false;
                };
                // The rank's factor over the spec's is local/n.
                let ratio = if op.name == "mul" { x / y } else { y / x };
                sop == op && y != 0.0 && (ratio * n_m / local - 1.0).abs() < 1e-9
            })
        });
    let by_n = plain_by_n || folded_by_n;
    // A partial scaled by a number (issue 44, soundness): pieces that average
    // to the tensor, each divided by n, sum to it (and pieces that sum, each
    // times n, average to it), where the spec does not scale the tensor so.
    // Before, the reduction label was kept through every such product, so a
    // rank that divided its local mean by n where the spec does not held
    // pieces that sum labelled `Partial(avg)`, and an output declared so
    // passed. The factor is read relative to the spec's own at this node
    // (`spec_scalings`): the same factor keeps the label, 1/n or n of it
    // turns one linear reduction into the other. Any other factor (one the
    // spec lacks, whose meaning the number does not tell: a 1/2 may average
    // two microbatches), or 1/n where another mesh dim has n coordinates too
    // (which dim it makes up for is not known), keeps the label and records
    // that the pieces' factor is not known (`scale_unknown`): every finding
    // on a partial still applies, but no reduction of it is proven. A plan
    // is its own spec: its scalings keep the label. A product with a
    // replicated value divided by n (`scaled`) counts as a factor of 1/n.
    let mut scaling_why = None;
    let input_scale_unknown = inputs.iter().any(|&v| {
        place(v).is_partial() && rp.scale_unknown[(rp.offsets[v.node] as usize + v.output) * nd + m]
    });
    let mut now_scale_unknown = input_scale_unknown;
    // Every partial input whose factor is not known is so only because it reduces part of
    // the rows (`part_rows`): the call may keep that record where it adds no unknown factor
    // of its own (else `drops_part`), or only a share of another mesh dim; a proven
    // microbatch average or sum is the whole shard's (`drops_part` too).
    let at_m = |v: ValueId| (rp.offsets[v.node] as usize + v.output) * nd + m;
    let input_part_only = input_scale_unknown
        && inputs.iter().all(|&v| {
            !(place(v).is_partial() && rp.scale_unknown[at_m(v)]) || rp.part_rows[at_m(v)]
        });
    let mut drops_part = false;
    // `share_of` of the output on this mesh dim (k + 1; 0: none).
    let mut share_dim = 0u8;
    let share_in = |v: ValueId| rp.share_of[(rp.offsets[v.node] as usize + v.output) * nd + m];
    // Carried by a sum of partial terms that all wait on the same dim's sum,
    // and by a collective over another mesh dim (which this dim's pieces pass).
    if input_scale_unknown
        && ((op.name == "add" && inputs.iter().all(|&v| place(v).is_partial()))
            || (family == "all-reduce" && !in_group))
    {
        let first = inputs.first().map_or(0, |&v| share_in(v));
        if inputs.iter().all(|&v| share_in(v) == first) {
            share_dim = first;
        }
    }
    if n_m > 1.0 {
        if let Some(Place::Partial(red)) = result.first().copied() {
            if red.is_linear() {
                let rel = partial_scaling(
                    op.name.as_str(),
                    factor,
                    n_m,
                    sh.has_spec,
                    spec_here,
                    Read::Partial {
                        scaled_from: [0, 1].map(|k| {
                            inputs
                                .iter()
                                .skip(k)
                                .any(|&v| place(v) == Place::Replicate && scaled_of(v))
                        }),
                    },
                );
                let ambiguous = rel != Scaling::Same
                    && mesh
                        .dims
                        .iter()
                        .enumerate()
                        .any(|(k, d)| k != m && d.1 as f64 == n_m);
                let relabel = match (rel, red) {
                    _ if ambiguous => None,
                    (Scaling::Same, r) => Some(r),
                    (Scaling::ByInverseN, Red::Avg) => Some(Red::Sum),
                    (Scaling::ByN, Red::Sum) => Some(Red::Avg),
                    _ => None,
                };
                match relabel {
                    Some(r) => {
                        // Only the outputs the relation was read of (the first output's
                        // reduction): nll_loss's total weight, a partial sum of the ranks'
                        // counts beside a mean loss, is no average.
                        for p in result.iter_mut() {
                            if *p == Place::Partial(red) {
                                *p = Place::Partial(r);
                            }
                        }
                    }
                    None => {
                        // The one other mesh dim whose size the division
                        // is by, and on which the dividend is replicated (a
                        // share there), where the spec lacks the factor.
                        let no_share_in = inputs.iter().all(|&v| share_in(v) == 0);
                        let mut made_share = false;
                        if (!input_scale_unknown || (input_part_only && no_share_in))
                            && rel == Scaling::Other
                        {
                            share_dim = share_of_other_dim(
                                op.name.as_str(),
                                factor,
                                mesh,
                                m,
                                inputs.first().map(|&v| rp.of(v, nd)),
                                sh.has_spec && spec_here.is_some(),
                            );
                            made_share = share_dim != 0;
                        }
                        now_scale_unknown = true;
                        drops_part |= !made_share;
                    }
                }
            }
        }
    }
    now_scale_unknown &= result.iter().any(|p| p.is_partial());
    // Gradient accumulation: K microbatch means each divided by K, added, are
    // the mean over the rank's shard (`rows::microbatch_average` proves the
    // terms are the K microbatches of one selection, each once). Where every
    // microbatch's mean is the same pending share of another mesh dim k (each
    // layer's balance loss over tp), the average is that share of the mean:
    // its factor stays unknown until the sum over k, which `share_of` records.
    let mut divisions_read_as_k = 0u64;
    if now_scale_unknown && op.name == "add" && result.first() == Some(&Place::Partial(Red::Avg)) {
        let at = |v: ValueId| (rp.offsets[v.node] as usize + v.output) * nd + m;
        if let Some(average) = rows::microbatch_average(
            g,
            i,
            &|v| rp.of(v, nd)[m],
            &|v| rp.scale_unknown[at(v)],
            &|v| rp.share_of[at(v)],
            &|v| rp.part_rows[at(v)],
            &rows::RowPairing {
                table: &sh.rows.borrow(),
                received: &|x, y| super::recv::received_alike(sh, r, x, y),
            },
        ) {
            drops_part = true;
            if average.share == 0 {
                now_scale_unknown = false;
            } else {
                share_dim = average.share;
            }
            // The divisions read as the 1/K: another mesh dim that read one as its own share
            // (the term `scaled` there, its mean not) would count the factor twice.
            let scaled_on =
                |v: ValueId, k: usize| rp.scaled[(rp.offsets[v.node] as usize + v.output) * nd + k];
            for k in (0..nd.min(64)).filter(|&k| k != m) {
                if average
                    .terms
                    .iter()
                    .any(|&(t, mean)| scaled_on(t, k) && !scaled_on(mean, k))
                {
                    divisions_read_as_k |= 1 << k;
                }
            }
        }
    }
    // Gradient accumulation of sums: K microbatch sums added are the sum over
    // the rank's shard (`rows::microbatch_sum`), each term's factor unknown
    // only because it sums part of the rows (`part_rows`).
    if now_scale_unknown && op.name == "add" && result.first() == Some(&Place::Partial(Red::Sum)) {
        let at = |v: ValueId| (rp.offsets[v.node] as usize + v.output) * nd + m;
        if rows::microbatch_sum(
            g,
            i,
            &|v| rp.of(v, nd)[m],
            &|v| rp.scale_unknown[at(v)],
            &|v| rp.part_rows[at(v)] && rp.share_of[at(v)] == 0,
            &|v, d| (0..nd).any(|k| k != m && rp.of(v, nd)[k] == Place::Shard(d)),
            &rows::RowPairing {
                table: &sh.rows.borrow(),
                received: &|x, y| super::recv::received_alike(sh, r, x, y),
            },
        ) {
            now_scale_unknown = false;
        }
    }
    // A reduction over the group of pieces whose factor is not known: what it
    // gives is not proven (findings of the rule stand).
    if input_scale_unknown
        && in_group
        && violation.is_none()
        && matches!(family, "all-reduce" | "reduce-scatter")
    {
        result.iter_mut().for_each(|p| *p = Place::Unknown);
        now_scale_unknown = false;
        let part = inputs.iter().any(|&v| {
            place(v).is_partial() && rp.part_rows[(rp.offsets[v.node] as usize + v.output) * nd + m]
        });
        scaling_why = Some(if part {
            format!(
                "`{op}` on mesh dim `{}` reduces a sum or mean over part of each rank's \
                 rows (one microbatch's): its pieces combine to the selected rows', not \
                 the tensor's (only the K microbatch sums added, or means averaged, each \
                 once, are)",
                mesh.dims[m].0
            )
        } else {
            format!(
                "`{op}` on mesh dim `{}` reduces a partial whose pieces were scaled \
                 by a number whose meaning is not known (a factor the spec lacks at \
                 that node, or 1/n where another mesh dim has n coordinates too): \
                 what the reduction gives is not proven",
                mesh.dims[m].0
            )
        });
    }
    let first_scaled = inputs.first().is_some_and(|&v| scaled_of(v));
    let scaled_inputs = inputs
        .iter()
        .filter(|&&v| place(v) == Place::Replicate && scaled_of(v))
        .count();
    // Which uses carry the 1/n on: copies, views and sums of one scaled
    // operand, a product with exactly one scaled factor (either side), a
    // quotient of a scaled dividend by an unscaled divisor, a sum of scaled
    // terms only, and a sum or mean over another mesh dim's group (each
    // member's value is 1/n of one, so is their sum: a tp share summed over dp
    // first, then over tp, was an all-reduce of a replicated tensor).
    let over_other_dim = family == "all-reduce"
        && !in_group
        && matches!(
            bound.get("reduce_op"),
            Some(Arg::Str(s)) if Red::parse(&s).is_some_and(|r| r.is_linear())
        );
    let keeps = (first_scaled
        && (rules::moves_values(family)
            || over_other_dim
            || (family == "reduction" && matches!(op.name.as_str(), "sum" | "mean"))
            || (family == "elementwise-div" && scaled_inputs == 1)))
        || (family == "elementwise-mul" && scaled_inputs == 1)
        || (family == "elementwise-add"
            && !inputs.is_empty()
            && inputs.iter().all(|&v| scaled_of(v)));
    let divided_here = by_n
        && inputs
            .first()
            .is_some_and(|&v| place(v) == Place::Replicate);
    let now_scaled = result.first() == Some(&Place::Replicate) && (divided_here || keeps);
    // The share rests on the folded mean alone: the other mesh dims that split the value
    // must average their pieces later (`mean_pieces`).
    let folded = now_scaled && divided_here && folded_by_n && !plain_by_n && !keeps;
    // A replicated value divided by n (`scaled`) read as a rank's share of a
    // sum: an all-reduce sum of it, a partial plus it, a partial times or over
    // it (the label follows, `partial_scaling`), a partial matrix product plus
    // it as the bias. Any other use whose result is a partial (a partial matrix
    // product with it, say) scales the pieces by 1/n where the spec may not:
    // the label is kept and its factor is not known (`scale_unknown`), so no
    // reduction of it is proven (was: the label as if unscaled). A use whose
    // result is replicated or a shard keeps its placement: the record cannot
    // tell a share from a value the spec divides too (a gradient averaged over
    // the replicas, `all_reduce(g) / n`, is recorded so), and the placement
    // holds either way. A plan is its own spec.
    if sh.has_spec && scaled_inputs > 0 && !now_scaled && violation.is_none() {
        let consumed = lift_reads_scaled
            || matches!(family, "elementwise-mul" | "elementwise-div")
            || (matches!(family, "matmul-bias" | "linear")
                && scaled_inputs == 1
                && ["bias", "self"]
                    .iter()
                    .filter(|a| bound.schema().index_of(a).is_some())
                    .filter_map(|a| match bound.get(a) {
                        Some(Arg::Value(v)) => Some(v),
                        _ => None,
                    })
                    .any(scaled_of));
        if !consumed
            && result
                .iter()
                .any(|p| matches!(p, Place::Partial(r) if r.is_linear()))
        {
            now_scale_unknown = true;
            drops_part = true;
        }
    }

    ScaleRecord {
        scaled: now_scaled,
        scale_unknown: now_scale_unknown,
        share_dim,
        input_scale_unknown,
        why: scaling_why,
        folded,
        divisions_read_as_k,
        keeps_part: input_part_only && now_scale_unknown && !drops_part,
    }
}

/// Whether call `i` (node `node_name`, operator `op`, arguments `bound`) divides its one
/// input, `f` times the spec's (a `times_n` value, or `scattered_factor`: a reduce-scatter of
/// local means), by exactly `f` where the spec does not (a `mul` by `1/f` or a `div` by `f`).
pub(super) fn divides_by_inverse(
    sh: &Shared,
    r: usize,
    i: usize,
    node_name: &str,
    op: &OpName,
    bound: &Args,
    f: u64,
) -> bool {
    f != u64::MAX
        && matches!(op.name.as_str(), "mul" | "div")
        && partial_scaling(
            op.name.as_str(),
            bound.get("other").and_then(|a| a.as_f64()),
            f as f64,
            sh.has_spec,
            spec_scaling(sh, r, i, node_name),
            Read::TimesN,
        ) == Scaling::ByInverseN
}

/// Reads a call's one input `v` where it is n times the tensor on a mesh dim (`times_n`, an
/// all-reduce sum of pieces that average to it): a copy or view keeps the record, a division
/// by n that the spec does not make gives `Replicate()`, any other read is an unknown
/// source. Returns whether a division made up for it.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_times_n(
    sh: &Shared,
    r: usize,
    i: usize,
    node_name: &str,
    op: &OpName,
    family: &str,
    bound: &Args,
    v: ValueId,
    nout: usize,
    rp: &mut RankPlacements,
) -> bool {
    let mesh = &sh.program.mesh;
    let nd = mesh.dims.len();
    let base = rp.offsets[i] as usize;
    let mut consumed = false;
    for m in 0..nd {
        if !rp.times_n[(rp.offsets[v.node] as usize + v.output) * nd + m] {
            continue;
        }
        let stage_dim = m < 64 && crate::is_pipeline_dim(mesh, m);
        // Several mesh dims n times it (an all-reduce over a group spanning
        // them): only a division by the product of their sizes makes up for
        // them (one mesh dim's size would leave it n times the tensor: was
        // taken as `Replicate()` on each, a false holds).
        // A reduction of local means records its factor (`times_factor`): the product
        // counts it once.
        let all_n: u64 = (0..nd)
            .filter(|&k| {
                rp.times_n[(rp.offsets[v.node] as usize + v.output) * nd + k]
                    && !crate::is_pipeline_dim(mesh, k)
            })
            .map(|k| {
                rp.times_factor
                    .get(&((rp.offsets[v.node] as usize + v.output) * nd + k))
                    .copied()
                    .unwrap_or(mesh.dims[k].1 as u64)
            })
            .fold(1u64, |a, f| a.saturating_mul(f));
        if rules::moves_values(family) {
            let factor = rp
                .times_factor
                .get(&((rp.offsets[v.node] as usize + v.output) * nd + m))
                .copied();
            for o in 0..nout {
                rp.times_n[(base + o) * nd + m] = true;
                if let Some(f) = factor {
                    rp.times_factor.insert((base + o) * nd + m, f);
                }
            }
        } else if !stage_dim && divides_by_inverse(sh, r, i, node_name, op, bound, all_n) {
            for o in 0..nout {
                rp.places[(base + o) * nd + m] = Place::Replicate;
            }
            consumed = true;
        } else {
            rp.unknown_sources.push((
                i,
                format!(
                    "`{}` on mesh dim `{}` reads a tensor that is n times its \
                     value on every rank (an all-reduce sum of pieces that \
                     average to it): only a division by n, or a copy or view, \
                     is followed",
                    op.base(),
                    mesh.dims[m].0
                ),
            ));
        }
    }
    consumed
}

/// A folded share's records on one mesh dim `m` (`folded_pending`, `folded_summed` of
/// [`RankPlacements`]): the other mesh dims (bit `k`) whose pieces the folded mean's reading
/// says are each `n_k` times the spec's, not yet averaged (`pending`), and those over which
/// they were summed instead (`summed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct FoldedShare {
    /// Mesh dims whose local means no average has settled yet.
    pub pending: u64,
    /// Mesh dims over which the local means were summed, with no division by `n_k` since.
    pub summed: u64,
}

impl FoldedShare {
    /// The records of value `v` on the call's mesh dim.
    fn of(s: &CallOnDim, v: ValueId) -> FoldedShare {
        let at = (s.rp.offsets[v.node] as usize + v.output) * s.nd + s.m;
        FoldedShare {
            pending: s.rp.folded_pending[at],
            summed: s.rp.folded_summed[at],
        }
    }

    /// The union of two records.
    fn with(self, o: FoldedShare) -> FoldedShare {
        FoldedShare {
            pending: self.pending | o.pending,
            summed: self.summed | o.summed,
        }
    }
}

/// The folded-share records of the output of call `s` on its mesh dim `m`, where it is a
/// share there (`now_scaled`; none otherwise). A folded mean (`folded`) starts them: the
/// other mesh dims that shard or hold rows of the input (the split its factor counted) are
/// pending. A use that carries the share on (a copy, a product, an all-reduce over other
/// mesh dims) carries its scaled inputs' records, where an all-reduce over other mesh dims
/// (`group_dims`; `None`: not known) settles a pending dim by averaging over it and moves it
/// to `summed` by summing over it, and a division by `n_k` (or a product with `1/n_k`) makes
/// up for one summed (else one pending) dim of that size.
pub(super) fn folded_share(
    s: &CallOnDim,
    folded: bool,
    now_scaled: bool,
    in_group: bool,
    group_dims: Option<&[usize]>,
) -> FoldedShare {
    let mesh = &s.sh.program.mesh;
    if !now_scaled {
        return FoldedShare::default();
    }
    if folded {
        let pending = s.inputs.first().map_or(0, |&v| {
            s.rp.of(v, s.nd)
                .iter()
                .enumerate()
                .filter(|&(k, p)| {
                    k != s.m
                        && k < 64
                        && !crate::is_pipeline_dim(mesh, k)
                        && matches!(p, Place::Shard(_) | Place::Blocked(..) | Place::Rows(..))
                })
                .fold(0u64, |bits, (k, _)| bits | 1 << k)
        });
        return FoldedShare { pending, summed: 0 };
    }
    let mut rec = s
        .inputs
        .iter()
        .filter(|&&v| s.scaled_of(v))
        .fold(FoldedShare::default(), |acc, &v| {
            acc.with(FoldedShare::of(s, v))
        });
    if rec == FoldedShare::default() {
        return rec;
    }
    if s.family == "all-reduce" && !in_group {
        let red = match s.bound.get("reduce_op") {
            Some(Arg::Str(x)) => Red::parse(&x),
            _ => None,
        };
        // The mesh dims the group spans (all of them where not known).
        let over = group_dims.map_or(u64::MAX, |dims| {
            dims.iter()
                .filter(|&&k| k < 64)
                .fold(0u64, |bits, &k| bits | 1 << k)
        });
        let hit = rec.pending & over;
        rec.pending &= !hit;
        if red != Some(Red::Avg) {
            rec.summed |= hit;
        }
    }
    let factor = match s.bound.schema().index_of("other") {
        Some(_) => s.bound.get("other").and_then(|a| a.as_f64()),
        None => None,
    };
    let divisor = match (s.op.name.as_str(), factor) {
        ("div", Some(x)) => Some(x),
        ("mul", Some(x)) if x != 0.0 => Some(1.0 / x),
        _ => None,
    };
    if let Some(d) = divisor {
        let of_size = |bits: u64| {
            (0..mesh.dims.len().min(64))
                .find(|&k| bits & (1 << k) != 0 && (mesh.dims[k].1 as f64 - d).abs() < 1e-9)
        };
        if let Some(k) = of_size(rec.summed) {
            rec.summed &= !(1 << k);
        } else if let Some(k) = of_size(rec.pending) {
            rec.pending &= !(1 << k);
        }
    }
    rec
}

/// The folded-share records of the shares call `s` reads as shares on its mesh dim: a lift
/// (`lift_reads_scaled`: an all-reduce sum of them, a partial plus them), or any use of a
/// scaled replicated input whose result is a partial (a product relabelled by it, a bias).
pub(super) fn consumed_folded(
    s: &CallOnDim,
    lift_reads_scaled: bool,
    result: &[Place],
) -> FoldedShare {
    if !lift_reads_scaled && !result.iter().any(|p| p.is_partial()) {
        return FoldedShare::default();
    }
    s.inputs
        .iter()
        .filter(|&&v| (s.place)(v) == Place::Replicate && s.scaled_of(v))
        .fold(FoldedShare::default(), |acc, &v| {
            acc.with(FoldedShare::of(s, v))
        })
}
