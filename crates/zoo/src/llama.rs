//! The `llama` model: a Llama-3 style decoder (token embedding; per layer RMSNorm, attention
//! with RoPE, grouped-query attention and a causal mask, residual, RMSNorm, SwiGLU MLP,
//! residual; final RMSNorm, LM head, cross-entropy loss), as a spec and as DP/TP ranks.
//!
//! The graphs are written as AOTAutograd prints a joint forward-backward graph: ATen operators
//! only, matrix products as `mm`/`bmm` with explicit transposes, the softmax and log-softmax
//! backwards as `_softmax_backward_data` / `_log_softmax_backward_data`, RMSNorm and RoPE
//! backwards by their formulas, the embedding backward as `embedding_dense_backward`.

use crate::bugs::Mutation;
use crate::cp::{self, CpPlan, RingMasks, RingSaved, RingShape};
use crate::graph::{Arg, GraphBuilder, Val};
use crate::train::{self, Step};
use crate::{Param, TpLayout};
use std::collections::BTreeMap;

mod attention;
pub(crate) use attention::*;

/// The sizes of the Llama model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Model width.
    pub hidden: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention; divides `heads`).
    pub kv_heads: usize,
    /// Inner width of the SwiGLU MLP.
    pub ffn: usize,
    /// Number of decoder layers.
    pub layers: usize,
    /// Sequence length.
    pub seq: usize,
    /// Global batch size (sequences).
    pub batch: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// SGD learning rate of the full iteration.
    pub lr: f64,
    /// RMSNorm epsilon.
    pub eps: f64,
}

impl Default for LlamaConfig {
    /// The `tiny` size: runs in well under a second on a CPU.
    fn default() -> Self {
        LlamaConfig {
            hidden: 16,
            heads: 4,
            kv_heads: 2,
            ffn: 32,
            layers: 2,
            seq: 8,
            batch: 2,
            vocab: 32,
            lr: 0.1,
            eps: 1e-5,
        }
    }
}

/// The largest element count of any tensor the zoo emits: keeps every size product far from
/// overflow (bytes of the largest tensor below 2^47; `run` refuses what exceeds its
/// --max-memory). 2^44 admits the spec of Llama-3 70B's Table 2 plan, whose 512 sequences of
/// 8192 tokens make `[batch, heads, seq, seq]` attention scores of 2^41 elements.
pub(crate) const MAX_ELEMENTS: usize = 1 << 44;

/// Why `value` (the size `name`) cannot be split over the `size` ranks of `over` (a mesh
/// dim), if it cannot.
pub(crate) fn check_divisible(
    name: &str,
    value: usize,
    over: &str,
    size: usize,
) -> Result<(), String> {
    if value.is_multiple_of(size) {
        Ok(())
    } else {
        Err(format!(
            "{name} {value} is not divisible by {over} = {size}"
        ))
    }
}

/// Why one of the sizes `(name, value)` is zero, if one is.
pub(crate) fn check_at_least_one(sizes: &[(&str, usize)]) -> Result<(), String> {
    match sizes.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(format!("{name} must be at least 1")),
        None => Ok(()),
    }
}

/// Why one of the tensors of `shapes` is too large to emit (more than `max_elements`
/// elements), if one is.
pub(crate) fn check_tensor_sizes(shapes: &[Vec<usize>], max_elements: usize) -> Result<(), String> {
    for dims in shapes {
        let n = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if n.is_none_or(|n| n > max_elements) {
            return Err(format!(
                "the sizes make a tensor of shape {dims:?}, over {max_elements} elements"
            ));
        }
    }
    Ok(())
}

impl LlamaConfig {
    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// How many consecutive tp ranks hold the same kv head: 1 unless tp exceeds the kv heads,
    /// when each kv head is replicated (vLLM's layout; the case file says `replicas:`).
    pub fn kv_replicas(&self, tp: usize) -> usize {
        if tp > self.kv_heads {
            tp / self.kv_heads
        } else {
            1
        }
    }

    /// The parameters in graph order: the embedding; per layer the attention norm, q/k/v
    /// (column parallel), o (row parallel), the MLP norm, gate/up (column parallel), down (row
    /// parallel); the final norm and the LM head. Norms are replicated; embedding and LM head
    /// too, unless `vocab_parallel` splits them along the vocabulary.
    pub fn params(&self, tp: usize, vocab_parallel: bool) -> Vec<Param> {
        let (h, f, v) = (self.hidden, self.ffn, self.vocab);
        let (q, kv) = (
            self.heads * self.head_dim(),
            self.kv_heads * self.head_dim(),
        );
        let p = |name: String, shape: Vec<usize>, tp| Param { name, shape, tp };
        let kv_layout = match self.kv_replicas(tp) {
            1 => TpLayout::Shard(0),
            replicas => TpLayout::ShardReplicas { dim: 0, replicas },
        };
        let vocab_layout = if vocab_parallel {
            TpLayout::Shard(0)
        } else {
            TpLayout::Replicate
        };
        let mut out = vec![p("embed".into(), vec![v, h], vocab_layout)];
        for l in 0..self.layers {
            out.extend([
                p(format!("attn_norm_{l}"), vec![h], TpLayout::Replicate),
                p(format!("wq_{l}"), vec![q, h], TpLayout::Shard(0)),
                p(format!("wk_{l}"), vec![kv, h], kv_layout),
                p(format!("wv_{l}"), vec![kv, h], kv_layout),
                p(format!("wo_{l}"), vec![h, q], TpLayout::Shard(1)),
                p(format!("mlp_norm_{l}"), vec![h], TpLayout::Replicate),
                p(format!("w_gate_{l}"), vec![f, h], TpLayout::Shard(0)),
                p(format!("w_up_{l}"), vec![f, h], TpLayout::Shard(0)),
                p(format!("w_down_{l}"), vec![h, f], TpLayout::Shard(1)),
            ]);
        }
        out.push(p("final_norm".into(), vec![h], TpLayout::Replicate));
        out.push(p("lm_head".into(), vec![v, h], vocab_layout));
        out
    }

