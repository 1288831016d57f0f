//! The `deepseek` model: a DeepSeek-V3 style mixture-of-experts decoder. Embedding, attention,
//! norms, LM head and cross-entropy are the llama model's (RMSNorm, RoPE, grouped-query causal
//! attention); each layer's MLP is a MoE block: a router (linear to the experts, sigmoid
//! scores, top-k selection, gate weights normalized over the selected experts), the routed
//! SwiGLU experts weighted by their gates, one shared SwiGLU expert always applied, and
//! DeepSeek-V3's sequence-wise auxiliary load-balancing loss added to the cross-entropy.
//!
//! **Routing is dense.** Every expert runs on every token and its output is weighted by a
//! `[tokens, experts]` gate matrix that is zero for unselected experts (built from the top-k
//! indices with `scatter`). Shapes then stay static and equal on every rank — no capacity
//! factor and no dropped tokens, so the distributed plan computes exactly what the spec does
//! — at the price of `experts / top_k` times the expert FLOPs, irrelevant at zoo sizes.
//!
//! **Parallelism.** `dp` and `ep` both split the batch (Megatron's expert parallelism is carved
//! out of data parallelism: attention, router and shared expert are replicated over dp x ep,
//! their gradients averaged over it). `ep` also splits the stacked expert weights
//! `[experts, ...]` along the experts. Tokens reach the experts' owners by Megatron's
//! all-gather dispatcher: the MoE inputs and gates are all-gathered over `ep`, each rank runs
//! its own experts on the tokens of the whole ep group, and a reduce-scatter over `ep` sums
//! the experts' contributions and hands every rank its own tokens back. Or, with
//! [`EpDispatch::AllToAll`] (`--ep-dispatch alltoall`), by Megatron's all-to-all dispatcher:
//! with dense routing every token visits every expert rank, so one `all_to_all_single` with
//! equal static splits sends every peer the rank's tokens (and the gate columns of the peer's
//! experts), and the combine, a second one, sends each token's partial outputs from the rank's
//! experts back to the token's owner, which sums them over the ep group; the backward runs the
//! same all-to-alls the other way. (The all-gather dispatcher is the default: all-gather and
//! reduce-scatter are what the refinement engine reasons about.) Expert gradients are summed over the expert-data-parallel
//! group (`dp`) and divided by the whole data-parallel size `dp * ep`, as Megatron scales them.
//! `tp` is Megatron tensor parallelism: attention and shared expert as in llama, the routed
//! experts' inner width split too (expert tensor parallelism), the router replicated. The
//! gates multiply the experts' partial outputs before the block's all-reduce, so the router's
//! gradient is a partial sum over tp: it is all-reduced over tp (Megatron's router gradient
//! sync), and the auxiliary loss, whose gradient every tp rank computes in full, is divided by
//! tp so that this sum counts it once (Entangle's scaling rule); the forward sums the tp
//! ranks' shares of it back.
//!
//! **Sequence parallelism in the MoE blocks** (`--sequence-parallel`, tp >= 2): attention stays
//! llama's tensor parallelism (its output replicated over tp); each MoE block takes the rank's
//! sequence chunk of its input (positions `[tp_rank * s/tp, (tp_rank + 1) * s/tp)` of every
//! sequence), routes it and runs the experts on it, the shared and the routed experts
//! replicated over tp (split over ep as ever), and all-gathers the chunks' outputs along the
//! sequence back to the replicated stream; the backward takes the rank's chunk of the output
//! gradient and all-gathers the chunks' input gradients. The balance loss's per-sequence
//! counts and probability sums are all-reduced over tp, so every tp rank computes the whole
//! loss (no share). The router's and the experts' gradients, each rank's from its chunk, are
//! all-reduced over tp (the router's is Megatron-LM #599's missing sync under SP).

use crate::bugs::Mutation;
use crate::cp::{self, CpPlan};
use crate::graph::{Arg, GraphBuilder, Val};
use crate::llama::{
    attention, attention_backward, attn_tables_cp, check_at_least_one, check_divisible,
    check_tensor_sizes, cross_entropy, embedding, embedding_backward, linear, lm_head,
    lm_head_backward, reduce_if, rms_norm, rms_norm_backward, rms_norm_stat, swiglu,
    swiglu_backward, AttnSaved, AttnShape, AttnTables, NormSaved, SwigluNames, SwigluSaved,
    MAX_ELEMENTS,
};
use crate::{LlamaConfig, Param, TpLayout};
use std::collections::BTreeMap;

/// The sizes of the DeepSeek-style MoE model.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepseekConfig {
    /// The sizes it shares with the llama model: hidden, heads, kv_heads, layers, seq, batch,
    /// vocab, lr, eps; `ffn` is the inner width of the shared expert.
    pub base: LlamaConfig,
    /// Inner width of each routed expert.
    pub moe_ffn: usize,
    /// Number of routed experts.
    pub experts: usize,
    /// Experts selected per token.
    pub top_k: usize,
    /// Weight of the auxiliary load-balancing loss.
    pub aux_alpha: f64,
}

impl Default for DeepseekConfig {
    /// The `tiny` size: 4 experts of which 2 per token, a batch that splits 4 ways.
    fn default() -> Self {
        DeepseekConfig {
            base: LlamaConfig {
                ffn: 16,
                batch: 4,
                ..LlamaConfig::default()
            },
            moe_ffn: 8,
            experts: 4,
            top_k: 2,
            aux_alpha: 0.01,
        }
    }
}

/// The shared expert's weights.
const SHARED_EXPERT: SwigluNames = ["shared_gate", "shared_up", "shared_down"];

/// The stacked routed-expert weights (split over `ep` on dim 0).
const ROUTED_EXPERTS: SwigluNames = ["expert_gate", "expert_up", "expert_down"];

