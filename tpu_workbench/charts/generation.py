"""Charts of generation: ms and compilations per token for each decode strategy, time to first
token vs steady decode, and where the compilations go (prefill / decode).

Every function takes a DataFrame of :class:`tpu_workbench.generation.runs.GenerationComparison`
(``tokens``, ``summary``, or :func:`tpu_workbench.generation.analysis.compiles_by_phase`) and
returns an Altair chart; nothing here runs experiments.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._common import require_columns

STRATEGY_COLORS = alt.Scale(domain=["naive", "dynamic_cache", "static_cache", "bucketed"],
                            scheme="tableau10")
WIDTH = 230  # per mode panel: three modes side by side fit a notebook's width


def _panel(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with ``panel``, each mode's panel title: the mode and, where the frame says,
    where it was measured (``lazy on XLA:CPU``): every time drawn is this machine's."""
    out = frame.copy()
    where = out.get("measured_on")
    out["panel"] = out["mode"] if where is None else out["mode"] + " on " + where
    return out


def _columns(frame: pd.DataFrame) -> alt.Column:
    """A facet column per panel, in the order the runs came (the baseline first)."""
    return alt.Column("panel:N", title=None, sort=list(dict.fromkeys(frame["panel"])))


def _numbered(tokens: pd.DataFrame) -> pd.DataFrame:
    """`tokens` with ``n``, the token's place in its run (requests one after another),
    ``compiles_so_far``, the run's compilations up to and including that token, and
    ``panel`` (:func:`_panel`)."""
    out = _panel(tokens)
    out["n"] = out.groupby("run_id").cumcount()
    out["compiles_so_far"] = out.groupby("run_id")["compiles"].cumsum()
    return out


def ms_per_token(tokens: pd.DataFrame) -> alt.FacetChart:
    """Wall ms of each generated token (log scale), one line per strategy, a panel per mode.

    Columns: ``run_id``, ``mode``, ``strategy``, ``token``, ``phase``, ``wall_ms``,
    ``compiles``."""
    require_columns(tokens, ["run_id", "mode", "strategy", "phase", "wall_ms", "compiles"],
                    "ms_per_token")
    data = _numbered(tokens)
    return (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(x=alt.X("n:Q", title="token of the run", axis=alt.Axis(tickMinStep=1,
                                                                        format="d")),
                y=alt.Y("wall_ms:Q", title="ms per token (log)", scale=alt.Scale(type="log")),
                color=alt.Color("strategy:N", scale=STRATEGY_COLORS,
                                legend=alt.Legend(orient="bottom")),
                tooltip=["strategy", "mode", "request", "token", "phase",
                         alt.Tooltip("wall_ms:Q", format=".3~r"), "compiles"])
        .properties(width=WIDTH, height=220)
        .facet(column=_columns(data))
        .properties(title="ms per token, measured on this machine (token 0 of a request is "
                          "its prefill)")
    )


def compiles_per_token(tokens: pd.DataFrame) -> alt.FacetChart:
    """Compilations in each token, a row per strategy and a panel per mode (a grid rather than
    lines: strategies with equal counts would hide each other). naive and dynamic_cache compile
    at every token; the static strategies at the prefill and the first decode step only.
    Columns: ``run_id``, ``mode``, ``strategy``, ``compiles``."""
    require_columns(tokens, ["run_id", "mode", "strategy", "compiles"], "compiles_per_token")
    data = _numbered(tokens)
    base = alt.Chart(data).encode(
        x=alt.X("n:O", title="token of the run"),
        y=alt.Y("strategy:N", title=None, sort=list(STRATEGY_COLORS.domain)))
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("compiles:O", title="compilations in the token",
                        scale=alt.Scale(range=["#f0f0f0", "#fdae6b", "#e6550d", "#a63603",
                                               "#7f2704"]),
                        legend=alt.Legend(orient="bottom")),
        tooltip=["strategy", "mode", "request", "token", "phase", "compiles",
                 "compiles_so_far"])
    counts = base.mark_text(fontSize=9).encode(
        text=alt.Text("compiles:Q", format="d"),
        color=alt.condition("datum.compiles > 1", alt.value("white"), alt.value("#333")))
    return ((cells + counts).properties(width=WIDTH, height=120)
            .facet(column=_columns(data))
            .properties(title="compilations per token (total so far in the tooltip)"))


def ttft_vs_steady(summary: pd.DataFrame) -> alt.FacetChart:
    """Time to first token (compile included) next to the steady ms per token, per strategy
    (log scale), a panel per mode. Columns: ``mode``, ``strategy``, ``ttft_ms``,
    ``steady_ms_per_token``."""
    require_columns(summary, ["mode", "strategy", "ttft_ms", "steady_ms_per_token"],
                    "ttft_vs_steady")
    data = _panel(summary)
    long = data.melt(id_vars=["mode", "panel", "strategy"], value_vars=["ttft_ms",
                                                                  "steady_ms_per_token"],
                        var_name="what", value_name="ms").dropna(subset=["ms"])
    long["what"] = long["what"].map({"ttft_ms": "time to first token",
                                     "steady_ms_per_token": "steady ms per token"})
    # Dots, not bars: a bar on a log axis has no zero to start from.
    return (
        alt.Chart(long)
        .mark_point(filled=True, size=90, opacity=1)
        .encode(y=alt.Y("strategy:N", title=None, sort=list(STRATEGY_COLORS.domain)),
                yOffset=alt.YOffset("what:N"),
                x=alt.X("ms:Q", title="ms (log)", scale=alt.Scale(type="log")),
                shape=alt.Shape("what:N", title=None, legend=alt.Legend(orient="bottom")),
                color=alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom")),
                tooltip=["mode", "strategy", "what", alt.Tooltip("ms:Q", format=".3~r")])
        .properties(width=WIDTH, height=200)
        .facet(column=_columns(data))
        .properties(title="time to first token vs steady decode (median), measured on this "
                          "machine")
    )


def compiles_by_phase(phases: pd.DataFrame) -> alt.FacetChart:
    """Where the compilations go: prefill vs decode, stacked per strategy, a panel per mode.
    Columns: ``mode``, ``strategy``, ``phase``, ``compiles``."""
    require_columns(phases, ["mode", "strategy", "phase", "compiles"], "compiles_by_phase")
    data = _panel(phases)
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(y=alt.Y("strategy:N", title=None, sort=list(STRATEGY_COLORS.domain)),
                x=alt.X("compiles:Q", title="compilations", axis=alt.Axis(tickMinStep=1,
                                                                          format="d")),
                color=alt.Color("phase:N", scale=alt.Scale(domain=["prefill", "decode"]),
                                legend=alt.Legend(orient="bottom")),
                tooltip=["mode", "strategy", "phase", "compiles",
                         alt.Tooltip("compile_ms:Q", format=".0f")])
        .properties(width=WIDTH, height=140)
        .facet(column=_columns(data))
        .properties(title="where the compilations go")
    )
