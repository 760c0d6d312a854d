"""Charts of execution modes: step times, first step vs steady state, compilations.

Every function takes a DataFrame with the documented columns and returns an ``alt.Chart`` (or a
layered/concatenated chart); nothing here runs experiments.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from ._common import mode_scale, pick, require_columns

# Steps are whole numbers: no 0.2, 0.4... ticks when a run has few of them.
STEP_AXIS = alt.Axis(tickMinStep=1, format="d")


def step_times(steps: pd.DataFrame, log_scale: bool = True) -> alt.LayerChart:
    """Step time over steps, one line per mode; the compile spike of step 0 stays visible.

    Columns: ``step``, ``wall_ms``, ``mode`` (and ``compiles`` for the tooltip, if present).
    """
    if steps.empty:
        return alt.Chart(pd.DataFrame({"step": [], "wall_ms": []})).mark_line().properties(
            title="step time (waiting for the first records)", width=520, height=260)
    require_columns(steps, ["step", "wall_ms", "mode"], "step_times")
    tooltip = [c for c in ["mode", "step", "wall_ms", "loss", "compiles"] if c in steps.columns]
    y = alt.Y("wall_ms:Q", title="step time (ms)",
              scale=alt.Scale(type="log") if log_scale else alt.Scale())
    selected = pick("mode", "step")
    base = alt.Chart(steps).encode(x=alt.X("step:Q", title="step", axis=STEP_AXIS), y=y,
                                   color=alt.Color("mode:N", scale=mode_scale(steps["mode"])))
    points = base.mark_point(filled=True, size=45, cursor="pointer").encode(
        tooltip=tooltip, size=alt.condition(selected, alt.value(120), alt.value(45))
    ).add_params(selected)
    return (base.mark_line() + points).properties(
        title=alt.TitleParams("step time per step (step 0 includes compilation)",
                              subtitle=["click a point for that step's records"]),
        width=520, height=260)


def loss_curves(steps: pd.DataFrame, title: str = "training loss per mode") -> alt.Chart:
    """Training loss over steps, one line per mode. Columns: ``step``, ``loss``, ``mode``.

    Modes train the same model from the same weights on the same batches, but their numerics
    differ (fused kernels, another summation order), so curves may drift apart: the default
    `title` claims no more than the chart shows. Modes whose losses agree at every step (to
    1e-5 relative) are drawn as one line and named together in the subtitle, so that one
    visible line under several legend entries is explained.
    """
    require_columns(steps, ["step", "loss", "mode"], "loss_curves")
    same = coinciding(steps)
    subtitle = [" = ".join(g) + ": the same loss at every step, one line" for g in same]
    return (
        alt.Chart(steps)
        .mark_line()
        .encode(x=alt.X("step:Q", title="step", axis=STEP_AXIS),
                y=alt.Y("loss:Q", title="training loss"),
                color=alt.Color("mode:N", scale=mode_scale(steps["mode"])),
                tooltip=["mode", "step", "loss"])
        .properties(title=alt.TitleParams(title, subtitle=subtitle) if subtitle else title,
                    width=520, height=200)
    )


def coinciding(steps: pd.DataFrame, rtol: float = 1e-5) -> list[list[str]]:
    """Groups of two or more modes whose losses agree at every step they share (relative
    `rtol`), each in the order the modes first appear. Columns ``step``, ``loss``, ``mode``."""
    curves = {m: g.set_index("step")["loss"] for m, g in steps.groupby("mode", sort=False)}
    groups: list[list[str]] = []
    for mode, curve in curves.items():
        for group in groups:
            other = curves[group[0]]
            both = curve.index.intersection(other.index)
            if len(both) and ((curve[both] - other[both]).abs()
                              <= rtol * other[both].abs().clip(lower=1e-12)).all():
                group.append(mode)
                break
        else:
            groups.append([mode])
    return [g for g in groups if len(g) > 1]


def steady_times(summary: pd.DataFrame) -> alt.LayerChart:
    """Steady-state step time per mode: median bar with a p10-p90 spread.

    Columns: ``mode``, ``steady_median_ms``, ``steady_p10_ms``, ``steady_p90_ms``.
    """
    require_columns(summary, ["mode", "steady_median_ms", "steady_p10_ms", "steady_p90_ms"],
             "steady_times")
    base = alt.Chart(summary).encode(y=alt.Y("mode:N", sort="x", title=None))
    bars = base.mark_bar().encode(
        x=alt.X("steady_median_ms:Q", title="steady step time (ms): median, p10-p90"),
        color=alt.Color("mode:N", scale=mode_scale(summary["mode"]), legend=None),
        tooltip=["mode", alt.Tooltip("steady_median_ms:Q", format=".2f"),
                 alt.Tooltip("steady_p10_ms:Q", format=".2f"),
                 alt.Tooltip("steady_p90_ms:Q", format=".2f")])
    spread = base.mark_rule(strokeWidth=2).encode(x="steady_p10_ms:Q", x2="steady_p90_ms:Q")
    return (bars + spread).properties(title="steady state (after step 0)", width=420)


FIRST_STEP = "first step (with compilation)"
STEADY = "steady median (after step 0)"


def first_vs_steady(summary: pd.DataFrame) -> alt.LayerChart:
    """First step (with compilation) against the steady median, per mode, on a log scale: the
    length of each grey span is what the first step cost on top of a steady one. Columns:
    ``mode``, ``first_step_ms``, ``steady_median_ms``.
    """
    require_columns(summary, ["mode", "first_step_ms", "steady_median_ms"], "first_vs_steady")
    long = summary.melt(id_vars=["mode"], value_vars=["first_step_ms", "steady_median_ms"],
                        var_name="which", value_name="ms")
    long["which"] = long["which"].map({"first_step_ms": FIRST_STEP,
                                       "steady_median_ms": STEADY})
    x = alt.X("ms:Q", scale=alt.Scale(type="log"), title="ms per step (log scale)")
    span = alt.Chart(summary).mark_rule(strokeWidth=3, color="#bbb").encode(
        y=alt.Y("mode:N", title=None),
        x=alt.X("steady_median_ms:Q", scale=alt.Scale(type="log")), x2="first_step_ms:Q")
    dots = alt.Chart(long).mark_circle(size=120, opacity=1).encode(
        y=alt.Y("mode:N", title=None), x=x,
        color=alt.Color("which:N", title=None,
                        scale=alt.Scale(domain=[FIRST_STEP, STEADY],
                                        range=["#e45756", "#4c78a8"]),
                        legend=alt.Legend(orient="bottom", direction="vertical")),
        tooltip=["mode", "which", alt.Tooltip("ms:Q", format=",.1f")])
    return (span + dots).properties(title="what the first step costs", width=420)


def compiles_per_mode(summary: pd.DataFrame) -> alt.LayerChart:
    """Compilations per mode: in total and in steady state (should be 0), each bar labelled
    with its count so a 0 reads as 0, not as a missing bar.

    Columns: ``mode``, ``compiles_total``, ``compiles_steady``.
    """
    require_columns(summary, ["mode", "compiles_total", "compiles_steady"], "compiles_per_mode")
    long = summary.melt(id_vars=["mode"], value_vars=["compiles_total", "compiles_steady"],
                        var_name="which", value_name="compiles")
    long["which"] = long["which"].str.replace("compiles_", "")
    base = alt.Chart(long).encode(
        y=alt.Y("mode:N", title=None), yOffset=alt.YOffset("which:N", sort=["total", "steady"]),
        x=alt.X("compiles:Q", title="XLA compilations (inductor: graphs)"))
    bars = base.mark_bar().encode(
        color=alt.Color("which:N", title=None,
                        scale=alt.Scale(domain=["total", "steady"],
                                        range=["#4c78a8", "#e45756"]),
                        legend=alt.Legend(orient="bottom")),
        tooltip=["mode", "which", "compiles"])
    labels = base.mark_text(align="left", dx=3, fontSize=10).encode(
        text=alt.Text("compiles:Q", format="d"))
    return (bars + labels).properties(title="compilations", width=420)


FIRST_COMPILE = "at step 0 (the first compile)"
RECOMPILE = "after step 0 (a recompilation)"


def recompile_timeline(compiles: pd.DataFrame, steps: int | None = None) -> alt.Chart:
    """Each XLA compilation as a mark at its step, one row per mode; tooltips give the cause.
    Marks after step 0 (recompilations) are red. `steps`: the run's length, so the axis spans
    every step (whole steps only) even where nothing compiled.

    Columns: ``mode``, ``step``, ``explanation`` (and ``cause``, ``frame`` for tooltips).
    """
    require_columns(compiles, ["mode", "step", "explanation"], "recompile_timeline")
    data = compiles.assign(when=[RECOMPILE if s > 0 else FIRST_COMPILE
                                 for s in compiles["step"]])
    last = steps - 1 if steps else int(data["step"].max()) if len(data) else 1
    # every step a tick while they fit (one per 25 px); Vega's own whole-number ticks beyond
    every = {"values": list(range(0, max(last, 1) + 1))} if last <= 20 else {}
    x = alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d", **every),
              scale=alt.Scale(domain=[-0.3, max(last, 1) + 0.3], nice=False))
    tooltip = [c for c in ["mode", "step", "explanation", "cause", "frame"] if c in data]
    return (
        alt.Chart(data)
        .mark_tick(thickness=3, size=22)
        .encode(x=x, y=alt.Y("mode:N", title=None),
                color=alt.Color("when:N", title="compiled",
                                scale=alt.Scale(domain=[FIRST_COMPILE, RECOMPILE],
                                                range=["#4c78a8", "#e45756"]),
                                legend=alt.Legend(orient="bottom")),
                tooltip=tooltip)
        .properties(title="when XLA compiled", width=520)
    )


def cache_first_steps(runs: pd.DataFrame) -> alt.LayerChart:
    """First-step time per cache scenario (cold worker, warm worker, new shape), log scale,
    coloured by whether the step compiled; the label gives compilations and cache hits.

    Columns: ``label``, ``first_step_ms``, ``compiles``, ``cache_hits`` (see
    :func:`tpu_workbench.runs.compile_cache.cache_study`).
    """
    require_columns(runs, ["label", "first_step_ms", "compiles", "cache_hits"],
                    "cache_first_steps")
    data = runs.assign(
        outcome=runs["compiles"].map(lambda c: "compiled (cache miss)" if c else "cache hit"),
        text=[f"{c:g} compiled, {h:g} hits" for c, h in zip(runs["compiles"], runs["cache_hits"],
                                                            strict=True)])
    # A bar on a log scale has no zero to start from: Vega-Lite then draws none. Start every
    # bar at the power of ten below the shortest, and leave room right of the longest for its
    # label.
    times = [t for t in data["first_step_ms"] if t and t > 0] or [1.0]
    low = 10.0 ** math.floor(math.log10(min(times)))
    high = max(times) * 8
    y = alt.Y("label:N", title=None, sort=list(data["label"]))
    base = alt.Chart(data).encode(
        y=y, x=alt.X("first_step_ms:Q", title="first step (ms, log scale)",
                     scale=alt.Scale(type="log", domain=[low, high])))
    bars = base.mark_bar().encode(
        x2=alt.datum(low),
        color=alt.Color("outcome:N", title=None,
                        scale=alt.Scale(domain=["compiled (cache miss)", "cache hit"],
                                        range=["#e45756", "#54a24b"]),
                        legend=alt.Legend(orient="bottom")),
        tooltip=["label", alt.Tooltip("first_step_ms:Q", format=",.1f"), "compiles",
                 "cache_hits"])
    text = base.mark_text(align="left", dx=4).encode(text="text:N")
    return (bars + text).properties(title="first step: what the in-process compile cache saves",
                                    width=420)
