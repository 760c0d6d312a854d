"""``tpu-workbench port``: what blocks a model on a TPU, each blocker at its line with the fix,
each fix tried on a patched copy of the model's file and measured: findings.csv, trials.csv,
steps.csv, report.json and patched/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="a family (mingpt...), an hf: config, or your file: path.py:make")
    parser.add_argument("--preset", default="default",
                        help="size preset (default: 'default', a factory's only one; 'tiny' "
                             "for the workbench's families)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per pass (>= 3)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (the model's own)")
    parser.add_argument("--no-fixes", action="store_true",
                        help="report the findings only; try no fix on a patched copy")
    parser.add_argument("--out", type=Path, default=Path("port-report"), help="output folder")


def port(args: argparse.Namespace) -> int:
    from ..environment.paths import writable_folder
    from ..porting.report import port as run_port

    out = writable_folder(args.out)
    report = run_port(args.model, args.preset, steps=args.steps, batch_size=args.batch, out=out,
                      fixes=not args.no_fixes,
                      on_progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(report.text())
    print(f"wrote {out / 'findings.csv'}, {out / 'trials.csv'}, {out / 'steps.csv'}, "
          f"{out / 'report.json'}")
    return 0
