//! Adversarial programs against a selection's frame (`Place::Selected`, issue 44): the
//! expert-parallel dispatcher's all-gather of a microbatch's rows over their own mesh dim,
//! the experts' products on the gathered rows, and the combine's reduce-scatter back to the
//! rank's rows. Each program breaks one thing the frame relies on; the interpreter shows the
//! ranks' pieces are not the spec's, and the checker must not hold.
//!
//! Mesh `dp: 2, ep: 2` (dp replicates everything). Each rank holds its ep shard of the tokens
//! `x [L, H]` and one expert `w [1, H, H]`; per microbatch k (rows `[k*l, (k+1)*l)` of its
//! shard) it gathers the rows over ep, applies its expert to all of them, reduce-scatters the
//! experts' sum back, weights each of its rows by the token itself and sums: `out` is
//! `Partial(sum)` on ep. The spec applies both experts to every token.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::check_case;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::dispatch::{
    block, dp_and_ep_groups, gathered_rows, load_written, rank_outs, spec_out, ty,
    weighted_sum_spec, x_and_w, Declared, Ran,
};
use common::values::{close, random};

/// Coordinates of ep (and of dp).
const N: usize = 2;
/// Microbatches.
const K: usize = 2;
/// Rows a microbatch of a rank's shard.
const L: usize = 2;
/// Hidden size (the gathered rows' count, so that a transpose keeps the shapes).
const H: usize = N * L;

/// What a program changes in the dispatcher (one microbatch's lines, `k`, on ep coordinate
/// `r`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Attack {
    /// None: the correct program.
    None,
    /// The all-gather over `dp`, not over the rows' own mesh dim.
    GatherOverOtherGroup,
    /// The combine reduce-scatters the experts' sum with its two coordinates' rows swapped.
    CombineOtherRows,
    /// The combine reduce-scatters the experts' sum transposed: the hidden dim, not the rows.
    CombineAlongHidden,
    /// No combine: each rank takes its own rows of its own expert's output.
    NotCombined,
    /// The experts read both microbatches' gathered rows (another selection beside the frame).
    OtherSelection,
    /// The combine reduce-scatters over `dp`, not over the mesh dim the rows were gathered over.
    CombineOverOtherDim,
}

/// The lines of microbatch `k` on ep coordinate `r`: `o{k} [H]`.
fn microbatch(k: usize, r: usize, attack: Attack) -> Vec<String> {
    let g = N * L;
    let group = if attack == Attack::GatherOverOtherGroup {
        "dp"
    } else {
        "ep"
    };
    let mut b = gathered_rows(k, (L, H), (group, N), &format!("agw{k}"));
    let experts_read = if attack == Attack::OtherSelection && k == 1 {
        b.push(format!(
            "both{k}: {} = torch.ops.aten.add.Tensor(agw{k}, agw{})",
            ty(&[g, H]),
            k - 1
        ));
        format!("both{k}")
    } else {
        format!("agw{k}")
    };
    b.push(format!(
        "u{k}: {} = torch.ops.aten.unsqueeze.default({experts_read}, 0)",
        ty(&[1, g, H])
    ));
    b.push(format!(
        "e{k}: {} = torch.ops.aten.expand.default(u{k}, [1, {g}, {H}])",
        ty(&[1, g, H])
    ));
    b.push(format!(
        "b{k}: {} = torch.ops.aten.bmm.default(e{k}, w)",
        ty(&[1, g, H])
    ));
    b.push(format!(
        "s{k}: {} = torch.ops.aten.sum.dim_IntList(b{k}, [0])",
        ty(&[g, H])
    ));
    match attack {
        Attack::NotCombined => b.push(format!(
            "rw{k}: {} = torch.ops.aten.slice.Tensor(s{k}, 0, {}, {})",
            ty(&[L, H]),
            r * L,
            (r + 1) * L
        )),
        _ => {
            let scattered = if attack == Attack::CombineAlongHidden {
                b.push(format!(
                    "tr{k}: {} = torch.ops.aten.transpose.int(s{k}, 0, 1)",
                    ty(&[H, g])
                ));
                b.push(format!(
                    "tc{k}: {} = torch.ops.aten.clone.default(tr{k}, memory_format = torch.contiguous_format)",
                    ty(&[H, g])
                ));
                format!("tc{k}")
            } else if attack == Attack::CombineOtherRows {
                b.push(format!(
                    "hi{k}: {} = torch.ops.aten.slice.Tensor(s{k}, 0, {L}, {g})",
                    ty(&[L, H])
                ));
                b.push(format!(
                    "lo{k}: {} = torch.ops.aten.slice.Tensor(s{k}, 0, 0, {L})",
                    ty(&[L, H])
                ));
                b.push(format!(
                    "sw{k}: {} = torch.ops.aten.cat.default([hi{k}, lo{k}])",
                    ty(&[g, H])
                ));
                format!("sw{k}")
            } else {
                format!("s{k}")
            };
            let over = if attack == Attack::CombineOverOtherDim {
                "dp"
            } else {
                "ep"
            };
            b.push(format!(
                "rs{k}: {} = torch.ops._c10d_functional.reduce_scatter_tensor.default({scattered}, 'sum', {N}, '{over}')",
                ty(&[L, H])
            ));
            b.push(format!(
                "rw{k}: {} = torch.ops._c10d_functional.wait_tensor.default(rs{k})",
                ty(&[L, H])
            ));
        }
    }
    b.push(format!(
        "m{k}: {} = torch.ops.aten.mul.Tensor(rw{k}, x{k})",
        ty(&[L, H])
    ));
    b.push(format!(
        "o{k}: {} = torch.ops.aten.sum.dim_IntList(m{k}, [0])",
        ty(&[H])
    ));
    b
}

