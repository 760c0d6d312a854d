"""What every chart module shares."""

from __future__ import annotations

import pandas as pd


def require_columns(df: pd.DataFrame, columns: list[str], what: str) -> None:
    """Raise ValueError naming the missing columns of `df` that chart `what` needs."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the frame has {list(df.columns)}")