impl DeepseekConfig {
    /// The parameters in graph order: llama's, with each layer's MLP replaced by the router
    /// `[experts, hidden]` (replicated), the shared expert (`shared_gate`/`shared_up` column
    /// parallel, `shared_down` row parallel) and the stacked routed experts `expert_gate` /
    /// `expert_up` `[experts, moe_ffn, hidden]` and `expert_down` `[experts, hidden, moe_ffn]`
    /// (their inner width split over tp, their experts over ep: see [`Self::is_expert`]).
    pub fn params(&self, tp: usize) -> Vec<Param> {
        let (h, e, f) = (self.base.hidden, self.experts, self.moe_ffn);
        let p = |name: String, shape: Vec<usize>, tp| Param { name, shape, tp };
        let mut out = Vec::new();
        for param in self.base.params(tp, false) {
            let layer = |prefix: &str| param.name.strip_prefix(prefix).map(str::to_string);
            if let Some(l) = layer("w_gate_") {
                out.push(p(format!("router_{l}"), vec![e, h], TpLayout::Replicate));
                out.push(Param {
                    name: format!("shared_gate_{l}"),
                    ..param
                });
            } else if let Some(l) = layer("w_up_") {
                out.push(Param {
                    name: format!("shared_up_{l}"),
                    ..param
                });
            } else if let Some(l) = layer("w_down_") {
                out.push(Param {
                    name: format!("shared_down_{l}"),
                    ..param
                });
                out.push(p(
                    format!("expert_gate_{l}"),
                    vec![e, f, h],
                    TpLayout::Shard(1),
                ));
                out.push(p(
                    format!("expert_up_{l}"),
                    vec![e, f, h],
                    TpLayout::Shard(1),
                ));
                out.push(p(
                    format!("expert_down_{l}"),
                    vec![e, h, f],
                    TpLayout::Shard(2),
                ));
            } else {
                out.push(param);
            }
        }
        out
    }

    /// The parameters under sequence parallelism in the MoE blocks: [`Self::params`] with the
    /// shared expert replicated over tp, and the routed experts too when `experts_replicated`
    /// (the correct plan; the planted `moe-experts-sharded-under-sp` keeps them split).
    pub fn params_sp(&self, tp: usize, experts_replicated: bool) -> Vec<Param> {
        let mut params = self.params(tp);
        for p in &mut params {
            let shared = p.name.starts_with("shared_");
            if shared || (experts_replicated && Self::is_expert(&p.name)) {
                p.tp = TpLayout::Replicate;
            }
        }
        params
    }

    /// The parameters of the plan `plan` with the planted `bug`.
    pub fn plan_params(&self, plan: &RankPlan, bug: Option<Mutation>) -> Vec<Param> {
        if plan.sequence_parallel && plan.tp > 1 {
            self.params_sp(plan.tp, bug != Some(Mutation::MoeExpertsShardedUnderSp))
        } else {
            self.params(plan.tp)
        }
    }

    /// Whether `name` is a stacked routed-expert weight, split along dim 0 over `ep`.
    pub fn is_expert(name: &str) -> bool {
        ROUTED_EXPERTS
            .iter()
            .any(|p| name.strip_prefix(p).is_some_and(|l| l.starts_with('_')))
    }

    /// The shape a rank of a `tp` x `ep` plan holds of `param`.
    pub fn local_shape(param: &Param, tp: usize, ep: usize) -> Vec<usize> {
        let mut shape = param.local_shape(tp);
        if Self::is_expert(&param.name) {
            shape[0] /= ep;
        }
        shape
    }

    /// Why these sizes cannot be split `dp` x `tp` x `ep` ways, if they cannot.
    pub fn check_split(&self, dp: usize, tp: usize, ep: usize) -> Result<(), String> {
        check_at_least_one(&[
            ("moe_ffn", self.moe_ffn),
            ("experts", self.experts),
            ("top_k", self.top_k),
        ])?;
        if !self.aux_alpha.is_finite() {
            return Err(format!("aux_alpha {} is not finite", self.aux_alpha));
        }
        if self.base.batch != 0 {
            check_divisible("batch", self.base.batch, "dp x ep", dp * ep)?;
        }
        // Also checks the shared sizes, and the shared expert's width against tp.
        self.base.check_split(dp * ep, tp, false)?;
        let tokens = self.base.batch * self.base.seq;
        let width = self.moe_ffn.max(self.base.hidden);
        check_tensor_sizes(
            &[
                vec![self.experts, tokens, width],
                vec![tokens, self.experts],
            ],
            MAX_ELEMENTS,
        )?;
        if self.top_k > self.experts {
            return Err(format!(
                "top_k {} exceeds the {} experts",
                self.top_k, self.experts
            ));
        }
        check_divisible("experts", self.experts, "ep", ep)?;
        check_divisible("moe_ffn", self.moe_ffn, "tp", tp)?;
        check_divisible("kv_heads", self.base.kv_heads, "tp", tp)
            .map_err(|e| format!("{e} (the deepseek model does not replicate kv heads over tp)"))
    }
}

/// How tokens reach the ranks of their experts under expert parallelism, and the experts'
/// outputs come back (`zoo emit --ep-dispatch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EpDispatch {
    /// Megatron's all-gather dispatcher: the MoE input and the gates are all-gathered over
    /// `ep`, each rank slices its experts' gate columns, and a reduce-scatter over `ep` sums the
    /// experts' outputs and returns each rank its own tokens.
    #[default]
    AllGather,
    /// Megatron's all-to-all dispatcher: `all_to_all_single` over `ep` sends each peer the
    /// rank's tokens and the gate columns of the peer's experts; a second one sends each
    /// token's partial outputs from the rank's experts back to the token's owner, which sums
    /// them over the ep group.
    AllToAll,
}

impl EpDispatch {
    /// The dispatchers by their `--ep-dispatch` names.
    pub const ALL: [(&'static str, EpDispatch); 2] = [
        ("allgather", EpDispatch::AllGather),
        ("alltoall", EpDispatch::AllToAll),
    ];

    /// The dispatcher named `name` (`allgather` or `alltoall`).
    pub fn parse(name: &str) -> Result<EpDispatch, String> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, d)| d)
            .ok_or_else(|| {
                crate::suggest::unknown(
                    "ep dispatcher",
                    name,
                    Self::ALL.iter().map(|(n, _)| *n),
                    "shardproof zoo emit --help",
                )
            })
    }

    /// Its `--ep-dispatch` name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, d)| *d == self)
            .map_or("allgather", |(n, _)| n)
    }
}

/// The rank a graph is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankPlan {
    /// Size of the dp mesh dim.
    pub dp: usize,
    /// Size of the tp mesh dim.
    pub tp: usize,
    /// Size of the ep mesh dim.
    pub ep: usize,
    /// The rank's index along ep: it holds experts `[ep_rank * E / ep, (ep_rank + 1) * E / ep)`.
    pub ep_rank: usize,
    /// The rank's index along tp (the graphs differ by it only under the planted
    /// `norm-sharded-hidden`).
    pub tp_rank: usize,
    /// How tokens reach the experts over `ep` (irrelevant without it).
    pub dispatch: EpDispatch,
    /// Sequence parallelism in the MoE blocks (tp >= 2): each tp rank routes and runs the
    /// experts (replicated over tp) on its sequence chunk, and the chunks' outputs are
    /// all-gathered along the sequence.
    pub sequence_parallel: bool,
    /// Context parallelism: where the rank sits on the cp mesh dim ([`CpPlan::NONE`] without
    /// one).
    pub cp: CpPlan,
}

