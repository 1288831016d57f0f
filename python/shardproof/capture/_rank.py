"""One program's capture, run in a process of its own: the spec, or one rank on the fake backend.

Why a process per rank: DTensor caches sharding decisions (offsets included) per process, so a
rank captured after another in the same process is handed the first rank's offsets. A forked
child starts with the parent's module and plan (no pickling), initializes the fake process group
as its rank, parallelizes its own copy of the module and writes its graph and what it learned
(layouts, groups, output names) as JSON for the parent.
"""

from __future__ import annotations

import copy
import json
import logging
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from ._layout import CaptureError, Layout, local_piece, normalize_dim, parse_layout
from ._trace import Program, collective_groups, graph_text, trace

log = logging.getLogger("shardproof.capture")


@dataclass
class Job:
    """Everything a capture process needs; inherited by fork, never pickled."""

    module: torch.nn.Module
    plan: Any  # dict FQN -> ParallelStyle, {mesh dim: such a dict}, or callable(module, mesh)
    mesh_dims: list[str]
    mesh_sizes: list[int]
    prog: Program
    data: list[torch.Tensor]
    loss_inputs: list[torch.Tensor]
    input_layouts: dict[str, Layout]  # the user's, by graph name (data and loss inputs)
    output_layouts: dict[str, Layout]  # the user's, by output name
    loss_parallel: bool


def _value_layout(dt: Any, dims: Sequence[str], varying: Sequence[str]) -> Layout | None:
    """The layout of a value computed from the inputs (an output, not a parameter): on a
    sub-mesh's DTensor, a mesh dim outside the sub-mesh along which some input varies (a batch
    sharded over dp) leaves the value's layout there unknown (None); one along which nothing
    varies is Replicate() (every rank along it runs the same program on the same inputs)."""
    sub = dt.device_mesh.mesh_dim_names or tuple(dims)
    if any(d in varying and d not in sub for d in dims):
        return None
    return _spec_layout(dt, dims)


def _spec_layout(dt: Any, dims: Sequence[str]) -> Layout:
    """A DTensor's placements over the whole mesh: its own mesh may be a named sub-mesh."""
    from torch.distributed.tensor import Replicate

    sub = dt.device_mesh.mesh_dim_names
    if sub is None:
        if dt.device_mesh.ndim != len(dims):
            raise CaptureError("a DTensor lives on an unnamed sub-mesh; name the mesh dims")
        sub = tuple(dims)
    full = {d: Replicate() for d in dims}
    for d, p in zip(sub, dt.placements):
        if d not in full:
            raise CaptureError(f"a DTensor's mesh dim `{d}` is not a dim of the mesh {list(dims)}")
        full[d] = p
    return normalize_dim(tuple(full[d] for d in dims), dt.dim())


