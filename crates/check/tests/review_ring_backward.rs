//! Review of the ring backward's key and value gradients (`Place::Accrued`,
//! `attention/key_grads.rs`) and of the ring's gradient duality (`duality.rs`: a message along
//! a non-pipeline mesh dim pairs with any backward message along that dim): planted bugs on the
//! zoo's llama plan on a ring of 4 (`cp=4`), where the forward's and the backward's ring
//! directions differ from a send's reverse. Each never holds, never claims a broken final recv
//! of the last layer's gradients as the owner's rows, and is a real bug (the interpreter's
//! value is wrong there, or the program does not run).
//!
//! - the keys' contribution of one step computed with the unscaled `dS` (the softmax scale
//!   left out), or scaled twice;
//! - every record sent the other way round the ring (to the previous rank, while the keys and
//!   values still travel to the next): each record meets other blocks than its own;
//! - no record ever sent: each rank keeps its contributions, every received record is a zero
//!   (the backward's only messages along cp are the keys' and values' second trip round the
//!   ring, which the duality now pairs with the forward's);
//! - only the keys' records dropped, the values' still sent.

use shardproof_check::Verdict;

mod common;
use common::ring_backward::{claims_hold, run_edited, Ran};

/// The ring's size in every test here.
const CP: usize = 4;

/// The tags of the records' messages (the last layer's backward, then the first layer's):
/// even tags the keys' records, odd tags the values'.
const RECORD_TAGS: [u32; 16] = [
    40, 41, 46, 47, 52, 53, 58, 59, 10, 11, 16, 17, 22, 23, 28, 29,
];

/// The tags of the keys' and values' second trip round the ring in the backward.
const SECOND_TRIP_TAGS: [u32; 12] = [38, 39, 44, 45, 50, 51, 8, 9, 14, 15, 20, 21];

/// A p2p line's (peer, tag) where it is a send or recv on `cp`: `(is_send, peer, tag)`.
fn p2p(line: &str) -> Option<(bool, usize, u32)> {
    let is_send = line.contains("shardproof_p2p.send.default(");
    if !is_send && !line.contains("shardproof_p2p.recv.default(") {
        return None;
    }
    let args = line.rsplit_once("'cp')")?.0;
    let mut tail = args.trim_end_matches([',', ' ']).rsplit(", ");
    let tag = tail.next()?.parse().ok()?;
    let peer = tail.next()?.parse().ok()?;
    Some((is_send, peer, tag))
}

/// Replaces a p2p line's peer.
fn with_peer(line: &str, peer: usize, new: usize, tag: u32) -> String {
    line.replacen(
        &format!(", {peer}, {tag}, 'cp')"),
        &format!(", {new}, {tag}, 'cp')"),
        1,
    )
}

/// One message line of a rank's graph.
struct Msg<'a> {
    line: &'a str,
    rank: usize,
    is_send: bool,
    peer: usize,
    tag: u32,
}

/// A rank's graph with `f` applied to each line of a message with a tag of `tags` (each a send
/// and a recv on every rank); `None` from `f` deletes the line.
fn edit_messages(
    text: &str,
    rank: usize,
    tags: &[u32],
    f: &dyn Fn(&Msg) -> Option<String>,
) -> String {
    let mut seen = 0;
    let out: Vec<String> = text
        .lines()
        .filter_map(|line| match p2p(line) {
            Some((is_send, peer, tag)) if tags.contains(&tag) => {
                seen += 1;
                f(&Msg {
                    line,
                    rank,
                    is_send,
                    peer,
                    tag,
                })
            }
            _ => Some(line.to_string()),
        })
        .collect();
    assert_eq!(seen, 2 * tags.len(), "rank {rank}: messages");
    out.join("\n") + "\n"
}

/// A message dropped: the send deleted, the recv a zero of its shape.
fn dropped(m: &Msg) -> Option<String> {
    if m.is_send {
        return None;
    }
    let (name, _) = m.line.split_once(" = ")?;
    Some(format!(
        "{name} = torch.ops.aten.full.default([2, 2, 2, 4], 0.0, dtype = torch.float32, device = device(type='cpu'), pin_memory = False)"
    ))
}

