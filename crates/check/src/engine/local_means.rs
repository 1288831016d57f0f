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

impl Pieces {
    /// A product's answer from its factors': at most one local mean.
    fn times(self, o: Pieces) -> Pieces {
        match (self, o) {
            (Pieces::Spec, x) | (x, Pieces::Spec) => x,
            _ => Pieces::Unknown,
        }
    }
}

/// The answers of a run's walks, per mesh dim asked about: every value a walk reads comes
/// before the call asking (or from another rank's finished run), so its answer holds for the
/// rest of the run.
#[derive(Default)]
pub(super) struct Memo {
    per_dim: HashMap<usize, HashMap<(usize, ValueId), Pieces>>,
}

/// One walk's state: the rank being propagated (`r`, its placements so far `rp`), the other
/// ranks' placements (`done`), the mesh dim asked about (`k`), and the answers so far.
pub(super) struct LocalMeans<'a, 's> {
    sh: &'a Shared<'s>,
    r: usize,
    rp: &'a RankPlacements,
    done: &'a [Option<Arc<RankPlacements>>],
    k: usize,
    memo: HashMap<(usize, ValueId), Pieces>,
    visits: usize,
}

/// What one value's answer needs: the answer, or the values to answer first.
enum Step {
    Done(Pieces),
    Need(Vec<(usize, ValueId)>),
}

impl<'a, 's> LocalMeans<'a, 's> {
    /// A walk about mesh dim `k` from rank `r` (placements so far `rp`), starting from the
    /// answers of the run's earlier walks (`memo`; give them back with [`Self::finish`]).
    pub(super) fn new(
        sh: &'a Shared<'s>,
        r: usize,
        rp: &'a RankPlacements,
        done: &'a [Option<Arc<RankPlacements>>],
        k: usize,
        memo: &mut Memo,
    ) -> Self {
        LocalMeans {
            sh,
            r,
            rp,
            done,
            k,
            memo: memo.per_dim.remove(&k).unwrap_or_default(),
            visits: 0,
        }
    }

    /// Hands this walk's answers back to the run's `memo`.
    pub(super) fn finish(self, memo: &mut Memo) {
        memo.per_dim.insert(self.k, self.memo);
    }

