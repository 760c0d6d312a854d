"""Small helpers the notebooks share (kept here so every notebook behaves the same)."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
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
            # (the chart of all of them is drawn once they are done, below); the first records
            # are drawn at once, so a reader sees a chart as soon as there is one
            due = ended or not drawn["runs"] or time.monotonic() - drawn["at"] >= chart_every_s
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
    """``mo.ui.table`` of DataFrame `frame` with its floats :func:`rounded`, long text wrapped
    and a filtered frame's index dropped; no row selection unless `selection` is given. Every
    table the notebooks show goes through here."""
    import marimo as mo
    import pandas as pd

    kwargs.setdefault("selection", None)
    shown = rounded(frame)
    if shown.index.name is None and not shown.index.equals(pd.RangeIndex(len(shown))):
        shown = shown.reset_index(drop=True)  # a filtered frame's index is no column to show
    # Text columns wrap instead of ending in "...": an HLO line or a reason is read whole.
    long_text = [c for c in shown.columns
                 if (shown[c].dtype == object or pd.api.types.is_string_dtype(shown[c]))
                 and shown[c].map(lambda v: isinstance(v, str) and len(v) > 40).any()]
    kwargs.setdefault("wrapped_columns", [str(c) for c in long_text])
    return mo.ui.table(shown, **kwargs)


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


@dataclass(frozen=True)
class CapturedStep:
    """A captured run's training step as the HLO views read it: the instructions before and
    after optimisation, the kernels it runs (:func:`tpu_workbench.hlo.kernels`), the optimised
    text and its :func:`~tpu_workbench.hlo.summary`."""

    result: Any
    before: Any
    after: Any
    after_text: str
    kernels: Any
    summary: dict


def captured_step(result) -> CapturedStep | None:
    """:class:`CapturedStep` of a run that captured ``hlo`` (None for None: a section that has
    not run). The kernels and the summary are kept in the run's folder."""
    if result is None:
        return None
    from . import hlo
    from .runs import store

    files = hlo.load_run_hlo(result)
    after_text = hlo.main_module(files, "after_optimizations")
    after, summary = step_hlo(result)
    kernels = store.derived_frame(result, "kernels", lambda: hlo.kernels(after))
    before = hlo.instructions(hlo.main_module(files, "before_optimizations"))
    return CapturedStep(result, before, after, after_text, kernels, summary)


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


def v6e_compile_of_tiny(model: str):
    """libtpu's compile of `model`'s ``tiny`` training step for one v6e chip (the step traced
    on XLA:CPU, compiled, never run; cached), at the batch and sequence its training runs use
    (the transformer families: twice the task's length)."""
    from .models import get_model
    from .tpu_compile import tpu_compile

    family = get_model(model)
    cfg = family.config("tiny")
    return tpu_compile(model, "tiny", "v6e-1", "dp", seq_len=2 * getattr(cfg, "length", 1),
                       batch_size=family.default_batch_size(cfg))


def two_compilers(step: CapturedStep, tpu):
    """The captured step as XLA:CPU compiled it beside libtpu's compile of it for a v6e
    (`tpu`: a :class:`~tpu_workbench.tpu_compile.TPUCompile`): totals, kernel counts and the
    kernels by kind, every v6e figure labelled as compiled, not run."""
    import marimo as mo
    import pandas as pd

    from . import charts, hlo

    tpu_kernels = hlo.kernels(hlo.instructions(tpu.hlo_text))
    counts = pd.DataFrame(
        [("kernels the step runs", len(step.kernels), len(tpu_kernels)),
         ("of them fusions", int((step.kernels["opcode"] == "fusion").sum()),
          int((tpu_kernels["opcode"] == "fusion").sum()))],
        columns=["", "XLA:CPU (this machine)", "v6e (libtpu)"])
    return mo.vstack([
        mo.md(f"**{tpu.label}** (compiled, not run). FLOPs per step by libtpu's count: "
              f"{tpu.ops['flops'].sum() / 1e9:,.3f} GFLOP; bytes its ops read and write: "
              f"{tpu.ops['bytes'].sum() / 1e6:,.1f} MB; HBM per chip: "
              f"{tpu.memory['total_bytes'] / 1e6:,.1f} MB of "
              f"{tpu.memory['hbm_bytes'] / 1e9:.0f} GB."),
        table(counts, label="one training step, two compilers"),
        mo.hstack([charts.kernel_mix(step.kernels, top=12, title="XLA:CPU kernels"),
                   charts.kernel_mix(tpu_kernels, top=12, title="TPU v6e kernels (libtpu)")],
                  justify="start", gap=1),
    ])


