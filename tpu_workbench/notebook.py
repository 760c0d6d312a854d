"""Small helpers the notebooks share (kept here so every notebook behaves the same)."""

from __future__ import annotations

import html
import math
import os

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
    """Whether a notebook's `section` may start a worker now: on its first run since the
    notebook opened (`opened` holds the sections that ran) or when its run button was clicked.
    After that a control change alone only shows a stored run of the new settings, if any."""
    first = section not in opened
    opened.add(section)
    return first or clicked


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