impl RankPlan {
    /// The single-device spec.
    pub const SPEC: RankPlan = RankPlan {
        dp: 1,
        tp: 1,
        ep: 1,
        ep_rank: 0,
        tp_rank: 0,
        dispatch: EpDispatch::AllGather,
        sequence_parallel: false,
        cp: CpPlan::NONE,
    };

    /// The process group over which the replicated (non-expert) parameters' gradients and the
    /// loss are averaged, and its size: every rank holding other tokens of the batch
    /// (`dp_ep`, declared by the case file, when both dims are split; with context
    /// parallelism the cp ranks too: `cp`, `dp_cp`, `cp_ep`, `dp_cp_ep`).
    pub fn data_group(&self) -> (&'static str, usize) {
        let cp = self.cp.cp;
        let size = self.dp * cp * self.ep;
        let name = match (self.dp > 1, cp > 1, self.ep > 1) {
            (true, true, true) => "dp_cp_ep",
            (false, true, true) => "cp_ep",
            (true, true, false) => "dp_cp",
            (false, true, false) => "cp",
            (true, false, true) => "dp_ep",
            (false, false, true) => "ep",
            _ => "dp",
        };
        (name, size)
    }

    /// The balance losses `aux` summed over the tp ranks' shares (under sequence parallelism
    /// each tp rank computed the whole).
    pub(crate) fn aux_over_tp(&self, g: &mut GraphBuilder, aux: &Val) -> Val {
        if self.sequence_parallel && self.tp > 1 {
            aux.clone()
        } else {
            reduce_if(g, aux, "tp", self.tp)
        }
    }

    /// The reported loss: the rank's cross-entropy `ce` plus the balance losses `aux`,
    /// averaged over the [data group](Self::data_group).
    pub(crate) fn loss(&self, g: &mut GraphBuilder, ce: &Val, aux: &Val) -> Val {
        let (group, size) = self.data_group();
        let local_name = if size > 1 { "local_loss" } else { "loss" };
        let local = g.binary(local_name, "aten.add.Tensor", ce, aux);
        if size > 1 {
            let total = g.all_reduce_sum(&local, group);
            g.div_scalar("loss", &total, Arg::I(size as i64))
        } else {
            local
        }
    }

    /// The expert-data-parallel group over which an expert's gradient is summed (its replicas:
    /// the ranks of the same tp and ep index), and its size.
    pub(crate) fn expert_data_group(&self) -> (&'static str, usize) {
        match (self.dp > 1, self.cp.cp > 1) {
            (true, true) => ("dp_cp", self.dp * self.cp.cp),
            (false, true) => ("cp", self.cp.cp),
            _ => ("dp", self.dp),
        }
    }
}

/// What the backward of a MoE block reads from its forward.
pub(crate) struct MoeSaved {
    /// The block input `[t, h]`.
    x2d: Val,
    scores: Val,
    top_idx: Val,
    top_sum: Val,
    top_gates: Val,
    /// `[t, E]` zeros the top-k gradients are scattered into.
    zeros: Val,
    probs: Val,
    score_sum: Val,
    /// Tokens per sequence routed to each expert, `[b, E]`.
    counts: Val,
    /// The rank's experts' gates `[El, N, 1]`.
    gate_cols: Val,
    /// The rank's experts, run on the block input gathered over ep and expanded over them
    /// (`[El, N, h]`).
    experts: SwigluSaved,
    out: Val,
    shared: SwigluSaved,
}

/// Everything one rank's MoE blocks need to know besides their input.
pub(crate) struct MoeCtx<'a> {
    pub(crate) cfg: &'a DeepseekConfig,
    pub(crate) plan: RankPlan,
    /// The rank's sequences (of a microbatch under pipeline parallelism).
    pub(crate) b: usize,
    pub(crate) bug: Option<Mutation>,
    /// The microbatches whose losses the rank averages (1 without pipeline parallelism): the
    /// gradient seed of each microbatch's balance loss is `1 / microbatches`.
    pub(crate) microbatches: usize,
}

impl MoeCtx<'_> {
    /// The rank's experts.
    fn local_experts(&self) -> usize {
        self.cfg.experts / self.plan.ep
    }

    /// The divisor of the auxiliary loss: tp (each tp rank adds its share), 1 under the
    /// planted `moe-aux-loss-not-divided-by-tp`.
    fn aux_divisor(&self) -> usize {
        if self.bug == Some(Mutation::MoeAuxLossNotDividedByTp) || self.sp() {
            1
        } else {
            self.plan.tp
        }
    }

    /// Sequence parallelism in the MoE blocks: every tp rank computes the whole auxiliary
    /// loss (its counts and probability sums all-reduced over tp), so it is not shared.
    fn sp(&self) -> bool {
        self.plan.sequence_parallel && self.plan.tp > 1
    }

    /// The factor of the sequence-wise auxiliary loss on the sum over sequences and experts of
    /// `count * probability sum`: `alpha * E / (k * s^2)` per sequence, averaged over the
    /// rank's `b` sequences.
    fn aux_factor(&self) -> f64 {
        let c = self.cfg;
        let s = c.base.seq as f64;
        c.aux_alpha * c.experts as f64 / (c.top_k as f64 * s * s)
    }
}

/// `x / sum(x, -1)` given that sum: the backward for the gradient `grad` of the normalized
/// `normalized`, `(grad - sum(grad * normalized, -1)) / sum`.
fn normalize_backward(g: &mut GraphBuilder, grad: &Val, normalized: &Val, sum: &Val) -> Val {
    let gn = g.mul(grad, normalized);
    let dot = g.sum_dims(&gn, &[1], true);
    let centered = g.sub("sub", grad, &dot);
    g.binary("div", "aten.div.Tensor", &centered, sum)
}

/// The rank's sequence chunk of token rows `x` `[b * s, h]` (batch-major): positions
/// `[c * s/tp, (c + 1) * s/tp)` of every sequence, `[b * s/tp, h]`.
fn seq_chunk(g: &mut GraphBuilder, x: &Val, b: usize, tp: usize, c: usize) -> Val {
    let (t, h) = (x.shape[0], x.shape[1]);
    let (s, sl) = (t / b, t / b / tp);
    let seqs = g.view(x, &[b, s, h]);
    let chunk = g.slice(&seqs, 1, c * sl, (c + 1) * sl);
    let chunk = g.contiguous(&chunk);
    g.view(&chunk, &[b * sl, h])
}

