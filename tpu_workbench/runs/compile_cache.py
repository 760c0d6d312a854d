"""XLA's compilation caches: what a warm worker saves, what misses, and the persistent cache.

torch_xla keeps every executable it compiled in an in-process cache keyed by the graph's hash
(ops, shapes, dtypes, outputs). A worker that ran an experiment once serves the same graphs from
that cache the next time: :func:`cache_study` measures a cold worker, the same spec again in the
same (warm) worker, and a changed shape in that worker (a miss). The persistent cache
(``torch_xla.runtime.initialize_cache``) writes executables to disk for the next process;
:func:`persistent_cache_check` runs two processes and says plainly whether the second one could
read them (PJRT on XLA:CPU cannot deserialize executables, a TPU can).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpecError
from . import runner
from .spec import MODES, ExperimentSpec, runtime_config
from .store import RunResult
from .workers import WorkerPool

SCENARIOS = {
    "cold": "cold worker (first run)",
    "warm": "warm worker, same spec",
    "miss": "warm worker, new shape",
}
COLUMNS = ["scenario", "label", "batch_size", "first_step_ms", "steady_median_ms", "compiles",
           "cache_hits", "cached_graphs", "compile_ms", "saved_ms", "worker_runs_before"]


@dataclass
class CacheStudy:
    """One row per scenario in ``runs`` (see :data:`COLUMNS`) and every compilation with its
    cause in ``compiles``."""

    runs: pd.DataFrame
    compiles: pd.DataFrame
    results: list[RunResult]


@dataclass
class PersistentCheck:
    """Two processes sharing one persistent cache folder: what the second could reuse."""

    runs: pd.DataFrame  # one row per process
    readable: bool  # the second process loaded executables from disk
    verdict: str
    folder: Path


def require_xla(spec: ExperimentSpec, what: str) -> None:
    spec.validate()
    if not MODES[spec.mode].runtime.xla:
        raise SpecError(f"{what} needs an XLA mode (eager, lazy, compile, dynamo); mode "
                        f"{spec.mode!r} runs on plain PyTorch, which has no XLA cache")


def run_row(scenario: str, result: RunResult) -> dict[str, Any]:
    """The cache figures of one finished run."""
    steps = result.steps
    cache = result.summary.get("cache", {})
    return {
        "scenario": scenario, "label": SCENARIOS.get(scenario, scenario),
        "batch_size": result.summary.get("batch_size"),
        "first_step_ms": float(steps["wall_ms"].iloc[0]),
        "steady_median_ms": float(steps["wall_ms"].iloc[1:].median()) if len(steps) > 1
        else float("nan"),
        "compiles": cache.get("compiles"), "cache_hits": cache.get("cache_hits"),
        "cached_graphs": cache.get("cached_graphs"),
        "compile_ms": float(steps["compile_ms"].sum()),
        "worker_runs_before": cache.get("worker_runs_before"),
    }


def cache_study(spec: ExperimentSpec, *, new_shape: dict[str, Any] | None = None,
                timeout: float | None = None,
                on_run: Callable[[str, RunResult], None] | None = None) -> CacheStudy:
    """Run `spec` in a fresh worker, again in the same warm worker, then with a new shape there.

    `new_shape` are the spec fields of the third run (default: the batch size doubled). The
    three runs share one runtime configuration with torch_xla's compile explanations on, so the
    miss comes with its cause. ``saved_ms`` is the cold run's first step minus this run's, for
    a run that compiled nothing (NaN for one that compiled: it paid its own compile, and with a
    new shape more work besides, so a "saving" there would be no cache's doing).
    """
    from .. import models

    require_xla(spec, "cache_study")
    spec = spec.replace(explain_compiles=True, change=None)
    if new_shape is None:
        family = models.get_model(spec.model)
        bs = spec.batch_size or family.default_batch_size(family.config(spec.preset,
                                                                        **spec.options))
        new_shape = {"batch_size": 2 * bs}
    changed = spec.replace(**new_shape).validate()
    if runtime_config(changed) != runtime_config(spec):
        raise SpecError(f"new_shape={new_shape} changes the worker's runtime configuration; "
                        "change only the model's inputs (batch_size, options such as length)")
    pool = WorkerPool(max_workers=1)
    results: list[RunResult] = []
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    try:
        for scenario, s in [("cold", spec), ("warm", spec), ("miss", changed)]:
            result = runner.run(s, pool=pool, **kwargs)
            results.append(result)
            if on_run is not None:
                on_run(scenario, result)
    finally:
        pool.shutdown()
    rows = pd.DataFrame([run_row(s, r) for s, r in zip(SCENARIOS, results, strict=True)],
                        columns=COLUMNS)
    rows["saved_ms"] = (rows["first_step_ms"].iloc[0] - rows["first_step_ms"]).where(
        rows["compiles"] == 0)
    from ..timing import compile_events

    compiles = compile_events(results)
    compiles.insert(0, "scenario", [SCENARIOS[s] for s, r in zip(SCENARIOS, results, strict=True)
                                    for rec in r.records if rec.get("kind") == "compile"])
    before = {**{k: getattr(spec, k) for k in new_shape}, "batch_size": rows["batch_size"][0]}
    what = ", ".join(f"{k}: {before[k]} -> {v}" for k, v in new_shape.items())
    compiles.loc[compiles["scenario"] == SCENARIOS["miss"], "trigger"] = what
    return CacheStudy(rows, compiles, results)


def persistent_cache_check(spec: ExperimentSpec, *, fresh: bool = True,
                           timeout: float | None = None) -> PersistentCheck:
    """Run `spec` with ``persistent_cache=True`` in two fresh worker processes, one after the
    other, and report what the second one found on disk (`fresh` empties the folder first)."""
    require_xla(spec, "persistent_cache_check")
    spec = spec.replace(persistent_cache=True).validate()
    folder = runtime_config(spec).cache_folder()
    if fresh and folder.exists():
        shutil.rmtree(folder)
    rows = []
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    for process in ("first process", "second process"):
        pool = WorkerPool(max_workers=1)
        try:
            result = runner.run(spec, pool=pool, **kwargs)
        finally:
            pool.shutdown()
        p = result.summary["cache"]["persistent"]
        rows.append({"process": process, **run_row(process, result),
                     "persistent_misses": p["misses"], "persistent_hits": p["hits"],
                     "deserialize_failures": p["deserialize_failures"], "files": p["files"],
                     "bytes": p["bytes"], "note": result.summary["cache"]["persistent_note"]})
    frame = pd.DataFrame(rows).drop(columns=["scenario", "label", "saved_ms"], errors="ignore")
    second = rows[1]
    readable = bool(second["persistent_hits"]) and not second["deserialize_failures"]
    first_ms, second_ms = rows[0]["first_step_ms"], second["first_step_ms"]
    if readable:
        verdict = (f"The second process loaded {second['persistent_hits']:g} executable(s) from "
                   f"the cache folder: first step {second_ms:,.0f} ms against {first_ms:,.0f} ms.")
    elif second["deserialize_failures"]:
        verdict = (f"Not reusable on XLA:CPU. The first process wrote {rows[0]['files']} "
                   f"file(s) ({rows[0]['bytes'] / 1e6:.1f} MB) to the cache folder; the second "
                   f"found its programs there but could not load them "
                   f"({second['deserialize_failures']:g} failed), because XLA:CPU cannot read "
                   "a compiled program back from disk, so it compiled again. On a TPU the same "
                   "option loads them and skips those compilations.")
    else:
        verdict = (f"The second process did not use the cache: {second['persistent_misses']:g} "
                   f"miss(es), {second['compiles']:g} compilation(s). {second['note']}")
    return PersistentCheck(frame, readable, verdict, folder)
