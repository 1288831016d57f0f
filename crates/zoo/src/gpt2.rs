//! The `gpt2` model: a GPT-2 style decoder (token embedding plus learned position embedding;
//! per layer LayerNorm, multi-head causal attention with separate biased q/k/v projections,
//! biased output projection, residual, LayerNorm, MLP fc1 + GELU + fc2 with biases, residual;
//! final LayerNorm, LM head tied to the token embedding, cross-entropy loss), as a spec and as
//! DP / Megatron TP / Megatron SP / context-parallel ranks (CP: the rank's two load-balanced
//! chunks of the sequence, the position table read at their global positions, ring attention
//! from [`crate::cp`]), and in the pieces a pipeline stage composes ([`crate::pipeline`]: the
//! embeddings, a decoder layer, the final LayerNorm + tied LM head + loss, and their backwards).
//!
//! Activations are sequence-first (`[seq, batch, hidden]`, Megatron's layout), so sequence
//! parallelism splits and gathers dim 0 — what `all_gather_into_tensor` and
//! `reduce_scatter_tensor` concatenate and split. The graphs are written as AOTAutograd prints
//! them: LayerNorm as `native_layer_norm` and its backward, GELU (exact, erf form) as `gelu` and
//! `gelu_backward`, biased linears as `addmm` (a row-parallel linear as `mm`, the reduction,
//! then the bias added once).

use crate::bugs::Mutation;
use crate::cp::{self, CpPlan, RingSaved, RingShape};
use crate::graph::{Arg, GraphBuilder, Val};
use crate::llama::{
    attend, attention_scores_backward, causal_mask, check_at_least_one, check_divisible,
    check_tensor_sizes, cross_entropy, ScoresSaved,
};
use crate::train::{self, Step};
use crate::{Param, TpLayout};
use std::collections::{BTreeMap, BTreeSet};

/// The sizes of the GPT-2 model.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Model width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Inner width of the MLP (GPT-2 uses 4 x hidden).
    pub ffn: usize,
    /// Number of decoder layers.
    pub layers: usize,
    /// Sequence length (also the number of learned positions).
    pub seq: usize,
    /// Global batch size (sequences).
    pub batch: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// SGD learning rate of the full iteration.
    pub lr: f64,
    /// LayerNorm epsilon.
    pub eps: f64,
}

impl Default for Gpt2Config {
    /// The `tiny` size: runs in well under a second on a CPU.
    fn default() -> Self {
        Gpt2Config {
            hidden: 16,
            heads: 4,
            ffn: 64,
            layers: 2,
            seq: 8,
            batch: 2,
            vocab: 32,
            lr: 0.1,
            eps: 1e-5,
        }
    }
}

/// The largest element count of any tensor the zoo emits (see the llama model).
const MAX_ELEMENTS: usize = 1 << 40;

impl Gpt2Config {
    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// The parameters in graph order: token and position embeddings; per layer the first
    /// LayerNorm, q/k/v weights and biases (column parallel), the output projection (row
    /// parallel, its bias replicated), the second LayerNorm, fc1 (column parallel) and fc2 (row
    /// parallel, bias replicated); the final LayerNorm. The LM head is the token embedding.
    pub fn params(&self) -> Vec<Param> {
        let (h, f) = (self.hidden, self.ffn);
        let p = |name: String, shape: Vec<usize>, tp| Param { name, shape, tp };
        let rep = TpLayout::Replicate;
        let col = TpLayout::Shard(0);
        let mut out = vec![
            p("wte".into(), vec![self.vocab, h], rep),
            p("wpe".into(), vec![self.seq, h], rep),
        ];
        for l in 0..self.layers {
            out.extend([
                p(format!("ln1_w_{l}"), vec![h], rep),
                p(format!("ln1_b_{l}"), vec![h], rep),
                p(format!("wq_{l}"), vec![h, h], col),
                p(format!("bq_{l}"), vec![h], col),
                p(format!("wk_{l}"), vec![h, h], col),
                p(format!("bk_{l}"), vec![h], col),
                p(format!("wv_{l}"), vec![h, h], col),
                p(format!("bv_{l}"), vec![h], col),
                p(format!("wo_{l}"), vec![h, h], TpLayout::Shard(1)),
                p(format!("bo_{l}"), vec![h], rep),
                p(format!("ln2_w_{l}"), vec![h], rep),
                p(format!("ln2_b_{l}"), vec![h], rep),
                p(format!("fc1_w_{l}"), vec![f, h], col),
                p(format!("fc1_b_{l}"), vec![f], col),
                p(format!("fc2_w_{l}"), vec![h, f], TpLayout::Shard(1)),
                p(format!("fc2_b_{l}"), vec![h], rep),
            ]);
        }
        out.push(p("lnf_w".into(), vec![h], rep));
        out.push(p("lnf_b".into(), vec![h], rep));
        out
    }

    /// Why these sizes cannot be split `dp` x `tp` ways (the sequence over tp too when
    /// `sequence_parallel`), if they cannot.
    pub fn check_split(&self, dp: usize, tp: usize, sequence_parallel: bool) -> Result<(), String> {
        check_at_least_one(&[
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("ffn", self.ffn),
            ("layers", self.layers),
            ("seq", self.seq),
            ("batch", self.batch),
            ("vocab", self.vocab),
        ])?;
        let largest = [
            vec![
                self.batch,
                self.seq,
                self.hidden.max(self.ffn).max(self.vocab),
            ],
            vec![self.batch, self.heads, self.seq, self.seq],
            vec![self.vocab.max(self.ffn).max(self.hidden), self.hidden],
            vec![self.layers, 16, self.hidden],
        ];
        check_tensor_sizes(&largest, MAX_ELEMENTS)?;
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "hidden {} is not divisible by heads {}",
                self.hidden, self.heads
            ));
        }
        check_divisible("batch", self.batch, "dp", dp)?;
        check_divisible("heads", self.heads, "tp", tp)?;
        check_divisible("ffn", self.ffn, "tp", tp)?;
        if sequence_parallel && !self.seq.is_multiple_of(tp) {
            return Err(format!(
                "seq {} is not divisible by tp = {tp} (--sequence-parallel)",
                self.seq
            ));
        }
        Ok(())
    }
}

