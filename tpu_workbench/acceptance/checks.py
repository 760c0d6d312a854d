"""The TPU acceptance run: every item of the README's "Only on a TPU" list, checked end to end.

:data:`CHECKS` is the one list: each :class:`Check` is a README item (``item``, the section's
bullets are tested against it both ways), what it needs (``needs``) and its body (a function of
a :class:`Context` returning an :class:`Outcome`). Adding a check is one entry and one function.
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
import math
import os
import platform
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..environment import backends, chips, torchtpu
from ..errors import SpecError
from ..runs.spec import ExperimentSpec, available_modes, runtime_config
from ..runs.workers import WorkerPool
from .report import markdown

STATUSES = ("pass", "fail", "needs a TPU", "needs torch_xla", "needs TorchTPU", "not wired")
README_SECTION = "## Only on a TPU (not checked here)"
STEPS = 3  # minGPT tiny steps per mode in the CPU form (CI): enough to see the loss move
TPU_STEPS = 8  # on a chip: a steady state after the compile
CPU_MODE = "lazy"  # the XLA mode of the CPU form


@dataclass
class Outcome:
    """What one check found: ``status`` (:data:`STATUSES`), ``detail`` in words, ``figures``."""

    status: str
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def passed(ok: bool, detail: str, **figures: Any) -> Outcome:
    return Outcome("pass" if ok else "fail", detail, figures)


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
    folder for their runs, what is here (chip, runtimes) and runs made by earlier checks."""

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


def _losses(result: Any) -> list[float]:
    return [r["loss"] for r in result.records if r.get("kind", "step") == "step"]


