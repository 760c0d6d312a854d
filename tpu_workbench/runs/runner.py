"""Run experiments in worker processes, one warm worker per runtime configuration.

Why a separate process: torch_xla reads ``PJRT_DEVICE``, ``CPU_NUM_DEVICES`` and ``XLA_FLAGS`` once,
SPMD cannot be switched off, an unknown XLA flag aborts the process and a TPU is locked to one
process. So the notebook (or CLI) never imports torch_xla; it hands an
:class:`~tpu_workbench.runs.spec.ExperimentSpec` to a worker whose environment was set before
torch_xla was imported, and gets records back step by step while the run goes on.

>>> run = submit(ExperimentSpec(model="mlp", mode="lazy", steps=5))   # doctest: +SKIP
>>> for record in run:            # streamed while the worker trains
...     print(record["step"], record["wall_ms"])
>>> result = run.result()         # RunResult: records as a DataFrame, summary, artifacts

A worker that crashes, aborts, hangs past the timeout or is cancelled raises a
:class:`~tpu_workbench.errors.WorkerError` in the caller, which keeps the records streamed so far;
the caller's process is never at risk. Results are written to ``results/<run_id>/`` only when the
run completes (a failed run's records go to ``results/<run_id>-failed/``). ``run(spec,
reuse=True)`` loads a completed run of the same spec measured in the same environment (see
:mod:`tpu_workbench.runs.store`) instead of measuring again.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..environment.paths import results_dir
from ..errors import RunCancelled, RunFailed, RunTimeout, SpecError, WorkerCrashed, WorkerError
from ..records import records_frame
from . import gang
from .spec import PORT_TASKS, ExperimentSpec, RuntimeConfig, runtime_config
from .store import ENVIRONMENT_FILE, RunResult, artifacts, fingerprint, reusable
from .workers import WORKER_LOG_ENV, Worker, WorkerPool, default_pool  # noqa: F401

DEFAULT_RUN_TIMEOUT_S = 1800.0
CANCEL_GRACE_S = 10.0  # after this, a run that ignores a cancel has its worker killed


class Run:
    """A run in progress. Iterate it for streamed records; :meth:`result` waits for the end.

    The worker's reader thread feeds the run, so records accumulate (and a timeout fires) whether
    or not anybody iterates; any number of threads may iterate or wait.
    """

    def __init__(self, worker: Worker, spec: ExperimentSpec, task: str, timeout: float,
                 out_dir: Path | None, fp: dict[str, Any] | None = None):
        self.worker = worker
        self.fingerprint = fp if fp is not None else fingerprint(worker.config)
        self.worker_start_s = 0.0
        self.spec = spec
        self.task = task
        self.run_id = _new_run_id(spec, task)
        self.records: list[dict[str, Any]] = []
        self.state = "running"  # running | done | failed | cancelled | timeout | crashed
        self.error: WorkerError | None = None
        self.timeout = timeout
        self._result: RunResult | None = None
        self._cond = threading.Condition()
        self._cancel_requested = False
        self._timed_out = False
        self._t0 = time.perf_counter()
        self.final_dir = (out_dir or results_dir()) / self.run_id
        self.partial_dir = self.final_dir.with_name(self.run_id + ".partial")
        self._timer = threading.Timer(timeout, self._on_timeout)
        self._timer.daemon = True
        self._ending = threading.Lock()
        self._ended = False

    def _start(self) -> None:
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        self.worker.attach(self)
        if self.worker.runs_started == 0:
            self.worker_start_s = self.worker.start_s
        self.worker.runs_started += 1
        try:
            self.worker.send({"op": "run", "task": self.task, "run_id": self.run_id,
                              "spec": self.spec.to_dict(), "out_dir": str(self.partial_dir)})
        except OSError:  # the worker died before it got the run (its pipe is closed)
            self._finish("crashed", WorkerCrashed(
                f"run {self.run_id} lost its worker before it started: "
                f"{self.worker.death_message()}"))
            return
        # The clock starts once the worker has the run: a timer started before the send could
        # kill the worker first on a busy host (a 1 ms timeout did, under a CPU hog).
        self._timer.start()

    @property
    def done(self) -> bool:
        return self.state != "running"

    # -- fed by the worker's reader thread ---------------------------------------------------
    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "record":
            with self._cond:
                self.records.append(message["data"])
                self._cond.notify_all()
        elif kind == "done":
            self._finish("done", None, message.get("result") or {})
        elif kind == "error":
            self._finish("failed", RunFailed(
                f"run {self.run_id} failed in the worker: {message['etype']}: {message['message']}",
                remote_type=message["etype"], remote_traceback=message.get("traceback", "")))
        elif kind == "failed":  # a supervisor's own error (a gang's names its rank)
            self._finish(message["state"], message["error"])
        elif kind == "cancelled":
            self._finish("cancelled", RunCancelled(f"run {self.run_id} was cancelled"))
        elif kind == "_eof":
            n = len(self.step_records())
            if self._timed_out:
                self._finish("timeout", RunTimeout(
                    f"run {self.run_id} did not finish within {self.timeout:g} s; its worker was "
                    f"stopped ({n} steps streamed before that)"))
            elif self._cancel_requested:
                self._finish("cancelled", RunCancelled(
                    f"run {self.run_id} was cancelled (its worker did not stop within "
                    f"{CANCEL_GRACE_S:g} s and was killed; {n} steps streamed before that)"))
            else:
                self._finish("crashed", WorkerCrashed(
                    f"run {self.run_id} lost its worker: {self.worker.death_message()} "
                    f"({n} steps streamed before that)"))

    def _on_timeout(self) -> None:
        if self.state == "running":
            self._timed_out = True
            self.worker.kill()

    def _finish(self, state: str, error: WorkerError | None,
                summary: dict[str, Any] | None = None) -> None:
        with self._ending:  # once: a send that failed, then the pipe's end, would end it twice
            if self._ended:
                return
            self._ended = True
        self._timer.cancel()
        wall = time.perf_counter() - self._t0
        if error is not None:
            error.records = list(self.records)
            error.stderr_tail = self.worker.stderr_tail()
            self._save(self.final_dir.with_name(self.run_id + "-failed"), {"error": str(error)})
        else:
            measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
            self._save(self.final_dir, summary or {}, {
                "task": self.task, "measured_at": measured_at, "fingerprint": self.fingerprint,
                "runtime": self.worker.info, "wall_s": wall,
                "worker_start_s": self.worker_start_s})
            self._result = RunResult(self.spec, self.run_id, dict(self.worker.info), self.records,
                                     summary or {}, self.final_dir, wall,
                                     artifacts=artifacts(self.final_dir),
                                     measured_at=measured_at,
                                     worker_start_s=self.worker_start_s,
                                     fingerprint=self.fingerprint)
        self.worker.release()
        with self._cond:
            self.error = error
            self.state = state
            self._cond.notify_all()

    def _save(self, target: Path, summary: dict[str, Any],
              environment: dict[str, Any] | None = None) -> None:
        try:
            save_run(self.partial_dir, target, self.spec, self.records, summary, environment)
        except OSError as exc:  # a full disk must not hide the run's own outcome
            self.worker.stderr_lines.append(f"[runner] could not save results to {target}: {exc}")

    # -- for callers -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield each record as the worker streams it; raise the run's error at the end."""
        i = 0
        try:
            while True:
                with self._cond:
                    while i >= len(self.records) and self.state == "running":
                        self._cond.wait(0.5)
                    new = self.records[i:]
                    finished = self.state != "running"
                i += len(new)
                yield from new
                if finished and i >= len(self.records):
                    break
        except KeyboardInterrupt:  # the notebook interrupted the cell: stop the run too
            self.cancel()
            raise
        if self.error is not None:
            raise self.error

    def step_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind", "step") == "step"]

    def steps_frame(self):
        """Records streamed so far, as a DataFrame (handy for live charts)."""
        return records_frame(self.records)

    def cancel(self) -> None:
        """Ask the run to stop at its next step; kill the worker if it has not within the grace."""
        if self.state != "running" or self._cancel_requested:
            return
        self._cancel_requested = True
        self.worker.interrupt()

        def _kill_if_still_running() -> None:
            if self.state == "running":
                self.worker.kill()

        timer = threading.Timer(CANCEL_GRACE_S, _kill_if_still_running)
        timer.daemon = True
        timer.start()

    def result(self) -> RunResult:
        """Wait for the end of the run; return its result or raise its error."""
        try:
            with self._cond:
                while self.state == "running":
                    self._cond.wait(0.5)
        except KeyboardInterrupt:
            self.cancel()
            raise
        if self.error is not None:
            raise self.error
        assert self._result is not None
        return self._result


