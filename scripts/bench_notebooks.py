#!/usr/bin/env python3
"""How fast do the notebooks answer a reader? `marimo edit` in headless Chromium, timed.

For each notebook, each repetition:
  first open   a fresh `marimo edit` server and an empty results folder: seconds from opening the
               page to the first chart drawn, and to every cell idle (nothing running or queued);
  re-open      a new server on the same results folder, so stored runs are reused: seconds to idle;
  change+run   on that page, one control changed and its run button pressed: seconds to idle.
Every row also says how many worker processes started (the runner's TPU_WORKBENCH_WORKER_LOG).
`--notebooks floor` times marimo's own floor on this machine: a notebook of one cell that
imports what the workbench's setup cells import (marimo, pandas, altair) and draws one bar chart.
No notebook can open faster than that here. `floor_cells` is that floor with as many cells as
the quickstart (22; 21 of one line of text): what marimo spends per cell, with nothing to compute.
`--notebooks PATH.py` times any notebook (first open and re-open).
Times start when the page is opened (the server is already up: see the `server start` row), in
a 1400x900 window (`--height`).

    .venv/bin/python scripts/bench_notebooks.py --repeat 3 \
        --notebooks floor,floor_cells,quickstart,sharding
    .venv/bin/python scripts/bench_notebooks.py --repeat 1 --notebooks quickstart --json b.json

A benchmark, not a test: it reports, it does not judge. Run it on an idle machine; the load
average is printed at start and end so a busy machine shows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshot_notebooks import JS_BUSY, ROOT, browser, marimo_edit, wait_idle  # noqa: E402

# Charts drawn, counted through a Playwright locator: its CSS engine pierces the shadow roots
# that marimo draws some charts in (a chart shown with mo.output.replace or inside mo.vstack),
# which document.querySelectorAll does not see.
CHARTS = ".vega-embed canvas, .vega-embed svg"
JS_WIDE = "els => els.filter(e => e.getBoundingClientRect().width > 50).length"

# The control each benchmark changes (by its label text), and the button that runs it.
# quickstart: the steps of the training form; sharding: the strategy form's pick.
INTERACTIONS = {
    "quickstart": {"label": "steps", "button": r"^(run|train|measure)"},
    "sharding": {"label": "strategy", "button": r"^run$", "value": "fsdp"},
    "floor": None,  # FLOOR below: nothing to change
    "floor_cells": None,  # FLOOR and 21 cells of one line of text: marimo's cost per cell
}
FLOOR = '''import marimo

app = marimo.App()


@app.cell
def _():
    import altair as alt
    import marimo as mo
    import pandas as pd

    alt.Chart(pd.DataFrame({"x": [1, 2, 3], "y": [3, 1, 2]})).mark_bar().encode(x="x:O", y="y:Q")
    return


if __name__ == "__main__":
    app.run()
'''
# The floor with as many cells as the quickstart (22): what marimo itself spends per cell (an
# editor, a status, an output each), with one chart and nothing else to compute or draw.
FLOOR_CELLS = FLOOR.replace("\n\nif __name__", "".join(f'''

@app.cell
def _():
    import marimo as _mo

    _mo.md("Cell {i}: one line of narrative text.")
    return
''' for i in range(1, 22)) + "\n\nif __name__")


def _worker_starts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _first_chart(page, t0: float, timeout_s: float) -> float | None:
    """Seconds from t0 until a chart is drawn (None if the page goes idle without one)."""
    deadline = time.monotonic() + timeout_s
    seen_busy, idle_at = False, None
    while time.monotonic() < deadline:
        if page.locator(CHARTS).evaluate_all(JS_WIDE):
            return time.monotonic() - t0
        busy = page.evaluate(JS_BUSY)
        if seen_busy and not busy:
            # the browser may still be drawing charts seconds after their cells finished
            idle_at = idle_at or time.monotonic()
            if time.monotonic() - idle_at > 20:
                return None
        seen_busy = seen_busy or busy > 0
        page.wait_for_timeout(50)
    raise TimeoutError("no chart and no run")


def _control(page, label: str):
    """The first control whose label reads exactly `label`, and its kind (select, slider, input).
    marimo ties each label to its control by aria, so get_by_label finds it; for a slider it
    matches the track and the thumb, and the thumb (role=slider) takes the keys."""
    kind_of = ("e => e.getAttribute('role') === 'slider' ? 'slider' : e.tagName === 'SELECT' ? "
               "'select' : ['INPUT', 'TEXTAREA'].includes(e.tagName) ? 'input' : ''")
    for ctl in page.get_by_label(label, exact=True).all():
        kind = ctl.evaluate(kind_of)
        if kind:
            return ctl, kind
    raise LookupError(f"no control labelled {label!r}")


def change_and_run(page, label: str, button: str, value: str | None = None) -> str:
    """Change the control labelled `label` and press the nearest button matching `button`;
    returns what was done, for the report."""
    ctl, kind = _control(page, label)
    if kind == "select":
        options = ctl.locator("option").all_inner_texts()
        current = ctl.evaluate("e => e.options[e.selectedIndex].text")
        new = value if value in options and value != current else next(
            o for o in options if o != current)
        ctl.select_option(label=new)
        done = f"{label}: {current} -> {new}"
    elif kind == "slider":
        before = ctl.get_attribute("aria-valuenow")
        ctl.focus()
        page.keyboard.press("ArrowRight")
        done = f"{label}: {before} -> {ctl.get_attribute('aria-valuenow')}"
    else:
        before = ctl.input_value()
        new = value or str(int(float(before or 0)) + 5)
        ctl.fill(new)
        ctl.press("Tab")
        done = f"{label}: {before} -> {new}"
    # Its run button: its own form's, else the first matching button in its row or below.
    forms = page.locator("marimo-form").filter(has=page.get_by_label(label, exact=True))
    # the form of the control changed: the first with that label, as `_control` picks (the
    # sharding notebook has three forms with a "strategy")
    own = (forms.first.get_by_role("button", name=re.compile(button, re.I))
           if forms.count() else None)
    if own is not None and own.count():
        own.first.click()
        return done
    buttons = page.get_by_role("button", name=re.compile(button, re.I))
    row = ctl.bounding_box()["y"] - 40
    boxes = [(box["y"], box["x"], b) for b in buttons.all() if (box := b.bounding_box())]
    below = [b for y, _, b in sorted(boxes, key=lambda t: t[:2]) if y >= row]
    if not below:
        raise LookupError(f"no button matching {button!r} near {label!r}")
    below[0].click()
    return done


def one_repetition(name: str, timeout_s: float, env: dict[str, str],
                   height: int = 900) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tpu-workbench-bench-"))
    notebook = Path(name) if name.endswith(".py") else ROOT / "notebooks" / f"{name}.py"
    if name in ("floor", "floor_cells"):  # beside a pyproject that runs it on open, as the
        notebook = work / f"{name}.py"     # project's does
        notebook.write_text(FLOOR if name == "floor" else FLOOR_CELLS)
        (work / "pyproject.toml").write_text("[tool.marimo.runtime]\nauto_instantiate = true\n")
    log = work / "workers.log"
    env = {**env, "TPU_WORKBENCH_RESULTS": str(work / "results"),
           "TPU_WORKBENCH_WORKER_LOG": str(log)}
    row: dict = {"notebook": name}
    try:
        with browser() as b:
            for phase in ("first", "reopen"):
                t_server = time.monotonic()
                with marimo_edit(notebook, env) as url:
                    row[f"{phase}_server_s"] = time.monotonic() - t_server
                    # A laptop-sized window: a tall one (8000 px) made headless Chromium, which
                    # paints in software on these same 2 cores, slow the kernel's runs by ~40%.
                    page = b.new_page(viewport={"width": 1400, "height": height})
                    starts = _worker_starts(log)
                    t0 = time.monotonic()
                    page.goto(url)
                    chart = _first_chart(page, t0, timeout_s)
                    idle = wait_idle(page, timeout_s, saw_busy=True)
                    row[f"{phase}_chart_s"] = chart
                    row[f"{phase}_idle_s"] = idle - t0
                    row[f"{phase}_workers"] = _worker_starts(log) - starts
                    if phase == "reopen" and INTERACTIONS.get(name):
                        row["reopen_reused_labels"] = page.evaluate(
                            "() => (document.body.innerText.match(/Reused/g) || []).length")
                        spec = INTERACTIONS[name]
                        starts = _worker_starts(log)
                        t0 = time.monotonic()
                        row["change"] = change_and_run(page, spec["label"], spec["button"],
                                                       spec.get("value"))
                        row["change_idle_s"] = wait_idle(page, timeout_s) - t0
                        row["change_workers"] = _worker_starts(log) - starts
                    page.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return row


COLUMNS = [("first open: chart", "first_chart_s"), ("first open: idle", "first_idle_s"),
           ("re-open: idle", "reopen_idle_s"), ("change+run: idle", "change_idle_s"),
           ("server start", "first_server_s")]
COUNTS = [("workers first", "first_workers"), ("workers re-open", "reopen_workers"),
          ("workers change", "change_workers"), ("'Reused' labels", "reopen_reused_labels")]


def summarize(rows: list[dict]) -> str:
    lines = ["| notebook | measure | median | min-max | n |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(r["notebook"] for r in rows):
        mine = [r for r in rows if r["notebook"] == name]
        for title, key in COLUMNS + COUNTS:
            if not any(key in r for r in mine):  # the floor changes nothing
                continue
            vals = [r[key] for r in mine if r.get(key) is not None]
            if not vals:
                lines.append(f"| {name} | {title} | - | - | 0 |")
                continue
            fmt = "{:.1f} s" if key.endswith("_s") else "{:g}"
            lines.append(f"| {name} | {title} | {fmt.format(statistics.median(vals))} | "
                         f"{fmt.format(min(vals))}-{fmt.format(max(vals))} | {len(vals)} |")
        changes = sorted({r["change"] for r in mine if "change" in r})
        if changes:
            lines.append(f"| {name} | control changed | {'; '.join(changes)} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="repetitions per notebook (default 3)")
    ap.add_argument("--notebooks", default="floor,quickstart,sharding",
                    help=f"comma-separated, from: {', '.join(INTERACTIONS)}; or a notebook's "
                         "path (first open and re-open only: no control is changed)")
    ap.add_argument("--timeout", type=float, default=900, metavar="S",
                    help="seconds to wait for any one phase (default 900)")
    ap.add_argument("--smoke", action="store_true",
                    help="TPU_WORKBENCH_SMOKE=1: checks this script quickly (smoke runs never "
                         "reuse, so re-open times are not meaningful)")
    ap.add_argument("--height", type=int, default=900, metavar="PX",
                    help="browser window height (default 900, a laptop's; width 1400)")
    ap.add_argument("--json", type=Path, help="also write the raw rows and the load to FILE")
    args = ap.parse_args(argv)
    # On SIGTERM (timeout, kill) unwind, so the marimo servers and their workers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [n.strip() for n in args.notebooks.split(",") if n.strip()]
    unknown = [n for n in names if n not in INTERACTIONS
               and not (n.endswith(".py") and Path(n).is_file())]
    if unknown:
        ap.error(f"unknown notebook(s): {', '.join(unknown)} (valid: {', '.join(INTERACTIONS)}, "
                 "or the path of a notebook file ending in .py)")
    env = {**os.environ, **({"TPU_WORKBENCH_SMOKE": "1"} if args.smoke else {})}
    load_start = os.getloadavg()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load_start)} "
          f"({os.cpu_count()} cores)", flush=True)
    rows = []
    for rep in range(1, args.repeat + 1):
        for name in names:
            row = one_repetition(name, args.timeout, env, args.height)
            rows.append({"repetition": rep, **row})
            print(json.dumps(rows[-1]), flush=True)
    load_end = os.getloadavg()
    print()
    print(summarize(rows))
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in load_end)}")
    if args.json:
        args.json.write_text(json.dumps({"load_start": load_start, "load_end": load_end,
                                         "cores": os.cpu_count(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
