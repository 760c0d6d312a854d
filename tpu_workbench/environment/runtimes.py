"""The three runtimes a mode runs on, and everything that follows from which one it is.

The one place that decodes a runtime: callers ask it a question (does XLA compile this? does a
mesh mean one SPMD process or a gang of processes? which interpreter, which device?) instead of
comparing its name. A :class:`Runtime` is a string enum: written to JSON, compared and printed as
its name (``"xla"``).
"""

from __future__ import annotations

import enum
import os

# Every worker's OpenMP threads sleep at a barrier instead of spinning (libgomp reads this when
# torch loads it). Spinning threads on a busy 2-core host starve the thread they wait for: plain
# PyTorch's mingpt tiny step took 190-560 ms that way beside other work, 17-19 ms with PASSIVE
# (XLA:CPU's own thread pool does not spin so), which made the baseline look 10x slower than
# XLA. A user's own OMP_WAIT_POLICY wins.
WORKER_THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def worker_thread_env() -> dict[str, str]:
    """:data:`WORKER_THREAD_ENV`, each variable as this process's environment sets it if it
    does."""
    return {k: os.environ.get(k, v) for k, v in WORKER_THREAD_ENV.items()}


class Runtime(enum.StrEnum):
    TORCH = "torch"  # plain PyTorch: eager and inductor, on the CPU (or CUDA)
    XLA = "xla"  # torch_xla: XLA:CPU's virtual devices, or a TPU through PJRT
    TORCH_TPU = "torch_tpu"  # TorchTPU, the native "tpu" device (its own environment)

    @property
    def xla(self) -> bool:
        """XLA compiles every step in this process: PJRT's environment, ``XLA_FLAGS``, XLA's
        HLO dumps and persistent compile cache, virtual CPU devices, SPMD over a mesh."""
        return self is Runtime.XLA

    @property
    def package(self) -> str | None:
        """The module that must import for this runtime to run (None: torch alone)."""
        return {Runtime.XLA: "torch_xla", Runtime.TORCH_TPU: "torch_tpu"}.get(self)

    @property
    def gang_device(self) -> str | None:
        """Where a mesh runs when it is not SPMD: one process per device under torchrun on
        ``cpu`` (gloo) or ``tpu`` (TorchTPU's tpu_dist); None: a mesh is SPMD in one process."""
        return {Runtime.TORCH: "cpu", Runtime.TORCH_TPU: "tpu"}.get(self)

    @property
    def launch_name(self) -> str | None:
        """The name ``tpu-workbench launch --runtime`` gives it (None: no multi-host launch)."""
        return {Runtime.XLA: "torch_xla", Runtime.TORCH_TPU: "torch_tpu"}.get(self)

    def env(self) -> dict[str, str]:
        """This runtime's own variables in its workers' environment (XLA's come from the
        worker's :class:`~tpu_workbench.runs.spec.RuntimeConfig`)."""
        if self is Runtime.TORCH_TPU:  # torch_tpu registers its device only when autoloaded
            return {"TPU_WORKBENCH_RUNTIME": self.value, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
        if self is Runtime.TORCH:  # plain PyTorch stays plain where torch_tpu is installed:
            # loaded without a chip, torch_tpu 0.2.0 makes a CPU backward pass hang (libtpu)
            return {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        return {}

    def available(self) -> bool:
        """Whether modes of this runtime can run here (TorchTPU: installed and a chip found)."""
        if self is Runtime.XLA:
            from .backends import have_torch_xla

            return have_torch_xla()
        if self is Runtime.TORCH_TPU:
            from . import torchtpu

            return torchtpu.status().available
        return True

    def device(self, requested: str) -> str:
        """The concrete device for `requested` (``auto``, ``cpu``, ``tpu``, ``cuda``); a
        :class:`SpecError` says why one asked for cannot be used and what runs instead."""
        from ..errors import SpecError
        from . import backends

        if self is Runtime.TORCH_TPU:
            return "tpu"  # torchtpu.require() checked the chip and the device asked for
        if self is Runtime.XLA:
            if requested == "cuda":
                raise SpecError("device='cuda' is not offered for XLA modes here; use 'cpu' or "
                                "'tpu'")
            status = backends.tpu_status()
            if requested == "tpu" and not status.available:
                raise SpecError(f"device='tpu' was asked for but no TPU can be used: "
                                f"{status.reason}. What runs instead with device='auto' or "
                                f"'cpu': {status.fallback}.")
            if requested == "auto":
                return "tpu" if status.available else "cpu"
            return requested
        if requested == "tpu":
            raise SpecError("device='tpu' needs an XLA mode (eager, lazy, compile, dynamo) or a "
                            "TorchTPU mode (tpu_eager, tpu_fused, tpu_compile); torch_eager and "
                            "inductor run on plain PyTorch (cpu or cuda)")
        if requested == "cuda" and backends.cuda_devices() == 0:
            raise SpecError("device='cuda' was asked for but PyTorch sees no CUDA device; use "
                            "'cpu'")
        if requested == "auto":
            return "cuda" if backends.cuda_devices() else "cpu"
        return requested

    def python(self) -> str:
        """The interpreter its workers run under (TorchTPU's may be ``.venv-torchtpu``'s)."""
        import sys

        from .torchtpu import worker_python

        return worker_python() if self is Runtime.TORCH_TPU else sys.executable
