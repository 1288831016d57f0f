"""A small GPT (pre-LayerNorm, learned positions, tied embeddings) in plain PyTorch, parallelized
the Megatron way: vocab-parallel embedding and cross-entropy, column/row-parallel linears,
sequence parallelism, context parallelism with load-balanced chunks (ring attention), pipeline stages, activation recomputation, emulated fp8 linears and (optionally) mixture-of-experts layers.

Activations are laid out [sequence, batch, hidden] as in Megatron, so the sequence dimension is 0.
With every parallel size 1 the same code is the single-device reference and calls no collective.
Planted bugs (seed 002, Table 1) are switches in `Bugs`; the correct program has none set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import FrozenSet, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..collector import _is_recomputing, recomputing
from ..layout import ParallelConfig
from .parallel import (CopyToTP, Fp8GatherFromSP, GatherFromSP, Groups, ReduceFromTP, ReduceScatterToSP, RingShift, ScatterToSP,
                       all_reduce, fp8_amax, fp8_round_trip)


@dataclass(frozen=True)
class ModelSpec:
    """Model sizes (global, before any split)."""

    vocab: int = 64
    hidden: int = 32
    heads: int = 4
    ffn: int = 64
    layers: int = 4
    seq: int = 16
    micro_batch: int = 2
    experts: int = 2                # experts of each MoE layer (with RunOptions.moe)


@dataclass(frozen=True)
class RunOptions:
    """How the program runs besides its parallel layout."""

    dtype: str = "float32"          # float32 | bfloat16 | float8_e4m3fn (emulated: bf16 + fp8 linears)
    recompute: bool = False         # recompute each MLP in backward (activation checkpointing)
    zero: bool = False              # ZeRO-1: optimizer state partitioned over dp
    moe: bool = False               # each layer's MLP is a mixture of experts (router + experts)
    bugs: FrozenSet[str] = field(default_factory=frozenset)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of parameters and activations."""
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.bfloat16,
                "float64": torch.float64}[self.dtype]

    @property
    def fp8(self) -> bool:
        """Whether linear layers quantize their inputs and weights to fp8."""
        return self.dtype == "float8_e4m3fn"


class Context:
    """What every module needs: the layout, this rank's groups, the options."""

    def __init__(self, config: ParallelConfig, rank: int, groups: Groups, options: RunOptions, spec: ModelSpec):
        self.config = config
        self.rank = rank
        self.coords = config.coords(rank)
        self.groups = groups
        self.options = options
        self.spec = spec

    def bug(self, name: str) -> bool:
        """Whether the planted bug `name` is switched on."""
        return name in self.options.bugs

    @property
    def sp(self) -> bool:
        """Sequence parallelism is on."""
        return self.config.sp and self.config.tp > 1


def _param(shape, ctx: Context, tp_dim: Optional[int] = None, sequence_parallel: bool = False) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.empty(shape, dtype=ctx.options.compute_dtype))
    # Like Megatron's `partition_dim` and `sequence_parallel` attributes: the initializer splits
    # by tp_dim; gradient reduction sums sequence-parallel parameters over the TP group.
    p.tp_dim = tp_dim
    p.sequence_parallel = sequence_parallel
    return p


class Fp8Amax(torch.nn.Module):
    """The amax of a linear's fp8 input cast, reduced over the group that holds the logical
    input (TP x CP), so that every shard of it is quantized with the logical tensor's scale.
    Transformer Engine keeps this statistic in the module's fp8 metadata; here it is a module
    of its own so that the tracer records it (forward output 0: one float32 element,
    replicated on every rank): the scale is a cross-rank reduction, and its replicas or its
    value tell a wrong reduction group apart from fp8 rounding noise. `fp8_wrong_group`
    (Table 1 bug 7) reduces the amax of an input gathered in fp8 under SP over the
    data-parallel group instead, so the TP ranks' scales differ."""

    def __init__(self, ctx: Context, gathered_in_fp8: bool = False):
        super().__init__()
        self.ctx = ctx
        self.gathered_in_fp8 = gathered_in_fp8

    def forward(self, x):
        ctx = self.ctx
        wrong = self.gathered_in_fp8 and ctx.sp and ctx.bug("fp8_wrong_group")
        return fp8_amax(x, ctx.groups.dp if wrong else ctx.groups.tpcp)


