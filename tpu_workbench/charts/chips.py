"""Live chip metrics (libtpu's monitoring SDK, sampled by the worker between steps)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import mode_scale, require_columns

UTILISATION = {"duty_cycle_pct": "duty cycle", "tensorcore_util_pct": "TensorCore utilisation"}


def chip_metrics(samples: pd.DataFrame) -> alt.VConcatChart:
    """Duty cycle and TensorCore utilisation (%) over steps, one panel each, and HBM in use
    (GB) below; one colour per mode. Columns: ``step``, ``mode`` and any of ``chips`` (the
    run's chips, in the tooltip), ``duty_cycle_pct``, ``tensorcore_util_pct``,
    ``hbm_used_bytes`` (``tpu_metrics`` records)."""
    require_columns(samples, ["step", "mode"], "chip_metrics")
    chips = samples["chips"] if "chips" in samples.columns else pd.Series(None, samples.index)
    samples = samples.assign(chips=chips.map(
        lambda c: ", ".join(map(str, c)) if isinstance(c, list | tuple) else "all"))
    pct = [c for c in UTILISATION if c in samples.columns]
    long = samples.melt(id_vars=["step", "mode", "chips"], value_vars=pct, var_name="metric",
                        value_name="percent").dropna()
    long["metric"] = long["metric"].map(UTILISATION)
    x = alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d"))
    util = (alt.Chart(long).mark_line(point=True)
            .encode(x=x, y=alt.Y("percent:Q", title="%", scale=alt.Scale(domain=[0, 100])),
                    color=alt.Color("mode:N", scale=mode_scale(samples["mode"])),
                    tooltip=["mode", "chips", "step", "metric",
                             alt.Tooltip("percent:Q", format=".1f")])
            .properties(width=250, height=160)
            .facet(column=alt.Column("metric:N", title="chip utilisation (libtpu monitoring "
                                     "SDK), mean over the chips each run uses")))
    if "hbm_used_bytes" not in samples.columns:
        return alt.vconcat(util)
    hbm = samples.dropna(subset=["hbm_used_bytes"]).assign(
        hbm_gb=lambda f: f["hbm_used_bytes"] / 1e9)
    memory = (alt.Chart(hbm).mark_line(point=True)
              .encode(x=x, y=alt.Y("hbm_gb:Q", title="HBM in use (GB)"),
                      color=alt.Color("mode:N", scale=mode_scale(samples["mode"])),
                      tooltip=["mode", "chips", "step",
                               alt.Tooltip("hbm_gb:Q", format=".2f")])
              .properties(title="HBM in use, mean per chip of the run", width=520,
                          height=140))
    return alt.vconcat(util, memory)
