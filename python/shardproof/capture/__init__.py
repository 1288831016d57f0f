"""`shardproof.capture`: capture a PyTorch module's single-device program and every rank's
program under a tensor-parallel plan, and derive the case file, with no case written by hand.

    import shardproof
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    cap = shardproof.capture(MLP(), (x,), mesh={"tp": 2},
                             plan={"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}, out="mlp")
    print(shardproof.verify(cap.case))

Each program is traced with make_fx over a functional step whose inputs are the module's
parameters and buffers (named after their FQNs), then the model's arguments, then the loss
function's extra arguments; `train=True` traces forward, backward and one SGD step and returns
the loss and every updated parameter. Ranks run on `torch.distributed`'s fake backend, one
process each. The case's input layouts come from the parallelized module's DTensor parameters
and from the layouts its parallel styles read the inputs with; its output expectations from the
layouts DTensor gives the outputs (updated parameters: the parameters' layouts). See
docs/python.md.
"""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ._layout import CaptureError, layout_text, parse_layout
from ._rank import Job, child_main, parse_layouts
from ._trace import Program, tensor_name

__all__ = ["capture", "Capture", "CaptureError"]


@dataclass
class Capture:
    """What `capture` wrote: the case file and the graphs it names, and the layouts it derived."""

    case: Path
    """The case file (`case.yaml`), ready for `shardproof.verify` or `shardproof verify`."""
    spec: Path
    """The single-device program's graph."""
    ranks: list[Path]
    """One graph per rank, in rank order."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Graph input name -> its layout as the case file spells it."""
    outputs: dict[str, str] = field(default_factory=dict)
    """Graph output name -> the expected layout."""
    fqns: dict[str, str] = field(default_factory=dict)
    """Graph input name -> the parameter or buffer FQN it holds."""

    def verify(self, *args: str) -> Any:
        """`shardproof.verify` on this case."""
        from .. import verify

        return verify(self.case, *args)

    def run(self, *args: str) -> Any:
        """`shardproof.run` on this case."""
        from .. import run

        return run(self.case, *args)


def _argument_names(fn: Callable[..., Any], count: int, skip: int, prefix: str) -> list[str]:
    """The names of a callable's first positional parameters after `skip` of them."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for p in params[skip:]:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    if len(names) < count:
        names += [f"{prefix}_{i}" for i in range(len(names), count)]
    return names[:count]


def _as_tuple(xs: Any) -> tuple:
    if xs is None:
        return ()
    return tuple(xs) if isinstance(xs, (tuple, list)) else (xs,)


def _run_children(
    job: Any,
    world: int,
    workdir: Path,
    target: Callable[[Any, int | None, str], None] | None = None,
    width: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The spec and every rank, each in a forked process running `target(job, rank, path)`
    (`child_main` by default), at most `width` at once (the CPU count by default); their
    results in order."""
    ctx = multiprocessing.get_context("fork")
    target = target or child_main
    jobs: list[tuple[int | None, Path]] = [(None, workdir / "spec.json")]
    jobs += [(r, workdir / f"r{r}.json") for r in range(world)]
    running: list[tuple[Any, int | None, Path]] = []
    width = max(1, min(len(jobs), width or os.cpu_count() or 1))
    pending = list(jobs)
    results: dict[int | None, dict[str, Any]] = {}

    def reap(entry: tuple[Any, int | None, Path]) -> None:
        proc, what, path = entry
        proc.join()
        who = "the spec" if what is None else f"rank {what}"
        if not path.exists():
            raise CaptureError(f"capturing {who} ended without a result (exit code {proc.exitcode})")
        payload = json.loads(path.read_text())
        if "error" in payload:
            detail = payload.get("traceback", "") if os.environ.get("SHARDPROOF_CAPTURE_DEBUG") else ""
            raise CaptureError(f"capturing {who}: {payload['error']}\n{detail}".rstrip())
        results[what] = payload["ok"]

    try:
        while pending or running:
            while pending and len(running) < width:
                what, path = pending.pop(0)
                proc = ctx.Process(target=target, args=(job, what, str(path)))
                proc.start()
                running.append((proc, what, path))
            reap(running.pop(0))
    finally:
        for proc, _, _ in running:
            proc.kill()
            proc.join()
    return results[None], [results[r] for r in range(world)]