    /// Why these sizes cannot be split `dp` x `tp` ways (the vocabulary too when
    /// `vocab_parallel`), if they cannot.
    pub fn check_split(&self, dp: usize, tp: usize, vocab_parallel: bool) -> Result<(), String> {
        check_at_least_one(&[
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
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
            vec![self.vocab.max(self.ffn), self.hidden],
            vec![self.layers, self.hidden],
        ];
        check_tensor_sizes(&largest, MAX_ELEMENTS)?;
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "hidden {} is not divisible by heads {}",
                self.hidden, self.heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "the head dim hidden / heads = {} is odd; RoPE rotates pairs",
                self.head_dim()
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "heads {} is not divisible by kv_heads {}",
                self.heads, self.kv_heads
            ));
        }
        check_divisible("batch", self.batch, "dp", dp)?;
        check_divisible("heads", self.heads, "tp", tp)?;
        check_divisible("ffn", self.ffn, "tp", tp)?;
        if vocab_parallel && !self.vocab.is_multiple_of(tp) {
            return Err(format!(
                "vocab {} is not divisible by tp = {tp} (--vocab-parallel)",
                self.vocab
            ));
        }
        if !self.kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "kv_heads {} and tp = {tp}: one must divide the other (kv heads are split \
                 over tp, or replicated when tp is larger)",
                self.kv_heads
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
    /// The rank's index along tp (its vocabulary range under `vocab_parallel`).
    pub tp_rank: usize,
    /// Embedding and LM head split along the vocabulary over tp (Megatron's
    /// `VocabParallelEmbedding` and vocab-parallel cross-entropy).
    pub vocab_parallel: bool,
    /// Context parallelism: where the rank sits on the cp mesh dim ([`CpPlan::NONE`] without
    /// one).
    pub cp: CpPlan,
}

impl RankPlan {
    /// The single-device spec.
    pub const SPEC: RankPlan = RankPlan {
        dp: 1,
        tp: 1,
        tp_rank: 0,
        vocab_parallel: false,
        cp: CpPlan::NONE,
    };
}

/// What the backward of an RMSNorm reads from its forward.
pub(crate) struct NormSaved {
    x: Val,
    rs: Val,
    xn: Val,
}

/// What the backward of scaled, masked softmax attention over `b * heads` rows reads from its
/// forward.
pub(crate) struct ScoresSaved {
    /// Queries `[b * heads, s, head_dim]`.
    q3: Val,
    /// Transposed keys `[b * heads, head_dim, s]`.
    kt3: Val,
    /// Probabilities `[b, heads, s, s]`.
    p: Val,
    /// The same as `[b * heads, s, s]`.
    p3: Val,
    /// Values `[b * heads, s, head_dim]`.
    v3: Val,
    /// The factor on the raw scores.
    scale: f64,
}

/// What the backward of the attention proper (scores, softmax, values) reads from its forward.
pub(crate) enum AttnCore {
    /// Attention over the whole sequence.
    Full(ScoresSaved),
    /// Ring attention over the cp ranks' sequence chunks.
    Ring(RingSaved),
}

/// What the backward of a decoder layer's attention sublayer reads from its forward.
pub(crate) struct AttnSaved {
    attn_norm: NormSaved,
    xn2d: Val,
    core: AttnCore,
    attn2d: Val,
}

/// What the backward of a SwiGLU MLP reads from its forward.
pub(crate) struct SwigluSaved {
    x2d: Val,
    gate: Val,
    up: Val,
    sg: Val,
    m: Val,
}

