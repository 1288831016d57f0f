//! Context parallelism (a `cp` mesh dim): the sequence split over the cp ranks in
//! load-balanced causal chunks, attention computed by ring attention.
//!
//! The layout is Megatron's: the sequence is cut into `2 * cp` chunks of `c = seq / (2 * cp)`
//! tokens and cp rank `i` holds chunks `i` and `2 * cp - 1 - i`, in that order, so that every
//! rank does the same causal work. Each rank reads the whole batch of its dp rank and selects
//! its chunks itself (`slice` + `cat`, as `get_batch_on_this_cp_rank` does).
//!
//! Everything outside attention is per token. Attention is a ring: at step `t` a rank holds the
//! keys and values of cp rank `j = (i - t) mod cp` (its own at step 0; each step it sends the
//! block it holds to cp rank `i + 1` and receives the next from `i - 1` with
//! `shardproof_p2p.send` / `recv`), attends its queries to that block, and merges the partial
//! result into its running output by the log-sum-exp rule. Which parts of a block are visible
//! follows from the chunk layout (Megatron's `AttnFuncWithCPAndKVP2P`):
//!
//! - step 0 (`j = i`): every query against every key, with the causal mask of the tokens'
//!   global positions;
//! - `j < i`: chunk `j` lies before both of the rank's chunks and chunk `2 * cp - 1 - j` after
//!   both: every query against the first half of the block, no mask;
//! - `j > i`: both chunks of the block lie after chunk `i` and before chunk `2 * cp - 1 - i`:
//!   the second half of the queries against the whole block, no mask.
//!
//! No block is entirely masked for a row it computes, so every partial log-sum-exp is finite.
//! The backward is flash attention's, block by block with the final output and log-sum-exp:
//! `P = exp(S - lse)`, `dV = P^T dO`, `dS = P * (dO V^T - rowsum(dO * O))`, `dQ = dS K`,
//! `dK = dS^T Q` (times the softmax scale). The blocks go around the ring again, each with the
//! gradient of its keys and values accumulated so far; after `cp` steps the accumulated
//! gradient of every block reaches its owner by one more send.

use crate::bugs::Mutation;
use crate::graph::{Arg, GraphBuilder, Val};
use crate::llama::{repeat_kv, repeat_kv_backward};

/// The process group of the cp mesh dim (the zoo declares one group per mesh dim, named after
/// it): the ring's sends and recvs name their peers by index in it.
const CP_GROUP: &str = "cp";

/// Where a rank sits on the cp mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpPlan {
    /// Size of the cp mesh dim (1: no context parallelism).
    pub cp: usize,
    /// The rank's index along cp, which is also its index in its `cp` process group: the ring's
    /// sends and recvs name their peers by that index (`group = 'cp'`), so a rank's graph does
    /// not depend on its coordinates along the other mesh dims.
    pub cp_rank: usize,
}

impl CpPlan {
    /// No context parallelism.
    pub const NONE: CpPlan = CpPlan { cp: 1, cp_rank: 0 };

    /// Whether the sequence is split (cp >= 2).
    pub fn is_ring(&self) -> bool {
        self.cp > 1
    }

    /// The two chunks (of `2 * cp`) the rank holds, in the order it holds them.
    pub fn chunks(&self) -> [usize; 2] {
        [self.cp_rank, 2 * self.cp - 1 - self.cp_rank]
    }

    /// The next rank of the ring: cp index `i + 1`, the peer's index in the rank's `cp` group
    /// (what a send or recv with `group = 'cp'` names).
    fn next(&self) -> usize {
        (self.cp_rank + 1) % self.cp
    }

    /// The previous rank of the ring (cp index `i - 1`).
    fn prev(&self) -> usize {
        (self.cp_rank + self.cp - 1) % self.cp
    }

    /// The cp index whose keys and values the rank holds at ring step `t`.
    fn source(&self, t: usize) -> usize {
        (self.cp_rank + self.cp - t % self.cp) % self.cp
    }

