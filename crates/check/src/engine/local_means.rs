//! Whether a value's pieces on a mesh dim are *local means* (issue 44): each piece `n_k` times
//! the spec's piece, because the rank normalized a mean loss by its own count of a batch that
//! mesh dim `k` splits; and the commitment of a folded share read as a share
//! ([`commit_folded`]), which asks it.
//!
//! A folded share (`scaling::FoldedShare`) lifted by a partial plus it while `k` still shards
//! the share (`commit_folded`) leaves `k`'s pieces each `n_k` times the spec's on the share's
//! side. The sum is one tensor in the spec only where the partial's pieces on `k` are local
//! means too (the main loss gradient beside the balance loss's share, DeepSeek's router
//! gradient); a partial whose pieces are the spec's (a graph input, say) added to it mixes
//! two factors, and no later reduction over `k` gives the spec's value. This module answers
//! that question for the partial by walking back from it, across messages to their senders.
//!
//! The answer per value ([`Pieces`]): `Spec` (no local normalization behind it), `LocalMean`
//! (normalized by the rank's count once), or `Unknown`. Sources of `LocalMean`: a folded
//! share's pending record on `k`, and the backward of a mean loss (`nll_loss_backward`,
//! `mse_loss_backward` with the mean reduction) over a batch `k` splits. Operators carry it
//! by their linearity: copies, views and reductions pass it; a sum needs the same answer of
//! every term (a known-zero term counts as either); a product takes it from at most one
//! factor (two local means are `n_k²` times the spec's); a quotient from its dividend with a
//! `Spec` divisor; gathers, reduce-scatters and exchanges move or add pieces of one factor and
//! pass it; an all-reduce over `k` (which may settle it) and anything else pass `Spec` only.
//! Literal factors along the way are not read (a `1/K` of microbatches, the loss scale): the
//! walk records how the rank normalized by its own count, not the value's factor.
//!
//! A claim's walk ([`Memo::facts`]) follows where the factor is settled too: an all-reduce
//! sum over `k` of partial sums of local means keeps `k` (every member holds `n_k` times the
//! spec's value), an average over `k` of them is the spec's, and a product or quotient by a
//! number the spec lacks is read by its number (exactly the inverse of the factor: the spec's;
//! another: not known). The lifts' walk keeps the rules above, which their readings rest on.

use super::{RankPlacements, Shared};
use crate::place::{Place, Red};
use crate::rules;
use shardproof_ir::{Arg, NodeKind, ValueId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Most values one walk visits; past it the answer is `Unknown`.
const MAX_VISITS: usize = 400_000;

/// How a value's pieces on one mesh dim `k` compare with what its placement claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pieces {
    /// No local normalization over `k` behind the value: its pieces are as its placement says.
    Spec,
    /// Normalized once by the rank's own count of a batch `k` splits: each piece `n_k` times.
    LocalMean,
    /// Not known.
    Unknown,
}

/// A local-means walk's answer for one value on every mesh dim at once: bit `k` of `local`
/// where its pieces on `k` are local means (each `n_k` times the spec's), of `unknown` where
/// that is not known; neither: the spec's pieces there. The value, laid out by its
/// placements, is then the spec's times the product of the `local` dims' sizes (its
/// *factor*, [`LocalMeanDims::factor`]), known where no dim is unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalMeanDims {
    /// Mesh dims whose pieces are local means.
    pub local: u64,
    /// Mesh dims where that is not known.
    pub unknown: u64,
}

impl LocalMeanDims {
    /// The spec's pieces on every mesh dim.
    pub const SPEC: LocalMeanDims = LocalMeanDims {
        local: 0,
        unknown: 0,
    };

    /// The answer on mesh dim `k`.
    pub(super) fn on(self, k: usize) -> Pieces {
        let bit = 1u64.checked_shl(k as u32).unwrap_or(0);
        if self.unknown & bit != 0 || bit == 0 {
            Pieces::Unknown
        } else if self.local & bit != 0 {
            Pieces::LocalMean
        } else {
            Pieces::Spec
        }
    }

    /// Dims known to be a local mean, the rest cleared of it.
    fn settle(local: u64, unknown: u64) -> LocalMeanDims {
        LocalMeanDims {
            local: local & !unknown,
            unknown,
        }
    }

    /// A product's answer from its factors': per mesh dim at most one local mean (two are
    /// `n_k²` times the spec's, which the answer does not count).
    fn times(self, o: LocalMeanDims) -> LocalMeanDims {
        LocalMeanDims::settle(
            self.local | o.local,
            self.unknown | o.unknown | (self.local & o.local),
        )
    }

    /// The factor by which the value is the spec's: the product of the sizes of its `local`
    /// mesh dims (`sizes`), where no mesh dim of more than one coordinate is unknown.
    pub fn factor(self, sizes: &[usize]) -> Option<u64> {
        let mut f = 1u64;
        for (k, &n) in sizes.iter().enumerate() {
            let bit = 1u64.checked_shl(k as u32).unwrap_or(0);
            if n > 1 && (bit == 0 || self.unknown & bit != 0) {
                return None;
            }
            if self.local & bit != 0 {
                f = f.checked_mul(n as u64)?;
            }
        }
        Some(f)
    }
}

/// The answers of a run's walks: every value a walk reads comes before the call asking (or
/// from another rank's finished run), so its answer holds for the rest of the run.
#[derive(Default)]
pub(super) struct Memo {
    answers: HashMap<(usize, ValueId), LocalMeanDims>,
    /// Whether the walks answer from the loss backwards' local means alone, a folded
    /// share's pending records left out ([`Memo::facts`]).
    facts_only: bool,
}

impl Memo {
    /// The answers of walks that read only the local means of a mean loss's backward: a
    /// folded share's pending record is the scaling's reading of a factor (taken where the
    /// share is lifted, and also met where a rank's factor merely equals the spec's: a
    /// learning rate, `x * 2`), not a fact about the values, so a claim does not rest on it.
    pub(super) fn facts() -> Memo {
        Memo {
            facts_only: true,
            ..Memo::default()
        }
    }
}

/// One walk's state: the rank being propagated (`r`, its placements so far `rp`), the other
/// ranks' placements (`done`), and the answers so far (every mesh dim at once).
pub(super) struct LocalMeans<'a, 's> {
    sh: &'a Shared<'s>,
    r: usize,
    rp: &'a RankPlacements,
    done: &'a [Option<Arc<RankPlacements>>],
    memo: HashMap<(usize, ValueId), LocalMeanDims>,
    visits: usize,
    /// The memo's [`Memo::facts_only`].
    facts_only: bool,
}

/// What one value's answer needs: the answer, or the values to answer first.
enum Step {
    Done(LocalMeanDims),
    Need(Vec<(usize, ValueId)>),
}