/// The rank a graph is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankPlan {
    /// Size of the dp mesh dim.
    pub dp: usize,
    /// Size of the tp mesh dim.
    pub tp: usize,
    /// The rank's index along tp (its sequence chunk under sequence parallelism).
    pub tp_rank: usize,
    /// Megatron sequence parallelism: activations outside the tensor-parallel regions are
    /// split along the sequence over tp.
    pub sequence_parallel: bool,
    /// Under SP, TP communication overlap (Megatron's `--tp-comm-overlap`): the row-parallel
    /// weight gradients are computed chunk by chunk in the order the all-gathered output
    /// gradient's chunks arrive over the ring (the rank's own first), each paired with the
    /// matching chunk of the saved activation, and summed.
    pub tp_comm_overlap: bool,
}

impl RankPlan {
    /// The single-device spec.
    pub const SPEC: RankPlan = RankPlan {
        dp: 1,
        tp: 1,
        tp_rank: 0,
        sequence_parallel: false,
        tp_comm_overlap: false,
    };
}

/// What a LayerNorm backward reads from its forward.
struct NormSaved {
    x: Val,
    mean: Val,
    rstd: Val,
}

/// What the backward of the attention proper reads from its forward: the scores and
/// probabilities of the whole sequence, or under context parallelism the ring's output and
/// log-sum-exp.
enum AttnCore {
    Local(ScoresSaved),
    Ring(RingSaved),
}

/// What the backward of a decoder layer reads from its forward.
pub(crate) struct LayerSaved {
    ln1: NormSaved,
    xn2d: Val,
    scores: AttnCore,
    attn2d: Val,
    ln2: NormSaved,
    hn2d: Val,
    fc1: Val,
    act: Val,
}

/// The model's graph builder with the rank's plan: the collectives around the tensor-parallel
/// regions differ between plain TP and SP.
struct Ranked<'g> {
    g: &'g mut GraphBuilder,
    tp: usize,
    sp: bool,
}

impl Ranked<'_> {
    /// The input of a column-parallel region: all-gathered along the sequence under SP (the
    /// identity otherwise; Megatron's `f` / `gather_from_sequence_parallel_region`).
    fn enter(&mut self, x: &Val) -> Val {
        if self.sp {
            self.g.all_gather(x, self.tp, "tp")
        } else {
            x.clone()
        }
    }

    /// The output of a row-parallel region (a partial sum over tp): reduce-scattered along
    /// the sequence under SP, all-reduced otherwise (Megatron's `g`). The backward of a
    /// column-parallel input is the same operator.
    fn leave(&mut self, x: &Val) -> Val {
        if self.sp {
            self.g.reduce_scatter_sum(x, self.tp, "tp")
        } else if self.tp > 1 {
            self.g.all_reduce_sum(x, "tp")
        } else {
            x.clone()
        }
    }
}

/// The gradient of a row-parallel weight, `grad.T @ input` for the output gradient `grad`
/// (`[t, h]`, all-gathered along the sequence under SP) and the weight's input `input`
/// (`[t, k]`). With TP communication overlap (SP only) it is computed chunk by chunk as the
/// gathered gradient's sequence chunks arrive over the ring, the rank's own first: chunk
/// `(tp_rank + i) % tp` of both at step `i`, summed. The planted
/// `tp-overlap-wrong-chunk-order` pairs the arriving gradient chunk with input chunk `i`.
fn row_parallel_weight_grad(
    g: &mut GraphBuilder,
    grad: &Val,
    input: &Val,
    plan: RankPlan,
    bug: Option<Mutation>,
) -> Val {
    let tp = plan.tp;
    if !(plan.tp_comm_overlap && plan.sequence_parallel && tp > 1) {
        let gt = g.t(grad);
        return g.mm(&gt, input);
    }
    let rows = grad.shape[0] / tp;
    let mut acc: Option<Val> = None;
    for i in 0..tp {
        let j = (plan.tp_rank + i) % tp;
        let k = if bug == Some(Mutation::TpOverlapWrongChunkOrder) {
            i
        } else {
            j
        };
        let gj = g.slice(grad, 0, j * rows, (j + 1) * rows);
        let xk = g.slice(input, 0, k * rows, (k + 1) * rows);
        let gjt = g.t(&gj);
        let part = g.mm(&gjt, &xk);
        acc = Some(match acc {
            None => part,
            Some(a) => g.add(&a, &part),
        });
    }
    acc.expect("tp > 1 chunks")
}

/// `x @ w.T + b` as one `addmm`.
fn linear_bias(g: &mut GraphBuilder, x: &Val, w: &Val, b: &Val) -> Val {
    let wt = g.t(w);
    g.addmm(b, x, &wt)
}

/// `x @ w.T` without a bias (a row-parallel linear before its reduction).
fn linear(g: &mut GraphBuilder, x: &Val, w: &Val) -> Val {
    let wt = g.t(w);
    g.mm(x, &wt)
}

/// A typed contiguous copy (`clone`), for integer tensors.
fn contiguous_typed(g: &mut GraphBuilder, a: &Val) -> Val {
    g.call_typed(
        "clone",
        "aten.clone.default",
        &[
            Arg::V(a),
            Arg::Raw("memory_format = torch.contiguous_format"),
        ],
        a.dtype,
        a.shape.clone(),
    )
}

/// Builds the graph of one rank of the plan ([`RankPlan::SPEC`], no bug, is the spec). Forward
/// and loss (output `loss`), and unless `forward_only` the explicit backward, gradient
/// finalization (under SP the gradients of the parameters applied to sequence shards — the
/// LayerNorms and the row-parallel biases — all-reduced over tp; all-reduce and average over
/// dp) and an SGD step whose updated parameters are outputs `<param>_new`.
pub fn build(
    cfg: &Gpt2Config,
    plan: RankPlan,
    forward_only: bool,
    bug: Option<Mutation>,
) -> GraphBuilder {
    let step = Step::plain(plan.dp, plan.tp, plan.tp_rank, bug, cfg.lr);
    build_rank(cfg, plan, &step, forward_only)
}

/// [`build`] on the cp plan `cp` (context parallelism: the rank holds chunks `i` and
/// `2 * cp - 1 - i` of every sequence; see [`crate::cp`]) with the loss and the gradients
/// averaged over dp x cp.
pub fn build_cp(
    cfg: &Gpt2Config,
    plan: RankPlan,
    cp: &CpPlan,
    forward_only: bool,
    bug: Option<Mutation>,
) -> GraphBuilder {
    let step = Step {
        cp: cp.cp,
        ..Step::plain(plan.dp, plan.tp, plan.tp_rank, bug, cfg.lr)
    };
    build_rank_cp(cfg, plan, cp, &step, forward_only)
}

