"""A program parallelized with PyTorch's own `parallelize_module` plans (DTensor parameters and
gradients, plain local activations) traced at tp=2 with gloo against its single-device run."""

import json

import pytest

from shardproof.trace import LayoutError
from shardproof.trace.examples.tp_plan import PlanRun, launch
from shardproof.trace.layout import mesh_shard_map
from tracereader import read_trace, rel_error

LOOSE = {"float32": 1e-5, "bfloat16": 3e-2}


def test_mesh_shard_map_follows_torch_chunk_and_nests_mesh_dimensions():
    # Shard(0) on a 2-D mesh's both dimensions: the second splits the first's local range.
    smap = mesh_shard_map((8, 6), (2, 2), (1, 0), (0, 0))
    assert smap.local_shape == (2, 6) and smap.pieces[0].full == ((4, 6), (0, 6))
    # Uneven: 5 rows over 3 ranks are chunks of 2, 2, 1 (torch.chunk); rank 2 starts at row 4.
    assert mesh_shard_map((5,), (3,), (2,), (0,)).pieces[0].full == ((4, 5),)
    # Replicate holds everything; Shard(-1) is the last dimension.
    assert mesh_shard_map((4, 6), (2, 3), (1, 2), (None, -1)).pieces[0].full == ((0, 4), (4, 6))
    with pytest.raises(LayoutError):
        mesh_shard_map((4,), (2,), (0,), (1,))


def traces(tmp_path, plan, dtype, bug=None, rewrite=False):
    ref, cand = str(tmp_path / "ref"), str(tmp_path / "cand")
    launch(PlanRun(ref, "reference", dtype, rewrite=rewrite))
    launch(PlanRun(cand, "candidate", dtype, plan, bug, rewrite=rewrite))
    return read_trace(ref), read_trace(cand)


def divergent(ref, cand, dtype):
    out = []
    for key in sorted(ref, key=lambda k: ref[k].first_seq):
        merged = cand[key]
        scale = max(float(ref[key].value.abs().max()), 1e-30)
        if rel_error(merged.value, ref[key].value) > LOOSE[dtype] or merged.replica_diff / scale > 1e-6:
            out.append(key)
    return out


@pytest.mark.parametrize("dtype, rewrite", [("float32", True), ("bfloat16", False)])
def test_sequence_parallel_plan_holds_against_the_reference(tmp_path, dtype, rewrite):
    # With rewrites, fc1's input (the norm's DTensor output, Shard(0)) is replaced by a DTensor
    # of the same placements.
    ref, cand = traces(tmp_path, "tp-sp", dtype, rewrite=rewrite)
    assert set(cand) == set(ref) and all(m.covered for m in cand.values())
    assert divergent(ref, cand, dtype) == []
    # DTensor parameters are recorded as their local shards with the placements' boxes:
    # fc1's weight is Shard(0) (rows), fc2's Shard(1) (columns), the norm's Replicate.
    index = json.load(open(tmp_path / "cand" / "rank-00001" / "index.json"))
    boxes = {e["id"]["module"]: e["pieces"][0]["full"] for e in index["tensors"]
             if e["id"]["kind"] == "param_before_step"}
    assert boxes["blocks.0.fc1.weight"] == [[16, 32], [0, 16]]
    assert boxes["blocks.0.fc2.weight"] == [[0, 16], [16, 32]]
    assert boxes["blocks.0.norm.weight"] == [[0, 16]]
    kinds = {key.split("/")[2] for key in cand}
    assert {"forward_input", "forward_output", "grad_input", "param_grad", "main_grad", "param_after_step"} <= kinds


def test_a_plan_that_drops_a_reduction_is_caught_at_its_layer(tmp_path):
    # Module-wise rewrites: every traced module consumes the generated inputs, so the partial sum
    # that fc2 hands on shows at fc2 (and its block), not at the modules after it.
    ref, cand = traces(tmp_path, "tp", "float32", "dropped_reduction", rewrite=True)
    bad = divergent(ref, cand, "float32")
    forward = [k for k in bad if k.split("/")[2].startswith("forward")]
    assert forward[0] == "it0/mb0/forward_output/blocks.1.fc2/0"
    assert {k.split("/")[3] for k in forward} == {"blocks.1.fc2", "blocks.1"}
    assert cand[forward[0]].replica_diff > 0  # the TP ranks hand on different partial sums
