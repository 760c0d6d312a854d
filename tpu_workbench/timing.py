"""Turn step records into honest timing summaries.

Step 0 includes compilation, so it is reported apart ("first step") and never mixed into the
steady-state figures; steady state is every step after the warm-up, summarised by its median and
spread (p10/p90) because these machines are noisy.
"""

from __future__ import annotations

import math

import pandas as pd

from .records import FALLBACK_COLUMNS, labelled_steps

WARMUP_STEPS = 1  # steps excluded from steady state (step 0 compiles)


def summarize(steps: pd.DataFrame, by: tuple[str, ...] = ("model", "preset", "mode"),
              warmup: int = WARMUP_STEPS) -> pd.DataFrame:
    """One row per group of `by` with first-step and steady-state timing and compile counts.

    Input columns: ``step``, ``wall_ms``, ``compiles`` (+ ``cached``, ``compile_ms``,
    ``executions``, ``loss`` where present). Output columns: ``steps``, ``first_step_ms``,
    ``steady_median_ms``, ``steady_p10_ms``, ``steady_p90_ms``, ``steady_steps``,
    ``compiles_total``, ``compiles_steady``, ``compile_ms_total``, ``executions_per_step``,
    ``final_loss``.
    """
    if steps.empty:
        return pd.DataFrame()
    keys = [k for k in by if k in steps.columns]
    rows = []
    for group, frame in steps.groupby(keys, sort=False) if keys else [((), steps)]:
        frame = frame.sort_values("step")
        steady = frame[frame["step"] >= warmup]
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,), strict=True))
        row.update(
            steps=len(frame),
            first_step_ms=float(frame["wall_ms"].iloc[0]),
            steady_median_ms=float(steady["wall_ms"].median()) if len(steady) else float("nan"),
            steady_p10_ms=float(steady["wall_ms"].quantile(0.1)) if len(steady) else float("nan"),
            steady_p90_ms=float(steady["wall_ms"].quantile(0.9)) if len(steady) else float("nan"),
            steady_steps=len(steady),
            compiles_total=int(frame["compiles"].sum()) if "compiles" in frame else 0,
            compiles_steady=int(steady["compiles"].sum()) if "compiles" in frame else 0,
            compile_ms_total=float(frame["compile_ms"].sum()) if "compile_ms" in frame else 0.0,
            executions_per_step=float(steady["executions"].median())
            if "executions" in frame and len(steady) else float("nan"),
            final_loss=float(frame["loss"].iloc[-1]) if "loss" in frame else float("nan"),
        )
        rows.append(row)
    return pd.DataFrame(rows)


def on_tpu(runtime: dict) -> bool:
    """True if a run's worker ran on TPU chips (torch_xla with PJRT_DEVICE=TPU, or TorchTPU)."""
    if runtime.get("runtime") == "xla":
        return str(runtime.get("pjrt_device", "")).upper() == "TPU"
    return runtime.get("runtime") == "torch_tpu" and runtime.get("device") == "tpu"


def peak_flops(runtime: dict, spec_mesh: tuple[int, ...] | None = None) -> tuple[float, str]:
    """Peak FLOP/s of what a run used, and where the figure comes from.

    On a TPU (torch_xla or TorchTPU): the bf16 peak per chip times the chips the run used (1
    without a mesh): TorchTPU's own figure where its worker reported one, else the chip table
    looked up by the device kind the runtime reported. On a CPU (XLA:CPU or plain PyTorch): the
    host's measured fp32 matmul peak (all cores: XLA:CPU's virtual devices share them). NaN
    where no peak is known (CUDA, a TPU kind missing from the chip table).
    """
    from .environment import backends, chips

    kind = str(runtime.get("device_kind") or "")
    n = math.prod(spec_mesh) if spec_mesh else 1
    if on_tpu(runtime):
        if runtime.get("peak_flops_per_device"):
            return (float(runtime["peak_flops_per_device"]) * n,
                    f"{kind} x{n} bf16 peak (TorchTPU's hardware table)")
        try:
            chip = chips.get_chip(kind)
        except ValueError:
            return float("nan"), f"no peak: device kind {kind!r} is not in the chip table"
        return chip.peak_flops * n, f"{chip.name} x{n} bf16 peak (chip table)"
    if str(runtime.get("device", "")).startswith("cuda"):
        return float("nan"), "no CUDA peak table"
    host = backends.host_peak_flops()
    return host["peak_flops"], f"host CPU fp32 matmul peak, measured at {host['measured_at']}"