impl<'a, 's> LocalMeans<'a, 's> {
    /// A walk from rank `r` (placements so far `rp`), starting from the answers of the run's
    /// earlier walks (`memo`; give them back with [`Self::finish`]).
    pub(super) fn new(
        sh: &'a Shared<'s>,
        r: usize,
        rp: &'a RankPlacements,
        done: &'a [Option<Arc<RankPlacements>>],
        memo: &mut Memo,
    ) -> Self {
        LocalMeans {
            sh,
            r,
            rp,
            done,
            memo: std::mem::take(&mut memo.answers),
            visits: 0,
            facts_only: memo.facts_only,
        }
    }

    /// Hands this walk's answers back to the run's `memo`.
    pub(super) fn finish(self, memo: &mut Memo) {
        memo.answers = self.memo;
    }

    /// The answer for value `v` of rank `q`.
    pub(super) fn of(&mut self, q: usize, v: ValueId) -> LocalMeanDims {
        let mut stack = vec![(q, v)];
        let mut open: HashSet<(usize, ValueId)> = HashSet::new();
        while let Some(&top) = stack.last() {
            if self.memo.contains_key(&top) {
                stack.pop();
                continue;
            }
            self.visits += 1;
            if self.visits > MAX_VISITS {
                return LocalMeanDims {
                    local: 0,
                    unknown: u64::MAX,
                };
            }
            match self.step(top.0, top.1) {
                Step::Done(p) => {
                    self.memo.insert(top, p);
                    open.remove(&top);
                    stack.pop();
                }
                Step::Need(deps) => {
                    open.insert(top);
                    for d in deps {
                        // A value that waits on itself (messages in a cycle): no answer.
                        if open.contains(&d) {
                            self.memo.insert(
                                d,
                                LocalMeanDims {
                                    local: 0,
                                    unknown: u64::MAX,
                                },
                            );
                        } else {
                            stack.push(d);
                        }
                    }
                }
            }
        }
        self.memo.get(&(q, v)).copied().unwrap_or(LocalMeanDims {
            local: 0,
            unknown: u64::MAX,
        })
    }

    /// Rank `q`'s placements, where known.
    fn placements(&self, q: usize) -> Option<&RankPlacements> {
        if q == self.r {
            Some(self.rp)
        } else {
            self.done.get(q).and_then(|d| d.as_deref())
        }
    }

    /// Value `v`'s index into rank `q`'s per-value records.
    fn at(rp: &RankPlacements, v: ValueId) -> Option<usize> {
        rp.offsets.get(v.node).map(|&o| o as usize + v.output)
    }

    /// One value's answer from its inputs' (or the inputs it still needs).
    fn step(&self, q: usize, v: ValueId) -> Step {
        const UNKNOWN: LocalMeanDims = LocalMeanDims {
            local: 0,
            unknown: u64::MAX,
        };
        let nd = self.sh.program.mesh.dims.len();
        let Some(rp) = self.placements(q) else {
            return Step::Done(UNKNOWN);
        };
        let Some(at) = Self::at(rp, v).filter(|&a| (a + 1) * nd <= rp.places.len()) else {
            return Step::Done(UNKNOWN);
        };
        // The folded share's records: pieces of `k` summed instead of averaged (`Unknown`),
        // or pending (`LocalMean`); the other mesh dims as the operator gives them.
        let records = (0..nd).map(|m| at * nd + m).filter(|_| !self.facts_only);
        let summed = records.clone().fold(0u64, |a, x| a | rp.folded_summed[x]);
        let pending = records.fold(0u64, |a, x| a | rp.folded_pending[x]) & !summed;
        let covered = summed | pending;
        let every_dim = 1u64.checked_shl(nd as u32).map_or(u64::MAX, |b| b - 1);
        let with_records = |f: LocalMeanDims| {
            LocalMeanDims::settle(
                pending | (f.local & !covered),
                summed | (f.unknown & !covered),
            )
        };
        if covered & every_dim == every_dim {
            return Step::Done(with_records(LocalMeanDims::SPEC));
        }
        match self.operator_step(q, v, rp, nd) {
            Step::Done(f) => Step::Done(with_records(f)),
            need => need,
        }
    }

