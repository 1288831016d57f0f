"""The collector on a small single-process model: what it records, under which ids, in a file
layout that follows the trace format (read back with the `safetensors` package), rewrites,
perturbed runs and recomputation."""

import json
import os

import pytest
import torch

from shardproof import trace
from tracereader import read_trace

# The test inputs do not require gradients, so PyTorch notes that full backward hooks fire with
# respect to module outputs only; that is expected here.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

ANNOTATIONS = """
fc1: {input: {}, output: {}}
fc2: {input: {}, output: {}}
fc1.weight: {}
"""


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def traced_iteration(out, role="reference", rewrite=False, perturbation=None, microbatches=2, dtype="float32"):
    net = Net()
    if dtype == "bfloat16":
        net = net.to(torch.bfloat16)
    config = trace.ParallelConfig(microbatches=microbatches)
    tracer = trace.Tracer(net, trace.parse_annotations(ANNOTATIONS), config, rank=0, out=str(out), role=role,
                          dtype=dtype, rewrite=rewrite, perturbation=perturbation)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    inputs = [torch.randn(5, 4, generator=torch.Generator().manual_seed(m)).to(next(net.parameters()).dtype)
              for m in range(microbatches)]
    with tracer.iteration():
        for m, x in enumerate(inputs):
            with tracer.microbatch(m):
                net(tracer.data_input(x, "x")).pow(2).sum().backward()
        tracer.before_step()
        optimizer.step()
        tracer.after_step()
    tracer.save()
    return net, inputs


def test_records_every_kind_under_canonical_ids(tmp_path):
    net, inputs = traced_iteration(tmp_path)
    merged = read_trace(str(tmp_path))
    kinds = {key.split("/")[2] for key in merged}
    assert kinds == set(trace.KINDS) - {"recompute_input", "recompute_output"}  # nothing is recomputed
    assert "it0/mb1/forward_output/fc1/0" in merged
    assert "it0/mb0/param_grad/fc1.weight/0" in merged and "it0/mb1/param_grad/fc2.bias/0" in merged
    assert "it0/mb0/main_grad/fc2.weight/0" in merged
    # Per-microbatch parameter gradients (tensor hooks) add up to the accumulated gradient.
    total = merged["it0/mb0/param_grad/fc1.weight/0"].value + merged["it0/mb1/param_grad/fc1.weight/0"].value
    assert torch.allclose(total, merged["it0/mb0/main_grad/fc1.weight/0"].value, atol=1e-6)
    # Parameters after the step: p - lr * grad.
    before = merged["it0/mb0/param_before_step/fc1.weight/0"].value
    after = merged["it0/mb0/param_after_step/fc1.weight/0"].value
    assert torch.allclose(after, before - 0.5 * total, atol=1e-6)
    assert torch.allclose(after.float(), net.fc1.weight.detach(), atol=1e-7)
    # A recorded forward input is the tensor the module saw.
    assert torch.allclose(merged["it0/mb1/forward_input/fc1/0"].value.float(), inputs[1])


def test_files_follow_the_format(tmp_path):
    traced_iteration(tmp_path, dtype="bfloat16")
    meta = json.load(open(tmp_path / "trace.json"))
    assert meta == {"format": "shardproof-trace", "version": 1, "role": "reference", "world_size": 1,
                    "dtype": "bfloat16", "parallel": {"tp": 1, "dp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1,
                                                      "sp": False},
                    "perturbation": None, "producer": "shardproof.trace 0.1.0"}
    index = json.load(open(tmp_path / "rank-00000" / "index.json"))
    assert index["rank"] == 0 and index["coords"] == {"pp": 0, "dp": 0, "cp": 0, "tp": 0, "ep": 0}
    from safetensors import safe_open
    with safe_open(str(tmp_path / "rank-00000" / "tensors.safetensors"), "pt") as handle:
        assert sorted(handle.keys()) == sorted(e["key"] for e in index["tensors"])
        for entry in index["tensors"]:
            tensor = handle.get_tensor(entry["key"])
            assert tensor.dtype == torch.bfloat16
            assert list(tensor.shape) == entry["full_shape"]
            assert entry["pieces"] == [{"local": [[0, n] for n in entry["full_shape"]],
                                        "full": [[0, n] for n in entry["full_shape"]]}]
    assert [e["seq"] for e in index["tensors"]] == list(range(len(index["tensors"])))
    # Forward kinds come first in recording order; a module's grad_output precedes its grad_input.
    order = [(e["id"]["kind"], e["id"]["module"], e["id"]["microbatch"]) for e in index["tensors"]]
    assert order.index(("grad_output", "fc2", 0)) < order.index(("grad_input", "fc2", 0))
    assert order.index(("forward_output", "fc2", 0)) < order.index(("grad_output", "fc2", 0))


