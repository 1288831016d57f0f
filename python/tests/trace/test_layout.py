"""Canonical ids, canonical names (PP/VPP layers, wrappers, experts), microbatch mapping, and
shard maps that reassemble a full tensor exactly."""

import pytest
import torch

from shardproof.trace import (CanonicalId, Coords, LayoutError, ParallelConfig, TensorSplit, canonical_name,
                              extract_local, shard_map)


def test_canonical_id_string_form():
    cid = CanonicalId(0, 1, "forward_output", "layers.3.mlp.fc1", 0)
    assert str(cid) == "it0/mb1/forward_output/layers.3.mlp.fc1/0"
    assert cid.as_json() == {"iteration": 0, "microbatch": 1, "kind": "forward_output",
                             "module": "layers.3.mlp.fc1", "index": 0}
    with pytest.raises(LayoutError):
        CanonicalId(0, 0, "activation", "m", 0)


def test_pp_stage_local_layers_map_to_global_layers():
    cfg = ParallelConfig(pp=2, num_layers=4)
    assert canonical_name("layers.0.mlp.fc1", cfg, Coords(pp=0)) == "layers.0.mlp.fc1"
    assert canonical_name("layers.1.mlp.fc1.weight", cfg, Coords(pp=1)) == "layers.3.mlp.fc1.weight"
    assert canonical_name("module.module.layers.0", cfg, Coords(pp=1)) == "layers.2"
    assert canonical_name("final_layernorm", cfg, Coords(pp=1)) == "final_layernorm"


def test_vpp_chunks_map_as_in_the_seeds_figure_5():
    # 8 layers, 2 stages, 2 virtual chunks: chunk v of stage p starts at (v*2 + p) * 2.
    cfg = ParallelConfig(pp=2, vpp=2, num_layers=8)
    expected = {(0, 0): 0, (1, 0): 2, (0, 1): 4, (1, 1): 6}
    for (stage, chunk), first in expected.items():
        assert canonical_name("layers.0", cfg, Coords(pp=stage), chunk) == f"layers.{first}"
        assert canonical_name("layers.1.attn", cfg, Coords(pp=stage), chunk) == f"layers.{first + 1}.attn"
    # The purple example of Figure 5: layer 0 of the 2nd virtual chunk of the 1st stage is layer 4.
    assert canonical_name("layers.0", cfg, Coords(pp=0), 1) == "layers.4"
    with pytest.raises(LayoutError):
        canonical_name("layers.0", ParallelConfig(pp=3, num_layers=4), Coords(pp=1))


def test_explicit_layer_offsets_and_experts():
    cfg = ParallelConfig(pp=2, num_layers=5, layer_offsets={(0, 0): 0, (1, 0): 3})
    assert canonical_name("layers.1", cfg, Coords(pp=1)) == "layers.4"
    ep = ParallelConfig(dp=4, ep=2, num_experts=8)
    name = "layers.0.mlp.experts.1.fc1.weight"
    assert canonical_name(name, ep, ep.coords(1 * 1), expert=True) == "layers.0.mlp.experts.5.fc1.weight"
    assert canonical_name(name, ep, ep.coords(0), expert=True) == name
    assert canonical_name(name, ep, ep.coords(1)) == name  # not an expert module: unchanged


def test_dp_microbatches_map_to_global_microbatches():
    cfg = ParallelConfig(dp=2, microbatches=3)
    assert [cfg.global_microbatch(d, m) for d in range(2) for m in range(3)] == [0, 1, 2, 3, 4, 5]
    with pytest.raises(LayoutError):
        cfg.global_microbatch(0, 3)


def test_rank_order_is_tp_cp_dp_pp():
    cfg = ParallelConfig(tp=2, cp=2, dp=2, pp=2)
    assert cfg.coords(0) == Coords()
    assert cfg.coords(1) == Coords(tp=1)
    assert cfg.coords(2) == Coords(cp=1)
    assert cfg.coords(4) == Coords(dp=1)
    assert cfg.coords(8) == Coords(pp=1)
    assert all(cfg.rank(cfg.coords(r)) == r for r in range(16))
    assert cfg.group(5, "tp") == [4, 5] and cfg.group(5, "dp") == [1, 5]


def boxes(smap):
    return [(p.local, p.full) for p in smap.pieces]


def test_tp_sp_and_striped_cp_shard_maps():
    cfg = ParallelConfig(tp=2, cp=2, sp=True)
    # CP first: 4 chunks of 4, rank cp0 holds chunks 0 and 3; then SP halves the local sequence.
    expected_full_rows = {Coords(cp=0, tp=0): [(0, 4)], Coords(cp=0, tp=1): [(12, 16)],
                          Coords(cp=1, tp=0): [(4, 8)], Coords(cp=1, tp=1): [(8, 12)]}
    for coords, rows in expected_full_rows.items():
        smap = shard_map(TensorSplit(sp_dim=0, cp_dim=0), cfg, coords, full_shape=(16, 3))
        assert [p.full[0] for p in smap.pieces] == rows
    two = shard_map(TensorSplit(cp_dim=0, tp_dim=-1), cfg, Coords(cp=1, tp=1), full_shape=(16, 2, 8))
    assert boxes(two) == [(((0, 4), (0, 2), (0, 4)), ((4, 8), (0, 2), (4, 8))),
                          (((4, 8), (0, 2), (0, 4)), ((8, 12), (0, 2), (4, 8)))]
    assert two.local_shape == (8, 2, 4)
    # From the local shape the full shape is derived.
    assert shard_map(TensorSplit(cp_dim=0, tp_dim=-1), cfg, Coords(), local_shape=(8, 2, 4)).full_shape == (16, 2, 8)
    # Without SP the sp_dim is ignored; with tp = 1 so is tp_dim.
    plain = ParallelConfig(cp=1)
    assert boxes(shard_map(TensorSplit(sp_dim=0, tp_dim=1), plain, Coords(), full_shape=(4, 4))) == \
        [(((0, 4), (0, 4)), ((0, 4), (0, 4)))]


