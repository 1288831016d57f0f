"""`shardproof.capture.megatron`: capture a Megatron-core model's single-device program and its
tensor-parallel ranks on CPU, and derive the case from Megatron's own partition attributes.

    from shardproof.capture.megatron import capture_megatron
    cap = capture_megatron(build_gpt, (ids, pos, mask), tp=2, out="gpt-tp2",
                           output_placements={"out": "Shard(2)"})
    print(cap.verify())

Megatron's layers are not DTensor: each builds its local shard itself from the parallel state
(`parallel_state.initialize_model_parallel`) and marks it with `tensor_model_parallel` and
`partition_dim`. So `build()` is called in every capture process after that state is set up:
with tensor-parallel size 1 (world 1) for the spec, with `tp` for each rank, on the fake
backend. A parameter marked `tensor_model_parallel` is `Shard(partition_dim)`, every other
`Replicate()`; the model's arguments are `Replicate()` unless `input_placements` says otherwise.

Megatron-core assumes a GPU in three places that do not touch its math; the capture processes
(never the caller's) substitute them, see `_cpu_harness`:

- `torch.cuda.current_device()` names where its buffers live (`GlobalMemoryBuffer.get_tensor`,
  the sequence-parallel gathers): it returns the CPU device instead.
- the model-parallel RNG tracker's `fork()` saves and restores CUDA RNG states around dropout:
  it is a no-op context, so a model with dropout is refused (its random draws would be traced
  as they fall, not as Megatron's tracker seeds them).
- `torch.distributed.all_reduce` / `all_gather_into_tensor` / `reduce_scatter_tensor` (and their
  `_base` forms) are in-place c10d calls make_fx records with process-group objects; they are
  replaced by the functional collectives computing the same values, written back with `copy_`
  (the importer functionalizes that update). An asynchronous call completes at once; its
  handle's `wait()` does nothing, so a read before `wait()` (a race on a device) is not seen.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from . import Capture, _as_tuple, _assumptions, _run_children, _write
from ._layout import CaptureError, Layout, local_piece, parse_layout, placement_text
from ._trace import Program, collective_groups, graph_text, tensor_name, trace

__all__ = ["capture_megatron"]


@dataclass
class _Job:
    """What a capture process needs; inherited by fork, never pickled."""

    build: Callable[[], torch.nn.Module]
    tp: int
    data: list[torch.Tensor]
    loss_inputs: list[torch.Tensor]
    arg_names: list[str] | None
    loss_fn: Callable[..., torch.Tensor] | None
    train: bool
    lr: float
    seed: int
    input_layouts: dict[str, Any]  # the user's, by argument name
    output_layouts: dict[str, Any]  # the user's, by output name


def _functional_collectives() -> dict[str, Callable[..., None]]:
    """In-place c10d entry points as functional collectives written back into their output."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import ReduceOp

    names = {ReduceOp.SUM: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min"}

    def group_of(group: Any) -> Any:
        return dist.group.WORLD if group is None else group

    def reduce_name(op: Any) -> str:
        if op not in names:
            raise CaptureError(f"capture_megatron: reduction {op} has no functional collective")
        return names[op]

    class _Done:
        """The handle of an asynchronous call, which completed when it was issued."""

        def wait(self) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    def handle(async_op: bool) -> Any:
        # An asynchronous collective (Megatron's backward overlaps its input-grad all-reduce
        # with the weight-grad matmul) completes at once here: the values are the same, but a
        # read of the buffer before `wait()` (a race on a device) is not seen.
        return _Done() if async_op else None

    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
        tensor.copy_(funcol.all_reduce(tensor, reduce_name(op), group_of(group)))
        return handle(async_op)

    def all_gather_into_tensor(output, input, group=None, async_op=False):
        output.copy_(funcol.all_gather_tensor(input, 0, group_of(group)).view_as(output))
        return handle(async_op)

    def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
        output.copy_(funcol.reduce_scatter_tensor(input, reduce_name(op), 0, group_of(group)).view_as(output))
        return handle(async_op)

    return {
        "all_reduce": all_reduce,
        "all_gather_into_tensor": all_gather_into_tensor,
        "_all_gather_base": all_gather_into_tensor,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "_reduce_scatter_base": reduce_scatter_tensor,
    }


def _cpu_harness() -> None:
    """The substitutions of the module docstring, in this (capture) process only."""
    import torch.distributed as dist

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    originals = {name: getattr(dist, name, None) for name in _functional_collectives()}
    for name, fn in _functional_collectives().items():
        setattr(dist, name, fn)
    import megatron.core.tensor_parallel  # noqa: F401  (imports layers, mappings, utils)
    from megatron.core.tensor_parallel import random as mrandom

    # Megatron's modules bind the gather / scatter entry points at import
    # (`dist_all_gather_func = torch.distributed._all_gather_base` in mappings, layers and
    # utils, which the sequence-parallel backward calls): every such binding of an original
    # c10d function is pointed at its functional replacement.
    replaced = {id(fn): getattr(dist, name) for name, fn in originals.items() if fn is not None}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith("megatron."):
            continue
        for attr in ("dist_all_gather_func", "dist_reduce_scatter_func"):
            bound = getattr(mod, attr, None)
            if bound is not None and id(bound) in replaced:
                setattr(mod, attr, replaced[id(bound)])
    mrandom.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()


def _refuse_dropout(module: torch.nn.Module) -> None:
    config = getattr(module, "config", None)
    for attr in ("hidden_dropout", "attention_dropout"):
        if config is not None and float(getattr(config, attr, 0.0) or 0.0) != 0.0:
            raise CaptureError(f"capture_megatron: config.{attr} must be 0 (dropout's draws are not traced soundly)")
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout) and m.p != 0.0:
            raise CaptureError("capture_megatron: the model has dropout; set every dropout probability to 0")