    /// The answer an operator gives value `v` of rank `q` (placements `rp`) from its inputs'.
    fn operator_step(&self, q: usize, v: ValueId, rp: &RankPlacements, nd: usize) -> Step {
        let sh = self.sh;
        let g = &sh.program.ranks[q];
        let node = &g.nodes[v.node];
        let NodeKind::Call { op, args, kwargs } = &node.kind else {
            // A graph input or a module constant: the case's pieces of the spec's tensor.
            return Step::Done(LocalMeanDims::SPEC);
        };
        let unknown = LocalMeanDims {
            local: 0,
            unknown: u64::MAX,
        };
        // A received message: the sender's value.
        if op.name == "recv" {
            return match sh.messages.get(&(q, v.node)) {
                Some(&(s, j)) => match sh.program.ranks[s].nodes[j].inputs().first() {
                    Some(&sent) => self.need_or(&[(s, sent)], |a| a[0]),
                    None => Step::Done(unknown),
                },
                None => Step::Done(unknown),
            };
        }
        let tensors: Vec<(usize, ValueId)> = node.inputs().into_iter().map(|u| (q, u)).collect();
        let zero = |u: ValueId| Self::at(rp, u).is_some_and(|a| rp.zero.get(a) == Some(&true));
        let place_on = |u: ValueId, k: usize| {
            Self::at(rp, u)
                .and_then(|a| rp.places.get(a * nd + k))
                .copied()
                .unwrap_or(Place::Unknown)
        };
        let family = rules::rule(&op.base()).map_or("", |rule| rule.family);
        let positional = |n: usize| match args.get(n) {
            Some(Arg::Value(u)) => Some(*u),
            _ => None,
        };
        // An argument at position `n` or by keyword `key` (a loss's reduction, weight and
        // total weight are often passed by name).
        let arg_at = |n: usize, key: &str| args.get(n).or_else(|| node.kwarg(key));
        let value_at = |n: usize, key: &str| match arg_at(n, key) {
            Some(Arg::Value(u)) => Some(*u),
            _ => None,
        };
        let int_named = |n: usize, key: &str| match arg_at(n, key) {
            Some(Arg::Int(x)) => Some(*x),
            _ => None,
        };
        // A cast to a type that is not floating point rounds: no factor passes.
        let casts_to_int = matches!(op.name.as_str(), "_to_copy" | "to")
            && args
                .iter()
                .skip(1)
                .chain(node.kwarg("dtype"))
                .any(|a| matches!(a, Arg::Dtype(d) if !d.is_float()));
        match family {
            "linear-unary" if casts_to_int => Step::Done(unknown),
            "linear-unary" | "view" | "transpose" | "permute" | "unsqueeze" | "squeeze"
            | "expand" | "repeat" | "slice" | "select" | "split" | "flip" | "triangle" => {
                self.first_only(&tensors)
            }
            // A cumulative product multiplies the factor into itself; a pad by a number
            // other than zero adds the spec's own elements beside the scaled ones.
            "scan" if op.name == "cumsum" => self.first_only(&tensors),
            // The fill is `constant_pad_nd`'s third argument, `pad`'s fourth (after the
            // mode), or the keyword `value`.
            "pad"
                if !nonzero_number(
                    args.get(if op.name == "pad" { 3 } else { 2 })
                        .or_else(|| node.kwarg("value")),
                ) =>
            {
                self.first_only(&tensors)
            }
            // Linear in the gradient (the first operand) only: the saved input, output or
            // statistics enter non-linearly, so they must be the spec's.
            "activation-backward" | "softmax-backward" | "norm-backward" => {
                self.first_only(&tensors)
            }
            "reduction" if matches!(op.name.as_str(), "sum" | "mean") => self.first_only(&tensors),
            "elementwise-add" | "cat" | "stack" | "slice-scatter" | "copy" => {
                let terms: Vec<(usize, ValueId)> =
                    tensors.iter().copied().filter(|&(_, u)| !zero(u)).collect();
                // A number added (`add.Scalar(x, 1)`, `rsub(x, 1)`) is a term of the spec's
                // own: beside a local mean the sum mixes factors.
                let number_term = family == "elementwise-add"
                    && (args.iter().take(2).any(|a| nonzero_number(Some(a)))
                        || ["self", "other"]
                            .iter()
                            .any(|k| nonzero_number(node.kwarg(k))));
                self.need_or(&terms, move |a| {
                    let mut terms = a.to_vec();
                    if number_term {
                        terms.push(LocalMeanDims::SPEC);
                    }
                    same(&terms)
                })
            }
            // Linear in the values, the mask read as is.
            // A number other than zero in a branch is a term of the spec's own (`where(m, x, 1)`).
            "where" => match (positional(0), positional(1), positional(2)) {
                (Some(c), a, b) => {
                    let number_term = nonzero_number(args.get(1).or_else(|| node.kwarg("self")))
                        || nonzero_number(args.get(2).or_else(|| node.kwarg("other")));
                    let mut want = vec![(q, c)];
                    want.extend(
                        [a, b]
                            .into_iter()
                            .flatten()
                            .filter(|&u| !zero(u))
                            .map(|u| (q, u)),
                    );
                    self.need_or(&want, move |a| {
                        let mut terms = a[1..].to_vec();
                        if number_term {
                            terms.push(LocalMeanDims::SPEC);
                        }
                        spec_first(a[0], same(&terms))
                    })
                }
                _ => Step::Done(unknown),
            },
            // A zero fill keeps every piece's factor.
            "masked-fill"
                if matches!(args.get(2), Some(Arg::Int(0)))
                    || matches!(args.get(2), Some(Arg::Float(x)) if *x == 0.0)
                    || positional(2).is_some_and(zero) =>
            {
                let (Some(x), Some(mask)) = (positional(0), positional(1)) else {
                    return Step::Done(unknown);
                };
                self.need_or(&[(q, x), (q, mask)], |a| spec_first(a[1], a[0]))
            }
            // Written values and the tensor written into: one sum; the index read as is.
            // A number written (`scatter.value`) is the spec's own, a zero one no term.
            "scatter" | "index-put" => {
                let values_at = if family == "scatter" { 3 } else { 2 };
                // A product of the written values and the tensor written into multiplies
                // their factors (`n_k²` on one mesh dim): not one sum.
                let reduce = args.get(4).or_else(|| node.kwarg("reduce"));
                if matches!(reduce, Some(Arg::Str(r)) if r == "prod" || r == "multiply") {
                    return Step::Done(unknown);
                }
                let Some(base) = positional(0) else {
                    return Step::Done(unknown);
                };
                let src = positional(values_at);
                let written_number = match args.get(values_at) {
                    Some(Arg::Int(x)) => Some(*x != 0),
                    Some(Arg::Float(x)) => Some(*x != 0.0),
                    _ => None,
                };
                if src.is_none() && written_number.is_none() {
                    return Step::Done(unknown);
                }
                let mut want: Vec<(usize, ValueId)> = tensors
                    .iter()
                    .copied()
                    .filter(|&(_, u)| u != base && Some(u) != src)
                    .collect();
                let indices = want.len();
                want.extend(
                    [Some(base), src]
                        .into_iter()
                        .flatten()
                        .filter(|&u| !zero(u))
                        .map(|u| (q, u)),
                );
                let nonzero_number = written_number == Some(true);
                self.need_or(&want, move |a| {
                    let read_as_is = a[..indices]
                        .iter()
                        .fold(LocalMeanDims::SPEC, |acc, &f| acc.times(f));
                    let mut terms = a[indices..].to_vec();
                    if nonzero_number {
                        terms.push(LocalMeanDims::SPEC);
                    }
                    spec_first(read_as_is, same(&terms))
                })
            }
            // A claim reads a literal factor the spec lacks (`rank_scaling`): a division by
            // exactly the value's factor settles it.
            "elementwise-mul" | "elementwise-div"
                if self.facts_only && tensors.len() == 1 && op.namespace == "aten" =>
            {
                let scaling = self.rank_scaling(q, v.node, op, args, kwargs);
                let sizes: Vec<usize> = sh.program.mesh.dims.iter().map(|d| d.1).collect();
                self.need_or(&tensors, move |a| settle_by_scaling(a[0], scaling, &sizes))
            }
            "elementwise-mul" | "matmul" | "embedding-backward" | "gather" | "index-select"
            | "index" => self.need_or(&tensors, |a| {
                a.iter().fold(LocalMeanDims::SPEC, |acc, &p| acc.times(p))
            }),
            "elementwise-div" => self.need_or(&tensors, |a| match a {
                [x] => *x,
                [x, d] => spec_first(*d, *x),
                _ => LocalMeanDims {
                    local: 0,
                    unknown: u64::MAX,
                },
            }),
            "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all" | "broadcast" => {
                let over = args
                    .iter()
                    .rev()
                    .find_map(|a| match a {
                        Arg::Str(s) => sh.groups.get(s.as_str()),
                        _ => None,
                    })
                    .and_then(|dims| dims.as_ref())
                    .map_or(u64::MAX, |dims| {
                        dims.iter()
                            .fold(0u64, |a, &k| a | 1u64.checked_shl(k as u32).unwrap_or(0))
                    });
                // A gather, a scatter of sums or an exchange moves (or adds) pieces of one
                // factor: every element keeps it. An all-reduce over `k` may settle it (an
                // average of local means is the spec's), which is not followed: only the
                // spec's pieces pass on `k`.
                let moves = matches!(family, "all-gather" | "reduce-scatter" | "all-to-all");
                // A claim follows an all-reduce's sum or average of partial sums of local
                // means (`settle_by_all_reduce`); the lifts read it themselves.
                let reduce_op = (self.facts_only && family == "all-reduce")
                    .then(|| reduce_op_of(args, kwargs, &sh.groups))
                    .flatten();
                let input = tensors.first().map(|&(_, u)| u);
                let sizes: Vec<usize> = sh.program.mesh.dims.iter().map(|d| d.1).collect();
                match self.first_only(&tensors) {
                    Step::Done(f) if !moves => {
                        let settled = match (reduce_op, input) {
                            (Some(red), Some(x)) => {
                                let on: Vec<Place> = (0..nd).map(|k| place_on(x, k)).collect();
                                settle_by_all_reduce(f, red, over, &on, &sizes)
                            }
                            _ => None,
                        };
                        Step::Done(settled.unwrap_or(LocalMeanDims::settle(
                            f.local & !over,
                            f.unknown | (f.local & over),
                        )))
                    }
                    step => step,
                }
            }
            "nll-loss-backward" | "mse-loss-backward" => {
                // (grad_output, self, target, [weight,] reduction, ..): the mean over a batch
                // a mesh dim splits divides by the rank's count, not the spec's.
                let (reduction, batch) = if family == "nll-loss-backward" {
                    (int_named(4, "reduction"), value_at(2, "target"))
                } else {
                    (int_named(3, "reduction"), value_at(1, "self"))
                };
                let split = batch.map_or(0u64, |b| {
                    (0..nd.min(64))
                        .filter(|&k| {
                            matches!(
                                place_on(b, k),
                                Place::Shard(_) | Place::Blocked(..) | Place::Rows(..)
                            )
                        })
                        .fold(0u64, |a, k| a | (1 << k))
                });
                // mse's element count is n_k times fewer on a plain shard only (rows of a
                // selection may count differently per rank): elsewhere not known.
                let uneven = if family == "mse-loss-backward" {
                    batch.map_or(split, |b| {
                        (0..nd.min(64))
                            .filter(|&k| {
                                split & (1 << k) != 0 && !matches!(place_on(b, k), Place::Shard(_))
                            })
                            .fold(0u64, |a, k| a | (1 << k))
                    })
                } else {
                    0
                };
                let mean = reduction == Some(1);
                let (local, unknown) = if mean && family == "nll-loss-backward" {
                    let target = value_at(2, "target");
                    let total_weight = value_at(6, "total_weight");
                    // The forward's total weight counts the rank's targets not ignored:
                    // equal row shards count alike only where no target is ignored.
                    let counts = self.sh.ignore_index_unused
                        && total_weight.is_some_and(|tw| forward_count(g, tw, target));
                    let weighted = value_at(3, "weight").is_some() || counts_weighted(node);
                    nll_mean_divisor((split, nd), weighted, counts, total_weight, place_on)
                } else if mean {
                    // mse divides by the rank's element count: n_k times fewer on a split.
                    (split & !uneven, uneven)
                } else {
                    (0, 0)
                };
                self.need_or(&tensors, move |a| {
                    let all = a.iter().fold(LocalMeanDims::SPEC, |acc, &p| acc.times(p));
                    all.times(LocalMeanDims::settle(local, unknown))
                })
            }
            _ => self.need_or(&tensors, |a| {
                let any = a.iter().fold(0u64, |acc, f| acc | f.local | f.unknown);
                LocalMeanDims {
                    local: 0,
                    unknown: any,
                }
            }),
        }
    }

