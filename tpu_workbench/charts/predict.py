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