def _finalize_grads(module: torch.nn.Module, tp: int) -> Callable[[list[str], list[Any]], list[Any]] | None:
    """What Megatron's training loop does to the gradients before the optimizer steps, for
    one model replica: `finalize_model_grads` sums over the tensor-parallel group the gradients
    of the parameters every rank holds whole but computes from its own tokens only
    (`_allreduce_non_tensor_model_parallel_grads`: those marked `sequence_parallel` under
    sequence parallelism, and q/k layernorms; those marked
    `average_gradients_across_tp_domain` are averaged). Data-parallel reduction, loss scaling
    and gradient clipping are not part of the captured step."""
    config = getattr(module, "config", None)
    if config is None:
        config = next((getattr(m, "config") for m in module.modules() if hasattr(m, "config")), None)
    if tp <= 1 or config is None:
        return None
    from megatron.core import parallel_state
    import torch.distributed._functional_collectives as funcol

    params = dict(module.named_parameters())
    group = parallel_state.get_tensor_model_parallel_group()

    def op_for(fqn: str) -> str | None:
        p = params.get(fqn)
        if p is None:
            return None
        if getattr(p, "average_gradients_across_tp_domain", False):
            return "avg"
        if (getattr(config, "sequence_parallel", False) and getattr(p, "sequence_parallel", False)) or (
            getattr(config, "qk_layernorm", False) and ("q_layernorm" in fqn or "k_layernorm" in fqn)
        ):
            return "sum"
        return None

    def sync(fqns: list[str], grads: list[Any]) -> list[Any]:
        out = []
        for fqn, g in zip(fqns, grads):
            how = op_for(fqn)
            if g is None or how is None:
                out.append(g)
            elif how == "sum":
                out.append(funcol.all_reduce(g, "sum", group))
            else:
                out.append(funcol.all_reduce(g, "sum", group) / tp)
        return out

    return sync


def _layout_of(p: torch.Tensor) -> Layout:
    from torch.distributed.tensor import Replicate, Shard

    if getattr(p, "tensor_model_parallel", False):
        dim = int(getattr(p, "partition_dim", -1))
        if dim < 0 or dim >= p.dim():
            raise CaptureError(f"a tensor-parallel parameter has no valid partition_dim ({dim})")
        return (Shard(dim),)
    return (Replicate(),)