HOST_ROOF = "this host (measured)"


def roofline_targets() -> list[str]:
    """What a roofline can be drawn against: this host's measured roof, then each chip."""
    from .environment.chips import CHIPS

    return [HOST_ROOF, *CHIPS]


def roofline_roof(target: str) -> tuple[float, float, str]:
    """(peak FLOP/s, the roof's bandwidth in bytes/s, where they come from) of a roofline
    target: :data:`HOST_ROOF` (the host's measured fp32 matmul peak, and the bandwidth of its
    fastest memory: a core's L1 cache, which a small kernel's bytes can come from) or a chip
    of the table (bf16 peak and HBM bandwidth, published). :func:`roofline_slopes` has the
    slower memories under that roof."""
    from .environment import backends, chips

    if target == HOST_ROOF:
        host = backends.host_peak_flops()
        return (host["peak_flops"], host["cache_bandwidth_bytes_per_s"],
                f"this host, measured at {host['measured_at']}")
    chip = chips.get_chip(target)
    return chip.peak_flops, chip.hbm_gbps * 1e9, f"one {chip.name} chip (published)"


def roofline_slopes(target: str) -> dict[str, float]:
    """The memories slower than a roofline target's roof, {label: bytes/s}: the host's main
    memory (measured); none for a chip (its roof is HBM)."""
    if target != HOST_ROOF:
        return {}
    from .environment import backends

    return {"main memory": backends.host_peak_flops()["bandwidth_bytes_per_s"]}


def honest_peak(achieved: float, runtime: dict,
                spec_mesh: tuple[int, ...] | None = None) -> tuple[float, str]:
    """:func:`peak_flops`, measured again where a run beat it.

    A run faster than the host's measured peak may prove that figure too low (measured under
    load): measure again (the cache keeps the best). If the run still beats it, something is
    wrong (the run's FLOP count, or the peak) and no MFU is reported: the peak comes back NaN
    and the source says why, so a wrong FLOP count shows instead of reading as MFU 1.0.
    """
    from .environment import backends

    peak, source = peak_flops(runtime, spec_mesh)
    if not achieved > peak or on_tpu(runtime) or source.startswith("no "):
        return peak, source
    backends.host_peak_flops(refresh=True)
    peak, source = peak_flops(runtime, spec_mesh)
    if achieved > peak:
        return float("nan"), (f"no MFU: this run's {achieved / 1e9:,.1f} GFLOP/s beat the host "
                              f"peak measured again ({peak / 1e9:,.1f} GFLOP/s; {source}), so "
                              "its FLOPs per step or that peak is wrong")
    return peak, source


def summarize_results(results: list, warmup: int = WARMUP_STEPS) -> pd.DataFrame:
    """:func:`summarize` of finished runs, plus throughput, FLOPs, achieved FLOP/s and MFU.

    Extra columns: ``items_per_s`` (tokens/s or images/s, unit in ``item_unit``),
    ``flops_per_step`` (analytic until the HLO cost analysis supplies XLA's count),
    ``achieved_tflops``, ``peak_tflops``, ``mfu`` (achieved / peak; NaN where the run beat
    the peak measured again: see :func:`honest_peak`), ``peak_source``,
    ``metric_name``/``metric`` (the model's evaluation after training) and ``n_params``.
    """
    rows = []
    for result in results:
        base = summarize(labelled_steps(result.spec, result.records, result.run_id),
                         warmup=warmup)
        if base.empty:
            continue
        row = base.iloc[0].to_dict()
        s = result.summary
        steady_s = row["steady_median_ms"] / 1e3
        achieved = s["flops_per_step"] / steady_s if steady_s > 0 else float("nan")
        peak, source = honest_peak(achieved, result.runtime, result.spec.mesh)
        row.update(
            n_params=s["n_params"], batch_size=s["batch_size"], item_unit=s["item_unit"],
            items_per_s=s["items_per_step"] / steady_s if steady_s > 0 else float("nan"),
            flops_per_step=s["flops_per_step"], achieved_tflops=achieved / 1e12,
            peak_tflops=peak / 1e12, mfu=achieved / peak, peak_source=source,
            metric_name=s["metric_name"], metric=s["metric"], run_id=result.run_id,
        )
        rows.append(row)
    return pd.DataFrame(rows)