def _close(a: list[float], b: list[float], rtol: float) -> bool:
    return len(a) == len(b) > 0 and all(math.isclose(x, y, rel_tol=rtol, abs_tol=rtol / 10)
                                        for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------------------------
# The checks' bodies, in the order of CHECKS
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
    seen = _probe_tpu(ctx)
    figures.update(worker_device=seen.get("device_kind"), devices=seen.get("device_count"))
    return passed("TPU" in str(seen.get("device_kind", "")).upper() or
                  str(seen.get("device_hw")) == "TPU",
                  f"{st.chips} chip(s) ({kind}); the worker sees {seen.get('device_count')} x "
                  f"{seen.get('device_kind')}", **figures)


def _probe_tpu(ctx: Context) -> dict[str, Any]:
    """What the chip's worker reports (torch_xla's where installed, else TorchTPU's)."""
    from ..runs.runner import probe
    from ..runs.spec import RuntimeConfig

    if "probe" not in ctx.memo:
        ctx.memo["probe"] = probe(ExperimentSpec(model="mlp", mode="lazy") if ctx.has_xla
                                  else RuntimeConfig("torch_tpu", "tpu"), pool=ctx.pool)
    return ctx.memo["probe"]


def check_device_kind(ctx: Context) -> Outcome:
    seen = _probe_tpu(ctx)
    kind = str(seen.get("device_kind"))
    try:
        chip = chips.get_chip(kind)
    except ValueError as exc:
        return Outcome("fail", str(exc), {"device_kind": kind})
    pci = backends.tpu_kind_on_pci()
    return passed(pci is None or chip.name.lower() in str(pci).lower().replace("tpu ", ""),
                  f"runtime says {kind!r} -> chip table {chip.name}; PCI says {pci}",
                  device_kind=kind, chip=chip.name, pci_kind=pci)


def check_peaks_hbm(ctx: Context) -> Outcome:
    from ..timing import peak_flops

    seen = _probe_tpu(ctx)
    peak, source = peak_flops(seen)
    chip = chips.get_chip(str(seen.get("device_kind")))
    figures: dict[str, Any] = {"peak_tflops": peak / 1e12, "peak_source": source,
                               "table_tflops": chip.bf16_tflops, "table_hbm_gb": chip.hbm_gb}
    ok = math.isclose(peak / 1e12, chip.bf16_tflops, rel_tol=0.1)
    result = ctx.run(ctx.mingpt(ctx.xla_mode()))
    mem = result.summary.get("memory") or {}
    limit = (mem.get("device_memory") or {}).get("bytes_limit") or mem.get("hbm_bytes") or \
        seen.get("hbm_bytes")
    if limit:
        figures["runtime_hbm_gb"] = limit / 1e9
        ok = ok and math.isclose(limit / 1e9, chip.hbm_gb, rel_tol=0.2)  # runtime reserves some
    return passed(ok and bool(limit), f"peak {peak / 1e12:.0f} TFLOP/s ({source}) and HBM "
                  f"{(limit or 0) / 1e9:.1f} GB against the table's {chip.bf16_tflops:g} TFLOP/s, "
                  f"{chip.hbm_gb:g} GB", **figures)


def check_memory(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt(ctx.xla_mode()))
    mem = result.summary.get("memory") or {}
    figures = {k: v for k, v in mem.items() if not isinstance(v, dict)}
    device = mem.get("device_memory") or ({"summary": mem["hbm_summary"]}
                                          if mem.get("hbm_summary") else {})
    figures.update({f"device_{k}": v for k, v in dict(device).items()})
    return passed(bool(device), f"{mem.get('device_memory_source')}: {device}", **figures)


def check_modes(ctx: Context) -> Outcome:
    """Each mode that runs here on minGPT tiny, its losses against plain PyTorch on the CPU."""
    reference = _losses(ctx.run(ctx.mingpt("torch_eager", device="cpu")))
    if ctx.on_tpu:  # every mode of every TPU runtime here, at bf16-ish tolerance
        modes = [m for m in available_modes() if m not in ("torch_eager", "inductor")]
        rtol = 2e-2
    else:  # CPU form: one XLA mode, quick (tests/test_modes.py compares them all on CPU)
        modes = [CPU_MODE if ctx.has_xla else "inductor"]
        rtol = 2e-3
    figures: dict[str, Any] = {"reference": "torch_eager on cpu", "rtol": rtol,
                               "reference_losses": reference}
    bad = []
    for mode in modes:
        losses = _losses(ctx.run(ctx.mingpt(mode)))
        figures[f"{mode}_losses"] = losses
        if not _close(losses, reference, rtol):
            bad.append(mode)
    return passed(not bad and reference[-1] < reference[0],
                  f"modes {', '.join(modes)}: losses equal to plain PyTorch on CPU (rtol "
                  f"{rtol:g})" if not bad else f"losses differ from plain PyTorch: {bad}",
                  modes=modes, **figures)


def check_timing(ctx: Context) -> Outcome:
    """TorchTPU's compiled steps timed both ways: synchronize() alone vs the loss's read."""
    result = ctx.run(ctx.mingpt("tpu_compile"))
    steps = [r for r in result.records if r.get("kind", "step") == "step"][1:]  # steady
    wall = sorted(r["wall_ms"] for r in steps)
    sync = sorted(r["sync_ms"] for r in steps)
    wall_med, sync_med = wall[len(wall) // 2], sync[len(sync) // 2]
    lies = sync_med < 0.5 * wall_med  # synchronize() returned before the work was done
    return passed(wall_med > 0 and all(r["wall_ms"] >= r["sync_ms"] for r in steps),
                  f"steady step {wall_med:.2f} ms by the loss's device-to-host read, "
                  f"{sync_med:.2f} ms by torch.accelerator.synchronize() alone"
                  + (" (synchronize does NOT wait for compiled work here)" if lies else ""),
                  wall_median_ms=wall_med, sync_median_ms=sync_med, synchronize_waits=not lies)


def check_optimised_hlo(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt("lazy", capture=("hlo",)))
    folder = Path(result.out_dir) / "hlo"
    after = sorted(folder.glob("*after_optimizations.txt"))
    fusions = sum(p.read_text(errors="replace").count(" fusion(") for p in after)
    return passed(bool(after) and fusions > 0, f"{len(after)} optimised module(s) from the TPU "
                  f"compiler, {fusions} fusion(s)", modules=len(after), fusions=fusions)


def check_persistent_cache(ctx: Context) -> Outcome:
    from ..runs.compile_cache import persistent_cache_check

    check = persistent_cache_check(ctx.mingpt("lazy"), timeout=ctx.timeout)
    second = check.frame.iloc[-1]
    return passed(bool(second["persistent_hits"]) and not second["deserialize_failures"],
                  check.verdict, hits=int(second["persistent_hits"]),
                  failures=int(second["deserialize_failures"]))


def check_profile(ctx: Context) -> Outcome:
    from ..profiling import load_profile

    result = ctx.run(ctx.mingpt("lazy", capture=("profile",)))
    ops = load_profile(result).ops
    named = ops[ops["hlo_op"].astype(str) != ""] if "hlo_op" in ops else ops.iloc[:0]
    return passed(len(named) > 0, f"{len(named)} HLO op row(s) on the device plane",
                  op_rows=len(named), top=list(named["hlo_op"].head(3)) if len(named) else [])


def check_torchtpu_profile(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt("tpu_compile", capture=("profile",)))
    planes = sorted(Path(result.out_dir, "profile").rglob("*.xplane.pb"))
    return passed(bool(planes), f"{len(planes)} xplane file(s) from TpuProfilerConfig",
                  xplanes=[str(p.name) for p in planes])


def check_pallas(ctx: Context) -> Outcome:
    reference = _losses(ctx.run(ctx.mingpt("lazy")))
    losses = _losses(ctx.run(ctx.mingpt("lazy", options={"attention": "pallas"})))
    return passed(_close(losses, reference, 2e-2), "minGPT with the Pallas flash attention "
                  "against XLA's attention", pallas_losses=losses, xla_losses=reference)


def check_spmd(ctx: Context) -> Outcome:
    n = int(_probe_tpu(ctx).get("device_count") or 1)
    result = ctx.run(ctx.mingpt("lazy", mesh=(n,), strategy="dp"))
    layout = [r for r in result.records if r.get("kind") == "layout"]
    devices = {r.get("device") for r in layout}
    return passed(len(devices) == n and math.isfinite(_losses(result)[-1]),
                  f"dp over all {n} local chip(s): {len(devices)} device(s) hold the layout",
                  chips=n, layout_devices=len(devices))


def check_torchtpu_cache(ctx: Context) -> Outcome:
    cache = ctx.run(ctx.mingpt("tpu_compile")).summary.get("cache") or {}
    return passed(cache.get("compilations", 0) >= 1 and cache.get("hits", 0) >= 1,
                  f"torch.tpu._get_cache_stats(): {cache.get('compilations')} compilation(s), "
                  f"{cache.get('hits')} hit(s), {cache.get('requests')} request(s)",
                  **{k: cache.get(k) for k in ("compilations", "hits", "requests")})


def check_stablehlo(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt("tpu_compile", capture=("hlo",)))
    files = sorted(p.name for p in Path(result.out_dir, "hlo").glob("*.stablehlo.txt"))
    return passed(any("forward" in f for f in files) and any("backward" in f for f in files),
                  f"{len(files)} StableHLO file(s) from debug_callback", files=files)


def check_dtensor(ctx: Context) -> Outcome:
    from ..scale.dtensor_sharding import layout

    n = min(int(ctx.torchtpu.chips or 1), 8)
    ctx.pool.release_chip()  # the ranks are processes of their own: free the chip first
    records = layout("mingpt", "tiny", (n,), "dp", device="tpu")
    devices = {r.get("device") for r in records}
    return passed(len(devices) == n, f"DTensor over {n} chip(s) with tpu_dist: "
                  f"{len(records)} layout row(s)", chips=n, rows=len(records))


def check_dtensor_train(ctx: Context) -> Outcome:
    n = min(int(ctx.torchtpu.chips or 1), 4)
    one = ctx.run(ctx.mingpt("tpu_eager"))
    ctx.pool.release_chip()  # the gang's ranks are processes of their own: free the chip first
    gang = ctx.run(ctx.mingpt("tpu_eager", mesh=(n,), strategy="fsdp"))
    a, b = _losses(one), _losses(gang)
    return passed(_close(a, b, 1e-3), f"FSDP2 over {n} chip(s), one process per chip under "
                  f"torchrun with tpu_dist: losses {'equal' if _close(a, b, 1e-3) else 'differ'} "
                  "to one chip's (rtol 1e-3)", chips=n, one_chip=a, gang=b)


def check_mfu(ctx: Context) -> Outcome:
    from ..timing import summarize_results

    mode = "compile" if ctx.has_xla else "tpu_compile"
    spec = ExperimentSpec(model="mingpt", preset="gpt2", mode=mode, steps=TPU_STEPS)
    row = summarize_results([ctx.run(spec)]).iloc[0]
    return passed(0 < row["mfu"] <= 1, f"gpt2-size minGPT ({mode}): MFU {row['mfu']:.1%} of "
                  f"{row['peak_tflops']:.0f} TFLOP/s ({row['peak_source']})",
                  mfu=float(row["mfu"]), achieved_tflops=float(row["achieved_tflops"]),
                  steady_median_ms=float(row["steady_median_ms"]))


def check_chip_metrics(ctx: Context) -> Outcome:
    result = ctx.run(ctx.mingpt(ctx.xla_mode()))
    samples = [r for r in result.records if r.get("kind") == "tpu_metrics"]
    info = result.summary.get("chip_metrics") or {}
    last = samples[-1] if samples else {}
    return passed(bool(samples) and "duty_cycle_pct" in last,
                  f"{len(samples)} sample(s) of libtpu's monitoring SDK"
                  + (f" (not sampled: {info.get('reason')})" if not samples else ""),
                  samples=len(samples), errors=info.get("errors"),
                  **{k: v for k, v in last.items() if not isinstance(v, list)})


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
    same_tokens = len(same) > 0 and bool(same.all())
    return passed(not runs.errors and same_tokens and 1 <= static <= 2,
                  f"tokens equal to plain PyTorch: {same_tokens}; static_cache compiled "
                  f"{static} time(s); errors: {list(runs.errors)}", static_compiles=static)


def check_calibration(ctx: Context) -> Outcome:
    """The MFU check's run (gpt2-size minGPT on one chip) against `wb.predict` of it."""
    from .. import models
    from ..planning.predict import predict
    from ..planning.steptime import calibration
    from ..timing import summarize_results

    chip = chips.get_chip(str(_probe_tpu(ctx).get("device_kind")))
    family = models.get_model("mingpt")
    cfg = family.config("gpt2")
    mode = "compile" if ctx.has_xla else "tpu_compile"
    spec = ExperimentSpec(model="mingpt", preset="gpt2", mode=mode, steps=TPU_STEPS)
    measured = float(summarize_results([ctx.run(spec)]).iloc[0]["steady_median_ms"])
    ctx.pool.release_chip()  # the prediction compiles on the CPU; the chip is not needed
    row = predict("mingpt", "gpt2", slices=[f"{chip.name}-1"], strategies=["dp"],
                  seq_len=2 * cfg.length, batch_size=family.default_batch_size(cfg)).iloc[0]
    cal = calibration(row, measured)
    return passed(math.isfinite(cal["error"]), f"measured {measured:.1f} ms, predicted "
                  f"{cal['predicted_step_min_ms']:.1f}-{cal['predicted_step_max_ms']:.1f} ms "
                  f"({cal['error']:+.0%} against no overlap; in range: {cal['in_range']})", **cal)


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
