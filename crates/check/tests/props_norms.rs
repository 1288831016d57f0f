//! Property tests of the norm, softmax, scan, sort, loss and reduction rules against the
//! interpreter (harness: `common/props.rs`): random small shapes, random input placements on
//! `tp=2`, `tp=3` and `dp=2,tp=2`, random inputs; every placement the checker infers for an
//! operator's outputs must hold of the ranks' values.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{property, Elem, In, Op};

const F: Elem = Elem::F64;

/// One float input `x` of three dims.
fn x3(s: &[usize]) -> Vec<(&'static str, Elem, Vec<usize>)> {
    vec![("x", F, vec![s[0], s[1], s[2]])]
}

/// `x` of three dims and a weight and bias of its last dim.
fn x3_wb(s: &[usize]) -> Vec<(&'static str, Elem, Vec<usize>)> {
    vec![
        ("x", F, vec![s[0], s[1], s[2]]),
        ("w", F, vec![s[2]]),
        ("b", F, vec![s[2]]),
    ]
}

const NATIVE_LAYER_NORM: Op = Op {
    name: "native_layer_norm",
    inputs: x3_wb,
    body: |s, _| {
        Some(vec![
            format!(
                "ln = torch.ops.aten.native_layer_norm.default(x, [{}], w, b, 1e-05)",
                s[0][2]
            ),
            "out = ln[0]".into(),
            "mean = ln[1]".into(),
            "rstd = ln[2]".into(),
        ])
    },
    checked: &["out", "mean", "rstd"],
    known_bug: None,
};

/// Normalizing the last two dims.
const NATIVE_LAYER_NORM_2D: Op = Op {
    name: "native_layer_norm_2d",
    inputs: |s| {
        vec![
            ("x", F, vec![s[0], s[1], s[2]]),
            ("w", F, vec![s[1], s[2]]),
            ("b", F, vec![s[1], s[2]]),
        ]
    },
    body: |s, _| {
        Some(vec![
            format!(
                "ln = torch.ops.aten.native_layer_norm.default(x, [{}, {}], w, b, 1e-05)",
                s[0][1], s[0][2]
            ),
            "out = ln[0]".into(),
            "mean = ln[1]".into(),
            "rstd = ln[2]".into(),
        ])
    },
    checked: &["out", "mean", "rstd"],
    known_bug: None,
};

/// Apex's fused layer norm: the statistics flattened to one dim of the rows.
const APEX_LAYER_NORM: Op = Op {
    name: "apex.fused_layer_norm_affine_fwd",
    inputs: x3_wb,
    body: |s, _| {
        Some(vec![
            format!(
                "ln = torch.ops.apex.fused_layer_norm_affine_fwd.default(x, w, b, [{}], 1e-05)",
                s[0][2]
            ),
            "out = ln[0]".into(),
            "mean = ln[1]".into(),
            "invvar = ln[2]".into(),
        ])
    },
    checked: &["out", "mean", "invvar"],
    // An input sharded on an inner row dim: a known bug, pinned by
    // `apex_norm_statistics_of_a_shard_of_an_inner_row_dim_claim_no_such_shard`.
    known_bug: Some(|p, _| {
        p.inputs[0]
            .places
            .iter()
            .any(|q| matches!(q, In::S(d) if *d > 0))
    }),
};

const LAYER_NORM: Op = Op {
    name: "layer_norm",
    inputs: x3_wb,
    body: |s, _| {
        Some(vec![format!(
            "out = torch.ops.aten.layer_norm.default(x, [{}], w, b)",
            s[0][2]
        )])
    },
    checked: &["out"],
    known_bug: None,
};

const RMS_NORM: Op = Op {
    name: "rms_norm",
    inputs: x3_wb,
    body: |s, _| {
        Some(vec![format!(
            "out = torch.ops.aten.rms_norm.default(x, [{}], w, 1e-06)",
            s[0][2]
        )])
    },
    checked: &["out"],
    known_bug: None,
};

