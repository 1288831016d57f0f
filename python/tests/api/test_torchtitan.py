"""torchtitan's Llama 3 (torchtitan 0.3.0 from PyPI, installed by scripts/wheel without its
training-stack dependencies) captured with torchtitan's own tensor-parallel sharding at tp=2:
placements from its DTensors; `run` matches the spec and `verify` proves it by relations
(torchtitan's vocab-parallel embedding by `vocab-clamped-lookup`, PyTorch's CPU attention kernel
`_scaled_dot_product_flash_attention_for_cpu` split over the heads by
`fused-attention-over-heads`), and a planted missing all-reduce is refuted. The tests fail,
never skip, without torchtitan."""

from __future__ import annotations

import pytest
import torch

import shardproof
import torchtitan.models.llama3.model  # noqa: F401  (installed by scripts/wheel: a missing one is a failure)
from titan_models import build_llama, titan_plan, tokens


def _capture(tmp_path, drop_w2_reduce=False):
    torch.manual_seed(0)
    return shardproof.capture(build_llama(), (tokens(),), mesh={"tp": 2}, out=tmp_path,
                              plan=titan_plan(2, drop_w2_reduce))


def test_forward_placements_come_from_torchtitans_sharding_config(tmp_path, engine_ready):
    cap = _capture(tmp_path)
    assert cap.inputs["tok_embeddings_weight"] == "Shard(0)"
    assert cap.inputs["layers_0_attention_qkv_linear_wq_weight"] == "Shard(0)"
    assert cap.inputs["layers_0_attention_wo_weight"] == "Shard(1)"
    assert cap.inputs["layers_0_feed_forward_w2_weight"] == "Shard(1)"
    assert cap.inputs["lm_head_weight"] == "Shard(0)"
    assert cap.outputs == {"out": "Shard(2)"}
    ran = cap.run()
    assert ran.exit_code == 0, (ran, ran.stderr, ran.report)
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)
    assert verdict.report["decided_by"] == "relations", verdict.report


@pytest.fixture(scope="module")
def dropped_w2(tmp_path_factory):
    """The w2-without-all-reduce capture and its verdict, shared by the two tests below (one
    capture: the module's time stays as it was)."""
    cap = _capture(tmp_path_factory.mktemp("titan-bug"), drop_w2_reduce=True)
    return cap.verify()


def test_dropped_w2_all_reduce_is_refuted(dropped_w2, engine_ready):
    verdict = dropped_w2
    assert verdict.exit_code == 1, (verdict, verdict.stderr, verdict.report)
    # The counterexample search shows w2's unreduced output in the logits.
    assert verdict.report["counterexample"]["output"] == "out", verdict.report


def test_dropped_w2_all_reduce_is_located_at_the_ffn_residual(dropped_w2, engine_ready):
    # The diagnosis walks back from the first nonlinear read of w2's partial sum to the FFN
    # residual add, and stops there: the attention residual before it relates cleanly with no
    # rank sum (the ranks all-reduced wo's output), so the missing reduction comes after it.
    verdict = dropped_w2
    loc = verdict.location
    assert loc is not None and loc.file.endswith("llama3/model.py"), verdict
    # `out = h + self.feed_forward(self.ffn_norm(h))`
    assert loc.line == 49, verdict
