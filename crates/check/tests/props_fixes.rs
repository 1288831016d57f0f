//! Regression tests of the placement-rule fixes the property tests led to, for the cases the
//! fixes cover beyond the pinned instances (harness: `common/props.rs`): every placement the
//! checker infers must hold of the interpreter's values, and a right program gets no finding.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{once, Elem, In, Op};

const F: Elem = Elem::F64;

/// `native_layer_norm_backward` with its statistics flattened to one dim of the rows
/// (`[rows]`, which the operator accepts, rather than `[.., 1]`).
const FLAT_STATS_NORM_BACKWARD: Op = Op {
    name: "native_layer_norm_backward_flat_stats",
    inputs: |s| {
        vec![
            ("g", F, vec![s[0], s[1], s[2]]),
            ("x", F, vec![s[0], s[1], s[2]]),
            ("mean", F, vec![s[0] * s[1]]),
            ("rstd", F, vec![s[0] * s[1]]),
            ("w", F, vec![s[2]]),
            ("b", F, vec![s[2]]),
        ]
    },
    body: |s, _| {
        Some(vec![
            format!(
                "lb = torch.ops.aten.native_layer_norm_backward.default(g, x, [{}], mean, rstd, w, b, [True, True, True])",
                s[1][2]
            ),
            "gi = lb[0]".into(),
            "gw = lb[1]".into(),
            "gb = lb[2]".into(),
        ])
    },
    checked: &["gi", "gw", "gb"],
    known_bug: None,
};

/// Flattened statistics sharded alike with the input's rows: each rank computes the spec's
/// rows of the input gradient, so there is no finding (aligned from the right as an
/// element-wise operand, a 1-d statistic's dim 0 would be the input's last dim: a shard of
/// another dim than the input's, a false finding).
#[test]
fn flattened_norm_statistics_beside_a_row_shard_are_no_finding() {
    let s0 = In::S(0);
    let places = [
        vec![s0],
        vec![s0],
        vec![s0],
        vec![s0],
        vec![In::R],
        vec![In::R],
    ];
    let s = once(
        &FLAT_STATS_NORM_BACKWARD,
        &[2],
        &[1, 2, 2, 0, 0, 0],
        &places,
        1,
    );
    assert!(!s.finding, "{s:?}");
}

/// A partial flattened statistic beside replicated operands: each rank normalizes with its
/// own term of the statistic, so the gradients are no replica (and no partial sum) of the
/// spec's. Flattened statistics are not merged with the input's dims, so they must not be
/// passed over either: nothing is claimed.
#[test]
fn a_partial_flattened_norm_statistic_claims_nothing() {
    let sum = In::P(shardproof_check::Red::Sum);
    for (mean, rstd) in [(sum, In::R), (In::R, sum)] {
        let places = [
            vec![In::R],
            vec![In::R],
            vec![mean],
            vec![rstd],
            vec![In::R],
            vec![In::R],
        ];
        let s = once(
            &FLAT_STATS_NORM_BACKWARD,
            &[2],
            &[1, 2, 2, 0, 0, 0],
            &places,
            1,
        );
        assert_eq!(s.claims, 0, "{s:?}");
    }
}

/// `copy(self, src)` into a replicated `self` of two rows from a shard of local size 1 on
/// `tp=2`: the broadcast repeats the rank's one row, which is no piece of the spec's result
/// (`src` itself, of two rows): no shard is claimed.
#[test]
fn a_shard_broadcast_into_a_replicated_self_is_no_shard() {
    let op = Op {
        name: "copy_broadcast_shard",
        inputs: |s| vec![("x", F, vec![s[0]]), ("y", F, vec![s[1]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.copy.default(x, y)".into()]),
        checked: &["out"],
        known_bug: None,
    };
    let s = once(
        &op,
        &[2],
        &[2, 1, 0, 0, 0, 0],
        &[vec![In::R], vec![In::S(0)]],
        1,
    );
    assert_eq!(s.claims, 0, "{s:?}");
}
