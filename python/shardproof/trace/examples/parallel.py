"""Megatron-style parallel building blocks in plain PyTorch: process groups and the autograd
functions that move activations between tensor-, sequence- and context-parallel layouts.

Collectives run on `gloo` (CPU). gloo has no bfloat16 reductions and no reduce-scatter, so every
collective communicates in float32 and a reduce-scatter is an all-reduce followed by a slice;
the sums are the same. With a group of one rank (the single-device reference) every function is
the identity and no collective is called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ..layout import ParallelConfig


@dataclass
class Group:
    """One process group this rank belongs to: the group handle, its ranks and our index in it."""

    ranks: List[int]
    index: int
    handle: Optional[object] = None

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.ranks)


def _single() -> Group:
    return Group(ranks=[0], index=0, handle=None)


@dataclass
class Groups:
    """The groups of one rank. `single()` gives the single-device reference's groups."""

    tp: Group = field(default_factory=_single)
    cp: Group = field(default_factory=_single)
    dp: Group = field(default_factory=_single)
    tpcp: Group = field(default_factory=_single)   # fp8 activation amax
    dpcp: Group = field(default_factory=_single)   # gradient reduction
    embedding: Group = field(default_factory=_single)  # first and last pipeline stage (tied weights)
    pp_prev: Optional[int] = None
    pp_next: Optional[int] = None

    @staticmethod
    def build(config: ParallelConfig, rank: int) -> "Groups":
        """Creates every group of the layout (all ranks must call this, in the same order)."""
        world = config.world_size
        coords = [config.coords(r) for r in range(world)]

        def make(key) -> Group:
            buckets: Dict[tuple, List[int]] = {}
            for r, c in enumerate(coords):
                buckets.setdefault(key(c), []).append(r)
            mine = None
            for ranks in sorted(buckets.values()):
                handle = dist.new_group(ranks) if len(ranks) > 1 else None
                if rank in ranks:
                    mine = Group(ranks=ranks, index=ranks.index(rank), handle=handle)
            return mine

        groups = Groups()
        groups.tp = make(lambda c: (c.pp, c.dp, c.cp))
        groups.cp = make(lambda c: (c.pp, c.dp, c.tp))
        groups.dp = make(lambda c: (c.pp, c.cp, c.tp))
        groups.tpcp = make(lambda c: (c.pp, c.dp))
        groups.dpcp = make(lambda c: (c.pp, c.tp))
        # The embedding group: the first and the last stage at the same (dp, cp, tp).
        last = config.pp - 1
        groups.embedding = make(lambda c: (c.dp, c.cp, c.tp) if c.pp in (0, last) else ("mid", c.pp, c.dp, c.cp, c.tp))
        me = config.coords(rank)
        if me.pp > 0:
            groups.pp_prev = config.rank(type(me)(**{**me.__dict__, "pp": me.pp - 1}))
        if me.pp < last:
            groups.pp_next = config.rank(type(me)(**{**me.__dict__, "pp": me.pp + 1}))
        return groups


def all_reduce(tensor: torch.Tensor, group: Group, op=None) -> torch.Tensor:
    """A new tensor: the sum (or `op`) of `tensor` over `group`, reduced in float32."""
    if group.size == 1:
        return tensor.clone()
    buffer = tensor.detach().float().contiguous()
    dist.all_reduce(buffer, op=op or dist.ReduceOp.SUM, group=group.handle)
    return buffer.to(tensor.dtype)


