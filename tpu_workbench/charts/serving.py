"""Serving plans as charts: the latency-throughput curve with published runs on it, and what
fills a chip's HBM (from :func:`tpu_workbench.serving.serve.serve_plan`'s frames)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import require_columns


def latency_throughput(plans: pd.DataFrame, published: pd.DataFrame | None = None) -> alt.Chart:
    """Predicted ITL (ms) against output tokens/s per chip, one line per slice, a point per
    concurrency; published runs (``itl_ms``, ``output_tokens_per_s_per_chip``, ``engine``) as
    hollow marks beside them."""
    require_columns(plans, ["slice", "concurrency", "itl_mean_ms",
                            "output_tokens_per_s_per_chip"], "latency_throughput")
    x = alt.X("output_tokens_per_s_per_chip:Q", title="output tokens/s per chip")
    y = alt.Y("itl_mean_ms:Q", title="inter-token latency (ms)", scale=alt.Scale(zero=True))
    line = alt.Chart(plans).mark_line(point=True).encode(
        x=x, y=y, color=alt.Color("slice:N", title="predicted, slice"),
        tooltip=["slice", "concurrency", "bottleneck",
                 alt.Tooltip("itl_mean_ms:Q", format=".1f", title="predicted ITL (ms)"),
                 alt.Tooltip("ttft_ms:Q", format=".0f", title="predicted TTFT (ms)"),
                 alt.Tooltip("output_tokens_per_s_per_chip:Q", format=".0f")])
    chart = line
    if published is not None and len(published):
        pub = published.assign(itl_mean_ms=published["itl_ms"])
        chart = line + alt.Chart(pub).mark_point(size=90, filled=False, strokeWidth=2).encode(
            x=x, y=y, shape=alt.Shape("engine:N", title="published, engine"),
            color=alt.value("black"),
            tooltip=["run", "engine", "engine_version", "slice", "concurrency", "itl_ms",
                     "output_tokens_per_s_per_chip", "source_path"])
    return chart.properties(width=520, height=300,
                            title="predicted (lines, not run) and published (hollow marks)")


def hbm_share(frame: pd.DataFrame) -> alt.Chart:
    """One bar per plan (``plan``): a chip's HBM split into weights, KV cache, the rest the
    compiler assigned and what is left (``part``, ``gb``)."""
    require_columns(frame, ["plan", "part", "gb"], "hbm_share")
    order = ["weights", "KV cache", "temporaries and other", "free"]
    return alt.Chart(frame).mark_bar().encode(
        y=alt.Y("plan:N", title=None), x=alt.X("gb:Q", title="GB per chip (compiler's memory)",
                                                 stack="zero"),
        color=alt.Color("part:N", sort=order, title=None),
        order=alt.Order("order:Q"),
        tooltip=["plan", "part", alt.Tooltip("gb:Q", format=".2f")],
    ).transform_calculate(order=f"indexof({order}, datum.part)").properties(width=520)
