//! Rings of sends and recvs (`Place::Rolled`, `Place::Permuted`): the seed's ring attention
//! holds, and wrong rings are never a pass: a ring that skips a chunk, values in another
//! order than the keys, a chunk of the wrong tensor, a chunk from the wrong peer, a softmax
//! over the queries, the permuted keys declared a shard or replicated.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("ring.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// Ring attention on `cp=4`: each step forwards the chunk received last; `keys` and
/// `values` concatenate the chunks in the given orders (`k`, `k1`, `k2`, `k3`: the own chunk
/// and those of the coordinates 1, 2, 3 behind).
fn ring4(keys: &str, values: &str, tail: &str) -> String {
    format!(
        "mesh cp=4\n\
         input q: f32[16, 8] cp=Shard(0)\n\
         input k: f32[16, 8] cp=Shard(0)\n\
         input v: f32[16, 8] cp=Shard(0)\n\
         send(k, cp=+1, tag=0)\n\
         send(v, cp=+1, tag=1)\n\
         k1 = recv(f32[4, 8], cp=-1, tag=0)\n\
         v1 = recv(f32[4, 8], cp=-1, tag=1)\n\
         send(k1, cp=+1, tag=2)\n\
         send(v1, cp=+1, tag=3)\n\
         k2 = recv(f32[4, 8], cp=-1, tag=2)\n\
         v2 = recv(f32[4, 8], cp=-1, tag=3)\n\
         send(k2, cp=+1, tag=4)\n\
         send(v2, cp=+1, tag=5)\n\
         k3 = recv(f32[4, 8], cp=-1, tag=4)\n\
         v3 = recv(f32[4, 8], cp=-1, tag=5)\n\
         keys = cat([{keys}], 0)\n\
         values = cat([{values}], 0)\n\
         kt = t(keys)\n\
         s = mm(q, kt)\n\
         s2 = mul(s, 0.25)\n\
         {tail}"
    )
}

const ATTEND: &str = "p = softmax(s2, -1)\no = mm(p, values)\noutput o cp=Shard(0)\n";

#[test]
fn the_seed_ring_attention_holds() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plans/cp_ring_attn.plan"),
    )
    .unwrap();
    let r = check(&text);
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn a_ring_of_four_in_any_common_order_holds() {
    for (keys, values) in [
        ("k, k1, k2, k3", "v, v1, v2, v3"),
        ("k3, k, k2, k1", "v3, v, v2, v1"),
    ] {
        let r = check(&ring4(keys, values, ATTEND));
        assert_eq!(r.verdict, Verdict::Holds, "{keys}: {}", r.render());
    }
}

#[test]
fn a_ring_that_skips_a_chunk_is_never_a_pass() {
    // Three chunks of four: the softmax misses a quarter of the keys. The shapes change with
    // it, so the values skip the same chunk.
    let r = check(&ring4("k, k1, k2", "v, v1, v2", ATTEND));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

#[test]
fn values_in_another_order_than_the_keys_are_never_a_pass() {
    let r = check(&ring4("k, k1, k2, k3", "v, v2, v1, v3", ATTEND));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

#[test]
fn a_chunk_of_the_wrong_tensor_is_never_a_pass() {
    let r = check(&ring4("k, k1, k2, k3", "v, v1, k2, v3", ATTEND));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    // A chunk twice and another missing.
    let r = check(&ring4("k, k1, k1, k3", "v, v1, v1, v3", ATTEND));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

#[test]
fn a_chunk_from_the_wrong_peer_is_never_a_pass() {
    // The second step's values come from two coordinates back, so the values hold chunk 3
    // twice (positions 2 and 3) and no chunk 2.
    let text = "mesh cp=4\n\
         input q: f32[16, 8] cp=Shard(0)\n\
         input k: f32[16, 8] cp=Shard(0)\n\
         input v: f32[16, 8] cp=Shard(0)\n\
         send(k, cp=+1, tag=0)\n\
         send(v, cp=+1, tag=1)\n\
         k1 = recv(f32[4, 8], cp=-1, tag=0)\n\
         v1 = recv(f32[4, 8], cp=-1, tag=1)\n\
         send(k1, cp=+1, tag=2)\n\
         send(v1, cp=+2, tag=3)\n\
         k2 = recv(f32[4, 8], cp=-1, tag=2)\n\
         v2 = recv(f32[4, 8], cp=-2, tag=3)\n\
         send(k2, cp=+1, tag=4)\n\
         send(v1, cp=+2, tag=5)\n\
         k3 = recv(f32[4, 8], cp=-1, tag=4)\n\
         v3 = recv(f32[4, 8], cp=-2, tag=5)\n\
         keys = cat([k, k1, k2, k3], 0)\n\
         values = cat([v, v1, v2, v3], 0)\n\
         kt = t(keys)\n\
         s = mm(q, kt)\n\
         p = softmax(s, -1)\n\
         o = mm(p, values)\n\
         output o cp=Shard(0)\n";
    let r = check(text);
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

#[test]
fn a_softmax_over_the_queries_is_a_finding() {
    let r = check(&ring4(
        "k, k1, k2, k3",
        "v, v1, v2, v3",
        "p = softmax(s2, 0)\no = mm(p, values)\noutput o cp=Shard(0)\n",
    ));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
}

#[test]
fn the_permuted_keys_are_no_declared_layout() {
    // Declared a shard: not proven.
    let r = check(&ring4(
        "k, k1, k2, k3",
        "v, v1, v2, v3",
        "output keys cp=Shard(0)\n",
    ));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    // Declared replicated: the ranks hold the rows in different orders.
    let r = check(&ring4(
        "k, k1, k2, k3",
        "v, v1, v2, v3",
        "output keys cp=Replicate()\n",
    ));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    // A received chunk declared the rank's shard: it is the previous coordinate's.
    let r = check(&ring4(
        "k, k1, k2, k3",
        "v, v1, v2, v3",
        "output k1 cp=Shard(0)\n",
    ));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}
