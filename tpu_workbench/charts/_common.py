"""What every chart module shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..records import require_columns

__all__ = ["MODE_COLORS", "PICK", "STRATEGY_COLORS", "category_axis", "mode_scale", "pick",
           "require_columns", "save_chart", "strategy_scale"]

# One colour per execution mode in every chart of every notebook (a scheme assigned by order of
# appearance gave `lazy` another colour on each page). Plain PyTorch greys and olive, torch_xla
# warm to blue, TorchTPU browns and cyan. tests/test_mode_charts.py keeps the keys equal to
# runs.spec.MODES.
MODE_COLORS: dict[str, str] = {
    "torch_eager": "#7f7f7f", "inductor": "#bcbd22",
    "eager": "#d62728", "lazy": "#ff7f0e", "compile": "#1f77b4", "dynamo": "#9467bd",
    "tpu_eager": "#8c564b", "tpu_fused": "#e377c2", "tpu_compile": "#17becf",
}
OTHER_COLOR = "#333333"

# One colour per sharding strategy on every page, the same way (dlrm's two charts once gave
# `table` two colours). "single" is a run on one device, the baseline of a side by side.
# tests/test_mode_charts.py keeps the keys equal to sharding.ALL_STRATEGIES.
STRATEGY_COLORS: dict[str, str] = {
    "single": "#7f7f7f",
    "dp": "#4c78a8", "fsdp": "#f58518", "tp": "#54a24b", "dp_tp": "#e45756",
    "fsdp_tp": "#72b7b2", "ep": "#b279a2",
    "table": "#eeca3b", "row": "#9d755d", "column": "#ff9da6",
}


def mode_scale(modes: Any = ()) -> Any:
    """An Altair colour scale giving each mode of `modes` (the values a chart's ``mode`` column
    holds) its colour of :data:`MODE_COLORS`, in that table's order; any other value dark
    grey. Without `modes`, every mode of the table."""
    import altair as alt

    present = list(dict.fromkeys(str(m) for m in modes)) or list(MODE_COLORS)
    domain = [m for m in MODE_COLORS if m in present] + [m for m in present
                                                          if m not in MODE_COLORS]
    return alt.Scale(domain=domain, range=[MODE_COLORS.get(m, OTHER_COLOR) for m in domain])


def strategy_scale(strategies: Any = ()) -> Any:
    """An Altair colour scale giving each strategy of `strategies` its colour of
    :data:`STRATEGY_COLORS`, in the order given; any other value dark grey."""
    import altair as alt

    present = list(dict.fromkeys(str(s) for s in strategies)) or list(STRATEGY_COLORS)
    return alt.Scale(domain=present,
                     range=[STRATEGY_COLORS.get(s, OTHER_COLOR) for s in present])


# Width of one character of an axis label (Vega's 10 px sans-serif), with room between labels.
LABEL_PX = 7


def category_axis(values: Any, width_px: float, **kwargs: Any) -> Any:
    """An x axis for the categories `values` on a chart `width_px` wide whose labels never run
    into each other ("dp_tpfsdp_tp"): level where every label fits its band, slanted where
    not."""
    import altair as alt

    labels = [str(v) for v in dict.fromkeys(values)] or [""]
    band = width_px / len(labels)
    fits = max(len(label) for label in labels) * LABEL_PX + 6 <= band
    return alt.Axis(labelAngle=0 if fits else -35, labelAlign="center" if fits else "right",
                    **kwargs)


def save_chart(chart: Any, out: Path, name: str) -> list[Path]:
    """Write `chart` as ``out/name.html`` (interactive) and ``out/name.png`` (vl-convert, 2x)."""
    written = []
    for ext in ("html", "png"):
        path = Path(out) / f"{name}.{ext}"
        chart.save(str(path), **({"scale_factor": 2} if ext == "png" else {}))
        written.append(path)
    return written


# The name of the click selection a chart offers: wrapped in ``mo.ui.altair_chart``, the rows a
# reader clicked come back as the widget's ``.value`` (marimo's idiom for a chart as a control).
PICK = "pick"


def pick(*fields: str) -> Any:
    """A click (point) selection over `fields`, named :data:`PICK`; shift-click adds more."""
    import altair as alt

    return alt.selection_point(name=PICK, fields=list(fields))
