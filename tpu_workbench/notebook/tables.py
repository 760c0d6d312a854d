"""How results read on a page: rounded tables that wrap, program text that is never cut off,
clicked rows, failed runs as callouts, a config as a form, what ran outside XLA in words."""

from __future__ import annotations

import html
import math
import os
import re
from typing import Any

from .sections import FRESH_ENV, RUN_FAILED


def failed_run_callout(name: str, error: object):
    """A danger callout for a run (or a check) that failed: `name`, then the error. Its text
    begins with :data:`RUN_FAILED`, which :func:`tpu_workbench.docs.exported_problems` reports
    as a problem, so a failed run never passes unnoticed in an exported notebook."""
    import marimo as mo

    text = str(error).strip()
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    first, _, rest = (text or "no error message").partition("\n")
    body = (f"<p><strong>{RUN_FAILED}</strong> <code>{html.escape(name)}</code>: "
            f"{html.escape(' '.join(first.split()))}</p>")
    if rest.strip():
        body += f"<pre>{html.escape(rest.strip())}</pre>"
    return mo.callout(mo.Html(body), kind="danger")


def run_failures(comparison, summary=None) -> list:
    """A :func:`failed_run_callout` per failed run of `comparison` (a
    :class:`~tpu_workbench.runs.experiments.Comparison`), and one more when `summary` is given and
    empty although nothing reported a failure: runs were expected, so no rows is a failure."""
    shown = [failed_run_callout(name, err) for name, err in comparison.errors.items()]
    if summary is not None and not len(summary) and not shown:
        shown.append(failed_run_callout(
            "summary", f"no summary rows from {len(comparison.results)} finished run(s)"))
    return shown


def _round_value(value, decimals: int, significant: int):
    if value is None or value != value or value in (float("inf"), float("-inf")) or value == 0:
        return value
    if abs(value) >= 1:
        return round(value, decimals)
    return round(value, max(decimals, significant - 1 - math.floor(math.log10(abs(value)))))


def rounded(frame, decimals: int = 2, significant: int = 3):
    """A copy of DataFrame `frame` with its float columns rounded for display: `decimals`
    places where a value is at least 1 in magnitude (889.5176730000003 -> 889.52), `significant`
    digits below (0.00012345 -> 0.000123). Other columns are left as they are."""
    import pandas as pd

    out = frame.copy()
    for i in range(out.shape[1]):
        column = out.iloc[:, i]
        if pd.api.types.is_float_dtype(column):
            out.isetitem(i, column.map(
                lambda v: v if pd.isna(v) else _round_value(float(v), decimals, significant)))
    return out


# Attribute of a small table drawn as plain HTML (:func:`table`): its label, so that the docs
# build and the tests read it back like marimo's own tables (docs.exported_tables).
STATIC_TABLE = "data-tpu-table"
# The most rows a table of the static site holds (a longer one says how many it left out).
EXPORTED_ROWS = 200
# mo.ui.table options that only an interactive table has: a table given one stays interactive.
_INTERACTIVE = {"selection", "initial_selection", "on_change", "pagination", "freeze_columns_left",
                "freeze_columns_right", "show_download", "text_justify_columns"}


def table(frame, **kwargs):
    """DataFrame `frame` as a table, its floats :func:`rounded`, long text wrapped and a
    filtered frame's index dropped. A table that fits one page (``page_size`` rows, 10 by
    default) and selects nothing is plain HTML: a reader reads it whole, and it draws at once
    (marimo's interactive table took 0.6-0.7 s of a busy 2-core machine to draw three rows, a
    third of the quickstart's re-open). Larger ones, and ones asked for a ``selection``, are
    ``mo.ui.table`` (paged, sortable, searchable). Every table the notebooks show goes through
    here."""
    import marimo as mo
    import pandas as pd

    shown = rounded(frame)
    if shown.index.name is None and not shown.index.equals(pd.RangeIndex(len(shown))):
        shown = shown.reset_index(drop=True)  # a filtered frame's index is no column to show
    if kwargs.get("selection") is None and not _INTERACTIVE & {
            k for k, v in kwargs.items() if v is not None} and len(shown) <= kwargs.get(
            "page_size", 10):
        return static_table(shown, kwargs.get("label"))
    kwargs.setdefault("selection", None)
    if os.environ.get(FRESH_ENV) == "1":
        # A static page holds only a table's first page ("Showing the first 6 of 8 rows"):
        # the site's page holds every row, up to EXPORTED_ROWS, in pages of the same size.
        kwargs["page_size"] = min(len(shown), EXPORTED_ROWS) or 1
    # Text columns wrap instead of ending in "...": an HLO line or a reason is read whole.
    long_text = [c for c in shown.columns
                 if (shown[c].dtype == object or pd.api.types.is_string_dtype(shown[c]))
                 and shown[c].map(lambda v: isinstance(v, str) and len(v) > 40).any()]
    kwargs.setdefault("wrapped_columns", [str(c) for c in long_text])
    return mo.ui.table(shown, **kwargs)