def _capture(job: _Job, rank: int | None) -> dict[str, Any]:
    """One program: the spec (rank None: world 1, tensor-parallel size 1) or one rank."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.distributed.tensor import Replicate
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = 1 if rank is None else job.tp
    dist.init_process_group("fake", store=FakeStore(), rank=rank or 0, world_size=world)
    try:
        _cpu_harness()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        torch.manual_seed(job.seed)
        module = job.build()
        if not isinstance(module, torch.nn.Module):
            raise CaptureError("build() must return an nn.Module")
        _refuse_dropout(module)
        taken: set[str] = set()
        params = list(module.named_parameters())
        buffers = list(module.named_buffers())
        fqns = [f for f, _ in params] + [f for f, _ in buffers]
        state_names = [tensor_name(f, taken) for f in fqns]
        trainable = [p.requires_grad for _, p in params] + [False] * len(buffers)
        arg_names = job.arg_names
        if arg_names is None:
            sig = [p.name for p in inspect.signature(module.forward).parameters.values()
                   if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            arg_names = (sig + [f"input_{i}" for i in range(len(sig), len(job.data))])[: len(job.data)]
        data_names = [tensor_name(n, taken) for n in arg_names]
        loss_names = [tensor_name(f"target_{i}" if len(job.loss_inputs) > 1 else "target", taken)
                      for i in range(len(job.loss_inputs))]
        prog = Program(fqns, state_names, trainable, data_names, loss_names, job.train, job.lr, job.loss_fn,
                       grad_sync=_finalize_grads(module, world))
        state = [t for _, t in params] + [t for _, t in buffers]
        replicated: Layout = (Replicate(),)
        state_layouts = [_layout_of(t) if rank is not None else replicated for t in state]
        by_arg = dict(zip(arg_names, data_names))
        layouts = {n: replicated for n in data_names + loss_names}
        for k, v in job.input_layouts.items():
            if k not in by_arg and k not in loss_names:
                raise CaptureError(f"input_placements names `{k}`, not an argument ({arg_names}) or a target")
            layouts[by_arg.get(k, k)] = parse_layout(v, ["tp"])
        if rank is None:
            data, extra = job.data, job.loss_inputs
        else:
            data = [local_piece(t, layouts[n], [world], rank, n) for n, t in zip(data_names, job.data)]
            extra = [local_piece(t, layouts[n], [world], rank, n) for n, t in zip(loss_names, job.loss_inputs)]
        gm = trace(module, prog, [t.detach() for t in state], data, extra, lambda i, t: t, lambda n, v: v,
                   functional=True)
        by_next = {f"next_{n}": lay for n, lay in zip(state_names, state_layouts)}
        out_layouts: dict[str, Any] = {}
        for name in prog.output_names:
            if name in job.output_layouts:
                out_layouts[name] = [placement_text(p) for p in parse_layout(job.output_layouts[name], ["tp"])]
            elif name in by_next:
                out_layouts[name] = [placement_text(p) for p in by_next[name]]
            elif name == "loss":
                out_layouts[name] = ["Replicate()"]
            else:
                out_layouts[name] = None
        used: dict[str, Any] = {}
        if rank is not None:
            from torch.distributed.distributed_c10d import _resolve_process_group

            tp_group = parallel_state.get_tensor_model_parallel_group()
            for g in collective_groups(gm):
                ranks = sorted(dist.get_process_group_ranks(_resolve_process_group(g)))
                used[g] = "tp" if ranks == sorted(dist.get_process_group_ranks(tp_group)) else ranks
        return {
            "text": graph_text(gm),
            "outputs": prog.output_names,
            "fqns": fqns,
            "state_names": state_names,
            "trainable": trainable,
            "data_names": data_names,
            "loss_names": loss_names,
            "state_layouts": [[placement_text(p) for p in lay] for lay in state_layouts],
            "input_layouts": {n: [placement_text(p) for p in layouts[n]] for n in data_names + loss_names},
            "input_sources": {n: ("given" if n in [by_arg.get(k, k) for k in job.input_layouts] else "default")
                              for n in data_names + loss_names},
            "output_layouts": out_layouts,
            "groups": used,
        }
    finally:
        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _child(job: _Job, rank: int | None, path: str) -> None:
    torch.set_num_threads(1)
    try:
        payload: dict[str, Any] = {"ok": _capture(job, rank)}
    except CaptureError as e:
        payload = {"error": str(e), "traceback": traceback.format_exc()}
    except Exception as e:  # Megatron's own errors carry the reason; keep it
        payload = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    with open(path, "w") as f:
        json.dump(payload, f)


def capture_megatron(
    build: Callable[[], torch.nn.Module],
    example_inputs: Any,
    *,
    tp: int,
    out: str | os.PathLike[str],
    train: bool = False,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    loss_inputs: Any = (),
    lr: float = 0.1,
    input_names: Sequence[str] | None = None,
    input_placements: Mapping[str, Any] | None = None,
    output_placements: Mapping[str, Any] | None = None,
    assume: Mapping[str, str] | None = None,
    seed: int = 0,
    name: str | None = None,
) -> Capture:
    """Capture a Megatron-core model at tensor-parallel size 1 (the spec) and `tp` (the ranks).

    Args:
        build: builds the model; called in each capture process after Megatron's parallel state
            is initialized, so it reads the tensor-parallel size from `parallel_state`.
        example_inputs: the model's positional arguments, full size (token ids, positions, an
            explicit attention mask: Megatron's default causal mask is built on CUDA).
        tp: the tensor-parallel size (the mesh is `{"tp": tp}`).
        out: the folder to write `spec.py`, `r0.py`.. and `case.yaml` into.
        train: trace forward, backward and one SGD step (outputs `loss`, `next_<param>`).
        loss_fn: `loss_fn(model_output, *loss_inputs)`; without it the model returns the loss.
        loss_inputs: the loss function's extra arguments, full size.
        lr: the SGD step's learning rate.
        input_names: the graph names of the model's arguments (default: `forward`'s names).
        input_placements: `{argument: layout}` (default `Replicate()`).
        output_placements: `{output: layout}`; a forward's outputs need one (Megatron's logits
            with `parallel_output=True` are `Shard(2)` of `[b, s, vocab]`).
        assume: the case's `assume:` entries, as for `capture`.
        seed: `torch.manual_seed` before each `build()`.
        name: the case's name (default: the folder's name).

    Raises:
        CaptureError: megatron-core missing, a program the tracer refused, ranks that disagree,
            or an output whose layout is not given.
    """
    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        raise CaptureError(f"capture_megatron needs megatron-core: {e}") from e
    if tp < 1:
        raise CaptureError(f"tp must be positive, not {tp}")
    data, extra = list(_as_tuple(example_inputs)), list(_as_tuple(loss_inputs))
    for t in data + extra:
        if not isinstance(t, torch.Tensor):
            raise CaptureError(f"example inputs must be tensors, not {type(t).__name__}")
    if extra and not train:
        raise CaptureError("loss_inputs is for train=True")
    assumed = _assumptions(assume)
    job = _Job(build, tp, data, extra, list(input_names) if input_names is not None else None, loss_fn,
               train, lr, seed, dict(input_placements or {}), dict(output_placements or {}))
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".capture-", dir=outdir))
    try:
        # Every program at once: most of a capture process's time is importing Megatron.
        spec, ranks = _run_children(job, tp, work, target=_child, width=tp + 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r, res in enumerate(ranks):
        for key in ("fqns", "data_names", "loss_names", "trainable"):
            if res[key] != spec[key]:
                raise CaptureError(f"rank {r} has other {key} than the spec: {res[key]} vs {spec[key]}")
    prog = Program(spec["fqns"], spec["state_names"], spec["trainable"], spec["data_names"], spec["loss_names"],
                   train, lr, loss_fn)
    return _write(outdir, name or outdir.resolve().name, prog, spec, ranks, ["tp"], [tp], assumed,
                  source="Megatron's partition attributes")