def capture(
    model: torch.nn.Module | Callable[[], torch.nn.Module],
    example_inputs: Any,
    *,
    mesh: Mapping[str, int],
    plan: Any,
    out: str | os.PathLike[str] | None = None,
    train: bool = False,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    loss_inputs: Any = (),
    lr: float = 0.1,
    input_names: Sequence[str] | None = None,
    input_placements: Mapping[str, Any] | None = None,
    output_placements: Mapping[str, Any] | None = None,
    loss_parallel: bool = False,
    assume: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Capture:
    """Capture the spec and every rank's program and write them with a derived case to `out`.

    Args:
        model: the single-device module, or a function that builds it.
        example_inputs: the model's positional arguments (a tensor or a tuple), full size.
        mesh: named mesh dims to sizes, outermost first (`{"dp": 2, "tp": 2}`).
        plan: a `parallelize_module` plan (`{"fc1": ColwiseParallel(), ...}`); on a mesh of
            several dims, `{mesh dim: plan}`; or a callable `(module, mesh) -> module` that
            parallelizes it any way DTensor allows.
        out: the folder to write `spec.py`, `r0.py`.. and `case.yaml` into (default: the
            folder `shardproof capture SCRIPT --out DIR` gives in SHARDPROOF_CAPTURE_OUT).
        train: trace forward, backward and one SGD step (outputs: `loss`, `next_<param>`).
        loss_fn: `loss_fn(model_output, *loss_inputs)`; without it the model returns the loss.
        loss_inputs: the loss function's extra arguments (targets), full size.
        lr: the SGD step's learning rate.
        input_names: the graph names of the model's arguments (default: `forward`'s names).
        input_placements: `{argument: layout}` overriding what the plan implies (default:
            the layout the plan's styles read the argument with, else `Replicate()`).
        output_placements: `{output: layout}` for outputs whose layout DTensor does not tell.
        loss_parallel: compute the loss under `torch.distributed.tensor.parallel.loss_parallel`.
        assume: the case's `assume:` entries, assumptions the user accepts and the verdict
            then depends on (`{"ignore-index": "unused"}`: no target equals the loss's
            `ignore_index`, which `verify` needs to relate a mean cross-entropy). Never
            added on the user's behalf.
        name: the case's name (default: the folder's name).

    Returns:
        a `Capture` naming the files, with the derived layouts.

    Raises:
        CaptureError: arguments that do not fit, a program the tracer refused, or an output
            whose layout cannot be derived (then `output_placements` names it).
    """
    if not isinstance(model, torch.nn.Module):
        model = model()
    if not isinstance(model, torch.nn.Module):
        raise CaptureError("model must be an nn.Module or a function returning one")
    if not mesh:
        raise CaptureError("mesh must name at least one dim, e.g. {'tp': 2}")
    mesh_dims, mesh_sizes = [str(d) for d in mesh], [int(s) for s in mesh.values()]
    if any(s < 1 for s in mesh_sizes):
        raise CaptureError(f"mesh sizes must be positive: {dict(mesh)}")
    data, extra = _as_tuple(example_inputs), _as_tuple(loss_inputs)
    for t in data + extra:
        if not isinstance(t, torch.Tensor):
            raise CaptureError(f"example inputs must be tensors, not {type(t).__name__}")
    if extra and not train:
        raise CaptureError("loss_inputs is for train=True")
    assumed = _assumptions(assume)

    taken: set[str] = set()
    params = [(f, p) for f, p in model.named_parameters()]
    buffers = [(f, b) for f, b in model.named_buffers()]
    state_fqns = [f for f, _ in params] + [f for f, _ in buffers]
    state_names = [tensor_name(f, taken) for f in state_fqns]
    trainable = [p.requires_grad for _, p in params] + [False] * len(buffers)
    arg_names = list(input_names) if input_names is not None else _argument_names(model.forward, len(data), 0, "input")
    if len(arg_names) != len(data):
        raise CaptureError(f"{len(arg_names)} input names for {len(data)} inputs")
    data_names = [tensor_name(n, taken) for n in arg_names]
    loss_arg = _argument_names(loss_fn, len(extra), 1, "target") if loss_fn is not None else [f"target_{i}" for i in range(len(extra))]
    loss_names = [tensor_name(n, taken) for n in loss_arg]
    rename = {a: n for a, n in zip(arg_names + loss_arg, data_names + loss_names)}

    prog = Program(state_fqns, state_names, trainable, data_names, loss_names, train, lr, loss_fn)
    job = Job(
        module=model,
        plan=plan,
        mesh_dims=mesh_dims,
        mesh_sizes=mesh_sizes,
        prog=prog,
        data=list(data),
        loss_inputs=list(extra),
        input_layouts=parse_layouts(input_placements, mesh_dims, lambda k: rename.get(k, k)),
        output_layouts={k: parse_layout(v, mesh_dims) for k, v in (output_placements or {}).items()},
        loss_parallel=loss_parallel,
    )
    world = 1
    for s in mesh_sizes:
        world *= s

    if out is None:
        out = os.environ.get("SHARDPROOF_CAPTURE_OUT")
        if not out:
            raise CaptureError("give `out`, the folder to write the case into (or run under `shardproof capture`)")
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".capture-", dir=outdir))
    try:
        spec, ranks = _run_children(job, world, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _write(outdir, name or outdir.resolve().name, prog, spec, ranks, mesh_dims, mesh_sizes, assumed)


def _assumptions(assume: Mapping[str, str] | None) -> dict[str, str]:
    """The `assume:` entries as the case writes them; keys and values are plain words."""
    out: dict[str, str] = {}
    for k, v in (assume or {}).items():
        k, v = str(k), str(v)
        for word in (k, v):
            if not word or not all(c.isalnum() or c in "-_" for c in word):
                raise CaptureError(f"assume: {k!r}: {v!r} is not a case assumption (plain words, e.g. "
                                   "{'ignore-index': 'unused'})")
        out[k] = v
    return out


def _write(outdir: Path, name: str, prog: Program, spec: dict[str, Any], ranks: list[dict[str, Any]],
           dims: list[str], sizes: list[int], assume: dict[str, str], source: str = "the DTensor plan") -> Capture:
    """Writes the graphs and the case; checks the ranks agree on every derived layout.
    `source` names where the layouts come from (the DTensor plan, Megatron's attributes)."""
    first = ranks[0]
    for r, res in enumerate(ranks):
        if res["outputs"] != spec["outputs"]:
            raise CaptureError(f"rank {r} returns {res['outputs']} but the spec returns {spec['outputs']}")
        for key in ("state_layouts", "input_layouts", "output_layouts"):
            if res[key] != first[key]:
                raise CaptureError(f"rank {r} derives other layouts than rank 0 ({key}): {res[key]} vs {first[key]}")
    unknown = [n for n, l in first["output_layouts"].items() if l is None]
    if unknown:
        raise CaptureError(
            f"the layout of output(s) {unknown} cannot be derived (a plain tensor no parallel style "
            "returned); pass output_placements={" + ", ".join(f"'{n}': ..." for n in unknown) + "}"
        )
    from ._layout import parse_placement

    def text(layout: list[str]) -> str:
        return layout_text(tuple(parse_placement(p) for p in layout), dims)

    spec_path = outdir / "spec.py"
    spec_path.write_text(spec["text"])
    rank_paths = []
    for r, res in enumerate(ranks):
        p = outdir / f"r{r}.py"
        p.write_text(res["text"])
        rank_paths.append(p)
    groups: dict[str, Any] = {}
    for res in ranks:
        groups.update(res["groups"])

    inputs: dict[str, str] = {}
    comments: dict[str, str] = {}
    for fqn, n, lay in zip(prog.state_fqns, prog.state_names, first["state_layouts"]):
        inputs[n] = text(lay)
        comments[n] = f"{fqn}, from {'its DTensor' if source == 'the DTensor plan' else source}" if lay != ["Replicate()"] * len(dims) else f"{fqn}"
    why = {"given": "as given", "plan": "as the plan reads it", "default": "not read by the plan: given whole"}
    for n in prog.data_names + prog.loss_names:
        inputs[n] = text(first["input_layouts"][n])
        comments[n] = f"argument, {why[first['input_sources'][n]]}"
    outputs = {n: text(first["output_layouts"][n]) for n in spec["outputs"]}

    lines = [
        f"# Written by shardproof.capture: the layouts are derived from {source}.",
        "version: 1",
        f"name: {json.dumps(name)}",
        "spec:",
        "  graph: spec.py",
        "impl:",
        "  mesh: { " + ", ".join(f"{d}: {s}" for d, s in zip(dims, sizes)) + " }",
        "  graphs: [" + ", ".join(p.name for p in rank_paths) + "]",
    ]
    if groups:
        lines.append("  groups:")
        for g, v in groups.items():
            value = v if isinstance(v, str) else json.dumps([v])
            lines.append(f"    {json.dumps(g)}: {value}")
    lines.append("inputs:")
    for n, lay in inputs.items():
        lines.append(f"  {n}: {lay}  # {comments[n]}")
    lines.append("outputs:")
    for n, lay in outputs.items():
        lines.append(f"  {n}: {lay}")
    if assume:
        lines.append("assume:  # as given to capture: the verdict holds under these")
        for k, v in assume.items():
            lines.append(f"  {k}: {v}")
    case_path = outdir / "case.yaml"
    case_path.write_text("\n".join(lines) + "\n")
    fqns = dict(zip(prog.state_names, prog.state_fqns))
    return Capture(case_path, spec_path, rank_paths, inputs, outputs, fqns)


class _CallableModule(type(os)):
    """Lets `shardproof.capture(...)` call `capture` while `shardproof.capture.Capture` and the
    other names of this package stay reachable: the package and the function share one name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Capture:
        return capture(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
