"""Sweeps: many independent runs, on this host's worker pool or fanned out on a Ray cluster.

>>> specs = grid(ExperimentSpec(model="mlp", mode="torch_eager", steps=3),
...              {"batch_size": [8, 16, 32]})                         # validated, all of them
>>> result = sweep(specs, engine="ray")       # doctest: +SKIP  (an embedded local Ray)
>>> result.runs                      # run_id, state, host, node, attempts, concurrent, batch_size
>>> result.summary                            # one row per finished run, + batch_size and node

``engine="local"`` is today's warm worker pool (:func:`~tpu_workbench.runs.experiments.run_many`);
``engine="ray"`` runs each spec as a Ray task on the cluster at `address` (None: an embedded
local Ray) and streams its records back (:mod:`tpu_workbench.scale.ray_engine`). Either way every
run's folder lands in the driver's results folder, whole or not at all, and ``on_record`` sees
records as they are produced (each with the ``attempt`` that made it), so live charts work the
same for both. Either way at most one run times its steps on a host at a time: the local engine
runs one spec after another, and ``ray`` gives each node one run at a time unless
``runs_per_host`` says more (then their step times contend, and the runs table counts it).
"""

from __future__ import annotations

import dataclasses
import itertools
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import RunCancelled, SpecError, WorkbenchError, error_state
from ..records import labelled_steps
from ..runs.spec import ExperimentSpec
from ..runs.store import RunResult

ENGINES = ("local", "ray")
# Ray counts a resource in 1/10000ths: a run asks for 1/k of its host's, rounded down, so k
# runs share a host and never k + 1 (for k up to 100).
MAX_RUNS_PER_HOST = 100
RUN_COLUMNS = ["run_id", "state", "host", "node", "attempts", "concurrent", "model", "preset",
               "mode", "error"]