def _input_amax(ctx: Context, gathered_in_fp8: bool = False) -> Optional[Fp8Amax]:
    return Fp8Amax(ctx, gathered_in_fp8) if ctx.options.fp8 else None


def gathered_linear(ctx: Context, x, weight, bias, amax: Optional[Fp8Amax]):
    """A column-parallel product: the input gathered (`gather_input`), then the linear. In fp8
    under SP the input is gathered in fp8 (`Fp8GatherFromSP`), quantized with the amax of
    `amax` (an `Fp8Amax` built with `gathered_in_fp8`)."""
    if ctx.options.fp8 and ctx.sp:
        x = Fp8GatherFromSP.apply(x, ctx.groups.tp, 0, amax(x))
        return _linear(x, weight, bias, ctx, None, input_quantized=True)
    return _linear(gather_input(ctx, x), weight, bias, ctx, amax)


def gather_input(ctx: Context, x):
    """The full-sequence input of a column-parallel linear on every TP rank: all-gathered over
    the sequence under SP, else a copy whose gradient is all-reduced over TP."""
    if ctx.sp:
        return GatherFromSP.apply(x, ctx.groups.tp, 0)
    return CopyToTP.apply(x, ctx.groups.tp, ctx.bug("tp_overlap_grad"))


def _linear(x, weight, bias, ctx: Context, amax: Optional[Fp8Amax], input_quantized: bool = False):
    if ctx.options.fp8:
        if not input_quantized:
            x = fp8_round_trip(x, amax(x))
        # Table 1 bug 8: the recomputed forward multiplies by the master weight instead of its
        # fp8 cast, so the recomputed activations are not the ones the forward computed.
        if not (ctx.bug("fp8_recompute_cast") and _is_recomputing()):
            weight = fp8_round_trip(weight, fp8_amax(weight, ctx.groups.tp))
    return F.linear(x, weight, bias)


class LayerNorm(torch.nn.Module):
    """LayerNorm over the hidden dim; its weight and bias are replicated over TP, so under SP
    their gradients are partial sums over sequence shards."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.weight = _param((ctx.spec.hidden,), ctx, sequence_parallel=ctx.sp)
        self.bias = _param((ctx.spec.hidden,), ctx, sequence_parallel=ctx.sp)

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps=1e-5)


class ColumnParallelLinear(torch.nn.Module):
    """y = x W^T + b with W split by output rows over TP. Input: full (or sequence-sharded under
    SP: all-gathered here). Output: split on the last dim."""

    def __init__(self, ctx: Context, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.ctx = ctx
        tp = ctx.config.tp
        self.weight = _param((out_features // tp, in_features), ctx, tp_dim=0)
        self.bias = _param((out_features // tp,), ctx, tp_dim=0) if bias else None
        self.input_amax = _input_amax(ctx, gathered_in_fp8=True)

    def forward(self, x):
        return gathered_linear(self.ctx, x, self.weight, self.bias, self.input_amax)


class RowParallelLinear(torch.nn.Module):
    """y = x W^T + b with W split by input columns over TP; the partial products are all-reduced
    (reduce-scattered along the sequence under SP), then the replicated bias is added."""

    def __init__(self, ctx: Context, in_features: int, out_features: int):
        super().__init__()
        self.ctx = ctx
        self.weight = _param((out_features, in_features // ctx.config.tp), ctx, tp_dim=1)
        self.bias = _param((out_features,), ctx, sequence_parallel=ctx.sp)
        self.input_amax = _input_amax(ctx)

    def forward(self, x):
        ctx = self.ctx
        partial = _linear(x, self.weight, None, ctx, self.input_amax)
        if ctx.sp:
            out = ReduceScatterToSP.apply(partial, ctx.groups.tp, 0)
        else:
            out = ReduceFromTP.apply(partial, ctx.groups.tp)
        return out + self.bias


class VocabParallelEmbedding(torch.nn.Module):
    """Word embeddings split by vocabulary rows over TP: each rank looks up the tokens of its
    range, zeroes the others, and the partial lookups are all-reduced."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.ctx = ctx
        tp = ctx.config.tp
        self.vocab_per_rank = ctx.spec.vocab // tp
        self.weight = _param((self.vocab_per_rank, ctx.spec.hidden), ctx, tp_dim=0)

    def forward(self, tokens):
        ctx = self.ctx
        begin = ctx.groups.tp.index * self.vocab_per_rank
        end = begin + self.vocab_per_rank
        if ctx.config.tp > 1:
            outside = (tokens < begin) | (tokens >= end)
            local = torch.where(outside, torch.zeros_like(tokens), tokens - begin)
            out = F.embedding(local, self.weight)
            if ctx.bug("embedding_mask"):
                # Table 1 bug 1 (seed Figure 4): the output mask recomputed from the shifted
                # indices, with `~(x >= end)` where `x >= end` was meant.
                outside = (local < begin) | ~(local >= end)
            out = out * (~outside).unsqueeze(-1).to(out.dtype)
        else:
            out = F.embedding(tokens, self.weight)
        return ReduceFromTP.apply(out, ctx.groups.tp)


