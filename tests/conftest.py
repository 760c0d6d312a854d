"""Shared test helpers: notebook discovery, the smoke environment, exported-HTML checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.py") if "marimo.App(" in p.read_text())


def smoke_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running a notebook quickly and without writing into the checkout."""
    return {**os.environ, "TPU_WORKBENCH_SMOKE": "1",
            "TPU_WORKBENCH_RESULTS": str(tmp_path / "results")}


def exported_problems(html: str) -> list[str]:
    """Error outputs and tracebacks recorded in a page written by `marimo export html`.

    `marimo export html` exits 0 when rendering an output fails, so the page's embedded session
    data is the only reliable place to look.
    """
    start = html.index('"__MARIMO_MOUNT_CONFIG__"')
    start = html.index("Object.freeze(", start) + len("Object.freeze(")
    config, _ = json.JSONDecoder().raw_decode(html[start:])
    problems = []
    for cell in config["session"]["cells"]:
        for out in cell.get("outputs", []):
            if out.get("type") == "error":
                problems.append(f"{cell['id']}: {out.get('ename')}: {out.get('evalue')}")
            elif "Your output is too large" in json.dumps(out.get("data", "")):
                problems.append(f"{cell['id']}: output exceeded runtime.output_max_bytes")
        for con in cell.get("console", []):
            if con.get("mimetype") == "application/vnd.marimo+traceback":
                problems.append(f"{cell['id']}: traceback in console")
    return problems


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Send run results to a temporary folder."""
    monkeypatch.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"