/// [`build`] for the rank and training options of `step` (loss scaling, microbatches, ZeRO,
/// clipping, the optimizer; see [`crate::train`]).
pub(crate) fn build_rank(
    cfg: &Gpt2Config,
    plan: RankPlan,
    step: &Step,
    forward_only: bool,
) -> GraphBuilder {
    build_rank_cp(cfg, plan, &CpPlan::NONE, step, forward_only)
}

/// The sizes one rank's gpt2 graph is built with, for its plan and microbatches.
#[derive(Clone, Copy)]
pub(crate) struct Dims<'a> {
    cfg: &'a Gpt2Config,
    plan: RankPlan,
    cp: &'a CpPlan,
    bug: Option<Mutation>,
    /// Under SP (tp >= 2).
    sp: bool,
    /// Sequences of a microbatch, the positions the rank holds of each, hidden, vocab.
    b: usize,
    s: usize,
    h: usize,
    v: usize,
    hd: usize,
    /// The rank's heads.
    nh: usize,
    /// Tokens of a microbatch (`s * b`).
    t: usize,
    /// The rank's sequence chunk (`s` without SP) and its tokens.
    sl: usize,
    tl: usize,
}

impl<'a> Dims<'a> {
    /// The sizes of a rank of `plan` (on the cp plan `cp`) running `microbatches`
    /// microbatches, with the planted `bug`.
    pub(crate) fn new(
        cfg: &'a Gpt2Config,
        plan: RankPlan,
        cp: &'a CpPlan,
        bug: Option<Mutation>,
        microbatches: usize,
    ) -> Dims<'a> {
        let sp = plan.sequence_parallel && plan.tp > 1;
        let b = cfg.batch / plan.dp / microbatches;
        let s = cfg.seq / cp.cp;
        let sl = if sp { s / plan.tp } else { s };
        Dims {
            cfg,
            plan,
            cp,
            bug,
            sp,
            b,
            s,
            h: cfg.hidden,
            v: cfg.vocab,
            hd: cfg.head_dim(),
            nh: cfg.heads / plan.tp,
            t: s * b,
            sl,
            tl: sl * b,
        }
    }

    fn is(&self, m: Mutation) -> bool {
        self.bug == Some(m)
    }

    /// The shape of the residual stream between layers (the activation a pipeline stage
    /// sends on): `[sl, b, hidden]`.
    pub(crate) fn stream(&self) -> Vec<usize> {
        vec![self.sl, self.b, self.h]
    }
}

/// What the embeddings' backward reads from their forward.
pub(crate) struct Embedded {
    tokens_t: Val,
    pos: Val,
}

/// The attention masks of a microbatch: the causal mask, or under context parallelism the
/// masks of the ring steps (from the global positions).
pub(crate) struct Masks {
    mask: Val,
    ring: Option<cp::RingMasks>,
}

/// What the backward of the final LayerNorm, the LM head and the loss reads from its forward.
pub(crate) struct HeadSaved {
    final_norm: NormSaved,
    xf2d: Val,
    ce: crate::llama::CrossEntropy,
}

/// A pass's weight by name.
fn wt(w: &BTreeMap<String, Val>, name: &str) -> Val {
    w[name].clone()
}

/// The embeddings of a microbatch's `tokens` (`[b, seq]`), sequence-first (under SP the
/// rank's chunk of them), and the microbatch's attention masks.
pub(crate) fn embed_forward(
    g: &mut GraphBuilder,
    d: &Dims,
    w: &BTreeMap<String, Val>,
    tokens: &Val,
) -> (Val, Embedded, Masks) {
    let scope = g.begin_module("embedding", false);
    let (x, embedded, masks) = embed_forward_body(g, d, w, tokens);
    g.end_module(scope, Some(&x));
    (x, embedded, masks)
}

/// [`embed_forward`] without its module annotation.
fn embed_forward_body(
    g: &mut GraphBuilder,
    d: &Dims,
    w: &BTreeMap<String, Val>,
    tokens: &Val,
) -> (Val, Embedded, Masks) {
    let (s, b, h, sl, plan, cp) = (d.s, d.b, d.h, d.sl, d.plan, d.cp);
    // Embeddings, sequence-first: wte[tokens^T] + wpe[arange(seq)].
    let tokens_t = g.permute(tokens, &[1, 0]);
    let te = g.call(
        "embedding",
        "aten.embedding.default",
        &[Arg::V(&wt(w, "wte")), Arg::V(&tokens_t)],
        vec![s, b, h],
    );
    // The positions of the rank's tokens: their global positions under context
    // parallelism (the planted `cp-rope-no-offset` takes the local ones, 0..seq/cp).
    let global_pos = cp.is_ring().then(|| cp::positions(g, s, cp));
    let pos = match &global_pos {
        Some(p) if !d.is(Mutation::CpRopeNoOffset) => p.clone(),
        _ => g.arange(s),
    };
    let pe = g.call(
        "embedding",
        "aten.embedding.default",
        &[Arg::V(&wt(w, "wpe")), Arg::V(&pos)],
        vec![s, h],
    );
    let pe3 = g.unsqueeze(&pe, 1);
    let emb = g.add(&te, &pe3);
    // Under SP each rank keeps its sequence chunk (Megatron's
    // `scatter_to_sequence_parallel_region`); the planted bug takes the next rank's chunk.
    let x = if d.sp {
        let chunk = if d.is(Mutation::SpScatterWrongChunk) {
            (plan.tp_rank + 1) % plan.tp
        } else {
            plan.tp_rank
        };
        g.slice(&emb, 0, chunk * sl, (chunk + 1) * sl)
    } else {
        emb
    };
    let masks = attention_masks(g, d, global_pos.as_ref());
    (x, Embedded { tokens_t, pos }, masks)
}

/// The causal mask, or under context parallelism (`global_pos`: the rank's tokens' global
/// positions) the masks of the ring steps.
pub(crate) fn attention_masks(g: &mut GraphBuilder, d: &Dims, global_pos: Option<&Val>) -> Masks {
    match global_pos {
        Some(p) => {
            let masks = cp::ring_masks(g, p, d.bug);
            Masks {
                mask: masks.diag().clone(),
                ring: Some(masks),
            }
        }
        None => Masks {
            mask: causal_mask(g, d.s),
            ring: None,
        },
    }
}

