"""Altair charts, built from the workbench's DataFrames only (one submodule per topic).

Every function takes DataFrames with documented columns and returns an Altair chart; nothing here
runs experiments.
"""

from .modes import (
    compiles_per_mode,
    first_vs_steady,
    loss_curves,
    recompile_timeline,
    steady_times,
    step_times,
)
from .profiling import step_breakdown, timeline, top_ops

__all__ = ["compiles_per_mode", "first_vs_steady", "loss_curves", "recompile_timeline",
           "steady_times", "step_breakdown", "step_times", "timeline", "top_ops"]