class Embedding(torch.nn.Module):
    """Word plus position embeddings; under SP the output keeps this rank's sequence slice.
    `word_only` builds only the word embeddings (the last pipeline stage's tied LM-head weight)."""

    def __init__(self, ctx: Context, word_only: bool = False):
        super().__init__()
        self.ctx = ctx
        self.word_embeddings = VocabParallelEmbedding(ctx)
        if not word_only:
            self.position_embeddings = torch.nn.Embedding(ctx.spec.seq, ctx.spec.hidden,
                                                          dtype=ctx.options.compute_dtype)
            self.position_embeddings.weight.tp_dim = None
            self.position_embeddings.weight.sequence_parallel = False

    def forward(self, tokens, positions):
        x = self.word_embeddings(tokens) + self.position_embeddings(positions).unsqueeze(1)
        if self.ctx.sp:
            x = ScatterToSP.apply(x, self.ctx.groups.tp, 0)
        return x


class CoreAttention(torch.nn.Module):
    """Causal softmax attention of this rank's heads. Input: the fused q/k/v projection
    [s, b, heads_local * 3 * head_dim] (heads grouped: per head q, k, v). Under CP it is ring
    attention: the key/value blocks travel around the CP group in cp steps, each step's partial
    attention is kept with its log-sum-exp, and the blocks are combined exactly at the end; the
    causal mask uses global positions (load-balanced chunks)."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.ctx = ctx
        self.head_dim = ctx.spec.hidden // ctx.spec.heads

    def _block(self, q, k, v, q_positions, k_positions):
        """Attention of q to one key block: (output [b,h,s,d], log-sum-exp [b,h,s]), float32."""
        scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(self.head_dim)
        allowed = q_positions.view(-1, 1) >= k_positions.view(1, -1)
        # A large finite negative keeps fully masked rows free of NaN; their weight is exp(-huge) = 0.
        scores = scores.masked_fill(~allowed, -1e30)
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.einsum("bhqk,kbhd->bhqd", torch.exp(scores - lse.unsqueeze(-1)), v)
        return out, lse

    def forward(self, qkv, positions):
        ctx = self.ctx
        s, b, width = qkv.shape
        heads = width // (3 * self.head_dim)
        q, k, v = (t.float() for t in qkv.view(s, b, heads, 3, self.head_dim).unbind(dim=3))
        outs, lses = [], []
        key_positions = positions
        for step in range(ctx.config.cp):
            if step > 0:
                swap = ctx.bug("cp_attention_grad")
                k = RingShift.apply(k, ctx.groups.cp, swap)
                v = RingShift.apply(v, ctx.groups.cp, swap)
                key_positions = RingShift.apply(key_positions, ctx.groups.cp, False)
            out, lse = self._block(q, k, v, positions, key_positions)
            outs.append(out)
            lses.append(lse)
        lse_all = torch.logsumexp(torch.stack(lses), dim=0)
        context = sum(torch.exp(lse - lse_all).unsqueeze(-1) * out for out, lse in zip(outs, lses))
        # [b, h, s, d] -> [s, b, h*d]
        return context.permute(2, 0, 1, 3).reshape(s, b, heads * self.head_dim).to(qkv.dtype)


class SelfAttention(torch.nn.Module):
    """linear_qkv (column parallel) -> core_attention -> linear_proj (row parallel)."""

    def __init__(self, ctx: Context):
        super().__init__()
        h = ctx.spec.hidden
        self.linear_qkv = ColumnParallelLinear(ctx, h, 3 * h)
        self.core_attention = CoreAttention(ctx)
        self.linear_proj = RowParallelLinear(ctx, h, h)

    def forward(self, x, positions):
        return self.linear_proj(self.core_attention(self.linear_qkv(x), positions))


# Table 1 bug 2: with `stale_recompute`, every recomputed MLP reads its input from one buffer
# shared by all layers (overwritten by the last forward), instead of its own saved input.
_SHARED_RECOMPUTE_INPUT: dict = {}


class _RecomputeMLP(torch.autograd.Function):
    """Activation checkpointing: forward without a graph, recompute in backward."""

    @staticmethod
    def forward(ctx, x, run, stale):
        ctx.run, ctx.stale = run, stale
        if stale:
            _SHARED_RECOMPUTE_INPUT["x"] = x.detach()
        else:
            ctx.save_for_backward(x.detach())
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, grad):
        saved = _SHARED_RECOMPUTE_INPUT["x"] if ctx.stale else ctx.saved_tensors[0]
        x = saved.detach().requires_grad_(True)
        with torch.enable_grad(), recomputing():
            y = ctx.run(x)
        torch.autograd.backward(y, grad)
        return x.grad, None, None


class MLP(torch.nn.Module):
    """linear_fc1 (column parallel) -> GeLU -> linear_fc2 (row parallel), optionally recomputed."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.ctx = ctx
        self.linear_fc1 = ColumnParallelLinear(ctx, ctx.spec.hidden, ctx.spec.ffn)
        self.linear_fc2 = RowParallelLinear(ctx, ctx.spec.ffn, ctx.spec.hidden)

    def _run(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))

    def forward(self, x):
        if self.ctx.options.recompute and torch.is_grad_enabled():
            return _RecomputeMLP.apply(x, self._run, self.ctx.bug("stale_recompute"))
        return self._run(x)