def _cell(value) -> str:
    """One value of a static table as text: thousands separated, nothing for a missing one."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"  # 197.0 reads 197, as marimo's own tables show it
    if isinstance(value, int | float):
        return f"{value:,}"
    return str(value)


def static_table(frame, label: str | None = None):
    """`frame` as a plain HTML table under its `label` (markdown), numbers right-aligned."""
    import marimo as mo
    import pandas as pd

    numeric = {c: pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(
        frame[c]) for c in frame.columns}

    def td(column, value, tag="td") -> str:
        align = "right" if numeric[column] else "left"
        return (f'<{tag} style="text-align:{align};padding:2px 10px;vertical-align:top;'
                f'border-bottom:1px solid #e5e7eb">{html.escape(_cell(value))}</{tag}>')

    head = "".join(td(c, str(c), "th") for c in frame.columns)
    body = "".join("<tr>" + "".join(td(c, v) for c, v in zip(frame.columns, row, strict=True))
                   + "</tr>" for row in frame.itertuples(index=False))
    caption = mo.md(label).text if label else ""
    words = " ".join(re.sub(r"<[^>]*>", "", caption).split())  # the label as a reader reads it
    return mo.Html(
        f'<div style="overflow-x:auto;margin:4px 0"><table {STATIC_TABLE}="'
        f'{html.escape(words, quote=True)}" style="border-collapse:collapse;'
        f'font-size:0.875rem"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        f'<div style="font-size:0.8rem;color:#6b7280;margin-top:2px">{caption}</div></div>')


def format_us(us: float) -> str:
    """A duration given in microseconds, in the unit its size calls for: ``0.42 µs``,
    ``12.3 µs``, ``4.56 ms``, ``1.2 s``, ``6.1 min`` from two minutes on (three significant
    digits)."""
    if us != us:
        return "? µs"
    if abs(us) >= 120e6:
        return f"{us / 60e6:,.3g} min"
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if abs(us) >= scale * 0.9995:  # 999.96 µs reads 1 ms, not 1e+03 µs
            return f"{us / scale:,.3g} {unit}"
    return f"{us:.3g} µs"


def code_block(text: str, max_height_px: int = 320):
    """`text` (HLO, a launch command) shown whole: wrapped at the page's width and scrolling
    past `max_height_px`, never cut off with an ellipsis."""
    import marimo as mo

    return mo.Html(
        f'<pre style="white-space: pre-wrap; word-break: break-all; max-height: '
        f'{max_height_px}px; overflow-y: auto; font-size: 12px; background: #f6f6f6; '
        f'padding: 8px; border-radius: 4px">{html.escape(text)}</pre>')


def picked(chart, column: str) -> list:
    """The values of `column` in the rows a reader clicked in `chart` (a
    ``mo.ui.altair_chart``), in order and without repeats: empty until something is clicked."""
    value = getattr(chart, "value", None)
    if value is None or not len(value) or column not in value:
        return []
    return list(dict.fromkeys(value[column].tolist()))


def config_form(fields: dict[str, Any], label: str = "use this config"):
    """A form of a config's editable fields under their own names: a number box per int or
    float, a checkbox per bool, a text box per string. ``.value`` is None until submitted,
    then ``{field: value}``. `label`: the submit button's."""
    import marimo as mo

    def control(name: str, value: Any):
        if isinstance(value, bool):
            return mo.ui.checkbox(value=value, label=f"`{name}`")
        if isinstance(value, int):
            return mo.ui.number(value=value, start=1, step=1, label=f"`{name}`")
        if isinstance(value, float):
            return mo.ui.number(value=value, label=f"`{name}`")
        if isinstance(value, str):
            return mo.ui.text(value=value, label=f"`{name}`")
        raise TypeError(f"config field {name!r} = {value!r}: a form takes bool, int, float or "
                        "str fields")

    elements = {name: control(name, value) for name, value in fields.items()}
    # field names are Python identifiers (a config class's __init__ parameters): template keys
    template = " &emsp; ".join(f"{{{name}}}" for name in elements)
    return mo.md(template).batch(**elements).form(submit_button_label=label, bordered=False)