/// The name prefixes of a SwiGLU MLP's gate, up and down weights (layer `l`'s are
/// `<prefix>_<l>`).
pub(crate) type SwigluNames = [&'static str; 3];

/// The llama MLP's weights.
const MLP_WEIGHTS: SwigluNames = ["w_gate", "w_up", "w_down"];

/// What the backward of a decoder layer reads from its forward.
pub(crate) struct LayerSaved {
    attn: AttnSaved,
    mlp_norm: NormSaved,
    mlp: SwigluSaved,
}

/// `weight * (x * rsqrt(mean(x^2, -1) + eps))`, as Hugging Face's `LlamaRMSNorm`.
pub(crate) fn rms_norm(g: &mut GraphBuilder, x: &Val, w: &Val, eps: f64) -> (Val, NormSaved) {
    rms_norm_stat(g, x, x, w, eps)
}

/// [`rms_norm`] whose mean of squares is taken over `stat` instead of `x` (the zoo's planted
/// `norm-sharded-hidden`: a slice of `x`'s last dim).
pub(crate) fn rms_norm_stat(
    g: &mut GraphBuilder,
    x: &Val,
    stat: &Val,
    w: &Val,
    eps: f64,
) -> (Val, NormSaved) {
    let sq = g.call(
        "pow",
        "aten.pow.Tensor_Scalar",
        &[Arg::V(stat), Arg::I(2)],
        stat.shape.clone(),
    );
    let var = g.mean_last(&sq);
    let ve = g.call(
        "add",
        "aten.add.Scalar",
        &[Arg::V(&var), Arg::F(eps)],
        var.shape.clone(),
    );
    let rs = g.unary("rsqrt", "aten.rsqrt.default", &ve);
    let xn = g.mul(x, &rs);
    let out = g.mul(w, &xn);
    let saved = NormSaved {
        x: x.clone(),
        rs,
        xn,
    };
    (out, saved)
}

/// The RMSNorm backward: `(grad of x, grad of weight)`, with `xn = x * rs`:
/// `dw = sum(grad * xn)` over every dim but the last, and
/// `dx = rs * (grad * w) - x * rs^3 * mean((grad * w) * x, -1)`.
pub(crate) fn rms_norm_backward(
    g: &mut GraphBuilder,
    grad: &Val,
    w: &Val,
    sv: &NormSaved,
) -> (Val, Val) {
    let gxn_w = g.mul(grad, &sv.xn);
    let lead: Vec<usize> = (0..grad.shape.len() - 1).collect();
    let g_w = g.sum_dims(&gxn_w, &lead, false);
    let g_xn = g.mul(grad, w);
    let direct = g.mul(&g_xn, &sv.rs);
    let gx = g.mul(&g_xn, &sv.x);
    let mean = g.mean_last(&gx);
    let rs3 = g.call(
        "pow",
        "aten.pow.Tensor_Scalar",
        &[Arg::V(&sv.rs), Arg::I(3)],
        sv.rs.shape.clone(),
    );
    let c = g.mul(&mean, &rs3);
    let through_rs = g.mul(&sv.x, &c);
    let g_x = g.sub("sub", &direct, &through_rs);
    (g_x, g_w)
}

/// `x @ w.T` for a weight `w` of shape `[out, in]`; batched (`bmm` with `w.transpose(1, 2)`)
/// for stacked weights `[n, out, in]` and inputs `[n, rows, in]`.
pub(crate) fn linear(g: &mut GraphBuilder, x: &Val, w: &Val) -> Val {
    let wt = transposed(g, w);
    matmul(g, x, &wt)
}

/// The transpose of a matrix (`t`), or of each matrix of a batch (`transpose(1, 2)`).
fn transposed(g: &mut GraphBuilder, x: &Val) -> Val {
    if x.shape.len() == 3 {
        g.transpose(x, 1, 2)
    } else {
        g.t(x)
    }
}

/// The product of two matrices (`mm`), or of two batches of them (`bmm`).
fn matmul(g: &mut GraphBuilder, a: &Val, b: &Val) -> Val {
    if a.shape.len() == 3 {
        g.bmm(a, b)
    } else {
        g.mm(a, b)
    }
}

/// `all_reduce(x, 'sum', group)` when the group has more than one member.
pub(crate) fn reduce_if(g: &mut GraphBuilder, x: &Val, group: &str, size: usize) -> Val {
    if size > 1 {
        g.all_reduce_sum(x, group)
    } else {
        x.clone()
    }
}

/// A vocab-parallel embedding lookup (before its all-reduce) and what its backward reads.
pub(crate) struct VocabEmbedding {
    /// The looked-up rows, zeroed where the token is outside the rank's range.
    pub(crate) out: Val,
    /// Token ids relative to the rank's first row, 0 where outside.
    pub(crate) ids: Val,
    /// `[b, s, 1]`: the token is outside the rank's range.
    pub(crate) outside3: Val,
}

/// `ids < lo | ids >= hi`, as Megatron masks a vocabulary range.
fn outside_range(g: &mut GraphBuilder, ids: &Val, lo: usize, hi: usize) -> Val {
    let below = g.call_typed(
        "lt",
        "aten.lt.Scalar",
        &[Arg::V(ids), Arg::I(lo as i64)],
        "b8",
        ids.shape.clone(),
    );
    let above = g.call_typed(
        "ge",
        "aten.ge.Scalar",
        &[Arg::V(ids), Arg::I(hi as i64)],
        "b8",
        ids.shape.clone(),
    );
    g.call_typed(
        "bitwise_or",
        "aten.bitwise_or.Tensor",
        &[Arg::V(&below), Arg::V(&above)],
        "b8",
        ids.shape.clone(),
    )
}

/// `ids - lo`, with 0 where `outside`.
fn local_ids(g: &mut GraphBuilder, ids: &Val, outside: &Val, lo: usize) -> Val {
    let shifted = g.call_typed(
        "sub",
        "aten.sub.Scalar",
        &[Arg::V(ids), Arg::I(lo as i64)],
        "i64",
        ids.shape.clone(),
    );
    g.call_typed(
        "masked_fill",
        "aten.masked_fill.Scalar",
        &[Arg::V(&shifted), Arg::V(outside), Arg::I(0)],
        "i64",
        ids.shape.clone(),
    )
}

/// Megatron's `VocabParallelEmbedding` before its all-reduce: look up the rows of the rank's
/// range `[v0, v0 + vl)` and zero those of other tokens (unless the planted bug skips it).
pub(crate) fn vocab_embedding(
    g: &mut GraphBuilder,
    embed: &Val,
    tokens: &Val,
    v0: usize,
    vl: usize,
    bug: Option<Mutation>,
) -> VocabEmbedding {
    let outside = outside_range(g, tokens, v0, v0 + vl);
    let ids = local_ids(g, tokens, &outside, v0);
    let mut shape = tokens.shape.clone();
    shape.push(embed.shape[1]);
    let rows = g.call(
        "embedding",
        "aten.embedding.default",
        &[Arg::V(embed), Arg::V(&ids)],
        shape.clone(),
    );
    let outside3 = g.unsqueeze(&outside, tokens.shape.len());
    let out = if bug == Some(Mutation::LlamaVocabEmbeddingUnmasked) {
        rows
    } else {
        g.call(
            "masked_fill",
            "aten.masked_fill.Scalar",
            &[Arg::V(&rows), Arg::V(&outside3), Arg::F(0.0)],
            shape,
        )
    };
    VocabEmbedding { out, ids, outside3 }
}

/// A cross-entropy loss (mean over tokens) and what its backward reads.
pub(crate) enum CrossEntropy {
    /// `_log_softmax` + `nll_loss_forward` on whole logits.
    Full {
        loss: Val,
        log_probs: Val,
        labels: Val,
        total_weight: Val,
    },
    /// Megatron's vocab-parallel cross-entropy on the rank's logits `[t, vl]`.
    VocabParallel {
        loss: Val,
        exp: Val,
        sum_exp: Val,
        /// `[t, 1]` label ids relative to the rank's range, 0 where outside.
        ids: Val,
        /// `[t, 1]`: the label is outside the rank's range.
        outside: Val,
    },
}

impl CrossEntropy {
    /// The gradient of the logits for a gradient of 1 on the (rank-local) loss.
    pub(crate) fn backward(&self, g: &mut GraphBuilder) -> Val {
        match self {
            CrossEntropy::Full {
                log_probs,
                labels,
                total_weight,
                ..
            } => {
                let one = g.full(&[], 1.0);
                let g_ls = g.call(
                    "nll_loss_backward",
                    "aten.nll_loss_backward.default",
                    &[
                        Arg::V(&one),
                        Arg::V(log_probs),
                        Arg::V(labels),
                        Arg::Raw("None"),
                        Arg::I(1),
                        Arg::I(-100),
                        Arg::V(total_weight),
                    ],
                    log_probs.shape.clone(),
                );
                g.call(
                    "_log_softmax_backward_data",
                    "aten._log_softmax_backward_data.default",
                    &[
                        Arg::V(&g_ls),
                        Arg::V(log_probs),
                        Arg::I(1),
                        Arg::Raw("torch.float32"),
                    ],
                    log_probs.shape.clone(),
                )
            }
            CrossEntropy::VocabParallel {
                exp,
                sum_exp,
                ids,
                outside,
                ..
            } => {
                // (softmax - one_hot(label)) / tokens, the one-hot only inside the range.
                let (t, vl) = (exp.shape[0], exp.shape[1]);
                let probs = g.binary("div", "aten.div.Tensor", exp, sum_exp);
                let cols = g.arange(vl);
                let hit = g.call_typed(
                    "eq",
                    "aten.eq.Tensor",
                    &[Arg::V(ids), Arg::V(&cols)],
                    "b8",
                    vec![t, vl],
                );
                let inside = g.call_typed(
                    "bitwise_not",
                    "aten.bitwise_not.default",
                    &[Arg::V(outside)],
                    "b8",
                    outside.shape.clone(),
                );
                let one_hot_b = g.call_typed(
                    "bitwise_and",
                    "aten.bitwise_and.Tensor",
                    &[Arg::V(&hit), Arg::V(&inside)],
                    "b8",
                    vec![t, vl],
                );
                let one_hot = g.call(
                    "_to_copy",
                    "aten._to_copy.default",
                    &[Arg::V(&one_hot_b), Arg::Raw("dtype = torch.float32")],
                    vec![t, vl],
                );
                let diff = g.sub("sub", &probs, &one_hot);
                g.div_scalar("div", &diff, Arg::I(t as i64))
            }
        }
    }

    /// The rank-local mean loss.
    pub(crate) fn loss(&self) -> &Val {
        match self {
            CrossEntropy::Full { loss, .. } | CrossEntropy::VocabParallel { loss, .. } => loss,
        }
    }
}

/// `nll_loss(log_softmax(logits), labels)`, mean over tokens; the loss is named `name`.
pub(crate) fn cross_entropy(
    g: &mut GraphBuilder,
    logits: &Val,
    labels: &Val,
    name: &str,
) -> CrossEntropy {
    let log_probs = g.call(
        "_log_softmax",
        "aten._log_softmax.default",
        &[Arg::V(logits), Arg::I(1), Arg::B(false)],
        logits.shape.clone(),
    );
    let nll = g.call_multi(
        "nll_loss_forward",
        "aten.nll_loss_forward.default",
        &[
            Arg::V(&log_probs),
            Arg::V(labels),
            Arg::Raw("None"),
            Arg::I(1),
            Arg::I(-100),
        ],
        &[(name, vec![]), ("total_weight", vec![])],
    );
    CrossEntropy::Full {
        loss: nll[0].clone(),
        log_probs,
        labels: labels.clone(),
        total_weight: nll[1].clone(),
    }
}

/// Megatron's vocab-parallel cross-entropy over the rank's logits `[t, vl]` (vocabulary rows
/// from `v0`): the row max all-reduced (max), the label's logit picked where the label is in
/// range and all-reduced, the sum of exponentials all-reduced; the loss is
/// `mean(log(sum_exp) - label_logit)`, named `name`.
pub(crate) fn vocab_cross_entropy(
    g: &mut GraphBuilder,
    logits: &Val,
    labels: &Val,
    v0: usize,
    name: &str,
) -> CrossEntropy {
    let (t, vl) = (logits.shape[0], logits.shape[1]);
    let local_max = g.call(
        "amax",
        "aten.amax.default",
        &[Arg::V(logits), Arg::Ints(vec![1]), Arg::B(true)],
        vec![t, 1],
    );
    let max = g.all_reduce(&local_max, "max", "tp");
    let shifted = g.sub("sub", logits, &max);
    let outside1 = outside_range(g, labels, v0, v0 + vl);
    let ids1 = local_ids(g, labels, &outside1, v0);
    let ids = g.unsqueeze(&ids1, 1);
    let outside = g.unsqueeze(&outside1, 1);
    let picked = g.call(
        "gather",
        "aten.gather.default",
        &[Arg::V(&shifted), Arg::I(1), Arg::V(&ids)],
        vec![t, 1],
    );
    let picked = g.call(
        "masked_fill",
        "aten.masked_fill.Scalar",
        &[Arg::V(&picked), Arg::V(&outside), Arg::F(0.0)],
        vec![t, 1],
    );
    let label_logit = g.all_reduce_sum(&picked, "tp");
    let exp = g.unary("exp", "aten.exp.default", &shifted);
    let local_sum = g.sum_dims(&exp, &[1], true);
    let sum_exp = g.all_reduce_sum(&local_sum, "tp");
    let log_sum = g.unary("log", "aten.log.default", &sum_exp);
    let per_token = g.sub("sub", &log_sum, &label_logit);
    let loss = g.mean(name, &per_token);
    CrossEntropy::VocabParallel {
        loss,
        exp,
        sum_exp,
        ids,
        outside,
    }
}

/// `aten.embedding.default`: the rows of `embed` for `tokens` `[b, s]`.
pub(crate) fn embedding(g: &mut GraphBuilder, embed: &Val, tokens: &Val) -> Val {
    let mut shape = tokens.shape.clone();
    shape.push(embed.shape[1]);
    g.call(
        "embedding",
        "aten.embedding.default",
        &[Arg::V(embed), Arg::V(tokens)],
        shape,
    )
}

/// The embedding backward: the gradient `[b, s, h]` of the looked-up rows summed into a
/// `[rows, h]` table gradient by `ids`.
pub(crate) fn embedding_backward(g: &mut GraphBuilder, grad: &Val, ids: &Val, rows: usize) -> Val {
    let h = grad.shape[grad.shape.len() - 1];
    g.call(
        "embedding_dense_backward",
        "aten.embedding_dense_backward.default",
        &[
            Arg::V(grad),
            Arg::V(ids),
            Arg::I(rows as i64),
            Arg::I(-1),
            Arg::B(false),
        ],
        vec![rows, h],
    )
}

/// A SwiGLU MLP on token rows `x2d` `[t, h]` with layer `l`'s weights `names`:
/// `down(silu(gate(x)) * up(x))`, before the all-reduce its row-parallel `down` needs under tp.
/// With stacked weights `[n, out, in]` and rows `[n, t, h]`: `n` MLPs at once.
pub(crate) fn swiglu(
    g: &mut GraphBuilder,
    x2d: &Val,
    w: &dyn Fn(&str) -> Val,
    names: SwigluNames,
    l: usize,
) -> (Val, SwigluSaved) {
    let [gate_w, up_w, down_w] = names.map(|n| w(&format!("{n}_{l}")));
    let gate = linear(g, x2d, &gate_w);
    let up = linear(g, x2d, &up_w);
    let sg = g.unary("silu", "aten.silu.default", &gate);
    let m = g.mul(&sg, &up);
    let down = linear(g, &m, &down_w);
    let saved = SwigluSaved {
        x2d: x2d.clone(),
        gate,
        up,
        sg,
        m,
    };
    (down, saved)
}

/// The backward of [`swiglu`] for the gradient `g_out` `[t, h]` of its output: inserts the
/// weights' gradients into `grads` and returns the input's. Under tp the all-reduce after
/// `down` is the identity backward (Megatron's `g`); the input gradient is a partial sum over
/// tp (Megatron's `f` all-reduces it).
pub(crate) fn swiglu_backward(
    g: &mut GraphBuilder,
    g_out: &Val,
    sv: &SwigluSaved,
    w: &dyn Fn(&str) -> Val,
    names: SwigluNames,
    l: usize,
    grads: &mut BTreeMap<String, Val>,
) -> Val {
    let [gate_name, up_name, down_name] = names.map(|n| format!("{n}_{l}"));
    let g_m = matmul(g, g_out, &w(&down_name));
    let g_outt = transposed(g, g_out);
    grads.insert(down_name, matmul(g, &g_outt, &sv.m));
    let g_sg = g.mul(&g_m, &sv.up);
    let g_up = g.mul(&g_m, &sv.sg);
    let g_gate = g.call(
        "silu_backward",
        "aten.silu_backward.default",
        &[Arg::V(&g_sg), Arg::V(&sv.gate)],
        sv.gate.shape.clone(),
    );
    let g_gate_t = transposed(g, &g_gate);
    grads.insert(gate_name.clone(), matmul(g, &g_gate_t, &sv.x2d));
    let g_up_t = transposed(g, &g_up);
    grads.insert(up_name.clone(), matmul(g, &g_up_t, &sv.x2d));
    let from_gate = matmul(g, &g_gate, &w(&gate_name));
    let from_up = matmul(g, &g_up, &w(&up_name));
    g.add(&from_gate, &from_up)
}

/// The final RMSNorm and the LM head on the residual stream `x` `[b, s, h]`: the logits
/// `[b * s, vocab rows]` and what [`lm_head_backward`] reads.
pub(crate) fn lm_head(
    g: &mut GraphBuilder,
    x: &Val,
    w: &dyn Fn(&str) -> Val,
    eps: f64,
) -> (Val, HeadSaved) {
    let (b, s, h) = (x.shape[0], x.shape[1], x.shape[2]);
    let (xf, final_norm) = rms_norm(g, x, &w("final_norm"), eps);
    let xf2d = g.view(&xf, &[b * s, h]);
    let logits = linear(g, &xf2d, &w("lm_head"));
    (logits, HeadSaved { final_norm, xf2d })
}

/// What the backward of the final norm and LM head reads from its forward.
pub(crate) struct HeadSaved {
    final_norm: NormSaved,
    xf2d: Val,
}

/// The backward of [`lm_head`] for the logits' gradient: the gradients of the LM head and
/// the final norm (the first of the backward's), and that of the residual stream. Under
/// vocabulary parallelism (`vocab_parallel`) the LM head is column parallel and its input
/// gradient is all-reduced over tp.
pub(crate) fn lm_head_backward(
    g: &mut GraphBuilder,
    g_logits: &Val,
    sv: &HeadSaved,
    w: &dyn Fn(&str) -> Val,
    vocab_parallel: bool,
) -> (BTreeMap<String, Val>, Val) {
    let mut grads = BTreeMap::new();
    let (x, h) = (&sv.final_norm.x, sv.xf2d.shape[1]);
    let gt = g.t(g_logits);
    grads.insert("lm_head".into(), g.mm(&gt, &sv.xf2d));
    let g_xf2d = g.mm(g_logits, &w("lm_head"));
    let g_xf2d = if vocab_parallel {
        g.all_reduce_sum(&g_xf2d, "tp")
    } else {
        g_xf2d
    };
    let g_xf = g.view(&g_xf2d, &[x.shape[0], x.shape[1], h]);
    let (gx, g_fn) = rms_norm_backward(g, &g_xf, &w("final_norm"), &sv.final_norm);
    grads.insert("final_norm".into(), g_fn);
    (grads, gx)
}

/// The token embedding of `tokens` (before the first layer): a lookup in the whole table, or
/// with `vocab = Some((v0, vl))` Megatron's vocab-parallel lookup of the rank's rows
/// `[v0, v0 + vl)`, all-reduced over tp (whose masks the backward reads).
pub(crate) fn token_embedding(
    g: &mut GraphBuilder,
    embed: &Val,
    tokens: &Val,
    vocab: Option<(usize, usize)>,
    bug: Option<Mutation>,
) -> (Val, Option<VocabEmbedding>) {
    let scope = g.begin_module("embedding", false);
    let (x, vpe) = token_embedding_body(g, embed, tokens, vocab, bug);
    g.end_module(scope, Some(&x));
    (x, vpe)
}

/// [`token_embedding`] without its module annotation.
fn token_embedding_body(
    g: &mut GraphBuilder,
    embed: &Val,
    tokens: &Val,
    vocab: Option<(usize, usize)>,
    bug: Option<Mutation>,
) -> (Val, Option<VocabEmbedding>) {
    match vocab {
        Some((v0, vl)) => {
            let vpe = vocab_embedding(g, embed, tokens, v0, vl, bug);
            let x = g.all_reduce_sum(&vpe.out, "tp");
            (x, Some(vpe))
        }
        None => (embedding(g, embed, tokens), None),
    }
}

/// The backward of [`token_embedding`] for the gradient `gx` of its output: the gradient of
/// the rank's `rows` of the table (rows a vocab-parallel forward zeroed get none, unless the
/// planted bug left them unmasked).
pub(crate) fn token_embedding_backward(
    g: &mut GraphBuilder,
    gx: &Val,
    vocab: Option<&VocabEmbedding>,
    tokens: &Val,
    rows: usize,
    bug: Option<Mutation>,
) -> Val {
    let (g_rows, ids) = match vocab {
        Some(vpe) if bug != Some(Mutation::LlamaVocabEmbeddingUnmasked) => {
            // Rows the forward zeroed get no gradient (the masked ids all point at row 0).
            let zeroed = g.call(
                "masked_fill",
                "aten.masked_fill.Scalar",
                &[Arg::V(gx), Arg::V(&vpe.outside3), Arg::F(0.0)],
                gx.shape.clone(),
            );
            (zeroed, vpe.ids.clone())
        }
        Some(vpe) => (gx.clone(), vpe.ids.clone()),
        None => (gx.clone(), tokens.clone()),
    };
    embedding_backward(g, &g_rows, &ids, rows)
}

/// Decoder layer `l` on the residual stream `x` `[b, s, h]`: the attention sublayer, then
/// RMSNorm and the SwiGLU MLP (gate/up column parallel, down row parallel with its all-reduce
/// over tp) and the residual. Returns the residual stream after it and what its backward reads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_layer(
    g: &mut GraphBuilder,
    x: &Val,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    dims: AttnShape,
    tables: &AttnTables,
    eps: f64,
    bug: Option<Mutation>,
) -> (Val, LayerSaved) {
    let (b, s, h, t) = (dims.b, dims.s, dims.h, dims.tokens());
    let scope = g.begin_module(format!("layers.{l}.attention"), false);
    let (hres, attn) = attention(g, x, l, w, dims, tables, eps, bug);
    g.end_module(scope, Some(&hres));

    // SwiGLU MLP: gate/up column parallel, down row parallel.
    let scope = g.begin_module(format!("layers.{l}.mlp"), false);
    let (hn, mlp_norm) = rms_norm(g, &hres, &w(&format!("mlp_norm_{l}")), eps);
    let hn2d = g.view(&hn, &[t, h]);
    let (down, mlp) = swiglu(g, &hn2d, w, MLP_WEIGHTS, l);
    let down_full = reduce_if(g, &down, "tp", dims.tp);
    let d3 = g.view(&down_full, &[b, s, h]);
    let out = g.add(&hres, &d3);
    g.end_module(scope, Some(&out));
    let saved = LayerSaved {
        attn,
        mlp_norm,
        mlp,
    };
    (out, saved)
}

