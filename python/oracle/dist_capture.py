"""Distributed oracle programs: a 2-layer MLP with an MSE loss, single-device and distributed
(Megatron tensor parallelism, and data x tensor parallelism), correct and with planted bugs.

Every rank's graph is captured with torch.export on the fake process-group backend (one process,
the process group re-initialized per rank), so collectives appear as
`torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'GROUP')` + `wait_tensor`. The printed
group names are mapped to mesh dims in each case file.

The expected verdict of every variant is also checked numerically here: the same Python code runs
on every rank in threads, with an all-reduce simulated by hand, in float64, and its losses are
compared with the single-device loss.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass

import torch

from .common import F32, F64, Gen, graph_text, save_tensors, write_json, write_text

# Batch, input features, hidden features, output features.
B, D, H, O = 8, 16, 32, 8
SPEC_INPUTS = ["x", "target", "w1", "b1", "w2", "b2"]


@dataclass(frozen=True)
class Variant:
    """One distributed program."""

    name: str
    dp: int
    tp: int
    # "ok", "missing_allreduce", "bias_before_allreduce", "bias_rank0" (correct: the bias is
    # added before the all-reduce on tp rank 0 only), "wrong_scale" (dp loss divided by the world
    # size instead of dp), "wrong_group" (dp loss all-reduced over the world group).
    bug: str
    description: str

    @property
    def world(self) -> int:
        return self.dp * self.tp

    @property
    def holds(self) -> bool:
        return self.bug in ("ok", "bias_rank0")


VARIANTS = [
    Variant("mlp_tp2", 1, 2, "ok",
            "Megatron TP=2: W1/b1 column-parallel (Shard(0)), W2 row-parallel (Shard(1)), "
            "all-reduce after the second matmul, then + b2"),
    Variant("mlp_tp2_bias_rank0", 1, 2, "bias_rank0",
            "TP=2, b2 added before the all-reduce on tp rank 0 only (correct, rank graphs differ)"),
    Variant("mlp_tp2_missing_allreduce", 1, 2, "missing_allreduce",
            "BUG: TP=2 with the row-parallel all-reduce removed"),
    Variant("mlp_tp2_bias_before_allreduce", 1, 2, "bias_before_allreduce",
            "BUG: TP=2 with b2 added on every rank before the all-reduce (b2 counted twice)"),
    Variant("mlp_dp2_tp2", 2, 2, "ok",
            "DP=2 x TP=2: x/target sharded on the batch over dp, TP as in mlp_tp2 inside each dp "
            "group; the loss all-reduced over dp and divided by dp"),
    Variant("mlp_dp2_tp2_missing_allreduce", 2, 2, "missing_allreduce",
            "BUG: DP=2 x TP=2 with the row-parallel (tp) all-reduce removed"),
    Variant("mlp_dp2_tp2_wrong_scale", 2, 2, "wrong_scale",
            "BUG: DP=2 x TP=2 with the dp-summed loss divided by the world size (4) instead of dp (2)"),
    Variant("mlp_dp2_tp2_wrong_group", 2, 2, "wrong_group",
            "BUG: DP=2 x TP=2 with the loss all-reduced over the world group instead of the dp group"),
    Variant("mlp_dp2_tp2_bias_before_allreduce", 2, 2, "bias_before_allreduce",
            "BUG: DP=2 x TP=2 with b2 added on every tp rank before the all-reduce"),
]


class MLP(torch.nn.Module):
    """The program of every variant: the spec when `v` is None, else tp rank `tp_rank` of `v`.

    The body is written inline in `forward` so that the captured graphs point at these lines.
    """

    def __init__(self, v: Variant | None = None, comm=None, tp_rank: int = 0):
        super().__init__()
        self.v, self.comm, self.tp_rank = v, comm, tp_rank
        bug = v.bug if v is not None else None
        self.early_bias = bug == "bias_before_allreduce" or (bug == "bias_rank0" and tp_rank == 0)
        self.late_bias = bug not in ("bias_before_allreduce", "bias_rank0")
        self.tp_allreduce = v is not None and bug != "missing_allreduce"
        self.dp_group = None if v is None or v.dp == 1 else ("world" if bug == "wrong_group" else "dp")
        self.dp_scale = 1 if v is None else (v.world if bug == "wrong_scale" else v.dp)

    def forward(self, x, target, w1, b1, w2, b2):
        h = torch.relu(torch.matmul(x, w1.t()) + b1)  # fc1, column parallel
        y = torch.matmul(h, w2.t())  # fc2, row parallel: a partial sum on every tp rank
        if self.early_bias:
            y = y + b2
        if self.tp_allreduce:
            y = self.comm.all_reduce(y, "tp")
        if self.late_bias:
            y = y + b2
        loss = torch.mean((y - target) ** 2)
        if self.dp_group is not None:
            loss = self.comm.all_reduce(loss, self.dp_group)  # sum of the dp ranks' losses
            loss = loss / self.dp_scale
        return loss


def spec_tensors(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = Gen("dist-mlp")
    return {
        "x": g.randn(B, D, dtype=dtype),
        "target": g.randn(B, O, dtype=dtype),
        "w1": g.randn(H, D, dtype=dtype) * 0.3,
        "b1": g.randn(H, dtype=dtype) * 0.1,
        "w2": g.randn(O, H, dtype=dtype) * 0.3,
        "b2": g.randn(O, dtype=dtype) * 0.1,
    }


def coords(v: Variant, rank: int) -> tuple[int, int]:
    """(dp index, tp index) of a rank: row-major over the mesh (dp, tp), as DeviceMesh."""
    return rank // v.tp, rank % v.tp


def local_tensors(v: Variant, rank: int, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    dp_i, tp_i = coords(v, rank)
    return {
        "x": full["x"].chunk(v.dp, 0)[dp_i].contiguous(),
        "target": full["target"].chunk(v.dp, 0)[dp_i].contiguous(),
        "w1": full["w1"].chunk(v.tp, 0)[tp_i].contiguous(),
        "b1": full["b1"].chunk(v.tp, 0)[tp_i].contiguous(),
        "w2": full["w2"].chunk(v.tp, 1)[tp_i].contiguous(),
        "b2": full["b2"].clone(),
    }


def group_ranks(v: Variant, rank: int) -> dict[str, tuple[int, ...]]:
    dp_i, tp_i = coords(v, rank)
    return {
        "tp": tuple(dp_i * v.tp + t for t in range(v.tp)),
        "dp": tuple(d * v.tp + tp_i for d in range(v.dp)),
        "world": tuple(range(v.world)),
    }


# ---------------------------------------------------------------------------------------------
# Numerical simulation: every rank in a thread, all-reduce by hand.
class _SimWorld:
    def __init__(self):
        self.lock = threading.Lock()
        self.slots: dict = {}
        self.barriers: dict = {}

    def barrier(self, ranks: tuple[int, ...]) -> threading.Barrier:
        with self.lock:
            return self.barriers.setdefault(ranks, threading.Barrier(len(ranks), timeout=30))


class _SimComm:
    def __init__(self, world: _SimWorld, rank: int, groups: dict[str, tuple[int, ...]]):
        self.world, self.rank, self.groups = world, rank, groups
        self.seq: dict = defaultdict(int)

    def all_reduce(self, t: torch.Tensor, key: str) -> torch.Tensor:
        ranks = self.groups[key]
        slot = (ranks, self.seq[ranks])
        self.seq[ranks] += 1
        with self.world.lock:
            self.world.slots.setdefault(slot, {})[self.rank] = t
        self.world.barrier(ranks).wait()
        out = sum(self.world.slots[slot][r] for r in ranks)  # group order, like NCCL's ring
        self.world.barrier(ranks).wait()
        return out


def simulate(v: Variant) -> dict:
    # The f32 inputs of the captured graphs, computed with in f64: the interpreter's reference.
    full = {k: t.to(F64) for k, t in spec_tensors(F32).items()}
    spec = MLP()(**full).item()
    world = _SimWorld()
    losses: list = [None] * v.world
    errors: list = []

    def run(rank: int) -> None:
        try:
            comm = _SimComm(world, rank, group_ranks(v, rank))
            losses[rank] = MLP(v, comm, coords(v, rank)[1])(**local_tensors(v, rank, full)).item()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=run, args=(r,)) for r in range(v.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"simulation of {v.name} failed: {errors}")
    rel = max(abs(l - spec) / abs(spec) for l in losses)
    return {"spec_loss": spec, "rank_losses": losses, "max_rel_error": rel}


# ---------------------------------------------------------------------------------------------
# Capture on the fake process-group backend.
class _FunComm:
    def __init__(self, groups: dict):
        self.groups = groups

    def all_reduce(self, t: torch.Tensor, key: str) -> torch.Tensor:
        import torch.distributed._functional_collectives as funcol

        return funcol.all_reduce(t, "sum", self.groups[key])


def _rename_output(gm: torch.fx.GraphModule, name: str) -> None:
    """Names the graph's (single) output value `name`, so spec and ranks agree on it."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    (val,) = out.args[0]
    val._rename(name)
    if val.name != name:
        raise RuntimeError(f"could not rename {val.name} to {name}")
    gm.recompile()


