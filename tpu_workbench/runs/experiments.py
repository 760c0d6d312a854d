"""Run several specs one after another and collect them into one comparison.

This is what a notebook's "compare modes" cell and the ``bench`` CLI share: streamed records from
every run gathered into one DataFrame (with ``model``, ``preset`` and ``mode`` columns), a
throttled callback for live charts and progress bars, and failures kept per run instead of
stopping the whole comparison.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..errors import WorkbenchError
from ..records import label, labelled_steps
from . import gang
from .runner import stored, submit
from .spec import ExperimentSpec, runtime_config
from .store import RunResult
from .workers import WorkerPool

# Cold workers start this many at a time: their imports overlap one another (never a timed step).
PRESTART_BATCH = max(4, os.cpu_count() or 1)


@dataclass
class Comparison:
    """Results of several runs: per-step records of all of them, and what failed."""

    results: list[RunResult] = field(default_factory=list)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)  # label -> error
    partial: list[pd.DataFrame] = field(default_factory=list)

    @property
    def steps(self) -> pd.DataFrame:
        """Step records of every run (also the partial records of failed runs)."""
        frames = [labelled_steps(r.spec, r.records, r.run_id) for r in self.results]
        frames += self.partial
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @property
    def ok(self) -> bool:
        return not self.errors

    def result(self) -> RunResult:
        """The one finished run of a single-spec comparison; raises its error if it failed."""
        if self.errors:
            raise next(iter(self.errors.values()))
        if len(self.results) != 1:
            raise ValueError(f"result() needs exactly one run, this comparison has "
                             f"{len(self.results)}; use .results")
        return self.results[0]

    @property
    def summary(self) -> pd.DataFrame:
        """One row per finished run: timing, compiles, throughput, MFU (see timing.py)."""
        from ..timing import summarize_results

        return summarize_results(self.results)

    @property
    def compiles(self) -> pd.DataFrame:
        """Every XLA compilation of the finished runs, with its cause."""
        from ..timing import compile_events

        return compile_events(self.results)


def run_many(specs: Sequence[ExperimentSpec],
             on_update: Callable[[pd.DataFrame, ExperimentSpec, int], None] | None = None,
             every_s: float = 0.5, pool: WorkerPool | None = None,
             timeout: float | None = None, cold: bool = False,
             reuse: bool = False,
             on_record: Callable[[dict[str, Any], ExperimentSpec], None] | None = None
             ) -> Comparison:
    """Run `specs` in order; call ``on_update(steps_so_far, spec, steps_done)`` at most every
    `every_s` seconds while they go on and after each run (once after stored runs in a row),
    and ``on_record(record, spec)`` for every record a worker streams (not for stored runs).
    A failed run is recorded in ``Comparison.errors`` with its partial records, and the next
    spec still runs.

    ``cold=True`` gives every run a fresh worker, so its first step pays the full compile (a warm
    worker serves graphs it compiled before, for any mode, from its cache). The fresh workers
    start together, :data:`PRESTART_BATCH` at a time (the first run's alone, for an early first
    result), and a batch's runs begin only when all of its workers are ready: start-ups overlap
    one another, never a timed step.

    ``reuse=True`` takes a spec's completed run from the results folder when one was measured
    in this same environment (see :func:`~tpu_workbench.runs.store.reusable`); the rest are run.
    """
    found = [stored(spec, cold=cold) if reuse else None for spec in specs]
    pools: dict[int, WorkerPool] = {}
    if cold:
        # a gang launches its own processes (tpu_workbench.runs.gang): no pool worker to start
        pools = {i: WorkerPool(max_workers=1) for i, f in enumerate(found)
                 if f is None and not _is_gang(specs[i])}
        _start_early(specs, pools)
    try:
        for spec, result in zip(specs, found, strict=True):  # bad input fails before any run
            if result is None:  # (a stored run's spec was valid: checking again imports torch)
                spec.validate()
    except BaseException:
        for own in pools.values():
            own.shutdown()
        raise
    out = Comparison()
    done: list[pd.DataFrame] = []  # step frames of the runs that ended
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}

    def update(spec: ExperimentSpec, live: pd.DataFrame | None = None) -> None:
        if on_update is not None:
            frame = _concat(done + ([live] if live is not None else []))
            on_update(frame, spec, len(frame))

    try:
        for i, spec in enumerate(specs):
            if found[i] is None and i in pools and pools[i].idle():
                _prestart(specs, pools, first=i)
            result = found[i] or _measure(spec, pools.get(i) or pool, kwargs, out, every_s,
                                          lambda live, spec=spec: update(spec, live),
                                          on_record)
            if result is not None:
                out.results.append(result)
                done.append(labelled_steps(spec, result.records, result.run_id))
            else:
                done.append(out.partial[-1])
            if i in pools:
                pools[i].shutdown()
            if not (found[i] and i + 1 < len(specs) and found[i + 1]):
                update(spec)  # stored runs in a row are reported once, after the last of them
    finally:  # an interrupted comparison leaves no started worker behind
        for own in pools.values():
            own.shutdown()
    return out


def _measure(spec: ExperimentSpec, pool: WorkerPool | None, kwargs: dict[str, Any],
             out: Comparison, every_s: float, live: Callable[[pd.DataFrame], None],
             on_record: Callable[[dict[str, Any], ExperimentSpec], None] | None = None
             ) -> RunResult | None:
    """One run, `live(steps so far)` at most every `every_s`; a failure goes to `out`."""
    try:
        run = submit(spec, pool=pool, **kwargs)
        last = 0.0
        for record in run:
            if on_record is not None:
                on_record(record, spec)
            if time.monotonic() - last >= every_s:
                last = time.monotonic()
                live(labelled_steps(spec, run.records, run.run_id))
        return run.result()
    except WorkbenchError as exc:
        out.errors[label(spec)] = exc
        out.partial.append(labelled_steps(spec, getattr(exc, "records", []),
                                          getattr(exc, "run_id", "")))
        return None


def _is_gang(spec: ExperimentSpec) -> bool:
    try:
        return gang.is_gang(spec)
    except (KeyError, TypeError):  # a malformed spec: validation says what is wrong
        return False


def _start_early(specs: Sequence[ExperimentSpec], pools: dict[int, WorkerPool]) -> None:
    """Start the first cold run's worker before the specs are validated: its imports of torch
    and the runtime (seconds) then overlap the validation's own import of torch in this process.
    It only imports, and is stopped again if a spec is bad."""
    if pools:
        first = min(pools)
        with contextlib.suppress(Exception):  # a spec too malformed for a runtime: validate says
            pools[first].start(runtime_config(specs[first]))


def _prestart(specs: Sequence[ExperimentSpec], pools: dict[int, WorkerPool], first: int) -> None:
    """Start the fresh workers of the next :data:`PRESTART_BATCH` cold runs from `first` on and
    wait until all of them are ready (one that fails to start is started again by its run)."""
    batch = [i for i in sorted(pools) if i >= first][:PRESTART_BATCH]
    if first == 0 and len(batch) > 1:
        # The very first run starts alone, so a first result shows after one start-up rather
        # than after all of them (a few seconds more in all on a 2-core host).
        batch = batch[:1]
    for i in batch:
        pools[i].start(runtime_config(specs[i]))
    for i in batch:
        with contextlib.suppress(WorkbenchError):
            pools[i].worker(runtime_config(specs[i]))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
