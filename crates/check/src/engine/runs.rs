//! Equal runs along a dim: a tensor whose dim `d` is `R` runs of `c` elements, each run
//! constant along `d` (every slice within a run the same). A view merging `[R, c]` with the
//! `c` dim constant makes one: a `[R, S]` table expanded to `[R, c, S]` and merged to
//! `[R * c, S]` (the MoE router's gradient under sequence parallelism). Beside a blocked
//! shard of `k` blocks, R dividing k, each run holds k/R whole blocks, locally and in the
//! single-device program (whose same construction has runs of `c` times the mesh dim's
//! size): the local tensor is that construction's blocked piece (the element-wise pairing
//! of [`crate::rules`] reads it).
//!
//! Read on demand from the producers and the `constant` record (not stored per value): only
//! a replicated operand beside a blocked shard asks, and the walk stops at the first
//! producer that is neither a copy nor a view.

use super::RankPlacements;
use crate::rules::{self, Runs};
use shardproof_ir::{Graph, NodeKind, ValueId};
use shardproof_ops::{Args, Meta, NoValues, Registry};

/// How many producers the walk passes before it gives up (a chain of copies and views).
const DEPTH: usize = 16;

/// What is known of value `v`'s equal runs: follows single-input copies, `expand`,
/// `unsqueeze`, `transpose` and `permute` back to a view that merges `[R, c, ..]` into one dim
/// with the dims after the first known constant ([`Runs::Along`]), or through copies and dim
/// moves to a graph input ([`Runs::Input`]). A value the case gives (`given`, a cut) is
/// where the walk stops: its producers are not checked.
///
/// The merging view must match a spec view (`spec_input`: its global input shape, by the
/// rank's node index) with the same run dims, and of size 1 where a local dim of size 1 is
/// read as constant: R runs at the global size too. A local length can count the runs (a
/// slice `t[0:l]` or `arange(l)` expanded over the batches and merged; the tests in
/// `tests/rows_runs_adversarial.rs`): R divides the blocks locally while the spec's same
/// construction has another R. Without a matching spec view (a plan): no runs.
pub(super) fn runs_of(
    g: &Graph,
    rp: &RankPlacements,
    meta_of: &dyn Fn(ValueId) -> Option<Meta>,
    given: &dyn Fn(ValueId) -> bool,
    spec_input: &dyn Fn(usize) -> Option<Vec<i64>>,
    v: ValueId,
) -> Runs {
    runs_at(g, rp, meta_of, given, spec_input, v, DEPTH).unwrap_or(Runs::Unknown)
}

fn runs_at(
    g: &Graph,
    rp: &RankPlacements,
    meta_of: &dyn Fn(ValueId) -> Option<Meta>,
    given: &dyn Fn(ValueId) -> bool,
    spec_input: &dyn Fn(usize) -> Option<Vec<i64>>,
    v: ValueId,
    depth: usize,
) -> Option<Runs> {
    let depth = depth.checked_sub(1)?;
    let node = g.nodes.get(v.node)?;
    let (op, args, kwargs) = match &node.kind {
        NodeKind::Input => return Some(Runs::Input),
        NodeKind::Call { op, args, kwargs } if !given(v) => (op, args, kwargs),
        _ => return None,
    };
    // A multi-output call (a split) is no copy or view of one tensor.
    if node.outputs.len() != 1 || v.output != 0 {
        return None;
    }
    let family = rules::rule(&op.base())?.family;
    if !matches!(
        family,
        "linear-unary" | "expand" | "unsqueeze" | "transpose" | "permute" | "view"
    ) {
        return None;
    }
    // One tensor input: a copy with a second tensor (a dropout mask) may differ per element.
    let [x] = node.inputs()[..] else {
        return None;
    };
    let def = Registry::builtin().get(op)?;
    let bound = Args::bind(&def.schema, args, kwargs, &NoValues).ok()?;
    let int = |arg: &str| {
        bound
            .schema()
            .index_of(arg)
            .and_then(|_| bound.get(arg))
            .and_then(|a| a.as_int())
    };
    let (xin, out) = (meta_of(x)?, meta_of(v)?);
    let (k, n) = (xin.shape.len(), out.shape.len());
    let norm = |d: i64, r: usize| rules::norm_dim(d, r);
    let constant = rp.constant[rp.offsets[x.node] as usize + x.output];
    // The input's record with its run dim moved by `to`; a graph input stays one.
    let moved = |to: &dyn Fn(usize) -> Option<usize>| match runs_at(
        g, rp, meta_of, given, spec_input, x, depth,
    )? {
        Runs::Along { dim, count } => Some(Runs::Along {
            dim: to(dim)?,
            count,
        }),
        r => Some(r),
    };
    match family {
        // An element-wise function of one tensor keeps equal slices equal.
        "linear-unary" if xin.shape == out.shape => moved(&Some),
        // Only dims of size 1 (or new ones) grow: the others keep their runs. A graph input
        // expanded is a construction, no longer an input.
        "expand" if n >= k => match moved(&|d| Some(d + (n - k)))? {
            Runs::Input => None,
            r => Some(r),
        },
        "unsqueeze" if n == k + 1 => {
            let u = int("dim").and_then(|d| norm(d, n))?;
            moved(&|d| Some(if d < u { d } else { d + 1 }))
        }
        "transpose" if n == k && n >= 2 => {
            let (a, b) = match (int("dim0"), int("dim1")) {
                (Some(a), Some(b)) => (norm(a, n)?, norm(b, n)?),
                _ => (0, 1),
            };
            moved(&|d| {
                Some(if d == a {
                    b
                } else if d == b {
                    a
                } else {
                    d
                })
            })
        }
        "permute" if n == k => {
            let dims = bound
                .schema()
                .index_of("dims")
                .and_then(|_| bound.get("dims"))
                .and_then(|a| a.as_int_list())?;
            let perm: Vec<usize> = dims.iter().map(|&d| norm(d, n)).collect::<Option<_>>()?;
            // Output dim i is input dim perm[i].
            moved(&|d| perm.iter().position(|&p| p == d))
        }
        "view" => {
            let (p, j, q) = merged_split(&xin.shape, &out.shape, constant)?;
            // The run dims the same in the spec, and a dim of size 1 that the run length
            // passes over of size 1 there too (a rank's one token, a local `t[0:1]`: constant
            // on the rank, whatever the spec's is).
            let gi = spec_input(v.node)?;
            let same = |i: usize| gi[i] == xin.shape[i] as i64;
            let kept = gi.len() == xin.shape.len()
                && (p..j).all(same)
                && (j..q).all(|i| xin.shape[i] != 1 || same(i));
            if !kept {
                return None;
            }
            Some(Runs::Along {
                dim: p,
                count: xin.shape[p..j].iter().product(),
            })
        }
        _ => None,
    }
}