def compile_events(results: list) -> pd.DataFrame:
    """Every XLA compilation of the runs: model, preset, mode, step, cause, explanation..."""
    rows = []
    for result in results:
        for r in result.records:
            if r.get("kind") == "compile":
                rows.append({"model": result.spec.model, "preset": result.spec.preset,
                             "mode": result.spec.mode, **{k: v for k, v in r.items()
                                                          if k != "kind"}})
    return pd.DataFrame(rows, columns=["model", "preset", "mode", "step", "count", "trigger",
                                       "cause", "explanation", "graph_hash", "inputs", "outputs",
                                       "frame"])


NO_FALLBACKS = "no CPU fallbacks: every op of every step ran in XLA"
NO_GRAPH_BREAKS = "no graph breaks: Dynamo traced the model in one piece"
_OP_NOTES = {
    "aten::_local_scalar_dense": "a tensor's value read on the host (.item(), a Python `if` on "
                                 "a tensor): the graph is cut and run to get it",
}
_OP_NOTE = "ran on the CPU: no XLA lowering for it here (inputs copied to the host and back)"
_BRANCH = "a Python `if`/`while` on a tensor's value: a data-dependent branch"
_BREAK_NOTES = {  # by how the reason starts
    "generic_jump": _BRANCH,  # torch 2.9's words for a break it compiled around
    "Data-dependent branching": _BRANCH,  # the break's type: all a skipped frame's log names
}


def _skip_note(skipped_frame: str) -> str:
    """What a skipped frame (``file:line in function``) means."""
    function = skipped_frame.rsplit(" in ", 1)[-1]
    return (f"Dynamo gave up on all of `{function}`: a graph break inside a for/while loop "
            "cannot be resumed, so the whole function ran uncompiled (eager), every call")


def fallbacks(runs) -> pd.DataFrame:
    """What of each run did not compile (columns :data:`~tpu_workbench.records.FALLBACK_COLUMNS`).

    One row per op that ran outside XLA (``kind="fallback"``: torch_xla's ``aten::<op>``
    counters, calls over the run and per step) and per graph break Dynamo made
    (``kind="graph_break"``, modes ``dynamo`` and ``inductor``: reason, source line, how often;
    ``skipped_frame`` set where Dynamo gave up on the whole function, which ran uncompiled).
    Zero is explicit: a run that measured none of a kind has one row ``op="none"``, ``count=0``
    (:data:`NO_FALLBACKS`, :data:`NO_GRAPH_BREAKS`). A run that measures neither (plain PyTorch
    eager, TorchTPU) has no row. `runs`: a Comparison, a RunResult or a list of RunResults.
    In mode ``dynamo`` a step that compiles undercounts: torch_xla's openxla bridge clears
    every counter while it compiles (measured: the host read between two graphs missing from
    step 0 only).
    """
    results = [runs] if hasattr(runs, "records") else list(getattr(runs, "results", runs))
    rows = []
    for result in results:
        steps = [r for r in result.records if r.get("kind", "step") == "step"]
        base = {"model": result.spec.model, "preset": result.spec.preset,
                "mode": result.spec.mode, "run_id": result.run_id}
        for kind, field, none in (("fallback", "fallbacks", NO_FALLBACKS),
                                  ("graph_break", "graph_breaks", NO_GRAPH_BREAKS)):
            if not any(field in r for r in steps):
                continue  # not measured by this run's runtime or mode
            found = _outside_rows(kind, [r for r in result.records if r.get("kind") == kind],
                                  len(steps))
            rows += [{**base, **row} for row in found] or [
                {**base, "kind": kind, "op": "none", "where": "", "line": "",
                 "skipped_frame": "", "count": 0,
                 "per_step": 0.0 if kind == "fallback" else math.nan, "steps": "",
                 "note": none}]
    return pd.DataFrame(rows, columns=FALLBACK_COLUMNS)


