#!/usr/bin/env python3
"""Serving plans against published runs: every row of tpu_workbench/serving/serving_runs.csv
planned by `wb.serve_plan` (vLLM-TPU's programs compiled by libtpu for the run's slice, never
run) and printed as predicted / published, with the rule of thumb (weights + KV bytes over HBM
bandwidth) beside each, and the worst row.

    python scripts/bench_serve.py [--runs Q8-V-8,L70-S-16] [--fit] [--out serve-bench]

--fit: the two constants of tpu_workbench.serving.plan (engine overhead per step, prefill MXU
efficiency) from FIT_ROW alone (its published ITL and TTFT), printed to paste into plan.py; the
other rows are judged with them. Heavy (compiles); not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpu_workbench.serving import plan as P  # noqa: E402
from tpu_workbench.serving.published import serving_runs  # noqa: E402
from tpu_workbench.serving.serve import serve_plan  # noqa: E402

GROUP = ["preset", "model", "slice", "tp", "input_len", "output_len", "max_num_seqs",
         "max_num_batched_tokens", "max_model_len"]


def plans(runs: pd.DataFrame) -> dict[str, tuple]:
    """run -> (plan, its row's programs): one serve_plan per group of runs that share a
    model, slice and engine limits (so a group compiles once)."""
    out = {}
    for key, group in runs.groupby(GROUP, sort=False):
        k = dict(zip(GROUP, key, strict=True))
        started = time.perf_counter()
        plan = serve_plan(k["model"], k["preset"], k["slice"], int(k["input_len"]),
                          int(k["output_len"]), tuple(int(c) for c in sorted(
                              set(group.concurrency))),
                          max_num_batched_tokens=int(k["max_num_batched_tokens"]),
                          max_num_seqs=int(k["max_num_seqs"]),
                          max_model_len=int(k["max_model_len"]), tensor_parallel=int(k["tp"]),
                          on_progress=lambda m: print("  " + m, flush=True))
        print(f"  planned {k['preset']} on {k['slice']} in {time.perf_counter() - started:.0f} s "
              f"({int((~plan.programs.cached).sum())} programs compiled, "
              f"{int(plan.programs.cached.sum())} cached)", flush=True)
        for run in group.itertuples():
            out[run.run] = plan
    return out


def rows_for(runs: pd.DataFrame, planned: dict, overhead: float | None = None,
             efficiency: float | None = None) -> pd.DataFrame:
    from tpu_workbench.serving.compile import EngineProgram  # noqa: F401 - type of programs

    rows = []
    for run in runs.itertuples():
        plan = planned[run.run]
        r = plan.request
        programs = _programs(plan)
        tokens, reqs = P.token_buckets(r.max_num_batched_tokens), P.request_buckets(
            r.max_num_seqs)
        cr = r.per_replica(int(run.concurrency))
        step = programs[f"decode-{P.pad(tokens, cr)}"]
        logits = programs[f"logits-{P.pad(reqs, cr)}"]
        chunk = programs.get(f"prefill-{r.max_num_batched_tokens}") or programs[
            f"decode-{r.max_num_batched_tokens}"]
        p = P.predict_row(r, int(run.concurrency), step, logits, chunk, overhead, efficiency)
        rows.append({"run": run.run, "model": run.preset, "engine": run.engine,
                     "version": run.engine_version[:13], "slice": run.slice,
                     "c": int(run.concurrency), "itl_pub": run.itl_ms,
                     "itl_pred": p["itl_mean_ms"], "itl_ratio": p["itl_mean_ms"] / run.itl_ms,
                     "rule_itl": p["rule_of_thumb_itl_ms"],
                     "rule_ratio": p["rule_of_thumb_itl_ms"] / run.itl_ms,
                     "ttft_pub": run.ttft_ms, "ttft_pred": p["ttft_ms"],
                     "ttft_ratio": p["ttft_ms"] / run.ttft_ms,
                     "tok_s_pub": run.output_tokens_per_s, "tok_s_pred": p["output_tokens_per_s"],
                     "bottleneck": p["bottleneck"]})
    return pd.DataFrame(rows)


_LOADED: dict[int, dict] = {}


def _programs(plan) -> dict:
    """The plan's compiled programs (cached on disk; loaded and parsed once per plan here)."""
    from tpu_workbench.serving.compile import compile_programs

    if id(plan) not in _LOADED:
        r = plan.request
        request = P.engine_request(r, plan.engine["num_blocks"])
        _LOADED[id(plan)] = compile_programs(request, P.programs_for(r), f"v6e-{r.tp}")
    return _LOADED[id(plan)]


def fit(runs: pd.DataFrame, planned: dict) -> tuple[float, float]:
    """(overhead ms, prefill efficiency) that make FIT_ROW's ITL and TTFT the published ones."""
    row = runs[runs.run == P.FIT_ROW]
    overhead, eff = 0.0, 1.0
    for _ in range(50):
        base = rows_for(row, planned, overhead, eff).iloc[0]
        # TTFT ~ c x input x (prefill ms per token), which scales as 1 / efficiency
        eff *= base.ttft_pred / base.ttft_pub
        base = rows_for(row, planned, overhead, eff).iloc[0]
        overhead = max(0.0, overhead + base.itl_pub - base.itl_pred)
    return overhead, eff


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="", help="run ids, comma-separated (default: all)")
    parser.add_argument("--fit", action="store_true", help="fit the constants on FIT_ROW")
    parser.add_argument("--out", type=Path, default=Path("serve-bench"))
    parser.add_argument("--record", action="store_true",
                        help="also write the table to tpu_workbench/serving/bench_record.csv "
                             "(what the serve_a_model notebook shows)")
    args = parser.parse_args(argv)
    runs = serving_runs()
    if args.runs:
        runs = runs[runs.run.isin(args.runs.split(","))]
    planned = plans(runs if not args.fit else pd.concat(
        [runs, serving_runs().query("run == @P.FIT_ROW")]).drop_duplicates("run"))
    overhead = efficiency = None
    if args.fit:
        overhead, efficiency = fit(serving_runs(), planned)
        print(f"fitted on {P.FIT_ROW}: STEP_OVERHEAD_MS = {overhead:.3f}, "
              f"PREFILL_MXU_EFFICIENCY = {efficiency:.3f}")
    table = rows_for(runs, planned, overhead, efficiency)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "serve_bench.csv", index=False)
    if args.record:
        from tpu_workbench.serving.published import RECORD_CSV

        table.to_csv(RECORD_CSV, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
    judged = table[table.run != P.FIT_ROW]
    for metric in ("itl_ratio", "ttft_ratio", "rule_ratio"):
        if len(judged):
            worst = judged.loc[(judged[metric] - 1).abs().idxmax()]
            print(f"worst {metric} (judged rows, {P.FIT_ROW} fitted): {worst.run} "
                  f"{worst[metric]:.3f}; median {judged[metric].median():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