/// The inverse of [`seq_chunk`] over the tp group: the ranks' chunks `[b * s/tp, h]`
/// all-gathered along the sequence (moved to dim 0 for the gather) into `[b * s, h]`.
fn seq_gather(g: &mut GraphBuilder, x: &Val, b: usize, tp: usize) -> Val {
    let (tl, h) = (x.shape[0], x.shape[1]);
    let sl = tl / b;
    let seqs = g.view(x, &[b, sl, h]);
    let seq_first = g.permute(&seqs, &[1, 0, 2]);
    let seq_first = g.contiguous(&seq_first);
    let gathered = g.all_gather(&seq_first, tp, "tp");
    let batch_first = g.permute(&gathered, &[1, 0, 2]);
    let batch_first = g.contiguous(&batch_first);
    g.view(&batch_first, &[b * sl * tp, h])
}

/// `x` `[t, c]` repeated `n` times along dim 0 (`[n * t, c]`: a copy for each member of an
/// all-to-all).
fn repeat_rows(g: &mut GraphBuilder, x: &Val, n: usize) -> Val {
    let (t, c) = (x.shape[0], x.shape[1]);
    let row = g.unsqueeze(x, 0);
    let copies = g.expand(&row, &[n, t, c]);
    let copies = g.contiguous(&copies);
    g.view(&copies, &[n * t, c])
}

/// The sum of the `n` dim-0 chunks of `x` `[n * t, c]` (the backward of [`repeat_rows`]).
fn sum_chunks(g: &mut GraphBuilder, x: &Val, n: usize) -> Val {
    let (t, c) = (x.shape[0] / n, x.shape[1]);
    let chunks = g.view(x, &[n, t, c]);
    g.sum_dims(&chunks, &[0], false)
}

/// The gate matrix `[t, E]` rearranged for an all-to-all over `n` members: member `j`'s chunk
/// is the columns of its experts, `[j * E/n, (j + 1) * E/n)` (`[n * t, E/n]`).
fn columns_by_peer(g: &mut GraphBuilder, gates: &Val, n: usize) -> Val {
    let (t, e) = (gates.shape[0], gates.shape[1]);
    let split = g.view(gates, &[t, n, e / n]);
    let by_peer = g.permute(&split, &[1, 0, 2]);
    let by_peer = g.contiguous(&by_peer);
    g.view(&by_peer, &[n * t, e / n])
}

/// The inverse of [`columns_by_peer`]: `[n * t, E/n]` whose chunk `j` holds the columns of
/// member `j`'s experts, back to `[t, E]`.
fn columns_from_peers(g: &mut GraphBuilder, x: &Val, n: usize) -> Val {
    let (t, el) = (x.shape[0] / n, x.shape[1]);
    let split = g.view(x, &[n, t, el]);
    let by_token = g.permute(&split, &[1, 0, 2]);
    let by_token = g.contiguous(&by_token);
    g.view(&by_token, &[t, n * el])
}

/// The MoE block of layer `l` on token rows `x2d` `[t, h]` (replicated over tp): the block
/// output `[t, h]` (all-reduced over tp), the rank's share of the layer's auxiliary loss, and
/// what the backward reads.
pub(crate) fn moe_block(
    g: &mut GraphBuilder,
    x_in: &Val,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    cx: &MoeCtx,
) -> (Val, Val, MoeSaved) {
    let (
        cfg,
        RankPlan {
            tp, ep, ep_rank, ..
        },
    ) = (cx.cfg, cx.plan);
    let sp = cx.sp();
    // Under SP the block runs on the rank's sequence chunk.
    let chunk;
    let x2d = if sp {
        chunk = seq_chunk(g, x_in, cx.b, tp, cx.plan.tp_rank);
        &chunk
    } else {
        x_in
    };
    let (t, h) = (x2d.shape[0], x2d.shape[1]);
    let (e, k, el, b) = (cfg.experts, cfg.top_k, cx.local_experts(), cx.b);
    let s = t / b;

    // Router: sigmoid scores, the top-k experts, their scores normalized to gates, scattered
    // into a dense [t, E] gate matrix (zero for experts not selected).
    let logits = linear(g, x2d, &w(&format!("router_{l}")));
    let scores = g.unary("sigmoid", "aten.sigmoid.default", &logits);
    let top = g.call_multi_typed(
        "topk",
        "aten.topk.default",
        &[Arg::V(&scores), Arg::I(k as i64)],
        &[("", "f32", vec![t, k]), ("", "i64", vec![t, k])],
    );
    let (top_vals, top_idx) = (top[0].clone(), top[1].clone());
    let top_sum = g.sum_dims(&top_vals, &[1], true);
    let top_gates = g.binary("div", "aten.div.Tensor", &top_vals, &top_sum);
    let zeros = g.full(&[t, e], 0.0);
    let gates = g.call(
        "scatter",
        "aten.scatter.src",
        &[
            Arg::V(&zeros),
            Arg::I(1),
            Arg::V(&top_idx),
            Arg::V(&top_gates),
        ],
        vec![t, e],
    );

    // Sequence-wise auxiliary loss (DeepSeek-V3): per sequence
    // alpha * sum_e f_e * P_e with f_e = E / (k * s) * (tokens routed to e) and P_e the mean
    // over the sequence of the scores normalized over the experts; mean over sequences.
    let selected = g.call(
        "scatter",
        "aten.scatter.value",
        &[Arg::V(&zeros), Arg::I(1), Arg::V(&top_idx), Arg::F(1.0)],
        vec![t, e],
    );
    let score_sum = g.sum_dims(&scores, &[1], true);
    let probs = g.binary("div", "aten.div.Tensor", &scores, &score_sum);
    let selected3 = g.view(&selected, &[b, s, e]);
    let counts = g.sum_dims(&selected3, &[1], false);
    let probs3 = g.view(&probs, &[b, s, e]);
    let prob_sums = g.sum_dims(&probs3, &[1], false);
    // Under SP each rank counts its chunk's positions: the sums over the sequence are
    // all-reduced over tp, and every tp rank computes the whole loss.
    let (counts, prob_sums) = if sp {
        (
            g.all_reduce_sum(&counts, "tp"),
            g.all_reduce_sum(&prob_sums, "tp"),
        )
    } else {
        (counts, prob_sums)
    };
    // Under CP each rank holds two chunks of every sequence: the same, over cp.
    let (counts, prob_sums) = if cx.plan.cp.is_ring() {
        (
            g.all_reduce_sum(&counts, "cp"),
            g.all_reduce_sum(&prob_sums, "cp"),
        )
    } else {
        (counts, prob_sums)
    };
    let balance = g.mul(&counts, &prob_sums);
    let per_seq = g.sum_dims(&balance, &[1], false);
    let mean = g.mean("mean", &per_seq);
    let aux = g.mul_scalar("aux_loss", &mean, Arg::F(cx.aux_factor()));
    let aux = match cx.aux_divisor() {
        1 => aux,
        by => g.div_scalar("aux_share", &aux, Arg::I(by as i64)),
    };

    // Routed experts: the rank's experts on every token of the ep group, weighted by their
    // gate columns, summed. All-gather dispatcher: the tokens and gates gathered over ep,
    // the rank's gate columns sliced; the reduce-scatter sums over the ep group's experts and
    // returns the rank's own tokens. All-to-all dispatcher: each peer is sent the rank's
    // tokens and the gate columns of its experts; the combine sends each token's partial
    // outputs back to its owner, which sums them over the ep group.
    let a2a = ep > 1 && cx.plan.dispatch == EpDispatch::AllToAll;
    let (x_all, local_gates) = if a2a {
        let x_send = repeat_rows(g, x2d, ep);
        let gates_send = columns_by_peer(g, &gates, ep);
        (
            g.all_to_all(&x_send, ep, "ep"),
            g.all_to_all(&gates_send, ep, "ep"),
        )
    } else if ep > 1 {
        let x_all = g.all_gather(x2d, ep, "ep");
        let gates_all = g.all_gather(&gates, ep, "ep");
        let local_gates = g.slice(&gates_all, 1, ep_rank * el, (ep_rank + 1) * el);
        (x_all, local_gates)
    } else {
        (x2d.clone(), gates.clone())
    };
    let n = x_all.shape[0];
    let x_row = g.unsqueeze(&x_all, 0);
    let xb = g.expand(&x_row, &[el, n, h]);
    let (out, experts) = swiglu(g, &xb, w, ROUTED_EXPERTS, l);
    let gates_t = g.transpose(&local_gates, 0, 1);
    let gate_cols = g.unsqueeze(&gates_t, 2);
    let weighted = g.mul(&out, &gate_cols);
    let routed_all = g.sum_dims(&weighted, &[0], false);
    let routed = if a2a {
        let back = g.all_to_all(&routed_all, ep, "ep");
        sum_chunks(g, &back, ep)
    } else if ep > 1 {
        g.reduce_scatter_sum(&routed_all, ep, "ep")
    } else {
        routed_all
    };

    // The shared expert, then one all-reduce over tp for both (their partial sums).
    let (shared_out, shared) = swiglu(g, x2d, w, SHARED_EXPERT, l);
    let combined = g.add(&routed, &shared_out);
    let out_full = if sp {
        seq_gather(g, &combined, b, tp)
    } else {
        reduce_if(g, &combined, "tp", tp)
    };
    let saved = MoeSaved {
        x2d: x2d.clone(),
        scores,
        top_idx,
        top_sum,
        top_gates,
        zeros,
        probs,
        score_sum,
        counts,
        gate_cols,
        experts,
        out,
        shared,
    };
    (out_full, aux, saved)
}