def chip_table_view():
    """The published chip table with its units in the column names (``HBM GB/s``: gigabytes,
    not gigabits) and the host size said for what it is."""
    from .environment.chips import chip_table

    return chip_table()[["name", "bf16_tflops", "hbm_gb", "hbm_gbps", "ici_link_gbps",
                         "chips_per_host"]].rename(columns={
        "name": "chip", "bf16_tflops": "bf16 TFLOP/s", "hbm_gb": "HBM GB",
        "hbm_gbps": "HBM GB/s", "ici_link_gbps": "ICI GB/s per link",
        "chips_per_host": "chips on the largest one-host VM"})


def where_am_i(backend: dict) -> str:
    """Markdown: what the runs of this notebook use (a TPU, XLA:CPU, or plain PyTorch where
    torch_xla is missing), why no TPU if none, and this CPU's measured peak beside a v6e chip's
    published one, with why that ratio compares like with like."""
    from .environment.chips import get_chip

    peak = backend["host_peak"]["peak_flops"]
    tpu, ttpu = backend["tpu"], backend["torch_tpu"]
    if not backend["torch_xla_installed"]:
        where = ("**plain PyTorch on CPU** (torch_xla is not installed in this environment, "
                 "so the XLA modes, HLO and SPMD sections are skipped)")
    elif tpu["available"]:
        where = f"**a TPU** ({tpu['reason']})"
    else:
        where = f"**{tpu['fallback']}**: no TPU chip is attached to this machine"
    if ttpu["installed"]:
        where += (f"; TorchTPU {ttpu['version']} is installed"
                  + (" and offers tpu_eager, tpu_fused and tpu_compile below"
                     if ttpu["available"] else " but needs a TPU chip"))
    v6e = get_chip("v6e")
    return (f"The runs below use {where}. This CPU reaches **{peak / 1e9:,.0f} GFLOP/s** "
            f"in fp32 matmuls ({host_peak_text(backend['host_peak'])}); one v6e chip peaks at "
            f"**{v6e.bf16_tflops:,.0f} TFLOP/s** in bf16 (published), about "
            f"{v6e.peak_flops / peak:,.0f}x. The comparison is fair for a model trained in "
            "fp32 through torch_xla: at its default matmul precision an fp32 matmul runs on "
            "the TPU's matrix units as one bf16 pass.")


def prediction_table(predicted):
    """:func:`tpu_workbench.predict`'s frame as a reader's table: every figure predicted from
    libtpu's compile (not measured), the compiler's memory beside the analytic estimate."""
    import pandas as pd

    def fmt_range(lo, hi) -> str:
        return f"{lo:,.0f} - {hi:,.0f}" if lo == lo else "-"

    return pd.DataFrame({
        "slice": predicted["slice"], "strategy": predicted["strategy"],
        "fits (compiler)": predicted["fits"],
        "HBM per chip, compiler (GB)": predicted["compiler_memory_gb"].round(1),
        "HBM per chip, estimate (GB)": predicted["estimated_memory_gb"].round(1),
        "predicted step (ms)": predicted["predicted_step_ms"].round(1),
        "range (ms)": [fmt_range(a, b) for a, b in zip(
            predicted["predicted_step_min_ms"], predicted["predicted_step_max_ms"],
            strict=True)],
        "predicted MFU": predicted["predicted_mfu"].map(
            lambda m: f"{m:.0%}" if m == m else "-"),
        "bottleneck": predicted["bottleneck"].fillna("-"),
        "collectives (as compiled)": predicted["collectives"].fillna("-"),
        "why not": predicted["reason"].fillna(""),
    })


def run_failures_of_sweep(swept):
    """A danger callout listing why no run of a sweep finished, or None when some did."""
    import marimo as mo

    if not swept.summary.empty:
        return None
    return mo.callout(mo.md("No run of the sweep finished:\n\n" + "\n".join(
        f"- {e}" for e in swept.errors.values())), kind="danger")


def slice_collectives_view(collectives):
    """:func:`tpu_workbench.step_collectives`' frame as a table: which collective, along which
    mesh axis (and torus axes), how many per step, MB each and estimated ms per step."""
    import pandas as pd

    return pd.DataFrame({
        "collective": collectives["collective"], "kind": collectives["kind"],
        "axis (chips)": collectives["axis"] + " (" + collectives["physical_axes"] + ")",
        "per step": collectives["count"], "MB each": (collectives["bytes"] / 1e6).round(1),
        "est. ms per step": (collectives["total_us"] / 1e3).round(2),
    })


def tpu_reason(status) -> str:
    """Why a TPU is or is not used here, in words a reader can act on: "no TPU chip attached
    to this machine" where none is (the PCI scan's vendor id is no reader's business), else
    the reason of `status` (:func:`tpu_workbench.tpu_status`)."""
    if not status.available and not status.chips:
        return "no TPU chip attached to this machine"
    return status.reason


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