    /// The queries and keys a ring step computes (see the module documentation).
    fn parts(&self, t: usize) -> (Part, Part) {
        if t == 0 {
            (Part::All, Part::All)
        } else if self.source(t) < self.cp_rank {
            (Part::All, Part::Lo)
        } else {
            (Part::Hi, Part::All)
        }
    }
}

/// A part of the rank's local sequence: both chunks, or the first or second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    All,
    Lo,
    Hi,
}

/// `part` of `x` along `dim`, whose length is two chunks of `c`.
fn part_of(g: &mut GraphBuilder, x: &Val, dim: usize, part: Part) -> Val {
    let c = x.shape[dim] / 2;
    match part {
        Part::All => x.clone(),
        Part::Lo => g.slice(x, dim, 0, c),
        Part::Hi => g.slice(x, dim, c, 2 * c),
    }
}

/// `x` (two chunks along `dim`) with `y` added to `part` of it.
fn add_to_part(g: &mut GraphBuilder, x: &Val, y: &Val, dim: usize, part: Part) -> Val {
    let c = x.shape[dim] / 2;
    match part {
        Part::All => g.add(x, y),
        Part::Lo => {
            let lo = g.slice(x, dim, 0, c);
            let hi = g.slice(x, dim, c, 2 * c);
            let sum = g.add(&lo, y);
            g.cat(&[&sum, &hi], dim)
        }
        Part::Hi => {
            let lo = g.slice(x, dim, 0, c);
            let hi = g.slice(x, dim, c, 2 * c);
            let sum = g.add(&hi, y);
            g.cat(&[&lo, &sum], dim)
        }
    }
}

/// The rank's chunks of the sequence (dim 1) of a batch-major input `x` `[b, seq]` (of any
/// dtype): chunks `i` and `2 * cp - 1 - i`, concatenated (Megatron's
/// `get_batch_on_this_cp_rank`). `x` itself without context parallelism.
pub(crate) fn select_chunks(g: &mut GraphBuilder, x: &Val, cp: &CpPlan) -> Val {
    if !cp.is_ring() {
        return x.clone();
    }
    let c = x.shape[1] / (2 * cp.cp);
    let [a, b] = cp.chunks();
    let lo = g.slice(x, 1, a * c, (a + 1) * c);
    let hi = g.slice(x, 1, b * c, (b + 1) * c);
    let mut shape = x.shape.clone();
    shape[1] = 2 * c;
    g.call_typed(
        "cat",
        "aten.cat.default",
        &[Arg::Vals(vec![&lo, &hi]), Arg::I(1)],
        x.dtype,
        shape,
    )
}

/// `aten.arange.start(start, end)`: the i64 vector `start, ..., end - 1`.
fn arange_from(g: &mut GraphBuilder, start: usize, end: usize) -> Val {
    g.call_typed(
        "arange",
        "aten.arange.start",
        &[
            Arg::I(start as i64),
            Arg::I(end as i64),
            Arg::Raw("device = device(type='cpu')"),
            Arg::Raw("pin_memory = False"),
        ],
        "i64",
        vec![end - start],
    )
}

/// The global positions `[s]` (i64) of the rank's `s` tokens: the positions of its two chunks.
pub(crate) fn positions(g: &mut GraphBuilder, s: usize, cp: &CpPlan) -> Val {
    let c = s / 2;
    let [a, b] = cp.chunks();
    let lo = arange_from(g, a * c, (a + 1) * c);
    let hi = arange_from(g, b * c, (b + 1) * c);
    g.call_typed(
        "cat",
        "aten.cat.default",
        &[Arg::Vals(vec![&lo, &hi]), Arg::I(0)],
        "i64",
        vec![s],
    )
}

/// The additive masks of the ring steps.
pub(crate) struct RingMasks {
    /// Step 0 `[s, s]`: -inf where the key's global position follows the query's.
    diag: Val,
    /// Under the planted `cp-causal-mask-local`: the causal masks of the local indices of the
    /// other steps' blocks, `[s, s/2]` (every query, the first half of the keys) and
    /// `[s/2, s]` (the second half of the queries, every key).
    local: Option<(Val, Val)>,
}

