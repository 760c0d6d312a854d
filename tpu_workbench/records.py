"""The one documented place for the records a run streams and the DataFrames made of them.

A worker streams one JSON record per event (:mod:`tpu_workbench.worker.train` writes them); each has
a ``kind``:

=============== ===============================================================================
``step``        ``step`` (0-based; step 0 includes compilation), ``wall_ms`` (after the device
                finished), ``loss``, ``compiles`` (new XLA compilations in the step), ``cached``
                (compilations served from the cache), ``compile_ms``, ``executions``;
                ``fallbacks`` (torch_xla runs only: calls of ops that ran outside XLA in the
                step) and ``graph_breaks`` (``dynamo``/``inductor``: breaks Dynamo made while
                tracing the step), absent where the runtime does not measure them
``compile``     ``step``, ``count``, ``trigger`` (what the spec changed), ``cause`` (torch_xla's
                words), ``explanation`` (ours), ``graph_hash``, ``inputs``, ``outputs``,
                ``frame``
``fallback``    ``step``, ``op`` (torch_xla's counter name, ``aten::<op>``), ``count`` (calls in
                the step); one per op that ran on the CPU in that step
``graph_break`` ``step``, ``reason`` (Dynamo's first line), ``detail`` (its explanation),
                ``where`` (``file:line in function``), ``line`` (the source), ``count``,
                ``skipped_frame``: ``file:line in function`` of the function Dynamo gave up
                on whole (a break inside a for/while loop: no graph, it ran uncompiled),
                "" for a break Dynamo compiled around
``layout``      what one device holds of one tensor
                (:data:`tpu_workbench.sharding.LAYOUT_COLUMNS`)
``info``        ``n_params``, ``batch_size``, ``device``
``tpu_metrics`` a TPU only: libtpu's monitoring SDK sampled between steps
                (:mod:`tpu_workbench.worker.monitoring`): ``step``, ``t_s`` (since the steps
                began), ``chips`` (the host's chips the run uses, by device index: its one
                device, or every device of its mesh), ``duty_cycle_pct``,
                ``tensorcore_util_pct``, ``hbm_used_bytes``, ``hbm_total_bytes`` (means over
                those chips; ``<column>_per_chip`` lists them in ``chips`` order)
``token``       a ``generate`` run's generated token (:mod:`tpu_workbench.worker.generate`):
                ``strategy``, ``request``, ``prompt_len``, ``token`` (0: from the prefill),
                ``phase`` (prefill / decode), ``seq_len`` (tokens fed in), ``cache_len``,
                ``wall_ms`` (after the device finished), ``compiles``, ``cached``,
                ``compile_ms``, ``executions``, ``cache_bytes``, ``token_id`` and
                ``top_logit`` (first prompt of the batch); its ``compile`` records add
                ``strategy``, ``request``, ``token``, ``phase``
                (:data:`tpu_workbench.generation.analysis.TOKEN_COLUMNS`)
``collective``  a gang only (:mod:`tpu_workbench.runs.gang`): one collective of the step rank 0
                counted with ``CommDebugMode``: ``step``, ``collective`` (all-gather,
                reduce-scatter, all-reduce...), ``op`` (the c10d op), ``module``, ``phase``
                (forward / backward), ``bytes`` and ``shape`` of its result, ``group`` (ranks)
``gang``        a gang only: ``launcher_pid`` (torchrun), ``rank_pids``, ``processes``,
                ``command``
=============== ===============================================================================

A gang's ``step`` records (rank 0's) also carry ``rank_wall_ms`` (every rank's step time, in
rank order: stragglers show), ``rank_loss`` (each rank's loss on its slice of the batch),
``slowest_rank`` and ``comm_debug`` (the step ran under ``CommDebugMode``); ``loss`` is the
whole batch's (the ranks' mean).

TorchTPU ``step`` records also carry ``sync_ms``: the step timed to when
``torch.accelerator.synchronize()`` returned, where ``wall_ms`` runs on to the loss's
device-to-host read (the two differ when synchronize does not wait for compiled work).

:func:`labelled_steps` adds the spec's ``model``, ``preset`` and ``mode`` (:data:`LABELS`) and the
``run_id``, which every steps DataFrame the library returns carries.
"""

from __future__ import annotations

from typing import Any

LABELS = ("model", "preset", "mode")

# :func:`tpu_workbench.timing.fallbacks`: one row per op that ran outside the compiler or graph
# break of a run. ``kind`` "fallback" or "graph_break"; ``op`` the op (``aten::<op>``) or the
# break's reason, "none" with ``count`` 0 for a run that measured none of that kind; ``where``
# and ``line`` the source of a graph break; ``skipped_frame`` the function a graph break made
# Dynamo skip whole, so it ran uncompiled ("" otherwise); ``count`` calls (fallback) or breaks
# over the run; ``per_step`` calls per step of the run (fallbacks); ``steps`` the steps it
# happened in ("0-19"); ``note`` what it means.
FALLBACK_COLUMNS = ["model", "preset", "mode", "kind", "op", "where", "line", "skipped_frame",
                    "count", "per_step", "steps", "note", "run_id"]


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

