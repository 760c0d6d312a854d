"""Every notebook runs headless in smoke mode, and exports to HTML without error outputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import NOTEBOOKS, exported_problems, smoke_env


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_exports_without_errors(nb, tmp_path):
    """`marimo export html` runs every cell and renders every output; any cell error fails."""
    out = tmp_path / f"{nb.stem}.html"
    proc = subprocess.run(
        [sys.executable, "-m", "marimo", "-y", "export", "html", "--no-sandbox", str(nb),
         "-o", str(out), "-f"],
        capture_output=True, text=True, timeout=900, env=smoke_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    html = out.read_text(encoding="utf-8")
    assert not exported_problems(html), exported_problems(html)
    assert "vega" in html.lower() or "altair" in html.lower()  # charts made it into the page