const FUSED_RMS_NORM: Op = Op {
    name: "_fused_rms_norm",
    inputs: x3_wb,
    body: |s, _| {
        Some(vec![
            format!(
                "rn = torch.ops.aten._fused_rms_norm.default(x, [{}], w, 1e-06)",
                s[0][2]
            ),
            "out = rn[0]".into(),
            "rstd = rn[1]".into(),
        ])
    },
    checked: &["out", "rstd"],
    known_bug: None,
};

/// The backward with every operand an input of its own (mean and rstd drawn too): the rule
/// must hold whatever their placements.
const LAYER_NORM_BACKWARD: Op = Op {
    name: "native_layer_norm_backward",
    inputs: |s| {
        vec![
            ("g", F, vec![s[0], s[1], s[2]]),
            ("x", F, vec![s[0], s[1], s[2]]),
            ("mean", F, vec![s[0], s[1], 1]),
            ("rstd", F, vec![s[0], s[1], 1]),
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

/// The backward as a program computes it: mean and rstd from the forward of the same `x`.
const LAYER_NORM_BACKWARD_CHAINED: Op = Op {
    name: "native_layer_norm_backward_chained",
    inputs: |s| {
        vec![
            ("g", F, vec![s[0], s[1], s[2]]),
            ("x", F, vec![s[0], s[1], s[2]]),
            ("w", F, vec![s[2]]),
            ("b", F, vec![s[2]]),
        ]
    },
    body: |s, _| {
        let h = s[1][2];
        Some(vec![
            format!("ln = torch.ops.aten.native_layer_norm.default(x, [{h}], w, b, 1e-05)"),
            "mean = ln[1]".into(),
            "rstd = ln[2]".into(),
            format!(
                "lb = torch.ops.aten.native_layer_norm_backward.default(g, x, [{h}], mean, rstd, w, b, [True, True, True])"
            ),
            "gi = lb[0]".into(),
            "gw = lb[1]".into(),
            "gb = lb[2]".into(),
        ])
    },
    checked: &["gi", "gw", "gb"],
    // Operands sharded on one dim over different mesh dims: a known bug, pinned by
    // `norm_backward_operands_sharded_over_different_mesh_dims_claim_nothing`.
    known_bug: Some(|p, _| props::mixed_mesh_shards(p)),
};

/// The rms backward as a program computes it: rstd from the forward of the same `x`.
const RMS_NORM_BACKWARD_CHAINED: Op = Op {
    name: "_fused_rms_norm_backward_chained",
    inputs: |s| {
        vec![
            ("g", F, vec![s[0], s[1], s[2]]),
            ("x", F, vec![s[0], s[1], s[2]]),
            ("w", F, vec![s[2]]),
        ]
    },
    body: |s, _| {
        let h = s[1][2];
        Some(vec![
            format!("rn = torch.ops.aten._fused_rms_norm.default(x, [{h}], w, 1e-06)"),
            "rstd = rn[1]".into(),
            format!(
                "rb = torch.ops.aten._fused_rms_norm_backward.default(g, x, [{h}], rstd, w, [True, True])"
            ),
            "gi = rb[0]".into(),
            "gw = rb[1]".into(),
        ])
    },
    checked: &["gi", "gw"],
    // Operands sharded on one dim over different mesh dims: a known bug, pinned by
    // `norm_backward_operands_sharded_over_different_mesh_dims_claim_nothing`.
    known_bug: Some(|p, _| props::mixed_mesh_shards(p)),
};

/// A body of one call on `x` whose text names the reduced or scanned dim `D` (0..3, from
/// the first drawn size).
macro_rules! on_dim {
    ($name:literal, $fmt:literal) => {
        Op {
            name: $name,
            inputs: x3,
            body: |_, z| Some(vec![format!($fmt, d = z[3] % 3)]),
            checked: &["out"],
            known_bug: None,
        }
    };
}

const SOFTMAXES: &[Op] = &[
    on_dim!(
        "_softmax",
        "out = torch.ops.aten._softmax.default(x, {d}, False)"
    ),
    on_dim!(
        "_log_softmax",
        "out = torch.ops.aten._log_softmax.default(x, {d}, False)"
    ),
    on_dim!("softmax.int", "out = torch.ops.aten.softmax.int(x, {d})"),
    on_dim!(
        "log_softmax.int",
        "out = torch.ops.aten.log_softmax.int(x, {d})"
    ),
];

const SCANS: &[Op] = &[
    on_dim!("cumsum", "out = torch.ops.aten.cumsum.default(x, {d})"),
    on_dim!("cumprod", "out = torch.ops.aten.cumprod.default(x, {d})"),
];

const REDUCTIONS: &[Op] = &[
    on_dim!(
        "logsumexp",
        "out = torch.ops.aten.logsumexp.default(x, [{d}])"
    ),
    on_dim!(
        "var.correction",
        "out = torch.ops.aten.var.correction(x, [{d}])"
    ),
    on_dim!(
        "std.dim",
        "out = torch.ops.aten.std.dim(x, [{d}], True, True)"
    ),
    on_dim!("prod.dim_int", "out = torch.ops.aten.prod.dim_int(x, {d})"),
    on_dim!("argmax", "out = torch.ops.aten.argmax.default(x, {d})"),
    on_dim!("amin", "out = torch.ops.aten.amin.default(x, [{d}], True)"),
    on_dim!(
        "count_nonzero",
        "out = torch.ops.aten.count_nonzero.dim_IntList(x, [{d}])"
    ),
    on_dim!(
        "linalg_vector_norm",
        "out = torch.ops.aten.linalg_vector_norm.default(x, 2, [{d}])"
    ),
    on_dim!(
        "mean.dim_keepdim",
        "out = torch.ops.aten.mean.dim(x, [{d}], True)"
    ),
    Op {
        name: "sum.dims",
        inputs: x3,
        body: |_, z| {
            let d = z[3] % 3;
            Some(vec![format!(
                "out = torch.ops.aten.sum.dim_IntList(x, [{d}, {}])",
                (d + 1) % 3
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    on_dim!(
        "norm.ScalarOpt_dim",
        "out = torch.ops.aten.norm.ScalarOpt_dim(x, 2, [{d}])"
    ),
    Op {
        name: "max.dim",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!("mx = torch.ops.aten.max.dim(x, {})", z[3] % 3),
                "out = mx[0]".into(),
                "idx = mx[1]".into(),
            ])
        },
        checked: &["out", "idx"],
        known_bug: None,
    },
];

const SORTS: &[Op] = &[
    Op {
        name: "topk",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!("tk = torch.ops.aten.topk.default(x, 1, {})", z[3] % 3),
                "out = tk[0]".into(),
                "idx = tk[1]".into(),
            ])
        },
        checked: &["out", "idx"],
        known_bug: None,
    },
    Op {
        name: "sort",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!("st = torch.ops.aten.sort.default(x, {})", z[3] % 3),
                "out = st[0]".into(),
                "idx = st[1]".into(),
            ])
        },
        checked: &["out", "idx"],
        known_bug: None,
    },
    on_dim!(
        "argsort",
        "out = torch.ops.aten.argsort.default(x, {d}, True)"
    ),
];