def _export(mod: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> torch.fx.GraphModule:
    ep = torch.export.export(mod, tuple(tensors[n] for n in SPEC_INPUTS), strict=False)
    gm = ep.graph_module
    _rename_output(gm, "loss")
    return gm


def capture_spec(dtype: torch.dtype) -> torch.fx.GraphModule:
    return _export(MLP(), spec_tensors(dtype))


def capture_ranks(v: Variant, dtype: torch.dtype) -> tuple[list[torch.fx.GraphModule], dict[str, dict]]:
    """Every rank's graph, and the process groups the graphs name: name -> {dim, ranks}."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    full = spec_tensors(dtype)
    graphs, groups = [], {}
    for rank in range(v.world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=v.world)
        try:
            if v.dp > 1:
                mesh = init_device_mesh("cpu", (v.dp, v.tp), mesh_dim_names=("dp", "tp"))
                pgs = {"dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}
            else:
                mesh = init_device_mesh("cpu", (v.tp,), mesh_dim_names=("tp",))
                pgs = {"tp": mesh.get_group("tp")}
            pgs["world"] = dist.group.WORLD
            for dim, pg in pgs.items():
                ranks = dist.get_process_group_ranks(pg)
                assert tuple(ranks) == group_ranks(v, rank)[dim], (v.name, rank, dim, ranks)
                info = groups.setdefault(pg.group_name, {"dims": set(), "ranks": []})
                info["dims"].add(dim)
                if ranks not in info["ranks"]:
                    info["ranks"].append(ranks)
            comm = _FunComm(pgs)
            tp_rank = coords(v, rank)[1]
            gm = _export(MLP(v, comm, tp_rank), local_tensors(v, rank, full))
            graphs.append(gm)
        finally:
            dist.destroy_process_group()
    resolved = {}
    for name, info in groups.items():
        dims = sorted(info["dims"] - {"world"})
        if len(dims) > 1:
            raise RuntimeError(f"process group {name} stands for several mesh dims: {dims}")
        resolved[name] = {"dim": dims[0] if dims else "world", "ranks": sorted(info["ranks"])}
    return graphs, resolved


def _collectives(gm: torch.fx.GraphModule) -> list[str]:
    """The collectives of a rank graph, in order: `node = op(group)`."""
    out = []
    for n in gm.graph.nodes:
        t = str(n.target)
        if n.op == "call_function" and t.startswith("_c10d_functional.") and "wait" not in t:
            out.append(f"{n.name} = {t}({n.args[-1]!r})")
    return out


def _used_groups(graphs: list[torch.fx.GraphModule]) -> set[str]:
    used = set()
    for gm in graphs:
        for n in gm.graph.nodes:
            if n.op == "call_function" and str(n.target).startswith("_c10d_functional.") and "wait" not in str(n.target):
                used.add(n.args[-1])
    return used


def _placements(v: Variant) -> list[tuple[str, str, str]]:
    if v.dp > 1:
        return [
            ("x", "{ dp: Shard(0) }", "batch-sharded over dp, replicated over tp"),
            ("target", "{ dp: Shard(0) }", "batch-sharded over dp, replicated over tp"),
            ("w1", "{ tp: Shard(0) }", "fc1 weight, column parallel"),
            ("b1", "{ tp: Shard(0) }", "fc1 bias, column parallel"),
            ("w2", "{ tp: Shard(1) }", "fc2 weight, row parallel"),
            ("b2", "Replicate()", "fc2 bias"),
        ]
    return [
        ("x", "Replicate()", "activations"),
        ("target", "Replicate()", "regression target"),
        ("w1", "Shard(0)", "fc1 weight, column parallel"),
        ("b1", "Shard(0)", "fc1 bias, column parallel"),
        ("w2", "Shard(1)", "fc2 weight, row parallel"),
        ("b2", "Replicate()", "fc2 bias"),
    ]


def _case_yaml(v: Variant, groups: dict[str, dict], used: set[str]) -> str:
    def q(s: str) -> str:
        return '"' + s + '"'

    mesh = "{ dp: %d, tp: %d }" % (v.dp, v.tp) if v.dp > 1 else "{ tp: %d }" % v.tp
    lines = [
        f"# {v.description}",
        f"# Expected: {'the property holds' if v.holds else 'violated at output loss'}.",
        "# Generated by python/capture.py (PyTorch-oracle suite); do not edit.",
        "version: 1",
        f"name: {v.name}",
        "spec:",
        "  graph: spec.py",
        "impl:",
        f"  mesh: {mesh}",
        "  graphs: [" + ", ".join(f"r{r}.py" for r in range(v.world)) + "]",
        "  groups:",
    ]
    for name in sorted(groups, key=lambda s: (len(s), s)):
        info = groups[name]
        if name not in used and info["dim"] == "world":
            continue
        dim = "all" if info["dim"] == "world" else info["dim"]
        ranks = " ".join(str(list(r)) for r in info["ranks"])
        note = "" if name in used else ", not used by any collective"
        lines.append(f"    {q(name) + ':':6} {dim:4}  # ranks {ranks}{note}")
    lines.append("inputs:")
    for name, placement, note in _placements(v):
        lines.append(f"  {name + ':':8}{placement:18}  # {note}")
    lines += [
        "outputs:",
        "  loss: Replicate()       # every rank must hold exactly the spec loss",
        "",
    ]
    return "\n".join(lines)


def capture_variant(v: Variant, out_root: str, spec_text: str) -> dict:
    d = os.path.join(out_root, "dist", v.name)
    os.makedirs(d, exist_ok=True)
    sim = simulate(v)
    if v.holds and sim["max_rel_error"] > 1e-12:
        raise RuntimeError(f"{v.name} should hold but the simulation differs: {sim}")
    if not v.holds and sim["max_rel_error"] < 1e-6:
        raise RuntimeError(f"{v.name} should be violated but the simulation agrees: {sim}")
    graphs, groups = capture_ranks(v, F32)
    used = _used_groups(graphs)
    write_text(os.path.join(d, "spec.py"), spec_text)
    for r, gm in enumerate(graphs):
        write_text(os.path.join(d, f"r{r}.py"), graph_text(gm))
    write_text(os.path.join(d, "case.yaml"), _case_yaml(v, groups, used))
    expected = {
        "verdict": "holds" if v.holds else "violated",
        "bad_output": None if v.holds else "loss",
        "description": v.description,
        "mesh": {"dp": v.dp, "tp": v.tp} if v.dp > 1 else {"tp": v.tp},
        "groups": {k: {"dim": groups[k]["dim"], "ranks": [list(r) for r in groups[k]["ranks"]]}
                   for k in sorted(used, key=lambda s: (len(s), s))},
        "collectives": [_collectives(gm) for gm in graphs],
        "simulated_f64": sim,
    }
    write_json(os.path.join(d, "expected.json"), expected)
    full = spec_tensors(F32)
    tensors = {f"spec.{k}": t for k, t in full.items()}
    for r in range(v.world):
        tensors.update({f"r{r}.{k}": t for k, t in local_tensors(v, r, full).items()})
    save_tensors(os.path.join(d, "inputs.safetensors"), tensors)
    return {"name": v.name, "verdict": expected["verdict"], "groups": expected["groups"],
            "max_rel_error_simulated": sim["max_rel_error"]}


def capture_dist(out_root: str, only: str | None = None) -> dict:
    t0 = time.time()
    spec_text = graph_text(capture_spec(F32))
    done, failures = [], []
    for v in VARIANTS:
        if only and only not in v.name:
            continue
        try:
            done.append(capture_variant(v, out_root, spec_text))
        except Exception as e:
            failures.append({"name": v.name, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"capture: dist program {v.name} FAILED: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
            if os.environ.get("SHARDPROOF_ORACLE_DEBUG"):
                traceback.print_exc()
    index = {"version": 1, "torch": torch.__version__, "programs": done, "not_captured": failures}
    os.makedirs(os.path.join(out_root, "dist"), exist_ok=True)
    write_json(os.path.join(out_root, "dist", "index.json"), index)
    print(f"capture: {len(done)} distributed programs ({len(failures)} failed), {time.time() - t0:.1f}s", file=sys.stderr)
    return index
