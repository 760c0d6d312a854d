"""How far predictions have been from real runs: the published v6e training runs
(``published_runs.csv``: model, slice, batch, sequence, parallelism, remat, flags, step time,
and the file and commit each comes from) beside this workbench's prediction for each
(``validation.csv``, written by ``scripts/bench_predict.py --record``: the step compiled by
libtpu for the run's slice, never run).

:func:`validation` joins the two; :func:`nearest` says which validated runs are closest to a
plan and how far off they were, so a prediction carries its record.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..environment.chips import get_slice
from ..errors import SpecError

HERE = Path(__file__).parent
PUBLISHED = HERE / "published_runs.csv"
RECORDED = HERE / "validation.csv"
# The row MXU_EFFICIENCY was fitted on (planning.predict): judged on every other row.
FITTED_ON = "A1"
# The libtpu flag MaxText's "no collective matmul" recipes add (DISABLE_COLLECTIVE_MATMUL in
# MaxText's benchmarks/xla_flags_library.py).
NO_COLLECTIVE_MATMUL = ("--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000",)
BAND = 0.25  # the goal: no row further off than this
# Columns a recorded prediction keeps (besides the published run's id).
RECORDED_COLUMNS = ["id", "predicted_s", "predicted_min_s", "predicted_max_s", "bottleneck",
                    "mfu", "compiler_memory_gb", "fits", "compiled_as", "libtpu", "reason"]


def published_runs() -> pd.DataFrame:
    """The published runs, one row each, with ``family`` (Llama, Mixtral, GPT3), ``chips`` and
    the plan the workbench predicts for it (``model``, ``preset``; empty where it has none)."""
    frame = pd.read_csv(PUBLISHED, dtype={"workbench_preset": str, "workbench_strategy": str,
                                          "flags": str, "moe": str}, keep_default_na=False)
    frame["family"] = frame["model"].str.split("-").str[0]
    frame["chips"] = [get_slice(s).chips for s in frame["slice"]]
    parts = frame["workbench_preset"].str.split(" ", n=1)
    frame["wb_model"] = parts.str[0].fillna("")
    frame["wb_preset"] = parts.str[1].fillna("")
    return frame


def plan_of(run: pd.Series) -> dict[str, Any]:
    """The :func:`tpu_workbench.planning.predict.predict` arguments that predict `run` (a row of
    :func:`published_runs`): its slice, strategy, global batch and sequence, every block
    rematerialised, flash attention, its libtpu flags, its optimizer (``adafactor`` where its
    flags say so, else AdamW) and, for a 2-D parallelism (``fsdp=64 x tensor=4``), its model
    axis. SpecError for a run with no plan."""
    if not run["wb_model"]:
        raise SpecError(f"published run {run['id']} ({run['model']}) has no workbench preset")
    axis = re.search(r"(?:tensor|expert)=(\d+)", run["parallelism"])
    return dict(model=run["wb_model"], preset=run["wb_preset"], slices=[run["slice"]],
                model_axis=int(axis.group(1)) if axis else None,
                strategies=[run["workbench_strategy"]], seq_len=int(run["seq_len"]),
                batch_size=int(run["global_batch"]), recompute=True, attention="flash",
                libtpu_flags=NO_COLLECTIVE_MATMUL
                if "no collective matmul" in run["flags"] else (),
                optimizer="adafactor" if "adafactor" in run["flags"] else "adamw")


def recorded(path: Path = RECORDED) -> pd.DataFrame:
    """The recorded predictions (:data:`RECORDED_COLUMNS`); empty where none were recorded."""
    if not Path(path).exists():
        return pd.DataFrame(columns=RECORDED_COLUMNS)
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def record(rows: Sequence[dict[str, Any]], path: Path = RECORDED) -> None:
    """Merge predictions (dicts with :data:`RECORDED_COLUMNS`) into `path`, replacing earlier
    ones of the same run; written whole to a temporary file and renamed, so an interrupted
    bench never leaves a half-written table."""
    new = pd.DataFrame(list(rows), columns=RECORDED_COLUMNS)
    old = recorded(path)
    merged = pd.concat([old[~old["id"].isin(new["id"])], new], ignore_index=True)
    order = {k: i for i, k in enumerate(published_runs()["id"])}
    merged = merged.sort_values("id", key=lambda s: s.map(order)).reset_index(drop=True)
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, suffix=".csv.tmp")
    with os.fdopen(fd, "w") as out:
        merged.to_csv(out, index=False)
    os.replace(tmp, path)


def validation(predictions: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every published run with the workbench's prediction (`predictions`, default the
    recorded ones): ``predicted_s``, ``ratio`` (predicted over published), ``error``
    (ratio - 1), ``within`` (inside :data:`BAND`), ``fitted`` (the row the one fitted
    constant came from), and ``reason`` where nothing was predicted."""
    predictions = recorded() if predictions is None else predictions
    frame = published_runs().merge(predictions, on="id", how="left")
    frame["ratio"] = frame["predicted_s"] / frame["published_s"]
    frame["error"] = frame["ratio"] - 1
    frame["within"] = frame["error"].abs() <= BAND
    frame["fitted"] = frame["id"] == FITTED_ON
    no_plan = frame["wb_model"] == ""
    frame.loc[no_plan, "reason"] = "no workbench preset for this model"
    return frame