/// The backward of [`decoder_layer`] for the gradient `gx` of its output: inserts the
/// gradients of layer `l`'s weights into `grads` and returns the gradient of its input.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_layer_backward(
    g: &mut GraphBuilder,
    gx: &Val,
    sv: &LayerSaved,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    dims: AttnShape,
    tables: &AttnTables,
    grads: &mut BTreeMap<String, Val>,
    bug: Option<Mutation>,
) -> Val {
    let (b, s, h, t) = (dims.b, dims.s, dims.h, dims.tokens());
    // MLP branch.
    let scope = g.begin_module(format!("layers.{l}.mlp"), true);
    let g_d2d = g.view(gx, &[t, h]);
    let g_in = swiglu_backward(g, &g_d2d, &sv.mlp, w, MLP_WEIGHTS, l, grads);
    let g_hn2d = reduce_if(g, &g_in, "tp", dims.tp);
    let g_hn = g.view(&g_hn2d, &[b, s, h]);
    let (g_hres_norm, g_mn) =
        rms_norm_backward(g, &g_hn, &w(&format!("mlp_norm_{l}")), &sv.mlp_norm);
    grads.insert(format!("mlp_norm_{l}"), g_mn);
    let g_hres = g.add(gx, &g_hres_norm);
    g.end_module(scope, Some(&g_hres));

    // Attention branch.
    let scope = g.begin_module(format!("layers.{l}.attention"), true);
    let g_x = attention_backward(g, &g_hres, &sv.attn, l, w, dims, tables, grads, bug);
    g.end_module(scope, Some(&g_x));
    g_x
}

