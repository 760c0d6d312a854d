"""Before and after a fix (from :func:`tpu_workbench.porting.report.port`'s ``steps``)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import require_columns


def port_steps(steps: pd.DataFrame, variants: list[str] | None = None) -> alt.VConcatChart:
    """Compilations and step time per step, one line per variant ("as written" and each fix
    tried); `variants` keeps those only (default: all). Compilations are the programs first
    run in that step (``new_programs``: what a fresh process compiles). Step time on a log
    axis: a step that compiles takes seconds on XLA:CPU, one that does not a few
    milliseconds."""
    require_columns(steps, ["variant", "step", "step_s", "compiles"], "port_steps")
    data = steps if variants is None else steps[steps["variant"].isin(variants)]
    if "new_programs" in data:  # what a fresh process compiles (this worker may have cached)
        data = data.assign(compiles=data["new_programs"].fillna(data["compiles"]))
    order = list(dict.fromkeys(data["variant"]))
    color = alt.Color("variant:N", sort=order, title=None, legend=alt.Legend(orient="top"))
    tooltip = ["variant", "step", "compiles", "to_device", "from_device", "fallbacks",
               alt.Tooltip("step_s:Q", format=".4f", title="step (s)")]
    base = alt.Chart(data).encode(x=alt.X("step:O", title="step"), color=color,
                                  tooltip=tooltip)
    compiles = base.mark_line(point=True).encode(
        y=alt.Y("compiles:Q", title="new XLA programs")).properties(height=120, width=420)
    times = base.mark_line(point=True).encode(
        y=alt.Y("step_s:Q", title="step time (s)", scale=alt.Scale(type="log"))
    ).properties(height=160, width=420)
    return alt.vconcat(compiles, times).properties(
        title="Each pass from the same seed: the same weights, the model's own batches "
              "(padded where a fix pads them), on XLA:CPU")