/// One exact replacement in rank `rank`'s graph.
fn replace_once(text: &str, old: &str, new: &str) -> String {
    assert_eq!(text.matches(old).count(), 1, "`{old}`");
    text.replacen(old, new, 1)
}

/// The final recvs (rank, 0 keys / 1 values) the bug breaks: never claimed, and not right
/// where the program runs; the verdict is never `Holds`, and every claim left is right.
fn assert_safe(name: &str, ran: &Ran, broken: &[(usize, usize)]) {
    assert_ne!(ran.verdict, Verdict::Holds, "{name}: {}", ran.render);
    for &(r, j) in broken {
        assert!(
            !ran.claimed[r][j],
            "{name}: rank {r} final recv {j} claimed"
        );
        if let Some(right) = &ran.right {
            assert!(!right[r][j], "{name}: rank {r} final recv {j} is right");
        }
    }
    claims_hold(ran).unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn every_final_recv() -> Vec<(usize, usize)> {
    (0..CP).flat_map(|r| [(r, 0), (r, 1)]).collect()
}

#[test]
fn the_unedited_ring_of_four_holds() {
    let ran = run_edited(CP, &|_, t| t.to_string(), 5);
    assert_eq!(ran.verdict, Verdict::Holds, "{}", ran.render);
    assert_eq!(ran.claimed, vec![[true; 2]; CP]);
    assert_eq!(ran.right, Some(vec![[true; 2]; CP]));
}

/// Rank 0's step-1 keys' contribution (to rank 3's block, which reaches its owner after
/// ranks 1 and 2) multiplies the unscaled `dS` (`mul_60`, before the 0.5 of the scores).
#[test]
fn a_keys_contribution_without_the_softmax_scale_is_not_read() {
    let edit = |r: usize, t: &str| match r {
        0 => replace_once(
            t,
            "torch.ops.aten.transpose.int(mul_61, 1, 2)",
            "torch.ops.aten.transpose.int(mul_60, 1, 2)",
        ),
        _ => t.to_string(),
    };
    let ran = run_edited(CP, &edit, 6);
    assert_safe("unscaled-ds", &ran, &[(3, 0)]);
}

/// The same contribution scaled twice.
#[test]
fn a_keys_contribution_scaled_twice_is_not_read() {
    let edit = |r: usize, t: &str| {
        match r {
        0 => replace_once(
            t,
            "transpose_24: \"f32[8, 2, 1]\" = torch.ops.aten.transpose.int(mul_61, 1, 2)",
            "twice: \"f32[8, 1, 2]\" = torch.ops.aten.mul.Scalar(mul_61, 0.5)\n        transpose_24: \"f32[8, 2, 1]\" = torch.ops.aten.transpose.int(twice, 1, 2)",
        ),
        _ => t.to_string(),
    }
    };
    let ran = run_edited(CP, &edit, 7);
    assert_safe("ds-scaled-twice", &ran, &[(3, 0)]);
}

/// Every record goes to the previous rank (and is received from the next), the keys and
/// values still to the next: the ring's gradients travel against its blocks.
#[test]
fn records_sent_the_other_way_round_are_not_read() {
    let edit = |rank: usize, t: &str| {
        edit_messages(t, rank, &RECORD_TAGS, &|m| {
            let new = if m.is_send {
                (m.rank + CP - 1) % CP
            } else {
                (m.rank + 1) % CP
            };
            Some(with_peer(m.line, m.peer, new, m.tag))
        })
    };
    let ran = run_edited(CP, &edit, 8);
    assert_safe("records-reversed", &ran, &every_final_recv());
}

/// No record is ever sent: each received record is a zero, so each owner's final "recv" is
/// a zero and every other rank's contribution is lost. The backward's messages along cp are
/// the keys' and values' second trip only.
#[test]
fn records_never_sent_are_not_read() {
    let edit = |rank: usize, t: &str| edit_messages(t, rank, &RECORD_TAGS, &dropped);
    let ran = run_edited(CP, &edit, 9);
    assert_safe("records-never-sent", &ran, &every_final_recv());
}

/// Only the keys' records are dropped; the values' go round as in the zoo (and stay read).
#[test]
fn the_keys_records_never_sent_are_not_read() {
    let keys: Vec<u32> = RECORD_TAGS.iter().copied().filter(|t| t % 2 == 0).collect();
    let edit = |rank: usize, t: &str| edit_messages(t, rank, &keys, &dropped);
    let ran = run_edited(CP, &edit, 10);
    let keys_recvs: Vec<(usize, usize)> = (0..CP).map(|r| (r, 0)).collect();
    assert_safe("keys-records-never-sent", &ran, &keys_recvs);
    assert_eq!(
        ran.claimed.iter().map(|c| c[1]).collect::<Vec<_>>(),
        vec![true; CP],
        "the values' gradients are still read"
    );
}

/// The ring's duality pairs a forward message with any backward message along cp, but each
/// backward message once: a backward with no message along cp (every record and the keys'
/// and values' second trip dropped) leaves the forward's unanswered.
#[test]
fn a_backward_without_messages_along_cp_is_a_duality_finding() {
    let all: Vec<u32> = RECORD_TAGS
        .iter()
        .chain(&SECOND_TRIP_TAGS)
        .copied()
        .collect();
    let edit = |rank: usize, t: &str| edit_messages(t, rank, &all, &dropped);
    let ran = run_edited(CP, &edit, 11);
    assert_safe("no-backward-messages", &ran, &every_final_recv());
    assert_eq!(ran.verdict, Verdict::Violated, "{}", ran.render);
    assert!(ran.render.contains("gradient-duality"), "{}", ran.render);
}

/// Fewer backward messages along cp than forward recvs: only the first step's records (each
/// rank's own contributions) are sent, the keys' and values' second trip and every later
/// record dropped. Four backward messages per layer answer six forward recvs.
#[test]
fn a_backward_with_fewer_messages_along_cp_is_a_duality_finding() {
    let later = [46, 47, 52, 53, 58, 59, 16, 17, 22, 23, 28, 29];
    let tags: Vec<u32> = later.iter().chain(&SECOND_TRIP_TAGS).copied().collect();
    let edit = |rank: usize, t: &str| edit_messages(t, rank, &tags, &dropped);
    let ran = run_edited(CP, &edit, 12);
    assert_safe("fewer-backward-messages", &ran, &every_final_recv());
    assert_eq!(ran.verdict, Verdict::Violated, "{}", ran.render);
    assert!(ran.render.contains("gradient-duality"), "{}", ran.render);
}

/// Every record dropped, the keys' and values' second trip kept: a duality finding. The
/// second trip's recvs take no operand (never backward calls), and its first sends carry the
/// rank's own keys and values, forward values that answer no forward message; only the
/// relayed blocks' sends count, fewer than the forward's recvs. Fails without
/// `carries_activation` (the second trip's sends then answer every forward recv).
#[test]
fn records_dropped_beside_the_second_trip_are_a_duality_finding() {
    let edit = |rank: usize, t: &str| edit_messages(t, rank, &RECORD_TAGS, &dropped);
    let ran = run_edited(CP, &edit, 13);
    assert_safe(
        "records-dropped-second-trip-kept",
        &ran,
        &every_final_recv(),
    );
    assert!(ran.render.contains("gradient-duality"), "{}", ran.render);
}

/// The later steps' records dropped, the first step's records and the second trip kept: a
/// duality finding. Every second-trip send relays a block the forward received or the
/// rank's own (forward values), so none answers a forward recv; the first step's records
/// answer two of each layer's six. (Review 2 took the second trip for a hole that could hide
/// this; it does not, here.)
#[test]
fn later_records_dropped_beside_the_second_trip_are_a_duality_finding() {
    let later = [46, 47, 52, 53, 58, 59, 16, 17, 22, 23, 28, 29];
    let edit = |rank: usize, t: &str| edit_messages(t, rank, &later, &dropped);
    let ran = run_edited(CP, &edit, 14);
    assert_safe("later-records-dropped", &ran, &every_final_recv());
    assert!(ran.render.contains("gradient-duality"), "{}", ran.render);
}
