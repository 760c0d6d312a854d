"""Altair charts, built from the workbench's DataFrames only (one submodule per topic).

Every function takes DataFrames with documented columns and returns an Altair chart; nothing here
runs experiments.
"""

from ._common import save_chart
from .hlo import diff_chart, kernel_mix, op_mix, roofline, roofline_points
from .kernels import kernel_errors, kernel_schedule, score_tiles
from .modes import (
    cache_first_steps,
    compiles_per_mode,
    first_vs_steady,
    loss_curves,
    recompile_timeline,
    steady_times,
    step_times,
)
from .port import port_steps
from .profiling import step_breakdown, timeline, top_ops
from .results import confusion_matrix
from .sharding import (
    collective_bytes,
    fit_bars,
    layout_grid,
    memory_bars,
    step_time_per_strategy,
    step_times_per_run,
)
from .sweep import sweep_times
from .titan import titan_losses, titan_memory

__all__ = [
    "titan_losses", "titan_memory",
    "cache_first_steps", "collective_bytes", "confusion_matrix", "compiles_per_mode", "diff_chart",
    "first_vs_steady", "kernel_errors", "kernel_mix", "kernel_schedule", "layout_grid",
    "loss_curves", "memory_bars", "op_mix", "port_steps", "recompile_timeline", "roofline",
    "roofline_points",
    "save_chart", "score_tiles", "steady_times", "step_breakdown",
    "fit_bars", "step_time_per_strategy", "step_times", "step_times_per_run", "timeline", "top_ops",
    "sweep_times",
]
