"""tpu_workbench: learn, measure and debug PyTorch on TPUs (torch_xla on XLA:CPU or a TPU).

Importing this package is cheap and never imports torch_xla: XLA runs only in worker processes
(see :mod:`tpu_workbench.runner`).
"""

from __future__ import annotations

from . import charts
from .backends import describe, host_peak_flops, tpu_status, versions
from .chips import CHIPS, Chip, chip_table, get_chip
from .errors import (
    RunCancelled,
    RunFailed,
    RunTimeout,
    SpecError,
    WorkbenchError,
    WorkerCrashed,
    WorkerError,
)
from .experiments import Comparison, label, run_many
from .models import model_names
from .notebook import smoke_mode
from .runner import RunResult, WorkerPool, default_pool, probe, records_frame, run, submit
from .spec import MODES, ExperimentSpec, RuntimeConfig, runtime_config
from .timing import summarize
from .xla_flags import validate_xla_flags

__version__ = "0.1.0"

__all__ = [
    "CHIPS", "Comparison", "charts", "label", "model_names", "run_many", "smoke_mode",
    "summarize", "MODES", "Chip", "ExperimentSpec", "RunCancelled", "RunFailed", "RunResult",
    "RunTimeout", "RuntimeConfig", "SpecError", "WorkbenchError", "WorkerCrashed", "WorkerError",
    "WorkerPool", "chip_table", "default_pool", "describe", "get_chip", "host_peak_flops",
    "probe", "records_frame", "run", "runtime_config", "submit", "tpu_status",
    "validate_xla_flags", "versions",
]