def test_rewrite_mode_feeds_generated_inputs_and_keeps_the_graph(tmp_path):
    net, _ = traced_iteration(tmp_path, rewrite=True, microbatches=1)
    merged = read_trace(str(tmp_path))
    gen = trace.ConsistentGenerator()
    expected = gen.full("rewrite:it0/mb0/forward_input/fc2/0", (5, 6))
    assert torch.equal(merged["it0/mb0/forward_input/fc2/0"].value.float(), expected)
    # fc2's output is computed from the rewritten input, with the parameters before the step.
    w = merged["it0/mb0/param_before_step/fc2.weight/0"].value.float()
    b = merged["it0/mb0/param_before_step/fc2.bias/0"].value.float()
    assert torch.allclose(merged["it0/mb0/forward_output/fc2/0"].value.float(), expected @ w.T + b, atol=1e-5)
    # The gradient w.r.t. fc2's output is rewritten too, and fc1 still receives gradients.
    grad_out = gen.full("rewrite:it0/mb0/grad_output/fc2/0", (5, 3))
    assert torch.equal(merged["it0/mb0/grad_output/fc2/0"].value.float(), grad_out)
    assert torch.allclose(merged["it0/mb0/param_grad/fc2.weight/0"].value.float(), grad_out.T @ expected, atol=1e-5)
    assert float(merged["it0/mb0/param_grad/fc1.weight/0"].value.abs().sum()) > 0


def test_perturbed_runs_differ_at_machine_epsilon_scale(tmp_path):
    eps = trace.machine_epsilon("bfloat16")
    assert eps == 2 ** -7 and trace.machine_epsilon("float8_e4m3fn") == eps
    traced_iteration(tmp_path / "ref")
    traced_iteration(tmp_path / "p0", role="perturbed", perturbation=trace.Perturbation(1, 1e-3))
    meta = json.load(open(tmp_path / "p0" / "trace.json"))
    assert meta["role"] == "perturbed" and meta["perturbation"] == {"seed": 1, "relative_scale": 1e-3}
    ref, pert = read_trace(str(tmp_path / "ref")), read_trace(str(tmp_path / "p0"))
    assert set(ref) == set(pert)
    key = "it0/mb0/param_before_step/fc1.weight/0"
    relative = ((pert[key].value - ref[key].value) / ref[key].value).abs()
    assert 0 < float(relative.max()) < 1e-3 * 6
    with pytest.raises(ValueError):
        traced_iteration(tmp_path / "bad", role="perturbed")


def test_recomputation_is_not_recorded_twice(tmp_path):
    net = Net()
    tracer = trace.Tracer(net, trace.parse_annotations(ANNOTATIONS), trace.ParallelConfig(), 0, str(tmp_path),
                          role="candidate")
    x = torch.randn(2, 4)
    with tracer.iteration():
        net(x)
        with trace.recomputing():
            net(x)
        with pytest.raises(trace.LayoutError, match="recorded twice"):
            net(x)
    tracer.save()
    assert os.path.exists(tmp_path / "rank-00000" / "tensors.safetensors")


def test_virtual_pipeline_chunks_are_named_by_global_layer(tmp_path):
    class Chunk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(2))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    chunks = [Chunk(), Chunk()]
    # 8 layers, pp = 2, vpp = 2: stage 1 holds layers 2-3 (chunk 0) and 6-7 (chunk 1).
    config = trace.ParallelConfig(pp=2, vpp=2, num_layers=8)
    annotations = trace.parse_annotations('"layers.*": {output: {}}\n"layers.*.weight": {}\n')
    tracer = trace.Tracer(chunks, annotations, config, rank=1, out=str(tmp_path), role="candidate")
    with tracer.iteration():
        chunks[1](chunks[0](torch.randn(2, 3))).sum().backward()
        tracer.before_step()
    tracer.save()
    index = json.load(open(tmp_path / "rank-00001" / "index.json"))
    assert index["coords"]["pp"] == 1
    forward = [e["id"]["module"] for e in index["tensors"] if e["id"]["kind"] == "forward_output"]
    assert forward == ["layers.2", "layers.3", "layers.6", "layers.7"]
    grads = {e["id"]["module"] for e in index["tensors"] if e["id"]["kind"] == "main_grad"}
    assert grads == {f"layers.{i}.{p}" for i in (2, 3, 6, 7) for p in ("weight", "bias")}
    assert not (tmp_path / "trace.json").exists()  # rank 0 writes the run-level file
