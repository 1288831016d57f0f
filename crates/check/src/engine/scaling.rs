//! Scalings of partial pieces by a number, relative to the spec's (issue 44): how a `mul` or
//! `div` changes what the pieces combine to, and which other mesh dim's share a division is.

use crate::place::Place;
use shardproof_ir::OpName;

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