def _outside_rows(kind: str, records: list[dict], n_steps: int) -> list[dict]:
    """The records of one kind of one run summed per op (fallback) or reason and place."""
    groups: dict[tuple[str, str, str], dict] = {}
    for r in records:
        op = r["op"] if kind == "fallback" else r.get("reason", "")
        skipped = r.get("skipped_frame", "")  # absent from runs stored before it was recorded
        note = (_OP_NOTES.get(op, _OP_NOTE) if kind == "fallback"
                else next((v for k, v in _BREAK_NOTES.items() if op.startswith(k)),
                          r.get("detail", "")))
        row = groups.setdefault((op, r.get("where", ""), skipped), {
            "kind": kind, "op": op, "where": r.get("where", ""), "line": r.get("line", ""),
            "skipped_frame": skipped, "count": 0, "steps": set(),
            "note": f"{_skip_note(skipped)}; {note}" if skipped else note})
        row["count"] += int(r["count"])
        row["steps"].add(int(r["step"]))
    out = sorted(groups.values(), key=lambda row: (min(row["steps"]), -row["count"]))
    for row in out:
        row["per_step"] = row["count"] / n_steps if kind == "fallback" and n_steps else math.nan
        row["steps"] = step_ranges(sorted(row["steps"]))
    return out


def step_ranges(steps: list[int]) -> str:
    """Sorted step numbers as ranges: [0, 1, 2, 5] -> "0-2, 5"."""
    parts: list[list[int]] = []
    for s in steps:
        if parts and s == parts[-1][1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def startup_breakdown(results: list) -> pd.DataFrame:
    """Where each run's wall time went, in seconds: ``spawn`` (starting the worker process),
    ``imports`` (torch and the runtime, in the worker), ``build`` (model, batches, setup),
    ``first_step`` (step 0: the compile, for XLA), ``other_steps``; ``reused`` runs took none
    of it now. A warm worker's spawn and imports are 0 (an earlier run paid them)."""
    rows = []
    for result in results:
        ms = [r["wall_ms"] for r in result.records if r.get("kind", "step") == "step"]
        fresh = result.worker_start_s > 0
        imports = float(result.runtime.get("import_s") or 0.0) if fresh else 0.0
        rows.append({"mode": result.spec.mode, "reused": result.reused,
                     "spawn": max(result.worker_start_s - imports, 0.0) if fresh else 0.0,
                     "imports": imports, "build": float(result.summary.get("build_s") or 0.0),
                     "first_step": ms[0] / 1e3 if ms else 0.0,
                     "other_steps": sum(ms[1:]) / 1e3})
    return pd.DataFrame(rows, columns=["mode", "reused", "spawn", "imports", "build",
                                       "first_step", "other_steps"])


def steady_compiles(steps: pd.DataFrame) -> dict[str, dict[int, int]]:
    """Compilations after step 0, per mode and step: ``{"dynamo": {1: 2}}`` says dynamo
    compiled two programs at step 1 and none later. A one-off is a mode settling; one that
    repeats every step is a recompilation bug. Columns ``mode``, ``step``, ``compiles``."""
    if steps.empty or "compiles" not in steps:
        return {}
    later = steps[(steps["step"] > 0) & (steps["compiles"] > 0)]
    return {str(mode): {int(s): int(c) for s, c in zip(g["step"], g["compiles"], strict=True)}
            for mode, g in later.groupby("mode", sort=False)}
