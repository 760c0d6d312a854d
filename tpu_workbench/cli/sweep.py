"""``tpu-workbench sweep``: a grid of runs on the local pool or a Ray cluster; tables and charts.

``steps.csv`` and ``summary.csv`` hold every run, with a column per swept field (``mode`` and
each ``--grid`` field) and ``node``; ``runs.csv`` one row per run (state, host, node, attempts,
concurrent, error); one chart per swept field (HTML and PNG).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import charts
from ..environment.paths import writable_folder
from ..errors import SpecError
from ..records import label
from ..runs.spec import MODES, ExperimentSpec
from ..scale.sweeps import ENGINES, SweepResult, grid, parse_grid, swept_fields
from ..scale.sweeps import sweep as run_sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="local: this host's worker pool; ray: one Ray task per run")
    parser.add_argument("--address", default=None,
                        help="Ray cluster address (host:6379, ray://host:10001 or auto); "
                             "default: an embedded local Ray")
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--modes", default="torch_eager",
                        help=f"comma-separated modes out of {', '.join(MODES)}")
    parser.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2",
                        help="a spec field and its values, e.g. batch_size=8,16,32 or "
                             "mesh=2x4,8x1 (repeat for more fields)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-retries", type=int, default=1,
                        help="ray: times a run whose node died is run again (default 1)")
    parser.add_argument("--runs-per-host", type=int, default=1,
                        help="ray: runs a node may time at once (default 1; more contend for "
                             "its CPUs, and runs.csv's `concurrent` says which did)")
    parser.add_argument("--cold", action="store_true",
                        help="a fresh worker per run (default: warm workers are reused)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def specs_from_args(args: argparse.Namespace) -> list[ExperimentSpec]:
    """Every (mode, grid point) spec, validated; bad input fails here."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        raise SpecError(f"--modes {args.modes!r} names no mode; valid: {', '.join(MODES)}")
    axes = {"mode": modes, **parse_grid(args.grid)}
    base = ExperimentSpec(model=args.model, preset=args.preset, steps=args.steps, seed=args.seed)
    return grid(base, axes)


def write_outputs(result: SweepResult, out: Path) -> list[Path]:
    """steps.csv, summary.csv, runs.csv and a chart per swept field (HTML and PNG)."""
    written = []
    summary = result.summary
    for name, frame in {"steps.csv": result.steps, "summary.csv": summary,
                        "runs.csv": result.runs}.items():
        tmp = out / (name + ".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(out / name)  # never a half-written table under the final name
        written.append(out / name)
    if len(summary):
        for field in [f for f in result.fields if f != "mode"] or ["mode"]:
            written += charts.save_chart(charts.sweep_times(summary, field), out,
                                         f"sweep_{field}")
    return written


def sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    out = writable_folder(args.out)
    specs = specs_from_args(args)  # bad input fails here, before any worker or task starts
    fields = swept_fields(specs)
    with tqdm(total=len(specs), unit="run", desc=f"sweep ({args.engine})",
              file=sys.stderr) as bar:

        def ended(run) -> None:
            point = " ".join(f"{f}={getattr(run.spec, f)}" for f in fields if f != "mode")
            bar.set_postfix_str(f"{label(run.spec)} {point} {run.state}")
            bar.update(1)

        result = run_sweep(specs, engine=args.engine, address=args.address, on_run_end=ended,
                           max_retries=args.max_retries, cold=args.cold,
                           runs_per_host=args.runs_per_host)
    written = write_outputs(result, out)
    summary = result.summary
    if len(summary):
        cols = [*result.fields, "node", "first_step_ms", "steady_median_ms", "items_per_s",
                "final_loss"]
        summary = summary.assign(node=summary["node"].str[:12])
        print(summary[list(dict.fromkeys(cols))].to_string(
            index=False, float_format=lambda v: f"{v:,.4g}"))
    for run_id, err in result.errors.items():
        print(f"FAILED {run_id}: {err}", file=sys.stderr)
    print(f"wrote {len(written)} files to {out}")
    return 1 if result.errors else 0