/// Rank graph on ep coordinate `r`.
fn rank_graph(r: usize, attack: Attack) -> String {
    let params = vec![
        format!("x: {}", ty(&[K * L, H])),
        format!("w: {}", ty(&[1, H, H])),
    ];
    let mut body = Vec::new();
    for k in 0..K {
        body.extend(microbatch(k, r, attack));
    }
    body.push(format!(
        "out: {} = torch.ops.aten.add.Tensor(o0, o1)",
        ty(&[H])
    ));
    common::hand::graph_module(&params, &body)
}

/// Runs `attack` with the tokens sharded on ep alone (replicated on dp), or on dp and ep
/// (`dp_sharded`: dp's rows are then the gathered rows of `RowKey::Gathered` on dp).
fn run(attack: Attack, dp_sharded: bool) -> Ran {
    let shards = if dp_sharded { N * N } else { N };
    let batch = shards * K * L;
    // Rank = dp * N + ep.
    let ranks: Vec<String> = (0..N * N).map(|q| rank_graph(q % N, attack)).collect();
    let (x, out) = if dp_sharded {
        (
            "{ dp: Shard(0), ep: Shard(0) }",
            "{ dp: Partial(sum), ep: Partial(sum) }",
        )
    } else {
        ("{ ep: Shard(0) }", "{ ep: Partial(sum) }")
    };
    let case = load_written(
        &weighted_sum_spec(batch, N, H),
        &ranks,
        &Declared {
            name: "frame-adversarial",
            mesh: &[("dp", N), ("ep", N)],
            groups: &dp_and_ep_groups(),
            inputs: &[("x", x.to_string()), ("w", "{ ep: Shard(0) }".to_string())],
            outputs: &[("out", out.to_string())],
        },
    );
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let xs = random(&[batch, H], &mut rng);
    let ws = random(&[N, H, H], &mut rng);
    let want = spec_out(&case, &x_and_w(xs.clone(), ws.clone()));
    // Each rank's shards: block `s` of x's rows (dp outer, ep inner, where dp shards them) and
    // expert e.
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..N * N)
        .map(|q| {
            let (d, e) = (q / N, q % N);
            let s = if dp_sharded { d * N + e } else { e };
            x_and_w(block(&xs, &[K * L, H], s), block(&ws, &[1, H, H], e))
        })
        .collect();
    let outs = rank_outs(&case, &per_rank).expect("the ranks run");
    let mut got = vec![0.0; H];
    // Summed over ep (and over dp where it shards the tokens; else dp coordinate 0's).
    for o in outs.iter().take(if dp_sharded { N * N } else { N }) {
        let o = o.as_ref().unwrap();
        got.iter_mut().zip(o.data.iter()).for_each(|(a, v)| *a += v);
    }
    Ran {
        verdict: report.verdict,
        right: want.is_some_and(|w| close(&got, &w)),
        report: report.render(),
    }
}

/// Asserts the interpreter shows the program wrong and the checker does not hold.
fn never_holds(attack: Attack) {
    never_holds_on(attack, false);
}

/// As [`never_holds`], the tokens sharded on dp too where `dp_sharded`.
fn never_holds_on(attack: Attack, dp_sharded: bool) {
    let ran = run(attack, dp_sharded);
    ran.assert_never_holds(&format!("{attack:?}"));
}

#[test]
fn the_dispatcher_gather_experts_and_combine_hold() {
    run(Attack::None, false).assert_holds("None");
}

#[test]
fn a_gather_over_another_group_never_holds() {
    never_holds(Attack::GatherOverOtherGroup);
}

#[test]
fn a_combine_of_other_rows_never_holds() {
    never_holds(Attack::CombineOtherRows);
}

#[test]
fn a_combine_along_another_dim_never_holds() {
    never_holds(Attack::CombineAlongHidden);
}

#[test]
fn experts_outputs_not_combined_never_hold() {
    never_holds(Attack::NotCombined);
}

#[test]
fn experts_reading_another_selection_never_hold() {
    never_holds(Attack::OtherSelection);
}

/// Tokens sharded on dp too: on dp the gather's rows are `RowKey::Gathered` (dp's rows of every
/// ep coordinate), which the combine over ep gives back as dp's own rows.
#[test]
fn the_dispatcher_holds_with_the_tokens_sharded_on_dp_too() {
    run(Attack::None, true).assert_holds("None");
}

#[test]
fn a_combine_over_another_mesh_dim_never_holds() {
    never_holds_on(Attack::CombineOverOtherDim, true);
    never_holds_on(Attack::CombineOverOtherDim, false);
}

#[test]
fn attacks_with_the_tokens_sharded_on_dp_too_never_hold() {
    for attack in [
        Attack::GatherOverOtherGroup,
        Attack::CombineOtherRows,
        Attack::CombineAlongHidden,
        Attack::NotCombined,
        Attack::OtherSelection,
    ] {
        never_holds_on(attack, true);
    }
}