    /// The answer for value `v` of rank `q`.
    pub(super) fn of(&mut self, q: usize, v: ValueId) -> Pieces {
        let mut stack = vec![(q, v)];
        let mut open: HashSet<(usize, ValueId)> = HashSet::new();
        while let Some(&top) = stack.last() {
            if self.memo.contains_key(&top) {
                stack.pop();
                continue;
            }
            self.visits += 1;
            if self.visits > MAX_VISITS {
                return Pieces::Unknown;
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
                            self.memo.insert(d, Pieces::Unknown);
                        } else {
                            stack.push(d);
                        }
                    }
                }
            }
        }
        self.memo.get(&(q, v)).copied().unwrap_or(Pieces::Unknown)
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
        let sh = self.sh;
        let k = self.k;
        let nd = sh.program.mesh.dims.len();
        let Some(rp) = self.placements(q) else {
            return Step::Done(Pieces::Unknown);
        };
        let g = &sh.program.ranks[q];
        let Some(at) = Self::at(rp, v).filter(|&a| (a + 1) * nd <= rp.places.len()) else {
            return Step::Done(Pieces::Unknown);
        };
        // The folded share's records: pieces of `k` summed instead of averaged, or pending.
        let bit = 1u64.checked_shl(k as u32).unwrap_or(0);
        let records = (0..nd).map(|m| at * nd + m);
        if records.clone().any(|x| rp.folded_summed[x] & bit != 0) {
            return Step::Done(Pieces::Unknown);
        }
        if records.clone().any(|x| rp.folded_pending[x] & bit != 0) {
            return Step::Done(Pieces::LocalMean);
        }
        let node = &g.nodes[v.node];
        let NodeKind::Call { op, args, .. } = &node.kind else {
            // A graph input or a module constant: the case's pieces of the spec's tensor.
            return Step::Done(Pieces::Spec);
        };
        // A received message: the sender's value.
        if op.name == "recv" {
            return match sh.messages.get(&(q, v.node)) {
                Some(&(s, j)) => match sh.program.ranks[s].nodes[j].inputs().first() {
                    Some(&sent) => self.need_or(&[(s, sent)], |a| a[0]),
                    None => Step::Done(Pieces::Unknown),
                },
                None => Step::Done(Pieces::Unknown),
            };
        }
        let tensors: Vec<(usize, ValueId)> = node.inputs().into_iter().map(|u| (q, u)).collect();
        let zero = |u: ValueId| Self::at(rp, u).is_some_and(|a| rp.zero.get(a) == Some(&true));
        let place_on_k = |u: ValueId| {
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
        let int_at = |n: usize| match args.get(n) {
            Some(Arg::Int(x)) => Some(*x),
            _ => None,
        };
        match family {
            "linear-unary" | "view" | "transpose" | "permute" | "unsqueeze" | "squeeze"
            | "expand" | "repeat" | "slice" | "select" | "split" | "flip" | "triangle" | "pad"
            | "scan" => self.first_only(&tensors),
            "reduction" if matches!(op.name.as_str(), "sum" | "mean") => self.first_only(&tensors),
            "elementwise-add" | "cat" | "stack" | "slice-scatter" | "copy" => {
                let terms: Vec<(usize, ValueId)> =
                    tensors.iter().copied().filter(|&(_, u)| !zero(u)).collect();
                self.need_or(&terms, same)
            }
            // Linear in the values, the mask read as is.
            "where" => match (positional(0), positional(1), positional(2)) {
                (Some(c), a, b) => {
                    let mut want = vec![(q, c)];
                    want.extend(
                        [a, b]
                            .into_iter()
                            .flatten()
                            .filter(|&u| !zero(u))
                            .map(|u| (q, u)),
                    );
                    self.need_or(&want, |a| {
                        if a[0] == Pieces::Spec {
                            same(&a[1..])
                        } else {
                            Pieces::Unknown
                        }
                    })
                }
                _ => Step::Done(Pieces::Unknown),
            },
            // A zero fill keeps every piece's factor.
            "masked-fill"
                if matches!(args.get(2), Some(Arg::Int(0)))
                    || matches!(args.get(2), Some(Arg::Float(x)) if *x == 0.0)
                    || positional(2).is_some_and(zero) =>
            {
                let (Some(x), Some(mask)) = (positional(0), positional(1)) else {
                    return Step::Done(Pieces::Unknown);
                };
                self.need_or(&[(q, x), (q, mask)], |a| {
                    if a[1] == Pieces::Spec {
                        a[0]
                    } else {
                        Pieces::Unknown
                    }
                })
            }
            // Written values and the tensor written into: one sum; the index read as is.
            "scatter" | "index-put" => {
                let values_at = if family == "scatter" { 3 } else { 2 };
                let (Some(base), Some(src)) = (positional(0), positional(values_at)) else {
                    return Step::Done(Pieces::Unknown);
                };
                let mut want: Vec<(usize, ValueId)> = tensors
                    .iter()
                    .copied()
                    .filter(|&(_, u)| u != base && u != src)
                    .collect();
                let indices = want.len();
                want.extend(
                    [base, src]
                        .into_iter()
                        .filter(|&u| !zero(u))
                        .map(|u| (q, u)),
                );
                self.need_or(&want, move |a| {
                    if a[..indices].iter().all(|&p| p == Pieces::Spec) {
                        same(&a[indices..])
                    } else {
                        Pieces::Unknown
                    }
                })
            }
            "elementwise-mul"
            | "matmul"
            | "activation-backward"
            | "softmax-backward"
            | "norm-backward"
            | "embedding-backward"
            | "gather"
            | "index-select"
            | "index" => self.need_or(&tensors, |a| {
                a.iter().fold(Pieces::Spec, |acc, &p| acc.times(p))
            }),
            "elementwise-div" => self.need_or(&tensors, |a| match a {
                [x] => *x,
                [x, Pieces::Spec] => *x,
                _ => Pieces::Unknown,
            }),
            "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all" | "broadcast" => {
                let over_k = args
                    .iter()
                    .rev()
                    .find_map(|a| match a {
                        Arg::Str(s) => sh.groups.get(s.as_str()),
                        _ => None,
                    })
                    .is_none_or(|dims| dims.as_ref().is_none_or(|d| d.contains(&k)));
                // A gather, a scatter of sums or an exchange over `k` moves (or adds) pieces
                // of one factor: every element keeps it. An all-reduce over `k` may settle
                // it (an average of local means is the spec's), which is not followed.
                let moves = matches!(family, "all-gather" | "reduce-scatter" | "all-to-all");
                if over_k && !moves {
                    self.need_or(&tensors, |a| {
                        if a.iter().all(|&p| p == Pieces::Spec) {
                            Pieces::Spec
                        } else {
                            Pieces::Unknown
                        }
                    })
                } else {
                    self.first_only(&tensors)
                }
            }
            "nll-loss-backward" | "mse-loss-backward" => {
                // (grad_output, self, target, [weight,] reduction, ..): the mean over a batch
                // `k` splits divides by the rank's count, not the spec's.
                let (reduction, batch) = if family == "nll-loss-backward" {
                    (int_at(4), positional(2))
                } else {
                    (int_at(3), positional(1))
                };
                let split = batch.is_some_and(|b| {
                    matches!(
                        place_on_k(b),
                        Place::Shard(_) | Place::Blocked(..) | Place::Rows(..)
                    )
                });
                self.need_or(&tensors, move |a| {
                    let all = a.iter().fold(Pieces::Spec, |acc, &p| acc.times(p));
                    if reduction == Some(1) && split {
                        all.times(Pieces::LocalMean)
                    } else {
                        all
                    }
                })
            }
            _ => self.need_or(&tensors, |a| {
                if a.iter().all(|&p| p == Pieces::Spec) {
                    Pieces::Spec
                } else {
                    Pieces::Unknown
                }
            }),
        }
    }

    /// The first input's answer where every other input is `Spec`.
    fn first_only(&self, tensors: &[(usize, ValueId)]) -> Step {
        if tensors.is_empty() {
            return Step::Done(Pieces::Spec);
        }
        self.need_or(tensors, |a| {
            if a[1..].iter().all(|&p| p == Pieces::Spec) {
                a[0]
            } else {
                Pieces::Unknown
            }
        })
    }

    /// `combine` of the answers of `deps` where all are known; else the ones still needed.
    fn need_or(&self, deps: &[(usize, ValueId)], combine: impl Fn(&[Pieces]) -> Pieces) -> Step {
        let missing: Vec<(usize, ValueId)> = deps
            .iter()
            .copied()
            .filter(|d| !self.memo.contains_key(d))
            .collect();
        if !missing.is_empty() {
            return Step::Need(missing);
        }
        let answers: Vec<Pieces> = deps.iter().map(|d| self.memo[d]).collect();
        Step::Done(combine(&answers))
    }
}

