"""Test oracle: reads a trace back (with the `safetensors` package, independently of the writer),
checks it against the format contract and merges every logical tensor from its pieces."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict

import torch
from safetensors.torch import load_file

KINDS = ("forward_input", "forward_output", "grad_output", "grad_input", "param_grad", "recompute_input",
         "recompute_output", "main_grad", "param_before_step", "param_after_step")


@dataclass
class Merged:
    """One logical tensor: merged value, the largest disagreement between replicas, coverage."""

    value: torch.Tensor
    replica_diff: float
    covered: bool
    first_seq: int


def id_string(i: dict) -> str:
    return f"it{i['iteration']}/mb{i['microbatch']}/{i['kind']}/{i['module']}/{i['index']}"


def read_trace(path: str) -> Dict[str, Merged]:
    meta = json.load(open(os.path.join(path, "trace.json")))
    assert meta["format"] == "shardproof-trace" and meta["version"] == 1
    assert set(meta) == {"format", "version", "role", "world_size", "dtype", "parallel", "perturbation", "producer"}
    assert meta["role"] in ("reference", "candidate", "perturbed")
    assert (meta["perturbation"] is None) == (meta["role"] != "perturbed")
    assert set(meta["parallel"]) == {"tp", "dp", "pp", "cp", "ep", "vpp", "sp"}
    world = meta["world_size"]
    sums: Dict[str, torch.Tensor] = {}
    counts: Dict[str, torch.Tensor] = {}
    firsts: Dict[str, torch.Tensor] = {}
    diffs: Dict[str, float] = {}
    seqs: Dict[str, int] = {}
    for rank in range(world):
        rdir = os.path.join(path, f"rank-{rank:05d}")
        index = json.load(open(os.path.join(rdir, "index.json")))
        assert index["rank"] == rank and set(index["coords"]) == {"pp", "dp", "cp", "tp", "ep"}
        tensors = load_file(os.path.join(rdir, "tensors.safetensors"))
        assert len(tensors) == len(index["tensors"])
        for seq, entry in enumerate(index["tensors"]):
            assert entry["seq"] == seq and entry["key"] == f"t{seq:06d}"
            assert set(entry) - {"exact_replicas"} == {"key", "seq", "id", "module_class", "full_shape", "pieces"}
            assert entry.get("exact_replicas", True) is True
            assert entry["id"]["kind"] in KINDS
            local = tensors[entry["key"]].double()
            key = id_string(entry["id"])
            full_shape = entry["full_shape"]
            if key not in sums:
                sums[key] = torch.zeros(full_shape, dtype=torch.float64)
                counts[key] = torch.zeros(full_shape, dtype=torch.int64)
                firsts[key] = torch.full(full_shape, float("nan"), dtype=torch.float64)
                diffs[key] = 0.0
                seqs[key] = seq
            assert list(sums[key].shape) == full_shape
            for piece in entry["pieces"]:
                fbox = tuple(slice(a, b) for a, b in piece["full"])
                if "local_flat" in piece:
                    assert set(piece) == {"local_flat", "full"}
                    a, b = piece["local_flat"]
                    part = local.reshape(-1)[a:b].reshape([e - s for s, e in piece["full"]])
                else:
                    assert set(piece) == {"local", "full"}
                    part = local[tuple(slice(a, b) for a, b in piece["local"])]
                assert list(part.shape) == [b - a for a, b in piece["full"]]
                first = firsts[key][fbox]
                seen = ~torch.isnan(first)
                if seen.any():
                    diffs[key] = max(diffs[key], float((part[seen] - first[seen]).abs().max()))
                firsts[key][fbox] = torch.where(seen, first, part)
                counts[key][fbox] += 1
    return {k: Merged(firsts[k], diffs[k], bool((counts[k] > 0).all()), seqs[k]) for k in firsts}


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, tiny)."""
    return float((a - b).norm() / max(float(b.norm()), 1e-30))
