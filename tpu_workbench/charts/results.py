"""Charts of what a trained model does: a classifier's confusion matrix.

Every function takes a DataFrame with the documented columns and returns an Altair chart.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import pick, require_columns


def confusion_matrix(predictions: pd.DataFrame, classes: list[str] | None = None,
                     title: str = "held-out images: true shape x predicted shape",
                     ) -> alt.LayerChart:
    """Counts of each (true, predicted) pair as a heat map with the count in every cell; the
    diagonal is what the model got right. Click a cell to select its pair (selection "pick"
    on ``true`` and ``predicted``).

    Columns: ``true``, ``predicted`` (one row per item). `classes` orders the axes (default:
    the true labels in order of appearance)."""
    require_columns(predictions, ["true", "predicted"], "confusion_matrix")
    order = classes or list(dict.fromkeys([*predictions["true"], *predictions["predicted"]]))
    counts = (predictions.groupby(["true", "predicted"]).size()
              .reindex(pd.MultiIndex.from_product([order, order], names=["true", "predicted"]),
                       fill_value=0)
              .rename("count").reset_index())  # every pair, 0 where none: a full grid
    totals = predictions.groupby("true").size()
    counts["share of true"] = (counts["count"] / counts["true"].map(totals)).fillna(0.0)
    selected = pick("true", "predicted")
    base = alt.Chart(counts).encode(
        x=alt.X("predicted:N", sort=order, title="predicted"),
        y=alt.Y("true:N", sort=order, title="true shape"))
    cells = base.mark_rect(cursor="pointer", stroke="black").encode(
        color=alt.Color("share of true:Q", scale=alt.Scale(scheme="blues", domain=[0, 1]),
                        legend=alt.Legend(format="%")),
        strokeWidth=alt.condition(selected, alt.value(2.5), alt.value(0), empty=False),
        tooltip=["true", "predicted", "count", alt.Tooltip("share of true:Q", format=".0%")],
    ).add_params(selected)
    text = base.transform_filter("datum.count > 0").mark_text().encode(
        text="count:Q",
        color=alt.condition("datum['share of true'] > 0.5", alt.value("white"),
                            alt.value("black")))
    return (cells + text).properties(
        title=alt.TitleParams(title, subtitle=["click a cell to see its images"]),
        width=320, height=320)