/// A view of shape `from` as `to` that merges input dims `p..q` (q > p + 1) into output dim
/// `p` and keeps every other dim: where the input is constant along dims `j..q` (bits of
/// `constant`, or size 1), output dim `p` is R = the product of `from[p..j]` runs of the
/// product of `from[j..q]` elements, each constant (the view reads the input in row-major
/// order, whatever its strides). R = 1: constant along the dim.
#[cfg(test)]
fn merged_runs(from: &[usize], to: &[usize], constant: u64) -> Option<(usize, usize)> {
    merged_split(from, to, constant).map(|(p, j, _)| (p, from[p..j].iter().product()))
}

/// The dims of [`merged_runs`]: `(p, j, q)`, the runs counted by `from[p..j]`, each run
/// `from[j..q]`.
fn merged_split(from: &[usize], to: &[usize], constant: u64) -> Option<(usize, usize, usize)> {
    if constant == u64::MAX || from.len() <= to.len() {
        return None;
    }
    let merged = from.len() - to.len() + 1;
    let p = (0..to.len()).find(|&p| from.get(p) != to.get(p))?;
    let q = p + merged;
    let flat = |i: usize| from[i] == 1 || (i < 64 && constant & (1 << i) != 0);
    let product: usize = from[p..q].iter().product();
    if from[..p] != to[..p] || to[p] != product || from[q..] != to[p + 1..] {
        return None;
    }
    // The first of the trailing merged dims that are all constant; runs of one element are
    // no construction (the view only drops size-1 dims).
    let j = (p..q).rev().take_while(|&i| flat(i)).last()?;
    (from[j..q].iter().product::<usize>() > 1).then_some((p, j, q))
}

#[cfg(test)]
mod tests {
    use super::merged_runs;

    #[test]
    fn a_merge_with_the_inner_dim_constant_gives_runs() {
        assert_eq!(merged_runs(&[4, 4, 4], &[16, 4], 0b010), Some((0, 4)));
        assert_eq!(
            merged_runs(&[2, 4, 3, 5], &[2, 12, 5], 0b0100),
            Some((1, 4))
        );
        // Size-1 dims count as constant: one run (constant along the dim).
        assert_eq!(merged_runs(&[1, 2, 3], &[2, 3], 0b010), Some((0, 1)));
        assert_eq!(merged_runs(&[4, 4, 4], &[16, 4], 0b011), Some((0, 1)));
        assert_eq!(merged_runs(&[2, 3, 1, 4], &[2, 12], 0b1000), Some((1, 3)));
    }

    #[test]
    fn no_runs_without_the_inner_dim_constant_or_with_other_dims_changed() {
        // The outer dim constant, not the inner one: `[c, R]` merged alternates.
        assert_eq!(merged_runs(&[4, 4, 4], &[16, 4], 0b001), None);
        assert_eq!(merged_runs(&[4, 4, 4], &[16, 4], 0), None);
        assert_eq!(merged_runs(&[2, 3, 1, 4], &[2, 12], 0b0100), None);
        // Another dim regrouped too.
        assert_eq!(merged_runs(&[4, 4, 4], &[8, 8], 0b010), None);
        // A split, not a merge.
        assert_eq!(merged_runs(&[16, 4], &[4, 4, 4], 0b01), None);
    }
}
