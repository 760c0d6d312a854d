"""The TPU acceptance run: every item of the README's "Only on a TPU" list, checked end to end.

:data:`CHECKS` is the one list: each :class:`Check` is a README item (``item``, the section's
bullets are tested against it both ways), what it needs (``needs``) and its body (a function of
a :class:`Context` returning an :class:`Outcome`). A body gathers (runs, probes, files) and
hands what it found to its pure judge in :mod:`.judge`, where each band names its source; tests
run every body against fake runs through :meth:`Context.run` and the memoised probe.
:func:`acceptance` runs them all (``tpu-workbench acceptance --out DIR``) and writes
``acceptance.md`` and ``acceptance.json`` whole: each check, its status, figures and time, the
versions, the chip. On a machine without a chip the checks that can run, run (in their CPU form),
the rest are ``needs a TPU`` with the reason, and the command exits 0: CI runs it that way.

Statuses: ``pass``, ``fail`` (the only one that makes the command exit 1), ``needs a TPU``,
``needs torch_xla`` / ``needs TorchTPU`` (a chip, but this environment lacks the runtime: run the
command in the other environment too) and ``not wired`` (a chip, but the check's body is not
written yet). All runs share one worker pool: one worker per runtime configuration.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..environment import backends, chips, torchtpu
from ..errors import SpecError
from ..runs.spec import ExperimentSpec, available_modes, runtime_config
from ..runs.workers import WorkerPool
from . import judge
from .judge import STATUSES, Outcome, passed
from .report import markdown

README_SECTION = "## Only on a TPU (not checked here)"
STEPS = 3  # minGPT tiny steps per mode in the CPU form (CI): enough to see the loss move
TPU_STEPS = 8  # on a chip: a steady state after the compile
CPU_MODE = "lazy"  # the XLA mode of the CPU form
# Loss tolerances against a reference run. On a chip the matmuls round fp32 inputs to bf16
# (8-bit mantissa, ~0.4% a product): 2% over a few steps. The same arithmetic on the CPU: 2e-3.
# FSDP over chips against one chip: the same bf16 products, summed in another order: 1e-3.
CHIP_RTOL, CPU_RTOL, GANG_RTOL = 2e-2, 2e-3, 1e-3


@dataclass(frozen=True)
class Check:
    """One README item. ``needs``: ``"cpu"`` (runs everywhere, in its CPU form off a chip),
    ``"tpu"`` (a chip, either runtime), ``"tpu+xla"`` or ``"tpu+torch_tpu"`` (a chip and that
    runtime). ``run`` None: not wired yet (``issue`` says where it is being built)."""

    key: str
    item: str
    needs: str
    run: Callable[[Context], Outcome] | None
    issue: str = ""


class Context:
    """What the checks share: the pool (one worker per runtime configuration), the output
    folder for their runs, what is here (chip, runtimes) and runs made by earlier checks.
    :meth:`run` and the probe (``memo["probe"]``) are the seams tests replace with fakes."""

    def __init__(self, out: Path, pool: WorkerPool, timeout: float = 900.0):
        self.out = out
        self.runs_dir = out / "runs"
        self.pool = pool
        self.timeout = timeout
        self.tpu = backends.tpu_status()
        self.torchtpu = torchtpu.status()
        self.has_xla = backends.have_torch_xla()
        self.memo: dict[str, Any] = {}

    @property
    def on_tpu(self) -> bool:
        return self.tpu.chips > 0

    def run(self, spec: ExperimentSpec) -> Any:
        """One run in the shared pool, its folder under ``runs/``; memoised by spec."""
        from ..runs.runner import run

        key = json.dumps(spec.to_dict(), sort_keys=True, default=str)
        if key not in self.memo:
            self.memo[key] = run(spec, pool=self.pool, out_dir=self.runs_dir,
                                 timeout=self.timeout)
        return self.memo[key]

    def prestart(self, *specs: ExperimentSpec) -> None:
        """Start the workers of `specs` now, together, so that their start-ups overlap."""
        for spec in specs:
            self.pool.start(runtime_config(spec))

    def mingpt(self, mode: str, **kwargs: Any) -> ExperimentSpec:
        steps = TPU_STEPS if self.on_tpu else STEPS
        return ExperimentSpec(model="mingpt", preset="tiny", mode=mode, steps=steps, **kwargs)

    def xla_mode(self) -> str:
        """The XLA mode a TPU check runs in (TorchTPU's compiled mode where torch_xla is absent)."""
        return "lazy" if self.has_xla else "tpu_compile"

    def gpt2(self, mode: str | None = None) -> ExperimentSpec:
        """The gpt2-size run (GPT-2 small's 124 M parameters) of mfu, calibration and timing."""
        mode = mode or ("compile" if self.has_xla else "tpu_compile")
        return ExperimentSpec(model="mingpt", preset="gpt2", mode=mode, steps=TPU_STEPS)


def _losses(result: Any) -> list[float]:
    return [r["loss"] for r in result.records if r.get("kind", "step") == "step"]


def _n_params(result: Any) -> int:
    return int(result.summary.get("n_params") or 0)


def _probe_tpu(ctx: Context) -> dict[str, Any]:
    """What the chip's worker reports (torch_xla's where installed, else TorchTPU's)."""
    from ..runs.runner import probe
    from ..runs.spec import RuntimeConfig

    if "probe" not in ctx.memo:
        ctx.memo["probe"] = probe(ExperimentSpec(model="mlp", mode="lazy") if ctx.has_xla
                                  else RuntimeConfig("torch_tpu", "tpu"), pool=ctx.pool)
    return ctx.memo["probe"]


def _kind(ctx: Context) -> str:
    return str(_probe_tpu(ctx).get("device_kind"))


# --------------------------------------------------------------------------------------------
# The checks' bodies, in the order of CHECKS: each gathers, then asks its judge (.judge)
# --------------------------------------------------------------------------------------------
def check_detection(ctx: Context) -> Outcome:
    from ..runs.runner import probe

    st, kind = ctx.tpu, backends.tpu_kind_on_pci()
    holders = backends.tpu_holder_details()
    figures = {"pci_chips": st.chips, "pci_kind": kind, "available": st.available,
               "reason": st.reason, "holders": [h.describe() for h in holders],
               "torchtpu": ctx.torchtpu.summary()}
    if not ctx.on_tpu:  # CPU form: the probes agree there is no chip and say what runs instead
        seen = probe(ExperimentSpec(model="mlp", mode="lazy" if ctx.has_xla else "torch_eager"),
                     pool=ctx.pool)
        figures.update(worker_device=seen.get("device_kind"), fallback=st.fallback)
        return passed(not st.available and bool(st.reason and st.fallback)
                      and "TPU" not in str(seen.get("device_kind", "")),
                      f"no chip, said so: {st.reason}; runs instead: {st.fallback}", **figures)
    if not st.available:
        return Outcome("fail", f"{st.chips} chip(s) on the PCI bus but not usable: {st.reason}",
                       figures)
    return judge.judge_detection_on_chip(_probe_tpu(ctx), figures)


def check_device_kind(ctx: Context) -> Outcome:
    return judge.judge_device_kind(_kind(ctx), backends.tpu_kind_on_pci())


def check_peaks_hbm(ctx: Context) -> Outcome:
    """The runtime's own figures: TorchTPU's probe has its peak and HBM capacity; torch_xla has
    no peak, and its HBM is the allocator's limit in a run (``xm.get_memory_info``)."""
    seen = _probe_tpu(ctx)
    hbm, source = seen.get("hbm_bytes"), "torch.tpu.get_device_properties().total_memory"
    if not hbm:
        mem = ctx.run(ctx.mingpt(ctx.xla_mode())).summary.get("memory") or {}
        hbm = (mem.get("device_memory") or {}).get("bytes_limit") or mem.get("hbm_bytes")
        source = str(mem.get("device_memory_source") or "the run's memory figures")
    return judge.judge_peaks_hbm(_kind(ctx), seen.get("peak_flops_per_device"), hbm, source)


def check_memory(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt(ctx.xla_mode()))
    return judge.judge_memory(result.summary.get("memory") or {}, _n_params(result), _kind(ctx))


def check_modes(ctx: Context) -> Outcome:
    """Each mode that runs here on minGPT tiny, its losses against plain PyTorch on the CPU."""
    reference = _losses(ctx.run(ctx.mingpt("torch_eager", device="cpu")))
    if ctx.on_tpu:  # every mode of every TPU runtime here
        modes = [m for m in available_modes() if m not in ("torch_eager", "inductor")]
    else:  # CPU form: one XLA mode, quick (tests/test_modes.py compares them all on CPU)
        modes = [CPU_MODE if ctx.has_xla else "inductor"]
    losses = {mode: _losses(ctx.run(ctx.mingpt(mode))) for mode in modes}
    return judge.judge_modes(reference, losses, CHIP_RTOL if ctx.on_tpu else CPU_RTOL)


def check_timing(ctx: Context) -> Outcome:
    """TorchTPU's compiled gpt2-size steps timed both ways: synchronize() alone vs the loss's
    read (gpt2-size: its HBM floor is milliseconds, so a clock that stops early shows)."""
    result = ctx.run(ctx.gpt2("tpu_compile"))
    steps = [r for r in result.records if r.get("kind", "step") == "step"][1:]  # steady
    return judge.judge_timing(steps, _n_params(result), _kind(ctx))


def check_optimised_hlo(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt("lazy", capture=("hlo",)))
    after = sorted((Path(result.out_dir) / "hlo").glob("*after_optimizations.txt"))
    return judge.judge_optimised_hlo({p.name: p.read_text(errors="replace") for p in after})


def check_persistent_cache(ctx: Context) -> Outcome:
    from ..runs.compile_cache import persistent_cache_check

    check = persistent_cache_check(ctx.mingpt("lazy"), timeout=ctx.timeout)
    frame = check.frame
    return judge.judge_persistent_cache(frame.iloc[0], frame.iloc[-1], check.verdict)


def check_profile(ctx: Context) -> Outcome:
    from ..profiling import load_profile

    ops = load_profile(ctx.run(ctx.mingpt("lazy", capture=("profile",)))).ops
    rows = zip(ops["hlo_op"].astype(str), ops["per_step_us"], strict=True) \
        if "hlo_op" in ops else []
    return judge.judge_profile(rows)


def check_torchtpu_profile(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt("tpu_compile", capture=("profile",)))
    planes = sorted(Path(result.out_dir, "profile").rglob("*.xplane.pb"))
    return judge.judge_torchtpu_profile({p.name: p.stat().st_size for p in planes})


def check_pallas(ctx: Context) -> Outcome:
    reference = _losses(ctx.run(ctx.mingpt("lazy")))
    losses = _losses(ctx.run(ctx.mingpt("lazy", options={"attention": "pallas"})))
    return judge.judge_pallas(losses, reference, CHIP_RTOL)


def check_spmd(ctx: Context) -> Outcome:
    n = int(_probe_tpu(ctx).get("device_count") or 1)
    result = ctx.run(ctx.mingpt("lazy", mesh=(n,), strategy="dp"))
    devices = {r.get("device") for r in result.records if r.get("kind") == "layout"}
    return judge.judge_spmd(n, len(devices), _losses(result))


def check_torchtpu_cache(ctx: Context) -> Outcome:
    return judge.judge_torchtpu_cache(ctx.run(ctx.mingpt("tpu_compile")).summary.get("cache")
                                      or {})


def check_stablehlo(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt("tpu_compile", capture=("hlo",)))
    files = sorted(Path(result.out_dir, "hlo").glob("*.stablehlo.txt"))
    return judge.judge_stablehlo({p.name: p.read_text(errors="replace") for p in files})


def check_dtensor(ctx: Context) -> Outcome:
    from ..scale.dtensor_sharding import layout

    n = min(int(ctx.torchtpu.chips or 1), 8)
    ctx.pool.release_chip()  # the ranks are processes of their own: free the chip first
    records = layout("mingpt", "tiny", (n,), "dp", device="tpu")
    return judge.judge_dtensor(n, len({r.get("device") for r in records}), len(records))


def check_dtensor_train(ctx: Context) -> Outcome:
    n = min(int(ctx.torchtpu.chips or 1), 4)
    one = ctx.run(ctx.mingpt("tpu_eager"))
    ctx.pool.release_chip()  # the gang's ranks are processes of their own: free the chip first
    gang = ctx.run(ctx.mingpt("tpu_eager", mesh=(n,), strategy="fsdp"))
    return judge.judge_dtensor_train(n, _losses(one), _losses(gang), GANG_RTOL)


def check_mfu(ctx: Context) -> Outcome:
    from ..timing import summarize_results

    spec = ctx.gpt2()
    row = summarize_results([ctx.run(spec)]).iloc[0]
    return judge.judge_mfu(row, _kind(ctx), spec.mode)


def check_chip_metrics(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt(ctx.xla_mode()))
    samples = [r for r in result.records if r.get("kind") == "tpu_metrics"]
    info = result.summary.get("chip_metrics") or {}
    outcome = judge.judge_chip_metrics(samples, info.get("reason"), _n_params(result), _kind(ctx))
    outcome.figures["errors"] = info.get("errors")
    return outcome


def check_generation(ctx: Context) -> Outcome:
    """minGPT's four decode strategies under tpu_compile: plain PyTorch's greedy tokens, and a
    static cache compiled a bounded number of times (prefill + decode)."""
    from ..generation.runs import generate_many, specs_for

    runs = generate_many(specs_for("mingpt", "tiny", modes=("torch_eager", "tpu_compile"),
                                   new_tokens=8), out_dir=ctx.runs_dir, timeout=ctx.timeout)
    out, summary = runs.outputs, runs.summary.set_index(["mode", "strategy"])
    same = out.loc[out["mode"] == "tpu_compile", "same_as_pytorch"]
    static = int(summary.loc[("tpu_compile", "static_cache"), "compiles_total"]) \
        if ("tpu_compile", "static_cache") in summary.index else -1
    return judge.judge_generation(list(runs.errors), len(same) > 0 and bool(same.all()), static)


def check_calibration(ctx: Context) -> Outcome:
    """The MFU check's run (gpt2-size minGPT on one chip) against `wb.predict` of it."""
    from .. import models
    from ..planning.predict import predict
    from ..planning.steptime import calibration
    from ..timing import summarize_results

    chip = chips.get_chip(_kind(ctx))
    family = models.get_model("mingpt")
    cfg = family.config("gpt2")
    measured = float(summarize_results([ctx.run(ctx.gpt2())]).iloc[0]["steady_median_ms"])
    ctx.pool.release_chip()  # the prediction compiles on the CPU; the chip is not needed
    row = predict("mingpt", "gpt2", slices=[f"{chip.name}-1"], strategies=["dp"],
                  seq_len=2 * cfg.length, batch_size=family.default_batch_size(cfg)).iloc[0]
    return judge.judge_calibration(calibration(row, measured))


SERVE_TOLERANCE = 0.3  # measured ITL and TTFT within 30% of the serving plan's


def check_serving(ctx: Context) -> Outcome:
    """vLLM-TPU serving Llama-3.1-8B on one chip (`launch --serve --execute`): measured ITL and
    TTFT at concurrency 1 and 8 against `wb.serve_plan`'s prediction of the same flags."""
    from ..scale.serve_launch import execute, missing, serve_launch
    from ..serving.serve import serve_plan

    why = missing()
    if why:
        return Outcome("needs vllm-tpu", why)
    args = ("hf:llama", "llama-3.1-8b", f"{chips.get_chip(_kind(ctx)).name}-1", 512, 128, (1, 8))
    measured = execute(serve_launch(*args), ctx.out / "serving").set_index("concurrency")
    ctx.pool.release_chip()
    predicted = serve_plan(*args).frame.set_index("concurrency")
    ratios = {f"{k}_c{c}": float(predicted.loc[c, k] / measured.loc[c, k])
              for c in measured.index for k in ("itl_mean_ms", "ttft_ms")}
    worst = max(ratios.values(), key=lambda x: abs(x - 1))
    return judge.passed(abs(worst - 1) <= SERVE_TOLERANCE,
                        f"predicted / measured, worst {worst:.2f} (tolerance "
                        f"{SERVE_TOLERANCE:.0%})", **ratios)


# --------------------------------------------------------------------------------------------
# The one list (the README's "Only on a TPU" section is tested against it, both ways)
# --------------------------------------------------------------------------------------------
CHECKS: tuple[Check, ...] = (
    Check("detection", "TPU device detection end to end (PCI scan, libtpu or torch_tpu, a busy "
          "chip named with its holder)", "cpu", check_detection),
    Check("device_kind", "the device-kind strings a chip reports, mapped to the chip table",
          "tpu", check_device_kind),
    Check("peaks_hbm", "chip peaks and HBM from the runtime against the chip table (the peaks "
          "used for MFU)", "tpu", check_peaks_hbm),
    Check("memory", "`xm.get_memory_info` / TorchTPU HBM figures of a run", "tpu", check_memory),
    Check("modes", "each execution mode of each backend on minGPT, losses equal to plain "
          "PyTorch on CPU", "cpu", check_modes),
    Check("timing", "real step times, timed honestly: TorchTPU steps by a device-to-host read "
          "of the loss, compared with `torch.accelerator.synchronize()` alone", "tpu+torch_tpu",
          check_timing),
    Check("optimised_hlo", "the TPU backend's optimisation of the HLO (the optimised modules "
          "and their fusions)", "tpu+xla", check_optimised_hlo),
    Check("persistent_cache", "the persistent compile cache: hits across two processes",
          "tpu+xla", check_persistent_cache),
    Check("profile", "a device-plane profile with HLO op rows", "tpu+xla", check_profile),
    Check("pallas", "the compiled Pallas kernels (minGPT with `attention=\"pallas\"`)",
          "tpu+xla", check_pallas),
    Check("ici", "the ICI time of collectives (here an estimate: `sharding.ici_assumptions()`)",
          "tpu", None, "not automated yet: compare a dp_tp step's collective time in its "
          "profile with `sharding.collectives` by hand"),
    Check("spmd", "SPMD on all local chips", "tpu+xla", check_spmd),
    Check("torchtpu_cache", "the three TorchTPU modes, with real `torch.tpu._get_cache_stats()` "
          "numbers", "tpu+torch_tpu", check_torchtpu_cache),
    Check("stablehlo", "TorchTPU StableHLO capture from `torch.compile`'s `debug_callback`",
          "tpu+torch_tpu", check_stablehlo),
    Check("torchtpu_profile", "the xprof trace of `TpuProfilerConfig`", "tpu+torch_tpu",
          check_torchtpu_profile),
    Check("dtensor", "DTensor over the `tpu` device with `tpu_dist` and `set_tpu_launch_env`",
          "tpu+torch_tpu", check_dtensor),
    Check("dtensor_train", "DTensor training over `tpu_dist`: a mesh with a TorchTPU mode runs "
          "as one process per chip under `torchrun` (`tpu_workbench.runs.gang`), losses equal to "
          "one chip", "tpu+torch_tpu", check_dtensor_train),
    Check("mfu", "MFU of a gpt2-size run against the chip peak", "tpu", check_mfu),
    Check("chip_metrics", "live chip metrics from libtpu's monitoring SDK (duty cycle, HBM in "
          "use, TensorCore utilisation) in a run's records", "tpu", check_chip_metrics),
    Check("generation", "generation strategies (naive / dynamic_cache / static_cache / "
          "bucketed) under `tpu_compile`: plain PyTorch's tokens, bounded compiles",
          "tpu+torch_tpu", check_generation),
    Check("calibration", "predicted vs measured step time (calibration of `wb.predict`)", "tpu",
          check_calibration),
    Check("serving", "vLLM-TPU serving Llama-3.1-8B (`launch --serve --execute`): measured ITL "
          "and TTFT against `wb.serve_plan`", "tpu", check_serving),
)


def readme_items() -> list[str]:
    """The README section's bullets, one per check (the section is tested against these)."""
    return [f"- **{c.key}**: {c.item}" for c in CHECKS]


def get_checks(only: str | list[str] | None = None) -> list[Check]:
    """The checks named in `only` (comma-separated or a list; None: all), in CHECKS order."""
    if only is None:
        return list(CHECKS)
    names = [n.strip() for n in only.split(",")] if isinstance(only, str) else list(only)
    known = {c.key for c in CHECKS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SpecError(f"unknown acceptance check(s) {unknown or names!r}; valid: "
                        f"{', '.join(c.key for c in CHECKS)}")
    return [c for c in CHECKS if c.key in names]


def blocked(check: Check, ctx: Context) -> Outcome | None:
    """The outcome of a check that cannot run here (and why), or None when it can."""
    if check.needs != "cpu" and not ctx.on_tpu:
        why = ctx.torchtpu.reason if check.needs == "tpu+torch_tpu" else ""  # and its runtime
        if ctx.tpu.reason not in why:
            why = ctx.tpu.reason + (f"; TorchTPU: {why}" if why else "")
        return Outcome("needs a TPU", why)
    if check.needs == "tpu+xla" and not ctx.has_xla:
        return Outcome("needs torch_xla", "torch_xla is not installed in this environment; run "
                       "`tpu-workbench acceptance` from .venv too")
    if check.needs == "tpu+torch_tpu" and not ctx.torchtpu.installed:
        return Outcome("needs TorchTPU", ctx.torchtpu.reason)
    if check.run is None:
        return Outcome("not wired" if ctx.on_tpu else "needs a TPU",
                       (f"body not written yet ({check.issue})" if ctx.on_tpu
                        else f"{ctx.tpu.reason} (and the check is {check.issue})"))
    return None


def run_check(check: Check, ctx: Context) -> dict[str, Any]:
    """Run one check; an error inside it is a ``fail`` with the error, never the end."""
    t0 = time.perf_counter()
    outcome = blocked(check, ctx)
    if outcome is None:
        try:
            outcome = check.run(ctx)  # type: ignore[misc]
        except Exception as exc:
            last = traceback.format_exc().strip().splitlines()[-3:]
            outcome = Outcome("fail", f"{type(exc).__name__}: {exc}", {"where": last})
    return {"key": check.key, "item": check.item, "needs": check.needs, **asdict(outcome),
            "seconds": round(time.perf_counter() - t0, 2)}


def acceptance(out: Path | str = "acceptance", only: str | list[str] | None = None,
               timeout: float = 900.0, pool: WorkerPool | None = None) -> dict[str, Any]:
    """Run the checks (`only`: some of them), write ``acceptance.json`` and ``acceptance.md``
    under `out` (each whole, or not at all) and return the report."""
    checks = get_checks(only)  # a bad name fails before anything starts
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise SpecError(f"timeout must be a positive number of seconds, got {timeout!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    own = pool is None
    pool = pool or WorkerPool(max_workers=2)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    try:
        ctx = Context(out, pool, timeout)
        if not ctx.on_tpu and any(c.key in ("detection", "modes") for c in checks):
            # the CPU form's two workers (plain PyTorch, XLA:CPU) start side by side
            ctx.prestart(ctx.mingpt("torch_eager", device="cpu"),
                         ctx.mingpt(CPU_MODE if ctx.has_xla else "torch_eager"))
        rows = [run_check(c, ctx) for c in checks]
    finally:
        if own:
            pool.shutdown()
    report = {"started_at": started, "wall_s": round(time.perf_counter() - t0, 1),
              "host": socket.gethostname(), "platform": platform.platform(),
              "chip": {"pci_chips": ctx.tpu.chips, "pci_kind": backends.tpu_kind_on_pci(),
                       "tpu_status": asdict(ctx.tpu), "torchtpu": ctx.torchtpu.as_dict()},
              "versions": backends.versions(), "checks": rows,
              "counts": {s: sum(r["status"] == s for r in rows) for s in STATUSES}}
    for path, text in ((out / "acceptance.json", json.dumps(report, indent=2, default=str)),
                       (out / "acceptance.md", markdown(report))):  # each whole, or not at all
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return report
