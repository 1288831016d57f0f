//! The ring backward's key and value gradients across ranks (`attention/key_grads.rs`, issue
//! 44) on the zoo's llama `cp=2` full iteration.
//!
//! The zoo's plan holds, and each rank's final recv of the gradient of its keys and values
//! (`recv_8`, `recv_9`: the last layer's, first in the backward) is claimed as the rank's rows
//! of the spec's gradient, which the interpreter confirms. Planted bugs, each a textual edit
//! of the emitted rank graphs at the last layer's backward ring, never hold and never make
//! that claim: the gradient not sent back, a step skipped, a contribution added twice, a
//! contribution of the wrong query rows, of the wrong key block or into the wrong part of
//! the block, a peer that sends to itself, the values' gradient computed with `dS` instead
//! of `P`, the values' contribution added to the keys' record. On a ring of 4 ranks every
//! rank's final recvs are claimed and right, and a complete gradient sent to another rank than
//! its owner is not claimed there.

use proptest::prelude::*;
use shardproof_check::Verdict;

mod common;
use common::ring_backward::{claims_hold, run_edited, Ran};

/// A planted bug: replacements in one rank's graph (each `old` must occur exactly once), and
/// in the others' (`more`: rank, old, new).
#[derive(Clone, Copy, Debug)]
struct Bug {
    name: &'static str,
    /// The ring's size.
    cp: usize,
    rank: usize,
    edits: &'static [(&'static str, &'static str)],
    more: &'static [(usize, &'static str, &'static str)],
    /// The final recvs (rank, 0 for the keys' `recv_8`, 1 for the values' `recv_9`) whose
    /// gradient the bug breaks: never claimed.
    unclaimed: &'static [(usize, usize)],
}

