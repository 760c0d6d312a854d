"""Small helpers the notebooks share (kept here so every notebook behaves the same)."""

from __future__ import annotations

import os

SMOKE_ENV = "TPU_WORKBENCH_SMOKE"


def smoke_mode() -> bool:
    """True for quick CI runs: ``TPU_WORKBENCH_SMOKE=1``, or ``-- --smoke`` after a notebook."""
    if os.environ.get(SMOKE_ENV) == "1":
        return True
    try:
        import marimo as mo

        return "smoke" in mo.cli_args()  # a bare `--smoke` parses to "" (falsy), so test `in`
    except Exception:  # no marimo runtime (plain import)
        return False
