"""Shared helpers of the PyTorch-oracle capture: seeded inputs, module wrapping, graph text."""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Callable, Iterable

import torch

F64 = torch.float64
F32 = torch.float32
I64 = torch.int64


class Gen:
    """Seeded input factory: one generator per case, seeded from the case name.

    Seeding per case (not globally) keeps every case's inputs stable when cases are added,
    removed or reordered.
    """

    def __init__(self, key: str):
        self.g = torch.Generator().manual_seed(zlib.crc32(key.encode()))

    def randn(self, *shape: int, dtype: torch.dtype = F64) -> torch.Tensor:
        return torch.randn(shape, generator=self.g, dtype=F64).to(dtype)

    def uniform(self, lo: float, hi: float, *shape: int, dtype: torch.dtype = F64) -> torch.Tensor:
        return (torch.rand(shape, generator=self.g, dtype=F64) * (hi - lo) + lo).to(dtype)

    def ints(self, lo: int, hi: int, *shape: int, dtype: torch.dtype = I64) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=self.g, dtype=I64).to(dtype)

    def bools(self, *shape: int, p: float = 0.5) -> torch.Tensor:
        return torch.rand(*shape, generator=self.g, dtype=F64) < p

    def perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.g)

    def rounded(self, *shape: int, dtype: torch.dtype = F64) -> torch.Tensor:
        """Small integers as floats: comparisons and sorts then see ties and exact values."""
        return torch.randint(-3, 4, shape, generator=self.g, dtype=I64).to(dtype)


def make_module(fn: Callable[..., Any], names: list[str]) -> torch.nn.Module:
    """A module whose `forward` takes the named arguments and calls `fn` on them, so that
    torch.export names the graph's placeholders after `names`."""
    params = ", ".join(names)
    src = f"def forward(self, {params}):\n    return _fn({params})\n"
    ns: dict[str, Any] = {"_fn": fn}
    exec(compile(src, "<oracle-case>", "exec"), ns)
    return type("OracleCase", (torch.nn.Module,), {"forward": ns["forward"]})()


def op_names(gm: torch.fx.GraphModule) -> tuple[list[str], list[str]]:
    """The operator overloads called by a graph (`aten.mm.default`), and any other call targets
    (python builtins such as `operator.getitem`), both sorted and unique."""
    ops, other = set(), set()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if isinstance(n.target, torch._ops.OpOverload):
            ops.add(str(n.target))
        else:
            name = getattr(n.target, "__name__", str(n.target))
            mod = getattr(n.target, "__module__", None) or ""
            other.add(f"{mod}.{name}" if mod else name)
    return sorted(ops), sorted(other)


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The readable graph text, with a trailing newline."""
    text = gm.print_readable(print_output=False)
    return text if text.endswith("\n") else text + "\n"


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    flat: list[torch.Tensor] = []
    for o in out:
        flat.extend(flatten_outputs(o))
    return flat


def dtype_name(dt: torch.dtype) -> str:
    """The short name torch.fx prints for a dtype (`f64`, `b8`, ...)."""
    return {
        torch.float64: "f64",
        torch.float32: "f32",
        torch.float16: "f16",
        torch.bfloat16: "bf16",
        torch.int64: "i64",
        torch.int32: "i32",
        torch.int16: "i16",
        torch.int8: "i8",
        torch.uint8: "u8",
        torch.bool: "b8",
    }[dt]


def _render(obj: Any, indent: int) -> str:
    """JSON with one key per line, but lists and dicts of scalars kept on one line."""
    pad, inner = " " * indent, " " * (indent + 2)
    flat = json.dumps(obj)
    if not isinstance(obj, (list, dict)):
        return flat
    if len(flat) <= 100 and (
        all(not isinstance(v, (list, dict)) for v in (obj.values() if isinstance(obj, dict) else obj))
        or len(flat) <= 60
    ):
        return flat
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {_render(v, indent + 2)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [f"{inner}{_render(v, indent + 2)}" for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        f.write(_render(obj, 0) + "\n")


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def save_tensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().clone().contiguous() for k, v in tensors.items()}, path)


def unique(xs: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for x in xs:
        if x not in seen:
            seen.append(x)
    return seen
