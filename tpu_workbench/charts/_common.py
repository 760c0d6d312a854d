"""What every chart module shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd


def require_columns(df: pd.DataFrame, columns: list[str], what: str) -> None:
    """Raise ValueError naming the missing columns of `df` that chart `what` needs."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the frame has {list(df.columns)}")


def save_chart(chart: Any, out: Path, name: str) -> list[Path]:
    """Write `chart` as ``out/name.html`` (interactive) and ``out/name.png`` (vl-convert, 2x)."""
    written = []
    for ext in ("html", "png"):
        path = Path(out) / f"{name}.{ext}"
        chart.save(str(path), **({"scale_factor": 2} if ext == "png" else {}))
        written.append(path)
    return written
