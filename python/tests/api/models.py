"""Tiny models and plans of the API tests, written the way a user writes them."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


class MLP(nn.Module):
    """A two-layer MLP: fc1 column-parallel, fc2 row-parallel under the Megatron plan."""

    def __init__(self, d: int = 8, h: int = 16, o: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, o)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h)


def megatron_plan() -> dict:
    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def mse(y, target):
    return ((y - target) ** 2).mean()


class RowwiseWithoutReduce(RowwiseParallel):
    """A planted bug: the row-parallel output's partial sums are declared replicated, with no
    all-reduce (what a hand-written row-parallel layer that forgets its reduction computes)."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        wrong = DTensor.from_local(outputs.to_local(), device_mesh, (Replicate(),), run_check=False)
        return wrong.to_local() if use_local_output else wrong


class RowwiseSequenceWithoutReduce(RowwiseParallel):
    """A planted sequence-parallel bug: the row-parallel output's partial sums are cut to the
    rank's sequence shard and declared `Shard(1)`, with no reduce-scatter (what a hand-written
    sequence-parallel layer that forgets its reduction computes)."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        from torch.distributed.tensor import Shard

        partial = outputs.to_local()
        piece = partial.chunk(device_mesh.size(), dim=1)[device_mesh.get_local_rank()]
        wrong = DTensor.from_local(piece, device_mesh, (Shard(1),), run_check=False)
        return wrong.to_local() if use_local_output else wrong


class Classifier(nn.Module):
    """fc1 column-parallel with its output gathered, fc2 column-parallel over the classes: the
    logits stay vocab-sharded for `loss_parallel`'s cross-entropy."""

    def __init__(self, d: int = 8, h: int = 16, classes: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, classes, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def loss_parallel_plan() -> dict:
    return {
        "fc1": ColwiseParallel(output_layouts=Replicate()),
        "fc2": ColwiseParallel(use_local_output=False),
    }


def cross_entropy(logits, target):
    return torch.nn.functional.cross_entropy(logits, target)


class RMSNorm(nn.Module):
    """Llama's RMSNorm, written as torchtitan's reference writes it."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head attention; the head count on a rank follows from its q projection's
    local width (`view(.., -1, head_dim)`), as in torchtitan's Llama."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.head_dim = d // heads
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """Llama's SwiGLU feed-forward."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.w1 = nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)
        self.w3 = nn.Linear(d, h, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """One pre-norm Llama block with its final norm and output projection to the vocabulary."""

    def __init__(self, d: int = 8, heads: int = 4, h: int = 16, vocab: int = 8, eps: float = 1e-6):
        super().__init__()
        self.attention_norm = RMSNorm(d, eps)
        self.attention = Attention(d, heads)
        self.ffn_norm = RMSNorm(d, eps)
        self.feed_forward = FeedForward(d, h)
        self.norm = RMSNorm(d, eps)
        self.output = nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        x = x + self.feed_forward(self.ffn_norm(x))
        return self.output(self.norm(x))


def llama_plan(loss_parallel: bool = True, sequence_parallel: bool = True) -> dict:
    """torchtitan's tensor- and sequence-parallel plan for a block: norms sequence-parallel,
    attention and feed-forward Megatron-style, the output projection vocab-parallel."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    if not sequence_parallel:
        # Norms replicated: the block's input and every residual are whole on each rank.
        return {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "output": ColwiseParallel(use_local_output=not loss_parallel),
        }
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), use_local_output=not loss_parallel),
    }


def token_cross_entropy(logits, target):
    """Cross-entropy over every token: logits [b, s, v], targets [b, s]."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))