/// The planted bugs (rank 0 holds chunks 0 and 3: at its step 1 it computes its second half
/// of the queries against rank 1's whole block, `add`; rank 1 all of its queries against the
/// first half of rank 0's block, a concatenation of slices).
fn bugs() -> Vec<Bug> {
    vec![
        Bug {
            // The owner reads its own first contribution instead of the gradient sent back.
            name: "not-sent-back",
            cp: 2,
            rank: 0,
            unclaimed: &[],
            more: &[],
            edits: &[
                ("aten.mul.Tensor(recv_8, cos)", "aten.mul.Tensor(sum_3, cos)"),
                ("aten.mul.Tensor(recv_8, sin)", "aten.mul.Tensor(sum_3, sin)"),
            ],
        },
        Bug {
            // Rank 0 passes the received gradient on without its contribution.
            name: "step-skipped",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 0)],
            more: &[],
            edits: &[(
                "send.default(add_25, 1, 34, 'cp')",
                "send.default(recv_6, 1, 34, 'cp')",
            )],
        },
        Bug {
            name: "values-step-skipped",
            cp: 2,
            rank: 1,
            unclaimed: &[(0, 1)],
            more: &[],
            edits: &[(
                "send.default(cat_9, 0, 35, 'cp')",
                "send.default(recv_7, 0, 35, 'cp')",
            )],
        },
        Bug {
            // Rank 0 adds its contribution to the received sum twice.
            name: "added-twice",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 0)],
            more: &[],
            edits: &[(
                "add_25: \"f32[2, 2, 4, 4]\" = torch.ops.aten.add.Tensor(recv_6, sum_5)",
                "twice: \"f32[2, 2, 4, 4]\" = torch.ops.aten.add.Tensor(recv_6, sum_5)\n        add_25: \"f32[2, 2, 4, 4]\" = torch.ops.aten.add.Tensor(twice, sum_5)",
            )],
        },
        Bug {
            // Rank 0 sends its own first contribution twice over.
            name: "first-step-twice",
            cp: 2,
            rank: 0,
            unclaimed: &[(0, 0)],
            more: &[],
            edits: &[(
                "send.default(sum_3, 1, 28, 'cp')",
                "send.default(twice0, 1, 28, 'cp')",
            ), (
                "send_6: ",
                "twice0: \"f32[2, 2, 4, 4]\" = torch.ops.aten.add.Tensor(sum_3, sum_3)\n        send_6: ",
            )],
        },
        Bug {
            // Rank 0's step-1 keys' gradient multiplies by its first half of the queries.
            name: "wrong-query-rows",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 0)],
            more: &[],
            edits: &[(
                "torch.ops.aten.bmm.default(transpose_20, slice_22)",
                "torch.ops.aten.bmm.default(transpose_20, slice_first)",
            ), (
                "bmm_17: ",
                "slice_first: \"f32[8, 2, 4]\" = torch.ops.aten.slice.Tensor(view_24, 1, 0, 2)\n        bmm_17: ",
            )],
        },
        Bug {
            // Rank 0's step 1 runs against its own keys (rank 1's record gets rank 0's block).
            name: "wrong-key-block",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 0), (1, 1)],
            more: &[],
            edits: &[(
                "torch.ops.aten.unsqueeze.default(recv_4, 2)",
                "torch.ops.aten.unsqueeze.default(add_12, 2)",
            )],
        },
        Bug {
            // Rank 1 adds its contribution of the first half of rank 0's keys to the second.
            name: "wrong-key-part",
            cp: 2,
            rank: 1,
            unclaimed: &[(0, 0)],
            more: &[],
            edits: &[(
                "torch.ops.aten.add.Tensor(slice_18, sum_5)",
                "torch.ops.aten.add.Tensor(slice_19, sum_5)",
            ), (
                "torch.ops.aten.cat.default([add_25, slice_19], 2)",
                "torch.ops.aten.cat.default([slice_18, add_25], 2)",
            )],
        },
        Bug {
            // Rank 1 sends the keys' gradient back to itself and receives it from itself.
            name: "self-peer",
            cp: 2,
            rank: 1,
            unclaimed: &[(1, 0)],
            more: &[],
            edits: &[(
                "send.default(cat_8, 0, 34, 'cp')",
                "send.default(cat_8, 1, 34, 'cp')",
            ), (
                "recv.default([2, 2, 4, 4], torch.float32, 0, 34, 'cp')",
                "recv.default([2, 2, 4, 4], torch.float32, 1, 34, 'cp')",
            )],
        },
        Bug {
            // Rank 0's step-1 values' gradient is `dS^T dO`.
            name: "values-with-ds",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 1)],
            more: &[],
            edits: &[(
                "bmm_14: \"f32[8, 4, 4]\" = torch.ops.aten.bmm.default(transpose_18, slice_24)\n        ",
                "",
            ), (
                "bmm_17: ",
                "bmm_14: \"f32[8, 4, 4]\" = torch.ops.aten.bmm.default(transpose_20, slice_24)\n        bmm_17: ",
            )],
        },
        Bug {
            // Rank 0 adds its values' contribution to the keys' gradient and the keys' to the
            // values'.
            name: "kinds-swapped",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 0), (1, 1)],
            more: &[],
            edits: &[(
                "torch.ops.aten.add.Tensor(recv_6, sum_5)",
                "torch.ops.aten.add.Tensor(recv_6, sum_6)",
            ), (
                "torch.ops.aten.add.Tensor(recv_7, sum_6)",
                "torch.ops.aten.add.Tensor(recv_7, sum_5)",
            )],
        },
        Bug {
            // Rank 0's step-0 scores without the causal mask.
            name: "no-mask",
            cp: 2,
            rank: 0,
            unclaimed: &[(0, 0), (0, 1)],
            more: &[],
            edits: &[(
                "torch.ops.aten.sub.Tensor(add_23, cat_11)",
                "torch.ops.aten.sub.Tensor(mul_44, cat_11)",
            )],
        },
        Bug {
            // Rank 0's step 1 normalized by its step-0 block's log-sum-exp (its rows of it).
            name: "block-normalization",
            cp: 2,
            rank: 0,
            unclaimed: &[(1, 0), (1, 1)],
            more: &[],
            edits: &[(
                "torch.ops.aten.sub.Tensor(mul_47, slice_23)",
                "torch.ops.aten.sub.Tensor(mul_47, slice_21)",
            )],
        },
        Bug {
            // Rank 0 passes its complete keys' gradient on to rank 1, which uses it as its own.
            name: "past-the-owner",
            cp: 2,
            rank: 0,
            unclaimed: &[],
            edits: &[(
                "recv_9: ",
                "send_x: \"f32[2, 2, 4, 4]\" = torch.ops.shardproof_p2p.send.default(recv_8, 1, 999, 'cp')\n        recv_9: ",
            )],
            more: &[
                (
                    1,
                    "recv_9: ",
                    "recv_x: \"f32[2, 2, 4, 4]\" = torch.ops.shardproof_p2p.recv.default([2, 2, 4, 4], torch.float32, 0, 999, 'cp')\n        recv_9: ",
                ),
                (1, "aten.mul.Tensor(recv_8, cos)", "aten.mul.Tensor(recv_x, cos)"),
                (1, "aten.mul.Tensor(recv_8, sin)", "aten.mul.Tensor(recv_x, sin)"),
            ],
        },
        Bug {
            // On a ring of 4, rank 2 sends rank 3's complete keys' gradient to rank 0, which
            // takes it for its own.
            name: "complete-at-another-rank",
            cp: 4,
            rank: 2,
            unclaimed: &[(0, 0)],
            edits: &[(
                "send.default(add_43, 3, 58, 'cp')",
                "send.default(add_43, 0, 58, 'cp')",
            )],
            more: &[(
                0,
                "recv.default([2, 2, 2, 4], torch.float32, 3, 58, 'cp')",
                "recv.default([2, 2, 2, 4], torch.float32, 2, 58, 'cp')",
            )],
        },
    ]
}