class DenseLinear(torch.nn.Module):
    """y = x W^T + b with W whole on every TP rank: an expert's or router's projection of this
    rank's tokens. Under SP each TP rank sees other tokens, so the gradients are partial sums
    over TP (`sequence_parallel`) and are all-reduced with the layernorms'."""

    def __init__(self, ctx: Context, in_features: int, out_features: int):
        super().__init__()
        self.ctx = ctx
        self.weight = _param((out_features, in_features), ctx, sequence_parallel=ctx.sp)
        self.bias = _param((out_features,), ctx, sequence_parallel=ctx.sp)
        self.input_amax = _input_amax(ctx)

    def forward(self, x):
        return _linear(x, self.weight, self.bias, self.ctx, self.input_amax)


class Router(torch.nn.Module):
    """The MoE router: per token, the softmax over experts of a linear projection, in float32
    (as Megatron keeps routing in float32). Its weight is whole on every TP rank; under SP its
    gradient is a partial sum over TP (Table 1 bug 6 leaves it unreduced)."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.weight = _param((ctx.spec.experts, ctx.spec.hidden), ctx, sequence_parallel=ctx.sp)

    def forward(self, x):
        return torch.softmax(F.linear(x.float(), self.weight.float()), dim=-1)


class Expert(torch.nn.Module):
    """One expert: fc_in -> GeLU -> fc_out on this rank's tokens."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.fc_in = DenseLinear(ctx, ctx.spec.hidden, ctx.spec.ffn)
        self.fc_out = DenseLinear(ctx, ctx.spec.ffn, ctx.spec.hidden)

    def forward(self, x):
        return self.fc_out(F.gelu(self.fc_in(x)))


class MoE(torch.nn.Module):
    """A mixture of experts in place of the MLP: every token's output is the router-weighted sum
    of the experts' outputs. The routing is dense (soft): with top-k routing a rounding
    difference between the reference and a correct candidate can send a token to another
    expert, a discontinuity that no perturbation tolerance bounds. Tokens stay where they are
    (no expert parallelism): under SP each TP rank routes its own sequence slice; without SP
    every TP rank computes the whole layer. Not recomputed."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.router = Router(ctx)
        self.experts = torch.nn.ModuleList(Expert(ctx) for _ in range(ctx.spec.experts))

    def forward(self, x):
        gates = self.router(x)
        # The gates and the weighted sum stay in float32 (the gradient of the routing is a
        # difference of the experts' weighted outputs, which bf16 products would round away).
        return sum(gates[..., e:e + 1] * expert(x).float() for e, expert in enumerate(self.experts)).to(x.dtype)


class TransformerLayer(torch.nn.Module):
    """Pre-LN layer: x + attention(ln(x)), then + mlp(ln(.)). `layer_number` is the global index
    this layer believes it has (used to initialize it)."""

    def __init__(self, ctx: Context, layer_number: int):
        super().__init__()
        self.layer_number = layer_number
        self.input_layernorm = LayerNorm(ctx)
        self.self_attention = SelfAttention(ctx)
        self.pre_mlp_layernorm = LayerNorm(ctx)
        self.mlp = MoE(ctx) if ctx.options.moe else MLP(ctx)

    def forward(self, x, positions):
        x = x + self.self_attention(self.input_layernorm(x), positions)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class OutputLayer(torch.nn.Module):
    """The LM head: a column-parallel (vocab-split) projection with the tied word embeddings."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.ctx = ctx
        self.input_amax = _input_amax(ctx, gathered_in_fp8=True)

    def forward(self, x, weight):
        return gathered_linear(self.ctx, x, weight, None, self.input_amax)


