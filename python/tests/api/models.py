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
