"""shardproof from Python: capture a parallelized PyTorch module, then verify it.

    import shardproof
    cap = shardproof.capture(model, (x,), mesh={"tp": 2}, plan=plan, out="case-dir")
    result = shardproof.verify(cap.case)      # a Result: verdict, exit code, report, location

`verify`, `run`, `check`, `prove` and `inspect` are the command line's commands on a case file
(see `shardproof._engine`); `capture` (needs torch) writes the graphs and the case. The trace
collector `shardproof.trace` is a package of its own. Importing `shardproof` imports no torch.
"""

from __future__ import annotations

import os
from typing import Any

from ._engine import EngineUnavailable, Location, Result, engine

__version__ = "0.1.0"

__all__ = [
    "capture",
    "verify",
    "run",
    "check",
    "prove",
    "inspect",
    "Result",
    "Location",
    "EngineUnavailable",
]


def verify(case: "os.PathLike[str] | str", *args: str) -> Result:
    """Refinement (`shardproof verify`): a certificate rebuilding every output, or where it stops."""
    return engine("verify", case, *args)


def run(case: "os.PathLike[str] | str", *args: str) -> Result:
    """Numerical differential check (`shardproof run`) on seeded random inputs."""
    return engine("run", case, *args)


def check(case: "os.PathLike[str] | str", *args: str) -> Result:
    """Static check (`shardproof check`): placements, SPMD types, collectives, schedules."""
    return engine("check", case, *args)


def prove(case: "os.PathLike[str] | str", *args: str, counterexample: "os.PathLike[str] | str | None" = None) -> Result:
    """Element-level proof (`shardproof prove`); a refutation writes its counterexample to
    `counterexample` when given (`Result.counterexample`)."""
    extra = list(args)
    if counterexample is not None:
        extra += ["--counterexample", os.fspath(counterexample)]
    return engine("prove", case, *extra)


def inspect(path: "os.PathLike[str] | str", *args: str) -> Result:
    """Graph or case summary (`shardproof inspect`); pass `"--strict"` for the strict verdict."""
    return engine("inspect", path, *args)


def __getattr__(name: str) -> Any:
    # `capture` needs torch: import it on first use only. The package is itself callable.
    if name == "capture":
        import importlib

        return importlib.import_module(".capture", __name__)
    raise AttributeError(f"module 'shardproof' has no attribute {name!r}")
