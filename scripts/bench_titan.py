"""TorchTitan's trainer under FSDP2, TP and 2D through the workbench: the same debug model, seed
and global batch over the same number of gloo ranks, each layout a gang of its own.

    python scripts/bench_titan.py [--ranks 4] [--steps 30] [--batch 8] [--out titan-bench]

    python scripts/bench_titan.py --plan [--record]

Prints per layout the first and last training loss, the held-out loss after the first and the
last step, the first loss's difference from the first layout's (runs with the same seed and
global batch start from the same loss: within 1% is the goal), the median step time per rank
(measured on this machine: a busy 2-core host is slow and noisy) and the training state per
rank (measured shards beside the workbench's estimate). Writes first_losses.csv, losses.csv,
memory.csv and steps.csv to --out.

``--plan`` instead plans TorchTitan's own Llama-3 8B and 70B TOMLs for a v6e-8 and a v6e-256
(``predict --titan-config``: each step compiled by libtpu, cached), printing each row with its
compile time; ``--record`` writes them to tpu_workbench/planning/titan_plans.csv, which the
scale-out notebook shows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("titan-bench"))
    parser.add_argument("--plan", action="store_true",
                        help="plan TorchTitan's 8B and 70B TOMLs on v6e-8 and v6e-256")
    parser.add_argument("--record", action="store_true",
                        help="with --plan: write tpu_workbench/planning/titan_plans.csv")
    args = parser.parse_args(argv)
    if args.plan:
        return plan(args.record)

    import pandas as pd

    import tpu_workbench as wb

    half = args.ranks // 2
    layouts = {"fsdp": dict(dp_shard=args.ranks, tp=1), "tp": dict(dp_shard=1, tp=args.ranks),
               "2d": dict(dp_shard=half, tp=2)}
    specs = {name: wb.titan_spec(ranks=args.ranks, steps=args.steps, seed=args.seed,
                                 global_batch=args.batch, **degrees)
             for name, degrees in layouts.items()}  # every bad input before any run
    results = []
    for name, spec in specs.items():
        started = time.perf_counter()
        result = wb.run(spec)
        print(f"{name}: {time.perf_counter() - started:.0f} s (startup included)",
              file=sys.stderr, flush=True)
        results.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    first = wb.titan_first_losses(results)
    first.to_csv(args.out / "first_losses.csv", index=False)
    wb.titan_losses(results).to_csv(args.out / "losses.csv", index=False)
    memory = wb.titan_memory(results)
    memory.to_csv(args.out / "memory.csv", index=False)
    steps = pd.concat([r.steps.assign(strategy=r.summary["strategy"]) for r in results])
    steps.to_csv(args.out / "steps.csv", index=False)
    pd.set_option("display.width", 160)
    print(first.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    worst = first["rel_diff"].max()
    print(f"first losses within {worst:.2%} of each other "
          f"({'within' if worst <= 0.01 else 'NOT within'} 1%)")
    for result in results:
        timed = result.steps.iloc[1:]  # step 0 pays FSDP's and the data loader's set-up
        per_rank = pd.DataFrame(timed["rank_wall_ms"].tolist())
        print(f"{result.summary['strategy']}: median step ms per rank (steps 1-"
              f"{len(result.steps) - 1}): " + ", ".join(
                  f"{per_rank[c].median():.0f} (p10 {per_rank[c].quantile(0.1):.0f}, p90 "
                  f"{per_rank[c].quantile(0.9):.0f})" for c in per_rank.columns))
    state = memory.groupby(["strategy", "source", "rank"], sort=False)["bytes"].sum() / 1e6
    print("training state per rank, MB (measured shards; estimate: the workbench's "
          "convention):\n" + state.round(2).to_string())
    return 0


def plan(record: bool) -> int:
    import pandas as pd

    from tpu_workbench.planning import titan as planning

    frames = []
    for slice_ in planning.RECORDED_SLICES:  # the v6e-8 rows first: the smaller compiles
        for config in planning.RECORDED_CONFIGS:
            started = time.perf_counter()
            frame = planning.titan_plan(config, [slice_], on_progress=lambda m: print(
                m, file=sys.stderr, flush=True))
            frames.append(frame.assign(recorded_at=time.strftime("%Y-%m-%d %H:%M")))
            row = frame.iloc[0]
            print(f"{config} {slice_} ({row['titan_layout']}, {row['strategy']}, batch "
                  f"{row['batch_size']}): fits {row['fits']}, "
                  f"{row.get('compiler_memory_gb', float('nan')):.3g} GB per chip, predicted "
                  f"{row.get('predicted_step_ms', float('nan')):.0f} ms a step, compile "
                  f"{row.get('compile_s', float('nan')):.0f} s, "
                  f"{time.perf_counter() - started:.0f} s in all; {row.get('reason', '')}",
                  flush=True)
            if record:  # after every row: each is minutes of compiles
                tmp = planning.RECORDED.with_suffix(".tmp")
                pd.concat(frames, ignore_index=True).to_csv(tmp, index=False)
                tmp.replace(planning.RECORDED)
                print(f"wrote {planning.RECORDED} ({len(frames)} rows)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
