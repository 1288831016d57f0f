//! Property tests of the slicing, joining, broadcasting, masking and remaining element-wise
//! and product rules against the interpreter (harness: `common/props.rs`): slice, narrow,
//! select, slice_scatter, select_scatter, cat, stack, split, chunk, unbind, expand, repeat,
//! pad, flip, roll, triu, tril, where, masked_fill, lerp, pow, clamp, max.other,
//! activation backwards, addcdiv, dropout, squeeze, fills, copy, linear, addmm, baddbmm, mv,
//! dot, matmul. Literal arguments (dims, starts, ends, repeats) are drawn once and written
//! alike in spec and ranks; sizes follow each program's own shapes.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{once, property, Elem, In, Op};
use shardproof_check::{Place, Red};

const F: Elem = Elem::F64;

fn x3(s: &[usize]) -> Vec<(&'static str, Elem, Vec<usize>)> {
    vec![("x", F, vec![s[0], s[1], s[2]])]
}

fn xy3(s: &[usize]) -> Vec<(&'static str, Elem, Vec<usize>)> {
    vec![
        ("x", F, vec![s[0], s[1], s[2]]),
        ("y", F, vec![s[0], s[1], s[2]]),
    ]
}

/// `text` with `{d}` the drawn dim (0..3) and `{e}` a drawn small literal (1 or 2).
fn fill(text: &str, z: &[usize]) -> String {
    text.replace("{d}", &(z[3] % 3).to_string())
        .replace("{e}", &(z[4] % 2 + 1).to_string())
}

/// One call on `x` of three dims, `{d}` the drawn dim and `{e}` a drawn small literal (1 or 2).
macro_rules! on_x {
    ($name:literal, $fmt:literal) => {
        Op {
            name: $name,
            inputs: x3,
            body: |_, z| Some(vec![fill($fmt, z)]),
            checked: &["out"],
            known_bug: None,
        }
    };
}

/// One call on `x` and `y` of three dims, `{d}` the drawn dim.
macro_rules! on_xy {
    ($name:literal, $fmt:literal) => {
        Op {
            name: $name,
            inputs: xy3,
            body: |_, z| Some(vec![fill($fmt, z)]),
            checked: &["out"],
            known_bug: None,
        }
    };
}