/// The softmax backwards: gradient and output of the forward, both drawn.
const SOFTMAX_BACKWARDS: &[Op] = &[
    Op {
        name: "_softmax_backward_data",
        inputs: |s| {
            vec![
                ("g", F, vec![s[0], s[1], s[2]]),
                ("y", F, vec![s[0], s[1], s[2]]),
            ]
        },
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten._softmax_backward_data.default(g, y, {}, torch.float64)",
                z[3] % 3
            )])
        },
        checked: &["out"],
        // Operands sharded on one dim over different mesh dims: a known bug, pinned by
        // `softmax_backward_operands_sharded_over_different_mesh_dims_claim_nothing`.
        known_bug: Some(|p, _| props::mixed_mesh_shards(p)),
    },
    Op {
        name: "_log_softmax_backward_data",
        inputs: |s| {
            vec![
                ("g", F, vec![s[0], s[1], s[2]]),
                ("y", F, vec![s[0], s[1], s[2]]),
            ]
        },
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten._log_softmax_backward_data.default(g, y, {}, torch.float64)",
                z[3] % 3
            )])
        },
        checked: &["out"],
        // Operands sharded on one dim over different mesh dims: a known bug, pinned by
        // `softmax_backward_operands_sharded_over_different_mesh_dims_claim_nothing`.
        known_bug: Some(|p, _| props::mixed_mesh_shards(p)),
    },
];