class VocabParallelCrossEntropy(torch.nn.Module):
    """Per-token cross-entropy of vocab-split logits (float32): the max, the sum of exponentials
    and the target logit are reduced over TP."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.ctx = ctx

    def forward(self, logits, labels):
        ctx = self.ctx
        logits = logits.float()
        per_rank = logits.shape[-1]
        begin = ctx.groups.tp.index * per_rank
        local_max = logits.detach().amax(dim=-1)
        if ctx.config.tp > 1:
            local_max = all_reduce(local_max, ctx.groups.tp, op=dist.ReduceOp.MAX)
        shifted = logits - local_max.unsqueeze(-1)
        sum_exp = ReduceFromTP.apply(shifted.exp().sum(dim=-1), ctx.groups.tp)
        inside = (labels >= begin) & (labels < begin + per_rank)
        local_labels = torch.where(inside, labels - begin, torch.zeros_like(labels))
        target = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1) * inside.float()
        target = ReduceFromTP.apply(target, ctx.groups.tp)
        return torch.log(sum_exp) - target


def stage_layer_numbers(ctx: Context, chunk: int = 0) -> List[int]:
    """The global layer indices virtual chunk `chunk` of this pipeline stage builds: chunk v of
    stage p is virtual stage v*pp + p and holds L/(pp*vpp) layers. `pp_stage_division` is
    Table 1 bug 10: a later stage computes its offset from the wrong per-stage count."""
    cfg = ctx.config
    per_chunk = ctx.spec.layers // (cfg.pp * cfg.vpp)
    virtual_stage = chunk * cfg.pp + ctx.coords.pp
    offset = virtual_stage * per_chunk
    if ctx.bug("pp_stage_division") and ctx.coords.pp > 0:
        offset = virtual_stage * (per_chunk - 1)
    return list(range(offset, offset + per_chunk))


class GPTStage(torch.nn.Module):
    """One pipeline stage, or one virtual chunk of it under VPP (the whole model when pp = 1).
    Module names inside are stage-local (`layers.0` ...); the tracer maps them back to global
    layers."""

    def __init__(self, ctx: Context, chunk: int = 0):
        super().__init__()
        cfg = ctx.config
        self.ctx = ctx
        self.chunk = chunk
        self.pre_process = ctx.coords.pp == 0 and chunk == 0
        self.post_process = ctx.coords.pp == cfg.pp - 1 and chunk == cfg.vpp - 1
        if self.pre_process:
            self.embedding = Embedding(ctx)
        elif self.post_process:
            self.embedding = Embedding(ctx, word_only=True)  # the tied LM-head weight
        self.layers = torch.nn.ModuleList(TransformerLayer(ctx, n) for n in stage_layer_numbers(ctx, chunk))
        if self.post_process:
            self.final_layernorm = LayerNorm(ctx)
            self.output_layer = OutputLayer(ctx)
            self.loss = VocabParallelCrossEntropy(ctx)

    def forward(self, hidden_or_tokens, positions, labels=None):
        """Stage input -> stage output (per-token losses on the last stage)."""
        x = self.embedding(hidden_or_tokens, positions) if self.pre_process else hidden_or_tokens
        for layer in self.layers:
            x = layer(x, positions)
        if not self.post_process:
            return x
        logits = self.output_layer(self.final_layernorm(x), self.embedding.word_embeddings.weight)
        return self.loss(logits, labels)
