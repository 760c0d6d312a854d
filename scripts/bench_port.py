#!/usr/bin/env python3
"""How well ``port`` finds what was planted: precision and recall over folders of planted-problem
models (each ``name.py`` with ``name.expected.csv``, see :mod:`tpu_workbench.porting.planted`).

Every model of every folder runs through ``port`` in one worker pool; per model the findings
that were planted and found, missed, and found but not planted (kind file:line), the seconds
it took, then the precision and recall over all of them. ``--fixes`` also tries each fix on a
patched copy and prints how many were verified, did not help, hurt or failed.

    .venv/bin/python scripts/bench_port.py                      # tests/models/port
    .venv/bin/python scripts/bench_port.py --models ../more-planted-models --steps 6 --fixes

A benchmark, not a test: its seconds depend on the machine and its load (printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, action="append",
                        help="a folder of planted models (repeatable; default "
                             "tests/models/port)")
    parser.add_argument("--steps", type=int, default=3, help="steps per pass (>= 3)")
    parser.add_argument("--fixes", action="store_true", help="also try each fix")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be >= 3 (the first compiles, two are watched), got "
                     f"{args.steps}")
    folders = args.models or [ROOT / "tests" / "models" / "port"]
    for folder in folders:
        if not folder.is_dir():
            parser.error(f"--models {folder}: no such folder")

    import tpu_workbench as wb
    from tpu_workbench.porting import planted

    files = [m for folder in folders for m in planted.models(folder)]
    if not files:
        parser.error(f"no model with an .expected.csv beside it in {', '.join(map(str, folders))}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{len(files)} models, {args.steps} steps each" + (", fixes tried" if args.fixes
                                                            else ""), flush=True)
    scores, statuses = [], Counter()
    pool = wb.WorkerPool(max_workers=1)
    try:
        for model in files:
            start = time.perf_counter()
            report = wb.port(f"{model}:make", steps=args.steps, fixes=args.fixes, pool=pool)
            seconds = time.perf_counter() - start
            score = planted.score(model, report.findings)
            scores.append(score)
            if args.fixes:
                statuses.update(report.trials["status"])
            print(f"{model.name:28s} planted {len(score.expected):2d}  found "
                  f"{len(score.hits):2d}  missed {len(score.missing):2d}  extra "
                  f"{len(score.extra):2d}  {seconds:6.1f} s", flush=True)
            if score.missing or score.extra:
                print("    " + score.describe().replace("\n", "\n    "), flush=True)
    finally:
        pool.shutdown()
    precision, recall = planted.precision_recall(scores)
    print(f"precision {precision:.3f}  recall {recall:.3f}  over "
          f"{sum(len(s.expected) for s in scores)} planted findings in {len(scores)} models")
    if args.fixes:
        print("fixes tried: " + ", ".join(f"{n} {status}" for status, n in statuses.items()))
    return 0 if precision == recall == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
