"""Megatron-core's GPT (megatron-core from PyPI, its local layer spec) captured on CPU with the
fake process group at tensor-parallel size 2: placements from Megatron's own partition
attributes, verified, and a planted missing all-reduce refuted. megatron-core is installed with
the wheel (scripts/wheel); these tests fail, never skip, without it."""

from __future__ import annotations

import torch

import megatron.core  # noqa: F401  (installed by scripts/wheel: a missing one is a failure)
from megatron_models import (
    build_gpt,
    build_gpt_loss,
    build_gpt_loss_without_fc1_dgrad_reduce,
    build_gpt_sequence_parallel,
    build_gpt_sequence_parallel_loss,
    build_gpt_without_fc2_reduce,
    gpt_inputs,
)
from shardproof.capture.megatron import capture_megatron

LOGITS = {"out": "Shard(2)"}  # [b, s, vocab], vocabulary-parallel (parallel_output=True)


def test_forward_placements_come_from_megatrons_attributes(tmp_path, engine_ready):
    cap = capture_megatron(build_gpt, gpt_inputs(), tp=2, out=tmp_path, output_placements=LOGITS)
    assert cap.inputs["embedding_word_embeddings_weight"] == "Shard(0)"
    assert cap.inputs["decoder_layers_0_self_attention_linear_qkv_weight"] == "Shard(0)"
    assert cap.inputs["decoder_layers_0_mlp_linear_fc2_weight"] == "Shard(1)"
    assert cap.inputs["decoder_layers_0_input_layernorm_weight"] == "Replicate()"
    assert cap.inputs["input_ids"] == "Replicate()"
    text = cap.ranks[0].read_text()
    assert "_c10d_functional.all_reduce" in text and "c10d.allreduce_" not in text
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_sequence_parallel_forward_verifies(tmp_path, engine_ready):
    cap = capture_megatron(build_gpt_sequence_parallel, gpt_inputs(), tp=2, out=tmp_path,
                           output_placements=LOGITS)
    text = cap.ranks[0].read_text()
    assert "all_gather_into_tensor" in text and "reduce_scatter_tensor" in text
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_dropped_fc2_all_reduce_is_refuted(tmp_path, engine_ready):
    cap = capture_megatron(build_gpt_without_fc2_reduce, gpt_inputs(), tp=2, out=tmp_path,
                           output_placements=LOGITS)
    verdict = cap.verify()
    assert verdict.exit_code == 1, (verdict, verdict.stderr, verdict.report)
    failure = verdict.report["failure"]
    # fc2's partial sums are first read whole by the residual add after the MLP, which
    # Megatron's layer computes in its own source.
    assert failure["op"] == "aten.add.Tensor", failure
    assert "megatron/core/transformer/transformer_layer.py:" in failure["source"], failure


def _training_capture(build, tmp_path):
    ids, pos, mask = gpt_inputs()
    labels = torch.roll(ids, -1, 1)
    return capture_megatron(build, (ids, pos, mask, labels), tp=2, out=tmp_path, train=True,
                            assume={"ignore-index": "unused"})


def test_training_step_verifies(tmp_path, engine_ready):
    # Forward, backward through Megatron's own autograd functions (its vocab-parallel
    # cross-entropy, whose backward subtracts the shard's one-hot from the softmax in place;
    # the linear layers' async input-grad all-reduce; attention's in-place masked fill) and an
    # SGD step.
    cap = _training_capture(build_gpt_loss, tmp_path)
    assert cap.outputs["loss"] == "Replicate()"
    assert cap.outputs["next_gpt_output_layer_weight"] == "Shard(0)"
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_sequence_parallel_training_step_verifies(tmp_path, engine_ready):
    # The norms' weight gradients are partial sums over each rank's tokens until Megatron's
    # finalize_model_grads all-reduces them, which the captured step includes.
    cap = _training_capture(build_gpt_sequence_parallel_loss, tmp_path)
    text = cap.ranks[0].read_text()
    assert "c10d._allgather_base_" not in text and "c10d._reduce_scatter_base_" not in text
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_missing_input_grad_all_reduce_is_refuted(tmp_path, engine_ready):
    cap = _training_capture(build_gpt_loss_without_fc1_dgrad_reduce, tmp_path)
    verdict = cap.verify()
    assert verdict.exit_code == 1, (verdict, verdict.stderr, verdict.report)
    failure = verdict.report["failure"]
    # fc1's unreduced input gradient flows linearly through the pre-MLP norm's backward and
    # the residual into attention's row-parallel output projection, whose backward matmul
    # needs it whole on every rank: located at that layer's matmul in Megatron's source.
    assert failure["op"] == "aten.mm.default", failure
    assert "megatron/core/tensor_parallel/layers.py:" in failure["source"], failure
    assert "partial sum" in failure["hint"], failure
