"""The worker process's protocol: it runs experiments for one runtime configuration.

The runner starts it as ``python -m tpu_workbench.worker`` with the environment of a
:class:`~tpu_workbench.runs.spec.RuntimeConfig` (``PJRT_DEVICE``, ``CPU_NUM_DEVICES``,
``XLA_FLAGS``, ``XLA_USE_SPMD``) already set, so torch_xla reads them at import, once, as it must.
The worker imports its runtime at start (the slow part, ~4 s for torch_xla) and then serves runs
until told to exit, which keeps torch_xla's in-process compile cache warm between runs.

Protocol, one JSON object per line:

* commands on stdin: ``{"op": "run", "task": ..., "run_id": ..., "spec": {...}, "out_dir": ...}``
  and ``{"op": "exit"}``;
* messages on the protocol channel (the process's original stdout; anything else printed, by
  Python or by XLA's C++ code, goes to stderr): ``ready``, ``record`` (streamed while a run goes
  on), ``done``, ``error`` and ``cancelled``.

``SIGUSR1`` asks the current run to stop at its next step boundary.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ..runs.spec import PORT_TASKS
from .backend import backend_for


class Cancelled(Exception):
    """Raised inside a task at a step boundary after the runner asked it to stop."""


class TaskContext:
    """What a task gets: its run id and output folder, a way to stream records, a cancel check."""

    def __init__(self, channel: Any, run_id: str, out_dir: Path):
        self._channel = channel
        self.run_id = run_id
        self.out_dir = out_dir

    def emit(self, record: dict[str, Any]) -> None:
        """Stream one record to the runner right away."""
        _send(self._channel, {"type": "record", "run_id": self.run_id, "data": record})

    def check_cancel(self) -> None:
        """Raise :class:`Cancelled` if the runner asked this run to stop."""
        global _CANCEL
        if _CANCEL:
            _CANCEL = False
            raise Cancelled()


_CANCEL = False


def _on_cancel(signum: int, frame: Any) -> None:
    global _CANCEL
    _CANCEL = True


def _send(channel: Any, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message, default=_json_default) + "\n")
    channel.flush()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def runtime_info() -> dict[str, Any]:
    """Import the runtime the environment names and describe the devices it sees."""
    import torch

    return {"pid": os.getpid(), "torch": torch.__version__,
            **backend_for(runtime_from_env()).runtime_info()}


def runtime_from_env() -> str:
    """The worker's runtime, from the environment its RuntimeConfig set."""
    if os.environ.get("TPU_WORKBENCH_RUNTIME") == "torch_tpu":
        return "torch_tpu"
    return "xla" if os.environ.get("PJRT_DEVICE") else "torch"


def _run_task(task: str, ctx: TaskContext, spec: dict[str, Any]) -> dict[str, Any]:
    if task == "train":
        from .train import train

        return train(ctx, spec, backend_for(runtime_from_env()))
    if task == "generate":
        from .generate import generate

        return generate(ctx, spec, backend_for(runtime_from_env()))
    if task in PORT_TASKS:  # what blocks a TPU port (tpu_workbench.porting)
        from .port import port

        return port(ctx, spec, variant="as written" if task == "port" else "edited",
                    dynamo=task != "port_edited")
    if task == "probe":
        return runtime_info()
    if task == "trace":  # trace one step for libtpu's compiler (tpu_workbench.tpu_compile)
        from .tpu_trace import trace

        return trace(ctx, spec)
    raise ValueError(f"unknown task {task!r}")


def main(started: float | None = None) -> None:
    # The protocol gets the real stdout; fd 1 is pointed at stderr so stray prints (Python's or
    # XLA's C++ logging) can never corrupt it.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGUSR1, _on_cancel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook's Ctrl-C is the runner's business
    started = time.perf_counter() if started is None else started
    try:
        info = runtime_info()
        info["import_s"] = time.perf_counter() - started  # importing torch and the runtime
    except BaseException as exc:  # report, then die: a worker without a runtime is useless
        _send(channel, {"type": "error", "run_id": None, "etype": type(exc).__name__,
                        "message": str(exc), "traceback": traceback.format_exc()})
        raise
    _send(channel, {"type": "ready", "info": info})
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("op") == "exit":
            # Skip the interpreter's teardown (1.2-1.9 s of CPU with torch_xla loaded, measured
            # on XLA:CPU): every file a task writes is closed when its "done" was sent, and on
            # a 2-core host a dying worker's teardown would slow the next worker's timed steps.
            channel.flush()
            sys.stderr.flush()
            os._exit(0)
        global _CANCEL
        _CANCEL = False
        run_id = command["run_id"]
        ctx = TaskContext(channel, run_id, Path(command["out_dir"]))
        try:
            result = _run_task(command["task"], ctx, command.get("spec") or {})
            _send(channel, {"type": "done", "run_id": run_id, "result": result})
        except Cancelled:
            _send(channel, {"type": "cancelled", "run_id": run_id})
        except Exception as exc:
            _send(channel, {"type": "error", "run_id": run_id, "etype": type(exc).__name__,
                            "message": str(exc), "traceback": traceback.format_exc()})