def grid(base: ExperimentSpec, axes: dict[str, Sequence[Any]]) -> list[ExperimentSpec]:
    """Every combination of `axes` (``{field: [values]}``) over `base`, the last axis varying
    fastest; each spec is validated before this returns, so a bad point fails before any run
    starts (SpecError naming the field or the point and what is valid)."""
    if not isinstance(base, ExperimentSpec):
        raise SpecError(f"grid needs an ExperimentSpec as its base, got {type(base).__name__}")
    if not isinstance(axes, dict) or not axes:
        raise SpecError(f"grid needs {{field: [values]}} with at least one field, got {axes!r}")
    names = [f.name for f in dataclasses.fields(ExperimentSpec)]
    for name, values in axes.items():
        if name not in names:
            raise SpecError(f"cannot sweep over unknown field {name!r}; ExperimentSpec fields: "
                            f"{', '.join(names)}")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise SpecError(f"grid field {name!r} needs a non-empty list of values, got "
                            f"{values!r}")
    specs = []
    for point in itertools.product(*axes.values()):
        changes = dict(zip(axes, point, strict=True))
        try:
            specs.append(base.replace(**changes).validate())
        except SpecError as exc:
            where = ", ".join(f"{k}={v!r}" for k, v in changes.items())
            raise SpecError(f"grid point {where}: {exc}") from None
    return specs


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["batch_size=8,16", "mesh=2x4,8x1"]`` (the CLI's ``--grid``) as grid axes, each value
    converted to its field's type (ints, floats, ``AxB`` meshes, booleans, ``none``)."""
    types = {f.name: str(f.type) for f in dataclasses.fields(ExperimentSpec)}
    axes: dict[str, list[Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not text.strip():
            raise SpecError(f"--grid {item!r} is not FIELD=V1,V2,... (e.g. batch_size=8,16,32)")
        if name not in types:
            raise SpecError(f"cannot sweep over unknown field {name!r}; ExperimentSpec fields: "
                            f"{', '.join(types)}")
        axes[name] = [_parse_value(name, types[name], v.strip()) for v in text.split(",")]
    return axes


def _parse_value(name: str, kind: str, text: str) -> Any:
    if text.lower() == "none" and "None" in kind:
        return None
    try:
        if name == "mesh":
            return tuple(int(n) for n in text.lower().split("x"))
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("bool"):
            return {"true": True, "false": False}[text.lower()]
        if kind.startswith("tuple"):
            return tuple(text.split("+"))  # capture=hlo+profile
    except (KeyError, ValueError):
        raise SpecError(f"--grid {name}: {text!r} is not a valid {kind} value") from None
    return text


def swept_fields(specs: Sequence[ExperimentSpec]) -> list[str]:
    """The spec fields whose values differ between `specs`, in the dataclass's order."""
    dicts = [s.to_dict() for s in specs]
    return [name for name in (dicts[0] if dicts else {})
            if len({repr(d[name]) for d in dicts}) > 1]


def _cell(value: Any) -> Any:
    """A field's value as a table cell: meshes as ``2x4``, other sequences joined."""
    if isinstance(value, tuple | list):
        return "x".join(map(str, value)) if all(isinstance(v, int) for v in value) \
            else "+".join(map(str, value))
    return value


@dataclass
class SweepRun:
    """One run of a sweep: its result, or its error and partial records."""

    spec: ExperimentSpec
    run_id: str
    state: str  # done | failed | crashed | timeout | cancelled
    host: str
    node: str  # Ray's node id; "local" for the local engine
    attempts: int = 1
    result: RunResult | None = None
    error: WorkbenchError | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    started: float | None = None  # time.time() on its host as its (last) attempt began
    ended: float | None = None  # ... and as its run ended; None if it never did


def _concurrent(run: SweepRun, runs: Sequence[SweepRun]) -> int | None:
    """How many other runs of the sweep ran on `run`'s host (by host name, so two Ray nodes on
    one machine count too) at some time between its start and end, from the host's clock:
    runs whose step times contended with its own. None where its end is unknown (its node
    died, or it was cancelled); such runs are not counted for the others either."""
    def known(r: SweepRun) -> bool:
        return r.started is not None and r.ended is not None

    if not known(run):
        return None
    return sum(1 for other in runs if other is not run and other.host == run.host
               and known(other) and other.started < run.ended and other.ended > run.started)


@dataclass
class SweepResult:
    """Every run of a sweep, with the swept fields and the node as columns of each frame."""

    runs_list: list[SweepRun]
    fields: list[str]
    engine: str

    def _columns(self, run: SweepRun) -> dict[str, Any]:
        return {**{f: _cell(getattr(run.spec, f)) for f in self.fields}, "node": run.node}

    @property
    def runs(self):
        """One row per spec: :data:`RUN_COLUMNS` plus a column per swept field; ``concurrent``
        counts the runs that shared its host while it ran (0 unless ``runs_per_host`` > 1)."""
        import pandas as pd

        rows = [{"run_id": r.run_id, "state": r.state, "host": r.host, "node": r.node,
                 "attempts": r.attempts, "concurrent": _concurrent(r, self.runs_list),
                 "model": r.spec.model, "preset": r.spec.preset,
                 "mode": r.spec.mode, "error": "" if r.error is None else str(r.error),
                 **self._columns(r)} for r in self.runs_list]
        return pd.DataFrame(rows, columns=list(dict.fromkeys(RUN_COLUMNS + self.fields)))

    @property
    def results(self) -> list[RunResult]:
        return [r.result for r in self.runs_list if r.result is not None]

    @property
    def errors(self) -> dict[str, WorkbenchError]:
        """run id -> error of every run that did not finish."""
        return {r.run_id or f"run {i}": r.error for i, r in enumerate(self.runs_list)
                if r.error is not None}

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def steps(self):
        """Step records of every run (failed runs' partial ones too), with the swept fields
        and ``node`` as columns."""
        import pandas as pd

        frames = []
        for r in self.runs_list:
            frame = labelled_steps(r.spec, r.result.records if r.result else r.records, r.run_id)
            if len(frame):
                frames.append(frame.assign(**self._columns(r)))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @property
    def summary(self):
        """:func:`~tpu_workbench.timing.summarize_results` of the finished runs, with the swept
        fields and ``node`` as columns."""
        from ..timing import summarize_results

        frame = summarize_results(self.results)
        if not len(frame):
            return frame
        extra = {r.run_id: self._columns(r) for r in self.runs_list}
        for name in [*self.fields, "node"]:
            frame[name] = [extra[rid][name] for rid in frame["run_id"]]
        return frame


class LiveSteps:
    """An ``on_record`` for :func:`sweep` that keeps the step records streamed so far and calls
    ``show(frame)`` at most every `every_s` seconds (a live chart: ``charts.step_times``
    colours by ``mode``, which here names the run's point, e.g. ``torch_eager batch_size=8``).
    When a run is retried its dead attempt's rows are dropped: the retry starts at step 0."""

    def __init__(self, specs: Sequence[ExperimentSpec], show: Callable[[Any], None] | None = None,
                 every_s: float = 2.0):
        self.fields = [f for f in swept_fields(specs) if f != "mode"]
        self.show, self.every_s = show, every_s
        self.rows: list[dict[str, Any]] = []
        self._attempt: dict[str, int] = {}  # point -> the newest attempt seen
        self._shown = 0.0

    def __call__(self, record: dict[str, Any], spec: ExperimentSpec) -> None:
        if record.get("kind", "step") != "step":
            return
        point = " ".join(f"{f}={_cell(getattr(spec, f))}" for f in self.fields)
        mode, attempt = f"{spec.mode} {point}".strip(), record.get("attempt", 1)
        if attempt > self._attempt.setdefault(mode, attempt):
            self._attempt[mode] = attempt
            self.rows = [r for r in self.rows if r["mode"] != mode]
        self.rows.append({**record, "mode": mode})
        if self.show is not None and time.monotonic() - self._shown >= self.every_s:
            self._shown = time.monotonic()
            self.show(self.frame())

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)


def sweep(specs: Sequence[ExperimentSpec], engine: str = "local", address: str | None = None,
          on_record: Callable[[dict[str, Any], ExperimentSpec], None] | None = None, *,
          on_run_start: Callable[[SweepRun], None] | None = None,
          on_run_end: Callable[[SweepRun], None] | None = None, max_retries: int = 1,
          cold: bool = False, timeout: float | None = None, num_cpus: int | None = None,
          cpus_per_run: float = 1, runs_per_host: int = 1,
          stop: threading.Event | None = None) -> SweepResult:
    """Run every spec on `engine` (``local`` or ``ray``) and return a :class:`SweepResult`.

    Every spec is validated, the engine and the address checked (an unreachable address fails
    within seconds, naming it) before any run starts. ``on_record(record, spec)`` is called for
    each streamed record, ``on_run_start(run)`` as a run is placed on a node (each attempt),
    ``on_run_end(run)`` as it ends, all in the caller's thread, one at a time. A run that
    fails is kept with its partial records and the others go on. With ``ray``: a run whose node
    dies is run again elsewhere up to `max_retries` times (each record carries its ``attempt``;
    only the last attempt's are saved); `num_cpus` sizes an embedded Ray; each CPU run asks for
    `cpus_per_run` CPUs, a TPU run for a whole TPU host; at most `runs_per_host` runs share a
    node at a time (default 1: more make their step times contend, and say so with a warning
    and the runs table's ``concurrent``). Setting `stop` cancels the runs not finished yet; the
    completed ones are kept.
    """
    if engine not in ENGINES:
        raise SpecError(f"unknown sweep engine {engine!r}; valid: {', '.join(ENGINES)}")
    specs = list(specs)
    if not specs:
        raise SpecError("sweep needs at least one spec (grid(base, {field: [values]}) makes them)")
    for spec in specs:
        if not isinstance(spec, ExperimentSpec):
            raise SpecError(f"sweep takes ExperimentSpecs, got {type(spec).__name__}")
        spec.validate()
    if not (isinstance(max_retries, int) and max_retries >= 0):
        raise SpecError(f"max_retries must be a whole number >= 0, got {max_retries!r}")
    if engine == "local" and address is not None:
        raise SpecError(f"address={address!r} needs engine='ray'; the local engine runs here")
    if not (isinstance(runs_per_host, int) and 1 <= runs_per_host <= MAX_RUNS_PER_HOST):
        raise SpecError(f"runs_per_host must be a whole number from 1 to {MAX_RUNS_PER_HOST}, "
                        f"got {runs_per_host!r}")
    if engine == "local" and runs_per_host != 1:
        raise SpecError(f"runs_per_host={runs_per_host} needs engine='ray'; the local engine "
                        "runs one spec at a time")
    fields = swept_fields(specs)
    if engine == "local":
        runs = _sweep_local(specs, on_record, on_run_start, on_run_end, cold, timeout, stop)
    else:
        if runs_per_host > 1:
            warnings.warn(f"runs_per_host={runs_per_host}: up to {runs_per_host} runs share a "
                          "host at a time, each with a full thread pool, so their step times "
                          "contend (the runs table's `concurrent` says which did)", stacklevel=2)
        runs = _sweep_ray(specs, address, on_record, on_run_start, on_run_end, max_retries,
                          cold, timeout, num_cpus, cpus_per_run, runs_per_host, stop)
    return SweepResult(runs, fields, engine)


def _sweep_local(specs, on_record, on_run_start, on_run_end, cold, timeout,
                 stop) -> list[SweepRun]:
    from ..runs.experiments import run_many

    host, runs = socket.gethostname(), []
    # No retries here, but the same `attempt` on every record as on Ray.
    forward = None if on_record is None else \
        (lambda record, spec: on_record({**record, "attempt": 1}, spec))
    for spec in specs:
        if stop is not None and stop.is_set():
            error = RunCancelled("the sweep was stopped before this run started")
            runs.append(SweepRun(spec, "", "cancelled", host, "local", 0, error=error))
            continue
        if on_run_start is not None:
            on_run_start(SweepRun(spec, "", "running", host, "local"))
        started = time.time()  # one run at a time: never two on this host's CPUs
        comparison = run_many([spec], cold=cold, timeout=timeout, on_record=forward)
        if comparison.results:
            result = comparison.results[0]
            run = SweepRun(spec, result.run_id, "done", host, "local", result=result)
        else:
            error = next(iter(comparison.errors.values()))
            run = SweepRun(spec, getattr(error, "run_id", ""), error_state(error), host, "local",
                           error=error,
                           records=list(getattr(error, "records", [])))
        run.started, run.ended = started, time.time()
        runs.append(run)
        if on_run_end is not None:
            on_run_end(run)
    return runs


def _sweep_ray(specs, address, on_record, on_run_start, on_run_end, max_retries, cold, timeout,
               num_cpus, cpus_per_run, runs_per_host, stop) -> list[SweepRun]:
    from . import ray_engine  # imports ray: only a Ray sweep pays for it

    ray_engine.connect(address, num_cpus)

    def convert(out) -> SweepRun:
        return SweepRun(out.spec, out.run_id, out.state, out.host, out.node_id, out.attempts,
                        out.result, out.error, out.records, out.started, out.ended)

    def ended(out) -> None:
        if on_run_end is not None:
            on_run_end(convert(out))

    def started(out) -> None:
        if on_run_start is not None:
            on_run_start(dataclasses.replace(convert(out), state="running"))

    outcomes = ray_engine.run_specs(specs, on_record, ended, started, max_retries=max_retries,
                                    cold=cold, timeout=timeout, cpus_per_run=cpus_per_run,
                                    runs_per_host=runs_per_host, stop=stop)
    return [convert(out) for out in outcomes]
