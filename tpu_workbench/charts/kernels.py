"""Charts of the Pallas kernels in ``kernels/``: what each grid step holds in VMEM, which tiles
of the score matrix are computed or skipped, and the numerical check against the references.

Every function takes a DataFrame with the documented columns (from :mod:`kernels.tiling` and
:mod:`kernels.check`) and returns an Altair chart; nothing here runs a kernel.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import require_columns

STATES = ["computes", "skipped (block kept for the next q block)", "padding"]
STATE_COLORS = ["#4c78a8", "#c7c7c7", "#f58518"]
TILE_STATES = ["computed", "computed, partly masked", "skipped"]
TILE_COLORS = ["#4c78a8", "#9ecae9", "#e5e5e5"]


def kernel_schedule(schedule: pd.DataFrame, step: int | None = None,
                    title: str = "what each grid step holds in VMEM") -> alt.FacetChart:
    """One bar per (grid step, operand) over the rows of that operand resident in VMEM.

    Columns (of :func:`kernels.tiling.attention_schedule`): ``step``, ``q_block``,
    ``kv_block``, ``computes``, ``operand``, ``row_start``, ``row_end``, ``valid_end``,
    ``fetched``. Rows past ``valid_end`` are drawn as padding; `step`, if given, is outlined.
    """
    require_columns(schedule, ["step", "q_block", "kv_block", "computes", "operand", "row_start",
                               "row_end", "valid_end", "fetched"], "kernel_schedule")
    base = schedule.assign(
        state=schedule["computes"].map({True: STATES[0], False: STATES[1]}),
        x2=schedule["valid_end"],
        copy=schedule["fetched"].map({True: "copied from HBM", False: "already in VMEM"}))
    pad = schedule[schedule["valid_end"] < schedule["row_end"]].assign(
        state=STATES[2], row_start=lambda d: d["valid_end"], x2=lambda d: d["row_end"],
        copy="padding rows")
    frame = pd.concat([base, pad], ignore_index=True)
    frame["current"] = frame["step"] == (-1 if step is None else step)
    frame["grid_step"] = ("(" + frame["q_block"].astype(str) + ", "
                          + frame["kv_block"].astype(str) + ")")
    n_steps = int(schedule["step"].nunique())
    return alt.Chart(frame).mark_bar(height={"band": 0.8}).encode(
        x=alt.X("row_start:Q", title="rows held (sequence position)"),
        x2="x2:Q",
        y=alt.Y("step:O", title="grid step (kv innermost)", sort="ascending"),
        color=alt.Color("state:N", scale=alt.Scale(domain=STATES, range=STATE_COLORS),
                        legend=alt.Legend(title=None, orient="bottom", labelLimit=400)),
        opacity=alt.condition("datum.fetched", alt.value(1.0), alt.value(0.55)),
        stroke=alt.condition("datum.current", alt.value("black"), alt.value(None)),
        strokeWidth=alt.condition("datum.current", alt.value(2.5), alt.value(0)),
        tooltip=["step", "grid_step", "operand", "row_start", "x2", "state", "copy"],
    ).properties(width=170, height=min(max(22 * n_steps, 120), 400)).facet(
        column=alt.Column("operand:N", sort=["Q", "K", "V", "O"], title=None),
    ).properties(title=alt.TitleParams(title, subtitle=[
        "grid step (i, j) = (q block, kv block); faded = block already in VMEM (no copy)"]))


def score_tiles(tiles: pd.DataFrame, step: int | None = None,
                title: str = "tiles of the score matrix S = Q K^T") -> alt.LayerChart:
    """The (q block x kv block) tiles of the score matrix, coloured computed / partly masked /
    skipped and labelled with the grid step that handles them; `step` is outlined.

    Columns (of :func:`kernels.tiling.score_tiles`): ``step``, ``q_block``, ``kv_block``,
    ``q_start``, ``q_end``, ``k_start``, ``k_end``, ``status``.
    """
    require_columns(tiles, ["step", "q_block", "kv_block", "q_start", "q_end", "k_start", "k_end",
                            "status"], "score_tiles")
    frame = tiles.assign(current=tiles["step"] == (-1 if step is None else step),
                         q_mid=(tiles["q_start"] + tiles["q_end"]) / 2,
                         k_mid=(tiles["k_start"] + tiles["k_end"]) / 2)
    size = 300
    x = alt.X("k_start:Q", title="key position (K, V rows)", scale=alt.Scale(nice=False))
    y = alt.Y("q_start:Q", title="query position (Q, O rows)",
              scale=alt.Scale(reverse=True, nice=False))
    rects = alt.Chart(frame).mark_rect().encode(
        x=x, x2="k_end:Q", y=y, y2="q_end:Q",
        color=alt.Color("status:N", scale=alt.Scale(domain=TILE_STATES, range=TILE_COLORS),
                        legend=alt.Legend(title=None, orient="bottom")),
        stroke=alt.condition("datum.current", alt.value("black"), alt.value("white")),
        strokeWidth=alt.condition("datum.current", alt.value(3), alt.value(1)),
        tooltip=["step", "q_block", "kv_block", "q_start", "q_end", "k_start", "k_end",
                 "status"])
    labels = alt.Chart(frame).mark_text(fontSize=11).encode(
        x="k_mid:Q", y="q_mid:Q", text="step:Q")
    return (rects + labels).properties(width=size, height=size, title=alt.TitleParams(
        title, subtitle=["label = grid step; padded rows and columns are not drawn"]))


def kernel_errors(table: pd.DataFrame,
                  title: str = "kernel vs reference: relative error") -> alt.HConcatChart:
    """Relative error per checked case (log scale) with each dtype's tolerance as a tick.
    An error of exactly 0 (kernel and reference equal bit for bit) has no place on a log
    axis: it is drawn in a column of its own, "exact (0)", left of the axis, never at a floor
    that would read as a small error.

    Columns (of :func:`kernels.check.check_attention` / ``check_rmsnorm``): ``kernel``,
    ``dtype``, ``shape``, ``blocks``, ``rel_error``, ``tolerance``.
    """
    require_columns(table, ["kernel", "dtype", "shape", "blocks", "rel_error", "tolerance"],
                    "kernel_errors")
    frame = table.assign(case=table["kernel"] + " " + table["dtype"] + " " + table["shape"]
                         + " " + table["blocks"], exact=table["rel_error"] == 0,
                         where="exact (0)")
    cases = list(dict.fromkeys(frame["case"]))
    color = alt.Color("dtype:N", legend=alt.Legend(orient="bottom"))
    tooltip = ["kernel", "dtype", "shape", "blocks", "rel_error", "tolerance"]
    exact = alt.Chart(frame).mark_point(filled=True, size=70, shape="diamond").encode(
        x=alt.X("where:N", title=None, axis=alt.Axis(labelAngle=0, orient="top")),
        y=alt.Y("case:N", title=None, sort=cases, scale=alt.Scale(domain=cases),
                axis=alt.Axis(labelLimit=420)),
        color=color, tooltip=tooltip,
        opacity=alt.condition("datum.exact", alt.value(1.0), alt.value(0.0)),
    ).properties(width=60)
    y = alt.Y("case:N", title=None, sort=cases, scale=alt.Scale(domain=cases), axis=None)
    x = alt.X("rel_error:Q", scale=alt.Scale(type="log", domain=[1e-9, 1]),
              axis=alt.Axis(values=[1e-9, 1e-7, 1e-5, 1e-3, 1e-1], format=".0e"),
              title="max |kernel - reference| / max |reference|")
    points = alt.Chart(frame[~frame["exact"]]).mark_point(filled=True, size=70).encode(
        x=x, y=y, color=color, tooltip=tooltip)
    ticks = alt.Chart(frame).mark_tick(thickness=2, size=14).encode(
        x=alt.X("tolerance:Q"), y=y, color="dtype:N")
    errors = (ticks + points).properties(width=330)
    return alt.hconcat(exact, errors, spacing=4).resolve_scale(y="shared").properties(
        title=alt.TitleParams(title, subtitle=[
            "ticks: the tolerance the tests assert for that dtype; diamonds left of the axis: "
            "an error of exactly 0"]))
