"""DTensor values (programs parallelized with PyTorch's own `parallelize_module` plans).

A DTensor carries its layout: the device mesh, this rank's coordinate on it and one placement
per mesh dimension. The collector records its local tensor with a shard map derived from them,
so the annotation file only says *which* modules to trace for such values, not how they are
split. Placements:

* `Shard(d)`: mesh dimension i splits tensor dimension d the way `torch.chunk` does;
* `Replicate()`: every rank of that mesh dimension holds the same range (replicas, which the
  comparer checks for agreement);
* `Partial(op)`: each rank holds a term of a reduction, not a slice of the logical tensor. The
  collector records the logical value, so it reduces the partial mesh dimensions first (a
  collective: every rank of the mesh runs the same hooks in the same order, as SPMD programs
  do). A plan that *drops* a reduction hands plain local tensors on, which the annotation
  describes, so a dropped reduction still shows as disagreeing replicas or a wrong shape.

Other placements (`_StridedShard` of FSDP x TP, custom ones) are refused with `LayoutError`:
their local tensor is not a box of the logical tensor that this module can name.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .layout import LayoutError, ShardMap, mesh_shard_map

try:  # DTensor is absent from some torch builds (no distributed support).
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import Partial
except ImportError:  # pragma: no cover - exercised only on torch builds without distributed
    DTensor = Replicate = Shard = Partial = None

try:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
except ImportError:  # pragma: no cover
    AsyncCollectiveTensor = None


def is_dtensor(value) -> bool:
    """Whether `value` is a DTensor."""
    return DTensor is not None and isinstance(value, DTensor)


def settled(value):
    """`value` with any pending functional collective waited for (the output of a
    `RowwiseParallel` with `use_local_output=True` is an `AsyncCollectiveTensor`)."""
    if AsyncCollectiveTensor is not None and isinstance(value, AsyncCollectiveTensor):
        return value.wait()
    return value


def _shard_dims(value, what: str):
    dims = []
    for mesh_dim, placement in enumerate(value.placements):
        if type(placement) is Shard:  # noqa: E721 - a subclass (_StridedShard) is another layout
            dims.append(placement.dim)
        elif isinstance(placement, Replicate):
            dims.append(None)
        else:
            raise LayoutError(f"{what}: DTensor placement {placement} on mesh dimension {mesh_dim} is not "
                              "supported (Shard, Replicate and Partial are)")
    return dims


def has_partial(value) -> bool:
    """Whether a DTensor holds a partial reduction on some mesh dimension."""
    return any(isinstance(p, Partial) for p in value.placements)


def unwrap(value, what: str) -> Tuple[torch.Tensor, ShardMap]:
    """The local tensor of a DTensor (partial dimensions reduced first) and its shard map."""
    with torch.no_grad():
        value = value.detach()
        if has_partial(value):
            placements = [Replicate() if isinstance(p, Partial) else p for p in value.placements]
            value = value.redistribute(value.device_mesh, placements)
        dims = _shard_dims(value, what)
        mesh = value.device_mesh
        coordinate = mesh.get_coordinate()
        if coordinate is None:
            raise LayoutError(f"{what}: this rank is not on the DTensor's device mesh")
        smap = mesh_shard_map(tuple(value.shape), tuple(mesh.shape), tuple(coordinate), dims, what=what)
        local = settled(value.to_local())
    if tuple(local.shape) != smap.local_shape:
        raise LayoutError(f"{what}: the DTensor's local shape {tuple(local.shape)} is not the {smap.local_shape} "
                          f"its placements {tuple(value.placements)} give for global shape {tuple(value.shape)}")
    return local, smap


def like(local: torch.Tensor, model, what: str):
    """A DTensor with `model`'s mesh, placements and global shape around `local` (a rewrite's
    replacement). A partial `model` cannot be rewritten: its local value is not a shard."""
    if has_partial(model):
        raise LayoutError(f"{what}: a DTensor with a Partial placement cannot be rewritten; trace the module "
                          "whose input it is after the reduction")
    return DTensor.from_local(local, model.device_mesh, model.placements, run_check=False, shape=model.shape,
                              stride=model.stride())


def local_view(value):
    """The storage a parameter's in-place update must write: the local tensor of a DTensor,
    the tensor itself otherwise."""
    if not is_dtensor(value):
        return value
    with torch.no_grad():  # without grad mode, to_local returns the local storage itself
        return value.to_local()
