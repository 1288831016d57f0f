"""Writes a trace (format version 1): `trace.json`, and per rank `rank-NNNNN/index.json` and
`rank-NNNNN/tensors.safetensors`.

The safetensors file is written by hand (8-byte little-endian header length, JSON header, raw
row-major bytes) so the collector needs torch only.
"""

from __future__ import annotations

import ctypes
import json
import os
from typing import List, Optional

import torch

from .layout import CanonicalId, Coords, ParallelConfig, ShardMap

FORMAT = "shardproof-trace"
VERSION = 1
PRODUCER = "shardproof.trace 0.1.0"
ROLES = ("reference", "candidate", "perturbed")

#: Run dtype name (trace.json) -> torch dtype.
RUN_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
              "float64": torch.float64, "float8_e4m3fn": torch.float8_e4m3fn}
_SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}


def storage_dtype(run_dtype: str) -> torch.dtype:
    """The dtype tensors are stored in: the run's dtype, emulated fp8 as bfloat16."""
    if run_dtype not in RUN_DTYPES:
        raise ValueError(f"unknown run dtype `{run_dtype}`; expected one of {', '.join(RUN_DTYPES)}")
    return torch.bfloat16 if run_dtype == "float8_e4m3fn" else RUN_DTYPES[run_dtype]


def rank_dir(out: str, rank: int) -> str:
    """The directory of one rank's files."""
    return os.path.join(out, f"rank-{rank:05d}")


def write_safetensors(path: str, tensors: List[tuple]) -> None:
    """Writes (name, tensor) pairs, in order, as a safetensors file."""
    header = {}
    offset = 0
    blobs = []
    for name, tensor in tensors:
        tensor = tensor.detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPE[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        blobs.append((tensor, nbytes))
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(len(raw).to_bytes(8, "little"))
        handle.write(raw)
        for tensor, nbytes in blobs:
            if nbytes:
                handle.write(ctypes.string_at(tensor.data_ptr(), nbytes))


def write_json(path: str, value) -> None:
    """Writes JSON deterministically (sorted by insertion, two-space indent)."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1)
        handle.write("\n")


class RankTraceWriter:
    """Collects one rank's tensors in memory and writes them on `close` (TTrace keeps traces in
    host memory and persists them when the iteration ends)."""

    def __init__(self, out: str, rank: int, coords: Coords, run_dtype: str):
        self.out = out
        self.rank = rank
        self.coords = coords
        self.dtype = storage_dtype(run_dtype)
        self.entries: List[dict] = []
        self.tensors: List[tuple] = []

    def add(self, cid: CanonicalId, tensor: torch.Tensor, smap: ShardMap, module_class: Optional[str],
            exact_replicas: bool = False) -> None:
        """Records one tensor (a copy in the storage dtype) with its id and shard map;
        `exact_replicas` declares its copies on other ranks bit-identical in a correct run."""
        seq = len(self.entries)
        key = f"t{seq:06d}"
        stored = tensor.detach().to(device="cpu", dtype=self.dtype, copy=True).contiguous()
        if tuple(stored.shape) != smap.local_shape:
            raise ValueError(f"{cid}: tensor shape {tuple(stored.shape)} differs from its shard map's {smap.local_shape}")
        entry = {"key": key, "seq": seq, "id": cid.as_json(), "module_class": module_class,
                 "full_shape": list(smap.full_shape), "pieces": [p.as_json() for p in smap.pieces]}
        if exact_replicas:
            entry["exact_replicas"] = True
        self.entries.append(entry)
        self.tensors.append((key, stored))

    def close(self) -> str:
        """Writes index.json and tensors.safetensors; returns the rank directory."""
        directory = rank_dir(self.out, self.rank)
        os.makedirs(directory, exist_ok=True)
        write_safetensors(os.path.join(directory, "tensors.safetensors"), self.tensors)
        # One tensor entry per line: readable, diffable, and a tenth of an indented file's size.
        entries = ",\n  ".join(json.dumps(e, separators=(", ", ": ")) for e in self.entries)
        head = json.dumps({"rank": self.rank, "coords": self.coords.as_json()})[:-1]
        with open(os.path.join(directory, "index.json"), "w", encoding="utf-8") as handle:
            handle.write(f'{head}, "tensors": [\n  {entries}\n]}}\n' if self.entries else f'{head}, "tensors": []}}\n')
        return directory


def write_trace_json(out: str, role: str, world_size: int, run_dtype: str, config: ParallelConfig,
                     perturbation: Optional[dict]) -> None:
    """Writes the run-level trace.json (done by rank 0)."""
    if role not in ROLES:
        raise ValueError(f"unknown role `{role}`; expected one of {', '.join(ROLES)}")
    if (role == "perturbed") != (perturbation is not None):
        raise ValueError("a perturbed run, and only a perturbed run, carries a perturbation")
    storage_dtype(run_dtype)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "trace.json"),
               {"format": FORMAT, "version": VERSION, "role": role, "world_size": world_size, "dtype": run_dtype,
                "parallel": config.as_json(), "perturbation": perturbation, "producer": PRODUCER})
