"""Charts of profiles: a step's timeline, the top HLO ops, where each step's time went."""

from __future__ import annotations

import altair as alt
import pandas as pd

BREAKDOWN = ["compile_us", "execute_us", "transfer_us", "host_us", "idle_us"]


def timeline(events: pd.DataFrame, step: int, max_events: int = 4000) -> alt.Chart:
    """One step as a timeline: a lane per thread, a bar per event (longest events first when
    there are more than `max_events`). Columns: ``thread``, ``name``, ``ts_us``, ``end_us``,
    ``dur_us``, ``step`` (and ``hlo_op`` for the colour)."""
    frame = events[events["step"] == step].copy()
    if frame.empty:
        raise ValueError(f"no events in step {step}; steps with events: "
                         f"{sorted(events['step'].unique().tolist())}")
    frame = frame.nlargest(max_events, "dur_us")
    t0 = frame["ts_us"].min()
    frame["start_ms"] = (frame["ts_us"] - t0) / 1e3
    frame["end_ms"] = (frame["end_us"] - t0) / 1e3
    frame["kind"] = frame["hlo_op"].notna().map({True: "HLO op", False: "runtime / host"})
    return (
        alt.Chart(frame)
        .mark_bar(height=14)
        .encode(x=alt.X("start_ms:Q", title="ms since the step began"), x2="end_ms:Q",
                y=alt.Y("thread:N", title=None), color=alt.Color("kind:N", title=None),
                tooltip=["name", "thread", alt.Tooltip("dur_us:Q", format=",.1f"), "hlo_op"])
        .properties(title=f"step {step}: what each thread did", width=620)
    )


def top_ops(ops: pd.DataFrame, n: int = 15) -> alt.Chart:
    """The `n` HLO ops with the most time per step. Columns: ``hlo_op``, ``per_step_us``,
    ``share``, ``count``."""
    top = ops.nlargest(n, "per_step_us")
    return (
        alt.Chart(top)
        .mark_bar()
        .encode(x=alt.X("per_step_us:Q", title="µs per step"),
                y=alt.Y("hlo_op:N", sort="-x", title=None),
                tooltip=["hlo_op", "hlo_module", "count",
                         alt.Tooltip("per_step_us:Q", format=",.1f"),
                         alt.Tooltip("share:Q", format=".1%")])
        .properties(title=f"top {len(top)} HLO ops (steady steps)", width=480)
    )


def step_breakdown(steps: pd.DataFrame) -> alt.Chart:
    """Stacked bars per step: compile, execute, transfer, host and idle time. Columns:
    ``step`` and the ``*_us`` parts of :func:`tpu_workbench.profiling.step_breakdown`."""
    long = steps.melt(id_vars=["step"], value_vars=BREAKDOWN, var_name="part", value_name="us")
    long["part"] = long["part"].str.removesuffix("_us")
    long["ms"] = long["us"] / 1e3
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(x=alt.X("step:O"), y=alt.Y("ms:Q", title="ms", scale=alt.Scale(type="symlog")),
                color=alt.Color("part:N", sort=[p.removesuffix("_us") for p in BREAKDOWN]),
                order=alt.Order("part:N"),
                tooltip=["step", "part", alt.Tooltip("ms:Q", format=",.2f")])
        .properties(title="where each step's time went (symlog scale)", width=480)
    )
