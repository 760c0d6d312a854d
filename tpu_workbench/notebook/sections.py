"""When and how a notebook's sections measure: smoke and reuse, :class:`Sections` (measure on
open, reuse a stored run, then only on the run button), live runs drawn as they stream, and
the line that says where a result came from."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

SMOKE_ENV = "TPU_WORKBENCH_SMOKE"


# Set by the docs export: every page measures afresh instead of reusing stored runs.
FRESH_ENV = "TPU_WORKBENCH_FRESH"


# Begins every failed-run callout; `docs.exported_problems` reports each one it finds in an
# exported page, so a notebook that shows a failed run fails the docs build and its test.
RUN_FAILED = "tpu-workbench run failed:"

# Marks every callout of a section that waits for a click instead of showing its answer
# (:func:`waiting_callout`); `docs.exported_problems` refuses a page that holds one. Exercises
# waiting for an answer are not sections and do not carry it.
WAITS = 'data-tpu-workbench="waits"'


def smoke_mode() -> bool:
    """True for quick CI runs: ``TPU_WORKBENCH_SMOKE=1``, or ``-- --smoke`` after a notebook."""
    if os.environ.get(SMOKE_ENV) == "1":
        return True
    try:
        import marimo as mo

        return "smoke" in mo.cli_args()  # a bare `--smoke` parses to "" (falsy), so test `in`
    except Exception:  # no marimo runtime (plain import)
        return False


def reuse_ok() -> bool:
    """Whether a notebook may show stored runs instead of measuring again: not in smoke runs
    (CI) nor when ``TPU_WORKBENCH_FRESH=1`` (the docs export), which always measure afresh."""
    return not smoke_mode() and os.environ.get(FRESH_ENV) != "1"


def warm_for(specs: list, cold: bool = False) -> bool:
    """Start the worker template now, from a notebook's setup cell, where a section will measure
    `specs` when the page opens: its ``import torch`` (seconds of CPU) then overlaps the cells
    before that run instead of delaying its first chart. Nothing where every spec has a stored
    run to show (a re-open must not pay for a template it does not use). Returns whether it
    started one."""
    from ..runs.store import reusable
    from ..runs.template import warm

    if reuse_ok() and all(reusable(s, cold=cold) for s in specs):
        return False
    warm()
    return True


def waiting_callout(text: str):
    """The callout a section shows while it waits for a click (markdown `text`), marked with
    :data:`WAITS` so that a static page still waiting fails the docs build."""
    import marimo as mo

    return mo.callout(mo.md(f"{text} <span {WAITS}></span>"), kind="info")


class Sections:
    """When each section of a notebook measures: on its first run after the notebook opens
    (showing a stored run of the same settings instead, if this environment measured one), then
    only when its run button is pressed (always measuring afresh). A control changed in between
    shows a stored run of the new settings if there is one, and otherwise waits.

    A waiting section shows what it waits for as its cell's output and returns None instead of
    calling ``mo.stop``: every cell below a stopped one would show marimo's "Ancestor stopped"
    box. One instance per notebook, made in its setup cell."""

    def __init__(self) -> None:
        self._opened: set[str] = set()

    def reuse(self, name: str, clicked: bool, stored: Callable[[], bool] = lambda: False,
              waiting: str = "Press **run** above to measure with these settings.") -> bool | None:
        """The ``reuse`` flag for section `name`'s run now, or None where it must wait (the
        `waiting` callout is then the cell's output). `clicked`: its run button's value;
        `stored()`: whether stored runs of the current settings exist (asked only when that
        decides)."""
        first = name not in self._opened
        self._opened.add(name)
        reuse = reuse_ok() and not clicked
        if first or clicked or (reuse and stored()):
            return reuse
        import marimo as mo

        mo.output.replace(waiting_callout(waiting))
        return None

    def run_live(self, name: str, button: Any, specs: list, cold: bool = False,
                 waiting: str = "Press **run** above to train with these settings.", **kwargs):
        """:func:`run_live` of `specs` (a Comparison) under :meth:`reuse`'s rule, or None while
        waiting. `button`: the section's ``mo.ui.run_button``."""
        from ..runs.store import reusable

        reuse = self.reuse(name, bool(button.value),
                           lambda: all(reusable(s, cold=cold) for s in specs), waiting)
        return None if reuse is None else run_live(specs, cold=cold, reuse=reuse, **kwargs)

    def run(self, name: str, button: Any, spec: Any, title: str = "measuring",
            waiting: str = "Press **run** above to measure with these settings."):
        """One run of `spec` (a RunResult) under :meth:`reuse`'s rule with a spinner titled
        `title`, or None while waiting."""
        import marimo as mo

        from ..runs.runner import run
        from ..runs.store import reusable

        reuse = self.reuse(name, bool(button.value), lambda: reusable(spec) is not None,
                           waiting)
        if reuse is None:
            return None
        with mo.status.spinner(title=title):
            return run(spec, reuse=reuse)


