"""A small residual MLP model parallelized with PyTorch's own `parallelize_module` plans
(ColwiseParallel, RowwiseParallel, SequenceParallel on a 1-D device mesh), traced with the
collector: parameters and gradients are DTensors, which the collector unwraps by their
placements; activations handed between modules are plain local tensors, split as
`tp_plan.yaml` says.

Plans (`PLANS`):

* `tp`: each block's fc1 column-parallel, fc2 row-parallel (all-reduced output), the norm
  replicated; activations [sequence, batch, hidden] replicated between blocks.
* `tp-sp`: sequence parallelism as well: the norms are `SequenceParallel` over dim 0, fc1
  all-gathers its sequence-sharded input, fc2 reduce-scatters its output along the sequence.

Bug (`BUGS`): `dropped_reduction` gives block 1's fc2 `RowwiseParallel(output_layouts=Partial())`,
so its output stays an unreduced partial sum and the local term is handed on as if it were the
layer's output (the all-reduce of a row-parallel layer dropped by a wrong plan).
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..collector import Tracer
from ..generator import ConsistentGenerator
from ..layout import ParallelConfig, extract_local, shard_map
from ..annotations import TensorSplit

#: The annotation file of this model.
ANNOTATIONS = os.path.join(os.path.dirname(__file__), "tp_plan.yaml")
PLANS = ("tp", "tp-sp")
BUGS = ("dropped_reduction",)
HIDDEN, FFN, BLOCKS, SEQ, BATCH = 16, 32, 2, 8, 2


class Block(torch.nn.Module):
    """x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN, dtype=dtype)
        self.fc1 = torch.nn.Linear(HIDDEN, FFN, dtype=dtype)
        self.fc2 = torch.nn.Linear(FFN, HIDDEN, dtype=dtype)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(torch.nn.Module):
    """`BLOCKS` blocks in sequence."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dtype) for _ in range(BLOCKS))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build_plan(plan: str, bug: Optional[str]) -> dict:
    """The `parallelize_module` plan of `plan` (with the planted bug, if any)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    from torch.distributed.tensor.placement_types import Partial

    sp = plan == "tp-sp"
    out = {}
    for index in range(BLOCKS):
        prefix = f"blocks.{index}"
        fc2_output = Shard(0) if sp else None
        if bug == "dropped_reduction" and index == 1:
            fc2_output = Partial()
        if sp:
            out[f"{prefix}.norm"] = SequenceParallel(sequence_dim=0)
            out[f"{prefix}.fc1"] = ColwiseParallel(input_layouts=Shard(0))
        else:
            out[f"{prefix}.fc1"] = ColwiseParallel()
        out[f"{prefix}.fc2"] = RowwiseParallel(output_layouts=fc2_output)
    return out


@dataclass(frozen=True)
class PlanRun:
    """One traced iteration: `plan` None is the single-device reference; `rewrite` turns on
    module-wise rewrites."""

    out: str
    role: str
    dtype: str = "float32"
    plan: Optional[str] = None
    bug: Optional[str] = None
    seed: int = 0
    tp: int = 2
    rewrite: bool = False

    @property
    def config(self) -> ParallelConfig:
        """The layout the tracer names ranks and annotated splits by."""
        if self.plan is None:
            return ParallelConfig()
        return ParallelConfig(tp=self.tp, sp=self.plan == "tp-sp")


def run_rank(run: PlanRun, rank: int) -> None:
    """One rank's traced iteration: forward, backward, SGD step (process group initialized
    when `run.plan` is set)."""
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[run.dtype]
    torch.manual_seed(run.seed)  # every rank builds the same full model; the plan slices it
    model = Model(dtype)
    config = run.config
    if run.plan is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (run.tp,))
        parallelize_module(model, mesh, build_plan(run.plan, run.bug))
    gen = ConsistentGenerator(run.seed)
    x = gen.shard("input", shard_map(None, ParallelConfig(), ParallelConfig().coords(0), full_shape=(SEQ, BATCH, HIDDEN)),
                  dtype=dtype)
    split = TensorSplit(sp_dim=0)
    x = extract_local(x, shard_map(split, config, config.coords(rank), full_shape=tuple(x.shape)))
    tracer = Tracer(model, ANNOTATIONS, config, rank, run.out, role=run.role, dtype=run.dtype,
                    rewrite=run.rewrite)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with tracer.iteration():
        with tracer.microbatch(0):
            y = model(tracer.data_input(x.requires_grad_(True), "x", split))
            # Under SP each rank holds a slice of the sequence: the loss is the sum of the ranks'
            # terms. Without SP every rank holds the whole output and computes the whole loss.
            (y.float() ** 2).sum().backward()
        tracer.before_step()
        optimizer.step()
        tracer.after_step()
    tracer.save()


def launch(run: PlanRun, timeout: float = 300.0) -> None:
    """Runs `run`: in this process for the reference, else `run.tp` processes with gloo."""
    if run.plan is None:
        run_rank(run, 0)
        return
    from .runner import launch_processes

    launch_processes("shardproof.trace.examples.tp_plan", run, run.tp, timeout)


def _worker(run: PlanRun, rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=run.tp)
    try:
        run_rank(run, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()


__all__ = ["ANNOTATIONS", "BUGS", "PLANS", "PlanRun", "build_plan", "launch", "run_rank"]


if __name__ == "__main__":
    # One rank of a run started by `launch`: PAYLOAD_PICKLE RANK PORT.
    with open(sys.argv[1], "rb") as payload:
        plan_run = pickle.load(payload)
    _worker(plan_run, int(sys.argv[2]), int(sys.argv[3]))
