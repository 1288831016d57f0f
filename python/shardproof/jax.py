"""`shardproof.jax`: capture a JAX function's single-device program and its SPMD-partitioned
per-device programs as XLA HLO text, and derive the case from its `NamedSharding`s.

    import os; os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, numpy as np, shardproof.jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    sh = lambda *s: NamedSharding(mesh, P(*s))
    cap = shardproof.jax.capture(mlp, (x, w1, w2), in_shardings=(sh(), sh(None, "tp"), sh("tp")),
                                 out_shardings=sh(), out="mlp-tp2")
    print(cap.verify())

The spec is `jax.jit(fn).lower(*args).as_text(dialect="hlo", debug_info=True)`; each device's
program is `jax.jit(impl, in_shardings=..., out_shardings=...).lower(*args).compile().as_text()`,
written once per device as `NAME.devK.hlo` (the importer reads the device id from the name).
`impl` defaults to `fn`; a `shard_map` program is passed as `impl` with `fn` its single-device
meaning. Input layouts come from the compiled program's input shardings, output expectations
from its output shardings; the process groups from the mesh (every set of mesh axes). Inputs are
`arg0`, `arg1`, ... in the order of the flattened arguments, as the importer names entry
parameters; both programs keep unused arguments so the numbering agrees. Needs `jax` (CPU is
enough); importing `shardproof` does not import it. See docs/python.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["capture", "JaxCapture", "JaxCaptureError", "placement"]


class JaxCaptureError(ValueError):
    """The function, its arguments or its shardings cannot be captured as a case."""


@dataclass
class JaxCapture:
    """What `capture` wrote: the case file, the HLO programs it names, the layouts it derived."""

    case: Path
    """The case file (`case.yaml`), ready for `shardproof.verify` or `shardproof verify`."""
    spec: Path
    """The single-device program (`spec.hlo`)."""
    ranks: list[Path]
    """One per-device program per rank (`impl.devK.hlo`), in rank order."""
    mesh: dict[str, int] = field(default_factory=dict)
    """Mesh axis -> size, in the mesh's order (rank K is the mesh's K-th device, row-major)."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Graph input name -> its layout as the case file spells it."""
    outputs: dict[str, str] = field(default_factory=dict)
    """Graph output name -> the expected layout."""
    paths: dict[str, str] = field(default_factory=dict)
    """Graph input name -> the argument's pytree path (`[0]`, `[1]['w']`)."""

    def verify(self, *args: str) -> Any:
        """`shardproof.verify` on this case."""
        from . import verify

        return verify(self.case, *args)

    def run(self, *args: str) -> Any:
        """`shardproof.run` on this case."""
        from . import run

        return run(self.case, *args)


def placement(sharding: Any, ndim: int, axes: Sequence[str]) -> str:
    """A sharding's layout as the case file spells it: `Replicate()`, `Shard(d)` on a 1-d mesh,
    one placement per mesh axis (`[Shard(0), Replicate()]`) on an N-d mesh.

    A tensor dim split over several axes (`P(("dp", "tp"))`) is `Shard(d)` on each, which
    means the same split only when the axes are in the mesh's order; another order, an axis
    that splits two dims, and shardings that are neither named nor fully replicated are errors
    rather than guesses.
    """
    per_axis = {a: "Replicate()" for a in axes}
    if getattr(sharding, "is_fully_replicated", False):
        return _spell(per_axis, axes)
    spec = getattr(sharding, "spec", None)
    if spec is None:
        raise JaxCaptureError(f"sharding {sharding!r} is not a NamedSharding; pass NamedShardings")
    for d, entry in enumerate(tuple(spec)[:ndim]):
        if entry is None:
            continue
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        order = [axes.index(n) for n in names if n in axes]
        if len(order) != len(names) or order != sorted(order):
            raise JaxCaptureError(
                f"sharding {spec} splits dim {d} over {names}, not axes of the mesh {tuple(axes)} "
                "in mesh order"
            )
        for n in names:
            if per_axis[n] != "Replicate()":
                raise JaxCaptureError(f"sharding {spec} uses mesh axis {n!r} twice")
            per_axis[n] = f"Shard({d})"
    return _spell(per_axis, axes)


def _spell(per_axis: dict[str, str], axes: Sequence[str]) -> str:
    if len(axes) == 1:
        return per_axis[axes[0]]
    return "[" + ", ".join(per_axis[a] for a in axes) + "]"


def groups(mesh_shape: dict[str, int]) -> dict[str, list[list[int]]]:
    """The process groups of every non-empty set of mesh axes, named as the HLO importer names
    a collective's `replica_groups` (`hlo{{0,1},{2,3}}`: each list sorted, lists by first
    member). A group no collective names is never read, so declaring all of them is harmless."""
    axes = list(mesh_shape)
    sizes = [mesh_shape[a] for a in axes]
    ranks = list(itertools.product(*[range(s) for s in sizes]))

    def rank_of(coord: tuple[int, ...]) -> int:
        r = 0
        for c, s in zip(coord, sizes):
            r = r * s + c
        return r

    out: dict[str, list[list[int]]] = {}
    for k in range(1, len(axes) + 1):
        for chosen in itertools.combinations(range(len(axes)), k):
            buckets: dict[tuple[int, ...], list[int]] = {}
            for coord in ranks:
                key = tuple(c for i, c in enumerate(coord) if i not in chosen)
                buckets.setdefault(key, []).append(rank_of(coord))
            lists = sorted(sorted(b) for b in buckets.values())
            name = "hlo{" + ",".join("{" + ",".join(map(str, b)) + "}" for b in lists) + "}"
            out[name] = lists
    return out


