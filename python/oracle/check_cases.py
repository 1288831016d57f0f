"""Captured programs for `shardproof check`: the seed's four bug types of its first table, each
with its correct version, captured from PyTorch with torch.export on the fake process-group
backend (one rank at a time, the process group re-initialized per rank).

- `row_parallel`: a row-parallel matmul's partial sum, all-reduced (ok) or not (bug: the
  bias is added to a partial sum).
- `layernorm`: a column-parallel matmul whose output is sharded on the hidden dim, normalized
  after an all-gather of the hidden dim (ok) or directly (bug: the norm's statistics are over
  the rank's slice only).
- `async_wait`: an asynchronous all-reduce (`_c10d_functional.all_reduce` called directly)
  whose result is read after its `wait_tensor` (ok) or without one (bug).
- `send_recv`: a two-stage pipeline (pp=2) whose recv matches the send's tag (ok) or not
  (bug: the recv waits for a message no rank sends). `torch.distributed.isend`/`irecv` leave no trace in an exported graph,
  so the stages call `shardproof_p2p.send`/`recv`, declared here with torch.library, as
  shardproof's capture of `isend`/`irecv` records them.

Writes OUT/check/NAME/{spec.py, r0.py, r1.py, case.yaml, expected.json} and
OUT/check/index.json. `expected.json` says the verdict and, for a bug, the check that must
report it and the operator it must name.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from .common import F32, graph_text, write_json, write_text

T, H = 4, 8  # tokens, hidden features (sharded over tp=2: 4 per rank)


def _declare_p2p() -> None:
    """Declares `shardproof_p2p.send(Tensor input, int dst, int tag=0) -> Tensor` and
    `recv(SymInt[] size, ScalarType dtype, int src, int tag=0) -> Tensor` (see
    crates/ops/src/p2p.rs), once."""
    if hasattr(torch.ops, "shardproof_p2p") and hasattr(torch.ops.shardproof_p2p, "send"):
        return
    lib = torch.library.Library("shardproof_p2p", "DEF")
    lib.define("send(Tensor input, int dst, int tag=0) -> Tensor")
    lib.define("recv(SymInt[] size, ScalarType dtype, int src, int tag=0) -> Tensor")

    def send(input, dst, tag=0):
        return input.clone()

    def recv(size, dtype, src, tag=0):
        return torch.zeros(size, dtype=dtype)

    for key in ("CompositeExplicitAutograd",):
        lib.impl("send", send, key)
        lib.impl("recv", recv, key)
    for key in ("Meta",):
        lib.impl("send", lambda input, dst, tag=0: torch.empty_like(input), key)
        lib.impl("recv", lambda size, dtype, src, tag=0: torch.empty(size, dtype=dtype, device="meta"), key)
    # Keep the library alive for the process.
    _declare_p2p.lib = lib  # type: ignore[attr-defined]


def _group_name(pg) -> str:
    return pg.group_name


class RowParallel(torch.nn.Module):
    """y = x @ w.T (w row-parallel: Shard(1)), all-reduced over tp, plus a replicated bias."""

    def __init__(self, group: str | None, bug: bool):
        super().__init__()
        self.group, self.bug = group, bug

    def forward(self, x, w, b):
        y = torch.matmul(x, w.t())  # row parallel: a partial sum on every tp rank
        if self.group is not None and not self.bug:
            y = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(y, "sum", self.group))
        return y + b


class LayerNorm(torch.nn.Module):
    """h = x @ w.T (w column-parallel: Shard(0), h sharded on the hidden dim), then a layer
    norm over the hidden dim: after an all-gather of it (ok) or on the slice (bug)."""

    def __init__(self, group: str | None, bug: bool, tp: int):
        super().__init__()
        self.group, self.bug, self.tp = group, bug, tp

    def forward(self, x, w):
        h = torch.matmul(x, w.t())  # column parallel: [T, H/tp] on every tp rank
        if self.group is not None and not self.bug:
            # Gather the hidden dim: gather along dim 0 of the transpose, then transpose back.
            g = torch.ops._c10d_functional.all_gather_into_tensor(h.t().contiguous(), self.tp, self.group)
            h = torch.ops._c10d_functional.wait_tensor(g).t()
        return torch.nn.functional.layer_norm(h, (h.shape[-1],))


class AsyncWait(torch.nn.Module):
    """An asynchronous all-reduce of a partial sum, read after (ok) or without (bug) its wait."""

    def __init__(self, group: str | None, bug: bool):
        super().__init__()
        self.group, self.bug = group, bug

    def forward(self, x, w):
        y = torch.matmul(x, w.t())  # row parallel: a partial sum
        if self.group is None:
            return torch.relu(y)
        handle = torch.ops._c10d_functional.all_reduce(y, "sum", self.group)
        if not self.bug:
            handle = torch.ops._c10d_functional.wait_tensor(handle)
        return torch.relu(handle)


class Stage(torch.nn.Module):
    """Stage `stage` of a two-stage pipeline of two linear layers; the recv of stage 1 takes
    the tag stage 0 sends with (ok) or another one (bug: it waits for a message never sent).
    The spec (stage None) runs both."""

    def __init__(self, stage: int | None, bug: bool):
        super().__init__()
        self.stage, self.bug = stage, bug

    def forward(self, x, w):
        if self.stage is None:
            return torch.relu(torch.matmul(torch.relu(torch.matmul(x, w.t())), w.t()))
        if self.stage == 0:
            a = torch.relu(torch.matmul(x, w.t()))
            return torch.ops.shardproof_p2p.send(a, 1, 0)
        a = torch.ops.shardproof_p2p.recv([T, H], torch.float32, 0, 1 if self.bug else 0)
        return torch.relu(torch.matmul(a, w.t()))


@dataclass(frozen=True)
class Case:
    """One captured program."""

    name: str
    kind: str
    bug: bool
    description: str
    # Expected, for a bug: the check that finds it and the operator it names.
    check: str | None = None
    op: str | None = None


CASES = [
    Case("row_parallel_ok", "row_parallel", False,
         "tp=2: a row-parallel matmul's partial sum all-reduced, then the bias added"),
    Case("row_parallel_missing_allreduce", "row_parallel", True,
         "BUG tp=2: the row-parallel matmul's all-reduce is missing; the bias is added to the partial sum",
         "spmd-type", "aten.add.Tensor"),
    Case("layernorm_gathered", "layernorm", False,
         "tp=2: a column-parallel matmul's output gathered over the hidden dim, then normalized"),
    Case("layernorm_sharded_hidden", "layernorm", True,
         "BUG tp=2: layer norm over a hidden dim each rank holds a slice of (the output declared "
         "sharded on it: the ranks' slices are no slices of the spec's normalized tensor)",
         "placement-consistency", "aten.layer_norm.default"),
    Case("async_allreduce_waited", "async_wait", False,
         "tp=2: an asynchronous all-reduce, waited before its result is read"),
    Case("async_allreduce_no_wait", "async_wait", True,
         "BUG tp=2: an asynchronous all-reduce's result read without its wait_tensor",
         "missing-wait", "aten.relu.default"),
    Case("send_recv_matched", "send_recv", False,
         "pp=2: stage 0 sends its activation, stage 1 receives it with the same shape"),
    Case("send_recv_mismatched", "send_recv", True,
         "BUG pp=2: stage 1's recv takes tag 1, stage 0 sends with tag 0: it waits forever",
         "dependency-violation", "shardproof_p2p.recv.default"),
]


def _tensors(kind: str, tp_rank: int | None) -> tuple[list[str], dict[str, torch.Tensor], dict[str, str]]:
    """Input names, (local) tensors and case placements of a program kind."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, H, generator=g)
    w = torch.randn(H, H, generator=g) * 0.3
    b = torch.randn(H, generator=g) * 0.1
    n = 2

    def part(t, dim):
        return t if tp_rank is None else t.chunk(n, dim)[tp_rank].contiguous()

    if kind == "row_parallel":
        return ["x", "w", "b"], {"x": part(x, 1), "w": part(w, 1), "b": b}, \
            {"x": "Shard(1)", "w": "Shard(1)", "b": "Replicate()"}
    if kind == "layernorm":
        return ["x", "w"], {"x": x, "w": part(w, 0)}, {"x": "Replicate()", "w": "Shard(0)"}
    if kind == "async_wait":
        return ["x", "w"], {"x": part(x, 1), "w": part(w, 1)}, {"x": "Shard(1)", "w": "Shard(1)"}
    # send_recv: both stages hold the whole (replicated) weight, x on stage 0.
    return ["x", "w"], {"x": x, "w": w}, {"x": "Replicate()", "w": "Replicate()"}


