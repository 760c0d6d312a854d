"""Charts of profiles: a step's timeline, the top HLO ops, where each step's time went."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import pick

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


def top_ops(ops: pd.DataFrame, n: int = 15, width: int = 360) -> alt.LayerChart:
    """The `n` HLO ops with the most self time per step (nested ops not counted twice), each
    bar labelled with its share of a steady step. Columns (of
    :func:`tpu_workbench.profiling.op_stats`): ``hlo_op``, ``per_step_us``, ``share``,
    ``count``, ``hlo_module``, ``inside``."""
    top = ops.nlargest(n, "per_step_us").assign(
        label=lambda d: (100 * d["share"]).map(lambda v: f"{v:.1f}%"))
    if "inside" not in top.columns:
        top = top.assign(inside=None)
    top["inside"] = top["inside"].fillna("(top level)")
    x_max = float(top["per_step_us"].max()) * 1.22 if len(top) else 1.0
    base = alt.Chart(top).encode(
        x=alt.X("per_step_us:Q", title="µs per steady step (self time)",
                scale=alt.Scale(domain=[0, x_max], nice=False)),
        y=alt.Y("hlo_op:N", sort="-x", title=None, axis=alt.Axis(labelLimit=260)),
        tooltip=["hlo_op", "inside", "hlo_module", "count",
                 alt.Tooltip("per_step_us:Q", format=",.1f", title="self µs per step"),
                 alt.Tooltip("share:Q", format=".1%", title="share of a step")])
    selected = pick("hlo_op")
    bars = base.mark_bar(cursor="pointer").encode(
        opacity=alt.condition(selected, alt.value(1.0), alt.value(0.35))).add_params(selected)
    labels = base.mark_text(align="left", dx=3, fontSize=11).encode(text="label:N")
    return (bars + labels).properties(
        width=width, height=alt.Step(16), title=alt.TitleParams(
            f"top {len(top)} HLO ops by self time (steady steps)",
            subtitle=["label: share of a steady step; an op nested in a call counts once; "
                      "click a bar to open the op"]))


def step_breakdown(steps: pd.DataFrame) -> alt.HConcatChart:
    """Stacked bars per step: compile, execute, transfer, host and idle time, on linear axes:
    step 0 (which compiles) in a panel of its own, the steady steps beside it on their own
    scale, so both read true. Columns: ``step`` and the ``*_us`` parts of
    :func:`tpu_workbench.profiling.step_breakdown`."""
    parts = [p.removesuffix("_us") for p in BREAKDOWN]
    long = steps.melt(id_vars=["step"], value_vars=BREAKDOWN, var_name="part", value_name="us")
    long["part"] = long["part"].str.removesuffix("_us")
    long["ms"] = long["us"] / 1e3
    long["order"] = long["part"].map(parts.index)

    def panel(frame: pd.DataFrame, title: str, width: int) -> alt.Chart:
        return (
            alt.Chart(frame)
            .mark_bar()
            .encode(x=alt.X("step:O", title="step", axis=alt.Axis(labelAngle=0)),
                    y=alt.Y("ms:Q", title="ms", stack="zero"),
                    color=alt.Color("part:N", sort=parts, scale=alt.Scale(domain=parts),
                                    title="part of the step"),
                    order=alt.Order("order:Q"),
                    tooltip=["step", "part", alt.Tooltip("ms:Q", format=",.2f")])
            .properties(title=title, width=width, height=220)
        )

    first = long[long["step"] == long["step"].min()]
    rest = long[long["step"] != long["step"].min()]
    charts = [panel(first, "step 0 (compiles)", 60)]
    if len(rest):
        charts.append(panel(rest, "steady steps (own scale)",
                            min(max(32 * rest["step"].nunique(), 160), 460)))
    return alt.hconcat(*charts).resolve_scale(y="independent").properties(
        title="where each step's time went (linear ms axes)")