    /// The rank's literal factor at call `i` of rank `q` (a `mul` by a number, a `div` by
    /// one) over the spec's at the same position (`scaling::spec_scaling`), as a multiplier:
    /// `Some(1.0)` where the spec scales alike (or the case has no spec: a plan is its own),
    /// `None` where the call is not a plain product or quotient by a number (a rounding
    /// mode, a tensor factor).
    fn rank_scaling(
        &self,
        q: usize,
        i: usize,
        op: &shardproof_ir::OpName,
        args: &[Arg],
        kwargs: &[(String, Arg)],
    ) -> Option<f64> {
        if !kwargs.is_empty() || args.len() != 2 {
            return None;
        }
        let number = match args[1] {
            Arg::Int(x) => x as f64,
            Arg::Float(x) => x,
            _ => return None,
        };
        let as_multiplier = |name: &str, x: f64| match name {
            "mul" => Some(x),
            "div" if x != 0.0 => Some(1.0 / x),
            _ => None,
        };
        let mine = as_multiplier(op.name.as_str(), number)?;
        if !self.sh.has_spec {
            return Some(1.0);
        }
        let name = self.sh.program.ranks[q].nodes[i].name.as_str();
        match super::scaling::spec_scaling(self.sh, q, i, name) {
            Some((spec_op, y, _)) => {
                let theirs = as_multiplier(spec_op.name.as_str(), y)?;
                (theirs != 0.0).then(|| mine / theirs)
            }
            None => Some(mine),
        }
    }

    /// The first input's answer on the mesh dims where every other input is `Spec`.
    fn first_only(&self, tensors: &[(usize, ValueId)]) -> Step {
        if tensors.is_empty() {
            return Step::Done(LocalMeanDims::SPEC);
        }
        self.need_or(tensors, |a| {
            let others = a[1..].iter().fold(0u64, |acc, f| acc | f.local | f.unknown);
            LocalMeanDims::settle(a[0].local, a[0].unknown | others)
        })
    }

    /// `combine` of the answers of `deps` where all are known; else the ones still needed.
    fn need_or(
        &self,
        deps: &[(usize, ValueId)],
        combine: impl Fn(&[LocalMeanDims]) -> LocalMeanDims,
    ) -> Step {
        let missing: Vec<(usize, ValueId)> = deps
            .iter()
            .copied()
            .filter(|d| !self.memo.contains_key(d))
            .collect();
        if !missing.is_empty() {
            return Step::Need(missing);
        }
        let answers: Vec<LocalMeanDims> = deps.iter().map(|d| self.memo[d]).collect();
        Step::Done(combine(&answers))
    }
}

/// What a value's placements claim of its values, beside the placements (issue 44): where the
/// value derives from *local means* (a mean loss's gradient normalized by the rank's own
/// count of a batch a mesh dim splits), the ranks' pieces laid out by the placements make the
/// spec's value times a factor, not the spec's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceFactor {
    /// No local mean reaches the value: its placements describe the spec's value.
    Spec,
    /// Laid out by its placements, the ranks' pieces make the spec's value times this factor
    /// (the product of the sizes of the mesh dims whose pieces are local means; every rank
    /// counting as many of the batch's targets).
    Times(u64),
    /// A local mean reaches the value and its factor is not known (a non-linear use, a
    /// reduction that may settle it, a mix of factors), or the value is a share or a partial
    /// scaled by a factor the spec lacks: the placements claim nothing of its values.
    NotKnown,
}

impl PieceFactor {
    /// The claim of a walk's answer on a mesh of the given `sizes`.
    pub fn of(dims: LocalMeanDims, sizes: &[usize]) -> PieceFactor {
        match dims.factor(sizes) {
            Some(1) => PieceFactor::Spec,
            Some(f) => PieceFactor::Times(f),
            None => PieceFactor::NotKnown,
        }
    }
}

/// Per value of a rank's run, whether its local-means answer is recorded
/// ([`record_local_means`]) and whether it may carry a local mean ([`mark_local_means`]).
#[derive(Default)]
pub(super) struct MeansRecorded {
    /// Per value index: bit 0, recorded (a resumed run's values before its start are);
    /// bit 1, may carry a local mean.
    state: Vec<u8>,
}

