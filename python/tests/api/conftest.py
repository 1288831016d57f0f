"""Fixtures of the Python API tests: the engine the API calls, and tiny parallelized models.

The engine is the wheel's compiled extension when it is installed, else the binary named by
SHARDPROOF_BIN (scripts/test sets both up). Tests that need a verdict skip, saying why, when
there is neither; the capture tests run regardless.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The source tree's package, unless an installed wheel is asked for (SHARDPROOF_USE_WHEEL=1).
if not os.environ.get("SHARDPROOF_USE_WHEEL"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import shardproof  # noqa: E402
from shardproof import _engine  # noqa: E402


@pytest.fixture
def engine_ready() -> None:
    """Skips a test that needs a verdict when no engine is installed."""
    if _engine._core() is None and _engine.binary() is None:
        pytest.skip("no shardproof engine: install the wheel or set SHARDPROOF_BIN")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "heavy: a test of minutes (a whole transformer block refuted); runs with SHARDPROOF_HEAVY=1"
    )


def pytest_collection_modifyitems(config, items) -> None:
    """The suite skips `heavy` tests unless SHARDPROOF_HEAVY=1 asks for them."""
    if os.environ.get("SHARDPROOF_HEAVY") == "1":
        return
    skip = pytest.mark.skip(reason="heavy: set SHARDPROOF_HEAVY=1 to run it")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)