/// The attention masks of a stage that does not embed: the rank's global positions
/// recomputed under context parallelism.
pub(crate) fn stage_masks(g: &mut GraphBuilder, d: &Dims) -> Masks {
    let global_pos = d.cp.is_ring().then(|| cp::positions(g, d.s, d.cp));
    attention_masks(g, d, global_pos.as_ref())
}

/// Decoder layer `l` on the residual stream `x` (`[sl, b, hidden]`), annotated as module
/// `layers.{l}`.
pub(crate) fn layer_forward(
    g: &mut GraphBuilder,
    d: &Dims,
    w: &BTreeMap<String, Val>,
    masks: &Masks,
    x: &Val,
    l: usize,
) -> (Val, LayerSaved) {
    let scope = g.begin_module(format!("layers.{l}"), false);
    let (out, saved) = layer_forward_body(g, d, w, masks, x, l);
    g.end_module(scope, Some(&out));
    (out, saved)
}

/// [`layer_forward`] without its module annotation.
fn layer_forward_body(
    g: &mut GraphBuilder,
    d: &Dims,
    w: &BTreeMap<String, Val>,
    masks: &Masks,
    x: &Val,
    l: usize,
) -> (Val, LayerSaved) {
    let (b, s, h, hd, nh, t, sl, tl) = (d.b, d.s, d.h, d.hd, d.nh, d.t, d.sl, d.tl);
    let (plan, cp, cfg) = (d.plan, d.cp, d.cfg);
    let tp = plan.tp;
    let is = |m: Mutation| d.is(m);
    let mut r = Ranked { g, tp, sp: d.sp };
    let sp = d.sp;
    let scale = 1.0 / (hd as f64).sqrt();
    let wl = |n: &str| wt(w, &format!("{n}_{l}"));
    let x_in = x.clone();
    // Attention: q/k/v column parallel (the rank's heads), o row parallel.
    let (xn, m1, r1) = r.g.layer_norm(x, &wl("ln1_w"), &wl("ln1_b"), cfg.eps);
    let xn_full = if sp && l == 0 && is(Mutation::SpPadSliceMismatch) {
        // Each chunk padded by a row for the all-gather; the slice after it keeps
        // the first `s` rows instead of each chunk's first `sl`.
        let padded = r.g.call(
            "constant_pad_nd",
            "aten.constant_pad_nd.default",
            &[Arg::V(&xn), Arg::Ints(vec![0, 0, 0, 0, 0, 1]), Arg::F(0.0)],
            vec![sl + 1, b, h],
        );
        let gathered = r.g.all_gather(&padded, tp, "tp");
        r.g.slice(&gathered, 0, 0, s)
    } else {
        r.enter(&xn)
    };
    let g = &mut *r.g;
    let xn2d = g.view(&xn_full, &[t, h]);
    let q = linear_bias(g, &xn2d, &wl("wq"), &wl("bq"));
    let k = linear_bias(g, &xn2d, &wl("wk"), &wl("bk"));
    let vv = linear_bias(g, &xn2d, &wl("wv"), &wl("bv"));
    let q4 = g.view(&q, &[s, b, nh, hd]);
    let qp = g.permute(&q4, &[1, 2, 0, 3]);
    let qc = g.contiguous(&qp);
    let q3 = g.view(&qc, &[b * nh, s, hd]);
    let k4 = g.view(&k, &[s, b, nh, hd]);
    let (o3, scores) = if let Some(ring_masks) = &masks.ring {
        // Context parallelism: ring attention over the cp ranks' keys and values
        // `[b, heads, s, head_dim]`.
        let kp = g.permute(&k4, &[1, 2, 0, 3]);
        let kc = g.contiguous(&kp);
        let v4 = g.view(&vv, &[s, b, nh, hd]);
        let vp = g.permute(&v4, &[1, 2, 0, 3]);
        let vc = g.contiguous(&vp);
        let sh = RingShape {
            b,
            n_rep: 1,
            layer: l,
        };
        let (o3, ring) = cp::ring_attention(g, &q3, &kc, &vc, ring_masks, scale, sh, cp);
        (o3, AttnCore::Ring(ring))
    } else {
        let kp = g.permute(&k4, &[1, 2, 3, 0]);
        let kc = g.contiguous(&kp);
        let kt3 = g.view(&kc, &[b * nh, hd, s]);
        let v4 = g.view(&vv, &[s, b, nh, hd]);
        let vp = g.permute(&v4, &[1, 2, 0, 3]);
        let vc = g.contiguous(&vp);
        let v3 = g.view(&vc, &[b * nh, s, hd]);
        let (o3, scores) = attend(g, q3, kt3, |_| v3, &masks.mask, scale, b);
        (o3, AttnCore::Local(scores))
    };
    let o4 = g.view(&o3, &[b, nh, s, hd]);
    let op = g.permute(&o4, &[2, 0, 1, 3]);
    let oc = g.contiguous(&op);
    let attn2d = g.view(&oc, &[t, nh * hd]);
    let o_red = if tp == 1 {
        linear_bias(g, &attn2d, &wl("wo"), &wl("bo"))
    } else {
        let o = linear(g, &attn2d, &wl("wo"));
        let o = if l == 0 && is(Mutation::WrongGroup) {
            r.g.all_reduce_sum(&o, "dp")
        } else {
            r.leave(&o)
        };
        r.g.add(&o, &wl("bo"))
    };
    let g = &mut *r.g;
    let o3d = g.view(&o_red, &[sl, b, h]);
    let hres = g.add(x, &o3d);

    // MLP: fc1 column parallel, GELU, fc2 row parallel.
    let (hn, m2, r2) = g.layer_norm(&hres, &wl("ln2_w"), &wl("ln2_b"), cfg.eps);
    let hn_full = r.enter(&hn);
    let g = &mut *r.g;
    let hn2d = g.view(&hn_full, &[t, h]);
    let fc1 = linear_bias(g, &hn2d, &wl("fc1_w"), &wl("fc1_b"));
    let act = g.unary("gelu", "aten.gelu.default", &fc1);
    let d_red = if tp == 1 {
        linear_bias(g, &act, &wl("fc2_w"), &wl("fc2_b"))
    } else {
        let dd = linear(g, &act, &wl("fc2_w"));
        if l == 0 && is(Mutation::TpBiasBeforeAllreduce) {
            let dd = r.g.add(&dd, &wl("fc2_b"));
            r.leave(&dd)
        } else if l == 0 && is(Mutation::TpMissingAllreduce) {
            // The rank keeps its own (unreduced) rows, as the reduction would have.
            let dd = if sp {
                let c = plan.tp_rank;
                r.g.slice(&dd, 0, c * tl, (c + 1) * tl)
            } else {
                dd
            };
            r.g.add(&dd, &wl("fc2_b"))
        } else {
            let dd = r.leave(&dd);
            r.g.add(&dd, &wl("fc2_b"))
        }
    };
    let g = &mut *r.g;
    let d3 = g.view(&d_red, &[sl, b, h]);
    let out = g.add(&hres, &d3);
    let saved = LayerSaved {
        ln1: NormSaved {
            x: x_in,
            mean: m1,
            rstd: r1,
        },
        xn2d,
        scores,
        attn2d,
        ln2: NormSaved {
            x: hres,
            mean: m2,
            rstd: r2,
        },
        hn2d,
        fc1,
        act,
    };
    (out, saved)
}

