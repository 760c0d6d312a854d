"""Workers forked from a template process that has already imported torch.

A spawned worker spends 4-5 s of CPU on ``import torch`` (and the parts of it torch_xla loads)
before it imports its runtime; on a 2-core host several cold workers starting together pay it
several times over. :mod:`tpu_workbench.worker.template` pays it once per notebook kernel (or CLI,
or test process) and forks each worker from there. The child sets its own environment and then
imports torch_xla, so every worker still gets its runtime configuration before torch_xla reads it,
and still compiles from nothing.

:func:`fork_worker` returns a :class:`ForkedProcess` (the part of :class:`subprocess.Popen` a
:class:`~tpu_workbench.runs.workers.Worker` uses), or None where a fork would not be the same as a
spawn: another interpreter (TorchTPU's environment), a TPU device (kept to plain processes, which
the chip-lock check recognises), an environment variable torch reads at import that differs
from the template's, or ``TPU_WORKBENCH_TEMPLATE=0``. The caller then spawns as before.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..environment.runtimes import worker_thread_env

TEMPLATE_ENV = "TPU_WORKBENCH_TEMPLATE"  # "0": spawn every worker
START_TIMEOUT_S = 120.0
# Variables a child may set differently from the template: read by torch_xla, XLA or the
# workbench after the fork, never by `import torch`.
_CHILD_PREFIXES = ("XLA_", "PJRT_", "PT_XLA_", "TF_CPP_", "TPU_", "LIBTPU_", "CPU_NUM_DEVICES",
                   "PYTEST_")
# The template imports torch with no device backends autoloaded (a worker's choice to make).
_TEMPLATE_ENV_FIXED = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


class ForkedProcess:
    """A worker forked by the template: pid, text stdio, poll/wait/kill like ``Popen``."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int, status: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = os.fdopen(stdin, "w", encoding="utf-8", buffering=1)
        self.stdout = os.fdopen(stdout, encoding="utf-8", errors="replace")
        self.stderr = os.fdopen(stderr, encoding="utf-8", errors="replace")
        self._status: int | None = status  # the template writes the wait status here
        self._lock = threading.Lock()

    def _collect(self, timeout: float) -> int | None:
        with self._lock:
            if self.returncode is None and self._status is None:  # its template died first
                return 255 if _gone(self.pid) else None  # (255: the exit status is unknown)
            if self.returncode is not None:
                return self.returncode
            if not select.select([self._status], [], [], timeout)[0]:
                return None
            data = os.read(self._status, 64)
            os.close(self._status)
            self._status = None
            if data:
                self.returncode = os.waitstatus_to_exitcode(int(data))
            elif _gone(self.pid):
                self.returncode = 255
            return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self._collect(0.2)) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0)
            if self._status is None:
                time.sleep(0.2)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)


def _gone(pid: int) -> bool:
    """The process has exited (or is a zombie nobody reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


class _Template:
    """The template process and its socket."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="tpu_workbench_template_")
        self.path = os.path.join(self.folder, "s")
        self.env = {**os.environ, **worker_thread_env(), **_TEMPLATE_ENV_FIXED}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tpu_workbench.worker.template", self.path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=self.env, start_new_session=True)
        self.ready = threading.Event()
        self.ok = False
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        assert self.proc.stdout is not None
        self.ok = self.proc.stdout.readline().strip() == b"ready"
        self.ready.set()

    def usable(self) -> bool:
        return self.ready.wait(START_TIMEOUT_S) and self.ok and self.proc.poll() is None

    def matches(self, env: dict[str, str], against: dict[str, str] | None = None) -> bool:
        """Whether a child with `env` is what a spawn with `env` would be: every variable that
        differs from the template's (or from `against`) is one torch does not read at import."""
        base = self.env if against is None else against
        keys = set(env) | set(base)
        same = all(env.get(k) == base.get(k) or k.startswith(_CHILD_PREFIXES)
                   or k in _TEMPLATE_ENV_FIXED for k in keys)
        # Autoloading device backends at `import torch` (TorchTPU's loader) is on by default;
        # the template imported torch with it off, the same thing when none is installed.
        autoload = env.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "0"
        return same and not (autoload and _device_backends())

    def fork(self, env: dict[str, str]) -> ForkedProcess:
        pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, status
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(self.path)
                request = json.dumps({"env": env, "cwd": os.getcwd()}).encode()
                socket.send_fds(conn, [request], theirs)
                reply = json.loads(conn.makefile("rb").readline())
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        if "pid" not in reply:
            for fd in ours:
                os.close(fd)
            raise OSError(f"worker template refused: {reply.get('error')}")
        return ForkedProcess(reply["pid"], *ours)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()  # EOF: the template exits; its children carry on
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.folder)


@functools.cache
def _device_backends() -> bool:
    """Whether this interpreter has device backends `import torch` would autoload."""
    from importlib.metadata import entry_points

    return bool(entry_points(group="torch.backends"))


_TEMPLATE: _Template | None = None
_LOCK = threading.Lock()
_FAILED = False  # the template could not start once: spawn from then on


def enabled() -> bool:
    return os.environ.get(TEMPLATE_ENV, "1") != "0"


def warm() -> None:
    """Start the template now (without waiting), so the first fork does not wait for torch."""
    if enabled():
        _template(wait=False)


def _template(wait: bool = True, restart: bool = False) -> _Template | None:
    """The running template (started if need be); `restart`: a new one with this process's
    environment as it is now (the old one exits; the workers it forked carry on)."""
    global _TEMPLATE, _FAILED
    with _LOCK:
        if _FAILED:
            return None
        if restart and _TEMPLATE is not None:
            _TEMPLATE.stop()
        if restart or _TEMPLATE is None or _TEMPLATE.proc.poll() is not None:
            _TEMPLATE = _Template()
            import atexit

            atexit.register(_TEMPLATE.stop)
        template = _TEMPLATE
    if wait and not template.usable():
        _FAILED = True
        template.stop()
        return None
    return template


def fork_worker(python: str, device: str, env: dict[str, str]) -> ForkedProcess | None:
    """A worker forked from the template with `env`, or None if it must be spawned."""
    if not enabled() or python != sys.executable or device != "cpu":
        return None
    template = _template()
    if template is not None and not template.matches(env):
        # This process's environment changed since the template started (a test's setenv, a
        # user's os.environ edit): a template started now would match; one that differs from
        # this process's own environment in what torch reads (OMP_NUM_THREADS) would not.
        now = {**os.environ, **worker_thread_env(), **_TEMPLATE_ENV_FIXED}
        if template.env == now or not template.matches(env, against=now):
            return None
        template = _template(restart=True)
    if template is None or not template.matches(env):
        return None
    try:
        return template.fork(env)
    except (OSError, ValueError):  # a template that died between requests: spawn this one
        return None