/// The backward of [`moe_block`] for the gradient `g_out` `[t, h]` of its output (replicated
/// over tp) and a gradient of 1 on the rank's auxiliary-loss share: inserts the gradients of
/// layer `l`'s router, shared and routed experts into `grads` and returns the gradient of the
/// block input (all-reduced over tp).
pub(crate) fn moe_block_backward(
    g: &mut GraphBuilder,
    g_out: &Val,
    sv: &MoeSaved,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    cx: &MoeCtx,
    grads: &mut BTreeMap<String, Val>,
) -> Val {
    let (
        cfg,
        RankPlan {
            tp, ep, ep_rank, ..
        },
    ) = (cx.cfg, cx.plan);
    let (t, h) = (sv.x2d.shape[0], sv.x2d.shape[1]);
    let (e, el, b) = (cfg.experts, cx.local_experts(), cx.b);
    let s = t / b;

    // Under SP the block's output was gathered from the ranks' chunks for a replicated
    // consumer: the rank's chunk of its gradient.
    let sp = cx.sp();
    let chunk;
    let g_out = if sp {
        chunk = seq_chunk(g, g_out, b, tp, cx.plan.tp_rank);
        &chunk
    } else {
        g_out
    };

    // Shared expert.
    let g_x_shared = swiglu_backward(g, g_out, &sv.shared, w, SHARED_EXPERT, l, grads);

    // Routed experts: the reduce-scatter's backward is an all-gather over ep; the combine
    // all-to-all's is an all-to-all of the gradient of every received partial (the output
    // gradient, repeated: they were summed).
    let a2a = ep > 1 && cx.plan.dispatch == EpDispatch::AllToAll;
    let g_all = if a2a {
        let g_back = repeat_rows(g, g_out, ep);
        g.all_to_all(&g_back, ep, "ep")
    } else if ep > 1 {
        g.all_gather(g_out, ep, "ep")
    } else {
        g_out.clone()
    };
    let n = g_all.shape[0];
    let g_row = g.unsqueeze(&g_all, 0);
    let g_weighted = g.expand(&g_row, &[el, n, h]);
    let g_o = g.mul(&g_weighted, &sv.gate_cols);
    let g_gate_terms = g.mul(&g_weighted, &sv.out);
    let g_gate_cols = g.sum_dims(&g_gate_terms, &[2], false);
    let g_local_gates = g.transpose(&g_gate_cols, 0, 1);
    let g_xb = swiglu_backward(g, &g_o, &sv.experts, w, ROUTED_EXPERTS, l, grads);
    let g_x_all = g.sum_dims(&g_xb, &[0], false);
    // The all-gathers' backwards: reduce-scatters over ep (the gates zero-padded from the
    // rank's expert columns to all E first, the slice's backward).
    // The dispatch all-to-alls' backwards: all-to-alls back to the tokens' owners, the token
    // copies summed, the gate columns put back in expert order.
    let (g_x_routed, g_gates) = if a2a {
        let g_x_back = g.all_to_all(&g_x_all, ep, "ep");
        let g_gates_back = g.all_to_all(&g_local_gates, ep, "ep");
        (
            sum_chunks(g, &g_x_back, ep),
            columns_from_peers(g, &g_gates_back, ep),
        )
    } else if ep > 1 {
        let left = (ep_rank * el) as i64;
        let right = (e - (ep_rank + 1) * el) as i64;
        let padded = g.call(
            "constant_pad_nd",
            "aten.constant_pad_nd.default",
            &[
                Arg::V(&g_local_gates),
                Arg::Ints(vec![left, right]),
                Arg::F(0.0),
            ],
            vec![n, e],
        );
        (
            g.reduce_scatter_sum(&g_x_all, ep, "ep"),
            g.reduce_scatter_sum(&padded, ep, "ep"),
        )
    } else {
        (g_x_all, g_local_gates)
    };

    // Router: the gates' gradient through the selected scores (top-k's backward scatters it
    // back; the selection itself is piecewise constant), plus the auxiliary loss's through
    // the normalized probabilities.
    let g_top_gates = g.call(
        "gather",
        "aten.gather.default",
        &[Arg::V(&g_gates), Arg::I(1), Arg::V(&sv.top_idx)],
        vec![t, cfg.top_k],
    );
    let g_top_vals = normalize_backward(g, &g_top_gates, &sv.top_gates, &sv.top_sum);
    let g_scores_gates = g.call(
        "scatter",
        "aten.scatter.src",
        &[
            Arg::V(&sv.zeros),
            Arg::I(1),
            Arg::V(&sv.top_idx),
            Arg::V(&g_top_vals),
        ],
        vec![t, e],
    );
    let per_count = cx.aux_factor() / (b * cx.aux_divisor() * cx.microbatches) as f64;
    let g_prob_sums = g.mul_scalar("mul", &sv.counts, Arg::F(per_count));
    // Under CP the probability sums were all-reduced over cp and every cp rank's loss counts
    // the balance loss: the all-reduce's backward sums their gradients over cp.
    let g_prob_sums = if cx.plan.cp.is_ring() {
        g.all_reduce_sum(&g_prob_sums, "cp")
    } else {
        g_prob_sums
    };
    let g_prob_row = g.unsqueeze(&g_prob_sums, 1);
    let g_probs3 = g.expand(&g_prob_row, &[b, s, e]);
    let g_probs3 = g.contiguous(&g_probs3);
    let g_probs = g.view(&g_probs3, &[t, e]);
    let g_scores_aux = normalize_backward(g, &g_probs, &sv.probs, &sv.score_sum);
    let g_scores = g.add(&g_scores_gates, &g_scores_aux);
    let g_logits = g.call(
        "sigmoid_backward",
        "aten.sigmoid_backward.default",
        &[Arg::V(&g_scores), Arg::V(&sv.scores)],
        vec![t, e],
    );
    let g_logits_t = g.t(&g_logits);
    grads.insert(format!("router_{l}"), g.mm(&g_logits_t, &sv.x2d));
    let g_x_router = g.mm(&g_logits, &w(&format!("router_{l}")));

    let g_x = g.add(&g_x_shared, &g_x_routed);
    let g_x = g.add(&g_x, &g_x_router);
    if sp {
        // The chunks' gradients make up the replicated input's.
        seq_gather(g, &g_x, b, tp)
    } else {
        reduce_if(g, &g_x, "tp", tp)
    }
}

