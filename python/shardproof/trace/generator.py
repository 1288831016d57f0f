"""Consistent tensor generator (TTrace section 4.2).

The logical full tensor of a canonical id is drawn from a random generator seeded by a stable hash
of the id (SHA-256 of its string form; Python's `hash` is salted per process and would differ
between ranks). Each rank then takes its shard by its shard map, so the reference and every
candidate rank hold slices of one and the same tensor.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import torch

from .layout import ShardMap, extract_local


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from the string forms of `parts`, identical in every process."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little") & ((1 << 63) - 1)


class ConsistentGenerator:
    """Generates logical full tensors by canonical id, and each rank's shard of them.

    `base_seed` separates whole experiments (two generators with the same base seed agree)."""

    def __init__(self, base_seed: int = 0):
        self.base_seed = base_seed

    def full(self, key: object, shape: Sequence[int], dtype: torch.dtype = torch.float32,
             std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        """The full tensor for `key` (a canonical id or any stable name): normal(mean, std),
        drawn in float32 on the CPU and cast, so every dtype sees the same values rounded."""
        gen = torch.Generator().manual_seed(stable_seed(self.base_seed, key))
        values = torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * std + mean
        return values.to(dtype)

    def shard(self, key: object, smap: ShardMap, dtype: torch.dtype = torch.float32, std: float = 1.0,
              mean: float = 0.0, device: Optional[torch.device] = None) -> torch.Tensor:
        """This rank's shard of the full tensor for `key` under the shard map `smap`."""
        local = extract_local(self.full(key, smap.full_shape, dtype, std, mean), smap)
        return local if device is None else local.to(device)

    def integers(self, key: object, shape: Sequence[int], high: int) -> torch.Tensor:
        """Full integer tensor in [0, high) for `key` (token ids, labels)."""
        gen = torch.Generator().manual_seed(stable_seed(self.base_seed, "int", key))
        return torch.randint(0, high, tuple(shape), generator=gen)


def perturbation_noise(seed: int, key: object, smap: ShardMap) -> torch.Tensor:
    """This rank's shard of standard-normal noise for `key` in perturbed run `seed` (float32)."""
    gen = torch.Generator().manual_seed(stable_seed("perturb", seed, key))
    return extract_local(torch.randn(smap.full_shape, generator=gen, dtype=torch.float32), smap)
