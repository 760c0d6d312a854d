#!/usr/bin/env python3
"""Predicted step times against every published v6e run of the validation table.

    .venv/bin/python scripts/bench_predict.py [--ids A1,A5,E8] [--record] [--out predict-bench]

For each run of tpu_workbench/planning/published_runs.csv (MaxText's tpu-recipes and
torchprime; each row names its source file and commit) with a workbench preset, this compiles
the workbench's own step of that model for the run's slice with libtpu (two and three blocks
at full width, extrapolated; flash attention, every block rematerialised, the run's libtpu
flags; a few minutes per program on two cores, cached in results/tpu_compiles afterwards) and
compares the predicted step time with the published one at the published global batch and
sequence length. It prints the ratio per row, the worst row and the median, and with
``--record`` merges the predictions into tpu_workbench/planning/validation.csv, which
``plan_a_run`` draws. MXU_EFFICIENCY was fitted on row A1 alone; every other row judges it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", default="", help="comma-separated run ids (default: all)")
    parser.add_argument("--record", action="store_true",
                        help="merge the predictions into tpu_workbench/planning/validation.csv")
    parser.add_argument("--out", type=Path, default=Path("predict-bench"))
    args = parser.parse_args()
    import pandas as pd

    from tpu_workbench.errors import SpecError
    from tpu_workbench.planning import predict as plan
    from tpu_workbench.planning import validation as val

    runs = val.published_runs()
    wanted = [i for i in args.ids.split(",") if i]
    unknown = sorted(set(wanted) - set(runs["id"]))
    if unknown:
        parser.error(f"unknown run ids {unknown}; the table has {', '.join(runs['id'])}")
    if wanted:  # in the order given
        runs = runs.set_index("id").loc[wanted].reset_index()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for _, run in runs.iterrows():
        started = time.perf_counter()
        print(f"[{run['id']}] {run['model']} {run['slice']} batch {run['global_batch']} seq "
              f"{run['seq_len']} {run['workbench_strategy'] or '-'}", file=sys.stderr, flush=True)
        row = {"id": run["id"]}
        try:
            frame = plan.predict(**val.plan_of(run), on_progress=lambda m: print(
                "   ", m, file=sys.stderr, flush=True))
        except SpecError as exc:
            row["reason"] = str(exc)
        else:
            r = frame.iloc[0]
            row.update(predicted_s=r["predicted_step_ms"] / 1e3,
                       predicted_min_s=r["predicted_step_min_ms"] / 1e3,
                       predicted_max_s=r["predicted_step_max_ms"] / 1e3,
                       bottleneck=r["bottleneck"], mfu=r["predicted_mfu"],
                       compiler_memory_gb=r["compiler_memory_gb"], fits=bool(r["fits"]),
                       compiled_as=r["compiled_as"], libtpu=r["libtpu"],
                       reason=r["reason"] or "")
        rows.append(row)
        if args.record:  # after every row: an interrupted bench keeps what it measured
            val.record([row])
        shown = {**row, "published_s": run["published_s"], "wall_s": time.perf_counter() - started}
        if "predicted_s" in row:
            shown["ratio"] = row["predicted_s"] / run["published_s"]
        print(pd.DataFrame([shown]).drop(columns=["compiled_as", "libtpu"], errors="ignore")
              .to_string(index=False), flush=True)
    ids = [r["id"] for r in rows]
    table = val.validation(pd.DataFrame(rows, columns=val.RECORDED_COLUMNS))
    table = table[table["id"].isin(ids)].reset_index(drop=True)
    table.to_csv(args.out / "validation.csv", index=False)
    shown = table[["id", "model", "slice", "workbench_strategy", "global_batch", "seq_len",
                   "published_s", "predicted_s", "ratio", "bottleneck", "fitted"]]
    print(f"\nMXU_EFFICIENCY = {plan.MXU_EFFICIENCY} ({plan.MXU_EFFICIENCY_SOURCE})")
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    judged = table[table["ratio"].notna() & ~table["fitted"]]
    if len(judged):
        worst = val.worst(table)
        print(f"\n{len(judged)} rows judged: median ratio {judged['ratio'].median():.3f}, "
              f"{int(judged['within'].sum())} within ±{val.BAND:.0%}, "
              f"{int((judged['error'].abs() <= 0.15).sum())} within ±15%; worst "
              f"{worst['id']} ({worst['model']} {worst['slice']}): ratio {worst['ratio']:.3f}")
    for r in table[table["ratio"].isna()].itertuples():
        print(f"not predicted: {r.id} ({r.model} {r.slice}): {r.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
