"""Small helpers the notebooks share (kept here so every notebook behaves the same)."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from typing import Any

SMOKE_ENV = "TPU_WORKBENCH_SMOKE"
# Set by the docs export: every page measures afresh instead of reusing stored runs.
FRESH_ENV = "TPU_WORKBENCH_FRESH"
# Begins every failed-run callout; `docs.exported_problems` reports each one it finds in an
# exported page, so a notebook that shows a failed run fails the docs build and its test.
RUN_FAILED = "tpu-workbench run failed:"


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


def may_measure(opened: set[str], section: str, clicked: bool) -> bool:
    """Deprecated: :class:`Sections` (kept until every notebook uses it)."""
    first = section not in opened
    opened.add(section)
    return first or clicked


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

        mo.output.replace(mo.callout(mo.md(waiting), kind="info"))
        return None

    def run_live(self, name: str, button: Any, specs: list, cold: bool = False,
                 waiting: str = "Press **run** above to train with these settings.", **kwargs):
        """:func:`run_live` of `specs` (a Comparison) under :meth:`reuse`'s rule, or None while
        waiting. `button`: the section's ``mo.ui.run_button``."""
        from .runs.store import reusable

        reuse = self.reuse(name, bool(button.value),
                           lambda: all(reusable(s, cold=cold) for s in specs), waiting)
        return None if reuse is None else run_live(specs, cold=cold, reuse=reuse, **kwargs)

    def run(self, name: str, button: Any, spec: Any, title: str = "measuring",
            waiting: str = "Press **run** above to measure with these settings."):
        """One run of `spec` (a RunResult) under :meth:`reuse`'s rule with a spinner titled
        `title`, or None while waiting."""
        import marimo as mo

        from .runs.runner import run
        from .runs.store import reusable

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
             reuse: bool = False, chart_every_s: float = 5.0):
    """Run `specs` one after another inside a marimo cell: a progress bar over all their steps
    and a chart that grows as records stream in (`chart(steps_frame)`, default the step-time
    chart), redrawn when a run ends and at most every `chart_every_s` in between: drawing a
    chart costs the browser CPU that the timed steps of a 2-core machine would feel.
    ``reuse=True`` shows stored runs of the same specs and environment instead of measuring
    them (see :func:`tpu_workbench.runs.store.reusable`). Returns the Comparison (``.result()`` for
    a single spec)."""
    import time

    import marimo as mo

    from .charts import step_times
    from .records import label
    from .runs.experiments import run_many

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
            # (the chart of all of them is drawn once they are done, below)
            due = ended or time.monotonic() - drawn["at"] >= chart_every_s
            if len(frame) and done < total and due:
                mo.output.replace(with_chip_metrics(chart(frame), chip))
                drawn.update(at=time.monotonic(), runs=runs)

        comparison = run_many(specs, on_update=update, every_s=every_s, cold=cold, reuse=reuse,
                              on_record=keep)
    if len(comparison.steps):
        mo.output.replace(with_chip_metrics(chart(comparison.steps),
                                            chip_samples(comparison.results)))
    return comparison


def chip_samples(results) -> list[dict]:
    """The ``tpu_metrics`` records of `results`, each with its run's mode label."""
    from .records import label

    return [{**r, "mode": label(res.spec)} for res in results for r in res.records
            if r.get("kind") == "tpu_metrics"]


def with_chip_metrics(step_chart, samples: list[dict]):
    """`step_chart` with the chip metrics sampled so far beside it (libtpu's monitoring SDK:
    duty cycle, TensorCore utilisation, HBM in use); the chart alone where there are none."""
    if not samples:
        return step_chart
    import marimo as mo
    import pandas as pd

    from .charts.chips import chip_metrics

    return mo.hstack([step_chart, chip_metrics(pd.DataFrame(samples))], wrap=True,
                     justify="start")


def mesh_layout(model: str, mesh_shape: tuple[int, ...], strategy: str,
                smoke: bool = False, reuse: bool = False):
    """Lay `model` (preset tiny) out on a mesh with the backend this environment has, and say
    which: SPMD (torch_xla's sharding, a run that lays the model out and trains no step) where
    torch_xla is installed, else DTensor with one process per device (gloo on CPU, TorchTPU's
    tpu_dist on a chip; two processes in `smoke` runs). ``reuse=True`` takes a stored SPMD run
    of the same spec and environment if there is one. Returns ``(layout frame, mesh shape used,
    a sentence on how)``."""

    from . import sharding
    from .environment import backends
    from .runs.runner import run
    from .runs.spec import ExperimentSpec
    from .scale import dtensor_sharding

    if backends.have_torch_xla():
        spec = ExperimentSpec(model=model, preset="tiny", mode="compile", steps=0,
                              mesh=tuple(mesh_shape), strategy=strategy)
        how = ("The *sharding* notebook shows every tensor, memory per device and the "
               "collectives XLA inserted.")
        return sharding.layout_frame(run(spec, reuse=reuse)), tuple(mesh_shape), how
    shape = (1, 2) if smoke else tuple(mesh_shape)
    layout = sharding.layout_frame(dtensor_sharding.layout(model, "tiny", shape, strategy))
    how = ("**No torch_xla in this environment**, so no SPMD partitioner: this layout comes "
           f"from DTensor (`distribute_tensor`), one process per device of the "
           f"{sharding.mesh_text(shape)} mesh, as TorchTPU shards on a TPU host.")
    return layout, shape, how


