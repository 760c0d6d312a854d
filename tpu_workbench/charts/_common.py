"""What every chart module shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..records import require_columns

__all__ = ["require_columns", "save_chart"]


def save_chart(chart: Any, out: Path, name: str) -> list[Path]:
    """Write `chart` as ``out/name.html`` (interactive) and ``out/name.png`` (vl-convert, 2x)."""
    written = []
    for ext in ("html", "png"):
        path = Path(out) / f"{name}.{ext}"
        chart.save(str(path), **({"scale_factor": 2} if ext == "png" else {}))
        written.append(path)
    return written