/// Builds the graph of one rank of the plan ([`RankPlan::SPEC`], no bug, is the spec). Ranks
/// differ only in the experts they hold (their ep index). Forward and loss (output `loss`:
/// cross-entropy plus the auxiliary losses of every layer), and unless `forward_only` the
/// explicit backward, gradient finalization (router gradients all-reduced over tp; replicated
/// parameters averaged over the data group, expert weights summed over dp and divided by
/// dp x ep) and an SGD step whose updated parameters are outputs `<param>_new`.
pub fn build(
    cfg: &DeepseekConfig,
    plan: RankPlan,
    forward_only: bool,
    bug: Option<Mutation>,
) -> GraphBuilder {
    let RankPlan { dp, tp, ep, .. } = plan;
    let base = &cfg.base;
    let mut g = GraphBuilder::new();
    let b = base.batch / (dp * ep);
    // Under context parallelism the rank holds s = seq / cp tokens of each sequence.
    let dims = AttnShape::new(base, b, tp).with_cp(plan.cp);
    let t = dims.tokens();
    let tokens_in = g.input_typed("tokens", "i64", &[b, base.seq]);
    let labels_in = g.input_typed("labels", "i64", &[b, base.seq]);
    let inv_freq = g.input("rope_inv_freq", &[dims.hd / 2]);
    let specs = cfg.plan_params(&plan, bug);
    let w = declare_weights(&mut g, &specs, tp, ep);
    let w = |name: &str| w[name].clone();
    let tokens = cp::select_chunks(&mut g, &tokens_in, &plan.cp);
    let labels = cp::select_chunks(&mut g, &labels_in, &plan.cp);
    // (The context-parallel attention bugs live in the tables: RoPE positions, ring masks.)
    let tables = attn_tables_cp(&mut g, &inv_freq, dims.s, &plan.cp, bug);
    let cx = MoeCtx {
        cfg,
        plan,
        b,
        bug,
        microbatches: 1,
    };

    let mut x = embedding(&mut g, &w("embed"), &tokens);
    let mut saved = Vec::new();
    let mut aux_total: Option<Val> = None;
    for l in 0..base.layers {
        let (hres, moe_out, aux, layer) = layer_forward(&mut g, &x, l, &w, dims, &tables, &cx);
        add_to_total(&mut g, &mut aux_total, aux);
        x = layer_output(&mut g, &hres, &moe_out, dims);
        saved.push(layer);
    }

    // LM head and the loss: cross-entropy (mean over the rank's tokens) plus the auxiliary
    // losses, whose tp ranks' shares are summed back.
    let (logits, head) = lm_head(&mut g, &x, &w, base.eps);
    let labels1 = g.view(&labels, &[t]);
    let ce = cross_entropy(&mut g, &logits, &labels1, "nll_loss");
    let aux_total = plan.aux_over_tp(&mut g, &aux_total.expect("at least one layer"));
    let loss = plan.loss(&mut g, ce.loss(), &aux_total);
    g.output(&loss);
    if forward_only {
        return g;
    }

    // Backward of the rank's local loss; data-parallel averaging happens on the gradients.
    let g_logits = ce.backward(&mut g);
    let (mut grads, mut gx) = lm_head_backward(&mut g, &g_logits, &head, &w, false);
    for (l, layer) in saved.iter().enumerate().rev() {
        gx = layer_backward(&mut g, &gx, layer, l, &w, dims, &tables, &cx, &mut grads);
    }
    grads.insert(
        "embed".into(),
        embedding_backward(&mut g, &gx, &tokens, base.vocab),
    );

    // Gradient finalization, then SGD.
    finalize(&mut g, &specs, &grads, &w, plan, bug, base.lr);
    g
}

