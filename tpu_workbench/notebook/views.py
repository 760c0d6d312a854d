"""Views several notebooks show: a captured step's HLO and kernels, the host's peak, the v6e
compile beside XLA:CPU's, the chip table, where the page runs, predictions and layouts."""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass
from typing import Any

from .sections import chip_samples
from .tables import table


def mesh_layout(model: str, mesh_shape: tuple[int, ...], strategy: str,
                smoke: bool = False, reuse: bool = False):
    """Lay `model` (preset tiny) out on a mesh with the backend this environment has, and say
    which: SPMD (torch_xla's sharding, a run that lays the model out and trains no step) where
    torch_xla is installed, else DTensor with one process per device (gloo on CPU, TorchTPU's
    tpu_dist on a chip; two processes in `smoke` runs). ``reuse=True`` takes a stored SPMD run
    of the same spec and environment if there is one. Returns ``(layout frame, mesh shape used,
    a sentence on how)``."""

    from .. import sharding
    from ..environment import backends
    from ..runs.runner import run
    from ..runs.spec import ExperimentSpec
    from ..scale import dtensor_sharding

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

    from ..worker.monitoring import unavailable_reason

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


def step_hlo(result) -> tuple:
    """A captured run's optimised training step: its instructions (a DataFrame) and
    :func:`~tpu_workbench.hlo.summary`. The summary (XLA's cost analysis, which first imports
    jaxlib: about 2 s) is kept in the run's folder, so showing a stored run again is quick."""
    from .. import hlo
    from ..runs import store

    after = hlo.main_module(hlo.load_run_hlo(result), "after_optimizations")
    ops = hlo.instructions(after)
    return ops, store.derived(result, "hlo_summary", lambda: hlo.summary(after, frame=ops))


@dataclass(frozen=True)
class CapturedStep:
    """A captured run's training step as the HLO views read it: the instructions before and
    after optimisation (parsed when first read), the kernels it runs
    (:func:`tpu_workbench.hlo.kernels`), the optimised text and its
    :func:`~tpu_workbench.hlo.summary`. What a page shows on open (the kernels, the summary,
    an opened kernel) is kept in the run's folder, so showing a stored run again parses no
    HLO (3,500 instructions of minGPT tiny: 0.5-1.5 s of a notebook's open)."""

    result: Any
    after_text: str
    kernels: Any
    summary: dict

    @functools.cached_property
    def after(self):
        """The optimised step's instructions (a DataFrame), parsed when first read."""
        from .. import hlo

        return hlo.instructions(self.after_text)

    @functools.cached_property
    def before(self):
        """The instructions before optimisation, parsed when first read (the quickstart
        never reads them)."""
        from .. import hlo

        return hlo.instructions(hlo.main_module(hlo.load_run_hlo(self.result),
                                                "before_optimizations"))

    def detail(self, name: str):
        """:func:`tpu_workbench.hlo.op_detail` of kernel `name`, kept in the run's folder."""
        import io

        import pandas as pd

        from .. import hlo
        from ..runs import store

        def opened() -> dict:
            d = hlo.op_detail(self.after, name)
            return {"name": d.name, "kernel": d.kernel, "text": d.text,
                    "inside": d.inside.to_json(orient="table"),
                    "sources": d.sources.to_json(orient="table")}

        key = "op_detail-" + "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        kept = store.derived(self.result, key, opened)
        return hlo.OpDetail(kept["name"], kept["kernel"], kept["text"],
                            *(pd.read_json(io.StringIO(kept[k]), orient="table")
                              for k in ("inside", "sources")))


def captured_step(result) -> CapturedStep | None:
    """:class:`CapturedStep` of a run that captured ``hlo`` (None for None: a section that has
    not run). The kernels and the summary are kept in the run's folder."""
    if result is None:
        return None
    from .. import hlo
    from ..runs import store

    after_text = hlo.main_module(hlo.load_run_hlo(result), "after_optimizations")
    parsed: dict = {}

    def after():
        if "ops" not in parsed:
            parsed["ops"] = hlo.instructions(after_text)
        return parsed["ops"]

    kernels = store.derived_frame(result, "kernels", lambda: hlo.kernels(after()))
    summary = store.derived(result, "hlo_summary", lambda: hlo.summary(after_text, frame=after()))
    step = CapturedStep(result, after_text, kernels, summary)
    if parsed:  # parsed for a figure not kept yet: the cached property's value
        step.__dict__["after"] = parsed["ops"]
    return step


def profile_ops(result):
    """The HLO ops of a captured run's profile (:attr:`tpu_workbench.profiling.Profile.ops`),
    kept in the run's folder: showing a stored run again does not read its trace again."""
    from .. import profiling
    from ..runs import store

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


def v6e_compile_of_tiny(model: str):
    """libtpu's compile of `model`'s ``tiny`` training step for one v6e chip (the step traced
    on XLA:CPU, compiled, never run; cached), at the batch and sequence its training runs use
    (the transformer families: twice the task's length)."""
    from ..models import get_model
    from ..tpu_compile import tpu_compile

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

    from .. import charts, hlo

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
    from ..environment.chips import chip_table

    return chip_table()[["name", "bf16_tflops", "hbm_gb", "hbm_gbps", "ici_link_gbps",
                         "chips_per_host"]].rename(columns={
        "name": "chip", "bf16_tflops": "bf16 TFLOP/s", "hbm_gb": "HBM GB",
        "hbm_gbps": "HBM GB/s", "ici_link_gbps": "ICI GB/s per link",
        "chips_per_host": "chips on the largest one-host VM"})


def where_am_i(backend: dict) -> str:
    """Markdown: what the runs of this notebook use (a TPU, XLA:CPU, or plain PyTorch where
    torch_xla is missing), why no TPU if none, and this CPU's measured peak beside a v6e chip's
    published one, with why that ratio compares like with like."""
    from ..environment.chips import get_chip

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
