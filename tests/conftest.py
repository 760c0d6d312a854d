"""Shared test helpers: notebook discovery, the smoke environment, exported-HTML checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.py") if "marimo.App(" in p.read_text())


def smoke_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running a notebook quickly and without writing into the checkout."""
    return {**os.environ, "TPU_WORKBENCH_SMOKE": "1",
            "TPU_WORKBENCH_RESULTS": str(tmp_path / "results")}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Send run results to a temporary folder."""
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"
