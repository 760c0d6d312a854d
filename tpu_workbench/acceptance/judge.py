"""How each acceptance check judges what its runs reported: pure functions of records, figures
and the chip table, so that every verdict can be tested against fabricated data without a chip.

A check's body in :mod:`.checks` gathers (runs, probes, files) and hands primitives to one
``judge_*`` function here; each says what passes and where its band comes from. The bands:

- the AdamW update's HBM traffic (:data:`ADAMW_UPDATE_BYTES`) over the chip table's HBM
  bandwidth is the least time a training step can take: a step timed shorter was not finished
  (``timing``), an MFU above what it allows is impossible (``mfu``);
- the runtime's HBM capacity against the chip table (:data:`HBM_TOLERANCE`);
- a measured step time against ``wb.predict``'s range (:data:`CALIBRATION_TOLERANCE`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..environment import chips

STATUSES = ("pass", "fail", "needs a TPU", "needs torch_xla", "needs TorchTPU", "not wired",
            "needs vllm-tpu")
GIB = 2**30

# The workbench's optimizer is fp32 AdamW, one parameter at a time (worker/backend.py
# make_optimizer). After a step the device holds each parameter and its two moments: 12 bytes.
ADAMW_STATE_BYTES = 12
# One update reads parameter, exp_avg and exp_avg_sq and writes all three back: 24 bytes per
# parameter at the least (the gradient may never reach HBM if XLA fuses it into the update, and
# the forward and backward passes' own weight reads are not counted: a lower bound).
ADAMW_UPDATE_BYTES = 24
# The cheapest honest step is the HBM floor above; a gpt2-size step on one chip that takes more
# than 20 times as long spends its time on the host (tracing, dispatch) or recompiling, and its
# MFU says nothing about the chip. 20x leaves room for the forward and backward passes' weight
# reads (1.5x the floor at fp32) and a launch overhead of ~30 ms on a v6e (floor 1.8 ms). No
# published MFU applies to this run: small-model figures (llm.c's GPT-2 124M at up to ~60% on
# A100s) are for 1024-token sequences; this step trains 8 x 11 tokens and is bound by HBM.
STEP_SLACK = 20.0
# The project's target for wb.predict: a measured step within 25% of the predicted range
# (perfect overlap to no overlap), either side; inside the range is within it by definition.
CALIBRATION_TOLERANCE = 0.25
# The chip table's HBM (Cloud TPU docs: 16, 32, 95) read as GiB against the runtime's bytes.
# Decimal GB and GiB differ by 7.4%, and a runtime keeps some back (torch_xla's docstring of
# xm.get_memory_info shows bytes_limit 34,088,157,184 = 31.75 GiB on a 32 GiB chip): 10% takes
# either reading and the reserve, while the table's nearest chips still differ by 2x.
HBM_TOLERANCE = 0.10
# TorchTPU's own peak table (torch_tpu/_internal/utils/hardware.py: v5e 197, v5p 459, v6e 918
# TFLOP/s) and the chip table quote the same Cloud TPU figures: they agree to rounding.
PEAK_TOLERANCE = 0.01


@dataclass
class Outcome:
    """What one check found: ``status`` (:data:`STATUSES`), ``detail`` in words, ``figures``."""

    status: str
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def passed(ok: bool, detail: str, **figures: Any) -> Outcome:
    return Outcome("pass" if ok else "fail", detail, figures)


def chip_of(kind: str) -> chips.Chip | None:
    """The chip table's entry for a device-kind string, None for a kind it does not know."""
    try:
        return chips.get_chip(kind)
    except ValueError:
        return None


def unknown_kind(kind: str, **figures: Any) -> Outcome:
    return Outcome("fail", f"device kind {kind!r} is not in the chip table "
                   f"(known: {', '.join(chips.DEVICE_KINDS)})", {"device_kind": kind, **figures})


def update_floor_ms(n_params: float, chip: chips.Chip) -> float:
    """The least time, in ms, one AdamW step of `n_params` fp32 parameters takes on `chip`: the
    update's HBM traffic over the chip's HBM bandwidth."""
    return n_params * ADAMW_UPDATE_BYTES / (chip.hbm_gbps * 1e9) * 1e3


def hbm_ratio(runtime_bytes: float, chip: chips.Chip) -> float:
    """The runtime's HBM capacity over the chip table's (read as GiB)."""
    return runtime_bytes / (chip.hbm_gb * GIB)