impl MeansRecorded {
    /// A run over `values` values whose first `kept` (kept from an earlier run) are recorded.
    pub(super) fn new(values: usize, kept: usize) -> Self {
        let mut state = vec![0u8; values];
        state[..kept.min(values)].fill(1);
        MeansRecorded { state }
    }
}

/// Marks the outputs (`base`, `nout` of them) of a call (`op`) reading `inputs` that may carry
/// a local mean: a mean loss's backward (a source), or a call reading an input recorded as
/// not the spec's pieces (`RankPlacements::local_means`). Elsewhere every input's pieces are
/// the spec's, and so by the walk's rules are the outputs'. A recv is never walked: it
/// takes the sender's record of the sent value (`recv::SentRecords`), and its receiver runs
/// again where that record changes. Call it after [`record_local_means`] of the inputs.
pub(super) fn mark_local_means(
    op: &shardproof_ir::OpName,
    inputs: &[ValueId],
    (base, nout): (usize, usize),
    rp: &RankPlacements,
    marks: &mut MeansRecorded,
) {
    let source = op.namespace == "aten"
        && matches!(op.name.as_str(), "nll_loss_backward" | "mse_loss_backward");
    let reads_one = || {
        inputs
            .iter()
            .any(|u| LocalMeans::at(rp, *u).is_some_and(|a| rp.local_means.contains_key(&a)))
    };
    if op.name != "recv" && (source || reads_one()) {
        for s in marks.state.iter_mut().skip(base).take(nout) {
            *s |= 2;
        }
    }
}

/// Records the walk's answer (`RankPlacements::local_means`) for each of `values` of rank
/// `r` not yet recorded, where it is not the spec's pieces on every mesh dim: for values
/// marked ([`mark_local_means`]), by walks of `memo` ([`Memo::facts`]). A call records its
/// inputs before its rule runs (a finding names their factor), the run's end the rest.
pub(super) fn record_local_means(
    sh: &Shared,
    r: usize,
    values: impl IntoIterator<Item = ValueId>,
    (done, memo): (&[Option<Arc<RankPlacements>>], &mut Memo),
    marks: &mut MeansRecorded,
    rp: &mut RankPlacements,
) {
    let mut answers = Vec::new();
    let mut clears: Vec<(usize, u64)> = Vec::new();
    let mut walk: Option<LocalMeans> = None;
    for v in values {
        let Some(at) = LocalMeans::at(rp, v).filter(|&a| a < marks.state.len()) else {
            continue;
        };
        if marks.state[at] & 1 != 0 {
            continue;
        }
        marks.state[at] |= 1;
        if marks.state[at] & 2 == 0 {
            continue;
        }
        let w = walk.get_or_insert_with(|| LocalMeans::new(sh, r, rp, done, memo));
        let answer = w.of(r, v);
        // Where the walk settles a factor (a call reading a local mean gives the spec's
        // pieces) the answer is recorded too: it overrides the share record the same
        // division leaves (`RankPlacements::piece_factor`), and its readers are walked.
        let settles = || {
            sh.program.ranks[r].nodes[v.node].inputs().iter().any(|u| {
                LocalMeans::at(rp, *u)
                    .and_then(|a| rp.local_means.get(&a))
                    .is_some_and(|d| *d != LocalMeanDims::SPEC)
            })
        };
        if answer != LocalMeanDims::SPEC || settles() {
            // A division that settles a local mean's factor is no share: its `scaled` record
            // (each copy the spec's over n, as the rules read a replicated value divided by
            // n) is cleared on the mesh dims it settled, so a later sum is not a lift.
            let settled = sh.program.ranks[r].nodes[v.node]
                .inputs()
                .iter()
                .filter_map(|u| LocalMeans::at(rp, *u).and_then(|a| rp.local_means.get(&a)))
                .fold(0u64, |acc, d| acc | d.local)
                & !answer.local
                & !answer.unknown;
            clears.push((at, settled));
            answers.push((at, answer));
        }
    }
    if let Some(w) = walk {
        w.finish(memo);
    }
    rp.local_means.extend(answers);
    let nd = sh.program.mesh.dims.len();
    for (at, settled) in clears {
        for k in (0..nd.min(64)).filter(|&k| settled & (1 << k) != 0) {
            if let Some(s) = rp.scaled.get_mut(at * nd + k) {
                *s = false;
            }
        }
    }
}

/// The reduction an all-reduce's arguments name (a string that is no group's name).
fn reduce_op_of(
    args: &[Arg],
    kwargs: &[(String, Arg)],
    groups: &HashMap<String, Option<Vec<usize>>>,
) -> Option<Red> {
    args.iter()
        .chain(kwargs.iter().map(|(_, a)| a))
        .filter_map(|a| match a {
            Arg::Str(s) if !groups.contains_key(s.as_str()) => Red::parse(s),
            _ => None,
        })
        .next()
}

/// A claim's answer after an all-reduce by `red` over the mesh dims `over` of a value
/// answered `f`, placed `on` per mesh dim (mesh sizes `sizes`); `None` where the reduction
/// is not followed (every local-mean dim of the group is then not known). A sum of partial
/// sums whose pieces are local means on k is `n_k` times the spec's sum on every member:
/// k stays a local-mean dim (the value's factor, now on a replicated value). An average
/// divides by the group's size: where every mesh dim of the group that does not hold equal
/// copies (more than one coordinate, not `Replicate`) holds partial sums of local means, the
/// `n_k` factors and the division cancel, and those dims are the spec's. A sum over a dim of
/// equal copies of a local mean is `n_k²` times: not known.
fn settle_by_all_reduce(
    f: LocalMeanDims,
    red: Red,
    over: u64,
    on: &[Place],
    sizes: &[usize],
) -> Option<LocalMeanDims> {
    let in_group = |k: usize| k < 64 && over & (1 << k) != 0;
    let partial_sum = |k: usize| on.get(k) == Some(&Place::Partial(Red::Sum));
    let local = |k: usize| k < 64 && f.local & (1 << k) != 0;
    let group: Vec<usize> = (0..sizes.len().min(64)).filter(|&k| in_group(k)).collect();
    match red {
        Red::Sum => {
            let kept = group
                .iter()
                .filter(|&&k| local(k) && partial_sum(k))
                .fold(0u64, |a, &k| a | (1 << k));
            let local_in_group = f.local & over;
            Some(LocalMeanDims::settle(
                (f.local & !over) | kept,
                f.unknown | (local_in_group & !kept),
            ))
        }
        Red::Avg => {
            let divided: Vec<usize> = group
                .iter()
                .copied()
                .filter(|&k| sizes[k] > 1 && on.get(k) != Some(&Place::Replicate))
                .collect();
            if divided.is_empty() || !divided.iter().all(|&k| local(k) && partial_sum(k)) {
                return None;
            }
            let cleared = divided.iter().fold(0u64, |a, &k| a | (1 << k));
            Some(LocalMeanDims::settle(f.local & !cleared, f.unknown))
        }
        Red::Max | Red::Min => None,
    }
}