/// Builds the graph of one rank of the plan ([`RankPlan::SPEC`], no bug, is the spec). Ranks
/// differ only in the vocabulary range they hold under `vocab_parallel`. Forward and loss
/// (output `loss`), and unless `forward_only` the explicit backward, gradient finalization
/// (all-reduce over the replicas of a kv head when tp exceeds the kv heads, all-reduce and
/// average over dp) and an SGD step whose updated parameters are outputs `<param>_new`.
pub fn build(
    cfg: &LlamaConfig,
    plan: RankPlan,
    forward_only: bool,
    bug: Option<Mutation>,
) -> GraphBuilder {
    let step = Step {
        cp: plan.cp.cp,
        ..Step::plain(plan.dp, plan.tp, plan.tp_rank, bug, cfg.lr)
    };
    build_rank(cfg, plan, &step, forward_only)
}

/// [`build`] for the rank and training options of `step` (loss scaling, microbatches, ZeRO,
/// clipping, the optimizer; see [`crate::train`]).
pub(crate) fn build_rank(
    cfg: &LlamaConfig,
    plan: RankPlan,
    step: &Step,
    forward_only: bool,
) -> GraphBuilder {
    let RankPlan { dp, tp, .. } = plan;
    debug_assert_eq!(
        step.cp, plan.cp.cp,
        "the step averages over the plan's cp ranks"
    );
    let vp = plan.vocab_parallel && tp > 1;
    let bug = step.bug;
    let is = |m: Mutation| bug == Some(m);
    let mut g = GraphBuilder::new();
    let mbs = step.microbatches();
    // The rank's sequences, and those of one microbatch.
    let b_all = cfg.batch / dp;
    let (b, v) = (b_all / mbs, cfg.vocab);
    // Under context parallelism the rank holds s = seq / cp tokens of each sequence.
    let dims = AttnShape::new(cfg, b, tp).with_cp(plan.cp);
    let (s, t) = (dims.s, dims.tokens());
    let tokens_in = g.input_typed("tokens", "i64", &[b_all, cfg.seq]);
    let labels_in = g.input_typed("labels", "i64", &[b_all, cfg.seq]);
    let inv_freq = g.input("rope_inv_freq", &[dims.hd / 2]);
    let specs = cfg.params(tp, vp);
    // The rank's vocabulary rows [v0, v0 + vl) under vocab parallelism.
    let vl = if vp { v / tp } else { v };
    let v0 = if vp { plan.tp_rank * vl } else { 0 };
    let weights = train::declare(&mut g, step, &specs);

    // The rank's chunks of the sequence (the whole sequence without context parallelism).
    let tokens_all = cp::select_chunks(&mut g, &tokens_in, &plan.cp);
    let labels_all = cp::select_chunks(&mut g, &labels_in, &plan.cp);
    let tables = attn_tables_cp(&mut g, &inv_freq, s, &plan.cp, bug);

    let mut losses = train::LossReport::default();
    let mut acc: BTreeMap<String, Val> = BTreeMap::new();
    for mb in 0..mbs {
        let forward = weights.pass(&mut g);
        let w = |name: &str| forward[name].clone();
        let tokens = train::microbatch(&mut g, &tokens_all, mb, mbs);
        let labels = train::microbatch(&mut g, &labels_all, mb, mbs);
        let vocab = vp.then_some((v0, vl));
        let (mut x, emb_mask) = token_embedding(&mut g, &w("embed"), &tokens, vocab, bug);
        let mut saved = Vec::new();
        for l in 0..cfg.layers {
            let (out, layer) = decoder_layer(&mut g, &x, l, &w, dims, &tables, cfg.eps, bug);
            x = out;
            saved.push(layer);
        }

        // Final norm, LM head and the cross-entropy loss (mean over the rank's tokens).
        let (logits, head) = lm_head(&mut g, &x, &w, cfg.eps);
        let labels1 = g.view(&labels, &[t]);
        let local_name = if step.data_group().1 > 1 || mbs > 1 {
            "nll_loss"
        } else {
            "loss"
        };
        let ce = if vp {
            vocab_cross_entropy(&mut g, &logits, &labels1, v0, local_name)
        } else {
            cross_entropy(&mut g, &logits, &labels1, local_name)
        };
        let mut local = ce.loss().clone();
        if is(Mutation::CpLossOverscaled) {
            // The planted bug: the loss scaled by cp for an averaging over cp that the
            // reduction over dp x cp does already.
            local = g.mul_scalar("mul", &local, Arg::I(plan.cp.cp as i64));
        }
        losses.add(&mut g, step, local);
        if forward_only {
            return g;
        }

        // Backward of the rank's local loss (seed 1, scaled for the microbatches and the loss
        // scale); dp averaging happens on the gradients.
        let backward = weights.pass(&mut g);
        let w = |name: &str| backward[name].clone();
        let mut g_logits = ce.backward(&mut g);
        if is(Mutation::CpLossOverscaled) {
            g_logits = g.mul_scalar("mul", &g_logits, Arg::I(plan.cp.cp as i64));
        }
        let g_logits = train::scale_seed(&mut g, step, &g_logits);
        let (mut grads, mut gx) = lm_head_backward(&mut g, &g_logits, &head, &w, vp);

        for l in (0..cfg.layers).rev() {
            gx = decoder_layer_backward(
                &mut g, &gx, &saved[l], l, &w, dims, &tables, &mut grads, bug,
            );
        }
        let g_embed = token_embedding_backward(&mut g, &gx, emb_mask.as_ref(), &tokens, vl, bug);
        grads.insert("embed".into(), g_embed);
        train::accumulate(&mut g, &mut acc, grads);
    }
    losses.finish(&mut g, step);

    // Gradient finalization, then the optimizer step.
    train::finish(&mut g, step, &specs, &weights, &acc, |g, p, grad| {
        let replicated_kv = matches!(p.tp, TpLayout::ShardReplicas { .. });
        let norm = p.name.contains("norm");
        if replicated_kv && !is(Mutation::LlamaKvGradUnsynced) {
            // Each replica saw only its own query heads' share of the kv head's gradient.
            g.all_reduce_sum(&grad, "kv")
        } else if norm && is(Mutation::TpCpNormGradScaledByTp) {
            // The planted bug: a complete norm gradient summed over tp once more.
            g.all_reduce_sum(&grad, "tp")
        } else {
            grad
        }
    });
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_checked() {
        let c = LlamaConfig::default();
        for (dp, tp) in [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)] {
            assert!(c.check_split(dp, tp, tp > 1).is_ok(), "dp {dp} tp {tp}");
        }
        assert!(c.check_split(3, 1, false).unwrap_err().contains("batch"));
        assert!(c.check_split(1, 8, false).unwrap_err().contains("heads"));
        let odd = LlamaConfig {
            hidden: 12,
            ..LlamaConfig::default()
        };
        assert!(odd.check_split(1, 1, false).unwrap_err().contains("odd"));
        let gqa = LlamaConfig {
            kv_heads: 3,
            ..LlamaConfig::default()
        };
        assert!(gqa
            .check_split(1, 1, false)
            .unwrap_err()
            .contains("kv_heads"));
        let three = LlamaConfig {
            heads: 6,
            kv_heads: 3,
            hidden: 24,
            ..LlamaConfig::default()
        };
        assert!(three
            .check_split(1, 2, false)
            .unwrap_err()
            .contains("one must divide"));
        let huge = LlamaConfig {
            vocab: usize::MAX / 2,
            ..LlamaConfig::default()
        };
        assert!(huge
            .check_split(1, 1, false)
            .unwrap_err()
            .contains("elements"));
        let zero = LlamaConfig {
            seq: 0,
            ..LlamaConfig::default()
        };
        assert!(zero.check_split(1, 1, false).unwrap_err().contains("seq"));
        let vocab = LlamaConfig {
            vocab: 30,
            ..LlamaConfig::default()
        };
        assert!(vocab.check_split(1, 4, false).is_ok());
        assert!(vocab
            .check_split(1, 4, true)
            .unwrap_err()
            .contains("vocab 30"));
    }

    #[test]
    fn kv_heads_are_replicated_when_tp_exceeds_them() {
        let c = LlamaConfig::default();
        assert_eq!((c.kv_replicas(2), c.kv_replicas(4)), (1, 2));
        let wk = |tp| {
            c.params(tp, false)
                .into_iter()
                .find(|p| p.name == "wk_0")
                .unwrap()
        };
        assert_eq!(wk(2).local_shape(2), vec![4, 16]);
        assert_eq!(
            wk(4).tp,
            TpLayout::ShardReplicas {
                dim: 0,
                replicas: 2
            }
        );
        assert_eq!(wk(4).local_shape(4), vec![4, 16]);
    }

    fn plan(dp: usize, tp: usize) -> RankPlan {
        RankPlan {
            dp,
            tp,
            tp_rank: 0,
            vocab_parallel: false,
            cp: CpPlan::NONE,
        }
    }

    #[test]
    fn graphs_have_the_expected_outputs_and_collectives() {
        let c = LlamaConfig::default();
        let spec = build(&c, RankPlan::SPEC, false, None);
        let names: Vec<&str> = spec.outputs().iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names[0], "loss");
        assert_eq!(names.len(), 1 + c.params(1, false).len());
        assert!(names[1..].iter().all(|n| n.ends_with("_new")), "{names:?}");
        let text = spec.render();
        assert!(!text.contains("all_reduce"), "the spec has no collectives");
        // tp=4 with 2 kv heads: kv gradients are all-reduced over the replicas.
        let tp4 = build(&c, plan(1, 4), false, None).render();
        assert!(tp4.contains("'kv')"), "{tp4}");
        let unsynced = build(&c, plan(1, 4), false, Some(Mutation::LlamaKvGradUnsynced)).render();
        assert!(!unsynced.contains("'kv')"));
        // Backward all-reduces over tp: per layer one after q/k/v and one after gate/up.
        let tp2 = build(&c, plan(1, 2), false, None).render();
        let dropped = build(
            &c,
            plan(1, 2),
            false,
            Some(Mutation::LlamaQkvGradMissingAllreduce),
        )
        .render();
        let count = |t: &str| t.matches("'tp')").count();
        assert_eq!(count(&tp2), 4 * c.layers);
        assert_eq!(count(&dropped), 4 * c.layers - 1);
        // Vocab parallelism: each rank masks its own vocabulary range.
        let vp = |tp_rank| {
            let p = RankPlan {
                tp_rank,
                vocab_parallel: true,
                ..plan(1, 2)
            };
            build(&c, p, true, None).render()
        };
        let (r0, r1) = (vp(0), vp(1));
        assert!(r0.contains("aten.ge.Scalar(tokens, 16)"), "{r0}");
        assert!(r1.contains("aten.lt.Scalar(tokens, 16)"), "{r1}");
        assert!(r1.contains("embed: \"f32[16, 16]\""), "{r1}");
        assert!(r1.contains("all_reduce.default(amax, 'max', 'tp')"), "{r1}");
        let fw = build(&c, plan(1, 2), true, None);
        assert_eq!(fw.outputs().len(), 1);
    }
}