def _mesh_of(shardings: Sequence[Any]) -> Any:
    meshes = []
    for s in shardings:
        m = getattr(s, "mesh", None)
        if m is not None and all(m is not x for x in meshes):
            meshes.append(m)
    if not meshes:
        raise JaxCaptureError("no NamedSharding names a mesh: pass in_shardings over a jax.sharding.Mesh")
    first = meshes[0]
    for m in meshes[1:]:
        if m.shape != first.shape or list(m.devices.flat) != list(first.devices.flat):
            raise JaxCaptureError("the shardings name different meshes")
    return first


def _stated(jax: Any, shardings: Any, count: int) -> Optional[list[Any]]:
    """The shardings the user stated, one per leaf, where they are that many; else `None` and
    the compiled program's are used (a `shard_map` compiled under `in_shardings=None` reports
    positional shardings, which carry no axis names)."""
    if shardings is None:
        return None
    is_sharding = lambda x: isinstance(x, jax.sharding.Sharding)  # noqa: E731
    leaves = jax.tree_util.tree_leaves(shardings, is_leaf=is_sharding)
    if count > 1 and len(leaves) == 1:
        leaves = leaves * count
    return leaves if len(leaves) == count and all(map(is_sharding, leaves)) else None


def capture(
    fn: Callable[..., Any],
    example_args: Sequence[Any],
    *,
    in_shardings: Any,
    out: "str | Path",
    out_shardings: Any = None,
    impl: Optional[Callable[..., Any]] = None,
    name: Optional[str] = None,
) -> JaxCapture:
    """Write `out/spec.hlo`, `out/impl.devK.hlo` for every device of the mesh and
    `out/case.yaml`; return their paths and the derived layouts.

    `fn` is the single-device program; `impl` (default `fn`) is jitted with `in_shardings` and
    `out_shardings` (as `jax.jit` takes them) and compiled for the mesh's devices, which must be
    host devices of this process (`--xla_force_host_platform_device_count=N` before importing
    jax). Functions may be jitted already.
    """
    import jax

    impl_fn = fn if impl is None else impl
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = tuple(example_args)
    spec_fn = fn

    spec_text = jax.jit(spec_fn, keep_unused=True).lower(*args).as_text(dialect="hlo", debug_info=True)
    sharded = jax.jit(impl_fn, in_shardings=in_shardings, out_shardings=out_shardings, keep_unused=True)
    compiled = sharded.lower(*args).compile()
    impl_text = compiled.as_text()

    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(args)
    in_sh = _stated(jax, in_shardings, len(leaves_with_paths)) or jax.tree_util.tree_leaves(
        compiled.input_shardings[0]
    )
    out_sh = jax.tree_util.tree_leaves(compiled.output_shardings)
    out_leaves = jax.tree_util.tree_leaves(jax.eval_shape(spec_fn, *args))
    out_sh = _stated(jax, out_shardings, len(out_leaves)) or out_sh
    if len(in_sh) != len(leaves_with_paths):
        raise JaxCaptureError(
            f"{len(leaves_with_paths)} argument leaves but {len(in_sh)} input shardings"
        )
    if len(out_sh) != len(out_leaves):
        raise JaxCaptureError(f"{len(out_leaves)} outputs but {len(out_sh)} output shardings")
    mesh = _mesh_of(list(in_sh) + list(out_sh))
    axes = [str(a) for a in mesh.axis_names]
    mesh_shape = {a: int(mesh.shape[a]) for a in axes}
    # XLA numbers partitions row-major over the mesh the shardings name, as the case numbers
    # ranks, so device K's program is rank K's.
    devices = list(mesh.devices.flat)
    inputs: dict[str, str] = {}
    paths: dict[str, str] = {}
    for i, ((path, leaf), s) in enumerate(zip(leaves_with_paths, in_sh)):
        inputs[f"arg{i}"] = placement(s, len(getattr(leaf, "shape", ())), axes)
        paths[f"arg{i}"] = jax.tree_util.keystr(path)
    outputs = {
        f"out{i}": placement(s, len(getattr(o, "shape", ())), axes)
        for i, (s, o) in enumerate(zip(out_sh, out_leaves))
    }

    spec_path = out_dir / "spec.hlo"
    spec_path.write_text(spec_text if spec_text.endswith("\n") else spec_text + "\n")
    ranks = []
    for k in range(len(devices)):
        p = out_dir / f"impl.dev{k}.hlo"
        p.write_text(impl_text if impl_text.endswith("\n") else impl_text + "\n")
        ranks.append(p)

    label = name or f"jax-{getattr(spec_fn, '__name__', 'program')}"
    lines = [
        "version: 1",
        f"name: {label}",
        "# Written by shardproof.jax.capture: the single-device program (jit(fn).lower().as_text)",
        "# against the SPMD-partitioned per-device programs (compile().as_text()).",
        "spec:",
        "  graph: spec.hlo",
        "impl:",
        "  mesh: { " + ", ".join(f"{a}: {n}" for a, n in mesh_shape.items()) + " }",
        "  graphs: [" + ", ".join(p.name for p in ranks) + "]",
        "  groups:",
    ]
    for g, lists in groups(mesh_shape).items():
        lines.append(f'    "{g}": {lists}')
    lines.append("inputs:")
    for n, layout in inputs.items():
        lines.append(f"  {n}: {layout}   # {paths[n]}")
    lines.append("outputs:")
    for n, layout in outputs.items():
        lines.append(f"  {n}: {layout}")
    case = out_dir / "case.yaml"
    case.write_text("\n".join(lines) + "\n")
    return JaxCapture(case=case, spec=spec_path, ranks=ranks, mesh=mesh_shape, inputs=inputs,
                      outputs=outputs, paths=paths)
