"""Charts of sweeps: a measured figure against the swept field, one line per mode."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import mode_scale, require_columns


def sweep_times(summary: pd.DataFrame, field: str, y: str = "steady_median_ms") -> alt.LayerChart:
    """Steady step time (or another summary column `y`) against the swept `field`, a line per
    mode with the p10-p90 spread; the tooltip names the node that ran each point.

    Columns: `field`, ``mode``, `y` (``steady_p10_ms``/``steady_p90_ms`` for the spread when `y`
    is the median), ``node`` optional. A numeric field gets a log axis (batch sizes double).
    """
    require_columns(summary, [field, "mode", y], "sweep_times")
    numeric = pd.api.types.is_numeric_dtype(summary[field])
    log2 = alt.Scale(type="log", base=2, nice=False, padding=16)
    x = (alt.X(f"{field}:Q", title=field, scale=log2,
               axis=alt.Axis(values=sorted(summary[field].dropna().unique().tolist())))
         if numeric else alt.X(f"{field}:O", title=field, axis=alt.Axis(labelAngle=0)))
    title = {"steady_median_ms": "steady step time (ms): median, p10-p90",
             "items_per_s": "throughput (items/s)"}.get(y, y)
    tooltip = [c for c in [field, "mode", y, "node", "run_id"] if c in summary.columns]
    base = alt.Chart(summary).encode(
        x=x, color=alt.Color("mode:N", scale=mode_scale(summary["mode"])))
    chart = base.mark_line(point=True).encode(y=alt.Y(f"{y}:Q", title=title), tooltip=tooltip)
    if y == "steady_median_ms" and {"steady_p10_ms", "steady_p90_ms"} <= set(summary.columns):
        chart = chart + base.mark_rule(strokeWidth=2).encode(y="steady_p10_ms:Q",
                                                             y2="steady_p90_ms:Q")
    return alt.layer(chart).properties(title=f"sweep over {field}", width=480, height=260)
