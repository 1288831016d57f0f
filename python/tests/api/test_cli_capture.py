"""`shardproof capture SCRIPT`: the command line runs a user's capture script and names the case."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from shardproof import _engine

SCRIPT = textwrap.dedent(
    """
    import torch
    import shardproof
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from models import MLP

    shardproof.capture(MLP(), (torch.randn(4, 8),), mesh={"tp": 2},
                       plan={"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    """
)


def _env_with_sources(monkeypatch) -> None:
    # The script imports shardproof (the source tree's unless the wheel is tested) and models.
    here = Path(__file__).resolve().parent
    paths = [str(here)]
    if not os.environ.get("SHARDPROOF_USE_WHEEL"):
        paths.insert(0, str(here.parents[1]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))


def test_capture_command_writes_and_names_the_case(tmp_path, monkeypatch, engine_ready):
    _env_with_sources(monkeypatch)
    script = tmp_path / "capture_mlp.py"
    script.write_text(SCRIPT)
    out = tmp_path / "case"
    code, stdout, stderr = _engine.call(["capture", str(script), "--out", str(out), "--python", sys.executable])
    assert code == 0, stderr
    assert stdout.strip() == str(out / "case.yaml")
    assert (out / "r1.py").exists()
    verdict = _engine.engine("verify", out / "case.yaml")
    assert verdict.exit_code == 0, (verdict.stderr, verdict.report)


def test_capture_command_refuses_a_failing_script(tmp_path, monkeypatch, engine_ready):
    _env_with_sources(monkeypatch)
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('no model here')\n")
    code, _, stderr = _engine.call(["capture", str(script), "--out", str(tmp_path / "o"), "--python", sys.executable])
    assert code == 2
    assert "failed" in stderr and "broken.py" in stderr
    code, _, stderr = _engine.call(["capture", str(tmp_path / "missing.py")])
    assert code == 2 and "not found" in stderr