/// The final LayerNorm, the LM head (tied to the token embedding) and the cross-entropy loss
/// (mean over the rank's tokens, named `local_name`) of the residual stream `x` against the
/// microbatch's `labels` (`[b, seq]`). Under SP the normed chunks are gathered first: the LM
/// head and the loss run on the whole sequence, the same on every tp rank. Returns the loss.
pub(crate) fn head_forward(
    g: &mut GraphBuilder,
    d: &Dims,
    w: &BTreeMap<String, Val>,
    x: &Val,
    labels: &Val,
    local_name: &str,
) -> (Val, HeadSaved) {
    let (t, h) = (d.t, d.h);
    let mut r = Ranked {
        g,
        tp: d.plan.tp,
        sp: d.sp,
    };
    let (xf, mf, rf) =
        r.g.layer_norm(x, &wt(w, "lnf_w"), &wt(w, "lnf_b"), d.cfg.eps);
    let final_norm = NormSaved {
        x: x.clone(),
        mean: mf,
        rstd: rf,
    };
    let xf_full = r.enter(&xf);
    let g = &mut *r.g;
    let xf2d = g.view(&xf_full, &[t, h]);
    let logits = linear(g, &xf2d, &wt(w, "wte"));
    let labels_t = g.permute(labels, &[1, 0]);
    let labels_c = contiguous_typed(g, &labels_t);
    let labels1 = g.view(&labels_c, &[t]);
    let ce = cross_entropy(g, &logits, &labels1, local_name);
    let mut local = ce.loss().clone();
    if d.is(Mutation::CpLossOverscaled) {
        // The planted bug: the loss scaled by cp for an averaging over cp that the
        // reduction over dp x cp does already.
        local = g.mul_scalar("mul", &local, Arg::I(d.cp.cp as i64));
    }
    (
        local,
        HeadSaved {
            final_norm,
            xf2d,
            ce,
        },
    )
}

/// The backward of [`head_forward`] from the loss (seed 1, scaled for the microbatches and
/// the loss scale by `step`): the LM head's share of the token embedding's gradient and the
/// residual stream's gradient; the final LayerNorm's gradients go into `grads` (and their names
/// into `seq_partial`).
pub(crate) fn head_backward(
    g: &mut GraphBuilder,
    d: &Dims,
    step: &Step,
    w: &BTreeMap<String, Val>,
    saved: &HeadSaved,
    grads: &mut BTreeMap<String, Val>,
    seq_partial: &mut BTreeSet<String>,
) -> (Val, Val) {
    let (s, b, h, sl) = (d.s, d.b, d.h, d.sl);
    let mut g_logits = saved.ce.backward(g);
    if d.is(Mutation::CpLossOverscaled) {
        g_logits = g.mul_scalar("mul", &g_logits, Arg::I(d.cp.cp as i64));
    }
    let g_logits = train::scale_seed(g, step, &g_logits);
    let gt = g.t(&g_logits);
    let g_wte_head = g.mm(&gt, &saved.xf2d);
    let g_xf2d = g.mm(&g_logits, &wt(w, "wte"));
    let g_xf_full = g.view(&g_xf2d, &[s, b, h]);
    // The gather before the replicated LM head: every tp rank holds the whole gradient, so its
    // backward keeps the rank's chunk (Megatron's `tensor_parallel_output_grad=False`).
    let g_xf = if d.sp {
        let c = d.plan.tp_rank;
        g.slice(&g_xf_full, 0, c * sl, (c + 1) * sl)
    } else {
        g_xf_full
    };
    let final_norm = &saved.final_norm;
    let (gx, g_lnf_w, g_lnf_b) = g.layer_norm_backward(
        &g_xf,
        &final_norm.x,
        &final_norm.mean,
        &final_norm.rstd,
        &wt(w, "lnf_w"),
        &wt(w, "lnf_b"),
    );
    grads.insert("lnf_w".into(), g_lnf_w);
    grads.insert("lnf_b".into(), g_lnf_b);
    seq_partial.extend(["lnf_w".to_string(), "lnf_b".to_string()]);
    (gx, g_wte_head)
}

/// The backward of decoder layer `l` from the residual stream's gradient `gx`; the layer's
/// gradients go into `grads` (those of parameters applied to sequence chunks named in
/// `seq_partial`). Returns the gradient of the layer's input.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_backward(
    g: &mut GraphBuilder,
    d: &Dims,
    step: &Step,
    w: &BTreeMap<String, Val>,
    masks: &Masks,
    gx: &Val,
    sv: &LayerSaved,
    l: usize,
    grads: &mut BTreeMap<String, Val>,
    seq_partial: &mut BTreeSet<String>,
) -> Val {
    let scope = g.begin_module(format!("layers.{l}"), true);
    let g_x = layer_backward_body(g, d, step, w, masks, gx, sv, l, grads, seq_partial);
    g.end_module(scope, Some(&g_x));
    g_x
}