const SLICES: &[Op] = &[
    on_x!(
        "slice_from",
        "out = torch.ops.aten.slice.Tensor(x, {d}, {e}, 9223372036854775807)"
    ),
    // The sliced dim sharded over both mesh dims: pinned by
    // `a_slice_of_a_dim_sharded_over_two_mesh_dims_reads_its_whole_size`.
    Op {
        name: "slice_to",
        inputs: x3,
        body: |_, z| {
            Some(vec![fill(
                "out = torch.ops.aten.slice.Tensor(x, {d}, 0, {e})",
                z,
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    on_x!(
        "slice_whole",
        "out = torch.ops.aten.slice.Tensor(x, {d}, 0, 9223372036854775807)"
    ),
    on_x!(
        "slice_step",
        "out = torch.ops.aten.slice.Tensor(x, {d}, 0, 9223372036854775807, {e})"
    ),
    // Narrowing the sharded dim: pinned by
    // `a_narrow_of_the_local_length_of_a_shard_is_no_shard`.
    Op {
        name: "narrow",
        inputs: x3,
        body: |_, z| {
            Some(vec![fill(
                "out = torch.ops.aten.narrow.default(x, {d}, 0, {e})",
                z,
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    on_x!("select", "out = torch.ops.aten.select.int(x, {d}, 0)"),
    on_x!("select_last", "out = torch.ops.aten.select.int(x, {d}, -1)"),
];

const SCATTERS: &[Op] = &[
    // Writes `src` (dim d of size e) at the start of dim d. Into a `self` sharded on d: pinned
    // by `a_slice_scatter_of_a_shard_s_local_length_is_no_replacement`.
    Op {
        name: "slice_scatter",
        inputs: |s| {
            let d = s[3] % 3;
            let mut src = vec![s[0], s[1], s[2]];
            src[d] = s[4] % 2 + 1;
            vec![("x", F, vec![s[0], s[1], s[2]]), ("src", F, src)]
        },
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten.slice_scatter.default(x, src, {}, 0, {})",
                z[3] % 3,
                z[4] % 2 + 1
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "select_scatter",
        inputs: |s| {
            let d = s[3] % 3;
            let mut src = vec![s[0], s[1], s[2]];
            src.remove(d);
            vec![("x", F, vec![s[0], s[1], s[2]]), ("src", F, src)]
        },
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten.select_scatter.default(x, src, {}, 0)",
                z[3] % 3
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
];

const JOINS: &[Op] = &[
    on_xy!("cat", "out = torch.ops.aten.cat.default([x, y], {d})"),
    on_xy!("stack", "out = torch.ops.aten.stack.default([x, y], {d})"),
    Op {
        name: "split",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!("sp = torch.ops.aten.split.Tensor(x, 1, {})", z[3] % 3),
                "out = sp[0]".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "chunk",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!("ch = torch.ops.aten.chunk.default(x, 2, {})", z[3] % 3),
                "out = ch[0]".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "unbind",
        inputs: x3,
        body: |_, z| {
            Some(vec![
                format!("ub = torch.ops.aten.unbind.int(x, {})", z[3] % 3),
                "out = ub[0]".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
];

const BROADCASTS: &[Op] = &[
    // A size-1 middle dim expanded to e, or a new leading dim.
    Op {
        name: "expand_middle",
        inputs: |s| vec![("x", F, vec![s[0], 1, s[2]])],
        body: |s, z| {
            let x = &s[0];
            Some(vec![format!(
                "out = torch.ops.aten.expand.default(x, [{}, {}, {}])",
                x[0],
                z[4] % 2 + 2,
                x[2]
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "expand_leading",
        inputs: x3,
        body: |s, z| {
            let x = &s[0];
            Some(vec![format!(
                "out = torch.ops.aten.expand.default(x, [{}, {}, {}, {}])",
                z[4] % 2 + 1,
                x[0],
                x[1],
                x[2]
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "repeat",
        inputs: x3,
        body: |_, z| {
            let mut r = [1, 1, 1];
            r[z[3] % 3] = z[4] % 2 + 1;
            Some(vec![format!(
                "out = torch.ops.aten.repeat.default(x, [{}, {}, {}])",
                r[0], r[1], r[2]
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    // Squeezing a sharded dim of local size 1: pinned by
    // `a_squeeze_of_a_sharded_dim_of_local_size_one_is_no_shard`.
    Op {
        name: "squeeze.dim",
        inputs: |s| vec![("x", F, vec![s[0], 1, s[2]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.squeeze.dim(x, 1)".into()]),
        checked: &["out"],
        known_bug: None,
    },
];

const REARRANGES: &[Op] = &[
    on_x!(
        "constant_pad_nd",
        "out = torch.ops.aten.constant_pad_nd.default(x, [0, {e}])"
    ),
    on_x!(
        "constant_pad_nd_2",
        "out = torch.ops.aten.constant_pad_nd.default(x, [0, 0, {e}, 0], 1.5)"
    ),
    on_x!("flip", "out = torch.ops.aten.flip.default(x, [{d}])"),
    on_x!("roll", "out = torch.ops.aten.roll.default(x, [{e}], [{d}])"),
    on_x!("triu", "out = torch.ops.aten.triu.default(x, {e})"),
    on_x!("tril", "out = torch.ops.aten.tril.default(x, -{e})"),
];

/// Masks and the remaining element-wise families.
const ELEMENTWISE: &[Op] = &[
    Op {
        name: "where.self",
        inputs: |s| {
            vec![
                ("c", Elem::Bool, vec![s[0], s[1], s[2]]),
                ("x", F, vec![s[0], s[1], s[2]]),
                ("y", F, vec![s[0], s[1], s[2]]),
            ]
        },
        body: |_, _| Some(vec!["out = torch.ops.aten.where.self(c, x, y)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "where.ScalarOther",
        inputs: |s| {
            vec![
                ("c", Elem::Bool, vec![s[0], s[1], s[2]]),
                ("x", F, vec![s[0], s[1], s[2]]),
            ]
        },
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten.where.ScalarOther(c, x, {}.0)",
                z[4] % 2
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "masked_fill.Scalar",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("m", Elem::Bool, vec![s[0], s[1], s[2]]),
            ]
        },
        body: |_, z| {
            Some(vec![format!(
                "out = torch.ops.aten.masked_fill.Scalar(x, m, {}.0)",
                z[4] % 2
            )])
        },
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "masked_fill.broadcast_mask",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("m", Elem::Bool, vec![s[1], 1]),
            ]
        },
        body: |_, _| {
            Some(vec![
                "out = torch.ops.aten.masked_fill.Scalar(x, m, 0.0)".into()
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
    on_xy!(
        "lerp.Scalar",
        "out = torch.ops.aten.lerp.Scalar(x, y, 0.25)"
    ),
    on_x!(
        "pow.Tensor_Scalar",
        "out = torch.ops.aten.pow.Tensor_Scalar(x, {e})"
    ),
    on_xy!(
        "pow.Tensor_Tensor",
        "out = torch.ops.aten.pow.Tensor_Tensor(x, y)"
    ),
    on_x!("clamp", "out = torch.ops.aten.clamp.default(x, -0.5, 0.5)"),
    on_xy!("max.other", "out = torch.ops.aten.max.other(x, y)"),
    on_xy!("maximum", "out = torch.ops.aten.maximum.default(x, y)"),
    on_xy!(
        "threshold_backward",
        "out = torch.ops.aten.threshold_backward.default(x, y, 0.0)"
    ),
    on_xy!(
        "gelu_backward",
        "out = torch.ops.aten.gelu_backward.default(x, y)"
    ),
    on_xy!(
        "addcdiv",
        "out = torch.ops.aten.addcdiv.default(x, y, y, value = 0.5)"
    ),
    on_x!(
        "dropout_eval",
        "out = torch.ops.aten.dropout.default(x, 0.5, False)"
    ),
    on_x!("zeros_like", "out = torch.ops.aten.zeros_like.default(x)"),
    on_x!(
        "full_like",
        "out = torch.ops.aten.full_like.default(x, 1.5)"
    ),
    // A source placed otherwise than a sharded `self`: pinned by
    // `a_copy_into_a_shard_takes_the_layout_of_self`.
    Op {
        name: "copy",
        inputs: xy3,
        body: |_, _| Some(vec!["out = torch.ops.aten.copy.default(x, y)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "full_plus_x",
        inputs: x3,
        body: |s, _| {
            let x = &s[0];
            Some(vec![
                format!(
                    "f = torch.ops.aten.full.default([{}, {}, {}], 2.0, dtype = torch.float64)",
                    x[0], x[1], x[2]
                ),
                "out = torch.ops.aten.mul.Tensor(x, f)".into(),
            ])
        },
        checked: &["out"],
        known_bug: None,
    },
];

const PRODUCTS: &[Op] = &[
    Op {
        name: "linear",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("w", F, vec![s[3], s[2]]),
                ("b", F, vec![s[3]]),
            ]
        },
        body: |_, _| Some(vec!["out = torch.ops.aten.linear.default(x, w, b)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "addmm",
        inputs: |s| {
            vec![
                ("b", F, vec![s[2]]),
                ("x", F, vec![s[0], s[1]]),
                ("w", F, vec![s[1], s[2]]),
            ]
        },
        body: |_, _| Some(vec!["out = torch.ops.aten.addmm.default(b, x, w)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "baddbmm",
        inputs: |s| {
            vec![
                ("b", F, vec![s[0], s[1], s[3]]),
                ("x", F, vec![s[0], s[1], s[2]]),
                ("w", F, vec![s[0], s[2], s[3]]),
            ]
        },
        body: |_, _| Some(vec!["out = torch.ops.aten.baddbmm.default(b, x, w)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "bmm",
        inputs: |s| {
            vec![
                ("x", F, vec![s[0], s[1], s[2]]),
                ("w", F, vec![s[0], s[2], s[3]]),
            ]
        },
        body: |_, _| Some(vec!["out = torch.ops.aten.bmm.default(x, w)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    // Batch dims broadcast: `w`'s one batch dim is `x`'s second.
    Op {
        name: "matmul_4d_3d",
        inputs: |s| {
            vec![
                ("x", F, vec![s[4], s[0], s[1], s[2]]),
                ("w", F, vec![s[0], s[2], s[3]]),
            ]
        },
        body: |_, _| Some(vec!["out = torch.ops.aten.matmul.default(x, w)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "mv",
        inputs: |s| vec![("x", F, vec![s[0], s[1]]), ("v", F, vec![s[1]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.mv.default(x, v)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "dot",
        inputs: |s| vec![("x", F, vec![s[0]]), ("v", F, vec![s[0]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.dot.default(x, v)".into()]),
        checked: &["out"],
        known_bug: None,
    },
    Op {
        name: "matmul_3d_2d",
        inputs: |s| vec![("x", F, vec![s[0], s[1], s[2]]), ("w", F, vec![s[2], s[3]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.matmul.default(x, w)".into()]),
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
fn slice_placements_agree_with_the_interpreter() {
    each(SLICES, 48, 0x5eed_4431);
    each(SCATTERS, 64, 0x5eed_4432);
}

#[test]
fn join_and_split_placements_agree_with_the_interpreter() {
    each(JOINS, 48, 0x5eed_4433);
}

#[test]
fn broadcast_and_rearrange_placements_agree_with_the_interpreter() {
    each(BROADCASTS, 48, 0x5eed_4434);
    each(REARRANGES, 32, 0x5eed_4435);
}

#[test]
fn elementwise_placements_agree_with_the_interpreter() {
    each(ELEMENTWISE, 32, 0x5eed_4436);
}

#[test]
fn product_placements_agree_with_the_interpreter() {
    each(PRODUCTS, 48, 0x5eed_4437);
}

/// The slice rules' central claims: a slice of another dim keeps the shard; a slice of the
/// whole sharded dim keeps it; a slice of part of it claims no shard.
#[test]
fn each_slice_makes_its_checked_claim() {
    let sizes = [2, 2, 2, 1, 0, 0];
    // dim 1 sliced [0, 1) with x sharded on dim 0: the shard stays.
    let s = once(&SLICES[1], &[2], &sizes, &[vec![In::S(0)]], 1);
    assert_eq!(
        (s.claims, &s.places[0]),
        (1, &vec![shardproof_check::Place::Shard(0)])
    );
    // The whole dim 1, sharded: the shard stays.
    let s = once(&SLICES[2], &[2], &sizes, &[vec![In::S(1)]], 1);
    assert_eq!(
        (s.claims, &s.places[0]),
        (1, &vec![shardproof_check::Place::Shard(1)])
    );
    // Part of the sharded dim: no claim.
    let s = once(&SLICES[1], &[2], &sizes, &[vec![In::S(1)]], 1);
    assert_eq!(s.claims, 0, "{s:?}");
}

/// Was a false claim (fixed): `narrow(x, d, start, length)` of the sharded dim `d` with `length`
/// the local size was read as a slice of the whole dim (the rule reads `end`, which `narrow`
/// lacks): the shard is kept, while the spec's narrow with the same literals takes the first
/// `length` rows of the global dim only.
#[test]
fn a_narrow_of_the_local_length_of_a_shard_is_no_shard() {
    // x [2, 2, 1] per rank, sharded on dim 2; narrow(x, 2, 0, 1).
    let s = once(&SLICES[4], &[2], &[2, 2, 1, 2, 0, 0], &[vec![In::S(2)]], 1);
    assert_eq!(s.claims, 0, "{s:?}");
}

/// Was a false claim (fixed): `squeeze` inferred the removed dims from the shapes alone: a sharded
/// dim of local size 1 (global size n) is squeezed on the ranks but kept by the spec's squeeze, and
/// with several size-1 dims the greedy match may pick another dim; the shard is claimed of another
/// dim of another shape.
#[test]
fn a_squeeze_of_a_sharded_dim_of_local_size_one_is_no_shard() {
    let squeeze = BROADCASTS.iter().find(|o| o.name == "squeeze.dim").unwrap();
    let s = once(squeeze, &[2], &[1, 1, 1, 0, 0, 0], &[vec![In::S(1)]], 1);
    assert_eq!(s.claims, 0, "{s:?}");
}

/// Was a false claim (fixed): `copy(self, src)` took `src`'s placement, though its result has
/// `self`'s shape: into a `self` sharded on d, a `src` replicated or partial along d (broadcast to
/// the rank's piece) is no piece of the spec's broadcast.
#[test]
fn a_copy_into_a_shard_takes_the_layout_of_self() {
    let copy = ELEMENTWISE.iter().find(|o| o.name == "copy").unwrap();
    let sum = In::P(shardproof_check::Red::Sum);
    for y in [sum, In::R] {
        let s = once(
            copy,
            &[2],
            &[1, 1, 1, 0, 0, 0],
            &[vec![In::S(0)], vec![y]],
            1,
        );
        assert_eq!(s.claims, 0, "{y:?}: {s:?}");
    }
}

/// Was a false claim (fixed): `slice_scatter(self, src, d, 0, end)` with `end` the local size of a
/// `self` sharded on d was read as a write of the whole dim (the result is `src`, placed as `src`),
/// while the spec's slice_scatter with the same literals writes only the first `end` rows of the
/// global dim and keeps the rest of `self`.
#[test]
fn a_slice_scatter_of_a_shard_s_local_length_is_no_replacement() {
    // self [1, 2, 1] per rank sharded on dim 1, src [1, 2, 1] replicated, end 2.
    let s = once(
        &SCATTERS[0],
        &[2],
        &[1, 2, 1, 1, 1, 0],
        &[vec![In::S(1)], vec![In::R]],
        1,
    );
    assert_eq!(s.claims, 0, "{s:?}");
}

/// Rank-dependent literals (the rules that read every rank's literals): on `tp = n`, rank k
/// slices a replicated `x` at `[o_k * L, o_k * L + L)` along dim d (a shard where `o_k = k`),
/// or pads its piece of a shard of dim d with `o_k * w` zeros before and `(n - 1 - o_k) * w`
/// after (a partial sum where `o_k = k`); the offsets are the identity, a rotation or a
/// swap of two ranks. Whatever the checker claims must hold of the values.
#[test]
fn rank_dependent_slices_and_pads_agree_with_the_interpreter() {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;
    let strategy = (
        2..=3usize,
        proptest::collection::vec(1..=2usize, 2),
        0..2usize,
        0..3usize,
        any::<bool>(),
        any::<u64>(),
    );
    let mut runner = TestRunner::new(props::config(64, 0x5eed_4438));
    let tally = std::cell::RefCell::new(props::Tally::default());
    runner
        .run(&strategy, |(n, shape, d, perm, pad, seed)| {
            let offsets: Vec<usize> = (0..n)
                .map(|k| match perm {
                    0 => k,
                    1 => (k + 1) % n,
                    _ => [1, 0, 2][k],
                })
                .collect();
            let (local, places, ranks, spec): (Vec<usize>, In, Vec<Vec<String>>, String) = if pad {
                let w = shape[d];
                let ranks = offsets
                    .iter()
                    .map(|&o| {
                        // constant_pad_nd pads the last dims first: dim d of 2 is pair 1 - d.
                        let mut p = vec![0usize; 4];
                        p[2 * (1 - d)] = o * w;
                        p[2 * (1 - d) + 1] = (n - 1 - o) * w;
                        vec![format!(
                            "out = torch.ops.aten.constant_pad_nd.default(x, {p:?})"
                        )]
                    })
                    .collect();
                (
                    shape.clone(),
                    In::S(d),
                    ranks,
                    "out = torch.ops.aten.clone.default(x)".into(),
                )
            } else {
                let l = shape[d];
                let mut global = shape.clone();
                global[d] *= n;
                let ranks = offsets
                    .iter()
                    .map(|&o| {
                        vec![format!(
                            "out = torch.ops.aten.slice.Tensor(x, {d}, {}, {})",
                            o * l,
                            o * l + l
                        )]
                    })
                    .collect();
                (
                    global,
                    In::R,
                    ranks,
                    "out = torch.ops.aten.clone.default(x)".into(),
                )
            };
            let prog = props::Program {
                mesh: vec![n],
                inputs: vec![props::Input::f("x", &local, &[places])],
                spec: vec![spec],
                ranks,
                checked: vec![("out".into(), "out".into())],
            };
            let seen = props::run(&prog, seed).map_err(TestCaseError::fail)?;
            // The identity offsets are claimed (a shard, a partial sum) and hold.
            if perm == 0 {
                prop_assert_eq!(seen.claims, 1, "{:?}", seen);
            }
            tally.borrow_mut().add(&seen);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{:?}", tally.into_inner());
}

fn product(name: &str) -> &'static Op {
    PRODUCTS.iter().find(|o| o.name == name).unwrap()
}

/// On `dp x tp`, a batch dim sharded over dp in one factor and over tp in the other: each mesh
/// dim alone reads a batch shard (a shard beside a replicated factor), but rank (i, j)
/// multiplies batch piece i by batch piece j. A `placement-consistency` finding, and no claim.
#[test]
fn batch_shards_of_different_mesh_dims_are_no_shard_of_the_product() {
    let (dp, tp) = (vec![In::S(0), In::R], vec![In::R, In::S(0)]);
    let s = once(
        product("baddbmm"),
        &[2, 2],
        &[1, 1, 1, 1, 0, 0],
        &[dp.clone(), dp.clone(), tp.clone()],
        1,
    );
    assert!(s.finding && s.claims == 0, "{s:?}");
    let s = once(product("bmm"), &[2, 2], &[1, 1, 1, 1, 0, 0], &[dp, tp], 1);
    assert!(s.finding && s.claims == 0, "{s:?}");
    // torch.matmul's broadcast batch dims: `w`'s one batch dim is `x`'s second.
    let s = once(
        product("matmul_4d_3d"),
        &[2, 2],
        &[1, 1, 1, 1, 1, 0],
        &[vec![In::S(1), In::R], vec![In::R, In::S(0)]],
        1,
    );
    assert!(s.finding && s.claims == 0, "{s:?}");
}

/// A bias sharded over other mesh dims than the product it is added to (`baddbmm`'s batch,
/// `linear`'s columns): rank (i, j) adds bias piece i to product piece j.
#[test]
fn a_bias_sharded_over_other_mesh_dims_than_its_product_is_no_shard() {
    let (dp, tp) = (vec![In::S(0), In::R], vec![In::R, In::S(0)]);
    let s = once(
        product("baddbmm"),
        &[2, 2],
        &[1, 1, 1, 1, 0, 0],
        &[dp.clone(), tp.clone(), tp.clone()],
        1,
    );
    assert!(s.finding && s.claims == 0, "{s:?}");
    // linear(x, w, b): w's rows (the output's columns) over tp, b over dp.
    let s = once(
        product("linear"),
        &[2, 2],
        &[1, 1, 1, 1, 0, 0],
        &[vec![In::R, In::R], tp, dp],
        1,
    );
    assert!(s.finding && s.claims == 0, "{s:?}");
}

/// What the cross-mesh check must leave alone: factors batch-sharded over the same mesh dims,
/// and a 2-d product whose factors shard other dims over other mesh dims (`x`'s contracted
/// dim and `w`'s over dp, `x`'s rows over tp: a partial sum over dp of a row shard over tp).
#[test]
fn products_sharded_alike_or_on_other_dims_across_mesh_dims_keep_their_claims() {
    let both = vec![In::S(0), In::S(0)];
    let s = once(
        product("bmm"),
        &[2, 2],
        &[1, 1, 1, 1, 0, 0],
        &[both.clone(), both],
        1,
    );
    assert_eq!(
        (s.finding, s.claims, &s.places[0]),
        (false, 1, &vec![Place::Shard(0), Place::Shard(0)])
    );
    let mm = Op {
        name: "mm",
        inputs: |s| vec![("x", F, vec![s[0], s[1]]), ("w", F, vec![s[1], s[2]])],
        body: |_, _| Some(vec!["out = torch.ops.aten.mm.default(x, w)".into()]),
        checked: &["out"],
        known_bug: None,
    };
    let s = once(
        &mm,
        &[2, 2],
        &[1, 1, 1, 0, 0, 0],
        &[vec![In::S(1), In::S(0)], vec![In::S(0), In::R]],
        1,
    );
    assert_eq!(
        (s.finding, s.claims, &s.places[0]),
        (false, 1, &vec![Place::Partial(Red::Sum), Place::Shard(0)])
    );
}

/// A factor whose layout on one of the mesh dims is not known (`Varying`: a literal that
/// differs along tp) shows no mix there: no finding of the cross-mesh check (never one that
/// names the same batch dim on both sides), and the product claims nothing on that mesh dim.
#[test]
fn a_varying_factor_yields_no_cross_mesh_finding() {
    let ranks: Vec<Vec<String>> = (0..4)
        .map(|r| {
            vec![
                format!("w2 = torch.ops.aten.mul.Tensor(w, {}.0)", 1 + r % 2),
                "out = torch.ops.aten.bmm.default(x, w2)".into(),
            ]
        })
        .collect();
    let prog = props::Program {
        mesh: vec![2, 2],
        inputs: vec![
            props::Input::f("x", &[1, 1, 1], &[In::R, In::S(0)]),
            props::Input::f("w", &[1, 1, 1], &[In::S(0), In::R]),
        ],
        spec: vec![
            "w2 = torch.ops.aten.mul.Tensor(w, 1.0)".into(),
            "out = torch.ops.aten.bmm.default(x, w2)".into(),
        ],
        ranks,
        checked: vec![("out".into(), "out".into())],
    };
    let s = props::run(&prog, 1).unwrap();
    assert!(!s.finding, "{s:?}");
    assert_eq!(s.places[0][1], Place::Varying, "{s:?}");
}

/// Was a false claim (fixed): a slice of a dim sharded over both mesh dims, ending at `n` times the
/// local size (`n` one mesh dim's size), was read as a slice of the whole dim on each mesh dim: the
/// global size is the local one times both mesh dims' sizes, so the spec's slice takes part.
#[test]
fn a_slice_of_a_dim_sharded_over_two_mesh_dims_reads_its_whole_size() {
    let slice_to = SLICES.iter().find(|o| o.name == "slice_to").unwrap();
    // x [1, 1, 1] per rank sharded on dim 1 over dp and tp; slice(x, 1, 0, 2).
    let s = once(
        slice_to,
        &[2, 2],
        &[1, 1, 1, 1, 1, 0],
        &[vec![In::S(1), In::S(1)]],
        1,
    );
    assert_eq!(s.claims, 0, "{s:?}");
}