/// `triu` of a `-inf` matrix `[rows, cols]`: -inf where the column index exceeds the row index
/// (the causal mask of local indices, as `is_causal=True` builds it).
fn local_causal_mask(g: &mut GraphBuilder, rows: usize, cols: usize) -> Val {
    let full = g.full(&[rows, cols], f64::NEG_INFINITY);
    g.call(
        "triu",
        "aten.triu.default",
        &[Arg::V(&full), Arg::I(1)],
        vec![rows, cols],
    )
}

/// The masks of the ring steps of a rank holding `s` tokens at global positions `pos`. The
/// planted `cp-causal-mask-local` builds every step's mask from the block-local indices.
pub(crate) fn ring_masks(g: &mut GraphBuilder, pos: &Val, bug: Option<Mutation>) -> RingMasks {
    let s = pos.shape[0];
    if bug == Some(Mutation::CpCausalMaskLocal) {
        let diag = local_causal_mask(g, s, s);
        let lo = local_causal_mask(g, s, s / 2);
        let hi = local_causal_mask(g, s / 2, s);
        return RingMasks {
            diag,
            local: Some((lo, hi)),
        };
    }
    // future[q, k] = pos[k] > pos[q].
    let keys = g.unsqueeze(pos, 0);
    let queries = g.unsqueeze(pos, 1);
    let future = g.call_typed(
        "gt",
        "aten.gt.Tensor",
        &[Arg::V(&keys), Arg::V(&queries)],
        "b8",
        vec![s, s],
    );
    let zeros = g.full(&[s, s], 0.0);
    let diag = g.call(
        "masked_fill",
        "aten.masked_fill.Scalar",
        &[Arg::V(&zeros), Arg::V(&future), Arg::F(f64::NEG_INFINITY)],
        vec![s, s],
    );
    RingMasks { diag, local: None }
}

impl RingMasks {
    /// The mask of step 0 (the rank's own block).
    pub(crate) fn diag(&self) -> &Val {
        &self.diag
    }

    /// The mask of ring step `t` (none where every computed key is visible).
    fn at(&self, t: usize, keys: Part) -> Option<&Val> {
        match (t, &self.local) {
            (0, _) => Some(&self.diag),
            (_, Some((lo, _))) if keys == Part::Lo => Some(lo),
            (_, Some((_, hi))) => Some(hi),
            (_, None) => None,
        }
    }
}

/// What the backward of ring attention reads from its forward.
pub(crate) struct RingSaved {
    /// Queries `[b * heads, s, head_dim]`.
    q3: Val,
    /// The rank's own keys (after RoPE) and values, `[b, kv heads, s, head_dim]`.
    k: Val,
    v: Val,
    /// The attention output `[b * heads, s, head_dim]` and its log-sum-exp `[b * heads, s, 1]`.
    out: Val,
    lse: Val,
    scale: f64,
}

/// The shape of one ring attention: the rank's sequences and the query heads per kv head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingShape {
    /// The rank's sequences.
    pub(crate) b: usize,
    /// Query heads per kv head.
    pub(crate) n_rep: usize,
    /// The decoder layer (the tags of its messages).
    pub(crate) layer: usize,
}

/// The tag of a ring message of layer `l` received at step `t` (1..=cp): `kind` 0/1 the
/// forward's keys/values, 2/3 the backward's keys/values, 4/5 the gradients of keys/values.
fn tag(cp: &CpPlan, l: usize, t: usize, kind: usize) -> usize {
    (l * (cp.cp + 1) + t) * 6 + kind
}

