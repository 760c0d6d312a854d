"""Run several specs one after another and collect them into one comparison.

This is what a notebook's "compare modes" cell and the ``bench`` CLI share: streamed records from
every run gathered into one DataFrame (with ``model``, ``preset`` and ``mode`` columns), a
throttled callback for live charts and progress bars, and failures kept per run instead of
stopping the whole comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .errors import WorkbenchError
from .records import label, labelled_steps
from .runner import RunResult, WorkerPool, submit
from .spec import ExperimentSpec


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
        from .timing import summarize_results

        return summarize_results(self.results)

    @property
    def compiles(self) -> pd.DataFrame:
        """Every XLA compilation of the finished runs, with its cause."""
        from .timing import compile_events

        return compile_events(self.results)


def run_many(specs: Sequence[ExperimentSpec],
             on_update: Callable[[pd.DataFrame, ExperimentSpec, int], None] | None = None,
             every_s: float = 0.5, pool: WorkerPool | None = None,
             timeout: float | None = None, cold: bool = False) -> Comparison:
    """Run `specs` in order; call ``on_update(steps_so_far, spec, steps_done)`` at most every
    `every_s` seconds (and after each run) while they go on. A failed run is recorded in
    ``Comparison.errors`` with its partial records, and the next spec still runs.

    ``cold=True`` gives every run a fresh worker, so its first step pays the full compile (a warm
    worker serves graphs it compiled before, for any mode, from its cache).
    """
    for spec in specs:  # bad input fails before anything runs
        spec.validate()
    out = Comparison()
    done: list[pd.DataFrame] = []  # step frames of the runs that ended
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}

    def update(spec: ExperimentSpec, live: pd.DataFrame | None = None) -> None:
        if on_update is not None:
            frame = _concat(done + ([live] if live is not None else []))
            on_update(frame, spec, len(frame))

    for spec in specs:
        own_pool = WorkerPool(max_workers=1) if cold else None
        try:
            run = submit(spec, pool=own_pool or pool, **kwargs)
            last = 0.0
            for _ in run:
                if time.monotonic() - last >= every_s:
                    last = time.monotonic()
                    update(spec, labelled_steps(spec, run.records, run.run_id))
            result = run.result()
            out.results.append(result)
            done.append(labelled_steps(spec, result.records, result.run_id))
        except WorkbenchError as exc:
            out.errors[label(spec)] = exc
            partial = labelled_steps(spec, getattr(exc, "records", []), getattr(exc, "run_id", ""))
            out.partial.append(partial)
            done.append(partial)
        finally:
            if own_pool is not None:
                own_pool.shutdown()
        update(spec)
    return out


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
