"""Run experiments in worker processes, one warm worker per runtime configuration.

Why a separate process: torch_xla reads ``PJRT_DEVICE``, ``CPU_NUM_DEVICES`` and ``XLA_FLAGS`` once,
SPMD cannot be switched off, an unknown XLA flag aborts the process and a TPU is locked to one
process. So the notebook (or CLI) never imports torch_xla; it hands an
:class:`~tpu_workbench.spec.ExperimentSpec` to a worker whose environment was set before torch_xla
was imported, and gets records back step by step while the run goes on.

>>> run = submit(ExperimentSpec(model="mlp", mode="lazy", steps=5))   # doctest: +SKIP
>>> for record in run:            # streamed while the worker trains
...     print(record["step"], record["wall_ms"])
>>> result = run.result()         # RunResult: records as a DataFrame, summary, artifacts

A worker that crashes, aborts, hangs past the timeout or is cancelled raises a
:class:`~tpu_workbench.errors.WorkerError` in the caller, which keeps the records streamed so far;
the caller's process is never at risk. Results are written to ``results/<run_id>/`` only when the
run completes (a failed run's records go to ``results/<run_id>-failed/``). ``run(spec,
reuse=True)`` loads a completed run of the same spec measured in the same environment (see
:mod:`tpu_workbench.store`) instead of measuring again.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import RunCancelled, RunFailed, RunTimeout, WorkerCrashed, WorkerError
from .paths import results_dir
from .records import records_frame
from .spec import ExperimentSpec, RuntimeConfig, runtime_config
from .store import ENVIRONMENT_FILE, find_folder, fingerprint
from .torchtpu import worker_python

START_TIMEOUT_S = 300.0  # importing torch_xla on a busy 2-core machine can take a while
DEFAULT_RUN_TIMEOUT_S = 1800.0
CANCEL_GRACE_S = 10.0  # after this, a run that ignores a cancel has its worker killed
STDERR_LINES = 200
# XLA/TSL log lines: "2026-11-29 16:03:03.628607: E external/xla/...cc:109] message"
_XLA_LOG = re.compile(r"^\S+ \S+: ([IWEF]) \S+\] (.*)$")
# When set, every worker process started appends a line here (tests count worker starts).
WORKER_LOG_ENV = "TPU_WORKBENCH_WORKER_LOG"


@dataclass
class RunResult:
    """A finished run: its spec, streamed records, summary and where its artifacts are."""

    spec: ExperimentSpec
    run_id: str
    runtime: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path | None
    wall_s: float
    artifacts: dict[str, str] = field(default_factory=dict)
    measured_at: str = ""  # local time the run ended, "2026-12-01 12:03:04"
    reused: bool = False  # loaded from the results folder instead of measured now
    worker_start_s: float = 0.0  # spawn to ready of a fresh worker (0: a warm one served it)
    fingerprint: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self):
        """Per-step records as a DataFrame (one row per streamed ``step`` record)."""
        return records_frame(self.records)


class Worker:
    """One worker process for one :class:`RuntimeConfig`; serves one run at a time."""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.info: dict[str, Any] = {}
        self.stderr_lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        # XLA's error and fatal log lines, kept apart: a fatal flag error is followed by a
        # few hundred lines of flag usage that would push it out of the tail.
        self.error_lines: collections.deque[str] = collections.deque(maxlen=20)
        self._current: Run | None = None
        self.runs_started = 0
        self._spawned = time.perf_counter()
        self.start_s = float("nan")  # spawn to ready, seconds
        self._lock = threading.Lock()  # held for the length of a run
        self._write_lock = threading.Lock()
        self._ready = threading.Event()
        self._start_error: dict[str, Any] | None = None
        env = {**os.environ, **config.env()}
        if config.runtime == "xla" and config.explain_compiles:
            # torch_xla explains each compilation (cause, graph, Python frame) in this file.
            fd, self.debug_file = tempfile.mkstemp(prefix="tpu_workbench_xla_", suffix=".log")
            os.close(fd)
            env.update(PT_XLA_DEBUG_LEVEL="1", PT_XLA_DEBUG_FILE=self.debug_file)
        else:
            self.debug_file = ""
            env.pop("PT_XLA_DEBUG_LEVEL", None)
        self.dump_dir = ""
        if config.runtime == "xla" and config.dump_hlo:
            # XLA writes the HLO of every module it compiles here (before and after
            # optimisation, and after SPMD partitioning); runs copy out what they compiled.
            self.dump_dir = tempfile.mkdtemp(prefix="tpu_workbench_hlo_")
            flags = [env.get("XLA_FLAGS", ""), f"--xla_dump_to={self.dump_dir}",
                     "--xla_dump_hlo_as_text"]
            if config.spmd:
                flags.append("--xla_dump_hlo_pass_re=spmd-partitioning")
            env.update(XLA_FLAGS=" ".join(f for f in flags if f),
                       TPU_WORKBENCH_HLO_DUMP=self.dump_dir)
        if config.runtime != "xla":  # a plain-PyTorch worker must not see XLA settings
            for key in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_FLAGS", "XLA_USE_SPMD"):
                env.pop(key, None)
        self.proc = subprocess.Popen(
            # A TorchTPU worker runs under .venv-torchtpu's interpreter when this one lacks it.
            [worker_python(config.runtime), "-m", "tpu_workbench.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, text=True, bufsize=1, start_new_session=True,
        )
        if os.environ.get(WORKER_LOG_ENV):
            with open(os.environ[WORKER_LOG_ENV], "a") as log:
                log.write(f"{time.strftime('%H:%M:%S')} pid={self.proc.pid} {config.label()}\n")
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    # -- process plumbing -------------------------------------------------------------------
    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                self.stderr_lines.append(line.rstrip())
                continue
            if message.get("type") == "ready":
                self.start_s = time.perf_counter() - self._spawned
                self.info = message["info"]
                self._ready.set()
            elif message.get("type") == "error" and message.get("run_id") is None:
                self._start_error = message
            elif self._current is not None:
                self._current._handle(message)
        self.proc.wait()
        if self.debug_file:
            with contextlib.suppress(OSError):
                os.unlink(self.debug_file)
        if self.dump_dir:
            shutil.rmtree(self.dump_dir, ignore_errors=True)
        self._ready.set()  # wake a caller waiting for start-up
        if self._current is not None:
            self._current._handle({"type": "_eof"})

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip()
            self.stderr_lines.append(line)
            match = _XLA_LOG.match(line)
            if match and match.group(1) in "EF":
                self.error_lines.append(match.group(2))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def reserve(self) -> None:
        """Wait until no run holds this worker, then hold it (for :func:`submit`)."""
        self._lock.acquire()
        if not self.alive:  # died while we waited for it
            self._lock.release()
            raise WorkerCrashed(self.death_message(), stderr_tail=self.stderr_tail())

    def attach(self, run: Run) -> None:
        """Route the worker's messages to `run` from now on."""
        self._current = run

    def release(self) -> None:
        """The held run is over: messages go nowhere, the next run may start."""
        self._current = None
        if self._lock.locked():
            self._lock.release()

    def stderr_tail(self, n: int = 30) -> str:
        return "\n".join(list(self.stderr_lines)[-n:])

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Wait until the runtime is imported; raise WorkerCrashed if the worker died first."""
        if not self._ready.wait(timeout):
            self.kill()
            raise WorkerCrashed(f"worker for {self.config.label()} did not start within "
                                f"{timeout:.0f} s", stderr_tail=self.stderr_tail())
        if not self.info:
            self.proc.wait()
            raise WorkerCrashed(self.death_message(), stderr_tail=self.stderr_tail())
        return self.info

    def death_message(self) -> str:
        """Why the worker died, in words: the signal or exit code and XLA's fatal line if any."""
        code = self.proc.poll()
        if code is None:
            how = "is still running"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        text = f"worker process for {self.config.label()} {how}"
        if self._start_error:
            text += f" while starting: {self._start_error['etype']}: {self._start_error['message']}"
        if self.error_lines:
            text += "; XLA said: " + " / ".join(list(self.error_lines)[:3])
        elif code == -signal.SIGKILL:
            text += " (killed from outside, or out of memory)"
        return text

    def send(self, message: dict[str, Any]) -> None:
        with self._write_lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()

    def interrupt(self) -> None:
        """Ask the current run to stop at its next step boundary."""
        if self.alive:
            os.kill(self.proc.pid, signal.SIGUSR1)

    def kill(self) -> None:
        """Kill the worker and everything it started."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive and not self.busy:
            try:
                self.send({"op": "exit"})
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()


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

    def _start(self) -> None:
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        self.worker.attach(self)
        if self.worker.runs_started == 0:
            self.worker_start_s = self.worker.start_s
        self.worker.runs_started += 1
        self._timer.start()
        self.worker.send({"op": "run", "task": self.task, "run_id": self.run_id,
                          "spec": self.spec.to_dict(), "out_dir": str(self.partial_dir)})

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
                                     artifacts=_artifacts(self.final_dir),
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
        """Write records, spec and summary (and, for a completed run, where and when it was
        measured) next to the worker's artifacts, then publish the folder under its final name
        in one rename (so no reader sees it half-written)."""
        try:
            self.partial_dir.mkdir(parents=True, exist_ok=True)
            if environment is not None:
                (self.partial_dir / ENVIRONMENT_FILE).write_text(
                    json.dumps(environment, indent=2, default=str))
            (self.partial_dir / "spec.json").write_text(json.dumps(self.spec.to_dict(), indent=2))
            (self.partial_dir / "summary.json").write_text(
                json.dumps(summary, indent=2, default=str))
            frame = records_frame(self.records)
            if len(frame):
                frame.to_csv(self.partial_dir / "steps.csv", index=False)
            with (self.partial_dir / "records.jsonl").open("w") as fh:  # every record, as sent
                fh.writelines(json.dumps(r, default=str) + "\n" for r in self.records)
            if target.exists():
                shutil.rmtree(target)
            self.partial_dir.rename(target)
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


def _new_run_id(spec: ExperimentSpec, task: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    what = f"{spec.model}-{spec.mode}" if task == "train" else task
    return f"{stamp}-{what}-{uuid.uuid4().hex[:6]}"


def _artifacts(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): str(p) for p in sorted(folder.rglob("*"))
            if p.is_file()}


class WorkerPool:
    """Warm workers, one per runtime configuration, at most `max_workers` alive at once."""

    def __init__(self, max_workers: int = 3):
        self.max_workers = max_workers
        self._workers: collections.OrderedDict[RuntimeConfig, Worker] = collections.OrderedDict()
        self._lock = threading.Lock()

    def start(self, config: RuntimeConfig) -> None:
        """Start a worker for `config` if none is alive, without waiting for it to be ready."""
        with self._lock:
            worker = self._workers.get(config)
            if worker is None or not worker.alive:
                self._evict_idle()
                self._workers[config] = Worker(config)

    def idle(self) -> bool:
        """True when no worker of this pool is alive (none started yet, or all stopped)."""
        return not any(w.alive for w in self._workers.values())

    def worker(self, config: RuntimeConfig) -> Worker:
        """The live worker for `config`, started (and waited for) if needed."""
        with self._lock:
            worker = self._workers.get(config)
            if worker is not None and config.dump_hlo and worker.runs_started and not worker.busy:
                # A warm worker would serve graphs from its cache and XLA would dump nothing:
                # every HLO capture gets a worker that compiles from scratch.
                worker.stop()
            if worker is None or not worker.alive:
                self._evict_idle()
                worker = Worker(config)
                self._workers[config] = worker
            self._workers.move_to_end(config)
        worker.wait_ready()
        return worker

    def _evict_idle(self) -> None:
        for config, worker in list(self._workers.items()):
            if not worker.alive:
                del self._workers[config]
        while len(self._workers) >= self.max_workers:
            idle = [c for c, w in self._workers.items() if not w.busy]
            if not idle:
                break
            self._workers.pop(idle[0]).stop()

    def workers(self) -> dict[RuntimeConfig, Worker]:
        return dict(self._workers)

    def shutdown(self) -> None:
        """Stop every worker."""
        with self._lock:
            for worker in self._workers.values():
                worker.stop()
            self._workers.clear()


_POOL: WorkerPool | None = None


def default_pool() -> WorkerPool:
    """The process-wide pool (stopped at interpreter exit)."""
    global _POOL
    if _POOL is None:
        _POOL = WorkerPool()
        atexit.register(_POOL.shutdown)
    return _POOL


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
    fp = fingerprint(config)  # before the run: what the environment was when it started
    worker = (pool or default_pool()).worker(config)
    worker.reserve()
    run = Run(worker, spec, task, timeout, out_dir, fp)
    try:
        run._start()
    except BaseException:
        worker.release()
        raise
    return run


def run(spec: ExperimentSpec, on_record: Callable[[dict[str, Any]], None] | None = None,
        *, reuse: bool = False, cold: bool = False, **kwargs: Any) -> RunResult:
    """Run `spec` to the end, calling `on_record` for each streamed record; see :func:`submit`.

    ``reuse=True`` returns a completed run of the same spec from the same environment if the
    results folder has one (:func:`reusable`; `on_record` still sees its records), and measures
    otherwise. ``cold=True`` measures in a fresh worker of its own, stopped afterwards, so no
    earlier run's compile cache can serve this one.
    """
    if reuse:
        spec.validate()
        found = reusable(spec, task=kwargs.get("task", "train"), out_dir=kwargs.get("out_dir"))
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


def reusable(spec: ExperimentSpec, task: str = "train",
             out_dir: Path | None = None) -> RunResult | None:
    """The newest completed run of `spec` in the results folder that was measured in this very
    environment (same :func:`~tpu_workbench.store.fingerprint`), or None."""
    fp = fingerprint(runtime_config(spec))
    folder = find_folder(spec, task, fp, out_dir or results_dir())
    return None if folder is None else load_result(folder)


def load_result(folder: Path) -> RunResult:
    """A completed run, read back from its results folder (``reused=True``)."""
    environment = json.loads((folder / ENVIRONMENT_FILE).read_text())
    spec = ExperimentSpec.from_dict(json.loads((folder / "spec.json").read_text()))
    with (folder / "records.jsonl").open() as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    return RunResult(spec, folder.name, environment.get("runtime") or {}, records,
                     json.loads((folder / "summary.json").read_text()), folder,
                     float(environment.get("wall_s") or 0.0), artifacts=_artifacts(folder),
                     measured_at=str(environment.get("measured_at") or ""), reused=True,
                     worker_start_s=float(environment.get("worker_start_s") or 0.0),
                     fingerprint=environment.get("fingerprint") or {})


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
