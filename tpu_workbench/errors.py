"""The workbench's exceptions: bad input, and what can go wrong in a worker.

Every worker failure keeps the records streamed before it (``.records``) and the tail of the
worker's stderr (``.stderr_tail``), so a notebook can still show what ran.
"""

from __future__ import annotations

from typing import ClassVar


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


class SpecError(WorkbenchError, ValueError):
    """Bad input, found before any worker starts or anything compiles."""


class WorkerError(WorkbenchError):
    """A run did not finish; the records streamed so far are kept."""

    state: ClassVar[str] = "failed"  # what a sweep's runs table says of a run that raised it

    def __init__(self, message: str, records: list[dict] | None = None, stderr_tail: str = ""):
        super().__init__(message)
        self.records = list(records or [])
        self.stderr_tail = stderr_tail


class WorkerCrashed(WorkerError):
    """The worker process died (killed, aborted by XLA, out of memory...)."""

    state = "crashed"


class RunTimeout(WorkerError):
    """The run took longer than its timeout; the worker was stopped."""

    state = "timeout"


class RunCancelled(WorkerError):
    """The run was cancelled by the caller."""

    state = "cancelled"


class RunFailed(WorkerError):
    """The code in the worker raised; the worker itself is still usable."""

    def __init__(self, message: str, records: list[dict] | None = None, stderr_tail: str = "",
                 remote_type: str = "", remote_traceback: str = ""):
        super().__init__(message, records, stderr_tail)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


# A worker error by its class name, as it crosses a process boundary (a Ray task's message).
WORKER_ERRORS: dict[str, type[WorkerError]] = {
    cls.__name__: cls for cls in (WorkerError, WorkerCrashed, RunTimeout, RunCancelled, RunFailed)}


def error_state(error: BaseException | str) -> str:
    """The state a run that ended with `error` (or an error class's name) is in: ``crashed``,
    ``timeout``, ``cancelled`` or ``failed``."""
    cls = WORKER_ERRORS.get(error) if isinstance(error, str) else type(error)
    return getattr(cls, "state", "failed")