/// A claim's answer after a product or quotient by a number, the rank's factor over the
/// spec's `scaling` (a multiplier; `None`: not read) on a value answered `f` (mesh sizes
/// `sizes`): the spec's own factor (1) passes the answer; exactly the inverse of the value's
/// factor makes it the spec's; any other makes its local-mean dims not known (the value is
/// some other multiple of the spec's, which the answer does not count), and on the spec's
/// pieces every mesh dim.
fn settle_by_scaling(f: LocalMeanDims, scaling: Option<f64>, sizes: &[usize]) -> LocalMeanDims {
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    if f.local == 0 {
        // The spec's pieces scaled by a number the spec lacks are not the spec's.
        return match scaling {
            Some(s) if near(s, 1.0) => f,
            _ => LocalMeanDims::settle(0, u64::MAX),
        };
    }
    match (scaling, f.factor(sizes)) {
        (Some(s), _) if near(s, 1.0) => f,
        (Some(s), Some(factor)) if near(s * factor as f64, 1.0) => {
            LocalMeanDims::settle(0, f.unknown)
        }
        _ => LocalMeanDims::settle(0, f.unknown | f.local),
    }
}

/// Whether an argument is a number other than zero (a term or fill of the spec's own).
fn nonzero_number(a: Option<&Arg>) -> bool {
    match a {
        Some(Arg::Int(x)) => *x != 0,
        Some(Arg::Float(x)) => *x != 0.0,
        _ => false,
    }
}

/// The mesh dims (`local`, `unknown`) on which a mean `nll_loss_backward` over a batch the
/// mesh dims `split` split divides by the rank's own count. The divisor is `total_weight`:
/// the forward's over row shards is the rank's count, a partial sum of the batch's
/// (`Partial(sum)`: each piece `n_k` times the spec's, every rank counting as many targets);
/// a replicated one is the spec's divisor (the spec's pieces); any other, or class weights
/// (`weight`: each rank's count weighs its own targets, no common factor), is not known.
///
/// A partial-sum divisor is the rank's count only where it is the forward's total weight
/// over the same targets (`counts`, [`forward_count`]); any other partial sum (`sum(y)`, an
/// input) divides each rank by its own piece of it, no common factor. On a mesh dim that
/// does not split the targets the divisor (`divisor`) must not be partial: a partial one
/// divides every rank by a different piece.
fn nll_mean_divisor(
    (split, nd): (u64, usize),
    weighted: bool,
    counts: bool,
    divisor: Option<ValueId>,
    place_on: impl Fn(ValueId, usize) -> Place,
) -> (u64, u64) {
    let (mut local, mut unknown) = (0u64, 0u64);
    for k in 0..nd.min(64) {
        let on_k = divisor.map_or(Place::Unknown, |t| place_on(t, k));
        if split & (1 << k) == 0 {
            if on_k.is_partial() {
                unknown |= 1 << k;
            }
            continue;
        }
        match on_k {
            Place::Replicate => {}
            Place::Partial(Red::Sum) if !weighted && counts => local |= 1 << k,
            _ => unknown |= 1 << k,
        }
    }
    (local, unknown)
}

/// Whether `tw` is the total weight of an `nll_loss_forward` over `target` (output 1), or
/// such a total weight passed on by a copy or an all-reduce by sum: the count of the rank's
/// targets, or of a group's.
fn forward_count(g: &shardproof_ir::Graph, tw: ValueId, target: Option<ValueId>) -> bool {
    let mut at = tw;
    for _ in 0..8 {
        let node = &g.nodes[at.node];
        let Some(op) = node.op() else {
            return false;
        };
        match op.name.as_str() {
            "nll_loss_forward" => {
                // Class weights in the forward make its total weight a weighted count.
                let weight = node.args().get(2).or_else(|| node.kwarg("weight"));
                if !matches!(weight, None | Some(Arg::None)) {
                    return false;
                }
                let t = match node.args().get(1).or_else(|| node.kwarg("target")) {
                    Some(Arg::Value(u)) => Some(*u),
                    _ => None,
                };
                return at.output == 1 && t.is_some() && t == target;
            }
            "wait_tensor" | "clone" | "detach" | "_to_copy" => {}
            "all_reduce"
                if node
                    .args()
                    .iter()
                    .any(|a| matches!(a, Arg::Str(s) if s == "sum")) => {}
            _ => return false,
        }
        match node.inputs().first() {
            Some(&u) => at = u,
            None => return false,
        }
    }
    false
}

/// Whether an `nll_loss_backward` call names class weights by keyword (a value, not `None`).
fn counts_weighted(node: &shardproof_ir::Node) -> bool {
    matches!(node.kwarg("weight"), Some(Arg::Value(_)))
}

/// The common answer of a sum's terms, per mesh dim (none: `Spec`, a sum of zeros): where
/// they differ, `Unknown`.
fn same(a: &[LocalMeanDims]) -> LocalMeanDims {
    let any_local = a.iter().fold(0u64, |acc, f| acc | f.local);
    let all_local = a.iter().fold(u64::MAX, |acc, f| acc & f.local);
    let unknown = a.iter().fold(0u64, |acc, f| acc | f.unknown);
    if a.is_empty() {
        return LocalMeanDims::SPEC;
    }
    LocalMeanDims::settle(all_local, unknown | (any_local & !all_local))
}

/// `then` on the mesh dims where `read_as_is` (a mask, an index, a divisor) is `Spec`;
/// `Unknown` elsewhere.
fn spec_first(read_as_is: LocalMeanDims, then: LocalMeanDims) -> LocalMeanDims {
    LocalMeanDims::settle(
        then.local,
        then.unknown | read_as_is.local | read_as_is.unknown,
    )
}