def outside_xla_text(outside) -> str:
    """Markdown: what :func:`tpu_workbench.fallbacks` found, saying which modes measured each
    kind (CPU fallbacks: torch_xla's modes; graph breaks: dynamo and inductor) and, where no
    run measured graph breaks, that none was looked for rather than that there are none; then
    one bullet per op or break found (where, how often, what it means), wrapped in full."""
    if not len(outside):
        return ("_No run above measures this: plain PyTorch counts neither CPU fallbacks nor "
                "graph breaks. Pick `lazy` or `compile` (fallbacks) and `dynamo` (graph "
                "breaks) in **modes**._")
    parts = []
    for kind, what in (("fallback", "CPU fallbacks"), ("graph_break", "graph breaks")):
        rows = outside[outside["kind"] == kind]
        if not len(rows):
            parts.append("graph breaks not measured (only mode `dynamo` counts them, and it "
                         "was not among the modes run above)" if kind == "graph_break" else
                         "CPU fallbacks not measured (no torch_xla mode was run)")
            continue
        found = rows[rows["count"] > 0]
        modes = ", ".join(f"`{m}`" for m in dict.fromkeys((found if len(found) else rows)["mode"]))
        parts.append(f"**{len(found)} kind(s) of {what}** in {modes}" if len(found) else
                     f"**no {what}** in {modes}")
    found = outside[outside["count"] > 0]
    return "; ".join(parts) + "." + "".join("\n\n" + _outside_item(r) for r in
                                          found.to_dict("records"))


def _outside_item(row: dict) -> str:
    """One bullet of :func:`outside_xla_text`: an op or a break, where, how often, its note."""
    if row["kind"] == "fallback":
        head = (f"- **CPU fallback** `{row['op']}` (mode `{row['mode']}`): {row['count']} "
                f"call(s), {row['per_step']:g} per step, steps {row['steps']}")
    else:
        where = f" at `{row['where']}`" if row.get("where") else ""
        line = f": `{' '.join(str(row['line']).split())}`" if row.get("line") else ""
        head = (f"- **graph break** ({row['op']}, mode `{row['mode']}`){where}{line}; "
                f"{row['count']} time(s), step(s) {row['steps']}")
    return f"{head}: {row['note']}." if row.get("note") else f"{head}."


def run_failures_of_sweep(swept):
    """A danger callout listing why no run of a sweep finished, or None when some did."""
    import marimo as mo

    if not swept.summary.empty:
        return None
    return mo.callout(mo.md("No run of the sweep finished:\n\n" + "\n".join(
        f"- {e}" for e in swept.errors.values())), kind="danger")


def example_model(name: str) -> str | None:
    """The model ref of the example user model `tests/models/<name>.py` of this checkout
    (``<absolute path>:make``), or None where the checkout has no such file (an installed
    package)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tests" / "models" / f"{name}.py"
    return f"{path}:make" if path.is_file() else None


def tpu_reason(status) -> str:
    """Why a TPU is or is not used here, in words a reader can act on: "no TPU chip attached
    to this machine" where none is (the PCI scan's vendor id is no reader's business), else
    the reason of `status` (:func:`tpu_workbench.tpu_status`)."""
    if not status.available and not status.chips:
        return "no TPU chip attached to this machine"
    return status.reason