/// Declares a graph input for each parameter of `specs`, of the rank's shape on a `tp` x `ep`
/// mesh; returns them by name.
pub(crate) fn declare_weights(
    g: &mut GraphBuilder,
    specs: &[Param],
    tp: usize,
    ep: usize,
) -> BTreeMap<String, Val> {
    specs
        .iter()
        .map(|p| {
            let val = g.input(&p.name, &DeepseekConfig::local_shape(p, tp, ep));
            (p.name.clone(), val)
        })
        .collect()
}

/// Adds `x` to the running sum `total` (which `x` starts when empty).
pub(crate) fn add_to_total(g: &mut GraphBuilder, total: &mut Option<Val>, x: Val) {
    *total = Some(match total.take() {
        None => x,
        Some(acc) => g.add(&acc, &x),
    });
}

/// What the backward of a decoder layer reads from its forward.
pub(crate) struct LayerSaved {
    attn: AttnSaved,
    mlp_norm: NormSaved,
    moe: MoeSaved,
}

/// Decoder layer `l` on `x` (`[b, s, h]`): attention with its residual, RMSNorm, the MoE
/// block. Returns the attention's residual stream, the MoE block's output `[t, h]` (the
/// layer's output is [`layer_output`] of the two), the rank's share of the layer's balance
/// loss and what the backward reads.
pub(crate) fn layer_forward(
    g: &mut GraphBuilder,
    x: &Val,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    dims: AttnShape,
    tables: &AttnTables,
    cx: &MoeCtx,
) -> (Val, Val, Val, LayerSaved) {
    let (plan, base) = (cx.plan, &cx.cfg.base);
    let (tp, h) = (plan.tp, base.hidden);
    let t = dims.tokens();
    let scope = g.begin_module(format!("layers.{l}.attention"), false);
    let (hres, attn) = attention(g, x, l, w, dims, tables, base.eps, None);
    g.end_module(scope, Some(&hres));
    let scope = g.begin_module(format!("layers.{l}.moe"), false);
    let norm_w = w(&format!("mlp_norm_{l}"));
    let (hn, mlp_norm) = if l == 0 && tp > 1 && cx.bug == Some(Mutation::NormShardedHidden) {
        // The mean of squares over the rank's tp shard of the hidden dim only.
        let (lo, hi) = (plan.tp_rank * h / tp, (plan.tp_rank + 1) * h / tp);
        let shard = g.slice(&hres, 2, lo, hi);
        rms_norm_stat(g, &hres, &shard, &norm_w, base.eps)
    } else {
        rms_norm(g, &hres, &norm_w, base.eps)
    };
    let hn2d = g.view(&hn, &[t, h]);
    let (moe_out, aux, moe) = moe_block(g, &hn2d, l, w, cx);
    g.end_module(scope, Some(&moe_out));
    (
        hres,
        moe_out,
        aux,
        LayerSaved {
            attn,
            mlp_norm,
            moe,
        },
    )
}

/// A decoder layer's output: the attention's residual stream `hres` plus the MoE block's
/// output `moe_out`.
pub(crate) fn layer_output(
    g: &mut GraphBuilder,
    hres: &Val,
    moe_out: &Val,
    dims: AttnShape,
) -> Val {
    let m3 = g.view(moe_out, &[dims.b, dims.s, hres.shape[2]]);
    g.add(hres, &m3)
}

/// The backward of decoder layer `l` from its output's gradient `gx` (the balance loss's
/// gradient seeded inside the MoE block, as Megatron's `MoEAuxLossAutoScaler` does); the
/// layer's gradients go into `grads`. Returns its input's gradient.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_backward(
    g: &mut GraphBuilder,
    gx: &Val,
    sv: &LayerSaved,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    dims: AttnShape,
    tables: &AttnTables,
    cx: &MoeCtx,
    grads: &mut BTreeMap<String, Val>,
) -> Val {
    let h = cx.cfg.base.hidden;
    let (b, s, t) = (dims.b, dims.s, dims.tokens());
    let scope = g.begin_module(format!("layers.{l}.moe"), true);
    let g_m2d = g.view(gx, &[t, h]);
    let g_hn2d = moe_block_backward(g, &g_m2d, &sv.moe, l, w, cx, grads);
    let g_hn = g.view(&g_hn2d, &[b, s, h]);
    let (g_hres_norm, g_mn) =
        rms_norm_backward(g, &g_hn, &w(&format!("mlp_norm_{l}")), &sv.mlp_norm);
    grads.insert(format!("mlp_norm_{l}"), g_mn);
    let g_hres = g.add(gx, &g_hres_norm);
    g.end_module(scope, Some(&g_hres));
    let scope = g.begin_module(format!("layers.{l}.attention"), true);
    let g_x = attention_backward(g, &g_hres, &sv.attn, l, w, dims, tables, grads, None);
    g.end_module(scope, Some(&g_x));
    g_x
}