CONFIGS = [ParallelConfig(tp=2), ParallelConfig(tp=2, sp=True), ParallelConfig(cp=2), ParallelConfig(tp=2, cp=2),
           ParallelConfig(tp=2, cp=2, sp=True), ParallelConfig(tp=4, cp=2, sp=True, dp=2)]
SPLITS = [TensorSplit(sp_dim=0, cp_dim=0), TensorSplit(tp_dim=-1, cp_dim=0), TensorSplit(sp_dim=0, tp_dim=2),
          TensorSplit(), TensorSplit(sp_dim=0, cp_dim=0, tp_dim=-1)]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("split", SPLITS)
def test_pieces_of_all_ranks_reassemble_the_full_tensor_exactly(cfg, split):
    if cfg.sp and split.sp_dim is not None and split.tp_dim is not None:
        with pytest.raises(LayoutError, match="sp_dim and tp_dim both given"):
            shard_map(split, cfg, Coords(), full_shape=(32, 3, 8))
        return
    full = torch.arange(32 * 3 * 8, dtype=torch.float64).reshape(32, 3, 8)
    merged = torch.full_like(full, float("nan"))
    count = torch.zeros_like(full)
    replicas = {}
    for rank in range(cfg.world_size):
        coords = cfg.coords(rank)
        smap = shard_map(split, cfg, coords, full_shape=full.shape)
        local = extract_local(full, smap)
        assert tuple(local.shape) == smap.local_shape
        # Going back from the local shape gives the same map.
        assert shard_map(split, cfg, coords, local_shape=local.shape) == smap
        covered = torch.zeros_like(full)
        for piece in smap.pieces:
            lbox = tuple(slice(a, b) for a, b in piece.local)
            fbox = tuple(slice(a, b) for a, b in piece.full)
            merged[fbox] = local[lbox]
            covered[fbox] += 1
        assert covered.max() <= 1  # a rank's pieces never overlap
        count += covered
        replicas.setdefault(tuple(p.full for p in smap.pieces), 0)
        replicas[tuple(p.full for p in smap.pieces)] += 1
    assert torch.equal(merged, full)
    # Every element is held by the same number of ranks (replicas), and replica groups are equal-sized.
    assert count.min() == count.max() == cfg.world_size // len(replicas)


def test_uneven_splits_are_errors_not_wrong_maps():
    with pytest.raises(LayoutError, match="2\\*cp=4"):
        shard_map(TensorSplit(cp_dim=0), ParallelConfig(cp=2), Coords(), full_shape=(6, 2))
    with pytest.raises(LayoutError, match="split evenly"):
        shard_map(TensorSplit(tp_dim=1), ParallelConfig(tp=2), Coords(), full_shape=(2, 3))
    with pytest.raises(LayoutError, match="outside a tensor of 2"):
        shard_map(TensorSplit(tp_dim=2), ParallelConfig(tp=2), Coords(), full_shape=(2, 4))
    with pytest.raises(LayoutError):
        ParallelConfig(sp=True)


def test_flat_ranges_become_row_major_boxes_that_extract_the_range():
    import torch
    from shardproof.trace.layout import flat_boxes, flat_shard_map
    # Elements 5..17 of a [3, 2, 4] tensor: the rest of row (0, 1), the whole slab 1, the start
    # of row (2, 0).
    assert flat_boxes((3, 2, 4), 5, 18) == [((0, 1), (1, 2), (1, 4)), ((1, 2), (0, 2), (0, 4)),
                                            ((2, 3), (0, 1), (0, 2))]
    for shape in [(3, 4), (2, 3, 4), (5,), (4, 1)]:
        full = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
        whole = shard_map(None, ParallelConfig(), Coords(), full_shape=shape)
        for a in range(full.numel() + 1):
            for b in range(a, full.numel() + 1):
                smap = flat_shard_map(whole, a, b)
                assert torch.equal(extract_local(full, smap), full.reshape(-1)[a:b]), (shape, a, b)
    # A TP shard's flat range lies in the shard's box of the full tensor.
    cfg = ParallelConfig(tp=2)
    shard = shard_map(TensorSplit(tp_dim=1), cfg, cfg.coords(1), full_shape=(2, 4))
    smap = flat_shard_map(shard, 1, 4)
    assert [p.full for p in smap.pieces] == [((0, 1), (3, 4)), ((1, 2), (2, 4))]
    assert [p.as_json() for p in smap.pieces][0] == {"local_flat": [0, 1], "full": [[0, 1], [3, 4]]}
    with pytest.raises(LayoutError):
        flat_shard_map(shard, 3, 5)