/// The scaled (and masked) scores of queries `q` `[b * heads, nq, hd]` against keys `k`
/// `[b, kv heads, nk, hd]`, and the keys repeated to every query head `[b * heads, nk, hd]`.
fn block_scores(
    g: &mut GraphBuilder,
    q: &Val,
    k: &Val,
    mask: Option<&Val>,
    scale: f64,
    sh: RingShape,
) -> (Val, Val) {
    let (bh, hd, nk) = (q.shape[0], q.shape[2], k.shape[2]);
    let krep = repeat_kv(g, k, sh.n_rep);
    let kt = g.transpose(&krep, 2, 3);
    let ktc = g.contiguous(&kt);
    let kt3 = g.view(&ktc, &[bh, hd, nk]);
    let raw = g.bmm(q, &kt3);
    let scaled = g.mul_scalar("mul", &raw, Arg::F(scale));
    let scores = match mask {
        Some(m) => g.add(&scaled, m),
        None => scaled,
    };
    let k3 = g.view(&krep, &[bh, nk, hd]);
    (scores, k3)
}

/// Values `[b, kv heads, nk, hd]` repeated to every query head, `[b * heads, nk, hd]`.
fn block_values(g: &mut GraphBuilder, v: &Val, bh: usize, n_rep: usize) -> Val {
    let (nk, hd) = (v.shape[2], v.shape[3]);
    let vrep = repeat_kv(g, v, n_rep);
    g.view(&vrep, &[bh, nk, hd])
}

/// Merges the partial attention `(o, l)` of some rows into the running `(out, lse)` of the
/// same rows: `lse' = log(exp(lse) + exp(l))` (computed from their maximum) and
/// `out' = out * exp(lse - lse') + o * exp(l - lse')`.
fn merge_rows(g: &mut GraphBuilder, out: &Val, lse: &Val, o: &Val, l: &Val) -> (Val, Val) {
    let m = g.binary("maximum", "aten.maximum.default", lse, l);
    let d_old = g.sub("sub", lse, &m);
    let d_new = g.sub("sub", l, &m);
    let e_old = g.unary("exp", "aten.exp.default", &d_old);
    let e_new = g.unary("exp", "aten.exp.default", &d_new);
    let total = g.add(&e_old, &e_new);
    let log_total = g.unary("log", "aten.log.default", &total);
    let lse_new = g.add(&m, &log_total);
    let w_old = g.binary("div", "aten.div.Tensor", &e_old, &total);
    let w_new = g.binary("div", "aten.div.Tensor", &e_new, &total);
    let a = g.mul(out, &w_old);
    let b = g.mul(o, &w_new);
    (g.add(&a, &b), lse_new)
}

/// Ring attention of the rank's queries `q3` `[b * heads, s, hd]` against the keys `k` and
/// values `v` `[b, kv heads, s, hd]` of every cp rank: the output `[b * heads, s, hd]` and what
/// the backward reads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ring_attention(
    g: &mut GraphBuilder,
    q3: &Val,
    k: &Val,
    v: &Val,
    masks: &RingMasks,
    scale: f64,
    sh: RingShape,
    cp: &CpPlan,
) -> (Val, RingSaved) {
    let bh = q3.shape[0];
    let l = sh.layer;
    let mut acc: Option<(Val, Val)> = None;
    let (mut kc, mut vc) = (k.clone(), v.clone());
    for t in 0..cp.cp {
        if t > 0 {
            kc = g.recv(&k.shape, cp.prev(), tag(cp, l, t, 0), CP_GROUP);
            vc = g.recv(&v.shape, cp.prev(), tag(cp, l, t, 1), CP_GROUP);
        }
        if t + 1 < cp.cp {
            g.send(&kc, cp.next(), tag(cp, l, t + 1, 0), CP_GROUP);
            g.send(&vc, cp.next(), tag(cp, l, t + 1, 1), CP_GROUP);
        }
        let (rows, keys) = cp.parts(t);
        let q = part_of(g, q3, 1, rows);
        let kb = part_of(g, &kc, 2, keys);
        let vb = part_of(g, &vc, 2, keys);
        let (scores, _) = block_scores(g, &q, &kb, masks.at(t, keys), scale, sh);
        let lse = g.call(
            "logsumexp",
            "aten.logsumexp.default",
            &[Arg::V(&scores), Arg::Ints(vec![-1]), Arg::B(true)],
            vec![bh, q.shape[1], 1],
        );
        let shifted = g.sub("sub", &scores, &lse);
        let p = g.unary("exp", "aten.exp.default", &shifted);
        let v3 = block_values(g, &vb, bh, sh.n_rep);
        let o = g.bmm(&p, &v3);
        acc = Some(match acc {
            None => (o, lse),
            Some((out, run)) if rows == Part::All => merge_rows(g, &out, &run, &o, &lse),
            Some((out, run)) => {
                let out_lo = part_of(g, &out, 1, Part::Lo);
                let out_hi = part_of(g, &out, 1, Part::Hi);
                let run_lo = part_of(g, &run, 1, Part::Lo);
                let run_hi = part_of(g, &run, 1, Part::Hi);
                let (o_hi, l_hi) = merge_rows(g, &out_hi, &run_hi, &o, &lse);
                (g.cat(&[&out_lo, &o_hi], 1), g.cat(&[&run_lo, &l_hi], 1))
            }
        });
    }
    let (out, lse) = acc.expect("at least one ring step");
    let saved = RingSaved {
        q3: q3.clone(),
        k: k.clone(),
        v: v.clone(),
        out: out.clone(),
        lse,
        scale,
    };
    (out, saved)
}

