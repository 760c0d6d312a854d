"""The one documented place for the records a run streams and the DataFrames made of them.

A worker streams one JSON record per event (:mod:`tpu_workbench.worker.train` writes them); each has
a ``kind``:

============ ==================================================================================
``step``     ``step`` (0-based; step 0 includes compilation), ``wall_ms`` (after the device
             finished), ``loss``, ``compiles`` (new XLA compilations in the step), ``cached``
             (compilations served from the cache), ``compile_ms``, ``executions``
``compile``  ``step``, ``count``, ``trigger`` (what the spec changed), ``cause`` (torch_xla's
             words), ``explanation`` (ours), ``graph_hash``, ``inputs``, ``outputs``, ``frame``
``layout``   what one device holds of one tensor (:data:`tpu_workbench.sharding.LAYOUT_COLUMNS`)
``info``     ``n_params``, ``batch_size``, ``device``
============ ==================================================================================

:func:`labelled_steps` adds the spec's ``model``, ``preset`` and ``mode`` (:data:`LABELS`) and the
``run_id``, which every steps DataFrame the library returns carries.
"""

from __future__ import annotations

from typing import Any

LABELS = ("model", "preset", "mode")


def require_columns(df: Any, columns: list[str], what: str) -> None:
    """Raise ValueError naming the missing columns of DataFrame `df` that `what` needs."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the frame has {list(df.columns)}")


def records_frame(records: list[dict[str, Any]]):
    """The ``step`` records as a pandas DataFrame, one row per step."""
    import pandas as pd

    return pd.DataFrame([r for r in records if r.get("kind", "step") == "step"])


def label(spec: Any) -> str:
    """Short name of a spec in charts and tables, e.g. ``mingpt/tiny/compile``."""
    return "/".join(str(getattr(spec, key)) for key in LABELS)


def labelled_steps(spec: Any, records: list[dict[str, Any]], run_id: str = ""):
    """Step records of one run with the spec's model, preset and mode as columns."""
    frame = records_frame(records)
    if len(frame):
        for key in LABELS:
            frame[key] = getattr(spec, key)
        frame["run_id"] = run_id
    return frame