class Seen:
    """Layouts recorded for plain tensors, by identity. The tensor itself is kept alive with
    its layout: an id freed and reused by another tensor must not inherit a layout."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[torch.Tensor, Layout]] = {}

    def add(self, t: torch.Tensor, layout: Layout, first: bool = False) -> None:
        if first and id(t) in self._by_id and self._by_id[id(t)][0] is t:
            return
        self._by_id[id(t)] = (t, layout)

    def get(self, t: Any) -> Layout | None:
        entry = self._by_id.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None


@contextmanager
def _recording(job: Job, seen_from: Seen, seen_to: Seen, varying: Sequence[str] = ()) -> Iterator[None]:
    """Records the layout DTensor gives a plain tensor it wraps (`from_local`: how a parallel
    style reads a module input) and the layout of a plain tensor it unwraps (`to_local`: how a
    style hands back its output)."""
    from torch.distributed.tensor import DTensor

    from_local, to_local = DTensor.from_local, DTensor.to_local

    def rec_from(local_tensor, device_mesh=None, placements=None, **kw):
        out = from_local(local_tensor, device_mesh, placements, **kw)
        try:
            seen_from.add(local_tensor, _spec_layout(out, job.mesh_dims), first=True)
        except CaptureError:
            pass
        return out

    def rec_to(self, *a, **kw):
        out = to_local(self, *a, **kw)
        layout = _value_layout(self, job.mesh_dims, varying)
        if layout is not None:
            seen_to.add(out, layout)
        return out

    DTensor.from_local = staticmethod(rec_from)
    DTensor.to_local = rec_to
    try:
        yield
    finally:
        DTensor.from_local = staticmethod(from_local)
        DTensor.to_local = to_local


def _parallelize(job: Job, module: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    plan = job.plan
    if plan is None:
        return module
    if callable(plan):
        out = plan(module, mesh)
        return module if out is None else out
    if not isinstance(plan, Mapping):
        raise CaptureError(f"plan must be a dict or a callable(module, mesh), not {type(plan).__name__}")
    if len(job.mesh_dims) == 1 and not any(k in job.mesh_dims and isinstance(v, Mapping) for k, v in plan.items()):
        return parallelize_module(module, mesh, dict(plan))
    for dim, sub in plan.items():
        if dim not in job.mesh_dims or not isinstance(sub, Mapping):
            raise CaptureError(
                f"on the mesh {job.mesh_dims} the plan maps each mesh dim to its own plan "
                f"({{'tp': {{'fc1': ColwiseParallel(), ...}}}}); key `{dim}` is not one"
            )
        module = parallelize_module(module, mesh[dim], dict(sub))
    return module


def _state(module: torch.nn.Module, fqns: Sequence[str]) -> list[Any]:
    found = dict(module.named_parameters(remove_duplicate=False))
    found.update(dict(module.named_buffers(remove_duplicate=False)))
    missing = [f for f in fqns if f not in found]
    if missing:
        raise CaptureError(f"the parallelized module lost state {missing}; the plan must keep every FQN")
    return [found[f] for f in fqns]


def capture_spec(job: Job) -> dict[str, Any]:
    """The single-device program: the user's module as given, no mesh."""
    prog = copy.copy(job.prog)
    state = _state(job.module, prog.state_fqns)

    def finish(name: str, v: Any) -> torch.Tensor:
        return v

    gm = trace(job.module, prog, [t.detach() for t in state], job.data, job.loss_inputs, lambda i, t: t, finish)
    return {"text": graph_text(gm), "outputs": prog.output_names}