def _where(result) -> str:
    info = result.runtime or {}
    hw = str(info.get("device_hw") or info.get("device") or "?")
    kind = str(info.get("device_kind") or "")
    count = info.get("device_count")
    if info.get("runtime") == "xla":
        name = f"XLA:{hw.upper()}" if hw.upper() == "CPU" else (kind or hw)
    elif info.get("runtime") == "torch_tpu":
        name = f"TorchTPU on {kind or hw}"
    else:
        name = f"PyTorch on {hw.upper()}"
    return f"{name} x{count}" if count and count != 1 else name


def provenance(results, button: str = "run") -> str:
    """Markdown: when and where `results` (a RunResult, a list of them or a Comparison) were
    measured, and whether they were reused from the results folder (press `button` to measure
    again) or measured just now. A reused line begins "_Reused" (the benchmark counts them)."""
    items = list(getattr(results, "results", results) if not hasattr(results, "spec")
                 else [results])
    if not items:
        return ""
    when = sorted(r.measured_at for r in items if r.measured_at)
    if not when:
        span = "an unknown time"
    else:
        first, last = when[0], when[-1]
        span = first if first == last else (
            f"{first} to {last[11:]}" if first[:10] == last[:10] else f"{first} to {last}")
    where = ", ".join(dict.fromkeys(_where(r) for r in items))
    reused = sum(r.reused for r in items)
    if reused == len(items):
        return (f"_Reused: measured at {span} on {where}; press **{button}** to measure "
                "again._")
    if reused:
        return (f"_Reused {reused} of {len(items)} runs from the results folder; measured at "
                f"{span} on {where}; press **{button}** to measure again._")
    return f"_Measured just now ({span}) on {where}._"


def image_grid(images, columns: int = 8, scale: int = 3):
    """A PIL image of a batch (N, 3, H, W) with values in [0, 1], `columns` per row, upscaled."""
    import torch
    from PIL import Image
    from torchvision.utils import make_grid

    grid = make_grid(images.clamp(0, 1), nrow=columns, padding=2, pad_value=1.0)
    array = (grid.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    image = Image.fromarray(array)
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def run_live(specs: list, cold: bool = False, every_s: float = 0.5, chart=None,
             reuse: bool = False, chart_every_s: float = 5.0, final_chart: bool = True):
    """Run `specs` one after another inside a marimo cell: a progress bar over all their steps
    and a chart that grows as records stream in (`chart(steps_frame)`, default the step-time
    chart), redrawn when a run ends and at most every `chart_every_s` in between: drawing a
    chart costs the browser CPU that the timed steps of a 2-core machine would feel.
    ``reuse=True`` shows stored runs of the same specs and environment instead of measuring
    them (see :func:`tpu_workbench.runs.store.reusable`). ``final_chart=False``: the caller
    draws the finished runs' chart itself (a clickable one), so it is not drawn twice. Returns
    the Comparison (``.result()`` for a single spec)."""
    import time

    import marimo as mo

    from ..charts import step_times
    from ..records import label
    from ..runs.experiments import run_many

    chart = chart or step_times

    total = max(sum(s.steps for s in specs), 1)
    shown = [0]
    drawn = {"at": time.monotonic(), "runs": 0}
    chip: list[dict] = []  # libtpu's chip metrics streamed so far (only on a TPU)

    def keep(record: dict, spec) -> None:
        if record.get("kind") == "tpu_metrics":
            chip.append({**record, "mode": label(spec)})

    with mo.status.progress_bar(total=total, title="training", remove_on_exit=True) as bar:

        def update(frame, spec, done: int) -> None:
            bar.update(increment=done - shown[0], subtitle=label(spec))
            shown[0] = done
            runs = frame["run_id"].nunique() if "run_id" in frame else 0
            ended = runs > drawn["runs"]  # a new run began: the last one ended
            # (the chart of all of them is drawn once they are done, below); the first records
            # are drawn at once, so a reader sees a chart as soon as there is one
            due = ended or not drawn["runs"] or time.monotonic() - drawn["at"] >= chart_every_s
            if len(frame) and done < total and due:
                mo.output.replace(with_chip_metrics(chart(frame), chip))
                drawn.update(at=time.monotonic(), runs=runs)

        comparison = run_many(specs, on_update=update, every_s=every_s, cold=cold, reuse=reuse,
                              on_record=keep)
    if final_chart and len(comparison.steps):
        mo.output.replace(with_chip_metrics(chart(comparison.steps),
                                            chip_samples(comparison.results)))
    return comparison


def chip_samples(results) -> list[dict]:
    """The ``tpu_metrics`` records of `results`, each with its run's mode label."""
    from ..records import label

    return [{**r, "mode": label(res.spec)} for res in results for r in res.records
            if r.get("kind") == "tpu_metrics"]


def with_chip_metrics(step_chart, samples: list[dict]):
    """`step_chart` with the chip metrics sampled so far beside it (libtpu's monitoring SDK:
    duty cycle, TensorCore utilisation, HBM in use); the chart alone where there are none."""
    if not samples:
        return step_chart
    import marimo as mo
    import pandas as pd

    from ..charts.chips import chip_metrics

    return mo.hstack([step_chart, chip_metrics(pd.DataFrame(samples))], wrap=True,
                     justify="start")