/// The common answer of a sum's terms (none: `Spec`, a sum of zeros).
fn same(a: &[Pieces]) -> Pieces {
    match a.first() {
        None => Pieces::Spec,
        Some(&p) if a.iter().all(|&x| x == p) => p,
        Some(_) => Pieces::Unknown,
    }
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
                let mut walk = LocalMeans::new(sh, r, rp, done, k, memo);
                let all_local = !partials.is_empty()
                    && partials.iter().all(|&v| walk.of(r, v) == Pieces::LocalMean);
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

/// The input `v` (a `Partial(sum)` on mesh dim `m`) of a reduction over `m` (an all-reduce or
/// reduce-scatter whose group holds `m`, `in_group`) that derives from a share lifted by a
/// partial plus it while `m` sharded both (`lifted_means`), where the local-means walk does
/// not answer `LocalMean` for it on `m`: the lift took its pieces there as local means, each
/// `n_m` times the spec's, and they are no longer known to be (a product of two, a sum with
/// the spec's pieces): what they reduce to is not known. `None` for any other call or value.
/// Where the walk does answer `LocalMean`, the reduction is taken as the rules take it: how
/// many times the spec's the pieces are is not read (the walk's answer is per mesh dim, and
/// rows gathered over another mesh dim carry that dim's local means into these pieces too:
/// DeepSeek's expert gradients are `n_dp * n_ep` times the spec's on dp).
pub(super) fn lifted_without_local_means(
    sh: &Shared,
    (r, m): (usize, usize),
    family: &str,
    in_group: bool,
    v: Option<ValueId>,
    (rp, done, memo): (
        &RankPlacements,
        &[Option<std::sync::Arc<RankPlacements>>],
        &mut Memo,
    ),
) -> Option<ValueId> {
    let v = v?;
    if !in_group
        || !matches!(family, "all-reduce" | "reduce-scatter")
        || m >= 64
        || rp.lifted_means[rp.offsets[v.node] as usize + v.output] & (1 << m) == 0
    {
        return None;
    }
    let mut walk = LocalMeans::new(sh, r, rp, done, m, memo);
    let local = walk.of(r, v) == Pieces::LocalMean;
    walk.finish(memo);
    (!local).then_some(v)
}