def all_gather(tensor: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """The group's tensors concatenated along `dim`, in group order."""
    if group.size == 1:
        return tensor.clone()
    buffer = tensor.detach().float().contiguous()
    parts = [torch.empty_like(buffer) for _ in range(group.size)]
    dist.all_gather(parts, buffer, group=group.handle)
    return torch.cat(parts, dim=dim).to(tensor.dtype)


def reduce_scatter(tensor: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """This rank's slice along `dim` of the group's sum."""
    total = all_reduce(tensor, group)
    return total.chunk(group.size, dim=dim)[group.index].contiguous()


def split(tensor: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """This rank's contiguous slice along `dim`."""
    return tensor.chunk(group.size, dim=dim)[group.index].contiguous()


class CopyToTP(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce over TP (the input gradient of a column-parallel
    linear). `skip_reduce` is the TP-overlap bug: the partial gradient is returned unreduced."""

    @staticmethod
    def forward(ctx, x, group, skip_reduce):
        ctx.group, ctx.skip = group, skip_reduce
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad if ctx.skip else all_reduce(grad, ctx.group)), None, None


class ReduceFromTP(torch.autograd.Function):
    """Forward: all-reduce over TP. Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromSP(torch.autograd.Function):
    """Forward: all-gather the sequence dim over TP. Backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.group, ctx.dim), None, None


class ReduceScatterToSP(torch.autograd.Function):
    """Forward: reduce-scatter the sequence dim over TP. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.group, ctx.dim), None, None


class ScatterToSP(torch.autograd.Function):
    """Forward: keep this rank's sequence slice. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return split(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.group, ctx.dim), None, None


def _exchange(tensor: torch.Tensor, group: Group, send_to: int, recv_from: int) -> torch.Tensor:
    """Sends `tensor` to group member `send_to` and receives the same shape from `recv_from`
    (non-blocking both ways, so every member can send first), in float32."""
    buffer = tensor.detach().float().contiguous()
    received = torch.empty_like(buffer)
    requests = [dist.isend(buffer, group.ranks[send_to]), dist.irecv(received, group.ranks[recv_from])]
    for request in requests:
        request.wait()
    return received.to(tensor.dtype)


class RingShift(torch.autograd.Function):
    """One ring-attention step: forward passes this rank's block to the next CP rank and receives
    the previous rank's; backward passes gradients the other way round. `swap_chunks` is the CP
    attention-gradient bug: the returning gradient's two load-balanced chunks come back swapped
    (a layout mismatch)."""

    @staticmethod
    def forward(ctx, x, group, swap_chunks):
        ctx.group, ctx.swap = group, swap_chunks
        n, i = group.size, group.index
        return _exchange(x, group, (i + 1) % n, (i - 1) % n)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        n, i = group.size, group.index
        back = _exchange(grad, group, (i - 1) % n, (i + 1) % n)
        if ctx.swap:
            first, second = back.chunk(2, dim=0)
            back = torch.cat([second, first], dim=0)
        return back, None, None


class _StraightThrough(torch.autograd.Function):
    """Forward: the quantized value. Backward: the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x, quantized):
        return quantized

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def fp8_amax(x: torch.Tensor, amax_group: Optional[Group]) -> torch.Tensor:
    """The amax of a per-tensor fp8 cast: the largest magnitude of `x`, reduced (max) over
    `amax_group` so that every shard of one logical tensor gets the logical tensor's scale.
    A float32 tensor of one element, outside the graph."""
    amax = x.detach().abs().amax().float().reshape(1)
    if amax_group is not None and amax_group.size > 1:
        amax = all_reduce(amax, amax_group, op=dist.ReduceOp.MAX)
    return amax


def fp8_round_trip(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Emulated fp8 (e4m3) with per-tensor scaling: scale by 448/amax (`fp8_amax`), cast to
    float8_e4m3fn and back, unscale. Straight-through gradient."""
    scale = 448.0 / torch.clamp(amax, min=1e-12)
    quantized = ((x.detach().float() * scale).to(torch.float8_e4m3fn).float() / scale).to(x.dtype)
    return _StraightThrough.apply(x, quantized)


class Fp8GatherFromSP(torch.autograd.Function):
    """Forward: the sequence all-gather of an fp8 input under SP done in fp8 (as Transformer
    Engine gathers fp8 inputs): each rank quantizes its slice with scale 448/amax, the ranks
    all-gather the fp8 codes, and each dequantizes the gathered codes with its own scale. That
    is right only when every rank's amax is the same, i.e. when it was reduced over a group that
    spans the gathered tensor's shards. Backward: reduce-scatter (straight-through)."""

    @staticmethod
    def forward(ctx, x, group, dim, amax):
        ctx.group, ctx.dim = group, dim
        scale = 448.0 / torch.clamp(amax, min=1e-12)
        codes = (x.detach().float() * scale).to(torch.float8_e4m3fn).float()
        return (all_gather(codes, group, dim) / scale).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.group, ctx.dim), None, None, None