def save_run(partial_dir: Path, target: Path, spec: ExperimentSpec,
             records: list[dict[str, Any]], summary: dict[str, Any],
             environment: dict[str, Any] | None = None) -> None:
    """Write records, spec and summary (and, for a completed run, where and when it was
    measured) into `partial_dir`, next to the worker's artifacts, then publish the folder as
    `target` in one rename (so no reader sees it half-written). Raises OSError."""
    partial_dir.mkdir(parents=True, exist_ok=True)
    if environment is not None:
        (partial_dir / ENVIRONMENT_FILE).write_text(json.dumps(environment, indent=2, default=str))
    (partial_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2))
    (partial_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    frame = records_frame(records)
    if len(frame):
        frame.to_csv(partial_dir / "steps.csv", index=False)
    with (partial_dir / "records.jsonl").open("w") as fh:  # every record, as sent
        fh.writelines(json.dumps(r, default=str) + "\n" for r in records)
    if target.exists():
        shutil.rmtree(target)
    partial_dir.rename(target)


def _new_run_id(spec: ExperimentSpec, task: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.model)[-60:]  # "hf:llama", "dir/f.py:make"
    what = {"train": f"{model}-{spec.mode}", "probe": "probe"}.get(
        task, f"{model}-{spec.mode}-{task}")  # "hf_llama-lazy-generate"
    return f"{stamp}-{what}-{uuid.uuid4().hex[:6]}"


def submit(spec: ExperimentSpec, *, timeout: float = DEFAULT_RUN_TIMEOUT_S,
           pool: WorkerPool | None = None, out_dir: Path | None = None,
           task: str = "train") -> Run:
    """Validate `spec`, get a warm worker for its runtime and start the run; return at once.

    Blocks only while the worker is busy with an earlier run (or starting up).
    """
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    spec.validate()
    config = runtime_config(spec)
    if task in PORT_TASKS and config.runtime.xla:
        config = dataclasses.replace(config, explain_executions=True)
    fp = fingerprint(config, spec)  # before the run: what the environment was when it started
    # a mesh with a torch mode is a gang: N processes under torchrun, launched afresh
    worker = gang.Gang(config) if gang.is_gang(spec) else (pool or default_pool()).worker(config)
    worker.reserve()
    try:
        run = Run(worker, spec, task, timeout, out_dir, fp)
        run._start()
    except BaseException:
        worker.release()
        raise
    return run


def stored(spec: ExperimentSpec, **kwargs: Any) -> RunResult | None:
    """:func:`reusable` for a spec not validated yet (validating imports torch, and a stored
    run's spec was valid): a spec too malformed to look up has no stored run, and the caller's
    ``validate()`` then names what is wrong with it."""
    try:
        return reusable(spec, **kwargs)
    except (SpecError, KeyError, TypeError, ValueError, AttributeError):
        return None


def run(spec: ExperimentSpec, on_record: Callable[[dict[str, Any]], None] | None = None,
        *, reuse: bool = False, cold: bool = False, **kwargs: Any) -> RunResult:
    """Run `spec` to the end, calling `on_record` for each streamed record; see :func:`submit`.

    ``reuse=True`` returns a completed run of the same spec from the same environment if the
    results folder has one (:func:`reusable`; `on_record` still sees its records), and measures
    otherwise. ``cold=True`` measures in a fresh worker of its own, stopped afterwards, so no
    earlier run's compile cache can serve this one.
    """
    if reuse:
        found = stored(spec, task=kwargs.get("task", "train"), out_dir=kwargs.get("out_dir"),
                       cold=cold)
        if found is not None:
            for record in found.records:
                if on_record is not None:
                    on_record(record)
            return found
    own_pool = WorkerPool(max_workers=1) if cold else None
    if own_pool is not None:
        kwargs["pool"] = own_pool
    try:
        handle = submit(spec, **kwargs)
        for record in handle:
            if on_record is not None:
                on_record(record)
        return handle.result()
    finally:
        if own_pool is not None:
            own_pool.shutdown()


def probe(where: ExperimentSpec | RuntimeConfig | None = None,
          pool: WorkerPool | None = None) -> dict[str, Any]:
    """What the worker runtime really sees (device kind, count...), asked of a worker.

    `where` is a spec (its runtime is used), a RuntimeConfig, or None for the default XLA
    runtime (a TPU if one is free, else XLA:CPU with 8 virtual devices).
    """
    if isinstance(where, RuntimeConfig):
        config = where
    else:
        spec = where or ExperimentSpec(model="mlp", mode="lazy")
        config = runtime_config(spec)
    return dict((pool or default_pool()).worker(config).info)
