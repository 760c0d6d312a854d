"""``tpu-workbench shard``: lay a model out on a device mesh; write layouts, memory,
collectives and charts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpecError
from ..runs.spec import ExperimentSpec
from ..sharding import (
    ALL_STRATEGIES,
    COLLECTIVE_COLUMNS,
    LAYOUT_COLUMNS,
    MEMORY_COLUMNS,
    MESHES,
    collectives_frame,
    ici_assumptions,
    largest_split_tensor,
    layout_frame,
    memory_per_device,
    mesh_text,
    parse_mesh,
    strategies_for,
    strategy_name,
    summary_frame,
)


# --------------------------------------------------------------------------------------------
# CLI: tpu-workbench shard
# --------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--mesh", default="2x4",
                        help=f"mesh shape like 2x4 or 8, or a named mesh ({', '.join(MESHES)})")
    parser.add_argument("--strategy", default="dp",
                        help=f"one of {', '.join(ALL_STRATEGIES)}, several comma-separated, or "
                             "'all' (those that apply to the model: table, row and column "
                             "only where it has embedding tables; each runs, tables get a "
                             "strategy column)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per strategy")
    parser.add_argument("--mode", default="compile", help="execution mode (default: compile)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--tensor", default=None,
                        help="tensor drawn in the layout chart (default: the largest split one)")
    parser.add_argument("--chip", default="v6e", help="chip for collective time estimates")
    parser.add_argument("--baseline", action="store_true",
                        help="also run on one device (no mesh) to compare losses and step times")
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def specs_from_args(args: argparse.Namespace) -> list[ExperimentSpec]:
    from ..runs.spec import ExperimentSpec

    mesh = parse_mesh(args.mesh)
    text = args.strategy.strip()
    if text == "all":
        from .. import models

        family = models.get_model(args.model)
        names = strategies_for(family, family.config(args.preset))
    else:
        names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise SpecError(f"--strategy {args.strategy!r} names no strategy; valid: "
                        f"{', '.join(ALL_STRATEGIES)} or all")
    specs = []
    for name in names:
        strategy_name(name)
        specs.append(ExperimentSpec(model=args.model, preset=args.preset, mode=args.mode,
                                    steps=args.steps, batch_size=args.batch_size, mesh=mesh,
                                    strategy=name,
                                    capture=("hlo",)))
    for spec in specs:
        spec.validate()
    return specs


def _run_all(specs: list[ExperimentSpec], baseline: bool,
             errors: dict[str, str]) -> tuple[list[Any], Any]:
    """Run each strategy's spec (and the one-device baseline); failures go into `errors`."""
    from ..errors import WorkbenchError
    from ..runs import runner

    results = []
    for spec in specs:
        print(f"running {spec.model}/{spec.preset} {spec.strategy} on mesh "
              f"{mesh_text(spec.mesh)} ({spec.steps} steps)...", file=sys.stderr)
        try:
            results.append(runner.run(spec))
        except WorkbenchError as exc:
            errors[spec.strategy] = str(exc)
    single = None
    if baseline and specs:
        try:
            single = runner.run(specs[0].replace(mesh=None, strategy=None, capture=()))
        except WorkbenchError as exc:
            errors["single"] = str(exc)
    return results, single


def _tagged(frame: pd.DataFrame, result: Any) -> pd.DataFrame:
    frame.insert(0, "strategy", strategy_name(result.spec.strategy))
    return frame


def _frames(results: list[Any], chip: str,
            errors: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Layouts, memory and collectives of every run, with a ``strategy`` column."""
    layout = pd.concat([_tagged(layout_frame(r), r) for r in results], ignore_index=True) \
        if results else pd.DataFrame(columns=["strategy", *LAYOUT_COLUMNS])
    memory = pd.concat([_tagged(memory_per_device(r), r) for r in results], ignore_index=True) \
        if results else pd.DataFrame(columns=["strategy", *MEMORY_COLUMNS])
    colls = []
    for r in results:
        try:
            colls.append(_tagged(collectives_frame(r, chip=chip), r))
        except ValueError as exc:
            errors[f"{r.spec.strategy} collectives"] = str(exc)
    collectives = pd.concat(colls, ignore_index=True) if colls \
        else pd.DataFrame(columns=["strategy", *COLLECTIVE_COLUMNS])
    return layout, memory, collectives


def _charts(out: Path, results: list[Any], tensor: str | None, layout: pd.DataFrame,
            memory: pd.DataFrame, collectives: pd.DataFrame, summary: pd.DataFrame,
            errors: dict[str, str]) -> list[Path]:
    """The layout of `tensor` per strategy, memory, collectives and step times (HTML + PNG)."""
    from ..charts import save_chart
    from ..charts import sharding as sharding_charts

    written: list[Path] = []
    first = layout[layout["strategy"] == strategy_name(results[0].spec.strategy)]
    tensor = tensor or largest_split_tensor(first)
    for r in results:
        s = strategy_name(r.spec.strategy)
        frame = layout[(layout["strategy"] == s) & (layout["tensor"] == tensor)]
        if frame.empty:
            errors[f"{s} layout"] = (f"no tensor {tensor!r}; tensors: "
                                     + ", ".join(layout["tensor"].unique()[:8]) + "...")
            continue
        written += save_chart(sharding_charts.layout_grid(frame, tensor, r.spec.mesh),
                              out, f"layout_{s}")
    written += save_chart(sharding_charts.memory_bars(memory), out, "memory")
    if len(collectives):
        written += save_chart(sharding_charts.collective_bytes(collectives), out, "collectives")
    if len(summary):
        written += save_chart(sharding_charts.step_time_per_strategy(summary), out, "step_time")
    return written


def shard(args: argparse.Namespace) -> int:
    """``tpu-workbench shard``: run strategies on a mesh; write layout.csv, memory.csv,
    collectives.csv, summary.json and charts (HTML + PNG) to ``--out``."""
    from ..environment.paths import writable_folder

    out = writable_folder(args.out)
    specs = specs_from_args(args)  # bad input fails here, before any worker starts
    if args.tensor is not None and not isinstance(args.tensor, str):
        raise SpecError(f"--tensor must be a name, got {args.tensor!r}")
    errors: dict[str, str] = {}
    results, baseline = _run_all(specs, args.baseline, errors)
    layout, memory, collectives = _frames(results, args.chip, errors)
    summary = summary_frame(results + ([baseline] if baseline else []))
    written = []
    for name, frame in {"layout.csv": layout, "memory.csv": memory,
                        "collectives.csv": collectives.drop(columns=["replica_groups"])}.items():
        tmp = out / (name + ".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(out / name)
        written.append(out / name)
    (out / "summary.json").write_text(json.dumps(
        {"runs": summary.to_dict(orient="records"), "errors": errors}, indent=2, default=str))
    written.append(out / "summary.json")
    if results:
        written += _charts(out, results, args.tensor, layout, memory, collectives, summary,
                           errors)
    if len(summary):
        cols = [c for c in ["strategy", "mesh", "first_step_ms", "steady_median_ms",
                            "final_loss", "collectives", "collective_bytes",
                            "params_bytes_per_device", "xla_total_bytes"] if c in summary]
        print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
        print(f"collectives.csv estimated_us: {ici_assumptions(args.chip)}")
    for name, err in errors.items():
        print(f"FAILED {name}: {err}", file=sys.stderr)
    print(f"wrote {len(written)} files to {out}")
    return 1 if errors else 0
