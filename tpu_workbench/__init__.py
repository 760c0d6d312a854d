"""tpu_workbench: learn, measure and debug PyTorch on TPUs (torch_xla on XLA:CPU or a TPU).

Importing this package is cheap and never imports torch_xla: XLA runs only in worker processes
(see :mod:`tpu_workbench.runner`).
"""

from __future__ import annotations

from . import charts, compile_cache, hlo, profiling, sharding, torchtpu
from .backends import describe, host_peak_flops, tpu_status, versions
from .chips import CHIPS, Chip, chip_table, get_chip
from .compile_cache import CacheStudy, PersistentCheck, cache_study, persistent_cache_check
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
from .models import load_trained, model_names
from .notebook import image_grid, run_live, smoke_mode
from .runner import RunResult, WorkerPool, default_pool, probe, records_frame, run, submit
from .spec import (
    MODES,
    ExperimentSpec,
    RuntimeConfig,
    available_modes,
    default_modes,
    runtime_config,
)
from .timing import compile_events, summarize, summarize_results
from .xla_flags import validate_xla_flags

__version__ = "0.1.0"

__all__ = [
    "available_modes", "default_modes", "torchtpu",
    "cache_study", "CacheStudy", "compile_cache", "PersistentCheck", "persistent_cache_check",
    "CHIPS", "MODES", "charts", "Chip", "chip_table", "Comparison", "compile_events",
    "default_pool", "describe", "ExperimentSpec", "get_chip", "hlo", "host_peak_flops",
    "image_grid", "label", "load_trained", "model_names", "probe", "profiling",
    "records_frame", "run", "run_live", "run_many", "RunCancelled", "RunFailed", "RunResult",
    "runtime_config", "RuntimeConfig", "RunTimeout", "sharding", "smoke_mode", "SpecError",
    "submit", "summarize", "summarize_results", "tpu_status", "validate_xla_flags", "versions",
    "WorkbenchError", "WorkerCrashed", "WorkerError", "WorkerPool",
]
