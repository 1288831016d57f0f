"""Placements: reading the user's spellings, writing the case file's, and cutting a rank's piece.

Placements are kept as one torch placement per mesh dim (DTensor's own form), so a layout read
from a DTensor and one the user wrote compare directly.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

Layout = tuple  # one torch Placement per mesh dim, in mesh order

_SPELLING = re.compile(r"^\s*(Shard|S|Replicate|R|Partial|P)\s*(?:\(\s*([^)]*?)\s*\))?\s*$")


class CaptureError(Exception):
    """A capture that cannot give a sound case: bad arguments, or a program the tracer refused."""


def parse_placement(value: Any) -> Any:
    """One placement from a torch placement or a case-file spelling (`Shard(0)`, `R`, ...)."""
    if isinstance(value, (Shard, Replicate, Partial)):
        if type(value) is not Shard and isinstance(value, Shard):
            # _StridedShard (FSDP over TP) is not a layout the case file can state.
            raise CaptureError(f"placement {value!r} has no case-file form (only even Shard)")
        return value
    if isinstance(value, str):
        m = _SPELLING.match(value)
        if m:
            kind, arg = m.group(1), (m.group(2) or "").strip()
            arg = arg.split("=", 1)[-1].strip().strip("'\"")
            if kind in ("Shard", "S") and re.fullmatch(r"\d+", arg):
                return Shard(int(arg))
            if kind in ("Replicate", "R") and arg == "":
                return Replicate()
            if kind in ("Partial", "P"):
                op = {"": "sum", "mean": "avg"}.get(arg, arg)
                if op in ("sum", "avg", "max", "min"):
                    return Partial(op)
    raise CaptureError(
        f"cannot read placement {value!r}: expected Shard(d), Replicate() or Partial() "
        "(a torch placement or its spelling)"
    )


def parse_layout(value: Any, mesh_dims: Sequence[str]) -> Layout:
    """A layout over the whole mesh from one placement (1-d mesh, or Replicate on any mesh), a
    sequence with one placement per mesh dim, or a `{dim: placement}` map (others Replicate)."""
    if isinstance(value, Mapping):
        unknown = [d for d in value if d not in mesh_dims]
        if unknown:
            raise CaptureError(f"unknown mesh dim(s) {unknown} in {value!r}; the mesh has {list(mesh_dims)}")
        return tuple(parse_placement(value.get(d, Replicate())) for d in mesh_dims)
    if isinstance(value, (list, tuple)):
        if len(value) != len(mesh_dims):
            raise CaptureError(
                f"layout {value!r} has {len(value)} placements; the mesh {list(mesh_dims)} needs {len(mesh_dims)}"
            )
        return tuple(parse_placement(v) for v in value)
    p = parse_placement(value)
    if len(mesh_dims) == 1 or isinstance(p, Replicate):
        return (p,) * len(mesh_dims) if isinstance(p, Replicate) else (p,)
    raise CaptureError(
        f"placement {value!r} is ambiguous on the mesh {list(mesh_dims)}: give one per dim, "
        f"e.g. {{'{mesh_dims[-1]}': {value!r}}}"
    )


def placement_text(p: Any) -> str:
    """The case file's spelling of one placement."""
    if isinstance(p, Shard):
        return f"Shard({p.dim})"
    if isinstance(p, Replicate):
        return "Replicate()"
    if isinstance(p, Partial):
        op = p.reduce_op
        return "Partial()" if op == "sum" else f"Partial({op})"
    raise CaptureError(f"placement {p!r} has no case-file form")


def layout_text(layout: Layout, mesh_dims: Sequence[str]) -> str:
    """The case file's spelling of a layout: bare on a 1-d mesh or when replicated everywhere,
    else a per-dim map naming the dims that are not Replicate."""
    if all(isinstance(p, Replicate) for p in layout):
        return "Replicate()"
    if len(mesh_dims) == 1:
        return placement_text(layout[0])
    inner = ", ".join(
        f"{d}: {placement_text(p)}" for d, p in zip(mesh_dims, layout) if not isinstance(p, Replicate)
    )
    return "{ " + inner + " }"


def normalize_dim(layout: Layout, ndim: int) -> Layout:
    """Negative shard dims (DTensor's `Shard(-1)`) counted from the front, as the case needs."""
    out = []
    for p in layout:
        if isinstance(p, Shard) and p.dim < 0:
            p = Shard(p.dim + ndim)
        out.append(p)
    return tuple(out)


def coords(rank: int, sizes: Sequence[int]) -> list[int]:
    """A rank's coordinates on a row-major mesh (DeviceMesh's order)."""
    out = []
    for size in reversed(sizes):
        out.append(rank % size)
        rank //= size
    return list(reversed(out))


def local_piece(t: torch.Tensor, layout: Layout, sizes: Sequence[int], rank: int, name: str) -> torch.Tensor:
    """The piece of the full tensor `t` that `rank` holds under `layout` (even shards only,
    several mesh dims on one tensor dim split earlier-dim major, as DTensor does)."""
    c = coords(rank, sizes)
    out = t
    # Per tensor dim: the mesh dims that shard it, in mesh order.
    by_dim: dict[int, list[int]] = {}
    for i, p in enumerate(layout):
        if isinstance(p, Partial):
            raise CaptureError(
                f"input `{name}`: a Partial() input has no single local value to feed; "
                "give it as Replicate() or Shard(d)"
            )
        if isinstance(p, Shard):
            if not 0 <= p.dim < t.dim():
                raise CaptureError(f"input `{name}`: Shard({p.dim}) is out of range for shape {list(t.shape)}")
            by_dim.setdefault(p.dim, []).append(i)
    for d, mesh_is in by_dim.items():
        pieces, index = 1, 0
        for i in mesh_is:
            pieces *= sizes[i]
            index = index * sizes[i] + c[i]
        if t.shape[d] % pieces:
            raise CaptureError(
                f"input `{name}`: dim {d} of shape {list(t.shape)} is not divisible into {pieces} shards"
            )
        step = t.shape[d] // pieces
        out = out.narrow(d, index * step, step)
    return out.contiguous().clone()