/// The losses: nll over `[N, C]` log-probabilities with class targets (reduction from the
/// drawn sizes), its backward chained to the forward's total weight, mse and its backward.
const LOSSES: &[Op] = &[
    // Reductions none and sum: the loss and the total weight.
    Op {
        name: "nll_loss_forward",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1] + 1]),
                ("t", Elem::Int(0, 2), vec![s[0]]),
            ]
        },
        body: |_, z| {
            Some(vec![
                format!(
                    "nf = torch.ops.aten.nll_loss_forward.default(x, t, None, {}, -100)",
                    2 * (z[2] % 2)
                ),
                "out = nf[0]".into(),
                "tw = nf[1]".into(),
            ])
        },
        checked: &["out", "tw"],
        known_bug: None,
    },
    // Reduction mean: the loss only (the total weight's claim is a known bug, pinned by
    // `the_total_weight_of_a_mean_nll_loss_over_row_shards_is_a_partial_sum`).
    Op {
        name: "nll_loss_forward_mean",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1] + 1]),
                ("t", Elem::Int(0, 2), vec![s[0]]),
            ]
        },
        body: |_, _| {
            Some(vec![
                "nf = torch.ops.aten.nll_loss_forward.default(x, t, None, 1, -100)".into(),
                "out = nf[0]".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    // Reductions none and sum, the total weight from the forward (unread by these).
    Op {
        name: "nll_loss_backward",
        inputs: |s| {
            let r = 2 * (s[2] % 2);
            vec![
                ("g", F, if r == 0 { vec![s[0]] } else { vec![] }),
                ("x", F, vec![s[0], s[1] + 1]),
                ("t", Elem::Int(0, 2), vec![s[0]]),
            ]
        },
        body: |s, _| {
            let r = if s[0].is_empty() { 2 } else { 0 };
            Some(vec![
                format!("nf = torch.ops.aten.nll_loss_forward.default(x, t, None, {r}, -100)"),
                "tw = nf[1]".into(),
                format!(
                    "out = torch.ops.aten.nll_loss_backward.default(g, x, t, None, {r}, -100, tw)"
                ),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    // Reduction mean, dividing by a replicated total weight (a literal on every rank): the
    // spec's pieces. With the forward's total weight over row shards the pieces are local
    // means, claimed with their factor
    // (`a_mean_nll_loss_backward_over_row_shards_divides_by_the_local_count`).
    Op {
        name: "nll_loss_backward_mean",
        inputs: |s| {
            vec![
                ("g", F, vec![]),
                ("x", F, vec![s[0], s[1] + 1]),
                ("t", Elem::Int(0, 2), vec![s[0]]),
            ]
        },
        body: |_, z| {
            Some(vec![
                format!(
                    "tw = torch.ops.aten.full.default([], {}.5, dtype = torch.float64)",
                    z[4]
                ),
                "out = torch.ops.aten.nll_loss_backward.default(g, x, t, None, 1, -100, tw)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "mse_loss",
        inputs: |s| vec![("x", F, vec![s[0], s[1]]), ("t", F, vec![s[0], s[1]])],
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten.mse_loss.default(x, t, {})",
                z[2] % 3
            )])
        },
        checked: &["out"],
        // Operands sharded on one dim over different mesh dims: a known bug, pinned by
        // `mse_loss_operands_sharded_over_different_mesh_dims_claim_nothing`.
        known_bug: Some(|p, _| props::mixed_mesh_shards(p)),
    },
    // Reductions none, mean and sum (a mean over a shard claims its factor:
    // `a_mean_mse_loss_backward_over_a_shard_divides_by_the_local_count`).
    Op {
        name: "mse_loss_backward",
        inputs: |s| {
            let r = s[2] % 3;
            vec![
                ("g", F, if r == 0 { vec![s[0], s[1]] } else { vec![] }),
                ("x", F, vec![s[0], s[1]]),
                ("t", F, vec![s[0], s[1]]),
            ]
        },
        body: |s, z| {
            let r = if s[0].is_empty() { z[2] % 3 } else { 0 };
            Some(vec![format!(
                "out = torch.ops.aten.mse_loss_backward.default(g, x, t, {r})"
            )])
        },
        checked: &["out"],
        // Operands sharded on one dim over different mesh dims: a known bug, pinned by
        // `mse_loss_operands_sharded_over_different_mesh_dims_claim_nothing`.
        known_bug: Some(|p, _| props::mixed_mesh_shards(p)),
    },
];

/// Runs every op of `ops` and requires each to have checked a claim.
fn each(ops: &[Op], cases: u32, seed: u64) {
    for op in ops {
        let t = property(op, cases, seed);
        assert!(t.claims > 0, "{}: no claim was checked ({t:?})", op.name);
    }
}

#[test]
fn norm_placements_agree_with_the_interpreter() {
    each(
        &[
            APEX_LAYER_NORM,
            NATIVE_LAYER_NORM,
            NATIVE_LAYER_NORM_2D,
            LAYER_NORM,
            RMS_NORM,
            FUSED_RMS_NORM,
        ],
        48,
        0x5eed_4401,
    );
}

#[test]
fn norm_backward_placements_agree_with_the_interpreter() {
    each(
        &[LAYER_NORM_BACKWARD_CHAINED, RMS_NORM_BACKWARD_CHAINED],
        64,
        0x5eed_4402,
    );
}

/// `nll_loss_backward` with reduction mean divides by `total_weight`. Over row shards the
/// forward's total weight is the rank's own count (a partial sum): each rank's rows are
/// scaled by 1/(N/n) where the spec's are by 1/N, so each piece is the rank's local mean, `n`
/// times the spec's shard. The claim says so: `Shard(0)` with the factor 2, which the
/// harness checks against the interpreter as "the pieces make twice the spec's value" (the
/// factor dropped, the same claim is contradicted).
#[test]
fn a_mean_nll_loss_backward_over_row_shards_divides_by_the_local_count() {
    let op = Op {
        name: "nll_loss_backward_mean_chained",
        inputs: LOSSES[3].inputs,
        body: |_, _| {
            Some(vec![
                "nf = torch.ops.aten.nll_loss_forward.default(x, t, None, 1, -100)".into(),
                "tw = nf[1]".into(),
                "out = torch.ops.aten.nll_loss_backward.default(g, x, t, None, 1, -100, tw)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    };
    let s = props::once(
        &op,
        &[2],
        &[1, 1, 1, 1, 1, 1],
        &[
            vec![props::In::R],
            vec![props::In::S(0)],
            vec![props::In::S(0)],
        ],
        1,
    );
    assert_eq!(s.claims, 1, "{s:?}");
    assert_eq!(
        s.factors,
        vec![shardproof_check::PieceFactor::Times(2)],
        "{s:?}"
    );
}

/// `mse_loss_backward` with reduction mean scales by 2/numel of the rank's operands; over a
/// shard that is n/numel of the spec's: each piece is the rank's local mean, n times the
/// spec's shard. Claimed the shard with that factor, checked against the interpreter.
#[test]
fn a_mean_mse_loss_backward_over_a_shard_divides_by_the_local_count() {
    let op = Op {
        name: "mse_loss_backward_mean",
        inputs: |s| {
            vec![
                ("g", F, vec![]),
                ("x", F, vec![s[0], s[1]]),
                ("t", F, vec![s[0], s[1]]),
            ]
        },
        body: |_, _| {
            Some(vec![
                "out = torch.ops.aten.mse_loss_backward.default(g, x, t, 1)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    };
    let places = [
        vec![props::In::R],
        vec![props::In::S(0)],
        vec![props::In::S(0)],
    ];
    for (mesh, factor) in [(vec![2], 2), (vec![3], 3)] {
        let s = props::once(&op, &mesh, &[1, 2, 1, 1, 1, 1], &places, 1);
        assert_eq!(s.claims, 1, "{s:?}");
        assert_eq!(s.places, vec![vec![shardproof_check::Place::Shard(0)]]);
        assert_eq!(
            s.factors,
            vec![shardproof_check::PieceFactor::Times(factor)]
        );
    }
    // Over dp x tp, split over both mesh dims: the product of their sizes.
    let both = [
        vec![props::In::R, props::In::R],
        vec![props::In::S(0), props::In::S(1)],
        vec![props::In::S(0), props::In::S(1)],
    ];
    let s = props::once(&op, &[2, 2], &[1, 1, 1, 1, 1, 1], &both, 1);
    assert_eq!(s.claims, 1, "{s:?}");
    assert_eq!(s.factors, vec![shardproof_check::PieceFactor::Times(4)]);
    // A shard beside a replicated target (broadcast along the rows): the divisor is the
    // count of `self`'s elements, the rank's shard's: the same factor.
    let beside = [
        vec![props::In::R],
        vec![props::In::S(0)],
        vec![props::In::R],
    ];
    let s = props::once(&op, &[2], &[1, 2, 1, 1, 1, 1], &beside, 1);
    assert_eq!(s.claims, 1, "{s:?}");
    assert_eq!(s.factors, vec![shardproof_check::PieceFactor::Times(2)]);
}

/// Known bug: `mse_loss` (and its backward) merges its operands one mesh dim at a time: `x {dp: Shard(1)}`
/// beside `t {tp: Shard(1)}` reads a shard on each mesh dim alone, but rank (i, j) compares
/// x's piece i with t's piece j. The element-wise families refuse this pairing
/// (`mixed_mesh_shards`); the loss families are not in `pairs_elements`.
#[test]
fn mse_loss_operands_sharded_over_different_mesh_dims_claim_nothing() {
    let mse = LOSSES.iter().find(|o| o.name == "mse_loss").unwrap();
    let places = [vec![In::S(1), In::R], vec![In::R, In::S(1)]];
    let s = props::once(mse, &[2, 2], &[1, 1, 1, 1, 1, 1], &places, 1);
    assert_eq!(s.claims, 0, "{s:?}");
    // The backward (reduction sum: a 0-d gradient): the same pairing.
    let backward = LOSSES
        .iter()
        .find(|o| o.name == "mse_loss_backward")
        .unwrap();
    let places = [
        vec![In::R, In::R],
        vec![In::R, In::S(1)],
        vec![In::S(1), In::R],
    ];
    let s = props::once(backward, &[2, 2], &[1, 1, 1, 1, 1, 1], &places, 1);
    assert_eq!(s.claims, 0, "{s:?}");
}

/// Known bug: the softmax backwards merge `grad_output` and `output` one mesh dim at a time:
/// `g {dp: Shard(0)}` beside `y {tp: Shard(0)}` reads a shard on each mesh dim alone, but
/// rank (i, j) pairs g's piece i with y's piece j (the pairing `mse_loss` misses too).
#[test]
fn softmax_backward_operands_sharded_over_different_mesh_dims_claim_nothing() {
    let places = [vec![In::S(0), In::R], vec![In::R, In::S(0)]];
    for op in SOFTMAX_BACKWARDS {
        // The softmax over dim 1 (drawn size 4 -> 4 % 3).
        let s = props::once(op, &[2, 2], &[1, 1, 1, 4, 1, 1], &places, 1);
        assert_eq!(s.claims, 0, "{}: {s:?}", op.name);
    }
}

/// Known bug: the norm backwards merge `grad_out` and `input` one mesh dim at a time (as the
/// softmax backwards): `g {dp: Shard(0)}` beside `x {tp: Shard(0)}` claims a shard on both
/// mesh dims, but rank (i, j) pairs g's piece i with x's piece j.
#[test]
fn norm_backward_operands_sharded_over_different_mesh_dims_claim_nothing() {
    let places = [
        vec![In::S(0), In::R],
        vec![In::R, In::S(0)],
        vec![In::R, In::R],
        vec![In::R, In::R],
    ];
    for op in [&LAYER_NORM_BACKWARD_CHAINED, &RMS_NORM_BACKWARD_CHAINED] {
        let s = props::once(op, &[2, 2], &[1, 2, 2, 1, 1, 1], &places, 1);
        assert_eq!(s.claims, 0, "{}: {s:?}", op.name);
    }
}

#[test]
fn a_partial_statistic_of_the_norm_backward_claims_nothing() {
    use shardproof_check::Red;
    let p = Red::Sum;
    // g, x, mean, rstd, w, b: mean partial, then rstd partial, then the weight partial.
    for places in [
        vec![In::R, In::R, In::P(p), In::R, In::R, In::R],
        vec![In::R, In::R, In::R, In::P(p), In::R, In::R],
        vec![In::R, In::R, In::R, In::R, In::P(p), In::R],
    ] {
        let places: Vec<Vec<In>> = places.into_iter().map(|p| vec![p]).collect();
        props::once(&LAYER_NORM_BACKWARD, &[2], &[1, 2, 2, 1, 1, 1], &places, 3);
    }
}

#[test]
fn softmax_placements_agree_with_the_interpreter() {
    each(SOFTMAXES, 32, 0x5eed_4403);
    each(SOFTMAX_BACKWARDS, 48, 0x5eed_4404);
}

#[test]
fn scan_and_sort_placements_agree_with_the_interpreter() {
    each(SCANS, 32, 0x5eed_4405);
    each(SORTS, 32, 0x5eed_4406);
}

#[test]
fn reduction_placements_agree_with_the_interpreter() {
    each(REDUCTIONS, 32, 0x5eed_4407);
}

#[test]
fn loss_placements_agree_with_the_interpreter() {
    each(LOSSES, 64, 0x5eed_4408);
}

/// Known bug: `nll_loss_forward` with reduction mean over row shards (`x` and `t` both
/// `Shard(0)`) claims its total weight (the count of the rank's targets) `Partial(avg)`: the
/// rule says `Partial(sum)`, and the engine's scaling pass relabels every partial output of
/// the call by the loss's own (mean) label. The counts sum to the spec's, they do not
/// average to it; an `all_reduce(tw, 'avg')` would then be claimed `Replicate()`.
#[test]
fn the_total_weight_of_a_mean_nll_loss_over_row_shards_is_a_partial_sum() {
    let op = Op {
        name: "nll_loss_forward_mean_total_weight",
        inputs: LOSSES[1].inputs,
        body: |_, _| {
            Some(vec![
                "nf = torch.ops.aten.nll_loss_forward.default(x, t, None, 1, -100)".into(),
                "out = nf[0]".into(),
                "tw = nf[1]".into(),
            ])
        },
        checked: &["out", "tw"],
        known_bug: None,
    };
    let s = props::once(
        &op,
        &[2],
        &[1, 1, 1, 1, 1, 1],
        &[vec![props::In::S(0)], vec![props::In::S(0)]],
        1,
    );
    assert_eq!(s.claims, 2, "{s:?}");
}

/// Known bug: apex's fused layer norm flattens its statistics to one dim of the rows, but
/// the rule gives them the input's placement: `Shard(1)` of the input is claimed `Shard(1)`
/// of a one-dim tensor (the rows of a shard of dim 1 flattened are a blocked shard of dim
/// 0, one block per index of dim 0).
#[test]
fn apex_norm_statistics_of_a_shard_of_an_inner_row_dim_claim_no_such_shard() {
    let places = [vec![In::S(1)], vec![In::R], vec![In::R]];
    props::once(&APEX_LAYER_NORM, &[2], &[2, 2, 2, 0, 0, 0], &places, 1);
}
