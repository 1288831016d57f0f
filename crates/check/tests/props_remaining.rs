//! Property tests of the rules no other `props_*` file reaches, against the interpreter
//! (harness: `common/props.rs`): `arange` (its overloads, at literal and shape-made bounds,
//! and at rank-dependent bounds), `_assert_tensor_metadata`, `scatter_reduce` (every reduce
//! mode, `include_self` both ways), training `dropout` and `native_dropout` (at `p` 0 and 1,
//! the probabilities whose masks every program draws alike) with its mask, and
//! `native_dropout_backward` with a mask input placed on its own.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{once, property, Elem, In, Op};
use shardproof_check::{Place, Red};

const F: Elem = Elem::F64;

fn x3(s: &[usize]) -> Vec<(&'static str, Elem, Vec<usize>)> {
    vec![("x", F, vec![s[0], s[1], s[2]])]
}

/// `arange` of `x`'s last dim added to `x`; `{n}` is the last dim's size in the program's
/// own shapes (local on the ranks, global in the spec), `{2n}` twice it.
macro_rules! arange_of_x {
    ($name:literal, $fmt:literal) => {
        Op {
            name: $name,
            inputs: x3,
            body: |s, _| {
                Some(vec![
                    $fmt.replace("{2n}", &(2 * s[0][2]).to_string())
                        .replace("{n}", &s[0][2].to_string()),
                    "out = torch.ops.aten.add.Tensor(x, a)".into(),
                ])
            },
            checked: &["out"],
            known_bug: None,
        }
    };
}

const ARANGES: &[Op] = &[
    // Bounds of literals alike in spec and ranks: the range is the same tensor everywhere.
    Op {
        name: "arange_literal",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!(
                    "a = torch.ops.aten.arange.start(1, {}, dtype = torch.float64)",
                    z[2] + 1
                ),
                "out = torch.ops.aten.mul.Tensor(x, a)".into(),
            ])
        },
        checked: &["a", "out"],
        known_bug: None,
    },
    arange_of_x!(
        "arange_of_the_shape",
        "a = torch.ops.aten.arange.start(0, {n}, dtype = torch.float64)"
    ),
    arange_of_x!(
        "arange_default",
        "a = torch.ops.aten.arange.default({n}, dtype = torch.float64)"
    ),
    arange_of_x!(
        "arange_start_step",
        "a = torch.ops.aten.arange.start_step(0, {2n}, 2, dtype = torch.float64)"
    ),
];

