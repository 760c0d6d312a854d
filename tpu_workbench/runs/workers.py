"""Worker processes: one per runtime configuration, started, watched and stopped here.

A :class:`Worker` is the process plumbing (its environment set before torch_xla is imported, the
line protocol, the stderr tail and XLA's error lines, death messages); a :class:`WorkerPool`
keeps warm workers, one per :class:`~tpu_workbench.runs.spec.RuntimeConfig`. Runs themselves (what a
worker is asked to do, and what comes back) are :mod:`tpu_workbench.runs.runner`'s.
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
from typing import Any

from ..environment import backends
from ..errors import WorkerCrashed, WorkerError
from .spec import RuntimeConfig
from .template import ForkedProcess, fork_worker
from .template import warm as warm_template

START_TIMEOUT_S = 300.0  # importing torch_xla on a busy 2-core machine can take a while
STDERR_LINES = 200
# XLA/TSL log lines: "2026-11-29 16:03:03.628607: E external/xla/...cc:109] message"
_XLA_LOG = re.compile(r"^\S+ \S+: ([IWEF]) \S+\] (.*)$")
# When set, every worker process started appends a line here (tests count worker starts).
WORKER_LOG_ENV = "TPU_WORKBENCH_WORKER_LOG"


class ChipBusy(WorkerError):
    """A run needs the TPU and a process this pool may not end holds it (``holders``)."""

    def __init__(self, message: str, holders: list[Any] | None = None):
        super().__init__(message)
        self.holders = holders or []


class Worker:
    """One worker process for one :class:`RuntimeConfig`; serves one run at a time."""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.info: dict[str, Any] = {}
        self.stderr_lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        # XLA's error and fatal log lines, kept apart: a fatal flag error is followed by a
        # few hundred lines of flag usage that would push it out of the tail.
        self.error_lines: collections.deque[str] = collections.deque(maxlen=20)
        self._current: Any = None  # the Run this worker serves now
        self.runs_started = 0
        self._spawned = time.perf_counter()
        self.start_s = float("nan")  # spawn to ready, seconds
        self._lock = threading.Lock()  # held for the length of a run
        self._write_lock = threading.Lock()
        self._ready = threading.Event()
        self._start_error: dict[str, Any] | None = None
        env = {**os.environ, **config.env()}
        if config.runtime.xla and (config.explain_compiles or config.explain_executions):
            # torch_xla explains each compilation (cause, graph, Python frame) in this file, and
            # at level 2 each execution too (its frames: up to 64, so the model's line is in)
            fd, self.debug_file = tempfile.mkstemp(prefix="tpu_workbench_xla_", suffix=".log")
            os.close(fd)
            env.update(PT_XLA_DEBUG_LEVEL="2" if config.explain_executions else "1",
                       PT_XLA_DEBUG_FILE=self.debug_file, PT_XLA_DEBUG_MAX_FRAME="64")
        else:
            self.debug_file = ""
            env.pop("PT_XLA_DEBUG_LEVEL", None)
        self.dump_dir = ""
        if config.runtime.xla and config.dump_hlo:
            # XLA writes the HLO of every module it compiles here (before and after
            # optimisation, and after SPMD partitioning); runs copy out what they compiled.
            self.dump_dir = tempfile.mkdtemp(prefix="tpu_workbench_hlo_")
            flags = [env.get("XLA_FLAGS", ""), f"--xla_dump_to={self.dump_dir}",
                     "--xla_dump_hlo_as_text"]
            if config.spmd:
                flags.append("--xla_dump_hlo_pass_re=spmd-partitioning")
            # XLA_IR_DEBUG + XLA_HLO_DEBUG: every instruction's metadata names the aten op and
            # the Python line that made it (source_file, source_line), which the HLO views
            # show beside each kernel. Only HLO captures pay for recording the frames.
            env.update(XLA_FLAGS=" ".join(f for f in flags if f),
                       TPU_WORKBENCH_HLO_DUMP=self.dump_dir, XLA_IR_DEBUG="1",
                       XLA_HLO_DEBUG="1")
        if not config.runtime.xla:  # a plain-PyTorch worker must not see XLA settings
            for key in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_FLAGS", "XLA_USE_SPMD"):
                env.pop(key, None)
        # A TorchTPU worker runs under .venv-torchtpu's interpreter when this one lacks it.
        python = config.runtime.python()
        # Forked from a process that has imported torch where that is the same as a spawn.
        forked = fork_worker(python, config.device, env)
        self.forked = forked is not None
        self.proc: subprocess.Popen | ForkedProcess = forked or subprocess.Popen(
            [python, "-m", "tpu_workbench.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, text=True, bufsize=1, start_new_session=True,
        )
        # So the chip-lock check can tell this worker (ours to release when idle) from others.
        backends.register_own_worker(self.proc.pid, self)
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
        backends.unregister_own_worker(self.proc.pid)
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

    def attach(self, run: Any) -> None:
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
                if config.device == "tpu":
                    try:
                        self.release_chip()
                    except ChipBusy:  # not now: worker() frees it, or says who holds it
                        return
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
                if config.device == "tpu":  # a TPU admits one process: free it or say who has it
                    self.release_chip()
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

    def release_chip(self, proc_root: str = "/proc") -> list[int]:
        """Make the TPU free for a new worker: end this process's idle workers that hold it (their
        warm caches are lost: a TPU admits one process) and return their pids. Raise
        :class:`ChipBusy` naming every other holder, which is never ended here: a busy worker
        of ours, another kernel's worker, or a process the workbench did not start."""
        holders = backends.tpu_holder_details(proc_root)
        released = []
        for holder in holders:
            if holder.idle:  # ours (this pool's or another of this process's pools) and idle
                backends.own_worker(holder.pid).stop()
                released.append(holder.pid)
        self._workers = collections.OrderedDict(
            (c, w) for c, w in self._workers.items() if w.alive)
        others = [h for h in holders if h.pid not in released]
        if others:
            raise ChipBusy(backends.holders_message(others), holders=others)
        return released

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
        warm_template()  # its torch import overlaps whatever the caller does before a run
    return _POOL


