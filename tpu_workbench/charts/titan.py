"""TorchTitan runs: loss curves per layout (training and held-out), memory per rank."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import require_columns
from .modes import STEP_AXIS

PART_COLORS = {"param": "#4c78a8", "grad": "#f58518", "optimizer": "#54a24b"}


def titan_losses(frame: pd.DataFrame, title: str = "TorchTitan: loss per step") -> alt.Chart:
    """Loss over steps, one colour per layout: the training loss (the whole batch's) as a
    line, the held-out loss as large points. Columns: ``strategy``, ``step``, ``loss`` and
    ``kind`` (``train`` / ``held-out``; a steps frame without it is all ``train``)."""
    if frame.empty:
        return alt.Chart(pd.DataFrame({"step": [], "loss": []})).mark_line().properties(
            title="loss (waiting for the first records)", width=520, height=260)
    require_columns(frame, ["strategy", "step", "loss"], "titan_losses")
    frame = frame.assign(kind=frame.get("kind", "train"))
    color = alt.Color("strategy:N", title="layout")
    base = alt.Chart(frame).encode(x=alt.X("step:Q", title="step", axis=STEP_AXIS),
                                   y=alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)),
                                   color=color,
                                   tooltip=["strategy", "kind", "step",
                                            alt.Tooltip("loss:Q", format=".4f")])
    train = base.transform_filter(alt.datum.kind == "train").mark_line()
    held = base.transform_filter(alt.datum.kind == "held-out").mark_point(
        filled=True, size=110, shape="diamond")
    return (train + held).properties(
        title=alt.TitleParams(title, subtitle=["lines: training loss (the whole batch); "
                                               "diamonds: loss on held-out text"]),
        width=520, height=260)


def titan_memory(frame: pd.DataFrame) -> alt.Chart:
    """Bytes per rank of parameters, gradients and optimizer state, stacked, one group of bars
    per layout, measured (each rank's own shards) beside the workbench's estimate for the same
    layout. Columns: ``strategy``, ``rank``, ``part``, ``bytes``, ``source``."""
    require_columns(frame, ["strategy", "rank", "part", "bytes", "source"], "titan_memory")
    data = frame.assign(MB=frame["bytes"] / 1e6,
                        bar=(frame["source"] + " r" + frame["rank"].astype(str)).where(
                            frame["source"] == "measured", frame["source"]))
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("bar:N", title=None, sort=None, axis=alt.Axis(labelAngle=-40)),
        y=alt.Y("MB:Q", title="MB per rank", stack="zero"),
        color=alt.Color("part:N", title="what",
                        scale=alt.Scale(domain=list(PART_COLORS),
                                        range=list(PART_COLORS.values()))),
        column=alt.Column("strategy:N", title=None),
        tooltip=["strategy", "source", "rank", "part", alt.Tooltip("MB:Q", format=".2f")],
    ).properties(width=130, height=220,
                 title="training state per rank: measured shards beside the estimate"
                 ).resolve_scale(x="independent")  # each layout its own ranks
