"""The profiling notebook's exercise: the share of a run's time that goes to compiling when the
step recompiles every few steps, reasoned from the per-step breakdown the page shows (a
compile's cost and a steady step's), not read off it."""

from __future__ import annotations

import math

import pandas as pd

PARTS = ["compile_us", "execute_us", "transfer_us", "host_us", "idle_us"]
EVERY = 50  # the exercise's loop recompiles once every this many steps


def compile_in_steps(steps: pd.DataFrame) -> float:
    """Step 0's compile time over the median steady step (every part of steps >= 1), from
    :func:`tpu_workbench.profiling.step_breakdown`'s frame; NaN without both."""
    first = steps[steps["step"] == 0]
    steady = steps[steps["step"] >= 1][PARTS].sum(axis=1)
    if first.empty or steady.empty or not steady.median() > 0:
        return math.nan
    return float(first["compile_us"].iloc[0] / steady.median())


def compile_share(steps: pd.DataFrame, every: int = EVERY) -> float:
    """The share of a long run's time spent compiling when the step compiles again once every
    `every` steps: one compile (worth :func:`compile_in_steps` steady steps) per `every` steady
    steps. NaN where the profile has no compile or no steady step."""
    ratio = compile_in_steps(steps)
    return ratio / (ratio + every) if math.isfinite(ratio) else math.nan


def judge(answer: float | None, share: float, every: int = EVERY) -> tuple[str, str]:
    """(callout kind, markdown) for `answer`, a percentage: within 5 points of `share` (a
    fraction) is right (the figures are read off a table and rounded on the way)."""
    if not math.isfinite(share):
        return "neutral", "This profile has no compile in step 0 to compare with."
    if answer is None or not math.isfinite(answer) or not 0 <= answer <= 100:
        return "warn", "Enter a percentage between 0 and 100."
    right = 100 * share
    if abs(answer - right) <= 5:
        return "success", (f"**Right**: about **{right:.0f}%**. Each recompile costs as much as "
                           f"{share / (1 - share) * every:,.0f} steady steps here, so a shape "
                           f"that changes once every {every} steps makes compiling "
                           f"{'most' if share > 0.5 else 'a large part'} of the run. Find it "
                           "with the compile causes of *Eager vs compiled*, and pad the shape "
                           "to a few fixed sizes.")
    naive = 100 * share / (1 - share)  # the compile over the steady steps alone
    if abs(answer - naive) <= 5 and abs(naive - right) > 5:
        return "warn", ("Close: that is the compile time over the steady steps' time. The "
                        "share of the *whole* run also counts the compile in the total.")
    return "warn", (f"Not quite. Per {every} steps the run spends one compile (step 0's compile "
                    f"part above) and {every} steady steps (a later step's parts added up): "
                    "what fraction of that is the compile?")