/// Checks and runs the plan on a ring of `cp` ranks with `bug` planted (none: the zoo's plan)
/// on inputs of `seed`.
fn run(cp: usize, bug: Option<&Bug>, seed: u64) -> Ran {
    let edit = |rank: usize, text: &str| {
        let mut text = text.to_string();
        if let Some(b) = bug {
            let edits = b.edits.iter().map(|&(old, new)| (b.rank, old, new));
            for (r, old, new) in edits.chain(b.more.iter().copied()) {
                if r == rank {
                    assert_eq!(text.matches(old).count(), 1, "{}: `{old}`", b.name);
                    text = text.replacen(old, new, 1);
                }
            }
        }
        text
    };
    run_edited(cp, &edit, seed)
}

#[test]
fn the_zoo_ring_backward_holds_and_agrees_with_the_interpreter() {
    let ran = run(2, None, 1);
    assert_eq!(ran.verdict, Verdict::Holds, "{}", ran.render);
    assert_eq!(ran.claimed, vec![[true; 2]; 2]);
    assert_eq!(ran.right, Some(vec![[true; 2]; 2]));
}

#[test]
fn planted_bugs_of_the_key_and_value_gradients_never_hold() {
    for bug in bugs() {
        let ran = run(bug.cp, Some(&bug), 2);
        assert_ne!(ran.verdict, Verdict::Holds, "{}: {}", bug.name, ran.render);
        for &(r, j) in bug.unclaimed {
            assert!(
                !ran.claimed[r][j],
                "{}: rank {r} final recv {j} claimed",
                bug.name
            );
            // A real bug: the value is wrong where the program runs.
            if let Some(right) = &ran.right {
                assert!(
                    !right[r][j],
                    "{}: rank {r} final recv {j} is right",
                    bug.name
                );
            }
        }
        // The bugs that break one gradient leave the other's claim, which must be right.
        claims_hold(&ran).unwrap_or_else(|e| panic!("{}: {e}", bug.name));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn claims_agree_with_the_interpreter(which in 0usize..16, seed in 0u64..1000) {
        let bugs = bugs();
        let bug = bugs.get(which);
        let ran = run(bug.map_or(2, |b| b.cp), bug, seed);
        prop_assert!(claims_hold(&ran).is_ok(), "{:?}", claims_hold(&ran));
        if which >= bugs.len() {
            prop_assert_eq!(ran.verdict, Verdict::Holds);
        }
    }
}

#[test]
fn a_ring_of_four_reads_every_owners_gradient() {
    let ran = run(4, None, 3);
    // The whole plan holds too (`tests/zoo.rs::llama_full_iteration_on_a_ring_of_four_holds`).
    assert_eq!(ran.claimed, vec![[true; 2]; 4], "{}", ran.render);
    assert_eq!(ran.right, Some(vec![[true; 2]; 4]));
}