/// [`layer_backward`] without its module annotation.
#[allow(clippy::too_many_arguments)]
fn layer_backward_body(
    g: &mut GraphBuilder,
    d: &Dims,
    step: &Step,
    w: &BTreeMap<String, Val>,
    masks: &Masks,
    gx: &Val,
    sv: &LayerSaved,
    l: usize,
    grads: &mut BTreeMap<String, Val>,
    seq_partial: &mut BTreeSet<String>,
) -> Val {
    let (b, s, h, hd, nh, t, tl) = (d.b, d.s, d.h, d.hd, d.nh, d.t, d.tl);
    let (plan, cp) = (d.plan, d.cp);
    let mut r = Ranked {
        g,
        tp: plan.tp,
        sp: d.sp,
    };
    let wl = |n: &str| wt(w, &format!("{n}_{l}"));
    let name = |n: &str| format!("{n}_{l}");
    // MLP branch. The backward of the fc2 reduction is the identity under TP and an
    // all-gather under SP; the fc1 input gradient is a partial sum over tp.
    let g = &mut *r.g;
    let g_d2d = g.view(gx, &[tl, h]);
    grads.insert(name("fc2_b"), g.sum0(&g_d2d));
    seq_partial.insert(name("fc2_b"));
    let g_d_full = r.enter(&g_d2d);
    let g = &mut *r.g;
    let g_act = g.mm(&g_d_full, &wl("fc2_w"));
    let g_fc2_w = row_parallel_weight_grad(g, &g_d_full, &sv.act, plan, step.bug);
    grads.insert(name("fc2_w"), g_fc2_w);
    let g_fc1 = g.call(
        "gelu_backward",
        "aten.gelu_backward.default",
        &[Arg::V(&g_act), Arg::V(&sv.fc1)],
        sv.fc1.shape.clone(),
    );
    let g_fc1t = g.t(&g_fc1);
    grads.insert(name("fc1_w"), g.mm(&g_fc1t, &sv.hn2d));
    grads.insert(name("fc1_b"), g.sum0(&g_fc1));
    let g_hn2d = g.mm(&g_fc1, &wl("fc1_w"));
    let g_hn2d = r.leave(&g_hn2d);
    let g = &mut *r.g;
    let g_hn = g.view(&g_hn2d, &[d.sl, b, h]);
    let (g_hres_norm, g_ln2_w, g_ln2_b) = g.layer_norm_backward(
        &g_hn,
        &sv.ln2.x,
        &sv.ln2.mean,
        &sv.ln2.rstd,
        &wl("ln2_w"),
        &wl("ln2_b"),
    );
    grads.insert(name("ln2_w"), g_ln2_w);
    grads.insert(name("ln2_b"), g_ln2_b);
    let g_hres = g.add(gx, &g_hres_norm);

    // Attention branch.
    let g_o2d = g.view(&g_hres, &[tl, h]);
    grads.insert(name("bo"), g.sum0(&g_o2d));
    seq_partial.extend([name("bo"), name("ln2_w"), name("ln2_b")]);
    let g_o_full = r.enter(&g_o2d);
    let g = &mut *r.g;
    let g_attn2d = g.mm(&g_o_full, &wl("wo"));
    let g_wo = row_parallel_weight_grad(g, &g_o_full, &sv.attn2d, plan, step.bug);
    grads.insert(name("wo"), g_wo);
    let g_o4 = g.view(&g_attn2d, &[s, b, nh, hd]);
    let g_op = g.permute(&g_o4, &[1, 2, 0, 3]);
    let g_oc = g.contiguous(&g_op);
    let g_o3 = g.view(&g_oc, &[b * nh, s, hd]);
    // The gradients of the queries, keys and values, and the layout of the keys'
    // (transposed `[b * heads, head_dim, s]`, or `[b, heads, s, head_dim]` from the
    // ring).
    let (g_q3, g_k, g_v3, k_shape, k_dims) = match (&sv.scores, &masks.ring) {
        (AttnCore::Local(scores), _) => {
            let (g_q3, g_kt3, g_v3) = attention_scores_backward(g, &g_o3, scores);
            (g_q3, g_kt3, g_v3, [b, nh, hd, s], [3, 0, 1, 2])
        }
        (AttnCore::Ring(ring), Some(ring_masks)) => {
            let sh = RingShape {
                b,
                n_rep: 1,
                layer: l,
            };
            let (g_q3, g_k4, g_v4) =
                cp::ring_attention_backward(g, &g_o3, ring, ring_masks, sh, cp);
            (g_q3, g_k4, g_v4, [b, nh, s, hd], [2, 0, 1, 3])
        }
        (AttnCore::Ring(_), None) => unreachable!("ring attention is built with its masks"),
    };
    // Back to sequence-first token rows `[seq * batch, heads * head_dim]`.
    let mut to_rows = |x: &Val, shape: &[usize], dims: &[usize]| {
        let v = g.view(x, shape);
        let p = g.permute(&v, dims);
        let c = g.contiguous(&p);
        g.view(&c, &[t, nh * hd])
    };
    let g_q2d = to_rows(&g_q3, &[b, nh, s, hd], &[2, 0, 1, 3]);
    let g_k2d = to_rows(&g_k, &k_shape, &k_dims);
    let g_v2d = to_rows(&g_v3, &[b, nh, s, hd], &[2, 0, 1, 3]);
    let mut g_xn2d = None;
    for (wn, bn, gr) in [
        ("wq", "bq", &g_q2d),
        ("wk", "bk", &g_k2d),
        ("wv", "bv", &g_v2d),
    ] {
        let grt = g.t(gr);
        grads.insert(name(wn), g.mm(&grt, &sv.xn2d));
        grads.insert(name(bn), g.sum0(gr));
        let part = g.mm(gr, &wl(wn));
        g_xn2d = Some(match g_xn2d {
            None => part,
            Some(acc) => g.add(&acc, &part),
        });
    }
    let g_xn2d = g_xn2d.expect("q, k and v contribute");
    let g_xn2d = r.leave(&g_xn2d);
    let g = &mut *r.g;
    let g_xn = g.view(&g_xn2d, &[d.sl, b, h]);
    let (g_x_norm, g_ln1_w, g_ln1_b) = g.layer_norm_backward(
        &g_xn,
        &sv.ln1.x,
        &sv.ln1.mean,
        &sv.ln1.rstd,
        &wl("ln1_w"),
        &wl("ln1_b"),
    );
    grads.insert(name("ln1_w"), g_ln1_w);
    grads.insert(name("ln1_b"), g_ln1_b);
    seq_partial.extend([name("ln1_w"), name("ln1_b")]);
    g.add(&g_hres, &g_x_norm)
}