def chip_metrics_view(comparison=None):
    """Where the runs of `comparison` sampled chip metrics, a line saying that they are drawn
    beside the step times (:func:`run_live` draws them as they stream); where there are none,
    a "needs a TPU" callout with the reason, never a made-up number. Instant without a chip:
    it starts no worker and imports no torch."""
    import marimo as mo

    from .worker.monitoring import unavailable_reason

    results = list(getattr(comparison, "results", None) or [])
    rows = chip_samples(results)
    if rows:
        used = sorted({", ".join(map(str, r["chips"])) for r in rows if r.get("chips")})
        of = f" of the runs' chips ({'; '.join(used)})" if used else ""
        return mo.md(f"**Live chip metrics** (libtpu's monitoring SDK): {len(rows)} sample(s)"
                     f"{of}, drawn beside the step-time chart above as they streamed.")
    said = [(res.summary.get("chip_metrics") or {}).get("reason") for res in results]
    reason = next((r for r in said if r), None) or unavailable_reason() or (
        "the runs shown were measured before the workbench sampled chip metrics")
    return mo.callout(mo.md(f"**Live chip metrics** (duty cycle, TensorCore utilisation, HBM "
                            f"in use): needs a TPU: {html.escape(reason)}."), kind="neutral")


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


def table(frame, **kwargs):
    """``mo.ui.table`` of DataFrame `frame` with its floats :func:`rounded`; no row selection
    unless `selection` is given. Every table the notebooks show goes through here."""
    import marimo as mo

    kwargs.setdefault("selection", None)
    return mo.ui.table(rounded(frame), **kwargs)


def format_us(us: float) -> str:
    """A duration given in microseconds, in the unit its size calls for: ``0.42 µs``,
    ``12.3 µs``, ``4.56 ms``, ``1.2 s`` (three significant digits)."""
    if us != us:
        return "? µs"
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if abs(us) >= scale * 0.9995:  # 999.96 µs reads 1 ms, not 1e+03 µs
            return f"{us / scale:,.3g} {unit}"
    return f"{us:.3g} µs"


def step_hlo(result) -> tuple:
    """A captured run's optimised training step: its instructions (a DataFrame) and
    :func:`~tpu_workbench.hlo.summary`. The summary (XLA's cost analysis, which first imports
    jaxlib: about 2 s) is kept in the run's folder, so showing a stored run again is quick."""
    from . import hlo
    from .runs import store

    after = hlo.main_module(hlo.load_run_hlo(result), "after_optimizations")
    ops = hlo.instructions(after)
    return ops, store.derived(result, "hlo_summary", lambda: hlo.summary(after, frame=ops))


def profile_ops(result):
    """The HLO ops of a captured run's profile (:attr:`tpu_workbench.profiling.Profile.ops`),
    kept in the run's folder: showing a stored run again does not read its trace again."""
    from . import profiling
    from .runs import store

    return store.derived_frame(result, "profile_ops", lambda: profiling.load_profile(result).ops)


def xla_flops_text(summary: dict) -> str:
    """XLA's own FLOP count of a module from :func:`tpu_workbench.hlo.summary`, as markdown:
    the GFLOP figure, or that the cost analysis failed (and why) -- never a made-up 0."""
    flops = summary.get("xla_flops")
    if flops is None:
        why = " ".join(str(summary.get("cost_error") or "no reason given").split())
        return f"**failed**, so there is no count ({why[:300]})"
    return f"counts **{flops / 1e9:,.3f} GFLOP**"


def host_peak_text(peak: dict) -> str:
    """When and how the host peak of :func:`tpu_workbench.host_peak_flops` was measured."""
    when = str(peak.get("measured_at") or "").replace("T", " ")
    return f"fp32 matmul, measured at {when}" if when else "fp32 matmul, measured"


def tpu_reason(status) -> str:
    """Why a TPU is or is not used here, in words a reader can act on: "no TPU chip attached
    to this machine" where none is (the PCI scan's vendor id is no reader's business), else
    the reason of `status` (:func:`tpu_workbench.tpu_status`)."""
    if not status.available and not status.chips:
        return "no TPU chip attached to this machine"
    return status.reason


def code_block(text: str, max_height: str = "28rem"):
    """Long program text (HLO, MLIR, a command) wrapped at the page's width, never cut off,
    in a block that scrolls once it is taller than `max_height`."""
    import marimo as mo

    return mo.Html(
        f'<pre style="white-space: pre-wrap; overflow-wrap: anywhere; max-height: '
        f'{max_height}; overflow-y: auto; font-size: 0.8rem; margin: 0">'
        f"{html.escape(text)}</pre>")


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


def example_model(name: str) -> str | None:
    """The model ref of the example user model `tests/models/<name>.py` of this checkout
    (``<absolute path>:make``), or None where the checkout has no such file (an installed
    package)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tests" / "models" / f"{name}.py"
    return f"{path}:make" if path.is_file() else None