def close(a: Sequence[float], b: Sequence[float], rtol: float) -> bool:
    """Two loss curves equal step by step to `rtol` (and both non-empty)."""
    return len(a) == len(b) > 0 and all(math.isclose(x, y, rel_tol=rtol, abs_tol=rtol / 10)
                                        for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------------------------
# One judge per check, in the order of CHECKS
# --------------------------------------------------------------------------------------------
def judge_detection_on_chip(seen: Mapping[str, Any], figures: Mapping[str, Any]) -> Outcome:
    """A chip on the PCI bus (``figures``: what the scan found) and a worker that runs on it:
    it reports a TPU device, at least one."""
    kind, count = seen.get("device_kind"), int(seen.get("device_count") or 0)
    on_tpu = "TPU" in str(kind or "").upper() or str(seen.get("device_hw")) == "TPU"
    return passed(on_tpu and count >= 1, f"{figures.get('pci_chips')} chip(s) "
                  f"({figures.get('pci_kind')}); the worker sees {count} x {kind}",
                  **figures, worker_device=kind, devices=count)


def judge_device_kind(kind: str, pci_kind: str | None) -> Outcome:
    """The runtime's device kind is in the chip table and names the PCI bus's generation."""
    chip = chip_of(kind)
    if chip is None:
        return unknown_kind(kind, pci_kind=pci_kind)
    agrees = pci_kind is None or chip.name.lower() in str(pci_kind).lower().replace("tpu ", "")
    return passed(agrees, f"runtime says {kind!r} -> chip table {chip.name}; PCI says {pci_kind}"
                  + ("" if agrees else ": they disagree"),
                  device_kind=kind, chip=chip.name, pci_kind=pci_kind)


def judge_peaks_hbm(kind: str, runtime_peak_flops: float | None,
                    runtime_hbm_bytes: float | None, hbm_source: str) -> Outcome:
    """What the runtime reports against the chip table: its device kind names a chip, its HBM
    capacity is the table's within :data:`HBM_TOLERANCE`, and its own peak (TorchTPU's table;
    torch_xla reports none, so MFU there uses the chip table's) within :data:`PEAK_TOLERANCE`."""
    chip = chip_of(kind)
    if chip is None:
        return unknown_kind(kind)
    figures: dict[str, Any] = {"device_kind": kind, "chip": chip.name,
                               "table_tflops": chip.bf16_tflops, "table_hbm_gb": chip.hbm_gb,
                               "hbm_source": hbm_source}
    problems = []
    if runtime_hbm_bytes:
        ratio = hbm_ratio(runtime_hbm_bytes, chip)
        figures.update(runtime_hbm_gib=runtime_hbm_bytes / GIB, hbm_ratio=ratio)
        if abs(ratio - 1) > HBM_TOLERANCE:
            problems.append(f"HBM {runtime_hbm_bytes / GIB:.2f} GiB is {ratio:.0%} of the table's")
    else:
        problems.append(f"the runtime reported no HBM capacity ({hbm_source})")
    if runtime_peak_flops:
        figures["runtime_tflops"] = runtime_peak_flops / 1e12
        if not math.isclose(runtime_peak_flops / 1e12, chip.bf16_tflops, rel_tol=PEAK_TOLERANCE):
            problems.append(f"the runtime's peak {runtime_peak_flops / 1e12:g} TFLOP/s is not "
                            "the table's")
    peak = (f"peak {runtime_peak_flops / 1e12:g} TFLOP/s (the runtime's table)"
            if runtime_peak_flops else "no peak from the runtime (MFU uses the chip table's)")
    return passed(not problems, f"{kind!r} -> {chip.name} ({chip.bf16_tflops:g} TFLOP/s, "
                  f"{chip.hbm_gb:g} GiB); {peak}; HBM from {hbm_source}"
                  + (": " + "; ".join(problems) if problems else ""), **figures)


def judge_memory(memory: Mapping[str, Any], n_params: int, kind: str) -> Outcome:
    """A run's device memory as the runtime reports it. torch_xla (``xm.get_memory_info``):
    used <= peak <= limit, and the peak holds at least the model's fp32 AdamW state. TorchTPU
    (0.2.0: a text summary and the capacity): the summary is there and the capacity is the
    chip table's (:data:`HBM_TOLERANCE`)."""
    source = memory.get("device_memory_source")
    state = n_params * ADAMW_STATE_BYTES
    device = memory.get("device_memory") or {}
    figures: dict[str, Any] = {"source": source, "model_state_bytes": state,
                               **{f"device_{k}": v for k, v in device.items()}}
    if device:
        used, peak, limit = (float(device.get(k) or 0)
                             for k in ("bytes_used", "peak_bytes_used", "bytes_limit"))
        ok = 0 < state <= peak <= limit and used <= peak
        return passed(ok, f"{source}: {used / 1e6:.1f} MB in use, peak {peak / 1e6:.1f} MB, "
                      f"limit {limit / GIB:.2f} GiB; the model's parameters and AdamW moments "
                      f"take {state / 1e6:.1f} MB" + ("" if ok else " (inconsistent)"), **figures)
    if memory.get("hbm_summary"):
        chip, capacity = chip_of(kind), float(memory.get("hbm_bytes") or 0)
        ok = chip is not None and abs(hbm_ratio(capacity, chip) - 1) <= HBM_TOLERANCE
        figures.update(hbm_summary=memory["hbm_summary"], hbm_bytes=capacity)
        return passed(ok, f"{source}: {memory['hbm_summary']!r}; capacity {capacity / GIB:.2f} "
                      f"GiB against the table's {chip.hbm_gb if chip else '?'} GiB", **figures)
    return Outcome("fail", f"no device memory figures: {source}", figures)


def judge_modes(reference: Sequence[float], losses: Mapping[str, Sequence[float]],
                rtol: float) -> Outcome:
    """Each mode's losses equal plain PyTorch's on the CPU to `rtol`, and the reference learns."""
    bad = [mode for mode, got in losses.items() if not close(got, reference, rtol)]
    learns = len(reference) > 1 and reference[-1] < reference[0]
    return passed(not bad and learns,
                  f"modes {', '.join(losses)}: losses equal to plain PyTorch on CPU (rtol "
                  f"{rtol:g})" if not bad else f"losses differ from plain PyTorch: {bad}",
                  modes=list(losses), rtol=rtol, reference="torch_eager on cpu",
                  reference_losses=list(reference),
                  **{f"{mode}_losses": list(got) for mode, got in losses.items()})


def judge_timing(steps: Sequence[Mapping[str, Any]], n_params: int, kind: str) -> Outcome:
    """Steady steps timed by the loss's device-to-host read: none shorter than the HBM floor of
    its AdamW update (:func:`update_floor_ms`), none shorter than synchronize() alone. Whether
    synchronize() waited is reported, not judged: the loss's read is what times the step."""
    chip = chip_of(kind)
    if chip is None:
        return unknown_kind(kind)
    if not steps:
        return Outcome("fail", "no steady step was recorded")
    wall = sorted(float(r["wall_ms"]) for r in steps)
    sync = sorted(float(r["sync_ms"]) for r in steps)
    wall_med, sync_med = wall[len(wall) // 2], sync[len(sync) // 2]
    floor = update_floor_ms(n_params, chip)
    lies = sync_med < 0.5 * wall_med  # synchronize() returned before the work was done
    ok = wall[0] >= floor and all(r["wall_ms"] >= r["sync_ms"] for r in steps)
    return passed(ok, f"steady step {wall_med:.2f} ms by the loss's device-to-host read (fastest "
                  f"{wall[0]:.2f} ms, the AdamW update's HBM floor on {chip.name}: {floor:.2f} "
                  f"ms), {sync_med:.2f} ms by torch.accelerator.synchronize() alone"
                  + (" (synchronize does NOT wait for compiled work here)" if lies else "")
                  + ("" if ok else ": a step faster than its floor was not finished when its "
                     "clock stopped"), wall_median_ms=wall_med, wall_min_ms=wall[0],
                  sync_median_ms=sync_med, floor_ms=floor, synchronize_waits=not lies)


def judge_optimised_hlo(modules: Mapping[str, str]) -> Outcome:
    """Optimised modules with fusions, laid out by the TPU compiler: its layouts carry tiles
    (``{1,0:T(8,128)}``, shared/notes/tpu_compiler_offline.md); XLA:CPU's never do."""
    fusions = sum(text.count(" fusion(") for text in modules.values())
    tiled = [name for name, text in modules.items() if ":T(" in text]
    return passed(bool(modules) and fusions > 0 and len(tiled) == len(modules),
                  f"{len(modules)} optimised module(s), {len(tiled)} with TPU tiled layouts, "
                  f"{fusions} fusion(s)", modules=len(modules), tpu_tiled=len(tiled),
                  fusions=fusions)


def judge_persistent_cache(first: Mapping[str, Any], second: Mapping[str, Any],
                           verdict: str) -> Outcome:
    """The second process loads the first's executables (hits, no deserialize failure), so its
    first step, which compiled in the first process, is faster."""
    hits, failures = int(second["persistent_hits"]), int(second["deserialize_failures"])
    a, b = float(first["first_step_ms"]), float(second["first_step_ms"])
    return passed(hits > 0 and failures == 0 and b < a, f"{verdict} ({hits} hit(s), {failures} "
                  f"deserialize failure(s); first step {a:,.0f} ms, then {b:,.0f} ms)",
                  hits=hits, failures=failures, first_step_ms=[a, b])


def judge_profile(ops: Iterable[tuple[str, float]]) -> Outcome:
    """(HLO op, self time per step in µs) rows of the device plane: some, with time, and a
    compute op among them (a fusion, convolution or dot: minGPT's matmuls)."""
    named = [(op, us) for op, us in ops if op]
    compute = [op for op, _ in named if any(k in op for k in ("fusion", "convolution", "dot"))]
    total = sum(us for _, us in named)
    return passed(bool(compute) and total > 0, f"{len(named)} HLO op row(s) on the device plane, "
                  f"{total:.0f} µs per step, {len(compute)} compute op(s)",
                  op_rows=len(named), per_step_us=total, top=[op for op, _ in named[:3]])


def judge_pallas(pallas: Sequence[float], xla: Sequence[float], rtol: float) -> Outcome:
    """minGPT with the Pallas flash attention trains as with XLA's attention: losses to `rtol`."""
    same = close(pallas, xla, rtol)
    return passed(same, f"minGPT with the Pallas flash attention against XLA's attention: "
                  f"losses {'equal' if same else 'differ'} (rtol {rtol:g})",
                  pallas_losses=list(pallas), xla_losses=list(xla))


def judge_spmd(n: int, layout_devices: int, losses: Sequence[float]) -> Outcome:
    """dp over all `n` local chips: every chip holds part of the layout, the run trains."""
    finite = len(losses) > 0 and all(math.isfinite(x) for x in losses)
    return passed(layout_devices == n and finite, f"dp over all {n} local chip(s): "
                  f"{layout_devices} device(s) hold the layout", chips=n,
                  layout_devices=layout_devices)


def judge_torchtpu_cache(cache: Mapping[str, Any]) -> Outcome:
    """``torch.tpu._get_cache_stats()`` of an 8-step compiled run: it compiled, and the cache
    served at least as many requests as it compiled (each graph compiled in step 0 is served
    again in steps 1-7; a cache that recompiles every step has hits far below compilations)."""
    compiled, hits = int(cache.get("compilations") or 0), int(cache.get("hits") or 0)
    return passed(compiled >= 1 and hits >= compiled,
                  f"torch.tpu._get_cache_stats(): {compiled} compilation(s), {hits} hit(s), "
                  f"{cache.get('requests')} request(s)", compilations=compiled, hits=hits,
                  requests=cache.get("requests"))


def judge_stablehlo(files: Mapping[str, str]) -> Outcome:
    """StableHLO from ``debug_callback``: a forward and a backward module, each StableHLO text
    (``stablehlo.`` ops)."""
    real = sorted(name for name, text in files.items() if "stablehlo." in text)
    return passed(any("forward" in f for f in real) and any("backward" in f for f in real),
                  f"{len(files)} StableHLO file(s) from debug_callback, {len(real)} with "
                  "stablehlo ops", files=sorted(files), with_ops=real)


def judge_torchtpu_profile(xplanes: Mapping[str, int]) -> Outcome:
    """xplane files (name -> bytes) from ``TpuProfilerConfig``, with something in them."""
    full = [name for name, size in xplanes.items() if size > 0]
    return passed(bool(full), f"{len(xplanes)} xplane file(s) from TpuProfilerConfig, "
                  f"{len(full)} not empty", xplanes=sorted(xplanes))


def judge_dtensor(n: int, devices: int, rows: int) -> Outcome:
    """DTensor laid out over `n` chips: every chip holds part of the layout."""
    return passed(devices == n and rows > 0, f"DTensor over {n} chip(s) with tpu_dist: {rows} "
                  f"layout row(s) on {devices} device(s)", chips=n, devices=devices, rows=rows)


def judge_dtensor_train(n: int, one: Sequence[float], gang: Sequence[float],
                        rtol: float) -> Outcome:
    """FSDP2 over `n` chips trains as one chip does: the same losses to `rtol`."""
    same = close(one, gang, rtol)
    return passed(same, f"FSDP2 over {n} chip(s), one process per chip under torchrun with "
                  f"tpu_dist: losses {'equal' if same else 'differ'} to one chip's (rtol "
                  f"{rtol:g})", chips=n, one_chip=list(one), gang=list(gang))


def judge_mfu(row: Mapping[str, Any], kind: str, mode: str) -> Outcome:
    """MFU of the gpt2-size run (a :func:`tpu_workbench.timing.summarize_results` row) inside
    its band: at most the MFU of a step as fast as its AdamW update's HBM floor allows (and 1),
    at least that over :data:`STEP_SLACK`."""
    chip = chip_of(kind)
    if chip is None:
        return unknown_kind(kind)
    mfu, peak = float(row["mfu"]), float(row["peak_tflops"]) * 1e12
    flops, n_params = float(row["flops_per_step"]), float(row["n_params"])
    fastest_s = max(flops / peak, update_floor_ms(n_params, chip) / 1e3)
    high = flops / (peak * fastest_s)
    low = high / STEP_SLACK
    ok = math.isfinite(mfu) and low <= mfu <= high
    why = "" if ok else (": above what the HBM floor allows (the clock stopped early or the "
                         "peak is wrong)" if mfu > high else ": below the band (host-bound or "
                         "recompiling)")
    return passed(ok, f"gpt2-size minGPT ({mode}): MFU {mfu:.2%} of {peak / 1e12:.0f} TFLOP/s "
                  f"({row['peak_source']}); band {low:.2%}-{high:.2%} on {chip.name}" + why,
                  mfu=mfu, mfu_low=low, mfu_high=high,
                  achieved_tflops=float(row["achieved_tflops"]),
                  steady_median_ms=float(row["steady_median_ms"]), floor_ms=fastest_s * 1e3)


def judge_chip_metrics(samples: Sequence[Mapping[str, Any]], reason: str | None,
                       n_params: int, kind: str) -> Outcome:
    """Samples of libtpu's monitoring SDK in a run's records: percentages within 0-100, and HBM
    in use on the busiest chip at least the model's AdamW state, at most the chip's capacity
    (:data:`HBM_TOLERANCE`): a figure outside is in another unit or from another chip."""
    if not samples:
        return Outcome("fail", f"no sample of libtpu's monitoring SDK (not sampled: {reason})",
                       {"samples": 0})
    chip = chip_of(kind)
    if chip is None:
        return unknown_kind(kind, samples=len(samples))

    def values(key: str) -> list[float]:
        return [float(v) for s in samples for v in (s.get(f"{key}_per_chip") or
                                                    ([s[key]] if key in s else []))]

    pct = values("duty_cycle_pct") + values("tensorcore_util_pct")
    hbm = max(values("hbm_used_bytes"), default=float("nan"))
    state, capacity = n_params * ADAMW_STATE_BYTES, chip.hbm_gb * GIB * (1 + HBM_TOLERANCE)
    outside = [v for v in pct if not 0 <= v <= 100]
    problems = [f"{len(outside)} percentage(s) outside 0-100"] if outside else []
    if "duty_cycle_pct" not in samples[-1]:
        problems.append("no duty cycle")
    if not state <= hbm <= capacity:
        problems.append(f"HBM in use {hbm:g} bytes is not between the model's state "
                        f"({state / 1e6:.1f} MB) and the chip's HBM")
    last = {k: v for k, v in samples[-1].items() if not isinstance(v, list)}
    return passed(not problems, f"{len(samples)} sample(s) of libtpu's monitoring SDK"
                  + (": " + "; ".join(problems) if problems else ""), samples=len(samples),
                  hbm_used_max_bytes=hbm, **last)


def judge_generation(errors: Sequence[str], same_tokens: bool, static_compiles: int) -> Outcome:
    """Every strategy ran, tpu_compile's greedy tokens are plain PyTorch's, and the static cache
    compiled at most twice: one prefill graph and one decode graph (its shapes never change)."""
    return passed(not errors and same_tokens and 1 <= static_compiles <= 2,
                  f"tokens equal to plain PyTorch: {same_tokens}; static_cache compiled "
                  f"{static_compiles} time(s); errors: {list(errors)}",
                  static_compiles=static_compiles)


def judge_calibration(cal: Mapping[str, Any]) -> Outcome:
    """A measured step time (a :func:`tpu_workbench.planning.steptime.calibration` dict) inside
    ``wb.predict``'s range widened by :data:`CALIBRATION_TOLERANCE` on each side."""
    low, high = float(cal["predicted_step_min_ms"]), float(cal["predicted_step_max_ms"])
    measured = float(cal["measured_step_ms"])
    lo, hi = low * (1 - CALIBRATION_TOLERANCE), high * (1 + CALIBRATION_TOLERANCE)
    ok = lo <= measured <= hi
    return passed(ok, f"measured {measured:.2f} ms, predicted {low:.2f}-{high:.2f} ms "
                  f"(in range: {cal['in_range']}); passes within {lo:.2f}-{hi:.2f} ms "
                  f"(±{CALIBRATION_TOLERANCE:.0%})", **cal, band_low_ms=lo, band_high_ms=hi)