/// The backward of [`embed_forward`] from the gradient `gx` of its output: the token
/// embedding's gradient (plus, when the LM head runs on this rank, `g_wte_head`, the tied head's
/// share) and the position embedding's go into `grads`.
pub(crate) fn embed_backward(
    g: &mut GraphBuilder,
    d: &Dims,
    gx: Val,
    saved: &Embedded,
    g_wte_head: Option<Val>,
    grads: &mut BTreeMap<String, Val>,
) {
    // Embeddings: under SP the chunks' gradients are gathered (the backward of the scatter),
    // so every tp rank computes the whole embedding gradients.
    let g_emb = if d.sp {
        g.all_gather(&gx, d.plan.tp, "tp")
    } else {
        gx
    };
    let g_wte_emb = g.call(
        "embedding_dense_backward",
        "aten.embedding_dense_backward.default",
        &[
            Arg::V(&g_emb),
            Arg::V(&saved.tokens_t),
            Arg::I(d.v as i64),
            Arg::I(-1),
            Arg::B(false),
        ],
        vec![d.v, d.h],
    );
    // The tied LM head adds its gradient to the token embedding's (the planted
    // `zero-tied-embedding-untied` leaves it dangling: the two uses updated apart).
    let g_wte = match g_wte_head {
        Some(head) if !d.is(Mutation::ZeroTiedEmbeddingUntied) => g.add(&head, &g_wte_emb),
        _ => g_wte_emb,
    };
    grads.insert("wte".into(), g_wte);
    // The position-embedding gradient lands on the rows the rank looked up (under context
    // parallelism its chunks' positions; the other rows stay zero here and the
    // reduction over dp x cp sums the cp ranks' rows).
    let g_pe = g.sum_dims(&g_emb, &[1], false);
    let g_wpe = g.call(
        "embedding_dense_backward",
        "aten.embedding_dense_backward.default",
        &[
            Arg::V(&g_pe),
            Arg::V(&saved.pos),
            Arg::I(d.cfg.seq as i64),
            Arg::I(-1),
            Arg::B(false),
        ],
        vec![d.cfg.seq, d.h],
    );
    grads.insert("wpe".into(), g_wpe);
}

/// The gradient finalization hook of a gpt2 rank: under SP the gradients of the parameters
/// applied to sequence chunks (`seq_partial`) all-reduced over tp (the planted
/// `sp-layernorm-grad-not-reduced` skips the LayerNorms'), and the planted
/// `tp-cp-layernorm-grad-scaled-by-tp` reduces complete LayerNorm gradients once more.
pub(crate) fn sync_grad(
    g: &mut GraphBuilder,
    d: &Dims,
    seq_partial: &BTreeSet<String>,
    p: &Param,
    grad: Val,
) -> Val {
    let norm = p.name.starts_with("ln");
    let grad = if d.sp
        && seq_partial.contains(&p.name)
        && !(norm && d.is(Mutation::SpLayernormGradNotReduced))
    {
        g.all_reduce_sum(&grad, "tp")
    } else {
        grad
    };
    if norm && d.is(Mutation::TpCpNormGradScaledByTp) {
        // The planted bug: a complete LayerNorm gradient summed over tp once more.
        g.all_reduce_sum(&grad, "tp")
    } else {
        grad
    }
}

