//! The experts' weight gradients read through a selection's frame (issue 44: DeepSeek's
//! `bmm` contracting the dispatched tokens): a sum over the rows an all-gather over `ep`
//! concatenated. On `ep` every coordinate sums the whole selection (`rows::frame_summed`);
//! on `dp` the sum counts each ep piece once only because ep's coordinates hold distinct
//! pieces and do not sum again (`engine::gathered_sums`).
//!
//! Mesh `dp: 2, ep: 2`. Rank `(d, e)` holds block `d * 2 + e` of the tokens `x` and expert
//! `e`'s weight `w [1, H, H]`; per microbatch k it gathers its rows over ep and computes
//! `t^T (t w)` for the gathered tokens `t`, summed over microbatches: expert e's gradient-like
//! sum over dp's tokens, `{ dp: Partial(sum), ep: Shard(0) }`. The spec does it for every
//! expert over every token. Each planted bug is run through the interpreter, which must show
//! it wrong, and must not hold.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::check_case;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::dispatch::{
    block, dp_and_ep_groups, experts_on_every_token, gathered_rows, load_written, rank_outs,
    spec_out, ty, x_and_w, Declared, Ran,
};
use common::values::{close, random};

/// Coordinates of dp and of ep.
const N: usize = 2;
/// Microbatches.
const K: usize = 2;
/// Rows a microbatch of a rank's shard.
const L: usize = 2;
/// Hidden size.
const H: usize = 3;

/// What a program changes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Attack {
    /// None: the correct program.
    None,
    /// The tokens replicated on ep, not sharded: the gather holds dp's rows twice.
    TokensReplicatedOnEp,
    /// One weight replicated on ep, every rank's result declared a sum over ep too: ep's
    /// coordinates sum the same gathered rows again.
    SummedOverEpToo,
}

/// The rank graph (the same on every rank).
fn rank_graph() -> String {
    let g = N * L;
    let params = vec![
        format!("x: {}", ty(&[K * L, H])),
        format!("w: {}", ty(&[1, H, H])),
    ];
    let mut b = Vec::new();
    for k in 0..K {
        b.extend(gathered_rows(k, (L, H), ("ep", N), &format!("t{k}")));
        b.push(format!(
            "u{k}: {} = torch.ops.aten.unsqueeze.default(t{k}, 0)",
            ty(&[1, g, H])
        ));
        b.push(format!(
            "p{k}: {} = torch.ops.aten.bmm.default(u{k}, w)",
            ty(&[1, g, H])
        ));
        b.push(format!(
            "ut{k}: {} = torch.ops.aten.transpose.int(u{k}, 1, 2)",
            ty(&[1, H, g])
        ));
        b.push(format!(
            "gw{k}: {} = torch.ops.aten.bmm.default(ut{k}, p{k})",
            ty(&[1, H, H])
        ));
    }
    b.push(format!(
        "out: {} = torch.ops.aten.add.Tensor(gw0, gw1)",
        ty(&[1, H, H])
    ));
    common::hand::graph_module(&params, &b)
}

/// The spec: `x^T (x w_e)` for each of `experts` experts over all `batch` tokens.
fn spec_graph(batch: usize, experts: usize) -> String {
    let params = vec![
        format!("x: {}", ty(&[batch, H])),
        format!("w: {}", ty(&[experts, H, H])),
    ];
    let mut body = experts_on_every_token(batch, experts, H);
    body.extend([
        format!(
            "et: {} = torch.ops.aten.transpose.int(ex, 1, 2)",
            ty(&[experts, H, batch])
        ),
        format!(
            "out: {} = torch.ops.aten.bmm.default(et, p)",
            ty(&[experts, H, H])
        ),
    ]);
    common::hand::graph_module(&params, &body)
}

fn run(attack: Attack) -> Ran {
    let x_shards = if attack == Attack::TokensReplicatedOnEp {
        N
    } else {
        N * N
    };
    let experts = if attack == Attack::SummedOverEpToo {
        1
    } else {
        N
    };
    let batch = x_shards * K * L;
    let x = match attack {
        Attack::TokensReplicatedOnEp => "{ dp: Shard(0) }",
        _ => "{ dp: Shard(0), ep: Shard(0) }",
    };
    let (w, out) = match attack {
        Attack::SummedOverEpToo => ("{ }", "{ dp: Partial(sum), ep: Partial(sum) }"),
        _ => ("{ ep: Shard(0) }", "{ dp: Partial(sum), ep: Shard(0) }"),
    };
    let case = load_written(
        &spec_graph(batch, experts),
        &vec![rank_graph(); N * N],
        &Declared {
            name: "gathered-sums",
            mesh: &[("dp", N), ("ep", N)],
            groups: &dp_and_ep_groups(),
            inputs: &[("x", x.to_string()), ("w", w.to_string())],
            outputs: &[("out", out.to_string())],
        },
    );
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let xs = random(&[batch, H], &mut rng);
    let ws = random(&[experts, H, H], &mut rng);
    let want = spec_out(&case, &x_and_w(xs.clone(), ws.clone()));
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..N * N)
        .map(|q| {
            let (d, e) = (q / N, q % N);
            let s = if x_shards == N { d } else { d * N + e };
            let we = if experts == 1 { 0 } else { e };
            x_and_w(block(&xs, &[K * L, H], s), block(&ws, &[1, H, H], we))
        })
        .collect();
    let outs = rank_outs(&case, &per_rank).expect("the ranks run");
    // Summed over dp; expert blocks side by side over ep (or summed where declared a sum).
    let mut got = vec![0.0; experts * H * H];
    for (q, o) in outs.iter().enumerate() {
        let e = q % N;
        let o = o.as_ref().unwrap();
        let off = if experts == 1 { 0 } else { e * H * H };
        got[off..off + H * H]
            .iter_mut()
            .zip(o.data.iter())
            .for_each(|(a, v)| *a += v);
    }
    Ran {
        verdict: report.verdict,
        right: want.is_some_and(|w| close(&got, &w)),
        report: report.render(),
    }
}

fn never_holds(attack: Attack) {
    let ran = run(attack);
    ran.assert_never_holds(&format!("{attack:?}"));
}

#[test]
fn the_experts_sums_over_rows_gathered_over_ep_hold() {
    run(Attack::None).assert_holds("None");
}

#[test]
fn tokens_gathered_twice_never_hold() {
    never_holds(Attack::TokensReplicatedOnEp);
}

#[test]
fn a_sum_over_ep_of_the_gathered_sums_never_holds() {
    never_holds(Attack::SummedOverEpToo);
}