/// Gradient finalization and SGD for the parameters `specs` of a rank of `plan`: the router's
/// gradients all-reduced over tp (and under SP the replicated experts'), replicated
/// parameters averaged over the data group, expert weights summed over their replicas and
/// divided by every rank holding other tokens; outputs `<param>_new`.
pub(crate) fn finalize(
    g: &mut GraphBuilder,
    specs: &[Param],
    grads: &BTreeMap<String, Val>,
    w: &dyn Fn(&str) -> Val,
    plan: RankPlan,
    bug: Option<Mutation>,
    lr: f64,
) {
    let is = |m: Mutation| bug == Some(m);
    let (tp, ep) = (plan.tp, plan.ep);
    let sp = plan.sequence_parallel && tp > 1;
    let (group, size) = plan.data_group();
    for p in specs {
        let mut grad = grads[&p.name].clone();
        let router = p.name.starts_with("router_");
        let moe_replicated = sp
            && p.tp == TpLayout::Replicate
            && (p.name.starts_with("shared_") || DeepseekConfig::is_expert(&p.name));
        if router && tp > 1 && !is(Mutation::MoeRouterGradUnsynced) {
            // The gates weighted the experts' partial sums over tp (under SP: each tp rank
            // routed its own chunk): so is their gradient.
            grad = g.all_reduce_sum(&grad, "tp");
        } else if moe_replicated {
            // Under SP the replicated experts saw the rank's chunk only.
            grad = g.all_reduce_sum(&grad, "tp");
        }
        let by = if DeepseekConfig::is_expert(&p.name) {
            // Each expert saw the tokens of its whole ep group: sum over its dp (and cp)
            // replicas, divide by every rank holding other tokens.
            let (experts, replicas) = plan.expert_data_group();
            if replicas > 1 {
                grad = g.all_reduce_sum(&grad, experts);
            }
            if is(Mutation::EpExpertGradNotAveraged) {
                replicas
            } else {
                replicas * ep
            }
        } else {
            if size > 1 {
                grad = g.all_reduce_sum(&grad, group);
            }
            size
        };
        if by > 1 {
            grad = g.div_scalar("div", &grad, Arg::I(by as i64));
        }
        // SGD: w_new = w - lr * grad.
        let step = g.mul_scalar("mul", &grad, Arg::F(lr));
        let new = g.sub(&format!("{}_new", p.name), &w(&p.name), &step);
        g.output(&new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dp-free plan, tp x ep.
    fn plan(tp: usize, ep: usize, ep_rank: usize) -> RankPlan {
        RankPlan {
            dp: 1,
            tp,
            ep,
            ep_rank,
            tp_rank: 0,
            dispatch: EpDispatch::AllGather,
            sequence_parallel: false,
            cp: CpPlan::NONE,
        }
    }

    #[test]
    fn bad_sizes_are_refused() {
        let c = DeepseekConfig::default();
        let fitting = [(1, 1, 1), (2, 2, 1), (1, 1, 2), (2, 2, 2), (1, 2, 4)];
        assert!(fitting
            .iter()
            .all(|&(dp, tp, ep)| c.check_split(dp, tp, ep).is_ok()));
        let err = |c: &DeepseekConfig, dp, tp, ep| c.check_split(dp, tp, ep).unwrap_err();
        assert!(err(&c, 1, 1, 3).contains("dp x ep"));
        assert!(err(&c, 2, 1, 4).contains("dp x ep"));
        let six = DeepseekConfig {
            experts: 6,
            ..c.clone()
        };
        assert!(
            err(&six, 1, 1, 4).contains("experts 6"),
            "{}",
            err(&six, 1, 1, 4)
        );
        let k = DeepseekConfig {
            top_k: 5,
            ..c.clone()
        };
        assert!(err(&k, 1, 1, 1).contains("top_k 5"));
        let zero = DeepseekConfig {
            experts: 0,
            ..c.clone()
        };
        assert!(err(&zero, 1, 1, 1).contains("experts must be"));
        let ffn = DeepseekConfig {
            moe_ffn: 6,
            ..c.clone()
        };
        assert!(err(&ffn, 1, 4, 1).contains("moe_ffn 6"));
        assert!(err(&c, 1, 4, 1).contains("kv_heads"));
        let huge = DeepseekConfig {
            experts: usize::MAX / 4,
            ..c.clone()
        };
        assert!(err(&huge, 1, 1, 1).contains("elements"));
    }

    #[test]
    fn params_and_local_shapes() {
        let c = DeepseekConfig::default();
        let params = c.params(2);
        let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            &names[6..14],
            &[
                "mlp_norm_0",
                "router_0",
                "shared_gate_0",
                "shared_up_0",
                "shared_down_0",
                "expert_gate_0",
                "expert_up_0",
                "expert_down_0"
            ]
        );
        let find = |n: &str| params.iter().find(|p| p.name == n).unwrap();
        assert_eq!(
            DeepseekConfig::local_shape(find("expert_down_1"), 2, 2),
            vec![2, 16, 4]
        );
        assert_eq!(
            DeepseekConfig::local_shape(find("router_1"), 2, 2),
            vec![4, 16]
        );
        assert_eq!(
            DeepseekConfig::local_shape(find("shared_up_0"), 2, 2),
            vec![8, 16]
        );
    }

    #[test]
    fn graphs_have_the_expected_collectives() {
        let c = DeepseekConfig::default();
        let spec = build(&c, RankPlan::SPEC, false, None).render();
        assert!(
            !spec.contains("_c10d_functional"),
            "the spec has no collectives"
        );
        assert!(spec.contains("aten.topk.default(sigmoid, 2)"), "{spec}");
        let r1 = build(&c, plan(1, 2, 1), false, None).render();
        // Per layer: gathers of the input and gates (forward) and of the output gradient;
        // reduce-scatters of the output, the input gradient and the gate gradient.
        assert_eq!(
            r1.matches("all_gather_into_tensor.default(").count(),
            3 * c.base.layers
        );
        assert_eq!(
            r1.matches("reduce_scatter_tensor.default(").count(),
            3 * c.base.layers
        );
        assert!(
            r1.contains("aten.slice.Tensor(wait_tensor_1, 1, 2, 4)"),
            "{r1}"
        );
        assert!(r1.contains("constant_pad_nd.default(transpose_"), "{r1}");
        // The all-to-all dispatcher: per layer two all-to-alls out (tokens, gates) and one back
        // in the forward, the same three in the backward; no all-gather or reduce-scatter.
        let a2a = RankPlan {
            dispatch: EpDispatch::AllToAll,
            ..plan(1, 2, 1)
        };
        let r1 = build(&c, a2a, false, None).render();
        assert_eq!(
            r1.matches("all_to_all_single.default(").count(),
            6 * c.base.layers
        );
        assert!(!r1.contains("all_gather") && !r1.contains("reduce_scatter"));
        assert!(
            r1.contains("all_to_all_single.default(view_17, [16, 16], [16, 16], 'ep')"),
            "{r1}"
        );
        let fw = build(&c, a2a, true, None).render();
        assert_eq!(
            fw.matches("all_to_all_single.default(").count(),
            3 * c.base.layers
        );
        assert_eq!(EpDispatch::parse("alltoall"), Ok(EpDispatch::AllToAll));
        assert_eq!(EpDispatch::AllToAll.name(), "alltoall");
        assert!(EpDispatch::parse("ring").is_err());
        let tp = plan(2, 1, 0);
        let tp2 = build(&c, tp, false, None).render();
        let unsynced = build(&c, tp, false, Some(Mutation::MoeRouterGradUnsynced)).render();
        let count = |t: &str| t.matches("'tp')").count();
        assert_eq!(count(&tp2), count(&unsynced) + c.base.layers);
        assert!(tp2.contains("aux_share"), "{tp2}");
        let undivided = build(&c, tp, true, Some(Mutation::MoeAuxLossNotDividedByTp)).render();
        assert!(!undivided.contains("aux_share"), "{undivided}");
    }
}
