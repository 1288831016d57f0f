"""The consistent tensor generator: the same full tensor in every process, each rank its shard."""

import subprocess
import sys

import torch

from shardproof.trace import ConsistentGenerator, ParallelConfig, TensorSplit, shard_map, stable_seed

KEY = "it0/mb1/forward_input/layers.3.mlp/0"


def test_stable_seed_is_the_same_in_another_process():
    # Python's hash() is salted per process; the generator's seed must not be.
    code = f"from shardproof.trace import stable_seed; print(stable_seed(0, {KEY!r}))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", **{k: v for k, v in __import__("os").environ.items()
                                                            if k != "PYTHONHASHSEED"}})
    assert int(other.stdout) == stable_seed(0, KEY)
    assert stable_seed(0, KEY) != stable_seed(1, KEY) != stable_seed(0, KEY + "x")


def test_full_tensors_are_deterministic_and_depend_on_the_id():
    gen = ConsistentGenerator(7)
    a = gen.full(KEY, (4, 5))
    assert torch.equal(a, ConsistentGenerator(7).full(KEY, (4, 5)))
    assert not torch.equal(a, gen.full(KEY.replace("mb1", "mb0"), (4, 5)))
    assert not torch.equal(a, ConsistentGenerator(8).full(KEY, (4, 5)))
    # Every dtype sees the same values, rounded.
    assert torch.equal(gen.full(KEY, (4, 5), torch.bfloat16), a.to(torch.bfloat16))
    ints = gen.integers("tokens", (3, 4), 10)
    assert ints.dtype == torch.int64 and int(ints.max()) < 10 and torch.equal(ints, gen.integers("tokens", (3, 4), 10))


def test_ranks_get_consistent_shards_of_one_full_tensor():
    gen = ConsistentGenerator(0)
    cfg = ParallelConfig(tp=2, cp=2, sp=True)
    split = TensorSplit(sp_dim=0, cp_dim=0)
    full = gen.full(KEY, (16, 2, 4))
    rebuilt = torch.full_like(full, float("nan"))
    for rank in range(cfg.world_size):
        smap = shard_map(split, cfg, cfg.coords(rank), full_shape=full.shape)
        local = gen.shard(KEY, smap)
        for piece in smap.pieces:
            rebuilt[tuple(slice(a, b) for a, b in piece.full)] = local[tuple(slice(a, b) for a, b in piece.local)]
    assert torch.equal(rebuilt, full)