const ASSERTS: &[Op] = &[
    // The assertion has no output: the tensor it reads goes on as it was.
    Op {
        name: "assert_dtype",
        inputs: x3,
        body: |_, _| {
            Some(vec![
                "check = torch.ops.aten._assert_tensor_metadata.default(x, dtype = torch.float64)"
                    .into(),
                "out = torch.ops.aten.mul.Tensor(x, 2.0)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "assert_size",
        inputs: x3,
        body: |s, _| {
            Some(vec![
                format!(
                    "check = torch.ops.aten._assert_tensor_metadata.default(x, {:?}, None, torch.float64)",
                    s[0]
                ),
                "out = torch.ops.aten.clone.default(x)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
];

/// `scatter_reduce.two(x, d, idx, src, reduce, include_self)` with `idx` of `x`'s shape,
/// its positions within the local size of `x`'s dim d (so within the global one too).
macro_rules! scatter_reduce {
    ($name:literal, $reduce:literal, $include_self:literal) => {
        Op {
            name: $name,
            inputs: |s| {
                let d = s[3] % 3;
                vec![
                    ("x", F, vec![s[0], s[1], s[2]]),
                    ("idx", Elem::Int(0, s[d] as i64), vec![s[0], s[1], s[2]]),
                    ("src", F, vec![s[0], s[1], s[2]]),
                ]
            },
            body: |_, z| {
                Some(vec![format!(
                    "out = torch.ops.aten.scatter_reduce.two(x, {}, idx, src, '{}', include_self = {})",
                    z[3] % 3,
                    $reduce,
                    $include_self
                )])
            },
            checked: &["out"],
            known_bug: None,
        }
    };
}

const SCATTER_REDUCES: &[Op] = &[
    scatter_reduce!("scatter_reduce_sum", "sum", "True"),
    scatter_reduce!("scatter_reduce_sum_excl", "sum", "False"),
    scatter_reduce!("scatter_reduce_prod", "prod", "True"),
    scatter_reduce!("scatter_reduce_prod_excl", "prod", "False"),
    scatter_reduce!("scatter_reduce_mean", "mean", "True"),
    scatter_reduce!("scatter_reduce_mean_excl", "mean", "False"),
    scatter_reduce!("scatter_reduce_amax", "amax", "True"),
    scatter_reduce!("scatter_reduce_amax_excl", "amax", "False"),
    scatter_reduce!("scatter_reduce_amin", "amin", "True"),
    scatter_reduce!("scatter_reduce_amin_excl", "amin", "False"),
];

/// Training dropout at `p` 0 (every element kept, scale 1) and 1 (none kept, scale 0): the
/// masks every program draws are the same, so the spec's values are the ranks' to compare.
const DROPOUTS: &[Op] = &[
    Op {
        name: "dropout_train_keep_all",
        inputs: x3,
        body: |_, _| {
            Some(vec![
                "out = torch.ops.aten.dropout.default(x, 0.0, True)".into()
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "dropout_train_drop_all",
        inputs: x3,
        body: |_, _| {
            Some(vec![
                "out = torch.ops.aten.dropout.default(x, 1.0, True)".into()
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "native_dropout_keep_all",
        inputs: x3,
        body: |_, _| {
            Some(vec![
                "nd = torch.ops.aten.native_dropout.default(x, 0.0, True)".into(),
                "out = nd[0]".into(),
                "mask = nd[1]".into(),
            ])
        },
        checked: &["out", "mask"],
        known_bug: None,
    },
    Op {
        name: "native_dropout_drop_all",
        inputs: x3,
        body: |_, _| {
            Some(vec![
                "nd = torch.ops.aten.native_dropout.default(x, 1.0, True)".into(),
                "out = nd[0]".into(),
                "mask = nd[1]".into(),
            ])
        },
        checked: &["out", "mask"],
        known_bug: None,
    },
    // The backward with its mask an input placed on its own.
    Op {
        name: "native_dropout_backward",
        inputs: |s| {
            vec![
                ("g", F, vec![s[0], s[1], s[2]]),
                ("m", Elem::Bool, vec![s[0], s[1], s[2]]),
            ]
        },
        body: |_, _| {
            Some(vec![
                "out = torch.ops.aten.native_dropout_backward.default(g, m, 2.0)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
];

fn each(ops: &[Op], cases: u32, seed: u64) {
    for op in ops {
        let t = property(op, cases, seed);
        assert!(t.claims > 0, "{}: no claim was checked ({t:?})", op.name);
    }
}

#[test]
fn arange_placements_agree_with_the_interpreter() {
    each(ARANGES, 32, 0x5eed_4501);
}

#[test]
fn assert_metadata_placements_agree_with_the_interpreter() {
    each(ASSERTS, 24, 0x5eed_4502);
}

#[test]
fn scatter_reduce_placements_agree_with_the_interpreter() {
    each(SCATTER_REDUCES, 32, 0x5eed_4503);
}

#[test]
fn training_dropout_placements_agree_with_the_interpreter() {
    each(DROPOUTS, 32, 0x5eed_4504);
}

fn op(ops: &'static [Op], name: &str) -> &'static Op {
    ops.iter().find(|o| o.name == name).unwrap()
}

/// A product, `amax` or `amin` of partial terms is no partial of the spec's: no partial claim
/// (a finding: the reduction reads a partial sum). A sum and a mean stay partial.
#[test]
fn a_scatter_reduce_keeps_a_partial_only_for_linear_reductions() {
    let sum = In::P(Red::Sum);
    let places = [vec![sum], vec![In::R], vec![sum]];
    for name in [
        "scatter_reduce_prod",
        "scatter_reduce_prod_excl",
        "scatter_reduce_amax",
        "scatter_reduce_amin_excl",
    ] {
        let s = once(
            op(SCATTER_REDUCES, name),
            &[2],
            &[1, 1, 1, 0, 0, 0],
            &places,
            1,
        );
        assert!(s.finding && s.claims == 0, "{name}: {s:?}");
    }
    for name in ["scatter_reduce_sum", "scatter_reduce_mean_excl"] {
        let s = once(
            op(SCATTER_REDUCES, name),
            &[2],
            &[1, 1, 1, 0, 0, 0],
            &places,
            1,
        );
        assert_eq!(
            (s.finding, s.claims, &s.places[0]),
            (false, 1, &vec![Place::Partial(Red::Sum)]),
            "{name}"
        );
    }
}

/// The mask of a partial input's dropout is the one mask every rank applies to its term:
/// replicated, never partial (n copies of it do not sum to it).
#[test]
fn the_dropout_mask_of_a_partial_input_is_replicated() {
    let s = once(
        op(DROPOUTS, "native_dropout_keep_all"),
        &[2],
        &[1, 2, 1, 0, 0, 0],
        &[vec![In::P(Red::Sum)]],
        1,
    );
    assert_eq!(
        (s.claims, &s.places[0], &s.places[1]),
        (2, &vec![Place::Partial(Red::Sum)], &vec![Place::Replicate])
    );
}

/// The dropout backward reads its mask: a mask sharded over tp beside a gradient sharded over
/// dp masks gradient piece i with mask piece j on rank (i, j).
#[test]
fn a_dropout_backward_mask_sharded_over_another_mesh_dim_is_no_shard() {
    let s = once(
        op(DROPOUTS, "native_dropout_backward"),
        &[2, 2],
        &[1, 1, 1, 0, 0, 0],
        &[vec![In::S(0), In::R], vec![In::R, In::S(0)]],
        1,
    );
    assert!(s.finding && s.claims == 0, "{s:?}");
    // Sharded alike: the shard holds.
    let s = once(
        op(DROPOUTS, "native_dropout_backward"),
        &[2, 2],
        &[1, 1, 1, 0, 0, 0],
        &[vec![In::S(0), In::R], vec![In::S(0), In::R]],
        1,
    );
    assert_eq!((s.finding, s.claims), (false, 1), "{s:?}");
}

/// An `arange` (an `eye`, a `linspace`) of the local length 1 beside a shard of local size 1:
/// the spec's range has the global length, so the ranks' one element is no broadcast of it
/// (rank k adds 0 where the spec adds k). No claim. A graph input of size 1 is the spec's own
/// size-1 tensor: a broadcast, and the shard holds.
#[test]
fn a_replicated_construction_of_local_size_one_beside_a_shard_of_size_one_is_no_broadcast() {
    for (ops, name, d) in [
        (ARANGES, "arange_of_the_shape", 2),
        (ARANGES, "arange_default", 2),
        (CREATIONS, "eye_of_the_shape", 1),
        (CREATIONS, "eye_of_the_shape", 2),
        (CREATIONS, "linspace_of_the_shape", 2),
    ] {
        let s = once(
            op(ops, name),
            &[2],
            &[1, 1, 1, 0, 0, 0],
            &[vec![In::S(d)]],
            1,
        );
        assert_eq!(s.claims, 0, "{name} sharded on {d}: {s:?}");
    }
    let plus_input = Op {
        name: "plus_size_one_input",
        inputs: |s| vec![("x", F, vec![s[0], s[1], s[2]]), ("b", F, vec![1])],
        body: |_, _| Some(vec!["out = torch.ops.aten.add.Tensor(x, b)".into()]),
        checked: &["out"],
        known_bug: None,
    };
    let s = once(
        &plus_input,
        &[2],
        &[1, 1, 1, 0, 0, 0],
        &[vec![In::S(2)], vec![In::R]],
        1,
    );
    assert_eq!((s.claims, &s.places[0]), (1, &vec![Place::Shard(2)]));
}

fn xy3(s: &[usize]) -> Vec<(&'static str, Elem, Vec<usize>)> {
    vec![
        ("x", F, vec![s[0], s[1], s[2]]),
        ("y", F, vec![s[0], s[1], s[2]]),
    ]
}

/// Lines of a one-operator program on `x` (and `y`) of three dims: `{n}` is `x`'s last dim in
/// the program's own shapes, `{m}` its middle one, `{d}` a drawn dim (0..3), `{e}` a drawn
/// small literal (1 or 2).
fn lines(text: &str, s: &[Vec<usize>], z: &[usize]) -> Vec<String> {
    text.split('\n')
        .map(|l| {
            l.trim()
                .replace("{n}", &s[0][2].to_string())
                .replace("{m}", &s[0][1].to_string())
                .replace("{d}", &(z[3] % 3).to_string())
                .replace("{e}", &(z[4] % 2 + 1).to_string())
        })
        .collect()
}

macro_rules! on {
    ($name:literal, $inputs:expr, $text:literal, $checked:expr) => {
        Op {
            name: $name,
            inputs: $inputs,
            body: |s, z| Some(lines($text, s, z)),
            checked: $checked,
            known_bug: None,
        }
    };
}

/// Creation operators beside the input (sizes from the program's own shapes, or literals).
const CREATIONS: &[Op] = &[
    on!(
        "eye_of_the_shape",
        x3,
        "e = torch.ops.aten.eye.m({m}, {n}, dtype = torch.float64)
         out = torch.ops.aten.add.Tensor(x, e)",
        &["out"]
    ),
    on!(
        "eye_literal",
        x3,
        "e = torch.ops.aten.eye.default({e}, dtype = torch.float64)
         out = torch.ops.aten.mul.Tensor(x, 2.0)",
        &["e", "out"]
    ),
    on!(
        "linspace_of_the_shape",
        x3,
        "l = torch.ops.aten.linspace.default(0.0, 1.0, {n}, dtype = torch.float64)
         out = torch.ops.aten.add.Tensor(x, l)",
        &["out"]
    ),
    on!(
        "scalar_tensor",
        x3,
        "c = torch.ops.aten.scalar_tensor.default(2.0, dtype = torch.float64)
         out = torch.ops.aten.mul.Tensor(x, c)",
        &["c", "out"]
    ),
    on!(
        "ones_of_the_shape",
        x3,
        "o = torch.ops.aten.ones.default([{n}], dtype = torch.float64)
         out = torch.ops.aten.add.Tensor(x, o)",
        &["out"]
    ),
];

/// The `like` family: fills of the input's shape, and `new_*` of literal sizes.
const LIKES: &[Op] = &[
    on!(
        "ones_like",
        x3,
        "out = torch.ops.aten.ones_like.default(x)",
        &["out"]
    ),
    on!(
        "fill_scalar",
        x3,
        "out = torch.ops.aten.fill.Scalar(x, 1.5)",
        &["out"]
    ),
    on!("zero", x3, "out = torch.ops.aten.zero.default(x)", &["out"]),
    on!(
        "new_zeros",
        x3,
        "out = torch.ops.aten.new_zeros.default(x, [{e}, 2])",
        &["out"]
    ),
    on!(
        "new_ones",
        x3,
        "out = torch.ops.aten.new_ones.default(x, [{e}])",
        &["out"]
    ),
    on!(
        "new_full",
        x3,
        "out = torch.ops.aten.new_full.default(x, [2, {e}], 0.5)",
        &["out"]
    ),
];

/// Element-wise operators of a tested family under another name.
const ALIASES: &[Op] = &[
    on!(
        "rsub_scalar",
        x3,
        "out = torch.ops.aten.rsub.Scalar(x, 1.0)",
        &["out"]
    ),
    on!(
        "rsub_tensor",
        xy3,
        "out = torch.ops.aten.rsub.Tensor(x, y)",
        &["out"]
    ),
    on!(
        "clamp_min",
        x3,
        "out = torch.ops.aten.clamp_min.default(x, 0.0)",
        &["out"]
    ),
    on!(
        "fmod_scalar",
        x3,
        "out = torch.ops.aten.fmod.Scalar(x, 0.5)",
        &["out"]
    ),
    on!(
        "eq_tensor",
        xy3,
        "out = torch.ops.aten.eq.Tensor(x, y)",
        &["out"]
    ),
    on!(
        "min_other",
        xy3,
        "out = torch.ops.aten.min.other(x, y)",
        &["out"]
    ),
    on!(
        "sigmoid_backward",
        xy3,
        "out = torch.ops.aten.sigmoid_backward.default(x, y)",
        &["out"]
    ),
    on!(
        "tanh_backward",
        xy3,
        "out = torch.ops.aten.tanh_backward.default(x, y)",
        &["out"]
    ),
    on!(
        "silu_backward",
        xy3,
        "out = torch.ops.aten.silu_backward.default(x, y)",
        &["out"]
    ),
];

/// Views, splits, pads and reductions under the names no other file uses.
const RESHAPES: &[Op] = &[
    on!(
        "flatten",
        x3,
        "out = torch.ops.aten.flatten.using_ints(x, 1, 2)",
        &["out"]
    ),
    on!(
        "unflatten",
        x3,
        "out = torch.ops.aten.unflatten.int(x, 2, [1, {n}])",
        &["out"]
    ),
    on!(
        "reshape",
        x3,
        "out = torch.ops.aten.reshape.default(x, [-1, {n}])",
        &["out"]
    ),
    on!(
        "_unsafe_view",
        x3,
        "out = torch.ops.aten._unsafe_view.default(x, [-1, {m}, {n}])",
        &["out"]
    ),
    // The first element of the last dim and the rest (in the program's own shapes).
    Op {
        name: "split_with_sizes",
        inputs: x3,
        body: |s, _| {
            let n = s[0][2];
            (n >= 2).then(|| {
                vec![
                    format!(
                        "sp = torch.ops.aten.split_with_sizes.default(x, [1, {}], 2)",
                        n - 1
                    ),
                    "head = sp[0]".into(),
                    "out = sp[1]".into(),
                ]
            })
        },
        checked: &["head", "out"],
        known_bug: None,
    },
    on!(
        "pad",
        x3,
        "out = torch.ops.aten.pad.default(x, [0, {e}], 'constant', 0.5)",
        &["out"]
    ),
    on!(
        "min_dim",
        x3,
        "mn = torch.ops.aten.min.dim(x, {d})
         out = mn[0]
         arg = mn[1]",
        &["out", "arg"]
    ),
    on!(
        "min_all",
        x3,
        "out = torch.ops.aten.min.default(x)",
        &["out"]
    ),
];

/// Copies and views under their `_copy` and alias names, `_unsafe_index`, and reductions by
/// the names no other file uses.
const COPIES: &[Op] = &[
    on!(
        "alias",
        x3,
        "out = torch.ops.aten.alias.default(x)",
        &["out"]
    ),
    on!(
        "detach",
        x3,
        "out = torch.ops.aten.detach.default(x)",
        &["out"]
    ),
    on!(
        "contiguous",
        x3,
        "out = torch.ops.aten.contiguous.default(x)",
        &["out"]
    ),
    on!(
        "_to_copy",
        x3,
        "out = torch.ops.aten._to_copy.default(x, dtype = torch.float64)",
        &["out"]
    ),
    on!(
        "to_dtype",
        x3,
        "out = torch.ops.aten.to.dtype(x, torch.float64)",
        &["out"]
    ),
    on!(
        "lift_fresh_copy",
        x3,
        "out = torch.ops.aten.lift_fresh_copy.default(x)",
        &["out"]
    ),
    on!(
        "permute_copy",
        x3,
        "out = torch.ops.aten.permute_copy.default(x, [2, 0, 1])",
        &["out"]
    ),
    on!(
        "transpose_copy",
        x3,
        "out = torch.ops.aten.transpose_copy.int(x, 0, {d})",
        &["out"]
    ),
    on!(
        "unsqueeze_copy",
        x3,
        "out = torch.ops.aten.unsqueeze_copy.default(x, {d})",
        &["out"]
    ),
    on!(
        "view_copy",
        x3,
        "out = torch.ops.aten.view_copy.default(x, [-1, {n}])",
        &["out"]
    ),
    on!(
        "select_copy",
        x3,
        "out = torch.ops.aten.select_copy.int(x, {d}, 0)",
        &["out"]
    ),
    on!(
        "slice_copy",
        x3,
        "out = torch.ops.aten.slice_copy.Tensor(x, {d}, 0, 9223372036854775807)",
        &["out"]
    ),
    on!(
        "expand_copy",
        x3,
        "u = torch.ops.aten.unsqueeze.default(x, 0)
         out = torch.ops.aten.expand_copy.default(u, [{e}, -1, -1, -1])",
        &["out"]
    ),
    Op {
        name: "_unsafe_index",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("i", Elem::Int(0, s[0] as i64), vec![s[3]]),
            ]
        },
        body: |_, _| {
            Some(vec![
                "out = torch.ops.aten._unsafe_index.Tensor(x, [i])".into()
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    on!(
        "argmin",
        x3,
        "out = torch.ops.aten.argmin.default(x, {d})",
        &["out"]
    ),
    Op {
        name: "any_dim",
        inputs: |s| vec![("b", Elem::Bool, vec![s[0], s[1], s[2]])],
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten.any.dim(b, {})",
                z[3] % 3
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "all",
        inputs: |s| vec![("b", Elem::Bool, vec![s[0], s[1], s[2]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.all.default(b)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    on!(
        "remainder_scalar",
        x3,
        "out = torch.ops.aten.remainder.Scalar(x, 0.5)",
        &["out"]
    ),
    on!(
        "nan_to_num",
        x3,
        "out = torch.ops.aten.nan_to_num.default(x)",
        &["out"]
    ),
    on!(
        "atan2",
        xy3,
        "out = torch.ops.aten.atan2.default(x, y)",
        &["out"]
    ),
];

#[test]
fn copy_view_index_and_reduction_alias_placements_agree_with_the_interpreter() {
    each(COPIES, 16, 0x5eed_4509);
}

/// A replicated table sliced (or narrowed) at a length from the program's own shapes, added to
/// `x`: the rank's slice has the local length, the spec's the global one. One row of it beside
/// a shard of local size 1 claims nothing
/// (`one_row_of_a_replicated_table_beside_a_shard_of_size_one_is_no_broadcast`), except where
/// the table is split over some mesh dim (a known bug).
const TABLE_SLICES: &[Op] = &[
    Op {
        name: "table_slice_of_the_shape",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("t", F, vec![9, s[1], s[2]]),
            ]
        },
        body: |s, _| {
            Some(vec![
                format!("ts = torch.ops.aten.slice.Tensor(t, 0, 0, {})", s[0][0]),
                "out = torch.ops.aten.add.Tensor(x, ts)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "table_narrow_of_the_shape",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("t", F, vec![s[0], s[1], 9]),
            ]
        },
        body: |s, _| {
            Some(vec![
                format!("ts = torch.ops.aten.narrow.default(t, 2, 1, {})", s[0][2]),
                "out = torch.ops.aten.mul.Tensor(x, ts)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
];

#[test]
fn table_slice_placements_agree_with_the_interpreter() {
    each(TABLE_SLICES, 32, 0x5eed_450a);
}

#[test]
fn creation_placements_agree_with_the_interpreter() {
    each(CREATIONS, 24, 0x5eed_4505);
}

#[test]
fn like_placements_agree_with_the_interpreter() {
    each(LIKES, 24, 0x5eed_4506);
}

#[test]
fn alias_placements_agree_with_the_interpreter() {
    each(ALIASES, 24, 0x5eed_4507);
}

#[test]
fn reshape_split_pad_and_min_placements_agree_with_the_interpreter() {
    each(RESHAPES, 24, 0x5eed_4508);
}

/// A replicated table sliced (or narrowed) to one row at a length read from the local shapes,
/// beside a shard of local size 1, would pair as a broadcast: rank k reads row 0 where the
/// spec reads row k. One row of a longer dim of a tensor replicated on every mesh dim claims
/// nothing (`Varying`); a tensor some mesh dim splits keeps its reading (a microbatch of one
/// row of a batch shard: `microbatch_shares`, `review_piece_factors`).
#[test]
fn one_row_of_a_replicated_table_beside_a_shard_of_size_one_is_no_broadcast() {
    for (name, d) in [
        ("table_slice_of_the_shape", 0),
        ("table_narrow_of_the_shape", 2),
    ] {
        let s = once(
            op(TABLE_SLICES, name),
            &[2],
            &[1, 1, 1, 0, 0, 0],
            &[vec![In::S(d)], vec![In::R]],
            1,
        );
        assert_eq!(s.claims, 0, "{name}: {s:?}");
    }
}

/// The table split on another dim by another mesh dim (`t {dp: Shard(1), tp: Replicate()}`),
/// sliced to one row at a local length 1 beside `x {tp: Shard(0)}` of local size 1: on tp the
/// row would pair as a broadcast (rank (i, j) reads row 0 where the spec reads row j). No mesh
/// dim splits the sliced dim, so the one row claims nothing (issue 44: was a false claim).
#[test]
fn one_row_of_a_table_split_over_another_mesh_dim_beside_a_shard_of_size_one_is_no_broadcast() {
    for (name, d, other) in [
        ("table_slice_of_the_shape", 0, 1),
        ("table_narrow_of_the_shape", 2, 1),
        ("table_narrow_of_the_shape", 2, 0),
    ] {
        let s = once(
            op(TABLE_SLICES, name),
            &[2, 2],
            &[1, 1, 1, 0, 0, 0],
            &[vec![In::S(other), In::S(d)], vec![In::S(other), In::R]],
            1,
        );
        assert_eq!(s.claims, 0, "{name} (table split on dim {other}): {s:?}");
    }
}