def capture_rank(job: Job, rank: int) -> dict[str, Any]:
    """Rank `rank`'s program on the fake backend, and the layouts it implies."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = 1
    for s in job.mesh_sizes:
        world *= s
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", tuple(job.mesh_sizes), mesh_dim_names=tuple(job.mesh_dims))
        module = _parallelize(job, copy.deepcopy(job.module), mesh)
        prog = copy.copy(job.prog)
        held = _state(module, prog.state_fqns)
        replicated = tuple(Replicate() for _ in job.mesh_dims)
        state_layouts, local_state, metas = [], [], []
        for t in held:
            if isinstance(t, DTensor):
                state_layouts.append(_spec_layout(t, job.mesh_dims))
                local_state.append(t.to_local().detach())
                metas.append((t.device_mesh, t.placements, t.shape, t.stride()))
            else:
                state_layouts.append(replicated)
                local_state.append(t.detach())
                metas.append(None)

        # A dry run on the full inputs shows the layout each parallel style reads an input with.
        data_names = list(prog.data_names)
        seen_from, seen_to = Seen(), Seen()
        with _recording(job, seen_from, seen_to), torch.no_grad():
            try:
                module(*job.data)
            except Exception as e:  # a sharded input fed in full may not fit; layouts so far stay
                log.debug("dry run stopped: %s", e)
        layouts: dict[str, Layout] = {}
        sources: dict[str, str] = {}
        for name, t in zip(data_names, job.data):
            if name in job.input_layouts:
                layouts[name], sources[name] = job.input_layouts[name], "given"
            elif seen_from.get(t) is not None:
                layouts[name], sources[name] = normalize_dim(seen_from.get(t), t.dim()), "plan"
            else:
                layouts[name], sources[name] = replicated, "default"
        for name in prog.loss_names:
            layouts[name] = job.input_layouts.get(name, replicated)
            sources[name] = "given" if name in job.input_layouts else "default"
        local_data = [
            local_piece(t, layouts[n], job.mesh_sizes, rank, n) for n, t in zip(data_names, job.data)
        ]
        local_loss = [
            local_piece(t, layouts[n], job.mesh_sizes, rank, n)
            for n, t in zip(prog.loss_names, job.loss_inputs)
        ]

        def wrap(i: int, t: torch.Tensor) -> Any:
            meta = metas[i]
            if meta is None:
                return t
            m, placements, shape, stride = meta
            return DTensor.from_local(t, m, placements, run_check=False, shape=shape, stride=stride)

        out_layouts: dict[str, Any] = {}
        by_next = {f"next_{n}": lay for n, lay in zip(prog.state_names, state_layouts)}

        # The mesh dims along which some input differs between ranks.
        varying = [
            d for i, d in enumerate(job.mesh_dims)
            if any(not isinstance(l[i], Replicate) for l in list(layouts.values()) + state_layouts)
        ]

        def finish(name: str, v: Any) -> torch.Tensor:
            if isinstance(v, DTensor):
                out_layouts[name] = _value_layout(v, job.mesh_dims, varying)
                return v.to_local()
            if name in by_next:
                out_layouts[name] = by_next[name]
            elif name == "loss":
                # A plain loss: what a training loop reads on every rank, so it must be whole.
                out_layouts[name] = replicated
            elif seen_to.get(v) is not None:
                out_layouts[name] = seen_to.get(v)
            else:
                out_layouts[name] = None
            return v

        loss_ctx = _loss_parallel_ctx if job.loss_parallel else None
        seen_to = Seen()
        with _recording(job, Seen(), seen_to, varying):
            kwargs = {"loss_ctx": loss_ctx} if loss_ctx else {}
            gm = trace(module, prog, local_state, local_data, local_loss, wrap, finish, **kwargs)

        groups: dict[str, Any] = {}
        for i, d in enumerate(job.mesh_dims):
            groups[mesh.get_group(i).group_name] = d
        used = {}
        for g in collective_groups(gm):
            if g in groups:
                used[g] = groups[g]
            else:
                from torch.distributed.distributed_c10d import _resolve_process_group

                used[g] = sorted(dist.get_process_group_ranks(_resolve_process_group(g)))
        for name in prog.output_names:
            if name in job.output_layouts:
                out_layouts[name] = job.output_layouts[name]
        return {
            "text": graph_text(gm),
            "outputs": prog.output_names,
            "state_layouts": [_dump(l) for l in state_layouts],
            "input_layouts": {n: _dump(l) for n, l in layouts.items()},
            "input_sources": sources,
            "output_layouts": {n: (None if l is None else _dump(l)) for n, l in out_layouts.items()},
            "groups": used,
        }
    finally:
        dist.destroy_process_group()


def _loss_parallel_ctx():
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _dump(layout: Layout) -> list[str]:
    from ._layout import placement_text

    return [placement_text(p) for p in layout]


def child_main(job: Job, what: int | None, result_path: str) -> None:
    """The body of a capture process: writes `{"ok": ...}` or `{"error": ...}` to `result_path`."""
    torch.set_num_threads(1)
    try:
        result = capture_spec(job) if what is None else capture_rank(job, what)
        payload: dict[str, Any] = {"ok": result}
    except CaptureError as e:
        payload = {"error": str(e), "traceback": traceback.format_exc()}
    except Exception as e:
        payload = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    with open(result_path, "w") as f:
        json.dump(payload, f)


def parse_layouts(values: Mapping[str, Any] | None, mesh_dims: Sequence[str], rename: Callable[[str], str]) -> dict[str, Layout]:
    """The user's `{name: layout}` map, keyed by graph name."""
    return {rename(k): parse_layout(v, mesh_dims) for k, v in (values or {}).items()}
