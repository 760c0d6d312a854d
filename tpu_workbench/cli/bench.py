"""``tpu-workbench bench``: compare execution modes and write tables and charts to a folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import charts
from ..environment.paths import writable_folder
from ..errors import SpecError
from ..records import label
from ..runs.experiments import Comparison, run_many
from ..runs.spec import CHANGES, MODES, ExperimentSpec
from ..timing import fallbacks

DEFAULT_MODES = "torch_eager,inductor,eager,lazy,compile,dynamo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--modes", default=DEFAULT_MODES,
                        help=f"comma-separated modes out of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=20, help="training steps per mode")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--change", choices=sorted(CHANGES), default=None,
                        help="make one change at --change-at that forces a recompilation")
    parser.add_argument("--change-at", type=int, default=5)
    parser.add_argument("--explain", action="store_true",
                        help="record torch_xla's cause for every compilation (slows steps ~20%%; "
                             "on by default with --change)")
    parser.add_argument("--warm", action="store_true",
                        help="share warm workers between modes (default: a fresh worker per "
                             "mode, so every first step pays its full compile)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def specs_from_args(args: argparse.Namespace) -> list[ExperimentSpec]:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        raise SpecError(f"--modes {args.modes!r} names no mode; valid: {', '.join(MODES)}")
    specs = [ExperimentSpec(model=args.model, preset=args.preset, mode=m, steps=args.steps,
                            batch_size=args.batch_size, seed=args.seed, change=args.change,
                            change_at=args.change_at,
                            explain_compiles=True if args.explain else None) for m in modes]
    for spec in specs:
        spec.validate()
    return specs


def write_outputs(comparison: Comparison, out: Path, steps: int) -> list[Path]:
    """steps.csv, summary.csv, compiles.csv and the charts (HTML and PNG) in `out`."""
    written = []
    tables = {"steps.csv": comparison.steps, "summary.csv": comparison.summary,
              "compiles.csv": comparison.compiles}
    for name, frame in tables.items():
        tmp = out / (name + ".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(out / name)  # never leave a half-written table under the final name
        written.append(out / name)
    summary = comparison.summary
    figures = {"step_times": charts.step_times(comparison.steps)}
    if len(summary):
        figures["steady"] = charts.steady_times(summary)
        figures["first_vs_steady"] = charts.first_vs_steady(summary)
        figures["compiles"] = charts.compiles_per_mode(summary)
    if len(comparison.compiles):
        figures["recompiles"] = charts.recompile_timeline(comparison.compiles, steps)
    for name, chart in figures.items():
        written += charts.save_chart(chart, out, name)
    return written


def outside_compiler(table) -> str:
    """What did not compile, for the terminal: "no CPU fallbacks (lazy, ...)" and "no graph
    breaks (dynamo)" for the modes with none, then a small table of the ops and breaks found,
    and a line per function Dynamo skipped whole (`table`:
    :func:`~tpu_workbench.timing.fallbacks`)."""
    lines = []
    for kind, none in (("fallback", "no CPU fallbacks"), ("graph_break", "no graph breaks")):
        clean = table[(table["kind"] == kind) & (table["count"] == 0)]["mode"].tolist()
        if clean:
            lines.append(f"{none} ({', '.join(clean)})")
    found = table[table["count"] > 0]
    if len(found):
        cols = ["mode", "kind", "op", "where", "count", "per_step", "steps"]
        lines.append(found[cols].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
    for row in found[found["skipped_frame"] != ""].itertuples():
        lines.append(f"{row.mode}: {row.skipped_frame.rsplit(' in ', 1)[-1]} ran uncompiled: "
                     f"Dynamo skipped the whole frame at {row.skipped_frame} ({row.op}, a graph "
                     "break inside a loop)")
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    out = writable_folder(args.out)
    specs = specs_from_args(args)  # bad input fails here, before any worker starts
    with tqdm(total=len(specs) * args.steps, unit="step", desc="bench", file=sys.stderr) as bar:

        def on_update(frame, spec, done: int) -> None:
            bar.set_postfix_str(label(spec))
            bar.update(done - bar.n)

        comparison = run_many(specs, on_update=on_update, every_s=0.2, cold=not args.warm)
    written = write_outputs(comparison, out, args.steps)
    summary = comparison.summary
    if len(summary):
        cols = ["mode", "first_step_ms", "steady_median_ms", "steady_p10_ms", "steady_p90_ms",
                "compiles_total", "compiles_steady", "items_per_s", "mfu", "final_loss"]
        print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
    outside = outside_compiler(fallbacks(comparison))
    if outside:
        print(outside)
    for name, err in comparison.errors.items():
        print(f"FAILED {name}: {err}", file=sys.stderr)
    print(f"wrote {len(written)} files to {out}")
    return 1 if comparison.errors else 0
