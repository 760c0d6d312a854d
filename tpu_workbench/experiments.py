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
from .runner import RunResult, WorkerPool, records_frame, submit
from .spec import ExperimentSpec

LABELS = ("model", "preset", "mode")


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


def label(spec: ExperimentSpec) -> str:
    """Short name of a spec in charts and tables, e.g. ``mingpt/tiny/compile``."""
    return f"{spec.model}/{spec.preset}/{spec.mode}"


def labelled_steps(spec: ExperimentSpec, records: list[dict[str, Any]],
                   run_id: str = "") -> pd.DataFrame:
    """Step records of one run with the spec's model, preset and mode as columns."""
    frame = records_frame(records)
    if len(frame):
        for key in LABELS:
            frame[key] = getattr(spec, key)
        frame["run_id"] = run_id
    return frame


def run_many(specs: Sequence[ExperimentSpec],
             on_update: Callable[[pd.DataFrame, ExperimentSpec, int], None] | None = None,
             every_s: float = 0.5, pool: WorkerPool | None = None,
             timeout: float | None = None) -> Comparison:
    """Run `specs` in order; call ``on_update(steps_so_far, spec, steps_done)`` at most every
    `every_s` seconds (and after each run) while they go on. A failed run is recorded in
    ``Comparison.errors`` with its partial records, and the next spec still runs.
    """
    for spec in specs:  # bad input fails before anything runs
        spec.validate()
    out = Comparison()
    done_frames: list[pd.DataFrame] = []
    steps_done = 0
    for spec in specs:
        kwargs: dict[str, Any] = {"pool": pool}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            run = submit(spec, **kwargs)
        except WorkbenchError as exc:
            out.errors[label(spec)] = exc
            continue
        last = 0.0
        try:
            for record in run:
                if record.get("kind") == "step":
                    steps_done += 1
                now = time.monotonic()
                if on_update is not None and now - last >= every_s:
                    last = now
                    live = labelled_steps(spec, run.records, run.run_id)
                    on_update(_concat(done_frames + [live]), spec, steps_done)
            result = run.result()
            out.results.append(result)
            done_frames.append(labelled_steps(spec, result.records, result.run_id))
        except WorkbenchError as exc:
            out.errors[label(spec)] = exc
            partial = labelled_steps(spec, getattr(exc, "records", []), run.run_id)
            out.partial.append(partial)
            done_frames.append(partial)
        if on_update is not None:
            on_update(_concat(done_frames), spec, steps_done)
    return out


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