def worst(frame: pd.DataFrame) -> pd.Series | None:
    """The predicted row furthest from its published time, the fitted row aside."""
    judged = frame[frame["ratio"].notna() & ~frame["fitted"]]
    if not len(judged):
        return None
    return judged.loc[judged["error"].abs().idxmax()]


def nearest(frame: pd.DataFrame, model: str, chips: int, strategy: str,
            n: int = 3) -> tuple[pd.DataFrame, str]:
    """The `n` predicted runs of `frame` (:func:`validation`) closest to a plan of `model` on
    `chips` chips with `strategy`, with ``distance`` (doublings of chips apart, plus 2 for
    another model family and 1 for another strategy), and a sentence on how far those were
    off; it says so when even the closest is far (distance > 3)."""
    judged = frame[frame["ratio"].notna()].copy()
    if not len(judged):
        return judged.assign(distance=[]), "No prediction has been checked against a run yet."
    judged["distance"] = (judged["chips"].map(lambda c: abs(math.log2(c / chips)))
                          + 2.0 * (judged["wb_model"] != model)
                          + 1.0 * (judged["workbench_strategy"] != strategy))
    close = judged.nsmallest(n, "distance")
    worst_off = close["error"].abs().max()
    runs = ", ".join(f"{r.id} ({r.model}, {r.slice}, {r.workbench_strategy}: "
                     f"{r.error:+.0%})" for r in close.itertuples())
    if close["distance"].min() > 3:
        return close, (f"Far from every checked run: the closest are {runs}. Treat this "
                       "prediction as unvalidated.")
    return close, f"Closest checked runs: {runs}; at most {worst_off:.0%} off."


def record_for(predicted: pd.DataFrame, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """For each row of a :func:`tpu_workbench.predict` frame, the checked runs of `frame`
    (default :func:`validation`) closest to it and how far those were off: ``slice``,
    ``strategy``, ``closest`` (run ids), ``worst_error`` (of those) and ``record`` (the
    sentence of :func:`nearest`)."""
    frame = validation() if frame is None else frame
    rows = []
    for r in predicted.itertuples():
        close, sentence = nearest(frame, r.model, int(r.chips), r.strategy)
        rows.append({"slice": r.slice, "strategy": r.strategy,
                     "closest": ", ".join(close["id"]),
                     "worst_error": float(close["error"].abs().max()) if len(close) else math.nan,
                     "record": sentence})
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame | None = None) -> str:
    """One sentence on the record: how many runs were judged, the median ratio, how many lie
    within ±15% and ±25%, and the worst."""
    frame = validation() if frame is None else frame
    judged = frame[frame["ratio"].notna() & ~frame["fitted"]]
    if not len(judged):
        return "No prediction has been checked against a published run yet."
    w = worst(frame)
    return (f"{len(judged)} published runs judged ({judged['family'].nunique()} families, "
            f"{judged['seq_len'].nunique()} sequence lengths, "
            f"{judged['workbench_strategy'].nunique()} strategies): median predicted/published "
            f"{judged['ratio'].median():.2f}, {int((judged['error'].abs() <= 0.15).sum())} "
            f"within ±15%, {int(judged['within'].sum())} within ±{BAND:.0%}; worst {w['id']} "
            f"({w['model']} on {w['slice']}, {w['workbench_strategy']}): "
            f"{w['ratio']:.2f}.")