def _module(c: Case, group: str | None, rank: int | None) -> torch.nn.Module:
    if c.kind == "row_parallel":
        return RowParallel(group, c.bug)
    if c.kind == "layernorm":
        return LayerNorm(group, c.bug, 2)
    if c.kind == "async_wait":
        return AsyncWait(group, c.bug)
    return Stage(rank, c.bug)


def _export(mod: torch.nn.Module, names: list[str], tensors: dict[str, torch.Tensor], out: str) -> str:
    ep = torch.export.export(mod, tuple(tensors[n] for n in names), strict=False)
    gm = ep.graph_module
    node = next(n for n in gm.graph.nodes if n.op == "output")
    (val,) = node.args[0]
    val._rename(out)
    gm.recompile()
    return graph_text(gm)


def capture_case(c: Case, out_root: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _declare_p2p()
    d = os.path.join(out_root, "check", c.name)
    os.makedirs(d, exist_ok=True)
    names, spec_tensors, placements = _tensors(c.kind, None)
    write_text(os.path.join(d, "spec.py"), _export(_module(c, None, None), names, spec_tensors, "out"))
    dim = "pp" if c.kind == "send_recv" else "tp"
    group_names = set()
    for rank in range(2):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
        try:
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=(dim,))
            group = _group_name(mesh.get_group(dim))
            group_names.add(group)
            _, local, _ = _tensors(c.kind, rank if dim == "tp" else None)
            mod = _module(c, group, rank)
            # A first pipeline stage's output is what it sends, not the program's.
            out = "sent" if c.kind == "send_recv" and rank == 0 else "out"
            write_text(os.path.join(d, f"r{rank}.py"), _export(mod, names, local, out))
        finally:
            dist.destroy_process_group()
    if c.kind == "layernorm" and c.bug:
        outputs = "  out: Shard(1)\n"
    elif c.kind == "send_recv":
        # Both stages take x and w (stage 1 never reads x); the last stage holds the output.
        inputs = {"x": "Replicate()", "w": "Replicate()"}
        outputs = "  out: { placement: Replicate(), at: { pp: 1 } }\n"
    else:
        outputs = "  out: Replicate()\n"
    if c.kind != "send_recv":
        inputs = placements
    lines = [
        f"# {c.description}",
        "# Generated by python/capture.py (oracle/check_cases.py); do not edit.",
        "version: 1",
        f"name: {c.name}",
        "spec:",
        "  graph: spec.py",
        "impl:",
        f"  mesh: {{ {dim}: 2 }}",
        "  graphs: [r0.py, r1.py]",
        "  groups:",
    ]
    for g in sorted(group_names):
        lines.append(f'    "{g}": {dim}')
    lines.append("inputs:")
    for n in names:
        lines.append(f"  {n}: {inputs[n]}")
    text = "\n".join(lines) + "\noutputs:\n" + outputs
    write_text(os.path.join(d, "case.yaml"), text)
    expected = {"verdict": "violated" if c.bug else "holds", "check": c.check, "op": c.op,
                "description": c.description}
    write_json(os.path.join(d, "expected.json"), expected)
    return {"name": c.name, **expected}


def capture_check_cases(out_root: str, only: str | None = None) -> dict:
    t0 = time.time()
    done, failures = [], []
    for c in CASES:
        if only and only not in c.name:
            continue
        try:
            done.append(capture_case(c, out_root))
        except Exception as e:
            failures.append({"name": c.name, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"capture: check case {c.name} FAILED: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
            if os.environ.get("SHARDPROOF_ORACLE_DEBUG"):
                traceback.print_exc()
    index = {"version": 1, "torch": torch.__version__, "cases": done, "not_captured": failures}
    os.makedirs(os.path.join(out_root, "check"), exist_ok=True)
    write_json(os.path.join(out_root, "check", "index.json"), index)
    print(f"capture: {len(done)} check cases ({len(failures)} failed), {time.time() - t0:.1f}s", file=sys.stderr)
    return index
