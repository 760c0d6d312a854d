"""Predicted step times per slice and strategy (from
:func:`tpu_workbench.planning.predict.predict`)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import require_columns


def predicted_step_times(frame: pd.DataFrame) -> alt.FacetChart:
    """Predicted step time (ms) per strategy, one panel per slice: a bar from perfect overlap
    to no overlap (the range), a dot at the estimate (async collectives hidden where compute
    can hide them), a tick at compute only, the bottleneck and the compiler's memory in the
    tooltip. Rows the compiler refused have no bar; their reason is in the frame."""
    require_columns(frame, ["slice", "strategy", "predicted_step_min_ms", "predicted_step_ms",
                            "predicted_step_max_ms", "predicted_roofline_ms", "bottleneck",
                            "predicted_mfu"], "predicted_step_times")
    data = frame.dropna(subset=["predicted_step_max_ms"]).copy()
    strategies = list(dict.fromkeys(frame["strategy"]))
    x = alt.X("strategy:N", sort=strategies, title=None, axis=alt.Axis(labelAngle=0))
    tooltip = ["slice", "strategy", "bottleneck",
               alt.Tooltip("predicted_step_ms:Q", format=".1f", title="predicted step (ms)"),
               alt.Tooltip("predicted_mfu:Q", format=".1%", title="predicted MFU"),
               alt.Tooltip("predicted_roofline_ms:Q", format=".1f",
                           title="predicted compute only (ms)"),
               alt.Tooltip("predicted_step_min_ms:Q", format=".1f",
                           title="predicted, perfect overlap (ms)"),
               alt.Tooltip("predicted_step_max_ms:Q", format=".1f",
                           title="predicted, no overlap (ms)")]
    if "compiler_memory_gb" in data:
        tooltip.append(alt.Tooltip("compiler_memory_gb:Q", format=".1f",
                                   title="HBM per chip, by the compiler (GB)"))
    bars = alt.Chart().mark_bar(size=22, opacity=0.6).encode(
        x=x, y=alt.Y("predicted_step_min_ms:Q", title="predicted step time (ms)",
                     scale=alt.Scale(zero=True)),
        y2="predicted_step_max_ms:Q", color=alt.Color("bottleneck:N", title="bottleneck"),
        tooltip=tooltip)
    estimate = alt.Chart().mark_point(filled=True, color="black", size=60).encode(
        x=x, y="predicted_step_ms:Q", tooltip=tooltip)
    compute = alt.Chart().mark_tick(color="black", thickness=1, size=26).encode(
        x=x, y="predicted_roofline_ms:Q", tooltip=tooltip)
    compiled = (f"compiled for each slice by libtpu {data['libtpu'].iloc[0]}, not run"
                if "libtpu" in data and len(data) else "not measured")
    return alt.layer(bars, compute, estimate, data=data).properties(
        width=max(90, 60 * len(strategies)), height=220).facet(
        column=alt.Column("slice:N", sort=list(dict.fromkeys(frame["slice"])), title=None)
    ).properties(title=alt.TitleParams(
        f"Predicted step time: {compiled}",
        subtitle="dot: estimate; bar: perfect overlap to no overlap; tick: compute only"))


def predicted_vs_published(frame: pd.DataFrame, band: float = 0.25) -> alt.LayerChart:
    """Predicted against published step time (s, log axes), one point per published run of
    :func:`tpu_workbench.planning.validation.validation` that has a prediction, coloured by
    model family; the diagonal is a perfect prediction, the shaded band ±`band`. The run the
    one constant was fitted on is drawn hollow."""
    require_columns(frame, ["id", "family", "model", "slice", "workbench_strategy",
                            "published_s", "predicted_s", "ratio", "fitted", "source_file"],
                    "predicted_vs_published")
    data = frame.dropna(subset=["predicted_s"]).copy()
    data["judged"] = ["fitted (not judged)" if f else "judged" for f in data["fitted"]]
    values = list(data["published_s"]) + list(data["predicted_s"]) or [1.0, 10.0]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    line = pd.DataFrame({"published_s": [lo, hi]})
    line = line.assign(low=line["published_s"] * (1 - band), high=line["published_s"] * (1 + band),
                       predicted_s=line["published_s"])
    scale = alt.Scale(type="log", domain=[lo, hi])
    x = alt.X("published_s:Q", scale=scale, title="published step time (s)")
    shade = alt.Chart(line).mark_area(opacity=0.15, color="gray").encode(
        x=x, y=alt.Y("low:Q", scale=scale, title="predicted step time (s)"), y2="high:Q")
    diagonal = alt.Chart(line).mark_line(color="gray", strokeDash=[4, 4]).encode(
        x=x, y=alt.Y("predicted_s:Q", scale=scale))
    points = alt.Chart(data).mark_point(size=90, filled=True).encode(
        x=x, y=alt.Y("predicted_s:Q", scale=scale),
        color=alt.Color("family:N", title="family"),
        shape=alt.Shape("judged:N", title=None),
        tooltip=["id", "model", "slice", alt.Tooltip("workbench_strategy:N", title="strategy"),
                 "global_batch", "seq_len",
                 alt.Tooltip("published_s:Q", format=".3f", title="published (s)"),
                 alt.Tooltip("predicted_s:Q", format=".3f", title="predicted (s)"),
                 alt.Tooltip("ratio:Q", format=".3f"), "source_file"])
    return alt.layer(shade, diagonal, points).properties(
        width=360, height=300, title=alt.TitleParams(
            f"Predicted vs published: {len(data)} runs",
            subtitle=f"dashed: exact; band: ±{band:.0%}; hollow: the run the constant was "
                     "fitted on"))