/// [`build_rank`] on the cp plan `cp` ([`CpPlan::NONE`]: without context parallelism). Under
/// context parallelism the rank selects its two chunks of the tokens and labels, looks up the
/// position-embedding rows of their global positions (and scatters their gradient back to
/// those rows), attends by ring attention, and averages the loss and the gradients over
/// dp x cp (`step.cp`).
pub(crate) fn build_rank_cp(
    cfg: &Gpt2Config,
    plan: RankPlan,
    cp: &CpPlan,
    step: &Step,
    forward_only: bool,
) -> GraphBuilder {
    debug_assert_eq!(step.cp, cp.cp, "the step averages over the plan's cp ranks");
    let mut graph = GraphBuilder::new();
    let g = &mut graph;
    let mbs = step.microbatches();
    let d = Dims::new(cfg, plan, cp, step.bug, mbs);
    let b_all = cfg.batch / plan.dp;
    let specs = cfg.params();
    let tokens_in = g.input_typed("tokens", "i64", &[b_all, cfg.seq]);
    let labels_in = g.input_typed("labels", "i64", &[b_all, cfg.seq]);
    let weights = train::declare(g, step, &specs);
    // The rank's chunks of the sequence (the whole sequence without context parallelism).
    let tokens_all = cp::select_chunks(g, &tokens_in, cp);
    let labels_all = cp::select_chunks(g, &labels_in, cp);
    // Parameters applied to the rank's sequence chunk only: under SP their gradients are
    // partial sums over tp (Megatron's `sequence_parallel` parameter attribute).
    let mut seq_partial: BTreeSet<String> = BTreeSet::new();
    let mut losses = train::LossReport::default();
    let mut acc: BTreeMap<String, Val> = BTreeMap::new();
    for mb in 0..mbs {
        let forward = weights.pass(g);
        let tokens = train::microbatch(g, &tokens_all, mb, mbs);
        let labels = train::microbatch(g, &labels_all, mb, mbs);
        let (mut x, embedded, masks) = embed_forward(g, &d, &forward, &tokens);
        let mut saved = Vec::new();
        for l in 0..cfg.layers {
            let (out, sv) = layer_forward(g, &d, &forward, &masks, &x, l);
            x = out;
            saved.push(sv);
        }
        let local_name = if step.data_group().1 > 1 || mbs > 1 {
            "nll_loss"
        } else {
            "loss"
        };
        let (local, head) = head_forward(g, &d, &forward, &x, &labels, local_name);
        losses.add(g, step, local);
        if forward_only {
            return graph;
        }

        // Backward of the rank's local loss (seed 1, scaled for the microbatches and the loss
        // scale); dp averaging happens on the gradients.
        let backward = weights.pass(g);
        let mut grads: BTreeMap<String, Val> = BTreeMap::new();
        let (mut gx, g_wte_head) =
            head_backward(g, &d, step, &backward, &head, &mut grads, &mut seq_partial);
        for l in (0..cfg.layers).rev() {
            gx = layer_backward(
                g,
                &d,
                step,
                &backward,
                &masks,
                &gx,
                &saved[l],
                l,
                &mut grads,
                &mut seq_partial,
            );
        }
        embed_backward(g, &d, gx, &embedded, Some(g_wte_head), &mut grads);
        train::accumulate(g, &mut acc, grads);
    }
    losses.finish(g, step);

    // Gradient finalization, then the optimizer step.
    train::finish(g, step, &specs, &weights, &acc, |g, p, grad| {
        sync_grad(g, &d, &seq_partial, p, grad)
    });
    graph
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_checked() {
        let c = Gpt2Config::default();
        for (dp, tp, sp) in [
            (1, 1, false),
            (2, 1, false),
            (1, 2, true),
            (2, 2, true),
            (1, 4, true),
        ] {
            assert!(c.check_split(dp, tp, sp).is_ok(), "dp {dp} tp {tp} sp {sp}");
        }
        assert!(c.check_split(3, 1, false).unwrap_err().contains("batch"));
        assert!(c.check_split(1, 8, false).unwrap_err().contains("heads"));
        let seq = Gpt2Config {
            seq: 6,
            ..Gpt2Config::default()
        };
        assert!(seq.check_split(1, 4, false).is_ok());
        assert!(seq.check_split(1, 4, true).unwrap_err().contains("seq 6"));
        let odd = Gpt2Config {
            hidden: 10,
            ..Gpt2Config::default()
        };
        assert!(odd.check_split(1, 1, false).unwrap_err().contains("hidden"));
        let huge = Gpt2Config {
            vocab: usize::MAX / 2,
            ..Gpt2Config::default()
        };
        assert!(huge
            .check_split(1, 1, false)
            .unwrap_err()
            .contains("elements"));
        let zero = Gpt2Config {
            ffn: 0,
            ..Gpt2Config::default()
        };
        assert!(zero.check_split(1, 1, false).unwrap_err().contains("ffn"));
    }

    #[test]
    fn params_are_laid_out_megatron_style() {
        let c = Gpt2Config::default();
        let ps = c.params();
        assert_eq!(ps.len(), 2 + 16 * c.layers + 2);
        let get = |n: &str| ps.iter().find(|p| p.name == n).unwrap().clone();
        assert_eq!(get("bq_0").tp, TpLayout::Shard(0));
        assert_eq!(get("fc1_b_1").local_shape(4), vec![16]);
        assert_eq!(get("wo_0").tp, TpLayout::Shard(1));
        // Row-parallel biases and every LayerNorm are replicated.
        for n in [
            "bo_0", "fc2_b_0", "ln1_w_0", "ln2_b_1", "lnf_w", "wte", "wpe",
        ] {
            assert_eq!(get(n).tp, TpLayout::Replicate, "{n}");
        }
    }

    fn plan(dp: usize, tp: usize, tp_rank: usize, sp: bool) -> RankPlan {
        RankPlan {
            dp,
            tp,
            tp_rank,
            sequence_parallel: sp,
            tp_comm_overlap: false,
        }
    }

    #[test]
    fn graphs_have_the_expected_outputs_and_collectives() {
        let c = Gpt2Config::default();
        let spec = build(&c, RankPlan::SPEC, false, None);
        let names: Vec<&str> = spec.outputs().iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names[0], "loss");
        assert_eq!(names.len(), 1 + c.params().len());
        let text = spec.render();
        assert!(
            !text.contains("_c10d_functional"),
            "the spec has no collectives"
        );
        assert!(text.contains("aten.native_layer_norm_backward.default"));
        assert!(text.contains("aten.gelu_backward.default"));
        // Plain tp: per layer two forward and two backward all-reduces over tp.
        let count = |t: &str, what: &str| t.matches(what).count();
        let tp2 = build(&c, plan(1, 2, 0, false), false, None).render();
        assert_eq!(count(&tp2, "'tp')"), 4 * c.layers);
        // SP: no all-reduce of activations; LayerNorm (2 per layer + final, weight and bias)
        // and row-parallel bias (2 per layer) gradients all-reduced over tp.
        let sp = build(&c, plan(1, 2, 1, true), false, None).render();
        assert_eq!(
            count(&sp, "all_reduce.default("),
            2 * (2 * c.layers + 1) + 2 * c.layers
        );
        let bug = build(
            &c,
            plan(1, 2, 1, true),
            false,
            Some(Mutation::SpLayernormGradNotReduced),
        )
        .render();
        assert_eq!(count(&bug, "all_reduce.default("), 2 * c.layers);
        // The rank's chunk, or the next one under the planted bug.
        assert!(sp.contains("aten.slice.Tensor(add, 0, 4, 8)"), "{sp}");
        let wrong = build(
            &c,
            plan(1, 2, 1, true),
            true,
            Some(Mutation::SpScatterWrongChunk),
        )
        .render();
        assert!(wrong.contains("aten.slice.Tensor(add, 0, 0, 4)"), "{wrong}");
        let fw = build(&c, plan(2, 2, 0, true), true, None);
        assert_eq!(fw.outputs().len(), 1);
    }

    #[test]
    fn cp_ranks_read_their_chunks_positions_and_ring() {
        let c = Gpt2Config::default();
        // cp rank 1 of 2 (global rank 1, tp = 1): chunks 1 and 2 of 4, positions 2..6.
        let cp = CpPlan { cp: 2, cp_rank: 1 };
        let g = build_cp(&c, plan(1, 1, 0, false), &cp, false, None);
        let names: Vec<&str> = g.outputs().iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names.len(), 1 + c.params().len());
        let text = g.render();
        for want in [
            "aten.slice.Tensor(tokens, 1, 2, 4)",
            "aten.slice.Tensor(tokens, 1, 4, 6)",
            "aten.arange.start(2, 4,",
            "aten.arange.start(4, 6,",
            "aten.logsumexp.default(",
            "'cp')",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        // Per layer K and V forward, K and V backward and their gradients: 4 sends and 4
        // receives each way on a ring of 2.
        let sends = text.matches("shardproof_p2p.send.default(").count();
        assert_eq!(sends, 8 * c.layers, "{text}");
        // The planted missing offset looks the position table up at 0..4.
        let bug = build_cp(
            &c,
            plan(1, 1, 0, false),
            &cp,
            true,
            Some(Mutation::CpRopeNoOffset),
        )
        .render();
        assert!(bug.contains("aten.arange.start(0, 4,"), "{bug}");
    }
}
