"""shardproof.capture on parallelize_module plans, checked by the shardproof engines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

import shardproof
from models import (
    MLP,
    Classifier,
    RowwiseWithoutReduce,
    cross_entropy,
    loss_parallel_plan,
    megatron_plan,
    mse,
)


def _inputs(tp: int):
    g = torch.Generator().manual_seed(tp)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


_FORWARD: dict[int, object] = {}


def _forward(tp: int, tmp_path_factory):
    """The forward MLP captured once per tp for the tests that read it."""
    if tp not in _FORWARD:
        x, _ = _inputs(tp)
        out = tmp_path_factory.mktemp(f"mlp-tp{tp}")
        _FORWARD[tp] = shardproof.capture(MLP(), (x,), mesh={"tp": tp}, plan=megatron_plan(), out=out)
    return _FORWARD[tp]


@pytest.mark.parametrize("tp", [2, 4])
def test_forward_case_is_derived_from_the_plan(tmp_path_factory, tp):
    cap = _forward(tp, tmp_path_factory)
    assert cap.inputs == {
        "fc1_weight": "Shard(0)",
        "fc1_bias": "Shard(0)",
        "fc2_weight": "Shard(1)",
        "fc2_bias": "Replicate()",
        "x": "Replicate()",
    }
    assert cap.outputs == {"out": "Replicate()"}
    assert cap.fqns["fc2_weight"] == "fc2.weight"
    assert len(cap.ranks) == tp
    rank1 = cap.ranks[1].read_text()
    # Every rank's input is its own shard, and the row-parallel layer reduces over the tp group.
    assert f'fc1_weight: "f32[{16 // tp}, 8]"' in rank1
    assert "_c10d_functional.all_reduce.default" in rank1
    # The user's own lines are kept as locations, not torch's.
    assert re.search(r"# File: .*models\.py:\d+ in forward, code: h = torch.relu\(self.fc1\(x\)\)", rank1)
    assert "site-packages/torch" not in rank1
    case = cap.case.read_text()
    assert "mesh: { tp: %d }" % tp in case and '"0": tp' in case


@pytest.mark.parametrize("tp", [2, 4])
def test_forward_verifies_and_runs(tmp_path_factory, tp, engine_ready):
    cap = _forward(tp, tmp_path_factory)
    verdict = shardproof.verify(cap.case)
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)
    assert verdict.verdict == "holds" and bool(verdict)
    ran = cap.run()
    assert ran.exit_code == 0, (ran, ran.stderr, ran.report)
    # RowwiseParallel adds its replicated bias divided by tp before the all-reduce (DTensor's
    # replicate-to-partial share): the static checker must read that as a partial, not a
    # bias counted tp times.
    checked = shardproof.check(cap.case)
    assert checked.exit_code == 0, (checked, checked.stderr, checked.report)


@pytest.mark.parametrize("tp", [2, 4])
def test_training_step_verifies_and_runs(tmp_path, tp, engine_ready):
    x, target = _inputs(tp)
    cap = shardproof.capture(
        MLP(), (x,), mesh={"tp": tp}, plan=megatron_plan(), out=tmp_path,
        train=True, loss_fn=mse, loss_inputs=(target,),
    )
    assert cap.outputs == {
        "loss": "Replicate()",
        "next_fc1_weight": "Shard(0)",
        "next_fc1_bias": "Shard(0)",
        "next_fc2_weight": "Shard(1)",
        "next_fc2_bias": "Replicate()",
    }
    assert cap.inputs["target"] == "Replicate()"
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)
    ran = cap.run()
    assert ran.exit_code == 0, (ran, ran.stderr, ran.report)


def test_dropped_reduction_is_refuted_at_the_row_parallel_layer(tmp_path, engine_ready):
    x, _ = _inputs(2)
    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseWithoutReduce()}
    cap = shardproof.capture(MLP(), (x,), mesh={"tp": 2}, plan=plan, out=tmp_path)
    assert "all_reduce" not in cap.ranks[0].read_text()
    assert cap.outputs == {"out": "Replicate()"}
    verdict = cap.verify()
    assert verdict.exit_code == 1, (verdict, verdict.stderr, verdict.report)
    assert verdict.verdict == "violated"
    # Refuted at fc2's matrix product, located at the user's line that calls fc2.
    assert verdict.report["failure"]["op"] == "aten.addmm.default", verdict.report
    where = verdict.location
    assert where is not None and where.file.endswith("models.py"), verdict.report
    assert "return self.fc2(h)" in Path(where.file).read_text().splitlines()[where.line - 1]
    assert "violated" in verdict._repr_html_() and "models.py" in str(verdict)
    ran = cap.run()
    assert ran.exit_code == 1, (ran, ran.stderr, ran.report)
    checked = shardproof.check(cap.case)
    assert checked.exit_code == 1, (checked, checked.stderr, checked.report)


def test_sequence_parallel_input_layout_comes_from_the_plan(tmp_path):
    # SequenceParallel reads its input sharded on the sequence dim: the case says so.
    norm = torch.nn.LayerNorm(8)
    x = torch.randn(2, 4, 8)
    cap = shardproof.capture(norm, (x,), mesh={"tp": 2}, plan={"": SequenceParallel()}, out=tmp_path,
                             input_names=["x"])
    assert cap.inputs["x"] == "Shard(1)"
    assert cap.outputs == {"out": "Shard(1)"}
    assert 'x: "f32[2, 2, 8]"' in cap.ranks[0].read_text()


def test_given_input_placement_overrides_and_bad_ones_are_refused(tmp_path):
    x, _ = _inputs(2)
    with pytest.raises(shardproof.capture.CaptureError, match="not divisible"):
        shardproof.capture(MLP(), (torch.randn(3, 8),), mesh={"tp": 2}, plan=megatron_plan(),
                           out=tmp_path, input_placements={"x": Shard(0)})
    with pytest.raises(shardproof.capture.CaptureError, match="ambiguous"):
        shardproof.capture(MLP(), (x,), mesh={"dp": 1, "tp": 2}, plan={"tp": megatron_plan()},
                           out=tmp_path, input_placements={"x": "Shard(0)"})


def test_loss_parallel_training_step_verifies(tmp_path, engine_ready):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, 8, (4,), generator=torch.Generator().manual_seed(6))
    cap = shardproof.capture(
        Classifier(), (x,), mesh={"tp": 2}, plan=loss_parallel_plan(), out=tmp_path,
        train=True, loss_fn=cross_entropy, loss_inputs=(target,), loss_parallel=True,
        assume={"ignore-index": "unused"},
    )
    assert cap.inputs["fc2_weight"] == "Shard(0)" and cap.inputs["target"] == "Replicate()"
    assert cap.outputs["loss"] == "Replicate()" and cap.outputs["next_fc2_weight"] == "Shard(0)"
    assert "assume:" in cap.case.read_text() and "ignore-index: unused" in cap.case.read_text()
    # Backward nodes are located at the user's line of the forward operator they differentiate.
    assert re.search(r"# Backward of forward node: File: .*models\.py:\d+ in forward", cap.ranks[0].read_text())
    assert re.search(r"# Backward of forward node: File: .*models\.py:\d+ in forward", cap.spec.read_text())
    ran = cap.run()
    assert ran.exit_code == 0, (ran, ran.stderr, ran.report)
    # The vocab-parallel cross-entropy and its backward relate to the spec's (loss_parallel
    # lemmas), under the stated assumption that no target is ignored.
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_loss_parallel_without_the_assumption_is_inconclusive_never_refuted(tmp_path, engine_ready):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, 8, (4,), generator=torch.Generator().manual_seed(6))
    cap = shardproof.capture(
        Classifier(), (x,), mesh={"tp": 2}, plan=loss_parallel_plan(), out=tmp_path,
        train=True, loss_fn=cross_entropy, loss_inputs=(target,), loss_parallel=True,
    )
    assert "assume:" not in cap.case.read_text()
    # An ignored target changes the mean's count: without the assumption nothing is claimed.
    verdict = cap.verify()
    assert verdict.exit_code == 3, (verdict, verdict.stderr, verdict.report)


def test_bad_assumptions_are_refused(tmp_path):
    with pytest.raises(shardproof.capture.CaptureError, match="not a case assumption"):
        shardproof.capture(MLP(), (torch.randn(4, 8),), mesh={"tp": 2}, plan=megatron_plan(),
                           out=tmp_path, assume={"ignore-index": "unused: yes"})


def test_loss_parallel_with_an_unreduced_layer_is_refuted_where_it_is_read(tmp_path, engine_ready):
    # A planted bug before loss_parallel's cross-entropy: fc1's partial sums are declared
    # replicated, and relu reads them as whole.
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, 8, (4,), generator=torch.Generator().manual_seed(6))
    plan = {"fc1": RowwiseWithoutReduce(), "fc2": ColwiseParallel(use_local_output=False)}
    cap = shardproof.capture(
        Classifier(), (x,), mesh={"tp": 2}, plan=plan, out=tmp_path, train=True,
        loss_fn=cross_entropy, loss_inputs=(target,), loss_parallel=True,
        assume={"ignore-index": "unused"},
    )
    verdict = cap.verify()
    assert verdict.exit_code == 1, (verdict, verdict.stderr, verdict.report)
    assert verdict.report["failure"]["op"] == "aten.relu.default", verdict.report
    where = verdict.location
    assert where is not None and where.file.endswith("models.py"), verdict.report
    assert "torch.relu(self.fc1(x))" in Path(where.file).read_text().splitlines()[where.line - 1]


def test_dp_by_tp_mesh_forward_verifies(tmp_path, engine_ready):
    # A 2 x 2 mesh: the batch sharded over dp, the MLP Megatron-style over tp (a plan keyed by
    # mesh dim); each dp group computes its half of the batch.
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(9))
    args = dict(mesh={"dp": 2, "tp": 2}, plan={"tp": megatron_plan()}, out=tmp_path,
                input_placements={"x": {"dp": Shard(0)}})
    # The output's DTensor lives on the tp sub-mesh; along dp the batch differs, so its layout
    # there is not told (never guessed Replicate()).
    with pytest.raises(shardproof.capture.CaptureError, match="output_placements"):
        shardproof.capture(MLP(), (x,), **args)
    cap = shardproof.capture(MLP(), (x,), output_placements={"out": {"dp": Shard(0)}}, **args)
    assert cap.inputs["x"] == "{ dp: Shard(0) }"
    assert cap.inputs["fc1_weight"] == "{ tp: Shard(0) }"
    assert cap.outputs == {"out": "{ dp: Shard(0) }"}
    assert len(cap.ranks) == 4
    assert "mesh: { dp: 2, tp: 2 }" in cap.case.read_text()
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_out_variants_writing_their_input_become_in_place():
    # Megatron's cross-entropy writes `torch.exp(x, out=x)`; the importer reads in-place calls.
    from torch.fx.experimental.proxy_tensor import make_fx

    from shardproof.capture._trace import _functionalized, _out_to_in_place

    def f(x):
        y = x * 2
        torch.exp(y, out=y)
        z = x + 1
        torch.exp(x, out=z)  # `out` is not the first argument: left alone
        return y, z

    gm = make_fx(f)(torch.randn(3))
    _out_to_in_place(gm)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.exp_.default" in targets and targets.count("aten.exp.out") == 1, targets
    x = torch.randn(3)
    for a, b in zip(gm(x), f(x)):
        torch.testing.assert_close(a, b)
    # PyTorch's functionalization then leaves no in-place call and the same values.
    fn = _functionalized(gm, [x])
    assert not any(str(n.target).split(".")[1].endswith("_") for n in fn.graph.nodes
                   if n.op == "call_function" and str(n.target).startswith("aten.")), fn.code
    for a, b in zip(fn(x), f(x)):
        torch.testing.assert_close(a, b)