/// The backward of [`ring_attention`] for the gradient `g_o3` `[b * heads, s, hd]` of its
/// output: the gradients of the queries `[b * heads, s, hd]` and of the rank's own keys and
/// values `[b, kv heads, s, hd]` (summed over the query heads that read them and over the cp
/// ranks whose queries attended to them).
pub(crate) fn ring_attention_backward(
    g: &mut GraphBuilder,
    g_o3: &Val,
    sv: &RingSaved,
    masks: &RingMasks,
    sh: RingShape,
    cp: &CpPlan,
) -> (Val, Val, Val) {
    let (bh, hd) = (sv.q3.shape[0], sv.q3.shape[2]);
    let (b, nh) = (sh.b, bh / sh.b);
    let l = sh.layer;
    let go_o = g.mul(g_o3, &sv.out);
    let delta = g.sum_dims(&go_o, &[2], true);
    let mut dq: Option<Val> = None;
    let (mut kc, mut vc) = (sv.k.clone(), sv.v.clone());
    let mut dkv_in: Option<(Val, Val)> = None;
    for t in 0..cp.cp {
        if t > 0 {
            kc = g.recv(&sv.k.shape, cp.prev(), tag(cp, l, t, 2), CP_GROUP);
            vc = g.recv(&sv.v.shape, cp.prev(), tag(cp, l, t, 3), CP_GROUP);
            let dk = g.recv(&sv.k.shape, cp.prev(), tag(cp, l, t, 4), CP_GROUP);
            let dv = g.recv(&sv.v.shape, cp.prev(), tag(cp, l, t, 5), CP_GROUP);
            dkv_in = Some((dk, dv));
        }
        if t + 1 < cp.cp {
            g.send(&kc, cp.next(), tag(cp, l, t + 1, 2), CP_GROUP);
            g.send(&vc, cp.next(), tag(cp, l, t + 1, 3), CP_GROUP);
        }
        let (rows, keys) = cp.parts(t);
        let q = part_of(g, &sv.q3, 1, rows);
        let kb = part_of(g, &kc, 2, keys);
        let vb = part_of(g, &vc, 2, keys);
        let nk = kb.shape[2];
        let (scores, k3) = block_scores(g, &q, &kb, masks.at(t, keys), sv.scale, sh);
        // The block's probabilities under the final normalization.
        let lse = part_of(g, &sv.lse, 1, rows);
        let shifted = g.sub("sub", &scores, &lse);
        let p = g.unary("exp", "aten.exp.default", &shifted);
        let go = part_of(g, g_o3, 1, rows);
        let dl = part_of(g, &delta, 1, rows);
        let v3 = block_values(g, &vb, bh, sh.n_rep);
        let pt = g.transpose(&p, 1, 2);
        let dv3 = g.bmm(&pt, &go);
        let v3t = g.transpose(&v3, 1, 2);
        let dp = g.bmm(&go, &v3t);
        let centered = g.sub("sub", &dp, &dl);
        let ds = g.mul(&p, &centered);
        let ds = g.mul_scalar("mul", &ds, Arg::F(sv.scale));
        let dq_part = g.bmm(&ds, &k3);
        let dst = g.transpose(&ds, 1, 2);
        let dk3 = g.bmm(&dst, &q);
        let dk4 = g.view(&dk3, &[b, nh, nk, hd]);
        let dv4 = g.view(&dv3, &[b, nh, nk, hd]);
        let dk = repeat_kv_backward(g, &dk4, sh.n_rep);
        let dv = repeat_kv_backward(g, &dv4, sh.n_rep);
        dq = Some(match dq {
            None => dq_part,
            Some(acc) => add_to_part(g, &acc, &dq_part, 1, rows),
        });
        let (dk_out, dv_out) = match dkv_in.take() {
            None => (dk, dv),
            Some((dk_in, dv_in)) => (
                add_to_part(g, &dk_in, &dk, 2, keys),
                add_to_part(g, &dv_in, &dv, 2, keys),
            ),
        };
        // On to the next rank; after the last step, back to the block's owner.
        g.send(&dk_out, cp.next(), tag(cp, l, t + 1, 4), CP_GROUP);
        g.send(&dv_out, cp.next(), tag(cp, l, t + 1, 5), CP_GROUP);
    }
    let dk = g.recv(&sv.k.shape, cp.prev(), tag(cp, l, cp.cp, 4), CP_GROUP);
    let dv = g.recv(&sv.v.shape, cp.prev(), tag(cp, l, cp.cp, 5), CP_GROUP);
    (dq.expect("at least one ring step"), dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_peers_and_parts() {
        let p = |cp_rank| CpPlan { cp: 4, cp_rank };
        assert_eq!(p(0).chunks(), [0, 7]);
        assert_eq!(p(3).chunks(), [3, 4]);
        assert_eq!((p(0).next(), p(0).prev()), (1, 3));
        assert_eq!((p(3).next(), p(3).prev()), (0, 2));
        assert_eq!(p(1).source(1), 0);
        assert_eq!(p(1).source(2), 3);
        assert_eq!(p(1).parts(0), (Part::All, Part::All));
        assert_eq!(p(1).parts(1), (Part::All, Part::Lo));
        assert_eq!(p(1).parts(2), (Part::Hi, Part::All));
    }

    /// Every (query chunk, key chunk) pair a ring step computes is visible or on the diagonal,
    /// and every visible pair is computed exactly once over the ring.
    #[test]
    fn the_steps_cover_exactly_the_causal_pairs() {
        for cp in 2..=5 {
            let mut seen = vec![vec![0; 2 * cp]; 2 * cp];
            for i in 0..cp {
                let plan = CpPlan { cp, cp_rank: i };
                for t in 0..cp {
                    let j = plan.source(t);
                    let holder = CpPlan { cp_rank: j, ..plan };
                    let (rows, keys) = plan.parts(t);
                    let pick = |part: Part, chunks: [usize; 2]| match part {
                        Part::All => chunks.to_vec(),
                        Part::Lo => vec![chunks[0]],
                        Part::Hi => vec![chunks[1]],
                    };
                    for qc in pick(rows, plan.chunks()) {
                        for kc in pick(keys, holder.chunks()) {
                            if t > 0 {
                                assert!(kc < qc, "cp {cp} rank {i} step {t}: {qc} vs {kc}");
                            }
                            seen[qc][kc] += 1;
                        }
                    }
                }
            }
            for (qc, row) in seen.iter().enumerate() {
                for (kc, &n) in row.iter().enumerate() {
                    // Step 0 also computes the masked pair (first chunk, second chunk).
                    let expected = usize::from(kc <= qc || (kc / cp == 1 && 2 * cp - 1 - kc == qc));
                    assert_eq!(n, expected, "cp {cp}: chunk {qc} x {kc}");
                }
            }
        }
    }
}
