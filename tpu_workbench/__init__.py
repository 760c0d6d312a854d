"""tpu_workbench: learn, measure and debug PyTorch on TPUs (torch_xla on XLA:CPU or a TPU).

Importing this package is cheap: it imports neither torch, torch_xla, pandas nor altair. Each
public name below loads its module on first use (PEP 562), and XLA itself runs only in worker
processes (see :mod:`tpu_workbench.runs.runner`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_PUBLIC: dict[str, tuple[str, str | None]] = {
    # what runs here
    "describe": ("environment.describe", "describe"),
    "host_peak_flops": ("environment.backends", "host_peak_flops"),
    "tpu_status": ("environment.backends", "tpu_status"),
    "versions": ("environment.backends", "versions"),
    "CHIPS": ("environment.chips", "CHIPS"), "Chip": ("environment.chips", "Chip"),
    "chip_table": ("environment.chips", "chip_table"),
    "get_chip": ("environment.chips", "get_chip"),
    # what to run
    "ExperimentSpec": ("runs.spec", "ExperimentSpec"), "MODES": ("runs.spec", "MODES"),
    "CHANGES": ("runs.spec", "CHANGES"), "CAPTURES": ("runs.spec", "CAPTURES"),
    "OPTIMIZERS": ("runs.spec", "OPTIMIZERS"),
    "RuntimeConfig": ("runs.spec", "RuntimeConfig"),
    "available_modes": ("runs.spec", "available_modes"),
    "default_modes": ("runs.spec", "default_modes"),
    "runtime_config": ("runs.spec", "runtime_config"),
    "comparison_modes": ("runs.spec", "comparison_modes"), "hlo_modes": ("runs.spec", "hlo_modes"),
    "validate_xla_flags": ("environment.xla_flags", "validate_xla_flags"),
    "model_names": ("models", "model_names"), "load_trained": ("models", "load_trained"),
    "batch_items": ("models", "batch_items"),
    # running it
    "run": ("runs.runner", "run"),
    "submit": ("runs.runner", "submit"),
    "probe": ("runs.runner", "probe"),
    "RunResult": ("runs.store", "RunResult"), "WorkerPool": ("runs.workers", "WorkerPool"),
    "default_pool": ("runs.workers", "default_pool"), "reusable": ("runs.store", "reusable"),
    "warm_workers": ("runs.template", "warm"),
    "load_result": ("runs.store", "load_result"), "fingerprint": ("runs.store", "fingerprint"),
    "run_many": ("runs.experiments", "run_many"), "Comparison": ("runs.experiments", "Comparison"),
    "sweep": ("scale.sweeps", "sweep"), "grid": ("scale.sweeps", "grid"),
    "SweepResult": ("scale.sweeps", "SweepResult"), "LiveSteps": ("scale.sweeps", "LiveSteps"),
    "predict": ("planning.predict", "predict"), "fit_check": ("planning.predict", "fit_check"),
    "embedding_fit_table": ("sharding.fit", "embedding_fit_table"),
    "tpu_compile": ("tpu_compile", "tpu_compile"), "compile_proto": ("tpu_compile",
                                                                     "compile_proto"),
    "TPUCompile": ("tpu_compile", "TPUCompile"), "DoesNotFit": ("tpu_compile", "DoesNotFit"),
    "predicted_step_times": ("charts.predict", "predicted_step_times"),
    "predicted_vs_published": ("charts.predict", "predicted_vs_published"),
    "port": ("porting.report", "port"), "PortReport": ("porting.report", "PortReport"),
    "PORT_KINDS": ("porting.findings", "KINDS"),
    "validation": ("planning.validation", "validation"),
    "validation_record": ("planning.validation", "record_for"),
    "validation_summary": ("planning.validation", "summary"),
    "get_slice": ("environment.chips", "get_slice"),
    "slice_table": ("environment.chips", "slice_table"),
    "serve_plan": ("serving.serve", "serve_plan"),
    "serve_commands": ("serving.serve", "commands"),
    "ServePlan": ("serving.plan", "ServePlan"),
    "serving_runs": ("serving.published", "serving_runs"),
    "serving_record": ("serving.published", "serving_record"),
    "launch_plan": ("scale.launch", "launch_plan"), "LaunchPlan": ("scale.launch", "LaunchPlan"),
    "launch_runtimes": ("scale.launch", "RUNTIMES"), "launch_vias": ("scale.launch", "VIAS"),
    "step_collectives": ("planning.slice_plan", "step_collectives"),
    "model_step_collectives": ("planning.slice_plan", "model_step_collectives"),
    "run_acceptance": ("acceptance.checks", "acceptance"),
    "tpu_holder_details": ("environment.backends", "tpu_holder_details"),
    "cache_study": ("runs.compile_cache", "cache_study"),
    "CacheStudy": ("runs.compile_cache", "CacheStudy"),
    "persistent_cache_check": ("runs.compile_cache", "persistent_cache_check"),
    "PersistentCheck": ("runs.compile_cache", "PersistentCheck"),
    # what came back
    "label": ("records", "label"), "records_frame": ("records", "records_frame"),
    "summarize": ("timing", "summarize"), "summarize_results": ("timing", "summarize_results"),
    "roofline_targets": ("timing", "roofline_targets"),
    "roofline_roof": ("timing", "roofline_roof"),
    "roofline_slopes": ("timing", "roofline_slopes"),
    "compile_events": ("timing", "compile_events"),
    "fallbacks": ("timing", "fallbacks"),
    "startup_breakdown": ("timing", "startup_breakdown"),
    "steady_compiles": ("timing", "steady_compiles"),
    # generation
    "GenerationSpec": ("generation.spec", "GenerationSpec"),
    "generate": ("generation.runs", "generate"),
    "generate_many": ("generation.runs", "generate_many"),
    "generation_specs": ("generation.runs", "specs_for"),
    "stored_generation": ("generation.runs", "stored"),
    "generation_phase_hlo": ("generation.runs", "phase_hlo"),
    "trained_weights": ("generation.runs", "trained_weights"),
    "stored_weights": ("generation.runs", "stored_weights"),
    "generation_models": ("generation.spec", "generation_models"),
    "generation_modes": ("generation.spec", "generation_modes"),
    # TorchTitan
    "titan": ("titan.runs", "titan"), "titan_spec": ("titan.spec", "titan_spec"),
    "TitanSpec": ("titan.spec", "TitanSpec"), "titan_config": ("titan.config", "read"),
    "titan_losses": ("titan.runs", "losses_frame"),
    "titan_memory": ("titan.runs", "memory_frame"),
    "titan_first_losses": ("titan.runs", "first_losses"),
    "titan_plan": ("planning.titan", "titan_plan"),
    "titan_recorded_plans": ("planning.titan", "recorded_plans"),
    # notebooks
    "run_live": ("notebook", "run_live"), "smoke_mode": ("notebook", "smoke_mode"),
    "image_grid": ("notebook", "image_grid"),
    # errors
    **{name: ("errors", name) for name in (
        "WorkbenchError", "SpecError", "WorkerError", "WorkerCrashed", "RunFailed",
        "RunTimeout", "RunCancelled")},
    # analysis modules
    **{name: (name, None) for name in ("charts", "hlo", "notebook", "profiling", "sharding")},
    "compile_cache": ("runs.compile_cache", None), "gang": ("runs.gang", None),
    "generation": ("generation.analysis", None), "torchtpu": ("environment.torchtpu", None),
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
