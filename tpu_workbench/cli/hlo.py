"""``tpu-workbench hlo``: run a spec with HLO capture; write the HLO texts, ops.csv and
summary.json."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import sharding
from ..errors import SpecError
from ..hlo import (
    load_run_hlo,
    write_run_hlo,
)


def parse_mesh(text: str | None) -> tuple[int, ...] | None:
    """``"2x4"`` or a named mesh (``v6e-8``) -> (2, 4); None or "" -> None; SpecError otherwise."""
    if text is None or not str(text).strip():
        return None
    return sharding.parse_mesh(str(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``tpu-workbench hlo``."""
    parser.add_argument("--model", default="mingpt", help="model family (default: mingpt)")
    parser.add_argument("--preset", default="tiny", help="size preset (default: tiny)")
    parser.add_argument("--mode", default="compile",
                        help="XLA execution mode: eager, lazy, compile (default) or dynamo")
    parser.add_argument("--mesh", default=None,
                        help="SPMD device mesh, e.g. 2x4 (needs --strategy); default: no mesh")
    parser.add_argument("--strategy", default=None, help="sharding strategy, e.g. dp, tp, fsdp")
    parser.add_argument("--steps", type=int, default=2, help="training steps (default: 2)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True, help="output folder")


def spec_from_args(args: argparse.Namespace):
    """The validated ExperimentSpec of ``tpu-workbench hlo`` (SpecError on bad input)."""
    from ..runs.spec import MODES, ExperimentSpec

    mesh = parse_mesh(getattr(args, "mesh", None))
    mode = MODES.get(args.mode)
    if mode is not None and not mode.runtime.xla:
        xla_modes = [m for m, v in MODES.items() if v.runtime.xla]
        raise SpecError(f"mode {args.mode!r} runs on plain PyTorch and compiles no HLO; use one "
                        f"of {', '.join(xla_modes)}")
    spec = ExperimentSpec(model=args.model, preset=args.preset, mode=args.mode, steps=args.steps,
                          batch_size=getattr(args, "batch_size", None), mesh=mesh,
                          strategy=getattr(args, "strategy", None), capture=("hlo",))
    return spec.validate()




def _fmt_flops(v: float | None) -> str:
    if v is None:
        return "n/a"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.3f} {unit}FLOP"
    return f"{v:,.0f} FLOP"


def hlo(args: argparse.Namespace) -> int:
    """``tpu-workbench hlo``: run a spec with HLO capture; write the HLO, ops.csv, summary.json."""
    from ..environment.paths import writable_folder
    from ..runs.runner import run as run_spec

    spec = spec_from_args(args)  # bad model/mode/mesh fail here, before any worker starts
    out = writable_folder(args.out)
    print(f"running {spec.model}/{spec.preset} mode={spec.mode} steps={spec.steps}"
          + (f" mesh={'x'.join(map(str, spec.mesh))} strategy={spec.strategy}" if spec.mesh
             else "") + " with HLO capture...", file=sys.stderr)
    result = run_spec(spec)
    files = load_run_hlo(result)
    if not len(files):
        raise SpecError(f"the run compiled no HLO that XLA dumped (folder {result.out_dir})")
    info = write_run_hlo(files, out)
    main = next(m for m in info["modules"] if m["module"] == info["main_module"])
    s = main.get(info["main_stage"], {})
    before = main.get("before_optimizations", {})
    print(f"{info['num_modules']} module(s) compiled; main: {info['main_module']} "
          f"({s.get('instructions', 0)} instructions, {s.get('num_partitions') or 1} "
          "partition(s))")
    top = [(op, n) for op, n in s.get("ops_by_opcode", {}).items()
           if op not in ("parameter", "constant")][:10]
    print("top ops (all computations, parameters and constants left out): "
          + ", ".join(f"{op} {n}" for op, n in top))
    if s.get("fusions_by_kind"):
        print("fusions: " + ", ".join(f"{k} {n}" for k, n in s["fusions_by_kind"].items()))
    per_device = " (per device)" if (s.get("num_partitions") or 1) > 1 else ""
    print(f"FLOPs: analytic dot/conv {_fmt_flops(s.get('dot_flops'))}{per_device}; XLA cost "
          f"analysis {_fmt_flops(before.get('xla_flops'))} before / "
          f"{_fmt_flops(s.get('xla_flops'))}{per_device} after optimisation"
          + (f" ({s['cost_error']})" if s.get("cost_error") else ""))
    if s.get("collectives"):
        for kind, c in s["collectives"].items():
            print(f"collectives: {kind} x{c['count']} ({c['bytes']:,} bytes), replica groups "
                  + "; ".join(json.dumps(g) for g in c["replica_groups"]))
    else:
        print("collectives: none")
    print(f"wrote {out / 'hlo'} ({len(files)} files), {out / 'ops.csv'}, "
          f"{out / 'summary.json'}")
    return 0