/// A folded share read as a share (a lift on mesh dim `m`, `folded_reads`) commits to its
/// reading: the rank's factor was a local mean over the other mesh dims still pending, so
/// their pieces are each `n_k` times the spec's. Where the call is the all-reduce that sums
/// the shares, pieces of `k` already summed into a partial (`Partial(sum)`) average instead
/// (`Partial(avg)`: a later sum over `k` is `n_k` times the tensor, `times_n`). Where it is a
/// partial plus the share while `k` still shards it, the sum is one tensor only where the
/// partial's pieces on `k` are local means too (`local_means`): else `k` is `Unknown`. A shard
/// of `k` summed by the all-reduce is `Unknown` (a shard carries no factor), and so is any
/// other placement on `k` (the pieces gathered, or a partial that another call mixed with
/// other terms).
pub(super) fn commit_folded(
    sh: &Shared,
    (r, i): (usize, usize),
    nout: usize,
    base: usize,
    (done, memo): (&[Option<std::sync::Arc<RankPlacements>>], &mut Memo),
    folded_reads: &[(usize, u64, bool)],
    rp: &mut RankPlacements,
) {
    let mesh = &sh.program.mesh;
    let nd = mesh.dims.len();
    for &(m, pending, lifted) in folded_reads {
        for k in (0..nd.min(64)).filter(|&k| pending & (1 << k) != 0) {
            // The partial's pieces on `k` beside a share still sharded there: local means?
            let sharded = (0..nout).any(|o| {
                matches!(
                    rp.places[(base + o) * nd + k],
                    Place::Shard(_) | Place::Blocked(..) | Place::Rows(..)
                )
            });
            let partial_pieces = if sharded && !lifted {
                let inputs = sh.program.ranks[r].nodes[i].inputs();
                let partials: Vec<ValueId> = inputs
                    .into_iter()
                    .filter(|&v| rp.of(v, nd)[m].is_partial())
                    .collect();
                let mut walk = LocalMeans::new(sh, r, rp, done, memo);
                let all_local = !partials.is_empty()
                    && partials
                        .iter()
                        .all(|&v| walk.of(r, v).on(k) == Pieces::LocalMean);
                walk.finish(memo);
                Some(all_local)
            } else {
                None
            };
            for o in 0..nout {
                let at = (base + o) * nd + k;
                let why = match rp.places[at] {
                    Place::Partial(Red::Sum) if lifted => {
                        rp.places[at] = Place::Partial(Red::Avg);
                        None
                    }
                    // A partial plus the share while `k` still shards both: their pieces on
                    // `k` are local means alike, and stay so (`local_means` reads the share's
                    // records on).
                    Place::Shard(_) | Place::Blocked(..) | Place::Rows(..)
                        if partial_pieces == Some(true) =>
                    {
                        rp.lifted_means[base + o] |= 1 << k;
                        None
                    }
                    Place::Shard(_) | Place::Blocked(..) | Place::Rows(..) if !lifted => {
                        Some(format!(
                            "a share on mesh dim `{}` read by a folded mean (pieces each n times \
                             the spec's on mesh dim `{}`, a local mean) is added to a partial \
                             whose pieces there are not known to be local means: the sum mixes \
                             two factors",
                            mesh.dims[m].0, mesh.dims[k].0
                        ))
                    }
                    Place::Unknown => None,
                    // An all-reduce sum of the shares while `k` still shards them, or any
                    // other placement: the pieces on `k` are each `n_k` times the spec's,
                    // which the placement does not carry.
                    _ => Some(format!(
                        "a share on mesh dim `{}` read by a folded mean leaves pieces \
                         each n times the spec's on mesh dim `{}` (a local mean), in a \
                         placement that does not carry them",
                        mesh.dims[m].0, mesh.dims[k].0
                    )),
                };
                if let Some(why) = why {
                    rp.places[at] = Place::Unknown;
                    rp.unknown_sources.push((i, why));
                }
            }
        }
    }
}

/// How a reduction over mesh dim `m` reads its input, a `Partial(sum)` there derived from a
/// share lifted by a partial plus it while `m` sharded both (`lifted_means`, bit `m`): the
/// lift took the pieces on `m` as local means, so the value is the spec's times a factor, the
/// product of the sizes of every mesh dim whose local means reach it (`LocalMeanDims::factor`:
/// `n_dp · n_ep` for DeepSeek's expert gradients, whose rows were gathered over ep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LiftedReduction {
    /// Not such a reduction (another call, value or mesh dim): as the rules read it.
    Ordinary,
    /// A reduce-scatter sum of pieces the walk still finds local means on `m`: as the rules
    /// read it, the shard each member gets `factor` times the spec's shard
    /// (`scattered_factor`), until a division by exactly the factor or a reduction that
    /// reads it (`Sum`, `Average`: a later lift's walk counts the same local means).
    Scattered {
        /// The value's factor (of every mesh dim whose local means reach it).
        factor: u64,
    },
    /// The pieces are no longer known to be local means on `m`, or the factor is not known
    /// (a product of two local means, a sum with the spec's pieces): `Unknown`.
    Unread,
    /// An all-reduce sum: every member holds the tensor times `factor`, read as pieces that
    /// average (`Partial(avg)`), so the sum is `times_n` and only a division by the factor
    /// completes it. `factor` is recorded on the first mesh dim of the group so read (`1` on
    /// the others: the product over the `times_n` dims is the factor once).
    Sum {
        /// What this mesh dim records as its part of the factor.
        factor: u64,
    },
    /// An all-reduce or reduce-scatter average over a group as large as the factor: the
    /// pieces average to the tensor (`Partial(avg)`), the average is the tensor (its shard).
    Average,
    /// An all-reduce or reduce-scatter average over a group of another size than the factor
    /// (or a reduce-scatter of another reduction): the tensor times
    /// the factor over the group's size, which no placement carries: `Unknown`.
    AverageOff {
        /// The value's factor.
        factor: u64,
        /// The group's size.
        group: u64,
    },
}

impl LiftedReduction {
    /// Why the reduction (of operator `op`, on mesh dim `dim`) is `Unknown`, where it is.
    pub(super) fn why(self, op: &impl std::fmt::Display, dim: &str) -> Option<String> {
        match self {
            LiftedReduction::Unread => Some(format!(
                "`{op}` on mesh dim `{dim}` reduces a partial derived from a share lifted \
                 while the mesh dim sharded it (pieces each n times the spec's, local \
                 means), whose pieces are no longer known to be local means: what \
                 the reduction gives is not proven"
            )),
            LiftedReduction::AverageOff { factor, group } => Some(format!(
                "`{op}` on mesh dim `{dim}` averages over {group} members a partial \
                 whose pieces are local means, {factor} times the spec's: the \
                 average is {factor}/{group} times the tensor"
            )),
            _ => None,
        }
    }
}

