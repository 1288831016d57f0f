"""The engines from Python: `verify`, `run`, `check`, `prove`, `inspect` on a case, as typed results.

Every call is the command line's own command (`shardproof verify CASE --json`), so the Python API
and the CLI cannot disagree. It runs in-process through the compiled extension `shardproof._core`
when the wheel installed one, else through a `shardproof` binary: `SHARDPROOF_BIN`, or the one on
`PATH`.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

VERDICTS = {0: "holds", 1: "violated", 2: "invalid", 3: "inconclusive"}


class EngineUnavailable(RuntimeError):
    """Neither the compiled extension nor a `shardproof` binary could be found."""


def _core() -> Any:
    try:
        from . import _core  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _core


def binary() -> Optional[str]:
    """The `shardproof` binary the API falls back to: `SHARDPROOF_BIN`, else the one on PATH."""
    env = os.environ.get("SHARDPROOF_BIN")
    if env:
        return env
    return shutil.which("shardproof")


def call(argv: Sequence[str]) -> tuple[int, str, str]:
    """Runs `shardproof ARGV...`; returns (exit code, stdout, stderr)."""
    argv = [os.fspath(a) for a in argv]
    core = _core()
    if core is not None and not os.environ.get("SHARDPROOF_BIN"):
        # The extension points file descriptors 1 and 2 at files while the command runs: what
        # Python buffered before goes out first.
        sys.stdout.flush()
        sys.stderr.flush()
        code, out, err = core.main(["shardproof", *argv])
        return int(code), out, err
    exe = binary()
    if exe is None:
        raise EngineUnavailable(
            "no shardproof engine: install the wheel (`pip install ./python`), or set "
            "SHARDPROOF_BIN to a built binary (`cargo build --release -p shardproof`)"
        )
    proc = subprocess.run([exe, *argv], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


@dataclass
class Location:
    """Where a report points: a file, line and column (0 when unknown), and what is there."""

    file: str
    line: int = 0
    column: int = 0
    what: str = ""

    def __str__(self) -> str:
        pos = f"{self.file}:{self.line}" + (f":{self.column}" if self.column else "")
        return f"{pos} ({self.what})" if self.what else pos


@dataclass
class Result:
    """One engine's verdict on a case, with its full report."""

    command: str
    """The engine: `verify`, `run`, `check`, `prove` or `inspect`."""
    case: str
    """The case (or graph) it was given."""
    exit_code: int
    """The command line's exit code: 0 holds, 1 violated, 2 invalid, 3 inconclusive."""
    verdict: str
    """`holds`, `violated`, `invalid` or `inconclusive`."""
    report: dict[str, Any] = field(default_factory=dict)
    """The command's JSON report (the certificate, the failures, ...), as a dict."""
    stderr: str = ""
    """What the command printed on stderr (errors and hints for an invalid input)."""
    counterexample: Optional[Path] = None
    """`prove`'s counterexample folder, when one was asked for and written."""

    @property
    def holds(self) -> bool:
        """Whether the property holds (exit code 0)."""
        return self.exit_code == 0

    def __bool__(self) -> bool:
        return self.holds

    @property
    def message(self) -> str:
        """The report's one-line summary, or the error."""
        for key in ("summary", "message", "reason"):
            v = self.report.get(key)
            if isinstance(v, str) and v:
                return v
        return self.stderr.strip().splitlines()[0] if self.stderr.strip() else self.verdict

    @property
    def location(self) -> Optional[Location]:
        """The first source location the report names (where a failure stops), if any."""
        return _first_location(self.report)

    def __str__(self) -> str:
        where = self.location
        tail = f" at {where}" if where and self.verdict != "holds" else ""
        return f"{self.command} {self.case}: {self.verdict} (exit {self.exit_code}){tail}"

    def _repr_html_(self) -> str:
        colour = {"holds": "#1a7f37", "violated": "#cf222e"}.get(self.verdict, "#9a6700")
        where = self.location
        rows = [
            f"<b style='color:{colour}'>{html.escape(self.verdict)}</b> "
            f"<code>shardproof {html.escape(self.command)} {html.escape(self.case)}</code> "
            f"(exit {self.exit_code})",
            html.escape(self.message),
        ]
        if where and self.verdict != "holds":
            rows.append(f"at <code>{html.escape(str(where))}</code>")
        if self.counterexample:
            rows.append(f"counterexample: <code>{html.escape(str(self.counterexample))}</code>")
        body = "<br>".join(rows)
        detail = html.escape(json.dumps(self.report, indent=2)[:20000])
        return f"<div>{body}<details><summary>report</summary><pre>{detail}</pre></details></div>"


_PLACE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<col>\d+))?(?: in (?P<func>.+))?$")


def _place(text: Any, what: str) -> Optional[Location]:
    """A `PATH:LINE[:COL][ in FUNC]` string (the reports' `source` and `graph_location`)."""
    if not isinstance(text, str):
        return None
    m = _PLACE.match(text.strip())
    if not m:
        return None
    return Location(m.group("file"), int(m.group("line")), int(m.group("col") or 0), what)


def _first_location(obj: Any) -> Optional[Location]:
    """Depth-first, the first place a report names: the user's source line (`source`) before
    the graph line (`graph_location`, or `file` + `line`), as docs/formats/reports.md orders."""
    if isinstance(obj, dict):
        what = str(obj.get("operator") or obj.get("node") or obj.get("output") or "")
        for key in ("source", "graph_location"):
            found = _place(obj.get(key), what)
            if found:
                return found
        f, line = obj.get("file"), obj.get("line")
        if isinstance(f, str) and isinstance(line, int):
            return Location(f, line, int(obj.get("column") or 0), what)
        for key in ("failure", "findings", "finding", "mismatches", "outputs"):
            if key in obj:
                found = _first_location(obj[key])
                if found:
                    return found
        for v in obj.values():
            found = _first_location(v)
            if found:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _first_location(v)
            if found:
                return found
    return None


def engine(command: str, case: Any, *args: str, json_flag: str = "--json") -> Result:
    """`shardproof COMMAND CASE --json ARGS...` as a `Result`."""
    case_s = os.fspath(case)
    code, out, err = call([command, case_s, json_flag, *args])
    report: dict[str, Any] = {}
    if out.strip():
        try:
            parsed = json.loads(out)
            report = parsed if isinstance(parsed, dict) else {"report": parsed}
        except json.JSONDecodeError:
            report = {"text": out}
    verdict = VERDICTS.get(code, "invalid")
    cex = None
    if "--counterexample" in args:
        cex = Path(args[list(args).index("--counterexample") + 1])
        cex = cex if cex.exists() else None
    return Result(command, case_s, code, verdict, report, err, cex)
