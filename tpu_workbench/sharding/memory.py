"""Memory per device of a run, from its layouts and XLA's own report (whether a plan fits a
slice's HBM is :mod:`tpu_workbench.sharding.fit`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from .layout import layout_frame

MEMORY_COLUMNS = ["device", "device_name", "row", "col", "params_bytes", "grads_bytes",
                  "optimizer_bytes", "inputs_bytes", "total_bytes", "xla_total_bytes"]


def memory_per_device(result_or_records: Any, hlo_dir: str | Path | None = None,
                      optimizer_factor: float | None = None) -> pd.DataFrame:
    """Bytes each device holds, by kind, from the layout records of a run.

    Columns (:data:`MEMORY_COLUMNS`): ``device``, ``device_name``, ``row``, ``col``;
    ``params_bytes`` (the device's parameter buffers, padded as XLA allocates them);
    ``grads_bytes`` (gradients have their parameter's layout: equal to params);
    ``optimizer_bytes`` (`optimizer_factor` x params; by default the run's optimizer's: 2 for
    Adam's exp_avg and exp_avg_sq, sharded like their parameter, 0 for Adafactor's row and
    column vectors, counted as none as :data:`tpu_workbench.sharding.CONVENTION` does);
    ``inputs_bytes`` (one batch); ``total_bytes`` (their sum; no activations);
    ``xla_total_bytes`` (XLA's own total for the compiled train step from its memory-usage
    report, the same per-device program on every device: needs ``capture=("hlo",)``; NaN
    otherwise; it counts parameters, state, activations and temporaries of the step, i.e. what
    the train-step program touches).
    """
    import pandas as pd

    layout = layout_frame(result_or_records)
    if layout.empty:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    keys = ["device", "device_name", "row", "col"]
    per = layout.pivot_table(index=keys, columns="tensor_kind", values="shard_bytes",
                             aggfunc="sum", fill_value=0).reset_index()
    per.columns.name = None
    for kind in ("param", "input"):
        if kind not in per:
            per[kind] = 0
    frame = per[keys].copy()
    frame["params_bytes"] = per["param"].astype("int64")
    frame["grads_bytes"] = frame["params_bytes"]
    if optimizer_factor is None:
        spec = getattr(result_or_records, "spec", None)
        optimizer_factor = 0.0 if getattr(spec, "optimizer", "adamw") == "adafactor" else 2.0
    frame["optimizer_bytes"] = (optimizer_factor * frame["params_bytes"]).round().astype("int64")
    frame["inputs_bytes"] = per["input"].astype("int64")
    frame["total_bytes"] = frame[["params_bytes", "grads_bytes", "optimizer_bytes",
                                  "inputs_bytes"]].sum(axis=1)
    if hlo_dir is None and getattr(result_or_records, "out_dir", None) is not None:
        hlo_dir = Path(result_or_records.out_dir) / "hlo"
    xla_total = float("nan")
    if hlo_dir is not None:
        report = step_file(Path(hlo_dir), "memory-usage-report.txt")
        if report is not None:
            from .. import hlo

            xla_total = float(hlo.memory_report(report.read_text())["total_bytes"])
    frame["xla_total_bytes"] = xla_total
    return frame.sort_values("device").reset_index(drop=True)[MEMORY_COLUMNS]


def step_file(hlo_dir: Path, suffix: str) -> Path | None:
    """The dumped file of the train step ending in `suffix` (after optimisations).

    The train step's module is named ``<model>_train_step``; without one, the largest file.
    """
    if not hlo_dir.is_dir():
        return None
    files = sorted(p for p in hlo_dir.iterdir() if p.name.endswith(suffix))
    if not files:
        return None
    named = [p for p in files if "train_step" in p.name]
    pool = named or files
    return max(pool, key=lambda p: p.stat().st_size)


def xla_memory_parts(result_or_hlo_dir: Any) -> dict[str, float] | None:
    """XLA's own memory total for a run's train step, split the way a reader can check it
    against :func:`memory_per_device` (for display; None where the run captured no HLO).

    From the step's ``memory-usage-report.txt``, each allocation counted once (the report lists
    the largest ones twice): ``arguments_bytes`` (the program's parameters: the model's
    parameters, Adam's moments and the batch, as laid out on a device), ``outputs_bytes``
    (buffers the step returns that are not written in place: the updated weights and moments),
    ``temporaries_bytes`` (everything else: activations, gradients and intermediates, mostly one
    preallocated block) and ``total_bytes`` (the report's own total).
    """
    hlo_dir = result_or_hlo_dir
    if getattr(result_or_hlo_dir, "out_dir", None) is not None:
        hlo_dir = Path(result_or_hlo_dir.out_dir) / "hlo"
    report = step_file(Path(hlo_dir), "memory-usage-report.txt") if hlo_dir else None
    if report is None:
        return None
    from .. import hlo

    parsed = hlo.memory_report(report.read_text())
    allocs = parsed["allocations"].drop_duplicates("allocation")
    arguments = allocs["kind"] == "parameter"
    outputs = ~arguments & allocs["maybe_live_out"]
    return {"arguments_bytes": float(allocs.loc[arguments, "size_bytes"].sum()),
            "outputs_bytes": float(allocs.loc[outputs, "size_bytes"].sum()),
            "temporaries_bytes": float(allocs.loc[~arguments & ~outputs, "size_bytes"].sum()),
            "total_bytes": float(parsed["total_bytes"])}