/// How the reduction (`family`, `reduce_op`, over the mesh dims `group`) on mesh dim `m` of
/// rank `r` reads its input `v` (`Some` where a `Partial(sum)` on `m`), a partial derived from
/// a lifted share (see [`LiftedReduction`]). The factor counts every mesh dim, so a group
/// over dp alone divided by dp x ep (plan 039's expert gradients) completes the mean, and a
/// sum with no division (dp summing the ranks' local means) is never read as the tensor.
#[allow(clippy::too_many_arguments)]
pub(super) fn lifted_reduction(
    sh: &Shared,
    (r, m): (usize, usize),
    family: &str,
    reduce_op: Option<Red>,
    group: &[usize],
    v: Option<ValueId>,
    (rp, done, memo): (
        &RankPlacements,
        &[Option<std::sync::Arc<RankPlacements>>],
        &mut Memo,
    ),
) -> LiftedReduction {
    let nd = sh.program.mesh.dims.len();
    let lifted = |v: ValueId, k: usize| {
        k < 64 && rp.lifted_means[rp.offsets[v.node] as usize + v.output] & (1 << k) != 0
    };
    let Some(v) = v else {
        return LiftedReduction::Ordinary;
    };
    if !group.contains(&m) || !matches!(family, "all-reduce" | "reduce-scatter") || !lifted(v, m) {
        return LiftedReduction::Ordinary;
    }
    let sizes: Vec<usize> = sh.program.mesh.dims.iter().map(|d| d.1).collect();
    let mut walk = LocalMeans::new(sh, r, rp, done, memo);
    let answer = walk.of(r, v);
    walk.finish(memo);
    if answer.on(m) != Pieces::LocalMean {
        return LiftedReduction::Unread;
    }
    let Some(factor) = answer.factor(&sizes) else {
        return LiftedReduction::Unread;
    };
    match reduce_op {
        Some(Red::Sum) if family == "reduce-scatter" => LiftedReduction::Scattered { factor },
        Some(Red::Sum) => {
            // The group's mesh dims this reading applies to: each reads the same input, so
            // the first of them records the factor.
            let first = group
                .iter()
                .copied()
                .filter(|&k| {
                    k == m
                        || (k < nd
                            && lifted(v, k)
                            && rp.of(v, nd)[k] == Place::Partial(Red::Sum)
                            && answer.on(k) == Pieces::LocalMean)
                })
                .min();
            LiftedReduction::Sum {
                factor: if first == Some(m) { factor } else { 1 },
            }
        }
        Some(Red::Avg) => {
            // A mesh dim of the group on which the value is replicated averages equal
            // copies: it divides nothing, so only the others count against the factor (rows
            // gathered over ep, then averaged over a group of dp and ep: ep times the tensor).
            let size: u64 = group
                .iter()
                .filter(|&&k| k == m || rp.of(v, nd).get(k) != Some(&Place::Replicate))
                .map(|&k| sizes.get(k).copied().unwrap_or(0) as u64)
                .product();
            if size == factor {
                LiftedReduction::Average
            } else {
                LiftedReduction::AverageOff {
                    factor,
                    group: size,
                }
            }
        }
        // A reduce-scatter of another (or no known) reduction of a lifted partial: its
        // factor is not read.
        _ if family == "reduce-scatter" => LiftedReduction::Unread,
        _ => LiftedReduction::Ordinary,
    }
}

/// Carries the records of a reduce-scatter's factor (`scattered_factor`) from a call's
/// `inputs` to its outputs (`base`, `nout` of them): through a copy or view of one input
/// (`rules::moves_values`: a division after it still divides the shard `f` times the
/// spec's) the factor itself, through any other call `u64::MAX` (no division clears it: a
/// division after `exp` or a sum with other terms does not undo the factor). Returns whether
/// the call (`op`) writes one in place (`copy_`, `add_`): a write the record is not
/// followed through, made `Unknown` by [`unsettled_scattered_factors`].
pub(super) fn carry_scattered_factor(
    op: &shardproof_ir::OpName,
    inputs: &[ValueId],
    base: usize,
    nout: usize,
    rp: &mut RankPlacements,
) -> bool {
    let carried = inputs
        .iter()
        .filter_map(|v| {
            let at = rp.offsets[v.node] as usize + v.output;
            rp.scattered_factor.get(&at).copied()
        })
        .reduce(|a, b| if a == b { a } else { u64::MAX });
    let moved = carried.is_some()
        && inputs.len() == 1
        && rules::rule(&op.base()).is_some_and(|rule| rules::moves_values(rule.family));
    let carried = carried.map(|f| if moved { f } else { u64::MAX });
    for o in 0..nout {
        match carried {
            Some(f) => rp.scattered_factor.insert(base + o, f),
            None => rp.scattered_factor.remove(&(base + o)),
        };
    }
    carried.is_some() && op.name.ends_with('_') && !op.name.ends_with("__")
}

/// Where a reduce-scatter's factor (`scattered_factor`) is still carried once a rank's run
/// (from node `start`) is done, by a graph output or by the in-place writes (`writes`):
/// the value is `Unknown` on every mesh dim (`nd`), its shards some factor times the spec's.
pub(super) fn unsettled_scattered_factors(
    g: &shardproof_ir::Graph,
    start: usize,
    nd: usize,
    writes: &[usize],
    rp: &mut RankPlacements,
) {
    let outputs = g.outputs.iter().flatten().filter(|v| v.node >= start);
    let written = writes
        .iter()
        .flat_map(|&i| (0..g.nodes[i].outputs.len().max(1)).map(move |o| ValueId::new(i, o)));
    let unsettled: Vec<ValueId> = outputs
        .copied()
        .chain(written)
        .filter(|v| {
            let at = rp.offsets[v.node] as usize + v.output;
            rp.scattered_factor.contains_key(&at)
        })
        .collect();
    for v in unsettled {
        let at = rp.offsets[v.node] as usize + v.output;
        if (at + 1) * nd > rp.places.len() {
            continue;
        }
        let factor = rp.scattered_factor[&at];
        rp.places[at * nd..(at + 1) * nd].fill(Place::Unknown);
        let what = if factor == u64::MAX {
            "its shards some factor times the spec's, read by a call other than a copy or view"
                .to_string()
        } else {
            format!("{factor} times the spec's shard")
        };
        rp.unknown_sources.push((
            v.node,
            format!(
                "derives from a reduce-scatter of local means ({what}) that no division by the factor, and no reduction reading it, settled: the value is not the spec's"
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::{same, spec_first, LocalMeanDims, Pieces};

    const DP: u64 = 1;
    const TP: u64 = 2;
    const EP: u64 = 4;

    fn local(bits: u64) -> LocalMeanDims {
        LocalMeanDims {
            local: bits,
            unknown: 0,
        }
    }

    #[test]
    fn the_factor_is_the_product_of_every_local_mesh_dim_and_unknown_where_one_is() {
        let sizes = [4, 2, 2];
        assert_eq!(local(DP | EP).factor(&sizes), Some(8));
        assert_eq!(local(0).factor(&sizes), Some(1));
        // An unknown mesh dim of more than one coordinate: the factor is not known.
        let unknown_tp = LocalMeanDims {
            local: DP,
            unknown: TP,
        };
        assert_eq!(unknown_tp.factor(&sizes), None);
        // Of one coordinate it is 1 either way.
        assert_eq!(unknown_tp.factor(&[4, 1, 2]), Some(4));
    }

    #[test]
    fn a_product_counts_each_mesh_dim_once_and_a_sum_needs_one_answer() {
        // Local means of different mesh dims multiply into one factor.
        assert_eq!(local(DP).times(local(EP)), local(DP | EP));
        // Two local means of one mesh dim are n² times the spec's: not counted.
        let squared = local(DP).times(local(DP | EP));
        assert_eq!(squared.on(0), Pieces::Unknown);
        assert_eq!(squared.on(2), Pieces::LocalMean);
        // A sum of a local mean and the spec's pieces mixes factors on that mesh dim only.
        let mixed = same(&[local(DP | EP), local(EP)]);
        assert_eq!(mixed.on(0), Pieces::Unknown);
        assert_eq!(mixed.on(2), Pieces::LocalMean);
        assert_eq!(mixed.on(1), Pieces::Spec);
        assert_eq!(same(&[]), local(0));
        // A divisor (or mask, or index) that is not the spec's makes its mesh dims unknown.
        let quotient = spec_first(local(EP), local(DP));
        assert_eq!(
            (quotient.on(0), quotient.on(2)),
            (Pieces::LocalMean, Pieces::Unknown)
        );
    }
}
