"""Altair charts, built from the workbench's DataFrames only.

Every function takes a DataFrame with the documented columns and returns an ``alt.Chart`` (or a
layered/concatenated chart); nothing here runs experiments.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

MODE_COLORS = alt.Scale(scheme="tableau10")


def _require(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the frame has {list(df.columns)}")


def step_times(steps: pd.DataFrame, log_scale: bool = True) -> alt.Chart:
    """Step time over steps, one line per mode; the compile spike of step 0 stays visible.

    Columns: ``step``, ``wall_ms``, ``mode`` (and ``compiles`` for the tooltip, if present).
    """
    if steps.empty:
        return alt.Chart(pd.DataFrame({"step": [], "wall_ms": []})).mark_line().properties(
            title="step time (waiting for the first records)", width=520, height=260)
    _require(steps, ["step", "wall_ms", "mode"], "step_times")
    tooltip = [c for c in ["mode", "step", "wall_ms", "loss", "compiles"] if c in steps.columns]
    y = alt.Y("wall_ms:Q", title="step time (ms)",
              scale=alt.Scale(type="log") if log_scale else alt.Scale())
    return (
        alt.Chart(steps)
        .mark_line(point=True)
        .encode(x=alt.X("step:Q", title="step"), y=y,
                color=alt.Color("mode:N", scale=MODE_COLORS), tooltip=tooltip)
        .properties(title="step time per step (step 0 includes compilation)", width=520,
                    height=260)
    )


def loss_curves(steps: pd.DataFrame) -> alt.Chart:
    """Training loss over steps, one line per mode. Columns: ``step``, ``loss``, ``mode``."""
    _require(steps, ["step", "loss", "mode"], "loss_curves")
    return (
        alt.Chart(steps)
        .mark_line()
        .encode(x="step:Q", y=alt.Y("loss:Q", title="training loss"),
                color=alt.Color("mode:N", scale=MODE_COLORS), tooltip=["mode", "step", "loss"])
        .properties(title="training loss (the same in every mode)", width=520, height=200)
    )
