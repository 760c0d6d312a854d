"""The profiling notebook's exercise: how many steady steps the first step's compile is worth,
worked out from the per-step breakdown the page shows."""

from __future__ import annotations

import math

import pandas as pd

PARTS = ["compile_us", "execute_us", "transfer_us", "host_us", "idle_us"]


def compile_in_steps(steps: pd.DataFrame) -> float:
    """Step 0's compile time over the median steady step (every part of steps >= 1), from
    :func:`tpu_workbench.profiling.step_breakdown`'s frame; NaN without both."""
    first = steps[steps["step"] == 0]
    steady = steps[steps["step"] >= 1][PARTS].sum(axis=1)
    if first.empty or steady.empty or not steady.median() > 0:
        return math.nan
    return float(first["compile_us"].iloc[0] / steady.median())


def judge(answer: float | None, ratio: float) -> tuple[str, str]:
    """(callout kind, markdown): within 25% of `ratio` is right (the figures are read off a
    table and rounded on the way)."""
    if not math.isfinite(ratio):
        return "neutral", "This profile has no compile in step 0 to compare with."
    if answer is None or not math.isfinite(answer) or answer <= 0:
        return "warn", "Enter a positive number of steps."
    if abs(answer - ratio) <= 0.25 * ratio:
        return "success", (f"**Right**: about **{ratio:,.0f}** steady steps. A run much "
                           "shorter than that spends most of its time compiling, which is why "
                           "a recompile in steady state hurts so much.")
    hint = ("Divide step 0's compile time by one steady step (its parts added up), both in "
            "the same unit." if answer < ratio / 10 or answer > ratio * 10 else
            "Close in size, but check which figures you divided: step 0's compile part, and "
            "a typical later step's total.")
    return "warn", f"Not quite. {hint}"
