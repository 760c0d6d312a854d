"""``tpu-workbench cache``: cold vs warm worker vs a new shape, and the persistent cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..errors import SpecError
from ..runs.compile_cache import (
    cache_study,
    persistent_cache_check,
    require_xla,
)
from ..runs.spec import ExperimentSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--mode", default="lazy", help="an XLA mode (default: lazy)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per run")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the cold/warm/new-shape study, for medians and spread")
    parser.add_argument("--persistent", action="store_true",
                        help="also run two processes over one persistent cache folder")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def _write_csv(frame: pd.DataFrame, path: Path) -> Path:
    tmp = path.with_suffix(".tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)  # never a half-written table under the final name
    return path


def cache(args: argparse.Namespace) -> int:
    """``tpu-workbench cache``: cold vs warm vs new shape (and the persistent cache)."""
    from tqdm import tqdm

    from .. import charts
    from ..environment.paths import writable_folder

    out = writable_folder(args.out)
    if not isinstance(args.rounds, int) or args.rounds < 1:
        raise SpecError(f"--rounds must be a positive int, got {args.rounds!r}")
    spec = ExperimentSpec(model=args.model, preset=args.preset, mode=args.mode,
                          steps=args.steps, batch_size=args.batch_size)
    require_xla(spec, "tpu-workbench cache")  # bad input fails before any worker starts
    runs, compiles = [], []
    with tqdm(total=3 * args.rounds, unit="run", desc="cache", file=sys.stderr) as bar:
        for i in range(args.rounds):
            study = cache_study(spec, on_run=lambda s, r: (bar.set_postfix_str(s), bar.update()))
            runs.append(study.runs.assign(round=i))
            compiles.append(study.compiles.assign(round=i))
    all_runs = pd.concat(runs, ignore_index=True)
    written = [_write_csv(all_runs, out / "runs.csv"),
               _write_csv(pd.concat(compiles, ignore_index=True), out / "compiles.csv")]
    written += charts.save_chart(charts.cache_first_steps(runs[-1]), out, "cache_first_steps")
    table = all_runs.groupby("label", sort=False).agg(
        runs=("round", "size"), first_step_ms=("first_step_ms", "median"),
        first_min=("first_step_ms", "min"), first_max=("first_step_ms", "max"),
        compiles=("compiles", "median"), cache_hits=("cache_hits", "median"),
        saved_ms=("saved_ms", "median"))
    print(table.to_string(float_format=lambda v: f"{v:,.1f}"))
    if args.persistent:
        check = persistent_cache_check(spec)
        written.append(_write_csv(check.runs, out / "persistent.csv"))
        print(check.runs[["process", "first_step_ms", "compiles", "persistent_misses",
                          "persistent_hits", "deserialize_failures", "files"]].to_string(
                              index=False, float_format=lambda v: f"{v:,.1f}"))
        print(check.verdict)
    print(f"wrote {len(written)} files to {out}")
    return 0
