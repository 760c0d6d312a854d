"""tpu_workbench: learn, measure and debug PyTorch on TPUs (torch_xla on XLA:CPU or a TPU).

Importing this package is cheap: it imports neither torch, torch_xla, pandas nor altair. Each
public name below loads its module on first use (PEP 562), and XLA itself runs only in worker
processes (see :mod:`tpu_workbench.runner`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_PUBLIC: dict[str, tuple[str, str | None]] = {
    # what runs here
    "describe": ("environment", "describe"),
    "host_peak_flops": ("backends", "host_peak_flops"),
    "tpu_status": ("backends", "tpu_status"),
    "versions": ("backends", "versions"),
    "CHIPS": ("chips", "CHIPS"), "Chip": ("chips", "Chip"),
    "chip_table": ("chips", "chip_table"), "get_chip": ("chips", "get_chip"),
    # what to run
    "ExperimentSpec": ("spec", "ExperimentSpec"), "MODES": ("spec", "MODES"),
    "CHANGES": ("spec", "CHANGES"), "CAPTURES": ("spec", "CAPTURES"),
    "RuntimeConfig": ("spec", "RuntimeConfig"), "available_modes": ("spec", "available_modes"),
    "default_modes": ("spec", "default_modes"), "runtime_config": ("spec", "runtime_config"),
    "comparison_modes": ("spec", "comparison_modes"), "hlo_modes": ("spec", "hlo_modes"),
    "validate_xla_flags": ("xla_flags", "validate_xla_flags"),
    "model_names": ("models", "model_names"), "load_trained": ("models", "load_trained"),
    # running it
    "run": ("runner", "run"), "submit": ("runner", "submit"), "probe": ("runner", "probe"),
    "RunResult": ("store", "RunResult"), "WorkerPool": ("workers", "WorkerPool"),
    "default_pool": ("workers", "default_pool"), "reusable": ("store", "reusable"),
    "warm_workers": ("worker_template", "warm"),
    "load_result": ("store", "load_result"), "fingerprint": ("store", "fingerprint"),
    "run_many": ("experiments", "run_many"), "Comparison": ("experiments", "Comparison"),
    "sweep": ("sweeps", "sweep"), "grid": ("sweeps", "grid"),
    "SweepResult": ("sweeps", "SweepResult"), "LiveSteps": ("sweeps", "LiveSteps"),
    "predict": ("planning", "predict"), "fit_check": ("planning", "fit_check"),
    "predicted_step_times": ("charts.predict", "predicted_step_times"),
    "get_slice": ("chips", "get_slice"), "slice_table": ("chips", "slice_table"),
    "launch_plan": ("launch", "launch_plan"), "LaunchPlan": ("launch", "LaunchPlan"),
    "launch_runtimes": ("launch", "RUNTIMES"), "launch_vias": ("launch", "VIAS"),
    "step_collectives": ("slice_plan", "step_collectives"),
    "model_step_collectives": ("slice_plan", "model_step_collectives"),
    "run_acceptance": ("acceptance", "acceptance"),
    "tpu_holder_details": ("backends", "tpu_holder_details"),
    "cache_study": ("compile_cache", "cache_study"), "CacheStudy": ("compile_cache", "CacheStudy"),
    "persistent_cache_check": ("compile_cache", "persistent_cache_check"),
    "PersistentCheck": ("compile_cache", "PersistentCheck"),
    # what came back
    "label": ("records", "label"), "records_frame": ("records", "records_frame"),
    "summarize": ("timing", "summarize"), "summarize_results": ("timing", "summarize_results"),
    "roofline_targets": ("timing", "roofline_targets"),
    "roofline_roof": ("timing", "roofline_roof"),
    "compile_events": ("timing", "compile_events"),
    "fallbacks": ("timing", "fallbacks"),
    "startup_breakdown": ("timing", "startup_breakdown"),
    # generation
    "GenerationSpec": ("generation_spec", "GenerationSpec"),
    "generate": ("generation_runs", "generate"),
    "generate_many": ("generation_runs", "generate_many"),
    "generation_specs": ("generation_runs", "specs_for"),
    "stored_generation": ("generation_runs", "stored"),
    "generation_phase_hlo": ("generation_runs", "phase_hlo"),
    "generation_models": ("generation_spec", "generation_models"),
    "generation_modes": ("generation_spec", "generation_modes"),
    # notebooks
    "run_live": ("notebook", "run_live"), "smoke_mode": ("notebook", "smoke_mode"),
    "image_grid": ("notebook", "image_grid"),
    # errors
    **{name: ("errors", name) for name in (
        "WorkbenchError", "SpecError", "WorkerError", "WorkerCrashed", "RunFailed",
        "RunTimeout", "RunCancelled")},
    # analysis modules
    **{name: (name, None) for name in (
        "charts", "compile_cache", "gang", "generation", "hlo", "notebook", "profiling", "sharding",
        "torchtpu")},
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tpu_workbench' has no attribute {name!r}")
    module, attr = _PUBLIC[name]
    mod = importlib.import_module(f"{__name__}.{module}")
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
